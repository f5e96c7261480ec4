"""`dspark --help` stays cheap: the CLI module and its help never import the heavy libraries.

Measured as behaviour, not time: each case runs the real typer app in a fresh interpreter
and records ``sys.modules`` at exit (an atexit hook, so it sees everything imported up to
the app's own ``sys.exit``). Timing lives in bench/ (bench/RESULTS.md).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# Libraries that cost 0.1-2 s to import (torch ~1.9 s); none is needed to print help.
HEAVY = {"torch", "numpy", "gguf", "huggingface_hub", "tokenizers", "matplotlib"}

CHILD = """
import atexit, json, sys
out_path, args = sys.argv[1], json.loads(sys.argv[2])

def dump():
    with open(out_path, "w") as fh:
        json.dump(sorted(sys.modules), fh)

atexit.register(dump)
sys.argv = ["dspark", *args]
if args == ["<import convert>"]:
    import dspark_convert.commands.convert  # the control case: the library does need them
    sys.exit(0)
from dspark_convert.cli.main import app
app()
"""


def imported_after(tmp_path, args: list[str]) -> tuple[subprocess.CompletedProcess, set[str]]:
    out = tmp_path / "modules.json"
    proc = subprocess.run([sys.executable, "-c", CHILD, str(out), json.dumps(args)],
                          check=False, capture_output=True, text=True, timeout=120)
    modules = set(json.loads(out.read_text()))
    return proc, {m.split(".")[0] for m in modules}


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["convert", "--help"],
                                  ["validate", "--help"], ["inspect", "--help"],
                                  ["smoke", "--help"], ["lock", "--help"]])
def test_help_does_not_import_heavy_modules(tmp_path, args):
    proc, top_level = imported_after(tmp_path, args)
    assert proc.returncode == 0, proc.stderr
    assert ("Usage" in proc.stdout) or ("dspark-convert" in proc.stdout)
    assert top_level & HEAVY == set(), f"dspark {' '.join(args)} imported {sorted(top_level & HEAVY)}"


def test_the_check_sees_heavy_imports(tmp_path):
    """Control: the same probe reports numpy and gguf once the converter is imported, so an
    empty set above means they were really not imported."""
    proc, top_level = imported_after(tmp_path, ["<import convert>"])
    assert proc.returncode == 0, proc.stderr
    assert {"numpy", "gguf"} <= top_level
