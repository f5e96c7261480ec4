"""Batched serving in the reference runtime: R requests in flight, a verify-length policy
choosing each step how many draft tokens of each request the target verifies
(docs/SCHEDULING.md; docs/REFERENCE.md §9).

Each request has its own target KV cache, its own drafter context and its own random
generator (seeded from the run's seed and the request's id), so that what it generates
does not depend on its neighbours. Each step:

1. requests join while fewer than ``concurrency`` are in flight (continuous batching: a
   finished request's place is taken at the next step); a joining request's prompt is
   prefilled alone and its first token picked, as ``speculative_generate`` does;
2. one batched drafter pass: every request's block ``[anchor, MASK...]`` in one packed
   forward (linear layers over all R*gamma rows; attention per request over its own
   context cells, so no request sees another's tokens), then each request's Markov stage
   and confidence head (a sequential walk per request, drawing from its own generator);
3. the policy decides the lengths from the confidences alone (``StepView``), at most what
   the request still needs (``max_new_tokens``): a request one token from its end is
   shown no confidence and verifies none;
4. one batched target verify: every request's ``[anchor, t_1 .. t_l]`` packed into one
   forward of B = Σ(1 + l_r) rows, each segment attending to its own cache;
5. each request accepts a prefix and commits a correction or bonus token exactly as the
   batch-1 loop does (runtime/speculative.verify), its cache is cut back and its drafter
   context grows by the verified anchor and accepted tokens;
6. requests that reached a stop token or ``max_new_tokens`` leave.

Under ``target-only`` no drafter runs: each step is one packed forward of one token per
request. The batch-1 loop (runtime/speculative.py) is what DeepSeek's code does; this
loop is that loop, R at a time.

A DFlash2 drafter (runtime/dflash2.py) is packed the same way (its block pass over every
request's block, its context cells DFlash's), greedy only and under ``full`` only (no
confidence head): each request's B - 1 drafts by the selector's walk, as dflash2_loop does.
The Gemma 4 assistant is not packed here (its steps read the target's KV of each request):
``serve_one_by_one`` serves it under ``full`` only, each request alone through its batch-1
loop, one after another (a request's wait for its turn counts in its time to first token),
recorded in the same ServeResult (one verify step per cycle).
"""

from __future__ import annotations

import hashlib
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from dspark_convert.errors import SchedulingPolicyError
from dspark_convert.runtime.dflash2_loop import check_greedy
from dspark_convert.runtime.drafter import DSparkDrafter
from dspark_convert.runtime.qwen3 import KVCache
from dspark_convert.runtime.sampling import pick, probs_from_logits
from dspark_convert.runtime.speculative import (TARGET_LOGITS, prefill, synchronize,
                                               trim_at_stop, verify)
from dspark_convert.scheduling.cost_table import CostTable
from dspark_convert.scheduling.policies import Confidences, Policy, StepView

TARGET_ONLY = "target-only"
COSTED = ("dspark", "dspark-async")      # the policies that read the cost table


@dataclass(frozen=True)
class Request:
    """One prompt to serve: its id (the prompt's), its token ids, how many new tokens."""

    id: str
    prompt: tuple[int, ...]
    max_new_tokens: int


@dataclass(frozen=True)
class RequestStep:
    """One request's part of one verify step, as decisions.jsonl records it: the
    confidences the policy saw (``()`` under target-only or for a drafter without a
    confidence head), the draft tokens verified, how many of them were accepted."""

    id: str
    confidence: tuple[float, ...]
    length: int
    accepted: int


@dataclass(frozen=True)
class StepRecord:
    """One verify step: every request in flight (in join order), B = Σ(1 + l_r), and its
    times (device-synchronised): the drafter's pass (proposals, the policy, and the context
    cells it commits after verification), the target's verify forward, and the wall clock
    at the step's end, from the run's start."""

    step: int
    requests: tuple[RequestStep, ...]
    batch_tokens: int
    draft_seconds: float
    verify_seconds: float
    end_seconds: float


@dataclass(frozen=True)
class RequestResult:
    """One request served: what it generated and when. Times are from the run's start:
    all requests arrive at 0 (a closed-loop benchmark), so ``first_token_seconds`` counts
    the wait for a place in the batch. ``token_seconds``: when each new token was
    committed (the end of the prefill for the first, of its verify step for the others)."""

    id: str
    prompt: tuple[int, ...]
    output_ids: tuple[int, ...]                 # the new tokens only (the prompt excluded)
    joined_seconds: float
    first_token_seconds: float
    finished_seconds: float
    token_seconds: tuple[float, ...]
    acceptance_lengths: tuple[int, ...]         # accepted + 1 per verify step (accepted at a stop)


@dataclass(frozen=True)
class ServeResult:
    """A whole run: one policy (``str(Policy)``), one concurrency, every request (in the
    order given), every verify step, the wall time, the time in prefills, and the peak
    memory (CUDA: torch's peak allocated bytes; CPU: the process's peak RSS, ru_maxrss,
    which never decreases within a process)."""

    policy: str
    concurrency: int
    requests: tuple[RequestResult, ...]
    steps: tuple[StepRecord, ...]
    total_seconds: float
    prefill_seconds: float
    peak_memory_bytes: int


@dataclass(frozen=True)
class AloneStep:
    """One cycle of a batch-1 loop, as ``serve_one_by_one`` records it: draft tokens sent,
    accepted, committed (accepted + 1, or accepted at a stop), its times, and its end from
    the request's start."""

    length: int
    accepted: int
    committed: int
    draft_seconds: float
    verify_seconds: float
    end_seconds: float


@dataclass(frozen=True)
class AloneRun:
    """One request generated by a batch-1 loop: its output (the prompt included), its
    cycles, the time of its prefill and first token."""

    output_ids: tuple[int, ...]
    steps: tuple[AloneStep, ...]
    prefill_seconds: float


def serve_one_by_one(target, run_one: Callable[[Request, int | None], AloneRun],
                     requests: Sequence[Request], *, concurrency: int, policy: Policy,
                     temperature: float = 0.0, seed: int = 0,
                     stop_token_ids: tuple[int, ...] = (),
                     on_tokens: Callable[[int], None] | None = None) -> ServeResult:
    """Serve ``requests`` one after another, each by ``run_one(request, its seed)`` (a
    drafter kind's batch-1 loop; the seed from ``request_seed`` when sampling, else None),
    under ``full`` only: not packed, so ``concurrency`` is recorded but never more than one
    request is in flight. Each cycle is one verify step of one request."""
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency: expected a positive integer, found {concurrency!r}")
    if policy.name != "full":
        raise SchedulingPolicyError(
            f"policy {policy}: this drafter has no confidence head and is served one request "
            "at a time; expected full", field="policy", expected="full", found=str(policy))
    device = target.device
    stops = tuple(stop_token_ids)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    synchronize(device)
    began = time.perf_counter()
    results: list[RequestResult] = []
    steps: list[StepRecord] = []
    prefill_seconds = 0.0
    for request in requests:
        joined = time.perf_counter() - began
        run = run_one(request, request_seed(seed, request.id) if temperature > 0.0 else None)
        P = len(request.prompt)
        output = trim_at_stop(list(run.output_ids[: P + request.max_new_tokens]), P, stops)
        new = len(output) - P
        times = [joined + run.prefill_seconds]
        for cycle in run.steps:
            times += [joined + cycle.end_seconds] * cycle.committed
            steps.append(StepRecord(
                step=len(steps), requests=(RequestStep(id=request.id, confidence=(),
                                                       length=cycle.length,
                                                       accepted=cycle.accepted),),
                batch_tokens=1 + cycle.length, draft_seconds=cycle.draft_seconds,
                verify_seconds=cycle.verify_seconds, end_seconds=joined + cycle.end_seconds))
        prefill_seconds += run.prefill_seconds
        finished = time.perf_counter() - began
        results.append(RequestResult(id=request.id, prompt=request.prompt,
                                     output_ids=tuple(output[P:]), joined_seconds=joined,
                                     first_token_seconds=times[0], finished_seconds=finished,
                                     token_seconds=tuple(times[:new]),
                                     acceptance_lengths=tuple(c.committed for c in run.steps)))
        if on_tokens is not None and new:
            on_tokens(new)
    synchronize(device)
    return ServeResult(policy=str(policy), concurrency=concurrency, requests=tuple(results),
                       steps=tuple(steps), total_seconds=time.perf_counter() - began,
                       prefill_seconds=prefill_seconds, peak_memory_bytes=_peak_memory(device))


def request_seed(seed: int, request_id: str) -> int:
    """The seed of a request's own generator: from the run's seed and the request's id
    alone (the first 8 bytes of SHA-256 of ``"{seed}\\0{id}"``), so that a request draws the
    same numbers whatever runs beside it and in whatever order it joins."""
    digest = hashlib.sha256(f"{seed}\0{request_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


class _InFlight:
    """One request being served: its tokens (prompt included), anchor index, target cache,
    drafter (a fork with its own context), generator, and what it has done so far."""

    def __init__(self, request: Request, joined: float, stops: tuple[int, ...]) -> None:
        self.request = request
        self.stops = stops
        self.x: list[int] = list(request.prompt)
        self.max_length = len(request.prompt) + request.max_new_tokens
        self.cache = KVCache()
        self.drafter: DSparkDrafter | None = None
        self.generator: torch.Generator | None = None
        self.acceptance: list[int] = []
        self.token_seconds: list[float] = []
        self.joined = joined
        self.done = False

    @property
    def start(self) -> int:
        """The anchor's index: the last committed token."""
        return len(self.x) - 1

    def room(self) -> int:
        """The most draft tokens a verify step may send without passing max_new_tokens:
        a step commits at most length + 1 tokens."""
        return self.max_length - len(self.x) - 1

    def commit(self, tokens: list[int], now: float) -> None:
        """Append committed tokens (a stop token can only be the last: verify cuts there)."""
        self.x.extend(tokens)
        self.token_seconds.extend([now] * len(tokens))
        if (tokens and tokens[-1] in self.stops) or len(self.x) >= self.max_length:
            self.done = True

    def result(self, finished: float) -> RequestResult:
        new = trim_at_stop(self.x[: self.max_length], len(self.request.prompt), self.stops)
        n = len(new) - len(self.request.prompt)
        return RequestResult(id=self.request.id, prompt=self.request.prompt,
                             output_ids=tuple(new[len(self.request.prompt):]),
                             joined_seconds=self.joined,
                             first_token_seconds=self.token_seconds[0],
                             finished_seconds=finished,
                             token_seconds=tuple(self.token_seconds[:n]),
                             acceptance_lengths=tuple(self.acceptance))


def _check_run(drafter: DSparkDrafter | None, policy: Policy, costs: CostTable | None,
               concurrency: int) -> None:
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency: expected a positive integer, found {concurrency!r}")
    if policy.name == TARGET_ONLY:
        return
    if drafter is None:
        raise SchedulingPolicyError(f"policy {policy}: expected a drafter (only target-only "
                                    f"runs without one)", field="policy", found=str(policy))
    if not _packing(drafter).confidence and policy.name != "full":
        raise SchedulingPolicyError(
            f"policy {policy}: the drafter has no confidence head; expected full or "
            f"target-only (the others schedule by its confidences)", field="policy",
            expected="full, target-only", found=str(policy))
    if policy.name in COSTED and costs is None:
        raise SchedulingPolicyError(f"policy {policy}: expected a cost table (SPS(B)), found "
                                    f"none", field="cost_table", expected="a cost table",
                                    found="nothing")


@torch.inference_mode()
def serve(target, drafter: DSparkDrafter | None, requests: Sequence[Request], *,
          concurrency: int, policy: Policy, costs: CostTable | None = None,
          temperature: float = 0.0, seed: int = 0, stop_token_ids: tuple[int, ...] = (),
          on_tokens: Callable[[int], None] | None = None) -> ServeResult:
    """Serve ``requests`` with at most ``concurrency`` in flight, ``policy`` choosing each
    verify step's lengths (the module's docstring). ``drafter``: a loaded drafter, forked
    per request (None only under target-only); ``costs``: SPS(B), for dspark and
    dspark-async. ``on_tokens(n)``: called with the number of new tokens each step (and
    each prefill) committed."""
    _check_run(drafter, policy, costs, concurrency)
    if drafter is not None and _packing(drafter).greedy_only:
        check_greedy(temperature)
    device = target.device
    speculative = policy.name != TARGET_ONLY
    taps = drafter.hidden_state_indices if speculative else ()
    stops = tuple(stop_token_ids)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    synchronize(device)
    began = time.perf_counter()
    clock = lambda: time.perf_counter() - began            # noqa: E731
    waiting = list(requests)[::-1]
    active: list[_InFlight] = []
    done: dict[str, RequestResult] = {}
    steps: list[StepRecord] = []
    seen: list[Confidences] = []          # each step's confidences as the policy saw them
    prefill_seconds = 0.0

    def tell(n: int) -> None:
        if on_tokens is not None and n:
            on_tokens(n)

    while waiting or active:
        while waiting and len(active) < concurrency:
            t0 = time.perf_counter()
            r = _InFlight(waiting.pop(), clock(), stops)
            if temperature > 0.0:
                r.generator = torch.Generator(device="cpu")
                r.generator.manual_seed(request_seed(seed, r.request.id))
            out, first = prefill(target, r.x, r.cache, keep=taps, temperature=temperature,
                                 generator=r.generator)
            if speculative:
                r.drafter = drafter.fork()
                if first not in stops:
                    r.drafter.add_context(r.drafter.features(out.hidden_states))
            synchronize(device)
            r.commit([first], clock())
            prefill_seconds += time.perf_counter() - t0
            tell(1)
            if r.done:
                done[r.request.id] = r.result(clock())
            else:
                active.append(r)
        if not active:
            continue
        if speculative:
            record = _speculative_step(target, drafter, active, policy, costs, temperature,
                                       stops, seen, len(steps), clock)
        else:
            record = _target_step(target, active, temperature, len(steps), clock)
        steps.append(record)
        tell(sum(r.acceptance[-1] for r in active))
        for r in [r for r in active if r.done]:
            done[r.request.id] = r.result(record.end_seconds)
            active.remove(r)
    synchronize(device)
    total = time.perf_counter() - began
    return ServeResult(policy=str(policy), concurrency=concurrency,
                       requests=tuple(done[q.id] for q in requests), steps=tuple(steps),
                       total_seconds=total, prefill_seconds=prefill_seconds,
                       peak_memory_bytes=_peak_memory(device))


def _speculative_step(target, drafter: DSparkDrafter, active: list[_InFlight], policy: Policy,
                      costs: CostTable | None, temperature: float, stops: tuple[int, ...],
                      seen: list[Confidences], step: int, clock) -> StepRecord:
    """One batched drafter pass, the policy's lengths, one batched verify, the commits."""
    device = target.device
    t0 = time.perf_counter()
    packing = _packing(drafter)
    anchors = [r.x[r.start] for r in active]
    hidden = drafter.block_hidden_packed(anchors, [r.drafter for r in active])
    proposals = [packing.propose(r.drafter, a, hb, temperature, r.generator)
                 for r, a, hb in zip(active, anchors, hidden)]
    rooms = [max(0, r.room()) for r in active]
    if packing.confidence:
        view = tuple(tuple(float(c) for c in drafter.step_confidences(p.confidence_logits)
                           [:room].tolist()) for p, room in zip(proposals, rooms))
        lengths = _decide(policy, view, seen, costs)
        seen.append(view)
    else:                  # `full` only (_check_run): the whole block, within the room
        view = tuple(() for _ in active)
        lengths = tuple(min(packing.drafts, room) for room in rooms)
    drafts = [p.tokens[:n].tolist() for p, n in zip(proposals, lengths)]
    synchronize(device)
    t1 = time.perf_counter()
    outs = target.forward_packed(
        [(torch.tensor([a, *d], dtype=torch.long, device=device), r.cache)
         for r, a, d in zip(active, anchors, drafts)], keep=drafter.hidden_state_indices)
    synchronize(device)
    verify_seconds = time.perf_counter() - t1
    now = clock()
    parts, features, growing = [], [], []
    for r, p, out, draft, n, conf in zip(active, proposals, outs, drafts, lengths, view):
        probs = probs_from_logits(out.logits, temperature, what=TARGET_LOGITS)
        q = packing.draft_probs(p, n, temperature) if n else None
        accepted, next_token, stopped = verify(probs, q, draft, stop_token_ids=stops,
                                               generator=r.generator)
        parts.append(RequestStep(id=r.request.id, confidence=conf, length=n, accepted=accepted))
        if stopped:
            r.acceptance.append(accepted)
            r.commit(draft[:accepted], now)
            r.done = True
            continue
        r.acceptance.append(accepted + 1)
        r.commit(draft[:accepted] + [next_token], now)
        r.cache.crop(r.start)
        if not r.done:     # context cells after verification: the anchor and the accepted
            features.append(r.drafter.features(out.hidden_states)[: accepted + 1])
            growing.append(r.drafter)
    t2 = time.perf_counter()
    if growing:
        drafter.add_context_packed(features, growing)
    synchronize(device)
    draft_seconds = (t1 - t0) + (time.perf_counter() - t2)
    return StepRecord(step=step, requests=tuple(parts),
                      batch_tokens=sum(1 + n for n in lengths), draft_seconds=draft_seconds,
                      verify_seconds=verify_seconds, end_seconds=clock())


@dataclass(frozen=True)
class _Packing:
    """How the packed step drives a drafter kind: drafts per block, whether it has a
    confidence head, whether its walk is greedy only, its proposal from a block hidden and
    the draft distribution q of its first n drafts (None: greedy, verify reads none)."""

    drafts: int
    confidence: bool
    greedy_only: bool
    propose: Callable
    draft_probs: Callable


def _packing(drafter) -> _Packing:
    """A DSpark / DFlash drafter's packing, or a DFlash2 drafter's (its selector's greedy
    walk over B - 1 slots, no confidence head)."""
    from dspark_convert.runtime.dflash2 import DFlash2Drafter

    if isinstance(drafter, DFlash2Drafter):
        return _Packing(drafts=drafter.block_size - 1, confidence=False, greedy_only=True,
                        propose=lambda d, a, hb, t, g: d.propose_from(a, hb),
                        draft_probs=lambda p, n, t: None)
    return _Packing(drafts=drafter.block_size, confidence=bool(drafter.confidence),
                    greedy_only=False,
                    propose=lambda d, a, hb, t, g: d.propose_from(a, hb, temperature=t,
                                                                  generator=g),
                    draft_probs=lambda p, n, t: replace(p, length=n).draft_probs(t))


def _decide(policy: Policy, view: Confidences, seen: list[Confidences],
            costs: CostTable | None) -> tuple[int, ...]:
    """The policy's lengths on ``view``. dspark-async's budget comes from the confidences
    of two verify steps earlier; the first two steps of a run have none, and decide by
    Algorithm 1 on their own confidences (lossless too)."""
    if policy.name == "dspark-async":
        if len(seen) < 2:
            return Policy("dspark").decide(StepView(view), costs).lengths
        return policy.decide(StepView(view, two_steps_ago=seen[-2]), costs).lengths
    return policy.decide(StepView(view), costs).lengths


def _target_step(target, active: list[_InFlight], temperature: float, step: int,
                 clock) -> StepRecord:
    """target-only: one packed forward of each request's last token, one token each."""
    device = target.device
    t0 = time.perf_counter()
    outs = target.forward_packed([(torch.tensor([r.x[-1]], dtype=torch.long, device=device),
                                   r.cache) for r in active], keep=())
    tokens = [pick(out.logits[-1], temperature, r.generator, what=TARGET_LOGITS)
              for r, out in zip(active, outs)]
    synchronize(device)
    verify_seconds = time.perf_counter() - t0
    now = clock()
    for r, token in zip(active, tokens):
        r.acceptance.append(1)
        r.commit([token], now)
    return StepRecord(step=step, requests=tuple(RequestStep(id=r.request.id, confidence=(),
                                                            length=0, accepted=0)
                                                for r in active),
                      batch_tokens=len(active), draft_seconds=0.0,
                      verify_seconds=verify_seconds, end_seconds=clock())


def _peak_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # KiB on Linux
