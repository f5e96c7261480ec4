"""How much memory a smoke or eval run will take, from the plans alone, and what the device
has (runtime/budget.py checks the one against the other).

The estimate is made before any weight is loaded, from the tensor tables of the target
and the drafter (the target family's ``plan_target``, runtime/qwen3.py or runtime/gemma4.py;
runtime/weights.py ``plan_drafter``) and the longest prompt plus ``max_new_tokens``:

- weights: every tensor's element count times the compute dtype's size: the loader
  allocates each tensor once, in that dtype (runtime/loading.py), and holds no other copy;
- activations: the largest working set of one forward (the prefill of the longest prompt
  or one verify block; of the target's widest kind of layer, where they differ: Gemma4's
  sliding and full layers) plus both caches at the full context (``cache_bytes``): the
  target's KV cache, every layer at its own geometry, the drafter's context K/V, the
  hidden states kept for the taps, one layer's attention scores and MLP intermediates,
  the logits and the float32 probabilities of a block;
- runtime: the process itself. On the CPU: the interpreter, torch and the libraries smoke
  imports, measured (RUNTIME_CPU_BYTES) plus the loader's staging buffer. On CUDA the
  check is on the device's memory: the caching allocator's slack and the staging buffer.

``available_memory`` is what the device can give now: on the CPU the kernel's
MemAvailable (and the cgroup's limit minus its usage when that is lower); on CUDA the
driver's free memory (``torch.cuda.mem_get_info``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from dspark_convert.runtime.budget import MemoryEstimate, MemoryReport, budget_report
from dspark_convert.runtime.loading import STAGING_BYTES
from dspark_convert.runtime.qwen3 import TargetPlan
from dspark_convert.runtime.weights import DrafterPlan

MiB = 1024 * 1024
# Peak RSS of `dspark smoke` on the 0.6 MB golden target with the 0.2 MB golden drafter
# (Python 3.11, torch 2.13 CPU, tokenizers, numpy, gguf, pydantic, matplotlib imported):
# 253 MiB measured; rounded up for the allocator's arenas.
RUNTIME_CPU_BYTES = 300 * MiB
# The CUDA caching allocator rounds blocks up and keeps freed ones: a margin on the device.
CUDA_SLACK_FRACTION = 0.05


@dataclass(frozen=True)
class DrafterShape:
    """What a drafter of any kind adds to a run's working set, beside its weights: the rows
    of a verify block, the target hidden states it keeps for its context cells, and its
    own context keys and values per position."""

    block: int
    taps: int
    kv_per_token: int          # elements per position, every draft layer's K and V


def drafter_shape(plan) -> DrafterShape:
    """The shape of a DSpark / DFlash artifact's plan (runtime/weights.py), a DFlash2 plan
    (runtime/dflash2.py: DFlash's context cells and block, speculators' Qwen3 layer config)
    or a Gemma 4 assistant's (runtime/gemma4_assistant.py: no context K/V of its own, it
    reads the target's; its block is its drafts per cycle and the anchor)."""
    if isinstance(plan, DrafterPlan):
        c = plan.contract
        g = c.geometry
        return DrafterShape(block=c.block.block_size, taps=len(c.taps.hidden_state_indices),
                            kv_per_token=2 * g.num_draft_layers * g.num_key_value_heads * g.head_dim)
    config = getattr(plan, "config", None)
    if config is not None and hasattr(config, "aux_hidden_state_layer_ids"):
        layer = config.layer
        return DrafterShape(block=config.block_size, taps=len(config.aux_hidden_state_layer_ids),
                            kv_per_token=2 * layer.num_hidden_layers * layer.num_key_value_heads
                            * layer.head_dim)
    spec = getattr(plan, "spec", None)
    if spec is not None and hasattr(spec, "num_assistant_tokens"):
        return DrafterShape(block=spec.num_assistant_tokens + 1, taps=0, kv_per_token=0)
    raise TypeError(f"no memory shape for a drafter plan of type {type(plan).__name__}")


def estimate_memory(target: TargetPlan, drafter, *,
                    dtype: torch.dtype, device: torch.device, longest_prompt: int,
                    max_new_tokens: int, requests: int = 1) -> MemoryEstimate:
    """The estimate for ``target`` with ``drafter`` loaded beside it, or with every drafter
    of a sequence loaded at once (eval): their weights add up, while the runs, one drafter
    at a time, need the largest of their working sets. ``requests``: how many are served at
    once (runtime/serving.py): each holds both caches at the longest context, and a step's
    packed forwards run over all their blocks."""
    drafters = list(drafter) if isinstance(drafter, (list, tuple)) else [drafter]
    es = dtype.itemsize
    sized = [_activations(target, d, es, device, longest_prompt, max_new_tokens, requests)
             for d in drafters]
    activations, T = max(sized)
    drafter_numel = sum(d.numel for d in drafters)
    weights = (target.numel + drafter_numel) * es
    if device.type == "cuda":
        runtime = int(CUDA_SLACK_FRACTION * (weights + activations)) + 2 * STAGING_BYTES
    else:
        runtime = RUNTIME_CPU_BYTES + STAGING_BYTES
    return MemoryEstimate(device=str(device), dtype=str(dtype).removeprefix("torch."),
                          target_weights=target.numel * es, drafter_weights=drafter_numel * es,
                          activations=activations, runtime=runtime, context_tokens=T)


def _activations(target: TargetPlan, drafter, es: int, device: torch.device,
                 longest_prompt: int, max_new_tokens: int,
                 requests: int = 1) -> tuple[int, int]:
    """(bytes of the activations, the positions the caches are sized for). With several
    ``requests``: R caches, and a packed step of R blocks (its rows through the linear
    layers at once; attention is per request, one block's scores at a time)."""
    cfg = target.config
    H, I, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    nh = cfg.num_attention_heads
    shape = drafter_shape(drafter)
    B, taps = shape.block, shape.taps
    T = longest_prompt + max_new_tokens + B        # a verify block may run past the end
    S = max(longest_prompt, requests * B)           # rows of the largest forward
    A = max(longest_prompt, B)                      # rows of the largest attention

    caches = (cfg.kv_elements_per_token() + shape.kv_per_token) * T * es * requests
    # One target layer on S rows, the largest of the target's kinds of layer: the residual
    # and the kept taps, q/k/v before and after norm and RoPE, K/V repeated for the grouped
    # heads, the attention scores and their softmax (float32 on the math path) and the
    # boolean mask, the cache's concatenation, the MLP's gate, up and product.
    def layer(nkv: int, d: int) -> int:
        size = (taps + 3) * S * H * es
        size += 2 * S * (nh + 2 * nkv) * d * es
        size += 2 * nh * T * d * es
        size += _attention_scores(nh, A, T, d, es, device) + A * T
        size += 2 * nkv * T * d * es
        return size + 3 * S * I * es

    # Each kind of layer's own (KV heads, head_dim): not the most heads with the widest
    # head_dim (gemma-4-12B-it has no layer of 8 heads of 512).
    widest = max(layer(nkv, d) for nkv, d in cfg.attention_shapes())
    # The drafter on the prompt's context cells: features (taps x H) and fc's output (an
    # assistant has no context cells: its input is one row of the target's last hidden).
    context = S * (taps + 1) * H * es if taps else 0
    # A block's logits: target verify logits and probabilities, drafter base and corrected
    # logits and their probabilities (float32).
    logits = requests * B * V * (2 * es + 2 * 4) + V * es
    return caches + max(widest, context) + logits, T


def cache_bytes(cfg, contract, positions: int, es: int) -> int:
    """Both caches at ``positions`` positions, ``es`` bytes an element: the target's keys
    and values over every layer (its config's ``kv_elements_per_token``; the runtime keeps
    every position, a sliding window is a mask) and the drafter's context keys and values
    in each draft layer, at its contract's geometry (a Gemma4 drafter's is the target's
    global one: num_global_key_value_heads of global_head_dim)."""
    g = contract.geometry
    drafter = 2 * g.num_draft_layers * g.num_key_value_heads * g.head_dim
    return (cfg.kv_elements_per_token() + drafter) * positions * es


def _attention_scores(nh: int, S: int, T: int, d: int, es: int, device: torch.device) -> int:
    """What scaled_dot_product_attention with a boolean mask holds for S queries over T keys,
    as runtime/layers.py calls it (3-D [heads, tokens, d] tensors). Measured on the CPU
    (torch 2.13, 8 heads, S = T = 4000): both float32 and bfloat16 take the math path, the
    scores and softmax materialised in float32: 1175 and 1167 MiB for 488 MiB of float32
    scores, so 2.5x those are counted. (torch's blocked flash kernel, 21-42 MiB, is taken
    only for 4-D inputs; the runtime keeps the 3-D call, whose float32 results the reference
    traces were matched with: a 4-D call moves them by up to 8e-7.) On CUDA the kernel
    choice depends on the build and the GPU: the scores are counted, twice."""
    if device.type == "cpu":
        return int(2.5 * nh * S * T * 4)
    return 2 * nh * S * T * es


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_available() -> int | None:
    """cgroup v2: memory.max - memory.current of this process's cgroup, when limited."""
    try:
        rel = Path("/proc/self/cgroup").read_text().strip().split("::", 1)[1]
        base = Path("/sys/fs/cgroup") / rel.lstrip("/")
        limit = (base / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int((base / "memory.current").read_text().strip()))
    except (OSError, ValueError, IndexError):
        return None


def available_memory(device: torch.device) -> tuple[int | None, str]:
    """(bytes the device can give now, where that number comes from)."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free), "free CUDA memory (cudaMemGetInfo)"
    meminfo, cgroup = _meminfo_available(), _cgroup_available()
    if cgroup is not None and (meminfo is None or cgroup < meminfo):
        return cgroup, "the cgroup's memory.max minus memory.current"
    return meminfo, "MemAvailable in /proc/meminfo"


def checked_estimate(target: TargetPlan, drafter: DrafterPlan | Sequence[DrafterPlan], *,
                     dtype: torch.dtype, device: torch.device, longest_prompt: int,
                     max_new_tokens: int, max_memory: int | None, smaller: str,
                     requests: int = 1) -> MemoryReport:
    """``estimate_memory`` checked against what ``device`` has now, or ``max_memory``
    (runtime/budget.py ``budget_report``: MemoryBudgetError when over)."""
    estimate = estimate_memory(target, drafter, dtype=dtype, device=device,
                               longest_prompt=longest_prompt, max_new_tokens=max_new_tokens,
                               requests=requests)
    available, source = available_memory(device)
    return budget_report(estimate, available=available, source=source, max_memory=max_memory,
                         smaller=smaller)
