"""The one tensor-inventory check: what is there against what the contract names.

A checkpoint's tensors (source names, torch shapes) and an artifact's (GGUF names, GGUF
shapes) are compared by the same walk, ``inventory_rows``: one row per tensor with its
status, in the contract's order, then the tensors it does not name. ``convert`` refuses
the first problem of a checkpoint (``check_inventory``), ``validate`` of an artifact
(``check_gguf_inventory``, which adds the format's fixed order and tensor types), and
``inspect`` shows the rows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

from dspark_convert.contract.dspark import SOURCE_DTYPES, FeatureContract
from dspark_convert.errors import (
    HeadConfigMismatchError,
    MissingTensorError,
    TensorDtypeError,
    TensorShapeError,
    UnexpectedTensorError,
)

Side = Literal["checkpoint", "gguf"]
RowStatus = Literal["ok", "stripped", "absent", "missing", "unexpected", "shape", "dtype"]


class TensorRow(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str                       # source name for a checkpoint, GGUF name for an artifact
    maps_to: str | None             # the other name (GGUF for a checkpoint, source for an artifact)
    dtype: str | None
    shape: list[int] | None         # as stored (torch order in safetensors, GGUF order in GGUF)
    expected_shape: list[int] | None
    status: RowStatus


@dataclass(frozen=True)
class _Expected:
    name: str
    maps_to: str | None
    shape: list[int]
    shape_text: str                 # "[64, 192] (= [H, m·H])", for messages
    required: bool
    stripped: bool                  # hashed and left out of drafter.gguf


def _expected(contract: FeatureContract, side: Side) -> list[_Expected]:
    out = []
    for spec in contract.tensors:
        if side == "checkpoint":
            out.append(_Expected(spec.source_name, spec.gguf_name, spec.shape,
                                 f"{spec.shape} (= [{', '.join(spec.shape_expr)}])",
                                 spec.required, spec.gguf_name is None))
        elif spec.gguf_name is not None:
            out.append(_Expected(spec.gguf_name, spec.source_name, spec.gguf_shape,
                                 f"{spec.gguf_shape} (= [{', '.join(reversed(spec.shape_expr))}])",
                                 True, False))
    return out


def inventory_rows(contract: FeatureContract, found: Mapping[str, tuple[str, Sequence[int]]],
                   side: Side, *, type_ok: Callable[[str, str], bool] | None = None,
                   unexpected_limit: int | None = None) -> tuple[list[TensorRow], int]:
    """One row per tensor the contract names (ok, stripped, absent, missing, shape or
    dtype), then one per tensor it does not name (unexpected), at most
    ``unexpected_limit`` of those; returns the rows and how many unexpected ones were left
    out. ``found``: {name: (dtype, shape)} as stored; ``type_ok(name, dtype)`` says whether
    a stored type is allowed (artifacts only)."""
    rows, wants = [], _expected(contract, side)
    for want in wants:
        got = found.get(want.name)
        if got is None:
            status = "missing" if want.required else "absent"
        elif type_ok is not None and not type_ok(want.name, got[0]):
            status = "dtype"
        elif list(got[1]) != want.shape:
            status = "shape"
        else:
            status = "stripped" if want.stripped else "ok"
        rows.append(TensorRow(name=want.name, maps_to=want.maps_to,
                              dtype=got[0] if got else None,
                              shape=list(got[1]) if got else None,
                              expected_shape=want.shape, status=status))
    known = {w.name for w in wants}
    unexpected = [name for name in found if name not in known]
    listed = unexpected if unexpected_limit is None else unexpected[:unexpected_limit]
    rows += [TensorRow(name=name, maps_to=None, dtype=found[name][0], shape=list(found[name][1]),
                       expected_shape=None, status="unexpected") for name in listed]
    return rows, len(unexpected) - len(listed)


def _first_problem(contract: FeatureContract, rows: list[TensorRow], side: Side, path: str,
                   order: Sequence[str] | None = None):
    """The error of the first problem, in a fixed order: missing, unexpected, (the file's
    order,) shape, then type; None when there is none."""
    expected = {w.name: w for w in _expected(contract, side)}
    missing = [r for r in rows if r.status == "missing"]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 and side == "checkpoint" else ""
        what = "GGUF shape " if side == "gguf" else "shape "
        want = expected[missing[0].name]
        shape = want.shape if side == "gguf" else want.shape_text
        return MissingTensorError(f"{path}: tensor '{missing[0].name}' is missing; expected {what}"
                                  f"{shape}{more}", path=path, tensor=missing[0].name,
                                  expected=want.shape, found="missing")
    unexpected = sorted(r.name for r in rows if r.status == "unexpected") if side == "checkpoint" \
        else [r.name for r in rows if r.status == "unexpected"]
    if unexpected:
        more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 and side == "checkpoint" else ""
        where = (f"the {contract.family} contract" if side == "checkpoint"
                 else "the contract the metadata describes")
        return UnexpectedTensorError(f"{path}: tensor '{unexpected[0]}' is not part of {where}{more}",
                                     path=path, tensor=unexpected[0], expected="absent",
                                     found="present")
    if order is not None:
        names = list(expected)             # the contract's order (a dict keeps it)
        if list(order) != names:
            first = next(i for i, (a, b) in enumerate(zip(order, names)) if a != b)
            return UnexpectedTensorError(f"{path}: tensor {first} is '{order[first]}'; expected "
                                         f"'{names[first]}' (the format's fixed order)", path=path,
                                         tensor=order[first], expected=names[first],
                                         found=order[first])
    for row in rows:
        if row.status in ("shape", "dtype"):
            want = expected[row.name]
            if row.status == "dtype" and side == "gguf":
                return TensorDtypeError(f"{path}: tensor '{row.name}': expected type BF16, found "
                                        f"{row.dtype}", path=path, tensor=row.name,
                                        expected="BF16", found=row.dtype)
            if row.status == "shape":
                what = "GGUF shape" if side == "gguf" else "shape"
                return TensorShapeError(f"{path}: tensor '{row.name}': expected {what} "
                                        f"{want.shape_text}, found {row.shape}", path=path,
                                        tensor=row.name, expected=want.shape, found=row.shape)
    return None


def check_head_tensors(contract: FeatureContract, names: set[str], *, path: str) -> None:
    """Refuse Markov / confidence fields that disagree with the tensors present.

    Done before the one-by-one inventory so that a config that names the wrong head gets
    a message about the head, not a list of missing and unexpected tensors.
    """
    markov = getattr(contract, "markov_head", None)
    if markov is None:      # a kind without DeepSpec's heads (DFlash2, the assistant)
        return
    has_markov = any(n.startswith("markov_head.") for n in names)
    has_gate = any(n.startswith("markov_head.gate_proj.") for n in names)
    has_joint = any(n.startswith("markov_head.joint_proj.") for n in names)
    has_conf = any(n.startswith("confidence_head.") for n in names)
    if markov.rank == 0 and has_markov:
        raise HeadConfigMismatchError(
            f"{path}: config says markov_rank 0 but the weights hold markov_head.* tensors; "
            "expected no Markov head", path=path, field="markov_rank", expected=0,
            found="markov_head tensors")
    if markov.rank > 0 and not has_markov:
        raise HeadConfigMismatchError(
            f"{path}: config says markov_rank {markov.rank} but the weights hold no markov_head.* "
            "tensors", path=path, field="markov_rank", expected=markov.rank,
            found="no markov_head tensors")
    if markov.rank > 0:
        found_type = "gated" if has_gate else "rnn" if has_joint else "vanilla"
        if has_gate and has_joint:
            found_type = "gated and rnn"
        if found_type != markov.type:
            raise HeadConfigMismatchError(
                f"{path}: config says markov_head_type {markov.type!r} but the weights hold a "
                f"{found_type} Markov head", path=path, field="markov_head_type",
                expected=markov.type, found=found_type)
    if contract.confidence_head.enabled != has_conf:
        raise HeadConfigMismatchError(
            f"{path}: config says enable_confidence_head {str(contract.confidence_head.enabled).lower()} "
            f"but the weights {'hold' if has_conf else 'hold no'} confidence_head.* tensors",
            path=path, field="enable_confidence_head", expected=contract.confidence_head.enabled,
            found=has_conf)


def check_inventory(contract: FeatureContract, tensors: dict[str, tuple[str, list[int]]],
                    *, path: str, expected_dtype: str | None = None) -> str:
    """A checkpoint's {name: (dtype, torch shape)} against the contract; returns the common
    dtype. Raises the error of the first problem in a fixed order: head fields, missing,
    unexpected, shape, dtype. ``expected_dtype`` comes from config.json's ``dtype`` when it
    has one; otherwise every tensor must share one dtype of SOURCE_DTYPES."""
    check_head_tensors(contract, set(tensors), path=path)
    rows, _ = inventory_rows(contract, tensors, "checkpoint")
    problem = _first_problem(contract, rows, "checkpoint", path)
    if problem is not None:
        raise problem
    dtype = expected_dtype
    # Say where the expectation comes from: config.json's dtype, or the first tensor.
    origin = " (config.json 'dtype')" if expected_dtype is not None else ""
    for row in rows:
        if row.dtype is None:
            continue
        if dtype is None:
            if row.dtype not in SOURCE_DTYPES:
                raise TensorDtypeError(f"{path}: tensor '{row.name}': expected dtype one of "
                                       f"{', '.join(SOURCE_DTYPES)}, found {row.dtype}", path=path,
                                       tensor=row.name, expected=list(SOURCE_DTYPES),
                                       found=row.dtype)
            dtype, origin = row.dtype, f" (as '{row.name}')"
        elif row.dtype != dtype:
            raise TensorDtypeError(f"{path}: tensor '{row.name}': expected dtype {dtype}"
                                   f"{origin}, found {row.dtype}", path=path, tensor=row.name,
                                   expected=dtype, found=row.dtype)
    assert dtype is not None  # at least fc.weight is required and present
    return dtype


def gguf_found(gguf) -> dict[str, tuple[str, list[int]]]:
    """A parsed drafter.gguf's tensors as the inventory reads them."""
    return {t.name: (t.ggml_type.name, list(t.shape)) for t in gguf.tensors}


def check_gguf_inventory(gguf, contract: FeatureContract, label: str, *,
                         type_ok: Callable[[str, str], bool] | None = None) -> None:
    """An artifact's tensors against the contract its metadata rebuilds: names, the
    format's fixed order, types (BF16 unless ``type_ok`` allows others), GGUF shapes."""
    type_ok = type_ok or (lambda _name, dtype: dtype == "BF16")
    rows, _ = inventory_rows(contract, gguf_found(gguf), "gguf", type_ok=type_ok)
    problem = _first_problem(contract, rows, "gguf", label,
                             order=[t.name for t in gguf.tensors])
    if problem is not None:
        raise problem
