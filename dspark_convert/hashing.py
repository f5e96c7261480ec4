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


def read_blocks(fh, count: int, view: memoryview, hashes, advance, shrank):
    """Read ``count`` bytes of ``fh`` into ``view`` block by block, feed each block to every
    hash in ``hashes`` and to ``advance``, and yield it. A short read raises ``shrank()``:
    the file changed under us after its layout was checked."""
    while count:
        n = fh.readinto(view[:min(count, len(view))])
        if not n:
            raise shrank()
        block = view[:n]
        for digest in hashes:
            digest.update(block)
        advance(n)
        count -= n
        yield block
