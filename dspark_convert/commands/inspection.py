"""Show the contract and the tensor table of a checkpoint or an artifact; write nothing.

Unlike ``convert``, a tensor-inventory problem does not stop the listing: the table shows
every row with its status, and ``problem`` holds the error the converter would raise.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from dspark_convert.artifact.engines import engine_records, reports_for_gguf
from dspark_convert.artifact.file_kinds import artifact_of, file_kind
from dspark_convert.artifact.format import (
    GGUF_FILE,
    as_format_types,
    contract_from_metadata,
    read_metadata,
)
from dspark_convert.artifact.manifest import EngineName, EngineRecord
from dspark_convert.artifact.quantized import (
    QUANTIZATION_KEY,
    any_quantized_type,
    check_quantized_types,
    type_ok,
)
from dspark_convert.contract.dspark import FeatureContract
from dspark_convert.contract.families import AnyContract
from dspark_convert.contract.inventory import TensorRow, check_gguf_inventory, gguf_found, inventory_rows
from dspark_convert.errors import (
    HeadConfigMismatchError,
    InventoryError,
    KEqVMismatchError,
    QuantizedTensorError,
    SourceNotFoundError,
)
from dspark_convert.util.paths import check_path
from dspark_convert.formats.gguf_reader import ANY_INTEGER_ALIGNMENT, read_gguf
from dspark_convert.formats.safetensors import read_checkpoint
from dspark_convert.source.checkpoint import (check_checkpoint_inventory, read_contract,
                                              source_path_error)

MAX_UNEXPECTED_ROWS = 50
# Tensors of a GGUF file not of our format listed (a full model's file holds hundreds).
MAX_LISTED_TENSORS = 200

class GGUFTensorRow(BaseModel):
    """A tensor of a GGUF file that is not of our format, as stored (no contract to hold
    it to)."""
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    type: str                       # the ggml type's name
    shape: list[int]                # GGUF order: ne0 first


class InspectResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["checkpoint", "artifact", "gguf"] = Field(
        description="gguf: a GGUF file that is not of our format (no contract)")
    path: str
    contract: AnyContract | None = Field(description="null for a GGUF file not of our format")
    rows: list[TensorRow]
    problem: dict | None            # the error convert/validate would raise, as a dict
    problem_exit_code: int | None
    # Rows for unexpected tensors beyond MAX_UNEXPECTED_ROWS are counted, not listed: a
    # hostile header of tens of thousands of tensors must not become a table that long.
    unexpected_not_listed: int = 0
    # A .gguf file given alone (docs/ENGINES.md, "Files other tools wrote"): what it is,
    # the keys of our format another tool stored under another type (read as Strata reads
    # them), its tensors as stored when it is not of our format, and each engine's report.
    file: str | None = Field(default=None, description="a .gguf file given alone: what it is")
    retyped: list[str] = Field(default_factory=list, description="keys of our format stored "
                               "under another GGUF type, read as Strata's loader reads them")
    tensors: list[GGUFTensorRow] = Field(default_factory=list, description="a GGUF file not "
                                         f"of our format: its first {MAX_LISTED_TENSORS} tensors")
    tensors_not_listed: int = 0
    engines: dict[EngineName, EngineRecord] | None = Field(
        default=None, description="a .gguf file given alone: each engine's verdict")


def _result(kind, path: Path, contract: FeatureContract, rows, left_out: int,
            check) -> InspectResult:
    problem = None
    try:
        check()
    except (InventoryError, HeadConfigMismatchError, KEqVMismatchError, QuantizedTensorError) as exc:
        problem = exc
    return InspectResult(kind=kind, path=str(path), contract=contract, rows=rows,
                         problem=problem.to_dict() if problem else None,
                         problem_exit_code=problem.exit_code if problem else None,
                         unexpected_not_listed=left_out)


def _inspect_checkpoint(directory: Path) -> InspectResult:
    checkpoint = read_checkpoint(directory)
    _raw, _family, cfg, contract = read_contract(directory)
    found = {name: (e.dtype, list(e.shape)) for name, e in checkpoint.tensors.items()}
    rows, left_out = inventory_rows(contract, found, "checkpoint",
                                    unexpected_limit=MAX_UNEXPECTED_ROWS)
    return _result("checkpoint", directory, contract, rows, left_out,
                   lambda: check_checkpoint_inventory(checkpoint, cfg, contract))


def _inspect_bare(gguf_path: Path) -> InspectResult:
    """A .gguf file given alone: read as `dspark validate FILE.gguf` reads it (any integer
    type for general.alignment, our format's keys another tool re-typed read as Strata reads
    them); a file not of our format is listed as stored, with each engine's report."""
    gguf = read_gguf(gguf_path, alignment_types=ANY_INTEGER_ALIGNMENT)
    kind = file_kind(gguf)
    extra = {"file": kind.describe(gguf),
             "engines": {name: EngineRecord(**record) for name, record in
                         engine_records(reports_for_gguf(gguf, path=gguf_path.name)).items()}}
    if kind.ours:
        entries, retyped = as_format_types(gguf.kv)
        result = _inspect_artifact(gguf_path, gguf, entries)
        return result.model_copy(update={**extra, "retyped": list(retyped),
                                          "path": str(gguf_path)})
    listed = [GGUFTensorRow(name=t.name, type=t.ggml_type.name, shape=list(t.shape))
              for t in gguf.tensors[:MAX_LISTED_TENSORS]]
    return InspectResult(kind="gguf", path=str(gguf_path), contract=None, rows=[],
                         problem=None, problem_exit_code=None, tensors=listed,
                         tensors_not_listed=len(gguf.tensors) - len(listed), **extra)


def _inspect_artifact(gguf_path: Path, gguf=None, entries=None) -> InspectResult:
    gguf = read_gguf(gguf_path) if gguf is None else gguf
    kv = read_metadata(gguf, path=gguf_path.name, entries=entries)
    contract = contract_from_metadata(kv, path=gguf_path.name)
    # The table: BF16, or in a quantized artifact the type artifact/quantized.py's rule
    # allows each tensor. The problem: validate's two checks, in its order (the inventory,
    # then the quantized type rule with its own error, 48).
    qtype = kv.get(QUANTIZATION_KEY)
    rows, left_out = inventory_rows(contract, gguf_found(gguf), "gguf",
                                    type_ok=type_ok(contract, qtype),
                                    unexpected_limit=MAX_UNEXPECTED_ROWS)

    def check() -> None:
        check_gguf_inventory(gguf, contract, gguf_path.name, type_ok=any_quantized_type(qtype))
        if qtype is not None:
            check_quantized_types(gguf.tensors, contract, qtype, gguf_path.name)
    return _result("artifact", gguf_path.parent, contract, rows, left_out, check)


def inspect_path(path: str | os.PathLike) -> InspectResult:
    """A checkpoint directory, an artifact directory, an artifact's drafter.gguf, or a .gguf
    file alone (no manifest.json beside it: read as a bare file, ``_inspect_bare``)."""
    target = check_path(path, what="the path to inspect", error=SourceNotFoundError)
    if target.is_file() and target.suffix == ".gguf":
        if artifact_of(target) is not None:
            return _inspect_artifact(target)            # its artifact's, as by the directory
        return _inspect_bare(target)
    # A drafter.gguf that is there but not a regular file (a FIFO, a dangling link) makes it
    # an artifact to refuse (read_gguf says why), not a checkpoint without a config.json.
    if not target.is_dir() and not target.is_symlink():
        problem = source_path_error(target, expected="a checkpoint or artifact directory, "
                                    "or a GGUF file", hub=False)
        if problem is not None:
            raise problem
    gguf = target / GGUF_FILE
    if target.is_dir() and (gguf.exists() or gguf.is_symlink()):
        return _inspect_artifact(gguf)
    return _inspect_checkpoint(target)
