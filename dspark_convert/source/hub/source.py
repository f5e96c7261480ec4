"""A Hub source as ``dspark convert`` takes it: the options (--resolve, --sha256, --lock) and
the fetched snapshot handed to the converter, whose single read pass reports the weights'
hashes instead of them being read twice."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from dspark_convert.errors import HubIntegrityError
from dspark_convert.source.hub.client import RetryPolicy
from dspark_convert.source.hub.lockfile import LockFile
from dspark_convert.source.hub.snapshot import Snapshot, fetch_snapshot
from dspark_convert.source.hub.verify import VerifiedFile
from dspark_convert.util.progress import Progress


@dataclass(frozen=True)
class HubOptions:
    """What ``dspark convert`` takes for a Hub source (CLI: --resolve, --sha256, --lock)."""
    resolve: bool = False
    pins: Mapping[str, str] = field(default_factory=dict)
    lock: LockFile | str | os.PathLike | None = None
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
            raise HubIntegrityError(f"{snap.where(rel_path)}: changed in the cache during "
                                    f"conversion (SHA-256 {sha256}; verified {done.sha256})",
                                    path=rel_path, expected=done.sha256, found=sha256)

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
