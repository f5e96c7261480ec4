"""bench/RESULTS.md's generated parts: each benchmark rewrites only the text between its own
markers, or appends its section (a heading, then the markers) the first time."""

from __future__ import annotations

from pathlib import Path

RESULTS_MD = Path(__file__).resolve().parent / "RESULTS.md"


def write_section(text: str, *, begin: str, end: str, heading: str) -> None:
    old = RESULTS_MD.read_text()
    block = f"{begin}\n{text}\n{end}"
    if begin in old:
        new = old[:old.index(begin)] + block + old[old.index(end) + len(end):]
    else:
        new = old.rstrip("\n") + f"\n\n# {heading}\n\n" + block + "\n"
    RESULTS_MD.write_text(new)
