"""`dspark export`: an artifact as another engine's drafter file (llama.cpp 0c1e570) or as
the checkpoint DeepSpec saves (config.json + model.safetensors: vLLM, SGLang, dspark-mlx)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import enum

import typer

from dspark_convert.cli.app import DebugOpt, JsonOpt, QuietOpt, _out, app, escape, print_check
from dspark_convert.cli.errors import run
from dspark_convert.util.json_out import dumps


class Engine(str, enum.Enum):
    """The engines `export` lays files out for (commands/export.ENGINES; spelled here too:
    importing the command for --help would load gguf and numpy)."""
    llama_cpp = "llama.cpp"
    deepspec = "deepspec"
    speculators = "speculators"


@app.command()
def export(
    artifact: Annotated[Path, typer.Argument(help="An artifact directory written by `dspark "
                                                  "convert` (or, for llama.cpp, `dspark "
                                                  "quantize`); it must pass `dspark validate`. "
                                                  "llama.cpp also takes a DFlash2 or Gemma 4 "
                                                  "assistant checkpoint directory as it is.")],
    # Text, not a Path: a Path would turn an empty -o "" into "." (util/atomic.check_outputs).
    output: Annotated[str, typer.Option("--output", "-o", metavar="<path>",
                                         help="The file to create (llama.cpp: the drafter "
                                         "GGUF) or directory (deepspec, speculators: "
                                         "config.json + model.safetensors).")],
    engine: Annotated[Engine, typer.Option(
        "--engine",
        help="The engine to lay the drafter out for: llama.cpp (0c1e570), deepspec "
        "(DeepSpec's own checkpoint, which vLLM, SGLang and dspark-mlx read), or speculators "
        "(vllm-project/speculators 0.9.0's format, which vLLM 0.33 serves: "
        "docs/SPECULATORS.md).")],
    target_gguf: Annotated[Optional[Path], typer.Option(
        "--target-gguf", metavar="TARGET.gguf", help="llama.cpp: the target model's GGUF file, "
        "the one llama.cpp runs (-m): checked against the artifact, and its tokenizer "
        "embedded.")] = None,
    target: Annotated[Optional[str], typer.Option(
        "--target", help="deepspec: the target model, a directory or org/name@<40-hex commit> "
        "on the Hub: paired with the artifact as `validate --target` does, and the source of "
        "the embedding and head the artifact stripped (checked against the SHA-256 recorded "
        "at convert). speculators: the same target, paired the same way, recorded as the "
        "verifier (its repo id, or the directory as given), whose embedding and head "
        "speculators and vLLM load.")] = None,
    keep_embedding: Annotated[bool, typer.Option(
        "--keep-embedding", help="llama.cpp: carry the target's token_embd.weight, as "
        "llama.cpp's own converter does. llama.cpp 0c1e570 then uses it as the drafter's head "
        "too, which is wrong for a target with untied embeddings (docs/ENGINES.md); without "
        "it llama.cpp binds the target's embedding and head.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing output, atomically.")] = False,
    quiet: QuietOpt = False,
    as_json: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Write the drafter as an engine loads it: llama.cpp's drafter file
    (llama-speculative-simple -md), from a validated artifact and the target GGUF it runs
    with; or DeepSpec's checkpoint (config.json + model.safetensors, every tensor bit-exact,
    the embedding and head from the target); or speculators' (config.json +
    model.safetensors, sample_from_anchor always written, the target recorded as the
    verifier)."""

    def body() -> int:
        from dspark_convert.cli.progress import RichProgress
        from dspark_convert.commands.export import check_engine_options

        check_engine_options(engine.value, {"--target-gguf": target_gguf, "--target": target,
                                            "--keep-embedding": keep_embedding})
        progress = RichProgress(enabled=not quiet and not as_json)
        if engine is Engine.speculators:
            from dspark_convert.commands.export_speculators import export_speculators

            return _print_speculators(export_speculators(artifact, target, output, force=force,
                                                         progress=progress), artifact, as_json)
        if engine is Engine.deepspec:
            from dspark_convert.commands.export_deepspec import export_deepspec

            return _print_deepspec(export_deepspec(artifact, target, output, force=force,
                                                   progress=progress), artifact, as_json)
        from dspark_convert.commands.export import DrafterExportResult, export_any_llama_cpp

        result = export_any_llama_cpp(artifact, target_gguf, output, force=force,
                                      keep_embedding=keep_embedding, progress=progress)
        if isinstance(result, DrafterExportResult):
            return _print_kind(result, artifact, as_json)
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


def _print_kind(result, artifact: Path, as_json: bool) -> int:
    """A DFlash2 drafter's or a Gemma 4 assistant's llama.cpp file, and how to run it."""
    run_with = f"--spec-type {result.spec_type} --spec-draft-n-max {result.n_max}"
    if as_json:
        print(dumps({
            "ok": True, "engine": result.engine, "output": str(result.output),
            "kind": result.kind, "spec_type": result.spec_type, "n_max": result.n_max,
            "size": result.size, "sha256": result.sha256, "tensors": result.tensors,
            "checks": [c.model_dump() for c in result.checks]}, indent=2))
        return 0
    out = _out()
    out.print(escape(f"exported {artifact} -> {result.output} for {result.engine}"))
    out.print(escape(f"  {result.kind}: run it with {run_with}"))
    out.print(f"  {result.size:,} bytes, {result.tensors} tensors, sha256 {result.sha256}")
    for check in result.checks:
        print_check(out, check)
    return 0


def _print_deepspec(result, artifact: Path, as_json: bool) -> int:
    return _print_directory(result, artifact, as_json, {
        "from_target": list(result.from_target), "artifact_sha256": result.artifact_sha256,
        "source_name": result.source_name, "config_identical": result.config_identical,
        "weights_identical": result.weights_identical}, "")


def _print_speculators(result, artifact: Path, as_json: bool) -> int:
    return _print_directory(result, artifact, as_json, {
        "verifier": result.verifier, "artifact_sha256": result.artifact_sha256},
        f", verifier {result.verifier}")


def _print_directory(result, artifact: Path, as_json: bool, fields: dict, more: str) -> int:
    """A checkpoint directory's export (deepspec, speculators): its files and checks, the
    engine's own ``fields`` after the tensors in the JSON, ``more`` on the summary line."""
    if as_json:
        print(dumps({
            "ok": True, "engine": result.engine, "output": str(result.output),
            "drafter": result.drafter, "files": [f.model_dump() for f in result.files],
            "tensors": result.tensors, **fields,
            "checks": [c.model_dump() for c in result.checks]}, indent=2))
        return 0
    out = _out()
    out.print(escape(f"exported {artifact} -> {result.output} for {result.engine}"))
    out.print(escape(f"  {result.drafter}, {result.tensors} tensors{more}"))
    for f in result.files:
        out.print(escape(f"  {f.path}: {f.size:,} bytes, sha256 {f.sha256}"))
    for check in result.checks:
        print_check(out, check)
    return 0
