"""The GGUF metadata of a Strata DSpark artifact (format version 1), as data.

``METADATA_KEYS`` lists every key, its exact GGUF type, when it is present and what it
holds. The writer emits keys in this order from ``expected_metadata``; the validator checks
a file against the same function; the docs are generated from the table.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Literal

from gguf.constants import GGUFValueType

from . import CONVERTER_NAME, __version__
from .contract import (
    ARCHITECTURE,
    FAMILY,
    Attention,
    BlockLayout,
    ConfidenceHead,
    FeatureContract,
    FeatureTaps,
    Geometry,
    MarkovHead,
    contract_with_tensors,
)
from .errors import MetadataError

FORMAT_VERSION = 1
ARCHITECTURE_NAME = "dflash"
ALIGNMENT = 32
GGUF_FILE = "drafter.gguf"
MANIFEST_FILE = "manifest.json"
LOCAL_REVISION = "local"

When = Literal["always", "hub", "markov", "confidence", "embed", "lm_head"]

T = GGUFValueType


@dataclass(frozen=True)
class MetadataKey:
    key: str
    type: GGUFValueType
    doc: str
    when: When = "always"
    sub_type: GGUFValueType | None = None


METADATA_KEYS: tuple[MetadataKey, ...] = (
    MetadataKey("general.architecture", T.STRING, "`dflash`"),
    MetadataKey("general.alignment", T.UINT32, "32"),
    MetadataKey("general.name", T.STRING, "source repo id or directory name"),
    MetadataKey("general.source.huggingface.repository", T.STRING, "source repo id", "hub"),
    MetadataKey("dflash.embedding_length", T.UINT32, "hidden_size"),
    MetadataKey("dflash.block_count", T.UINT32, "draft num_hidden_layers"),
    MetadataKey("dflash.attention.head_count", T.UINT32, "num_attention_heads"),
    MetadataKey("dflash.attention.head_count_kv", T.UINT32, "num_key_value_heads"),
    MetadataKey("dflash.attention.key_length", T.UINT32, "head_dim"),
    MetadataKey("dflash.feed_forward_length", T.UINT32, "intermediate_size"),
    MetadataKey("dflash.vocab_size", T.UINT32, "vocab_size"),
    MetadataKey("dflash.block_size", T.UINT32, "block_size"),
    MetadataKey("dflash.mask_token_id", T.UINT32, "mask_token_id"),
    MetadataKey("dflash.target_layers", T.ARRAY, "DeepSpec target_layer_ids unchanged",
                sub_type=T.UINT32),
    MetadataKey("dflash.rope.frequency_base", T.FLOAT64, "rope theta"),
    MetadataKey("dflash.attention.layer_norm_rms_epsilon", T.FLOAT32, "rms_norm_eps"),
    MetadataKey("dflash.sample_from_anchor", T.STRING, "`true`"),
    MetadataKey("dflash.attention.causal", T.STRING, "`false`"),
    MetadataKey("dflash.markov_rank", T.UINT32, "markov_rank (0: plain DFlash)"),
    MetadataKey("dflash.markov_head_type", T.STRING, "`vanilla`, `gated` or `rnn`", "markov"),
    MetadataKey("dflash.has_confidence_head", T.STRING, "`true` / `false`"),
    MetadataKey("dflash.confidence_head_with_markov", T.STRING, "`true` / `false`", "confidence"),
    MetadataKey("dflash.target.num_layers", T.UINT32, "num_target_layers"),
    MetadataKey("dflash.target.embed_sha256", T.STRING,
                "SHA-256 of the source `embed_tokens.weight` bytes", "embed"),
    MetadataKey("dflash.target.lm_head_sha256", T.STRING,
                "SHA-256 of the source `lm_head.weight` bytes", "lm_head"),
    MetadataKey("dflash.source.revision", T.STRING, "40-hex commit, or `local`"),
    MetadataKey("dflash.source.sha256", T.STRING,
                "SHA-256 of the weights file (sharded: of the sorted `\"<file> <sha256>\\n\"` lines)"),
    MetadataKey("dspark.format_version", T.UINT32, "1"),
    MetadataKey("dspark.converter", T.STRING, "`dspark-convert <version>`"),
)
KEYS_BY_NAME = {k.key: k for k in METADATA_KEYS}


@dataclass(frozen=True)
class Provenance:
    """What the metadata says about where the weights came from."""

    name: str
    repository: str | None
    revision: str
    source_sha256: str
    embed_sha256: str | None
    lm_head_sha256: str | None
    converter: str = f"{CONVERTER_NAME} {__version__}"


def _flag(value: bool) -> str:
    return "true" if value else "false"


def _applies(key: MetadataKey, contract: FeatureContract, prov: Provenance) -> bool:
    return {
        "always": True,
        "hub": prov.repository is not None,
        "markov": contract.markov_head.rank > 0,
        "confidence": contract.confidence_head.enabled,
        "embed": prov.embed_sha256 is not None,
        "lm_head": prov.lm_head_sha256 is not None,
    }[key.when]


def expected_metadata(contract: FeatureContract, prov: Provenance) -> dict[str, object]:
    """Every key's value, in file order, for a contract and its provenance."""
    g = contract.geometry
    values: dict[str, object] = {
        "general.architecture": ARCHITECTURE_NAME,
        "general.alignment": ALIGNMENT,
        "general.name": prov.name,
        "general.source.huggingface.repository": prov.repository,
        "dflash.embedding_length": g.hidden_size,
        "dflash.block_count": g.num_draft_layers,
        "dflash.attention.head_count": g.num_attention_heads,
        "dflash.attention.head_count_kv": g.num_key_value_heads,
        "dflash.attention.key_length": g.head_dim,
        "dflash.feed_forward_length": g.intermediate_size,
        "dflash.vocab_size": g.vocab_size,
        "dflash.block_size": contract.block.block_size,
        "dflash.mask_token_id": contract.block.mask_token_id,
        "dflash.target_layers": list(contract.taps.target_layer_ids),
        "dflash.rope.frequency_base": g.rope_theta,
        "dflash.attention.layer_norm_rms_epsilon": g.rms_norm_eps,
        "dflash.sample_from_anchor": _flag(contract.block.anchor_first),
        "dflash.attention.causal": _flag(contract.attention.causal),
        "dflash.markov_rank": contract.markov_head.rank,
        "dflash.markov_head_type": contract.markov_head.type,
        "dflash.has_confidence_head": _flag(contract.confidence_head.enabled),
        "dflash.confidence_head_with_markov": _flag(contract.confidence_head.with_markov),
        "dflash.target.num_layers": contract.taps.num_target_layers,
        "dflash.target.embed_sha256": prov.embed_sha256,
        "dflash.target.lm_head_sha256": prov.lm_head_sha256,
        "dflash.source.revision": prov.revision,
        "dflash.source.sha256": prov.source_sha256,
        "dspark.format_version": FORMAT_VERSION,
        "dspark.converter": prov.converter,
    }
    return {k.key: values[k.key] for k in METADATA_KEYS if _applies(k, contract, prov)}


def as_float32(value: float) -> float:
    """The value a FLOAT32 key holds once written (for comparisons with what is read)."""
    return struct.unpack("<f", struct.pack("<f", value))[0]


# --- reading metadata back ----------------------------------------------------------------

def _get(kv: dict, key: str, path: str):
    if key not in kv:
        raise MetadataError(f"{path}: metadata key '{key}' is missing", path=path, field=key,
                            expected=KEYS_BY_NAME[key].type.name, found="missing")
    return kv[key]


def _flag_value(kv: dict, key: str, path: str) -> bool:
    value = _get(kv, key, path)
    if value not in ("true", "false"):
        raise MetadataError(f"{path}: metadata key '{key}': expected 'true' or 'false', found {value!r}",
                            path=path, field=key, expected="true|false", found=str(value))
    return value == "true"


def contract_from_metadata(kv: dict[str, object], *, path: str) -> FeatureContract:
    """Rebuild the feature contract from metadata values (types already checked).

    rms_norm_eps comes back as the FLOAT32 value the file holds.
    """
    def num(key: str) -> int:
        return _get(kv, key, path)

    markov_rank = num("dflash.markov_rank")
    markov_type = _get(kv, "dflash.markov_head_type", path) if markov_rank > 0 else "none"
    if markov_type not in ("none", "vanilla", "gated", "rnn"):
        raise MetadataError(f"{path}: metadata key 'dflash.markov_head_type': expected vanilla, "
                            f"gated or rnn, found {markov_type!r}", path=path,
                            field="dflash.markov_head_type", expected="vanilla|gated|rnn",
                            found=markov_type)
    has_conf = _flag_value(kv, "dflash.has_confidence_head", path)
    with_markov = _flag_value(kv, "dflash.confidence_head_with_markov", path) if has_conf else False
    taps = list(num("dflash.target_layers"))
    hidden = num("dflash.embedding_length")
    try:
        return contract_with_tensors(dict(
            family=FAMILY, architecture=ARCHITECTURE,
            geometry=Geometry(
                hidden_size=hidden, intermediate_size=num("dflash.feed_forward_length"),
                num_draft_layers=num("dflash.block_count"),
                num_attention_heads=num("dflash.attention.head_count"),
                num_key_value_heads=num("dflash.attention.head_count_kv"),
                head_dim=num("dflash.attention.key_length"), vocab_size=num("dflash.vocab_size"),
                rms_norm_eps=num("dflash.attention.layer_norm_rms_epsilon"),
                rope_theta=num("dflash.rope.frequency_base")),
            taps=FeatureTaps(num_target_layers=num("dflash.target.num_layers"), target_layer_ids=taps,
                             hidden_state_indices=[t + 1 for t in taps],
                             feature_width=len(taps) * hidden),
            block=BlockLayout(block_size=num("dflash.block_size"),
                              mask_token_id=num("dflash.mask_token_id"),
                              anchor_first=_flag_value(kv, "dflash.sample_from_anchor", path)),
            attention=Attention(causal=_flag_value(kv, "dflash.attention.causal", path), bias=False),
            markov_head=MarkovHead(rank=markov_rank, type=markov_type),
            confidence_head=ConfidenceHead(enabled=has_conf, with_markov=with_markov),
        ))
    except ValueError as exc:  # pydantic: sample_from_anchor false, causal true
        first = exc.errors()[0] if hasattr(exc, "errors") else {"loc": (), "msg": str(exc)}
        where = ".".join(str(p) for p in first["loc"])
        raise MetadataError(f"{path}: metadata does not describe a valid contract at '{where}': "
                            f"{first['msg']}", path=path, field=where) from None


def provenance_from_metadata(kv: dict[str, object], *, path: str) -> Provenance:
    return Provenance(
        name=_get(kv, "general.name", path),
        repository=kv.get("general.source.huggingface.repository"),
        revision=_get(kv, "dflash.source.revision", path),
        source_sha256=_get(kv, "dflash.source.sha256", path),
        embed_sha256=kv.get("dflash.target.embed_sha256"),
        lm_head_sha256=kv.get("dflash.target.lm_head_sha256"),
        converter=_get(kv, "dspark.converter", path),
    )
