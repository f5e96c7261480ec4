"""DFlash2 artifacts: `dspark convert` of speculators' DFlash2DraftModel (and of z-lab's
layout of the same drafter) against its target, `dspark validate` from drafter.gguf alone,
`inspect`, the runtime loading the artifact (golden/reference/dflash2/reference.json cycle by
cycle) and `binding.bind` (docs/ARTIFACT_FORMAT.md, "Drafter kinds: DFlash2")."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from gguf import GGUFValueType as VT

from conftest import GOLDEN
from dspark_convert import errors as E
from dspark_convert.artifact.format import (DFLASH2_METADATA_KEYS, FORMAT_VERSIONS,
                                            as_float32, contract_from_metadata, read_metadata)
from dspark_convert.artifact.engines import reports_for_gguf
from dspark_convert.commands.binding import bind, open_run_target
from dspark_convert.commands.convert import convert
from dspark_convert.commands.validate import validate_artifact
from dspark_convert.contract.dflash2 import parse_config, tensor_shapes
from dspark_convert.formats.gguf_reader import read_gguf
from dspark_convert.runtime.dflash2 import DFlash2Plan, load_drafter, plan_drafter
from dspark_convert.runtime.dflash2_loop import dflash2_generate
from dspark_convert.runtime.qwen3 import Qwen3Target
from hostile.make_corpus import _zlab
from support.cli import assert_refused, run_cli
from support.llama_cpp import rewrite_gguf

FIXTURE = GOLDEN / "reference" / "dflash2"
DRAFT = FIXTURE / "draft"
TARGET = GOLDEN / "reference" / "target"
GEMMA4_TARGET = GOLDEN / "reference" / "gemma4" / "target"
REFERENCE = json.loads((FIXTURE / "reference.json").read_text())

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dflash2") / "art"
    convert(DRAFT, out, target=TARGET)
    return out


@pytest.fixture(scope="module")
def zlab_source(tmp_path_factory) -> Path:
    """The golden drafter in z-lab's layout: the config rewritten (the tensor names are the
    same in both layouts), the weights file copied byte for byte."""
    src = tmp_path_factory.mktemp("zlab") / "draft"
    src.mkdir()
    shutil.copy(DRAFT / "model.safetensors", src / "model.safetensors")
    config = json.loads((DRAFT / "config.json").read_text())
    (src / "config.json").write_text(json.dumps(_zlab(config), indent=2) + "\n")
    return src


@pytest.fixture(scope="module")
def target():
    return Qwen3Target(TARGET, device=torch.device("cpu"))


def _kv(art: Path) -> dict:
    return read_metadata(read_gguf(art / "drafter.gguf"), path="drafter.gguf")


def test_convert_writes_the_dflash2_format(artifact):
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert manifest["format_version"] == FORMAT_VERSIONS["qwen3-dflash2"] == 3
    assert manifest["contract"]["family"] == "qwen3-dflash2"
    assert manifest["source"]["stripped"] == []          # speculators saves no embedding
    kv = _kv(artifact)
    # Every key of the kind's table, in its order (the sliding window: a sliding layer).
    assert list(kv) == [k.key for k in DFLASH2_METADATA_KEYS
                        if k.key != "general.source.huggingface.repository"]
    assert kv["general.architecture"] == "dflash" and kv["dspark.family"] == "qwen3-dflash2"
    # speculators' aux ids unchanged: HF hidden_states indices, llama.cpp's convention.
    assert kv["dflash.target_layers"] == [1, 3, 5]
    assert (kv["dflash.conv_kernel_size"], kv["dflash.conv_group_size"],
            kv["dflash.selector_rank"], kv["dflash.selector_top_k"]) == (2, 16, 16, 6)
    assert kv["dflash.sample_from_anchor"] == "false"
    assert kv["dspark.dflash2.layer_types"] == ["sliding_attention", "full_attention"]
    assert kv["dflash.attention.sliding_window"] == 64
    # The target's embedding and head hashes, recorded for the runtime.
    roles = {t["role"]: t["sha256"] for t in manifest["target"]["tensors"]}
    assert kv["dflash.target.embed_sha256"] == roles["embedding"]
    assert kv["dflash.target.lm_head_sha256"] == roles["head"]
    # Every speculators tensor, under llama.cpp's names, shapes reversed.
    cfg = parse_config(json.loads((DRAFT / "config.json").read_text()))
    shapes = tensor_shapes(cfg)
    records = manifest["artifact"]["tensors"]
    assert [r["source"] for r in records] == list(shapes)
    by_source = {r["source"]: r for r in records}
    assert by_source["layers.0.attention_conv.base_kernel"]["name"] == "blk.0.attn_conv_base"
    assert by_source["candidate_selector.predecessor_codebook"]["name"] == \
        "selector_predecessor.weight"
    assert all(r["shape"] == list(shapes[r["source"]])[::-1] for r in records)


def test_the_tensor_bytes_are_the_source_bytes(artifact):
    """BF16 source: every written tensor is the safetensors tensor byte for byte."""
    from dspark_convert.formats.safetensors import read_checkpoint

    entries = read_checkpoint(DRAFT).tensors
    gguf = read_gguf(artifact / "drafter.gguf")
    manifest = json.loads((artifact / "manifest.json").read_text())
    names = {r["name"]: r["source"] for r in manifest["artifact"]["tensors"]}
    with open(DRAFT / "model.safetensors", "rb") as src, open(gguf.path, "rb") as out:
        for info in gguf.tensors:
            entry = entries[names[info.name]]
            src.seek(entry.begin)
            out.seek(info.data_offset)
            assert src.read(entry.nbytes) == out.read(info.nbytes), info.name


def test_zlab_layout_converts_to_the_same_tensors(artifact, zlab_source, tmp_path):
    out = tmp_path / "zlab"
    convert(zlab_source, out, target=TARGET)
    ours, theirs = (json.loads((a / "manifest.json").read_text()) for a in (artifact, out))
    assert ours["artifact"]["tensors"] == theirs["artifact"]["tensors"]
    assert ours["contract"] == theirs["contract"]
    a, b = _kv(artifact), _kv(out)
    # The same metadata, general.name (the directory's name, "draft" for both) included.
    assert a == b
    layout = next(c for c in theirs["checks"] if c["name"] == "source.format")
    assert "z-lab" in layout["detail"]
    assert validate_artifact(out, target=TARGET).ok


def test_validate_rebuilds_the_contract_from_the_gguf_alone(artifact):
    manifest = json.loads((artifact / "manifest.json").read_text())
    rebuilt = contract_from_metadata(_kv(artifact), path="drafter.gguf").model_dump()
    # The file holds rms_norm_eps as FLOAT32: the one value that comes back rounded.
    eps = manifest["contract"]["geometry"].pop("rms_norm_eps")
    assert rebuilt["geometry"].pop("rms_norm_eps") == as_float32(eps)
    assert rebuilt == manifest["contract"]
    report = validate_artifact(artifact, target=TARGET)
    assert report.ok and report.warnings == 0, report.checks
    names = {c.name for c in report.checks}
    assert {"gguf.metadata", "gguf.inventory", "gguf.values", "integrity", "target.layers",
            "target.identity.embedding", "target.identity.head"} <= names


@pytest.mark.parametrize("key,value,vtype,error", [
    # a metadata value the contract rules refuse keeps its own class
    ("dflash.selector_top_k", 600, VT.UINT32, E.DFlash2ConfigError),
    ("dflash.conv_group_size", 24, VT.UINT32, E.DFlash2ConfigError),
    ("dflash.sample_from_anchor", "true", VT.STRING, E.MetadataError),
    ("dspark.format_version", 2, VT.UINT32, E.MetadataError),
])
def test_a_bad_metadata_value_fails_gguf_metadata(artifact, tmp_path, key, value, vtype, error):
    art = tmp_path / "art"
    shutil.copytree(artifact, art)
    rewrite_gguf(artifact / "drafter.gguf", art / "drafter.gguf",
                 set_keys={key: (value, vtype, None)})
    report = validate_artifact(art)
    first = report.first_failure
    assert (first.name, first.error) == ("gguf.metadata", error.__name__), report.checks


def test_a_missing_conv_tensor_fails_the_inventory(artifact, tmp_path):
    art = tmp_path / "art"
    shutil.copytree(artifact, art)
    rewrite_gguf(artifact / "drafter.gguf", art / "drafter.gguf",
                 drop_tensors=("blk.1.ffn_conv_base",))
    first = validate_artifact(art).first_failure
    assert (first.name, first.error) == ("gguf.inventory", "MissingTensorError")


def test_validate_against_another_target_is_refused(artifact):
    report = validate_artifact(artifact, target=GEMMA4_TARGET)
    first = report.first_failure
    assert (first.name, first.error) == ("target", "DFlash2TargetError")


def test_inspect_shows_the_artifact_and_the_checkpoint(artifact):
    for path in (artifact, DRAFT):
        proc = run_cli("inspect", str(path))
        assert proc.returncode == 0, proc.stderr
        assert "qwen3-dflash2" in proc.stdout and "selector" in proc.stdout
        assert "blk.0.attn_conv_base" in proc.stdout or "blk.0.attn_conv_b" in proc.stdout


def test_convert_without_a_target_is_refused(tmp_path):
    proc = run_cli("convert", str(DRAFT), "-o", str(tmp_path / "out"))
    assert_refused(proc, E.KindTargetRequiredError, ["--target"])
    assert not (tmp_path / "out").exists()


def test_quantize_refuses_the_kind(artifact, tmp_path):
    proc = run_cli("quantize", str(artifact), "--type", "Q8_0", "-o", str(tmp_path / "q"))
    assert_refused(proc, E.FamilyQuantizeError, ["qwen3-dflash2"])


@pytest.mark.parametrize("index", range(len(REFERENCE["runs"])))
def test_the_artifact_reproduces_the_reference_cycle_by_cycle(artifact, target, index):
    """The runtime loads drafter.gguf (no source file read) and reproduces speculators'
    recorded runs, every cycle, as it does from the checkpoint (test_runtime_dflash2)."""
    plan = plan_drafter(artifact)
    assert plan.from_artifact and all(t.file == artifact / "drafter.gguf"
                                      for t in plan.tensors.values())
    drafter = load_drafter(plan, target)
    ref = REFERENCE["runs"][index]
    run = dflash2_generate(target, drafter, ref["prompt"],
                           max_new_tokens=REFERENCE["max_new_tokens"],
                           stop_token_ids=target.config.stop_token_ids)
    for n, (cycle, want) in enumerate(zip(run.cycles, ref["cycles"], strict=True)):
        assert json.loads(json.dumps(dataclasses.asdict(cycle))) == want, f"cycle {n}"
    assert list(run.output_ids) == ref["output_ids"]


def test_the_artifact_loads_the_checkpoints_weights(artifact, target):
    ours = load_drafter(artifact, target)
    theirs = load_drafter(DRAFT, target)
    assert ours.w.keys() == theirs.w.keys()
    assert all(torch.equal(ours.w[n], theirs.w[n]) for n in ours.w)


def test_bind_gives_the_kinds_plan(artifact, target):
    binding = bind(artifact, open_run_target(TARGET))
    assert binding.kind == "dflash2" and isinstance(binding.drafter_plan, DFlash2Plan)
    drafter = load_drafter(binding.drafter_plan, target)
    assert drafter.top_k == 6


def test_the_assistants_loader_refuses_a_dflash2_artifact(artifact):
    from dspark_convert.runtime.gemma4_assistant import plan_assistant

    with pytest.raises(E.ArtifactKindError) as exc:
        plan_assistant(artifact)
    assert "qwen3-dflash2" in exc.value.message and exc.value.exit_code == 156


def test_a_zlab_config_for_a_target_of_other_depth_is_refused(zlab_source, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(zlab_source, src)
    config = json.loads((src / "config.json").read_text())
    config["num_target_layers"] = 36
    (src / "config.json").write_text(json.dumps(config))
    proc = run_cli("convert", str(src), "--target", str(TARGET), "-o", str(tmp_path / "out"))
    assert_refused(proc, E.DFlash2TargetError, ["num_target_layers", "36"])


def test_the_engines_say_what_they_make_of_it(artifact):
    """Strata's loader refuses DFlash2 where its own code does (the anchor layout, the
    selector, the extension tensors); llama.cpp's DFlash2 facts (ENGINES.md): keys its
    converter adds are missing here, its window and its default draft length differ."""
    manifest = json.loads((artifact / "manifest.json").read_text())
    reports = reports_for_gguf(read_gguf(artifact / "drafter.gguf"))
    strata = [r.rule for r in reports["strata.open"].refusals]
    assert strata[:3] == ["strata.open/sample_from_anchor", "strata.open/dflash2_selector",
                          "strata.open/extension_tensor"]
    llama = [r.rule for r in reports["llama.cpp"].refusals]
    assert "llama.cpp/key.dflash.context_length" in llama
    assert {"llama.cpp/dflash2.sliding_window", "llama.cpp/dflash2.draft_length"} <= set(llama)
    # the artifact holds llama.cpp's own tap convention: no misread of the taps
    assert "llama.cpp/target_layers_convention" not in llama
    assert "llama.cpp/dflash2.selector" not in llama      # 64 >= 6 x 7, 64 % 16 == 0
    # nothing made for these engines: every verdict is information, never a failure
    assert all(c["status"] == "info" for c in manifest["checks"]
               if c["name"].startswith("engine."))


def test_an_artifact_without_the_targets_hash_is_refused(artifact, tmp_path):
    """A DFlash2 artifact is made against its target: its embedding hash is required."""
    art = tmp_path / "art"
    shutil.copytree(artifact, art)
    rewrite_gguf(artifact / "drafter.gguf", art / "drafter.gguf",
                 drop_keys=("dflash.target.embed_sha256",))
    first = validate_artifact(art).first_failure
    assert (first.name, first.error) == ("gguf.metadata", "MetadataError")
    assert "dflash.target.embed_sha256" in first.detail and "missing" in first.detail


def test_a_stated_block_layout_is_refused_for_a_dflash2_checkpoint(tmp_path):
    """--sample-from-anchor states the layout of a speculators DSpark/DFlash config without
    one; a DFlash2 config states its own (38)."""
    proc = run_cli("convert", str(DRAFT), "--target", str(TARGET), "--sample-from-anchor",
                   "true", "-o", str(tmp_path / "out"))
    assert_refused(proc, E.SampleFromAnchorOptionError, ["DFlash2DraftModel"])


def test_validate_needs_no_source(tmp_path):
    """The source checkpoint gone, validate (with its target) and the runtime's plan still
    work from the artifact alone."""
    src = tmp_path / "src"
    shutil.copytree(DRAFT, src)
    out = tmp_path / "art"
    convert(src, out, target=TARGET)
    shutil.rmtree(src)
    assert validate_artifact(out, target=TARGET).ok
    assert plan_drafter(out).config.selector_top_k == 6
