"""All-zero Qwen3 targets and DSpark drafters of any geometry, as sparse files.

For the runtime benchmark (bench/runtime.py) and the memory-estimate test: load time,
forward time and peak memory depend on the shapes, not on the values, so the weights are
zeros, and a file of zeros need not be written: ``model.safetensors`` is its header
followed by a hole (``truncate``), 8 GB of target in a few kB of disk. Reading a hole
returns zeros; the loader still allocates and fills every tensor, so the memory measured
is the memory a real checkpoint of that geometry takes.

The header is the one bench/make_checkpoint.py writes (safetensors.torch.save_file's
layout: tensors sorted by name, BF16, contiguous offsets). The tensor tables are the
project's own: the target's from runtime/qwen3.py ``tensor_shapes``, the drafter's from the
contract (bench/make_checkpoint.py ``tensor_shapes``), so a sparse model is exactly what
`dspark smoke` expects.

A drafter and its target share the embedding and head: both all-zero BF16 [V, H], so the
SHA-256 the converter records for the drafter's copies is the target's.

Geometries (``GEOMETRIES``): the released Qwen3-4B DSpark drafter
(golden/reference/released_shapes.json: H 2560, I 9728, 5 draft layers, 32/8 heads of 128,
V 151936, taps [1, 9, 17, 25, 33] of 36, vanilla Markov head r 256, confidence head with
Markov features) on a Qwen3-4B target (H 2560, 36 layers, 32/8 heads of 128, FFN 9728,
V 151936, tied head); the 8B drafter (same with H 4096, I 12288) on a Qwen3-8B target
(H 4096, 36 layers, 32/8 heads of 128, FFN 12288, V 151936, untied head).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from make_checkpoint import released_config, safetensors_header
from make_checkpoint import tensor_shapes as drafter_shapes


@dataclass(frozen=True)
class Geometry:
    name: str
    hidden_size: int
    intermediate_size: int
    target_layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab_size: int
    tied_head: bool
    taps: tuple[int, ...]
    draft_layers: int = 5
    markov_rank: int = 256
    max_position_embeddings: int = 40960
    mask_token_id: int = 151669


GEOMETRIES = {
    "4b": Geometry("qwen3-4b", hidden_size=2560, intermediate_size=9728, target_layers=36,
                   heads=32, kv_heads=8, head_dim=128, vocab_size=151936, tied_head=True,
                   taps=(1, 9, 17, 25, 33)),
    "8b": Geometry("qwen3-8b", hidden_size=4096, intermediate_size=12288, target_layers=36,
                   heads=32, kv_heads=8, head_dim=128, vocab_size=151936, tied_head=False,
                   taps=(1, 9, 17, 25, 33)),
}


def target_config(g: Geometry) -> dict:
    return {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "attention_bias": False, "hidden_act": "silu", "use_sliding_window": False,
        "hidden_size": g.hidden_size, "intermediate_size": g.intermediate_size,
        "num_hidden_layers": g.target_layers, "num_attention_heads": g.heads,
        "num_key_value_heads": g.kv_heads, "head_dim": g.head_dim, "vocab_size": g.vocab_size,
        "max_position_embeddings": g.max_position_embeddings, "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
        "tie_word_embeddings": g.tied_head, "bos_token_id": 151643, "eos_token_id": 151645,
        "torch_dtype": "bfloat16",
    }


def drafter_config(g: Geometry) -> dict:
    """DeepSpec's released config (Qwen3-4B drafter) with this geometry's sizes."""
    config = released_config()
    config.update(hidden_size=g.hidden_size, intermediate_size=g.intermediate_size,
                  num_attention_heads=g.heads, num_key_value_heads=g.kv_heads,
                  head_dim=g.head_dim, vocab_size=g.vocab_size,
                  num_target_layers=g.target_layers, target_layer_ids=list(g.taps),
                  num_hidden_layers=g.draft_layers,
                  layer_types=["full_attention"] * g.draft_layers, markov_rank=g.markov_rank,
                  mask_token_id=g.mask_token_id,
                  max_position_embeddings=g.max_position_embeddings)
    return config


def write_sparse_safetensors(path: Path, shapes: dict[str, list[int]]) -> int:
    """The header, then a hole up to the end of the data: returns the file size."""
    header, _order = safetensors_header(shapes)
    size = len(header) + sum(2 * math.prod(shape) for shape in shapes.values())
    with open(path, "wb") as fh:
        fh.write(header)
        fh.truncate(size)
    return size


def _target_shapes(directory: Path) -> dict[str, list[int]]:
    from dspark_convert.runtime.qwen3 import read_target_config, tensor_shapes

    return {name: list(shape) for name, shape in tensor_shapes(read_target_config(directory)).items()}


def write_tokenizer(directory: Path, tokens: int = 256) -> None:
    """A small word-level tokenizer.json (ids 0..tokens-1, far below any mask token): the
    pairing reads the target's tokenizer (its size, the mask token, the fingerprint), and a
    model's numbers do not depend on it."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    vocab = {"[UNK]": 0, **{f"w{i}": i for i in range(1, tokens)}}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.save(str(directory / "tokenizer.json"))


def _fresh_pair(g: Geometry, root: Path) -> tuple[Path, Path]:
    """``root`` emptied into ``target/`` (its config.json and tokenizer.json written) and an
    empty ``drafter/``: what both pairs start from."""
    shutil.rmtree(root, ignore_errors=True)
    target, drafter = root / "target", root / "drafter"
    target.mkdir(parents=True)
    drafter.mkdir()
    (target / "config.json").write_text(json.dumps(target_config(g), indent=2) + "\n")
    write_tokenizer(target)
    return target, drafter


def make_sparse_pair(g: Geometry, root: Path) -> tuple[Path, Path]:
    """``root/target`` (config.json + sparse model.safetensors) and ``root/drafter`` (a
    DSpark checkpoint, sparse), unless the same geometry is there already."""
    stamp = {"geometry": g.__dict__ | {"taps": list(g.taps)}, "format": 2}
    marker = root / ".sparse-models.json"
    if marker.is_file() and json.loads(marker.read_text()) == stamp:
        return root / "target", root / "drafter"
    target, drafter = _fresh_pair(g, root)
    write_sparse_safetensors(target / "model.safetensors", _target_shapes(target))
    config = drafter_config(g)
    (drafter / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_sparse_safetensors(drafter / "model.safetensors", drafter_shapes(config))
    marker.write_text(json.dumps(stamp))
    return target, drafter


def make_random_pair(g: Geometry, root: Path, *, seed: int = 0) -> tuple[Path, Path]:
    """The same layout with random values, written for real (for small geometries: the
    whole model is built in memory): norms near 1, matrices ~N(0, 1/fan_in), a N(0, 1)
    embedding shared with the drafter. Logits of such a model are nearly flat: near-ties
    everywhere, the worst case for rounding (tests/test_runtime_bfloat16.py)."""
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)

    def value(name: str, shape: list[int]) -> torch.Tensor:
        if len(shape) == 1:
            return (1 + 0.05 * torch.randn(shape, generator=gen)).to(torch.bfloat16)
        return (torch.randn(shape, generator=gen) / shape[-1] ** 0.5).to(torch.bfloat16)

    target, drafter = _fresh_pair(g, root)
    tensors = {name: value(name, shape) for name, shape in _target_shapes(target).items()}
    embed = torch.randn(g.vocab_size, g.hidden_size, generator=gen).to(torch.bfloat16)
    tensors["model.embed_tokens.weight"] = embed
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    config = drafter_config(g)
    (drafter / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    draft = {name: value(name, shape) for name, shape in drafter_shapes(config).items()}
    draft["embed_tokens.weight"] = embed
    draft["lm_head.weight"] = embed if g.tied_head else tensors["lm_head.weight"]
    save_file(draft, drafter / "model.safetensors", metadata={"format": "pt"})
    return target, drafter


def allocated_bytes(path: Path) -> int:
    return os.stat(path).st_blocks * 512
