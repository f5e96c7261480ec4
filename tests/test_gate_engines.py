"""The gate's engines and a speculators drafter's layout, through the real CLI:

- ``require`` names the engines the gate runs in a stage of their own (llama.cpp,
  dspark-mlx) beside validate's (strata.open, strata.run); ``[defaults] dspark_mlx`` names
  dspark-mlx's interpreter; ``sample_from_anchor`` states a speculators drafter's block
  layout for convert. Each key checked as strictly as the others (120, one line);
- a drafter of a family llama.cpp's export does not take (Gemma4) that requires llama.cpp:
  its stage fails, named, gate.json written, exit 121, and llama.cpp never runs (its
  binaries here are tripwires recording any run); `dspark eval --engine llama.cpp` lists
  llama.cpp's runs of it as not run, with export's reason;
- a speculators-format drafter without ``sample_from_anchor`` gated with the key;
- dspark-mlx's stage: a missing interpreter fails it (114), a real run of the golden DSpark
  drafter passes it, and a drafter dspark-mlx's loader refuses fails it, named.
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from support.cli import assert_refused, run_cli
from support.llama_cpp import write_target_gguf
from support.paths import GOLDEN_TARGET, TRAINED_DRAFTERS

from dspark_convert.commands.gate_policy import RUN_ENGINES, load_policy
from dspark_convert.commands.gate_report import GateReport
from dspark_convert.errors import (
    FamilyExportError,
    GateFailedError,
    GatePolicyError,
)
from dspark_convert.evaluation import engine_llama_cpp as L

ROOT = Path(__file__).resolve().parent.parent
GEMMA4 = ROOT / "golden" / "reference" / "gemma4"
GEMMA4_DRAFTER = GEMMA4 / "gemma4_vanilla_conf_markov" / "draft"
SPECULATORS = ROOT / "golden" / "speculators"
PROMPT = '{"id": "a", "prompt_ids": [1, 17, 33, 90, 250, 7]}\n'


def _policy(directory: Path, drafters: str, defaults: str = "", prompt: str = PROMPT) -> Path:
    """A one-prompt, four-token policy beside its prompt set."""
    (directory / "prompts.jsonl").write_text(prompt)
    path = directory / "policy.toml"
    path.write_text(f'[defaults]\nprompts = "prompts.jsonl"\nmax_new_tokens = 4\ndevice = "cpu"\n'
                    f'{defaults}\n{drafters}')
    return path


def _drafter(source: Path, target: Path = GOLDEN_TARGET, extra: str = "", name: str = "d") -> str:
    return f'[[drafter]]\nname = "{name}"\nsource = "{source}"\ntarget = "{target}"\n{extra}'


def _gate(policy: Path, out: Path) -> tuple[object, GateReport]:
    proc = run_cli("gate", str(policy), "-o", str(out))
    return proc, GateReport.model_validate_json((out / "gate.json").read_text())


def _tripwires(directory: Path) -> tuple[Path, Path]:
    """llama.cpp's binaries as programs that record any run of theirs and fail."""
    runs = directory / "runs.txt"
    bins = directory / "bin"
    bins.mkdir()
    for name in L.BINARIES:
        p = bins / name
        p.write_text(f"#!{sys.executable}\nimport sys\nopen({str(runs)!r}, 'a').write('ran\\n')\n"
                     "sys.exit(99)\n")
        p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return bins, runs


# --- the policy's keys ---------------------------------------------------------------------------

def test_the_new_keys_load(tmp_path):
    (tmp_path / "mlx").mkdir()
    policy = _policy(tmp_path, _drafter(SPECULATORS / "no_layout", extra=(
        'require = ["strata.open", "dspark-mlx", "llama.cpp"]\nsample_from_anchor = true\n')),
        defaults='dspark_mlx = "mlx/python"\n')
    [entry] = load_policy(policy).entries
    assert entry.require == ("strata.open", "dspark-mlx", "llama.cpp")
    assert entry.sample_from_anchor is True
    assert entry.dspark_mlx == tmp_path / "mlx" / "python"       # relative to the policy
    [plain] = load_policy(_policy(tmp_path, _drafter(GOLDEN_TARGET))).entries
    assert plain.sample_from_anchor is None and plain.dspark_mlx is None


@pytest.mark.parametrize("extra, defaults, needles", [
    ('sample_from_anchor = "true"\n', "", ["drafter[0] 'd': key 'sample_from_anchor': expected "
                                           "true or false, found 'true' (str)"]),
    ("sample_from_anchor = 1\n", "", ["key 'sample_from_anchor': expected true or false"]),
    ('require = ["mlx"]\n', "", ["key 'require[0]': expected 'strata.open', 'strata.run', "
                                  "'llama.cpp' or 'dspark-mlx', found 'mlx'"]),
    ('require = ["dspark-mlx", "dspark-mlx"]\n', "", ["'dspark-mlx' is listed twice"]),
    ("", 'dspark_mlx = ""\n', ["[defaults]: key 'dspark_mlx'"]),
    ("", "dspark_mlx = true\n", ["[defaults]: key 'dspark_mlx'", "found True (bool)"]),
    ("", 'dspark-mlx = "python"\n', ["[defaults]: key 'dspark-mlx': unknown key", "dspark_mlx"]),
])
def test_bad_values_of_the_new_keys_are_refused_before_anything_runs(tmp_path, extra, defaults,
                                                                     needles):
    policy = _policy(tmp_path, _drafter(TRAINED_DRAFTERS["dflash_shared"], extra=extra),
                     defaults=defaults)
    out = tmp_path / "out"
    proc = run_cli("gate", str(policy), "-o", str(out))
    assert_refused(proc, GatePolicyError, needles)
    assert not out.exists()


def test_the_gate_runs_a_stage_for_each_engine_the_policy_may_require():
    from dspark_convert.commands.gate import ENGINE_STAGES, NEEDS
    from dspark_convert.commands.gate_report import STAGES

    assert set(ENGINE_STAGES) == set(RUN_ENGINES)
    assert all(name in STAGES and NEEDS[name] == ("validate",) for name in RUN_ENGINES)


# --- a family llama.cpp's export does not take ------------------------------------------------------

@pytest.fixture(scope="module")
def gemma4_artifact(tmp_path_factory) -> Path:
    from dspark_convert.commands.convert import convert

    out = tmp_path_factory.mktemp("gemma4") / "art"
    convert(GEMMA4_DRAFTER, out, target=GEMMA4 / "target")
    return out


def test_a_gemma4_drafter_requiring_llama_cpp_fails_its_stage_121(tmp_path):
    """No KeyError after five passed stages: the llama.cpp stage fails, naming the family
    and export's refusal; gate.json, gate.md and junit.xml are written; llama.cpp never ran."""
    bins, runs = _tripwires(tmp_path)
    gguf = write_target_gguf(tmp_path / "target.gguf")
    policy = _policy(tmp_path, _drafter(GEMMA4_DRAFTER, GEMMA4 / "target", extra=(
        f'require = ["llama.cpp"]\ntarget_gguf = "{gguf}"\n')),
        defaults=f'llama_cpp = "{bins}"\n',
        prompt=(GEMMA4 / "prompts.jsonl").read_text().splitlines()[0] + "\n")
    out = tmp_path / "out"
    proc, report = _gate(policy, out)
    assert_refused(proc, GateFailedError, ["d (llama.cpp: GateEngineError: bf16: llama.cpp did "
                                           "not run it: dspark export refuses it: "])
    stages = {s.name: s for s in report.entry("d").stages}
    assert [s for s in ("pin", "convert", "validate", "smoke", "eval")
            if stages[s].status not in ("passed", "recorded")] == []
    stage = stages["llama.cpp"]
    assert (stage.status, stage.error, stage.exit_code) == ("failed", "GateEngineError", 126)
    assert "gemma4-dspark" in stage.detail and "softcap" in stage.detail
    assert stages["dspark-mlx"].status == "not_run"
    assert {"gate.json", "gate.md", "junit.xml"} <= {p.name for p in out.iterdir()}
    assert not runs.exists()                    # neither binary ran, not even the target alone


def test_eval_lists_llama_cpps_runs_of_a_gemma4_drafter_as_not_run(tmp_path, gemma4_artifact):
    bins, runs = _tripwires(tmp_path)
    gguf = write_target_gguf(tmp_path / "target.gguf")
    out = tmp_path / "report"
    proc = run_cli("eval", str(gemma4_artifact), "--target", str(GEMMA4 / "target"),
                   "--prompts", str(GEMMA4 / "prompts.jsonl"), "--max-new-tokens", "4",
                   "--threshold", "0", "--engine", f"llama.cpp={bins}", "--target-gguf",
                   str(gguf), "-o", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "report.json").read_text())
    mine = [n for n in report["not_run"] if n["engine"] == "llama.cpp"]
    assert [(n["kind"], n["artifact"]) for n in mine] == [("drafter", "art"), ("target", None)]
    assert mine[0]["reason"].startswith("dspark export refuses it: ")
    assert "a gemma4-dspark artifact" in mine[0]["reason"]
    assert report["engine_runs"] == [] and not runs.exists()
    # What `dspark export` says of it, and export's check of a target GGUF, when asked.
    exported = run_cli("export", str(gemma4_artifact), "--engine", "llama.cpp", "--target-gguf",
                       str(gguf), "-o", str(tmp_path / "d.gguf"))
    assert_refused(exported, FamilyExportError, ["a gemma4-dspark artifact"])
    from dspark_convert.artifact.format import GGUF_FILE, contract_from_metadata, read_metadata
    from dspark_convert.commands import export as X
    from dspark_convert.formats.gguf_reader import read_gguf

    kv = read_metadata(read_gguf(gemma4_artifact / GGUF_FILE), path="a")
    with pytest.raises(FamilyExportError, match="cannot be checked against a gemma4-dspark "
                       "artifact: llama.cpp 0c1e570's export takes the qwen3-dspark family only"):
        X.check_target_gguf(X.read_target_gguf(gguf), contract_from_metadata(kv, path="a"), kv,
                            str(gguf), [])


# --- a speculators drafter's layout ------------------------------------------------------------------

def test_a_speculators_drafter_without_its_layout_is_gated_with_the_key(tmp_path):
    """golden/speculators/no_layout (its config has no sample_from_anchor): refused by
    convert (33) without the key; with ``sample_from_anchor = true`` converted (the layout
    recorded as stated by the option), validated, smoke-run and evaluated."""
    policy = _policy(tmp_path, _drafter(SPECULATORS / "no_layout",
                                        extra="sample_from_anchor = true\n")
                     + "\n" + _drafter(SPECULATORS / "no_layout", name="no_key"))
    out = tmp_path / "out"
    proc, report = _gate(policy, out)
    assert_refused(proc, GateFailedError, ["no_key (convert: SampleFromAnchorMissingError: "])
    keyed = report.entry("d")
    assert keyed.passed, [(s.name, s.status, s.detail) for s in keyed.stages]
    assert [s.name for s in keyed.stages if s.status == "passed"] == [
        "pin", "convert", "validate", "smoke", "eval"]
    manifest = json.loads((out / "d" / "bf16" / "manifest.json").read_text())
    assert manifest["source"]["speculators"]["layout_stated_by"] == "option"
    failed = report.entry("no_key").stage("convert")
    assert failed.exit_code == 33 and "--sample-from-anchor" in failed.detail


def test_the_key_on_a_deepspec_source_is_convert_s_refusal(tmp_path):
    policy = _policy(tmp_path, _drafter(TRAINED_DRAFTERS["vanilla_conf_markov"],
                                        extra="sample_from_anchor = true\n"))
    proc, report = _gate(policy, tmp_path / "out")
    assert proc.returncode == GateFailedError.exit_code
    stage = report.entry("d").stage("convert")
    assert stage.status == "failed" and "sample-from-anchor" in stage.detail.replace("_", "-")


# --- dspark-mlx's stage -------------------------------------------------------------------------------

def test_a_missing_dspark_mlx_interpreter_fails_its_stage(tmp_path):
    policy = _policy(tmp_path, _drafter(TRAINED_DRAFTERS["vanilla_conf_markov"],
                                        extra='require = ["dspark-mlx"]\n'),
                     defaults='dspark_mlx = "nowhere/python"\n')
    proc, report = _gate(policy, tmp_path / "out")
    assert_refused(proc, GateFailedError, ["d (dspark-mlx: MlxInstallError: "])
    stage = report.entry("d").stage("dspark-mlx")
    assert (stage.status, stage.exit_code) == ("failed", 114)
    assert "nowhere/python does not exist" in stage.detail
    assert report.entry("d").stage("llama.cpp").status == "not_run"


@pytest.fixture(scope="module")
def mlx_python() -> Path:
    from support import dspark_mlx

    return dspark_mlx.engine()


@pytest.mark.slow   # dspark-mlx's runs (its import and MLX's start: ~10 s each) in two gates
def test_dspark_mlx_stage_passes_the_golden_dspark_drafter_and_fails_the_dflash_one(tmp_path,
                                                                                    mlx_python):
    policy = _policy(tmp_path, _drafter(TRAINED_DRAFTERS["vanilla_conf_markov"],
                                        extra='require = ["dspark-mlx"]\nquantize = ["q8_0"]\n')
                     + "\n" + _drafter(TRAINED_DRAFTERS["dflash_shared"], name="dflash",
                                       extra='require = ["dspark-mlx"]\n'),
                     defaults=f'dspark_mlx = "{mlx_python}"\n')
    out = tmp_path / "out"
    proc, report = _gate(policy, out)
    assert_refused(proc, GateFailedError, ["dflash (dspark-mlx: GateEngineError: bf16: dspark-mlx "
                                           "did not run it: "])
    stage = report.entry("d").stage("dspark-mlx")
    assert stage.status == "passed", stage.detail
    assert stage.detail.startswith("bf16: generate_eager on 1 prompt(s), lossless, ")
    assert [(r.kind, r.artifact, r.spec_type) for r in stage.engine_runs] == [
        ("target", None, None), ("drafter", "bf16", "generate_eager")]
    assert all(r.system_info for r in stage.engine_runs)
    assert (out / "d" / "eval-dspark-mlx" / "report.json").is_file()
    refused = report.entry("dflash").stage("dspark-mlx")
    assert refused.status == "failed" and "ZeroDivisionError" in refused.detail
