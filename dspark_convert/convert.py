"""Convert a checked DSpark checkpoint into a Strata artifact (ARTIFACT_SPEC.md).

Three passes, each streaming, never more than one tensor (and in pass 1 one 8 MiB block)
in memory:

1. verify the source: read every weights file once, in file order, hashing the file, each
   tensor, and checking every value is finite. Nothing is written before this passes.
2. write drafter.gguf with gguf-py's streaming API (``add_tensor_info`` then
   ``write_tensor_data`` one tensor at a time), BF16 bytes copied unchanged from a
   memory map of the source; F32/F16 sources are rounded to BF16 (nearest-even).
3. hash the written file and write manifest.json.

All of it happens in a temporary sibling directory renamed into place at the end.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFWriter
from gguf.constants import GGMLQuantizationType

from . import CONVERTER_NAME, __version__
from .artifact_format import (
    ARCHITECTURE_NAME,
    GGUF_FILE,
    KEYS_BY_NAME,
    LOCAL_REVISION,
    MANIFEST_FILE,
    Provenance,
    expected_metadata,
)
from .atomic import atomic_directory, write_error
from .errors import (NonFiniteTensorError, OutputExistsError, SafetensorsFormatError,
                     SourceNotFoundError)
from .hashing import read_blocks, sha256_file, weights_digest
from .manifest import (
    MANIFEST_FORMAT,
    ArtifactRecord,
    CheckRecord,
    ConverterRecord,
    FileRecord,
    Manifest,
    SourceRecord,
    StrippedTensor,
    TensorRecord,
)
from .progress import NoProgress, Progress
from .numerics import RAW_DTYPES, describe_value, first_non_finite, non_finite_error, round_to_bf16
from .safetensors_reader import TensorEntry
from .source import Source, open_source
from .strata_rules import strata_findings

READ_BLOCK = 8 * 1024 * 1024


@dataclass(frozen=True)
class ConvertResult:
    output: Path
    manifest: Manifest
    gguf_size: int
    gguf_sha256: str


@dataclass(frozen=True)
class _Verified:
    file_sha256: dict[str, str]          # file name -> sha256, every source file hashed
    file_size: dict[str, int]
    tensor_sha256: dict[str, str]        # source tensor name -> sha256 of its source bytes


def _source_files(source: Source) -> list[Path]:
    files = source.checkpoint.files
    extra = [files.index] if files.index is not None else []
    return [files.config, *extra, *files.weights]


def verify_source(source: Source, progress: Progress) -> _Verified:
    """Pass 1: one sequential read of every source file (hashes + finite values)."""
    sizes, digests, tensor_digests = {}, {}, {}
    by_file: dict[Path, list[TensorEntry]] = {}
    for entry in source.checkpoint.tensors.values():
        by_file.setdefault(entry.file, []).append(entry)
    view = memoryview(bytearray(READ_BLOCK))
    progress.start("verify source", sum(p.stat().st_size for p in _source_files(source)))
    try:
        for path in _source_files(source):
            entries = sorted(by_file.get(path, []), key=lambda e: e.begin)
            digests[path.name], sizes[path.name] = _verify_file(path, entries, view, progress,
                                                                tensor_digests)
    finally:
        progress.finish()
    return _Verified(digests, sizes, tensor_digests)


def _verify_file(path: Path, entries: list[TensorEntry], view: memoryview, progress: Progress,
                 tensor_digests: dict[str, str]) -> tuple[str, int]:
    """Hash one file in order; its tensors (sorted by offset) are hashed and scanned too."""
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise SourceNotFoundError(f"{path}: cannot read: {os.strerror(exc.errno or 0)}",
                                  path=str(path)) from None
    def shrank():
        return SafetensorsFormatError(f"{path}: the file shrank while it was read; expected it "
                                      "unchanged during conversion", path=str(path))

    with fh:
        file_hash = hashlib.sha256()
        # Bytes before the first tensor (8-byte length + JSON header), or a whole
        # non-weights file; then each tensor. The header checks proved the tensors are
        # contiguous and end at the end of the file, so this is the whole file.
        head = entries[0].begin if entries else os.fstat(fh.fileno()).st_size
        for _ in read_blocks(fh, head, view, [file_hash], progress.advance, shrank):
            pass
        for entry in entries:
            tensor_hash, done = hashlib.sha256(), 0
            for block in read_blocks(fh, entry.nbytes, view, [file_hash, tensor_hash],
                                     progress.advance, shrank):
                problem = non_finite_error(block, entry.dtype, done, entry.name, path.name)
                if problem is not None:
                    raise problem
                done += len(block)
            tensor_digests[entry.name] = tensor_hash.hexdigest()
        if fh.read(1):
            raise SafetensorsFormatError(f"{path}: the file grew after its header was checked; "
                                         "expected it unchanged during conversion", path=str(path))
        return file_hash.hexdigest(), fh.tell()


def _tensor_array(entry: TensorEntry) -> np.ndarray:
    """A read-only memory map of one source tensor's raw bits (zero copy)."""
    dtype = RAW_DTYPES[entry.dtype]
    count = entry.nbytes // dtype.itemsize
    if count == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(entry.file, dtype=dtype, mode="r", offset=entry.begin, shape=(count,))


def _add_metadata(writer: GGUFWriter, values: dict[str, object]) -> None:
    for key, value in values.items():
        if key == "general.architecture":
            continue  # GGUFWriter writes it first, from its arch argument
        spec = KEYS_BY_NAME[key]
        # add_key_value, not add_string/add_array: those silently drop empty values.
        writer.add_key_value(key, value, spec.type, sub_type=spec.sub_type)


def write_gguf(source: Source, verified: _Verified, prov: Provenance, path: Path,
               progress: Progress) -> list[TensorRecord]:
    """Pass 2: drafter.gguf, streamed one tensor at a time."""
    contract = source.contract
    entries = source.checkpoint.tensors
    writer = GGUFWriter(path, ARCHITECTURE_NAME)
    _add_metadata(writer, expected_metadata(contract, prov))
    specs = contract.written_tensors
    for spec in specs:
        nbytes = 2 * math.prod(spec.shape)  # BF16, whatever the source dtype
        writer.add_tensor_info(spec.gguf_name, spec.shape, np.dtype(np.uint16), nbytes,
                               raw_dtype=GGMLQuantizationType.BF16)
    records = []
    progress.start("write drafter.gguf", sum(entries[s.source_name].nbytes for s in specs))
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for spec in specs:
            entry = entries[spec.source_name]
            raw = _tensor_array(entry)
            if entry.dtype == "BF16":
                data, digest = raw, verified.tensor_sha256[entry.name]
            else:
                data = round_to_bf16(raw)
                bad = first_non_finite(data, "BF16")
                if bad is not None:
                    raise NonFiniteTensorError(
                        f"{entry.file.name}: tensor '{entry.name}' overflows BF16 at element {bad} "
                        f"({describe_value(raw, bad, entry.dtype)} rounds to infinity); "
                        "expected values within the BF16 range", path=entry.file.name,
                        tensor=entry.name, expected="finite in BF16", found="inf")
                digest = hashlib.sha256(data).hexdigest()
            writer.write_tensor_data(data)
            del raw, data
            records.append(TensorRecord(name=spec.gguf_name, type="BF16", shape=spec.gguf_shape,
                                        sha256=digest, source=spec.source_name))
            progress.advance(entry.nbytes)
    except OSError as exc:
        raise write_error(exc, path) from None
    finally:
        writer.close()
        progress.finish()
    return records


def _summary(source: Source) -> str:
    c = source.contract
    markov = "no Markov head" if c.markov_head.rank == 0 else f"{c.markov_head.type} Markov head r={c.markov_head.rank}"
    conf = "no confidence head"
    if c.confidence_head.enabled:
        conf = "confidence head " + ("with" if c.confidence_head.with_markov else "without") + " Markov features"
    return (f"{c.architecture}: {c.geometry.num_draft_layers} draft layers, H={c.geometry.hidden_size}, "
            f"taps {c.taps.target_layer_ids} of {c.taps.num_target_layers}, block {c.block.block_size}, "
            f"{markov}, {conf}")


def _refuse_output_over_source(source: Path, output: Path) -> None:
    """--force replaces the output; it must never replace (and so delete) the source."""
    if not source.exists():
        return
    src, out = source.resolve(), output.absolute()
    out = out.resolve() if out.exists() else out
    if src == out or out in src.parents:
        raise OutputExistsError(f"{output}: is the source checkpoint or holds it; expected an "
                                "output outside the source", path=str(output),
                                expected="a path outside the source", found=str(src))


def convert(source_path: str | os.PathLike, output: str | os.PathLike, *, force: bool = False,
            progress: Progress | None = None) -> ConvertResult:
    """Convert a local checkpoint directory into ``output`` (refused if it exists, unless
    ``force``). Raises a DSparkError subclass for every refusal; writes nothing then."""
    progress = progress or NoProgress()
    _refuse_output_over_source(Path(source_path), Path(output))
    source = open_source(source_path)
    verified = verify_source(source, progress)
    files = source.checkpoint.files
    weights = [(p.name, verified.file_sha256[p.name]) for p in files.weights]
    stripped = [StrippedTensor(name=n, dtype=e.dtype, shape=list(e.shape),
                               sha256=verified.tensor_sha256[n])
                for n, e in source.checkpoint.tensors.items()
                if source.contract.tensor(n) and source.contract.tensor(n).gguf_name is None]
    stripped_sha = {s.name: s.sha256 for s in stripped}
    prov = Provenance(name=source.name, repository=None, revision=LOCAL_REVISION,
                      source_sha256=weights_digest(weights),
                      embed_sha256=stripped_sha.get("embed_tokens.weight"),
                      lm_head_sha256=stripped_sha.get("lm_head.weight"))

    with atomic_directory(output, force=force) as tmp:
        gguf_path = tmp / GGUF_FILE
        records = write_gguf(source, verified, prov, gguf_path, progress)
        size = gguf_path.stat().st_size
        progress.start("hash drafter.gguf", size)
        gguf_sha = sha256_file(gguf_path, progress.advance)
        progress.finish()

        n_written = len(records)
        checks = [
            CheckRecord(name="source.layout", status="passed",
                        detail=f"config.json + {len(files.weights)} safetensors file(s)"
                               + (f", {len(files.ignored)} file(s) not opened: {', '.join(files.ignored)}"
                                  if files.ignored else "")),
            CheckRecord(name="source.headers", status="passed",
                        detail=f"{len(source.checkpoint.tensors)} tensors; strict header checks passed"),
            CheckRecord(name="contract.config", status="passed", detail=_summary(source)),
            CheckRecord(name="contract.inventory", status="passed",
                        detail=f"{len(source.checkpoint.tensors)} tensors match the contract "
                               f"({n_written} written, {len(stripped)} hashed and stripped)"),
            CheckRecord(name="values.finite", status="passed",
                        detail=f"every value of {len(source.checkpoint.tensors)} tensors is finite"),
            CheckRecord(name="dtype", status="passed",
                        detail="BF16 bytes copied unchanged" if source.dtype == "BF16"
                        else f"{source.dtype} source rounded to BF16 (nearest-even)"),
        ]
        kv = expected_metadata(source.contract, prov)
        for finding in strata_findings(kv, [(r.name, "BF16", r.shape) for r in records]):
            checks.append(CheckRecord(name=f"strata.{finding.rule}",
                                      status="passed" if finding.level == "ok" else finding.level,
                                      detail=finding.message))
        manifest = Manifest(
            format=MANIFEST_FORMAT, format_version=1,
            converter=ConverterRecord(name=CONVERTER_NAME, version=__version__),
            source=SourceRecord(
                repo=None, revision=LOCAL_REVISION, name=source.name,
                files=[FileRecord(path=p.name, size=verified.file_size[p.name],
                                  sha256=verified.file_sha256[p.name]) for p in _source_files(source)],
                weights_sha256=prov.source_sha256, dtype=source.dtype,
                rounded_to_bf16=source.dtype != "BF16", stripped=stripped,
                config=source.raw_config),
            target=None,
            contract=source.contract,
            artifact=ArtifactRecord(file=GGUF_FILE, size=size, sha256=gguf_sha, tensors=records),
            checks=checks,
        )
        try:
            (tmp / MANIFEST_FILE).write_text(manifest_json(manifest))
        except OSError as exc:
            raise write_error(exc, tmp / MANIFEST_FILE) from None
    return ConvertResult(output=Path(output), manifest=manifest, gguf_size=size, gguf_sha256=gguf_sha)


def manifest_json(manifest: Manifest) -> str:
    # Fixed field order, no timestamps: the same source gives the same bytes.
    return manifest.model_dump_json(indent=2) + "\n"
