"""Benchmark `dspark convert` and `dspark validate` against what the disk allows.

For each checkpoint size (bench/make_checkpoint.py: the released Qwen3-4B geometry, 2.79 GB,
and a smaller one) it runs, in one process, several repetitions of every command,
alternating (the order rotates each repetition so that no command always follows the
same one), each in its own subprocess, with the page cache dropped before each when the
kernel allows it:

    cp + sync            cp of model.safetensors, then sync: the disk's copy speed
    sha256 source        SHA-256 of model.safetensors in Python (hashlib, 8 MiB reads)
    dspark convert       our converter (CLI, --quiet)
    baseline eager       bench/baseline_eager.py: all tensors in RAM, then gguf-py writes
    sha256 drafter.gguf  SHA-256 of the converted drafter.gguf (what validate reads)
    parse drafter.gguf   our bounded GGUF reader on drafter.gguf: header, keys, tensor table
    dspark validate      our validator (CLI)

Wall time and peak RSS of each (GNU time -v when present, else os.wait4's rusage), and the
bytes the kernel read from and wrote to the disk for it. Separately: how many bytes
`dspark convert` passes through read() and how many file pages it maps (one read pass
over the source, or more?), and the wall time of `dspark --help` (warm cache).

Writes bench/results.json (every sample) and the generated part of bench/RESULTS.md.

    python bench/run.py [--reps 5] [--sizes small,full] [--workdir /tmp/dspark-bench]

`--quantize` measures `dspark quantize` instead, beside `dspark convert`, on the full
checkpoint (the released geometry), the same way (own subprocess, GNU time, page cache
dropped when allowed): convert, quantize to each of q8_0, q5_0, q4_0 (from the BF16
artifact converted once up front: quantize validates its parent, then reads it once), and
validate of the Q4_0 output. Writes bench/quantize_results.json and its own generated part
of RESULTS.md.

    python bench/run.py --quantize [--reps 3] [--workdir /tmp/dspark-bench]
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata as md
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

from make_checkpoint import make_checkpoint

PY = sys.executable
DSPARK = str(Path(PY).parent / "dspark")
GNU_TIME = "/usr/bin/time"
BEGIN, END = "<!-- BEGIN GENERATED bench -->", "<!-- END GENERATED bench -->"
Q_BEGIN, Q_END = "<!-- BEGIN GENERATED bench-quantize -->", "<!-- END GENERATED bench-quantize -->"
QUANT_TYPES = ("q8_0", "q5_0", "q4_0")

SHA256_CODE = """
import hashlib, sys
digest, buf = hashlib.sha256(), bytearray(8 * 1024 * 1024)
view = memoryview(buf)
with open(sys.argv[1], "rb", buffering=0) as fh:
    while n := fh.readinto(buf):
        digest.update(view[:n])
print(digest.hexdigest())
"""
PARSE_CODE = "import sys; from dspark_convert.formats.gguf_reader import read_gguf; read_gguf(sys.argv[1])"

# One syscall trace per command (strace -y names the file behind every descriptor): bytes
# returned by read()/pread() and bytes mapped by mmap(), per file.
STRACE = "/usr/bin/strace"
TRACE_RE = re.compile(r"^\d+\s+(read|pread64)\(\d+<([^>]*)>.*\)\s+=\s+(\d+)$")
MMAP_RE = re.compile(r"^\d+\s+mmap\([^,]+,\s*(\d+),[^,]+,[^,]+,\s*\d+<([^>]*)>")


@dataclass(frozen=True)
class Sample:
    wall_s: float
    cpu_s: float             # user + system CPU time of the command and its children
    maxrss_kb: int
    disk_read_bytes: int     # blocks the kernel fetched from the disk (cold cache: real reads)
    disk_write_bytes: int


def drop_caches() -> bool:
    """sync, then drop the page cache; False when the kernel (container) refuses."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("3\n")
        return True
    except OSError:
        return False


def _run_gnu_time(cmd: list[str]) -> tuple[float, dict[str, int]]:
    with tempfile.NamedTemporaryFile("r", suffix=".time") as report:
        start = time.perf_counter()
        proc = subprocess.run([GNU_TIME, "-v", "-o", report.name, *cmd], check=False,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wall = time.perf_counter() - start
        text = report.read()
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)}: exit {proc.returncode}: {proc.stderr.strip()[-500:]}")

    def field(label: str) -> int:
        return int(re.search(rf"{re.escape(label)}: (\d+)", text).group(1))

    def seconds(label: str) -> float:
        return float(re.search(rf"{re.escape(label)}: ([\d.]+)", text).group(1))

    return wall, {"cpu_s": seconds("User time (seconds)") + seconds("System time (seconds)"),
                  "maxrss_kb": field("Maximum resident set size (kbytes)"),
                  "inblock": field("File system inputs"), "oublock": field("File system outputs")}


def _run_wait4(cmd: list[str]) -> tuple[float, dict[str, int]]:
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    stderr = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)}: exit {proc.returncode}: {stderr.decode()[-500:]}")
    # Without GNU time: the kernel's own rusage of the child (ru_maxrss may include the few MB
    # of this interpreter's image that the child held between fork and exec).
    return wall, {"cpu_s": usage.ru_utime + usage.ru_stime, "maxrss_kb": usage.ru_maxrss,
                  "inblock": usage.ru_inblock, "oublock": usage.ru_oublock}


def measure(cmd: list[str], cold: bool) -> Sample:
    if cold:
        drop_caches()
    runner = _run_gnu_time if os.access(GNU_TIME, os.X_OK) else _run_wait4
    wall, usage = runner(cmd)
    # rusage counts file system blocks in 512-byte units.
    return Sample(round(wall, 3), round(usage["cpu_s"], 2), usage["maxrss_kb"],
                  usage["inblock"] * 512, usage["oublock"] * 512)


def remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


@dataclass(frozen=True)
class Command:
    name: str
    argv: list[str]
    cleanup: Path | None = None      # an output to delete after each run (not timed)


def commands_for(ckpt: Path, artifact: Path, scratch: Path) -> list[Command]:
    src, gguf = ckpt / "model.safetensors", artifact / "drafter.gguf"
    return [
        Command("cp + sync", ["sh", "-c", 'cp "$1" "$2" && sync', "sh", str(src),
                              str(scratch / "copy.safetensors")], scratch / "copy.safetensors"),
        Command("sha256 source", [PY, "-c", SHA256_CODE, str(src)]),
        Command("dspark convert", [DSPARK, "convert", str(ckpt), "-o", str(scratch / "out"),
                                   "--quiet"], scratch / "out"),
        Command("baseline eager", [PY, str(BENCH / "baseline_eager.py"), str(ckpt),
                                   str(scratch / "eager.gguf")], scratch / "eager.gguf"),
        Command("sha256 drafter.gguf", [PY, "-c", SHA256_CODE, str(gguf)]),
        Command("parse drafter.gguf", [PY, "-c", PARSE_CODE, str(gguf)]),
        Command("dspark validate", [DSPARK, "validate", str(artifact)]),
    ]


def check_baseline_output(artifact: Path, eager_gguf: Path) -> None:
    """The baseline must do the same copying work: same tensors, names, shapes and bytes."""
    import hashlib

    from dspark_convert.formats.gguf_reader import read_gguf

    manifest = json.loads((artifact / "manifest.json").read_text())
    want = [(t["name"], t["shape"], t["sha256"]) for t in manifest["artifact"]["tensors"]]
    eager = read_gguf(eager_gguf)
    got = []
    with open(eager_gguf, "rb") as fh:
        for info in eager.tensors:
            fh.seek(info.data_offset)
            got.append((info.name, list(info.shape), hashlib.sha256(fh.read(info.nbytes)).hexdigest()))
    if got != want:
        raise SystemExit(f"{eager_gguf}: the baseline's tensors differ from dspark convert's")


def io_trace(argv: list[str]) -> dict[str, dict[str, int]]:
    """Run ``argv`` under strace; path -> {"read": bytes read(), "mapped": bytes mmap()ed}."""
    per_file: dict[str, dict[str, int]] = {}
    with tempfile.NamedTemporaryFile("r", suffix=".strace") as log:
        subprocess.run([STRACE, "-f", "-y", "-qq", "-e", "trace=read,pread64,mmap", "-o", log.name,
                        *argv], check=True, stdout=subprocess.DEVNULL)
        for line in log:
            if (m := TRACE_RE.match(line)):
                per_file.setdefault(m.group(2), {"read": 0, "mapped": 0})["read"] += int(m.group(3))
            elif (m := MMAP_RE.match(line)):
                per_file.setdefault(m.group(2), {"read": 0, "mapped": 0})["mapped"] += int(m.group(1))
    return per_file


def read_passes(ckpt: Path, artifact: Path, out: Path) -> dict:
    """How many times convert reads its source and its own output, and validate its input."""
    remove(out)
    convert = io_trace([DSPARK, "convert", str(ckpt), "-o", str(out), "--quiet"])
    remove(out)
    validate = io_trace([DSPARK, "validate", str(artifact)])

    def total(trace, inside: Path, key: str, name: str | None = None) -> int:
        # convert writes into a hidden sibling of ``out`` renamed at the end: match by prefix.
        return sum(v[key] for path, v in trace.items()
                   if path.startswith((f"{inside}/", f"{inside.parent}/.{inside.name}"))
                   and (name is None or path.endswith("/" + name)))

    return {"convert_source_read": total(convert, ckpt, "read"),
            "convert_source_mapped": total(convert, ckpt, "mapped"),
            "convert_output_read": total(convert, out, "read", "drafter.gguf"),
            "convert_output_mapped": total(convert, out, "mapped", "drafter.gguf"),
            "validate_gguf_read": total(validate, artifact, "read", "drafter.gguf"),
            "validate_gguf_mapped": total(validate, artifact, "mapped", "drafter.gguf")}


def help_times(reps: int) -> list[float]:
    """`dspark --help`, warm cache (the interpreter and packages are in the page cache)."""
    walls = []
    for _ in range(reps + 1):
        start = time.perf_counter()
        subprocess.run([DSPARK, "--help"], check=True, stdout=subprocess.DEVNULL)
        walls.append(round(time.perf_counter() - start, 3))
    return walls[1:]  # the first run only warms the cache


def fixed_costs(workdir: Path, reps: int) -> dict[str, list[float]]:
    """Per-process cost independent of size (interpreter, imports, checks, output): each
    command on the 0.2 MB golden reference drafter, warm cache."""
    ckpt = ROOT / "golden" / "reference" / "vanilla_conf_markov" / "draft"
    artifact, out = workdir / "tiny-artifact", workdir / "tiny-out"
    remove(artifact)
    subprocess.run([DSPARK, "convert", str(ckpt), "-o", str(artifact), "--quiet"], check=True,
                   stdout=subprocess.DEVNULL)
    commands = commands_for(ckpt, artifact, workdir / "tiny-scratch")
    wanted = {"dspark convert": [DSPARK, "convert", str(ckpt), "-o", str(out), "--quiet"],
              "dspark validate": next(c.argv for c in commands if c.name == "dspark validate"),
              "parse drafter.gguf": next(c.argv for c in commands if c.name == "parse drafter.gguf"),
              "sha256 drafter.gguf": next(c.argv for c in commands if c.name == "sha256 drafter.gguf")}
    walls: dict[str, list[float]] = {name: [] for name in wanted}
    for _ in range(reps):
        for name, argv in wanted.items():
            remove(out)
            walls[name].append(measure(argv, cold=False).wall_s)
    remove(out)
    remove(artifact)
    return walls


def run_rotated(commands: list[Command], reps: int, cold: bool, tag: str,
                after=None) -> dict[str, list[dict]]:
    """Every command ``reps`` times, each in its own subprocess, the order rotating by one
    each repetition; ``after(command, rep)`` sees a run's output before it is removed."""
    samples: dict[str, list[dict]] = {c.name: [] for c in commands}
    for rep in range(reps):
        order = commands[rep % len(commands):] + commands[:rep % len(commands)]
        for command in order:
            sample = measure(command.argv, cold)
            samples[command.name].append(asdict(sample))
            print(f"[{tag}] rep {rep + 1}/{reps} {command.name:<20} {sample.wall_s:7.2f} s "
                  f"cpu {sample.cpu_s:6.2f} s "
                  f"{sample.maxrss_kb / 1024:8.0f} MB", flush=True)
            if after is not None:
                after(command, rep)
            if command.cleanup is not None:
                remove(command.cleanup)
    return samples


def bench_size(size: str, workdir: Path, reps: int, cold: bool) -> dict:
    ckpt = workdir / size
    print(f"[{size}] checkpoint {ckpt}", flush=True)
    make_checkpoint(size, ckpt)
    scratch = workdir / f"{size}-scratch"
    remove(scratch)
    scratch.mkdir(parents=True)
    artifact = workdir / f"{size}-artifact"   # validate's input, converted once up front
    remove(artifact)
    subprocess.run([DSPARK, "convert", str(ckpt), "-o", str(artifact), "--quiet"], check=True,
                   stdout=subprocess.DEVNULL)
    commands = commands_for(ckpt, artifact, scratch)

    def after(command: Command, rep: int) -> None:
        if command.name == "baseline eager" and rep == 0:
            check_baseline_output(artifact, command.cleanup)

    samples = run_rotated(commands, reps, cold, size, after)
    passes = read_passes(ckpt, artifact, scratch / "out") if os.access(STRACE, os.X_OK) else None
    shutil.rmtree(scratch)
    return {"size": size, "checkpoint": str(ckpt),
            "weights_bytes": (ckpt / "model.safetensors").stat().st_size,
            "gguf_bytes": (artifact / "drafter.gguf").stat().st_size,
            "source_bytes": sum(p.stat().st_size for p in ckpt.iterdir() if not p.name.startswith(".")),
            "samples": samples, "read_passes": passes}


def quantize_commands(ckpt: Path, artifact: Path, quantized: Path, scratch: Path) -> list[Command]:
    return [
        Command("dspark convert", [DSPARK, "convert", str(ckpt), "-o", str(scratch / "out"),
                                   "--quiet"], scratch / "out"),
        *(Command(f"dspark quantize {t}", [DSPARK, "quantize", str(artifact), "-o",
                                           str(scratch / t), "--type", t, "--quiet"],
                  scratch / t) for t in QUANT_TYPES),
        Command("dspark validate q4_0", [DSPARK, "validate", str(quantized)]),
    ]


def bench_quantize(workdir: Path, reps: int, cold: bool) -> dict:
    """`dspark quantize` beside `dspark convert` on the released-geometry checkpoint."""
    ckpt = workdir / "full"
    print(f"[quantize] checkpoint {ckpt}", flush=True)
    make_checkpoint("full", ckpt)
    scratch, artifact, quantized = (workdir / "q-scratch", workdir / "q-artifact",
                                    workdir / "q-artifact-q4_0")
    for path in (scratch, artifact, quantized):
        remove(path)
    scratch.mkdir(parents=True)
    subprocess.run([DSPARK, "convert", str(ckpt), "-o", str(artifact), "--quiet"], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run([DSPARK, "quantize", str(artifact), "-o", str(quantized), "--type", "q4_0",
                    "--quiet"], check=True, stdout=subprocess.DEVNULL)
    commands = quantize_commands(ckpt, artifact, quantized, scratch)
    sizes = {}

    def after(command: Command, rep: int) -> None:
        gguf = command.cleanup / "drafter.gguf" if command.cleanup is not None else None
        if gguf is not None and gguf.exists():
            sizes[command.name] = gguf.stat().st_size

    samples = run_rotated(commands, reps, cold, "quantize", after)
    shutil.rmtree(scratch)
    return {"checkpoint": str(ckpt), "weights_bytes": (ckpt / "model.safetensors").stat().st_size,
            "gguf_bytes": (artifact / "drafter.gguf").stat().st_size, "output_bytes": sizes,
            "samples": samples}


# --- the report ---------------------------------------------------------------------------

def machine(workdir: Path) -> dict:
    def first(path: str, key: str) -> str:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return line.split(":", 1)[1].strip()
        return "?"

    def run(*cmd: str) -> str:
        try:
            return subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=ROOT).stdout.strip()
        except OSError:
            return "?"

    disk = run("df", "-h", "--output=source,fstype,size,avail", str(workdir)).splitlines()[-1]
    dev = Path(disk.split()[0]).name
    rotational = Path(f"/sys/block/{dev}/queue/rotational")
    versions = {p: md.version(p) for p in ("torch", "gguf", "numpy", "safetensors", "dspark-convert")}
    return {
        "cpu": first("/proc/cpuinfo", "model name"), "cores": os.cpu_count(),
        "ram": f"{int(first('/proc/meminfo', 'MemTotal').split()[0]) / 1024**2:.1f} GiB", "kernel": platform.release(),
        "disk": " ".join(disk.split()) + (f", /sys/block/{dev}/queue/rotational = "
                                          f"{rotational.read_text().strip()}" if rotational.exists() else ""),
        "python": platform.python_version(), "versions": versions,
        "commit": run("git", "rev-parse", "--short", "HEAD"),
        "dirty": bool(run("git", "status", "--porcelain", "--untracked-files=no")),
    }


def stats(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def fmt_size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.0f} MB"


def summarize(result: dict) -> dict[str, dict]:
    out = {}
    for name, samples in result["samples"].items():
        wall = stats([s["wall_s"] for s in samples])
        rss = [s["maxrss_kb"] / 1024 for s in samples]
        out[name] = {"wall": wall, "cpu": statistics.median(s["cpu_s"] for s in samples),
                     "rss_median": statistics.median(rss), "rss_max": max(rss),
                     "read": statistics.median(s["disk_read_bytes"] for s in samples),
                     "write": statistics.median(s["disk_write_bytes"] for s in samples)}
    return out


def targets(result: dict, summary: dict) -> list[tuple[str, str, str, bool]]:
    med = {name: s["wall"][0] for name, s in summary.items()}
    disk = med["cp + sync"] + med["sha256 source"]
    check = med["sha256 drafter.gguf"] + med["parse drafter.gguf"]
    conv_rss, val_rss = summary["dspark convert"]["rss_max"], summary["dspark validate"]["rss_max"]
    rows = [
        ("convert wall <= 1.5 x (cp+sync + sha256)",
         f"{med['dspark convert']:.2f} s vs 1.5 x {disk:.2f} s = {1.5 * disk:.2f} s",
         f"{med['dspark convert'] / disk:.2f}x", med["dspark convert"] <= 1.5 * disk),
        ("validate wall <= 1.3 x (sha256 + parse)",
         f"{med['dspark validate']:.2f} s vs 1.3 x {check:.2f} s = {1.3 * check:.2f} s",
         f"{med['dspark validate'] / check:.2f}x", med["dspark validate"] <= 1.3 * check),
        ("convert peak RSS < 400 MB", f"max of {len(result['samples']['dspark convert'])} runs",
         f"{conv_rss:.0f} MB", conv_rss < 400),
        ("validate peak RSS < 400 MB", f"max of {len(result['samples']['dspark validate'])} runs",
         f"{val_rss:.0f} MB", val_rss < 400),
    ]
    p = result["read_passes"]
    if p is not None:
        src, gguf = result["source_bytes"], result["gguf_bytes"]
        source_passes = (p["convert_source_read"] + p["convert_source_mapped"]) / src
        convert_detail = (f"read() {fmt_size(p['convert_source_read'])} + mmap() "
                          f"{fmt_size(p['convert_source_mapped'])} of {fmt_size(src)} source files; "
                          f"its own drafter.gguf read back: {fmt_size(p['convert_output_read'])} "
                          f"(+ {fmt_size(p['convert_output_mapped'])} mapped)")
        rows.append(("convert: one read pass over the source (strace)", convert_detail,
                     f"{source_passes:.2f} passes", 0.99 <= source_passes <= 1.01))
        validate_detail = (f"read() {fmt_size(p['validate_gguf_read'])}; mmap() "
                           f"{fmt_size(p['validate_gguf_mapped'])} (the parse maps the file, "
                           "touches the header)")
        rows.append(("validate: one read pass over drafter.gguf (strace)", validate_detail,
                     f"{p['validate_gguf_read'] / gguf:.2f} passes",
                     0.99 <= p["validate_gguf_read"] / gguf <= 1.01))
    return rows


def run_header(meta: dict) -> list[str]:
    """The lines that open a generated block: when, how, on what machine and cache."""
    m = meta["machine"]
    return [
        (f"Run: {meta['started']} to {meta['finished']} (UTC), `{meta['command']}`, "
         f"{meta['reps']} repetitions per command, alternating."),
        "",
        f"- Machine: {m['cpu']}, {m['cores']} cores, {m['ram']} RAM, kernel {m['kernel']}",
        f"- Disk: `{m['disk']}`",
        f"- Python {m['python']}; " + ", ".join(f"{k} {v}" for k, v in m["versions"].items())
        + f"; commit {m['commit']}" + (" plus uncommitted changes" if m["dirty"] else ""),
        f"- Page cache: {meta['cache']}",
        f"- Load average (1/5/15 min): before {meta['load_before']}, after {meta['load_after']}",
        "",
    ]


def command_row(name: str, s: dict, *extra: str) -> str:
    """One command's row of a results table: ``extra`` cells after its name."""
    median, low, high = s["wall"]
    cells = [name, *extra, f"{median:.2f} s", f"{low:.2f} - {high:.2f} s", f"{s['cpu']:.2f} s",
             f"{s['rss_median']:.0f} MB ({s['rss_max']:.0f})", fmt_size(s["read"]),
             fmt_size(s["write"])]
    return "| " + " | ".join(cells) + " |"


def render(results: list[dict], meta: dict) -> str:
    lines = run_header(meta)
    for result in results:
        summary = summarize(result)
        lines += [
            (f"### {result['size']}: model.safetensors {fmt_size(result['weights_bytes'])} "
             f"({result['weights_bytes']:,} bytes), drafter.gguf {fmt_size(result['gguf_bytes'])}"),
            "",
            ("| command | wall median | min - max | CPU (user+sys) median | peak RSS median (max) "
             "| disk read | disk write |"),
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for name, s in summary.items():
            lines.append(command_row(name, s))
        lines += ["", "| target | measured | ratio / value | met |", "|---|---|---:|---|"]
        for label, detail, value, ok in targets(result, summary):
            lines.append(f"| {label} | {detail} | {value} | {'yes' if ok else '**no**'} |")
        lines.append("")
    helps = meta["help_times"]
    fixed = meta["fixed_costs"]
    lines += [(f"`dspark --help` (warm cache, {len(helps)} runs): median {statistics.median(helps):.3f} s, "
               f"max {max(helps):.3f} s (target < 0.5 s: {'met' if max(helps) < 0.5 else '**not met**'})."),
              "",
              (f"Fixed cost per process (warm cache, the 0.2 MB golden reference drafter, median of "
               f"{len(next(iter(fixed.values())))}): "
               + ", ".join(f"{name} {statistics.median(walls):.2f} s" for name, walls in fixed.items())
               + "."),
              ""]
    return "\n".join(lines)


def render_quantize(result: dict, meta: dict) -> str:
    summary = summarize(result)
    lines = run_header(meta) + [
        (f"full: model.safetensors {fmt_size(result['weights_bytes'])}, BF16 drafter.gguf "
         f"{fmt_size(result['gguf_bytes'])} (the parent of every quantize run)"),
        "",
        ("| command | output drafter.gguf | wall median | min - max | CPU (user+sys) median "
         "| peak RSS median (max) | disk read | disk write |"),
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in summary.items():
        size = result["output_bytes"].get(name)
        lines.append(command_row(name, s, fmt_size(size) if size else "-"))
    lines.append("")
    return "\n".join(lines)


def write_results(text: str, begin: str = BEGIN, end: str = END) -> None:
    path = BENCH / "RESULTS.md"
    block = f"{begin}\n{text}\n{end}"
    if path.exists() and begin in path.read_text():
        old = path.read_text()
        new = old[:old.index(begin)] + block + old[old.index(end) + len(end):]
    elif path.exists():
        new = path.read_text().rstrip("\n") + f"\n\n{block}\n"
    else:
        new = f"# Benchmark results\n\n{block}\n"
    path.write_text(new)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--sizes", default="small,full")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/dspark-bench"))
    parser.add_argument("--warm", action="store_true", help="do not drop the page cache")
    parser.add_argument("--no-write", action="store_true", help="print, do not write RESULTS.md")
    parser.add_argument("--quantize", action="store_true",
                        help="measure dspark quantize beside dspark convert (full size only)")
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)

    cold = not args.warm and drop_caches()
    cache = ("dropped before every measured command (`sync; echo 3 > /proc/sys/vm/drop_caches`): "
             "cold-cache reads" if cold else
             "warm: not dropped (" + ("--warm" if args.warm else "the kernel refused drop_caches") +
             "); the source may be served from RAM")
    started = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M")
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    if args.quantize:
        return _main_quantize(args, argv, cold, cache, started, load_before)
    results = [bench_size(size, args.workdir, args.reps, cold) for size in args.sizes.split(",")]
    helps = help_times(10)
    fixed = fixed_costs(args.workdir, 5)
    meta = {"started": started, "finished": dt.datetime.now(dt.timezone.utc).strftime("%H:%M"),
            "command": " ".join(["python bench/run.py", *(argv if argv is not None else sys.argv[1:])]),
            "reps": args.reps, "cache": cache, "load_before": load_before,
            "load_after": " ".join(f"{x:.2f}" for x in os.getloadavg()),
            "machine": machine(args.workdir), "help_times": helps, "fixed_costs": fixed}
    text = render(results, meta)
    print(text)
    if not args.no_write:
        (BENCH / "results.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
        write_results(text)
    return 0


def _main_quantize(args, argv, cold: bool, cache: str, started: str, load_before: str) -> int:
    result = bench_quantize(args.workdir, args.reps, cold)
    meta = {"started": started, "finished": dt.datetime.now(dt.timezone.utc).strftime("%H:%M"),
            "command": " ".join(["python bench/run.py", *(argv if argv is not None else sys.argv[1:])]),
            "reps": args.reps, "cache": cache, "load_before": load_before,
            "load_after": " ".join(f"{x:.2f}" for x in os.getloadavg()),
            "machine": machine(args.workdir)}
    text = render_quantize(result, meta)
    print(text)
    if not args.no_write:
        (BENCH / "quantize_results.json").write_text(
            json.dumps({"meta": meta, "result": result}, indent=1) + "\n")
        write_results(text, Q_BEGIN, Q_END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
