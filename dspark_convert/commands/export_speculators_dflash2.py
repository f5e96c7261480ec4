"""`dspark export --engine speculators` of a DFlash2 drafter: the directory speculators 0.9.0's
``DFlash2DraftModel.save_pretrained`` writes (docs/SPECULATORS.md, "DFlash2"; the format
docs/REFERENCE.md, "DFlash2", describes), called by commands/export_speculators.py for a
DFlash2 drafter.

- The drafter is read as the reference runtime reads it (``runtime.dflash2.plan_drafter``,
  no tensor byte): a DFlash2 artifact (`dspark convert`'s), validated with the target first
  as every checkpoint export does (the pairing 60-68 and 154, else 100), its config the
  ``source.config`` manifest.json records (which must build the manifest's contract) and its
  tensors checked against manifest.json's hashes as they are copied; or a DFlash2
  checkpoint directory (config.json through contract/dflash2.py, every tensor of the table
  by its header, none other), checked against the target here (``check_target``, 154). The
  target is the verifier the export records: speculators' ``load_verifier_weights`` takes the
  embedding and the head from it.
- ``config.json``: every field ``DFlash2SpeculatorConfig`` writes (``write_config``): the
  drafter's own (block, taps, mask, layout, convolutions, selector, vocabulary, the Qwen3
  ``transformer_layer_config`` as the drafter's config states it; a z-lab config as the
  speculators config it stands for), ``dtype`` bfloat16,
  ``speculators_config`` (algorithm ``dflash2``, the greedy proposal with B - 1 speculative
  tokens, the target as verifier: its Hub repo id or the directory as given, and its
  architectures), ``speculators_version`` 0.9.0, ``tie_word_embeddings`` false; written as
  save_pretrained writes a config (sorted keys, two-space indent). Not written:
  ``auto_map`` (it names the ``config.py`` copy of speculators' source that save_pretrained
  writes beside it, which is code, not the drafter; speculators dispatches on
  ``speculators_model_type``) and ``transformers_version`` (the library that saved a file,
  not the drafter), as the DSpark export writes neither.
- ``model.safetensors``: every tensor of the table under speculators' names, BF16 (bit-exact
  from BF16; F32/F16 rounded to nearest even, as torch's ``.to(bfloat16)``), no embedding,
  head, verifier head or verifier norm; laid out as the safetensors library writes a file
  (sorted by name, ``__metadata__`` ``{"format": "pt"}``, the header padded to 8 bytes).
  From a BF16 drafter it is therefore the same bytes as a speculators-saved source.
- One sequential write inside util/atomic.atomic_directory (export_deepspec.write_checkpoint);
  the directory is read back by ``plan_drafter`` and must be the same drafter (every field
  the forward reads, every tensor's shape) before the rename. From the artifact of a
  speculators checkpoint, both files are what exporting that checkpoint directly writes. Nothing is written on a
  refusal; the same inputs give the same bytes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dspark_convert.artifact.format import GGUF_FILE, MANIFEST_FILE, metadata_family, read_metadata
from dspark_convert.artifact.manifest import FileRecord, Manifest
from dspark_convert.checks import Check
from dspark_convert.commands.export_deepspec import (
    CONFIG_FILE,
    PlannedTensor,
    safetensors_header,
    validated_for_export,
    write_checkpoint,
)
from dspark_convert.contract import dflash2 as D
from dspark_convert.contract import speculators as S
from dspark_convert.errors import (DFlash2ConfigError, DFlash2TargetError, DSparkError,
                                   ExportArtifactError)
from dspark_convert.formats.gguf_reader import read_gguf
from dspark_convert.util.atomic import Output, check_outputs
from dspark_convert.util.hashing import sha256_file
from dspark_convert.util.progress import NoProgress, Progress
from dspark_convert.util.strict_json import read_json_strict

if TYPE_CHECKING:      # torch (runtime/loading) and the target are imported where used
    from dspark_convert.runtime.dflash2 import DFlash2Plan
    from dspark_convert.target.model import Target

ENGINE = "speculators"
ALGORITHM = D.MODEL_TYPE                    # speculators_config.algorithm
HEADER_METADATA = {"format": "pt"}          # save_pretrained's
BF16_NAME = "bfloat16"
STORED_NAMES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}   # torch -> safetensors
QWEN3_MODEL_TYPE = "qwen3"


@dataclass(frozen=True)
class SpeculatorsDFlash2Result:
    """What export_speculators returns for a DFlash2 drafter: its SpeculatorsExportResult's
    fields (this module is imported by that one, so it cannot import its class)."""
    output: Path
    engine: str                        # "speculators"
    drafter: str                       # the model, for the summary line
    files: tuple[FileRecord, ...]      # config.json and model.safetensors as written
    tensors: int
    artifact_sha256: str               # the file the tensors were read from
    verifier: str                      # speculators_config.verifier.name_or_path
    checks: tuple[Check, ...]          # the target, then the export's own


def is_dflash2(path: str | os.PathLike) -> bool:
    """Whether ``path`` holds a DFlash2 drafter: an artifact whose drafter.gguf names the
    DFlash2 family (its header alone read), or a checkpoint directory whose config.json is a
    speculators DFlash2 config (``speculators_model_type`` ``dflash2``). Anything else, an
    unreadable file included, is left to the export that reads it to name."""
    path = Path(path)
    try:
        if (path / GGUF_FILE).is_file():
            label = str(path / GGUF_FILE)
            kv = read_metadata(read_gguf(path / GGUF_FILE), path=label)
            return metadata_family(kv, path=label).name == D.FAMILY
        raw = read_json_strict(path / CONFIG_FILE, error=DFlash2ConfigError)
    except (DSparkError, OSError):
        return False
    return isinstance(raw, dict) and raw.get("speculators_model_type") == D.MODEL_TYPE


# --- config.json ------------------------------------------------------------------------------

def layer_config(cfg: D.DFlash2Config) -> dict:
    """``transformer_layer_config`` as the drafter's config holds it: every field it states
    (the Qwen3 fields and any other transformers wrote), none that a default filled in."""
    return cfg.layer.model_dump(mode="json", exclude_unset=True)


def speculative_tokens(cfg: D.DFlash2Config) -> int:
    """speculators' rule (dflash/core.py:256-259): B - 1 drafts when the anchor is the bonus
    token (sample_from_anchor false, DFlash2's layout), B otherwise."""
    return cfg.block_size if cfg.sample_from_anchor else cfg.block_size - 1


def write_config(cfg: D.DFlash2Config, *, verifier_name: str,
                 verifier_architectures: list[str]) -> dict:
    """speculators' config.json for the DFlash2 drafter ``cfg``: each field
    DFlash2SpeculatorConfig declares from the drafter (none from a default), the verifier
    from the target."""
    out: dict = {name: getattr(cfg, name) for name in D.DFlash2Config.model_fields
                 if name != "transformer_layer_config"}
    out.update({
        "architectures": [D.ARCHITECTURE],
        "speculators_model_type": D.MODEL_TYPE,
        "aux_hidden_state_layer_ids": list(cfg.aux_hidden_state_layer_ids),
        "transformer_layer_config": layer_config(cfg),
        "dtype": BF16_NAME,
        "speculators_config": {
            "algorithm": ALGORITHM, "default_proposal_method": "greedy",
            "proposal_methods": [{"accept_tolerance": 0.0, "proposal_type": "greedy",
                                  "speculative_tokens": speculative_tokens(cfg),
                                  "verifier_accept_k": 1}],
            "verifier": {"architectures": list(verifier_architectures),
                         "name_or_path": verifier_name}},
        "speculators_version": S.SPECULATORS_VERSION,
        "tie_word_embeddings": False,
    })
    return out


def forward_fields(cfg: D.DFlash2Config) -> dict:
    """What the forward reads of a config (the declared fields, the layer's as stated):
    what an export must keep. ``speculators_config``, ``dtype`` and the other kept extras
    are not read."""
    out = cfg.model_dump(mode="json", exclude=set(cfg.model_extra or ()))
    out["transformer_layer_config"] = layer_config(cfg)
    return out


def source_config(manifest: Manifest, *, path: str) -> D.DFlash2Config:
    """An artifact's drafter config: the config.json its manifest records (``source.config``,
    speculators' or z-lab's layout, read as convert read it), which must build the contract
    the manifest records (validate proved that one drafter.gguf's): the export writes its
    fields as the source stated them (every layer field, ``rms_norm_eps`` as written, not
    the metadata's FLOAT32)."""
    label = f"{path} (source.config)"
    try:
        cfg = D.parse_any_config(manifest.source.config, path=label)
        same = D.build_contract(cfg, path=label) == manifest.contract
    except DSparkError as exc:
        raise ExportArtifactError(
            f"{path}: field 'source.config': {exc.message}; expected the DFlash2 config the "
            "artifact was converted from", path=path, field="source.config",
            expected="a DFlash2 config", found="refused") from None
    if not same:
        raise ExportArtifactError(
            f"{path}: field 'source.config': its DFlash2 contract is not the one manifest.json "
            "records (which drafter.gguf holds); expected the config the artifact was "
            "converted from", path=path, field="source.config",
            expected="the contract's config", found="another drafter's")
    return cfg


# --- the target -------------------------------------------------------------------------------

def check_target(cfg: D.DFlash2Config, target: Target, *, path: str) -> Check:
    """The verifier the export records must be the target the drafter reads (154): a Qwen3
    model (speculators' DFlash2 layers and verifier are Qwen3's), its hidden size (fc reads
    m x hidden_size features), its vocabulary (the codebooks and the unary head), every
    tapped hidden state (HF hidden_states has num_hidden_layers + 1 entries)."""
    tc = target.config
    if tc.model_type != QWEN3_MODEL_TYPE:
        raise DFlash2TargetError(
            f"{target.label}: field 'model_type': expected '{QWEN3_MODEL_TYPE}' (a DFlash2 "
            f"drafter's verifier is a Qwen3 model), found {tc.model_type!r}",
            path=str(target.directory / CONFIG_FILE), field="model_type",
            expected=QWEN3_MODEL_TYPE, found=tc.model_type)
    for field, mine, theirs in (("hidden_size", cfg.hidden_size, tc.hidden_size),
                                ("vocab_size", cfg.vocab_size, tc.vocab_size)):
        if mine != theirs:
            raise DFlash2TargetError(
                f"{path}: field 'transformer_layer_config.{field}': expected the target's "
                f"{theirs} ({target.label}), found {mine}", path=path,
                field=f"transformer_layer_config.{field}", expected=theirs, found=mine)
    n = tc.num_hidden_layers
    for i, index in enumerate(cfg.aux_hidden_state_layer_ids):
        if index > n:
            raise DFlash2TargetError(
                f"{path}: field 'aux_hidden_state_layer_ids[{i}]': expected a hidden-state "
                f"index in [0, {n}] ({target.label} has {n} layers), found {index}", path=path,
                field=f"aux_hidden_state_layer_ids[{i}]", expected=f"0..{n}", found=index)
    return Check.passed("target.dflash2", f"{target.label}: Qwen3, hidden size "
                        f"{tc.hidden_size}, vocabulary {tc.vocab_size}, hidden states "
                        f"{list(cfg.aux_hidden_state_layer_ids)} of {n + 1}")


# --- model.safetensors ------------------------------------------------------------------------

def planned_tensors(plan: DFlash2Plan, recorded: dict[str, str] | None = None
                    ) -> list[PlannedTensor]:
    """Every tensor of the plan as it is copied, sorted by name (the safetensors library's
    order): BF16 bytes as stored, or F32/F16 rounded to BF16; ``recorded`` (name -> SHA-256
    of the stored bytes, where an artifact records them) checked as they are read."""
    from dspark_convert.runtime.loading import dtype_name

    out = []
    for name in sorted(plan.tensors):
        t = plan.tensors[name]
        stored = STORED_NAMES[dtype_name(t.dtype)]
        sha = None if recorded is None else recorded[name]
        out.append(PlannedTensor(name, tuple(t.shape), 2 * t.numel, Path(t.file), t.offset,
                                 t.nbytes, stored, sha, sha if stored == "BF16" else None,
                                 str(t.file)))
    return out


@dataclass(frozen=True)
class _ReadBack:
    """What write_checkpoint compares: the drafter the directory reads back as."""
    contract: tuple


def _shapes(plan: DFlash2Plan) -> tuple:
    return tuple((n, tuple(t.shape)) for n, t in sorted(plan.tensors.items()))


def _drafter_of(plan: DFlash2Plan) -> tuple:
    return forward_fields(plan.config), _shapes(plan)


def describe(cfg: D.DFlash2Config) -> str:
    layer = cfg.layer
    return (f"{D.ARCHITECTURE} ({layer.num_hidden_layers} layers, block {cfg.block_size}, "
            f"selector top-{cfg.selector_top_k} rank {cfg.selector_rank}), "
            f"sample_from_anchor {str(cfg.sample_from_anchor).lower()}")


# --- the export -------------------------------------------------------------------------------

def export_speculators_dflash2(drafter: str | os.PathLike, target: str | os.PathLike | Target,
                               output: str | os.PathLike, *, force: bool = False,
                               progress: Progress | None = None) -> SpeculatorsDFlash2Result:
    """Write ``output``: the DFlash2 drafter of ``drafter`` as speculators 0.9.0 saves it,
    its verifier ``target`` (a model directory, ``org/name@<commit>``, or an open
    ``target.Target``). Raises a DSparkError subclass for every refusal and writes nothing
    then."""
    from dspark_convert.commands.binding import target_read
    from dspark_convert.runtime.dflash2 import plan_drafter
    from dspark_convert.target.model import Target, open_target

    progress = progress or NoProgress()
    drafter = Path(drafter)
    reads = [(drafter, "the drafter"),
             (target.directory, "the target model") if isinstance(target, Target)
             else target_read(target)]
    [out] = check_outputs([Output(output, "the output")], reads, force=force)
    if (drafter / GGUF_FILE).is_file():
        # An artifact: validated with the target first (the pairing 60-68 and 154, else 100),
        # its tensors checked against manifest.json's hashes as they are copied.
        opened = target if isinstance(target, Target) else open_target(target,
                                                                       progress=progress)
        report = validated_for_export(drafter, opened, progress)
        manifest, _bytes = report.manifest
        plan = plan_drafter(drafter, gguf=report.gguf)
        config_path = str(drafter / MANIFEST_FILE)
        cfg = source_config(manifest, path=config_path)
        pairing = tuple(c for c in report.checks if c.name.startswith("target"))
        recorded = {t.source: t.sha256 for t in manifest.artifact.tensors}
        drafter_sha = report.gguf_sha256
    else:
        plan = plan_drafter(drafter)                 # 150 and the headers' 20-23, no byte read
        cfg, config_path = plan.config, str(plan.directory / CONFIG_FILE)
        opened = target if isinstance(target, Target) else open_target(target,
                                                                       progress=progress)
        pairing = (check_target(cfg, opened, path=config_path),)
        recorded = drafter_sha = None
    verifier = opened.repo if opened.repo is not None else opened.spec
    architectures = list(opened.config.architectures)
    config = S.config_bytes(write_config(cfg, verifier_name=verifier,
                                         verifier_architectures=architectures))
    tensors = planned_tensors(plan, recorded)
    written = write_checkpoint(
        out, force=force, progress=progress, config=config,
        header=safetensors_header([(t.name, t.shape, t.nbytes) for t in tensors],
                                  HEADER_METADATA),
        plan=tensors, engine=ENGINE, source="the same DFlash2 drafter",
        read_back=lambda tmp: _ReadBack(_drafter_of(plan_drafter(tmp))),
        contract=(forward_fields(cfg), _shapes(plan)), manifest_path=Path(config_path))
    bf16 = all(t.source_dtype == "BF16" for t in tensors)
    checks = (*pairing,
              Check.passed("export.tensors", f"{len(tensors)} BF16 tensors under speculators' "
                           "names" + (", each bit-exact" if bf16 else ", rounded to BF16 from "
                                      "the stored F32/F16") + "; no embedding, head, verifier "
                           "head or norm: speculators loads the verifier's"),
              Check.passed("export.config", f"{CONFIG_FILE}: speculators {S.SPECULATORS_VERSION} "
                           f"{D.MODEL_TYPE}, sample_from_anchor "
                           f"{str(cfg.sample_from_anchor).lower()}, "
                           f"{speculative_tokens(cfg)} speculative tokens, verifier "
                           f"{verifier!r} ({', '.join(architectures)}); read back as the same "
                           "drafter"))
    if drafter_sha is None:           # a checkpoint: its weights file, if it is one
        weights = {t.path for t in tensors}
        drafter_sha = sha256_file(next(iter(weights))) if len(weights) == 1 else ""
    return SpeculatorsDFlash2Result(
        output=out.absolute(), engine=ENGINE, drafter=describe(cfg),
        files=tuple(written.values()), tensors=len(tensors), artifact_sha256=drafter_sha,
        verifier=verifier, checks=checks)
