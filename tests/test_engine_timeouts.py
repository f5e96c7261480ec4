"""Every engine run ends within its time, whatever the processes it starts do
(evaluation/engine_process.py): an engine that exits and leaves a child holding its output,
or one that never exits, is stopped with every process it started, and named in one line.

The engines here are programs of the tests standing where llama.cpp's binaries and
dspark-mlx's interpreter stand (``--engine llama.cpp=DIR``, ``--engine dspark-mlx=PYTHON``):
real processes, each starting a real ``sleep`` that would hold the pipe for 1000 s; the
tests assert the run's end, its one line, and that the sleep is gone.
"""

from __future__ import annotations

import os
import signal
import stat
import sys
import time
from pathlib import Path

import pytest

from support.cli import assert_refused, run_process
from support.llama_cpp import write_target_gguf
from support.paths import GOLDEN_TARGET

from dspark_convert.errors import EngineRunError, MlxInstallError, MlxRunError
from dspark_convert.evaluation import engine_dspark_mlx as M
from dspark_convert.evaluation import engine_llama_cpp as L
from dspark_convert.evaluation.engine_process import GRACE_SECONDS

DSPARK = "vanilla_conf_markov"
# A run's end past its deadline or its exit: the grace for the pipes' last bytes, and slack
# for a loaded 2-core machine.
MARGIN = GRACE_SECONDS + 5.0

# Where llama.cpp's binaries stand: start a sleep holding HOLD (stdout, stderr or both; in
# a session of its own with "escape"), record its pid, then exit 0 or (mode "hang") sleep too.
FAKE_LLAMA = r"""#!{python}
import subprocess, sys, time
hold, mode = {hold!r}, {mode!r}
sys.stderr.write("0.00.000.100 I llama_completion: llama backend init\n")
sys.stderr.flush()
child = subprocess.Popen(["sleep", "1000"], stdin=subprocess.DEVNULL,
                         stdout=None if "stdout" in hold else subprocess.DEVNULL,
                         stderr=None if "stderr" in hold else subprocess.DEVNULL,
                         start_new_session="escape" in hold)
with open({pids!r}, "a") as fh:
    fh.write(f"{{child.pid}}\n")
if mode == "hang":
    time.sleep(1000)
"""

# Where dspark-mlx's interpreter stands (called as PYTHON -I -B SCRIPT REQUEST FD): the
# probe's records as the runner writes them; for a run, its records whole (the host
# refusing the target), then a sleep holding HOLD (the records fd, stdout or both) and an
# exit 0, or (mode "hang") a sleep of its own.
FAKE_MLX = r"""#!{python}
import json, os, subprocess, sys, time
hold, mode = {hold!r}, {mode!r}
request = json.load(open(sys.argv[4]))
fd = int(sys.argv[5])
def put(kind, **fields):
    os.write(fd, (json.dumps({{"kind": kind, **fields}}) + "\n").encode())
put("engine", dspark_mlx={dspark_mlx!r}, mlx={mlx!r}, mlx_lm="0", mlx_vlm="0", python="3",
    device="cpu", backbones={{}})
if request["mode"] != "probe":
    put("refused", stage="host", error="ValueError", message="no model", where="x.py:1 f")
put("end")
if request["mode"] != "probe":
    child = subprocess.Popen(["sleep", "1000"], stdin=subprocess.DEVNULL,
                             stdout=None if "stdout" in hold else subprocess.DEVNULL,
                             pass_fds=(fd,) if "records" in hold else ())
    with open({pids!r}, "a") as fh:
        fh.write(f"{{child.pid}}\n")
    if mode == "hang":
        time.sleep(1000)
"""


def _executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _llama(tmp_path: Path, hold: str, mode: str = "exit") -> tuple[Path, Path]:
    d, pids = tmp_path / "bin", tmp_path / "pids.txt"
    d.mkdir()
    for name in L.BINARIES:
        _executable(d / name, FAKE_LLAMA.format(python=sys.executable, hold=hold, mode=mode,
                                                pids=str(pids)))
    return d, pids


def _mlx(tmp_path: Path, hold: str, mode: str = "exit") -> tuple[Path, Path]:
    pids = tmp_path / "pids.txt"
    return _executable(tmp_path / "python", FAKE_MLX.format(
        python=sys.executable, hold=hold, mode=mode, pids=str(pids), dspark_mlx=M.DSPARK_MLX,
        mlx=M.MLX)), pids


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie has ended: it is only not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _eval(tmp_path: Path, artifact: Path, *engine: str):
    """`dspark eval` of ``artifact`` on one prompt with ``engine``'s options, in a child
    process: (the result, its seconds)."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "p1", "prompt_ids": [1, 17, 33, 90]}\n')
    t0 = time.monotonic()
    proc = run_process("eval", str(artifact), "--target", str(GOLDEN_TARGET), "--prompts",
                       str(prompts), "--max-new-tokens", "4", "--threshold", "0", *engine, "-o",
                       str(tmp_path / "report"), timeout=300)
    return proc, time.monotonic() - t0


def assert_none_left(pids: Path) -> None:
    started = [int(p) for p in pids.read_text().split()]
    assert started, "the engine started no child: the test proves nothing"
    deadline = time.monotonic() + 5
    while any(map(_alive, started)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(map(_alive, started)), f"left running: {[p for p in started if _alive(p)]}"


# --- llama.cpp's runs --------------------------------------------------------------------------

@pytest.mark.parametrize("hold", ["stdout", "stderr", "stdout stderr"])
def test_a_llama_cpp_binary_that_exits_leaving_a_child_on_its_pipe_is_112(tmp_path, hold):
    bins, pids = _llama(tmp_path, hold)
    vocab = L.Vocabulary((b"a",), (b"a",))
    t0 = time.monotonic()
    with pytest.raises(EngineRunError) as exc:
        L.run_target(L.find_binaries(bins), tmp_path / "t.gguf", "hello", vocab=vocab,
                     max_new_tokens=8, what="the target alone, prompt p1", timeout=60)
    assert time.monotonic() - t0 < MARGIN
    m = exc.value.message
    assert exc.value.exit_code == 112 and "\n" not in m
    assert m.startswith("llama-completion (the target alone, prompt p1): exited 0, but a "
                        "process it started still held its output open"), m
    assert "stopped with every process it started" in m and "llama backend init" in m
    assert pids.read_text().count("\n") == 1          # never run again
    assert_none_left(pids)


def test_a_child_that_escaped_the_engines_session_cannot_hold_the_run(tmp_path):
    """A child in a session of its own is out of the kill's reach, not of the run's end:
    the reads give up once the engine has exited and the grace has passed."""
    bins, pids = _llama(tmp_path, "stdout stderr escape")
    vocab = L.Vocabulary((b"a",), (b"a",))
    t0 = time.monotonic()
    try:
        with pytest.raises(EngineRunError, match="still held its output open"):
            L.run_target(L.find_binaries(bins), tmp_path / "t.gguf", "hello", vocab=vocab,
                         max_new_tokens=8, timeout=60)
        assert time.monotonic() - t0 < MARGIN
    finally:
        for pid in map(int, pids.read_text().split()):
            os.kill(pid, signal.SIGKILL)          # the escaped child: the test's to end


def test_a_llama_cpp_binary_that_never_exits_is_stopped_at_its_deadline(tmp_path):
    bins, pids = _llama(tmp_path, "stdout stderr", mode="hang")
    vocab = L.Vocabulary((b"a",), (b"a",))
    t0 = time.monotonic()
    with pytest.raises(EngineRunError, match=r"still running after 1 s; stopped with every "
                       r"process it started") as exc:
        L.run_target(L.find_binaries(bins), tmp_path / "t.gguf", "hello", vocab=vocab,
                     max_new_tokens=8, timeout=1)
    assert time.monotonic() - t0 < 1 + MARGIN
    assert exc.value.found == "timeout"
    assert_none_left(pids)


def test_eval_with_a_llama_cpp_that_leaves_a_child_ends_with_112(tmp_path, paired_artifacts):
    """The whole command, as a user runs it: one line, exit 112, nothing written, no
    process left (the child held llama-completion's stdout and stderr for 1000 s)."""
    bins, pids = _llama(tmp_path, "stdout stderr")
    gguf = write_target_gguf(tmp_path / "target.gguf")
    proc, seconds = _eval(tmp_path, paired_artifacts[DSPARK], "--engine", f"llama.cpp={bins}",
                          "--target-gguf", str(gguf))
    assert_refused(proc, EngineRunError, ["exited 0, but a process it started still held its "
                                          "output open"])
    assert not (tmp_path / "report").exists()
    assert_none_left(pids)
    # One run of llama-completion, stopped GRACE_SECONDS after its exit: the rest is the
    # eval's own work (the reference runtime on one prompt).
    assert seconds < 60, seconds


# --- dspark-mlx's runs ---------------------------------------------------------------------------

@pytest.mark.parametrize("hold", ["records", "stdout", "records stdout"])
def test_a_dspark_mlx_run_that_exits_leaving_a_child_on_its_pipe_is_115(tmp_path, hold):
    python, pids = _mlx(tmp_path, hold)
    assert M.probe(python).dspark_mlx == M.DSPARK_MLX       # the probe itself leaves none
    t0 = time.monotonic()
    with pytest.raises(MlxRunError) as exc:
        M.run_target(python, tmp_path, tmp_path / "config.json", [[1, 2]], vocab_size=10,
                     max_new_tokens=2, timeout=60)
    assert time.monotonic() - t0 < MARGIN
    m = exc.value.message
    assert exc.value.exit_code == 115 and "\n" not in m
    assert m.startswith("dspark-mlx (the target alone): exited 0, but a process it started "
                        "still held its records or its output open"), m
    assert_none_left(pids)


def test_a_dspark_mlx_run_that_never_exits_is_stopped_at_its_deadline(tmp_path):
    python, pids = _mlx(tmp_path, "records stdout", mode="hang")
    t0 = time.monotonic()
    with pytest.raises(MlxRunError, match=r"still running after 1 s; stopped with every "
                       r"process it started"):
        M.run_target(python, tmp_path, tmp_path / "config.json", [[1, 2]], vocab_size=10,
                     max_new_tokens=2, timeout=1)
    assert time.monotonic() - t0 < 1 + MARGIN
    assert_none_left(pids)


def test_a_probe_that_never_ends_is_not_dspark_mlx_114(tmp_path):
    """The probe (the interpreter checked before anything runs) holds to its time too."""
    python = _executable(tmp_path / "python", f"#!{sys.executable}\nimport time\n"
                         "time.sleep(1000)\n")
    t0 = time.monotonic()
    with pytest.raises(MlxInstallError, match=r"not dspark-mlx's interpreter \(dspark-mlx "
                       r"\(probe\): still running after 1 s"):
        M.probe(python, timeout=1)
    assert time.monotonic() - t0 < 1 + MARGIN


def test_eval_with_a_dspark_mlx_that_leaves_a_child_ends_with_115(tmp_path, paired_artifacts):
    """`dspark eval --engine dspark-mlx=PYTHON` with an interpreter that writes its records,
    exits 0 and leaves a child holding the records pipe and stdout: one line, exit 115,
    nothing written, no process left."""
    python, pids = _mlx(tmp_path, "records stdout")
    proc, seconds = _eval(tmp_path, paired_artifacts[DSPARK], "--engine", f"dspark-mlx={python}")
    assert_refused(proc, MlxRunError, ["dspark-mlx (the target alone): exited 0, but a "
                                       "process it started still held"])
    assert not (tmp_path / "report").exists()
    assert_none_left(pids)
    assert seconds < 60, seconds
