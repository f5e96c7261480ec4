"""`dspark serve-bench`: the policies swept under concurrent load on the golden target.

- One sweep of DeepSeek's golden Qwen3 DSpark drafter at concurrency 1,2 under full and
  dspark, with a real cost table measured by profile_target, greedy: report.json is valid
  against its schema, every run's outputs equal the target alone's at the same concurrency
  and their SHA-256 checks out, each decisions file reads back (read_decisions) and its
  lengths sum as the report says, the plots are PNGs. The same sweep without --cost-table
  profiles the target first and publishes cost_table.json.
- DeepSeek's Gemma4 drafter once (slow).
- Each refusal: its exit code, one line, no output directory.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from support.cli import assert_refused, run_cli, run_process, temp_siblings
from support.paths import GOLDEN_TARGET as TARGET

from dspark_convert import errors as E

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DSPARK, DFLASH = "vanilla_conf_markov", "dflash_shared"
BLOCK = 7            # the golden drafters' block size
MAX_NEW = 12


def _prompts(tmp_path, n=3):
    path = tmp_path / "prompts.jsonl"
    rows = [{"id": f"p{i}", "prompt_ids": [1, 17 + 5 * i, 33, 90, 250 - i]} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _table(path, tokens, rates=None):
    path.write_text(json.dumps({"tokens": tokens,
                                "steps_per_second": rates or [100.0 - t for t in tokens],
                                "device": "cpu", "dtype": "float32", "threads": 1,
                                "versions": {"torch": "x"}}))
    return path


@pytest.fixture(scope="module")
def cost_table(tmp_path_factory):
    """A real cost table of the golden target, measured by profile_target with few tokens
    (up to concurrency 2 x (1 + 7))."""
    import torch

    from dspark_convert.runtime.qwen3 import Qwen3Target
    from dspark_convert.scheduling.cost_table import write_cost_table
    from dspark_convert.scheduling.profile import default_tokens, profile_target

    model = Qwen3Target(TARGET, device=torch.device("cpu"))
    table = profile_target(model, tokens=default_tokens(2 * (1 + BLOCK)), repeats=2)
    return write_cost_table(table, tmp_path_factory.mktemp("costs") / "cost.json")


def _bench(artifact, out, prompts, *extra):
    return run_cli("serve-bench", str(artifact), "--target", str(TARGET), "--prompts",
                   str(prompts), "--max-new-tokens", str(MAX_NEW), "--device", "cpu",
                   "-o", str(out), *extra)


@pytest.fixture(scope="module")
def sweep(paired_artifacts, cost_table, tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    out = root / "bench"
    proc = _bench(paired_artifacts[DSPARK], out, _prompts(root), "--concurrency", "1,2",
                  "--policy", "full", "--policy", "dspark", "--cost-table", str(cost_table))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr == ""                  # no warning, no bar off a terminal
    return out, json.loads((out / "report.json").read_text())


# --- the sweep ----------------------------------------------------------------------------

def test_report_is_valid_against_its_schema(sweep):
    from support.json_schema import schema_problems
    from support.paths import ROOT

    out, report = sweep
    schema = json.loads((ROOT / "schemas" / "serve_bench_report.schema.json").read_text())
    assert schema_problems(report, schema) == []
    # The check can fail: what the schema refuses, it reports.
    run = report["runs"][0]
    for bad in ({**report, "extra": 1}, {**report, "version": 2},
                {**report, "runs": [{**run, "concurrency": "1"}]},
                {**report, "runs": [{**run, "tokens_per_second": "fast"}]},
                {k: v for k, v in report.items() if k != "settings"}):
        assert schema_problems(bad, schema), bad
    runs = {(r["artifact"], r["policy"], r["concurrency"]) for r in report["runs"]}
    assert runs == {(None, "target-only", 1), (None, "target-only", 2),
                    (DSPARK, "full", 1), (DSPARK, "full", 2),
                    (DSPARK, "dspark", 1), (DSPARK, "dspark", 2)}
    assert report["settings"]["cost_table_source"] == "given"


def test_every_output_equals_the_target_alone_and_its_hash(sweep):
    _, report = sweep
    baseline = {r["concurrency"]: {q["id"]: q["output_ids"] for q in r["requests"]}
                for r in report["runs"] if r["artifact"] is None}
    assert report["lossless"] is True
    for run in report["runs"]:
        assert [q["id"] for q in run["requests"]] == ["p0", "p1", "p2"]
        for q in run["requests"]:
            assert q["sha256"] == hashlib.sha256(
                json.dumps(q["output_ids"], separators=(",", ":")).encode()).hexdigest()
            assert q["output_ids"] == baseline[run["concurrency"]][q["id"]]
            assert len(q["output_ids"]) <= MAX_NEW
            assert q["equal_to_target_only"] is (None if run["artifact"] is None else True)
        assert run["new_tokens"] == sum(len(q["output_ids"]) for q in run["requests"])
        # Per request: the tokens after the first over the time from the first to the last
        # (a bound, not a figure: 100x the run's throughput is a rate of microseconds).
        assert 0 < run["per_request_tokens_per_second"] < 100 * run["tokens_per_second"]


def test_decisions_read_back_and_sum_as_the_report_says(sweep):
    from dspark_convert.scheduling.decisions import read_decisions

    out, report = sweep
    for run in report["runs"]:
        decisions = read_decisions(out / run["decisions"])
        assert str(decisions.policy) == run["policy"]
        assert len(decisions.lines) == run["verify_steps"]
        parts = [r for line in decisions.lines for r in line.requests]
        assert run["verify_tokens"] == sum(1 + r.length for r in parts)
        assert run["draft_tokens_sent"] == sum(r.length for r in parts)
        assert run["draft_tokens_wasted"] == sum(r.length - r.accepted for r in parts)
        assert max(len(line.requests) for line in decisions.lines) <= run["concurrency"]
        if run["policy"] == "full":   # the whole block shown (less only near a request's end)
            assert all(r.length == len(r.confidence) <= BLOCK for r in parts)
            assert any(r.length == BLOCK for r in parts)
        if run["artifact"] is None:
            assert run["draft_tokens_sent"] == 0 and run["acceptance_by_position"] == []
        else:
            assert len(run["acceptance_by_position"]) == BLOCK
        # Acceptance by position j: of the request-steps that sent >= j tokens, those with
        # >= j accepted.
        for j, rate in enumerate(run["acceptance_by_position"], 1):
            sent = [r for r in parts if r.length >= j]
            assert rate == (sum(r.accepted >= j for r in sent) / len(sent) if sent else None)
        assert run["tokens_per_second"] == pytest.approx(run["new_tokens"] / run["total_seconds"])
        assert run["accepted_per_step"] >= 1.0


def test_every_recorded_decision_is_its_policys_on_the_cost_table_used(sweep, cost_table):
    """`dspark simulate --check` on each run's decisions file with the sweep's cost table:
    every step's lengths are what its policy (Algorithm 1 for dspark) gives on the
    confidences the step records; checked against another policy, dspark's are not."""
    out, report = sweep
    checked = 0
    for run in report["runs"]:
        if run["artifact"] is None:
            continue
        proc = run_cli("simulate", str(out / run["decisions"]), "--cost-table", str(cost_table),
                       "--check", run["policy"], "--json")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert json.loads(proc.stdout)["check"]["steps_checked"] == run["verify_steps"]
        checked += 1
    assert checked == 4                       # full and dspark at concurrency 1 and 2
    dspark = next(r for r in report["runs"] if r["policy"] == "dspark" and r["concurrency"] == 2)
    proc = run_cli("simulate", str(out / dspark["decisions"]), "--cost-table", str(cost_table),
                   "--check", "full")
    assert proc.returncode == E.SchedulerMismatchError.exit_code


def test_report_md_and_plots(sweep):
    out, report = sweep
    md = (out / "report.md").read_text()
    for name in ("throughput.png", "per_request.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({name})" in md
    assert f"## {DSPARK}" in md and "LOSSLESS FAILURE" not in md
    assert sorted(p.name for p in (out / "decisions").iterdir()) == sorted(
        r["decisions"].split("/")[1] for r in report["runs"])


def test_an_output_unlike_the_target_alone_is_a_failure_said_loudly(sweep, paired_artifacts):
    """The comparison can fail: a real target-only run held against a baseline with one
    token changed is a mismatch, which report.md heads in capitals and the CLI exits 74 on."""
    import torch

    from dspark_convert.commands.serve_bench import report_failure
    from dspark_convert.evaluation.serve_bench import serve_run
    from dspark_convert.evaluation.serve_report import ServeBenchReport, render_markdown
    from dspark_convert.runtime.qwen3 import Qwen3Target
    from dspark_convert.runtime.serving import Request, serve
    from dspark_convert.scheduling.policies import parse_policy

    model = Qwen3Target(TARGET, device=torch.device("cpu"))
    result = serve(model, None, [Request("p0", (1, 17, 33, 90, 250), 6)], concurrency=1,
                   policy=parse_policy("target-only"), stop_token_ids=(2,))
    ids = result.requests[0].output_ids
    assert serve_run(result, artifact="a", block_size=7, decisions=None,
                     baseline={"p0": ids}).lossless is True
    run = serve_run(result, artifact="a", block_size=7, decisions=None,
                    baseline={"p0": (ids[0] + 1,) + ids[1:]})
    assert run.lossless is False and run.requests[0].equal_to_target_only is False
    out, doc = sweep
    report = ServeBenchReport.model_validate(doc)
    bad = report.model_copy(update={"runs": [*report.runs, run], "lossless": False})
    assert "LOSSLESS FAILURE: 1 request output(s)" in render_markdown(bad, plots=[])
    failure = report_failure(bad, out)
    assert failure.exit_code == E.LosslessnessError.exit_code and "request p0" in failure.message
    assert report_failure(report, out) is None


@pytest.fixture(scope="module")
def calibration(paired_artifacts, tmp_path_factory):
    """A calibration.json of the golden DSpark drafter, fitted by `dspark eval --calibrate`
    (run_eval) on four prompts."""
    from dspark_convert.commands.evaluate import run_eval
    from dspark_convert.util.json_out import dumps_model

    root = tmp_path_factory.mktemp("calibration")
    report = run_eval([paired_artifacts[DSPARK]], TARGET, _prompts(root, 4), thresholds=[],
                      max_new_tokens=24, device="cpu", calibrate=True, held_out=0.5)
    cal = report.artifacts[0].calibration
    assert cal is not None and any(t != 1.0 for t in cal.temperatures)
    path = root / "calibration.json"
    path.write_text(dumps_model(cal, indent=1) + "\n")
    return path, cal.temperatures


def test_a_calibration_scales_the_confidences_the_policies_see(paired_artifacts, calibration,
                                                               sweep, tmp_path):
    """Under full (lengths that do not depend on the confidences) the calibrated run makes
    the same steps as the raw one, and each confidence it records is sigmoid(logit / T_k)
    of the raw one's logit: logit(c_cal) * T_k == logit(c_raw)."""
    import math

    from dspark_convert.scheduling.decisions import read_decisions

    path, temperatures = calibration
    out = tmp_path / "bench"
    proc = _bench(paired_artifacts[DSPARK], out, _prompts(tmp_path), "--concurrency", "1",
                  "--policy", "full", "--calibration", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["artifacts"][0]["calibration"]["temperatures"] == list(temperatures)
    assert report["lossless"] is True
    raw_dir, _ = sweep
    name = f"decisions/{DSPARK}.full.c1.jsonl"
    raw, cal = read_decisions(raw_dir / name), read_decisions(out / name)
    assert len(raw.lines) == len(cal.lines)
    logit = lambda c: math.log(c / (1.0 - c))            # noqa: E731
    compared = 0
    for a, b in zip(raw.lines, cal.lines):
        for r, c in zip(a.requests, b.requests):
            assert (r.id, r.length, r.accepted) == (c.id, c.length, c.accepted)
            for k, (x, y) in enumerate(zip(r.confidence, c.confidence)):
                if 1e-6 < x < 1 - 1e-6 and 1e-6 < y < 1 - 1e-6:    # logit well defined
                    assert logit(y) * temperatures[k] == pytest.approx(logit(x), rel=1e-4,
                                                                       abs=1e-4)
                    compared += 1
    assert compared > 20
    assert "confidences calibrated by" in (out / "report.md").read_text()


def test_sampled_outputs_are_not_compared_and_need_no_table(paired_artifacts, tmp_path):
    """At temperature > 0 a request's draws differ from the target alone's: no comparison is
    claimed (null), and full needs no cost table (none profiled, none written)."""
    out = tmp_path / "bench"
    proc = _bench(paired_artifacts[DSPARK], out, _prompts(tmp_path, 2), "--concurrency", "2",
                  "--policy", "full", "--temperature", "0.8", "--seed", "5")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["lossless"] is None and report["cost_table"] is None
    assert report["settings"]["cost_table_source"] == "none"
    assert all(q["equal_to_target_only"] is None for r in report["runs"] for q in r["requests"])
    assert not (out / "cost_table.json").exists()
    assert "serve-bench on" in proc.stdout and "c2 vanilla_conf_markov full" in proc.stdout


def test_requests_of_one_token_make_no_step_and_no_rate(paired_artifacts, tmp_path):
    """max 1 new token: each request ends at its prefill; no verify step, so no decisions
    file and no per-request rate (a one-token request has none), nothing made up."""
    out = tmp_path / "bench"
    proc = _bench(paired_artifacts[DSPARK], out, _prompts(tmp_path, 2), "--concurrency", "1",
                  "--policy", "full", "--max-new-tokens", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "report.json").read_text())
    for run in report["runs"]:
        assert run["verify_steps"] == 0 and run["decisions"] is None
        assert run["per_request_tokens_per_second"] is None and run["accepted_per_step"] is None
        assert [len(q["output_ids"]) for q in run["requests"]] == [1, 1]
    assert report["lossless"] is True and list((out / "decisions").iterdir()) == []


@pytest.mark.slow
def test_without_a_cost_table_the_target_is_profiled(paired_artifacts, tmp_path):
    from dspark_convert.scheduling.cost_table import read_cost_table

    out = tmp_path / "bench"
    proc = _bench(paired_artifacts[DSPARK], out, _prompts(tmp_path, 2), "--concurrency", "2",
                  "--policy", "dspark", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] is True
    table = read_cost_table(out / "cost_table.json")
    assert table.tokens[-1] == 2 * (1 + BLOCK)
    assert doc["report"]["cost_table"]["tokens"] == list(table.tokens)
    assert doc["report"]["settings"]["cost_table_source"] == "profiled"


@pytest.mark.slow
def test_gemma4_drafter_sweeps_losslessly(tmp_path):
    from support.gemma4 import GEMMA4, GEMMA4_DRAFTERS, GEMMA4_TARGET

    from dspark_convert.commands.convert import convert

    art = tmp_path / "gemma4_vanilla_conf_markov"
    convert(GEMMA4_DRAFTERS["gemma4_vanilla_conf_markov"], art, target=GEMMA4_TARGET)
    out = tmp_path / "bench"
    proc = run_cli("serve-bench", str(art), "--target", str(GEMMA4_TARGET), "--prompts",
                   str(GEMMA4 / "prompts.jsonl"), "--max-new-tokens", "16", "--device", "cpu",
                   "--concurrency", "1,2", "--policy", "full", "--policy", "threshold=0.5",
                   "--policy", "dspark", "--policy", "dspark-async", "-o", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["lossless"] is True
    assert len(report["runs"]) == 2 * (1 + 4)


@pytest.mark.slow   # a real process on a pty, started and interrupted (~5 s)
def test_a_real_sigint_mid_sweep_writes_nothing(paired_artifacts, tmp_path):
    """SIGINT once the second run's progress bar is drawn: exit 130, one error line, no
    report directory and no temporary beside it (the directory is published whole or not
    at all)."""
    import subprocess

    from support.cli import child_env, dspark_cmd, interrupt_on_terminal

    out = tmp_path / "bench"
    cmd = dspark_cmd("serve-bench", str(paired_artifacts[DSPARK]), "--target", str(TARGET),
                     "--prompts", str(_prompts(tmp_path)), "--device", "cpu", "--max-new-tokens",
                     "48", "--concurrency", "1,2", "--policy", "full", "-o", str(out))
    proc, seen, sent = interrupt_on_terminal(cmd, b"run 2/4", seconds=120,
                                             stdout=subprocess.PIPE,
                                             env=child_env({"OMP_NUM_THREADS": "1"}))
    proc.stdout.close()
    assert sent, f"the second run never started: {seen[-400:]!r}"
    assert proc.wait() == 130, seen[-800:]
    text = seen.decode(errors="replace")
    assert "Traceback" not in text
    assert len([line for line in text.replace("\r", "\n").splitlines() if "error:" in line]) == 1
    assert not out.exists() and temp_siblings(out) == []


# --- refusals -----------------------------------------------------------------------------

def _refused(proc, error, out, *needles):
    line = assert_refused(proc, error, needles)
    assert not out.exists() and not temp_siblings(out)
    return line


@pytest.mark.parametrize("args, error, needles", [
    (["--concurrency", "0"], E.ConcurrencyError, ["--concurrency"]),
    (["--concurrency", "1,two"], E.ConcurrencyError, ["'two'"]),
    (["--concurrency", "2,1"], E.ConcurrencyError, ["1 after 2"]),
    (["--concurrency", "1,,2"], E.ConcurrencyError, ["''"]),
    (["--concurrency", "1" * 5000], E.ConcurrencyError, ["--concurrency"]),
    (["--concurrency", "2,4"], E.ConcurrencyError, ["4", "3 prompt"]),
    (["--concurrency", "1", "--policy", "dpsark"], E.SchedulingPolicyError, ["dpsark"]),
    (["--concurrency", "1", "--policy", "threshold=1.5"], E.SchedulingPolicyError, ["threshold"]),
    (["--concurrency", "1", "--temperature", "-1"], E.EvalInputError, ["temperature"]),
    (["--concurrency", "1", "--max-new-tokens", "0"], E.EvalInputError, ["max-new-tokens"]),
    (["--concurrency", "1", "--dtype", "int8"], E.EvalInputError, ["dtype"]),
    (["--concurrency", "1", "--max-memory", "lots"], E.EvalInputError, ["max-memory"]),
])
def test_a_bad_option_is_refused(paired_artifacts, tmp_path, args, error, needles):
    out = tmp_path / "bench"
    _refused(_bench(paired_artifacts[DSPARK], out, _prompts(tmp_path), *args), error, out,
             *needles)


def test_a_refusal_in_a_real_process_is_one_line(paired_artifacts, tmp_path):
    out = tmp_path / "bench"
    proc = run_process("serve-bench", str(paired_artifacts[DSPARK]), "--target", str(TARGET),
                       "--prompts", str(_prompts(tmp_path)), "--concurrency", "0", "-o", str(out))
    _refused(proc, E.ConcurrencyError, out, "--concurrency")


def test_a_confidence_policy_with_a_drafter_without_a_head_names_the_artifact(
        paired_artifacts, tmp_path):
    out = tmp_path / "bench"
    for policy in ("dspark", "threshold=0.5", "dspark-async"):
        _refused(_bench(paired_artifacts[DFLASH], out, _prompts(tmp_path), "--concurrency", "1",
                        "--policy", policy), E.SchedulingPolicyError, out, DFLASH, policy)


def test_a_bad_or_small_cost_table_is_refused(paired_artifacts, tmp_path):
    out, prompts = tmp_path / "bench", _prompts(tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text('{"tokens": [1, 2], "steps_per_second": [1.0]}')
    _refused(_bench(paired_artifacts[DSPARK], out, prompts, "--concurrency", "1",
                    "--cost-table", str(bad)), E.CostTableError, out, "bad.json")
    missing = tmp_path / "none.json"
    _refused(_bench(paired_artifacts[DSPARK], out, prompts, "--concurrency", "1",
                    "--cost-table", str(missing)), E.CostTableError, out, "none.json")
    # Concurrency 2 with a block of 7 may send 16 tokens in one step; 15 is too few.
    small = _table(tmp_path / "small.json", list(range(1, 16)))
    _refused(_bench(paired_artifacts[DSPARK], out, prompts, "--concurrency", "1,2",
                    "--cost-table", str(small)), E.CostTableRangeError, out, "15", "16")


def test_an_output_over_an_input_is_refused_even_with_force(paired_artifacts, cost_table,
                                                            tmp_path):
    """--force would delete what the sweep reads: the cost table, the artifact."""
    before = cost_table.read_bytes()
    for out in (cost_table, paired_artifacts[DSPARK], cost_table.parent):
        proc = _bench(paired_artifacts[DSPARK], out, _prompts(tmp_path), "--concurrency", "1",
                      "--cost-table", str(cost_table), "--force")
        assert_refused(proc, E.OutputExistsError)
    assert cost_table.read_bytes() == before
    assert sorted(p.name for p in paired_artifacts[DSPARK].iterdir()) == ["drafter.gguf",
                                                                          "manifest.json"]


def test_a_bad_or_foreign_calibration_is_refused(paired_artifacts, calibration, tmp_path):
    out, prompts = tmp_path / "bench", _prompts(tmp_path)
    path, _ = calibration
    _refused(_bench(paired_artifacts[DFLASH], out, prompts, "--concurrency", "1", "--policy",
                    "full", "--calibration", str(path)), E.CalibrationMismatchError, out,
             "calibration.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"method": "sts"}')
    _refused(_bench(paired_artifacts[DSPARK], out, prompts, "--concurrency", "1",
                    "--calibration", str(broken)), E.CalibrationFileError, out, "broken.json")


@pytest.mark.parametrize("output, error", [("", E.OutputPathError), (".", E.OutputPathError),
                                           ("x" * 300, E.OutputWriteError)])
def test_an_output_path_naming_no_new_directory_is_refused(paired_artifacts, tmp_path,
                                                           monkeypatch, output, error):
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    proc = run_cli("serve-bench", str(paired_artifacts[DSPARK]), "--target", str(TARGET),
                   "--concurrency", "1", "-o", output, "--force")
    assert_refused(proc, error)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_bad_prompts_and_an_existing_output_are_refused(paired_artifacts, tmp_path):
    out = tmp_path / "bench"
    prompts = tmp_path / "bad.jsonl"
    prompts.write_text('{"id": "a", "prompt_ids": [1, 99999]}\n')
    _refused(_bench(paired_artifacts[DSPARK], out, prompts, "--concurrency", "1"),
             E.PromptSetError, out, "bad.jsonl")
    out.mkdir()
    (out / "keep").write_text("mine")
    assert_refused(_bench(paired_artifacts[DSPARK], out, _prompts(tmp_path), "--concurrency", "1"),
                   E.OutputExistsError)
    assert [p.name for p in out.iterdir()] == ["keep"]


def test_tokens_a_step_commits_together_share_its_latency():
    """Four tokens committed 20 ms after the first token are 5 ms each, not 20 ms then three
    zeros; then one token after 10 ms, two after 40 ms."""
    from dspark_convert.evaluation.serve_bench import per_token_latencies

    got = per_token_latencies([1.0, 1.02, 1.02, 1.02, 1.02, 1.03, 1.07, 1.07])
    assert got == pytest.approx([0.005] * 4 + [0.01] + [0.02] * 2)
    assert per_token_latencies([0.5]) == [] and per_token_latencies([]) == []


def test_a_sweep_over_the_memory_budget_is_refused_before_loading(paired_artifacts, tmp_path):
    """The estimate counts every request's caches at the largest concurrency: a budget that
    one request fits and three do not refuses the sweep at 1,3 (78), nothing written."""
    from dspark_convert.runtime.memory import estimate_memory
    from dspark_convert.runtime.qwen3 import plan_target
    from dspark_convert.runtime.weights import plan_drafter
    import torch

    kw = dict(dtype=torch.float32, device=torch.device("cpu"), longest_prompt=5,
              max_new_tokens=MAX_NEW)
    target, drafter = plan_target(TARGET), plan_drafter(paired_artifacts[DSPARK])
    one = estimate_memory(target, drafter, **kw)
    three = estimate_memory(target, drafter, requests=3, **kw)
    assert three.activations > one.activations and three.total > one.total
    budget = (one.total + three.total) // 2
    out = tmp_path / "bench"
    line = _refused(_bench(paired_artifacts[DSPARK], out, _prompts(tmp_path), "--concurrency",
                           "1,3", "--max-memory", str(budget)), E.MemoryBudgetError, out)
    assert "a lower concurrency" in line
