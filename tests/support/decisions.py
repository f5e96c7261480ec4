"""Recordings of verify-length schedulers for the decisions, simulate and scheduler-check
tests: synthetic confidences and acceptances (seeded), a real cost table, and a scheduler
(a policy of the table, or a faulty one) choosing each step's lengths as an engine would,
written as decisions.jsonl by the project's own writer."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from dspark_convert.scheduling.cost_table import CostTable
from dspark_convert.scheduling.decisions import RequestDecision, decision_line, dump_line
from dspark_convert.scheduling.policies import (
    Confidences,
    StepView,
    dspark,
    dspark_async,
    parse_policy,
    retrospective_search_not_lossless,
)

GAMMA = 7
# A staircase as a GPU's is: flat while the batch is small, falling past a graph size.
COSTS = CostTable(tokens=(1, 2, 4, 8, 16, 32, 64, 128, 256),
                  steps_per_second=(52.0, 51.5, 51.0, 49.0, 45.0, 36.0, 22.0, 11.5, 6.0),
                  device="test staircase", dtype="bfloat16", threads=1, versions={})

# A scheduler: (today's confidences, every earlier step's confidences) -> lengths.
Scheduler = Callable[[Confidences, Sequence[Confidences]], tuple[int, ...]]


def of_policy(spec: str, costs: CostTable = COSTS) -> Scheduler:
    """The policy as an engine following the format runs it: dspark-async from the step
    two earlier, by Algorithm 1 at steps 0 and 1."""
    policy = parse_policy(spec)

    def decide(conf: Confidences, history: Sequence[Confidences]) -> tuple[int, ...]:
        if policy.name == "dspark-async":
            if len(history) < 2:
                return dspark(StepView(conf), costs).lengths
            return dspark_async(StepView(conf, history[-2]), costs).lengths
        return policy.decide(StepView(conf), costs).lengths
    return decide


def retrospective(costs: CostTable = COSTS) -> Scheduler:
    """A dspark scheduler that skips the stop (Appendix A's negative control)."""
    return lambda conf, history: retrospective_search_not_lossless(StepView(conf), costs).lengths


def async_from_previous_step(costs: CostTable = COSTS) -> Scheduler:
    """A dspark-async scheduler whose budget comes from the step one earlier (n-1)."""
    def decide(conf, history):
        if len(history) < 2:
            return dspark(StepView(conf), costs).lengths
        return dspark_async(StepView(conf, history[-1]), costs).lengths
    return decide


def record(scheduler: Scheduler, policy: str, *, steps: int = 24, seed: int = 7,
           width: Callable[[int], int] = lambda n: 2 + n % 5,
           keep: int = 3) -> list[str]:
    """The lines (no newline) of a run: at each step ``width(step)`` requests in flight
    (the oldest ``keep`` stay, the rest are new), each with GAMMA confidences drawn from a
    per-request skill; the target accepts each verified token with its confidence's
    probability, stopping at the first it rejects."""
    rng = random.Random(seed)
    skill: dict[str, float] = {}
    history: list[Confidences] = []
    lines = []
    flight: list[str] = []
    next_id = 0
    for n in range(steps):
        flight = flight[:keep]
        while len(flight) < width(n):
            flight.append(f"p{next_id}")
            skill[f"p{next_id}"] = rng.uniform(0.2, 4.0)
            next_id += 1
        conf = tuple(tuple(round(rng.random() ** (1.0 / skill[i]), 6) for _ in range(GAMMA))
                     for i in flight)
        lengths = scheduler(conf, history)
        requests = []
        for i, c, length in zip(flight, conf, lengths):
            accepted = 0
            while accepted < length and rng.random() < c[accepted]:
                accepted += 1
            requests.append(RequestDecision(id=i, confidence=c, length=length, accepted=accepted))
        lines.append(dump_line(decision_line(n, policy, requests)))
        history.append(conf)
    return lines


def as_bytes(lines: Sequence[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode()


def sequential(scheduler: Scheduler, policy: str, *, requests: int = 4, blocks: int = 6,
               seed: int = 11) -> list[str]:
    """A run at concurrency 1: the requests one after another, each ``blocks`` steps."""
    rng = random.Random(seed)
    history: list[Confidences] = []
    lines = []
    for r in range(requests):
        skill = rng.uniform(0.3, 3.0)
        for _ in range(blocks):
            conf = (tuple(round(rng.random() ** (1.0 / skill), 6) for _ in range(GAMMA)),)
            (length,) = scheduler(conf, history)
            accepted = 0
            while accepted < length and rng.random() < conf[0][accepted]:
                accepted += 1
            lines.append(dump_line(decision_line(len(lines), policy, [RequestDecision(
                id=f"r{r}", confidence=conf[0], length=length, accepted=accepted)])))
            history.append(conf)
    return lines
