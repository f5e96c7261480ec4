"""Benchmark `dspark conform --diagnose` on a trace of 10,000 drafts with few that differ.

    python bench/conform_diagnose.py [--workdir DIR] [--differing N]

(DIR defaults to /tmp/dspark-diagnose-bench.) The trace: the reference runtime's own greedy
runs of DeepSeek's DSpark drafter on its tiny Qwen3 target (golden/reference/), 10,000
drafts (bench/conform.py ``runtime_trace``: seeded random prompts, 480 new tokens each),
of which N (default 20) seeded lines are replaced by the drafts the reference makes from
the same context under ``no_markov`` (a DSpark drafter run as DFlash): a trace of 10,000
lines, N differing. Then one `dspark conform ART --target T --trace TRACE --device cpu
--json` child without and one with ``--diagnose`` (OMP_NUM_THREADS=1): wall time from the
process, the check's own time and the diagnosis's (its scope: lines re-proposed, candidates,
target tokens, seconds) from the JSON. Writes bench/conform_diagnose_results.json.
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

from conform import DRAFTS, runtime_trace, write_trace  # noqa: E402  (bench/conform.py)
from run import machine  # noqa: E402

PY = sys.executable
GOLDEN = ROOT / "golden" / "reference"
RESULTS = BENCH / "conform_diagnose_results.json"


def misread_drafts(artifact: Path, target: Path, lines: list[dict], ids: list[str]) -> list[list[int]]:
    """The reference's drafts of ``lines``' contexts under the misreadings ``ids``."""
    import torch

    from dspark_convert.commands.binding import bind, open_run_target
    from dspark_convert.evaluation.proposals import ReferenceProposer
    from dspark_convert.runtime.misreadings import misread
    from dspark_convert.runtime.weights import load_drafter_weights

    torch.set_num_threads(1)
    b = bind(artifact, open_run_target(target))
    cpu = torch.device("cpu")
    model = b.runtime.Target(b.target_plan.directory, device=cpu, plan=b.target_plan)
    drafter = b.runtime.Drafter(load_drafter_weights(artifact, plan=b.drafter_plan),
                                embed=model.embed, lm_head=model.lm_head, device=cpu)
    d = misread(drafter, ids, target=model)
    proposer = ReferenceProposer(model, d)
    out = []
    for x in lines:
        c = x["context"]
        d.before_anchor = c[-2] if len(c) > 1 else None
        out.append(list(proposer.propose(c[:-1], c[-1]))[: len(x["draft"])])
    return out


def conform(root: Path, diagnose: bool) -> dict:
    cmd = [PY, "-m", "dspark_convert.cli.main", "conform", str(root / "artifact"), "--target",
           str(GOLDEN / "target"), "--trace", str(root / "trace.jsonl"), "--device", "cpu",
           "--json", *(["--diagnose"] if diagnose else [])]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    out, _ = proc.communicate()
    wall = time.perf_counter() - t0
    doc = json.loads(out)
    scope = doc.get("diagnosis_scope")
    return {"diagnose": diagnose, "exit_code": proc.returncode, "wall_seconds": round(wall, 2),
            "check_seconds": round(doc["check_seconds"], 2), "lines": doc["lines"],
            "differing": doc["check"]["compared"] - doc["check"]["equal"],
            "diagnosis": [{k: e[k] for k in ("misreading", "explains", "of")}
                          for e in (doc.get("diagnosis") or [])][:3],
            "diagnosis_scope": None if scope is None else {
                k: (round(v, 2) if isinstance(v, float) else v) for k, v in scope.items()
                if k != "not_applicable"}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/dspark-diagnose-bench"))
    parser.add_argument("--differing", type=int, default=20)
    args = parser.parse_args()
    root = args.workdir
    root.mkdir(parents=True, exist_ok=True)
    if not (root / "artifact").is_dir():
        subprocess.run([PY, "-m", "dspark_convert.cli.main", "convert",
                        str(GOLDEN / "vanilla_conf_markov" / "draft"), "--target",
                        str(GOLDEN / "target"), "-o", str(root / "artifact"), "--quiet"],
                       check=True, cwd=ROOT)
    t0 = time.perf_counter()
    lines = runtime_trace(root / "artifact", GOLDEN / "target")
    made = time.perf_counter() - t0
    rng = random.Random(35)
    picked = sorted(rng.sample(range(DRAFTS), args.differing))
    for i, draft in zip(picked, misread_drafts(root / "artifact", GOLDEN / "target",
                                               [lines[i] for i in picked], ["no_markov"])):
        lines[i] = {**lines[i], "draft": draft}
    write_trace(root / "trace.jsonl", lines)
    runs = [conform(root, False), conform(root, True)]
    doc = {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "machine": machine(root), "drafts": DRAFTS, "replaced_under_no_markov": args.differing,
           "trace_seconds": round(made, 1), "runs": runs}
    RESULTS.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
