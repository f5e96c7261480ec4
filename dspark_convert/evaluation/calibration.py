"""Sequential Temperature Scaling of the confidence head, and calibration.json.

STS (DSpark paper §3.2.1; docs/REFERENCE.md §7; not in DeepSpec's code, proposed in its PR #63):
each draft position k gets a temperature T_k and the head's step probability becomes
sigmoid(cl_k / T_k). The temperatures are fitted in order k = 0 .. B-1 on the calibration
split: a 1-D grid search picks the T_k that minimises DeepSpec's ECE of the cumulative
prediction P_k = prod_{i<=k} sigmoid(cl_i / T_i) at position k, with T_0 .. T_{k-1}
already fixed (the later ones do not enter P_k). Ties go to the temperature nearest 1
(smallest |log T|), so an uninformative position keeps the raw head. A position the split
never observes keeps T = 1.

Every T_k > 0, so each sigmoid(cl_k / T_k) is strictly increasing in cl_k: the order of
the step confidences at a position is unchanged, and so is the order of P_0. P_k for k > 0
multiplies positions with different temperatures, so its order (and its AUROC) can move;
the file records the held-out AUROC before and after at every position so that the
change is visible, not assumed.

The split is by prompt: the prompt keys in file order, shuffled by ``random.Random(seed)``;
the first round(n x held_out) (at least 1, at most n-1) are held out and scored, the
others fit the temperatures.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
from pathlib import Path
from typing import Literal, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict

from dspark_convert.errors import CalibrationFileError, CalibrationMismatchError, InternalError
from dspark_convert.scheduling.policies import static_cutoff
from dspark_convert.util.patterns import is_sha256
from dspark_convert.util.models import VersionOne, validated
from dspark_convert.util.paths import check_input_file
from dspark_convert.util.strict_json import parse_json_strict, read_capped
from dspark_convert.util.text import shown
from dspark_convert.evaluation.environment import TargetIdentity
from dspark_convert.evaluation.metrics import (
    COARSE_BINS,
    ConfidenceData,
    bin_index,
    cumulative_predictions,
    ece_sampling_floor,
    per_position,
    rank_auroc,
    summarize,
)

# 0.1 .. 10, 81 temperatures evenly spaced in log10 (1.0 among them), rounded to 6 digits.
DEFAULT_GRID: tuple[float, ...] = tuple(round(10.0 ** (e / 40.0), 6) for e in range(-40, 41))
CALIBRATION_FORMAT = "dspark-calibration"
CALIBRATION_VERSION = 1


class CalibrationSplit(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    seed: int
    held_out: float
    calibration_ids: list[str]      # fit the temperatures
    held_out_ids: list[str]         # scored


class CalibrationPosition(BaseModel):
    """Held-out DeepSpec metrics at one position, raw head and after STS."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    position: int
    temperature: float
    fit_weight: float               # steps observed at this position in the calibration split
    total_weight: float             # ... in the held-out split
    ece_before: float | None
    ece_after: float | None
    ece_floor_before: float | None  # metrics.ece_sampling_floor: a calibrated head's ECE here
    ece_floor_after: float | None
    auc_before: float | None        # DeepSpec's AUROC of the cumulative P_k (1000 bins)
    auc_after: float | None
    step_auc_before: float | None   # exact rank AUROC of the step confidence at k (unbinned)
    step_auc_after: float | None
    brier_before: float | None
    brier_after: float | None


class CalibrationFile(BaseModel):
    """calibration.json: one temperature per draft position, for one artifact and target."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    format: Literal["dspark-calibration"] = CALIBRATION_FORMAT
    version: VersionOne = CALIBRATION_VERSION
    method: Literal["sequential_temperature_scaling"] = "sequential_temperature_scaling"
    artifact: str
    drafter_gguf_sha256: str
    block_size: int
    target: TargetIdentity
    prompt_set_sha256: str
    split: CalibrationSplit
    decoding_temperature: float     # of the threshold-0 runs it was fitted on
    grid: list[float]
    temperatures: list[float]
    per_position: list[CalibrationPosition]
    ece_mean_before: float | None   # held-out, DeepSpec's weighted mean over positions
    ece_mean_after: float | None
    ece_floor_mean_before: float | None   # the same mean of the sampling floors
    ece_floor_mean_after: float | None
    improved: bool | None           # ece_mean_after < ece_mean_before
    note: str


def split_prompts(keys: Sequence[str], *, held_out: float, seed: int
                  ) -> tuple[list[str], list[str]] | None:
    """(calibration, held-out) keys, each in file order; None with fewer than 2 prompts."""
    n = len(keys)
    if n < 2:
        return None
    order = list(keys)
    random.Random(seed).shuffle(order)
    k = min(max(int(round(n * held_out)), 1), n - 1)
    held = set(order[:k])
    return [key for key in keys if key not in held], [key for key in keys if key in held]


def _ece_at(data: ConfidenceData, temperatures: Sequence[float], k: int) -> float | None:
    pred, label, observed = cumulative_predictions(data, temperatures)
    rows = observed[:, k]
    if not rows.any():
        return None
    p, y = pred[rows, k], label[rows, k]
    b = bin_index(p, COARSE_BINS)
    gap = np.abs(np.bincount(b, weights=p, minlength=COARSE_BINS)
                 - np.bincount(b, weights=y, minlength=COARSE_BINS))
    # sum over bins |mean P - mean y| x count / total = sum |sum P - sum y| / total
    return float(gap.sum() / len(p))


def step_aurocs(data: ConfidenceData, temperatures: Sequence[float] | None = None
                ) -> list[float | None]:
    """Per position k, the exact AUROC (ties one half) of the step confidence
    sigmoid(cl_k / T_k) against the label at k, over the observed steps. The sigmoid is
    strictly increasing, so it is ranked by cl_k / T_k in float64 (a float32 sigmoid
    saturates at 1 and would tie what the temperature keeps apart)."""
    B = data.block_size
    step = data.logits.astype(np.float64)
    if temperatures is not None:
        step = step / np.asarray(temperatures[:B], dtype=np.float64)
    cols = np.arange(B)
    observed = cols[None, :] < data.lengths[:, None]
    label = cols[None, :] < data.accepted[:, None]
    return [rank_auroc(step[observed[:, k], k], label[observed[:, k], k]) for k in range(B)]


def ece_floors(data: ConfidenceData, temperatures: Sequence[float] | None = None
               ) -> list[float | None]:
    """Per position, ``metrics.ece_sampling_floor`` of the cumulative predictions."""
    pred, _, observed = cumulative_predictions(data, temperatures)
    return [ece_sampling_floor(pred[observed[:, k], k]) for k in range(data.block_size)]


def fit_sts(data: ConfidenceData, grid: Sequence[float] = DEFAULT_GRID) -> list[float]:
    """One temperature per position, fitted in order (see the module docstring)."""
    if not grid or any(not (t > 0 and math.isfinite(t)) for t in grid):
        raise ValueError("the STS grid must hold positive finite temperatures")
    B = data.block_size
    temps = [1.0] * B
    candidates = sorted(set(grid), key=lambda t: (abs(math.log(t)), t))
    for k in range(B):
        best_t, best_e = 1.0, None
        for t in candidates:
            e = _ece_at(data, temps[:k] + [t] + [1.0] * (B - k - 1), k)
            if e is None:
                break
            if best_e is None or e < best_e:
                best_t, best_e = t, e
        temps[k] = best_t
    return temps


def calibrate(data_fit: ConfidenceData, data_held: ConfidenceData, *, artifact: str,
              drafter_gguf_sha256: str, target: TargetIdentity, prompt_set_sha256: str,
              split: CalibrationSplit, decoding_temperature: float,
              grid: Sequence[float] = DEFAULT_GRID) -> CalibrationFile:
    temps = fit_sts(data_fit, grid)
    fit_entries = per_position(data_fit)
    before, after = per_position(data_held), per_position(data_held, temps)
    step_before, step_after = step_aurocs(data_held), step_aurocs(data_held, temps)
    floor_before, floor_after = ece_floors(data_held), ece_floors(data_held, temps)
    if step_before != step_after:
        # Cannot happen with positive temperatures: a bug, not an input problem.
        raise InternalError("STS changed the order of the step confidences: "
                            f"{step_before} -> {step_after}")
    rows = [CalibrationPosition(position=k, temperature=temps[k],
                                fit_weight=fit_entries[k].total_weight,
                                total_weight=before[k].total_weight,
                                ece_before=before[k].ece, ece_after=after[k].ece,
                                ece_floor_before=floor_before[k], ece_floor_after=floor_after[k],
                                auc_before=before[k].auc, auc_after=after[k].auc,
                                step_auc_before=step_before[k], step_auc_after=step_after[k],
                                brier_before=before[k].brier, brier_after=after[k].brier)
            for k in range(data_fit.block_size)]
    mean_before, mean_after = summarize(before).ece_mean, summarize(after).ece_mean
    weights = [e.total_weight for e in before]

    def weighted(values):
        pairs = [(v, w) for v, w in zip(values, weights) if v is not None and w > 0]
        total = sum(w for _, w in pairs)
        return sum(v * w for v, w in pairs) / total if total else None

    floor_mean_before, floor_mean_after = weighted(floor_before), weighted(floor_after)
    improved = None if mean_before is None or mean_after is None else mean_after < mean_before
    steps = int(len(data_held.lengths))
    if improved is None:
        note = "the held-out split has no observed step: nothing to score"
    else:
        change = (f"{100 * mean_before:.2f}% -> {100 * mean_after:.2f}%, "
                  f"{100 * abs(mean_before - mean_after):.2f} points "
                  + ("lower" if improved else "higher" if mean_after > mean_before else "unchanged"))
        floor = (f"a perfectly calibrated head would show about {100 * floor_mean_before:.2f}% "
                 f"on these {steps} held-out steps (sampling floor)")
        note = (f"held-out ECE {change}; {floor}" if improved
                else f"STS did not lower the held-out ECE: {change}; {floor}")
    return CalibrationFile(artifact=artifact, drafter_gguf_sha256=drafter_gguf_sha256,
                           block_size=data_fit.block_size, target=target,
                           prompt_set_sha256=prompt_set_sha256, split=split,
                           decoding_temperature=decoding_temperature, grid=list(grid),
                           temperatures=temps, per_position=rows, ece_mean_before=mean_before,
                           ece_mean_after=mean_after, ece_floor_mean_before=floor_mean_before,
                           ece_floor_mean_after=floor_mean_after, improved=improved, note=note)


# --- using a calibration ------------------------------------------------------------------

def read_calibration(path: str | os.PathLike) -> CalibrationFile:
    """Read and check a calibration.json (schema only; ``check_calibration`` matches it with
    an artifact and a target: smoke reads first, before any work, and matches after the
    pairing)."""
    return read_calibration_file(path)[0]


def read_calibration_file(path: str | os.PathLike) -> tuple[CalibrationFile, str]:
    """``read_calibration`` and the SHA-256 of the bytes it parsed (read once: the applied
    calibration records that hash)."""
    label = f"calibration {path}"
    path = check_input_file(path, label=label, error=CalibrationFileError,
                            expected="a calibration.json")
    data = read_capped(path, error=CalibrationFileError, label=label)
    raw = parse_json_strict(data, error=CalibrationFileError, label=label, path=str(path))
    cal = validated(CalibrationFile, raw, error=CalibrationFileError, label=label, path=str(path))
    if not is_sha256(cal.drafter_gguf_sha256):
        raise CalibrationFileError(f"{label}: drafter_gguf_sha256: expected 64 lowercase hex digits",
                                   path=str(path), field="drafter_gguf_sha256")
    if cal.block_size < 1 or len(cal.temperatures) != cal.block_size:
        raise CalibrationFileError(f"{label}: temperatures: expected one per draft position "
                                   f"({cal.block_size}), found {len(cal.temperatures)}",
                                   path=str(path), field="temperatures",
                                   expected=cal.block_size, found=len(cal.temperatures))
    bad = next((t for t in cal.temperatures if not (math.isfinite(t) and t > 0)), None)
    if bad is not None:
        raise CalibrationFileError(f"{label}: temperatures: expected positive finite numbers, "
                                   f"found {bad}", path=str(path), field="temperatures",
                                   expected="> 0", found=bad)
    return cal, hashlib.sha256(data).hexdigest()


def _short(text: object) -> str:
    s = str(text)
    return s[:12] + "…" if len(s) > 16 else s


def check_calibration(cal: CalibrationFile, path: str | os.PathLike, *, drafter_gguf_sha256: str,
                      block_size: int, target: TargetIdentity) -> CalibrationFile:
    """``cal`` (read from ``path``) if it was made for this artifact and target, else
    CalibrationMismatchError naming the first difference."""
    label = f"calibration {path}"
    if cal.drafter_gguf_sha256 != drafter_gguf_sha256:
        raise CalibrationMismatchError(
            f"{label}: made for drafter.gguf SHA-256 {_short(cal.drafter_gguf_sha256)}, this "
            f"artifact's is {_short(drafter_gguf_sha256)}", path=str(path),
            field="drafter_gguf_sha256", expected=drafter_gguf_sha256,
            found=cal.drafter_gguf_sha256)
    if cal.block_size != block_size:
        raise CalibrationMismatchError(
            f"{label}: block_size {cal.block_size}; the artifact's is {block_size}",
            path=str(path), field="block_size", expected=block_size, found=cal.block_size)
    diff = target.difference(cal.target)
    if diff is not None:
        name, ours, theirs = diff
        raise CalibrationMismatchError(
            f"{label}: made for another target: target.{name} is {_short(theirs)}, the target "
            f"{target.path} has {_short(ours)}", path=str(path), field=f"target.{name}",
            expected=ours, found=theirs)
    return cal


class AppliedCalibration(BaseModel):
    """What a run says about the calibration it applied (``--calibration FILE``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    path: str
    sha256: str                     # of the file's bytes
    method: str
    temperatures: list[float]
    prompt_set_sha256: str          # what it was fitted on
    note: str


APPLIED_NOTE = ("the temperatures scale the confidence logits before the threshold's sigmoid "
                "(sigmoid(cl_k / T_k) < threshold cuts the block); confidence_logits in traces "
                "and reports stay the raw head's")


def applied(cal: CalibrationFile, path: str | os.PathLike, sha256: str) -> AppliedCalibration:
    """What a report records of a calibration it applies: ``sha256`` of the bytes read."""
    return AppliedCalibration(path=shown(path), sha256=sha256, method=cal.method,
                              temperatures=list(cal.temperatures),
                              prompt_set_sha256=cal.prompt_set_sha256, note=APPLIED_NOTE)


def scale_confidence_logits(logits: Sequence[float], temperatures: Sequence[float]) -> list[float]:
    """cl_k / T_k for the first len(logits) positions, in float64 (what the runtime's
    calibrated cut computes: runtime/drafter.py ``DSparkDrafter.confidence_cut``)."""
    n = len(logits)
    if n > len(temperatures):
        raise ValueError(f"{n} confidence logits, {len(temperatures)} temperatures")
    return [float(c) / float(t) for c, t in zip(logits, temperatures)]


def cut_length(logits, threshold: float, temperatures: Sequence[float] | None = None) -> int:
    """The static cutoff (docs/REFERENCE.md §2, DSparkDrafter.propose): with threshold > 0 the
    first k with sigmoid(cl_k [/ T_k]) < threshold, else the whole block."""
    values = list(logits) if temperatures is None else scale_confidence_logits(list(logits), temperatures)
    return static_cutoff([_sigmoid(float(c)) for c in values], threshold)


def _sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)          # no overflow for very negative logits
    return z / (1.0 + z)
