"""Hugging Face Hub sources: ``org/name@<40-hex commit>``, downloaded and proven.

The bytes converted must be provably the bytes pinned. huggingface_hub only checks sizes
(docs/REFERENCE.md §4), so ``fetch_snapshot``:

1. parses the spec (spec.py); a branch or tag is refused unless ``resolve`` is set, and
   then it is resolved to a commit once (api.py), which is returned (and recorded), never
   silently followed;
2. lists the commit's files with their size, git blob SHA-1 and LFS SHA-256 (api.py; offline:
   the cache's files and content addresses, cache.py), keeps only what conversion needs
   (never pickle files), and checks the pins and the lock file against that list before
   downloading anything (verify.py);
3. downloads with ``hf_hub_download`` into the normal HF cache (download.py: ``HF_HOME``,
   ``HF_HUB_CACHE``, ``HF_HUB_OFFLINE`` and an existing cache work as users expect),
   pinned to the commit;
4. computes the SHA-256 of every file itself, always, also for cached files, and compares
   it with the Hub's metadata (offline: the cache's content address, the blob's name),
   the lock file and the ``--sha256`` pins (verify.py). A file whose bytes do not match its
   content address is removed from the cache so that the next run downloads it again.

``Snapshot`` carries what was verified and can defer the hashing of large files to a
caller that reads them anyway (the converter's single pass): ``Snapshot.check`` verifies
one reported hash, ``Snapshot.complete`` hashes whatever was not reported,
``Snapshot.record`` gives the manifest's record and ``lock_from_snapshot`` the lock file.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from dspark_convert.errors import (
    HubFileNotFoundError,
    HubOfflineError,
    HubSpecError,
    LockMismatchError,
    SourceError,
)
from dspark_convert.formats.safetensors import INDEX_NAME, read_index
from dspark_convert.source.hub.api import list_files, resolve_revision
from dspark_convert.source.hub.cache import (
    cached_files,
    cached_ref,
    hub_cache_dir,
    offline_mode,
    repo_storage,
)
from dspark_convert.source.hub.client import (
    RetryPolicy,
    hub_endpoint,
    quiet_huggingface_hub,
)
from dspark_convert.source.hub.download import download, progress_bar_class
from dspark_convert.source.hub.lockfile import (
    LOCK_FORMAT,
    LockedFile,
    LockFile,
    lock_json,
    read_lock_file,
)
from dspark_convert.source.hub.spec import (
    CHECKPOINT_PATTERNS,
    WEIGHTS_FILES,
    HubSpec,
    parse_spec,
    wanted,
)
from dspark_convert.source.hub.verify import (
    SnapshotFile,
    VerifiedFile,
    add_user_expectations,
    cached_file,
    check_size,
    hash_and_verify,
    hub_file,
    verify,
)
from dspark_convert.util.patterns import is_commit
from dspark_convert.util.progress import NoProgress, Progress


@dataclass(frozen=True)
class Snapshot:
    directory: Path               # <cache>/models--org--name/snapshots/<commit>
    repo: str
    revision: str                 # as requested (the commit itself, or a branch/tag)
    commit: str
    resolved: bool                # a branch/tag was resolved (--resolve)
    offline: bool
    endpoint: str | None          # None when offline
    lock_sha256: str | None
    files: tuple[SnapshotFile, ...]
    verified: Mapping[str, VerifiedFile] = field(default_factory=dict)

    def file(self, path: str) -> SnapshotFile:
        for f in self.files:
            if f.path == path:
                return f
        raise KeyError(path)

    def where(self, path: str) -> str:
        """How messages name one of its files."""
        return f"{self.repo}@{self.commit[:12]}: {path}"

    def check(self, path: str, size: int, sha256: str) -> VerifiedFile:
        """Verify one file from a hash computed elsewhere (the converter's pass). Raises
        the mismatch's error; a file whose bytes are not its cache address is evicted."""
        spec = self.file(path)
        if spec.needs_git_sha1:
            raise ValueError(f"{path}: needs a git blob SHA-1; hash it with complete()")
        return verify(self.where(path), spec, size, sha256, None)

    def complete(self, reported: Mapping[str, VerifiedFile] | None = None,
                 progress: Progress | None = None) -> "Snapshot":
        """A snapshot with every file verified: ``reported`` (from ``check``) taken as is,
        the rest hashed here."""
        progress = progress or NoProgress()
        done = dict(self.verified)
        done.update(reported or {})
        todo = [f for f in self.files if f.path not in done]
        if todo:
            progress.start("verify hub files", sum(f.size for f in todo))
            try:
                for spec in todo:
                    done[spec.path] = hash_and_verify(self.where(spec.path), spec,
                                                       progress.advance)
            finally:
                progress.finish()
        return replace(self, verified=done)

    def verified_files(self) -> list[VerifiedFile]:
        """Every file's verification, sorted by path; all must be verified."""
        missing = [f.path for f in self.files if f.path not in self.verified]
        if missing:
            raise ValueError(f"not verified yet: {', '.join(missing)}")
        return sorted(self.verified.values(), key=lambda v: v.path)

    def record(self):
        """The manifest's ``source.hub`` record; every file must be verified."""
        from dspark_convert.artifact.manifest import HubFileRecord, HubRecord

        return HubRecord(
            repo=self.repo, requested_revision=self.revision, commit=self.commit,
            resolved=self.resolved, offline=self.offline, endpoint=self.endpoint,
            lock_sha256=self.lock_sha256,
            files=[HubFileRecord(path=v.path, size=v.size, sha256=v.sha256,
                                 verified_against=list(v.verified_against))
                   for v in self.verified_files()])


def lock_from_snapshot(snap: Snapshot) -> LockFile:
    """The lock file of a fully verified snapshot."""
    return LockFile(format=LOCK_FORMAT, format_version=1, repo=snap.repo,
                    revision=snap.revision, commit=snap.commit,
                    files=[LockedFile(path=v.path, size=v.size, sha256=v.sha256)
                           for v in snap.verified_files()])


def fetch_snapshot(spec: str | HubSpec, *, resolve: bool | None = False,
                   pins: Mapping[str, str] | None = None,
                   lock: LockFile | str | os.PathLike | None = None,
                   allow_patterns: Iterable[str] = CHECKPOINT_PATTERNS,
                   required: Collection[str] = ("config.json",),
                   require_weights: bool = True,
                   defer: Iterable[str] = (), endpoint: str | None = None,
                   cache_dir: str | os.PathLike | None = None, offline: bool | None = None,
                   policy: RetryPolicy = RetryPolicy(),
                   progress: Progress | None = None) -> Snapshot:
    """Download (or find in the cache) a pinned Hub snapshot and verify it.

    ``resolve``: True resolves a branch or tag to its commit; False refuses one, naming
    --resolve; None refuses one for a caller that has no --resolve (a target).
    ``lock`` is a ``lockfile.LockFile`` (or a path to one). Files matching the ``defer``
    patterns whose expectations are all SHA-256 are not hashed here: the caller reads them
    anyway and reports each hash through ``Snapshot.check``, then calls
    ``Snapshot.complete``. Every refusal raises a HubError subclass (exit codes 50-59)."""
    with quiet_huggingface_hub():
        return _fetch_snapshot(spec, resolve, pins, lock, allow_patterns, required,
                               require_weights, defer, endpoint, cache_dir, offline, policy,
                               progress)


def _load_lock(lock) -> tuple[LockFile | None, str, str | None]:
    """(the lock, how messages name it, the SHA-256 of its bytes) of a LockFile or a path."""
    if lock is None:
        return None, "the lock file", None
    if isinstance(lock, LockFile):
        return lock, "the lock file", hashlib.sha256(lock_json(lock).encode()).hexdigest()
    path = Path(lock)
    parsed, digest = read_lock_file(path)  # refuses a missing, unreadable or malformed file
    return parsed, path.name, digest


def _pin_hint(repo: str, revision: str) -> str:
    """For a caller that takes a commit only (``resolve=None``: a target, in every
    command): how to find the commit, since no --resolve is offered there."""
    return (f"(this option takes org/name@<40-hex commit> and never resolves a branch or tag; "
            f"`dspark lock {repo}@{revision} --resolve -o FILE` prints the commit)")


def _fetch_snapshot(spec, resolve, pins, lock, allow_patterns, required, require_weights, defer,
                    endpoint, cache_dir, offline, policy, progress) -> Snapshot:
    progress = progress or NoProgress()
    spec = spec if isinstance(spec, HubSpec) else parse_spec(spec)
    pins = dict(pins or {})
    lock, lock_label, lock_sha = _load_lock(lock)
    patterns = tuple(allow_patterns)
    offline = offline_mode() if offline is None else offline
    endpoint = hub_endpoint(endpoint)
    cache = hub_cache_dir(cache_dir)

    if lock is not None and lock.repo != spec.repo:
        raise LockMismatchError(f"{lock_label}: repo {lock.repo}; the source is {spec.repo}",
                                field="repo", expected=lock.repo, found=spec.repo)
    revision = spec.revision
    if revision is None and lock is not None and resolve is False:
        revision = lock.commit  # `convert org/name --lock f`: the lock pins the commit
    if revision is None:
        if not resolve:
            hint = ("(or --resolve to resolve the default branch now)" if resolve is False
                    else _pin_hint(spec.repo, "main"))
            raise HubSpecError(f"{spec.repo}: no revision; expected {spec.repo}@<40-hex commit> "
                               f"{hint}", field="source", expected="org/name@<40-hex commit>",
                               found=str(spec))
        revision = "main"
    storage = repo_storage(cache, spec.repo)
    resolved = False
    if not is_commit(revision):
        if not resolve:
            hint = ("pin the commit, or pass --resolve to resolve it now (the commit is "
                    "printed and recorded)" if resolve is False
                    else "pin the commit " + _pin_hint(spec.repo, revision))
            raise HubSpecError(f"{spec.repo}@{revision}: '{revision}' is a branch or tag, not a "
                               f"40-hex commit; {hint}", field="revision",
                               expected="a 40-hex commit", found=revision)
        commit = (cached_ref(storage, spec.repo, revision) if offline
                  else resolve_revision(spec.repo, revision, endpoint=endpoint, policy=policy))
        resolved = True
    else:
        commit = revision
    if lock is not None and lock.commit != commit:
        moved = f" ({revision} moved)" if resolved else ""
        raise LockMismatchError(f"{lock_label}: commit {commit}{moved}; expected the locked "
                                f"commit {lock.commit}", field="commit", expected=lock.commit,
                                found=commit)
    snap_dir = storage / "snapshots" / commit
    what = f"{spec.repo}@{commit}"

    if offline:
        locked = [f.path for f in lock.files] if lock is not None else ()
        files = [cached_file(f) for f in cached_files(snap_dir, patterns, what, locked)]
    else:
        files = [hub_file(snap_dir, f)
                 for f in list_files(spec.repo, commit, endpoint=endpoint, policy=policy)
                 if wanted(f.path, patterns)]
    _check_required(files, required, require_weights, what, snap_dir, offline)
    files = add_user_expectations(files, pins, lock, lock_label, what)

    if not offline:
        todo = [f for f in files if not os.path.exists(f.local)]
        bar = progress_bar_class(progress)
        progress.start(f"download {spec.repo}", sum(f.size for f in todo))
        try:
            for f in todo:
                download(snap_dir, spec.repo, commit, f.path, endpoint=endpoint,
                         cache_dir=cache, timeout=policy.timeout, bar=bar)
        finally:
            progress.finish()
        _check_shards(files, snap_dir, what)

    snap = Snapshot(directory=snap_dir, repo=spec.repo, revision=revision, commit=commit,
                    resolved=resolved, offline=offline, endpoint=None if offline else endpoint,
                    lock_sha256=lock_sha, files=tuple(files))
    defer = tuple(defer)
    deferred = {f.path for f in files if wanted(f.path, defer) and not f.needs_git_sha1}
    # Sizes are checked now for every file, so a truncated file is refused before any
    # deferred hashing starts.
    for f in files:
        if f.path in deferred:
            check_size(snap.where(f.path), f, f.local.stat().st_size)
    to_hash = replace(snap, files=tuple(f for f in files if f.path not in deferred))
    hashed = to_hash.complete(progress=progress)
    return replace(snap, verified=dict(hashed.verified))


def _check_required(files: list[SnapshotFile], required: Collection[str], require_weights: bool,
                    what: str, snap_dir: Path, offline: bool) -> None:
    have = {f.path for f in files}
    error = HubOfflineError if offline else HubFileNotFoundError
    where = "in the local cache" if offline else "in the repository"
    for name in required:
        if name not in have:
            raise error(f"{what}: {name} not found {where}", path=name, expected=name,
                        found="missing")
    if require_weights and not have.intersection(WEIGHTS_FILES):
        raise error(f"{what}: no weights {where}; expected model.safetensors or "
                    "model.safetensors.index.json", path=str(snap_dir),
                    expected=" or ".join(WEIGHTS_FILES), found="missing")


def _check_shards(files: list[SnapshotFile], snap_dir: Path, what: str) -> None:
    """Every shard the index names must be in the commit (else a missing file, named).
    The index is read by the checkpoint reader's own bounded parser (size, value count,
    decoded text capped), so a hostile index cannot make us build a huge object."""
    if not any(f.path == INDEX_NAME for f in files):
        return
    try:
        weight_map = read_index(snap_dir / INDEX_NAME)
    except SourceError:
        return  # the converter refuses a malformed index with its own error, naming it
    have = {f.path for f in files}
    for shard in sorted(set(weight_map.values())):
        if shard not in have:
            raise HubFileNotFoundError(f"{what}: {shard} (named by {INDEX_NAME}) not found in "
                                       "the repository", path=shard, expected=shard,
                                       found="missing")
