"""Shared fixtures: the golden data and a converted copy of each golden checkpoint."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "golden"
REFERENCE_DRAFTER = GOLDEN / "reference" / "vanilla_conf_markov" / "draft"
EXPECTED = json.loads((GOLDEN / "expected.json").read_text())


def golden_source(name: str) -> Path:
    return GOLDEN / EXPECTED[name]["source"]


def dspark_cmd(*args: str) -> list[str]:
    """The CLI as a user runs it, in a subprocess of this interpreter."""
    return [sys.executable, "-m", "dspark_convert.cli.main", *args]


@pytest.fixture(scope="session")
def converted(tmp_path_factory):
    """name -> artifact directory, each golden checkpoint converted once per session."""
    from dspark_convert.convert import convert

    root = tmp_path_factory.mktemp("converted")
    out = {}
    for name in EXPECTED:
        out[name] = root / name
        convert(golden_source(name), out[name])
    return out
