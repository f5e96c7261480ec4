"""`dspark smoke` on a DFlash2 artifact and a Gemma 4 assistant artifact: each runs in its own
loop (runtime/dflash2_loop.py, runtime/gemma4_assistant.py, as `dspark eval` runs them) and
reproduces the run its reference code made on the same prompt (speculators' for DFlash2,
transformers' with the KV trimmed after each rejection for the assistant: golden/reference/
*/reference.json), cycle by cycle in the trace; what these kinds cannot take is refused
before any weight loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.cli import assert_refused, run_cli
from dspark_convert.errors import DFlash2RunError, SmokeInputError

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "reference"
QWEN3_TARGET, GEMMA4_TARGET = GOLDEN / "target", GOLDEN / "gemma4" / "target"
CASES = {"dflash2": (GOLDEN / "dflash2" / "draft", QWEN3_TARGET, "runs"),
         "assistant": (GOLDEN / "gemma4_assistant" / "assistant", GEMMA4_TARGET, "runs_clean_kv")}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    from dspark_convert.commands.convert import convert

    root = tmp_path_factory.mktemp("smoke-kinds")
    out = {}
    for name, (source, target, _) in CASES.items():
        convert(source, root / name, target=target)
        out[name] = root / name
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_smoke_reproduces_the_reference_codes_run(name, artifacts, tmp_path):
    source, target, runs_key = CASES[name]
    reference = json.loads((source.parent / "reference.json").read_text())
    for i, want in enumerate(reference[runs_key]):
        prompt = ",".join(str(t) for t in want["prompt"])
        new = len(want["output_ids"]) - len(want["prompt"])
        trace = tmp_path / f"{name}-{i}.json"
        proc = run_cli("smoke", str(artifacts[name]), "--target", str(target), "--prompt-ids",
                       prompt, "--max-new-tokens", str(new), "--trace", str(trace), "--json")
        assert proc.returncode == 0, proc.stderr
        result = json.loads(proc.stdout)
        assert result["lossless"] is True
        got = json.loads(trace.read_text())["runs"][0]
        assert got["output_ids"] == want["output_ids"]
        assert got["acceptance_lengths"] == want["acceptance_lengths"]
        assert [c["proposed"] for c in got["cycles"]] == [c["proposed"] for c in want["cycles"]]
        assert [c["accepted"] for c in got["cycles"]] == [c["accepted"] for c in want["cycles"]]
        # Acceptance by position is as wide as one cycle's drafts: B - 1 for DFlash2 (slot 0
        # is the anchor), the drafts per cycle for the assistant.
        width = (8 - 1) if name == "dflash2" else reference["num_assistant_tokens"]
        assert len(result["acceptance_by_position"]) == width


def test_dflash2_above_temperature_zero_is_refused(artifacts):
    proc = run_cli("smoke", str(artifacts["dflash2"]), "--target", str(QWEN3_TARGET),
                   "--prompt", "Hello", "--temperature", "0.7")
    assert_refused(proc, DFlash2RunError, ["temperature", "no sampled walk"])


@pytest.mark.parametrize("option", [("--confidence-threshold", "0.5"),
                                    ("--reference", str(GOLDEN / "vanilla_conf_markov" / "reference.json"))])
@pytest.mark.parametrize("name", sorted(CASES))
def test_what_a_headless_kind_cannot_take_is_refused(name, option, artifacts):
    _, target, _ = CASES[name]
    proc = run_cli("smoke", str(artifacts[name]), "--target", str(target), "--prompt", "Hello",
                   *option)
    assert_refused(proc, SmokeInputError, [option[0], "without"])


def test_the_assistant_samples_and_smoke_says_nothing_of_losslessness(artifacts):
    proc = run_cli("smoke", str(artifacts["assistant"]), "--target", str(GEMMA4_TARGET),
                   "--prompt", "Hello", "--temperature", "0.7", "--max-new-tokens", "12", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["lossless"] is None and result["runs"][0]["new_tokens"] == 12
