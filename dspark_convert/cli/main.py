"""`dspark`: convert (from a directory or the Hub), lock, validate, quantize, inspect,
smoke-test and evaluate DSpark drafters for Strata, check another engine's drafts (conform),
and gate a release. The entry point: importing the command modules
registers them on the one typer app (cli/app.py)."""

from __future__ import annotations

from dspark_convert.cli import (  # noqa: F401 (register)
    conform, convert, evaluate, export, gate, inspection, lock, profile, quantize, serve_bench,
    simulate, smoke, validate)
from dspark_convert.cli.app import app

__all__ = ["app"]

if __name__ == "__main__":  # pragma: no cover
    app()
