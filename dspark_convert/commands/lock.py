"""``dspark lock``: download and verify a Hub snapshot, then write its lock file
(source/hub/lockfile.py: the repo, the commit and each file's size and SHA-256)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from dspark_convert.errors import OutputWriteError
from dspark_convert.source.hub.cache import hub_cache_dir
from dspark_convert.source.hub.client import RetryPolicy
from dspark_convert.source.hub.lockfile import write_lock
from dspark_convert.source.hub.snapshot import (
    Snapshot,
    fetch_snapshot,
    lock_from_snapshot,
)
from dspark_convert.util.atomic import check_output, refuse_overlap
from dspark_convert.util.paths import check_path
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
    # Before the download: an existing lock (without --force), and a lock file that would
    # land inside (or replace a file of) the cache the snapshot is read from.
    check_path(output, what="the lock file", error=OutputWriteError)
    out = check_output(output, force=force, directory=False)
    refuse_overlap(out, [(hub_cache_dir(cache_dir), "the Hugging Face cache")])
    snap = fetch_snapshot(spec, resolve=resolve, endpoint=endpoint, cache_dir=cache_dir,
                          offline=offline, policy=policy, progress=progress)
    return LockResult(path=write_lock(lock_from_snapshot(snap), out, force=force), snapshot=snap)
