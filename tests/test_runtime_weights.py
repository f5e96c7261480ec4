"""runtime/weights.py: the drafter's tensors come back from drafter.gguf exactly."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from conftest import golden_source
from dspark_convert.errors import GGUFFormatError
from dspark_convert.runtime.weights import load_drafter_weights


@pytest.mark.parametrize("name", ["reference", "gated_conf_markov", "rnn_conf_plain", "vanilla_sharded"])
def test_every_tensor_equals_the_source(converted, name):
    """GGUF [in, out] BF16 bits -> torch [out, in] float32, value for value (BF16 widens
    exactly), for every head variant; embedding and head are not in the artifact."""
    weights = load_drafter_weights(converted[name])
    source_dir = golden_source(name)
    files = sorted(source_dir.glob("*.safetensors"))
    source = {k: v for f in files for k, v in load_file(f).items()}
    expected = {k: v for k, v in source.items() if k not in ("embed_tokens.weight", "lm_head.weight")}
    assert set(weights.tensors) == set(expected)
    for key, value in expected.items():
        got = weights.tensors[key]
        assert got.dtype == torch.float32
        assert got.shape == value.shape, key
        assert torch.equal(got, value.float()), key


def test_the_gguf_records_the_embedding_hashes_the_pairing_binds_by(converted):
    """The runtime takes the embedding and head from the target; the pairing proves them
    the drafter's by the hashes the GGUF records (dflash.target.*), checked here."""
    import hashlib

    from dspark_convert.artifact.format import provenance_from_metadata, read_metadata
    from dspark_convert.formats.gguf_reader import read_gguf

    def recorded(artifact):
        gguf = read_gguf(artifact / "drafter.gguf")
        prov = provenance_from_metadata(read_metadata(gguf, path="drafter.gguf"), path="drafter.gguf")
        return prov.embed_sha256, prov.lm_head_sha256

    source = load_file(golden_source("reference") / "model.safetensors")
    for key, digest in zip(("embed_tokens.weight", "lm_head.weight"), recorded(converted["reference"])):
        raw = source[key].view(torch.uint16).numpy().tobytes()
        assert digest == hashlib.sha256(raw).hexdigest()
    assert recorded(converted["dflash_plain"]) == (None, None)   # a checkpoint without them


def test_a_truncated_gguf_is_refused(converted, tmp_path):
    artifact = tmp_path / "a"
    artifact.mkdir()
    data = (converted["reference"] / "drafter.gguf").read_bytes()
    (artifact / "drafter.gguf").write_bytes(data[: len(data) - 100])
    with pytest.raises(GGUFFormatError):
        load_drafter_weights(artifact)
