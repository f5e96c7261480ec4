"""`dspark gate POLICY -o OUT_DIR`: the pre-release gate (docs/GATE.md).

Thin: call ``run_gate``, print one line per stage as it ends (the library's own progress
bars on a terminal), pass ``$GITHUB_STEP_SUMMARY`` on (the library checks it under the
output rules before anything runs and appends gate.md to it, never waiting), and map the
verdict to an exit code: 0 every drafter passed; 121 one failed (its stage named on the
one error line); 130 Ctrl-C (gate.json written, ``complete: false``); a refusal before
anything ran (a bad policy 120, a bad --baseline 122, --only naming no drafter 123, an
existing OUT_DIR without --force 30): its one line, nothing written. An interrupt once
OUT_DIR is published says so (where the reports are), never "nothing was written".
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from dspark_convert.cli.app import STATUS_STYLE, DebugOpt, JsonOpt, QuietOpt, _out, app, escape
from dspark_convert.cli.errors import EXIT_INTERRUPTED, EXIT_TERMINATED, Terminated, emit_error, run
from dspark_convert.util.text import shown

# The stage statuses as the lines show them, and their style.
_WORD = {"passed": "PASS", "recorded": "RECORD", "failed": "FAIL", "skipped": "SKIP",
         "not_run": "-"}
_STYLE = {**STATUS_STYLE, "recorded": "cyan", "not_run": "dim"}


@app.command()
def gate(
    policy: Annotated[Path, typer.Argument(metavar="POLICY", help="The release policy (TOML; docs/GATE.md).")],
    # Text, not a Path: a Path would turn an empty -o "" into "." (util/atomic.check_outputs).
    output: Annotated[str, typer.Option("--output", "-o", metavar="OUT_DIR",
                                         help="The directory to create: every artifact and "
                                         "report, gate.json, gate.md, junit.xml.")],
    baseline: Annotated[Optional[Path], typer.Option(
        "--baseline", metavar="PREVIOUS_OUT_DIR", help="The output directory of the last "
        "release's gate: the acceptance must not have dropped against its gate.json.")] = None,
    only: Annotated[Optional[list[str]], typer.Option(
        "--only", metavar="NAME", help="Run only this drafter of the policy (repeatable).")] = None,
    update: Annotated[bool, typer.Option(
        "--update", help="Write the measured drafter.gguf SHA-256s into a copy of the policy "
        "beside it (NAME.updated.toml), for review; the policy itself is never changed.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing OUT_DIR (and "
                                                        "--update's copy), atomically.")] = False,
    quiet: QuietOpt = False,
    as_json: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Gate a release: for each drafter of POLICY pin, convert, check the bytes, validate,
    quantize, smoke, eval, run the engines it requires (llama.cpp, dspark-mlx) and compare
    with the last release; exit 0 only when all passed."""

    def body() -> int:
        from dspark_convert.cli.progress import RichProgress
        from dspark_convert.commands.gate import GateInterrupted, run_gate

        out = _out()

        def line(entry, stage) -> None:
            if as_json:
                return
            style = _STYLE[stage.status]
            out.print(f"[{style}]{_WORD[stage.status]:<6}[/] {escape(entry.name)} "
                      f"{escape(stage.name)}: {escape(stage.line)}")

        interrupted = False
        # The runner's file; unset or empty: no summary.
        summary = os.environ.get("GITHUB_STEP_SUMMARY") or None
        try:
            result = run_gate(policy, output, baseline=baseline, only=only or [], update=update,
                              force=force, on_stage=line, step_summary=summary,
                              progress=RichProgress(enabled=not quiet and not as_json))
        except GateInterrupted as stop:
            result, interrupted = stop.result, True
        except (KeyboardInterrupt, Terminated) as stop:
            published = getattr(stop, "gate_output", None)
            if published is None:
                raise                      # before OUT_DIR: nothing was written (cli/errors)
            return _stopped_after(stop, published)
        try:
            return _finish(result, interrupted, summary)
        except (KeyboardInterrupt, Terminated) as stop:
            return _stopped_after(stop, result.output)

    def _finish(result, interrupted: bool, summary: str | None) -> int:
        from dspark_convert.commands.gate_report import as_json_document
        from dspark_convert.errors import GateFailedError

        out = _out()
        report = result.report
        if result.summary_warning is not None:
            sys.stderr.write(f"warning: GITHUB_STEP_SUMMARY {shown(summary)}: cannot append "
                             f"the summary: {shown(result.summary_warning)}; the verdict "
                             "stands\n")
        if as_json:
            print(as_json_document(report))
        else:
            passed = sum(e.passed for e in report.entries)
            out.print(escape(f"gate: {passed} of {len(report.entries)} drafter(s) passed; "
                             f"{', '.join(result.files)} in {result.output}"))
            if result.updated_policy is not None:
                out.print(escape(f"gate: the measured hashes are in {result.updated_policy} "
                                 f"(review it against {policy})"))
        if interrupted:
            sys.stderr.write(f"error: interrupted; {shown(result.output)}/gate.json records what "
                             "finished (complete: false)\n")
            return EXIT_INTERRUPTED
        if not report.passed:
            failed = [e for e in report.entries if not e.passed]
            named = "; ".join(f"{e.name} {_first(e)}" for e in failed)
            error = GateFailedError(f"gate: {len(failed)} of {len(report.entries)} drafter(s) "
                                    f"failed: {named}; reports in {result.output}",
                                    path=str(result.output))
            emit_error(error, as_json=False)
            return error.exit_code
        return 0

    run(body, debug=debug, as_json=as_json)


def _first(entry) -> str:
    stage = entry.first_failure
    return f"({stage.name}: {stage.line})" if stage is not None else "(failed)"


def _stopped_after(stop: BaseException, output: Path) -> int:
    """Ctrl-C or SIGTERM once OUT_DIR was published: what is true then."""
    what = "interrupted" if isinstance(stop, KeyboardInterrupt) else "terminated"
    sys.stderr.write(f"error: {what} after the gate finished; its reports are in "
                     f"{shown(output)} (--update's copy and the step summary may be missing)\n")
    return EXIT_INTERRUPTED if isinstance(stop, KeyboardInterrupt) else EXIT_TERMINATED
