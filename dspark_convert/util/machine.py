"""What machine a measurement ran on, for the records that say so (eval's environment, the
cost table's device)."""

from __future__ import annotations

import platform


def cpu_name() -> str:
    """The CPU's model name as /proc/cpuinfo gives it (Linux); elsewhere, or when it cannot
    be read, what the platform module says, or "cpu"."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"
