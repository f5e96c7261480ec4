"""runtime/qwen3.py: the minimal Qwen3 target, its cache, taps and refusals."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import GOLDEN
from dspark_convert.errors import RuntimeTargetError
from dspark_convert.runtime.qwen3 import KVCache, Qwen3Target

TARGET = GOLDEN / "reference" / "target"
PROMPT = [1, 17, 33, 90, 250, 7, 7, 401]
CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def target():
    return Qwen3Target(TARGET, device=CPU)


def test_config_and_hashes(target):
    cfg = target.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size, cfg.head_dim) == (64, 6, 512, 16)
    assert cfg.stop_token_ids == (2,)           # generation_config.json's eos_token_id
    source = load_file(TARGET / "model.safetensors")
    for name, digest in (("model.embed_tokens.weight", target.embed_sha256),
                         ("lm_head.weight", target.lm_head_sha256)):
        assert digest == hashlib.sha256(source[name].view(torch.uint16).numpy().tobytes()).hexdigest()


def test_float32_forward_matches_float64(target):
    """Our float32 arithmetic is float32-exact: a float64 run of the same code agrees to
    ~1e-5 on every hidden state (the tolerance the parity tests build on)."""
    ids = torch.tensor(PROMPT)
    out32 = target.forward(ids, KVCache())
    wide = Qwen3Target(TARGET, device=CPU, dtype=torch.float64)
    out64 = wide.forward(ids, KVCache())
    assert len(out32.hidden_states) == 7          # embeddings + 6 layers (last one normed)
    for a, b in zip(out32.hidden_states, out64.hidden_states):
        assert (a.double() - b).abs().max() < 2e-5
    assert (out32.logits.double() - out64.logits).abs().max() < 2e-5


def test_incremental_decoding_equals_one_pass(target):
    """Prefill + token-by-token with the cache + a cropped cache give the one-pass values."""
    ids = torch.tensor(PROMPT + [251, 23, 490])
    full = target.forward(ids, KVCache())
    cache = KVCache()
    first = target.forward(ids[:5], cache)
    rest = target.forward(ids[5:9], cache)
    cache.crop(7)                                   # drop two, as after a rejection
    again = target.forward(ids[7:], cache)
    assert cache.length == len(ids)
    got = torch.cat([first.logits, rest.logits[:2], again.logits])
    torch.testing.assert_close(got, full.logits, atol=1e-5, rtol=0)
    for i in (1, 3, 5):
        tap = torch.cat([first.hidden_states[i], rest.hidden_states[i][:2], again.hidden_states[i]])
        torch.testing.assert_close(tap, full.hidden_states[i], atol=1e-5, rtol=0)


def _copy_target(tmp_path):
    out = tmp_path / "target"
    shutil.copytree(TARGET, out)
    return out


def test_refuses_a_missing_directory(tmp_path):
    with pytest.raises(RuntimeTargetError, match="not a directory"):
        Qwen3Target(tmp_path / "nothing", device=CPU)


def test_refuses_another_model_type(tmp_path):
    out = _copy_target(tmp_path)
    cfg = json.loads((out / "config.json").read_text())
    cfg["model_type"] = "llama"
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(RuntimeTargetError, match="model_type") as info:
        Qwen3Target(out, device=CPU)
    assert info.value.exit_code == 70 and "\n" not in info.value.message


def test_refuses_a_missing_tensor(tmp_path):
    out = _copy_target(tmp_path)
    tensors = load_file(out / "model.safetensors")
    del tensors["model.layers.3.mlp.up_proj.weight"]
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(RuntimeTargetError, match="model.layers.3.mlp.up_proj.weight"):
        Qwen3Target(out, device=CPU)


def test_refuses_a_malformed_safetensors(tmp_path):
    out = _copy_target(tmp_path)
    (out / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}garbage")
    with pytest.raises(RuntimeTargetError, match="target"):
        Qwen3Target(out, device=CPU)
