"""evaluation/run.py + report.py: the done-when checks of `dspark eval` on the golden target.

One eval of DeepSeek's DSpark drafter (vanilla_conf_markov) and its plain DFlash drafter
(dflash_shared), both converted with the real CLI, on the package's golden prompt set:

- at temperature 0 every output equals the target's own greedy output;
- tau per artifact equals the mean of the acceptance lengths `dspark smoke --trace` records
  for the same prompts (and every prompt's acceptance lengths and cycles are the trace's);
- the confidence metrics equal DeepSpec's formulas (the plain computation of
  test_eval_metrics) applied to the same cycles;
- STS lowers the held-out ECE or the report says by how much it did not; the step
  confidences keep their order;
- every requested combination is run or listed in not_run with its reason;
- the same seed gives the same report (times aside); Ctrl-C leaves a partial report
  marked incomplete; the report directory is written whole.
"""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from support.paths import GOLDEN_TARGET as TARGET
from dspark_convert.errors import EvalInputError, OutputExistsError
from dspark_convert.evaluation.calibration import fit_sts
from dspark_convert.evaluation.metrics import confidence_data
from dspark_convert.evaluation.prompts import load_prompt_set, resolve_prompts
from dspark_convert.evaluation.report import EvalReport, comparable, read_report, write_report
from dspark_convert.commands.evaluate import EvalInterrupted, run_eval
from dspark_convert.target.model import open_target
from support.cli import run_cli
from support.confidence import assert_same_metrics, plain_metrics

pytestmark = pytest.mark.usefixtures("one_torch_thread")
# The tests of a whole evaluation run (the `report` fixture, ~5 s on 2 cores, or two runs)
# are slow; the fast loop keeps the refusals and the interrupted run.
slow = pytest.mark.slow

STOPS = (2,)
MAX_NEW = 32
THRESHOLDS = [0.3, 0.6]


@pytest.fixture(scope="module")
def artifacts(paired_artifacts):
    return paired_artifacts


@pytest.fixture(scope="module")
def report(artifacts) -> EvalReport:
    return run_eval([artifacts["vanilla_conf_markov"], artifacts["dflash_shared"]], TARGET,
                    temperatures=[0.0], thresholds=THRESHOLDS, max_new_tokens=MAX_NEW, seed=0,
                    device="cpu", calibrate=True, held_out=0.5)


@pytest.fixture(scope="module")
def prompts():
    return resolve_prompts(load_prompt_set(), tokenizer=open_target(TARGET).tokenizer, vocab_size=512,
                           context=512)


def _small_prompts(tmp_path, n=3):
    path = tmp_path / "small.jsonl"
    rows = [{"id": f"p{i}", "prompt_ids": [1, 17 + 5 * i, 33, 90, 250 - i]} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# --- the done-when checks -----------------------------------------------------------------

@slow
def test_temperature_zero_outputs_equal_the_target(report, prompts):
    target_run = report.run("target", None, 0.0, None)
    assert [p.id for p in target_run.prompts] == [p.key for p in prompts]
    greedy = {p.id: p.completion_ids for p in target_run.prompts}
    drafter_runs = [r for r in report.runs if r.kind == "drafter"]
    assert len(drafter_runs) == 2 + len(THRESHOLDS)          # DFlash has no threshold runs
    for r in drafter_runs:
        assert r.lossless is True
        for p in r.prompts:
            assert p.lossless is True and p.completion_ids == greedy[p.id], (r.artifact, p.id)
    assert report.lossless is True
    # and the baseline is the runtime's own target_greedy
    from dspark_convert.runtime.qwen3 import Qwen3Target
    from dspark_convert.runtime.speculative import target_greedy

    model = Qwen3Target(TARGET, device=torch.device("cpu"))
    for p in prompts[:3]:
        g = target_greedy(model, list(p.ids), max_new_tokens=MAX_NEW, stop_token_ids=STOPS)
        assert list(g.output_ids[len(p.ids):]) == greedy[p.key]


@slow
@pytest.mark.parametrize("name", ["vanilla_conf_markov", "dflash_shared"])
def test_tau_equals_smoke_trace(report, artifacts, prompts, tmp_path, name):
    trace = tmp_path / "trace.json"
    args = ["smoke", str(artifacts[name]), "--target", str(TARGET), "--max-new-tokens", str(MAX_NEW),
            "--trace", str(trace)]
    for p in prompts:
        args += ["--prompt-ids", ",".join(map(str, p.ids))]
    # In-process (tests/support/cli.py), on the module's one torch thread.
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stderr
    runs = json.loads(trace.read_text())["runs"]
    lengths = [a for run in runs for a in run["acceptance_lengths"]]
    r = report.run("drafter", name, 0.0, 0.0)
    assert r.acceptance.tau == pytest.approx(sum(lengths) / len(lengths), abs=1e-12)
    for prompt_run, trace_run in zip(r.prompts, runs):
        assert prompt_run.acceptance_lengths == trace_run["acceptance_lengths"]
        assert [(c.proposed, c.accepted, c.next_token) for c in prompt_run.cycles] == \
            [(c["proposed"], c["accepted"], c["next_token"]) for c in trace_run["cycles"]]
    assert r.acceptance.verify_steps == len(lengths)


@slow
def test_confidence_metrics_are_deepspecs_on_the_same_cycles(report):
    art = next(a for a in report.artifacts if a.name == "vanilla_conf_markov")
    run = report.run("drafter", art.name, 0.0, 0.0)
    assert art.confidence == run.confidence and art.confidence.temperature == 0.0
    steps = [(c.proposed, c.accepted, c.confidence_logits) for p in run.prompts for c in p.cycles]
    assert art.confidence.proposals == len(steps)
    assert_same_metrics(art.confidence.per_position, plain_metrics(steps, 7, STOPS))
    fields = set(art.confidence.per_position[0].model_dump())
    assert fields == {"position", "total_weight", "ece", "auc", "brier", "pred_mean", "target_mean",
                      "reliability"}
    # Only threshold-0 runs of an artifact with a head carry them (as in DeepSpec).
    for r in report.runs:
        assert (r.confidence is not None) == (r.artifact == art.name and r.confidence_threshold == 0.0)
    assert next(a for a in report.artifacts if a.name == "dflash_shared").confidence is None


@slow
def test_sts_on_the_golden_drafter(report, prompts):
    art = next(a for a in report.artifacts if a.name == "vanilla_conf_markov")
    cal = art.calibration
    assert cal is not None and art.calibration_file == "calibration-vanilla_conf_markov.json"
    assert cal.drafter_gguf_sha256 == art.drafter_gguf_sha256 and cal.target == report.target
    assert cal.prompt_set_sha256 == report.prompt_set.sha256
    assert sorted(cal.split.calibration_ids + cal.split.held_out_ids) == sorted(p.key for p in prompts)
    assert len(cal.split.held_out_ids) == 8 and len(cal.temperatures) == 7
    run = report.run("drafter", art.name, 0.0, 0.0)
    by_id = {p.id: [(c.proposed, c.accepted, c.confidence_logits) for c in p.cycles] for p in run.prompts}
    fit_steps = [s for k in cal.split.calibration_ids for s in by_id[k]]
    held_steps = [s for k in cal.split.held_out_ids for s in by_id[k]]
    assert fit_sts(confidence_data(fit_steps, block_size=7, stop_token_ids=STOPS), cal.grid) == cal.temperatures
    before, after = plain_metrics(held_steps, 7, STOPS), plain_metrics(held_steps, 7, STOPS, cal.temperatures)
    for p, b, a in zip(cal.per_position, before, after):
        assert p.ece_before == pytest.approx(b["ece"], abs=1e-7)
        assert p.ece_after == pytest.approx(a["ece"], abs=1e-7)
        assert p.step_auc_before == p.step_auc_after       # order-preserving
    assert abs(cal.per_position[0].auc_after - cal.per_position[0].auc_before) < 0.02
    assert_same_metrics(art.held_out_raw.per_position, before)
    assert_same_metrics(art.held_out_calibrated.per_position, after)
    # Lowered, or the report says by how much it was not.
    assert cal.improved == (cal.ece_mean_after < cal.ece_mean_before)
    shown = f"{100 * cal.ece_mean_before:.2f}% -> {100 * cal.ece_mean_after:.2f}%"
    assert shown in cal.note
    assert ("points lower" in cal.note) == cal.improved
    assert any(n.kind == "calibration" and n.artifact == "dflash_shared" and "no confidence head" in n.reason
               for n in report.not_run)


@slow
def test_every_requested_combination_is_run_or_listed(report):
    seen = {(r.kind, r.artifact, r.temperature, r.confidence_threshold) for r in report.runs}
    seen |= {(n.kind, n.artifact, n.temperature, n.confidence_threshold) for n in report.not_run}
    want = {("target", None, 0.0, None)}
    for name in ("vanilla_conf_markov", "dflash_shared"):
        want |= {("drafter", name, 0.0, c) for c in [0.0, *THRESHOLDS]}
    want |= {("calibration", "dflash_shared", 0.0, 0.0)}
    assert seen == want
    for n in report.not_run:
        assert n.artifact == "dflash_shared" and "no confidence head" in n.reason


@slow
def test_run_metrics_and_environment(report, artifacts):
    for r in report.runs:
        assert r.new_tokens == sum(p.new_tokens for p in r.prompts) > 0
        assert r.committed_tokens_per_second > 0 and r.peak_memory is not None
        if r.kind == "drafter":
            assert r.speedup == pytest.approx(
                r.committed_tokens_per_second / report.run("target", None, 0.0, None).committed_tokens_per_second)
            a = r.acceptance
            steps = [c for p in r.prompts for c in p.cycles]
            assert a.accepted_per_verify == pytest.approx(sum(c.accepted for c in steps) / len(steps))
            assert a.tau == pytest.approx(a.accepted_per_verify + 1, abs=0.05)   # few stops
    thr = [report.run("drafter", "vanilla_conf_markov", 0.0, c) for c in [0.0, *THRESHOLDS]]
    lengths = [r.acceptance.mean_verified_length for r in thr]
    assert lengths[0] == 7.0 and lengths == sorted(lengths, reverse=True)     # the cutoff cuts
    env = report.environment
    assert env.torch_version == torch.__version__ and env.dtype == "float32" and env.device == "cpu"
    for art in report.artifacts:
        gguf = artifacts[art.name] / "drafter.gguf"
        assert art.drafter_gguf_sha256 == hashlib.sha256(gguf.read_bytes()).hexdigest()
    assert report.prompt_set.sha256 == load_prompt_set().sha256 and report.prompt_set.default
    t = report.target
    assert t.config_sha256 == hashlib.sha256((TARGET / "config.json").read_bytes()).hexdigest()
    assert t.weights_sha256 == hashlib.sha256((TARGET / "model.safetensors").read_bytes()).hexdigest()
    assert report.complete and report.incomplete_reason is None


@slow
def test_report_directory(report, tmp_path):
    out = tmp_path / "report"
    written = write_report(report, out)
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(p.name for p in written) == sorted([
        "report.json", "report.md", "acceptance.png", "static_cutoff.png",
        "reliability-vanilla_conf_markov.png", "speed.png", "calibration-vanilla_conf_markov.json"])
    for png in out.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert read_report(out / "report.json") == report
    from dspark_convert.evaluation.calibration import read_calibration

    assert read_calibration(out / "calibration-vanilla_conf_markov.json") == report.artifacts[0].calibration
    md = (out / "report.md").read_text()
    assert "| target alone | 0 |" in md and "| vanilla_conf_markov (cutoff 0.3) | 0 |" in md
    assert "## Confidence head: vanilla_conf_markov" in md and "## Not run" in md
    assert "INCOMPLETE" not in md
    with pytest.raises(OutputExistsError):
        write_report(report, out)
    write_report(report, out, force=True)


@slow
def test_same_seed_same_report(artifacts, tmp_path):
    small = _small_prompts(tmp_path)
    args = dict(temperatures=[1.0], thresholds=[0.5], max_new_tokens=16, device="cpu")
    a = run_eval([artifacts["vanilla_conf_markov"]], TARGET, small, seed=5, **args)
    b = run_eval([artifacts["vanilla_conf_markov"]], TARGET, small, seed=5, **args)
    c = run_eval([artifacts["vanilla_conf_markov"]], TARGET, small, seed=6, **args)
    assert comparable(a) == comparable(b)
    assert comparable(a) != comparable(c)
    assert a.runs[0].kind == "target" and a.runs[0].temperature == 1.0    # sampled baseline
    assert all(r.lossless is None for r in a.runs)


class _InterruptAt:
    """A progress sink that presses Ctrl-C after ``n`` prompts of the bar named ``label``
    (validate's byte bars and the others pass through)."""

    def __init__(self, label: str, n: int) -> None:
        self.label, self.n, self.current, self.labels = label, n, None, []

    def start(self, label, total):
        self.current = label
        self.labels.append(label)

    def advance(self, amount):
        if self.current == self.label:
            self.n -= amount
            if self.n == 0:
                raise KeyboardInterrupt

    def finish(self):
        self.current = None


def test_ctrl_c_leaves_a_partial_report_marked_incomplete(artifacts, tmp_path):
    small = _small_prompts(tmp_path)
    progress = _InterruptAt("vanilla_conf_markov, T=0, cutoff off", 2)   # its 2nd of 3 prompts
    with pytest.raises(EvalInterrupted) as info:
        run_eval([artifacts["vanilla_conf_markov"], artifacts["dflash_shared"]], TARGET, small,
                 thresholds=[0.5], max_new_tokens=8, device="cpu", calibrate=True, progress=progress)
    assert isinstance(info.value, KeyboardInterrupt)
    assert progress.labels[-2:] == ["target alone, T=0", "vanilla_conf_markov, T=0, cutoff off"]
    partial = info.value.report
    assert not partial.complete and "interrupted" in partial.incomplete_reason
    assert [r.kind for r in partial.runs] == ["target"]
    missing = {(n.kind, n.artifact, n.confidence_threshold) for n in partial.not_run}
    assert missing == {("drafter", "vanilla_conf_markov", 0.0), ("drafter", "dflash_shared", 0.0),
                       ("drafter", "vanilla_conf_markov", 0.5), ("drafter", "dflash_shared", 0.5),
                       ("calibration", "vanilla_conf_markov", 0.0), ("calibration", "dflash_shared", 0.0)}
    # What the interruption stopped says so; what could never run (the plain DFlash drafter
    # has no confidence head) keeps its own reason (it once said "interrupted").
    never = {("drafter", "dflash_shared", 0.5), ("calibration", "dflash_shared", 0.0)}
    for n in partial.not_run:
        key = (n.kind, n.artifact, n.confidence_threshold)
        assert ("no confidence head" if key in never else "interrupted") in n.reason, (key, n.reason)
    out = tmp_path / "partial"
    write_report(partial, out)
    assert read_report(out / "report.json").complete is False
    assert (out / "report.md").read_text().splitlines()[2].startswith("> **INCOMPLETE**")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_is_reported_not_run(artifacts, tmp_path):
    rep = run_eval([artifacts["vanilla_conf_markov"]], TARGET, _small_prompts(tmp_path),
                   thresholds=[0.5], max_new_tokens=8, device="cuda", calibrate=True)
    assert rep.runs == [] and rep.environment.device == "none"
    assert rep.target is not None and rep.target.vocab_size == 512     # checked before the device
    kinds = sorted((n.kind, n.confidence_threshold) for n in rep.not_run)
    assert kinds == [("calibration", 0.0), ("drafter", 0.0), ("drafter", 0.5), ("target", None)]
    assert all("CUDA is not available" in n.reason for n in rep.not_run)
    assert rep.artifacts[0].block_size == 7 and rep.artifacts[0].confidence_head


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_run_is_lossless(artifacts, tmp_path):
    rep = run_eval([artifacts["vanilla_conf_markov"], artifacts["dflash_shared"]], TARGET,
                   thresholds=[0.5], max_new_tokens=MAX_NEW, device="cuda")
    assert rep.environment.device.startswith("cuda") and rep.lossless is True
    assert all(r.peak_memory.kind == "cuda_max_allocated" for r in rep.runs)


@pytest.mark.parametrize("kwargs, words", [
    (dict(artifacts=[]), "no artifact"),
    (dict(temperatures=[-1.0]), "--temperature"),
    (dict(temperatures=[]), "--temperature"),
    (dict(thresholds=[1.5]), "--threshold"),
    (dict(max_new_tokens=0), "--max-new-tokens"),
    (dict(held_out=1.0), "--held-out"),
    (dict(held_out=0.0), "--held-out"),
    (dict(seed=-1), "--seed"),
])
def test_bad_options_are_refused_before_anything_runs(artifacts, kwargs, words):
    args = dict(artifacts=[artifacts["vanilla_conf_markov"]], target=TARGET)
    args.update(kwargs)
    with pytest.raises(EvalInputError) as info:
        run_eval(args.pop("artifacts"), args.pop("target"), **args)
    assert words in info.value.message and info.value.exit_code == 91


def test_the_same_artifact_twice_is_refused(artifacts):
    a = artifacts["vanilla_conf_markov"]
    with pytest.raises(EvalInputError, match="the same artifact"):
        run_eval([a, a.parent / ".." / a.parent.name / a.name], TARGET)
