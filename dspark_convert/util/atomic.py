"""Outputs: the one "output exists" rule, atomic directories and files, and the rule that
an output never overlaps what the run reads.

An output is built in a hidden temporary sibling and renamed into place:

* without ``force`` the rename refuses to replace anything (``renameat2(RENAME_NOREPLACE)``),
  so an output that appears while the run works (a second run writing the same path) is
  refused with OutputExistsError and left untouched; nothing is ever silently replaced;
* with ``force`` an existing directory is swapped with the new one in one step
  (``renameat2(RENAME_EXCHANGE)``), so the output name always holds the old or the new
  artifact, whole, and then the old one is removed.

Where the kernel or file system lacks renameat2 the same guarantees are kept another way
(see ``_publish``). On any exception (KeyboardInterrupt and the CLI's SIGTERM handler
included) the temporary sibling is removed. A SIGKILL cannot be caught; the sibling it
leaves is hidden, never has the output's name, and is removed by the next run that writes
the same output.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import hashlib
import os
import secrets
import shutil
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from dspark_convert.errors import OutputExistsError, OutputWriteError
from dspark_convert.util.paths import NAME_MAX

TMP_MARK = ".dspark-tmp-"
# A temporary's name must fit in NAME_MAX too, so a long output name is shortened in its
# temporary (see _tmp_stem).
# What a temporary adds to its stem: "." + TMP_MARK + pid (<= 7 digits) + "-" +
# "old-"(4) + 8 hex digits, with room to spare.
_TMP_SUFFIX_BYTES = 1 + len(TMP_MARK) + 10 + 1 + 4 + 8

_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _load_renameat2():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_renameat2 = _load_renameat2()


def _rename2(src: Path, dst: Path, flags: int) -> bool:
    """renameat2(src, dst, flags). True when done; False when this kernel or file system
    does not offer it (the caller falls back); raises OSError for a real failure."""
    if _renameat2 is None:
        return False
    if _renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(dst))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _tmp_stem(name: str) -> str:
    """The output's name as its temporaries carry it: the name itself when the temporary's
    full name fits in NAME_MAX bytes, else a cut of it plus a hash of the whole name (the
    same for every run writing that output, so stale temporaries are still found)."""
    raw = os.fsencode(name)
    room = NAME_MAX - _TMP_SUFFIX_BYTES
    if len(raw) <= room:
        return name
    # fsdecode keeps a cut multi-byte character as surrogate escapes: the same bytes again.
    return os.fsdecode(raw[:room - 13]) + "~" + hashlib.sha256(raw).hexdigest()[:12]


def _tmp_prefix(out: Path) -> str:
    return f".{_tmp_stem(out.name)}{TMP_MARK}"


def temp_sibling(out: Path, kind: str = "") -> Path:
    """A fresh hidden temporary next to ``out`` (``kind``: "" or "old-")."""
    return out.parent / f"{_tmp_prefix(out)}{os.getpid()}-{kind}{secrets.token_hex(4)}"


def _remove_stale_siblings(out: Path) -> None:
    """Remove temporaries left by killed runs writing the same output."""
    prefix = _tmp_prefix(out)
    try:
        entries = list(out.parent.glob(_glob_escape(prefix) + "*"))
    except OSError:
        return
    for entry in entries:
        pid_text = entry.name[len(prefix):].split("-", 1)[0]
        if pid_text.isdigit() and not _pid_alive(int(pid_text)):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def _glob_escape(text: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in text)


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


# --- the one "output exists" rule -----------------------------------------------------------

def exists_error(out: Path, *, during: bool = False) -> OutputExistsError:
    when = " while this run was writing it (another run?); left untouched" if during else ""
    return OutputExistsError(f"{out}: output already exists{when}; expected a new path "
                             "(pass --force to replace it atomically)", path=str(out),
                             expected="absent", found="exists")


def check_output(out: str | os.PathLike, *, force: bool, directory: bool = True) -> Path:
    """Refuse an output that exists unless ``force``; with ``force`` it must be of the kind
    written (a directory for an artifact, a file for a lock or a report). Returns the
    absolute path. Checked before any long work (a download), and again at the rename."""
    out = Path(out).absolute()
    if out.exists() or out.is_symlink():
        if not force:
            raise exists_error(out)
        kind_ok = (out.is_dir() if directory else out.is_file()) and not out.is_symlink()
        if not kind_ok:
            want, found = ("a directory", "a file") if directory else ("a file", "a directory")
            if out.is_symlink():
                found = "a symbolic link"
            raise OutputExistsError(f"{out}: exists and is not {want}; refusing to replace it",
                                    path=str(out), expected=want, found=found)
    return out


# --- outputs never overlap what the run reads ---------------------------------------------

def _real(path: Path) -> Path:
    """``path`` with every existing level resolved (links followed), the rest appended."""
    path = Path(os.path.abspath(path))
    missing: list[str] = []
    probe = path
    while not probe.exists() and probe != probe.parent:
        missing.append(probe.name)
        probe = probe.parent
    return probe.resolve().joinpath(*reversed(missing))


def refuse_overlap(output: str | os.PathLike, reads: Iterable[tuple[str | os.PathLike, str]]) -> None:
    """Refuse an output that is, holds, or lies inside a directory (or file) the run reads:
    ``reads`` is (path, what it is) pairs, e.g. (the checkpoint, "the source checkpoint"),
    (the HF cache, "the Hugging Face cache"). --force would otherwise replace, and so
    delete, what is being read; an output inside it would change it."""
    out = _real(Path(output))
    for path, what in reads:
        if path is None or not os.path.exists(path):
            continue
        read = _real(Path(path))
        if out == read:
            relation = "is"
        elif read.is_relative_to(out):
            relation = "holds"
        elif out.is_relative_to(read):
            relation = "lies inside"
        else:
            continue
        raise OutputExistsError(f"{output}: {relation} {what} ({read}) that this run reads; "
                                "expected an output outside it", path=str(output),
                                expected=f"a path outside {read}", found=str(out))


# --- atomic directories ------------------------------------------------------------------------

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


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _publish(tmp: Path, out: Path, *, force: bool) -> None:
    """Move the finished ``tmp`` to ``out``: never replacing anything without ``force``,
    replacing in one step with it."""
    if force and (out.exists() or out.is_symlink()):
        if out.is_dir() and not out.is_symlink():
            if _rename2(tmp, out, _RENAME_EXCHANGE):
                _remove(tmp)            # tmp now holds the old artifact
                return
            # No exchange here: move the old one aside first, so the name holds the old
            # or the new artifact, whole (with a moment where it holds neither).
            old = temp_sibling(out, "old-")
            os.rename(out, old)
            os.rename(tmp, out)
            _remove(old)
            return
        os.replace(tmp, out)            # a file: rename(2) replaces it in one step
        return
    try:
        if _rename2(tmp, out, _RENAME_NOREPLACE):
            return
    except FileExistsError:
        raise exists_error(out, during=True) from None
    # No renameat2: a directory can be claimed atomically with link(2) only for files; for
    # directories, rename(2) replaces an EMPTY directory silently, so refuse anything there.
    if tmp.is_dir():
        try:
            os.mkdir(out)               # claim the name; fails if anything holds it
        except FileExistsError:
            raise exists_error(out, during=True) from None
        try:
            os.rename(tmp, out)         # replaces only the empty directory we just made
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                raise exists_error(out, during=True) from None
            raise
        return
    try:
        os.link(tmp, out)               # fails if anything holds the name
    except FileExistsError:
        raise exists_error(out, during=True) from None
    os.unlink(tmp)


@contextmanager
def atomic_directory(out: str | os.PathLike, *, force: bool = False) -> Iterator[Path]:
    """Yield a temporary directory that becomes ``out`` when the block succeeds."""
    out = check_output(out, force=force, directory=True)
    # Missing parents are created, and removed again if the run fails, so that a failed
    # run leaves the file system as it found it.
    created = _make_parents(out.parent)
    _remove_stale_siblings(out)
    tmp = temp_sibling(out)
    try:
        # Inside the cleanup's reach: a signal right after the mkdir must not leave it.
        try:
            tmp.mkdir()
        except OSError as exc:
            raise write_error(exc, out.parent) from None
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_created(created)
        raise
    try:
        for entry in tmp.iterdir():
            fsync_path(entry)
        fsync_path(tmp)
        _publish(tmp, out, force=force)
        fsync_path(out.parent)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_created(created)
        raise write_error(exc, out) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_created(created)
        raise


def atomic_file(path: str | os.PathLike, write: Callable[[object], None], *,
                force: bool = False) -> Path:
    """Write one file through a hidden temporary sibling (fsync, rename). Without ``force``
    an existing file is refused (also one that appears meanwhile); with it, replaced in one
    step. ``write(fh)`` gets the binary file object. Nothing is left behind on failure."""
    path = check_output(path, force=force, directory=False)
    if not path.parent.is_dir():
        raise OutputWriteError(f"{path}: cannot write the output: the directory {path.parent} "
                               "does not exist", path=str(path), expected="an existing directory",
                               found="nothing")
    _remove_stale_siblings(path)
    tmp = temp_sibling(path)
    try:
        with open(tmp, "xb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        _publish(tmp, path, force=force)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise write_error(exc, path) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
