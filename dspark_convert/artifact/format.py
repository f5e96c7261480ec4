"""The GGUF metadata of an artifact (format versions 1 to 4), as data.

``METADATA_KEYS`` lists every key of a DSpark family's artifact (versions 1 and 2),
``DFLASH2_METADATA_KEYS`` a DFlash2 one's (3) and ``ASSISTANT_METADATA_KEYS`` a Gemma 4
assistant's (4): each key's exact GGUF type, when it is present and what it holds
(``FAMILY_KEYS``: each family's table). The writer emits keys in their table's order from
``expected_metadata``; the validator checks a file against the same function and rebuilds
the contract from the metadata read back as the config.json it stands for (one view per
family, ``_CONFIG_VIEWS``); the docs are generated from the tables.
"""

from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass
from typing import Literal

from gguf.constants import GGUFValueType

from dspark_convert import CONVERTER_NAME, __version__
from dspark_convert.contract import dflash2, gemma4, gemma4_assistant
from dspark_convert.contract.dspark import ARCHITECTURE, MAX_DRAFT_LAYERS, FeatureContract
from dspark_convert.contract.families import ASSISTANT, DFLASH2, FAMILIES, GEMMA4, QWEN3, Family
from dspark_convert.errors import ConfigError, ContractViolation, DSparkError, GeometryLimitError, MetadataError

FORMAT_VERSION = 1
ARCHITECTURE_NAME = "dflash"
# Format version 2 adds the drafter families beside Qwen3 (docs/ARTIFACT_FORMAT.md, "Drafter
# families"): its files name their family (dspark.family) and architecture, and carry the
# family's own keys. A Qwen3 artifact is still version 1, byte for byte as before; a
# version-1 reader refuses a version-2 file at dspark.format_version, never misreads it.
FAMILY_FORMAT_VERSION = 2
GEMMA4_ARCHITECTURE_NAME = "dspark-gemma4"
# Format version 3: a DFlash2 drafter (speculators' DFlash2DraftModel: conv + candidate
# selector), under llama.cpp 0c1e570's `dflash` architecture and key names; version 4: a
# Gemma 4 assistant (MTP drafter), under llama.cpp's `gemma4-assistant` architecture and
# key names (docs/ARTIFACT_FORMAT.md, "DFlash2" and "The Gemma 4 assistant"). The format
# is ours; the names are llama.cpp's where it has them, so that its export is a copy.
DFLASH2_FORMAT_VERSION = 3
ASSISTANT_FORMAT_VERSION = 4
ASSISTANT_ARCHITECTURE_NAME = "gemma4-assistant"
ALIGNMENT = 32
GGUF_FILE = "drafter.gguf"
MANIFEST_FILE = "manifest.json"
LOCAL_REVISION = "local"


# The format version of each family's artifacts, by contract family: drafter.gguf's
# dspark.format_version and manifest.json's format_version both hold it (convert and quantize
# write it from here; validate refuses an artifact whose two disagree, 49).
FORMAT_VERSIONS = {QWEN3.name: FORMAT_VERSION, GEMMA4.name: FAMILY_FORMAT_VERSION,
                   DFLASH2.name: DFLASH2_FORMAT_VERSION,
                   ASSISTANT.name: ASSISTANT_FORMAT_VERSION}
# The one disagreement read as a legacy case (a warning, not 49): a Gemma4 manifest written
# with format_version 1 before the manifest carried its family's version
# (docs/ARTIFACT_FORMAT.md, "Format versions").
LEGACY_MANIFEST_VERSIONS = {GEMMA4.name: FORMAT_VERSION}


def padded(n: int) -> int:
    """``n`` bytes rounded up to the data alignment (where the next tensor may begin)."""
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


When = Literal["always", "hub", "markov", "confidence", "embed", "lm_head", "quantized",
               "gemma4", "softcap", "sliding", "full"]

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
                "SHA-256 of the source `embed_tokens.weight` bytes; a source without it: of "
                "the target's `model.embed_tokens.weight`, when converted with `--target`", "embed"),
    MetadataKey("dflash.target.lm_head_sha256", T.STRING,
                "SHA-256 of the source `lm_head.weight` bytes; a source without it: of the "
                "target's head (its embedding when tied), when converted with `--target`", "lm_head"),
    MetadataKey("dflash.source.revision", T.STRING, "40-hex commit, or `local`"),
    MetadataKey("dflash.source.sha256", T.STRING,
                "SHA-256 of the weights file (sharded: of the sorted `\"<file> <sha256>\\n\"` lines)"),
    MetadataKey("dspark.family", T.STRING, "`gemma4-dspark`: the drafter family (absent: "
                "`qwen3-dspark`, format version 1)", "gemma4"),
    MetadataKey("dspark.gemma4.source.model_type", T.STRING,
                "config.json `model_type` (`gemma4_text` or `gemma4_unified_text`)", "gemma4"),
    MetadataKey("dspark.gemma4.source.target_model_type", T.STRING,
                "config.json `target_model_type`", "gemma4"),
    MetadataKey("dspark.gemma4.source.target_text_model_type", T.STRING,
                "config.json `target_text_model_type`", "gemma4"),
    MetadataKey("dspark.gemma4.attention.k_eq_v", T.STRING,
                "`true` / `false`: `attention_k_eq_v` (no v_proj; V = RMS norm of k_proj)", "gemma4"),
    MetadataKey("dspark.gemma4.rope.type", T.STRING,
                "`rope_parameters.full_attention.rope_type` (`proportional` or `default`)", "gemma4"),
    MetadataKey("dspark.gemma4.rope.partial_rotary_factor", T.FLOAT64,
                "`rope_parameters.full_attention.partial_rotary_factor` (1.0 for `default`)", "gemma4"),
    MetadataKey("dspark.gemma4.hidden_activation", T.STRING, "`gelu_pytorch_tanh`", "gemma4"),
    MetadataKey("dspark.gemma4.final_logit_softcapping", T.FLOAT64,
                "`final_logit_softcapping`; absent when null", "softcap"),
    MetadataKey("dspark.format_version", T.UINT32, "1; 2 with `dspark.family`"),
    MetadataKey("dspark.converter", T.STRING, "`dspark-convert <version>`"),
    # Written by `dspark quantize` only, after every key of the BF16 parent, as Strata's
    # tools/dflash_quantize.py (export) appends them.
    MetadataKey("strata.dflash.quantization", T.STRING,
                "`Q8_0`, `Q5_0` or `Q4_0`: the type of the 2-D backbone matrices", "quantized"),
    MetadataKey("strata.dflash.source_sha256", T.STRING,
                "SHA-256 of the BF16 parent's `drafter.gguf`", "quantized"),
)

# The keys every kind's artifact holds: what the file is, where its weights came from,
# which converter wrote it (the DSpark table above holds them too, in its own order).
_PROVENANCE_KEYS = {k.key: k for k in METADATA_KEYS if k.key in (
    "general.alignment", "general.name", "general.source.huggingface.repository",
    "dflash.target.embed_sha256", "dflash.target.lm_head_sha256", "dflash.source.revision",
    "dflash.source.sha256", "dspark.converter", "dspark.format_version")}


def _shared(key: str, doc: str | None = None, when: When | None = None) -> MetadataKey:
    """A key of the DSpark table in another kind's table: its type, its condition (``when``
    unless given), ``doc`` for what it holds there."""
    base = _PROVENANCE_KEYS.get(key) or next(k for k in METADATA_KEYS if k.key == key)
    return MetadataKey(key, base.type, doc or base.doc,
                       when if when is not None else base.when, base.sub_type)


# A DFlash2 artifact (format version 3): llama.cpp 0c1e570's `dflash` keys for a DFlash2
# drafter (its DFlashModel converter, conversion/qwen.py:664), ours (dspark.*) for what it
# has no key for. dflash.target_layers holds speculators' aux_hidden_state_layer_ids, HF
# hidden_states indices, as llama.cpp's converter writes them (z-lab's ids + 1): not the
# DeepSpec ids a DSpark artifact's holds.
DFLASH2_METADATA_KEYS: tuple[MetadataKey, ...] = (
    MetadataKey("general.architecture", T.STRING, "`dflash`"),
    _shared("general.alignment"), _shared("general.name"),
    _shared("general.source.huggingface.repository"),
    _shared("dflash.embedding_length", "transformer_layer_config.hidden_size"),
    _shared("dflash.block_count", "transformer_layer_config.num_hidden_layers"),
    _shared("dflash.attention.head_count", "transformer_layer_config.num_attention_heads"),
    _shared("dflash.attention.head_count_kv", "transformer_layer_config.num_key_value_heads"),
    _shared("dflash.attention.key_length", "transformer_layer_config.head_dim"),
    _shared("dflash.feed_forward_length", "transformer_layer_config.intermediate_size"),
    _shared("dflash.vocab_size", "transformer_layer_config.vocab_size (= draft_vocab_size)"),
    _shared("dflash.block_size", "block_size (slot 0 the anchor: block_size - 1 drafts)"),
    _shared("dflash.mask_token_id", "mask_token_id"),
    _shared("dflash.target_layers", "aux_hidden_state_layer_ids unchanged: HF hidden_states "
            "indices (0 the embedding); z-lab's target_layer_ids + 1"),
    _shared("dflash.rope.frequency_base", "transformer_layer_config rope theta"),
    _shared("dflash.attention.layer_norm_rms_epsilon", "transformer_layer_config.rms_norm_eps"),
    _shared("dflash.sample_from_anchor", "`false`: slot 0 is the anchor, not drafted"),
    _shared("dflash.attention.causal", "`false`"),
    MetadataKey("dflash.attention.sliding_window", T.UINT32,
                "transformer_layer_config.sliding_window", "sliding"),
    MetadataKey("dspark.dflash2.layer_types", T.ARRAY,
                "transformer_layer_config.layer_types (`sliding_attention` / "
                "`full_attention`, one per layer)", sub_type=T.STRING),
    MetadataKey("dspark.dflash2.sliding_window_non_causal", T.STRING,
                "`true` / `false`: `sliding_window_non_causal` (false: the block is causal on "
                "sliding layers)"),
    MetadataKey("dflash.conv_kernel_size", T.UINT32, "conv_kernel_size"),
    MetadataKey("dflash.conv_group_size", T.UINT32, "conv_group_size"),
    MetadataKey("dflash.selector_rank", T.UINT32, "selector_rank"),
    MetadataKey("dflash.selector_top_k", T.UINT32, "selector_top_k"),
    # Converted with --target (required): the target's hashes are always recorded.
    _shared("dflash.target.embed_sha256", "SHA-256 of the target's `model.embed_tokens.weight` "
            "(speculators never saves one: the runtime binds the target's)", "always"),
    _shared("dflash.target.lm_head_sha256", "SHA-256 of the target's head (its embedding when "
            "tied)", "always"),
    _shared("dflash.source.revision"), _shared("dflash.source.sha256"),
    MetadataKey("dspark.family", T.STRING, "`qwen3-dflash2`"),
    _shared("dspark.format_version", "3"),
    _shared("dspark.converter"),
)

_A = ASSISTANT_ARCHITECTURE_NAME
# A Gemma 4 assistant artifact (format version 4): llama.cpp 0c1e570's `gemma4-assistant`
# keys (its Gemma4AssistantModel converter, conversion/gemma.py:933), ours (dspark.*) for
# what it has no key for or encodes otherwise (layer types, the RoPE type, drafts per cycle).
ASSISTANT_METADATA_KEYS: tuple[MetadataKey, ...] = (
    MetadataKey("general.architecture", T.STRING, f"`{_A}`"),
    _shared("general.alignment"), _shared("general.name"),
    _shared("general.source.huggingface.repository"),
    MetadataKey(f"{_A}.embedding_length", T.UINT32, "text_config.hidden_size (the assistant's)"),
    MetadataKey(f"{_A}.embedding_length_out", T.UINT32,
                "backbone_hidden_size (the target's hidden size)"),
    MetadataKey(f"{_A}.block_count", T.UINT32, "text_config.num_hidden_layers"),
    MetadataKey(f"{_A}.nextn_predict_layers", T.UINT32, "text_config.num_hidden_layers"),
    MetadataKey(f"{_A}.attention.shared_kv_layers", T.UINT32,
                "text_config.num_kv_shared_layers (= the layer count: every layer reads the "
                "target's KV)"),
    MetadataKey(f"{_A}.feed_forward_length", T.UINT32, "text_config.intermediate_size"),
    MetadataKey(f"{_A}.attention.head_count", T.UINT32, "text_config.num_attention_heads"),
    MetadataKey(f"{_A}.attention.head_count_kv", T.ARRAY, "each layer's KV heads",
                sub_type=T.UINT32),
    MetadataKey(f"{_A}.attention.key_length", T.UINT32, "the full layers' head_dim", "full"),
    MetadataKey(f"{_A}.attention.key_length_swa", T.UINT32, "the sliding layers' head_dim",
                "sliding"),
    MetadataKey(f"{_A}.attention.sliding_window", T.UINT32, "text_config.sliding_window",
                "sliding"),
    MetadataKey(f"{_A}.attention.layer_norm_rms_epsilon", T.FLOAT32, "text_config.rms_norm_eps"),
    MetadataKey(f"{_A}.rope.freq_base", T.FLOAT64, "rope_parameters.full_attention.rope_theta",
                "full"),
    MetadataKey(f"{_A}.rope.freq_base_swa", T.FLOAT64,
                "rope_parameters.sliding_attention.rope_theta", "sliding"),
    MetadataKey(f"{_A}.vocab_size", T.UINT32, "text_config.vocab_size"),
    MetadataKey(f"{_A}.final_logit_softcapping", T.FLOAT64,
                "text_config.final_logit_softcapping (recorded; the assistant's logits are "
                "never softcapped); absent when null", "softcap"),
    MetadataKey("dspark.assistant.layer_types", T.ARRAY, "text_config.layer_types",
                sub_type=T.STRING),
    MetadataKey("dspark.assistant.rope.type", T.STRING,
                "rope_parameters.full_attention.rope_type (`proportional` or `default`)", "full"),
    MetadataKey("dspark.assistant.rope.partial_rotary_factor", T.FLOAT64,
                "rope_parameters.full_attention.partial_rotary_factor (1.0 for `default`)",
                "full"),
    MetadataKey("dspark.assistant.hidden_activation", T.STRING, "`gelu_pytorch_tanh`"),
    MetadataKey("dspark.assistant.num_assistant_tokens", T.UINT32,
                "drafts per cycle: generation_config.json `num_assistant_tokens` (20 without "
                "one, transformers' default)"),
    _shared("dflash.target.embed_sha256", "SHA-256 of the target's `embed_tokens` (the "
            "embedding the assistant's input reads; its own is `token_embd.weight`, its tied "
            "head)", "always"),
    _shared("dflash.source.revision"), _shared("dflash.source.sha256"),
    MetadataKey("dspark.family", T.STRING, "`gemma4-assistant`"),
    _shared("dspark.format_version", "4"),
    _shared("dspark.converter"),
)
# Each family's key table, in file order.
FAMILY_KEYS: dict[str, tuple[MetadataKey, ...]] = {
    QWEN3.name: METADATA_KEYS, GEMMA4.name: METADATA_KEYS,
    DFLASH2.name: DFLASH2_METADATA_KEYS, ASSISTANT.name: ASSISTANT_METADATA_KEYS}
# Every key of the format (one type per name, whichever table holds it).
KEYS_BY_NAME = {k.key: k for table in (METADATA_KEYS, DFLASH2_METADATA_KEYS,
                                       ASSISTANT_METADATA_KEYS) for k in table}
assert all(KEYS_BY_NAME[k.key].type == k.type and KEYS_BY_NAME[k.key].sub_type == k.sub_type
           for table in FAMILY_KEYS.values() for k in table)


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
    quantization: str | None = None       # strata.dflash.quantization (quantized artifacts)
    parent_sha256: str | None = None      # strata.dflash.source_sha256 (quantized artifacts)


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
        "quantized": prov.quantization is not None,
        "gemma4": contract.family == GEMMA4.name,
        "softcap": (contract.family == GEMMA4.name
                    and contract.blocks.final_logit_softcapping is not None),
    }[key.when]


def _qwen3_values(contract: FeatureContract) -> dict[str, object]:
    return {"general.architecture": ARCHITECTURE_NAME,
            "dflash.rope.frequency_base": contract.geometry.rope_theta,
            "dspark.format_version": FORMAT_VERSIONS[QWEN3.name]}


def _gemma4_values(contract) -> dict[str, object]:
    """The Gemma4 family's values: its architecture (not `dflash`: a DFlash loader must not
    read it as one), the full-attention RoPE, k_eq_v, the activation, the softcap and the
    config form; the shared keys hold the geometry the drafter uses (key_length =
    global_head_dim, head_count_kv = the global KV heads under k_eq_v)."""
    form, rope = contract.config_form, contract.rope
    return {"general.architecture": GEMMA4_ARCHITECTURE_NAME,
            "dflash.rope.frequency_base": rope.theta,
            "dspark.family": contract.family,
            "dspark.gemma4.source.model_type": form.model_type,
            "dspark.gemma4.source.target_model_type": form.target_model_type,
            "dspark.gemma4.source.target_text_model_type": form.target_text_model_type,
            "dspark.gemma4.attention.k_eq_v": _flag(contract.attention.k_eq_v),
            "dspark.gemma4.rope.type": rope.type,
            "dspark.gemma4.rope.partial_rotary_factor": rope.partial_rotary_factor,
            "dspark.gemma4.hidden_activation": contract.blocks.activation,
            "dspark.gemma4.final_logit_softcapping": contract.blocks.final_logit_softcapping,
            "dspark.format_version": FORMAT_VERSIONS[GEMMA4.name]}


# The family's own values, by contract family: one row per family of contract/families.py.
_FAMILY_VALUES = {QWEN3.name: _qwen3_values, GEMMA4.name: _gemma4_values}


def expected_metadata(contract, prov: Provenance) -> dict[str, object]:
    """Every key's value, in file order, for a contract (of any family) and its provenance:
    each family's key table (FAMILY_KEYS) and values."""
    return _FAMILY_METADATA.get(contract.family, _dspark_metadata)(contract, prov)


def _provenance_values(prov: Provenance) -> dict[str, object]:
    return {"general.alignment": ALIGNMENT, "general.name": prov.name,
            "general.source.huggingface.repository": prov.repository,
            "dflash.target.embed_sha256": prov.embed_sha256,
            "dflash.target.lm_head_sha256": prov.lm_head_sha256,
            "dflash.source.revision": prov.revision, "dflash.source.sha256": prov.source_sha256,
            "dspark.converter": prov.converter}


def _kind_metadata(table: tuple[MetadataKey, ...], values: dict[str, object],
                   conditions: dict[str, bool], prov: Provenance) -> dict[str, object]:
    """A kind's values in its table's order, each key present when its condition holds."""
    applies = {"always": True, "hub": prov.repository is not None,
               "embed": prov.embed_sha256 is not None,
               "lm_head": prov.lm_head_sha256 is not None, **conditions}
    values = {**_provenance_values(prov), **values}
    return {k.key: values[k.key] for k in table if applies[k.when]}


def _dflash2_metadata(contract, prov: Provenance) -> dict[str, object]:
    g, a = contract.geometry, contract.attention
    values = {
        "general.architecture": ARCHITECTURE_NAME,
        "dflash.embedding_length": g.hidden_size, "dflash.block_count": g.num_draft_layers,
        "dflash.attention.head_count": g.num_attention_heads,
        "dflash.attention.head_count_kv": g.num_key_value_heads,
        "dflash.attention.key_length": g.head_dim,
        "dflash.feed_forward_length": g.intermediate_size, "dflash.vocab_size": g.vocab_size,
        "dflash.block_size": contract.block.block_size,
        "dflash.mask_token_id": contract.block.mask_token_id,
        "dflash.target_layers": list(contract.taps.hidden_state_indices),
        "dflash.rope.frequency_base": g.rope_theta,
        "dflash.attention.layer_norm_rms_epsilon": g.rms_norm_eps,
        "dflash.sample_from_anchor": _flag(contract.block.sample_from_anchor),
        "dflash.attention.causal": _flag(a.causal),
        "dflash.attention.sliding_window": a.sliding_window,
        "dspark.dflash2.layer_types": list(a.layer_types),
        "dspark.dflash2.sliding_window_non_causal": _flag(a.sliding_window_non_causal),
        "dflash.conv_kernel_size": contract.conv.kernel_size,
        "dflash.conv_group_size": contract.conv.group_size,
        "dflash.selector_rank": contract.selector.rank,
        "dflash.selector_top_k": contract.selector.top_k,
        "dspark.family": contract.family,
        "dspark.format_version": FORMAT_VERSIONS[contract.family]}
    return _kind_metadata(DFLASH2_METADATA_KEYS, values,
                          {"sliding": a.sliding_window is not None}, prov)


def _assistant_metadata(contract, prov: Provenance) -> dict[str, object]:
    g, A = contract.geometry, ASSISTANT_ARCHITECTURE_NAME
    by_kind = {layer.kind: layer for layer in contract.layers}
    full, sliding = by_kind.get(gemma4_assistant.FULL), by_kind.get(gemma4_assistant.SLIDING)
    values = {
        "general.architecture": A,
        f"{A}.embedding_length": g.hidden_size,
        f"{A}.embedding_length_out": g.backbone_hidden_size,
        f"{A}.block_count": g.num_draft_layers, f"{A}.nextn_predict_layers": g.num_draft_layers,
        f"{A}.attention.shared_kv_layers": g.num_draft_layers,
        f"{A}.feed_forward_length": g.intermediate_size,
        f"{A}.attention.head_count": g.num_attention_heads,
        f"{A}.attention.head_count_kv": [layer.kv_heads for layer in contract.layers],
        f"{A}.attention.key_length": full.head_dim if full else None,
        f"{A}.attention.key_length_swa": sliding.head_dim if sliding else None,
        f"{A}.attention.sliding_window": contract.sliding_window,
        f"{A}.attention.layer_norm_rms_epsilon": g.rms_norm_eps,
        f"{A}.rope.freq_base": full.rope_theta if full else None,
        f"{A}.rope.freq_base_swa": sliding.rope_theta if sliding else None,
        f"{A}.vocab_size": g.vocab_size,
        f"{A}.final_logit_softcapping": contract.final_logit_softcapping,
        "dspark.assistant.layer_types": contract.layer_types(),
        "dspark.assistant.rope.type": contract.rope.full_type,
        "dspark.assistant.rope.partial_rotary_factor": contract.rope.full_partial_rotary_factor,
        "dspark.assistant.hidden_activation": contract.activation,
        "dspark.assistant.num_assistant_tokens": contract.num_assistant_tokens,
        "dspark.family": contract.family,
        "dspark.format_version": FORMAT_VERSIONS[contract.family]}
    return _kind_metadata(ASSISTANT_METADATA_KEYS, values,
                          {"sliding": sliding is not None, "full": full is not None,
                           "softcap": contract.final_logit_softcapping is not None}, prov)


def _dspark_metadata(contract: FeatureContract, prov: Provenance) -> dict[str, object]:
    """A DSpark family's keys (METADATA_KEYS), Qwen3's and Gemma4's."""
    g = contract.geometry
    values: dict[str, object] = {
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
        "dspark.converter": prov.converter,
        "strata.dflash.quantization": prov.quantization,
        "strata.dflash.source_sha256": prov.parent_sha256,
        **_FAMILY_VALUES[contract.family](contract),
    }
    return {k.key: values[k.key] for k in METADATA_KEYS if _applies(k, contract, prov)}


_FAMILY_METADATA = {DFLASH2.name: _dflash2_metadata, ASSISTANT.name: _assistant_metadata}


def as_float32(value: float) -> float:
    """The value a FLOAT32 key holds once written (for comparisons with what is read).
    A value beyond the float32 range becomes infinity, as a float32 cast makes it (struct
    itself refuses to pack it)."""
    try:
        return struct.unpack("<f", struct.pack("<f", value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


# The values a GGUF integer type can hold.
_INT_RANGES = {T.UINT8: (0, 2**8 - 1), T.INT8: (-2**7, 2**7 - 1), T.UINT16: (0, 2**16 - 1),
               T.INT16: (-2**15, 2**15 - 1), T.UINT32: (0, 2**32 - 1),
               T.INT32: (-2**31, 2**31 - 1), T.UINT64: (0, 2**64 - 1),
               T.INT64: (-2**63, 2**63 - 1)}


def _storable(value: object, vtype: GGUFValueType) -> str | None:
    """Why ``value`` cannot be written as ``vtype`` (None when it can)."""
    if vtype in _INT_RANGES:
        low, high = _INT_RANGES[vtype]
        if not low <= value <= high:
            return f"{value} does not fit {vtype.name} ({low}..{high})"
    elif vtype == T.FLOAT32:
        stored = as_float32(value)
        if not math.isfinite(stored):
            return f"{value} is beyond the FLOAT32 range (it would be stored as {stored})"
        if value != 0 and stored == 0:
            return f"{value} is below the FLOAT32 range (it would be stored as 0.0)"
    elif vtype == T.FLOAT64 and not math.isfinite(value):
        return f"{value} is not a finite FLOAT64"
    return None


def check_storable(contract: FeatureContract, *, path: str) -> None:
    """Every value the contract puts in the metadata, against its key's GGUF type, before
    anything is written: gguf-py would fail on a u32 of 2**32 (exit 1 once), and a float32
    rms eps of 1e-50 would be written as 0.0 (and refused by our own validate)."""
    placeholder = Provenance(name="", repository=None, revision=LOCAL_REVISION,
                             source_sha256="0" * 64, embed_sha256=None, lm_head_sha256=None)
    fields = {key: field for field, key in CONFIG_FIELD_KEYS.items()}
    for key, value in expected_metadata(contract, placeholder).items():
        spec = KEYS_BY_NAME[key]
        items = value if spec.type == T.ARRAY else [value]
        vtype = spec.sub_type if spec.type == T.ARRAY else spec.type
        for item in items:
            why = None if isinstance(item, str) else _storable(item, vtype)
            if why is not None:
                field = fields.get(key, key)
                raise GeometryLimitError(f"{path}: field '{field}': {why}; the artifact stores "
                                         f"it as {key}", path=path, field=field,
                                         expected=f"a value {vtype.name} can hold", found=item)


# --- reading metadata back ----------------------------------------------------------------

def read_metadata(gguf, *, path: str, entries: dict | None = None) -> dict[str, object]:
    """The metadata of a parsed drafter.gguf (gguf_reader.GGUFFile) as {key: value}, every
    key known to the format and of its exact GGUF type (MetadataError otherwise). The one
    reader of an artifact's metadata: validate, inspect and the runtime go through it, so
    no rule ever sees a value of the wrong type (a scalar where an array belongs, a string
    for a count). ``entries``: the file's entries as read otherwise (``as_format_types``,
    for a bare file another tool re-typed), in place of ``gguf.kv``."""
    entries = gguf.kv if entries is None else entries
    for key, value in entries.items():
        spec = KEYS_BY_NAME.get(key)
        if spec is None:
            raise MetadataError(f"{path}: metadata key '{key}' is not part of the format",
                                path=path, field=key, expected="absent", found=value.type.name)
        if value.type != spec.type or value.sub_type != spec.sub_type:
            want = spec.type.name + (f"[{spec.sub_type.name}]" if spec.sub_type else "")
            got = value.type.name + (f"[{value.sub_type.name}]" if value.sub_type else "")
            raise MetadataError(f"{path}: metadata key '{key}': expected type {want}, found {got}",
                                path=path, field=key, expected=want, found=got)
    return {key: value.value for key, value in entries.items()}


def _holds_exactly(value: object, vtype: GGUFValueType) -> bool:
    """Whether ``vtype`` holds ``value`` (an int or float read from another numeric type)
    exactly: an integer in its range, a float that is that FLOAT32 or FLOAT64."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if vtype in _INT_RANGES:
        low, high = _INT_RANGES[vtype]
        return isinstance(value, int) and low <= value <= high
    if vtype == T.FLOAT32:
        return isinstance(value, float) and (as_float32(value) == value or math.isnan(value))
    return vtype == T.FLOAT64 and isinstance(value, float)


def as_format_types(kv: dict) -> tuple[dict, tuple[str, ...]]:
    """A file's metadata (gguf_reader GGUFValues) with every key of the format that another
    tool stored under another numeric GGUF type, holding a value the format's type holds
    exactly, read as the format's type; and what was re-typed ("key: INT64 as UINT32").

    Strata's loader reads any numeric type (its meta_i64 / meta_f64), and Strata's
    tools/dflash_quantize.py rewrites every key it copies by the Python type of its value
    (an int as INT64, a float as FLOAT64, a list of ints as an INT32 array; docs/ENGINES.md,
    "Files other tools wrote"): a file of our format it quantized holds our values under
    those types. A key left as stored (a string for a count, a value out of range) is
    refused by ``read_metadata`` as before."""
    from dspark_convert.formats.gguf_reader import GGUFValue

    out, retyped = dict(kv), []
    for key, entry in kv.items():
        spec = KEYS_BY_NAME.get(key)
        if spec is None or (entry.type, entry.sub_type) == (spec.type, spec.sub_type):
            continue
        if spec.type == T.ARRAY:
            if entry.type != T.ARRAY or not isinstance(entry.value, list) or not all(
                    _holds_exactly(v, spec.sub_type) for v in entry.value):
                continue
            out[key] = GGUFValue(T.ARRAY, list(entry.value), spec.sub_type)
            stored = f"ARRAY[{entry.sub_type.name}]" if entry.sub_type else "ARRAY"
            retyped.append(f"{key}: {stored} as ARRAY[{spec.sub_type.name}]")
        elif entry.type != T.ARRAY and _holds_exactly(entry.value, spec.type):
            out[key] = GGUFValue(spec.type, entry.value)
            retyped.append(f"{key}: {entry.type.name} as {spec.type.name}")
    return out, tuple(retyped)


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


# config.json field -> the metadata key that carries it, to name keys in messages.
CONFIG_FIELD_KEYS = {
    "hidden_size": "dflash.embedding_length", "intermediate_size": "dflash.feed_forward_length",
    "num_hidden_layers": "dflash.block_count", "num_attention_heads": "dflash.attention.head_count",
    "num_key_value_heads": "dflash.attention.head_count_kv", "head_dim": "dflash.attention.key_length",
    "vocab_size": "dflash.vocab_size", "rms_norm_eps": "dflash.attention.layer_norm_rms_epsilon",
    "num_target_layers": "dflash.target.num_layers", "target_layer_ids": "dflash.target_layers",
    "block_size": "dflash.block_size", "mask_token_id": "dflash.mask_token_id",
    "markov_rank": "dflash.markov_rank", "markov_head_type": "dflash.markov_head_type",
    "enable_confidence_head": "dflash.has_confidence_head",
    "confidence_head_with_markov": "dflash.confidence_head_with_markov",
    "rope_parameters.rope_theta": "dflash.rope.frequency_base",
    # The Gemma4 family's fields (its reader's names) and their keys.
    "global_head_dim": "dflash.attention.key_length",
    "num_global_key_value_heads": "dflash.attention.head_count_kv",
    "rope_parameters.full_attention.rope_theta": "dflash.rope.frequency_base",
    "rope_parameters.full_attention.rope_type": "dspark.gemma4.rope.type",
    "rope_parameters.full_attention.partial_rotary_factor": "dspark.gemma4.rope.partial_rotary_factor",
    "rope_parameters.full_attention": "dspark.gemma4.rope.type",
    "attention_k_eq_v": "dspark.gemma4.attention.k_eq_v",
    "hidden_activation": "dspark.gemma4.hidden_activation",
    "final_logit_softcapping": "dspark.gemma4.final_logit_softcapping",
    "model_type": "dspark.gemma4.source.model_type",
    "target_model_type": "dspark.gemma4.source.target_model_type",
    "target_text_model_type": "dspark.gemma4.source.target_text_model_type",
}
# The keys of CONFIG_FIELD_KEYS that stand for a Qwen3 config's fields (its view).
_QWEN3_VIEW_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers",
                      "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
                      "rms_norm_eps", "num_target_layers", "target_layer_ids", "block_size",
                      "mask_token_id", "markov_rank")


def metadata_family(kv: dict[str, object], *, path: str) -> Family:
    """The family a file's metadata names (types already checked): version 1 is Qwen3 and
    has no dspark.family; a later version names its family, whose version it must be.
    Anything else is refused."""
    version = _get(kv, "dspark.format_version", path)
    name = kv.get("dspark.family")
    families = {f.name: f for f in FAMILIES.values() if f is not QWEN3}
    if version == FORMAT_VERSION and name is None:
        return QWEN3
    if name in families and FORMAT_VERSIONS[name] == version:
        return families[name]
    versions = sorted(set(FORMAT_VERSIONS.values()))
    if version not in versions:
        shown_versions = ", ".join(str(v) for v in versions[:-1]) + f" or {versions[-1]}"
        raise MetadataError(f"{path}: metadata key 'dspark.format_version': expected "
                            f"{shown_versions}, found {version}",
                            path=path, field="dspark.format_version",
                            expected=versions, found=version)
    if version == FORMAT_VERSION:
        want = f"absent with 'dspark.format_version' {FORMAT_VERSION}"
    else:
        named = [f for f, v in FORMAT_VERSIONS.items() if v == version and f in families]
        want = f"{' or '.join(named)} with 'dspark.format_version' {version}"
    raise MetadataError(f"{path}: metadata key 'dspark.family': expected {want}, found "
                        f"{'nothing' if name is None else repr(name)}", path=path, field="dspark.family", expected=want,
                        found="missing" if name is None else name)


def _common_checks(kv: dict[str, object], path: str) -> None:
    """The anchor and causality flags every family's artifact holds, and the conditional
    Markov / confidence keys."""
    if not _flag_value(kv, "dflash.sample_from_anchor", path):
        raise MetadataError(f"{path}: metadata key 'dflash.sample_from_anchor': expected 'true' "
                            "(the format is anchor-first; Strata refuses false), found 'false'",
                            path=path, field="dflash.sample_from_anchor", expected="true",
                            found="false")
    if _flag_value(kv, "dflash.attention.causal", path):
        raise MetadataError(f"{path}: metadata key 'dflash.attention.causal': expected 'false' "
                            "(block attention is non-causal; Strata refuses true), found 'true'",
                            path=path, field="dflash.attention.causal", expected="false",
                            found="true")
    _check_conditional_keys(kv, path)


def _heads_view(kv: dict[str, object], path: str) -> dict:
    """The Markov and confidence fields, as config.json has them."""
    view: dict = {"enable_confidence_head": _flag_value(kv, "dflash.has_confidence_head", path)}
    if "dflash.markov_head_type" in kv:
        view["markov_head_type"] = kv["dflash.markov_head_type"]
    if "dflash.confidence_head_with_markov" in kv:
        view["confidence_head_with_markov"] = _flag_value(kv, "dflash.confidence_head_with_markov", path)
    return view


def metadata_config_view(kv: dict[str, object], *, path: str) -> dict:
    """The metadata as the Qwen3 config.json it stands for, so that the very rules applied
    at conversion can be applied to an artifact (types already checked)."""
    _common_checks(kv, path)
    view = {field: _get(kv, CONFIG_FIELD_KEYS[field], path) for field in _QWEN3_VIEW_FIELDS}
    view.update(architectures=[ARCHITECTURE], attention_bias=False, hidden_act="silu",
                rope_parameters={"rope_theta": _get(kv, "dflash.rope.frequency_base", path),
                                 "rope_type": "default"}, **_heads_view(kv, path))
    view["target_layer_ids"] = list(view["target_layer_ids"])
    return view


def gemma4_config_view(kv: dict[str, object], *, path: str) -> dict:
    """The metadata as the Gemma4 config.json it stands for (the fields the drafter uses;
    the inherited-but-unused ones are the manifest's record, not the file's)."""
    _common_checks(kv, path)
    g = {field: _get(kv, CONFIG_FIELD_KEYS[field], path)
         for field in ("hidden_size", "intermediate_size", "num_hidden_layers",
                       "num_attention_heads", "vocab_size", "rms_norm_eps", "num_target_layers",
                       "target_layer_ids", "block_size", "mask_token_id", "markov_rank",
                       "global_head_dim", "model_type", "target_model_type",
                       "target_text_model_type", "hidden_activation")}
    k_eq_v = _flag_value(kv, "dspark.gemma4.attention.k_eq_v", path)
    kv_heads = _get(kv, "dflash.attention.head_count_kv", path)
    rope_type = _get(kv, "dspark.gemma4.rope.type", path)
    full = {"rope_type": rope_type, "rope_theta": _get(kv, "dflash.rope.frequency_base", path)}
    if rope_type != "default":
        full["partial_rotary_factor"] = _get(kv, "dspark.gemma4.rope.partial_rotary_factor", path)
    layers = g["num_hidden_layers"]
    view = dict(
        g, architectures=[gemma4.ARCHITECTURE], attention_bias=False,
        attention_k_eq_v=k_eq_v, rope_parameters={"full_attention": full},
        final_logit_softcapping=kv.get("dspark.gemma4.final_logit_softcapping"),
        enable_moe_block=False, hidden_size_per_layer_input=0, num_kv_shared_layers=0,
        use_double_wide_mlp=False,
        # Built only within the bound the contract checks first (a hostile block count).
        layer_types=["full_attention"] * layers if 0 < layers <= MAX_DRAFT_LAYERS else [],
        **{"num_global_key_value_heads" if k_eq_v else "num_key_value_heads": kv_heads},
        **_heads_view(kv, path))
    if not k_eq_v:
        view["num_global_key_value_heads"] = None
    view["target_layer_ids"] = list(view["target_layer_ids"])
    return view


def dflash2_config_view(kv: dict[str, object], *, path: str) -> tuple[dict, None]:
    """The metadata as the speculators DFlash2 config.json it stands for (every field the
    forward reads), so that contract/dflash2.py's reader rules apply to an artifact."""
    for key, want in (("dflash.sample_from_anchor", False), ("dflash.attention.causal", False)):
        if _flag_value(kv, key, path) != want:
            raise MetadataError(f"{path}: metadata key '{key}': expected 'false' (DFlash2: "
                                "slot 0 is the anchor, the block attends both ways), found "
                                "'true'", path=path, field=key, expected="false", found="true")
    layer_types = list(_get(kv, "dspark.dflash2.layer_types", path))
    window = kv.get("dflash.attention.sliding_window")
    layer = {"model_type": dflash2.LAYER_MODEL_TYPE,
             "hidden_size": _get(kv, "dflash.embedding_length", path),
             "intermediate_size": _get(kv, "dflash.feed_forward_length", path),
             "num_hidden_layers": _get(kv, "dflash.block_count", path),
             "num_attention_heads": _get(kv, "dflash.attention.head_count", path),
             "num_key_value_heads": _get(kv, "dflash.attention.head_count_kv", path),
             "head_dim": _get(kv, "dflash.attention.key_length", path),
             "vocab_size": _get(kv, "dflash.vocab_size", path),
             "rms_norm_eps": _get(kv, "dflash.attention.layer_norm_rms_epsilon", path),
             "rope_parameters": {"rope_theta": _get(kv, "dflash.rope.frequency_base", path),
                                 "rope_type": "default"},
             "attention_bias": False, "hidden_act": "silu", "layer_types": layer_types,
             "use_sliding_window": window is not None, "sliding_window": window}
    if window is None and dflash2.SLIDING in layer_types:
        raise MetadataError(f"{path}: metadata key 'dflash.attention.sliding_window' is "
                            "missing (dspark.dflash2.layer_types has sliding_attention layers)",
                            path=path, field="dflash.attention.sliding_window",
                            expected="present", found="missing")
    if window is not None and dflash2.SLIDING not in layer_types:
        raise MetadataError(f"{path}: metadata key 'dflash.attention.sliding_window' should "
                            "not be present (no sliding_attention layer)", path=path,
                            field="dflash.attention.sliding_window", expected="absent",
                            found=window)
    return {"architectures": [dflash2.ARCHITECTURE],
            "speculators_model_type": dflash2.MODEL_TYPE,
            "aux_hidden_state_layer_ids": list(_get(kv, "dflash.target_layers", path)),
            "block_size": _get(kv, "dflash.block_size", path),
            "mask_token_id": _get(kv, "dflash.mask_token_id", path),
            "sample_from_anchor": False,
            "sliding_window_non_causal": _flag_value(
                kv, "dspark.dflash2.sliding_window_non_causal", path),
            "conv_kernel_size": _get(kv, "dflash.conv_kernel_size", path),
            "conv_group_size": _get(kv, "dflash.conv_group_size", path),
            "selector_rank": _get(kv, "dflash.selector_rank", path),
            "selector_top_k": _get(kv, "dflash.selector_top_k", path),
            "draft_vocab_size": layer["vocab_size"], "target_hidden_size": None,
            "transformer_layer_config": layer}, None


def assistant_config_view(kv: dict[str, object], *, path: str) -> tuple[dict, dict]:
    """The metadata as the assistant's config.json (and generation_config.json's drafts per
    cycle) it stands for, so that contract/gemma4_assistant.py's rules apply to an artifact:
    each layer's geometry as per_layer_config (transformers 5.19's form)."""
    A = ASSISTANT_ARCHITECTURE_NAME
    layer_types = list(_get(kv, "dspark.assistant.layer_types", path))
    n = _get(kv, f"{A}.block_count", path)
    for key in (f"{A}.nextn_predict_layers", f"{A}.attention.shared_kv_layers"):
        if _get(kv, key, path) != n:
            raise MetadataError(f"{path}: metadata key '{key}': expected {n} (every layer of "
                                f"{A}.block_count), found {kv[key]}", path=path, field=key,
                                expected=n, found=kv[key])
    kv_heads = list(_get(kv, f"{A}.attention.head_count_kv", path))
    if len(kv_heads) != len(layer_types):
        raise MetadataError(f"{path}: metadata key '{A}.attention.head_count_kv': expected "
                            f"{len(layer_types)} values (one per layer), found {len(kv_heads)}",
                            path=path, field=f"{A}.attention.head_count_kv",
                            expected=len(layer_types), found=len(kv_heads))
    dims = {gemma4_assistant.FULL: kv.get(f"{A}.attention.key_length"),
            gemma4_assistant.SLIDING: kv.get(f"{A}.attention.key_length_swa")}
    rope: dict = {}
    if gemma4_assistant.SLIDING in layer_types:
        rope[gemma4_assistant.SLIDING] = {"rope_type": "default", "rope_theta": _get(
            kv, f"{A}.rope.freq_base_swa", path)}
    if gemma4_assistant.FULL in layer_types:
        full = {"rope_type": _get(kv, "dspark.assistant.rope.type", path),
                "rope_theta": _get(kv, f"{A}.rope.freq_base", path)}
        if full["rope_type"] != "default":
            full["partial_rotary_factor"] = _get(
                kv, "dspark.assistant.rope.partial_rotary_factor", path)
        rope[gemma4_assistant.FULL] = full
    per_layer = {}
    # Built only within the bound the contract checks first (a hostile layer count).
    for i, kind in enumerate(layer_types if len(layer_types) <= MAX_DRAFT_LAYERS else []):
        if kind not in dims:
            break           # the contract names the bad layer type
        key = f"{A}.attention.key_length" + ("" if kind == gemma4_assistant.FULL else "_swa")
        per_layer[str(i)] = {"head_dim": _get(kv, key, path), "num_key_value_heads": kv_heads[i]}
    text = {"model_type": gemma4_assistant.TEXT_MODEL_TYPE,
            "hidden_size": _get(kv, f"{A}.embedding_length", path),
            "intermediate_size": _get(kv, f"{A}.feed_forward_length", path),
            "num_hidden_layers": n, "num_kv_shared_layers": n,
            "num_attention_heads": _get(kv, f"{A}.attention.head_count", path),
            "head_dim": next((d["head_dim"] for d in per_layer.values()), 2),
            "num_key_value_heads": kv_heads[0] if kv_heads else 1,
            "layer_types": layer_types, "rope_parameters": rope,
            "rms_norm_eps": _get(kv, f"{A}.attention.layer_norm_rms_epsilon", path),
            "vocab_size": _get(kv, f"{A}.vocab_size", path),
            "hidden_activation": _get(kv, "dspark.assistant.hidden_activation", path),
            "sliding_window": kv.get(f"{A}.attention.sliding_window"),
            "per_layer_config": per_layer,
            "final_logit_softcapping": kv.get(f"{A}.final_logit_softcapping")}
    config = {"architectures": [gemma4_assistant.ARCHITECTURE],
              "model_type": gemma4_assistant.MODEL_TYPE,
              "backbone_hidden_size": _get(kv, f"{A}.embedding_length_out", path),
              "tie_word_embeddings": True, "use_ordered_embeddings": False, "text_config": text}
    generation = {"num_assistant_tokens": _get(kv, "dspark.assistant.num_assistant_tokens", path)}
    return config, generation


def _check_conditional_keys(kv: dict[str, object], path: str) -> None:
    """Keys present only with a Markov or confidence head: a metadata matter, so refused
    as MetadataError before the contract rules see the values."""
    rank = _get(kv, "dflash.markov_rank", path)
    head_type = kv.get("dflash.markov_head_type")
    conditional = [("dflash.markov_head_type", isinstance(rank, int) and rank > 0,
                    f"markov_rank is {rank}"),
                   ("dflash.confidence_head_with_markov",
                    _flag_value(kv, "dflash.has_confidence_head", path),
                    f"dflash.has_confidence_head is {kv.get('dflash.has_confidence_head')!r}")]
    for key, wanted, because in conditional:
        if wanted and key not in kv:
            raise MetadataError(f"{path}: metadata key '{key}' is missing ({because})", path=path,
                                field=key, expected="present", found="missing")
        if not wanted and key in kv:
            raise MetadataError(f"{path}: metadata key '{key}' should not be present ({because})",
                                path=path, field=key, expected="absent", found=kv[key])
    if head_type is not None and head_type not in ("vanilla", "gated", "rnn"):
        raise MetadataError(f"{path}: metadata key 'dflash.markov_head_type': expected 'vanilla', "
                            f"'gated' or 'rnn', found {head_type!r}", path=path,
                            field="dflash.markov_head_type", expected="vanilla|gated|rnn",
                            found=head_type)


def _name_metadata_keys(exc: DSparkError, path: str) -> DSparkError:
    """Re-word a contract error raised on the config view so that it names metadata keys."""
    def key_for(match: re.Match) -> str:
        field, index = match.group(1), match.group(2) or ""
        key = CONFIG_FIELD_KEYS.get(field)
        return f"metadata key '{key}{index}'" if key else match.group(0)

    message = re.sub(r"field '([A-Za-z_.]+)(\[\d+\])?'", key_for, exc.message)
    message = message.replace(f"{path} (as config.json)", path)
    field = CONFIG_FIELD_KEYS.get((exc.field or "").split("[")[0], exc.field)
    # A value of the wrong JSON type is a metadata problem; a broken rule keeps its class.
    cls = MetadataError if isinstance(exc, ConfigError) else type(exc)
    return cls(message, path=path, field=field, expected=exc.expected, found=exc.found)


def contract_from_metadata(kv: dict[str, object], *, path: str) -> FeatureContract:
    """Rebuild the feature contract from metadata values, applying the conversion rules.

    The rules run before the tensor inventory is expanded, so a hostile block count is
    refused before it costs memory. rms_norm_eps comes back as the FLOAT32 the file holds.
    A broken rule keeps its own error class; its message names the metadata key.
    """
    family = metadata_family(kv, path=path)
    label = f"{path} (as config.json)"
    try:
        view, companion = _CONFIG_VIEWS[family.name](kv, path=path)
        cfg = family.parse(view, path=label, companion=companion,
                           companion_path=f"{path} (as {family.companion_file})")
        return family.build_contract(cfg, path=label)
    except ContractViolation as exc:
        raise _name_metadata_keys(exc, path) from None


# The metadata as each family's config.json: one row per family of contract/families.py.
_CONFIG_VIEWS = {QWEN3.name: lambda kv, *, path: (metadata_config_view(kv, path=path), None),
                 GEMMA4.name: lambda kv, *, path: (gemma4_config_view(kv, path=path), None),
                 DFLASH2.name: dflash2_config_view, ASSISTANT.name: assistant_config_view}


def provenance_from_metadata(kv: dict[str, object], *, path: str) -> Provenance:
    return Provenance(
        name=_get(kv, "general.name", path),
        repository=kv.get("general.source.huggingface.repository"),
        revision=_get(kv, "dflash.source.revision", path),
        source_sha256=_get(kv, "dflash.source.sha256", path),
        embed_sha256=kv.get("dflash.target.embed_sha256"),
        lm_head_sha256=kv.get("dflash.target.lm_head_sha256"),
        converter=_get(kv, "dspark.converter", path),
        quantization=kv.get("strata.dflash.quantization"),
        parent_sha256=kv.get("strata.dflash.source_sha256"),
    )
