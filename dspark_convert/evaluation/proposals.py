"""The proposal check: every draft another engine made, against the reference runtime's own
proposal from the same committed tokens and the same anchor (the one check of
`dspark conform` and `dspark eval --engine`; docs/CONFORMANCE.md).

At temperature 0 a proposal is a function of three things only: the committed tokens (whose
target features are the drafter's context cells), the anchor (the last committed token,
the block's first row) and the drafter. So for each draft (a ``TraceLine``: the committed
tokens up to and including the anchor, and the engine's draft), the reference runs the
target over the committed tokens before the anchor, commits their features as context
cells, proposes from the anchor (docs/REFERENCE.md §2: query j predicts the token at
start+1+j) and compares token for token. A block read one row off, a stale context cell, a
wrong tap, a wrong head: each shows at the first draft it touches, as the first difference:
which line, which position, the engine's token and the reference's.

Contexts that share a prefix share its prefill. ``ReferenceProposer`` keeps the target's
KV cache and the drafter's context cells of the last context: the next one crops both back
to the prefix they share (``KVCache.crop``, ``DSparkDrafter.crop``) and runs the target over
the rest only. ``check_lines`` orders the lines for it (``_chain_order``): sorted as token
sequences (contexts with a common prefix consecutive, a context right before those that
extend it), cut into chains of contexts that extend one another, each chain run longest
first, so that the target runs a chain in one forward and each shorter context of it is a
crop. An engine's contexts grow by extension (each cycle commits the anchor and the
accepted drafts), so a trace of N drafts costs the target the distinct tokens it
committed, in one forward a request, not N prefills nor N small forwards; interleaved
requests (a batch) cost no more than one request after the other. Rows computed in
another chunking differ from a one-shot prefill by rounding only (float32: ~1e-6, far
below ``NEAR_TIE``). The result does not depend on the lines' order: the counts are sums,
and the first difference is the one of the lowest line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict

from dspark_convert.util.progress import NoProgress, Progress

# A difference where the reference's logit of its own token exceeds its logit of the
# engine's by less than this is a near tie: another engine's arithmetic (bf16 activations,
# another summation order) may break it the other way (docs/ENGINES.md measures 0.003 for
# llama.cpp); a misreading leaves a wide margin or reads the block rows late.
NEAR_TIE = 0.01


class FirstDifference(BaseModel):
    """Where the engine first departs from the reference: the lowest line whose draft
    differs, at its first differing position."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    line: int                          # the trace line (1 = the first)
    id: str | int | None               # the line's "id", when it has one
    draft_call: int | None             # the engine's draft call (1 = its first) where the
                                       # eval read it from the engine's log; None from a trace
    position: int                      # 0 = the first draft token after the anchor
    engine_token: int
    reference_token: int               # -1: past the reference's block
    context_tokens: int                # committed tokens before the anchor
    anchor: int
    engine_draft: list[int]            # the whole draft of that line, both sides
    reference_draft: list[int]
    # s > 0 when the engine's whole draft is the reference's read s rows late
    # (engine[k] == reference[k + s] for every k): the signature of a block read off by s.
    row_offset: int | None
    # The reference's logit of its own token minus its logit of the engine's, at that
    # position (in the compute dtype): a few thousandths is a near tie another engine's
    # arithmetic may break the other way; a misreading leaves a wide margin.
    reference_margin: float | None
    near_tie: bool                     # margin below NEAR_TIE and no row offset
    prompt: str | None = None          # the prompt it was met on (set by the eval)

    def within(self, margin: float) -> bool:
        """A near tie at ``margin``: no row offset and the reference's margin below it
        (``near_tie`` is this at NEAR_TIE; an engine judged at another margin asks this)."""
        return is_near_tie(self.row_offset, self.reference_margin, margin)


def is_near_tie(offset: int | None, margin: float | None, limit: float = NEAR_TIE) -> bool:
    """The near-tie rule: a difference with no row offset where the reference's margin is
    under ``limit`` (another engine's arithmetic may break such a tie the other way)."""
    return offset is None and margin is not None and margin < limit


class ProposalCheck(BaseModel):
    """``compared`` drafts, ``equal`` of them token for token (over the engine's draft
    length); ``positions_equal[k]`` / ``positions_compared[k]``: position by position."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    compared: int
    equal: int
    positions_compared: list[int]
    positions_equal: list[int]
    first_difference: FirstDifference | None

    def agreement_by_position(self) -> list[float | None]:
        """Drafts equal to the reference's at position k over those that reach k."""
        return [e / c if c else None for c, e in zip(self.positions_compared, self.positions_equal)]


@dataclass(frozen=True, eq=False)
class TraceLine:
    """One draft an engine made: ``packed`` holds its context (every committed token up to
    and including the anchor) as big-endian uint32, 4 bytes an id (a trace of long contexts
    stays small in memory), which sorts as the token sequences do."""

    line: int
    packed: bytes
    draft: tuple[int, ...]
    id: str | int | None = None

    @classmethod
    def of(cls, line: int, context: Sequence[int], draft: Sequence[int],
           id: str | int | None = None) -> "TraceLine":
        return cls(line=line, packed=np.asarray(context, dtype=">u4").tobytes(),
                   draft=tuple(int(t) for t in draft), id=id)

    @property
    def context(self) -> np.ndarray:
        return np.frombuffer(self.packed, dtype=">u4")

    @property
    def context_length(self) -> int:
        return len(self.packed) // 4

    @property
    def anchor(self) -> int:
        return int(self.context[-1])


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """The length of the longest common prefix of two id arrays."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


class ReferenceProposer:
    """The reference runtime's greedy proposal for a context and an anchor (the cutoff
    off). The target's cache and the drafter's context cells of the last context are kept:
    a context sharing a prefix with it is cropped back to that prefix and extended."""

    def __init__(self, target, drafter) -> None:
        self.target, self.drafter = target, drafter
        self.target_tokens = 0         # tokens the target ran, over every proposal
        self.proposals = 0
        self._reset()

    def _reset(self) -> None:
        from dspark_convert.runtime.qwen3 import KVCache

        self.cache = KVCache()
        self.drafter.reset()
        self.done = np.zeros(0, dtype=np.int64)
        self.logits = None             # the last proposal's corrected logits [B, V]

    def _crop(self, length: int) -> None:
        if length == 0:
            self._reset()
            return
        self.cache.crop(length)
        self.drafter.crop(length)
        self.done = self.done[:length]

    def propose(self, context: Sequence[int], anchor: int) -> tuple[int, ...]:
        """The proposal after ``context`` (the committed tokens before the anchor)."""
        import torch

        ids = np.asarray(context, dtype=np.int64)
        keep = common_prefix(self.done, ids)
        if keep < len(self.done):
            self._crop(keep)
        new = ids[keep:]
        with torch.inference_mode():
            if len(new):
                out = self.target.forward(torch.tensor(new, dtype=torch.long,
                                                       device=self.target.device), self.cache,
                                          keep=self.drafter.hidden_state_indices,
                                          last_logits_only=True)
                self.drafter.add_context(self.drafter.features(out.hidden_states))
                self.done = np.concatenate([self.done, new])
                self.target_tokens += len(new)
            proposal = self.drafter.propose(int(anchor))
            self.logits = proposal.corrected_logits
            self.proposals += 1
            return tuple(int(t) for t in proposal.tokens.tolist())


def check_lines(lines: Sequence[TraceLine], proposer: ReferenceProposer, *,
                progress: Progress | None = None,
                proposals: dict[int, tuple[int, ...]] | None = None) -> ProposalCheck:
    """Compare every line's draft with the reference's proposal from its context: the one
    check (`dspark conform`, `dspark eval --engine`). Lines are run in the order of their
    contexts, so that shared prefixes are prefilled once; the result is the same in any
    order. An empty draft compares nothing. ``proposals``: when given, receives the
    reference's proposal of every compared line, by its index in ``lines`` (conform's
    tables by depth and its diagnosis read them)."""
    progress = progress or NoProgress()
    width = max((len(x.draft) for x in lines), default=0)
    pos_compared, pos_equal = [0] * width, [0] * width
    compared = equal = 0
    differing: dict[int, tuple[tuple[int, ...], int, float | None]] = {}
    last, ref = None, ()
    progress.start("drafts", len(lines))
    try:
        for i in _chain_order(lines):
            x = lines[i]
            progress.advance(1)
            if not x.draft:
                continue
            if x.packed != last:           # the same context again: the same proposal
                context = x.context
                ref, last = proposer.propose(context[:-1], int(context[-1])), x.packed
            compared += 1
            if proposals is not None:
                proposals[i] = ref
            first = None
            for k, tok in enumerate(x.draft):
                pos_compared[k] += 1
                if k < len(ref) and ref[k] == tok:
                    pos_equal[k] += 1
                elif first is None:
                    first = k
            if first is None:
                equal += 1
            else:
                differing[i] = (ref, first, _margin(proposer.logits, ref, x.draft, first))
    finally:
        progress.finish()
    difference = None
    if differing:
        i = min(differing, key=lambda j: lines[j].line)
        x, (ref, k, margin) = lines[i], differing[i]
        offset = row_offset(x.draft, ref)
        difference = FirstDifference(
            line=x.line, id=x.id, draft_call=None, position=k, engine_token=x.draft[k],
            reference_token=ref[k] if k < len(ref) else -1, context_tokens=x.context_length - 1,
            anchor=x.anchor, engine_draft=list(x.draft), reference_draft=list(ref),
            row_offset=offset, reference_margin=margin,
            near_tie=is_near_tie(offset, margin))
    return ProposalCheck(compared=compared, equal=equal, positions_compared=pos_compared,
                         positions_equal=pos_equal, first_difference=difference)


def differs(draft: Sequence[int], ref: Sequence[int]) -> bool:
    """The engine's draft differs from the reference's proposal over its own length."""
    return any(k >= len(ref) or ref[k] != tok for k, tok in enumerate(draft))


def _chain_order(lines: Sequence[TraceLine]) -> list[int]:
    """The lines' indices in the order they are run: sorted by context, cut into chains
    (runs in which each context extends the one before), each chain longest first. The
    target then runs a chain's tokens in one forward (its longest context, from where the
    last chain's prefix ends), and every shorter context of the chain is a crop of it, with
    no forward at all: one prefill a chain, not a forward a line."""
    order = sorted(range(len(lines)), key=lambda i: lines[i].packed)
    out: list[int] = []
    start = 0
    for k in range(1, len(order) + 1):
        if k == len(order) or not lines[order[k]].packed.startswith(lines[order[k - 1]].packed):
            out += reversed(order[start:k])
            start = k
    return out


def _margin(logits, ref: Sequence[int], draft: Sequence[int], k: int) -> float | None:
    """The reference's logit of its token minus its logit of the engine's, at position k."""
    tok = draft[k]
    if logits is None or k >= len(ref) or k >= logits.shape[0] or not 0 <= tok < logits.shape[-1]:
        return None
    return float(logits[k, ref[k]].float() - logits[k, tok].float())


def row_offset(engine: Sequence[int], reference: Sequence[int], most: int = 2) -> int | None:
    """The s in 1..``most`` with engine[k] == reference[k + s] for every k the reference
    covers (at least one), else None."""
    for s in range(1, most + 1):
        n = min(len(engine), len(reference) - s)
        if n > 0 and all(engine[k] == reference[k + s] for k in range(n)):
            return s
    return None


# --- an engine's drafts as read from its own log (`dspark eval --engine`) -------------------

@dataclass(frozen=True)
class EngineDraft:
    """One draft as the eval reads it from an engine's log: its draft call, the committed
    tokens before the anchor, the anchor, what it proposed."""

    call: int
    context: tuple[int, ...]
    anchor: int
    tokens: tuple[int, ...]


def engine_lines(drafts: Sequence[EngineDraft], *, first_line: int = 1,
                 id: str | int | None = None) -> list[TraceLine]:
    """The engine's non-empty drafts as trace lines (numbered from ``first_line``): what
    the eval writes as the engine's trace and checks."""
    drafted = [d for d in drafts if d.tokens]
    return [TraceLine.of(first_line + n, (*d.context, d.anchor), d.tokens, id)
            for n, d in enumerate(drafted)]


def check_proposals(drafts: Sequence[EngineDraft], proposer: ReferenceProposer | None, *,
                    first_line: int = 1, id: str | int | None = None) -> ProposalCheck:
    """``check_lines`` of an engine's drafts (``engine_lines``), the first difference
    naming the engine's draft call too. No draft (or only empty ones) compares nothing."""
    drafted = [d for d in drafts if d.tokens]
    check = check_lines(engine_lines(drafted, first_line=first_line, id=id), proposer)
    d = check.first_difference
    if d is None:
        return check
    return check.model_copy(update={"first_difference": d.model_copy(
        update={"draft_call": drafted[d.line - first_line].call})})
