"""evaluation/metrics.py: acceptance numbers and DeepSpec's confidence-head metrics.

The confidence metrics are checked against a second, deliberately plain computation of
DeepSpec's definitions (deepspec/eval/dspark/confidence_head.py: cumulative product of the
float32 sigmoids in float64, clamp, 20 coarse bins for ECE and reliability, 1000 fine bins
for AUROC with ties one half, Brier, means): Python loops over (prediction, label) pairs,
AUROC by comparing every positive with every negative (tests/support/confidence.py). On
hand-made cycles whose numbers
are worked out by hand, and on DeepSeek's own cycles in the golden reference.json.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import torch

from support.paths import REFERENCE_TRACE as REFERENCE
from support.confidence import assert_same_metrics, plain_metrics
from dspark_convert.evaluation.metrics import (
    MemoryProbe,
    acceptance,
    confidence_data,
    confidence_report,
    ece_sampling_floor,
    effective_length,
    position_metrics,
    rank_auroc,
    spread,
)

STOPS = (2,)


# --- hand-made cycles ---------------------------------------------------------------------

LN3 = math.log(3.0)
HAND = [  # (proposed, accepted, confidence logits), block 2
    ([5, 6], 2, [0.0, 0.0]),        # P = 0.5, 0.25; labels 1, 1
    ([5, 6], 0, [0.0, 0.0]),        # P = 0.5, 0.25; labels 0, 0
    ([5, 6], 1, [LN3, 0.0]),        # P = 0.75, 0.375; labels 1, 0
    ([], 0, None),                  # L = 0 (a threshold cut everything): not observed
]


def test_hand_made_cycles_worked_out_by_hand():
    rep = confidence_report(confidence_data(HAND, block_size=2, stop_token_ids=STOPS), temperature=0.0)
    p0, p1 = rep.per_position
    assert rep.proposals == 3 and p0.total_weight == p1.total_weight == 3.0
    # position 0: bins 10 {0.5: 1, 0.5: 0} and 15 {0.75: 1}
    assert p0.ece == pytest.approx(0.25 / 3, abs=1e-6)
    assert p0.auc == pytest.approx(0.75)                    # (tie 1/2 + win 1) / 2 pairs
    assert p0.brier == pytest.approx((0.25 + 0.25 + 0.0625) / 3, abs=1e-6)
    assert p0.pred_mean == pytest.approx(1.75 / 3, abs=1e-6) and p0.target_mean == pytest.approx(2 / 3)
    assert [b.bin for b in p0.reliability] == [10, 15]
    # position 1: bins 5 {0.25: 1, 0.25: 0} and 7 {0.375: 0}
    assert p1.ece == pytest.approx((2 * 0.25 + 0.375) / 3, abs=1e-6)
    assert p1.auc == pytest.approx(0.25)                    # (tie 1/2 + loss 0) / 2 pairs
    assert p1.brier == pytest.approx((0.5625 + 0.0625 + 0.140625) / 3, abs=1e-6)
    # DeepSpec's summary: means weighted by total_weight
    assert rep.summary.ece_mean == pytest.approx((p0.ece + p1.ece) / 2)
    assert_same_metrics(rep.per_position, plain_metrics(HAND, 2, STOPS))


def test_stop_token_cuts_the_proposal_and_empty_positions_have_no_numbers():
    steps = [([7, 2, 9], 2, [1.0, 1.0, 1.0]),   # an accepted stop at 1: L = 2, both labels 1
             ([7, 8, 9], 3, [2.0, 2.0, 2.0])]   # all accepted: every label 1
    assert effective_length([7, 2, 9], 2, STOPS) == 2
    assert effective_length([7, 2, 9], 1, STOPS) == 3        # the stop was not accepted
    data = confidence_data(steps, block_size=4, stop_token_ids=STOPS)
    assert list(data.lengths) == [2, 3]
    rep = confidence_report(data, temperature=0.0)
    w = [e.total_weight for e in rep.per_position]
    assert w == [2.0, 2.0, 1.0, 0.0]
    assert rep.per_position[0].auc is None                   # no negative: undefined
    last = rep.per_position[3]
    assert last.ece is None and last.brier is None and last.reliability == []
    assert_same_metrics(rep.per_position, plain_metrics(steps, 4, STOPS))


def test_clamp_and_extreme_logits():
    steps = [([1, 1, 1], 3, [40.0, 40.0, 40.0]), ([1, 1, 1], 0, [-40.0, -40.0, -40.0]),
             ([1, 1, 1], 1, [0.3, -2.0, 5.0])]
    rep = confidence_report(confidence_data(steps, block_size=3, stop_token_ids=STOPS), temperature=0.0)
    for e in rep.per_position:
        for b in e.reliability:
            assert 1e-8 <= b.avg_pred <= 1 - 1e-8
    assert_same_metrics(rep.per_position, plain_metrics(steps, 3, STOPS))


def test_random_cycles_against_the_plain_computation():
    rng = np.random.Generator(np.random.PCG64(3))
    steps = []
    for _ in range(300):
        L = int(rng.integers(0, 8))
        proposed = [int(t) for t in rng.integers(3, 50, L)]
        accepted = int(rng.integers(0, L + 1))
        if L and rng.random() < 0.1 and accepted:
            proposed[accepted - 1] = 2                       # an accepted stop token
        steps.append((proposed, accepted, [float(v) for v in rng.normal(0.5, 2.0, L)]))
    temps = [0.7, 1.3, 2.0, 0.5, 1.0, 3.0, 0.9]
    data = confidence_data(steps, block_size=7, stop_token_ids=STOPS)
    assert_same_metrics(confidence_report(data, temperature=1.0).per_position, plain_metrics(steps, 7, STOPS))
    assert_same_metrics(confidence_report(data, temperature=1.0, temperatures=temps).per_position,
                 plain_metrics(steps, 7, STOPS, temps))


@pytest.mark.parametrize("run_index", [0, 2, 3, 5])
def test_deepspec_cycles_from_the_golden_reference(run_index):
    """DeepSeek's own threshold-0 cycles (temperature 0 and 1, both prompts)."""
    run = json.loads(REFERENCE.read_text())["runs"][run_index]
    assert run["confidence_threshold"] == 0.0
    steps = [(c["proposed"], c["accepted"], c["confidence_logits"]) for c in run["cycles"]]
    rep = confidence_report(confidence_data(steps, block_size=7, stop_token_ids=STOPS),
                            temperature=run["temperature"])
    assert rep.proposals == len(run["cycles"])
    assert_same_metrics(rep.per_position, plain_metrics(steps, 7, STOPS))


def test_all_golden_cycles_together():
    runs = [r for r in json.loads(REFERENCE.read_text())["runs"] if r["confidence_threshold"] == 0.0]
    steps = [(c["proposed"], c["accepted"], c["confidence_logits"]) for r in runs for c in r["cycles"]]
    rep = confidence_report(confidence_data(steps, block_size=7, stop_token_ids=STOPS), temperature=0.0)
    assert [e.total_weight for e in rep.per_position] == [float(len(steps))] * 7
    assert_same_metrics(rep.per_position, plain_metrics(steps, 7, STOPS))


def test_a_step_with_drafts_must_carry_its_logits():
    with pytest.raises(ValueError):
        confidence_data([([1, 2], 0, None)], block_size=2, stop_token_ids=STOPS)


# --- acceptance ---------------------------------------------------------------------------

def test_acceptance_numbers_by_hand():
    # a run with a threshold: L = 3, 1, 0, 2 (the last ends at an accepted stop)
    steps = [([4, 5, 6], 2), ([4], 0), ([], 0), ([9, 2], 2)]
    lengths = [3, 1, 1, 2]                   # accepted+1, and accepted alone at the stop
    a = acceptance(steps, lengths, block_size=3, stop_token_ids=STOPS)
    assert a.verify_steps == 4 and a.tau == pytest.approx(7 / 4)
    assert a.accepted_per_verify == pytest.approx(4 / 4)
    assert a.mean_verified_length == pytest.approx(6 / 4)
    assert a.acceptance_rate_verified == pytest.approx(4 / 6)
    assert a.verify_rate == pytest.approx(7 / (6 + 4))      # DeepSpec's verify_rate
    # conditional: position 0 proposed in 3 steps, accepted in 2; 1: 2 and 2; 2: 1 and 0
    assert a.acceptance_by_position == [pytest.approx(2 / 3), 1.0, 0.0]
    assert a.acceptance_by_position_cumulative == [0.5, 0.5, 0.0]
    # given the prefix: position 0 reached (L > 0) 3 times, accepted 2; position 1 reached
    # (accepted >= 1 and L > 1) twice, accepted twice; position 2 reached once ([4, 5, 6]
    # with 2 accepted), rejected there
    assert a.acceptance_by_position_given_prefix == [pytest.approx(2 / 3), 1.0, 0.0]


def test_given_the_prefix_differs_from_the_conditional_rate_when_nothing_is_cut():
    # the cutoff off: every step proposes the whole block of 3
    steps = [([4, 5, 6], 0), ([4, 5, 6], 1), ([4, 5, 6], 3)]
    a = acceptance(steps, [1, 2, 4], block_size=3, stop_token_ids=STOPS)
    assert a.acceptance_by_position == a.acceptance_by_position_cumulative == \
        [pytest.approx(2 / 3), pytest.approx(1 / 3), pytest.approx(1 / 3)]
    # position 1 is reached in the 2 steps that accepted position 0, and accepted in 1 of
    # them; position 2 is reached once and accepted
    assert a.acceptance_by_position_given_prefix == [pytest.approx(2 / 3), 0.5, 1.0]


def test_empty_run():
    a = acceptance([], [], block_size=2, stop_token_ids=STOPS)
    assert a.tau is None and a.acceptance_by_position == [None, None]


def test_spread_and_rank_auroc():
    s = spread([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s.median == 3.0 and s.p90 == pytest.approx(4.0 + 0.6 * 96.0) and s.count == 5
    assert spread([]) is None
    rng = np.random.Generator(np.random.PCG64(0))
    scores = np.round(rng.random(200), 2)                   # many ties
    labels = rng.random(200) < 0.4
    pos, neg = scores[labels], scores[~labels]
    want = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in pos for b in neg) / (len(pos) * len(neg))
    assert rank_auroc(scores, labels) == pytest.approx(want, abs=1e-12)  # exact arithmetic
    assert rank_auroc(scores, np.ones(200, dtype=bool)) is None


def test_ece_sampling_floor_is_what_a_calibrated_head_shows():
    """Labels drawn from the predictions themselves: the mean ECE over many draws is the
    floor (normal approximation; within 10% at 300 samples)."""
    rng = np.random.Generator(np.random.PCG64(11))
    p = np.clip(rng.beta(2.0, 3.0, 300), 1e-8, 1 - 1e-8)
    eces = [position_metrics(p, (rng.random(300) < p).astype(np.float64), 0).ece for _ in range(400)]
    assert float(np.mean(eces)) == pytest.approx(ece_sampling_floor(p), rel=0.1)
    assert ece_sampling_floor(np.zeros(0)) is None


# --- peak memory --------------------------------------------------------------------------

@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="Linux /proc only")
def test_cpu_peak_is_per_run():
    """A 96 MiB allocation inside a measured run shows; the next run, after it is freed,
    does not carry it (the high-water mark was reset)."""
    probe = MemoryProbe(torch.device("cpu"))
    probe.start()
    block = torch.ones(96 * 2 ** 20 // 8, dtype=torch.float64)
    block += 1
    first = probe.stop()
    del block
    probe = MemoryProbe(torch.device("cpu"))
    probe.start()
    second = probe.stop()
    assert first.kind == "process_peak_rss" and "clear_refs" in first.note
    assert first.bytes - first.before_bytes >= 90 * 2 ** 20
    assert second.bytes < first.bytes - 60 * 2 ** 20
