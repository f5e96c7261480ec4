"""runtime/trace.py: reading reference.json and naming the first divergence."""

from __future__ import annotations

import copy
import json

import pytest

from conftest import GOLDEN
from dspark_convert.errors import ReferenceDivergenceError, ReferenceTraceError
from dspark_convert.runtime.trace import (
    compare_run,
    find_reference_run,
    implied_max_new_tokens,
    load_reference,
)

REFERENCE = GOLDEN / "reference" / "vanilla_conf_markov" / "reference.json"


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
