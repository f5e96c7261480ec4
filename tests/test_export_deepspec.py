"""`dspark export --engine deepspec`: config.json + model.safetensors as
DeepSpec saves a checkpoint, every tensor bit-exact, the embedding and head from the target.

The round trip is the test of bit-exactness: every golden drafter (DeepSeek's two Qwen3 and
two Gemma4 drafters, and the synthetic fixtures) converted, exported and converted again
gives the artifact's drafter.gguf byte for byte; where the source's weights file cannot be
reproduced (sharded, F32), it gives it but for dflash.source.sha256, and each tensor is
still the source's (or its BF16 rounding, which the artifact holds).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from support.bounded import run_bounded
from support.cli import assert_refused, run_cli, run_process, temp_siblings
from support.gemma4 import GEMMA4_DRAFTERS, GEMMA4_TARGET
from support.paths import GOLDEN, GOLDEN_TARGET, TRAINED_DRAFTERS
from support.targets import make_target

from dspark_convert import errors
from dspark_convert.commands.convert import convert
from dspark_convert.commands.export_deepspec import export_deepspec
from dspark_convert.commands.quantize import quantize_artifact
from dspark_convert.formats.gguf_reader import read_gguf
from dspark_convert.formats.numerics import round_to_bf16
from dspark_convert.formats.safetensors import read_checkpoint
from dspark_convert.target.model import EMBED_NAME, HEAD_NAME

SYNTHETIC = sorted(p.name for p in (GOLDEN / "synthetic").iterdir())
# (case, source checkpoint, its target: a directory, or "synthetic" for one made from it)
CASES = ([(name, path, GOLDEN_TARGET) for name, path in TRAINED_DRAFTERS.items()]
         + [(name, path, GEMMA4_TARGET) for name, path in GEMMA4_DRAFTERS.items()]
         + [(name, GOLDEN / "synthetic" / name, "synthetic") for name in SYNTHETIC])
# The synthetic sources whose weights file cannot be the export's (one BF16 file): what the
# export says why, and the drafter.gguf keys a convert of it records otherwise (the hashes
# of source bytes: the weights file's, and from an F32 source the embedding's and head's).
NOT_REPRODUCIBLE = {"vanilla_sharded": ("3 files", {"dflash.source.sha256"}),
                    "vanilla_f32": ("F32", {"dflash.source.sha256", "dflash.target.embed_sha256",
                                            "dflash.target.lm_head_sha256"})}


def _word_level(tokens: int) -> str:
    """A word-level tokenizer.json with ids 0..tokens-1: below every synthetic mask token."""
    vocab = {"[UNK]": 0, **{f"w{i}": i for i in range(1, tokens)}}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    return tokenizer.to_str()


def _synthetic_target(root: Path, source: Path) -> Path:
    """A Qwen3 target for a synthetic drafter: the golden target at the drafter's geometry
    (hidden 32, vocab 256, 6 layers), a tokenizer below its mask token, and as its embedding
    and head the drafter's own copies (the bytes the artifact's hashes are of), in the
    drafter's dtype; random ones where the drafter has none."""
    config = json.loads((source / "config.json").read_text())
    make_target(root, hidden=config["hidden_size"], vocab=config["vocab_size"],
                tokenizer=_word_level(200))
    weights = load_file(root / "model.safetensors")
    copies = {}
    for path in sorted(source.glob("*.safetensors")):
        copies.update(load_file(path))
    for ours, theirs in (("embed_tokens.weight", EMBED_NAME), ("lm_head.weight", HEAD_NAME)):
        if ours in copies:
            weights[theirs] = copies[ours]
    save_file(weights, root / "model.safetensors")
    return root


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """case -> (source, target, artifact A, export of A, result): each golden drafter
    converted with its target and exported into a directory named as its source (so that
    general.name agrees)."""
    root = tmp_path_factory.mktemp("deepspec")
    out = {}
    for name, source, target in CASES:
        if target == "synthetic":
            target = _synthetic_target(root / "targets" / name, source)
        art = root / "artifacts" / name
        convert(source, art, target=target)
        result = export_deepspec(art, target, root / "exports" / name / source.name)
        out[name] = (source, target, art, result.output, result)
    return out


def _kv(path: Path) -> dict[str, object]:
    return {k: v.value for k, v in read_gguf(path).kv.items()}


def _tensor_bytes(directory: Path) -> dict[str, tuple[str, bytes]]:
    """{name: (dtype, raw bytes)} of a checkpoint's tensors, read by the project's reader."""
    tensors = {}
    for name, entry in read_checkpoint(directory).tensors.items():
        with open(entry.file, "rb") as fh:
            fh.seek(entry.begin)
            tensors[name] = (entry.dtype, fh.read(entry.nbytes))
    return tensors


# --- the round trip ------------------------------------------------------------------------

@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_convert_of_the_export_is_the_artifact(exported, tmp_path, name):
    source, target, art, out, result = exported[name]
    again = tmp_path / "again"
    convert(out, again, target=target)
    ours, theirs = (again / "drafter.gguf").read_bytes(), (art / "drafter.gguf").read_bytes()
    weights_sha = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
    if name not in NOT_REPRODUCIBLE:
        assert ours == theirs
        # Both files are the source's bytes, so the manifest is too.
        assert (again / "manifest.json").read_bytes() == (art / "manifest.json").read_bytes()
        assert (out / "model.safetensors").read_bytes() == (source / "model.safetensors").read_bytes()
        assert (out / "config.json").read_bytes() == (source / "config.json").read_bytes()
        assert result.weights_identical and result.config_identical
        assert {c.name: c.status for c in result.checks}["export.round_trip"] == "passed"
    else:
        # Every byte but those source hashes, which are now the export's bytes' SHA-256s.
        why, keys = NOT_REPRODUCIBLE[name]
        kv_a, kv_b = _kv(art / "drafter.gguf"), _kv(again / "drafter.gguf")
        assert {k for k in kv_a if kv_a[k] != kv_b[k]} == keys and kv_a.keys() == kv_b.keys()
        for key in keys:
            assert theirs.count(kv_a[key].encode()) == 1
            theirs = theirs.replace(kv_a[key].encode(), kv_b[key].encode())
        assert theirs == ours
        assert kv_b["dflash.source.sha256"] == weights_sha
        tensors = _tensor_bytes(out)
        for key, tensor in (("dflash.target.embed_sha256", "embed_tokens.weight"),
                            ("dflash.target.lm_head_sha256", "lm_head.weight")):
            assert kv_b[key] == hashlib.sha256(tensors[tensor][1]).hexdigest()
        assert not result.weights_identical
        weights = {c.name: c for c in result.checks}["export.weights"]
        assert weights.status == "info" and why in weights.detail
    assert result.files[1].sha256 == weights_sha


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_every_tensor_is_the_source_s(exported, name):
    """Bit-exact, tensor by tensor; from an F32 source, its BF16 rounding (the artifact's)."""
    source, _target, _art, out, result = exported[name]
    ours, theirs = _tensor_bytes(out), _tensor_bytes(source)
    assert list(ours) == sorted(theirs)
    assert result.tensors == len(theirs)
    for tensor, (dtype, data) in theirs.items():
        want = data if dtype == "BF16" else round_to_bf16(np.frombuffer(data, "<f4")).tobytes()
        assert ours[tensor] == ("BF16", want), tensor
    stripped = [t for t in ("embed_tokens.weight", "lm_head.weight") if t in theirs]
    assert list(result.from_target) == stripped


def test_an_f32_source_s_config_says_bfloat16(exported):
    source, *_ , out, result = exported["vanilla_f32"]
    want = json.loads((source / "config.json").read_text())
    assert want["dtype"] == "float32"
    assert json.loads((out / "config.json").read_text()) == {**want, "dtype": "bfloat16"}
    assert not result.config_identical


def test_the_head_of_an_untied_target_is_its_lm_head(exported):
    """DeepSeek's Qwen3 drafter's lm_head is the golden target's lm_head.weight (untied),
    not its embedding; both Gemma4 copies are the tied embedding."""
    target = load_file(GOLDEN_TARGET / "model.safetensors")
    drafter = load_file(exported["vanilla_conf_markov"][3] / "model.safetensors")
    assert torch.equal(drafter["lm_head.weight"].view(torch.int16), target[HEAD_NAME].view(torch.int16))
    assert not torch.equal(drafter["lm_head.weight"], drafter["embed_tokens.weight"])
    gemma = load_file(exported["gemma4_vanilla_conf_markov"][3] / "model.safetensors")
    embed = load_file(GEMMA4_TARGET / "model.safetensors")["model.language_model.embed_tokens.weight"]
    for copy in ("embed_tokens.weight", "lm_head.weight"):
        assert torch.equal(gemma[copy].view(torch.int16), embed.view(torch.int16))


def test_the_same_inputs_give_the_same_bytes(exported, tmp_path):
    _source, target, art, out, _result = exported["gemma4_dflash"]
    again = export_deepspec(art, target, tmp_path / "again").output
    for name in ("config.json", "model.safetensors"):
        assert (again / name).read_bytes() == (out / name).read_bytes()


# --- refusals: nothing written ---------------------------------------------------------------

def _assert_nothing(out: Path) -> None:
    assert not out.exists() and not temp_siblings(out)


def test_a_target_with_one_other_embedding_value_is_refused(exported, tmp_path):
    _source, _target, art, *_ = exported["vanilla_conf_markov"]
    target = tmp_path / "target"
    shutil.copytree(GOLDEN_TARGET, target)
    weights = load_file(target / "model.safetensors")
    embed = weights[EMBED_NAME].clone()
    embed.view(torch.int16)[17, 5] += 1                     # one value, one ulp
    weights[EMBED_NAME] = embed
    save_file(weights, target / "model.safetensors")
    out = tmp_path / "out"
    proc = run_cli("export", str(art), "--engine", "deepspec", "--target", str(target),
                   "-o", str(out))
    assert_refused(proc, errors.EmbeddingIdentityError,
                   ("embed_tokens", "not this target's embedding"))
    _assert_nothing(out)


def test_a_target_of_another_drafter_is_refused(exported, tmp_path):
    """The Gemma4 drafter against the Qwen3 target: the pairing's own code."""
    art = exported["gemma4_dflash"][2]
    out = tmp_path / "out"
    proc = run_cli("export", str(art), "--engine", "deepspec", "--target", str(GOLDEN_TARGET),
                   "-o", str(out))
    assert_refused(proc, errors.TargetFamilyError, ("model_type",))
    _assert_nothing(out)


def test_a_quantized_artifact_is_refused(exported, tmp_path):
    _source, target, art, *_ = exported["vanilla_conf_markov"]
    quantized = tmp_path / "q8"
    quantize_artifact(art, quantized, "q8_0")
    out = tmp_path / "out"
    proc = run_cli("export", str(quantized), "--engine", "deepspec", "--target", str(target),
                   "-o", str(out))
    line = assert_refused(proc, errors.QuantizedExportError,
                          ("strata.dflash.quantization", "Q8_0", "BF16"))
    assert hashlib.sha256((art / "drafter.gguf").read_bytes()).hexdigest() in line
    _assert_nothing(out)


def test_an_invalid_artifact_is_refused_as_export_s(exported, tmp_path):
    _source, target, art, *_ = exported["dflash_shared"]
    broken = tmp_path / "broken"
    shutil.copytree(art, broken)
    data = bytearray((broken / "drafter.gguf").read_bytes())
    data[-3] ^= 1
    (broken / "drafter.gguf").write_bytes(bytes(data))
    out = tmp_path / "out"
    proc = run_cli("export", str(broken), "--engine", "deepspec", "--target", str(target),
                   "-o", str(out))
    assert_refused(proc, errors.ExportArtifactError, ("does not validate",))
    _assert_nothing(out)


@pytest.mark.parametrize("engine, field", [("deepspec", "zz_long"),
                                           ("speculators", "pad_token_id")])
def test_a_recorded_config_too_long_to_read_back_is_refused(exported, tmp_path, engine, field):
    """A valid artifact whose manifest (hand-made, compact, under its own 4 MiB) records a
    source.config that save_pretrained's layout makes longer than any config.json reader
    here reads: refused before anything is written (86), not an export that fails its own
    read-back (exit 1, naming its temporary directory)."""
    _source, target, art, *_ = exported["vanilla_conf_markov"]
    edited = tmp_path / "edited"
    shutil.copytree(art, edited)
    manifest = json.loads((edited / "manifest.json").read_text())
    manifest["source"]["config"][field] = [1] * 1_500_000
    (edited / "manifest.json").write_text(json.dumps(manifest, separators=(",", ":")))
    assert run_cli("validate", str(edited)).returncode == 0
    out = tmp_path / "out"
    proc = run_cli("export", str(edited), "--engine", engine, "--target", str(target),
                   "-o", str(out))
    assert_refused(proc, errors.ExportConfigSizeError,
                   (f"{edited / 'manifest.json'}: field 'source.config'", "4194304"))
    _assert_nothing(out)


@pytest.mark.parametrize("args, needles", [
    (("--engine", "deepspec"), ("needs --target",)),
    (("--engine", "deepspec", "--target", "T", "--target-gguf", "x.gguf"),
     ("--target-gguf: given with --engine deepspec", "llama.cpp")),
    (("--engine", "deepspec", "--target", "T", "--keep-embedding"), ("--keep-embedding",)),
    (("--engine", "llama.cpp"), ("needs --target-gguf",)),
    (("--engine", "llama.cpp", "--target-gguf", "x.gguf", "--target", "T"),
     ("--target: given with --engine llama.cpp", "deepspec")),
])
def test_options_of_the_other_engine_are_refused(exported, tmp_path, args, needles):
    art = exported["dflash_shared"][2]
    out = tmp_path / "out"
    proc = run_cli("export", str(art), *args, "-o", str(out))
    assert_refused(proc, errors.ExportOptionError, needles)
    _assert_nothing(out)


# --- output rules -------------------------------------------------------------------------------

def test_output_rules(exported, tmp_path):
    _source, target, art, out, _result = exported["dflash_shared"]
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "keep").write_text("mine")
    args = ("export", str(art), "--engine", "deepspec", "--target", str(target))
    assert_refused(run_cli(*args, "-o", str(existing)), errors.OutputExistsError)
    assert (existing / "keep").read_text() == "mine"
    assert_refused(run_cli(*args, "-o", ""), errors.OutputPathError)
    # An output inside what the run reads (the one output rule's OutputExistsError, 30).
    inside = art / "export"
    assert_refused(run_cli(*args, "-o", str(inside)), errors.OutputExistsError,
                   ("lies inside the artifact",))
    _assert_nothing(inside)
    assert_refused(run_cli(*args, "-o", str(Path(target) / "x")), errors.OutputExistsError,
                   ("lies inside the target model",))
    proc = run_cli(*args, "-o", str(existing), "--force", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(existing)) == ["config.json", "model.safetensors"]
    assert (existing / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()
    assert not temp_siblings(existing)


# --- the real CLI ---------------------------------------------------------------------------------

def test_the_cli_in_a_real_process(exported, tmp_path):
    source, target, art, _out, _result = exported["vanilla_conf_markov"]
    out = tmp_path / "draft"
    proc = run_process("export", str(art), "--engine", "deepspec", "--target", str(target),
                       "-o", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] and report["engine"] == "deepspec"
    assert report["weights_identical"] and report["config_identical"]
    assert report["from_target"] == ["embed_tokens.weight", "lm_head.weight"]
    assert report["source_name"] == "draft"
    files = {f["path"]: f for f in report["files"]}
    assert files["model.safetensors"]["sha256"] == hashlib.sha256(
        (source / "model.safetensors").read_bytes()).hexdigest()
    checks = {c["name"]: c["status"] for c in report["checks"]}
    assert checks["target.identity.embedding"] == checks["target.identity.head"] == "passed"
    assert checks["export.round_trip"] == "passed"
    proc = run_process("export", str(art), "--engine", "deepspec", "--target", str(target),
                       "-o", str(tmp_path / "text"))
    assert proc.returncode == 0, proc.stderr
    assert "export.weights" in proc.stdout and "byte for byte" in proc.stdout


# --- bounded memory -------------------------------------------------------------------------------

@pytest.mark.slow
def test_export_streams_in_bounded_memory(big_source, tmp_path):
    """A 130 MB drafter (the target's 33 MB embedding and head with it) exported under a
    300 MiB address-space cap, which leaves no room for a copy of the file in memory:
    measured, the export runs in 250 MiB and fails in 200 MiB."""
    config = json.loads((big_source / "config.json").read_text())
    target = make_target(tmp_path / "target", hidden=config["hidden_size"],
                         vocab=config["vocab_size"], tokenizer=_word_level(200))
    art = tmp_path / "big"
    convert(big_source, art, target=target)
    out = tmp_path / "out"
    proc = run_bounded("export", str(art), "--engine", "deepspec", "--target", str(target),
                       "-o", str(out), "--quiet", memory_mb=300, seconds=120)
    assert proc.returncode == 0, proc.stderr
    assert (out / "model.safetensors").read_bytes() == (big_source / "model.safetensors").read_bytes()
