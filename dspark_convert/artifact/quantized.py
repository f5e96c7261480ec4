"""What a quantized artifact is, tensor by tensor: the one type rule (docs/ARTIFACT_FORMAT.md,
Quantized artifacts).

``dspark quantize`` writes by it, ``dspark validate`` checks a quantized artifact's tensors
by it, and the runtime plans its loads by it:

- a 2-D backbone matrix (``fc``, ``blk.N.attn_q/k/v/output``, ``blk.N.ffn_gate/up/down``)
  has the artifact's type, the value of ``strata.dflash.quantization``;
- a 2-D head matrix (Markov, confidence) is BF16 unless ``--heads TYPE`` was given, then
  that type (the GGUF does not record it; manifest.json's ``quantization.heads`` does);
- every other tensor (norms, biases, Gemma4's layer scalars: 1-D) stays BF16, as Strata's
  ``tools/dflash_quantize.py`` keeps them (docs/REFERENCE.md §3b).

The rule reads only the tensor table's ``kind`` and ``when`` (contract/tensor_table.py) of
the contract's family (contract/families.py), so it is every family's: a Gemma4 drafter's
matrices are Qwen3's names (``attn_v`` only without ``attention_k_eq_v``), its
``blk.N.layer_output_scale.weight`` ([1], kind "scalar") and four norms per layer stay BF16.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from dspark_convert.artifact.format import padded
from dspark_convert.contract.families import family_named
from dspark_convert.contract.tensor_table import expand_rule
from dspark_convert.errors import QuantizedTensorError
from dspark_convert.formats.quants import QUANT_TYPES

# The tensor table's conditions whose matrices are the DSpark heads (quantized only with
# --heads).
HEAD_RULES = ("markov", "gated", "rnn", "confidence")
QUANTIZATION_KEY = "strata.dflash.quantization"
PARENT_KEY = "strata.dflash.source_sha256"


def tensor_type(kind: str, when: str, ndim: int, qtype: str | None, heads: str | None) -> str:
    """The type a tensor has in an artifact quantized to ``qtype`` (None: a BF16 artifact)
    with ``heads`` for the head matrices. ``kind`` and ``when`` are the tensor table's
    (contract TensorSpec.kind, tensor_table.TensorRule.when)."""
    if qtype is None or kind != "matrix" or ndim != 2:
        return "BF16"
    if when in HEAD_RULES:
        return heads or "BF16"
    return qtype


def allowed_types(kind: str, when: str, ndim: int, qtype: str | None) -> tuple[str, ...]:
    """Every type ``tensor_type`` can give this tensor, whatever ``heads`` was: what a
    reader of the GGUF alone (which does not record ``heads``) can hold it to."""
    return tuple(dict.fromkeys(tensor_type(kind, when, ndim, qtype, heads)
                               for heads in (None, *QUANT_TYPES)))


def is_head(when: str) -> bool:
    return when in HEAD_RULES


def rule_whens(contract) -> dict[str, str]:
    """GGUF name -> the tensor table's condition ("always", "markov", "gated", ...) for a
    contract's tensors, from its family's table (contract/families.py)."""
    layers = contract.geometry.num_draft_layers
    return {gguf: rule.when for rule in family_named(contract.family).tensor_rules if rule.gguf
            for _s, gguf, _i in expand_rule(rule, layers)}


def type_ok(contract, qtype: str | None) -> Callable[[str, str], bool]:
    """(GGUF name, type) -> whether ``allowed_types`` admits that type for the tensor in an
    artifact of ``qtype`` (None: BF16 only), for contract/inventory's ``type_ok``."""
    specs = {spec.gguf_name: spec for spec in contract.written_tensors}
    whens = rule_whens(contract)

    def ok(name: str, dtype: str) -> bool:
        spec = specs.get(name)
        if spec is None:
            return dtype == "BF16"
        return dtype in allowed_types(spec.kind, whens[name], len(spec.gguf_shape), qtype)
    return ok


def any_quantized_type(qtype: str | None) -> Callable[[str, str], bool] | None:
    """The inventory's type check for an artifact of ``qtype``: None (BF16 only) for a BF16
    artifact; for a quantized one any type the reader knows, which one each tensor must
    hold being ``check_quantized_types``' rule (its own error, 48): a Q4_1 matrix in a Q8_0
    artifact breaks the quantized rule, not the BF16 one (it was "expected type BF16", 23)."""
    if qtype is None:
        return None
    return lambda _name, _dtype: True


def check_quantized_types(tensors, contract, qtype: str, label: str) -> str:
    """Each tensor of a quantized artifact against the one type rule
    (artifact/quantized.py, which ``dspark quantize`` writes by): backbone matrices in the
    type ``strata.dflash.quantization`` names, norms, biases and layer scalars BF16, the head
    matrices BF16 or all in one type (``--heads``). Block and byte sizes are the reader's
    (gguf.structure: a row width that is not a multiple of the type's block is refused
    there, and each tensor spans exactly its blocks). ``tensors``: the GGUF's tensor infos, whose
    names the inventory check has matched to the contract. Returns the check's detail."""
    specs = {s.gguf_name: s for s in contract.written_tensors}
    whens = rule_whens(contract)
    counts: dict[str, int] = {}
    heads: dict[str, str] = {}          # head matrix -> its type
    for info in tensors:
        spec, found = specs[info.name], info.ggml_type.name   # the inventory matched them
        when = whens[info.name]
        allowed = allowed_types(spec.kind, when, len(info.shape), qtype)
        if found not in allowed:
            if spec.kind != "matrix":
                why = f"a {spec.kind} stays BF16 in a quantized artifact"
            elif is_head(when):
                why = "a head matrix is BF16, or of the type --heads gave"
            else:
                why = f"the backbone matrices have the type {QUANTIZATION_KEY} names, {qtype}"
            raise QuantizedTensorError(
                f"{label}: tensor '{info.name}' is {found}; expected {' or '.join(allowed)} "
                f"({why})", path=label, tensor=info.name, expected="|".join(allowed),
                found=found)
        if is_head(when) and len(allowed) > 1:
            heads[info.name] = found
        counts[found] = counts.get(found, 0) + 1
    if len(set(heads.values())) > 1:
        first = next(iter(heads))
        other = next(n for n, t in heads.items() if t != heads[first])
        raise QuantizedTensorError(
            f"{label}: the head matrices have two types: '{first}' is {heads[first]}, "
            f"'{other}' is {heads[other]}; expected one type for all of them (--heads)",
            path=label, tensor=other, expected=heads[first], found=heads[other])
    kinds = ", ".join(f"{n} {t}" for t, n in sorted(counts.items()))
    return (f"{qtype} artifact: {kinds}; backbone matrices {qtype}, {_kept_bf16(specs)} BF16, "
            f"head matrices {next(iter(set(heads.values())), 'none')}")


# The tensor table's kinds that are never quantized, as the check's detail names them.
_KEPT_WORDS = {"norm": "norms", "bias": "biases", "scalar": "layer scalars"}


def _kept_bf16(specs) -> str:
    """The kinds of tensor this contract keeps BF16 whatever the type ("norms and biases";
    a Gemma4 drafter's "norms, biases and layer scalars")."""
    kinds = {spec.kind for spec in specs.values() if spec.kind != "matrix"}
    words = [w for k, w in _KEPT_WORDS.items() if k in kinds]
    words += sorted(f"{k} tensors" for k in kinds - set(_KEPT_WORDS))
    return ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else "".join(words)


# How manifest.json's quantization.tool names the quantizer (quantize writes it, validate
# holds a manifest to it): gguf-py's version, whose arithmetic defines the bytes.
QUANTIZATION_TOOL_SHAPE = "gguf-py <version> gguf.quants.quantize, from BF16 widened to float32"
_TOOL = re.compile(r"gguf-py (\S+) gguf\.quants\.quantize, from BF16 widened to float32")


def quantization_tool(gguf_py_version: str) -> str:
    return QUANTIZATION_TOOL_SHAPE.replace("<version>", gguf_py_version)


def is_quantization_tool(text: str) -> bool:
    return _TOOL.fullmatch(text) is not None


def parent_gguf_size(gguf) -> int:
    """The size in bytes of the BF16 drafter.gguf a quantized one (``gguf``, parsed) was
    made from: quantize keeps every key of the parent, in order, and appends the two
    strata.dflash keys, and the tensor-info table differs only in types (4 bytes each
    way); the parent is in the canonical layout (convert: the header and every tensor
    padded to the alignment), each tensor 2 bytes a value."""
    header = gguf.header_nbytes - sum(gguf.kv_nbytes.get(k, 0)
                                      for k in (QUANTIZATION_KEY, PARENT_KEY))
    return padded(header) + sum(padded(2 * math.prod(t.shape)) for t in gguf.tensors)
