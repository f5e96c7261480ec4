"""The drafter as llama.cpp 0c1e570 reads it: names, keys and types, as data
(docs/REFERENCE.md §6).

One table for three readers: ``dspark export --engine llama.cpp`` writes a file by it
(commands/export.py), ``artifact/engines.py``'s llama.cpp rule judges files by the same
key types, and docs/ENGINES.md describes it. Read from llama.cpp 0c1e570 as vendored in
llama-cpp-python 0.3.36 (docs/REFERENCE.md §6): ``llama_model::load_hparams``
(src/llama-model.cpp), ``llama_model_dflash::load_arch_hparams`` / ``load_arch_tensors``
(src/models/dflash.cpp), ``common_speculative`` (common/speculative.cpp), and what its
converter writes for a DSpark checkpoint (``DSparkModel`` / ``DFlashModel``,
conversion/qwen.py; measured on the golden drafters, tests/test_llama_cpp_equivalence.py).

Where the two conventions differ from our artifact's (artifact/format.py):

- ``dflash.target_layers``: llama.cpp stores DeepSpec id + 1 (it taps the input of that
  layer), an INT32 array; ours stores the id, UINT32;
- ``dflash.context_length`` (required) and ``dflash.rope.freq_base`` (f32; absent, llama.cpp
  silently uses 10000) instead of ``dflash.rope.frequency_base`` (f64);
- flags are GGUF BOOLs (``dflash.attention.causal`` as a string is a load error);
- the mask token is ``tokenizer.ggml.mask_token_id`` and the target's tokenizer
  (``tokenizer.ggml.*``) is embedded: llama.cpp checks it token by token against the
  target's;
- 1-D tensors (norms, biases) are F32, the exact widening of our BF16 values, as its
  converter writes them;
- the embedding and head: its converter keeps the drafter's ``token_embd.weight`` (a frozen
  copy of the target's embedding) and drops ``lm_head``; llama.cpp then takes
  ``token_embd`` as the drafter's head as well (``load_arch_tensors``: ``output`` absent, so
  ``output = tok_embd``), which is not the head of a target with untied embeddings. A
  drafter file with neither tensor makes llama.cpp bind both from the target (``ctx_other``,
  src/models/dflash.cpp), as DeepSpec binds them. The export writes neither by default
  and the converter's layout on request (``--keep-embedding``,
  the target GGUF's own ``token_embd.weight``).
"""

from __future__ import annotations

from dataclasses import dataclass
from gguf.constants import GGUFValueType

T = GGUFValueType

ENGINE = "llama.cpp"
LLAMA_CPP_COMMIT = "0c1e570"          # tools/llama_cpp.py pins the build of the same commit
ARCH = "dflash"
TAP_KEY = f"{ARCH}.target_layers"
MASK_KEY = "tokenizer.ggml.mask_token_id"
TOKENIZER_PREFIX = "tokenizer."        # tokenizer.ggml.* and tokenizer.chat_template
# llama_vocab::impl::load stops without these (src/llama-vocab.cpp).
TOKENIZER_REQUIRED = ("tokenizer.ggml.model", "tokenizer.ggml.tokens")
DEFAULT_ROPE_BASE = 10000.0          # llama.cpp's rope base when dflash.rope.freq_base is absent
TAP_OFFSET = 1                       # llama.cpp's target_layers = DeepSpec id + TAP_OFFSET

# What llama.cpp's loader reads, in its order: (key, GGUF type, required). The generic
# hparams of llama_model::load_hparams, then llama_model_dflash::load_arch_hparams. get_key
# demands the exact type (llama_model_loader GKV::get_kv: "key %s has wrong type %s but
# expected type %s"); PER_LAYER_KEYS may also be per-layer arrays (get_key_or_arr).
# artifact/engines.py judges files by it; the export writes each of these keys it writes
# with this type (tests/test_export.py).
LOADER_KEYS: tuple[tuple[str, str, bool], ...] = (
    (f"{ARCH}.context_length", "UINT32", True),
    (f"{ARCH}.embedding_length", "UINT32", True),
    (f"{ARCH}.block_count", "UINT32", True),
    (f"{ARCH}.feed_forward_length", "UINT32", True),
    (f"{ARCH}.attention.head_count", "UINT32", True),
    (f"{ARCH}.attention.head_count_kv", "UINT32", False),
    (f"{ARCH}.rope.freq_base", "FLOAT32", False),
    (f"{ARCH}.attention.key_length", "UINT32", False),
    (f"{ARCH}.attention.causal", "BOOL", False),
    (f"{ARCH}.attention.layer_norm_rms_epsilon", "FLOAT32", True),
    (f"{ARCH}.block_size", "UINT32", False),
)
PER_LAYER_KEYS = (f"{ARCH}.feed_forward_length", f"{ARCH}.attention.head_count")

# Where a key's value comes from, for the export and the docs:
#   "artifact:<key>"  a key of our drafter.gguf, unchanged in value (converted in type);
#   "taps"            the artifact's target_layer_ids + TAP_OFFSET;
#   "target:<field>"  a key of the target GGUF, "<field>" under its architecture;
#   "const:<value>"   a constant (as the converter writes it);
#   "file_type"       llama_ftype of the matrices (BF16 32, Q8_0 7, Q5_0 8, Q4_0 2);
#   "confidence"      whether a confidence head is present;
#   "anchor"          the contract's anchor-first block layout;
#   "name"            the artifact's general.name.
Source = str


@dataclass(frozen=True)
class LlamaKey:
    key: str
    type: GGUFValueType
    source: Source
    doc: str
    sub_type: GGUFValueType | None = None
    required: bool = False           # llama.cpp stops loading without it


# In the order llama.cpp's converter writes them (the tokenizer keys follow, copied from the
# target GGUF in its order; then the mask token; then our provenance).
LLAMA_KEYS: tuple[LlamaKey, ...] = (
    LlamaKey("general.architecture", T.STRING, "const:dflash", "`dflash`", required=True),
    LlamaKey("general.type", T.STRING, "const:model", "`model`"),
    LlamaKey("general.name", T.STRING, "name", "the artifact's `general.name`"),
    LlamaKey(f"{ARCH}.block_count", T.UINT32, "artifact:dflash.block_count",
             "draft layers", required=True),
    LlamaKey(f"{ARCH}.context_length", T.UINT32, "target:context_length",
             "the target GGUF's context length (the drafter inherits the target's "
             "max_position_embeddings; llama.cpp requires the key)", required=True),
    LlamaKey(f"{ARCH}.embedding_length", T.UINT32, "artifact:dflash.embedding_length",
             "hidden_size", required=True),
    LlamaKey(f"{ARCH}.feed_forward_length", T.UINT32, "artifact:dflash.feed_forward_length",
             "intermediate_size", required=True),
    LlamaKey(f"{ARCH}.attention.head_count", T.UINT32, "artifact:dflash.attention.head_count",
             "num_attention_heads", required=True),
    LlamaKey(f"{ARCH}.attention.head_count_kv", T.UINT32,
             "artifact:dflash.attention.head_count_kv", "num_key_value_heads"),
    LlamaKey(f"{ARCH}.rope.freq_base", T.FLOAT32, "artifact:dflash.rope.frequency_base",
             "rope theta as f32 (absent: llama.cpp uses 10000, silently)"),
    LlamaKey(f"{ARCH}.attention.layer_norm_rms_epsilon", T.FLOAT32,
             "artifact:dflash.attention.layer_norm_rms_epsilon", "rms_norm_eps", required=True),
    LlamaKey(f"{ARCH}.attention.key_length", T.UINT32, "artifact:dflash.attention.key_length",
             "head_dim"),
    LlamaKey(f"{ARCH}.attention.value_length", T.UINT32, "artifact:dflash.attention.key_length",
             "head_dim"),
    LlamaKey("general.file_type", T.UINT32, "file_type",
             "llama_ftype of the matrices: 32 BF16, 7 Q8_0, 8 Q5_0, 2 Q4_0"),
    LlamaKey(f"{ARCH}.block_size", T.UINT32, "artifact:dflash.block_size", "block_size"),
    LlamaKey(TAP_KEY, T.ARRAY, "taps", "DeepSpec target_layer_ids + 1 (llama.cpp taps the "
             "input of that layer)", sub_type=T.INT32, required=True),
    LlamaKey(f"{ARCH}.sample_from_anchor", T.BOOL, "anchor",
             "the artifact's `dflash.sample_from_anchor` (true: query 0 predicts the token "
             "after the anchor, DeepSpec's layout)"),
    LlamaKey(f"{ARCH}.has_confidence_head", T.BOOL, "confidence",
             "whether `conf_proj.weight` is present"),
    LlamaKey("general.quantization_version", T.UINT32, "const:2", "2, as gguf-py writes it"),
)
KEYS_BY_NAME = {k.key: k for k in LLAMA_KEYS}

# Written after the tokenizer keys: the artifact's mask token where llama.cpp looks for it.
MASK = LlamaKey(MASK_KEY, T.UINT32, "artifact:dflash.mask_token_id",
                "mask_token_id (llama.cpp reads no `dflash.mask_token_id`)")

# Our provenance, last. Not `dspark.format_version`: that key marks a file of our own format
# (Strata's conventions), which this file is not.
PROVENANCE: tuple[LlamaKey, ...] = (
    LlamaKey("dspark.export.engine", T.STRING, "const:llama.cpp 0c1e570",
             "the engine and version the file is laid out for"),
    LlamaKey("dspark.export.converter", T.STRING, "converter", "`dspark-convert <version>`"),
    LlamaKey("dspark.export.artifact_sha256", T.STRING, "artifact_sha256",
             "SHA-256 of the artifact's drafter.gguf"),
    LlamaKey("dspark.export.source_sha256", T.STRING, "artifact:dflash.source.sha256",
             "the artifact's `dflash.source.sha256` (the checkpoint's weights)"),
)
# What the export of a DFlash2 drafter or a Gemma 4 assistant records of itself: the engine
# and the converter (it is written from the runtime's plan, which may be a checkpoint
# directory: no artifact hash to record).
KIND_PROVENANCE: tuple[LlamaKey, ...] = PROVENANCE[:2]

# llama_ftype (include/llama.h) of a file whose matrices are of this type.
FILE_TYPES = {"BF16": 32, "Q8_0": 7, "Q5_0": 8, "Q4_0": 2}

# The target GGUF tensor a drafter file in the converter's layout carries (--keep-embedding).
TARGET_EMBEDDING = "token_embd.weight"
TARGET_HEAD = "output.weight"        # the target's head (absent: tied to token_embd)
# Tensor kinds (contract/tensor_table.py) stored F32 (widened from BF16), as the converter
# stores every 1-D tensor.
F32_KINDS = ("norm", "bias")

# The Markov head types llama.cpp implements (src/models/dflash.cpp: markov_w1 / markov_w2
# only; conversion/qwen.py DSparkModel refuses any other markov_head_type).
MARKOV_HEAD_TYPES = ("vanilla",)

# The target GGUF's architecture for our contract family (contract/dspark.py FeatureContract).
TARGET_ARCHITECTURES = {"qwen3-dspark": "qwen3"}


def key_doc_rows() -> list[tuple[str, str, str]]:
    """(key, type, what it holds) of every key the export writes, for docs/ENGINES.md."""
    def type_name(k: LlamaKey) -> str:
        return k.type.name + (f"[{k.sub_type.name}]" if k.sub_type is not None else "")

    rows = [(k.key, type_name(k), k.doc) for k in LLAMA_KEYS]
    rows.append(("tokenizer.*", "as in the target GGUF",
                 "every tokenizer key of the target GGUF (`tokenizer.ggml.*`, a chat template), "
                 "in its order, values and types unchanged"))
    rows.append((MASK.key, type_name(MASK), MASK.doc))
    rows += [(k.key, type_name(k), k.doc) for k in PROVENANCE]
    return rows
