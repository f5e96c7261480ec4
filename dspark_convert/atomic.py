"""Atomic output directories: build in a hidden temporary sibling, fsync, rename.

An interrupted or failed run leaves no output directory and no partial file: on any
exception (KeyboardInterrupt and the CLI's SIGTERM handler included) the temporary
sibling is removed. A SIGKILL cannot be caught; the sibling it leaves is hidden, never
has the output's name, and is removed by the next run that writes the same output.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import OutputExistsError, OutputWriteError

TMP_MARK = ".dspark-tmp-"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale_siblings(out: Path) -> None:
    """Remove temporaries left by killed runs writing the same output."""
    prefix = f".{out.name}{TMP_MARK}"
    for entry in out.parent.glob(prefix + "*"):
        pid_text = entry.name[len(prefix):].split("-", 1)[0]
        if pid_text.isdigit() and not _pid_alive(int(pid_text)):
            shutil.rmtree(entry, ignore_errors=True)


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_error(exc: OSError, path: Path) -> OutputWriteError:
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    hint = " (disk full)" if exc.errno == errno.ENOSPC else ""
    return OutputWriteError(f"{path}: cannot write the output: {reason}{hint}", path=str(path),
                            expected="a writable location", found=reason)


def _make_parents(parent: Path) -> list[Path]:
    missing = []
    probe = parent
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise OutputWriteError(f"{probe}: is not a directory; cannot create the output under it",
                               path=str(probe), expected="a directory", found="a file")
    for directory in reversed(missing):
        try:
            directory.mkdir()
        except OSError as exc:
            _remove_created(missing[missing.index(directory) + 1:])
            raise write_error(exc, directory) from None
    return missing


def _remove_created(created: list[Path]) -> None:
    for directory in created:  # deepest first
        try:
            directory.rmdir()
        except OSError:
            pass


@contextmanager
def atomic_directory(out: str | os.PathLike, *, force: bool = False) -> Iterator[Path]:
    """Yield a temporary directory that becomes ``out`` when the block succeeds."""
    out = Path(out).absolute()
    if out.exists() or out.is_symlink():
        if not force:
            raise OutputExistsError(f"{out}: output already exists; expected a new path "
                                    "(pass --force to replace it atomically)", path=str(out),
                                    expected="absent", found="exists")
        if not out.is_dir() or out.is_symlink():
            raise OutputExistsError(f"{out}: exists and is not a directory; refusing to replace it",
                                    path=str(out), expected="a directory", found="a file")
    # Missing parents are created, and removed again if the run fails, so that a failed
    # run leaves the file system as it found it.
    created = _make_parents(out.parent)
    _remove_stale_siblings(out)
    tmp = out.parent / f".{out.name}{TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"
    try:
        tmp.mkdir()
    except OSError as exc:
        _remove_created(created)
        raise write_error(exc, out.parent) from None
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_created(created)
        raise
    try:
        for entry in tmp.iterdir():
            fsync_path(entry)
        fsync_path(tmp)
        if out.exists():
            # A non-empty directory cannot be replaced in one rename: move the old one
            # aside first, so the output name holds the old or the new artifact, whole.
            old = out.parent / f".{out.name}{TMP_MARK}{os.getpid()}-old-{secrets.token_hex(4)}"
            os.rename(out, old)
            os.rename(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)
        fsync_path(out.parent)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_created(created)
        raise write_error(exc, out) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_created(created)
        raise
