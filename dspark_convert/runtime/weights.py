"""The drafter's tensors, read from ``drafter.gguf`` with our bounded reader.

Nothing comes from the source checkpoint: the contract is rebuilt from the GGUF metadata
(the same code ``dspark validate`` uses) and every tensor is read from the file. GGUF
shapes are the reverse of torch shapes and BF16 values are stored as their raw 16 bits, so
a BF16 tensor of GGUF shape ``[in, out]`` is the row-major torch tensor ``[out, in]``.

Two steps, like the target's: ``plan_drafter`` parses the header and checks every tensor
the contract needs (present, BF16, shape) without reading tensor data; the load then fills
each tensor once, in the compute dtype on the compute device (runtime/loading.py; BF16
widens to float32 exactly).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from dspark_convert.artifact.format import GGUF_FILE, contract_from_metadata, read_metadata
from dspark_convert.contract.dspark import FeatureContract
from dspark_convert.errors import GGUFFormatError, TensorDtypeError, TensorShapeError
from dspark_convert.formats.gguf_reader import GGUFFile, read_gguf
from dspark_convert.util.progress import NoProgress, Progress
from dspark_convert.runtime.loading import StoredModel, StoredTensor, TensorLoader


@dataclass(frozen=True)
class DrafterPlan(StoredModel):
    """An artifact checked from its GGUF header: the contract and where each tensor is
    (``tensors`` by HF name, the contract's order)."""

    path: Path
    contract: FeatureContract


@dataclass(frozen=True)
class DrafterWeights:
    """Everything the artifact says about the drafter, tensors keyed by their HF names
    (``layers.0.self_attn.q_proj.weight``), in the compute dtype on ``device``."""

    contract: FeatureContract
    tensors: dict[str, torch.Tensor]


def plan_drafter(artifact: str | os.PathLike, *, gguf: GGUFFile | None = None) -> DrafterPlan:
    """Parse ``artifact/drafter.gguf`` (or take ``gguf``, the file as `dspark validate`
    already parsed it) and check the tensors the contract names."""
    path = Path(artifact) / GGUF_FILE
    gguf = gguf if gguf is not None else read_gguf(path)   # bounds every offset and size
    label = GGUF_FILE
    contract = contract_from_metadata(read_metadata(gguf, path=label), path=label)
    infos = {t.name: t for t in gguf.tensors}
    tensors: dict[str, StoredTensor] = {}
    for spec in contract.tensors:
        if spec.gguf_name is None:       # embedding and head: bound from the target
            continue
        info = infos.get(spec.gguf_name)
        if info is None:
            raise GGUFFormatError(f"{label}: tensor {spec.gguf_name!r} is missing",
                                  path=label, tensor=spec.gguf_name)
        if info.ggml_type.name != "BF16":
            raise TensorDtypeError(f"{label}: tensor {spec.gguf_name!r}: expected BF16, "
                                   f"found {info.ggml_type.name}", path=label,
                                   tensor=spec.gguf_name, expected="BF16",
                                   found=info.ggml_type.name)
        torch_shape = list(reversed(info.shape))
        if torch_shape != list(spec.shape):
            raise TensorShapeError(f"{label}: tensor {spec.gguf_name!r}: expected torch "
                                   f"shape {list(spec.shape)}, found {torch_shape}",
                                   path=label, tensor=spec.gguf_name,
                                   expected=list(spec.shape), found=torch_shape)
        tensors[spec.source_name] = StoredTensor(
            name=spec.gguf_name, file=path, offset=info.data_offset, nbytes=info.nbytes,
            dtype=torch.bfloat16, shape=tuple(torch_shape))
    return DrafterPlan(path=path, contract=contract, tensors=tensors)


def _truncated(spec: StoredTensor) -> GGUFFormatError:
    return GGUFFormatError(f"{GGUF_FILE}: tensor {spec.name!r} is truncated: the file is "
                           "shorter than its header says (it changed while being read)",
                           path=str(spec.file), tensor=spec.name)


def load_drafter_weights(artifact: str | os.PathLike, *, device: str | torch.device = "cpu",
                         dtype: torch.dtype = torch.float32, plan: DrafterPlan | None = None,
                         progress: Progress | None = None) -> DrafterWeights:
    """Read ``artifact/drafter.gguf`` into ``dtype`` torch tensors on ``device``."""
    plan = plan if plan is not None else plan_drafter(artifact)
    progress = progress or NoProgress()
    device = torch.device(device)
    tensors: dict[str, torch.Tensor] = {}
    progress.start("loading drafter", plan.stored_bytes)
    try:
        with TensorLoader(device=device, dtype=dtype, truncated=_truncated,
                          progress=progress) as loader:
            for name, spec in plan.tensors.items():
                tensors[name] = loader.load(spec)
    finally:
        progress.finish()
    return DrafterWeights(contract=plan.contract, tensors=tensors)
