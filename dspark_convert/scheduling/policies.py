"""Verify-length policies: per verify step, how many draft tokens of each in-flight request
the target verifies (docs/REFERENCE.md §9; DSpark paper §3.2.2 Algorithm 1, §5.2, App. A).

A policy is a pure function of what the scheduler may see (``StepView``: per request the
confidences c_1..c_gamma of its drafted block, as the scheduler has them; never a token or
a target verdict) and the target's cost table, to per-request lengths (``Decision``). Every
policy here is lossless: whether request r's draft token j is verified never depends on
that token, i.e. on c[r][j+1..] (the confidence head reads the previous token's Markov
feature, so c[r][j+1] is a function of token j).

- ``full``: the whole block. ``target-only``: nothing (every l_r = 0).
- ``threshold=X``: the static cutoff, the longest prefix whose confidences are each >= X
  (``static_cutoff``: the same rule the runtime's drafter and ``dspark eval``'s calibration
  cut at).
- ``dspark``: Algorithm 1. Survival a[r][j] = c[r][1]···c[r][j]; a step with lengths l_r
  sends B = Σ(1 + l_r) tokens and expects τ = Σ(1 + a[r][1] + … + a[r][l_r]) accepted; Θ =
  τ·SPS(B). Candidates (r, j) with a > 0 in order of a, descending (ties: request, then
  position; a is non-increasing in j, so each request's admissions are a prefix); from all
  l_r = 0, admit in order while Θ rises and stop at the first candidate that does not raise
  it. The stop is what keeps it lossless: it fires before any later position is looked at.
- ``dspark-async``: §5.2. The capacity K is the best count of draft tokens found on the
  confidences of two verify steps earlier by a search over every B (no stop: those
  confidences cannot leak today's tokens); today's K candidates of highest survival are
  admitted. The stale budget is the causal barrier.

``retrospective_search_not_lossless`` is that search without the stop on today's
confidences: NOT a policy (it is in no table; Appendix A shows it skews the output), kept as
the tests' negative control.

A step never grows past the cost table's largest entry: no policy that looks at costs
admits a token that would take B beyond it (an engine has no graph of that size); a step
whose R tokens alone exceed it is refused (CostTableRangeError).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from dspark_convert.errors import SchedulingPolicyError
from dspark_convert.scheduling.cost_table import CostTable

# Per request (in request order), its confidences c_1..c_gamma.
Confidences = tuple[tuple[float, ...], ...]


def static_cutoff(confidences: Sequence[float], threshold: float) -> int:
    """The static cutoff (docs/REFERENCE.md §2, DeepSpec's): the first position k (from 0)
    whose step confidence is below ``threshold``, else the whole block; a threshold <= 0 is
    the cutoff off (the whole block)."""
    if threshold <= 0.0:
        return len(confidences)
    for k, c in enumerate(confidences):
        if c < threshold:
            return k
    return len(confidences)


def _checked(confidences: object, field: str) -> Confidences:
    """``confidences`` as a tuple of tuples of floats in [0, 1] (NaN refused), at least one
    request; SchedulingPolicyError naming the first bad entry."""
    try:
        rows = [tuple(block) for block in confidences]   # type: ignore[union-attr]
    except TypeError:
        raise SchedulingPolicyError(f"{field}: expected one sequence of confidences per request",
                                    field=field) from None
    if not rows:
        raise SchedulingPolicyError(f"{field}: expected at least one request, found none",
                                    field=field, expected=">= 1 request", found="0")
    for r, row in enumerate(rows):
        for j, c in enumerate(row, 1):
            if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0.0 <= c <= 1.0:
                where = f"{field}[{r}][{j}]"
                raise SchedulingPolicyError(f"{where}: expected a confidence in [0, 1], found {c!r}",
                                            field=where, expected="0..1", found=repr(c))
    return tuple(tuple(float(c) for c in row) for row in rows)


@dataclass(frozen=True)
class StepView:
    """What a policy may see of one verify step, and nothing else: per in-flight request (in
    request order) the confidences c_1..c_gamma of its drafted block as the scheduler has
    them (calibrated where a calibration is applied). ``two_steps_ago``: the same, of the
    step two verify steps earlier (dspark-async's budget; its requests may differ)."""

    confidences: Confidences
    two_steps_ago: Confidences | None = None

    def __post_init__(self):
        object.__setattr__(self, "confidences", _checked(self.confidences, "confidences"))
        if self.two_steps_ago is not None:
            object.__setattr__(self, "two_steps_ago",
                               _checked(self.two_steps_ago, "two_steps_ago"))


@dataclass(frozen=True)
class Decision:
    """Per request (in request order) how many of its draft tokens the step verifies."""

    lengths: tuple[int, ...]

    @property
    def batch_tokens(self) -> int:
        """B = Σ(1 + l_r): each request's anchor (or bonus position) and its draft tokens."""
        return sum(1 + length for length in self.lengths)


def survival(confidences: Confidences) -> Confidences:
    """a[r][j] = c[r][1]···c[r][j], per request."""
    return tuple(tuple(math.prod(row[:j]) for j in range(1, len(row) + 1)) for row in confidences)


def expected_accepted(confidences: Confidences, lengths: Sequence[int]) -> float:
    """τ = Σ_r (1 + a[r][1] + … + a[r][l_r])."""
    return sum(1.0 + sum(a[:length]) for a, length in zip(survival(confidences), lengths))


def candidates(confidences: Confidences) -> list[tuple[float, int, int]]:
    """Every (a, r, j) with a[r][j] > 0 (j from 1), by a descending, then r, then j."""
    out = [(a, r, j) for r, row in enumerate(survival(confidences))
           for j, a in enumerate(row, 1) if a > 0.0]
    out.sort(key=lambda item: (-item[0], item[1], item[2]))
    return out


def _lengths(requests: int, admitted: Sequence[tuple[float, int, int]]) -> Decision:
    lengths = [0] * requests
    for _, r, j in admitted:
        lengths[r] = max(lengths[r], j)
    return Decision(tuple(lengths))


def full(view: StepView) -> Decision:
    """The whole block of every request."""
    return Decision(tuple(len(row) for row in view.confidences))


def target_only(view: StepView) -> Decision:
    """No draft token: the target decodes alone (one token per request per step)."""
    return Decision((0,) * len(view.confidences))


def threshold(view: StepView, cutoff: float) -> Decision:
    """Each request's longest prefix whose confidences are each >= ``cutoff``."""
    return Decision(tuple(static_cutoff(row, cutoff) for row in view.confidences))


def dspark(view: StepView, costs: CostTable) -> Decision:
    """Algorithm 1: admit candidates by survival while Θ = τ·SPS(B) rises; stop at the first
    that does not raise it (or that would take B past the cost table)."""
    conf = view.confidences
    batch = len(conf)
    tau = float(batch)
    best = tau * costs.steps_per_second_at(batch)
    admitted = []
    for a, r, j in candidates(conf):
        if batch + 1 > costs.tokens[-1]:
            break
        theta = (tau + a) * costs.steps_per_second_at(batch + 1)
        if not theta > best:
            break                      # the stop: nothing after this candidate is looked at
        batch, tau, best = batch + 1, tau + a, theta
        admitted.append((a, r, j))
    return _lengths(len(conf), admitted)


def _search_without_stop(conf: Confidences, costs: CostTable) -> tuple[list, int]:
    """(the candidates, the count n of them whose admission in order maximises Θ over every
    B the cost table covers; ties to the smaller n)."""
    order = candidates(conf)
    batch = len(conf)
    tau = float(batch)
    best, best_n = tau * costs.steps_per_second_at(batch), 0
    for n, (a, _, _) in enumerate(order, 1):
        if batch + 1 > costs.tokens[-1]:
            break
        batch, tau = batch + 1, tau + a
        theta = tau * costs.steps_per_second_at(batch)
        if theta > best:
            best, best_n = theta, n
    return order, best_n


def capacity(two_steps_ago: Confidences, costs: CostTable) -> int:
    """§5.2's budget K: how many draft tokens the search without the stop admits on the
    confidences of two steps earlier."""
    return _search_without_stop(two_steps_ago, costs)[1]


def dspark_async(view: StepView, costs: CostTable) -> Decision:
    """§5.2: today's K candidates of highest survival, K = ``capacity`` of the step two
    verify steps earlier (fewer where today has fewer candidates, or the table less room)."""
    if view.two_steps_ago is None:
        raise SchedulingPolicyError("dspark-async: expected the confidences of the step two "
                                    "verify steps earlier (StepView.two_steps_ago), found none",
                                    field="two_steps_ago", expected="confidences", found="nothing")
    conf = view.confidences
    costs.steps_per_second_at(len(conf))      # a step of R tokens the table must cover
    room = costs.tokens[-1] - len(conf)
    budget = min(capacity(view.two_steps_ago, costs), room)
    return _lengths(len(conf), candidates(conf)[:budget])


def retrospective_search_not_lossless(view: StepView, costs: CostTable) -> Decision:
    """NOT A POLICY: Algorithm 1 without the stop (the best Θ over every B on today's
    confidences). Whether token j is verified then depends on c[r][j+1..], a function of
    token j itself: Appendix A's first token comes out (0.85, 0.15) where the target says
    (0.7, 0.3). Only the tests call it, as the negative control."""
    order, best_n = _search_without_stop(view.confidences, costs)
    return _lengths(len(view.confidences), order[:best_n])


# --- the table of policies ------------------------------------------------------------------

@dataclass(frozen=True)
class PolicyKind:
    """One row of POLICIES: how the policy decides and what parameter it takes."""

    decide: Callable[[StepView, CostTable, float | None], Decision]
    parameter: str | None          # what its =VALUE is, in words; None: it takes none
    summary: str


POLICIES: dict[str, PolicyKind] = {
    "full": PolicyKind(lambda view, costs, _: full(view), None, "the whole block"),
    "threshold": PolicyKind(lambda view, costs, x: threshold(view, x), "a confidence in [0, 1]",
                            "the longest prefix whose confidences are each >= X"),
    "dspark": PolicyKind(lambda view, costs, _: dspark(view, costs), None,
                         "Algorithm 1: by survival while tau*SPS(B) rises, stop at the first that does not"),
    "dspark-async": PolicyKind(lambda view, costs, _: dspark_async(view, costs), None,
                               "the K most probable, K from the confidences of two steps earlier"),
    "target-only": PolicyKind(lambda view, costs, _: target_only(view), None, "no draft token"),
}

_NUMBER_CHARS = frozenset("0123456789.eE+-")
_MAX_SPEC = 64


@dataclass(frozen=True)
class Policy:
    """A policy from POLICIES with its parameter (``threshold=0.6``)."""

    name: str
    parameter: float | None = None

    def __post_init__(self):
        kind = POLICIES.get(self.name)
        value = self.parameter
        if kind is None or (kind.parameter is None) != (value is None) or (
                value is not None and not (isinstance(value, float) and 0.0 <= value <= 1.0)):
            raise SchedulingPolicyError(f"policy {self.name!r} with parameter {self.parameter!r}: "
                                        f"expected a policy of POLICIES (parse_policy)",
                                        field="policy", found=repr(self.name))

    def decide(self, view: StepView, costs: CostTable) -> Decision:
        return POLICIES[self.name].decide(view, costs, self.parameter)

    def __str__(self) -> str:
        return self.name if self.parameter is None else f"{self.name}={self.parameter:g}"


def parse_policy(spec: str) -> Policy:
    """``NAME`` or ``NAME=VALUE`` as a Policy; SchedulingPolicyError (one line) for a name
    not in POLICIES, a parameter missing, not wanted, not a plain decimal or out of range."""
    names = ", ".join(n + ("=X" if k.parameter else "") for n, k in POLICIES.items())
    shown = repr(spec if len(spec) <= _MAX_SPEC else spec[:_MAX_SPEC] + "...")
    name, has_value, value = spec.partition("=")
    kind = POLICIES.get(name)
    if kind is None:
        raise SchedulingPolicyError(f"policy {shown}: expected one of {names}", field="policy",
                                    expected=names, found=shown)
    if kind.parameter is None:
        if has_value:
            raise SchedulingPolicyError(f"policy {shown}: {name} takes no parameter",
                                        field="policy", expected=name, found=shown)
        return Policy(name)
    if not has_value:
        raise SchedulingPolicyError(f"policy {shown}: expected {name}=X, X {kind.parameter}",
                                    field="policy", expected=f"{name}=X", found=shown)
    number = None
    # float() alone would take " 0.6", "1_0", "nan" and "inf": only a plain decimal is a value.
    if value and len(value) <= _MAX_SPEC and set(value) <= _NUMBER_CHARS:
        try:
            number = float(value)
        except ValueError:
            number = None
    if number is None or not (math.isfinite(number) and 0.0 <= number <= 1.0):
        # A decimal comma ("0,5") is told the decimal point, as the CLI's numbers are, when
        # the value it meant is one the policy takes.
        comma = (len(value) <= _MAX_SPEC and value.count(",") == 1
                 and value.replace(",", "", 1).isdigit() and not value.endswith(",")
                 and 0.0 <= float(value.replace(",", ".")) <= 1.0)
        hint = f": write {name}={value.replace(',', '.')}" if comma else ""
        raise SchedulingPolicyError(f"policy {shown}: expected {name}=X, X {kind.parameter}"
                                    f"{hint}", field="policy", expected=kind.parameter,
                                    found=shown)
    return Policy(name, number)
