"""runtime/qwen3.py: the minimal Qwen3 target, its cache, taps and refusals."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from support.paths import GOLDEN_TARGET as TARGET
from dspark_convert.errors import RuntimeTargetError
from dspark_convert.runtime.qwen3 import KVCache, Qwen3Target, plan_target

PROMPT = [1, 17, 33, 90, 250, 7, 7, 401]
CPU = torch.device("cpu")
# Our float32 forward agrees with a float64 run of the same code to within this, on every
# hidden state and logit (test_float32_forward_matches_float64).
FLOAT64_ATOL = 2e-5


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def target():
    return Qwen3Target(TARGET, device=CPU)


def test_config_and_weights(target):
    """The config as the one Qwen3 reader gives it, and the embedding and head loaded
    exactly (their identity with the drafter's is the pairing's proof, by SHA-256)."""
    cfg = target.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size, cfg.head_dim) == (64, 6, 512, 16)
    assert cfg.stop_token_ids == (2,)           # generation_config.json's eos_token_id
    source = load_file(TARGET / "model.safetensors")
    for name, loaded in (("model.embed_tokens.weight", target.embed),
                         ("lm_head.weight", target.lm_head)):
        assert torch.equal(loaded, source[name].to(torch.float32))


def test_float32_forward_matches_float64(target):
    """Our float32 arithmetic is float32-exact: a float64 run of the same code agrees to
    ~1e-5 on every hidden state (the tolerance the parity tests build on)."""
    ids = torch.tensor(PROMPT)
    out32 = target.forward(ids, KVCache())
    wide = Qwen3Target(TARGET, device=CPU, dtype=torch.float64)
    out64 = wide.forward(ids, KVCache())
    assert len(out32.hidden_states) == 7          # embeddings + 6 layers (last one normed)
    for a, b in zip(out32.hidden_states, out64.hidden_states):
        assert (a.double() - b).abs().max() < FLOAT64_ATOL
    assert (out32.logits.double() - out64.logits).abs().max() < FLOAT64_ATOL


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
    # Two float32 computations of the same values, not one: the one-pass forward multiplies
    # 11 rows at once, the incremental ones 5, 4 and 4, and the CPU GEMM kernels block (so
    # sum) each 64- to 128-long dot product differently for another row or thread count.
    # Each is within FLOAT64_ATOL of the float64 values (the test above), so they may differ
    # from each other by up to twice that. The former 1e-5 was implied by nothing and failed
    # at 1.24e-5 on 2 threads. A cache bug (a wrong position, a stale or missing row) moves
    # the logits by 1e-2 or more.
    atol = 2 * FLOAT64_ATOL
    torch.testing.assert_close(got, full.logits, atol=atol, rtol=0)
    for i in (1, 3, 5):
        tap = torch.cat([first.hidden_states[i], rest.hidden_states[i][:2], again.hidden_states[i]])
        torch.testing.assert_close(tap, full.hidden_states[i], atol=atol, rtol=0)


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


def test_kept_taps_and_last_logits_are_the_full_values(target):
    """``keep`` drops the hidden states nobody asked for, ``last_logits_only`` computes one
    row of logits (a prefill needs no more): the kept values are the full forward's."""
    ids = torch.tensor(PROMPT)
    full = target.forward(ids, KVCache())
    part = target.forward(ids, KVCache(), keep=(1, 3), last_logits_only=True)
    assert [h is not None for h in part.hidden_states] == [False, True, False, True, False,
                                                           False, False]
    for i in (1, 3):
        assert torch.equal(part.hidden_states[i], full.hidden_states[i])
    assert part.logits.shape == (1, 512)
    torch.testing.assert_close(part.logits[0], full.logits[-1], atol=2 * FLOAT64_ATOL, rtol=0)
    assert int(part.logits[0].argmax()) == int(full.logits[-1].argmax())


def test_context_length_from_the_config(tmp_path):
    from dspark_convert.contract.qwen3 import DEFAULT_MAX_POSITION_EMBEDDINGS
    from dspark_convert.runtime.qwen3 import read_target_config

    assert read_target_config(TARGET).max_position_embeddings == 512
    out = _copy_target(tmp_path)
    cfg = json.loads((out / "config.json").read_text())
    del cfg["max_position_embeddings"]             # transformers' Qwen3Config default
    (out / "config.json").write_text(json.dumps(cfg))
    assert read_target_config(out).max_position_embeddings == DEFAULT_MAX_POSITION_EMBEDDINGS


@pytest.mark.parametrize("layers", [2 ** 40, 7, 5])
def test_layer_count_is_checked_against_the_headers_first(tmp_path, layers):
    """A count the headers do not hold is refused before any per-layer table is built by it
    (2**40 would take hours and terabytes), within milliseconds."""
    import time

    out = _copy_target(tmp_path)
    cfg = json.loads((out / "config.json").read_text())
    cfg["num_hidden_layers"] = layers
    (out / "config.json").write_text(json.dumps(cfg))
    start = time.perf_counter()
    with pytest.raises(RuntimeTargetError, match=rf"num_hidden_layers': expected the 6 layer\(s\) "
                       rf"the safetensors headers hold \(layers 0..5 \(6 distinct\)\), found {layers}"):
        plan_target(out)
    assert time.perf_counter() - start < 1.0


def test_a_layer_gap_is_refused(tmp_path):
    out = _copy_target(tmp_path)
    tensors = load_file(out / "model.safetensors")
    for name in [n for n in tensors if n.startswith("model.layers.5.")]:
        tensors[name.replace("layers.5.", "layers.9.")] = tensors.pop(name)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(RuntimeTargetError, match=r"layers 0..9 \(6 distinct\)\), found 6"):
        plan_target(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weights_in_the_compute_dtype(dtype):
    """Every tensor is held once, in the compute dtype, equal to the stored values cast."""
    model = Qwen3Target(TARGET, device=CPU, dtype=dtype)
    assert {t.dtype for t in model.w.values()} == {dtype}
    source = load_file(TARGET / "model.safetensors")
    for name, value in source.items():
        assert torch.equal(model.w[name], value.to(dtype)), name
