"""The drafter's tensors, read from ``drafter.gguf`` with our bounded reader.

Nothing comes from the source checkpoint: the contract is rebuilt from the GGUF metadata
(the same code ``dspark validate`` uses) and every tensor is read from the file. GGUF
shapes are the reverse of torch shapes and BF16 values are stored as their raw 16 bits, so
a BF16 tensor of GGUF shape ``[in, out]`` is the row-major torch tensor ``[out, in]``.
Compute is float32 (BF16 widens exactly).
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..artifact_format import GGUF_FILE, contract_from_metadata, provenance_from_metadata
from ..contract import FeatureContract
from ..errors import GGUFFormatError, TensorDtypeError, TensorShapeError
from ..gguf_reader import read_gguf, tensor_data


@dataclass(frozen=True)
class DrafterWeights:
    """Everything the artifact says about the drafter, tensors keyed by their HF names
    (``layers.0.self_attn.q_proj.weight``), float32 on ``device``."""

    contract: FeatureContract
    tensors: dict[str, torch.Tensor]
    embed_sha256: str | None      # dflash.target.embed_sha256, when the GGUF records it
    lm_head_sha256: str | None    # dflash.target.lm_head_sha256


def load_drafter_weights(artifact: str | os.PathLike, *, device: str | torch.device = "cpu"
                         ) -> DrafterWeights:
    """Read ``artifact/drafter.gguf`` into float32 torch tensors on ``device``."""
    path = Path(artifact) / GGUF_FILE
    gguf = read_gguf(path)
    kv = {key: value.value for key, value in gguf.kv.items()}
    label = GGUF_FILE
    contract = contract_from_metadata(kv, path=label)
    prov = provenance_from_metadata(kv, path=label)
    infos = {t.name: t for t in gguf.tensors}

    tensors: dict[str, torch.Tensor] = {}
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
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
            view = tensor_data(gguf, info, mm)
            try:
                bits = np.frombuffer(view, dtype="<u2").copy()
            finally:
                view.release()
            value = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)
            tensors[spec.source_name] = value.reshape(torch_shape).to(device=device,
                                                                      dtype=torch.float32)
    return DrafterWeights(contract=contract, tensors=tensors, embed_sha256=prov.embed_sha256,
                          lm_head_sha256=prov.lm_head_sha256)
