"""`dspark convert`: a checkpoint (a directory or a Hub source) into an artifact."""

from __future__ import annotations

import enum
from typing import Annotated, Optional

import typer

from dspark_convert.cli.app import (
    ArtifactOutputOpt,
    DebugOpt,
    JsonOpt,
    LockOpt,
    QuietOpt,
    ResolveOpt,
    Sha256Opt,
    TargetOpt,
    _out,
    app,
    escape,
    print_check,
    print_engines,
    print_hub,
)
from dspark_convert.cli.errors import run
from dspark_convert.util.json_out import dumps


class Layout(str, enum.Enum):
    """--sample-from-anchor's values."""
    true = "true"
    false = "false"


@app.command()
def convert(
    source: Annotated[str, typer.Argument(help="A DSpark checkpoint directory (config.json + "
                                                "safetensors), or a Hub source org/name@<40-hex commit>.")],
    output: ArtifactOutputOpt,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing output, atomically.")] = False,
    quiet: QuietOpt = False,
    target: TargetOpt = None,
    resolve: ResolveOpt = False,
    sha256: Sha256Opt = None,
    lock: LockOpt = None,
    sample_from_anchor: Annotated[Optional[Layout], typer.Option(
        "--sample-from-anchor", help="A speculators-format checkpoint whose config.json lacks "
        "sample_from_anchor: its block layout, as trained (speculators' schema reads the "
        "missing field true for DSpark, vLLM 0.33 false; it is never guessed). true: the "
        "anchor first (DeepSpec's layout); false is refused (34). Refused for any other "
        "source or against the config's own value (38).")] = None,
    as_json: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Convert a checkpoint (a directory, or a Hub source org/name@<commit>) into
    OUTPUT/drafter.gguf + OUTPUT/manifest.json. DeepSpec's checkpoints, and speculators'
    format (a DSpark or DFlash drafter speculators saved; it needs --target:
    docs/SPECULATORS.md); a DFlash2 drafter (speculators' or z-lab's layout) and a Gemma 4
    assistant (Gemma4UnifiedAssistantForCausalLM), each with --target
    (docs/ARTIFACT_FORMAT.md, "Drafter kinds")."""

    def body() -> int:
        from dspark_convert.cli.progress import RichProgress
        from dspark_convert.commands.convert import convert as do_convert

        hub = None
        if resolve or sha256 or lock is not None:
            from dspark_convert.source.hub.source import HubOptions
            from dspark_convert.source.hub.spec import parse_pins
            hub = HubOptions(resolve=resolve, pins=parse_pins(sha256 or []), lock=lock)
        layout = None if sample_from_anchor is None else sample_from_anchor is Layout.true
        result = do_convert(source, output, force=force, target=target, hub=hub,
                            progress=RichProgress(enabled=not quiet and not as_json),
                            sample_from_anchor=layout)
        m = result.manifest
        target_checks = m.target.checks if m.target else []
        warnings = [c for c in m.checks + target_checks if c.status == "warning"]
        if as_json:
            print(dumps({
                "ok": True, "output": str(result.output), "drafter_gguf": {
                    "size": result.gguf_size, "sha256": result.gguf_sha256,
                    "tensors": len(m.artifact.tensors)},
                "stripped": [s.name for s in m.source.stripped],
                "checks": [c.model_dump() for c in m.checks],
                "engines": {name: e.model_dump() for name, e in m.engines.items()},
                "target": m.target.model_dump() if m.target else None,
                "hub": m.source.hub.model_dump() if m.source.hub else None}, indent=2))
            return 0
        out = _out()
        # Paths, names and details come from files and users: escaped, never rich markup.
        out.print(escape(f"converted {source} -> {result.output}"))
        if m.source.hub:
            print_hub(out, m.source.hub)
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
            if check.name.startswith("engine.") and check.status == "info":
                continue        # the engines table below says it
            print_check(out, check)
        print_engines(out, m.engines)
        return 0

    run(body, debug=debug, as_json=as_json)
