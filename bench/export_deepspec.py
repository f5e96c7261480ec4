"""`dspark export --engine deepspec` at a released drafter's geometry, in bounded memory,
measured.

Builds the all-zero sparse pair of bench/sparse_models.py (default: the released Qwen3-4B
DSpark drafter, 2.79 GB of BF16 with its embedding and head, on a Qwen3-4B target whose
tied embedding is the drafter's two copies; 8b: the untied 8B geometry) or of
bench/sparse_gemma4.py (gemma4-12b: the released 12B drafter, 6.86 GB, on gemma-4-12B-it's
geometry), converts the drafter with --target, then
exports the artifact for DeepSpec against the same target, each command in its own process,
and reports wall time and peak RSS (os.wait4's ru_maxrss); it fails when the export peaks
at 400 MB or more (the bound convert is held to, bench/RESULTS.md) or when its
model.safetensors is not the source's, byte for byte (the export's own check against the
SHA-256 convert recorded: ``weights_identical``). The pair is kept under --workdir for the
next run (sparse: a few kB of disk); the artifact and the export are removed unless --keep.

    python bench/export_deepspec.py [--geometry 4b|8b|gemma4-12b] [--workdir /tmp/dspark-export-bench] [--keep]

Measured on the development machine (2 cores, warm page cache, 2026-12-02): Qwen3-4B
(2.79 GB) export 15.5-22.8 s at 93 MB peak RSS (two runs), 8B (4.74 GB) 16.8 s at 93 MB,
the Gemma4-12B drafter (6.86 GB) 40.2-49.0 s at 94 MB (two runs); docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

PEAK_RSS_BOUND = 400 * 1000 * 1000
DSPARK = Path(sys.executable).parent / "dspark"


def measured(*args: str) -> tuple[int, float, int, str]:
    """(exit code, wall seconds, peak RSS bytes, stdout) of `dspark ARGS` in its own process."""
    start = time.perf_counter()
    proc = subprocess.Popen([str(DSPARK), *args], stdout=subprocess.PIPE, text=True)
    stdout = proc.stdout.read()
    _pid, status, usage = os.wait4(proc.pid, 0)
    return (os.waitstatus_to_exitcode(status), time.perf_counter() - start,
            usage.ru_maxrss * 1024, stdout)


def build(geometry: str, root: Path) -> None:
    """The sparse pair, made in a child process: sparse_models reads the target's tensor
    table through the runtime, which imports torch, and Linux keeps a process' peak RSS
    across exec, so every command this process started afterwards would report torch's."""
    if geometry == "gemma4-12b":
        import sparse_gemma4

        sparse_gemma4.make_sparse_pair(sparse_gemma4.GEMMA4_12B, root)
        return
    from sparse_models import GEOMETRIES, make_sparse_pair

    make_sparse_pair(GEOMETRIES[geometry], root)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--geometry", choices=("4b", "8b", "gemma4-12b"), default="4b")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/dspark-export-bench"))
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--build-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    root = args.workdir / args.geometry
    if args.build_only:
        build(args.geometry, root)
        return 0
    subprocess.run([sys.executable, __file__, "--build-only", "--geometry", args.geometry,
                    "--workdir", str(args.workdir)], check=True)
    target, drafter = root / "target", root / "drafter"
    art, out = args.workdir / "artifact", args.workdir / "export" / drafter.name
    shutil.rmtree(art, ignore_errors=True)
    shutil.rmtree(out.parent, ignore_errors=True)
    size = (drafter / "model.safetensors").stat().st_size
    print(f"{args.geometry} drafter: {size / 1e9:.2f} GB model.safetensors (sparse, all zero)")
    try:
        code, wall, peak, _ = measured("convert", str(drafter), "--target", str(target),
                                       "-o", str(art), "-q")
        print(f"convert   exit {code}  {wall:6.1f} s  peak RSS {peak / 1e6:6.1f} MB")
        if code != 0:
            return 1
        code, wall, peak, stdout = measured("export", str(art), "--engine", "deepspec",
                                            "--target", str(target), "-o", str(out), "--json")
        report = json.loads(stdout) if code == 0 else {}
        identical = bool(report.get("weights_identical"))
        ok = code == 0 and peak < PEAK_RSS_BOUND and identical
        print(f"export    exit {code}  {wall:6.1f} s  peak RSS {peak / 1e6:6.1f} MB  "
              f"model.safetensors the source's: {identical}  {'ok' if ok else 'FAILED'}")
        return 0 if ok else 1
    finally:
        if not args.keep:
            shutil.rmtree(art, ignore_errors=True)
            shutil.rmtree(out.parent, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
