"""tools/llama_cpp.py, the engine build, and how the tests find it.

The build itself runs in `make test` (its `llama-cpp` prerequisite) and the engine tests use
it; these cases are the refusals and the rule that CI never skips an engine test."""

from __future__ import annotations

import json
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import llama_cpp as support
from support.paths import ROOT

TOOL = ROOT / "tools" / "llama_cpp.py"


def _tool(*args, env_extra, tmp_path, timeout=60):
    env = {**os.environ, "DSPARK_ENGINE_CACHE": str(tmp_path / "cache"), **env_extra}
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


def test_an_sdist_of_another_sha256_is_refused_and_nothing_is_left(tmp_path):
    fake = tmp_path / support.build.SDIST_NAME
    fake.write_bytes(b"not the pinned sdist")
    proc = _tool("build", env_extra={"DSPARK_LLAMA_CPP_SDIST": str(fake)}, tmp_path=tmp_path)
    assert proc.returncode == 1
    assert "SHA-256" in proc.stderr and support.build.SDIST_SHA256 in proc.stderr
    assert "refusing to build it" in proc.stderr
    assert list((tmp_path / "cache").iterdir()) == []      # no build, no temporary


def test_path_says_how_to_build_when_missing(tmp_path):
    proc = _tool("path", env_extra={}, tmp_path=tmp_path)
    assert proc.returncode == 1 and "make llama-cpp" in proc.stderr


def test_an_incomplete_build_directory_is_not_a_build(tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_ENGINE_CACHE", str(tmp_path))
    (support.build.build_dir() / "bin").mkdir(parents=True)
    assert not support.build.is_built()


def test_engine_tests_fail_under_ci_when_the_build_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("DSPARK_ENGINE_CACHE", str(tmp_path))
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="make llama-cpp"):
        support.engine()
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match="make llama-cpp"):
        support.engine()


# --- a cache is used only when it is a whole build ---------------------------------
# A fake cache DIRECTORY (a build takes minutes): build-info.json as `build` writes it, the
# binaries as regular executable files, the converter. The first test shows it is accepted,
# so each tampered case below differs from an accepted cache in one way.

def _whole(root, *, native=False):
    b = support.build
    (root / "bin").mkdir(parents=True)
    for name in b.BINARIES:
        (root / "bin" / name).write_text("#!/bin/sh\n")
        (root / "bin" / name).chmod(0o755)
    (root / "llama.cpp").mkdir()
    (root / "llama.cpp" / b.CONVERTER).write_text("")
    (root / b.INFO_FILE).write_text(json.dumps(b.expected_info(native), indent=2) + "\n")
    return root


def _info(root, **changes):
    info = {**support.build.expected_info(), **changes}
    (root / support.build.INFO_FILE).write_text(json.dumps(info))


def _replace_with_fifo(path):
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()
    os.mkfifo(path)


@pytest.fixture
def deadline():
    """The test fails after 20 s instead of hanging: a FIFO read in this process (by
    is_built or replace) that waits for a writer is interrupted by SIGALRM."""
    def expired(signum, frame):
        raise AssertionError("hung for 20 s: something waited on a FIFO")
    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, 20)
    yield
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, old)


INFO = "build-info.json"
TAMPERED = {
    # name: (edit of a whole cache at root, the path named, what the line says)
    "info_array": (lambda r: (r / INFO).write_text("[1]"), INFO, "a JSON array [1]"),
    "info_fifo": (lambda r: _replace_with_fifo(r / INFO), INFO, "a FIFO"),
    "info_truncated": (lambda r: (r / INFO).write_text((r / INFO).read_text()[:40]), INFO,
                       "not JSON"),
    "info_other_commit": (lambda r: _info(r, commit="b1a2c3d"), INFO,
                          'commit is "b1a2c3d", expected "0c1e570"'),
    "info_native_baseline": (lambda r: _info(r, isa_baseline="native"), INFO,
                             'isa_baseline is "native"'),
    "info_other_options": (lambda r: _info(r, cmake_options=["-DGGML_NATIVE=ON"]), INFO,
                           "cmake_options is"),
    "info_other_sdist": (lambda r: _info(r, sdist_sha256="0" * 64), INFO, "sdist_sha256 is"),
    "info_number_version": (lambda r: _info(r, version=0.336), INFO, "version is 0.336"),
    "info_no_package": (lambda r: (r / INFO).write_text(json.dumps(
        {k: v for k, v in support.build.expected_info().items() if k != "package"})), INFO,
        "no 'package'"),
    "info_extra_key": (lambda r: _info(r, note="x"), INFO, 'unexpected key "note"'),
    "info_duplicate_key": (lambda r: (r / INFO).write_text(
        (r / INFO).read_text().replace("{", '{"commit": "b1a2c3d",', 1)), INFO,
        'key "commit" twice'),
    "info_nan": (lambda r: (r / INFO).write_text('{"commit": NaN}'), INFO, "NaN is not JSON"),
    "info_too_big": (lambda r: (r / INFO).write_text(" " * (64 * 1024) + "{}"), INFO,
                     "over 65536 bytes"),
    "info_nested": (lambda r: (r / INFO).write_text("[" * 60000), INFO, "nested too deep"),
    "info_not_utf8": (lambda r: (r / INFO).write_bytes(b'{"commit": "\xff"}'), INFO,
                      "not UTF-8"),
    "info_directory": (lambda r: ((r / INFO).unlink(), (r / INFO).mkdir()), INFO, "a directory"),
    "info_symlink": (lambda r: ((r / INFO).rename(r.parent / "elsewhere.json"),
                                (r / INFO).symlink_to(r.parent / "elsewhere.json")), INFO,
                     "a symbolic link"),
    "info_missing": (lambda r: (r / INFO).unlink(), INFO, "missing"),
    "binary_directory": (lambda r: ((r / "bin/llama-completion").unlink(),
                                    (r / "bin/llama-completion").mkdir()),
                         "bin/llama-completion", "a directory; expected a regular file"),
    "binary_symlink_out": (lambda r: ((r / "bin/llama-completion").unlink(),
                                      (r / "bin/llama-completion").symlink_to("/bin/sh")),
                           "bin/llama-completion", "a symbolic link; expected a regular file"),
    "binary_missing": (lambda r: (r / "bin/llama-speculative-simple").unlink(),
                       "bin/llama-speculative-simple", "missing; expected a regular file"),
    "binary_not_executable": (lambda r: (r / "bin/llama-completion").chmod(0o644),
                              "bin/llama-completion", "not executable"),
    "binary_fifo": (lambda r: _replace_with_fifo(r / "bin/llama-completion"),
                    "bin/llama-completion", "a FIFO; expected a regular file"),
    "bin_symlink": (lambda r: ((r / "bin").rename(r.parent / "bin-elsewhere"),
                               (r / "bin").symlink_to(r.parent / "bin-elsewhere")), "bin",
                    "a symbolic link; expected the directory of the binaries"),
    "converter_missing": (lambda r: (r / "llama.cpp" / "convert_hf_to_gguf.py").unlink(),
                          "llama.cpp/convert_hf_to_gguf.py", "missing"),
    "root_fifo": (lambda r: _replace_with_fifo(r), "", "a FIFO; expected the directory"),
    "root_file": (lambda r: (shutil.rmtree(r), r.write_text("x")), "",
                  "a regular file; expected the directory"),
    "root_symlink": (lambda r: (r.rename(r.parent / "build-elsewhere"),
                                r.symlink_to(r.parent / "build-elsewhere")), "",
                     "a symbolic link; expected the directory"),
}


def test_a_whole_cache_is_accepted_by_path_and_reused_by_build(tmp_path):
    root = _whole(tmp_path / "cache" / f"llama.cpp-{support.build.COMMIT}")
    proc = _tool("path", env_extra={}, tmp_path=tmp_path)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"{root / 'bin'}\n", "")
    # `build` reuses it: no sdist is looked for (this one does not exist).
    proc = _tool("build", env_extra={"DSPARK_LLAMA_CPP_SDIST": str(tmp_path / "none.tar.gz")},
                 tmp_path=tmp_path)
    assert proc.returncode == 0 and str(root / "bin") in proc.stdout, proc.stderr


@pytest.mark.parametrize("case", sorted(TAMPERED))
def test_a_cache_that_is_not_a_whole_build_is_one_line_naming_the_path(case, tmp_path, monkeypatch,
                                                                       deadline):
    root = _whole(tmp_path / "cache" / f"llama.cpp-{support.build.COMMIT}")
    edit, named, says = TAMPERED[case]
    edit(root)
    # A FIFO must not be waited on: a hang is a failure (TimeoutExpired, `deadline`).
    proc = _tool("path", env_extra={}, tmp_path=tmp_path, timeout=20)
    assert proc.returncode == 1 and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert str(root / named).rstrip("/") + ":" in lines[0] and says in lines[0], lines[0]
    assert "replaces it" in lines[0]
    monkeypatch.setenv("DSPARK_ENGINE_CACHE", str(tmp_path / "cache"))
    assert not support.build.is_built()


def test_the_native_build_is_its_own_cache_and_not_the_portable_one(tmp_path, monkeypatch):
    b = support.build
    monkeypatch.setenv("DSPARK_ENGINE_CACHE", str(tmp_path / "cache"))
    assert b.build_dir(native=True).name == f"llama.cpp-{b.COMMIT}-native"
    assert b.expected_info(native=True)["isa_baseline"] == "native"
    assert "-DGGML_NATIVE=ON" in b.expected_info(native=True)["cmake_options"]
    assert "-DGGML_NATIVE=ON" not in b.expected_info()["cmake_options"]
    proc = _tool("path", "--native", env_extra={}, tmp_path=tmp_path)
    assert proc.returncode == 1 and "build --native" in proc.stderr
    _whole(b.build_dir(native=True), native=True)
    assert b.is_built(native=True) and not b.is_built()
    proc = _tool("path", "--native", env_extra={}, tmp_path=tmp_path)
    assert proc.stdout == f"{b.bin_dir(native=True)}\n", proc.stderr
    # A portable build's build-info in the native place is refused, and the reverse.
    _info(b.build_dir(native=True))
    proc = _tool("path", "--native", env_extra={}, tmp_path=tmp_path)
    portable = b.expected_info()["isa_baseline"]
    assert proc.returncode == 1 and f'isa_baseline is "{portable}"' in proc.stderr
    _whole(b.build_dir(), native=True)
    proc = _tool("path", env_extra={}, tmp_path=tmp_path)
    assert proc.returncode == 1 and 'isa_baseline is "native"' in proc.stderr


# --- `build` replaces what is not a whole build ------------------------------------------------

@pytest.mark.parametrize("case", ["info_array", "info_fifo", "info_other_commit",
                                  "binary_directory", "root_fifo", "root_file", "root_symlink"])
def test_replace_puts_a_whole_build_where_a_tampered_cache_was(case, tmp_path, monkeypatch,
                                                               deadline):
    b = support.build
    monkeypatch.setenv("DSPARK_ENGINE_CACHE", str(tmp_path / "cache"))
    final = _whole(b.build_dir())
    TAMPERED[case][0](final)
    aside_target = tmp_path / "cache" / "build-elsewhere"        # root_symlink's target
    work = _whole(tmp_path / "cache" / ".work")
    (work / "bin" / "marker").write_text("new")
    assert b.replace(work, final) == final
    assert b.is_built() and (final / "bin" / "marker").read_text() == "new"
    assert not work.exists()
    left = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert left == sorted([final.name] + (["build-elsewhere"] if case == "root_symlink" else []))
    if case == "root_symlink":               # the link is replaced, never what it points to
        assert b.is_built(aside_target)


def test_replace_keeps_another_runs_whole_build(tmp_path, monkeypatch):
    b = support.build
    monkeypatch.setenv("DSPARK_ENGINE_CACHE", str(tmp_path))
    final = _whole(b.build_dir())
    (final / "bin" / "marker").write_text("first")
    work = _whole(tmp_path / ".work")
    assert b.replace(work, final) == final
    assert (final / "bin" / "marker").read_text() == "first" and not work.exists()


def test_build_does_not_take_a_tampered_cache_and_leaves_it_for_the_next_build(tmp_path):
    root = _whole(tmp_path / "cache" / f"llama.cpp-{support.build.COMMIT}")
    _info(root, commit="b1a2c3d")
    fake = tmp_path / support.build.SDIST_NAME
    fake.write_bytes(b"not the pinned sdist")
    proc = _tool("build", env_extra={"DSPARK_LLAMA_CPP_SDIST": str(fake)}, tmp_path=tmp_path)
    # It went on to build (and refused this sdist), instead of reusing the other commit.
    assert proc.returncode == 1 and "refusing to build it" in proc.stderr
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [root.name]     # no temporary


# --- the CPU ----------------------------------------------------------------------------------

CPU = ("processor\t: {n}\nflags\t\t: fpu sse4_2 avx fma f16c bmi2 {extra}\n\n")


def test_cpu_flags_are_read_from_every_processor(tmp_path):
    b = support.build
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(CPU.format(n=0, extra="avx2 amx_tile amx_int8")
                       + CPU.format(n=1, extra="avx2 amx_tile"))
    # The flags all processors have: the second lacks amx_int8.
    assert b.cpu_flags(cpuinfo) >= {"avx2", "amx_tile"} and "amx_int8" not in b.cpu_flags(cpuinfo)
    assert not b.cpu_has_amx(cpuinfo)
    cpuinfo.write_text(CPU.format(n=0, extra="avx2 amx_tile amx_int8"))
    assert b.cpu_has_amx(cpuinfo)
    assert b.cpu_flags(tmp_path / "none") is None and not b.cpu_has_amx(tmp_path / "none")


@pytest.mark.skipif(not support.build._is_x86_64(), reason="the x86-64-v3 baseline is x86-64's")
def test_a_cpu_without_the_baseline_is_refused_before_anything_is_made(tmp_path, monkeypatch):
    b = support.build
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(CPU.format(n=0, extra="").replace(" fma", ""))
    monkeypatch.setattr(b, "CPUINFO", cpuinfo)
    monkeypatch.setenv("DSPARK_ENGINE_CACHE", str(tmp_path / "cache"))
    assert b.missing_cpu_flags() == ("avx2", "fma")
    assert b.missing_cpu_flags(native=True) == ()           # native: whatever this CPU has
    with pytest.raises(b.BuildError, match=r"lacks avx2, fma, which the x86-64-v3 baseline"):
        b.build()
    assert not (tmp_path / "cache").exists()
    # This machine's CPU runs what `make test` builds (or its build would be refused).
    monkeypatch.setattr(b, "CPUINFO", Path("/proc/cpuinfo"))
    assert b.missing_cpu_flags() == ()


# --- interrupts -------------------------------------------------------------------------------

def _running(pid):
    """Whether ``pid`` is a live process (a zombie nobody reaped is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != b"Z"


def _interrupt_when(proc, line_start, signum):
    """Read the build's stdout until a line starting ``line_start`` (the step it is in),
    then send ``signum``; its exit code, stdout and stderr."""
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith(line_start):
            break
    else:
        proc.wait(timeout=60)
        pytest.fail(f"the build never reached {line_start!r}: {seen} {proc.stderr.read()}")
    return seen


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_while_the_sdist_is_checked_leaves_nothing_and_says_one_line(
        signum, tmp_path):
    # A sparse file of 8 GiB: hashing it takes many seconds, so the signal comes mid-step.
    sdist = tmp_path / support.build.SDIST_NAME
    with open(sdist, "wb") as fh:
        fh.truncate(8 << 30)
    env = {**os.environ, "DSPARK_ENGINE_CACHE": str(tmp_path / "cache"),
           "DSPARK_LLAMA_CPP_SDIST": str(sdist)}
    proc = subprocess.Popen([sys.executable, str(TOOL), "build"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        _interrupt_when(proc, "llama.cpp: checking the SHA-256", signum)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signum, err
    name = signal.Signals(signum).name
    assert err.splitlines() == [f"llama.cpp: build interrupted ({name}); nothing was written"]
    assert list((tmp_path / "cache").iterdir()) == []


# A step whose processes outlive a plain kill of the step: a child that starts a grandchild
# in a process group of its own (as ninja starts each compiler) that ignores SIGTERM.
_TREE = r"""
import os, signal, subprocess, sys, time
grand = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"],
    process_group=0)
open(sys.argv[1] + ".part", "w").write(f"{os.getpid()} {grand.pid}")
os.rename(sys.argv[1] + ".part", sys.argv[1])
time.sleep(600)
"""
_DRIVER = r"""
import importlib.util, sys
from pathlib import Path
sys.path.insert(0, str(Path(sys.argv[1]).parent))   # engine_cache beside it, as a script finds it
spec = importlib.util.spec_from_file_location("llama_cpp_build", sys.argv[1])
b = importlib.util.module_from_spec(spec)
spec.loader.exec_module(b)
b.cache.catch_signals()
try:
    b.run_step([sys.executable, "-c", sys.argv[2], sys.argv[3]], Path(sys.argv[4]), "a tree")
except b.cache.Interrupted as exc:
    sys.exit(128 + exc.signum)
"""


# SIGTERM's case in the slow set (5 s each: the grace before SIGKILL); SIGINT stays the
# fast loop's canary.
@pytest.mark.parametrize("signum", [signal.SIGINT,
                                    pytest.param(signal.SIGTERM, marks=pytest.mark.slow)])
def test_an_interrupt_ends_every_process_of_the_step(signum, tmp_path):
    pids = tmp_path / "pids"
    proc = subprocess.Popen([sys.executable, "-c", _DRIVER, str(TOOL), _TREE, str(pids),
                             str(tmp_path / "log")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not pids.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        child, grand = map(int, pids.read_text().split())
        assert _running(child) and _running(grand)
        proc.send_signal(signum)
        proc.communicate(timeout=support.build.cache.GRACE_S + 30)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signum
    deadline = time.monotonic() + 10
    while (_running(child) or _running(grand)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(child) and not _running(grand)


def _local_sdist():
    """The pinned sdist on this machine: DSPARK_LLAMA_CPP_SDIST, else the copy `make
    llama-cpp` keeps in the engine cache (so these run in CI, after its build)."""
    path = os.environ.get("DSPARK_LLAMA_CPP_SDIST") or str(support.build.cached_sdist())
    if not Path(path).is_file():
        # A cache built before the sdist was kept (or with DSPARK_LLAMA_CPP_SDIST) has none:
        # a skip, not a failure, as the build it would need is whole and not redone.
        pytest.skip("interrupting a real compile needs the pinned sdist locally: "
                    f"{path} is missing (`make llama-cpp` keeps it there when it downloads "
                    "it), or set DSPARK_LLAMA_CPP_SDIST to a copy of " + support.build.SDIST_NAME)
    return Path(path)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_during_the_compile_ends_cmake_ninja_and_the_compilers(signum, tmp_path):
    sdist = _local_sdist()
    cache = tmp_path / "cache"
    env = {**os.environ, "DSPARK_ENGINE_CACHE": str(cache), "DSPARK_LLAMA_CPP_SDIST": str(sdist)}
    proc = subprocess.Popen([sys.executable, str(TOOL), "build", "-j", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    def of_this_build():
        """The command lines of the running processes that name this build's cache."""
        found = {}
        for entry in Path("/proc").iterdir():
            try:
                cmdline = (entry / "cmdline").read_bytes() if entry.name.isdigit() else b""
            except OSError:
                continue                                  # gone meanwhile
            if str(cache).encode() in cmdline and _running(entry.name):
                found[int(entry.name)] = cmdline
        return found

    try:
        _interrupt_when(proc, "llama.cpp: build llama-", signum)
        deadline = time.monotonic() + 120            # until a compiler of this build runs
        while not any(b"cc1" in cmd for cmd in of_this_build().values()):
            assert time.monotonic() < deadline, "no compiler of this build was seen running"
            time.sleep(0.1)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=support.build.cache.GRACE_S + 60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signum, err
    name = signal.Signals(signum).name
    assert err.splitlines() == [f"llama.cpp: build interrupted ({name}); nothing was written"]
    assert list(cache.iterdir()) == []
    assert of_this_build() == {}


def test_a_downloaded_sdist_is_kept_whole_and_reused_only_when_its_sha256_matches(tmp_path,
                                                                                 monkeypatch):
    """The cache keeps a download (a second variant, a rebuild, the interrupt tests need
    none): copied whole into cache/sdist/, and used again only after its SHA-256 is
    checked; a kept file of other bytes is never built from."""
    b = support.build
    monkeypatch.setenv("DSPARK_ENGINE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("DSPARK_LLAMA_CPP_SDIST", raising=False)
    data = b"an sdist's bytes"
    monkeypatch.setattr(b, "SDIST_SHA256", hashlib.sha256(data).hexdigest())
    fetched = tmp_path / "downloaded.tar.gz"
    fetched.write_bytes(data)
    b._keep(fetched)
    kept = b.cached_sdist()
    assert kept.read_bytes() == data and [p.name for p in kept.parent.iterdir()] == [kept.name]
    work = tmp_path / "work"
    work.mkdir()
    assert b.fetch_sdist(work) == kept and not (work / "download").exists()   # no download
    kept.write_bytes(b"other bytes")
    downloads = []
    monkeypatch.setattr(b, "download_sdist", lambda dest: downloads.append(dest) or dest / "x")
    with pytest.raises(b.BuildError, match="no such sdist"):       # the index was asked instead
        b.fetch_sdist(work)
    assert downloads == [work / "download"]


def _index(root: Path, page: str, body: bytes) -> str:
    """A package index on disk (file:// URLs, as pip reads them): ``page`` is the project
    page's file name in ``root/llama-cpp-python/``."""
    project = root / "llama-cpp-python"
    project.mkdir(parents=True)
    (project / page).write_bytes(body)
    return root.as_uri()


def test_the_sdist_is_fetched_from_the_index_without_a_build_step(tmp_path, monkeypatch):
    """The sdist is found on the index's page (PEP 503 HTML here), downloaded by the standard
    library and checked, and no process runs (pip download would build its metadata in an
    isolated, unpinned environment)."""
    b = support.build
    data = b"an sdist's bytes"
    monkeypatch.setattr(b, "SDIST_SHA256", hashlib.sha256(data).hexdigest())
    monkeypatch.setenv("DSPARK_ENGINE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("DSPARK_LLAMA_CPP_SDIST", raising=False)
    files = tmp_path / "files"
    files.mkdir()
    (files / b.SDIST_NAME).write_bytes(data)
    page = (f'<html><body><a href="other-1.0.tar.gz">x</a><a href="../../files/'
            f'{b.SDIST_NAME}#sha256=00">{b.SDIST_NAME}</a></body></html>').encode()
    monkeypatch.setenv("PIP_INDEX_URL", _index(tmp_path / "simple", "index.html", page))
    monkeypatch.setattr(b, "run_step", lambda *a, **k: pytest.fail("a process ran"))
    work = tmp_path / "work"
    work.mkdir()
    got = b.fetch_sdist(work)
    assert got == work / "download" / b.SDIST_NAME and got.read_bytes() == data
    assert b.cached_sdist().read_bytes() == data


@pytest.mark.parametrize("page, body, says", [
    ("index.html", b'<a href="llama_cpp_python-0.3.35.tar.gz">old</a>', "no llama_cpp_python-"),
    ("index.html", b"{not json", "not the simple API's JSON"),
    ("index.html", b'{"files": [{"filename": 3}]}', "no llama_cpp_python-"),
    ("index.html", b'{"files": 3}', "not the simple API's JSON"),
    ("index.html", b"<a>" * (4 << 20), "over 8388608 bytes"),
    ("other.html", b"", "expected the index's page of llama-cpp-python"),
])
def test_an_index_page_without_the_sdist_is_one_line_naming_the_page(page, body, says, tmp_path,
                                                                     monkeypatch):
    b = support.build
    index = _index(tmp_path / "simple", page, body)
    with pytest.raises(b.BuildError) as caught:
        b.sdist_url(index)
    message = str(caught.value)
    assert "\n" not in message and says in message, message
    assert message.startswith(f"{index}/llama-cpp-python/"), message
