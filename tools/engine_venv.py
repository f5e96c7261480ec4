"""A virtual environment of pinned wheels in the engine cache: what tools/dspark_mlx.py and
tools/speculators.py share about their installs.

- Installing: ``run_step`` runs a step (``python -m venv``, ``pip install --require-hashes``)
  in a session of its own, logged, ended whole on an interrupt; ``remove_console_scripts``
  removes what pip and venv wrote into ``venv/bin`` (it names the temporary directory).
- Checking: ``check_distributions`` (the venv's site-packages holds exactly the pinned
  distributions at their versions, every file each one's RECORD lists with a hash has that
  hash, and nothing else is there, no link either: ``distributions``, ``check_record``,
  ``check_accounted``, names compared as ``normal_name`` makes them), ``check_python`` (the
  interpreter probed with ``-I -S``, so no code of site-packages runs before that check;
  ``check_venv_config``), ``check_closed`` (the pins meet each other's requirements:
  tools/pins_closed.py), ``check_dir`` and ``read_bounded`` (the engine cache's, raising
  InstallError).

Standard library only: it runs before (and without) the package's own environment
(``check_closed`` alone, run by ``install``, loads tools/pins_closed.py, which needs
``packaging``: the project's interpreter, which make runs the installers with, has it). The
scripts import it by its plain name, beside them, as it imports tools/engine_cache.py.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import importlib.util
import io
import os
import platform
import stat
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import engine_cache as cache   # tools/engine_cache.py, beside it

RECORD_MAX_BYTES = 16 << 20     # the largest RECORD of the pins is ~600 KB
VENV_CONFIG_MAX_BYTES = 64 * 1024   # venv writes ~200 bytes


class InstallError(Exception):
    """A step failed or the cache is not a whole install; the message says which."""


def normal_name(name: str) -> str:
    """A distribution's name as PEP 503 compares it."""
    out, dash = [], False
    for c in name.lower():
        if c in "-_.":
            dash = True
            continue
        if dash and out:
            out.append("-")
        dash = False
        out.append(c)
    return "".join(out)


# --- is this a whole install ---------------------------------------------------------------

def read_bounded(path: Path, limit: int, expected: str) -> bytes:
    """A regular file's bytes, never following a link nor waiting on a FIFO, at most
    ``limit``; InstallError naming what was found."""
    return cache.read_bounded(path, limit, expected, InstallError)


def check_dir(path: Path, what: str) -> None:
    """``path`` is a real directory (not a link to one); else InstallError naming it."""
    cache.check_entry(path, True, what, InstallError)


def distributions(site: Path) -> dict[str, tuple[str, Path]]:
    """normalised name -> (version, its .dist-info directory), from the directory names."""
    found: dict[str, tuple[str, Path]] = {}
    for entry in sorted(site.iterdir()):
        if not entry.name.endswith(".dist-info"):
            continue
        name, sep, version = entry.name[: -len(".dist-info")].rpartition("-")
        if not sep:
            raise InstallError(f"{cache.shown(entry)}: not a NAME-VERSION.dist-info directory")
        found[normal_name(name)] = (version, entry)
    return found


def _urlsafe_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode("ascii")


def check_record(site: Path, dist_info: Path) -> set[str]:
    """Every file a distribution's RECORD lists with a hash has that hash (console scripts
    outside site-packages, which `install` removes, aside); returns the paths it lists in
    site-packages (hashed or not: RECORD itself, compiled files)."""
    record = dist_info / "RECORD"
    data = read_bounded(record, RECORD_MAX_BYTES, "expected the RECORD pip wrote")
    listed: set[str] = set()
    for row in csv.reader(io.StringIO(data.decode("utf-8", "replace"))):
        if len(row) != 3:
            raise InstallError(f"{cache.shown(record)}: a row of {len(row)} fields; expected "
                               "path, hash, size")
        rel, digest, _ = row
        if rel.startswith("../"):
            continue                    # console scripts in venv/bin: removed by install
        listed.add(os.path.normpath(rel))
        if not digest:
            continue                    # RECORD itself, compiled files: pip lists no hash
        algo, _, want = digest.partition("=")
        path = site / rel
        if algo != "sha256":
            raise InstallError(f"{cache.shown(record)}: {rel} hashed with {algo!r}; expected "
                               "sha256")
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            raise InstallError(f"{cache.shown(path)}: missing; {dist_info.name}'s RECORD "
                               "lists it") from None
        if not stat.S_ISREG(mode):
            raise InstallError(f"{cache.shown(path)}: {cache.kind(mode)}; expected the "
                               f"regular file {dist_info.name}'s RECORD lists")
        if _urlsafe_sha256(path) != want:
            raise InstallError(f"{cache.shown(path)}: its SHA-256 is not the one "
                               f"{dist_info.name}'s RECORD lists (changed since pip installed it)")
    return listed


def _compiled_from_listed(rel: str, listed: set[str]) -> bool:
    """``rel`` is CPython's compiled form of a listed module (``pkg/__pycache__/m.cpython-311
    .pyc`` of ``pkg/m.py``), as the interpreter writes it at run time; pip lists those it
    compiles itself."""
    head, name = os.path.split(rel)
    parent, cache_dir = os.path.split(head)
    tag = sys.implementation.cache_tag
    if cache_dir != "__pycache__" or not name.endswith(".pyc") or f".{tag}" not in name:
        return False
    return os.path.join(parent, name.split(f".{tag}")[0] + ".py") in listed


def check_accounted(site: Path, listed: set[str], allowed: tuple[str, ...] = ()) -> None:
    """Every entry under ``site`` is a file a pinned distribution's RECORD lists (``listed``),
    a directory holding one, a compiled form of a listed module, or one of ``allowed`` (top
    level); none is a symbolic link. A stray ``sitecustomize.py``, ``usercustomize.py`` or
    ``.pth`` would run at every start of the interpreter, a link could hand a pinned name to
    code outside the cache: InstallError, one line naming the path."""
    dirs = {os.path.dirname(rel) for rel in listed}
    for rel in list(dirs):
        while rel:
            rel = os.path.dirname(rel)
            dirs.add(rel)
    for top, subdirs, files in os.walk(site):
        for name in sorted(subdirs + files):
            path = Path(top) / name
            rel = os.path.relpath(path, site)
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                raise InstallError(f"{cache.shown(path)}: a symbolic link to "
                                   f"{cache.shown(os.readlink(path))}; a whole install holds "
                                   "none in site-packages")
            if rel in allowed:
                continue
            if stat.S_ISDIR(mode):
                if rel in dirs or (name == "__pycache__" and os.path.dirname(rel) in dirs):
                    continue
            elif rel in listed or _compiled_from_listed(rel, listed):
                continue
            raise InstallError(f"{cache.shown(path)}: {cache.kind(mode)} no pinned "
                               "distribution's RECORD lists; expected only the pinned "
                               "distributions' files")
        subdirs[:] = [d for d in subdirs if os.path.join(os.path.relpath(top, site), d)
                      .removeprefix("./") not in allowed]


def check_distributions(site: Path, pins: tuple[tuple[str, str, str], ...],
                        allowed: tuple[str, ...] = ()) -> None:
    """``site`` holds exactly the pinned distributions ((name, version, sha256) each) at
    their versions, each one's files are those its RECORD lists, and nothing else is there
    (``allowed`` aside: names at its top level); else InstallError, one line naming the path
    and what was expected."""
    found = distributions(site)
    want = {normal_name(name): version for name, version, _ in pins}
    for name, version in want.items():
        if name not in found:
            raise InstallError(f"{cache.shown(site)}: no {name} distribution; expected "
                               f"{name}=={version}")
        if found[name][0] != version:
            raise InstallError(f"{cache.shown(found[name][1])}: {name} {found[name][0]}; "
                               f"expected {version}")
    extra = sorted(set(found) - set(want))
    if extra:
        raise InstallError(f"{cache.shown(found[extra[0]][1])}: {extra[0]} is installed and "
                           "not pinned; expected the pinned distributions only")
    listed: set[str] = set()
    for name in sorted(want):
        listed |= check_record(site, found[name][1])
    check_accounted(site, listed, allowed)


def _pins_closed():
    """tools/pins_closed.py, beside this file (it needs ``packaging``: the project's
    interpreter, which ``make`` runs the installers with, has it)."""
    if "pins_closed" not in sys.modules:
        spec = importlib.util.spec_from_file_location("pins_closed",
                                                      Path(__file__).with_name("pins_closed.py"))
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except ImportError as exc:
            raise InstallError(f"checking that the pins are closed needs {exc.name}: run this "
                               "script with the project's interpreter (.venv/bin/python, as "
                               "make does)") from None
        sys.modules["pins_closed"] = module
    return sys.modules["pins_closed"]


def check_closed(sites: list[Path], pins: dict[str, str], roots: list[str], *,
                 omitted: tuple[tuple[str, str], ...] = ()) -> None:
    """The distributions in ``sites`` are the pins (name -> version), and every requirement
    of the ``roots`` and of each pin (their METADATA's, markers and extras evaluated for this
    interpreter) is met by a pin, ``omitted`` aside (tools/pins_closed.py); else InstallError
    naming the first requirement and the pin. pip installs with --no-deps: this is the proof
    that the set is whole."""
    closed = _pins_closed()
    try:
        found = closed.installed(sites)
    except closed.MetadataError as exc:
        raise InstallError(str(exc)) from None
    problems = (closed.installed_not_pinned(pins, found)
                or closed.open_requirements(pins, {n: r for n, (_, r) in found.items()}, roots,
                                            omitted=omitted))
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise InstallError(f"the pins are not closed: {problems[0]}{more}")


# --- installing ---------------------------------------------------------------------------

def run_step(package: str, cmd: list[str], log: Path, what: str) -> None:
    """One step of ``package``'s install, announced on stdout, its output appended to
    ``log``, in a session of its own (ended whole, with its children, on an interrupt);
    InstallError with the log's last lines when it fails."""
    print(f"{package}: {what} (log: {log})", flush=True)
    with open(log, "ab") as out:
        proc = None
        try:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            code = proc.wait()
        except FileNotFoundError:
            raise InstallError(f"{what}: {cmd[0]} not found") from None
        except BaseException:
            if proc is not None:
                cache.end_processes(proc)
            raise
    if code != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise InstallError(f"{what} failed (exit {code}): {' '.join(cmd)}\n" + "\n".join(tail))


def remove_console_scripts(root: Path) -> None:
    """The scripts in venv/bin (pip's console scripts, venv's activate scripts) name the
    temporary directory the install was made in; only the interpreter's links are kept."""
    for entry in (root / "venv" / "bin").iterdir():
        if not entry.name.startswith("python"):
            cache.remove(entry)


def venv_main(argv: list[str] | None, *, description: str, package: str, version: str,
              how: str, install_dir: Callable[[], Path],
              install_problem: Callable[[Path], str | None],
              python_path: Callable[..., Path], install: Callable[[], Path],
              is_installed: Callable[[], bool], done: Callable[[Path, float], str]) -> int:
    """The command line every pinned-venv engine script has (tools/dspark_mlx.py,
    tools/speculators.py): ``install`` (a whole install reused, anything else replaced;
    Ctrl-C / SIGTERM leave nothing, exit 128 + the signal) and ``path`` (the interpreter of a
    whole install, else exit 1 saying why). ``how``: the command that installs, for the
    messages; ``done(root, seconds)``: the line printed after an install."""
    parser = argparse.ArgumentParser(description=description)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("install", help="install the pins into the cache unless a whole install is "
                   "there (anything else there is replaced)")
    sub.add_parser("path", help="print the interpreter of a whole install (exit 1: none)")
    args = parser.parse_args(argv)
    if args.command == "path":
        root = install_dir()
        if not os.path.lexists(root):
            print(f"{package} {version} is not installed in {cache.shown(root)}: run {how}",
                  file=sys.stderr)
            return 1
        problem = install_problem(root)
        if problem:
            print(f"{package}: not a whole {version} install: {problem}; {how} replaces it",
                  file=sys.stderr)
            return 1
        print(python_path(root))
        return 0
    cache.catch_signals()
    started = time.monotonic()
    try:
        root = install()
    except cache.Interrupted as exc:
        if is_installed():
            print(f"{package}: {exc.name} after the install was in place: {python_path()}",
                  file=sys.stderr)
        else:
            print(f"{package}: install interrupted ({exc.name}); nothing was written",
                  file=sys.stderr)
        return 128 + exc.signum
    except (InstallError, OSError) as exc:
        print(f"{package}: {exc}", file=sys.stderr)
        return 1
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(done(root, time.monotonic() - started))
    return 0


def site_packages(root: Path, python: tuple[int, int]) -> Path:
    """The site-packages of an install's venv (``root/venv``) for CPython ``python``."""
    return root / "venv" / "lib" / f"python{python[0]}.{python[1]}" / "site-packages"


def check_python(interpreter: Path, python: tuple[int, int], *, seconds: float = 60) -> None:
    """The venv's interpreter is an executable (a venv's is a link to the base interpreter)
    and runs as CPython ``python``; else InstallError. It runs with ``-I`` (no environment
    variables, no user site, not the current directory) and ``-S`` (no site-packages: no
    ``.pth`` file, ``sitecustomize`` or ``usercustomize`` runs before the install is checked),
    and the venv's pyvenv.cfg keeps the base interpreter's site-packages out."""
    check_venv_config(interpreter.parent.parent / "pyvenv.cfg")
    if not (interpreter.is_file() and os.access(interpreter, os.X_OK)):
        raise InstallError(f"{cache.shown(interpreter)}: not an executable file; expected the "
                           "venv's interpreter")
    want = f"{python[0]}.{python[1]}"
    try:
        proc = subprocess.run([str(interpreter), "-I", "-S", "-c", "import sys; print('%d.%d' "
                               "% sys.version_info[:2], sys.implementation.name)"],
                              capture_output=True, text=True, timeout=seconds,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InstallError(f"{cache.shown(interpreter)}: does not run ({exc}); expected "
                           f"CPython {want}") from None
    if proc.returncode != 0 or proc.stdout.split() != [want, "cpython"]:
        raise InstallError(f"{cache.shown(interpreter)}: runs as {proc.stdout.strip()[:60]!r} "
                           f"(exit {proc.returncode}); expected CPython {want}")


def check_venv_config(path: Path) -> None:
    """pyvenv.cfg does not put the base interpreter's site-packages on the path (their
    ``.pth`` files would run at every start); else InstallError naming it."""
    text = read_bounded(path, VENV_CONFIG_MAX_BYTES, "expected the pyvenv.cfg venv wrote")
    settings = {}
    for line in text.decode("utf-8", "replace").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            settings[key.strip().lower()] = value.strip().lower()
    if settings.get("include-system-site-packages") != "false":
        raise InstallError(f"{cache.shown(path)}: include-system-site-packages is "
                           f"{settings.get('include-system-site-packages')!r}; expected 'false' "
                           "(the venv's own site-packages only)")


def this_python_fits(python: tuple[int, int], platform_name: str) -> None:
    """The venv is made from the interpreter running the script: it must be what the pins
    are for (CPython ``python`` on ``platform_name``); else InstallError."""
    impl = sys.implementation.name
    here = f"{platform.system().lower()}-{platform.machine().lower()}"
    if (impl, sys.version_info[:2], here) != ("cpython", python, platform_name):
        raise InstallError(f"{sys.executable} is {impl} {sys.version_info[0]}."
                           f"{sys.version_info[1]} on {here}; the pins are the wheels of CPython "
                           f"{python[0]}.{python[1]} on {platform_name}: run this script with "
                           "such an interpreter")


def problem_of(check: Callable[[], None]) -> str | None:
    """Why ``check`` refuses (its InstallError's one line), or None where it passes."""
    try:
        check()
    except InstallError as exc:
        return str(exc)
    return None
