"""`dspark serve-bench`: verify-length policies swept under concurrent load.

Thin: parse the options, check DIR (eval's report-directory rule), call
``run_serve_bench``, write the directory whole, map the result to output and an exit code:

- 0: the report is written;
- 74: at temperature 0 (float32) a request's output differs from the target alone's: the
  report is written first, so that it can be read;
- any refusal: its one line and code, nothing written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dspark_convert.cli.app import (DebugOpt, DeviceOpt, JsonOpt, MaxMemoryOpt, _out, app, escape,
                                    float_option, int_option)
from dspark_convert.cli.errors import emit_error, run
from dspark_convert.util.json_out import dumps


@app.command("serve-bench")
def serve_bench(
    artifacts: Annotated[list[Path], typer.Argument(
        metavar="ARTIFACT", help="Artifact directories written by `dspark convert`, or a DFlash2 "
        "or Gemma 4 assistant checkpoint directory as it is (both under full only; the "
        "assistant served one request at a time: not packed).")],
    target: Annotated[str, typer.Option(
        "--target", help="The target model directory (Qwen3 or Gemma 4: HF safetensors, "
        "tokenizer.json), or org/name@<40-hex commit> on the Hub.")],
    concurrency: Annotated[str, typer.Option(
        "--concurrency", metavar="R1,R2,...", help="Requests in flight: a comma list of "
        "positive integers in increasing order, each at most the prompts given (1,4,16,64).")],
    output: Annotated[str, typer.Option(
        "--output", "-o", metavar="DIR", help="The report directory to create.")],
    prompts: Annotated[Optional[Path], typer.Option(
        "--prompts", metavar="FILE", help="A JSONL prompt set, as `dspark eval` reads it "
        "(default: the package's set for the golden target); every prompt is a request of "
        "every run.")] = None,
    policy: Annotated[Optional[list[str]], typer.Option(
        "--policy", metavar="POLICY", help="A verify-length policy: full, threshold=X, dspark, "
        "dspark-async; repeatable (default: full and dspark). target-only always runs, once "
        "per concurrency, as the baseline.")] = None,
    cost_table: Annotated[Optional[Path], typer.Option(
        "--cost-table", metavar="FILE", help="The target's cost table (`dspark profile`), up to "
        "max concurrency x (1 + block size) tokens; without it a dspark policy profiles the "
        "target first and writes DIR/cost_table.json.")] = None,
    calibration: Annotated[Optional[list[Path]], typer.Option(
        "--calibration", metavar="FILE", help="A calibration.json (`dspark eval --calibrate`): "
        "its temperatures scale the confidences the policies see, for the artifact it was "
        "made for; repeatable.")] = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", parser=int_option,
                                                help="New tokens per request.")] = 64,
    temperature: Annotated[float, typer.Option(
        "--temperature", parser=float_option, metavar="T",
        help="Decoding temperature (0: greedy, every output "
        "checked against the target alone's).")] = 0.0,
    seed: Annotated[int, typer.Option("--seed", parser=int_option, help="Random seed for "
                                      "temperature > 0 (0..2^64-1).")] = 0,
    device: DeviceOpt = "auto",
    dtype: Annotated[str, typer.Option(
        "--dtype", help="Compute dtype of the target and every drafter: float32 or "
        "bfloat16.")] = "float32",
    max_memory: MaxMemoryOpt = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing report directory, "
                                                        "atomically.")] = False,
    as_json: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Serve every prompt at each concurrency under each policy (and the target alone) in the
    reference runtime's batched loop: throughput, per-request speed, acceptance, verify
    tokens sent and wasted, latency, memory; writes DIR/report.json, report.md, two PNGs
    and one decisions.jsonl per run."""

    def body() -> int:
        from dspark_convert.cli.progress import RichProgress
        from dspark_convert.commands.serve_bench import (
            DEFAULT_POLICIES,
            check_serve_dir,
            report_failure,
            run_serve_bench,
        )
        from dspark_convert.errors import EvalInputError
        from dspark_convert.evaluation.serve_report import write_serve_report
        from dspark_convert.runtime.budget import parse_memory_size

        # Before anything long: an existing report is refused now, not after the runs.
        check_serve_dir(output, force=force, artifacts=artifacts, target=target,
                        prompts=prompts, cost_table=cost_table, calibrations=calibration or [])
        budget = parse_memory_size(max_memory, error=EvalInputError) \
            if max_memory is not None else None
        outcome = run_serve_bench(
            artifacts, target, prompts, concurrencies=concurrency,
            policies=policy if policy else DEFAULT_POLICIES, cost_table=cost_table,
            max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, device=device,
            dtype=dtype, calibrations=calibration or [], max_memory=budget,
            progress=RichProgress(enabled=not as_json),
            run_progress=RichProgress(enabled=not as_json, counted=True))
        report = outcome.report
        written = write_serve_report(report, outcome.decisions, output, force=force,
                                     profiled=outcome.profiled)
        failure = report_failure(report, output)
        if as_json:
            doc = {"ok": failure is None, "output": str(output),
                   "files": [str(p) for p in written]}
            if failure is not None:
                doc.update(failure.to_dict())
            print(dumps({**doc, "report": report.model_dump(mode="json")}, indent=1))
        else:
            _print_summary(report, output)
        if failure is not None:
            emit_error(failure, as_json=False)
            return failure.exit_code
        return 0

    run(body, debug=debug, as_json=as_json)


def _print_summary(report, output: str) -> None:
    out = _out()
    s = report.settings
    out.print(escape(f"serve-bench on {report.target.path} ({report.environment.device}, "
                     f"{s.dtype}): {report.prompt_set.count} prompts, max {s.max_new_tokens} new "
                     f"tokens, temperature {s.temperature:g}, cost table {s.cost_table_source}"))
    for r in report.runs:
        what = "target-only" if r.artifact is None else f"{r.artifact} {r.policy}"
        tps = "-" if r.tokens_per_second is None else f"{r.tokens_per_second:,.1f}"
        per = ("-" if r.per_request_tokens_per_second is None
               else f"{r.per_request_tokens_per_second:,.1f}")
        same = {True: ", = target-only", False: ", DIFFERS from target-only", None: ""}[r.lossless]
        out.print(escape(f"  c{r.concurrency} {what}: {tps} tok/s, {per} tok/s per request, "
                         f"{r.verify_tokens} verify tokens ({r.draft_tokens_wasted} of "
                         f"{r.draft_tokens_sent} drafts wasted){same}"))
    out.print(escape(f"wrote {output}: report.json, report.md"))
