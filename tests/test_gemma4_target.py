"""Gemma4 targets: a gemma4_unified / gemma4 target directory or pinned
Hub repo is read through the families table (target/gemma4.py): its nested text_config, the
tied embedding as both embedding and head, its tokenizer fingerprint. `convert --target` and
`validate --target` pair a Gemma4 drafter with it (model types, geometry, taps, the copied
RoPE / RMS eps / softcap, embedding and head identity, tokenizer); each mismatch is refused
with its own code, nothing written. A drafter and a target of different families are refused
both ways (68)."""

from __future__ import annotations

import json
import shutil
import struct

import pytest

from conftest import REFERENCE_DRAFTER
from support.cli import assert_refused, run_cli, run_process
from support.edited import edited_copy
from support.gemma4 import GEMMA4_DRAFTERS, GEMMA4_TARGET, GEMMA4_TRAINER_CONFIGS
from support.hub_server import HubServer
from support.paths import GOLDEN_TARGET
from support.targets import byte_bpe
from dspark_convert.commands.convert import convert
from dspark_convert.commands.validate import validate_artifact
from dspark_convert.errors import (
    EmbeddingIdentityError,
    ManifestMismatchError,
    MaskTokenCollisionError,
    TargetFamilyError,
    TargetFormatError,
    TargetGeometryError,
    TargetLayerMismatchError,
    TargetVocabError,
)
from dspark_convert.target.model import hash_target_tensors, open_target

EMBED = "model.language_model.embed_tokens.weight"
DSPARK = GEMMA4_DRAFTERS["gemma4_vanilla_conf_markov"]


def _target(tmp_path, edit=None, name="target"):
    """A copy of the Gemma4 fixture target, its config.json changed by ``edit(cfg)``."""
    return edited_copy(GEMMA4_TARGET, tmp_path / name, edit)


def _drafter(tmp_path, edit):
    return edited_copy(DSPARK, tmp_path / "draft", edit)


def _flip_embedding_row(target, row: int) -> None:
    """Change one byte of the target's embedding row ``row`` in place."""
    path = target / "model.safetensors"
    data = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", data[:8])
    entry = json.loads(data[8:8 + n])[EMBED]
    cols = entry["shape"][1]
    data[8 + n + entry["data_offsets"][0] + row * cols * 2] ^= 0x01
    path.write_bytes(bytes(data))


def _text(**fields):
    return lambda cfg: cfg["text_config"].update(fields)


# --- reading the target ----------------------------------------------------------------------

def test_the_fixture_target_is_read_from_its_text_config():
    target = open_target(GEMMA4_TARGET)
    c = target.config
    assert (target.family.name, c.model_type, c.architectures) == (
        "gemma4-dspark", "gemma4_unified", ["Gemma4UnifiedForConditionalGeneration"])
    # From text_config, not the top level (which has none of these).
    assert (c.hidden_size, c.vocab_size, c.num_hidden_layers) == (64, 512, 6)
    assert (c.rope_theta, c.rms_norm_eps, c.tie_word_embeddings) == (1e6, 1e-6, True)
    assert target.read.values["partial_rotary_factor"] == 0.25
    assert target.read.values["final_logit_softcapping"] == 30.0
    assert target.read.context_length == 512 and target.qwen3 is None
    # The tied embedding is the head: one tensor, one read.
    assert target.embed.name == EMBED and target.head is target.embed
    embedding, head = hash_target_tensors(target)
    assert (embedding.role, head.role) == ("embedding", "head")
    assert embedding.sha256 == head.sha256 and head.name == EMBED
    assert target.tokenizer.record.vocab_size == 400


@pytest.mark.parametrize("model_type,text_type,field", [
    ("gemma4_text", None, "model_type"),                 # a text-only model: no text_config
    ("gemma4_unified_text", None, "model_type"),
    ("gemma4", "gemma4_unified_text", "text_config.model_type"),
    ("gemma4_unified", "gemma4_text", "text_config.model_type"),
])
def test_model_types_that_do_not_nest_as_gemma4_targets_do(tmp_path, model_type, text_type, field):
    def edit(cfg):
        cfg["model_type"] = model_type
        if text_type is not None:
            cfg["text_config"]["model_type"] = text_type
    with pytest.raises(TargetFormatError) as exc:
        open_target(_target(tmp_path, edit))
    assert exc.value.field == field and exc.value.exit_code == 61
    assert model_type in exc.value.message


@pytest.mark.parametrize("edit,field", [
    (lambda cfg: cfg.pop("text_config"), "text_config"),
    (lambda cfg: cfg["text_config"].pop("hidden_size"), "text_config.hidden_size"),
    (lambda cfg: cfg["text_config"].pop("global_head_dim"), "text_config.global_head_dim"),
    (_text(attention_k_eq_v="true"), "text_config.attention_k_eq_v"),
    (_text(vocab_size="512"), "text_config.vocab_size"),
    (_text(num_hidden_layers=0), "text_config.num_hidden_layers"),
    (_text(max_position_embeddings=None), "text_config.max_position_embeddings"),
    (_text(rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
     "text_config.rope_parameters.full_attention"),
    (lambda cfg: cfg.update(tie_word_embeddings=False), "tie_word_embeddings"),
    # A config whose layer count the weights do not hold (the taps trust it).
    (_text(num_hidden_layers=7), "text_config.num_hidden_layers"),
])
def test_a_malformed_gemma4_target_config_names_its_field(tmp_path, edit, field):
    with pytest.raises(TargetFormatError) as exc:
        open_target(_target(tmp_path, edit))
    assert exc.value.field == field, exc.value.message
    assert field in exc.value.message and "\n" not in exc.value.message


def test_an_untied_target_needs_its_head(tmp_path):
    def untie(cfg):
        cfg["tie_word_embeddings"] = False
        cfg["text_config"]["tie_word_embeddings"] = False
    with pytest.raises(TargetFormatError) as exc:
        open_target(_target(tmp_path, untie))
    assert "lm_head.weight" in exc.value.message


# --- pairing: convert and validate ------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(GEMMA4_DRAFTERS))
@pytest.mark.parametrize("form", ["released", "trainer"])
def test_both_drafters_convert_and_validate_against_the_target(tmp_path, name, form):
    draft = GEMMA4_DRAFTERS[name]
    if form == "trainer":
        draft = tmp_path / "draft"
        shutil.copytree(GEMMA4_DRAFTERS[name], draft)
        shutil.copyfile(GEMMA4_TRAINER_CONFIGS[name], draft / "config.json")
    out = tmp_path / "art"
    manifest = convert(draft, out, target=GEMMA4_TARGET).manifest
    rec = manifest.target
    assert rec.config.model_type == "gemma4_unified" and rec.config.hidden_size == 64
    assert {t.role: t.name for t in rec.tensors} == {"embedding": EMBED, "head": EMBED}
    names = [c.name for c in rec.checks]
    assert names == ["target.family", "target.hidden_size", "target.vocab_size", "target.layers",
                     "target.norms", "target.tokenizer_vocab", "target.mask_token",
                     "target.tokenizer_fingerprint", "target.identity.embedding",
                     "target.identity.head"]
    assert all(c.status == "passed" for c in rec.checks)
    # The drafter's two copies were checked against the target's one tied matrix.
    sha = rec.tensors[0].sha256
    stripped = {s.name: s.sha256 for s in manifest.source.stripped}
    assert stripped == {"embed_tokens.weight": sha, "lm_head.weight": sha}
    report = validate_artifact(out, target=GEMMA4_TARGET)
    assert report.ok, report.first_failure
    assert [c.name for c in report.checks if c.name.startswith("target.")][-2:] == [
        "target.identity.embedding", "target.identity.head"]


def test_canary_in_real_processes(tmp_path):
    out = tmp_path / "art"
    proc = run_process("convert", str(DSPARK), "--target", str(GEMMA4_TARGET), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    proc = run_process("validate", str(out), "--target", str(GEMMA4_TARGET), "--strict")
    assert proc.returncode == 0, proc.stderr
    assert "target.identity.head" in proc.stdout


@pytest.mark.parametrize("edit,error,field", [
    # The full-RoPE slip (a logits-only difference in the runtime) is a refusal here.
    (_text(rope_parameters={"full_attention": {"rope_type": "proportional", "rope_theta": 1e6,
                                               "partial_rotary_factor": 1.0}}),
     TargetGeometryError, "text_config.rope_parameters.full_attention.partial_rotary_factor"),
    (_text(rope_parameters={"full_attention": {"rope_type": "proportional", "rope_theta": 1e4,
                                               "partial_rotary_factor": 0.25}}),
     TargetGeometryError, "text_config.rope_parameters.full_attention.rope_theta"),
    (_text(rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6}}),
     TargetGeometryError, "text_config.rope_parameters.full_attention.rope_type"),
    (_text(final_logit_softcapping=None), TargetGeometryError, "text_config.final_logit_softcapping"),
    # The drafter's attention is the target's full-attention geometry, not head_dim's.
    (_text(global_head_dim=16), TargetGeometryError, "text_config.global_head_dim"),
    (_text(num_global_key_value_heads=2), TargetGeometryError,
     "text_config.num_global_key_value_heads"),
    (_text(attention_k_eq_v=False), TargetGeometryError, "text_config.attention_k_eq_v"),
    (_text(num_attention_heads=8), TargetGeometryError, "text_config.num_attention_heads"),
    (_text(rms_norm_eps=1e-5), TargetGeometryError, "text_config.rms_norm_eps"),
    # A plain gemma4 target where the drafter was built on a gemma4_unified one.
    (lambda cfg: (cfg.update(model_type="gemma4"), cfg["text_config"].update(model_type="gemma4_text")),
     TargetGeometryError, "model_type"),
])
def test_a_target_that_is_not_the_drafters_is_refused_before_writing(tmp_path, edit, error, field):
    target = _target(tmp_path, edit)
    out = tmp_path / "out"
    with pytest.raises(error) as exc:
        convert(DSPARK, out, target=target)
    assert exc.value.field == field, exc.value.message
    assert not out.exists()


def _v_proj_drafter(tmp_path):
    """The DSpark drafter as it would be for a target whose full layers keep v_proj
    (attention_k_eq_v false): KV heads from num_key_value_heads (2), a v_proj per layer."""
    import torch
    from safetensors.torch import load_file, save_file

    draft = _drafter(tmp_path, lambda cfg: cfg.update(attention_k_eq_v=False,
                                                      num_key_value_heads=2))
    tensors = load_file(draft / "model.safetensors")
    gen = torch.Generator().manual_seed(0)
    for i in range(2):
        k = tensors[f"layers.{i}.self_attn.k_proj.weight"]
        tensors[f"layers.{i}.self_attn.k_proj.weight"] = torch.cat([k, k])
        tensors[f"layers.{i}.self_attn.v_proj.weight"] = (
            torch.randn(k.shape[0] * 2, k.shape[1], generator=gen) * 0.02).to(k.dtype)
    save_file(tensors, draft / "model.safetensors")
    return draft


def test_a_target_whose_full_layers_keep_v_proj(tmp_path):
    draft = _v_proj_drafter(tmp_path)
    target = _target(tmp_path, _text(attention_k_eq_v=False))
    manifest = convert(draft, tmp_path / "art", target=target).manifest
    assert manifest.contract.geometry.key_value_heads_from == "num_key_value_heads"
    assert "2 KV heads (v_proj)" in next(c.detail for c in manifest.target.checks
                                         if c.name == "target.norms")
    assert validate_artifact(tmp_path / "art", target=target).ok
    # The KV heads compared are num_key_value_heads now, not the global ones.
    other = _target(tmp_path, _text(attention_k_eq_v=False, num_key_value_heads=1), "other")
    with pytest.raises(TargetGeometryError) as exc:
        convert(draft, tmp_path / "out", target=other)
    assert exc.value.field == "text_config.num_key_value_heads"
    # And a k_eq_v target is not this drafter's.
    with pytest.raises(TargetGeometryError) as exc:
        convert(draft, tmp_path / "out", target=GEMMA4_TARGET)
    assert exc.value.field == "text_config.attention_k_eq_v"
    assert not (tmp_path / "out").exists()


def test_a_drafter_for_a_deeper_target_names_the_layer_count(tmp_path):
    draft = _drafter(tmp_path, lambda cfg: cfg.update(num_target_layers=8))
    with pytest.raises(TargetLayerMismatchError) as exc:
        convert(draft, tmp_path / "out", target=GEMMA4_TARGET)
    assert "text_config.num_hidden_layers is 6" in exc.value.message
    assert "num_target_layers" in exc.value.message


def test_a_changed_embedding_row_is_refused_by_convert_and_validate(tmp_path):
    target = _target(tmp_path)
    _flip_embedding_row(target, 300)
    out = tmp_path / "out"
    proc = run_cli("convert", str(DSPARK), "--target", str(target), "-o", str(out))
    assert_refused(proc, EmbeddingIdentityError, ["embed_tokens.weight", "first differing row 300"])
    assert not out.exists()

    art = tmp_path / "art"
    assert run_cli("convert", str(DSPARK), "--target", str(GEMMA4_TARGET), "-o",
                   str(art)).returncode == 0
    assert run_cli("validate", str(art), "--target", str(GEMMA4_TARGET), "--strict").returncode == 0
    proc = run_cli("validate", str(art), "--target", str(target))
    assert proc.returncode == EmbeddingIdentityError.exit_code, proc.stderr
    assert "embed_tokens" in proc.stdout + proc.stderr


@pytest.mark.parametrize("tokenizer,error,needle", [
    # 256 bytes + 300 words: ids up to 555 for 512 embedding rows.
    (byte_bpe(size_extra=300), TargetVocabError, "text_config.vocab_size"),
    # Id 4 (the drafters' mask token) is an ordinary byte token of this one.
    (byte_bpe(), MaskTokenCollisionError, "mask_token_id is 4"),
])
def test_a_tokenizer_that_cannot_be_the_targets_is_refused(tmp_path, tokenizer, error, needle):
    target = _target(tmp_path)
    (target / "tokenizer.json").write_text(tokenizer)
    with pytest.raises(error) as exc:
        convert(DSPARK, tmp_path / "out", target=target)
    assert needle in exc.value.message
    assert not (tmp_path / "out").exists()


def test_a_tampered_target_record_is_refused_by_validate(tmp_path):
    art = tmp_path / "art"
    convert(DSPARK, art, target=GEMMA4_TARGET)
    manifest = json.loads((art / "manifest.json").read_text())
    manifest["target"]["config"]["rope_theta"] = 10000.0   # the sliding RoPE's theta
    (art / "manifest.json").write_text(json.dumps(manifest, indent=2))
    failure = validate_artifact(art).first_failure
    assert (failure.error, failure.exit_code) == ("ManifestMismatchError",
                                                  ManifestMismatchError.exit_code)
    assert "target.config.rope_theta" in failure.detail and "1000000.0" in failure.detail


def test_hub_target_is_fetched_pinned_and_paired(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    for var in ("HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    with HubServer() as server:
        commit = server.add_directory("org/tiny-gemma4", GEMMA4_TARGET)
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        spec = f"org/tiny-gemma4@{commit}"
        out = tmp_path / "art"
        manifest = convert(DSPARK, out, target=spec).manifest
        assert (manifest.target.repo, manifest.target.revision) == ("org/tiny-gemma4", commit)
        assert manifest.target.tensors[0].name == EMBED
        assert validate_artifact(out, target=spec).ok


# --- families, both ways ------------------------------------------------------------------------

def test_convert_a_qwen3_drafter_against_a_gemma4_target(tmp_path):
    out = tmp_path / "out"
    proc = run_cli("convert", str(REFERENCE_DRAFTER), "--target", str(GEMMA4_TARGET), "-o", str(out))
    assert_refused(proc, TargetFamilyError, ["target", "config.json", "gemma4_unified", "gemma4-dspark"])
    assert "hidden_size" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_smoke_against_a_gemma4_target(converted, tmp_path):
    proc = run_cli("smoke", str(converted["reference"]), "--target", str(GEMMA4_TARGET),
                   "--prompt-ids", "2,17,33")
    assert_refused(proc, TargetFamilyError, ["gemma4_unified", "gemma4-dspark", "qwen3-dspark"])


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
