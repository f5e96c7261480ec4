"""`dspark validate FILE.gguf`: a drafter file that came without a manifest, checked as far
as the file allows and reported as each engine reads it (docs/ENGINES.md, "Files other
tools wrote").

A release engineer is handed a GGUF that Strata's tools (tools/dflash_gguf.py,
tools/dflash_quantize.py), llama.cpp's converter or our own ``dspark convert`` wrote. What
needs manifest.json (its schema, its format version, the recorded hashes) is skipped with
a note, never failed. What the file is comes first (``FILE_KINDS``): a file of our format is
held to the format as an artifact's drafter.gguf is (a key another tool stored under another
numeric type is read as Strata's loader reads it, any numeric type, and named); a file of
another layout is not "invalid" for not being ours: its structure and values are checked
and each engine's report says what that engine makes of it, every refusal an ``info``
(``--require ENGINE`` makes one a failure, 47). Only a broken file fails: not a GGUF,
truncated, hostile metadata (the reader's refusals, 41), a non-finite value; and a file of
our format that breaks the format (its own codes).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from dspark_convert.artifact.engines import MADE_FOR, engine_verdicts, reports_for_gguf
from dspark_convert.artifact.file_kinds import artifact_of, file_kind, is_regular_file
from dspark_convert.artifact.format import as_format_types
from dspark_convert.commands.validate import (
    Checks,
    check_layout,
    check_metadata,
    check_target,
    check_tensors,
    check_values,
    validate_artifact,
    ValidationReport,
)
from dspark_convert.errors import DSparkError
from dspark_convert.formats.gguf_reader import ANY_INTEGER_ALIGNMENT, read_gguf
from dspark_convert.util.progress import NoProgress, Progress
from dspark_convert.util.text import shown


def _retyped_detail(retyped: tuple[str, ...]) -> str:
    # Every key is one of the format's (a few dozen at most), so the list is bounded.
    shown_ = "; ".join(retyped)
    return (f"{len(retyped)} key(s) of the format stored under another GGUF type, read as "
            f"Strata's loader reads them (any numeric type; Strata's tools/dflash_quantize.py "
            f"re-types every key it copies): {shown_}. gguf-py and llama.cpp read exact types: "
            "the engine checks say what each makes of them")


def validate_path(path: str | os.PathLike, *, progress: Progress | None = None,
                  target=None, require: Sequence[str] = ()) -> ValidationReport:
    """`dspark validate PATH`: an artifact directory, or its drafter.gguf (a manifest.json
    beside it: validate_artifact of the directory, as inspect reads it), or a GGUF file
    alone (validate_bare_gguf)."""
    if is_regular_file(path):
        directory = artifact_of(path)
        if directory is None:
            return validate_bare_gguf(path, progress=progress, target=target, require=require)
        path = directory
    return validate_artifact(path, progress=progress, target=target, require=require)


def validate_bare_gguf(path: str | os.PathLike, *, progress: Progress | None = None,
                       target=None, require: Sequence[str] = ()) -> ValidationReport:
    """Every check a GGUF file alone allows, as a frozen report (validate_artifact's form;
    ``require`` as there)."""
    checks, path = Checks(require), Path(path)
    _bare_checks(checks, path, target=target, progress=progress or NoProgress())
    return checks.report(path)


def _bare_checks(checks: Checks, path: Path, *, target, progress: Progress) -> None:
    label = shown(path.name)
    checks.info("artifact.files", f"{label}: a bare GGUF file, no manifest.json: what needs "
                "it (manifest.schema, manifest.format_version, integrity) is skipped")
    checks.skipped("manifest.schema", "no manifest.json: a bare GGUF file")
    try:
        gguf = read_gguf(path, alignment_types=ANY_INTEGER_ALIGNMENT)
        checks.gguf = gguf
        kind = file_kind(gguf)
        if kind.ours:
            check_layout(gguf, label)
        alignment = gguf.kv.get("general.alignment")
        note = (f"; general.alignment is {alignment.type.name}, read for its value"
                if alignment is not None and alignment.type.name != "UINT32" else "")
        checks.passed("gguf.structure", f"GGUF v{gguf.version}, {len(gguf.kv)} keys, "
                      f"{len(gguf.tensors)} tensors, offsets aligned, in range, "
                      f"non-overlapping{note}")
    except DSparkError as exc:
        checks.failed("gguf.structure", exc)
        return
    checks.info("gguf.kind", kind.describe(gguf))
    checks.engines = reports_for_gguf(gguf, path=label)

    kv = contract = None
    structural = True
    if kind.ours:
        entries, retyped = as_format_types(gguf.kv)
        if retyped:
            checks.info("gguf.types", _retyped_detail(retyped))
        kv, contract = check_metadata(checks, gguf, label, entries)
        structural = check_tensors(checks, gguf, kv, contract, label)
    if kind.name == "other":
        checks.skipped("gguf.values", "not a drafter file: its tensors are not read")
        scan = None
    elif structural:
        scan = check_values(checks, gguf, label, progress)
    else:
        checks.skipped("gguf.values", "an earlier failure makes reading the tensor data moot")
        scan = None
    version = (f" to compare with the file's dspark.format_version {kv['dspark.format_version']}"
               if kv and "dspark.format_version" in kv else "")
    checks.skipped("manifest.format_version", f"no manifest.json{version}")
    sha = f"; the file's SHA-256 is {scan.file_sha256}" if scan is not None else ""
    checks.skipped("integrity", f"no manifest.json records hashes to compare{sha}")

    made_for = MADE_FOR if kind.ours else {}
    for record, error in engine_verdicts(checks.engines, require=checks.required, label=label,
                                         made_for=made_for, name_rules=True):
        if error is not None:
            checks.failed(record.name, error)
        else:
            checks.add(record)

    if target is not None:
        if contract is None:
            checks.skipped("target", "needs a drafter file of our format with a valid contract")
        else:
            check_target(checks, target, contract, kv, None, label, progress)
