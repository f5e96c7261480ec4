"""Synthetic DSpark checkpoints at the released Qwen3-4B geometry, for the benchmark.

``full``: exactly deepseek-ai/dspark_qwen3_4b_block7's geometry and config (the config.json
DeepSpec generates, taken from golden/reference/released_shapes.json; vanilla Markov head
r=256, confidence head with Markov features), 64 tensors, 2.79 GB of BF16.
``small``: the same family with 2 draft layers and a 32768-token vocabulary, 0.84 GB, to
show how peak memory moves (or not) with the checkpoint's size.

The weights file is streamed to disk one chunk at a time (random normal values rounded to
BF16, seeded, so the same arguments give the same bytes), never held whole in memory, and
written for real: every byte is allocated on disk (no sparse file), which `main` checks by
comparing the blocks the file occupies with its size. ``safetensors.torch.save_file``
(used by dspark_convert.synthetic) would need the whole checkpoint in RAM twice.

    python bench/make_checkpoint.py full /tmp/dspark-bench/full
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
from pathlib import Path

import numpy as np

from dspark_convert.formats.numerics import round_to_bf16

ROOT = Path(__file__).resolve().parent.parent
RELEASED = ROOT / "golden" / "reference" / "released_shapes.json"
RELEASED_VARIANT = "qwen3/vanilla+conf_with_markov"   # what dspark_qwen3_4b_block7 is
CHUNK_ELEMENTS = 16 * 1024 * 1024                      # 64 MiB of float32 per chunk
SIZES = ("full", "small")


def released_config() -> dict:
    return json.loads(RELEASED.read_text())["qwen3/config.json"]


def bench_config(size: str) -> dict:
    config = released_config()
    if size == "small":
        config.update(num_hidden_layers=2, layer_types=["full_attention"] * 2,
                      vocab_size=32768, mask_token_id=32767)
    return config


def tensor_shapes(config: dict) -> dict[str, list[int]]:
    """Source name -> torch shape, from the project's own contract for this config."""
    from dspark_convert.contract.dspark import build_contract, parse_config

    contract = build_contract(parse_config(config))
    return {t.source_name: list(t.shape) for t in contract.tensors}


def check_released_geometry(shapes: dict[str, list[int]]) -> None:
    """The full checkpoint must be key-for-key and shape-for-shape DeepSpec's model."""
    released = json.loads(RELEASED.read_text())[RELEASED_VARIANT]
    if shapes != released:
        differ = sorted(k for k in set(shapes) | set(released) if shapes.get(k) != released.get(k))
        raise SystemExit(f"full geometry differs from {RELEASED_VARIANT} at {differ[:5]}")


def safetensors_header(shapes: dict[str, list[int]]) -> tuple[bytes, list[tuple[str, list[int]]]]:
    """The header safetensors.torch.save_file would write: tensors sorted by name (all one
    dtype), contiguous offsets, JSON padded with spaces to a multiple of 8 bytes."""
    order = sorted(shapes.items())
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in order:
        nbytes = 2 * math.prod(shape)
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text, order


def write_weights(path: Path, shapes: dict[str, list[int]], seed: int) -> None:
    header, order = safetensors_header(shapes)
    rng = np.random.Generator(np.random.PCG64(seed))
    with open(path, "wb") as fh:
        fh.write(header)
        for name, shape in order:
            count = math.prod(shape)
            norm = len(shape) == 1 and not name.endswith(".bias")
            for start in range(0, count, CHUNK_ELEMENTS):
                n = min(CHUNK_ELEMENTS, count - start)
                values = rng.standard_normal(n, dtype=np.float32)
                values *= np.float32(0.05)
                if norm:
                    values += np.float32(1.0)
                fh.write(round_to_bf16(values).tobytes())
        fh.flush()
        os.fsync(fh.fileno())


def allocated_bytes(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def make_checkpoint(size: str, directory: Path, *, seed: int = 0) -> Path:
    """Write ``directory`` (config.json + model.safetensors) unless an identical one is
    there already (same config, same seed, complete). Built in a sibling, then renamed."""
    config = bench_config(size)
    shapes = tensor_shapes(config)
    if size == "full":
        check_released_geometry(shapes)
    stamp = {"size": size, "seed": seed, "config": config}
    marker = directory / ".bench-checkpoint.json"
    if marker.is_file() and json.loads(marker.read_text()) == stamp:
        return directory
    tmp = directory.with_name(directory.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    weights = tmp / "model.safetensors"
    write_weights(weights, shapes, seed)
    size_bytes = weights.stat().st_size
    if allocated_bytes(weights) < size_bytes:
        raise SystemExit(f"{weights}: {allocated_bytes(weights)} bytes allocated for "
                         f"{size_bytes} bytes: a sparse file, expected every byte written")
    (tmp / ".bench-checkpoint.json").write_text(json.dumps(stamp))
    shutil.rmtree(directory, ignore_errors=True)
    tmp.rename(directory)
    return directory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("size", choices=SIZES)
    parser.add_argument("directory", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    directory = make_checkpoint(args.size, args.directory, seed=args.seed)
    weights = directory / "model.safetensors"
    print(f"{directory}: model.safetensors {weights.stat().st_size:,} bytes, "
          f"{allocated_bytes(weights):,} allocated on disk")
    return 0


if __name__ == "__main__":
    sys.exit(main())
