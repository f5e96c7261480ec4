"""Benchmark `dspark conform`: traces of 10,000 drafts, on the CPU.

    python bench/conform.py build [--workdir DIR]     # the artifacts, targets and traces
    flock LOCK python bench/conform.py run [--workdir DIR]
    python bench/conform.py render                    # RESULTS.md's part from the JSON

(DIR defaults to /tmp/dspark-conform-bench.) Three cases, each a trace of exactly 10,000
drafts (lines):

- ``qwen3-golden``: DeepSeek's DSpark drafter on its tiny Qwen3 target
  (golden/reference/), the trace the reference runtime's own greedy runs (the speculative
  loop of `dspark smoke`, no stop token) on seeded random prompts of 16 ids, 480 new tokens
  each, until 10,000 drafts: drafts that conform.
- ``gemma4-golden``: the same with DeepSeek's Gemma4 DSpark drafter and its tiny
  gemma4_unified target (golden/reference/gemma4/).
- ``qwen3-small``: a random-weight Qwen3 target of 59 M parameters (H 512, 8 layers, 8/4
  heads of 64, FFN 1536, vocabulary 32,768, its own head) and a DSpark drafter of
  DeepSeek's released config at that size (2 draft layers, vanilla Markov head r 64,
  confidence head; bench/sparse_models.py ``make_random_pair``). The trace is made, not
  run: 20 requests of a 200-id prompt, 500 drafts each, each cycle committing 1..7 tokens
  (seeded: 4 on average, a tau of 4), the requests interleaved line by line as a batching
  engine logs them; every draft is 7 seeded random ids, so every line differs (exit 97):
  the check does the same work for a draft that differs as for one that is equal (one
  proposal a line; the margin of the first difference only).

Each case: ``dspark conform ART --target T --trace TRACE --device cpu --json`` in a child,
with torch's default threads (one a core) and, for the golden models, one thread
(``OMP_NUM_THREADS=1``); wall time and peak RSS from the kernel (``os.wait4``), the check's
own time, the tokens the target ran and the context tokens a prefill per line would have
run, from its JSON report. Then, in this process with the default threads, the same check
on a seeded sample of lines (100; 20 for qwen3-small) with a fresh reference each (one
prefill of the whole context a line: what the check costs without the shared prefixes),
extrapolated to the 10,000.

Writes bench/conform_results.json and the generated part of bench/RESULTS.md (between the
``bench-conform`` markers).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

from run import machine  # noqa: E402  (bench/run.py: the same machine description)
from sparse_models import Geometry, make_random_pair  # noqa: E402

PY = sys.executable
BEGIN, END = "<!-- BEGIN GENERATED bench-conform -->", "<!-- END GENERATED bench-conform -->"
RESULTS_JSON = BENCH / "conform_results.json"
DRAFTS = 10_000
GOLDEN = ROOT / "golden" / "reference"
CASES = {
    "qwen3-golden": (GOLDEN / "vanilla_conf_markov" / "draft", GOLDEN / "target"),
    "gemma4-golden": (GOLDEN / "gemma4" / "gemma4_vanilla_conf_markov" / "draft",
                      GOLDEN / "gemma4" / "target"),
    "qwen3-small": None,
}
MID = Geometry("qwen3-small", hidden_size=512, intermediate_size=1536, target_layers=8,
               heads=8, kv_heads=4, head_dim=64, vocab_size=32768, tied_head=False,
               taps=(1, 3, 5, 6), draft_layers=2, markov_rank=64,
               max_position_embeddings=4096, mask_token_id=32000)
# torch's thread counts each case's check runs with (None: torch's default, one a core):
# the golden models' matrices are so small that a second thread only adds contention.
THREADS = {"qwen3-golden": (None, 1), "gemma4-golden": (None, 1), "qwen3-small": (None,)}
NAIVE_SAMPLE = {"qwen3-golden": 100, "gemma4-golden": 100, "qwen3-small": 20}


def dspark(*args: str) -> list[str]:
    return [PY, "-m", "dspark_convert.cli.main", *args]


def write_trace(path: Path, lines: list[dict]) -> None:
    path.write_text("".join(json.dumps(x, separators=(",", ":")) + "\n" for x in lines))


def runtime_trace(artifact: Path, target: Path) -> list[dict]:
    """The reference runtime's own greedy runs, cycle by cycle, as trace lines."""
    import torch

    from dspark_convert.commands.binding import bind, open_run_target
    from dspark_convert.runtime.speculative import speculative_generate
    from dspark_convert.runtime.weights import load_drafter_weights

    torch.set_num_threads(1)          # tiny matrices: one thread is the fastest
    b = bind(artifact, open_run_target(target))
    cpu = torch.device("cpu")
    model = b.runtime.Target(b.target_plan.directory, device=cpu, plan=b.target_plan)
    drafter = b.runtime.Drafter(load_drafter_weights(artifact, plan=b.drafter_plan),
                                embed=model.embed, lm_head=model.lm_head, device=cpu)
    rng = random.Random(27)
    lines: list[dict] = []
    while len(lines) < DRAFTS:
        # Ids 5..399: none of the special ids of either golden tokenizer, nor a mask token.
        prompt = [1] + [rng.randrange(5, 400) for _ in range(15)]
        run = speculative_generate(model, drafter, prompt, max_new_tokens=480)
        n, key = len(prompt) + 1, f"prompt-{len(lines)}"
        for c, cycle in enumerate(run.cycles):
            lines.append({"id": key, "context": list(run.output_ids[:n]),
                          "draft": list(cycle.proposed)})
            n += run.acceptance_lengths[c]
    return lines[:DRAFTS]


def made_trace() -> list[dict]:
    """20 requests x 500 drafts, interleaved (see the module docstring)."""
    rng = random.Random(27)
    V = MID.vocab_size
    contexts = [[rng.randrange(3, V) for _ in range(200)] for _ in range(20)]
    lines = []
    for _ in range(DRAFTS // len(contexts)):
        for r, ctx in enumerate(contexts):
            lines.append({"id": f"req-{r}", "context": list(ctx),
                          "draft": [rng.randrange(3, V) for _ in range(7)]})
            ctx.extend(rng.randrange(3, V) for _ in range(rng.randint(1, 7)))
    return lines


def build(workdir: Path) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    for name, pair in CASES.items():
        root = workdir / name
        if (root / ".built").is_file():
            continue
        root.mkdir(exist_ok=True)
        if pair is None:
            target, drafter = make_random_pair(MID, root / "models", seed=27)
        else:
            drafter, target = pair
        subprocess.run(dspark("convert", str(drafter), "--target", str(target), "-o",
                              str(root / "artifact"), "--force", "--quiet"), check=True, cwd=ROOT)
        lines = made_trace() if pair is None else runtime_trace(root / "artifact", target)
        assert len(lines) == DRAFTS
        write_trace(root / "trace.jsonl", lines)
        (root / "target").unlink(missing_ok=True)
        (root / "target").symlink_to(target.resolve())
        (root / ".built").write_text("ok\n")
        print(f"{name}: {DRAFTS} drafts, trace {(root / 'trace.jsonl').stat().st_size / 1e6:.1f} MB")


def run_cli(root: Path, threads: int | None) -> dict:
    cmd = dspark("conform", str(root / "artifact"), "--target", str(root / "target"),
                 "--trace", str(root / "trace.jsonl"), "--device", "cpu", "--json")
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)       # what torch sizes its pool by
    out_path = root / ".conform.json"
    start = time.perf_counter()
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, cwd=ROOT, env=env)
        stderr = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    report = json.loads(out_path.read_text())
    return {"threads": threads or os.cpu_count(), "exit_code": os.waitstatus_to_exitcode(status),
            "wall_s": round(wall, 2), "peak_rss_bytes": usage.ru_maxrss * 1024,
            "report": report, "stderr": stderr.decode()[-1000:]}


def naive(root: Path, sample_size: int) -> dict:
    """The check of ``sample_size`` seeded lines, each from a fresh reference (its own
    prefill of the whole context), with torch's default threads."""
    import torch

    from dspark_convert.commands.binding import bind, open_run_target
    from dspark_convert.evaluation.conform import read_trace
    from dspark_convert.evaluation.proposals import ReferenceProposer, check_lines
    from dspark_convert.runtime.weights import load_drafter_weights

    torch.set_num_threads(os.cpu_count() or 1)       # as the CLI runs by default
    artifact = root / "artifact"
    b = bind(artifact, open_run_target(root / "target"))
    cpu = torch.device("cpu")
    model = b.runtime.Target(b.target_plan.directory, device=cpu, plan=b.target_plan)
    drafter = b.runtime.Drafter(load_drafter_weights(artifact, plan=b.drafter_plan),
                                embed=model.embed, lm_head=model.lm_head, device=cpu)
    lines = read_trace(root / "trace.jsonl").lines
    sample = random.Random(5).sample(list(lines), sample_size)
    start = time.perf_counter()
    tokens = 0
    for x in sample:
        proposer = ReferenceProposer(model, drafter)
        check_lines([x], proposer)
        tokens += proposer.target_tokens
    seconds = time.perf_counter() - start
    return {"lines": sample_size, "seconds": round(seconds, 3), "target_tokens": tokens,
            "threads": torch.get_num_threads()}


def run(workdir: Path) -> None:
    started = dt.datetime.now(dt.timezone.utc)
    load_before = os.getloadavg()
    results = []
    for name in CASES:
        root = workdir / name
        for threads in THREADS[name]:
            r = run_cli(root, threads)
            r["case"] = name
            rep = r["report"]
            print(f"{name} ({r['threads']} threads): exit {r['exit_code']}, wall {r['wall_s']} s, "
                  f"check {rep['check_seconds']:.1f} s")
            results.append(r)
        results[-1]["naive"] = naive(root, NAIVE_SAMPLE[name])
        print(f"{name}: one prefill a line, {results[-1]['naive']['seconds']} s for "
              f"{NAIVE_SAMPLE[name]} lines")
    meta = {"started": started.strftime("%Y-%m-%d %H:%M"),
            "finished": dt.datetime.now(dt.timezone.utc).strftime("%H:%M"),
            "machine": machine(workdir), "load_before": load_before,
            "load_after": os.getloadavg()}
    RESULTS_JSON.write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    write_results()


def gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def render(doc: dict) -> str:
    meta, m = doc["meta"], doc["meta"]["machine"]
    lines = [
        f"Run: {meta['started']} to {meta['finished']} (UTC), `python bench/conform.py run`, one "
        "`dspark conform ... --device cpu --json` process per case and thread count.",
        "",
        f"- Machine: {m['cpu']}, {m['cores']} cores, {m['ram']} RAM, kernel {m['kernel']}",
        f"- Python {m['python']}; " + ", ".join(f"{k} {v}" for k, v in m["versions"].items())
        + f"; commit {m['commit']}" + (" plus uncommitted changes" if m["dirty"] else ""),
        "- Load average (1/5/15 min): before " + " ".join(f"{x:.2f}" for x in meta["load_before"])
        + ", after " + " ".join(f"{x:.2f}" for x in meta["load_after"])
        + " (other jobs shared the machine)",
        "",
        "| case | torch threads | drafts | exit | equal | wall | check | drafts/s | target ran | "
        "context tokens (a prefill a line) | peak RSS |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in doc["results"]:
        rep = r["report"]
        c = rep["check"]
        lines.append(
            f"| {r['case']} | {r['threads']} | {rep['lines']:,} | {r['exit_code']} | "
            f"{c['equal']:,} | {r['wall_s']:.1f} s | {rep['check_seconds']:.1f} s | "
            f"{rep['drafts_per_second']:,.0f} | {rep['target_tokens']:,} tokens | "
            f"{rep['context_tokens']:,} tokens | {gb(r['peak_rss_bytes'])} |")
    lines += ["", "One prefill a line (a fresh reference for each line: the check without the "
              "shared prefixes), on a seeded sample of the same trace, with torch's default "
              "threads, extrapolated to the whole trace:", "",
              "| case | lines timed | seconds | per line | the whole trace at that rate | "
              "shared prefixes, same threads |", "|---|---:|---:|---:|---:|---:|"]
    for r in doc["results"]:
        n = r.get("naive")
        if n is None:
            continue
        shared = next(x for x in doc["results"] if x["case"] == r["case"]
                      and x["threads"] == n["threads"])
        per = n["seconds"] / n["lines"]
        lines.append(f"| {r['case']} | {n['lines']} | {n['seconds']:.1f} s | {per * 1e3:,.1f} ms | "
                     f"{per * r['report']['lines']:,.0f} s | "
                     f"{shared['report']['check_seconds']:,.1f} s |")
    return "\n".join(lines)


def write_results() -> None:
    doc = json.loads(RESULTS_JSON.read_text())
    path = BENCH / "RESULTS.md"
    text = path.read_text()
    head, rest = text.split(BEGIN, 1)
    _old, tail = rest.split(END, 1)
    path.write_text(head + BEGIN + "\n" + render(doc) + "\n" + END + tail)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["build", "run", "render"])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/dspark-conform-bench"))
    args = parser.parse_args()
    if args.step == "build":
        build(args.workdir)
    elif args.step == "run":
        run(args.workdir)
    else:
        write_results()
    return 0


if __name__ == "__main__":
    sys.exit(main())
