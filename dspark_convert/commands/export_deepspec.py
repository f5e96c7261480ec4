"""`dspark export --engine deepspec`: an artifact as the checkpoint DeepSpec saves,
the layout vLLM, SGLang and dspark-mlx read: ``config.json`` + one ``model.safetensors``.

- The artifact must pass ``validate_artifact`` with the target (the pairing: geometry,
  tokenizer, and the embedding and head against the SHA-256 convert recorded, each refusal
  with its own code, 60-68); a quantized artifact is refused (106): DeepSpec's layout holds
  BF16 weights, and quantization has lost the source's.
- ``config.json`` is the source's, as manifest.json records it (``source.config``), written
  as ``save_pretrained`` writes one (``json.dumps(indent=2)`` and a newline; the recorded
  SHA-256 of the source's file says whether the bytes are the source's). An F32/F16 source
  was rounded to BF16 at convert: its ``dtype`` / ``torch_dtype`` then says ``bfloat16``,
  as the weights are.
- ``model.safetensors``: every tensor the source held, BF16, bit-exact: the artifact's
  (GGUF BF16 bytes are torch's row-major bytes), and the embedding and head convert
  stripped (``source.stripped``) from the target (its embedding; its ``lm_head.weight``, or
  the embedding again for a tied head), checked against the hashes recorded at convert; a
  source without them gets none. Laid out as the safetensors library writes a file (the
  layout ``save_pretrained`` gives and DeepSpec's trainer saves): tensors sorted by name,
  contiguous, the JSON header padded with spaces to 8 bytes, ``__metadata__``
  ``{"format": "pt"}`` (or none, when the size convert recorded for the source's file says
  it had none). Then a single BF16 source's file is the source's, byte for byte, and a
  convert of the directory gives the artifact's drafter.gguf (``dflash.source.sha256`` is
  the file's SHA-256, general.name the directory's name); the result says, check by check,
  which files are the source's and why not (a sharded source is written as one file, an
  F32 source as its BF16 rounding).
- One sequential write of each file inside util/atomic.atomic_directory, every tensor
  streamed in blocks of util/hashing.BLOCK (never a whole tensor in memory), hashed as it
  is read and compared with what was checked (manifest.json's tensor hashes, the target's
  hashes the pairing compared); the directory is then read back as a source checkpoint
  (source/checkpoint.open_source: config, header, the contract's inventory) before the
  rename. Nothing is written on a refusal; the same inputs give the same bytes.
- `export --engine speculators` (commands/export_speculators.py) writes its directory with
  the same steps: ``export_inputs`` (output rules, refusals from the header, the pairing),
  ``artifact_tensors`` (the plan of the artifact's tensors) and ``write_checkpoint`` (the
  atomic write and the read-back).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dspark_convert.artifact.format import (GGUF_FILE, MANIFEST_FILE, contract_from_metadata,
                                             read_metadata)
from dspark_convert.artifact.manifest import FileRecord, Manifest
from dspark_convert.artifact.quantized import PARENT_KEY, QUANTIZATION_KEY
from dspark_convert.checks import Check
from dspark_convert.contract.dspark import FeatureContract
from dspark_convert.errors import (
    DSparkError,
    ExportArtifactError,
    ExportConfigSizeError,
    IntegrityError,
    InternalError,
    NonFiniteTensorError,
    QuantizedExportError,
)
from dspark_convert.formats.gguf_reader import GGUFFile, read_gguf
from dspark_convert.formats.numerics import as_array, first_non_finite, round_to_bf16
from dspark_convert.util.atomic import Output, atomic_directory, check_outputs, write_error
from dspark_convert.util.hashed_output import HashedOutput
from dspark_convert.util.hashing import BLOCK, read_blocks
from dspark_convert.util.progress import NoProgress, Progress
from dspark_convert.util.strict_json import MAX_CONFIG_BYTES

if TYPE_CHECKING:  # the target layer is imported where it is used
    from dspark_convert.target.model import Target

ENGINE = "deepspec"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
# The safetensors header's __metadata__ as the writers of DeepSpec-layout checkpoints leave
# it: save_pretrained (DeepSpec's trainer) passes {"format": "pt"}; safetensors' save_file
# without metadata writes none. The first whose file size is the source's is written.
HEADER_METADATA: tuple[dict[str, str] | None, ...] = ({"format": "pt"}, None)
# config.json's fields that declare the weights' dtype (contract.dspark.config_dtype).
DTYPE_FIELDS = ("dtype", "torch_dtype")
BF16_NAME = "bfloat16"


@dataclass(frozen=True)
class DeepSpecExportResult:
    output: Path
    engine: str                        # "deepspec"
    drafter: str                       # architecture and heads, for the summary line
    files: tuple[FileRecord, ...]      # config.json and model.safetensors as written
    tensors: int
    from_target: tuple[str, ...]       # the tensors taken from the target (embedding, head)
    artifact_sha256: str               # the artifact's drafter.gguf
    source_name: str                   # general.name: what a convert must be called to match
    config_identical: bool             # config.json is the source's bytes (recorded SHA-256)
    weights_identical: bool            # model.safetensors is the source's (dflash.source.sha256)
    checks: tuple[Check, ...]          # the pairing with the target, then the export's own


@dataclass(frozen=True)
class PlannedTensor:
    name: str                          # the source (state-dict) name
    shape: tuple[int, ...]             # torch order
    nbytes: int                        # BF16 bytes written
    path: Path                         # the file it is read from
    offset: int
    source_nbytes: int
    source_dtype: str                  # what is read: BF16, or the target's F16/F32
    read_sha256: str                   # what the bytes read must hash to
    written_sha256: str | None         # what the BF16 bytes written must hash to, if known
    origin: str                        # the file, for messages


# --- what is refused before anything is read -------------------------------------------------

def _refuse_quantized(kv: dict, label: str) -> None:
    qtype = kv.get(QUANTIZATION_KEY)
    if qtype is None:
        return
    parent = kv.get(PARENT_KEY)
    raise QuantizedExportError(
        f"{label}: metadata key '{QUANTIZATION_KEY}' is '{qtype}': a quantized artifact; "
        "DeepSpec's layout holds the source's BF16 weights, which quantization has lost; "
        f"export the BF16 artifact it was made from ({PARENT_KEY} {parent})", path=label,
        field=QUANTIZATION_KEY, expected="a BF16 artifact (dspark convert's)", found=qtype)


def validated_for_export(artifact: Path, target, progress: Progress):
    """validate_artifact with the target: a failure of the pairing is raised as its own
    refusal (60-68); any other, as the artifact's (100), as export --engine llama.cpp does."""
    from dspark_convert.commands.validate import validate_artifact

    report = validate_artifact(artifact, target=target, progress=progress)
    failure = report.first_failure
    if failure is None:
        return report
    if failure.name.startswith("target"):
        report.raise_first_error(f"{artifact}: validate: ", path=str(artifact))
    raise ExportArtifactError(
        f"{artifact}: the artifact does not validate: {failure.name}: {failure.detail}; "
        "expected an artifact that passes `dspark validate`", path=str(artifact),
        expected="a valid artifact", found=f"{failure.name} failed ({failure.error})")


@dataclass(frozen=True)
class ExportInputs:
    """What a checkpoint-directory export (deepspec, speculators) writes from, all checked."""
    out: Path                          # the output directory (its rules checked, not written)
    target: Target                     # the target, open
    gguf: GGUFFile                     # the drafter.gguf validate read
    artifact_sha256: str               # its SHA-256
    contract: FeatureContract          # its contract, from its metadata
    manifest: Manifest                 # manifest.json as validate read it
    pairing: tuple[Check, ...]         # validate's checks of the pairing with the target


def export_inputs(artifact: str | os.PathLike, target: str | os.PathLike | Target,
                  output: str | os.PathLike, *, force: bool, progress: Progress,
                  refuse: Callable[[dict, object, str], None]) -> ExportInputs:
    """The steps both checkpoint exports begin with: the output's rules (nothing is read or
    written for a bad one), then ``refuse(kv, contract, label)`` on drafter.gguf's header
    before a target or a weight is read (``contract`` None where the metadata parses but no
    contract does; a header that does not parse is left to validate, which names what is
    wrong), the target opened, ``validated_for_export``, and ``refuse`` again on the file
    validate read."""
    from dspark_convert.commands.binding import target_read
    from dspark_convert.target.model import Target, open_target

    artifact = Path(artifact)
    reads = [(artifact, "the artifact"),
             (target.directory, "the target model") if isinstance(target, Target)
             else target_read(target)]
    [out] = check_outputs([Output(output, "the output")], reads, force=force)
    label = str(artifact / GGUF_FILE)
    try:
        peek = read_metadata(read_gguf(artifact / GGUF_FILE), path=label)
    except DSparkError:
        peek = None
    if peek is not None:
        try:
            peek_contract = contract_from_metadata(peek, path=label)
        except DSparkError:
            peek_contract = None
        refuse(peek, peek_contract, label)

    opened = target if isinstance(target, Target) else open_target(target, progress=progress)
    report = validated_for_export(artifact, opened, progress)
    kv = read_metadata(report.gguf, path=label)
    contract = contract_from_metadata(kv, path=label)    # validate parsed it: it cannot fail
    refuse(kv, contract, label)                          # the file validate read
    manifest, _bytes = report.manifest
    return ExportInputs(out=out, target=opened, gguf=report.gguf,
                        artifact_sha256=report.gguf_sha256, contract=contract, manifest=manifest,
                        pairing=tuple(c for c in report.checks if c.name.startswith("target")))


# --- config.json ------------------------------------------------------------------------------

def config_bytes(manifest: Manifest) -> tuple[bytes, list[str]]:
    """config.json as save_pretrained writes it, from the config manifest.json recorded, and
    what was changed (an F32/F16 source's dtype fields, now ``bfloat16``)."""
    config = dict(manifest.source.config)
    changed = []
    if manifest.source.dtype != "BF16":
        for key in DTYPE_FIELDS:
            if key in config and config[key] != BF16_NAME:
                changed.append(f"'{key}' {config[key]!r} -> {BF16_NAME!r}")
                config[key] = BF16_NAME
    return (json.dumps(config, indent=2) + "\n").encode("utf-8"), changed


# --- model.safetensors ------------------------------------------------------------------------

def safetensors_header(tensors: list[tuple[str, tuple[int, ...], int]],
                       metadata: dict[str, str] | None) -> bytes:
    """The header the safetensors library writes for BF16 ``tensors`` (name, torch shape,
    nbytes) given in file order: the 8-byte length, then compact JSON (``__metadata__``
    first when given) padded with spaces to a multiple of 8 bytes."""
    header: dict[str, object] = {} if metadata is None else {"__metadata__": metadata}
    offset = 0
    for name, shape, nbytes in tensors:
        header[name] = {"dtype": "BF16", "shape": list(shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def _source_weights(manifest: Manifest) -> list[FileRecord]:
    """The source's weights files as convert recorded them (not config.json, not the index)."""
    return [f for f in manifest.source.files
            if f.path != CONFIG_FILE and not f.path.endswith(".index.json")]


def _header_for(plan: list[PlannedTensor], manifest: Manifest) -> bytes:
    """The header of the first HEADER_METADATA whose file has the size of the source's one
    weights file; the first (save_pretrained's) when none has, or the source was sharded."""
    tensors = [(t.name, t.shape, t.nbytes) for t in plan]
    data = sum(t.nbytes for t in plan)
    weights = _source_weights(manifest)
    headers = [safetensors_header(tensors, m) for m in HEADER_METADATA]
    if len(weights) == 1:
        for header in headers:
            if len(header) + data == weights[0].size:
                return header
    return headers[0]


def artifact_tensors(specs, gguf, manifest: Manifest) -> list[PlannedTensor]:
    """The tensors of ``specs`` (the contract's, each in drafter.gguf) as they are copied:
    BF16 bytes from the artifact, under their source names, checked against the SHA-256
    manifest.json records (which validate compared with the file)."""
    infos = {t.name: t for t in gguf.tensors}
    recorded = {t.name: t.sha256 for t in manifest.artifact.tensors}
    plan = []
    for spec in specs:
        info, sha = infos[spec.gguf_name], recorded[spec.gguf_name]
        plan.append(PlannedTensor(spec.source_name, tuple(spec.shape), info.nbytes, gguf.path,
                                  info.data_offset, info.nbytes, "BF16", sha, sha,
                                  str(gguf.path)))
    return plan


def _plan(contract, gguf, manifest: Manifest, target) -> list[PlannedTensor]:
    """Every tensor the source held, sorted by name (the safetensors library's order for
    one dtype): the artifact's from drafter.gguf, the stripped ones from the target."""
    from dspark_convert.target.model import hash_target_tensors
    from dspark_convert.target.pairing import DRAFTER_TENSOR_ROLES

    stripped = {s.name: s for s in manifest.source.stripped}
    hashed = {t.role: t.sha256 for t in hash_target_tensors(target)}   # the pairing's read
    entries = {"embedding": target.embed, "head": target.head}
    plan = artifact_tensors([s for s in contract.tensors if s.gguf_name is not None], gguf,
                            manifest)
    for spec in contract.tensors:
        shape = tuple(spec.shape)
        if spec.gguf_name is None and spec.source_name in stripped:
            record = stripped[spec.source_name]
            role = DRAFTER_TENSOR_ROLES[spec.source_name]
            entry = entries[role]
            if tuple(entry.shape) != shape or tuple(record.shape) != shape:
                raise InternalError(f"{spec.source_name}: the target's {entry.name} "
                                    f"{list(entry.shape)} or the recorded {record.shape} is "
                                    f"not {list(shape)}, which the pairing checked")
            plan.append(PlannedTensor(spec.source_name, shape, 2 * entry.nbytes // _itemsize(entry.dtype),
                                 entry.file, entry.begin, entry.nbytes, entry.dtype,
                                 hashed[role], record.sha256 if record.dtype == "BF16" else None,
                                 f"target {entry.file}"))
    return sorted(plan, key=lambda t: t.name)


def _itemsize(dtype: str) -> int:
    return {"BF16": 2, "F16": 2, "F32": 4}[dtype]


class SafetensorsWriter(HashedOutput):
    """The one sequential write of model.safetensors: header, then each tensor, hashed."""

    def __init__(self, fh, progress: Progress, shown: Path) -> None:
        super().__init__(fh, shown)
        self.progress = progress

    def run(self, header: bytes, plan: list[PlannedTensor]) -> None:
        self.put(header)
        buffer = memoryview(bytearray(BLOCK))      # BLOCK holds whole F32/BF16 elements
        handles: dict[Path, object] = {}
        try:
            for t in plan:
                if t.path not in handles:
                    handles[t.path] = _open(t)
                self._tensor(handles[t.path], t, buffer)
        finally:
            for handle in handles.values():
                handle.close()

    def _tensor(self, fh, t: PlannedTensor, buffer: memoryview) -> None:
        fh.seek(t.offset)
        read, written = hashlib.sha256(), hashlib.sha256()
        done = 0
        for block in read_blocks(fh, t.source_nbytes, buffer, [read], self.progress.advance,
                                 lambda: _changed(t, "shrank")):
            data = block
            if t.source_dtype != "BF16":
                bits = round_to_bf16(as_array(block, t.source_dtype))
                data = memoryview(bits).cast("B")
                bad = first_non_finite(bits, "BF16")
                if bad is not None:
                    index = done // _itemsize(t.source_dtype) + bad
                    raise NonFiniteTensorError(
                        f"{t.origin}: tensor '{t.name}' overflows BF16 at element {index}; "
                        "expected values within the BF16 range", path=t.origin, tensor=t.name,
                        expected="finite in BF16", found="inf")
            written.update(data)
            self.put(data)
            done += len(block)
        # What was copied is what was checked: the artifact's tensor hashes (manifest.json,
        # compared with the file by validate), the target's as the pairing hashed them.
        for want, got, what in ((t.read_sha256, read.hexdigest(), "read"),
                                (t.written_sha256, written.hexdigest(), "written")):
            if want is not None and want != got:
                raise IntegrityError(
                    f"{t.origin}: tensor '{t.name}' changed while it was exported (SHA-256 of "
                    f"the bytes {what} {got}, checked as {want}); expected the file unchanged",
                    path=t.origin, tensor=t.name, expected=want, found=got)


def _open(t: PlannedTensor):
    try:
        return open(t.path, "rb")
    except OSError as exc:
        raise IntegrityError(f"{t.origin}: cannot read it again: {os.strerror(exc.errno or 0)}; "
                             "expected the file unchanged", path=t.origin) from None


def _changed(t: PlannedTensor, how: str) -> IntegrityError:
    return IntegrityError(f"{t.origin}: the file {how} while '{t.name}' was read; expected it "
                          "unchanged", path=t.origin, tensor=t.name)


def write_checkpoint(out: Path, *, force: bool, progress: Progress, config: bytes,
                     header: bytes, plan: list[PlannedTensor], engine: str,
                     read_back: Callable[[Path], object], source: str,
                     contract, manifest_path: Path) -> dict[str, FileRecord]:
    """The one write of a checkpoint directory, inside util/atomic.atomic_directory:
    config.json, then model.safetensors (``header``, then each planned tensor streamed,
    hashed and checked: SafetensorsWriter), its size the plan's; the directory is then read
    back, ``read_back(tmp)`` (convert's read of ``source``: config.json, the strict
    safetensors header, the inventory), and its contract must be ``contract``
    (manifest.json's, which validate checked) before the rename; a config.json over the
    size that read refuses is refused first (86, naming ``manifest_path``), nothing
    written. Returns each file's record, in the order written."""
    if len(config) > MAX_CONFIG_BYTES:     # the read-back's first refusal, before any write
        raise ExportConfigSizeError(
            f"{manifest_path}: field 'source.config': written as {CONFIG_FILE} it is "
            f"{len(config)} bytes; expected at most {MAX_CONFIG_BYTES} (what every reader "
            f"of {CONFIG_FILE} here reads, so that the export reads back as {source})",
            path=str(manifest_path), field="source.config", expected=MAX_CONFIG_BYTES,
            found=len(config))
    expected = len(header) + sum(t.nbytes for t in plan)
    written: dict[str, FileRecord] = {}
    with atomic_directory(out, force=force) as tmp:
        try:
            (tmp / CONFIG_FILE).write_bytes(config)
        except OSError as exc:
            raise write_error(exc, out / CONFIG_FILE) from None
        written[CONFIG_FILE] = FileRecord(path=CONFIG_FILE, size=len(config),
                                          sha256=hashlib.sha256(config).hexdigest())
        try:
            fh = open(tmp / WEIGHTS_FILE, "wb")
        except OSError as exc:
            raise write_error(exc, out / WEIGHTS_FILE) from None
        with fh:
            writer = SafetensorsWriter(fh, progress, out / WEIGHTS_FILE)
            progress.start(f"export {WEIGHTS_FILE} for {engine}",
                           sum(t.source_nbytes for t in plan))
            try:
                writer.run(header, plan)
            finally:
                progress.finish()
        if writer.size != expected:
            raise InternalError(f"{out / WEIGHTS_FILE}: wrote {writer.size} bytes, planned {expected}")
        written[WEIGHTS_FILE] = FileRecord(path=WEIGHTS_FILE, size=writer.size,
                                           sha256=writer.digest.hexdigest())
        try:
            back = read_back(tmp)
        except DSparkError as exc:
            # A bug, never a refusal: validate read source.config by the rules convert
            # applies. Named by the output the user gave, not the temporary directory.
            raise InternalError(f"{out}: the exported checkpoint does not read back as "
                                f"{source}: {exc.message.replace(str(tmp), str(out))}") from None
        # manifest.json's contract: the one convert built from the source's config.json
        # (the metadata's holds rms_norm_eps as FLOAT32), which validate checked.
        if back.contract != contract:
            raise InternalError(f"{out}: the exported checkpoint's contract differs from the "
                                "artifact's (manifest.json contract)")
    return written


# --- what the files are -------------------------------------------------------------------------

def _short(sha: str) -> str:
    return sha[:16] + "…"


def _config_check(manifest: Manifest, sha: str, changed: list[str]) -> tuple[Check, bool]:
    recorded = next(f for f in manifest.source.files if f.path == CONFIG_FILE)
    if sha == recorded.sha256:
        return Check.passed("export.config", f"{CONFIG_FILE} is the source's, byte for byte "
                            f"(SHA-256 {_short(sha)} as convert recorded it)"), True
    why = (f"the source's with {', '.join(changed)}: the weights are BF16" if changed else
           "the source's config as manifest.json records it (source.config), not its bytes: "
           "the source's file was not laid out as save_pretrained writes one")
    return Check.info("export.config", f"{CONFIG_FILE}: {why} (source SHA-256 "
                      f"{_short(recorded.sha256)}, written {_short(sha)})"), False


def _weights_check(manifest: Manifest, sha: str) -> tuple[Check, bool]:
    weights = _source_weights(manifest)
    if len(weights) == 1 and weights[0].sha256 == sha:
        return Check.passed("export.weights", f"{WEIGHTS_FILE} is the source's, byte for byte "
                            f"(SHA-256 {_short(sha)} = dflash.source.sha256)"), True
    if manifest.source.dtype != "BF16":
        why = (f"the source was {manifest.source.dtype}, rounded to BF16 at convert: the "
               "tensors are the artifact's BF16 values (what every engine reading DeepSpec's "
               f"layout runs), not the source's {manifest.source.dtype} bytes")
    elif len(weights) > 1:
        why = (f"the source's weights were {len(weights)} files "
               f"({', '.join(w.path for w in weights)}); DeepSpec's layout is one "
               f"{WEIGHTS_FILE}: every tensor is bit-exact, the file is none of the source's")
    else:
        why = (f"every tensor is bit-exact, but the source's file (SHA-256 "
               f"{_short(weights[0].sha256)}) had another safetensors header (convert records "
               "its hash and size, not its header)")
    return Check.info("export.weights", f"{WEIGHTS_FILE}: {why}; a convert of this directory "
                      "records another dflash.source.sha256"), False


def _round_trip_check(manifest: Manifest, out: Path, identical: bool, gguf_sha: str) -> Check:
    if not identical:
        return Check.info("export.round_trip", "a convert of this directory gives the "
                          "artifact's drafter.gguf but for dflash.source.sha256 (the weights "
                          "file is not the source's)")
    src = manifest.source
    if src.repo is not None:
        how = (f"converted as the Hub source it came from (general.name {src.name!r}, "
               f"revision {src.revision}: the library's convert(..., identity=...))")
    elif out.name == src.name:
        how = "converted as it is (its name is the source's, general.name)"
    else:
        how = (f"converted under the source's name {src.name!r} (general.name is the "
               "directory's name)")
    target = " with the target it was converted with" if manifest.target is not None else ""
    return Check.passed("export.round_trip", f"{how}{target}, this directory gives the "
                        f"artifact's drafter.gguf byte for byte (SHA-256 {_short(gguf_sha)})")


def _describe(contract) -> str:
    head, conf = contract.markov_head, contract.confidence_head
    heads = "no Markov head" if head.rank == 0 else f"{head.type} Markov head, rank {head.rank}"
    if conf.enabled:
        heads += ", confidence head"
    return f"{contract.architecture} ({heads})"


# --- the command --------------------------------------------------------------------------------

def export_deepspec(artifact: str | os.PathLike, target: str | os.PathLike | Target,
                    output: str | os.PathLike, *, force: bool = False,
                    progress: Progress | None = None) -> DeepSpecExportResult:
    """Write ``output``, a directory holding the artifact's drafter as DeepSpec saves it
    (config.json, model.safetensors), its embedding and head taken from ``target`` (a model
    directory, ``org/name@<commit>``, or an open ``target.Target``) and checked against the
    hashes the artifact recorded. Raises a DSparkError subclass for every refusal and
    writes nothing then."""
    from dspark_convert.source.checkpoint import open_source

    from dspark_convert.commands.binding import refuse_family

    progress = progress or NoProgress()
    refuse_family(artifact, "export-deepspec")     # a DFlash2 drafter or an assistant: 105
    # A quantized artifact is refused from its header, before a target or a weight is read.
    inputs = export_inputs(artifact, target, output, force=force, progress=progress,
                           refuse=lambda kv, _contract, label: _refuse_quantized(kv, label))
    out, gguf, manifest = inputs.out, inputs.gguf, inputs.manifest
    plan = _plan(inputs.contract, gguf, manifest, inputs.target)
    config, changed = config_bytes(manifest)
    written = write_checkpoint(out, force=force, progress=progress, config=config,
                               header=_header_for(plan, manifest), plan=plan, engine="DeepSpec",
                               read_back=open_source, source="a source",
                               contract=manifest.contract,
                               manifest_path=gguf.path.parent / MANIFEST_FILE)

    config_check, config_same = _config_check(manifest, written[CONFIG_FILE].sha256, changed)
    weights_check, weights_same = _weights_check(manifest, written[WEIGHTS_FILE].sha256)
    from_target = tuple(t.name for t in plan if t.path != gguf.path)
    tensors_check = Check.passed("export.tensors", (
        f"{len(plan)} BF16 tensors, each bit-exact: {len(plan) - len(from_target)} from "
        f"{GGUF_FILE} (the SHA-256 manifest.json records)" + (
            f", {' and '.join(from_target)} from the target (the SHA-256 recorded at convert)"
            if from_target else "; the source held no embedding or head, nor does this")))
    return DeepSpecExportResult(
        output=out.absolute(), engine=ENGINE, drafter=_describe(inputs.contract),
        files=tuple(written.values()), tensors=len(plan), from_target=from_target,
        artifact_sha256=inputs.artifact_sha256, source_name=manifest.source.name,
        config_identical=config_same, weights_identical=weights_same,
        checks=inputs.pairing + (tensors_check, config_check, weights_check,
                                 _round_trip_check(manifest, out, weights_same,
                                                   inputs.artifact_sha256)))
