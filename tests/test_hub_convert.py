"""convert() with a Hub source, in-process: the snapshot's weights are verified by the
converter's own read pass (hub.HubSource.check), the provenance names the repo and commit,
and a refusal leaves no output."""

from __future__ import annotations

import hashlib

import pytest

from conftest import GOLDEN, REFERENCE_DRAFTER
from support.hub_server import HubServer
from dspark_convert import errors
from dspark_convert.commands.convert import convert
from dspark_convert.formats.gguf_reader import read_gguf
from dspark_convert.source.hub.client import RetryPolicy
from dspark_convert.source.hub.source import HubOptions
from dspark_convert.commands.validate import validate_artifact

REPO = "org/draft"
FAST = RetryPolicy(retries=1, wait=0.01, max_wait=0.01, timeout=5)


@pytest.fixture
def hub(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    for var in ("HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    with HubServer() as server:
        server.commit = server.add_directory(REPO, REFERENCE_DRAFTER)
        server.options = HubOptions(endpoint=server.url, policy=FAST)
        yield server


def test_hub_source_provenance_matches_a_local_conversion(hub, tmp_path):
    result = convert(f"{REPO}@{hub.commit}", tmp_path / "hub", hub=hub.options)
    local = convert(REFERENCE_DRAFTER, tmp_path / "local")
    kv = read_gguf(tmp_path / "hub" / "drafter.gguf").kv
    assert kv["general.name"].value == REPO
    assert kv["general.source.huggingface.repository"].value == REPO
    assert kv["dflash.source.revision"].value == hub.commit
    m = result.manifest
    assert (m.source.repo, m.source.revision, m.source.name) == (REPO, hub.commit, REPO)
    assert m.source.hub.commit == hub.commit
    # Same tensors as the local conversion: only the provenance differs.
    assert m.artifact.tensors == local.manifest.artifact.tensors
    assert m.source.files == local.manifest.source.files
    assert validate_artifact(tmp_path / "hub").ok


def test_corrupted_cache_is_caught_by_the_conversion_pass(hub, tmp_path):
    spec = f"{REPO}@{hub.commit}"
    convert(spec, tmp_path / "first", hub=hub.options)
    cdn = len(hub.requests("cdn"))
    snapshot = (tmp_path / "hf_home" / "hub" / "models--org--draft" / "snapshots" / hub.commit)
    blob = (snapshot / "model.safetensors").resolve()
    data = bytearray(blob.read_bytes())
    data[-3] ^= 0x01  # same size: huggingface_hub would serve it from the cache unchecked
    blob.chmod(0o644)
    blob.write_bytes(bytes(data))
    with pytest.raises(errors.HubIntegrityError, match="model.safetensors: SHA-256"):
        convert(spec, tmp_path / "second", hub=hub.options)
    assert len(hub.requests("cdn")) == cdn          # it came from the cache...
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first", "hf_home"]  # ...left nothing
    assert not blob.exists()                         # and the bad blob was evicted
    again = convert(spec, tmp_path / "second", hub=hub.options)
    assert again.manifest.source.hub.files == convert(
        spec, tmp_path / "third", hub=hub.options).manifest.source.hub.files
    weights = {f.path: f.sha256 for f in again.manifest.source.hub.files}["model.safetensors"]
    assert weights == hashlib.sha256((REFERENCE_DRAFTER / "model.safetensors").read_bytes()).hexdigest()


def test_a_hostile_shard_index_is_refused_by_the_bounded_index_reader(hub, tmp_path):
    # Nested arrays that json.loads would recurse into until RecursionError: the Hub's
    # shard check reads the index with the checkpoint reader's bounded parser, which counts
    # the values first, and the conversion refuses it with the index's own error.
    hostile = b'{"weight_map": ' + b"[" * 300_000 + b"}"
    commit = hub.add_directory("org/hostile", GOLDEN / "synthetic" / "vanilla_sharded",
                               extra={"model.safetensors.index.json": hostile})
    with pytest.raises(errors.SafetensorsFormatError, match="more than 262144 values"):
        convert(f"org/hostile@{commit}", tmp_path / "out", hub=hub.options)
    assert not (tmp_path / "out").exists()


def test_existing_output_is_refused_before_downloading(hub, tmp_path):
    (tmp_path / "out").mkdir()
    with pytest.raises(errors.OutputExistsError):
        convert(f"{REPO}@{hub.commit}", tmp_path / "out", hub=hub.options)
    assert hub.requests() == []


def test_a_file_changed_in_the_cache_during_conversion_is_refused(hub):
    from dspark_convert.source.hub.source import open_hub_source

    source = open_hub_source(f"{REPO}@{hub.commit}", hub.options)
    config = source.snapshot.verified["config.json"]  # hashed (git blob SHA-1) before the pass
    source.check("config.json", config.size, config.sha256)
    with pytest.raises(errors.HubIntegrityError, match="changed in the cache"):
        source.check("config.json", config.size, "f" * 64)
    with pytest.raises(errors.HubIntegrityError):  # the deferred weights: against the Hub
        source.check("model.safetensors", (REFERENCE_DRAFTER / "model.safetensors").stat().st_size,
                     "f" * 64)
