"""pairing.py: the DeepSpec-made golden drafter against its own target (every check passes)
and against targets made wrong in one way each (each refused with its own error class,
exit code and a message naming both values)."""

from __future__ import annotations

import pytest
from conftest import REFERENCE_DRAFTER
from support.targets import GOLDEN_TARGET, byte_bpe, make_target

from dspark_convert.errors import (
    EmbeddingIdentityError,
    MaskTokenCollisionError,
    TargetGeometryError,
    TargetLayerMismatchError,
    TargetVocabError,
    TokenizerMismatchError,
)
from dspark_convert.target.pairing import (
    Drafter,
    check_compatibility,
    check_identity,
    recorded_hashes,
    target_record,
)
from dspark_convert.source.checkpoint import open_source
from dspark_convert.target.model import hash_target_tensors, open_target, tensor_sha256


@pytest.fixture(scope="module")
def source():
    return open_source(REFERENCE_DRAFTER)


@pytest.fixture(scope="module")
def golden_target():
    return open_target(GOLDEN_TARGET)


def drafter_of(source, **block) -> Drafter:
    contract = source.contract
    if block:
        contract = contract.model_copy(update={"block": contract.block.model_copy(update=block)})
    return Drafter(label=f"drafter {source.directory}/config.json", contract=contract,
                   model_type=source.raw_config.get("model_type"))


def drafter_hashes(source) -> dict[str, tuple[str, str]]:
    entries = source.checkpoint.tensors
    return {n: (entries[n].dtype, tensor_sha256(entries[n]))
            for n in ("embed_tokens.weight", "lm_head.weight")}


def test_golden_pair_passes(source, golden_target):
    drafter = drafter_of(source)
    checks = check_compatibility(drafter, golden_target)
    names = [c.name for c in checks]
    assert names == ["target.family", "target.hidden_size", "target.vocab_size", "target.layers",
                     "target.norms", "target.tokenizer_vocab", "target.mask_token",
                     "target.tokenizer_fingerprint"]
    assert all(c.status == "passed" for c in checks)
    by_name = {c.name: c.detail for c in checks}
    assert "padded beyond the tokenizer, which is normal" in by_name["target.tokenizer_vocab"]
    assert "400 tokens" in by_name["target.tokenizer_vocab"]
    assert "padding row" in by_name["target.mask_token"]

    tensors = hash_target_tensors(golden_target)
    ours = drafter_hashes(source)
    identity = check_identity(drafter, golden_target, tensors, ours)
    assert [c.name for c in identity] == ["target.identity.embedding", "target.identity.head"]
    # DeepSpec copies the target's embedding and head into the drafter: same bytes.
    assert ours["embed_tokens.weight"][1] == tensors[0].sha256
    assert ours["lm_head.weight"][1] == tensors[1].sha256

    record = target_record(golden_target, tensors, checks + identity)
    assert record.path == str(GOLDEN_TARGET) and record.repo is None
    assert record.tokenizer == golden_target.tokenizer.record
    # The record re-checks a fingerprint against itself.
    assert check_compatibility(drafter, golden_target, record.tokenizer)[-1].detail.endswith(
        "matches the recorded fingerprint")


def test_drafter_without_embedding_records_the_targets(source, golden_target):
    tensors = hash_target_tensors(golden_target)
    checks = check_identity(drafter_of(source), golden_target, tensors, {})
    assert all("is recorded for the runtime" in c.detail for c in checks)
    assert recorded_hashes({}, tensors) == (tensors[0].sha256, tensors[1].sha256)
    ours = drafter_hashes(source)
    assert recorded_hashes(ours, None) == (ours["embed_tokens.weight"][1], ours["lm_head.weight"][1])


def test_copy_in_another_dtype_is_compared_after_the_cast(source, golden_target):
    tensors = hash_target_tensors(golden_target)
    entry = source.checkpoint.tensors["embed_tokens.weight"]
    as_f32 = {"embed_tokens.weight": ("F32", tensor_sha256(entry, as_dtype="F32"))}
    checks = check_identity(drafter_of(source), golden_target, tensors, as_f32)
    assert "F32" in checks[0].detail


def test_tied_target_head_is_its_embedding(tmp_path, source):
    # The golden drafter's lm_head differs from the target's embedding: refused, naming the tie.
    target = open_target(make_target(tmp_path / "t", tie=True))
    tensors = hash_target_tensors(target)
    with pytest.raises(EmbeddingIdentityError) as info:
        check_identity(drafter_of(source), target, tensors, drafter_hashes(source))
    assert "lm_head.weight" in info.value.message and "tied" in info.value.message


def refusal(tmp_path, source, **kwargs):
    target = open_target(make_target(tmp_path / "t", **kwargs))
    with pytest.raises(Exception) as info:
        check_compatibility(drafter_of(source), target)
        check_identity(drafter_of(source), target, hash_target_tensors(target),
                       drafter_hashes(source),
                       drafter_entries=dict(source.checkpoint.tensors))
    return info.value


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(hidden=128), TargetGeometryError,
     "hidden_size is 128; the drafter expects 64 (drafter"),
    (dict(vocab=600), TargetVocabError, "vocab_size is 600; the drafter expects 512"),
    (dict(layers=5), TargetLayerMismatchError,
     "target_layer_ids[2] is 4, the target's last layer"),
    (dict(layers=8), TargetLayerMismatchError, "num_hidden_layers is 8; the drafter expects 6"),
    (dict(layers=4), TargetLayerMismatchError, "target_layer_ids[2] is 4, not a layer of a 4-layer target"),
    (dict(shift_embedding=1), EmbeddingIdentityError, "first differing row 0"),
    (dict(config={"model_type": "llama"}), TargetGeometryError,
     "model_type is 'llama'; the drafter (Qwen3DSparkModel) expects 'qwen3'"),
    (dict(config={"rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}}),
     TargetGeometryError, "rope_theta is 10000.0; the drafter expects 1000000.0"),
    (dict(config={"rms_norm_eps": 1e-5}), TargetGeometryError,
     "rms_norm_eps is 1e-05; the drafter expects 1e-06"),
    (dict(tokenizer=byte_bpe(size_extra=300)), TargetVocabError,
     "has token id 555 ('w0299'); the embedding has only 512 rows"),
])
def test_mismatches(tmp_path, source, kwargs, error, words):
    exc = refusal(tmp_path, source, **kwargs)
    assert type(exc) is error, exc
    assert words in exc.message
    assert "\n" not in exc.message


def test_distinct_exit_codes():
    classes = [TargetGeometryError, TargetVocabError, TargetLayerMismatchError,
               EmbeddingIdentityError, TokenizerMismatchError, MaskTokenCollisionError]
    assert len({c.exit_code for c in classes}) == len(classes)
    assert all(60 <= c.exit_code <= 69 for c in classes)


def test_mask_token_colliding_with_an_ordinary_token(source, golden_target):
    probe_token = golden_target.tokenizer.record.probe_ids[0]
    with pytest.raises(MaskTokenCollisionError) as info:
        check_compatibility(drafter_of(source, mask_token_id=probe_token), golden_target)
    content = golden_target.tokenizer.classify(probe_token)[1]
    assert f"mask_token_id is {probe_token}, which target" in info.value.message
    assert repr(content) in info.value.message and "ordinary text" in info.value.message


def test_mask_token_on_added_and_special_tokens(tmp_path, source):
    # 256 bytes, 244 words, then id 500 is an added token: not special -> refused.
    target = open_target(make_target(tmp_path / "a", tokenizer=byte_bpe(
        size_extra=244, added=[("<think>", False)])))
    assert target.tokenizer.classify(500) == ("added", "<think>")
    with pytest.raises(MaskTokenCollisionError, match="not special"):
        check_compatibility(drafter_of(source), target)
    # The same id as a special token (like Gemma's <mask>) is fine.
    target = open_target(make_target(tmp_path / "s", tokenizer=byte_bpe(
        size_extra=244, added=[("<mask>", True)])))
    checks = check_compatibility(drafter_of(source), target)
    assert "the special token '<mask>'" in {c.name: c.detail for c in checks}["target.mask_token"]


def test_other_tokenizer_against_a_recorded_fingerprint(tmp_path, source, golden_target):
    recorded = golden_target.tokenizer.record
    other = open_target(make_target(tmp_path / "t", tokenizer=byte_bpe(size_extra=10)))
    with pytest.raises(TokenizerMismatchError) as info:
        check_compatibility(drafter_of(source), other, recorded)
    msg = info.value.message
    assert "tokenizer vocab_size is 266; the drafter was converted with a tokenizer whose " \
           "vocab_size is 400" in msg


def test_family_norm_warning(tmp_path, source):
    # The drafter and target agree on an unusual theta: a warning, not a refusal.
    contract = source.contract
    geometry = contract.geometry.model_copy(update={"rope_theta": 5e5})
    drafter = Drafter(label="drafter", contract=contract.model_copy(update={"geometry": geometry}))
    target = open_target(make_target(tmp_path / "t", config={
        "rope_parameters": {"rope_theta": 5e5, "rope_type": "default"}}))
    checks = check_compatibility(drafter, target)
    warning = [c for c in checks if c.status == "warning"]
    assert [c.name for c in warning] == ["target.family_norms"]
    assert "rope theta 500000 (Qwen3 uses 1e+06)" in warning[0].detail


def test_artifact_drafter_names_metadata_keys(tmp_path, source):
    target = open_target(make_target(tmp_path / "t", hidden=128))
    drafter = Drafter(label="artifact drafter.gguf", contract=source.contract, from_metadata=True)
    with pytest.raises(TargetGeometryError, match=r"expects 64 \(artifact drafter.gguf "
                                                  r"dflash.embedding_length\)"):
        check_compatibility(drafter, target)
