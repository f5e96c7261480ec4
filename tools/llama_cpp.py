"""llama.cpp, built from its registry package: the engine the llama.cpp tests run.

The one place that names the pinned version. llama.cpp has no PyPI package of its own; the
sdist of ``llama-cpp-python`` vendors it (``vendor/llama.cpp``), so that sdist, checked by
its SHA-256, is the source. ``make llama-cpp`` (and so ``make test``) runs ``build``:

    python tools/llama_cpp.py build     # download, check, unpack, configure, build; reused
    python tools/llama_cpp.py path      # print the bin directory of a whole build (exit 1: none)
    python tools/llama_cpp.py build --native   # -march=native, only to reproduce the
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

The sdist is obtained without a build step, so nothing unpinned runs: the file named
``llama_cpp_python-<version>.tar.gz`` is looked up on the package index's project page (the
simple API, PEP 691 JSON or PEP 503 HTML; ``$PIP_INDEX_URL`` when set, as pip reads it, else
https://pypi.org/simple), downloaded by the standard library, bounded, and its SHA-256
checked before anything reads it. (``pip download --no-binary :all:`` would first prepare
the sdist's metadata in an isolated build environment of scikit-build-core and what it
needs, resolved unpinned from the registry the day it runs.) The build itself runs only
cmake, ninja and the compiler on the checked source: no Python build backend at all.

Standard library only: it runs before (and without) the package's own environment. What it
shares with tools/dspark_mlx.py and tools/speculators.py (the cache's location, removing,
temporaries, signals, the bounded read of the info file) is tools/engine_cache.py's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from html.parser import HTMLParser
from pathlib import Path
from typing import NamedTuple

import engine_cache as cache   # tools/engine_cache.py, beside it: the cache, removing, signals

PACKAGE = "llama-cpp-python"
VERSION = "0.3.36"
SDIST_NAME = f"llama_cpp_python-{VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST_MAX_BYTES = 256 << 20              # the pinned sdist is 76.6 MB
COMMIT = "0c1e570"                       # the llama.cpp commit the sdist vendors
# Where the sdist is looked up: pip's index variable when set, else PyPI's simple API.
DEFAULT_INDEX = "https://pypi.org/simple"
INDEX_PAGE_MAX_BYTES = 8 << 20           # PyPI's page of llama-cpp-python is ~1 MB of JSON
NETWORK_TIMEOUT_S = 60                   # per connection and per read
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
# Portable code, never -march=native: a native build on a CPU with AMX repacks
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
# The native build: whatever this CPU has, AMX included. Only to
# reproduce the AMX crash; `make test` never builds or runs it.
NATIVE_OPTIONS = BASE_OPTIONS + ("-DGGML_NATIVE=ON",)
INFO_FILE = "build-info.json"
INFO_MAX_BYTES = 64 * 1024      # ours is under 2 KiB; a bigger file is not ours (read bounded)
CPUINFO = Path("/proc/cpuinfo")


class BuildError(Exception):
    """A step failed; the message says which and what to do."""


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


def build_dir(native: bool = False) -> Path:
    return cache.cache_root() / f"llama.cpp-{COMMIT}{variant(native).suffix}"


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
    in a native build."""
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

def read_info(path: Path) -> dict:
    """build-info.json as a JSON object, read without following a link, without waiting on
    a FIFO (O_NONBLOCK) and at most INFO_MAX_BYTES; BuildError naming what was found."""
    expected = (f"expected the JSON object tools/llama_cpp.py writes (at most {INFO_MAX_BYTES} "
                "bytes)")
    return cache.read_json_object(path, INFO_MAX_BYTES, expected, BuildError)


def _check_entry(path: Path, want_dir: bool, what: str) -> None:
    """``path`` is a real directory or a regular executable file (never a link: a whole
    build holds none, and a link may point anywhere)."""
    cache.check_entry(path, want_dir, what, BuildError)


def check_build(root: Path | None = None, *, native: bool = False) -> None:
    """None when ``root`` (default: the cache's) is a whole build of the pinned commit in
    this variant; else BuildError, one line naming the path and what was expected."""
    root = build_dir(native) if root is None else root
    _check_entry(root, True, f"the directory of a llama.cpp {COMMIT} build")
    info_path = root / INFO_FILE
    cache.check_info(info_path, read_info(info_path), expected_info(native), BuildError)
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
                cache.end_processes(proc)
            raise
    if code != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise BuildError(f"{what} failed (exit {code}): {' '.join(cmd)}\n" + "\n".join(tail))


def cached_sdist() -> Path:
    """Where a downloaded sdist is kept (SHA-256 checked before it is put there and again
    each time it is used): a second variant's build (--native), a rebuild of a tampered
    cache and the tests that interrupt a real compile need no second download."""
    return cache.cache_root() / "sdist" / SDIST_NAME


def _keep(sdist: Path) -> None:
    """A checked download copied to cached_sdist(), whole or not at all (a temporary
    renamed into place); a cache that cannot take it is only a lost shortcut."""
    dest = cached_sdist()
    tmp = dest.with_name(f".{dest.name}{cache.TMP_MARK}{os.getpid()}")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(sdist, tmp)
        os.replace(tmp, dest)
    except OSError as exc:
        print(f"llama.cpp: the sdist is not kept in {cache.shown(dest.parent)} "
              f"({exc.strerror or exc}); the next build downloads it again", flush=True)
    finally:
        cache.remove_quietly(tmp)


class _Links(HTMLParser):
    """The href of every <a> of a PEP 503 page."""

    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag, attrs) -> None:
        if tag == "a":
            self.hrefs += [value for name, value in attrs if name == "href" and value]


def _open(url: str, what: str, accept: str | None = None):
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        return urllib.request.urlopen(request, timeout=NETWORK_TIMEOUT_S)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise BuildError(f"{url}: {reason}; expected {what}") from None


def sdist_url(index: str) -> str:
    """The URL of SDIST_NAME on ``index``'s project page of PACKAGE (PEP 691 JSON or PEP 503
    HTML, read bounded); BuildError naming the page when it does not list it."""
    page = f"{index.rstrip('/')}/{PACKAGE}/"
    expected = f"the index's page of {PACKAGE}, listing {SDIST_NAME}"
    # A local index (file://) is a tree of directories, each page its index.html (as pip reads it).
    where = page + "index.html" if page.startswith("file:") else page
    with _open(where, expected, "application/vnd.pypi.simple.v1+json, text/html;q=0.1") as resp:
        kind = resp.headers.get_content_type() if resp.headers else ""
        body = resp.read(INDEX_PAGE_MAX_BYTES + 1)
    if len(body) > INDEX_PAGE_MAX_BYTES:
        raise BuildError(f"{page}: over {INDEX_PAGE_MAX_BYTES} bytes; expected {expected}")
    hrefs: list[str] = []
    if kind == "application/vnd.pypi.simple.v1+json" or body.lstrip().startswith(b"{"):
        try:
            files = json.loads(body)["files"]
            hrefs = [f["url"] for f in files if f.get("filename") == SDIST_NAME]
        except (ValueError, KeyError, TypeError, AttributeError):
            raise BuildError(f"{page}: not the simple API's JSON; expected {expected}") from None
    else:
        links = _Links()
        links.feed(body.decode("utf-8", "replace"))
        hrefs = links.hrefs
    for href in hrefs:
        url = urllib.parse.urljoin(page, href)
        if urllib.parse.unquote(urllib.parse.urlparse(url).path).rsplit("/", 1)[-1] == SDIST_NAME:
            return url
    raise BuildError(f"{page}: no {SDIST_NAME}; expected {expected}")


def download_sdist(dest: Path) -> Path:
    """SDIST_NAME from the index into ``dest`` (a new directory), at most SDIST_MAX_BYTES;
    no code of it runs (its SHA-256 is checked by the caller before it is read)."""
    index = os.environ.get("PIP_INDEX_URL") or DEFAULT_INDEX
    print(f"llama.cpp: downloading {SDIST_NAME} from {index}", flush=True)
    url = sdist_url(index)
    dest.mkdir()
    out = dest / SDIST_NAME
    size = 0
    with _open(url, f"the {PACKAGE} {VERSION} sdist") as resp, open(out, "wb") as fh:
        for block in iter(lambda: resp.read(1 << 20), b""):
            size += len(block)
            if size > SDIST_MAX_BYTES:
                raise BuildError(f"{url}: over {SDIST_MAX_BYTES} bytes; expected the "
                                 f"{PACKAGE} {VERSION} sdist")
            fh.write(block)
    return out


def fetch_sdist(work: Path) -> Path:
    """The sdist, from DSPARK_LLAMA_CPP_SDIST, else the one kept in the cache, else
    downloaded from the index (and then kept), SHA-256 checked each time."""
    local = os.environ.get("DSPARK_LLAMA_CPP_SDIST")
    kept = cached_sdist()
    downloaded = False
    if local:
        sdist = Path(local)
    elif kept.is_file() and not kept.is_symlink() and cache.sha256_of(kept) == SDIST_SHA256:
        sdist = kept
    else:
        sdist = download_sdist(work / "download")
        downloaded = True
    if not sdist.is_file():
        raise BuildError(f"{cache.shown(sdist)}: no such sdist (expected {SDIST_NAME})")
    print(f"llama.cpp: checking the SHA-256 of {cache.shown(sdist)}", flush=True)
    got = cache.sha256_of(sdist)
    if got != SDIST_SHA256:
        raise BuildError(f"{cache.shown(sdist)}: SHA-256 {got}, expected {SDIST_SHA256} "
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
            raise BuildError(f"{cache.shown(sdist)}: no {VENDORED}/ inside")
        tar.extractall(staging, members=members, filter="data")
    (staging / VENDORED).rename(dest)
    shutil.rmtree(staging)
    return dest


def replace(work: Path, final: Path, *, native: bool = False) -> Path:
    """``work`` (a whole build) put at ``final``: whatever was there (a stale or tampered
    cache, a file, a FIFO, a link) is renamed aside and removed, so ``final`` is always either
    the old entry or the new build. Another run's whole build that got there first is kept
    and ``work`` removed."""
    return cache.put_in_place(work, final, lambda root: is_built(root, native=native))


def build(*, jobs: int | None = None, native: bool = False) -> Path:
    """Build into the cache unless a whole build is there (anything else there is replaced);
    returns the build directory."""
    final = build_dir(native)
    if is_built(final, native=native):
        return final
    missing = missing_cpu_flags(native)
    if missing:
        raise BuildError(f"this CPU ({cache.shown(CPUINFO)}) lacks {', '.join(missing)}, which the "
                         f"{variant(native).isa_baseline} baseline needs; refusing to build "
                         "code it cannot run")
    final.parent.mkdir(parents=True, exist_ok=True)
    cache.remove_stale(final)
    # Named before it is made: an interrupt at any point finds it to remove.
    work = cache.temporary(final, "build")
    try:
        cache.remove(work)              # a killed earlier process of this pid's, if any
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
        cache.remove_quietly(work)
        raise


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
                         "reproduce the AMX crash (docs/REFERENCE.md §6); the tests use the portable one")
    args = parser.parse_args(argv)
    flag = " --native" if args.native else ""
    how = f"`python tools/llama_cpp.py build{flag}`" + ("" if args.native
                                                        else " (`make llama-cpp`)")
    if args.command == "path":
        root = build_dir(args.native)
        if not os.path.lexists(root):
            print(f"llama.cpp {COMMIT}{flag} is not built in {cache.shown(root)}: run {how}",
                  file=sys.stderr)
            return 1
        problem = build_problem(root, native=args.native)
        if problem:
            print(f"llama.cpp: not a whole {COMMIT} build: {problem}; {how} replaces it",
                  file=sys.stderr)
            return 1
        print(bin_dir(args.native))
        return 0
    cache.catch_signals()
    try:
        root = build(jobs=args.jobs, native=args.native)
    except cache.Interrupted as exc:
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
