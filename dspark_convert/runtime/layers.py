"""The Qwen3 building blocks shared by the target and the drafter, batch 1.

They follow Hugging Face's Qwen3 arithmetic (RMSNorm in float32, default RoPE with
``inv_freq = 1 / theta^(2i/d)`` and the rotate-half layout, SiLU-gated MLP, attention scale
``d^-0.5``) so that the drafter sees the same hidden states DeepSpec trained it on.
Tensors are laid out ``[tokens, features]``; attention works on ``[heads, tokens, d]``.

In the compute dtype (float32, or bfloat16 as the engines run), with HF's two upcasts:
the RMS statistic is taken in float32 and the normalised value cast back before the
weight multiplies it (``Qwen3RMSNorm``), and the RoPE tables are computed in float32 and
cast to the compute dtype (``Qwen3RotaryEmbedding``). In float32 both casts are no-ops,
so the float32 path computes exactly what it did before bfloat16 existed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _wide(dtype: torch.dtype) -> torch.dtype:
    """float32, or float64 when computing in float64 (the tests' exact reference)."""
    return torch.promote_types(dtype, torch.float32)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    wide = x.to(_wide(x.dtype))
    return weight * (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    # weight is torch order [out, in], as in nn.Linear
    return F.linear(x, weight, bias)


def mlp(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    return linear(F.silu(linear(x, gate)) * linear(x, up), down)


class Rope:
    """cos/sin tables of the default RoPE, grown on demand: computed in float32 (float64
    for a float64 model) and stored in the compute dtype.

    ``rotated_pairs``: transformers' *proportional* RoPE (Gemma4's full attention): only
    the first n frequencies ``theta^(-2i/head_dim)`` (the denominator stays head_dim), the
    other ``head_dim/2 - n`` are zero, so their pairs (i, i + head_dim/2) pass unchanged
    (cos 1, sin 0). None: every pair rotates (the default RoPE)."""

    def __init__(self, head_dim: int, theta: float, device: torch.device,
                 dtype: torch.dtype = torch.float32, *, rotated_pairs: int | None = None) -> None:
        self.table_dtype = _wide(dtype)
        exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).to(self.table_dtype) / head_dim
        inv_freq = 1.0 / (theta ** exponent)
        if rotated_pairs is not None:
            inv_freq[rotated_pairs:] = 0.0
        self.inv_freq = inv_freq.to(device)
        self.device, self.dtype = device, dtype
        self._cos = torch.empty(0, head_dim, device=device, dtype=dtype)
        self._sin = torch.empty(0, head_dim, device=device, dtype=dtype)

    def _grow(self, length: int) -> None:
        positions = torch.arange(length, device=self.device, dtype=self.table_dtype)
        freqs = positions[:, None] * self.inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        self._cos, self._sin = emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    def apply(self, x: torch.Tensor, start: int | torch.Tensor) -> torch.Tensor:
        """Rotate ``x`` [heads, tokens, d] whose tokens sit at positions start, start+1, ...
        or, ``start`` a tensor [tokens] of positions, at those (the packed rows of several
        requests, runtime/serving.py). The same table rows either way, so the same values."""
        if isinstance(start, torch.Tensor):
            end = int(start.max()) + 1 if start.numel() else 0
        else:
            end = start + x.shape[-2]
        if end > self._cos.shape[0]:
            self._grow(max(end, 2 * self._cos.shape[0], 64))
        if isinstance(start, torch.Tensor):
            cos, sin = self._cos[start], self._sin[start]
        else:
            cos, sin = self._cos[start:end], self._sin[start:end]
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal_offset: int | None,
              scale: float | None = None, window: int | None = None) -> torch.Tensor:
    """Scaled dot-product attention with grouped KV heads.

    q [nh, S, d], k/v [nkv, T, d]. ``causal_offset=None``: every query sees every key (the
    drafter's non-causal block). Otherwise query i sits at position ``causal_offset + i`` and
    sees keys 0..causal_offset+i (the target's causal attention over its cache); with
    ``window`` only the last ``window`` of them (transformers' sliding-window overlay:
    key j is seen by query p when j > p - window). ``scale``: d^-0.5 when None (Qwen3);
    Gemma4 uses 1.0 (its q and k are RMS-normed per head).
    Returns [S, nh*d].
    """
    groups = q.shape[0] // k.shape[0]
    if groups > 1:
        k = k.repeat_interleave(groups, dim=0)
        v = v.repeat_interleave(groups, dim=0)
    mask = None
    if causal_offset is not None:
        q_pos = torch.arange(q.shape[1], device=q.device)[:, None] + causal_offset
        k_pos = torch.arange(k.shape[1], device=q.device)[None, :]
        mask = k_pos <= q_pos
        if window is not None:
            mask &= k_pos > q_pos - window
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return out.transpose(0, 1).reshape(q.shape[1], -1)


def packed_positions(starts, lengths, device: torch.device) -> int | torch.Tensor:
    """Where packed rows sit: one segment, its start (Rope's slice: the batch-1 path
    unchanged); several, every row's position (Rope.apply takes either)."""
    if len(starts) == 1:
        return starts[0]
    return torch.cat([torch.arange(s, s + n, device=device) for s, n in zip(starts, lengths)])


def split_rows(x: torch.Tensor, lengths, dim: int = 1) -> tuple[torch.Tensor, ...]:
    """Per packed segment, its rows of ``x`` along ``dim`` (one segment: ``x`` itself)."""
    return (x,) if len(lengths) == 1 else x.split(list(lengths), dim=dim)


class Packed:
    """Several requests' new tokens run as one forward (runtime/serving.py): their rows
    concatenated, so that every linear layer is one GEMM over all of them, while each
    segment attends only to its own KV cache (``attend``). One segment is the batch-1
    forward itself: the same tensors, the same kernels, the same values."""

    def __init__(self, segments, device: torch.device) -> None:
        self.ids = [ids for ids, _ in segments]
        self.caches = [cache for _, cache in segments]
        self.lengths = [len(ids) for ids in self.ids]
        self.starts = [cache.length for cache in self.caches]   # before this forward appends
        self.rows = self.ids[0] if len(self.ids) == 1 else torch.cat(self.ids)
        self.where = packed_positions(self.starts, self.lengths, device)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               attend) -> torch.Tensor:
        """Append each segment's k, v [nkv, n, d] to its cache and run ``attend(q, keys,
        values, start)`` per segment; the outputs [n, nh*d] back in row order."""
        out = []
        for cache, start, qs, ks, vs in zip(self.caches, self.starts, split_rows(q, self.lengths),
                                            split_rows(k, self.lengths), split_rows(v, self.lengths)):
            keys, values = cache.append(layer, ks, vs)
            out.append(attend(qs, keys, values, start))
        return out[0] if len(out) == 1 else torch.cat(out)

    def split(self, rows: torch.Tensor | None) -> list[torch.Tensor | None]:
        """Per segment, its rows of ``rows`` [sum n, ...] (None stays None)."""
        if rows is None:
            return [None] * len(self.ids)
        return list(split_rows(rows, self.lengths, dim=0))

    def last_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """Each segment's last row, [segments, ...]."""
        if len(self.ids) == 1:
            return rows[-1:]
        ends = torch.tensor(self.lengths, device=rows.device).cumsum(0) - 1
        return rows[ends]


def split_heads(x: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """[tokens, heads*d] -> [heads, tokens, d]"""
    return x.view(x.shape[0], heads, head_dim).transpose(0, 1)
