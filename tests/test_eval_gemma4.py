"""`dspark eval` and calibration on the Gemma4 family: DeepSeek's Gemma4 drafters against their
tiny gemma4_unified target, on DeepSpec's own two prompts (golden/reference/gemma4/prompts.jsonl),
24 new tokens: tau equal to DeepSpec's (reference.json: DSpark 4.42 at temperature 0 with the
cutoff off, 3.31 at threshold 0.5; DFlash 1.79), lossless; a calibration fitted on the DSpark
drafter applies to it and to no other artifact; bfloat16 stays lossless."""

from __future__ import annotations

import json

import pytest

from support.cli import assert_refused, run_cli
from support.gemma4 import GEMMA4, GEMMA4_DRAFTERS, GEMMA4_TARGET

from dspark_convert import errors as E

PROMPTS = GEMMA4 / "prompts.jsonl"
DSPARK, DFLASH = "gemma4_vanilla_conf_markov", "gemma4_dflash"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    from dspark_convert.commands.convert import convert

    root = tmp_path_factory.mktemp("gemma4-eval")
    out = {}
    for name, src in GEMMA4_DRAFTERS.items():
        out[name] = root / name
        convert(src, out[name], target=GEMMA4_TARGET)
    return out


def _deepspec_tau(name: str, threshold: float) -> float:
    """tau as DeepSpec measured it: mean accepted+1 over both prompts' verify steps."""
    ref = json.loads((GEMMA4 / name / "reference.json").read_text())
    steps = [a for r in ref["runs"] if r["temperature"] == 0.0
             and r["confidence_threshold"] == threshold for a in r["acceptance_lengths"]]
    return sum(steps) / len(steps)


@pytest.fixture(scope="module")
def report(artifacts):
    from dspark_convert.commands.evaluate import run_eval

    return run_eval([artifacts[DSPARK], artifacts[DFLASH]], GEMMA4_TARGET, PROMPTS,
                    temperatures=[0.0], thresholds=[0.5], max_new_tokens=24, device="cpu",
                    calibrate=True, held_out=0.5, seed=3)


def _run(report, artifact, threshold):
    return next(r for r in report.runs if r.kind == "drafter" and r.artifact == artifact
                and r.confidence_threshold == threshold)


def test_tau_is_deepspecs_on_its_own_prompts(report, artifacts):
    names = {a.name: a for a in report.artifacts}
    assert set(names) == {DSPARK, DFLASH}
    for name, threshold in ((DSPARK, 0.0), (DSPARK, 0.5), (DFLASH, 0.0)):
        run = _run(report, name, threshold)
        assert run.lossless is True
        assert run.acceptance.tau == pytest.approx(_deepspec_tau(name, threshold), abs=1e-9)
    assert _deepspec_tau(DSPARK, 0.0) == pytest.approx(4.4167, abs=1e-4)
    # The DFlash drafter has no confidence head: its thresholded run is not made, and says why.
    assert any(n.artifact == DFLASH and "no confidence head" in n.reason for n in report.not_run)
    assert names[DSPARK].markov_head == "vanilla" and names[DSPARK].confidence_head


def test_calibration_is_fitted_and_applies_to_its_artifact_only(report, artifacts, tmp_path):
    from dspark_convert.commands.smoke import run_smoke
    from dspark_convert.evaluation.calibration import CalibrationFile

    art = next(a for a in report.artifacts if a.name == DSPARK)
    assert art.calibration is not None and len(art.calibration.temperatures) == 7
    path = tmp_path / "calibration.json"
    path.write_text(art.calibration.model_dump_json())
    CalibrationFile.model_validate_json(path.read_text())
    # It applies to its own artifact (smoke --calibration) ...
    result = run_smoke(artifacts[DSPARK], target=GEMMA4_TARGET, prompts=[[2, 17, 33, 90]],
                       max_new_tokens=8, confidence_threshold=0.5, calibration=path)
    assert result.runs[0].lossless
    # ... and is refused for another one (93), nothing written.
    proc = run_cli("smoke", str(artifacts[DFLASH]), "--target", str(GEMMA4_TARGET),
                   "--prompt-ids", "2,17,33", "--calibration", str(path))
    assert_refused(proc, E.CalibrationMismatchError)


@pytest.mark.slow
def test_eval_cli_bfloat16_is_lossless(artifacts, tmp_path):
    out = tmp_path / "report"
    proc = run_cli("eval", str(artifacts[DSPARK]), "--target", str(GEMMA4_TARGET), "--prompts",
                   str(PROMPTS), "--max-new-tokens", "24", "--threshold", "0.5", "--device",
                   "cpu", "--dtype", "bfloat16", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "report.json").read_text())
    runs = [r for r in report["runs"] if r["kind"] == "drafter"]
    assert runs and all(r["lossless"] for r in runs)
    assert (out / "report.md").is_file() and (out / "acceptance.png").is_file()
