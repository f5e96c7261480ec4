"""A minimal dense Qwen3 target read from its Hugging Face safetensors directory.

No transformers dependency: ``config.json`` is read strictly, the weights through our strict
safetensors header reader (single file or sharded with an index). Two steps:

- ``plan_target``: config.json and the safetensors headers only, no tensor byte. Every
  count config.json gives is checked against what the headers hold before anything is
  sized by it (a config that claims 2**40 layers is refused here, in milliseconds), and
  every tensor's shape and dtype against the config. The memory estimate and the context
  check are made from the plan, before any weight is loaded.
- ``Qwen3Target``: the weights, loaded once into the compute dtype on the compute device
  (runtime/loading.py).

``forward`` runs new tokens against a KV cache and returns the logits of the new tokens and
the hidden states in HF's ``output_hidden_states`` layout: index 0 is the embedding output,
index i+1 the output of layer i, and the last one is after the final norm.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dspark_convert.contract.qwen3 import (ConfigErrors, Qwen3Config, check_dense,
                                          check_heads_divide, check_positive,
                                          check_positive_eps, parse_qwen3_config, rope_theta,
                                          stop_token_ids)
from dspark_convert.errors import DSparkError, RuntimeTargetError
from dspark_convert.util.progress import Progress
from dspark_convert.formats.safetensors import Checkpoint, read_checkpoint
from dspark_convert.util.strict_json import read_json_strict
from dspark_convert.runtime.drafter import DSparkDrafter
from dspark_convert.runtime.layers import (Packed, Rope, attention, linear, mlp, rms_norm,
                                           split_heads)
from dspark_convert.runtime.loading import (StoredModel, check_layer_count, load_target,
                                            stored_tensors)

EMBED = "model.embed_tokens.weight"
HEAD = "lm_head.weight"
# A layer index in a tensor name. Bounded to 9 digits: int() of a hostile 5,000-digit
# name would raise; such a name is simply not a layer (and the layer count then differs).
_LAYER_NAME = re.compile(r"model\.layers\.(\d{1,9})\.")


class RuntimeConfig(Qwen3Config):
    """The target's config as the runtime computes with it: the one Qwen3 config model
    (contract/qwen3.py) with what it resolves filled in: ``rope_theta`` (from either of
    its two fields), ``max_position_embeddings`` (its default), and the stop tokens
    (generation_config.json's eos_token_id, else config.json's)."""

    rope_theta: float
    max_position_embeddings: int
    stop_token_ids: tuple[int, ...]

    def kv_elements_per_token(self) -> int:
        """Keys and values one position costs in the KV cache, over every layer."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim

    def attention_shapes(self) -> set[tuple[int, int]]:
        """(KV heads, head_dim) of each kind of attention layer: one kind here."""
        return {(self.num_key_value_heads, self.head_dim)}


# What the runtime refuses of a target's config: it runs a dense Qwen3 only (70).
RUNTIME_ERRORS = ConfigErrors(malformed=RuntimeTargetError, unsupported=RuntimeTargetError,
                              limit=RuntimeTargetError)
_COUNTS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
           "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings")


def runtime_config(cfg: Qwen3Config, directory: Path) -> RuntimeConfig:
    """The runtime's view of a parsed target config: refused (70) unless it is a dense
    Qwen3 the runtime computes exactly (no bias, SiLU, no sliding window, default RoPE)."""
    label = f"target {directory / 'config.json'}"
    if cfg.model_type != "qwen3":
        raise RuntimeTargetError(f"{label}: field 'model_type': the reference runtime runs "
                                 f"dense Qwen3 only; expected 'qwen3', found {cfg.model_type!r}",
                                 path=label, field="model_type", expected="qwen3",
                                 found=str(cfg.model_type))
    check_dense(cfg, path=label, errors=RUNTIME_ERRORS)
    theta = rope_theta(cfg, path=label, errors=RUNTIME_ERRORS)
    check_positive(cfg, _COUNTS, path=label, errors=RUNTIME_ERRORS)
    check_positive_eps(cfg, path=label, errors=RUNTIME_ERRORS)
    check_heads_divide(cfg, path=label, errors=RUNTIME_ERRORS)
    stops = stop_token_ids(cfg.eos_token_id)
    gen_path = directory / "generation_config.json"
    if gen_path.is_file():
        gen = read_json_strict(gen_path, error=RuntimeTargetError, label=f"target {gen_path}")
        if isinstance(gen, dict) and "eos_token_id" in gen:
            stops = stop_token_ids(gen["eos_token_id"])
    return RuntimeConfig.model_validate({
        **cfg.model_dump(), "rope_theta": theta, "rope_parameters": None,
        "max_position_embeddings": cfg.context_length, "stop_token_ids": stops})


def read_target_config(directory: Path) -> RuntimeConfig:
    """config.json of a target directory, for a runtime used without the pairing (tests,
    bench/); `dspark smoke` hands over the config the pairing already read."""
    path = directory / "config.json"
    label = f"target {path}"
    if not path.is_file():
        raise RuntimeTargetError(f"{label}: not found; expected the target's config.json",
                                 path=str(path), expected="config.json", found="nothing")
    raw = read_json_strict(path, error=RuntimeTargetError, label=label)
    return runtime_config(parse_qwen3_config(raw, path=label, errors=RUNTIME_ERRORS), directory)


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




def tensor_shapes(cfg: RuntimeConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a dense Qwen3 target must have, with its torch shape, in load order.
    Sized by ``cfg.num_hidden_layers``: call it only once that count has been checked
    against the checkpoint (``plan_target`` does)."""
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
    return shapes


@dataclass(frozen=True)
class TargetPlan(StoredModel):
    """A target checked from its config and headers: what will be loaded, from where
    (``tensors`` in tensor_shapes' order)."""

    directory: Path
    config: RuntimeConfig


def plan_target(directory: str | os.PathLike, *, config: Qwen3Config | None = None,
                checkpoint: Checkpoint | None = None) -> TargetPlan:
    """Read and check config.json and the safetensors headers; no tensor byte is read.
    ``config`` and ``checkpoint``: the target's config and headers as the pairing already
    parsed them (target/model.py), so that smoke and eval read them once."""
    directory = Path(directory)
    if not directory.is_dir():
        raise RuntimeTargetError(f"target {directory}: not a directory", path=str(directory),
                                 expected="a Qwen3 HF directory", found="nothing")
    cfg = runtime_config(config, directory) if config is not None else read_target_config(directory)
    try:
        checkpoint = checkpoint if checkpoint is not None else read_checkpoint(directory)
    except RuntimeTargetError:
        raise
    except DSparkError as exc:
        raise RuntimeTargetError(f"target {directory}: {exc.message}", path=exc.path,
                                 tensor=exc.tensor) from None
    entries = checkpoint.tensors
    check_layer_count(entries, _LAYER_NAME, cfg.num_hidden_layers, directory,
                      "num_hidden_layers")
    tensors = stored_tensors(entries, tensor_shapes(cfg), directory, RuntimeTargetError)
    return TargetPlan(directory=directory, config=cfg, tensors=tensors)


def plan_for(target) -> TargetPlan:
    """The plan of a paired target (target/model.py ``Target``), from what the pairing read."""
    return plan_target(target.directory, config=target.qwen3, checkpoint=target.checkpoint)


@dataclass(frozen=True)
class TargetOutput:
    logits: torch.Tensor                           # [S, V], or [1, V] with last_logits_only
    hidden_states: tuple[torch.Tensor | None, ...]  # HF layout, each [S, H]; None: not kept


class Qwen3Target:
    """The target model, its weights in ``dtype`` on ``device``. That its embedding and head
    are the ones the drafter was made for is the pairing's proof (target/pairing.py, by
    SHA-256, before anything is loaded). ``dtype`` float64 exists only to measure
    float32's own error."""

    def __init__(self, directory: str | os.PathLike, *, device: torch.device,
                 dtype: torch.dtype = torch.float32, plan: TargetPlan | None = None,
                 progress: Progress | None = None) -> None:
        plan = plan if plan is not None else plan_target(directory)
        self.directory = plan.directory
        self.config = cfg = plan.config
        self.device, self.dtype = device, dtype
        self.w = load_target(plan, device=device, dtype=dtype, progress=progress)
        self.embed = self.w[EMBED]
        self.lm_head = self.w[EMBED] if cfg.tie_word_embeddings else self.w[HEAD]
        self.rope = Rope(cfg.head_dim, cfg.rope_theta, device, dtype)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, cache: KVCache, *, keep: Collection[int] | None = None,
                last_logits_only: bool = False) -> TargetOutput:
        """Run ``ids`` [S] at positions cache.length, ...; the cache grows by S.

        ``keep``: the hidden-state indices to return (the others are None), so that a long
        prompt does not hold every layer's output; None keeps all. ``last_logits_only``:
        the logits of the last token only (a prefill needs no others; a 151,936-token
        vocabulary costs 0.6 MB per token in float32)."""
        return self.forward_packed([(ids, cache)], keep=keep,
                                   last_logits_only=last_logits_only)[0]

    @torch.inference_mode()
    def forward_packed(self, segments, *, keep: Collection[int] | None = None,
                       last_logits_only: bool = False) -> list[TargetOutput]:
        """``forward`` of several requests at once: ``segments`` is [(ids, cache), ...],
        each request's new tokens and its own cache; one forward over all their rows
        (runtime/layers.Packed), one TargetOutput per segment."""
        cfg, w = self.config, self.w
        eps = cfg.rms_norm_eps
        last = cfg.num_hidden_layers
        pack = Packed(segments, self.device)
        h = self.embed[pack.rows]
        hidden: list[torch.Tensor | None] = [h if keep is None or 0 in keep else None]
        nh, nkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        for i in range(cfg.num_hidden_layers):
            p = f"model.layers.{i}."
            x = rms_norm(h, w[p + "input_layernorm.weight"], eps)
            q = split_heads(linear(x, w[p + "self_attn.q_proj.weight"]), nh, d)
            k = split_heads(linear(x, w[p + "self_attn.k_proj.weight"]), nkv, d)
            v = split_heads(linear(x, w[p + "self_attn.v_proj.weight"]), nkv, d)
            q = self.rope.apply(rms_norm(q, w[p + "self_attn.q_norm.weight"], eps), pack.where)
            k = self.rope.apply(rms_norm(k, w[p + "self_attn.k_norm.weight"], eps), pack.where)
            attn = pack.attend(i, q, k, v, lambda q, keys, values, start:
                               attention(q, keys, values, causal_offset=start))
            h = h + linear(attn, w[p + "self_attn.o_proj.weight"])
            x = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
            h = h + mlp(x, w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"],
                        w[p + "mlp.down_proj.weight"])
            hidden.append(h if keep is None or i + 1 in keep else None)
        # HF replaces the last layer's output by its normalised form in hidden_states.
        hidden[-1] = rms_norm(h, w["model.norm.weight"], eps)
        final = pack.last_rows(hidden[-1]) if last_logits_only else hidden[-1]
        if keep is not None and last not in keep:
            hidden[-1] = None
        return packed_outputs(pack, linear(final, self.lm_head), hidden, last_logits_only)


def packed_outputs(pack: Packed, logits: torch.Tensor, hidden: list[torch.Tensor | None],
                   last_logits_only: bool) -> list[TargetOutput]:
    """One TargetOutput per segment of a packed forward (both families' targets)."""
    per_logits = list(logits.split(1)) if last_logits_only else pack.split(logits)
    per_hidden = list(zip(*[pack.split(hs) for hs in hidden]))
    return [TargetOutput(logits=lg, hidden_states=tuple(hs))
            for lg, hs in zip(per_logits, per_hidden)]


# The family's runtime protocol (contract/families.py ``runtime``): every runtime module
# has ``plan_for`` (a paired target's plan, no tensor byte), ``Target`` (the model, loaded
# once: forward, embed, lm_head, config, device) and ``Drafter`` (runtime/drafter.py's
# loop over the family's backbone).
Target = Qwen3Target
Drafter = DSparkDrafter
