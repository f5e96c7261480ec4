"""`dspark`: convert (from a directory or the Hub), lock, validate, inspect and smoke-test
DSpark drafters for Strata.

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
from rich.markup import escape as escape_markup
from rich.table import Table

from dspark_convert import __version__
from dspark_convert.util.text import shown
from dspark_convert.cli.errors import run


def escape(text: object) -> str:
    """Text from files and users for rich output: non-printing characters escaped (no
    terminal escape sequence reaches the screen), then rich markup escaped."""
    return escape_markup(shown(text))

app = typer.Typer(
    name="dspark",
    help="Convert DeepSeek DSpark drafters into Strata artifacts (from a directory or the Hub, "
         "pinned), validate, inspect and smoke-test them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print a machine-readable JSON report on stdout.")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show the traceback of an error.")]
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


@app.callback()
def main(
    version: Annotated[Optional[bool], typer.Option("--version", callback=_version, is_eager=True,
                                                    help="Print the version and exit.")] = None,
) -> None:
    """Exit codes: 0 success, 2 usage, 10-77 one per kind of refusal (see README)."""


@app.command()
def convert(
    source: Annotated[str, typer.Argument(help="A DSpark checkpoint directory (config.json + "
                                                "safetensors), or a Hub source org/name@<40-hex commit>.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="The artifact directory to create.")],
    force: Annotated[bool, typer.Option("--force", help="Replace an existing output, atomically.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")] = False,
    target: TargetOpt = None,
    resolve: ResolveOpt = False,
    sha256: Sha256Opt = None,
    lock: LockOpt = None,
    as_json: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Convert a checkpoint (a directory, or a Hub source org/name@<commit>) into
    OUTPUT/drafter.gguf + OUTPUT/manifest.json."""

    def body() -> int:
        from dspark_convert.commands.convert import convert as do_convert
        from dspark_convert.cli.progress import RichProgress

        hub = None
        if resolve or sha256 or lock is not None:
            from dspark_convert.source.hub.snapshot import HubOptions, parse_pins
            hub = HubOptions(resolve=resolve, pins=parse_pins(sha256 or []), lock=lock)
        result = do_convert(source, output, force=force, target=target, hub=hub,
                            progress=RichProgress(enabled=not quiet and not as_json))
        m = result.manifest
        target_checks = m.target.checks if m.target else []
        warnings = [c for c in m.checks + target_checks if c.status == "warning"]
        if as_json:
            print(json.dumps({
                "ok": True, "output": str(result.output), "drafter_gguf": {
                    "size": result.gguf_size, "sha256": result.gguf_sha256,
                    "tensors": len(m.artifact.tensors)},
                "stripped": [s.name for s in m.source.stripped],
                "checks": [c.model_dump() for c in m.checks],
                "target": m.target.model_dump() if m.target else None,
                "hub": m.source.hub.model_dump() if m.source.hub else None}, indent=2))
            return 0
        out = _out()
        # Paths, names and details come from files and users: escaped, never rich markup.
        out.print(escape(f"converted {source} -> {result.output}"))
        if m.source.hub:
            _print_hub(out, m.source.hub)
        out.print(f"  drafter.gguf  {result.gguf_size:,} bytes  sha256 {result.gguf_sha256}")
        stripped = ", ".join(s.name for s in m.source.stripped) or "none"
        out.print(escape(f"  {len(m.artifact.tensors)} tensors written; hashed and stripped: {stripped}"))
        if m.target:
            out.print(escape(f"  target {target}: {len(target_checks)} pairing checks; tokenizer "
                             f"{m.target.tokenizer.sha256[:16]}… and embedding/head hashes recorded"))
        passed = sum(c.status == 'passed' for c in m.checks + target_checks)
        infos = [c for c in m.checks + target_checks if c.status == "info"]
        out.print(f"  checks: {passed} passed, {len(warnings)} warning(s), {len(infos)} note(s)")
        for check in warnings + infos:
            style = STATUS_STYLE[check.status]
            out.print(f"  [{style}]{check.status}[/] {escape(check.name)}: {escape(check.detail)}")
        return 0

    run(body, debug=debug, as_json=as_json)


def _print_hub(out: Console, hub) -> None:
    if hub.resolved:
        out.print(escape(f"  resolved {hub.repo}@{hub.requested_revision} -> {hub.commit} "
                         "(recorded)"))
    where = "the local cache (offline)" if hub.offline else hub.endpoint
    out.print(escape(f"  {hub.repo}@{hub.commit} from {where}: {len(hub.files)} file(s) "
                     "SHA-256 verified"))
    for f in hub.files:
        against = ", ".join(f.verified_against) or "nothing to compare with"
        out.print(escape(f"    {f.path}  {f.size:,} bytes  sha256 {f.sha256}  ({against})"))


@app.command()
def lock(
    source: Annotated[str, typer.Argument(help="A Hub source: org/name@<40-hex commit> (or a "
                                                 "branch/tag with --resolve).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="The lock file to write.")],
    resolve: ResolveOpt = False,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing lock file, atomically.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")] = False,
    as_json: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Download and verify a Hub source; record its commit and each file's size and SHA-256."""

    def body() -> int:
        from dspark_convert.source.hub.snapshot import lock_snapshot
        from dspark_convert.cli.progress import RichProgress

        result = lock_snapshot(source, output, resolve=resolve, force=force,
                               progress=RichProgress(enabled=not quiet and not as_json))
        record = result.snapshot.record()
        if as_json:
            print(json.dumps({"ok": True, "lock": str(result.path), "hub": record.model_dump()},
                             indent=2))
            return 0
        out = _out()
        out.print(escape(f"locked {source} -> {result.path}"))
        _print_hub(out, record)
        return 0

    run(body, debug=debug, as_json=as_json)


@app.command()
def validate(
    artifact: Annotated[Path, typer.Argument(help="An artifact directory written by `dspark convert`.")],
    strict: Annotated[bool, typer.Option("--strict", help="Treat warnings as failures (exit 45).")] = False,
    target: TargetOpt = None,
    as_json: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Re-check an artifact from scratch; exit 0 only when every check passed."""

    def body() -> int:
        from dspark_convert.commands.validate import validate_artifact
        from dspark_convert.cli.progress import RichProgress

        report = validate_artifact(artifact, progress=RichProgress(enabled=not as_json),
                                   target=target)
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
            sys.stderr.write(f"error: {shown(failure.name)}: {shown(failure.detail)}\n")
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
        from dspark_convert.commands.inspection import inspect_path

        result = inspect_path(path)
        if as_json:
            print(json.dumps(result.model_dump(), indent=2))
        else:
            _print_inspect(result)
        if result.problem is not None:
            sys.stderr.write(f"error: {shown(result.problem['message'])}\n")
            return result.problem_exit_code or 1
        return 0

    run(body, debug=debug, as_json=False)


def _prompt_ids(values: Optional[list[str]]) -> list[list[int]]:
    """--prompt-ids 1,17,33 (repeatable) -> [[1, 17, 33], ...]; a usage error (exit 2) else."""
    prompts = []
    for text in values or []:
        try:
            prompts.append([int(part) for part in text.split(",") if part.strip()])
        except ValueError:
            raise typer.BadParameter(f"expected comma-separated token ids, found {text!r}") from None
    return prompts


@app.command()
def smoke(
    artifact: Annotated[Path, typer.Argument(help="An artifact directory written by `dspark convert`.")],
    target: Annotated[Path, typer.Option("--target", help="The target model directory (Qwen3, HF safetensors).")],
    prompt_ids: Annotated[Optional[list[str]], typer.Option(
        "--prompt-ids", metavar="IDS", callback=_prompt_ids,
        help="A prompt as comma-separated token ids; repeat for more prompts.")] = None,
    prompt: Annotated[Optional[str], typer.Option(
        "--prompt", help="A text prompt, tokenized with the target's tokenizer.json.")] = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", min=1)] = 64,
    temperature: Annotated[float, typer.Option("--temperature", min=0.0, max=100.0)] = 0.0,
    confidence_threshold: Annotated[float, typer.Option(
        "--confidence-threshold", min=0.0, max=1.0,
        help="Cut the block at the first position whose confidence is below this (0: off).")] = 0.0,
    seed: Annotated[int, typer.Option("--seed", help="Random seed for temperature > 0 (0..2^64-1).")] = 0,
    device: Annotated[str, typer.Option("--device", help="auto, cpu or cuda.")] = "auto",
    dtype: Annotated[str, typer.Option(
        "--dtype", help="Compute dtype: float32 (the reference for DeepSpec's traces) or "
        "bfloat16 (as the engines compute).")] = "float32",
    verify: Annotated[str, typer.Option(
        "--verify", help="Verify drafts in one forward (batched, as engines do) or token by "
        "token (stepwise: exactly the target's greedy numerics); auto: batched in float32, "
        "stepwise in bfloat16.")] = "auto",
    max_memory: Annotated[Optional[str], typer.Option(
        "--max-memory", metavar="SIZE", help="Check the memory estimate against SIZE (20GB, "
        "16GiB) instead of what the device has available.")] = None,
    trace: Annotated[Optional[Path], typer.Option("--trace", help="Write the trace (reference.json format).")] = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="Write a PNG of acceptance by draft position.")] = None,
    reference: Annotated[Optional[Path], typer.Option(
        "--reference", help="A reference.json: fail at the first cycle that differs (in "
        "another dtype: report the agreement).")] = None,
    min_tau: Annotated[Optional[float], typer.Option("--min-tau", help="Fail when tau is below this.")] = None,
    as_json: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Run the drafter against its target: tau, acceptance by position, speed; fails when the
    output differs from the target's own (temperature 0) or from --reference."""

    def body() -> int:
        from dspark_convert.runtime.memory import format_bytes as gb
        from dspark_convert.commands.smoke import parse_memory_size, run_smoke
        from dspark_convert.cli.progress import RichProgress

        out = _out()

        def show_estimate(m) -> None:
            # Printed before the weights are loaded; the JSON report carries the same fields.
            if not as_json:
                out.print(escape(f"memory estimate {gb(m.estimate_bytes)} on {m.device} "
                                 f"({m.dtype}): weights {gb(m.target_weights_bytes)} target + "
                                 f"{gb(m.drafter_weights_bytes)} drafter, activations "
                                 f"{gb(m.activations_bytes)} ({m.context_tokens} positions), "
                                 f"runtime {gb(m.runtime_bytes)}; {gb(m.budget_bytes)} "
                                 f"available ({m.budget_source})"))

        budget = parse_memory_size(max_memory) if max_memory is not None else None
        result = run_smoke(artifact, target=target, prompts=prompt_ids, prompt_text=prompt,
                           max_new_tokens=max_new_tokens, temperature=temperature,
                           confidence_threshold=confidence_threshold, seed=seed, device=device,
                           dtype=dtype, verify=verify, max_memory=budget, trace=trace, plot=plot,
                           reference=reference, min_tau=min_tau,
                           progress=RichProgress(enabled=not as_json), on_estimate=show_estimate)
        if as_json:
            print(json.dumps({"ok": True, **result.model_dump()}, indent=2))
            return 0
        out.print(escape(f"smoke {artifact} on {target} ({result.device}, {result.dtype}, "
                         f"{result.verify} verify, temperature {result.temperature:g}, threshold "
                         f"{result.confidence_threshold:g})"))
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
            out.print(escape(f"  prompt {i}: {one.new_tokens} new tokens in {one.verify_steps} "
                             f"verify steps, tau {one.tau:.2f}; " + ", ".join(checks)))
        rates = " ".join("-" if r is None else f"{r:.2f}" for r in result.acceptance_by_position)
        out.print(f"  tau {result.tau:.3f}; acceptance by position: {rates}")
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
        out.print("[green]PASSED[/]")
        return 0

    run(body, debug=debug, as_json=as_json)


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
    if result.unexpected_not_listed:
        out.print(f"  ... and {result.unexpected_not_listed:,} more unexpected tensors (not listed)")


if __name__ == "__main__":  # pragma: no cover
    app()
