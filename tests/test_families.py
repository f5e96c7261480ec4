"""contract/families.py: a family is data, chosen by config.json's ``architectures`` and
never by ``model_type``; each row names its reader, contract builder and tensor table."""

from __future__ import annotations

import json

import pytest

from conftest import REFERENCE_DRAFTER
from support.gemma4 import GEMMA4_DRAFTERS
from dspark_convert import errors as E
from dspark_convert.contract import dspark, gemma4
from dspark_convert.contract.families import (ASSISTANT, DFLASH2, FAMILIES, GEMMA4, QWEN3,
                                              family_named, family_of)
from dspark_convert.contract.tensor_table import GEMMA4_TENSOR_RULES, TENSOR_RULES
from dspark_convert.source.checkpoint import read_contract

QWEN3_CFG = json.loads((REFERENCE_DRAFTER / "config.json").read_text())
GEMMA4_CFG = json.loads((GEMMA4_DRAFTERS["gemma4_vanilla_conf_markov"] / "config.json").read_text())


def test_the_table():
    assert set(FAMILIES) == {"Qwen3DSparkModel", "Gemma4DSparkModel", "DFlash2DraftModel",
                             "Gemma4UnifiedAssistantForCausalLM"}
    # The kind tells eval and export apart (never the family name).
    assert {f.name: f.kind for f in FAMILIES.values()} == {
        "qwen3-dspark": "dspark", "gemma4-dspark": "dspark", "qwen3-dflash2": "dflash2",
        "gemma4-assistant": "mtp"}
    # They draft in their own loops: conform (DeepSeek's block drafter) and the DeepSpec
    # export are not theirs; speculators saves DFlash2 drafters, not assistants.
    assert DFLASH2.artifact_commands == {"smoke", "eval", "export", "export-speculators"}
    assert ASSISTANT.artifact_commands == {"smoke", "eval", "export"}
    assert DFLASH2.needs_target and ASSISTANT.needs_target and not QWEN3.needs_target
    assert (QWEN3.parse_config, QWEN3.build_contract, QWEN3.tensor_rules) == \
        (dspark.parse_config, dspark.build_contract, TENSOR_RULES)
    assert GEMMA4.parse_config is gemma4.parse_config and GEMMA4.tensor_rules is GEMMA4_TENSOR_RULES
    assert QWEN3.artifact_commands == {"smoke", "eval", "quantize", "export", "export-deepspec",
                                       "export-speculators", "conform"}
    # llama.cpp 0c1e570 runs no Gemma4 DSpark drafter with its softcap: export is refused.
    assert GEMMA4.artifact_commands == {"smoke", "eval", "quantize", "export-deepspec", "conform"}
    assert (QWEN3.runtime, GEMMA4.runtime) == (
        "dspark_convert.runtime.qwen3", "dspark_convert.runtime.gemma4")
    # Each family's targets are read by its own module (target/qwen3.py, target/gemma4.py).
    assert (QWEN3.target_reader, GEMMA4.target_reader) == (
        "dspark_convert.target.qwen3", "dspark_convert.target.gemma4")


@pytest.mark.parametrize("cfg,family", [(QWEN3_CFG, QWEN3), (GEMMA4_CFG, GEMMA4)])
def test_each_fixture_reads_as_its_family(cfg, family):
    assert family_of(cfg, path="config.json") is family
    contract = family.build_contract(family.parse_config(cfg, path="config.json"), path="config.json")
    assert family_named(contract.family) is family


@pytest.mark.parametrize("model_type", ["qwen3", "gemma4_text", "gemma4_unified_text", None])
def test_model_type_never_chooses(model_type):
    assert family_of(dict(GEMMA4_CFG, model_type=model_type), path="c") is GEMMA4
    assert family_of(dict(QWEN3_CFG, model_type=model_type), path="c") is QWEN3


def test_unknown_architecture_names_the_families():
    with pytest.raises(E.UnsupportedArchitectureError) as exc:
        family_of(dict(QWEN3_CFG, architectures=["Llama4DSparkModel"]), path="config.json")
    assert "Qwen3DSparkModel" in exc.value.message and "Gemma4DSparkModel" in exc.value.message


def test_the_other_gemma4_assistant_class_is_refused_by_name():
    """transformers' Gemma4AssistantForCausalLM (gemma4_text) is not read as the unified one."""
    with pytest.raises(E.UnsupportedArchitectureError) as exc:
        family_of(dict(QWEN3_CFG, architectures=["Gemma4AssistantForCausalLM"]), path="c")
    assert "Gemma4UnifiedAssistantForCausalLM" in exc.value.message
    assert exc.value.exit_code == 14


@pytest.mark.parametrize("archs", [None, "Qwen3DSparkModel", [], [7]])
def test_malformed_architectures_left_to_the_qwen3_reader_as_before(archs):
    cfg = dict(QWEN3_CFG, architectures=archs)
    assert family_of(cfg, path="c") is QWEN3
    with pytest.raises((E.ConfigError, E.UnsupportedArchitectureError)):
        QWEN3.build_contract(QWEN3.parse_config(cfg, path="c"), path="c")


def test_read_contract_through_the_table():
    _raw, family, _cfg, contract = read_contract(REFERENCE_DRAFTER)
    assert family is QWEN3 and contract.family == "qwen3-dspark"
    _raw, family, _cfg, contract = read_contract(GEMMA4_DRAFTERS["gemma4_dflash"])
    assert family is GEMMA4 and contract.family == "gemma4-dspark"
