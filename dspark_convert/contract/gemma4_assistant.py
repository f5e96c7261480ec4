"""The Gemma 4 assistant (MTP drafter): the one reader of its config.json.

transformers 5.19's ``Gemma4UnifiedAssistantConfig`` (configuration_gemma4_unified_assistant.py)
holds a ``gemma4_unified_text`` text_config and ``backbone_hidden_size``, the hidden size of
the gemma4_unified target it drafts for. Its model (``Gemma4UnifiedAssistantForCausalLM``,
modeling_gemma4_unified_assistant.py) is a small Gemma 4 text decoder whose every layer is
KV-shared: the config class forces ``num_kv_shared_layers = num_hidden_layers``
(configuration_gemma4_unified_assistant.py:79-80), so no layer has k/v projections and each
attends to the target's KV of its layer type (docs/REFERENCE.md, "The Gemma 4 assistant").

Read here: what that forward computes with, each field strictly typed, every refusal one
line naming config.json and the field (AssistantConfigError, 152). A layer's geometry is
the text_config's ``head_dim`` / ``num_key_value_heads`` overridden by ``per_layer_config``
(what 5.19 writes: ``{"1": {"head_dim": 32, "num_key_value_heads": 1}}``) or, in files
without it, by ``global_head_dim`` / ``num_global_key_value_heads`` (under
``attention_k_eq_v``) on full layers, as Gemma4UnifiedTextConfig.__post_init__ derives it.
Refused: what the runtime does not compute (ordered centroid-masked embeddings, an untied
head) and what transformers' assistant does not have (layers with their own KV, MoE,
per-layer inputs, double-wide MLPs, biases, another activation or RoPE).
``final_logit_softcapping`` is recorded, never applied: the assistant's forward takes
``lm_head`` of the final norm as its logits (modeling_gemma4_unified_assistant.py:198-203).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from dspark_convert.contract.dspark import CONFIG_DTYPE_NAMES, MAX_DRAFT_LAYERS, TensorSpec
from dspark_convert.contract.tensor_table import ASSISTANT_TENSOR_RULES, eval_dim, pretty_dim
from dspark_convert.contract.gemma4 import ACTIVATION, Gemma4RopeEntry, full_rope
from dspark_convert.contract.qwen3 import ConfigErrors
from dspark_convert.errors import AssistantConfigError
from dspark_convert.util.models import validated
from dspark_convert.util.strict_json import read_json_strict

ARCHITECTURE = "Gemma4UnifiedAssistantForCausalLM"
MODEL_TYPE = "gemma4_unified_assistant"
TEXT_MODEL_TYPE = "gemma4_unified_text"
SLIDING, FULL = "sliding_attention", "full_attention"
CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"
# GenerationConfig's default when generation_config.json does not say (transformers 5.19,
# generation/configuration_utils.py:642); more than MAX_ASSISTANT_TOKENS drafts per cycle
# is refused (bounded work per cycle).
DEFAULT_ASSISTANT_TOKENS = 20
MAX_ASSISTANT_TOKENS = 256
_INDEX = re.compile(r"0|[1-9][0-9]{0,8}")
_ERRORS = ConfigErrors(malformed=AssistantConfigError, unsupported=AssistantConfigError,
                       limit=AssistantConfigError)


class _Strict(BaseModel):
    # Unknown fields are kept but never read (a config carries many); known ones strict.
    model_config = ConfigDict(strict=True, extra="allow", frozen=True)


class LayerOverride(BaseModel):
    """One entry of ``per_layer_config``: only these two keys change an attention layer."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    head_dim: int | None = None
    num_key_value_heads: int | None = None


class AssistantTextConfig(_Strict):
    """``text_config``: the fields the assistant's decoder computes with (required), and
    those that must keep the dense, KV-shared layout (optional, refused when set)."""

    model_type: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    head_dim: int
    num_key_value_heads: int
    layer_types: list[str]
    rope_parameters: dict
    rms_norm_eps: float
    vocab_size: int
    num_kv_shared_layers: int
    hidden_activation: str
    sliding_window: int | None = None
    per_layer_config: dict[str, LayerOverride] | None = None
    global_head_dim: int | None = None
    num_global_key_value_heads: int | None = None
    attention_k_eq_v: bool = False
    attention_bias: bool = False
    enable_moe_block: bool = False
    hidden_size_per_layer_input: int = 0
    use_double_wide_mlp: bool = False
    use_bidirectional_attention: str | None = None
    final_logit_softcapping: float | None = None     # recorded, never applied


class Gemma4UnifiedAssistantConfig(_Strict):
    """config.json of a Gemma4UnifiedAssistantForCausalLM checkpoint."""

    architectures: list[str]
    model_type: str
    backbone_hidden_size: int
    text_config: AssistantTextConfig
    use_ordered_embeddings: bool = False
    num_centroids: int = 2048
    centroid_intermediate_top_k: int = 32
    tie_word_embeddings: bool = True


@dataclass(frozen=True)
class AssistantLayer:
    """One decoder layer: the KV it reads (``kind``), its geometry, its RoPE (``rotated_pairs``
    None: every pair rotates, the default RoPE)."""

    kind: str
    head_dim: int
    kv_heads: int
    rope_theta: float
    rotated_pairs: int | None


@dataclass(frozen=True)
class AssistantSpec:
    """What the runtime computes with, resolved once from config.json (and
    generation_config.json's drafts per cycle)."""

    config: Gemma4UnifiedAssistantConfig
    layers: tuple[AssistantLayer, ...]
    num_assistant_tokens: int

    @property
    def text(self) -> AssistantTextConfig:
        return self.config.text_config

    @property
    def backbone_hidden_size(self) -> int:
        return self.config.backbone_hidden_size

    def kinds(self) -> set[str]:
        return {layer.kind for layer in self.layers}


def _refuse(path: str, field: str, expected, found, why: str = "") -> AssistantConfigError:
    tail = f" ({why})" if why else ""
    return AssistantConfigError(f"{path}: field '{field}': expected {expected}, found "
                                f"{found!r}{tail}", path=path, field=field,
                                expected=expected, found=found)


def _check_top(cfg: Gemma4UnifiedAssistantConfig, path: str) -> None:
    if cfg.architectures != [ARCHITECTURE]:
        raise _refuse(path, "architectures", [ARCHITECTURE], cfg.architectures)
    if cfg.model_type != MODEL_TYPE:
        raise _refuse(path, "model_type", MODEL_TYPE, cfg.model_type)
    if cfg.text_config.model_type != TEXT_MODEL_TYPE:
        raise _refuse(path, "text_config.model_type", TEXT_MODEL_TYPE,
                      cfg.text_config.model_type)
    if cfg.use_ordered_embeddings:
        raise _refuse(path, "use_ordered_embeddings", False, True,
                      "the centroid-masked head is not computed by this runtime")
    if not cfg.tie_word_embeddings:
        raise _refuse(path, "tie_word_embeddings", True, False,
                      "the head is model.embed_tokens.weight")


def _check_dense_shared(t: AssistantTextConfig, path: str) -> None:
    """The layout transformers' assistant has: every layer KV-shared, dense, bias-free."""
    n = t.num_hidden_layers
    if not 0 < n <= MAX_DRAFT_LAYERS:
        raise _refuse(path, "text_config.num_hidden_layers", f"1..{MAX_DRAFT_LAYERS}", n)
    if t.num_kv_shared_layers != n:
        raise _refuse(path, "text_config.num_kv_shared_layers", n, t.num_kv_shared_layers,
                      "every assistant layer reads the target's KV; none has k/v projections")
    for field, off in (("enable_moe_block", False), ("attention_bias", False),
                       ("use_double_wide_mlp", False), ("hidden_size_per_layer_input", 0)):
        if getattr(t, field) != off:
            raise _refuse(path, f"text_config.{field}", off, getattr(t, field),
                          "not part of the assistant's dense decoder")
    if t.hidden_activation != ACTIVATION:
        raise _refuse(path, "text_config.hidden_activation", ACTIVATION, t.hidden_activation)
    if t.use_bidirectional_attention not in (None, "vision"):
        raise _refuse(path, "text_config.use_bidirectional_attention", "null or 'vision'",
                      t.use_bidirectional_attention)


def _check_counts(cfg: Gemma4UnifiedAssistantConfig, path: str) -> None:
    t = cfg.text_config
    for field, value in (("backbone_hidden_size", cfg.backbone_hidden_size),
                         ("text_config.hidden_size", t.hidden_size),
                         ("text_config.intermediate_size", t.intermediate_size),
                         ("text_config.num_attention_heads", t.num_attention_heads),
                         ("text_config.vocab_size", t.vocab_size)):
        if value <= 0:
            raise _refuse(path, field, "> 0", value)
    if not (math.isfinite(t.rms_norm_eps) and t.rms_norm_eps > 0):
        raise _refuse(path, "text_config.rms_norm_eps", "> 0", t.rms_norm_eps)
    if len(t.layer_types) != t.num_hidden_layers or set(t.layer_types) - {SLIDING, FULL}:
        raise _refuse(path, "text_config.layer_types",
                      f"{t.num_hidden_layers} x sliding_attention|full_attention", t.layer_types)
    if SLIDING in t.layer_types and not (t.sliding_window and t.sliding_window > 0):
        raise _refuse(path, "text_config.sliding_window", "> 0", t.sliding_window,
                      "sliding layers need a window")


def _overrides(t: AssistantTextConfig, path: str) -> dict[int, LayerOverride]:
    """Each layer's geometry override: per_layer_config (5.19), else the older files'
    global_head_dim / num_global_key_value_heads on full layers."""
    if t.per_layer_config is not None:
        out = {}
        for key, override in t.per_layer_config.items():
            if not _INDEX.fullmatch(key) or int(key) >= t.num_hidden_layers:
                raise _refuse(path, "text_config.per_layer_config", "layer indices "
                              f"0..{t.num_hidden_layers - 1} as keys", key)
            out[int(key)] = override
        return out
    if FULL in t.layer_types and t.global_head_dim is None:
        raise _refuse(path, "text_config.global_head_dim", "an integer (no per_layer_config)",
                      None, "the full layers' head_dim")
    kv = t.num_global_key_value_heads if t.attention_k_eq_v else None
    full = LayerOverride(head_dim=t.global_head_dim, num_key_value_heads=kv)
    return {i: full for i, kind in enumerate(t.layer_types) if kind == FULL}


def _sliding_theta(t: AssistantTextConfig, path: str) -> float:
    field = "text_config.rope_parameters.sliding_attention"
    entry = t.rope_parameters.get(SLIDING)
    theta = entry.get("rope_theta") if isinstance(entry, dict) else None
    if not (isinstance(entry, dict) and entry.get("rope_type") == "default"
            and set(entry) <= {"rope_type", "rope_theta"}
            and isinstance(theta, (int, float)) and not isinstance(theta, bool)
            and math.isfinite(theta) and theta > 0):
        raise _refuse(path, field, "{rope_type: default, rope_theta > 0}", entry,
                      "the sliding layers' RoPE")
    return float(theta)


def _layers(t: AssistantTextConfig, path: str) -> tuple[AssistantLayer, ...]:
    overrides = _overrides(t, path)
    sliding_theta = _sliding_theta(t, path) if SLIDING in t.layer_types else 0.0
    layers = []
    for i, kind in enumerate(t.layer_types):
        override = overrides.get(i, LayerOverride())
        d = override.head_dim if override.head_dim is not None else t.head_dim
        kv = (override.num_key_value_heads if override.num_key_value_heads is not None
              else t.num_key_value_heads)
        where = f"text_config.per_layer_config.{i}" if i in overrides else "text_config"
        if d <= 0 or d % 2:
            raise _refuse(path, f"{where}.head_dim", "a positive even number", d,
                          f"layer {i}: RoPE rotates pairs")
        if kv <= 0 or t.num_attention_heads % kv:
            raise _refuse(path, f"{where}.num_key_value_heads",
                          f"a divisor of {t.num_attention_heads}", kv, f"layer {i}'s KV heads")
        if kind == FULL:
            field = "text_config.rope_parameters.full_attention"
            entry = t.rope_parameters.get(FULL)
            if isinstance(entry, dict):
                # Typed here first: full_rope's own check would name the DSpark family.
                validated(Gemma4RopeEntry, entry, error=AssistantConfigError,
                          label=f"{path}: {field}", path=path)
            rope = full_rope(t.rope_parameters, d, path=path, field=field, errors=_ERRORS)
            theta, pairs = rope.theta, rope.rotated_pairs
        else:
            theta, pairs = sliding_theta, None
        layers.append(AssistantLayer(kind=kind, head_dim=d, kv_heads=kv, rope_theta=theta,
                                     rotated_pairs=pairs))
    return tuple(layers)


def assistant_spec(raw: object, *, path: str = CONFIG,
                   num_assistant_tokens: int = DEFAULT_ASSISTANT_TOKENS) -> AssistantSpec:
    """config.json's parsed JSON as the runtime computes with it; AssistantConfigError
    (152) names the first field that is not."""
    if not isinstance(raw, dict):
        raise AssistantConfigError(f"{path}: expected a JSON object, found "
                                   f"{type(raw).__name__}", path=path, expected="object",
                                   found=type(raw).__name__)
    cfg = validated(Gemma4UnifiedAssistantConfig, raw, error=AssistantConfigError, label=path,
                    path=path)
    _check_top(cfg, path)
    _check_dense_shared(cfg.text_config, path)
    _check_counts(cfg, path)
    layers = _layers(cfg.text_config, path)
    return AssistantSpec(config=cfg, layers=layers, num_assistant_tokens=num_assistant_tokens)


def assistant_tokens(raw: object, *, path: str = GENERATION_CONFIG) -> int:
    """generation_config.json's ``num_assistant_tokens`` (drafts per cycle), or
    transformers' default when it does not say."""
    if not isinstance(raw, dict):
        raise AssistantConfigError(f"{path}: expected a JSON object, found "
                                   f"{type(raw).__name__}", path=path, expected="object",
                                   found=type(raw).__name__)
    value = raw.get("num_assistant_tokens")
    if value is None:
        return DEFAULT_ASSISTANT_TOKENS
    if isinstance(value, bool) or not isinstance(value, int) \
            or not 0 < value <= MAX_ASSISTANT_TOKENS:
        raise _refuse(path, "num_assistant_tokens", f"an integer in 1..{MAX_ASSISTANT_TOKENS}",
                      value)
    return value


def read_assistant_spec(directory: Path) -> AssistantSpec:
    """``directory``'s config.json and, when present, generation_config.json."""
    path = directory / CONFIG
    if not path.is_file():
        raise AssistantConfigError(f"{path}: not found; expected the assistant's config.json",
                                   path=str(path), expected=CONFIG, found="nothing")
    raw = read_json_strict(path, error=AssistantConfigError, label=str(path))
    gen_path = directory / GENERATION_CONFIG
    tokens = DEFAULT_ASSISTANT_TOKENS
    if gen_path.is_file():
        tokens = assistant_tokens(read_json_strict(gen_path, error=AssistantConfigError,
                                                   label=str(gen_path)), path=str(gen_path))
    return assistant_spec(raw, path=str(path), num_assistant_tokens=tokens)


def tensor_shapes(spec: AssistantSpec) -> dict[str, tuple[int, ...]]:
    """Every tensor the assistant's forward reads, with its torch shape: the checkpoint
    holds exactly these (lm_head is tied to model.embed_tokens.weight and not saved)."""
    t = spec.text
    h, I, V, nh, Hb = (t.hidden_size, t.intermediate_size, t.vocab_size,
                       t.num_attention_heads, spec.backbone_hidden_size)
    shapes = {"model.embed_tokens.weight": (V, h), "model.norm.weight": (h,),
              "pre_projection.weight": (h, 2 * Hb), "post_projection.weight": (Hb, h)}
    for i, layer in enumerate(spec.layers):
        p, d = f"model.layers.{i}.", layer.head_dim
        shapes.update({
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "pre_feedforward_layernorm.weight": (h,),
            p + "post_feedforward_layernorm.weight": (h,), p + "layer_scalar": (1,),
            p + "self_attn.q_proj.weight": (nh * d, h), p + "self_attn.q_norm.weight": (d,),
            p + "self_attn.o_proj.weight": (h, nh * d),
            p + "mlp.gate_proj.weight": (I, h), p + "mlp.up_proj.weight": (I, h),
            p + "mlp.down_proj.weight": (h, I)})
    return shapes


# --- the artifact's contract --------------------------------------------------------------
# What a Gemma 4 assistant artifact holds (docs/ARTIFACT_FORMAT.md, "The Gemma 4
# assistant"): every field the forward reads, resolved per layer, the drafts per cycle
# generation_config.json names, and the tensor table
# (contract/tensor_table.ASSISTANT_TENSOR_RULES). Rebuilt from drafter.gguf's metadata alone
# by validate (artifact/format.py's view of the metadata as this config.json).

FAMILY = "gemma4-assistant"
# transformers 5.19's other assistant class (configuration_gemma4_assistant.py, text_config
# gemma4_text): the same model code, but this reader and the runtime's target are
# gemma4_unified's; refused by name (14) rather than read as the unified one.
OTHER_ARCHITECTURES = {
    "Gemma4AssistantForCausalLM":
        "a gemma4_assistant (text_config gemma4_text, for gemma4 targets such as "
        "gemma-4-E2B-it); the contract and the reference runtime read the gemma4_unified "
        "assistant only (Gemma4UnifiedAssistantForCausalLM)"}


class _Contract(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class AssistantLayerRecord(_Contract):
    kind: Literal["sliding_attention", "full_attention"]   # the target KV it reads
    head_dim: int
    kv_heads: int
    rope_theta: float
    rotated_pairs: int           # RoPE pairs that rotate (head_dim / 2: every one)


class AssistantGeometry(_Contract):
    hidden_size: int                     # the assistant's own (h)
    backbone_hidden_size: int            # the target's (Hb): pre_projection reads 2·Hb
    intermediate_size: int
    num_draft_layers: int
    num_attention_heads: int
    vocab_size: int
    rms_norm_eps: float


class AssistantRope(_Contract):
    full_type: Literal["proportional", "default"] | None   # None: no full layer
    full_partial_rotary_factor: float | None


class AssistantContract(_Contract):
    family: Literal["gemma4-assistant"]
    architecture: Literal["Gemma4UnifiedAssistantForCausalLM"]
    geometry: AssistantGeometry
    layers: list[AssistantLayerRecord]
    sliding_window: int | None
    rope: AssistantRope
    activation: Literal["gelu_pytorch_tanh"]
    final_logit_softcapping: float | None    # recorded, never applied (no softcap)
    num_assistant_tokens: int                # drafts per cycle (generation_config.json)
    tensors: list[TensorSpec]

    def tensor(self, source_name: str) -> TensorSpec | None:
        return next((t for t in self.tensors if t.source_name == source_name), None)

    @property
    def written_tensors(self) -> list[TensorSpec]:
        return [t for t in self.tensors if t.gguf_name is not None]

    def layer_types(self) -> list[str]:
        return [layer.kind for layer in self.layers]

    def headline(self) -> str:
        g = self.geometry
        return (f"{self.architecture}: {g.num_draft_layers} KV-shared layers "
                f"({', '.join(self.layer_types())}), h={g.hidden_size}, backbone "
                f"{g.backbone_hidden_size}, {self.num_assistant_tokens} drafts per cycle")

    def summary(self) -> list[tuple[str, str]]:
        g = self.geometry
        per_kind = {layer.kind: layer for layer in self.layers}
        kinds = "; ".join(f"{k}: {v.kv_heads} KV heads x {v.head_dim}, theta {v.rope_theta:g}, "
                          f"{v.rotated_pairs} of {v.head_dim // 2} pairs rotate"
                          for k, v in per_kind.items())
        softcap = ("none" if self.final_logit_softcapping is None
                   else f"{self.final_logit_softcapping:g} (recorded, not applied)")
        return [("geometry", f"h={g.hidden_size} Hb={g.backbone_hidden_size} "
                             f"I={g.intermediate_size} layers={g.num_draft_layers} "
                             f"heads={g.num_attention_heads} V={g.vocab_size} "
                             f"eps={g.rms_norm_eps:g}"),
                ("attention", f"every layer reads the target's KV of its type (no k/v "
                              f"projections), scale 1.0; {kinds}"
                              + ("" if self.sliding_window is None
                                 else f"; sliding window {self.sliding_window}")),
                ("blocks", f"{self.activation}, 4 norms and a layer scalar per layer; "
                           f"logits: the tied head, softcap {softcap}"),
                ("cycle", f"{self.num_assistant_tokens} drafts per cycle, every step at the "
                          "anchor's position")]


def _expand(spec: AssistantSpec) -> list[TensorSpec]:
    """The tensor table for this assistant: per-layer rules with the layer's head dim."""
    t = spec.text
    base = {"H": t.hidden_size, "I": t.intermediate_size, "V": t.vocab_size,
            "nh": t.num_attention_heads, "Hb": spec.backbone_hidden_size}
    out = []

    def add(rule, source: str, gguf: str, values: dict) -> None:
        shape = [eval_dim(e, values) for e in rule.shape]
        out.append(TensorSpec(source_name=source, gguf_name=gguf, shape=shape,
                              gguf_shape=shape[::-1],
                              shape_expr=[pretty_dim(e) for e in rule.shape], kind=rule.kind,
                              required=True))

    for rule in ASSISTANT_TENSOR_RULES:
        if not rule.per_layer:
            add(rule, rule.source, rule.gguf, base)
    for i, layer in enumerate(spec.layers):
        for rule in ASSISTANT_TENSOR_RULES:
            if rule.per_layer:
                add(rule, rule.source.format(i=i), rule.gguf.format(i=i),
                    {**base, "dl": layer.head_dim})
    return out


def _check_one_geometry_per_kind(spec: AssistantSpec, path: str) -> None:
    """Layers of one type read the same target layer's KV, so they have its one geometry:
    a second geometry for a type is refused (152)."""
    seen: dict[str, tuple[int, AssistantLayer]] = {}
    for i, layer in enumerate(spec.layers):
        first = seen.setdefault(layer.kind, (i, layer))
        j, other = first
        if (layer.head_dim, layer.kv_heads, layer.rope_theta, layer.rotated_pairs) != \
                (other.head_dim, other.kv_heads, other.rope_theta, other.rotated_pairs):
            raise _refuse(path, f"text_config.per_layer_config.{i}",
                          f"layer {j}'s geometry (head_dim {other.head_dim}, "
                          f"{other.kv_heads} KV heads)",
                          f"head_dim {layer.head_dim}, {layer.kv_heads} KV heads",
                          f"layers of one type ({layer.kind}) read the same target KV")


def build_contract(spec: AssistantSpec, *, path: str = CONFIG) -> AssistantContract:
    """The artifact's contract of a checked assistant (assistant_spec)."""
    _check_one_geometry_per_kind(spec, path)
    t = spec.text
    full = t.rope_parameters.get(FULL) if FULL in t.layer_types else None
    full_type = full.get("rope_type") if isinstance(full, dict) else None
    factor = None
    if full_type is not None:
        factor = float(full.get("partial_rotary_factor", 1.0)) if full_type != "default" else 1.0
    layers = [AssistantLayerRecord(kind=layer.kind, head_dim=layer.head_dim,
                                   kv_heads=layer.kv_heads, rope_theta=layer.rope_theta,
                                   rotated_pairs=(layer.rotated_pairs
                                                  if layer.rotated_pairs is not None
                                                  else layer.head_dim // 2))
              for layer in spec.layers]
    return AssistantContract(
        family=FAMILY, architecture=ARCHITECTURE,
        geometry=AssistantGeometry(
            hidden_size=t.hidden_size, backbone_hidden_size=spec.backbone_hidden_size,
            intermediate_size=t.intermediate_size, num_draft_layers=t.num_hidden_layers,
            num_attention_heads=t.num_attention_heads, vocab_size=t.vocab_size,
            rms_norm_eps=t.rms_norm_eps),
        layers=layers,
        sliding_window=t.sliding_window if SLIDING in t.layer_types else None,
        rope=AssistantRope(full_type=full_type, full_partial_rotary_factor=factor),
        activation=ACTIVATION, final_logit_softcapping=t.final_logit_softcapping,
        num_assistant_tokens=spec.num_assistant_tokens, tensors=_expand(spec))


def parse_config(raw: object, *, path: str = CONFIG, companion: object = None,
                 companion_path: str = GENERATION_CONFIG) -> AssistantSpec:
    """config.json (and generation_config.json's drafts per cycle, ``companion``, when the
    checkpoint has one) as the runtime computes with it."""
    tokens = (DEFAULT_ASSISTANT_TOKENS if companion is None
              else assistant_tokens(companion, path=companion_path))
    return assistant_spec(raw, path=path, num_assistant_tokens=tokens)


def config_dtype(spec: AssistantSpec, *, path: str) -> str | None:
    """The tensor dtype config.json declares (its top-level ``dtype``), if any."""
    name = getattr(spec.config, "dtype", None) or getattr(spec.config, "torch_dtype", None)
    if name is None:
        return None
    if name not in CONFIG_DTYPE_NAMES:
        raise _refuse(path, "dtype", f"one of {', '.join(CONFIG_DTYPE_NAMES)}", name)
    return CONFIG_DTYPE_NAMES[name]
