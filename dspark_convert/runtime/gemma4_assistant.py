"""The Gemma 4 assistant (MTP drafter) in the reference runtime, and its decoding loop.

Loading, for other commands: ``plan_assistant(path)`` takes a source checkpoint directory or
a `dspark convert` artifact directory (no tensor byte read); ``load_assistant(plan_or_path,
target)`` binds it to a loaded ``runtime.gemma4.Gemma4Target``;
``commands/binding.bind(artifact, target)`` validates an artifact against its target first,
and its ``drafter_plan`` is this module's plan.

What transformers 5.19 computes (docs/REFERENCE.md, "The Gemma 4 assistant", has the
upstream file:line of each point):

- A step's input is ``[target_embed(token) | h]`` [2·Hb]: the target's scaled embedding of
  the step's token and ``h``, the target's post-final-norm hidden state of the last
  committed token before the anchor (step 0), else the previous step's ``post_projection``.
- ``pre_projection`` → a Gemma 4 text decoder (the target's layer arithmetic:
  runtime/gemma4.gemma_norm, layer_rest) whose layers have no k/v projections: each
  attends, with scale 1, to the target's stored K/V (K after k_norm + RoPE, V after
  v_norm) of the target's *last* layer of its type. Full layers see every shared entry,
  sliding layers the last ``sliding_window + 1`` (a bidirectional window flipped onto the
  past). ``norm`` → logits = the tied head (no softcap); ``post_projection`` → the next h.
- Every step of a cycle sits at the anchor's position (queries are rotated there); the
  drafts never enter any cache. Greedy: each step's token is its logits' argmax.

The loop (``assisted_generate``) is transformers' ``_assisted_decoding`` with its
``SinglePositionMultiTokenCandidateGenerator``: the target prefills and picks the first
token; then each cycle drafts ``min(num_assistant_tokens, max_length - len - 1)`` tokens,
the target verifies ``[anchor, drafts]`` and commits as runtime/speculative.py does
(its ``verify``). Two modes say which target KV the next cycle's assistant reads:

- ``clean_kv``: the target's KV of the committed tokens before the anchor, rejected drafts
  cropped away (what the fixture's ``runs_clean_kv`` records);
- ``transformers``: what transformers 5.19 hands over (candidate_generator.py:1329-1331):
  the verify forward's KV sliced *by index* to the committed length. The full layer's KV
  then still holds a rejected draft at the anchor's own position, and the sliding layer's
  (a window-offset tensor: the target cache's last ``W - 1`` entries before the forward
  plus the forward's rows) holds rejected drafts, shifted (the fixture's ``runs``).

Sampling (temperature > 0) is the exact speculative sampler, not transformers' (whose drafts
stay argmax while its acceptance treats the assistant's softmax as q): each draft is drawn
from q = softmax(logits / T) of its step, and runtime/speculative.verify accepts with
min(1, p/q) and draws the residual or bonus, so committed tokens are distributed as the
target's own samples.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from dspark_convert.artifact.format import assistant_config_view
from dspark_convert.contract.gemma4_assistant import FAMILY as ASSISTANT_FAMILY
from dspark_convert.contract.gemma4_assistant import (FULL, SLIDING, AssistantSpec,
                                                      read_assistant_spec, tensor_shapes)
from dspark_convert.contract.gemma4_assistant import parse_config as parse_assistant_config
from dspark_convert.runtime.artifact_plan import artifact_truncated, is_artifact, open_artifact
from dspark_convert.errors import AssistantTargetError
from dspark_convert.formats.safetensors import read_checkpoint
from dspark_convert.runtime.gemma4 import Gemma4Target, gemma_norm, layer_rest
from dspark_convert.runtime.layers import Rope, attention, linear, split_heads
from dspark_convert.runtime.loading import (StoredModel, TensorLoader, source_tensors,
                                            source_truncated)
from dspark_convert.runtime.qwen3 import KVCache
from dspark_convert.runtime.sampling import pick, probs_from_logits
from dspark_convert.runtime.speculative import TARGET_LOGITS, synchronize, verify

KVMode = Literal["clean_kv", "transformers"]
KV_MODES: tuple[str, ...] = ("clean_kv", "transformers")
ASSISTANT_LOGITS = "the assistant's logits"


# --- the checkpoint --------------------------------------------------------------------

@dataclass(frozen=True)
class AssistantPlan(StoredModel):
    """An assistant directory checked from config.json and the safetensors headers (every
    tensor present, of its shape, nothing else), or an assistant artifact from its
    drafter.gguf header; no tensor byte read."""

    directory: Path
    spec: AssistantSpec
    from_artifact: bool = False


def plan_assistant(directory: str | os.PathLike, *, gguf=None) -> AssistantPlan:
    """A source checkpoint (config.json, generation_config.json when present, the
    safetensors headers), or an artifact directory (`dspark convert`'s drafter.gguf: its
    metadata read back as the config.json and drafts per cycle it stands for, its tensors
    checked against the contract; runtime/artifact_plan.py, 156 for another kind's
    artifact); ``gguf``: the file as validate parsed it."""
    directory = Path(directory)
    if is_artifact(directory):
        opened = open_artifact(directory, ASSISTANT_FAMILY, gguf=gguf)
        view, generation = assistant_config_view(opened.metadata, path=str(opened.path))
        spec = parse_assistant_config(view, path=f"{opened.path} (as config.json)",
                                      companion=generation,
                                      companion_path=f"{opened.path} (as generation_config.json)")
        return AssistantPlan(directory=directory, spec=spec, tensors=opened.tensors,
                             from_artifact=True)
    spec = read_assistant_spec(directory)
    checkpoint = read_checkpoint(directory)
    tensors = source_tensors(
        checkpoint.tensors, tensor_shapes(spec), directory,
        unexpected=lambda name: f"is not one a {spec.config.architectures[0]} of this config "
                                f"reads (no k/v projections, the head tied to "
                                f"model.embed_tokens.weight)")
    return AssistantPlan(directory=directory, spec=spec, tensors=tensors)


def load_assistant(plan_or_path: AssistantPlan | str | os.PathLike,
                   target: Gemma4Target) -> Gemma4Assistant:
    """The assistant bound to ``target`` (runtime/gemma4.Gemma4Target): a plan
    (plan_assistant's, or commands/binding.Binding.drafter_plan), or a source checkpoint or
    artifact directory planned here; checked against the target (153) before any tensor
    byte is read, loaded in the target's dtype and device."""
    plan = (plan_or_path if isinstance(plan_or_path, AssistantPlan)
            else plan_assistant(plan_or_path))
    return Gemma4Assistant(plan.directory, target, plan=plan)


def shared_layers(spec: AssistantSpec, target: Gemma4Target) -> dict[str, int]:
    """For each layer type the assistant has, the target layer whose KV it reads: the
    target's last layer of that type (modeling_gemma4_unified.py:354, 423-424,
    ``store_full_length_kv``), whose geometry each assistant layer of that type must have.
    AssistantTargetError (153)."""
    label = f"assistant {spec.config.architectures[0]}"
    t = target.config.text
    for field, mine, theirs in (("backbone_hidden_size", spec.backbone_hidden_size,
                                 t.hidden_size),
                                ("text_config.vocab_size", spec.text.vocab_size, t.vocab_size)):
        if mine != theirs:
            raise AssistantTargetError(f"{label}: config.json field '{field}': expected the "
                                       f"target's {theirs}, found {mine}", field=field,
                                       expected=theirs, found=mine)
    kinds = [g.kind for g in target.config.layers]
    chosen: dict[str, int] = {}
    for i, layer in enumerate(spec.layers):
        if layer.kind not in kinds:
            raise AssistantTargetError(
                f"{label}: config.json field 'text_config.layer_types[{i}]': the target has no "
                f"{layer.kind} layer whose KV it could read", field=f"text_config.layer_types[{i}]",
                expected=sorted(set(kinds)), found=layer.kind)
        index = len(kinds) - 1 - kinds[::-1].index(layer.kind)
        g = target.config.layers[index]
        if (layer.head_dim, layer.kv_heads) != (g.head_dim, g.kv_heads):
            raise AssistantTargetError(
                f"{label}: config.json layer {i} ({layer.kind}): expected the geometry of the "
                f"target's layer {index} whose KV it reads (head_dim {g.head_dim}, "
                f"{g.kv_heads} KV heads), found head_dim {layer.head_dim}, {layer.kv_heads} KV "
                "heads", field=f"text_config.layer_types[{i}]",
                expected=[g.head_dim, g.kv_heads], found=[layer.head_dim, layer.kv_heads])
        chosen[layer.kind] = index
    return chosen


# --- the shared KV ----------------------------------------------------------------------

@dataclass(frozen=True)
class SharedKV:
    """The target K/V one cycle's assistant reads, by layer type: (keys, values), each
    [KV heads, entries, head_dim] (entries in the order of the target's tensor)."""

    kv: dict[str, tuple[torch.Tensor, torch.Tensor]]

    def lengths(self) -> dict[str, int]:
        return {kind: k.shape[1] for kind, (k, _) in self.kv.items()}


def clean_shared_kv(cache: KVCache, layers: dict[str, int], committed: int) -> SharedKV:
    """The target's KV of the first ``committed`` positions (the tokens before the anchor)."""
    return SharedKV({kind: (cache.keys[i][:, :committed], cache.values[i][:, :committed])
                     for kind, i in layers.items()})


def transformers_shared_kv(cache: KVCache, layers: dict[str, int], *, start: int, end: int,
                           current_length: int, target_window: int | None) -> SharedKV:
    """What transformers 5.19 hands the assistant after a target forward over positions
    start..end-1 (``cache`` before its crop): each layer type's KV *as that forward returned
    it*, sliced by index to ``current_length`` (the committed tokens, anchor included;
    candidate_generator.py:1329-1331). A full layer returned positions 0..end-1; a sliding
    layer (cache_utils.py:237-274, DynamicSlidingWindowLayer.update with past recording)
    its last ``W - 1`` cached positions before the forward and the forward's rows."""
    out = {}
    for kind, i in layers.items():
        first = max(0, start - target_window + 1) if kind == SLIDING else 0
        keys, values = cache.keys[i][:, first:end], cache.values[i][:, first:end]
        out[kind] = (keys[:, :current_length], values[:, :current_length])
    return SharedKV(out)


# --- the assistant ----------------------------------------------------------------------

@dataclass(frozen=True)
class StepOutput:
    """One assistant step, every stage [1, ...] (first_block.safetensors' names)."""

    inputs_embeds: torch.Tensor        # [target embed x sqrt(Hb) | h]
    pre_projection: torch.Tensor
    layer_outputs: tuple[torch.Tensor, ...]   # after each layer's scalar
    final_norm: torch.Tensor
    logits: torch.Tensor               # the tied head, no softcap
    projected_hidden: torch.Tensor     # post_projection: the next step's h


class Gemma4Assistant:
    """A Gemma4UnifiedAssistantForCausalLM checkpoint bound to its target (the KV it reads,
    the embedding it is fed), weights in the target's dtype on its device."""

    def __init__(self, directory: str | os.PathLike, target: Gemma4Target, *,
                 plan: AssistantPlan | None = None) -> None:
        plan = plan if plan is not None else plan_assistant(directory)
        self.spec = spec = plan.spec
        self.target = target
        self.kv_layers = shared_layers(spec, target)
        self.device, self.dtype = target.device, target.dtype
        truncated = artifact_truncated if plan.from_artifact else source_truncated
        with TensorLoader(device=self.device, dtype=self.dtype, truncated=truncated) as loader:
            self.w = {name: loader.load(t) for name, t in plan.tensors.items()}
        self.eps = spec.text.rms_norm_eps
        self.window = spec.text.sliding_window
        self.ropes = [Rope(layer.head_dim, layer.rope_theta, self.device, self.dtype,
                           rotated_pairs=layer.rotated_pairs) for layer in spec.layers]

    @property
    def num_assistant_tokens(self) -> int:
        return self.spec.num_assistant_tokens

    def _attend(self, i: int, x: torch.Tensor, position: int, shared: SharedKV) -> torch.Tensor:
        layer, p = self.spec.layers[i], f"model.layers.{i}.self_attn."
        q = split_heads(linear(x, self.w[p + "q_proj.weight"]), self.spec.text.num_attention_heads,
                        layer.head_dim)
        q = self.ropes[i].apply(gemma_norm(q, self.w[p + "q_norm.weight"], self.eps), position)
        keys, values = shared.kv[layer.kind]
        if layer.kind == SLIDING:
            # transformers' bidirectional window |q - kv| <= W from kv index 0, flipped onto
            # the tensor's end (modeling_gemma4_unified_assistant.py:212-253): the last W + 1.
            keys, values = keys[:, -(self.window + 1):], values[:, -(self.window + 1):]
        return attention(q, keys, values, causal_offset=None, scale=1.0)

    @torch.inference_mode()
    def step(self, token: int, h: torch.Tensor, position: int, shared: SharedKV) -> StepOutput:
        """One assistant forward: ``token`` (the anchor, or the previous draft), ``h`` [Hb]
        (or [1, Hb]), every query at ``position``."""
        target = self.target
        embed = target.embed[torch.tensor([token], device=self.device)] * target.scale
        inputs = torch.cat([embed, h.reshape(1, -1).to(self.dtype)], dim=-1)
        x = linear(inputs, self.w["pre_projection.weight"])
        hidden, outs = x, []
        for i in range(len(self.spec.layers)):
            p = f"model.layers.{i}."
            a = self._attend(i, gemma_norm(hidden, self.w[p + "input_layernorm.weight"],
                                           self.eps), position, shared)
            hidden = layer_rest(hidden, a, self.w, p, self.eps)
            outs.append(hidden)
        final = gemma_norm(hidden, self.w["model.norm.weight"], self.eps)
        return StepOutput(inputs_embeds=inputs, pre_projection=x, layer_outputs=tuple(outs),
                          final_norm=final,
                          logits=linear(final, self.w["model.embed_tokens.weight"]),
                          projected_hidden=linear(final, self.w["post_projection.weight"]))

    def draft(self, anchor: int, h: torch.Tensor, position: int, shared: SharedKV, count: int,
              *, temperature: float = 0.0, generator: torch.Generator | None = None
              ) -> tuple[list[int], torch.Tensor | None]:
        """``count`` drafts from one anchor, every step at ``position``: each token the
        argmax (temperature 0) or a draw from softmax(logits / T). Returns the drafts and,
        sampling, q [count, V] (each step's distribution; None at temperature 0)."""
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        token = anchor
        for _ in range(count):
            out = self.step(token, h, position, shared)
            if temperature > 0.0:
                q = probs_from_logits(out.logits[0], temperature, what=ASSISTANT_LOGITS)
                token = int(torch.multinomial(q.cpu(), 1, generator=generator))
                qs.append(q)
            else:
                token = pick(out.logits[0], 0.0, None, what=ASSISTANT_LOGITS)
            tokens.append(token)
            h = out.projected_hidden
        return tokens, (torch.stack(qs) if qs else None)


# --- the loop ---------------------------------------------------------------------------

@dataclass(frozen=True)
class AssistantCycle:
    anchor: int
    position: int                          # the anchor's position: every draft step's
    proposed: tuple[int, ...]
    # (layer type, entries handed to the assistant); () when nothing was drafted (the last
    # token of the budget: the target alone, the assistant never called).
    shared_kv_lengths: tuple[tuple[str, int], ...]
    accepted: int
    next_token: int


@dataclass(frozen=True)
class AssistantTiming:
    """One cycle's wall time (device-synchronised), for `dspark eval` and `serve-bench`;
    beside the cycles (``AssistantRun.timings``), not in them."""

    draft_seconds: float       # the assistant's steps + handing it the next cycle's KV
    verify_seconds: float      # the target's forward over [anchor, drafts] and the verify
    end_seconds: float         # the cycle's end, from the run's start (its tokens committed)


@dataclass(frozen=True)
class AssistantRun:
    prompt: tuple[int, ...]
    output_ids: tuple[int, ...]            # prompt included
    acceptance_lengths: tuple[int, ...]    # accepted + 1 per cycle (accepted at a stop)
    cycles: tuple[AssistantCycle, ...]
    mode: str
    temperature: float
    seed: int | None
    # Times (not compared: two runs of the same inputs are equal runs).
    timings: tuple[AssistantTiming, ...] = field(default=(), compare=False)  # one per cycle
    prefill_seconds: float = field(default=0.0, compare=False)  # prefill and first pick
    total_seconds: float = field(default=0.0, compare=False)    # the whole generation

    @property
    def new_tokens(self) -> int:
        return len(self.output_ids) - len(self.prompt)

    @property
    def draft_seconds(self) -> float:
        return sum(t.draft_seconds for t in self.timings)


def _check_mode(mode: str) -> None:
    if mode not in KV_MODES:
        raise AssistantTargetError(f"kv mode: expected one of {', '.join(KV_MODES)}, found "
                                   f"{mode!r}", field="mode", expected=list(KV_MODES),
                                   found=str(mode))


@torch.inference_mode()
def assisted_generate(target: Gemma4Target, assistant: Gemma4Assistant, prompt: list[int], *,
                      max_new_tokens: int, mode: KVMode = "clean_kv",
                      num_assistant_tokens: int | None = None, temperature: float = 0.0,
                      seed: int | None = None, stop_token_ids: tuple[int, ...] = ()
                      ) -> AssistantRun:
    """Assisted decoding as transformers 5.19's loop does it (``mode``: which target KV the
    assistant reads, module docstring). ``num_assistant_tokens``: drafts per cycle,
    generation_config.json's when None."""
    _check_mode(mode)
    device = target.device
    per_cycle = (assistant.num_assistant_tokens if num_assistant_tokens is None
                 else num_assistant_tokens)
    generator = None
    if temperature > 0.0:
        generator = torch.Generator(device="cpu")
        generator.manual_seed(0 if seed is None else seed)
    final = (target.config.num_hidden_layers,)
    window = target.config.text.sliding_window
    layers = assistant.kv_layers
    P, max_length = len(prompt), len(prompt) + max_new_tokens
    synchronize(device)
    t_begin = time.perf_counter()
    cache = KVCache()
    out = target.forward(torch.tensor(prompt, dtype=torch.long, device=device), cache,
                         keep=final)
    x = list(prompt) + [pick(out.logits[-1], temperature, generator, what=TARGET_LOGITS)]
    # The prefill is a forward from position 0: both modes hand over the same KV.
    shared = clean_shared_kv(cache, layers, P)
    h = out.hidden_states[-1][-1]
    cycles: list[AssistantCycle] = []
    timings: list[AssistantTiming] = []
    acceptance: list[int] = []
    done = x[-1] in stop_token_ids
    synchronize(device)
    prefill_seconds = time.perf_counter() - t_begin
    while not done and len(x) < max_length:
        anchor_at = len(x) - 1
        count = min(per_cycle, max_length - len(x) - 1)
        t0 = time.perf_counter()
        draft, q = assistant.draft(x[-1], h, anchor_at, shared, max(count, 0),
                                   temperature=temperature, generator=generator)
        synchronize(device)
        t1 = time.perf_counter()
        ids = torch.tensor([x[-1], *draft], dtype=torch.long, device=device)
        out = target.forward(ids, cache, keep=final)
        p = probs_from_logits(out.logits, temperature, what=TARGET_LOGITS)
        accepted, next_token, stopped = verify(p, q, draft, stop_token_ids=stop_token_ids,
                                               generator=generator)
        synchronize(device)
        t2 = time.perf_counter()
        cycles.append(AssistantCycle(anchor=x[-1], position=anchor_at, proposed=tuple(draft),
                                     shared_kv_lengths=(tuple(sorted(shared.lengths().items()))
                                                        if draft else ()),
                                     accepted=accepted, next_token=next_token))
        x.extend(draft[:accepted])
        if stopped:
            acceptance.append(accepted)
            timings.append(AssistantTiming(draft_seconds=t1 - t0, verify_seconds=t2 - t1,
                                           end_seconds=time.perf_counter() - t_begin))
            break
        x.append(next_token)
        acceptance.append(accepted + 1)
        done = next_token in stop_token_ids
        if mode == "transformers":
            shared = transformers_shared_kv(cache, layers, start=anchor_at, end=cache.length,
                                            current_length=len(x), target_window=window)
        cache.crop(len(x) - 1)
        if mode == "clean_kv":
            shared = clean_shared_kv(cache, layers, len(x) - 1)
        h = out.hidden_states[-1][accepted]
        synchronize(device)
        t3 = time.perf_counter()
        timings.append(AssistantTiming(draft_seconds=(t1 - t0) + (t3 - t2),
                                       verify_seconds=t2 - t1, end_seconds=t3 - t_begin))
    synchronize(device)
    return AssistantRun(prompt=tuple(prompt), output_ids=tuple(x[:max_length]),
                        acceptance_lengths=tuple(acceptance), cycles=tuple(cycles), mode=mode,
                        temperature=temperature, seed=seed if generator is not None else None,
                        timings=tuple(timings), prefill_seconds=prefill_seconds,
                        total_seconds=time.perf_counter() - t_begin)
