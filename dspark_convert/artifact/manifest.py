"""manifest.json: the provenance and integrity record of an artifact (pydantic models).

schemas/manifest.schema.json is generated from ``Manifest``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer

from dspark_convert.artifact.engine_names import EngineName
from dspark_convert.checks import Check
from dspark_convert.contract.families import BY_NAME as FAMILIES_BY_NAME, AnyContract
from dspark_convert.errors import ManifestError
from dspark_convert.util.models import exact_versions, validated
from dspark_convert.util.patterns import COMMIT_PATTERN, SHA256_PATTERN
from dspark_convert.util.strict_json import (
    NotVerbatimError,
    check_verbatim,
    parse_json_strict,
    read_json_strict,
)

MANIFEST_FORMAT = "strata-dspark-artifact"
# The contract's family names: the tags of its union, never part of a field's name.
FAMILY_NAMES = tuple(FAMILIES_BY_NAME)
Sha256 = Field(pattern=SHA256_PATTERN)


#: The artifact's format version, the one its drafter.gguf's dspark.format_version holds
#: (artifact/format.FORMAT_VERSIONS: 1 for Qwen3, 2 for a drafter family such as Gemma4,
#: 3 for DFlash2, 4 for the Gemma 4 assistant);
#: validate refuses a manifest whose version is not its file's (49).
FormatVersion = exact_versions(1, 2, 3, 4)


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


# What a Hub file's SHA-256 was checked against (source/hub/verify.py makes the checks).
Verification = Literal["hub-lfs-sha256", "hub-git-blob-sha1", "cache-blob-sha256",
                       "cache-blob-sha1", "lock", "pin"]


class HubFileRecord(_Record):
    """One file of a Hub snapshot: its size and SHA-256 as computed by the converter, and
    what that hash was checked against."""
    path: str = Field(description="path inside the repository")
    size: int = Field(ge=0)
    sha256: str = Sha256
    verified_against: list[Verification] = Field(
        description="hub-*: the Hub's metadata (LFS SHA-256 or git blob SHA-1); cache-blob-*: "
                    "the HF cache's content address (offline); lock: the lock file; pin: --sha256")


class HubRecord(_Record):
    """Where a Hub source came from and what its bytes were verified against."""
    repo: str
    requested_revision: str = Field(description="the revision as given: the commit, or the "
                                    "branch/tag resolved with --resolve")
    commit: str = Field(pattern=COMMIT_PATTERN)
    resolved: bool = Field(description="true when a branch or tag was resolved to the commit")
    offline: bool = Field(description="true when served from the local cache (HF_HUB_OFFLINE)")
    endpoint: str | None = Field(description="the Hub endpoint asked; null when offline")
    lock_sha256: str | None = Field(pattern=SHA256_PATTERN,
                                    description="SHA-256 of the lock file checked against")
    files: list[HubFileRecord]


class SpeculatorsRecord(_Record):
    """A source in vllm-project/speculators' format (docs/SPECULATORS.md), converted as its
    DeepSpec twin: source.config then holds the twin's config.json, this the file as it was."""
    format: Literal["speculators"]
    version: str = Field(description="the speculators release whose format was read")
    model_type: Literal["dspark", "dflash"] = Field(description="speculators_model_type")
    sample_from_anchor: Literal[True] = Field(description="the block layout: anchor first")
    layout_stated_by: Literal["config", "option"] = Field(
        description="config.json's sample_from_anchor, or --sample-from-anchor for a config "
        "without it")
    config: dict = Field(description="the source config.json, verbatim")


class SourceRecord(_Record):
    repo: str | None = Field(description="Hub repo id; null for a local directory")
    revision: str = Field(description="40-hex commit, or 'local'")
    name: str = Field(description="general.name: repo id or directory name")
    files: list[FileRecord]
    weights_sha256: str = Field(pattern=SHA256_PATTERN,
                                description="dflash.source.sha256")
    dtype: Literal["BF16", "F16", "F32"]
    rounded_to_bf16: bool = Field(description="true when the source was F32/F16 and was rounded")
    stripped: list[StrippedTensor]
    config: dict = Field(description="the source config.json, verbatim")
    hub: HubRecord | None = Field(default=None, description="Hub sources: the commit and what "
                                  "each file was verified against; absent for a local directory")
    speculators: SpeculatorsRecord | None = Field(
        default=None, description="a speculators-format source: how it was read, its "
        "config.json verbatim (config is then its DeepSpec twin's); absent for DeepSpec's")

    companion: dict | None = Field(
        default=None, description="the family's companion file, verbatim (the Gemma 4 "
        "assistant's generation_config.json: its drafts per cycle); absent where none was read")

    @model_serializer(mode="wrap")
    def _omit_absent_hub(self, handler):
        # A local source's manifest keeps the bytes it had before Hub sources existed (and a
        # DeepSpec source's, before speculators-format sources).
        data = handler(self)
        for key in ("hub", "speculators", "companion"):
            if data.get(key) is None:
                data.pop(key, None)
        return data


QuantType = Literal["Q8_0", "Q5_0", "Q4_0"]


class QuantErrorRecord(_Record):
    """A quantized tensor's error against the BF16 values it was made from."""
    max_abs: float = Field(ge=0, description="max |quantized - bf16|")
    rel_rms: float = Field(ge=0, description="sqrt(sum (quantized - bf16)^2 / sum bf16^2)")


class TensorRecord(_Record):
    name: str
    type: Literal["BF16", "Q8_0", "Q5_0", "Q4_0"]
    shape: list[int] = Field(description="GGUF order: ne0 (input) first")
    sha256: str = Sha256
    source: str
    error: QuantErrorRecord | None = Field(default=None, description="quantized artifacts: "
                                           "the error of a quantized tensor against the "
                                           "parent's BF16 values; absent for a BF16 tensor")

    @model_serializer(mode="wrap")
    def _omit_absent_error(self, handler):
        # A BF16 artifact's manifest keeps the bytes it had before quantization existed.
        data = handler(self)
        if data.get("error") is None:
            data.pop("error", None)
        return data


class ArtifactRecord(_Record):
    file: Literal["drafter.gguf"]
    size: int = Field(ge=0)
    sha256: str = Sha256
    tensors: list[TensorRecord]


class TargetConfigRecord(_Record):
    """The target config.json fields the pairing checks read."""
    architectures: list[str]
    model_type: str
    hidden_size: int
    vocab_size: int
    num_hidden_layers: int
    rope_theta: float
    rms_norm_eps: float
    tie_word_embeddings: bool


class TargetTensorRecord(_Record):
    """A target tensor read once, by itself, to be hashed (never copied)."""
    role: Literal["embedding", "head"]
    name: str = Field(description="the target's tensor; the embedding's for a tied head")
    dtype: str
    shape: list[int]
    sha256: str = Sha256


class SpecialTokenRecord(_Record):
    id: int
    content: str


class TokenizerRecord(_Record):
    """The fingerprint of the target's tokenizer.json."""
    file: Literal["tokenizer.json"]
    size: int = Field(ge=0)
    sha256: str = Sha256
    vocab_size: int = Field(description="tokens, added tokens included")
    max_token_id: int
    special_tokens: list[SpecialTokenRecord] = Field(description="added tokens marked special")
    probe_text: str
    probe_ids: list[int] = Field(description="probe_text encoded without special tokens")


class TargetRecord(_Record):
    """The target a drafter was checked against (docs/ARTIFACT_FORMAT.md, manifest.json)."""
    repo: str | None = Field(description="Hub repo id; null for a local directory")
    revision: str = Field(description="40-hex commit, or 'local'")
    path: str | None = Field(description="the local directory as given; null for a Hub target")
    files: list[FileRecord] = Field(description="the small files read whole and hashed")
    config: TargetConfigRecord
    tensors: list[TargetTensorRecord]
    tokenizer: TokenizerRecord
    checks: list[Check]


class ParentRecord(_Record):
    """The BF16 artifact a quantized artifact was made from (`dspark quantize`)."""
    files: list[FileRecord] = Field(description="the parent's drafter.gguf and manifest.json")
    converter: str = Field(description="the parent's dspark.converter, which the quantized "
                           "drafter.gguf keeps with every other key of the parent (converter "
                           "names the version that quantized it)")


class QuantizationRecord(_Record):
    """How a quantized artifact was made (docs/ARTIFACT_FORMAT.md, Quantized artifacts)."""
    type: QuantType = Field(description="strata.dflash.quantization: the type of the 2-D "
                            "backbone matrices (fc, blk.N.*)")
    heads: QuantType | None = Field(description="the type of the Markov and confidence "
                                    "matrices; null: kept BF16")
    tool: str = Field(description="the quantizer: gguf-py's gguf.quants.quantize, from the "
                      "BF16 values widened to float32")




class EngineRecord(_Record):
    """Whether one consumer accepts the artifact, and if not the first reason in its own
    terms (docs/ENGINES.md; artifact/engines.py)."""
    accepts: bool
    reason: str | None = Field(description="the engine's first refusal; null when it accepts")


class Manifest(_Record):
    format: Literal["strata-dspark-artifact"]
    format_version: FormatVersion = Field(
        description="the format version drafter.gguf's dspark.format_version holds: 1 for a "
        "Qwen3 drafter, 2 for a drafter family (Gemma4), 3 for DFlash2, 4 for the Gemma 4 "
        "assistant; docs/ARTIFACT_FORMAT.md")
    converter: ConverterRecord
    source: SourceRecord
    target: TargetRecord | None = Field(description="the target the drafter was checked "
                                        "against; null when none was given")
    contract: AnyContract
    artifact: ArtifactRecord
    checks: list[Check]
    engines: dict[EngineName, EngineRecord] = Field(
        description="strata.open, strata.run and llama.cpp: whether each accepts the "
        "artifact (docs/ENGINES.md); validate re-derives them from drafter.gguf")
    parent: ParentRecord | None = Field(default=None, description="quantized artifacts: the "
                                        "BF16 parent; absent for a converted artifact")
    quantization: QuantizationRecord | None = Field(default=None, description="quantized "
                                                    "artifacts: type and tool; absent otherwise")

    @model_serializer(mode="wrap")
    def _omit_absent_quantization(self, handler):
        # A converted (BF16) artifact's manifest keeps the bytes it had before quantized
        # artifacts existed (tests/test_golden.py checks their hashes).
        data = handler(self)
        for key in ("parent", "quantization"):
            if data.get(key) is None:
                data.pop(key, None)
        return data


# The one reader of a manifest.json (validate, quantize): strict JSON, then the model; every
# refusal is one ManifestError line naming the file.
def read_manifest(path: Path) -> Manifest:
    raw = read_json_strict(path, error=ManifestError, label="manifest.json")
    return _validated(raw, path)


def parse_manifest(data: bytes, path: Path) -> Manifest:
    """``read_manifest`` of bytes already read (quantize hashes the parent's manifest too)."""
    raw = parse_json_strict(data, error=ManifestError, label="manifest.json", path=str(path))
    return _validated(raw, path)


def _validated(raw: object, path: Path) -> Manifest:
    """The manifest model of a parsed manifest.json. First, what JSON parses but no writer
    can write back (util/strict_json.check_verbatim): a string holding a lone UTF-16
    surrogate escape (``"\\ud800"``) passed the schema, then broke the writer that copies
    it (quantize's manifest) with an exception; it is refused here, for every reader."""
    try:
        check_verbatim(raw)
    except NotVerbatimError as exc:
        raise ManifestError(f"manifest.json: field '{exc.where}': {exc.why}; expected JSON "
                            "that can be written back unchanged", path=str(path),
                            field=exc.where) from None
    return validated(Manifest, raw, error=ManifestError, label="manifest.json", path=str(path),
                     tags=FAMILY_NAMES)
