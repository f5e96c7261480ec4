"""Fuzzing the config contract from the file up, as `dspark convert` reads it.

tests/test_contract.py already feeds arbitrary JSON values to parse_config/build_contract.
This file adds the layers around them: config.json as raw bytes (``source.load_config``:
size cap, UTF-8, strict JSON, the model, the rules), byte edits of a real DeepSpec config,
and near-valid geometry at the edges (zero, negative, 2^63, huge taps lists) carried on
through the tensor inventory check. The property: a result or one of our errors (one line),
never another exception, and never slow (each example is timed: a parser that loops or
allocates by a field's value fails here).

The default run is short; DSPARK_FUZZ_EXAMPLES raises every example count (`make fuzz`).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import pytest
from conftest import REFERENCE_DRAFTER
from hypothesis import given
from hypothesis import strategies as st
from support.fuzz import fuzz_settings, json_values

from dspark_convert import errors
from dspark_convert.contract.inventory import check_inventory
from dspark_convert.contract.dspark import MAX_DRAFT_LAYERS, build_contract, parse_config
from dspark_convert.source.checkpoint import load_config
from dspark_convert.synthetic import synthetic_config

# Property tests: hundreds of generated examples per property, several seconds a module:
# `make test` (and `make fuzz`, longer) runs them; the fast loop leaves them out.
pytestmark = pytest.mark.slow

# Timing is asserted per example rather than by hypothesis' deadline, which reports a slow
# first run on a busy machine as flaky.
MAX_SECONDS_PER_EXAMPLE = 1.0
REFERENCE_TEXT = (REFERENCE_DRAFTER / "config.json").read_bytes()
fuzz = fuzz_settings     # DSPARK_FUZZ_EXAMPLES or the default count, no deadline, no database


@pytest.fixture(scope="module")
def checkpoint_dir():
    with tempfile.TemporaryDirectory(prefix="dspark-contract-fuzz-") as d:
        yield Path(d)


def check_load(directory: Path, content: bytes):
    """The property for config.json bytes; returns the contract or None when refused."""
    (directory / "config.json").write_bytes(content)
    start = time.perf_counter()
    try:
        _raw, _cfg, contract = load_config(directory)
    except errors.DSparkError as exc:
        assert type(exc) in errors.concrete_errors() and "\n" not in exc.message
        assert exc.message.startswith(str(directory / "config.json")), exc.message
        contract = None
    assert time.perf_counter() - start < MAX_SECONDS_PER_EXAMPLE
    if contract is not None:
        assert 1 <= contract.geometry.num_draft_layers <= MAX_DRAFT_LAYERS
        assert all(d > 0 for t in contract.tensors for d in t.shape)
    return contract


def test_reference_config_loads(checkpoint_dir):
    assert check_load(checkpoint_dir, REFERENCE_TEXT) is not None


@fuzz(300)
@given(content=st.binary(max_size=512))
def test_arbitrary_bytes(checkpoint_dir, content):
    check_load(checkpoint_dir, content)


@fuzz(300)
@given(edits=st.lists(st.tuples(st.sampled_from(["flip", "insert", "delete", "set"]),
                                st.integers(0, len(REFERENCE_TEXT) - 1), st.integers(0, 255)),
                      min_size=1, max_size=6))
def test_byte_edits_of_a_real_config(checkpoint_dir, edits):
    buf = bytearray(REFERENCE_TEXT)
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
    check_load(checkpoint_dir, bytes(buf))


# Values at the edges of every limit the contract applies, and a few absurd ones.
EDGE_INTS = st.sampled_from([0, 1, 2, 3, 7, 8, 63, 64, 65, 127, 128, 129, 255, 256, 2**31 - 1,
                             2**31, 2**32, 2**63 - 1, 2**63, 2**64, -1, -(2**63), 10**30])
GEOMETRY = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "vocab_size", "num_target_layers", "block_size",
            "mask_token_id", "markov_rank"]
TAPS = st.lists(EDGE_INTS | st.integers(-3, 70), max_size=70)


@fuzz(400)
@given(changes=st.dictionaries(st.sampled_from(GEOMETRY), EDGE_INTS | st.integers(-2, 300),
                               max_size=4),
       taps=st.none() | TAPS,
       head=st.sampled_from([None, "vanilla", "gated", "rnn"]),
       conf=st.sampled_from([(True, True), (True, False), (False, None)]))
def test_near_valid_geometry_through_the_inventory(changes, taps, head, conf):
    cfg = synthetic_config(markov_head_type=head or "vanilla", enable_confidence_head=conf[0],
                           confidence_head_with_markov=conf[1])
    cfg.update(changes)
    if taps is not None:
        cfg["target_layer_ids"] = taps
    if head is None:
        cfg.pop("markov_head_type", None)
    start = time.perf_counter()
    try:
        contract = build_contract(parse_config(cfg))
    except errors.ContractViolation as exc:
        assert "\n" not in exc.message and exc.message.startswith("config.json")
        assert time.perf_counter() - start < MAX_SECONDS_PER_EXAMPLE
        return
    # Accepted: its own inventory passes, and one changed tensor is refused by name.
    inventory = {t.source_name: ("BF16", list(t.shape)) for t in contract.tensors}
    assert check_inventory(contract, inventory, path="m") == "BF16"
    victim = contract.tensors[-1].source_name
    bad = dict(inventory, **{victim: ("BF16", inventory[victim][1] + [1])})
    with pytest.raises(errors.DSparkError) as refused:
        check_inventory(contract, bad, path="m")
    assert refused.value.tensor == victim or refused.value.field is not None
    assert time.perf_counter() - start < MAX_SECONDS_PER_EXAMPLE


@fuzz(200)
@given(doc=json_values,
       field=st.sampled_from(["rope_parameters", "architectures", "target_layer_ids", "dtype",
                              "torch_dtype", "rope_theta", "layer_types", "rms_norm_eps"]))
def test_structured_fields_hold_anything(checkpoint_dir, doc, field):
    """Fields with structure (objects, lists, strings) replaced by any JSON value."""
    cfg = json.loads(REFERENCE_TEXT)
    cfg[field] = doc
    check_load(checkpoint_dir, json.dumps(cfg).encode())
