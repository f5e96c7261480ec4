"""A Gemma 4 assistant (MTP drafter) as llama.cpp 0c1e570 runs it: keys and tensors, as data.

``dspark export --engine llama.cpp`` of a Gemma 4 assistant (commands/export.py,
``export_assistant_llama_cpp``) writes a file by these tables: what llama.cpp's own
converter writes for the same checkpoint (conversion/gemma.py ``Gemma4AssistantModel`` on
``Gemma4Model``: the Gemma 4 keys, ``embedding_length_out`` = backbone_hidden_size,
``nextn_predict_layers`` = the layer count, ``rope_freqs`` for the full layers' proportional
RoPE, ``masked_embedding.*`` dropped; measured key for key and tensor for tensor on the
golden assistant, tests/test_llama_cpp_assistant.py), and what its runtime reads
(src/models/gemma4-assistant.cpp ``load_arch_hparams`` / ``load_arch_tensors``; the KV it
reads is the target's layers n_layer - 2 (sliding) and n_layer - 1 (full),
src/llama-model.cpp:2809-2818).

Two departures from the converter's file, both so that llama.cpp loads what the checkpoint
is: the embedding keeps every row of the checkpoint (the converter cuts
``token_embd.weight`` to the tokenizer's token count, Gemma3Model.modify_tensors, which
llama.cpp then refuses beside a vocabulary padded to the model's rows), and the tokenizer
is the target GGUF's (the converter needs tokenizer files in the assistant's directory,
which a transformers assistant checkpoint need not have).
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf.constants import GGUFValueType

from dspark_convert.artifact.llama_cpp import KIND_PROVENANCE

T = GGUFValueType

ARCH = "gemma4-assistant"
TARGET_ARCHITECTURE = "gemma4"
SLIDING, FULL = "sliding_attention", "full_attention"
# The value of a rope_freqs entry for a pair that does not rotate (the converter's: ggml's
# NEOX RoPE rotates the first pairs only, so the unrotated pairs get a huge frequency factor,
# conversion/gemma.py Gemma4Model.generate_extra_tensors).
UNROTATED_FREQ = 1e30


@dataclass(frozen=True)
class Key:
    key: str
    type: GGUFValueType
    source: str          # a named rule of commands/export.py's assistant export
    doc: str
    sub_type: GGUFValueType | None = None


A = ARCH
KEYS: tuple[Key, ...] = (
    Key("general.architecture", T.STRING, "const:gemma4-assistant", "`gemma4-assistant`"),
    Key("general.type", T.STRING, "const:model", "`model`"),
    Key("general.name", T.STRING, "name",
        "the artifact's own `general.name`, or the checkpoint directory's name"),
    Key(f"{A}.block_count", T.UINT32, "layers", "text_config.num_hidden_layers"),
    Key(f"{A}.context_length", T.UINT32, "target:context_length", "the target GGUF's"),
    Key(f"{A}.embedding_length", T.UINT32, "hidden", "text_config.hidden_size"),
    Key(f"{A}.feed_forward_length", T.UINT32, "intermediate", "text_config.intermediate_size"),
    Key(f"{A}.attention.head_count", T.UINT32, "heads", "text_config.num_attention_heads"),
    Key(f"{A}.attention.head_count_kv", T.ARRAY, "kv_heads",
        "per layer, its KV heads (the target's of that layer type)", sub_type=T.INT32),
    Key(f"{A}.rope.freq_base", T.FLOAT32, "full_theta", "the full layers' rope_theta"),
    Key(f"{A}.rope.freq_base_swa", T.FLOAT32, "sliding_theta", "the sliding layers' rope_theta"),
    Key(f"{A}.attention.layer_norm_rms_epsilon", T.FLOAT32, "eps", "text_config.rms_norm_eps"),
    Key(f"{A}.attention.key_length", T.UINT32, "full_head_dim", "the full layers' head_dim"),
    Key(f"{A}.attention.value_length", T.UINT32, "full_head_dim", "the full layers' head_dim"),
    Key("general.file_type", T.UINT32, "file_type", "llama_ftype of the matrices (32: BF16)"),
    Key(f"{A}.attention.sliding_window", T.UINT32, "window", "text_config.sliding_window"),
    Key(f"{A}.attention.shared_kv_layers", T.UINT32, "layers",
        "every layer reads the target's KV"),
    Key(f"{A}.embedding_length_per_layer_input", T.UINT32, "const:0", "0"),
    Key(f"{A}.attention.sliding_window_pattern", T.ARRAY, "pattern",
        "per layer: sliding_attention", sub_type=T.BOOL),
    Key(f"{A}.attention.key_length_swa", T.UINT32, "sliding_head_dim",
        "the sliding layers' head_dim"),
    Key(f"{A}.attention.value_length_swa", T.UINT32, "sliding_head_dim",
        "the sliding layers' head_dim"),
    Key(f"{A}.rope.dimension_count", T.UINT32, "full_head_dim",
        "the full layers' head_dim (proportional RoPE through rope_freqs)"),
    Key(f"{A}.rope.dimension_count_swa", T.UINT32, "sliding_head_dim",
        "the sliding layers' head_dim"),
    Key(f"{A}.embedding_length_out", T.UINT32, "backbone", "backbone_hidden_size"),
    Key(f"{A}.nextn_predict_layers", T.UINT32, "layers", "the layer count"),
    Key("general.quantization_version", T.UINT32, "const:2", "2, as gguf-py writes it"),
)

# transformers' name -> llama.cpp's, and how it is stored ("matrix": the checkpoint's own
# element type; "f32": widened exactly, as the converter stores 1-D tensors).
GLOBAL_TENSORS: tuple[tuple[str, str, str], ...] = (
    ("model.embed_tokens.weight", "token_embd.weight", "matrix"),
    ("model.norm.weight", "output_norm.weight", "f32"),
    ("pre_projection.weight", "nextn.pre_projection.weight", "matrix"),
    ("post_projection.weight", "nextn.post_projection.weight", "matrix"),
)
LAYER_TENSORS: tuple[tuple[str, str, str], ...] = (
    ("input_layernorm.weight", "attn_norm.weight", "f32"),
    ("self_attn.q_proj.weight", "attn_q.weight", "matrix"),
    ("self_attn.q_norm.weight", "attn_q_norm.weight", "f32"),
    ("self_attn.o_proj.weight", "attn_output.weight", "matrix"),
    ("post_attention_layernorm.weight", "post_attention_norm.weight", "f32"),
    ("pre_feedforward_layernorm.weight", "ffn_norm.weight", "f32"),
    ("mlp.gate_proj.weight", "ffn_gate.weight", "matrix"),
    ("mlp.up_proj.weight", "ffn_up.weight", "matrix"),
    ("mlp.down_proj.weight", "ffn_down.weight", "matrix"),
    ("post_feedforward_layernorm.weight", "post_ffw_norm.weight", "f32"),
    ("layer_scalar", "layer_output_scale.weight", "f32"),
)
ROPE_FREQS = "rope_freqs.weight"      # F32 [full head_dim / 2], computed (no source tensor)


def tensor_names(num_layers: int) -> list[tuple[str, str, str]]:
    """(transformers name, llama.cpp name, storage) of every stored tensor, in file order
    (``rope_freqs.weight`` is computed and written first when there is a full layer)."""
    rows = list(GLOBAL_TENSORS)
    for i in range(num_layers):
        rows += [(f"model.layers.{i}.{src}", f"blk.{i}.{dst}", how)
                 for src, dst, how in LAYER_TENSORS]
    return rows


def rope_freqs(head_dim: int, rotated_pairs: int) -> list[float]:
    """The full layers' rope_freqs: 1 for each rotated pair, UNROTATED_FREQ for the rest."""
    return [1.0] * rotated_pairs + [UNROTATED_FREQ] * (head_dim // 2 - rotated_pairs)




def key_doc_rows() -> list[tuple[str, str, str]]:
    def type_name(k: Key) -> str:
        return k.type.name + (f"[{k.sub_type.name}]" if k.sub_type is not None else "")

    rows = [(k.key, type_name(k), k.doc) for k in KEYS]
    rows.append(("tokenizer.*", "as in the target GGUF", "every tokenizer key of the target GGUF"))
    # Our provenance, written last (commands/export.py): the DSpark export's first two keys.
    rows += [(k.key, type_name(k), k.doc) for k in KIND_PROVENANCE]
    return rows
