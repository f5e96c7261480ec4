"""manifest.json: the provenance and integrity record of an artifact (pydantic models).

schemas/manifest.schema.json is generated from ``Manifest``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .contract import FeatureContract

MANIFEST_FORMAT = "strata-dspark-artifact"
Sha256 = Field(pattern=r"^[0-9a-f]{64}$")


class _Record(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class ConverterRecord(_Record):
    name: Literal["dspark-convert"]
    version: str


class FileRecord(_Record):
    path: str = Field(description="path relative to the source directory or repository")
    size: int = Field(ge=0)
    sha256: str = Sha256


class StrippedTensor(_Record):
    """A source tensor hashed and left out of drafter.gguf (embedding, head)."""
    name: str
    dtype: str
    shape: list[int]
    sha256: str = Sha256


class SourceRecord(_Record):
    repo: str | None = Field(description="Hub repo id; null for a local directory")
    revision: str = Field(description="40-hex commit, or 'local'")
    name: str = Field(description="general.name: repo id or directory name")
    files: list[FileRecord]
    weights_sha256: str = Field(pattern=r"^[0-9a-f]{64}$",
                                description="dflash.source.sha256")
    dtype: Literal["BF16", "F16", "F32"]
    rounded_to_bf16: bool = Field(description="true when the source was F32/F16 and was rounded")
    stripped: list[StrippedTensor]
    config: dict = Field(description="the source config.json, verbatim")


class TensorRecord(_Record):
    name: str
    type: Literal["BF16"]
    shape: list[int] = Field(description="GGUF order: ne0 (input) first")
    sha256: str = Sha256
    source: str


class ArtifactRecord(_Record):
    file: Literal["drafter.gguf"]
    size: int = Field(ge=0)
    sha256: str = Sha256
    tensors: list[TensorRecord]


class CheckRecord(_Record):
    name: str
    status: Literal["passed", "failed", "warning", "skipped"]
    detail: str


class Manifest(_Record):
    format: Literal["strata-dspark-artifact"]
    format_version: Literal[1]
    converter: ConverterRecord
    source: SourceRecord
    target: None = Field(description="the target's identity; null until a target is given")
    contract: FeatureContract
    artifact: ArtifactRecord
    checks: list[CheckRecord]
