"""`dspark profile`: measure the target's cost table (commands/profile.py)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from dspark_convert.cli.app import DebugOpt, DeviceOpt, JsonOpt, _out, app, escape, int_option
from dspark_convert.cli.errors import run
from dspark_convert.util.json_out import dumps


@app.command()
def profile(
    target: Annotated[str, typer.Option(
        "--target", help="The target model directory (Qwen3 or Gemma 4: HF safetensors), or "
        "org/name@<40-hex commit> on the Hub.")],
    # Text, not a Path: a Path would turn an empty -o "" into "." (util/atomic.py).
    output: Annotated[str, typer.Option("--output", "-o", metavar="<path>",
                                        help="The cost table JSON file to write.")],
    max_tokens: Annotated[Optional[int], typer.Option(
        "--max-tokens", parser=int_option,
        help="Measure B = 1..16, then four per doubling (20, 24, 28, 32, 40, ...), ending "
        "exactly here (default 1024).")] = None,
    tokens: Annotated[Optional[str], typer.Option(
        "--tokens", metavar="B1,B2,...", help="Measure exactly these B instead (strictly "
        "increasing positive integers; not with --max-tokens).")] = None,
    context: Annotated[int, typer.Option(
        "--context", parser=int_option,
        help="Tokens prefilled into the KV cache before each verify forward.")] = 64,
    repeats: Annotated[int, typer.Option(
        "--repeats", parser=int_option,
        help="Timed verify forwards per B, after one untimed; the rate is 1 / their median "
        "time.")] = 5,
    segment: Annotated[int, typer.Option(
        "--segment", parser=int_option,
        help="A request's verify block (1 + its drafter's block size): a step of B tokens is "
        "measured as B / segment requests' blocks in one packed forward, each after its own "
        "context.")] = 8,
    requests: Annotated[Optional[int], typer.Option(
        "--requests", parser=int_option, metavar="R",
        help="Measure each B as R requests' blocks instead (B spread evenly over them): the "
        "table of a concurrency of R, for a machine where a step's cost grows with the "
        "requests in it, not only its tokens (a small model on a CPU).")] = None,
    dtype: Annotated[str, typer.Option(
        "--dtype", help="Compute dtype: float32 or bfloat16 (as the engines compute).")] = "float32",
    device: DeviceOpt = "auto",
    force: Annotated[bool, typer.Option("--force", help="Replace an existing cost table, "
                                                        "atomically.")] = False,
    as_json: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Measure the target's verify steps per second at B tokens, SPS(B), on this device, and
    write the cost table the dspark policies schedule with (docs/SCHEDULING.md)."""

    def body() -> int:
        from rich.table import Table

        from dspark_convert.cli.progress import RichProgress
        from dspark_convert.commands.profile import run_profile
        from dspark_convert.scheduling.profile import parse_tokens

        batch_tokens = parse_tokens(tokens) if tokens is not None else None
        result = run_profile(target, output=output, max_tokens=max_tokens, tokens=batch_tokens,
                             context=context, repeats=repeats, segment=segment,
                             requests=requests,
                             device=device, dtype=dtype,
                             force=force, progress=RichProgress(enabled=not as_json,
                                                                counted=True))
        if as_json:
            print(dumps({"ok": True, **result.model_dump()}, indent=2))
            return 0
        t = result.table
        out = _out()
        out.print(escape(f"profile {result.target} on {t.device} ({t.dtype}, {t.threads} "
                         f"threads): context {result.context}, median of {result.repeats} "
                         f"verify forwards per B; load {result.load_seconds:.2f} s"))
        rows = Table(show_lines=False)
        for name in ("B", "seconds", "SPS"):
            rows.add_column(name, justify="right")
        for b, rate in zip(t.tokens, t.steps_per_second):
            rows.add_row(str(b), f"{1.0 / rate:.6f}", f"{rate:,.1f}")
        out.print(rows)
        out.print(escape(f"  wrote {result.output}"))
        return 0

    run(body, debug=debug, as_json=as_json)
