"""``dspark lock``: download and verify a Hub snapshot, then write its lock file
(source/hub/lockfile.py: the repo, the commit and each file's size and SHA-256)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from dspark_convert.source.hub.cache import hub_cache_dir
from dspark_convert.source.hub.client import RetryPolicy
from dspark_convert.source.hub.lockfile import write_lock
from dspark_convert.source.hub.snapshot import (
    Snapshot,
    fetch_snapshot,
    lock_from_snapshot,
)
from dspark_convert.util.atomic import Output, check_outputs
from dspark_convert.util.progress import Progress


@dataclass(frozen=True)
class LockResult:
    path: Path
    snapshot: Snapshot


def lock_snapshot(spec: str, output: str | os.PathLike, *, resolve: bool = False,
                  force: bool = False, endpoint: str | None = None,
                  cache_dir: str | os.PathLike | None = None, offline: bool | None = None,
                  policy: RetryPolicy = RetryPolicy(),
                  progress: Progress | None = None) -> LockResult:
    """Fetch and verify ``spec``, then write its lock file atomically to ``output``."""
    # Before the download, by the one output rule (atomic.check_outputs): a path naming a
    # new file in an existing, writable directory, absent without --force, and never
    # inside (or over a file of) the cache the snapshot is read from.
    out, = check_outputs([Output(output, "the lock file", directory=False)],
                         [(hub_cache_dir(cache_dir), "the Hugging Face cache")], force=force)
    snap = fetch_snapshot(spec, resolve=resolve, endpoint=endpoint, cache_dir=cache_dir,
                          offline=offline, policy=policy, progress=progress)
    return LockResult(path=write_lock(lock_from_snapshot(snap), out, force=force), snapshot=snap)
