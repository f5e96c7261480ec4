"""Hostile inputs to the gate, each through the real CLI
(tests/support/cli.py), with their twins:

- the llama.cpp stage: a run that compared no draft (or no prompt's text) fails, never
  passes; every engine run's system-info line is in gate.json and gate.md;
- exit 1 after every stage ran: the step summary read back in the locale's encoding;
- refused before anything runs, nothing written: a drafter named after the gate's own files
  (or two names one directory apart only by case), --update on a layout its edit cannot
  follow, a policy nested 600 deep (brackets, braces or a dotted key), a baseline whose
  numbers are out of range (1e999, tau -100, a rate of 7.0 or -1e300, ...), a step summary
  that is an input or an output of the gate, or a FIFO;
- after OUT_DIR is published: a step summary that cannot be written is a warning;
- the composite action: a policy named like an option is a path; --update keeps CRLF.

Most cases are refusals before anything runs, or a gate whose source is missing (its pin
fails at once): a real gate.json in half a second. The gates that convert and evaluate are
marked slow.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import ROOT
from support.cli import DSPARK, assert_refused, child_env, run_cli, run_process, temp_siblings
from support.paths import GOLDEN_TARGET, TRAINED_DRAFTERS

from dspark_convert.commands.gate_report import GateReport
from dspark_convert.errors import (
    GateBaselineError,
    GateEngineError,
    GateFailedError,
    GatePolicyError,
    GateSelectionError,
    OutputExistsError,
    OutputWriteError,
)

DRAFTER = TRAINED_DRAFTERS["dflash_shared"]
PACKAGED_PROMPTS = ROOT / "dspark_convert" / "evaluation" / "data" / "golden_prompts.jsonl"


def _policy(directory: Path, drafters: str, *, name: str = "policy.toml", defaults: str = "",
            top: str = "") -> Path:
    """A one-prompt, four-token policy beside its prompt set (``top``: keys of the root
    table, before [defaults]; ``defaults`` may name other prompts)."""
    (directory / "prompts.jsonl").write_text('{"id": "a", "prompt_ids": [1, 17, 33, 90, 250, 7]}\n')
    if "prompts" not in defaults:
        defaults = 'prompts = "prompts.jsonl"\n' + defaults
    path = directory / name
    path.write_text(f'{top}[defaults]\nmax_new_tokens = 4\ndevice = "cpu"\n{defaults}\n{drafters}')
    return path


def _drafter(name: str = "d", source: Path | str = DRAFTER, extra: str = "") -> str:
    return f'[[drafter]]\nname = "{name}"\nsource = "{source}"\ntarget = "{GOLDEN_TARGET}"\n{extra}'


def _refused_before_running(proc, out: Path, error, needles) -> str:
    line = assert_refused(proc, error, needles)
    assert not out.exists() and temp_siblings(out) == []
    return line


@pytest.fixture
def pinless(tmp_path) -> Path:
    """A policy whose one drafter's source is missing: the whole gate runs, its pin fails."""
    return _policy(tmp_path, _drafter(source=tmp_path / "missing"))


# --- the llama.cpp stage ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def llama_gate(tmp_path_factory):
    """A gate with llama.cpp's stage on the DSpark golden drafter: (OUT_DIR, its eval report)."""
    from support.llama_cpp import engine

    from dspark_convert.evaluation.report import read_report

    root = tmp_path_factory.mktemp("llama-gate")
    llama = engine()
    target_gguf = llama.convert(GOLDEN_TARGET, root / "target.gguf")
    policy = _policy(root, _drafter("v", TRAINED_DRAFTERS["vanilla_conf_markov"],
                                    f'require = ["llama.cpp"]\ntarget_gguf = "{target_gguf}"\n'),
                     # the packaged prompt set: text prompts, which llama.cpp takes
                     defaults=f'llama_cpp = "{llama.bin}"\nprompts = "{PACKAGED_PROMPTS}"\n')
    out = root / "out"
    proc = run_cli("gate", str(policy), "-o", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, read_report(out / "v" / "eval-llama.cpp" / "report.json")


@pytest.mark.slow   # llama.cpp's converter, then a whole gate with its stage (~10 s)
def test_every_engine_run_records_the_engines_system_info(llama_gate):
    out, eval_report = llama_gate
    stage = GateReport.model_validate_json((out / "gate.json").read_text()).entry("v").stage("llama.cpp")
    assert stage.status == "passed"
    runs = [(r.kind, r.artifact, r.spec_type, r.system_info) for r in eval_report.engine_runs]
    assert [(r.kind, r.artifact, r.spec_type, r.system_info) for r in stage.engine_runs] == runs
    infos = {r.system_info for r in stage.engine_runs}
    assert len(infos) == 1 and next(iter(infos)).startswith("system_info: ")   # llama.cpp's own
    features = next(iter(infos)).removeprefix("system_info: ").replace("|", "\\|")
    assert f"- llama.cpp system info: {features}" in (out / "gate.md").read_text()


@pytest.mark.slow   # shares the llama.cpp gate above
def test_a_run_that_compared_nothing_fails_the_stage(llama_gate):
    """The verdict on the real report, with the judged run's drafts as llama.cpp's reader
    gives them when it drafted nothing (check_proposals of no draft: 0 compared), with no
    proposal check at all, and with no prompt's text compared: each fails, saying so."""
    from dspark_convert.commands.gate import engine_verdict
    from dspark_convert.evaluation.proposals import check_proposals

    _, report = llama_gate
    assert engine_verdict(report, ["bf16"]).startswith("bf16: draft-dspark on ")   # as run: passed
    nothing = check_proposals([], proposer=None)
    assert nothing.compared == 0

    def judged_with(**update):
        run = next(r for r in report.engine_runs if r.kind == "drafter" and r.spec_type == "draft-dspark")
        prompts = [p.model_copy(update={k: v for k, v in update.items() if k in ("proposals", "lossless")})
                   for p in run.prompts]
        edited = run.model_copy(update={**update, "prompts": prompts})
        return report.model_copy(update={"engine_runs": [edited if r is run else r
                                                         for r in report.engine_runs]})

    for edited, why in ((judged_with(proposals=nothing), "(0 compared)"),
                        (judged_with(proposals=None), "(no draft check)")):
        with pytest.raises(GateEngineError, match="made no draft compared with the reference") as exc:
            engine_verdict(edited, ["bf16"])
        assert why in exc.value.message and "nothing compared is never a pass" in exc.value.message
    with pytest.raises(GateEngineError, match="output of no prompt could be compared"):
        engine_verdict(judged_with(lossless=None), ["bf16"])


# --- exit 1 after every stage ran ---------------------------------------------------------------

def test_the_step_summary_is_appended_whatever_the_locale(pinless, tmp_path):
    """gate.md is UTF-8 (its marks are emoji); in a C locale without UTF-8 mode the summary
    was read back as ASCII after every stage had run: exit 1. A real process: the locale
    is the interpreter's."""
    summary = tmp_path / "summary.md"
    summary.write_bytes(b"# an earlier step\n")
    out = tmp_path / "out"
    proc = run_process("gate", str(pinless), "-o", str(out),
                       env={"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0",
                            "PYTHONCOERCECLOCALE": "0", "GITHUB_STEP_SUMMARY": str(summary)})
    assert_refused(proc, GateFailedError, ["(pin: SourceNotFoundError"])
    assert summary.read_bytes() == b"# an earlier step\n" + (out / "gate.md").read_bytes() + b"\n"


# --- refused before anything runs ---------------------------------------------------------------

@pytest.mark.parametrize("name", ["gate.json", "gate.md", "junit.xml", "GATE.JSON", "Junit.Xml"])
def test_a_drafter_named_after_the_gates_own_files_is_refused(tmp_path, name):
    out = tmp_path / "out"
    proc = run_cli("gate", str(_policy(tmp_path, _drafter(name))), "-o", str(out))
    _refused_before_running(proc, out, GatePolicyError,
                            [f"drafter[0] '{name}': key 'name'", "gate.json, gate.md, junit.xml"])


def test_two_names_one_directory_apart_only_by_case_are_refused(tmp_path):
    out = tmp_path / "out"
    proc = run_cli("gate", str(_policy(tmp_path, _drafter("Qwen") + _drafter("qwen"))), "-o", str(out))
    _refused_before_running(proc, out, GatePolicyError,
                            ["drafter[1] 'qwen': key 'name': the name of drafter[0] too",
                             "case-insensitive file system"])


@pytest.mark.parametrize("layout", ["inline", "quoted"])
def test_update_on_a_layout_its_edit_cannot_follow_is_refused_before_running(tmp_path, layout):
    """The drafter is real: without the check up front the whole gate ran and published
    OUT_DIR before --update refused."""
    if layout == "inline":
        policy = _policy(tmp_path, "", top=f'drafter = [{{name = "d", source = "{DRAFTER}", '
                                           f'target = "{GOLDEN_TARGET}"}}]\n')
    else:
        policy = _policy(tmp_path, _drafter().replace("[[drafter]]", '[["drafter"]]'))
    out = tmp_path / "out"
    proc = run_cli("gate", str(policy), "-o", str(out), "--update")
    _refused_before_running(proc, out, GatePolicyError, ["--update cannot write the measured hashes"])
    assert not (tmp_path / "policy.updated.toml").exists()
    # the policy itself is read: the refusal is --update's
    assert_refused(run_cli("gate", str(policy), "-o", str(out), "--only", "nope"), GateSelectionError,
                   ["--only nope"])


@pytest.mark.parametrize("deep", [
    "x = " + "[" * 600 + "]" * 600,
    "x = " + "{a = " * 600 + "1" + "}" * 600,
    ".".join(["a"] * 600) + " = 1",
    "[" + ".".join(["t"] * 16) + "]\n" + ".".join(["k"] * 16) + " = 1",   # 16 + 16: after parsing
])
def test_a_policy_nested_600_deep_is_refused_before_parsing(tmp_path, deep):
    policy = tmp_path / "deep.toml"
    policy.write_text(deep + "\n" + _drafter())
    out = tmp_path / "out"
    proc = run_cli("gate", str(policy), "-o", str(out))
    _refused_before_running(proc, out, GatePolicyError, ["deep", "expected at most 16"])


# The baseline: a real gate.json (its drafter's pin failed) given a well-formed measurement.
MEASUREMENT = {"prompt_set_sha256": "0" * 64, "prompts": 1, "max_new_tokens": 4,
               "dtype": "float32", "device": "cpu",
               "artifacts": {"bf16": {"tau": 2.0, "acceptance_by_position": [0.5, None, 0.25],
                                      "lossless": True}}}


def _baseline(pinless: Path, directory: Path, edit=None, *, raw: tuple[str, str] | None = None) -> Path:
    out = directory / "run"
    assert run_cli("gate", str(pinless), "-o", str(out)).returncode == GateFailedError.exit_code
    doc = json.loads((out / "gate.json").read_text())
    doc["entries"][0]["measurement"] = json.loads(json.dumps(MEASUREMENT))
    if edit is not None:
        edit(doc)
    text = json.dumps(doc)
    if raw is not None:                  # a number json.dumps cannot write (1e999)
        text = text.replace(*raw)
    (out / "gate.json").write_text(text)
    return out


def _artifact(doc) -> dict:
    return doc["entries"][0]["measurement"]["artifacts"]["bf16"]


@pytest.mark.parametrize("edit, raw, needles", [
    (None, ('"tau": 2.0', '"tau": 1e999'), ["1e999", "too large for a double"]),
    (lambda d: _artifact(d).update(tau=-100.0), None, ["bf16.tau", "greater than or equal to 1", "-100"]),
    (lambda d: _artifact(d).update(tau=0.5), None, ["bf16.tau", "greater than or equal to 1"]),
    (lambda d: _artifact(d)["acceptance_by_position"].__setitem__(0, 7.0), None,
     ["acceptance_by_position.0", "less than or equal to 1", "7.0"]),
    (lambda d: _artifact(d)["acceptance_by_position"].__setitem__(2, -1e300), None,
     ["acceptance_by_position.2", "greater than or equal to 0", "-1e+300"]),
    (lambda d: d["entries"][0]["measurement"].update(prompts=0), None, ["measurement.prompts"]),
    (lambda d: d["entries"][0]["measurement"].update(max_new_tokens=-4), None,
     ["measurement.max_new_tokens"]),
    (lambda d: d["entries"][0]["stages"][0].update(seconds=-1.0), None, ["stages.0.seconds"]),
    (lambda d: d["entries"][0]["stages"][0].update(exit_code=999), None, ["stages.0.exit_code"]),
    (lambda d: d["entries"][0]["measurement"].update(prompt_set_sha256="x"), None,
     ["prompt_set_sha256", "a SHA-256 (64 lowercase hex digits)"]),
])
def test_baseline_numbers_are_range_checked(pinless, tmp_path, edit, raw, needles):
    out = tmp_path / "out"
    proc = run_cli("gate", str(pinless), "-o", str(out), "--baseline",
                   str(_baseline(pinless, tmp_path, edit, raw=raw)))
    _refused_before_running(proc, out, GateBaselineError, ["--baseline", "gate.json", *needles])


def test_a_well_formed_baseline_is_read(pinless, tmp_path):
    """The control of the cases above: the same baseline unedited is taken (the gate runs)."""
    out = tmp_path / "out"
    proc = run_cli("gate", str(pinless), "-o", str(out), "--baseline", str(_baseline(pinless, tmp_path)))
    assert_refused(proc, GateFailedError, ["(pin: SourceNotFoundError"])


def test_an_incomplete_baseline_says_what_it_lacks(pinless, tmp_path):
    def no_reason(doc):
        doc["complete"] = False

    out = tmp_path / "out"
    proc = run_cli("gate", str(pinless), "-o", str(out), "--baseline",
                   str(_baseline(pinless, tmp_path, no_reason)))
    line = _refused_before_running(proc, out, GateBaselineError,
                                   ["did not finish (complete is false, no reason recorded)"])
    assert "(None)" not in line


# --- the step summary ---------------------------------------------------------------------------

def test_a_step_summary_that_is_an_input_or_an_output_is_refused(pinless, tmp_path):
    out = tmp_path / "out"
    before = pinless.read_bytes()
    for summary, what in ((pinless, "is the policy file"), (out / "s.md", "lies inside the output"),
                          (tmp_path / "policy.updated.toml", "is --update's copy"),
                          (tmp_path / "prompts.jsonl", "is a prompt set")):
        proc = run_cli("gate", str(pinless), "-o", str(out), "--update",
                       env={"GITHUB_STEP_SUMMARY": str(summary)})
        _refused_before_running(proc, out, OutputExistsError, [f"GITHUB_STEP_SUMMARY {summary}: {what}"])
    assert pinless.read_bytes() == before


def test_a_fifo_as_the_step_summary_is_refused_never_waited_on(pinless, tmp_path):
    fifo = tmp_path / "summary"
    os.mkfifo(fifo)
    out = tmp_path / "out"
    proc = run_process("gate", str(pinless), "-o", str(out), timeout=60,
                       env={"GITHUB_STEP_SUMMARY": str(fifo)})
    _refused_before_running(proc, out, OutputWriteError, ["is a FIFO", "never waited on"])


def test_a_step_summary_that_cannot_be_written_is_a_warning_after_the_verdict(pinless, tmp_path):
    out = tmp_path / "out"
    proc = run_cli("gate", str(pinless), "-o", str(out), env={"GITHUB_STEP_SUMMARY": "/dev/full"})
    assert proc.returncode == GateFailedError.exit_code
    lines = proc.stderr.splitlines()
    assert lines[0] == ("warning: GITHUB_STEP_SUMMARY /dev/full: cannot append the summary: No "
                        "space left on device; the verdict stands")
    assert len(lines) == 2 and lines[1].startswith("error: gate: 1 of 1 drafter(s) failed")
    assert (out / "gate.json").is_file()


# --- the composite action; --update's line endings --------------------------------------------

def test_the_action_reads_a_policy_named_like_an_option_as_a_path(tmp_path):
    """The action's own gate step, its expressions substituted, run by bash with the venv
    it installs standing for this one: a policy named '--help' is gated, not helped."""
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    step = next(s for s in action["runs"]["steps"] if s.get("name") == "dspark gate")
    venv_bin = tmp_path / "runner" / "dspark-venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "dspark").symlink_to(DSPARK)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    policy = _policy(workspace, _drafter(source=workspace / "missing"), name="--help")
    env = {"POLICY": policy.name, "BASELINE": "", "OUTPUT": "-out"}
    proc = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=workspace, capture_output=True,
                          text=True, timeout=120,
                          env=child_env({"RUNNER_TEMP": str(tmp_path / "runner"), **env}))
    assert_refused(proc, GateFailedError, ["(pin: SourceNotFoundError"])
    report = GateReport.model_validate_json((workspace / "-out" / "gate.json").read_text())
    assert Path(report.policy).name == "--help"


@pytest.mark.slow   # a whole gate (convert, smoke, eval: ~8 s)
def test_update_keeps_the_policys_crlf_line_endings(tmp_path):
    policy = _policy(tmp_path, _drafter("d"), name="release.toml")
    policy.write_bytes(policy.read_bytes().replace(b"\n", b"\r\n"))
    proc = run_cli("gate", str(policy), "-o", str(tmp_path / "out"), "--update")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    copy = (tmp_path / "release.updated.toml").read_bytes()
    assert b'name = "d"\r\nsha256 = "' in copy
    assert copy.count(b"\n") == copy.count(b"\r\n") == policy.read_bytes().count(b"\r\n") + 1
