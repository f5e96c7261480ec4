"""The Gemma4 family's contract: the one reader of a ``Gemma4DSparkModel`` config.json.

DeepSpec builds a Gemma4 drafter's config from the target's ``text_config`` plus the DSpark
fields (deepspec/modeling/dspark/gemma4/config.py), in two forms: the trainer writes the
target's text model_type (``gemma4_unified_text``), and a ``from_pretrained`` +
``save_pretrained`` round trip (the released 12B drafter) writes ``gemma4_text`` with four
Gemma4TextConfig defaults more. The family is chosen by ``architectures``
(contract/families.py), never by model_type: both forms read the same.

What the drafter uses differs from Qwen3's (the facts, with DeepSpec's lines:
docs/REFERENCE.md §10): its attention has the target's *global* geometry
(``global_head_dim``; ``num_global_key_value_heads`` under ``attention_k_eq_v``, else
``num_key_value_heads``), no v_proj under k_eq_v, attention scale 1.0, proportional partial
RoPE from ``rope_parameters["full_attention"]``, GELU-tanh, four norms and a layer scalar per
layer, a scaled embedding and a final logit softcap. The fields it inherits from the target
but never uses (``head_dim``, the sliding geometry and RoPE, the target's layer types, ...)
are recorded in the contract, never used.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, JsonValue

from dspark_convert.contract.dspark import (
    DRAFTER_ERRORS,
    MAX_BLOCK_SIZE,
    MAX_DRAFT_LAYERS,
    BlockLayout,
    ConfidenceHead,
    ContractTensors,
    FeatureTaps,
    MarkovHead,
    MarkovHeadType,
    TensorSpec,
    _check_heads,
    _check_mask_token,
    _check_taps,
    _positive,
    check_block_layout,
    contract_with_tensors,
)
from dspark_convert.contract.qwen3 import ConfigErrors, check_positive_eps
from dspark_convert.contract.tensor_table import GEMMA4_TENSOR_RULES
from dspark_convert.errors import (
    ConfigError,
    FinalLayerTapError,
    GeometryLimitError,
    KEqVMismatchError,
    MoEBlockError,
    PerLayerInputError,
    RopeTypeError,
    UnsupportedArchitectureError,
    UnsupportedFeatureError,
)
from dspark_convert.util.models import validated

FAMILY = "gemma4-dspark"
ARCHITECTURE = "Gemma4DSparkModel"
# The drafter's MLP (transformers' Gemma4TextMLP): down(act(gate(x)) * up(x)).
ACTIVATION = "gelu_pytorch_tanh"
# RoPE types the full-attention rotary can be here (transformers' ROPE_INIT_FUNCTIONS):
# 'proportional' (what every Gemma4 config says) and 'default' (no partial factor).
ROPE_TYPES = ("proportional", "default")
# model_type values DeepSpec writes for the two config forms, and the target's: its
# builder asserts the target is gemma4 or gemma4_unified (gemma4/config.py L10-13).
CONFIG_MODEL_TYPES = ("gemma4_text", "gemma4_unified_text")
TARGET_MODEL_TYPES = ("gemma4", "gemma4_unified")
TARGET_TEXT_MODEL_TYPES = ("gemma4_text", "gemma4_unified_text")
_HINT = f" (a {ARCHITECTURE} config.json: the {FAMILY} family)"


class _Strict(BaseModel):
    # As contract/qwen3.py: unknown fields kept (copied verbatim) but never read; known
    # fields strictly typed.
    model_config = ConfigDict(strict=True, extra="allow", frozen=True)


class _Contract(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class Gemma4RopeEntry(_Strict):
    rope_type: str
    rope_theta: float
    partial_rotary_factor: float | None = None
    factor: float | None = None         # transformers' scaling factor: only 1 is supported


class Gemma4DSparkConfig(_Strict):
    """config.json of a Gemma4DSparkModel checkpoint: the fields DeepSpec's
    ``build_draft_config`` requires of the target's text_config (all required here, as it
    always writes them) plus the DSpark fields, as contract/dspark.DSparkConfig has them."""

    architectures: list[str]
    model_type: str
    target_model_type: str
    target_text_model_type: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    # The target's sliding geometry: unused (recorded); num_key_value_heads is used only
    # without attention_k_eq_v, where it is then required.
    head_dim: int | None = None
    global_head_dim: int
    num_key_value_heads: int | None = None
    num_global_key_value_heads: int | None
    attention_k_eq_v: bool
    attention_bias: bool
    hidden_activation: str
    vocab_size: int
    rms_norm_eps: float
    rope_parameters: dict
    final_logit_softcapping: float | None
    enable_moe_block: bool
    hidden_size_per_layer_input: int
    num_kv_shared_layers: int
    use_double_wide_mlp: bool
    layer_types: list[str]
    max_position_embeddings: int | None = None      # rotary cache length only: recorded
    tie_word_embeddings: bool = False
    dtype: str | None = None
    torch_dtype: str | None = None
    # DSpark fields, as Qwen3's (DeepSpec writes them the same way for both families).
    num_target_layers: int
    target_layer_ids: list[int]
    block_size: int
    mask_token_id: int
    markov_rank: int
    enable_confidence_head: bool
    markov_head_type: MarkovHeadType | None = None
    confidence_head_with_markov: bool | None = None


class Gemma4Geometry(_Contract):
    """The geometry the drafter computes with: ``head_dim`` is the target's
    global_head_dim, ``num_key_value_heads`` its global KV heads under k_eq_v."""

    hidden_size: int
    intermediate_size: int
    num_draft_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    key_value_heads_from: Literal["num_global_key_value_heads", "num_key_value_heads"]


class Gemma4Rope(_Contract):
    """rope_parameters["full_attention"], over head_dim = global_head_dim: the first
    ``rotated_pairs`` frequencies theta^(-2i/head_dim) rotate, pairs (i, i + head_dim/2)
    (rotate_half); the other dims pass unchanged."""

    type: Literal["proportional", "default"]
    theta: float
    partial_rotary_factor: float
    head_dim: int
    rotated_pairs: int


class Gemma4Attention(_Contract):
    causal: Literal[False]
    bias: Literal[False]
    k_eq_v: bool                      # V = unweighted RMS norm of k_proj(x), no v_proj
    scale: float                      # 1.0: q and k are RMS-normed per head
    sliding_window: Literal[False]    # every draft layer is full attention


class Gemma4Blocks(_Contract):
    activation: Literal["gelu_pytorch_tanh"]
    norms_per_layer: Literal[4]       # input, post-attention, pre- and post-feedforward
    norm_multiplies_by: Literal["weight"]   # Gemma4: x * weight, not x * (1 + weight)
    layer_scalar: Literal[True]       # h = h * layer_scalar after each layer
    embedding_scale: Literal["sqrt(hidden_size)"]
    final_logit_softcapping: float | None   # applied before the Markov bias


class Gemma4ConfigForm(_Contract):
    model_type: str
    target_model_type: str | None
    target_text_model_type: str | None


class Gemma4Contract(ContractTensors, _Contract):
    family: Literal["gemma4-dspark"]
    architecture: Literal["Gemma4DSparkModel"]
    geometry: Gemma4Geometry
    rope: Gemma4Rope
    attention: Gemma4Attention
    blocks: Gemma4Blocks
    config_form: Gemma4ConfigForm
    taps: FeatureTaps
    block: BlockLayout
    markov_head: MarkovHead
    confidence_head: ConfidenceHead
    # Fields the drafter inherits from the target but never uses, as config.json has them.
    inherited_unused: dict[str, JsonValue]
    tensors: list[TensorSpec]

    def summary(self) -> list[tuple[str, str]]:
        """(label, text) lines that say this family's geometry and attention (inspect)."""
        g, r, a, b = self.geometry, self.rope, self.attention, self.blocks
        softcap = "none" if b.final_logit_softcapping is None else f"{b.final_logit_softcapping:g}"
        unused = ", ".join(f"{k}={v}" for k, v in self.inherited_unused.items())
        return [
            ("geometry", f"H={g.hidden_size} I={g.intermediate_size} layers={g.num_draft_layers} "
                         f"heads={g.num_attention_heads}/{g.num_key_value_heads}x{g.head_dim} "
                         f"(global_head_dim; KV heads from {g.key_value_heads_from}) "
                         f"V={g.vocab_size} eps={g.rms_norm_eps:g}"),
            ("rope", f"{r.type} over {r.head_dim} dims, theta={r.theta:g}, factor "
                     f"{r.partial_rotary_factor:g}: {r.rotated_pairs} of {r.head_dim // 2} pairs rotate"),
            ("attention", "non-causal, no bias, scale 1.0, " +
                          ("k_eq_v (no v_proj; V = RMS norm of k_proj)" if a.k_eq_v else "v_proj")),
            ("blocks", f"{b.activation}, 4 norms (x*weight) and a layer scalar per layer, "
                       f"embedding x sqrt(H), softcap {softcap} before the Markov bias"),
            ("config form", f"model_type {self.config_form.model_type}, target "
                            f"{self.config_form.target_model_type}"),
            # An artifact's contract (rebuilt from the GGUF) has none: the manifest keeps them.
            ("not used", unused or "- (recorded in the checkpoint's config.json and the "
                                   "manifest, not in the GGUF)"),
        ]

    def conditions(self) -> dict[str, bool]:
        # v_proj exists only where K and V are not one projection (attention_k_eq_v).
        return {**super().conditions(), "v_proj": not self.attention.k_eq_v}


# --- parsing ------------------------------------------------------------------------------

def parse_config(data: object, *, path: str = "config.json") -> Gemma4DSparkConfig:
    """Validate the parsed JSON; ConfigError (13) names the first bad field and the family."""
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object, found {type(data).__name__}",
                          path=path, expected="object", found=type(data).__name__)
    return validated(Gemma4DSparkConfig, data, error=ConfigError, label=path, path=path,
                     hint=_HINT)


# --- semantic rules -----------------------------------------------------------------------

def _refuse_unsupported_blocks(cfg: Gemma4DSparkConfig, path: str) -> None:
    """What DeepSpec's Gemma4 drafter asserts (modeling.py L175-180) and the dense block
    the format describes: no MoE, no per-layer inputs, no bias, GELU-tanh, full attention."""
    if cfg.enable_moe_block:
        raise MoEBlockError(f"{path}: field 'enable_moe_block': expected false, found true "
                            "(a Gemma4 DSpark drafter has dense MLPs only)", path=path,
                            field="enable_moe_block", expected=False, found=True)
    if cfg.hidden_size_per_layer_input != 0:
        raise PerLayerInputError(
            f"{path}: field 'hidden_size_per_layer_input': expected 0, found "
            f"{cfg.hidden_size_per_layer_input} (per-layer input embeddings are not part of a "
            "Gemma4 DSpark drafter)", path=path, field="hidden_size_per_layer_input",
            expected=0, found=cfg.hidden_size_per_layer_input)
    if cfg.attention_bias:
        raise UnsupportedFeatureError(f"{path}: field 'attention_bias': expected false, found "
                                      "true (q/k/v/o biases are not supported)", path=path,
                                      field="attention_bias", expected=False, found=True)
    if cfg.hidden_activation != ACTIVATION:
        raise UnsupportedFeatureError(
            f"{path}: field 'hidden_activation': expected {ACTIVATION!r}, found "
            f"{cfg.hidden_activation!r}", path=path, field="hidden_activation",
            expected=ACTIVATION, found=cfg.hidden_activation)
    if cfg.use_double_wide_mlp and cfg.num_kv_shared_layers > 0:
        # Gemma4TextMLP doubles the width of the last num_kv_shared_layers layers.
        raise UnsupportedFeatureError(
            f"{path}: field 'use_double_wide_mlp': expected false with num_kv_shared_layers "
            f"{cfg.num_kv_shared_layers}, found true (double-wide MLPs are not supported)",
            path=path, field="use_double_wide_mlp", expected=False, found=True)
    others = sorted({t for t in cfg.layer_types if t != "full_attention"})
    if len(cfg.layer_types) != cfg.num_hidden_layers or others:
        raise UnsupportedFeatureError(
            f"{path}: field 'layer_types': expected {cfg.num_hidden_layers} x 'full_attention' "
            f"(DeepSpec's drafter has no sliding layers), found {cfg.layer_types}", path=path,
            field="layer_types", expected="full_attention per draft layer", found=cfg.layer_types)


def _global_kv_heads(cfg: Gemma4DSparkConfig, path: str) -> tuple[int, str]:
    """The KV heads of the drafter's attention: the target's global ones under k_eq_v."""
    if not cfg.attention_k_eq_v:
        if cfg.num_key_value_heads is None:
            raise ConfigError(f"{path}: required field 'num_key_value_heads' is missing "
                              "(attention_k_eq_v is false)" + _HINT, path=path,
                              field="num_key_value_heads", expected="> 0", found="nothing")
        return cfg.num_key_value_heads, "num_key_value_heads"
    if cfg.num_global_key_value_heads is None:
        raise ConfigError(f"{path}: field 'num_global_key_value_heads': expected a positive "
                          "integer with attention_k_eq_v true, found null", path=path,
                          field="num_global_key_value_heads", expected="> 0", found=None)
    return cfg.num_global_key_value_heads, "num_global_key_value_heads"


# What full_rope raises for the drafter's own config.json: a missing entry or another RoPE
# type (28), a malformed entry (13), a value out of range (12).
ROPE_ERRORS = ConfigErrors(malformed=ConfigError, unsupported=RopeTypeError,
                           limit=GeometryLimitError)


def full_rope(rope_parameters: dict, head_dim: int, *, path: str,
              field: str = "rope_parameters.full_attention",
              errors: ConfigErrors = ROPE_ERRORS) -> Gemma4Rope:
    """``rope_parameters["full_attention"]`` over ``head_dim`` (global_head_dim): the one
    reader of that entry, for the drafter's config (``errors``: ROPE_ERRORS), the target's
    text_config (target/gemma4.py) and the runtime (runtime/gemma4.py), each with its own
    error classes and ``field`` prefix. The top-level rope_type/rope_theta DeepSpec's saved
    config carries (null theta) are never read. transformers' proportional RoPE
    (_compute_proportional_rope_parameters) rotates ``int(factor * head_dim // 2)`` pairs
    and divides every frequency by ``factor`` (a scaling factor, not the partial one): only
    1 is computed here, another is refused."""
    raw = rope_parameters.get("full_attention")
    if not isinstance(raw, dict):
        raise errors.unsupported(f"{path}: field '{field}': expected an object with rope_type "
                                 f"'proportional', found {raw!r}", path=path, field=field,
                                 expected="an object", found=str(raw))
    entry = validated(Gemma4RopeEntry, raw, error=errors.malformed, label=f"{path}: {field}",
                      path=path, hint=_HINT)
    if entry.rope_type not in ROPE_TYPES:
        raise errors.unsupported(f"{path}: field '{field}.rope_type': expected one of "
                                 f"{', '.join(ROPE_TYPES)}, found {entry.rope_type!r}",
                                 path=path, field=f"{field}.rope_type",
                                 expected=list(ROPE_TYPES), found=entry.rope_type)
    if not (math.isfinite(entry.rope_theta) and entry.rope_theta > 0):
        raise errors.limit(f"{path}: field '{field}.rope_theta': expected a positive finite "
                           f"number, found {entry.rope_theta}", path=path,
                           field=f"{field}.rope_theta", expected="> 0", found=entry.rope_theta)
    if entry.factor not in (None, 1.0):
        raise errors.unsupported(f"{path}: field '{field}.factor': expected 1 or none (a "
                                 f"scaled RoPE is not supported), found {entry.factor}",
                                 path=path, field=f"{field}.factor", expected=1.0,
                                 found=entry.factor)
    factor = entry.partial_rotary_factor
    if entry.rope_type == "default" and factor is not None:
        raise errors.unsupported(f"{path}: field '{field}.partial_rotary_factor': expected none "
                                 f"with rope_type 'default', found {factor}", path=path,
                                 field=f"{field}.partial_rotary_factor", expected=None,
                                 found=factor)
    factor = 1.0 if factor is None else factor
    if not (math.isfinite(factor) and 0 < factor <= 1):
        raise errors.limit(f"{path}: field '{field}.partial_rotary_factor': expected a number "
                           f"in (0, 1], found {factor}", path=path,
                           field=f"{field}.partial_rotary_factor", expected="(0, 1]",
                           found=factor)
    return Gemma4Rope(type=entry.rope_type, theta=float(entry.rope_theta),
                      partial_rotary_factor=float(factor), head_dim=head_dim,
                      rotated_pairs=int(factor * head_dim // 2))


def _check_final_tap(cfg: Gemma4DSparkConfig, path: str) -> None:
    """The target's last layer: transformers replaces its hidden state by the final-normed
    one, and DeepSpec's evaluator refuses it (base_evaluator.py L100-112)."""
    last = cfg.num_target_layers - 1
    if last in cfg.target_layer_ids:
        pos = cfg.target_layer_ids.index(last)
        raise FinalLayerTapError(
            f"{path}: field 'target_layer_ids[{pos}]': found {last}, the target's final layer, "
            f"whose hidden state transformers replaces by the final-normed one; expected a "
            f"layer id in [0, {last - 1}] (num_target_layers = {cfg.num_target_layers})",
            path=path, field=f"target_layer_ids[{pos}]", expected=f"0..{last - 1}", found=last)


def _inherited_unused(cfg: Gemma4DSparkConfig, raw: dict) -> dict:
    """What config.json says of the fields the drafter never uses, as it says it."""
    rope = cfg.rope_parameters
    found = {
        "head_dim": cfg.head_dim,
        "num_key_value_heads": cfg.num_key_value_heads if cfg.attention_k_eq_v else None,
        "num_global_key_value_heads": (None if cfg.attention_k_eq_v
                                       else cfg.num_global_key_value_heads),
        "sliding_window": raw.get("sliding_window"),
        "rope_sliding_attention": rope.get("sliding_attention"),
        "rope_top_level": {k: v for k, v in rope.items()
                           if k not in ("full_attention", "sliding_attention")} or None,
        "vocab_size_per_layer_input": raw.get("vocab_size_per_layer_input"),
        "use_bidirectional_attention": raw.get("use_bidirectional_attention"),
        "num_experts": raw.get("num_experts"),
        "top_k_experts": raw.get("top_k_experts"),
        "moe_intermediate_size": raw.get("moe_intermediate_size"),
        "max_position_embeddings": cfg.max_position_embeddings,
    }
    return {k: v for k, v in found.items() if v is not None}


def build_contract(cfg: Gemma4DSparkConfig, *, path: str = "config.json",
                   raw: dict | None = None) -> Gemma4Contract:
    """The family's rules on a parsed config, and the contract they derive."""
    if cfg.architectures != [ARCHITECTURE]:
        raise UnsupportedArchitectureError(
            f"{path}: field 'architectures': expected ['{ARCHITECTURE}'], found {cfg.architectures}",
            path=path, field="architectures", expected=[ARCHITECTURE], found=cfg.architectures)
    for field, allowed in (("model_type", CONFIG_MODEL_TYPES),
                           ("target_model_type", TARGET_MODEL_TYPES),
                           ("target_text_model_type", TARGET_TEXT_MODEL_TYPES)):
        value = getattr(cfg, field)
        if value not in allowed:
            raise ConfigError(f"{path}: field '{field}': expected one of {', '.join(allowed)}, "
                              f"found {value!r}{_HINT}", path=path, field=field,
                              expected=list(allowed), found=value)
    # The draft layer count first: layer_types is compared with it, and a metadata view
    # (artifact/format.py) builds layer_types from it only once it is within bounds.
    _positive(path, "num_hidden_layers", cfg.num_hidden_layers, MAX_DRAFT_LAYERS)
    _refuse_unsupported_blocks(cfg, path)
    nkv, nkv_field = _global_kv_heads(cfg, path)
    for field, value in (("hidden_size", cfg.hidden_size),
                         ("intermediate_size", cfg.intermediate_size),
                         ("num_attention_heads", cfg.num_attention_heads),
                         ("global_head_dim", cfg.global_head_dim), (nkv_field, nkv),
                         ("vocab_size", cfg.vocab_size),
                         ("num_target_layers", cfg.num_target_layers)):
        _positive(path, field, value)
    _positive(path, "block_size", cfg.block_size, MAX_BLOCK_SIZE)
    if cfg.global_head_dim % 2:
        raise GeometryLimitError(f"{path}: field 'global_head_dim': expected an even number "
                                 f"(RoPE rotates pairs), found {cfg.global_head_dim}", path=path,
                                 field="global_head_dim", expected="even",
                                 found=cfg.global_head_dim)
    if cfg.num_attention_heads % nkv:
        raise GeometryLimitError(
            f"{path}: field '{nkv_field}': expected a divisor of num_attention_heads "
            f"({cfg.num_attention_heads}), found {nkv}", path=path, field=nkv_field,
            expected=f"divides {cfg.num_attention_heads}", found=nkv)
    check_positive_eps(cfg, path=path, errors=DRAFTER_ERRORS)
    softcap = cfg.final_logit_softcapping
    if softcap is not None and not (math.isfinite(softcap) and softcap > 0):
        raise GeometryLimitError(f"{path}: field 'final_logit_softcapping': expected a positive "
                                 f"finite number or null, found {softcap}", path=path,
                                 field="final_logit_softcapping", expected="> 0", found=softcap)
    rope = full_rope(cfg.rope_parameters, cfg.global_head_dim, path=path)
    _check_final_tap(cfg, path)
    _check_taps(cfg, path)
    _check_mask_token(cfg, path)
    _check_heads(cfg, path)
    check_block_layout(cfg, path)

    markov_type = cfg.markov_head_type if cfg.markov_rank > 0 else "none"
    raw = raw if raw is not None else cfg.model_dump()
    parts = dict(
        family=FAMILY, architecture=ARCHITECTURE,
        geometry=Gemma4Geometry(
            hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
            num_draft_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
            num_key_value_heads=nkv, head_dim=cfg.global_head_dim, vocab_size=cfg.vocab_size,
            rms_norm_eps=cfg.rms_norm_eps, key_value_heads_from=nkv_field),
        rope=rope,
        attention=Gemma4Attention(causal=False, bias=False, k_eq_v=cfg.attention_k_eq_v,
                                  scale=1.0, sliding_window=False),
        blocks=Gemma4Blocks(activation=ACTIVATION, norms_per_layer=4, norm_multiplies_by="weight",
                            layer_scalar=True, embedding_scale="sqrt(hidden_size)",
                            final_logit_softcapping=softcap),
        config_form=Gemma4ConfigForm(model_type=cfg.model_type,
                                     target_model_type=cfg.target_model_type,
                                     target_text_model_type=cfg.target_text_model_type),
        taps=FeatureTaps(
            num_target_layers=cfg.num_target_layers, target_layer_ids=list(cfg.target_layer_ids),
            hidden_state_indices=[i + 1 for i in cfg.target_layer_ids],
            feature_width=len(cfg.target_layer_ids) * cfg.hidden_size),
        block=BlockLayout(block_size=cfg.block_size, mask_token_id=cfg.mask_token_id,
                          anchor_first=True),
        markov_head=MarkovHead(rank=cfg.markov_rank, type=markov_type),
        confidence_head=ConfidenceHead(enabled=cfg.enable_confidence_head,
                                       with_markov=bool(cfg.confidence_head_with_markov)),
        inherited_unused=_inherited_unused(cfg, raw),
    )
    return contract_with_tensors(parts, model=Gemma4Contract, table=GEMMA4_TENSOR_RULES)


def check_tensors(contract: Gemma4Contract, names: set[str], *, path: str) -> None:
    """attention_k_eq_v against the tensors, before the one-by-one inventory, so that a
    config naming the wrong attention gets a message about it, not a list of tensors."""
    has_v = sorted(n for n in names if n.endswith(".self_attn.v_proj.weight"))
    if contract.attention.k_eq_v and has_v:
        raise KEqVMismatchError(
            f"{path}: config says attention_k_eq_v true but the weights hold '{has_v[0]}'; "
            "expected no v_proj (V is k_proj's output, RMS-normed)", path=path,
            field="attention_k_eq_v", tensor=has_v[0], expected="no v_proj", found="v_proj")
    if not contract.attention.k_eq_v and not has_v and contract.geometry.num_draft_layers:
        raise KEqVMismatchError(
            f"{path}: config says attention_k_eq_v false but the weights hold no "
            "self_attn.v_proj.weight; expected one per draft layer", path=path,
            field="attention_k_eq_v", expected="v_proj", found="no v_proj")
