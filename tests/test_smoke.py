"""dspark_convert/smoke.py and `dspark smoke`: the golden drafter passes, broken ones fail loudly.

The CLI cases run the app in-process (tests/support/cli.py, torch on one thread); real
`dspark smoke` processes are in test_smoke_bounds.py (capped and timed) and
test_runtime_memory.py (their peak RSS)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import REFERENCE_DRAFTER
from support.paths import GOLDEN_TARGET as TARGET, REFERENCE_PROMPTS as PROMPTS, REFERENCE_TRACE as REFERENCE
from support.cli import run_cli
from dspark_convert.commands.convert import convert
from dspark_convert.errors import (
    AcceptanceFloorError,
    DeviceUnavailableError,
    IntegrityError,
    ReferenceDivergenceError,
    ReferenceTraceError,
    SmokeInputError,
    EmbeddingIdentityError,
    TargetGeometryError,
    TargetNotFoundError,
)
from dspark_convert.runtime.trace import load_reference
from dspark_convert.commands.smoke import run_smoke
from dspark_convert.commands.validate import validate_artifact



pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _broken_checkpoint(root, how):
    """A modified copy of the golden checkpoint, converted: it still validates."""
    src = root / f"src-{how}"
    src.mkdir()
    tensors = load_file(REFERENCE_DRAFTER / "model.safetensors")
    config = json.loads((REFERENCE_DRAFTER / "config.json").read_text())
    if how == "transposed":      # one square matrix transposed
        name = "layers.1.self_attn.o_proj.weight"
        tensors[name] = tensors[name].t().contiguous()
    else:                        # one tap moved: layer 3 instead of layer 4
        config["target_layer_ids"] = [0, 2, 3]
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    (src / "config.json").write_text(json.dumps(config, indent=2))
    out = root / f"artifact-{how}"
    convert(src, out)
    return out


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    root = tmp_path_factory.mktemp("broken")
    return {how: _broken_checkpoint(root, how) for how in ("transposed", "tap")}


@pytest.mark.parametrize("temperature, threshold, seed", [(0.0, 0.0, 0), (0.0, 0.5, 0), (1.0, 0.0, 7)])
def test_golden_drafter_matches_the_reference(converted, tmp_path, temperature, threshold, seed):
    trace, plot = tmp_path / "trace.json", tmp_path / "accept.png"
    result = run_smoke(converted["reference"], target=TARGET, max_new_tokens=24,
                       temperature=temperature, confidence_threshold=threshold, seed=seed,
                       device="cpu", reference=REFERENCE, trace=trace, plot=plot)
    assert [r.prompt for r in result.runs] == PROMPTS          # the reference's prompts
    assert all(r.reference_run is not None for r in result.runs)
    assert result.lossless is (True if temperature == 0 else None)
    assert result.committed_tokens == 48 and result.drafted_tokens > 0
    assert result.drafted_tokens_per_second > 0 and result.committed_tokens_per_second > 0
    assert len(result.acceptance_by_position) == 7
    ref_steps = [a for r in load_reference(REFERENCE) if r.temperature == temperature
                 and r.confidence_threshold == threshold for a in r.data["acceptance_lengths"]]
    assert result.tau == pytest.approx(sum(ref_steps) / len(ref_steps))
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # our trace has reference.json's format: it serves as a reference itself
    written = load_reference(trace)
    assert len(written) == 2 and written[0].data["cycles"]
    run_smoke(converted["reference"], target=TARGET, max_new_tokens=24, temperature=temperature,
              confidence_threshold=threshold, seed=seed, device="cpu", reference=trace)
    assert not [p for p in tmp_path.iterdir() if "dspark-tmp" in p.name]


@pytest.mark.parametrize("how", ["transposed", "tap"])
def test_broken_artifact_validates_but_fails_smoke(broken, how):
    artifact = broken[how]
    assert validate_artifact(artifact).ok
    # At temperature 0 any drafter is lossless: the output still equals the target's...
    result = run_smoke(artifact, target=TARGET, prompts=PROMPTS, max_new_tokens=24, device="cpu")
    assert result.lossless
    # ...so what gives it away is the trace: it diverges from DeepSpec's at the first cycle.
    with pytest.raises(ReferenceDivergenceError, match=r"prompt 0 vs reference .* cycle 0: ") as info:
        run_smoke(artifact, target=TARGET, max_new_tokens=24, device="cpu", reference=REFERENCE)
    assert info.value.exit_code == 75


def test_min_tau_floor(converted):
    ok = run_smoke(converted["reference"], target=TARGET, prompts=PROMPTS, max_new_tokens=24,
                   device="cpu", min_tau=2.5)
    assert ok.tau == pytest.approx(2.55)
    with pytest.raises(AcceptanceFloorError, match="tau .* is 2.550; --min-tau is 2.6") as info:
        run_smoke(converted["reference"], target=TARGET, prompts=PROMPTS, max_new_tokens=24,
                  device="cpu", min_tau=2.6)
    assert info.value.exit_code == 76


def test_refuses_a_target_with_another_embedding(converted, tmp_path):
    target = tmp_path / "target"
    shutil.copytree(TARGET, target)
    tensors = load_file(target / "model.safetensors")
    tensors["model.embed_tokens.weight"][5, 0] += 1
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    # The one pairing (validate --target) refuses it, with its own code (65), as convert and
    # validate do; smoke used to re-check it with another code (71).
    with pytest.raises(EmbeddingIdentityError, match="validate: target: .*dflash.target.embed_sha256"
                                                     ".*model.embed_tokens.weight.*not this "
                                                     "target's embedding") as info:
        run_smoke(converted["reference"], target=target, prompts=PROMPTS, device="cpu")
    assert info.value.exit_code == 65


def test_refuses_a_target_of_another_geometry(converted):
    with pytest.raises(TargetGeometryError, match="hidden_size is 64; the drafter expects 32") as info:
        run_smoke(converted["gated_conf_markov"], target=TARGET, prompts=PROMPTS, device="cpu")
    assert info.value.exit_code == 62


def test_refuses_an_artifact_that_fails_validate(converted, tmp_path):
    artifact = tmp_path / "artifact"
    shutil.copytree(converted["reference"], artifact)
    data = bytearray((artifact / "drafter.gguf").read_bytes())
    data[-3] ^= 0x01                                    # one bit of the last tensor
    (artifact / "drafter.gguf").write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="validate: integrity") as info:
        run_smoke(artifact, target=TARGET, prompts=PROMPTS, device="cpu")
    assert info.value.exit_code == 44


def test_text_prompts_need_a_tokenizer(converted, tmp_path):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    target = tmp_path / "target"
    shutil.copytree(TARGET, target, ignore=shutil.ignore_patterns("tokenizer.json"))
    # The pairing needs the tokenizer (the mask token, the fingerprint): a target without
    # one is refused before --prompt is looked at.
    with pytest.raises(TargetNotFoundError, match="tokenizer.json: not found"):
        run_smoke(converted["reference"], target=target, prompt_text="hello world", device="cpu")
    tok = Tokenizer(WordLevel({"[UNK]": 0, "hello": 17, "world": 33}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(target / "tokenizer.json"))
    result = run_smoke(converted["reference"], target=target, prompt_text="hello world",
                       max_new_tokens=8, device="cpu")
    assert result.runs[0].prompt == [17, 33] and result.lossless


@pytest.mark.parametrize("kwargs, match", [
    (dict(prompts=[[1, 512]]), "token id 512 is outside the vocabulary 0..511"),
    (dict(prompts=[[]]), "empty prompt"),
    (dict(), "no prompt"),
    (dict(prompts=PROMPTS, max_new_tokens=0), "--max-new-tokens"),
    (dict(prompts=PROMPTS, confidence_threshold=1.5), "--confidence-threshold"),
    (dict(prompts=PROMPTS, device="tpu"), "--device"),
])
def test_refuses_bad_inputs(converted, kwargs, match):
    with pytest.raises(SmokeInputError, match=match) as info:
        run_smoke(converted["reference"], target=TARGET, **{"device": "cpu", **kwargs})
    assert info.value.exit_code == 73


def test_reference_settings_must_match(converted):
    with pytest.raises(ReferenceTraceError, match="generated 24 new tokens; --max-new-tokens is 30"):
        run_smoke(converted["reference"], target=TARGET, max_new_tokens=30, device="cpu",
                  reference=REFERENCE)
    with pytest.raises(ReferenceTraceError, match="no run at temperature 0, confidence threshold 0.3"):
        run_smoke(converted["reference"], target=TARGET, max_new_tokens=24, device="cpu",
                  confidence_threshold=0.3, reference=REFERENCE)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here: nothing to refuse")
def test_cuda_requested_without_cuda(converted):
    with pytest.raises(DeviceUnavailableError, match="CUDA is not available") as info:
        run_smoke(converted["reference"], target=TARGET, prompts=PROMPTS, device="cuda")
    assert info.value.exit_code == 72


# --- the CLI, as a user runs it ------------------------------------------------------------

def test_cli_golden_json(converted, tmp_path):
    proc = run_cli("smoke", str(converted["reference"]), "--target", str(TARGET), "--device",
                   "cpu", "--reference", str(REFERENCE), "--max-new-tokens", "24", "--json",
                   "--trace", str(tmp_path / "t.json"), "--plot", str(tmp_path / "a.png"))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] and report["tau"] == pytest.approx(2.55) and report["lossless"] is True
    assert (tmp_path / "t.json").is_file() and (tmp_path / "a.png").is_file()


@pytest.mark.parametrize("dtype, verify, mode", [("float32", "auto", "batched"),
                                                ("bfloat16", "auto", "stepwise"),
                                                ("bfloat16", "batched", "batched"),
                                                ("float32", "stepwise", "stepwise")])
def test_cli_dtype_and_verify_are_recorded(converted, tmp_path, dtype, verify, mode):
    """The dtype and verification mode reach the JSON report and the trace; the estimate is
    printed before loading in the human report."""
    trace = tmp_path / "t.json"
    proc = run_cli("smoke", str(converted["reference"]), "--target", str(TARGET), "--device", "cpu",
                   "--prompt-ids", "1,17,33", "--max-new-tokens", "8", "--dtype", dtype,
                   "--verify", verify, "--json", "--trace", str(trace))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["dtype"], report["verify"], report["memory"]["dtype"]) == (dtype, mode, dtype)
    assert report["lossless"] is True and report["load_seconds"] >= 0
    assert report["verify_seconds_per_cycle"] > 0 and report["draft_seconds_per_cycle"] > 0
    assert report["memory"]["peak_rss_bytes"] > 0 and report["memory"]["estimate_bytes"] > 0
    assert json.loads(trace.read_text())["dtype"] == dtype
    human = run_cli("smoke", str(converted["reference"]), "--target", str(TARGET), "--device",
                    "cpu", "--prompt-ids", "1,17,33", "--max-new-tokens", "8", "--dtype", dtype,
                    "--verify", verify)
    lines = human.stdout.splitlines()
    assert lines[0].startswith("memory estimate ") and f"({dtype})" in lines[0]
    assert f"{dtype}, {mode} verify" in lines[1] and "peak RSS" in human.stdout


def test_cli_broken_artifact_fails_with_one_line(broken):
    proc = run_cli("smoke", str(broken["transposed"]), "--target", str(TARGET), "--device", "cpu",
                   "--reference", str(REFERENCE), "--max-new-tokens", "24", "--prompt-ids",
                   ",".join(map(str, PROMPTS[1])))
    assert proc.returncode == 75
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: prompt 0 vs reference")
    assert "Traceback" not in proc.stderr
