"""Every case of the hostile-input corpus (tests/hostile/), through the real CLI.

The corpus is built into a temporary directory by tests/hostile/make_corpus.py. Each case
runs the real app: `convert INPUT -o OUT -q --json` or `validate INPUT --strict --json`
(what the CI gate runs), in-process (tests/support/cli.py); a canary of each group also
runs as a real `dspark` process, and the slow test runs every case that way. The rule for
bad input: the intended error class (named in the JSON report) and its exit code, exactly
one `error:` line on stderr, no traceback, and nothing written: no output, no hidden
temporary sibling, no created parent, the input and its directory unchanged.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hostile import make_corpus
from support.cli import assert_refused, run_cli, run_process, temp_siblings

from dspark_convert import errors

CASES = {case.name: case for case in make_corpus.CASES}
# One case of each group, also run as a real process in the fast loop.
CANARIES = ["st-header-duplicate-key", "cfg-nan-literal", "dir-pickle-only", "art-bad-magic"]
# Real CLI runs are mostly interpreter start-up and imports: a few at a time keep 2 cores busy.
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
            elif not path.is_file():          # a FIFO case: reading it would wait forever
                out[key] = f"special:{stat.S_IFMT(path.lstat().st_mode):o}"
            else:
                out[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def run_case(case_dir: Path, outputs: Path, run) -> dict:
    """One case through ``run`` (run_cli or run_process), with what it left around it."""
    record = json.loads((case_dir / "case.json").read_text())
    inp = case_dir / "input"
    before = snapshot(case_dir)
    if record["command"] == "convert":
        out_parent = outputs / record["name"]
        out_parent.mkdir()
        out = out_parent / "a" / "art"   # a missing parent too: it must not be created
        args = ["convert", str(inp), "-o", str(out), "-q", "--json"]
        if record.get("target"):      # the kinds converted against a target (DFlash2, MTP)
            args += ["--target", str(make_corpus.ROOT / record["target"])]
    else:
        out_parent, out = None, None
        args = ["validate", str(inp), "--strict", "--json"]
    proc = run(*args)
    return {"record": record, "proc": proc, "before": before, "after": snapshot(case_dir),
            "out_parent": out_parent, "out": out, "input": inp}


def check_refused_as_intended(result: dict) -> None:
    case, proc = CASES[result["record"]["name"]], result["proc"]
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
    assert not (result["input"].parent / "UNPICKLED").exists(), "a pickle was unpickled"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> list[Path]:
    return make_corpus.build_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def results(corpus, tmp_path_factory) -> dict[str, dict]:
    """Every case in-process, one after the other (the app is not run from two threads)."""
    outputs = tmp_path_factory.mktemp("outputs")
    done = [run_case(d, outputs, run_cli) for d in corpus]
    return {r["record"]["name"]: r for r in done}


def in_processes(case_dirs: list[Path], outputs: Path) -> list[dict]:
    with ThreadPoolExecutor(WORKERS) as pool:
        return list(pool.map(lambda d: run_case(d, outputs, run_process), case_dirs))


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
    check_refused_as_intended(results[name])


def test_canaries_as_real_processes(corpus, tmp_path):
    """A real `dspark` for one case of each group: what a user's terminal gets."""
    assert {CASES[name].group for name in CANARIES} == {c.group for c in CASES.values()}
    for result in in_processes([d for d in corpus if d.name in CANARIES], tmp_path):
        check_refused_as_intended(result)


@pytest.mark.slow
def test_every_case_as_a_real_process(corpus, tmp_path):
    """Every case again, each in a fresh `dspark` process (~106 interpreter start-ups):
    nothing that one case leaves in the interpreter decides another's outcome."""
    failures = []
    for result in in_processes(corpus, tmp_path):
        try:
            check_refused_as_intended(result)
        except AssertionError as exc:
            failures.append(f"{result['record']['name']}: {exc}")
    assert not failures, "\n".join(failures)


def test_good_inputs_pass_the_same_commands(tmp_path):
    """The corpus' bases are good: the refusals come from the edits, not the fixtures."""
    art = tmp_path / "art"
    proc = run_cli("convert", str(make_corpus.DSPARK), "-o", str(art), "-q", "--json")
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("validate", str(art), "--strict", "--json")
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
