"""docs/CLI.md's generated parts, from the typer app itself (its click command tree):
the command index, and for each command its usage line, its help and a table of its
arguments and options (value, default, what it does). tools/docs.py calls ``render``.

The page is one section per command, ``## dspark NAME``, in the order the page gives them:
the generated block between ``<!-- BEGIN GENERATED cli:NAME -->`` and its END marker, then
the hand-written notes, which the generator never touches. A command registered on the app
without a section gets one appended (with a line asking for its notes); a section for a
command the app no longer has is an error to fix by hand (its notes would be lost).
"""

from __future__ import annotations

import inspect
import re

INDEX = "cli-index"
GLOBAL = "cli-global"
BLOCK = re.compile(r"<!-- BEGIN GENERATED (cli:[a-z][a-z0-9_-]*) -->\n.*?<!-- END GENERATED \1 -->",
                   re.DOTALL)
NO_NOTES = "_No notes yet: what `--help` cannot say about this command goes here._"


def commands() -> dict:
    """name -> click command, in registration order (hidden commands left out)."""
    import typer

    from dspark_convert.cli.main import app

    group = typer.main.get_command(app)
    return group, {name: cmd for name, cmd in group.commands.items() if not cmd.hidden}


def _context(command, name: str, parent=None):
    return command.context_class(command, info_name=name, parent=parent)


def _paragraphs(text: str | None) -> str:
    """A docstring as markdown: lines of one paragraph joined, paragraphs kept apart."""
    if not text:
        return ""
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(_escape(" ".join(p.split())) for p in paragraphs)


def _escape(text: str) -> str:
    """Help text as markdown text: ``<commit>`` would be read as an HTML tag."""
    return text.replace("<", "&lt;")


def _cell(text: str) -> str:
    return _escape(" ".join(str(text).split()).replace("|", "\\|"))


def _value(param, ctx) -> str:
    """What the parameter takes, as --help shows it (``<path>``, ``FILE=HEX``); a flag takes
    nothing."""
    if getattr(param, "is_flag", False):
        return "flag"
    record = param.get_help_record(ctx) if param.param_type_name == "option" else None
    if record:
        # "-o, --output <path>": everything after the last option name
        last = max(record[0].rfind(o) + len(o) for o in param.opts + param.secondary_opts)
        value = record[0][last:].strip()
    else:
        value = param.make_metavar(ctx) if hasattr(param, "make_metavar") else param.name
    ranges = []
    if getattr(param, "min", None) is not None:
        ranges.append(f">= {param.min}")
    if getattr(param, "max", None) is not None:
        ranges.append(f"<= {param.max}")
    return f"`{value}`" + (f" ({', '.join(ranges)})" if ranges else "")


def _default(param) -> str:
    if param.required:
        return "required"
    default = param.default
    if getattr(param, "is_flag", False) or default is None or default == [] or default == ():
        return "-"
    return f"`{default}`"


def _argument_label(param) -> str:
    label = param.metavar or param.name.upper()
    return f"`{label}...`" if param.nargs == -1 else f"`{label}`"


def _usage(command, name: str) -> str:
    pieces = ["[OPTIONS]"] + [(_argument_label(p).strip("`"))
                              for p in command.params if p.param_type_name == "argument"]
    return f"dspark {name} " + " ".join(pieces)


def command_block(name: str, command, group) -> str:
    parent = _context(group, "dspark")
    ctx = _context(command, name, parent)
    lines = ["```", _usage(command, name), "```", "", _paragraphs(command.help), "",
             "| argument / option | value | default | |", "|---|---|---|---|"]
    for param in command.get_params(ctx):
        if param.param_type_name == "argument":
            label = _argument_label(param)
            value = "one or more" if param.nargs == -1 else "-"
        else:
            if "--help" in param.opts:
                continue
            label = ", ".join(f"`{o}`" for o in param.opts + param.secondary_opts)
            value = _value(param, ctx)
            if param.multiple:
                value += ", repeatable"
        lines.append(f"| {label} | {value} | {_default(param)} | {_cell(param.help or '')} |")
    return "\n".join(lines)


def index_block(order: list[str], cmds: dict) -> str:
    rows = ["| command | what it does |", "|---|---|"]
    for name in order:
        summary = _paragraphs(cmds[name].help).split("\n\n")[0]
        rows.append(f"| [`dspark {name}`](#dspark-{name}) | {_cell(summary)} |")
    return "\n".join(rows)


def global_block(group) -> str:
    ctx = _context(group, "dspark")
    lines = ["```", "dspark [OPTIONS] COMMAND [ARGS]...", "```", "", _paragraphs(group.help), "",
             "| option | |", "|---|---|"]
    for param in group.get_params(ctx):
        label = ", ".join(f"`{o}`" for o in param.opts)
        lines.append(f"| {label} | {_cell(param.help or '')} |")
    return "\n".join(lines)


def _replace(text: str, name: str, body: str) -> str:
    pattern = re.compile(rf"(<!-- BEGIN GENERATED {re.escape(name)} -->\n).*?"
                         rf"(<!-- END GENERATED {re.escape(name)} -->)", re.DOTALL)
    if not pattern.search(text):
        raise SystemExit(f"docs/CLI.md: missing generated section '{name}'")
    return pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text)


def render(text: str) -> str:
    """docs/CLI.md with every generated part current (new commands appended)."""
    group, cmds = commands()
    documented = [m.group(1).split(":", 1)[1] for m in BLOCK.finditer(text)]
    unknown = [name for name in documented if name not in cmds]
    if unknown:
        raise SystemExit(f"docs/CLI.md documents {', '.join(unknown)}, which the app does not "
                         "register: remove the section (and move its notes) by hand")
    for name in cmds:
        if name not in documented:
            text = (text.rstrip("\n") + f"\n\n## dspark {name}\n\n"
                    f"<!-- BEGIN GENERATED cli:{name} -->\n<!-- END GENERATED cli:{name} -->\n\n"
                    f"{NO_NOTES}\n")
            documented.append(name)
    text = _replace(text, INDEX, index_block(documented, cmds))
    text = _replace(text, GLOBAL, global_block(group))
    for name in documented:
        text = _replace(text, f"cli:{name}", command_block(name, cmds[name], group))
    return text
