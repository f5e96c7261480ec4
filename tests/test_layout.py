"""The package's layout follows the data's path: each layer imports only the layers below
it (nothing imports upward), modules import no cycle, and the layout table of
docs/DEVELOPMENT.md names exactly these layers in this order."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "dspark_convert"
# Lowest first. A module may import its own layer and the layers before it.
LAYERS = ["errors", "checks", "util", "formats", "contract", "artifact", "source", "target",
          "scheduling", "runtime", "evaluation", "synthetic", "commands", "cli"]


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports() -> dict[str, set[str]]:
    """module -> the dspark_convert modules it imports (at any depth of the file)."""
    out: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        mod = _module(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                    and node.module.split(".")[0] == "dspark_convert":
                for alias in node.names:   # `from dspark_convert.x import y` may import module y
                    candidate = f"{node.module}.{alias.name}"
                    sub = PACKAGE.parent / (candidate.replace(".", "/") + ".py")
                    out[mod].add(candidate if sub.is_file() else node.module)
            elif isinstance(node, ast.Import):
                out[mod].update(a.name for a in node.names if a.name.split(".")[0] == "dspark_convert")
    return out


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "<root>"


def test_no_relative_imports():
    """Absolute imports say where each name comes from (the layout moved every module)."""
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            assert not (isinstance(node, ast.ImportFrom) and node.level), f"{path}: relative import"


def test_nothing_imports_upward():
    order = {name: i for i, name in enumerate(LAYERS)}
    order["<root>"] = -1                      # dspark_convert/__init__: the version
    upward = []
    for mod, imported in _imports().items():
        for other in imported:
            a, b = _layer(mod), _layer(other)
            assert a in order and b in order, f"{mod} or {other} is in no layer of LAYERS"
            if order[b] > order[a]:
                upward.append(f"{mod} -> {other}")
    assert upward == [], "imports upward:\n" + "\n".join(sorted(upward))


def test_no_import_cycles():
    graph = {m: {i for i in imports if i != m} for m, imports in _imports().items()}
    seen, stack, cycles = set(), [], []

    def visit(node):
        if node in stack:
            cycles.append(stack[stack.index(node):] + [node])
            return
        if node in seen:
            return
        seen.add(node)
        stack.append(node)
        for nxt in graph.get(node, ()):
            visit(nxt)
        stack.pop()

    for node in list(graph):
        visit(node)
    assert cycles == [], cycles[:3]


def test_layout_table_names_the_layers_in_order():
    page = (ROOT / "docs" / "DEVELOPMENT.md").read_text()
    section = page.split("## Repository layout", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| `dspark_convert/([a-z_]+)(?:/|\.py)`", section, re.M)
    assert listed == LAYERS, listed
