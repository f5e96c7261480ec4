"""A DFlash2 or Gemma 4 assistant artifact planned for loading, from drafter.gguf alone.

``runtime.dflash2.plan_drafter`` and ``runtime.gemma4_assistant.plan_assistant`` take an
artifact directory (``drafter.gguf`` + ``manifest.json``, docs/ARTIFACT_FORMAT.md) as well as
a source checkpoint; this is their artifact side. The header is parsed by the bounded GGUF
reader, the metadata held to the format and the contract rebuilt from it (the code ``dspark
validate`` runs: artifact/format.py), the tensors checked against that contract (names, the
format's order, BF16, shapes: contract/inventory.py) without reading a tensor byte, and each
tensor located by its source name: the same StoredTensor a source plan holds, so the loaders
and the forward never know which they were given. A full check (hashes, values, the target)
is ``dspark validate``'s, which ``commands/binding.bind`` runs first.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from dspark_convert.artifact.format import (GGUF_FILE, contract_from_metadata, metadata_family,
                                            read_metadata)
from dspark_convert.contract.inventory import check_gguf_inventory
from dspark_convert.errors import ArtifactKindError, GGUFFormatError
from dspark_convert.formats.gguf_reader import GGUFFile, read_gguf
from dspark_convert.runtime.loading import StoredTensor


@dataclass(frozen=True)
class ArtifactTensors:
    """An artifact's metadata, its rebuilt contract and its tensors by source name."""

    path: Path                          # drafter.gguf
    metadata: dict
    contract: object
    tensors: dict[str, StoredTensor]


def is_artifact(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an artifact directory (it holds drafter.gguf) rather than a
    source checkpoint (config.json + safetensors)."""
    return (Path(path) / GGUF_FILE).is_file()


def open_artifact(path: str | os.PathLike, family: str, *,
                  gguf: GGUFFile | None = None) -> ArtifactTensors:
    """``path/drafter.gguf`` (or ``gguf``, the file as validate parsed it) of the drafter
    family ``family``; ArtifactKindError (156) for an artifact of another family."""
    gguf_path = Path(path) / GGUF_FILE
    label = str(gguf_path)
    gguf = gguf if gguf is not None else read_gguf(gguf_path)
    kv = read_metadata(gguf, path=label)
    found = metadata_family(kv, path=label)
    if found.name != family:
        raise ArtifactKindError(
            f"{label}: a {found.name} artifact ({found.architecture}); expected a {family} "
            "artifact for this loader", path=label, field="dspark.family", expected=family,
            found=found.name)
    contract = contract_from_metadata(kv, path=label)
    check_gguf_inventory(gguf, contract, label)
    infos = {t.name: t for t in gguf.tensors}
    tensors = {}
    for spec in contract.written_tensors:
        info = infos[spec.gguf_name]          # the inventory check proved it is there
        tensors[spec.source_name] = StoredTensor(
            name=spec.gguf_name, file=gguf_path, offset=info.data_offset, nbytes=info.nbytes,
            dtype=torch.bfloat16, shape=tuple(spec.shape))
    return ArtifactTensors(path=gguf_path, metadata=kv, contract=contract, tensors=tensors)


def artifact_truncated(spec: StoredTensor) -> GGUFFormatError:
    """A drafter.gguf shorter than its header said while it was loaded (it changed)."""
    return GGUFFormatError(f"{spec.file}: tensor {spec.name!r} is truncated: the file is "
                           "shorter than its header says (it changed while being read)",
                           path=str(spec.file), tensor=spec.name)
