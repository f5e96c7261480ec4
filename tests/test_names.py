"""Names from inputs (directory and file names, tensor names, paths) through the real CLI:
never exit 1, never a raw control character on the terminal. The
app runs in-process; a directory name that is not UTF-8 also goes through a real process'
argv (bytes, decoded by the interpreter)."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest
from conftest import REFERENCE_DRAFTER
from support.cli import assert_one_error_line, assert_valid, run_cli, run_process

from dspark_convert import errors
from dspark_convert.util.text import shown

LONG = "n" * 256                      # one byte over NAME_MAX


def _bytes_dir(parent: Path, name: bytes) -> Path:
    path = Path(os.fsdecode(os.path.join(os.fsencode(parent), name)))
    shutil.copytree(REFERENCE_DRAFTER, path)
    return path


def test_shown_escapes_only_what_does_not_print():
    assert shown("café 東京 😀 a-b_c.safetensors") == "café 東京 😀 a-b_c.safetensors"
    assert shown("a\x1b[2Kb") == "a\\x1b[2Kb"
    assert shown(os.fsdecode(b"x\xffy")) == "x\\xffy"
    assert shown("rtl\u202eexe") == "rtl\\u202eexe"
    assert shown("new\nline\ttab") == "new\\x0aline\\x09tab"


def test_a_checkpoint_directory_whose_name_is_not_utf8_converts(tmp_path: Path):
    src = _bytes_dir(tmp_path, b"draft-\xff\xfe")
    out = tmp_path / "art"
    proc = run_process("convert", os.fsdecode(os.fsencode(src)), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["source"]["name"] == "draft-\\xff\\xfe"   # escaped, recorded as UTF-8 text
    assert_valid(out)
    # ... and an artifact directory named so validates, its table printed escaped.
    moved = Path(os.fsdecode(os.fsencode(tmp_path) + b"/art-\xff"))
    out.rename(moved)
    proc = run_cli("validate", str(moved))
    assert proc.returncode == 0, proc.stderr
    assert "art-\\xff" in proc.stdout


@pytest.mark.parametrize("name", [b"notes-\xff.txt", b"\x1b[2K\x1b[1Gerased.txt",
                                  "r\u202etxt.safetensors.md".encode()])
def test_a_stray_file_with_a_hostile_name_is_listed_escaped(tmp_path: Path, name: bytes):
    src = _bytes_dir(tmp_path, b"src")
    (Path(os.fsencode(src).decode()) / os.fsdecode(name)).write_text("not opened\n")
    out = tmp_path / "art"
    proc = run_cli("convert", str(src), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout + proc.stderr
    layout = json.loads((out / "manifest.json").read_text())["checks"][0]
    assert layout["name"] == "source.layout" and shown(os.fsdecode(name)) in layout["detail"]
    assert_valid(out)


def test_a_tensor_name_with_escape_sequences_is_refused_escaped(tmp_path: Path):
    src = tmp_path / "src"
    shutil.copytree(REFERENCE_DRAFTER, src)
    raw = (src / "model.safetensors").read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length])
    # The embedding is optional: renamed, it is an unexpected tensor named in the message.
    header["\x1b[2K\rembed_tokens.weight"] = header.pop("embed_tokens.weight")
    text = json.dumps(header).encode()
    (src / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + length:])
    proc = run_cli("convert", str(src), "-o", str(tmp_path / "art"))
    line = assert_one_error_line(proc, errors.UnexpectedTensorError.exit_code,
                                 "\\x1b[2K\\x0dembed_tokens.weight")  # \r escaped, not folded
    assert "\x1b" not in proc.stderr and "\r" not in proc.stderr, line
    assert not (tmp_path / "art").exists()


# --- a path component longer than any file system takes: one line, the path's own code ---------

def test_long_path_components(tmp_path: Path):
    art = tmp_path / "art"
    assert run_cli("convert", str(REFERENCE_DRAFTER), "-o", str(art), "-q").returncode == 0
    long = str(tmp_path / LONG)
    cases = [
        (("convert", long, "-o", str(tmp_path / "x")), errors.SourceNotFoundError),
        (("convert", str(REFERENCE_DRAFTER), "-o", long), errors.OutputWriteError),
        (("convert", str(REFERENCE_DRAFTER), "-o", str(tmp_path / "y"), "--target", long),
         errors.TargetNotFoundError),
        (("validate", long), errors.InvalidArtifactError),
        (("validate", str(art), "--target", long), errors.TargetNotFoundError),
        (("inspect", long), errors.SourceNotFoundError),
        (("lock", "org/name@" + "0" * 40, "-o", long), errors.OutputWriteError),
    ]
    for args, error in cases:
        proc = run_cli(*args)
        assert_one_error_line(proc, error.exit_code, "256 bytes long", "at most 255 bytes")
    assert sorted(os.listdir(tmp_path)) == ["art"]
