"""Verify-length policies under concurrent load: measured on the golden models, predicted for
the released 4B geometry and for a GPU-shaped cost table.

    python bench/serving.py [--workdir DIR] [--reuse-4b]   # all three parts, then RESULTS.md
    python bench/serving.py render                 # RESULTS.md's part from serving_results.json

(`make bench-serving`; DIR defaults to /tmp/dspark-serving-bench.) Each step is the tool's
own command in its own process:

1. **Measured, golden models, CPU.** Per concurrency R (1, 4, 16, 64): `dspark profile
   --requests R` of the golden Qwen3 target (every B a step of R requests can send: on this
   CPU a step's cost grows with its requests, not only its tokens, docs/SCHEDULING.md), then
   `dspark serve-bench` at R with that table: DeepSeek's DSpark drafter for the target
   (paired: converted with --target) under full, threshold=0.6, dspark and dspark-async,
   its DFlash drafter under full, and the target alone; greedy, 64 prompts of token ids
   (write_prompts) x 64 new tokens. serve-bench checks every output against the target
   alone (report.json's `lossless`).
2. **Simulated against the measurement.** `dspark simulate` replays each run's decisions on
   the same table (replay mode: the recorded batches), and the predicted verify-time
   throughput (Σ 1/SPS(B)) is set beside the one serve-bench measured (its output tokens
   over its time in verify forwards); `dspark simulate --check POLICY` on each file.
3. **Predicted at 4B and on a GPU's shape.** `dspark profile` of an all-zero sparse Qwen3-4B
   target (bench/sparse_models.py; bfloat16, the B a 64-request sweep of block 7 reaches),
   and a GPU-shaped table (GPU_SHAPE below: NOT a measurement, a cost model of the shape
   engines report: flat up to its graph size, then rising linearly in tokens). The golden
   DSpark drafter's `full` decisions at concurrency 1 (every block verified whole, so each
   acceptance is exact where the target rejected a token) are swept (`dspark simulate
   --concurrency`) under each policy against both tables. This mixes the golden drafter's
   acceptance with the 4B target's costs: all-zero weights accept every draft, so the
   released drafter's own acceptance cannot be measured here; the frontier's shape is what
   the sweep shows, not the released drafter's figures.

Writes bench/serving_results.json and the generated part of bench/RESULTS.md (between the
``bench-serving`` markers). Part 3 needs about 9 GB of RAM (the 4B target in bfloat16).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

from results_md import write_section  # noqa: E402 (bench/ on sys.path)

PY = sys.executable
BEGIN, END = "<!-- BEGIN GENERATED bench-serving -->", "<!-- END GENERATED bench-serving -->"
RESULTS_JSON = BENCH / "serving_results.json"
GOLDEN_TARGET = ROOT / "golden" / "reference" / "target"
DRAFTERS = {"dspark": ROOT / "golden" / "reference" / "vanilla_conf_markov" / "draft",
            "dflash": ROOT / "golden" / "reference" / "dflash_shared" / "draft"}
CONCURRENCY = (1, 4, 16, 64)
POLICIES = ("full", "threshold=0.6", "dspark", "dspark-async")
NEW_TOKENS = 64
BLOCK = 7                          # the golden drafters' block size
MAX_B = CONCURRENCY[-1] * (1 + BLOCK)
# The GPU-shaped table: a verify step costs FIXED_MS plus PER_TOKEN_MS per token of the graph
# size B is padded to (vLLM's default capture sizes: 1, 2, 4, then every 8 up to 512). The
# figures are a stated assumption of a 4B target in bfloat16 on one large GPU (weights read
# once per step ~ a few ms; ~0.02 ms per token of compute), not a measurement.
FIXED_MS, PER_TOKEN_MS = 5.0, 0.02
GRAPH_SIZES = (1, 2, 4, *range(8, MAX_B + 1, 8))
# The 4B target on this CPU costs ~0.38 s a token in bfloat16 (a forward of B tokens ~ B x
# that: compute-bound, measured), so its profile stops at 256 tokens (~7 minutes) and its
# sweep at the concurrencies that fit (32 x (1 + 7) = 256).
FOURB_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
FOURB_CONCURRENCY = (1, 4, 16, 32)


def dspark(*args: str) -> list[str]:
    return [PY, "-m", "dspark_convert.cli.main", *args]


def call(*args: str) -> dict:
    """Run a dspark command with --json; its report (exit 0 required)."""
    done = subprocess.run(dspark(*args, "--json"), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"dspark {args[0]} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout)


def write_prompts(path: Path, vocab: int = 500, n: int = CONCURRENCY[-1]) -> None:
    rng = random.Random(2026)
    with path.open("w") as fh:
        for i in range(n):
            ids = [rng.randrange(vocab) for _ in range(rng.randrange(8, 33))]
            fh.write(json.dumps({"id": f"bench-{i}", "prompt_ids": ids}) + "\n")


def gpu_shaped_table(path: Path) -> None:
    tokens = list(range(1, MAX_B + 1))
    pad = [next(g for g in GRAPH_SIZES if g >= b) for b in tokens]
    rates = [1000.0 / (FIXED_MS + PER_TOKEN_MS * p) for p in pad]
    path.write_text(json.dumps({
        "tokens": tokens, "steps_per_second": rates,
        "device": f"a GPU-shaped cost model (not measured): {FIXED_MS} ms + {PER_TOKEN_MS} ms "
                  f"per token of the graph size, vLLM's default capture sizes",
        "dtype": "bfloat16", "threads": 1, "versions": {}}, indent=1) + "\n")


def concurrency_tokens(r: int) -> list[int]:
    """The B a step of r requests can send (r .. r(1 + BLOCK)); every one up to 128 entries."""
    top = r * (1 + BLOCK)
    return sorted(set(range(r, top + 1, max(1, r // 8))) | {top})


def slim(run: dict) -> dict:
    """A run as the results file keeps it: the requests' output ids give way to one SHA-256
    of their SHA-256s in request order (equal across runs: the same outputs; report.json in
    the workdir keeps the ids)."""
    import hashlib

    out = {k: v for k, v in run.items() if k != "requests"}
    if "requests" in run:
        joined = "".join(r["sha256"] for r in run["requests"])
        out["outputs_sha256"] = hashlib.sha256(joined.encode()).hexdigest()
    return out


def measured(work: Path) -> dict:
    """Part 1: per concurrency R, a cost table of R requests (`dspark profile --requests R`:
    on this CPU a step's cost grows with its requests, docs/SCHEDULING.md), then serve-bench
    at R with it."""
    artifacts = {}
    for name, src in DRAFTERS.items():
        artifacts[name] = work / "artifacts" / name
        subprocess.run(dspark("convert", str(src), "-o", str(artifacts[name]), "--target",
                              str(GOLDEN_TARGET), "--force"), check=True, capture_output=True)
    prompts = work / "prompts.jsonl"
    write_prompts(prompts)
    tables, runs = {}, []
    for r in CONCURRENCY:
        table = work / f"cpu_golden.c{r}.json"
        call("profile", "--target", str(GOLDEN_TARGET), "--requests", str(r), "--tokens",
             ",".join(map(str, concurrency_tokens(r))), "--repeats", "3", "-o", str(table),
             "--force")
        tables[r] = str(table)
        for name, policies in (("dspark", POLICIES), ("dflash", ("full",))):
            out = work / f"serve-{name}-c{r}"
            args = [str(artifacts[name]), "--target", str(GOLDEN_TARGET), "--prompts",
                    str(prompts), "--concurrency", str(r), "--cost-table", str(table),
                    "--max-new-tokens", str(NEW_TOKENS), "--device", "cpu", "-o", str(out),
                    "--force"]
            for p in policies:
                args += ["--policy", p]
            call("serve-bench", *args)
            report = json.loads((out / "report.json").read_text())
            for run in report["runs"]:
                if run["artifact"] is None and name != "dspark":
                    continue              # the target alone once per concurrency
                run["directory"], run["table"] = str(out), str(table)
                runs.append(slim(run))
    return {"tables": tables, "runs": runs}


def simulated_against_measurement(part1: dict) -> list[dict]:
    """Part 2: replay each recorded run on its own CPU table; predicted vs measured."""
    rows = []
    for run in part1["runs"]:
        if run["artifact"] is None or run["decisions"] is None:
            continue
        decisions = Path(run["directory"]) / run["decisions"]
        sim = call("simulate", str(decisions), "--cost-table", run["table"])
        check = subprocess.run(dspark("simulate", str(decisions), "--cost-table", run["table"],
                                      "--check", run["policy"]), capture_output=True, text=True)
        fig = sim["figures"][0]
        rows.append({"artifact": run["artifact"], "policy": run["policy"],
                     "concurrency": run["concurrency"],
                     "measured_verify_seconds": run["verify_seconds"],
                     "predicted_verify_seconds": fig["verify_seconds"],
                     "measured_tokens_per_verify_second": run["new_tokens"] / run["verify_seconds"],
                     "predicted_tokens_per_verify_second": fig["tokens_per_second"],
                     "verify_tokens": run["verify_tokens"],
                     "simulated_verify_tokens": fig["verify_tokens"],
                     "check_exit_code": check.returncode})
    return rows


def predicted(work: Path, part1: dict, reuse: bool = False) -> dict:
    """Part 3: the 4B CPU table and the GPU-shaped one, swept on the golden decisions."""
    from sparse_models import GEOMETRIES, make_sparse_pair

    cpu4b = work / "cpu_4b.json"
    if reuse and cpu4b.is_file():       # ~20 min on 2 cores: measured once, kept
        profile = {"table": json.loads(cpu4b.read_text()), "reused": True}
    else:
        target, _ = make_sparse_pair(GEOMETRIES["4b"], work / "4b")
        profile = call("profile", "--target", str(target), "--dtype", "bfloat16", "--tokens",
                       ",".join(map(str, FOURB_TOKENS)), "--repeats", "1", "-o", str(cpu4b),
                       "--force")
    gpu = work / "gpu_shaped.json"
    gpu_shaped_table(gpu)
    full1 = next(r for r in part1["runs"] if r["artifact"] == "dspark" and r["policy"] == "full"
                 and r["concurrency"] == 1)
    decisions = Path(full1["directory"]) / full1["decisions"]
    sweeps = {}
    for name, table, levels in (("cpu_4b", cpu4b, FOURB_CONCURRENCY),
                                ("gpu_shaped", gpu, CONCURRENCY)):
        args = [str(decisions), "--cost-table", str(table), "--concurrency",
                ",".join(map(str, levels))]
        for p in ("target-only", *POLICIES):
            args += ["--policy", p]
        sweeps[name] = call("simulate", *args)["figures"]
    return {"profile_4b": profile, "sweeps": sweeps}


def render(data: dict) -> str:
    meta, part1, part2, part3 = data["meta"], data["measured"], data["replayed"], data["predicted"]
    m = meta["machine"]
    where = (f"{m['cpu']}, {m['cores']} cores, {m['ram']}, torch {m['versions']['torch']}, "
             f"commit {m['commit']}" if isinstance(m, dict) else str(m))
    lines = [f"Run {meta['started']} UTC on {where}; {meta['threads']} torch threads; "
             f"`python bench/serving.py`. 64 prompts x {NEW_TOKENS} new tokens, greedy, CPU, float32 "
             f"(golden) / bfloat16 (4B profile).", "",
             "Measured (`dspark serve-bench`, golden Qwen3 target, DeepSeek's drafters for it):", "",
             "| drafter | policy | R | tok/s | per request tok/s | accepted/step | verify tokens | wasted | lossless |",
             "|---|---|---|---|---|---|---|---|---|"]
    for run in part1["runs"]:
        who = "target alone" if run["artifact"] is None else run["artifact"]
        lines.append(f"| {who} | {run['policy']} | {run['concurrency']} | "
                     f"{run['tokens_per_second']:.0f} | {run['per_request_tokens_per_second'] or 0:.1f} | "
                     f"{run['accepted_per_step'] or 1:.2f} | {run['verify_tokens']} | "
                     f"{run['draft_tokens_wasted']} | {run['lossless']} |")
    lines += ["", "Replayed (`dspark simulate`, the same decisions on the same CPU table) against "
              "measured, output tokens per verify-second:", "",
              "| drafter | policy | R | measured | predicted | predicted / measured | --check |",
              "|---|---|---|---|---|---|---|"]
    for row in part2:
        m, p = row["measured_tokens_per_verify_second"], row["predicted_tokens_per_verify_second"]
        lines.append(f"| {row['artifact']} | {row['policy']} | {row['concurrency']} | {m:.0f} | "
                     f"{p:.0f} | {p / m:.2f} | exit {row['check_exit_code']} |")
    lines += ["", "Predicted (`dspark simulate --concurrency`, the golden DSpark drafter's full "
              "decisions at R=1), output tokens per verify-second, per table:", ""]
    for name, figures in part3["sweeps"].items():
        levels = sorted({f["concurrency"] for f in figures})
        lines += [f"{name} (output tokens per verify-second / per request):", "",
                  "| policy | " + " | ".join(f"R={r}" for r in levels) + " |",
                  "|---|" + "---|" * len(levels)]
        by = {}
        for f in figures:
            by.setdefault(f["policy"], {})[f["concurrency"]] = f
        for policy, row in by.items():
            lines.append(f"| {policy} | " + " | ".join(
                f"{row[r]['tokens_per_second']:.1f} / {row[r]['per_request_tokens_per_second'] or 0:.2f}"
                for r in levels) + " |")
        lines.append("")
    rates = part3["profile_4b"]
    table = rates.get("table", rates)
    lines.append("4B CPU table (bfloat16, `dspark profile`): " + ", ".join(
        f"SPS({b}) = {r:.3f}" for b, r in zip(table["tokens"], table["steps_per_second"])))
    return "\n".join(lines)


def write_results(text: str) -> None:
    write_section(text, begin=BEGIN, end=END, heading="Serving: policies under concurrent load")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("action", nargs="?", default="run", choices=("run", "render"))
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/dspark-serving-bench"))
    parser.add_argument("--reuse-4b", action="store_true",
                        help="keep WORKDIR/cpu_4b.json from an earlier run (part 3's profile)")
    args = parser.parse_args()
    if args.action == "render":
        write_results(render(json.loads(RESULTS_JSON.read_text())))
        return
    import torch
    from runtime import machine

    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    meta = {"started": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M"),
            "machine": machine(work), "threads": torch.get_num_threads()}
    part1 = measured(work)
    data = {"meta": meta, "measured": part1, "replayed": simulated_against_measurement(part1),
            "predicted": predicted(work, part1, reuse=args.reuse_4b)}
    RESULTS_JSON.write_text(json.dumps(data, indent=1) + "\n")
    write_results(render(data))


if __name__ == "__main__":
    main()
