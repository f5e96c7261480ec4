"""The feature contract: strict config parsing, the format's rules, the tensor inventory."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import GOLDEN, REFERENCE_DRAFTER
from support.fuzz import json_values
from dspark_convert import errors
from dspark_convert.contract.inventory import check_inventory
from dspark_convert.contract.dspark import (
    DSparkConfig,
    FeatureContract,
    build_contract,
    parse_config,
)
from dspark_convert.synthetic import synthetic_config

RELEASED = json.loads((GOLDEN / "reference" / "released_shapes.json").read_text())

# released_shapes.json variant -> the config fields that select it
VARIANTS = {
    "vanilla+conf_with_markov": dict(markov_rank=256, markov_head_type="vanilla",
                                     enable_confidence_head=True, confidence_head_with_markov=True),
    "vanilla+conf_no_markov": dict(markov_rank=256, markov_head_type="vanilla",
                                   enable_confidence_head=True, confidence_head_with_markov=False),
    "gated+conf_with_markov": dict(markov_rank=256, markov_head_type="gated",
                                   enable_confidence_head=True, confidence_head_with_markov=True),
    "rnn+conf_with_markov": dict(markov_rank=256, markov_head_type="rnn",
                                 enable_confidence_head=True, confidence_head_with_markov=True),
    "no_markov+conf": dict(markov_rank=0, enable_confidence_head=True,
                           confidence_head_with_markov=False),
    "vanilla_no_conf": dict(markov_rank=256, markov_head_type="vanilla", enable_confidence_head=False),
    "no_markov_no_conf": dict(markov_rank=0, enable_confidence_head=False),
}


def _variant_config(fields: dict) -> dict:
    cfg = dict(RELEASED["qwen3/config.json"])
    for key in ("markov_head_type", "confidence_head_with_markov"):
        cfg.pop(key, None)
    cfg.update(fields)
    return cfg


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_contract_matches_released_qwen3_4b_state_dict(variant):
    """The table's shapes, evaluated at the released geometry, equal DeepSpec's own model."""
    contract = build_contract(parse_config(_variant_config(VARIANTS[variant])))
    released = RELEASED[f"qwen3/{variant}"]
    assert {t.source_name: t.shape for t in contract.tensors} == released
    assert contract.taps.feature_width == 5 * 2560
    for t in contract.tensors:
        assert t.gguf_shape == t.shape[::-1]


def test_released_gemma4_is_refused_as_its_own_family():
    cfg = RELEASED["gemma4/config.json"]
    with pytest.raises(errors.DSparkError) as exc:
        build_contract(parse_config(cfg))
    # Gemma4 configs differ in fields too; whichever rule trips first, it is a refusal
    # naming a field, never a crash.
    assert exc.value.field


def test_gemma4_architecture_refused():
    cfg = synthetic_config()
    cfg["architectures"] = ["Gemma4DSparkModel"]
    with pytest.raises(errors.UnsupportedArchitectureError, match="architectures"):
        build_contract(parse_config(cfg))


@pytest.mark.parametrize("field,value,fragment", [
    ("hidden_size", "32", "expected an integer, found '32' (str)"),
    ("block_size", True, "expected an integer, found True (bool)"),
    ("block_size", 7.0, "expected an integer"),
    ("attention_bias", 0, "expected true or false"),
    ("target_layer_ids", "0,2,4", "expected a list"),
    ("rms_norm_eps", "1e-6", "expected a number"),
    ("markov_head_type", "lstm", "markov_head_type"),
])
def test_no_coercion(field, value, fragment):
    cfg = synthetic_config()
    cfg[field] = value
    with pytest.raises(errors.ConfigError) as exc:
        parse_config(cfg)
    assert fragment in exc.value.message
    assert exc.value.field == field
    assert exc.value.exit_code == 13


@pytest.mark.parametrize("field", ["hidden_size", "intermediate_size", "num_hidden_layers",
                                   "head_dim", "vocab_size", "target_layer_ids", "block_size",
                                   "mask_token_id", "markov_rank", "num_target_layers",
                                   "enable_confidence_head", "rms_norm_eps"])
def test_geometry_has_no_defaults(field):
    cfg = synthetic_config()
    del cfg[field]
    with pytest.raises(errors.ConfigError, match=f"required field '{field}' is missing"):
        parse_config(cfg)


def test_unknown_fields_are_kept_but_not_trusted():
    cfg = synthetic_config()
    cfg["num_anchors"] = "not even an int"     # training-only field: not used
    cfg["my_extension"] = {"hidden_size": 9999}
    parsed = parse_config(cfg)
    assert parsed.model_extra["my_extension"] == {"hidden_size": 9999}
    contract = build_contract(parsed)
    assert contract.geometry.hidden_size == cfg["hidden_size"]


@pytest.mark.parametrize("change,error,fragment", [
    (dict(target_layer_ids=[-1, 2]), errors.TargetLayerError, "found -1"),
    (dict(target_layer_ids=[0, 6]), errors.TargetLayerError, "found 6"),
    (dict(target_layer_ids=[0, 5]), errors.TargetLayerError, "last layer"),
    (dict(target_layer_ids=[2, 2]), errors.TargetLayerError, "strictly increasing"),
    (dict(target_layer_ids=[]), errors.TargetLayerError, "at least one"),
    (dict(mask_token_id=256), errors.MaskTokenError, "[0, 255]"),
    (dict(block_size=129), errors.GeometryLimitError, "1..128"),
    (dict(block_size=0), errors.GeometryLimitError, "1..128"),
    (dict(num_hidden_layers=65), errors.GeometryLimitError, "1..64"),
    (dict(num_key_value_heads=3), errors.GeometryLimitError, "divisor"),
    (dict(hidden_size=0), errors.GeometryLimitError, "hidden_size"),
    (dict(rms_norm_eps=0.0), errors.GeometryLimitError, "rms_norm_eps"),
    (dict(attention_bias=True), errors.UnsupportedFeatureError, "attention_bias"),
    (dict(hidden_act="gelu"), errors.UnsupportedFeatureError, "hidden_act"),
    (dict(use_sliding_window=True), errors.UnsupportedFeatureError, "use_sliding_window"),
    (dict(rope_parameters={"rope_theta": 1e6, "rope_type": "yarn"}), errors.UnsupportedFeatureError, "rope_type"),
    (dict(markov_rank=-1), errors.GeometryLimitError, "markov_rank"),
])
def test_rules(change, error, fragment):
    cfg = synthetic_config()
    cfg.update(change)
    with pytest.raises(error) as exc:
        build_contract(parse_config(cfg))
    assert fragment in exc.value.message
    assert "\n" not in exc.value.message


@pytest.mark.parametrize("fields,fragment", [
    (dict(markov_rank=8, markov_head_type=None), "markov_head_type' is missing"),
    (dict(markov_rank=0, markov_head_type="vanilla"), "markov_rank is 0"),
    (dict(enable_confidence_head=True, confidence_head_with_markov=None), "is missing"),
    (dict(enable_confidence_head=False, confidence_head_with_markov=False), "expected it absent"),
    (dict(markov_rank=0, markov_head_type=None, confidence_head_with_markov=True), "no Markov features"),
])
def test_head_fields_must_agree(fields, fragment):
    cfg = synthetic_config()
    for key, value in fields.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    with pytest.raises(errors.HeadConfigMismatchError, match=fragment):
        build_contract(parse_config(cfg))


def test_rope_theta_from_older_configs():
    cfg = synthetic_config()
    del cfg["rope_parameters"]
    cfg["rope_theta"] = 5e5
    assert build_contract(parse_config(cfg)).geometry.rope_theta == 5e5
    cfg["rope_parameters"] = {"rope_theta": 1e6, "rope_type": "default"}
    with pytest.raises(errors.ConfigError, match="expected them equal"):
        build_contract(parse_config(cfg))


def _inventory(contract: FeatureContract) -> dict:
    return {t.source_name: ("BF16", list(t.shape)) for t in contract.tensors}


def test_inventory_names_each_problem():
    contract = build_contract(parse_config(synthetic_config()))
    good = _inventory(contract)
    assert check_inventory(contract, good, path="m") == "BF16"

    missing = dict(good)
    del missing["layers.1.mlp.up_proj.weight"]
    with pytest.raises(errors.MissingTensorError, match=r"'layers.1.mlp.up_proj.weight' is missing; expected shape \[64, 32\] \(= \[I, H\]\)"):
        check_inventory(contract, missing, path="m")

    extra = dict(good, **{"layers.0.self_attn.q_proj.bias": ("BF16", [32])})
    with pytest.raises(errors.UnexpectedTensorError, match="q_proj.bias"):
        check_inventory(contract, extra, path="m")

    shape = dict(good, **{"fc.weight": ("BF16", [96, 32])})
    with pytest.raises(errors.TensorShapeError, match=r"expected shape \[32, 96\] \(= \[H, m·H\]\), found \[96, 32\]"):
        check_inventory(contract, shape, path="m")

    dtype = dict(good, **{"norm.weight": ("F16", [32])})
    with pytest.raises(errors.TensorDtypeError, match=r"expected dtype BF16 \(as 'embed_tokens.weight'\), found F16"):
        check_inventory(contract, dtype, path="m")

    with pytest.raises(errors.TensorDtypeError, match=r"expected dtype F32 \(config.json 'dtype'\), found BF16"):
        check_inventory(contract, good, path="m", expected_dtype="F32")

    ints = {k: ("I64", v[1]) for k, v in good.items()}
    with pytest.raises(errors.TensorDtypeError, match="one of BF16, F16, F32"):
        check_inventory(contract, ints, path="m")


def test_embedding_and_head_are_optional():
    contract = build_contract(parse_config(synthetic_config()))
    tensors = _inventory(contract)
    del tensors["embed_tokens.weight"], tensors["lm_head.weight"]
    check_inventory(contract, tensors, path="m")


def test_head_tensors_must_agree_with_config():
    contract = build_contract(parse_config(synthetic_config(markov_head_type="gated")))
    vanilla = build_contract(parse_config(synthetic_config(markov_head_type="vanilla")))
    with pytest.raises(errors.HeadConfigMismatchError, match="'gated' but the weights hold a vanilla"):
        check_inventory(contract, _inventory(vanilla), path="m")


# --- property: any JSON gives a contract or one of our errors ----------------------------
# (300 examples each, as test_contract_fuzz.py's: slow; `make fuzz` runs them longer)

FIELDS = list(DSparkConfig.model_fields)
EXAMPLES = int(os.environ.get("DSPARK_FUZZ_EXAMPLES", "300"))


@pytest.mark.slow
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edits=st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=4),
       drops=st.sets(st.sampled_from(FIELDS), max_size=2))
def test_config_contract_never_crashes(edits, drops):
    cfg = synthetic_config()
    cfg.update(edits)
    for field in drops:
        cfg.pop(field, None)
    try:
        contract = build_contract(parse_config(cfg))
    except errors.DSparkError as exc:
        assert exc.exit_code in errors.EXIT_CODES
        assert "\n" not in exc.message
    else:
        assert contract.geometry.hidden_size > 0


@pytest.mark.slow
@settings(max_examples=EXAMPLES, deadline=None)
@given(value=json_values)
def test_any_json_document_as_config(value):
    try:
        build_contract(parse_config(value))
    except errors.DSparkError:
        pass


def test_reference_config_parses():
    cfg = json.loads((REFERENCE_DRAFTER / "config.json").read_text())
    contract = build_contract(parse_config(cfg))
    assert len(contract.tensors) == 31
