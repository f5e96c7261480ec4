"""llama.cpp, built from its registry package: the engine the llama.cpp tests run (issue 20).

The one place that names the pinned version. llama.cpp has no PyPI package of its own; the
sdist of ``llama-cpp-python`` vendors it (``vendor/llama.cpp``), so that sdist, checked by
its SHA-256, is the source. ``make llama-cpp`` (and so ``make test``) runs ``build``:

    python tools/llama_cpp.py build     # download, check, unpack, configure, build; reused
    python tools/llama_cpp.py path      # print the bin directory of a whole build (exit 1: none)
    python tools/llama_cpp.py build --native   # -march=native, only to reproduce issue 25's
    python tools/llama_cpp.py path --native    # AMX crash (llama.cpp-<commit>-native/)

The build lives outside the checkout, in ``$DSPARK_ENGINE_CACHE`` (default
``~/.cache/dspark-convert``) under ``llama.cpp-<commit>/``:

    bin/                 the binaries (linked statically: no RPATH into a build tree)
    llama.cpp/           the unpacked vendor/llama.cpp (its convert_hf_to_gguf.py and
                         gguf-py: the equivalence tests run llama.cpp's own converter)
    build-info.json      version, commit, sdist SHA-256, ISA baseline, cmake options, binaries

Only a WHOLE build is used: a directory whose build-info.json is the object this script
writes (read bounded, never waiting on a FIFO) and whose binaries are regular executable
files. Anything else is named in one line, and ``build`` replaces it. A build is made in a
hidden temporary sibling and renamed into place when complete; a killed build leaves only a
temporary, removed by the next run; Ctrl-C or SIGTERM ends the build's processes and removes
the temporary. ``DSPARK_LLAMA_CPP_SDIST=PATH`` uses a local copy of the sdist instead of
downloading it (its SHA-256 is checked all the same); a download is kept in the cache
(``sdist/``, checked again at each use).

Standard library only: it runs before (and without) the package's own environment.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import json
import os
import platform
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import NamedTuple

PACKAGE = "llama-cpp-python"
VERSION = "0.3.36"
SDIST_NAME = f"llama_cpp_python-{VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
COMMIT = "0c1e570"                       # the llama.cpp commit the sdist vendors
VENDORED = f"llama_cpp_python-{VERSION}/vendor/llama.cpp"
# What the tests run: speculative decoding, the target alone. Nothing else is built.
BINARIES = ("llama-speculative-simple", "llama-completion")
# What the tests read from the unpacked source (support/llama_cpp.LlamaCpp.convert).
CONVERTER = "convert_hf_to_gguf.py"
# docs/REFERENCE.md §6b. Static libraries: the binaries keep working after the rename (a
# shared build's RPATH would point into the temporary directory).
BASE_OPTIONS = ("-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF",
                "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                "-DLLAMA_BUILD_SERVER=OFF")
# Portable code, never -march=native (issue 25): a native build on a CPU with AMX repacks
# Q8_0/Q4_0 weights into AMX buffers and 0c1e570 crashes on a quantized DSpark drafter, so
# the suite and the gate's verdict depended on the machine. The baseline is named in
# build-info.json ("isa_baseline"): x86-64-v3 (AVX2, FMA, F16C, BMI2; no AVX-512, no AMX),
# which every x86 server CPU of the last decade has; ggml picks no wider code at run time.
ISA_BASELINE = "x86-64-v3"
ISA_FLAGS = ("avx", "avx2", "fma", "f16c", "bmi2", "sse4_2")     # /proc/cpuinfo names
PORTABLE_OPTIONS = ("-DGGML_NATIVE=OFF", "-DGGML_SSE42=ON", "-DGGML_AVX=ON", "-DGGML_AVX2=ON",
                    "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DGGML_BMI2=ON", "-DGGML_AVX_VNNI=OFF",
                    "-DGGML_AVX512=OFF", "-DGGML_AVX512_VBMI=OFF", "-DGGML_AVX512_VNNI=OFF",
                    "-DGGML_AVX512_BF16=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF",
                    "-DGGML_AMX_BF16=OFF")
CMAKE_OPTIONS = BASE_OPTIONS + PORTABLE_OPTIONS
# The native build of issue 25's item 2: whatever this CPU has, AMX included. Only to
# reproduce the AMX crash; `make test` never builds or runs it.
NATIVE_OPTIONS = BASE_OPTIONS + ("-DGGML_NATIVE=ON",)
INFO_FILE = "build-info.json"
INFO_MAX_BYTES = 64 * 1024      # ours is under 2 KiB; a bigger file is not ours (read bounded)
TMP_MARK = ".tmp-"
CPUINFO = Path("/proc/cpuinfo")
# How long the build's processes get to end after SIGTERM (ninja ends its compilers) before
# SIGKILL.
GRACE_S = 5.0


class BuildError(Exception):
    """A step failed; the message says which and what to do."""


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived during a build. A BaseException, as KeyboardInterrupt is:
    nothing on the way may take it for a failure and go on."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
        self.name = signal.Signals(signum).name


class Variant(NamedTuple):
    """One kind of build: where it lives and how it is made."""
    suffix: str                          # of the directory name: "" or "-native"
    isa_baseline: str                    # build-info.json's "isa_baseline"
    cmake_options: tuple[str, ...]
    cpu_flags: tuple[str, ...]           # /proc/cpuinfo flags the CPU must have to run it


def _is_x86_64() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def variant(native: bool = False) -> Variant:
    if native:
        return Variant("-native", "native", NATIVE_OPTIONS, ())
    if _is_x86_64():
        return Variant("", ISA_BASELINE, CMAKE_OPTIONS, ISA_FLAGS)
    # Elsewhere no baseline of ours is named: ggml without GGML_NATIVE compiles for the
    # compiler's default target of this architecture, and build-info.json says exactly that.
    arch = platform.machine().lower() or "unknown"
    return Variant("", f"{arch} compiler default", BASE_OPTIONS + ("-DGGML_NATIVE=OFF",), ())


def expected_info(native: bool = False) -> dict:
    """build-info.json of a whole build, as `build` writes it."""
    v = variant(native)
    return {"package": PACKAGE, "version": VERSION, "sdist_sha256": SDIST_SHA256,
            "commit": COMMIT, "isa_baseline": v.isa_baseline,
            "cmake_options": list(v.cmake_options), "binaries": list(BINARIES)}


def cache_root() -> Path:
    return Path(os.environ.get("DSPARK_ENGINE_CACHE")
                or Path.home() / ".cache" / "dspark-convert")


def build_dir(native: bool = False) -> Path:
    return cache_root() / f"llama.cpp-{COMMIT}{variant(native).suffix}"


def bin_dir(native: bool = False) -> Path:
    return build_dir(native) / "bin"


def source_dir(native: bool = False) -> Path:
    """The unpacked vendor/llama.cpp of a finished build."""
    return build_dir(native) / "llama.cpp"


# --- the CPU -----------------------------------------------------------------------------

def cpu_flags(cpuinfo: Path | None = None) -> frozenset[str] | None:
    """The feature flags every CPU of this machine has (/proc/cpuinfo's "flags" lines,
    intersected); None where that is not known (no such file, no such line)."""
    flags: frozenset[str] | None = None
    try:
        with open(cpuinfo or CPUINFO, encoding="ascii", errors="replace") as fh:
            for line in fh:
                key, sep, value = line.partition(":")
                if sep and key.strip() == "flags":
                    one = frozenset(value.split())
                    flags = one if flags is None else flags & one
    except OSError:
        return None
    return flags


def cpu_has_amx(cpuinfo: Path | None = None) -> bool:
    """Whether this CPU has the AMX tiles and INT8 ops ggml repacks Q8_0/Q4_0 weights for
    in a native build (issue 25's crash)."""
    return {"amx_tile", "amx_int8"} <= (cpu_flags(cpuinfo) or frozenset())


def missing_cpu_flags(native: bool = False, cpuinfo: Path | None = None) -> tuple[str, ...]:
    """The flags the build's baseline needs that this CPU lacks (none: it can run it, or
    the flags cannot be read here: nothing to refuse on)."""
    need = variant(native).cpu_flags
    have = cpu_flags(cpuinfo)
    if not need or have is None:
        return ()
    return tuple(flag for flag in need if flag not in have)


# --- is this a whole build ----------------------------------------------------------------

def _shown(path: Path | str) -> str:
    """A path on one line: as it is when printable, else escaped."""
    text = str(path)
    return text if text.isprintable() else ascii(text)


def _brief(value: object) -> str:
    """A JSON value on one short line (json escapes control characters)."""
    text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= 60 else text[:57] + "..."


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "an unknown kind of file"


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    seen: dict = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"key {_brief(key)} twice")
        seen[key] = value
    return seen


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


_JSON_KIND = {list: "array", str: "string", int: "number", float: "number", bool: "boolean",
              type(None): "null"}


def read_info(path: Path) -> dict:
    """build-info.json as a JSON object, read without following a link, without waiting on
    a FIFO (O_NONBLOCK) and at most INFO_MAX_BYTES; BuildError naming what was found."""
    expected = (f"expected the JSON object tools/llama_cpp.py writes (at most {INFO_MAX_BYTES} "
                "bytes)")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise BuildError(f"{_shown(path)}: missing; {expected}") from None
    except OSError as exc:
        what = "a symbolic link" if exc.errno == errno.ELOOP else f"unreadable ({exc.strerror})"
        raise BuildError(f"{_shown(path)}: {what}; {expected}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise BuildError(f"{_shown(path)}: {_kind(mode)}; {expected}")
        chunks, size = [], 0
        while size <= INFO_MAX_BYTES:
            chunk = os.read(fd, INFO_MAX_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise BuildError(f"{_shown(path)}: unreadable ({exc.strerror}); {expected}") from None
    finally:
        os.close(fd)
    if size > INFO_MAX_BYTES:
        raise BuildError(f"{_shown(path)}: over {INFO_MAX_BYTES} bytes; {expected}")
    try:
        info = json.loads(b"".join(chunks).decode("utf-8"), object_pairs_hook=_no_duplicates,
                          parse_constant=_refuse_constant)
    except UnicodeDecodeError:
        raise BuildError(f"{_shown(path)}: not UTF-8; {expected}") from None
    except RecursionError:
        raise BuildError(f"{_shown(path)}: nested too deep; {expected}") from None
    except ValueError as exc:
        raise BuildError(f"{_shown(path)}: not JSON ({exc}); {expected}") from None
    if not isinstance(info, dict):
        raise BuildError(f"{_shown(path)}: a JSON {_JSON_KIND.get(type(info), 'value')} "
                         f"{_brief(info)}; {expected}")
    return info


def _check_entry(path: Path, want_dir: bool, what: str) -> None:
    """``path`` is a real directory or a regular executable file (never a link: a whole
    build holds none, and a link may point anywhere)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        raise BuildError(f"{_shown(path)}: missing; expected {what}") from None
    except OSError as exc:
        raise BuildError(f"{_shown(path)}: unreadable ({exc.strerror}); expected {what}") from None
    ok = stat.S_ISDIR(mode) if want_dir else stat.S_ISREG(mode)
    if not ok:
        raise BuildError(f"{_shown(path)}: {_kind(mode)}; expected {what}")
    if not want_dir and what.endswith("executable") and not os.access(path, os.X_OK):
        raise BuildError(f"{_shown(path)}: not executable; expected {what}")


def check_build(root: Path | None = None, *, native: bool = False) -> None:
    """None when ``root`` (default: the cache's) is a whole build of the pinned commit in
    this variant; else BuildError, one line naming the path and what was expected."""
    root = build_dir(native) if root is None else root
    _check_entry(root, True, f"the directory of a llama.cpp {COMMIT} build")
    info_path = root / INFO_FILE
    info, want = read_info(info_path), expected_info(native)
    for key, value in want.items():
        if key not in info:
            raise BuildError(f"{_shown(info_path)}: no {key!r}; expected {_brief(value)}")
        if info[key] != value or type(info[key]) is not type(value):
            raise BuildError(f"{_shown(info_path)}: {key} is {_brief(info[key])}, "
                             f"expected {_brief(value)}")
    extra = sorted(set(info) - set(want))
    if extra:
        raise BuildError(f"{_shown(info_path)}: unexpected key {_brief(extra[0])}; expected only "
                         f"{', '.join(want)}")
    _check_entry(root / "bin", True, "the directory of the binaries")
    for name in BINARIES:
        _check_entry(root / "bin" / name, False, "a regular file, executable")
    _check_entry(root / "llama.cpp", True, f"the unpacked {VENDORED}")
    _check_entry(root / "llama.cpp" / CONVERTER, False, "a regular file")


def build_problem(root: Path | None = None, *, native: bool = False) -> str | None:
    """Why ``root`` is not a whole build (one line), or None where it is."""
    try:
        check_build(root, native=native)
    except BuildError as exc:
        return str(exc)
    return None


def is_built(root: Path | None = None, *, native: bool = False) -> bool:
    return build_problem(root, native=native) is None


# --- building -----------------------------------------------------------------------------

def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _sessions_members(sessions: set[int]) -> list[int]:
    """Live processes of these sessions (each child starts its own, and its descendants stay
    in it: ninja moves its compilers to process groups of their own, not sessions)."""
    pids = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return pids
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue                              # gone meanwhile
        # After the command name: state, ppid, pgrp, session.
        if len(fields) > 3 and fields[0] != b"Z" and int(fields[3]) in sessions:
            pids.append(int(entry))
    return pids


def _signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def end_processes(proc: subprocess.Popen) -> None:
    """End ``proc`` and every process of its session: SIGTERM (ninja ends its compilers),
    then SIGKILL for what is left after GRACE_S. Nothing of the build may go on writing
    into a temporary being removed."""
    sessions = {proc.pid}
    _signal_all([proc.pid, *_sessions_members(sessions)], signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline:
        proc.poll()
        if proc.returncode is not None and not _sessions_members(sessions):
            return
        time.sleep(0.05)
    _signal_all([proc.pid, *_sessions_members(sessions)], signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + GRACE_S          # SIGKILL is not refused: only slow
    while _sessions_members(sessions) and time.monotonic() < deadline:
        time.sleep(0.05)


def run_step(cmd: list[str], log: Path, what: str, cwd: Path | None = None) -> None:
    print(f"llama.cpp: {what} (log: {log})", flush=True)
    with open(log, "ab") as out:
        proc = None
        try:
            # A session of its own: the whole tree can be found and ended on an interrupt
            # (a terminal's Ctrl-C no longer reaches it; this process ends it instead).
            proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            code = proc.wait()
        except FileNotFoundError:
            raise BuildError(f"{what}: {cmd[0]} not found (the build needs cmake, ninja and a "
                             "C++ compiler on PATH)") from None
        except BaseException:
            if proc is not None:
                end_processes(proc)
            raise
    if code != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise BuildError(f"{what} failed (exit {code}): {' '.join(cmd)}\n" + "\n".join(tail))


def cached_sdist() -> Path:
    """Where a downloaded sdist is kept (SHA-256 checked before it is put there and again
    each time it is used): a second variant's build (--native), a rebuild of a tampered
    cache and the tests that interrupt a real compile need no second download."""
    return cache_root() / "sdist" / SDIST_NAME


def _keep(sdist: Path) -> None:
    """A checked download copied to cached_sdist(), whole or not at all (a temporary
    renamed into place); a cache that cannot take it is only a lost shortcut."""
    dest = cached_sdist()
    tmp = dest.with_name(f".{dest.name}{TMP_MARK}{os.getpid()}")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(sdist, tmp)
        os.replace(tmp, dest)
    except OSError as exc:
        print(f"llama.cpp: the sdist is not kept in {_shown(dest.parent)} "
              f"({exc.strerror or exc}); the next build downloads it again", flush=True)
    finally:
        _remove_quietly(tmp)


def fetch_sdist(work: Path) -> Path:
    """The sdist, from DSPARK_LLAMA_CPP_SDIST, else the one kept in the cache, else
    downloaded with pip (and then kept), SHA-256 checked each time. pip prepares the
    sdist's metadata in an isolated build environment (about a minute)."""
    local = os.environ.get("DSPARK_LLAMA_CPP_SDIST")
    kept = cached_sdist()
    downloaded = False
    if local:
        sdist = Path(local)
    elif kept.is_file() and not kept.is_symlink() and sha256_of(kept) == SDIST_SHA256:
        sdist = kept
    else:
        dl = work / "download"
        dl.mkdir()
        run_step([sys.executable, "-m", "pip", "download", "--disable-pip-version-check",
                  "--no-deps", "--no-binary", ":all:", f"{PACKAGE}=={VERSION}", "-d", str(dl)],
                 work / "download.log", f"pip download {PACKAGE}=={VERSION}")
        sdist = dl / SDIST_NAME
        downloaded = True
    if not sdist.is_file():
        raise BuildError(f"{_shown(sdist)}: no such sdist (expected {SDIST_NAME})")
    print(f"llama.cpp: checking the SHA-256 of {_shown(sdist)}", flush=True)
    got = sha256_of(sdist)
    if got != SDIST_SHA256:
        raise BuildError(f"{_shown(sdist)}: SHA-256 {got}, expected {SDIST_SHA256} "
                         f"({PACKAGE}=={VERSION}); refusing to build it")
    if downloaded:
        _keep(sdist)
    return sdist


def unpack(sdist: Path, dest: Path) -> Path:
    """vendor/llama.cpp of the sdist, moved to ``dest``. The 'data' filter refuses links
    and paths that leave the directory."""
    staging = dest.parent / "sdist"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(VENDORED + "/")]
        if not members:
            raise BuildError(f"{_shown(sdist)}: no {VENDORED}/ inside")
        tar.extractall(staging, members=members, filter="data")
    (staging / VENDORED).rename(dest)
    shutil.rmtree(staging)
    return dest


def _remove(path: Path) -> None:
    """Whatever ``path`` is, gone: a directory's tree (never following a link), else the
    entry itself (a file, a FIFO, a link: not what it points to)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(path)
    else:
        path.unlink()


def _remove_quietly(path: Path) -> None:
    """A temporary, removed even while a dying process may still add to it."""
    for _ in range(20):
        try:
            _remove(path)
            return
        except OSError:
            time.sleep(0.1)


def _signals_blocked():
    """SIGINT and SIGTERM held back while the build is put in place: the rename of the old
    cache aside and the new one in is done whole, or not begun."""
    class Blocked:
        def __enter__(self):
            if hasattr(signal, "pthread_sigmask"):
                self.old = signal.pthread_sigmask(signal.SIG_BLOCK,
                                                  {signal.SIGINT, signal.SIGTERM})

        def __exit__(self, *exc):
            if hasattr(signal, "pthread_sigmask"):
                signal.pthread_sigmask(signal.SIG_SETMASK, self.old)
    return Blocked()


def replace(work: Path, final: Path, *, native: bool = False) -> Path:
    """``work`` (a whole build) put at ``final``: whatever was there (a stale or tampered
    cache, a file, a FIFO, a link) is renamed aside and removed, so ``final`` is always either
    the old entry or the new build. Another run's whole build that got there first is kept
    and ``work`` removed."""
    if is_built(final, native=native):
        _remove(work)
        return final
    aside = _temporary(final, "old")
    with _signals_blocked():
        _remove(aside)
        try:
            os.rename(final, aside)
        except FileNotFoundError:
            pass
        try:
            os.rename(work, final)
        except OSError:
            if not is_built(final, native=native):   # not another run's build: a failure
                raise
            _remove(work)
        _remove_quietly(aside)
    return final


def build(*, jobs: int | None = None, native: bool = False) -> Path:
    """Build into the cache unless a whole build is there (anything else there is replaced);
    returns the build directory."""
    final = build_dir(native)
    if is_built(final, native=native):
        return final
    missing = missing_cpu_flags(native)
    if missing:
        raise BuildError(f"this CPU ({_shown(CPUINFO)}) lacks {', '.join(missing)}, which the "
                         f"{variant(native).isa_baseline} baseline needs; refusing to build "
                         "code it cannot run")
    final.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(final)
    # Named before it is made: an interrupt at any point finds it to remove.
    work = _temporary(final, "build")
    try:
        _remove(work)                   # a killed earlier process of this pid's, if any
        work.mkdir()
        sdist = fetch_sdist(work)
        # The real path: configured through a symlinked one, ninja loops on "build.ninja
        # still dirty" (docs/REFERENCE.md §6b).
        src = unpack(sdist, work / "llama.cpp").resolve()
        tree = (work / "cmake-build").resolve()
        log = work / "build.log"
        run_step(["cmake", "-S", str(src), "-B", str(tree), *variant(native).cmake_options],
                 log, "cmake configure")
        jobs = jobs or os.cpu_count() or 2
        run_step(["cmake", "--build", str(tree), "--target", *BINARIES, "-j", str(jobs)],
                 log, f"build {', '.join(BINARIES)} with {jobs} jobs (a few minutes)")
        (work / "bin").mkdir()
        for name in BINARIES:
            shutil.copy2(tree / "bin" / name, work / "bin" / name)
        shutil.rmtree(tree)             # ~100 MB of objects nobody reads again
        shutil.rmtree(work / "download", ignore_errors=True)   # the 76 MB sdist, unpacked
        (work / INFO_FILE).write_text(json.dumps(expected_info(native), indent=2) + "\n")
        check_build(work, native=native)           # what `path` will accept, or a failure
        return replace(work, final, native=native)
    except BaseException:
        _remove_quietly(work)
        raise


def _temporary(final: Path, role: str) -> Path:
    """A hidden sibling of ``final`` named by this process (``_remove_stale`` removes it
    once the process is gone)."""
    return final.parent / f".{final.name}{TMP_MARK}{os.getpid()}-{role}"


def _remove_stale(final: Path) -> None:
    """Temporaries of builds that were killed (their process is gone)."""
    prefix = f".{final.name}{TMP_MARK}"
    for entry in final.parent.glob(prefix + "*"):
        pid = entry.name[len(prefix):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            try:
                _remove(entry)
            except OSError:
                pass                    # another run's cleanup got there first


def _alive(pid: int) -> bool:
    # util/atomic._pid_alive's twin, not an import: this script runs without the package.
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _raise_interrupted(signum: int, frame) -> None:
    # The cleanup that follows is not interrupted again: a second Ctrl-C would leave the
    # temporary half removed.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Interrupted(signum)


def catch_signals() -> None:
    """SIGINT and SIGTERM raise Interrupted in the main thread (SIGTERM would otherwise end
    the process without removing the temporary or the build's processes)."""
    signal.signal(signal.SIGINT, _raise_interrupted)
    signal.signal(signal.SIGTERM, _raise_interrupted)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build llama.cpp into the cache unless a whole build is "
                       "there (anything else there is replaced)")
    b.add_argument("-j", "--jobs", type=int, default=None)
    p = sub.add_parser("path", help="print the bin directory of a whole build (exit 1: none)")
    for one in (b, p):
        one.add_argument("--native", action="store_true",
                         help="the -march=native build (llama.cpp-<commit>-native/), only to "
                         "reproduce issue 25's AMX crash; the tests use the portable one")
    args = parser.parse_args(argv)
    flag = " --native" if args.native else ""
    how = f"`python tools/llama_cpp.py build{flag}`" + ("" if args.native
                                                        else " (`make llama-cpp`)")
    if args.command == "path":
        root = build_dir(args.native)
        if not os.path.lexists(root):
            print(f"llama.cpp {COMMIT}{flag} is not built in {_shown(root)}: run {how}",
                  file=sys.stderr)
            return 1
        problem = build_problem(root, native=args.native)
        if problem:
            print(f"llama.cpp: not a whole {COMMIT} build: {problem}; {how} replaces it",
                  file=sys.stderr)
            return 1
        print(bin_dir(args.native))
        return 0
    catch_signals()
    try:
        root = build(jobs=args.jobs, native=args.native)
    except Interrupted as exc:
        if is_built(native=args.native):        # it came after the build was put in place
            print(f"llama.cpp: {exc.name} after the build was in place: {bin_dir(args.native)}",
                  file=sys.stderr)
        else:
            print(f"llama.cpp: build interrupted ({exc.name}); nothing was written",
                  file=sys.stderr)
        return 128 + exc.signum
    except (BuildError, OSError) as exc:
        print(f"llama.cpp: {exc}", file=sys.stderr)
        return 1
    # Put in place: a signal now comes too late to stop anything.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(f"llama.cpp {COMMIT}{flag} ({PACKAGE} {VERSION}): {root / 'bin'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
