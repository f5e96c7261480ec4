"""Every golden checkpoint converts to the recorded bytes, tensor for tensor."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open

from conftest import EXPECTED, GOLDEN, REFERENCE_DRAFTER, ROOT, golden_source
from support.cli import run_cli, run_process
from dspark_convert.contract.dspark import build_contract, parse_config
from dspark_convert.formats.gguf_reader import read_gguf, tensor_data
from dspark_convert.util.hashing import sha256_file
from dspark_convert.commands.validate import validate_artifact


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_conversion_matches_recorded_hashes(converted, name):
    art = converted[name]
    assert sha256_file(art / "drafter.gguf") == EXPECTED[name]["drafter.gguf"]
    assert sha256_file(art / "manifest.json") == EXPECTED[name]["manifest.json"]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_converted_golden_validates(converted, name):
    report = validate_artifact(converted[name])
    assert report.ok, report.first_failure
    assert report.exit_code() == 0


def _source_tensors(directory):
    """name -> torch tensor, read by the safetensors library (independent of our reader)."""
    out = {}
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as fh:
            for key in fh.keys():
                out[key] = fh.get_tensor(key)
    return out


def _bf16_bytes(t: torch.Tensor) -> bytes:
    return t.to(torch.bfloat16).contiguous().view(torch.uint16).numpy().tobytes()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_tensor_is_the_source_tensor(converted, name):
    """BF16 sources: byte-identical. F32 sources: torch's own rounding to BF16."""
    source_dir = golden_source(name)
    source = _source_tensors(source_dir)
    gguf = read_gguf(converted[name] / "drafter.gguf")
    manifest = json.loads((converted[name] / "manifest.json").read_text())
    by_gguf = {t["name"]: t["source"] for t in manifest["artifact"]["tensors"]}
    raw = (converted[name] / "drafter.gguf").read_bytes()
    assert len(gguf.tensors) == len(by_gguf)
    for info in gguf.tensors:
        src = source[by_gguf[info.name]]
        assert list(info.shape) == list(src.shape)[::-1], info.name
        assert bytes(tensor_data(gguf, info, raw)) == _bf16_bytes(src), info.name
    written = set(by_gguf.values())
    stripped = {s["name"] for s in manifest["source"]["stripped"]}
    assert written | stripped == set(source)
    assert stripped <= {"embed_tokens.weight", "lm_head.weight"}


def test_reference_embedding_and_head_are_hashed_not_written(converted):
    gguf = read_gguf(converted["reference"] / "drafter.gguf")
    names = {t.name for t in gguf.tensors}
    assert not names & {"token_embd.weight", "output.weight", "embed_tokens.weight", "lm_head.weight"}
    source = _source_tensors(REFERENCE_DRAFTER)
    import hashlib
    for key, tensor in (("dflash.target.embed_sha256", "embed_tokens.weight"),
                        ("dflash.target.lm_head_sha256", "lm_head.weight")):
        assert gguf.kv[key].value == hashlib.sha256(_bf16_bytes(source[tensor])).hexdigest()


def test_sharded_source_digest_is_the_digest_of_sorted_lines(converted):
    import hashlib
    manifest = json.loads((converted["vanilla_sharded"] / "manifest.json").read_text())
    shards = [f for f in manifest["source"]["files"] if f["path"].endswith(".safetensors")]
    assert len(shards) == 3
    lines = "".join(f"{f['path']} {f['sha256']}\n" for f in sorted(shards, key=lambda f: f["path"]))
    digest = hashlib.sha256(lines.encode()).hexdigest()
    assert manifest["source"]["weights_sha256"] == digest
    gguf = read_gguf(converted["vanilla_sharded"] / "drafter.gguf")
    assert gguf.kv["dflash.source.sha256"].value == digest
    for f in manifest["source"]["files"]:
        assert sha256_file(golden_source("vanilla_sharded") / f["path"]) == f["sha256"]


def test_f32_source_is_rounded_and_says_so(converted):
    manifest = json.loads((converted["vanilla_f32"] / "manifest.json").read_text())
    assert manifest["source"]["dtype"] == "F32"
    assert manifest["source"]["rounded_to_bf16"] is True
    assert any("rounded to BF16" in c["detail"] for c in manifest["checks"])


def test_reference_contract_matches_deepspec_config(converted):
    config = json.loads((REFERENCE_DRAFTER / "config.json").read_text())
    contract = build_contract(parse_config(config))
    manifest = json.loads((converted["reference"] / "manifest.json").read_text())
    assert manifest["contract"] == json.loads(contract.model_dump_json())
    assert manifest["source"]["config"] == config
    assert contract.taps.target_layer_ids == [0, 2, 4]
    assert contract.taps.feature_width == 3 * 64
    assert contract.markov_head.type == "vanilla" and contract.markov_head.rank == 16
    assert contract.confidence_head.with_markov is True


def test_cli_convert_then_validate_reference(tmp_path):
    """The golden bytes from a real `dspark convert` process; validate in-process."""
    out = tmp_path / "a"
    run = run_process("convert", str(REFERENCE_DRAFTER), "-o", str(out), "-q")
    assert run.returncode == 0, run.stderr
    assert "drafter.gguf" in run.stdout
    run = run_cli("validate", str(out))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "PASSED" in run.stdout
    assert sha256_file(out / "drafter.gguf") == EXPECTED["reference"]["drafter.gguf"]


def test_converting_twice_gives_identical_bytes(tmp_path):
    from dspark_convert.commands.convert import convert

    for out in ("one", "two"):
        convert(golden_source("gated_conf_markov"), tmp_path / out)
    for name in ("drafter.gguf", "manifest.json"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()


@pytest.mark.slow   # a fresh interpreter that rebuilds and compares every golden fixture
def test_fixture_script_regenerates_identical_fixtures():
    """golden/make_fixtures.py --check rebuilds every fixture and compares bytes and hashes."""
    run = subprocess.run([sys.executable, str(GOLDEN / "make_fixtures.py"), "--check"],
                         capture_output=True, text=True, cwd=ROOT, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "golden fixtures are current" in run.stdout
