"""dspark_convert.source.hub.lockfile: strict reading and atomic writing of dspark.lock."""

from __future__ import annotations

import json

import pytest

from dspark_convert import errors
from dspark_convert.source.hub.lockfile import LockedFile, LockFile, lock_json, read_lock, write_lock

COMMIT = "c" * 40


def make_lock(**update) -> LockFile:
    base = dict(format="dspark-lock", format_version=1, repo="org/name", revision="main",
                commit=COMMIT, files=[LockedFile(path="config.json", size=10, sha256="a" * 64),
                                      LockedFile(path="model.safetensors", size=20, sha256="b" * 64)])
    return LockFile(**{**base, **update})


def test_round_trip_is_byte_stable(tmp_path):
    lock = make_lock()
    path = write_lock(lock, tmp_path / "dspark.lock")
    assert read_lock(path) == lock
    assert path.read_text() == lock_json(lock)
    assert [p.name for p in tmp_path.iterdir()] == ["dspark.lock"]  # no temporary left


def test_write_refuses_an_existing_file_unless_forced(tmp_path):
    path = tmp_path / "dspark.lock"
    path.write_text("keep")
    with pytest.raises(errors.OutputExistsError):
        write_lock(make_lock(), path)
    assert path.read_text() == "keep"
    write_lock(make_lock(), path, force=True)
    assert read_lock(path) == make_lock()


def test_write_into_a_missing_directory_leaves_nothing(tmp_path):
    with pytest.raises(errors.OutputWriteError):
        write_lock(make_lock(), tmp_path / "missing" / "dspark.lock")
    assert list(tmp_path.iterdir()) == []


def good_dict() -> dict:
    return json.loads(lock_json(make_lock()))


@pytest.mark.parametrize("mutate, where", [
    (lambda d: d.update(commit="abc"), "commit"),
    (lambda d: d.update(commit=COMMIT.upper()), "commit"),
    (lambda d: d.update(format_version=2), "format_version"),
    (lambda d: d.update(extra=1), "extra"),
    (lambda d: d.update(repo="no-slash"), "repo"),
    (lambda d: d["files"][0].update(size="10"), "files.0.size"),
    (lambda d: d["files"][0].update(sha256="A" * 64), "files.0.sha256"),
    (lambda d: d["files"].reverse(), "files"),
    (lambda d: d.update(files=[]), "files"),
])
def test_malformed_locks_are_refused_naming_the_field(tmp_path, mutate, where):
    data = good_dict()
    mutate(data)
    path = tmp_path / "dspark.lock"
    path.write_text(json.dumps(data))
    with pytest.raises(errors.HubSpecError) as info:
        read_lock(path)
    assert info.value.exit_code == 59 and info.value.field == where
    assert str(path) in info.value.message and "\n" not in info.value.message


def test_duplicate_keys_and_missing_file(tmp_path):
    path = tmp_path / "dspark.lock"
    text = lock_json(make_lock())
    path.write_text(text.replace('"repo": "org/name",', '"repo": "org/name", "repo": "x/y",'))
    with pytest.raises(errors.HubSpecError, match="duplicate"):
        read_lock(path)
    with pytest.raises(errors.HubSpecError, match="not found"):
        read_lock(tmp_path / "absent.lock")
