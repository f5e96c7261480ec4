"""A DSpark checkpoint on disk, checked against its contract before any tensor is read.

``open_source`` runs every check that needs only metadata: directory layout, strict
safetensors headers, config.json against the contract, the tensor inventory. Values
(finiteness) and hashes need the bytes and are checked by the converter's first pass.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dspark_convert.contract.families import FAMILIES, Family, family_named, family_of
from dspark_convert.contract.inventory import check_inventory
from dspark_convert.contract import speculators
from dspark_convert.contract.dspark import DSparkConfig, FeatureContract
from dspark_convert.errors import (ConfigError, ContractViolation, DSparkError,
                                   SampleFromAnchorOptionError, SourceNotFoundError,
                                   SpeculatorsTargetError)
from dspark_convert.formats.safetensors import Checkpoint, read_checkpoint
from dspark_convert.artifact.format import check_storable
from dspark_convert.util.patterns import is_repo_id
from dspark_convert.util.strict_json import NotVerbatimError, check_verbatim, read_json_strict
from dspark_convert.util.text import shown

@dataclass(frozen=True)
class SpeculatorsOptions:
    """What reading a speculators-format checkpoint needs beyond it (contract/speculators.py):
    the target's layer count (asked for only when the source is one: it opens the target),
    the block layout the user stated (--sample-from-anchor), if any, and what the refusal of
    a speculators source without a target (36) advises: the reader's way to give one (a
    refusal never names an option its command lacks)."""
    target_layers: Callable[[], int | None] = lambda: None
    sample_from_anchor: bool | None = None
    without_target: str = "convert it with --target (the target model)"


# dspark inspect reads no target: it says where the contract is shown.
INSPECT_WITHOUT_TARGET = ("inspect reads no target: convert it (`dspark convert DIR --target "
                          "TARGET`) and inspect the artifact it writes")


@dataclass(frozen=True)
class SpeculatorsSource:
    """A source in speculators' format: how it was read, and its config.json verbatim (the
    Source's raw_config is then its DeepSpec twin's, which the contract was built from)."""
    reading: speculators.Reading
    config: dict


@dataclass(frozen=True)
class Source:
    directory: Path
    raw_config: dict
    config: DSparkConfig
    contract: FeatureContract
    checkpoint: Checkpoint
    dtype: str                  # the common source dtype: BF16, F16 or F32
    speculators: SpeculatorsSource | None = field(default=None)
    # The family's companion file (contract/families.py: the assistant's
    # generation_config.json), parsed, and its path; None where there is none.
    companion: dict | None = field(default=None)
    companion_path: Path | None = field(default=None)

    @property
    def name(self) -> str:
        # general.name: the directory's own name, also when given as "." or "dir/"; a name
        # that is not UTF-8 or holds control characters is recorded escaped (text.shown):
        # a GGUF string and manifest.json hold UTF-8 text only.
        return shown(Path(os.path.abspath(self.directory)).name)


def read_contract(directory: Path) -> tuple[dict, Family, object, object]:
    """config.json read strictly by the reader of the family its ``architectures`` names
    (contract/families.py), and the contract the family's rules derive: (raw, family,
    config, contract). Every family; ``dspark inspect`` shows what it returns. A
    speculators-format config needs the target (read_source): refused (36)."""
    raw, family, cfg, contract, _ = read_source(
        directory, SpeculatorsOptions(without_target=INSPECT_WITHOUT_TARGET))
    return raw, family, cfg, contract


def _as_speculators_field(exc: DSparkError, path: str) -> DSparkError:
    """A refusal of the twin's config, naming the speculators field it was read from."""
    if exc.field is None:
        return exc
    theirs = speculators.speculators_field(exc.field)
    message = exc.message.replace(f"field '{exc.field}'",
                                  f"field '{theirs}' (DeepSpec's '{exc.field}')", 1)
    if message == exc.message:
        message = f"{path}: field '{theirs}' (DeepSpec's '{exc.field}'): {exc.message}"
    return type(exc)(message, path=exc.path, field=theirs, tensor=exc.tensor,
                     expected=exc.expected, found=exc.found)


def read_source(directory: Path, options: SpeculatorsOptions | None = None
                ) -> tuple[dict, Family, object, object, SpeculatorsSource | None]:
    """read_contract's (raw, family, config, contract), and how a speculators-format
    config.json was read (None for DeepSpec's): its DeepSpec twin's config is then ``raw``,
    and its refusals name speculators' fields."""
    options = options or SpeculatorsOptions()
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise SourceNotFoundError(f"{directory}: config.json not found", path=str(config_path),
                                  expected="config.json", found="missing")
    # Messages name the file as the user gave it, so that one among many is found.
    raw = read_json_strict(config_path, error=ConfigError, label=str(config_path))
    # The manifest keeps the config verbatim (source.config): refuse what JSON lets through
    # but could not be written back unchanged, before anything is written.
    try:
        check_verbatim(raw)
    except NotVerbatimError as exc:
        raise ConfigError(f"{config_path}: field '{exc.where}': {exc.why}; expected JSON that "
                          "manifest.json can keep verbatim", path=str(config_path),
                          field=exc.where, expected="verbatim JSON", found=exc.why) from None
    label = str(config_path)
    spec = None
    # A family of its own reader (speculators' DFlash2 included): no DeepSpec twin.
    own = _own_family(raw)
    if own is not None:
        if options.sample_from_anchor is not None:
            raise SampleFromAnchorOptionError(
                f"{speculators.STATED_LAYOUT}: {label} is a {own.architecture} config, which "
                "states its own block layout; expected a stated layout only for a "
                "speculators-format DSpark or DFlash checkpoint without sample_from_anchor",
                path=label, field="sample_from_anchor", expected="no option", found="given")
        companion = read_companion(directory, own)
        cfg = own.parse(raw, path=label, companion=companion,
                        companion_path=str(directory / own.companion_file)
                        if own.companion_file else None)
        contract = own.build_contract(cfg, path=label)
        check_storable(contract, path=label)
        return raw, own, cfg, contract, spec
    if speculators.is_speculators_config(raw):
        layers = options.target_layers()
        if layers is None:
            raise SpeculatorsTargetError(
                f"{label}: a speculators-format checkpoint (speculators_model_type "
                f"{shown(speculators.quoted_value(raw[speculators.MODEL_TYPE_FIELD]))}): it "
                f"holds no embedding and records no target layer count; "
                f"{options.without_target}",
                path=label, field="speculators_model_type", expected="--target",
                found="no target")
        reading = speculators.read_config(raw, path=label, num_target_layers=layers,
                                          sample_from_anchor=options.sample_from_anchor)
        spec = SpeculatorsSource(reading=reading, config=raw)
        raw = reading.twin
    elif options.sample_from_anchor is not None:
        raise SampleFromAnchorOptionError(
            f"{speculators.STATED_LAYOUT}: {label} is DeepSpec's config (no "
            "speculators_model_type), whose block layout is anchor first; expected a stated "
            "layout only for a speculators-format checkpoint without sample_from_anchor",
            path=label,
            field="sample_from_anchor", expected="no option", found="given")
    try:
        family = family_of(raw, path=label)
        cfg = family.parse_config(raw, path=label)
        contract = family.build_contract(cfg, path=label)
        # Every value the metadata will hold, against its GGUF type (u32, f32 ...).
        check_storable(contract, path=label)
    except ContractViolation as exc:
        if spec is None:
            raise
        raise _as_speculators_field(exc, label) from None
    return raw, family, cfg, contract, spec


def _own_family(raw: object) -> Family | None:
    """The family config.json's ``architectures`` names when it is one whose reader reads
    the checkpoint as it is (kind other than DSpark: DFlash2, the assistant), else None."""
    archs = raw.get("architectures") if isinstance(raw, dict) else None
    if isinstance(archs, list) and len(archs) == 1 and isinstance(archs[0], str):
        family = FAMILIES.get(archs[0])
        if family is not None and family.kind != "dspark":
            return family
    return None


def read_companion(directory: Path, family: Family) -> dict | None:
    """The family's companion file of ``directory`` (strict JSON), or None when the family
    has none or the checkpoint lacks it (the reader's default applies then)."""
    if family.companion_file is None:
        return None
    path = directory / family.companion_file
    if not path.is_file():
        return None
    raw = read_json_strict(path, error=ConfigError, label=str(path))
    try:
        check_verbatim(raw)
    except NotVerbatimError as exc:
        raise ConfigError(f"{path}: field '{exc.where}': {exc.why}; expected JSON that "
                          "manifest.json can keep verbatim", path=str(path),
                          field=exc.where, expected="verbatim JSON", found=exc.why) from None
    return raw


def load_config(directory: Path) -> tuple[dict, DSparkConfig, FeatureContract]:
    """read_contract's config and contract: (raw, config, contract)."""
    raw, _family, cfg, contract = read_contract(directory)
    return raw, cfg, contract


def check_checkpoint_inventory(checkpoint: Checkpoint, cfg: DSparkConfig,
                               contract: FeatureContract) -> str:
    """The checkpoint's tensors against the contract (contract.check_inventory), named after
    the index or weights file; returns the common source dtype."""
    label = str(checkpoint.files.index or checkpoint.files.weights[0])
    tensors = {name: (entry.dtype, list(entry.shape)) for name, entry in checkpoint.tensors.items()}
    family = family_named(contract.family)
    family.check_tensors(contract, set(tensors), path=label)
    return check_inventory(contract, tensors, path=label,
                           expected_dtype=family.config_dtype(
                               cfg, path=str(checkpoint.files.config)))


# What a converted artifact directory holds (artifact/format.py's names), told apart from a
# checkpoint in a refusal.
_ARTIFACT_FILES = ("drafter.gguf", "manifest.json")
_CHECKPOINT = "a checkpoint directory (config.json + safetensors weights)"


def source_path_error(path: str | os.PathLike, *, expected: str = _CHECKPOINT,
                      hub: bool = True) -> SourceNotFoundError | None:
    """The refusal of a path that cannot be a checkpoint directory, saying what was given
    and what is expected (None when it may be one): nothing there (an ``org/name`` that
    looks like a Hub repo is told the pinned form), a file (a GGUF file is already
    converted; a config.json or weights file is told its directory), or an artifact.
    ``expected``: what the command takes, in words (inspect takes more than a checkpoint);
    ``hub``: whether the command takes a Hub spec too."""
    text = os.fspath(path)
    directory = Path(text)
    if not directory.exists():
        if "@" in text and "/" in text:
            hint = "a Hub source is written org/name@<40-hex commit>"
        elif is_repo_id(text.rstrip("/")) and hub:
            repo = text.rstrip("/")
            hint = (f"a Hub checkpoint is pinned: {repo}@<40-hex commit> (or {repo}@<branch> "
                    "with --resolve)")
        elif is_repo_id(text.rstrip("/")):
            hint = (f"expected {expected}, a local path (a Hub checkpoint is converted pinned: "
                    "`dspark convert org/name@<40-hex commit> -o DIR`)")
        else:
            hint = f"expected {expected}"
        return SourceNotFoundError(f"{shown(text)}: no such directory; {hint}", path=text,
                                   expected="a checkpoint directory", found="missing")
    if not directory.is_dir():
        name = directory.name.lower()
        if name.endswith(".gguf"):
            return SourceNotFoundError(
                f"{shown(text)}: a GGUF file, already converted; expected {expected} "
                "(`dspark validate` and `dspark inspect` take a GGUF file)", path=text,
                expected="a checkpoint directory", found="a GGUF file")
        elif name == "config.json" or name.endswith((".safetensors", ".safetensors.index.json")):
            hint = f"expected {expected}: the directory holding it, {shown(directory.parent)}"
        else:
            hint = f"expected {expected}"
        return SourceNotFoundError(f"{shown(text)}: a file, not a directory; {hint}", path=text,
                                   expected="a checkpoint directory", found="a file")
    if directory.is_dir() and not (directory / "config.json").exists() \
            and any((directory / name).exists() for name in _ARTIFACT_FILES):
        return SourceNotFoundError(
            f"{shown(text)}: an artifact (drafter.gguf, manifest.json), already converted; "
            f"expected {_CHECKPOINT}: validate, inspect, smoke, eval, quantize and export take "
            "an artifact", path=text, expected="a checkpoint directory", found="an artifact")
    return None


def open_source(path: str | os.PathLike, options: SpeculatorsOptions | None = None) -> Source:
    """A checkpoint checked against its contract: DeepSpec's, or speculators' format read as
    its DeepSpec twin (``options``: contract/speculators.py)."""
    directory = Path(path)
    problem = source_path_error(path)
    if problem is not None:
        raise problem
    checkpoint = read_checkpoint(directory)
    raw, _family, cfg, contract, spec = read_source(directory, options)
    if spec is not None:
        label = str(checkpoint.files.index or checkpoint.files.weights[0])
        problem = speculators.vocabulary_map_error(label, set(checkpoint.tensors))
        if problem is not None:
            raise problem
    dtype = check_checkpoint_inventory(checkpoint, cfg, contract)
    family = family_named(contract.family)
    companion = read_companion(directory, family)
    return Source(directory=directory, raw_config=raw, config=cfg, contract=contract,
                  checkpoint=checkpoint, dtype=dtype, speculators=spec, companion=companion,
                  companion_path=None if companion is None
                  else directory / family.companion_file)
