"""Misreadings of a DSpark drafter: each a small perturbation of the reference runtime, as an
engine that misreads the drafter computes it (the table, with where each was seen and its
fix: evaluation/misreadings.py; docs/CONFORMANCE.md "Diagnosis").

The faithful path (runtime/drafter.py, qwen3.py, gemma4.py) is never changed: ``misread``
returns a shallow copy of a faithful drafter whose class is the drafter's own with
``_Misread`` in front, which overrides only the methods a misreading changes, and whose
attributes (the taps, the head, the RoPE table, the softcap, the embedding scale, the
Markov head's type) are replaced on the copy only. The copy shares the weights; its
context cells are its own once it is ``reset`` (a misreading of the context side: the
taps, the RoPE), or pointed at another drafter's (``share_context``) when it changes the
block side only.

What each misreading computes, against docs/REFERENCE.md §2 (block ``[anchor, MASK x
(B-1)]`` at positions ``n-1 .. n-2+B``, query j predicting ``n+j``, features
``hs[id+1]``, the Markov walk from the anchor):

- ``row_late``: the block read one row late: the draft is the reference's proposal from
  its second token on (``draft[k] = reference[k+1]``, B-1 tokens; llama.cpp's
  draft-dflash reads rows 1..n of the same block).
- ``row_early``: the block read one row early: ``draft[k] = reference[k-1]`` for k >= 1;
  ``draft[0]`` is the row before the anchor's prediction, which a DeepSeek drafter does
  not make, and is not compared (``UNKNOWN``).
- ``position_minus_one``: the block seeded one position early: its rows at ``n-2 ..
  n-3+B`` (RoPE off by one against the context cells), everything else unchanged.
- ``tap_plus_one`` / ``tap_minus_one``: every tap one hidden state off (``hs[id+2]``,
  ``hs[id]``: an id read as the stored id + 1 twice, or not at all).
- ``final_norm_tap``: the deepest tap read as the target's final-normed state (HF's last
  hidden state, what an engine that passes "the target's hidden state" hands over).
- ``markov_prev_early``: the Markov head fed the token one position early: step k reads
  ``W1[t_{k-2}]`` (step 0 the token before the anchor, step 1 the anchor).
- ``no_markov``: the Markov head ignored: each row's argmax of the base logits (a DSpark
  drafter run as DFlash).
- ``head_is_embedding``: the target's embedding as the drafter's head (an untied target).
- ``no_softcap``, ``no_embed_scale``, ``full_rope`` (Gemma4): the final logit softcap
  dropped; the block's embedding rows not scaled by sqrt(H); the proportional (partial)
  RoPE rotating every pair (context cells and block alike).
- ``anchor_layout``: ``sample_from_anchor`` read the other way: DFlash's ``1 + N`` layout,
  ``[anchor, MASK x B]`` at ``n-1 .. n-1+B`` (B + 1 rows), rows 1..B drafted, the Markov
  walk from the anchor.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import replace

import torch

from dspark_convert.runtime.drafter import DSparkDrafter, Proposal
from dspark_convert.runtime.layers import Rope

ROW_LATE = "row_late"
ROW_EARLY = "row_early"
POSITION_MINUS_ONE = "position_minus_one"
TAP_PLUS_ONE = "tap_plus_one"
TAP_MINUS_ONE = "tap_minus_one"
FINAL_NORM_TAP = "final_norm_tap"
MARKOV_PREV_EARLY = "markov_prev_early"
NO_MARKOV = "no_markov"
HEAD_IS_EMBEDDING = "head_is_embedding"
NO_SOFTCAP = "no_softcap"
NO_EMBED_SCALE = "no_embed_scale"
FULL_ROPE = "full_rope"
ANCHOR_LAYOUT = "anchor_layout"

# Every misreading the runtime computes, in the table's order (evaluation/misreadings.py).
MISREADINGS = (ROW_LATE, ROW_EARLY, POSITION_MINUS_ONE, TAP_PLUS_ONE, TAP_MINUS_ONE,
               FINAL_NORM_TAP, MARKOV_PREV_EARLY, NO_MARKOV, HEAD_IS_EMBEDDING, NO_SOFTCAP,
               NO_EMBED_SCALE, FULL_ROPE, ANCHOR_LAYOUT)
# Those that change the context cells (the features or their keys): a proposer keeps one
# set of cells per combination of these; the others change the proposal only.
CONTEXT_SIDE = frozenset({TAP_PLUS_ONE, TAP_MINUS_ONE, FINAL_NORM_TAP, FULL_ROPE})
# Misreadings of the same thing, never combined: one layout of the block, one tap rule,
# one use of the Markov head.
EXCLUSIVE = (frozenset({ROW_LATE, ROW_EARLY, ANCHOR_LAYOUT}),
             frozenset({TAP_PLUS_ONE, TAP_MINUS_ONE, FINAL_NORM_TAP}),
             frozenset({NO_MARKOV, MARKOV_PREV_EARLY}))
# A draft position a misreading makes no prediction for (row_early's first): not compared.
UNKNOWN = -1


def compatible(ids: Iterable[str]) -> bool:
    """No two of ``ids`` misread the same thing (``EXCLUSIVE``)."""
    ids = set(ids)
    return all(len(ids & group) <= 1 for group in EXCLUSIVE)


def _layers(target) -> int:
    return int(target.config.num_hidden_layers)


def not_applicable(misreading: str, drafter: DSparkDrafter, target) -> str | None:
    """Why ``misreading`` changes nothing for this drafter and target (so it is not tried),
    or None where it applies."""
    if misreading not in MISREADINGS:
        raise ValueError(f"unknown misreading {misreading!r}")
    taps = list(drafter.hidden_state_indices)
    if misreading == TAP_PLUS_ONE and max(taps) + 1 > _layers(target):
        return "a tap one deeper than the target's last hidden state"
    if misreading == TAP_MINUS_ONE and min(taps) - 1 < 0:
        return "a tap one before the embedding"
    if misreading in (NO_MARKOV, MARKOV_PREV_EARLY) and drafter.markov == "none":
        return "the drafter has no Markov head"
    if misreading == HEAD_IS_EMBEDDING and (
            target.lm_head is target.embed or torch.equal(target.lm_head, target.embed)):
        return "the target ties its embedding and head"
    if misreading == NO_SOFTCAP and getattr(drafter, "softcap", None) is None:
        return "the drafter applies no final logit softcap"
    if misreading == NO_EMBED_SCALE and getattr(drafter, "scale", None) is None:
        return "the drafter does not scale its embedding rows"
    if misreading == FULL_ROPE:
        rope = getattr(drafter.contract, "rope", None)
        pairs = getattr(rope, "rotated_pairs", None)
        if pairs is None or pairs >= drafter.head_dim // 2:
            return "the drafter's RoPE rotates every pair already"
    return None


class _Misread:
    """The overrides (in front of the drafter's own class): each checks its misreading."""

    misreadings: frozenset[str] = frozenset()
    before_anchor: int | None = None      # the committed token before the anchor
    _fed: list[int]

    def _block_start(self, drafter: DSparkDrafter) -> int:
        start = super()._block_start(drafter)
        return max(start - 1, 0) if POSITION_MINUS_ONE in self.misreadings else start

    def _markov_bias(self, prev: int, hb_k: torch.Tensor, state: torch.Tensor | None):
        if MARKOV_PREV_EARLY in self.misreadings:
            self._fed.append(prev)
            prev = self._fed[-2]
        return super()._markov_bias(prev, hb_k, state)

    @torch.inference_mode()
    def propose(self, anchor: int, **options) -> Proposal:
        m = self.misreadings
        self._fed = [anchor if self.before_anchor is None else self.before_anchor]
        if ANCHOR_LAYOUT in m:
            block = self.block_size
            self.block_size = block + 1           # [anchor, MASK x B]
            try:
                hb = self.block_hidden(anchor)
            finally:
                self.block_size = block
            proposal = self.propose_from(anchor, hb[1:], **options)
        else:
            proposal = super().propose(anchor, **options)
        tokens = proposal.tokens
        if ROW_LATE in m:
            tokens = tokens[1:]
        elif ROW_EARLY in m:
            tokens = torch.cat([tokens.new_tensor([UNKNOWN]), tokens[:-1]])
        return replace(proposal, tokens=tokens) if tokens is not proposal.tokens else proposal


_CLASSES: dict[type, type] = {}


def _misread_class(cls: type) -> type:
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"Misread{cls.__name__}", (_Misread, cls), {})
    return _CLASSES[cls]


def misread(drafter: DSparkDrafter, ids: Iterable[str], *, target) -> DSparkDrafter:
    """A copy of the faithful ``drafter`` computing as an engine that makes every misreading
    of ``ids`` (compatible, each applicable: ``not_applicable``). It shares the weights and,
    until ``reset``, the faithful drafter's context cells."""
    ids = frozenset(ids)
    if not compatible(ids):
        raise ValueError(f"incompatible misreadings {sorted(ids)}")
    for m in ids:
        why = not_applicable(m, drafter, target)
        if why is not None:
            raise ValueError(f"{m} does not apply: {why}")
    if isinstance(drafter, _Misread):
        raise ValueError("misread takes the faithful drafter")
    out = copy.copy(drafter)
    out.__class__ = _misread_class(type(drafter))
    out.misreadings = ids
    out.before_anchor = None
    taps = list(drafter.hidden_state_indices)
    if TAP_PLUS_ONE in ids:
        taps = [i + 1 for i in taps]
    elif TAP_MINUS_ONE in ids:
        taps = [i - 1 for i in taps]
    elif FINAL_NORM_TAP in ids:
        deepest = taps.index(max(taps))
        taps[deepest] = _layers(target)
    out.hidden_state_indices = taps
    if NO_MARKOV in ids:
        out.markov = "none"
    if HEAD_IS_EMBEDDING in ids:
        out.lm_head = target.embed
    if NO_SOFTCAP in ids:
        out.softcap = None
    if NO_EMBED_SCALE in ids:
        out.scale = torch.ones_like(drafter.scale)
    if FULL_ROPE in ids:
        r = drafter.contract.rope
        out.rope = Rope(r.head_dim, r.theta, drafter.device, drafter.dtype)
    return out


def share_context(drafter: DSparkDrafter, source: DSparkDrafter) -> None:
    """Point ``drafter``'s context cells at ``source``'s (read only: a proposal never
    changes them), so that misreadings of the block side reuse one set of cells."""
    drafter.ctx_keys, drafter.ctx_values = source.ctx_keys, source.ctx_values
    drafter.length = source.length
