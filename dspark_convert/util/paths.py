"""Paths given by the user, checked before the file system is asked about them.

A path component longer than the file system allows (255 bytes) or a path longer than
PATH_MAX makes every ``stat`` fail with ENAMETOOLONG, which ``Path.exists()`` and
``Path.is_dir()`` do not swallow: it used to surface as exit 1 from whichever probe ran
first. Each command checks its paths here, so the refusal is one line with the code of
what the path is (a source, an artifact, a target, an output ...).
"""

from __future__ import annotations

import os
from pathlib import Path

from dspark_convert.errors import DSparkError
from dspark_convert.util.text import shown

NAME_MAX = 255      # bytes in one path component (ext4, xfs, btrfs, tmpfs)
PATH_MAX = 4096     # bytes in a whole path, as the kernel takes it


def check_path(path: str | os.PathLike, *, what: str, error: type[DSparkError]) -> Path:
    """``path`` as a Path, or ``error`` (one line naming it) when no file system could hold
    it. ``what`` says what it is, for the message ("the source checkpoint")."""
    raw = os.fsencode(os.fspath(path))
    if len(raw) >= PATH_MAX:
        raise error(f"{shown(os.fsdecode(raw[:60]))}...: {what} path is {len(raw)} bytes long; "
                    f"expected fewer than {PATH_MAX}", path=shown(os.fsdecode(raw[:200])),
                    expected=f"< {PATH_MAX} bytes", found=len(raw))
    for part in raw.split(b"/"):
        if len(part) > NAME_MAX:
            name = shown(os.fsdecode(part[:40]))
            raise error(f"{shown(os.fsdecode(raw))}: {what}: the path component '{name}...' is "
                        f"{len(part)} bytes long; a file name is at most {NAME_MAX} bytes",
                        path=shown(os.fsdecode(raw)), expected=f"<= {NAME_MAX} bytes",
                        found=len(part))
    return Path(os.fspath(path))
