"""What quantization costs the golden drafters: `dspark smoke --compare` of each Q8_0 / Q5_0 /
Q4_0 artifact against its BF16 parent, on the same prompts and settings.

For each golden drafter (golden/reference/: DeepSpec's DSpark drafter `vanilla_conf_markov`
and its plain DFlash drafter `dflash_shared`, both trained for the golden target) it runs
the CLI, exactly as a user would:

    dspark convert golden/reference/<drafter>/draft -o WORK/<drafter>/bf16
    dspark quantize WORK/<drafter>/bf16 -o WORK/<drafter>/<type> --type <type>
    dspark smoke WORK/<drafter>/<type> --target golden/reference/target \\
        --compare WORK/<drafter>/bf16 --prompt-ids ... --max-new-tokens 48 --json \\
        [--temperature 1 --seed S]

with the 14 token-id prompts of dspark_convert/evaluation/data/golden_prompts.jsonl (its two
text prompts need `--prompt`, one per run), at temperature 0 (both lossless: the tau
difference is the price of the precision) and at temperature 1 with seeds 1, 2, 3 (lossless
rejection sampling; the same seed draws the same random stream for both artifacts). Prints a
markdown report and, unless --no-write, replaces the generated part of docs/QUANTIZATION.md.

    python bench/quantization.py [--workdir /tmp/dspark-quantization] [--no-write]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
DSPARK = str(Path(sys.executable).parent / "dspark")
TARGET = ROOT / "golden" / "reference" / "target"
DRAFTERS = ("vanilla_conf_markov", "dflash_shared")
TYPES = ("q8_0", "q5_0", "q4_0")
SEEDS = (1, 2, 3)
NEW_TOKENS = 48
PROMPTS = ROOT / "dspark_convert" / "evaluation" / "data" / "golden_prompts.jsonl"
DOC = ROOT / "docs" / "QUANTIZATION.md"
BEGIN, END = "<!-- BEGIN GENERATED quantization -->", "<!-- END GENERATED quantization -->"


def prompt_args() -> list[str]:
    args = []
    for line in PROMPTS.read_text().splitlines():
        item = json.loads(line)
        if "prompt_ids" in item:
            args += ["--prompt-ids", ",".join(str(t) for t in item["prompt_ids"])]
    return args


def dspark(*args: str) -> str:
    # One torch thread: the golden models are tiny, and two contended threads are slower.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([DSPARK, *args], capture_output=True, text=True, env=env)
    if proc.returncode:
        raise SystemExit(f"dspark {' '.join(args)}: exit {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def measure(workdir: Path) -> list[dict]:
    rows = []
    prompts = prompt_args()
    for drafter in DRAFTERS:
        root = workdir / drafter
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        parent = root / "bf16"
        dspark("convert", str(ROOT / "golden" / "reference" / drafter / "draft"), "-o",
               str(parent), "--quiet")
        for qtype in TYPES:
            out = root / qtype
            made = json.loads(dspark("quantize", str(parent), "-o", str(out), "--type", qtype,
                                     "--quiet", "--json"))
            rel = [e["rel_rms"] for e in made["errors"].values()]
            runs = []
            for temperature, seed in [(0, 0)] + [(1, s) for s in SEEDS]:
                extra = [] if temperature == 0 else ["--temperature", "1", "--seed", str(seed)]
                data = json.loads(dspark("smoke", str(out), "--target", str(TARGET), "--compare",
                                         str(parent), *prompts, "--max-new-tokens",
                                         str(NEW_TOKENS), "--json", *extra))
                runs.append({"temperature": temperature, "seed": seed, "tau": data["tau"],
                             "parent_tau": data["compare"]["parent"]["tau"],
                             "tau_difference": data["compare"]["tau_difference"],
                             "acceptance": data["acceptance_by_position"],
                             "parent_acceptance": data["compare"]["parent"]["acceptance_by_position"],
                             "lossless": data["lossless"],
                             "parent_lossless": data["compare"]["parent"]["lossless"],
                             "same_outputs": data["compare"]["same_outputs"]})
            rows.append({"drafter": drafter, "type": qtype.upper(),
                         "gguf_bytes": made["drafter_gguf"]["size"],
                         "parent_bytes": (parent / "drafter.gguf").stat().st_size,
                         "rel_rms": (min(rel), max(rel)), "runs": runs})
    return rows


def _rates(rates: list[float | None]) -> str:
    return " ".join("-" if r is None else f"{r:.2f}" for r in rates)


def render(rows: list[dict], started: str) -> str:
    lines = [f"Measured {started} UTC by `python bench/quantization.py` (CPU, float32 compute, "
             f"batched verify; {len(prompt_args()) // 2} prompts, {NEW_TOKENS} new tokens).", "",
             "| drafter | type | drafter.gguf | rel. RMS error per matrix | tau BF16 → type, "
             "temperature 0 | difference | tau BF16 → type, temperature 1 (seeds 1, 2, 3) "
             "| mean difference |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        greedy = row["runs"][0]
        sampled = row["runs"][1:]
        pair = "; ".join(f"{r['parent_tau']:.3f} → {r['tau']:.3f}" for r in sampled)
        mean = sum(r["tau_difference"] for r in sampled) / len(sampled)
        low, high = row["rel_rms"]
        lines.append(f"| {row['drafter']} | {row['type']} | {row['gguf_bytes']:,} B "
                     f"({row['gguf_bytes'] / row['parent_bytes']:.0%} of BF16) | "
                     f"{low:.2%} - {high:.2%} | {greedy['parent_tau']:.3f} → {greedy['tau']:.3f} | "
                     f"{greedy['tau_difference']:+.3f} | {pair} | {mean:+.3f} |")
    lines += ["", "Acceptance by draft position at temperature 0 (BF16, then the type):", ""]
    for row in rows:
        greedy = row["runs"][0]
        lines.append(f"- {row['drafter']} {row['type']}: BF16 {_rates(greedy['parent_acceptance'])}"
                     f"; {row['type']} {_rates(greedy['acceptance'])}")
    lossless = all(r["lossless"] and r["parent_lossless"] for row in rows for r in row["runs"][:1])
    same = all(row["runs"][0]["same_outputs"] for row in rows)
    lines += ["", f"Temperature 0: every run lossless (both artifacts: {lossless}); the same output "
              f"ids for both (the target's greedy output): {same}.", ""]
    return "\n".join(lines)


def write_doc(text: str) -> None:
    old = DOC.read_text()
    new = old[:old.index(BEGIN)] + f"{BEGIN}\n{text}\n{END}" + old[old.index(END) + len(END):]
    DOC.write_text(new)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/dspark-quantization"))
    parser.add_argument("--no-write", action="store_true", help="print, do not write the doc")
    args = parser.parse_args(argv)
    started = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M")
    rows = measure(args.workdir)
    text = render(rows, started)
    print(text)
    (args.workdir / "results.json").write_text(json.dumps(rows, indent=1) + "\n")
    if not args.no_write:
        write_doc(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
