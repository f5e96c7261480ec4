"""Checked-in generated files are current, and the error table is closed and consistent."""

from __future__ import annotations

import re

from conftest import ROOT
from support.tools import load_tool

from dspark_convert import errors

# The generators are tools of the repository (tools/), not package code: loaded by path.
docs = load_tool("tools/docs.py", siblings=("generated", "cli_docs", "raisers"))
schemas = load_tool("tools/schemas.py", siblings=("generated",))


def test_schemas_are_current():
    assert schemas.stale() == [], "run: python tools/schemas.py (make schemas)"


def test_generated_doc_sections_are_current():
    assert docs.stale() == [], "run: python tools/docs.py (make docs)"


def test_exit_codes_are_unique_and_documented():
    classes = errors.concrete_errors()
    codes = [c.exit_code for c in classes]
    assert len(codes) == len(set(codes))
    assert 0 not in codes and 2 not in codes
    page = (ROOT / "docs" / "EXIT_CODES.md").read_text()
    for cls in classes:
        assert re.search(rf"\| {cls.exit_code} \| `{cls.__name__}` \|", page), cls.__name__


def test_every_error_class_has_a_docstring():
    for cls in errors.concrete_errors():
        assert cls.__doc__ and cls.__doc__.strip(), cls.__name__


def test_ci_runs_exactly_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme and "make demo" in readme
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == "make test"


def test_error_messages_are_one_line():
    # A line break from an input is escaped, not collapsed: the name stays recognisable.
    err = errors.ConfigError("a\nb   c\r\t\u2028 ")
    assert err.message == "a\\x0ab   c\\x0d\\x09\\u2028"
    assert err.to_dict()["exit_code"] == 13
