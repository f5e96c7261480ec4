"""Every case of the hostile-input corpus (tests/hostile/), through the real CLI.

The corpus is built into a temporary directory by tests/hostile/make_corpus.py. Each case
runs as a real `dspark` subprocess: `convert INPUT -o OUT -q --json` or `validate INPUT
--strict --json` (what the CI gate runs). The rule for bad input: the intended error class
(named in the JSON report) and its exit code, exactly one `error:` line on stderr, no
traceback, and nothing written: no output, no hidden temporary sibling, no created
parent, the input and its directory unchanged.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_cli_refusals import assert_refused, temp_siblings

sys.path.insert(0, str(Path(__file__).resolve().parent / "hostile"))
import make_corpus

from dspark_convert import errors

DSPARK = Path(sys.executable).parent / "dspark"
CASES = {case.name: case for case in make_corpus.CASES}
# CLI runs are mostly interpreter start-up and imports: a few at a time keep 2 cores busy.
WORKERS = 4


def snapshot(directory: Path) -> dict[str, str]:
    """Every entry under ``directory``: file hashes, link targets, directories."""
    out = {}
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = Path(root) / name
            key = str(path.relative_to(directory))
            if path.is_symlink():
                out[key] = "link:" + os.readlink(path)
            elif path.is_dir():
                out[key] = "dir"
            else:
                out[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def run_case(case_dir: Path, outputs: Path) -> dict:
    record = json.loads((case_dir / "case.json").read_text())
    inp = case_dir / "input"
    before = snapshot(case_dir)
    if record["command"] == "convert":
        out_parent = outputs / record["name"]
        out_parent.mkdir()
        out = out_parent / "a" / "art"   # a missing parent too: it must not be created
        args = ["convert", str(inp), "-o", str(out), "-q", "--json"]
    else:
        out_parent, out = None, None
        args = ["validate", str(inp), "--strict", "--json"]
    proc = subprocess.run([str(DSPARK), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})
    return {"record": record, "proc": proc, "before": before, "after": snapshot(case_dir),
            "out_parent": out_parent, "out": out}


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, dict]:
    corpus = tmp_path_factory.mktemp("corpus")
    outputs = tmp_path_factory.mktemp("outputs")
    built = make_corpus.build_corpus(corpus)
    with ThreadPoolExecutor(WORKERS) as pool:
        done = list(pool.map(lambda d: run_case(d, outputs), built))
    return {r["record"]["name"]: r for r in done}


def test_corpus_size_and_coverage():
    assert len(CASES) == len(make_corpus.CASES) >= 40
    groups = {c.group for c in CASES.values()}
    assert groups == {"safetensors", "config", "directory", "artifact"}
    for group in groups:
        assert sum(c.group == group for c in CASES.values()) >= 8, group
    # Every case names a concrete error class of the closed hierarchy.
    concrete = set(errors.concrete_errors())
    assert all(c.error in concrete for c in CASES.values())


@pytest.mark.parametrize("name", sorted(CASES))
def test_case_is_refused_as_intended(results, name):
    result = results[name]
    case, proc = CASES[name], result["proc"]
    line = assert_refused(proc, case.error, [])
    report = json.loads(proc.stdout)
    assert report["ok"] is False
    if case.command == "convert":
        assert report["error"] == case.error.__name__, line
        assert line == "error: " + report["message"]
        # nothing written: no output, no temporary sibling, not even the missing parent
        assert not result["out"].exists()
        assert temp_siblings(result["out"]) == []
        assert os.listdir(result["out_parent"]) == []
    else:
        failed = [c for c in report["checks"] if c["status"] == "failed"]
        assert failed and failed[0]["error"] == case.error.__name__, line
        assert report["exit_code"] == case.error.exit_code and report["strict"] is True
        assert line == f"error: {failed[0]['name']}: {failed[0]['detail']}"
    # The input, and everything next to it, is exactly as the generator left it.
    assert result["after"] == result["before"]
    assert not (Path(proc.args[2]).parent / "UNPICKLED").exists(), "a pickle was unpickled"


def test_good_inputs_pass_the_same_commands(tmp_path):
    """The corpus' bases are good: the refusals come from the edits, not the fixtures."""
    art = tmp_path / "art"
    proc = subprocess.run([str(DSPARK), "convert", str(make_corpus.DSPARK), "-o", str(art), "-q",
                           "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run([str(DSPARK), "validate", str(art), "--strict", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["exit_code"] == 0


def test_corpus_is_deterministic(tmp_path):
    names = ["st-header-duplicate-key", "st-wrong-dtype", "cfg-nan-literal",
             "dir-tensor-in-two-shards", "art-tensor-type-edited", "art-manifest-contract-edited"]
    first = make_corpus.build_corpus(tmp_path / "one", names)
    second = make_corpus.build_corpus(tmp_path / "two", names)
    assert len(first) == len(names)
    for a, b in zip(first, second):
        assert snapshot(a) == snapshot(b), a.name


def test_readme_lists_every_case():
    readme = (Path(make_corpus.HERE) / "README.md").read_text()
    assert readme == make_corpus.readme_text(), "run: python tests/hostile/make_corpus.py --readme"
