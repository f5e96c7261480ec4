"""The one reader of a Qwen3 ``config.json``: the drafter's, the target's, the runtime's.

A DSpark drafter's config is a copy of its target's with the DSpark fields added
(docs/REFERENCE.md §1), so one strict model, ``Qwen3Config``, reads the Qwen3 part of all
three, and ``contract.dspark.DSparkConfig`` extends it. The rules a Qwen3 config must meet
whoever reads it live here once, each reader naming its own error classes
(``ConfigErrors``): a drafter's bad config is a contract violation (13, 15, 17), a target's
a target-format error (61), the runtime's a runtime refusal (70).

Two disagreements between the three former readers are resolved by refusing:
``rope_theta`` and ``rope_parameters.rope_theta`` that differ are refused everywhere (the
runtime used to take one silently), and a ``tie_word_embeddings`` that is not a JSON
boolean (``"false"``, which ``bool()`` reads as True) is refused everywhere (strict types).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from dspark_convert.errors import DSparkError
from dspark_convert.util.models import validated

# transformers' Qwen3Config default when config.json has no max_position_embeddings.
DEFAULT_MAX_POSITION_EMBEDDINGS = 32768


class _Strict(BaseModel):
    # Unknown fields are kept (a drafter's manifest copies its config verbatim) but no code
    # reads them; every known field is strictly typed: "7" is not an int, "false" not a bool.
    model_config = ConfigDict(strict=True, extra="allow", frozen=True)


class RopeParameters(_Strict):
    rope_theta: float
    rope_type: str


class Qwen3Config(_Strict):
    """The Qwen3 fields of config.json, as transformers writes them (Qwen3Config). The
    geometry has no defaults; the flags default as transformers' Qwen3Config does."""

    architectures: list[str]
    model_type: str | None = None
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    attention_bias: bool = False
    hidden_act: str = "silu"
    # RoPE: transformers 5 writes rope_parameters; 4.x wrote rope_theta (+ rope_scaling).
    rope_parameters: RopeParameters | None = None
    rope_theta: float | None = None
    rope_scaling: dict | None = None
    use_sliding_window: bool | None = None
    tie_word_embeddings: bool = False
    max_position_embeddings: int | None = None
    eos_token_id: int | list[int] | None = None
    dtype: str | None = None
    torch_dtype: str | None = None

    @property
    def context_length(self) -> int:
        return self.max_position_embeddings or DEFAULT_MAX_POSITION_EMBEDDINGS


@dataclass(frozen=True)
class ConfigErrors:
    """The error classes one reader raises: ``malformed`` (a field of the wrong type,
    missing, or contradicting another), ``unsupported`` (a feature the reader cannot
    handle: RoPE scaling, sliding window, another activation, attention bias) and ``limit``
    (a value out of range)."""

    malformed: type[DSparkError]
    unsupported: type[DSparkError]
    limit: type[DSparkError]


def parse_qwen3_config(data: object, *, path: str, errors: ConfigErrors,
                       model: type[Qwen3Config] = Qwen3Config) -> Qwen3Config:
    """Validate a parsed config.json against ``model`` (Qwen3Config or a subclass); the
    first bad field becomes one ``errors.malformed`` line naming it."""
    if not isinstance(data, dict):
        raise errors.malformed(f"{path}: expected a JSON object, found {type(data).__name__}",
                               path=path, expected="object", found=type(data).__name__)
    return validated(model, data, error=errors.malformed, label=path, path=path)


def rope_theta(cfg: Qwen3Config, *, path: str, errors: ConfigErrors) -> float:
    """The RoPE base, from ``rope_parameters.rope_theta`` or the older ``rope_theta``: both
    given and different is refused, as is RoPE scaling (only the default RoPE is modelled)
    and a base that is not a positive finite number."""
    thetas = []
    if cfg.rope_parameters is not None:
        if cfg.rope_parameters.rope_type != "default":
            raise errors.unsupported(
                f"{path}: field 'rope_parameters.rope_type': expected 'default', found "
                f"{cfg.rope_parameters.rope_type!r} (RoPE scaling is not supported)",
                path=path, field="rope_parameters.rope_type", expected="default",
                found=cfg.rope_parameters.rope_type)
        thetas.append(("rope_parameters.rope_theta", cfg.rope_parameters.rope_theta))
    if cfg.rope_theta is not None:
        thetas.append(("rope_theta", cfg.rope_theta))
    if cfg.rope_scaling is not None:
        raise errors.unsupported(
            f"{path}: field 'rope_scaling': expected null, found {cfg.rope_scaling!r} "
            "(RoPE scaling is not supported)",
            path=path, field="rope_scaling", expected=None, found=str(cfg.rope_scaling))
    if not thetas:
        raise errors.malformed(f"{path}: required field 'rope_parameters.rope_theta' (or "
                               "'rope_theta') is missing", path=path,
                               field="rope_parameters.rope_theta", expected="a number",
                               found="nothing")
    if len(thetas) == 2 and thetas[0][1] != thetas[1][1]:
        raise errors.malformed(f"{path}: field 'rope_theta' is {thetas[1][1]} but "
                               f"'rope_parameters.rope_theta' is {thetas[0][1]}; expected them "
                               "equal", path=path, field="rope_theta", expected=thetas[0][1],
                               found=thetas[1][1])
    field, theta = thetas[0]
    if not (math.isfinite(theta) and theta > 0):
        raise errors.limit(f"{path}: field '{field}': expected a positive finite number, "
                           f"found {theta}", path=path, field=field, expected="> 0", found=theta)
    return float(theta)


def check_dense(cfg: Qwen3Config, *, path: str, errors: ConfigErrors) -> None:
    """What a dense Qwen3 block is, and DeepSpec's drafter and our runtime compute: no
    attention bias, SiLU, no sliding window."""
    if cfg.attention_bias:
        raise errors.unsupported(f"{path}: field 'attention_bias': expected false, found true "
                                 "(q/k/v/o biases are not supported)", path=path,
                                 field="attention_bias", expected=False, found=True)
    if cfg.hidden_act != "silu":
        raise errors.unsupported(f"{path}: field 'hidden_act': expected 'silu', found "
                                 f"{cfg.hidden_act!r}", path=path, field="hidden_act",
                                 expected="silu", found=cfg.hidden_act)
    if cfg.use_sliding_window:
        raise errors.unsupported(f"{path}: field 'use_sliding_window': expected false, found "
                                 "true", path=path, field="use_sliding_window", expected=False,
                                 found=True)


def check_positive(cfg: Qwen3Config, fields: tuple[str, ...], *, path: str,
                   errors: ConfigErrors) -> None:
    for field in fields:
        value = getattr(cfg, field)
        if value is not None and value <= 0:
            raise errors.limit(f"{path}: field '{field}': expected a positive integer, found "
                               f"{value}", path=path, field=field, expected="> 0", found=value)


def check_positive_eps(cfg: Qwen3Config, *, path: str, errors: ConfigErrors) -> None:
    if not (math.isfinite(cfg.rms_norm_eps) and cfg.rms_norm_eps > 0):
        raise errors.limit(f"{path}: field 'rms_norm_eps': expected a positive finite number, "
                           f"found {cfg.rms_norm_eps}", path=path, field="rms_norm_eps",
                           expected="> 0", found=cfg.rms_norm_eps)


def check_heads_divide(cfg: Qwen3Config, *, path: str, errors: ConfigErrors) -> None:
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        raise errors.limit(
            f"{path}: field 'num_key_value_heads': expected a divisor of num_attention_heads "
            f"({cfg.num_attention_heads}), found {cfg.num_key_value_heads}", path=path,
            field="num_key_value_heads", expected=f"divides {cfg.num_attention_heads}",
            found=cfg.num_key_value_heads)


def stop_token_ids(value: object) -> tuple[int, ...]:
    """``eos_token_id`` (config.json or generation_config.json) as the ids that end a run."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return tuple(dict.fromkeys(value))
    return ()
