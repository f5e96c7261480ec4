"""Traces in the format of DeepSpec's reference.json, and the cycle-by-cycle comparison.

A trace is ``{"case", "target", "prompts", "runs": [...]}``; each run has ``prompt``,
``output_ids`` (prompt included), ``acceptance_lengths``, ``cycles`` (``proposed``,
``accepted``, ``next_token``, ``confidence_logits``), ``temperature``,
``confidence_threshold`` and, at temperature 0, ``target_greedy``. We add ``seed`` and
``max_new_tokens`` to a run and the compute ``dtype`` to the trace; readers ignore keys
they do not know. A trace without ``dtype`` (DeepSpec's own) was computed in float32.

The comparison is exact for token ids and counts. Confidence logits are compared within
``CONFIDENCE_ATOL``: DeepSpec rounds them to 6 decimals and computes in float32 with its
own kernels; measured differences on the golden drafter are below 3.1e-4.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from dspark_convert.errors import ReferenceDivergenceError, ReferenceTraceError
from dspark_convert.util.paths import check_input_file
from dspark_convert.util.strict_json import read_json_strict
from dspark_convert.runtime.loading import COMPUTE_DTYPES
from dspark_convert.runtime.speculative import RunResult

CONFIDENCE_ATOL = 2e-3
REFERENCE_DTYPE = "float32"   # DeepSpec's traces carry no dtype: they are float32 runs
# Runs in one reference.json (`smoke --reference`): DeepSpec's golden traces hold 4 and 6,
# one per prompt and setting; smoke runs every one of them.
MAX_REFERENCE_RUNS = 256


def run_to_json(run: RunResult, *, max_new_tokens: int, target_greedy: tuple[int, ...] | None) -> dict:
    out = {
        "prompt": list(run.prompt),
        "output_ids": list(run.output_ids),
        "acceptance_lengths": list(run.acceptance_lengths),
        "cycles": [{"proposed": list(c.proposed), "accepted": c.accepted,
                    "next_token": c.next_token,
                    "confidence_logits": None if c.confidence_logits is None
                    else [round(v, 6) for v in c.confidence_logits]} for c in run.cycles],
        "temperature": run.temperature,
        "confidence_threshold": run.confidence_threshold,
        "max_new_tokens": max_new_tokens,
    }
    if run.seed is not None:
        out["seed"] = run.seed
    if target_greedy is not None:
        out["target_greedy"] = list(target_greedy)
    return out


def trace_to_json(runs: list[dict], *, case: str, target: str, dtype: str) -> dict:
    prompts: list[list[int]] = []
    for run in runs:
        if run["prompt"] not in prompts:
            prompts.append(run["prompt"])
    return {"case": case, "target": target, "dtype": dtype, "prompts": prompts, "runs": runs}


@dataclass(frozen=True)
class ReferenceRun:
    index: int
    prompt: tuple[int, ...]
    temperature: float
    confidence_threshold: float
    data: dict
    dtype: str = REFERENCE_DTYPE     # the trace's compute dtype


def _is_int_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def load_reference(path: str | Path) -> list[ReferenceRun]:
    """Read and check a reference.json; every run must have the fields we compare."""
    label = f"reference {path}"
    path = check_input_file(path, label=label, error=ReferenceTraceError,
                            expected="a reference.json")
    data = read_json_strict(path, error=ReferenceTraceError, label=label)
    runs = data.get("runs") if isinstance(data, dict) else None
    if not isinstance(runs, list) or not runs:
        raise ReferenceTraceError(f"{label}: expected an object with a non-empty 'runs' list",
                                  path=str(path), field="runs")
    if len(runs) > MAX_REFERENCE_RUNS:
        # Each run is a whole speculative run of its prompt (and a search of the list per
        # prompt): a small file of many tiny runs is minutes of work before any refusal.
        raise ReferenceTraceError(f"{label}: runs: {len(runs)} runs; expected at most "
                                  f"{MAX_REFERENCE_RUNS}", path=str(path), field="runs",
                                  expected=MAX_REFERENCE_RUNS, found=len(runs))
    dtype = data.get("dtype", REFERENCE_DTYPE)
    if not isinstance(dtype, str) or dtype not in COMPUTE_DTYPES:
        shown = dtype if isinstance(dtype, str) and dtype.isprintable() and len(dtype) < 40 \
            else type(dtype).__name__
        raise ReferenceTraceError(f"{label}: dtype: expected one of {', '.join(COMPUTE_DTYPES)}, "
                                  f"found {shown!r}", path=str(path), field="dtype",
                                  expected="|".join(COMPUTE_DTYPES), found=shown)
    out = []
    for i, run in enumerate(runs):
        where = f"{label}: runs[{i}]"
        if not isinstance(run, dict):
            raise ReferenceTraceError(f"{where}: expected an object", path=str(path), field=f"runs[{i}]")
        for key in ("prompt", "output_ids", "acceptance_lengths"):
            if not _is_int_list(run.get(key)):
                raise ReferenceTraceError(f"{where}.{key}: expected a list of token ids / integers, "
                                          f"found {type(run.get(key)).__name__}", path=str(path),
                                          field=f"runs[{i}].{key}")
        for key in ("temperature", "confidence_threshold"):
            if not _is_number(run.get(key)):
                raise ReferenceTraceError(f"{where}.{key}: expected a number", path=str(path),
                                          field=f"runs[{i}].{key}")
        cycles = run.get("cycles")
        if not isinstance(cycles, list):
            raise ReferenceTraceError(f"{where}.cycles: expected a list", path=str(path),
                                      field=f"runs[{i}].cycles")
        for j, cycle in enumerate(cycles):
            ok = (isinstance(cycle, dict) and _is_int_list(cycle.get("proposed"))
                  and isinstance(cycle.get("accepted"), int) and isinstance(cycle.get("next_token"), int)
                  and (cycle.get("confidence_logits") is None
                       or (isinstance(cycle["confidence_logits"], list)
                           and all(_is_number(v) for v in cycle["confidence_logits"]))))
            if not ok:
                raise ReferenceTraceError(f"{where}.cycles[{j}]: expected proposed, accepted, "
                                          "next_token and confidence_logits", path=str(path),
                                          field=f"runs[{i}].cycles[{j}]")
        out.append(ReferenceRun(index=i, prompt=tuple(run["prompt"]),
                                temperature=float(run["temperature"]),
                                confidence_threshold=float(run["confidence_threshold"]), data=run,
                                dtype=dtype))
    return out


def find_reference_run(runs: list[ReferenceRun], prompt: list[int], temperature: float,
                       confidence_threshold: float, *, path: str) -> ReferenceRun:
    for run in runs:
        if (list(run.prompt) == list(prompt) and run.temperature == temperature
                and run.confidence_threshold == confidence_threshold):
            return run
    raise ReferenceTraceError(
        f"reference {path}: no run for prompt {list(prompt)[:8]}{'...' if len(prompt) > 8 else ''} "
        f"at temperature {temperature:g}, confidence threshold {confidence_threshold:g}",
        path=path, expected="a run with the same prompt and settings", found="none")


def implied_max_new_tokens(ref: ReferenceRun, stop_token_ids: tuple[int, ...]) -> int | None:
    """How many new tokens the reference asked for, when its output says so (it is cut at
    exactly that length unless a stop token ended it first)."""
    new = ref.data["output_ids"][len(ref.prompt):]
    if new and new[-1] in stop_token_ids:
        return None
    return len(new)


def first_divergence(run: dict, ref: ReferenceRun, *, label: str, path: str
                     ) -> ReferenceDivergenceError | None:
    """The first difference, cycle by cycle (proposed, accepted, next_token,
    confidence_logits), then acceptance_lengths and output_ids; None when identical."""
    ref_cycles = ref.data["cycles"]
    where = f"{label} vs reference {path} runs[{ref.index}]"
    for j, (got, want) in enumerate(zip(run["cycles"], ref_cycles)):
        for key in ("proposed", "accepted", "next_token"):
            if got[key] != want[key]:
                return ReferenceDivergenceError(
                    f"{where}: cycle {j}: {key} differs: expected {want[key]}, found {got[key]}",
                    path=path, field=f"cycles[{j}].{key}", expected=want[key], found=got[key])
        a, b = got["confidence_logits"], want.get("confidence_logits")
        if (a is None) != (b is None) or (a is not None and (
                len(a) != len(b) or any(abs(x - y) > CONFIDENCE_ATOL for x, y in zip(a, b)))):
            return ReferenceDivergenceError(
                f"{where}: cycle {j}: confidence_logits differ beyond {CONFIDENCE_ATOL:g}: "
                f"expected {b}, found {a}", path=path, field=f"cycles[{j}].confidence_logits",
                expected=str(b), found=str(a))
    if len(run["cycles"]) != len(ref_cycles):
        return ReferenceDivergenceError(
            f"{where}: {len(run['cycles'])} cycles, the reference has {len(ref_cycles)}",
            path=path, field="cycles", expected=len(ref_cycles), found=len(run["cycles"]))
    for key in ("acceptance_lengths", "output_ids"):
        if run[key] != ref.data[key]:
            return ReferenceDivergenceError(
                f"{where}: {key} differs: expected {ref.data[key]}, found {run[key]}",
                path=path, field=key, expected=str(ref.data[key]), found=str(run[key]))
    return None


def compare_run(run: dict, ref: ReferenceRun, *, label: str, path: str) -> None:
    """Raise ReferenceDivergenceError at the first difference (``first_divergence``)."""
    divergence = first_divergence(run, ref, label=label, path=path)
    if divergence is not None:
        raise divergence


@dataclass(frozen=True)
class Agreement:
    """How far a run agrees with a reference run computed in another dtype (a bfloat16 run
    against DeepSpec's float32 trace): reported, not enforced. Tokens and confidence
    logits are counted apart: bfloat16 moves every confidence logit by more than the
    float32 tolerance while the tokens may still agree."""

    reference_dtype: str
    identical: bool                       # compare_run would pass
    cycles: int                           # the reference's cycles
    cycles_tokens_identical: int          # leading cycles with the same tokens and counts
    confidence_max_abs_difference: float | None   # over those cycles
    new_tokens: int                       # the reference's generated tokens
    new_tokens_identical: int             # leading generated tokens equal
    first_difference: str | None          # worded as compare_run raises it


def agreement(run: dict, ref: ReferenceRun, *, label: str, path: str) -> Agreement:
    divergence = first_divergence(run, ref, label=label, path=path)
    ref_cycles = ref.data["cycles"]
    same_cycles, deviation = 0, None
    for got, want in zip(run["cycles"], ref_cycles):
        if any(got[key] != want[key] for key in ("proposed", "accepted", "next_token")):
            break
        same_cycles += 1
        a, b = got["confidence_logits"], want.get("confidence_logits")
        if a is not None and b is not None and len(a) == len(b) and a:
            worst = max(abs(x - y) for x, y in zip(a, b))
            deviation = worst if deviation is None else max(deviation, worst)
    P = len(ref.prompt)
    ours, theirs = run["output_ids"][P:], ref.data["output_ids"][P:]
    same = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b),
                min(len(ours), len(theirs)))
    return Agreement(reference_dtype=ref.dtype, identical=divergence is None,
                     cycles=len(ref_cycles), cycles_tokens_identical=same_cycles,
                     confidence_max_abs_difference=deviation, new_tokens=len(theirs),
                     new_tokens_identical=same,
                     first_difference=None if divergence is None else divergence.message)
