"""artifact/engines.py on Gemma4 artifacts: what Strata's DFlash loader
(`strata.open`), its runtime (`strata.run`) and llama.cpp 0c1e570 make of one, stage by stage
(docs/ENGINES.md, "A Gemma4 artifact, stage by stage").

Inputs are real: the golden Gemma4 drafters converted and read back, and the metadata and
tensor table convert writes for DeepSeek's released 12B config (as quoted), some edited in
one place. Every report of a Gemma4 artifact is information, never a failed check.
"""

from __future__ import annotations

import json
import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from support.cli import assert_refused, run_cli
from support.fuzz import fuzz_settings
from support.gemma4 import GEMMA4_DRAFTERS, GEMMA4_RELEASED_CONFIG
from dspark_convert.artifact import engines
from dspark_convert.artifact.engines import (as_written, engine_checks, engine_reports,
                                             gguf_inputs)
from dspark_convert.artifact.format import LOCAL_REVISION, Provenance, expected_metadata
from dspark_convert.commands.convert import convert
from dspark_convert.contract.gemma4 import build_contract, parse_config
from dspark_convert.errors import EngineRequirementError
from dspark_convert.formats.gguf_reader import read_gguf

NAMES = sorted(GEMMA4_DRAFTERS)
DSPARK, DFLASH = "gemma4_vanilla_conf_markov", "gemma4_dflash"
PROV = Provenance(name="x", repository=None, revision=LOCAL_REVISION, source_sha256="0" * 64,
                  embed_sha256=None, lm_head_sha256=None)
STRATA_WORDS = "dflash: general.architecture is 'dspark-gemma4', a DFlash artifact declares 'dflash'"
LLAMA_WORDS = "unknown model architecture: 'dspark-gemma4'"
STRATA_RUN_MISREADS = {f"strata.run/gemma4.{r}" for r in (
    "embedding_scale", "attention_scale", "rope", "value", "activation", "norms",
    "layer_scalar", "softcap")}
LLAMA_MISREADS = {f"llama.cpp/gemma4.{r}" for r in (
    "embedding_scale", "attention_scale", "activation", "rope")}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma4-engines")
    out = {}
    for name in NAMES:
        out[name] = root / name
        convert(GEMMA4_DRAFTERS[name], out[name])
    return out


def from_artifact(directory):
    return gguf_inputs(read_gguf(directory / "drafter.gguf"))


def released_config(**changes) -> dict:
    return {**json.loads(GEMMA4_RELEASED_CONFIG.read_text()), **changes}


def written(cfg: dict):
    """(values, types, tensors) exactly as convert writes them for a Gemma4 ``cfg``."""
    contract = build_contract(parse_config(cfg), raw=cfg)
    values, types = as_written(expected_metadata(contract, PROV))
    return values, types, [(t.gguf_name, "BF16", t.gguf_shape) for t in contract.written_tensors]


def reports(values, types, tensors):
    return engine_reports(values, types, tensors, path="drafter.gguf")


def rules(report) -> list[str]:
    return [r.rule for r in report.refusals]


def message(report, rule: str) -> str:
    return next(r.message for r in report.refusals if r.rule == rule)


# --- strata.open: what Strata's DFlash loader would do -----------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_strata_open_stops_at_the_architecture_and_says_what_would_follow(artifacts, name):
    opened = reports(*from_artifact(artifacts[name]))["strata.open"]
    # Strata's own first words, then why: a drafter family its loader does not implement.
    assert opened.reason.startswith(STRATA_WORDS + " (a gemma4-dspark drafter")
    assert "SiLU" in opened.reason and "no softcap" in opened.reason
    # Past the architecture, in open's order: the metadata, taps and bounds read as meant;
    # a DSpark drafter's heads; the inventory's missing v_proj; the tensors it has no name for.
    dspark_heads = ["strata.open/dspark_extras", "strata.open/extension_tensor"]
    assert rules(opened) == ["strata.open/architecture",
                             *(dspark_heads if name == DSPARK else []),
                             "strata.open/tensor_inventory", "strata.open/gemma4.unknown_tensors"]
    assert [r.kind for r in opened.refusals if "dspark" not in r.rule and "extension" not in r.rule] \
        == ["load_error"] * 3
    missing = message(opened, "strata.open/tensor_inventory")
    assert missing.startswith("dflash: missing required tensor 'layers.0.self_attn.v_proj' "
                              "(looked for 'blk.0.attn_v.weight', 'layers.0.self_attn.v_proj.weight',")
    assert "attention_k_eq_v" in missing
    unknown = message(opened, "strata.open/gemma4.unknown_tensors")
    assert unknown.startswith("dflash: unknown tensor 'blk.0.layer_output_scale.weight' in the artifact")
    # Two layers: a layer scalar and two of the four norms each; attn_norm and ffn_norm are
    # Strata's own names (ffn_norm, the pre-FFN norm, is what it binds before the MLP).
    assert "no place for 6 of this drafter's tensors" in unknown
    for part in ("blk.N.layer_output_scale.weight, the layer scalar",
                 "blk.N.post_attention_norm.weight, the norm of the attention output",
                 "blk.N.post_ffw_norm.weight, the norm of the MLP output"):
        assert part in unknown
    assert "attn_norm" not in unknown and "ffn_norm" not in unknown


def test_strata_reads_the_global_head_geometry_released_12b():
    """key_length is global_head_dim (512), head_count_kv num_global_key_value_heads (1): the
    loader's numbers, head dim and bounds pass; only the runtime's Flash-Next gate refuses."""
    r = reports(*written(released_config()))
    assert not {"strata.open/metadata_numbers", "strata.open/head_dim",
                "strata.open/geometry_bounds", "strata.open/target_layers"} & set(rules(r["strata.open"]))
    gate = {rule: message(r["strata.run"], rule) for rule in rules(r["strata.run"])
            if rule.startswith("strata.run/geometry.")}
    assert {rule: text.split(";")[0] for rule, text in gate.items()} == {
        "strata.run/geometry.embedding_length": "dflash: embedding_length = 3840",
        "strata.run/geometry.attention.head_count": "dflash: attention.head_count = 16",
        "strata.run/geometry.attention.head_count_kv": "dflash: attention.head_count_kv = 1",
        "strata.run/geometry.attention.key_length": "dflash: attention.key_length = 512",
        "strata.run/geometry.feed_forward_length": "dflash: feed_forward_length = 15360"}
    # Five draft layers and five taps: the two the 12B shares with Flash-Next.


def test_without_k_eq_v_the_inventory_passes_and_the_layer_scalar_is_first():
    """A drafter whose layers keep v_proj (attention_k_eq_v false, KV heads from
    num_key_value_heads): the inventory resolves it, and open's last check meets the layer
    scalar first, in file order."""
    values, types, tensors = written(released_config(attention_k_eq_v=False))
    assert ("blk.0.attn_v.weight", "BF16", [3840, 8 * 512]) in tensors
    r = reports(values, types, tensors)
    opened = rules(r["strata.open"])
    assert "strata.open/tensor_inventory" not in opened
    assert opened[-1] == "strata.open/gemma4.unknown_tensors"
    assert message(r["strata.open"], opened[-1]).startswith(
        "dflash: unknown tensor 'blk.0.layer_output_scale.weight' in the artifact (its "
        "inventory has no place for 15 of this drafter's tensors")
    assert "attention.head_count_kv = 8;" in message(r["strata.run"],
                                                     "strata.run/geometry.attention.head_count_kv")
    assert "RMS-normalises v_proj's output" in message(r["strata.run"], "strata.run/gemma4.value")


# --- strata.run: what Strata's runtime would compute, were it loaded --------------------------------

def test_strata_run_misreads_on_the_released_12b():
    run = reports(*written(released_config()))["strata.run"]
    assert run.reason.startswith(STRATA_WORDS)                  # open's refusals first
    assert STRATA_RUN_MISREADS <= set(rules(run))
    assert {r.kind for r in run.refusals if r.rule in STRATA_RUN_MISREADS} == {"misread"}
    assert "strata.run/rms_eps" not in rules(run)                # 1e-6, as Strata's kEps
    texts = {rule: message(run, rule) for rule in STRATA_RUN_MISREADS}
    assert f"sqrt(embedding_length) = {math.sqrt(3840):g}" in texts["strata.run/gemma4.embedding_scale"]
    assert "1/16 = 1/sqrt(256)" in texts["strata.run/gemma4.attention_scale"]
    assert "scale is 1.0" in texts["strata.run/gemma4.attention_scale"]
    assert ("rotates all 256 pairs of each head (NeoX RoPE over key_length 512" in
            texts["strata.run/gemma4.rope"])
    assert "rotates the first 64 alike and leaves the other 192" in texts["strata.run/gemma4.rope"]
    assert "has no v_proj: V is the RMS norm (no weight) of k_proj's output" in texts["strata.run/gemma4.value"]
    assert "down(gelu_pytorch_tanh(gate(x))·up(x))" in texts["strata.run/gemma4.activation"]
    assert "pre_feedforward_layernorm, the right one" in texts["strata.run/gemma4.norms"]
    assert "blk.N.layer_output_scale" in texts["strata.run/gemma4.layer_scalar"]
    assert "30·tanh(z/30): the argmax is the same" in texts["strata.run/gemma4.softcap"]


@pytest.mark.parametrize("name", NAMES)
def test_strata_run_on_the_fixtures(artifacts, name):
    run = reports(*from_artifact(artifacts[name]))["strata.run"]
    assert STRATA_RUN_MISREADS <= set(rules(run))
    assert "= 8 (Gemma4's scaled embedding)" in message(run, "strata.run/gemma4.embedding_scale")
    assert "first 4 alike and leaves the other 12" in message(run, "strata.run/gemma4.rope")
    assert "target_layers holds 3 taps" in message(run, "strata.run/geometry.target_layers")


@pytest.mark.parametrize("changes, gone", [
    # A full rotary (the `default` type) is what Strata's NeoX RoPE computes.
    (dict(rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                           "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
     {"strata.run/gemma4.rope", "llama.cpp/gemma4.rope"}),
    # No softcap: nothing to compute otherwise, in either engine.
    (dict(final_logit_softcapping=None), {"strata.run/gemma4.softcap", "llama.cpp/gemma4.softcap"}),
], ids=["default-rope", "no-softcap"])
def test_a_misread_follows_what_the_file_says(changes, gone):
    before = reports(*written(released_config()))
    after = reports(*written(released_config(**changes)))
    got = set(rules(after["strata.run"])) | set(rules(after["llama.cpp"]))
    had = set(rules(before["strata.run"])) | set(rules(before["llama.cpp"]))
    assert gone <= had and not gone & got
    assert had - got == gone


# --- llama.cpp 0c1e570 --------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_llama_cpp_stops_at_the_architecture_and_names_the_softcap(artifacts, name):
    report = reports(*from_artifact(artifacts[name]))["llama.cpp"]
    assert report.reason.startswith(LLAMA_WORDS + " (a gemma4-dspark artifact")
    assert "`dspark export` writes none (105)" in report.reason
    # No export hint: `dspark export` writes no Gemma4 file.
    assert not any("this is the Strata-layout artifact" in r.message for r in report.refusals)
    softcap = next(r for r in report.refusals if r.rule == "llama.cpp/gemma4.softcap")
    assert softcap.kind == "unsupported"
    assert "'Gemma4 DSpark logit softcapping is not supported'" in softcap.message
    assert softcap.message.endswith("30·tanh(z/30), the Markov bias added after"
                                    if name == DSPARK else "30·tanh(z/30)")
    assert LLAMA_MISREADS <= set(rules(report))
    # Qwen3's tensor table is not llama.cpp's reading of a Gemma4 file (no attn_v is no error).
    assert not {"llama.cpp/tensor_shapes", "llama.cpp/tensor_count",
                "llama.cpp/embedding_as_head"} & set(rules(report))


def test_llama_cpp_keys_as_its_converter_writes_them_leave_only_the_softcap():
    """With the keys and the rope_freqs tensor llama.cpp's own Gemma4DSparkModel converter
    writes (conversion/gemma.py), its four Gemma4 misreads are gone; its missing softcap is not."""
    values, types, tensors = written(released_config())
    llama_keys = {"dflash.embedding_scale": (math.sqrt(3840), "FLOAT32"),
                  "dflash.attention.scale": (1.0, "FLOAT32"),
                  "dflash.hidden_activation": ("gelu_pytorch_tanh", "STRING")}
    values = {**values, **{k: v for k, (v, _t) in llama_keys.items()}}
    types = {**types, **{k: t for k, (_v, t) in llama_keys.items()}}
    tensors = [*tensors, ("rope_freqs.weight", "F32", [256])]
    got = set(rules(reports(values, types, tensors)["llama.cpp"]))
    assert not LLAMA_MISREADS & got and "llama.cpp/gemma4.softcap" in got
    # And each one back, alone, when its key says something else.
    for key, value, rule in [("dflash.embedding_scale", 1.0, "embedding_scale"),
                             ("dflash.attention.scale", 0.0, "attention_scale"),
                             ("dflash.hidden_activation", "silu", "activation")]:
        one = reports({**values, key: value}, types, tensors)["llama.cpp"]
        assert f"llama.cpp/gemma4.{rule}" in rules(one), key
    text = message(reports({**values, "dflash.attention.scale": 0.0}, types, tensors)["llama.cpp"],
                   "llama.cpp/gemma4.attention_scale")
    assert "0.0 here: it would use 1/sqrt(512) instead of this drafter's 1.0" in text


# --- the checks: information, never a failure -------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_every_engine_check_is_info(artifacts, name):
    values, types, tensors = from_artifact(artifacts[name])
    checks = engine_checks(reports(values, types, tensors))
    assert [(c.name, c.status) for c in checks] == [
        ("engine.strata.open", "info"), ("engine.strata.run", "info"), ("engine.llama.cpp", "info")]
    # The same file without its family is a Qwen3 file, made for Strata's loader: its
    # architecture is then a broken artifact (45), as for any Qwen3 artifact.
    values = {k: v for k, v in values.items() if k != "dspark.family"}
    opened = engine_checks(reports(values, types, tensors))[0]
    assert (opened.status, opened.exit_code) == ("failed", 45)
    assert re.search(re.escape(STRATA_WORDS) + r" \(\d+ more", opened.detail)  # no Gemma4 note


def test_validate_json_records_the_reports_and_require_refuses(artifacts):
    art = artifacts[DFLASH]
    proc = run_cli("validate", str(art), "--strict", "--json")
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)["engines"]
    want = reports(*from_artifact(art))
    assert got == {engine: report.to_dict() for engine, report in want.items()}
    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest["engines"] == got
    for engine, words in [("strata.open", STRATA_WORDS), ("llama.cpp", LLAMA_WORDS)]:
        refused = run_cli("validate", str(art), "--require", engine)
        assert_refused(refused, EngineRequirementError, [f"--require {engine}", words])


def test_an_unknown_family_is_the_whole_report(artifacts):
    values, types, tensors = from_artifact(artifacts[DFLASH])
    r = reports({**values, "dspark.family": "llama4-dspark"}, types, tensors)
    for engine in ("strata.open", "strata.run", "llama.cpp"):
        assert [x.rule.split("/")[1] for x in r[engine].refusals] == ["family"], engine
        assert "'llama4-dspark'" not in r[engine].reason and "llama4-dspark drafter" in r[engine].reason
    assert {c.status for c in engine_checks(r)} == {"info"}


# --- hostile values of the family's keys: reports, never an exception --------------------------------

_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats()
                       | st.text(max_size=8), lambda inner: st.lists(inner, max_size=4),
                       max_leaves=8)
_TYPES = st.sampled_from(sorted(engines.GGUF_TYPE_NAMES) + ["ARRAY[UINT32]", "ARRAY[STRING]"])
_BASE = written(released_config())
_KEYS = sorted(set(_BASE[0]) - {"dspark.family"} | {
    "dflash.embedding_scale", "dflash.attention.scale", "dflash.hidden_activation"})


@fuzz_settings(150)
@given(st.dictionaries(st.sampled_from(_KEYS), st.tuples(_VALUES, _TYPES), max_size=10))
def test_any_value_of_a_gemma4_key_gives_reports(typed):
    values = {**_BASE[0], **{k: v for k, (v, _t) in typed.items()}}
    types = {**_BASE[1], **{k: t for k, (_v, t) in typed.items()}}
    for check in engine_checks(reports(values, types, _BASE[2])):
        assert check.status in ("info", "warning")
