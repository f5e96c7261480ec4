"""The tensor table: every DSpark source tensor, its GGUF name and its shape, as data.

This one table is used by the contract (which tensors a checkpoint must hold), the writer
(names and order in drafter.gguf), the validator (what an artifact must hold) and the
generated docs (docs/ARTIFACT_FORMAT.md), in the manner of gguf-py's ``constants.py``.

Shapes are written in torch order ``[out, in]`` as small expressions over the geometry
symbols below; GGUF stores the reverse (``ne0 = in``). An expression is a sum of terms,
each an optional integer factor times symbols joined by ``*`` (``2*r+H``, ``m*H``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

# Symbol -> what it means; the contract supplies the values.
SYMBOLS: dict[str, str] = {
    "H": "hidden_size",
    "I": "intermediate_size",
    "V": "vocab_size",
    "nh": "num_attention_heads",
    "nkv": "num_key_value_heads",
    "d": "head_dim",
    "m": "len(target_layer_ids), the number of target feature taps",
    "r": "markov_rank",
    "rc": "markov_rank if confidence_head_with_markov else 0",
    # DFlash2 (speculators' DFlash2DraftModel; docs/REFERENCE.md "DFlash2")
    "R": "selector_rank (DFlash2)",
    "k": "conv_kernel_size (DFlash2)",
    "G": "hidden_size / conv_group_size (DFlash2: the conv's channel groups)",
    # The Gemma 4 assistant (docs/REFERENCE.md "The Gemma 4 assistant")
    "Hb": "backbone_hidden_size, the target's hidden size (assistant)",
    "dl": "the layer's head_dim, by its layer type (assistant)",
}

# Which heads a tensor belongs to. "embedding": optional in the source, hashed, never written.
# "v_proj": a Gemma4 drafter's value projection, present only without attention_k_eq_v.
Condition = Literal["always", "embedding", "markov", "gated", "rnn", "confidence", "v_proj"]
# "scalar": a Gemma4 layer's layer_scalar [1], which multiplies the residual stream.
# "conv": a DFlash2 conv's base kernel [2, k, H]; "codebook": a DFlash2 selector codebook
# [V, R] (a plain parameter, indexed by token id).
Kind = Literal["matrix", "norm", "bias", "embedding", "scalar", "conv", "codebook"]


@dataclass(frozen=True)
class TensorRule:
    source: str                 # HF state-dict name; "{i}" is the draft layer index
    gguf: str | None            # GGUF name; None = never written (hashed and stripped)
    shape: tuple[str, ...]      # torch order, expressions over SYMBOLS
    kind: Kind
    when: Condition = "always"

    @property
    def per_layer(self) -> bool:
        return "{i}" in self.source


def _layer(source: str, gguf: str, shape: tuple[str, ...], kind: Kind) -> TensorRule:
    return TensorRule(f"layers.{{i}}.{source}", f"blk.{{i}}.{gguf}", shape, kind)


# The order here is the order of tensors in drafter.gguf (per-layer rules repeat per layer).
# What every family's drafter has before its layers: the frozen embedding and head copies
# (hashed, stripped), the feature projection and its norm, the final norm.
_FRONT: tuple[TensorRule, ...] = (
    TensorRule("embed_tokens.weight", None, ("V", "H"), "embedding", "embedding"),
    TensorRule("lm_head.weight", None, ("V", "H"), "embedding", "embedding"),
    TensorRule("fc.weight", "fc.weight", ("H", "m*H"), "matrix"),
    TensorRule("hidden_norm.weight", "enc.output_norm.weight", ("H",), "norm"),
    TensorRule("norm.weight", "output_norm.weight", ("H",), "norm"),
)
# ... and after them: the Markov head (vanilla, gated, rnn) and the confidence head.
_HEADS: tuple[TensorRule, ...] = (
    TensorRule("markov_head.markov_w1.weight", "markov_w1.weight", ("V", "r"), "matrix", "markov"),
    TensorRule("markov_head.markov_w2.weight", "markov_w2.weight", ("V", "r"), "matrix", "markov"),
    TensorRule("markov_head.gate_proj.weight", "markov_gate.weight", ("r", "H+r"), "matrix", "gated"),
    TensorRule("markov_head.gate_proj.bias", "markov_gate.bias", ("r",), "bias", "gated"),
    TensorRule("markov_head.joint_proj.weight", "markov_joint.weight", ("3*r", "2*r+H"), "matrix", "rnn"),
    TensorRule("markov_head.joint_proj.bias", "markov_joint.bias", ("3*r",), "bias", "rnn"),
    TensorRule("confidence_head.proj.weight", "conf_proj.weight", ("1", "H+rc"), "matrix", "confidence"),
    TensorRule("confidence_head.proj.bias", "conf_proj.bias", ("1",), "bias", "confidence"),
)

TENSOR_RULES: tuple[TensorRule, ...] = _FRONT + (
    _layer("input_layernorm.weight", "attn_norm.weight", ("H",), "norm"),
    _layer("post_attention_layernorm.weight", "ffn_norm.weight", ("H",), "norm"),
    _layer("self_attn.q_proj.weight", "attn_q.weight", ("nh*d", "H"), "matrix"),
    _layer("self_attn.k_proj.weight", "attn_k.weight", ("nkv*d", "H"), "matrix"),
    _layer("self_attn.v_proj.weight", "attn_v.weight", ("nkv*d", "H"), "matrix"),
    _layer("self_attn.o_proj.weight", "attn_output.weight", ("H", "nh*d"), "matrix"),
    _layer("self_attn.q_norm.weight", "attn_q_norm.weight", ("d",), "norm"),
    _layer("self_attn.k_norm.weight", "attn_k_norm.weight", ("d",), "norm"),
    _layer("mlp.gate_proj.weight", "ffn_gate.weight", ("I", "H"), "matrix"),
    _layer("mlp.up_proj.weight", "ffn_up.weight", ("I", "H"), "matrix"),
    _layer("mlp.down_proj.weight", "ffn_down.weight", ("H", "I"), "matrix"),
) + _HEADS

# The Gemma4DSparkModel table (docs/REFERENCE.md §10.2, §10.3: DeepSpec's
# deepspec/modeling/dspark/gemma4/modeling.py): the drafter's attention has the target's
# *global* geometry (d = global_head_dim, nkv = num_global_key_value_heads under
# attention_k_eq_v), no v_proj under k_eq_v, four norms per layer (Gemma's sandwich) and a
# saved layer_scalar buffer. Per-layer rules follow the source's own key order. GGUF names
# follow llama.cpp's Gemma 3 names for the extra norms and its layer_output_scale (format
# version 2, docs/ARTIFACT_FORMAT.md "Drafter families").
GEMMA4_TENSOR_RULES: tuple[TensorRule, ...] = _FRONT + (
    _layer("layer_scalar", "layer_output_scale.weight", ("1",), "scalar"),
    _layer("self_attn.q_proj.weight", "attn_q.weight", ("nh*d", "H"), "matrix"),
    _layer("self_attn.k_proj.weight", "attn_k.weight", ("nkv*d", "H"), "matrix"),
    TensorRule("layers.{i}.self_attn.v_proj.weight", "blk.{i}.attn_v.weight", ("nkv*d", "H"),
               "matrix", "v_proj"),
    _layer("self_attn.o_proj.weight", "attn_output.weight", ("H", "nh*d"), "matrix"),
    _layer("self_attn.q_norm.weight", "attn_q_norm.weight", ("d",), "norm"),
    _layer("self_attn.k_norm.weight", "attn_k_norm.weight", ("d",), "norm"),
    _layer("mlp.gate_proj.weight", "ffn_gate.weight", ("I", "H"), "matrix"),
    _layer("mlp.up_proj.weight", "ffn_up.weight", ("I", "H"), "matrix"),
    _layer("mlp.down_proj.weight", "ffn_down.weight", ("H", "I"), "matrix"),
    _layer("input_layernorm.weight", "attn_norm.weight", ("H",), "norm"),
    _layer("post_attention_layernorm.weight", "post_attention_norm.weight", ("H",), "norm"),
    _layer("pre_feedforward_layernorm.weight", "ffn_norm.weight", ("H",), "norm"),
    _layer("post_feedforward_layernorm.weight", "post_ffw_norm.weight", ("H",), "norm"),
) + _HEADS

# The DFlash2DraftModel table (speculators 0.9.0, models/dflash2/model_definitions.py:130-135,
# 261-263; dflash/core.py:122-130): speculators saves neither the embedding nor the head
# (the target's, as load_verifier_weights rebuilds them), so no rule names them. GGUF
# names are llama.cpp 0c1e570's for a DFlash2 drafter (its DFlashModel converter,
# conversion/qwen.py:664, and src/models/dflash.cpp): the conv bases have no ``.weight``
# suffix there, the selector's tensors are ``selector_*.weight``. The order is speculators'
# own: the globals, then each layer's tensors.
DFLASH2_TENSOR_RULES: tuple[TensorRule, ...] = (
    TensorRule("fc.weight", "fc.weight", ("H", "m*H"), "matrix"),
    TensorRule("hidden_norm.weight", "enc.output_norm.weight", ("H",), "norm"),
    TensorRule("norm.weight", "output_norm.weight", ("H",), "norm"),
    TensorRule("candidate_selector.predecessor_codebook", "selector_predecessor.weight",
               ("V", "R"), "codebook"),
    TensorRule("candidate_selector.successor_codebook", "selector_successor.weight",
               ("V", "R"), "codebook"),
    TensorRule("candidate_selector.hidden_projection.weight", "selector_hidden.weight",
               ("R", "H"), "matrix"),
    _layer("input_layernorm.weight", "attn_norm.weight", ("H",), "norm"),
    _layer("post_attention_layernorm.weight", "ffn_norm.weight", ("H",), "norm"),
    _layer("self_attn.q_proj.weight", "attn_q.weight", ("nh*d", "H"), "matrix"),
    _layer("self_attn.k_proj.weight", "attn_k.weight", ("nkv*d", "H"), "matrix"),
    _layer("self_attn.v_proj.weight", "attn_v.weight", ("nkv*d", "H"), "matrix"),
    _layer("self_attn.o_proj.weight", "attn_output.weight", ("H", "nh*d"), "matrix"),
    _layer("self_attn.q_norm.weight", "attn_q_norm.weight", ("d",), "norm"),
    _layer("self_attn.k_norm.weight", "attn_k_norm.weight", ("d",), "norm"),
    _layer("mlp.gate_proj.weight", "ffn_gate.weight", ("I", "H"), "matrix"),
    _layer("mlp.up_proj.weight", "ffn_up.weight", ("I", "H"), "matrix"),
    _layer("mlp.down_proj.weight", "ffn_down.weight", ("H", "I"), "matrix"),
    TensorRule("layers.{i}.attention_conv.base_kernel", "blk.{i}.attn_conv_base",
               ("2", "k", "H"), "conv"),
    _layer("attention_conv.kernel_projection.weight", "attn_conv_proj.weight",
           ("2*k*G", "H"), "matrix"),
    TensorRule("layers.{i}.mlp_conv.base_kernel", "blk.{i}.ffn_conv_base", ("2", "k", "H"),
               "conv"),
    _layer("mlp_conv.kernel_projection.weight", "ffn_conv_proj.weight", ("2*k*G", "H"),
           "matrix"),
)


def _assistant_layer(source: str, gguf: str, shape: tuple[str, ...], kind: Kind) -> TensorRule:
    return TensorRule(f"model.layers.{{i}}.{source}", f"blk.{{i}}.{gguf}", shape, kind)


# The Gemma4UnifiedAssistantForCausalLM table (transformers 5.19,
# modeling_gemma4_unified_assistant.py; contract/gemma4_assistant.tensor_shapes): no layer
# has k/v projections (each reads the target's KV), a layer's head dim is its layer type's
# (``dl``). The assistant's own embedding is its tied output head: written (token_embd, as
# llama.cpp 0c1e570's Gemma4AssistantModel converter writes it, conversion/gemma.py:933),
# never stripped. GGUF names are that converter's.
ASSISTANT_TENSOR_RULES: tuple[TensorRule, ...] = (
    TensorRule("model.embed_tokens.weight", "token_embd.weight", ("V", "H"), "embedding"),
    TensorRule("model.norm.weight", "output_norm.weight", ("H",), "norm"),
    TensorRule("pre_projection.weight", "nextn.pre_projection.weight", ("H", "2*Hb"), "matrix"),
    TensorRule("post_projection.weight", "nextn.post_projection.weight", ("Hb", "H"), "matrix"),
    _assistant_layer("input_layernorm.weight", "attn_norm.weight", ("H",), "norm"),
    _assistant_layer("post_attention_layernorm.weight", "post_attention_norm.weight", ("H",),
                     "norm"),
    _assistant_layer("pre_feedforward_layernorm.weight", "ffn_norm.weight", ("H",), "norm"),
    _assistant_layer("post_feedforward_layernorm.weight", "post_ffw_norm.weight", ("H",), "norm"),
    _assistant_layer("layer_scalar", "layer_output_scale.weight", ("1",), "scalar"),
    _assistant_layer("self_attn.q_proj.weight", "attn_q.weight", ("nh*dl", "H"), "matrix"),
    _assistant_layer("self_attn.q_norm.weight", "attn_q_norm.weight", ("dl",), "norm"),
    _assistant_layer("self_attn.o_proj.weight", "attn_output.weight", ("H", "nh*dl"), "matrix"),
    _assistant_layer("mlp.gate_proj.weight", "ffn_gate.weight", ("I", "H"), "matrix"),
    _assistant_layer("mlp.up_proj.weight", "ffn_up.weight", ("I", "H"), "matrix"),
    _assistant_layer("mlp.down_proj.weight", "ffn_down.weight", ("H", "I"), "matrix"),
)

# GGUF names Strata refuses outright: the embedding and head are bound from the target.
FORBIDDEN_GGUF_NAMES: tuple[str, ...] = ("token_embd.weight", "output.weight")

_TERM = re.compile(r"^(?:(\d+)\*)?([A-Za-z]+(?:\*[A-Za-z]+)*)$|^(\d+)$")


def eval_dim(expr: str, values: dict[str, int]) -> int:
    """Evaluate one shape expression such as ``2*r+H`` against symbol values."""
    total = 0
    for term in expr.split("+"):
        match = _TERM.match(term)
        if match is None:
            raise ValueError(f"bad shape expression {expr!r}")
        coeff, symbols, constant = match.groups()
        if constant is not None:
            total += int(constant)
            continue
        product = int(coeff) if coeff else 1
        for sym in symbols.split("*"):
            product *= values[sym]
        total += product
    return total


def pretty_dim(expr: str) -> str:
    """The expression as the docs write it: ``m·H``, ``2r+H``."""
    return re.sub(r"(\d)\*", r"\1", expr).replace("*", "·")


def expand_rule(rule: TensorRule, num_layers: int) -> list[tuple[str, str | None, int | None]]:
    """(source name, gguf name, layer index or None) for every tensor a rule stands for."""
    if not rule.per_layer:
        return [(rule.source, rule.gguf, None)]
    return [(rule.source.format(i=i), rule.gguf.format(i=i) if rule.gguf else None, i)
            for i in range(num_layers)]
