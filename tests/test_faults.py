"""Faults while writing an artifact: a full disk, a file-size limit, a kill during --force.

A fault or a signal needs a real `dspark convert` process (a resource limit, a namespace, a
process to kill or stop); the rest runs the app in-process (tests/support/cli.py). The
rule: exit 31 (OutputWriteError) with one `error:` line and no traceback, or the signal's
code; no output directory, no hidden temporary sibling, no parent directory it created;
with --force the old artifact is left byte for byte as it was. The fast loop keeps a
file-size limit (with and without --force) and a full disk; the other cases are marked slow
(the signals' fast canaries are in test_atomic_output.py). (Interruption by SIGINT/SIGTERM/SIGKILL without --force, an
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
from support.cli import assert_one_error_line, assert_valid, run_cli, temp_siblings
from support.paths import GOLDEN_TARGET

from dspark_convert.errors import OutputExistsError, OutputWriteError, SourceLayoutError
from dspark_convert.util.atomic import TMP_MARK

PAGE = 4096
POLL_S = 0.002
APPEAR_TIMEOUT_S = 60.0


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


slow = pytest.mark.slow


@pytest.fixture(scope="module")
def good_artifact(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("good") / "art"
    proc = run_cli("convert", str(REFERENCE_DRAFTER), "-o", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    return out


# --- a file-size limit (EFBIG) ----------------------------------------------------------------

@pytest.mark.parametrize("limit", [pytest.param(0, marks=slow), pytest.param(1000, marks=slow),
                                   50_000, pytest.param(150_000, marks=slow)],
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


def on_tiny_disk(mountpoint: Path, size: int, *args: str) -> tuple[int, str, list[str]]:
    """``dspark ARGS...`` with a fresh tmpfs of ``size`` bytes mounted at ``mountpoint``
    (seen only by this process tree). Returns the exit code, stderr, and what the tmpfs
    held afterwards, hidden entries included, on one line (it vanishes with the namespace)."""
    mountpoint.mkdir()
    script = ('mount -t tmpfs -o size="$1" tmpfs "$2" || exit 99; shift 2; '
              '"$@"; rc=$?; echo "LISTING:$(ls -A "$0" | tr "\\n" " ")"; exit $rc')
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", script, str(mountpoint), str(size),
                           str(mountpoint), *dspark_cmd(*args)], capture_output=True, text=True,
                          timeout=300)
    listing = [line for line in proc.stdout.splitlines() if line.startswith("LISTING:")]
    assert proc.returncode != 99 and len(listing) == 1, proc.stdout + proc.stderr
    return proc.returncode, proc.stderr, listing[0][len("LISTING:"):].split()


def convert_on_tiny_disk(mountpoint: Path, size: int, *extra: str) -> tuple[int, str, list[str]]:
    """Convert the reference drafter onto a tiny tmpfs at ``mountpoint`` (``on_tiny_disk``)."""
    return on_tiny_disk(mountpoint, size, "convert", str(REFERENCE_DRAFTER), "-o",
                        str(mountpoint / "art"), "-q", *extra)


@needs_tmpfs
def test_disk_full_writing_the_gguf(tmp_path: Path, good_artifact: Path) -> None:
    size = (good_artifact / "drafter.gguf").stat().st_size // 2 // PAGE * PAGE
    code, stderr, left = convert_on_tiny_disk(tmp_path / "disk", size)
    assert_one_error_line((code, stderr), OutputWriteError.exit_code, "drafter.gguf",
                          "No space left on device", "(disk full)")
    assert left == []


@slow
@needs_tmpfs
def test_disk_full_writing_the_manifest(tmp_path: Path, good_artifact: Path) -> None:
    """drafter.gguf fits, manifest.json does not: still nothing left behind."""
    gguf_pages = -(-(good_artifact / "drafter.gguf").stat().st_size // PAGE)
    assert (good_artifact / "manifest.json").stat().st_size > PAGE
    code, stderr, left = convert_on_tiny_disk(tmp_path / "disk", (gguf_pages + 1) * PAGE)
    assert_one_error_line((code, stderr), OutputWriteError.exit_code, "manifest.json",
                          "No space left on device", "(disk full)")
    assert left == []


@slow
@needs_tmpfs
def test_disk_with_room_converts(tmp_path: Path, good_artifact: Path) -> None:
    """The same tiny disk with room for both files: the failures above are the disk's."""
    code, stderr, left = convert_on_tiny_disk(tmp_path / "disk", 1024 * 1024)
    assert code == 0, stderr
    assert left == ["art"]


# --- a full disk under smoke's and eval's reports ---------------------

@pytest.fixture(scope="module")
def paired(paired_artifacts) -> Path:
    return paired_artifacts["vanilla_conf_markov"]


SMOKE = ("--prompt-ids", "1,471", "--max-new-tokens", "2")


@needs_tmpfs
@pytest.mark.parametrize("old_trace", [True, pytest.param(False, marks=slow)],
                         ids=["old-trace", "no-trace"])
def test_disk_full_writing_the_plot_leaves_no_trace(tmp_path: Path, paired: Path,
                                                    old_trace: bool) -> None:
    """--trace on a disk with room, --plot on a full one: smoke exits 31 naming the plot,
    and the trace is not written either (nor an old one replaced): a failed run leaves no
    output, its reports are published together or not at all."""
    trace = tmp_path / "trace.json"
    if old_trace:
        trace.write_text("the old trace\n")
    disk = tmp_path / "disk"
    code, stderr, left = on_tiny_disk(disk, PAGE, "smoke", str(paired), "--target",
                                      str(GOLDEN_TARGET), *SMOKE, "--trace", str(trace),
                                      "--plot", str(disk / "plot.png"))
    line = assert_one_error_line((code, stderr), OutputWriteError.exit_code, str(disk / "plot.png"),
                                 "No space left on device", "(disk full)")
    assert TMP_MARK not in line
    assert left == []
    assert sorted(os.listdir(tmp_path)) == (["disk", "trace.json"] if old_trace else ["disk"])
    if old_trace:
        assert trace.read_text() == "the old trace\n"


@slow
@needs_tmpfs
def test_disk_with_room_writes_both_reports(tmp_path: Path, paired: Path) -> None:
    disk = tmp_path / "disk"
    code, stderr, left = on_tiny_disk(disk, 256 * 1024, "smoke", str(paired), "--target",
                                      str(GOLDEN_TARGET), *SMOKE, "--trace", str(disk / "t.json"),
                                      "--plot", str(disk / "p.png"))
    assert code == 0, stderr
    assert sorted(left) == ["p.png", "t.json"]


@slow
@needs_tmpfs
def test_disk_full_writing_an_eval_report_names_the_report(tmp_path: Path, paired: Path) -> None:
    """report.json fits, the PNGs do not: 31 naming the file inside REPORT_DIR (not the hidden
    temporary it was being built in), and nothing on the disk."""
    prompts = tmp_path / "one.jsonl"
    prompts.write_text('{"id": "a", "prompt_ids": [1, 471]}\n')
    disk = tmp_path / "disk"
    code, stderr, left = on_tiny_disk(disk, 4 * PAGE, "eval", str(paired), "--target",
                                      str(GOLDEN_TARGET), "--prompts", str(prompts),
                                      "--max-new-tokens", "2", "--threshold", "0.5",
                                      "-o", str(disk / "report"))
    line = assert_one_error_line((code, stderr), OutputWriteError.exit_code,
                                 str(disk / "report") + "/", "(disk full)")
    assert TMP_MARK not in line
    assert left == []


def test_write_errors_name_the_output_not_its_temporary(tmp_path: Path) -> None:
    """Whatever path inside a temporary a writer hands to write_error (eval's report files,
    its plots), the message names the output the user asked for."""
    import errno

    from dspark_convert.util.atomic import atomic_directory, write_error

    out = tmp_path / "report"
    with pytest.raises(OutputWriteError) as caught:
        with atomic_directory(out) as tmp:
            raise write_error(OSError(errno.ENOSPC, "No space left on device"), tmp / "a.png")
    assert caught.value.message == f"{out}/a.png: cannot write the output: No space left on device (disk full)"
    with pytest.raises(OutputWriteError) as caught:
        with atomic_directory(out) as tmp:
            open(tmp / "sub" / "x", "wb")        # a raw OSError from inside the block: 31 too
    assert str(out) in caught.value.message and TMP_MARK not in caught.value.message
    assert os.listdir(tmp_path) == []


# --- SIGKILL during --force ---------------------------------------------------------------------

def poll_until(condition, timeout: float = APPEAR_TIMEOUT_S) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(POLL_S)
    return False


@slow
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

    again = run_cli("validate", str(out), "--strict", "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["exit_code"] == 0

    rerun = run_cli("convert", str(REFERENCE_DRAFTER), "-o", str(out), "-q", "--force")
    assert rerun.returncode == 0, rerun.stderr
    assert temp_siblings(out) == [] and os.listdir(tmp_path) == ["art"]
    assert _snapshot(out) == before          # the same source gives the same bytes


# --- another run writing the same output ----------------------------

def _start(src: Path, out: Path, *extra: str) -> subprocess.Popen:
    """A conversion stopped (SIGSTOP) while it writes its temporary: whatever the test does
    next happens "while it converts"; ``_resume`` lets it finish."""
    proc = subprocess.Popen(dspark_cmd("convert", str(src), "-o", str(out), "-q", *extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if not poll_until(lambda: bool(temp_siblings(out)) or proc.poll() is not None) \
            or proc.poll() is not None:
        proc.kill()
        proc.communicate()
        pytest.fail("the conversion ended or stalled before its temporary was seen")
    proc.send_signal(signal.SIGSTOP)
    return proc


def _resume(proc: subprocess.Popen) -> tuple[int, str]:
    proc.send_signal(signal.SIGCONT)
    _stdout, stderr = proc.communicate(timeout=120)
    return proc.returncode, stderr


@slow
def test_output_that_appears_while_converting_is_refused_and_untouched(big_source: Path,
                                                                         tmp_path: Path) -> None:
    """Without --force nothing is ever replaced: not even an output that appears after the
    run's first check (another run, or a user). It is refused at the rename (30)."""
    out = tmp_path / "art"
    proc = _start(big_source, out)
    out.mkdir()
    (out / "theirs.txt").write_text("someone else's output\n")
    assert_one_error_line(_resume(proc), OutputExistsError.exit_code,
                          str(out), "while this run was writing it")
    assert os.listdir(out) == ["theirs.txt"]
    assert temp_siblings(out) == []


@slow
def test_an_empty_directory_that_appears_is_not_replaced_either(big_source: Path,
                                                                  tmp_path: Path) -> None:
    # rename(2) replaces an empty directory silently; the rename used must not.
    out = tmp_path / "art"
    proc = _start(big_source, out)
    out.mkdir()
    assert_one_error_line(_resume(proc), OutputExistsError.exit_code, str(out))
    assert os.listdir(out) == []
    assert temp_siblings(out) == []


@slow
def test_two_runs_at_once_one_wins_the_other_is_refused(big_source: Path, tmp_path: Path) -> None:
    out = tmp_path / "art"
    stopped = _start(big_source, out)
    fast = run_cli("convert", str(REFERENCE_DRAFTER), "-o", str(out), "-q")
    assert fast.returncode == 0, fast.stderr
    winner = _snapshot(out)
    assert_one_error_line(_resume(stopped), OutputExistsError.exit_code, str(out))
    assert _snapshot(out) == winner, "the first run's artifact was replaced"
    assert_valid(out)
    assert os.listdir(tmp_path) == ["art"]


@slow
def test_force_replaces_an_output_that_appeared_in_one_step(big_source: Path, tmp_path: Path) -> None:
    out = tmp_path / "art"
    stopped = _start(big_source, out, "--force")
    first = run_cli("convert", str(REFERENCE_DRAFTER), "-o", str(out), "-q")
    assert first.returncode == 0, first.stderr
    code, stderr = _resume(stopped)
    assert code == 0, stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["source"]["name"] == big_source.name
    assert_valid(out)
    assert os.listdir(tmp_path) == ["art"], "the replaced artifact was left behind"


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "fallback"])
def test_publishing_never_replaces_without_force_in_process(tmp_path: Path, monkeypatch,
                                                            exchange: bool) -> None:
    """The same rule where the kernel lacks renameat2 (the fallback claims the name with
    mkdir/link, which fail when anything holds it)."""
    from dspark_convert.util import atomic

    if not exchange:
        monkeypatch.setattr(atomic, "_renameat2", None)
    out = tmp_path / "art"
    with pytest.raises(OutputExistsError):
        with atomic.atomic_directory(out) as tmp:
            (tmp / "ours").write_text("new")
            out.mkdir()                       # appears while "converting"
    assert os.listdir(out) == [] and temp_siblings(out) == []
    with atomic.atomic_directory(out, force=True) as tmp:
        (tmp / "ours").write_text("new")
    assert os.listdir(out) == ["ours"] and temp_siblings(out) == []

    lock = tmp_path / "x.lock"
    with pytest.raises(OutputExistsError):
        atomic.atomic_file(lock, lambda fh: (lock.write_text("theirs"), fh.write(b"ours")))
    assert lock.read_text() == "theirs" and temp_siblings(lock) == []
    atomic.atomic_file(lock, lambda fh: fh.write(b"ours"), force=True)
    assert lock.read_text() == "ours" and temp_siblings(lock) == []


def test_long_output_names_get_a_temporary_that_fits(tmp_path: Path) -> None:
    """An output name of up to 255 bytes is allowed; its hidden temporary's name must fit
    too (it is shortened, with a hash of the full name), and stale ones are still found."""
    for length in (227, 240, 255):
        out = tmp_path / ("a" * length)
        proc = run_cli("convert", str(REFERENCE_DRAFTER), "-o", str(out), "-q")
        assert proc.returncode == 0, proc.stderr
        assert_valid(out)
    assert sorted(len(n) for n in os.listdir(tmp_path)) == [227, 240, 255]


# --- links out of an HF-cache layout ---------------------------------

def _cache_layout(root: Path, blobs_to: Path | None) -> Path:
    """<root>/models--o--n/snapshots/<rev>/ with config.json and a model.safetensors link
    to ../../blobs/<name>; blobs/ is a real directory, or a link to ``blobs_to``."""
    repo = root / "models--o--n"
    snap = repo / "snapshots" / ("1" * 40)
    snap.mkdir(parents=True)
    shutil.copy(REFERENCE_DRAFTER / "config.json", snap / "config.json")
    if blobs_to is None:
        (repo / "blobs").mkdir()
        shutil.copy(REFERENCE_DRAFTER / "model.safetensors", repo / "blobs" / "w")
        (snap / "model.safetensors").symlink_to("../../blobs/w")
    else:
        (repo / "blobs").symlink_to(blobs_to)
        # Through blobs -> /, "../../blobs/<absolute path>" reaches any file on the machine.
        secret = tmp_secret = root.parent / "elsewhere" / "model.safetensors"
        tmp_secret.parent.mkdir()
        shutil.copy(REFERENCE_DRAFTER / "model.safetensors", secret)
        (snap / "model.safetensors").symlink_to("../../blobs" + str(secret))
    return snap


def test_a_cache_layout_whose_blobs_is_a_link_cannot_reach_other_files(tmp_path: Path) -> None:
    snap = _cache_layout(tmp_path / "cache", blobs_to=Path("/"))
    out = tmp_path / "art"
    proc = run_cli("convert", str(snap), "-o", str(out), "-q")
    assert_one_error_line(proc, SourceLayoutError.exit_code, "model.safetensors",
                          "leaves the source directory")
    assert not out.exists()


def test_a_real_cache_layout_still_converts(tmp_path: Path) -> None:
    snap = _cache_layout(tmp_path / "cache", blobs_to=None)
    out = tmp_path / "art"
    proc = run_cli("convert", str(snap), "-o", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    assert_valid(out)
