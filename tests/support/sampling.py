"""The temperature-1 check both runtime dtypes share: DeepSpec's single-seed tau against the
spread of ours over 20 seeds (test_runtime_speculative in float32, test_runtime_bfloat16)."""

from __future__ import annotations

import statistics

SEEDS = range(100, 120)


def assert_reference_tau_within_our_spread(target, drafter, prompts, reference_runs,
                                           max_new_tokens: int = 24) -> None:
    """Our per-seed tau (mean accepted + 1 per verify step over ``prompts``) at temperature
    1: its spread is a sampling spread (0.1 < sd < 0.6), and the reference's temperature-1
    tau lies within 3 standard deviations of its mean."""
    from dspark_convert.runtime.speculative import speculative_generate

    per_seed = []
    for seed in SEEDS:
        steps = []
        for prompt in prompts:
            run = speculative_generate(target, drafter, prompt, max_new_tokens=max_new_tokens,
                                       temperature=1.0,
                                       stop_token_ids=target.config.stop_token_ids, seed=seed)
            steps += run.acceptance_lengths
        per_seed.append(sum(steps) / len(steps))
    ref_steps = [a for r in reference_runs if r.temperature == 1.0
                 for a in r.data["acceptance_lengths"]]
    ref_tau = sum(ref_steps) / len(ref_steps)
    mean, sd = statistics.mean(per_seed), statistics.stdev(per_seed)
    assert 0.1 < sd < 0.6, sd
    assert abs(ref_tau - mean) <= 3 * sd, (ref_tau, mean, sd)
