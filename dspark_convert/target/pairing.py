"""Prove that a drafter belongs to a target: geometry, embedding identity, tokenizer.

A drafter converted against the wrong target loads and then proposes garbage, or reads
out of bounds. Three groups of checks, each raising the error class of its kind with a
message naming both values, and returning one ``Check`` per check that passed (or
warned):

* ``check_compatibility``: config geometry (family, hidden size, vocabulary, layer count
  and taps, mask token inside the embedding, and what the drafter copied from the target's
  config as its family's target reader lists it: rope theta and RMS eps; for Gemma4 the
  full-attention RoPE type and partial factor and the logit softcap too) and the tokenizer
  (no token beyond the embedding, the mask token never produced for ordinary text, the
  fingerprint an artifact recorded). Reads no tensor byte.
* ``check_identity``: the drafter's ``embed_tokens`` / ``lm_head`` copies against the
  target's, by SHA-256 of the same-dtype bytes.
* ``target_record``: all of it, for the manifest.

``pair_source`` / ``SourcePairing.finish`` are what ``convert(..., target=)`` calls (before
anything is written / before the output is renamed into place); ``pair_artifact`` is what
``validate_artifact(..., target=)`` calls.

The drafter side is a ``Drafter``: a contract plus how to name its fields in messages
(config.json fields for a checkpoint, GGUF metadata keys for an artifact).
"""

from __future__ import annotations

from dspark_convert.checks import Check

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING


from dspark_convert.artifact.format import CONFIG_FIELD_KEYS, as_float32
from dspark_convert.contract.dspark import FeatureContract, tap_problem
from dspark_convert.contract.families import family_named, target_family_of
from dspark_convert.errors import (
    AssistantTargetError,
    DFlash2TargetError,
    EmbeddingIdentityError,
    MaskTokenCollisionError,
    TargetGeometryError,
    TargetFamilyError,
    TargetLayerMismatchError,
    TargetVocabError,
    TokenizerMismatchError,
)
from dspark_convert.artifact.manifest import TargetRecord, TargetTensorRecord, TokenizerRecord
from dspark_convert.util.progress import NoProgress, Progress
from dspark_convert.formats.safetensors import TensorEntry
from dspark_convert.target.model import (
    first_different_row,
    Target,
    hash_target_tensors,
    open_target,
    target_reader,
    tensor_sha256,
)
from dspark_convert.util.text import shown
from dspark_convert.target.tokenizer import fingerprint_difference

if TYPE_CHECKING:
    from dspark_convert.artifact.manifest import Manifest
    from dspark_convert.source.checkpoint import Source

# The drafter's own copies, by the role they play in the target.
DRAFTER_TENSOR_ROLES = {"embed_tokens.weight": "embedding", "lm_head.weight": "head"}
# Where an artifact keeps what a checkpoint's config.json field or tensor held.
_METADATA_NAMES = {**CONFIG_FIELD_KEYS, "embed_tokens.weight": "dflash.target.embed_sha256",
                   "lm_head.weight": "dflash.target.lm_head_sha256"}


@dataclass(frozen=True)
class Drafter:
    """The drafter side of a pairing."""

    label: str                      # "drafter <dir>/config.json" or "artifact <dir>/drafter.gguf"
    contract: FeatureContract
    model_type: str | None = None   # config.json model_type; None for an artifact (implied)
    from_metadata: bool = False     # name fields by GGUF metadata keys

    def field(self, name: str) -> str:
        key = _METADATA_NAMES.get(name, name) if self.from_metadata else name
        # A key in another family's namespace (dspark.gemma4.* for a Qwen3 file) is not in
        # this file: the field is implied by the family, so it keeps config.json's name.
        parts = key.split(".")
        if self.from_metadata and parts[0] == "dspark" and len(parts) > 2 and \
                not self.contract.family.startswith(parts[1] + "-"):
            key = name
        return f"{self.label} {key}"


def _short(sha: str) -> str:
    return sha[:16] + "…"


# --- geometry ----------------------------------------------------------------------------------

def check_geometry(drafter: Drafter, target: Target) -> list[Check]:
    tcfg, g = target.config, drafter.contract.geometry
    where = f"target {target.checkpoint.files.config}"
    checks = []

    family, theirs = family_named(drafter.contract.family), target_family_of(target.raw_config)
    if theirs is not None and theirs is not family:
        # A target of another known family (a Gemma4 drafter on a Qwen3 target): named by
        # both families, not as a geometry detail.
        raise TargetFamilyError(
            f"{where}: model_type {tcfg.model_type!r} is a target of the {theirs.name} family; "
            f"the drafter ({drafter.contract.architecture}, {family.name}) pairs with a "
            f"{' / '.join(family.target_model_types)} target", path=where, field="model_type",
            expected=list(family.target_model_types), found=tcfg.model_type)
    problem = target_reader(family).model_type_problem(drafter.contract, drafter.model_type,
                                                        target.read)
    if problem is not None:
        field, found, expected, drafter_field = problem
        raise TargetGeometryError(
            f"{where}: {field} is {found!r}; the drafter "
            f"({drafter.contract.architecture}) expects {expected!r} ({drafter.field(drafter_field)})",
            path=where, field=field, expected=expected, found=found)
    checks.append(Check.passed("target.family", f"{tcfg.model_type} ({', '.join(tcfg.architectures)})"))

    # The text model's fields: at the top of a Qwen3 config.json, in a Gemma4 text_config.
    field = target.read.field
    if tcfg.hidden_size != g.hidden_size:
        raise TargetGeometryError(
            f"{where}: {field('hidden_size')} is {tcfg.hidden_size}; the drafter expects "
            f"{g.hidden_size} ({drafter.field('hidden_size')})", path=where,
            field=field("hidden_size"), expected=g.hidden_size, found=tcfg.hidden_size)
    checks.append(Check.passed("target.hidden_size", f"{g.hidden_size} on both sides"))

    if tcfg.vocab_size != g.vocab_size:
        raise TargetVocabError(
            f"{where}: {field('vocab_size')} is {tcfg.vocab_size}; the drafter expects "
            f"{g.vocab_size} ({drafter.field('vocab_size')})", path=where,
            field=field("vocab_size"), expected=g.vocab_size, found=tcfg.vocab_size)
    checks.append(Check.passed("target.vocab_size", f"{g.vocab_size} embedding rows on both sides"))

    checks.append(_check_layers(drafter, target, where))

    mask = drafter.contract.block.mask_token_id
    if not 0 <= mask < tcfg.vocab_size:
        raise MaskTokenCollisionError(
            f"{drafter.field('mask_token_id')} is {mask}; the target's embedding has "
            f"{tcfg.vocab_size} rows ({where} {field('vocab_size')}), expected an id in "
            f"[0, {tcfg.vocab_size - 1}]", path=drafter.label, field="mask_token_id",
            expected=f"0..{tcfg.vocab_size - 1}", found=mask)

    checks += _check_norms(drafter, target, where)
    return checks


def _check_layers(drafter: Drafter, target: Target, where: str) -> Check:
    n, layers = target.config.num_hidden_layers, target.read.field("num_hidden_layers")
    taps = drafter.contract.taps
    for pos, layer in enumerate(taps.target_layer_ids):
        field = f"{drafter.field('target_layer_ids')}[{pos}]"
        problem = tap_problem(layer, n)
        if problem is not None:
            raise TargetLayerMismatchError(
                f"{field} is {layer}, {problem} ({where} {layers} = {n}); expected a "
                f"layer id in [0, {n - 2}]", path=drafter.label,
                field=f"target_layer_ids[{pos}]", expected=f"0..{n - 2}", found=layer)
    if taps.num_target_layers != n:
        raise TargetLayerMismatchError(
            f"{where}: {layers} is {n}; the drafter expects {taps.num_target_layers} "
            f"({drafter.field('num_target_layers')})", path=where, field=layers,
            expected=taps.num_target_layers, found=n)
    return Check.passed("target.layers", f"{n} target layers; taps {taps.target_layer_ids} are "
                   f"layers of it, none the last")


def _check_norms(drafter: Drafter, target: Target, where: str) -> list[Check]:
    """What the drafter copied from the target's config and computes with (its family's
    reader lists them: RoPE, RMS eps, ...), equal on both sides; a value unusual for the
    family's released targets is a warning."""
    reader = target_reader(target.family)
    values = target.read.values
    checks = []
    for key, target_field, drafter_field, want in reader.inherited(drafter.contract):
        as_given = values[key]
        # An artifact holds rms_norm_eps as FLOAT32: compare what the file can hold.
        got = as_float32(as_given) if drafter.from_metadata and key == "rms_norm_eps" else as_given
        if want != got:
            raise TargetGeometryError(
                f"{where}: {target_field} is {as_given}; the drafter expects {want} "
                f"({drafter.field(drafter_field)})", path=where, field=target_field,
                expected=want, found=as_given)
    checks.append(Check.passed("target.norms", reader.inherited_detail(target.read)))
    unusual = [f"{name} {values[key]:g} ({who} uses {norm:g})"
               for key, (name, norm, who) in reader.USUAL.items()
               if not math.isclose(values[key], norm, rel_tol=1e-6)]
    if unusual:
        checks.append(Check.warning("target.family_norms", "unusual for the family: "
                               + "; ".join(unusual)))
    return checks


# --- tokenizer ---------------------------------------------------------------------------------

def check_tokenizer(drafter: Drafter, target: Target,
                    recorded: TokenizerRecord | None = None) -> list[Check]:
    """The tokenizer against the embedding and the mask token, and against the
    fingerprint an artifact recorded (``recorded``; None: nothing to compare with)."""
    tok = target.tokenizer
    rec = tok.record
    where = f"target {target.directory / rec.file}"
    rows = target.config.vocab_size
    checks = []

    if rec.max_token_id >= rows:
        kind, content = tok.classify(rec.max_token_id)
        raise TargetVocabError(
            f"{where}: has token id {rec.max_token_id} ({content!r}); the embedding has only "
            f"{rows} rows (target config.json {target.read.field('vocab_size')}), expected "
            f"every id below {rows}",
            path=where, field="vocab_size", expected=f"< {rows}", found=rec.max_token_id)
    if rec.max_token_id + 1 < rows:
        detail = (f"{rec.vocab_size} tokens (ids up to {rec.max_token_id}) in {rows} embedding "
                  f"rows: the embedding is padded beyond the tokenizer, which is normal")
    else:
        detail = f"{rec.vocab_size} tokens fill the {rows} embedding rows"
    checks.append(Check.passed("target.tokenizer_vocab", detail))

    block = getattr(drafter.contract, "block", None)
    if block is None:       # a drafter without a mask token (the Gemma 4 assistant)
        return checks + _check_fingerprint(drafter, target, recorded)
    mask = block.mask_token_id
    kind, content = tok.classify(mask)
    field = drafter.field("mask_token_id")
    if kind in ("ordinary", "added"):
        what = ("a token of its vocabulary, produced for ordinary text" if kind == "ordinary"
                else "an added token that is not special, produced whenever its text appears")
        raise MaskTokenCollisionError(
            f"{field} is {mask}, which {where} maps to {content!r}, {what}; expected a padding "
            "row or a special token", path=drafter.label, field="mask_token_id",
            expected="an id the tokenizer never produces for ordinary text",
            found=f"{mask} = {content!r}")
    if mask in rec.probe_ids:
        raise MaskTokenCollisionError(
            f"{field} is {mask}, which {where} produces for the probe text {rec.probe_text!r}; "
            "expected an id the tokenizer never produces for ordinary text", path=drafter.label,
            field="mask_token_id", expected="not in the probe's ids", found=mask)
    checks.append(Check.passed("target.mask_token", f"{mask} is " + (
        f"the special token {content!r}" if kind == "special"
        else "a padding row: no token of the tokenizer")))

    return checks + _check_fingerprint(drafter, target, recorded)


def _check_fingerprint(drafter: Drafter, target: Target,
                       recorded: TokenizerRecord | None) -> list[Check]:
    """The tokenizer against the fingerprint an artifact recorded (None: recorded now)."""
    rec = target.tokenizer.record
    where = f"target {target.directory / rec.file}"
    checks = []
    if recorded is not None:
        diff = fingerprint_difference(recorded, rec)
        if diff is not None:
            name, want, got = diff
            raise TokenizerMismatchError(
                f"{where}: tokenizer {name} is {_shown(got)}; the drafter was converted with a "
                f"tokenizer whose {name} is {_shown(want)} (manifest.json target.tokenizer)",
                path=where, field=f"tokenizer.{name}", expected=_shown(want), found=_shown(got))
        checks.append(Check.passed("target.tokenizer_fingerprint",
                              f"tokenizer.json {_short(rec.sha256)} matches the recorded fingerprint"))
    else:
        checks.append(Check.passed("target.tokenizer_fingerprint",
                              f"tokenizer.json {_short(rec.sha256)}: {rec.vocab_size} tokens, "
                              f"{len(rec.special_tokens)} special"
                              + ("" if drafter.from_metadata else "; fingerprint recorded")))
    return checks


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_compatibility(drafter: Drafter, target: Target,
                        recorded: TokenizerRecord | None = None) -> list[Check]:
    """Geometry and tokenizer checks, by the drafter's kind; no tensor byte is read."""
    geometry = _KIND_GEOMETRY.get(drafter.contract.family, check_geometry)
    return geometry(drafter, target) + check_tokenizer(drafter, target, recorded)


# --- the DFlash2 and Gemma 4 assistant kinds ----------------------------------------------------

def _target_model_type(drafter: Drafter, target: Target, error) -> Check:
    family = family_named(drafter.contract.family)
    where = f"target {target.checkpoint.files.config}"
    model_type = target.raw_config.get("model_type")
    if model_type not in family.target_model_types:
        raise error(f"{where}: model_type {model_type!r}; the drafter "
                    f"({drafter.contract.architecture}) pairs with a "
                    f"{' / '.join(family.target_model_types)} target", path=where,
                    field="model_type", expected=list(family.target_model_types),
                    found=model_type)
    return Check.passed("target.family", f"{model_type} "
                        f"({', '.join(target.config.architectures)})")


def check_dflash2_geometry(drafter: Drafter, target: Target) -> list[Check]:
    """A DFlash2 drafter against a Qwen3 target (DFlash2TargetError, 154): fc reads m x H
    features of the target's hidden size, the selector's codebooks and the target's head
    index one vocabulary, every tapped hidden state is one the target has (speculators'
    aux ids are HF hidden_states indices: 0 the embedding, num_hidden_layers the last)."""
    c, tcfg = drafter.contract, target.config
    where = f"target {target.checkpoint.files.config}"
    field = target.read.field
    checks = [_target_model_type(drafter, target, DFlash2TargetError)]
    for name, mine, theirs in (("hidden_size", c.geometry.hidden_size, tcfg.hidden_size),
                               ("vocab_size", c.geometry.vocab_size, tcfg.vocab_size)):
        if mine != theirs:
            raise DFlash2TargetError(
                f"{where}: {field(name)} is {theirs}; the drafter expects {mine} "
                f"({drafter.field(name)})", path=where, field=field(name), expected=mine,
                found=theirs)
        checks.append(Check.passed(f"target.{name}", f"{mine} on both sides"))
    n = tcfg.num_hidden_layers
    for pos, index in enumerate(c.taps.hidden_state_indices):
        if not 0 <= index <= n:
            name = ("dflash.target_layers" if drafter.from_metadata
                    else "aux_hidden_state_layer_ids")
            raise DFlash2TargetError(
                f"{drafter.label} {name}[{pos}] is {index}; the target has {n} layers "
                f"({where} {field('num_hidden_layers')}), so its hidden states are indices "
                f"0..{n} (0 the embedding)", path=drafter.label, field=f"{name}[{pos}]",
                expected=f"0..{n}", found=index)
    checks.append(Check.passed(
        "target.layers", f"hidden states {c.taps.hidden_state_indices} of the target's {n + 1} "
        f"(HF hidden_states indices: 0 the embedding, {n} the final norm's output)"))
    return checks


def target_kv_geometry(raw: dict) -> list[tuple[str, int, int, float]]:
    """Each layer of a gemma4_unified target as the assistant's KV sharing reads it: (layer
    type, head_dim, KV heads, RoPE theta), by transformers' rule (runtime/gemma4.py's:
    full layers global_head_dim and, under attention_k_eq_v, num_global_key_value_heads;
    sliding ones head_dim and num_key_value_heads). Malformed fields give what they hold."""
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else {}
    rope = text.get("rope_parameters") if isinstance(text.get("rope_parameters"), dict) else {}
    out = []
    for kind in text.get("layer_types") or []:
        full = kind == "full_attention"
        kv = (text.get("num_global_key_value_heads") if full and text.get("attention_k_eq_v")
              else text.get("num_key_value_heads"))
        d = text.get("global_head_dim") if full else text.get("head_dim")
        entry = rope.get(kind) if isinstance(rope.get(kind), dict) else {}
        out.append((kind, d, kv, entry.get("rope_theta")))
    return out


def check_assistant_geometry(drafter: Drafter, target: Target) -> list[Check]:
    """A Gemma 4 assistant against a gemma4_unified target (AssistantTargetError, 153):
    backbone_hidden_size is the target's hidden size, one vocabulary, and each layer type
    maps onto the target layer whose KV it reads (the target's last layer of that type,
    runtime/gemma4_assistant.shared_layers' rule) of the same head_dim, KV heads and RoPE
    theta."""
    c, tcfg = drafter.contract, target.config
    where = f"target {target.checkpoint.files.config}"
    field = target.read.field
    checks = [_target_model_type(drafter, target, AssistantTargetError)]
    for name, ours, mine, theirs in (
            ("hidden_size", "backbone_hidden_size", c.geometry.backbone_hidden_size,
             tcfg.hidden_size),
            ("vocab_size", "text_config.vocab_size", c.geometry.vocab_size, tcfg.vocab_size)):
        if mine != theirs:
            raise AssistantTargetError(
                f"{where}: {field(name)} is {theirs}; the assistant expects {mine} "
                f"({drafter.label} {ours})", path=where, field=field(name), expected=mine,
                found=theirs)
        checks.append(Check.passed(f"target.{name}", f"{mine} on both sides"
                                   + (" (backbone_hidden_size)" if name == "hidden_size" else "")))
    layers = target_kv_geometry(target.raw_config)
    kinds = [k for k, _d, _kv, _t in layers]
    read = {}
    for i, layer in enumerate(c.layers):
        if layer.kind not in kinds:
            raise AssistantTargetError(
                f"{drafter.label} layer {i} is {layer.kind}: the target ({where}) has no "
                f"{layer.kind} layer whose KV it could read (its layers: "
                f"{sorted(set(kinds))})", path=drafter.label, field=f"layer_types[{i}]",
                expected=sorted(set(kinds)), found=layer.kind)
        index = len(kinds) - 1 - kinds[::-1].index(layer.kind)
        _k, d, kv, theta = layers[index]
        if (layer.head_dim, layer.kv_heads, layer.rope_theta) != (d, kv, theta):
            raise AssistantTargetError(
                f"{drafter.label} layer {i} ({layer.kind}): head_dim {layer.head_dim}, "
                f"{layer.kv_heads} KV heads, RoPE theta {layer.rope_theta:g}; the target's "
                f"layer {index} whose KV it reads has head_dim {d}, {kv} KV heads, theta "
                f"{theta} ({where})", path=drafter.label, field=f"layer_types[{i}]",
                expected=[d, kv, theta], found=[layer.head_dim, layer.kv_heads,
                                               layer.rope_theta])
        read[layer.kind] = index
    checks.append(Check.passed("target.shared_kv", "; ".join(
        f"{kind} layers read the target's layer {index}" for kind, index in read.items())
        + ", of the same head_dim, KV heads and RoPE theta"))
    return checks


def check_assistant_identity(drafter: Drafter, target: Target,
                             target_tensors: list[TargetTensorRecord],
                             recorded_embed: str | None,
                             own_head: tuple[list[int], str | None] | None) -> list[Check]:
    """The assistant's input embedding is the target's (its SHA-256 recorded, compared with
    the one an artifact recorded); its output head is its own tied embedding
    (token_embd.weight), compared with the target's embedding as data: another shape
    ([V, h] against [V, Hb]) or, of one shape, another SHA-256 says it is its own."""
    theirs = next(t for t in target_tensors if t.role == "embedding")
    checks = []
    if recorded_embed is not None and recorded_embed != theirs.sha256:
        raise EmbeddingIdentityError(
            f"{drafter.field('embed_tokens.weight')} SHA-256 is {_short(recorded_embed)}; the "
            f"target's {theirs.name} is {_short(theirs.sha256)}: not the embedding this "
            "assistant was converted against", path=drafter.label, tensor="embed_tokens.weight",
            expected=theirs.sha256, found=recorded_embed)
    checks.append(Check.passed("target.identity.embedding",
                               f"the assistant's input embedding is the target's {theirs.name} "
                               f"(SHA-256 {_short(theirs.sha256)})"))
    if own_head is not None:
        shape, sha = own_head
        if shape != theirs.shape:
            same = (f"its own tied embedding {shape}, not the target's {theirs.shape}: "
                    "kept in the artifact as token_embd.weight")
        elif sha is None:
            same = f"its own tied embedding {shape}, the target's shape; kept as token_embd.weight"
        else:
            same = ("its own tied embedding, " + ("equal to" if sha == theirs.sha256 else
                                                  "other data than") +
                    f" the target's (SHA-256 {_short(sha)}); kept as token_embd.weight")
        checks.append(Check.passed("target.identity.head", f"the assistant's head is {same}"))
    return checks


# Each kind's geometry checks (the DSpark families': check_geometry).
_KIND_GEOMETRY = {"qwen3-dflash2": check_dflash2_geometry,
                  "gemma4-assistant": check_assistant_geometry}


# --- identity ----------------------------------------------------------------------------------

def check_identity(drafter: Drafter, target: Target, target_tensors: list[TargetTensorRecord],
                   drafter_tensors: dict[str, tuple[str, str]], *,
                   drafter_entries: dict[str, TensorEntry] | None = None,
                   progress: Progress | None = None) -> list[Check]:
    """Compare the drafter's copies {name: (dtype, sha256)} with the target's tensors
    (``hash_target_tensors``). A copy in another dtype is compared with the target's bytes
    cast to that dtype. ``drafter_entries`` (the checkpoint's tensors) let a mismatch name
    the first row that differs. A drafter without a copy records the target's hash."""
    progress = progress or NoProgress()
    by_role = {t.role: t for t in target_tensors}
    entries = {"embedding": target.embed, "head": target.head}
    checks = []
    for name, role in DRAFTER_TENSOR_ROLES.items():
        theirs = by_role[role]
        tied = " (tied: the head is the embedding)" if role == "head" and target.head_tied else ""
        if name not in drafter_tensors and drafter.from_metadata:
            # An artifact converted without a target from a drafter without copies.
            checks.append(Check.warning(f"target.identity.{role}",
                                   f"the artifact records no {role} hash "
                                   f"({drafter.field(name)}): the runtime cannot check that it "
                                   "binds this target; convert with --target to record it"))
            continue
        if name not in drafter_tensors:
            checks.append(Check.passed(f"target.identity.{role}",
                                  f"the drafter has no {name}; the target's {theirs.name}{tied} "
                                  f"SHA-256 {_short(theirs.sha256)} is recorded for the runtime"))
            continue
        dtype, ours = drafter_tensors[name]
        want = theirs.sha256
        if dtype != theirs.dtype:
            progress.start(f"hash target {role} as {dtype}", entries[role].nbytes)
            try:
                want = tensor_sha256(entries[role], as_dtype=dtype, progress=progress)
            finally:
                progress.finish()
        if ours != want:
            row = ""
            if drafter_entries and name in drafter_entries:
                first = first_different_row(drafter_entries[name], entries[role])
                row = f"; first differing row {first}" if first is not None else ""
            cast = f" cast to {dtype}" if dtype != theirs.dtype else ""
            raise EmbeddingIdentityError(
                f"{drafter.field(name)} SHA-256 is {_short(ours)}; the target's "
                f"{theirs.name}{tied}{cast} is {_short(want)}: not this target's "
                f"{role}{row}", path=drafter.label, tensor=name, expected=want, found=ours)
        checks.append(Check.passed(f"target.identity.{role}",
                              f"{name} equals the target's {theirs.name}{tied} "
                              f"(SHA-256 {_short(want)}, {dtype})"))
    return checks


def recorded_hashes(drafter_tensors: dict[str, tuple[str, str]],
                    target_tensors: list[TargetTensorRecord] | None) -> tuple[str | None, str | None]:
    """dflash.target.embed_sha256 / lm_head_sha256: the drafter's own copies' hashes, or
    the target's where the drafter has none and a target was given."""
    by_role = {t.role: t.sha256 for t in target_tensors or []}
    out = []
    for name, role in DRAFTER_TENSOR_ROLES.items():
        out.append(drafter_tensors[name][1] if name in drafter_tensors else by_role.get(role))
    return out[0], out[1]


def target_record(target: Target, tensors: list[TargetTensorRecord],
                  checks: list[Check]) -> TargetRecord:
    return TargetRecord(
        repo=target.repo, revision=target.revision,
        path=None if target.repo is not None else shown(target.spec),
        files=list(target.files), config=target.config, tensors=tensors,
        tokenizer=target.tokenizer.record, checks=checks)


# --- a checkpoint being converted --------------------------------------------------------------

@dataclass(frozen=True)
class SourcePairing:
    """A checkpoint paired with its target before conversion: the compatibility checks
    passed and the target's embedding and head hashed. ``finish`` compares the drafter's
    copies (hashed by the converter's pass) and returns the manifest's record."""

    source: Source
    target: Target
    checks: list[Check]
    tensors: list[TargetTensorRecord]

    def target_sha256(self, drafter_name: str) -> str | None:
        """The hash dflash.target.* records for a copy the drafter does not have."""
        if drafter_name in self.source.checkpoint.tensors:
            return None
        role = DRAFTER_TENSOR_ROLES[drafter_name]
        return next(t.sha256 for t in self.tensors if t.role == role)

    def finish(self, tensor_sha256: dict[str, str], progress: Progress | None = None) -> TargetRecord:
        entries = self.source.checkpoint.tensors
        if self.source.contract.family == "gemma4-assistant":
            own = entries.get("model.embed_tokens.weight")
            drafter = Drafter(label=f"drafter {self.source.checkpoint.files.config}",
                              contract=self.source.contract)
            identity = check_assistant_identity(drafter, self.target, self.tensors, None,
                                                (list(own.shape), None) if own else None)
            return target_record(self.target, self.tensors, self.checks + identity)
        ours = {n: (entries[n].dtype, tensor_sha256[n]) for n in DRAFTER_TENSOR_ROLES if n in entries}
        weights = self.source.checkpoint.files.index or self.source.checkpoint.files.weights[0]
        drafter = Drafter(label=f"drafter {weights}", contract=self.source.contract)
        identity = check_identity(drafter, self.target, self.tensors, ours,
                                  drafter_entries=dict(entries), progress=progress)
        return target_record(self.target, self.tensors, self.checks + identity)


def pair_source(source: Source, target: Target | str | os.PathLike,
                progress: Progress | None = None) -> SourcePairing:
    """Open the target (unless given open), run the compatibility checks against the
    checkpoint's config and hash the target's embedding and head. Writes nothing."""
    if not isinstance(target, Target):
        target = open_target(target, progress=progress)
    drafter = Drafter(label=f"drafter {source.checkpoint.files.config}", contract=source.contract,
                      model_type=model_type if isinstance(model_type := source.raw_config.get(
                          "model_type"), str) else None)
    checks = check_compatibility(drafter, target)
    _check_zlab_target_layers(source, target)
    return SourcePairing(source=source, target=target, checks=checks,
                         tensors=hash_target_tensors(target, progress))


def _check_zlab_target_layers(source: Source, target: Target) -> None:
    """z-lab's DFlash2 config records its target's layer count (``num_target_layers``),
    which speculators' layout and the artifact do not: checked against the target (154)."""
    if source.contract.family != "qwen3-dflash2":
        return
    claimed = source.raw_config.get("num_target_layers")
    n = target.config.num_hidden_layers
    if claimed is not None and claimed != n:
        where = f"target {target.checkpoint.files.config}"
        raise DFlash2TargetError(
            f"{where}: {target.read.field('num_hidden_layers')} is {n}; the drafter expects "
            f"{claimed} (drafter {source.checkpoint.files.config} num_target_layers, z-lab's "
            "layout)", path=where, field="num_hidden_layers", expected=claimed, found=n)


# --- an artifact being validated ---------------------------------------------------------------

def pair_artifact(contract: FeatureContract, kv: dict[str, object], manifest: Manifest | None,
                  target: Target | str | os.PathLike, *, label: str,
                  progress: Progress | None = None) -> list[Check]:
    """Re-run the pairing on an artifact: its contract (rebuilt from the metadata) against
    the target's config and tokenizer, the fingerprint manifest.json recorded, and the
    embedding / head hashes the metadata records (dflash.target.*) against the target's."""
    if not isinstance(target, Target):
        target = open_target(target, progress=progress)
    drafter = Drafter(label=f"artifact {label}", contract=contract, from_metadata=True)
    recorded = manifest.target.tokenizer if manifest is not None and manifest.target else None
    checks = check_compatibility(drafter, target, recorded)
    tensors = hash_target_tensors(target, progress)
    if contract.family == "gemma4-assistant":
        embed = kv.get(_METADATA_NAMES["embed_tokens.weight"])
        head = None
        if manifest is not None:
            record = next((t for t in manifest.artifact.tensors
                           if t.name == "token_embd.weight"), None)
            head = None if record is None else (record.shape[::-1], record.sha256)
        return checks + check_assistant_identity(drafter, target, tensors,
                                                 embed if isinstance(embed, str) else None,
                                                 head)
    # The dtype each recorded hash was taken in: the drafter's own copy's (source.stripped),
    # else the target's, whose hash was recorded in the drafter's place.
    dtypes = {s.name: s.dtype for s in manifest.source.stripped} if manifest is not None else {}
    by_role = {t.role: t.dtype for t in tensors}
    ours = {}
    for name, role in DRAFTER_TENSOR_ROLES.items():
        value = kv.get(_METADATA_NAMES[name])
        if isinstance(value, str):
            ours[name] = (dtypes.get(name, by_role[role]), value)
    return checks + check_identity(drafter, target, tensors, ours, progress=progress)
