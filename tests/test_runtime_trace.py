"""runtime/trace.py: reading reference.json and naming the first divergence."""

from __future__ import annotations

import copy
import json

import pytest

from support.paths import REFERENCE_TRACE as REFERENCE
from dspark_convert.errors import ReferenceDivergenceError, ReferenceTraceError
from dspark_convert.runtime.trace import (
    Agreement,
    agreement,
    compare_run,
    find_reference_run,
    implied_max_new_tokens,
    load_reference,
    trace_to_json,
)



def test_reads_the_golden_reference():
    runs = load_reference(REFERENCE)
    assert [(r.temperature, r.confidence_threshold) for r in runs] == [
        (0.0, 0.0), (0.0, 0.5), (1.0, 0.0)] * 2
    assert all(implied_max_new_tokens(r, (2,)) == 24 for r in runs)
    assert find_reference_run(runs, list(runs[4].prompt), 0.0, 0.5, path="r").index == 4
    with pytest.raises(ReferenceTraceError, match="no run for prompt"):
        find_reference_run(runs, [1, 2, 3], 0.0, 0.0, path="r")


@pytest.mark.parametrize("text, match", [
    ("{", "not valid JSON"),
    ('{"runs": []}', "non-empty 'runs'"),
    ('{"runs": [{"prompt": [1], "output_ids": [1], "acceptance_lengths": [], "temperature": 0, '
     '"confidence_threshold": 0, "cycles": [{"proposed": "x"}]}]}', r"runs\[0\].cycles\[0\]"),
    ('{"runs": [{"prompt": [1], "output_ids": [1], "acceptance_lengths": [], "temperature": "0", '
     '"confidence_threshold": 0, "cycles": []}]}', r"runs\[0\].temperature"),
])
def test_refuses_malformed_references(tmp_path, text, match):
    path = tmp_path / "reference.json"
    path.write_text(text)
    with pytest.raises(ReferenceTraceError, match=match) as info:
        load_reference(path)
    assert info.value.exit_code == 77


def test_a_missing_reference(tmp_path):
    with pytest.raises(ReferenceTraceError, match="not found"):
        load_reference(tmp_path / "none.json")


def _as_ours(ref):
    return copy.deepcopy({k: ref.data[k] for k in ("cycles", "acceptance_lengths", "output_ids")})


@pytest.mark.parametrize("field, change", [
    ("proposed", lambda c: c["proposed"].__setitem__(1, 7)),
    ("accepted", lambda c: c.__setitem__("accepted", c["accepted"] + 1)),
    ("next_token", lambda c: c.__setitem__("next_token", 0)),
    ("confidence_logits", lambda c: c["confidence_logits"].__setitem__(0, c["confidence_logits"][0] + 0.01)),
])
def test_names_run_cycle_and_field(field, change):
    ref = load_reference(REFERENCE)[3]
    ours = _as_ours(ref)
    compare_run(ours, ref, label="prompt 1", path="ref.json")        # identical: passes
    change(ours["cycles"][2])
    with pytest.raises(ReferenceDivergenceError) as info:
        compare_run(ours, ref, label="prompt 1", path="ref.json")
    assert f"runs[3]: cycle 2: {field}" in info.value.message
    assert info.value.exit_code == 75 and "\n" not in info.value.message


def test_confidence_within_tolerance_and_extra_cycles():
    ref = load_reference(REFERENCE)[0]
    ours = _as_ours(ref)
    ours["cycles"][0]["confidence_logits"][0] += 5e-4               # float noise: accepted
    compare_run(ours, ref, label="p", path="r")
    ours["cycles"].append(json.loads(json.dumps(ours["cycles"][-1])))
    with pytest.raises(ReferenceDivergenceError, match="13 cycles, the reference has 12"):
        compare_run(ours, ref, label="p", path="r")


def test_the_trace_records_its_dtype(tmp_path):
    doc = trace_to_json([load_reference(REFERENCE)[0].data], case="c", target="t", dtype="bfloat16")
    assert doc["dtype"] == "bfloat16"
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(doc))
    assert {r.dtype for r in load_reference(path)} == {"bfloat16"}
    # DeepSpec's own traces carry no dtype: they are float32 runs.
    assert "dtype" not in json.loads(REFERENCE.read_text())
    assert {r.dtype for r in load_reference(REFERENCE)} == {"float32"}


@pytest.mark.parametrize("dtype", ["float16", ["float32"], 32])
def test_refuses_an_unknown_trace_dtype(tmp_path, dtype):
    doc = json.loads(REFERENCE.read_text())
    doc["dtype"] = dtype
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ReferenceTraceError, match="dtype: expected one of float32, bfloat16") as info:
        load_reference(path)
    assert info.value.exit_code == 77


def test_agreement_counts_tokens_and_confidence_apart():
    """What a bfloat16 run against a float32 trace reports: the leading cycles with the same
    tokens (confidence logits may move more than the float32 tolerance), the leading new
    tokens, the worst confidence difference over those cycles and the first difference."""
    ref = load_reference(REFERENCE)[3]
    ours = _as_ours(ref)
    assert agreement(ours, ref, label="p", path="r") == Agreement(
        reference_dtype="float32", identical=True, cycles=len(ref.data["cycles"]),
        cycles_tokens_identical=len(ref.data["cycles"]), confidence_max_abs_difference=0.0,
        new_tokens=24, new_tokens_identical=24, first_difference=None)
    ours["cycles"][0]["confidence_logits"][1] += 0.01            # beyond the tolerance
    ours["cycles"][3]["proposed"][0] += 1
    ours["output_ids"][len(ref.prompt) + 5] += 1
    a = agreement(ours, ref, label="p", path="r")
    assert not a.identical and a.cycles_tokens_identical == 3 and a.new_tokens_identical == 5
    assert a.confidence_max_abs_difference == pytest.approx(0.01)
    assert a.first_difference.startswith("p vs reference r runs[3]: cycle 0: confidence_logits")
