"""Verify-length policies (docs/REFERENCE.md §9, docs/SCHEDULING.md): the table and its
refusals, Algorithm 1 against an independent brute force, dspark-async's budget, and the two
facts that make a policy shippable: it sees only confidences, and whether it verifies draft
token j never depends on that token (c[r][j+1..]), so the output keeps the target's
distribution. Appendix A's case shows both, exactly and by sampling with the runtime's own
accept/reject rule; the retrospective search (no stop) is the negative control that fails."""

from __future__ import annotations

import dataclasses
import inspect
import math
from fractions import Fraction
from statistics import NormalDist

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from support.fuzz import fuzz_settings

from dspark_convert.errors import CostTableRangeError, SchedulingPolicyError
from dspark_convert.scheduling import policies
from dspark_convert.scheduling.cost_table import CostTable
from dspark_convert.scheduling.policies import (
    POLICIES,
    Decision,
    Policy,
    StepView,
    capacity,
    dspark,
    dspark_async,
    expected_accepted,
    parse_policy,
    retrospective_search_not_lossless,
)

SHIPPED = ["full", "threshold=0.5", "threshold=0.85", "dspark", "dspark-async", "target-only"]


def costs(sps, tokens=None) -> CostTable:
    tokens = tuple(tokens or range(1, len(sps) + 1))
    return CostTable(tokens=tokens, steps_per_second=tuple(sps), device="test", dtype="-",
                     threads=1, versions={})


# --- the table and what it refuses ------------------------------------------------------------

def test_table_names_every_policy_and_parses_them():
    assert list(POLICIES) == ["full", "threshold", "dspark", "dspark-async", "target-only"]
    assert parse_policy("threshold=0.6") == Policy("threshold", 0.6)
    assert parse_policy("threshold=1") == Policy("threshold", 1.0)
    assert [str(parse_policy(s)) for s in SHIPPED] == SHIPPED


BAD_SPECS = ["", "Full", "dspark_async", "threshold", "threshold=", "full=1", "dspark=0.5",
             "threshold=nan", "threshold=inf", "threshold=-0.1", "threshold=1.5",
             "threshold= 0.5", "threshold=0.5\n", "threshold=1_0", "threshold=0x1",
             "threshold=1e999", "threshold=0.5=1", "x" * 10_000]


@pytest.mark.parametrize("spec", BAD_SPECS)
def test_misspelt_policy_or_bad_parameter_is_one_line(spec):
    with pytest.raises(SchedulingPolicyError) as info:
        parse_policy(spec)
    err = info.value
    assert err.exit_code == 140 and "\n" not in err.message and len(err.message) < 300
    assert err.message.startswith("policy ")


def test_a_decimal_comma_is_told_the_decimal_point():
    with pytest.raises(SchedulingPolicyError) as info:
        parse_policy("threshold=0,5")
    assert info.value.message.endswith(": write threshold=0.5")
    for spec in ("threshold=1,5,0", "threshold=0,", "threshold=a,b", "threshold=1,5"):
        with pytest.raises(SchedulingPolicyError) as info:
            parse_policy(spec)
        assert "write" not in info.value.message, spec


def test_a_policy_made_by_hand_is_checked_too():
    for name, parameter in [("dspark2", None), ("threshold", None), ("full", 0.5),
                            ("threshold", 1.5), ("threshold", float("nan")), ("threshold", "0.5")]:
        with pytest.raises(SchedulingPolicyError):
            Policy(name, parameter)


@pytest.mark.parametrize("confidences,where", [
    (((0.5, float("nan")),), "confidences[0][2]"),
    (((1.5,),), "confidences[0][1]"),
    (((0.5,), (-0.1,)), "confidences[1][1]"),
    (((True,),), "confidences[0][1]"),
    ((("0.5",),), "confidences[0][1]"),
    ((), "confidences: expected at least one request"),
    ((0.5,), "confidences: expected one sequence"),
])
def test_confidences_a_policy_cannot_take_are_refused(confidences, where):
    with pytest.raises(SchedulingPolicyError) as info:
        StepView(confidences)
    assert info.value.message.startswith(where) and info.value.exit_code == 140


def test_dspark_async_without_its_stale_confidences_is_refused():
    with pytest.raises(SchedulingPolicyError, match="two_steps_ago"):
        parse_policy("dspark-async").decide(StepView(((0.9,),)), costs([1.0, 1.0]))


def test_a_step_larger_than_the_cost_table_is_refused():
    """R requests alone take R tokens: a table that stops below R cannot cost the step."""
    with pytest.raises(CostTableRangeError):
        dspark(StepView(((0.9,),) * 3), costs([1.0, 1.0]))


# --- what a policy may see --------------------------------------------------------------------

def test_a_policy_sees_only_confidences():
    """StepView holds the confidences (and dspark-async's stale ones) and nothing else; no
    policy function takes a token, a draft or a target verdict."""
    assert [f.name for f in dataclasses.fields(StepView)] == ["confidences", "two_steps_ago"]
    for fn in (policies.full, policies.threshold, dspark, dspark_async, policies.target_only):
        assert set(inspect.signature(fn).parameters) <= {"view", "costs", "cutoff"}, fn
    assert [f.name for f in dataclasses.fields(Decision)] == ["lengths"]


def test_threshold_is_the_static_cutoff():
    """The longest prefix with every confidence >= X (equal is kept); X = 0 is the block."""
    view = StepView(((0.9, 0.6, 0.95), (0.59, 1.0), ()))
    assert policies.threshold(view, 0.6).lengths == (3, 0, 0)
    assert policies.threshold(view, 0.0).lengths == (3, 2, 0)
    assert policies.threshold(view, 0.91).lengths == (0, 0, 0)


# --- Algorithm 1 and dspark-async against independent references ------------------------------

def brute_force_algorithm_1(conf, table: CostTable) -> tuple[int, ...]:
    """Admit, one at a time, the remaining (r, j) of greatest survival (ties: smaller r, then
    smaller j) while tau*SPS(B) strictly rises and B stays in the table."""
    remaining = {}
    for r, row in enumerate(conf):
        a = 1.0
        for j, c in enumerate(row, 1):
            a *= c
            if a > 0:
                remaining[(r, j)] = a
    lengths = [0] * len(conf)
    batch, tau = len(conf), float(len(conf))
    best = tau * table.steps_per_second_at(batch)
    while remaining:
        key = min(remaining, key=lambda k: (-remaining[k], k))
        a = remaining.pop(key)
        if batch + 1 > table.tokens[-1]:
            break
        theta = (tau + a) * table.steps_per_second_at(batch + 1)
        if theta <= best:
            break
        batch, tau, best = batch + 1, tau + a, theta
        lengths[key[0]] = key[1]
    return tuple(lengths)


# Ties and extremes on purpose: 0 (nothing after it survives), 1 (equal survivals).
confidence = st.sampled_from([0.0, 0.25, 0.5, 0.8, 0.9, 1.0]) | st.floats(0.0, 1.0)
blocks = st.lists(st.lists(confidence, max_size=6).map(tuple), min_size=1, max_size=4).map(tuple)


@st.composite
def tables_for(draw, conf):
    """A cost table that covers R tokens, sometimes less than every draft token, with gaps."""
    requests = len(conf)
    most = requests + sum(len(row) for row in conf)
    largest = draw(st.integers(requests, max(requests, most)))
    inner = draw(st.sets(st.integers(1, largest - 1), max_size=8)) if largest > 1 else set()
    tokens = sorted(inner | {largest})
    rates = draw(st.lists(st.floats(0.01, 100.0), min_size=len(tokens), max_size=len(tokens)))
    return costs(rates, tokens)


@fuzz_settings(400)
@given(st.data(), blocks)
def test_dspark_is_algorithm_1(data, conf):
    table = data.draw(tables_for(conf))
    view = StepView(conf)
    lengths = dspark(view, table).lengths
    assert lengths == brute_force_algorithm_1(conf, table)
    for row, length in zip(conf, lengths):
        assert 0 <= length <= len(row) and math.prod(row[:length]) > 0 or length == 0
    theta = expected_accepted(view.confidences, lengths) * table.steps_per_second_at(sum(lengths) + len(conf))
    theta_zero = len(conf) * table.steps_per_second_at(len(conf))
    assert theta >= theta_zero * (1 - 1e-12)


def brute_force_capacity(conf, table: CostTable) -> int:
    """The count n (smallest on ties) of survival-ordered candidates maximising tau*SPS(B)."""
    survivals = sorted(((-math.prod(row[:j]), r, j) for r, row in enumerate(conf)
                        for j in range(1, len(row) + 1) if math.prod(row[:j]) > 0))
    room = table.tokens[-1] - len(conf)
    tau, thetas = float(len(conf)), [len(conf) * table.steps_per_second_at(len(conf))]
    for n, (s, _, _) in enumerate(survivals[:room], 1):
        tau -= s
        thetas.append(tau * table.steps_per_second_at(len(conf) + n))
    return thetas.index(max(thetas))


@fuzz_settings(400)
@given(st.data(), blocks, blocks)
def test_dspark_async_admits_its_budget_by_todays_survival(data, today, stale):
    table = data.draw(tables_for(today if len(today) >= len(stale) else stale))
    assume(table.tokens[-1] >= max(len(today), len(stale)))
    k = capacity(StepView(stale).confidences, table)
    assert k == brute_force_capacity(stale, table)
    lengths = dspark_async(StepView(today, two_steps_ago=stale), table).lengths
    available = sum(1 for row in today for j in range(1, len(row) + 1) if math.prod(row[:j]) > 0)
    admitted = min(k, available, table.tokens[-1] - len(today))
    assert sum(lengths) == admitted
    # the admitted are the `admitted` highest survivals of today (ties by request, position)
    order = sorted((-math.prod(row[:j]), r, j) for r, row in enumerate(today)
                   for j in range(1, len(row) + 1) if math.prod(row[:j]) > 0)
    expected = [0] * len(today)
    for _, r, j in order[:admitted]:
        expected[r] = max(expected[r], j)
    assert lengths == tuple(expected)


# --- causality: token j's verification never depends on c[r][j+1..] --------------------------

def decide(name: str, view: StepView, table: CostTable) -> tuple[int, ...]:
    if name == "retrospective":
        return retrospective_search_not_lossless(view, table).lengths
    return parse_policy(name).decide(view, table).lengths


def leaks(name, conf, stale, table, changed) -> list[str]:
    """Each (r, j) whose admission changes when c[r][j+1..] is replaced by ``changed``."""
    base = decide(name, StepView(conf, two_steps_ago=stale), table)
    out = []
    for r, row in enumerate(conf):
        for j in range(0, len(row)):
            edited = list(conf)
            edited[r] = row[:j] + tuple(changed[:len(row) - j])
            after = decide(name, StepView(tuple(edited), two_steps_ago=stale), table)
            if (after[r] >= j) != (base[r] >= j):
                out.append(f"request {r} token {j}: {base} -> {after}")
    return out


@fuzz_settings(200)
@given(st.data(), blocks, blocks, st.lists(confidence, min_size=6, max_size=6))
def test_no_shipped_policy_reads_past_the_token_it_decides(data, conf, stale, changed):
    """Replacing the confidences after position j (functions of token j and later) never
    changes whether token j is verified, for every shipped policy."""
    table = data.draw(tables_for(conf if len(conf) >= len(stale) else stale))
    assume(table.tokens[-1] >= max(len(conf), len(stale)))
    for name in SHIPPED:
        assert leaks(name, conf, stale, table, changed) == [], name


# --- Appendix A: the counterexample, exactly and by sampling ----------------------------------

APPENDIX_A = costs([1.0, 0.5, 0.45])             # SPS(1), SPS(2), SPS(3)
TARGET = (Fraction(7, 10), Fraction(3, 10))      # p over two tokens
DRAFT = (Fraction(1, 2), Fraction(1, 2))         # q
A1 = 0.8


def c2_after(token: int) -> float:
    """The confidence of position 2 is a function of token 1 (its Markov feature)."""
    return 0.9 if token == 0 else 0.0


def appendix_view(x1: int, stale_x1: int) -> StepView:
    return StepView(((A1, c2_after(x1)),), two_steps_ago=((A1, c2_after(stale_x1)),))


def test_appendix_a_numbers():
    """Θ0 = 1.0, Θ1 = 0.9; Θ2 = 1.134 when c2 = 0.9 and 0.81 when c2 = 0."""
    def theta(c2, length):
        return expected_accepted(((A1, c2),), [length]) * APPENDIX_A.steps_per_second_at(1 + length)
    assert theta(0.9, 0) == 1.0 and math.isclose(theta(0.9, 1), 0.9)
    assert math.isclose(theta(0.9, 2), 1.134) and math.isclose(theta(0.0, 2), 0.81)
    assert dspark(appendix_view(0, 0), APPENDIX_A).lengths == (0,)       # stops at Θ1 < Θ0
    assert retrospective_search_not_lossless(appendix_view(0, 0), APPENDIX_A).lengths == (2,)
    assert retrospective_search_not_lossless(appendix_view(1, 0), APPENDIX_A).lengths == (0,)
    assert leaks("retrospective", ((A1, 0.0),), None, APPENDIX_A, [0.9] * 6) != []


def exact_first_token(name: str) -> tuple[Fraction, Fraction]:
    """The committed first token's distribution: every (stale token, x1) enumerated with
    its probability, the speculative rule (accept x1 with min(1, p/q), else the residual
    norm(max(p - q, 0)); nothing drafted: p) applied exactly."""
    residual = [max(p - q, Fraction(0)) for p, q in zip(TARGET, DRAFT)]
    residual = [r / sum(residual) for r in residual]
    out = [Fraction(0), Fraction(0)]
    for stale_x1 in (0, 1):
        for x1 in (0, 1):
            weight = DRAFT[stale_x1] * DRAFT[x1]
            if decide(name, appendix_view(x1, stale_x1), APPENDIX_A)[0] == 0:
                dist = list(TARGET)
            else:
                accept = min(Fraction(1), TARGET[x1] / DRAFT[x1])
                dist = [accept * (t == x1) + (1 - accept) * residual[t] for t in (0, 1)]
            out = [o + weight * d for o, d in zip(out, dist)]
    return tuple(out)


@pytest.mark.parametrize("name", SHIPPED)
def test_appendix_a_exact_first_token_is_the_targets(name):
    assert exact_first_token(name) == TARGET


def test_appendix_a_exact_retrospective_search_skews_it():
    assert exact_first_token("retrospective") == (Fraction(17, 20), Fraction(3, 20))   # 0.85


# The sampled test: a two-sided exact binomial test of P(first token = 0) = 0.7 at ALPHA,
# with N the smallest sample giving power >= POWER against 0.85 (computed, not guessed).
ALPHA, POWER, P0, P1 = 1e-3, 0.999, 0.7, 0.85


def _pmf(n: int, p: float) -> list[float]:
    return [math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
                     + k * math.log(p) + (n - k) * math.log1p(-p)) for k in range(n + 1)]


def binomial_p_value(k: int, n: int, p: float) -> float:
    """Two-sided exact: the mass of every count no more likely than k under p."""
    pmf = _pmf(n, p)
    return min(1.0, sum(x for x in pmf if x <= pmf[k] * (1 + 1e-7)))


def power(n: int) -> float:
    pmf0, pmf1 = _pmf(n, P0), _pmf(n, P1)
    order = sorted(range(n + 1), key=lambda k: pmf0[k])
    reject, mass = [], 0.0
    for k in order:                     # the least likely counts under P0 first
        mass += pmf0[k]
        if mass >= ALPHA:
            break
        reject.append(k)
    return sum(pmf1[k] for k in reject)


def sample_size() -> int:
    z = NormalDist().inv_cdf
    n = math.ceil(((z(1 - ALPHA / 2) * math.sqrt(P0 * (1 - P0)) + z(POWER) * math.sqrt(P1 * (1 - P1)))
                   / (P1 - P0)) ** 2)   # the normal approximation, then exact from there
    while power(n) < POWER:
        n += 1
    return n


def test_sample_size_has_the_stated_power():
    n = sample_size()
    assert power(n) >= POWER and 250 < n < 600, n


def sampled_first_tokens(name: str, n: int, seed: int) -> int:
    """How many of n simulated Appendix A steps commit token 0 first: x1 ~ q, c2 from x1,
    the policy's length, then the runtime's own verify (accept/reject and residual)."""
    import torch

    from dspark_convert.runtime.speculative import verify

    g = torch.Generator().manual_seed(seed)
    p = torch.tensor([[float(t) for t in TARGET], [0.5, 0.5], [0.5, 0.5]], dtype=torch.float64)
    q = torch.tensor([[float(d) for d in DRAFT], [0.5, 0.5]], dtype=torch.float64)
    zeros = 0
    for _ in range(n):
        stale_x1, x1, x2 = (int(torch.multinomial(q[0], 1, generator=g)) for _ in range(3))
        length = decide(name, appendix_view(x1, stale_x1), APPENDIX_A)[0]
        draft = [x1, x2][:length]
        accepted, next_token, _ = verify(p[:length + 1], q[:length] if length else None, draft,
                                         generator=g)
        zeros += (draft[0] if accepted else next_token) == 0
    return zeros


@pytest.mark.parametrize("name", SHIPPED)
def test_appendix_a_sampled_first_token_is_the_targets(name):
    n = sample_size()
    zeros = sampled_first_tokens(name, n, seed=20261204)
    assert binomial_p_value(zeros, n, P0) >= ALPHA, (zeros, n)


def test_appendix_a_sampled_retrospective_search_fails_the_same_test():
    n = sample_size()
    zeros = sampled_first_tokens("retrospective", n, seed=20261204)
    assert binomial_p_value(zeros, n, P0) < ALPHA, (zeros, n)
