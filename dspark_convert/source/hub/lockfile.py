"""dspark.lock: the exact Hub files a conversion may use (``dspark lock`` writes it).

A lock records the repo, the commit and each file's size and SHA-256. ``dspark convert
--lock`` refuses any difference (hub.py compares). Reading is strict: JSON without
duplicate keys, every field typed, nothing unknown. schemas/lockfile.schema.json is
generated from ``LockFile``.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from dspark_convert.util.atomic import atomic_file
from dspark_convert.util.json_out import dumps_model
from dspark_convert.errors import HubSpecError
from dspark_convert.util.models import VersionOne, validated
from dspark_convert.util.paths import check_input_file
from dspark_convert.util.patterns import COMMIT_PATTERN, REPO_PATTERN, SHA256_PATTERN
from dspark_convert.util.strict_json import parse_json_strict, read_capped

LOCK_FORMAT = "dspark-lock"


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class LockedFile(_Strict):
    path: str = Field(min_length=1, description="path inside the repository")
    size: int = Field(ge=0)
    sha256: str = Field(pattern=SHA256_PATTERN)


class LockFile(_Strict):
    format: Literal["dspark-lock"]
    format_version: VersionOne
    repo: str = Field(pattern=REPO_PATTERN, description="Hub repo id")
    revision: str = Field(min_length=1, description="the revision as requested (commit, branch or tag)")
    commit: str = Field(pattern=COMMIT_PATTERN, description="the 40-hex commit it resolved to")
    files: list[LockedFile] = Field(min_length=1, description="sorted by path")

    @field_validator("files")
    @classmethod
    def _sorted_unique(cls, files: list[LockedFile]) -> list[LockedFile]:
        paths = [f.path for f in files]
        if paths != sorted(set(paths)):
            raise ValueError("file paths must be unique and sorted")
        return files


def lock_json(lock: LockFile) -> str:
    # Fixed field order: the same snapshot always gives the same bytes.
    return dumps_model(lock, indent=2) + "\n"


def read_lock(path: str | os.PathLike) -> LockFile:
    """Parse a lock file; anything malformed raises HubSpecError naming the file and field."""
    return read_lock_file(path)[0]


def read_lock_file(path: str | os.PathLike) -> tuple[LockFile, str]:
    """``read_lock`` and the SHA-256 of the bytes it parsed (the file is read once)."""
    path = check_input_file(path, label=f"{path}: lock file", error=HubSpecError,
                            expected="a lock file written by `dspark lock`")
    data = read_capped(path, error=HubSpecError, label=f"{path}")
    raw = parse_json_strict(data, error=HubSpecError, label=f"{path}", path=str(path))
    lock = validated(LockFile, raw, error=HubSpecError, label=f"{path}", path=str(path),
                     hint=" (a dspark-lock v1 file)")
    return lock, hashlib.sha256(data).hexdigest()


def write_lock(lock: LockFile, path: str | os.PathLike, *, force: bool = False) -> Path:
    """Write atomically (atomic.atomic_file): refused if ``path`` exists, unless ``force``;
    on any failure nothing is left behind."""
    text = lock_json(lock).encode("utf-8")
    return atomic_file(path, lambda fh: fh.write(text), force=force)
