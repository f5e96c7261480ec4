"""A drafter and a target of different families, both ways, and a Gemma4 target (its
text config nested) where the tool reads Qwen3 targets only yet: refused in one line
naming the model_type and the families (68), never with the Qwen3 reader's first missing
field or a geometry detail; nothing written."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import REFERENCE_DRAFTER
from support.cli import assert_refused, run_cli
from support.gemma4 import GEMMA4_DRAFTERS, GEMMA4_TARGET
from support.paths import GOLDEN_TARGET
from dspark_convert.errors import TargetFamilyError
from dspark_convert.target.model import open_target


def test_convert_a_qwen3_drafter_against_a_gemma4_target(tmp_path):
    out = tmp_path / "out"
    proc = run_cli("convert", str(REFERENCE_DRAFTER), "--target", str(GEMMA4_TARGET), "-o", str(out))
    assert_refused(proc, TargetFamilyError, ["target", "config.json", "gemma4_unified", "gemma4-dspark"])
    assert "hidden_size" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("model_type", ["gemma4", "gemma4_unified", "gemma4_text", "gemma4_unified_text"])
def test_every_gemma4_model_type_is_named(tmp_path, model_type):
    target = tmp_path / "target"
    shutil.copytree(GEMMA4_TARGET, target)
    cfg = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps(dict(cfg, model_type=model_type)))
    with pytest.raises(TargetFamilyError) as exc:
        open_target(str(target))
    assert model_type in exc.value.message and exc.value.exit_code == 68


def test_smoke_against_a_gemma4_target(converted, tmp_path):
    proc = run_cli("smoke", str(converted["reference"]), "--target", str(GEMMA4_TARGET),
                   "--prompt-ids", "2,17,33")
    assert_refused(proc, TargetFamilyError, ["gemma4_unified", "Qwen3 targets only"])


def test_convert_a_gemma4_drafter_against_a_qwen3_target(tmp_path):
    out = tmp_path / "out"
    proc = run_cli("convert", str(GEMMA4_DRAFTERS["gemma4_dflash"]), "--target", str(GOLDEN_TARGET),
                   "-o", str(out))
    assert_refused(proc, TargetFamilyError, ["'qwen3'", "qwen3-dspark", "Gemma4DSparkModel",
                                             "gemma4_unified"])
    assert list(tmp_path.iterdir()) == []


def test_validate_a_gemma4_artifact_against_a_qwen3_target(tmp_path):
    art = tmp_path / "art"
    assert run_cli("convert", str(GEMMA4_DRAFTERS["gemma4_dflash"]), "-o", str(art)).returncode == 0
    proc = run_cli("validate", str(art), "--target", str(GOLDEN_TARGET))
    assert proc.returncode == TargetFamilyError.exit_code, proc.stderr
    assert "qwen3-dspark" in proc.stderr and "gemma4-dspark" in proc.stderr
