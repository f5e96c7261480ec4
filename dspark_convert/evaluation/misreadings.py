"""The misreadings `dspark conform --diagnose` knows, as data, and the diagnosis itself.

``MISREADINGS`` is the table (docs/CONFORMANCE.md's is generated from it by tools/docs.py):
each row a misreading an engine makes of a DSpark drafter, with where it was seen, what
fixes it, and the families it applies to. What each one computes is
runtime/misreadings.py (a perturbation of the reference runtime that never touches the
faithful path).

``diagnose``: the lines whose drafts differ from the reference's are proposed again under
each misreading that applies to the drafter and target, and under each compatible pair of
them (``MAX_COMBINED`` = 2; never two readings of the same thing: runtime/misreadings.py
``EXCLUSIVE``), and every candidate is scored by how many of those lines its proposals
reproduce. A candidate reproduces a line when its proposal equals the engine's draft at
every position both have (a misreading that drafts B-1 tokens, such as ``row_late``, is
compared on those; ``row_early``'s first position, which it does not predict, is not
compared) and at least one position is compared. A pair is reported only when it
reproduces more lines than each of its two parts alone. At most
``MAX_DIAGNOSED_LINES`` differing lines are diagnosed (the lowest line numbers); the
result says how many differ and how many were diagnosed.

Only the differing lines are re-proposed: the target runs once over their contexts
(shared prefixes once, as the check does: evaluation/proposals.py), keeping every hidden
state a candidate taps; each set of context cells a candidate needs (the taps and the
RoPE change them) is kept once, and every other candidate proposes over those cells.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict

from dspark_convert.evaluation.proposals import TraceLine, common_prefix
from dspark_convert.util.progress import NoProgress, Progress

# How many misreadings one candidate combines, and how many differing lines are diagnosed.
MAX_COMBINED = 2
MAX_DIAGNOSED_LINES = 256

QWEN3, GEMMA4 = "Qwen3", "Gemma4"


@dataclass(frozen=True)
class Misreading:
    id: str
    what: str                     # what the engine does, in a line
    seen: str                     # the engine(s) and thread(s) where it was seen
    fix: str                      # what fixes it
    families: tuple[str, ...]     # the drafter families it applies to


MISREADINGS: tuple[Misreading, ...] = (
    Misreading("row_late", "the block read one row late: row 0 (the anchor's prediction) "
               "dropped, draft k is the reference's k+1",
               "llama.cpp 0c1e570 `--spec-type draft-dflash` on DeepSeek's DFlash drafter "
               "(common/speculative.cpp reads rows 1..n; docs/ENGINES.md)",
               "read rows 0..B-1 when the drafter's `sample_from_anchor` is true (llama.cpp: "
               "`--spec-type draft-dspark`)", (QWEN3, GEMMA4)),
    Misreading("row_early", "the block read one row early: draft k is the reference's k-1",
               "SGLang #30982 (speculators-convention drafters read one position early: "
               "accepted length 1.1 instead of 4.05)",
               "take the drafter's layout from its config (`sample_from_anchor`) and draft "
               "the rows that predict the positions after the anchor", (QWEN3, GEMMA4)),
    Misreading("position_minus_one", "the block seeded one position early: its RoPE "
               "positions n-2.. instead of n-1.. for a context of n tokens",
               "ik_llama.cpp #2296 (acceptance 0.8 falling to 0.22 as the context grows)",
               "put the anchor's row at the position right after the last context cell "
               "(the context's length minus one, counting the anchor)", (QWEN3, GEMMA4)),
    Misreading("tap_plus_one", "every tap one hidden state deeper: hs[id+2]",
               "llama.cpp stores DeepSpec's id + 1 (`dflash.target_layers`), Strata the id; "
               "atlas #394",
               "tap HF hidden_states[id + 1] (the output of layer id) for DeepSpec's "
               "target_layer_ids; llama.cpp's stored id+1 is the input of layer id+1 (the same "
               "state): add one once", (QWEN3, GEMMA4)),
    Misreading("tap_minus_one", "every tap one hidden state shallower: hs[id]",
               "llama.cpp stores DeepSpec's id + 1, Strata the id; atlas #394",
               "tap HF hidden_states[id + 1], not hidden_states[id]", (QWEN3, GEMMA4)),
    Misreading("final_norm_tap", "the deepest tap read as the target's final-normed state",
               "listed with the tap slips (atlas #394); DeepSpec refuses a tap on the last "
               "layer because HF's last hidden state is the normed one (docs/REFERENCE.md §2)",
               "tap the layer's output before the final norm", (QWEN3, GEMMA4)),
    Misreading("markov_prev_early", "the Markov head fed the token one position early: "
               "step k reads W1[t(k-2)]", "tokenspeed #829",
               "feed step k the token drafted at step k-1 (step 0: the anchor)",
               (QWEN3, GEMMA4)),
    Misreading("no_markov", "the Markov head ignored: a DSpark drafter run as DFlash",
               "an engine's DFlash path given a DSpark drafter (llama.cpp 0c1e570 applies the "
               "Markov bias in draft-dspark only)",
               "run the drafter on the engine's DSpark path (llama.cpp: `--spec-type "
               "draft-dspark`; vLLM: `method: dspark`)", (QWEN3, GEMMA4)),
    Misreading("head_is_embedding", "the target's embedding used as the drafter's head "
               "(an untied target)",
               "llama.cpp's converter file (convert_hf_to_gguf.py keeps token_embd, drops "
               "lm_head; the loader takes token_embd as the head): 9 accepted tokens instead "
               "of 15 (docs/ENGINES.md)",
               "bind the target's lm_head: `dspark export --engine llama.cpp` writes no "
               "token_embd.weight", (QWEN3,)),
    Misreading("no_softcap", "Gemma4's final logit softcap dropped",
               "dspark-mlx and llama.cpp threads (llama.cpp 0c1e570's DSpark graph has no "
               "softcap); docs/REFERENCE.md §10 item 8 measures tau 4.42 -> 2.94",
               "base logits = cap * tanh(lm_head(h) / cap), the Markov bias added after",
               (GEMMA4,)),
    Misreading("no_embed_scale", "Gemma4's embedding rows left unscaled in the block",
               "dspark-mlx and llama.cpp threads; docs/REFERENCE.md §10 item 5",
               "multiply the block's embedding rows by sqrt(hidden_size), rounded to the "
               "weights' dtype", (GEMMA4,)),
    Misreading("full_rope", "Gemma4's proportional (partial) RoPE applied to every pair",
               "dspark-mlx and llama.cpp threads (\"full rope instead of 0.25\", ~10% "
               "acceptance); docs/REFERENCE.md §10 item 4",
               "rotate only the first partial_rotary_factor * head_dim / 2 frequencies "
               "(denominator head_dim), the other pairs unchanged", (GEMMA4,)),
    Misreading("anchor_layout", "`sample_from_anchor` read the other way: DFlash's 1 + N "
               "layout, B + 1 rows, rows 1..B drafted",
               "vLLM #56792 (DeepSpec drafters served in the other layout, under 1% "
               "acceptance), speculators #737",
               "state the layout: `sample_from_anchor: true` in the drafter's config "
               "(`dspark export --engine speculators` always writes it)", (QWEN3, GEMMA4)),
)

BY_ID = {m.id: m for m in MISREADINGS}


class Explanation(BaseModel):
    """One candidate of the diagnosis: a misreading (or two) and the differing lines its
    proposals reproduce."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    misreading: str                    # its id, or two ids joined by "+"
    misreadings: list[str]             # the ids it combines
    explains: int                      # differing lines it reproduces
    of: int                            # differing lines diagnosed
    lines: list[int]                   # the first of them (at most 10), by trace line
    fix: list[str]                     # each part's fix
    seen: list[str]                    # where each part was seen


class DiagnosisScope(BaseModel):
    """What the diagnosis looked at."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    differing: int                     # lines whose draft differs
    diagnosed: int                     # of them, re-proposed (at most MAX_DIAGNOSED_LINES)
    candidates: int                    # misreadings and pairs tried
    not_applicable: dict[str, str]     # misreading -> why it was not tried
    max_combined: int
    max_lines: int
    target_tokens: int                 # what the target ran for the diagnosis
    seconds: float


@dataclass(frozen=True)
class Diagnosis:
    explanations: list[Explanation]    # best first; empty: none explains any line
    scope: DiagnosisScope


def candidates(applicable: Sequence[str]) -> list[tuple[str, ...]]:
    """Every misreading that applies, then every compatible pair of them, in table order."""
    from dspark_convert.runtime.misreadings import compatible

    out = [(m,) for m in applicable]
    out += [pair for pair in itertools.combinations(applicable, MAX_COMBINED)
            if compatible(pair)]
    return out


def reproduces(proposal: Sequence[int], draft: Sequence[int]) -> bool:
    """The candidate's proposal equals the engine's draft at every position both have and
    that the candidate predicts, at least one."""
    from dspark_convert.runtime.misreadings import UNKNOWN

    compared = 0
    for k in range(min(len(proposal), len(draft))):
        if proposal[k] == UNKNOWN:
            continue
        if proposal[k] != draft[k]:
            return False
        compared += 1
    return compared > 0


class _Variants:
    """The target's cache over the last context, and one drafter per set of context cells
    (keyed by the context-side misreadings), kept in step: a context that shares a prefix
    with the last one crops all of them back to it and extends them by the rest."""

    def __init__(self, target, drafters: dict[frozenset, object]) -> None:
        from dspark_convert.runtime.qwen3 import KVCache

        self.target, self.drafters = target, drafters
        self.keep = sorted({i for d in drafters.values() for i in d.hidden_state_indices})
        self.cache = KVCache()
        self.done = np.zeros(0, dtype=np.int64)
        self.target_tokens = 0
        for d in drafters.values():
            d.reset()

    def advance(self, context: np.ndarray) -> None:
        import torch

        from dspark_convert.runtime.qwen3 import KVCache

        ids = np.asarray(context, dtype=np.int64)
        keep = common_prefix(self.done, ids)
        if keep < len(self.done):
            if keep == 0:
                self.cache = KVCache()
                for d in self.drafters.values():
                    d.reset()
            else:
                self.cache.crop(keep)
                for d in self.drafters.values():
                    d.crop(keep)
            self.done = self.done[:keep]
        new = ids[keep:]
        if not len(new):
            return
        with torch.inference_mode():
            out = self.target.forward(torch.tensor(new, dtype=torch.long,
                                                   device=self.target.device), self.cache,
                                      keep=self.keep, last_logits_only=True)
            for d in self.drafters.values():
                d.add_context(d.features(out.hidden_states))
        self.done = np.concatenate([self.done, new])
        self.target_tokens += len(new)


def diagnose(lines: Sequence[TraceLine], target, drafter, *,
             max_lines: int = MAX_DIAGNOSED_LINES, differing_total: int | None = None,
             progress: Progress | None = None) -> Diagnosis:
    """Which misreading (or pair) reproduces the engine's drafts on ``lines`` (the differing
    lines, lowest first; only the first ``max_lines`` are re-proposed). ``drafter``: the
    faithful drafter (it is not changed); ``target``: the loaded target."""
    from dspark_convert.runtime.misreadings import (CONTEXT_SIDE, MISREADINGS as IDS, misread,
                                                    not_applicable, share_context)

    t0 = time.perf_counter()
    progress = progress or NoProgress()
    lines = sorted(lines, key=lambda x: x.line)
    differing = len(lines) if differing_total is None else differing_total
    lines = lines[:max_lines]
    skipped = {m: why for m in IDS if (why := not_applicable(m, drafter, target)) is not None}
    tried = candidates([m for m in IDS if m not in skipped])
    variants = {frozenset(c) & CONTEXT_SIDE for c in tried} | {frozenset()}
    state = _Variants(target, {v: misread(drafter, v, target=target) for v in variants})
    combos = [(c, misread(drafter, c, target=target), frozenset(c) & CONTEXT_SIDE)
              for c in tried]
    hits: dict[tuple[str, ...], list[int]] = {c: [] for c in tried}
    progress.start("diagnosis", len(lines))
    try:
        for x in sorted(lines, key=lambda x: x.packed):
            progress.advance(1)
            context = x.context
            state.advance(context[:-1])
            before = int(context[-2]) if len(context) > 1 else None
            for c, d, v in combos:
                share_context(d, state.drafters[v])
                d.before_anchor = before
                proposal = tuple(int(t) for t in d.propose(x.anchor).tokens.tolist())
                if reproduces(proposal, x.draft):
                    hits[c].append(x.line)
    finally:
        progress.finish()
    alone = {c[0]: len(hits[c]) for c in tried if len(c) == 1}
    out = []
    for c in tried:
        n = len(hits[c])
        if n == 0 or (len(c) > 1 and n <= max(alone[m] for m in c)):
            continue
        out.append(Explanation(
            misreading="+".join(c), misreadings=list(c), explains=n, of=len(lines),
            lines=sorted(hits[c])[:10], fix=[BY_ID[m].fix for m in c],
            seen=[BY_ID[m].seen for m in c]))
    order = {c: i for i, c in enumerate(tried)}
    out.sort(key=lambda e: (-e.explains, len(e.misreadings), order[tuple(e.misreadings)]))
    scope = DiagnosisScope(differing=differing, diagnosed=len(lines), candidates=len(tried),
                           not_applicable=skipped, max_combined=MAX_COMBINED,
                           max_lines=max_lines, target_tokens=state.target_tokens,
                           seconds=time.perf_counter() - t0)
    return Diagnosis(explanations=out, scope=scope)

