"""Gemma4 checkpoints made from DeepSeek's fixtures (golden/reference/gemma4/) for the paths
those fixtures do not take (tests/test_gemma4_variants.py): a target whose full layers keep
v_proj and its drafters, other Markov and confidence heads, other target taps; and an
independent torch.nn oracle of the heads, built from a source checkpoint.

Every checkpoint is a real HF directory: the fixture's files copied, its config.json edited,
its model.safetensors rewritten with safetensors (the metadata save_pretrained writes). The
tensors kept from the fixture are its BF16 values bit for bit; the new ones are drawn from a
seeded generator and stored in BF16.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from support.gemma4 import GEMMA4_DRAFTERS, GEMMA4_TARGET
from support.heads import markov_and_confidence

FULL = "full_attention"
TARGET_LAYERS = "model.language_model.layers."
DSPARK = "gemma4_vanilla_conf_markov"
DFLASH = "gemma4_dflash"


def rewrite(src: Path, dst: Path, *, config: Callable[[dict], None] | None = None,
            tensors: Callable[[dict], None] | None = None) -> Path:
    """A copy of the HF directory ``src`` at ``dst``: config.json changed in place by
    ``config(cfg)``, model.safetensors' tensors by ``tensors(state)``."""
    shutil.copytree(src, dst)
    if config is not None:
        cfg = json.loads((dst / "config.json").read_text())
        config(cfg)
        (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    if tensors is not None:
        state = load_file(dst / "model.safetensors")
        tensors(state)
        save_file(state, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def small(shape: tuple[int, ...], seed: int, scale: float = 0.1) -> torch.Tensor:
    """Seeded N(0, scale^2) weights, stored in BF16 as DeepSpec saves them."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(torch.bfloat16)


# --- 1. a target whose full layers keep v_proj (attention_k_eq_v false) ----------------------
#
# Under k_eq_v a full layer has one KV head (num_global_key_value_heads) and V = v_norm(k_proj x).
# Without it, num_key_value_heads (2) KV heads of global_head_dim and V = v_norm(v_proj x).
# Two KV heads that are copies of the one head, each serving two of the four query heads
# (grouped-query attention), are that one head serving four; v_proj = the same rows gives
# the same V. So the twin computes what the original computes, through the v_proj path.

def two_heads(k: torch.Tensor) -> torch.Tensor:
    """[d, H], one KV head -> [2d, H], two identical heads (the BF16 bits copied)."""
    return torch.cat([k, k])


def v_proj_target(dst: Path, *, value: Callable[[torch.Tensor], torch.Tensor] = two_heads
                  ) -> Path:
    """The fixture target with attention_k_eq_v false: each full layer's k_proj the one
    head's rows twice, its v_proj ``value(k_proj)`` (the same rows by default)."""
    text = json.loads((GEMMA4_TARGET / "config.json").read_text())["text_config"]
    assert text["attention_k_eq_v"] and text["num_global_key_value_heads"] == 1
    assert text["num_key_value_heads"] == 2
    full = [i for i, kind in enumerate(text["layer_types"]) if kind == FULL]

    def tensors(state):
        for i in full:
            p = f"{TARGET_LAYERS}{i}.self_attn."
            assert p + "v_proj.weight" not in state
            k = state[p + "k_proj.weight"]
            state[p + "k_proj.weight"] = two_heads(k)
            state[p + "v_proj.weight"] = value(k)

    return rewrite(GEMMA4_TARGET, dst,
                   config=lambda cfg: cfg["text_config"].update(attention_k_eq_v=False),
                   tensors=tensors)


def v_proj_drafter(name: str, dst: Path, target: Path) -> Path:
    """Fixture drafter ``name`` as DeepSpec would have built it on ``target`` (a
    v_proj_target): attention_k_eq_v false, num_key_value_heads copied from the target's
    text_config, k_proj and v_proj the one head's rows twice."""
    text = json.loads((target / "config.json").read_text())["text_config"]
    assert not text["attention_k_eq_v"]

    def tensors(state):
        layers = {int(k.split(".")[1]) for k in state if k.startswith("layers.")}
        for i in sorted(layers):
            p = f"layers.{i}.self_attn."
            k = state[p + "k_proj.weight"]
            state[p + "k_proj.weight"] = two_heads(k)
            state[p + "v_proj.weight"] = two_heads(k)

    return rewrite(GEMMA4_DRAFTERS[name], dst, tensors=tensors, config=lambda cfg: cfg.update(
        attention_k_eq_v=False, num_key_value_heads=text["num_key_value_heads"]))


# --- 2. other heads --------------------------------------------------------------------------
#
# The fixture drafters' geometry (H 64, V 512, r 16); the backbone, fc, norms and the trained
# Markov matrices kept; the tensors a head type adds (gate_proj, joint_proj, a confidence
# projection of another width) drawn small. Names and shapes: contract/tensor_table.py
# GEMMA4_TENSOR_RULES (_HEADS).

H, R = 64, 16
CONF_KEYS = ("confidence_head.proj.weight", "confidence_head.proj.bias")


def _gated(state):
    state["markov_head.gate_proj.weight"] = small((R, H + R), 1)
    state["markov_head.gate_proj.bias"] = small((R,), 2)


def _rnn_plain_confidence(state):
    state["markov_head.joint_proj.weight"] = small((3 * R, 2 * R + H), 3)
    state["markov_head.joint_proj.bias"] = small((3 * R,), 4)
    state["confidence_head.proj.weight"] = small((1, H), 5, scale=0.3)


def _no_confidence(state):
    for key in CONF_KEYS:
        del state[key]


def _plain_confidence(state):
    state["confidence_head.proj.weight"] = small((1, H), 6, scale=0.3)
    state["confidence_head.proj.bias"] = small((1,), 7)


def _drop(*keys):
    return lambda cfg: [cfg.pop(k) for k in keys]


# name -> (fixture drafter, config edit, tensors edit)
HEAD_VARIANTS: dict[str, tuple[str, Callable, Callable]] = {
    # gated Markov head, confidence head with Markov features
    "gated_conf_markov": (DSPARK, lambda cfg: cfg.update(markov_head_type="gated"), _gated),
    # rnn Markov head, confidence head on the block hidden state alone
    "rnn_conf_plain": (DSPARK, lambda cfg: cfg.update(markov_head_type="rnn",
                                                      confidence_head_with_markov=False),
                       _rnn_plain_confidence),
    # vanilla Markov head without a confidence head (DeepSpec then writes no
    # confidence_head_with_markov)
    "vanilla_no_conf": (DSPARK, lambda cfg: (cfg.update(enable_confidence_head=False),
                                             _drop("confidence_head_with_markov")(cfg)),
                        _no_confidence),
    # no Markov head, a confidence head (necessarily without Markov features)
    "none_conf_plain": (DFLASH, lambda cfg: cfg.update(enable_confidence_head=True,
                                                       confidence_head_with_markov=False),
                        _plain_confidence),
}


def head_variant(name: str, dst: Path) -> Path:
    base, config, tensors = HEAD_VARIANTS[name]
    return rewrite(GEMMA4_DRAFTERS[base], dst, config=config, tensors=tensors)


@torch.no_grad()
def heads_oracle(source: dict[str, torch.Tensor], hb: torch.Tensor, anchor: int,
                 tokens: list[int], *, softcap: float | None, markov: str, with_markov: bool
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(base, corrected, confidence logits) of the block hidden states ``hb`` [B, H] as
    DeepSpec's modules compute them, from the SOURCE state dict (not the artifact):
    base = cap * tanh(lm_head(hb) / cap); then, in draft order, the Markov bias of the
    previous token (the anchor first) added to the capped logits (DeepSpec's draft_ops.py
    softcaps before sample_draft_tokens adds it); the confidence head reads hb (and
    W1[prev] with Markov features), never the logits (support/heads.py)."""
    V, width = source["lm_head.weight"].shape
    head = torch.nn.Linear(width, V, bias=False)
    head.weight.data = source["lm_head.weight"].float()
    base = head(hb)
    if softcap is not None:
        base = softcap * torch.tanh(base / softcap)
    corrected, conf = markov_and_confidence(source, hb, base, anchor, tokens, markov=markov,
                                            with_markov=with_markov)
    return base, corrected, conf


# --- 3. other taps ---------------------------------------------------------------------------

def tap_variant(dst: Path, taps: list[int], fc: Callable[[torch.Tensor], torch.Tensor]) -> Path:
    """The DSpark fixture drafter with ``target_layer_ids = taps`` and ``fc.weight =
    fc(the fixture's [H, 3H] fc, taps [0, 2, 4])``."""

    def tensors(state):
        state["fc.weight"] = fc(state["fc.weight"])
        assert state["fc.weight"].shape == (H, len(taps) * H)

    return rewrite(GEMMA4_DRAFTERS[DSPARK], dst, tensors=tensors,
                   config=lambda cfg: cfg.update(target_layer_ids=taps))


def fc_with_a_silent_tap(fc: torch.Tensor) -> torch.Tensor:
    """Taps [0, 2, 4] -> [0, 1, 2, 4]: the fixture's three column blocks, zeros for layer 1
    (its features then add nothing: the fused context is the fixture's)."""
    b0, b2, b4 = fc.split(H, dim=1)
    return torch.cat([b0, torch.zeros_like(b0), b2, b4], dim=1)
