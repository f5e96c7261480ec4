"""The released Gemma4-12B drafter's geometry through `dspark convert` and `dspark validate`
in bounded memory, measured.

Builds a BF16 checkpoint with exactly the keys and shapes of
golden/reference/released_shapes.json ``gemma4/vanilla+conf_with_markov`` (74 tensors,
6.86 GB) and the released config.json as quoted (golden/reference/gemma4/), streamed to
disk one 8 MiB block at a time (a repeating pattern of small finite BF16 values: only the
size matters here, the values are DeepSeek's nowhere), then runs both commands in their own
process and reports wall time and peak RSS (os.wait4's ru_maxrss), failing when either
peaks at 400 MB or more (the bound Qwen3's conversion is held to, bench/RESULTS.md).
Everything is written under --workdir and removed afterwards unless --keep.

    python bench/gemma4_12b.py [--workdir /tmp/dspark-gemma4-12b] [--keep]

Measured on the development machine (2 cores, warm page cache, 2026-12-02, two runs):
convert 18-23 s at 82-85 MB peak RSS, 2.83 GB drafter.gguf (72 tensors written, the
embedding and head stripped); validate --strict 3.9-4.7 s at 82-86 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHAPES = ROOT / "golden" / "reference" / "released_shapes.json"
CONFIG = ROOT / "golden" / "reference" / "gemma4" / "released_12b_config_quoted.json"
VARIANT = "gemma4/vanilla+conf_with_markov"
BLOCK = 8 * 1024 * 1024
PEAK_RSS_BOUND = 400 * 1000 * 1000
DSPARK = Path(sys.executable).parent / "dspark"


def make_checkpoint(out: Path) -> int:
    """config.json + model.safetensors at the released geometry; returns the data bytes."""
    shapes = json.loads(SHAPES.read_text())[VARIANT]
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(CONFIG, out / "config.json")
    header, offset = {}, 0
    for name, shape in shapes.items():
        nbytes = 2
        for dim in shape:
            nbytes *= dim
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    # Bytes below 0x40 make every BF16 value small and finite (the converter checks).
    pattern = bytes((i * 7) % 64 for i in range(BLOCK))
    with open(out / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        left = offset
        while left:
            n = min(left, BLOCK)
            f.write(pattern[:n])
            left -= n
    return offset


def measured(*args: str) -> tuple[int, float, int]:
    """(exit code, wall seconds, peak RSS bytes) of `dspark ARGS` in its own process."""
    start = time.perf_counter()
    proc = subprocess.Popen([str(DSPARK), *args], stdout=subprocess.DEVNULL)
    _pid, status, usage = os.wait4(proc.pid, 0)
    return os.waitstatus_to_exitcode(status), time.perf_counter() - start, usage.ru_maxrss * 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/dspark-gemma4-12b"))
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    src, art = args.workdir / "src", args.workdir / "artifact"
    shutil.rmtree(args.workdir, ignore_errors=True)
    try:
        size = make_checkpoint(src)
        print(f"checkpoint: {size / 1e9:.2f} GB of tensor data, {VARIANT}")
        failed = False
        for name, cmd in (("convert", ("convert", str(src), "-o", str(art), "-q")),
                          ("validate", ("validate", "--strict", str(art)))):
            code, wall, peak = measured(*cmd)
            ok = code == 0 and peak < PEAK_RSS_BOUND
            failed |= not ok
            print(f"{name:9s} exit {code}  {wall:6.1f} s  peak RSS {peak / 1e6:6.1f} MB  "
                  f"{'ok' if ok else 'FAILED'}")
        return 1 if failed else 0
    finally:
        if not args.keep:
            shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
