"""Show the contract and the tensor table of a checkpoint or an artifact; write nothing.

Unlike ``convert``, a tensor-inventory problem does not stop the listing: the table shows
every row with its status, and ``problem`` holds the error the converter would raise.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from dspark_convert.artifact.format import GGUF_FILE, contract_from_metadata, read_metadata
from dspark_convert.contract.dspark import FeatureContract
from dspark_convert.errors import DSparkError, HeadConfigMismatchError, InventoryError, SourceNotFoundError
from dspark_convert.util.paths import check_path
from dspark_convert.formats.gguf_reader import read_gguf
from dspark_convert.formats.safetensors import read_checkpoint
from dspark_convert.source.checkpoint import check_checkpoint_inventory, load_config

MAX_UNEXPECTED_ROWS = 50

RowStatus = Literal["ok", "stripped", "absent", "missing", "unexpected", "shape", "dtype"]


class TensorRow(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str                       # source name for a checkpoint, GGUF name for an artifact
    maps_to: str | None             # the other name (GGUF for a checkpoint, source for an artifact)
    dtype: str | None
    shape: list[int] | None         # as stored (torch order in safetensors, GGUF order in GGUF)
    expected_shape: list[int] | None
    status: RowStatus


class InspectResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["checkpoint", "artifact"]
    path: str
    contract: FeatureContract
    rows: list[TensorRow]
    problem: dict | None            # the error convert/validate would raise, as a dict
    problem_exit_code: int | None
    # Rows for unexpected tensors beyond MAX_UNEXPECTED_ROWS are counted, not listed: a
    # hostile header of tens of thousands of tensors must not become a table that long.
    unexpected_not_listed: int = 0


def _inspect_checkpoint(directory: Path) -> InspectResult:
    checkpoint = read_checkpoint(directory)
    _raw, cfg, contract = load_config(directory)
    found = checkpoint.tensors
    rows = []
    for spec in contract.tensors:
        entry = found.get(spec.source_name)
        if entry is None:
            status = "missing" if spec.required else "absent"
        elif list(entry.shape) != spec.shape:
            status = "shape"
        else:
            status = "ok" if spec.gguf_name else "stripped"
        rows.append(TensorRow(name=spec.source_name, maps_to=spec.gguf_name,
                              dtype=entry.dtype if entry else None,
                              shape=list(entry.shape) if entry else None,
                              expected_shape=spec.shape, status=status))
    known = {s.source_name for s in contract.tensors}
    unexpected = [name for name in found if name not in known]
    for name in unexpected[:MAX_UNEXPECTED_ROWS]:
        entry = found[name]
        rows.append(TensorRow(name=name, maps_to=None, dtype=entry.dtype, shape=list(entry.shape),
                              expected_shape=None, status="unexpected"))
    problem = None
    try:
        check_checkpoint_inventory(checkpoint, cfg, contract)
    except (InventoryError, HeadConfigMismatchError) as exc:
        problem = exc
    return InspectResult(kind="checkpoint", path=str(directory), contract=contract, rows=rows,
                         problem=problem.to_dict() if problem else None,
                         problem_exit_code=problem.exit_code if problem else None,
                         unexpected_not_listed=max(0, len(unexpected) - MAX_UNEXPECTED_ROWS))


def _inspect_artifact(gguf_path: Path) -> InspectResult:
    from dspark_convert.commands.validate import check_gguf_inventory  # the validator's own inventory rule

    gguf = read_gguf(gguf_path)
    contract = contract_from_metadata(read_metadata(gguf, path=gguf_path.name), path=gguf_path.name)
    specs = {s.gguf_name: s for s in contract.written_tensors}
    rows = []
    unexpected = 0
    for info in gguf.tensors:
        spec = specs.get(info.name)
        if spec is None:
            unexpected += 1
            if unexpected > MAX_UNEXPECTED_ROWS:
                continue
            status = "unexpected"
        elif list(info.shape) != spec.gguf_shape:
            status = "shape"
        elif info.ggml_type.name != "BF16":
            status = "dtype"
        else:
            status = "ok"
        rows.append(TensorRow(name=info.name, maps_to=spec.source_name if spec else None,
                              dtype=info.ggml_type.name, shape=list(info.shape),
                              expected_shape=spec.gguf_shape if spec else None, status=status))
    present = {t.name for t in gguf.tensors}
    for name, spec in specs.items():
        if name not in present:
            rows.append(TensorRow(name=name, maps_to=spec.source_name, dtype=None, shape=None,
                                  expected_shape=spec.gguf_shape, status="missing"))
    problem = None
    try:
        check_gguf_inventory(gguf, contract, gguf_path.name)
    except DSparkError as exc:
        problem = exc
    return InspectResult(kind="artifact", path=str(gguf_path.parent), contract=contract, rows=rows,
                         problem=problem.to_dict() if problem else None,
                         problem_exit_code=problem.exit_code if problem else None,
                         unexpected_not_listed=max(0, unexpected - MAX_UNEXPECTED_ROWS))


def inspect_path(path: str | os.PathLike) -> InspectResult:
    """A checkpoint directory, an artifact directory, or a drafter.gguf file."""
    target = check_path(path, what="the path to inspect", error=SourceNotFoundError)
    if target.is_file() and target.suffix == ".gguf":
        return _inspect_artifact(target)
    if target.is_dir() and (target / GGUF_FILE).is_file():
        return _inspect_artifact(target / GGUF_FILE)
    return _inspect_checkpoint(target)
