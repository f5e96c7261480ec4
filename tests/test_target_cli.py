"""`convert --target` and `validate --target` end to end: the golden drafter with its golden
target, and one drafter/target made wrong in each way a pairing can be, each refused with
one `error:` line, its own exit code and nothing left behind. The app runs in-process
(tests/support/cli.py)."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import REFERENCE_DRAFTER
from safetensors.torch import load_file, save_file
from support.cli import run_cli
from support.targets import GOLDEN_TARGET, byte_bpe, make_target

from dspark_convert.commands.convert import convert
from dspark_convert.errors import (
    EmbeddingIdentityError,
    MaskTokenCollisionError,
    TargetGeometryError,
    TargetLayerMismatchError,
    TargetNotFoundError,
    TargetVocabError,
    TokenizerMismatchError,
)
from dspark_convert.formats.gguf_reader import read_gguf
from dspark_convert.target.model import hash_target_tensors, open_target
from dspark_convert.commands.validate import validate_artifact


def drafter_copy(root, *, config: dict | None = None, drop=()):
    """The golden drafter in ``root``, with config overrides or tensors dropped."""
    root.mkdir(parents=True)
    cfg = json.loads((REFERENCE_DRAFTER / "config.json").read_text())
    cfg.update(config or {})
    (root / "config.json").write_text(json.dumps(cfg, indent=2))
    if drop:
        tensors = load_file(REFERENCE_DRAFTER / "model.safetensors")
        save_file({k: v for k, v in tensors.items() if k not in drop}, root / "model.safetensors")
    else:
        shutil.copy(REFERENCE_DRAFTER / "model.safetensors", root / "model.safetensors")
    return root


def test_golden_drafter_converts_against_its_target(tmp_path):
    out = tmp_path / "artifact"
    result = run_cli("convert", str(REFERENCE_DRAFTER), "-o", str(out), "--target",
                     str(GOLDEN_TARGET), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    manifest = json.loads((out / "manifest.json").read_text())
    target = manifest["target"]
    assert report["target"] == target
    assert target["path"] == str(GOLDEN_TARGET) and target["revision"] == "local"
    assert target["config"]["num_hidden_layers"] == 6
    assert target["tokenizer"]["sha256"] == open_target(GOLDEN_TARGET).tokenizer.record.sha256
    assert target["tokenizer"]["vocab_size"] == 400
    assert [t["content"] for t in target["tokenizer"]["special_tokens"]] == ["<pad>", "<s>", "</s>"]
    assert {c["status"] for c in target["checks"]} == {"passed"}
    identity = {t["role"]: t["sha256"] for t in target["tensors"]}
    stripped = {s["name"]: s["sha256"] for s in manifest["source"]["stripped"]}
    assert identity == {"embedding": stripped["embed_tokens.weight"],
                        "head": stripped["lm_head.weight"]}

    result = run_cli("validate", str(out), "--target", str(GOLDEN_TARGET), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    names = [c["name"] for c in json.loads(result.stdout)["checks"]]
    assert "target.tokenizer_fingerprint" in names and "target.identity.head" in names


def test_drafter_without_embedding_records_the_targets_hashes(tmp_path):
    source = drafter_copy(tmp_path / "src", drop=("embed_tokens.weight", "lm_head.weight"))
    out = tmp_path / "artifact"
    result = convert(source, out, target=GOLDEN_TARGET)
    embed, head = hash_target_tensors(open_target(GOLDEN_TARGET))
    kv = {k: v.value for k, v in read_gguf(out / "drafter.gguf").kv.items()}
    assert kv["dflash.target.embed_sha256"] == embed.sha256
    assert kv["dflash.target.lm_head_sha256"] == head.sha256
    assert result.manifest.source.stripped == []
    details = {c.name: c.detail for c in result.manifest.target.checks}
    assert "is recorded for the runtime" in details["target.identity.embedding"]
    # Both validations accept the recorded hashes, with and without the target.
    assert validate_artifact(out).ok
    report = validate_artifact(out, target=GOLDEN_TARGET)
    assert report.ok, report.first_failure
    # Against a target with another embedding, the recorded hash is refused.
    other = make_target(tmp_path / "other", shift_embedding=3)
    report = validate_artifact(out, target=other)
    assert report.first_failure.error == "EmbeddingIdentityError"
    assert "dflash.target.embed_sha256" in report.first_failure.detail


def test_artifact_without_target_record_validates_against_one(tmp_path):
    out = tmp_path / "artifact"
    convert(REFERENCE_DRAFTER, out)
    report = validate_artifact(out, target=GOLDEN_TARGET)
    assert report.ok, report.first_failure
    report = validate_artifact(out, target=tmp_path / "missing")
    assert report.first_failure.error == "TargetNotFoundError"


def assert_refused(result, error, *words):
    assert result.returncode == error.exit_code, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in lines[0], lines[0]


@pytest.mark.parametrize("case, error, words", [
    ("hidden", TargetGeometryError, ("hidden_size is 128", "expects 64")),
    ("vocab", TargetVocabError, ("vocab_size is 600", "expects 512")),
    ("last layer", TargetLayerMismatchError, ("target_layer_ids[2] is 4", "num_hidden_layers = 5")),
    ("shifted row", EmbeddingIdentityError, ("embed_tokens.weight SHA-256 is", "first differing row 0")),
    ("mask", MaskTokenCollisionError, ("mask_token_id is 80", "ordinary text")),
    ("no target", TargetNotFoundError, ("no such directory",)),
])
def test_convert_refusals_leave_nothing(tmp_path, case, error, words):
    source, target = REFERENCE_DRAFTER, tmp_path / "target"
    if case == "hidden":
        make_target(target, hidden=128)
    elif case == "vocab":
        make_target(target, vocab=600)
    elif case == "last layer":
        make_target(target, layers=5)
    elif case == "shifted row":
        make_target(target, shift_embedding=1)
    elif case == "mask":
        make_target(target)
        source = drafter_copy(tmp_path / "src", config={"mask_token_id": 80})
    out_parent = tmp_path / "out"
    out_parent.mkdir()
    result = run_cli("convert", str(source), "-o", str(out_parent / "artifact"), "--target",
                     str(target), "-q")
    assert_refused(result, error, *words)
    assert list(out_parent.iterdir()) == []


def test_validate_refuses_another_tokenizer(tmp_path):
    out = tmp_path / "artifact"
    convert(REFERENCE_DRAFTER, out, target=GOLDEN_TARGET)
    other = make_target(tmp_path / "other", tokenizer=byte_bpe(size_extra=20))
    result = run_cli("validate", str(out), "--target", str(other))
    assert_refused(result, TokenizerMismatchError,
                   "tokenizer vocab_size is 276", "whose vocab_size is 400")
