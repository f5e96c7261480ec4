"""DeepSpec's Markov and confidence heads as its modules define them, built as torch.nn
modules from a SOURCE state dict (not from the artifact): the independent oracle the
runtime's heads are checked against, for Qwen3 (tests/test_runtime_drafter.py) and Gemma4
(support/gemma4_variants.heads_oracle, which adds the softcapped base logits)."""

from __future__ import annotations

import torch


@torch.no_grad()
def markov_and_confidence(source: dict[str, torch.Tensor], hb: torch.Tensor, base: torch.Tensor,
                          anchor: int, tokens: list[int], *, markov: str, with_markov: bool
                          ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(corrected, confidence logits) of the block hidden states ``hb`` [B, H] whose base
    logits are ``base`` [B, V]: in draft order, the Markov bias of the previous token (the
    anchor first) added to the base row (``markov`` none, vanilla, gated or rnn); the
    confidence head, where the source has one, reads hb (and W1[prev] with Markov
    features), never the logits."""
    f = {k: v.float() for k, v in source.items()}
    V, width = base.shape[1], hb.shape[1]
    rows, prev = [], anchor
    if markov != "none":
        r = f["markov_head.markov_w1.weight"].shape[1]
        w1 = torch.nn.Embedding(V, r)
        w1.weight.data = f["markov_head.markov_w1.weight"]
        w2 = torch.nn.Linear(r, V, bias=False)
        w2.weight.data = f["markov_head.markov_w2.weight"]
        state = torch.zeros(r)
    for k in range(len(tokens)):
        if markov == "none":
            rows.append(base[k])
        else:
            e = w1(torch.tensor(prev))
            if markov == "vanilla":
                bias = w2(e)
            elif markov == "gated":
                gate = torch.nn.Linear(width + r, r)
                gate.weight.data = f["markov_head.gate_proj.weight"]
                gate.bias.data = f["markov_head.gate_proj.bias"]
                bias = w2(torch.sigmoid(gate(torch.cat([hb[k], e]))) * e)
            else:
                joint = torch.nn.Linear(2 * r + width, 3 * r)
                joint.weight.data = f["markov_head.joint_proj.weight"]
                joint.bias.data = f["markov_head.joint_proj.bias"]
                g, c, o = joint(torch.cat([state, e, hb[k]])).chunk(3)
                state = torch.sigmoid(g) * state + (1 - torch.sigmoid(g)) * torch.tanh(c)
                bias = w2(torch.tanh(o))
            rows.append(base[k] + bias)
        prev = tokens[k]
    conf = None
    if "confidence_head.proj.weight" in f:
        proj = torch.nn.Linear(f["confidence_head.proj.weight"].shape[1], 1)
        proj.weight.data = f["confidence_head.proj.weight"]
        proj.bias.data = f["confidence_head.proj.bias"]
        feats = hb
        if with_markov:
            feats = torch.cat([hb, w1(torch.tensor([anchor] + list(tokens[:-1])))], dim=-1)
        conf = proj(feats)[:, 0]
    return torch.stack(rows), conf
