"""The DSpark drafter of docs/REFERENCE.md §2, built only from the artifact.

State: per draft layer, the keys (after RoPE) and values of every committed context cell.
A context cell at position p is the target's fused features at p:
``Hc = hidden_norm(fc(concat(taps)))``, shared by every layer, projected by each layer's
``k_proj``/``k_norm``/RoPE and ``v_proj`` (no layer norm: DeepSpec feeds ``Hc`` to the
projections directly). A proposal runs the block ``[anchor, MASK x (B-1)]`` at positions
``start .. start+B-1`` through the layers with NON-causal attention over all context cells
and all block rows, then the Markov stage and the confidence head. Query j predicts the
token at ``start+1+j`` (anchor first). Block rows are never cached.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dspark_convert.runtime.layers import (Rope, attention, linear, mlp, packed_positions,
                                           rms_norm, split_heads, split_rows)
from dspark_convert.runtime.sampling import pick, probs_from_logits, require_finite
from dspark_convert.runtime.weights import DrafterWeights


# How a refusal names the drafter's logits (runtime/sampling.py: NumericOverflowError).
DRAFTER_LOGITS = "the drafter's logits"


@dataclass(frozen=True)
class Proposal:
    """One proposal. ``length`` (L) is the number of draft tokens sent to the target after
    the confidence cut; the full-block tensors are kept for parity checks."""

    block_hidden: torch.Tensor              # [B, H], after the final norm
    base_logits: torch.Tensor               # [B, V], lm_head(block_hidden) (Gemma4: softcapped)
    corrected_logits: torch.Tensor          # [B, V], after the Markov head
    tokens: torch.Tensor                    # [B] int64, the sequentially drafted tokens
    confidence_logits: torch.Tensor | None  # [B], or None without a confidence head
    length: int

    def draft_probs(self, temperature: float) -> torch.Tensor:
        """q_i over the vocabulary for the L proposed tokens (one-hot at temperature 0)."""
        return probs_from_logits(self.corrected_logits[: self.length], temperature,
                                 what=DRAFTER_LOGITS)


class DSparkDrafter:
    def __init__(self, weights: DrafterWeights, *, embed: torch.Tensor, lm_head: torch.Tensor,
                 device: torch.device,
                 confidence_temperatures: Sequence[float] | None = None) -> None:
        c = weights.contract
        g = c.geometry
        self.contract = c
        self.w = weights.tensors
        self.embed, self.lm_head = embed, lm_head
        self.eps = g.rms_norm_eps
        self.layers = g.num_draft_layers
        self.heads, self.kv_heads, self.head_dim = g.num_attention_heads, g.num_key_value_heads, g.head_dim
        self.block_size = c.block.block_size
        self.mask_token_id = c.block.mask_token_id
        self.markov = c.markov_head.type            # none, vanilla, gated, rnn
        self.confidence = c.confidence_head.enabled
        self.confidence_with_markov = c.confidence_head.with_markov
        self.hidden_state_indices = list(c.taps.hidden_state_indices)
        self.dtype = embed.dtype           # the compute dtype, the target's
        self.device = device
        self.rope = self._rope(c, device)
        self._setup(c, device)
        # A calibration (Sequential Temperature Scaling, calibration.json): one temperature
        # per draft position, applied to the confidence logits before the threshold's
        # sigmoid. None: the raw head, as DeepSpec cuts.
        self.confidence_temperatures = None
        if confidence_temperatures is not None:
            temps = [float(t) for t in confidence_temperatures]
            if len(temps) != self.block_size or not all(t > 0 and math.isfinite(t) for t in temps):
                raise ValueError(f"confidence temperatures: expected {self.block_size} positive "
                                 f"finite numbers, found {temps}")
            self.confidence_temperatures = torch.tensor(temps, dtype=torch.float64, device=device)
        self.reset()

    # What a family's backbone changes (runtime/gemma4.py overrides them): its RoPE, what
    # else it reads from the contract, its RMS norm, the backbone and the base logits.
    def _rope(self, contract, device: torch.device) -> Rope:
        g = contract.geometry
        return Rope(g.head_dim, g.rope_theta, device, self.dtype)

    def _setup(self, contract, device: torch.device) -> None:
        return None

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, weight, self.eps)

    def base_logits(self, hb: torch.Tensor) -> torch.Tensor:
        """U = lm_head(hb), before the Markov stage."""
        return linear(hb, self.lm_head)

    def reset(self) -> None:
        self.ctx_keys: list[torch.Tensor | None] = [None] * self.layers
        self.ctx_values: list[torch.Tensor | None] = [None] * self.layers
        self.length = 0   # committed context cells = the next context position

    def features(self, hidden_states: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """feat(hs) = concat of hs[id+1] for each tap (DeepSpec's extract_context_feature)."""
        return torch.cat([hidden_states[i] for i in self.hidden_state_indices], dim=-1)

    def fork(self) -> DSparkDrafter:
        """A drafter over the same weights with a context of its own (empty): one per
        request in flight (runtime/serving.py). The weights, RoPE tables and calibration
        are shared, never copied."""
        clone = copy.copy(self)
        clone.reset()
        return clone

    @torch.inference_mode()
    def fused_context(self, features: torch.Tensor) -> torch.Tensor:
        """Hc = hidden_norm(fc(features)), [n, H]."""
        return self._norm(linear(features, self.w["fc.weight"]), self.w["hidden_norm.weight"])

    @torch.inference_mode()
    def add_context(self, features: torch.Tensor) -> None:
        """Commit context cells for positions self.length, self.length+1, ... ([n, m*H])."""
        self.add_context_packed([features], [self])

    @torch.inference_mode()
    def add_context_packed(self, features: Sequence[torch.Tensor],
                           drafters: Sequence[DSparkDrafter]) -> None:
        """``add_context`` of several requests at once: drafters[i] (forks of this one)
        commits features[i]; one fc and one k/v projection per layer over all their rows."""
        lengths = [f.shape[0] for f in features]
        hc = self.fused_context(features[0] if len(features) == 1 else torch.cat(features))
        where = packed_positions([d.length for d in drafters], lengths, self.device)
        for i in range(self.layers):
            k, v = self._kv(i, hc, where)
            for d, ks, vs in zip(drafters, split_rows(k, lengths), split_rows(v, lengths)):
                if d.ctx_keys[i] is None:
                    d.ctx_keys[i], d.ctx_values[i] = ks, vs
                else:
                    d.ctx_keys[i] = torch.cat([d.ctx_keys[i], ks], dim=1)
                    d.ctx_values[i] = torch.cat([d.ctx_values[i], vs], dim=1)
        for d, n in zip(drafters, lengths):
            d.length += n

    def crop(self, length: int) -> None:
        """Keep the first ``length`` context cells (positions 0 .. length-1), as
        ``KVCache.crop`` keeps the target's: a context that shares only a prefix with the
        committed one continues from there (`dspark conform`: evaluation/proposals.py)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"crop to {length} context cells: expected 0..{self.length}")
        if length == 0:
            self.reset()
            return
        self.ctx_keys = [k[:, :length] for k in self.ctx_keys]
        self.ctx_values = [v[:, :length] for v in self.ctx_values]
        self.length = length

    def _kv(self, layer: int, x: torch.Tensor, start: int | torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor]:
        p = f"layers.{layer}.self_attn."
        k = split_heads(linear(x, self.w[p + "k_proj.weight"]), self.kv_heads, self.head_dim)
        k = self.rope.apply(rms_norm(k, self.w[p + "k_norm.weight"], self.eps), start)
        v = split_heads(linear(x, self.w[p + "v_proj.weight"]), self.kv_heads, self.head_dim)
        return k, v

    def _block_start(self, drafter: DSparkDrafter) -> int:
        """The position of a drafter's block's first row (the anchor): right after its
        context cells. A seam for runtime/misreadings.py (a block seeded one early)."""
        return drafter.length

    # The backbone's family hooks (runtime/gemma4.py overrides them): the block's input
    # rows, attention over context and block, and the rest of a layer once attention gave a.
    def _embed_rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed[ids]

    def _block_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attention(q, k, v, causal_offset=None)

    def _layer_rest(self, h: torch.Tensor, a: torch.Tensor, p: str) -> torch.Tensor:
        w = self.w
        h = h + linear(a, w[p + "self_attn.o_proj.weight"])
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"], self.eps)
        return h + mlp(x, w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"],
                       w[p + "mlp.down_proj.weight"])

    @torch.inference_mode()
    def block_hidden(self, anchor: int, *, stages: dict | None = None) -> torch.Tensor:
        """The backbone over [anchor, MASK...] at positions self.length .. +B-1; [B, H].
        ``stages`` (a dict) receives the first-block stages DeepSpec's Gemma4 fixtures
        record (noise_embedding, layer_out.i)."""
        return self.block_hidden_packed([anchor], [self], stages=stages)[0]

    @torch.inference_mode()
    def block_hidden_packed(self, anchors: Sequence[int], drafters: Sequence[DSparkDrafter], *,
                            stages: dict | None = None) -> list[torch.Tensor]:
        """``block_hidden`` of several requests at once: drafters[i] (forks of this one)
        with anchors[i]; every linear layer over all R*B rows, attention per request over
        its own context cells and its own block (no request sees another's)."""
        w, B = self.w, self.block_size
        lengths = [B] * len(anchors)
        ids = torch.full((B * len(anchors),), self.mask_token_id, dtype=torch.long,
                         device=self.device)
        ids[::B] = torch.tensor(list(anchors), dtype=torch.long, device=self.device)
        where = packed_positions([self._block_start(d) for d in drafters], lengths, self.device)
        h = self._embed_rows(ids)
        if stages is not None:
            stages["noise_embedding"] = h
        for i in range(self.layers):
            p = f"layers.{i}."
            x = self._norm(h, w[p + "input_layernorm.weight"])
            q = split_heads(linear(x, w[p + "self_attn.q_proj.weight"]), self.heads, self.head_dim)
            q = self.rope.apply(self._norm(q, w[p + "self_attn.q_norm.weight"]), where)
            k, v = self._kv(i, x, where)
            out = []
            for d, qs, ks, vs in zip(drafters, split_rows(q, lengths), split_rows(k, lengths),
                                     split_rows(v, lengths)):
                if d.ctx_keys[i] is not None:
                    ks = torch.cat([d.ctx_keys[i], ks], dim=1)
                    vs = torch.cat([d.ctx_values[i], vs], dim=1)
                out.append(self._block_attention(qs, ks, vs))
            h = self._layer_rest(h, out[0] if len(out) == 1 else torch.cat(out), p)
            if stages is not None:
                stages[f"layer_out.{i}"] = h
        return list(split_rows(self._norm(h, w["norm.weight"]), lengths, dim=0))

    def _markov_bias(self, prev: int, hb_k: torch.Tensor, state: torch.Tensor | None
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The Markov correction added to U[k], and the rnn head's new state."""
        w = self.w
        e = w["markov_head.markov_w1.weight"][prev]
        w2 = w["markov_head.markov_w2.weight"]
        if self.markov == "vanilla":
            return linear(e, w2), None
        if self.markov == "gated":
            gate = torch.sigmoid(linear(torch.cat([hb_k, e]), w["markov_head.gate_proj.weight"],
                                        w["markov_head.gate_proj.bias"]))
            return linear(gate * e, w2), None
        # rnn: [s; W1[prev]; h_k] -> gate, candidate, output
        a, c, o = linear(torch.cat([state, e, hb_k]), w["markov_head.joint_proj.weight"],
                         w["markov_head.joint_proj.bias"]).chunk(3)
        gate = torch.sigmoid(a)
        state = gate * state + (1.0 - gate) * torch.tanh(c)
        return linear(torch.tanh(o), w2), state

    @torch.inference_mode()
    def propose(self, anchor: int, *, temperature: float = 0.0, confidence_threshold: float = 0.0,
                generator: torch.Generator | None = None) -> Proposal:
        return self.propose_from(anchor, self.block_hidden(anchor), temperature=temperature,
                                 confidence_threshold=confidence_threshold, generator=generator)

    @torch.inference_mode()
    def propose_from(self, anchor: int, hb: torch.Tensor, *, temperature: float = 0.0,
                     confidence_threshold: float = 0.0,
                     generator: torch.Generator | None = None) -> Proposal:
        """The proposal from the block's hidden states ``hb`` [B, H] (``block_hidden``, or
        one request's part of ``block_hidden_packed``): the Markov stage's sequential
        walk, drawing from ``generator``, and the confidence head."""
        base = self.base_logits(hb)
        B = self.block_size
        tokens: list[int] = []
        if self.markov == "none":
            corrected = base
            tokens = [pick(base[k], temperature, generator, what=DRAFTER_LOGITS)
                      for k in range(B)]
        else:
            rows = []
            prev = anchor
            state = torch.zeros(self.contract.markov_head.rank, device=self.device,
                                dtype=self.dtype) if self.markov == "rnn" else None
            for k in range(B):
                bias, state = self._markov_bias(prev, hb[k], state)
                z = base[k] + bias
                rows.append(z)
                prev = pick(z, temperature, generator, what=DRAFTER_LOGITS)
                tokens.append(prev)
            corrected = torch.stack(rows)
        token_tensor = torch.tensor(tokens, dtype=torch.long, device=self.device)

        conf = None
        length = B
        if self.confidence:
            features = hb
            if self.confidence_with_markov:
                prev_ids = torch.cat([token_tensor.new_tensor([anchor]), token_tensor[:-1]])
                features = torch.cat([hb, self.w["markov_head.markov_w1.weight"][prev_ids]], dim=-1)
            conf = linear(features, self.w["confidence_head.proj.weight"],
                          self.w["confidence_head.proj.bias"])[:, 0]
            require_finite(conf, "the drafter's confidence logits")
            if confidence_threshold > 0.0:
                length = self.confidence_cut(conf, confidence_threshold)
        # The raw confidence logits (uncalibrated) are what the proposal and a trace keep.
        return Proposal(block_hidden=hb, base_logits=base, corrected_logits=corrected,
                        tokens=token_tensor, confidence_logits=conf, length=length)

    def confidence_cut(self, conf: torch.Tensor, threshold: float) -> int:
        """The static cutoff: the first position k whose step confidence is below
        ``threshold``, else the whole block. Raw: sigmoid(cl_k) in the logits' dtype, as
        DeepSpec cuts. Calibrated: sigmoid(cl_k / T_k) in float64, the arithmetic
        evaluation/calibration.py ``cut_length`` does on a trace's logits, so that the
        report's cut can be predicted from what it records."""
        below = (self.step_confidences(conf) < threshold).nonzero()
        return int(below[0, 0]) if below.numel() else len(conf)

    def step_confidences(self, conf: torch.Tensor) -> torch.Tensor:
        """c_k, the probability that draft token k is accepted given the ones before it, as
        the cut sees it: sigmoid(cl_k) in the logits' dtype (raw), or sigmoid(cl_k / T_k)
        in float64 (calibrated). A scheduler's view (runtime/serving.py) is these values."""
        if self.confidence_temperatures is None:
            return torch.sigmoid(conf)
        return torch.sigmoid(conf.to(torch.float64) / self.confidence_temperatures)

