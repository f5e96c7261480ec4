"""A speculators DFlash2 drafter as llama.cpp 0c1e570 runs it: keys and tensors, as data.

``dspark export --engine llama.cpp`` of a DFlash2 drafter (commands/export.py,
``export_dflash2_llama_cpp``) writes a file by these tables. Read from llama.cpp 0c1e570 as
vendored in llama-cpp-python 0.3.36 (docs/REFERENCE.md §6): ``llama_model_dflash::
load_arch_hparams`` / ``load_arch_tensors`` (src/models/dflash.cpp: a dflash file holding
``selector_hidden.weight`` is DFlash2, and then needs the five conv/selector keys > 0, H a
multiple of conv_group_size and H >= K (K + 1)), ``build_dflash2_conv`` and
``build_dflash2_selector`` (the same layouts as speculators': ``kernel_projection`` rows
[side, tap, group], base kernels [side, tap, H], codebooks [V, R], so no tensor is
transposed), and what its converter writes for a z-lab DFlash2 checkpoint
(conversion/qwen.py ``DFlashModel``: the key names, ``dflash.target_layers`` = z-lab's
``target_layer_ids`` + 1, which are speculators' ``aux_hidden_state_layer_ids`` as they are).

What this file does not carry, on purpose:

- ``dflash.logit_scale`` and ``dflash.final_logit_softcapping``: llama.cpp applies them to a
  DFlash2 drafter's unary logits (z-lab's ``output_multiplier`` and softcap); speculators'
  DFlash2 has neither, and llama.cpp applies neither when the keys are absent;
- the embedding and the head: speculators never saves them; llama.cpp binds the target's
  (``ctx_other``), as speculators' ``load_verifier_weights`` rebuilds them from the verifier;
- ``dflash.sample_from_anchor``: llama.cpp's DFlash path reads slot 0 as the anchor (slots
  1 .. n drafted), which is speculators' DFlash2 layout (``sample_from_anchor`` false).
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf.constants import GGUFValueType

from dspark_convert.artifact.llama_cpp import KIND_PROVENANCE

T = GGUFValueType

ARCH = "dflash"
TARGET_ARCHITECTURE = "qwen3"       # the targets a speculators DFlash2 drafter is made for
MASK_KEY = "tokenizer.ggml.mask_token_id"
SELECTOR_MARKER = "selector_hidden.weight"   # what makes a dflash file DFlash2 to llama.cpp


@dataclass(frozen=True)
class Key:
    key: str
    type: GGUFValueType
    source: str          # "config:<attr>" of DFlash2Config / its layer, or a named rule
    doc: str
    sub_type: GGUFValueType | None = None


# In the order llama.cpp's converter writes them; the target's tokenizer keys follow, then
# the mask token, then our provenance (commands/export.py).
KEYS: tuple[Key, ...] = (
    Key("general.architecture", T.STRING, "const:dflash", "`dflash`"),
    Key("general.type", T.STRING, "const:model", "`model`"),
    Key("general.name", T.STRING, "name",
        "the artifact's own `general.name`, or the checkpoint directory's name"),
    Key(f"{ARCH}.block_count", T.UINT32, "layer:num_hidden_layers", "draft layers"),
    Key(f"{ARCH}.context_length", T.UINT32, "target:context_length",
        "the target GGUF's context length (llama.cpp requires the key)"),
    Key(f"{ARCH}.embedding_length", T.UINT32, "layer:hidden_size", "hidden_size"),
    Key(f"{ARCH}.feed_forward_length", T.UINT32, "layer:intermediate_size", "intermediate_size"),
    Key(f"{ARCH}.attention.head_count", T.UINT32, "layer:num_attention_heads",
        "num_attention_heads"),
    Key(f"{ARCH}.attention.head_count_kv", T.UINT32, "layer:num_key_value_heads",
        "num_key_value_heads"),
    Key(f"{ARCH}.rope.freq_base", T.FLOAT32, "rope_theta", "rope theta as f32"),
    Key(f"{ARCH}.attention.layer_norm_rms_epsilon", T.FLOAT32, "layer:rms_norm_eps",
        "rms_norm_eps"),
    Key(f"{ARCH}.attention.key_length", T.UINT32, "layer:head_dim", "head_dim"),
    Key(f"{ARCH}.attention.value_length", T.UINT32, "layer:head_dim", "head_dim"),
    Key("general.file_type", T.UINT32, "file_type", "llama_ftype of the matrices (32: BF16)"),
    Key(f"{ARCH}.block_size", T.UINT32, "config:block_size",
        "block_size (run it with --spec-draft-n-max block_size - 1)"),
    Key(f"{ARCH}.conv_kernel_size", T.UINT32, "config:conv_kernel_size", "conv_kernel_size"),
    Key(f"{ARCH}.conv_group_size", T.UINT32, "config:conv_group_size", "conv_group_size"),
    Key(f"{ARCH}.selector_rank", T.UINT32, "config:selector_rank", "selector_rank"),
    Key(f"{ARCH}.selector_top_k", T.UINT32, "config:selector_top_k", "selector_top_k"),
    Key(f"{ARCH}.target_layers", T.ARRAY, "config:aux_hidden_state_layer_ids",
        "speculators' aux_hidden_state_layer_ids as they are (= z-lab ids + 1: llama.cpp taps "
        "the input of that layer, HF's hidden_states index)", sub_type=T.INT32),
    Key(f"{ARCH}.attention.sliding_window", T.UINT32, "sliding_window",
        "sliding_window (only with sliding layers)"),
    Key(f"{ARCH}.attention.sliding_window_pattern", T.ARRAY, "sliding_pattern",
        "per layer: sliding_attention (only with sliding layers)", sub_type=T.BOOL),
    Key(f"{ARCH}.attention.causal", T.BOOL, "const:false",
        "false: the block attends to all of itself (sliding_window_non_causal true)"),
    Key("general.quantization_version", T.UINT32, "const:2", "2, as gguf-py writes it"),
)

# speculators' name -> llama.cpp's, and how it is stored: "matrix" in the checkpoint's own
# element type (BF16 stays BF16), "f32" widened exactly (1-D norms, and the base kernels,
# which ggml adds to F32 coefficients).
GLOBAL_TENSORS: tuple[tuple[str, str, str], ...] = (
    ("fc.weight", "fc.weight", "matrix"),
    ("hidden_norm.weight", "enc.output_norm.weight", "f32"),
    ("norm.weight", "output_norm.weight", "f32"),
    ("candidate_selector.predecessor_codebook", "selector_predecessor.weight", "matrix"),
    ("candidate_selector.successor_codebook", "selector_successor.weight", "matrix"),
    ("candidate_selector.hidden_projection.weight", "selector_hidden.weight", "matrix"),
)
LAYER_TENSORS: tuple[tuple[str, str, str], ...] = (
    ("input_layernorm.weight", "attn_norm.weight", "f32"),
    ("self_attn.q_proj.weight", "attn_q.weight", "matrix"),
    ("self_attn.k_proj.weight", "attn_k.weight", "matrix"),
    ("self_attn.v_proj.weight", "attn_v.weight", "matrix"),
    ("self_attn.o_proj.weight", "attn_output.weight", "matrix"),
    ("self_attn.q_norm.weight", "attn_q_norm.weight", "f32"),
    ("self_attn.k_norm.weight", "attn_k_norm.weight", "f32"),
    ("post_attention_layernorm.weight", "ffn_norm.weight", "f32"),
    ("mlp.gate_proj.weight", "ffn_gate.weight", "matrix"),
    ("mlp.up_proj.weight", "ffn_up.weight", "matrix"),
    ("mlp.down_proj.weight", "ffn_down.weight", "matrix"),
    ("attention_conv.base_kernel", "attn_conv_base", "f32"),
    ("attention_conv.kernel_projection.weight", "attn_conv_proj.weight", "matrix"),
    ("mlp_conv.base_kernel", "ffn_conv_base", "f32"),
    ("mlp_conv.kernel_projection.weight", "ffn_conv_proj.weight", "matrix"),
)


def tensor_names(num_layers: int) -> list[tuple[str, str, str]]:
    """(speculators name, llama.cpp name, storage) of every tensor, in file order."""
    rows = list(GLOBAL_TENSORS)
    for i in range(num_layers):
        rows += [(f"layers.{i}.{src}", f"blk.{i}.{dst}", how) for src, dst, how in LAYER_TENSORS]
    return rows




def key_doc_rows() -> list[tuple[str, str, str]]:
    """(key, type, what it holds), for docs/ENGINES.md."""
    def type_name(k: Key) -> str:
        return k.type.name + (f"[{k.sub_type.name}]" if k.sub_type is not None else "")

    rows = [(k.key, type_name(k), k.doc) for k in KEYS]
    rows.append(("tokenizer.*", "as in the target GGUF", "every tokenizer key of the target GGUF"))
    # Our provenance, written last (commands/export.py): the DSpark export's first two keys.
    rows += [(k.key, type_name(k), k.doc) for k in KIND_PROVENANCE]
    rows.append((MASK_KEY, "UINT32", "mask_token_id"))
    return rows
