"""dspark_convert.source.hub (fetch_snapshot) against the real huggingface_hub client and a
loopback Hub (tests/support/hub_server.py) serving the golden fixtures, with HF_HOME in a temporary
directory."""

from __future__ import annotations

import hashlib
import os
import time

import pytest

from conftest import GOLDEN, REFERENCE_DRAFTER
from support.hub_server import HubServer
from dspark_convert import errors
from dspark_convert.source.hub.client import RetryPolicy
from dspark_convert.source.hub.snapshot import fetch_snapshot, lock_from_snapshot
from dspark_convert.source.hub.spec import looks_like_hub_spec, parse_pins, parse_spec

SHARDED = GOLDEN / "synthetic" / "vanilla_sharded"
FAST = RetryPolicy(retries=1, wait=0.01, max_wait=0.01, timeout=5)
REPO = "org/draft"


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    home = tmp_path / "hf_home"
    monkeypatch.setenv("HF_HOME", str(home))
    for var in ("HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    return home


@pytest.fixture
def hub(hf_home):
    with HubServer() as server:
        server.commit = server.add_directory(
            REPO, REFERENCE_DRAFTER, refs=("main", "v1"),
            extra={"tokenizer.json": b'{"model": {}}', "pytorch_model.bin": b"pickle!",
                   "README.md": b"# card"})
        yield server


def fetch(hub, spec=None, **kw):
    kw.setdefault("endpoint", hub.url)
    kw.setdefault("policy", FAST)
    return fetch_snapshot(spec or f"{REPO}@{hub.commit}", **kw)


def blob_sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- specs and pins ---------------------------------------------------------------------------

def test_parse_spec():
    spec = parse_spec("org/name@" + "A" * 40)
    assert (spec.repo, spec.revision, spec.is_commit) == ("org/name", "a" * 40, True)
    assert parse_spec("org/name@v1.0").is_commit is False
    assert parse_spec("org/name").revision is None
    for bad in ("name@" + "a" * 40, "org/name@", "/abs/path@x", "org//x"):
        with pytest.raises(errors.HubSpecError):
            parse_spec(bad)


def test_local_directory_wins_over_hub_spec(tmp_path, monkeypatch):
    (tmp_path / "org" / "name@v1").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert not looks_like_hub_spec("org/name@v1")
    assert looks_like_hub_spec("org/other@" + "a" * 40)
    assert not looks_like_hub_spec("org/other")  # Hub only with --resolve / --lock
    assert not looks_like_hub_spec("./relative/dir")


def test_parse_pins():
    digest = "ab" * 32
    assert parse_pins([f"model.safetensors={digest.upper()}"]) == {"model.safetensors": digest}
    for bad in ("model.safetensors", "=" + digest, "x=abc", f"x={digest}0"):
        with pytest.raises(errors.HubSpecError) as info:
            parse_pins([bad])
        assert info.value.exit_code == 59
    with pytest.raises(errors.HubSpecError):
        parse_pins([f"x={digest}", f"x={'cd' * 32}"])


# --- downloads and what they are verified against -----------------------------------------

def test_pinned_commit_downloads_only_what_conversion_needs(hub, hf_home):
    snap = fetch(hub)
    assert snap.commit == hub.commit and not snap.resolved and not snap.offline
    assert snap.directory == hf_home / "hub" / "models--org--draft" / "snapshots" / hub.commit
    assert sorted(snap.verified) == ["config.json", "model.safetensors", "tokenizer.json"]
    checks = {p: v.verified_against for p, v in snap.verified.items()}
    assert checks == {"config.json": ("hub-git-blob-sha1",),
                      "model.safetensors": ("hub-lfs-sha256",),
                      "tokenizer.json": ("hub-git-blob-sha1",)}
    weights = snap.verified["model.safetensors"]
    assert weights.sha256 == blob_sha(REFERENCE_DRAFTER / "model.safetensors")
    # Never requested: pickle weights and files conversion does not need.
    paths = [p for _, _, p in hub.requests()]
    assert not any(p.endswith(("pytorch_model.bin", "README.md")) for p in paths)
    # In the normal HF cache layout: snapshot links into blobs/ named by content address.
    link = snap.directory / "model.safetensors"
    assert link.is_symlink() and link.resolve().name == weights.sha256
    record = snap.record()
    assert record.commit == hub.commit and [f.path for f in record.files] == sorted(snap.verified)


def test_second_run_uses_the_cache_and_rehashes(hub):
    fetch(hub)
    before = len(hub.requests())
    snap = fetch(hub)
    # Only the file listing is asked again; no file is downloaded twice.
    assert [r for r in hub.requests()[before:] if "/tree/" not in r[2]] == []
    assert snap.verified["model.safetensors"].verified_against == ("hub-lfs-sha256",)


def test_sharded_checkpoint(hf_home):
    with HubServer() as server:
        commit = server.add_directory("org/sharded", SHARDED)
        snap = fetch_snapshot(f"org/sharded@{commit}", endpoint=server.url, policy=FAST)
    assert len([p for p in snap.verified if p.endswith(".safetensors")]) == 3


def test_branch_needs_resolve_and_is_recorded(hub):
    with pytest.raises(errors.HubSpecError) as info:
        fetch(hub, f"{REPO}@v1")
    assert info.value.exit_code == 59 and "--resolve" in info.value.message
    with pytest.raises(errors.HubSpecError):
        fetch(hub, REPO)
    snap = fetch(hub, f"{REPO}@v1", resolve=True)
    assert (snap.revision, snap.commit, snap.resolved) == ("v1", hub.commit, True)
    assert snap.record().requested_revision == "v1"


@pytest.mark.parametrize("spec, error", [
    ("org/nope@" + "a" * 40, errors.HubRepoNotFoundError),
    ("org/draft@" + "b" * 40, errors.HubRevisionNotFoundError),
    ("org/draft@nobranch", errors.HubRevisionNotFoundError),
])
def test_repo_and_revision_not_found(hub, spec, error):
    with pytest.raises(error) as info:
        fetch(hub, spec, resolve=True)
    assert "\n" not in info.value.message and spec.split("@")[0] in info.value.message


def test_missing_file_and_missing_shard(hf_home):
    with HubServer() as server:
        no_config = server.add_directory("org/a", REFERENCE_DRAFTER, drop=("config.json",))
        no_shard = server.add_directory("org/b", SHARDED, drop=("model-00002-of-00003.safetensors",))
        with pytest.raises(errors.HubFileNotFoundError, match="config.json"):
            fetch_snapshot(f"org/a@{no_config}", endpoint=server.url, policy=FAST)
        with pytest.raises(errors.HubFileNotFoundError, match="model-00002-of-00003"):
            fetch_snapshot(f"org/b@{no_shard}", endpoint=server.url, policy=FAST)


# --- offline --------------------------------------------------------------------------------

def test_offline_with_nothing_cached(hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(errors.HubOfflineError) as info:
        fetch(hub)
    assert info.value.exit_code == 53
    assert hub.requests() == []


def test_offline_rehashes_the_cache_against_its_content_addresses(hub, monkeypatch):
    fetch(hub)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    n = len(hub.requests())
    snap = fetch(hub)
    assert len(hub.requests()) == n and snap.offline and snap.endpoint is None
    assert snap.verified["model.safetensors"].verified_against == ("cache-blob-sha256",)
    assert snap.verified["config.json"].verified_against == ("cache-blob-sha1",)


def test_offline_detects_a_corrupted_cache_blob_and_evicts_it(hub, monkeypatch):
    snap = fetch(hub)
    blob = (snap.directory / "model.safetensors").resolve()
    data = bytearray(blob.read_bytes())
    data[1000] ^= 1
    blob.chmod(0o644)
    blob.write_bytes(bytes(data))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(errors.HubIntegrityError, match="content address"):
        fetch(hub)
    assert not blob.exists() and not (snap.directory / "model.safetensors").exists()
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert fetch(hub).verified["model.safetensors"].sha256 == blob.name  # downloaded again


# --- faults in flight -------------------------------------------------------------------------

def test_same_size_corruption_in_flight_is_refused_and_not_cached(hub):
    hub.faults.corrupt.add("model.safetensors")
    with pytest.raises(errors.HubIntegrityError) as info:
        fetch(hub)
    err = info.value
    assert err.exit_code == 56 and "model.safetensors" in err.message
    assert err.expected == blob_sha(REFERENCE_DRAFTER / "model.safetensors") != err.found
    hub.faults.corrupt.clear()
    assert fetch(hub).verified["model.safetensors"].sha256 == err.expected


def test_small_file_corruption_is_caught_by_the_git_blob_sha1(hub):
    hub.faults.corrupt.add("config.json")
    with pytest.raises(errors.HubIntegrityError, match="git blob SHA-1"):
        fetch(hub)


def test_truncated_download(hub):
    hub.faults.truncate["model.safetensors"] = 1000
    with pytest.raises(errors.HubTruncatedDownloadError) as info:
        fetch(hub)
    assert info.value.exit_code == 55 and "model.safetensors" in info.value.message
    blobs = hub_blobs(fetch_dir(hub))
    assert blob_sha(REFERENCE_DRAFTER / "model.safetensors") not in blobs


def test_dropped_connection_is_resumed_and_verified(hub):
    hub.faults.drop["model.safetensors"] = 50_000
    snap = fetch(hub)
    assert snap.verified["model.safetensors"].sha256 == blob_sha(REFERENCE_DRAFTER / "model.safetensors")
    assert any(r[0] == "cdn" for r in hub.requests())


def test_another_commit_served_is_refused(hub):
    other = hub.add_commit(REPO, {"config.json": b"{}"}, refs=())
    hub.faults.serve_commit = other
    with pytest.raises(errors.HubIntegrityError) as info:
        fetch(hub)
    assert info.value.expected == hub.commit and info.value.found == other
    snapshots = fetch_dir(hub) / "snapshots"
    assert not (snapshots / other / "config.json").exists()
    assert not (fetch_dir(hub) / "refs" / hub.commit).exists()


def test_network_failure_after_retries_is_fast(hub):
    url = hub.url
    hub.close()
    start = time.monotonic()
    with pytest.raises(errors.HubNetworkError) as info:
        fetch_snapshot(f"{REPO}@{hub.commit}", endpoint=url, policy=FAST)
    assert info.value.exit_code == 54 and time.monotonic() - start < 10


def test_server_errors_after_retries(hub, capfd):
    hub.faults.status["api"] = (503, None)
    with pytest.raises(errors.HubNetworkError, match="HTTP 503"):
        fetch(hub)
    # huggingface_hub logs each retry on stderr; the library prints nothing.
    assert capfd.readouterr().err == ""
    hub.faults.status["api"] = (503, 1)  # one failure: the retry succeeds
    assert fetch(hub).commit == hub.commit


def test_resolving_follows_the_retry_policy(hub):
    # model_info (huggingface_hub's own call) makes one request; our policy retries it.
    hub.faults.status["api"] = (503, None)
    start = time.monotonic()
    with pytest.raises(errors.HubNetworkError, match="HTTP 503"):
        fetch(hub, f"{REPO}@v1", resolve=True)
    assert time.monotonic() - start < 5
    assert len([r for r in hub.requests() if "/revision/v1" in r[2]]) == FAST.retries + 1
    hub.faults.status["api"] = (503, 1)  # one failure: the retry succeeds
    assert fetch(hub, f"{REPO}@v1", resolve=True).commit == hub.commit


def test_file_list_retries_each_page_under_the_policy(hub):
    hub.faults.status["api"] = (502, None)
    with pytest.raises(errors.HubNetworkError, match="HTTP 502"):
        fetch(hub)
    assert len([r for r in hub.requests() if "/tree/" in r[2]]) == FAST.retries + 1


def test_a_paged_file_list_is_followed_to_its_end(hub):
    hub.faults.page_size = 2
    snap = fetch(hub)
    assert sorted(snap.verified) == ["config.json", "model.safetensors", "tokenizer.json"]
    pages = [r for r in hub.requests() if "/tree/" in r[2]]
    files = len(hub.repos[REPO].commits[hub.commit])
    assert len(pages) == (files + 1) // 2 and files > 2


@pytest.mark.parametrize("kind, answer", [
    ("revision", ["not", "an", "object"]),
    ("revision", {"id": REPO, "sha": "main"}),
    ("tree", {"not": "a list"}),
    ("tree", [{"type": "file", "path": "config.json", "size": 2}]),              # no oid
    ("tree", [{"type": "file", "path": "config.json", "size": True, "oid": "a" * 40}]),
    ("tree", [{"type": "file", "path": "model.safetensors", "size": 8, "oid": "a" * 40,
               "lfs": {"oid": "not hex", "size": 8, "pointerSize": 134}}]),
    ("tree", [{"type": "file", "path": "model.safetensors", "size": 8, "oid": "a" * 40,
               "lfs": "not an object"}]),
    ("tree", [{"type": "file", "path": "\ud800.json", "size": 2, "oid": "a" * 40}]),
])
def test_malformed_hub_answers_are_one_line_network_errors(hub, kind, answer):
    hub.faults.answer[kind] = answer
    with pytest.raises(errors.HubNetworkError) as info:
        fetch(hub, f"{REPO}@v1", resolve=True)
    assert info.value.exit_code == 54 and "\n" not in info.value.message
    assert not (fetch_dir(hub) / "blobs").exists()  # nothing downloaded


def test_a_repo_id_huggingface_hub_refuses_is_a_spec_error(hub):
    with pytest.raises(errors.HubSpecError) as info:
        fetch(hub, "org/a--b@v1", resolve=True)
    assert info.value.exit_code == 59 and "org/a--b" in info.value.message


def test_hash_file_gives_the_hubs_git_blob_id_and_sha256(tmp_path):
    from support.hub_server import git_blob_sha1 as hub_git_blob_sha1
    from dspark_convert.util.hashing import BLOCK, hash_file

    data = bytes(range(256)) * ((2 * BLOCK + 300) // 256)  # more than two blocks
    (tmp_path / "f").write_bytes(data)
    seen = []
    digest = hash_file(tmp_path / "f", git_blob=True, advance=seen.append)
    assert digest.git_blob_sha1 == hub_git_blob_sha1(data)
    assert digest.sha256 == hashlib.sha256(data).hexdigest()
    assert (digest.size, digest.changed, sum(seen)) == (len(data), False, len(data))
    assert hash_file(tmp_path / "f").git_blob_sha1 is None


# --- pins and locks ---------------------------------------------------------------------------

def test_pins(hub):
    good = blob_sha(REFERENCE_DRAFTER / "model.safetensors")
    snap = fetch(hub, pins={"model.safetensors": good})
    assert snap.verified["model.safetensors"].verified_against == ("hub-lfs-sha256", "pin")
    with pytest.raises(errors.PinMismatchError) as info:
        fetch(hub, pins={"model.safetensors": "0" * 64})
    assert info.value.exit_code == 57 and info.value.path == "model.safetensors"
    with pytest.raises(errors.PinMismatchError, match="not among"):
        fetch(hub, pins={"pytorch_model.bin": good})


def test_lock_round_trip_and_mismatches(hub, tmp_path):
    from dspark_convert.source.hub.lockfile import read_lock, write_lock

    lock = lock_from_snapshot(fetch(hub))
    path = write_lock(lock, tmp_path / "dspark.lock")
    assert read_lock(path) == lock and lock.commit == hub.commit
    snap = fetch(hub, lock=path)
    assert all("lock" in v.verified_against for v in snap.verified.values())
    assert snap.record().lock_sha256 == blob_sha(path)

    # Another commit, and a moved tag (resolved now: another commit than locked).
    moved = hub.add_directory(REPO, REFERENCE_DRAFTER, refs=("v1",))
    with pytest.raises(errors.LockMismatchError, match="commit"):
        fetch(hub, f"{REPO}@{moved}", lock=path)
    with pytest.raises(errors.LockMismatchError, match="moved") as info:
        fetch(hub, f"{REPO}@v1", resolve=True, lock=lock)
    assert info.value.expected == hub.commit and info.value.found == moved
    # Missing, extra and changed files.
    files = list(lock.files)
    cases = [
        (lock.model_copy(update={"files": files + [files[0].model_copy(update={"path": "zz.json"})]}),
         "zz.json: locked but not"),
        (lock.model_copy(update={"files": [f for f in files if f.path != "tokenizer.json"]}),
         "tokenizer.json: in .* but not in the lock"),
        (lock.model_copy(update={"files": [f.model_copy(update={"sha256": "1" * 64})
                                           if f.path == "config.json" else f for f in files]}),
         "config.json: SHA-256"),
    ]
    for bad, message in cases:
        with pytest.raises(errors.LockMismatchError, match=message):
            fetch(hub, lock=bad)
    # Another repo.
    with pytest.raises(errors.LockMismatchError, match="repo"):
        fetch(hub, f"org/other@{hub.commit}", lock=lock)


def test_lock_pins_the_commit_when_the_spec_has_none(hub):
    lock = lock_from_snapshot(fetch(hub))
    assert fetch(hub, REPO, lock=lock).commit == hub.commit


# --- deferred hashing (the converter's single pass) ---------------------------------------

def test_deferred_files_are_checked_from_reported_hashes(hub):
    snap = fetch(hub, defer=("*.safetensors", "config.json"))
    # config.json needs a git blob SHA-1, which only we compute: not deferred.
    assert "model.safetensors" not in snap.verified and "config.json" in snap.verified
    size = (REFERENCE_DRAFTER / "model.safetensors").stat().st_size
    with pytest.raises(errors.HubIntegrityError):
        snap.check("model.safetensors", size, "0" * 64)
    assert not (snap.directory / "model.safetensors").exists()  # evicted


def test_deferred_complete(hub):
    snap = fetch(hub, defer=("*.safetensors",))
    good = blob_sha(REFERENCE_DRAFTER / "model.safetensors")
    size = (REFERENCE_DRAFTER / "model.safetensors").stat().st_size
    verified = snap.check("model.safetensors", size, good)
    done = snap.complete({"model.safetensors": verified})
    assert set(done.verified) == {"config.json", "model.safetensors", "tokenizer.json"}


# --- helpers ----------------------------------------------------------------------------------

def fetch_dir(hub):
    return __import__("pathlib").Path(os.environ["HF_HOME"]) / "hub" / "models--org--draft"


def hub_blobs(storage):
    blobs = storage / "blobs"
    return {p.name for p in blobs.iterdir()} if blobs.is_dir() else set()
