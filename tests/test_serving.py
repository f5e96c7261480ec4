"""runtime/serving.py: batched serving is the batch-1 loop, R at a time.

- greedy: at concurrency 1, 4 and 16, under every policy and for both families, each
  request's output is token for token what the target alone generates on its prompt
  ("batched matches singletons"); a DFlash drafter (no confidence head) under `full`;
- every recorded step's lengths are what its policy gives on the confidences it records
  (Algorithm 1 for dspark; §5.2's stale budget for dspark-async) and the cost table;
- a packed forward is each segment's own forward: a segment's output does not change when
  another segment's tokens do (no request sees another's), and equals its forward alone;
- sampled: a request's draws are its own, so under a policy that does not look at its
  neighbours its output is the same at every concurrency; under dspark the committed
  tokens follow the target's exact distribution (chi-square, power stated);
- what serve refuses: a dspark policy without a cost table or on a drafter without a
  confidence head.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from support.gemma4 import GEMMA4_DRAFTERS, GEMMA4_TARGET
from support.paths import GOLDEN_TARGET, TRAINED_DRAFTERS

from dspark_convert.errors import SchedulingPolicyError
from dspark_convert.runtime import gemma4 as G
from dspark_convert.runtime.drafter import DSparkDrafter
from dspark_convert.runtime.qwen3 import KVCache, Qwen3Target
from dspark_convert.runtime.serving import Request, request_seed, serve
from dspark_convert.runtime.speculative import speculative_generate, target_greedy
from dspark_convert.runtime.weights import load_drafter_weights
from dspark_convert.scheduling.cost_table import CostTable
from dspark_convert.scheduling.policies import Policy, StepView, parse_policy

CPU = torch.device("cpu")
POLICIES = ("full", "threshold=0.6", "dspark", "dspark-async", "target-only")
CONCURRENCY = (1, 4, 16)
NEW_TOKENS = 20

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def staircase(largest: int = 512) -> CostTable:
    """A cost table of a GPU's shape (flat up to a graph size, then a step down): with it
    Algorithm 1 admits some candidates and stops at others, so that its decisions are
    neither all nor nothing."""
    tokens = tuple(range(1, largest + 1))
    rates = tuple(100.0 / (1 + (b - 1) // 24) ** 0.7 for b in tokens)
    return CostTable(tokens=tokens, steps_per_second=rates, device="a staircase, as a GPU's",
                     dtype="float32", threads=1, versions={})


def requests(vocab: int, n: int = 16, seed: int = 0) -> list[Request]:
    rng = random.Random(seed)
    return [Request(id=f"p{i}", prompt=tuple(rng.randrange(vocab) for _ in range(rng.randrange(3, 12))),
                    max_new_tokens=NEW_TOKENS) for i in range(n)]


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    from dspark_convert.commands.convert import convert

    root = tmp_path_factory.mktemp("serving")
    target = Qwen3Target(GOLDEN_TARGET, device=CPU)
    drafters = {}
    for name, src in TRAINED_DRAFTERS.items():
        convert(src, root / name)
        drafters[name] = DSparkDrafter(load_drafter_weights(root / name), embed=target.embed,
                                       lm_head=target.lm_head, device=CPU)
    return target, drafters


@pytest.fixture(scope="module")
def gemma4(tmp_path_factory):
    from dspark_convert.commands.convert import convert

    root = tmp_path_factory.mktemp("serving-gemma4")
    target = G.Gemma4Target(GEMMA4_TARGET, device=CPU)
    name = "gemma4_vanilla_conf_markov"
    convert(GEMMA4_DRAFTERS[name], root / name, target=GEMMA4_TARGET)
    drafter = G.Gemma4Drafter(load_drafter_weights(root / name), embed=target.embed,
                              lm_head=target.lm_head, device=CPU)
    return target, drafter


def greedy_outputs(target, reqs):
    stops = target.config.stop_token_ids
    return {r.id: target_greedy(target, list(r.prompt), max_new_tokens=r.max_new_tokens,
                                stop_token_ids=stops).output_ids[len(r.prompt):] for r in reqs}


def assert_decisions_are_the_policys(result, policy: Policy, costs: CostTable):
    """Every step's lengths are what the policy gives on the confidences the step records
    (dspark-async: its first two steps by Algorithm 1, then the budget of two steps back)."""
    seen = []
    for step in result.steps:
        conf = tuple(part.confidence for part in step.requests)
        if policy.name == "target-only":
            want = (0,) * len(conf)
        elif policy.name == "dspark-async" and len(seen) < 2:
            want = Policy("dspark").decide(StepView(conf), costs).lengths
        else:
            stale = seen[-2] if policy.name == "dspark-async" else None
            want = policy.decide(StepView(conf, two_steps_ago=stale), costs).lengths
        assert tuple(p.length for p in step.requests) == want, (policy, step.step)
        assert step.batch_tokens == sum(1 + n for n in want)
        assert all(0 <= p.accepted <= p.length for p in step.requests)
        seen.append(conf)


@pytest.mark.parametrize("spec", POLICIES)
def test_qwen3_batched_greedy_matches_the_target_alone(qwen3, spec):
    target, drafters = qwen3
    drafter = drafters["vanilla_conf_markov"]
    reqs = requests(target.config.vocab_size)
    want = greedy_outputs(target, reqs)
    costs, policy = staircase(), parse_policy(spec)
    lengths = set()
    for concurrency in CONCURRENCY:
        result = serve(target, drafter, reqs, concurrency=concurrency, policy=policy,
                       costs=costs, stop_token_ids=target.config.stop_token_ids)
        assert {r.id: r.output_ids for r in result.requests} == want, (spec, concurrency)
        assert max(len(s.requests) for s in result.steps) == concurrency
        assert_decisions_are_the_policys(result, policy, costs)
        lengths |= {p.length for s in result.steps for p in s.requests}
    if spec in ("dspark", "dspark-async", "threshold=0.6"):
        # Decisions that are neither the whole block nor nothing: the test exercises them.
        assert len(lengths) >= 3, lengths


def test_dflash_drafter_under_full_matches_the_target_alone(qwen3):
    target, drafters = qwen3
    reqs = requests(target.config.vocab_size, n=8, seed=1)
    want = greedy_outputs(target, reqs)
    for concurrency in (1, 4):
        result = serve(target, drafters["dflash_shared"], reqs, concurrency=concurrency,
                       policy=parse_policy("full"), stop_token_ids=target.config.stop_token_ids)
        assert {r.id: r.output_ids for r in result.requests} == want
        assert all(p.confidence == () for s in result.steps for p in s.requests)


@pytest.mark.slow   # the Gemma4 target is larger: 5 policies x 3 concurrencies
@pytest.mark.parametrize("spec", POLICIES)
def test_gemma4_batched_greedy_matches_the_target_alone(gemma4, spec):
    target, drafter = gemma4
    reqs = requests(target.config.text.vocab_size, n=16, seed=2)
    want = greedy_outputs(target, reqs)
    costs, policy = staircase(), parse_policy(spec)
    for concurrency in CONCURRENCY:
        result = serve(target, drafter, reqs, concurrency=concurrency, policy=policy,
                       costs=costs, stop_token_ids=target.config.stop_token_ids)
        assert {r.id: r.output_ids for r in result.requests} == want, (spec, concurrency)
        assert_decisions_are_the_policys(result, policy, costs)


def test_continuous_batching_joins_as_requests_leave(qwen3):
    """Requests of different lengths: a finished request's place is taken by the next
    prompt at the next step, so the batch stays full while prompts wait."""
    target, drafters = qwen3
    reqs = [Request(id=f"r{i}", prompt=(7, 9, 11 + i), max_new_tokens=n)
            for i, n in enumerate((3, 17, 5, 30, 2, 9))]
    result = serve(target, drafters["vanilla_conf_markov"], reqs, concurrency=3,
                   policy=parse_policy("full"), stop_token_ids=())
    by_id = {r.id: r for r in result.requests}
    assert [len(by_id[q.id].output_ids) for q in reqs] == [3, 17, 5, 30, 2, 9]
    waiting = len(reqs)
    for step in result.steps:
        ids = [p.id for p in step.requests]
        started = sum(1 for q in reqs if by_id[q.id].joined_seconds <= step.end_seconds)
        assert len(ids) == min(3, len([q for q in reqs[:started]
                                       if by_id[q.id].finished_seconds >= step.end_seconds]))
        waiting = min(waiting, len(reqs) - started)
    assert waiting == 0
    # Join order is the prompts' order; each request's tokens are committed in time order.
    assert [r.joined_seconds for r in result.requests] == sorted(r.joined_seconds for r in result.requests)
    for r in result.requests:
        assert list(r.token_seconds) == sorted(r.token_seconds)
        assert r.first_token_seconds <= r.finished_seconds


def test_a_packed_segment_sees_only_its_own_cache(qwen3):
    """Three requests in one forward: each segment's logits and hidden states are those of
    its forward alone (to float32 GEMM rounding), and changing another segment's tokens
    changes nothing of it, bit for bit."""
    target, _ = qwen3
    prompts = [torch.tensor(p) for p in ([5, 6, 7, 8], [100, 3], [42, 43, 44, 45, 46, 47])]
    news = [torch.tensor(n) for n in ([9, 10, 11], [200], [48, 49])]

    def caches():
        out = []
        for p in prompts:
            c = KVCache()
            target.forward(p, c)
            out.append(c)
        return out

    packed = target.forward_packed(list(zip(news, caches())))
    for n, c, got in zip(news, caches(), packed):
        alone = target.forward(n, c)
        torch.testing.assert_close(got.logits, alone.logits, rtol=1e-5, atol=1e-5)
        for a, b in zip(got.hidden_states, alone.hidden_states):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    changed = [news[0], torch.tensor([311]), torch.tensor([1, 2])]
    other = target.forward_packed(list(zip(changed, caches())))
    assert torch.equal(other[0].logits, packed[0].logits)
    assert not torch.equal(other[2].logits, packed[2].logits)


def test_packed_drafter_blocks_see_only_their_own_context(qwen3):
    target, drafters = qwen3
    base = drafters["vanilla_conf_markov"]
    contexts = ([1, 2, 3, 4], [50, 60], [7, 8, 9, 10, 11])

    def forks():
        out = []
        for ids in contexts:
            d = base.fork()
            hs = target.forward(torch.tensor(ids), KVCache()).hidden_states
            d.add_context(d.features(hs))
            out.append(d)
        return out

    packed = base.block_hidden_packed([3, 4, 5], forks())
    for d, anchor, got in zip(forks(), [3, 4, 5], packed):
        torch.testing.assert_close(got, d.block_hidden(anchor), rtol=1e-5, atol=1e-5)
    assert torch.equal(base.block_hidden_packed([3, 99, 5], forks())[0], packed[0])
    assert base.length == 0            # forks have contexts of their own


def test_sampled_requests_draw_their_own_numbers(qwen3):
    """Under full and threshold (lengths that do not depend on neighbours) a request's
    sampled output is the same at every concurrency; at concurrency 1 under full it is the
    batch-1 loop's with the request's seed, up to where the end of max_new_tokens caps a
    block (the batch-1 loop verifies the whole block there and cuts afterwards)."""
    target, drafters = qwen3
    drafter = drafters["vanilla_conf_markov"]
    reqs = requests(target.config.vocab_size, n=8, seed=3)
    stops = target.config.stop_token_ids
    for spec in ("full", "threshold=0.5"):
        outs = [[r.output_ids for r in serve(target, drafter, reqs, concurrency=c,
                                             policy=parse_policy(spec), temperature=1.0,
                                             seed=11, stop_token_ids=stops).requests]
                for c in CONCURRENCY]
        assert outs[0] == outs[1] == outs[2], spec
    one = serve(target, drafter, reqs, concurrency=1, policy=parse_policy("full"),
                temperature=1.0, seed=11, stop_token_ids=stops)
    for q, got in zip(reqs, one.requests):
        alone = speculative_generate(target, drafter, list(q.prompt), max_new_tokens=NEW_TOKENS,
                                     temperature=1.0, seed=request_seed(11, q.id),
                                     stop_token_ids=stops).output_ids[len(q.prompt):]
        block = drafter.block_size
        assert got.output_ids[: NEW_TOKENS - block] == alone[: NEW_TOKENS - block]


# A sampled check through the whole loop: the second new token of a fixed prompt, served
# under dspark at concurrency 16 (each request a sample), against the target's exact
# marginal p2(t) = sum_x p(x | prompt) p(t | prompt, x). Three new tokens: the first step
# verifies up to 2 draft tokens, so that Algorithm 1 sees c_2 (computed from the first
# draft token) when it decides about that token. Chi-square over the K most probable
# tokens and the rest; its power against a 0.15 shift of the top token's mass (Appendix
# A's size) at N samples is computed in tests/test_scheduling_policies.py.
SAMPLES = 1600
TOP = 6


def exact_second_token(target, prompt: list[int], temperature: float) -> torch.Tensor:
    out = target.forward(torch.tensor(prompt), KVCache(), last_logits_only=True)
    p1 = torch.softmax(out.logits[-1].double() / temperature, -1)
    p2 = torch.zeros_like(p1)
    for x in range(p1.numel()):
        if p1[x] < 1e-9:
            continue
        nxt = target.forward(torch.tensor(prompt + [x]), KVCache(), last_logits_only=True)
        p2 += p1[x] * torch.softmax(nxt.logits[-1].double() / temperature, -1)
    return p2


@pytest.mark.slow   # 1600 sampled requests and 512 target forwards
def test_sampled_dspark_commits_the_targets_distribution(qwen3):
    target, drafters = qwen3
    drafter = drafters["vanilla_conf_markov"]
    prompt, temperature = [2, 17, 33, 90], 1.0
    p2 = exact_second_token(target, prompt, temperature)
    counts = torch.zeros_like(p2)
    for batch in range(SAMPLES // 16):
        reqs = [Request(id=f"s{batch}-{i}", prompt=tuple(prompt), max_new_tokens=3)
                for i in range(16)]
        result = serve(target, drafter, reqs, concurrency=16, policy=parse_policy("dspark"),
                       costs=staircase(), temperature=temperature, seed=5, stop_token_ids=())
        for r in result.requests:
            counts[r.output_ids[1]] += 1
    top = torch.argsort(p2, descending=True)[:TOP]
    rest = torch.ones_like(p2, dtype=torch.bool)
    rest[top] = False
    observed = torch.cat([counts[top], counts[rest].sum()[None]])
    expected = torch.cat([p2[top], p2[rest].sum()[None]]) * SAMPLES
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    # TOP degrees of freedom (TOP + 1 bins): chi-square < 22.46 is p = 0.001 for 6.
    assert chi2 < 22.46, (chi2, observed.tolist(), expected.tolist())


def test_what_serve_refuses(qwen3):
    target, drafters = qwen3
    reqs = requests(target.config.vocab_size, n=2)
    with pytest.raises(SchedulingPolicyError, match="cost table"):
        serve(target, drafters["vanilla_conf_markov"], reqs, concurrency=2,
              policy=parse_policy("dspark"))
    with pytest.raises(SchedulingPolicyError, match="no confidence head"):
        serve(target, drafters["dflash_shared"], reqs, concurrency=2,
              policy=parse_policy("threshold=0.5"))
    with pytest.raises(SchedulingPolicyError, match="expected a drafter"):
        serve(target, None, reqs, concurrency=2, policy=parse_policy("full"))
    assert math.isfinite(serve(target, None, reqs, concurrency=2,
                               policy=parse_policy("target-only")).total_seconds)
