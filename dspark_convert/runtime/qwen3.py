"""A minimal dense Qwen3 target read from its Hugging Face safetensors directory.

No transformers dependency: ``config.json`` is read strictly, the weights through our strict
safetensors header reader (single file or sharded with an index), BF16/F16/F32 widened to
float32. ``forward`` runs new tokens against a KV cache and returns the logits of every new
token and the hidden states in HF's ``output_hidden_states`` layout: index 0 is the
embedding output, index i+1 the output of layer i, and the last one is after the final norm.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..errors import DSparkError, RuntimeTargetError
from ..safetensors_reader import TensorEntry, read_checkpoint
from ..source import read_json_strict
from .layers import Rope, attention, linear, mlp, rms_norm, split_heads

_NUMPY_DTYPES = {"BF16": "<u2", "F16": "<f2", "F32": "<f4"}
EMBED = "model.embed_tokens.weight"
HEAD = "lm_head.weight"


@dataclass(frozen=True)
class Qwen3Config:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    stop_token_ids: tuple[int, ...]   # generation_config.json's eos_token_id (else config's)


def _int_field(cfg: dict, name: str, path: str) -> int:
    value = cfg.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise RuntimeTargetError(f"{path}: field {name!r}: expected a positive integer, found "
                                 f"{value!r}", path=path, field=name, expected="positive int",
                                 found=repr(value))
    return value


def _refuse(path: str, name: str, expected: object, found: object) -> RuntimeTargetError:
    return RuntimeTargetError(f"{path}: field {name!r}: the reference runtime runs dense Qwen3 "
                              f"only; expected {expected!r}, found {found!r}", path=path,
                              field=name, expected=str(expected), found=str(found))


def _eos_ids(value: object) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return tuple(dict.fromkeys(value))
    return ()


def read_target_config(directory: Path) -> Qwen3Config:
    path = directory / "config.json"
    label = f"target {path}"
    if not path.is_file():
        raise RuntimeTargetError(f"{label}: not found; expected the target's config.json",
                                 path=str(path), expected="config.json", found="nothing")
    cfg = read_json_strict(path, error=RuntimeTargetError, label=label)
    if not isinstance(cfg, dict):
        raise RuntimeTargetError(f"{label}: expected a JSON object", path=str(path))
    if cfg.get("model_type") != "qwen3":
        raise _refuse(label, "model_type", "qwen3", cfg.get("model_type"))
    for name, want in (("attention_bias", False), ("hidden_act", "silu")):
        if cfg.get(name, want) != want:
            raise _refuse(label, name, want, cfg.get(name))
    if cfg.get("use_sliding_window"):
        raise _refuse(label, "use_sliding_window", False, True)
    rope = cfg.get("rope_parameters") or {}
    if not isinstance(rope, dict):
        raise _refuse(label, "rope_parameters", "an object", rope)
    if rope.get("rope_type", "default") != "default" or cfg.get("rope_scaling"):
        raise _refuse(label, "rope_parameters.rope_type", "default", rope.get("rope_type"))
    theta = rope.get("rope_theta", cfg.get("rope_theta"))
    eps = cfg.get("rms_norm_eps")
    for name, value in (("rope_theta", theta), ("rms_norm_eps", eps)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) \
                or not math.isfinite(value) or value <= 0:
            raise RuntimeTargetError(f"{label}: field {name!r}: expected a positive number, "
                                     f"found {value!r}", path=str(path), field=name,
                                     expected="> 0", found=repr(value))
    ints = {name: _int_field(cfg, name, label) for name in (
        "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "vocab_size")}
    if ints["num_attention_heads"] % ints["num_key_value_heads"]:
        raise _refuse(label, "num_key_value_heads", "a divisor of num_attention_heads",
                      ints["num_key_value_heads"])
    stops = _eos_ids(cfg.get("eos_token_id"))
    gen_path = directory / "generation_config.json"
    if gen_path.is_file():
        gen = read_json_strict(gen_path, error=RuntimeTargetError, label=f"target {gen_path}")
        if isinstance(gen, dict) and "eos_token_id" in gen:
            stops = _eos_ids(gen["eos_token_id"])
    return Qwen3Config(**ints, rms_norm_eps=float(eps), rope_theta=float(theta),
                       tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                       stop_token_ids=stops)


def _read_entry(entry: TensorEntry) -> tuple[np.ndarray, bytes]:
    with open(entry.file, "rb") as fh:
        fh.seek(entry.begin)
        raw = fh.read(entry.nbytes)
    if len(raw) != entry.nbytes:
        raise RuntimeTargetError(f"target {entry.file}: tensor {entry.name!r} is truncated",
                                 path=str(entry.file), tensor=entry.name)
    return np.frombuffer(raw, dtype=_NUMPY_DTYPES[entry.dtype]), raw


def _to_torch(array: np.ndarray, dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    if dtype == "BF16":
        value = torch.from_numpy(array.copy().view(np.int16)).view(torch.bfloat16)
    else:
        value = torch.from_numpy(array.copy())
    return value.reshape(shape)


@dataclass
class KVCache:
    """Per-layer keys (after RoPE) and values, [nkv, T, d]."""

    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)

    @property
    def length(self) -> int:
        return self.keys[0].shape[1] if self.keys else 0

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if layer == len(self.keys):
            self.keys.append(k)
            self.values.append(v)
        else:
            self.keys[layer] = torch.cat([self.keys[layer], k], dim=1)
            self.values[layer] = torch.cat([self.values[layer], v], dim=1)
        return self.keys[layer], self.values[layer]

    def crop(self, length: int) -> None:
        self.keys = [k[:, :length] for k in self.keys]
        self.values = [v[:, :length] for v in self.values]


@dataclass(frozen=True)
class TargetOutput:
    logits: torch.Tensor                 # [S, V]
    hidden_states: tuple[torch.Tensor, ...]   # HF layout, each [S, H]


class Qwen3Target:
    """The target model. ``embed_sha256`` / ``lm_head_sha256``: SHA-256 of the raw bytes of
    its embedding and head tensors (the head is the embedding when tied). Compute is float32
    (``dtype`` float64 exists to measure float32's own error)."""

    def __init__(self, directory: str | os.PathLike, *, device: torch.device,
                 dtype: torch.dtype = torch.float32) -> None:
        directory = Path(directory)
        if not directory.is_dir():
            raise RuntimeTargetError(f"target {directory}: not a directory", path=str(directory),
                                     expected="a Qwen3 HF directory", found="nothing")
        self.directory = directory
        self.config = cfg = read_target_config(directory)
        self.device = device
        try:
            checkpoint = read_checkpoint(directory)
        except RuntimeTargetError:
            raise
        except DSparkError as exc:
            raise RuntimeTargetError(f"target {directory}: {exc.message}", path=exc.path,
                                     tensor=exc.tensor) from None
        entries = checkpoint.tensors
        H, I, V, d = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.head_dim
        nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
        shapes = {EMBED: (V, H), "model.norm.weight": (H,)}
        if not cfg.tie_word_embeddings:
            shapes[HEAD] = (V, H)
        for i in range(cfg.num_hidden_layers):
            p = f"model.layers.{i}."
            shapes.update({
                p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                p + "self_attn.q_proj.weight": (nh * d, H), p + "self_attn.k_proj.weight": (nkv * d, H),
                p + "self_attn.v_proj.weight": (nkv * d, H), p + "self_attn.o_proj.weight": (H, nh * d),
                p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
                p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H),
                p + "mlp.down_proj.weight": (H, I)})
        self.w: dict[str, torch.Tensor] = {}
        digests: dict[str, str] = {}
        for name, shape in shapes.items():
            entry = entries.get(name)
            if entry is None:
                raise RuntimeTargetError(f"target {directory}: tensor {name!r} is missing",
                                         path=str(directory), tensor=name, expected=list(shape),
                                         found="absent")
            if entry.shape != shape or entry.dtype not in _NUMPY_DTYPES:
                raise RuntimeTargetError(
                    f"target {entry.file}: tensor {name!r}: expected {list(shape)} BF16/F16/F32, "
                    f"found {list(entry.shape)} {entry.dtype}", path=str(entry.file), tensor=name,
                    expected=list(shape), found=list(entry.shape))
            array, raw = _read_entry(entry)
            if name in (EMBED, HEAD):
                digests[name] = hashlib.sha256(raw).hexdigest()
            self.w[name] = _to_torch(array, entry.dtype, shape).to(device=device, dtype=dtype)
        self.embed = self.w[EMBED]
        self.lm_head = self.w[EMBED] if cfg.tie_word_embeddings else self.w[HEAD]
        self.embed_sha256 = digests[EMBED]
        self.lm_head_sha256 = digests[EMBED] if cfg.tie_word_embeddings else digests[HEAD]
        self.rope = Rope(d, cfg.rope_theta, device, dtype)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, cache: KVCache) -> TargetOutput:
        """Run ``ids`` [S] at positions cache.length, ...; the cache grows by S."""
        cfg, w = self.config, self.w
        start, eps = cache.length, cfg.rms_norm_eps
        h = self.embed[ids]
        hidden = [h]
        nh, nkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        for i in range(cfg.num_hidden_layers):
            p = f"model.layers.{i}."
            x = rms_norm(h, w[p + "input_layernorm.weight"], eps)
            q = split_heads(linear(x, w[p + "self_attn.q_proj.weight"]), nh, d)
            k = split_heads(linear(x, w[p + "self_attn.k_proj.weight"]), nkv, d)
            v = split_heads(linear(x, w[p + "self_attn.v_proj.weight"]), nkv, d)
            q = self.rope.apply(rms_norm(q, w[p + "self_attn.q_norm.weight"], eps), start)
            k = self.rope.apply(rms_norm(k, w[p + "self_attn.k_norm.weight"], eps), start)
            keys, values = cache.append(i, k, v)
            attn = attention(q, keys, values, causal_offset=start)
            h = h + linear(attn, w[p + "self_attn.o_proj.weight"])
            x = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
            h = h + mlp(x, w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"],
                        w[p + "mlp.down_proj.weight"])
            hidden.append(h)
        # HF replaces the last layer's output by its normalised form in hidden_states.
        hidden[-1] = rms_norm(h, w["model.norm.weight"], eps)
        return TargetOutput(logits=linear(hidden[-1], self.lm_head), hidden_states=tuple(hidden))
