"""`dspark quantize`: a Q8_0 / Q5_0 / Q4_0 artifact from a BF16 one."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dspark_convert.cli.app import (
    ArtifactOutputOpt,
    DebugOpt,
    JsonOpt,
    QuietOpt,
    _out,
    app,
    escape,
    print_check,
    print_engines,
)
from dspark_convert.cli.errors import run
from dspark_convert.util.json_out import dumps


@app.command()
def quantize(
    artifact: Annotated[Path, typer.Argument(help="A BF16 artifact directory written by "
                                                  "`dspark convert` (it must pass `dspark validate`).")],
    output: ArtifactOutputOpt,
    qtype: Annotated[str, typer.Option(
        "--type", metavar="TYPE", help="q8_0, q5_0 or q4_0: the type of the 2-D backbone "
        "matrices (fc, attention, MLP); norms and biases stay BF16.")],
    heads: Annotated[Optional[str], typer.Option(
        "--heads", metavar="TYPE", help="Quantize the Markov and confidence matrices too, to "
        "this type (default: they stay BF16).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing output, atomically.")] = False,
    quiet: QuietOpt = False,
    as_json: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Quantize a BF16 artifact into OUTPUT/drafter.gguf + OUTPUT/manifest.json, with gguf-py's
    quantizers (the bytes Strata's tools/dflash_quantize.py writes)."""

    def body() -> int:
        from dspark_convert.cli.progress import RichProgress
        from dspark_convert.commands.quantize import quantize_artifact

        result = quantize_artifact(artifact, output, qtype, heads=heads, force=force,
                                   progress=RichProgress(enabled=not quiet and not as_json))
        m = result.manifest
        errors = {t.name: t.error for t in m.artifact.tensors if t.error is not None}
        if as_json:
            print(dumps({
                "ok": True, "output": str(result.output), "drafter_gguf": {
                    "size": result.gguf_size, "sha256": result.gguf_sha256,
                    "tensors": len(m.artifact.tensors)},
                "quantization": m.quantization.model_dump(),
                "parent": m.parent.model_dump(),
                "errors": {name: e.model_dump() for name, e in errors.items()},
                "checks": [c.model_dump() for c in m.checks],
                "engines": {name: e.model_dump() for name, e in m.engines.items()}}, indent=2))
            return 0
        out = _out()
        q = m.quantization
        c = m.contract
        has_heads = c.markov_head.type != "none" or c.confidence_head.enabled
        kept = f"head matrices {q.heads or 'BF16'}" if has_heads else "no head matrices"
        out.print(escape(f"quantized {artifact} -> {result.output} ({q.type}; {kept})"))
        parent = next(f for f in m.parent.files if f.path == "drafter.gguf")
        out.print(f"  drafter.gguf  {result.gguf_size:,} bytes  sha256 {result.gguf_sha256}  "
                  f"(parent {parent.size:,} bytes, {result.gguf_size / parent.size:.1%})")
        counts: dict[str, int] = {}
        for t in m.artifact.tensors:
            counts[t.type] = counts.get(t.type, 0) + 1
        out.print("  " + ", ".join(f"{n} tensors {t}" for t, n in sorted(counts.items())))
        if errors:
            worst = max(errors, key=lambda name: errors[name].rel_rms)
            out.print(escape(f"  error against BF16: relative RMS {min(e.rel_rms for e in errors.values()):.4g}"
                             f" to {errors[worst].rel_rms:.4g} ({worst}), max |q - x| "
                             f"{max(e.max_abs for e in errors.values()):.4g}"))
        # The engines' notes are the table below.
        notes = [c for c in m.checks if c.status in ("warning", "info")
                 and not c.name.startswith("engine.")]
        passed = sum(c.status == "passed" for c in m.checks)
        out.print(f"  checks: {passed} passed, "
                  f"{sum(c.status == 'warning' for c in m.checks)} warning(s), "
                  f"{sum(c.status == 'info' for c in m.checks)} note(s)")
        for check in notes:
            print_check(out, check)
        print_engines(out, m.engines)
        return 0

    run(body, debug=debug, as_json=as_json)
