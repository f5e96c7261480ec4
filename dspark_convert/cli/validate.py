"""`dspark validate`: re-check an artifact from scratch (the release gate)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from dspark_convert.cli.app import (
    STATUS_STYLE,
    DebugOpt,
    JsonOpt,
    TargetOpt,
    _out,
    app,
    escape,
    print_engines,
)
from dspark_convert.cli.errors import run
from dspark_convert.artifact.engine_names import ENGINES   # no pydantic, no gguf: --help stays light
from dspark_convert.util.json_out import dumps
from dspark_convert.util.text import shown


def _engines(values: Optional[list[str]]) -> list[str]:
    """--require ENGINE (repeatable): a name of ENGINES; a usage error (exit 2) else."""
    for value in values or []:
        if value not in ENGINES:
            raise typer.BadParameter(f"expected one of {', '.join(ENGINES)}, found {value!r}")
    return list(values or [])


@app.command()
def validate(
    artifact: Annotated[Path, typer.Argument(help="An artifact directory written by `dspark convert`, or a "
                                             "GGUF drafter file alone (checked as far as the file "
                                             "allows; what needs manifest.json is skipped).")],
    strict: Annotated[bool, typer.Option("--strict", help="Treat warnings as failures (exit 45).")] = False,
    target: TargetOpt = None,
    require: Annotated[Optional[list[str]], typer.Option(
        "--require", metavar="ENGINE", callback=_engines,
        help="Fail (exit 47) unless this engine accepts the artifact: strata.open, strata.run "
        "or llama.cpp (repeatable). Engine reports are informational otherwise.")] = None,
    as_json: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Re-check an artifact (or a GGUF drafter file alone) from scratch; exit 0 only when
    every check passed."""

    def body() -> int:
        from dspark_convert.cli.progress import RichProgress
        from dspark_convert.commands.validate_bare import validate_path

        report = validate_path(artifact, progress=RichProgress(enabled=not as_json),
                               target=target, require=require or [])
        code = report.exit_code(strict=strict)
        if as_json:
            print(dumps({**report.model_dump(), "strict": strict, "exit_code": code}, indent=2))
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
            if report.engines is not None:
                print_engines(out, report.engines, report.required)
            verdict = "PASSED" if code == 0 else "FAILED"
            out.print(f"{verdict}: {len(report.checks)} checks, {report.failed} failed, "
                      f"{report.warnings} warning(s)" + (" (strict)" if strict else ""))
        failure = report.first_failure
        if failure is not None:
            sys.stderr.write(f"error: {shown(failure.name)}: {shown(failure.detail)}\n")
        elif code:
            sys.stderr.write(f"error: {report.strict_message()}\n")
        return code

    run(body, debug=debug, as_json=as_json)
