"""The output directory is all or nothing (docs/ARTIFACT_FORMAT.md, "Directory").

Signals need a real `dspark convert` process: a ~130 MB synthetic checkpoint (the two
Markov matrices, V=65536 x r=512 in BF16) keeps the hidden temporary sibling on disk long
enough to be seen and the process to be signalled while it writes drafter.gguf. The other
cases run the app in-process (tests/support/cli.py); reproducibility compares a conversion
in a real process with one in this one (a hash-seed-dependent order would differ).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from dspark_convert.util.atomic import TMP_MARK
from support.cli import (
    DSPARK,
    assert_one_error_line,
    assert_valid,
    run_cli,
    run_process,
    temp_siblings,
)
from dspark_convert.errors import (
    NonFiniteTensorError,
    OutputWriteError,
    UnsupportedFeatureError,
)
from dspark_convert.synthetic import (
    make_synthetic_checkpoint,
    synthetic_config,
    synthetic_tensors,
    write_checkpoint,
)

EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143
POLL_S = 0.002
APPEAR_TIMEOUT_S = 60.0


def _default_sigint() -> None:
    # A child inherits an ignored SIGINT (e.g. from a background job); Python installs its
    # KeyboardInterrupt handler only when SIGINT is not ignored.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_and_signal(src: Path, out: Path, sig: int) -> tuple[subprocess.Popen, list[str]]:
    """Start a conversion, wait until its hidden temporary sibling exists, send ``sig``.
    Returns the process (not yet waited for) and the sibling names seen."""
    proc = subprocess.Popen([str(DSPARK), "convert", str(src), "-o", str(out), "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_sigint)
    deadline = time.monotonic() + APPEAR_TIMEOUT_S
    seen: list[str] = []
    try:
        while time.monotonic() < deadline:
            seen = temp_siblings(out)
            if seen:
                break
            if proc.poll() is not None:
                break
            time.sleep(POLL_S)
        if not seen:
            pytest.fail("the conversion finished (or stalled) before its temporary directory was "
                        f"observed (exit {proc.poll()}); make the checkpoint bigger")
        if proc.poll() is not None:
            pytest.fail(f"the conversion exited ({proc.returncode}) before it could be signalled; "
                        "make the checkpoint bigger")
        proc.send_signal(sig)
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    return proc, seen


# --- fixtures -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_source(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("small") / "src"
    make_synthetic_checkpoint(src)
    return src


@pytest.fixture(scope="module")
def overflow_source(tmp_path_factory) -> Path:
    """Fails only while writing (an F32 value that rounds to BF16 infinity), i.e. after the
    output's parents and temporary directory were created."""
    src = tmp_path_factory.mktemp("overflow") / "src"
    config = synthetic_config(dtype="F32")
    tensors = synthetic_tensors(config)
    tensors["layers.1.mlp.up_proj.weight"].reshape(-1)[7] = np.float32(3.4e38)
    write_checkpoint(src, config, tensors, dtype="F32")
    return src


# --- signals --------------------------------------------------------------------------------

@pytest.mark.slow   # SIGTERM and SIGINT are the fast loop's canaries; this converts 130 MB twice
def test_sigkill_mid_write_leaves_no_output(big_source: Path, tmp_path: Path) -> None:
    out = tmp_path / "art"
    proc, seen = start_and_signal(big_source, out, signal.SIGKILL)
    proc.communicate(timeout=60)      # reap it: a zombie's pid still looks alive
    assert proc.returncode == -signal.SIGKILL
    assert not out.exists()
    # A SIGKILL cannot be caught: its hidden temporary sibling may stay, never under OUT's name.
    stale = temp_siblings(out)
    assert stale == seen
    assert all(name.startswith(f".art{TMP_MARK}{proc.pid}-") for name in stale)

    # The next run writing the same output removes the stale sibling and succeeds.
    again = run_cli("convert", str(big_source), "-o", str(out), "-q")
    assert again.returncode == 0, again.stderr
    assert temp_siblings(out) == []
    assert os.listdir(tmp_path) == ["art"]
    assert_valid(out)


@pytest.mark.parametrize(("sig", "code", "word"), [
    (signal.SIGTERM, EXIT_TERMINATED, "terminated"),
    (signal.SIGINT, EXIT_INTERRUPTED, "interrupted"),
], ids=["SIGTERM", "SIGINT"])
def test_caught_signal_mid_write_cleans_up(big_source: Path, tmp_path: Path, sig: int, code: int,
                                           word: str) -> None:
    out = tmp_path / "art"
    proc, _seen = start_and_signal(big_source, out, sig)
    _stdout, stderr = proc.communicate(timeout=60)
    assert_one_error_line((proc.returncode, stderr), code, word)
    assert not out.exists()
    assert temp_siblings(out) == []
    assert os.listdir(tmp_path) == []


def test_sigterm_with_force_keeps_the_old_output(big_source: Path, tmp_path: Path) -> None:
    out = tmp_path / "art"
    out.mkdir()
    (out / "precious.txt").write_text("old artifact\n")
    proc = subprocess.Popen([str(DSPARK), "convert", str(big_source), "-o", str(out), "-q", "--force"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + APPEAR_TIMEOUT_S
    while not temp_siblings(out) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(POLL_S)
    if proc.poll() is not None:
        pytest.fail("the conversion exited before it could be signalled; make the checkpoint bigger")
    proc.send_signal(signal.SIGTERM)
    _stdout, stderr = proc.communicate(timeout=60)
    assert_one_error_line((proc.returncode, stderr), EXIT_TERMINATED, "terminated")
    assert os.listdir(out) == ["precious.txt"]
    assert os.listdir(tmp_path) == ["art"]


# --- unwritable locations -------------------------------------------------------------------

def test_unwritable_parent(small_source: Path, tmp_path: Path) -> None:
    if os.geteuid() == 0:
        # chmod does not stop root; /proc accepts no new directory from anyone.
        out = Path("/proc") / f"dspark-test-{os.getpid()}-art"
        proc = run_cli("convert", str(small_source), "-o", str(out), "-q")
        assert_one_error_line(proc, OutputWriteError.exit_code, "/proc", "cannot write the output")
        assert not out.exists()
        assert temp_siblings(out) == []
        return
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        out = parent / "art"
        proc = run_cli("convert", str(small_source), "-o", str(out), "-q")
        assert_one_error_line(proc, OutputWriteError.exit_code, str(parent), "cannot write the output")
        assert os.listdir(parent) == []
    finally:
        parent.chmod(0o755)


def test_unwritable_missing_parent_under_proc(small_source: Path) -> None:
    """A missing parent that cannot be created: refused, nothing created (root or not)."""
    top = Path("/proc") / f"dspark-test-{os.getpid()}"
    out = top / "a" / "art"
    proc = run_cli("convert", str(small_source), "-o", str(out), "-q")
    assert_one_error_line(proc, OutputWriteError.exit_code, str(top))
    assert not top.exists()


def test_parent_is_a_file(small_source: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory\n")
    out = blocker / "sub" / "art"
    proc = run_cli("convert", str(small_source), "-o", str(out), "-q")
    assert_one_error_line(proc, OutputWriteError.exit_code, str(blocker), "not a directory")
    assert sorted(os.listdir(tmp_path)) == ["file"]
    assert blocker.read_text() == "not a directory\n"


# --- missing parents ------------------------------------------------------------------------

def test_missing_parents_are_created_on_success(small_source: Path, tmp_path: Path) -> None:
    out = tmp_path / "x" / "y" / "z" / "art"
    proc = run_cli("convert", str(small_source), "-o", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    assert_valid(out)
    assert os.listdir(tmp_path / "x" / "y" / "z") == ["art"]


def test_missing_parents_are_removed_when_writing_fails(overflow_source: Path, tmp_path: Path) -> None:
    out = tmp_path / "a" / "b" / "c"
    proc = run_cli("convert", str(overflow_source), "-o", str(out), "-q")
    assert_one_error_line(proc, NonFiniteTensorError.exit_code, "layers.1.mlp.up_proj.weight")
    assert os.listdir(tmp_path) == []


def test_only_the_parents_it_created_are_removed(overflow_source: Path, tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "mine.txt").write_text("x\n")
    (tmp_path / "a" / "empty").mkdir()
    out = tmp_path / "a" / "empty" / "b" / "c"
    proc = run_cli("convert", str(overflow_source), "-o", str(out), "-q")
    assert_one_error_line(proc, NonFiniteTensorError.exit_code)
    assert sorted(os.listdir(tmp_path / "a")) == ["empty", "mine.txt"]
    assert os.listdir(tmp_path / "a" / "empty") == []


def test_missing_parents_are_not_created_for_a_contract_refusal(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_synthetic_checkpoint(src, hidden_size=32)
    cfg = (src / "config.json").read_text().replace('"attention_bias": false', '"attention_bias": true')
    (src / "config.json").write_text(cfg)
    out = tmp_path / "a" / "b" / "c"
    proc = run_cli("convert", str(src), "-o", str(out), "-q")
    assert_one_error_line(proc, UnsupportedFeatureError.exit_code, "attention_bias")
    assert os.listdir(tmp_path) == ["src"]


# --- reproducibility ------------------------------------------------------------------------

@pytest.mark.parametrize(("dtype", "shards"), [("BF16", 1), pytest.param("F32", 2, marks=pytest.mark.slow)],
                         ids=["bf16", "f32-sharded"])
def test_converting_twice_is_byte_identical(tmp_path: Path, dtype: str, shards: int) -> None:
    src = tmp_path / "src"
    make_synthetic_checkpoint(src, dtype=dtype, shards=shards, markov_head_type="gated")
    first, second = tmp_path / "one" / "art", tmp_path / "two" / "art"
    for out, run in ((first, run_process), (second, run_cli)):
        proc = run("convert", str(src), "-o", str(out), "-q")
        assert proc.returncode == 0, proc.stderr
    for name in ("drafter.gguf", "manifest.json"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    # --force over an existing artifact writes the same bytes again
    proc = run_cli("convert", str(src), "-o", str(first), "-q", "--force")
    assert proc.returncode == 0, proc.stderr
    for name in ("drafter.gguf", "manifest.json"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    assert_valid(first)

