"""How a drafter.gguf and its manifest.json are written: the pieces `dspark convert` and
`dspark quantize` share (docs/ARTIFACT_FORMAT.md); `dspark export`'s header is laid out
here too (``header_of``).

Both lay the file out before writing a tensor byte: the header (metadata and tensor infos,
built by gguf-py) first, padded to the alignment, then each tensor at its padded offset.
The file is created at its full size (the padding is the truncate's zeros), the tensors are
written to their places with ``pwrite_all``, and the file is read back once for its
SHA-256 and each tensor's.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
from gguf import GGUFValueType, GGUFWriter

from dspark_convert.artifact.format import KEYS_BY_NAME, padded
from dspark_convert.artifact.manifest import Manifest
from dspark_convert.errors import InternalError
from dspark_convert.util.atomic import write_error
from dspark_convert.util.hashing import BLOCK, hash_file_and_spans
from dspark_convert.util.json_out import dumps_model
from dspark_convert.util.progress import Progress


# (key, value, GGUF type, element type of an array or None): one metadata key as written.
KeyValue = tuple[str, object, GGUFValueType, GGUFValueType | None]


def header_of(arch: str, entries: Iterable[KeyValue], tensors: Iterable, scratch: Path) -> bytes:
    """GGUF header, metadata and tensor infos as gguf-py writes them, padded to the data
    alignment: ``entries`` in file order after ``general.architecture`` (``arch``), and
    ``tensors`` (name, torch shape, nbytes, ggml type) in file order. gguf-py only writes
    to files, so ``scratch`` holds them briefly. Every GGUF file we write has its header
    from here (drafter.gguf, the llama.cpp export).

    ``scratch`` is removed however this ends (a full disk, Ctrl-C, SIGTERM): beside a
    file output (the export's) nothing else would remove it."""
    writer = GGUFWriter(scratch, arch)
    for key, value, gtype, sub_type in entries:
        if key == "general.architecture":
            continue  # GGUFWriter writes it first, from its arch argument
        _exactly_writable(key, value, gtype, sub_type)
        # add_key_value, not add_string/add_array: those silently drop empty values.
        writer.add_key_value(key, value, gtype, sub_type=sub_type)
    for name, shape, nbytes, ggml_type in tensors:
        # A non-uint8 dtype: gguf-py takes ``shape`` as the element shape for any raw type.
        writer.add_tensor_info(name, shape, np.dtype(np.uint16), nbytes, raw_dtype=ggml_type)
    try:
        try:
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
        finally:
            writer.close()
        data = scratch.read_bytes()
    finally:
        scratch.unlink(missing_ok=True)
    return data + bytes(padded(len(data)) - len(data))


def _exactly_writable(key: str, value, gtype: GGUFValueType, sub_type) -> None:
    """gguf-py writes an array's elements with the element type passed, but guesses the
    type of an array without one and of every inner array of an array of arrays (a UINT32
    array comes back INT32), and refuses an empty array (ValueError). Callers refuse such
    inputs first (export: the target's tokenizer keys, 104); one reaching here is a bug."""
    if gtype != GGUFValueType.ARRAY:
        return
    if sub_type is None or sub_type == GGUFValueType.ARRAY:
        what = "of arrays" if sub_type else "without an element type"
        raise InternalError(f"metadata key '{key}': an array {what} cannot be written with "
                            "its types as read (gguf-py would guess them)")
    if len(value) == 0:
        raise InternalError(f"metadata key '{key}': an empty array cannot be written "
                            "(gguf-py refuses one)")


def gguf_header(values: dict[str, object], tensors: Iterable, scratch: Path) -> bytes:
    """drafter.gguf's header (``header_of``): each key typed as artifact/format.py's table
    says."""
    entries = ((key, value, KEYS_BY_NAME[key].type, KEYS_BY_NAME[key].sub_type)
               for key, value in values.items())
    # The family's architecture (artifact/format.py): `dflash`, or a family's own name.
    return header_of(values["general.architecture"], entries, tensors, scratch)


def pwrite_all(fd: int, data, offset: int) -> None:
    """os.pwrite until every byte of ``data`` is written at ``offset``."""
    view = memoryview(data).cast("B")
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def create_gguf(path: Path, header: bytes, total: int, shown: Path) -> int:
    """``path`` created at ``total`` bytes with ``header`` at its start; returns the open
    descriptor (the caller closes it). The padding between tensors is the truncate's zeros,
    and no hole is left once every tensor is written (the tensors cover the data area).
    A failure is an OutputWriteError naming ``shown``, the output the user asked for."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError as exc:
        raise write_error(exc, shown) from None
    try:
        os.ftruncate(fd, total)
        pwrite_all(fd, header, 0)
    except BaseException as exc:        # an interrupt too: fd is still ours to close
        os.close(fd)
        if isinstance(exc, OSError):
            raise write_error(exc, shown) from None
        raise
    return fd


def hash_written(fh, spans: list[tuple[str, int, int]], progress: Progress, shown: Path,
                 inspect: Callable | None = None) -> tuple[str, dict[str, str], int]:
    """The written file read back once: its SHA-256, each span's (name, offset, nbytes)
    SHA-256 and its size; ``inspect(name, block, done)`` sees each span's blocks."""
    def shrank():
        return InternalError(f"{shown}: the file shrank while it was hashed")

    size = os.fstat(fh.fileno()).st_size
    progress.start(f"hash {shown.name}", size)
    try:
        sha, digests = hash_file_and_spans(fh, size, spans, BLOCK, progress.advance, shrank,
                                           inspect=inspect)
    finally:
        progress.finish()
    return sha, digests, size


def manifest_json(manifest: Manifest) -> str:
    # Fixed field order, no timestamps: the same source gives the same bytes.
    return dumps_model(manifest, indent=2) + "\n"
