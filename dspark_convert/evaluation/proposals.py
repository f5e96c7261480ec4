"""The proposal check: every draft another engine made, against the reference runtime's own
proposal from the same committed tokens and the same anchor (issue 20, deliverable 4).

At temperature 0 a proposal is a function of three things only: the committed tokens (whose
target features are the drafter's context cells), the anchor (the last committed token,
the block's first row) and the drafter. So for each draft the engine reports, the reference
runs the target over the committed tokens, commits their features as context cells,
proposes from the anchor (docs/REFERENCE.md §2: query j predicts the token at start+1+j)
and compares token for token. A block read one row off, a stale context cell, a wrong tap,
a wrong head: each shows at the first draft it touches, as the first difference: which
draft call, which position, the engine's token and the reference's.

The engine's contexts grow by extension (each cycle commits the anchor and the accepted
drafts), so the target and the drafter's cells are extended incrementally, not recomputed;
a context that is not an extension of the previous one starts afresh.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict


class FirstDifference(BaseModel):
    """Where the engine first departs from the reference."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    draft_call: int                    # the engine's draft call, 1 = its first
    position: int                      # 0 = the first draft token after the anchor
    engine_token: int
    reference_token: int
    context_tokens: int                # committed tokens before the anchor
    anchor: int
    engine_draft: list[int]            # the whole draft of that call, both sides
    reference_draft: list[int]
    # s > 0 when the engine's whole draft is the reference's read s rows late
    # (engine[k] == reference[k + s] for every k): the signature of a block read off by s.
    row_offset: int | None
    # The reference's logit of its own token minus its logit of the engine's, at that
    # position (float32): a few thousandths is a near tie another engine's arithmetic (bf16
    # activations) may break the other way; a misreading leaves a wide margin.
    reference_margin: float | None
    prompt: str | None = None          # the prompt it was met on (set by the eval)


class ProposalCheck(BaseModel):
    """``compared`` drafts, ``equal`` of them token for token (over the engine's draft
    length); ``positions_equal[k]`` / ``positions_compared[k]``: position by position."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    compared: int
    equal: int
    positions_compared: list[int]
    positions_equal: list[int]
    first_difference: FirstDifference | None


@dataclass(frozen=True)
class EngineDraft:
    """What the comparison needs of one engine draft."""

    call: int
    context: tuple[int, ...]
    anchor: int
    tokens: tuple[int, ...]


class ReferenceProposer:
    """The reference runtime's greedy proposal for a context and an anchor (the cutoff
    off), extending the target's cache and the drafter's context cells as contexts grow."""

    def __init__(self, target, drafter) -> None:
        self.target, self.drafter = target, drafter
        self._reset()

    def _reset(self) -> None:
        from dspark_convert.runtime.qwen3 import KVCache

        self.cache = KVCache()
        self.drafter.reset()
        self.done: list[int] = []
        self.logits = None             # the last proposal's corrected logits [B, V]

    def propose(self, context: Sequence[int], anchor: int) -> tuple[int, ...]:
        import torch

        context = list(context)
        if context[: len(self.done)] != self.done:
            self._reset()
        new = context[len(self.done):]
        with torch.inference_mode():
            if new:
                out = self.target.forward(torch.tensor(new, dtype=torch.long,
                                                       device=self.target.device), self.cache,
                                          keep=self.drafter.hidden_state_indices,
                                          last_logits_only=True)
                self.drafter.add_context(self.drafter.features(out.hidden_states))
                self.done += new
            proposal = self.drafter.propose(anchor)
            self.logits = proposal.corrected_logits
            return tuple(int(t) for t in proposal.tokens.tolist())


def check_proposals(drafts: Sequence[EngineDraft], proposer: ReferenceProposer) -> ProposalCheck:
    """Compare every non-empty engine draft with the reference's proposal."""
    compared = equal = 0
    pos_compared: list[int] = []
    pos_equal: list[int] = []
    first = None
    for d in drafts:
        if not d.tokens:
            continue
        ref = proposer.propose(d.context, d.anchor)
        compared += 1
        same = True
        for k, tok in enumerate(d.tokens):
            while len(pos_compared) <= k:
                pos_compared.append(0)
                pos_equal.append(0)
            pos_compared[k] += 1
            want = ref[k] if k < len(ref) else None
            if want == tok:
                pos_equal[k] += 1
                continue
            if first is None:               # the first position that differs, of all drafts
                margin = None
                logits = proposer.logits
                if want is not None and logits is not None and 0 <= tok < logits.shape[-1]:
                    margin = float(logits[k, want].float() - logits[k, tok].float())
                first = FirstDifference(draft_call=d.call, position=k, engine_token=tok,
                                        reference_token=-1 if want is None else want,
                                        context_tokens=len(d.context), anchor=d.anchor,
                                        engine_draft=list(d.tokens), reference_draft=list(ref),
                                        row_offset=row_offset(d.tokens, ref),
                                        reference_margin=margin)
            same = False
        equal += same
    return ProposalCheck(compared=compared, equal=equal, positions_compared=pos_compared,
                         positions_equal=pos_equal, first_difference=first)


def row_offset(engine: Sequence[int], reference: Sequence[int], most: int = 2) -> int | None:
    """The s in 1..``most`` with engine[k] == reference[k + s] for every k the reference
    covers (at least one), else None."""
    for s in range(1, most + 1):
        n = min(len(engine), len(reference) - s)
        if n > 0 and all(engine[k] == reference[k + s] for k in range(n)):
            return s
    return None
