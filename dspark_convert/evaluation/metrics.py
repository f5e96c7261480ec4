"""What `dspark eval` measures in a run, and DeepSpec's confidence-head metrics.

Acceptance (per run, over every verify step of every prompt; docs/REFERENCE.md §2, DeepSpec's
``BaseEvaluator.build_metrics_row`` in deepspec/eval/base_evaluator.py):

- tau: mean of accepted+1 per verify step (accepted alone at a step ended by an accepted
  stop token), exactly what ``RunResult.acceptance_lengths`` and ``smoke --trace`` record;
- accepted draft tokens per verifier pass: mean of ``accepted``;
- L, the effective proposal length of a step: the draft tokens sent to the target, cut
  after an accepted stop token as DeepSpec's ``verify_draft_tokens`` cuts it
  (``effective_proposal_length``); mean verified length = mean L (DeepSpec's
  ``draft_tokens_per_proposal``; the target also runs the anchor, L+1 positions);
- acceptance by draft position k, conditional: P(accepted > k | L > k) (DeepSpec's
  ``accept_rates_by_position``); cumulative: P(accepted > k) over every step; given the
  prefix: P(accepted > k | accepted >= k, L > k), the chance that position k is accepted
  once every position before it was (with the cutoff off, L is the whole block and the
  conditional rate equals the cumulative one: this is the row that shows where a drafter
  loses the thread);
- acceptance rate of verified tokens: sum accepted / sum L; DeepSpec's ``verify_rate``,
  sum(accepted+1) / sum(L+1), is reported beside it.

Confidence metrics: DeepSpec's ``ConfidenceHeadRecorder.observe`` and
``PerPositionConfidenceMetrics.update/compute/_auroc_from_hist`` and
``summarize_confidence_row`` (deepspec/eval/dspark/confidence_head.py, the float64
version docs/REFERENCE.md §7 describes), re-derived, not copied. Per verify step with L > 0:
step probabilities sigmoid(cl_k) in the logits' dtype (float32), their cumulative product
P_k = prod_{i<=k} in float64 over k < L, each P_k clamped to [1e-8, 1-1e-8], against the
label "positions 0..k all accepted" (k < accepted). Per position: 20 equal-width bins of
P (index floor(20 P), clamped) give ECE = sum over bins |mean P - mean label| x count /
total and the reliability bins; 1000 bins split into positives and negatives give AUROC =
(sum_b pos_b x neg_{<b} + 1/2 sum_b pos_b x neg_b) / (npos x nneg), ties counting one half;
Brier = mean (P - label)^2; pred_mean and target_mean. A position never observed gets
total_weight 0, no numbers (null where DeepSpec writes NaN) and no reliability bins.
DeepSpec records them only when the threshold is 0 (``Qwen3DSparkEvaluator``), so
eval computes them from the threshold-0 runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict

COARSE_BINS = 20        # DeepSpec's CONFIDENCE_NUM_BINS (deepspec/eval/dspark/evaluator.py)
FINE_BINS = 1000        # CONFIDENCE_NUM_FINE_BINS
EPS_PROB = 1e-8         # confidence_head.py EPS_PROB


# --- per-step acceptance ------------------------------------------------------------------

def effective_length(proposed: Sequence[int], accepted: int, stop_token_ids: Sequence[int]) -> int:
    """L: the proposal, cut after an accepted stop token. The runtime already cut
    ``accepted`` there (``verify``), so an accepted stop is the last accepted token."""
    if accepted > 0 and proposed[accepted - 1] in stop_token_ids:
        return accepted
    return len(proposed)


class Spread(BaseModel):
    """Median and 90th percentile (numpy's linear interpolation) of per-step times."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    median: float
    p90: float
    count: int


def spread(values: Sequence[float]) -> Spread | None:
    if not values:
        return None
    arr = np.asarray(values, dtype=np.float64)
    return Spread(median=float(np.median(arr)), p90=float(np.percentile(arr, 90)), count=len(values))


class Acceptance(BaseModel):
    """The acceptance numbers of one run (see the module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    verify_steps: int
    tau: float | None
    accepted_per_verify: float | None
    mean_verified_length: float | None
    acceptance_rate_verified: float | None
    verify_rate: float | None
    acceptance_by_position: list[float | None]
    acceptance_by_position_cumulative: list[float | None]
    acceptance_by_position_given_prefix: list[float | None]


def acceptance(steps: Sequence[tuple[Sequence[int], int]], acceptance_lengths: Sequence[int], *,
               block_size: int, stop_token_ids: Sequence[int]) -> Acceptance:
    """``steps``: (proposed, accepted) per verify step; ``acceptance_lengths``: the run's."""
    n = len(steps)
    lengths = [effective_length(p, a, stop_token_ids) for p, a in steps]
    accepted = [a for _, a in steps]
    proposed_at = [sum(L > k for L in lengths) for k in range(block_size)]
    accepted_at = [sum(a > k for a in accepted) for k in range(block_size)]
    reached_at = [sum(a >= k and L > k for a, L in zip(accepted, lengths)) for k in range(block_size)]
    total_l, total_a = sum(lengths), sum(accepted)
    return Acceptance(
        verify_steps=n,
        tau=sum(acceptance_lengths) / n if n else None,
        accepted_per_verify=total_a / n if n else None,
        mean_verified_length=total_l / n if n else None,
        acceptance_rate_verified=total_a / total_l if total_l else None,
        verify_rate=sum(acceptance_lengths) / (total_l + n) if n else None,
        acceptance_by_position=[accepted_at[k] / proposed_at[k] if proposed_at[k] else None
                                for k in range(block_size)],
        acceptance_by_position_cumulative=[accepted_at[k] / n if n else None
                                           for k in range(block_size)],
        acceptance_by_position_given_prefix=[accepted_at[k] / reached_at[k] if reached_at[k]
                                             else None for k in range(block_size)])


def token_latencies(steps: Sequence[tuple[float, int]]) -> list[float]:
    """Latency per committed token, amortised over each verify step's commit, as
    `serve-bench` counts it (evaluation/serve_bench.per_token_latencies): ``steps`` is
    (the step's draft + verify seconds, the tokens it committed) per verify step; the
    tokens a step commits arrive together, so each gets the step's time over their count.
    A step that committed nothing adds none."""
    out: list[float] = []
    for seconds, committed in steps:
        if committed > 0:
            out += [seconds / committed] * committed
    return out


# --- peak memory --------------------------------------------------------------------------

class PeakMemory(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["cuda_max_allocated", "process_peak_rss"]
    bytes: int
    before_bytes: int | None      # allocated / resident when the run began
    note: str


CUDA_NOTE = ("torch.cuda.max_memory_allocated after reset_peak_memory_stats: the peak of "
             "tensor memory on the device during the run (the target, every loaded drafter and "
             "the run's caches; not the allocator's reserved pool or the CUDA context)")
RSS_NOTE = ("VmHWM of this process after resetting it through /proc/self/clear_refs: the "
            "peak resident memory of the whole process during the run (interpreter, torch, the "
            "target, every loaded drafter and the run's caches), not the run's own increment; "
            "before_bytes is VmRSS when the run began")
RSS_NOTE_NO_RESET = ("VmHWM of this process; /proc/self/clear_refs could not reset it, so it is "
                     "the peak since the process started, an upper bound for this run")


def _proc_status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024     # the kernel writes kB
    except OSError:
        return None
    return None


class MemoryProbe:
    """Peak memory of one run. CUDA: the allocator's peak. CPU on Linux: the process's
    resident high-water mark, reset before the run (writing "5" to /proc/self/clear_refs
    resets VmHWM to the current RSS; Linux >= 4.0). Elsewhere: not measured (None)."""

    def __init__(self, device) -> None:
        self.device = device
        self.cuda = getattr(device, "type", str(device)) == "cuda"
        self.before: int | None = None
        self.reset_ok = False

    def start(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.before = int(torch.cuda.memory_allocated(self.device))
            return
        try:
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")
            self.reset_ok = True
        except OSError:
            self.reset_ok = False
        self.before = _proc_status_bytes("VmRSS")

    def stop(self) -> PeakMemory | None:
        if self.cuda:
            import torch

            torch.cuda.synchronize(self.device)
            return PeakMemory(kind="cuda_max_allocated",
                              bytes=int(torch.cuda.max_memory_allocated(self.device)),
                              before_bytes=self.before, note=CUDA_NOTE)
        peak = _proc_status_bytes("VmHWM")
        if peak is None:
            return None
        return PeakMemory(kind="process_peak_rss", bytes=peak, before_bytes=self.before,
                          note=RSS_NOTE if self.reset_ok else RSS_NOTE_NO_RESET)


def memory_supported() -> bool:
    return os.path.exists("/proc/self/status")


# --- confidence-head metrics --------------------------------------------------------------

class ReliabilityBin(BaseModel):
    """One non-empty bin of the 20 (DeepSpec's reliability entries)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bin: int
    range: list[float]
    avg_pred: float
    avg_target: float
    weight: float


class PositionConfidence(BaseModel):
    """DeepSpec's per-position entry, with its field names; null where it writes NaN."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    position: int
    total_weight: float
    ece: float | None
    auc: float | None
    brier: float | None
    pred_mean: float | None
    target_mean: float | None
    reliability: list[ReliabilityBin]


class ConfidenceSummary(BaseModel):
    """DeepSpec's ``summarize_confidence_row``: means over positions weighted by
    total_weight (AUROC over the positions where it is defined)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ece_mean: float | None
    auc_mean: float | None
    brier_mean: float | None
    pred_mean: float | None
    target_mean: float | None


class ConfidenceReport(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    temperature: float            # the decoding temperature of the runs observed
    proposals: int                # verify steps observed (L > 0)
    temperatures: list[float] | None   # confidence temperatures applied (None: raw head)
    per_position: list[PositionConfidence]
    summary: ConfidenceSummary


@dataclass(frozen=True)
class ConfidenceData:
    """The observed steps of a confidence head as arrays: ``logits`` [N, B] float32 (0 past
    L), ``lengths`` [N] (L, every one > 0) and ``accepted`` [N]."""

    logits: np.ndarray
    lengths: np.ndarray
    accepted: np.ndarray

    @property
    def block_size(self) -> int:
        return int(self.logits.shape[1])

    def subset(self, rows: np.ndarray) -> "ConfidenceData":
        return ConfidenceData(self.logits[rows], self.lengths[rows], self.accepted[rows])


def confidence_data(steps: Sequence[tuple[Sequence[int], int, Sequence[float] | None]], *,
                    block_size: int, stop_token_ids: Sequence[int]) -> ConfidenceData:
    """``steps``: (proposed, accepted, confidence_logits) per verify step. Steps with L = 0
    are skipped as DeepSpec skips them; a step with L > 0 must carry its logits."""
    rows, lengths, accepted = [], [], []
    for proposed, acc, logits in steps:
        L = effective_length(proposed, acc, stop_token_ids)
        if L <= 0:
            continue
        if logits is None or len(logits) < L:
            raise ValueError("a verify step with draft tokens has no confidence logits for them")
        row = np.zeros(block_size, dtype=np.float32)
        row[:L] = np.asarray(logits[:L], dtype=np.float32)
        rows.append(row)
        lengths.append(L)
        accepted.append(acc)
    logits = np.stack(rows) if rows else np.zeros((0, block_size), dtype=np.float32)
    return ConfidenceData(logits, np.asarray(lengths, dtype=np.int64),
                          np.asarray(accepted, dtype=np.int64))


def step_probabilities(logits: np.ndarray, temperatures: Sequence[float] | None = None) -> np.ndarray:
    """sigmoid(cl_k / T_k) in float32, as DeepSpec applies sigmoid to float32 logits,
    widened to float64 for the cumulative product."""
    import torch

    x = torch.from_numpy(np.ascontiguousarray(logits, dtype=np.float32))
    if temperatures is not None:
        x = x / torch.tensor(list(temperatures)[: x.shape[-1]], dtype=torch.float32)
    return torch.sigmoid(x).to(torch.float64).numpy()


def cumulative_predictions(data: ConfidenceData, temperatures: Sequence[float] | None = None
                           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(P [N, B] clamped, label [N, B], observed mask [N, B])."""
    B = data.block_size
    cols = np.arange(B)
    observed = cols[None, :] < data.lengths[:, None]
    steps = np.where(observed, step_probabilities(data.logits, temperatures), 1.0)
    pred = np.clip(np.cumprod(steps, axis=1), EPS_PROB, 1.0 - EPS_PROB)
    label = (cols[None, :] < data.accepted[:, None]).astype(np.float64)
    return pred, label, observed


def bin_index(p: np.ndarray, count: int) -> np.ndarray:
    # DeepSpec: (p * bins).long() truncates toward zero; p > 0 after the clamp.
    return np.clip((p * count).astype(np.int64), 0, count - 1)


def auroc_from_histograms(pos: np.ndarray, neg: np.ndarray) -> float | None:
    total_pos, total_neg = float(pos.sum()), float(neg.sum())
    if total_pos <= 0.0 or total_neg <= 0.0:
        return None
    neg_below = np.cumsum(neg) - neg
    pairs = float((pos * neg_below).sum() + 0.5 * (pos * neg).sum())
    return pairs / (total_pos * total_neg)


def ece_sampling_floor(p: np.ndarray) -> float | None:
    """About the ECE a perfectly calibrated head would show on these predictions: with
    labels drawn as Bernoulli(p), each bin's |sum(label - p)| is about
    sqrt(2/pi x sum p(1-p)) (normal approximation), so the expected ECE is the sum of those
    over the 20 bins divided by the count. An ECE near it is sampling noise, not
    miscalibration. Not a DeepSpec metric."""
    if len(p) == 0:
        return None
    b = bin_index(p, COARSE_BINS)
    var = np.bincount(b, weights=p * (1.0 - p), minlength=COARSE_BINS)
    return float(np.sqrt(2.0 / np.pi * var).sum() / len(p))


def rank_auroc(scores: np.ndarray, labels: np.ndarray) -> float | None:
    """Exact AUROC (Mann-Whitney, ties one half) of ``scores`` against boolean ``labels``;
    None without both classes."""
    labels = np.asarray(labels, dtype=bool)
    npos, nneg = int(labels.sum()), int((~labels).sum())
    if npos == 0 or nneg == 0:
        return None
    _, inverse, counts = np.unique(np.asarray(scores, dtype=np.float64), return_inverse=True,
                                   return_counts=True)
    mid_rank = np.cumsum(counts) - (counts - 1) / 2.0        # 1-based average rank per value
    ranks = mid_rank[inverse]
    return float((ranks[labels].sum() - npos * (npos + 1) / 2.0) / (npos * nneg))


def position_metrics(p: np.ndarray, y: np.ndarray, position: int) -> PositionConfidence:
    """DeepSpec's per-position numbers from the predictions and labels at one position."""
    total = float(len(p))
    if total <= 1e-12:
        return PositionConfidence(position=position, total_weight=0.0, ece=None, auc=None,
                                  brier=None, pred_mean=None, target_mean=None, reliability=[])
    coarse = bin_index(p, COARSE_BINS)
    count = np.bincount(coarse, minlength=COARSE_BINS).astype(np.float64)
    sum_p = np.bincount(coarse, weights=p, minlength=COARSE_BINS)
    sum_y = np.bincount(coarse, weights=y, minlength=COARSE_BINS)
    denom = np.maximum(count, 1e-12)
    avg_p, avg_y = sum_p / denom, sum_y / denom
    ece = float((np.abs(avg_p - avg_y) * count).sum() / total)
    fine = bin_index(p, FINE_BINS)
    pos = np.bincount(fine, weights=y, minlength=FINE_BINS)
    neg = np.bincount(fine, weights=1.0 - y, minlength=FINE_BINS)
    reliability = [ReliabilityBin(bin=b, range=[b / COARSE_BINS, (b + 1) / COARSE_BINS],
                                  avg_pred=float(avg_p[b]), avg_target=float(avg_y[b]),
                                  weight=float(count[b]))
                   for b in range(COARSE_BINS) if count[b] > 0]
    return PositionConfidence(position=position, total_weight=total, ece=ece,
                              auc=auroc_from_histograms(pos, neg),
                              brier=float(((p - y) ** 2).sum()) / total,
                              pred_mean=float(sum_p.sum()) / total,
                              target_mean=float(sum_y.sum()) / total, reliability=reliability)


def per_position(data: ConfidenceData, temperatures: Sequence[float] | None = None
                 ) -> list[PositionConfidence]:
    pred, label, observed = cumulative_predictions(data, temperatures)
    return [position_metrics(pred[observed[:, k], k], label[observed[:, k], k], k)
            for k in range(data.block_size)]


def summarize(entries: Sequence[PositionConfidence]) -> ConfidenceSummary:
    total = sum(e.total_weight for e in entries if e.total_weight > 0)
    if total <= 0:
        return ConfidenceSummary(ece_mean=None, auc_mean=None, brier_mean=None, pred_mean=None,
                                 target_mean=None)
    live = [e for e in entries if e.total_weight > 0]
    with_auc = [e for e in live if e.auc is not None]
    auc_w = sum(e.total_weight for e in with_auc)
    return ConfidenceSummary(
        ece_mean=sum(e.ece * e.total_weight for e in live) / total,
        auc_mean=sum(e.auc * e.total_weight for e in with_auc) / auc_w if auc_w else None,
        brier_mean=sum(e.brier * e.total_weight for e in live) / total,
        pred_mean=sum(e.pred_mean * e.total_weight for e in live) / total,
        target_mean=sum(e.target_mean * e.total_weight for e in live) / total)


def confidence_report(data: ConfidenceData, *, temperature: float,
                      temperatures: Sequence[float] | None = None) -> ConfidenceReport:
    entries = per_position(data, temperatures)
    return ConfidenceReport(temperature=temperature, proposals=int(len(data.lengths)),
                            temperatures=None if temperatures is None else list(temperatures),
                            per_position=entries, summary=summarize(entries))
