"""`dspark eval` through the CLI (and `dspark smoke --calibration`): the report directory,
the refusals (each its one line and code, nothing written), Ctrl-C (a real SIGINT to a
child process mid-run leaves a partial report), bfloat16 losslessness at temperature 0,
and a calibration moving the cut exactly where calibration.cut_length predicts."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess

import pytest
import torch

from conftest import ROOT
from support.paths import GOLDEN_TARGET as TARGET, TRAINED_DRAFTERS
from dspark_convert.errors import (
    CalibrationFileError,
    CalibrationMismatchError,
    DeviceUnavailableError,
    EvalInputError,
    MemoryBudgetError,
    OutputExistsError,
    PromptSetError,
)
from dspark_convert.evaluation.calibration import cut_length, read_calibration
from dspark_convert.evaluation.report import read_report
from support.cli import (assert_refused, child_env, dspark_cmd, interrupt_on_terminal, run_cli,
                         temp_siblings)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BLOCK = 7
STOPS = (2,)


def _prompts(path, n):
    rows = [{"id": f"p{i}", "prompt_ids": [1, 17 + 5 * i, 33, 90, 250 - i, 7 + i]} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("cli-eval")


@pytest.fixture(scope="module")
def artifacts(paired_artifacts):
    return paired_artifacts


@pytest.fixture(scope="module")
def small(root):
    return _prompts(root / "small.jsonl", 6)


def _eval(artifacts, names, out, *args):
    return run_cli("eval", *[str(artifacts[n]) for n in names], "--target", str(TARGET),
                   "--device", "cpu", "-o", str(out), *args)


@pytest.fixture(scope="module")
def calibrated(artifacts, small, root):
    """One eval of both drafters with --calibrate and --json: (its stdout document, dir)."""
    out = root / "calibrated"
    proc = _eval(artifacts, ["vanilla_conf_markov", "dflash_shared"], out, "--prompts", str(small),
                 "--max-new-tokens", "16", "--threshold", "0.3", "--calibrate", "--json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""                      # no bars off a terminal, no warning
    return json.loads(proc.stdout), out


def _cycles(run):
    return [c for p in run.prompts for c in p.cycles]


def _steps(run):
    """What a verify step decided (its measured times aside)."""
    return [(c.proposed, c.accepted, c.next_token, c.confidence_logits) for c in _cycles(run)]


# --- the report directory -------------------------------------------------------------------

@pytest.mark.slow   # needs the calibrated eval run (`calibrated`: both drafters, --calibrate, ~3 s)
def test_report_directory_and_json(calibrated):
    doc, out = calibrated
    names = {"report.json", "report.md", "acceptance.png", "static_cutoff.png", "speed.png",
             "reliability-vanilla_conf_markov.png", "calibration-vanilla_conf_markov.json"}
    assert {p.name for p in out.iterdir()} == names
    assert doc["ok"] is True and sorted(os.path.basename(f) for f in doc["files"]) == sorted(names)
    report = read_report(out / "report.json")              # the schema's model, strict
    assert doc["report"] == report.model_dump(mode="json")
    assert report.complete and report.lossless is True
    assert report.settings.dtype == "float32" and report.settings.verify == "batched"
    assert report.environment.dtype == "float32" and report.environment.device == "cpu"
    cal = read_calibration(out / "calibration-vanilla_conf_markov.json")
    assert cal == report.artifacts[0].calibration and len(cal.temperatures) == BLOCK
    md = (out / "report.md").read_text()
    assert "| target alone | 0 |" in md and "| vanilla_conf_markov (cutoff 0.3) | 0 |" in md
    assert "float32 (batched verify)" in md and "### Sequential Temperature Scaling" in md
    for png in out.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_text_summary_names_every_run_and_what_was_not_run(artifacts, small, tmp_path):
    out = tmp_path / "report"
    proc = _eval(artifacts, ["dflash_shared"], out, "--prompts", str(small), "--max-new-tokens", "4",
                 "--threshold", "0.5")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    # The memory estimate, printed before loading, then the run's header.
    assert lines[0].startswith("memory estimate ") and "(float32)" in lines[0]
    assert lines[1].startswith(f"eval on {TARGET}") and "float32, batched verify" in lines[1]
    assert any(line.startswith("  target alone, T=0: ") for line in lines)
    assert any("dflash_shared (cutoff off), T=0" in line and "= target greedy" in line for line in lines)
    assert any("not run: drafter dflash_shared (T=0, threshold 0.5): the artifact has no "
               "confidence head" in line for line in lines)
    assert lines[-1].startswith(f"wrote {out}: ") and "report.json" in lines[-1]


def test_the_memory_estimate_counts_every_artifact_loaded_at_once(artifacts, small, tmp_path):
    """The estimate eval checks before loading is smoke's, with every drafter's weights
    added: the target and both drafters are loaded together."""
    names = ["vanilla_conf_markov", "dflash_shared"]
    smoke = {}
    for name in names:
        proc = run_cli("smoke", str(artifacts[name]), "--target", str(TARGET), "--device", "cpu",
                       "--prompt-ids", "1,17,33", "--max-new-tokens", "2", "--json")
        assert proc.returncode == 0, proc.stderr
        smoke[name] = json.loads(proc.stdout)["memory"]
    out = tmp_path / "report"
    proc = _eval(artifacts, names, out, "--prompts", str(small), "--max-new-tokens", "2",
                 "--threshold", "0")
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith("memory estimate ") and "drafters" in first and "available" in first
    m = read_report(out / "report.json").memory_estimate
    assert m.target_weights_bytes == smoke[names[0]]["target_weights_bytes"]
    assert m.drafter_weights_bytes == sum(smoke[n]["drafter_weights_bytes"] for n in names)
    assert m.estimate_bytes == (m.target_weights_bytes + m.drafter_weights_bytes
                                + m.activations_bytes + m.runtime_bytes)


def test_an_estimate_over_max_memory_is_refused_before_loading(artifacts, small, tmp_path):
    out = tmp_path / "report"
    line = assert_refused(_eval(artifacts, ["dflash_shared"], out, "--prompts", str(small),
                                "--max-memory", "100MB"),
                          MemoryBudgetError, ["expected at most 100.0 MB (--max-memory on cpu)",
                                              "--dtype bfloat16, fewer artifacts"])
    assert "estimate of" in line
    assert not out.exists() and temp_siblings(out) == []
    assert_refused(_eval(artifacts, ["dflash_shared"], out, "--prompts", str(small),
                         "--max-memory", "12XB"),
                   EvalInputError, ["--max-memory: expected a size such as 20GB"])
    assert not out.exists()


# --- refusals: one line, their own code, nothing written ----------------------------------

def test_a_bad_prompt_line_is_refused_with_its_number(artifacts, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt_ids": [1, 2]}\n{"id": "b", "prompt_ids": [1, "x"]}\n')
    out = tmp_path / "report"
    line = assert_refused(_eval(artifacts, ["dflash_shared"], out, "--prompts", str(prompts)),
                          PromptSetError, ["line 2", "prompt_ids[1]"])
    assert line.endswith('found "x"')
    assert not out.exists() and temp_siblings(out) == []


def test_an_existing_output_is_refused_and_force_replaces_it(artifacts, small, tmp_path):
    out = tmp_path / "report"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    assert_refused(_eval(artifacts, ["dflash_shared"], out, "--prompts", str(small)),
                   OutputExistsError, ["output already exists", "--force"])
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    proc = _eval(artifacts, ["dflash_shared"], out, "--prompts", str(small), "--max-new-tokens", "2",
                 "--threshold", "0", "--force")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["acceptance.png", "report.json", "report.md",
                                                      "speed.png"]
    assert temp_siblings(out) == []


@pytest.mark.parametrize("where, words", [
    (lambda a, t: a / "report", "lies inside the artifact"),
    (lambda a, t: a.parent, "holds the artifact"),
    (lambda a, t: t.parent, "holds the prompt set"),
])
def test_a_report_over_what_the_eval_reads_is_refused(artifacts, tmp_path, where, words):
    prompts = _prompts(tmp_path / "p.jsonl", 1)
    art = artifacts["dflash_shared"]
    before = sorted(os.listdir(art))
    out = where(art, prompts)
    assert_refused(_eval(artifacts, ["dflash_shared"], out, "--prompts", str(prompts), "--force"),
                   OutputExistsError, [words])
    assert sorted(os.listdir(art)) == before and prompts.is_file()


def test_a_report_inside_the_target_is_refused(artifacts, tmp_path):
    out = TARGET / "report"
    assert_refused(_eval(artifacts, ["dflash_shared"], out), OutputExistsError,
                   ["lies inside the target model"])
    assert not out.exists()


@pytest.mark.slow   # needs the calibrated eval run
def test_a_calibration_for_another_artifact_or_target_is_refused(artifacts, calibrated, tmp_path):
    _, out = calibrated
    cal_path = out / "calibration-vanilla_conf_markov.json"
    report = tmp_path / "report"
    # eval: the DFlash drafter is not the artifact the calibration was fitted for
    line = assert_refused(_eval(artifacts, ["dflash_shared"], report, "--calibration", str(cal_path)),
                          CalibrationMismatchError, ["made for drafter.gguf SHA-256"])
    assert "this artifact's is" in line
    # with both artifacts it goes to its own; one that names neither is refused
    cal = json.loads(cal_path.read_text())
    other = tmp_path / "other.json"
    other.write_text(json.dumps(dict(cal, drafter_gguf_sha256="ab" * 32)))
    assert_refused(_eval(artifacts, ["vanilla_conf_markov", "dflash_shared"], report,
                         "--calibration", str(other)),
                   CalibrationMismatchError, ["which none of the 2 artifacts has"])
    # another target: its identity differs
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps(dict(cal, target=dict(cal["target"], weights_sha256="cd" * 32))))
    assert_refused(_eval(artifacts, ["vanilla_conf_markov"], report, "--calibration", str(foreign)),
                   CalibrationMismatchError, ["made for another target", "target.weights_sha256"])
    # not a calibration at all
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(dict(cal, temperatures=[1.0] * (BLOCK - 1))))
    assert_refused(_eval(artifacts, ["vanilla_conf_markov"], report, "--calibration", str(broken)),
                   CalibrationFileError, ["temperatures: expected one per draft position"])
    # the same file twice for one artifact
    assert_refused(_eval(artifacts, ["vanilla_conf_markov"], report, "--calibration", str(cal_path),
                         "--calibration", str(cal_path)),
                   EvalInputError, ["expected one calibration per artifact"])
    assert not report.exists() and temp_siblings(report) == []
    # smoke refuses it the same way
    proc = run_cli("smoke", str(artifacts["dflash_shared"]), "--target", str(TARGET), "--device", "cpu",
                   "--prompt-ids", "1,17,33", "--max-new-tokens", "4", "--calibration", str(cal_path))
    assert_refused(proc, CalibrationMismatchError, ["made for drafter.gguf SHA-256"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_writes_the_report_of_what_did_not_run_and_fails(artifacts, small, tmp_path):
    out = tmp_path / "report"
    proc = run_cli("eval", str(artifacts["vanilla_conf_markov"]), "--target", str(TARGET),
                   "--device", "cuda", "--prompts", str(small), "-o", str(out))
    assert_refused(proc, DeviceUnavailableError, ["CUDA is not available", "nothing ran"])
    report = read_report(out / "report.json")
    assert report.runs == [] and report.environment.device == "none"
    assert report.not_run and all("CUDA is not available" in n.reason for n in report.not_run)


# --- Ctrl-C ---------------------------------------------------------------------------------

@pytest.mark.slow   # a real eval process on a pty, started and interrupted (~5 s)
def test_a_real_sigint_mid_run_leaves_a_partial_report(artifacts, tmp_path):
    """A child `dspark eval` on a terminal (a pty: its progress bars name each run); SIGINT
    once the DSpark drafter's first run has begun: exit 130, one error line, a partial
    report (complete false, what did not finish under not_run)."""
    out = tmp_path / "report"
    label = b"vanilla_conf_markov, T=0, cutoff off"
    cmd = dspark_cmd("eval", str(artifacts["vanilla_conf_markov"]), str(artifacts["dflash_shared"]),
                     "--target", str(TARGET), "--device", "cpu", "--max-new-tokens", "48",
                     "--threshold", "0.3", "--threshold", "0.5", "--threshold", "0.7", "-o", str(out))
    proc, seen, sent = interrupt_on_terminal(cmd, label, seconds=120, stdout=subprocess.PIPE,
                                             env=child_env({"OMP_NUM_THREADS": "1"}))
    stdout = proc.stdout.read().decode()
    proc.stdout.close()
    assert sent, f"the run never started: {seen[-400:]!r}"
    assert proc.wait() == 130, (stdout, seen[-800:])
    errors = [line for line in seen.decode(errors="replace").replace("\r", "\n").splitlines()
              if "error:" in line]
    assert len(errors) == 1 and "interrupted; the partial report (complete: false)" in errors[0]
    assert "Traceback" not in seen.decode(errors="replace")
    report = read_report(out / "report.json")
    assert not report.complete and "interrupted" in report.incomplete_reason
    assert report.runs[0].kind == "target" and report.runs[0].new_tokens > 0
    unfinished = {(n.artifact, n.confidence_threshold) for n in report.not_run
                  if "interrupted" in n.reason}
    assert ("vanilla_conf_markov", 0.7) in unfinished
    assert ("vanilla_conf_markov", 0.0) in unfinished or \
        report.run("drafter", "vanilla_conf_markov", 0.0, 0.0) is not None
    md = (out / "report.md").read_text()
    assert "> **INCOMPLETE**" in md and "## Not run" in md
    assert temp_siblings(out) == []


# --- bfloat16 ---------------------------------------------------------------------------------

@pytest.mark.slow   # a whole eval run of both drafters in bfloat16
def test_bfloat16_eval_is_lossless_at_temperature_zero(artifacts, tmp_path):
    prompts = _prompts(tmp_path / "p.jsonl", 2)
    out = tmp_path / "report"
    proc = _eval(artifacts, ["vanilla_conf_markov", "dflash_shared"], out, "--prompts", str(prompts),
                 "--max-new-tokens", "12", "--threshold", "0.5", "--dtype", "bfloat16")
    assert proc.returncode == 0, proc.stderr
    assert "bfloat16, stepwise verify" in proc.stdout.splitlines()[1]   # [0]: the estimate
    report = read_report(out / "report.json")
    assert report.settings.dtype == "bfloat16" and report.settings.verify == "stepwise"
    assert report.environment.dtype == "bfloat16"
    greedy = {p.id: p.completion_ids for p in report.run("target", None, 0.0, None).prompts}
    drafter_runs = [r for r in report.runs if r.kind == "drafter"]
    assert len(drafter_runs) == 3 and report.lossless is True
    for r in drafter_runs:
        assert r.lossless is True
        for p in r.prompts:
            assert p.lossless and p.completion_ids == greedy[p.id] and p.new_tokens == 12
    # the baseline is the runtime's own greedy output in bfloat16
    from dspark_convert.runtime.qwen3 import Qwen3Target
    from dspark_convert.runtime.speculative import target_greedy

    model = Qwen3Target(TARGET, device=torch.device("cpu"), dtype=torch.bfloat16)
    for row in map(json.loads, prompts.read_text().splitlines()):
        g = target_greedy(model, row["prompt_ids"], max_new_tokens=12, stop_token_ids=STOPS)
        assert list(g.output_ids[len(row["prompt_ids"]):]) == greedy[row["id"]]
    assert "float32 (batched verify)" not in (out / "report.md").read_text()


# --- calibration applied to the cut -----------------------------------------------------------

def _with_temperatures(src, dst, temps):
    cal = json.loads(src.read_text())
    dst.write_text(json.dumps(dict(cal, temperatures=temps)))
    return dst


@pytest.mark.slow   # the calibrated eval run and another
def test_a_fitted_calibration_moves_the_cut_as_cut_length_predicts(artifacts, calibrated, small,
                                                                   tmp_path):
    doc, fitted_dir = calibrated
    cal_path = fitted_dir / "calibration-vanilla_conf_markov.json"
    temps = read_calibration(cal_path).temperatures
    raw = read_report(fitted_dir / "report.json")
    out = tmp_path / "report"
    proc = _eval(artifacts, ["vanilla_conf_markov"], out, "--prompts", str(small),
                 "--max-new-tokens", "16", "--threshold", "0.3", "--calibration", str(cal_path))
    assert proc.returncode == 0, proc.stderr
    assert f"applied {cal_path} to vanilla_conf_markov's cut" in proc.stdout
    report = read_report(out / "report.json")
    art = report.artifacts[0]
    assert art.calibration_applied.sha256 == hashlib.sha256(cal_path.read_bytes()).hexdigest()
    assert art.calibration_applied.temperatures == temps and art.calibration is None
    cut = report.run("drafter", "vanilla_conf_markov", 0.0, 0.3)
    assert cut.confidence_temperatures == temps and report.lossless is True
    # threshold 0: no cut, the same run as without the calibration, raw logits and all
    off = report.run("drafter", "vanilla_conf_markov", 0.0, 0.0)
    assert off.confidence_temperatures is None
    assert _steps(off) == _steps(raw.run("drafter", "vanilla_conf_markov", 0.0, 0.0))
    assert art.confidence == raw.artifacts[0].confidence         # metrics of the raw head
    assert art.confidence_calibrated != art.confidence
    # every proposal the calibrated run sent passed sigmoid(cl_k / T_k) >= 0.3 at each of
    # its positions: cut_length on its raw logits gives exactly its length ...
    for c in _cycles(cut):
        logits = c.confidence_logits or []
        assert len(logits) == len(c.proposed)
        assert cut_length(logits, 0.3, temps) == len(c.proposed)
    # ... and the cut moved: the raw run at the same threshold proposed differently (at 0.5
    # it could not: sigmoid(cl / T) < 1/2 exactly when cl < 0, whatever T > 0)
    raw_cut = raw.run("drafter", "vanilla_conf_markov", 0.0, 0.3)
    assert [len(c.proposed) for c in _cycles(cut)] != [len(c.proposed) for c in _cycles(raw_cut)]
    md = (out / "report.md").read_text()
    assert "| vanilla_conf_markov (cutoff 0.3, calibrated) | 0 |" in md
    assert "Calibration applied (`--calibration`)" in md


@pytest.mark.slow   # the calibrated eval run and more
def test_extreme_temperatures_cut_where_cut_length_says(artifacts, calibrated, small, tmp_path):
    """T_k = 100 flattens every step confidence to about 1/2 (|cl| < 40 here): above a
    threshold of 0.4 nothing is cut, below 0.6 everything is, whatever the raw head says."""
    _, fitted_dir = calibrated
    raw = read_report(fitted_dir / "report.json")
    raw_cycles = _cycles(raw.run("drafter", "vanilla_conf_markov", 0.0, 0.0))
    assert max(abs(v) for c in raw_cycles for v in c.confidence_logits) < 40
    flat = _with_temperatures(fitted_dir / "calibration-vanilla_conf_markov.json",
                              tmp_path / "flat.json", [100.0] * BLOCK)
    out = tmp_path / "report"
    proc = _eval(artifacts, ["vanilla_conf_markov"], out, "--prompts", str(small),
                 "--max-new-tokens", "16", "--threshold", "0.4", "--threshold", "0.6",
                 "--calibration", str(flat))
    assert proc.returncode == 0, proc.stderr
    report = read_report(out / "report.json")
    keep = _cycles(report.run("drafter", "vanilla_conf_markov", 0.0, 0.4))
    # the raw run at 0.4 does cut somewhere; the calibrated one is the cutoff-off run, cycle
    # for cycle, its confidence logits the raw head's
    assert any(len(c.proposed) < BLOCK for c in _cycles(raw.run("drafter", "vanilla_conf_markov",
                                                                  0.0, 0.3)))
    assert _steps(report.run("drafter", "vanilla_conf_markov", 0.0, 0.4)) == \
        _steps(raw.run("drafter", "vanilla_conf_markov", 0.0, 0.0))
    assert all(cut_length(c.confidence_logits, 0.4, [100.0] * BLOCK) == BLOCK for c in keep)
    drop = report.run("drafter", "vanilla_conf_markov", 0.0, 0.6)
    assert all(c.proposed == [] for c in _cycles(drop)) and drop.acceptance.tau == 1.0
    assert report.lossless is True
    # smoke applies it the same way and says so
    trace = tmp_path / "trace.json"
    proc = run_cli("smoke", str(artifacts["vanilla_conf_markov"]), "--target", str(TARGET),
                   "--device", "cpu", "--prompt-ids", "1,17,33,90,250,7", "--max-new-tokens", "8",
                   "--confidence-threshold", "0.6", "--calibration", str(flat), "--trace", str(trace),
                   "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["calibration"]["temperatures"] == [100.0] * BLOCK
    assert result["calibration"]["path"] == str(flat) and result["tau"] == 1.0
    cycles = json.loads(trace.read_text())["runs"][0]["cycles"]
    assert cycles and all(c["proposed"] == [] for c in cycles)


@pytest.mark.slow   # needs the calibrated eval run
def test_report_failure_names_the_first_lossless_difference(calibrated, tmp_path):
    from dspark_convert.commands.evaluate import report_failure
    from dspark_convert.errors import LosslessnessError

    _, out = calibrated
    report = read_report(out / "report.json")
    assert report_failure(report, out) is None
    i = next(i for i, r in enumerate(report.runs) if r.kind == "drafter")
    run = report.runs[i]
    bad = run.model_copy(update={"prompts": [run.prompts[0].model_copy(update={"lossless": False}),
                                             *run.prompts[1:]]})
    broken = report.model_copy(update={"runs": [*report.runs[:i], bad, *report.runs[i + 1:]]})
    error = report_failure(broken, out)
    assert isinstance(error, LosslessnessError) and error.exit_code == 74
    assert f"prompt {run.prompts[0].id} differs" in error.message and str(out) in error.message


@pytest.mark.slow
def test_the_readmes_plot_is_what_make_demo_writes(artifacts, tmp_path):
    """docs/eval-acceptance.png is the demo eval's acceptance.png, byte for byte: the same
    artifacts (named by their directories, as the demo names them), prompts and settings
    (the plot needs only the cutoff-off runs)."""
    demo = tmp_path / "demo"
    proc = run_cli("convert", str(TRAINED_DRAFTERS["vanilla_conf_markov"]), "-o", str(demo / "reference"),
                   "--target", str(TARGET))
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "eval"
    proc = run_cli("eval", str(demo / "reference"), str(artifacts["dflash_shared"]), "--target",
                   str(TARGET), "--device", "cpu", "--max-new-tokens", "32", "--threshold", "0",
                   "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert (out / "acceptance.png").read_bytes() == (ROOT / "docs" / "eval-acceptance.png").read_bytes()
