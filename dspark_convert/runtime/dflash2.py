"""speculators' DFlash2 drafter in the reference runtime (docs/REFERENCE.md, "DFlash2").

Read from its speculators checkpoint directory (config.json through contract/dflash2.py,
model.safetensors through formats/safetensors.py; no speculators or transformers import) or
from a DFlash2 artifact (`dspark convert DIR --target T`: drafter.gguf, whose metadata is
read back as the speculators config it stands for; runtime/artifact_plan.py), bound to a
Qwen3 target (runtime/qwen3.py) whose embedding and head it uses, as speculators'
``load_verifier_weights`` rebuilds them from the verifier.

Loading, for other commands: ``plan_drafter(path)`` (a source or artifact directory; no
tensor byte read) and ``load_drafter(plan_or_path, target)`` (the drafter bound to a loaded
``runtime.qwen3.Qwen3Target``); ``commands/binding.bind(artifact, target)`` validates an
artifact against its target first and its ``drafter_plan`` is this module's plan.

The backbone is DFlash's (runtime/drafter.py: the same context cells ``hidden_norm(fc(taps))``
projected by each layer's k_proj / k_norm / RoPE and v_proj at the context positions, the
same block ``[anchor, MASK x (B-1)]`` at positions anchor .. anchor+B-1), with what DFlash2
adds (speculators/models/dflash2/model_definitions.py):

- around each sublayer a block-local two-tap grouped convolution (``GroupedDynamicCausalConv``,
  :105-172): ``kernel_projection`` of the normalised sublayer input gives, per row, a
  coefficient per (side, tap, channel group); side 0 convolves that input (``prepare``), side
  1 the sublayer's output (``finish``): out[t, c] = sum over taps of (base_kernel[side, tap, c]
  + dyn[t, side, tap, c // g]) * in[t - tap, c], a tap reaching before the block's slot 0
  giving 0 (:47-102). Queries and the block's keys and values come from the convolved input;
  the context cells are never convolved;
- per layer type (dflash/attention.py:7-100): a ``sliding_attention`` layer sees the context
  positions in [anchor - W, anchor), a full one every context position; the block sees all
  of itself (block-causal on sliding layers only when ``sliding_window_non_causal`` is false);
- the candidate selector (:243-316): the unary logits ``lm_head(norm(h))``, unscaled, their
  top-K candidates per slot, each scored unary + sum_r predecessor_codebook[pred, r] *
  hidden_projection(h)[r] * successor_codebook[cand, r]; the greedy walk from the anchor
  takes each slot's best-scored candidate, which becomes the next slot's predecessor
  (slot 1's is the anchor). Slot 0 is the anchor itself: B - 1 drafts.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from dspark_convert.artifact.format import dflash2_config_view
from dspark_convert.contract.dflash2 import FAMILY as DFLASH2_FAMILY
from dspark_convert.contract.dflash2 import (NEVER_SAVED, DFlash2Config, parse_config,
                                            read_config, tensor_shapes)
from dspark_convert.runtime.artifact_plan import artifact_truncated, is_artifact, open_artifact
from dspark_convert.errors import DFlash2RunError
from dspark_convert.formats.safetensors import read_checkpoint
from dspark_convert.runtime.drafter import DRAFTER_LOGITS, DSparkDrafter
from dspark_convert.runtime.layers import (Rope, attention, linear, mlp, packed_positions,
                                           split_heads, split_rows)
from dspark_convert.runtime.loading import (StoredModel, TensorLoader, source_tensors,
                                            source_truncated)
from dspark_convert.runtime.sampling import require_finite

SELECTOR = "candidate_selector."
SELECTOR_SCORES = "the drafter's selector scores"


# --- the checkpoint ---------------------------------------------------------------------

@dataclass(frozen=True)
class DFlash2Plan(StoredModel):
    """A DFlash2 checkpoint checked from config.json and its safetensors headers, or a
    DFlash2 artifact from its drafter.gguf header (no tensor byte read): where each tensor
    is, by speculators' names, in tensor_shapes' order."""

    directory: Path
    config: DFlash2Config
    from_artifact: bool = False


@dataclass(frozen=True)
class DFlash2Weights:
    config: DFlash2Config
    tensors: dict[str, torch.Tensor]      # by speculators' names, compute dtype, on device


def plan_drafter(directory: str | os.PathLike, *, gguf=None) -> DFlash2Plan:
    """A source checkpoint: config.json (150 when it is not a DFlash2 config the runtime
    computes) and the headers: every tensor of the table present, of its shape and a float
    dtype the loader reads (20, 22, 23), none other (21: speculators never saves the
    embedding or the head). An artifact directory (drafter.gguf, `dspark convert`'s): its
    metadata read back as the speculators config it stands for, its tensors checked against
    the contract (runtime/artifact_plan.py; 156 for an artifact of another kind); ``gguf``:
    the file as validate parsed it."""
    directory = Path(directory)
    if is_artifact(directory):
        opened = open_artifact(directory, DFLASH2_FAMILY, gguf=gguf)
        view, _ = dflash2_config_view(opened.metadata, path=str(opened.path))
        cfg = parse_config(view, path=f"{opened.path} (as config.json)")
        return DFlash2Plan(directory=directory, config=cfg, tensors=opened.tensors,
                           from_artifact=True)
    cfg = read_config(directory)
    entries = read_checkpoint(directory).tensors
    tensors = source_tensors(
        entries, tensor_shapes(cfg), directory,
        unexpected=lambda name: "is not a DFlash2 tensor" + (
            " (speculators never saves it: the runtime takes it from the target)"
            if name in NEVER_SAVED else ""))
    return DFlash2Plan(directory=directory, config=cfg, tensors=tensors)


def load_weights(plan: DFlash2Plan, *, device: torch.device,
                 dtype: torch.dtype) -> DFlash2Weights:
    """Every tensor of the plan, once, in ``dtype`` on ``device``."""
    truncated = artifact_truncated if plan.from_artifact else source_truncated
    with TensorLoader(device=device, dtype=dtype, truncated=truncated) as loader:
        tensors = {name: loader.load(spec) for name, spec in plan.tensors.items()}
    return DFlash2Weights(config=plan.config, tensors=tensors)


def check_target(cfg: DFlash2Config, target_config, *, path: str) -> None:
    """The target must give what the drafter reads (151): every tapped hidden state (HF's
    hidden_states has num_hidden_layers + 1 entries), the hidden size fc reads (m x H) and
    the vocabulary the selector's codebooks index (speculators' verifier vocabulary)."""
    n = target_config.num_hidden_layers
    for i, index in enumerate(cfg.aux_hidden_state_layer_ids):
        if index > n:
            raise DFlash2RunError(
                f"{path}: field 'aux_hidden_state_layer_ids[{i}]': expected a hidden-state "
                f"index in [0, {n}] (the target has {n} layers), found {index}", path=path,
                field=f"aux_hidden_state_layer_ids[{i}]", expected=f"0..{n}", found=index)
    for field, mine, theirs in (("hidden_size", cfg.hidden_size, target_config.hidden_size),
                                ("vocab_size", cfg.vocab_size, target_config.vocab_size)):
        if mine != theirs:
            raise DFlash2RunError(
                f"{path}: field 'transformer_layer_config.{field}': expected the target's "
                f"{theirs}, found {mine}", path=path, field=f"transformer_layer_config.{field}",
                expected=theirs, found=mine)


def load_drafter(plan_or_path: DFlash2Plan | str | os.PathLike, target) -> DFlash2Drafter:
    """The drafter bound to ``target`` (runtime/qwen3.Qwen3Target): a plan (plan_drafter's,
    or commands/binding.Binding.drafter_plan), or a source checkpoint or artifact directory
    planned here; checked against the target before any tensor byte is read, loaded in the
    target's dtype and device."""
    plan = (plan_or_path if isinstance(plan_or_path, DFlash2Plan)
            else plan_drafter(plan_or_path))
    where = plan.directory / ("drafter.gguf" if plan.from_artifact else "config.json")
    check_target(plan.config, target.config, path=str(where))
    weights = load_weights(plan, device=target.device, dtype=target.dtype)
    return DFlash2Drafter(weights, embed=target.embed, lm_head=target.lm_head,
                          device=target.device)


# --- the drafter ------------------------------------------------------------------------

@dataclass(frozen=True)
class DFlash2Proposal:
    """One block's proposal: B - 1 drafts (slot 0 is the anchor), and what chose them."""

    block_hidden: torch.Tensor        # [B, H], after the final norm
    unary_logits: torch.Tensor        # [B, V], lm_head(block_hidden); slot 0 is not drafted
    hidden_projection: torch.Tensor   # [B-1, R], the selector's hidden_projection of slots 1..
    candidates: torch.Tensor          # [B-1, K] int64, the unary top-K, unary-descending
    scores: torch.Tensor              # [B-1, K], unary + transition, given the walk's predecessor
    chosen_index: torch.Tensor        # [B-1] int64, the argmax of each slot's scores
    tokens: torch.Tensor              # [B-1] int64, candidates[i, chosen_index[i]]


def grouped_conv(x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, block_size: int,
                 group_size: int) -> torch.Tensor:
    """speculators' grouped_dynamic_conv on rows that are whole blocks: x [n*B, H], delta
    [n*B, k, G] (each row's coefficient per tap and group), base [k, H]. A tap reaching
    before its block's slot 0 reads 0. Summed tap by tap, as speculators sums."""
    rows, hidden = x.shape
    blocks = x.view(rows // block_size, block_size, hidden)
    out = torch.zeros_like(blocks)
    for tap in range(base.shape[0]):
        shifted = blocks if tap == 0 else torch.nn.functional.pad(blocks[:, :-tap],
                                                                  (0, 0, tap, 0))
        coefficient = base[tap] + delta[:, tap].repeat_interleave(group_size, dim=-1).view(
            blocks.shape)
        out = out + shifted * coefficient
    return out.view(rows, hidden)


class DFlash2Drafter(DSparkDrafter):
    """The DFlash2 drafter over runtime/drafter.py's context side (``reset``, ``features``,
    ``add_context``, ``crop``, ``fork``: the same context cells DFlash has). Its block pass
    and its proposal are DFlash2's own."""

    def __init__(self, weights: DFlash2Weights, *, embed: torch.Tensor, lm_head: torch.Tensor,
                 device: torch.device) -> None:
        # DSparkDrafter's __init__ reads a DSpark feature contract, which a DFlash2
        # checkpoint has not; these are the attributes its context side reads.
        cfg = weights.config
        layer = cfg.layer
        self.config = cfg
        self.w = weights.tensors
        self.embed, self.lm_head = embed, lm_head
        self.eps = layer.rms_norm_eps
        self.layers = layer.num_hidden_layers
        self.heads, self.kv_heads = layer.num_attention_heads, layer.num_key_value_heads
        self.head_dim = layer.head_dim
        self.block_size = cfg.block_size
        self.mask_token_id = cfg.mask_token_id
        self.hidden_state_indices = list(cfg.aux_hidden_state_layer_ids)
        self.dtype = embed.dtype
        self.device = device
        self.rope = Rope(layer.head_dim, cfg.rope_theta(), device, self.dtype)
        self.top_k = cfg.selector_top_k
        self.reset()

    def _conv(self, prefix: str, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``prepare``: x convolved by side 0, and side 1's per-row coefficients for
        ``finish`` (both from kernel_projection(x): x is the normalised sublayer input)."""
        cfg = self.config
        k = cfg.conv_kernel_size
        dyn = linear(x, self.w[prefix + "kernel_projection.weight"]).view(
            x.shape[0], 2, k, cfg.num_groups)
        prepared = grouped_conv(x, dyn[:, 0], self.w[prefix + "base_kernel"][0],
                                self.block_size, cfg.conv_group_size)
        return prepared, dyn[:, 1]

    def _finish(self, prefix: str, out: torch.Tensor, dyn: torch.Tensor) -> torch.Tensor:
        return grouped_conv(out, dyn, self.w[prefix + "base_kernel"][1], self.block_size,
                            self.config.conv_group_size)

    def _attend(self, layer: int, drafter: DFlash2Drafter, q: torch.Tensor, k: torch.Tensor,
                v: torch.Tensor) -> torch.Tensor:
        """One request's block attention: its context cells in the layer's window (the
        positions >= anchor - W; the anchor is at ``drafter.length``), then its block."""
        window = self.config.window(layer)
        first = 0 if window is None else max(0, drafter.length - window)
        ctx = 0
        if drafter.ctx_keys[layer] is not None:
            ctx_k = drafter.ctx_keys[layer][:, first:]
            ctx = ctx_k.shape[1]
            k = torch.cat([ctx_k, k], dim=1)
            v = torch.cat([drafter.ctx_values[layer][:, first:], v], dim=1)
        block_causal = window is not None and not self.config.sliding_window_non_causal
        return attention(q, k, v, causal_offset=ctx if block_causal else None)

    @torch.inference_mode()
    def block_hidden_packed(self, anchors: Sequence[int], drafters: Sequence[DFlash2Drafter], *,
                            stages: dict | None = None) -> list[torch.Tensor]:
        """The DFlash2 backbone over each request's block [anchor, MASK...] (drafters[i],
        forks of this one, with anchors[i]): every linear layer over all rows, the
        convolutions block by block, attention per request. ``stages`` (a dict) receives
        the stages golden/reference/dflash2's first block records, by its names:
        noise_embedding, layer{i}.{attention,mlp}_conv.{in,out}_conv (the outputs of
        speculators' prepare and finish), layer_out.{i}."""
        w, B = self.w, self.block_size
        lengths = [B] * len(anchors)
        ids = torch.full((B * len(anchors),), self.mask_token_id, dtype=torch.long,
                         device=self.device)
        ids[::B] = torch.tensor(list(anchors), dtype=torch.long, device=self.device)
        where = packed_positions([d.length for d in drafters], lengths, self.device)
        h = self.embed[ids]
        record = stages.__setitem__ if stages is not None else (lambda name, value: None)
        record("noise_embedding", h)
        for i in range(self.layers):
            p = f"layers.{i}."
            x, dyn = self._conv(p + "attention_conv.", self._norm(h, w[p + "input_layernorm.weight"]))
            record(f"layer{i}.attention_conv.in_conv", x)
            q = split_heads(linear(x, w[p + "self_attn.q_proj.weight"]), self.heads, self.head_dim)
            q = self.rope.apply(self._norm(q, w[p + "self_attn.q_norm.weight"]), where)
            k, v = self._kv(i, x, where)
            out = [self._attend(i, d, qs, ks, vs) for d, qs, ks, vs in zip(
                drafters, split_rows(q, lengths), split_rows(k, lengths), split_rows(v, lengths))]
            a = linear(out[0] if len(out) == 1 else torch.cat(out), w[p + "self_attn.o_proj.weight"])
            a = self._finish(p + "attention_conv.", a, dyn)
            record(f"layer{i}.attention_conv.out_conv", a)
            h = h + a
            x, dyn = self._conv(p + "mlp_conv.", self._norm(h, w[p + "post_attention_layernorm.weight"]))
            record(f"layer{i}.mlp_conv.in_conv", x)
            m = self._finish(p + "mlp_conv.", mlp(x, w[p + "mlp.gate_proj.weight"],
                                                  w[p + "mlp.up_proj.weight"],
                                                  w[p + "mlp.down_proj.weight"]), dyn)
            record(f"layer{i}.mlp_conv.out_conv", m)
            h = h + m
            record(f"layer_out.{i}", h)
        return list(split_rows(self._norm(h, w["norm.weight"]), lengths, dim=0))

    @torch.inference_mode()
    def propose(self, anchor: int, *, stages: dict | None = None) -> DFlash2Proposal:
        """The block after ``anchor`` (at position ``self.length``) and its greedy walk."""
        return self.propose_from(anchor, self.block_hidden(anchor, stages=stages))

    @torch.inference_mode()
    def propose_from(self, anchor: int, hb: torch.Tensor) -> DFlash2Proposal:
        """The selector's greedy walk over the block hidden ``hb`` [B, H]: per slot 1..B-1
        the unary top-K, scored given the predecessor (the anchor, then each chosen token)."""
        w = self.w
        unary = linear(hb, self.lm_head)
        require_finite(unary, DRAFTER_LOGITS)
        drafted = unary[1:]
        candidates = drafted.topk(self.top_k, dim=-1).indices
        projected = linear(hb[1:], w[SELECTOR + "hidden_projection.weight"])
        predecessors = w[SELECTOR + "predecessor_codebook"]
        successors = w[SELECTOR + "successor_codebook"][candidates]      # [B-1, K, R]
        unary_scores = drafted.gather(-1, candidates)
        scores, chosen, tokens = [], [], []
        previous = anchor
        for slot in range(self.block_size - 1):
            context = predecessors[previous] * projected[slot]
            row = unary_scores[slot] + (context[None, :] * successors[slot]).sum(-1)
            require_finite(row, SELECTOR_SCORES)
            index = int(row.argmax())
            previous = int(candidates[slot, index])
            scores.append(row)
            chosen.append(index)
            tokens.append(previous)
        as_long = dict(dtype=torch.long, device=self.device)
        return DFlash2Proposal(block_hidden=hb, unary_logits=unary, hidden_projection=projected,
                               candidates=candidates, scores=torch.stack(scores),
                               chosen_index=torch.tensor(chosen, **as_long),
                               tokens=torch.tensor(tokens, **as_long))
