"""`dspark simulate` (scheduling/simulate.py, commands/simulate.py; docs/SCHEDULING.md
"Simulating: dspark simulate"): replaying the recorded policy on its own decisions gives
back the recorded lengths and the predicted verify time Σ 1/SPS(B) (computed here from the
table's entries); another policy's acceptances are min(accepted, l') with the censored
request-steps counted; a sweep at concurrency 1 of a sequential recording is its replay,
and every request produces what it produced in the recording; a smoke/eval trace is read
as full-block decisions; each bad input through the CLI is one line, its own code, nothing
written."""

from __future__ import annotations

import json
import shutil

import pytest
from support.cli import assert_refused, run_cli
from support.decisions import COSTS, GAMMA, as_bytes, of_policy, record, sequential

from dspark_convert.errors import (
    ConcurrencyError,
    CostTableError,
    CostTableRangeError,
    DecisionsError,
    OutputExistsError,
    SchedulingPolicyError,
)
from dspark_convert.scheduling.cost_table import CostTable, write_cost_table
from dspark_convert.scheduling.decisions import parse_decisions
from dspark_convert.scheduling.policies import parse_policy
from dspark_convert.scheduling.simulate import parse_concurrency, replay, sweep

POLICIES = ["full", "threshold=0.6", "dspark", "dspark-async", "target-only"]
TRACE = "golden/reference/vanilla_conf_markov/reference.json"


def decisions(lines):
    return parse_decisions(as_bytes(lines), label="decisions d.jsonl", path="d.jsonl")


def sps(batch: int) -> float:
    """SPS(B) said again: the rate of the first entry at least B."""
    for tokens, rate in zip(COSTS.tokens, COSTS.steps_per_second):
        if tokens >= batch:
            return rate
    raise AssertionError(f"B = {batch} beyond the table")


@pytest.mark.parametrize("spec", POLICIES)
def test_replaying_the_recorded_policy_reproduces_its_lengths_and_time(spec):
    d = decisions(record(of_policy(spec), spec, steps=40))
    f = replay(d, parse_policy(spec), COSTS)
    recorded = [tuple(r.length for r in line.requests) for line in d.lines]
    assert list(f.lengths) == recorded
    batches = [sum(1 + n for n in lengths) for lengths in recorded]
    assert f.verify_seconds == pytest.approx(sum(1.0 / sps(b) for b in batches), rel=1e-12)
    assert f.verify_tokens == sum(batches)
    output = sum(r.accepted + 1 for line in d.lines for r in line.requests)
    assert f.output_tokens == output
    assert f.wasted_tokens == sum(r.length - r.accepted for line in d.lines for r in line.requests)
    assert f.accepted_per_step == pytest.approx(
        output / sum(len(line.requests) for line in d.lines))
    assert f.tokens_per_second == pytest.approx(output / f.verify_seconds)
    assert f.censored_steps == f.censored_request_steps == 0     # never longer than recorded
    assert f.steps == 40 and f.mode == "replay" and f.concurrency is None


def test_another_policy_takes_min_accepted_and_counts_the_censored():
    d = decisions(record(of_policy("threshold=0.9"), "threshold=0.9", steps=40))
    full = replay(d, parse_policy("full"), COSTS)
    blocks = [r for line in d.lines for r in line.requests]
    censored = [r for r in blocks if r.accepted == r.length < GAMMA]
    assert censored, "the recording must hold blocks accepted whole and cut short"
    assert full.censored_request_steps == len(censored)
    assert full.censored_steps == sum(any(r.accepted == r.length < GAMMA for r in line.requests)
                                      for line in d.lines)
    # Full sends every block whole: what each accepted is the recorded count (a lower bound
    # where censored), and the rest is wasted.
    assert full.output_tokens == sum(r.accepted + 1 for r in blocks)
    assert full.wasted_tokens == sum(GAMMA - r.accepted for r in blocks)
    # Target-only keeps nothing of the drafts: one token a request-step, nothing wasted.
    alone = replay(d, parse_policy("target-only"), COSTS)
    assert (alone.output_tokens, alone.wasted_tokens, alone.censored_steps) == (len(blocks), 0, 0)
    assert alone.verify_seconds == pytest.approx(
        sum(1.0 / sps(len(line.requests)) for line in d.lines))


@pytest.mark.parametrize("spec", ["dspark", "dspark-async", "threshold=0.6"])
def test_a_sweep_at_concurrency_1_of_a_sequential_run_is_its_replay(spec):
    d = decisions(sequential(of_policy(spec), spec))
    one = sweep(d, parse_policy(spec), COSTS, 1)
    again = replay(d, parse_policy(spec), COSTS)
    for key in ("steps", "verify_tokens", "wasted_tokens", "output_tokens", "verify_seconds"):
        assert getattr(one, key) == pytest.approx(getattr(again, key)), key
    rates = []
    for r in ("r0", "r1", "r2", "r3"):
        mine = [x for line in d.lines for x in line.requests if x.id == r]
        seconds = sum(1.0 / sps(1 + x.length) for x in mine)
        rates.append(sum(x.accepted + 1 for x in mine) / seconds)
    assert one.per_request_tokens_per_second == pytest.approx(sum(rates) / len(rates))


def test_a_sweep_finishes_every_request_with_its_recorded_tokens():
    d = decisions(record(of_policy("dspark"), "dspark", steps=30))
    recorded = sum(r.accepted + 1 for line in d.lines for r in line.requests)
    ids = {r.id for line in d.lines for r in line.requests}
    previous = None
    for level in (1, 4, 64):
        f = sweep(d, parse_policy("dspark"), COSTS, level)
        assert f.requests == len(ids)
        # Each request stops at the step that reaches its goal: at most gamma + 1 tokens over.
        assert recorded <= f.output_tokens <= recorded + len(ids) * GAMMA
        if previous is not None:
            assert f.steps < previous.steps            # more in flight, fewer steps
        previous = f
    alone = sweep(d, parse_policy("target-only"), COSTS, 1)
    assert alone.steps == alone.output_tokens == recorded   # one token a step, one at a time


def test_parse_concurrency():
    assert parse_concurrency("1,4,16,64") == (1, 4, 16, 64)
    for bad in ["", "0", "4,2", "1,1", "1,,2", " 1", "1.5", "-1", "٣", "a", "1," , "99999999"]:
        with pytest.raises(ConcurrencyError) as info:
            parse_concurrency(bad)
        assert info.value.exit_code == 148 and "\n" not in info.value.message


def test_a_trace_is_read_as_full_block_decisions(tmp_path):
    """DeepSpec's reference trace: its runs without a threshold, one request each."""
    trace = json.loads(open(TRACE).read())
    used = [run for run in trace["runs"] if run["confidence_threshold"] == 0]
    cost = write_cost_table(COSTS, tmp_path / "cost.json")
    proc = run_cli("simulate", TRACE, "--cost-table", str(cost), "--policy", "full",
                   "--policy", "threshold=0.5", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert (doc["kind"], doc["runs_used"], doc["runs_left_out"]) == \
        ("trace", len(used), len(trace["runs"]) - len(used))
    cycles = [c for run in used for c in run["cycles"]]
    full, half = doc["figures"]
    assert full["steps"] == doc["recorded_steps"] == len(cycles)
    assert full["verify_tokens"] == sum(1 + len(c["proposed"]) for c in cycles)
    assert full["output_tokens"] == sum(1 + c["accepted"] for c in cycles)
    # sigmoid(logit) >= 0.5 exactly where logit >= 0: threshold=0.5 sends each block's
    # prefix of non-negative logits.
    def prefix(logits):
        return next((k for k, x in enumerate(logits) if x < 0), len(logits))
    assert half["verify_tokens"] == sum(1 + prefix(c["confidence_logits"]) for c in cycles)
    assert half["output_tokens"] == sum(1 + min(c["accepted"], prefix(c["confidence_logits"]))
                                        for c in cycles)


# --- the CLI: every refusal one line, its code, nothing written ------------------------------

@pytest.fixture
def files(tmp_path):
    cost = write_cost_table(COSTS, tmp_path / "cost.json")
    good = tmp_path / "d.jsonl"
    good.write_bytes(as_bytes(record(of_policy("dspark"), "dspark")))
    return tmp_path, good, cost


def test_cli_replay_and_sweep_write_the_report(files):
    tmp, good, cost = files
    out = tmp / "report.json"
    proc = run_cli("simulate", str(good), "--cost-table", str(cost), "--policy", "dspark",
                   "--policy", "full", "--concurrency", "1,4", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert doc["mode"] == "sweep"
    assert [(f["policy"], f["concurrency"]) for f in doc["figures"]] == \
        [("dspark", 1), ("dspark", 4), ("full", 1), ("full", 4)]
    assert "user tok/s" in proc.stdout
    proc = run_cli("simulate", str(good), "--cost-table", str(cost), "--json")
    (figures,) = json.loads(proc.stdout)["figures"]
    assert figures["policy"] == "dspark" and figures["mode"] == "replay"   # the recorded one


def _bad_cost(tmp):
    p = tmp / "bad-cost.json"
    p.write_text('{"tokens": [1, 2], "steps_per_second": [1.0], "device": "d", "dtype": "t", '
                 '"threads": 1, "versions": {}}')
    return p


def _small_cost(tmp):
    return write_cost_table(CostTable(tokens=(1, 2, 4), steps_per_second=(3.0, 2.0, 1.0),
                                      device="d", dtype="t", threads=1, versions={}),
                            tmp / "small-cost.json")


def _directory(tmp):
    (tmp / "a-directory").mkdir()
    return tmp / "a-directory"


def _no_confidences(tmp):
    p = tmp / "bare.jsonl"
    p.write_text('{"step": 0, "policy": "full", "requests": [{"id": "a", "confidence": [], '
                 '"length": 7, "accepted": 2}]}\n')
    return p


REFUSALS = [
    # (what, arguments after the recording, the recording, error, a needle)
    ("decisions not JSON", lambda t, g, c: (t / "x.jsonl", ["--cost-table", c]), DecisionsError, "line 1"),
    ("decisions missing", lambda t, g, c: (t / "none.jsonl", ["--cost-table", c]), DecisionsError, "not found"),
    ("decisions a directory", lambda t, g, c: (_directory(t), ["--cost-table", c]), DecisionsError, "not a regular file"),
    ("cost table bad", lambda t, g, c: (g, ["--cost-table", _bad_cost(t)]), CostTableError, "steps_per_second"),
    ("policy misspelt", lambda t, g, c: (g, ["--cost-table", c, "--policy", "dsprk"]), SchedulingPolicyError, "dsprk"),
    ("check misspelt", lambda t, g, c: (g, ["--cost-table", c, "--check", "threshold=2"]), SchedulingPolicyError, "threshold=2"),
    ("check and policy", lambda t, g, c: (g, ["--cost-table", c, "--check", "full", "--policy", "full"]), SchedulingPolicyError, "--check"),
    ("concurrency 0", lambda t, g, c: (g, ["--cost-table", c, "--concurrency", "0"]), ConcurrencyError, "'0'"),
    ("concurrency not increasing", lambda t, g, c: (g, ["--cost-table", c, "--concurrency", "4,2"]), ConcurrencyError, "4,2"),
    ("concurrency not a list", lambda t, g, c: (g, ["--cost-table", c, "--concurrency", "1;4"]), ConcurrencyError, "1;4"),
    ("concurrency with check", lambda t, g, c: (g, ["--cost-table", c, "--concurrency", "1", "--check", "full"]), ConcurrencyError, "--check"),
    ("table does not reach B", lambda t, g, c: (g, ["--cost-table", _small_cost(t), "--policy", "full"]), CostTableRangeError, "step 0: cost table"),
    ("no confidences for dspark", lambda t, g, c: (_no_confidences(t), ["--cost-table", c, "--policy", "dspark"]), SchedulingPolicyError, "confidence: []"),
]


@pytest.mark.parametrize("what, make, error, needle", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_cli_refusals_are_one_line_and_write_nothing(files, what, make, error, needle):
    tmp, good, cost = files
    (tmp / "x.jsonl").write_text("{not json\n")
    recording, args = make(tmp, good, cost)
    before = good.read_bytes()
    out = tmp / "report.json"
    proc = run_cli("simulate", str(recording), *map(str, args), "-o", str(out))
    assert_refused(proc, error, [needle])
    assert not out.exists() and not [p for p in tmp.iterdir() if p.name.startswith(".report")]
    assert good.read_bytes() == before


def test_cli_an_existing_report_is_not_replaced(files):
    tmp, good, cost = files
    out = tmp / "report.json"
    out.write_text("mine")
    proc = run_cli("simulate", str(good), "--cost-table", str(cost), "-o", str(out))
    assert_refused(proc, OutputExistsError)
    assert out.read_text() == "mine"
    shutil.copy(good, tmp / "copy.jsonl")
    proc = run_cli("simulate", str(tmp / "copy.jsonl"), "--cost-table", str(cost), "-o",
                   str(out), "--force")
    assert proc.returncode == 0 and json.loads(out.read_text())["mode"] == "replay"
