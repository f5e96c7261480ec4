"""An engine's run that always ends within its time (llama.cpp's binaries, dspark-mlx's
runner), whatever the processes it starts do.

The process runs in a session of its own, so that it and every process it starts (a shell's
child, a worker, a daemon that kept its stdout) can be killed together. A watcher thread
ends the run:

- at the deadline (``timeout`` seconds after the start): the whole session is killed and the
  run marked ``timed_out``;
- once the engine's own process exits: its pipes' last bytes are read for up to
  GRACE_SECONDS, then the whole session is killed (nothing it started outlives the run). A
  pipe still open then is held by a process the engine left behind: the run is marked
  ``orphaned`` (the engine's failure, not its output's end).

Its pipes are read through ``reader``, which waits for bytes at most POLL_SECONDS at a time
and gives up (``Abandoned``) once the watcher has ended the run: no read waits on a pipe a
process outside the session still holds (one that made a session of its own: it escaped
the kill, not the deadline).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
import time

GRACE_SECONDS = 2.0       # after the engine's process exits: its pipes' last bytes read
POLL_SECONDS = 0.1        # how often a blocked read looks whether the run has ended


class Abandoned(Exception):
    """A read of an engine's pipe given up: its run ended (the deadline, a stop of ours, or
    its process exited while a process it started held the pipe). Never a user's error: the
    run's own marks say which, and the caller raises that."""


class Watched:
    """``cmd`` started in a session of its own, ended as the module docstring says.
    ``readers``: how many readers of its pipes there are (``reader``: each is done at the
    end of its pipe, or when its caller says so). OSError when it cannot start."""

    def __init__(self, cmd: list[str], *, timeout: float, readers: int,
                 grace: float = GRACE_SECONDS, **popen) -> None:
        self.timeout, self.grace = timeout, grace
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(cmd, start_new_session=True, **popen)
        self.timed_out = threading.Event()
        self.orphaned = threading.Event()
        self.stopped = threading.Event()        # by us: a limit, a refused output, Ctrl-C
        self._ended = threading.Event()
        self._left = readers
        self._lock = threading.Lock()
        self._read = threading.Event()
        if readers <= 0:
            self._read.set()
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._watcher.start()

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.t0

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
        if not self._read.wait(self.grace) and not (self.timed_out.is_set()
                                                    or self.stopped.is_set()):
            self.orphaned.set()
        self._kill()                    # whatever it started: nothing outlives its run
        self._ended.set()

    def _done_reading(self) -> None:
        with self._lock:
            self._left -= 1
            if self._left <= 0:
                self._read.set()

    def reader(self, fd: int) -> "Pipe":
        """The reader of ``fd``, one of the ``readers``."""
        return Pipe(self, fd)

    def timeout_text(self) -> str:
        """The words of a run stopped at its deadline (``timed_out``), for its refusal."""
        return f"still running after {self.timeout:g} s; stopped with every process it started"

    def orphan_text(self, pipes: str) -> str:
        """The words of a run whose process exited leaving ``pipes`` held (``orphaned``)."""
        return (f"exited {self.proc.returncode}, but a process it started still held {pipes} "
                f"open {self.grace:g} s later; stopped with every process it started")

    def finish(self) -> int:
        """The run ended (the watcher's verdict reached): the engine's exit code."""
        self._watcher.join()
        return self.proc.returncode


class Pipe:
    """``pipe(n)``: bytes of an engine's pipe as they come, b"" at its end, Abandoned once
    the run has ended with the pipe still open. ``done()`` (idempotent; the end of the pipe
    calls it): this reader reads no more, and the watcher waits on it no longer."""

    def __init__(self, run: Watched, fd: int) -> None:
        self._run, self._fd = run, fd
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        self._done = False

    def __call__(self, n: int) -> bytes:
        while not self._done:
            if self._run._ended.is_set():
                raise Abandoned
            if self._poll.poll(int(POLL_SECONDS * 1000)):
                data = os.read(self._fd, n)
                if not data:
                    self.done()
                return data
        return b""

    def done(self) -> None:
        if not self._done:
            self._done = True
            self._run._done_reading()


def signal_name(code: int) -> str:
    """The signal that ended a process, from its negative exit code (``SIGSEGV``)."""
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"
