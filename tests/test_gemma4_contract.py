"""contract/gemma4.py: a Gemma4DSparkModel config.json read strictly, both of DeepSpec's
forms, the contract built from the fields the drafter uses (global geometry, k_eq_v, the
full-attention proportional RoPE), the inherited-but-unused fields recorded and never used,
and each refusal with its own exit code. On DeepSeek's own fixtures
(golden/reference/gemma4/) and the released 12B shapes (golden/reference/released_shapes.json)."""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import GOLDEN
from support.cli import assert_refused, run_cli
from support.gemma4 import GEMMA4_DRAFTERS, GEMMA4_RELEASED_CONFIG, GEMMA4_TRAINER_CONFIGS
from dspark_convert import errors as E
from dspark_convert.commands.inspection import inspect_path
from dspark_convert.contract.gemma4 import build_contract, parse_config

DSPARK = GEMMA4_DRAFTERS["gemma4_vanilla_conf_markov"]
RELEASED_SHAPES = json.loads((GOLDEN / "reference" / "released_shapes.json").read_text())


def _config(path=DSPARK / "config.json") -> dict:
    return json.loads(path.read_text())


def _contract(cfg: dict):
    return build_contract(parse_config(cfg), raw=cfg)


# --- both config forms, the fixtures' contracts ---------------------------------------------

@pytest.mark.parametrize("name", sorted(GEMMA4_DRAFTERS))
def test_both_config_forms_give_one_contract(name):
    released_form = _config(GEMMA4_DRAFTERS[name] / "config.json")
    trainer_form = _config(GEMMA4_TRAINER_CONFIGS[name])
    assert released_form["model_type"] == "gemma4_text"
    assert trainer_form["model_type"] == "gemma4_unified_text"
    a, b = _contract(released_form), _contract(trainer_form)
    assert a.config_form.model_type == "gemma4_text"
    assert b.config_form.model_type == "gemma4_unified_text"
    # The round trip's extra defaults are recorded as found, never used.
    assert a.inherited_unused["vocab_size_per_layer_input"] == 262144
    assert "vocab_size_per_layer_input" not in b.inherited_unused
    assert a.model_dump(exclude={"config_form", "inherited_unused"}) == \
        b.model_dump(exclude={"config_form", "inherited_unused"})


def test_the_drafter_uses_the_targets_global_geometry():
    c = _contract(_config())
    g = c.geometry
    # config.json says head_dim 16 and num_key_value_heads 2 (the target's sliding layers).
    assert (g.head_dim, g.num_key_value_heads) == (32, 1)
    assert g.key_value_heads_from == "num_global_key_value_heads"
    assert c.inherited_unused["head_dim"] == 16
    assert c.inherited_unused["num_key_value_heads"] == 2
    assert c.inherited_unused["sliding_window"] == 8
    assert c.attention.k_eq_v and c.attention.scale == 1.0
    assert c.rope.model_dump() == {"type": "proportional", "theta": 1e6,
                                   "partial_rotary_factor": 0.25, "head_dim": 32,
                                   "rotated_pairs": 4}
    assert c.blocks.final_logit_softcapping == 30.0
    assert c.taps.hidden_state_indices == [1, 3, 5]
    specs = {t.source_name: t for t in c.tensors}
    assert specs["layers.0.self_attn.q_proj.weight"].shape == [4 * 32, 64]
    assert specs["layers.0.self_attn.k_proj.weight"].shape == [32, 64]
    assert specs["layers.1.layer_scalar"].shape == [1] and specs["layers.1.layer_scalar"].kind == "scalar"
    assert not any("v_proj" in name for name in specs)
    assert sum(".pre_feedforward_layernorm." in n or ".post_feedforward_layernorm." in n
               or ".input_layernorm." in n or ".post_attention_layernorm." in n for n in specs) == 8


@pytest.mark.parametrize("name,count", [("gemma4_vanilla_conf_markov", 35), ("gemma4_dflash", 31)])
def test_inspect_the_fixtures_every_tensor_ok(name, count):
    result = inspect_path(GEMMA4_DRAFTERS[name])
    assert result.problem is None
    assert result.contract.family == "gemma4-dspark"
    assert len(result.rows) == count
    assert {r.status for r in result.rows} == {"ok", "stripped"}
    assert [r.name for r in result.rows if r.status == "stripped"] == ["embed_tokens.weight",
                                                                       "lm_head.weight"]


def test_cli_inspect_shows_the_contract_and_table():
    proc = run_cli("inspect", str(DSPARK))
    assert proc.returncode == 0, proc.stderr
    for needle in ("gemma4-dspark (Gemma4DSparkModel)", "heads=4/1x32", "proportional over 32 dims",
                   "4 of 16 pairs rotate", "k_eq_v", "softcap 30", "head_dim=16",
                   "layers.1.layer_scalar", "post_feedforward_layernorm"):
        assert needle in proc.stdout, needle
    data = json.loads(run_cli("inspect", str(DSPARK), "--json").stdout)
    assert data["contract"]["geometry"]["head_dim"] == 32 and data["problem"] is None


# --- the released 12B geometry -------------------------------------------------------------

VARIANTS = {
    "vanilla+conf_with_markov": {},
    "vanilla+conf_no_markov": {"confidence_head_with_markov": False},
    "gated+conf_with_markov": {"markov_head_type": "gated"},
    "rnn+conf_with_markov": {"markov_head_type": "rnn"},
    "no_markov+conf": {"markov_rank": 0, "markov_head_type": None, "confidence_head_with_markov": False},
    "vanilla_no_conf": {"enable_confidence_head": False, "confidence_head_with_markov": None},
    "no_markov_no_conf": {"markov_rank": 0, "markov_head_type": None,
                          "enable_confidence_head": False, "confidence_head_with_markov": None},
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_released_12b_shapes_every_head_variant(variant):
    cfg = copy.deepcopy(RELEASED_SHAPES["gemma4/config.json"])
    for key, value in VARIANTS[variant].items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    contract = _contract(cfg)
    expected = RELEASED_SHAPES[f"gemma4/{variant}"]
    assert {t.source_name: t.shape for t in contract.tensors} == expected
    if variant == "vanilla+conf_with_markov":
        assert len(expected) == 74      # 13 per layer (no v_proj under k_eq_v): docs/REFERENCE.md §10.2
        assert contract.rope.rotated_pairs == 64
        assert (contract.geometry.head_dim, contract.geometry.num_key_value_heads) == (512, 1)


def test_quoted_released_config_reads():
    contract = _contract(_config(GEMMA4_RELEASED_CONFIG))
    assert contract.taps.target_layer_ids == [5, 17, 29, 41, 46]
    assert contract.taps.feature_width == 5 * 3840
    assert contract.block.mask_token_id == 4


# --- unused fields are never used ------------------------------------------------------------

@pytest.mark.parametrize("field,value", [
    ("head_dim", 999), ("sliding_window", 3), ("num_key_value_heads", 3),
    ("vocab_size_per_layer_input", 7), ("use_bidirectional_attention", None),
])
def test_inherited_fields_are_recorded_never_used(field, value):
    base = _config()
    cfg = dict(base, **{field: value})
    a, b = _contract(base), _contract(cfg)
    assert a.model_dump(exclude={"inherited_unused"}) == b.model_dump(exclude={"inherited_unused"})
    assert b.inherited_unused.get(field) == value


def test_sliding_rope_and_top_level_rope_are_never_read():
    cfg = _config()
    cfg["rope_parameters"] = dict(cfg["rope_parameters"], rope_type="yarn", rope_theta=1.0,
                                  sliding_attention={"rope_type": "llama3", "rope_theta": -1.0})
    assert _contract(cfg).rope == _contract(_config()).rope


def test_without_k_eq_v_the_kv_heads_are_num_key_value_heads_and_v_proj_is_required():
    cfg = dict(_config(), attention_k_eq_v=False)
    c = _contract(cfg)
    assert (c.geometry.num_key_value_heads, c.geometry.key_value_heads_from) == (2, "num_key_value_heads")
    specs = {t.source_name: t.shape for t in c.tensors}
    assert specs["layers.0.self_attn.v_proj.weight"] == [2 * 32, 64]
    assert specs["layers.0.self_attn.k_proj.weight"] == [2 * 32, 64]


# --- refusals, each with its own code ----------------------------------------------------------

def _edit(**changes):
    def edit(cfg):
        for key, value in changes.items():
            if value is _DROP:
                cfg.pop(key)
            else:
                cfg[key] = value
    return edit


_DROP = object()


def _rope_full(entry):
    def edit(cfg):
        cfg["rope_parameters"] = dict(cfg["rope_parameters"])
        if entry is _DROP:
            cfg["rope_parameters"].pop("full_attention")
        else:
            cfg["rope_parameters"]["full_attention"] = entry
    return edit


REFUSALS = [
    ("moe", _edit(enable_moe_block=True), E.MoEBlockError, ["enable_moe_block"]),
    ("per-layer-input", _edit(hidden_size_per_layer_input=256), E.PerLayerInputError,
     ["hidden_size_per_layer_input", "256"]),
    ("final-layer-tap", _edit(target_layer_ids=[0, 2, 5]), E.FinalLayerTapError,
     ["target_layer_ids[2]", "final layer", "[0, 4]"]),
    ("rope-yarn", _rope_full({"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}),
     E.RopeTypeError, ["rope_parameters.full_attention.rope_type", "yarn"]),
    ("rope-missing", _rope_full(_DROP), E.RopeTypeError, ["rope_parameters.full_attention"]),
    ("rope-default-with-factor", _rope_full({"rope_type": "default", "rope_theta": 1e6,
                                             "partial_rotary_factor": 0.25}),
     E.RopeTypeError, ["partial_rotary_factor"]),
    ("rope-factor-above-one", _rope_full({"rope_type": "proportional", "rope_theta": 1e6,
                                          "partial_rotary_factor": 1.5}),
     E.GeometryLimitError, ["partial_rotary_factor", "1.5"]),
    # transformers divides every proportional frequency by 'factor': only 1 is computed.
    ("rope-scaled", _rope_full({"rope_type": "proportional", "rope_theta": 1e6,
                                "partial_rotary_factor": 0.25, "factor": 8.0}),
     E.RopeTypeError, ["rope_parameters.full_attention.factor", "8.0"]),
    ("rope-theta-string", _rope_full({"rope_type": "proportional", "rope_theta": "1e6"}),
     E.ConfigError, ["rope_theta"]),
    ("no-global-head-dim", _edit(global_head_dim=_DROP), E.ConfigError,
     ["global_head_dim", "missing", "gemma4-dspark"]),
    ("global-head-dim-odd", _edit(global_head_dim=33), E.GeometryLimitError, ["global_head_dim", "even"]),
    ("global-kv-null", _edit(num_global_key_value_heads=None), E.ConfigError,
     ["num_global_key_value_heads", "null"]),
    ("global-kv-not-dividing", _edit(num_global_key_value_heads=3), E.GeometryLimitError,
     ["num_global_key_value_heads", "3"]),
    ("model-type-gemma3", _edit(model_type="gemma3_text"), E.ConfigError, ["model_type", "gemma3_text"]),
    ("target-model-type-qwen3", _edit(target_model_type="qwen3"), E.ConfigError,
     ["target_model_type", "qwen3", "gemma4_unified"]),
    ("target-text-model-type-missing", _edit(target_text_model_type=_DROP), E.ConfigError,
     ["target_text_model_type", "missing"]),
    ("activation-silu", _edit(hidden_activation="silu"), E.UnsupportedFeatureError,
     ["hidden_activation", "silu", "gelu_pytorch_tanh"]),
    ("sliding-draft-layer", _edit(layer_types=["full_attention", "sliding_attention"]),
     E.UnsupportedFeatureError, ["layer_types", "sliding_attention"]),
    ("attention-bias", _edit(attention_bias=True), E.UnsupportedFeatureError, ["attention_bias"]),
    ("double-wide", _edit(use_double_wide_mlp=True, num_kv_shared_layers=1),
     E.UnsupportedFeatureError, ["use_double_wide_mlp"]),
    ("softcap-negative", _edit(final_logit_softcapping=-30.0), E.GeometryLimitError,
     ["final_logit_softcapping"]),
    ("k-eq-v-string", _edit(attention_k_eq_v="true"), E.ConfigError, ["attention_k_eq_v"]),
    ("mask-out-of-vocab", _edit(mask_token_id=512), E.MaskTokenError, ["mask_token_id", "512"]),
    ("tap-minus-one", _edit(target_layer_ids=[-1, 2, 4]), E.TargetLayerError, ["target_layer_ids[0]"]),
    ("two-architectures", _edit(architectures=["Gemma4DSparkModel", "Gemma4ForCausalLM"]),
     E.UnsupportedArchitectureError, ["architectures", "Gemma4ForCausalLM"]),
]


@pytest.mark.parametrize("name,edit,error,needles", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_refused_with_its_own_code_nothing_written(tmp_path, name, edit, error, needles):
    src = tmp_path / "src"
    shutil.copytree(DSPARK, src)
    cfg = _config()
    edit(cfg)
    (src / "config.json").write_text(json.dumps(cfg))
    before = sorted(p.name for p in tmp_path.iterdir())
    for command in (["inspect", str(src)], ["convert", str(src), "-o", str(tmp_path / "out")]):
        proc = run_cli(*command)
        assert_refused(proc, error, ["config.json", *needles])
        assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_own_codes_are_distinct():
    codes = [E.MoEBlockError, E.PerLayerInputError, E.FinalLayerTapError, E.RopeTypeError,
             E.KEqVMismatchError, E.TargetFamilyError, E.FamilyRuntimeError,
             E.FamilyQuantizeError, E.FamilyExportError]
    assert len({c.exit_code for c in codes}) == len(codes)
    assert all(c.__name__ == E.EXIT_CODES[c.exit_code] for c in codes)


# --- the tensors against attention_k_eq_v --------------------------------------------------

def test_v_proj_under_k_eq_v_refused(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(DSPARK, src)
    tensors = load_file(src / "model.safetensors")
    tensors["layers.1.self_attn.v_proj.weight"] = torch.zeros(32, 64, dtype=torch.bfloat16)
    save_file(tensors, src / "model.safetensors")
    result = inspect_path(src)
    assert result.problem["error"] == "KEqVMismatchError"
    assert result.problem_exit_code == E.KEqVMismatchError.exit_code
    assert_refused(run_cli("inspect", str(src)), E.KEqVMismatchError,
                   ["layers.1.self_attn.v_proj.weight", "attention_k_eq_v"])


def test_k_eq_v_false_without_v_proj_refused(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(DSPARK, src)
    (src / "config.json").write_text(json.dumps(dict(_config(), attention_k_eq_v=False,
                                                     num_key_value_heads=1)))
    assert_refused(run_cli("inspect", str(src)), E.KEqVMismatchError,
                   ["attention_k_eq_v false", "v_proj"])


def test_a_dropped_layer_scalar_is_missing(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(DSPARK, src)
    tensors = load_file(src / "model.safetensors")
    del tensors["layers.0.layer_scalar"]
    save_file(tensors, src / "model.safetensors")
    assert_refused(run_cli("inspect", str(src)), E.MissingTensorError, ["layers.0.layer_scalar", "[1]"])


def test_convert_writes_the_family(tmp_path):
    out = tmp_path / "out"
    proc = run_cli("convert", str(DSPARK), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["drafter.gguf", "manifest.json"]


def test_canary_as_a_real_process(tmp_path):
    """The real `dspark` console script: inspect exits 0 with the family; a refusal is
    one line with its own code and no traceback, nothing written."""
    from support.cli import run_process

    shown = run_process("inspect", str(DSPARK))
    assert shown.returncode == 0 and "gemma4-dspark" in shown.stdout, shown.stderr
    src = tmp_path / "src"
    shutil.copytree(DSPARK, src)
    (src / "config.json").write_text(json.dumps(dict(_config(), enable_moe_block=True)))
    refused = run_process("convert", str(src), "-o", str(tmp_path / "out"))
    assert_refused(refused, E.MoEBlockError, ["enable_moe_block"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]
