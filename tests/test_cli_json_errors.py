"""Every command prints a JSON error object on stdout with --json when it refuses
(inspect used to print nothing), besides the one `error:` line on stderr."""

from __future__ import annotations

import json

import pytest
from support.cli import run_cli

from dspark_convert.errors import SourceNotFoundError


@pytest.mark.parametrize("command", ["inspect", "validate", "convert"])
def test_a_refusal_with_json_prints_json(tmp_path, command):
    missing = tmp_path / "missing"
    args = [command, str(missing), "--json"] + (["-o", str(tmp_path / "o")] if command == "convert" else [])
    proc = run_cli(*args)
    assert proc.returncode != 0 and len(proc.stderr.splitlines()) == 1
    report = json.loads(proc.stdout)
    assert report["ok"] is False
    if command == "inspect":
        assert report["error"] == "SourceNotFoundError"
        assert report["exit_code"] == SourceNotFoundError.exit_code == proc.returncode
