"""The gate's rule on acceptance by draft position at each context depth
(``max_depth_acceptance_drop``; commands/gate.py ``depth_regression``, evaluation/depth.py):
the tables from verify steps, a drop at one depth failing by name while the same drop
spread over every depth passes the plain rule's view, and a whole gate against a baseline
whose acceptance at one depth was higher (slow: two gate runs)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.cli import run_cli
from support.paths import GOLDEN_TARGET, TRAINED_DRAFTERS

from dspark_convert.commands.gate_report import GateReport, Measured
from dspark_convert.errors import AcceptanceRegressionError, GateFailedError
from dspark_convert.evaluation.depth import (DEPTH_BUCKETS, acceptance_by_depth,
                                             agreement_by_depth, depth_bucket, depth_label)


def test_the_buckets_are_stated_and_cover_every_depth():
    assert [depth_label(i) for i in range(len(DEPTH_BUCKETS))] == ["0-63", "64-255",
                                                                  "256-1023", "1024+"]
    assert [depth_bucket(d) for d in (0, 63, 64, 255, 256, 1023, 1024, 10**6)] == \
        [0, 0, 1, 1, 2, 2, 3, 3]


def test_acceptance_and_agreement_by_depth_count_each_position():
    rows = acceptance_by_depth([(5, 3, 1), (10, 2, 2), (300, 3, 0)], 3)
    assert [r.depth for r in rows] == ["0-63", "256-1023"]
    assert (rows[0].drafts, rows[0].reached, rows[0].hit) == (2, [2, 2, 1], [2, 1, 0])
    assert rows[0].rates() == [1.0, 0.5, 0.0] and rows[1].rates() == [0.0, 0.0, 0.0]
    rows = agreement_by_depth([(70, [1, 2, 3], [1, 2, 4]), (80, [1], [9, 9, 9])], 3)
    assert [(r.depth, r.reached, r.hit) for r in rows] == [("64-255", [2, 1, 1], [1, 1, 0])]


def _measured(steps):
    rows = acceptance_by_depth(steps, 3)
    return Measured(tau=2.0, acceptance_by_position=[0.5, 0.5, 0.5], lossless=True,
                    acceptance_by_depth=rows)


def test_a_drop_at_one_depth_is_named_by_position_and_depth():
    from dspark_convert.commands.gate import depth_regression

    shallow = [(10, 3, 3)] * 8
    deep = [(400, 3, 3)] * 8
    before = _measured(shallow + deep)
    # Deep in the context position 1 now fails half the time; shallow unchanged.
    now = _measured(shallow + [(400, 3, 3)] * 4 + [(400, 3, 1)] * 4)
    problem = depth_regression("bf16", before, now, 0.1)
    assert problem == ("bf16: at context depth 256-1023 tokens the acceptance at draft position 1 "
                       "is 0.500, 0.500 below the baseline's 1.000; max_depth_acceptance_drop is 0.1")
    assert depth_regression("bf16", before, now, 0.5) is None
    assert depth_regression("bf16", before, before, 0.0) is None
    # A baseline written before the tables: nothing to compare (the stage says so).
    old = Measured(tau=2.0, acceptance_by_position=[0.5] * 3, lossless=True)
    assert depth_regression("bf16", old, now, 0.1) is None


def test_the_policy_reads_the_rule_and_refuses_a_bad_one(tmp_path):
    from dspark_convert.commands.gate_policy import load_policy
    from dspark_convert.errors import GatePolicyError

    def policy(value):
        path = tmp_path / "p.toml"
        path.write_text(f'[[drafter]]\nname = "d"\nsource = "{TRAINED_DRAFTERS["vanilla_conf_markov"]}"\n'
                        f'target = "{GOLDEN_TARGET}"\nmax_depth_acceptance_drop = {value}\n')
        return path

    assert load_policy(policy(0.05)).entries[0].max_depth_acceptance_drop == 0.05
    with pytest.raises(GatePolicyError, match="max_depth_acceptance_drop"):
        load_policy(policy(1.5))


@pytest.mark.slow    # two whole gates (the small policy: two prompts, eight new tokens)
def test_a_drop_at_one_depth_fails_the_gate_by_name(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "a", "prompt_ids": [1, 17, 33, 90, 250, 7]}\n'
                       '{"id": "b", "prompt_ids": [1, 22, 33, 91, 240, 9]}\n')
    policy = tmp_path / "policy.toml"
    policy.write_text('[defaults]\nprompts = "prompts.jsonl"\nmax_new_tokens = 8\ndevice = "cpu"\n\n'
                      f'[[drafter]]\nname = "vanilla_conf_markov"\n'
                      f'source = "{TRAINED_DRAFTERS["vanilla_conf_markov"]}"\n'
                      f'target = "{GOLDEN_TARGET}"\nmax_depth_acceptance_drop = 0.05\n')
    first = tmp_path / "first"
    proc = run_cli("gate", str(policy), "-o", str(first))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    measured = GateReport.model_validate_json((first / "gate.json").read_text()) \
        .entries[0].measurement.artifacts["bf16"]
    rows = measured.acceptance_by_depth
    assert [r.depth for r in rows] == ["0-63"] and rows[0].drafts > 0
    # The same measurement against itself passes, saying so.
    again = tmp_path / "again"
    proc = run_cli("gate", str(policy), "-o", str(again), "--baseline", str(first))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    detail = GateReport.model_validate_json((again / "gate.json").read_text()) \
        .entries[0].stage("regression").detail
    assert "acceptance by position at each depth within 0.05 of the baseline" in detail
    # A baseline that accepted more at depth 0-63, position k: the stage fails naming both.
    k = next(i for i, (r, h) in enumerate(zip(rows[0].reached, rows[0].hit)) if r and h < r)
    baseline = Path(tmp_path / "baseline")
    shutil.copytree(first, baseline, ignore=shutil.ignore_patterns("*.gguf", "*.png"))
    doc = json.loads((baseline / "gate.json").read_text())
    row = doc["entries"][0]["measurement"]["artifacts"]["bf16"]["acceptance_by_depth"][0]
    row["hit"][k] = row["reached"][k]
    (baseline / "gate.json").write_text(json.dumps(doc))
    out = tmp_path / "out"
    proc = run_cli("gate", str(policy), "-o", str(out), "--baseline", str(baseline))
    assert proc.returncode == GateFailedError.exit_code, proc.stdout + proc.stderr
    stage = GateReport.model_validate_json((out / "gate.json").read_text()) \
        .entries[0].stage("regression")
    assert stage.exit_code == AcceptanceRegressionError.exit_code
    assert f"at context depth 0-63 tokens the acceptance at draft position {k} is" in stage.detail


def test_the_acceptance_a_trace_records_is_deepseeks_own():
    """DeepSeek's own runs with the cutoff off as a trace (reference.json): each line's
    accepted length, read from the contexts that extend it, is the run's own
    acceptance_lengths - 1; each run's last cycle has no later context and is not counted.
    (The runs at threshold 0.5 commit the same tokens: added, each context is there twice
    and a run's last cycle may be extended by the other run's.)"""
    from hostile.conform_corpus import deepseek_trace

    from dspark_convert.evaluation.depth import acceptance_by_depth, trace_acceptance
    from dspark_convert.evaluation.proposals import TraceLine
    from support.paths import GOLDEN

    reference = GOLDEN / "reference" / "vanilla_conf_markov" / "reference.json"
    doc = json.loads(reference.read_text())
    runs = [i for i, r in enumerate(doc["runs"])
            if r["temperature"] == 0 and r["confidence_threshold"] == 0]
    records = [r for r in deepseek_trace(reference)
               if int(r["id"].split("/")[0][3:]) in runs]
    lines = [TraceLine.of(i + 1, r["context"], r["draft"]) for i, r in enumerate(records)]
    expected = []
    for run in (doc["runs"][i] for i in runs):
        n = len(run["prompt"]) + 1
        for c, (cycle, length) in enumerate(zip(run["cycles"], run["acceptance_lengths"])):
            if cycle["proposed"] and c + 1 < len(run["acceptance_lengths"]):
                expected.append((n - 1, len(cycle["proposed"]), length - 1))
            n += length
    assert len(expected) > 10
    assert [r.model_dump() for r in trace_acceptance(lines, 7)] == \
        [r.model_dump() for r in acceptance_by_depth(expected, 7)]
