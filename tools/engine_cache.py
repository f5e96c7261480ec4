"""The engine cache: what tools/llama_cpp.py, tools/dspark_mlx.py and tools/speculators.py
share about the directory their builds and installs live in.

- Where: ``$DSPARK_ENGINE_CACHE``, default ``~/.cache/dspark-convert`` (``cache_root``).
- Putting an entry in place: it is made in a hidden temporary sibling named by the process
  (``temporary``), renamed into place whole (``put_in_place``, with SIGINT and SIGTERM held
  back: ``signals_blocked``); a killed process's temporaries are removed by the next run
  (``remove_stale``); ``remove`` never follows a link.
- Signals: ``catch_signals`` turns SIGINT and SIGTERM into ``Interrupted``, and
  ``end_processes`` ends a step's whole session (SIGTERM, then SIGKILL after ``GRACE_S``).
- Reading what is there: ``read_bounded`` (a regular file, never following a link nor waiting
  on a FIFO, at most a limit), ``read_json_object`` and ``check_info`` (the JSON info file each
  entry holds: strict JSON, exactly the expected object), ``check_entry`` (a real directory, a
  regular executable file).
- Saying so in one line: ``shown`` (a path), ``brief`` (a JSON value), ``kind`` (a file type).

A refusal is raised as the caller's own error class (``error``: BuildError, InstallError), so
each script keeps its messages and its exit codes.

Standard library only: it runs before (and without) the package's own environment. The
scripts import it by its plain name, beside them (the tests load it as their sibling).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path
from typing import Callable

TMP_MARK = ".tmp-"
# How long a step's processes get to end after SIGTERM (ninja ends its compilers, pip its
# children) before SIGKILL.
GRACE_S = 5.0


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived during a build or an install. A BaseException, as
    KeyboardInterrupt is: nothing on the way may take it for a failure and go on."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
        self.name = signal.Signals(signum).name


def cache_root() -> Path:
    """The engine cache: ``$DSPARK_ENGINE_CACHE``, else ``~/.cache/dspark-convert``."""
    return Path(os.environ.get("DSPARK_ENGINE_CACHE")
                or Path.home() / ".cache" / "dspark-convert")


# --- one line ------------------------------------------------------------------------------

def shown(path: Path | str) -> str:
    """A path on one line: as it is when printable, else escaped."""
    text = str(path)
    return text if text.isprintable() else ascii(text)


def brief(value: object) -> str:
    """A JSON value on one short line (json escapes control characters)."""
    text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= 60 else text[:57] + "..."


def kind(mode: int) -> str:
    """What an ``st_mode`` is, in words ("a directory", "a FIFO" ...)."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "an unknown kind of file"


# --- reading what is there -----------------------------------------------------------------

def no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    """json's object_pairs_hook: a key twice is not JSON we wrote."""
    seen: dict = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"key {brief(key)} twice")
        seen[key] = value
    return seen


def refuse_constant(name: str) -> None:
    """json's parse_constant: NaN and Infinity are not JSON."""
    raise ValueError(f"{name} is not JSON")


# A JSON value's kind, by the Python type json.loads gives it.
JSON_KIND = {list: "array", str: "string", int: "number", float: "number", bool: "boolean",
             type(None): "null"}


def sha256_of(path: Path) -> str:
    """The SHA-256 of a file's bytes (hex): a pinned sdist's, a find-links wheel's."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def read_bounded(path: Path, limit: int, expected: str, error: type[Exception]) -> bytes:
    """A regular file's bytes, never following a link nor waiting on a FIFO (O_NONBLOCK), at
    most ``limit``; ``error`` naming what was found, then ``expected``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise error(f"{shown(path)}: missing; {expected}") from None
    except OSError as exc:
        what = "a symbolic link" if exc.errno == errno.ELOOP else f"unreadable ({exc.strerror})"
        raise error(f"{shown(path)}: {what}; {expected}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise error(f"{shown(path)}: {kind(mode)}; {expected}")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise error(f"{shown(path)}: unreadable ({exc.strerror}); {expected}") from None
    finally:
        os.close(fd)
    if size > limit:
        raise error(f"{shown(path)}: over {limit} bytes; {expected}")
    return b"".join(chunks)


def read_json_object(path: Path, limit: int, expected: str, error: type[Exception]) -> dict:
    """An info file as a JSON object, read as ``read_bounded`` reads (strict: UTF-8, no
    duplicate key, no NaN); ``error`` naming what was found, then ``expected``."""
    data = read_bounded(path, limit, expected, error)
    try:
        info = json.loads(data.decode("utf-8"), object_pairs_hook=no_duplicates,
                          parse_constant=refuse_constant)
    except UnicodeDecodeError:
        raise error(f"{shown(path)}: not UTF-8; {expected}") from None
    except RecursionError:
        raise error(f"{shown(path)}: nested too deep; {expected}") from None
    except ValueError as exc:
        raise error(f"{shown(path)}: not JSON ({exc}); {expected}") from None
    if not isinstance(info, dict):
        raise error(f"{shown(path)}: a JSON {JSON_KIND.get(type(info), 'value')} "
                    f"{brief(info)}; {expected}")
    return info


def check_info(path: Path, info: dict, want: dict, error: type[Exception]) -> None:
    """``info`` (read from ``path``) is exactly ``want``: every key, each value equal and of
    the same type, no other key; else ``error`` naming the first difference."""
    for key, value in want.items():
        if key not in info:
            raise error(f"{shown(path)}: no {key!r}; expected {brief(value)}")
        if info[key] != value or type(info[key]) is not type(value):
            raise error(f"{shown(path)}: {key} is {brief(info[key])}, expected {brief(value)}")
    extra = sorted(set(info) - set(want))
    if extra:
        raise error(f"{shown(path)}: unexpected key {brief(extra[0])}; expected only "
                    f"{', '.join(want)}")


def check_entry(path: Path, want_dir: bool, what: str, error: type[Exception]) -> None:
    """``path`` is a real directory (``want_dir``) or a regular file, executable where
    ``what`` ends "executable" (never a link: a whole entry holds none, and a link may point
    anywhere); else ``error``, one line naming the path and ``what`` was expected."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        raise error(f"{shown(path)}: missing; expected {what}") from None
    except OSError as exc:
        raise error(f"{shown(path)}: unreadable ({exc.strerror}); expected {what}") from None
    ok = stat.S_ISDIR(mode) if want_dir else stat.S_ISREG(mode)
    if not ok:
        raise error(f"{shown(path)}: {kind(mode)}; expected {what}")
    if not want_dir and what.endswith("executable") and not os.access(path, os.X_OK):
        raise error(f"{shown(path)}: not executable; expected {what}")


# --- removing, temporaries, putting in place -----------------------------------------------

def remove(path: Path) -> None:
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


def remove_quietly(path: Path) -> None:
    """A temporary, removed even while a dying process may still add to it."""
    for _ in range(20):
        try:
            remove(path)
            return
        except OSError:
            time.sleep(0.1)


def temporary(final: Path, role: str) -> Path:
    """A hidden sibling of ``final`` named by this process (``remove_stale`` removes it
    once the process is gone)."""
    return final.parent / f".{final.name}{TMP_MARK}{os.getpid()}-{role}"


def remove_stale(final: Path) -> None:
    """Temporaries of builds or installs that were killed (their process is gone)."""
    prefix = f".{final.name}{TMP_MARK}"
    for entry in final.parent.glob(prefix + "*"):
        pid = entry.name[len(prefix):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            try:
                remove(entry)
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


def signals_blocked():
    """SIGINT and SIGTERM held back while an entry is put in place: the rename of the old
    one aside and the new one in is done whole, or not begun."""
    class Blocked:
        def __enter__(self):
            if hasattr(signal, "pthread_sigmask"):
                self.old = signal.pthread_sigmask(signal.SIG_BLOCK,
                                                  {signal.SIGINT, signal.SIGTERM})

        def __exit__(self, *exc):
            if hasattr(signal, "pthread_sigmask"):
                signal.pthread_sigmask(signal.SIG_SETMASK, self.old)
    return Blocked()


def put_in_place(work: Path, final: Path, is_whole: Callable[[Path], bool]) -> Path:
    """``work`` (a whole build or install) put at ``final``: whatever was there (a stale or
    tampered entry, a file, a FIFO, a link) is renamed aside and removed, so ``final`` is
    always either the old entry or the new one. Another run's whole entry that got there
    first (``is_whole``) is kept and ``work`` removed."""
    if is_whole(final):
        remove(work)
        return final
    aside = temporary(final, "old")
    with signals_blocked():
        remove(aside)
        try:
            os.rename(final, aside)
        except FileNotFoundError:
            pass
        try:
            os.rename(work, final)
        except OSError:
            if not is_whole(final):     # not another run's entry: a failure
                raise
            remove(work)
        remove_quietly(aside)
    return final


# --- signals and a step's processes --------------------------------------------------------

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
    then SIGKILL for what is left after GRACE_S. Nothing of the step may go on writing
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


def _raise_interrupted(signum: int, frame) -> None:
    # The cleanup that follows is not interrupted again: a second Ctrl-C would leave the
    # temporary half removed.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Interrupted(signum)


def catch_signals() -> None:
    """SIGINT and SIGTERM raise Interrupted in the main thread (SIGTERM would otherwise end
    the process without removing the temporary or the step's processes)."""
    signal.signal(signal.SIGINT, _raise_interrupted)
    signal.signal(signal.SIGTERM, _raise_interrupted)
