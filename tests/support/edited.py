"""A checkpoint directory copied with its config.json edited, and the convert-then-export
round trip the config tests (block layout, speculators' field types) share."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from support.cli import run_cli


def edited_copy(base: Path, dest: Path, edit=None) -> Path:
    """``base`` copied to ``dest``, its config.json changed in place by ``edit(config)``."""
    shutil.copytree(base, dest)
    if edit is not None:
        config = json.loads((dest / "config.json").read_text())
        edit(config)
        (dest / "config.json").write_text(json.dumps(config, indent=2))
    return dest


def convert_then_export(work: Path, src: Path, target: Path) -> tuple[dict, dict]:
    """``src`` converted against ``target`` into WORK/art, exported with `--engine deepspec`
    into WORK/exported, each exiting 0 and leaving no temporary sibling: (manifest.json,
    the exported config.json)."""
    art, exported = work / "art", work / "exported"
    for args in (("convert", str(src), "-o", str(art)),
                 ("export", str(art), "--engine", "deepspec", "-o", str(exported))):
        proc = run_cli(*args, "--target", str(target), "-q")
        assert proc.returncode == 0, proc.stderr
    assert not [p for p in work.iterdir() if "tmp" in p.name]
    return (json.loads((art / "manifest.json").read_text()),
            json.loads((exported / "config.json").read_text()))
