"""runtime/speculative.py: the loop against DeepSpec's own traces, and losslessness.

- temperature 0, confidence threshold 0 and 0.5: every cycle (proposed, accepted,
  next_token, confidence_logits) identical to reference.json, output equal to the target's.
- temperature 1: our random draws follow DeepSpec's order, so seed 7 reproduces the golden
  runs cycle by cycle. Over 20 other seeds the reference's tau (one seed, one sample) must
  lie within 3 standard deviations of our per-seed tau distribution (measured: mean 2.12,
  sd 0.27, reference 2.32).
- the accept/residual/bonus step on a 5-token vocabulary: the committed tokens follow the
  target's distribution (chi-square, fixed seed).
"""

from __future__ import annotations

import json

import pytest
import torch

from support.paths import REFERENCE_TRACE as REFERENCE
from support.sampling import assert_reference_tau_within_our_spread
from dspark_convert.runtime.speculative import speculative_generate, target_greedy, verify
from dspark_convert.runtime.trace import compare_run, load_reference, run_to_json


pytestmark = pytest.mark.usefixtures("one_torch_thread")

REF_RUNS = load_reference(REFERENCE)


@pytest.mark.parametrize("ref", REF_RUNS, ids=lambda r: f"run{r.index}-T{r.temperature:g}-thr{r.confidence_threshold:g}")
def test_trace_identical_to_deepspec(golden_models, ref):
    target, drafter = golden_models
    seed = 7 if ref.temperature > 0 else None
    run = speculative_generate(target, drafter, list(ref.prompt), max_new_tokens=24,
                               temperature=ref.temperature, confidence_threshold=ref.confidence_threshold,
                               stop_token_ids=target.config.stop_token_ids, seed=seed)
    compare_run(run_to_json(run, max_new_tokens=24, target_greedy=None), ref, label="run",
                path=str(REFERENCE))
    if ref.temperature == 0:
        greedy = target_greedy(target, list(ref.prompt), max_new_tokens=24,
                               stop_token_ids=target.config.stop_token_ids)
        assert list(greedy.output_ids) == ref.data["target_greedy"] == list(run.output_ids)


@pytest.mark.slow   # 20 seeds x the golden prompts
def test_temperature_one_tau_over_seeds(golden_models):
    target, drafter = golden_models
    prompts = json.loads(REFERENCE.read_text())["prompts"]
    assert_reference_tau_within_our_spread(target, drafter, prompts, REF_RUNS)


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.slow   # 6000 draft-and-verify draws
def test_rejection_sampling_is_lossless_on_a_tiny_vocabulary():
    """Draft from q, verify against p: committed token 0 ~ p_0, and committed token 1
    (when token 0 was the accepted draft) ~ p_1. 4 degrees of freedom: chi-square < 18.5
    (p = 0.001) holds for the right algorithm and fails for any biased one (accepting
    without the ratio, or resampling from p instead of the residual, gives > 1000)."""
    gen = torch.Generator().manual_seed(1234)
    V, L, N = 5, 3, 6000
    # Dirichlet(1) rows, drawn from the seeded generator: normalised exponentials.
    p = -torch.log(torch.rand(L + 1, V, generator=gen))
    q = -torch.log(torch.rand(L, V, generator=gen))
    p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    first, second = torch.zeros(V), torch.zeros(V)
    for _ in range(N):
        draft = [int(torch.multinomial(q[i], 1, generator=gen)) for i in range(L)]
        accepted, nxt, _ = verify(p, q, draft, generator=gen)
        committed = draft[:accepted] + [nxt]
        first[committed[0]] += 1
        if accepted >= 1:
            second[committed[1]] += 1
    assert _chi_square(first, p[0]) < 18.5
    assert second.sum() > 1500 and _chi_square(second, p[1]) < 18.5


def test_greedy_verify_accepts_while_argmax_matches():
    p = torch.eye(6)[[3, 1, 4, 1, 5]]            # target argmax 3 1 4 1 5 (one-hot, temperature 0)
    assert verify(p, p[:4], [3, 1, 4, 1]) == (4, 5, False)
    assert verify(p, p[:4], [3, 1, 2, 1]) == (2, 4, False)
    assert verify(p, None, []) == (0, 3, False)
    assert verify(p, p[:4], [3, 1, 4, 1], stop_token_ids=(1,)) == (2, 4, True)


@pytest.mark.parametrize("stop", [490, 23])
def test_stop_tokens_end_both_the_same_way(golden_models, stop):
    """A stop token (accepted as a draft token or committed as a correction) ends the
    output right after it, exactly where the target alone stops."""
    target, drafter = golden_models
    for prompt in json.loads(REFERENCE.read_text())["prompts"]:
        run = speculative_generate(target, drafter, prompt, max_new_tokens=24, stop_token_ids=(stop,))
        greedy = target_greedy(target, prompt, max_new_tokens=24, stop_token_ids=(stop,))
        assert run.output_ids == greedy.output_ids
        if stop in greedy.output_ids[len(prompt):]:
            assert run.output_ids[-1] == stop


def test_cycles_carry_their_timing_but_the_trace_does_not(golden_models):
    """Each cycle's draft_seconds (proposal + context update) and verify_seconds (the
    target's verify forward), for `dspark eval`; the reference.json format is unchanged:
    run_to_json writes exactly the keys it wrote before, so traces stay byte-stable."""
    target, drafter = golden_models
    ref = REF_RUNS[0]
    run = speculative_generate(target, drafter, list(ref.prompt), max_new_tokens=24,
                               stop_token_ids=target.config.stop_token_ids)
    assert run.cycles and all(c.draft_seconds > 0 and c.verify_seconds > 0 for c in run.cycles)
    # The run's drafter time is the cycles' plus the first context cells (in the prefill).
    cycle_draft = sum(c.draft_seconds for c in run.cycles)
    assert cycle_draft <= run.draft_seconds <= cycle_draft + run.prefill_seconds
    assert cycle_draft + sum(c.verify_seconds for c in run.cycles) + run.prefill_seconds \
        <= run.total_seconds
    doc = run_to_json(run, max_new_tokens=24, target_greedy=None)
    assert set(doc) == {"prompt", "output_ids", "acceptance_lengths", "cycles", "temperature",
                        "confidence_threshold", "max_new_tokens"}
    assert all(set(c) == {"proposed", "accepted", "next_token", "confidence_logits"}
               for c in doc["cycles"])
    compare_run(doc, ref, label="run", path=str(REFERENCE))
