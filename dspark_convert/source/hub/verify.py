"""What each file of a snapshot must be, and the check of its size and hashes against that.

Every file carries its expectations, strongest source first: the Hub's metadata (online:
the LFS SHA-256, or the git blob SHA-1 of a file not in LFS) or the cache's content
address (offline: the blob's name), then the lock file, then the ``--sha256`` pins. A file
that fails the first kind is damaged and evicted from the cache (the next run downloads it
again); failing a lock or a pin is the user's refusal, and the cache is left alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from dspark_convert.errors import (
    HubIntegrityError,
    HubOfflineError,
    HubTruncatedDownloadError,
    LockMismatchError,
    PinMismatchError,
)
from dspark_convert.source.hub.cache import CachedFile, evict
from dspark_convert.util.hashing import hash_file
from dspark_convert.util.patterns import is_commit, is_sha256

if TYPE_CHECKING:
    from huggingface_hub.hf_api import RepoFile

    from dspark_convert.source.hub.lockfile import LockFile

# What a file's hash was verified against: the Hub's metadata (LFS SHA-256, git blob SHA-1),
# the cache's content address (offline), the lock file, a --sha256 pin. The manifest
# records these as ``source.hub.files[].verified_against`` (docs/ARTIFACT_FORMAT.md).
# The kinds of check, as manifest.json records them (one definition, in the manifest).
from dspark_convert.artifact.manifest import Verification  # noqa: E402

Algorithm = Literal["sha256", "git-sha1"]


@dataclass(frozen=True)
class Expectation:
    verification: Verification
    algorithm: Algorithm
    digest: str
    size: int | None  # the size the same source declares, when it does
    origin: str       # for messages: "the Hub's LFS metadata", "dspark.lock", ...

    @property
    def is_users(self) -> bool:
        """A lock or a pin: a difference is the user's refusal, not damage."""
        return self.verification in ("lock", "pin")


@dataclass(frozen=True)
class SnapshotFile:
    path: str                     # inside the repo, '/'-separated
    local: Path                   # the snapshot link (or file) in the HF cache
    size: int                     # the size we expect (Hub listing, lock or cache)
    expectations: tuple[Expectation, ...]

    @property
    def needs_git_sha1(self) -> bool:
        return any(e.algorithm == "git-sha1" for e in self.expectations)


@dataclass(frozen=True)
class VerifiedFile:
    path: str
    size: int
    sha256: str
    verified_against: tuple[Verification, ...]


def hub_file(snap_dir: Path, entry: RepoFile) -> SnapshotFile:
    """A file of the Hub's listing (api.list_files) and what the Hub says it is."""
    if entry.lfs is not None:
        exp = Expectation("hub-lfs-sha256", "sha256", entry.lfs.sha256, entry.lfs.size,
                          "the Hub's LFS metadata")
    else:
        exp = Expectation("hub-git-blob-sha1", "git-sha1", entry.blob_id, entry.size,
                          "the Hub's git blob id")
    return SnapshotFile(path=entry.path, local=snap_dir / entry.path, size=exp.size,
                        expectations=(exp,))


def cached_file(entry: CachedFile) -> SnapshotFile:
    """A file found in the cache offline, expected to hash to its blob's name."""
    expectations: tuple[Expectation, ...] = ()
    if is_sha256(entry.address):
        expectations = (Expectation("cache-blob-sha256", "sha256", entry.address, None,
                                    "the cache's content address"),)
    elif is_commit(entry.address):  # 40 lowercase hex: a git blob id
        expectations = (Expectation("cache-blob-sha1", "git-sha1", entry.address, None,
                                    "the cache's content address"),)
    return SnapshotFile(path=entry.path, local=entry.local, size=entry.size,
                        expectations=expectations)


def add_user_expectations(files: list[SnapshotFile], pins: Mapping[str, str],
                          lock: LockFile | None, lock_label: str,
                          what: str) -> list[SnapshotFile]:
    """The lock and the --sha256 pins against the file list, before any download."""
    by_path = {f.path: f for f in files}
    for path in pins:
        if path not in by_path:
            raise PinMismatchError(f"--sha256 {path}: not among the files of {what} "
                                   f"({', '.join(sorted(by_path)) or 'none'})", path=path,
                                   expected=path, found="not downloaded")
    locked = {f.path: f for f in lock.files} if lock is not None else {}
    if lock is not None:
        for path in sorted(locked):
            if path not in by_path:
                raise LockMismatchError(f"{lock_label}: {path}: locked but not in {what}",
                                        path=path, expected="present", found="missing")
        for path in sorted(by_path):
            if path not in locked:
                raise LockMismatchError(f"{lock_label}: {path}: in {what} but not in the lock "
                                        "(extra file)", path=path, expected="absent",
                                        found="present")
    out = []
    for f in files:
        extra = []
        if lock is not None:
            entry = locked[f.path]
            if entry.size != f.size:
                raise LockMismatchError(f"{lock_label}: {f.path}: size {f.size} in {what}; "
                                        f"expected the locked size {entry.size}", path=f.path,
                                        expected=entry.size, found=f.size)
            extra.append(Expectation("lock", "sha256", entry.sha256, entry.size, lock_label))
        if f.path in pins:
            extra.append(Expectation("pin", "sha256", pins[f.path], None, "--sha256"))
        out.append(replace(f, expectations=f.expectations + tuple(extra)))
    return out


def hash_and_verify(where: str, spec: SnapshotFile, advance=None) -> VerifiedFile:
    """Hash one cached file (with its git blob SHA-1 when an expectation needs it) and
    verify it."""
    try:
        digest = hash_file(spec.local, git_blob=spec.needs_git_sha1, advance=advance)
    except OSError as exc:
        raise HubOfflineError(f"{spec.local}: cannot read the cached file: "
                              f"{exc.strerror or exc}", path=str(spec.local)) from None
    if digest.changed:
        raise HubIntegrityError(f"{spec.local}: changed while it was hashed ({digest.stat_size} "
                                f"-> {digest.size} bytes)", path=str(spec.local),
                                expected=digest.stat_size, found=digest.size)
    return verify(where, spec, digest.size, digest.sha256, digest.git_blob_sha1)


def verify(where: str, spec: SnapshotFile, size: int, sha256: str,
           sha1: str | None) -> VerifiedFile:
    """Compare one file's size and hashes with every expectation, in order. ``where``
    names it in messages (``org/name@<commit>: path``)."""
    check_size(where, spec, size)
    against: list[Verification] = []
    for exp in spec.expectations:
        found = sha256 if exp.algorithm == "sha256" else sha1
        if found != exp.digest:
            name = "SHA-256" if exp.algorithm == "sha256" else "git blob SHA-1"
            if exp.is_users:
                _refuse(exp, where, f"{name} {exp.digest}", f"{name} {found}", spec)
            evict(spec.local)
            raise HubIntegrityError(
                f"{where}: {name} {found}; expected {exp.digest} ({exp.origin}); the damaged "
                "cache entry was removed, run again to download it",
                path=spec.path, expected=exp.digest, found=found)
        against.append(exp.verification)
    return VerifiedFile(path=spec.path, size=size, sha256=sha256,
                        verified_against=tuple(against))


def check_size(where: str, spec: SnapshotFile, size: int) -> None:
    """The size against every expectation that declares one: a truncated file is refused
    before anything hashes it."""
    for exp in spec.expectations:
        if exp.size is None or size == exp.size:
            continue
        if exp.is_users:
            _refuse(exp, where, f"size {exp.size}", f"size {size}", spec)
        evict(spec.local)
        error = HubTruncatedDownloadError if size < exp.size else HubIntegrityError
        raise error(f"{where}: {size} bytes; expected {exp.size} ({exp.origin}); the "
                    "damaged cache entry was removed, run again to download it",
                    path=spec.path, expected=exp.size, found=size)


def _refuse(exp: Expectation, where: str, expected: str, found: str, spec: SnapshotFile):
    error = LockMismatchError if exp.verification == "lock" else PinMismatchError
    raise error(f"{where}: {found}; expected {expected} ({exp.origin})", path=spec.path,
                expected=expected, found=found)
