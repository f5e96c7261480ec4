"""`dspark lock`: pin a Hub source's commit and every file's SHA-256."""

from __future__ import annotations

from typing import Annotated

import typer

from dspark_convert.cli.app import (
    DebugOpt,
    JsonOpt,
    QuietOpt,
    ResolveOpt,
    _out,
    app,
    escape,
    print_hub,
)
from dspark_convert.cli.errors import run
from dspark_convert.util.json_out import dumps


@app.command()
def lock(
    source: Annotated[str, typer.Argument(help="A Hub source: org/name@<40-hex commit> (or a "
                                                 "branch/tag with --resolve).")],
    # Text, not a Path: a Path would turn an empty -o "" into "." (util/atomic.py).
    output: Annotated[str, typer.Option("--output", "-o", metavar="<path>",
                                        help="The lock file to write.")],
    resolve: ResolveOpt = False,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing lock file, atomically.")] = False,
    quiet: QuietOpt = False,
    as_json: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Download and verify a Hub source; record its commit and each file's size and SHA-256."""

    def body() -> int:
        from dspark_convert.cli.progress import RichProgress
        from dspark_convert.commands.lock import lock_snapshot

        result = lock_snapshot(source, output, resolve=resolve, force=force,
                               progress=RichProgress(enabled=not quiet and not as_json))
        record = result.snapshot.record()
        if as_json:
            print(dumps({"ok": True, "lock": str(result.path), "hub": record.model_dump()},
                             indent=2))
            return 0
        out = _out()
        out.print(escape(f"locked {source} -> {result.path}"))
        print_hub(out, record)
        return 0

    run(body, debug=debug, as_json=as_json)
