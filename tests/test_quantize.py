"""artifact/quantize.py: a quantized artifact from a BF16 one.

Every quantized tensor is checked against gguf-py's quantizer applied to the parent's BF16
values (the whole tensor at once), every other tensor against the parent's bytes, every key
against the parent's; the refusals leave nothing behind.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize
from support.cli import assert_refused, assert_valid, run_cli, temp_siblings

from support.paths import GOLDEN_TARGET as TARGET

from dspark_convert.artifact.engines import engine_checks, engine_records, reports_for_gguf
from dspark_convert.artifact.quantized import rule_whens, tensor_type
from dspark_convert.commands.quantize import quantize_artifact
from dspark_convert.commands.validate import validate_artifact
from dspark_convert.commands.convert import convert
from dspark_convert.errors import (InvalidArtifactError, OutputExistsError, ParentArtifactError,
                                   QuantizedParentError, QuantRowWidthError,
                                   QuantScaleOverflowError, QuantTypeError, SmokeInputError)
from dspark_convert.formats import quants
from dspark_convert.formats.gguf_reader import read_gguf
from dspark_convert.synthetic import synthetic_config, synthetic_tensors, write_checkpoint

BACKBONE = ("fc.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
            "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")
HEAD_MATRICES = ("markov_w1.weight", "markov_w2.weight", "markov_gate.weight",
                 "markov_joint.weight", "conf_proj.weight")


def tensors_of(artifact) -> dict[str, tuple[str, list[int], bytes]]:
    path = artifact / "drafter.gguf"
    gguf, raw = read_gguf(path), path.read_bytes()
    return {t.name: (t.ggml_type.name, list(t.shape), raw[t.data_offset:t.data_offset + t.nbytes])
            for t in gguf.tensors}


def typed_kv(artifact) -> list[tuple[str, str, object]]:
    gguf = read_gguf(artifact / "drafter.gguf")
    return [(k, v.type.name + (f"[{v.sub_type.name}]" if v.sub_type else ""), v.value)
            for k, v in gguf.kv.items()]


def is_backbone(name: str) -> bool:
    return name == "fc.weight" or any(name.endswith("." + part) for part in BACKBONE[1:])


def gguf_py_oracle(bf16: bytes, shape: list[int], qtype: str) -> bytes:
    bits = np.frombuffer(bf16, "<u2").reshape(shape[1], shape[0])
    return gguf_quantize((bits.astype(np.uint32) << 16).view(np.float32),
                         GGMLQuantizationType[qtype]).tobytes()


@pytest.fixture(scope="module")
def quantized(converted, tmp_path_factory):
    """The golden reference drafter quantized to each type, once."""
    root = tmp_path_factory.mktemp("quantized")
    return {qtype: quantize_artifact(converted["reference"], root / qtype, qtype.lower())
            for qtype in quants.QUANT_TYPES}


@pytest.mark.parametrize("qtype", quants.QUANT_TYPES)
def test_quantized_tensors_equal_gguf_py_on_the_parents_bf16_values(converted, quantized, qtype):
    parent, child = tensors_of(converted["reference"]), tensors_of(quantized[qtype].output)
    assert list(child) == list(parent)                      # same tensors, same order
    n_quantized = 0
    for name, (ptype, shape, pbytes) in parent.items():
        ctype, cshape, cbytes = child[name]
        assert ptype == "BF16" and cshape == shape
        if is_backbone(name):
            assert ctype == qtype, name
            assert cbytes == gguf_py_oracle(pbytes, shape, qtype), name
            n_quantized += 1
        else:   # norms, biases and (without heads=) the Markov/confidence matrices
            assert ctype == "BF16" and cbytes == pbytes, name
    assert n_quantized == 1 + 7 * 2        # fc + 7 matrices in each of the 2 layers


@pytest.mark.parametrize("qtype", quants.QUANT_TYPES)
def test_keys_are_the_parents_plus_the_two_strata_writes(converted, quantized, qtype):
    parent, child = typed_kv(converted["reference"]), typed_kv(quantized[qtype].output)
    parent_sha = hashlib.sha256((converted["reference"] / "drafter.gguf").read_bytes()).hexdigest()
    assert child[:len(parent)] == parent
    assert child[len(parent):] == [("strata.dflash.quantization", "STRING", qtype),
                                   ("strata.dflash.source_sha256", "STRING", parent_sha)]
    assert dict((k, v) for k, _t, v in child)["general.alignment"] == 32


@pytest.mark.parametrize("qtype", quants.QUANT_TYPES)
def test_manifest_names_the_parent_the_type_and_each_tensors_error(converted, quantized, qtype):
    result = quantized[qtype]
    out = result.output
    manifest = json.loads((out / "manifest.json").read_text())
    gguf_bytes = (out / "drafter.gguf").read_bytes()
    parent_files = {f["path"]: f for f in manifest["parent"]["files"]}
    for name in ("drafter.gguf", "manifest.json"):
        data = (converted["reference"] / name).read_bytes()
        assert parent_files[name] == {"path": name, "size": len(data),
                                      "sha256": hashlib.sha256(data).hexdigest()}
    assert manifest["quantization"]["type"] == qtype and manifest["quantization"]["heads"] is None
    # the quantized file keeps the parent's dspark.converter; the record says whose it is
    parent_kv = {k: v.value for k, v in read_gguf(converted["reference"] / "drafter.gguf").kv.items()}
    assert manifest["parent"]["converter"] == parent_kv["dspark.converter"]
    assert manifest["quantization"]["tool"].startswith("gguf-py ")
    assert manifest["artifact"]["sha256"] == hashlib.sha256(gguf_bytes).hexdigest() == result.gguf_sha256
    assert manifest["artifact"]["size"] == len(gguf_bytes) == result.gguf_size
    parent_manifest = json.loads((converted["reference"] / "manifest.json").read_text())
    for key in ("source", "target", "contract"):
        assert manifest[key] == parent_manifest[key]
    # The engines, recorded for the quantized file as convert records them: what the
    # rules give on the file itself
    reports = reports_for_gguf(read_gguf(out / "drafter.gguf"), path="drafter.gguf")
    want = [c.model_dump() for c in engine_checks(reports)]
    assert [c for c in manifest["checks"] if c["name"].startswith("engine.")] == want
    assert manifest["engines"] == engine_records(reports)
    assert [c["name"] for c in manifest["checks"]][:4] == [
        "parent.validate", "quantize.tensors", "quantize.values", "quantize.readback"]

    child, parent = tensors_of(out), tensors_of(converted["reference"])
    for record in manifest["artifact"]["tensors"]:
        ctype, shape, cbytes = child[record["name"]]
        assert record["type"] == ctype and record["shape"] == shape
        assert record["sha256"] == hashlib.sha256(cbytes).hexdigest()
        if ctype == "BF16":
            assert "error" not in record
            continue
        # the error recomputed here from the file: gguf-py's dequantization against BF16
        back = gguf_dequantize(np.frombuffer(cbytes, np.uint8).reshape(shape[1], -1),
                               GGMLQuantizationType[qtype]).astype(np.float64)
        ref = (np.frombuffer(parent[record["name"]][2], "<u2").astype(np.uint32) << 16
               ).view(np.float32).reshape(shape[1], shape[0]).astype(np.float64)
        diff = back - ref
        assert math.isclose(record["error"]["max_abs"], np.abs(diff).max(), rel_tol=1e-5)
        assert math.isclose(record["error"]["rel_rms"],
                            math.sqrt((diff ** 2).sum() / (ref ** 2).sum()), rel_tol=1e-5)


@pytest.mark.parametrize("qtype", quants.QUANT_TYPES)
def test_quantize_output_validates(quantized, qtype):
    """The done-when: `dspark validate` passes what `dspark quantize` writes, with the
    quantized artifact's own check and every block scale scanned."""
    report = validate_artifact(quantized[qtype].output)
    assert report.ok, report.first_failure
    assert report.exit_code(strict=True) == 0
    names = [c.name for c in report.checks]
    assert names.index("gguf.inventory") + 1 == names.index("gguf.quantization")
    detail = next(c.detail for c in report.checks if c.name == "gguf.quantization")
    assert detail.startswith(f"{qtype} artifact: 14 BF16, 15 {qtype};")
    assert "every block scale of the 15 quantized ones finite" in next(
        c.detail for c in report.checks if c.name == "gguf.values")


def test_precision_ordering_of_the_recorded_errors(quantized):
    """Q8_0 < Q5_0 < Q4_0 on every tensor: the numbers a release engineer compares."""
    rel = {q: {t.name: t.error.rel_rms for t in r.manifest.artifact.tensors if t.error}
           for q, r in quantized.items()}
    for name in rel["Q8_0"]:
        assert rel["Q8_0"][name] < rel["Q5_0"][name] < rel["Q4_0"][name], name
    assert max(rel["Q8_0"].values()) < 0.01


def test_byte_reproducible_and_independent_of_the_chunk_size(converted, quantized, tmp_path,
                                                              monkeypatch):
    first = quantized["Q5_0"].output
    again = quantize_artifact(converted["reference"], tmp_path / "again", "Q5_0").output
    # one row per chunk: every matrix streamed in as many pieces as it has rows
    monkeypatch.setattr(quants, "CHUNK_BYTES", 1)
    rows = quantize_artifact(converted["reference"], tmp_path / "rows", "q5_0").output
    for name in ("drafter.gguf", "manifest.json"):
        assert (again / name).read_bytes() == (first / name).read_bytes() == (rows / name).read_bytes()


def test_the_type_rule_validate_can_share(quantized):
    """tensor_type is what quantize wrote, tensor by tensor (and BF16 everywhere for a BF16
    artifact): the rule validate checks a quantized artifact's tensors by."""
    manifest = quantized["Q4_0"].manifest
    whens = rule_whens(manifest.contract)
    written = {t.name: t.type for t in manifest.artifact.tensors}
    for spec in manifest.contract.written_tensors:
        ndim = len(spec.gguf_shape)
        assert tensor_type(spec.kind, whens[spec.gguf_name], ndim, "Q4_0", None) == written[spec.gguf_name]
        assert tensor_type(spec.kind, whens[spec.gguf_name], ndim, None, None) == "BF16"
    assert tensor_type("matrix", "markov", 2, "Q8_0", "Q5_0") == "Q5_0"
    assert tensor_type("norm", "always", 1, "Q8_0", "Q8_0") == "BF16"
    assert tensor_type("bias", "gated", 1, "Q8_0", "Q8_0") == "BF16"


# --- heads ------------------------------------------------------------------------------------

def heads_checkpoint(tmp_path, name: str, **config_args):
    """A synthetic drafter whose head matrices have rows of a multiple of 32 (r = 32)."""
    cfg = synthetic_config(hidden_size=64, intermediate_size=128, head_dim=16, markov_rank=32,
                           vocab_size=256, mask_token_id=250, **config_args)
    src = write_checkpoint(tmp_path / f"{name}-src", cfg, synthetic_tensors(cfg, seed=3))
    out = tmp_path / name
    convert(src, out)
    return out


@pytest.mark.parametrize("head_type", ["vanilla", "gated"])
def test_heads_quantized_only_when_asked(tmp_path, head_type):
    parent = heads_checkpoint(tmp_path, head_type, markov_head_type=head_type)
    kept = quantize_artifact(parent, tmp_path / "kept", "q8_0")
    heads = quantize_artifact(parent, tmp_path / "heads", "q8_0", heads="q4_0")
    pt, kt, ht = tensors_of(parent), tensors_of(kept.output), tensors_of(heads.output)
    assert any(n in pt for n in HEAD_MATRICES[2:3]) == (head_type == "gated")
    for name, (_t, shape, pbytes) in pt.items():
        if name in HEAD_MATRICES:
            assert kt[name][0] == "BF16" and kt[name][2] == pbytes
            assert ht[name][0] == "Q4_0" and ht[name][2] == gguf_py_oracle(pbytes, shape, "Q4_0")
        elif len(shape) == 1:   # norms and biases (markov_gate.bias, conf_proj.bias)
            assert kt[name][0] == ht[name][0] == "BF16"
        else:
            assert kt[name][2] == ht[name][2] == gguf_py_oracle(pbytes, shape, "Q8_0")
    assert heads.manifest.quantization.heads == "Q4_0"


def test_heads_with_rows_not_a_multiple_of_32_are_refused(converted, tmp_path):
    """The golden reference drafter's Markov rank is 16: markov_w1 rows of 16 values."""
    with pytest.raises(QuantRowWidthError) as exc:
        quantize_artifact(converted["reference"], tmp_path / "out", "q8_0", heads="q8_0")
    assert exc.value.exit_code == 81 and exc.value.tensor == "markov_w1.weight"
    assert not (tmp_path / "out").exists()


# --- engines on a quantized artifact ------------------------------------------------------------

def test_strata_opens_a_quantized_plain_dflash_artifact(converted, tmp_path):
    out = quantize_artifact(converted["dflash_plain"], tmp_path / "q", "q4_0").output
    reports = reports_for_gguf(read_gguf(out / "drafter.gguf"))
    assert reports["strata.open"].accepts, reports["strata.open"].refusals
    assert reports["strata.run"].reason.startswith("dflash: embedding_length = 32;")


# --- refusals: each leaves nothing behind ------------------------------------------------------

def no_leftovers(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if ".dspark-tmp-" in p.name)


def test_an_existing_output_is_refused_unless_forced(converted, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep").write_text("mine")
    with pytest.raises(OutputExistsError) as exc:
        quantize_artifact(converted["dflash_plain"], out, "q8_0")
    assert exc.value.exit_code == 30 and (out / "keep").read_text() == "mine"
    result = quantize_artifact(converted["dflash_plain"], out, "q8_0", force=True)
    assert sorted(p.name for p in out.iterdir()) == ["drafter.gguf", "manifest.json"]
    assert result.manifest.quantization.type == "Q8_0"


def test_an_output_inside_the_parent_is_refused(converted, tmp_path):
    parent = tmp_path / "parent"
    shutil.copytree(converted["dflash_plain"], parent)
    for out in (parent, parent / "q"):
        with pytest.raises(OutputExistsError):
            quantize_artifact(parent, out, "q8_0", force=True)
    assert sorted(p.name for p in parent.iterdir()) == ["drafter.gguf", "manifest.json"]


def test_a_parent_that_does_not_validate_is_refused(converted, tmp_path):
    parent = tmp_path / "parent"
    shutil.copytree(converted["dflash_plain"], parent)
    gguf = read_gguf(parent / "drafter.gguf")
    info = next(t for t in gguf.tensors if t.name == "blk.1.ffn_up.weight")
    data = bytearray((parent / "drafter.gguf").read_bytes())
    data[info.data_offset + 10] ^= 0x01                   # one bit of one weight
    (parent / "drafter.gguf").write_bytes(bytes(data))
    with pytest.raises(ParentArtifactError) as exc:
        quantize_artifact(parent, tmp_path / "out", "q8_0")
    assert exc.value.exit_code == 80
    assert "integrity" in exc.value.message and "blk.1.ffn_up.weight" in exc.value.message
    assert not (tmp_path / "out").exists() and not no_leftovers(tmp_path)


def test_a_quantized_parent_is_refused(quantized, tmp_path):
    """It validates (a quantized artifact is a valid artifact), but is no BF16 parent."""
    with pytest.raises(QuantizedParentError) as exc:
        quantize_artifact(quantized["Q8_0"].output, tmp_path / "again", "q4_0")
    assert exc.value.exit_code == 83 and exc.value.field == "strata.dflash.quantization"
    assert not (tmp_path / "again").exists()


def test_an_unknown_type_is_refused_before_anything_is_read(tmp_path):
    for qtype, heads in (("q6_k", None), ("q8_0", "bf16")):
        with pytest.raises(QuantTypeError) as exc:
            quantize_artifact(tmp_path / "missing", tmp_path / "out", qtype, heads=heads)
        assert exc.value.exit_code == 84


def test_a_block_too_large_for_the_type_is_refused_midway_leaving_nothing(tmp_path):
    """A finite BF16 value of 2e6 in the last layer's ffn_down: Q8_0 holds it (2e6/127 fits
    F16), Q4_0 cannot (2e6/8 overflows F16): refused during the pass, after earlier tensors
    were written to the temporary output, which is removed."""
    cfg = synthetic_config(markov_rank=0, enable_confidence_head=False)
    tensors = synthetic_tensors(cfg, seed=1)
    tensors["layers.1.mlp.down_proj.weight"][3, 40] = 2e6
    src = write_checkpoint(tmp_path / "src", cfg, tensors)
    parent = tmp_path / "parent"
    convert(src, parent)
    assert quantize_artifact(parent, tmp_path / "q8", "q8_0").manifest.quantization.type == "Q8_0"
    with pytest.raises(QuantScaleOverflowError) as exc:
        quantize_artifact(parent, tmp_path / "q4", "q4_0")
    assert exc.value.exit_code == 82 and exc.value.tensor == "blk.1.ffn_down.weight"
    assert "row 3, columns 32..63" in exc.value.message
    assert not (tmp_path / "q4").exists() and not no_leftovers(tmp_path)


# --- the CLI: dspark quantize --------------------------------------------------------------------

def test_cli_quantize_human_and_json(converted, tmp_path):
    out = tmp_path / "q5"
    proc = run_cli("quantize", str(converted["reference"]), "-o", str(out), "--type", "q5_0")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert f"-> {out} (Q5_0; head matrices BF16)" in proc.stdout
    assert "14 tensors BF16, 15 tensors Q5_0" in proc.stdout
    assert "error against BF16: relative RMS" in proc.stdout and "engines" in proc.stdout
    assert_valid(out)
    again = tmp_path / "q5-json"
    proc = run_cli("quantize", str(converted["reference"]), "-o", str(again), "--type", "Q5_0",
                   "--json", "--quiet")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["ok"] is True and data["quantization"]["type"] == "Q5_0"
    assert data["quantization"]["heads"] is None
    assert [f["path"] for f in data["parent"]["files"]] == ["drafter.gguf", "manifest.json"]
    assert len(data["errors"]) == 15 and set(data["engines"]) == {"strata.open", "strata.run",
                                                                  "llama.cpp"}
    # the same bytes as the human run: reproducible
    for name in ("drafter.gguf", "manifest.json"):
        assert (again / name).read_bytes() == (out / name).read_bytes()
    assert data["drafter_gguf"]["sha256"] == hashlib.sha256((out / "drafter.gguf").read_bytes()).hexdigest()


def test_cli_quantize_refusals(converted, quantized, tmp_path):
    out = tmp_path / "out"
    cases = [
        (["--type", "q6_k"], QuantTypeError, ["'q6_k'", "q8_0, q5_0, q4_0"]),
        (["--type", "q8_0", "--heads", "q8_0"], QuantRowWidthError, ["markov_w1.weight"]),
    ]
    for extra, error, needles in cases:
        proc = run_cli("quantize", str(converted["reference"]), "-o", str(out), *extra)
        assert_refused(proc, error, needles)
        assert not out.exists() and temp_siblings(out) == []
    proc = run_cli("quantize", str(quantized["Q8_0"].output), "-o", str(out), "--type", "q4_0")
    assert_refused(proc, QuantizedParentError, ["strata.dflash.quantization", "BF16 parent"])
    out.mkdir()
    proc = run_cli("quantize", str(converted["reference"]), "-o", str(out), "--type", "q8_0",
                   "--json")
    assert_refused(proc, OutputExistsError, [str(out)])
    assert json.loads(proc.stdout)["error"] == "OutputExistsError"
    broken = tmp_path / "broken"
    shutil.copytree(converted["dflash_plain"], broken)
    (broken / "manifest.json").write_text("{}")
    proc = run_cli("quantize", str(broken), "-o", str(tmp_path / "out2"), "--type", "q8_0")
    assert_refused(proc, ParentArtifactError, ["the parent artifact does not validate",
                                               "manifest.schema"])


# --- the runtime: a quantized artifact runs, dequantized on load ---------------------------------

PROMPTS = ("1,17,33,90,250,7,7,401", "1,40,43,46,49,52,55,58,61")


@pytest.mark.parametrize("qtype", quants.QUANT_TYPES)
def test_the_runtime_loads_each_quantized_matrix_as_gguf_py_dequantizes_it(converted, quantized,
                                                                           qtype):
    """Every quantized matrix comes back as gguf-py's dequantization of the parent's BF16
    values quantized by gguf-py (d x q, exact in float32); every other tensor as the BF16
    parent's; the plan counts the values (the memory estimate) and the stored bytes."""
    import torch

    from dspark_convert.runtime.weights import QuantizedTensor, load_drafter_weights, plan_drafter

    plan, parent_plan = plan_drafter(quantized[qtype].output), plan_drafter(converted["reference"])
    assert plan.numel == parent_plan.numel and plan.stored_bytes < parent_plan.stored_bytes
    weights = load_drafter_weights(quantized[qtype].output, plan=plan)
    parent = load_drafter_weights(converted["reference"])
    n = 0
    for name, value in parent.tensors.items():
        got = weights.tensors[name]
        assert got.dtype == torch.float32 and got.shape == value.shape, name
        if isinstance(plan.tensors[name], QuantizedTensor):
            ggml = GGMLQuantizationType[qtype]
            want = gguf_dequantize(gguf_quantize(value.numpy(), ggml), ggml)
            assert np.array_equal(got.numpy(), want), name
            n += 1
        else:
            assert torch.equal(got, value), name
    assert n == 15


def test_smoke_compare_prints_both_taus_and_the_difference(converted, quantized):
    args = ["smoke", str(quantized["Q4_0"].output), "--target", str(TARGET), "--compare",
            str(converted["reference"]), "--max-new-tokens", "24"]
    for prompt in PROMPTS:
        args += ["--prompt-ids", prompt]
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert f"compared with {converted['reference']} (the same 2 prompt(s) and settings):" in text
    assert "both lossless" in text and text.rstrip().endswith("PASSED")
    lines = [line.strip() for line in text.splitlines()]
    q_line = next(l for l in lines if l.startswith(str(quantized["Q4_0"].output) + " "))
    p_line = next(l for l in lines if l.startswith(str(converted["reference"]) + " "))
    d_line = next(l for l in lines if l.startswith("difference "))
    tau = lambda line: float(line.split("tau ")[1].split(";")[0])   # noqa: E731
    assert math.isclose(tau(d_line), tau(q_line) - tau(p_line), abs_tol=2e-3)

    proc = run_cli(*args, "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    compare = data["compare"]
    assert compare["parent"]["artifact"] == str(converted["reference"])
    assert [r["prompt"] for r in compare["parent"]["runs"]] == [r["prompt"] for r in data["runs"]]
    for key in ("temperature", "seed", "dtype", "verify", "max_new_tokens", "confidence_threshold"):
        assert compare["parent"][key] == data[key], key
    assert data["lossless"] is True and compare["parent"]["lossless"] is True
    assert compare["tau_difference"] == data["tau"] - compare["parent"]["tau"]
    assert compare["acceptance_difference"] == [
        None if a is None or b is None else a - b
        for a, b in zip(data["acceptance_by_position"], compare["parent"]["acceptance_by_position"])]
    # at temperature 0 both are the target's greedy output
    assert compare["same_outputs"] is True


def test_smoke_compare_refusals(converted, quantized, tmp_path):
    base = ["smoke", str(quantized["Q8_0"].output), "--target", str(TARGET), "--prompt-ids",
            PROMPTS[0], "--max-new-tokens", "8"]
    proc = run_cli(*base, "--compare", str(tmp_path / "missing"))
    assert_refused(proc, InvalidArtifactError, [str(tmp_path / "missing")])
    calibration = tmp_path / "calibration.json"
    calibration.write_text("{}")
    proc = run_cli(*base, "--compare", str(converted["reference"]), "--calibration", str(calibration))
    assert_refused(proc, SmokeInputError, ["--compare", "--calibration"])


def test_inspect_shows_a_quantized_artifacts_tensors_as_they_should_be(quantized, tmp_path):
    """Every tensor 'ok' under the quantized type rule; a norm whose type word is patched
    BF16 -> Q8_0 is a 'dtype' row and the inventory problem."""
    proc = run_cli("inspect", str(quantized["Q8_0"].output), "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["problem"] is None and {r["status"] for r in data["rows"]} == {"ok"}
    assert {r["dtype"] for r in data["rows"]} == {"BF16", "Q8_0"}
    art = tmp_path / "norm"
    shutil.copytree(quantized["Q8_0"].output, art)
    from gguf import GGUFReader

    field = next(t for t in GGUFReader(art / "drafter.gguf").tensors
                 if t.name == "blk.0.attn_norm.weight").field
    at = field.offset + sum(p.nbytes for p in field.parts[:4])      # the type word
    with open(art / "drafter.gguf", "r+b") as fh:
        fh.seek(at)
        fh.write(int(GGMLQuantizationType.Q8_0).to_bytes(4, "little"))
    data = json.loads(run_cli("inspect", str(art), "--json").stdout)
    assert [r["name"] for r in data["rows"] if r["status"] == "dtype"] == ["blk.0.attn_norm.weight"]
    assert data["problem"]["tensor"] == "blk.0.attn_norm.weight"


def test_inspect_words_a_type_the_key_does_not_name_as_validate_does(quantized, tmp_path):
    """The key says Q4_0 while the matrices are Q8_0: inspect's problem is validate's
    (the quantized type rule, 48, naming the type the key asks for), not a BF16 type error."""
    art = tmp_path / "key"
    shutil.copytree(quantized["Q8_0"].output, art)
    data = (art / "drafter.gguf").read_bytes()
    assert data.count(b"Q8_0") == 1                         # the key's value, nothing else
    (art / "drafter.gguf").write_bytes(data.replace(b"Q8_0", b"Q4_0"))
    inspected = json.loads(run_cli("inspect", str(art), "--json").stdout)
    validated = json.loads(run_cli("validate", str(art), "--json").stdout)
    failed = next(c for c in validated["checks"] if c["status"] == "failed")
    assert failed["name"] == "gguf.quantization" and failed["error"] == "QuantizedTensorError"
    problem = inspected["problem"]
    assert problem["error"] == "QuantizedTensorError" and problem["exit_code"] == 48
    assert problem["message"] == failed["detail"]
    assert "is Q8_0; expected Q4_0" in problem["message"]
