"""The one home of streamed hashing: SHA-256 (and a file's git blob SHA-1) in fixed blocks.

Every block loop here reads through ``read_full``: a block is handed on only once it holds
every byte asked for, so a file that shrinks while it is read is refused by the caller's
``shrank()`` error, never seen as a short block (an odd-length block of BF16 values would
make the numpy view of the finite check fail with an error that is not ours).
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

# The block size of every streamed pass over a file (hash, copy, NaN/Inf scan), the one
# definition the converter, validate, quantize, the target and the Hub code import: large
# enough that the per-call cost (a read, a hashlib update that releases the GIL) is noise,
# small enough that two buffers of it bound a pass's memory whatever the file's size.
BLOCK = 8 * 1024 * 1024


@dataclass(frozen=True)
class FileHash:
    size: int                  # bytes read (and hashed) up to the end of the file
    stat_size: int             # the size when it was opened; the git blob header's size
    sha256: str
    git_blob_sha1: str | None  # when asked for

    @property
    def changed(self) -> bool:
        """The file grew or shrank while it was read: the hashes describe no one state of it."""
        return self.size != self.stat_size


def git_blob_sha1(size: int):
    """A SHA-1 primed with git's blob header ``blob <size>\\0``: fed the file's ``size``
    bytes, its hex digest is the file's git object id (the Hub's ``oid``/``blob_id`` of a
    file not in LFS, and that file's blob name in the HF cache)."""
    digest = hashlib.sha1()
    digest.update(b"blob %d\0" % size)
    return digest


def hash_file(path: str | os.PathLike, *, git_blob: bool = False, advance=None) -> FileHash:
    """A whole file's SHA-256 (and, with ``git_blob``, its git blob SHA-1), read to its end
    in BLOCK pieces; ``advance(n)`` sees every block. OSError propagates. A file that
    changes size meanwhile is reported (``FileHash.changed``), not refused: the caller
    says what that means for it."""
    with open(path, "rb") as fh:
        stat_size = os.fstat(fh.fileno()).st_size
        hashes = [hashlib.sha256()]
        if git_blob:
            hashes.append(git_blob_sha1(stat_size))
        # A small file needs no 8 MiB buffer; one that grows is still read to its end.
        view = memoryview(bytearray(min(BLOCK, max(stat_size, 64 * 1024))))
        size = 0
        while n := read_full(fh, view):
            for digest in hashes:
                digest.update(view[:n])
            if advance is not None:
                advance(n)
            size += n
    return FileHash(size=size, stat_size=stat_size, sha256=hashes[0].hexdigest(),
                    git_blob_sha1=hashes[1].hexdigest() if git_blob else None)


def sha256_file(path: str | os.PathLike, progress=None) -> str:
    return hash_file(path, advance=progress).sha256


def weights_digest(files: list[tuple[str, str]]) -> str:
    """dflash.source.sha256: the file's own SHA-256 for one weights file; for shards, the
    SHA-256 of the sorted "<file> <sha256>\\n" lines (docs/ARTIFACT_FORMAT.md)."""
    if len(files) == 1:
        return files[0][1]
    lines = "".join(f"{name} {digest}\n" for name, digest in sorted(files))
    return hashlib.sha256(lines.encode()).hexdigest()




def read_full(fh, view: memoryview) -> int:
    """Fill ``view`` from ``fh``; return the bytes read, fewer than ``len(view)`` only at the
    end of the file. ``readinto`` may return fewer bytes than asked without being at the end
    (a raw or unbuffered file, a signal), so a short count is retried; only a read that
    returns nothing (0, or None from a non-blocking file) ends it."""
    done = 0
    while done < len(view):
        n = fh.readinto(view[done:])
        if not n:
            break
        done += n
    return done


class ThreadedFileHash:
    """A whole-file SHA-256 fed on a worker thread, so that it runs beside the per-tensor
    work of the reader (a second hash, the finite check, a write): hashlib releases the
    GIL on large updates, and hashing every byte twice on one core would be most of the
    time of a convert or validate. Two read buffers alternate; one is reused only once the
    worker has hashed it. ``pool`` must have exactly one worker, so that the updates run
    in the order the blocks were read."""

    def __init__(self, pool, block_size: int = BLOCK) -> None:
        self.pool = pool
        self.block_size = block_size
        self.digest = hashlib.sha256()
        self.buffers = [memoryview(bytearray(block_size)) for _ in range(2)]
        self.pending = [None, None]
        self.turn = 0

    def blocks(self, fh, count: int, advance, shrank):
        """Read ``count`` bytes of ``fh`` block by block, hash each into the file hash and
        yield it (valid until the next block is requested). Every block is full: the end of
        the file before ``count`` bytes raises ``shrank()`` (the file changed under us after
        its layout was checked), before the caller sees any part of the short block."""
        while count:
            i, self.turn = self.turn, self.turn ^ 1
            self._wait(i)
            n = min(count, self.block_size)
            if read_full(fh, self.buffers[i][:n]) != n:
                raise shrank()
            block = self.buffers[i][:n]
            self.pending[i] = self.pool.submit(self.digest.update, block)
            advance(n)
            count -= n
            yield block

    def _wait(self, i: int) -> None:
        if self.pending[i] is not None:
            self.pending[i].result()
            self.pending[i] = None

    def hexdigest(self) -> str:
        self._wait(0)
        self._wait(1)
        return self.digest.hexdigest()


def hash_file_and_spans(fh, size: int, spans, block_size: int, advance, shrank,
                        inspect=None) -> tuple[str, dict[str, str]]:
    """One sequential read of an open file: its SHA-256 (on a worker thread) and, beside it,
    the SHA-256 of each span ``(name, offset, nbytes)``; the spans must not overlap (they
    are walked in offset order). ``inspect(name, block, done)`` also sees every block of a
    span, ``done`` bytes into it (validate's NaN/Inf scan)."""
    digests: dict[str, str] = {}
    with ThreadPoolExecutor(1, "file-sha256") as pool:
        file_hash = ThreadedFileHash(pool, block_size)
        for name, offset, nbytes in sorted(spans, key=lambda span: span[1]):
            for _ in file_hash.blocks(fh, offset - fh.tell(), advance, shrank):
                pass
            span_hash, done = hashlib.sha256(), 0
            for block in file_hash.blocks(fh, nbytes, advance, shrank):
                span_hash.update(block)
                if inspect is not None:
                    inspect(name, block, done)
                done += len(block)
            digests[name] = span_hash.hexdigest()
        for _ in file_hash.blocks(fh, size - fh.tell(), advance, shrank):
            pass
        return file_hash.hexdigest(), digests


def read_blocks(fh, count: int, view: memoryview, hashes, advance, shrank):
    """Read ``count`` bytes of ``fh`` into ``view`` block by block, feed each block to every
    hash in ``hashes`` and to ``advance``, and yield it. Every block is full: the end of the
    file before ``count`` bytes raises ``shrank()`` (the file changed under us after its
    layout was checked), before any part of the short block is hashed or yielded."""
    while count:
        n = min(count, len(view))
        if read_full(fh, view[:n]) != n:
            raise shrank()
        block = view[:n]
        for digest in hashes:
            digest.update(block)
        advance(n)
        count -= n
        yield block
