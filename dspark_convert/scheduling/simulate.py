"""The policies replayed on recorded decisions and a cost table, without a model
(docs/SCHEDULING.md "Simulating: dspark simulate").

A recording is decisions (scheduling/decisions.py; commands/simulate.py also makes them
from a smoke/eval trace).

What a new length l' would have accepted: ``min(accepted, l')``. It is exact when the
recorded step rejected a token (accepted < recorded length: the first rejection is known)
and when l' is at most the recorded length; when the whole recorded block was accepted and
l' is longer, the true count is unknown (censored): the simulation takes the recorded count,
a lower bound, and counts those request-steps (``censored_request_steps``) and the steps
holding one (``censored_steps``).

- ``replay``: the recorded batches as they were: each recorded step's requests re-decided by
  the policy; the figures of those steps.
- ``sweep``: each request's recorded blocks (its lines in step order, by id) replayed at
  concurrency R: requests join in order of first appearance as others finish, each
  simulated step a request presents its next recorded block (after its last, its first
  again), and it finishes when it has produced what it produced in the recording,
  Σ(accepted + 1). The approximation: a request that accepted a different number of
  tokens would have drafted another block next, not the recorded one; the recorded blocks
  stand in for its drafts' confidences and acceptances, not for its text.

Predicted verify time is Σ over steps of 1/SPS(B), B = Σ(1 + l'). Both are pure functions
returning frozen results.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from contextlib import contextmanager

from dspark_convert.errors import ConcurrencyError, CostTableRangeError, SchedulingPolicyError
from dspark_convert.scheduling.cost_table import CostTable
from dspark_convert.scheduling.decisions import Decisions, RequestDecision
from dspark_convert.scheduling.policies import Confidences, Policy, StepView

# Policies that decide without confidences: a recording without any (a drafter without a
# confidence head: ``confidence: []`` on every line) can be scheduled only by these.
WITHOUT_CONFIDENCES = frozenset({"full", "target-only"})


# A concurrency list (`simulate --concurrency`, `serve-bench --concurrency`): bounds, not
# targets; far above any GPU's batch and any sweep one would read.
MAX_CONCURRENCY = 65_536
MAX_CONCURRENCY_LEVELS = 64


def parse_concurrency(text: str) -> tuple[int, ...]:
    """``"1,4,16,64"`` as (1, 4, 16, 64): a comma list of positive integers (plain decimal
    digits), strictly increasing, each at most MAX_CONCURRENCY, at most
    MAX_CONCURRENCY_LEVELS of them; ConcurrencyError (one line) otherwise."""
    shown_text = repr(text if len(text) <= 64 else text[:64] + "...")

    def refuse(why: str) -> ConcurrencyError:
        return ConcurrencyError(f"--concurrency {shown_text}: expected a comma list of positive "
                                f"integers, strictly increasing (1,4,16,64); {why}",
                                field="concurrency", expected="1,4,16,64", found=shown_text)

    parts = text.split(",")
    if len(parts) > MAX_CONCURRENCY_LEVELS:
        raise refuse(f"found {len(parts)} entries, at most {MAX_CONCURRENCY_LEVELS} allowed")
    levels: list[int] = []
    for part in parts:
        if not (part.isascii() and part.isdigit()) or len(part) > len(str(MAX_CONCURRENCY)):
            raise refuse(f"found {part[:20]!r}")
        value = int(part)
        if not 1 <= value <= MAX_CONCURRENCY:
            raise refuse(f"found {value}, expected 1..{MAX_CONCURRENCY}")
        if levels and value <= levels[-1]:
            raise refuse(f"found {value} after {levels[-1]}")
        levels.append(value)
    return tuple(levels)


@contextmanager
def _at_step(step: int):
    """A step the cost table does not reach, named: "step 12: cost table: ..." (142)."""
    try:
        yield
    except CostTableRangeError as exc:
        raise CostTableRangeError(f"step {step}: {exc.message}", field=exc.field,
                                  expected=exc.expected, found=exc.found) from None


def step_lengths(policy: Policy, requests: Sequence[RequestDecision],
                 two_steps_ago: Confidences | None, costs: CostTable, *, step: int,
                 headless: bool = False) -> tuple[int, ...]:
    """The lengths ``policy`` gives one step's requests (in request order) on their
    confidences. ``two_steps_ago``: the confidences of the step two verify steps earlier
    (dspark-async's budget); None for a run's steps 0 and 1, which dspark-async decides by
    Algorithm 1 (``dspark``) on today's confidences. ``headless``: the recording has no
    confidences at all (``Decisions.headless``): ``full`` sends each recorded length (the
    block as recorded), ``target-only`` none, any other policy is refused
    (SchedulingPolicyError, naming the step and the request). Otherwise a request without
    confidences was shown none (it had no room for a draft token): every policy sees its
    empty block and sends none of it."""
    bare = [r for r in requests if not r.confidence]
    if bare and headless:
        if policy.name not in WITHOUT_CONFIDENCES:
            raise SchedulingPolicyError(
                f"policy {policy}: step {step}, request {bare[0].id!r} has no confidences "
                f"(confidence: []); expected confidences, or a policy that needs none (full, "
                f"target-only)", field=f"step {step}.confidence", expected="confidences",
                found="[]")
        if policy.name == "full":
            return tuple(len(r.confidence) or r.length for r in requests)
        return (0,) * len(requests)
    confidences = tuple(r.confidence for r in requests)
    if policy.name == "dspark-async" and two_steps_ago is None:
        policy = Policy("dspark")
    with _at_step(step):
        return policy.decide(StepView(confidences, two_steps_ago), costs).lengths


class Figures(BaseModel):
    """What a policy does on a recording (one concurrency in a sweep)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    policy: str
    mode: str                          # replay or sweep
    concurrency: int | None            # sweep: R; replay: None (the recorded batches)
    steps: int                         # verify steps
    requests: int                      # distinct request ids
    verify_tokens: int                 # Σ B: tokens sent to the target
    wasted_tokens: int                 # draft tokens sent and not accepted
    output_tokens: int                 # Σ (accepted + 1) over request-steps
    accepted_per_step: float           # mean of accepted + 1 per request-step
    verify_seconds: float              # predicted: Σ 1/SPS(B)
    tokens_per_second: float           # output_tokens / verify_seconds
    per_request_tokens_per_second: float | None   # sweep: mean of each request's own rate
    censored_steps: int                # steps where a lower bound stood for the true count
    censored_request_steps: int
    # The lengths chosen, step by step (replay: the recorded steps'); in no report or schema.
    lengths: SkipJsonSchema[tuple[tuple[int, ...], ...]] = Field(default=(), exclude=True)


@dataclass
class _Tally:
    steps: int = 0
    verify_tokens: int = 0
    wasted: int = 0
    output: int = 0
    request_steps: int = 0
    seconds: float = 0.0
    censored_steps: int = 0
    censored_request_steps: int = 0

    def step(self, blocks: Sequence[RequestDecision], lengths: Sequence[int],
             costs: CostTable) -> tuple[list[int], float]:
        """Count one step; (tokens each request produced, the step's predicted seconds)."""
        batch = sum(1 + n for n in lengths)
        with _at_step(self.steps):
            seconds = 1.0 / costs.steps_per_second_at(batch)
        produced, censored = [], 0
        for block, n in zip(blocks, lengths):
            accepted = min(block.accepted, n)
            censored += block.accepted == block.length and n > block.length
            self.wasted += n - accepted
            produced.append(accepted + 1)
        self.steps += 1
        self.verify_tokens += batch
        self.output += sum(produced)
        self.request_steps += len(produced)
        self.seconds += seconds
        self.censored_request_steps += censored
        self.censored_steps += censored > 0
        return produced, seconds

    def figures(self, policy: Policy, *, mode: str, concurrency: int | None, requests: int,
                per_request: float | None = None, lengths=()) -> Figures:
        return Figures(policy=str(policy), mode=mode, concurrency=concurrency, steps=self.steps,
                       requests=requests, verify_tokens=self.verify_tokens,
                       wasted_tokens=self.wasted, output_tokens=self.output,
                       accepted_per_step=self.output / self.request_steps,
                       verify_seconds=self.seconds, tokens_per_second=self.output / self.seconds,
                       per_request_tokens_per_second=per_request,
                       censored_steps=self.censored_steps,
                       censored_request_steps=self.censored_request_steps,
                       lengths=tuple(lengths))


def _request_ids(decisions: Decisions) -> list[str]:
    """Every request id, in order of first appearance."""
    return list(dict.fromkeys(r.id for line in decisions.lines for r in line.requests))


def replay(decisions: Decisions, policy: Policy, costs: CostTable) -> Figures:
    """The recorded batches as they were, each step re-decided by ``policy`` (dspark-async's
    budget from the recorded line two steps earlier; Algorithm 1 at steps 0 and 1)."""
    tally = _Tally()
    chosen = []
    lines = decisions.lines
    for n, line in enumerate(lines):
        earlier = tuple(r.confidence for r in lines[n - 2].requests) if n >= 2 else None
        lengths = step_lengths(policy, line.requests, earlier, costs, step=line.step,
                               headless=decisions.headless)
        tally.step(line.requests, lengths, costs)
        chosen.append(lengths)
    return tally.figures(policy, mode="replay", concurrency=None,
                         requests=len(_request_ids(decisions)), lengths=chosen)


def sweep(decisions: Decisions, policy: Policy, costs: CostTable, concurrency: int) -> Figures:
    """Each request's recorded blocks replayed at ``concurrency`` requests in flight
    (module docstring: the approximation), until every request has produced what it did in
    the recording."""
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ConcurrencyError(f"concurrency {concurrency!r}: expected a positive integer",
                               field="concurrency", expected=">= 1", found=repr(concurrency))
    blocks: dict[str, list[RequestDecision]] = {}
    for line in decisions.lines:
        for r in line.requests:
            blocks.setdefault(r.id, []).append(r)
    order = list(blocks)
    goal = {i: sum(b.accepted + 1 for b in blocks[i]) for i in order}
    waiting = iter(order)
    flight: list[str] = []
    made = dict.fromkeys(order, 0)
    cursor = dict.fromkeys(order, 0)
    wall = dict.fromkeys(order, 0.0)
    history: list[Confidences] = []
    tally = _Tally()
    while True:
        flight.extend(i for _, i in zip(range(concurrency - len(flight)), waiting))
        if not flight:
            break
        step = [blocks[i][cursor[i] % len(blocks[i])] for i in flight]
        earlier = history[-2] if len(history) >= 2 else None
        lengths = step_lengths(policy, step, earlier, costs, step=tally.steps,
                               headless=decisions.headless)
        history.append(tuple(b.confidence for b in step))
        produced, seconds = tally.step(step, lengths, costs)
        for i, tokens in zip(flight, produced):
            made[i] += tokens
            cursor[i] += 1
            wall[i] += seconds
        flight = [i for i in flight if made[i] < goal[i]]
    per_request = sum(made[i] / wall[i] for i in order) / len(order)
    return tally.figures(policy, mode="sweep", concurrency=concurrency, requests=len(order),
                         per_request=per_request)
