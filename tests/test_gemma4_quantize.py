"""Quantized Gemma4 artifacts: `dspark quantize` takes a gemma4-dspark
artifact as it takes a Qwen3 one, by the one type rule (artifact/quantized.py, read from the
family's tensor table): the matrices (fc, q/k/o, v only without attention_k_eq_v, the MLP's
gate/up/down) in the type, bit for bit gguf-py's quantizer on the parent's BF16 values; the
layer scalars (blk.N.layer_output_scale.weight, [1]) and the four norms per layer stay BF16,
bytes unchanged; the Markov and confidence matrices only with --heads. `dspark validate`
accepts the result and checks it fully (the type rule, the two keys, the manifest's parent
and quantization records, every block scale); the runtime plans it and loads each matrix as
gguf-py dequantizes it. A layer scalar or norm retyped in a quantized file is refused."""

from __future__ import annotations

import hashlib
import json
import math
import shutil

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize
from safetensors.torch import load_file, save_file

from support.cli import assert_refused, run_cli, run_process, temp_siblings
from support.gemma4 import GEMMA4_DRAFTERS, GEMMA4_TARGET
from support.llama_cpp import rewrite_gguf
from dspark_convert import errors as E
from dspark_convert.commands.convert import convert
from dspark_convert.commands.quantize import quantize_artifact
from dspark_convert.commands.validate import validate_artifact
from dspark_convert.formats import quants
from dspark_convert.formats.gguf_reader import read_gguf
from dspark_convert.runtime.weights import QuantizedTensor, load_drafter_weights, plan_drafter

NAMES = sorted(GEMMA4_DRAFTERS)
DSPARK = "gemma4_vanilla_conf_markov"
# What the brief of the format says each Gemma4 tensor gets (docs/ARTIFACT_FORMAT.md,
# Quantized artifacts), written out here rather than asked of the rule under test.
MATRICES = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
            "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")
KEPT_PER_LAYER = ("layer_output_scale.weight", "attn_q_norm.weight", "attn_k_norm.weight",
                  "attn_norm.weight", "post_attention_norm.weight", "ffn_norm.weight",
                  "post_ffw_norm.weight")
HEAD_MATRICES = ("markov_w1.weight", "markov_w2.weight", "conf_proj.weight")


def tensors_of(artifact) -> dict[str, tuple[str, list[int], bytes]]:
    path = artifact / "drafter.gguf"
    gguf, raw = read_gguf(path), path.read_bytes()
    return {t.name: (t.ggml_type.name, list(t.shape), raw[t.data_offset:t.data_offset + t.nbytes])
            for t in gguf.tensors}


def is_backbone(name: str) -> bool:
    return name == "fc.weight" or (name.startswith("blk.") and name.split(".", 2)[2] in MATRICES)


def as_float32(bf16: bytes, shape: list[int]) -> np.ndarray:
    """BF16 bytes of GGUF shape [ne0, ne1] as the float32 [ne1, ne0] they widen to exactly."""
    return (np.frombuffer(bf16, "<u2").astype(np.uint32) << 16).view(np.float32).reshape(
        shape[1], shape[0])


def gguf_py_oracle(bf16: bytes, shape: list[int], qtype: str) -> bytes:
    return gguf_quantize(as_float32(bf16, shape), GGMLQuantizationType[qtype]).tobytes()


@pytest.fixture(scope="module")
def parents(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma4-parents")
    out = {}
    for name in NAMES:
        out[name] = root / name
        convert(GEMMA4_DRAFTERS[name], out[name])
    return out


@pytest.fixture(scope="module")
def quantized(parents, tmp_path_factory):
    """(drafter, type) -> each Gemma4 fixture quantized to each type, once."""
    root = tmp_path_factory.mktemp("gemma4-quantized")
    return {(name, qtype): quantize_artifact(parents[name], root / f"{name}-{qtype}", qtype)
            for name in NAMES for qtype in quants.QUANT_TYPES}


CASES = [(name, qtype) for name in NAMES for qtype in quants.QUANT_TYPES]
IDS = [f"{name}-{qtype}" for name, qtype in CASES]


@pytest.mark.parametrize("name,qtype", CASES, ids=IDS)
def test_matrices_are_gguf_py_bytes_and_the_rest_the_parents(parents, quantized, name, qtype):
    parent, child = tensors_of(parents[name]), tensors_of(quantized[name, qtype].output)
    assert list(child) == list(parent)                       # same tensors, same order
    assert not any(n.endswith(".attn_v.weight") for n in parent)   # k_eq_v: no v_proj
    n_quantized = 0
    for tensor, (ptype, shape, pbytes) in parent.items():
        ctype, cshape, cbytes = child[tensor]
        assert ptype == "BF16" and cshape == shape, tensor
        if is_backbone(tensor):
            assert ctype == qtype, tensor
            assert cbytes == gguf_py_oracle(pbytes, shape, qtype), tensor
            n_quantized += 1
        else:   # layer scalars, the norms and (without --heads) the Markov/confidence matrices
            assert ctype == "BF16" and cbytes == pbytes, tensor
    assert n_quantized == 1 + 6 * 2        # fc + q, k, o, gate, up, down in each of 2 layers
    for i in (0, 1):
        for kept in KEPT_PER_LAYER:
            assert child[f"blk.{i}.{kept}"][0] == "BF16"
    scalar = child["blk.1.layer_output_scale.weight"]
    assert scalar[1] == [1] and as_float32(scalar[2], [1, 1]).tolist() == [[1.125]]


@pytest.mark.parametrize("name,qtype", CASES, ids=IDS)
def test_keys_and_manifest_name_the_parent_and_each_error(parents, quantized, name, qtype):
    out = quantized[name, qtype].output
    parent_gguf = (parents[name] / "drafter.gguf").read_bytes()
    parent_sha = hashlib.sha256(parent_gguf).hexdigest()
    pkv, ckv = read_gguf(parents[name] / "drafter.gguf").kv, read_gguf(out / "drafter.gguf").kv
    assert list(ckv)[:len(pkv)] == list(pkv)
    assert all(ckv[k].value == pkv[k].value for k in pkv)
    assert [(k, ckv[k].value) for k in list(ckv)[len(pkv):]] == [
        ("strata.dflash.quantization", qtype), ("strata.dflash.source_sha256", parent_sha)]
    assert ckv["dspark.family"].value == "gemma4-dspark"

    manifest = json.loads((out / "manifest.json").read_text())
    parent_manifest = json.loads((parents[name] / "manifest.json").read_text())
    for key in ("source", "target", "contract"):
        assert manifest[key] == parent_manifest[key], key
    assert {f["path"]: (f["size"], f["sha256"]) for f in manifest["parent"]["files"]} == {
        f: (len(b), hashlib.sha256(b).hexdigest())
        for f, b in (("drafter.gguf", parent_gguf),
                     ("manifest.json", (parents[name] / "manifest.json").read_bytes()))}
    assert manifest["quantization"]["type"] == qtype and manifest["quantization"]["heads"] is None
    child, parent = tensors_of(out), tensors_of(parents[name])
    for record in manifest["artifact"]["tensors"]:
        ctype, shape, cbytes = child[record["name"]]
        assert (record["type"], record["shape"]) == (ctype, shape)
        assert record["sha256"] == hashlib.sha256(cbytes).hexdigest()
        if ctype == "BF16":
            assert "error" not in record, record["name"]
            continue
        back = gguf_dequantize(np.frombuffer(cbytes, np.uint8).reshape(shape[1], -1),
                               GGMLQuantizationType[qtype]).astype(np.float64)
        ref = as_float32(parent[record["name"]][2], shape).astype(np.float64)
        diff = back - ref
        assert math.isclose(record["error"]["max_abs"], np.abs(diff).max(), rel_tol=1e-5)
        assert math.isclose(record["error"]["rel_rms"],
                            math.sqrt((diff ** 2).sum() / (ref ** 2).sum()), rel_tol=1e-5)


@pytest.mark.parametrize("name,qtype", CASES, ids=IDS)
def test_validate_passes_and_checks_the_quantized_artifact(quantized, name, qtype):
    report = validate_artifact(quantized[name, qtype].output)
    assert report.exit_code(strict=True) == 0, report.first_failure
    details = {c.name: c.detail for c in report.checks}
    kept = 33 - 13 if name == DSPARK else 29 - 13
    assert details["gguf.quantization"].startswith(f"{qtype} artifact: {kept} BF16, 13 {qtype};")
    assert "layer scalars BF16" in details["gguf.quantization"]
    assert "every block scale of the 13 quantized ones finite" in details["gguf.values"]


def test_errors_order_by_precision(quantized):
    for name in NAMES:
        rel = {q: {t.name: t.error.rel_rms for t in quantized[name, q].manifest.artifact.tensors
                   if t.error} for q in quants.QUANT_TYPES}
        assert len(rel["Q8_0"]) == 13
        for tensor in rel["Q8_0"]:
            assert rel["Q8_0"][tensor] < rel["Q5_0"][tensor] < rel["Q4_0"][tensor], tensor
        assert max(rel["Q8_0"].values()) < 0.01


@pytest.mark.parametrize("qtype", quants.QUANT_TYPES)
def test_the_runtime_plans_and_loads_it_as_gguf_py_dequantizes(parents, quantized, qtype):
    """plan_drafter holds each tensor to the type rule (artifact/quantized.allowed_types,
    rule_whens from the Gemma4 table); every quantized matrix loads as gguf-py's
    dequantization of gguf-py's quantization of the parent's values, every other tensor
    (layer scalars, norms, heads) as the BF16 parent's."""
    out = quantized[DSPARK, qtype].output
    plan, parent_plan = plan_drafter(out), plan_drafter(parents[DSPARK])
    assert type(plan.contract).__name__ == "Gemma4Contract"
    assert plan.numel == parent_plan.numel and plan.stored_bytes < parent_plan.stored_bytes
    planned = {n: s.quant for n, s in plan.tensors.items() if isinstance(s, QuantizedTensor)}
    assert len(planned) == 13 and set(planned.values()) == {qtype}
    assert not isinstance(plan.tensors["layers.0.layer_scalar"], QuantizedTensor)
    assert plan.tensors["layers.0.layer_scalar"].dtype == torch.bfloat16
    weights, parent = load_drafter_weights(out, plan=plan), load_drafter_weights(parents[DSPARK])
    assert list(weights.tensors) == list(parent.tensors)
    ggml = GGMLQuantizationType[qtype]
    for tensor, value in parent.tensors.items():
        got = weights.tensors[tensor]
        assert got.dtype == torch.float32 and got.shape == value.shape, tensor
        if tensor in planned:
            want = gguf_dequantize(gguf_quantize(value.numpy(), ggml), ggml)
            assert np.array_equal(got.numpy(), want), tensor
        else:
            assert torch.equal(got, value), tensor
    assert weights.tensors["layers.1.layer_scalar"].tolist() == [1.125]


def test_byte_reproducible(parents, quantized, tmp_path):
    again = quantize_artifact(parents[DSPARK], tmp_path / "again", "q5_0").output
    for f in ("drafter.gguf", "manifest.json"):
        assert (again / f).read_bytes() == (quantized[DSPARK, "Q5_0"].output / f).read_bytes()


# --- v_proj, --heads, a paired artifact ----------------------------------------------------------

def _copy_drafter(tmp_path, name: str, edit, tensors_edit) -> object:
    draft = tmp_path / name
    shutil.copytree(GEMMA4_DRAFTERS[DSPARK], draft)
    cfg = json.loads((draft / "config.json").read_text())
    edit(cfg)
    (draft / "config.json").write_text(json.dumps(cfg, indent=2))
    tensors = load_file(draft / "model.safetensors")
    tensors_edit(tensors, torch.Generator().manual_seed(3))
    save_file(tensors, draft / "model.safetensors")
    return draft


def _with_v_proj(tensors, gen):
    """The drafter for a target whose full layers keep v_proj (attention_k_eq_v false): KV
    heads from num_key_value_heads (2), a v_proj per layer (as tests/test_gemma4_target.py
    builds it)."""
    for i in range(2):
        k = tensors[f"layers.{i}.self_attn.k_proj.weight"]
        tensors[f"layers.{i}.self_attn.k_proj.weight"] = torch.cat([k, k])
        tensors[f"layers.{i}.self_attn.v_proj.weight"] = (
            torch.randn(k.shape[0] * 2, k.shape[1], generator=gen) * 0.02).to(k.dtype)


def _rank_32(tensors, gen):
    """Markov rank 32 (the fixture's is 16): head matrices with rows of 32 and 96 values,
    which the 32-value blocks hold."""
    for n in ("markov_head.markov_w1.weight", "markov_head.markov_w2.weight"):
        tensors[n] = (torch.randn(512, 32, generator=gen) * 0.02).to(torch.bfloat16)
    tensors["confidence_head.proj.weight"] = (
        torch.randn(1, 64 + 32, generator=gen) * 0.02).to(torch.bfloat16)


def test_without_k_eq_v_the_v_proj_is_quantized_too(tmp_path):
    src = _copy_drafter(tmp_path, "v-src", lambda c: c.update(attention_k_eq_v=False,
                                                              num_key_value_heads=2), _with_v_proj)
    convert(src, tmp_path / "parent")
    result = quantize_artifact(tmp_path / "parent", tmp_path / "q", "q4_0")
    parent, child = tensors_of(tmp_path / "parent"), tensors_of(result.output)
    for i in (0, 1):
        ptype, shape, pbytes = parent[f"blk.{i}.attn_v.weight"]
        assert child[f"blk.{i}.attn_v.weight"][0] == "Q4_0"
        assert child[f"blk.{i}.attn_v.weight"][2] == gguf_py_oracle(pbytes, shape, "Q4_0")
    assert sum(t == "Q4_0" for t, _s, _b in child.values()) == 1 + 7 * 2
    assert validate_artifact(result.output).exit_code(strict=True) == 0


def test_heads_quantized_only_when_asked(tmp_path):
    src = _copy_drafter(tmp_path, "r32-src", lambda c: c.update(markov_rank=32), _rank_32)
    parent = tmp_path / "parent"
    convert(src, parent)
    kept = quantize_artifact(parent, tmp_path / "kept", "q8_0")
    heads = quantize_artifact(parent, tmp_path / "heads", "q8_0", heads="q4_0")
    pt, kt, ht = tensors_of(parent), tensors_of(kept.output), tensors_of(heads.output)
    for tensor, (_t, shape, pbytes) in pt.items():
        if tensor in HEAD_MATRICES:
            assert kt[tensor][0] == "BF16" and kt[tensor][2] == pbytes
            assert ht[tensor][0] == "Q4_0" and ht[tensor][2] == gguf_py_oracle(pbytes, shape, "Q4_0")
        elif is_backbone(tensor):
            assert kt[tensor][2] == ht[tensor][2] == gguf_py_oracle(pbytes, shape, "Q8_0")
        else:   # layer scalars, norms, conf_proj.bias
            assert kt[tensor][0] == ht[tensor][0] == "BF16"
            assert kt[tensor][2] == ht[tensor][2] == pbytes, tensor
    assert (kept.manifest.quantization.heads, heads.manifest.quantization.heads) == (None, "Q4_0")
    report = validate_artifact(heads.output)
    assert report.exit_code(strict=True) == 0, report.first_failure
    assert next(c.detail for c in report.checks if c.name == "gguf.quantization").endswith(
        "head matrices Q4_0")


def test_heads_of_the_fixture_rank_16_are_refused_and_dflash_has_none(parents, tmp_path):
    out = tmp_path / "out"
    proc = run_cli("quantize", str(parents[DSPARK]), "-o", str(out), "--type", "q8_0",
                   "--heads", "q8_0")
    assert_refused(proc, E.QuantRowWidthError, ["markov_w1.weight", "16"])
    assert not out.exists() and temp_siblings(out) == []
    # A plain DFlash drafter has no head matrices: the manifest records what was done (null).
    result = quantize_artifact(parents["gemma4_dflash"], out, "q8_0", heads="q4_0")
    assert result.manifest.quantization.heads is None


def test_a_paired_artifact_keeps_its_target_and_validates_against_it(tmp_path):
    parent = tmp_path / "paired"
    convert(GEMMA4_DRAFTERS[DSPARK], parent, target=GEMMA4_TARGET)
    out = quantize_artifact(parent, tmp_path / "q", "q8_0").output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["target"] == json.loads((parent / "manifest.json").read_text())["target"]
    assert manifest["target"] is not None
    proc = run_cli("validate", "--strict", str(out), "--target", str(GEMMA4_TARGET))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_canary_in_real_processes(parents, tmp_path):
    """The console script: quantize exits 0 and says what it did; validate --strict passes."""
    out = tmp_path / "q4"
    proc = run_process("quantize", str(parents[DSPARK]), "-o", str(out), "--type", "q4_0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "(Q4_0; head matrices BF16)" in proc.stdout
    assert "20 tensors BF16, 13 tensors Q4_0" in proc.stdout
    proc = run_process("validate", "--strict", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- hostile: what must stay BF16, retyped ------------------------------------------------------

def _patch_type(artifact, tensor: str, qtype: GGMLQuantizationType) -> None:
    """The type word of one tensor's info rewritten in place (nothing else changes)."""
    path = artifact / "drafter.gguf"
    field = next(t for t in GGUFReader(path).tensors if t.name == tensor).field
    at = field.offset + sum(p.nbytes for p in field.parts[:4])
    with open(path, "r+b") as fh:
        fh.seek(at)
        fh.write(int(qtype).to_bytes(4, "little"))


def test_a_layer_scalar_retyped_is_refused(quantized, tmp_path):
    """F16 has BF16's size: the file parses and the inventory matches; the quantized type
    rule refuses it (48), naming the tensor. A block type cannot hold its one value: the
    reader refuses it (41)."""
    art = tmp_path / "f16"
    shutil.copytree(quantized[DSPARK, "Q8_0"].output, art)
    _patch_type(art, "blk.1.layer_output_scale.weight", GGMLQuantizationType.F16)
    proc = run_cli("validate", str(art))
    line = assert_refused(proc, E.QuantizedTensorError,
                          ["gguf.quantization", "'blk.1.layer_output_scale.weight' is F16",
                           "expected BF16", "a scalar stays BF16"])
    assert "integrity" not in line
    with pytest.raises(E.ParentArtifactError):    # nor is it anyone's parent
        quantize_artifact(art, tmp_path / "never", "q4_0")
    assert not (tmp_path / "never").exists()

    art = tmp_path / "q8"
    shutil.copytree(quantized[DSPARK, "Q8_0"].output, art)
    _patch_type(art, "blk.0.layer_output_scale.weight", GGMLQuantizationType.Q8_0)
    assert_refused(run_cli("validate", str(art)), E.GGUFFormatError,
                   ["blk.0.layer_output_scale.weight", "Q8_0", "32"])


def test_a_norm_written_as_q8_0_blocks_is_refused(quantized, tmp_path):
    """A well-formed file whose post-FFW norm (64 values: two Q8_0 blocks) is quantized."""
    art = tmp_path / "norm"
    shutil.copytree(quantized[DSPARK, "Q8_0"].output, art)
    rewrite_gguf(quantized[DSPARK, "Q8_0"].output / "drafter.gguf", art / "drafter.gguf",
                 add_tensors={"blk.0.post_ffw_norm.weight": ([64], "Q8_0")})
    assert_refused(run_cli("validate", str(art)), E.QuantizedTensorError,
                   ["'blk.0.post_ffw_norm.weight' is Q8_0", "a norm stays BF16"])


def test_a_quantized_gemma4_parent_is_refused(quantized, tmp_path):
    out = tmp_path / "again"
    proc = run_cli("quantize", str(quantized["gemma4_dflash", "Q8_0"].output), "-o", str(out),
                   "--type", "q4_0")
    assert_refused(proc, E.QuantizedParentError, ["strata.dflash.quantization", "BF16 parent"])
    assert not out.exists()
