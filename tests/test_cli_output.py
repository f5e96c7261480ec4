"""What the CLI prints: summaries, JSON, and text from files shown literally."""

from __future__ import annotations

import json
import shutil
import subprocess

from conftest import REFERENCE_DRAFTER, dspark_cmd


def test_names_from_files_are_printed_literally_not_as_markup(tmp_path):
    """A directory (and so general.name) like 'dr[red]aft[/]' must not be read as rich
    markup: printed as is, never raising MarkupError."""
    src = tmp_path / "dr[red]aft[/]"
    shutil.copytree(REFERENCE_DRAFTER, src)
    out = tmp_path / "a[/bold]"
    run = subprocess.run(dspark_cmd("convert", str(src), "-o", str(out), "-q"),
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert str(src) in run.stdout and str(out) in run.stdout
    for cmd in (("validate", str(out)), ("inspect", str(out)), ("inspect", str(src))):
        run = subprocess.run(dspark_cmd(*cmd), capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        assert str(out if cmd[1] == str(out) else src) in run.stdout


def test_convert_json_summary(tmp_path):
    out = tmp_path / "art"
    run = subprocess.run(dspark_cmd("convert", str(REFERENCE_DRAFTER), "-o", str(out), "--json"),
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    assert data["ok"] is True
    assert data["drafter_gguf"]["tensors"] == 29
    assert data["stripped"] == ["embed_tokens.weight", "lm_head.weight"]
    assert run.stderr == ""          # no progress bars when stderr is not a terminal


def test_version_and_help():
    run = subprocess.run(dspark_cmd("--version"), capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.startswith("dspark-convert ")
    run = subprocess.run(dspark_cmd("--help"), capture_output=True, text=True)
    assert run.returncode == 0
    for command in ("convert", "validate", "inspect"):
        assert command in run.stdout
    run = subprocess.run(dspark_cmd("convert", "--help"), capture_output=True, text=True)
    assert "--force" in run.stdout and "--output" in run.stdout


def test_usage_error_exit_code():
    run = subprocess.run(dspark_cmd("convert"), capture_output=True, text=True)
    assert run.returncode == 2
    assert "Traceback" not in run.stderr


def test_source_given_as_dot_is_named_after_its_directory(tmp_path):
    src = tmp_path / "my_drafter"
    shutil.copytree(REFERENCE_DRAFTER, src)
    run = subprocess.run(dspark_cmd("convert", ".", "-o", str(tmp_path / "out"), "-q"),
                         capture_output=True, text=True, cwd=src)
    assert run.returncode == 0, run.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["source"]["name"] == "my_drafter"
