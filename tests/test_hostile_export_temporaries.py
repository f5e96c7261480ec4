"""Hostile inputs to `dspark export` and its temporaries, each case
through the real CLI (tests/support/cli.py), with the twins in util/atomic.py:

- A target GGUF whose tokenizer array is empty or an array of arrays exited 1 (gguf-py's
  "Empty array") or was written back with guessed element types (a nested UINT32 array
  came back INT32): refused with 104 naming the key, before validate hashes the artifact;
  every array the export copies keeps the element type it was read with.
- A hidden ``.OUT.dspark-tmp-PID-x.header`` (the header gguf-py stages) was left beside
  ``-o`` on a full disk, a file-size limit, SIGINT and SIGTERM: no temporary is left on any
  failure, and the interrupt is one line with its code (130 / 143), whether it comes while
  the header is staged or while the tensors are copied (slow).
- The writers' other entries beside an output: a writability probe left by a killed run is
  removed; a rename and its record are never split by a signal.

The target GGUFs are the golden target (support/llama_cpp.write_target_gguf) with one key
rewritten byte for byte (``_with_kv``): gguf-py cannot write an empty array, nor an inner
array of a chosen element type, which is the point.
"""

from __future__ import annotations

import os
import shutil
import signal
import struct
import subprocess
import time
from pathlib import Path

import pytest
from gguf import GGUFReader
from gguf import GGUFValueType as T
from support.cli import DSPARK, assert_one_error_line, assert_refused, run_cli, temp_siblings
from support.llama_cpp import write_target_gguf

from dspark_convert import errors
from dspark_convert.util import atomic

EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143
POLL_S = 0.002
APPEAR_TIMEOUT_S = 60.0


# --- GGUF bytes: one key rewritten exactly ------------------------------------------------------

_SCALAR = {T.UINT8: "B", T.INT8: "b", T.UINT16: "H", T.INT16: "h", T.UINT32: "I",
           T.INT32: "i", T.FLOAT32: "f", T.BOOL: "?", T.UINT64: "Q", T.INT64: "q",
           T.FLOAT64: "d"}


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _array(sub: T, items: list) -> bytes:
    """An ARRAY value as stored after its type tag: element type, count, elements (the
    elements of an array of arrays are ``_array`` bytes themselves)."""
    if sub == T.ARRAY:
        body = b"".join(items)
    elif sub == T.STRING:
        body = b"".join(_string(i) for i in items)
    else:
        body = struct.pack(f"<{len(items)}{_SCALAR[sub]}", *items)
    return struct.pack("<IQ", sub, len(items)) + body


def _with_kv(src: Path, dst: Path, values: dict[str, bytes]) -> Path:
    """``src`` with the ARRAY keys of ``values`` (key -> ``_array`` bytes) replaced in
    place or appended; every other key, the tensor infos and the data byte for byte."""
    reader = GGUFReader(src)
    values = dict(values)
    entries = []
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        if key in values:
            entries.append(_string(key) + struct.pack("<I", T.ARRAY) + values.pop(key))
        else:
            entries.append(b"".join(part.tobytes() for part in field.parts))
    entries += [_string(k) + struct.pack("<I", T.ARRAY) + v for k, v in values.items()]
    infos = [b"".join(part.tobytes() for part in t.field.parts) for t in reader.tensors]
    head = b"GGUF" + struct.pack("<IQQ", 3, len(infos), len(entries)) + b"".join(entries)
    head += b"".join(infos)
    head += bytes(-len(head) % reader.alignment)
    dst.write_bytes(head + src.read_bytes()[reader.data_offset:])
    return dst


def _raw_kv(path: Path) -> dict[str, bytes]:
    """Each key's stored bytes (type tag and value), as gguf-py's reader splits them."""
    return {k: b"".join(p.tobytes() for p in f.parts[2:])
            for k, f in GGUFReader(path).fields.items() if not k.startswith("GGUF.")}


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return write_target_gguf(tmp_path_factory.mktemp("target") / "target.gguf")


@pytest.fixture(scope="module")
def dspark(paired_artifacts) -> Path:
    return paired_artifacts["vanilla_conf_markov"]


def _export(artifact: Path, target: Path, out: Path, *extra: str):
    return run_cli("export", str(artifact), "--engine", "llama.cpp", "--target-gguf",
                   str(target), "-o", str(out), *extra)


def test_the_rewriter_is_exact(target, tmp_path):
    """The helper above changes nothing it is not asked to."""
    assert _with_kv(target, tmp_path / "same.gguf", {}).read_bytes() == target.read_bytes()


# --- tokenizer arrays the drafter cannot carry: 104, before any work ---------------------------

NESTED_U32 = _array(T.ARRAY, [_array(T.UINT32, [1, 2]), _array(T.UINT32, [3])])


@pytest.mark.parametrize("key, value, needle", [
    ("tokenizer.ggml.merges", _array(T.STRING, []), "is an empty STRING array"),
    ("tokenizer.ggml.token_type", _array(T.INT32, []), "is an empty INT32 array"),
    ("tokenizer.ggml.merges", _array(T.ARRAY, [_array(T.STRING, ["a b"])]), "array of arrays"),
    ("tokenizer.ggml.extra", NESTED_U32, "array of arrays"),
    ("tokenizer.ggml.extra", _array(T.ARRAY, [_array(T.UINT32, []), _array(T.UINT32, [3])]),
     "array of arrays"),
    ("tokenizer.ggml.extra", _array(T.ARRAY, []), "array of arrays"),
], ids=["empty-merges", "empty-token-type", "nested-merges", "nested-uint32", "nested-empty",
        "empty-nested"])
def test_a_tokenizer_array_the_drafter_cannot_carry_is_refused(dspark, target, tmp_path, key,
                                                               value, needle):
    bad = _with_kv(target, tmp_path / "bad.gguf", {key: value})
    out = tmp_path / "d.gguf"
    assert_refused(_export(dspark, bad, out), errors.TargetGGUFMismatchError,
                   (f"metadata key '{key}'", needle, "expected a"))
    assert not out.exists() and temp_siblings(out) == []


def test_the_target_is_refused_before_validate_hashes_the_artifact(dspark, target, tmp_path):
    """An artifact whose weights no longer match their hashes (validate: 100) with an
    unusable target: the target's metadata is checked first (104), so a wrong target costs
    no read of the weights."""
    broken = tmp_path / "broken"
    shutil.copytree(dspark, broken)
    gguf = broken / "drafter.gguf"
    data = bytearray(gguf.read_bytes())
    data[-3] ^= 0xFF
    gguf.write_bytes(bytes(data))
    bad = _with_kv(target, tmp_path / "bad.gguf", {"tokenizer.ggml.extra": NESTED_U32})
    out = tmp_path / "d.gguf"
    assert_refused(_export(broken, bad, out), errors.TargetGGUFMismatchError, ("array of arrays",))
    assert_refused(_export(broken, target, out), errors.ExportArtifactError, ("does not validate",))


def test_every_copied_array_keeps_its_element_type(dspark, target, tmp_path):
    """Flat arrays of every element type, copied into the drafter byte for byte (gguf-py
    would write a list of ints as INT32 and floats as FLOAT32 if it were left to guess)."""
    arrays = {
        "tokenizer.ggml.token_type": _array(T.UINT8, [1] * 512),
        "tokenizer.x.u16": _array(T.UINT16, [65535, 0]),
        "tokenizer.x.i16": _array(T.INT16, [-2, 3]),
        "tokenizer.x.u32": _array(T.UINT32, [4_000_000_000, 7]),
        "tokenizer.x.i64": _array(T.INT64, [-(2 ** 40)]),
        "tokenizer.x.u64": _array(T.UINT64, [2 ** 64 - 1]),
        "tokenizer.x.f64": _array(T.FLOAT64, [0.1, -2.5]),
        "tokenizer.x.bool": _array(T.BOOL, [True, False]),
        "tokenizer.x.i8": _array(T.INT8, [-1]),
    }
    source = _with_kv(target, tmp_path / "typed.gguf", arrays)
    out = tmp_path / "d.gguf"
    proc = _export(dspark, source, out, "-q")
    assert proc.returncode == 0, proc.stderr
    theirs, ours = _raw_kv(source), _raw_kv(out)
    copied = [k for k in theirs if k.startswith("tokenizer.") and k != "tokenizer.ggml.mask_token_id"]
    assert set(arrays) <= set(copied)
    for key in copied:
        assert ours[key] == theirs[key], key


# --- no temporary left beside -o on any failure ------------------------------------------------

@pytest.mark.parametrize("limit", [0, 4096, pytest.param(100_000, marks=pytest.mark.slow)],
                         ids=["header", "in-header", "in-tensors"])
def test_a_file_size_limit_leaves_no_temporary(dspark, target, tmp_path, limit):
    """EFBIG: at 0 bytes gguf-py cannot even stage the header; the staged header was left."""
    import resource

    def limit_file_size():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    out = tmp_path / "o" / "d.gguf"
    out.parent.mkdir()
    proc = subprocess.run([str(DSPARK), "export", str(dspark), "--engine", "llama.cpp",
                           "--target-gguf", str(target), "-o", str(out), "-q"],
                          capture_output=True, text=True, timeout=120, preexec_fn=limit_file_size)
    assert_one_error_line(proc, errors.OutputWriteError.exit_code, str(out), "File too large")
    assert os.listdir(out.parent) == []


def _tmpfs_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    script = 'd=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs "$d" && umount "$d" && rmdir "$d"'
    return subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True,
                          timeout=30).returncode == 0


@pytest.mark.skipif(not _tmpfs_works(), reason="needs `unshare -rm` and a tmpfs mount in a "
                    "user namespace (unprivileged user namespaces are disabled here)")
@pytest.mark.parametrize("size", ["4k", pytest.param("64k", marks=pytest.mark.slow)])
def test_a_full_disk_leaves_no_temporary(dspark, target, tmp_path, size):
    """ENOSPC on a real tiny tmpfs: 4 KiB does not hold the staged header, 64 KiB fails in
    the tensors. The listing is taken inside the namespace, hidden entries included."""
    disk = tmp_path / "disk"
    disk.mkdir()
    script = ('mount -t tmpfs -o size="$1" tmpfs "$0" || exit 99; shift; "$@"; rc=$?; '
              'echo "LISTING:$(ls -A "$0" | tr "\\n" " ")"; exit $rc')
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", script, str(disk), size, str(DSPARK),
                           "export", str(dspark), "--engine", "llama.cpp", "--target-gguf",
                           str(target), "-o", str(disk / "d.gguf"), "-q"],
                          capture_output=True, text=True, timeout=120)
    listing = [line for line in proc.stdout.splitlines() if line.startswith("LISTING:")]
    assert proc.returncode != 99 and len(listing) == 1, proc.stdout + proc.stderr
    assert_one_error_line((proc.returncode, proc.stderr), errors.OutputWriteError.exit_code,
                          "d.gguf", "(disk full)")
    assert listing[0][len("LISTING:"):].split() == []


@pytest.fixture(scope="module")
def long_header_target(target, tmp_path_factory) -> Path:
    """400,000 merges (about the size of a real target's): gguf-py takes long enough
    packing them into the staged header for a poll to see it and signal the process."""
    merges = [f"m{i} x{i}" for i in range(400_000)]
    return _with_kv(target, tmp_path_factory.mktemp("long") / "long.gguf",
                    {"tokenizer.ggml.merges": _array(T.STRING, merges)})


def _default_sigint() -> None:
    # A child inherits an ignored SIGINT from a background job; Python then installs no
    # KeyboardInterrupt handler.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig, code, word", [
    (signal.SIGINT, EXIT_INTERRUPTED, "interrupted"),
    pytest.param(signal.SIGTERM, EXIT_TERMINATED, "terminated", marks=pytest.mark.slow),
], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_the_header_is_staged_leaves_no_temporary(dspark, long_header_target,
                                                                 tmp_path, sig, code, word):
    """The export's output temporary and its staged header both exist; the child is
    stopped as soon as the header is seen, signalled, and let go."""
    out = tmp_path / "d.gguf"
    proc = subprocess.Popen([str(DSPARK), "export", str(dspark), "--engine", "llama.cpp",
                             "--target-gguf", str(long_header_target), "-o", str(out), "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_sigint)
    try:
        deadline = time.monotonic() + APPEAR_TIMEOUT_S
        seen: list[str] = []
        while proc.poll() is None and time.monotonic() < deadline:
            seen = temp_siblings(out)
            if any(name.endswith(".header") for name in seen):
                break
            time.sleep(POLL_S)
        proc.send_signal(signal.SIGSTOP)
        stopped_with = temp_siblings(out)
        if proc.poll() is not None or not any(n.endswith(".header") for n in stopped_with):
            pytest.fail(f"the staged header was not caught (exit {proc.poll()}, saw {seen}, "
                        f"{stopped_with} when stopped); make the merges longer")
        assert len(stopped_with) == 2, stopped_with      # the output's temporary and its header
        proc.send_signal(sig)
        proc.send_signal(signal.SIGCONT)
        _stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert_one_error_line((proc.returncode, stderr), code, word)
    assert not out.exists()
    assert temp_siblings(out) == []
    assert os.listdir(tmp_path) == []


# --- the other entries beside an output (util/atomic.py, every writer) -------------------------

def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_a_probe_left_by_a_killed_run_is_removed(dspark, target, tmp_path):
    """check_outputs probes a directory by making and removing a hidden entry; a SIGKILL
    between the two leaves it, under no output's name: the next probe of that directory
    removes it (a live process' probe is left alone)."""
    out_dir = tmp_path / "o"
    out_dir.mkdir()
    stale = out_dir / f".{atomic.TMP_MARK}probe-{_dead_pid()}-0badc0de"
    live = out_dir / f".{atomic.TMP_MARK}probe-{os.getpid()}-0badc0de"
    stale.mkdir()
    live.mkdir()
    proc = _export(dspark, target, out_dir / "d.gguf", "-q")
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(out_dir)) == sorted(["d.gguf", live.name])


def test_signals_are_held_across_a_step_and_delivered_after_it():
    """A rename and the record of it happen whole: SIGINT sent inside the step raises
    KeyboardInterrupt only once the step is done (and the handlers are back)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers run in the main thread only; this runner is elsewhere")
    done = []
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        with atomic._signals_held():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)          # the handler has run by now: it only recorded it
            done.append("step")
    assert done == ["step"]
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "fallback"])
def test_a_failed_replace_keeps_the_old_file_and_leaves_no_sibling(tmp_path, monkeypatch,
                                                                   exchange):
    """--force over a file where the new one cannot be moved into place (its temporary is
    gone): the old file stays, and the fallback's hard link of it (old-) does not."""
    if not exchange:
        monkeypatch.setattr(atomic, "_renameat2", None)
    out = tmp_path / "x.lock"
    out.write_text("old")

    def write(fh) -> None:
        fh.write(b"new")
        os.unlink(fh.name)

    with pytest.raises(errors.OutputWriteError, match="x.lock"):
        atomic.atomic_file(out, write, force=True)
    assert out.read_text() == "old"
    assert os.listdir(tmp_path) == ["x.lock"]


@pytest.fixture(scope="module")
def big_export_inputs(big_source, tmp_path_factory):
    """A ~130 MB artifact and a target GGUF for it: the tensor copy lasts long enough to
    stop the export in the middle of it."""
    import json

    from test_export import _big_target

    from dspark_convert.commands.convert import convert

    root = tmp_path_factory.mktemp("big-export")
    convert(big_source, root / "art")
    config = json.loads((big_source / "config.json").read_text())
    return root / "art", _big_target(root / "t.gguf", config)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:     # renamed or removed since it was listed
        return 0


@pytest.mark.slow   # converts 130 MB; the staged-header case above is the fast canary
@pytest.mark.parametrize("sig, code, word", [
    (signal.SIGINT, EXIT_INTERRUPTED, "interrupted"),
    (signal.SIGTERM, EXIT_TERMINATED, "terminated"),
], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_the_tensors_are_copied_leaves_no_temporary(big_export_inputs, tmp_path,
                                                                   sig, code, word):
    """Stopped once the output's temporary holds more than its header (the tensors are
    being copied), signalled, let go."""
    art, target = big_export_inputs
    out = tmp_path / "d.gguf"
    proc = subprocess.Popen([str(DSPARK), "export", str(art), "--engine", "llama.cpp",
                             "--target-gguf", str(target), "-o", str(out), "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_sigint)
    try:
        deadline = time.monotonic() + APPEAR_TIMEOUT_S
        size = 0
        while proc.poll() is None and time.monotonic() < deadline:
            size = max((_size(tmp_path / n) for n in temp_siblings(out)
                        if not n.endswith(".header")), default=0)
            if size > 8 * 1024 * 1024:
                break
            time.sleep(POLL_S)
        proc.send_signal(signal.SIGSTOP)
        if proc.poll() is not None or size <= 8 * 1024 * 1024:
            pytest.fail(f"the copy was not caught under way (exit {proc.poll()}, {size} bytes)")
        proc.send_signal(sig)
        proc.send_signal(signal.SIGCONT)
        _stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert_one_error_line((proc.returncode, stderr), code, word)
    assert not out.exists()
    assert os.listdir(tmp_path) == []
