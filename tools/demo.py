"""`make demo`: the bundled golden drafters through `dspark`, one summary line per step.

Each step is one `dspark` command, run as a user would type it but with ``--json``: the demo
prints the command, then one line of what its JSON report says (tensors, checks, engines,
tau, losslessness, the files written). The tables are what the same command prints without
``--json``: run any command shown to see them (``dspark inspect`` for a checkpoint's or an
artifact's tensors, ``dspark validate`` for every check). A step that fails shows the
command's own output whole, and the demo stops with its exit code.

    python tools/demo.py                  # into build/demo/ (removed first)
    python tools/demo.py --out DIR        # elsewhere

What it writes is what the demo always wrote: the artifacts build/demo/reference,
dflash_plain, gemma4 and dflash_shared; the smoke traces (and the reference drafter's
acceptance plot); the eval report in build/demo/eval/ (its acceptance.png is
docs/eval-acceptance.png byte for byte: tests/test_cli_eval.py).
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

ROOT = Path(__file__).resolve().parent.parent
DSPARK = Path(sys.executable).parent / "dspark"

QWEN3_TARGET = "golden/reference/target"
REFERENCE = "golden/reference/vanilla_conf_markov"
DFLASH_SHARED = "golden/reference/dflash_shared/draft"
GEMMA4 = "golden/reference/gemma4"


def steps(out: str) -> list[tuple[str, list[str], dict[str, str]]]:
    """(what the step shows, the dspark arguments, extra environment) in order."""
    return [
        ("a DeepSpec DSpark checkpoint (Qwen3 family)",
         ["inspect", f"{REFERENCE}/draft"], {}),
        ("converted, paired with its target",
         ["convert", f"{REFERENCE}/draft", "-o", f"{out}/reference", "--target", QWEN3_TARGET], {}),
        ("every check of the artifact",
         ["validate", f"{out}/reference", "--target", QWEN3_TARGET], {}),
        ("a plain DFlash checkpoint, no target needed",
         ["convert", "golden/synthetic/dflash_plain", "-o", f"{out}/dflash_plain"], {}),
        ("every check of the artifact",
         ["validate", f"{out}/dflash_plain"], {}),
        ("the reference runtime against DeepSpec's own run, cycle by cycle",
         ["smoke", f"{out}/reference", "--target", QWEN3_TARGET,
          "--reference", f"{REFERENCE}/reference.json", "--max-new-tokens", "24",
          "--trace", f"{out}/smoke-trace.json", "--plot", f"{out}/acceptance.png"], {}),
        ("DeepSpec's Gemma4 DSpark drafter (Gemma4 family)",
         ["inspect", f"{GEMMA4}/gemma4_vanilla_conf_markov/draft"], {}),
        ("converted, paired with its tiny gemma4_unified target",
         ["convert", f"{GEMMA4}/gemma4_vanilla_conf_markov/draft", "-o", f"{out}/gemma4",
          "--target", f"{GEMMA4}/target"], {}),
        ("every check of the artifact",
         ["validate", f"{out}/gemma4", "--target", f"{GEMMA4}/target"], {}),
        ("the reference runtime against DeepSpec's own run, cycle by cycle",
         ["smoke", f"{out}/gemma4", "--target", f"{GEMMA4}/target",
          "--reference", f"{GEMMA4}/gemma4_vanilla_conf_markov/reference.json",
          "--max-new-tokens", "24", "--trace", f"{out}/gemma4-smoke-trace.json"], {}),
        ("DeepSpec's plain DFlash drafter for the same Qwen3 target",
         ["convert", DFLASH_SHARED, "-o", f"{out}/dflash_shared", "--target", QWEN3_TARGET], {}),
        ("every check of the artifact",
         ["validate", f"{out}/dflash_shared", "--target", QWEN3_TARGET], {}),
        # One torch thread: the golden models are tiny, and two threads contending for two
        # busy cores spend their time synchronising (measured on a loaded 2-core VM: 14 s
        # with one, over 10 minutes with two). The report records the thread count.
        ("the DSpark drafter against the plain DFlash one, with confidence cutoffs",
         ["eval", f"{out}/reference", f"{out}/dflash_shared", "--target", QWEN3_TARGET,
          "--device", "cpu", "--max-new-tokens", "32", "--threshold", "0.3",
          "--threshold", "0.6", "--calibrate", "-o", f"{out}/eval"], {"OMP_NUM_THREADS": "1"}),
    ]


# --- one line of each command's JSON report --------------------------------------------------

def _bytes(n: int) -> str:
    return f"{n:,} bytes"


def _engines(engines: dict | None) -> str:
    if not engines:
        return ""
    return "; engines as is: " + ", ".join(
        f"{name} {'yes' if e.get('accepts') else 'no'}" for name, e in engines.items())


def _inspect(doc: dict) -> str:
    contract = doc.get("contract") or {}
    rows = doc.get("rows") or []
    status: dict[str, int] = {}
    for row in rows:
        status[row["status"]] = status.get(row["status"], 0) + 1
    counts = ", ".join(f"{n} {s}" for s, n in status.items())
    block = (contract.get("block") or {}).get("block_size")
    markov = (contract.get("markov_head") or {}).get("type")
    confidence = (contract.get("confidence_head") or {}).get("enabled")
    heads = ", ".join(filter(None, [f"Markov head {markov}" if markov else "",
                                    "confidence head" if confidence else ""])) or "no heads"
    line = f"{contract.get('family', doc.get('kind'))}: {len(rows)} tensors ({counts}), block {block}, {heads}"
    if doc.get("problem"):
        line += f"; problem: {doc['problem']}"
    return line


def _checks(checks: list[dict]) -> str:
    status: dict[str, int] = {}
    for check in checks:
        status[check["status"]] = status.get(check["status"], 0) + 1
    return ", ".join(f"{n} {s}" for s, n in status.items())


def _convert(doc: dict) -> str:
    gguf = doc["drafter_gguf"]
    line = (f"{doc['output']}/drafter.gguf: {gguf['tensors']} tensors, {_bytes(gguf['size'])}"
            f"; checks {_checks(doc.get('checks') or [])}")
    if doc.get("stripped"):
        line += f"; {len(doc['stripped'])} stripped (the target's own)"
    if doc.get("target"):
        line += f"; target {_checks(doc['target'].get('checks') or [])}"
    return line + _engines(doc.get("engines"))


def _validate(doc: dict) -> str:
    return (f"{'passed' if doc['ok'] else 'FAILED'}: {_checks(doc['checks'])}"
            + _engines(doc.get("engines")))


def _smoke(doc: dict) -> str:
    runs = doc["runs"]
    new = sum(r["new_tokens"] for r in runs)
    line = (f"{len(runs)} prompts, {new} new tokens, tau {doc['tau']:.2f}, "
            f"{'lossless' if doc.get('lossless') else 'NOT lossless'}")
    if doc.get("reference"):
        same = all((r.get("reference_agreement") or {}).get("identical") for r in runs)
        line += ("; every cycle equal to DeepSpec's reference run" if same
                 else "; differs from DeepSpec's reference run")
    written = [p for p in (doc.get("trace"), doc.get("plot")) if p]
    return line + (f"; wrote {', '.join(written)}" if written else "")


def _eval(doc: dict) -> str:
    report = doc["report"]
    taus = []
    for run in report["runs"]:
        if run["kind"] == "drafter" and not run.get("confidence_threshold"):
            taus.append(f"{run['artifact']} {run['acceptance']['tau']:.2f}")
    skipped = len(report.get("not_run") or [])
    line = (f"{report['prompt_set']['count']} prompts, {len(report['runs'])} runs"
            + (f" ({skipped} more not run: the report says why)" if skipped else "") + "; tau "
            + ", ".join(taus) + f"; {'lossless' if report.get('lossless') else 'NOT lossless'}")
    return line + f"; report {doc['output']}/report.md ({len(doc['files'])} files)"


SUMMARY = {"inspect": _inspect, "convert": _convert, "validate": _validate, "smoke": _smoke,
           "eval": _eval}


def run_step(args: list[str], env: dict[str, str]) -> tuple[int, str, str, float]:
    start = time.monotonic()
    proc = subprocess.run([str(DSPARK), *args, "--json"], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, **env})
    return proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="build/demo", help="where the demo writes (removed first)")
    opts = parser.parse_args(argv)
    out = opts.out.rstrip("/")
    shutil.rmtree(ROOT / out, ignore_errors=True)
    todo = steps(out)
    print(f"demo: {len(todo)} dspark commands on the bundled golden drafters, each as typed and "
          f"one line of what it found (run one for its tables); results in {out}/", flush=True)
    start = time.monotonic()
    for number, (what, args, env) in enumerate(todo, 1):
        shown = " ".join(f"{k}={v}" for k, v in env.items())
        print(f"[{number:>2}/{len(todo)}] {what}: {shown + ' ' if shown else ''}dspark {' '.join(args)}",
              flush=True)
        code, stdout, stderr, seconds = run_step(args, env)
        try:
            doc = json.loads(stdout) if code == 0 else None
        except ValueError:
            doc = None
        if doc is None:
            sys.stdout.write(stdout)
            sys.stderr.write(stderr)
            print(f"demo: step {number} failed (exit {code}): dspark {' '.join(args)}",
                  file=sys.stderr)
            return code or 1
        print(f"        {SUMMARY[args[0]](doc)} ({seconds:.1f} s)", flush=True)
    print(f"demo: done in {time.monotonic() - start:.0f} s. Artifacts: {out}/reference, "
          f"{out}/dflash_plain, {out}/gemma4, {out}/dflash_shared; smoke traces "
          f"{out}/smoke-trace.json, {out}/gemma4-smoke-trace.json; eval report "
          f"{out}/eval/report.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
