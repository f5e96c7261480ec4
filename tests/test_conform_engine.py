"""One check: `dspark eval --engine llama.cpp` writes the drafts it read
from llama.cpp's log as a conform trace in its report directory, and `dspark conform` on
that file gives the eval's own verdict: llama.cpp 0c1e570's draft-dspark drafts of both
golden drafters are the reference's; its draft-dflash drafts of DeepSeek's plain DFlash
drafter are read one row late (row_offset 1, docs/ENGINES.md), the same first difference
in both reports. Against the real binaries (support/llama_cpp.engine: a missing build
skips here and fails under CI=true); slow: it needs the session's `llama_golden`."""

from __future__ import annotations

import json

import pytest
from support.cli import assert_refused, run_cli
from support.paths import GOLDEN_TARGET

from dspark_convert.errors import DraftMismatchError

pytestmark = pytest.mark.slow

DSPARK, DFLASH = "vanilla_conf_markov", "dflash_shared"
N = 16


@pytest.fixture(scope="module")
def report(llama_golden, paired_artifacts, tmp_path_factory):
    root = tmp_path_factory.mktemp("conform-engine")
    prompts = root / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "hello", "prompt": "hello world"}) + "\n"
                       + json.dumps({"id": "sea", "prompt": "the sea and the sky"}) + "\n")
    out = root / "report"
    proc = run_cli("eval", str(paired_artifacts[DSPARK]), str(paired_artifacts[DFLASH]),
                   "--target", str(GOLDEN_TARGET), "--prompts", str(prompts), "--max-new-tokens",
                   str(N), "--threshold", "0.5", "--engine", f"llama.cpp={llama_golden.engine.bin}",
                   "--target-gguf", str(llama_golden.target), "-o", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, json.loads((out / "report.json").read_text())


def _runs(doc):
    return {(r["artifact"], r["spec_type"]): r for r in doc["engine_runs"] if r["kind"] == "drafter"}


def test_each_engine_run_writes_the_drafts_it_checked_as_a_trace(report):
    from dspark_convert.evaluation.conform import read_trace

    out, doc = report
    runs = _runs(doc)
    assert set(runs) == {(DSPARK, "draft-dspark"), (DFLASH, "draft-dflash"), (DFLASH, "draft-dspark")}
    target = next(r for r in doc["engine_runs"] if r["kind"] == "target")
    assert target["trace"] is None
    for (art, spec), run in runs.items():
        assert run["trace"] == f"trace-llama.cpp-{art}-{spec}.jsonl"
        trace = read_trace(out / run["trace"])
        # One line per draft llama.cpp made (its tau: accepted + 1 per draft), prompt by prompt.
        assert len(trace.lines) == run["proposals"]["compared"] == sum(
            len(p["acceptance_lengths"]) for p in run["prompts"])
        assert [x.id for x in trace.lines] == [p["id"] for p in run["prompts"]
                                               for _ in p["acceptance_lengths"]]
        # Each context extends the last of its prompt by what the cycle committed.
        for a, b, n in zip(trace.lines, trace.lines[1:], [x for p in run["prompts"]
                                                          for x in p["acceptance_lengths"]]):
            if a.id == b.id:
                assert b.context_length == a.context_length + n
                assert b.context[:a.context_length].tolist() == a.context.tolist()
    md = (out / "report.md").read_text()
    assert f"[trace-llama.cpp-{DFLASH}-draft-dflash.jsonl]" in md


@pytest.mark.parametrize("art, spec", [(DSPARK, "draft-dspark"), (DFLASH, "draft-dspark")])
def test_conform_accepts_what_the_eval_accepted(report, paired_artifacts, art, spec):
    out, doc = report
    run = _runs(doc)[(art, spec)]
    assert run["proposals"]["equal"] == run["proposals"]["compared"] > 0
    proc = run_cli("conform", str(paired_artifacts[art]), "--target", str(GOLDEN_TARGET),
                   "--trace", str(out / run["trace"]), "--device", "cpu", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    for key in ("compared", "equal", "positions_compared", "positions_equal"):
        assert result["check"][key] == run["proposals"][key], key


def test_conform_names_the_row_late_reading_the_eval_named(report, paired_artifacts):
    """llama.cpp's draft-dflash on DeepSeek's DFlash drafter: every draft is ours read one
    row late; conform exits 97 with the eval's first difference (its line in the trace)."""
    out, doc = report
    run = _runs(doc)[(DFLASH, "draft-dflash")]
    proc = run_cli("conform", str(paired_artifacts[DFLASH]), "--target", str(GOLDEN_TARGET),
                   "--trace", str(out / run["trace"]), "--device", "cpu", "--json")
    assert_refused(proc, DraftMismatchError, ["row_offset 1", "line 1 (id hello), position 0"])
    result = json.loads(proc.stdout)
    mine, eval_first = result["check"]["first_difference"], run["proposals"]["first_difference"]
    assert (eval_first["prompt"], eval_first["draft_call"]) == ("hello", 1)
    for key in ("line", "id", "position", "engine_token", "reference_token", "row_offset",
                "engine_draft", "reference_draft", "context_tokens", "anchor", "near_tie"):
        assert mine[key] == eval_first[key], key
    assert mine["reference_margin"] == pytest.approx(eval_first["reference_margin"], abs=1e-6)
    for key in ("compared", "equal", "positions_compared", "positions_equal"):
        assert result["check"][key] == run["proposals"][key], key
