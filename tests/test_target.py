"""target.py: opening a target from its config, weights headers and tokenizer, and hashing
its embedding and head one tensor at a time. Targets are the golden one or variants of it
written with the real safetensors library (``make_target``, tests/support/targets.py)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from support.targets import GOLDEN_TARGET, make_target

from dspark_convert.errors import TargetFormatError, TargetNotFoundError
from dspark_convert.formats.safetensors import read_checkpoint
from dspark_convert.target.model import (
    EMBED_NAME,
    HEAD_NAME,
    hash_target_tensors,
    open_target,
    parse_hub_spec,
    tensor_sha256,
)

def torch_sha256(path: Path, name: str, dtype: torch.dtype | None = None) -> str:
    """The oracle: the tensor as the safetensors library reads it, its bytes hashed."""
    with safe_open(path, "pt") as fh:
        t = fh.get_tensor(name)
    if dtype is not None:
        t = t.to(dtype)
    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def test_golden_target():
    target = open_target(GOLDEN_TARGET)
    c = target.config
    assert (c.model_type, c.hidden_size, c.vocab_size, c.num_hidden_layers) == ("qwen3", 64, 512, 6)
    assert (c.rope_theta, c.rms_norm_eps, c.tie_word_embeddings) == (1e6, 1e-6, False)
    assert target.repo is None and target.revision == "local"
    assert [f.path for f in target.files] == ["config.json", "tokenizer.json"]
    for record in target.files:
        data = (GOLDEN_TARGET / record.path).read_bytes()
        assert (record.size, record.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    assert target.tokenizer.record.vocab_size == 400
    records = hash_target_tensors(target)
    weights = GOLDEN_TARGET / "model.safetensors"
    assert [(r.role, r.name, r.dtype, r.shape) for r in records] == [
        ("embedding", EMBED_NAME, "BF16", [512, 64]), ("head", HEAD_NAME, "BF16", [512, 64])]
    assert records[0].sha256 == torch_sha256(weights, EMBED_NAME)
    assert records[1].sha256 == torch_sha256(weights, HEAD_NAME)


def test_tensor_sha256_cast_matches_torch():
    entry = read_checkpoint(GOLDEN_TARGET).tensors[EMBED_NAME]
    weights = GOLDEN_TARGET / "model.safetensors"
    assert tensor_sha256(entry, as_dtype="F32") == torch_sha256(weights, EMBED_NAME, torch.float32)
    assert tensor_sha256(entry, as_dtype="F16") == torch_sha256(weights, EMBED_NAME, torch.float16)
    assert tensor_sha256(entry, as_dtype="BF16") == torch_sha256(weights, EMBED_NAME)


def test_f32_target_cast_to_bf16_rounds_like_torch(tmp_path):
    torch.manual_seed(0)
    t = torch.randn(64, 48, dtype=torch.float32)
    save_file({"x": t}, tmp_path / "x.safetensors")
    from dspark_convert.formats.safetensors import read_safetensors_header
    entry = read_safetensors_header(tmp_path / "x.safetensors").tensors[0]
    want = hashlib.sha256(t.to(torch.bfloat16).view(torch.uint8).numpy().tobytes()).hexdigest()
    assert tensor_sha256(entry, as_dtype="BF16") == want


def test_tied_head_is_the_embedding(tmp_path):
    target = open_target(make_target(tmp_path / "t", tie=True))
    assert target.head_tied and target.head is target.embed
    embed, head = hash_target_tensors(target)
    assert head.name == EMBED_NAME and head.sha256 == embed.sha256 and head.role == "head"


def test_sharded_target(tmp_path):
    target = open_target(make_target(tmp_path / "t", sharded=True))
    assert len(target.checkpoint.files.weights) == 2
    embed, head = hash_target_tensors(target)
    assert embed.sha256 == torch_sha256(GOLDEN_TARGET / "model.safetensors", EMBED_NAME)
    assert head.sha256 == torch_sha256(GOLDEN_TARGET / "model.safetensors", HEAD_NAME)


def test_hub_spec():
    assert parse_hub_spec("Qwen/Qwen3-4B@" + "a" * 40) == ("Qwen/Qwen3-4B", "a" * 40)
    assert parse_hub_spec("Qwen/Qwen3-4B") is None
    assert parse_hub_spec("/abs/path@x") is None
    with pytest.raises(TargetNotFoundError, match="no such directory"):
        open_target("Qwen3-4B-local-copy")


def test_hub_spec_resolved_by_the_given_function(tmp_path):
    snapshot = make_target(tmp_path / "snap")
    calls = []

    def resolve(repo, rev):
        calls.append((repo, rev))
        return snapshot, "b" * 40

    target = open_target("org/tiny@main", resolve_hub=resolve)
    assert calls == [("org/tiny", "main")]
    assert (target.repo, target.revision, target.directory) == ("org/tiny", "b" * 40, snapshot)


@pytest.mark.parametrize("case, error, words", [
    ("missing dir", TargetNotFoundError, "no such directory"),
    ("no tokenizer", TargetNotFoundError, "tokenizer.json: not found"),
    ("no config", TargetNotFoundError, "config.json not found"),
    ("bad config type", TargetFormatError, "field 'hidden_size'"),
    ("missing field", TargetFormatError, "required field 'num_hidden_layers' is missing"),
    ("no head", TargetFormatError, "tensor 'lm_head.weight' is missing (config.json "
                                   "tie_word_embeddings is false)"),
    ("layers disagree", TargetFormatError, "holds layers 0..5 (6); target"),
    ("embedding shape", TargetFormatError, "tensor 'model.embed_tokens.weight': expected shape [600, 64]"),
    ("bad header", TargetFormatError, "target /"),     # "target <path>: ...", as the others
])
def test_refusals(tmp_path, case, error, words):
    root = tmp_path / "t"
    if case != "missing dir":
        make_target(root)
    if case == "no tokenizer":
        (root / "tokenizer.json").unlink()
    elif case == "no config":
        (root / "config.json").unlink()
    elif case in ("bad config type", "missing field", "layers disagree", "embedding shape"):
        cfg = json.loads((root / "config.json").read_text())
        if case == "bad config type":
            cfg["hidden_size"] = "64"
        elif case == "missing field":
            del cfg["num_hidden_layers"]
        elif case == "layers disagree":
            cfg["num_hidden_layers"] = 8
        else:
            cfg["vocab_size"] = 600
        (root / "config.json").write_text(json.dumps(cfg))
    elif case == "no head":
        tensors = load_file(root / "model.safetensors")
        del tensors[HEAD_NAME]
        save_file(tensors, root / "model.safetensors")
    elif case == "bad header":
        data = bytearray((root / "model.safetensors").read_bytes())
        data[0:8] = (10**12).to_bytes(8, "little")
        (root / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(error) as info:
        open_target(root)
    assert words in info.value.message
    assert "\n" not in info.value.message
