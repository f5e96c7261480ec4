"""docs/LIBRARY.md's examples run, as a user pastes them: every ```python block of the page,
in order, in one namespace, from a directory that holds the checkout's golden/ and
release/ (what the examples read); what a block prints is what its trailing `# ` lines say
(a line ending in `...` matches any rest). Blocks fenced `python slow` load models and run
in the slow test, with the names a user fills in given: TARGET_GGUF (llama.cpp's converter
on the golden target) and DRAFTER_REPO / DRAFTER_COMMIT (the golden drafter on the
loopback Hub). The page shows every function the CLI calls to do a command's work."""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path

import pytest

from conftest import REFERENCE_DRAFTER, ROOT
from support.paths import GOLDEN_TARGET

PAGE = ROOT / "docs" / "LIBRARY.md"
BLOCK = re.compile(r"^```python( slow)?\n(.*?)^```$", re.M | re.S)


def blocks() -> list[tuple[bool, str]]:
    return [(bool(m.group(1)), m.group(2)) for m in BLOCK.finditer(PAGE.read_text())]


def expected(code: str) -> list[str]:
    """The block's trailing comment lines: what it prints."""
    out = []
    for line in reversed(code.rstrip("\n").splitlines()):
        if not line.startswith("# "):
            break
        out.append(line[2:])
    return out[::-1]


def matches(want: list[str], got: list[str]) -> bool:
    if len(want) != len(got):
        return False
    return all(g == w or (w.endswith("...") and g.startswith(w[:-3])) for w, g in zip(want, got))


def run_blocks(work: Path, namespace: dict, *, slow: bool) -> int:
    ran = 0
    cwd = os.getcwd()
    os.chdir(work)
    try:
        for i, (is_slow, code) in enumerate(blocks()):
            if is_slow and not slow:
                continue
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile(code, f"docs/LIBRARY.md, python block {i}", "exec"), namespace)
            want = expected(code)
            got = out.getvalue().splitlines()
            if want:
                assert matches(want, got), f"block {i} printed:\n{out.getvalue()}\nthe page says:\n" + \
                    "\n".join(want)
            ran += 1
    finally:
        os.chdir(cwd)
    return ran


@pytest.fixture
def work(tmp_path) -> Path:
    for name in ("golden", "release"):
        (tmp_path / name).symlink_to(ROOT / name)
    return tmp_path


def test_the_page_shows_every_function_the_cli_calls_for_a_command():
    """Every `dspark_convert.commands` function a CLI module imports whose name says it does
    a command's work (run_*, convert, export_*, validate_*, inspect_*, quantize_*, lock_*)
    appears in a block of the page: a new command gets an example or this fails."""
    shown = "\n".join(code for _, code in blocks())
    entry = re.compile(r"^(run_\w+|convert|export_\w+|validate_\w+|inspect_\w+|quantize_\w+|lock_\w+)$")
    called = set()
    for module in (ROOT / "dspark_convert" / "cli").glob("*.py"):
        for m in re.finditer(r"from dspark_convert\.commands\.\w+ import \(?([^)]*?)\)?$",
                             module.read_text(), re.M | re.S):
            for name in re.split(r"[\s,()]+", m.group(1)):
                name = name.split(" as ")[0].strip()
                if entry.match(name):
                    called.add(name)
    assert {"convert", "run_smoke", "run_gate", "export_deepspec"} <= called, called
    missing = sorted(name for name in called if not re.search(rf"\b{name}\(", shown))
    assert not missing, f"docs/LIBRARY.md has no example of {missing}"


def test_the_fast_examples_run_and_print_what_the_page_says(work):
    assert run_blocks(work, {}, slow=False) >= 6


@pytest.mark.slow
def test_every_example_runs_and_prints_what_the_page_says(work, one_torch_thread):
    from support.hub_server import HubServer
    from support.llama_cpp import engine

    target_gguf = work / "target.gguf"
    engine().convert(GOLDEN_TARGET, target_gguf)      # skips (or fails under CI) unbuilt
    commit = "0123456789abcdef0123456789abcdef01234567"
    saved = {k: os.environ.get(k) for k in ("HF_ENDPOINT", "HF_HUB_CACHE", "HF_HUB_OFFLINE")}
    with HubServer() as hub:
        hub.add_directory("deepseek-ai/dspark-golden", REFERENCE_DRAFTER, commit=commit)
        os.environ["HF_ENDPOINT"] = hub.url
        os.environ["HF_HUB_CACHE"] = str(work / "hf-cache")
        os.environ.pop("HF_HUB_OFFLINE", None)
        try:
            ran = run_blocks(work, {"TARGET_GGUF": str(target_gguf),
                                    "DRAFTER_REPO": "deepseek-ai/dspark-golden",
                                    "DRAFTER_COMMIT": commit}, slow=True)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    assert ran == len(blocks())


def _frozen(cls) -> bool:
    import dataclasses

    if hasattr(cls, "model_config"):
        return bool(cls.model_config.get("frozen"))
    return dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen


def test_the_table_names_each_function_and_the_frozen_result_it_returns():
    """Each row of the page's table: the function exists and returns the result named, a
    frozen object (every type of a union too)."""
    import importlib
    import inspect

    rows = re.findall(r"^\| `dspark [^|]*\| `commands\.(\w+)\.(\w+)`[^|]*\| `(\w+)` \|$",
                      PAGE.read_text(), re.M)
    assert len(rows) >= 15, rows
    for module, name, result in rows:
        fn = getattr(importlib.import_module(f"dspark_convert.commands.{module}"), name)
        returned = inspect.signature(fn).return_annotation     # a string: annotations
        types = [eval(part.strip(), fn.__globals__) for part in returned.split("|")]
        assert result in [t.__name__ for t in types], (name, returned)
        assert all(_frozen(t) for t in types), (name, returned)
