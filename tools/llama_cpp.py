"""llama.cpp, built from its registry package: the engine the llama.cpp tests run (issue 20).

The one place that names the pinned version. llama.cpp has no PyPI package of its own; the
sdist of ``llama-cpp-python`` vendors it (``vendor/llama.cpp``), so that sdist, checked by
its SHA-256, is the source. ``make llama-cpp`` (and so ``make test``) runs ``build``:

    python tools/llama_cpp.py build     # download, check, unpack, configure, build; reused
    python tools/llama_cpp.py path      # print the directory of a finished build

The build lives outside the checkout, in ``$DSPARK_ENGINE_CACHE`` (default
``~/.cache/dspark-convert``) under ``llama.cpp-<commit>/``:

    bin/                 the binaries (linked statically: no RPATH into a build tree)
    llama.cpp/           the unpacked vendor/llama.cpp (its convert_hf_to_gguf.py and
                         gguf-py: the equivalence tests run llama.cpp's own converter)
    build-info.json      version, commit, sdist SHA-256, the cmake options, the binaries

It is built in a hidden temporary sibling and renamed into place when complete, so a
directory of that name is always a whole build; a killed build leaves only a temporary,
removed by the next run. ``DSPARK_LLAMA_CPP_SDIST=PATH`` uses a local copy of the sdist
instead of downloading it (its SHA-256 is checked all the same).

Standard library only: it runs before (and without) the package's own environment.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGE = "llama-cpp-python"
VERSION = "0.3.36"
SDIST_NAME = f"llama_cpp_python-{VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
COMMIT = "0c1e570"                       # the llama.cpp commit the sdist vendors
VENDORED = f"llama_cpp_python-{VERSION}/vendor/llama.cpp"
# What the tests run: speculative decoding, the target alone. Nothing else is built.
BINARIES = ("llama-speculative-simple", "llama-completion")
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
INFO_FILE = "build-info.json"
TMP_MARK = ".tmp-"


class BuildError(Exception):
    """A step failed; the message says which and what to do."""


def cache_root() -> Path:
    return Path(os.environ.get("DSPARK_ENGINE_CACHE")
                or Path.home() / ".cache" / "dspark-convert")


def build_dir() -> Path:
    return cache_root() / f"llama.cpp-{COMMIT}"


def bin_dir() -> Path:
    return build_dir() / "bin"


def source_dir() -> Path:
    """The unpacked vendor/llama.cpp of a finished build."""
    return build_dir() / "llama.cpp"


def is_built(root: Path | None = None) -> bool:
    root = root or build_dir()
    try:
        info = json.loads((root / INFO_FILE).read_text())
    except (OSError, ValueError):
        return False
    return (info.get("sdist_sha256") == SDIST_SHA256
            and all(os.access(root / "bin" / name, os.X_OK) for name in BINARIES))


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _run(cmd: list[str], log: Path, what: str, cwd: Path | None = None) -> None:
    print(f"llama.cpp: {what} (log: {log})", flush=True)
    with open(log, "ab") as out:
        done = subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise BuildError(f"{what} failed (exit {done.returncode}): {' '.join(cmd)}\n"
                         + "\n".join(tail))


def fetch_sdist(work: Path) -> Path:
    """The sdist, from DSPARK_LLAMA_CPP_SDIST or downloaded with pip, SHA-256 checked.
    pip prepares the sdist's metadata in an isolated build environment (about a minute)."""
    local = os.environ.get("DSPARK_LLAMA_CPP_SDIST")
    if local:
        sdist = Path(local)
    else:
        dl = work / "download"
        dl.mkdir()
        _run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check",
              "--no-deps", "--no-binary", ":all:", f"{PACKAGE}=={VERSION}", "-d", str(dl)],
             work / "download.log", f"pip download {PACKAGE}=={VERSION}")
        sdist = dl / SDIST_NAME
    if not sdist.is_file():
        raise BuildError(f"{sdist}: no such sdist (expected {SDIST_NAME})")
    got = sha256_of(sdist)
    if got != SDIST_SHA256:
        raise BuildError(f"{sdist}: SHA-256 {got}, expected {SDIST_SHA256} "
                         f"({PACKAGE}=={VERSION}); refusing to build it")
    return sdist


def unpack(sdist: Path, dest: Path) -> Path:
    """vendor/llama.cpp of the sdist, moved to ``dest``. The 'data' filter refuses links
    and paths that leave the directory."""
    staging = dest.parent / "sdist"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(VENDORED + "/")]
        if not members:
            raise BuildError(f"{sdist}: no {VENDORED}/ inside")
        tar.extractall(staging, members=members, filter="data")
    (staging / VENDORED).rename(dest)
    shutil.rmtree(staging)
    return dest


def build(*, jobs: int | None = None) -> Path:
    """Build into the cache unless a whole build is there; returns the build directory."""
    final = build_dir()
    if is_built(final):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(final)
    work = Path(tempfile.mkdtemp(prefix=f".{final.name}{TMP_MARK}{os.getpid()}-",
                                 dir=final.parent))
    try:
        sdist = fetch_sdist(work)
        # The real path: configured through a symlinked one, ninja loops on "build.ninja
        # still dirty" (docs/REFERENCE.md §6b).
        src = unpack(sdist, work / "llama.cpp").resolve()
        tree = (work / "cmake-build").resolve()
        log = work / "build.log"
        _run(["cmake", "-S", str(src), "-B", str(tree), *CMAKE_OPTIONS], log, "cmake configure")
        jobs = jobs or os.cpu_count() or 2
        _run(["cmake", "--build", str(tree), "--target", *BINARIES, "-j", str(jobs)], log,
             f"build {', '.join(BINARIES)} with {jobs} jobs (a few minutes)")
        (work / "bin").mkdir()
        for name in BINARIES:
            shutil.copy2(tree / "bin" / name, work / "bin" / name)
        shutil.rmtree(tree)             # ~100 MB of objects nobody reads again
        shutil.rmtree(work / "download", ignore_errors=True)   # the 76 MB sdist, unpacked
        info = {"package": PACKAGE, "version": VERSION, "sdist_sha256": SDIST_SHA256,
                "commit": COMMIT, "isa_baseline": ISA_BASELINE,
                "cmake_options": list(CMAKE_OPTIONS),
                "binaries": list(BINARIES)}
        (work / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
        if is_built(final):             # another run finished first: keep its build
            shutil.rmtree(work)
            return final
        if final.exists():              # an incomplete or stale build: replaced whole
            shutil.rmtree(final)
        work.rename(final)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return final


def _remove_stale(final: Path) -> None:
    """Temporaries of builds that were killed (their process is gone)."""
    prefix = f".{final.name}{TMP_MARK}"
    for entry in final.parent.glob(prefix + "*"):
        pid = entry.name[len(prefix):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
    # util/atomic._pid_alive's twin, not an import: this script runs without the package.
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build llama.cpp into the cache unless it is there")
    b.add_argument("-j", "--jobs", type=int, default=None)
    sub.add_parser("path", help="print the bin directory of a finished build (exit 1: none)")
    args = parser.parse_args(argv)
    if args.command == "path":
        if not is_built():
            print(f"llama.cpp {COMMIT} is not built in {build_dir()}: run `make llama-cpp`",
                  file=sys.stderr)
            return 1
        print(bin_dir())
        return 0
    try:
        root = build(jobs=args.jobs)
    except (BuildError, OSError) as exc:
        print(f"llama.cpp: {exc}", file=sys.stderr)
        return 1
    print(f"llama.cpp {COMMIT} ({PACKAGE} {VERSION}): {root / 'bin'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
