"""Greedy speculative decoding with a DFlash2 drafter (runtime/dflash2.py), batch 1.

speculators 0.9.0 has no DFlash2 inference loop; this is the minimal one around its model
that golden/reference/dflash2's trace records (docs/REFERENCE.md, "DFlash2"), committing as
runtime/speculative.py does:

- prefill: the target runs the prompt; its argmax is the first new token (the first anchor);
  the prompt's tapped hidden states become the drafter's context cells (positions 0 .. P-1);
- each cycle: the drafter's block after the anchor x[start] (at position ``start``) gives
  B - 1 drafts by the selector's greedy walk; the target verifies [anchor, drafts] at
  positions start .. start+B-1 (``speculative.verify``: the longest prefix equal to the
  target's argmax, then the target's token); the anchor and the accepted drafts become
  context cells (the target's features at those positions), the target's KV cache is cut
  back to the committed tokens, and the target's token is the next anchor;
- the run ends once the output holds ``max_new_tokens`` new tokens (the last anchor is
  one of them: it is the target's own token), cut there, or at a stop token.

Greedy only: speculators' CandidateSelector has no sampled walk (z-lab's has one, softmax
over the K scores, with a K-way rejection sampler), so a temperature above 0 is refused
(DFlash2RunError, 151) rather than sampled by a rule no reference states.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from dspark_convert.errors import DFlash2RunError
from dspark_convert.runtime.dflash2 import DFlash2Drafter
from dspark_convert.runtime.qwen3 import KVCache, Qwen3Target
from dspark_convert.runtime.sampling import check_temperature, probs_from_logits
from dspark_convert.runtime.speculative import (TARGET_LOGITS, prefill, synchronize, verify,
                                               verify_forward)


@dataclass(frozen=True)
class DFlash2Cycle:
    """One verify step, in the fields of golden/reference/dflash2/reference.json."""

    anchor: int
    anchor_position: int
    proposed: tuple[int, ...]                           # the B - 1 drafts
    accepted: int
    next_token: int                                     # the target's correction or bonus
    committed: tuple[int, ...]                          # accepted drafts + next_token
    selector_candidates: tuple[tuple[int, ...], ...]    # per slot 1..B-1, the unary top-K
    selector_chosen_index: tuple[int, ...]              # per slot, the index walked


@dataclass(frozen=True)
class CycleTiming:
    """One cycle's wall time (device-synchronised), for `dspark eval` and `serve-bench`; kept
    beside the cycles (``DFlash2Run.timings``), not in them: a cycle is the fixture's record."""

    draft_seconds: float       # the drafter: this proposal + the context cells it commits
    verify_seconds: float      # the target's verify forward over [anchor, drafts]
    end_seconds: float         # the cycle's end, from the run's start (its tokens committed)


@dataclass(frozen=True)
class DFlash2Run:
    prompt: tuple[int, ...]
    output_ids: tuple[int, ...]              # prompt included
    acceptance_lengths: tuple[int, ...]      # accepted + 1 per cycle (accepted at a stop)
    cycles: tuple[DFlash2Cycle, ...]
    # Times (not compared: two runs of the same inputs are equal runs).
    timings: tuple[CycleTiming, ...] = field(default=(), compare=False)   # one per cycle
    prefill_seconds: float = field(default=0.0, compare=False)  # prefill + first cells
    total_seconds: float = field(default=0.0, compare=False)    # the whole generation

    @property
    def new_tokens(self) -> int:
        return len(self.output_ids) - len(self.prompt)

    @property
    def draft_seconds(self) -> float:
        return sum(t.draft_seconds for t in self.timings)


def check_greedy(temperature: object) -> float:
    """0, or DFlash2RunError (151): a number that is not a temperature, or one above 0
    (speculators 0.9.0 has no sampled selector walk)."""
    value = check_temperature(temperature, error=DFlash2RunError, option="temperature")
    if value > 0.0:
        raise DFlash2RunError(
            f"temperature: expected 0 (greedy), found {value}: speculators 0.9.0's DFlash2 "
            "candidate selector has no sampled walk (only z-lab's samples the K-way index)",
            field="temperature", expected=0, found=value)
    return value


@torch.inference_mode()
def dflash2_generate(target: Qwen3Target, drafter: DFlash2Drafter, prompt: list[int], *,
                     max_new_tokens: int, temperature: float = 0.0,
                     stop_token_ids: tuple[int, ...] = (),
                     stepwise_verify: bool = False) -> DFlash2Run:
    """The loop above. ``stepwise_verify``: verify token by token (speculative.verify_forward),
    so that the output equals the target's own greedy output in bfloat16 too."""
    check_greedy(temperature)
    device = target.device
    synchronize(device)
    t_begin = time.perf_counter()
    cache = KVCache()
    drafter.reset()
    taps = drafter.hidden_state_indices
    P = len(prompt)
    max_length = P + max_new_tokens
    out, first = prefill(target, prompt, cache, keep=taps)
    x = list(prompt) + [first]
    cycles: list[DFlash2Cycle] = []
    timings: list[CycleTiming] = []
    start = P
    stopped = x[P] in stop_token_ids
    if not stopped:
        drafter.add_context(drafter.features(out.hidden_states))
    synchronize(device)
    prefill_seconds = time.perf_counter() - t_begin
    # The anchor x[start] is committed (the target chose it): the run ends once the output
    # holds max_new_tokens new tokens, anchor included, as the fixture's loop ends.
    # (runtime/speculative.py's DeepSpec loop verifies once more from a final anchor.)
    while not stopped and start + 1 < max_length:
        anchor = x[start]
        t0 = time.perf_counter()
        proposal = drafter.propose(anchor)
        draft = proposal.tokens.tolist()
        synchronize(device)
        t1 = time.perf_counter()
        verify_ids = torch.tensor([anchor, *draft], dtype=torch.long, device=device)
        out = verify_forward(target, verify_ids, cache, keep=taps, stepwise=stepwise_verify)
        synchronize(device)
        t2 = time.perf_counter()
        p = probs_from_logits(out.logits, 0.0, what=TARGET_LOGITS)
        accepted, next_token, stopped = verify(p, None, draft, stop_token_ids=stop_token_ids)
        committed = draft[:accepted] if stopped else [*draft[:accepted], next_token]
        x.extend(committed)
        cycles.append(DFlash2Cycle(
            anchor=anchor, anchor_position=start, proposed=tuple(draft), accepted=accepted,
            next_token=next_token, committed=tuple(committed),
            selector_candidates=tuple(tuple(row) for row in proposal.candidates.tolist()),
            selector_chosen_index=tuple(proposal.chosen_index.tolist())))
        start += len(committed)
        if stopped:
            timings.append(CycleTiming(draft_seconds=t1 - t0, verify_seconds=t2 - t1,
                                       end_seconds=time.perf_counter() - t_begin))
            break
        cache.crop(start)
        # Context cells after verification: the anchor and the accepted drafts.
        t3 = time.perf_counter()
        drafter.add_context(drafter.features(out.hidden_states)[: accepted + 1])
        synchronize(device)
        t4 = time.perf_counter()
        timings.append(CycleTiming(draft_seconds=(t1 - t0) + (t4 - t3), verify_seconds=t2 - t1,
                                   end_seconds=t4 - t_begin))
        stopped = next_token in stop_token_ids
    output = x[: min(start + 1, max_length)]
    synchronize(device)
    return DFlash2Run(prompt=tuple(prompt), output_ids=tuple(output),
                      acceptance_lengths=tuple(len(c.committed) for c in cycles),
                      cycles=tuple(cycles), timings=tuple(timings),
                      prefill_seconds=prefill_seconds,
                      total_seconds=time.perf_counter() - t_begin)
