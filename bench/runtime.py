"""Benchmark the reference runtime (`dspark smoke`) at the released geometry, on the CPU.

    python bench/runtime.py build [--workdir DIR] [--geometries 4b,8b]
    flock LOCK python bench/runtime.py run [--workdir DIR] [--dtypes bfloat16,float32]

(`make bench-runtime` runs both; DIR defaults to /tmp/dspark-runtime-bench.)

``build`` writes, per geometry (bench/sparse_models.py: Qwen3-4B and Qwen3-8B targets with
DeepSeek's DSpark drafter geometry for each), an all-zero target and drafter as sparse
files, and converts the drafter with `dspark convert` (drafter.gguf is written for real:
1.2 GB / 2.3 GB). Kept in the workdir for the next run. Needs little memory.

``run`` needs up to 20 GB of RAM: run it under the machine's big-memory lock, as few times
as possible. Per geometry and dtype, one process:

    dspark smoke ART --target T --device cpu --dtype D --verify batched
                 --prompt-ids 1..64 --max-new-tokens 16 --json

(``--verify batched``: one target forward per verify step, as the engines verify, so that
the verify time is that of one 8-token forward in both dtypes; `smoke --dtype bfloat16`
verifies stepwise by default, L+1 single-token forwards, for exact losslessness.)

Wall time and peak RSS come from the kernel (``os.wait4``: the child's ru_maxrss); load
time, the verify forward (8 tokens: the anchor and 7 drafts) and the draft block per cycle,
the target alone per token (the greedy baseline: prefill of 64 tokens, then 15 single-token
forwards) and the memory estimate from the smoke's own JSON report. All-zero weights make
every draft accepted: each cycle verifies a full block. A run that the memory estimate
refuses (exit 78) is recorded as refused, with the estimate and the budget it was refused
against.

Writes bench/runtime_results.json and the generated part of bench/RESULTS.md (between the
``bench-runtime`` markers); ``render`` rewrites that part from runtime_results.json alone.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

from run import machine  # noqa: E402  (bench/run.py: the same machine description)
from sparse_models import GEOMETRIES, allocated_bytes, make_sparse_pair  # noqa: E402

from results_md import write_section  # noqa: E402 (bench/ on sys.path)

PY = sys.executable
BEGIN, END = "<!-- BEGIN GENERATED bench-runtime -->", "<!-- END GENERATED bench-runtime -->"
PROMPT = list(range(1, 65))
MAX_NEW_TOKENS = 16
RESULTS_JSON = BENCH / "runtime_results.json"


def dspark(*args: str) -> list[str]:
    return [PY, "-m", "dspark_convert.cli.main", *args]


def build(workdir: Path, names: list[str]) -> None:
    for name in names:
        root = workdir / name
        target, drafter = make_sparse_pair(GEOMETRIES[name], root)
        artifact = root / "artifact"
        stamp = root / ".converted"
        if not stamp.is_file():
            subprocess.run(dspark("convert", str(drafter), "-o", str(artifact), "--force",
                                  "--quiet"), check=True)
            stamp.write_text("ok\n")
        for path in (target / "model.safetensors", drafter / "model.safetensors",
                     artifact / "drafter.gguf"):
            print(f"{path}: {path.stat().st_size / 1e9:.2f} GB, "
                  f"{allocated_bytes(path) / 1e9:.3f} GB on disk")


def run_one(root: Path, dtype: str) -> dict:
    """One smoke in a child whose peak RSS the kernel reports (os.wait4)."""
    cmd = dspark("smoke", str(root / "artifact"), "--target", str(root / "target"),
                 "--device", "cpu", "--dtype", dtype, "--verify", "batched",
                 "--prompt-ids", ",".join(map(str, PROMPT)),
                 "--max-new-tokens", str(MAX_NEW_TOKENS), "--json")
    out_path = root / f".smoke-{dtype}.json"
    start = time.perf_counter()
    with open(out_path, "wb") as out:
        # stdout to a file, stderr to a pipe read to its end: no pipe can fill and block.
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, cwd=ROOT)
        stderr = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    report = json.loads(out_path.read_text() or "null")
    return {"dtype": dtype, "exit_code": code, "wall_s": round(wall, 2),
            "peak_rss_bytes": usage.ru_maxrss * 1024, "report": report,
            "stderr": stderr.decode()[-2000:]}


def gb(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e9:.2f} GB"


def render(results: list[dict], meta: dict) -> str:
    m = meta["machine"]
    lines = [
        f"Run: {meta['started']} to {meta['finished']} (UTC), `python bench/runtime.py run`, "
        "one process per geometry and dtype.",
        "",
        f"- Machine: {m['cpu']}, {m['cores']} cores, {m['ram']} RAM, kernel {m['kernel']}",
        f"- Python {m['python']}; " + ", ".join(f"{k} {v}" for k, v in m["versions"].items())
        + f"; commit {m['commit']}" + (" plus uncommitted changes" if m["dirty"] else ""),
        f"- torch threads: {meta['threads']}; MemAvailable before the runs: "
        f"{gb(meta['mem_available_before'])}",
        # Runs recorded before --verify existed (batched was the only mode) have no command.
        f"- Each run: `{meta.get('command', 'dspark smoke --device cpu --dtype D')} "
        f"--prompt-ids 1..{len(PROMPT)} --max-new-tokens {MAX_NEW_TOKENS} --json` on all-zero "
        "sparse checkpoints",
        "",
        "| geometry | dtype | exit | load | verify forward (8 tokens) | draft block | "
        "target alone, per new token | peak RSS | estimate | wall |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        rep = r["report"] or {}
        if r["exit_code"] == 0:
            alone = rep.get("target_only_tokens_per_second")
            lines.append(
                f"| {r['geometry']} | {r['dtype']} | 0 | {rep['load_seconds']:.1f} s | "
                f"{rep['verify_seconds_per_cycle']:.2f} s | {rep['draft_seconds_per_cycle']:.2f} s | "
                f"{1 / alone:.2f} s | {gb(r['peak_rss_bytes'])} | "
                f"{gb(rep['memory']['estimate_bytes'])} | {r['wall_s']:.0f} s |")
        else:
            lines.append(
                f"| {r['geometry']} | {r['dtype']} | {r['exit_code']} | refused | - | - | - | "
                f"{gb(r['peak_rss_bytes'])} | {gb(rep.get('found'))} | {r['wall_s']:.0f} s |")
    lines += ["", "Target alone: the greedy baseline (prefill of the prompt, then one token per "
              "forward), wall time per new token.", ""]
    for r in results:
        if r["exit_code"] != 0:
            message = (r["report"] or {}).get("message") or r["stderr"].strip()[-300:]
            lines.append(f"- {r['geometry']} {r['dtype']} refused (exit {r['exit_code']}): "
                         f"`error: {message}`")
    lines += ["", "Sizes (in the compute dtype; from the smoke's memory report):", ""]
    for r in results:
        rep = r["report"] or {}
        mem = rep.get("memory")
        if mem:
            lines.append(f"- {r['geometry']} {r['dtype']}: target weights "
                         f"{gb(mem['target_weights_bytes'])}, drafter {gb(mem['drafter_weights_bytes'])}, "
                         f"activations {gb(mem['activations_bytes'])} ({mem['context_tokens']} positions), "
                         f"runtime {gb(mem['runtime_bytes'])}; budget {gb(mem['budget_bytes'])} "
                         f"({mem['budget_source']})")
    return "\n".join(lines)


def write_results(text: str) -> None:
    write_section(text, begin=BEGIN, end=END, heading="Runtime: `dspark smoke` at the released geometry")


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def run(workdir: Path, names: list[str], dtypes: list[str]) -> None:
    import torch

    meta = {"started": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M"),
            "machine": machine(workdir), "threads": torch.get_num_threads(),
            "mem_available_before": mem_available(),
            "command": "dspark smoke --device cpu --dtype D --verify batched"}
    results = []
    for name in names:
        root = workdir / name
        if not (root / ".converted").is_file():
            raise SystemExit(f"{root}: not built; run `python bench/runtime.py build` first")
        for dtype in dtypes:
            result = run_one(root, dtype)
            result["geometry"] = GEOMETRIES[name].name
            print(json.dumps({k: v for k, v in result.items() if k != "report"}), flush=True)
            results.append(result)
    meta["finished"] = dt.datetime.now(dt.timezone.utc).strftime("%H:%M")
    RESULTS_JSON.write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    write_results(render(results, meta))


def rerender() -> None:
    """The RESULTS.md section again from runtime_results.json (no run)."""
    data = json.loads(RESULTS_JSON.read_text())
    write_results(render(data["results"], data["meta"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["build", "run", "render"])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/dspark-runtime-bench"))
    parser.add_argument("--geometries", default="4b,8b")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    args = parser.parse_args(argv)
    names = args.geometries.split(",")
    for name in names:
        if name not in GEOMETRIES:
            raise SystemExit(f"--geometries: expected some of {', '.join(GEOMETRIES)}, found {name!r}")
    if args.step == "build":
        build(args.workdir, names)
    elif args.step == "render":
        rerender()
    else:
        run(args.workdir, names, args.dtypes.split(","))
    return 0


if __name__ == "__main__":
    sys.exit(main())
