"""The same runtime on a GPU: first-block parity and the reference traces with --device cuda.

Skipped where there is no CUDA device (this project's CI and dev machines are CPU-only);
bench/cuda_check.py runs the same checks plus the speed numbers in one script.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from conftest import GOLDEN
from support.paths import GOLDEN_TARGET as TARGET, REFERENCE_TRACE as REFERENCE
from dspark_convert.runtime.drafter import DSparkDrafter
from dspark_convert.runtime.qwen3 import KVCache, Qwen3Target
from dspark_convert.runtime.weights import load_drafter_weights
from dspark_convert.commands.smoke import run_smoke

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device on this machine (CPU-only torch or no GPU)")

FIRST_BLOCK = GOLDEN / "reference" / "vanilla_conf_markov" / "first_block.safetensors"


def test_first_block_on_cuda(converted):
    cuda = torch.device("cuda")
    target = Qwen3Target(TARGET, device=cuda)
    drafter = DSparkDrafter(load_drafter_weights(converted["reference"], device=cuda),
                            embed=target.embed, lm_head=target.lm_head, device=cuda)
    ref = load_file(FIRST_BLOCK)
    out = target.forward(torch.tensor([1, 17, 33, 90, 250, 7, 7, 401], device=cuda), KVCache())
    drafter.add_context(drafter.features(out.hidden_states))
    proposal = drafter.propose(int(out.logits[-1].argmax()))
    assert (proposal.block_hidden.cpu() - ref["block_hidden"]).abs().max() < 3e-4
    assert (proposal.corrected_logits.cpu() - ref["corrected_logits"]).abs().max() < 1.5e-3
    assert proposal.tokens.cpu().tolist() == ref["draft_tokens"].tolist()


@pytest.mark.parametrize("threshold", [0.0, 0.5])
def test_reference_traces_on_cuda(converted, threshold):
    result = run_smoke(converted["reference"], target=TARGET, max_new_tokens=24, device="cuda",
                       confidence_threshold=threshold, reference=REFERENCE)
    assert result.device.startswith("cuda") and result.lossless


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weights_are_placed_on_the_device(converted, dtype):
    """Loaded straight onto the GPU in the compute dtype, equal to the stored values."""
    cuda = torch.device("cuda")
    target = Qwen3Target(TARGET, device=cuda, dtype=dtype)
    weights = load_drafter_weights(converted["reference"], device=cuda, dtype=dtype)
    for tensors in (target.w, weights.tensors):
        assert {(t.device.type, t.dtype) for t in tensors.values()} == {("cuda", dtype)}
    source = load_file(TARGET / "model.safetensors")
    for name, value in source.items():
        assert torch.equal(target.w[name].cpu(), value.to(dtype)), name


@pytest.mark.parametrize("temperature, seed", [(0.0, 0), (1.0, 7)])
def test_bfloat16_smoke_on_cuda(converted, temperature, seed):
    result = run_smoke(converted["reference"], target=TARGET, max_new_tokens=24, device="cuda",
                       dtype="bfloat16", temperature=temperature, seed=seed, reference=REFERENCE)
    assert result.device.startswith("cuda") and result.dtype == "bfloat16"
    assert result.lossless is (True if temperature == 0 else None)
    assert all(r.reference_agreement is not None for r in result.runs)
    assert result.memory.cuda_max_allocated_bytes > 0


# --- the Gemma4 family on the GPU ---------------------------------------------------------------

@pytest.fixture(scope="module")
def gemma4_artifact(tmp_path_factory):
    from support.gemma4 import GEMMA4_DRAFTERS, GEMMA4_TARGET

    from dspark_convert.commands.convert import convert

    out = tmp_path_factory.mktemp("gemma4-cuda") / "art"
    convert(GEMMA4_DRAFTERS["gemma4_vanilla_conf_markov"], out, target=GEMMA4_TARGET)
    return out


@pytest.mark.parametrize("dtype,temperature,threshold,seed", [
    ("float32", 0.0, 0.0, 0), ("float32", 0.0, 0.5, 0), ("float32", 1.0, 0.0, 7),
    ("bfloat16", 0.0, 0.0, 0)])
def test_gemma4_traces_on_cuda(gemma4_artifact, dtype, temperature, threshold, seed):
    """DeepSeek's Gemma4 trace on the GPU: float32 reproduces it (enforced by smoke);
    bfloat16 is lossless, its agreement reported."""
    from support.gemma4 import GEMMA4, GEMMA4_TARGET

    result = run_smoke(gemma4_artifact, target=GEMMA4_TARGET, max_new_tokens=24, device="cuda",
                       dtype=dtype, temperature=temperature, confidence_threshold=threshold,
                       seed=seed, reference=GEMMA4 / "gemma4_vanilla_conf_markov" / "reference.json")
    assert result.device.startswith("cuda") and result.dtype == dtype
    if temperature == 0:
        assert result.lossless
    if dtype == "float32":
        assert all(r.reference_agreement.identical for r in result.runs)
