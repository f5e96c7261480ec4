"""The end of an engine's run that a timer and a draining thread watch (llama.cpp's binaries,
dspark-mlx's runner): one way to wait for it, whatever ended the reading of its output, and
the name of the signal that killed it."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Callable


def wait_watched(proc: subprocess.Popen, *, t0: float, timeout: float,
                 on_timeout: Callable[[], None], timer: threading.Timer,
                 reader: threading.Thread) -> int:
    """``proc``'s exit code, waited for until ``timeout`` seconds after ``t0`` (and at least
    one second more: its output was read to the end, or it was stopped); still running then,
    ``on_timeout()`` (which marks the timeout and stops it) and the wait for its end. Then
    the timer is cancelled, the thread draining its stdout joined and its stdout closed."""
    try:
        code = proc.wait(timeout=max(1.0, timeout - (time.perf_counter() - t0)))
    except subprocess.TimeoutExpired:
        on_timeout()
        code = proc.wait()
    timer.cancel()
    reader.join()
    proc.stdout.close()
    return code


def signal_name(code: int) -> str:
    """The signal that ended a process, from its negative exit code (``SIGSEGV``)."""
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"
