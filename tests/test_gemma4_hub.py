"""The Gemma4 family through the Hub path, on a loopback Hub (tests/support/hub_server.py):
`dspark lock` pins DeepSeek's Gemma4 drafter's files, a pinned pull with the lock converts
to the same tensors as the local directory, with the repo and commit as provenance, and
validates; a lock that disagrees is refused before anything is written. Through the CLI, as
users run it: `dspark lock` in a real process, then a Gemma4 drafter and its Gemma4 target
both pulled by the real huggingface_hub client, converted, and validated against the target
again offline from the cache, not one request more."""

from __future__ import annotations

import json

import pytest

from support.cli import run_cli, run_process
from support.gemma4 import GEMMA4_DRAFTERS, GEMMA4_TARGET
from support.hub_server import HubServer
from dspark_convert import errors
from dspark_convert.commands.convert import convert
from dspark_convert.commands.lock import lock_snapshot
from dspark_convert.commands.validate import validate_artifact
from dspark_convert.source.hub.client import RetryPolicy
from dspark_convert.source.hub.lockfile import read_lock, write_lock
from dspark_convert.source.hub.source import HubOptions

REPO = "deepseek-ai/dspark_gemma4_tiny"
FAST = RetryPolicy(retries=1, wait=0.01, max_wait=0.01, timeout=5)
DRAFT = GEMMA4_DRAFTERS["gemma4_vanilla_conf_markov"]


@pytest.fixture
def hub(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    for var in ("HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    with HubServer() as server:
        server.commit = server.add_directory(REPO, DRAFT)
        yield server


def test_lock_pull_convert_validate(hub, tmp_path):
    spec = f"{REPO}@{hub.commit}"
    locked = lock_snapshot(spec, tmp_path / "dspark.lock", endpoint=hub.url, policy=FAST)
    lock = read_lock(locked.path)
    assert lock.commit == hub.commit and {f.path for f in lock.files} >= {"config.json",
                                                                         "model.safetensors"}
    options = HubOptions(endpoint=hub.url, policy=FAST, lock=locked.path)
    pulled = convert(spec, tmp_path / "hub", hub=options)
    local = convert(DRAFT, tmp_path / "local")
    assert pulled.manifest.contract.family == "gemma4-dspark"
    assert pulled.manifest.artifact.tensors == local.manifest.artifact.tensors
    assert (pulled.manifest.source.repo, pulled.manifest.source.revision) == (REPO, hub.commit)
    assert all("lock" in f.verified_against for f in pulled.manifest.source.hub.files)
    assert validate_artifact(tmp_path / "hub").exit_code(strict=True) == 0


def test_a_lock_that_disagrees_writes_nothing(hub, tmp_path):
    spec = f"{REPO}@{hub.commit}"
    lock = read_lock(lock_snapshot(spec, tmp_path / "dspark.lock", endpoint=hub.url,
                                   policy=FAST).path)
    bad = lock.model_copy(update={"files": [f.model_copy(update={"sha256": "1" * 64})
                                            if f.path == "model.safetensors" else f
                                            for f in lock.files]})
    path = write_lock(bad, tmp_path / "bad.lock")
    with pytest.raises(errors.LockMismatchError, match="model.safetensors"):
        convert(spec, tmp_path / "out", hub=HubOptions(endpoint=hub.url, policy=FAST, lock=path))
    assert not (tmp_path / "out").exists()


# --- through the CLI: a Gemma4 drafter and a Gemma4 target from the Hub -------------------------

DFLASH_REPO, TARGET_REPO = "deepseek-ai/dflash_gemma4_tiny", "google/gemma-4-tiny"


@pytest.fixture
def hubs(tmp_path, monkeypatch):
    """The plain DFlash Gemma4 drafter and the gemma4_unified target, each in its repo; the
    environment a user's shell would have (HF_ENDPOINT, HF_HOME), for this process and its
    children."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    for var in ("HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    with HubServer() as server:
        server.commits = {DFLASH_REPO: server.add_directory(DFLASH_REPO, GEMMA4_DRAFTERS["gemma4_dflash"]),
                          TARGET_REPO: server.add_directory(TARGET_REPO, GEMMA4_TARGET)}
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


def test_lock_pull_drafter_and_target_convert_validate_offline(hubs, tmp_path):
    draft = f"{DFLASH_REPO}@{hubs.commits[DFLASH_REPO]}"
    target = f"{TARGET_REPO}@{hubs.commits[TARGET_REPO]}"
    lock = tmp_path / "dspark.lock"
    locked = run_process("lock", draft, "-o", str(lock), "--json", "-q")
    assert locked.returncode == 0, locked.stderr
    assert read_lock(lock).commit == hubs.commits[DFLASH_REPO]

    out = tmp_path / "hub"
    converted = run_cli("convert", draft, "--lock", str(lock), "--target", target, "-o", str(out), "-q")
    assert converted.returncode == 0, converted.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["source"]["repo"], manifest["source"]["revision"]) == (
        DFLASH_REPO, hubs.commits[DFLASH_REPO])
    assert (manifest["target"]["repo"], manifest["target"]["revision"]) == (
        TARGET_REPO, hubs.commits[TARGET_REPO])
    assert manifest["contract"]["family"] == "gemma4-dspark"
    # The same artifact as from the two local directories (bar the provenance it records).
    local = convert(GEMMA4_DRAFTERS["gemma4_dflash"], tmp_path / "local", target=GEMMA4_TARGET)
    assert manifest["artifact"]["tensors"] == [t.model_dump() for t in local.manifest.artifact.tensors]
    assert manifest["target"]["tensors"] == [t.model_dump() for t in local.manifest.target.tensors]

    # validate --target from the Hub spec, offline: both snapshots come from the cache.
    requests = len(hubs.requests())
    checked = run_cli("validate", str(out), "--target", target, "--strict", "--json",
                      env={"HF_HUB_OFFLINE": "1"})
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert json.loads(checked.stdout)["ok"] is True
    assert len(hubs.requests()) == requests
