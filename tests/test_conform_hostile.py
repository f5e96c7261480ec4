"""Every hostile trace of tests/hostile/conform_corpus.py through the real CLI.

`dspark conform ARTIFACT --target T --trace CASE -o OUT --json` against the golden DSpark
drafter and its target, in-process (tests/support/cli.py); a canary of each kind also as a
real `dspark` process. The rule for bad input: the intended error class (named in the JSON
document) and its exit code, one `error:` line naming the trace file and (for a line's
fault) the line, no traceback, and nothing written: no report directory, no temporary
sibling, the case's directory unchanged."""

from __future__ import annotations

import json
import os

import pytest
from hostile import conform_corpus
from support.cli import assert_refused, run_cli, run_process, temp_siblings
from support.paths import GOLDEN_TARGET

from dspark_convert import errors

CASES = {case.name: case for case in conform_corpus.CASES}
CANARIES = ["file-fifo", "json-duplicate-key", "context-bool", "range-vocabulary"]


def snapshot(directory):
    out = {}
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = os.path.join(root, name)
            key = os.path.relpath(path, directory)
            if os.path.isdir(path):
                out[key] = "dir"
            elif not os.path.isfile(path):
                out[key] = "special"
            else:
                with open(path, "rb") as fh:
                    out[key] = fh.read()
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return conform_corpus.build_corpus(tmp_path_factory.mktemp("conform-corpus"))


def run_case(case_dir, outputs, artifact, run) -> None:
    case = CASES[case_dir.name]
    before = snapshot(case_dir)
    out = outputs / case.name / "report"
    out.parent.mkdir()
    trace = case_dir / conform_corpus.TRACE
    proc = run("conform", str(artifact), "--target", str(GOLDEN_TARGET), "--trace", str(trace),
               "-o", str(out), "--device", "cpu", "--json")
    line = assert_refused(proc, case.error, [str(trace)])
    report = json.loads(proc.stdout)
    assert report["ok"] is False and report["error"] == case.error.__name__, line
    assert line == "error: " + report["message"]
    if case.name.startswith(("json-", "key-", "context-", "draft-", "id-", "range-")):
        assert ": line 2: " in line, line          # every such case breaks the second line
    assert not out.exists() and temp_siblings(out) == [] and os.listdir(out.parent) == []
    assert snapshot(case_dir) == before


def test_the_corpus_covers_both_kinds_and_its_list_is_current():
    assert len(CASES) >= 30
    assert {c.error for c in CASES.values()} == {errors.TraceFormatError, errors.TraceRangeError}
    assert conform_corpus.README.read_text() == conform_corpus.readme()


def test_the_good_trace_is_deepseeks_drafts():
    """The base every case breaks: each context extends the last of its run by what the
    cycle committed, and its anchor is the token the target gave last."""
    good = conform_corpus.deepseek_trace()
    doc = json.loads(conform_corpus.REFERENCE.read_text())
    runs = [r for r in doc["runs"] if r["temperature"] == 0]
    assert len(good) == sum(1 for r in runs for c in r["cycles"] if c["proposed"])
    first = runs[0]
    assert good[0]["context"] == first["output_ids"][:len(first["prompt"]) + 1]
    assert good[0]["draft"] == first["cycles"][0]["proposed"]


def test_every_case_is_refused_as_intended(corpus, tmp_path, paired_artifacts):
    for case_dir in corpus:
        run_case(case_dir, tmp_path, paired_artifacts["vanilla_conf_markov"], run_cli)


@pytest.mark.parametrize("name", CANARIES)
def test_canaries_as_processes(corpus, tmp_path, paired_artifacts, name):
    case_dir = next(d for d in corpus if d.name == name)
    run_case(case_dir, tmp_path, paired_artifacts["vanilla_conf_markov"], run_process)
