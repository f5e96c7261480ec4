"""An engine's recorded decisions against the policy they claim (docs/SCHEDULING.md
"Checking a scheduler's decisions"; docs/REFERENCE.md §9).

For each line, the lengths the policy gives on the recorded confidences (dspark-async: its
budget from the line two steps earlier; Algorithm 1 at steps 0 and 1) against the recorded
lengths. The first step that differs is named with the request, the length expected and
found, and why, in words a maintainer acts on:

- ``dspark``: a length Algorithm 1 would not choose (fewer: it stopped before a candidate
  that raises τ·SPS(B); more: it admitted one that does not); and when the recorded lengths
  are exactly what the search without the stop gives, the stop was skipped (Appendix A: a
  retrospective search, not lossless).
- ``dspark-async``: a recorded budget equal to the capacity of the previous line's or the
  same line's confidences is a budget from fresher confidences than §5.2 allows.
- ``threshold=X``, ``full``, ``target-only``: the plain difference.

``accepted <= length`` on every line is the decisions reader's rule (a file that breaks it
is refused there, 146). A pure function returning a frozen result.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from dspark_convert.errors import SchedulerMismatchError
from dspark_convert.scheduling.cost_table import CostTable
from dspark_convert.scheduling.decisions import DecisionLine, Decisions
from dspark_convert.scheduling.policies import (Policy, StepView, capacity,
                                                retrospective_search_not_lossless)
from dspark_convert.scheduling.simulate import step_lengths


class Difference(BaseModel):
    """The first recorded length the policy would not have chosen."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    step: int
    request: str                   # its id
    index: int                     # its place in the step's requests
    expected: int                  # the policy's length
    found: int                     # the recorded length
    why: str


class SchedulerCheck(BaseModel):
    """The check of one decisions file against one policy."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    policy: str
    recorded_policy: str           # what the file says it ran
    steps_checked: int             # every step when it conforms, else up to the difference
    first_difference: Difference | None

    @property
    def conforms(self) -> bool:
        return self.first_difference is None


def _confidences(line: DecisionLine):
    return tuple(r.confidence for r in line.requests)


def _dspark_why(line: DecisionLine, found: tuple[int, ...], expected: int, got: int,
                costs: CostTable) -> str:
    view = StepView(_confidences(line))
    if found == retrospective_search_not_lossless(view, costs).lengths:
        return ("the stop was skipped: a retrospective search, not lossless (Appendix A): "
                "these are the lengths of the best tau*SPS(B) over every B, which reads the "
                "confidences after each token it decides")
    if got < expected:
        return ("a length Algorithm 1 would not choose: fewer, stopped before a candidate "
                "that raises tau*SPS(B)")
    return ("a length Algorithm 1 would not choose: more, admitted a candidate that does not "
            "raise tau*SPS(B)")


def _async_why(lines: tuple[DecisionLine, ...], n: int, found: tuple[int, ...],
               costs: CostTable) -> str:
    if n < 2:
        return (f"steps 0 and 1 have no confidences two steps earlier: dspark-async decides "
                f"them by Algorithm 1 (dspark) on their own confidences; step {n} did not")
    today = _confidences(lines[n])
    room = costs.tokens[-1] - len(today)
    budget = sum(found)
    expected_budget = min(capacity(_confidences(lines[n - 2]), costs), room)
    for source, label in ((n - 1, f"step {n - 1}"), (n, f"step {n}")):
        fresher = min(capacity(_confidences(lines[source]), costs), room)
        if budget == fresher != expected_budget:
            return (f"a budget from fresher confidences than §5.2 allows ({label} instead of "
                    f"{n - 2}): {budget} draft tokens is the capacity of {label}'s "
                    f"confidences; step {n - 2}'s gives K = {expected_budget}")
    if budget != expected_budget:
        return (f"a budget K other than §5.2's: {budget} draft tokens verified; the capacity of "
                f"step {n - 2}'s confidences is K = {expected_budget}")
    return (f"the budget K = {budget} is right but not spent on the step's {budget} "
            "candidates of highest survival")


def _plain_why(policy: Policy) -> str:
    if policy.name == "threshold":
        return (f"{policy} verifies the longest prefix whose confidences are each >= "
                f"{policy.parameter:g}")
    return f"{policy} verifies " + ("the whole block" if policy.name == "full" else
                                    "no draft token")


def check_decisions(decisions: Decisions, policy: Policy, costs: CostTable) -> SchedulerCheck:
    """Every line of ``decisions`` against ``policy`` (module docstring): the first
    difference, or none and the number of steps checked. SchedulingPolicyError (140) for a
    policy that needs confidences on a line without them, CostTableRangeError (142) for a
    step the cost table does not reach."""
    lines = decisions.lines
    for n, line in enumerate(lines):
        earlier = _confidences(lines[n - 2]) if n >= 2 else None
        expected = step_lengths(policy, line.requests, earlier, costs, step=line.step,
                                headless=decisions.headless)
        found = tuple(r.length for r in line.requests)
        if expected == found:
            continue
        i = next(k for k, (e, f) in enumerate(zip(expected, found)) if e != f)
        if policy.name == "dspark":
            why = _dspark_why(line, found, expected[i], found[i], costs)
        elif policy.name == "dspark-async":
            why = _async_why(lines, n, found, costs)
        else:
            why = _plain_why(policy)
        difference = Difference(step=line.step, request=line.requests[i].id, index=i,
                                expected=expected[i], found=found[i], why=why)
        return SchedulerCheck(policy=str(policy), recorded_policy=str(decisions.policy),
                              steps_checked=n + 1, first_difference=difference)
    return SchedulerCheck(policy=str(policy), recorded_policy=str(decisions.policy),
                          steps_checked=len(lines), first_difference=None)


def mismatch_error(check: SchedulerCheck, *, path: str | None = None
                   ) -> SchedulerMismatchError | None:
    """The one line of a check that failed (147); None when the decisions conform."""
    d = check.first_difference
    if d is None:
        return None
    label = "decisions" if path is None else f"decisions {path}"
    return SchedulerMismatchError(
        f"{label}: step {d.step}, request {d.request!r}: {check.policy} gives length "
        f"{d.expected}, the recording has {d.found}: {d.why}", path=path,
        field=f"step {d.step}.requests.{d.index}.length", expected=d.expected,
        found=d.found)
