"""The Gemma4 family in the reference runtime: a Gemma 4 target's text path and the
Gemma4 DSpark drafter (contract/families.py names this module for the family).

The target (``gemma4`` / ``gemma4_unified``, google/gemma-4-12B-it's family) read from its
HF safetensors directory, as transformers 5.10.2's Gemma4TextModel computes it
(docs/REFERENCE.md §10 has the facts and DeepSpec's lines):

- embedding ``E[ids] * sqrt(H)``, the scale rounded to the compute dtype first (a
  non-persistent buffer cast to the weight's dtype: 62.0 for H 3840 in bfloat16);
- per layer, by ``text_config.layer_types``: *sliding* layers have ``head_dim``,
  ``num_key_value_heads``, a v_proj, the default RoPE of ``rope_parameters
  ["sliding_attention"]`` and see the last ``sliding_window`` positions; *full* layers
  have ``global_head_dim``, and under ``attention_k_eq_v`` ``num_global_key_value_heads``
  and no v_proj (V is K's projection), proportional partial RoPE; every layer
  RMS-normalises V without a weight (v_norm), q and k with theirs, and attends with scale 1;
- the Gemma sandwich: ``h += post_attention_norm(attn(input_norm(h)))``,
  ``h += post_feedforward_norm(mlp(pre_feedforward_norm(h)))``, then ``h *= layer_scalar``;
  GELU-tanh MLP; norms multiply by ``weight`` (not ``1 + weight``), in float32;
- the final norm, the tied head, and ``softcap * tanh(logits / softcap)``.

``hidden_states`` follow HF's ``output_hidden_states``: index 0 is the scaled embedding,
index i+1 the output of layer i after its scalar, the last one replaced by the final norm:
what DeepSpec's taps read.

The drafter (``Gemma4Drafter``) is runtime/drafter.py's loop with the Gemma4 backbone:
global geometry, k_eq_v, scale 1.0, proportional RoPE over global_head_dim, four norms and
a layer scalar per layer, the scaled embedding and the softcap before the Markov bias.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from pydantic import ConfigDict

from dspark_convert.contract.gemma4 import ACTIVATION
from dspark_convert.contract.qwen3 import ConfigErrors, stop_token_ids
from dspark_convert.errors import DSparkError, RuntimeTargetError
from dspark_convert.formats.safetensors import Checkpoint, read_checkpoint
from dspark_convert.runtime.drafter import DSparkDrafter
from dspark_convert.runtime.layers import Packed, Rope, attention, linear, split_heads
from dspark_convert.runtime.loading import (StoredModel, check_layer_count, load_target,
                                            stored_tensors)
from dspark_convert.runtime.qwen3 import KVCache, TargetOutput, packed_outputs
from dspark_convert.target.gemma4 import TEXT_MODEL_TYPES, Gemma4TargetText, full_rope
from dspark_convert.util.models import validated
from dspark_convert.util.progress import Progress
from dspark_convert.util.strict_json import read_json_strict

PREFIX = "model.language_model."
EMBED = PREFIX + "embed_tokens.weight"
NORM = PREFIX + "norm.weight"
HEAD = "lm_head.weight"
SLIDING, FULL = "sliding_attention", "full_attention"
_LAYER_NAME = re.compile(re.escape(PREFIX) + r"layers\.(\d{1,9})\.")
_LABEL = "text_config."
RUNTIME_ROPE_ERRORS = ConfigErrors(malformed=RuntimeTargetError, unsupported=RuntimeTargetError,
                                   limit=RuntimeTargetError)


# --- the target's config ---------------------------------------------------------------

class Gemma4RuntimeText(Gemma4TargetText):
    """The target's text_config as the runtime computes with it: the pairing's reader
    (target/gemma4.py) plus what only a run needs. Unknown fields are kept, never read."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)

    intermediate_size: int
    head_dim: int
    layer_types: list[str]
    sliding_window: int | None = None
    hidden_activation: str
    attention_bias: bool = False
    enable_moe_block: bool = False
    hidden_size_per_layer_input: int = 0
    num_kv_shared_layers: int = 0
    use_bidirectional_attention: str | None = None
    eos_token_id: int | list[int] | None = None


@dataclass(frozen=True)
class LayerGeometry:
    kind: str                 # sliding_attention or full_attention
    kv_heads: int
    head_dim: int
    has_v_proj: bool


@dataclass(frozen=True)
class Gemma4RuntimeConfig:
    """What the run computes with, resolved once (the names memory.py and smoke read are
    those of runtime/qwen3.RuntimeConfig)."""

    text: Gemma4RuntimeText
    layers: tuple[LayerGeometry, ...]
    full_rope: tuple[float, int]          # theta, rotated pairs (over global_head_dim)
    sliding_rope_theta: float
    stop_token_ids: tuple[int, ...]

    def __getattr__(self, name: str):
        # hidden_size, vocab_size, rms_norm_eps, ...: the text_config's.
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.text, name)

    @property
    def num_hidden_layers(self) -> int:
        return self.text.num_hidden_layers

    @property
    def max_position_embeddings(self) -> int:
        return self.text.max_position_embeddings

    @property
    def softcap(self) -> float | None:
        return self.text.final_logit_softcapping

    def kv_elements_per_token(self) -> int:
        """Keys and values one position costs in the KV cache, over every layer."""
        return sum(2 * g.kv_heads * g.head_dim for g in self.layers)

    def attention_shapes(self) -> set[tuple[int, int]]:
        """(KV heads, head_dim) of each kind of attention layer: sliding and full differ
        (gemma-4-12B-it: 8 x 256 and 1 x 512)."""
        return {(g.kv_heads, g.head_dim) for g in self.layers}


def _refuse(label: str, field: str, expected, found, why: str) -> RuntimeTargetError:
    return RuntimeTargetError(f"{label}: field '{_LABEL}{field}': {why}; expected {expected}, "
                              f"found {found!r}", path=label, field=_LABEL + field,
                              expected=expected, found=found)


def runtime_config(raw: object, directory: Path) -> Gemma4RuntimeConfig:
    """config.json of a Gemma4 target as the runtime runs it; refused (70) where the text
    path is one this runtime does not compute (MoE, per-layer inputs, shared KV layers,
    bidirectional text attention, biases, another activation or RoPE)."""
    label = f"target {directory / 'config.json'}"
    model_type = raw.get("model_type") if isinstance(raw, dict) else None
    if model_type not in TEXT_MODEL_TYPES:
        raise RuntimeTargetError(f"{label}: field 'model_type': expected one of "
                                 f"{', '.join(TEXT_MODEL_TYPES)}, found {model_type!r}",
                                 path=label, field="model_type",
                                 expected=list(TEXT_MODEL_TYPES), found=model_type)
    text = validated(Gemma4RuntimeText, raw.get("text_config"), error=RuntimeTargetError,
                     label=f"{label}: field 'text_config'", path=label)
    for field, value in (("enable_moe_block", text.enable_moe_block),
                         ("attention_bias", text.attention_bias)):
        if value:
            raise _refuse(label, field, False, value, "the runtime computes dense, bias-free "
                                                      "Gemma4 layers")
    for field in ("hidden_size_per_layer_input", "num_kv_shared_layers"):
        if getattr(text, field) != 0:
            raise _refuse(label, field, 0, getattr(text, field),
                          "per-layer inputs and shared KV layers are not computed here")
    if text.hidden_activation != ACTIVATION:
        raise _refuse(label, "hidden_activation", ACTIVATION, text.hidden_activation,
                      "the Gemma4 MLP is GELU-tanh")
    if text.use_bidirectional_attention == "all":
        raise _refuse(label, "use_bidirectional_attention", "null or 'vision'", "all",
                      "text attention must be causal")
    for field in ("hidden_size", "intermediate_size", "vocab_size", "num_hidden_layers",
                  "num_attention_heads", "head_dim", "global_head_dim",
                  "max_position_embeddings"):
        value = getattr(text, field)
        if value <= 0:
            raise _refuse(label, field, "> 0", value, "a positive count")
    if not (math.isfinite(text.rms_norm_eps) and text.rms_norm_eps > 0):
        raise _refuse(label, "rms_norm_eps", "> 0", text.rms_norm_eps, "a positive epsilon")
    cap = text.final_logit_softcapping
    if cap is not None and not (math.isfinite(cap) and cap > 0):
        raise _refuse(label, "final_logit_softcapping", "> 0 or null", cap, "a positive cap")
    n = text.num_hidden_layers
    if len(text.layer_types) != n or set(text.layer_types) - {SLIDING, FULL}:
        raise _refuse(label, "layer_types", f"{n} x sliding_attention|full_attention",
                      text.layer_types, "one known type per layer")
    if SLIDING in text.layer_types and not (text.sliding_window and text.sliding_window > 0):
        raise _refuse(label, "sliding_window", "> 0", text.sliding_window,
                      "sliding layers need a window")
    rope = full_rope(text, label, RUNTIME_ROPE_ERRORS)
    sliding_theta = 0.0
    if SLIDING in text.layer_types:
        entry = text.rope_parameters.get("sliding_attention")
        if not (isinstance(entry, dict) and entry.get("rope_type") == "default"
                and isinstance(entry.get("rope_theta"), (int, float))
                and not isinstance(entry.get("rope_theta"), bool)
                and math.isfinite(entry["rope_theta"]) and entry["rope_theta"] > 0):
            raise _refuse(label, "rope_parameters.sliding_attention",
                          "{rope_type: default, rope_theta > 0}", entry,
                          "the sliding layers' RoPE")
        sliding_theta = float(entry["rope_theta"])
    layers = []
    for kind in text.layer_types:
        if kind == FULL and text.attention_k_eq_v:
            kv, has_v = text.num_global_key_value_heads, False
            kv_field = "num_global_key_value_heads"
        else:
            kv, has_v, kv_field = text.num_key_value_heads, True, "num_key_value_heads"
        d = text.global_head_dim if kind == FULL else text.head_dim
        if kv is None or kv <= 0 or text.num_attention_heads % kv:
            raise _refuse(label, kv_field, f"a divisor of {text.num_attention_heads}", kv,
                          f"the KV heads of the {kind} layers")
        if d % 2:
            raise _refuse(label, "global_head_dim" if kind == FULL else "head_dim", "even", d,
                          "RoPE rotates pairs")
        layers.append(LayerGeometry(kind=kind, kv_heads=kv, head_dim=d, has_v_proj=has_v))
    stops = stop_token_ids(text.eos_token_id)
    gen_path = directory / "generation_config.json"
    if gen_path.is_file():
        gen = read_json_strict(gen_path, error=RuntimeTargetError, label=f"target {gen_path}")
        if isinstance(gen, dict) and "eos_token_id" in gen:
            stops = stop_token_ids(gen["eos_token_id"])
    return Gemma4RuntimeConfig(text=text, layers=tuple(layers),
                               full_rope=(rope.theta, rope.rotated_pairs),
                               sliding_rope_theta=sliding_theta, stop_token_ids=stops)


def read_target_config(directory: Path) -> Gemma4RuntimeConfig:
    path = directory / "config.json"
    if not path.is_file():
        raise RuntimeTargetError(f"target {path}: not found; expected the target's config.json",
                                 path=str(path), expected="config.json", found="nothing")
    return runtime_config(read_json_strict(path, error=RuntimeTargetError,
                                           label=f"target {path}"), directory)


# --- the target's tensors --------------------------------------------------------------

def tensor_shapes(cfg: Gemma4RuntimeConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the text path needs, with its torch shape (call it once the layer
    count has been checked against the headers)."""
    t = cfg.text
    H, I, V, nh = t.hidden_size, t.intermediate_size, t.vocab_size, t.num_attention_heads
    shapes = {EMBED: (V, H), NORM: (H,)}
    if not t.tie_word_embeddings:
        shapes[HEAD] = (V, H)
    for i, g in enumerate(cfg.layers):
        p = f"{PREFIX}layers.{i}."
        d, kv = g.head_dim, g.kv_heads
        shapes.update({
            p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
            p + "pre_feedforward_layernorm.weight": (H,),
            p + "post_feedforward_layernorm.weight": (H,), p + "layer_scalar": (1,),
            p + "self_attn.q_proj.weight": (nh * d, H), p + "self_attn.k_proj.weight": (kv * d, H),
            p + "self_attn.o_proj.weight": (H, nh * d),
            p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
            p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H),
            p + "mlp.down_proj.weight": (H, I)})
        if g.has_v_proj:
            shapes[p + "self_attn.v_proj.weight"] = (kv * d, H)
    return shapes


@dataclass(frozen=True)
class TargetPlan(StoredModel):
    directory: Path
    config: Gemma4RuntimeConfig


def plan_target(directory: str | os.PathLike, *, config: object | None = None,
                checkpoint: Checkpoint | None = None) -> TargetPlan:
    """config.json and the safetensors headers checked; no tensor byte read. ``config``:
    the raw config.json as the pairing read it (target/model.py ``Target.raw_config``)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise RuntimeTargetError(f"target {directory}: not a directory", path=str(directory),
                                 expected="a Gemma4 HF directory", found="nothing")
    cfg = (runtime_config(config, directory) if config is not None
           else read_target_config(directory))
    try:
        checkpoint = checkpoint if checkpoint is not None else read_checkpoint(directory)
    except DSparkError as exc:
        raise RuntimeTargetError(f"target {directory}: {exc.message}", path=exc.path,
                                 tensor=exc.tensor) from None
    entries = checkpoint.tensors
    check_layer_count(entries, _LAYER_NAME, cfg.num_hidden_layers, directory,
                      _LABEL + "num_hidden_layers")
    tensors = stored_tensors(entries, tensor_shapes(cfg), directory, RuntimeTargetError)
    return TargetPlan(directory=directory, config=cfg, tensors=tensors)


def plan_for(target) -> TargetPlan:
    """The plan of a paired target (target/model.py ``Target``), from what the pairing read."""
    return plan_target(target.directory, config=target.raw_config, checkpoint=target.checkpoint)


# --- the arithmetic both models share --------------------------------------------------

def gemma_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """Gemma4RMSNorm: ``x * (mean(x^2) + eps)^-0.5 * weight``, all in float32 (float64 for a
    float64 model), cast back at the end; no weight: v_norm."""
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    out = wide * torch.pow(wide.pow(2).mean(-1, keepdim=True) + eps, -0.5)
    if weight is not None:
        out = out * weight.to(wide.dtype)
    return out.to(x.dtype)


def gelu_mlp(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor
             ) -> torch.Tensor:
    return linear(F.gelu(linear(x, gate), approximate="tanh") * linear(x, up), down)


def softcapped(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    return logits if cap is None else torch.tanh(logits / cap) * cap


def embed_scale(hidden_size: int, dtype: torch.dtype) -> torch.Tensor:
    """sqrt(H), rounded to the compute dtype as transformers' buffer is (62.0 for 3840 in
    bfloat16; 8 exactly for the fixtures' 64)."""
    return torch.tensor(float(hidden_size) ** 0.5, dtype=torch.float32).to(dtype)

def project_kv(x: torch.Tensor, w: dict, p: str, heads: int, head_dim: int, has_v_proj: bool,
               rope: Rope, start: int | torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A Gemma4 attention's keys and values at positions start, ...: K = rope(k_norm(k_proj
    x)); V = v_norm(v_proj x), or under k_eq_v v_norm(k_proj x) (taken before k_norm, not
    rotated). ``p``: the layer's weight-name prefix up to ``self_attn.``."""
    k_raw = split_heads(linear(x, w[p + "k_proj.weight"]), heads, head_dim)
    v_raw = (split_heads(linear(x, w[p + "v_proj.weight"]), heads, head_dim) if has_v_proj
             else k_raw)
    k = rope.apply(gemma_norm(k_raw, w[p + "k_norm.weight"], eps), start)
    return k, gemma_norm(v_raw, None, eps)


def layer_rest(h: torch.Tensor, a: torch.Tensor, w: dict, p: str, eps: float) -> torch.Tensor:
    """The rest of a Gemma4 decoder layer once its attention gave ``a``: the sandwich
    (post-attention norm, residual; pre-/post-feedforward norms around the GELU-tanh MLP,
    residual), then the layer scalar on the whole residual stream. The target's layers and
    the drafter's alike; ``p``: the layer's weight-name prefix."""
    h = h + gemma_norm(linear(a, w[p + "self_attn.o_proj.weight"]),
                       w[p + "post_attention_layernorm.weight"], eps)
    x = gemma_norm(h, w[p + "pre_feedforward_layernorm.weight"], eps)
    h = h + gemma_norm(gelu_mlp(x, w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"],
                                w[p + "mlp.down_proj.weight"]),
                       w[p + "post_feedforward_layernorm.weight"], eps)
    return h * w[p + "layer_scalar"]



# --- the target ------------------------------------------------------------------------

class Gemma4Target:
    """A Gemma 4 target's text path, weights in ``dtype`` on ``device`` (the protocol of
    runtime/qwen3.Qwen3Target: ``forward``, ``embed``, ``lm_head``, ``config``)."""

    def __init__(self, directory: str | os.PathLike, *, device: torch.device,
                 dtype: torch.dtype = torch.float32, plan: TargetPlan | None = None,
                 progress: Progress | None = None) -> None:
        plan = plan if plan is not None else plan_target(directory)
        self.directory = plan.directory
        self.config = cfg = plan.config
        self.device, self.dtype = device, dtype
        self.w = load_target(plan, device=device, dtype=dtype, progress=progress)
        self.embed = self.w[EMBED]
        self.lm_head = self.w[EMBED] if cfg.text.tie_word_embeddings else self.w[HEAD]
        self.scale = embed_scale(cfg.text.hidden_size, dtype).to(device)
        theta, pairs = cfg.full_rope
        self.ropes = {FULL: Rope(cfg.text.global_head_dim, theta, device, dtype,
                                 rotated_pairs=pairs)}
        if SLIDING in cfg.text.layer_types:
            self.ropes[SLIDING] = Rope(cfg.text.head_dim, cfg.sliding_rope_theta, device, dtype)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, cache: KVCache, *, keep: Collection[int] | None = None,
                last_logits_only: bool = False) -> TargetOutput:
        """Run ``ids`` [S] at positions cache.length, ...; the cache grows by S (every
        position is kept, the sliding layers' window is a mask: a verify's rejected rows
        can then be cropped as for Qwen3)."""
        return self.forward_packed([(ids, cache)], keep=keep,
                                   last_logits_only=last_logits_only)[0]

    @torch.inference_mode()
    def forward_packed(self, segments, *, keep: Collection[int] | None = None,
                       last_logits_only: bool = False) -> list[TargetOutput]:
        """``forward`` of several requests at once ([(ids, cache), ...]): one forward over
        all their rows, each attending to its own cache (runtime/layers.Packed)."""
        cfg, w, t = self.config, self.w, self.config.text
        eps, nh = t.rms_norm_eps, t.num_attention_heads
        last = t.num_hidden_layers
        pack = Packed(segments, self.device)
        h = self.embed[pack.rows] * self.scale
        hidden: list[torch.Tensor | None] = [h if keep is None or 0 in keep else None]
        for i, g in enumerate(cfg.layers):
            p = f"{PREFIX}layers.{i}."
            rope = self.ropes[g.kind]
            x = gemma_norm(h, w[p + "input_layernorm.weight"], eps)
            q = split_heads(linear(x, w[p + "self_attn.q_proj.weight"]), nh, g.head_dim)
            q = rope.apply(gemma_norm(q, w[p + "self_attn.q_norm.weight"], eps), pack.where)
            k, v = project_kv(x, w, p + "self_attn.", g.kv_heads, g.head_dim, g.has_v_proj,
                              rope, pack.where, eps)
            window = t.sliding_window if g.kind == SLIDING else None
            a = pack.attend(i, q, k, v, lambda q, keys, values, start: attention(
                q, keys, values, causal_offset=start, scale=1.0, window=window))
            h = layer_rest(h, a, w, p, eps)
            hidden.append(h if keep is None or i + 1 in keep else None)
        hidden[-1] = gemma_norm(h, w[NORM], eps)
        final = pack.last_rows(hidden[-1]) if last_logits_only else hidden[-1]
        if keep is not None and last not in keep:
            hidden[-1] = None
        logits = softcapped(linear(final, self.lm_head), cfg.softcap)
        return packed_outputs(pack, logits, hidden, last_logits_only)


# --- the drafter -----------------------------------------------------------------------

class Gemma4Drafter(DSparkDrafter):
    """The Gemma4 DSpark drafter (DeepSpec's Gemma4DSparkModel, eval path): the loop,
    Markov and confidence heads of DSparkDrafter over the Gemma4 backbone."""

    def _rope(self, contract, device: torch.device) -> Rope:
        r = contract.rope
        return Rope(r.head_dim, r.theta, device, self.dtype, rotated_pairs=r.rotated_pairs)

    def _setup(self, contract, device: torch.device) -> None:
        self.k_eq_v = contract.attention.k_eq_v
        self.softcap = contract.blocks.final_logit_softcapping
        self.scale = embed_scale(contract.geometry.hidden_size, self.dtype).to(device)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        return gemma_norm(x, weight, self.eps)

    def _kv(self, layer: int, x: torch.Tensor, start: int | torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor]:
        return project_kv(x, self.w, f"layers.{layer}.self_attn.", self.kv_heads, self.head_dim,
                          not self.k_eq_v, self.rope, start, self.eps)

    def _embed_rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed[ids] * self.scale

    def _block_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attention(q, k, v, causal_offset=None, scale=1.0)

    def _layer_rest(self, h: torch.Tensor, a: torch.Tensor, p: str) -> torch.Tensor:
        return layer_rest(h, a, self.w, p, self.eps)

    def base_logits(self, hb: torch.Tensor) -> torch.Tensor:
        """softcap(lm_head(hb)): the Markov bias is added after the cap (DeepSpec's
        draft_ops.py), so corrected logits may exceed it."""
        return softcapped(linear(hb, self.lm_head), self.softcap)


# The family's runtime protocol (contract/families.py ``runtime``).
Target = Gemma4Target
Drafter = Gemma4Drafter
