"""The typer app and what its commands share: options, output, the style of statuses.

Each command lives in its own module (cli/convert.py, cli/validate.py ...): it only parses
options, calls one library function, and maps its frozen result to output and an exit code
(cli/errors.py). Libraries are imported inside the command bodies, so that `dspark --help`
does not pay for numpy, gguf or torch.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from typer.core import TyperGroup
from rich.markup import escape as escape_markup

from dspark_convert import __version__
from dspark_convert.util.text import shown


def escape(text: object) -> str:
    """Text from files and users for rich output: non-printing characters escaped (no
    terminal escape sequence reaches the screen), then rich markup escaped."""
    return escape_markup(shown(text))


# Every command's --help ends with where its exit codes are explained (the page is generated
# from errors.py by tools/docs.py); set here once, so a new command gets it by registering.
EXIT_CODES_EPILOG = ("Exit codes: 0 success, 2 usage, one code per kind of refusal; every code, "
                     "its meaning and the commands that raise it: docs/EXIT_CODES.md.")


class _Typer(typer.Typer):
    def command(self, *args, epilog: Optional[str] = EXIT_CODES_EPILOG, **kwargs):
        return super().command(*args, epilog=epilog, **kwargs)


class _Group(TyperGroup):
    """The app's group: a usage error (exit 2: an unknown option, a value that does not
    parse) is printed as click prints it and, when the command was given --json, also as a
    JSON error object on stdout, as every refusal of a command is (cli/errors.py): a script
    reading stdout gets one JSON document either way."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        import sys

        from typer._click.exceptions import ClickException   # typer's own click
        from typer.exceptions import Abort

        argv = sys.argv[1:] if args is None else list(args)
        if not standalone_mode:
            return super().main(argv, prog_name, complete_var, standalone_mode, **extra)
        try:
            code = super().main(argv, prog_name, complete_var, False, **extra)
        except Abort:                  # what standalone mode does with it
            sys.stderr.write("Aborted!\n")
            sys.exit(1)
        except ClickException as exc:
            exc.show()
            if self._wants_json(argv):
                from dspark_convert.util.json_out import dumps

                sys.stdout.write(dumps(usage_error_dict(exc), indent=2) + "\n")
            sys.exit(exc.exit_code)
        sys.exit(code if isinstance(code, int) else 0)

    def _wants_json(self, argv: list[str]) -> bool:
        """``--json`` given to a command that has it (not, say, the value of --prompt)."""
        command = self.commands.get(argv[0]) if argv else None
        if command is None or "--json" not in argv:
            return False
        options = {opt: p for p in command.params for opt in getattr(p, "opts", ())}
        if "--json" not in options:
            return False
        args = iter(argv[1:])
        for arg in args:
            if arg == "--":
                return False
            if arg == "--json":
                return True
            param = options.get(arg)
            if param is not None and not getattr(param, "is_flag", False) \
                    and not getattr(param, "count", False):
                next(args, None)       # the option's value, whatever it looks like
        return False


def usage_error_dict(exc) -> dict:
    """A usage error as the JSON error object of a refusal (DSparkError.to_dict's keys)."""
    param = getattr(exc, "param", None)
    out = {"ok": False, "error": "UsageError", "kind": "usage", "exit_code": exc.exit_code,
           "message": shown(exc.format_message())}
    if param is not None and getattr(param, "opts", None):
        out["field"] = param.opts[0]
    return out


app = _Typer(
    cls=_Group,
    name="dspark",
    help="Convert DeepSeek DSpark drafters into Strata artifacts (from a directory or the Hub, "
         "pinned), validate, inspect, quantize, run, evaluate and export them, and gate "
         "releases.",
    epilog=EXIT_CODES_EPILOG,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

def int_option(text: str) -> int:
    """The parser of every integer option: util/text.parse_int's rule and message (a
    5,000-digit number is "an integer of 5000 digits", not Python's advice); a usage error."""
    from dspark_convert.util.text import parse_int

    if isinstance(text, int):          # a default
        return text
    try:
        return parse_int(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def float_option(text: str) -> float:
    """The parser of a number option (temperatures, thresholds): Python's float, or a usage
    error that names what was typed; a decimal comma ("0,7") is told the decimal point."""
    import re

    if isinstance(text, (int, float)):  # a default
        return float(text)
    stripped = text.strip()
    try:
        return float(stripped)
    except ValueError:
        pass
    quoted = shown(stripped if len(stripped) <= 40 else stripped[:37] + "...")
    if re.fullmatch(r"[+-]?\d*,\d+", stripped):
        raise typer.BadParameter(f"expected a number with a decimal point, found {quoted!r}: "
                                 f"write {stripped.replace(',', '.')}") from None
    raise typer.BadParameter(f"expected a number, found {quoted!r}") from None


def confidence_option(text: str) -> float:
    """float_option for a confidence cutoff: a number in [0, 1], else a usage error."""
    value = float_option(text)
    if not 0.0 <= value <= 1.0:
        raise typer.BadParameter(f"expected a confidence in [0, 1], found {value:g}")
    return value


JsonOpt = Annotated[bool, typer.Option("--json", help="Print a machine-readable JSON report on stdout.")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show the traceback of an error.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto, cpu or cuda.")]
# Text, not a Path: a Path would turn an empty -o "" into "." (util/atomic.check_outputs).
ArtifactOutputOpt = Annotated[str, typer.Option("--output", "-o", metavar="<path>",
                                                help="The artifact directory to create.")]
TargetOpt = Annotated[Optional[str], typer.Option(
    "--target", help="The target model: a directory (config.json, tokenizer.json, safetensors) "
    "or org/name@<40-hex commit> on the Hub; check geometry, embedding identity and tokenizer "
    "against it.")]
ResolveOpt = Annotated[bool, typer.Option(
    "--resolve", help="Allow a branch or tag in org/name@REV: resolve it to its commit now "
    "(printed and recorded).")]
Sha256Opt = Annotated[Optional[list[str]], typer.Option(
    "--sha256", help="Pin a Hub file: FILE=SHA256 (repeatable).", metavar="FILE=HEX")]
LockOpt = Annotated[Optional[Path], typer.Option(
    "--lock", help="A lock file from `dspark lock`: refuse any other commit or file.")]

STATUS_STYLE = {"passed": "green", "info": "cyan", "warning": "yellow", "failed": "bold red",
                "skipped": "dim", "ok": "green", "stripped": "cyan", "absent": "dim", "missing": "bold red",
                "unexpected": "bold red", "shape": "bold red", "dtype": "bold red"}


def _out() -> Console:
    return Console(soft_wrap=True, highlight=False)


def _version(value: bool) -> None:
    if value:
        print(f"dspark-convert {__version__}")
        raise typer.Exit(0)




# The commands whose work is element-wise (read, hash, compare, convert, write): they call no
# BLAS routine, so numpy's OpenBLAS need not start its threads, one per core, on import
# (spinning workers that a 2-core runner's other jobs pay for). The commands that run torch
# (smoke, eval) or use BLAS (quantize's error sums) keep the libraries' defaults.
NO_BLAS_COMMANDS = frozenset({"convert", "validate", "inspect", "lock"})
# What OpenBLAS reads for its thread count, in order: a user who set any of them chose.
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")


def one_blas_thread() -> None:
    """OPENBLAS_NUM_THREADS=1 for this process, unless the user set a thread count. It must
    run before numpy's first import (OpenBLAS reads it once, when numpy loads it): the
    command modules import numpy only inside their bodies, after the app's callback."""
    if not any(name in os.environ for name in BLAS_THREAD_VARIABLES):
        os.environ["OPENBLAS_NUM_THREADS"] = "1"


def printable_anywhere() -> None:
    """Under a locale whose encoding cannot hold every character (LC_ALL=C with
    PYTHONUTF8=0: ASCII), a line naming a path or a value with a non-ASCII character, or
    our own '…', would end the command with UnicodeEncodeError (exit 1) after its work was
    done (the gate's convert stage did). Such characters are written as backslash
    escapes there instead; files are always written as UTF-8, whatever the locale."""
    for stream in (sys.stdout, sys.stderr):
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "")
        if encoding != "utf8" and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


@app.callback()
def main(
    ctx: typer.Context,
    version: Annotated[Optional[bool], typer.Option("--version", callback=_version, is_eager=True,
                                                    help="Print the version and exit.")] = None,
) -> None:
    """Exit codes: 0 success, 2 usage, one per kind of refusal (docs/EXIT_CODES.md)."""
    printable_anywhere()
    if ctx.invoked_subcommand in NO_BLAS_COMMANDS:
        one_blas_thread()


def print_hub(out: Console, hub) -> None:
    if hub.resolved:
        out.print(escape(f"  resolved {hub.repo}@{hub.requested_revision} -> {hub.commit} "
                         "(recorded)"))
    where = "the local cache (offline)" if hub.offline else hub.endpoint
    out.print(escape(f"  {hub.repo}@{hub.commit} from {where}: {len(hub.files)} file(s) "
                     "SHA-256 verified"))
    for f in hub.files:
        against = ", ".join(f.verified_against) or "nothing to compare with"
        out.print(escape(f"    {f.path}  {f.size:,} bytes  sha256 {f.sha256}  ({against})"))


# Both smoke and eval print the memory estimate before the weights are loaded (their JSON
# reports carry the same fields).
MaxMemoryOpt = Annotated[Optional[str], typer.Option(
    "--max-memory", metavar="SIZE", help="Check the memory estimate against SIZE (20GB, "
    "16GiB) instead of what the device has available.")]


def print_estimate(out: Console, m, drafters: str = "drafter") -> None:
    from dspark_convert.runtime.budget import format_bytes as gb

    out.print(escape(f"memory estimate {gb(m.estimate_bytes)} on {m.device} ({m.dtype}): "
                     f"weights {gb(m.target_weights_bytes)} target + "
                     f"{gb(m.drafter_weights_bytes)} {drafters}, activations "
                     f"{gb(m.activations_bytes)} ({m.context_tokens} positions), runtime "
                     f"{gb(m.runtime_bytes)}; {gb(m.budget_bytes)} available ({m.budget_source})"))


def print_check(out: Console, check) -> None:
    """One check as convert and quantize list their warnings and notes."""
    out.print(f"  [{STATUS_STYLE[check.status]}]{check.status}[/] {escape(check.name)}: "
              f"{escape(check.detail)}")


def print_engines(out, engines, required=()) -> None:
    """The engines table: each consumer, whether it accepts the artifact, and its first
    reason (validate; convert and quantize print the same for their output)."""
    from rich.table import Table

    table = Table(title="engines", show_lines=False)
    table.add_column("engine")
    table.add_column("accepts")
    table.add_column("first reason", overflow="fold")
    for name, record in engines.items():
        verdict = "[green]yes[/]" if record.accepts else \
            ("[bold red]no[/]" if name in required else "[cyan]no[/]")
        table.add_row(escape(name + (" (required)" if name in required else "")), verdict,
                      escape(record.reason or "-"))
    out.print(table)
