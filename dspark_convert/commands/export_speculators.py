"""`dspark export --engine speculators`: an artifact as the checkpoint vllm-project/speculators
0.9.0 saves (issue 28, Deliver 2), the format vLLM 0.33 serves: ``config.json`` +
``model.safetensors`` (docs/SPECULATORS.md; the mapping is contract/speculators.py's table).

- The artifact must pass ``validate_artifact`` with the target (the pairing, 60-68), as
  `export --engine deepspec` does: speculators never saves the embedding or a full-vocabulary
  head, and loads the verifier's, so the target the config names must be the one whose
  embedding and head the drafter was converted against. A quantized artifact is refused
  (106): the format holds BF16 weights. A Gemma4 artifact is refused (105): speculators
  0.9.0's DSpark and DFlash drafters are Qwen3 layers.
- ``config.json``: ``contract.speculators.write_config`` from the artifact's contract (and
  the Qwen3 fields it does not hold from manifest.json's ``source.config``): model type
  ``dspark``, ``sample_from_anchor`` always written (true: the format's layout), the verifier
  recorded (the target: its Hub repo id, or the directory as given, and its architectures),
  written as transformers' save_pretrained writes a config (sorted keys, two-space indent).
- ``model.safetensors``: the artifact's tensors under their source names (the names
  speculators uses), BF16 bit-exact (GGUF BF16 bytes are torch's row-major bytes), no
  embedding and no head; laid out as the safetensors library writes a file (sorted by name,
  the header padded to 8 bytes, ``__metadata__`` ``{"format": "pt"}``, save_pretrained's).
- One sequential write of each file inside util/atomic.atomic_directory, each tensor streamed
  and hashed against manifest.json's records; the directory is read back as a speculators
  source (the contract it maps to must be the artifact's) before the rename. Nothing is
  written on a refusal; the same inputs give the same bytes (no timestamps, no versions but
  the format's).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dspark_convert.artifact.format import GGUF_FILE, contract_from_metadata, read_metadata
from dspark_convert.artifact.manifest import FileRecord
from dspark_convert.artifact.quantized import PARENT_KEY, QUANTIZATION_KEY
from dspark_convert.checks import Check
from dspark_convert.commands.export_deepspec import (
    PlannedTensor,
    SafetensorsWriter,
    safetensors_header,
    validated_for_export,
)
from dspark_convert.contract import speculators as S
from dspark_convert.contract.families import QWEN3
from dspark_convert.errors import (
    DSparkError,
    FamilyExportError,
    InternalError,
    QuantizedExportError,
)
from dspark_convert.formats.gguf_reader import read_gguf
from dspark_convert.util.atomic import Output, atomic_directory, check_outputs, write_error
from dspark_convert.util.progress import NoProgress, Progress

if TYPE_CHECKING:  # the target layer is imported where it is used
    from dspark_convert.target.model import Target

ENGINE = "speculators"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
HEADER_METADATA = {"format": "pt"}          # save_pretrained's


@dataclass(frozen=True)
class SpeculatorsExportResult:
    output: Path
    engine: str                        # "speculators"
    drafter: str                       # speculators' model and heads, for the summary line
    files: tuple[FileRecord, ...]      # config.json and model.safetensors as written
    tensors: int
    artifact_sha256: str               # the artifact's drafter.gguf
    verifier: str                      # speculators_config.verifier.name_or_path
    checks: tuple[Check, ...]          # the pairing with the target, then the export's own


def _refuse(kv: dict, contract, label: str) -> None:
    qtype = kv.get(QUANTIZATION_KEY)
    if qtype is not None:
        raise QuantizedExportError(
            f"{label}: metadata key '{QUANTIZATION_KEY}' is '{qtype}': a quantized artifact; "
            "speculators' format holds BF16 weights, which quantization has lost; export the "
            f"BF16 artifact it was made from ({PARENT_KEY} {kv.get(PARENT_KEY)})", path=label,
            field=QUANTIZATION_KEY, expected="a BF16 artifact (dspark convert's)", found=qtype)
    if contract is not None and contract.family != QWEN3.name:
        raise FamilyExportError(
            f"{label}: a {contract.family} drafter ({contract.architecture}); speculators "
            f"{S.SPECULATORS_VERSION}'s DSpark and DFlash drafters are Qwen3 decoder layers "
            "(no sandwich norms, layer scalars or logit softcap), so it has no speculators form",
            path=label, field="family", expected=QWEN3.name, found=contract.family)


def verifier_of(target: Target) -> tuple[str, list[str]]:
    """speculators_config.verifier: what a loader of the format (speculators, vLLM) loads the
    target by (its Hub repo id, or the directory as given) and its architectures."""
    return (target.repo if target.repo is not None else target.spec,
            list(target.config.architectures))


def _plan(contract, gguf, manifest) -> list[PlannedTensor]:
    infos = {t.name: t for t in gguf.tensors}
    recorded = {t.name: t.sha256 for t in manifest.artifact.tensors}
    names = S.written_tensors([s.source_name for s in contract.written_tensors])
    plan = []
    for spec in contract.written_tensors:
        if spec.source_name not in names:
            continue
        info = infos[spec.gguf_name]
        plan.append(PlannedTensor(spec.source_name, tuple(spec.shape), info.nbytes, gguf.path,
                             info.data_offset, info.nbytes, "BF16", recorded[spec.gguf_name],
                             recorded[spec.gguf_name], str(gguf.path)))
    return sorted(plan, key=lambda t: t.name)


def _describe(contract) -> str:
    head, conf = contract.markov_head, contract.confidence_head
    heads = "no Markov head" if head.rank == 0 else f"{head.type} Markov head, rank {head.rank}"
    if conf.enabled:
        heads += ", confidence head" + (" with Markov features" if conf.with_markov else "")
    return f"{S.MODEL_TYPES[S.WRITTEN_MODEL_TYPE]} ({heads}), sample_from_anchor true"


def export_speculators(artifact: str | os.PathLike, target: str | os.PathLike | Target,
                       output: str | os.PathLike, *, force: bool = False,
                       progress: Progress | None = None) -> SpeculatorsExportResult:
    """Write ``output``, a directory holding the artifact's drafter as speculators 0.9.0 saves
    it (config.json, model.safetensors), its verifier ``target`` (a model directory,
    ``org/name@<commit>``, or an open ``target.Target``), paired with the artifact first.
    Raises a DSparkError subclass for every refusal and writes nothing then."""
    from dspark_convert.commands.binding import target_read
    from dspark_convert.source.checkpoint import SpeculatorsOptions, open_source
    from dspark_convert.target.model import Target, open_target

    progress = progress or NoProgress()
    artifact = Path(artifact)
    reads = [(artifact, "the artifact"),
             (target.directory, "the target model") if isinstance(target, Target)
             else target_read(target)]
    [out] = check_outputs([Output(output, "the output")], reads, force=force)
    label = str(artifact / GGUF_FILE)
    # Refused from the header, before a target or a weight is read; a header that does not
    # parse is left to validate, which names what is wrong.
    try:
        peek = read_metadata(read_gguf(artifact / GGUF_FILE), path=label)
        peek_contract = contract_from_metadata(peek, path=label)
    except DSparkError:
        peek = None
    if peek is not None:
        _refuse(peek, peek_contract, label)

    opened = target if isinstance(target, Target) else open_target(target, progress=progress)
    report = validated_for_export(artifact, opened, progress)
    gguf = report.gguf
    kv = read_metadata(gguf, path=label)
    contract = contract_from_metadata(kv, path=label)
    _refuse(kv, contract, label)                     # the file validate read
    manifest, _bytes = report.manifest
    verifier, architectures = verifier_of(opened)
    config = S.config_bytes(S.write_config(manifest.contract, manifest.source.config,
                                           verifier_name=verifier,
                                           verifier_architectures=architectures))
    plan = _plan(contract, gguf, manifest)
    header = safetensors_header([(t.name, t.shape, t.nbytes) for t in plan], HEADER_METADATA)
    expected = len(header) + sum(t.nbytes for t in plan)
    written: dict[str, tuple[int, str]] = {}

    with atomic_directory(out, force=force) as tmp:
        try:
            (tmp / CONFIG_FILE).write_bytes(config)
        except OSError as exc:
            raise write_error(exc, out / CONFIG_FILE) from None
        written[CONFIG_FILE] = (len(config), hashlib.sha256(config).hexdigest())
        try:
            fh = open(tmp / WEIGHTS_FILE, "wb")
        except OSError as exc:
            raise write_error(exc, out / WEIGHTS_FILE) from None
        with fh:
            writer = SafetensorsWriter(fh, progress, out / WEIGHTS_FILE)
            progress.start(f"export {WEIGHTS_FILE} for speculators",
                           sum(t.source_nbytes for t in plan))
            try:
                writer.run(header, plan)
            finally:
                progress.finish()
        if writer.size != expected:
            raise InternalError(f"{out / WEIGHTS_FILE}: wrote {writer.size} bytes, planned {expected}")
        written[WEIGHTS_FILE] = (writer.size, writer.digest.hexdigest())
        # Read back as convert reads a speculators source: the config through the table to
        # its DeepSpec twin's contract, the strict safetensors header, the inventory.
        try:
            back = open_source(tmp, SpeculatorsOptions(
                target_layers=lambda: opened.config.num_hidden_layers))
        except DSparkError as exc:
            raise InternalError(f"{out}: the exported checkpoint does not read back as a "
                                f"speculators source: {exc.message}") from None
        if back.contract != manifest.contract:
            raise InternalError(f"{out}: the exported checkpoint's contract differs from the "
                                "artifact's (manifest.json contract)")

    pairing = tuple(c for c in report.checks if c.name.startswith("target"))
    checks = pairing + (
        Check.passed("export.tensors", f"{len(plan)} BF16 tensors, each bit-exact from "
                     f"{GGUF_FILE} (the SHA-256 manifest.json records); no embedding or head: "
                     "speculators loads the verifier's, which the pairing checked"),
        Check.passed("export.config", f"{CONFIG_FILE}: speculators {S.SPECULATORS_VERSION} "
                     f"{S.WRITTEN_MODEL_TYPE}, sample_from_anchor true, verifier {verifier!r} "
                     f"({', '.join(architectures)}); read back as the artifact's contract"),
    )
    return SpeculatorsExportResult(
        output=out.absolute(), engine=ENGINE, drafter=_describe(contract),
        files=tuple(FileRecord(path=name, size=size, sha256=sha)
                    for name, (size, sha) in written.items()),
        tensors=len(plan), artifact_sha256=report.gguf_sha256, verifier=verifier,
        checks=checks)
