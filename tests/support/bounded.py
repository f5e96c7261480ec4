"""Run the real `dspark` CLI in a child process under a memory and time bound.

Used for the amplification cases (hostile inputs): a refusal must come in
bounded memory and time, so a regression fails the test instead of swapping the machine.
The child's address space is capped with ``RLIMIT_AS`` before it starts; going over the cap
makes an allocation fail inside the child (a MemoryError, exit 1 "internal error"), which
the caller's exit-code assertion then reports. The wall-clock bound is the subprocess
timeout.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass

# What a plain `dspark validate` / `convert` needs to start (Python, numpy, pydantic,
# gguf-py): measured at under 300 MiB of address space. torch (smoke) needs about 1 GiB.
DEFAULT_MEMORY_MB = 400
DEFAULT_SECONDS = 20.0


@dataclass(frozen=True)
class Bounded:
    proc: subprocess.CompletedProcess
    seconds: float
    memory_mb: int

    @property
    def returncode(self) -> int:
        return self.proc.returncode

    @property
    def stderr(self) -> str:
        return self.proc.stderr

    @property
    def stdout(self) -> str:
        return self.proc.stdout


def run_bounded(*args: str, memory_mb: int = DEFAULT_MEMORY_MB,
                seconds: float = DEFAULT_SECONDS, env: dict | None = None,
                cwd: str | os.PathLike | None = None) -> Bounded:
    """``dspark ARGS...`` with its address space capped at ``memory_mb`` MiB and its run
    at ``seconds``; raises subprocess.TimeoutExpired (a test failure) past the time."""
    limit = memory_mb * 1024 * 1024

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "dspark_convert.cli.main", *args],
                          preexec_fn=cap, capture_output=True, text=True, timeout=seconds,
                          env={**os.environ, "COLUMNS": "200", **(env or {})}, cwd=cwd)
    return Bounded(proc=proc, seconds=time.perf_counter() - start, memory_mb=memory_mb)
