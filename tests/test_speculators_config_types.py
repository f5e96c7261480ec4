"""A speculators-format config.json of the wrong JSON types, and layer configs that name
speculators' own fields (contract/speculators.py, docs/SPECULATORS.md).

Every field of the wrong type is one line with its code (13 where it is the type; the codes
of the format otherwise), never a Python exception: `speculators_model_type` given as a list
was a TypeError (exit 1) in convert and the gate. A field of DeepSpec's config that speculators
holds at its top level (block_size, markov_rank, ...) is read from the top level alone, as
speculators reads it; a `speculators_model_type` nested in transformer_layer_config is refused
(13): the DeepSpec twin's config would name it, so every reader, this one and vLLM, would take
the export for speculators' format (it exited 1 "does not read back", naming a temporary
directory). The property test feeds arbitrary JSON to every field, top level and nested.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from support.cli import assert_refused, run_cli
from support.edited import convert_then_export, edited_copy
from support.fuzz import fuzz_settings, json_values
from support.paths import GOLDEN, GOLDEN_TARGET
from dspark_convert import errors
from dspark_convert.errors import ConfigError, GateFailedError
from dspark_convert.source.checkpoint import SpeculatorsOptions, read_source

SPEC = GOLDEN / "speculators" / "vanilla_conf_markov"
CONFIG = json.loads((SPEC / "config.json").read_text())
NESTED = "transformer_layer_config"
TARGET_LAYERS = 6            # the golden target's
MAX_SECONDS_PER_EXAMPLE = 1.0

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# (field, dotted for a nested one, a value of the wrong JSON type)
WRONG_TYPES = [
    ("speculators_model_type", ["dspark"]), ("speculators_model_type", {"dspark": 1}),
    ("speculators_model_type", 7), ("speculators_model_type", True),
    ("speculators_model_type", None),
    (NESTED, ["qwen3"]), (NESTED, "qwen3"), (NESTED, None),
    (f"{NESTED}.model_type", ["qwen3"]), (f"{NESTED}.hidden_size", "64"),
    ("speculators_config", "dspark"), ("speculators_config", [1]),
    ("speculators_config.algorithm", ["dspark"]),
    ("aux_hidden_state_layer_ids", {"2": 3}), ("aux_hidden_state_layer_ids", "2,4,5"),
    ("aux_hidden_state_layer_ids", [2.0, 4, 5]), ("aux_hidden_state_layer_ids", [True, 4, 5]),
    ("draft_vocab_size", "512"), ("draft_vocab_size", 512.0), ("draft_vocab_size", True),
    ("target_hidden_size", "64"), ("target_hidden_size", [64]),
    ("block_size", "7"), ("block_size", True), ("mask_token_id", [1]),
    ("markov_rank", 1.5), ("markov_head_type", 1), ("markov_head_type", None),
    ("enable_confidence_head", "true"), ("enable_confidence_head", 1),
    ("confidence_head_with_markov", "false"), ("dtype", 16),
]


def _edit(config: dict, dotted: str, value) -> dict:
    config = json.loads(json.dumps(config))
    *parents, last = dotted.split(".")
    holder = config
    for key in parents:
        holder = holder[key]
    holder[last] = value
    return config


def _source(tmp_path: Path, config: dict, base: Path = SPEC) -> Path:
    return edited_copy(base, tmp_path / "src", lambda c: (c.clear(), c.update(config)))


@pytest.mark.parametrize("dotted,value", WRONG_TYPES,
                         ids=[f"{d}={json.dumps(v)}" for d, v in WRONG_TYPES])
def test_a_field_of_the_wrong_type_is_one_line(tmp_path, dotted, value):
    src = _source(tmp_path, _edit(CONFIG, dotted, value))
    out = tmp_path / "out"
    proc = run_cli("convert", str(src), "--target", str(GOLDEN_TARGET), "-o", str(out))
    assert_refused(proc, ConfigError, (f"field '{dotted}",))
    assert not out.exists() and not [p for p in tmp_path.iterdir() if "tmp" in p.name]


@pytest.mark.parametrize("dotted", ["speculators_model_type", "aux_hidden_state_layer_ids",
                                    f"{NESTED}.sample_from_anchor", "draft_vocab_size"])
def test_a_huge_value_is_quoted_short(tmp_path, dotted):
    """A refusal quotes what it found on one short line, never a 20,000-entry list."""
    src = _source(tmp_path, _edit(CONFIG, dotted, [[i] for i in range(20_000)]))
    proc = run_cli("convert", str(src), "--target", str(GOLDEN_TARGET), "-o", str(tmp_path / "o"))
    line = assert_refused(proc, ConfigError, (f"field '{dotted}'", "..."))
    assert len(line) < 600, len(line)


def test_the_gate_records_the_refusal_of_a_list_model_type(tmp_path):
    src = _source(tmp_path, _edit(CONFIG, "speculators_model_type", ["dspark"]))
    policy = tmp_path / "policy.toml"
    policy.write_text('[[drafter]]\nname = "listed"\n'
                      f'source = {json.dumps(str(src))}\ntarget = {json.dumps(str(GOLDEN_TARGET))}\n'
                      f'sha256 = "{"0" * 64}"\n')
    out = tmp_path / "gate"
    proc = run_cli("gate", str(policy), "-o", str(out))
    assert proc.returncode == GateFailedError.exit_code, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    stages = json.loads((out / "gate.json").read_text())["entries"][0]["stages"]
    convert = next(s for s in stages if s["name"] == "convert")
    assert convert["status"] == "failed" and convert["exit_code"] == ConfigError.exit_code
    assert "field 'speculators_model_type'" in convert["detail"]


def test_a_nested_model_type_is_refused_at_convert(tmp_path):
    src = _source(tmp_path, _edit(CONFIG, f"{NESTED}.speculators_model_type", "dspark"))
    out = tmp_path / "out"
    proc = run_cli("convert", str(src), "--target", str(GOLDEN_TARGET), "-o", str(out))
    assert_refused(proc, ConfigError, (f"field '{NESTED}.speculators_model_type'",
                                       "speculators' format"))
    assert not out.exists()


def _artifact_and_export(work: Path, config: dict, base: Path = SPEC) -> tuple[dict, dict]:
    work.mkdir()
    return convert_then_export(work, _source(work, config, base), GOLDEN_TARGET)


@pytest.mark.parametrize("name", ["vanilla_conf_markov", "dflash_shared"])
def test_nested_fields_of_the_top_level_do_not_shadow_it(tmp_path, name):
    """A layer config that also names block_size, markov_rank, markov_head_type,
    confidence_head_with_markov, target_layer_ids, ... (with other values) converts as the
    top level says, exactly as the unedited fixture, and exports with the top level's (a
    DFlash drafter's nested markov_head_type was kept in the twin and refused, 19)."""
    base = GOLDEN / "speculators" / name
    config = json.loads((base / "config.json").read_text())
    plain, plain_config = _artifact_and_export(tmp_path / "plain", config, base)
    config[NESTED].update(block_size=3, mask_token_id=7, markov_rank=2, markov_head_type="rnn",
                          enable_confidence_head=True, confidence_head_with_markov=True,
                          target_layer_ids=[0], num_target_layers=99,
                          architectures=["Qwen3ForCausalLM"], dtype="float32")
    edited, exported = _artifact_and_export(tmp_path / "shadowed", config, base)
    assert edited["contract"] == plain["contract"]
    assert edited["artifact"]["tensors"] == plain["artifact"]["tensors"]
    assert exported == plain_config


def test_nested_speculators_fields_export_and_read_back(tmp_path):
    """speculators' own fields nested where speculators does not read them (all but the
    model type) are carried in the twin's config as unknown fields: export writes them, and
    the export reads back as DeepSpec's format (exit 0, never 1)."""
    config = json.loads(json.dumps(CONFIG))
    config[NESTED].update(sample_from_anchor=True, draft_vocab_size=512,
                          aux_hidden_state_layer_ids=[1], speculators_version="0.9.0",
                          speculators_config={"algorithm": "dflash"}, target_hidden_size=64)
    _manifest, exported = _artifact_and_export(tmp_path / "nested", config)
    assert exported["speculators_version"] == "0.9.0" and "speculators_model_type" not in exported


# --- property: arbitrary JSON in any field ----------------------------------------------------

FIELDS = [k for k in CONFIG] + [f"{NESTED}.{k}" for k in CONFIG[NESTED]] + \
    [f"{NESTED}.{k}" for k in ("speculators_model_type", "sample_from_anchor", "block_size")]


def _check(directory: Path, config: dict, option) -> None:
    (directory / "config.json").write_text(json.dumps(config))
    start = time.perf_counter()
    try:
        read_source(directory, SpeculatorsOptions(target_layers=lambda: TARGET_LAYERS,
                                                  sample_from_anchor=option))
    except errors.DSparkError as exc:
        assert type(exc) in errors.concrete_errors() and exc.exit_code != 1, exc.message
        assert "\n" not in exc.message
        assert exc.message.startswith((str(directory / "config.json"), "the stated layout"))
    assert time.perf_counter() - start < MAX_SECONDS_PER_EXAMPLE


@pytest.mark.slow
@fuzz_settings(400)
@given(edits=st.lists(st.tuples(st.sampled_from(FIELDS), json_values | st.just(Ellipsis)),
                      min_size=1, max_size=4),
       option=st.sampled_from([None, True, False]))
def test_any_json_in_any_field_is_a_result_or_one_line(edits, option):
    config = json.loads(json.dumps(CONFIG))
    for dotted, value in edits:
        *parents, last = dotted.split(".")
        holder = config
        for key in parents:
            holder = holder.get(key) if isinstance(holder, dict) else None
        if not isinstance(holder, dict):
            continue
        if value is Ellipsis:
            holder.pop(last, None)
        else:
            holder[last] = value
    with tempfile.TemporaryDirectory(prefix="dspark-speculators-types-") as d:
        _check(Path(d), config, option)
