"""A DSpark checkpoint on disk, checked against its contract before any tensor is read.

``open_source`` runs every check that needs only metadata: directory layout, strict
safetensors headers, config.json against the contract, the tensor inventory. Values
(finiteness) and hashes need the bytes and are checked by the converter's first pass.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from dspark_convert.contract.families import Family, family_named, family_of
from dspark_convert.contract.inventory import check_inventory
from dspark_convert.contract.dspark import DSparkConfig, FeatureContract, config_dtype
from dspark_convert.errors import ConfigError, SourceNotFoundError
from dspark_convert.formats.safetensors import Checkpoint, read_checkpoint
from dspark_convert.artifact.format import check_storable
from dspark_convert.util.strict_json import NotVerbatimError, check_verbatim, read_json_strict
from dspark_convert.util.text import shown

@dataclass(frozen=True)
class Source:
    directory: Path
    raw_config: dict
    config: DSparkConfig
    contract: FeatureContract
    checkpoint: Checkpoint
    dtype: str                  # the common source dtype: BF16, F16 or F32

    @property
    def name(self) -> str:
        # general.name: the directory's own name, also when given as "." or "dir/"; a name
        # that is not UTF-8 or holds control characters is recorded escaped (text.shown):
        # a GGUF string and manifest.json hold UTF-8 text only.
        return shown(Path(os.path.abspath(self.directory)).name)


def read_contract(directory: Path) -> tuple[dict, Family, object, object]:
    """config.json read strictly by the reader of the family its ``architectures`` names
    (contract/families.py), and the contract the family's rules derive: (raw, family,
    config, contract). Every family; ``dspark inspect`` shows what it returns."""
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
    family = family_of(raw, path=str(config_path))
    cfg = family.parse_config(raw, path=str(config_path))
    contract = family.build_contract(cfg, path=str(config_path))
    # Every value the metadata will hold, against its GGUF type (u32, f32 ...).
    check_storable(contract, path=str(config_path))
    return raw, family, cfg, contract


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
    family_named(contract.family).check_tensors(contract, set(tensors), path=label)
    return check_inventory(contract, tensors, path=label,
                           expected_dtype=config_dtype(cfg, path=str(checkpoint.files.config)))


def open_source(path: str | os.PathLike) -> Source:
    directory = Path(path)
    if not directory.exists():
        hint = ""
        if "@" in str(path) and "/" in str(path):
            hint = " (a Hub source is written org/name@<40-hex commit>)"
        raise SourceNotFoundError(f"{path}: no such directory{hint}", path=str(path),
                                  expected="a checkpoint directory", found="missing")
    checkpoint = read_checkpoint(directory)
    raw, cfg, contract = load_config(directory)
    dtype = check_checkpoint_inventory(checkpoint, cfg, contract)
    return Source(directory=directory, raw_config=raw, config=cfg, contract=contract,
                  checkpoint=checkpoint, dtype=dtype)
