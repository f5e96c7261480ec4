"""`dspark export --engine speculators`: an artifact as the checkpoint vllm-project/speculators
0.9.0 saves, the format vLLM 0.33 serves: ``config.json`` +
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

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dspark_convert.artifact.format import GGUF_FILE, MANIFEST_FILE
from dspark_convert.artifact.manifest import FileRecord
from dspark_convert.artifact.quantized import PARENT_KEY, QUANTIZATION_KEY
from dspark_convert.checks import Check
from dspark_convert.commands import export_speculators_dflash2 as dflash2
from dspark_convert.commands.export_deepspec import (
    CONFIG_FILE,
    PlannedTensor,
    artifact_tensors,
    export_inputs,
    safetensors_header,
    write_checkpoint,
)
from dspark_convert.contract import speculators as S
from dspark_convert.contract.families import QWEN3
from dspark_convert.errors import FamilyExportError, QuantizedExportError
from dspark_convert.util.progress import NoProgress, Progress

if TYPE_CHECKING:  # the target layer is imported where it is used
    from dspark_convert.target.model import Target

ENGINE = "speculators"
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
    if contract is None:        # a header whose contract does not parse: validate names it
        return
    qtype = kv.get(QUANTIZATION_KEY)
    if qtype is not None:
        raise QuantizedExportError(
            f"{label}: metadata key '{QUANTIZATION_KEY}' is '{qtype}': a quantized artifact; "
            "speculators' format holds BF16 weights, which quantization has lost; export the "
            f"BF16 artifact it was made from ({PARENT_KEY} {kv.get(PARENT_KEY)})", path=label,
            field=QUANTIZATION_KEY, expected="a BF16 artifact (dspark convert's)", found=qtype)
    if contract.family != QWEN3.name:
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
    names = S.written_tensors([s.source_name for s in contract.written_tensors])
    plan = artifact_tensors([s for s in contract.written_tensors if s.source_name in names],
                            gguf, manifest)
    return sorted(plan, key=lambda t: t.name)


def _describe(contract) -> str:
    head, conf = contract.markov_head, contract.confidence_head
    heads = "no Markov head" if head.rank == 0 else f"{head.type} Markov head, rank {head.rank}"
    if conf.enabled:
        heads += ", confidence head" + (" with Markov features" if conf.with_markov else "")
    return f"{S.MODEL_TYPES[S.WRITTEN_MODEL_TYPE]} ({heads}), sample_from_anchor true"


def export_speculators(artifact: str | os.PathLike, target: str | os.PathLike | Target,
                       output: str | os.PathLike, *, force: bool = False,
                       progress: Progress | None = None
                       ) -> SpeculatorsExportResult | dflash2.SpeculatorsDFlash2Result:
    """Write ``output``, a directory holding the artifact's drafter as speculators 0.9.0 saves
    it (config.json, model.safetensors), its verifier ``target`` (a model directory,
    ``org/name@<commit>``, or an open ``target.Target``), paired with the artifact first.
    Raises a DSparkError subclass for every refusal and writes nothing then."""
    from dspark_convert.source.checkpoint import SpeculatorsOptions, open_source

    if dflash2.is_dflash2(artifact):     # a DFlash2 drafter: its own export, by kind
        return dflash2.export_speculators_dflash2(artifact, target, output, force=force,
                                                  progress=progress)
    progress = progress or NoProgress()
    # Refused from the header, before a target or a weight is read.
    inputs = export_inputs(artifact, target, output, force=force, progress=progress,
                           refuse=_refuse)
    manifest, opened = inputs.manifest, inputs.target
    verifier, architectures = verifier_of(opened)
    config = S.config_bytes(S.write_config(manifest.contract, manifest.source.config,
                                           verifier_name=verifier,
                                           verifier_architectures=architectures))
    plan = _plan(inputs.contract, inputs.gguf, manifest)
    # Read back as convert reads a speculators source: the config through the table to its
    # DeepSpec twin's contract, the strict safetensors header, the inventory.
    written = write_checkpoint(
        inputs.out, force=force, progress=progress, config=config,
        header=safetensors_header([(t.name, t.shape, t.nbytes) for t in plan], HEADER_METADATA),
        plan=plan, engine="speculators", source="a speculators source",
        read_back=lambda tmp: open_source(tmp, SpeculatorsOptions(
            target_layers=lambda: opened.config.num_hidden_layers)),
        contract=manifest.contract, manifest_path=inputs.gguf.path.parent / MANIFEST_FILE)

    checks = inputs.pairing + (
        Check.passed("export.tensors", f"{len(plan)} BF16 tensors, each bit-exact from "
                     f"{GGUF_FILE} (the SHA-256 manifest.json records); no embedding or head: "
                     "speculators loads the verifier's, which the pairing checked"),
        Check.passed("export.config", f"{CONFIG_FILE}: speculators {S.SPECULATORS_VERSION} "
                     f"{S.WRITTEN_MODEL_TYPE}, sample_from_anchor true, verifier {verifier!r} "
                     f"({', '.join(architectures)}); read back as the artifact's contract"),
    )
    return SpeculatorsExportResult(
        output=inputs.out.absolute(), engine=ENGINE, drafter=_describe(inputs.contract),
        files=tuple(written.values()), tensors=len(plan),
        artifact_sha256=inputs.artifact_sha256, verifier=verifier, checks=checks)
