"""`dspark conform`: another engine's drafts, from a trace it recorded, against the
reference runtime's proposals (commands/conform.py; the trace format: docs/CONFORMANCE.md).

Exit 0 when every draft equals the reference's; 97 (``DraftMismatchError``) when one
differs, after the result (and with -o the report) is out; any refusal: its line and code."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dspark_convert.cli.app import (
    DebugOpt,
    DeviceOpt,
    JsonOpt,
    MaxMemoryOpt,
    _out,
    app,
    escape,
    print_estimate,
)
from dspark_convert.cli.errors import emit_error, run
from dspark_convert.util.json_out import dumps


@app.command()
def conform(
    artifact: Annotated[Path, typer.Argument(help="An artifact directory written by `dspark convert`.")],
    target: Annotated[str, typer.Option(
        "--target", help="The target model directory (Qwen3 or Gemma 4: HF safetensors), or "
        "org/name@<40-hex commit> on the Hub.")],
    trace: Annotated[Path, typer.Option(
        "--trace", metavar="FILE", help="The engine's drafts, JSONL: {\"context\": [every "
        "committed token id up to and including the anchor], \"draft\": [the proposed ids]}, "
        "optional \"id\" (docs/CONFORMANCE.md).")],
    # Text, not a Path: a Path would turn an empty -o "" into "." (util/atomic.py).
    output: Annotated[Optional[str], typer.Option(
        "--output", "-o", metavar="REPORT_DIR", help="Also write report.json and report.md "
        "into this new directory (written when drafts differ too).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing report directory, "
                                                        "atomically.")] = False,
    device: DeviceOpt = "auto",
    dtype: Annotated[str, typer.Option(
        "--dtype", help="Compute dtype of the reference: float32 (DeepSpec's traces) or "
        "bfloat16.")] = "float32",
    max_memory: MaxMemoryOpt = None,
    diagnose: Annotated[bool, typer.Option(
        "--diagnose", help="When drafts differ, re-propose the differing ones (at most 256) "
        "under each known misreading and each compatible pair of them, and name those that "
        "reproduce the engine's drafts, best first, with their fix (docs/CONFORMANCE.md): "
        "162 when one reproduces every differing draft, else 97.")] = False,
    as_json: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Check an engine's drafts against the reference runtime: for each line of the trace,
    the reference's greedy proposal from the same context, token for token; fails (97) at
    the first draft that differs, naming the line, the position, both tokens, a block read
    late (row_offset) and the reference's logit margin (a near tie says so). --diagnose
    names the known misreading that reproduces the engine's drafts (162), if any.

    Exit 0 when every draft conforms; 97 when one differs; 162 when --diagnose names a
    misreading that reproduces every differing draft diagnosed."""

    def body() -> int:
        from dspark_convert.cli.progress import RichProgress
        from dspark_convert.commands.conform import (conform_failure, diagnosis_line,
                                                     difference_text, run_conform)
        from dspark_convert.errors import ConformInputError
        from dspark_convert.runtime.budget import parse_memory_size

        out = _out()

        def show_estimate(m) -> None:
            if not as_json:
                print_estimate(out, m)

        budget = parse_memory_size(max_memory, error=ConformInputError) \
            if max_memory is not None else None
        result = run_conform(artifact, target=target, trace=trace, output=output, force=force,
                             device=device, dtype=dtype, max_memory=budget,
                             progress=RichProgress(enabled=not as_json), on_estimate=show_estimate,
                             diagnose=diagnose)
        failure = conform_failure(result)
        if as_json:
            doc = {"ok": failure is None, **result.model_dump()}
            if failure is not None:
                doc.update(failure.to_dict())
            print(dumps(doc, indent=2))
        else:
            c = result.check
            out.print(escape(f"conform {artifact} on {result.target} ({result.device}, "
                             f"{result.dtype}): {result.lines} drafts of {result.trace}"))
            out.print(escape(f"  {c.equal} of {c.compared} drafts equal the reference runtime's; "
                             "agreement by position: " + " ".join(
                                 "-" if a is None else f"{a:.2f}"
                                 for a in result.agreement_by_position)))
            if c.first_difference is not None:
                out.print(escape(f"  first difference: {difference_text(c.first_difference)}"))
            for row in result.agreement_by_depth:
                out.print(escape(f"  agreement at depth {row.depth} ({row.drafts} drafts): " + " ".join(
                    "-" if a is None else f"{a:.2f}" for a in row.rates())))
            if result.diagnosis is not None:
                out.print(escape(f"  diagnosis: {diagnosis_line(result)}"))
            out.print(escape(f"  the target ran {result.target_tokens:,} tokens for "
                             f"{result.context_tokens:,} of context; {result.check_seconds:.2f} s "
                             f"({result.drafts_per_second:,.1f} drafts/s), load "
                             f"{result.load_seconds:.2f} s"))
            if result.report is not None:
                out.print(escape(f"  wrote {result.report}: report.json, report.md"))
            if failure is None:
                out.print("[green]CONFORMS[/]")
        if failure is not None:
            emit_error(failure, as_json=False)
            return failure.exit_code
        return 0

    run(body, debug=debug, as_json=as_json)
