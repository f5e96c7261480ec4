"""Drafter GGUF files written the way Strata's own tools write them, for the bare-file
checks (tests/test_bare_gguf.py).

Provenance (read, not copied; Niko1221/Strata):

- ``tools/dflash_gguf.py`` (commit 9703070): packs a plain DeepSpec DFlash checkpoint (58
  BF16 tensors for five layers, no embedding, no head; anything else is refused) into the
  standalone GGUF Strata reads. Keys in this order, with the explicit types its
  ``GGUFWriter.add(key, value, type)`` calls give: ``general.architecture`` "dflash",
  ``general.name`` (config ``_name_or_path``, else "DFlash drafter"), the geometry as u32
  (embedding_length, block_count, head_count, head_count_kv, key_length,
  feed_forward_length, vocab_size, block_size, mask_token_id), ``dflash.target_layers`` a
  u32 array of DeepSpec's ids, ``dflash.rope.frequency_base`` f64 (rope_theta, default
  1e7), ``dflash.sample_from_anchor`` "true", ``dflash.attention.causal`` "false",
  ``dflash.markov_rank`` u32 0, ``dflash.has_confidence_head`` "false",
  ``dflash.source.sha256`` (of model.safetensors). No ``general.alignment`` (its writer
  aligns to 32 without saying so). Tensors under llama.cpp's names (``fc.weight``,
  ``enc.output_norm.weight``, ``output_norm.weight``, ``blk.N.*``), in its order: fc,
  hidden_norm, norm, then per layer attn_norm, ffn_norm, q, k, v, o, q_norm, k_norm, gate,
  up, down; the BF16 bytes unchanged.
- ``tools/dflash_quantize.py`` (commit 72ffe56, ``export``): re-reads a BF16 DFlash GGUF
  and writes every key again through ``GGUFWriter.add(key, value)`` *without* a type, so
  ``tools/gguf_writer.py``'s inference re-types it by the Python value: an int as i64, a
  float as f64, a bool as bool, a str as string, a list by its first element (int: an i32
  array, float: f32, str: string). Then ``general.alignment`` = 32 (an int: i64; a key
  already present keeps its place), ``strata.dflash.quantization`` and
  ``strata.dflash.source_sha256`` (of the source file). Every 2-D tensor is quantized with
  gguf-py's ``gguf.quants.quantize`` from the BF16 bits widened to float32; 1-D tensors are
  copied BF16; each tensor at the next 32-aligned offset.

Written here with gguf-py's GGUFWriter and explicit types (``add_key_value``), so the bytes
are gguf-py's layout of the same keys, types, order and tensors.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter
from gguf.quants import quantize

from dspark_convert.formats.gguf_reader import read_gguf, tensor_data

VT = GGUFValueType
BF16 = GGMLQuantizationType.BF16

# dflash_gguf.py's tables: HF name -> GGUF name.
FIXED = (("fc.weight", "fc.weight"), ("hidden_norm.weight", "enc.output_norm.weight"),
         ("norm.weight", "output_norm.weight"))
PER_LAYER = (("input_layernorm.weight", "attn_norm.weight"),
             ("post_attention_layernorm.weight", "ffn_norm.weight"),
             ("self_attn.q_proj.weight", "attn_q.weight"),
             ("self_attn.k_proj.weight", "attn_k.weight"),
             ("self_attn.v_proj.weight", "attn_v.weight"),
             ("self_attn.o_proj.weight", "attn_output.weight"),
             ("self_attn.q_norm.weight", "attn_q_norm.weight"),
             ("self_attn.k_norm.weight", "attn_k_norm.weight"),
             ("mlp.gate_proj.weight", "ffn_gate.weight"),
             ("mlp.up_proj.weight", "ffn_up.weight"),
             ("mlp.down_proj.weight", "ffn_down.weight"))
GEOMETRY_KEYS = (("dflash.embedding_length", "hidden_size"),
                 ("dflash.block_count", "num_hidden_layers"),
                 ("dflash.attention.head_count", "num_attention_heads"),
                 ("dflash.attention.head_count_kv", "num_key_value_heads"),
                 ("dflash.attention.key_length", "head_dim"),
                 ("dflash.feed_forward_length", "intermediate_size"),
                 ("dflash.vocab_size", "vocab_size"), ("dflash.block_size", "block_size"),
                 ("dflash.mask_token_id", "mask_token_id"))


def _safetensors(path: Path) -> tuple[dict, int]:
    with path.open("rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)), 8 + n


# What DeepSpec saves beside the drafter and Strata's packer refuses ("the DeepSpec drafter
# strips embed/lm_head"): the published checkpoints it packs ship neither; a DeepSpec-saved
# golden drafter is given to it without them, as a user strips them for Strata's tool.
STRIPPED = ("embed_tokens.weight", "lm_head.weight")


def strata_convert(checkpoint: Path, out: Path) -> Path:
    """``tools/dflash_gguf.py checkpoint/model.safetensors -o out``, as its keys and types
    say (module docstring). A plain DFlash checkpoint of one BF16 safetensors file (its
    STRIPPED tensors left out). ``dflash.source.sha256`` is the file's as given."""
    cfg = json.loads((checkpoint / "config.json").read_text())
    weights = checkpoint / "model.safetensors"
    header, base = _safetensors(weights)
    for name in ("__metadata__", *STRIPPED):
        header.pop(name, None)
    names = [(hf, gguf) for hf, gguf in FIXED]
    names += [(f"layers.{layer}.{hf}", f"blk.{layer}.{gguf}")
              for layer in range(cfg["num_hidden_layers"]) for hf, gguf in PER_LAYER]
    if sorted(header) != sorted(hf for hf, _ in names):
        raise ValueError(f"{checkpoint}: not a plain DFlash checkpoint dflash_gguf.py packs")
    writer = GGUFWriter(out, "dflash")
    writer.add_key_value("general.name", cfg.get("_name_or_path", "DFlash drafter"), VT.STRING)
    for key, field in GEOMETRY_KEYS:
        writer.add_key_value(key, cfg[field], VT.UINT32)
    writer.add_key_value("dflash.target_layers", [int(x) for x in cfg["target_layer_ids"]],
                         VT.ARRAY, sub_type=VT.UINT32)
    rope = cfg.get("rope_parameters") or {}
    writer.add_key_value("dflash.rope.frequency_base", float(rope.get("rope_theta", 1e7)),
                         VT.FLOAT64)
    writer.add_key_value("dflash.sample_from_anchor", "true", VT.STRING)
    writer.add_key_value("dflash.attention.causal", "false", VT.STRING)
    writer.add_key_value("dflash.markov_rank", 0, VT.UINT32)
    writer.add_key_value("dflash.has_confidence_head", "false", VT.STRING)
    writer.add_key_value("dflash.source.sha256",
                         hashlib.sha256(weights.read_bytes()).hexdigest(), VT.STRING)
    raw = weights.read_bytes()
    for hf, gguf in names:
        spec = header[hf]
        if spec["dtype"] != "BF16":
            raise ValueError(f"{hf}: {spec['dtype']}; dflash_gguf.py packs BF16 only")
        start, end = (base + o for o in spec["data_offsets"])
        shape = spec["shape"]
        data = np.frombuffer(raw[start:end], dtype=np.uint8).reshape(
            *shape[:-1], shape[-1] * 2)
        writer.add_tensor(gguf, data, raw_dtype=BF16)
    _write(writer)
    return out


def _inferred(value) -> tuple[GGUFValueType, GGUFValueType | None]:
    """tools/gguf_writer.py's type of a value added without one."""
    scalar = {bool: VT.BOOL, int: VT.INT64, float: VT.FLOAT64, str: VT.STRING}
    if type(value) in scalar:
        return scalar[type(value)], None
    element = {bool: VT.BOOL, int: VT.INT32, float: VT.FLOAT32, str: VT.STRING}
    if isinstance(value, list) and value and type(value[0]) in element:
        return VT.ARRAY, element[type(value[0])]
    raise TypeError(f"cannot infer a GGUF type for {value!r}")


def strata_quantize(source: Path, out: Path, kind: str = "Q8_0") -> Path:
    """``tools/dflash_quantize.py source -o out --type kind`` (its ``export``), as the module
    docstring says: every key re-typed by its value, ``general.alignment`` i64 32, the two
    quantization keys; 2-D tensors quantized, 1-D copied."""
    gguf = read_gguf(source)
    if gguf.kv.get("general.architecture") is None or \
            gguf.kv["general.architecture"].value != "dflash" or not gguf.tensors:
        raise ValueError("source must be a standalone DFlash GGUF")
    metadata = {key: entry.value for key, entry in gguf.kv.items()}
    metadata["general.alignment"] = 32
    metadata["strata.dflash.quantization"] = kind
    metadata["strata.dflash.source_sha256"] = hashlib.sha256(source.read_bytes()).hexdigest()
    writer = GGUFWriter(out, "dflash")
    for key, value in metadata.items():
        if key == "general.architecture":
            continue
        vtype, sub = _inferred(value)
        writer.add_key_value(key, value, vtype, sub_type=sub)
    data = source.read_bytes()
    qtype = GGMLQuantizationType[kind]
    for info in gguf.tensors:
        if info.ggml_type != BF16 or len(info.shape) not in (1, 2):
            raise ValueError(f"{info.name}: expected original BF16 vector or matrix")
        with tensor_data(gguf, info, data) as view:
            raw = np.frombuffer(bytes(view), dtype=np.uint8)
        if len(info.shape) == 1:            # norms keep their BF16 bits
            writer.add_tensor(info.name, raw, raw_dtype=BF16)
            continue
        bits = raw.view("<u2").astype(np.uint32) << 16
        cols, rows = info.shape
        values = bits.view(np.float32).reshape(rows, cols)
        if not np.isfinite(values).all():
            raise ValueError(f"{info.name}: non-finite weights")
        writer.add_tensor(info.name, quantize(values, qtype), raw_dtype=qtype)
    _write(writer)
    return out


def _write(writer: GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
