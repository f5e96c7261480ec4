"""`dspark eval` and `dspark serve-bench` with every drafter kind (commands/evaluate_kinds.py):
on the golden Qwen3 target the target alone, DeepSpec's DFlash and DSpark drafters (converted)
and speculators' DFlash2 drafter (its checkpoint directory); on the golden Gemma4 target the
target alone, transformers' Gemma 4 assistant (MTP, its checkpoint directory) and DeepSpec's
Gemma4 DFlash and DSpark drafters. Every metric of each kind's run, lossless at temperature
0, and the reason of each combination a kind cannot run; serve-bench's full policy on DFlash2
(served one request at a time, equal to the target alone); the side-by-side commands of
docs/PERFORMANCE.md."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from support.cli import assert_refused, run_cli
from support.gemma4 import GEMMA4, GEMMA4_DRAFTERS, GEMMA4_TARGET
from support.paths import GOLDEN, GOLDEN_TARGET, ROOT, TRAINED_DRAFTERS

from dspark_convert import errors as E

DFLASH2 = GOLDEN / "reference" / "dflash2" / "draft"
ASSISTANT = GOLDEN / "reference" / "gemma4_assistant" / "assistant"
NEW_TOKENS = 12

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _prompts(path, n: int = 3):
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            fh.write(json.dumps({"id": f"p{i}", "prompt": f"Write haiku number {i} about the sea."})
                     + "\n")
    return path


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory, paired_artifacts):
    """The golden Qwen3 target's eval with DFlash, DFlash2 (source) and DSpark, at
    temperatures 0 and 0.7, threshold 0.5."""
    from dspark_convert.commands.evaluate import run_eval

    root = tmp_path_factory.mktemp("kinds-qwen3")
    arts = [paired_artifacts["dflash_shared"], DFLASH2, paired_artifacts["vanilla_conf_markov"]]
    return run_eval(arts, GOLDEN_TARGET, _prompts(root / "prompts.jsonl"),
                    temperatures=[0.0, 0.7], thresholds=[0.5], max_new_tokens=NEW_TOKENS,
                    device="cpu")


@pytest.fixture(scope="module")
def gemma4(tmp_path_factory):
    from dspark_convert.commands.convert import convert
    from dspark_convert.commands.evaluate import run_eval

    root = tmp_path_factory.mktemp("kinds-gemma4")
    arts = [ASSISTANT]
    for name in ("gemma4_dflash", "gemma4_vanilla_conf_markov"):
        convert(GEMMA4_DRAFTERS[name], root / name, target=GEMMA4_TARGET)
        arts.append(root / name)
    return run_eval(arts, GEMMA4_TARGET, GEMMA4 / "prompts.jsonl", temperatures=[0.0, 0.7],
                    thresholds=[0.5], max_new_tokens=NEW_TOKENS, device="cpu")


def _check_every_metric(report, methods: set[str]) -> None:
    zero = [r for r in report.runs if r.temperature == 0.0 and not r.confidence_threshold]
    assert {r.method for r in zero} == methods
    for r in zero:
        where = f"{r.method} {r.artifact}"
        assert r.new_tokens > 0 and r.committed_tokens_per_second > 0, where
        assert r.peak_memory is not None and r.peak_memory.bytes > 0, where
        p50, p99 = r.token_latency_p50_seconds, r.token_latency_p99_seconds
        assert p50 is not None and p99 is not None and 0 < p50 <= p99 < 10, where
        if r.method == "target":
            assert r.acceptance is None and r.lossless is None
            continue
        a = r.acceptance
        assert a.verify_steps > 0 and a.tau >= 1.0, where
        assert a.tau == pytest.approx(a.accepted_per_verify + 1, abs=0.2), where
        assert a.acceptance_by_position[0] is not None, where
        assert r.speedup is not None and r.draft_seconds_per_step is not None, where
        assert r.lossless is True, where
        assert all(p.lossless for p in r.prompts), where
        # By context depth: every verify step in one bucket, and the buckets together give
        # the run's own acceptance at the first position.
        rows = r.acceptance_by_depth
        assert rows and sum(row.drafts for row in rows) == a.verify_steps, where
        assert rows[0].depth == "0-63", where
        reached, hit = sum(row.reached[0] for row in rows), sum(row.hit[0] for row in rows)
        assert hit / reached == pytest.approx(a.acceptance_by_position[0]), where
        # Each cycle's record and the run's tau agree.
        lengths = [n for p in r.prompts for n in p.acceptance_lengths]
        assert a.tau == pytest.approx(sum(lengths) / len(lengths))
    assert report.lossless is True


def test_qwen3_every_kind_on_the_same_prompts(qwen3):
    _check_every_metric(qwen3, {"target", "dflash", "dflash2", "dspark"})
    by_name = {a.name: a for a in qwen3.artifacts}
    assert by_name["draft"].method == "dflash2" and by_name["draft"].weights_file == "model.safetensors"
    assert by_name["draft"].block_size == 8 and not by_name["draft"].confidence_head
    # DFlash2 proposes block_size - 1 drafts per cycle: acceptance by position is that wide.
    run = qwen3.run("drafter", "draft", 0.0, 0.0)
    assert len(run.acceptance.acceptance_by_position) == 7
    assert all(len(c.proposed) <= 7 for p in run.prompts for c in p.cycles)
    # At 0.7 the kinds that sample ran; DSpark's threshold too.
    ran = {(r.method, r.temperature, r.confidence_threshold) for r in qwen3.runs}
    assert {("dspark", 0.7, 0.0), ("dflash", 0.7, 0.0), ("dspark", 0.0, 0.5),
            ("target", 0.7, None)} <= ran


def test_qwen3_not_run_reasons(qwen3):
    from dspark_convert.errors import DFlash2RunError
    from dspark_convert.runtime.dflash2_loop import check_greedy

    with pytest.raises(DFlash2RunError) as refusal:
        check_greedy(0.7)
    reasons = {(n.method, n.temperature, n.confidence_threshold): n.reason for n in qwen3.not_run}
    assert reasons[("dflash2", 0.7, 0.0)] == refusal.value.message
    assert "no sampled walk" in reasons[("dflash2", 0.7, 0.0)]
    for t in (0.0, 0.7):
        assert "no confidence head" in reasons[("dflash2", t, 0.5)]
        assert "no confidence head" in reasons[("dflash", t, 0.5)]
    # Exactly those: everything else ran.
    assert len(reasons) == len(qwen3.not_run) == 5
    assert ("dflash2", 0.0, 0.0) not in reasons


def test_gemma4_every_kind_on_the_same_prompts(gemma4):
    _check_every_metric(gemma4, {"target", "mtp", "dflash", "dspark"})
    mtp = gemma4.run("drafter", "assistant", 0.0, 0.0)
    assert mtp.method == "mtp"
    assert len(mtp.acceptance.acceptance_by_position) == 4      # num_assistant_tokens
    # The assistant samples exactly (runtime/gemma4_assistant.py): it runs at 0.7.
    sampled = gemma4.run("drafter", "assistant", 0.7, 0.0)
    assert sampled is not None and sampled.acceptance.verify_steps > 0 and sampled.lossless is None
    reasons = {(n.method, n.temperature, n.confidence_threshold): n.reason for n in gemma4.not_run}
    assert set(reasons) == {("mtp", 0.0, 0.5), ("mtp", 0.7, 0.5), ("dflash", 0.0, 0.5),
                            ("dflash", 0.7, 0.5)}
    assert "Gemma 4 assistant" in reasons[("mtp", 0.0, 0.5)]


def test_report_md_has_one_comparison_row_per_kind(qwen3, tmp_path):
    from dspark_convert.evaluation.report import read_report, render_markdown, write_report

    write_report(qwen3, tmp_path / "report")
    again = read_report(tmp_path / "report" / "report.json")
    assert [r.method for r in again.runs] == [r.method for r in qwen3.runs]
    md = render_markdown(qwen3)
    assert md.count("## Comparison") == 1
    table = md.split("## Comparison")[1].split("\n\n")[1].splitlines()[2:]
    rows = [line for line in table if "| 0 |" in line]
    assert [line.split("|")[1].strip() for line in rows] == [
        "target alone", "DFlash", "DFlash2", "DSpark"]
    assert all(line.rstrip().endswith("| yes |") for line in rows[1:])
    depth = md.split("### By context depth")[1].split("\n\n")[2].splitlines()[2:]
    assert {line.split("|")[1].strip() for line in depth} == {
        "dflash_shared", "draft", "vanilla_conf_markov"}


def test_a_checkpoint_of_another_family_is_refused_before_loading(tmp_path):
    from dspark_convert.commands.evaluate import run_eval

    with pytest.raises(E.DFlash2TargetError, match="qwen3-dspark"):
        run_eval([DFLASH2], GEMMA4_TARGET, GEMMA4 / "prompts.jsonl", max_new_tokens=4,
                 device="cpu")
    with pytest.raises(E.AssistantTargetError, match="gemma4-dspark"):
        run_eval([ASSISTANT], GOLDEN_TARGET, max_new_tokens=4, device="cpu")


# --- serve-bench ------------------------------------------------------------------------

def test_serve_bench_full_on_dflash2_is_the_target_alone(tmp_path):
    from dspark_convert.commands.serve_bench import run_serve_bench
    from dspark_convert.evaluation.serve_report import ServeBenchReport

    outcome = run_serve_bench([DFLASH2], GOLDEN_TARGET, _prompts(tmp_path / "p.jsonl", 4),
                              concurrencies="1,2", policies=["full"], max_new_tokens=NEW_TOKENS,
                              device="cpu")
    report = outcome.report
    ServeBenchReport.model_validate(report.model_dump(mode="json"))
    art = report.artifacts[0]
    assert (art.method, art.packed, art.confidence_head) == ("dflash2", True, False)
    assert art.weights_file == "model.safetensors"
    runs = [r for r in report.runs if r.artifact is not None]
    assert [(r.policy, r.concurrency) for r in runs] == [("full", 1), ("full", 2)]
    for r in runs:
        assert r.lossless is True and all(q.equal_to_target_only for q in r.requests)
        assert r.verify_steps > 0 and r.draft_tokens_sent > 0 and r.accepted_per_step > 1
        assert r.token_latency_p50_seconds is not None and r.peak_memory_bytes > 0
        assert len(r.acceptance_by_position) == art.block_size - 1
    assert report.lossless is True
    # Packed: at concurrency 2 a verify step carries both requests' blocks (B - 1 drafts
    # at most each), as the batch-1 loop drafts them.
    c1, c2 = (outcome.decisions[f"decisions/draft.full.c{c}.jsonl"] for c in (1, 2))
    assert all(len(line.requests) == 1 for line in c1)
    assert max(len(line.requests) for line in c2) == 2
    assert all(r.length <= 7 for line in c2 for r in line.requests)
    assert len(c2) < len(c1)


def test_serve_bench_refuses_what_dflash2_cannot_run(tmp_path):
    from dspark_convert.commands.serve_bench import run_serve_bench

    prompts = _prompts(tmp_path / "p.jsonl", 2)
    with pytest.raises(E.SchedulingPolicyError, match="DFlash2 drafter"):
        run_serve_bench([DFLASH2], GOLDEN_TARGET, prompts, concurrencies="1",
                        policies=["threshold=0.5"], max_new_tokens=4, device="cpu")
    with pytest.raises(E.DFlash2RunError, match="no sampled walk"):
        run_serve_bench([DFLASH2], GOLDEN_TARGET, prompts, concurrencies="1",
                        policies=["full"], max_new_tokens=4, temperature=0.5, device="cpu")


def test_serve_bench_full_on_the_assistant(tmp_path):
    """Not packed: each request alone through assisted_generate, one verify step per
    cycle, the outputs the target alone's."""
    from dspark_convert.commands.serve_bench import run_serve_bench

    outcome = run_serve_bench([ASSISTANT], GEMMA4_TARGET, GEMMA4 / "prompts.jsonl",
                              concurrencies="2", policies=["full"], max_new_tokens=NEW_TOKENS,
                              device="cpu")
    report = outcome.report
    run = next(r for r in report.runs if r.artifact is not None)
    assert (report.artifacts[0].method, report.artifacts[0].packed) == ("mtp", False)
    assert run.lossless is True and run.verify_steps > 0 and run.accepted_per_step > 1
    lines = outcome.decisions["decisions/assistant.full.c2.jsonl"]
    assert all(len(line.requests) == 1 for line in lines) and len(lines) == run.verify_steps
    with pytest.raises(E.SchedulingPolicyError, match="assistant"):
        run_serve_bench([ASSISTANT], GEMMA4_TARGET, GEMMA4 / "prompts.jsonl",
                        concurrencies="1", policies=["dspark"], max_new_tokens=4, device="cpu")


# --- the side-by-side commands (docs/PERFORMANCE.md) -----------------------------------------

def _side_by_side_commands() -> list[list[str]]:
    """The shell block of docs/PERFORMANCE.md's "Every drafter kind, side by side" section
    (the README points there), as argument lists (G expanded, continuation lines joined,
    OMP_NUM_THREADS dropped)."""
    text = (ROOT / "docs" / "PERFORMANCE.md").read_text(encoding="utf-8")
    section = text.split("## Every drafter kind, side by side", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1).replace("\\\n", " ")
    commands, variables = [], {}
    for line in block.splitlines():
        words = shlex.split(line)
        if len(words) == 1 and "=" in words[0]:
            name, value = words[0].split("=", 1)
            variables[name] = value
            continue
        words = [re.sub(r"\$(\w+)", lambda m: variables[m.group(1)], w) for w in words
                 if not w.startswith("OMP_NUM_THREADS=")]
        commands.append(words)
    return commands


def test_the_side_by_side_commands_run_on_the_golden_fixtures(tmp_path, monkeypatch):
    """The side-by-side commands (docs/PERFORMANCE.md) as written, in a scratch directory holding the golden models,
    with 2 prompts and 6 new tokens: each eval has one comparison row per kind, lossless."""
    commands = _side_by_side_commands()
    assert [c[:2] for c in commands] == [["dspark", "convert"]] * 3 + [["dspark", "eval"]] + \
        [["dspark", "convert"]] * 3 + [["dspark", "eval"]]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "golden").symlink_to(ROOT / "golden")
    prompts = _prompts(tmp_path / "p.jsonl", 2)
    for words in commands:
        args = words[1:]
        if args[0] == "eval":
            i = args.index("--max-new-tokens")
            args[i + 1] = "6"
            args += ["--prompts", str(prompts), "--threshold", "0.5"]
        proc = run_cli(*args)
        assert proc.returncode == 0, (args, proc.stderr)
    for name, kinds in (("eval-qwen3", {"target", "dflash", "dflash2", "dspark"}),
                        ("eval-gemma4", {"target", "mtp", "dflash", "dspark"})):
        report = json.loads((tmp_path / "build" / "kinds" / name / "report.json").read_text())
        assert {r["method"] for r in report["runs"]} == kinds
        assert report["lossless"] is True
        md = (tmp_path / "build" / "kinds" / name / "report.md").read_text()
        assert md.count("## Comparison") == 1


def test_cli_eval_refuses_a_dflash2_checkpoint_with_a_gemma4_target(tmp_path):
    proc = run_cli("eval", str(DFLASH2), "--target", str(GEMMA4_TARGET), "--device", "cpu",
                   "-o", str(tmp_path / "out"))
    assert_refused(proc, E.DFlash2TargetError, ["qwen3-dspark"])
    assert not (tmp_path / "out").exists()


def test_converted_dflash2_and_assistant_artifacts_run_as_their_checkpoints(tmp_path):
    """`dspark convert` of each checkpoint (bind gives the kind's plan) and the checkpoint
    directory itself: the same kind, the same drafts and outputs, cycle for cycle."""
    from dspark_convert.commands.convert import convert
    from dspark_convert.commands.evaluate import run_eval

    for source, target, prompts in ((DFLASH2, GOLDEN_TARGET, _prompts(tmp_path / "p.jsonl")),
                                    (ASSISTANT, GEMMA4_TARGET, GEMMA4 / "prompts.jsonl")):
        artifact = tmp_path / f"{source.name}-artifact"
        convert(source, artifact, target=target)
        report = run_eval([source, artifact], target, prompts, thresholds=[],
                          max_new_tokens=NEW_TOKENS, device="cpu")
        ours, theirs = (report.run("drafter", a.name, 0.0, 0.0) for a in report.artifacts)
        assert ours.method == theirs.method and ours.method in ("dflash2", "mtp")
        assert [(c.proposed, c.accepted) for p in ours.prompts for c in p.cycles] == \
            [(c.proposed, c.accepted) for p in theirs.prompts for c in p.cycles]
        assert ours.lossless is True and theirs.lossless is True
        arts = {a.name: a for a in report.artifacts}
        assert arts[artifact.name].weights_file is None        # a drafter.gguf's SHA-256
        assert arts[source.name].weights_file == "model.safetensors"


def test_engines_are_handed_the_kinds_they_run(paired_artifacts):
    """--engine: eval hands an engine the DSpark-family artifacts its run function takes;
    a DFlash2 drafter is listed as not run for it, with the reason."""
    from dspark_convert.commands.binding import open_run_target
    from dspark_convert.commands.evaluate import _engine_arts, artifact_names, bind_artifacts

    paths = [DFLASH2, paired_artifacts["vanilla_conf_markov"]]
    arts, _, _ = bind_artifacts(paths, artifact_names(paths), open_run_target(GOLDEN_TARGET),
                                None)
    assert [a.kind for a in arts] == ["dflash2", "dspark"]
    taken, refused = _engine_arts("dspark-mlx", arts)
    assert [a.kind for a in taken] == ["dspark"]
    [entry] = refused
    assert (entry.engine, entry.method, entry.artifact) == ("dspark-mlx", "dflash2", "draft")
    assert "DFlash2 drafter is not one of them" in entry.reason
