"""What the CLI prints: summaries, JSON, and text from files shown literally. The app runs
in-process (tests/support/cli.py); --version, --help and a usage error also as a real
`dspark` process."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import REFERENCE_DRAFTER
from support.cli import run_cli, run_process


def test_names_from_files_are_printed_literally_not_as_markup(tmp_path):
    """A directory (and so general.name) like 'dr[red]aft[/]' must not be read as rich
    markup: printed as is, never raising MarkupError."""
    src = tmp_path / "dr[red]aft[/]"
    shutil.copytree(REFERENCE_DRAFTER, src)
    out = tmp_path / "a[/bold]"
    run = run_cli("convert", str(src), "-o", str(out), "-q")
    assert run.returncode == 0, run.stderr
    assert str(src) in run.stdout and str(out) in run.stdout
    for cmd in (("validate", str(out)), ("inspect", str(out)), ("inspect", str(src))):
        run = run_cli(*cmd)
        assert run.returncode == 0, run.stderr
        assert str(out if cmd[1] == str(out) else src) in run.stdout


def test_convert_json_summary(tmp_path):
    out = tmp_path / "art"
    run = run_cli("convert", str(REFERENCE_DRAFTER), "-o", str(out), "--json")
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    assert data["ok"] is True
    assert data["drafter_gguf"]["tensors"] == 29
    assert data["stripped"] == ["embed_tokens.weight", "lm_head.weight"]
    assert run.stderr == ""          # no progress bars when stderr is not a terminal


def test_version_and_help():
    run = run_process("--version")
    assert run.returncode == 0 and run.stdout.startswith("dspark-convert ")
    run = run_process("--help")
    assert run.returncode == 0
    for command in ("convert", "validate", "inspect"):
        assert command in run.stdout
    run = run_cli("convert", "--help")
    assert "--force" in run.stdout and "--output" in run.stdout


def test_usage_error_exit_code():
    run = run_process("convert")
    assert run.returncode == 2
    assert "Traceback" not in run.stderr


def test_source_given_as_dot_is_named_after_its_directory(tmp_path):
    src = tmp_path / "my_drafter"
    shutil.copytree(REFERENCE_DRAFTER, src)
    run = run_cli("convert", ".", "-o", str(tmp_path / "out"), "-q", cwd=src)
    assert run.returncode == 0, run.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["source"]["name"] == "my_drafter"


@pytest.mark.slow   # four real processes (~2 s)
def test_an_ascii_locale_neither_fails_a_command_nor_changes_its_files(tmp_path, converted):
    """LC_ALL=C with PYTHONUTF8=0 makes stdout ASCII: convert's summary ('…' after a
    fingerprint) ended the command with UnicodeEncodeError, exit 1, after the artifact was
    published (as in the gate's convert stage). Now the line is escaped, the exit is
    0, and the artifact is byte for byte the one made under UTF-8; quantize the same."""
    from support.paths import GOLDEN_TARGET

    ascii_env = {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": None}
    out = tmp_path / "a"
    proc = run_process("convert", str(REFERENCE_DRAFTER), "-o", str(out), "--target",
                       str(GOLDEN_TARGET), env=ascii_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "\\u2026" in proc.stdout                   # escaped, not an error
    utf8 = tmp_path / "u"
    assert run_process("convert", str(REFERENCE_DRAFTER), "-o", str(utf8), "--target",
                       str(GOLDEN_TARGET)).returncode == 0
    for name in ("drafter.gguf", "manifest.json"):
        assert (out / name).read_bytes() == (utf8 / name).read_bytes()
    q = run_process("quantize", str(out), "-o", str(tmp_path / "q"), "--type", "q8_0",
                    env=ascii_env)
    assert q.returncode == 0, q.stdout + q.stderr
