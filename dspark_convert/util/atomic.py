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
included) the temporary sibling is removed, and so is every other entry a run makes beside
an output (a parent it created, the writability probe, an old output moved aside, which
is put back instead when the new one is not in place): each is made inside the reach of
its cleanup, and a rename and the record of it happen with SIGINT and SIGTERM held back
(``_signals_held``), so a signal never falls between them. The rename that publishes an
output is recorded in the same step (``published_outputs``): an interrupt that comes once
an output is in place (the CLI printing its summary to a slow stdout, the removal of the
old output) is known to have come after it, and the CLI says so instead of "nothing was
written". A SIGKILL cannot be caught; the sibling it leaves is hidden, never has the
output's name, and is removed by the next run that writes the same output (a probe, by
the next run that probes the same directory).

Every output option of every command goes through ``check_outputs`` before any work (the
one output-path rule: a path that names a new entry, fits a file system, does not exist
without --force, can be written, and stays clear of everything the run reads and of the
run's other outputs). The files of one run (``smoke --trace`` and ``--plot``) are published
together by ``atomic_files``: all of them or none.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import hashlib
import os
import secrets
import shutil
import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from dspark_convert.errors import OutputExistsError, OutputPathError, OutputWriteError
from dspark_convert.util.paths import NAME_MAX, check_path
from dspark_convert.util.text import shown

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
    _remove_stale(out.parent, _tmp_prefix(out))


def _remove_stale(directory: Path, prefix: str) -> None:
    """Remove the entries of ``directory`` named ``prefix`` + the pid of a process that is
    gone + ..."""
    try:
        entries = list(directory.glob(_glob_escape(prefix) + "*"))
    except OSError:
        return
    for entry in entries:
        pid_text = entry.name[len(prefix):].split("-", 1)[0]
        if pid_text.isdigit() and not _pid_alive(int(pid_text)):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


_HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held back for a step that must happen whole: a rename and the
    record of what it moved, so that the cleanup that follows an interrupt knows what is
    where. A signal that comes meanwhile is handled (KeyboardInterrupt, the CLI's SIGTERM
    handler) as soon as the step is done. Python runs signal handlers in the main thread
    only, so elsewhere this holds nothing back (and cannot: there is no handler to swap)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[tuple[int, object]] = []

    def hold(signum, frame) -> None:
        caught.append((signum, frame))

    previous = {sig: signal.signal(sig, hold) for sig in _HELD_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if caught:
            signum, frame = caught[0]
            handler = previous[signum]
            if callable(handler):
                handler(signum, frame)          # raises: KeyboardInterrupt, Terminated
            elif handler != signal.SIG_IGN:     # the default action (SIG_DFL, or None)
                signal.raise_signal(signum)


def _glob_escape(text: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in text)


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# Temporaries being written now -> the output each becomes: an error while writing names
# what the user asked for (``out/report.json``), never the hidden sibling it was built in.
_LIVE: dict[Path, Path] = {}


def _as_output(path: str | os.PathLike) -> Path:
    """``path`` with a live temporary in it replaced by the output it becomes."""
    path = Path(path)
    full = Path(os.path.abspath(path))
    for tmp, out in list(_LIVE.items()):
        if full == tmp or full.is_relative_to(tmp):
            return out / full.relative_to(tmp)
    return path


# The records open now (``published_outputs``): each gets every output published while it
# is open. None open (a library caller that did not ask): nothing is kept.
_RECORDS: list[list[Path]] = []


@contextmanager
def published_outputs() -> Iterator[Sequence[Path]]:
    """Record the outputs this process publishes while the block runs: each output's
    absolute path, in order, added in the same step as the rename that puts it in place
    (SIGINT and SIGTERM held), so that whoever catches an interrupt knows for certain
    which outputs are whole in place (the CLI's message: cli/errors.run) and which were
    never written (nothing of them is left). The sequence yielded grows as outputs are
    published; read it when the block ends or is interrupted."""
    record: list[Path] = []
    _RECORDS.append(record)
    try:
        yield record
    finally:
        # by identity: two records holding the same paths are still two records
        for i, open_record in enumerate(_RECORDS):
            if open_record is record:
                del _RECORDS[i]
                break


def _record_published(*paths: Path) -> None:
    for record in _RECORDS:
        record.extend(paths)


def write_error(exc: OSError, path: str | os.PathLike) -> OutputWriteError:
    path = _as_output(path)
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    hint = " (disk full)" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else ""
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

# This package's own files are read by every command without being named (the packaged
# prompt set, evaluation/data/golden_prompts.jsonl, is eval's default): an output may not
# be, hold or lie inside them.
PACKAGE_DIR = Path(__file__).resolve().parent.parent
PACKAGE_READ = (PACKAGE_DIR, "the dspark_convert package's own files")


def _real(path: Path) -> Path:
    """``path`` with every existing level resolved (links followed), the rest appended."""
    path = Path(os.path.abspath(path))
    missing: list[str] = []
    probe = path
    while not os.path.lexists(probe) and probe != probe.parent:
        missing.append(probe.name)
        probe = probe.parent
    return probe.resolve().joinpath(*reversed(missing))


def _file_id(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def _chain(real: Path) -> list[tuple[int, int]]:
    """The (device, inode) of ``real`` and of each of its ancestors that exist: what a hard
    link or a bind mount of the same file or directory has in common with it, whatever the
    path it is reached by."""
    ids = []
    for level in (real, *real.parents):
        found = _file_id(level)
        if found is not None:
            ids.append(found)
    return ids


def overlap(out: Path, read: Path) -> str | None:
    """How the output ``out`` stands to ``read`` ("is", "holds", "lies inside" or None),
    by path once links are resolved and by device and inode (hard links, bind mounts)."""
    out_real, read_real = _real(out), _real(read)
    out_id, read_id = _file_id(out_real), _file_id(read_real)
    if out_real == read_real or (out_id is not None and out_id == read_id):
        return "is"
    if read_real.is_relative_to(out_real) or (out_id is not None and out_id in _chain(read_real)):
        return "holds"
    if out_real.is_relative_to(read_real) or (read_id is not None and read_id in _chain(out_real)):
        return "lies inside"
    return None


def refuse_overlap(output: str | os.PathLike, reads: Iterable[tuple[str | os.PathLike | None, str]]
                   ) -> None:
    """Refuse an output that is, holds, or lies inside a directory (or file) the run reads:
    ``reads`` is (path, what it is) pairs, e.g. (the checkpoint, "the source checkpoint"),
    (the HF cache, "the Hugging Face cache"). --force would otherwise replace, and so
    delete, what is being read; an output inside it would change it. Links are followed
    and a hard link or bind mount of a read is that read (the same device and inode)."""
    for path, what in reads:
        if path is None or not os.path.exists(path):
            continue
        relation = overlap(Path(output), Path(path))
        if relation is not None:
            read = _real(Path(path))
            raise OutputExistsError(f"{shown(os.fspath(output))}: {relation} {what} ({shown(str(read))}) "
                                    "that this run reads; expected an output outside it",
                                    path=str(output), expected=f"a path outside {read}",
                                    found=str(_real(Path(output))))


# --- the one output-path rule ----------------------------------------------------------------

@dataclass(frozen=True)
class Output:
    """One output of a run: the path as the user gave it (a str keeps an empty ``-o ""``
    apart from ``.``), what it is in messages (``--trace``, "the report directory"), and
    whether it is a directory (an artifact, a report) or a file (a lock, a trace, a plot)."""

    path: str | os.PathLike
    what: str = "the output"
    directory: bool = True


def _names_no_new_entry(out: Output) -> str | None:
    """Why ``out.path`` cannot name a new file or directory, or None."""
    text = os.fspath(out.path)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if text == "":
        return "the path is empty (an unset variable?)"
    if text.strip() == "":
        return "the path is only whitespace"
    last = text.rstrip("/").rsplit("/", 1)[-1]
    if last == "":
        return "'/' is the root directory"
    if last in (".", ".."):
        return f"it ends in '{last}', which names an existing directory"
    try:
        cwd = Path.cwd()
    except OSError:          # the working directory was removed: nothing there to wipe
        return None
    relation = overlap(Path(text), cwd)
    if relation == "is":
        return "it is the working directory"
    if relation == "holds":
        return f"it holds the working directory ({shown(str(cwd))})"
    return None


_PROBE_PREFIX = f".{TMP_MARK}probe-"


def _check_writable(out: Path, spec: Output) -> None:
    """The output can be created: a file's directory exists, a directory's nearest existing
    ancestor is a directory, and this process can make an entry there (probed by making
    and removing a hidden one: permissions, a read-only mount, /proc all answer for real)."""
    if not spec.directory:
        if not out.parent.is_dir():
            raise OutputWriteError(f"{shown(str(out))}: cannot write the output: the directory "
                                   f"{shown(str(out.parent))} does not exist", path=str(out),
                                   expected="an existing directory", found="nothing")
        base = out.parent
    else:
        base = out.parent
        while not os.path.lexists(base) and base != base.parent:
            base = base.parent
        if not base.is_dir():
            raise OutputWriteError(f"{shown(str(base))}: is not a directory; cannot create the "
                                   f"output {shown(str(out))} under it", path=str(base),
                                   expected="a directory", found="a file")
    _remove_stale(base, _PROBE_PREFIX)
    probe = base / f"{_PROBE_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
    try:
        try:
            os.mkdir(probe)
        except OSError as exc:
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            raise OutputWriteError(f"{shown(str(out))}: cannot write the output: cannot create "
                                   f"entries in {shown(str(base))}: {reason}", path=str(out),
                                   expected="a writable location", found=reason) from None
    finally:
        # However this ends: a signal right after the mkdir must not leave the probe.
        try:
            os.rmdir(probe)
        except OSError:
            pass


def check_outputs(outputs: Sequence[Output], reads: Iterable[tuple[str | os.PathLike | None, str]]
                  = (), *, force: bool) -> list[Path]:
    """The one output-path rule, for every output of a command, before any work. Each of
    ``outputs``, in order:

    1. names a new entry: not empty, not whitespace only, not ending in '.' or '..', not
       '/', the working directory or one of its ancestors (OutputPathError, 32): with
       --force it would be wiped, and ``-o "$UNSET"`` is an empty path;
    2. fits a file system (paths.check_path: a component over 255 bytes, 31);
    3. is not, does not hold and does not lie inside anything the run reads (``reads``:
       (path, what it is) pairs, None paths skipped; and this package's own files), nor
       another output of the same run, through links, hard links and bind mounts (30);
    4. the "output exists" rule (``check_output``: 30 without --force);
    5. can be written (``_check_writable``, 31).

    Returns the outputs' absolute paths, in order."""
    reads = [*reads, PACKAGE_READ]
    for i, spec in enumerate(outputs):
        why = _names_no_new_entry(spec)
        if why is not None:
            raise OutputPathError(f"{spec.what} '{shown(os.fspath(spec.path))}': expected a path naming a "
                                  f"new {'directory' if spec.directory else 'file'}; {why}",
                                  path=os.fspath(spec.path), field=spec.what,
                                  expected="a path naming a new entry", found=why)
        check_path(spec.path, what=spec.what, error=OutputWriteError)
        if not os.path.isabs(spec.path):
            try:
                os.getcwd()
            except OSError as exc:
                raise OutputWriteError(f"{spec.what} {shown(os.fspath(spec.path))}: a relative path, and the "
                                       f"working directory is gone ({os.strerror(exc.errno or 0)})",
                                       path=os.fspath(spec.path), field=spec.what,
                                       expected="an existing working directory",
                                       found="removed") from None
        refuse_overlap(spec.path, reads)
        for other in outputs[:i]:
            relation = overlap(Path(other.path), Path(spec.path))
            if relation is not None:
                relation = "is the same path as" if relation == "is" else relation
                raise OutputExistsError(
                    f"{other.what} {shown(os.fspath(other.path))}: {relation} {spec.what} "
                    f"{shown(os.fspath(spec.path))} of the same run; expected separate outputs",
                    path=str(other.path), field=other.what, expected="separate outputs",
                    found=f"{relation} {spec.what}")
    paths: list[Path] = []
    for spec in outputs:
        out = check_output(spec.path, force=force, directory=spec.directory)
        _check_writable(out, spec)
        paths.append(out)
    return paths


# --- atomic directories ------------------------------------------------------------------------

def _make_parents(parent: Path, created: list[Path]) -> None:
    """Create ``parent`` and its missing ancestors, each recorded in ``created`` (deepest
    first) as it is made, so that the caller's cleanup removes what exists however this
    ends."""
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
            with _signals_held():
                directory.mkdir()
                created.insert(0, directory)
        except OSError as exc:
            raise write_error(exc, directory) from None


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


def _remove_all(path: Path) -> None:
    """``_remove``, finished even when a signal stops it (the signal then goes on)."""
    try:
        _remove(path)
    except BaseException:
        _quietly(_remove, path)
        raise


def _quietly(cleanup: Callable[..., object], *args, **kwargs) -> None:
    """A cleanup step on the way out of a failure or an interrupt: an OSError of its own
    (a permission changed meanwhile) must not replace what is being raised, so that an
    interrupt still exits 130/143 and a refusal keeps its own code."""
    try:
        cleanup(*args, **kwargs)
    except OSError:
        pass


def _publish(tmp: Path, out: Path, *, force: bool) -> Path | None:
    """Move the finished ``tmp`` to ``out``: never replacing anything without ``force``,
    replacing in one step with it. Returns where the directory it replaced now is (the
    caller removes it once the new one is recorded as in place), or None. Called with
    SIGINT and SIGTERM held (``_signals_held``): a signal never falls between two of its
    renames, nor between the rename and its record."""
    if force and (out.exists() or out.is_symlink()):
        if out.is_dir() and not out.is_symlink():
            if _rename2(tmp, out, _RENAME_EXCHANGE):
                return tmp              # tmp now holds the old artifact
            # No exchange here: move the old one aside first, so the name holds the old
            # or the new artifact, whole (the old one goes back if the new one cannot
            # follow).
            old = temp_sibling(out, "old-")
            os.rename(out, old)
            try:
                os.rename(tmp, out)
            except OSError:
                os.rename(old, out)
                raise
            return old
        os.replace(tmp, out)            # a file: rename(2) replaces it in one step
        return None
    try:
        if _rename2(tmp, out, _RENAME_NOREPLACE):
            return None
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
        return None
    try:
        os.link(tmp, out)               # fails if anything holds the name
    except FileExistsError:
        raise exists_error(out, during=True) from None
    os.unlink(tmp)
    return None


@contextmanager
def atomic_directory(out: str | os.PathLike, *, force: bool = False) -> Iterator[Path]:
    """Yield a temporary directory that becomes ``out`` when the block succeeds. An
    OSError the block lets through is the output's write error (31), naming the output."""
    out = check_output(out, force=force, directory=True)
    # Missing parents are created, and removed again if the run fails, so that a failed
    # run leaves the file system as it found it.
    created: list[Path] = []
    tmp = temp_sibling(out)

    def discard() -> None:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_created(created)

    _LIVE[tmp] = out
    try:
        try:
            # Inside the cleanup's reach: a signal right after a mkdir must not leave it.
            _make_parents(out.parent, created)
            _remove_stale_siblings(out)
            try:
                tmp.mkdir()
            except OSError as exc:
                raise write_error(exc, out.parent) from None
            yield tmp
        except OSError as exc:
            discard()
            raise write_error(exc, exc.filename or out) from None
        except BaseException:
            discard()
            raise
        replaced: Path | None = None
        try:
            for entry in tmp.iterdir():
                fsync_path(entry)
            fsync_path(tmp)
            # The rename and its record as one step: an interrupt from here on finds the
            # output recorded as in place (published_outputs), never "nothing written".
            with _signals_held():
                replaced = _publish(tmp, out, force=force)
                _record_published(out)
            fsync_path(out.parent)
        except OSError as exc:
            discard()
            raise write_error(exc, out) from None
        except BaseException:
            discard()
            raise
        finally:
            if replaced is not None:
                _remove_all(replaced)   # the old artifact, however this ends
    finally:
        _LIVE.pop(tmp, None)


# --- atomic files: one, or several published together -----------------------------------------

def _publish_file(tmp: Path, out: Path, *, force: bool) -> Path | None:
    """Move the finished file ``tmp`` to ``out`` (``_publish``'s rules). Returns where the
    file it replaced now is (to be removed once every file of the run is in place, or put
    back if one fails), or None when nothing was replaced."""
    if force and (out.exists() or out.is_symlink()):
        if _rename2(tmp, out, _RENAME_EXCHANGE):
            return tmp                  # tmp now holds the old file
        old = temp_sibling(out, "old-")
        linked = True
        try:
            os.link(out, old)           # keep the old one reachable, then replace in one step
        except OSError:
            os.rename(out, old)         # no hard links here: a moment with neither
            linked = False
        try:
            os.replace(tmp, out)
        except OSError:
            # No old- sibling left: the link dropped, or the old file back in its place.
            if linked:
                old.unlink()
            else:
                os.replace(old, out)
            raise
        return old
    _publish(tmp, out, force=force)
    return None


def _unpublish(published: list[tuple[Path, Path | None]]) -> None:
    """Undo ``_publish_file`` for each (output, old file) in reverse: the old file back, or
    the new one removed."""
    for out, old in reversed(published):
        try:
            if old is not None:
                os.replace(old, out)
            else:
                out.unlink(missing_ok=True)
        except OSError:
            pass


def atomic_files(files: Sequence[tuple[str | os.PathLike, Callable[[object], None]]], *,
                 force: bool = False) -> list[Path]:
    """Write the files of one run, all of them or none: each is written and fsynced in a
    hidden temporary sibling (``write(fh)`` gets the binary file object); only when every
    one is written are they renamed into place, and if one of those renames fails the
    ones already moved are undone (the files they replaced put back). Without ``force``
    an existing file is refused (also one that appears meanwhile); with it, replaced.
    Nothing is left behind on failure: a full disk while writing the second file leaves
    the first output as it was."""
    paths = [check_output(path, force=force, directory=False) for path, _ in files]
    for path in paths:
        if not path.parent.is_dir():
            raise OutputWriteError(f"{path}: cannot write the output: the directory {path.parent} "
                                   "does not exist", path=str(path),
                                   expected="an existing directory", found="nothing")
    for path in paths:
        _remove_stale_siblings(path)
    tmps: list[Path] = []
    current = paths[0] if paths else None
    try:
        for path, (_, write) in zip(paths, files):
            current = path
            tmp = temp_sibling(path)
            _LIVE[tmp] = path
            tmps.append(tmp)
            with open(tmp, "xb") as fh:
                write(fh)
                fh.flush()
                os.fsync(fh.fileno())
        published: list[tuple[Path, Path | None]] = []
        # Every rename, its record and the removal of the files replaced, as one step: a
        # signal meanwhile is taken once all the files are in place and recorded as such
        # (published_outputs), so no interrupt falls between a rename and its record
        # (which would leave _unpublish blind to it, or call a published file unwritten).
        with _signals_held():
            try:
                for tmp, path in zip(tmps, paths):
                    current = path
                    published.append((path, _publish_file(tmp, path, force=force)))
            except BaseException:       # a rename failed: the others are undone
                _unpublish(published)
                raise
            _record_published(*paths)
            for _, old in published:
                if old is not None:
                    _quietly(old.unlink, missing_ok=True)
        for parent in dict.fromkeys(path.parent for path in paths):
            fsync_path(parent)
    except OSError as exc:
        for tmp in tmps:
            _quietly(tmp.unlink, missing_ok=True)
        raise write_error(exc, current) from None
    except BaseException:
        for tmp in tmps:
            _quietly(tmp.unlink, missing_ok=True)
        raise
    finally:
        for tmp in tmps:
            _LIVE.pop(tmp, None)
    return paths


def atomic_file(path: str | os.PathLike, write: Callable[[object], None], *,
                force: bool = False) -> Path:
    """Write one file through a hidden temporary sibling (fsync, rename): ``atomic_files``
    with one file."""
    return atomic_files([(path, write)], force=force)[0]
