"""The commands a Gemma4 drafter reaches, as users run them: `dspark
inspect` of both golden Gemma4 checkpoints (both config forms DeepSpec writes) and of their
artifacts, through the CLI, text and --json; and `dspark export --engine llama.cpp` refusing
each Gemma4 artifact with its own code (105) in one line, nothing written, not even over an
existing output with --force.

Elsewhere: the Hub (pulls of a Gemma4 drafter and target, `dspark lock`):
tests/test_gemma4_hub.py; the engine reports: tests/test_gemma4_engines.py; convert and
validate: tests/test_gemma4_artifact.py, tests/test_gemma4_target.py."""

from __future__ import annotations

import json
import shutil

import pytest

from support.cli import assert_refused, run_cli
from support.gemma4 import GEMMA4_DRAFTERS, GEMMA4_TARGET, GEMMA4_TRAINER_CONFIGS
from support.llama_cpp import rewrite_gguf
from dspark_convert.commands.convert import convert
from dspark_convert.commands.inspection import InspectResult
from dspark_convert.errors import FamilyExportError, MissingTensorError
from dspark_convert.formats.gguf_reader import read_gguf

NAMES = sorted(GEMMA4_DRAFTERS)
# Source tensors of each checkpoint (embedding and head stripped at convert) and the artifact's.
COUNTS = {"gemma4_vanilla_conf_markov": (35, 33), "gemma4_dflash": (31, 29)}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma4-commands")
    out = {}
    for name in NAMES:
        out[name] = root / name
        convert(GEMMA4_DRAFTERS[name], out[name])
    return out


def trainer_form(tmp_path, name):
    """The checkpoint with the config.json DeepSpec's trainer writes (gemma4_unified_text)."""
    src = tmp_path / f"{name}-trainer"
    shutil.copytree(GEMMA4_DRAFTERS[name], src)
    shutil.copy(GEMMA4_TRAINER_CONFIGS[name], src / "config.json")
    return src


def inspect_json(path) -> InspectResult:
    proc = run_cli("inspect", str(path), "--json")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    return InspectResult.model_validate_json(proc.stdout)      # the model the schema is made from


# --- dspark inspect --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_inspect_both_checkpoint_forms(tmp_path, name):
    released, trainer = GEMMA4_DRAFTERS[name], trainer_form(tmp_path, name)
    shown = run_cli("inspect", str(released))
    assert shown.returncode == 0, shown.stderr
    assert f"checkpoint: {released}" in shown.stdout
    assert "gemma4-dspark (Gemma4DSparkModel)" in shown.stdout
    assert "k_eq_v (no v_proj; V = RMS norm of k_proj)" in shown.stdout
    a, b = inspect_json(released), inspect_json(trainer)
    assert (a.kind, a.contract.family, a.problem) == ("checkpoint", "gemma4-dspark", None)
    assert len(a.rows) == COUNTS[name][0]
    assert {r.name for r in a.rows if r.status == "stripped"} == {"embed_tokens.weight",
                                                                          "lm_head.weight"}
    assert {r.status for r in a.rows} == {"ok", "stripped"}
    # The two forms: one table, one contract but for the form read and the unused fields it
    # records (the released form carries four Gemma4TextConfig defaults more).
    assert a.rows == b.rows
    form = {"config_form", "inherited_unused"}
    assert a.contract.model_dump(exclude=form) == b.contract.model_dump(exclude=form)
    assert (a.contract.config_form.model_type, b.contract.config_form.model_type) == (
        "gemma4_text", "gemma4_unified_text")


@pytest.mark.parametrize("name", NAMES)
def test_inspect_the_artifact_by_directory_and_by_file(artifacts, name):
    art = artifacts[name]
    shown = run_cli("inspect", str(art))
    assert shown.returncode == 0, shown.stderr
    assert f"artifact: {art}" in shown.stdout and "gemma4-dspark (Gemma4DSparkModel)" in shown.stdout
    by_dir, by_file = inspect_json(art), inspect_json(art / "drafter.gguf")
    assert by_dir == by_file
    assert (by_dir.kind, by_dir.contract.family, by_dir.problem) == ("artifact", "gemma4-dspark", None)
    # Every tensor of the file, in its order, each where the contract expects it.
    gguf = read_gguf(art / "drafter.gguf")
    assert [r.name for r in by_dir.rows] == [t.name for t in gguf.tensors]
    assert len(by_dir.rows) == COUNTS[name][1] and {r.status for r in by_dir.rows} == {"ok"}
    assert {"blk.1.layer_output_scale.weight", "blk.1.post_ffw_norm.weight"} <= {
        r.name for r in by_dir.rows}


def test_inspect_an_artifact_missing_a_norm_lists_it_and_refuses(artifacts, tmp_path):
    """The table still lists every row; the one missing is named, with the converter's code."""
    bad = rewrite_gguf(artifacts["gemma4_dflash"] / "drafter.gguf", tmp_path / "bad.gguf",
                       drop_tensors=("blk.1.post_ffw_norm.weight",))
    proc = run_cli("inspect", str(bad), "--json")
    assert proc.returncode == MissingTensorError.exit_code
    assert proc.stderr.strip() == ("error: bad.gguf: tensor 'blk.1.post_ffw_norm.weight' is "
                                   "missing; expected GGUF shape [64]")
    result = InspectResult.model_validate_json(proc.stdout)
    missing = [r for r in result.rows if r.status != "ok"]
    assert [(r.name, r.status) for r in missing] == [("blk.1.post_ffw_norm.weight", "missing")]
    assert result.problem["error"] == "MissingTensorError"


# --- dspark export --engine llama.cpp ----------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_export_refuses_each_gemma4_artifact_nothing_written(artifacts, tmp_path, name):
    art = artifacts[name]
    before = {p.name: p.read_bytes() for p in art.iterdir()}
    target = GEMMA4_TARGET / "model.safetensors"   # a file that exists: refused before it is read
    out = tmp_path / "drafter.llama.gguf"
    proc = run_cli("export", str(art), "--engine", "llama.cpp", "--target-gguf", str(target),
                   "-o", str(out))
    assert_refused(proc, FamilyExportError,
                   [f"{art / 'drafter.gguf'}", "gemma4-dspark", "export", "llama.cpp 0c1e570"])
    assert FamilyExportError.exit_code == 105
    assert list(tmp_path.iterdir()) == []
    assert {p.name: p.read_bytes() for p in art.iterdir()} == before


def test_export_refusal_leaves_an_existing_output_alone_with_force_and_json(artifacts, tmp_path):
    out = tmp_path / "drafter.llama.gguf"
    out.write_bytes(b"an earlier export")
    proc = run_cli("export", str(artifacts["gemma4_vanilla_conf_markov"]), "--engine", "llama.cpp",
                   "--target-gguf", str(tmp_path / "target.gguf"), "-o", str(out), "--force",
                   "--json")
    assert proc.returncode == 105 and len(proc.stderr.splitlines()) == 1
    report = json.loads(proc.stdout)
    assert (report["ok"], report["error"], report["exit_code"]) == (False, "FamilyExportError", 105)
    assert out.read_bytes() == b"an earlier export"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["drafter.llama.gguf"]
