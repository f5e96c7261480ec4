"""Rates by draft position AND by context depth: some misreadings surface only deep in a
context (a block seeded one position early costs more as the context grows), which a rate
over every cycle hides.

The depth of a draft is the number of committed tokens before its anchor (the drafter's
context cells). The buckets are ``DEPTH_BUCKETS``: 0-63, 64-255, 256-1023 and 1024+
tokens. A table has one row per bucket that holds a draft, each with per position k the
drafts that reach k and those that hit there; its rate is hits / reached (None where no
draft reaches k).

- ``acceptance_by_depth``: DeepSpec's conditional acceptance by position,
  P(accepted > k | proposed > k) (evaluation/metrics.py ``acceptance_by_position``), per
  bucket, from (depth, proposed length, accepted) per verify step. ``run_steps`` gives
  those of an eval run (evaluation/report.py ``RunReport``: each prompt's cycles, cycle c
  at depth prompt_tokens + sum(acceptance_lengths[:c])), so that `dspark eval` reports
  ``acceptance_by_depth(run_steps(run), block_size)``.
- ``agreement_by_depth``: `dspark conform`'s agreement with the reference by position, per
  bucket, from (depth, engine draft, reference draft) per line.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ConfigDict

# Lower bounds of the buckets, in tokens before the anchor.
DEPTH_BUCKETS = (0, 64, 256, 1024)


def depth_label(index: int) -> str:
    lo = DEPTH_BUCKETS[index]
    if index + 1 < len(DEPTH_BUCKETS):
        return f"{lo}-{DEPTH_BUCKETS[index + 1] - 1}"
    return f"{lo}+"


def depth_bucket(tokens: int) -> int:
    """The bucket of a depth (its index in DEPTH_BUCKETS)."""
    return max(i for i, lo in enumerate(DEPTH_BUCKETS) if tokens >= lo)


class DepthRow(BaseModel):
    """One depth bucket: per draft position, the drafts that reach it and those that hit."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    depth: str                         # the bucket's label, e.g. "64-255"
    drafts: int                        # drafts (verify steps, trace lines) in the bucket
    reached: list[int]
    hit: list[int]

    def rates(self) -> list[float | None]:
        return [h / r if r else None for r, h in zip(self.reached, self.hit)]


def _table(counts: dict[int, tuple[int, list[int], list[int]]]) -> list[DepthRow]:
    return [DepthRow(depth=depth_label(b), drafts=n, reached=reached, hit=hit)
            for b, (n, reached, hit) in sorted(counts.items())]


def acceptance_by_depth(steps: Iterable[tuple[int, int, int]], block_size: int) -> list[DepthRow]:
    """``steps``: (depth, proposed length, accepted) per verify step. Per bucket and
    position k: steps that proposed more than k tokens, and those that accepted more."""
    counts: dict[int, tuple[int, list[int], list[int]]] = {}
    for depth, proposed, accepted in steps:
        b = depth_bucket(depth)
        n, reached, hit = counts.setdefault(b, (0, [0] * block_size, [0] * block_size))
        counts[b] = (n + 1, reached, hit)
        for k in range(min(proposed, block_size)):
            reached[k] += 1
            if accepted > k:
                hit[k] += 1
    return _table(counts)


def agreement_by_depth(lines: Iterable[tuple[int, Sequence[int], Sequence[int]]],
                       width: int) -> list[DepthRow]:
    """``lines``: (depth, engine draft, reference draft) per line. Per bucket and position
    k: drafts that reach k, and those equal to the reference's there."""
    counts: dict[int, tuple[int, list[int], list[int]]] = {}
    for depth, draft, ref in lines:
        b = depth_bucket(depth)
        n, reached, hit = counts.setdefault(b, (0, [0] * width, [0] * width))
        counts[b] = (n + 1, reached, hit)
        for k, tok in enumerate(draft[:width]):
            reached[k] += 1
            if k < len(ref) and ref[k] == tok:
                hit[k] += 1
    return _table(counts)


def run_steps(run) -> list[tuple[int, int, int]]:
    """(depth, proposed length, accepted) of every verify step of an eval run (a
    ``RunReport`` of a drafter; prompts without recorded cycles are left out)."""
    out = []
    for p in run.prompts:
        if not p.cycles or p.acceptance_lengths is None:
            continue
        depth = p.prompt_tokens
        for cycle, length in zip(p.cycles, p.acceptance_lengths):
            out.append((depth, len(cycle.proposed), cycle.accepted))
            depth += length
    return out


def trace_acceptance(lines: Sequence, block_size: int) -> list[DepthRow]:
    """The acceptance of an engine's drafts as its trace records it: a line's draft is
    accepted as far as it equals what was committed after its anchor, read from the
    furthest context in the trace that extends it through contexts extending one another
    (a request's later lines; at temperature 0 a rejected position's committed token is the
    target's own, so reading further never lengthens an acceptance). A line that no
    context extends (each request's last) is not counted."""
    order = sorted(range(len(lines)), key=lambda i: lines[i].packed)
    n = len(order)
    # nxt[k]: the next position in ``order`` holding another context; far[k]: the furthest
    # context reached from order[k] through consecutive extensions (None: none extends it).
    nxt, far = [n] * n, [None] * n
    for k in reversed(range(n)):
        if k + 1 < n:
            same = lines[order[k + 1]].packed == lines[order[k]].packed
            nxt[k] = nxt[k + 1] if same else k + 1
        j = nxt[k]
        if j < n and lines[order[j]].packed.startswith(lines[order[k]].packed):
            far[k] = far[j] if far[j] is not None else j
    steps = []
    for k, a in enumerate(order):
        x = lines[a]
        if far[k] is None or not x.draft:
            continue
        y = lines[order[far[k]]]
        committed = y.context[x.context_length:].tolist()
        accepted = 0
        while accepted < min(len(x.draft), len(committed)) and x.draft[accepted] == committed[accepted]:
            accepted += 1
        steps.append((x.context_length - 1, len(x.draft), accepted))
    return acceptance_by_depth(steps, block_size)
