"""`dspark quantize`: a quantized artifact from a BF16 one (docs/ARTIFACT_FORMAT.md, Quantized
artifacts).

What Strata's ``tools/dflash_quantize.py`` (``export``) does to a BF16 DFlash GGUF, with the
project's guarantees around it:

- the parent must pass ``validate_artifact`` and be BF16 (never a quantized artifact, never
  a checkpoint);
- 2-D backbone matrices (``fc``, ``blk.N.attn_q/k/v/output``, ``blk.N.ffn_gate/up/down``)
  are quantized with gguf-py's quantizers from their BF16 values widened to float32
  (formats/quants.py: the same arithmetic as Strata's tool, so the same bytes); every 1-D
  tensor (norms, biases, a Gemma4 drafter's layer scalars) is copied BF16; the Markov and
  confidence matrices are copied BF16 unless ``heads`` names a type. Which is which is the
  type rule of artifact/quantized.py, read from the family's tensor table: the same code
  for every family whose row in contract/families.py lists ``quantize`` (Qwen3, Gemma4);
  ``refuse_family`` refuses the others (85) before the parent is validated;
- every key of the parent is kept, in order, then ``strata.dflash.quantization`` and
  ``strata.dflash.source_sha256`` are appended, as Strata's tool appends them;
- one streaming pass over the parent's drafter.gguf in row chunks (memory: a few chunks of
  4 MiB, whatever the model's size), hashing the parent as it is read (it must still be
  the file that validated); the header is laid out by gguf-py (artifact/writer.gguf_header) and
  the data written by offset, like convert;
- drafter.gguf is re-read: its tensor table against the plan, its SHA-256 and each
  tensor's for manifest.json, which names the parent (its drafter.gguf and manifest.json
  SHA-256), the type, and per quantized tensor its error against the BF16 values;
- atomic (atomic_directory) and byte-reproducible: no paths, no timestamps; the
  quantizer's version is recorded because its arithmetic defines the bytes.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from gguf.constants import GGMLQuantizationType

from dspark_convert import CONVERTER_NAME, __version__
from dspark_convert.artifact.format import GGUF_FILE, MANIFEST_FILE, padded, read_metadata
from dspark_convert.util.atomic import Output, atomic_directory, check_outputs, write_error
from dspark_convert.artifact.writer import create_gguf, gguf_header, hash_written, manifest_json, pwrite_all
from dspark_convert.errors import (
    GGUFFormatError,
    IntegrityError,
    InternalError,
    ParentArtifactError,
    QuantizedParentError,
)
from dspark_convert.formats import quants
from dspark_convert.formats.gguf_reader import GGUFFile, read_gguf
from dspark_convert.util.hashing import BLOCK, read_blocks
from dspark_convert.checks import Check
from dspark_convert.artifact.manifest import (
    ArtifactRecord,
    ConverterRecord,
    FileRecord,
    Manifest,
    ParentRecord,
    QuantErrorRecord,
    QuantizationRecord,
    TensorRecord,
)
from dspark_convert.util.paths import check_path
from dspark_convert.util.progress import NoProgress, Progress
from dspark_convert.artifact.engines import engine_checks, engine_records, written_reports
from dspark_convert.artifact.quantized import (
    PARENT_KEY,
    QUANTIZATION_KEY,
    is_head,
    quantization_tool,
    rule_whens,
    tensor_type,
)
# Significant digits of the recorded errors: enough to compare precisions, few enough that a
# numpy release changing a float64 summation order does not change manifest.json's bytes.
ERROR_DIGITS = 6


@dataclass(frozen=True)
class QuantizeResult:
    output: Path
    manifest: Manifest
    gguf_size: int
    gguf_sha256: str


@dataclass(frozen=True)
class _Planned:
    name: str
    type: str                      # "BF16" or a quantization type
    torch_shape: list[int]
    gguf_shape: list[int]
    nbytes: int                    # in the output
    source: str                    # the HF name (manifest)
    parent_offset: int             # absolute, in the parent file
    parent_nbytes: int
    offset: int = 0                # absolute, in the output file


def _rounded(x: float) -> float:
    return float(f"{x:.{ERROR_DIGITS}g}")


def _gguf_version() -> str:
    try:
        return importlib.metadata.version("gguf")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - installed with us
        return "unknown"


def _validated_parent(parent: Path, progress: Progress):
    """The parent's report, refused unless it passes every check."""
    from dspark_convert.commands.validate import validated_input  # the whole checking stack

    return validated_input(parent, what="the parent artifact", error=ParentArtifactError,
                           expected="a valid BF16 artifact", progress=progress)


def _plan(gguf: GGUFFile, manifest: Manifest, qtype: str, heads: str | None,
          label: str) -> list[_Planned]:
    """Each tensor of the parent, in file order, with the type it gets."""
    specs = {s.gguf_name: s for s in manifest.contract.written_tensors}
    sources = {t.name: t.source for t in manifest.artifact.tensors}
    whens = rule_whens(manifest.contract)
    plan = []
    for info in gguf.tensors:
        spec = specs[info.name]          # validate proved the inventory matches the contract
        if info.ggml_type.name != "BF16":
            raise QuantizedParentError(
                f"{label}: tensor '{info.name}' is {info.ggml_type.name}; expected a BF16 "
                "parent (quantize from the BF16 artifact, not from a quantized one)",
                path=label, tensor=info.name, expected="BF16", found=info.ggml_type.name)
        target = tensor_type(spec.kind, whens[info.name], len(info.shape), qtype, heads)
        if target != "BF16":
            quants.check_row_width(info.shape[0], target, tensor=info.name, label=label)
        nbytes = info.nbytes if target == "BF16" else quants.tensor_nbytes(info.shape, target)
        plan.append(_Planned(info.name, target, list(spec.shape), list(info.shape), nbytes,
                             sources[info.name], info.data_offset, info.nbytes))
    return plan


def _layout(plan: list[_Planned], data_start: int) -> tuple[list[_Planned], int]:
    out, offset = [], data_start
    for t in plan:
        out.append(replace(t, offset=offset))
        offset += padded(t.nbytes)
    return out, offset


def _header(values: dict, plan: list[_Planned], scratch: Path) -> bytes:
    tensors = [(t.name, t.torch_shape, t.nbytes, GGMLQuantizationType[t.type]) for t in plan]
    return gguf_header(values, tensors, scratch)


class _Pass:
    """The one read of the parent: hashed whole, each tensor copied or quantized to its
    place in the output."""

    def __init__(self, parent_gguf: GGUFFile, plan: list[_Planned], fd: int, label: str,
                 shown: Path, progress: Progress) -> None:
        self.gguf, self.plan, self.fd = parent_gguf, plan, fd
        self.label, self.shown, self.progress = label, shown, progress
        self.errors: dict[str, quants.QuantError] = {}

    def _shrank(self):
        return GGUFFormatError(f"{self.label}: the parent's drafter.gguf shrank while it was "
                               "quantized; expected it unchanged", path=self.label)

    def _write(self, data, offset: int) -> None:
        try:
            pwrite_all(self.fd, data, offset)
        except OSError as exc:
            raise write_error(exc, self.shown) from None

    def run(self) -> str:
        digest = hashlib.sha256()
        largest_row = max((2 * t.gguf_shape[0] for t in self.plan), default=0)
        buffer = memoryview(bytearray(max(BLOCK, largest_row)))
        advance = self.progress.advance
        with open(self.gguf.path, "rb") as fh:
            if os.fstat(fh.fileno()).st_size != self.gguf.file_size:
                raise self._shrank()
            for t in sorted(self.plan, key=lambda p: p.parent_offset):
                for _ in read_blocks(fh, t.parent_offset - fh.tell(), buffer, [digest], advance,
                                     self._shrank):
                    pass
                if t.type == "BF16":
                    self._copy(fh, t, buffer, digest)
                else:
                    self._quantize(fh, t, buffer, digest)
            for _ in read_blocks(fh, self.gguf.file_size - fh.tell(), buffer, [digest], advance,
                                 self._shrank):
                pass
            if fh.read(1):
                raise GGUFFormatError(f"{self.label}: the parent's drafter.gguf grew while it "
                                      "was quantized; expected it unchanged", path=self.label)
        return digest.hexdigest()

    def _copy(self, fh, t: _Planned, buffer: memoryview, digest) -> None:
        done = 0
        for block in read_blocks(fh, t.parent_nbytes, buffer, [digest], self.progress.advance,
                                 self._shrank):
            self._write(block, t.offset + done)
            done += len(block)

    def _quantize(self, fh, t: _Planned, buffer: memoryview, digest) -> None:
        ne0 = t.gguf_shape[0]
        row_bytes = 2 * ne0
        view = buffer[:quants.rows_per_chunk(ne0) * row_bytes]
        quantizer = quants.TensorQuantizer(t.gguf_shape, t.type, tensor=t.name, label=self.label)
        written = 0
        for block in read_blocks(fh, t.parent_nbytes, view, [digest], self.progress.advance,
                                 self._shrank):
            # read_blocks fills the view but for the tensor's last chunk: whole rows always,
            # since the view holds whole rows and the tensor is whole rows.
            packed = quantizer.feed(np.frombuffer(block, dtype="<u2"))
            self._write(packed, t.offset + written)
            written += packed.nbytes
        self.errors[t.name] = quantizer.finish()
        if written != t.nbytes:  # the plan and gguf-py disagree on a size: a bug
            raise InternalError(f"{self.label}: tensor '{t.name}': wrote {written} bytes, "
                                f"planned {t.nbytes}")


def _read_back(path: Path, plan: list[_Planned], progress: Progress,
               shown: Path) -> tuple[str, dict[str, str], int]:
    """Re-read the output: its tensor table must be the plan (names, types, shapes,
    offsets), every block scale on disk finite; returns its SHA-256, each tensor's, its size."""
    written = read_gguf(path)
    table = [(t.name, t.ggml_type.name, list(t.shape), t.data_offset) for t in written.tensors]
    if table != [(t.name, t.type, t.gguf_shape, t.offset) for t in plan]:
        raise InternalError(f"{shown}: the tensor table read back differs from the plan")
    scanners = {t.name: quants.ScaleScanner(t.type) for t in plan if t.type != "BF16"}

    def scan(name: str, block, done: int) -> None:
        if name in scanners:
            scanners[name].feed(block)

    with open(path, "rb") as fh:
        file_sha, digests, size = hash_written(
            fh, [(t.name, t.offset, t.nbytes) for t in plan], progress, shown, inspect=scan)
    for name, scanner in scanners.items():
        if scanner.first_bad is not None:   # quantize_bf16 refused these: a bug if seen
            raise InternalError(f"{shown}: tensor '{name}': block {scanner.first_bad} has a "
                                "non-finite scale on disk")
    return file_sha, digests, size


def _manifest(parent_manifest: Manifest, kv: dict, plan: list[_Planned],
              errors: dict[str, quants.QuantError], size: int, sha: str, digests: dict[str, str],
              parent_files: list[FileRecord], qtype: str, heads: str | None,
              checks_passed: int) -> Manifest:
    records = []
    for t in plan:
        error = errors.get(t.name)
        records.append(TensorRecord(
            name=t.name, type=t.type, shape=t.gguf_shape, sha256=digests[t.name], source=t.source,
            error=None if error is None else QuantErrorRecord(
                max_abs=_rounded(error.max_abs), rel_rms=_rounded(error.rel_rms))))
    counts = {}
    for t in plan:
        counts[t.type] = counts.get(t.type, 0) + 1
    kept = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    worst = max(errors.items(), key=lambda kv: kv[1].rel_rms, default=None)
    engines = written_reports(kv, records)
    heads_kept = "" if heads else "; Markov/confidence matrices kept BF16"
    largest = (f"; largest relative RMS error {_rounded(worst[1].rel_rms)} ({worst[0]})"
               if worst else "")
    checks = [
        Check.passed("parent.validate", f"the BF16 parent passes dspark validate "
                     f"({checks_passed} checks, none failed)"),
        Check.passed("quantize.tensors",
                     f"{len(plan)} tensors: {kept}; 1-D tensors kept BF16{heads_kept}"),
        Check.passed("quantize.values",
                     f"every BF16 value finite; every block scale finite in F16{largest}"),
        Check.passed("quantize.readback",
                     f"{GGUF_FILE} re-read: names, types, shapes and offsets as planned"),
        # The engines on the quantized file, recorded as convert records them (and as
        # validate re-derives them).
        *engine_checks(engines),
    ]
    return Manifest(
        # The version the quantized drafter.gguf keeps from its parent's (a legacy Gemma4
        # parent manifest says 1 where its file says 2: the file's is the version).
        format=parent_manifest.format, format_version=kv["dspark.format_version"],
        converter=ConverterRecord(name=CONVERTER_NAME, version=__version__),
        source=parent_manifest.source, target=parent_manifest.target,
        contract=parent_manifest.contract,
        artifact=ArtifactRecord(file=GGUF_FILE, size=size, sha256=sha, tensors=records),
        checks=checks,
        engines=engine_records(engines),
        parent=ParentRecord(files=parent_files, converter=kv["dspark.converter"]),
        quantization=QuantizationRecord(
            type=qtype, heads=heads,
            tool=quantization_tool(_gguf_version())),
    )


def quantize_artifact(parent: str | os.PathLike, output: str | os.PathLike, qtype: str,
                      heads: str | None = None, force: bool = False,
                      progress: Progress | None = None) -> QuantizeResult:
    """Quantize the BF16 artifact ``parent`` into ``output`` (refused if it exists, unless
    ``force``). ``qtype``: "q8_0", "q5_0" or "q4_0" (any case) for the backbone matrices;
    ``heads``: the same for the Markov and confidence matrices, None to keep them BF16.
    Raises a DSparkError subclass for every refusal and writes nothing then."""
    progress = progress or NoProgress()
    qtype = quants.quant_type(qtype)
    heads = quants.quant_type(heads) if heads is not None else None
    check_path(parent, what="the parent artifact", error=ParentArtifactError)
    # The one output rule before any work (atomic.check_outputs): a path naming a new
    # directory, absent without --force, writable, never the parent or around it.
    check_outputs([Output(output)], [(parent, "the parent artifact")], force=force)
    parent, out = Path(parent), Path(output)
    from dspark_convert.commands.binding import refuse_family
    refuse_family(parent, "quantize")
    report = _validated_parent(parent, progress)

    label = str(parent / GGUF_FILE)
    gguf = report.gguf        # validate's parse, handed on: drafter.gguf is parsed once
    kv = read_metadata(gguf, path=label)      # the parent validated: its keys and types hold
    already = kv.get(QUANTIZATION_KEY)
    if already is not None:
        raise QuantizedParentError(
            f"{label}: metadata key 'strata.dflash.quantization' is {already!r}; expected a "
            "BF16 parent (quantize from the BF16 artifact, not from a quantized one)",
            path=label, field="strata.dflash.quantization", expected="absent", found=str(already))
    # The manifest validate read and checked, bytes and model, handed on: read once (a
    # second read could see another file, and the output would name bytes never checked).
    parent_manifest, manifest_bytes = report.manifest
    parent_sha = parent_manifest.artifact.sha256     # validated against the file just now
    # Every key of the parent, in order, then the two Strata appends (the header and the
    # manifest's record of the keys).
    out_kv = {**kv, QUANTIZATION_KEY: qtype, PARENT_KEY: parent_sha}
    plan = _plan(gguf, parent_manifest, qtype, heads, label)
    whens = rule_whens(parent_manifest.contract)
    if heads is not None and not any(is_head(whens[t.name]) and t.type == heads for t in plan):
        # A drafter without Markov or confidence matrices (plain DFlash): --heads has
        # nothing to quantize, and the manifest says what was done (null), not what was
        # asked (validate holds quantization.heads to the head matrices the file has).
        heads = None

    with atomic_directory(out, force=force) as tmp:
        path, shown = tmp / GGUF_FILE, out / GGUF_FILE
        try:
            header = _header(out_kv, plan, tmp / f"{GGUF_FILE}.header")
        except OSError as exc:
            raise write_error(exc, shown) from None
        plan, total = _layout(plan, len(header))
        fd = create_gguf(path, header, total, shown)
        try:
            progress.start(f"quantize {GGUF_FILE} to {qtype}", gguf.file_size)
            try:
                passed = _Pass(gguf, plan, fd, label, shown, progress)
                read_sha = passed.run()
            finally:
                progress.finish()
        finally:
            os.close(fd)
        if read_sha != parent_sha:
            raise IntegrityError(f"{label}: SHA-256 is {read_sha} while it was quantized; it "
                                 f"validated as {parent_sha} (the parent changed meanwhile)",
                                 path=label, expected=parent_sha, found=read_sha)
        sha, digests, size = _read_back(path, plan, progress, shown)
        parent_files = [FileRecord(path=GGUF_FILE, size=gguf.file_size, sha256=parent_sha),
                        FileRecord(path=MANIFEST_FILE, size=len(manifest_bytes),
                                   sha256=hashlib.sha256(manifest_bytes).hexdigest())]
        manifest = _manifest(parent_manifest, out_kv, plan, passed.errors, size, sha, digests,
                             parent_files, qtype, heads, len(report.checks))
        try:
            (tmp / MANIFEST_FILE).write_text(manifest_json(manifest), encoding="utf-8")
        except OSError as exc:
            raise write_error(exc, out / MANIFEST_FILE) from None
    return QuantizeResult(output=out, manifest=manifest, gguf_size=size, gguf_sha256=sha)
