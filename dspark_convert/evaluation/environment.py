"""Who and where: the target's identity and the machine an eval ran on.

The target identity is what a report and a calibration name the target by: SHA-256 of its
``config.json``, of its weights (``hashing.weights_digest`` over the safetensors files the
runtime reads: the file's own SHA-256, or for shards the digest of the sorted
"<file> <sha256>" lines), of ``tokenizer.json`` when present, and of the embedding and head
tensors (the same hashes a GGUF records in ``dflash.target.*``). Two directories holding the
same files have the same identity wherever they are; the path is kept for the reader only.
"""

from __future__ import annotations

import platform
import sys

from pydantic import BaseModel, ConfigDict

from dspark_convert import __version__
from dspark_convert.util.machine import cpu_name
from dspark_convert.util.text import shown


class TargetIdentity(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

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


def target_identity(target, progress=None) -> TargetIdentity:
    """The identity of an opened target (target/model.py's ``Target``: what the pairing
    read): its config and tokenizer file hashes, its weights' hash, its embedding and
    head hashes (read once per run) and its geometry."""
    from dspark_convert.target.model import hash_target_tensors, weights_sha256

    files = {f.path: f.sha256 for f in target.files}
    tensors = {t.role: t.sha256 for t in hash_target_tensors(target, progress)}
    cfg = target.config
    return TargetIdentity(path=shown(target.directory), config_sha256=files["config.json"],
                          weights_sha256=weights_sha256(target, progress),
                          tokenizer_sha256=target.tokenizer.record.sha256,
                          embed_sha256=tensors["embedding"], lm_head_sha256=tensors["head"],
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


def describe_environment(device, requested: str, dtype: str) -> Environment:
    import torch

    if device is None:
        name, label = "none", "none"
    elif device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        name, label = torch.cuda.get_device_name(index), f"cuda:{index}"
    else:
        name, label = cpu_name(), str(device)
    return Environment(device=label, device_requested=requested, device_name=name, dtype=dtype,
                       torch_version=torch.__version__, cuda_version=torch.version.cuda,
                       torch_threads=torch.get_num_threads(),
                       python_version=sys.version.split()[0], platform=platform.platform(),
                       dspark_convert_version=__version__)
