"""The drafter's tensors, read from ``drafter.gguf`` with our bounded reader.

Nothing comes from the source checkpoint: the contract is rebuilt from the GGUF metadata
(the same code ``dspark validate`` uses) and every tensor is read from the file. GGUF
shapes are the reverse of torch shapes and BF16 values are stored as their raw 16 bits, so
a BF16 tensor of GGUF shape ``[in, out]`` is the row-major torch tensor ``[out, in]``.

Two steps, like the target's: ``plan_drafter`` parses the header and checks every tensor
the contract needs (present, its type, shape) without reading tensor data; the load then
fills each tensor once, in the compute dtype on the compute device (runtime/loading.py; BF16
widens to float32 exactly).

A quantized artifact (`dspark quantize`: Q8_0 / Q5_0 / Q4_0 matrices, docs/ARTIFACT_FORMAT.md)
is dequantized on load: each quantized matrix is read in chunks of whole rows and turned
into float32 by gguf-py's ``dequantize`` (formats/quants.py), exactly the value d x q of each
block (an F16 scale times a small integer is exact in float32), then copied into its
tensor in the compute dtype. The runtime then computes as with a BF16 drafter of those
values: what the precision costs in acceptance, not what an engine's quantized kernels do.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from dspark_convert.artifact.format import GGUF_FILE, contract_from_metadata, read_metadata
from dspark_convert.artifact.quantized import QUANTIZATION_KEY, allowed_types, rule_whens
from dspark_convert.contract.dspark import FeatureContract
from dspark_convert.errors import GGUFFormatError, TensorDtypeError, TensorShapeError
from dspark_convert.formats import quants
from dspark_convert.formats.gguf_reader import GGUFFile, read_gguf
from dspark_convert.util.hashing import read_full
from dspark_convert.util.progress import NoProgress, Progress
from dspark_convert.runtime.loading import StoredModel, StoredTensor, TensorLoader


@dataclass(frozen=True)
class QuantizedTensor(StoredTensor):
    """A Q8_0 / Q5_0 / Q4_0 matrix: ``nbytes`` of GGML blocks at ``offset``. ``shape`` is the
    torch shape of its values (what the load allocates, and the memory estimate counts);
    ``dtype`` is the bytes' (uint8)."""

    quant: str = ""


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
    kv = read_metadata(gguf, path=label)
    contract = contract_from_metadata(kv, path=label)
    qtype = kv.get(QUANTIZATION_KEY)          # None: a BF16 artifact
    whens = rule_whens(contract)
    infos = {t.name: t for t in gguf.tensors}
    tensors: dict[str, StoredTensor] = {}
    for spec in contract.tensors:
        if spec.gguf_name is None:       # embedding and head: bound from the target
            continue
        info = infos.get(spec.gguf_name)
        if info is None:
            raise GGUFFormatError(f"{label}: tensor {spec.gguf_name!r} is missing",
                                  path=label, tensor=spec.gguf_name)
        # The one type rule (artifact/quantized.py): BF16 everywhere in a BF16 artifact.
        allowed = allowed_types(spec.kind, whens[spec.gguf_name], len(info.shape), qtype)
        found = info.ggml_type.name
        if found not in allowed:
            raise TensorDtypeError(f"{label}: tensor {spec.gguf_name!r}: expected "
                                   f"{' or '.join(allowed)}, found {found}", path=label,
                                   tensor=spec.gguf_name, expected="|".join(allowed),
                                   found=found)
        torch_shape = list(reversed(info.shape))
        if torch_shape != list(spec.shape):
            raise TensorShapeError(f"{label}: tensor {spec.gguf_name!r}: expected torch "
                                   f"shape {list(spec.shape)}, found {torch_shape}",
                                   path=label, tensor=spec.gguf_name,
                                   expected=list(spec.shape), found=torch_shape)
        if found == "BF16":
            tensors[spec.source_name] = StoredTensor(
                name=spec.gguf_name, file=path, offset=info.data_offset, nbytes=info.nbytes,
                dtype=torch.bfloat16, shape=tuple(torch_shape))
        else:
            tensors[spec.source_name] = QuantizedTensor(
                name=spec.gguf_name, file=path, offset=info.data_offset, nbytes=info.nbytes,
                dtype=torch.uint8, shape=tuple(torch_shape), quant=found)
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
                if isinstance(spec, QuantizedTensor):
                    tensors[name] = _dequantized(spec, loader.file(plan.path), device, dtype,
                                                 progress)
                else:
                    tensors[name] = loader.load(spec)
    finally:
        progress.finish()
    return DrafterWeights(contract=plan.contract, tensors=tensors)


def _dequantized(spec: QuantizedTensor, fh, device: torch.device, dtype: torch.dtype,
                 progress: Progress) -> torch.Tensor:
    """A quantized matrix [out, in] read in chunks of whole rows (one row: the ``in`` values
    of one output, GGUF ne0), each dequantized by gguf-py to float32 and copied into the
    tensor in the compute dtype on the device: the host holds one chunk, whatever the size."""
    rows, ne0 = spec.shape
    row_bytes = quants.row_nbytes(ne0, spec.quant)
    if spec.nbytes != rows * row_bytes:
        raise _truncated(spec)
    dest = torch.empty(spec.shape, dtype=dtype, device=device)
    per_chunk = quants.rows_per_chunk(ne0)
    buffer = bytearray(min(rows, per_chunk) * row_bytes)
    fh.seek(spec.offset)
    for first in range(0, rows, per_chunk):
        count = min(per_chunk, rows - first)
        view = memoryview(buffer)[:count * row_bytes]
        if read_full(fh, view) != len(view):
            raise _truncated(spec)
        values = quants.dequantize(view, spec.quant, ne0)          # float32 [count, ne0]
        dest[first:first + count].copy_(torch.from_numpy(values))
        progress.advance(len(view))
    return dest
