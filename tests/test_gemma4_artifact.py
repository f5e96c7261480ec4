"""The Gemma4 family's artifact (format version 2, docs/ARTIFACT_FORMAT.md "Drafter
families"): DeepSeek's Gemma4 drafters convert and validate, every source tensor carried
bit-exact (layer scalars and the four norms per layer included), the contract rebuilt from
the GGUF alone, the version rule for readers, the engine reports, and every command the
family does not reach yet refusing in one line with its own code, nothing written."""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest
from gguf import GGUFValueType as VT
from safetensors import safe_open

from support.cli import assert_refused, run_cli
from support.gemma4 import GEMMA4_DRAFTERS, GEMMA4_TRAINER_CONFIGS
from support.llama_cpp import rewrite_gguf
from support.paths import GOLDEN_TARGET
from dspark_convert import errors as E
from dspark_convert.artifact.format import as_float32, contract_from_metadata, read_metadata
from dspark_convert.commands.convert import convert
from dspark_convert.commands.inspection import inspect_path
from dspark_convert.commands.validate import validate_artifact
from dspark_convert.formats.gguf_reader import read_gguf

NAMES = sorted(GEMMA4_DRAFTERS)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma4-artifacts")
    out = {}
    for name in NAMES:
        out[name] = root / name
        convert(GEMMA4_DRAFTERS[name], out[name])
    return out


def _gguf(artifact):
    path = artifact / "drafter.gguf"
    return path, read_gguf(path)


@pytest.mark.parametrize("name", NAMES)
def test_converts_and_validates_strict(artifacts, name):
    report = validate_artifact(artifacts[name])
    assert report.exit_code(strict=True) == 0, [c for c in report.checks if c.status != "passed"]
    proc = run_cli("validate", "--strict", str(artifacts[name]))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("name", NAMES)
def test_every_source_tensor_bit_exact(artifacts, name):
    path, gguf = _gguf(artifacts[name])
    manifest = json.loads((artifacts[name] / "manifest.json").read_text())
    by_gguf = {t["name"]: t["source"] for t in manifest["artifact"]["tensors"]}
    raw = path.read_bytes()
    with safe_open(GEMMA4_DRAFTERS[name] / "model.safetensors", "np") as f:
        source_names = set(f.keys())
        carried = set()
        for t in gguf.tensors:
            src = by_gguf[t.name]
            # BF16 bytes: the source's raw bytes (numpy has no bfloat16: read them as uint16)
            want = f.get_slice(src)
            data = raw[t.data_offset: t.data_offset + t.nbytes]
            expected = _source_bytes(GEMMA4_DRAFTERS[name] / "model.safetensors", src)
            assert data == expected, t.name
            assert list(reversed(t.shape)) == list(want.get_shape()), t.name
            carried.add(src)
    stripped = {s["name"]: s["sha256"] for s in manifest["source"]["stripped"]}
    assert set(stripped) == {"embed_tokens.weight", "lm_head.weight"}
    for src, digest in stripped.items():
        assert hashlib.sha256(_source_bytes(GEMMA4_DRAFTERS[name] / "model.safetensors",
                                            src)).hexdigest() == digest
    assert carried | set(stripped) == source_names
    assert {f"layers.{i}.layer_scalar" for i in (0, 1)} <= carried
    assert sum("_layernorm." in s for s in carried) == 8


def _source_bytes(path, name) -> bytes:
    """A tensor's bytes as stored in a safetensors file (its header's offsets)."""
    blob = path.read_bytes()
    n = int.from_bytes(blob[:8], "little")
    entry = json.loads(blob[8:8 + n])[name]
    start, end = entry["data_offsets"]
    return blob[8 + n + start: 8 + n + end]


def test_layer_scalars_survive(artifacts):
    path, gguf = _gguf(artifacts["gemma4_vanilla_conf_markov"])
    raw = path.read_bytes()
    values = []
    for i in (0, 1):
        t = next(t for t in gguf.tensors if t.name == f"blk.{i}.layer_output_scale.weight")
        bits = np.frombuffer(raw[t.data_offset:][:2], dtype=np.uint16).astype(np.uint32)
        values.append(float((bits << 16).view(np.float32)[0]))
    assert values == [0.875, 1.125]


@pytest.mark.parametrize("name", NAMES)
def test_contract_rebuilt_from_the_gguf_alone(artifacts, name):
    path, gguf = _gguf(artifacts[name])
    kv = read_metadata(gguf, path=path.name)
    assert kv["general.architecture"] == "dspark-gemma4"
    assert kv["dspark.format_version"] == 2 and kv["dspark.family"] == "gemma4-dspark"
    assert (kv["dflash.attention.key_length"], kv["dflash.attention.head_count_kv"]) == (32, 1)
    rebuilt = contract_from_metadata(kv, path=path.name)
    manifest = json.loads((artifacts[name] / "manifest.json").read_text())
    # Everything but the record of the unused fields, which is the manifest's, not the
    # file's; rms_norm_eps comes back as the FLOAT32 the file holds (as Qwen3's does).
    got = rebuilt.model_dump(exclude={"inherited_unused"})
    want = {k: v for k, v in manifest["contract"].items() if k != "inherited_unused"}
    assert got["geometry"].pop("rms_norm_eps") == as_float32(want["geometry"].pop("rms_norm_eps"))
    assert got == want
    assert manifest["contract"]["inherited_unused"]["head_dim"] == 16


def test_both_config_forms_convert_to_the_same_tensors(tmp_path):
    name = "gemma4_vanilla_conf_markov"
    src = tmp_path / "trainer-form"
    shutil.copytree(GEMMA4_DRAFTERS[name], src)
    shutil.copy(GEMMA4_TRAINER_CONFIGS[name], src / "config.json")
    a = convert(GEMMA4_DRAFTERS[name], tmp_path / "a")
    b = convert(src, tmp_path / "b")
    assert [t.sha256 for t in a.manifest.artifact.tensors] == \
        [t.sha256 for t in b.manifest.artifact.tensors]
    kv = read_metadata(read_gguf(tmp_path / "b" / "drafter.gguf"), path="b")
    assert kv["dspark.gemma4.source.model_type"] == "gemma4_unified_text"
    assert run_cli("validate", "--strict", str(tmp_path / "b")).returncode == 0


def test_byte_reproducible(artifacts, tmp_path):
    name = "gemma4_dflash"
    again = convert(GEMMA4_DRAFTERS[name], tmp_path / "again")
    assert again.gguf_sha256 == hashlib.sha256(
        (artifacts[name] / "drafter.gguf").read_bytes()).hexdigest()


def test_engines_say_unsupported_not_broken(artifacts):
    manifest = json.loads((artifacts["gemma4_vanilla_conf_markov"] / "manifest.json").read_text())
    for engine in ("strata.open", "strata.run", "llama.cpp"):
        record = manifest["engines"][engine]
        assert not record["accepts"] and "gemma4-dspark" in record["reason"], engine
    checks = {c["name"]: c["status"] for c in manifest["checks"]}
    assert checks["engine.strata.open"] == "info"


def test_inspect_the_artifact(artifacts):
    result = inspect_path(artifacts["gemma4_vanilla_conf_markov"])
    assert result.problem is None and result.contract.family == "gemma4-dspark"
    assert len(result.rows) == 33 and {r.status for r in result.rows} == {"ok"}


# --- the version rule and hostile metadata -----------------------------------------------------

HOSTILE = [
    ("version-1-with-family", {"dspark.format_version": (1, VT.UINT32, None)}, (),
     E.MetadataError, ["dspark.family", "'dspark.format_version' 1"]),
    ("version-3", {"dspark.format_version": (3, VT.UINT32, None)}, (),
     E.MetadataError, ["dspark.format_version", "3"]),
    ("version-2-no-family", {}, ("dspark.family",), E.MetadataError, ["dspark.family", "found nothing"]),
    ("unknown-family", {"dspark.family": ("llama4-dspark", VT.STRING, None)}, (),
     E.MetadataError, ["dspark.family", "llama4-dspark"]),
    ("rope-yarn", {"dspark.gemma4.rope.type": ("yarn", VT.STRING, None)}, (),
     E.RopeTypeError, ["dspark.gemma4.rope.type", "yarn"]),
    ("no-k-eq-v-key", {}, ("dspark.gemma4.attention.k_eq_v",), E.MetadataError,
     ["dspark.gemma4.attention.k_eq_v", "missing"]),
    ("activation-silu", {"dspark.gemma4.hidden_activation": ("silu", VT.STRING, None)}, (),
     E.UnsupportedFeatureError, ["dspark.gemma4.hidden_activation", "silu"]),
    ("final-layer-tap", {"dflash.target_layers": ([0, 2, 5], VT.ARRAY, VT.UINT32)}, (),
     E.FinalLayerTapError, ["dflash.target_layers[2]", "final layer"]),
    ("huge-block-count", {"dflash.block_count": (2**32 - 1, VT.UINT32, None)}, (),
     E.GeometryLimitError, ["dflash.block_count"]),
    ("global-head-dim-odd", {"dflash.attention.key_length": (33, VT.UINT32, None)}, (),
     E.GeometryLimitError, ["dflash.attention.key_length", "even"]),
]


@pytest.mark.parametrize("case,set_keys,drop,error,needles", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_metadata_refused_naming_the_key(artifacts, tmp_path, case, set_keys, drop, error,
                                                 needles):
    bad = rewrite_gguf(artifacts["gemma4_dflash"] / "drafter.gguf", tmp_path / "bad.gguf",
                       set_keys=set_keys, drop_keys=drop)
    assert_refused(run_cli("inspect", str(bad)), error, needles)


def test_a_version_1_file_is_still_qwen3(converted):
    """A Qwen3 artifact keeps format version 1 and no family key: the old files read."""
    kv = read_metadata(read_gguf(converted["reference"] / "drafter.gguf"), path="q")
    assert kv["dspark.format_version"] == 1 and "dspark.family" not in kv
    assert kv["general.architecture"] == "dflash"


# --- the command the family does not reach ------------------------------------------------------

@pytest.mark.parametrize("command,error", [
    (lambda a, o: ["export", a, "--engine", "llama.cpp", "--target-gguf", "/nonexistent.gguf",
                   "-o", o], E.FamilyExportError),
], ids=["export"])
def test_other_commands_refuse_the_family(artifacts, tmp_path, command, error):
    art = artifacts["gemma4_vanilla_conf_markov"]
    before = sorted(p.name for p in art.iterdir())
    out = tmp_path / "out"
    proc = run_cli(*command(str(art), str(out)))
    assert_refused(proc, error, ["gemma4-dspark", "drafter.gguf"])
    assert not out.exists() and list(tmp_path.iterdir()) == []
    assert sorted(p.name for p in art.iterdir()) == before
