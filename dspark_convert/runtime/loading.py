"""Weights loaded once: from the file straight into the compute dtype on the compute device.

Each tensor is allocated once, in its final dtype on its final device, and filled from the
file in chunks of rows. Nothing holds a second host copy of the model:

- CPU, stored dtype = compute dtype (BF16 into bfloat16): ``readinto`` writes the file's
  bytes directly into the tensor's own memory. One copy, from the page cache.
- CPU, another compute dtype (BF16 into float32): a chunk of rows is read into a small
  staging buffer and converted into its rows of the tensor (``copy_`` converts while it
  copies, on the CPU, without a temporary).
- CUDA: the chunk is read into the same staging buffer (pinned, so the copy is a plain DMA)
  and copied to the device. When the dtypes differ it is copied to the device first, in its
  stored dtype, and converted there, so that no host buffer larger than a chunk exists. The
  host RSS is the staging buffer, whatever the model's size; the weights live on the device.

Reads are plain ``read()`` calls rather than a memory map: a mapped file's touched pages
count in the process's RSS until it is unmapped, which for an 8 GB target would double the
peak we are trying to bound. Files are read with their byte order as stored: little-endian,
like every x86 and ARM host torch runs on.

The caller names the error class to raise when a file is shorter than its header said (the
target's is 70, the artifact's 41): the file changed after its layout was checked.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from dspark_convert.errors import DSparkError, SmokeInputError
from dspark_convert.util.hashing import read_full
from dspark_convert.util.progress import NoProgress, Progress

# Compute dtypes of the runtime (`--dtype`). float32 is the reference for parity with
# DeepSpec's traces; bfloat16 computes like the engines do. float64 exists only for tests
# that measure float32's own error.
COMPUTE_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}

# Stored element types we read: safetensors' names and GGUF's BF16.
STORED_DTYPES: dict[str, torch.dtype] = {"BF16": torch.bfloat16, "F16": torch.float16,
                                         "F32": torch.float32}

STAGING_BYTES = 32 * 1024 * 1024


def compute_dtype(name: str) -> torch.dtype:
    """``--dtype NAME`` -> torch dtype; SmokeInputError (73) for anything else."""
    dtype = COMPUTE_DTYPES.get(name)
    if dtype is None:
        raise SmokeInputError(f"--dtype: expected one of {', '.join(COMPUTE_DTYPES)}, found "
                              f"{name!r}", field="dtype", expected="|".join(COMPUTE_DTYPES),
                              found=str(name))
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class StoredTensor:
    """Where a tensor's bytes are: ``nbytes`` from ``offset`` of ``file``, row-major."""

    name: str
    file: Path
    offset: int
    nbytes: int
    dtype: torch.dtype          # the stored element type
    shape: tuple[int, ...]      # torch order

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class StoredModel:
    """A model's tensors as they are stored: what a plan (target or drafter) loads."""

    tensors: dict[str, StoredTensor]

    @property
    def numel(self) -> int:
        return sum(t.numel for t in self.tensors.values())

    @property
    def stored_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


class TensorLoader:
    """Loads StoredTensors into ``dtype`` tensors on ``device``, reporting bytes read to
    ``progress``. Use as a context manager: it keeps each file open until the end."""

    def __init__(self, *, device: torch.device, dtype: torch.dtype,
                 truncated: Callable[[StoredTensor], DSparkError],
                 progress: Progress | None = None) -> None:
        self.device, self.dtype = device, dtype
        self.truncated = truncated
        self.progress = progress or NoProgress()
        self._files: dict[Path, object] = {}
        self._staging: torch.Tensor | None = None
        self._device_staging: torch.Tensor | None = None

    def __enter__(self) -> TensorLoader:
        return self

    def __exit__(self, *exc) -> None:
        for fh in self._files.values():
            fh.close()
        self._files.clear()
        self._staging = self._device_staging = None

    def file(self, path: Path):
        """``path`` opened unbuffered, once: kept open until the loader exits."""
        fh = self._files.get(path)
        if fh is None:
            fh = self._files[path] = open(path, "rb", buffering=0)
        return fh

    def _host_staging(self, nbytes: int) -> torch.Tensor:
        if self._staging is None or self._staging.numel() < nbytes:
            pin = self.device.type == "cuda"
            self._staging = torch.empty(max(nbytes, STAGING_BYTES), dtype=torch.uint8,
                                        pin_memory=pin)
        return self._staging[:nbytes]

    def _dev_staging(self, nbytes: int) -> torch.Tensor:
        if self._device_staging is None or self._device_staging.numel() < nbytes:
            self._device_staging = torch.empty(max(nbytes, STAGING_BYTES), dtype=torch.uint8,
                                               device=self.device)
        return self._device_staging[:nbytes]

    def _read_into(self, spec: StoredTensor, fh, buffer: memoryview) -> None:
        """Fill ``buffer`` from the file's current position; a short read is a file that
        shrank after its header was checked."""
        if read_full(fh, buffer) != len(buffer):
            raise self.truncated(spec)
        self.progress.advance(len(buffer))

    def load(self, spec: StoredTensor) -> torch.Tensor:
        """The tensor in the compute dtype on the device. (The target's embedding and head
        are proven the drafter's by the pairing, target/model.py, which hashes them.)"""
        itemsize = spec.dtype.itemsize
        if spec.nbytes != spec.numel * itemsize:
            raise self.truncated(spec)
        dest = torch.empty(spec.shape, dtype=self.dtype, device=self.device)
        fh = self.file(spec.file)
        fh.seek(spec.offset)
        rows = spec.shape[0] if len(spec.shape) > 1 else 1
        row_bytes = spec.nbytes // rows if rows else 0
        per_chunk = max(1, STAGING_BYTES // max(row_bytes, 1))
        flat_dest = dest.view(rows, -1) if rows else dest
        direct = self.device.type == "cpu" and spec.dtype == self.dtype
        for first in range(0, rows, per_chunk):
            count = min(per_chunk, rows - first)
            nbytes = count * row_bytes
            target_rows = flat_dest[first:first + count]
            if direct:
                # The tensor's own memory, as bytes: the file is read straight into it.
                raw = target_rows.view(-1).view(torch.uint8).numpy()
                self._read_into(spec, fh, memoryview(raw))
                continue
            staging = self._host_staging(nbytes)
            self._read_into(spec, fh, memoryview(staging.numpy()))
            chunk = staging.view(spec.dtype).view(count, -1)
            if self.device.type == "cuda" and spec.dtype != self.dtype:
                on_device = self._dev_staging(nbytes)
                on_device.copy_(staging)
                chunk = on_device.view(spec.dtype).view(count, -1)
            # Synchronous: the staging buffer is reused by the next chunk.
            target_rows.copy_(chunk)
        return dest


def stored_tensors(entries, shapes: dict[str, tuple[int, ...]], directory: Path,
                   error: type[DSparkError]) -> dict[str, StoredTensor]:
    """Where each tensor of ``shapes`` (name -> torch shape, in load order) is in a target
    checkpoint's headers (``entries``: formats/safetensors.py's), each checked present, of
    that shape and a dtype the loader reads; refused as ``error`` naming the tensor. No
    tensor byte is read (every family's plan_target)."""
    tensors: dict[str, StoredTensor] = {}
    for name, shape in shapes.items():
        entry = entries.get(name)
        if entry is None:
            raise error(f"target {directory}: tensor {name!r} is missing", path=str(directory),
                        tensor=name, expected=list(shape), found="absent")
        if entry.shape != shape or entry.dtype not in STORED_DTYPES:
            raise error(f"target {entry.file}: tensor {name!r}: expected {list(shape)} "
                        f"BF16/F16/F32, found {list(entry.shape)} {entry.dtype}",
                        path=str(entry.file), tensor=name, expected=list(shape),
                        found=list(entry.shape))
        tensors[name] = StoredTensor(name=name, file=entry.file, offset=entry.begin,
                                     nbytes=entry.nbytes, dtype=STORED_DTYPES[entry.dtype],
                                     shape=shape)
    return tensors


def source_tensors(entries, shapes: dict[str, tuple[int, ...]], directory: Path, *,
                   unexpected: Callable[[str], str]) -> dict[str, StoredTensor]:
    """Where each tensor of a drafter checkpoint's table is (``shapes``: name -> torch
    shape, in load order), from its headers: none other present (21, ``unexpected(name)``
    saying why that one is not the kind's), each present (20), of its shape (22) and a
    dtype the loader reads (23); no tensor byte read (the DFlash2 and Gemma 4 assistant
    runtimes' checkpoint plans)."""
    from dspark_convert.errors import (MissingTensorError, TensorDtypeError, TensorShapeError,
                                       UnexpectedTensorError)

    extra = [name for name in entries if name not in shapes]
    if extra:
        entry = entries[extra[0]]
        raise UnexpectedTensorError(f"{entry.file}: tensor {extra[0]!r} {unexpected(extra[0])}",
                                    path=str(entry.file), tensor=extra[0], expected="absent",
                                    found=list(entry.shape))
    tensors: dict[str, StoredTensor] = {}
    for name, shape in shapes.items():
        entry = entries.get(name)
        if entry is None:
            raise MissingTensorError(f"{directory}: tensor {name!r} is missing; expected "
                                     f"{list(shape)}", path=str(directory), tensor=name,
                                     expected=list(shape), found="absent")
        if tuple(entry.shape) != shape:
            raise TensorShapeError(f"{entry.file}: tensor {name!r}: expected {list(shape)} "
                                   f"(config.json's geometry), found {list(entry.shape)}",
                                   path=str(entry.file), tensor=name, expected=list(shape),
                                   found=list(entry.shape))
        if entry.dtype not in STORED_DTYPES:
            raise TensorDtypeError(f"{entry.file}: tensor {name!r}: expected "
                                   f"{', '.join(STORED_DTYPES)}, found {entry.dtype}",
                                   path=str(entry.file), tensor=name,
                                   expected="|".join(STORED_DTYPES), found=entry.dtype)
        tensors[name] = StoredTensor(name=name, file=entry.file, offset=entry.begin,
                                     nbytes=entry.nbytes, dtype=STORED_DTYPES[entry.dtype],
                                     shape=shape)
    return tensors


def source_truncated(spec: StoredTensor) -> DSparkError:
    """A drafter checkpoint's file shorter than its header said (it changed after its plan)."""
    from dspark_convert.errors import SafetensorsFormatError

    return SafetensorsFormatError(f"{spec.file}: tensor {spec.name!r} is truncated: the file "
                                  "is shorter than its header says (it changed while being "
                                  "read)", path=str(spec.file), tensor=spec.name)


def target_truncated(spec: StoredTensor) -> DSparkError:
    """A target's file shorter than its header said (it changed after its plan): 70."""
    from dspark_convert.errors import RuntimeTargetError

    return RuntimeTargetError(f"target {spec.file}: tensor {spec.name!r} is truncated: the file "
                              "is shorter than its header says (it changed while being read)",
                              path=str(spec.file), tensor=spec.name)


def load_target(plan: StoredModel, *, device: torch.device, dtype: torch.dtype,
                progress: Progress | None = None) -> dict[str, torch.Tensor]:
    """Every tensor of a target's plan (either family's), once, in ``dtype`` on ``device``,
    under one "loading target" progress bar."""
    progress = progress or NoProgress()
    weights: dict[str, torch.Tensor] = {}
    progress.start("loading target", plan.stored_bytes)
    try:
        with TensorLoader(device=device, dtype=dtype, truncated=target_truncated,
                          progress=progress) as loader:
            for name, spec in plan.tensors.items():
                weights[name] = loader.load(spec)
    finally:
        progress.finish()
    return weights


def check_layer_count(names, pattern, n: int, directory: Path, field: str) -> None:
    """A target config's layer count (``n``, its field ``field``) must be the number of
    layers the headers hold (``names``; ``pattern`` matches a layer's tensor names, its
    group 1 the index), before any table is built by it. Distinct indices with len n and
    max n-1 are exactly 0..n-1, so no set of n elements is ever built from the config's
    number. Refused as RuntimeTargetError (70)."""
    from dspark_convert.errors import RuntimeTargetError

    present = {int(m[1]) for name in names if (m := pattern.match(name))}
    if len(present) != n or (present and max(present) != n - 1):
        found = (f"layers {min(present)}..{max(present)} ({len(present)} distinct)" if present
                 else "no layers")
        raise RuntimeTargetError(
            f"target {directory / 'config.json'}: field '{field}': expected the "
            f"{len(present)} layer(s) the safetensors headers hold ({found}), found {n}",
            path=str(directory / "config.json"), field=field, expected=len(present), found=n)
