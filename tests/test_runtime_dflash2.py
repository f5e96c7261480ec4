"""runtime/dflash2.py and runtime/dflash2_loop.py against speculators' own DFlash2 traces
(golden/reference/dflash2: a drafter made, saved and run by speculators 0.9.0's code).

Tolerance (float32). Each float stage of the first proposal is compared by its largest
absolute error relative to the stage's own scale (max |reference|): REL_TOL = 1e-5.
Measured: 6.8e-7 at most over every stage (the MLP conv's input; its output 2.8e-7 of values
up to 331, unary logits 2.6e-7, selector scores 3.1e-7; the embedding and the first conv's
output exactly), the rounding of two float32 computations that order their sums
differently; the bound is about 15x that. Every integer stage (anchor ids, candidates, chosen
index, drafts) must be equal. The reference's own ablation (identity convolutions) and a slip
of each DFlash2 part move the stage it changes by 9e-2 to 1.4 of its scale, and RoPE tables
rounded to bfloat16 by 3.5e-4, 35x the bound (``test_ablations_and_slips_exceed_the_tolerance``);
the ablations' drafts differ from the reference's
(``test_the_reference_ablations_are_reproduced_and_differ``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import GOLDEN
from dspark_convert.contract.dflash2 import parse_config
from dspark_convert.errors import (DFlash2ConfigError, DFlash2RunError, MissingTensorError,
                                   TensorDtypeError, TensorShapeError, UnexpectedTensorError)
from dspark_convert.runtime import dflash2 as dflash2_runtime
from dspark_convert.runtime.dflash2 import (DFlash2Drafter, check_target, load_drafter,
                                            load_weights, plan_drafter)
from dspark_convert.runtime.dflash2_loop import dflash2_generate
from dspark_convert.runtime.qwen3 import KVCache, Qwen3Target
from dspark_convert.runtime.speculative import target_greedy
from support.edited import edited_copy

FIXTURE = GOLDEN / "reference" / "dflash2"
DRAFT = FIXTURE / "draft"
TARGET = GOLDEN / "reference" / "target"
REFERENCE = json.loads((FIXTURE / "reference.json").read_text())
PROMPTS = REFERENCE["prompts"]
CPU = torch.device("cpu")
REL_TOL = 1e-5
FLOAT_STAGES = ("context_features", "context_hidden", "noise_embedding",
                "layer0.attention_conv.in_conv", "layer0.attention_conv.out_conv",
                "layer0.mlp_conv.in_conv", "layer0.mlp_conv.out_conv", "layer_out.0",
                "layer_out.1", "block_hidden", "unary_logits", "selector_hidden_projection",
                "selector_scores")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def target():
    return Qwen3Target(TARGET, device=CPU)


@pytest.fixture(scope="module")
def drafter(target):
    return load_drafter(DRAFT, target)


@pytest.fixture(scope="module")
def first_block():
    return load_file(FIXTURE / "first_block.safetensors")


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want).abs().max() / want.abs().max())


def _first_block(target, drafter, *, features=None):
    """Every stage of the first proposal after prefilling prompt 0, named as the fixture
    names them; ``features``: the reference's context features instead of ours."""
    out = target.forward(torch.tensor(PROMPTS[0]), KVCache())
    ours = drafter.features(out.hidden_states)
    features = ours if features is None else features
    anchor = int(out.logits[-1].argmax())
    drafter.reset()
    drafter.add_context(features)
    stages = {"context_features": ours, "context_hidden": drafter.fused_context(features)}
    proposal = drafter.propose(anchor, stages=stages)
    stages.update({
        "anchor_ids": torch.tensor([anchor] + [drafter.mask_token_id] * 7),
        "block_hidden": proposal.block_hidden, "unary_logits": proposal.unary_logits,
        "selector_hidden_projection": proposal.hidden_projection,
        "selector_candidates": proposal.candidates, "selector_scores": proposal.scores,
        "selector_chosen_index": proposal.chosen_index, "draft_tokens": proposal.tokens,
        "unary_argmax_tokens": proposal.unary_logits[1:].argmax(-1)})
    return stages


def _stage_failures(stages, ref) -> list[str]:
    failures = [f"{name}: {_relative_error(stages[name], ref[name]):.3g} of its scale"
                for name in FLOAT_STAGES if _relative_error(stages[name], ref[name]) > REL_TOL]
    failures += [name for name in ("anchor_ids", "selector_candidates", "selector_chosen_index",
                                   "draft_tokens", "unary_argmax_tokens")
                 if stages[name].tolist() != ref[name].tolist()]
    return failures


# --- the first proposal, stage by stage -----------------------------------------------------

def test_first_proposal_every_stage(target, drafter, first_block):
    """Prefill the target on prompt 0, then every stage speculators recorded."""
    stages = _first_block(target, drafter)
    assert set(first_block) <= set(stages)
    assert _stage_failures(stages, first_block) == []
    assert stages["draft_tokens"].tolist() == REFERENCE["runs"][0]["cycles"][0]["proposed"]


def test_first_proposal_from_the_reference_features(target, drafter, first_block):
    """The drafter alone, fed speculators' own context features."""
    stages = _first_block(target, drafter, features=first_block["context_features"])
    stages["context_features"] = first_block["context_features"]
    assert _stage_failures(stages, first_block) == []


# --- the reference's ablations, and slips of each part, exceed the tolerance -----------------

def _identity_convs(tensors: dict) -> dict:
    """speculators' reset_convolutions(): base_kernel tap 0 = 1, other taps 0, projection 0."""
    out = dict(tensors)
    for name, value in tensors.items():
        if name.endswith("base_kernel"):
            out[name] = torch.zeros_like(value)
            out[name][:, 0] = 1.0
        elif name.endswith("kernel_projection.weight"):
            out[name] = torch.zeros_like(value)
    return out


def _variant(target, *, tensors=None, config=None) -> DFlash2Drafter:
    weights = load_weights(plan_drafter(DRAFT), device=CPU, dtype=torch.float32)
    weights = dataclasses.replace(weights, tensors=tensors(weights.tensors) if tensors else
                                  weights.tensors,
                                  config=weights.config.model_copy(update=config or {}))
    return DFlash2Drafter(weights, embed=target.embed, lm_head=target.lm_head, device=CPU)


def _first_proposal(target, drafter, prompt):
    out = target.forward(torch.tensor(prompt), KVCache())
    drafter.reset()
    drafter.add_context(drafter.features(out.hidden_states))
    return drafter.propose(int(out.logits[-1].argmax()))


def test_the_reference_ablations_are_reproduced_and_differ(target, drafter):
    """Each prompt's first proposal: the selector path, speculators' identity-conv path and
    the unary argmax (no selector), all three as the fixture records them; the ablations'
    drafts differ from the selector path's, so a runtime without the convolutions or
    without the selector fails the token checks."""
    identity = _variant(target, tensors=_identity_convs)
    for i, prompt in enumerate(PROMPTS):
        ablation = REFERENCE["ablations_first_proposal"][f"prompt{i}"]
        proposal = _first_proposal(target, drafter, prompt)
        assert proposal.tokens.tolist() == ablation["selector_path"]
        assert proposal.unary_logits[1:].argmax(-1).tolist() == ablation["unary_argmax"]
        assert _first_proposal(target, identity, prompt).tokens.tolist() == \
            ablation["identity_conv_path"]
        assert ablation["unary_argmax"] != ablation["selector_path"]
        assert ablation["identity_conv_path"] != ablation["selector_path"]


class _FirstSlotPredecessorIsTheMask(DFlash2Drafter):
    """Slip: the walk starts from the mask token instead of the anchor."""

    def propose_from(self, anchor, hb):
        return super().propose_from(self.mask_token_id, hb)


class _ConvOnTheResidual(DFlash2Drafter):
    """Slip: the output-side coefficients taken from the sublayer's output."""

    def _finish(self, prefix, out, dyn):
        k, groups = self.config.conv_kernel_size, self.config.num_groups
        from_output = torch.nn.functional.linear(out, self.w[prefix + "kernel_projection.weight"])
        return super()._finish(prefix, out, from_output.view(out.shape[0], 2, k, groups)[:, 1])


def _rope_tables_from_bfloat16(target):
    """Slip: RoPE frequencies rounded to bfloat16 (what the DeepSpec fixtures' makers did
    by accident: golden/reference/README.md), float32 everything else."""
    drafter = _variant(target)
    drafter.rope.inv_freq = drafter.rope.inv_freq.to(torch.bfloat16).float()
    return drafter


def _slip(target, cls):
    plain = load_weights(plan_drafter(DRAFT), device=CPU, dtype=torch.float32)
    return cls(plain, embed=target.embed, lm_head=target.lm_head, device=CPU)


@pytest.mark.parametrize("make, stage", [
    (lambda t: _variant(t, tensors=_identity_convs), "layer0.attention_conv.in_conv"),
    (lambda t: _variant(t, config={"sliding_window_non_causal": False}), "layer_out.0"),
    (lambda t: _slip(t, _ConvOnTheResidual), "layer0.attention_conv.out_conv"),
    (lambda t: _slip(t, _FirstSlotPredecessorIsTheMask), "selector_scores"),
    (_rope_tables_from_bfloat16, "layer0.attention_conv.out_conv"),
], ids=["identity-convs", "block-causal-sliding-layer", "finish-kernel-from-output",
        "walk-from-the-mask", "rope-in-bfloat16"])
def test_ablations_and_slips_exceed_the_tolerance(target, first_block, make, stage):
    """speculators' own ablation (identity convolutions) and a slip of each DFlash2 part
    move the stage they change by more than REL_TOL: the stage checks discriminate.
    Measured: 0.09 to 1.4 of the stage's scale; the subtlest, RoPE tables rounded to
    bfloat16, 3.5e-4 (35x REL_TOL), with the first block's tokens unchanged."""
    stages = _first_block(target, make(target))
    assert _relative_error(stages[stage], first_block[stage]) > 10 * REL_TOL
    assert _stage_failures(stages, first_block)


# --- the sliding window --------------------------------------------------------------------

def test_sliding_window_is_the_reference_mask(target, drafter):
    """speculators' anchor-block mask (dflash/attention.py): a sliding layer's block sees the
    context positions in [anchor - W, anchor) and its whole block; a full layer the whole
    context. The fixture's contexts (at most 31 positions) never reach its window of 64,
    so the window is checked here against that mask written out, on a longer context and
    W = 5."""
    small = _variant(target, config={"transformer_layer_config": drafter.config.layer.model_copy(
        update={"sliding_window": 5})})
    gen = torch.Generator().manual_seed(3)
    small.reset()
    small.add_context(torch.randn(20, 192, generator=gen))
    nh, nkv, d, B = small.heads, small.kv_heads, small.head_dim, small.block_size
    q = torch.randn(nh, B, d, generator=gen)
    k, v = torch.randn(nkv, B, d, generator=gen), torch.randn(nkv, B, d, generator=gen)
    anchor = small.length
    for layer, window in ((0, 5), (1, None)):
        keys = torch.cat([small.ctx_keys[layer], k], 1).repeat_interleave(nh // nkv, 0)
        values = torch.cat([small.ctx_values[layer], v], 1).repeat_interleave(nh // nkv, 0)
        kv_pos = torch.arange(anchor + B)
        seen = (kv_pos < anchor) & ((kv_pos >= anchor - window) if window else True)
        mask = (seen | (kv_pos >= anchor)).expand(B, -1)
        want = torch.nn.functional.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, scale=d ** -0.5).transpose(0, 1).reshape(B, -1)
        torch.testing.assert_close(small._attend(layer, small, q, k, v), want, atol=1e-6,
                                   rtol=0)
    assert not torch.allclose(small._attend(0, small, q, k, v), small._attend(1, small, q, k, v))


# --- the reference runs, cycle by cycle ------------------------------------------------------

@pytest.mark.parametrize("index", range(len(REFERENCE["runs"])))
def test_reference_run_cycle_by_cycle(target, drafter, index):
    """float32: every cycle as speculators' loop recorded it (anchor, position, the seven
    drafts, the selector's candidates and walk, accepted, next token), the output, and the
    output equal to the target's greedy output (ours and transformers')."""
    ref = REFERENCE["runs"][index]
    run = dflash2_generate(target, drafter, ref["prompt"],
                           max_new_tokens=REFERENCE["max_new_tokens"],
                           stop_token_ids=target.config.stop_token_ids)
    for n, (cycle, want) in enumerate(zip(run.cycles, ref["cycles"], strict=True)):
        got = json.loads(json.dumps(dataclasses.asdict(cycle)))
        assert got == want, f"cycle {n}"
    assert list(run.output_ids) == ref["output_ids"] == ref["target_greedy"]
    assert list(run.acceptance_lengths) == ref["acceptance_lengths"]
    greedy = target_greedy(target, ref["prompt"], max_new_tokens=REFERENCE["max_new_tokens"],
                           stop_token_ids=target.config.stop_token_ids)
    assert greedy.output_ids == run.output_ids


@pytest.mark.slow
def test_bfloat16_is_lossless_against_the_target_alone():
    """bfloat16 (the engines' dtype), verifying token by token: the output is the bfloat16
    target's own greedy output for every prompt. What it does not reproduce: the float32
    trace. The bfloat16 target's greedy output itself departs from float32's within the 24
    tokens on two of the three prompts, and the drafts with it."""
    target = Qwen3Target(TARGET, device=CPU, dtype=torch.bfloat16)
    drafter = load_drafter(DRAFT, target)
    assert drafter.w["fc.weight"].dtype == torch.bfloat16
    for prompt in PROMPTS:
        run = dflash2_generate(target, drafter, prompt, max_new_tokens=48,
                               stop_token_ids=target.config.stop_token_ids, stepwise_verify=True)
        greedy = target_greedy(target, prompt, max_new_tokens=48,
                               stop_token_ids=target.config.stop_token_ids)
        assert run.output_ids == greedy.output_ids
        assert sum(c.accepted for c in run.cycles) > 0      # the drafter does draft


# --- what is refused -------------------------------------------------------------------------

@pytest.mark.parametrize("temperature", [0.7, 1e-30, float("nan"), "0", True])
def test_a_temperature_other_than_0_is_refused(target, drafter, temperature):
    """speculators 0.9.0 has no sampled selector walk: anything but 0 is 151, nothing run."""
    with pytest.raises(DFlash2RunError) as info:
        dflash2_generate(target, drafter, PROMPTS[0], max_new_tokens=4, temperature=temperature)
    assert info.value.exit_code == 151
    assert "temperature" in info.value.message and "\n" not in info.value.message


def _tlc(field, value):
    return lambda c: c["transformer_layer_config"].__setitem__(field, value)


# One broken thing per case: (edit of config.json, the field the one line must name).
BAD_CONFIGS = {
    "missing-selector_top_k": (lambda c: c.pop("selector_top_k"), "selector_top_k"),
    "missing-sample_from_anchor": (lambda c: c.pop("sample_from_anchor"), "sample_from_anchor"),
    "missing-layer-hidden_size": (lambda c: c["transformer_layer_config"].pop("hidden_size"),
                                  "transformer_layer_config.hidden_size"),
    "block_size-a-string": (lambda c: c.__setitem__("block_size", "8"), "block_size"),
    "conv_group_size-a-float": (lambda c: c.__setitem__("conv_group_size", 16.0),
                                "conv_group_size"),
    "mask_token_id-null": (lambda c: c.__setitem__("mask_token_id", None), "mask_token_id"),
    "sample_from_anchor-1": (lambda c: c.__setitem__("sample_from_anchor", 1),
                             "sample_from_anchor"),
    "conv_group_size-not-dividing-hidden": (lambda c: c.__setitem__("conv_group_size", 24),
                                            "conv_group_size"),
    "selector_top_k-over-vocab": (lambda c: c.__setitem__("selector_top_k", 513),
                                  "selector_top_k"),
    "selector_top_k-0": (lambda c: c.__setitem__("selector_top_k", 0), "selector_top_k"),
    "conv_kernel_size-over-block": (lambda c: c.__setitem__("conv_kernel_size", 9),
                                    "conv_kernel_size"),
    "block_size-1": (lambda c: c.__setitem__("block_size", 1), "block_size"),
    "block_size-huge": (lambda c: c.__setitem__("block_size", 10 ** 12), "block_size"),
    "draft_vocab_size-reduced": (lambda c: c.__setitem__("draft_vocab_size", 256),
                                 "draft_vocab_size"),
    "target_hidden_size-other": (lambda c: c.__setitem__("target_hidden_size", 128),
                                 "target_hidden_size"),
    "mask_token-outside-vocab": (lambda c: c.__setitem__("mask_token_id", 512), "mask_token_id"),
    "aux-ids-empty": (lambda c: c.__setitem__("aux_hidden_state_layer_ids", []),
                      "aux_hidden_state_layer_ids"),
    "aux-id-negative": (lambda c: c.__setitem__("aux_hidden_state_layer_ids", [1, -3, 5]),
                        "aux_hidden_state_layer_ids[1]"),
    "sample_from_anchor-true": (lambda c: c.__setitem__("sample_from_anchor", True),
                                "sample_from_anchor"),
    "architectures-dflash": (lambda c: c.__setitem__("architectures", ["DFlashDraftModel"]),
                             "architectures"),
    "model-type-dspark": (lambda c: c.__setitem__("speculators_model_type", "dspark"),
                          "speculators_model_type"),
    "layer-types-too-few": (_tlc("layer_types", ["full_attention"]),
                            "transformer_layer_config.layer_types"),
    "layer-type-unknown": (_tlc("layer_types", ["sliding_attention", "chunked_attention"]),
                           "transformer_layer_config.layer_types[1]"),
    "sliding-without-use_sliding_window": (_tlc("use_sliding_window", False),
                                           "transformer_layer_config.use_sliding_window"),
    "sliding-window-null": (_tlc("sliding_window", None),
                            "transformer_layer_config.sliding_window"),
    "attention-bias": (_tlc("attention_bias", True), "transformer_layer_config.attention_bias"),
    "gelu": (_tlc("hidden_act", "gelu"), "transformer_layer_config.hidden_act"),
    "rope-scaling": (_tlc("rope_parameters", {"rope_theta": 1e6, "rope_type": "yarn"}),
                     "transformer_layer_config.rope_parameters.rope_type"),
    "heads-not-divisible": (_tlc("num_key_value_heads", 3),
                            "transformer_layer_config.num_key_value_heads"),
    "layer-model-type-llama": (_tlc("model_type", "llama"), "transformer_layer_config.model_type"),
    "zlab-layout": (lambda c: c.clear() or c.update(
        model_type="qwen3", architectures=["DFlash2DraftModel"],
        dflash_config={"block_size": 16, "target_layer_ids": [0, 2, 4]}), "dflash_config"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_a_broken_config_is_refused_in_one_line(tmp_path, case):
    """150, one line naming config.json and the field (the error's path and field too),
    before any tensor byte is read; the directory untouched."""
    edit, field = BAD_CONFIGS[case]
    work = edited_copy(DRAFT, tmp_path / "draft", edit)
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in work.iterdir()}
    with pytest.raises(DFlash2ConfigError) as info:
        plan_drafter(work)
    message = info.value.message
    assert info.value.exit_code == 150
    assert info.value.field == field and info.value.path.endswith("config.json")
    assert "config.json" in message and "\n" not in message, message
    assert all(part in message for part in field.split(".")), message
    assert before == {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in work.iterdir()}


@pytest.mark.parametrize("text, needle", [
    (b'{"block_size": 8, "block_size": 8}', "duplicate key 'block_size'"),
    (b'{"block_size": NaN}', "NaN"),
    (b"[1, 2]", "expected a JSON object"),
    (b"\xff{}", "not UTF-8"),
])
def test_config_json_is_read_strictly(tmp_path, text, needle):
    work = edited_copy(DRAFT, tmp_path / "draft")
    (work / "config.json").write_bytes(text)
    with pytest.raises(DFlash2ConfigError) as info:
        plan_drafter(work)
    assert "config.json" in info.value.message and needle in info.value.message


def _with_tensors(tmp_path, edit):
    work = tmp_path / "draft"
    shutil.copytree(DRAFT, work)
    tensors = load_file(DRAFT / "model.safetensors")
    edit(tensors)
    save_file(tensors, work / "model.safetensors")
    return work


@pytest.mark.parametrize("edit, error, name", [
    (lambda t: t.pop("layers.1.mlp_conv.base_kernel"), MissingTensorError,
     "layers.1.mlp_conv.base_kernel"),
    (lambda t: t.__setitem__("embed_tokens.weight", torch.zeros(512, 64, dtype=torch.bfloat16)),
     UnexpectedTensorError, "embed_tokens.weight"),
    (lambda t: t.__setitem__("candidate_selector.successor_codebook",
                             torch.zeros(512, 8, dtype=torch.bfloat16)),
     TensorShapeError, "candidate_selector.successor_codebook"),
    (lambda t: t.__setitem__("layers.0.attention_conv.kernel_projection.weight",
                             torch.zeros(16, 64, dtype=torch.int32)),
     TensorDtypeError, "layers.0.attention_conv.kernel_projection.weight"),
], ids=["missing", "embedding-saved", "codebook-rank", "int-projection"])
def test_a_broken_tensor_table_is_refused(tmp_path, edit, error, name):
    work = _with_tensors(tmp_path, edit)
    with pytest.raises(error) as info:
        plan_drafter(work)
    assert name in info.value.message and "\n" not in info.value.message


def test_a_config_claiming_a_huge_geometry_is_refused_from_the_headers(tmp_path):
    """A vocabulary of 2^40 (and a draft vocabulary to match) sizes nothing: the headers'
    shapes refuse it (22) in well under a second, no tensor byte read."""
    def huge(config):
        config["draft_vocab_size"] = 2 ** 40
        config["transformer_layer_config"]["vocab_size"] = 2 ** 40
    work = edited_copy(DRAFT, tmp_path / "draft", huge)
    began = time.perf_counter()
    with pytest.raises(TensorShapeError) as info:
        plan_drafter(work)
    assert time.perf_counter() - began < 1.0
    assert "candidate_selector.predecessor_codebook" in info.value.message
    assert str(2 ** 40) in info.value.message


def test_a_tap_the_target_has_not_is_refused_before_loading(tmp_path, target, monkeypatch):
    """aux_hidden_state_layer_ids index HF hidden_states (0 .. num_hidden_layers): 7 on a
    6-layer target is 151, and no tensor is loaded."""
    work = edited_copy(DRAFT, tmp_path / "draft",
                       lambda c: c.__setitem__("aux_hidden_state_layer_ids", [1, 3, 7]))
    monkeypatch.setattr(dflash2_runtime, "load_weights", None)     # never reached
    with pytest.raises(DFlash2RunError) as info:
        load_drafter(work, target)
    assert "aux_hidden_state_layer_ids[2]" in info.value.message and "[0, 6]" in info.value.message


@pytest.mark.parametrize("field", ["hidden_size", "vocab_size"])
def test_a_target_of_another_geometry_is_refused(target, field):
    cfg = parse_config(json.loads((DRAFT / "config.json").read_text()))
    other = target.config.model_copy(update={field: 2 * getattr(target.config, field)})
    with pytest.raises(DFlash2RunError) as info:
        check_target(cfg, other, path="config.json")
    assert f"transformer_layer_config.{field}" in info.value.message


# --- the loop's other paths --------------------------------------------------------------------

def test_requests_packed_together_draft_as_each_alone(target, drafter):
    """block_hidden_packed over two requests (forks with contexts of their own, of
    different lengths, so their blocks sit at different positions) equals each request's
    own pass."""
    forks, anchors, before = [drafter.fork(), drafter.fork()], [], drafter.length
    for fork, prompt in zip(forks, PROMPTS[1:]):
        out = target.forward(torch.tensor(prompt), KVCache())
        fork.add_context(fork.features(out.hidden_states))
        anchors.append(int(out.logits[-1].argmax()))
    packed = drafter.block_hidden_packed(anchors, forks)
    for fork, anchor, rows in zip(forks, anchors, packed):
        torch.testing.assert_close(rows, fork.block_hidden(anchor), atol=1e-6, rtol=0)
    assert drafter.length == before and forks[0].length != forks[1].length


def test_a_stop_token_ends_the_run_as_it_ends_the_target_alone(target, drafter):
    """A stop token the run meets (here the 6th new token of prompt 1's output, accepted as
    a draft or given by the target) ends the output there, as it ends the greedy output."""
    ref = REFERENCE["runs"][1]
    stop = ref["output_ids"][len(ref["prompt"]) + 5]
    run = dflash2_generate(target, drafter, ref["prompt"], max_new_tokens=24,
                           stop_token_ids=(stop,))
    greedy = target_greedy(target, ref["prompt"], max_new_tokens=24, stop_token_ids=(stop,))
    assert run.output_ids == greedy.output_ids
    assert run.output_ids[-1] == stop and len(run.output_ids) < len(ref["output_ids"])


def test_weights_that_overflow_are_refused_not_walked(target):
    """A finite weight whose products overflow float32 gives non-finite selector scores:
    NumericOverflowError (99) naming them, no token picked from NaN."""
    from dspark_convert.errors import NumericOverflowError

    def huge_successors(tensors):
        out = dict(tensors)
        out["candidate_selector.successor_codebook"] = tensors[
            "candidate_selector.successor_codebook"] * 3e38
        return out

    with pytest.raises(NumericOverflowError) as info:
        _first_proposal(target, _variant(target, tensors=huge_successors), PROMPTS[0])
    assert "selector scores" in info.value.message
