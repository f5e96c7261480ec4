"""The CLI as a user runs it (a subprocess), and the assertions every refusal test makes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from dspark_convert.util.atomic import _tmp_prefix

DSPARK = Path(sys.executable).parent / "dspark"


def dspark(*args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(DSPARK), *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def temp_siblings(out: Path) -> list[str]:
    """The hidden temporaries of an output (atomic.py names them after it)."""
    prefix = _tmp_prefix(Path(out))
    return sorted(n for n in os.listdir(Path(out).parent) if n.startswith(prefix))


def assert_one_error_line(proc: subprocess.CompletedProcess | tuple[int, str], code: int,
                          *needles: str) -> str:
    returncode, stderr = (proc.returncode, proc.stderr) if not isinstance(proc, tuple) else proc
    assert "Traceback" not in stderr, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, f"expected one stderr line, got:\n{stderr}"
    assert lines[0].startswith("error: "), lines[0]
    assert returncode == code, f"exit {returncode}, expected {code}: {lines[0]}"
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    return lines[0]


def assert_valid(out: Path) -> None:
    assert sorted(os.listdir(out)) == ["drafter.gguf", "manifest.json"]
    proc = dspark("validate", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
