"""The reference runtime's drafts for one committed context, and llama.cpp 0c1e570's stated
departures as modes: what `dspark eval`'s llama.cpp runs of a DFlash2 drafter or a Gemma 4
assistant are checked against (docs/ENGINES.md, "DFlash2 and the Gemma 4 assistant in
llama.cpp").

Each function drafts from a context given whole (the committed tokens before the anchor, as
llama.cpp's log names a draft call: its first anchor is the prompt's last token), the
target run over it afresh: a draft depends on nothing else, so any engine's draft can be
checked alone. The runtime files (runtime/dflash2.py, runtime/gemma4_assistant.py) are
used as they are; a mode only changes which KV entries a sliding layer sees:

- ``window="reference"``: what the reference computes (speculators' DFlash2: context
  positions >= anchor - W for every block query, dflash/attention.py; transformers'
  assistant: the last W + 1 shared entries, modeling_gemma4_unified_assistant.py:212-253);
- ``window="llama.cpp"``: llama.cpp's standard sliding window (LLAMA_SWA_TYPE_STANDARD: a
  key at position k is seen by a query at position p when p - k < W,
  src/llama-hparams.cpp ``is_masked_swa``). For the assistant every step's query sits at
  the anchor's position p and the KV holds committed positions only (< p): W - 1 entries;
  for DFlash2 block query i sits at anchor + i: context positions > anchor + i - W.

Both agree while the committed context is shorter than the window (DFlash2: W + 1 tokens;
the assistant: W - 1 tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

from dspark_convert.runtime.dflash2 import DFlash2Drafter
from dspark_convert.runtime.gemma4_assistant import SLIDING, Gemma4Assistant, clean_shared_kv
from dspark_convert.runtime.layers import attention, linear, split_heads
from dspark_convert.runtime.qwen3 import KVCache

Window = Literal["reference", "llama.cpp"]
WINDOWS: tuple[str, ...] = ("reference", "llama.cpp")


def _check_window(window: str) -> None:
    if window not in WINDOWS:
        raise ValueError(f"window: expected one of {WINDOWS}, found {window!r}")


# --- DFlash2 --------------------------------------------------------------------------------

class _PerQueryWindow(DFlash2Drafter):
    """DFlash2Drafter whose sliding layers give block query i the context positions
    > anchor + i - W (llama.cpp's standard window), not >= anchor - W."""

    def _attend(self, layer, drafter, q, k, v):
        window = self.config.window(layer)
        if window is None or drafter.ctx_keys[layer] is None:
            return super()._attend(layer, drafter, q, k, v)
        anchor = drafter.length
        rows = []
        for i in range(q.shape[1]):
            first = max(0, anchor + i - window + 1)
            ks = torch.cat([drafter.ctx_keys[layer][:, first:], k], dim=1)
            vs = torch.cat([drafter.ctx_values[layer][:, first:], v], dim=1)
            rows.append(attention(q[:, i:i + 1], ks, vs, causal_offset=None))
        return torch.cat(rows, dim=0)


def _as(cls, obj):
    view = object.__new__(cls)
    view.__dict__.update(obj.__dict__)
    return view


@torch.inference_mode()
def dflash2_drafts(target, drafter: DFlash2Drafter, context: Sequence[int], anchor: int, *,
                   window: Window = "reference") -> list[int]:
    """The B - 1 drafts of ``drafter`` (bound to ``target``) for ``anchor`` after the
    committed ``context``: the target's tapped hidden states of the context as its cells,
    the block [anchor, MASK ...] at positions len(context) .., the selector's greedy walk."""
    _check_window(window)
    d = drafter if window == "reference" else _as(_PerQueryWindow, drafter)
    d.reset()
    if context:
        cache = KVCache()
        out = target.forward(torch.tensor(list(context), dtype=torch.long, device=target.device),
                             cache, keep=d.hidden_state_indices)
        d.add_context(d.features(out.hidden_states))
    return d.propose(anchor).tokens.tolist()


# --- the Gemma 4 assistant ------------------------------------------------------------------

class _Windowed(Gemma4Assistant):
    """Gemma4Assistant whose sliding layers see the last ``entries`` shared KV entries."""

    entries: int

    def _attend(self, i, x, position, shared):
        layer, p = self.spec.layers[i], f"model.layers.{i}.self_attn."
        if layer.kind != SLIDING:
            return super()._attend(i, x, position, shared)
        from dspark_convert.runtime.gemma4 import gemma_norm

        q = split_heads(linear(x, self.w[p + "q_proj.weight"]),
                        self.spec.text.num_attention_heads, layer.head_dim)
        q = self.ropes[i].apply(gemma_norm(q, self.w[p + "q_norm.weight"], self.eps), position)
        keys, values = shared.kv[layer.kind]
        keys, values = keys[:, -self.entries:], values[:, -self.entries:]
        return attention(q, keys, values, causal_offset=None, scale=1.0)


def sliding_entries(assistant: Gemma4Assistant, window: Window) -> int:
    """How many shared KV entries before the anchor a sliding layer sees: W + 1
    (transformers) or W - 1 (llama.cpp: positions p - W + 1 .. p - 1)."""
    _check_window(window)
    return assistant.window + 1 if window == "reference" else assistant.window - 1


@torch.inference_mode()
def assistant_drafts(target, assistant: Gemma4Assistant, context: Sequence[int], anchor: int,
                     count: int, *, window: Window = "llama.cpp") -> list[int]:
    """``count`` greedy drafts of ``assistant`` for ``anchor`` after the committed
    ``context`` (at least one token): the target's KV of the context (committed positions
    only, as llama.cpp keeps it), h = the target's post-final-norm hidden state of the
    context's last token, every step at the anchor's position."""
    _check_window(window)
    if not context:
        raise ValueError("context: expected at least one committed token (h is the target's "
                         "hidden state of the last one)")
    a = _as(_Windowed, assistant)
    a.entries = sliding_entries(assistant, window)
    cache = KVCache()
    final = (target.config.num_hidden_layers,)
    out = target.forward(torch.tensor(list(context), dtype=torch.long, device=target.device),
                         cache, keep=final)
    shared = clean_shared_kv(cache, assistant.kv_layers, len(context))
    tokens, _ = a.draft(anchor, out.hidden_states[-1][-1], len(context), shared, count)
    return tokens


@torch.inference_mode()
def target_greedy(target, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
    """The prompt and the target's greedy continuation of ``max_new_tokens`` tokens (one
    token at a time, the cache kept): the sequence a lossless engine commits."""
    cache = KVCache()
    ids = list(prompt)
    out = target.forward(torch.tensor(ids, dtype=torch.long, device=target.device), cache)
    for _ in range(max_new_tokens):
        ids.append(int(out.logits[-1].argmax()))
        out = target.forward(torch.tensor([ids[-1]], dtype=torch.long, device=target.device),
                             cache)
    return ids


def acceptance_lengths(propose, sequence: Sequence[int], prompt_tokens: int) -> list[int]:
    """accepted + 1 per cycle of a greedy speculative run over ``sequence`` (the prompt and
    the target's greedy continuation: a lossless run commits exactly it), drafting as
    llama.cpp does: the first anchor is the prompt's last token, each cycle's drafts
    ``propose(context, anchor)`` are accepted while they are the sequence's next tokens,
    and the token after them is the next anchor. The last cycle is cut at the sequence's
    end."""
    seq = list(sequence)
    out, at = [], prompt_tokens - 1
    while at + 1 < len(seq):
        drafts = propose(tuple(seq[:at]), seq[at])
        accepted = 0
        while (accepted < len(drafts) and at + 1 + accepted < len(seq)
               and drafts[accepted] == seq[at + 1 + accepted]):
            accepted += 1
        out.append(accepted + 1)
        at += accepted + 1
    return out


class AssistantProposer:
    """evaluation/proposals.py's proposer for a Gemma 4 assistant (what conform's one check,
    ``check_lines``, asks of the reference): ``propose(context, anchor)`` gives the
    ``count`` greedy drafts for that committed context under ``window``, and ``logits``
    [count, V] the logits of each step (the margin of a difference)."""

    def __init__(self, target, assistant: Gemma4Assistant, count: int, *,
                 window: Window = "llama.cpp") -> None:
        _check_window(window)
        self.target, self.assistant, self.count, self.window = target, assistant, count, window
        self.logits = None
        self.proposals = 0

    @torch.inference_mode()
    def propose(self, context: Sequence[int], anchor: int) -> tuple[int, ...]:
        context = [int(t) for t in context]
        if not context:
            raise ValueError("context: expected at least one committed token")
        a = _as(_Windowed, self.assistant)
        a.entries = sliding_entries(self.assistant, self.window)
        cache = KVCache()
        target = self.target
        out = target.forward(torch.tensor(list(context), dtype=torch.long, device=target.device),
                             cache, keep=(target.config.num_hidden_layers,))
        shared = clean_shared_kv(cache, self.assistant.kv_layers, len(context))
        h, token = out.hidden_states[-1][-1], int(anchor)
        tokens, rows = [], []
        for _ in range(self.count):
            step = a.step(token, h, len(context), shared)
            logits = step.logits[0]
            token = int(logits.argmax())
            tokens.append(token)
            rows.append(logits)
            h = step.projected_hidden
        self.logits = torch.stack(rows) if rows else None
        self.proposals += 1
        return tuple(tokens)
