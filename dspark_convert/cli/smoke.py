"""`dspark smoke`: run the drafter against its target in the reference runtime."""

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
    confidence_option,
    escape,
    float_option,
    int_option,
    print_estimate,
)
from dspark_convert.cli.errors import run
from dspark_convert.util.json_out import dumps


def _prompt_ids(values: Optional[list[str]]) -> list[list[int]]:
    """--prompt-ids 1,17,33 (repeatable) -> [[1, 17, 33], ...]; a usage error (exit 2) else."""
    prompts = []
    for text in values or []:
        try:
            prompts.append([int_option(part) for part in text.split(",") if part.strip()])
        except typer.BadParameter as exc:
            raise typer.BadParameter(f"expected comma-separated token ids: {exc}") from None
    return prompts


@app.command()
def smoke(
    artifact: Annotated[Path, typer.Argument(help="An artifact directory written by `dspark convert` (DSpark, DFlash, DFlash2 or a Gemma 4 assistant).")],
    target: Annotated[Path, typer.Option("--target", help="The target model directory (Qwen3 or Gemma 4: HF safetensors).")],
    prompt_ids: Annotated[Optional[list[str]], typer.Option(
        "--prompt-ids", metavar="IDS", callback=_prompt_ids,
        help="A prompt as comma-separated token ids; repeat for more prompts.")] = None,
    prompt: Annotated[Optional[str], typer.Option(
        "--prompt", help="A text prompt, tokenized with the target's tokenizer.json.")] = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", parser=int_option)] = 64,
    temperature: Annotated[float, typer.Option(
        "--temperature", parser=float_option,
        help="0 (greedy) or a number in (0, 100]: sample from softmax(z/T).")] = 0.0,
    confidence_threshold: Annotated[float, typer.Option(
        "--confidence-threshold", parser=confidence_option,
        help="Cut the block at the first position whose confidence is below this, in [0, 1] "
        "(0: off).")] = 0.0,
    seed: Annotated[int, typer.Option("--seed", parser=int_option,
                                      help="Random seed for temperature > 0 (0..2^64-1).")] = 0,
    device: DeviceOpt = "auto",
    dtype: Annotated[str, typer.Option(
        "--dtype", help="Compute dtype: float32 (the reference for DeepSpec's traces) or "
        "bfloat16 (as the engines compute).")] = "float32",
    verify: Annotated[str, typer.Option(
        "--verify", help="Verify drafts in one forward (batched, as engines do) or token by "
        "token (stepwise: exactly the target's greedy numerics); auto: batched in float32, "
        "stepwise in bfloat16.")] = "auto",
    max_memory: MaxMemoryOpt = None,
    # Output paths stay text: a Path would turn an empty --trace "" into "." (util/atomic.py).
    trace: Annotated[Optional[str], typer.Option("--trace", metavar="<path>", help="Write the trace (reference.json format).")] = None,
    plot: Annotated[Optional[str], typer.Option("--plot", metavar="<path>", help="Write a PNG of acceptance by draft position.")] = None,
    reference: Annotated[Optional[Path], typer.Option(
        "--reference", help="A reference.json: fail at the first cycle that differs (in "
        "another dtype: report the agreement).")] = None,
    min_tau: Annotated[Optional[float], typer.Option("--min-tau", parser=float_option,
                                                     help="Fail when tau is below this.")] = None,
    calibration: Annotated[Optional[Path], typer.Option(
        "--calibration", metavar="FILE", help="A calibration.json (`dspark eval --calibrate`) "
        "for this artifact and target: its temperatures scale the confidence logits before "
        "--confidence-threshold.")] = None,
    compare: Annotated[Optional[Path], typer.Option(
        "--compare", metavar="PARENT", help="Run a second artifact (the BF16 parent of a "
        "quantized one) on the same prompts and settings: both taus, acceptance by position "
        "and the difference.")] = None,
    as_json: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Run the drafter against its target: tau, acceptance by position, speed; fails when the
    output differs from the target's own (temperature 0) or from --reference."""

    def body() -> int:
        from dspark_convert.cli.progress import RichProgress
        from dspark_convert.commands.smoke import run_smoke, tau_text
        from dspark_convert.errors import SmokeInputError
        from dspark_convert.runtime.budget import format_bytes as gb
        from dspark_convert.runtime.budget import parse_memory_size

        out = _out()

        def show_estimate(m) -> None:
            if not as_json:
                print_estimate(out, m)

        budget = parse_memory_size(max_memory, error=SmokeInputError) if max_memory is not None \
            else None
        compared = []                 # --compare's result, once the parent has run
        if compare is not None:
            from dspark_convert.commands.smoke import check_comparable

            check_comparable(calibration=calibration)
        result = run_smoke(artifact, target=target, prompts=prompt_ids, prompt_text=prompt,
                           max_new_tokens=max_new_tokens, temperature=temperature,
                           confidence_threshold=confidence_threshold, seed=seed, device=device,
                           dtype=dtype, verify=verify, max_memory=budget, trace=trace, plot=plot,
                           reference=reference, min_tau=min_tau, calibration=calibration,
                           progress=RichProgress(enabled=not as_json), on_estimate=show_estimate,
                           reads=[(compare, "the --compare artifact")] if compare else (),
                           # the parent runs before the reports are written: if it fails,
                           # the command leaves none
                           before_reports=(lambda first: compared.append(
                               _compared(first, compare, as_json, show_estimate))) if compare
                           else None)
        comparison = compared[0] if compared else None
        if as_json:
            extra = {"compare": comparison.model_dump()} if comparison is not None else {}
            print(dumps({"ok": True, **result.model_dump(), **extra}, indent=2))
            return 0
        out.print(escape(f"smoke {artifact} on {target} ({result.device}, {result.dtype}, "
                         f"{result.verify} verify, temperature {result.temperature:g}, threshold "
                         f"{result.confidence_threshold:g})"))
        if result.calibration is not None:
            temps = ", ".join(f"{t:g}" for t in result.calibration.temperatures)
            out.print(escape(f"  calibration {result.calibration.path} applied before the "
                             f"threshold: temperatures {temps}"))
        for i, one in enumerate(result.runs):
            checks = []
            if one.lossless is not None:
                checks.append("= target greedy" if one.lossless else "DIFFERS from target greedy")
            agreed = one.reference_agreement
            if agreed is not None and agreed.identical:
                checks.append(f"= reference run {one.reference_run}")
            elif agreed is not None:
                conf = agreed.confidence_max_abs_difference
                checks.append(f"vs reference run {one.reference_run} ({agreed.reference_dtype}): "
                              f"first {agreed.cycles_tokens_identical} of {agreed.cycles} cycles "
                              f"and {agreed.new_tokens_identical} of {agreed.new_tokens} new "
                              "tokens identical" + ("" if conf is None else
                                                    f", confidence logits within {conf:.2g}"))
            tau = "tau undefined" if one.tau is None else f"tau {one.tau:.2f}"
            out.print(escape(f"  prompt {i}: {one.new_tokens} new tokens in {one.verify_steps} "
                             f"verify steps, {tau}; " + ", ".join(checks)))
        out.print(f"  {tau_text(result.tau)}; acceptance by position: "
                  f"{_rates(result.acceptance_by_position)}")
        speed = (f"  drafted {result.drafted_tokens_per_second:,.0f} tok/s, committed "
                 f"{result.committed_tokens_per_second:,.0f} tok/s")
        if result.target_only_tokens_per_second:
            speed += f" (target alone {result.target_only_tokens_per_second:,.0f} tok/s)"
        out.print(speed)
        timing = f"  load {result.load_seconds:.2f} s"
        if result.verify_seconds_per_cycle is not None:
            timing += (f"; per cycle: verify forward {result.verify_seconds_per_cycle * 1e3:,.1f} ms, "
                       f"draft block {result.draft_seconds_per_cycle * 1e3:,.1f} ms")
        m = result.memory
        timing += f"; peak RSS {gb(m.peak_rss_bytes)} (estimate {gb(m.estimate_bytes)})"
        if m.cuda_max_allocated_bytes is not None:
            timing += f", CUDA max allocated {gb(m.cuda_max_allocated_bytes)}"
        out.print(timing)
        for path in (result.trace, result.plot):
            if path:
                out.print(escape(f"  wrote {path}"))
        if comparison is not None:
            _print_comparison(out, artifact, compare, result, comparison)
        out.print("[green]PASSED[/]")
        return 0

    run(body, debug=debug, as_json=as_json)


def _compared(result, parent: Path, as_json: bool, show_estimate):
    """--compare: the parent run on the same prompts and settings (commands/smoke.py)."""
    from dspark_convert.cli.progress import RichProgress
    from dspark_convert.commands.smoke import compare_smoke

    return compare_smoke(result, parent, progress=RichProgress(enabled=not as_json),
                         on_estimate=show_estimate)


def _rates(rates) -> str:
    return " ".join("-" if r is None else f"{r:.2f}" for r in rates)


def _print_comparison(out, artifact: Path, parent: Path, result, comparison) -> None:
    from dspark_convert.commands.smoke import tau_text

    other = comparison.parent
    out.print(escape(f"  compared with {parent} (the same {len(result.runs)} prompt(s) and "
                     "settings):"))
    width = max(len(str(artifact)), len(str(parent)))
    for label, r in ((artifact, result), (parent, other)):
        out.print(escape(f"    {str(label):<{width}}  {tau_text(r.tau)}; acceptance by "
                         f"position: {_rates(r.acceptance_by_position)}"))
    diff = " ".join("-" if d is None else f"{d:+.2f}" for d in comparison.acceptance_difference)
    change = ("tau undefined" if comparison.tau_difference is None
              else f"tau {comparison.tau_difference:+.3f}")
    out.print(escape(f"    {'difference':<{width}}  {change}; acceptance by position: {diff}"))
    lossless = "both lossless; " if result.lossless and other.lossless else ""
    outputs = "the same output ids" if comparison.same_outputs else "different output ids"
    out.print(f"    {lossless}{outputs}")
