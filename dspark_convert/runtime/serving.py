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
"""

from __future__ import annotations

from dataclasses import dataclass


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
