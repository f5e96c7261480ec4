"""Which commands can raise each error class: a static scan of the package's source, for
the "raised by" column of docs/EXIT_CODES.md (tools/docs.py).

The unit is a top-level definition: a function, or a class with all its methods. A unit's
references are the names it uses (calls, default values, decorators, base classes), each
resolved through its module's imports to the definition it names, anywhere in
``dspark_convert``; a module's top-level statements (tables of rules, registries) count as
part of every unit of that module. A command reaches what its typer callback references,
transitively. It can raise an error class when a reached unit names the class outside an
``except`` clause (``raise X(...)``, ``error=X``, a table of classes).

So the column is an upper bound drawn from the code, not from runs: a class is listed for a
command when some path of references leads from the command to code that names it, even
if no input takes that path. Method calls on objects are followed because the object's
class was named where it was made (its whole class is a unit); what the scan cannot see is
a name built at run time (``getattr(obj, name)``, ``importlib``), which the package does
not use to reach error-raising code. tests/test_docs.py checks the scan against the
hostile corpus: every (command, error) a case triggers is in the table.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "dspark_convert"
MODULE_LEVEL = "<module>"


@dataclass
class Module:
    name: str
    defs: dict[str, ast.AST] = field(default_factory=dict)     # top-level def/class nodes
    # local name -> ("module", dotted) for a module, ("name", module, attr) for a name in one
    imports: dict[str, tuple] = field(default_factory=dict)
    top_level: list[ast.AST] = field(default_factory=list)     # other top-level statements


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def load_modules(root: Path = ROOT) -> dict[str, Module]:
    modules: dict[str, Module] = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        module = Module(_module_name(path))
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                module.defs[node.name] = node
            else:
                module.top_level.append(node)
        modules[module.name] = module
    # Imports anywhere in the file (the CLI imports its libraries inside command bodies).
    for path in sorted((root / PACKAGE).rglob("*.py")):
        module = modules[_module_name(path)]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith(PACKAGE):
                        local = alias.asname or alias.name.split(".")[0]
                        module.imports[local] = ("module", alias.name if alias.asname else PACKAGE)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                    and node.module.startswith(PACKAGE):
                for alias in node.names:
                    local = alias.asname or alias.name
                    dotted = f"{node.module}.{alias.name}"
                    module.imports[local] = (("module", dotted) if dotted in modules
                                             else ("name", node.module, alias.name))
    return modules


def _resolve(modules: dict[str, Module], module: str, name: str, depth: int = 0) -> str | None:
    """The unit ``module:name`` is, following re-exports (``from x import name`` in a
    package's __init__); None when it is not a definition of the package."""
    if depth > 20 or module not in modules:
        return None
    m = modules[module]
    if name in m.defs:
        return f"{module}:{name}"
    target = m.imports.get(name)
    if target and target[0] == "name":
        return _resolve(modules, target[1], target[2], depth + 1)
    return None


def _references(modules: dict[str, Module], module: str, nodes: list[ast.AST],
                error_names: set[str]) -> tuple[set[str], set[str]]:
    """(units referenced, error classes named outside an except clause) by these nodes."""
    m = modules[module]
    units: set[str] = set()
    errors_named: set[str] = set()
    caught: set[int] = set()
    for top in nodes:
        for node in ast.walk(top):
            if isinstance(node, ast.ExceptHandler) and node.type is not None:
                caught.update(id(n) for n in ast.walk(node.type))
    for top in nodes:
        for node in ast.walk(top):
            if id(node) in caught:
                continue
            if isinstance(node, ast.Name):
                if node.id in error_names and _is_error(modules, module, node.id):
                    errors_named.add(node.id)
                unit = _resolve(modules, module, node.id)
                if unit:
                    units.add(unit)
                target = m.imports.get(node.id)
                if target and target[0] == "module":
                    units.add(f"{target[1]}:{MODULE_LEVEL}")
            elif isinstance(node, ast.Attribute):
                dotted = _dotted(node)
                if dotted is None:
                    continue
                head, *rest = dotted
                target = m.imports.get(head)
                if target and target[0] == "module" and rest:
                    # alias.sub.name: the longest prefix that is a module, then the name in it
                    base = target[1]
                    for i, part in enumerate(rest):
                        if f"{base}.{part}" in modules:
                            base = f"{base}.{part}"
                            continue
                        if part in error_names and _is_error(modules, base, part):
                            errors_named.add(part)
                        unit = _resolve(modules, base, part)
                        if unit:
                            units.add(unit)
                        break
                    units.add(f"{base}:{MODULE_LEVEL}")
    return units, errors_named


def _dotted(node: ast.Attribute) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def _is_error(modules: dict[str, Module], module: str, name: str) -> bool:
    unit = _resolve(modules, module, name)
    return unit == f"{PACKAGE}.errors:{name}"


def reach(modules: dict[str, Module], start: str, error_names: set[str]) -> set[str]:
    """The error classes the units reachable from ``start`` (``module:name``) name."""
    seen: set[str] = set()
    stack = [start]
    named: set[str] = set()
    while stack:
        unit = stack.pop()
        if unit in seen:
            continue
        seen.add(unit)
        module, name = unit.split(":")
        if module == f"{PACKAGE}.errors":
            continue        # where the classes are defined, not raised
        m = modules[module]
        nodes = m.top_level if name == MODULE_LEVEL else [m.defs[name]]
        units, errors_named = _references(modules, module, nodes, error_names)
        named |= errors_named
        stack.extend(units)
        stack.append(f"{module}:{MODULE_LEVEL}")
        # A package's __init__ runs before any of its modules.
        parts = module.split(".")
        stack.extend(f"{'.'.join(parts[:i])}:{MODULE_LEVEL}" for i in range(1, len(parts))
                     if ".".join(parts[:i]) in modules)
    return named


def raised_by() -> dict[str, list[str]]:
    """error class name -> the commands (``dspark NAME``) that can raise it, in the app's
    order; every concrete class is a key (an empty list: no command reaches it)."""
    import typer

    from dspark_convert.cli.main import app
    from dspark_convert.errors import concrete_errors

    error_names = {c.__name__ for c in concrete_errors()}
    modules = load_modules()
    group = typer.main.get_command(app)
    out: dict[str, list[str]] = {name: [] for name in error_names}
    for command_name, command in group.commands.items():
        callback = command.callback
        # typer wraps the callback; the original is the function the module defines
        original = getattr(callback, "__wrapped__", callback)
        start = f"{original.__module__}:{original.__name__}"
        for name in reach(modules, start, error_names):
            out[name].append(command_name)
    return out
