"""`dspark gate POLICY -o OUT_DIR` (commands/gate.py) as users run it: the example policy
passes; a drafter fails at the right stage when its bytes, its pin, a required engine or
its acceptance regress, while the others go on; gate.json, gate.md (and the step summary),
junit.xml (parsed as XML and checked); --update's reviewed copy of the policy; a Hub-pinned
drafter online then offline with no request; the refusals before anything runs; Ctrl-C; the
workflow, `make gate` and the composite action running the same command.

Most runs use a small policy (two prompts, eight new tokens) in this process (run_cli); the
example policy, Ctrl-C and the action run real processes and are marked slow.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from conftest import ROOT
from support.cli import (
    assert_refused,
    child_env,
    dspark_cmd,
    interrupt_on_terminal,
    run_cli,
    run_process,
    temp_siblings,
)
from support.hub_server import HubServer
from support.paths import GOLDEN_TARGET, TRAINED_DRAFTERS
from dspark_convert.commands.gate_report import GateReport
from dspark_convert.errors import (
    AcceptanceRegressionError,
    EngineRequirementError,
    GateBaselineError,
    GateEngineError,
    GateFailedError,
    GateSelectionError,
    LockMismatchError,
    OutputExistsError,
    OutputPathError,
    ReproducibilityError,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

GOLDEN_POLICY = ROOT / "release" / "golden.toml"
SHA = {"vanilla_conf_markov": "0a010ba118cc823b8aa908f3c9c730bde4132fa8771c28a07de1c983846e92ce",
       "dflash_shared": "b79729a7bdf76e6710c508a5fb1537e1f2b4593332801d2577a48f3d309bbe42"}
STAGES = ["pin", "convert", "reproducibility", "validate", "quantize.q8_0", "smoke", "eval",
          "llama.cpp", "dspark-mlx", "regression"]
ENGINE_STAGES = ("llama.cpp", "dspark-mlx")     # not run: the small policy requires neither


def _entry(name, *, source=None, target=None, **keys) -> str:
    values = {"name": name, "source": str(source or TRAINED_DRAFTERS[name]),
              "target": str(target or GOLDEN_TARGET), "sha256": SHA[name],
              "quantize": ["q8_0"], **keys}
    return "[[drafter]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items()
                                     if v is not None) + "\n"


def _policy(directory: Path, *entries: str, name="policy.toml") -> Path:
    """A policy beside a two-prompt set, eight new tokens: the fast loop's gate."""
    prompts = directory / "prompts.jsonl"
    prompts.write_text('{"id": "a", "prompt_ids": [1, 17, 33, 90, 250, 7]}\n'
                       '{"id": "b", "prompt_ids": [1, 22, 33, 91, 240, 9]}\n')
    path = directory / name
    path.write_text('# a test policy\n[defaults]\nprompts = "prompts.jsonl"\nmax_new_tokens = 8\n'
                    'device = "cpu"\n\n' + "".join(entries))
    return path


def _report(out: Path) -> GateReport:
    return GateReport.model_validate_json((out / "gate.json").read_text())


def _statuses(report: GateReport, name: str) -> dict[str, str]:
    return {s.name: s.status for s in report.entry(name).stages}


@pytest.fixture(scope="module")
def passed(tmp_path_factory):
    """Both golden drafters through the small policy, with a step summary file: (the
    process result, OUT_DIR, the summary file)."""
    root = tmp_path_factory.mktemp("gate")
    policy = _policy(root, _entry("vanilla_conf_markov", min_tau=2.0, max_tau_drop=0.05,
                                  max_acceptance_drop=0.05),
                     _entry("dflash_shared", require=["strata.open"], min_tau=1.0,
                            max_tau_drop=0.05, max_acceptance_drop=0.05))
    summary = root / "summary.md"
    summary.write_text("# an earlier step\n")
    out = root / "out"
    proc = run_cli("gate", str(policy), "-o", str(out), env={"GITHUB_STEP_SUMMARY": str(summary)})
    return proc, out, summary


def test_a_passing_gate_prints_one_line_per_stage_and_writes_every_report(passed):
    proc, out, summary = passed
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr == ""
    lines = proc.stdout.splitlines()
    expected = [(n, s) for n in ("vanilla_conf_markov", "dflash_shared") for s in STAGES]
    assert [tuple(line.split()[1:3]) for line in lines[:-1]] == [(n, s + ":") for n, s in expected]
    assert lines[-1] == f"gate: 2 of 2 drafter(s) passed; gate.json, gate.md, junit.xml in {out}"
    report = _report(out)
    assert report.complete and report.passed and report.baseline is None
    for entry in report.entries:
        st = _statuses(report, entry.name)
        assert st == {s: "not_run" if s in ENGINE_STAGES else "passed" for s in STAGES}, st
        for stage in entry.stages:
            for f in stage.files:
                assert (out / f).is_file(), f
        assert entry.artifacts["bf16"].sha256 == SHA[entry.name]
        manifest = json.loads((out / entry.artifacts["q8_0"].path / "manifest.json").read_text())
        assert manifest["artifact"]["sha256"] == entry.artifacts["q8_0"].sha256
        m = entry.measurement
        assert set(m.artifacts) == {"bf16", "q8_0"} and m.prompts == 2 and m.max_new_tokens == 8
        eval_report = json.loads((out / entry.name / "eval" / "report.json").read_text())
        assert eval_report["lossless"] is True
        # the reports name where the files are now, not the temporary the gate wrote into
        assert ".dspark-tmp-" not in (out / entry.name / "validate.json").read_text()
        assert ".dspark-tmp-" not in json.dumps(eval_report)
    assert temp_siblings(out) == []
    # the step summary: gate.md appended to what the runner's file held
    text = summary.read_text()
    assert text.startswith("# an earlier step\n# dspark gate: PASSED")
    assert text[len("# an earlier step\n"):] == (out / "gate.md").read_text() + "\n"


def _junit(out: Path) -> ET.Element:
    root = ET.parse(out / "junit.xml").getroot()
    assert root.tag == "testsuites"
    total = failures = skipped = 0
    for suite in root:
        assert suite.tag == "testsuite"
        cases = list(suite)
        assert all(c.tag == "testcase" and c.get("classname") == f"dspark-gate.{suite.get('name')}"
                   for c in cases)
        assert int(suite.get("tests")) == len(cases)
        f = sum(c.find("failure") is not None for c in cases)
        s = sum(c.find("skipped") is not None for c in cases)
        assert (int(suite.get("failures")), int(suite.get("skipped"))) == (f, s)
        total, failures, skipped = total + len(cases), failures + f, skipped + s
    assert (int(root.get("tests")), int(root.get("failures")), int(root.get("skipped"))) == \
        (total, failures, skipped)
    return root


def test_junit_has_one_suite_per_drafter_and_one_case_per_stage(passed):
    _, out, _ = passed
    root = _junit(out)
    assert [s.get("name") for s in root] == ["vanilla_conf_markov", "dflash_shared"]
    for suite in root:
        assert [c.get("name") for c in suite] == STAGES
        assert int(suite.get("failures")) == 0 and int(suite.get("skipped")) == 2  # the engines
    md = (out / "gate.md").read_text()
    assert md.startswith("# dspark gate: PASSED\n") and "## Failures" not in md
    assert "| bf16 | " in md and "| q8_0 | " in md


@pytest.mark.slow  # a whole gate run: make test; the fast loop keeps the passing gate and the floor
def test_the_bytes_of_an_artifact_differing_from_the_release_fail_reproducibility(tmp_path):
    wrong = _entry("dflash_shared", sha256=SHA["vanilla_conf_markov"])
    out = tmp_path / "out"
    proc = run_cli("gate", str(_policy(tmp_path, wrong)), "-o", str(out))
    line = assert_refused(proc, GateFailedError, ["1 of 1 drafter(s) failed", "dflash_shared "
                                                  "(reproducibility: ReproducibilityError: "])
    report = _report(out)
    stage = report.entry("dflash_shared").stage("reproducibility")
    assert stage.status == "failed" and stage.exit_code == ReproducibilityError.exit_code
    assert SHA["dflash_shared"] in stage.detail and SHA["vanilla_conf_markov"] in stage.detail
    assert stage.line in line
    # nothing needs the hash: every other stage still ran
    st = _statuses(report, "dflash_shared")
    assert st["validate"] == st["smoke"] == st["eval"] == "passed"
    assert st["regression"] == "not_run"           # no min_tau, no --baseline
    failure = [c for c in _junit(out).iter("testcase") if c.find("failure") is not None]
    assert [c.get("name") for c in failure] == ["reproducibility"]
    assert failure[0].find("failure").get("message") == stage.line
    assert failure[0].find("failure").get("type") == "ReproducibilityError"
    assert "## Failures" in (out / "gate.md").read_text()
    # with a stated reason the new bytes pass, and the reason is said
    out2 = tmp_path / "out2"
    reason = _entry("dflash_shared", sha256=SHA["vanilla_conf_markov"], changed_because="new rope key")
    proc = run_cli("gate", str(_policy(tmp_path, reason)), "-o", str(out2))
    assert proc.returncode == 0, proc.stderr
    assert "changed because: new rope key" in _report(out2).entries[0].stage("reproducibility").detail


@pytest.mark.slow  # a whole gate run: make test; the fast loop keeps the passing gate and the floor
def test_a_required_engine_that_refuses_fails_validate_and_the_others_go_on(tmp_path):
    policy = _policy(tmp_path, _entry("vanilla_conf_markov", quantize=[], require=["llama.cpp"]),
                     _entry("dflash_shared", require=["strata.open", "strata.run"]))
    out = tmp_path / "out"
    proc = run_cli("gate", str(policy), "-o", str(out))
    assert_refused(proc, GateFailedError, ["1 of 2 drafter(s) failed",
                                           "dflash_shared (validate: EngineRequirementError: "])
    report = _report(out)
    assert report.entry("vanilla_conf_markov").passed and not report.passed
    validate = report.entry("dflash_shared").stage("validate")
    assert validate.exit_code == EngineRequirementError.exit_code and "strata.run" in validate.detail
    st = _statuses(report, "dflash_shared")
    assert st["pin"] == st["convert"] == st["reproducibility"] == "passed"
    assert [st[s] for s in ("quantize.q8_0", "smoke", "eval", "llama.cpp", "dspark-mlx",
                            "regression")] == ["skipped"] * 6
    assert report.entry("dflash_shared").stage("smoke").detail == "needs validate, which failed"
    # the policy without a variant has one quantize stage with nothing to do; llama.cpp,
    # required without a build to run, is not run (validate leaves llama.cpp to that stage:
    # llama.cpp reads `dspark export`'s file, not the artifact)
    first = report.entry("vanilla_conf_markov")
    assert first.stage("quantize").status == "not_run"
    assert first.stage("llama.cpp").status == "not_run"
    assert first.stage("llama.cpp").detail == "not run: no llama.cpp build given ([defaults] llama_cpp)"
    assert "required" not in first.stage("validate").detail
    assert (out / "dflash_shared" / "validate.json").is_file()
    assert not (out / "dflash_shared" / "q8_0").exists()


def _baseline(passed_out: Path, directory: Path, change) -> Path:
    """A copy of a passing gate's output whose gate.json ``change`` edits."""
    shutil.copytree(passed_out, directory, ignore=shutil.ignore_patterns("*.gguf", "*.png"))
    doc = json.loads((directory / "gate.json").read_text())
    change(doc)
    (directory / "gate.json").write_text(json.dumps(doc))
    return directory


def _gate_against(passed_out: Path, tmp_path: Path, name: str, change=None):
    """The first drafter of the small policy against a baseline: the passing gate's output,
    its gate.json edited by ``change``; (the result, OUT_DIR)."""
    policy = _policy(tmp_path, _entry("vanilla_conf_markov", min_tau=2.0, max_tau_drop=0.05,
                                      max_acceptance_drop=0.05))
    baseline = passed_out if change is None else _baseline(passed_out, tmp_path / f"b-{name}", change)
    out = tmp_path / name
    return run_cli("gate", str(policy), "-o", str(out), "--baseline", str(baseline)), out


@pytest.mark.slow  # a whole gate run: make test; the fast loop keeps the passing gate and the floor
def test_tau_dropping_against_the_baseline_fails_regression(passed, tmp_path):
    def higher_tau(doc):
        doc["entries"][0]["measurement"]["artifacts"]["bf16"]["tau"] += 0.5

    proc, out = _gate_against(passed[1], tmp_path, "tau", higher_tau)
    assert_refused(proc, GateFailedError, ["vanilla_conf_markov (regression: "
                                           "AcceptanceRegressionError: bf16: tau "])
    report = _report(out)
    stage = report.entries[0].stage("regression")
    assert stage.exit_code == AcceptanceRegressionError.exit_code
    assert "max_tau_drop is 0.05" in stage.detail and "dropped 0.500" in stage.detail
    assert report.baseline == str(tmp_path / "b-tau")
    # what needs no baseline passed
    assert all(s.ok or s.status == "not_run" for s in report.entries[0].stages if s is not stage)


@pytest.mark.slow   # two gates against a baseline (the fast loop has the tau drop)
def test_a_variant_quantized_from_the_same_bytes_must_be_the_baselines(passed, tmp_path):
    def other_variant(doc):
        doc["entries"][0]["artifacts"]["q8_0"]["sha256"] = "f" * 64

    proc, out = _gate_against(passed[1], tmp_path, "variant", other_variant)
    assert_refused(proc, GateFailedError, ["vanilla_conf_markov (quantize.q8_0: "
                                           "ReproducibilityError: q8_0: drafter.gguf SHA-256 is "])
    report = _report(out)
    assert "quantized from the same BF16 drafter.gguf, is " + "f" * 64 in \
        report.entries[0].stage("quantize.q8_0").detail
    # the variant that failed is not measured; the artifact is
    assert set(report.entries[0].measurement.artifacts) == {"bf16"}
    # against the unchanged baseline the same variant passes, saying so
    proc, out = _gate_against(passed[1], tmp_path, "same")
    assert proc.returncode == 0, proc.stderr
    report = _report(out)
    assert ", the baseline's; validate: " in report.entries[0].stage("quantize.q8_0").detail
    detail = report.entries[0].stage("regression").detail
    assert "(baseline " in detail and "within 0.05 of the baseline" in detail


@pytest.mark.slow   # two gates against a baseline (the fast loop has the tau drop)
def test_a_drop_at_one_position_or_other_settings_fail(passed, tmp_path):
    def higher_position(doc):
        rates = doc["entries"][0]["measurement"]["artifacts"]["q8_0"]["acceptance_by_position"]
        rates[1] = min(1.0, rates[1] + 0.2)

    proc, out = _gate_against(passed[1], tmp_path, "position", higher_position)
    assert proc.returncode == GateFailedError.exit_code
    assert "q8_0: the acceptance at draft position 1" in _report(out).entries[0].stage("regression").detail

    def other_settings(doc):
        doc["entries"][0]["measurement"]["max_new_tokens"] = 64

    proc, out = _gate_against(passed[1], tmp_path, "settings", other_settings)
    assert proc.returncode == GateFailedError.exit_code
    assert "measured with other settings" in _report(out).entries[0].stage("regression").detail


def test_tau_below_the_floor_fails_regression_without_a_baseline(tmp_path):
    out = tmp_path / "out"
    proc = run_cli("gate", str(_policy(tmp_path, _entry("dflash_shared", min_tau=9.0))), "-o", str(out))
    assert_refused(proc, GateFailedError, ["(regression: AcceptanceRegressionError: bf16: tau",
                                           "below min_tau 9"])


@pytest.mark.slow   # three gates (the Hub case runs --update in the fast loop)
def test_update_writes_the_measured_hashes_into_a_copy_beside_the_policy(tmp_path):
    policy = _policy(tmp_path, _entry("vanilla_conf_markov", sha256=None, quantize=[]),
                     name="release.toml")
    before = policy.read_text()
    out = tmp_path / "out"
    proc = run_cli("gate", str(policy), "-o", str(out), "--update")
    assert proc.returncode == 0, proc.stderr
    assert _report(out).entries[0].stage("reproducibility").status == "recorded"
    updated = tmp_path / "release.updated.toml"
    assert policy.read_text() == before                    # never in place
    assert updated.read_text() == before.replace(
        'name = "vanilla_conf_markov"\n', f'name = "vanilla_conf_markov"\nsha256 = "{SHA["vanilla_conf_markov"]}"\n')
    assert f"the measured hashes are in {updated}" in proc.stdout
    # the reviewed copy gates the next run; an existing copy is not replaced without --force
    proc = run_cli("gate", str(policy), "-o", str(tmp_path / "again"), "--update")
    assert_refused(proc, OutputExistsError, [str(updated)])
    assert not (tmp_path / "again").exists()
    proc = run_cli("gate", str(updated), "-o", str(tmp_path / "next"))
    assert proc.returncode == 0, proc.stderr
    assert _report(tmp_path / "next").entries[0].stage("reproducibility").status == "passed"


def test_refusals_before_anything_runs(passed, tmp_path):
    _, passed_out, _ = passed
    policy = _policy(tmp_path, _entry("dflash_shared"))
    out = tmp_path / "out"

    def refused(error, needles, *args):
        assert_refused(run_cli("gate", str(policy), "-o", str(out), *args), error, needles)
        assert not out.exists() and temp_siblings(out) == []

    refused(GateBaselineError, ["--baseline", "no such directory"], "--baseline", str(tmp_path / "none"))
    (tmp_path / "empty").mkdir()
    refused(GateBaselineError, ["no gate.json in it"], "--baseline", str(tmp_path / "empty"))
    incomplete = _baseline(passed_out, tmp_path / "incomplete",
                           lambda d: d.update(complete=False, incomplete_reason="interrupted"))
    refused(GateBaselineError, ["did not finish"], "--baseline", str(incomplete))
    bad = _baseline(passed_out, tmp_path / "bad", lambda d: d.update(format="other"))
    refused(GateBaselineError, ["field 'format'"], "--baseline", str(bad))
    # strictly typed, as every file the tool reads: a number as a string, a bool as a count
    def tau_as_text(d):
        d["entries"][0]["measurement"]["artifacts"]["bf16"]["tau"] = "2.5"

    def prompts_as_bool(d):
        d["entries"][0]["measurement"]["prompts"] = True

    for name, change, field in (("text", tau_as_text, "tau"), ("bool", prompts_as_bool, "prompts")):
        loose = _baseline(passed_out, tmp_path / f"loose-{name}", change)
        refused(GateBaselineError, ["--baseline", field], "--baseline", str(loose))
    (tmp_path / "fifo").mkdir()
    os.mkfifo(tmp_path / "fifo" / "gate.json")   # named as a FIFO, never waited on
    refused(GateBaselineError, ["is a FIFO"], "--baseline", str(tmp_path / "fifo"))
    refused(GateSelectionError, ["--only nope", "dflash_shared"], "--only", "nope")
    refused(OutputExistsError, ["holds the policy file"], "--force", "-o", str(tmp_path))
    assert policy.is_file()
    out.mkdir()
    (out / "keep").write_text("mine")
    assert_refused(run_cli("gate", str(policy), "-o", str(out)), OutputExistsError,
                   ["output already exists"])
    assert os.listdir(out) == ["keep"]
    # -o "$UNSET" and '.' are refused before anything runs, --force or not (the one output
    # rule, util/atomic.check_outputs): the working directory is never wiped.
    for spelling in ("", ".", "./"):
        proc = run_cli("gate", str(policy), "-o", spelling, "--force", cwd=out)
        assert_refused(proc, OutputPathError, ["expected a path naming a new directory"])
        assert os.listdir(out) == ["keep"]


def test_only_runs_the_named_drafter(tmp_path):
    policy = _policy(tmp_path, _entry("vanilla_conf_markov"), _entry("dflash_shared", quantize=[]))
    out = tmp_path / "out"
    proc = run_cli("gate", str(policy), "-o", str(out), "--only", "dflash_shared", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert [e["name"] for e in doc["entries"]] == ["dflash_shared"] and doc["only"] == ["dflash_shared"]
    assert doc == json.loads((out / "gate.json").read_text())
    assert not (out / "vanilla_conf_markov").exists()


# --- a Hub-pinned drafter, then offline --------------------------------------------------------

@pytest.mark.slow  # a whole gate run: make test; the fast loop keeps the passing gate and the floor
def test_a_hub_pinned_drafter_online_then_offline_and_a_moved_pin(tmp_path):
    from dspark_convert.commands.lock import lock_snapshot

    with HubServer() as hub:
        draft = hub.add_directory("org/draft", TRAINED_DRAFTERS["dflash_shared"])
        target = hub.add_directory("org/target", GOLDEN_TARGET)
        env = {"HF_HOME": str(tmp_path / "hf_home"), "HF_ENDPOINT": hub.url, "HF_HUB_CACHE": None,
               "HF_HUB_OFFLINE": None, "TRANSFORMERS_OFFLINE": None}
        saved = dict(os.environ)
        os.environ.update({k: v for k, v in env.items() if v is not None})
        try:
            lock_snapshot(f"org/draft@{draft}", tmp_path / "draft.lock")
        finally:
            os.environ.clear()
            os.environ.update(saved)
        entry = _entry("dflash_shared", source=f"org/draft@{draft}", target=f"org/target@{target}",
                       lock="draft.lock", sha256=None)
        policy = _policy(tmp_path, entry)
        # online, with --update: the Hub source's provenance is in drafter.gguf, so its hash
        # is its own, measured and recorded
        proc = run_cli("gate", str(policy), "-o", str(tmp_path / "online"), "--update", env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        online = _report(tmp_path / "online").entries[0]
        pin = online.stage("pin")
        assert f"source org/draft@{draft} from {hub.url}" in pin.detail and "draft.lock" in pin.detail
        assert f"target org/target@{target}" in pin.detail
        assert online.stage("reproducibility").status == "recorded"
        requests = len(hub.requests())
        # offline from the warm cache, with the hash --update wrote: the same bytes again
        proc = run_cli("gate", str(tmp_path / "policy.updated.toml"), "-o", str(tmp_path / "offline"),
                       env={**env, "HF_HUB_OFFLINE": "1"})
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert len(hub.requests()) == requests                 # not one request
        offline = _report(tmp_path / "offline").entries[0]
        assert "the local cache (offline)" in offline.stage("pin").detail
        assert offline.stage("reproducibility").status == "passed"
        assert offline.artifacts["bf16"].sha256 == online.artifacts["bf16"].sha256

        # the pin moves: the policy names a new commit the lock does not record
        moved = hub.add_directory("org/draft", TRAINED_DRAFTERS["dflash_shared"],
                                  extra={"README.md": b"a new commit\n"})
        policy = _policy(tmp_path, entry.replace(draft, moved), name="moved.toml")
        out = tmp_path / "moved"
        proc = run_cli("gate", str(policy), "-o", str(out), env=env)
        assert_refused(proc, GateFailedError, ["(pin: LockMismatchError: "])
        report = _report(out)
        assert report.entries[0].stage("pin").exit_code == LockMismatchError.exit_code
        assert _statuses(report, "dflash_shared")["convert"] == "skipped"
        assert not (out / "dflash_shared" / "bf16").exists()


# --- llama.cpp's own run ---------------------------------------------------------------------

@pytest.mark.slow   # llama.cpp's converter, then its binaries on six prompts per artifact (~40 s)
def test_the_llama_cpp_stage_runs_the_engine_and_names_a_block_read_one_row_late(tmp_path):
    """With a llama.cpp build and the target as its converter writes it: each drafter (and
    the DSpark drafter's q8_0 variant) exported and run by llama.cpp with the --spec-type
    `dspark export` advises, lossless, every BF16 draft the reference runtime's (near ties
    aside); the plain DFlash drafter's run with the draft-dflash llama.cpp picks for the file
    is named as read one row late. The same verdict on that report with the
    misread in the advised run fails the stage."""
    from support.llama_cpp import engine

    from dspark_convert.commands.gate import engine_verdict
    from dspark_convert.evaluation.report import read_report

    llama = engine()
    target_gguf = llama.convert(GOLDEN_TARGET, tmp_path / "target.gguf")
    policy = _policy(tmp_path, _entry("vanilla_conf_markov", require=["llama.cpp"],
                                      target_gguf=str(target_gguf)),
                     _entry("dflash_shared", quantize=[], require=["llama.cpp", "strata.open"],
                            target_gguf=str(target_gguf)))
    text = policy.read_text().replace('prompts = "prompts.jsonl"\nmax_new_tokens = 8\n',
                                      f'max_new_tokens = 16\nllama_cpp = "{llama.bin}"\n')
    policy.write_text(text)
    out = tmp_path / "out"
    proc = run_cli("gate", str(policy), "-o", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = _report(out)
    dspark = report.entry("vanilla_conf_markov").stage("llama.cpp").detail
    assert "bf16: draft-dspark on " in dspark and "q8_0: draft-dspark on " in dspark
    n, _, m = dspark.split(" drafts the reference's")[0].split("lossless, ")[1].partition(" of ")
    assert n == m and int(n) > 0                       # every BF16 DSpark draft equal
    dflash = report.entry("dflash_shared").stage("llama.cpp").detail
    assert "bf16: draft-dspark on " in dflash
    assert "with draft-dflash (which llama.cpp picks for the file)" in dflash
    assert "its draft is ours read 1 row(s) late" in dflash
    engine_report = read_report(out / "dflash_shared" / "eval-llama.cpp" / "report.json")
    assert engine_report.engine.target_gguf == str(target_gguf)

    # the misread in the run the gate judges: the stage fails, naming it
    runs = {r.spec_type: r for r in engine_report.engine_runs if r.kind == "drafter"}
    late = next(p.proposals for p in runs["draft-dflash"].prompts
                if p.proposals.first_difference is not None)
    advised = runs["draft-dspark"]
    broken = advised.model_copy(update={"prompts": [advised.prompts[0].model_copy(
        update={"proposals": late})] + advised.prompts[1:]})
    edited = engine_report.model_copy(update={"engine_runs": [
        broken if r is advised else r for r in engine_report.engine_runs]})
    with pytest.raises(GateEngineError, match=r"bf16: llama.cpp's \(draft-dspark\) draft .* "
                                              r"read 1 row\(s\) late"):
        engine_verdict(edited, ["bf16"])


# --- the example policy, Ctrl-C, CI -------------------------------------------------------------

@pytest.mark.slow   # the whole example policy in a real process (~25 s on 2 cores)
def test_the_example_policy_passes(tmp_path):
    out = tmp_path / "gate"
    proc = run_process("gate", str(GOLDEN_POLICY), "-o", str(out), env={"OMP_NUM_THREADS": "1"},
                       timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = _report(out)
    assert report.passed and [e.name for e in report.entries] == [*SHA,
                                                                  "gemma4_vanilla_conf_markov"]
    for e in report.entries:
        assert e.stage("reproducibility").status == "passed"
        assert all(s.status in ("passed", "not_run") for s in e.stages)
    # The Gemma4 drafter measures DeepSpec's tau on DeepSpec's prompts (its reference.json:
    # 4.42 at temperature 0), BF16 and Q8_0.
    gemma4 = report.entries[2].stage("regression").detail
    assert "bf16 tau 4.417" in gemma4 and "q8_0 tau" in gemma4
    _junit(out)


@pytest.mark.slow   # a real gate process on a pty, interrupted mid-run (~10 s)
def test_a_real_sigint_leaves_gate_json_marked_incomplete(tmp_path):
    policy = _policy(tmp_path, _entry("vanilla_conf_markov", max_new_tokens=64),
                     _entry("dflash_shared"))
    policy.write_text(policy.read_text().replace('prompts = "prompts.jsonl"\n', ""))  # 16 prompts
    out = tmp_path / "out"
    proc, seen, sent = interrupt_on_terminal(
        dspark_cmd("gate", str(policy), "-o", str(out)),
        b"vanilla_conf_markov smoke:",                # during the first drafter's eval
        seconds=300, env=child_env({"OMP_NUM_THREADS": "1"}))
    text = seen.decode(errors="replace").replace("\r", "\n")
    assert sent, text[-800:]
    assert proc.wait() == 130, text[-800:]
    errors = [line for line in text.splitlines() if "error:" in line]
    assert len(errors) == 1 and "interrupted" in errors[0] and "complete: false" in errors[0]
    assert "Traceback" not in text
    report = _report(out)
    assert not report.complete and not report.passed and "interrupted" in report.incomplete_reason
    first = _statuses(report, "vanilla_conf_markov")
    assert first["smoke"] == "passed" and first["eval"] == "not_run"
    assert set(_statuses(report, "dflash_shared").values()) == {"not_run"}
    assert "INCOMPLETE" in (out / "gate.md").read_text()
    _junit(out)
    assert temp_siblings(out) == []


def test_the_workflow_and_make_gate_run_dspark_gate_on_the_example_policy():
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "gate.yml").read_text())
    steps = workflow["jobs"]["gate"]["steps"]
    runs = [s.get("run", "").strip() for s in steps]
    assert any("-c constraints.txt" in r for r in runs)
    assert ".venv/bin/dspark gate release/golden.toml -o build/gate --force" in runs
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact"))
    assert upload["if"] == "always()" and upload["with"]["path"] == "build/gate/"
    makefile = (ROOT / "Makefile").read_text()
    assert "\ngate: $(STAMP)\n\t$(BIN)/dspark gate release/golden.toml -o build/gate --force\n" in makefile
    assert not (ROOT / "scripts" / "gate.sh").exists() and not (ROOT / "release" / "artifacts.txt").exists()


def _action_steps(inputs: dict[str, str], action_path: Path) -> list[tuple[dict, str]]:
    """action.yml's shell steps with GitHub's expressions substituted: (env, script)."""
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    assert set(action["inputs"]) == {"policy", "baseline", "output", "python-version"}
    values = {f"inputs.{k}": v for k, v in inputs.items()} | {"github.action_path": str(action_path)}

    def sub(text: str) -> str:
        for key, value in values.items():
            text = text.replace("${{ " + key + " }}", value)
        assert "${{" not in text, text
        return text

    steps = action["runs"]["steps"]
    assert steps[0]["uses"].startswith("actions/setup-python@")
    assert steps[0]["with"]["python-version"] == "${{ inputs.python-version }}"
    return [({k: sub(str(v)) for k, v in s.get("env", {}).items()}, sub(s["run"]))
            for s in steps[1:]]


@pytest.mark.slow   # pip installs the package into a fresh venv (offline), then a gate (~20 s)
def test_the_composite_action_runs_the_gate_in_a_few_lines(passed, tmp_path):
    """The action's own shell steps, in order, as a runner would run them after
    setup-python: the install into a fresh venv (pip offline: the dependencies are this
    environment's, through PYTHONPATH, and the package is built from a copy of the
    repository), then `dspark gate` with the inputs, a baseline included."""
    _, passed_out, _ = passed
    action_path = tmp_path / "action"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (action_path / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, action_path / name)
    for name in ("action.yml", "release/golden.toml", "dspark_convert"):
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, action_path / name, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (action_path / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, action_path / name)
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    policy = _policy(workspace, _entry("vanilla_conf_markov", min_tau=2.0, max_tau_drop=0.05,
                                       max_acceptance_drop=0.05))
    site = next(p for p in sys.path if p.endswith("site-packages"))
    summary = tmp_path / "summary.md"
    env = child_env({"RUNNER_TEMP": str(tmp_path / "runner"), "PYTHONPATH": site,
                     # pip reads "0" as --no-build-isolation (an option named no-...)
                     "PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0",
                     "GITHUB_STEP_SUMMARY": str(summary), "OMP_NUM_THREADS": "1",
                     "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    (tmp_path / "runner").mkdir()
    inputs = {"policy": policy.name, "baseline": str(passed_out), "output": "gate-out",
              "python-version": "3.12"}
    for step_env, script in _action_steps(inputs, action_path):
        proc = subprocess.run(["bash", "-e", "-c", script], cwd=workspace, env={**env, **step_env},
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    # the gate ran the package the action installed, not this checkout
    where = subprocess.run([str(tmp_path / "runner" / "dspark-venv" / "bin" / "python"), "-c",
                            "import dspark_convert; print(dspark_convert.__file__)"], env=env,
                           cwd=workspace, capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(tmp_path / "runner" / "dspark-venv")), where
    report = _report(workspace / "gate-out")
    assert report.passed and report.baseline == str(passed_out)
    assert "(baseline " in report.entries[0].stage("regression").detail
    assert summary.read_text().startswith("# dspark gate: PASSED")
