"""An engine that dies is a finding of the check, named: the signal, which run, the command
line, the engine's last log lines and, for the AMX crash of a native build, its likely cause.

Two ways to a real crash of the real llama.cpp binaries:

- everywhere: a preloaded library of ours (``CRASH_ON_OPEN`` below) raises SIGSEGV inside
  llama-speculative-simple when it opens the drafter file the eval exported, after the
  target is loaded and its log is under way. The engine, its log and its death are real;
  only the moment is chosen.
- on a CPU with AMX only: llama.cpp built ``-march=native`` (``tools/llama_cpp.py build
  --native``, never what the suite or the gate run by default) repacks a Q8_0 drafter's
  weights into AMX buffers and 0c1e570 crashes on it (measured on a Sapphire Rapids
  class CPU). Skipped elsewhere: no other CPU takes that code path.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.cli import run_process
from support.llama_cpp import build, engine
from support.paths import GOLDEN_TARGET

from dspark_convert.errors import EngineRunError

# raise(SIGSEGV) when the program opens a file whose path holds $DSPARK_TEST_CRASH_ON_OPEN.
CRASH_ON_OPEN = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void maybe_crash(const char *path) {
    const char *needle = getenv("DSPARK_TEST_CRASH_ON_OPEN");
    if (needle && *needle && path && strstr(path, needle)) raise(SIGSEGV);
}

FILE *fopen(const char *path, const char *mode) {
    maybe_crash(path);
    FILE *(*real)(const char *, const char *) =
        (FILE *(*)(const char *, const char *)) dlsym(RTLD_NEXT, "fopen");
    return real(path, mode);
}

FILE *fopen64(const char *path, const char *mode) {
    maybe_crash(path);
    FILE *(*real)(const char *, const char *) =
        (FILE *(*)(const char *, const char *)) dlsym(RTLD_NEXT, "fopen64");
    return real(path, mode);
}
"""
# The directory eval exports each artifact into (commands/evaluate_engine.run_engine).
EXPORT_DIR_MARK = "dspark-eval-engine-"
SPECULATIVE = "llama-speculative-simple"


@pytest.fixture(scope="module")
def crash_library(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("crash")
    source = root / "crash_on_open.c"
    source.write_text(CRASH_ON_OPEN)
    library = root / "crash_on_open.so"
    cc = os.environ.get("CC") or "cc"
    subprocess.run([cc, "-O1", "-shared", "-fPIC", "-o", str(library), str(source), "-ldl"],
                   check=True, capture_output=True, timeout=60)
    return library


@pytest.fixture(scope="module")
def target_gguf(tmp_path_factory) -> Path:
    return engine().convert(GOLDEN_TARGET, tmp_path_factory.mktemp("target") / "target.gguf")


def _eval(artifact: Path, bin_dir: Path, target: Path, out: Path, env: dict | None = None):
    prompts = out.parent / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "hello", "prompt": "hello world"}) + "\n")
    return run_process("eval", str(artifact), "--target", str(GOLDEN_TARGET), "--prompts",
                       str(prompts), "--max-new-tokens", "8", "--device", "cpu",
                       "--engine", f"llama.cpp={bin_dir}", "--target-gguf", str(target),
                       "-o", str(out), env=env, timeout=600)


def _assert_crash_named(line: str, *, artifact: str) -> None:
    """One line that names the signal, the run, the command line and the engine's log."""
    assert "\n" not in line.strip(), line
    assert "SIGSEGV" in line, line
    assert SPECULATIVE in line and artifact in line and "hello" in line, line
    assert re.search(r"-md \S+\.gguf", line) and "--spec-type draft-dspark" in line, line
    # the last lines of its own log, timestamped as llama.cpp writes them
    assert re.search(r"its last log lines: \d+\.\d+\.\d+\.\d+ [A-Z] ", line), line


@pytest.mark.slow   # a real eval with llama.cpp (~6 s with the target's conversion)
def test_eval_names_an_engine_crash(tmp_path, paired_artifacts, crash_library, target_gguf):
    """A drafter run killed by SIGSEGV: eval refuses (112) in one line naming the signal,
    the artifact, the prompt, the command line and the engine's last log lines, and
    writes no report."""
    artifact = paired_artifacts["vanilla_conf_markov"]
    out = tmp_path / "report"
    proc = _eval(artifact, engine().bin, target_gguf, out,
                 env={"LD_PRELOAD": str(crash_library),
                      "DSPARK_TEST_CRASH_ON_OPEN": EXPORT_DIR_MARK})
    assert proc.returncode == EngineRunError.exit_code, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    _assert_crash_named(proc.stderr, artifact=artifact.name)
    assert not out.exists()


def _gate_policy(tmp_path: Path, bin_dir: Path, target: Path) -> Path:
    from test_gate import _entry, _policy

    policy = _policy(tmp_path, _entry("vanilla_conf_markov", require=["llama.cpp"],
                                      target_gguf=str(target)))
    # the packaged prompt set (text prompts llama.cpp takes), as test_gate's llama.cpp test
    policy.write_text(policy.read_text().replace(
        'prompts = "prompts.jsonl"\nmax_new_tokens = 8\n',
        f'max_new_tokens = 8\nllama_cpp = "{bin_dir}"\n'))
    return policy


@pytest.mark.slow   # a whole gate (~30 s on 2 cores)
def test_the_gate_fails_its_llama_cpp_stage_naming_the_crash(tmp_path, crash_library,
                                                             target_gguf):
    from dspark_convert.commands.gate_report import GateReport

    policy = _gate_policy(tmp_path, engine().bin, target_gguf)
    out = tmp_path / "out"
    proc = run_process("gate", str(policy), "-o", str(out), timeout=900,
                       env={"LD_PRELOAD": str(crash_library),
                            "DSPARK_TEST_CRASH_ON_OPEN": EXPORT_DIR_MARK,
                            "OMP_NUM_THREADS": "1"})
    assert proc.returncode != 0, proc.stdout + proc.stderr
    report = GateReport.model_validate_json((out / "gate.json").read_text())
    stage = report.entry("vanilla_conf_markov").stage("llama.cpp")
    assert stage.status == "failed", stage
    assert "SIGSEGV" in stage.detail and SPECULATIVE in stage.detail, stage.detail


# --- the AMX crash itself: a CPU with AMX and a native build --------------------------------

# AMX on every processor of the machine (/proc/cpuinfo), as tools/llama_cpp.py reads it.
HAS_AMX = build.cpu_has_amx()
needs_amx = pytest.mark.skipif(
    not HAS_AMX, reason="this CPU has no AMX (amx_tile and amx_int8 not in /proc/cpuinfo): only "
                        "there does a native llama.cpp build repack Q8_0 weights into AMX "
                        "buffers, the path that crashes")


@pytest.fixture(scope="module")
def native_bin() -> Path:
    done = subprocess.run([sys.executable, str(build.__file__), "build", "--native"],
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout + done.stderr
    found = subprocess.run([sys.executable, str(build.__file__), "path", "--native"],
                           capture_output=True, text=True, timeout=60)
    assert found.returncode == 0, found.stderr
    return Path(found.stdout.strip())


@pytest.fixture(scope="module")
def q8_artifact(tmp_path_factory, paired_artifacts) -> Path:
    out = tmp_path_factory.mktemp("q8") / "vanilla_conf_markov-q8_0"
    done = run_process("quantize", str(paired_artifacts["vanilla_conf_markov"]), "-o", str(out),
                       "--type", "q8_0")
    assert done.returncode == 0, done.stderr
    return out


@pytest.mark.slow
@needs_amx
def test_a_native_build_on_amx_crashes_on_a_q8_0_drafter_and_eval_names_the_cause(
        tmp_path, native_bin, q8_artifact, target_gguf):
    out = tmp_path / "report"
    proc = _eval(q8_artifact, native_bin, target_gguf, out)
    assert proc.returncode == EngineRunError.exit_code, proc.stdout + proc.stderr
    _assert_crash_named(proc.stderr, artifact=q8_artifact.name)
    assert "AMX" in proc.stderr and "--no-repack" in proc.stderr, proc.stderr
    # the portable build the suite runs takes no AMX path: the same drafter runs there
    ok = _eval(q8_artifact, engine().bin, target_gguf, tmp_path / "portable")
    assert ok.returncode == 0, ok.stdout + ok.stderr


@pytest.mark.slow
@needs_amx
def test_a_native_build_on_amx_fails_the_gate_naming_the_crash(tmp_path, native_bin,
                                                               target_gguf):
    from dspark_convert.commands.gate_report import GateReport

    policy = _gate_policy(tmp_path, native_bin, target_gguf)     # quantize = ["q8_0"]
    out = tmp_path / "out"
    proc = run_process("gate", str(policy), "-o", str(out), timeout=900,
                       env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode != 0, proc.stdout + proc.stderr
    report = GateReport.model_validate_json((out / "gate.json").read_text())
    detail = report.entry("vanilla_conf_markov").stage("llama.cpp").detail
    assert "SIGSEGV" in detail and "AMX" in detail and "--no-repack" in detail, detail

