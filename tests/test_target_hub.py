"""Hub targets: `--target org/name@<commit>` fetched by hub.fetch_snapshot from a loopback Hub
(tests/support/hub_server.py, the real huggingface_hub client) serving the golden target, with
HF_HOME in a temporary directory."""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import REFERENCE_DRAFTER, dspark_cmd
from dspark_convert.commands.convert import convert
from dspark_convert.errors import HubFileNotFoundError, HubSpecError
from dspark_convert.target.model import open_target
from dspark_convert.commands.validate import validate_artifact
from support.hub_server import HubServer
from support.paths import GOLDEN_TARGET

REPO = "org/tiny-qwen3"


@pytest.fixture
def hub(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    for var in ("HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    with HubServer() as server:
        server.commit = server.add_directory(REPO, GOLDEN_TARGET,
                                             extra={"pytorch_model.bin": b"pickle!"})
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


def test_hub_target_is_fetched_pinned_and_recorded(hub, tmp_path):
    spec = f"{REPO}@{hub.commit}"
    target = open_target(spec)
    assert (target.repo, target.revision) == (REPO, hub.commit)
    # Only what the pairing reads was downloaded: never the pickle, nor generation_config.
    assert sorted(p.name for p in target.directory.iterdir()) == [
        "config.json", "model.safetensors", "tokenizer.json"]
    local = open_target(GOLDEN_TARGET)
    assert target.tokenizer.record == local.tokenizer.record

    out = tmp_path / "artifact"
    manifest = convert(REFERENCE_DRAFTER, out, target=spec).manifest
    assert (manifest.target.repo, manifest.target.revision, manifest.target.path) == (
        REPO, hub.commit, None)
    assert validate_artifact(out, target=spec).ok


def test_hub_target_through_the_cli(hub, tmp_path):
    out = tmp_path / "artifact"
    result = subprocess.run(dspark_cmd("convert", str(REFERENCE_DRAFTER), "-o", str(out),
                                       "--target", f"{REPO}@{hub.commit}", "-q"),
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    assert json.loads((out / "manifest.json").read_text())["target"]["revision"] == hub.commit


def test_hub_target_must_be_pinned(hub, tmp_path):
    with pytest.raises(HubSpecError, match="branch or tag"):
        open_target(f"{REPO}@main")
    result = subprocess.run(dspark_cmd("convert", str(REFERENCE_DRAFTER), "-o",
                                       str(tmp_path / "out"), "--target", f"{REPO}@main"),
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == HubSpecError.exit_code
    assert not (tmp_path / "out").exists()


def test_missing_tokenizer_on_the_hub(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    with HubServer() as server:
        commit = server.add_directory(REPO, GOLDEN_TARGET, drop=("tokenizer.json",))
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        # The Hub refuses a snapshot without a required file, naming it.
        with pytest.raises(HubFileNotFoundError, match="tokenizer.json"):
            open_target(f"{REPO}@{commit}")
