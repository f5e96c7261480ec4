"""`dspark smoke` refuses what it cannot bound, through the real CLI, in bounded memory and time.

Where a regression would run for minutes or take gigabytes (a hostile layer count, prompt
or token count), the case runs `dspark smoke` in a child process whose address space is
capped (tests/support/bounded.py; torch alone needs about 1 GB of it) and whose run is
timed; where it would be a wrong exit code or message, the app runs in-process
(tests/support/cli.py). The refusal must come as exit code N, one `error:` line, no
traceback, before anything is sized by the hostile number. The readers' bounds and the
memory refusal:

- a seed beyond torch.Generator's 64 bits (was: exit 1 at temperature > 0);
- a target config.json whose num_hidden_layers is 2e7 or 2**40 (was: minutes building a
  per-layer table);
- a prompt + --max-new-tokens beyond the target's max_position_embeddings (was: an
  8,000-token prompt on a 512-context target ran 40 s at 2.8 GB; 10**30 new tokens ran on);
- a memory estimate over the budget (78), an unknown --dtype, a malformed --max-memory (73).
"""

from __future__ import annotations

import json
import shutil

import pytest

from support.paths import GOLDEN_TARGET as TARGET
from support.bounded import run_bounded
from support.cli import assert_one_error_line, run_cli

MEMORY_MB = 1500          # torch's ~1 GB of address space, plus the golden models
SECONDS = 60.0            # import torch, validate, refuse; a regression runs for minutes


def _target_with(tmp_path, **fields):
    out = tmp_path / "target"
    shutil.copytree(TARGET, out)
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(fields)
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def _smoke(artifact, target, *args: str):
    """In a capped and timed child: for the inputs that used to run away."""
    return run_bounded("smoke", str(artifact), "--target", str(target), "--device", "cpu", *args,
                       memory_mb=MEMORY_MB, seconds=SECONDS)


def _smoke_in_process(artifact, target, *args: str):
    return run_cli("smoke", str(artifact), "--target", str(target), "--device", "cpu", *args)


@pytest.mark.parametrize("seed, temperature", [(str(2 ** 64), "1"), (str(10 ** 30), "0"),
                                               ("-1", "1")])
def test_seed_out_of_range(converted, seed, temperature):
    proc = _smoke_in_process(converted["reference"], TARGET, "--prompt-ids", "1,17,33", "--seed", seed,
                  "--temperature", temperature)
    assert_one_error_line(proc, 73, "--seed: expected 0..2^64-1", seed)


def test_largest_seed_runs(converted):
    proc = _smoke_in_process(converted["reference"], TARGET, "--prompt-ids", "1,17,33", "--seed",
                  str(2 ** 64 - 1), "--temperature", "1", "--max-new-tokens", "4")
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("layers", [2 ** 40, 7])
def test_layer_count_beyond_the_headers(converted, tmp_path, layers):
    """The count is compared with the layers the safetensors headers hold (6) before any
    per-layer table is built: by the pairing, which smoke shares with convert and validate
    (61, as they refuse it; the runtime's own check is in test_runtime_qwen3, in-process)."""
    target = _target_with(tmp_path, num_hidden_layers=layers)
    if layers == 7:     # nothing to run away with: in-process
        proc = _smoke_in_process(converted["reference"], target, "--prompt-ids", "1,17,33")
    else:
        proc = _smoke(converted["reference"], target, "--prompt-ids", "1,17,33")
        assert proc.seconds < 30
    assert_one_error_line(proc, 61, "holds layers 0..5 (6)", f"num_hidden_layers = {layers}")


def test_layer_count_as_a_float(converted, tmp_path):
    target = _target_with(tmp_path, num_hidden_layers=2e7)
    proc = _smoke_in_process(converted["reference"], target, "--prompt-ids", "1,17,33")
    assert_one_error_line(proc, 61, "num_hidden_layers", "expected an integer", "20000000.0 (float)")


@pytest.mark.slow   # a bounded torch child (~3 s); the layer count above is the fast canary
def test_a_prompt_beyond_the_context(converted):
    """8,000 tokens on the golden target, whose max_position_embeddings is 512."""
    ids = ",".join(str(i % 500 + 1) for i in range(8000))
    proc = _smoke(converted["reference"], TARGET, "--prompt-ids", ids)
    assert_one_error_line(proc, 73, "prompt 0", "context of 512 positions", "max_position_embeddings",
             "found 8000 + 64")
    assert proc.seconds < 30


def test_a_text_prompt_too_long_for_any_context_is_refused_before_it_is_encoded(converted):
    """The golden tokenizer's longest token is 9 characters: 512 of them hold 4,608. A text
    of 5 MB used to be encoded whole (minutes at 50 MB) before its length was refused."""
    proc = _smoke_in_process(converted["reference"], TARGET, "--prompt", "ab " * 1_700_000)
    assert_one_error_line(proc, 73, "--prompt: 5100000 characters of text; expected at most 4608",
             "context of 512 tokens, each at most 9 characters")


def test_a_text_prompt_that_can_fit_is_encoded_and_checked_in_tokens(converted):
    """4,000 characters may fit 512 tokens: encoded, then refused by its token count."""
    proc = _smoke_in_process(converted["reference"], TARGET, "--prompt", "ab " * 1333)
    assert_one_error_line(proc, 73, "prompt 0: expected prompt + --max-new-tokens within the target's context")


@pytest.mark.parametrize("new", [pytest.param(str(10 ** 30), marks=pytest.mark.slow), "506"])
def test_new_tokens_beyond_the_context(converted, new):
    # 10**30 new tokens used to run on: bounded child; 506 in-process.
    smoke = _smoke if new == str(10 ** 30) else _smoke_in_process
    proc = smoke(converted["reference"], TARGET, "--prompt-ids", "1,17,33,90,250,7,7",
                 "--max-new-tokens", new)
    assert_one_error_line(proc, 73, "context of 512 positions", f"found 7 + {new}")


def test_exactly_the_context_runs(converted, tmp_path):
    """prompt + new tokens = max_position_embeddings is allowed (a small context, to keep
    the run short)."""
    target = _target_with(tmp_path, max_position_embeddings=16)
    proc = _smoke_in_process(converted["reference"], target, "--prompt-ids", "1,17,33,90,250,7,7",
                             "--max-new-tokens", "9")
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = _smoke_in_process(converted["reference"], target, "--prompt-ids", "1,17,33,90,250,7,7",
                             "--max-new-tokens", "10")
    assert_one_error_line(proc, 73, "context of 16 positions")


def test_context_from_the_config_is_bounded_too(converted, tmp_path):
    target = _target_with(tmp_path, max_position_embeddings=0)
    proc = _smoke_in_process(converted["reference"], target, "--prompt-ids", "1,17,33")
    assert_one_error_line(proc, 70, "max_position_embeddings", "expected a positive integer")


def test_memory_estimate_over_the_budget(converted):
    proc = _smoke_in_process(converted["reference"], TARGET, "--prompt-ids", "1,17,33", "--max-memory", "1MB")
    line = assert_one_error_line(proc, 78, "memory: expected at most 1.0 MB (--max-memory on cpu)",
                    "found an estimate of", "--max-memory to override")
    assert "weights" in line and "activations" in line and "runtime" in line


def test_memory_refusal_as_json(converted):
    proc = _smoke_in_process(converted["reference"], TARGET, "--prompt-ids", "1,17,33", "--max-memory",
                  "1MB", "--json")
    assert proc.returncode == 78
    report = json.loads(proc.stdout)
    assert report["ok"] is False and report["error"] == "MemoryBudgetError"
    assert report["expected"] == 1_000_000 and report["found"] > 1_000_000


@pytest.mark.parametrize("args, code, needle", [
    (("--dtype", "float16"), 73, "--dtype: expected one of float32, bfloat16, found 'float16'"),
    (("--max-memory", "lots"), 73, "--max-memory: expected a size such as 20GB"),
    (("--max-memory", "0GB"), 73, "--max-memory: expected a positive size"),
    (("--verify", "sideways"), 73, "--verify: expected one of auto, batched, stepwise"),
])
def test_bad_dtype_and_budget_options(converted, args, code, needle):
    proc = _smoke_in_process(converted["reference"], TARGET, "--prompt-ids", "1,17,33", *args)
    assert_one_error_line(proc, code, needle)
