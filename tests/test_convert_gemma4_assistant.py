"""Gemma 4 assistant artifacts: `dspark convert` of a Gemma4UnifiedAssistantForCausalLM
against its gemma4_unified target (config.json and generation_config.json), `dspark
validate` from drafter.gguf alone, the pairing (backbone, vocabulary, KV layers), the runtime
loading the artifact (golden/reference/gemma4_assistant/reference.json's runs in both KV
modes) and `binding.bind` (docs/ARTIFACT_FORMAT.md, "Drafter kinds: the Gemma 4 assistant")."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from gguf import GGUFValueType as VT

from dspark_convert import errors as E
from dspark_convert.artifact.format import (ASSISTANT_METADATA_KEYS, FORMAT_VERSIONS,
                                            as_float32, contract_from_metadata, read_metadata)
from dspark_convert.artifact.engines import reports_for_gguf
from dspark_convert.commands.binding import bind, open_run_target
from dspark_convert.commands.convert import convert
from dspark_convert.commands.validate import validate_artifact
from dspark_convert.contract import gemma4_assistant as C
from dspark_convert.formats.gguf_reader import read_gguf
from dspark_convert.runtime import gemma4_assistant as A
from dspark_convert.runtime.gemma4 import Gemma4Target
from support.cli import assert_refused, run_cli
from support.gemma4 import GEMMA4_TARGET
from support.llama_cpp import rewrite_gguf
from support.paths import GOLDEN, GOLDEN_TARGET
from test_runtime_gemma4_assistant import _compare_cycles

FIXTURE = GOLDEN / "reference" / "gemma4_assistant"
ASSISTANT = FIXTURE / "assistant"
REFERENCE = json.loads((FIXTURE / "reference.json").read_text())

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("assistant") / "art"
    convert(ASSISTANT, out, target=GEMMA4_TARGET)
    return out


@pytest.fixture(scope="module")
def target():
    return Gemma4Target(GEMMA4_TARGET, device=torch.device("cpu"))


def _kv(art: Path) -> dict:
    return read_metadata(read_gguf(art / "drafter.gguf"), path="drafter.gguf")


def test_convert_writes_the_assistant_format(artifact):
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert manifest["format_version"] == FORMAT_VERSIONS["gemma4-assistant"] == 4
    assert manifest["contract"]["family"] == "gemma4-assistant"
    # generation_config.json: read, hashed among the source's files, kept verbatim.
    assert manifest["source"]["companion"] == json.loads(
        (ASSISTANT / "generation_config.json").read_text())
    assert "generation_config.json" in [f["path"] for f in manifest["source"]["files"]]
    kv = _kv(artifact)
    assert list(kv) == [k.key for k in ASSISTANT_METADATA_KEYS
                        if k.key not in ("general.source.huggingface.repository",
                                         "gemma4-assistant.final_logit_softcapping")]
    assert kv["general.architecture"] == "gemma4-assistant"
    assert (kv["gemma4-assistant.embedding_length"],
            kv["gemma4-assistant.embedding_length_out"]) == (32, 64)
    assert kv["gemma4-assistant.attention.head_count_kv"] == [2, 1]
    assert (kv["gemma4-assistant.attention.key_length_swa"],
            kv["gemma4-assistant.attention.key_length"]) == (16, 32)
    assert kv["dspark.assistant.num_assistant_tokens"] == 4
    assert kv["dspark.assistant.rope.type"] == "proportional"
    # Nothing stripped: the assistant's own tied embedding is its head, kept as token_embd.
    assert manifest["source"]["stripped"] == []
    records = {r["source"]: r for r in manifest["artifact"]["tensors"]}
    assert records["model.embed_tokens.weight"]["name"] == "token_embd.weight"
    assert records["pre_projection.weight"]["name"] == "nextn.pre_projection.weight"
    assert set(records) == set(C.tensor_shapes(C.read_assistant_spec(ASSISTANT)))
    # The input embedding is the target's: its hash recorded.
    embed = next(t for t in manifest["target"]["tensors"] if t["role"] == "embedding")
    assert kv["dflash.target.embed_sha256"] == embed["sha256"]
    head = next(c for c in manifest["target"]["checks"] if c["name"] == "target.identity.head")
    assert "its own tied embedding [512, 32], not the target's [512, 64]" in head["detail"]


def test_validate_rebuilds_the_contract_from_the_gguf_alone(artifact):
    manifest = json.loads((artifact / "manifest.json").read_text())
    rebuilt = contract_from_metadata(_kv(artifact), path="drafter.gguf").model_dump()
    eps = manifest["contract"]["geometry"].pop("rms_norm_eps")
    assert rebuilt["geometry"].pop("rms_norm_eps") == as_float32(eps)
    assert rebuilt == manifest["contract"]
    report = validate_artifact(artifact, target=GEMMA4_TARGET)
    assert report.ok and report.warnings == 0, report.checks
    assert {"target.shared_kv", "target.identity.embedding", "target.identity.head"} <= \
        {c.name for c in report.checks}


@pytest.mark.parametrize("key,value,vtype,error", [
    ("gemma4-assistant.attention.shared_kv_layers", 1, VT.UINT32, E.MetadataError),
    ("dspark.assistant.num_assistant_tokens", 0, VT.UINT32, E.AssistantConfigError),
    ("gemma4-assistant.attention.key_length", 31, VT.UINT32, E.AssistantConfigError),
])
def test_a_bad_metadata_value_fails_gguf_metadata(artifact, tmp_path, key, value, vtype, error):
    art = tmp_path / "art"
    shutil.copytree(artifact, art)
    rewrite_gguf(artifact / "drafter.gguf", art / "drafter.gguf",
                 set_keys={key: (value, vtype, None)})
    first = validate_artifact(art).first_failure
    assert (first.name, first.error) == ("gguf.metadata", error.__name__)


def test_validate_against_a_qwen3_target_is_refused(artifact):
    first = validate_artifact(artifact, target=GOLDEN_TARGET).first_failure
    assert (first.name, first.error) == ("target", "AssistantTargetError")


def test_convert_without_a_target_is_refused(tmp_path):
    proc = run_cli("convert", str(ASSISTANT), "-o", str(tmp_path / "out"))
    assert_refused(proc, E.KindTargetRequiredError, ["--target"])


def test_a_layer_geometry_other_than_the_targets_is_refused(tmp_path):
    """The full layer's geometry (per_layer_config) other than the target's last full
    layer, whose KV it reads: 153, nothing written (the KV heads shape no tensor of the
    assistant, so the pairing, not the inventory, refuses it)."""
    src = tmp_path / "src"
    shutil.copytree(ASSISTANT, src)
    config = json.loads((src / "config.json").read_text())
    config["text_config"]["per_layer_config"]["1"]["num_key_value_heads"] = 2
    (src / "config.json").write_text(json.dumps(config))
    proc = run_cli("convert", str(src), "--target", str(GEMMA4_TARGET), "-o",
                   str(tmp_path / "out"))
    assert_refused(proc, E.AssistantTargetError, ["layer 1", "KV heads"])
    assert not (tmp_path / "out").exists()


def test_inspect_shows_the_artifact(artifact):
    proc = run_cli("inspect", str(artifact))
    assert proc.returncode == 0, proc.stderr
    assert "gemma4-assistant" in proc.stdout and "4 drafts per cycle" in proc.stdout


@pytest.mark.parametrize("mode, key", [("clean_kv", "runs_clean_kv"), ("transformers", "runs")])
def test_the_artifact_reproduces_the_reference_runs(artifact, target, mode, key):
    """The runtime loads drafter.gguf (no source file read) and reproduces transformers'
    recorded runs cycle by cycle (as tests/test_runtime_gemma4_assistant.py from the
    checkpoint), with the drafts per cycle the artifact recorded."""
    plan = A.plan_assistant(artifact)
    assert plan.from_artifact and plan.spec.num_assistant_tokens == 4
    assistant = A.load_assistant(plan, target)
    for recorded in REFERENCE[key]:
        run = A.assisted_generate(target, assistant, recorded["prompt"],
                                  max_new_tokens=REFERENCE["max_new_tokens"], mode=mode)
        _compare_cycles(run, recorded["cycles"])
        assert list(run.output_ids) == recorded["output_ids"]
        assert list(run.acceptance_lengths) == recorded["acceptance_lengths"]


def test_the_artifact_loads_the_checkpoints_weights(artifact, target):
    ours = A.load_assistant(artifact, target)
    theirs = A.Gemma4Assistant(ASSISTANT, target)
    assert ours.w.keys() == theirs.w.keys()
    assert all(torch.equal(ours.w[n], theirs.w[n]) for n in ours.w)
    assert ours.spec.layers == theirs.spec.layers


def test_bind_gives_the_kinds_plan(artifact, target):
    binding = bind(artifact, open_run_target(GEMMA4_TARGET))
    assert binding.kind == "mtp" and isinstance(binding.drafter_plan, A.AssistantPlan)
    assert A.load_assistant(binding.drafter_plan, target).num_assistant_tokens == 4


def test_the_dflash2_loader_refuses_an_assistant_artifact(artifact):
    from dspark_convert.runtime.dflash2 import plan_drafter

    with pytest.raises(E.ArtifactKindError):
        plan_drafter(artifact)


def test_the_engines_say_what_they_make_of_it(artifact):
    reports = reports_for_gguf(read_gguf(artifact / "drafter.gguf"))
    assert [r.rule for r in reports["strata.open"].refusals] == ["strata.open/assistant"]
    llama = [r.rule for r in reports["llama.cpp"].refusals]
    assert llama[:2] == ["llama.cpp/assistant.context_length", "llama.cpp/assistant.tokenizer"]
    assert "llama.cpp/assistant.sliding_window" in llama
    assert "llama.cpp/assistant.hidden_size" not in llama     # h 32, Hb 64
    assert not any(r.startswith("llama.cpp/architecture") for r in llama)


def test_a_hostile_layer_count_is_refused_before_it_costs(artifact, tmp_path):
    """100,000 layer types and a block count of 2^31: the contract's bound (152), at once."""
    import time

    art = tmp_path / "art"
    shutil.copytree(artifact, art)
    n = 100_000
    rewrite_gguf(artifact / "drafter.gguf", art / "drafter.gguf", set_keys={
        "dspark.assistant.layer_types": (["full_attention"] * n, VT.ARRAY, VT.STRING),
        "gemma4-assistant.attention.head_count_kv": ([1] * n, VT.ARRAY, VT.UINT32),
        "gemma4-assistant.block_count": (2**31, VT.UINT32, None),
        "gemma4-assistant.nextn_predict_layers": (2**31, VT.UINT32, None),
        "gemma4-assistant.attention.shared_kv_layers": (2**31, VT.UINT32, None)})
    start = time.monotonic()
    first = validate_artifact(art).first_failure
    assert (first.name, first.error) == ("gguf.metadata", "AssistantConfigError")
    assert "num_hidden_layers" in first.detail
    assert time.monotonic() - start < 30


def test_a_bare_assistant_file_of_llama_cpps_layout_is_judged_as_an_assistant(artifact,
                                                                             tmp_path):
    """A gemma4-assistant GGUF without our keys (llama.cpp's converter's kind of file): not
    our format, and the engines' assistant rules judge it (llama.cpp knows the arch)."""
    bare = tmp_path / "assistant.gguf"
    rewrite_gguf(artifact / "drafter.gguf", bare,
                 drop_keys=("dspark.format_version", "dspark.family", "dspark.converter"))
    proc = run_cli("validate", str(bare), "--json")
    report = json.loads(proc.stdout)
    kind = next(c for c in report["checks"] if c["name"] == "gguf.kind")
    assert "Gemma 4 assistant file in llama.cpp's layout" in kind["detail"]
    reason = report["engines"]["llama.cpp"]["reason"]
    assert reason == "key not found in model: gemma4-assistant.context_length"
