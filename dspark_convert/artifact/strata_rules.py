"""The rules Strata's DFlash loader applies to a GGUF drafter (docs/REFERENCE.md §3).

Checked by the converter (recorded in the manifest) and by ``dspark validate``. Strata is
more lenient about types than our format (any numeric type for integers, "1" for true):
these rules follow Strata, while ``validate``'s metadata check holds the file to the
stricter format. What Strata refuses *today* only because DSpark support is not there yet
(a Markov head, a confidence head) is "info", neither a failure nor a warning: those
artifacts are the product the engine work is for, so the strict release gate (which fails
warnings) must pass them. Warnings are kept for real risks (an rms eps Strata ignores).
"""

from __future__ import annotations

from dspark_convert.checks import Check

import numbers
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from dspark_convert.artifact.format import as_float32
from dspark_convert.contract.tensor_table import FORBIDDEN_GGUF_NAMES, TENSOR_RULES, expand_rule

STRATA_MAX_BLOCK_COUNT = 64
STRATA_MAX_BLOCK_SIZE = 128
STRATA_MAX_TARGET_LAYERS = 64
STRATA_RMS_EPS = 1e-6
QUANT_TYPES = ("Q8_0", "Q5_0", "Q4_0")
REQUIRED_DIMENSIONS = ("dflash.embedding_length", "dflash.block_count", "dflash.attention.head_count",
                       "dflash.attention.head_count_kv", "dflash.feed_forward_length",
                       "dflash.vocab_size", "dflash.block_size")
TODAY_REFUSED_NAME_PARTS = ("markov", "conf_proj", "selector", "d2t")


@dataclass(frozen=True)
class Finding:
    rule: str
    level: Literal["passed", "info", "warning", "failed"]
    message: str


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _strata_flag(value: object, default: bool) -> bool:
    if value is None:
        return default
    if isinstance(value, str):
        return value in ("true", "1")
    if isinstance(value, numbers.Number):
        return value != 0
    return default


def _check_keys(kv: dict) -> list[str]:
    problems = []
    if kv.get("general.architecture") != "dflash":
        problems.append(f"general.architecture is {kv.get('general.architecture')!r}, expected 'dflash'")
    for key in REQUIRED_DIMENSIONS:
        value = kv.get(key)
        if not _is_int(value) or value <= 0:
            problems.append(f"{key} must be a positive integer, found {value!r}")
    if _is_int(kv.get("dflash.block_count")) and kv["dflash.block_count"] > STRATA_MAX_BLOCK_COUNT:
        problems.append(f"dflash.block_count {kv['dflash.block_count']} > {STRATA_MAX_BLOCK_COUNT}")
    if _is_int(kv.get("dflash.block_size")) and kv["dflash.block_size"] > STRATA_MAX_BLOCK_SIZE:
        problems.append(f"dflash.block_size {kv['dflash.block_size']} > {STRATA_MAX_BLOCK_SIZE}")
    if not _strata_flag(kv.get("dflash.sample_from_anchor"), True):
        problems.append("dflash.sample_from_anchor is false (Strata refuses it)")
    if _strata_flag(kv.get("dflash.attention.causal"), False):
        problems.append("dflash.attention.causal is true (Strata refuses it)")
    if "dflash.selector_top_k" in kv:
        problems.append("dflash.selector_top_k is present (DFlash2, refused by Strata)")
    layers = kv.get("dflash.target_layers")
    if not isinstance(layers, list) or not layers or not all(_is_int(x) for x in layers):
        problems.append(f"dflash.target_layers must be a non-empty integer array, found {layers!r}")
    else:
        if len(layers) > STRATA_MAX_TARGET_LAYERS:
            problems.append(f"dflash.target_layers has {len(layers)} entries > {STRATA_MAX_TARGET_LAYERS}")
        if any(x < 0 for x in layers):
            problems.append(f"dflash.target_layers has a negative id: {layers}")
        if any(b <= a for a, b in zip(layers, layers[1:])):
            problems.append(f"dflash.target_layers is not strictly increasing: {layers}")
    return problems


def _expected_names(block_count: int) -> set[str]:
    names = set()
    for rule in TENSOR_RULES:
        if rule.when == "always" and rule.gguf is not None:
            names.update(g for _s, g, _i in expand_rule(rule, block_count))
    return names


def _hf_names(block_count: int) -> dict[str, str]:
    """HF name -> GGUF name, for the duplicate-under-both-names rule."""
    out = {}
    for rule in TENSOR_RULES:
        if rule.gguf is not None:
            out.update({s: g for s, g, _i in expand_rule(rule, block_count)})
    return out


def _check_tensors(kv: dict, tensors: list[tuple[str, str, list[int]]]) -> list[str]:
    problems = []
    names = {name for name, _t, _s in tensors}
    for forbidden in FORBIDDEN_GGUF_NAMES:
        if forbidden in names:
            problems.append(f"tensor '{forbidden}' is present (Strata binds the embedding and head from the target)")
    block_count = kv.get("dflash.block_count")
    if _is_int(block_count) and 0 < block_count <= STRATA_MAX_BLOCK_COUNT:
        present = set(names) | {g for s, g in _hf_names(block_count).items() if s in names}
        missing = sorted(_expected_names(block_count) - present)
        if missing:
            problems.append(f"tensor '{missing[0]}' is missing" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
        for hf, gguf in _hf_names(block_count).items():
            if hf in names and gguf in names and hf != gguf:
                problems.append(f"tensor '{gguf}' is present under both its GGUF and HF name '{hf}'")
    for name, type_name, shape in tensors:
        is_norm = name.endswith("norm.weight")
        if is_norm and type_name != "BF16":
            problems.append(f"norm tensor '{name}' is {type_name}; Strata requires BF16")
        elif not is_norm and len(shape) == 2:
            if type_name in QUANT_TYPES:
                if shape[0] % 32:
                    problems.append(f"tensor '{name}' is {type_name} with rows of {shape[0]}, not divisible by 32")
            elif type_name != "BF16":
                problems.append(f"tensor '{name}' is {type_name}; Strata accepts BF16, Q8_0, Q5_0, Q4_0")
    return problems


def strata_findings(kv: dict, tensors: Iterable[tuple[str, str, list[int]]]) -> list[Finding]:
    """Findings for metadata ``kv`` (key -> value) and tensors (name, type name, GGUF shape)."""
    tensors = list(tensors)
    findings = []
    problems = _check_keys(kv) + _check_tensors(kv, tensors)
    findings.append(Finding("loader_rules", "failed" if problems else "passed",
                            "; ".join(problems) if problems else
                            "metadata, tensor names, types and bounds follow Strata's DFlash loader"))
    eps = kv.get("dflash.attention.layer_norm_rms_epsilon")
    if isinstance(eps, numbers.Real) and as_float32(eps) != as_float32(STRATA_RMS_EPS):
        findings.append(Finding("rms_eps", "warning",
                                f"rms_norm_eps is {eps}; Strata's loader fixes it at 1e-6"))
    today = []
    rank = kv.get("dflash.markov_rank")
    if _is_int(rank) and rank > 0:
        today.append(f"markov_rank {rank} > 0")
    if _strata_flag(kv.get("dflash.has_confidence_head"), False):
        today.append("a confidence head")
    named = sorted(n for n, _t, _s in tensors if any(p in n for p in TODAY_REFUSED_NAME_PARTS))
    if named:
        today.append(f"{len(named)} DSpark head tensor(s) ({named[0]}...)")
    if today:
        findings.append(Finding("current_loader", "info",
                                "Strata's current DFlash loader refuses " + ", ".join(today)
                                + "; this artifact needs the engine's DSpark support"))
    else:
        findings.append(Finding("current_loader", "passed",
                                "a plain DFlash drafter: Strata's current loader accepts it"))
    return findings


def strata_checks(kv: dict, tensors: Iterable) -> list[Check]:
    """The strata.* check records for metadata ``kv`` and tensors (objects with ``name``,
    ``type`` (type name) and ``shape`` (GGUF order), e.g. manifest TensorRecords): what
    convert records in the manifest and validate re-derives, from one function."""
    findings = strata_findings(kv, [(t.name, t.type, list(t.shape)) for t in tensors])
    return [Check(name=f"strata.{f.rule}", status=f.level, detail=f.message)
            for f in findings]
