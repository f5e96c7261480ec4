"""`dspark simulate`: the verify-length policies replayed on a recording and a cost table,
or a scheduler's recorded decisions checked against their policy (commands/simulate.py).

Exit 0 with the figures (or a check that conforms); 147 (``SchedulerMismatchError``) when
--check finds a difference, after the result (and with -o the report) is out; any
refusal: its line and code."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich import box
from rich.table import Table

from dspark_convert.cli.app import DebugOpt, JsonOpt, _out, app, escape
from dspark_convert.cli.errors import emit_error, run
from dspark_convert.util.json_out import dumps


def _table(report) -> Table:
    sweep = report.mode == "sweep"
    title = (f"{report.mode} of {report.recording} (recorded: {report.recorded_policy}, "
             f"{report.recorded_steps} steps) on {report.cost_table}")
    table = Table(box=box.SIMPLE, pad_edge=False, title=escape(title))
    # Short headers, so that the table fits 80 columns (docs/SCHEDULING.md says what each
    # holds); the policy's name is never cut.
    columns = ["policy"] + (["R"] if sweep else []) + [
        "steps", "sent", "wasted", "acc", "verify s", "tok/s"] + (
        ["user tok/s"] if sweep else []) + ["cens"]
    longest = max((len(f.policy) for f in report.figures), default=6)
    for name in columns:
        table.add_column(name, justify="left" if name == "policy" else "right", no_wrap=True,
                         min_width=longest if name == "policy" else max(len(name), 4))
    for f in report.figures:
        row = [escape(f.policy)] + ([str(f.concurrency)] if sweep else []) + [
            f"{f.steps:,}", f"{f.verify_tokens:,}", f"{f.wasted_tokens:,}",
            f"{f.accepted_per_step:.2f}", f"{f.verify_seconds:.3f}", f"{f.tokens_per_second:,.0f}"]
        if sweep:
            row.append(f"{f.per_request_tokens_per_second:,.0f}")
        row.append(f"{f.censored_steps:,}")
        table.add_row(*row)
    return table


@app.command()
def simulate(
    decisions_or_trace: Annotated[Path, typer.Argument(
        help="A decisions.jsonl (one verify step a line: "
        "docs/SCHEDULING.md) or a smoke/eval trace (reference.json format).")],
    cost_table: Annotated[Path, typer.Option(
        "--cost-table", metavar="FILE", help="The target's cost table (verify steps per "
        "second by batch tokens).")],
    policy: Annotated[Optional[list[str]], typer.Option(
        "--policy", metavar="P", help="A policy to replay: full, threshold=X, dspark, "
        "dspark-async, target-only; repeat for more. Default: the recorded policy.")] = None,
    concurrency: Annotated[Optional[str], typer.Option(
        "--concurrency", metavar="1,4,16,64", help="Sweep mode: each request's recorded "
        "blocks replayed at these concurrencies (strictly increasing positive integers). "
        "Without it: replay mode, the recorded batches as they were.")] = None,
    check: Annotated[Optional[str], typer.Option(
        "--check", metavar="POLICY", help="Check the recorded lengths against this policy "
        "instead: exit 0 when they conform, 147 naming the first step that differs and "
        "why.")] = None,
    # Text, not a Path: a Path would turn an empty -o "" into "." (util/atomic.py).
    output: Annotated[Optional[str], typer.Option(
        "--output", "-o", metavar="REPORT_JSON", help="Also write the report (JSON) to this "
        "new file (written when a check fails too).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing report, "
                                                        "atomically.")] = False,
    as_json: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Replay verify-length policies on recorded confidences and a cost table, without a
    model: per policy (and concurrency) the verify steps, tokens sent and wasted, accepted
    tokens per step and the predicted output tokens per verify-second (Σ 1/SPS(B)); a
    recorded block accepted whole stands for a longer one (a lower bound, counted as
    censored). With --check, the scheduler's recorded lengths against the policy."""

    def body() -> int:
        from dspark_convert.commands.simulate import run_simulate, simulate_failure

        out = _out()
        report = run_simulate(decisions_or_trace, cost_table=cost_table, policies=policy or (),
                              concurrency=concurrency, check=check, output=output, force=force)
        failure = simulate_failure(report)
        if as_json:
            doc = {"ok": failure is None, **report.model_dump()}
            if failure is not None:
                doc.update(failure.to_dict())
            print(dumps(doc, indent=2))
        else:
            if report.kind == "trace":
                out.print(escape(f"trace {report.recording}: {report.runs_used} runs of "
                                 f"full-block proposals taken, {report.runs_left_out} cut by a "
                                 "confidence threshold left out"))
            if report.check is not None:
                out.print(escape(f"check of {report.recording} (recorded: "
                                 f"{report.recorded_policy}) against {report.check.policy}: "
                                 f"{report.check.steps_checked} steps checked"))
                if failure is None:
                    out.print("[green]CONFORMS[/]")
            else:
                # Never cut a figure: a terminal narrower than the table wraps its lines.
                table = _table(report)
                out.print(table, width=max(out.width, out.measure(table).minimum), crop=False)
            if output is not None:
                out.print(escape(f"wrote {output}"))
        if failure is not None:
            emit_error(failure, as_json=False)
            return failure.exit_code
        return 0

    run(body, debug=debug, as_json=as_json)
