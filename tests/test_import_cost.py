"""Start-up cost: what each command imports and what threads it starts.

Measured as behaviour, not time: each case runs the real typer app in a fresh interpreter
and records, at exit (an atexit hook, so it sees everything up to the app's own
``sys.exit``), ``sys.modules``, the process' threads (/proc/self/task) and the
OPENBLAS_NUM_THREADS it ran with. Timing lives in bench/ (bench/RESULTS.md).

- `dspark --help` and every command's --help import none of the heavy libraries;
- a command imports only the libraries it uses: validate and inspect no torch, Hub client,
  tokenizers or matplotlib; convert of a directory no tokenizers or torch either (--target
  brings tokenizers, for the fingerprint);
- the commands that call no BLAS routine (convert, validate, inspect, lock) start no
  OpenBLAS threads (numpy starts one per core on import unless told otherwise), and leave
  a user's own thread setting alone; smoke and eval, which run torch, are left as they are.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REFERENCE_DRAFTER
from support.paths import GOLDEN_TARGET as TARGET

# Libraries that cost 0.1-2 s to import (torch ~1.9 s); none is needed to print help.
HEAVY = {"torch", "numpy", "gguf", "huggingface_hub", "tokenizers", "matplotlib"}
# What none of convert (of a directory), validate and inspect needs.
NOT_FOR_ARTIFACTS = {"torch", "huggingface_hub", "tokenizers", "matplotlib"}
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
HAS_TASKS = Path("/proc/self/task").is_dir()

CHILD = """
import atexit, json, os, sys
out_path, args = sys.argv[1], json.loads(sys.argv[2])

def dump():
    # Python's own threads are joined before atexit runs: what is left is native (OpenBLAS).
    tasks = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else None
    with open(out_path, "w") as fh:
        json.dump({"modules": sorted(sys.modules), "threads": tasks,
                   "openblas": os.environ.get("OPENBLAS_NUM_THREADS")}, fh)

atexit.register(dump)
sys.argv = ["dspark", *args]
if args == ["<import convert>"]:
    import dspark_convert.commands.convert  # the control case: the library does need them
    sys.exit(0)
from dspark_convert.cli.main import app
app()
"""


def run_child(tmp_path, args: list[str], env: dict | None = None):
    """(the process, its top-level modules, its record) for ``dspark ARGS`` in a fresh
    interpreter; ``env`` replaces the thread variables of this process' environment."""
    out = tmp_path / "modules.json"
    child_env = {k: v for k, v in os.environ.items() if k not in BLAS_THREAD_VARIABLES}
    child_env.update(env or {})
    proc = subprocess.run([sys.executable, "-c", CHILD, str(out), json.dumps(args)],
                          check=False, capture_output=True, text=True, timeout=120, env=child_env)
    record = json.loads(out.read_text())
    return proc, {m.split(".")[0] for m in record["modules"]}, record


def imported_after(tmp_path, args: list[str]) -> tuple[subprocess.CompletedProcess, set[str]]:
    proc, top_level, _record = run_child(tmp_path, args)
    return proc, top_level


# One child per case (~0.3-0.7 s each): the fast loop keeps a canary of each kind, the
# full suite every command.
SLOW = pytest.mark.slow


@pytest.mark.parametrize("args", [["--help"], ["smoke", "--help"]] + [
    pytest.param(args, marks=SLOW) for args in (
        ["--version"], ["convert", "--help"], ["validate", "--help"], ["inspect", "--help"],
        ["lock", "--help"], ["quantize", "--help"], ["eval", "--help"])])
def test_help_does_not_import_heavy_modules(tmp_path, args):
    proc, top_level = imported_after(tmp_path, args)
    assert proc.returncode == 0, proc.stderr
    assert ("Usage" in proc.stdout) or ("dspark-convert" in proc.stdout)
    assert top_level & HEAVY == set(), f"dspark {' '.join(args)} imported {sorted(top_level & HEAVY)}"


def test_the_check_sees_heavy_imports(tmp_path):
    """Control: the same probe reports numpy and gguf once the converter is imported, so an
    empty set above means they were really not imported."""
    proc, top_level = imported_after(tmp_path, ["<import convert>"])
    assert proc.returncode == 0, proc.stderr
    assert {"numpy", "gguf"} <= top_level


def _command(name: str, converted, tmp_path) -> list[str]:
    return {
        "validate": ["validate", str(converted["reference"])],
        "inspect artifact": ["inspect", str(converted["reference"])],
        "inspect checkpoint": ["inspect", str(REFERENCE_DRAFTER)],
        "convert": ["convert", str(REFERENCE_DRAFTER), "-o", str(tmp_path / "art"), "-q"],
        "convert --target": ["convert", str(REFERENCE_DRAFTER), "-o", str(tmp_path / "art"), "-q",
                             "--target", str(TARGET)],
        "validate --target": ["validate", str(converted["reference"]), "--target", str(TARGET)],
    }[name]


@pytest.mark.parametrize("name, unused, used", [
    ("validate", NOT_FOR_ARTIFACTS, {"numpy", "gguf"}),
    pytest.param("inspect artifact", NOT_FOR_ARTIFACTS, {"numpy", "gguf"}, marks=SLOW),
    pytest.param("inspect checkpoint", NOT_FOR_ARTIFACTS, {"numpy"}, marks=SLOW),
    pytest.param("convert", NOT_FOR_ARTIFACTS, {"numpy", "gguf"}, marks=SLOW),
    # The target's tokenizer is fingerprinted: tokenizers, still no torch.
    ("convert --target", NOT_FOR_ARTIFACTS - {"tokenizers"}, {"tokenizers"}),
    pytest.param("validate --target", NOT_FOR_ARTIFACTS - {"tokenizers"}, {"tokenizers"},
                 marks=SLOW),
])
def test_a_command_imports_only_what_it_uses(tmp_path, converted, name, unused, used):
    """The same probe, on real work: each command succeeds, imports what it needs (so the
    probe sees its imports) and none of the libraries it does not use. These commands call
    no BLAS routine: with no thread setting in the environment, numpy runs with
    OPENBLAS_NUM_THREADS=1, and (without --target, whose tokenizers library keeps a thread
    pool of its own) the process ends with its main thread only."""
    proc, top_level, record = run_child(tmp_path, _command(name, converted, tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert used <= top_level, f"dspark {name}: {sorted(used - top_level)} not seen"
    assert top_level & unused == set(), f"dspark {name} imported {sorted(top_level & unused)}"
    assert record["openblas"] == "1"
    if HAS_TASKS and "--target" not in name:
        assert record["threads"] == 1, f"dspark {name} ended with {record['threads']} threads"


@pytest.mark.slow   # two children
@pytest.mark.skipif(not HAS_TASKS, reason="counts threads in Linux's /proc/self/task")
def test_a_users_thread_setting_is_left_alone(tmp_path, converted):
    """OPENBLAS_NUM_THREADS=2 from the user stays 2, and OpenBLAS then runs its second
    thread (the control: the count above would see OpenBLAS' threads); OMP_NUM_THREADS,
    which OpenBLAS also reads, is a choice too."""
    proc, _, record = run_child(tmp_path, _command("validate", converted, tmp_path),
                                env={"OPENBLAS_NUM_THREADS": "2"})
    assert proc.returncode == 0, proc.stderr
    assert record["openblas"] == "2"
    if len(os.sched_getaffinity(0)) >= 2:          # OpenBLAS starts no more threads than cores
        assert record["threads"] == 2, record["threads"]
    proc, _, record = run_child(tmp_path, _command("validate", converted, tmp_path),
                                env={"OMP_NUM_THREADS": "3"})
    assert proc.returncode == 0, proc.stderr
    assert record["openblas"] is None


@pytest.mark.slow   # one child
def test_eval_refuses_a_bad_option_before_importing_torch(tmp_path):
    """eval checks its options first (exit 91): a typo costs no torch start-up."""
    proc, top_level = imported_after(tmp_path, ["eval", str(tmp_path / "a"), "--target",
                                                str(TARGET), "-o", str(tmp_path / "r"),
                                                "--dtype", "float16"])
    assert proc.returncode == 91 and "--dtype: expected one of" in proc.stderr, proc.stderr
    assert "torch" not in top_level


@pytest.mark.parametrize("command", ["smoke", pytest.param("eval", marks=SLOW)])
def test_a_bad_calibration_file_is_refused_before_importing_torch(tmp_path, command):
    """smoke and eval read --calibration first (92): a wrong file is one line before torch
    starts, the artifacts are validated or the target is hashed for its identity, which at
    released scale is gigabytes."""
    cal = tmp_path / "calibration.json"
    cal.write_text('{"format": "dspark-calibration", "version": "1"}')
    extra = ["-o", str(tmp_path / "report")] if command == "eval" else []
    proc, top_level = imported_after(tmp_path, [command, str(REFERENCE_DRAFTER), "--target",
                                                str(TARGET), *extra, "--calibration", str(cal)])
    assert proc.returncode == 92 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert f"calibration {cal}" in proc.stderr
    assert "torch" not in top_level


@pytest.mark.slow   # smoke imports torch before it looks at its artifact (~2 s)
def test_commands_that_run_torch_keep_the_defaults(tmp_path):
    """smoke (and eval) run torch: the CLI sets no thread count for them."""
    proc, _, record = run_child(tmp_path, ["smoke", str(tmp_path / "missing"), "--target",
                                           str(TARGET)])
    assert proc.returncode != 0 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert record["openblas"] is None
