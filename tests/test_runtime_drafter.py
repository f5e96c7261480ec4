"""runtime/drafter.py against DeepSpec's first proposal (golden first_block.safetensors), and
the gated / rnn / no-Markov heads against an independent torch.nn oracle built from the
source checkpoint (not from the artifact).

Tolerances. Our float32 arithmetic agrees with float64 to ~1e-5 (test_runtime_qwen3), but
DeepSpec's own float32 stages differ from float64 by more: measured on the golden data,
context features 1.2e-3 (values up to 9.4), block hidden 7e-5, logits 3.9e-4, confidence
logits 1.8e-5. The bounds below are about 4x those; any real mistake (a transposed matrix, a
wrong tap, a wrong RoPE position) moves these stages by 1e-1 or more.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from conftest import GOLDEN, golden_source
from dspark_convert.runtime.drafter import DSparkDrafter
from dspark_convert.runtime.qwen3 import KVCache
from dspark_convert.runtime.weights import load_drafter_weights
from support.heads import markov_and_confidence

FIRST_BLOCK = GOLDEN / "reference" / "vanilla_conf_markov" / "first_block.safetensors"
PROMPT_0 = [1, 17, 33, 90, 250, 7, 7, 401]
CPU = torch.device("cpu")
ATOL = {"context_features": 5e-3, "block_hidden": 3e-4, "base_logits": 1.5e-3,
        "corrected_logits": 1.5e-3, "confidence_logits": 1e-4}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def golden(golden_models):
    return (*golden_models, load_file(FIRST_BLOCK))


def _close(name, got, want):
    err = (got - want).abs().max().item()
    assert err <= ATOL[name], f"{name}: max abs error {err:.3g} > {ATOL[name]:g}"


def test_first_proposal_every_stage(golden):
    """Prefill the target on prompt 0, then every stage of the first proposal."""
    target, drafter, ref = golden
    out = target.forward(torch.tensor(PROMPT_0), KVCache())
    features = drafter.features(out.hidden_states)
    _close("context_features", features, ref["context_features"])
    anchor = int(out.logits[-1].argmax())
    assert [anchor] + [drafter.mask_token_id] * 6 == ref["anchor_ids"].tolist()
    drafter.reset()
    drafter.add_context(features)
    proposal = drafter.propose(anchor)
    for name in ("block_hidden", "base_logits", "corrected_logits", "confidence_logits"):
        _close(name, getattr(proposal, name), ref[name])
    assert proposal.tokens.tolist() == ref["draft_tokens"].tolist()
    assert proposal.length == 7


def test_first_proposal_from_the_reference_features(golden):
    """The drafter alone, fed DeepSpec's own context features."""
    _, drafter, ref = golden
    drafter.reset()
    drafter.add_context(ref["context_features"])
    proposal = drafter.propose(int(ref["anchor_ids"][0]))
    for name in ("block_hidden", "base_logits", "corrected_logits", "confidence_logits"):
        _close(name, getattr(proposal, name), ref[name])
    assert proposal.tokens.tolist() == ref["draft_tokens"].tolist()


def test_confidence_threshold_cuts_at_the_first_low_position(golden):
    _, drafter, ref = golden
    drafter.reset()
    drafter.add_context(ref["context_features"])
    sig = torch.sigmoid(ref["confidence_logits"])          # 0.25 0.35 0.59 0.60 0.43 0.46 0.21
    for threshold in (0.2, 0.3, 0.4, 0.5, 0.7):
        below = (sig < threshold).nonzero()
        want = int(below[0, 0]) if below.numel() else 7
        assert drafter.propose(int(ref["anchor_ids"][0]), confidence_threshold=threshold).length == want


def test_context_written_in_pieces_equals_one_piece(golden):
    """Context cells keep their positions however verification splits them."""
    _, drafter, ref = golden
    features = ref["context_features"]
    drafter.reset()
    drafter.add_context(features)
    whole = drafter.propose(251).block_hidden
    drafter.reset()
    for a, b in ((0, 3), (3, 4), (4, 8)):
        drafter.add_context(features[a:b])
    assert drafter.length == 8
    torch.testing.assert_close(drafter.propose(251).block_hidden, whole, atol=1e-5, rtol=0)


# --- the other heads, against torch.nn modules built from the source checkpoint -------------

@pytest.mark.parametrize("name", ["gated_conf_markov", "rnn_conf_plain", "vanilla_f32", "dflash_plain"])
def test_heads_match_the_oracle(converted, name):
    weights = load_drafter_weights(converted[name])
    c = weights.contract
    H, V = c.geometry.hidden_size, c.geometry.vocab_size
    gen = torch.Generator().manual_seed(11)
    embed, head = torch.randn(V, H, generator=gen), torch.randn(V, H, generator=gen)
    drafter = DSparkDrafter(weights, embed=embed, lm_head=head, device=CPU)
    drafter.add_context(torch.randn(5, c.taps.feature_width, generator=gen))
    proposal = drafter.propose(17)
    source = load_file(golden_source(name) / "model.safetensors")
    if name == "vanilla_f32":     # the artifact holds the BF16 rounding of an F32 source
        source = {k: v.to(torch.bfloat16) for k, v in source.items()}
    torch.testing.assert_close(proposal.base_logits, proposal.block_hidden @ head.T, atol=1e-5, rtol=0)
    corrected, conf = markov_and_confidence(source, proposal.block_hidden, proposal.base_logits,
                                            17, proposal.tokens.tolist(), markov=c.markov_head.type,
                                            with_markov=c.confidence_head.with_markov)
    torch.testing.assert_close(proposal.corrected_logits, corrected, atol=1e-4, rtol=1e-5)
    assert proposal.tokens.tolist() == corrected.argmax(-1).tolist()
    if conf is None:
        assert proposal.confidence_logits is None
    else:
        torch.testing.assert_close(proposal.confidence_logits, conf, atol=1e-5, rtol=1e-5)


def test_sampled_drafting_is_seeded(golden):
    _, drafter, ref = golden
    drafter.reset()
    drafter.add_context(ref["context_features"])
    draws = [drafter.propose(251, temperature=1.0, generator=torch.Generator().manual_seed(s)).tokens.tolist()
             for s in (3, 3, 4)]
    assert draws[0] == draws[1] != draws[2]
