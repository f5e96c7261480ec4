"""Deterministic synthetic DSpark checkpoints, for fixtures, tests and benchmarks.

A synthetic checkpoint is laid out exactly as DeepSpec's trainer saves one: config.json (a
Qwen3 config with the DSpark fields) and BF16 (or F16/F32) safetensors written by the
safetensors library, single-file or sharded with an index. Values come from numpy's PCG64
generator (stable across numpy versions) and are rounded to BF16 by torch, so the same
arguments always give the same bytes. Needs torch (a dev/runtime dependency).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from dspark_convert.contract.dspark import build_contract, parse_config

DTYPE_NAMES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


def synthetic_config(*, hidden_size: int = 32, intermediate_size: int = 64,
                     num_hidden_layers: int = 2, num_attention_heads: int = 4,
                     num_key_value_heads: int = 2, head_dim: int = 8, vocab_size: int = 256,
                     num_target_layers: int = 6, target_layer_ids: tuple[int, ...] = (0, 2, 4),
                     block_size: int = 7, mask_token_id: int = 250, markov_rank: int = 8,
                     markov_head_type: str | None = "vanilla", enable_confidence_head: bool = True,
                     confidence_head_with_markov: bool | None = True, dtype: str = "BF16",
                     rope_theta: float = 1000000.0, rms_norm_eps: float = 1e-6) -> dict:
    """A config.json as DeepSpec's build_draft_config writes it (docs/REFERENCE.md §1)."""
    cfg = {
        "architectures": ["Qwen3DSparkModel"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "block_size": block_size,
        "bos_token_id": 1,
        "dtype": DTYPE_NAMES[dtype],
        "enable_confidence_head": enable_confidence_head,
        "eos_token_id": 2,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "hidden_size": hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": intermediate_size,
        "layer_types": ["full_attention"] * num_hidden_layers,
        "markov_rank": markov_rank,
        "mask_token_id": mask_token_id,
        "max_position_embeddings": 512,
        "max_window_layers": 28,
        "model_type": "qwen3",
        "num_anchors": 64,
        "num_attention_heads": num_attention_heads,
        "num_hidden_layers": num_hidden_layers,
        "num_key_value_heads": num_key_value_heads,
        "num_target_layers": num_target_layers,
        "pad_token_id": 0,
        "rms_norm_eps": rms_norm_eps,
        "rope_parameters": {"rope_theta": rope_theta, "rope_type": "default"},
        "sliding_window": None,
        "target_layer_ids": list(target_layer_ids),
        "tie_word_embeddings": False,
        "transformers_version": "5.10.2",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": vocab_size,
    }
    if markov_rank > 0 and markov_head_type is not None:
        cfg["markov_head_type"] = markov_head_type
    if enable_confidence_head and confidence_head_with_markov is not None:
        cfg["confidence_head_with_markov"] = confidence_head_with_markov
    return dict(sorted(cfg.items()))


def synthetic_tensors(config: dict, *, seed: int = 0, include_embeddings: bool = True) -> dict[str, np.ndarray]:
    """float32 values for every tensor the config's contract names, in table order."""
    contract = build_contract(parse_config(config))
    rng = np.random.Generator(np.random.PCG64(seed))
    out = {}
    for spec in contract.tensors:
        if spec.kind == "embedding" and not include_embeddings:
            continue
        values = rng.standard_normal(spec.shape, dtype=np.float32) * np.float32(0.05)
        if spec.kind == "norm":
            values = values + np.float32(1.0)
        out[spec.source_name] = values
    return out


def write_checkpoint(directory: str | os.PathLike, config: dict, tensors: dict[str, np.ndarray],
                     *, dtype: str = "BF16", shards: int = 1) -> Path:
    """Write config.json and the weights (``shards`` > 1: model-0000i-of-0000N + index)."""
    import torch
    from safetensors.torch import save_file

    torch_dtype = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}[dtype]
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    converted = {name: torch.from_numpy(np.ascontiguousarray(v)).to(torch_dtype)
                 for name, v in tensors.items()}
    if shards == 1:
        save_file(converted, str(directory / "model.safetensors"), metadata={"format": "pt"})
        return directory
    names = sorted(converted)
    groups = [names[i::shards] for i in range(shards)]
    weight_map, total = {}, 0
    for i, group in enumerate(groups, start=1):
        shard = f"model-{i:05d}-of-{shards:05d}.safetensors"
        save_file({n: converted[n] for n in group}, str(directory / shard), metadata={"format": "pt"})
        for n in group:
            weight_map[n] = shard
            total += converted[n].numel() * converted[n].element_size()
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return directory


def make_synthetic_checkpoint(directory: str | os.PathLike, *, seed: int = 0, dtype: str = "BF16",
                              shards: int = 1, include_embeddings: bool = True, **config_args) -> Path:
    """Config + tensors + files in one call; keyword arguments go to synthetic_config."""
    config = synthetic_config(dtype=dtype, **config_args)
    tensors = synthetic_tensors(config, seed=seed, include_embeddings=include_embeddings)
    return write_checkpoint(directory, config, tensors, dtype=dtype, shards=shards)
