"""`dspark eval`: the target alone and drafters of every kind (DSpark, DFlash, DFlash2, the
Gemma 4 assistant) on the same prompts, the
static confidence cutoff, DeepSpec's confidence metrics and calibration; a report directory.

Thin: parse the options, check REPORT_DIR (the one "output exists" rule), call
``run_eval``, write the report, map the result to output and an exit code:

- 0: the report is written;
- 130: Ctrl-C once the runs had begun: the partial report (``complete`` false, the rest
  under ``not_run``) is written, then the exit (a Ctrl-C before that writes nothing);
- 74: at temperature 0 an output differs from the target's own; 72: ``--device cuda``
  without CUDA (nothing ran): the report is written first, so that it can be read;
- any refusal: its one line and code, nothing written.
"""

from __future__ import annotations

import sys
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
    float_option,
    int_option,
    print_estimate,
)
from dspark_convert.cli.errors import EXIT_INTERRUPTED, emit_error, run
from dspark_convert.util.json_out import dumps
from dspark_convert.util.text import shown


@app.command("eval")
def evaluate(
    artifacts: Annotated[list[Path], typer.Argument(
        metavar="ARTIFACT", help="Artifact directories written by `dspark convert` (DSpark, DFlash, DFlash2 or Gemma 4 "
        "assistant drafters), or a DFlash2 or Gemma 4 assistant checkpoint directory as it is "
        "(config.json + model.safetensors); every one for the same target.")],
    target: Annotated[str, typer.Option(
        "--target", help="The target model directory (Qwen3 or Gemma 4: HF safetensors, tokenizer.json), "
        "or org/name@<40-hex commit> on the Hub.")],
    # Text, not a Path: a Path would turn an empty -o "" into "." (util/atomic.py).
    output: Annotated[str, typer.Option(
        "--output", "-o", metavar="REPORT_DIR", help="The report directory to create.")],
    prompts: Annotated[Optional[Path], typer.Option(
        "--prompts", metavar="FILE", help="A JSONL prompt set: {\"id\": ..., \"prompt\": "
        "\"text\"} or {\"id\": ..., \"prompt_ids\": [...]}, optional \"category\" (default: the "
        "package's set for the golden target).")] = None,
    temperature: Annotated[Optional[list[float]], typer.Option(
        "--temperature", parser=float_option, metavar="T",
        help="A decoding temperature (0: greedy); repeatable "
        "(default 0).")] = None,
    threshold: Annotated[Optional[list[float]], typer.Option(
        "--threshold", parser=float_option, metavar="C",
        help="A static confidence cutoff for artifacts with a "
        "confidence head; repeatable (default 0.1 0.3 0.5 0.7 0.9; the cutoff-off run is always "
        "made).")] = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", parser=int_option,
                                                help="New tokens per prompt.")] = 64,
    seed: Annotated[int, typer.Option("--seed", parser=int_option, help="Random seed for "
                                      "temperature > 0 and the calibration split "
                                      "(0..2^64-1).")] = 0,
    device: DeviceOpt = "auto",
    dtype: Annotated[str, typer.Option(
        "--dtype", help="Compute dtype of the target and every drafter: float32 (the reference "
        "for DeepSpec's traces) or bfloat16 (as the engines compute; verified token by "
        "token).")] = "float32",
    calibrate: Annotated[bool, typer.Option(
        "--calibrate", help="Fit Sequential Temperature Scaling on a calibration split of the "
        "prompts; score it on the held-out rest; write calibration-<artifact>.json.")] = False,
    held_out: Annotated[float, typer.Option(
        "--held-out", parser=float_option, metavar="F",
        help="The held-out fraction of the prompts (--calibrate).")] = 0.5,
    calibration: Annotated[Optional[list[Path]], typer.Option(
        "--calibration", metavar="FILE", help="A calibration.json: its temperatures scale the "
        "confidence logits before the threshold, for the artifact it was made for; "
        "repeatable.")] = None,
    max_memory: MaxMemoryOpt = None,
    engine: Annotated[Optional[list[str]], typer.Option(
        "--engine", metavar="ENGINE", help="Also run another engine on the same prompts "
        "(temperature 0): the target alone and each artifact it can run, exported on the fly, "
        "with the proposal check of every draft against ours (docs/ENGINES.md). "
        "llama.cpp=BIN_DIR (its binaries; needs --target-gguf) or dspark-mlx[=PYTHON] "
        "(dspark-mlx's interpreter; default: the install of `make dspark-mlx`); repeatable, "
        "each engine once.")] = None,
    target_gguf: Annotated[Optional[Path], typer.Option(
        "--target-gguf", metavar="FILE", help="The target as llama.cpp runs it (with "
        "--engine llama.cpp: its converter's GGUF of --target); dspark-mlx runs --target "
        "itself.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing report directory, "
                                                        "atomically.")] = False,
    as_json: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Evaluate drafters against their target on the same prompts: acceptance by position,
    tau, speed and memory against the target alone, the static confidence cutoff and the
    confidence head's calibration; writes REPORT_DIR/report.json, report.md and PNGs."""

    def body() -> int:
        from dspark_convert.cli.progress import RichProgress
        from dspark_convert.commands.evaluate import (
            DEFAULT_TEMPERATURES,
            DEFAULT_THRESHOLDS,
            EvalInterrupted,
            check_report_dir,
            report_failure,
            run_eval,
        )
        from dspark_convert.evaluation.report import write_report

        from dspark_convert.errors import EvalInputError
        from dspark_convert.runtime.budget import parse_memory_size

        budget = parse_memory_size(max_memory, error=EvalInputError) if max_memory is not None \
            else None
        out = _out()

        def show_estimate(m) -> None:
            if not as_json:
                print_estimate(out, m, drafters="drafters")

        calibrations = calibration or []
        # Before anything long: an existing report is refused now, not after the runs.
        check_report_dir(output, force=force, artifacts=artifacts, target=target, prompts=prompts,
                         calibrations=calibrations, target_gguf=target_gguf)
        interrupted = False
        try:
            report = run_eval(
                artifacts, target, prompts,
                temperatures=temperature if temperature else DEFAULT_TEMPERATURES,
                thresholds=threshold if threshold is not None else DEFAULT_THRESHOLDS,
                max_new_tokens=max_new_tokens, seed=seed, device=device, dtype=dtype,
                calibrate=calibrate, held_out=held_out, calibrations=calibrations,
                max_memory=budget, on_estimate=show_estimate,
                progress=RichProgress(enabled=not as_json),
                run_progress=RichProgress(enabled=not as_json, counted=True),
                engine=engine, target_gguf=target_gguf)
        except EvalInterrupted as stop:
            report, interrupted = stop.report, True
        written = write_report(report, output, force=force)
        failure = None if interrupted else report_failure(report, output)
        if as_json:
            doc = {"ok": not interrupted and failure is None, "output": str(output),
                   "files": [str(p) for p in written]}
            if interrupted:
                doc["interrupted"] = True
            if failure is not None:
                doc.update(failure.to_dict())
            print(dumps({**doc, "report": report.model_dump(mode="json")}, indent=1))
        else:
            _print_summary(report, output, written)
        # After the report: the one error line, the exit code (one JSON document above).
        if interrupted:
            sys.stderr.write(f"error: interrupted; the partial report (complete: false) is in "
                             f"{shown(output)}\n")
            return EXIT_INTERRUPTED
        if failure is not None:
            emit_error(failure, as_json=False)
            return failure.exit_code
        return 0

    run(body, debug=debug, as_json=as_json)


def _print_summary(report, output: str, written: list[Path]) -> None:
    from dspark_convert.evaluation.cells import run_label

    out = _out()
    s, env = report.settings, report.environment
    out.print(escape(f"eval on {report.target.path if report.target else '-'} "
                     f"({env.device}, {s.dtype}, {s.verify} verify): {report.prompt_set.count} "
                     f"prompts, max {s.max_new_tokens} new tokens, seed {s.seed}"))
    for r in report.runs:
        a = r.acceptance
        parts = [f"{r.new_tokens} new tokens"]
        if a is not None and a.tau is not None:
            parts.append(f"tau {a.tau:.2f}, mean L {a.mean_verified_length:.2f}")
        elif a is not None:          # as smoke says it: undefined, not 0
            parts.append("tau undefined (no verify step ran)")
        if r.committed_tokens_per_second:
            parts.append(f"{r.committed_tokens_per_second:,.0f} tok/s")
        if r.speedup:
            parts.append(f"{r.speedup:.2f}x")
        if r.lossless is not None:
            parts.append("= target greedy" if r.lossless else "DIFFERS from target greedy")
        kind = f" [{r.method}]" if r.method and r.kind != "target" else ""
        out.print(escape(f"  {run_label(r)}, T={r.temperature:g}{kind}: " + ", ".join(parts)))
    for r in report.engine_runs:
        parts = [f"{r.new_tokens} new tokens"]
        if r.tau is not None:
            parts.append(f"tau {r.tau:.2f}")
        if r.tokens_per_second:
            parts.append(f"{r.tokens_per_second:,.0f} tok/s")
        if r.lossless is not None:
            parts.append("= its target alone" if r.lossless else "DIFFERS from its target alone")
        if r.proposals is not None:
            # Nothing compared is never a pass: said, not shown as a clean 0/0.
            parts.append(f"proposals {r.proposals.equal}/{r.proposals.compared} equal to ours"
                         if r.proposals.compared else f"NOTHING COMPARED: {r.engine} drafted "
                         "nothing")
        what = "target alone" if r.kind == "target" else f"{r.artifact} ({r.spec_type})"
        out.print(escape(f"  {r.engine} {what}: " + ", ".join(parts)))
        d = r.proposals.first_difference if r.proposals else None
        if d is not None:
            out.print(escape(f"    first difference: prompt {d.prompt}, draft {d.draft_call}, "
                             f"position {d.position}: {r.engine} {d.engine_token}, ours "
                             f"{d.reference_token}"))
    for art in report.artifacts:
        if art.calibration is not None:
            out.print(escape(f"  calibration {art.name}: {art.calibration.note}"))
        if art.calibration_applied is not None:
            out.print(escape(f"  applied {art.calibration_applied.path} to {art.name}'s cut"))
    for n in report.not_run:
        what = n.kind if n.artifact is None else f"{n.kind} {n.artifact}"
        where = [f"T={n.temperature:g}"] if n.temperature is not None else []
        where += [f"threshold {n.confidence_threshold:g}"] if n.confidence_threshold else []
        what += f" ({', '.join(where)})" if where else ""
        what = f"{n.engine} {what}" if n.engine else what
        out.print(escape(f"  not run: {what}: {n.reason}"))
    names = ", ".join(p.name for p in written)
    out.print(escape(f"wrote {output}: {names}"))
