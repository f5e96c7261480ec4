"""Every hostile input of tests/hostile/simulate_corpus.py through the real CLI.

`dspark simulate CASE/decisions.jsonl --cost-table CASE/cost.json OPTIONS -o OUT --json`,
in-process (tests/support/cli.py); a canary of each kind also as a real `dspark` process.
The rule for bad input: the intended error class (named in the JSON document) and its exit
code, one `error:` line (naming the file, and for a line's fault the line), no traceback,
and nothing written: no report, no temporary sibling, the case's files unchanged."""

from __future__ import annotations

import json
import os

import pytest
from hostile import simulate_corpus
from support.cli import assert_refused, run_cli, run_process, temp_siblings

from dspark_convert import errors

CASES = {case.name: case for case in simulate_corpus.CASES}
CANARIES = ["file-fifo", "json-duplicate-key", "accepted-past-length", "cost-too-small",
            "option-concurrency-zero", "trace-runs-not-list"]


def snapshot(directory):
    out = {}
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if os.path.isdir(path):
            out[name] = "dir"
        elif not os.path.isfile(path):
            out[name] = "special"
        elif os.path.getsize(path) > 1 << 20:
            out[name] = os.path.getsize(path)          # the sparse case: its size is enough
        else:
            with open(path, "rb") as fh:
                out[name] = fh.read()
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return simulate_corpus.build_corpus(tmp_path_factory.mktemp("simulate-corpus"))


def run_case(case_dir, outputs, run) -> None:
    case = CASES[case_dir.name]
    before = snapshot(case_dir)
    out = outputs / case.name / "report.json"
    out.parent.mkdir()
    recording = case_dir / simulate_corpus.DECISIONS
    proc = run("simulate", str(recording), "--cost-table", str(case_dir / simulate_corpus.COST),
               *case.options, "-o", str(out), "--json")
    needles = list(case.needles)
    if case.name.startswith(("file-", "line-", "json-", "key-", "step-", "policy-", "requests-",
                             "id-", "confidence-", "length-", "accepted-", "trace-")):
        needles.append(str(recording))
    line = assert_refused(proc, case.error, needles)
    report = json.loads(proc.stdout)
    assert report["ok"] is False and report["error"] == case.error.__name__, line
    assert line == "error: " + report["message"]
    if case.name.startswith(("json-", "key-", "step-", "requests-", "id-", "confidence-",
                             "length-", "accepted-")):
        assert ": line 2: " in line, line          # every such case breaks the second line
    assert not out.exists() and temp_siblings(out) == [] and os.listdir(out.parent) == []
    assert snapshot(case_dir) == before


def test_the_corpus_covers_every_refusal_and_its_list_is_current():
    assert len(CASES) >= 60
    assert {c.error for c in CASES.values()} == {
        errors.DecisionsError, errors.CostTableError, errors.CostTableRangeError,
        errors.SchedulingPolicyError, errors.ConcurrencyError, errors.ReferenceTraceError}
    assert simulate_corpus.README.read_text() == simulate_corpus.readme()


def test_the_good_recording_is_accepted(tmp_path):
    """The base every case breaks replays (else the cases would test nothing)."""
    path = tmp_path / "good.jsonl"
    path.write_text(simulate_corpus.lines_text(simulate_corpus.good_lines()))
    from dspark_convert.scheduling.cost_table import write_cost_table
    cost = write_cost_table(simulate_corpus.COSTS, tmp_path / "cost.json")
    proc = run_cli("simulate", str(path), "--cost-table", str(cost), "--check", "dspark")
    assert proc.returncode == 0 and "6 steps checked" in proc.stdout, proc.stderr


def test_every_case_is_refused_as_intended(corpus, tmp_path):
    for case_dir in corpus:
        run_case(case_dir, tmp_path, run_cli)


@pytest.mark.parametrize("name", CANARIES)
def test_canaries_as_processes(corpus, tmp_path, name):
    case_dir = next(d for d in corpus if d.name == name)
    run_case(case_dir, tmp_path, run_process)
