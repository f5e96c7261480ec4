"""An engine's run that always ends within its time (llama.cpp's binaries, dspark-mlx's
runner), whatever the processes it starts do.

The process runs in a session of its own, so that it and every process it starts (a shell's
child, a worker, a daemon that kept its stdout) can be killed together. A watcher thread
ends the run:

- at the deadline (``timeout`` seconds after the start): the whole session is killed and the
  run marked ``timed_out``;
- once the engine's own process exits: its pipes' writers are given GRACE_SECONDS to close,
  then the whole session is killed (nothing it started outlives the run). A pipe still
  held open then is held by a process the engine left behind: the run is marked
  ``orphaned`` (the engine's failure, not its output's end).

Its pipes are read through ``pipe``, which waits for bytes at most POLL_SECONDS at a time:
once the watcher has ended the run, what is left in a pipe whose writers are gone is read to
its end, and a read of a pipe a writer still holds gives up (``Abandoned``): no read waits on
a process outside the session (one that made a session of its own escaped the kill, not
the end of the run).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
import time

GRACE_SECONDS = 2.0       # after the engine's process exits: for its pipes' writers to close
POLL_SECONDS = 0.1        # how often a blocked read or the watcher looks again


class Abandoned(Exception):
    """A read of an engine's pipe given up: its run ended (the deadline, a stop of ours, or
    its process exited while a process it started held the pipe). Never a user's error: the
    run's own marks say which, and the caller raises that."""


def _writers_gone(fd: int) -> bool:
    """Whether every writer of the pipe ``fd`` has closed it (POLLHUP: what is left in it
    can be read to its end without waiting). A poll object of its own: one is never polled
    by two threads at once."""
    poll = select.poll()
    poll.register(fd, select.POLLIN)
    return any(ev & (select.POLLHUP | select.POLLERR) for _, ev in poll.poll(0))


class Watched:
    """``cmd`` started in a session of its own, ended as the module docstring says; ``pipe``
    reads its stdout, its stderr (each when Popen's ``stdout``/``stderr`` is PIPE) and the
    read ends ``fds`` of pipes it was given. OSError when it cannot start."""

    def __init__(self, cmd: list[str], *, timeout: float, fds: tuple[int, ...] = (),
                 grace: float = GRACE_SECONDS, **popen) -> None:
        self.timeout, self.grace = timeout, grace
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(cmd, start_new_session=True, **popen)
        self.timed_out = threading.Event()
        self.orphaned = threading.Event()
        self.stopped = threading.Event()        # by us: a limit, a refused output, Ctrl-C
        self._ended = threading.Event()
        own = [f.fileno() for f in (self.proc.stdout, self.proc.stderr) if f is not None]
        self._pipes = {fd: Pipe(self, fd) for fd in (*own, *fds)}
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._watcher.start()

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.t0

    def pipe(self, fd: int) -> "Pipe":
        """The reader of ``fd`` (the process's stdout or stderr, or one of ``fds``)."""
        return self._pipes[fd]

    def _kill(self) -> None:
        # The session's process group: the engine and whatever it started. Its id is the
        # engine's pid, which no other process takes while a member of the group lives.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self) -> None:
        """Ours to end (a limit, a refused output, Ctrl-C): the whole session killed now."""
        self.stopped.set()
        self._kill()

    def _watch(self) -> None:
        try:
            self.proc.wait(timeout=max(0.0, self.timeout - self.seconds))
        except subprocess.TimeoutExpired:
            self.timed_out.set()
            self._kill()
            self.proc.wait()
        # Exited (or killed): its pipes' writers should close with it. One still open after
        # the grace is a process it left behind (the parser's own pace does not count: what
        # is left in a pipe whose writers are gone is read to its end after this).
        until = time.perf_counter() + self.grace
        while not all(p.released() for p in self._pipes.values()):
            if time.perf_counter() > until:
                if not (self.timed_out.is_set() or self.stopped.is_set()):
                    self.orphaned.set()
                break
            time.sleep(POLL_SECONDS / 2)
        self._kill()                    # whatever it started: nothing outlives its run
        self._ended.set()

    def timeout_text(self) -> str:
        """The words of a run stopped at its deadline (``timed_out``), for its refusal."""
        return f"still running after {self.timeout:g} s; stopped with every process it started"

    def orphan_text(self, pipes: str) -> str:
        """The words of a run whose process exited leaving ``pipes`` held (``orphaned``)."""
        return (f"exited {self.proc.returncode}, but a process it started still held {pipes} "
                f"open {self.grace:g} s later; stopped with every process it started")

    def finish(self, reader: threading.Thread) -> int:
        """The run ended (the watcher's verdict reached), ``reader`` (the thread draining
        one of its pipes) joined and the process's own pipes closed: the engine's exit
        code."""
        self._watcher.join()
        reader.join()
        for own in (self.proc.stdout, self.proc.stderr):
            if own is not None:
                own.close()
        return self.proc.returncode


class Pipe:
    """``pipe(n)``: bytes of an engine's pipe as they come, b"" at its end. Once the run has
    ended, a pipe whose writers are gone is still read to its end (bytes already written,
    bounded); one a writer still holds gives up (Abandoned)."""

    def __init__(self, run: Watched, fd: int) -> None:
        self._run, self._fd = run, fd
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)
        self._eof = False

    def __call__(self, n: int) -> bytes:
        while not self._eof:
            events = self._poll.poll(int(POLL_SECONDS * 1000))
            hup = any(ev & (select.POLLHUP | select.POLLERR) for _, ev in events)
            if self._run._ended.is_set() and not hup:
                raise Abandoned
            if events:
                data = os.read(self._fd, n)
                self._eof = not data
                return data
        return b""

    def released(self) -> bool:
        """Read to its end, or every writer gone."""
        return self._eof or _writers_gone(self._fd)


def signal_name(code: int) -> str:
    """The signal that ended a process, from its negative exit code (``SIGSEGV``)."""
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"
