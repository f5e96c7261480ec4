"""`dspark convert` of speculators-format drafters: the fixtures
speculators' own save_pretrained wrote (golden/speculators/, golden/make_speculators_fixtures.py)
convert to exactly the artifact tensors of their DeepSpec twins, record the source format,
smoke against DeepSeek's own traces, and what the format cannot say is refused with its own
code, nothing written.

These tests need no speculators environment: the fixtures are files. (Their --check, which
remakes them with speculators, is in test_speculators_export.py, beside the other tests that
run speculators.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from support.cli import assert_refused, run_cli
from support.paths import GOLDEN, GOLDEN_TARGET as TARGET
from support.tools import load_tool
from dspark_convert.artifact.format import read_metadata
from dspark_convert.commands.convert import convert
from dspark_convert.commands.smoke import run_smoke
from dspark_convert.commands.validate import validate_artifact
from dspark_convert.contract import speculators as S
from dspark_convert.formats.gguf_reader import read_gguf
from dspark_convert.errors import (
    AnchorLayoutError,
    ConfigError,
    DraftVocabularyError,
    SampleFromAnchorMissingError,
    SampleFromAnchorOptionError,
    SpeculatorsModelError,
    SpeculatorsTargetError,
    TargetLayerError,
)

fixtures = load_tool("golden/make_speculators_fixtures.py")
SPEC = GOLDEN / "speculators"
HEADS = ("vanilla_conf_markov", "gated_conf_markov", "rnn_conf_plain", "dflash_shared")
# DeepSeek's own drafters and traces, for the two fixtures that are theirs.
TRACES = {"vanilla_conf_markov": GOLDEN / "reference" / "vanilla_conf_markov" / "reference.json",
          "dflash_shared": GOLDEN / "reference" / "dflash_shared" / "reference.json"}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """name -> (the speculators fixture's artifact, its DeepSpec twin's artifact)."""
    root = tmp_path_factory.mktemp("speculators-convert")
    out = {}
    for name in HEADS:
        twin = fixtures.write_twin(name, root / "twins" / name)
        out[name] = (convert(SPEC / name, root / f"{name}-spec", target=TARGET),
                     convert(twin, root / f"{name}-twin", target=TARGET))
    return out


def _kv(result) -> dict:
    return read_metadata(read_gguf(result.output / "drafter.gguf"), path="drafter.gguf")


@pytest.mark.parametrize("name", HEADS)
def test_converts_to_exactly_the_twins_tensors(pairs, name):
    spec, twin = pairs[name]
    ms, mt = spec.manifest, twin.manifest
    assert ms.contract == mt.contract
    assert ms.artifact.tensors == mt.artifact.tensors         # names, types, shapes, SHA-256
    assert [t.name for t in ms.artifact.tensors] == [t.name for t in mt.artifact.tensors]
    # The embedding and head the twin's copies hash to are the ones recorded from the target.
    ks, kt = _kv(spec), _kv(twin)
    differ = {k for k in set(ks) | set(kt) if ks.get(k) != kt.get(k)}
    # Only where the weights came from: the source files' digest (general.name is the
    # directory's name, here the same).
    assert differ == {"dflash.source.sha256"}, differ
    assert ks["dflash.target.embed_sha256"] == kt["dflash.target.embed_sha256"]
    # Same header size (same keys, same lengths), so every tensor lies at the same offset.
    assert ms.artifact.size == mt.artifact.size


@pytest.mark.parametrize("name", HEADS)
def test_the_manifest_records_the_source_format(pairs, name):
    spec, twin = pairs[name]
    rec = spec.manifest.source.speculators
    assert rec is not None and twin.manifest.source.speculators is None
    raw = json.loads((SPEC / name / "config.json").read_text())
    assert rec.config == raw and rec.format == "speculators" and rec.version == "0.9.0"
    assert rec.model_type == ("dflash" if name == "dflash_shared" else "dspark")
    assert rec.sample_from_anchor is True and rec.layout_stated_by == "config"
    # source.config is the twin's DeepSpec config: taps = aux ids - 1, the target's layers.
    cfg = spec.manifest.source.config
    assert cfg["target_layer_ids"] == [i - 1 for i in raw["aux_hidden_state_layer_ids"]]
    assert cfg["num_target_layers"] == 6 and cfg["architectures"] == ["Qwen3DSparkModel"]
    assert spec.manifest.source.stripped == []               # speculators saved neither copy
    assert {s.name for s in twin.manifest.source.stripped} == {"embed_tokens.weight",
                                                               "lm_head.weight"}
    assert any(c.name == "source.format" for c in spec.manifest.checks)
    assert "speculators" not in json.dumps(twin.manifest.model_dump()["source"])
    assert validate_artifact(spec.output, target=TARGET).ok


@pytest.mark.parametrize("name", sorted(TRACES))
def test_smokes_with_deepseeks_traces(pairs, name):
    """DeepSeek's own runs of the twin, reproduced cycle by cycle by the speculators one."""
    spec, _ = pairs[name]
    result = run_smoke(spec.output, target=TARGET, max_new_tokens=24, device="cpu",
                       reference=TRACES[name])
    assert result.lossless and all(r.reference_run is not None for r in result.runs)


@pytest.mark.parametrize("name", ["gated_conf_markov", "rnn_conf_plain"])
def test_untrained_heads_smoke_lossless(pairs, name):
    spec, _ = pairs[name]
    result = run_smoke(spec.output, target=TARGET, prompts=[[1, 17, 33, 90, 250, 7, 7, 401]],
                       max_new_tokens=16, device="cpu")
    assert result.lossless


def test_a_stated_layout_converts_the_config_without_one(tmp_path, pairs):
    done = convert(SPEC / "no_layout", tmp_path / "out", target=TARGET, sample_from_anchor=True)
    assert done.manifest.artifact.tensors == pairs["vanilla_conf_markov"][1].manifest.artifact.tensors
    assert done.manifest.source.speculators.layout_stated_by == "option"


def _copy(tmp_path: Path, name: str, edit=None, tensors=None) -> Path:
    dest = tmp_path / f"src-{name}"
    shutil.copytree(SPEC / name, dest)
    if edit is not None:
        config = json.loads((dest / "config.json").read_text())
        edit(config)
        (dest / "config.json").write_text(json.dumps(config, indent=2))
    if tensors is not None:
        weights = load_file(dest / "model.safetensors")
        tensors(weights)
        save_file(weights, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest


def _set(**fields):
    return lambda c: c.update(fields)


def _nested(**fields):
    return lambda c: c["transformer_layer_config"].update(fields)


REFUSALS = [
    # (fixture, edit of config.json, edit of the weights, extra options, error, needles)
    ("no_layout", None, None, (), SampleFromAnchorMissingError,
     ("'sample_from_anchor' is missing", "reads it true", "vLLM 0.33 reads it false",
      "--sample-from-anchor")),
    ("no_layout", None, None, ("--sample-from-anchor", "false"), AnchorLayoutError,
     ("--sample-from-anchor`, or a gate policy drafter's sample_from_anchor) is false",
      "anchor-as-bonus")),
    ("vanilla_conf_markov", _set(sample_from_anchor=False), None, (), AnchorLayoutError,
     ("'sample_from_anchor' is false", "p+1+j")),
    ("vanilla_conf_markov", None, None, ("--sample-from-anchor", "false"),
     SampleFromAnchorOptionError, ("says sample_from_anchor true",)),
    ("reduced_vocab", None, None, (), DraftVocabularyError,
     ("'draft_vocab_size' is 256", "no vocabulary map yet")),
    ("vanilla_conf_markov", None, lambda w: w.update(d2t=w["norm.weight"].long()), (),
     DraftVocabularyError, ("tensor 'd2t'", "no vocabulary map yet")),
    ("vanilla_conf_markov", _nested(model_type="gemma4_text"), None, (), SpeculatorsModelError,
     ("transformer_layer_config.model_type", "Gemma4")),
    ("vanilla_conf_markov", _set(speculators_model_type="eagle3"), None, (),
     SpeculatorsModelError, ("'speculators_model_type'", "eagle3")),
    ("vanilla_conf_markov", _set(target_hidden_size=128), None, (), SpeculatorsModelError,
     ("'target_hidden_size' is 128",)),
    ("vanilla_conf_markov", _set(aux_hidden_state_layer_ids=[0, 3, 5]), None, (),
     TargetLayerError, ("'aux_hidden_state_layer_ids[0]'", "embedding")),
    ("vanilla_conf_markov", _set(mask_token_id=None), None, (), ConfigError,
     ("'mask_token_id'",)),
    ("vanilla_conf_markov", _nested(rms_norm_eps="1e-6"), None, (), ConfigError,
     ("transformer_layer_config.rms_norm_eps",)),
]


@pytest.mark.parametrize("case", range(len(REFUSALS)))
def test_refusals_name_the_field_and_write_nothing(tmp_path, case):
    name, edit, weights, options, error, needles = REFUSALS[case]
    src = _copy(tmp_path, name, edit, weights)
    out = tmp_path / "out"
    proc = run_cli("convert", str(src), "-o", str(out), "--target", str(TARGET), *options)
    assert_refused(proc, error, needles)
    assert not out.exists() and not [p for p in tmp_path.iterdir() if "tmp" in p.name]


def test_a_speculators_source_needs_the_target(tmp_path):
    out = tmp_path / "out"
    proc = run_cli("convert", str(SPEC / "vanilla_conf_markov"), "-o", str(out))
    assert_refused(proc, SpeculatorsTargetError, ("--target", "no embedding"))
    assert not out.exists()


def test_the_option_is_refused_for_a_deepspec_source(tmp_path):
    out = tmp_path / "out"
    proc = run_cli("convert", str(GOLDEN / "reference" / "vanilla_conf_markov" / "draft"), "-o",
                   str(out), "--target", str(TARGET), "--sample-from-anchor", "true")
    assert_refused(proc, SampleFromAnchorOptionError, ("DeepSpec's config",))
    assert not out.exists()


def test_the_mapping_table_names_every_field_speculators_writes():
    """Every top-level field of a config speculators' save_pretrained wrote is a row of the
    table, or one transformers adds to any config (architectures, auto_map, dtype ...)."""
    raw = json.loads((SPEC / "vanilla_conf_markov" / "config.json").read_text())
    named = {r.speculators.split(".")[0] for r in S.FIELDS if r.speculators}
    transformers_own = {"architectures", "auto_map", "tie_word_embeddings", "transformers_version"}
    assert set(raw) - named - transformers_own == set()
    keys = set(load_file(SPEC / "vanilla_conf_markov" / "model.safetensors"))
    assert not keys & set(S.NEVER_SAVED) and not keys & set(S.VOCABULARY_MAP)
    reduced = set(load_file(SPEC / "reduced_vocab" / "model.safetensors"))
    assert set(S.VOCABULARY_MAP) | {"lm_head.weight"} <= reduced
