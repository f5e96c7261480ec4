"""`dspark convert org/name@<commit>` and `dspark lock` as users run them: a subprocess
with HF_ENDPOINT pointing at the loopback Hub (tests/support/hub_server.py) and HF_HOME in a
temporary directory.

Every case is a `dspark` process against the loopback Hub (~20 s on 2 cores in all), so all
but the online-then-offline round trip are marked slow: `make test` runs them, `make
test-fast` keeps the round trip."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time

import pytest

from conftest import REFERENCE_DRAFTER, dspark_cmd
from support.hub_server import HubServer

REPO = "org/draft"
WEIGHTS_SHA = hashlib.sha256((REFERENCE_DRAFTER / "model.safetensors").read_bytes()).hexdigest()


@pytest.fixture
def hub():
    with HubServer() as server:
        server.commit = server.add_directory(REPO, REFERENCE_DRAFTER, refs=("main", "v1"))
        yield server


@pytest.fixture
def env(tmp_path, hub):
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_HOME=str(tmp_path / "hf_home"), HF_ENDPOINT=hub.url)
    return env


def dspark(env, *args, **kw):
    return subprocess.run(dspark_cmd(*args), env=env, capture_output=True, text=True,
                          timeout=120, **kw)


def left_behind(parent, name):
    """The output and any hidden temporary sibling of it."""
    return sorted(p.name for p in parent.iterdir() if p.name == name or p.name.startswith(f".{name}"))


def storage(env):
    return __import__("pathlib").Path(env["HF_HOME"]) / "hub" / "models--org--draft"


def test_convert_from_the_hub_then_offline_from_the_cache(hub, env, tmp_path):
    spec = f"{REPO}@{hub.commit}"
    first = dspark(env, "convert", spec, "-o", str(tmp_path / "online"))
    assert first.returncode == 0, first.stderr
    manifest = json.loads((tmp_path / "online" / "manifest.json").read_text())
    source = manifest["source"]
    assert (source["repo"], source["revision"], source["name"]) == (REPO, hub.commit, REPO)
    record = source["hub"]
    assert record["commit"] == hub.commit and record["offline"] is False
    assert {f["path"]: (f["size"], f["sha256"], f["verified_against"]) for f in record["files"]} == {
        "config.json": ((REFERENCE_DRAFTER / "config.json").stat().st_size,
                        hashlib.sha256((REFERENCE_DRAFTER / "config.json").read_bytes()).hexdigest(),
                        ["hub-git-blob-sha1"]),
        "model.safetensors": ((REFERENCE_DRAFTER / "model.safetensors").stat().st_size,
                              WEIGHTS_SHA, ["hub-lfs-sha256"])}
    assert dspark(env, "validate", str(tmp_path / "online")).returncode == 0

    # Second run: offline, from the cache, every file re-hashed; not one request.
    requests = len(hub.requests())
    offline = dspark({**env, "HF_HUB_OFFLINE": "1"}, "convert", spec, "-o", str(tmp_path / "offline"))
    assert offline.returncode == 0, offline.stderr
    assert len(hub.requests()) == requests
    record = json.loads((tmp_path / "offline" / "manifest.json").read_text())["source"]["hub"]
    assert record["offline"] is True
    assert [f["verified_against"] for f in record["files"]] == [["cache-blob-sha1"],
                                                                 ["cache-blob-sha256"]]
    assert ((tmp_path / "offline" / "drafter.gguf").read_bytes()
            == (tmp_path / "online" / "drafter.gguf").read_bytes())


@pytest.mark.slow
def test_resolve_prints_and_records_the_commit(hub, env, tmp_path):
    result = dspark(env, "convert", f"{REPO}@v1", "--resolve", "-o", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert f"resolved {REPO}@v1 -> {hub.commit}" in result.stdout
    record = json.loads((tmp_path / "out" / "manifest.json").read_text())["source"]["hub"]
    assert (record["requested_revision"], record["resolved"]) == ("v1", True)


@pytest.mark.slow
def test_lock_then_convert_with_the_lock(hub, env, tmp_path):
    lock = tmp_path / "dspark.lock"
    made = dspark(env, "lock", f"{REPO}@{hub.commit}", "-o", str(lock))
    assert made.returncode == 0, made.stderr
    data = json.loads(lock.read_text())
    assert data["commit"] == hub.commit
    assert {f["path"]: f["sha256"] for f in data["files"]}["model.safetensors"] == WEIGHTS_SHA
    again = dspark(env, "lock", f"{REPO}@{hub.commit}", "-o", str(lock))
    assert again.returncode == 30
    result = dspark(env, "convert", f"{REPO}@{hub.commit}", "--lock", str(lock),
                    "-o", str(tmp_path / "out"), "--json")
    assert result.returncode == 0, result.stderr
    checks = [f["verified_against"] for f in json.loads(result.stdout)["hub"]["files"]]
    assert all("lock" in c for c in checks)


def corrupt(hub, env, tmp_path):
    hub.faults.corrupt.add("model.safetensors")
    return [f"{REPO}@{hub.commit}"]


def wrong_pin(hub, env, tmp_path):
    return [f"{REPO}@{hub.commit}", "--sha256", f"model.safetensors={'0' * 64}"]


def moved_tag(hub, env, tmp_path):
    lock = tmp_path / "dspark.lock"
    assert dspark(env, "lock", f"{REPO}@v1", "--resolve", "-o", str(lock)).returncode == 0
    hub.set_ref(REPO, "v1", hub.add_directory(REPO, REFERENCE_DRAFTER, refs=()))
    return [f"{REPO}@v1", "--resolve", "--lock", str(lock)]


def missing_file(hub, env, tmp_path):
    commit = hub.add_directory(REPO, REFERENCE_DRAFTER, drop=("model.safetensors",), refs=())
    return [f"{REPO}@{commit}"]


def unpinned(hub, env, tmp_path):
    return [f"{REPO}@main"]


def no_repo(hub, env, tmp_path):
    return [f"org/absent@{hub.commit}"]


def offline_uncached(hub, env, tmp_path):
    env["HF_HUB_OFFLINE"] = "1"
    return [f"{REPO}@{hub.commit}"]


def truncated(hub, env, tmp_path):
    hub.faults.truncate["model.safetensors"] = 4096
    return [f"{REPO}@{hub.commit}"]


def other_commit(hub, env, tmp_path):
    hub.faults.serve_commit = hub.add_directory(REPO, REFERENCE_DRAFTER, refs=())
    return [f"{REPO}@{hub.commit}"]


@pytest.mark.slow
@pytest.mark.parametrize("setup, code, words", [
    (corrupt, 56, "model.safetensors: SHA-256"),
    (wrong_pin, 57, "--sha256"),
    (moved_tag, 58, "v1 moved"),
    (missing_file, 52, "model.safetensors"),
    (unpinned, 59, "--resolve"),
    (no_repo, 50, "org/absent"),
    (offline_uncached, 53, "offline"),
    (truncated, 55, "4096 of 339874 bytes"),
    (other_commit, 56, "served commit"),
], ids=lambda v: getattr(v, "__name__", None))
def test_refusals_have_their_own_code_and_leave_nothing(hub, env, tmp_path, setup, code, words):
    args = setup(hub, env, tmp_path)
    result = dspark(env, "convert", *args, "-o", str(tmp_path / "out"))
    assert result.returncode == code, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], result.stderr
    assert left_behind(tmp_path, "out") == []


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupted_download_leaves_no_artifact_and_no_bad_cache_entry(hub, env, tmp_path, sig, code):
    hub.faults.throttle = 0.02  # about 1.7 s for the weights
    proc = subprocess.Popen(dspark_cmd("convert", f"{REPO}@{hub.commit}", "-o", str(tmp_path / "out")),
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not hub.requests("cdn") and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    time.sleep(0.3)  # mid-transfer
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == code, stderr
    assert left_behind(tmp_path, "out") == []
    blobs = storage(env) / "blobs"
    assert WEIGHTS_SHA not in {p.name for p in blobs.iterdir()}
    assert not [p for p in blobs.iterdir() if p.name.endswith(".incomplete")]
    # A later run downloads again and verifies.
    hub.faults.throttle = 0
    again = dspark(env, "convert", f"{REPO}@{hub.commit}", "-o", str(tmp_path / "out"))
    assert again.returncode == 0, again.stderr
    files = json.loads((tmp_path / "out" / "manifest.json").read_text())["source"]["hub"]["files"]
    assert {f["path"]: f["sha256"] for f in files}["model.safetensors"] == WEIGHTS_SHA


@pytest.mark.slow
@pytest.mark.parametrize("where", ["blobs", "snapshot", "cache-root", "inside-cache"])
def test_an_output_in_the_cache_is_refused_and_the_cache_kept(hub, env, tmp_path, where):
    """`-o <HF cache>/blobs --force` used to delete the cached weights being converted.
    An output that is, holds or lies inside the cache a run reads is refused (30)."""
    spec = f"{REPO}@{hub.commit}"
    assert dspark(env, "convert", spec, "-o", str(tmp_path / "first")).returncode == 0
    repo = storage(env)
    before = {p: p.read_bytes() for p in repo.rglob("*") if p.is_file()}
    out = {"blobs": repo / "blobs", "snapshot": repo / "snapshots" / hub.commit,
           "cache-root": repo.parent, "inside-cache": repo / "blobs" / "art"}[where]
    proc = dspark(env, "convert", spec, "-o", str(out), "--force", "-q")
    assert proc.returncode == 30, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and ("the Hugging Face cache" in lines[0] or "source snapshot" in lines[0])
    assert {p: p.read_bytes() for p in repo.rglob("*") if p.is_file()} == before
    again = dspark({**env, "HF_HUB_OFFLINE": "1"}, "convert", spec, "-o", str(tmp_path / "again"))
    assert again.returncode == 0, again.stderr


@pytest.mark.slow
def test_a_lock_file_in_the_cache_is_refused(hub, env, tmp_path):
    spec = f"{REPO}@{hub.commit}"
    assert dspark(env, "convert", spec, "-o", str(tmp_path / "first")).returncode == 0
    blob = next(p for p in (storage(env) / "blobs").iterdir() if len(p.name) == 64)
    data = blob.read_bytes()
    proc = dspark(env, "lock", spec, "-o", str(blob), "--force")
    assert proc.returncode == 30, proc.stderr
    assert "the Hugging Face cache" in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert blob.read_bytes() == data
