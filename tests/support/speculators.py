"""speculators for the tests: the one way a test finds the interpreter of speculators' own
environment and runs a script with it. The install is tools/speculators.py's
(`make speculators`; `make test` installs it when missing).

Where the install is missing a test skips, except under CI (``CI=true``), where it FAILS: the
speculators tests are part of what CI proves, and a skip there would hide a broken install
step.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from support.tools import load_tool

# tools/speculators.py imports tools/engine_cache.py and tools/engine_venv.py, beside it, by
# their plain names.
tool = load_tool("tools/speculators.py", siblings=("engine_cache", "engine_venv"))


def python() -> Path:
    """The cached install's interpreter, or a skip (a failure under CI=true) naming how to
    install it."""
    problem = tool.install_problem()
    if problem is not None:
        message = (f"{tool.PACKAGE} {tool.VERSION} is not installed in {tool.install_dir()} "
                   f"({problem}): run `make speculators` (make test installs it)")
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return tool.python_path()


def run(script: str, *args: str, timeout: float = 600) -> dict:
    """Run ``script`` (Python source) with speculators' interpreter, isolated (-I: no
    PYTHONPATH, no user site, not the checkout), one torch thread; its last stdout line is
    one JSON object, returned. A failure fails the test with speculators' own last lines."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}
    proc = subprocess.run([str(python()), "-I", "-c", script, *args], capture_output=True,
                          text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-25:])
        pytest.fail(f"speculators' script failed (exit {proc.returncode}):\n{tail}")
    lines = proc.stdout.strip().splitlines()
    assert lines, f"speculators' script printed nothing; stderr:\n{proc.stderr[-2000:]}"
    return json.loads(lines[-1])
