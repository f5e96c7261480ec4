"""The Gemma4 family's target reader (contract/families.py names it; the protocol is
target/qwen3.py's): a ``gemma4`` or ``gemma4_unified`` config.json, whose text model's
fields sit in a nested ``text_config``, its weights under ``model.language_model.``.

A Gemma4 drafter is built from the target's text_config (DeepSpec's build_draft_config,
deepspec/modeling/dspark/gemma4/config.py L9-19, asserts the top-level model_type is
gemma4 or gemma4_unified, and records it as target_model_type / target_text_model_type).
What it copies and computes with, and the pairing therefore compares: hidden_size,
vocab_size, the layer count its taps index, the full-attention geometry its attention has
(num_attention_heads, global_head_dim, attention_k_eq_v and the KV heads that goes with:
num_global_key_value_heads under k_eq_v, else num_key_value_heads), rms_norm_eps, the
full-attention RoPE (``rope_parameters["full_attention"]``: type, theta, partial factor)
and the final logit softcap. The target's sliding geometry (head_dim, and the KV heads it
does not use), its layer types and sliding window are its own business.

Gemma 4 ties its head to the embedding (tie_word_embeddings true, no lm_head.weight): the
drafter's two copies are both checked against that one matrix.
"""

from __future__ import annotations


from pydantic import BaseModel, ConfigDict

from dspark_convert.artifact.manifest import TargetConfigRecord
from dspark_convert.contract import gemma4
from dspark_convert.contract.qwen3 import ConfigErrors
from dspark_convert.errors import TargetFormatError
from dspark_convert.target.model import TargetConfig
from dspark_convert.util.models import validated

# The text model_type each target model_type nests (transformers' Gemma4 configs).
TEXT_MODEL_TYPES = {"gemma4": "gemma4_text", "gemma4_unified": "gemma4_unified_text"}
# google/gemma-4-12B-it: full-attention rope theta 1e6, rms_norm_eps 1e-6 (as Qwen3's).
USUAL = {"rope_theta": ("full-attention rope theta", 1_000_000.0, "Gemma 4"),
         "rms_norm_eps": ("RMS eps", 1e-6, "Gemma 4")}
_TEXT = "text_config."
TARGET_ROPE_ERRORS = ConfigErrors(malformed=TargetFormatError, unsupported=TargetFormatError,
                                  limit=TargetFormatError)


class _Strict(BaseModel):
    # As contract/qwen3.py: unknown fields kept but never read; known fields strictly typed.
    model_config = ConfigDict(strict=True, extra="allow", frozen=True)


class Gemma4TargetText(_Strict):
    """The text_config fields the pairing reads (required: it compares them)."""

    model_type: str
    hidden_size: int
    vocab_size: int
    num_hidden_layers: int
    # The full-attention geometry (DeepSpec's builder requires all four of the target).
    num_attention_heads: int
    global_head_dim: int
    attention_k_eq_v: bool
    num_global_key_value_heads: int | None
    num_key_value_heads: int | None
    rms_norm_eps: float
    rope_parameters: dict
    final_logit_softcapping: float | None
    # transformers' Gemma4 text configs default to a tied head.
    tie_word_embeddings: bool = True
    max_position_embeddings: int        # the context a run may use: no guessed default


class Gemma4TargetConfig(_Strict):
    architectures: list[str]
    model_type: str
    text_config: Gemma4TargetText
    tie_word_embeddings: bool | None = None


def read_config(raw: object, label: str) -> TargetConfig:
    model_type = raw.get("model_type") if isinstance(raw, dict) else None
    if model_type not in TEXT_MODEL_TYPES:
        # A text-only Gemma4 model (gemma4_text): DeepSpec builds drafters only for the
        # composite models, whose text_config it copies.
        raise TargetFormatError(
            f"{label}: field 'model_type': expected one of {', '.join(TEXT_MODEL_TYPES)} (a "
            f"Gemma4 drafter's target, its text model in text_config), found {model_type!r}",
            path=label, field="model_type", expected=list(TEXT_MODEL_TYPES), found=model_type)
    cfg = validated(Gemma4TargetConfig, raw, error=TargetFormatError, label=label, path=label)
    text = cfg.text_config
    _check(cfg, label)
    rope = full_rope(text, label)
    rope_type, theta, factor = rope.type, rope.theta, rope.partial_rotary_factor
    record = TargetConfigRecord(
        architectures=list(cfg.architectures), model_type=cfg.model_type,
        hidden_size=text.hidden_size, vocab_size=text.vocab_size,
        num_hidden_layers=text.num_hidden_layers, rope_theta=theta,
        rms_norm_eps=text.rms_norm_eps, tie_word_embeddings=text.tie_word_embeddings)
    return TargetConfig(
        record=record, model=cfg, field_prefix=_TEXT, weights_prefix="model.language_model.",
        context_length=text.max_position_embeddings,
        values={"num_attention_heads": text.num_attention_heads,
                "global_head_dim": text.global_head_dim,
                "attention_k_eq_v": text.attention_k_eq_v,
                "num_global_key_value_heads": text.num_global_key_value_heads,
                "num_key_value_heads": text.num_key_value_heads,
                "rope_type": rope_type, "rope_theta": theta, "partial_rotary_factor": factor,
                "rms_norm_eps": text.rms_norm_eps,
                "final_logit_softcapping": text.final_logit_softcapping})


def _check(cfg: Gemma4TargetConfig, label: str) -> None:
    text = cfg.text_config
    want = TEXT_MODEL_TYPES[cfg.model_type]
    if text.model_type != want:
        raise TargetFormatError(f"{label}: field 'text_config.model_type': expected {want!r} "
                                f"(model_type is {cfg.model_type!r}), found {text.model_type!r}",
                                path=label, field="text_config.model_type", expected=want,
                                found=text.model_type)
    for field in ("hidden_size", "vocab_size", "num_hidden_layers", "max_position_embeddings"):
        value = getattr(text, field)
        if value <= 0:
            raise TargetFormatError(f"{label}: field '{_TEXT}{field}': expected a positive "
                                    f"integer, found {value}", path=label, field=_TEXT + field,
                                    expected="> 0", found=value)
    if cfg.tie_word_embeddings not in (None, text.tie_word_embeddings):
        # Which one transformers ties by is a version detail; two answers are refused.
        raise TargetFormatError(
            f"{label}: field 'tie_word_embeddings' is {cfg.tie_word_embeddings}, "
            f"'{_TEXT}tie_word_embeddings' is {text.tie_word_embeddings}; expected one answer",
            path=label, field="tie_word_embeddings", expected=text.tie_word_embeddings,
            found=cfg.tie_word_embeddings)


def full_rope(text: Gemma4TargetText, label: str, errors: ConfigErrors = TARGET_ROPE_ERRORS
              ) -> gemma4.Gemma4Rope:
    """rope_parameters["full_attention"] of the text_config, by the contract's one reader
    of that entry (contract/gemma4.py ``full_rope``), over global_head_dim."""
    return gemma4.full_rope(text.rope_parameters, text.global_head_dim, path=label,
                            field=f"{_TEXT}rope_parameters.full_attention", errors=errors)


def model_type_problem(contract, drafter_model_type: str | None,
                       config: TargetConfig) -> tuple[str, object, object, str] | None:
    """The target's model types against the ones the drafter recorded (its config.json's
    target_model_type / target_text_model_type, kept in the artifact's metadata)."""
    form, cfg = contract.config_form, config.model
    for field, found, want, drafter_field in (
            ("model_type", cfg.model_type, form.target_model_type, "target_model_type"),
            (_TEXT + "model_type", cfg.text_config.model_type, form.target_text_model_type,
             "target_text_model_type")):
        if want is not None and found != want:
            return field, found, want, drafter_field
    return None


def inherited(contract) -> list[tuple[str, str, str, object]]:
    """(key in TargetConfig.values, target field, drafter field, the drafter's value)."""
    rope, full, g = contract.rope, "rope_parameters.full_attention.", contract.geometry
    kv = g.key_value_heads_from     # num_global_key_value_heads under k_eq_v
    return [
        ("num_attention_heads", _TEXT + "num_attention_heads", "num_attention_heads",
         g.num_attention_heads),
        ("global_head_dim", _TEXT + "global_head_dim", "global_head_dim", g.head_dim),
        ("attention_k_eq_v", _TEXT + "attention_k_eq_v", "attention_k_eq_v",
         contract.attention.k_eq_v),
        (kv, _TEXT + kv, kv, g.num_key_value_heads),
        ("rope_type", _TEXT + full + "rope_type", full + "rope_type", rope.type),
        ("rope_theta", _TEXT + full + "rope_theta", full + "rope_theta", rope.theta),
        ("partial_rotary_factor", _TEXT + full + "partial_rotary_factor",
         full + "partial_rotary_factor", rope.partial_rotary_factor),
        ("rms_norm_eps", _TEXT + "rms_norm_eps", "rms_norm_eps", contract.geometry.rms_norm_eps),
        ("final_logit_softcapping", _TEXT + "final_logit_softcapping", "final_logit_softcapping",
         contract.blocks.final_logit_softcapping),
    ]


def inherited_detail(config: TargetConfig) -> str:
    v = config.values
    softcap = "none" if v["final_logit_softcapping"] is None else f"{v['final_logit_softcapping']:g}"
    kv = "num_global_key_value_heads" if v["attention_k_eq_v"] else "num_key_value_heads"
    return (f"full attention {v['num_attention_heads']} heads x {v['global_head_dim']}, "
            f"{v[kv]} KV heads ({'k_eq_v' if v['attention_k_eq_v'] else 'v_proj'}); "
            f"RoPE {v['rope_type']} theta {v['rope_theta']:g} factor "
            f"{v['partial_rotary_factor']:g}, RMS eps {v['rms_norm_eps']:g}, logit softcap "
            f"{softcap} on both sides")
