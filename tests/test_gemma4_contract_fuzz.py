"""Fuzzing the Gemma4 family's config reader from the file up (contract/gemma4.py through
source.read_contract, the table's choice by architectures included): byte edits of
DeepSeek's own Gemma4 drafter config, any JSON value in its structured fields, and
near-valid geometry at the edges carried on through the tensor inventory and the k_eq_v
check. The property, as tests/test_contract_fuzz.py's for Qwen3: a contract or one of our
errors (one line, naming config.json), never another exception, never slow."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.fuzz import fuzz_settings, json_values
from support.gemma4 import GEMMA4_DRAFTERS

from dspark_convert import errors
from dspark_convert.contract.dspark import MAX_DRAFT_LAYERS
from dspark_convert.contract.gemma4 import build_contract, check_tensors, parse_config
from dspark_convert.contract.inventory import check_inventory
from dspark_convert.source.checkpoint import read_contract

pytestmark = pytest.mark.slow

MAX_SECONDS_PER_EXAMPLE = 1.0
TEXT = (GEMMA4_DRAFTERS["gemma4_vanilla_conf_markov"] / "config.json").read_bytes()
fuzz = fuzz_settings


@pytest.fixture(scope="module")
def checkpoint_dir():
    with tempfile.TemporaryDirectory(prefix="dspark-gemma4-fuzz-") as d:
        yield Path(d)


def check_read(directory: Path, content: bytes):
    (directory / "config.json").write_bytes(content)
    start = time.perf_counter()
    try:
        _raw, _family, _cfg, contract = read_contract(directory)
    except errors.DSparkError as exc:
        assert type(exc) in errors.concrete_errors() and "\n" not in exc.message
        assert exc.message.startswith(str(directory / "config.json")), exc.message
        contract = None
    assert time.perf_counter() - start < MAX_SECONDS_PER_EXAMPLE
    if contract is not None:
        assert 1 <= contract.geometry.num_draft_layers <= MAX_DRAFT_LAYERS
        assert all(d > 0 for t in contract.tensors for d in t.shape)
    return contract


def test_the_real_config_reads(checkpoint_dir):
    assert check_read(checkpoint_dir, TEXT).family == "gemma4-dspark"


@fuzz(300)
@given(edits=st.lists(st.tuples(st.sampled_from(["flip", "insert", "delete", "set"]),
                                st.integers(0, len(TEXT) - 1), st.integers(0, 255)),
                      min_size=1, max_size=6))
def test_byte_edits_of_the_real_config(checkpoint_dir, edits):
    buf = bytearray(TEXT)
    for op, pos, byte in edits:
        pos %= max(len(buf), 1)
        if op == "flip":
            buf[pos] ^= 1 << (byte % 8)
        elif op == "insert":
            buf.insert(pos, byte)
        elif op == "delete" and buf:
            del buf[pos]
        elif buf:
            buf[pos] = byte
    check_read(checkpoint_dir, bytes(buf))


@fuzz(200)
@given(doc=json_values,
       field=st.sampled_from(["rope_parameters", "architectures", "target_layer_ids", "layer_types",
                              "global_head_dim", "num_global_key_value_heads", "attention_k_eq_v",
                              "final_logit_softcapping", "hidden_activation", "model_type",
                              "enable_moe_block", "hidden_size_per_layer_input"]))
def test_structured_fields_hold_anything(checkpoint_dir, doc, field):
    cfg = json.loads(TEXT)
    cfg[field] = doc
    check_read(checkpoint_dir, json.dumps(cfg).encode())


EDGE_INTS = st.sampled_from([0, 1, 2, 3, 7, 8, 31, 32, 33, 63, 64, 65, 127, 128, 129, 512,
                             2**31, 2**32, 2**63 - 1, 2**64, -1, -(2**63), 10**30])
GEOMETRY = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "num_global_key_value_heads", "global_head_dim", "head_dim",
            "vocab_size", "num_target_layers", "block_size", "mask_token_id", "markov_rank"]


@fuzz(300)
@given(changes=st.dictionaries(st.sampled_from(GEOMETRY), EDGE_INTS | st.integers(-2, 300),
                               max_size=4),
       k_eq_v=st.booleans(),
       factor=st.sampled_from([None, 0.25, 1.0, 0.0, 1e-9, 0.5]))
def test_near_valid_geometry_through_the_inventory(changes, k_eq_v, factor):
    cfg = json.loads(TEXT)
    cfg.update(changes, attention_k_eq_v=k_eq_v)
    full = dict(cfg["rope_parameters"]["full_attention"])
    full.pop("partial_rotary_factor")
    if factor is not None:
        full["partial_rotary_factor"] = factor
    cfg["rope_parameters"] = dict(cfg["rope_parameters"], full_attention=full)
    start = time.perf_counter()
    try:
        contract = build_contract(parse_config(cfg), raw=cfg)
    except errors.ContractViolation as exc:
        assert "\n" not in exc.message and exc.message.startswith("config.json")
        assert time.perf_counter() - start < MAX_SECONDS_PER_EXAMPLE
        return
    assert 0 <= contract.rope.rotated_pairs <= contract.geometry.head_dim // 2
    inventory = {t.source_name: ("BF16", list(t.shape)) for t in contract.tensors}
    check_tensors(contract, set(inventory), path="m")
    assert check_inventory(contract, inventory, path="m") == "BF16"
    victim = contract.tensors[-1].source_name
    bad = dict(inventory, **{victim: ("BF16", inventory[victim][1] + [1])})
    with pytest.raises(errors.DSparkError) as refused:
        check_inventory(contract, bad, path="m")
    assert refused.value.tensor == victim or refused.value.field is not None
    assert time.perf_counter() - start < MAX_SECONDS_PER_EXAMPLE
