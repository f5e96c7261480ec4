"""The command line shared by the generators of checked-in files (schemas/, doc tables)."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def generator_main(what: str, stale: Callable[[], list[str]], write: Callable[[], None],
                   regenerate: str) -> int:
    """``--check``: list stale files and return 1; otherwise rewrite them and return 0."""
    parser = argparse.ArgumentParser(description=f"Write or check {what}")
    parser.add_argument("--check", action="store_true", help="exit 1 if a file is stale")
    if parser.parse_args().check:
        problems = stale()
        for name in problems:
            print(f"{name} is stale: run {regenerate}")
        return 1 if problems else 0
    write()
    print(f"wrote {what}")
    return 0
