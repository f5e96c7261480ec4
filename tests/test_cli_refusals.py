"""Every refusal of `dspark convert`, through the real CLI.

Each case builds a bad checkpoint in tmp_path with the synthetic module, runs the CLI and
checks the project's rule for bad input: exactly one `error: ...` line on stderr naming the
file / field / tensor, the error class's own exit code, no traceback, and nothing written
next to the output (no output directory, no hidden `.NAME.dspark-tmp-*` sibling, no parent
directories). The app runs in-process (tests/support/cli.py); the first two cases and the
existing-output refusal also run as real processes (the `dspark` console script and
`python -m dspark_convert.cli.main`), so a traceback on a real stderr would show.
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from support.cli import assert_refused, run_cli, run_process, temp_siblings

from dspark_convert.errors import (
    ConfigError,
    DSparkError,
    GeometryLimitError,
    HeadConfigMismatchError,
    MaskTokenError,
    MissingTensorError,
    NonFiniteTensorError,
    OutputExistsError,
    SafetensorsFormatError,
    SourceLayoutError,
    SourceNotFoundError,
    TargetLayerError,
    TensorDtypeError,
    TensorShapeError,
    UnexpectedTensorError,
    UnsupportedArchitectureError,
    UnsupportedFeatureError,
)
from dspark_convert.synthetic import synthetic_config, synthetic_tensors, write_checkpoint


def listing(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


# --- building bad checkpoints --------------------------------------------------------------

Mutator = Callable[[dict], None]


def build(src: Path, *, base: dict | None = None, cfg: Mutator | None = None,
          tensors: Callable[[dict, dict], None] | None = None, dtype: str = "BF16",
          raw_config: str | None = None) -> None:
    """Synthetic checkpoint from ``base`` (synthetic_config kwargs); the tensors follow the
    valid base config, then ``cfg`` mutates the config and ``tensors(ts, config)`` the
    tensors before both are written. ``raw_config`` replaces config.json's text."""
    config = synthetic_config(dtype=dtype, **(base or {}))
    ts = synthetic_tensors(config, seed=0)
    if cfg is not None:
        cfg(config)
    if tensors is not None:
        tensors(ts, config)
    write_checkpoint(src, config, ts, dtype=dtype)
    if raw_config is not None:
        (src / "config.json").write_text(raw_config)


def set_(key: str, value) -> Mutator:
    def mutate(c: dict) -> None:
        c[key] = value
    return mutate


def delete(*keys: str) -> Mutator:
    def mutate(c: dict) -> None:
        for key in keys:
            c.pop(key, None)
    return mutate


def chain(*fns: Mutator) -> Mutator:
    def mutate(c: dict) -> None:
        for fn in fns:
            fn(c)
    return mutate


def drop_tensors(prefix: str):
    def mutate(ts: dict, _cfg: dict) -> None:
        for name in [n for n in ts if n.startswith(prefix)]:
            del ts[name]
    return mutate


def poke(name: str, index: int, value: float):
    def mutate(ts: dict, _cfg: dict) -> None:
        flat = ts[name].reshape(-1)
        flat[index] = value
    return mutate


def config_text_with_duplicate_key() -> str:
    text = json.dumps(synthetic_config(), indent=2)
    # a second "vocab_size" at the very top: json.loads would silently keep the last one
    return text.replace("{", '{\n  "vocab_size": 512,', 1)


def build_mixed_dtype(src: Path) -> None:
    """One F16 tensor among BF16, config dtype bfloat16 (written with safetensors itself)."""
    import torch
    from safetensors.torch import save_file

    config = synthetic_config()
    ts = synthetic_tensors(config, seed=0)
    src.mkdir(parents=True)
    (src / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    converted = {n: torch.from_numpy(v).to(torch.float16 if n == "layers.1.self_attn.k_norm.weight"
                                           else torch.bfloat16) for n, v in ts.items()}
    save_file(converted, str(src / "model.safetensors"), metadata={"format": "pt"})


def build_truncated(src: Path) -> None:
    build(src)
    weights = src / "model.safetensors"
    size = weights.stat().st_size
    with open(weights, "r+b") as fh:
        fh.truncate(size - 100)


class _Sentinel:
    """Unpickling this creates a directory: proof that a pickle was opened."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def build_pickle_only(src: Path) -> None:
    src.mkdir(parents=True)
    (src / "config.json").write_text(json.dumps(synthetic_config(), indent=2) + "\n")
    sentinel = src.parent / "UNPICKLED"
    (src / "pytorch_model.bin").write_bytes(pickle.dumps(_Sentinel(str(sentinel))))
    (src / "pytorch_model.bin").chmod(0o000)


def build_no_config(src: Path) -> None:
    build(src)
    (src / "config.json").unlink()


def build_both_layouts(src: Path) -> None:
    build(src)
    (src / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"fc.weight": "model.safetensors"}}))


def build_symlink_outside(src: Path) -> None:
    elsewhere = src.parent / "elsewhere"
    build(elsewhere)
    src.mkdir(parents=True)
    (src / "config.json").write_text((elsewhere / "config.json").read_text())
    (src / "model.safetensors").symlink_to(elsewhere / "model.safetensors")


@dataclass(frozen=True)
class Case:
    id: str
    make: Callable[[Path], None] | None     # None: the source directory does not exist
    error: type[DSparkError]
    needles: list[str] = field(default_factory=list)


NO_CONF = {"enable_confidence_head": False, "confidence_head_with_markov": None}

CASES = [
    # --- architecture and features
    # A Qwen3 config relabelled Gemma4 is read by the Gemma4 family's reader (by its
    # architectures), which names its own first missing field and the family.
    Case("architecture-gemma4", lambda s: build(s, cfg=set_("architectures", ["Gemma4DSparkModel"])),
         ConfigError, ["config.json", "required field", "Gemma4DSparkModel", "gemma4-dspark"]),
    Case("architecture-unknown", lambda s: build(s, cfg=set_("architectures", ["Llama4DSparkModel"])),
         UnsupportedArchitectureError, ["config.json", "architectures", "Llama4DSparkModel",
                                        "Qwen3DSparkModel", "Gemma4DSparkModel"]),
    Case("architecture-two", lambda s: build(s, cfg=set_("architectures",
                                                          ["Qwen3DSparkModel", "Qwen3ForCausalLM"])),
         UnsupportedArchitectureError, ["architectures", "Qwen3ForCausalLM"]),
    Case("attention-bias", lambda s: build(s, cfg=set_("attention_bias", True)),
         UnsupportedFeatureError, ["config.json", "attention_bias", "true"]),
    Case("hidden-act-gelu", lambda s: build(s, cfg=set_("hidden_act", "gelu")),
         UnsupportedFeatureError, ["config.json", "hidden_act", "gelu", "silu"]),
    Case("rope-type-yarn", lambda s: build(s, cfg=set_("rope_parameters", {
        "rope_theta": 1000000.0, "rope_type": "yarn", "factor": 4.0})),
         UnsupportedFeatureError, ["config.json", "rope_parameters.rope_type", "yarn"]),
    Case("sliding-window", lambda s: build(s, cfg=set_("use_sliding_window", True)),
         UnsupportedFeatureError, ["use_sliding_window"]),
    # --- target layers (num_target_layers = 6)
    Case("target-minus-one", lambda s: build(s, cfg=set_("target_layer_ids", [-1, 2, 4])),
         TargetLayerError, ["config.json", "target_layer_ids[0]", "-1"]),
    Case("target-out-of-range", lambda s: build(s, cfg=set_("target_layer_ids", [0, 2, 6])),
         TargetLayerError, ["config.json", "target_layer_ids[2]", "found 6"]),
    Case("target-last-layer", lambda s: build(s, cfg=set_("target_layer_ids", [0, 2, 5])),
         TargetLayerError, ["config.json", "target_layer_ids[2]", "5", "last layer"]),
    Case("target-decreasing", lambda s: build(s, cfg=set_("target_layer_ids", [0, 4, 2])),
         TargetLayerError, ["config.json", "target_layer_ids", "strictly increasing"]),
    Case("target-duplicate", lambda s: build(s, cfg=set_("target_layer_ids", [0, 2, 2])),
         TargetLayerError, ["target_layer_ids", "strictly increasing"]),
    Case("target-empty", lambda s: build(s, cfg=set_("target_layer_ids", [])),
         TargetLayerError, ["config.json", "target_layer_ids"]),
    # --- tensor inventory
    Case("tensor-missing", lambda s: build(s, tensors=drop_tensors("layers.1.mlp.down_proj.weight")),
         MissingTensorError, ["model.safetensors", "layers.1.mlp.down_proj.weight", "missing"]),
    Case("tensor-unexpected", lambda s: build(s, tensors=lambda ts, c: ts.__setitem__(
        "layers.0.self_attn.q_proj.bias", np.zeros(32, np.float32))),
         UnexpectedTensorError, ["model.safetensors", "layers.0.self_attn.q_proj.bias"]),
    Case("tensor-shape-transposed", lambda s: build(s, tensors=lambda ts, c: ts.__setitem__(
        "fc.weight", np.ascontiguousarray(ts["fc.weight"].T))),
         TensorShapeError, ["model.safetensors", "fc.weight", "[32, 96]", "[96, 32]"]),
    Case("tensor-dtype-f16-among-bf16", build_mixed_dtype,
         TensorDtypeError, ["model.safetensors", "layers.1.self_attn.k_norm.weight", "BF16", "F16"]),
    Case("tensor-dtype-config-says-f32", lambda s: build(s, cfg=set_("dtype", "float32")),
         TensorDtypeError, ["model.safetensors", "F32", "BF16"]),
    # --- values
    Case("nan", lambda s: build(s, tensors=poke("layers.0.mlp.up_proj.weight", 17, np.nan)),
         NonFiniteTensorError, ["model.safetensors", "layers.0.mlp.up_proj.weight", "nan",
                                "element 17"]),
    Case("plus-inf-bf16", lambda s: build(s, tensors=poke("norm.weight", 3, np.inf)),
         NonFiniteTensorError, ["model.safetensors", "norm.weight", "inf", "element 3"]),
    Case("minus-inf-f16", lambda s: build(s, dtype="F16",
                                         tensors=poke("markov_head.markov_w2.weight", 5, -np.inf)),
         NonFiniteTensorError, ["markov_head.markov_w2.weight", "-inf"]),
    Case("f32-overflows-bf16", lambda s: build(s, dtype="F32",
                                              tensors=poke("layers.1.mlp.gate_proj.weight", 9, 3.4e38)),
         NonFiniteTensorError, ["model.safetensors", "layers.1.mlp.gate_proj.weight", "BF16"]),
    # --- heads against tensors
    Case("markov-rank-but-no-markov-tensors",
         lambda s: build(s, base=NO_CONF, tensors=drop_tensors("markov_head.")),
         HeadConfigMismatchError, ["model.safetensors", "markov_rank", "markov_head"]),
    Case("markov-rank-zero-but-markov-tensors",
         lambda s: build(s, base=NO_CONF, cfg=chain(set_("markov_rank", 0), delete("markov_head_type"))),
         HeadConfigMismatchError, ["model.safetensors", "markov_rank 0", "markov_head"]),
    Case("config-gated-tensors-vanilla",
         lambda s: build(s, cfg=set_("markov_head_type", "gated")),
         HeadConfigMismatchError, ["markov_head_type", "gated", "vanilla"]),
    Case("config-rnn-tensors-gated",
         lambda s: build(s, base={"markov_head_type": "gated"}, cfg=set_("markov_head_type", "rnn")),
         HeadConfigMismatchError, ["markov_head_type", "rnn", "gated"]),
    Case("confidence-off-but-confidence-tensors",
         lambda s: build(s, base={"confidence_head_with_markov": False},
                         cfg=chain(set_("enable_confidence_head", False),
                                   delete("confidence_head_with_markov"))),
         HeadConfigMismatchError, ["enable_confidence_head", "confidence_head"]),
    Case("confidence-on-but-no-confidence-tensors",
         lambda s: build(s, tensors=drop_tensors("confidence_head.")),
         HeadConfigMismatchError, ["enable_confidence_head", "confidence_head"]),
    Case("confidence-with-markov-but-rank-zero",
         lambda s: build(s, cfg=chain(set_("markov_rank", 0), delete("markov_head_type"))),
         HeadConfigMismatchError, ["config.json", "confidence_head_with_markov", "markov_rank"]),
    Case("markov-head-type-missing",
         lambda s: build(s, cfg=delete("markov_head_type")),
         HeadConfigMismatchError, ["config.json", "markov_head_type", "missing"]),
    Case("markov-head-type-without-rank",
         lambda s: build(s, base=NO_CONF, tensors=drop_tensors("markov_head."),
                         cfg=set_("markov_rank", 0)),
         HeadConfigMismatchError, ["config.json", "markov_head_type"]),
    # --- mask token (vocab_size = 256)
    Case("mask-token-equals-vocab", lambda s: build(s, cfg=set_("mask_token_id", 256)),
         MaskTokenError, ["config.json", "mask_token_id", "256"]),
    Case("mask-token-negative", lambda s: build(s, cfg=set_("mask_token_id", -1)),
         MaskTokenError, ["config.json", "mask_token_id", "-1"]),
    # --- geometry limits
    Case("block-size-129", lambda s: build(s, cfg=set_("block_size", 129)),
         GeometryLimitError, ["config.json", "block_size", "129"]),
    Case("draft-layers-65", lambda s: build(s, cfg=set_("num_hidden_layers", 65)),
         GeometryLimitError, ["config.json", "num_hidden_layers", "65"]),
    Case("block-size-zero", lambda s: build(s, cfg=set_("block_size", 0)),
         GeometryLimitError, ["block_size", "0"]),
    # --- config.json types and syntax
    Case("hidden-size-string", lambda s: build(s, cfg=set_("hidden_size", "32")),
         ConfigError, ["config.json", "hidden_size", "'32'"]),
    Case("block-size-bool", lambda s: build(s, cfg=set_("block_size", True)),
         ConfigError, ["config.json", "block_size", "True"]),
    Case("hidden-size-missing", lambda s: build(s, cfg=delete("hidden_size")),
         ConfigError, ["config.json", "hidden_size", "missing"]),
    Case("config-invalid-json", lambda s: build(s, raw_config='{"hidden_size": 32,'),
         ConfigError, ["config.json", "not valid JSON"]),
    Case("config-duplicate-key", lambda s: build(s, raw_config=config_text_with_duplicate_key()),
         ConfigError, ["config.json", "duplicate key", "vocab_size"]),
    Case("config-not-object", lambda s: build(s, raw_config="[1, 2, 3]\n"),
         ConfigError, ["config.json", "object", "list"]),
    Case("config-nan-constant", lambda s: build(s, raw_config=json.dumps(
        {**synthetic_config(), "rms_norm_eps": float("nan")})),
         ConfigError, ["config.json", "NaN"]),
    Case("config-dtype-unknown", lambda s: build(s, cfg=set_("dtype", "int8")),
         ConfigError, ["config.json", "dtype", "int8"]),
    # --- source layout
    Case("source-missing", None, SourceNotFoundError, ["{src}", "no such directory"]),
    Case("config-missing", build_no_config, SourceNotFoundError, ["config.json", "not found"]),
    Case("pickle-only", build_pickle_only, SourceLayoutError,
         ["pytorch_model.bin", "pickle", "never opened"]),
    Case("both-single-and-sharded", build_both_layouts, SourceLayoutError,
         ["model.safetensors", "model.safetensors.index.json"]),
    Case("symlink-leaves-directory", build_symlink_outside, SourceLayoutError,
         ["model.safetensors", "leaves the source directory"]),
    Case("truncated-safetensors", build_truncated, SafetensorsFormatError, ["model.safetensors"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_refusal(case: Case, tmp_path: Path) -> None:
    src = tmp_path / "src"
    if case.make is not None:
        case.make(src)
    parent = tmp_path / "outparent"
    parent.mkdir()
    (parent / "keep.txt").write_text("unrelated\n")
    before = listing(parent)
    tmp_before = listing(tmp_path)
    out = parent / "art"
    args = ("convert", str(src), "-o", str(out), "-q")
    # Two canaries in real processes (the console script, `python -m`); the rest in-process.
    index = CASES.index(case)
    proc = run_process(*args, console_script=index == 0) if index < 2 else run_cli(*args)
    line = assert_refused(proc, case.error, [n.format(src=src) for n in case.needles])
    assert not out.exists(), line
    assert temp_siblings(out) == []
    assert listing(parent) == before
    assert listing(tmp_path) == tmp_before
    if case.id == "pickle-only":
        assert not (tmp_path / "UNPICKLED").exists(), "a pickle file was unpickled"


def test_refusal_names_missing_output_parents_are_not_created(tmp_path: Path) -> None:
    """A refusal before any write leaves even a deep -o path uncreated."""
    src = tmp_path / "src"
    build(src, cfg=set_("attention_bias", True))
    out = tmp_path / "a" / "b" / "art"
    proc = run_cli("convert", str(src), "-o", str(out))   # progress on: still one line
    assert_refused(proc, UnsupportedFeatureError, ["attention_bias"])
    assert not (tmp_path / "a").exists()


def test_refusal_json_report(tmp_path: Path) -> None:
    """--json: the same error as a JSON object on stdout, one line on stderr."""
    src = tmp_path / "src"
    build(src, cfg=set_("mask_token_id", 256))
    out = tmp_path / "art"
    proc = run_cli("convert", str(src), "-o", str(out), "--json")
    line = assert_refused(proc, MaskTokenError, ["mask_token_id"])
    report = json.loads(proc.stdout)
    assert report["ok"] is False
    assert report["error"] == "MaskTokenError"
    assert report["exit_code"] == MaskTokenError.exit_code
    assert report["field"] == "mask_token_id"
    assert line == "error: " + report["message"]
    assert not out.exists()


def test_nonfinite_without_quiet_is_one_line(tmp_path: Path) -> None:
    """A refusal in the middle of the verify pass, with progress bars enabled."""
    src = tmp_path / "src"
    build(src, tensors=poke("fc.weight", 0, np.nan))
    out = tmp_path / "art"
    proc = run_cli("convert", str(src), "-o", str(out))
    assert_refused(proc, NonFiniteTensorError, ["fc.weight"])
    assert not out.exists() and temp_siblings(out) == []


# --- the output already exists -------------------------------------------------------------

@pytest.fixture(scope="module")
def good_source(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("good") / "src"
    build(src)
    return src


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def test_output_exists_is_refused_and_untouched(good_source: Path, tmp_path: Path) -> None:
    out = tmp_path / "art"
    out.mkdir()
    (out / "precious.txt").write_text("do not touch\n")
    (out / "sub").mkdir()
    (out / "sub" / "drafter.gguf").write_bytes(b"old")
    before = _snapshot(out)
    parent_before = listing(tmp_path)
    proc = run_process("convert", str(good_source), "-o", str(out), "-q")
    assert_refused(proc, OutputExistsError, [str(out), "already exists", "--force"])
    assert _snapshot(out) == before
    assert listing(tmp_path) == parent_before


def test_output_exists_as_file_is_refused_even_with_force(good_source: Path, tmp_path: Path) -> None:
    out = tmp_path / "art"
    out.write_text("a file\n")
    proc = run_cli("convert", str(good_source), "-o", str(out), "-q", "--force")
    assert_refused(proc, OutputExistsError, [str(out), "not a directory"])
    assert out.read_text() == "a file\n"
    assert listing(tmp_path) == ["art"]


def test_force_replaces_and_validates(good_source: Path, tmp_path: Path) -> None:
    out = tmp_path / "art"
    out.mkdir()
    (out / "precious.txt").write_text("old artifact\n")
    proc = run_cli("convert", str(good_source), "-o", str(out), "-q", "--force")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(os.listdir(out)) == ["drafter.gguf", "manifest.json"]
    assert listing(tmp_path) == ["art"]          # no old/tmp sibling left behind
    check = run_cli("validate", str(out))
    assert check.returncode == 0, check.stdout + check.stderr


def test_bad_source_with_force_keeps_the_old_output(tmp_path: Path) -> None:
    """--force only replaces on success: a refusal leaves the existing output as it was."""
    src = tmp_path / "src"
    build(src, tensors=poke("fc.weight", 1, np.inf))
    out = tmp_path / "art"
    out.mkdir()
    (out / "precious.txt").write_text("old artifact\n")
    proc = run_cli("convert", str(src), "-o", str(out), "-q", "--force")
    assert_refused(proc, NonFiniteTensorError, ["fc.weight"])
    assert _snapshot(out) == {"precious.txt": b"old artifact\n"}
    assert listing(tmp_path) == ["art", "src"]


def test_f32_overflow_with_force_keeps_the_old_output(tmp_path: Path) -> None:
    """The F32->BF16 overflow is found while writing, inside the temporary directory."""
    src = tmp_path / "src"
    build(src, dtype="F32", tensors=poke("fc.weight", 1, -3.4e38))
    out = tmp_path / "art"
    out.mkdir()
    (out / "precious.txt").write_text("old artifact\n")
    proc = run_cli("convert", str(src), "-o", str(out), "-q", "--force")
    assert_refused(proc, NonFiniteTensorError, ["fc.weight"])
    assert _snapshot(out) == {"precious.txt": b"old artifact\n"}
    assert listing(tmp_path) == ["art", "src"]


def test_write_pass_failure_without_quiet_is_one_line(tmp_path: Path) -> None:
    src = tmp_path / "src"
    build(src, dtype="F32", tensors=poke("fc.weight", 3, 3.4e38))
    out = tmp_path / "art"
    proc = run_cli("convert", str(src), "-o", str(out))
    assert not out.exists() and temp_siblings(out) == []
    assert_refused(proc, NonFiniteTensorError, ["fc.weight", "overflows BF16"])


@pytest.mark.parametrize("where", ["source", "source-parent", "inside-source", "via-link"])
def test_force_never_replaces_the_source(tmp_path: Path, where: str) -> None:
    holder = tmp_path / "holder"
    src = holder / "src"
    build(src)
    (tmp_path / "link").symlink_to(holder)
    before = _snapshot(holder)
    out = {"source": src, "source-parent": holder, "inside-source": src / "art",
           "via-link": tmp_path / "link" / "src"}[where]
    proc = run_cli("convert", str(src), "-o", str(out), "-q", "--force")
    assert _snapshot(holder) == before, "the source checkpoint was replaced"
    lines = proc.stderr.splitlines()
    assert proc.returncode == 30 and len(lines) == 1 and lines[0].startswith("error: ")
    assert str(src) in lines[0] or str(holder) in lines[0]


def test_output_inside_the_target_is_refused(tmp_path: Path) -> None:
    """The target is read too: an output inside (or over) it is refused like the source."""
    import shutil

    from conftest import GOLDEN, REFERENCE_DRAFTER

    target = tmp_path / "target"
    shutil.copytree(GOLDEN / "reference" / "target", target)
    before = _snapshot(target)
    for out in (target / "art", target):
        proc = run_cli("convert", str(REFERENCE_DRAFTER), "-o", str(out), "-q", "--force",
                       "--target", str(target))
        lines = proc.stderr.splitlines()
        assert proc.returncode == 30 and len(lines) == 1, proc.stderr
        assert "the target model" in lines[0]
    assert _snapshot(target) == before
