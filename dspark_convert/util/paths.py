"""Paths given by the user, checked before the file system is asked about them.

A path component longer than the file system allows (255 bytes) or a path longer than
PATH_MAX makes every ``stat`` fail with ENAMETOOLONG, which ``Path.exists()`` and
``Path.is_dir()`` do not swallow: it used to surface as exit 1 from whichever probe ran
first. Each command checks its paths here, so the refusal is one line with the code of
what the path is (a source, an artifact, a target, an output ...).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from dspark_convert.errors import DSparkError
from dspark_convert.util.text import shown

NAME_MAX = 255      # bytes in one path component (ext4, xfs, btrfs, tmpfs)
PATH_MAX = 4096     # bytes in a whole path, as the kernel takes it


def check_path(path: str | os.PathLike, *, what: str, error: type[DSparkError]) -> Path:
    """``path`` as a Path, or ``error`` (one line naming it) when no file system could hold
    it. ``what`` says what it is, for the message ("the source checkpoint")."""
    raw = os.fsencode(os.fspath(path))
    if len(raw) >= PATH_MAX:
        raise error(f"{shown(os.fsdecode(raw[:60]))}...: {what} path is {len(raw)} bytes long; "
                    f"expected fewer than {PATH_MAX}", path=shown(os.fsdecode(raw[:200])),
                    expected=f"< {PATH_MAX} bytes", found=len(raw))
    for part in raw.split(b"/"):
        if len(part) > NAME_MAX:
            name = shown(os.fsdecode(part[:40]))
            raise error(f"{shown(os.fsdecode(raw))}: {what}: the path component '{name}...' is "
                        f"{len(part)} bytes long; a file name is at most {NAME_MAX} bytes",
                        path=shown(os.fsdecode(raw)), expected=f"<= {NAME_MAX} bytes",
                        found=len(part))
    return Path(os.fspath(path))


# --- input files given by option (--calibration, --reference, --prompts, --lock) ---------------

def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, for messages ("a FIFO (named pipe)")."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a special file"


def check_input_file(path: str | os.PathLike, *, label: str, error: type[DSparkError],
                     expected: str = "a regular file") -> Path:
    """``path``, an input file an option names, as a Path: one line with ``error`` when no
    file system could hold it (``check_path``), when it does not exist ("not found") and when
    it is not a regular file (a directory, a FIFO: reading a FIFO would wait for a writer
    forever). ``label`` starts the message ("calibration x.json")."""
    path = check_path(path, what=label, error=error)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise error(f"{label}: not found", path=str(path), expected=expected,
                    found="nothing") from None
    except OSError as exc:
        raise error(f"{label}: cannot read: {os.strerror(exc.errno or 0) or exc}",
                    path=str(path)) from None
    if not stat.S_ISREG(mode):
        raise error(f"{label}: is {file_kind(mode)}, not a regular file; expected {expected}",
                    path=str(path), expected=expected, found=file_kind(mode))
    return path


def open_regular(path: str | os.PathLike, *, label: str, error: type[DSparkError]):
    """Open ``path`` for reading in binary, refusing what is not a regular file without
    waiting on it: opened non-blocking (a FIFO without a writer opens at once instead of
    hanging), checked on the open descriptor (a file swapped for a FIFO after a stat is
    still caught), then read as usual. OSError from the open propagates.

    The descriptor has one owner at a time: this function until the checks pass (it
    closes it on any exception, an interrupt included), then the file object, which is
    made last and outside that cleanup, by the built-in ``open`` (one C call: no Python
    frame in which a signal could be taken before it owns the descriptor, as in
    ``os.fdopen``'s). An interrupt that comes once the file object is made drops it, and
    it closes the descriptor, once; the cleanup never closes it again (which raised
    EBADF, an exit 1 hiding the interrupt, or closed whatever file had been given the same
    number meanwhile)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise error(f"{label}: is {file_kind(mode)}, not a regular file; expected a regular file",
                        path=str(path), expected="a regular file", found=file_kind(mode))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return open(fd, "rb", closefd=True)     # the file object owns fd from here on
