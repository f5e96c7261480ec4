"""SHA-256 helpers, streamed in fixed-size blocks."""

from __future__ import annotations

import hashlib
import os

BLOCK = 8 * 1024 * 1024


def sha256_file(path: str | os.PathLike, progress=None) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            block = fh.read(BLOCK)
            if not block:
                break
            digest.update(block)
            if progress is not None:
                progress(len(block))
    return digest.hexdigest()


def weights_digest(files: list[tuple[str, str]]) -> str:
    """dflash.source.sha256: the file's own SHA-256 for one weights file; for shards, the
    SHA-256 of the sorted "<file> <sha256>\\n" lines (ARTIFACT_SPEC.md)."""
    if len(files) == 1:
        return files[0][1]
    lines = "".join(f"{name} {digest}\n" for name, digest in sorted(files))
    return hashlib.sha256(lines.encode()).hexdigest()


def is_sha256_hex(text: object) -> bool:
    return isinstance(text, str) and len(text) == 64 and all(c in "0123456789abcdef" for c in text)
