"""dspark-mlx for the tests: the one way a test finds the engine's interpreter. The
install is tools/dspark_mlx.py's (`make dspark-mlx`; `make test` installs it when missing).

Where the install is missing a test skips, except under CI (``CI=true``), where it FAILS: the
engine tests are part of what CI proves, and a skip there would hide a broken install step.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from support.tools import load_tool

# tools/dspark_mlx.py imports tools/engine_cache.py and tools/engine_venv.py, beside it, by
# their plain names.
tool = load_tool("tools/dspark_mlx.py", siblings=("engine_cache", "engine_venv"))


def engine() -> Path:
    """The cached install's interpreter, or a skip (a failure under CI=true) naming how to
    install it."""
    problem = tool.install_problem()
    if problem is not None:
        message = (f"{tool.PACKAGE} {tool.VERSION} is not installed in {tool.install_dir()} "
                   f"({problem}): run `make dspark-mlx` (make test installs it)")
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return tool.python_path()


def raw_records(python: Path, request: dict, tmp: Path, timeout: float = 300) -> bytes:
    """The records dspark-mlx's run writes, as bytes: the eval's own runner
    (engine_dspark_mlx.RUNNER) run in ``python`` on ``request``, as the eval runs it; what
    the hostile-record tests edit one way each and feed to the reader."""
    import json
    import subprocess

    from dspark_convert.evaluation import engine_dspark_mlx as M

    script, req = tmp / "runner.py", tmp / "request.json"
    script.write_text(M.RUNNER, encoding="utf-8")
    req.write_text(json.dumps(request), encoding="utf-8")
    r, w = os.pipe()
    proc = subprocess.Popen([str(python), "-I", "-B", str(script), str(req), str(w)],
                            pass_fds=(w,), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=M.environment())
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        data = fh.read()
    err = proc.communicate(timeout=timeout)[1]
    assert proc.returncode == 0, err[-2000:]
    return data
