"""The runtime in bfloat16 (`--dtype bfloat16`) on the golden drafter and target.

- temperature 0: the speculative output equals the target's own greedy output computed in
  bfloat16, for the golden drafter and for a deliberately broken one (any drafter is
  lossless; only acceptance moves), batched and stepwise; and stepwise on a random-weight
  model with flat logits, where batched verification's rounding can flip a near-tie
  (runtime/speculative.py ``verify_forward``): stepwise rows are the greedy rows, bit for bit;
- temperature 1: the accept / residual / bonus step fed with the bfloat16 models' own
  distributions commits tokens distributed as the target's (chi-square), and the sampled
  tau over seeds agrees with DeepSpec's float32 run;
- the bfloat16 run's agreement with DeepSpec's float32 trace is reported per run, not
  assumed, and a bfloat16 trace is enforced against a bfloat16 run.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

from support.paths import GOLDEN_TARGET as TARGET, REFERENCE_PROMPTS as PROMPTS, REFERENCE_TRACE as REFERENCE
from support.sampling import assert_reference_tau_within_our_spread
from support.tools import load_tool
from dspark_convert.errors import ReferenceDivergenceError
from dspark_convert.runtime.drafter import DSparkDrafter
from dspark_convert.runtime.sampling import probs_from_logits
from dspark_convert.runtime.qwen3 import KVCache, Qwen3Target
from dspark_convert.runtime.speculative import (
    speculative_generate,
    target_greedy,
    verify,
    verify_forward,
)
from dspark_convert.runtime.trace import load_reference
from dspark_convert.runtime.weights import load_drafter_weights
from dspark_convert.commands.smoke import run_smoke

CPU = torch.device("cpu")
BF16 = torch.bfloat16

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def bf16_models(converted):
    target = Qwen3Target(TARGET, device=CPU, dtype=BF16)
    weights = load_drafter_weights(converted["reference"], dtype=BF16)
    drafter = DSparkDrafter(weights, embed=target.embed, lm_head=target.lm_head, device=CPU)
    return target, drafter, weights


def test_weights_and_compute_are_bfloat16(bf16_models):
    target, drafter, weights = bf16_models
    assert {t.dtype for t in target.w.values()} == {BF16}
    assert {t.dtype for t in weights.tensors.values()} == {BF16}
    out = target.forward(torch.tensor(PROMPTS[0]), KVCache())
    assert out.logits.dtype == BF16 and out.hidden_states[1].dtype == BF16
    drafter.reset()
    drafter.add_context(drafter.features(out.hidden_states))
    proposal = drafter.propose(int(out.logits[-1].argmax()))
    assert proposal.block_hidden.dtype == BF16 and proposal.corrected_logits.dtype == BF16
    assert proposal.draft_probs(1.0).dtype == torch.float32      # sampled in float32


# Both verify modes on the first prompt in the fast loop; every combination in the full suite.
_GREEDY_CASES = [
    pytest.param(p, t, s, id=f"prompt{i}-{t}-{'stepwise' if s else 'batched'}",
                 marks=() if (i, t) == (0, 0.0) else pytest.mark.slow)
    for i, p in enumerate(PROMPTS) for t in (0.0, 0.5) for s in (False, True)]


@pytest.mark.parametrize("prompt, threshold, stepwise", _GREEDY_CASES)
def test_greedy_is_lossless_in_bfloat16(bf16_models, prompt, threshold, stepwise):
    target, drafter, _ = bf16_models
    stops = target.config.stop_token_ids
    run = speculative_generate(target, drafter, prompt, max_new_tokens=48,
                               confidence_threshold=threshold, stop_token_ids=stops,
                               stepwise_verify=stepwise)
    greedy = target_greedy(target, prompt, max_new_tokens=48, stop_token_ids=stops)
    assert run.output_ids == greedy.output_ids
    assert len(run.cycles) < run.new_tokens        # the drafter did get tokens accepted


def test_a_broken_drafter_is_still_lossless_in_bfloat16(bf16_models):
    """One matrix transposed (as test_smoke's broken artifact): fewer tokens accepted, the
    same output."""
    target, good, weights = bf16_models
    tensors = dict(weights.tensors)
    name = "layers.1.self_attn.o_proj.weight"
    tensors[name] = tensors[name].t().contiguous()
    broken = DSparkDrafter(replace(weights, tensors=tensors), embed=target.embed,
                           lm_head=target.lm_head, device=CPU)
    stops = target.config.stop_token_ids
    for prompt in PROMPTS:
        run = speculative_generate(target, broken, prompt, max_new_tokens=48, stop_token_ids=stops)
        ref = speculative_generate(target, good, prompt, max_new_tokens=48, stop_token_ids=stops)
        greedy = target_greedy(target, prompt, max_new_tokens=48, stop_token_ids=stops)
        assert run.output_ids == greedy.output_ids == ref.output_ids
        assert [c.proposed for c in run.cycles] != [c.proposed for c in ref.cycles]


@pytest.fixture(scope="module")
def flat_models(tmp_path_factory):
    """A random-weight target (H 256, 3 layers, V 8192) and drafter, in bfloat16: nearly
    flat logits, so near-ties at almost every position."""
    sparse_models = load_tool("bench/sparse_models.py", siblings=("make_checkpoint",))
    Geometry, make_random_pair = sparse_models.Geometry, sparse_models.make_random_pair

    from dspark_convert.commands.convert import convert

    g = Geometry("flat", hidden_size=256, intermediate_size=768, target_layers=3, heads=4,
                 kv_heads=2, head_dim=64, vocab_size=8192, tied_head=False, taps=(0, 1),
                 draft_layers=1, markov_rank=32, max_position_embeddings=4096,
                 mask_token_id=8191)
    root = tmp_path_factory.mktemp("flat")
    target_dir, drafter_dir = make_random_pair(g, root)
    convert(drafter_dir, root / "artifact")
    target = Qwen3Target(target_dir, device=CPU, dtype=BF16)
    drafter = DSparkDrafter(load_drafter_weights(root / "artifact", dtype=BF16),
                            embed=target.embed, lm_head=target.lm_head, device=CPU)
    return target, drafter


def test_stepwise_rows_are_the_greedy_rows_bit_for_bit(flat_models):
    """verify_forward(stepwise) computes each of the L+1 rows as a single-token forward
    does, with the same cache: the logits are equal, not close."""
    target, _ = flat_models
    prompt, block = [5, 17, 300, 4000], [9, 8000, 123, 77, 5, 6, 7, 1024]
    cache = KVCache()
    target.forward(torch.tensor(prompt), cache)
    rows = verify_forward(target, torch.tensor(block), cache, keep=None, stepwise=True)
    alone = KVCache()
    target.forward(torch.tensor(prompt), alone)
    singles = torch.cat([target.forward(torch.tensor([t]), alone).logits for t in block])
    assert torch.equal(rows.logits, singles)
    assert cache.length == alone.length == len(prompt) + len(block)


@pytest.mark.slow   # 96 tokens on a random 8192-vocabulary model, three prompts (~3 s each)
@pytest.mark.parametrize("prompt", [[1, 2, 3, 4, 5, 6, 7, 8], [100, 200, 300, 400],
                                    [5000, 17, 33, 8000, 12, 1]])
def test_stepwise_is_lossless_where_ties_abound(flat_models, prompt):
    """On flat logits, stepwise verification still reproduces the target's greedy output
    (measured here with batched verification: 2 of these 3 prompts diverge within 40
    tokens, which is why `smoke --dtype bfloat16` verifies stepwise by default)."""
    target, drafter = flat_models
    greedy = target_greedy(target, prompt, max_new_tokens=96)
    run = speculative_generate(target, drafter, prompt, max_new_tokens=96, stepwise_verify=True)
    assert run.output_ids == greedy.output_ids


def _chi_square_critical(df: int) -> float:
    """The chi-square quantile at p = 0.001 (Wilson-Hilferty; within 1% for df >= 3)."""
    z = 3.090
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Over the most likely tokens with an expected count >= 5, the rest pooled in a bin."""
    n = counts.sum()
    order = probs.argsort(descending=True)
    keep = [int(i) for i in order if probs[i] * n >= 5][:40]
    rest = [i for i in range(len(probs)) if i not in set(keep)]
    observed = torch.cat([counts[keep], counts[rest].sum().reshape(1)])
    expected = torch.cat([probs[keep], probs[rest].sum().reshape(1)]) * n
    return float(((observed - expected) ** 2 / expected).sum()), len(keep)


@pytest.mark.slow   # 4000 draft-and-verify draws
def test_sampling_is_lossless_with_the_bfloat16_distributions(bf16_models):
    """The verify step of docs/REFERENCE.md §2 with the distributions the bfloat16 models give on
    a golden prompt (q: the drafter's 7 rows, p: the target's 8 verify rows; bfloat16 logits
    widened to float32): drafting from q and verifying against p commits token 0 ~ p_0 and,
    when token 0 was an accepted draft, token 1 ~ p_1. Control: the same counts tested
    against q_0 fail, so the test can tell the two distributions apart."""
    target, drafter, _ = bf16_models
    cache = KVCache()
    out = target.forward(torch.tensor(PROMPTS[1]), cache)
    anchor = int(out.logits[-1].argmax())
    drafter.reset()
    drafter.add_context(drafter.features(out.hidden_states))
    gen = torch.Generator().manual_seed(2024)
    proposal = drafter.propose(anchor, temperature=1.0, generator=gen)
    draft = proposal.tokens.tolist()
    q = proposal.draft_probs(1.0)
    p = probs_from_logits(target.forward(torch.tensor([anchor, *draft]), cache).logits, 1.0)
    assert p.dtype == q.dtype == torch.float32 and p.shape == (8, 512) and q.shape == (7, 512)

    V, N = p.shape[1], 4000
    first, second = torch.zeros(V), torch.zeros(V)
    for _ in range(N):
        drafted = [int(torch.multinomial(q[i], 1, generator=gen)) for i in range(len(draft))]
        accepted, nxt, _ = verify(p, q, drafted, generator=gen)
        committed = drafted[:accepted] + [nxt]
        first[committed[0]] += 1
        if accepted >= 1:
            second[committed[1]] += 1
    stat, bins = _chi_square(first, p[0])
    assert stat < _chi_square_critical(bins), (stat, bins)
    assert second.sum() > 500
    stat, bins = _chi_square(second, p[1])
    assert stat < _chi_square_critical(bins), (stat, bins)
    control, bins = _chi_square(first, q[0])
    assert control > 3 * _chi_square_critical(bins), control


@pytest.mark.slow   # 20 seeds x the golden prompts
def test_temperature_one_tau_over_seeds_in_bfloat16(bf16_models):
    """DeepSpec's float32 run (one seed) lies within 3 standard deviations of our bfloat16
    per-seed tau distribution, as it does in float32 (test_runtime_speculative)."""
    target, drafter, _ = bf16_models
    assert_reference_tau_within_our_spread(target, drafter, PROMPTS, load_reference(REFERENCE))
    # The same seed gives the same run (the draws come from one CPU generator).
    runs = [speculative_generate(target, drafter, PROMPTS[0], max_new_tokens=24, temperature=1.0,
                                 stop_token_ids=target.config.stop_token_ids, seed=100)
            for _ in range(2)]
    assert runs[0].output_ids == runs[1].output_ids
    assert [(c.proposed, c.accepted, c.next_token) for c in runs[0].cycles] == \
        [(c.proposed, c.accepted, c.next_token) for c in runs[1].cycles]


def _leading_equal(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


@pytest.mark.slow   # two smoke runs (bfloat16, float32) per setting
@pytest.mark.parametrize("temperature, threshold, seed", [(0.0, 0.0, 0), (0.0, 0.5, 0), (1.0, 0.0, 7)])
def test_agreement_with_the_float32_trace_is_reported(converted, tmp_path, temperature,
                                                      threshold, seed):
    """A bfloat16 run against DeepSpec's float32 reference.json passes (the dtypes differ:
    compared, not enforced) and reports, per run, how far it agrees; the numbers match the
    outputs themselves. The float32 run of the same settings agrees completely."""
    refs = {r.index: r for r in load_reference(REFERENCE)}
    trace = tmp_path / "bf16.json"
    bf16 = run_smoke(converted["reference"], target=TARGET, max_new_tokens=24, device="cpu",
                     temperature=temperature, confidence_threshold=threshold, seed=seed,
                     dtype="bfloat16", reference=REFERENCE, trace=trace)
    assert bf16.dtype == "bfloat16" and bf16.memory.dtype == "bfloat16"
    assert bf16.lossless is (True if temperature == 0 else None)
    for run in bf16.runs:
        a = run.reference_agreement
        ref = refs[run.reference_run]
        assert a is not None and a.reference_dtype == "float32"
        P = len(run.prompt)
        assert a.new_tokens == len(ref.data["output_ids"]) - P
        assert a.new_tokens_identical == _leading_equal(run.output_ids[P:], ref.data["output_ids"][P:])
        assert a.cycles == len(ref.data["cycles"]) and 0 <= a.cycles_tokens_identical <= a.cycles
        assert (a.first_difference is None) == a.identical
        if not a.identical:
            assert a.first_difference.startswith(f"prompt {bf16.runs.index(run)} vs reference")
    f32 = run_smoke(converted["reference"], target=TARGET, max_new_tokens=24, device="cpu",
                    temperature=temperature, confidence_threshold=threshold, seed=seed,
                    reference=REFERENCE)
    for run in f32.runs:
        a = run.reference_agreement
        assert a.identical and a.cycles_tokens_identical == a.cycles
        assert a.new_tokens_identical == a.new_tokens and a.confidence_max_abs_difference < 2e-3

    # The bfloat16 trace records its dtype; against a bfloat16 run it is enforced.
    doc = json.loads(trace.read_text())
    assert doc["dtype"] == "bfloat16"
    again = run_smoke(converted["reference"], target=TARGET, max_new_tokens=24, device="cpu",
                      temperature=temperature, confidence_threshold=threshold, seed=seed,
                      dtype="bfloat16", reference=trace)
    assert all(r.reference_agreement.identical for r in again.runs)
    doc["runs"][0]["cycles"][0]["accepted"] += 1
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(doc))
    with pytest.raises(ReferenceDivergenceError, match=r"cycle 0: accepted differs"):
        run_smoke(converted["reference"], target=TARGET, max_new_tokens=24, device="cpu",
                  temperature=temperature, confidence_threshold=threshold, seed=seed,
                  dtype="bfloat16", reference=edited)
