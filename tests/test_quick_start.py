"""The README's quick start, run as a user pastes it: every ```sh block under "## Quick
start", in order, in one bash session (`set -euo pipefail`), with `dspark` and `hf` on the
PATH, against the loopback Hub (tests/support/hub_server.py) serving the golden fixtures
under the README's names: the DeepSpec reference drafter as the README's drafter at the
README's commit, the golden target as its target.

The one edit to the text: the placeholder `COMMIT` (the target's commit, which a user fills
in) becomes the loopback target's commit. What a user is told to have is made first: the
target GGUF llama.cpp runs, by llama.cpp's own converter on the golden target. Each block
must leave what the next reads (the lock, the artifact, the report); the test checks the
files a user is told to look at.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REFERENCE_DRAFTER, ROOT
from support.hub_server import HubServer
from support.paths import GOLDEN_TARGET

pytestmark = pytest.mark.slow

PLACEHOLDER = re.compile(r"\bCOMMIT\b")
# What of the checkout the quick start reads: the example policy and the fixtures it names,
# and tools/llama_cpp.py, which finds the llama.cpp build.
CHECKOUT = ("release", "golden", "tools")


def quick_start() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```sh\n(.*?)^```$", section, re.M | re.S)


def pins(blocks: list[str]) -> tuple[str, str, str]:
    """(drafter repo, its commit, target repo) as the first block assigns them."""
    drafter = re.search(r"^DRAFTER=([\w.-]+/[\w.-]+)@([0-9a-f]{40})$", blocks[0], re.M)
    target = re.search(r"^TARGET=([\w.-]+/[\w.-]+)@COMMIT$", blocks[0], re.M)
    assert drafter and target, "the first quick-start block pins DRAFTER and TARGET"
    return drafter.group(1), drafter.group(2), target.group(1)


def test_the_quick_start_covers_the_common_path():
    script = "\n".join(quick_start())
    for step in ("dspark lock", "dspark convert", "dspark validate", "dspark smoke",
                 "dspark eval", "dspark export", "dspark gate"):
        assert step in script, step


def test_the_quick_start_runs(tmp_path):
    blocks = quick_start()
    drafter_repo, drafter_commit, target_repo = pins(blocks)
    # "In the checkout": what the snippets read of it, linked; what they write lands here.
    work = tmp_path / "work"
    work.mkdir()
    for name in CHECKOUT:
        (work / name).symlink_to(ROOT / name)
    script = "\n".join(blocks)
    target_gguf = re.search(r"--target-gguf (\S+)", script)
    if target_gguf:
        # The target GGUF the user runs llama.cpp with: llama.cpp's own converter on the
        # golden target (support/llama_cpp.py; it skips, or fails under CI, when llama.cpp
        # is not built: `make test` builds it first).
        from support.llama_cpp import engine

        engine().convert(GOLDEN_TARGET, work / target_gguf.group(1))
    with HubServer() as hub:
        hub.add_directory(drafter_repo, REFERENCE_DRAFTER, commit=drafter_commit)
        target_commit = hub.add_directory(target_repo, GOLDEN_TARGET)
        script = "set -euo pipefail\n" + PLACEHOLDER.sub(target_commit, script)
        env = {k: v for k, v in os.environ.items()
               if k not in ("HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN")}
        env.update(HF_HOME=str(tmp_path / "hf_home"), HF_ENDPOINT=hub.url, COLUMNS="200",
                   PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
                   OMP_NUM_THREADS="1")
        # errors="replace": llama.cpp prints the tokens it decodes, a byte-level BPE
        # fragment of a tiny tokenizer included
        run = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True,
                             text=True, errors="replace", timeout=900)
        assert run.returncode == 0, f"{run.stdout[-4000:]}\n{run.stderr[-4000:]}"
        # Every file came from the loopback Hub: the drafter at the README's commit.
        assert any(f"/{drafter_repo}/resolve/{drafter_commit}/" in path
                   for _, _, path in hub.requests())
    # What the quick start tells the user to read.
    assert (work / "dspark.lock").is_file()
    assert (work / "build" / "drafter" / "drafter.gguf").is_file()
    assert (work / "build" / "eval" / "report.md").is_file()
    assert (work / "build" / "eval" / "report.json").is_file()
    assert {p.name for p in (work / "build" / "gate").iterdir()} >= {"gate.json", "gate.md", "junit.xml"}
    if target_gguf:
        assert (work / "build" / "drafter-llama.gguf").is_file()
        # llama.cpp's runs beside the reference's, read by the eval: llama-speculative-simple's
        # own tail (its n_drafted, n_accept lines) is not asserted, llama.cpp may lose it at
        # exit when run by hand (docs/ENGINES.md "llama.cpp's log at exit").
        report = json.loads((work / "build" / "eval-llama" / "report.json").read_text())
        drafter_runs = [r for r in report["engine_runs"] if r["kind"] == "drafter"]
        assert drafter_runs and all(r["lossless"] for r in drafter_runs), drafter_runs
        assert all(r["proposals"]["compared"] > 0 for r in drafter_runs), drafter_runs
