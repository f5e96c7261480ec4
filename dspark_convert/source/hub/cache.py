"""The local Hugging Face cache, in huggingface_hub's layout, and the few edits we make to it.

``<cache>/models--org--name/`` holds ``refs/<branch or tag>`` (a commit),
``snapshots/<commit>/<path>`` (links) and ``blobs/<content address>``: the SHA-256 of an LFS
file, the git blob SHA-1 of any other. The environment (``HF_HUB_CACHE``, ``HF_HOME``,
``HF_HUB_OFFLINE``) is read at call time, not once at import as huggingface_hub does.

We only ever remove what we proved wrong: a blob whose bytes are not its content address
(``evict``), and what huggingface_hub filed for another commit than the one pinned
(``undo_foreign_commit``). Nothing else in the cache is touched.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from dspark_convert.errors import HubOfflineError
from dspark_convert.source.hub.spec import wanted
from dspark_convert.util.patterns import is_commit


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


def repo_storage(cache: Path, repo: str) -> Path:
    """``<cache>/models--org--name``: one model repository's part of the cache."""
    return cache / ("models--" + repo.replace("/", "--"))


def cached_ref(storage: Path, repo: str, revision: str) -> str:
    """The commit a branch or tag was last resolved to (offline ``--resolve``)."""
    ref = storage / "refs" / revision
    try:
        commit = ref.read_text(encoding="utf-8").strip()
    except OSError:
        raise HubOfflineError(f"{repo}@{revision}: offline and '{revision}' was never resolved "
                              "in the local cache; expected a cached ref (or pin the commit)",
                              path=str(ref), found="not cached") from None
    if not is_commit(commit):
        raise HubOfflineError(f"{ref}: not a 40-hex commit", path=str(ref), found=commit[:60])
    return commit


@dataclass(frozen=True)
class CachedFile:
    path: str                     # inside the repo, '/'-separated
    local: Path                   # the snapshot link (or file)
    size: int
    address: str | None           # the blob's name (None: not a link into blobs/)


def cached_files(snap_dir: Path, patterns: Iterable[str], what: str,
                 locked: Collection[str] = ()) -> list[CachedFile]:
    """Offline: the commit's files in the cache that conversion wants, each with the
    content address its link names. ``locked`` (a lock file's paths) must all be there."""
    if not snap_dir.is_dir():
        raise HubOfflineError(f"{what}: offline (HF_HUB_OFFLINE) and that commit is not in the "
                              f"local cache ({snap_dir.parent.parent}); expected a cached snapshot "
                              "(run once online)", path=str(snap_dir), found="not cached")
    patterns = tuple(patterns)
    out = []
    for local in sorted(snap_dir.rglob("*")):
        rel = local.relative_to(snap_dir).as_posix()
        if local.is_dir() or not wanted(rel, patterns):
            continue
        if not local.exists():  # dangling link: the blob is gone
            continue
        address = Path(os.readlink(local)).name if local.is_symlink() else None
        out.append(CachedFile(path=rel, local=local, size=local.stat().st_size, address=address))
    have = {f.path for f in out}
    missing = [path for path in locked if path not in have]
    if missing:
        raise HubOfflineError(f"{what}: {missing[0]}: offline and not in the local cache; "
                              "the lock file names it", path=missing[0], found="not cached")
    return out


def evict(local: Path) -> None:
    """Remove a cache entry whose bytes are not what its content address (the blob's
    name: SHA-256 of an LFS file, git SHA-1 of a small one) says: huggingface_hub would
    serve it again, unchecked, forever."""
    try:
        if local.is_symlink():
            blob = local.resolve()
            if blob.parent.name == "blobs":
                blob.unlink(missing_ok=True)
        local.unlink(missing_ok=True)
    except OSError:
        pass  # a read-only cache: the next run re-hashes and refuses again


def undo_foreign_commit(snap_dir: Path, local: Path, commit: str) -> None:
    """After the Hub served another commit than ``commit``: remove the link
    huggingface_hub filed under that other commit, and the ref it wrote mapping our commit
    to it, so the cache says nothing the pinned commit did not."""
    try:
        if local.is_symlink():
            local.unlink()
        ref = snap_dir.parent.parent / "refs" / commit
        if ref.is_file() and ref.read_text(encoding="utf-8").strip() != commit:
            ref.unlink()
    except OSError:
        pass
