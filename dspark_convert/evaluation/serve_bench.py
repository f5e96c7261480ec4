"""`dspark serve-bench`'s sweep and its figures (docs/SCHEDULING.md "Sweeping: dspark
serve-bench"): every policy at every concurrency, served by the reference runtime's batched
loop (runtime/serving.py ``serve``), the target alone beside them once per concurrency.

- ``check_concurrencies``: the concurrency list (scheduling/simulate.py
  ``parse_concurrency``, simulate's reader) against the prompts there are
  (ConcurrencyError, 148, naming the concurrency).
- ``sweep``: the runs, in order: per concurrency, the target alone first (the baseline
  every other run's outputs are compared with at temperature 0), then each artifact under
  each policy. Each run serves every prompt: packed (runtime/serving ``serve``: DSpark,
  DFlash, DFlash2), or for a drafter kind that is not packed (the Gemma 4 assistant) one
  request at a time by its batch-1 loop (``serve_one_by_one``, under ``full`` only).
- ``serve_run``: one ServeResult's figures (report.json's ``ServeRun``);
  ``decision_lines``: its verify steps as decisions.jsonl lines (scheduling/decisions.py).

Library code: nothing printed, frozen results; torch is imported by the serving loop only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dspark_convert.errors import ConcurrencyError
from dspark_convert.evaluation.serve_report import (
    TARGET_ONLY,
    RequestOutput,
    ServeRun,
    decisions_name,
)
from dspark_convert.scheduling.cost_table import CostTable
from dspark_convert.scheduling.decisions import DecisionLine, RequestDecision, decision_line
from dspark_convert.scheduling.policies import Policy
from dspark_convert.util.progress import NoProgress, Progress


def check_concurrencies(concurrencies: Sequence[int], prompts: int, *, where: str,
                        option: str = "--concurrency") -> None:
    """ConcurrencyError when a concurrency is beyond the ``prompts`` there are (``where``:
    the prompt set): a run of R requests in flight needs R requests."""
    for value in concurrencies:
        if value > prompts:
            raise ConcurrencyError(f"{option} {value}: {where} holds {prompts} prompt(s); "
                                   f"expected each concurrency at most the prompts given",
                                   field=option.lstrip("-"), expected=f"<= {prompts}",
                                   found=value)


def ids_sha256(ids: Sequence[int]) -> str:
    """SHA-256 of token ids written as a compact JSON list (``[1,2,3]``)."""
    return hashlib.sha256(json.dumps(list(ids), separators=(",", ":")).encode()).hexdigest()


def _percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else None


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(np.asarray(values, dtype=np.float64))) if values else None


def acceptance_by_position(steps, block_size: int) -> list[float | None]:
    """For j = 1..block_size: among request-steps that sent at least j draft tokens, the
    fraction with at least j accepted (None where no step sent j)."""
    sent = [0] * block_size
    kept = [0] * block_size
    for step in steps:
        for r in step.requests:
            for j in range(min(r.length, block_size)):
                sent[j] += 1
                kept[j] += r.accepted > j
    return [k / s if s else None for k, s in zip(kept, sent)]



def per_token_latencies(token_seconds) -> list[float]:
    """Each token's latency after a request's first: the tokens a verify step commits arrive
    together, so each of them gets the gap since the previous commit divided by how many
    came (a step of 4 tokens after 20 ms: 5 ms each). Plain gaps between consecutive tokens
    would count 0 for every token after the first of a step."""
    out: list[float] = []
    previous, run = token_seconds[0] if token_seconds else 0.0, 0
    for t in list(token_seconds[1:]) + [None]:
        if t is not None and (run == 0 or t == last):
            last, run = t, run + 1
            continue
        if run:
            out += [(last - previous) / run] * run
            previous = last
        if t is not None:
            last, run = t, 1
    return out

def serve_run(result, *, artifact: str | None, block_size: int, decisions: str | None,
              baseline: dict[str, tuple[int, ...]] | None) -> ServeRun:
    """The figures of one ``serve`` result (runtime/serving.ServeResult). ``baseline``: the
    target-only outputs at the same concurrency by request id, compared at temperature 0
    (None: no comparison, at temperature > 0 or for the baseline itself)."""
    requests, rates, gaps = [], [], []
    for r in result.requests:
        same = None if baseline is None else tuple(r.output_ids) == tuple(baseline[r.id])
        requests.append(RequestOutput(id=r.id, output_ids=list(r.output_ids),
                                      sha256=ids_sha256(r.output_ids), equal_to_target_only=same))
        # Decoding speed once the first token is out: the first token's own time is the
        # wait and the prefill (time to first token), not decoding; one token has no rate.
        busy = r.finished_seconds - r.first_token_seconds
        if len(r.output_ids) > 1 and busy > 0:
            rates.append((len(r.output_ids) - 1) / busy)
        gaps += per_token_latencies(r.token_seconds)
    new = sum(len(r.output_ids) for r in result.requests)
    parts = [p for s in result.steps for p in s.requests]
    checks = [q.equal_to_target_only for q in requests if q.equal_to_target_only is not None]
    return ServeRun(
        artifact=artifact, policy=result.policy, concurrency=result.concurrency,
        requests=requests, new_tokens=new, verify_steps=len(result.steps),
        total_seconds=result.total_seconds,
        verify_seconds=sum(s.verify_seconds for s in result.steps),
        draft_seconds=sum(s.draft_seconds for s in result.steps),
        prefill_seconds=result.prefill_seconds,
        tokens_per_second=new / result.total_seconds if result.total_seconds > 0 else None,
        per_request_tokens_per_second=_mean(rates),
        accepted_per_step=_mean([a for r in result.requests for a in r.acceptance_lengths]),
        verify_tokens=sum(s.batch_tokens for s in result.steps),
        draft_tokens_sent=sum(p.length for p in parts),
        draft_tokens_wasted=sum(p.length - p.accepted for p in parts),
        acceptance_by_position=acceptance_by_position(result.steps, block_size),
        token_latency_p50_seconds=_percentile(gaps, 50),
        token_latency_p99_seconds=_percentile(gaps, 99),
        time_to_first_token_p50_seconds=_percentile(
            [r.first_token_seconds for r in result.requests], 50),
        peak_memory_bytes=result.peak_memory_bytes, decisions=decisions,
        lossless=all(checks) if checks else None)


def decision_lines(result) -> list[DecisionLine]:
    """A ServeResult's verify steps as decisions.jsonl lines (checked by decision_line)."""
    return [decision_line(s.step, result.policy, [
        RequestDecision(id=p.id, confidence=tuple(p.confidence), length=p.length,
                        accepted=p.accepted) for p in s.requests]) for s in result.steps]


@dataclass(frozen=True)
class Drafter:
    """An artifact as the sweep runs it: its report name, its loaded runtime drafter, its
    block size (gamma); ``run_one``: for a kind that is not packed, its batch-1 loop as
    ``serve_one_by_one`` calls it (commands/evaluate_kinds.alone_runner), else None."""

    name: str
    drafter: object
    block_size: int
    run_one: Callable | None = None


@dataclass(frozen=True)
class Sweep:
    """Every run (ServeRun, in sweep order) and each run's decisions by file name."""

    runs: tuple[ServeRun, ...]
    decisions: dict[str, tuple[DecisionLine, ...]]


def sweep(target, drafters: Sequence[Drafter], requests: Sequence, *,
          policies: Sequence[Policy], concurrencies: Sequence[int], costs: CostTable | None,
          temperature: float, seed: int, stop_token_ids: tuple[int, ...],
          progress: Progress | None = None) -> Sweep:
    """Serve every request (runtime/serving.Request) in each run; see the module docstring.
    ``progress``: one bar per run, counted in new tokens (``serve``'s on_tokens)."""
    from dspark_convert.runtime.serving import serve, serve_one_by_one
    from dspark_convert.scheduling.policies import parse_policy

    progress = progress or NoProgress()
    target_only = parse_policy(TARGET_ONLY)
    plan = [step for c in concurrencies for step in
            [(c, None, target_only)] + [(c, d, p) for d in drafters for p in policies]]
    tokens = sum(r.max_new_tokens for r in requests)
    runs: list[ServeRun] = []
    decisions: dict[str, tuple[DecisionLine, ...]] = {}
    baseline: dict[str, tuple[int, ...]] = {}
    for n, (concurrency, art, policy) in enumerate(plan, 1):
        name = None if art is None else art.name
        progress.start(f"run {n}/{len(plan)}: {name or TARGET_ONLY} {policy} c{concurrency}",
                       tokens)
        try:
            if art is not None and art.run_one is not None:
                result = serve_one_by_one(target, art.run_one, requests, concurrency=concurrency,
                                          policy=policy, temperature=temperature, seed=seed,
                                          stop_token_ids=stop_token_ids,
                                          on_tokens=progress.advance)
            else:
                result = serve(target, None if art is None else art.drafter, requests,
                               concurrency=concurrency, policy=policy, costs=costs,
                               temperature=temperature, seed=seed,
                               stop_token_ids=stop_token_ids, on_tokens=progress.advance)
        finally:
            progress.finish()
        lines = decision_lines(result)
        file = decisions_name(name, str(policy), concurrency) if lines else None
        if file is not None:
            decisions[file] = tuple(lines)
        if art is None:
            baseline = {r.id: tuple(r.output_ids) for r in result.requests}
        compare = baseline if art is not None and temperature == 0.0 else None
        runs.append(serve_run(result, artifact=name,
                              block_size=0 if art is None else art.block_size,
                              decisions=file, baseline=compare))
    return Sweep(runs=tuple(runs), decisions=decisions)
