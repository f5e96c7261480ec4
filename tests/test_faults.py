"""Faults while writing an artifact: a full disk, a file-size limit, a kill during --force.

Every run is a real `dspark convert` subprocess. The rule: exit 31 (OutputWriteError) with
one `error:` line and no traceback, or the signal's code; no output directory, no hidden
temporary sibling, no parent directory it created; with --force the old artifact is left
byte for byte as it was. (Interruption by SIGINT/SIGTERM/SIGKILL without --force, an
unwritable parent and an existing output are in test_atomic_output.py and
test_cli_refusals.py.)

Two ways to fill a disk without privileges on the host: RLIMIT_FSIZE (the kernel refuses
to grow a file past the limit: EFBIG, with SIGXFSZ ignored), always available; and a real
tiny tmpfs in a private user + mount namespace (`unshare -rm`: ENOSPC), skipped where the
kernel does not allow unprivileged user namespaces.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import REFERENCE_DRAFTER, dspark_cmd
from test_atomic_output import (
    APPEAR_TIMEOUT_S,
    POLL_S,
    assert_one_error_line,
    assert_valid,
    big_source,  # noqa: F401  (a fixture: the ~130 MB checkpoint that takes a while to write)
    temp_siblings,
)

from dspark_convert.errors import OutputWriteError

PAGE = 4096


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def convert_with_file_size_limit(source: Path, out: Path, limit: int, *extra: str):
    def limit_file_size():
        # Ignored SIGXFSZ: the write fails with EFBIG instead of the process being killed.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run(dspark_cmd("convert", str(source), "-o", str(out), "-q", *extra),
                          capture_output=True, text=True, timeout=120, preexec_fn=limit_file_size)


@pytest.fixture(scope="module")
def good_artifact(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("good") / "art"
    proc = subprocess.run(dspark_cmd("convert", str(REFERENCE_DRAFTER), "-o", str(out), "-q"),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return out


# --- a file-size limit (EFBIG) ----------------------------------------------------------------

@pytest.mark.parametrize("limit", [0, 1000, 50_000, 150_000],
                         ids=["nothing", "in-metadata", "in-tensors", "near-the-end"])
def test_file_size_limit_leaves_nothing(tmp_path: Path, good_artifact: Path, limit: int) -> None:
    assert (good_artifact / "drafter.gguf").stat().st_size > limit
    out = tmp_path / "a" / "b" / "art"
    proc = convert_with_file_size_limit(REFERENCE_DRAFTER, out, limit)
    assert_one_error_line(proc, OutputWriteError.exit_code, "cannot write the output",
                          "File too large")
    assert not out.exists()
    assert os.listdir(tmp_path) == [], "a created parent or temporary sibling was left"


def test_file_size_limit_with_force_keeps_the_old_artifact(tmp_path: Path,
                                                           good_artifact: Path) -> None:
    out = tmp_path / "art"
    shutil.copytree(good_artifact, out)
    before = _snapshot(out)
    proc = convert_with_file_size_limit(REFERENCE_DRAFTER, out, 50_000, "--force")
    assert_one_error_line(proc, OutputWriteError.exit_code, "File too large")
    assert _snapshot(out) == before
    assert os.listdir(tmp_path) == ["art"]
    assert_valid(out)


# --- a real full disk (ENOSPC), in a private mount namespace -----------------------------------

def _unshare_tmpfs_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    script = 'd=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs "$d" && umount "$d" && rmdir "$d"'
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, timeout=30)
    return probe.returncode == 0


needs_tmpfs = pytest.mark.skipif(not _unshare_tmpfs_works(), reason=(
    "needs `unshare -rm` and a tmpfs mount in a user namespace (unprivileged user "
    "namespaces are disabled on this machine)"))


def convert_on_tiny_disk(mountpoint: Path, size: int, *extra: str) -> tuple[int, str, list[str]]:
    """Convert the reference drafter onto a fresh tmpfs of ``size`` bytes mounted at
    ``mountpoint`` (seen only by this process tree). Returns the exit code, stderr, and
    what the tmpfs held afterwards (it vanishes with the namespace)."""
    mountpoint.mkdir()
    script = ('mount -t tmpfs -o size="$1" tmpfs "$2" || exit 99; shift 2; '
              '"$@"; rc=$?; echo "LISTING:$(ls -A "$0")"; exit $rc')
    cmd = dspark_cmd("convert", str(REFERENCE_DRAFTER), "-o", str(mountpoint / "art"), "-q", *extra)
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", script, str(mountpoint), str(size),
                           str(mountpoint), *cmd], capture_output=True, text=True, timeout=120)
    listing = [line for line in proc.stdout.splitlines() if line.startswith("LISTING:")]
    assert proc.returncode != 99 and len(listing) == 1, proc.stdout + proc.stderr
    return proc.returncode, proc.stderr, listing[0][len("LISTING:"):].split()


@needs_tmpfs
def test_disk_full_writing_the_gguf(tmp_path: Path, good_artifact: Path) -> None:
    size = (good_artifact / "drafter.gguf").stat().st_size // 2 // PAGE * PAGE
    code, stderr, left = convert_on_tiny_disk(tmp_path / "disk", size)
    assert_one_error_line((code, stderr), OutputWriteError.exit_code, "drafter.gguf",
                          "No space left on device", "(disk full)")
    assert left == []


@needs_tmpfs
def test_disk_full_writing_the_manifest(tmp_path: Path, good_artifact: Path) -> None:
    """drafter.gguf fits, manifest.json does not: still nothing left behind."""
    gguf_pages = -(-(good_artifact / "drafter.gguf").stat().st_size // PAGE)
    assert (good_artifact / "manifest.json").stat().st_size > PAGE
    code, stderr, left = convert_on_tiny_disk(tmp_path / "disk", (gguf_pages + 1) * PAGE)
    assert_one_error_line((code, stderr), OutputWriteError.exit_code, "manifest.json",
                          "No space left on device", "(disk full)")
    assert left == []


@needs_tmpfs
def test_disk_with_room_converts(tmp_path: Path, good_artifact: Path) -> None:
    """The same tiny disk with room for both files: the failures above are the disk's."""
    code, stderr, left = convert_on_tiny_disk(tmp_path / "disk", 1024 * 1024)
    assert code == 0, stderr
    assert left == ["art"]


# --- SIGKILL during --force ---------------------------------------------------------------------

def poll_until(condition, timeout: float = APPEAR_TIMEOUT_S) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(POLL_S)
    return False


def test_sigkill_during_force_keeps_the_old_artifact(big_source: Path, tmp_path: Path,  # noqa: F811
                                                     good_artifact: Path) -> None:
    """A kill cannot be caught: while the new artifact is written the old one stays whole
    under its name; the next run removes the dead run's temporary sibling."""
    out = tmp_path / "art"
    shutil.copytree(good_artifact, out)
    before = _snapshot(out)
    proc = subprocess.Popen(dspark_cmd("convert", str(big_source), "-o", str(out), "-q", "--force"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Kill it while it writes: once its hidden temporary sibling exists.
    writing = poll_until(lambda: bool(temp_siblings(out)) or proc.poll() is not None)
    if not writing or proc.poll() is not None:
        proc.kill()
        pytest.fail("the conversion ended or stalled before it could be killed")
    proc.kill()
    proc.communicate(timeout=60)
    assert _snapshot(out) == before
    assert temp_siblings(out) != []          # the dead run's hidden sibling, never `art`

    again = subprocess.run(dspark_cmd("validate", str(out), "--strict", "--json"),
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["exit_code"] == 0

    rerun = subprocess.run(dspark_cmd("convert", str(REFERENCE_DRAFTER), "-o", str(out), "-q",
                                      "--force"), capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    assert temp_siblings(out) == [] and os.listdir(tmp_path) == ["art"]
    assert _snapshot(out) == before          # the same source gives the same bytes
