"""Convert a checked DSpark checkpoint into a Strata artifact (docs/ARTIFACT_FORMAT.md).

One read pass over the source, never more than one 8 MiB block of it in memory:

1. lay out drafter.gguf: the header (metadata + tensor infos, built by gguf-py) has a
   fixed size, because every value not yet known (the SHA-256 hex strings) has a fixed
   length; so every tensor's data offset is known before any byte is read.
2. read every source file once, in file order, in 8 MiB blocks; each block is hashed into
   its file's SHA-256 (on a worker thread), checked for NaN/Inf, and written straight to
   its place in drafter.gguf (BF16 bytes unchanged; F32/F16 rounded to BF16, nearest-even);
   the stripped tensors (embedding, head) are hashed on their own.
3. write the real header over the placeholder one, then read drafter.gguf back once from
   the page cache (the tensors were written in source order, the hash needs file order):
   its SHA-256 on the worker thread and each written tensor's SHA-256 beside it, while the
   file is flushed to disk; then write manifest.json.

All of it happens in a temporary sibling directory renamed into place at the end, so any
refusal during the pass (a NaN, a hash that differs from a pin) leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from gguf.constants import GGMLQuantizationType

from dspark_convert import CONVERTER_NAME, __version__
from dspark_convert.artifact.format import (
    GGUF_FILE,
    LOCAL_REVISION,
    MANIFEST_FILE,
    Provenance,
    expected_metadata,
    padded,
)
from dspark_convert.artifact.writer import create_gguf, gguf_header, hash_written, manifest_json, pwrite_all
from dspark_convert.util.atomic import Output, atomic_directory, check_outputs, fsync_path, refuse_overlap, write_error
from dspark_convert.contract.dspark import FeatureContract, TensorSpec
from dspark_convert.contract.dflash2 import source_layout
from dspark_convert.contract.families import family_named
from dspark_convert.errors import (InternalError, KindTargetRequiredError, NonFiniteTensorError,
                     SafetensorsFormatError, SourceNotFoundError)
from dspark_convert.util.paths import check_path
from dspark_convert.util.hashing import BLOCK, ThreadedFileHash, weights_digest
from dspark_convert.checks import Check
from dspark_convert.artifact.manifest import (
    MANIFEST_FORMAT,
    ArtifactRecord,
    ConverterRecord,
    FileRecord,
    HubRecord,
    Manifest,
    SourceRecord,
    SpeculatorsRecord,
    StrippedTensor,
    TargetRecord,
    TensorRecord,
)
from dspark_convert.formats.numerics import as_array, describe_value, first_non_finite, non_finite_error, round_to_bf16
from dspark_convert.source.hub.cache import hub_cache_dir
from dspark_convert.source.hub.source import HubOptions, open_hub_source
from dspark_convert.source.hub.spec import looks_like_hub_spec
from dspark_convert.util.progress import NoProgress, Progress
from dspark_convert.formats.safetensors import TensorEntry
from dspark_convert.contract.speculators import SPECULATORS_VERSION
from dspark_convert.source.checkpoint import Source, SpeculatorsOptions, open_source
from dspark_convert.artifact.engines import engine_checks, engine_records, written_reports
from dspark_convert.util.text import shown

if TYPE_CHECKING:
    from dspark_convert.target.model import Target

# Stands in for a SHA-256 not known until the pass has read the source: same length, so
# the header keeps its size when the real value is written over it.
PLACEHOLDER_SHA256 = "0" * 64

# Called once per source file read by the pass, with its path relative to the source
# directory, its size and the SHA-256 computed by the pass; raises to refuse the source
# (the Hub pins use it). Runs before anything is renamed into place.
FileCheck = Callable[[str, int, str], None]


@dataclass(frozen=True)
class SourceIdentity:
    """Where the source came from, for general.name and the provenance keys."""
    name: str
    repository: str | None = None
    revision: str = LOCAL_REVISION


@dataclass(frozen=True)
class ConvertResult:
    output: Path
    manifest: Manifest
    gguf_size: int
    gguf_sha256: str


@dataclass(frozen=True)
class _Slot:
    """Where one written tensor's BF16 data goes in drafter.gguf."""
    spec: TensorSpec
    offset: int
    nbytes: int


@dataclass
class _PassResult:
    file_sha256: dict[str, str]       # file name -> sha256, every source file read
    file_size: dict[str, int]
    tensor_sha256: dict[str, str]     # stripped source tensor name -> sha256 of its bytes


def _source_files(source: Source) -> list[Path]:
    files = source.checkpoint.files
    extra = [files.index] if files.index is not None else []
    # The family's companion file (the assistant's generation_config.json), read and
    # hashed with the rest: the contract holds what it said.
    companion = [source.companion_path] if source.companion_path is not None else []
    return [files.config, *companion, *extra, *files.weights]


def header_bytes(contract: FeatureContract, prov: Provenance, scratch: Path) -> bytes:
    """drafter.gguf's header for a contract: every written tensor BF16."""
    return gguf_header(expected_metadata(contract, prov),
                       [(spec.gguf_name, spec.shape, 2 * math.prod(spec.shape),
                         GGMLQuantizationType.BF16) for spec in contract.written_tensors],
                       scratch)


def _layout(contract: FeatureContract, data_start: int) -> tuple[dict[str, _Slot], int]:
    """Each written tensor's data offset, in the contract's fixed order, as gguf-py lays
    them out (each tensor padded to the alignment); and the file's total size."""
    slots, offset = {}, data_start
    for spec in contract.written_tensors:
        nbytes = 2 * math.prod(spec.shape)  # BF16, whatever the source dtype
        slots[spec.source_name] = _Slot(spec, offset, nbytes)
        offset += padded(nbytes)
    return slots, offset


def _overflow_error(entry: TensorEntry, raw: np.ndarray, bits: np.ndarray, done: int):
    bad = first_non_finite(bits, "BF16")
    if bad is None:
        return None
    index = done // raw.itemsize + bad
    return NonFiniteTensorError(
        f"{entry.file}: tensor '{entry.name}' overflows BF16 at element {index} "
        f"({describe_value(raw, bad, entry.dtype)} rounds to infinity); "
        "expected values within the BF16 range", path=str(entry.file),
        tensor=entry.name, expected="finite in BF16", found="inf")


def _copy_file(path: Path, entries: list[TensorEntry], slots: dict[str, _Slot], out_fd: int,
               pool: ThreadPoolExecutor, progress: Progress, result: _PassResult) -> None:
    """Read one source file once, in order: hash it and each of its tensors (sorted by
    offset), check every value is finite, and write each tensor's data to its slot."""
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise SourceNotFoundError(f"{path}: cannot read: {os.strerror(exc.errno or 0)}",
                                  path=str(path)) from None

    def shrank():
        return SafetensorsFormatError(f"{path}: the file shrank while it was read; expected it "
                                      "unchanged during conversion", path=str(path))

    with fh:
        file_hash = ThreadedFileHash(pool, BLOCK)
        # Bytes before the first tensor (8-byte length + JSON header), or a whole
        # non-weights file; then each tensor. The header checks proved the tensors are
        # contiguous and end at the end of the file, so this is the whole file.
        head = entries[0].begin if entries else os.fstat(fh.fileno()).st_size
        for _ in file_hash.blocks(fh, head, progress.advance, shrank):
            pass
        for entry in entries:
            slot = slots.get(entry.name)
            # A written tensor is hashed when drafter.gguf is read back (hash_output), beside
            # the output's file hash; a stripped one (embedding, head) only here.
            tensor_hash = hashlib.sha256() if slot is None else None
            done = 0
            for block in file_hash.blocks(fh, entry.nbytes, progress.advance, shrank):
                problem = non_finite_error(block, entry.dtype, done, entry.name, str(path))
                if problem is not None:
                    raise problem
                if slot is not None:
                    _write_block(entry, slot, block, done, out_fd)
                else:
                    tensor_hash.update(block)
                done += len(block)
            if tensor_hash is not None:
                result.tensor_sha256[entry.name] = tensor_hash.hexdigest()
        if fh.read(1):
            raise SafetensorsFormatError(f"{path}: the file grew after its header was checked; "
                                         "expected it unchanged during conversion", path=str(path))
        result.file_sha256[path.name] = file_hash.hexdigest()
        result.file_size[path.name] = fh.tell()


def _write_block(entry: TensorEntry, slot: _Slot, block: memoryview, done: int,
                 out_fd: int) -> None:
    try:
        if entry.dtype == "BF16":
            pwrite_all(out_fd, block, slot.offset + done)
            return
        raw = as_array(block, entry.dtype)
        bits = round_to_bf16(raw)
        problem = _overflow_error(entry, raw, bits, done)
        if problem is not None:
            raise problem
        pwrite_all(out_fd, bits, slot.offset + done // raw.itemsize * 2)
    except OSError as exc:
        raise _OutputOSError(exc) from None


class _OutputOSError(Exception):
    """A failed write to drafter.gguf inside the pass, told apart from a failed read of
    the source; write_gguf names the output in the error the user sees."""

    def __init__(self, exc: OSError) -> None:
        super().__init__(exc)
        self.exc = exc


def convert_pass(source: Source, slots: dict[str, _Slot], out_fd: int,
                 progress: Progress) -> _PassResult:
    """The one read pass over every source file (see the module docstring)."""
    result = _PassResult({}, {}, {})
    by_file: dict[Path, list[TensorEntry]] = {}
    for entry in source.checkpoint.tensors.values():
        by_file.setdefault(entry.file, []).append(entry)
    files = _source_files(source)
    progress.start("convert", sum(p.stat().st_size for p in files))
    try:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="file-sha256") as pool:
            for path in files:
                entries = sorted(by_file.get(path, []), key=lambda e: e.begin)
                _copy_file(path, entries, slots, out_fd, pool, progress, result)
    finally:
        progress.finish()
    return result


def write_gguf(source: Source, prov: Provenance, path: Path, progress: Progress,
               file_check: FileCheck | None = None,
               label: Path | None = None) -> tuple[_PassResult, Provenance, dict[str, _Slot]]:
    """drafter.gguf in one read pass over the source. Returns the pass's hashes, the final
    provenance (with the source and embedding hashes filled in) and the tensor slots."""
    shown = label or path  # errors name the output the user asked for, not the temporary
    contract = source.contract
    placeholder = replace(prov, source_sha256=PLACEHOLDER_SHA256)
    scratch = path.with_name(path.name + ".header")
    try:
        header = header_bytes(contract, placeholder, scratch)
    except OSError as exc:
        raise write_error(exc, shown) from None
    slots, total = _layout(contract, len(header))
    fd = create_gguf(path, header, total, shown)
    try:
        try:
            result = convert_pass(source, slots, fd, progress)
        except _OutputOSError as failed:
            raise write_error(failed.exc, shown) from None
        if file_check is not None:
            root = source.directory
            for file in _source_files(source):
                rel = os.path.relpath(os.path.abspath(file), os.path.abspath(root))
                file_check(rel, result.file_size[file.name], result.file_sha256[file.name])
        weights = [(p.name, result.file_sha256[p.name]) for p in source.checkpoint.files.weights]
        def known(value: str | None, tensor: str) -> str | None:
            return result.tensor_sha256[tensor] if value == PLACEHOLDER_SHA256 else value

        final = replace(prov, source_sha256=weights_digest(weights),
                        embed_sha256=known(prov.embed_sha256, "embed_tokens.weight"),
                        lm_head_sha256=known(prov.lm_head_sha256, "lm_head.weight"))
        try:
            real = header_bytes(contract, final, scratch)
            if len(real) != len(header):  # fixed-length placeholders: cannot happen
                raise InternalError(f"{path}: header size changed from {len(header)} to "
                                    f"{len(real)} bytes once the hashes were known")
            pwrite_all(fd, real, 0)
        except OSError as exc:
            raise write_error(exc, shown) from None
    finally:
        os.close(fd)
    return result, final, slots


def hash_output(path: Path, slots: dict[str, _Slot], progress: Progress,
                label: Path) -> tuple[str, list[TensorRecord], int]:
    """Read drafter.gguf back once, from the page cache (artifact/writer.hash_written),
    while a worker flushes the file to disk (atomic_directory's own fsync then finds little
    left to write)."""
    with open(path, "rb") as fh, ThreadPoolExecutor(1, "fsync") as flusher:
        flushed = flusher.submit(fsync_path, path)
        gguf_sha, digests, size = hash_written(
            fh, [(name, s.offset, s.nbytes) for name, s in slots.items()], progress, label)
        try:
            flushed.result()
        except OSError as exc:
            raise write_error(exc, label) from None
    records = [TensorRecord(name=s.spec.gguf_name, type="BF16", shape=s.spec.gguf_shape,
                            sha256=digests[name], source=name) for name, s in slots.items()]
    return gguf_sha, records, size


def _summary(source: Source) -> str:
    c = source.contract
    if hasattr(c, "headline"):      # a kind other than DSpark says its own (contract modules)
        return c.headline()
    markov = "no Markov head" if c.markov_head.rank == 0 else f"{c.markov_head.type} Markov head r={c.markov_head.rank}"
    conf = "no confidence head"
    if c.confidence_head.enabled:
        conf = "confidence head " + ("with" if c.confidence_head.with_markov else "without") + " Markov features"
    return (f"{c.architecture}: {c.geometry.num_draft_layers} draft layers, H={c.geometry.hidden_size}, "
            f"taps {c.taps.target_layer_ids} of {c.taps.num_target_layers}, block {c.block.block_size}, "
            f"{markov}, {conf}")


def _reads(source: Path, hub: HubOptions | None, target) -> list[tuple[object, str]]:
    """What a conversion reads, which its output must stay out of (atomic.refuse_overlap)."""
    reads: list[tuple[object, str]] = [(source, "the source checkpoint")]
    if hub is not None or looks_like_hub_spec(source):
        reads.append((hub_cache_dir(hub.cache_dir if hub else None), "the Hugging Face cache"))
    if hub is not None and isinstance(hub.lock, (str, os.PathLike)):
        reads.append((hub.lock, "the --lock file"))
    if target is not None and not hasattr(target, "directory"):
        if os.path.exists(os.fspath(target)):
            reads.append((target, "the target model"))
        else:  # a Hub target: it lives in the HF cache
            reads.append((hub_cache_dir(hub.cache_dir if hub else None), "the Hugging Face cache"))
    elif target is not None:
        reads.append((target.directory, "the target model"))
    return reads


def convert(source_path: str | os.PathLike, output: str | os.PathLike, *, force: bool = False,
            progress: Progress | None = None, identity: SourceIdentity | None = None,
            file_check: FileCheck | None = None,
            target: str | os.PathLike | Target | None = None,
            hub: HubOptions | None = None,
            sample_from_anchor: bool | None = None) -> ConvertResult:
    """Convert a local checkpoint directory into ``output`` (refused if it exists, unless
    ``force``). Raises a DSparkError subclass for every refusal; writes nothing then.

    ``identity`` names a source fetched from elsewhere (the Hub: repo id and commit);
    ``file_check`` sees the SHA-256 of every file the pass read and may refuse it.
    ``hub`` (hub.HubOptions: --resolve, --sha256 pins, --lock) applies to a Hub source
    ``org/name@<commit>``, which is downloaded or found in the HF cache and verified.
    ``target`` (a model directory, ``org/name@<commit>``, or an open ``target.Target``) is
    checked against the drafter (pairing.py): geometry and tokenizer before anything is
    written, the embedding and head identity before the output is renamed into place.

    A checkpoint in speculators' format (contract/speculators.py) is converted as its
    DeepSpec twin: it needs ``target`` (its layer count, and the embedding and head
    speculators never saves), and ``sample_from_anchor`` states the block layout of a config
    without one (refused for any other source)."""
    progress = progress or NoProgress()
    hub_source = None
    if not looks_like_hub_spec(source_path):
        check_path(source_path, what="the source checkpoint", error=SourceNotFoundError)
    # Refused before a long download or pass, by the one output rule: a path naming no new
    # directory, an existing output (without --force), one that cannot be written, and an
    # output that is, holds or lies inside anything this run reads.
    check_outputs([Output(output)], _reads(Path(source_path), hub, target), force=force)
    if hub is not None or looks_like_hub_spec(source_path):
        # org/name@<commit>: download (or find in the cache) and verify, then convert the
        # snapshot; the pass's hashes of the weights are checked by hub_source.check.
        hub_source = open_hub_source(os.fspath(source_path), hub, progress)
        source_path, file_check = hub_source.directory, hub_source.check
        snap = hub_source.snapshot
        identity = SourceIdentity(name=snap.repo, repository=snap.repo, revision=snap.commit)
        refuse_overlap(output, [(source_path, "the source snapshot")])
    opened: list = []

    def target_layers() -> int | None:
        """The target's layer count, for a speculators-format source only (opening it)."""
        if target is None:
            return None
        from dspark_convert.target.model import Target, open_target

        opened.append(target if isinstance(target, Target) else
                      open_target(target, progress=progress))
        return opened[0].config.num_hidden_layers

    source = open_source(source_path, SpeculatorsOptions(target_layers=target_layers,
                                                         sample_from_anchor=sample_from_anchor))
    if opened:
        target = opened[0]                   # opened once, paired below
    family = family_named(source.contract.family)
    if family.needs_target and target is None:
        label = str(source.checkpoint.files.config)
        raise KindTargetRequiredError(
            f"{label}: a {family.architecture} ({family.name}) records neither the embedding "
            "it reads nor what its target must be; convert it with --target (the target "
            "model)", path=label, field="architectures", expected="--target",
            found="no target")
    identity = identity or SourceIdentity(name=source.name)
    tensors = source.checkpoint.tensors
    # A wrong target is refused here, before anything is written.
    pairing = None
    if target is not None:
        from dspark_convert.target.pairing import pair_source  # here: a convert without --target does not load it

        pairing = pair_source(source, target, progress)
    # The embedding and head hashes are known once the pass has read them.
    prov = Provenance(name=identity.name, repository=identity.repository,
                      revision=identity.revision, source_sha256=PLACEHOLDER_SHA256,
                      embed_sha256=PLACEHOLDER_SHA256 if "embed_tokens.weight" in tensors
                      else (pairing.target_sha256("embed_tokens.weight") if pairing else None),
                      lm_head_sha256=PLACEHOLDER_SHA256 if "lm_head.weight" in tensors
                      else (pairing.target_sha256("lm_head.weight") if pairing else None))

    with atomic_directory(output, force=force) as tmp:
        gguf_path = tmp / GGUF_FILE
        passed, prov, slots = write_gguf(source, prov, gguf_path, progress, file_check,
                                          label=Path(output) / GGUF_FILE)
        # The drafter's embedding and head (hashed by the pass) against the target's: a
        # mismatch discards the temporary directory.
        target_rec = pairing.finish(passed.tensor_sha256, progress) if pairing else None
        stripped = [StrippedTensor(name=n, dtype=e.dtype, shape=list(e.shape),
                                   sha256=passed.tensor_sha256[n])
                    for n, e in tensors.items()
                    if source.contract.tensor(n) and source.contract.tensor(n).gguf_name is None]
        gguf_sha, records, size = hash_output(gguf_path, slots, progress,
                                              Path(output) / GGUF_FILE)
        manifest = _manifest(source, identity, passed, prov, stripped, records, size, gguf_sha,
                             target_rec, hub_source.record(progress) if hub_source else None)
        try:
            (tmp / MANIFEST_FILE).write_text(manifest_json(manifest), encoding="utf-8")
        except OSError as exc:
            raise write_error(exc, Path(output) / MANIFEST_FILE) from None
    return ConvertResult(output=Path(output), manifest=manifest, gguf_size=size, gguf_sha256=gguf_sha)


def _checks(source: Source, records: list[TensorRecord], stripped: list[StrippedTensor],
            engines: dict) -> list[Check]:
    files, tensors = source.checkpoint.files, source.checkpoint.tensors
    ignored = (f", {len(files.ignored)} file(s) not opened: "
               f"{', '.join(shown(n) for n in files.ignored)}" if files.ignored else "")
    checks = [
        Check.passed("source.layout",
                     f"config.json + {len(files.weights)} safetensors file(s){ignored}"),
        Check.passed("source.headers", f"{len(tensors)} tensors; strict header checks passed"),
        Check.passed("contract.config", _summary(source)),
        Check.passed("contract.inventory",
                     f"{len(tensors)} tensors match the contract ({len(records)} written, "
                     f"{len(stripped)} hashed and stripped)"),
        Check.passed("values.finite", f"every value of {len(tensors)} tensors is finite"),
        Check.passed("dtype", "BF16 bytes copied unchanged" if source.dtype == "BF16"
                     else f"{source.dtype} source rounded to BF16 (nearest-even)"),
    ]
    if source.contract.family == "qwen3-dflash2":
        layout = source_layout(source.raw_config)
        checks.insert(1, Check.passed(
            "source.format", f"{layout}'s DFlash2 layout"
            + (" (a flat Qwen3 config with dflash_config), read as speculators': aux ids = "
               "target_layer_ids + 1" if layout == "z-lab" else
               " (speculators_model_type dflash2)") + "; embedding and head: the target's"))
    if source.companion is not None:
        checks.insert(1, Check.passed(
            "source.companion", f"{source.companion_path.name}: read for the contract "
            "(recorded verbatim as source.companion)"))
    spec = source.speculators
    if spec is not None:
        r = spec.reading
        checks.insert(1, Check.passed(
            "source.format", f"speculators {SPECULATORS_VERSION} {r.model_type} checkpoint, read as "
            f"its DeepSpec twin (docs/SPECULATORS.md); sample_from_anchor true "
            f"({'config.json' if r.layout_stated_by == 'config' else '--sample-from-anchor'}); "
            "embedding and head: the target's"))
    return checks + engine_checks(engines)


def _speculators_record(source: Source) -> SpeculatorsRecord | None:
    spec = source.speculators
    if spec is None:
        return None
    return SpeculatorsRecord(format="speculators", version=SPECULATORS_VERSION,
                             model_type=spec.reading.model_type,
                             sample_from_anchor=spec.reading.sample_from_anchor,
                             layout_stated_by=spec.reading.layout_stated_by, config=spec.config)


def _manifest(source: Source, identity: SourceIdentity, passed: _PassResult, prov: Provenance,
              stripped: list[StrippedTensor], records: list[TensorRecord], size: int,
              gguf_sha: str, target: TargetRecord | None = None,
              hub: HubRecord | None = None) -> Manifest:
    metadata = expected_metadata(source.contract, prov)
    engines = written_reports(metadata, records)
    return Manifest(
        # The manifest's version is the one drafter.gguf holds (1 for Qwen3, 2 for Gemma4).
        format=MANIFEST_FORMAT, format_version=metadata["dspark.format_version"],
        converter=ConverterRecord(name=CONVERTER_NAME, version=__version__),
        source=SourceRecord(
            repo=identity.repository, revision=identity.revision, name=identity.name,
            files=[FileRecord(path=p.name, size=passed.file_size[p.name],
                              sha256=passed.file_sha256[p.name]) for p in _source_files(source)],
            weights_sha256=prov.source_sha256, dtype=source.dtype,
            rounded_to_bf16=source.dtype != "BF16", stripped=stripped,
            config=source.raw_config, hub=hub, speculators=_speculators_record(source),
            companion=source.companion),
        target=target,
        contract=source.contract,
        artifact=ArtifactRecord(file=GGUF_FILE, size=size, sha256=gguf_sha, tensors=records),
        checks=_checks(source, records, stripped, engines),
        engines=engine_records(engines),
    )
