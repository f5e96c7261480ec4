"""One format version: manifest.json's format_version is the one drafter.gguf's
dspark.format_version holds (1 for Qwen3, 2 for Gemma4), convert and quantize write it so,
validate refuses an artifact whose two disagree (49), and the one legacy case
docs/ARTIFACT_FORMAT.md names (a Gemma4 manifest of version 1) is a warning that --strict
fails."""

from __future__ import annotations

import json
import shutil

import pytest

from support.cli import assert_refused, run_cli
from support.gemma4 import GEMMA4_DRAFTERS
from dspark_convert import errors as E
from dspark_convert.artifact.format import FORMAT_VERSIONS
from dspark_convert.commands.convert import convert
from dspark_convert.commands.quantize import quantize_artifact
from dspark_convert.commands.validate import validate_artifact
from dspark_convert.formats.gguf_reader import read_gguf


@pytest.fixture(scope="module")
def gemma4_artifact(tmp_path_factory):
    out = tmp_path_factory.mktemp("gemma4") / "art"
    convert(GEMMA4_DRAFTERS["gemma4_dflash"], out)
    return out


def _versions(art):
    manifest = json.loads((art / "manifest.json").read_text())
    gguf = read_gguf(art / "drafter.gguf")
    return manifest["format_version"], gguf.kv["dspark.format_version"].value


def _with_manifest_version(src, dst, version):
    shutil.copytree(src, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    manifest["format_version"] = version
    (dst / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return dst


def _check(report, name="manifest.format_version"):
    return next(c for c in report.checks if c.name == name)


def test_convert_writes_the_files_version_in_the_manifest(converted, gemma4_artifact):
    assert _versions(converted["reference"]) == (1, 1) == (FORMAT_VERSIONS["qwen3-dspark"],) * 2
    assert _versions(gemma4_artifact) == (2, 2) == (FORMAT_VERSIONS["gemma4-dspark"],) * 2
    for art in (converted["reference"], gemma4_artifact):
        report = validate_artifact(art)
        assert report.ok and report.warnings == 0, report.first_failure
        assert _check(report).status == "passed"


def test_a_qwen3_manifest_of_version_2_is_refused(tmp_path, converted):
    art = _with_manifest_version(converted["reference"], tmp_path / "art", 2)
    proc = run_cli("validate", str(art))
    assert_refused(proc, E.FormatVersionMismatchError,
                   ["manifest.json", "'format_version' is 2", "dspark.format_version is 1"])
    assert _check(validate_artifact(art)).status == "failed"


def test_a_legacy_gemma4_manifest_of_version_1_is_a_warning(tmp_path, gemma4_artifact):
    """The artifacts written before the manifest carried the family's version: the file and
    every hash are what they were; only the record is old. --strict (a release gate) fails
    it, so a release re-converts."""
    art = _with_manifest_version(gemma4_artifact, tmp_path / "art", 1)
    report = validate_artifact(art)
    check = _check(report)
    assert report.ok and check.status == "warning"
    assert "format_version 1" in check.detail and "convert" in check.detail
    assert run_cli("validate", str(art)).returncode == 0
    assert run_cli("validate", str(art), "--strict").returncode == E.StrataRuleError.exit_code


def test_quantize_of_a_legacy_gemma4_artifact_writes_the_files_version(tmp_path,
                                                                        gemma4_artifact):
    parent = _with_manifest_version(gemma4_artifact, tmp_path / "parent", 1)
    quantize_artifact(parent, tmp_path / "q8", "q8_0")
    assert _versions(tmp_path / "q8") == (2, 2)
    report = validate_artifact(tmp_path / "q8")
    assert report.ok and report.warnings == 0 and _check(report).status == "passed"


@pytest.mark.parametrize("version", [5, 0, True, 2.0, "2"])
def test_a_manifest_version_no_format_has_is_a_schema_refusal(tmp_path, gemma4_artifact,
                                                              version):
    art = _with_manifest_version(gemma4_artifact, tmp_path / "art", version)
    assert_refused(run_cli("validate", str(art)), E.ManifestError, ["format_version"])
