"""The repository's scripts that are not package code (tools/ generators, bench/ builders),
loaded by path for the tests that check them, without editing sys.path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from support.paths import ROOT


def load_tool(relative: str, *, siblings: tuple[str, ...] = ()):
    """A script of the repository that is not package code (tools/docs.py,
    bench/sparse_models.py ...), loaded from its path; sys.path is left as it is.

    A script run as a script finds the scripts beside it (``from generated import ...``):
    ``siblings`` names those, loaded first under the plain name the script imports them by.
    The script itself is registered as ``dspark_tool_<folder>_<name>``, so that no plain
    name such as ``run`` or ``docs`` is taken in the test process."""
    path = ROOT / relative
    for sibling in siblings:
        _load_module(sibling, path.parent / f"{sibling}.py")
    return _load_module(f"dspark_tool_{path.parent.name}_{path.stem}", path)


def _load_module(name: str, path: Path):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module      # dataclasses and pickling look a module up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
