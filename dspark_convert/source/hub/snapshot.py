"""Hugging Face Hub sources: ``org/name@<40-hex commit>``, downloaded and proven.

The bytes converted must be provably the bytes pinned. huggingface_hub only checks sizes
(docs/REFERENCE.md §4), so this module:

1. parses the spec; a branch or tag is refused unless ``resolve`` is set, and then it is
   resolved to a commit once, which is returned (and recorded), never silently followed;
2. lists the commit's files (their size, git blob SHA-1, and LFS SHA-256), keeps only what
   conversion needs (never pickle files), and checks the pins and the lock file against
   that list before downloading anything;
3. downloads with ``hf_hub_download`` into the normal HF cache (``HF_HOME``,
   ``HF_HUB_CACHE``, ``HF_HUB_OFFLINE`` and an existing cache work as users expect),
   pinned to the commit;
4. computes the SHA-256 of every file itself, always, also for cached files, and compares
   it with the Hub's metadata (offline: the cache's content address, the blob's name),
   the lock file and the ``--sha256`` pins.

A file whose bytes do not match its content address is removed from the cache (blob and
link) so that the next run downloads it again; nothing else in the cache is touched.

``fetch_snapshot`` is the one entry point; ``Snapshot`` carries what was verified and can
defer the hashing of large files to a caller that reads them anyway (the converter's
single pass): ``Snapshot.check`` verifies one reported hash, ``Snapshot.complete`` hashes
whatever was not reported, ``Snapshot.record`` gives the manifest's record.

huggingface_hub is imported inside functions: ``dspark --help`` must stay fast.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
from collections.abc import Collection, Iterable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal
from urllib.parse import quote

from dspark_convert.errors import (
    DSparkError,
    HubFileNotFoundError,
    HubIntegrityError,
    HubNetworkError,
    HubOfflineError,
    HubRepoNotFoundError,
    HubRevisionNotFoundError,
    HubSpecError,
    HubTruncatedDownloadError,
    LockMismatchError,
    PinMismatchError,
)
from dspark_convert.util.patterns import is_commit, is_commit_any_case, is_repo_id, is_sha256
from dspark_convert.util.text import shown
from dspark_convert.util.progress import NoProgress, Progress

DEFAULT_ENDPOINT = "https://huggingface.co"

# What conversion needs, top-level files only. Tokenizer files are taken when present
# (the target checks fingerprint them).
CHECKPOINT_PATTERNS: tuple[str, ...] = (
    "config.json", "*.safetensors", "model.safetensors.index.json",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
    "vocab.json", "merges.txt", "added_tokens.json",
)
# Never downloaded, whatever the patterns say: unpickling runs code.
NEVER_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
WEIGHTS_FILES = ("model.safetensors", "model.safetensors.index.json")

Check = Literal["hub-lfs-sha256", "hub-git-blob-sha1", "cache-blob-sha256", "cache-blob-sha1",
                "lock", "pin"]
_BLOCK = 8 * 1024 * 1024


# --------------------------------------------------------------------------------------------
# Specs, pins, policy
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HubSpec:
    repo: str
    revision: str | None  # as written; None when the spec has no '@'

    @property
    def is_commit(self) -> bool:
        return self.revision is not None and is_commit(self.revision)

    def __str__(self) -> str:
        return self.repo if self.revision is None else f"{self.repo}@{self.revision}"


def looks_like_hub_spec(text: str | os.PathLike) -> bool:
    """True for ``org/name@rev`` that is not an existing local path (a local directory
    always wins; ``org/name`` alone is a Hub spec only with --resolve or --lock)."""
    text = os.fspath(text)
    if os.path.exists(text) or "@" not in text:
        return False
    return is_repo_id(text.split("@", 1)[0])


def parse_spec(text: str) -> HubSpec:
    repo, at, revision = text.partition("@")
    if not is_repo_id(repo):
        raise HubSpecError(f"{text}: not a Hub spec; expected org/name@<40-hex commit>",
                           field="source", expected="org/name@<40-hex commit>", found=text)
    if at and not revision:
        raise HubSpecError(f"{text}: empty revision after '@'; expected a 40-hex commit",
                           field="source", expected="org/name@<40-hex commit>", found=text)
    if revision and is_commit_any_case(revision):
        revision = revision.lower()
    return HubSpec(repo=repo, revision=revision or None)


def parse_pins(texts: Iterable[str]) -> dict[str, str]:
    """``--sha256 FILE=HEX`` options -> {file: hex}; malformed or repeated pins refused."""
    pins: dict[str, str] = {}
    for text in texts:
        path, eq, digest = text.partition("=")
        digest = digest.strip().lower()
        if not eq or not path or not is_sha256(digest):
            raise HubSpecError(f"--sha256 {text}: expected FILE=<64-hex SHA-256>",
                               field="--sha256", expected="FILE=<64-hex SHA-256>", found=text)
        if path in pins and pins[path] != digest:
            raise HubSpecError(f"--sha256 {path}: pinned twice with different hashes",
                               field="--sha256", expected="one hash per file", found=text)
        pins[path] = digest
    return pins


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try before "network failure after retries": retries of each metadata
    request with doubling waits. (Downloads keep huggingface_hub's own resume logic.)"""
    retries: int = 3
    wait: float = 0.5
    max_wait: float = 4.0
    timeout: float = 10.0


def hub_endpoint(endpoint: str | None = None) -> str:
    # huggingface_hub reads HF_ENDPOINT once at import; we read it at call time.
    return (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def hub_cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """The HF cache as huggingface_hub resolves it, read from the environment now."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    from huggingface_hub import constants
    return Path(constants.HF_HUB_CACHE).expanduser()


def offline_mode() -> bool:
    return any(os.environ.get(v, "").upper() in {"1", "ON", "YES", "TRUE"}
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def wanted(path: str, patterns: Iterable[str]) -> bool:
    """Whether a repo file is downloaded: matches a pattern, is never a pickle file, and
    (for patterns without '/') sits at the top level."""
    if path.lower().endswith(NEVER_SUFFIXES):
        return False
    for pattern in patterns:
        if "/" not in pattern and "/" in path:
            continue
        if fnmatch.fnmatchcase(path, pattern):
            return True
    return False


# --------------------------------------------------------------------------------------------
# The snapshot
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Expectation:
    check: Check
    algorithm: Literal["sha256", "git-sha1"]
    digest: str
    size: int | None  # the size the same source declares, when it does
    origin: str       # for messages: "the Hub's LFS metadata", "dspark.lock", ...


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
    checks: tuple[Check, ...]


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

    @property
    def pending(self) -> list[SnapshotFile]:
        return [f for f in self.files if f.path not in self.verified]

    def check(self, path: str, size: int, sha256: str) -> VerifiedFile:
        """Verify one file from a hash computed elsewhere (the converter's pass). Raises
        the mismatch's error; a file whose bytes are not its cache address is evicted."""
        spec = self.file(path)
        if spec.needs_git_sha1:
            raise ValueError(f"{path}: needs a git blob SHA-1; hash it with complete()")
        return _verify(self, spec, size, sha256, None)

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
                    size, sha256, sha1 = hash_file(spec.local, spec.needs_git_sha1,
                                                   progress.advance)
                    done[spec.path] = _verify(self, spec, size, sha256, sha1)
            finally:
                progress.finish()
        return replace(self, verified=done)

    def record(self):
        """The manifest's ``source.hub`` record; every file must be verified."""
        from dspark_convert.artifact.manifest import HubFileRecord, HubRecord

        missing = [f.path for f in self.files if f.path not in self.verified]
        if missing:
            raise ValueError(f"not verified yet: {', '.join(missing)}")
        return HubRecord(
            repo=self.repo, requested_revision=self.revision, commit=self.commit,
            resolved=self.resolved, offline=self.offline, endpoint=self.endpoint,
            lock_sha256=self.lock_sha256,
            files=[HubFileRecord(path=v.path, size=v.size, sha256=v.sha256,
                                 verified_against=list(v.checks))
                   for v in sorted(self.verified.values(), key=lambda v: v.path)])


def git_blob_sha1(data_size: int) -> "hashlib._Hash":
    """A SHA-1 primed with git's blob header; feed it the file's bytes."""
    digest = hashlib.sha1()
    digest.update(b"blob %d\0" % data_size)
    return digest


def hash_file(path: Path, with_sha1: bool = False, advance=None) -> tuple[int, str, str | None]:
    """(size, sha256, git blob sha1 when asked) of a file, streamed."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            sha256 = hashlib.sha256()
            sha1 = git_blob_sha1(size) if with_sha1 else None
            done = 0
            while block := fh.read(_BLOCK):
                sha256.update(block)
                if sha1 is not None:
                    sha1.update(block)
                done += len(block)
                if advance is not None:
                    advance(len(block))
    except OSError as exc:
        raise HubOfflineError(f"{path}: cannot read the cached file: {exc.strerror or exc}",
                              path=str(path)) from None
    if done != size:
        raise HubIntegrityError(f"{path}: changed while it was hashed ({size} -> {done} bytes)",
                                path=str(path), expected=size, found=done)
    return size, sha256.hexdigest(), sha1.hexdigest() if sha1 is not None else None


def _verify(snap: Snapshot, spec: SnapshotFile, size: int, sha256: str,
            sha1: str | None) -> VerifiedFile:
    """Compare one file's size and hashes with every expectation, strongest source first:
    the Hub / the cache address (integrity), then the lock, then the pins."""
    _check_size(snap, spec, size)
    where = f"{snap.repo}@{snap.commit[:12]}: {spec.path}"
    checks: list[Check] = []
    for exp in spec.expectations:
        found = sha256 if exp.algorithm == "sha256" else sha1
        if found != exp.digest:
            name = "SHA-256" if exp.algorithm == "sha256" else "git blob SHA-1"
            if exp.check in ("lock", "pin"):
                _mismatch(exp, where, f"{name} {exp.digest}", f"{name} {found}", spec)
            _evict(spec)
            raise HubIntegrityError(
                f"{where}: {name} {found}; expected {exp.digest} ({exp.origin}); the damaged "
                "cache entry was removed, run again to download it",
                path=spec.path, expected=exp.digest, found=found)
        checks.append(exp.check)
    return VerifiedFile(path=spec.path, size=size, sha256=sha256, checks=tuple(checks))


def _check_size(snap: Snapshot, spec: SnapshotFile, size: int) -> None:
    where = f"{snap.repo}@{snap.commit[:12]}: {spec.path}"
    for exp in spec.expectations:
        if exp.size is None or size == exp.size:
            continue
        if exp.check in ("lock", "pin"):
            _mismatch(exp, where, f"size {exp.size}", f"size {size}", spec)
        _evict(spec)
        error = HubTruncatedDownloadError if size < exp.size else HubIntegrityError
        raise error(f"{where}: {size} bytes; expected {exp.size} ({exp.origin}); the "
                    "damaged cache entry was removed, run again to download it",
                    path=spec.path, expected=exp.size, found=size)


def _mismatch(exp: Expectation, where: str, expected: str, found: str, spec: SnapshotFile):
    error = LockMismatchError if exp.check == "lock" else PinMismatchError
    raise error(f"{where}: {found}; expected {expected} ({exp.origin})", path=spec.path,
                expected=expected, found=found)


def _evict(spec: SnapshotFile) -> None:
    """Remove a cache entry whose bytes are not what its content address (the blob's
    name: SHA-256 of an LFS file, git SHA-1 of a small one) says: huggingface_hub would
    serve it again, unchecked, forever."""
    try:
        if spec.local.is_symlink():
            blob = spec.local.resolve()
            if blob.parent.name == "blobs":
                blob.unlink(missing_ok=True)
        spec.local.unlink(missing_ok=True)
    except OSError:
        pass  # a read-only cache: the next run re-hashes and refuses again


# --------------------------------------------------------------------------------------------
# Talking to the Hub
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    git_sha1: str
    lfs_sha256: str | None


def _translate(exc: BaseException, what: str, *, downloading: bool = False) -> DSparkError:
    """A huggingface_hub / httpx exception as one of our one-line errors."""
    import httpx2
    from huggingface_hub import errors as hf

    if isinstance(exc, hf.LocalEntryNotFoundError):
        cause = exc.__cause__ or exc.__context__
        if cause is None or isinstance(cause, hf.OfflineModeIsEnabled):
            return HubOfflineError(f"{what}: offline and not in the local cache; expected a "
                                   "cached snapshot of that commit (run once online)",
                                   found="not cached")
        return _translate(cause, what, downloading=downloading)
    if isinstance(exc, hf.RepositoryNotFoundError):
        return HubRepoNotFoundError(f"{what}: repository not found on the Hub (or private "
                                    "without access)", found="RepoNotFound")
    if isinstance(exc, hf.RevisionNotFoundError):
        return HubRevisionNotFoundError(f"{what}: revision not found in the repository",
                                        found="RevisionNotFound")
    if isinstance(exc, hf.RemoteEntryNotFoundError):
        return HubFileNotFoundError(f"{what}: file not found in the repository at that commit",
                                    found="EntryNotFound")
    if isinstance(exc, hf.HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else "?"
        return HubNetworkError(f"{what}: the Hub answered HTTP {status} after retries",
                               expected="HTTP 200", found=f"HTTP {status}")
    if isinstance(exc, httpx2.RemoteProtocolError) and downloading:
        return HubTruncatedDownloadError(f"{what}: the transfer was cut short after retries "
                                         f"({exc})", found=str(exc)[:120])
    if isinstance(exc, (httpx2.TransportError, ConnectionError, TimeoutError)):
        return HubNetworkError(f"{what}: cannot reach the Hub after retries: "
                               f"{type(exc).__name__}: {exc}", found=type(exc).__name__)
    if isinstance(exc, OSError) and "Consistency check failed" in str(exc):
        sizes = re.search(r"size (\d+) but has size (\d+)", str(exc))
        return HubTruncatedDownloadError(
            f"{what}: download ended short" + (f": {sizes.group(2)} of {sizes.group(1)} bytes"
                                               if sizes else ""),
            expected=int(sizes.group(1)) if sizes else None,
            found=int(sizes.group(2)) if sizes else None)
    if isinstance(exc, OSError):
        return HubNetworkError(f"{what}: download failed: {exc.strerror or exc}",
                               found=type(exc).__name__)
    raise exc


def _api_get(url: str, policy: RetryPolicy, what: str):
    """GET a Hub API url with our retry policy; returns the parsed JSON and the response."""
    from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_backoff

    try:
        response = http_backoff("GET", url, headers=build_hf_headers(), timeout=policy.timeout,
                                max_retries=policy.retries, base_wait_time=policy.wait,
                                max_wait_time=policy.max_wait)
        hf_raise_for_status(response)
    except Exception as exc:
        raise _translate(exc, what) from None
    try:
        return response.json(), response
    except ValueError as exc:
        raise HubNetworkError(f"{what}: the Hub answered something that is not JSON ({exc})",
                              found="not JSON") from None


def resolve_revision(repo: str, revision: str, *, endpoint: str, policy: RetryPolicy) -> str:
    """A branch or tag -> its commit, asked from the Hub now."""
    url = f"{endpoint}/api/models/{repo}/revision/{quote(revision, safe='')}"
    data, _ = _api_get(url, policy, f"{repo}@{revision}")
    sha = data.get("sha") if isinstance(data, dict) else None
    if not isinstance(sha, str) or not is_commit(sha):
        raise HubNetworkError(f"{repo}@{revision}: the Hub's answer has no 40-hex 'sha'",
                              expected="a 40-hex commit", found=str(sha)[:60])
    return sha


def list_files(repo: str, commit: str, *, endpoint: str, policy: RetryPolicy) -> list[RemoteFile]:
    """Every file of the commit with its size, git blob SHA-1 and LFS SHA-256."""
    url = f"{endpoint}/api/models/{repo}/tree/{commit}?recursive=true&expand=false"
    what = f"{repo}@{commit}"
    files: list[RemoteFile] = []
    while url:
        page, response = _api_get(url, policy, what)
        if not isinstance(page, list):
            raise HubNetworkError(f"{what}: the Hub's file list is not a JSON list",
                                  found=type(page).__name__)
        for entry in page:
            if isinstance(entry, dict) and entry.get("type") == "file":
                files.append(_remote_file(entry, what))
        url = response.links.get("next", {}).get("url")
    return files


def _remote_file(entry: dict, what: str) -> RemoteFile:
    lfs = entry.get("lfs")
    path, size, oid = entry.get("path"), entry.get("size"), entry.get("oid")
    lfs_sha = lfs.get("oid") if isinstance(lfs, dict) else None
    if lfs is not None:
        size = lfs.get("size", size) if isinstance(lfs, dict) else None
    # A path must be UTF-8 text: JSON lets "\ud800" through, which no file name, manifest
    # or message can carry.
    ok = (isinstance(path, str) and shown(path) == path and isinstance(size, int)
          and isinstance(oid, str)
          and (lfs is None or is_sha256(lfs_sha)))
    if not ok:
        raise HubNetworkError(f"{what}: malformed file entry in the Hub's list: {str(entry)[:100]}",
                              found=str(entry)[:100])
    return RemoteFile(path=path, size=size, git_sha1=oid, lfs_sha256=lfs_sha)


def _bar_class(progress: Progress):
    """A tqdm stand-in for huggingface_hub that feeds our Progress (its own bars never
    draw: the CLI's progress decides, and it draws only on a terminal)."""

    class _Bar:
        def __init__(self, *args, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def update(self, n=1):
            if n and n > 0:  # a rollback on resume (negative) is not drawn
                progress.advance(int(n))

        def close(self):
            pass

    return _Bar


def _download(snap_dir: Path, repo: str, commit: str, path: str, *, endpoint: str,
              cache_dir: Path, timeout: float, bar) -> Path:
    from huggingface_hub import hf_hub_download

    what = f"{repo}@{commit[:12]}: {path}"
    try:
        local = Path(hf_hub_download(repo, path, revision=commit, endpoint=endpoint,
                                     cache_dir=cache_dir, etag_timeout=timeout, tqdm_class=bar))
    except Exception as exc:
        raise _translate(exc, what, downloading=True) from None
    expected = snap_dir / path
    if local != expected:
        # huggingface_hub stores what the server says it served under that commit's
        # folder and returns it: another commit than the pinned one is a refusal.
        served = local.relative_to(snap_dir.parent).parts[0] if local.is_relative_to(
            snap_dir.parent) else str(local)
        _undo_foreign_commit(snap_dir, local, commit)
        raise HubIntegrityError(f"{what}: the Hub served commit {served}; expected the pinned "
                                f"commit {commit}", path=path, expected=commit, found=served)
    return local


def _undo_foreign_commit(snap_dir: Path, local: Path, commit: str) -> None:
    """Remove the link huggingface_hub filed under the other commit, and the ref it wrote
    mapping our commit to it, so the cache says nothing the pinned commit did not."""
    try:
        if local.is_symlink():
            local.unlink()
        ref = snap_dir.parent.parent / "refs" / commit
        if ref.is_file() and ref.read_text().strip() != commit:
            ref.unlink()
    except OSError:
        pass


# --------------------------------------------------------------------------------------------
# fetch_snapshot
# --------------------------------------------------------------------------------------------

def fetch_snapshot(spec: str | HubSpec, *, resolve: bool = False,
                   pins: Mapping[str, str] | None = None, lock=None,
                   allow_patterns: Iterable[str] = CHECKPOINT_PATTERNS,
                   required: Collection[str] = ("config.json",),
                   require_weights: bool = True,
                   defer: Iterable[str] = (), endpoint: str | None = None,
                   cache_dir: str | os.PathLike | None = None, offline: bool | None = None,
                   policy: RetryPolicy = RetryPolicy(),
                   progress: Progress | None = None) -> Snapshot:
    """Download (or find in the cache) a pinned Hub snapshot and verify it.

    ``lock`` is a ``lockfile.LockFile`` (or a path to one). Files matching the ``defer``
    patterns whose expectations are all SHA-256 are not hashed here: the caller reads them anyway and
    reports each hash through ``Snapshot.check``, then calls ``Snapshot.complete``.
    Every refusal raises a HubError subclass (exit codes 50-59)."""
    with _quiet_huggingface_hub():
        return _fetch_snapshot(spec, resolve, pins, lock, allow_patterns, required,
                               require_weights, defer, endpoint, cache_dir, offline, policy,
                               progress)


@contextmanager
def _quiet_huggingface_hub():
    """huggingface_hub logs its retries ("Retrying in 1s") on stderr; a library call of
    ours prints nothing (the error it ends in says what happened), so its logger is
    silenced for the duration of the call."""
    import logging

    # Importing it configures the library's logger (level, handler): do that first.
    import huggingface_hub.utils.logging  # noqa: F401

    logger = logging.getLogger("huggingface_hub")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _fetch_snapshot(spec, resolve, pins, lock, allow_patterns, required, require_weights, defer,
                    endpoint, cache_dir, offline, policy, progress) -> Snapshot:
    from dspark_convert.source.hub.lockfile import LockFile, read_lock

    progress = progress or NoProgress()
    spec = spec if isinstance(spec, HubSpec) else parse_spec(spec)
    pins = dict(pins or {})
    lock_sha = None
    lock_label = "the lock file"
    if lock is not None and not isinstance(lock, LockFile):
        lock_label = Path(lock).name
        lock_sha = hash_file(Path(lock))[1] if Path(lock).is_file() else None
        lock = read_lock(lock)
    elif lock is not None:
        from dspark_convert.source.hub.lockfile import lock_json
        lock_sha = hashlib.sha256(lock_json(lock).encode()).hexdigest()
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
            raise HubSpecError(f"{spec.repo}: no revision; expected {spec.repo}@<40-hex commit> "
                               "(or --resolve to resolve the default branch now)",
                               field="source", expected="org/name@<40-hex commit>", found=str(spec))
        revision = "main"
    storage = cache / ("models--" + spec.repo.replace("/", "--"))
    resolved = False
    if not is_commit(revision):
        if not resolve:
            raise HubSpecError(f"{spec.repo}@{revision}: '{revision}' is a branch or tag, not a "
                               "40-hex commit; pin the commit, or pass --resolve to resolve it now "
                               "(the commit is printed and recorded)", field="revision",
                               expected="a 40-hex commit", found=revision)
        commit = (_cached_ref(storage, spec.repo, revision) if offline
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
        files = _cached_files(snap_dir, patterns, what, lock)
    else:
        remote = [f for f in list_files(spec.repo, commit, endpoint=endpoint, policy=policy)
                  if wanted(f.path, patterns)]
        files = [_hub_file(snap_dir, f) for f in remote]
    _check_required(files, required, require_weights, what, snap_dir, offline)
    files = _add_user_expectations(files, pins, lock, lock_label, what, offline)

    if not offline:
        todo = [f for f in files if not os.path.exists(f.local)]
        bar = _bar_class(progress)
        progress.start(f"download {spec.repo}", sum(f.size for f in todo))
        try:
            for f in todo:
                _download(snap_dir, spec.repo, commit, f.path, endpoint=endpoint,
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
            _check_size(snap, f, f.local.stat().st_size)
    to_hash = replace(snap, files=tuple(f for f in files if f.path not in deferred))
    hashed = to_hash.complete(progress=progress)
    return replace(snap, verified=dict(hashed.verified))


def _cached_ref(storage: Path, repo: str, revision: str) -> str:
    ref = storage / "refs" / revision
    try:
        commit = ref.read_text().strip()
    except OSError:
        raise HubOfflineError(f"{repo}@{revision}: offline and '{revision}' was never resolved "
                              "in the local cache; expected a cached ref (or pin the commit)",
                              path=str(ref), found="not cached") from None
    if not is_commit(commit):
        raise HubOfflineError(f"{ref}: not a 40-hex commit", path=str(ref), found=commit[:60])
    return commit


def _hub_file(snap_dir: Path, f: RemoteFile) -> SnapshotFile:
    if f.lfs_sha256 is not None:
        exp = Expectation("hub-lfs-sha256", "sha256", f.lfs_sha256, f.size, "the Hub's LFS metadata")
    else:
        exp = Expectation("hub-git-blob-sha1", "git-sha1", f.git_sha1, f.size,
                          "the Hub's git blob id")
    return SnapshotFile(path=f.path, local=snap_dir / f.path, size=f.size, expectations=(exp,))


def _cached_files(snap_dir: Path, patterns: tuple[str, ...], what: str, lock) -> list[SnapshotFile]:
    """Offline: the commit's files in the cache; each link's blob name is a content
    address we can check (64 hex: SHA-256 of an LFS file; 40 hex: git blob SHA-1)."""
    if not snap_dir.is_dir():
        raise HubOfflineError(f"{what}: offline (HF_HUB_OFFLINE) and that commit is not in the "
                              f"local cache ({snap_dir.parent.parent}); expected a cached snapshot "
                              "(run once online)", path=str(snap_dir), found="not cached")
    out = []
    for local in sorted(snap_dir.rglob("*")):
        rel = local.relative_to(snap_dir).as_posix()
        if local.is_dir() or not wanted(rel, patterns):
            continue
        if not local.exists():  # dangling link: the blob is gone
            continue
        expectations = ()
        if local.is_symlink():
            name = Path(os.readlink(local)).name
            if is_sha256(name):
                expectations = (Expectation("cache-blob-sha256", "sha256", name, None,
                                            "the cache's content address"),)
            elif is_commit(name):
                expectations = (Expectation("cache-blob-sha1", "git-sha1", name, None,
                                            "the cache's content address"),)
        out.append(SnapshotFile(path=rel, local=local, size=local.stat().st_size,
                                expectations=expectations))
    if lock is not None:
        have = {f.path for f in out}
        missing = [f.path for f in lock.files if f.path not in have]
        if missing:
            raise HubOfflineError(f"{what}: {missing[0]}: offline and not in the local cache; "
                                  "the lock file names it", path=missing[0], found="not cached")
    return out


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
    """Every shard the index names must be in the commit (else a missing file, named)."""
    import json

    index = snap_dir / "model.safetensors.index.json"
    if not any(f.path == index.name for f in files):
        return
    try:
        weight_map = json.loads(index.read_bytes()).get("weight_map", {})
        shards = set(weight_map.values()) if isinstance(weight_map, dict) else set()
    except (OSError, ValueError, AttributeError):
        return  # the converter refuses a malformed index with its own error, naming it
    have = {f.path for f in files}
    for shard in sorted(s for s in shards if isinstance(s, str)):
        if shard not in have:
            raise HubFileNotFoundError(f"{what}: {shard} (named by {index.name}) not found in "
                                       "the repository", path=shard, expected=shard,
                                       found="missing")


def _add_user_expectations(files: list[SnapshotFile], pins: Mapping[str, str], lock,
                           lock_label: str, what: str, offline: bool) -> list[SnapshotFile]:
    """The lock and the --sha256 pins against the file list, before any download."""
    by_path = {f.path: f for f in files}
    for path in pins:
        if path not in by_path:
            raise PinMismatchError(f"--sha256 {path}: not among the files of {what} "
                                   f"({', '.join(sorted(by_path)) or 'none'})", path=path,
                                   expected=path, found="not downloaded")
    if lock is not None:
        locked = {f.path: f for f in lock.files}
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
            entry = next(x for x in lock.files if x.path == f.path)
            if entry.size != f.size:
                raise LockMismatchError(f"{lock_label}: {f.path}: size {f.size} in {what}; "
                                        f"expected the locked size {entry.size}", path=f.path,
                                        expected=entry.size, found=f.size)
            extra.append(Expectation("lock", "sha256", entry.sha256, entry.size, lock_label))
        if f.path in pins:
            extra.append(Expectation("pin", "sha256", pins[f.path], None, "--sha256"))
        out.append(replace(f, expectations=f.expectations + tuple(extra)))
    return out


def lock_from_snapshot(snap: Snapshot):
    """The lock file of a fully verified snapshot."""
    from dspark_convert.source.hub.lockfile import LockedFile, LockFile

    missing = [f.path for f in snap.files if f.path not in snap.verified]
    if missing:
        raise ValueError(f"not verified yet: {', '.join(missing)}")
    return LockFile(format="dspark-lock", format_version=1, repo=snap.repo,
                    revision=snap.revision, commit=snap.commit,
                    files=[LockedFile(path=v.path, size=v.size, sha256=v.sha256)
                           for v in sorted(snap.verified.values(), key=lambda v: v.path)])


@dataclass(frozen=True)
class LockResult:
    path: Path
    snapshot: Snapshot


def lock_snapshot(spec: str, output: str | os.PathLike, *, resolve: bool = False,
                  force: bool = False, endpoint: str | None = None,
                  cache_dir: str | os.PathLike | None = None, offline: bool | None = None,
                  policy: RetryPolicy = RetryPolicy(),
                  progress: Progress | None = None) -> LockResult:
    """``dspark lock``: download and verify a snapshot, then write its lock file."""
    from dspark_convert.source.hub.lockfile import write_lock

    from dspark_convert.util.atomic import check_output, refuse_overlap

    # Before the download: an existing lock (without --force), and a lock file that would
    # land inside (or replace a file of) the cache the snapshot is read from.
    from dspark_convert.errors import OutputWriteError
    from dspark_convert.util.paths import check_path

    check_path(output, what="the lock file", error=OutputWriteError)
    out = check_output(output, force=force, directory=False)
    refuse_overlap(out, [(hub_cache_dir(cache_dir), "the Hugging Face cache")])
    snap = fetch_snapshot(spec, resolve=resolve, endpoint=endpoint, cache_dir=cache_dir,
                          offline=offline, policy=policy, progress=progress)
    return LockResult(path=write_lock(lock_from_snapshot(snap), out, force=force), snapshot=snap)


# --------------------------------------------------------------------------------------------
# A Hub source being converted (convert.py)
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HubOptions:
    """What ``dspark convert`` takes for a Hub source (CLI: --resolve, --sha256, --lock)."""
    resolve: bool = False
    pins: Mapping[str, str] = field(default_factory=dict)
    lock: object = None            # a LockFile or a path to one
    endpoint: str | None = None    # default: HF_ENDPOINT, read now
    cache_dir: str | os.PathLike | None = None
    offline: bool | None = None    # default: HF_HUB_OFFLINE, read now
    policy: RetryPolicy = RetryPolicy()


class HubSource:
    """A fetched snapshot handed to the converter: where it is, its identity, a
    ``file_check`` for the converter's pass, and the manifest record at the end.

    The weights are LFS files whose expectation is a SHA-256: they are not hashed twice;
    the converter's single read pass reports their hash to ``check``. Files hashed here
    already (small ones, checked by git blob SHA-1) must hash the same in the pass: the
    cache must not change under the converter."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self._reported: dict[str, VerifiedFile] = {}

    @property
    def directory(self) -> Path:
        return self.snapshot.directory

    def check(self, rel_path: str, size: int, sha256: str) -> None:
        snap = self.snapshot
        rel_path = Path(rel_path).as_posix()
        done = snap.verified.get(rel_path)
        if done is None:
            self._reported[rel_path] = snap.check(rel_path, size, sha256)
        elif (done.size, done.sha256) != (size, sha256):
            raise HubIntegrityError(f"{snap.repo}@{snap.commit[:12]}: {rel_path}: changed in the "
                                    f"cache during conversion (SHA-256 {sha256}; verified "
                                    f"{done.sha256})", path=rel_path, expected=done.sha256,
                                    found=sha256)

    def record(self, progress: Progress | None = None):
        return self.snapshot.complete(self._reported, progress).record()


def open_hub_source(spec: str, options: HubOptions | None = None,
                    progress: Progress | None = None) -> HubSource:
    """Download (or find in the cache) and verify a Hub source for conversion, leaving the
    weights' hashes to the converter's pass."""
    options = options or HubOptions()
    snap = fetch_snapshot(spec, resolve=options.resolve, pins=options.pins, lock=options.lock,
                          defer=("*.safetensors",), endpoint=options.endpoint,
                          cache_dir=options.cache_dir, offline=options.offline,
                          policy=options.policy, progress=progress)
    return HubSource(snap)
