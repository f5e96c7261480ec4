"""Who and where: the target's identity and the machine an eval ran on.

The target identity is what a report and a calibration name the target by: SHA-256 of its
``config.json``, of its weights (``hashing.weights_digest`` over the safetensors files the
runtime reads: the file's own SHA-256, or for shards the digest of the sorted
"<file> <sha256>" lines), of ``tokenizer.json`` when present, and of the embedding and head
tensors (the same hashes a GGUF records in ``dflash.target.*``). Two directories holding the
same files have the same identity wherever they are; the path is kept for the reader only.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from dspark_convert import __version__
from dspark_convert.util.hashing import sha256_file, weights_digest
from dspark_convert.util.text import shown


class TargetIdentity(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    config_sha256: str
    weights_sha256: str
    tokenizer_sha256: str | None
    embed_sha256: str
    lm_head_sha256: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int

    def difference(self, other: "TargetIdentity") -> tuple[str, object, object] | None:
        """The first field (path aside) where ``other`` differs: (field, ours, theirs)."""
        for name in type(self).model_fields:
            if name == "path":
                continue
            a, b = getattr(self, name), getattr(other, name)
            if a != b:
                return name, a, b
        return None


def target_identity(directory: str | os.PathLike, model) -> TargetIdentity:
    """``model``: the runtime's loaded ``Qwen3Target`` for ``directory`` (its embedding and
    head hashes and config; the weights files are hashed here)."""
    from dspark_convert.formats.safetensors import read_checkpoint

    directory = Path(directory)
    files = read_checkpoint(directory).files
    weights = weights_digest([(p.name, sha256_file(p)) for p in files.weights])
    tokenizer = directory / "tokenizer.json"
    cfg = model.config
    return TargetIdentity(path=shown(directory), config_sha256=sha256_file(files.config),
                          weights_sha256=weights,
                          tokenizer_sha256=sha256_file(tokenizer) if tokenizer.is_file() else None,
                          embed_sha256=model.embed_sha256, lm_head_sha256=model.lm_head_sha256,
                          vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                          num_hidden_layers=cfg.num_hidden_layers)


class Environment(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    device: str                   # what ran: "cpu", "cuda:0"; "none" when nothing could
    device_requested: str         # auto, cpu or cuda
    device_name: str
    dtype: str                    # the runtime's compute dtype (the target's weights)
    torch_version: str
    cuda_version: str | None      # the CUDA torch was built with
    torch_threads: int
    python_version: str
    platform: str
    dspark_convert_version: str


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def describe_environment(device, requested: str, dtype: str) -> Environment:
    import torch

    if device is None:
        name, label = "none", "none"
    elif device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        name, label = torch.cuda.get_device_name(index), f"cuda:{index}"
    else:
        name, label = _cpu_name(), str(device)
    return Environment(device=label, device_requested=requested, device_name=name, dtype=dtype,
                       torch_version=torch.__version__, cuda_version=torch.version.cuda,
                       torch_threads=torch.get_num_threads(),
                       python_version=sys.version.split()[0], platform=platform.platform(),
                       dspark_convert_version=__version__)
