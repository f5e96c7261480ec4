"""A scheduler's recorded decisions against the policy they claim (scheduling/
scheduler_check.py; docs/SCHEDULING.md "Checking a scheduler's decisions"): a run each policy
made passes, with every step checked; a dspark scheduler that skips Algorithm 1's stop is
named so (Appendix A); a dspark-async scheduler whose budget comes from step n-1 is named
for its fresher confidences; a plain difference names step, request, expected and found;
through the CLI a difference is exit 147 with the report written, a conforming file 0."""

from __future__ import annotations

import json

import pytest
from support.cli import assert_refused, run_cli
from support.decisions import (
    COSTS,
    as_bytes,
    async_from_previous_step,
    of_policy,
    record,
    retrospective,
)

from dspark_convert.errors import SchedulerMismatchError, SchedulingPolicyError
from dspark_convert.scheduling.cost_table import write_cost_table
from dspark_convert.scheduling.decisions import parse_decisions
from dspark_convert.scheduling.policies import parse_policy
from dspark_convert.scheduling.scheduler_check import check_decisions, mismatch_error

POLICIES = ["full", "threshold=0.6", "dspark", "dspark-async", "target-only"]


def decisions(lines):
    return parse_decisions(as_bytes(lines), label="decisions d.jsonl", path="d.jsonl")


@pytest.mark.parametrize("spec", POLICIES)
def test_a_run_of_the_policy_conforms(spec):
    d = decisions(record(of_policy(spec), spec))
    check = check_decisions(d, parse_policy(spec), COSTS)
    assert check.conforms and check.first_difference is None
    assert check.steps_checked == len(d.lines) == 24
    assert mismatch_error(check) is None


def test_skipping_algorithm_1s_stop_is_named():
    d = decisions(record(retrospective(), "dspark"))
    check = check_decisions(d, parse_policy("dspark"), COSTS)
    diff = check.first_difference
    assert diff is not None
    assert "the stop was skipped" in diff.why and "retrospective search, not lossless" in diff.why
    # The step named is the first whose lengths differ from Algorithm 1's, computed here.
    first = next(n for n, line in enumerate(d.lines)
                 if tuple(r.length for r in line.requests)
                 != of_policy("dspark")(tuple(r.confidence for r in line.requests), []))
    assert diff.step == first and check.steps_checked == first + 1
    assert diff.found == d.lines[first].requests[diff.index].length != diff.expected
    error = mismatch_error(check, path="d.jsonl")
    assert error.exit_code == 147 and f"step {first}" in error.message
    assert repr(diff.request) in error.message and "\n" not in error.message


def test_a_dspark_async_budget_from_step_n_minus_1_is_named():
    d = decisions(record(async_from_previous_step(), "dspark-async"))
    check = check_decisions(d, parse_policy("dspark-async"), COSTS)
    diff = check.first_difference
    assert diff is not None and diff.step >= 2
    assert "fresher confidences than §5.2 allows" in diff.why
    assert f"step {diff.step - 1} instead of {diff.step - 2}" in diff.why


def test_algorithm_1_wrong_without_being_the_retrospective_search():
    """A scheduler that verifies one token more than Algorithm 1 on one request."""
    lines = record(of_policy("dspark"), "dspark")
    step = json.loads(lines[5])
    request = next(r for r in step["requests"] if r["length"] < len(r["confidence"]))
    request["length"] += 1
    lines[5] = json.dumps(step)
    check = check_decisions(decisions(lines), parse_policy("dspark"), COSTS)
    diff = check.first_difference
    assert (diff.step, diff.request, diff.found, diff.expected) == \
        (5, request["id"], request["length"], request["length"] - 1)
    assert "a length Algorithm 1 would not choose: more" in diff.why


def test_a_threshold_difference_is_the_plain_difference():
    lines = record(of_policy("threshold=0.6"), "threshold=0.6")
    check = check_decisions(decisions(lines), parse_policy("threshold=0.5"), COSTS)
    diff = check.first_difference
    line = json.loads(lines[diff.step])["requests"][diff.index]
    below = [k for k, c in enumerate(line["confidence"]) if c < 0.5]
    assert diff.expected == (below[0] if below else len(line["confidence"]))
    assert diff.found == line["length"]
    assert diff.why == "threshold=0.5 verifies the longest prefix whose confidences are each >= 0.5"


def test_a_policy_needing_confidences_on_a_line_without_them_is_refused():
    line = {"step": 0, "policy": "full", "requests": [
        {"id": "a", "confidence": [], "length": 7, "accepted": 3}]}
    d = decisions([json.dumps(line)])
    assert check_decisions(d, parse_policy("full"), COSTS).conforms
    with pytest.raises(SchedulingPolicyError) as info:
        check_decisions(d, parse_policy("dspark"), COSTS)
    assert "step 0" in info.value.message and "'a'" in info.value.message


def test_cli_check_exit_codes_and_report(tmp_path):
    cost = write_cost_table(COSTS, tmp_path / "cost.json")
    good = tmp_path / "good.jsonl"
    good.write_bytes(as_bytes(record(of_policy("dspark"), "dspark")))
    proc = run_cli("simulate", str(good), "--cost-table", str(cost), "--check", "dspark")
    assert proc.returncode == 0, proc.stderr
    assert "24 steps checked" in proc.stdout and "CONFORMS" in proc.stdout

    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(as_bytes(record(retrospective(), "dspark")))
    report = tmp_path / "report.json"
    proc = run_cli("simulate", str(bad), "--cost-table", str(cost), "--check", "dspark",
                   "-o", str(report))
    line = assert_refused(proc, SchedulerMismatchError, ["the stop was skipped"])
    assert SchedulerMismatchError.exit_code == 147 and "step " in line
    written = json.loads(report.read_text())
    assert written["mode"] == "check" and written["check"]["first_difference"]["why"] \
        .startswith("the stop was skipped")

    proc = run_cli("simulate", str(bad), "--cost-table", str(cost), "--check", "dspark", "--json")
    doc = json.loads(proc.stdout)
    assert proc.returncode == 147 and doc["ok"] is False and doc["exit_code"] == 147
