"""`sample_from_anchor`, the block layout: one rule for every source (docs/SPECULATORS.md,
"`sample_from_anchor`: never a default").

DeepSpec's own config.json holds no `sample_from_anchor` (vLLM and SGLang read that as true,
the anchor-first layout the artifact format records); where a config holds it, DeepSpec's (Qwen3
or Gemma4) or speculators' (its top level or its transformer_layer_config), only a JSON `true`
is that layout: false is the anchor-as-bonus layout (34), and any other value (0, 1, "true",
"false", null) states none (13). `dspark export --engine deepspec` writes the config back,
and vLLM and SGLang take that field as the layout: so the export writes only what the artifact
has, and validate holds the manifest's source.config to the same rule.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.cli import assert_refused, run_cli
from support.edited import convert_then_export, edited_copy
from support.paths import GOLDEN, GOLDEN_TARGET, REFERENCE_DRAFTER
from dspark_convert.errors import (AnchorLayoutError, ConfigError, ExportArtifactError,
                                   ManifestMismatchError)

SPEC = GOLDEN / "speculators" / "vanilla_conf_markov"
GEMMA4 = GOLDEN / "reference" / "gemma4"
GEMMA4_DRAFTER = GEMMA4 / "gemma4_vanilla_conf_markov" / "draft"

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# Every value that is not a JSON true, and what it gets.
NOT_TRUE = [(False, AnchorLayoutError), (0, ConfigError), (1, ConfigError),
            ("false", ConfigError), ("true", ConfigError), (None, ConfigError),
            ([True], ConfigError), ({"value": True}, ConfigError)]


def _source(tmp_path: Path, base: Path, edit) -> Path:
    return edited_copy(base, tmp_path / "src", edit)


def _refused_with_nothing_written(tmp_path: Path, src: Path, target: Path, error, field: str):
    before = (src / "config.json").read_bytes()
    out = tmp_path / "out"
    proc = run_cli("convert", str(src), "--target", str(target), "-o", str(out))
    assert_refused(proc, error, (f"field '{field}'",))
    assert not out.exists() and not [p for p in tmp_path.iterdir() if "tmp" in p.name]
    assert (src / "config.json").read_bytes() == before


def _top(value):
    return lambda c: c.update(sample_from_anchor=value)


def _nested(value):
    return lambda c: c["transformer_layer_config"].update(sample_from_anchor=value)


@pytest.mark.parametrize("value,error", NOT_TRUE, ids=[json.dumps(v) for v, _ in NOT_TRUE])
def test_deepspec_qwen3_config_holds_true_or_nothing(tmp_path, value, error):
    src = _source(tmp_path, REFERENCE_DRAFTER, _top(value))
    _refused_with_nothing_written(tmp_path, src, GOLDEN_TARGET, error, "sample_from_anchor")


@pytest.mark.parametrize("value,error", [(False, AnchorLayoutError), ("false", ConfigError),
                                         (0, ConfigError)], ids=["false", '"false"', "0"])
def test_deepspec_gemma4_config_holds_true_or_nothing(tmp_path, value, error):
    src = _source(tmp_path, GEMMA4_DRAFTER, _top(value))
    _refused_with_nothing_written(tmp_path, src, GEMMA4 / "target", error, "sample_from_anchor")


@pytest.mark.parametrize("value,error", NOT_TRUE[1:], ids=[json.dumps(v) for v, _ in NOT_TRUE[1:]])
def test_speculators_top_level_holds_a_boolean(tmp_path, value, error):
    """false at the top level is 34 (tests/test_speculators_convert.py); null is no longer
    read as missing (33): vLLM reads it false."""
    src = _source(tmp_path, SPEC, _top(value))
    _refused_with_nothing_written(tmp_path, src, GOLDEN_TARGET, error, "sample_from_anchor")


@pytest.mark.parametrize("value,error", NOT_TRUE, ids=[json.dumps(v) for v, _ in NOT_TRUE])
def test_speculators_layer_config_holds_true_or_nothing(tmp_path, value, error):
    """Nested, the field is copied into the DeepSpec twin's config, which export writes back:
    the twin's rule, named by the speculators field it was read from."""
    src = _source(tmp_path, SPEC, _nested(value))
    _refused_with_nothing_written(tmp_path, src, GOLDEN_TARGET, error,
                                  "transformer_layer_config.sample_from_anchor")


def _convert_and_export(tmp_path: Path, src: Path, target: Path) -> dict:
    _manifest, config = convert_then_export(tmp_path, src, target)
    # What vLLM and SGLang read back: the export converts again as the same drafter.
    again = run_cli("convert", str(tmp_path / "exported"), "--target", str(target), "-o",
                    str(tmp_path / "again"), "-q")
    assert again.returncode == 0, again.stderr
    return config


@pytest.mark.parametrize("base,target,edit", [
    (REFERENCE_DRAFTER, GOLDEN_TARGET, _top(True)),
    (SPEC, GOLDEN_TARGET, _nested(True)),
    (GEMMA4_DRAFTER, GEMMA4 / "target", _top(True)),
], ids=["deepspec-qwen3", "speculators-nested", "deepspec-gemma4"])
def test_a_stated_true_is_exported_as_true(tmp_path, base, target, edit):
    config = _convert_and_export(tmp_path, _source(tmp_path, base, edit), target)
    assert config["sample_from_anchor"] is True


def test_an_absent_field_is_exported_absent(tmp_path):
    """DeepSpec's own config holds none (true for every engine that reads it); a speculators
    config's top-level true is speculators' own field, not written into the twin."""
    for base in (REFERENCE_DRAFTER, SPEC):
        work = tmp_path / base.name
        work.mkdir()
        config = _convert_and_export(work, _source(work, base, lambda c: None), GOLDEN_TARGET)
        assert "sample_from_anchor" not in config


@pytest.mark.parametrize("value", [False, "false", 0])
def test_validate_holds_the_recorded_config_to_the_rule(tmp_path, value):
    """An artifact whose manifest records another layout in source.config (edited, or
    converted before the rule) fails validate (46), so export refuses it (100) and never writes
    that value."""
    art = tmp_path / "art"
    proc = run_cli("convert", str(REFERENCE_DRAFTER), "--target", str(GOLDEN_TARGET), "-o",
                   str(art), "-q")
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((art / "manifest.json").read_text())
    manifest["source"]["config"]["sample_from_anchor"] = value
    (art / "manifest.json").write_text(json.dumps(manifest, indent=2))
    proc = run_cli("validate", str(art))
    assert proc.returncode == ManifestMismatchError.exit_code, proc.stdout + proc.stderr
    assert "'sample_from_anchor'" in proc.stdout + proc.stderr
    out = tmp_path / "exported"
    proc = run_cli("export", str(art), "--engine", "deepspec", "--target", str(GOLDEN_TARGET),
                   "-o", str(out))
    assert_refused(proc, ExportArtifactError, ("'sample_from_anchor'", "does not validate"))
    assert not out.exists()


# speculators' own schema, the format's oracle: how it reads each value that is not a JSON
# boolean. It coerces strings and numbers (pydantic, lax) where a reader that takes the
# field's truth value reads "false" as true, and refuses null: no such value states a layout
# every reader agrees on, hence 13 rather than a reading.
SPECULATORS_READING = """
import json
from pydantic import TypeAdapter
from speculators.models.dspark.config import DSparkSpeculatorConfig
field = DSparkSpeculatorConfig.model_fields["sample_from_anchor"]
read = TypeAdapter(field.annotation)
out = {"default": field.default}
for value in ("false", "true", 0, 1, None):
    try:
        out[json.dumps(value)] = read.validate_python(value)
    except Exception as exc:
        out[json.dumps(value)] = type(exc).__name__
print(json.dumps(out))
"""


@pytest.mark.slow            # speculators' interpreter imports torch and transformers
def test_speculators_reads_the_values_refused_as_13_against_their_truth():
    from support import speculators

    assert speculators.run(SPECULATORS_READING) == {
        "default": True, '"false"': False, '"true"': True, "0": False, "1": True,
        "null": "ValidationError"}
