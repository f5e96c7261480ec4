"""The pre-release gate: scripts/gate.sh (`make gate`) and the workflow that runs it.

The script runs the real `dspark` CLI over a list of artifacts; these tests run the
script itself on the repository's release/artifacts.txt and on a list with broken entries
(both slow: real dspark processes per entry), and on malformed lists (the fast loop's
canary of the script).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, golden_source

GATE = ROOT / "scripts" / "gate.sh"
DSPARK = Path(sys.executable).parent / "dspark"


def run_gate(out: Path, listing: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "GATE_OUT": str(out), "DSPARK": str(DSPARK)}
    if listing is not None:
        env["GATE_LIST"] = str(listing)
    return subprocess.run([str(GATE)], capture_output=True, text=True, timeout=600, env=env)


def release_names() -> list[str]:
    lines = (ROOT / "release" / "artifacts.txt").read_text().splitlines()
    return [line.split()[0] for line in lines if line.split() and not line.startswith("#")]


@pytest.mark.slow   # every release artifact converted and validated by real processes (~7 s)
def test_release_list_passes_the_strict_gate(tmp_path):
    proc = run_gate(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = release_names()
    assert names and proc.stdout.splitlines()[:len(names)] == [f"PASS {n}" for n in names]
    for name in names:
        report = json.loads((tmp_path / "reports" / f"{name}.json").read_text())
        assert report["strict"] is True and report["exit_code"] == 0 and report["warnings"] == 0
        assert json.loads((tmp_path / "reports" / f"{name}.convert.json").read_text())["ok"] is True


@pytest.mark.slow   # four entries, seven dspark processes; the malformed lists are the fast canary
def test_broken_entries_fail_the_gate_with_reports(tmp_path, converted):
    tampered = tmp_path / "tampered"
    shutil.copytree(converted["reference"], tampered)
    manifest = json.loads((tampered / "manifest.json").read_text())
    manifest["artifact"]["size"] += 1
    (tampered / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    warned = tmp_path / "warned"
    shutil.copytree(converted["dflash_plain"], warned)
    (warned / "notes.txt").write_text("not part of an artifact\n")
    bad_source = tmp_path / "bad_source"
    shutil.copytree(golden_source("dflash_plain"), bad_source)
    config = json.loads((bad_source / "config.json").read_text())
    config["block_size"] = True
    (bad_source / "config.json").write_text(json.dumps(config))
    listing = tmp_path / "list.txt"
    listing.write_text(f"# a comment\n\ngood convert {golden_source('dflash_plain')}\n"
                       f"tampered artifact {tampered}   # trailing comment\n"
                       f"warned artifact {warned}\nbad_source convert {bad_source}\n")
    out = tmp_path / "gate"
    proc = run_gate(out, listing)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "PASS good"
    assert lines[1].startswith("FAIL tampered (exit 44): error: integrity: ")
    assert lines[2] == "FAIL warned (exit 45): error: --strict: warnings count as failures"
    assert lines[3].startswith("FAIL bad_source: conversion of ") and "block_size" in lines[3]
    assert lines[4].startswith("gate: 1 of 4 artifacts passed")
    reports = out / "reports"
    assert json.loads((reports / "tampered.json").read_text())["exit_code"] == 44
    warned_report = json.loads((reports / "warned.json").read_text())
    assert warned_report["ok"] is True and warned_report["exit_code"] == 45
    assert json.loads((reports / "bad_source.convert.json").read_text())["error"] == "ConfigError"
    assert not (out / "artifacts" / "bad_source").exists()


def test_malformed_list_is_refused(tmp_path):
    for text in ("only_a_name\n", "x convert a b\n", "x build golden\n",
                 "x artifact a\nx artifact b\n", "# nothing\n"):
        listing = tmp_path / "list.txt"
        listing.write_text(text)
        proc = run_gate(tmp_path / "gate", listing)
        assert proc.returncode == 2, (text, proc.stdout, proc.stderr)
        assert proc.stderr.startswith("gate: error: "), proc.stderr


def test_workflow_runs_the_same_script_and_uploads_the_reports():
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "gate.yml").read_text())
    steps = workflow["jobs"]["gate"]["steps"]
    runs = "\n".join(step.get("run", "") for step in steps)
    assert "-c constraints.txt" in runs
    assert [s["run"] for s in steps if s.get("run", "").strip() == "scripts/gate.sh"]
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact"))
    assert upload["if"] == "always()" and upload["with"]["path"] == "build/gate/reports/"
    makefile = (ROOT / "Makefile").read_text()
    assert "\ngate: $(STAMP)\n\tscripts/gate.sh\n" in makefile
