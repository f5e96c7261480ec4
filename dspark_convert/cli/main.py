"""`dspark`: convert, validate and inspect DSpark drafters for Strata.

Each command only parses options, calls one library function, and maps its frozen result
to output and an exit code (see cli/errors.py). The library is imported inside each
command so that `dspark --help` does not pay for numpy or gguf.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .. import __version__
from .errors import run

app = typer.Typer(
    name="dspark",
    help="Convert DeepSeek DSpark drafters into Strata artifacts, validate and inspect them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print a machine-readable JSON report on stdout.")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show the traceback of an error.")]

STATUS_STYLE = {"passed": "green", "warning": "yellow", "failed": "bold red", "skipped": "dim",
                "ok": "green", "stripped": "cyan", "absent": "dim", "missing": "bold red",
                "unexpected": "bold red", "shape": "bold red", "dtype": "bold red"}


def _out() -> Console:
    return Console(soft_wrap=True, highlight=False)


def _version(value: bool) -> None:
    if value:
        print(f"dspark-convert {__version__}")
        raise typer.Exit(0)


@app.callback()
def main(
    version: Annotated[Optional[bool], typer.Option("--version", callback=_version, is_eager=True,
                                                    help="Print the version and exit.")] = None,
) -> None:
    """Exit codes: 0 success, 2 usage, 10-46 one per kind of refusal (see README)."""


@app.command()
def convert(
    source: Annotated[str, typer.Argument(help="A DSpark checkpoint directory (config.json + safetensors).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="The artifact directory to create.")],
    force: Annotated[bool, typer.Option("--force", help="Replace an existing output, atomically.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")] = False,
    as_json: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Convert a checkpoint into OUTPUT/drafter.gguf + OUTPUT/manifest.json."""

    def body() -> int:
        from ..convert import convert as do_convert
        from .progress import RichProgress

        result = do_convert(source, output, force=force,
                            progress=RichProgress(enabled=not quiet and not as_json))
        m = result.manifest
        warnings = [c for c in m.checks if c.status == "warning"]
        if as_json:
            print(json.dumps({
                "ok": True, "output": str(result.output), "drafter_gguf": {
                    "size": result.gguf_size, "sha256": result.gguf_sha256,
                    "tensors": len(m.artifact.tensors)},
                "stripped": [s.name for s in m.source.stripped],
                "checks": [c.model_dump() for c in m.checks]}, indent=2))
            return 0
        out = _out()
        # Paths, names and details come from files and users: escaped, never rich markup.
        out.print(escape(f"converted {source} -> {result.output}"))
        out.print(f"  drafter.gguf  {result.gguf_size:,} bytes  sha256 {result.gguf_sha256}")
        stripped = ", ".join(s.name for s in m.source.stripped) or "none"
        out.print(escape(f"  {len(m.artifact.tensors)} tensors written; hashed and stripped: {stripped}"))
        out.print(f"  checks: {sum(c.status == 'passed' for c in m.checks)} passed, {len(warnings)} warning(s)")
        for check in warnings:
            out.print(f"  [yellow]warning[/] {escape(check.name)}: {escape(check.detail)}")
        return 0

    run(body, debug=debug, as_json=as_json)


@app.command()
def validate(
    artifact: Annotated[Path, typer.Argument(help="An artifact directory written by `dspark convert`.")],
    strict: Annotated[bool, typer.Option("--strict", help="Treat warnings as failures (exit 45).")] = False,
    as_json: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Re-check an artifact from scratch; exit 0 only when every check passed."""

    def body() -> int:
        from ..validate import validate_artifact
        from .progress import RichProgress

        report = validate_artifact(artifact, progress=RichProgress(enabled=not as_json))
        code = report.exit_code(strict=strict)
        if as_json:
            print(json.dumps({**report.model_dump(), "strict": strict, "exit_code": code}, indent=2))
        else:
            table = Table(title=escape(f"dspark validate {artifact}"), show_lines=False)
            table.add_column("check")
            table.add_column("status")
            table.add_column("detail", overflow="fold")
            for check in report.checks:
                style = STATUS_STYLE[check.status]
                table.add_row(escape(check.name), f"[{style}]{check.status}[/]", escape(check.detail))
            out = _out()
            out.print(table)
            verdict = "PASSED" if code == 0 else "FAILED"
            out.print(f"{verdict}: {len(report.checks)} checks, {report.failed} failed, "
                      f"{report.warnings} warning(s)" + (" (strict)" if strict else ""))
        failure = report.first_failure
        if failure is not None:
            sys.stderr.write(f"error: {failure.name}: {failure.detail}\n")
        elif code:
            sys.stderr.write("error: --strict: warnings count as failures\n")
        return code

    run(body, debug=debug, as_json=as_json)


@app.command()
def inspect(
    path: Annotated[Path, typer.Argument(help="A checkpoint directory, an artifact directory or a .gguf file.")],
    as_json: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Show the feature contract and the tensor table, writing nothing."""

    def body() -> int:
        from ..inspect import inspect_path

        result = inspect_path(path)
        if as_json:
            print(json.dumps(result.model_dump(), indent=2))
        else:
            _print_inspect(result)
        if result.problem is not None:
            sys.stderr.write(f"error: {result.problem['message']}\n")
            return result.problem_exit_code or 1
        return 0

    run(body, debug=debug, as_json=False)


def _print_inspect(result) -> None:
    c = result.contract
    g = c.geometry
    out = _out()
    out.print(escape(f"{result.kind}: {result.path}"))
    out.print(f"  family        {c.family} ({c.architecture})")
    out.print(f"  geometry      H={g.hidden_size} I={g.intermediate_size} layers={g.num_draft_layers} "
              f"heads={g.num_attention_heads}/{g.num_key_value_heads}x{g.head_dim} V={g.vocab_size} "
              f"eps={g.rms_norm_eps:g} theta={g.rope_theta:g}")
    out.print(f"  taps          {c.taps.target_layer_ids} of {c.taps.num_target_layers} target layers "
              f"(hidden_states {c.taps.hidden_state_indices}), feature width {c.taps.feature_width}")
    out.print(f"  block         size {c.block.block_size}, mask token {c.block.mask_token_id}, anchor first")
    out.print("  attention     non-causal, no bias")
    out.print(f"  markov head   {c.markov_head.type}" + (f", rank {c.markov_head.rank}" if c.markov_head.rank else ""))
    conf = "none"
    if c.confidence_head.enabled:
        conf = "with Markov features" if c.confidence_head.with_markov else "without Markov features"
    out.print(f"  confidence    {conf}")
    table = Table()
    first, second = ("source", "gguf") if result.kind == "checkpoint" else ("gguf", "source")
    for col in (first, second, "dtype", "shape", "expected", "status"):
        table.add_column(col)
    for row in result.rows:
        style = STATUS_STYLE[row.status]
        table.add_row(escape(row.name), escape(row.maps_to or "-"), escape(row.dtype or "-"),
                      escape(str(row.shape)) if row.shape is not None else "-",
                      escape(str(row.expected_shape)) if row.expected_shape is not None else "-",
                      f"[{style}]{row.status}[/]")
    out.print(table)


if __name__ == "__main__":  # pragma: no cover
    app()
