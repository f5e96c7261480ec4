"""`dspark export`: an artifact as another engine's drafter file (llama.cpp 0c1e570)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import enum

import typer

from dspark_convert.cli.app import DebugOpt, JsonOpt, QuietOpt, _out, app, escape, print_check
from dspark_convert.cli.errors import run
from dspark_convert.util.json_out import dumps


class Engine(str, enum.Enum):
    """The engines `export` lays files out for (commands/export.ENGINES; spelled here too:
    importing the command for --help would load gguf and numpy)."""
    llama_cpp = "llama.cpp"


@app.command()
def export(
    artifact: Annotated[Path, typer.Argument(help="An artifact directory written by `dspark "
                                                  "convert` or `dspark quantize` (it must pass "
                                                  "`dspark validate`).")],
    target_gguf: Annotated[Path, typer.Option(
        "--target-gguf", metavar="TARGET.gguf", help="The target model's GGUF file, the one "
        "llama.cpp runs (-m): checked against the artifact, and its tokenizer embedded.")],
    # Text, not a Path: a Path would turn an empty -o "" into "." (util/atomic.check_outputs).
    output: Annotated[str, typer.Option("--output", "-o", metavar="DRAFTER.gguf",
                                         help="The drafter file to create.")],
    engine: Annotated[Engine, typer.Option(
        "--engine",
        help="The engine to lay the file out for: llama.cpp (0c1e570).")],
    keep_embedding: Annotated[bool, typer.Option(
        "--keep-embedding", help="Carry the target's token_embd.weight, as llama.cpp's own "
        "converter does. llama.cpp 0c1e570 then uses it as the drafter's head too, which is "
        "wrong for a target with untied embeddings (docs/ENGINES.md); without it llama.cpp "
        "binds the target's embedding and head.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing output, atomically.")] = False,
    quiet: QuietOpt = False,
    as_json: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Write the drafter file an engine loads (llama.cpp: llama-speculative-simple -md), from a
    validated artifact and the target GGUF it runs with."""

    def body() -> int:
        from dspark_convert.cli.progress import RichProgress
        from dspark_convert.commands.export import export_llama_cpp

        result = export_llama_cpp(artifact, target_gguf, output, force=force,
                                  keep_embedding=keep_embedding,
                                  progress=RichProgress(enabled=not quiet and not as_json))
        if as_json:
            print(dumps({
                "ok": True, "engine": result.engine, "output": str(result.output),
                "drafter": result.drafter, "size": result.size, "sha256": result.sha256,
                "tensors": result.tensors, "artifact_sha256": result.artifact_sha256,
                "embedding_kept": result.embedding_kept,
                "checks": [c.model_dump() for c in result.checks]}, indent=2))
            return 0
        out = _out()
        out.print(escape(f"exported {artifact} -> {result.output} for {result.engine}"))
        out.print(escape(f"  {result.drafter}"))
        out.print(f"  {result.size:,} bytes, {result.tensors} tensors, sha256 {result.sha256}")
        for check in result.checks:
            print_check(out, check)
        return 0

    run(body, debug=debug, as_json=as_json)
