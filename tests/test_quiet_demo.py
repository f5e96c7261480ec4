"""`make demo` is quiet (tools/demo.py: each step's command and one line of its --json report,
no table) and `make install` shows its progress (tools/install_progress.py around pip)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from support.cli import run_cli
from support.paths import ROOT
from support.tools import load_tool

TABLE_CHARS = set("─━│┃┏┓┗┛┡┩└┘┌┐├┤")


demo = load_tool("tools/demo.py")
install_progress = load_tool("tools/install_progress.py")


def test_make_demo_runs_the_demo_script_silently():
    """The Makefile's demo recipe is the script, not the commands echoed one by one."""
    makefile = (ROOT / "Makefile").read_text()
    assert "\ndemo: $(STAMP)\n\t@$(BIN)/python tools/demo.py --out build/demo\n" in makefile


def test_each_summary_line_reads_the_commands_real_json(tmp_path):
    """The first five steps (inspect, convert with and without a target, validate) run as
    the demo runs them, their JSON read by the demo's summaries: one line each, no table,
    the facts the JSON holds."""
    out = str(tmp_path / "demo")
    for what, args, _env in demo.steps(out)[:5]:
        proc = run_cli(*args, "--json", cwd=ROOT)
        assert proc.returncode == 0, proc.stderr
        line = demo.SUMMARY[args[0]](json.loads(proc.stdout))
        assert "\n" not in line and not TABLE_CHARS & set(line), line
        if args[0] == "inspect":
            assert line.startswith("qwen3-dspark: 31 tensors (2 stripped, 29 ok), block 7"), line
        elif args[0] == "convert" and "--target" in args:
            assert line.startswith(f"{out}/reference/drafter.gguf: 29 tensors, 208,992 bytes"), line
            assert "target 10 passed" in line and "strata.open no" in line
        elif args[0] == "convert":
            assert "dflash_plain/drafter.gguf: 25 tensors" in line and "strata.open yes" in line
        else:
            assert line.startswith("passed: ") and " failed" not in line, line


@pytest.mark.slow
def test_the_demo_prints_a_line_per_step_and_writes_what_it_always_wrote(tmp_path):
    """The whole demo: the command and one summary line per step, a first and a last line
    (28 lines; the commands' own output was 626 lines, 533 of them table borders), and the
    files it always wrote, the eval's plot being docs/eval-acceptance.png byte for byte."""
    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "demo.py"), "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=900,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    steps = demo.steps(str(out))
    assert len(lines) == 2 * len(steps) + 2, proc.stdout
    assert not TABLE_CHARS & set(proc.stdout)
    for number, (_what, args, _env) in enumerate(steps):
        assert lines[1 + 2 * number].endswith("dspark " + " ".join(args))
    assert "every cycle equal to DeepSpec's reference run" in proc.stdout
    assert lines[-1].startswith("demo: done in ") and f"{out}/eval/report.md" in lines[-1]
    for name in ("reference", "dflash_plain", "gemma4", "dflash_shared"):
        assert sorted(p.name for p in (out / name).iterdir()) == ["drafter.gguf", "manifest.json"]
    for name in ("smoke-trace.json", "gemma4-smoke-trace.json", "acceptance.png", "eval/report.md"):
        assert (out / name).is_file(), name
    assert (out / "eval" / "acceptance.png").read_bytes() == \
        (ROOT / "docs" / "eval-acceptance.png").read_bytes()


def test_a_failing_step_shows_the_commands_own_error_and_stops(tmp_path, monkeypatch, capsys):
    """A step that fails: its error line as the command printed it, the step named, the
    command's exit code; no later step runs."""
    monkeypatch.setattr(demo, "steps", lambda out: [
        ("a step that fails", ["validate", str(tmp_path / "none")], {}),
        ("never run", ["inspect", str(tmp_path / "never")], {})])
    code = demo.main(["--out", str(tmp_path / "demo")])
    captured = capsys.readouterr()
    assert code == 40
    assert "error: artifact.files:" in captured.err and "demo: step 1 failed (exit 40)" in captured.err
    assert "never" not in captured.out


# --- install progress ---------------------------------------------------------------------

def test_the_lock_counts_its_pinned_distributions():
    lock = ROOT / "requirements.lock"
    pinned = [line for line in lock.read_text().splitlines()
              if line.strip() and not line.startswith(("#", " ", "-")) and "==" in line]
    assert install_progress.expected(["pip", "install", "-r", str(lock)]) == len(pinned) > 40
    assert install_progress.expected(["pip", "install", "x"]) is None


def _wheel(directory: Path) -> Path:
    """A real, minimal wheel (one module), written with the standard library."""
    name = "dspark_progress_probe-1.0-py3-none-any.whl"
    files = {
        "dspark_progress_probe.py": b"VALUE = 1\n",
        "dspark_progress_probe-1.0.dist-info/METADATA":
            b"Metadata-Version: 2.1\nName: dspark-progress-probe\nVersion: 1.0\n",
        "dspark_progress_probe-1.0.dist-info/WHEEL":
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append("dspark_progress_probe-1.0.dist-info/RECORD,,")
    files["dspark_progress_probe-1.0.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = directory / name
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return wheel


def _pip(*args: str) -> list[str]:
    return [sys.executable, "-m", "pip", "--disable-pip-version-check", "install", "--no-index",
            "--no-deps", *args]


def test_install_progress_counts_what_pip_fetches_and_keeps_its_output(tmp_path):
    """A real pip install (a local wheel into a --target directory): a line when it starts,
    the distribution found, the unpacking, the end; pip's whole output in the log."""
    log = tmp_path / "logs" / "pip.log"
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "install_progress.py"), str(log),
                           "--", *_pip("--target", str(tmp_path / "site"), str(_wheel(tmp_path)))],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("install: pip install of the pinned distributions")
    assert "install: 1 distributions fetched (dspark_progress_probe==1.0)" in lines
    assert any(line.startswith("install: unpacking 1 distributions ... ") for line in lines)
    assert lines[-1].startswith("install: 1 distributions in ") and str(log) in lines[-1]
    assert "Successfully installed dspark-progress-probe-1.0" in log.read_text()
    assert (tmp_path / "site" / "dspark_progress_probe.py").is_file()


def test_install_progress_shows_pips_error_and_exits_with_its_status(tmp_path):
    """pip failing (a requirement no index holds, --no-index): the end of its output on
    stderr, the log named, pip's exit status."""
    req = tmp_path / "req.txt"
    req.write_text("dspark-progress-probe-absent==1.0\n")
    log = tmp_path / "pip.log"
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "install_progress.py"), str(log),
                           "--", *_pip("--target", str(tmp_path / "site"), "-r", str(req))],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "dspark-progress-probe-absent" in proc.stderr
    assert proc.stderr.splitlines()[-1] == f"install: pip failed (exit 1); its whole output: {log}"
    assert proc.stdout.splitlines()[0].startswith("install: pip install of 1 pinned")
