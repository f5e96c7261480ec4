"""The Gemma4 paths DeepSeek's fixtures (golden/reference/gemma4/) do not take, proved with
real checkpoints through the real commands (`dspark convert --target`, `validate --target`,
`smoke`); tests/support/gemma4_variants.py builds them from the fixtures.

1. A target whose full layers keep v_proj (attention_k_eq_v false), metamorphically: the
   fixture target with its full layers' one KV head duplicated into num_key_value_heads (2)
   identical heads, v_proj the same rows, computes what the k_eq_v original computes
   (measured: bit for bit; bound 1e-6). The fixture drafters made the same way convert and
   validate against that twin, and `smoke --reference` reproduces every DeepSeek run on it
   cycle by cycle: the v_proj path computes what DeepSeek's verified k_eq_v path computes.
   A v_proj that is not k_proj's rows moves the outputs: the path reads v_proj.
2. Other heads (gated and rnn Markov heads, a confidence head without Markov features, a
   Markov head without a confidence head, a confidence head without a Markov head) on the
   fixtures' geometry: the proposal's base and corrected logits, tokens and confidence
   logits against an independent torch.nn oracle built from the SOURCE checkpoint, in the
   Gemma4 order (softcap 30 first, then the Markov bias); each converts, validates and is
   lossless in `smoke`.
3. Other taps: the context features of drafters tapping [0, 1, 2, 4] and [1, 2, 3] are the
   target's hidden states at those layers, as DeepSeek's own hooks captured them (the two
   fixtures' first_block context_features hold layers 0, 2, 4 and 1, 3); a [0, 1, 2, 4]
   drafter whose fc ignores layer 1 reproduces DeepSeek's trace; the final layer is refused.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from support import gemma4_variants as V
from support.cli import assert_refused, run_cli
from support.gemma4 import GEMMA4, GEMMA4_DRAFTERS, GEMMA4_TARGET

from dspark_convert import errors as E
from dspark_convert.runtime import gemma4 as G
from dspark_convert.runtime.qwen3 import KVCache
from dspark_convert.runtime.weights import load_drafter_weights

CPU = torch.device("cpu")
# The twin computes the same numbers through other shapes: bit for bit here (the same
# products and sums); the bound leaves room for a BLAS that blocks a 64-row GEMM otherwise.
TWIN_ATOL = 1e-6

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _reference(name):
    return json.loads((GEMMA4 / name / "reference.json").read_text())


PROMPTS = _reference(V.DSPARK)["prompts"]


def _convert(src, out, target):
    proc = run_cli("convert", str(src), "--target", str(target), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


def _validate(art, target):
    proc = run_cli("validate", str(art), "--target", str(target), "--strict", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] and not report["failed"]
    return {c["name"]: c for c in report["checks"]}


def _smoke(art, target, *args):
    proc = run_cli("smoke", str(art), "--target", str(target), "--max-new-tokens", "24",
                   "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _reproduces(art, target, name):
    """`smoke --reference` at every setting of DeepSeek's trace ``name``: every run
    identical cycle by cycle (tokens, counts, confidence logits within 2e-3), tau equal."""
    ref = _reference(name)
    for temperature, threshold in sorted({(r["temperature"], r["confidence_threshold"])
                                          for r in ref["runs"]}):
        result = _smoke(art, target, "--reference", str(GEMMA4 / name / "reference.json"),
                        "--temperature", str(temperature), "--confidence-threshold",
                        str(threshold), "--seed", "7")
        want = [r for r in ref["runs"] if (r["temperature"], r["confidence_threshold"])
                == (temperature, threshold)]
        assert len(result["runs"]) == len(want) == 2
        for got, run in zip(result["runs"], want):
            assert got["reference_agreement"]["identical"], got["reference_agreement"]
            assert got["output_ids"] == run["output_ids"]
            assert got["lossless"] is (True if temperature == 0 else None)
        steps = [a for r in want for a in r["acceptance_lengths"]]
        assert result["tau"] == pytest.approx(sum(steps) / len(steps))


def _first_proposal(target, drafter, prompt, **kw):
    out = target.forward(torch.tensor(prompt), KVCache())
    features = drafter.features(out.hidden_states)
    anchor = int(out.logits[-1].argmax())
    drafter.reset()
    drafter.add_context(features)
    return out, features, anchor, drafter.propose(anchor, **kw)


def _drafter(art, target, weights=None):
    weights = weights if weights is not None else load_drafter_weights(art)
    return G.Gemma4Drafter(weights, embed=target.embed, lm_head=target.lm_head, device=CPU)


def _max_error(a, b):
    return (a - b).abs().max().item()


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("gemma4-variants")


@pytest.fixture(scope="module")
def fixture_target():
    return G.Gemma4Target(GEMMA4_TARGET, device=CPU)


@pytest.fixture(scope="module")
def fixture_artifacts(root):
    """DeepSeek's two drafters converted against their own target."""
    return {name: _convert(src, root / "fixture" / name, GEMMA4_TARGET)
            for name, src in GEMMA4_DRAFTERS.items()}


# --- 1. a target whose full layers keep v_proj -----------------------------------------------

@pytest.fixture(scope="module")
def twin(root):
    """The v_proj twin of the fixture target, and the fixture drafters made for it."""
    target = V.v_proj_target(root / "twin-target")
    sources = {name: V.v_proj_drafter(name, root / "twin-src" / name, target)
               for name in GEMMA4_DRAFTERS}
    artifacts = {name: _convert(src, root / "twin-art" / name, target)
                 for name, src in sources.items()}
    return target, sources, artifacts


@pytest.fixture(scope="module")
def twin_target(twin):
    return G.Gemma4Target(twin[0], device=CPU)


def test_the_twin_target_computes_what_the_k_eq_v_target_computes(fixture_target, twin_target):
    """Its full layers (2, 5) now have 2 KV heads of 32 and a v_proj; logits and every
    hidden state equal the original's, on DeepSeek's two prompts and on one that crosses
    the sliding window, in one forward and in pieces (the KV cache)."""
    geometry = [(g.kind, g.kv_heads, g.head_dim, g.has_v_proj) for g in twin_target.config.layers]
    assert [geometry[i] for i in (2, 5)] == [("full_attention", 2, 32, True)] * 2
    assert [(g.kv_heads, g.has_v_proj) for g in fixture_target.config.layers if
            g.kind == "full_attention"] == [(1, False)] * 2
    for prompt in PROMPTS + [list(range(3, 40))]:
        ids = torch.tensor(prompt)
        want = fixture_target.forward(ids, KVCache())
        got = twin_target.forward(ids, KVCache())
        assert _max_error(got.logits, want.logits) <= TWIN_ATOL
        assert len(got.hidden_states) == len(want.hidden_states) == 7
        for a, b in zip(got.hidden_states, want.hidden_states):
            assert _max_error(a, b) <= TWIN_ATOL
    cache = KVCache()
    pieces = torch.cat([twin_target.forward(ids[a:b], cache).logits
                        for a, b in ((0, 9), (9, 10), (10, len(ids)))])
    cache = KVCache()
    originals = torch.cat([fixture_target.forward(ids[a:b], cache).logits
                           for a, b in ((0, 9), (9, 10), (10, len(ids)))])
    assert _max_error(pieces, originals) <= TWIN_ATOL


def test_the_twin_target_reads_its_v_proj(tmp_path, fixture_target):
    """The control: a twin whose v_proj is not k_proj's rows (negated) computes other
    logits, so the equality above went through v_proj."""
    other = G.Gemma4Target(V.v_proj_target(tmp_path / "t", value=lambda k: -V.two_heads(k)),
                           device=CPU)
    ids = torch.tensor(PROMPTS[1])
    assert _max_error(other.forward(ids, KVCache()).logits,
                      fixture_target.forward(ids, KVCache()).logits) > 0.1


@pytest.mark.parametrize("name", sorted(GEMMA4_DRAFTERS))
def test_twin_drafters_pair_with_the_twin_target(twin, name):
    """What the contract and the pairing record: KV heads from num_key_value_heads (2),
    a v_proj per layer carried bit for bit, the target's full layers compared by that
    field; validate --target --strict passes."""
    target, sources, artifacts = twin
    manifest = json.loads((artifacts[name] / "manifest.json").read_text())
    geometry = manifest["contract"]["geometry"]
    assert (geometry["num_key_value_heads"], geometry["key_value_heads_from"],
            geometry["head_dim"]) == (2, "num_key_value_heads", 32)
    assert manifest["contract"]["attention"]["k_eq_v"] is False
    # The global KV heads DeepSpec's builder copied (1) are recorded as unused.
    assert manifest["contract"]["inherited_unused"]["num_global_key_value_heads"] == 1
    checks = _validate(artifacts[name], target)
    assert "4 heads x 32, 2 KV heads (v_proj)" in checks["target.norms"]["detail"]
    assert checks["target.identity.head"]["status"] == "passed"
    source = load_file(sources[name] / "model.safetensors")
    weights = load_drafter_weights(artifacts[name]).tensors
    for i in range(2):
        p = f"layers.{i}.self_attn."
        assert weights[p + "v_proj.weight"].shape == (64, 64)
        for t in ("k_proj.weight", "v_proj.weight"):
            assert torch.equal(weights[p + t], source[p + t].float())


@pytest.mark.parametrize("name", sorted(GEMMA4_DRAFTERS))
def test_twin_drafters_reproduce_deepseeks_runs(twin, name):
    """`smoke --reference` of DeepSeek's k_eq_v trace on the v_proj twins: every run, at
    T=0 with thresholds 0 and 0.5 and at T=1 with seed 7, float32."""
    target, _, artifacts = twin
    _reproduces(artifacts[name], target, name)


@pytest.mark.parametrize("name", sorted(GEMMA4_DRAFTERS))
def test_twin_drafters_propose_what_the_originals_propose(twin, twin_target, fixture_target,
                                                          fixture_artifacts, name):
    """The first proposal of each twin, stage by stage, against the k_eq_v original's; a
    v_proj that is not k_proj's rows moves it (the drafter reads v_proj)."""
    _, _, artifacts = twin
    *_, want = _first_proposal(fixture_target, _drafter(fixture_artifacts[name], fixture_target),
                               PROMPTS[0])
    twin_drafter = _drafter(artifacts[name], twin_target)
    assert (twin_drafter.kv_heads, twin_drafter.k_eq_v) == (2, False)
    *_, got = _first_proposal(twin_target, twin_drafter, PROMPTS[0])
    for stage in ("block_hidden", "base_logits", "corrected_logits", "confidence_logits"):
        if getattr(want, stage) is not None:
            assert _max_error(getattr(got, stage), getattr(want, stage)) <= TWIN_ATOL, stage
    first = load_file(GEMMA4 / name / "first_block.safetensors")
    assert got.tokens.tolist() == want.tokens.tolist() == first["draft_tokens"].tolist()
    weights = load_drafter_weights(artifacts[name])
    for i in range(2):
        weights.tensors[f"layers.{i}.self_attn.v_proj.weight"].neg_()
    *_, moved = _first_proposal(twin_target, _drafter(None, twin_target, weights), PROMPTS[0])
    assert _max_error(moved.block_hidden, want.block_hidden) > 0.1


def test_k_eq_v_and_v_proj_do_not_pair(twin, fixture_artifacts):
    """validate --target: the twin artifact against the k_eq_v target and the fixture
    artifact against the twin, each refused naming the field (62)."""
    target, _, artifacts = twin
    for art, other in ((artifacts[V.DSPARK], GEMMA4_TARGET),
                       (fixture_artifacts[V.DSPARK], target)):
        proc = run_cli("validate", str(art), "--target", str(other))
        assert_refused(proc, E.TargetGeometryError, ["text_config.attention_k_eq_v"])


# --- 2. other heads --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def heads(root):
    """name -> (source directory, artifact converted against the fixture target)."""
    out = {}
    for name in V.HEAD_VARIANTS:
        src = V.head_variant(name, root / "heads-src" / name)
        out[name] = src, _convert(src, root / "heads-art" / name, GEMMA4_TARGET)
    return out


def _oracle(source, proposal, anchor, contract):
    return V.heads_oracle(source, proposal.block_hidden, anchor, proposal.tokens.tolist(),
                          softcap=contract.blocks.final_logit_softcapping,
                          markov=contract.markov_head.type,
                          with_markov=contract.confidence_head.with_markov)


@pytest.mark.parametrize("name", sorted(V.HEAD_VARIANTS))
def test_heads_match_the_oracle(heads, fixture_target, name):
    """Greedy and sampled proposals after prefilling DeepSeek's prompt 0: base logits
    (softcapped), corrected logits (the Markov bias after the cap), tokens, confidence
    logits and the cut at 0.5, against the oracle from the source checkpoint."""
    src, art = heads[name]
    source = load_file(src / "model.safetensors")
    drafter = _drafter(art, fixture_target)
    contract = drafter.contract
    expected = {"gated_conf_markov": ("gated", True, True), "rnn_conf_plain": ("rnn", True, False),
                "vanilla_no_conf": ("vanilla", False, False),
                "none_conf_plain": ("none", True, False)}[name]
    assert (contract.markov_head.type, contract.confidence_head.enabled,
            contract.confidence_head.with_markov) == expected
    *_, anchor, proposal = _first_proposal(fixture_target, drafter, PROMPTS[0])
    base, corrected, conf = _oracle(source, proposal, anchor, contract)
    assert _max_error(proposal.base_logits, base) <= 1e-5
    assert proposal.base_logits.abs().max().item() < 30.0
    assert _max_error(proposal.corrected_logits, corrected) <= 1e-4
    assert proposal.tokens.tolist() == corrected.argmax(-1).tolist()
    if contract.markov_head.type != "none":
        bias = corrected - base
        assert bias.abs().max().item() > 0.1          # the head takes part
        # The other order, cap(lm_head(hb) + bias), is far outside the bound.
        raw = torch.nn.functional.linear(proposal.block_hidden, source["lm_head.weight"].float())
        assert _max_error(proposal.corrected_logits, 30.0 * torch.tanh((raw + bias) / 30.0)) > 1e-2
    if conf is None:
        assert proposal.confidence_logits is None
    else:
        assert _max_error(proposal.confidence_logits, conf) <= 1e-5
        below = (torch.sigmoid(conf) < 0.5).nonzero()
        cut = int(below[0, 0]) if below.numel() else len(conf)
        # (the context is still committed: block rows are never cached)
        assert drafter.propose(anchor, confidence_threshold=0.5).length == cut
    # Sampled: the Markov chain follows the drawn tokens.
    for seed in (3, 4):
        *_, sampled = _first_proposal(fixture_target, drafter, PROMPTS[0], temperature=1.0,
                                      generator=torch.Generator().manual_seed(seed))
        _, corrected, conf = _oracle(source, sampled, anchor, contract)
        assert _max_error(sampled.corrected_logits, corrected) <= 1e-4
        if conf is not None:
            assert _max_error(sampled.confidence_logits, conf) <= 1e-5


@pytest.mark.parametrize("name", sorted(V.HEAD_VARIANTS))
def test_heads_validate_and_are_lossless(heads, fixture_target, name):
    """validate --target --strict; smoke at T=0 (each threshold a confidence head has) on
    DeepSeek's two prompts is lossless, and its first cycle proposes the oracle's block."""
    src, art = heads[name]
    _validate(art, GEMMA4_TARGET)
    contract = load_drafter_weights(art).contract
    thresholds = ("0", "0.5") if contract.confidence_head.enabled else ("0",)
    prompts = [arg for p in PROMPTS for arg in ("--prompt-ids", ",".join(map(str, p)))]
    for threshold in thresholds:
        trace = art.parent / f"{name}-{threshold}.json"
        result = _smoke(art, GEMMA4_TARGET, *prompts, "--confidence-threshold", threshold,
                        "--trace", str(trace))
        assert [r["lossless"] for r in result["runs"]] == [True, True]
        first = json.loads(trace.read_text())["runs"][0]["cycles"][0]
        if threshold == "0":
            *_, anchor, proposal = _first_proposal(fixture_target, _drafter(art, fixture_target),
                                                   PROMPTS[0])
            source = load_file(src / "model.safetensors")
            _, corrected, conf = _oracle(source, proposal, anchor, contract)
            assert first["proposed"] == corrected.argmax(-1).tolist()
            if conf is not None:
                assert first["confidence_logits"] == pytest.approx(conf.tolist(), abs=2e-6)


# --- 3. other taps ---------------------------------------------------------------------------

TAPS = {"taps_0124": ([0, 1, 2, 4], V.fc_with_a_silent_tap),
        "taps_123": ([1, 2, 3], lambda fc: V.small(tuple(fc.shape), 9))}


@pytest.fixture(scope="module")
def taps(root):
    out = {}
    for name, (ids, fc) in TAPS.items():
        src = V.tap_variant(root / "taps-src" / name, ids, fc)
        out[name] = _convert(src, root / "taps-art" / name, GEMMA4_TARGET)
    return out


def _deepseek_layers():
    """target layer id -> its hidden state after prefilling prompt 0, as DeepSeek's hooks
    captured it (first_block context_features: DSpark taps [0, 2, 4], DFlash [1, 3, 4])."""
    out = {}
    for name, ids in ((V.DSPARK, (0, 2, 4)), (V.DFLASH, (1, 3, 4))):
        features = load_file(GEMMA4 / name / "first_block.safetensors")["context_features"]
        out.update(zip(ids, features.split(V.H, dim=1)))
    return out


@pytest.mark.parametrize("name", sorted(TAPS))
def test_context_features_are_the_targets_hidden_states_at_the_taps(taps, fixture_target, name):
    ids = TAPS[name][0]
    drafter = _drafter(taps[name], fixture_target)
    assert drafter.contract.taps.target_layer_ids == ids
    assert drafter.contract.taps.feature_width == len(ids) * V.H
    out, features, *_ = _first_proposal(fixture_target, drafter, PROMPTS[0])
    # hs[id + 1]: the output of target layer id (hs[0] is the scaled embedding).
    assert torch.equal(features, torch.cat([out.hidden_states[i + 1] for i in ids], dim=-1))
    deepseek = _deepseek_layers()
    # As tests/test_runtime_gemma4.py's context_features bound (the scaled embedding makes
    # them large: 9.2e-5 measured).
    assert _max_error(features, torch.cat([deepseek[i] for i in ids], dim=-1)) <= 1e-3
    # Another layer's state is far from it.
    assert _max_error(out.hidden_states[ids[0] + 2], deepseek[ids[0]]) > 0.1


def test_a_silent_extra_tap_reproduces_deepseeks_runs(taps, fixture_target, fixture_artifacts):
    """Taps [0, 1, 2, 4] with the fixture's fc blocks and zeros for layer 1: the fused
    context is the fixture drafter's, and `smoke --reference` reproduces DeepSeek's trace."""
    out = fixture_target.forward(torch.tensor(PROMPTS[0]), KVCache())
    wide, original = _drafter(taps["taps_0124"], fixture_target), _drafter(
        fixture_artifacts[V.DSPARK], fixture_target)
    assert _max_error(wide.fused_context(wide.features(out.hidden_states)),
                      original.fused_context(original.features(out.hidden_states))) <= 1e-5
    _validate(taps["taps_0124"], GEMMA4_TARGET)
    _reproduces(taps["taps_0124"], GEMMA4_TARGET, V.DSPARK)


def test_other_taps_validate_and_are_lossless(taps):
    _validate(taps["taps_123"], GEMMA4_TARGET)
    prompts = [arg for p in PROMPTS for arg in ("--prompt-ids", ",".join(map(str, p)))]
    result = _smoke(taps["taps_123"], GEMMA4_TARGET, *prompts)
    assert [r["lossless"] for r in result["runs"]] == [True, True]


def test_the_final_target_layer_is_refused(root):
    """Layer 5 of the 6-layer target: its HF hidden state is the final-normed one (27),
    nothing written."""
    src = V.tap_variant(root / "taps-src" / "final", [1, 2, 5], lambda fc: fc)
    out = root / "taps-art" / "final"
    proc = run_cli("convert", str(src), "--target", str(GEMMA4_TARGET), "-o", str(out))
    assert_refused(proc, E.FinalLayerTapError, ["target_layer_ids[2]", "found 5"])
    assert not out.exists()
