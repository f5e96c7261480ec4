"""Gemma4 at released scale: google/gemma-4-12B-it with DeepSeek's 12B
DSpark drafter, as all-zero sparse checkpoints (bench/sparse_gemma4.py), and the memory
estimate smoke makes for them before loading (runtime/memory.py).

- The sparse 12B target is gemma-4-12B-it's text path: its parameter count and KV cache
  per position computed here by hand from docs/REFERENCE.md §10.6 (40 sliding layers
  with 8 KV heads of 256 and a v_proj, 8 full ones with 1 KV head of 512 and none), not
  from the runtime's table; the drafter is the released config and shapes.
- The caches the estimate counts are the tensors the runtime holds: on the tiny Gemma4
  fixture target, the target's KV cache and the drafter's context K/V after a prefill, and
  the weights' element counts, against ``estimate_memory`` in both dtypes. A cache sized at
  the largest KV heads times the largest head_dim (2 x 32 there, 8 x 512 at 12B), or the
  drafter's context K/V at the sliding geometry, fails.
- Slow: the 12B drafter converted with --target (2.8 GB written), then `dspark smoke
  --max-memory 8GB` in a child whose address space is capped at 1.5 GiB (torch alone needs
  about 1 GiB of it, tests/support/bounded.py): it must refuse (78) with the estimate in its
  one line, at a peak RSS of the interpreter and torch, in seconds. Loading even the
  embedding (2 GB in bfloat16) would fail the cap; a check made after loading would run
  out of it.
- Slow: on a small Gemma4 pair with the 12B attention geometry (16 heads, 8 x 256 sliding,
  1 x 512 full) and a 2000-token prompt, the float32 estimate is within 20% of the peak
  RSS the kernel measures, as tests/test_runtime_memory.py holds Qwen3's.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import pytest
import torch

from support.cli import assert_one_error_line, dspark_cmd
from support.gemma4 import GEMMA4_DRAFTERS, GEMMA4_RELEASED_CONFIG, GEMMA4_TARGET
from support.paths import GOLDEN
from support.tools import load_tool

from dspark_convert.commands.convert import convert
from dspark_convert.contract.families import GEMMA4
from dspark_convert.formats.safetensors import read_checkpoint
from dspark_convert.runtime import gemma4 as G
from dspark_convert.runtime.budget import format_bytes
from dspark_convert.runtime.memory import cache_bytes, estimate_memory
from dspark_convert.runtime.weights import load_drafter_weights, plan_drafter

# bench/sparse_gemma4.py (beside sparse_models.py and make_checkpoint.py): loaded by path.
_sparse = load_tool("bench/sparse_gemma4.py", siblings=("make_checkpoint", "sparse_models"))
GEMMA4_12B, make_sparse_pair = _sparse.GEMMA4_12B, _sparse.make_sparse_pair

CPU = torch.device("cpu")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
RELEASED_SHAPES = GOLDEN / "reference" / "released_shapes.json"

# gemma-4-12B-it's text path, by hand from docs/REFERENCE.md §10.6.
H, I, V, HEADS = 3840, 15360, 262144, 16
SLIDING = (8, 256)                  # KV heads, head_dim (with v_proj)
FULL = (1, 512)                     # global KV heads, global_head_dim (k_eq_v: no v_proj)
FULL_LAYERS = list(range(5, 48, 6))


def _layer_params(kv: int, d: int, v_proj: bool) -> int:
    attn = HEADS * d * H * 2 + kv * d * H * (2 if v_proj else 1) + 2 * d
    return attn + 3 * I * H + 4 * H + 1         # MLP, four norms, the layer scalar


TARGET_12B_PARAMS = (V * H + H + 40 * _layer_params(*SLIDING, v_proj=True)
                     + 8 * _layer_params(*FULL, v_proj=False))
KV_PER_POSITION_12B = 40 * 2 * 8 * 256 + 8 * 2 * 1 * 512       # target, K and V
DRAFTER_KV_PER_POSITION_12B = 5 * 2 * 1 * 512                   # 5 draft layers, global


@pytest.fixture(scope="module")
def pair12(tmp_path_factory):
    return make_sparse_pair(GEMMA4_12B, tmp_path_factory.mktemp("gemma4-12b") / "models")


def test_the_sparse_12b_target_is_gemma_4_12b_it(pair12):
    target, _drafter = pair12
    plan = G.plan_target(target)
    cfg = plan.config
    assert TARGET_12B_PARAMS == 11_907_350_320
    assert plan.numel == TARGET_12B_PARAMS
    assert [i for i, g in enumerate(cfg.layers) if g.kind == G.FULL] == FULL_LAYERS
    assert cfg.kv_elements_per_token() == KV_PER_POSITION_12B
    entries = read_checkpoint(target).tensors
    for i in (0, 5, 46, 47):
        p = f"{G.PREFIX}layers.{i}.self_attn."
        kv, d = FULL if i in FULL_LAYERS else SLIDING
        assert entries[p + "k_proj.weight"].shape == (kv * d, H)
        assert entries[p + "q_proj.weight"].shape == (HEADS * d, H)
        assert (p + "v_proj.weight" in entries) == (i not in FULL_LAYERS)
    assert G.HEAD not in entries                  # tied: the embedding is the head
    # All zero and a hole: the file is as long as its header says, and nearly unallocated.
    weights = target / "model.safetensors"
    assert os.path.getsize(weights) > 2 * TARGET_12B_PARAMS
    assert os.stat(weights).st_blocks * 512 < 1_000_000


def test_the_sparse_12b_drafter_is_the_released_one(pair12):
    target, drafter = pair12
    assert json.loads((drafter / "config.json").read_text()) == \
        json.loads(GEMMA4_RELEASED_CONFIG.read_text())
    released = json.loads(RELEASED_SHAPES.read_text())["gemma4/vanilla+conf_with_markov"]
    found = {name: list(e.shape) for name, e in read_checkpoint(drafter).tensors.items()}
    assert found == released
    # The embedding and head the pairing compares with the target's tied embedding: the
    # same shape and dtype, all zero in both (a hole), so the same SHA-256.
    tied = read_checkpoint(target).tensors[G.EMBED]
    for name in ("embed_tokens.weight", "lm_head.weight"):
        entry = read_checkpoint(drafter).tensors[name]
        assert (entry.shape, entry.dtype) == (tied.shape, tied.dtype)


@pytest.mark.parametrize("es", [2, 4])
def test_12b_caches_are_sliding_and_global_kv(pair12, es):
    """The caches' bytes at 12B: the target's layers each at their own geometry (not 48
    layers of 8 x 512, which would count 4.6x), the drafter's at the global one (not 8 x
    256, 4x)."""
    target, drafter = pair12
    cfg = G.plan_target(target).config
    raw = json.loads((drafter / "config.json").read_text())
    contract = GEMMA4.build_contract(GEMMA4.parse_config(raw, path="config.json"),
                                     path="config.json", raw=raw)
    positions = 64 + 16 + 7
    assert cache_bytes(cfg, contract, positions, es) == \
        (KV_PER_POSITION_12B + DRAFTER_KV_PER_POSITION_12B) * positions * es
    # One forward's working set is sized per kind of layer, not for 8 KV heads of 512.
    assert cfg.attention_shapes() == {SLIDING, FULL}


# --- the estimate against what the runtime holds (the tiny fixture target) --------------------

@pytest.fixture(scope="module")
def fixture_artifact(tmp_path_factory):
    out = tmp_path_factory.mktemp("gemma4-scale") / "art"
    convert(GEMMA4_DRAFTERS["gemma4_vanilla_conf_markov"], out, target=GEMMA4_TARGET)
    return out


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_the_estimate_counts_what_the_runtime_holds(fixture_artifact, dtype):
    dt = DTYPES[dtype]
    es = dt.itemsize
    tplan, dplan = G.plan_target(GEMMA4_TARGET), plan_drafter(fixture_artifact)
    prompt, new = 40, 16
    est = estimate_memory(tplan, dplan, dtype=dt, device=CPU, longest_prompt=prompt,
                          max_new_tokens=new)
    target = G.Gemma4Target(GEMMA4_TARGET, device=CPU, dtype=dt, plan=tplan)
    weights = load_drafter_weights(fixture_artifact, dtype=dt, plan=dplan)
    assert sum(t.numel() for t in target.w.values()) * es == est.target_weights
    assert sum(t.numel() for t in weights.tensors.values()) * es == est.drafter_weights
    assert {t.dtype for t in [*target.w.values(), *weights.tensors.values()]} == {dt}

    # Both caches filled for the estimate's context (a prefill of that many positions).
    drafter = G.Gemma4Drafter(weights, embed=target.embed, lm_head=target.lm_head, device=CPU)
    T = est.context_tokens
    assert T == prompt + new + dplan.contract.block.block_size
    cache = G.KVCache()
    out = target.forward(torch.arange(10, 10 + T), cache, keep=drafter.hidden_state_indices)
    drafter.add_context(drafter.features(out.hidden_states))
    held = sum(t.numel() * t.element_size() for t in [*cache.keys, *cache.values,
                                                       *drafter.ctx_keys, *drafter.ctx_values])
    assert held == cache_bytes(tplan.config, dplan.contract, T, es)
    # The fixture has both kinds of layer: 2 KV heads of 16 (sliding), 1 of 32 (full).
    kinds = {(g.kv_heads, g.head_dim) for g in tplan.config.layers}
    assert kinds == {(2, 16), (1, 32)}
    assert held != (2 * 6 * 2 * 32 + 2 * 2 * 1 * 32) * T * es


# --- released scale: smoke refuses before loading (slow: a 2.8 GB conversion) ---------------

@pytest.fixture(scope="module")
def artifact12(pair12):
    target, drafter = pair12
    out = drafter.parent / "artifact"
    convert(drafter, out, target=target)
    return out


# The child is started by a small launcher, not forked from pytest (whose high-water RSS
# would be the child's ru_maxrss: tests/test_runtime_memory.py), with its address space
# capped before exec (tests/support/bounded.py). The launcher reports the child's wait4.
LAUNCHER = """
import os, resource, subprocess, sys
limit = int(sys.argv[1]) * 2**20
with open(sys.argv[2], "wb") as out:
    proc = subprocess.Popen(sys.argv[3:], stdout=out, preexec_fn=lambda:
                            resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    _, status, usage = os.wait4(proc.pid, 0)
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)
"""
MEMORY_MB = 1536          # torch's ~1 GiB of address space; one 2 GB tensor does not fit
SECONDS = 180.0           # measured 9 s; a load of 26.6 GB would take minutes
PROMPT, NEW = 64, 16


def _smoke12(artifact, target, out, *args):
    """(exit code, stderr, stdout, peak RSS bytes, seconds) of the capped child."""
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", LAUNCHER, str(MEMORY_MB), str(out),
         *dspark_cmd("smoke", str(artifact), "--target", str(target), "--device", "cpu",
                     "--prompt-ids", ",".join(str(i) for i in range(10, 10 + PROMPT)),
                     "--max-new-tokens", str(NEW), "--max-memory", "8GB", *args)],
        capture_output=True, text=True, timeout=SECONDS,
        env={**os.environ, "COLUMNS": "400", "OMP_NUM_THREADS": "1"})
    code, maxrss_kib = (int(word) for word in proc.stdout.split())
    return code, proc.stderr, out.read_text(), maxrss_kib * 1024, time.perf_counter() - start


@pytest.mark.slow
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_12b_smoke_prints_the_estimate_and_refuses_before_loading(pair12, artifact12, dtype,
                                                                   tmp_path):
    target, _ = pair12
    est = estimate_memory(G.plan_target(target), plan_drafter(artifact12), dtype=DTYPES[dtype],
                          device=CPU, longest_prompt=PROMPT, max_new_tokens=NEW)
    es = DTYPES[dtype].itemsize
    released = json.loads(RELEASED_SHAPES.read_text())["gemma4/vanilla+conf_with_markov"]
    # The drafter's own tensors: the embedding and head are the target's.
    drafter_params = sum(math.prod(s) for s in released.values()) - 2 * V * H
    assert (est.target_weights, est.drafter_weights) == (TARGET_12B_PARAMS * es,
                                                         drafter_params * es)
    assert est.total > 8e9

    code, stderr, _, peak, seconds = _smoke12(artifact12, target, tmp_path / "out.txt",
                                              "--dtype", dtype)
    gb = format_bytes
    assert_one_error_line(
        (code, stderr), 78, "memory: expected at most 8.00 GB (--max-memory on cpu)",
        f"found an estimate of {gb(est.total)} for {dtype} (weights {gb(est.weights)}: "
        f"{gb(est.target_weights)} target + {gb(est.drafter_weights)} drafter, activations "
        f"{gb(est.activations)} at {est.context_tokens:,} positions, runtime {gb(est.runtime)})")
    # Nothing loaded: the interpreter, torch and the pairing's 8 MiB buffers (0.28 GB).
    assert peak < 450 * 2**20, peak
    assert seconds < SECONDS


@pytest.mark.slow
def test_12b_refusal_as_json(pair12, artifact12, tmp_path):
    target, _ = pair12
    est = estimate_memory(G.plan_target(target), plan_drafter(artifact12), dtype=torch.bfloat16,
                          device=CPU, longest_prompt=PROMPT, max_new_tokens=NEW)
    code, stderr, stdout, peak, _ = _smoke12(artifact12, target, tmp_path / "out.json",
                                             "--dtype", "bfloat16", "--json")
    assert code == 78, stderr
    report = json.loads(stdout)
    assert report["error"] == "MemoryBudgetError"
    assert (report["expected"], report["found"]) == (8_000_000_000, est.total)
    assert peak < 450 * 2**20, peak


# --- the estimate against the kernel's peak, at the 12B attention geometry --------------------

SMALL = _sparse.Gemma4Geometry(
    "gemma4-attention-12b", hidden_size=512, intermediate_size=1024, target_layers=6,
    full_every=6, heads=16, head_dim=256, kv_heads=8, global_head_dim=512, global_kv_heads=1,
    sliding_window=1024, vocab_size=32768, max_position_embeddings=8192, taps=(1, 2, 3, 4),
    draft_layers=2, markov_rank=64)


@pytest.mark.slow
def test_float32_estimate_matches_the_measured_peak(tmp_path):
    """A 2000-token prompt through 16 heads of 256 and 512 (scores, repeated K/V, both
    caches: 1.19 GB of the 1.90 GB estimated), the weights 0.37 GB: measured 2.16 GB.
    bfloat16 is not held to it: the runtime's 3-D scaled_dot_product_attention takes the
    math path there too (docs/PERFORMANCE.md)."""
    target, drafter = make_sparse_pair(SMALL, tmp_path / "models")
    artifact = tmp_path / "artifact"
    convert(drafter, artifact, target=target)
    out = tmp_path / "smoke.json"
    proc = subprocess.run(
        [sys.executable, "-c", LAUNCHER, str(64 * 1024), str(out),
         *dspark_cmd("smoke", str(artifact), "--target", str(target), "--device", "cpu",
                     "--json", "--dtype", "float32", "--max-new-tokens", "16", "--prompt-ids",
                     ",".join(str(10 + i % 300) for i in range(2000)))],
        capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    code, maxrss_kib = (int(word) for word in proc.stdout.split())
    report = json.loads(out.read_text())
    assert code == 0, report
    estimate, peak = report["memory"]["estimate_bytes"], maxrss_kib * 1024
    assert report["memory"]["activations_bytes"] > 1e9
    assert abs(peak - estimate) <= 0.20 * estimate, (peak, estimate, report["memory"])
