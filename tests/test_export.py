"""`dspark export --engine llama.cpp`: the file it writes, and every refusal.

The target GGUF here is written with gguf-py from the golden target's real weights and
tokenizer (support/llama_cpp.write_target_gguf), so these run without llama.cpp; the runs
in llama.cpp itself are tests/test_llama_cpp_equivalence.py and tests/test_llama_cpp_loader.py.
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest
from gguf import GGUFReader

from support.bounded import run_bounded
from support.cli import assert_refused, run_cli, temp_siblings
from support.llama_cpp import write_target_gguf
from support.paths import TRAINED_DRAFTERS

from dspark_convert import errors
from dspark_convert.artifact import llama_cpp as L
from dspark_convert.artifact.engines import gguf_inputs, llama_cpp
from dspark_convert.commands.convert import convert
from dspark_convert.commands.export import export_llama_cpp
from dspark_convert.formats.gguf_reader import read_gguf
from dspark_convert.synthetic import synthetic_config, synthetic_tensors, write_checkpoint


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return write_target_gguf(tmp_path_factory.mktemp("target") / "target.gguf")


@pytest.fixture(scope="module")
def dspark(paired_artifacts):
    return paired_artifacts["vanilla_conf_markov"]


@pytest.fixture(scope="module")
def dflash(paired_artifacts):
    return paired_artifacts["dflash_shared"]


def _kv(path):
    reader = GGUFReader(path)
    return {k: (f.types[0].name, f.contents()) for k, f in reader.fields.items()
            if not k.startswith("GGUF.")}


def _data(path, name):
    reader = GGUFReader(path)
    tensor = next(t for t in reader.tensors if t.name == name)
    return tensor.tensor_type.name, np.ascontiguousarray(tensor.data).view(np.uint8).tobytes()


# --- what the file holds ----------------------------------------------------------------------

def test_dspark_export_holds_llama_cpp_keys(dspark, target, tmp_path):
    result = export_llama_cpp(dspark, target, tmp_path / "d.gguf")
    kv = _kv(result.output)
    art = _kv(dspark / "drafter.gguf")
    ids = art["dflash.target_layers"][1]
    assert kv["dflash.target_layers"] == ("ARRAY", [i + 1 for i in ids])
    assert GGUFReader(result.output).fields["dflash.target_layers"].types[1].name == "INT32"
    assert kv["dflash.context_length"] == ("UINT32", 512)
    assert kv["dflash.rope.freq_base"] == ("FLOAT32", art["dflash.rope.frequency_base"][1])
    assert kv["dflash.sample_from_anchor"] == ("BOOL", True)
    assert kv["dflash.has_confidence_head"] == ("BOOL", True)
    assert kv["tokenizer.ggml.mask_token_id"] == ("UINT32", art["dflash.mask_token_id"][1])
    assert "dspark.format_version" not in kv and "dflash.attention.causal" not in kv
    theirs = _kv(target)
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
                "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id"):
        assert kv[key] == theirs[key], key
    assert kv["dspark.export.artifact_sha256"][1] == result.artifact_sha256
    assert result.artifact_sha256 == hashlib.sha256((dspark / "drafter.gguf").read_bytes()).hexdigest()
    assert result.sha256 == hashlib.sha256(result.output.read_bytes()).hexdigest()
    assert "draft-dspark" in result.drafter
    assert [c.status for c in result.checks] == ["passed", "passed", "passed"]


def test_every_key_llama_cpp_reads_is_written_with_its_type(dspark, target, tmp_path):
    from dspark_convert.artifact.engines import gguf_type_name

    gguf = read_gguf(export_llama_cpp(dspark, target, tmp_path / "d.gguf").output)
    for key, gtype, required in L.LOADER_KEYS:
        if key in gguf.kv:
            assert gguf_type_name(gguf.kv[key].type) == gtype, key
        else:
            assert not required, key


def test_tensors_are_the_artifact_s_with_norms_widened_to_f32(dspark, target, tmp_path):
    out = export_llama_cpp(dspark, target, tmp_path / "d.gguf").output
    ours = {t.name: t for t in read_gguf(out).tensors}
    art = {t.name: t for t in read_gguf(dspark / "drafter.gguf").tensors}
    assert set(ours) == set(art), "the default layout carries neither token_embd nor output"
    for name, info in art.items():
        kind, data = _data(out, name)
        _, source = _data(dspark / "drafter.gguf", name)
        assert tuple(ours[name].shape) == tuple(info.shape)
        if len(info.shape) == 1:
            assert kind == "F32"
            widened = (np.frombuffer(source, "<u2").astype("<u4") << 16).tobytes()
            assert data == widened, name
        else:
            assert kind == "BF16" and data == source, name


def test_keep_embedding_carries_the_target_s_embedding(dspark, target, tmp_path):
    result = export_llama_cpp(dspark, target, tmp_path / "d.gguf", keep_embedding=True)
    assert result.embedding_kept
    assert read_gguf(result.output).tensors[0].name == "token_embd.weight"
    assert _data(result.output, "token_embd.weight") == _data(target, "token_embd.weight")


def test_plain_dflash_export(dflash, target, tmp_path):
    result = export_llama_cpp(dflash, target, tmp_path / "d.gguf")
    kv = _kv(result.output)
    assert kv["dflash.has_confidence_head"] == ("BOOL", False)
    assert not any(t.name.startswith(("markov", "conf_proj")) for t in read_gguf(result.output).tensors)
    assert "--spec-type draft-dspark" in result.drafter


@pytest.mark.parametrize("name", sorted(TRAINED_DRAFTERS))
def test_emulated_llama_cpp_loader_accepts_the_export(paired_artifacts, target, tmp_path, name):
    out = export_llama_cpp(paired_artifacts[name], target, tmp_path / "d.gguf").output
    report = llama_cpp(*gguf_inputs(read_gguf(out)))
    assert report.accepts, report.refusals


def test_same_inputs_same_bytes(dspark, target, tmp_path):
    a = export_llama_cpp(dspark, target, tmp_path / "a.gguf")
    b = export_llama_cpp(dspark, target, tmp_path / "b.gguf")
    assert a.output.read_bytes() == b.output.read_bytes()


@pytest.fixture(scope="module")
def quantized(dspark, tmp_path_factory):
    from dspark_convert.commands.quantize import quantize_artifact

    out = tmp_path_factory.mktemp("q") / "q8"
    quantize_artifact(dspark, out, "q4_0")
    return out


def test_quantized_artifact_keeps_its_quantized_tensors(quantized, target, tmp_path):
    out = export_llama_cpp(quantized, target, tmp_path / "q.gguf").output
    ours = {t.name: t.ggml_type.name for t in read_gguf(out).tensors}
    art = {t.name: t.ggml_type.name for t in read_gguf(quantized / "drafter.gguf").tensors}
    assert ours["blk.0.attn_q.weight"] == "Q4_0" and ours["markov_w1.weight"] == "BF16"
    for name, kind in art.items():
        assert ours[name] == ("F32" if kind == "BF16" and name.endswith(("norm.weight", ".bias"))
                              else kind), name
        if ours[name] == kind:
            assert _data(out, name) == _data(quantized / "drafter.gguf", name)
    assert _kv(out)["general.file_type"] == ("UINT32", L.FILE_TYPES["Q4_0"])


def test_an_unquantizable_embedding_is_said_not_compared(dspark, tmp_path):
    q8 = write_target_gguf(tmp_path / "q8.gguf", embed_type="Q8_0")
    result = export_llama_cpp(dspark, q8, tmp_path / "d.gguf", keep_embedding=True)
    embedding = next(c for c in result.checks if c.name == "target.embedding")
    assert embedding.status == "info" and "could not be compared" in embedding.detail
    assert _data(result.output, "token_embd.weight")[0] == "Q8_0"


def test_a_tied_target_s_head_is_its_embedding(dspark, tmp_path):
    """The golden drafter's head is not its embedding: a tied target (no output.weight) is
    compared through token_embd and refused."""
    tied = write_target_gguf(tmp_path / "tied.gguf", tied=True)
    with pytest.raises(errors.TargetGGUFMismatchError, match="head of SHA-256"):
        export_llama_cpp(dspark, tied, tmp_path / "d.gguf")


# --- refusals: one line, their own code, nothing written --------------------------------------

def _refused(args, error, out, needles=()):
    proc = run_cli("export", *map(str, args))
    line = assert_refused(proc, error, needles)
    assert not out.exists() and temp_siblings(out) == []
    return line


def _export_args(artifact, target, out):
    return [artifact, "--engine", "llama.cpp", "--target-gguf", target, "-o", out]


@pytest.fixture(scope="module")
def head_artifacts(tmp_path_factory):
    """Artifacts with heads llama.cpp does not implement (synthetic, converted)."""
    root = tmp_path_factory.mktemp("heads")
    variants = {
        "gated": dict(markov_head_type="gated"),
        "rnn": dict(markov_head_type="rnn"),
        "conf_plain": dict(confidence_head_with_markov=False),
        "conf_no_markov": dict(markov_rank=0, markov_head_type=None,
                               confidence_head_with_markov=False),
    }
    out = {}
    for name, changes in variants.items():
        config = synthetic_config(**changes)
        src = write_checkpoint(root / f"{name}-src", config, synthetic_tensors(config))
        out[name] = root / name
        convert(src, out[name])
    return out


@pytest.mark.parametrize("head", ["gated", "rnn"])
def test_gated_or_rnn_markov_head_refused(head_artifacts, target, tmp_path, head):
    _refused(_export_args(head_artifacts[head], target, tmp_path / "d.gguf"),
             errors.EngineMarkovHeadError, tmp_path / "d.gguf",
             (f"'{head}'", "only the vanilla Markov head"))


@pytest.mark.parametrize("head", ["conf_plain", "conf_no_markov"])
def test_confidence_head_without_markov_input_refused(head_artifacts, target, tmp_path, head):
    _refused(_export_args(head_artifacts[head], target, tmp_path / "d.gguf"),
             errors.EngineConfidenceHeadError, tmp_path / "d.gguf", ("reads no Markov input",))


def test_target_that_is_not_a_gguf_refused(dspark, tmp_path):
    text = tmp_path / "target.gguf"
    text.write_text("not a gguf\n")
    out = tmp_path / "d.gguf"
    _refused(_export_args(dspark, text, out), errors.TargetGGUFError, out, ("not a readable GGUF",))
    _refused(_export_args(dspark, tmp_path / "missing.gguf", out), errors.TargetGGUFError, out,
             ("missing.gguf: not found",))
    (tmp_path / "dir").mkdir()
    _refused(_export_args(dspark, tmp_path / "dir", out), errors.TargetGGUFError, out,
             ("is a directory, not a regular file",))
    # A FIFO is named as one and never waited on (the one input-file rule, util/paths).
    os.mkfifo(tmp_path / "fifo.gguf")
    _refused(_export_args(dspark, tmp_path / "fifo.gguf", out), errors.TargetGGUFError, out,
             ("is a FIFO",))


@pytest.mark.parametrize("spelling", ["", " ", ".", "./", ".."])
def test_empty_or_dot_output_refused(dspark, target, tmp_path, spelling, monkeypatch):
    """-o "$UNSET" or '.' is refused before anything is touched (the one output rule, 32)."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "keep.txt").write_text("mine")
    monkeypatch.chdir(work)
    proc = run_cli("export", *map(str, _export_args(dspark, target, spelling)), "--force")
    assert_refused(proc, errors.OutputPathError, ("expected a path naming a new file",))
    assert sorted(p.name for p in work.iterdir()) == ["keep.txt"]
    assert (work / "keep.txt").read_text() == "mine"


def test_output_onto_the_target_refused(dspark, target, tmp_path):
    """--force never replaces what the export reads: the target GGUF, through a link too."""
    link = tmp_path / "link.gguf"
    link.symlink_to(target)
    before = target.read_bytes()
    proc = run_cli("export", *map(str, _export_args(dspark, target, link)), "--force")
    assert_refused(proc, errors.OutputExistsError, ("the target GGUF",))
    assert target.read_bytes() == before and link.is_symlink()


@pytest.mark.parametrize("change, needle", [
    (dict(arch="llama"), "general.architecture"),
    (dict(hidden=128), "qwen3.embedding_length"),
    (dict(layers=8), "qwen3.block_count"),
    (dict(drop=("qwen3.context_length",)), "qwen3.context_length"),
    (dict(drop=("tokenizer.ggml.tokens",)), "tokenizer.ggml.tokens"),
    (dict(change_embedding=True), "token_embd.weight"),
    (dict(change_head=True), "output.weight"),
])
def test_target_that_does_not_match_refused(dspark, tmp_path, change, needle):
    bad = write_target_gguf(tmp_path / "bad.gguf", **change)
    _refused(_export_args(dspark, bad, tmp_path / "d.gguf"), errors.TargetGGUFMismatchError,
             tmp_path / "d.gguf", (needle,))


def test_vocabulary_mismatch_refused(tmp_path):
    """A drafter of another vocabulary size than the target's tokens."""
    config = synthetic_config(hidden_size=64, num_attention_heads=4, head_dim=16,
                              vocab_size=256, mask_token_id=250)
    src = write_checkpoint(tmp_path / "src", config, synthetic_tensors(config))
    convert(src, tmp_path / "art")
    target = write_target_gguf(tmp_path / "t.gguf")
    _refused(_export_args(tmp_path / "art", target, tmp_path / "d.gguf"),
             errors.TargetGGUFMismatchError, tmp_path / "d.gguf", ("tokenizer.ggml.tokens", "256"))


def test_existing_output_refused_unless_force(dspark, target, tmp_path):
    out = tmp_path / "d.gguf"
    out.write_bytes(b"keep me")
    proc = run_cli("export", *map(str, _export_args(dspark, target, out)))
    assert_refused(proc, errors.OutputExistsError, ("--force",))
    assert out.read_bytes() == b"keep me"
    proc = run_cli("export", *map(str, _export_args(dspark, target, out)), "--force", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    assert report["engine"] == "llama.cpp" and not report["embedding_kept"]


def test_artifact_that_does_not_validate_refused(dspark, target, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(dspark, broken)
    gguf = broken / "drafter.gguf"
    data = bytearray(gguf.read_bytes())
    data[-3] ^= 0xFF                    # a weight byte: the hash recorded no longer holds
    gguf.write_bytes(bytes(data))
    _refused(_export_args(broken, target, tmp_path / "d.gguf"), errors.ExportArtifactError,
             tmp_path / "d.gguf", ("does not validate",))


def test_output_inside_the_artifact_refused(dspark, target):
    out = dspark / "d.gguf"
    proc = run_cli("export", *map(str, _export_args(dspark, target, out)))
    assert_refused(proc, errors.OutputExistsError, ("the artifact",))
    assert not out.exists()


# --- bounded memory ---------------------------------------------------------------------------

@pytest.mark.slow
def test_export_streams_in_bounded_memory(big_source, tmp_path):
    """A 130 MB artifact exported under an address-space cap a whole-file read of it would
    break: measured, the export runs in 200 MiB of address space and fails in 160 MiB."""
    art = tmp_path / "big"
    convert(big_source, art)
    config = json.loads((big_source / "config.json").read_text())
    target = _big_target(tmp_path / "t.gguf", config)
    out = tmp_path / "d.gguf"
    proc = run_bounded("export", str(art), "--engine", "llama.cpp", "--target-gguf",
                       str(target), "-o", str(out), "--quiet", memory_mb=300, seconds=120)
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_size > 130_000_000
    assert os.path.getsize(art / "drafter.gguf") > 130_000_000


def _big_target(path, config):
    """A target GGUF for the big synthetic drafter: its geometry and a token list (the
    drafter records no embedding hash, so the tensors' values are not compared)."""
    from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

    H, V = config["hidden_size"], config["vocab_size"]
    writer = GGUFWriter(path, "qwen3")
    writer.add_key_value("qwen3.block_count", config["num_target_layers"], GGUFValueType.UINT32)
    writer.add_key_value("qwen3.context_length", 4096, GGUFValueType.UINT32)
    writer.add_key_value("qwen3.embedding_length", H, GGUFValueType.UINT32)
    writer.add_key_value("tokenizer.ggml.model", "gpt2", GGUFValueType.STRING)
    writer.add_key_value("tokenizer.ggml.tokens", [f"t{i}" for i in range(V)],
                         GGUFValueType.ARRAY, sub_type=GGUFValueType.STRING)
    zeros = np.zeros((V, H), dtype=np.uint16)
    writer.add_tensor("token_embd.weight", zeros, raw_dtype=GGMLQuantizationType.BF16)
    writer.add_tensor("output.weight", zeros, raw_dtype=GGMLQuantizationType.BF16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
