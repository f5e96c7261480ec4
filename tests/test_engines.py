"""artifact/engines.py: which engine accepts an artifact, by stage, and the first reason in
the engine's own terms (docs/ENGINES.md cites the source of every rule).

Inputs are real: converted golden artifacts read back with our reader, or the metadata and
tensor table the writer would emit for a contract (released Qwen3-4B geometry, the
Flash-Next shape), each rule then broken by one edit.
"""

from __future__ import annotations

import json
import math
import re
import shutil

import pytest
from support.cli import assert_refused, run_cli
from support.tools import load_tool

from dspark_convert.artifact import engines
from dspark_convert.artifact.engines import (ENGINES, LLAMA_RULES, STRATA_OPEN_RULES,
                                             STRATA_RUN_RULES, engine_checks, engine_reports,
                                             engine_verdicts, format_types, gguf_inputs)
from dspark_convert.errors import EngineRequirementError, StrataRuleError
from dspark_convert.artifact.format import LOCAL_REVISION, Provenance, expected_metadata
from dspark_convert.contract.dspark import build_contract, parse_config
from dspark_convert.formats.gguf_reader import read_gguf
from dspark_convert.synthetic import synthetic_config

from conftest import GOLDEN, ROOT

RELEASED = json.loads((GOLDEN / "reference" / "released_shapes.json").read_text())
PROV = Provenance(name="x", repository=None, revision=LOCAL_REVISION, source_sha256="0" * 64,
                  embed_sha256=None, lm_head_sha256=None)
PLAIN = dict(markov_rank=0, enable_confidence_head=False)


def written(config: dict):
    """(kv, types, tensors) exactly as convert would write them for ``config``."""
    contract = build_contract(parse_config(config))
    kv = expected_metadata(contract, PROV)
    return dict(kv), format_types(kv), [(t.gguf_name, "BF16", t.gguf_shape)
                                        for t in contract.written_tensors]


def released_plain() -> dict:
    cfg = dict(RELEASED["qwen3/config.json"])
    for key in ("markov_head_type", "confidence_head_with_markov"):
        cfg.pop(key, None)
    return {**cfg, **PLAIN}


def flash_next() -> dict:
    """The published Flash-Next drafter's shape (Strata's validate_supported), as a plain
    DFlash config of our format."""
    return synthetic_config(hidden_size=2560, num_hidden_layers=5, num_attention_heads=24,
                            num_key_value_heads=2, head_dim=256, intermediate_size=7680,
                            vocab_size=248320, mask_token_id=248077, num_target_layers=48,
                            target_layer_ids=(3, 15, 23, 35, 43), rope_theta=1e7, **PLAIN)


def reports(kv, types, tensors):
    return engine_reports(kv, types, tensors, path="drafter.gguf")


def reason(kv, types, tensors, engine="strata.open"):
    return reports(kv, types, tensors)[engine].reason


def from_artifact(directory):
    return gguf_inputs(read_gguf(directory / "drafter.gguf"))


# --- every engine's verdict ----------------------------------------------------------------------

def test_released_qwen3_4b_plain_dflash_opens_but_does_not_run():
    r = reports(*written(released_plain()))
    assert r["strata.open"].accepts
    assert r["strata.open"].to_dict() == {"accepts": True, "reason": None}
    assert r["strata.run"].to_dict() == {
        "accepts": False,
        "reason": "dflash: attention.head_count = 32; the runtime's geometry-specific fast path "
                  "implements the published Flash-Next drafter (24) only"}
    # every geometry difference is listed after the first, in validate_supported's order
    assert [f.rule for f in r["strata.run"].refusals] == [
        "strata.run/geometry.attention.head_count", "strata.run/geometry.attention.head_count_kv",
        "strata.run/geometry.attention.key_length", "strata.run/geometry.feed_forward_length"]
    assert {f.kind for f in r["strata.run"].refusals} == {"unsupported"}


def test_the_flash_next_shape_opens_and_runs():
    r = reports(*written(flash_next()))
    assert r["strata.open"].accepts and r["strata.run"].accepts
    assert not r["llama.cpp"].accepts


def test_released_dspark_drafters_are_refused_at_open_as_unsupported_today():
    for variant in ("vanilla+conf_with_markov", "gated+conf_with_markov", "no_markov+conf"):
        cfg = dict(RELEASED["qwen3/config.json"])
        for key in ("markov_head_type", "confidence_head_with_markov"):
            cfg.pop(key, None)
        fields = {"vanilla+conf_with_markov": dict(markov_rank=256, markov_head_type="vanilla",
                                                   enable_confidence_head=True,
                                                   confidence_head_with_markov=True),
                  "gated+conf_with_markov": dict(markov_rank=256, markov_head_type="gated",
                                                 enable_confidence_head=True,
                                                 confidence_head_with_markov=True),
                  "no_markov+conf": dict(markov_rank=0, enable_confidence_head=True,
                                         confidence_head_with_markov=False)}[variant]
        r = reports(*written({**cfg, **fields}))
        first = r["strata.open"].refusals[0]
        assert first.rule == "strata.open/dspark_extras" and first.kind == "unsupported"
        assert r["strata.run"].reason == r["strata.open"].reason
        # nothing else is wrong with them: only "unsupported" refusals at open
        assert {f.kind for f in r["strata.open"].refusals} == {"unsupported"}


def test_golden_artifacts_read_back(converted):
    plain = reports(*from_artifact(converted["dflash_plain"]))
    assert plain["strata.open"].accepts
    assert plain["strata.run"].reason == ("dflash: embedding_length = 32; the runtime's "
                                          "geometry-specific fast path implements the published "
                                          "Flash-Next drafter (2560) only")
    assert plain["llama.cpp"].reason == ("key not found in model: dflash.context_length"
                                         + engines.LLAMA_EXPORT_HINT)
    ref = reports(*from_artifact(converted["reference"]))
    assert ref["strata.open"].reason.startswith("dflash: this artifact carries DSpark extras")
    assert list(ref) == list(ENGINES)


# --- strata.open, rule by rule --------------------------------------------------------------------

@pytest.fixture()
def plain():
    kv, types, tensors = written(synthetic_config(**PLAIN))
    assert reports(kv, types, tensors)["strata.open"].accepts
    return kv, types, tensors


def test_architecture(plain):
    kv, types, tensors = plain
    assert reason({**kv, "general.architecture": "qwen3"}, types, tensors) == (
        "dflash: general.architecture is 'qwen3', a DFlash artifact declares 'dflash'")
    del kv["general.architecture"]
    assert reason(kv, types, tensors) == "dflash: missing general.architecture"


@pytest.mark.parametrize("key", ["dflash.embedding_length", "dflash.block_count",
                                 "dflash.attention.head_count", "dflash.attention.head_count_kv",
                                 "dflash.feed_forward_length", "dflash.vocab_size",
                                 "dflash.block_size"])
def test_required_numbers(plain, key):
    kv, types, tensors = plain
    many = key != "dflash.block_size"
    want = (f"dflash: missing metadata key{' (any of' if many else ''} {key}"
            f"{'...)' if many else ''} in drafter.gguf")
    assert reason({k: v for k, v in kv.items() if k != key}, types, tensors) == want
    # a string is not a number to Strata: the same message
    assert reason({**kv, key: "32"}, {**types, key: "STRING"}, tensors) == want
    # any numeric type is (the alias that is present wins)
    ok = reports({**kv, key: float(kv[key])}, {**types, key: "FLOAT64"}, tensors)
    assert ok["strata.open"].accepts


def test_a_qwen3_alias_is_read_when_the_dflash_key_is_absent(plain):
    kv, types, tensors = plain
    kv["qwen3.embedding_length"] = kv.pop("dflash.embedding_length")
    types["qwen3.embedding_length"] = types.pop("dflash.embedding_length")
    assert reports(kv, types, tensors)["strata.open"].accepts


def test_head_dim_is_derived_or_refused(plain):
    kv, types, tensors = plain
    no_key = {k: v for k, v in kv.items() if k != "dflash.attention.key_length"}
    # synthetic: H 32, 4 heads of 8 -> derived 8, the same: accepted
    assert reports(no_key, types, tensors)["strata.open"].accepts
    assert reason({**no_key, "dflash.attention.head_count": 5}, types, tensors) == (
        "dflash: cannot derive the head dim from embedding_length / attention.head_count")


@pytest.mark.parametrize("edit, message", [
    (dict(value=None), "dflash: missing dflash.target_layers (the taps this drafter was trained against)"),
    (dict(value=["0", "2"], type="ARRAY[STRING]"), "dflash: target_layers must be an integer array"),
    (dict(value=3, type="UINT32"), "dflash: target_layers must be an integer array"),
    (dict(value=list(range(65))), "dflash: implausibly long target_layers array"),
    (dict(value=[0, 4, 2]), "dflash: target_layers must be strictly increasing and non-negative, got [0, ..., 2]"),
    (dict(value=[-1, 2, 4], type="ARRAY[INT32]"), "dflash: target_layers must be strictly increasing and non-negative, got [-1, ..., 4]"),
])
def test_target_layers(plain, edit, message):
    kv, types, tensors = plain
    if edit["value"] is None:
        del kv["dflash.target_layers"]
    else:
        kv["dflash.target_layers"] = edit["value"]
        types["dflash.target_layers"] = edit.get("type", "ARRAY[UINT32]")
    assert reason(kv, types, tensors) == message


def test_a_long_tap_array_read_packed_is_judged_by_its_values(plain):
    """The reader keeps an array of over 65,536 scalars packed (GGUFArray, not a list): the
    rules read it as the array it is, not as "no integer array"."""
    import array

    from gguf.constants import GGUFValueType
    from dspark_convert.formats.gguf_reader import GGUFArray

    kv, types, tensors = plain
    kv["dflash.target_layers"] = GGUFArray(GGUFValueType.INT32, array.array("i", range(70_000)))
    types["dflash.target_layers"] = "ARRAY[INT32]"
    assert reason(kv, types, tensors) == "dflash: implausibly long target_layers array"
    assert "array type mismatch" not in (reason(kv, types, tensors, "llama.cpp") or "")


def test_geometry_bounds(plain):
    kv, types, tensors = plain
    assert reason({**kv, "dflash.block_size": 129}, types, tensors) == (
        "dflash: implausible geometry (hidden=32 layers=2 heads=4/2 head_dim=8 intermediate=64 "
        "vocab=256 block_size=129)")
    assert reason({**kv, "dflash.block_count": 65}, types, tensors).startswith(
        "dflash: implausible geometry (hidden=32 layers=65")


@pytest.mark.parametrize("key, value, vtype, rule", [
    ("dflash.sample_from_anchor", "false", "STRING", "sample_from_anchor"),
    ("dflash.sample_from_anchor", 0, "UINT8", "sample_from_anchor"),
    ("dflash.attention.causal", "1", "STRING", "causal"),
    ("dflash.attention.causal", True, "BOOL", "causal"),
    ("dflash.markov_rank", 8, "UINT32", "dspark_extras"),
    ("dflash.has_confidence_head", "true", "STRING", "dspark_extras"),
    ("dflash.selector_top_k", 4, "UINT32", "dflash2_selector"),
])
def test_flags_and_extensions(plain, key, value, vtype, rule):
    kv, types, tensors = plain
    first = reports({**kv, key: value}, {**types, key: vtype}, tensors)["strata.open"].refusals[0]
    assert first.rule == f"strata.open/{rule}"
    assert first.message.startswith("dflash: this artifact")


def test_strata_flags_read_strings_and_numbers_its_way(plain):
    kv, types, tensors = plain
    # "yes" is not "true"/"1": read as false, so a causal "yes" is accepted, an anchor "yes" is not
    assert reports({**kv, "dflash.attention.causal": "yes"}, types, tensors)["strata.open"].accepts
    assert reason({**kv, "dflash.sample_from_anchor": "yes"}, types, tensors).startswith(
        "dflash: this artifact declares the generic 1+N fill-in layout")


@pytest.mark.parametrize("name, rule", [
    ("token_embd.weight", "own_embedding"), ("output.weight", "own_embedding"),
    ("markov_w1.weight", "extension_tensor"), ("blk.0.conv_base", "extension_tensor"),
    ("d2t", "extension_tensor"), ("selector_hidden.weight", "extension_tensor"),
])
def test_tensors_strata_refuses_by_name(plain, name, rule):
    kv, types, tensors = plain
    first = reports(kv, types, tensors + [(name, "BF16", [32, 256])])["strata.open"].refusals[0]
    assert first.rule == f"strata.open/{rule}" and f"'{name}'" in first.message


def edit_tensor(tensors, which, **change):
    """``tensors`` with the one named ``which`` given a new name, type or shape."""
    out = []
    for n, t, s in tensors:
        if n == which:
            n, t, s = change.get("name", n), change.get("type", t), change.get("shape", s)
        out.append((n, t, s))
    return out


def test_inventory_missing_both_names_type_shape_unknown(plain):
    kv, types, tensors = plain
    missing = [t for t in tensors if t[0] != "blk.1.attn_k.weight"]
    assert reason(kv, types, missing) == (
        "dflash: missing required tensor 'layers.1.self_attn.k_proj' (looked for "
        "'blk.1.attn_k.weight', 'layers.1.self_attn.k_proj.weight', in drafter.gguf)")
    both = tensors + [("hidden_norm.weight", "BF16", [32])]
    assert reason(kv, types, both) == (
        "dflash: tensor 'hidden_norm' is present under two names ('enc.output_norm.weight' and "
        "'hidden_norm.weight'); the artifact must pick one family")
    hf = edit_tensor(tensors, "blk.0.ffn_up.weight", name="layers.0.mlp.up_proj.weight")
    assert reports(kv, types, hf)["strata.open"].accepts        # the raw HF name is accepted
    shape = edit_tensor(tensors, "blk.0.attn_q.weight", shape=[32, 64])
    assert reason(kv, types, shape) == (
        "dflash: tensor 'blk.0.attn_q.weight' has shape [32,64], expected [32,32] for "
        "'layers.0.self_attn.q_proj'")
    extra = tensors + [("blk.0.attn_gate.weight", "BF16", [32, 32])]
    assert reason(kv, types, extra) == "dflash: unknown tensor 'blk.0.attn_gate.weight' in the artifact"


@pytest.mark.parametrize("name, gtype, ok", [
    ("fc.weight", "Q8_0", True), ("blk.1.ffn_down.weight", "Q5_0", True),
    ("blk.0.attn_v.weight", "Q4_0", True), ("blk.0.attn_q.weight", "F16", False),
    ("blk.0.attn_q.weight", "Q6_K", False), ("blk.0.attn_norm.weight", "Q8_0", False),
    ("output_norm.weight", "F32", False), ("blk.0.attn_q_norm.weight", "F16", False),
])
def test_precision_rules_at_open(plain, name, gtype, ok):
    kv, types, tensors = plain
    r = reports(kv, types, edit_tensor(tensors, name, type=gtype))
    assert r["strata.open"].accepts is ok
    if not ok:
        assert r["strata.open"].reason == (f"dflash: tensor '{name}' is {gtype}; expected BF16 "
                                           "norms and BF16, Q8_0, Q5_0 or Q4_0 matrices")


def test_a_quantized_matrix_needs_rows_of_a_multiple_of_32():
    """H = 48: fc's ne0 is 3 x 48 = 144, not a multiple of 32; attn_q's is 48."""
    kv, types, tensors = written(synthetic_config(hidden_size=48, num_attention_heads=6,
                                                  head_dim=8, intermediate_size=96, **PLAIN))
    assert reports(kv, types, tensors)["strata.open"].accepts
    r = reports(kv, types, edit_tensor(tensors, "fc.weight", type="Q8_0"))
    assert r["strata.open"].reason == ("dflash: tensor 'fc.weight' is Q8_0; expected BF16 norms "
                                       "and BF16, Q8_0, Q5_0 or Q4_0 matrices")
    ok = edit_tensor(tensors, "blk.0.ffn_down.weight", type="Q8_0")      # ne0 = I = 96
    assert reports(kv, types, ok)["strata.open"].accepts


# --- strata.run ----------------------------------------------------------------------------------

@pytest.mark.parametrize("key, value, what", [
    ("dflash.embedding_length", 4096, "embedding_length"),
    ("dflash.block_count", 4, "block_count"),
    ("dflash.attention.head_count", 32, "attention.head_count"),
    ("dflash.attention.head_count_kv", 8, "attention.head_count_kv"),
    ("dflash.attention.key_length", 128, "attention.key_length"),
    ("dflash.feed_forward_length", 9728, "feed_forward_length"),
])
def test_each_flash_next_dimension(key, value, what):
    """One dimension off the Flash-Next shape: the runtime's own message for it (open may
    refuse too, since the tensor shapes follow the dimension; run's rule is still named)."""
    kv, types, tensors = written(flash_next())
    got = reports({**kv, key: value}, types, tensors)["strata.run"]
    first_run = next(f for f in got.refusals if f.rule.startswith("strata.run/"))
    fixed = {w: v for _f, w, v in engines.FLASH_NEXT}
    assert first_run.rule == f"strata.run/geometry.{what}"
    assert first_run.message == (f"dflash: {what} = {value}; the runtime's geometry-specific "
                                 f"fast path implements the published Flash-Next drafter "
                                 f"({fixed[what]}) only")


def test_taps_rope_and_eps_at_run():
    kv, types, tensors = written(flash_next())
    four = edit_tensor(tensors, "fc.weight", shape=[4 * 2560, 2560])
    r = reports({**kv, "dflash.target_layers": [3, 15, 23, 35]}, types, four)
    assert r["strata.open"].accepts
    assert r["strata.run"].reason == ("dflash: target_layers holds 4 taps; the runtime "
                                      "implements five-tap drafters only")
    assert reason({**kv, "dflash.rope.frequency_base": 0.0}, types, tensors, "strata.run") == (
        "dflash: rope.frequency_base missing or non-positive")
    eps = reports({**kv, "dflash.attention.layer_norm_rms_epsilon": 1e-5}, types, tensors)
    assert eps["strata.open"].accepts
    assert eps["strata.run"].refusals[0].kind == "misread"
    assert "fixes the rms eps at 1e-6" in eps["strata.run"].reason and "1e-05" in eps["strata.run"].reason


def test_run_reports_opens_refusal_first(plain):
    kv, types, tensors = plain
    r = reports({**kv, "dflash.attention.causal": "true"}, types, tensors)
    assert r["strata.run"].reason == r["strata.open"].reason
    assert r["strata.run"].refusals[0].rule == "strata.open/causal"


# --- llama.cpp -----------------------------------------------------------------------------------

def test_llama_cpp_reads_what_its_converter_writes(plain):
    """Fix our file one llama.cpp rule at a time: each fix shows the next reason, in the order
    llama.cpp loads, until it accepts. This is the whole difference between the formats."""
    kv, types, tensors = plain
    steps = []

    def now():
        return reports(kv, types, tensors)["llama.cpp"]

    steps.append(now().reason)
    kv["dflash.context_length"], types["dflash.context_length"] = 40960, "UINT32"
    steps.append(now().reason)
    kv["dflash.rope.freq_base"], types["dflash.rope.freq_base"] = 1e6, "FLOAT32"
    steps.append(now().reason)
    kv["dflash.attention.causal"], types["dflash.attention.causal"] = False, "BOOL"
    steps.append(now().reason)
    # a file of llama.cpp's own convention: no dspark.format_version, no rope base under
    # Strata's name (engines.STRATA_CONVENTION_KEYS), taps stored id + 1
    del kv["dspark.format_version"], kv["dflash.rope.frequency_base"]
    kv["dflash.target_layers"] = [1, 3, 5]
    steps.append(now().reason)
    kv.update({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["t"] * 256})
    types.update({"tokenizer.ggml.model": "STRING", "tokenizer.ggml.tokens": "ARRAY[STRING]"})
    steps.append(now().reason)
    kv["tokenizer.ggml.mask_token_id"], types["tokenizer.ggml.mask_token_id"] = 250, "UINT32"
    assert now().accepts, now().refusals
    hint = engines.LLAMA_EXPORT_HINT        # the first refusal of a file of our format
    assert steps == [
        "key not found in model: dflash.context_length" + hint,
        "llama.cpp reads the rope base from dflash.rope.freq_base (f32); it is absent, so "
        "llama.cpp would use its default 10000 instead of the drafter's 1e+06 "
        "(dflash.rope.frequency_base)" + hint,
        "key dflash.attention.causal has wrong type str but expected type bool" + hint,
        "dflash.target_layers holds DeepSpec ids [0, 2, 4] (Strata's convention); llama.cpp "
        "reads id + 1 ([1, 3, 5] for this drafter) and would feed it the outputs of "
        "[embeddings, layer 1, layer 3] instead of layers [0, 2, 4]" + hint,
        "key not found in model: tokenizer.ggml.model (llama.cpp loads the target's tokenizer "
        "from the drafter file; its converter embeds it from --target-model-dir)",
        "llama.cpp takes the DFlash mask token from tokenizer.ggml.mask_token_id, which is "
        "absent (this file records dflash.mask_token_id = 250): it loads the drafter with mask "
        "token -1 and aborts at its first draft (get_sub_batch: failed to add embedding)",
    ]


def llama_ready(config: dict):
    """``config`` written by us, then given everything llama.cpp's reading needs."""
    kv, types, tensors = written(config)
    kv.update({"dflash.context_length": 4096, "dflash.rope.freq_base": 1e6,
               "dflash.attention.causal": False, "tokenizer.ggml.model": "gpt2",
               "tokenizer.ggml.tokens": ["t"] * 256, "tokenizer.ggml.mask_token_id": 250})
    types.update({"dflash.context_length": "UINT32", "dflash.rope.freq_base": "FLOAT32",
                  "dflash.attention.causal": "BOOL", "tokenizer.ggml.model": "STRING",
                  "tokenizer.ggml.tokens": "ARRAY[STRING]", "tokenizer.ggml.mask_token_id": "UINT32"})
    del kv["dspark.format_version"], kv["dflash.rope.frequency_base"]
    kv["dflash.target_layers"] = [t + 1 for t in kv["dflash.target_layers"]]
    return kv, types, tensors


def test_llama_cpp_heads():
    vanilla = llama_ready(synthetic_config())       # vanilla Markov + confidence with Markov
    assert reports(*vanilla)["llama.cpp"].accepts
    gated = reports(*llama_ready(synthetic_config(markov_head_type="gated")))["llama.cpp"]
    assert gated.reason == ("done_getting_tensors: wrong number of tensors; expected 31, got 29 "
                            "('markov_gate.weight' is not read: llama.cpp implements only the "
                            "vanilla Markov head)")
    assert gated.refusals[0].kind == "unsupported"
    no_markov_in_conf = reports(*llama_ready(synthetic_config(confidence_head_with_markov=False)))
    assert no_markov_in_conf["llama.cpp"].reason == (
        "check_tensor_dims: tensor 'conf_proj.weight' has wrong shape; expected    40,     1, got    32,     1")
    conf_only = reports(*llama_ready(synthetic_config(markov_rank=0, confidence_head_with_markov=False)))
    assert "'conf_proj.weight' is not read: llama.cpp reads conf_proj only beside a Markov head" in (
        conf_only["llama.cpp"].reason)


def test_llama_cpp_demands_exact_key_types(plain):
    kv, types, tensors = llama_ready(synthetic_config(**PLAIN))
    assert reports(kv, types, tensors)["llama.cpp"].accepts
    r = reports(kv, {**types, "dflash.context_length": "UINT64"}, tensors)["llama.cpp"]
    assert r.reason == "key dflash.context_length has wrong type u64 but expected type u32"
    r = reports(kv, {**types, "dflash.rope.freq_base": "FLOAT64"}, tensors)["llama.cpp"]
    assert r.reason == "key dflash.rope.freq_base has wrong type f64 but expected type f32"
    del kv["dflash.target_layers"]
    assert reports(kv, types, tensors)["llama.cpp"].reason == (
        "DFlash model requires 'target_layers' in GGUF metadata")


# --- the doc page ----------------------------------------------------------------------------------

def test_docs_engines_md_cites_every_rule():
    text = (ROOT / "docs" / "ENGINES.md").read_text()
    ids = [f"strata.open/{r.id}" for r in STRATA_OPEN_RULES] + \
          [f"strata.run/{r.id}" for r in STRATA_RUN_RULES] + \
          [f"llama.cpp/{r.id}" for r in LLAMA_RULES]
    missing = [i for i in ids if f"`{i}`" not in text]
    assert not missing, f"docs/ENGINES.md does not name {missing}"
    assert len(set(re.findall(r"`((?:strata\.open|strata\.run|llama\.cpp)/[^`]+)`", text)) - set(ids)) == 0


# --- the reports as checks: what validate, convert and quantize record ---------------------------
# (absorbed from the old strata_rules tests: the levels --strict fails and the ones it does not)

def levels(kv, types, tensors, **kw) -> dict[str, tuple[str, str]]:
    return {c.name: (c.status, c.detail) for c in engine_checks(reports(kv, types, tensors), **kw)}


def test_check_names_and_a_plain_dflash_drafter():
    got = levels(*written(synthetic_config(**PLAIN)))
    assert list(got) == ["engine.strata.open", "engine.strata.run", "engine.llama.cpp"]
    assert got["engine.strata.open"] == ("passed", "Strata's DFlash loader "
                                                   "(DFlashArtifact::open) accepts it")
    status, detail = got["engine.strata.run"]
    assert status == "info" and detail.startswith(
        "Strata's runtime (DFlashArtifact::validate_supported, fixed rms eps) refuses it "
        "(unsupported): dflash: embedding_length = 32;")
    # 2 KV heads are Flash-Next's: not refused
    assert detail.endswith("(5 more: strata.run/geometry.block_count, "
                           "strata.run/geometry.attention.head_count, "
                           "strata.run/geometry.attention.key_length, "
                           "strata.run/geometry.feed_forward_length, "
                           "strata.run/geometry.target_layers)")
    assert got["engine.llama.cpp"][0] == "info"


def test_dspark_heads_are_info_not_warning():
    got = levels(*written(synthetic_config()))
    assert got["engine.strata.open"][0] == got["engine.strata.run"][0] == "info"
    assert "carries DSpark extras" in got["engine.strata.open"][1]


def test_rms_eps_other_than_stratas_is_a_warning_whatever_else_run_refuses():
    kv, types, tensors = written(synthetic_config(rms_norm_eps=1e-5, **PLAIN))
    got = levels(kv, types, tensors)
    assert got["engine.strata.open"][0] == "passed"
    status, detail = got["engine.strata.run"]
    # the geometry is refused first, yet the decisive refusal named is the eps: a risk
    assert status == "warning" and "(misread): Strata's runtime fixes the rms eps at 1e-6" in detail
    assert "1e-05" in detail and "strata.run/geometry.embedding_length" in detail


def test_a_load_error_at_open_is_a_failure_with_stratas_exit_code():
    kv, types, tensors = written(synthetic_config(**PLAIN))
    broken = [t for t in tensors if t[0] != "blk.0.attn_q.weight"]
    verdicts = engine_verdicts(reports(kv, types, broken))
    (open_check, error), (run_check, run_error) = verdicts[0], verdicts[1]
    assert open_check.status == "failed" and open_check.error == "StrataRuleError"
    assert open_check.exit_code == StrataRuleError.exit_code == 45
    assert error.message == open_check.detail
    assert "missing required tensor 'layers.0.self_attn.q_proj'" in error.message
    # the runtime never sees a file the loader refused: open's reason, not a second failure
    assert run_check.status == "info" and run_error is None
    # a DSpark drafter with a broken tensor: the load error decides, not the DSpark refusal
    kv, types, tensors = written(synthetic_config())
    check = engine_checks(reports(kv, types, [t for t in tensors if t[0] != "fc.weight"]))[0]
    assert check.status == "failed" and "(load_error): dflash: missing required tensor 'fc'" \
        in check.detail


def test_require_turns_a_refusal_into_a_failure():
    kv, types, tensors = written(released_plain())
    verdicts = dict((c.name, (c, e)) for c, e in engine_verdicts(
        reports(kv, types, tensors), require=["strata.open", "strata.run"]))
    opened, _ = verdicts["engine.strata.open"]
    assert opened.status == "passed" and opened.detail.endswith("accepts it (required)")
    ran, error = verdicts["engine.strata.run"]
    assert ran.status == "failed" and isinstance(error, EngineRequirementError)
    assert ran.exit_code == EngineRequirementError.exit_code == 47
    assert ran.detail.startswith("drafter.gguf: --require strata.run: Strata's runtime")
    assert error.field == "strata.run" and "attention.head_count = 32" in error.found
    assert verdicts["engine.llama.cpp"][0].status == "info"      # not required: as before


# --- hostile metadata: the rules run on raw values even when our metadata check failed ---------

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from support.fuzz import fuzz_settings  # noqa: E402

_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats()
                       | st.text(max_size=8), lambda inner: st.lists(inner, max_size=4),
                       max_leaves=8)
_TYPES = st.sampled_from(sorted(engines.GGUF_TYPE_NAMES) + ["ARRAY[UINT32]", "ARRAY[INT32]",
                                                              "ARRAY[STRING]", "ARRAY[FLOAT64]"])
_KEYS = sorted(set(written(synthetic_config())[0]) | {
    "dflash.selector_top_k", "qwen3.embedding_length", "target_layers", "dflash.causal",
    "dflash.context_length", "dflash.rope.freq_base", "tokenizer.ggml.tokens"})


@pytest.mark.slow   # 300 examples (~4 s): the slowest case of the fast loop
@fuzz_settings(300)
@given(st.dictionaries(st.sampled_from(_KEYS), st.tuples(_VALUES, _TYPES), max_size=14),
       st.lists(st.tuples(st.text(max_size=20),
                          st.sampled_from(["BF16", "F32", "Q8_0", "Q5_0", "Q4_0", "Q4_1"]),
                          st.lists(st.integers(0, 2**40), max_size=3)), max_size=5))
def test_any_value_of_any_type_gives_reports_never_an_exception(typed, tensors):
    """A FLOAT64 rms eps of 1e300, an infinite block count, a scalar for target_layers, a
    string for a count ... give refusals (or nothing), never a crash: validate runs these
    rules on the raw values and types of any file the reader could parse."""
    kv = {k: v for k, (v, _t) in typed.items()}
    types = {k: t for k, (_v, t) in typed.items()}
    for check in engine_checks(engine_reports(kv, types, tensors)):
        assert check.status in ("passed", "info", "warning", "failed")


@pytest.mark.parametrize("value, vtype", [(1e300, "FLOAT64"), (math.inf, "FLOAT64"),
                                          (math.nan, "FLOAT32"), (10**400, "UINT64")])
def test_numbers_beyond_every_range_are_read_not_raised(plain, value, vtype):
    kv, types, tensors = plain
    for key in ("dflash.attention.layer_norm_rms_epsilon", "dflash.block_count",
                "dflash.rope.frequency_base", "dflash.markov_rank"):
        got = levels({**kv, key: value}, {**types, key: vtype}, tensors)
        assert {s for s, _d in got.values()} <= {"passed", "info", "warning", "failed"}
    eps = levels({**kv, "dflash.attention.layer_norm_rms_epsilon": 1e300},
                 {**types, "dflash.attention.layer_norm_rms_epsilon": "FLOAT64"}, tensors)
    assert eps["engine.strata.run"][0] == "warning" and "1e+300" in eps["engine.strata.run"][1]


# --- the done-when through the CLI: artifacts of the two real geometries ------------------------

def sparse_plain_artifact(root, config: dict):
    """A plain DFlash checkpoint of ``config``'s geometry whose weights are a hole (zeros:
    finite BF16, bench/sparse_models.py), converted by the CLI: ~1 GB of drafter.gguf
    written and read back, a few MB of memory."""
    sparse = load_tool("bench/sparse_models.py", siblings=("make_checkpoint",))
    src = root / "src"
    src.mkdir(parents=True)
    (src / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    contract = build_contract(parse_config(config))
    sparse.write_sparse_safetensors(src / "model.safetensors",
                                    {t.source_name: list(t.shape) for t in contract.tensors
                                     if t.kind != "embedding"})
    out = root / "artifact"
    proc = run_cli("convert", str(src), "-o", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr
    shutil.rmtree(src)
    return out


@pytest.mark.slow
def test_released_geometry_and_flash_next_through_the_cli(tmp_path):
    released = sparse_plain_artifact(tmp_path / "released", released_plain())
    proc = run_cli("validate", str(released), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["engines"] == {
        "strata.open": {"accepts": True, "reason": None},
        "strata.run": {"accepts": False, "reason": (
            "dflash: attention.head_count = 32; the runtime's geometry-specific fast path "
            "implements the published Flash-Next drafter (24) only")},
        "llama.cpp": {"accepts": False, "reason": "key not found in model: dflash.context_length"
                      + engines.LLAMA_EXPORT_HINT}}
    proc = run_cli("validate", str(released), "--require", "strata.run")
    line = assert_refused(proc, EngineRequirementError, ["engine.strata.run: ",
                                                         "--require strata.run",
                                                         "attention.head_count = 32"])
    assert "strata.run" in proc.stdout and "FAILED" in proc.stdout, line
    assert run_cli("validate", str(released), "--require", "strata.open").returncode == 0
    shutil.rmtree(released)

    flash = sparse_plain_artifact(tmp_path / "flash", flash_next())
    proc = run_cli("validate", str(flash), "--json", "--require", "strata.run",
                   "--require", "strata.open")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["required"] == ["strata.open", "strata.run"]
    assert data["engines"]["strata.open"] == data["engines"]["strata.run"] == {
        "accepts": True, "reason": None}
    proc = run_cli("validate", str(flash), "--require", "strata.run", "--strict")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert "accepts it (required)" in proc.stdout


def test_quantized_matrices_at_both_stages():
    """The engines' quantization rules: Strata opens and runs a Flash-Next drafter whose
    matrices are Q8_0/Q5_0/Q4_0 (norms BF16); a quantized norm it cannot load."""
    kv, types, tensors = written(flash_next())
    for qtype in ("Q8_0", "Q5_0", "Q4_0"):
        quantized = [(n, qtype if len(s) == 2 else t, s) for n, t, s in tensors]
        r = reports({**kv, "strata.dflash.quantization": qtype},
                    {**types, "strata.dflash.quantization": "STRING"}, quantized)
        assert r["strata.open"].accepts and r["strata.run"].accepts, qtype
    norm = edit_tensor(tensors, "blk.4.ffn_norm.weight", type="Q8_0")
    r = reports(kv, types, norm)
    assert r["strata.open"].refusals[0].kind == "load_error"
    assert r["strata.run"].reason == r["strata.open"].reason == (
        "dflash: tensor 'blk.4.ffn_norm.weight' is Q8_0; expected BF16 norms and BF16, Q8_0, "
        "Q5_0 or Q4_0 matrices")


def test_llama_cpp_refuses_more_layers_than_its_arrays_hold(plain):
    kv, types, tensors = llama_ready(synthetic_config(**PLAIN))
    r = reports({**kv, "dflash.block_count": 513}, types, tensors)["llama.cpp"]
    assert r.reason == "n > N_MAX: 513 > 512 for key dflash.feed_forward_length"
    assert r.refusals[0].rule == "llama.cpp/max_layers"
    # and the tensor table is never expanded to 2^32 - 1 layers
    huge = reports({**kv, "dflash.block_count": 2**32 - 1}, types, tensors)["llama.cpp"]
    assert [f.rule for f in huge.refusals] == ["llama.cpp/max_layers"]
