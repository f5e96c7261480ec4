"""evaluation/calibration.py: Sequential Temperature Scaling, the split, calibration.json.

- the fit is the sequential grid argmin of DeepSpec's ECE, checked against a brute force
  over the grid with the plain metric computation of test_eval_metrics;
- on a head made overconfident on purpose, STS finds a temperature near the true one and
  lowers the held-out ECE; temperatures are positive, so the order of the step
  confidences (their exact AUROC) is unchanged;
- the split is by prompt and reproducible from the seed;
- a calibration for another artifact, target or block size is refused in one line.
"""

from __future__ import annotations

import hashlib

import json
import math

import numpy as np
import pytest
import torch

from dspark_convert.errors import CalibrationFileError, CalibrationMismatchError
from dspark_convert.evaluation.calibration import (
    DEFAULT_GRID,
    CalibrationSplit,
    applied,
    calibrate,
    check_calibration,
    cut_length,
    fit_sts,
    read_calibration,
    read_calibration_file,
    scale_confidence_logits,
    split_prompts,
    step_aurocs,
)
from dspark_convert.evaluation.environment import TargetIdentity
from dspark_convert.evaluation.metrics import confidence_data
from support.confidence import plain_metrics

pytestmark = pytest.mark.usefixtures("one_torch_thread")
STOPS = (2,)
SHA_A = "a" * 64
SHA_B = "b" * 64


def _identity(**change) -> TargetIdentity:
    fields = dict(path="/x/target", config_sha256="1" * 64, weights_sha256="2" * 64,
                  tokenizer_sha256=None, embed_sha256="3" * 64, lm_head_sha256="4" * 64,
                  vocab_size=512, hidden_size=64, num_hidden_layers=6)
    fields.update(change)
    return TargetIdentity(**fields)


def _overconfident_steps(n: int, seed: int, scale: float = 3.0, block: int = 4):
    """Steps whose true per-position acceptance is sigmoid(z) while the head says
    sigmoid(scale * z): miscalibrated by a known temperature."""
    rng = np.random.Generator(np.random.PCG64(seed))
    steps = []
    for _ in range(n):
        z = rng.normal(0.8, 1.2, block)
        accept = rng.random(block) < 1.0 / (1.0 + np.exp(-z))
        accepted = int(np.cumprod(accept).sum())
        steps.append(([5] * block, accepted, [float(scale * v) for v in z]))
    return steps


def _split_file():
    return CalibrationSplit(seed=0, held_out=0.5, calibration_ids=["a"], held_out_ids=["b"])


def test_split_is_by_prompt_reproducible_and_disjoint():
    keys = [f"p{i}" for i in range(16)]
    fit, held = split_prompts(keys, held_out=0.5, seed=3)
    assert (fit, held) == split_prompts(keys, held_out=0.5, seed=3)
    assert split_prompts(keys, held_out=0.5, seed=4) != (fit, held)
    assert sorted(fit + held) == sorted(keys) and not set(fit) & set(held)
    assert len(held) == 8 and fit == [k for k in keys if k in fit]       # file order kept
    assert len(split_prompts(keys, held_out=0.25, seed=3)[1]) == 4
    assert [len(x) for x in split_prompts(["a", "b"], held_out=0.99, seed=0)] == [1, 1]
    assert [len(x) for x in split_prompts(["a", "b", "c"], held_out=0.01, seed=0)] == [2, 1]
    assert split_prompts(["a"], held_out=0.5, seed=0) is None


def test_fit_is_the_sequential_grid_argmin():
    steps = _overconfident_steps(120, seed=1, block=3)
    data = confidence_data(steps, block_size=3, stop_token_ids=STOPS)
    grid = DEFAULT_GRID[::4]                        # 21 temperatures keep the brute force short
    temps = fit_sts(data, grid)
    chosen: list[float] = []
    for k in range(3):
        scores = []
        for t in grid:
            trial = chosen + [t] + [1.0] * (3 - k - 1)
            scores.append((plain_metrics(steps, 3, STOPS, trial)[k]["ece"], abs(math.log(t)), t))
        best = min(scores)
        # equal ECEs (to rounding) resolve to the temperature nearest 1
        near = [s for s in scores if s[0] <= best[0] + 1e-12]
        chosen.append(min(near, key=lambda s: (s[1], s[2]))[2])
    assert temps == chosen


def test_sts_recovers_a_known_miscalibration_and_lowers_held_out_ece():
    fit_steps, held_steps = _overconfident_steps(1500, seed=2), _overconfident_steps(1500, seed=3)
    fit = confidence_data(fit_steps, block_size=4, stop_token_ids=STOPS)
    held = confidence_data(held_steps, block_size=4, stop_token_ids=STOPS)
    cal = calibrate(fit, held, artifact="a", drafter_gguf_sha256=SHA_A, target=_identity(),
                    prompt_set_sha256=SHA_B, split=_split_file(), decoding_temperature=0.0)
    assert 2.0 <= cal.temperatures[0] <= 4.5                    # the head's logits were x3
    assert cal.improved is True and cal.ece_mean_after < 0.5 * cal.ece_mean_before
    assert "points lower" in cal.note
    # after STS the held-out ECE is near what a calibrated head shows on this much data
    assert cal.ece_mean_after < 1.5 * cal.ece_floor_mean_after
    # Held-out numbers are DeepSpec's, before and after, recomputed the plain way.
    before, after = plain_metrics(held_steps, 4, STOPS), plain_metrics(held_steps, 4, STOPS, cal.temperatures)
    for p, b, a in zip(cal.per_position, before, after):
        assert p.ece_before == pytest.approx(b["ece"], abs=1e-7)
        assert p.ece_after == pytest.approx(a["ece"], abs=1e-7)
        assert p.auc_before == pytest.approx(b["auc"], abs=1e-7)
        assert p.auc_after == pytest.approx(a["auc"], abs=1e-7)
        assert p.brier_after == pytest.approx(a["brier"], abs=1e-7)
        # Order-preserving: the step confidences keep their ranking exactly.
        assert p.step_auc_before == p.step_auc_after is not None
    # P_0 is one sigmoid: its DeepSpec AUROC moves only by the 1000-bin histogram.
    assert abs(cal.per_position[0].auc_after - cal.per_position[0].auc_before) < 0.01


def test_step_aurocs_are_invariant_to_any_positive_temperatures():
    data = confidence_data(_overconfident_steps(300, seed=5), block_size=4, stop_token_ids=STOPS)
    raw = step_aurocs(data)
    for temps in ([0.1, 10.0, 1.0, 3.0], [7.5, 0.13, 0.5, 2.0]):
        assert step_aurocs(data, temps) == raw


def test_an_unobserved_position_keeps_temperature_one():
    steps = [([5, 6, 7], 1, [1.0, -1.0, 0.5]), ([5, 2, 7], 2, [2.0, 2.0, 0.5]), ([5, 6, 7], 0, [-1.0, 0.0, 0.0])]
    data = confidence_data([s for s in steps if s[1] != 2], block_size=4, stop_token_ids=STOPS)
    assert fit_sts(data)[3] == 1.0


# --- calibration.json ---------------------------------------------------------------------

def _file(tmp_path, **change):
    fit = confidence_data(_overconfident_steps(200, seed=7), block_size=4, stop_token_ids=STOPS)
    held = confidence_data(_overconfident_steps(200, seed=8), block_size=4, stop_token_ids=STOPS)
    cal = calibrate(fit, held, artifact="art", drafter_gguf_sha256=SHA_A, target=_identity(),
                    prompt_set_sha256=SHA_B, split=_split_file(), decoding_temperature=0.0)
    path = tmp_path / "calibration.json"
    doc = json.loads(cal.model_dump_json())
    doc.update(change)
    path.write_text(json.dumps(doc))
    return path, cal


def test_round_trip_and_the_right_artifact_is_accepted(tmp_path):
    path, cal = _file(tmp_path)
    assert read_calibration(path) == cal
    read, sha256 = read_calibration_file(path)
    check_calibration(read, path, drafter_gguf_sha256=SHA_A, block_size=4,
                      target=_identity(path="/elsewhere/same-files"))
    got = applied(read, path, sha256)
    assert got.temperatures == cal.temperatures and len(got.temperatures) == 4
    # As applied: the hash of the bytes that were parsed.
    assert got.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("kwargs, words", [
    (dict(drafter_gguf_sha256=SHA_B, block_size=4, target=_identity()), "made for drafter.gguf SHA-256 aaaa"),
    (dict(drafter_gguf_sha256=SHA_A, block_size=7, target=_identity()), "block_size 4"),
    (dict(drafter_gguf_sha256=SHA_A, block_size=4, target=_identity(weights_sha256="9" * 64)),
     "another target: target.weights_sha256"),
    (dict(drafter_gguf_sha256=SHA_A, block_size=4, target=_identity(embed_sha256="9" * 64)),
     "target.embed_sha256"),
])
def test_another_artifact_or_target_is_refused(tmp_path, kwargs, words):
    path, _ = _file(tmp_path)
    with pytest.raises(CalibrationMismatchError) as info:
        check_calibration(read_calibration(path), path, **kwargs)
    assert words in info.value.message and "\n" not in info.value.message
    assert info.value.exit_code == 93


@pytest.mark.parametrize("change, words", [
    (dict(temperatures=[1.0, 1.0]), "one per draft position"),
    (dict(temperatures=[1.0, -1.0, 1.0, 1.0]), "positive finite"),
    (dict(drafter_gguf_sha256="xyz"), "64 lowercase hex"),
    (dict(extra=1), "extra"),
    (dict(format="something-else"), "format"),
])
def test_malformed_calibration_files(tmp_path, change, words):
    path, _ = _file(tmp_path, **change)
    with pytest.raises(CalibrationFileError) as info:
        read_calibration(path)
    assert words in info.value.message.lower() or words in info.value.message
    assert info.value.exit_code == 92
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "dspark-calibration", "format": 1}')
    with pytest.raises(CalibrationFileError, match="duplicate key"):
        read_calibration(bad)
    with pytest.raises(CalibrationFileError, match="not found"):
        read_calibration(tmp_path / "nothing.json")


# --- applying the temperatures ------------------------------------------------------------

def test_scaling_and_the_cutoff_match_the_runtime(golden_models, converted):
    """cut_length on the raw logits is the drafter's own cut; a drafter given temperatures
    (``--calibration``) cuts at sigmoid(cl_k / T_k) < threshold, exactly where cut_length
    predicts from the raw logits it still returns."""
    from dspark_convert.runtime.drafter import DSparkDrafter
    from dspark_convert.runtime.qwen3 import KVCache
    from dspark_convert.runtime.weights import load_drafter_weights

    target, drafter = golden_models
    temps = [0.5, 2.0, 1.5, 0.7, 3.0, 1.0, 0.8]
    calibrated = DSparkDrafter(load_drafter_weights(converted["reference"]), embed=target.embed,
                               lm_head=target.lm_head, device=torch.device("cpu"),
                               confidence_temperatures=temps)
    changed = 0
    for prompt in ([1, 17, 33, 90, 250, 7, 7, 401], [1, 40, 43, 46, 49, 52], [1, 5, 9, 300, 77]):
        out = target.forward(torch.tensor(prompt), KVCache())
        for d in (drafter, calibrated):
            d.reset()
            d.add_context(d.features(out.hidden_states))
        anchor = int(out.logits[-1].argmax())
        lengths = set()
        for thr in (0.2, 0.4, 0.5, 0.6, 0.8):
            p = drafter.propose(anchor, confidence_threshold=thr)
            assert cut_length(p.confidence_logits.tolist(), thr) == p.length
            lengths.add(p.length)
            c = calibrated.propose(anchor, confidence_threshold=thr)
            assert torch.equal(c.confidence_logits, p.confidence_logits)     # kept raw
            assert torch.equal(c.tokens, p.tokens)
            assert c.length == cut_length(c.confidence_logits.tolist(), thr, temps)
            changed += c.length != p.length
        assert len(lengths) > 1                                 # the thresholds do cut
    assert changed > 0                                          # and the temperatures move the cut
    temps = [2.0, 0.5, 1.0, 4.0]
    assert scale_confidence_logits([1.0, -2.0], temps) == [0.5, -4.0]
    assert cut_length([1.0, 0.1, 3.0], 0.6) == 1                # sigmoid(0.1) = 0.52
    assert cut_length([1.0, 0.1, 3.0], 0.6, [1.0, 0.01, 1.0]) == 3   # sigmoid(10)
    assert cut_length([-800.0], 0.5) == 0                       # no overflow
    assert cut_length([0.2, 0.2], 0.0) == 2                     # threshold 0: the cutoff is off
    with pytest.raises(ValueError):
        scale_confidence_logits([1.0, 1.0], [1.0])
    with pytest.raises(ValueError, match="expected 7 positive"):
        DSparkDrafter(load_drafter_weights(converted["reference"]), embed=target.embed,
                      lm_head=target.lm_head, device=torch.device("cpu"),
                      confidence_temperatures=[1.0] * 6)
