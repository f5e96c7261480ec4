"""The Qwen3 family's target reader (contract/families.py names it): a ``qwen3`` config.json,
read by the one Qwen3 config model (contract/qwen3.py), its weights under ``model.``.

Every family's reader module has the same five names, which target/model.py and
target/pairing.py call: ``read_config`` (config.json -> ``TargetConfig``),
``model_type_problem`` (the target's model types against the drafter's), ``inherited``
(the fields the drafter copied from the target and computes with; the target's values are
``TargetConfig.values``), ``inherited_detail`` (the passed check's text) and ``USUAL`` (the
values the family's released targets hold: another one is a warning, not a refusal).
"""

from __future__ import annotations

from dspark_convert.contract.qwen3 import check_positive, parse_qwen3_config, rope_theta
from dspark_convert.errors import TargetFormatError
from dspark_convert.artifact.manifest import TargetConfigRecord
from dspark_convert.target.model import TARGET_ERRORS, TARGET_MODEL_TYPE, TargetConfig

# The values every released Qwen3 dense model's config.json holds (Qwen/Qwen3-0.6B ... 32B:
# rope_theta 1000000, rms_norm_eps 1e-06); Strata's DFlash loader also fixes RMS eps at
# 1e-6 (docs/REFERENCE.md §3). key -> (what it is called in a warning, the value, who uses it).
USUAL = {"rope_theta": ("rope theta", 1_000_000.0, "Qwen3"),
         "rms_norm_eps": ("RMS eps", 1e-6, "Qwen3")}


def read_config(raw: object, label: str) -> TargetConfig:
    """config.json through the one Qwen3 config model (contract/qwen3.py)."""
    cfg = parse_qwen3_config(raw, path=label, errors=TARGET_ERRORS)
    if cfg.model_type is None:
        raise TargetFormatError(f"{label}: required field 'model_type' is missing", path=label,
                                field="model_type", expected="a value", found="nothing")
    theta = rope_theta(cfg, path=label, errors=TARGET_ERRORS)
    check_positive(cfg, ("hidden_size", "vocab_size", "num_hidden_layers"), path=label,
                   errors=TARGET_ERRORS)
    record = TargetConfigRecord(
        architectures=list(cfg.architectures), model_type=cfg.model_type,
        hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size,
        num_hidden_layers=cfg.num_hidden_layers, rope_theta=theta,
        rms_norm_eps=cfg.rms_norm_eps, tie_word_embeddings=cfg.tie_word_embeddings)
    return TargetConfig(record=record, model=cfg, field_prefix="", weights_prefix="model.",
                        context_length=cfg.context_length,
                        values={"rope_theta": theta, "rms_norm_eps": cfg.rms_norm_eps})


def model_type_problem(contract, drafter_model_type: str | None,
                       config: TargetConfig) -> tuple[str, object, object, str] | None:
    """(target field, found, expected, drafter field) when the target is not a qwen3 model,
    or not the model_type the drafter's config.json copied; None when it is."""
    found = config.record.model_type
    if found != TARGET_MODEL_TYPE or drafter_model_type not in (None, found):
        return "model_type", found, drafter_model_type or TARGET_MODEL_TYPE, "model_type"
    return None


def inherited(contract) -> list[tuple[str, str, str, object]]:
    """(key in TargetConfig.values, target field, drafter field, the drafter's value) of
    what the drafter copied from the target's config.json."""
    g = contract.geometry
    return [("rope_theta", "rope_theta", "rope_parameters.rope_theta", g.rope_theta),
            ("rms_norm_eps", "rms_norm_eps", "rms_norm_eps", g.rms_norm_eps)]


def inherited_detail(config: TargetConfig) -> str:
    v = config.values
    return f"rope theta {v['rope_theta']:g} and RMS eps {v['rms_norm_eps']:g} on both sides"
