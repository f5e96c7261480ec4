"""A strict, bounds-checked GGUF parser (GGUF v3, little-endian only).

Why this is written by hand instead of using gguf-py's ``GGUFReader``: ``GGUFReader``
trusts the file. It does not bound the number of dimensions of a tensor, the length of a
string or array, or the tensor and key/value counts; it does not check that tensor offsets
are aligned, inside the file and non-overlapping. On hostile or damaged input it raises
whatever numpy happens to raise (IndexError, ValueError, KeyError, ...) or tries to allocate
arrays as large as a 64-bit length field says. ``dspark validate`` must refuse such a file
with one clear error, so every read here is checked against the end of the buffer and every
count and length is checked against a documented limit *and* against the bytes that remain
before anything is allocated. The only exception this module raises is
:class:`~dspark_convert.errors.GGUFFormatError`.

We still reuse gguf-py's tables (value types, ggml types, block sizes, the magic) so that
there is a single source for those facts.

Layout parsed (all integers little-endian)::

    u32 magic "GGUF" | u32 version (=3) | u64 tensor_count | u64 kv_count
    kv_count   x { string key | u32 value_type | value }
    tensor_count x { string name | u32 n_dims | u64 ne[n_dims] | u32 ggml_type | u64 offset }
    padding to general.alignment (default 32)
    tensor data: each tensor at data_start + offset

    string = u64 length | length bytes of UTF-8
    array  = u32 element_type | u64 count | count values (arrays may nest, see limits)
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from gguf.constants import GGML_QUANT_SIZES, GGUF_MAGIC, GGMLQuantizationType, GGUFValueType

from dspark_convert.errors import GGUFFormatError

__all__ = [
    "GGUFValue", "GGUFTensorInfo", "GGUFFile", "read_gguf", "parse_gguf_bytes", "tensor_data",
    "SUPPORTED_VERSION", "DEFAULT_ALIGNMENT", "MAX_TENSORS", "MAX_KV_PAIRS", "MAX_KEY_LENGTH",
    "MAX_TENSOR_NAME_LENGTH", "MAX_STRING_LENGTH", "MAX_ARRAY_LENGTH", "MAX_ARRAY_DEPTH",
    "MAX_DIMS",
]

# --- limits ----------------------------------------------------------------------------------

#: The only GGUF version we read (and write). v1/v2 differ in field widths.
SUPPORTED_VERSION = 3

#: Alignment of the data section and of every tensor offset when general.alignment is absent
#: (the GGUF default; our artifacts write it explicitly as 32 anyway).
DEFAULT_ALIGNMENT = 32

#: Most tensors in one file. Real models have at most a few thousand; a drafter a few hundred.
#: Also bounded by the bytes left (each tensor info takes at least 33 bytes).
MAX_TENSORS = 65536

#: Most metadata key/value pairs. Also bounded by the bytes left (each pair takes >= 14 bytes).
MAX_KV_PAIRS = 65536

#: Longest metadata key in bytes; the GGUF spec caps keys at 65535 bytes.
MAX_KEY_LENGTH = 65535

#: Longest tensor name in bytes. The spec does not cap names (llama.cpp's own limit is
#: GGML_MAX_NAME = 64, which is a loader rule, checked elsewhere if at all); we apply the key
#: limit so a name cannot be a 16 MiB blob.
MAX_TENSOR_NAME_LENGTH = 65535

#: Longest string value in bytes (16 MiB). A tokenizer's chat template or merges entry is far
#: smaller; anything larger in metadata is hostile.
MAX_STRING_LENGTH = 16 * 1024 * 1024

#: Most elements in one metadata array (16M, enough for a 256k-token vocabulary many times
#: over). In addition, the count may never exceed what the remaining bytes could hold at the
#: element type's minimum encoded size, so no list is ever sized by a lie.
MAX_ARRAY_LENGTH = 16 * 1024 * 1024

#: Array nesting depth: an array (depth 1) may hold arrays (depth 2) but those may not hold
#: arrays again. gguf-py can write one level of nesting; nothing real uses more, and
#: unbounded nesting would let a small file drive deep recursion.
MAX_ARRAY_DEPTH = 2

#: Most dimensions of a tensor (GGML_MAX_DIMS in ggml.h; gguf-py does not export it).
MAX_DIMS = 4

# --- fixed encodings -----------------------------------------------------------------------

# struct format and size of each scalar value type; strings and arrays are variable-length.
_SCALAR_FORMATS: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b",
    GGUFValueType.UINT16: "H", GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i",
    GGUFValueType.UINT64: "Q", GGUFValueType.INT64: "q",
    GGUFValueType.FLOAT32: "f", GGUFValueType.FLOAT64: "d",
    GGUFValueType.BOOL: "B",  # read as a byte so that values other than 0/1 can be refused
}
_SCALAR_SIZES = {t: struct.calcsize("<" + f) for t, f in _SCALAR_FORMATS.items()}

# Smallest encoding of one array element of each type, used to bound counts by bytes left:
# a string is at least its u64 length, an array at least its u32 type and u64 count.
_MIN_ELEMENT_SIZE = {**_SCALAR_SIZES, GGUFValueType.STRING: 8, GGUFValueType.ARRAY: 12}

# Smallest kv pair: u64 key length + 1 key byte + u32 type + 1 value byte (u8/i8/bool).
_MIN_KV_SIZE = 8 + 1 + 4 + 1
# Smallest tensor info: u64 name length + 1 name byte + u32 n_dims + one u64 dim + u32 type
# + u64 offset.
_MIN_TENSOR_INFO_SIZE = 8 + 1 + 4 + 8 + 4 + 8

_VALUE_TYPES = {int(t): t for t in GGUFValueType}
_GGML_TYPES = {int(t): t for t in GGMLQuantizationType if t in GGML_QUANT_SIZES}


# --- public data ---------------------------------------------------------------------------

@dataclass(frozen=True)
class GGUFValue:
    """One metadata value. ``value`` is a Python int, float, bool, str or list (nested lists
    for arrays of arrays); ``sub_type`` is the element type of an array, else None."""

    type: GGUFValueType
    value: object
    sub_type: GGUFValueType | None = None


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One entry of the tensor-info table, validated against the file."""

    name: str
    shape: tuple[int, ...]      # as stored: ne0 first (GGUF order, the reverse of torch's)
    ggml_type: GGMLQuantizationType
    offset: int                 # relative to the data section, as stored
    data_offset: int            # absolute offset in the file
    nbytes: int                 # nelements / block_size * type_size


@dataclass(frozen=True)
class GGUFFile:
    """A parsed GGUF file: header, metadata and tensor table (not the tensor bytes)."""

    path: Path
    version: int
    file_size: int
    alignment: int
    kv: dict[str, GGUFValue]                 # insertion order = file order
    tensors: tuple[GGUFTensorInfo, ...]      # file order of the tensor-info table
    data_start: int                          # absolute start of the data section (aligned)


# --- the parser ----------------------------------------------------------------------------

def _align_up(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


class _Parser:
    """A cursor over the buffer. Every read goes through :meth:`_need`, which refuses to read
    past the end; every failure goes through :meth:`fail`, which names the file."""

    def __init__(self, buf, path: str):
        # ``buf`` is bytes, a byte memoryview or an mmap: all support len(), slicing and
        # struct.unpack_from. We never keep a memoryview of it, so a caller's mmap can be
        # closed as soon as we return (or raise).
        self.buf = buf
        self.size = len(buf)
        self.path = path
        self.pos = 0

    # -- errors and bounds --

    def fail(self, message: str, **kw) -> GGUFFormatError:
        """Build (the caller raises) a GGUFFormatError whose message starts with the file."""
        return GGUFFormatError(f"{self.path}: {message}", path=self.path, **kw)

    def _need(self, n: int, what: str, **kw) -> int:
        """Check that ``n`` bytes can be read at the cursor; return the start and advance."""
        start = self.pos
        if n < 0 or start + n > self.size:
            raise self.fail(
                f"truncated at byte {self.size} while reading {what} at byte {start}: "
                f"expected {n} bytes, found {self.size - start}",
                expected=n, found=self.size - start, **kw)
        self.pos = start + n
        return start

    def remaining(self) -> int:
        return self.size - self.pos

    # -- primitive reads --

    def scalar(self, fmt: str, what: str, **kw):
        size = struct.calcsize("<" + fmt)
        start = self._need(size, what, **kw)
        return struct.unpack_from("<" + fmt, self.buf, start)[0]

    def u32(self, what: str, **kw) -> int:
        return self.scalar("I", what, **kw)

    def u64(self, what: str, **kw) -> int:
        return self.scalar("Q", what, **kw)

    def raw(self, n: int, what: str, **kw) -> bytes:
        start = self._need(n, what, **kw)
        return bytes(self.buf[start:start + n])

    def string(self, what: str, limit: int, **kw) -> str:
        """A GGUF string: u64 length then UTF-8 bytes. ``limit`` bounds the length before
        anything is read or allocated."""
        at = self.pos
        length = self.u64(f"the length of {what}", **kw)
        if length > limit:
            raise self.fail(f"{what} at byte {at} is {length} bytes long: expected at most "
                            f"{limit}", expected=limit, found=length, **kw)
        data = self.raw(length, what, **kw)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"{what} at byte {at} is not valid UTF-8 (bad byte at string "
                            f"offset {exc.start})", **kw) from None

    def value_type(self, what: str, **kw) -> GGUFValueType:
        at = self.pos
        raw = self.u32(what, **kw)
        vtype = _VALUE_TYPES.get(raw)
        if vtype is None:
            raise self.fail(f"unknown {what} {raw} at byte {at}: expected one of 0..12 "
                            f"(GGUFValueType)", expected="GGUFValueType", found=raw, **kw)
        return vtype

    # -- metadata values --

    def value(self, vtype: GGUFValueType, key: str, depth: int = 0) -> object:
        """Read one value of type ``vtype``; ``depth`` counts enclosing arrays."""
        kw = {"field": key}
        if vtype == GGUFValueType.STRING:
            return self.string(f"string value of {key!r}", MAX_STRING_LENGTH, **kw)
        if vtype == GGUFValueType.ARRAY:
            return self.array(key, depth + 1)[1]
        at = self.pos
        value = self.scalar(_SCALAR_FORMATS[vtype], f"{vtype.name} value of {key!r}", **kw)
        if vtype == GGUFValueType.BOOL:
            if value > 1:
                raise self.fail(f"BOOL value of {key!r} at byte {at}: expected 0 or 1, found "
                                f"{value}", expected="0 or 1", found=value, **kw)
            return bool(value)
        return value

    def array(self, key: str, depth: int) -> tuple[GGUFValueType, list]:
        """An array value: u32 element type, u64 count, elements; returns (element type,
        elements). Counts are checked against MAX_ARRAY_LENGTH and against the bytes left
        before the list is built."""
        kw = {"field": key}
        type_at = self.pos
        sub = self.value_type(f"array element type of {key!r}", **kw)
        # Refuse the nesting as soon as the element type declares it (even for an empty
        # array), before any recursion: depth is bounded without reading further.
        if sub == GGUFValueType.ARRAY and depth + 1 > MAX_ARRAY_DEPTH:
            raise self.fail(f"array {key!r} at byte {type_at} nests arrays {depth + 1} deep: "
                            f"expected at most {MAX_ARRAY_DEPTH}",
                            expected=MAX_ARRAY_DEPTH, found=depth + 1, **kw)
        at = self.pos
        count = self.u64(f"array length of {key!r}", **kw)
        if count > MAX_ARRAY_LENGTH:
            raise self.fail(f"array {key!r} at byte {at} has {count} elements: expected at most "
                            f"{MAX_ARRAY_LENGTH}", expected=MAX_ARRAY_LENGTH, found=count, **kw)
        min_size = _MIN_ELEMENT_SIZE[sub]
        if count * min_size > self.remaining():
            raise self.fail(
                f"truncated at byte {self.size} while reading array {key!r}: {count} "
                f"{sub.name} elements need at least {count * min_size} bytes from byte "
                f"{self.pos}, found {self.remaining()}",
                expected=count * min_size, found=self.remaining(), **kw)

        if sub in _SCALAR_FORMATS:
            # Fixed-size elements: one bounded read, one unpack (fast for big arrays).
            start = self._need(count * min_size, f"array {key!r}", **kw)
            if sub == GGUFValueType.BOOL:
                data = bytes(self.buf[start:start + count])
                if data.translate(None, b"\x00\x01"):
                    bad = next(i for i, b in enumerate(data) if b > 1)
                    raise self.fail(f"BOOL element {bad} of array {key!r} at byte {start + bad}: "
                                    f"expected 0 or 1, found {data[bad]}",
                                    expected="0 or 1", found=data[bad], **kw)
                return sub, [b == 1 for b in data]
            fmt = f"<{count}{_SCALAR_FORMATS[sub]}"
            return sub, list(struct.unpack_from(fmt, self.buf, start))
        # Strings and nested arrays: element by element, each read bounded on its own.
        return sub, [self.value(sub, key, depth) for _ in range(count)]

    # -- the file --

    def parse(self) -> GGUFFile:
        magic = self.raw(4, "the magic")
        if magic != struct.pack("<I", GGUF_MAGIC):
            raise self.fail(f"bad magic at byte 0: expected b'GGUF', found {magic!r}",
                            expected="GGUF", found=repr(magic))
        version = self.u32("the version")
        if version != SUPPORTED_VERSION:
            swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
            if version & 0xFFFF == 0 and 0 < swapped <= 0xFFFF:
                # A small number stored big-endian reads as N << 24 little-endian.
                raise self.fail(f"big-endian GGUF (version field reads {version:#010x}, i.e. "
                                f"{swapped} byte-swapped): only little-endian GGUF is supported",
                                expected="little-endian", found="big-endian")
            raise self.fail(f"unsupported GGUF version at byte 4: expected {SUPPORTED_VERSION}, "
                            f"found {version}", expected=SUPPORTED_VERSION, found=version)
        tensor_count = self.u64("the tensor count")
        kv_count = self.u64("the key/value count")
        self._check_count(tensor_count, MAX_TENSORS, _MIN_TENSOR_INFO_SIZE, "tensor count", 8)
        self._check_count(kv_count, MAX_KV_PAIRS, _MIN_KV_SIZE, "key/value count", 16)

        kv = self._read_kv(kv_count)
        alignment = self._alignment(kv)
        infos = self._read_tensor_infos(tensor_count)
        ti_end = self.pos
        data_start = _align_up(ti_end, alignment)
        tensors = self._place_tensors(infos, alignment, data_start, ti_end)
        return GGUFFile(path=Path(self.path), version=version, file_size=self.size,
                        alignment=alignment, kv=kv, tensors=tensors, data_start=data_start)

    def _check_count(self, count: int, limit: int, min_size: int, what: str, at: int) -> None:
        if count > limit:
            raise self.fail(f"{what} at byte {at} is {count}: expected at most {limit}",
                            expected=limit, found=count)
        # Cheap early refusal: the entries cannot fit in what is left of the file.
        if count * min_size > self.remaining():
            raise self.fail(f"truncated at byte {self.size}: {what} at byte {at} is {count}, "
                            f"which needs at least {count * min_size} bytes after byte "
                            f"{self.pos}, found {self.remaining()}",
                            expected=count * min_size, found=self.remaining())

    def _read_kv(self, count: int) -> dict[str, GGUFValue]:
        kv: dict[str, GGUFValue] = {}
        seen_at: dict[str, int] = {}  # key -> byte offset of its first occurrence
        for index in range(count):
            at = self.pos
            key = self.string(f"key of key/value pair {index}", MAX_KEY_LENGTH)
            if not key:
                raise self.fail(f"key of key/value pair {index} at byte {at} is empty: "
                                f"expected a non-empty key")
            if key in seen_at:
                raise self.fail(f"duplicate key {key!r} at byte {at}: expected unique keys, "
                                f"first seen at byte {seen_at[key]}", field=key,
                                expected="unique", found=key)
            seen_at[key] = at
            vtype = self.value_type(f"value type of {key!r}", field=key)
            if vtype == GGUFValueType.ARRAY:
                sub, value = self.array(key, 1)
                kv[key] = GGUFValue(type=vtype, value=value, sub_type=sub)
            else:
                kv[key] = GGUFValue(type=vtype, value=self.value(vtype, key))
        return kv

    def _alignment(self, kv: dict[str, GGUFValue]) -> int:
        entry = kv.get("general.alignment")
        if entry is None:
            return DEFAULT_ALIGNMENT
        if entry.type != GGUFValueType.UINT32:
            raise self.fail(f"general.alignment has type {entry.type.name}: expected UINT32",
                            field="general.alignment", expected="UINT32", found=entry.type.name)
        value = entry.value
        if value == 0 or value & (value - 1):
            raise self.fail(f"general.alignment is {value}: expected a non-zero power of two",
                            field="general.alignment", expected="power of two", found=value)
        return value

    def _read_tensor_infos(self, count: int) -> list[tuple[str, tuple[int, ...],
                                                           GGMLQuantizationType, int, int]]:
        infos = []
        seen_at: dict[str, int] = {}  # name -> byte offset of its first tensor info
        for index in range(count):
            at = self.pos
            name = self.string(f"name of tensor {index}", MAX_TENSOR_NAME_LENGTH)
            kw = {"tensor": name}
            if not name:
                raise self.fail(f"name of tensor {index} at byte {at} is empty: expected a "
                                f"non-empty name", **kw)
            if name in seen_at:
                raise self.fail(f"duplicate tensor name {name!r} at byte {at}: expected unique "
                                f"names, first seen at byte {seen_at[name]}",
                                expected="unique", found=name, **kw)
            seen_at[name] = at
            dims_at = self.pos
            n_dims = self.u32(f"n_dims of tensor {name!r}", **kw)
            if not 1 <= n_dims <= MAX_DIMS:
                raise self.fail(f"tensor {name!r} at byte {dims_at} has n_dims {n_dims}: "
                                f"expected 1..{MAX_DIMS}", expected=f"1..{MAX_DIMS}",
                                found=n_dims, **kw)
            shape = tuple(self.u64(f"dimension {d} of tensor {name!r}", **kw)
                          for d in range(n_dims))
            if any(d == 0 for d in shape):
                raise self.fail(f"tensor {name!r} has a zero dimension in shape {list(shape)}: "
                                f"expected every dimension >= 1", found=list(shape), **kw)
            type_at = self.pos
            raw_type = self.u32(f"ggml type of tensor {name!r}", **kw)
            ggml_type = _GGML_TYPES.get(raw_type)
            if ggml_type is None:
                raise self.fail(f"tensor {name!r} at byte {type_at} has unknown ggml type "
                                f"{raw_type}: expected a GGMLQuantizationType with known sizes",
                                expected="GGMLQuantizationType", found=raw_type, **kw)
            offset = self.u64(f"offset of tensor {name!r}", **kw)
            infos.append((name, shape, ggml_type, offset, at))
        return infos

    def _place_tensors(self, infos, alignment: int, data_start: int,
                       ti_end: int) -> tuple[GGUFTensorInfo, ...]:
        if not infos:
            # No data section to place. A writer may or may not pad the end of the tensor-info
            # table to the alignment, so the file may end anywhere from ti_end to data_start;
            # more than that is garbage.
            if self.size > data_start:
                raise self.fail(f"trailing garbage: {self.size - data_start} bytes after byte "
                                f"{data_start} in a file with no tensors",
                                expected=data_start, found=self.size)
            return ()
        if data_start > self.size:
            raise self.fail(f"truncated at byte {self.size}: the data section starts at byte "
                            f"{data_start} (tensor infos end at {ti_end}, alignment {alignment})",
                            expected=data_start, found=self.size)
        data_size = self.size - data_start
        tensors = []
        for name, shape, ggml_type, offset, _at in infos:
            kw = {"tensor": name}
            block_size, type_size = GGML_QUANT_SIZES[ggml_type]
            if shape[0] % block_size:
                raise self.fail(f"tensor {name!r}: ne0 {shape[0]} is not a multiple of the "
                                f"{ggml_type.name} block size {block_size}",
                                expected=f"multiple of {block_size}", found=shape[0], **kw)
            nelements = 1
            for d in shape:
                nelements *= d  # Python ints: no overflow; compared with the file size below
            nbytes = nelements // block_size * type_size
            if offset % alignment:
                raise self.fail(f"tensor {name!r} offset {offset} is not aligned to "
                                f"{alignment}", expected=f"multiple of {alignment}",
                                found=offset, **kw)
            if offset + nbytes > data_size:
                raise self.fail(f"tensor {name!r} spans bytes {data_start + offset}.."
                                f"{data_start + offset + nbytes} but the file ends at byte "
                                f"{self.size}", expected=data_start + offset + nbytes,
                                found=self.size, **kw)
            tensors.append(GGUFTensorInfo(name=name, shape=shape, ggml_type=ggml_type,
                                          offset=offset, data_offset=data_start + offset,
                                          nbytes=nbytes))

        # Spans sorted by offset must not overlap.
        ordered = sorted(tensors, key=lambda t: (t.offset, t.nbytes))
        for prev, cur in zip(ordered, ordered[1:]):
            if prev.offset + prev.nbytes > cur.offset:
                raise self.fail(f"tensor {cur.name!r} at data offset {cur.offset} overlaps "
                                f"tensor {prev.name!r} (data offset {prev.offset}, "
                                f"{prev.nbytes} bytes)", tensor=cur.name,
                                expected=prev.offset + prev.nbytes, found=cur.offset)

        # Padding after the last tensor up to the alignment is allowed (gguf-py pads every
        # tensor); anything beyond that is trailing garbage.
        last = max(tensors, key=lambda t: t.offset + t.nbytes)
        allowed_end = data_start + _align_up(last.offset + last.nbytes, alignment)
        if self.size > allowed_end:
            raise self.fail(f"trailing garbage: {self.size - allowed_end} bytes after byte "
                            f"{allowed_end}, the aligned end of the last tensor {last.name!r}",
                            expected=allowed_end, found=self.size)
        return tuple(tensors)


# --- public functions ----------------------------------------------------------------------

def parse_gguf_bytes(buf: bytes | memoryview, *, path: str = "<bytes>") -> GGUFFile:
    """Parse a whole GGUF file held in memory (bytes, a memoryview or an mmap).

    Returns the parsed header, metadata and tensor table, or raises GGUFFormatError; the
    tensor bytes are not copied (see :func:`tensor_data`)."""
    if isinstance(buf, memoryview) and (buf.format != "B" or buf.ndim != 1):
        buf = buf.cast("B")
    return _Parser(buf, str(path)).parse()


def read_gguf(path: str | os.PathLike) -> GGUFFile:
    """Parse the GGUF file at ``path``. The file is mapped, not read: only the header pages
    are touched. Raises GGUFFormatError (also for a file that cannot be opened or read).

    Like any mmap reader this assumes nobody truncates the file while it is being parsed
    (the OS would signal SIGBUS on access past the new end)."""
    name = os.fspath(path)
    try:
        # Refuse directories, FIFOs and devices before opening: opening a FIFO would block
        # and a device has no meaningful size.
        if not stat.S_ISREG(os.stat(name).st_mode):
            raise GGUFFormatError(f"{name}: not a regular file", path=name)
        with open(name, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size == 0:
                # mmap refuses empty files; the parser reports the truncation.
                return parse_gguf_bytes(b"", path=name)
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                # The parser never keeps a view of the map, so the map closes cleanly even
                # when parsing raises.
                return _Parser(mm, name).parse()
    except OSError as exc:
        raise GGUFFormatError(f"{name}: cannot read the file: {exc.strerror or exc}",
                              path=name) from None


def tensor_data(gguf: GGUFFile, info: GGUFTensorInfo, mm) -> memoryview:
    """The bytes of one tensor: a zero-copy slice of ``mm`` (an mmap or bytes holding the
    whole file that ``gguf`` was parsed from). The caller must release the view before
    closing an mmap."""
    view = memoryview(mm)
    if len(view) != gguf.file_size:
        size = len(view)
        view.release()
        raise GGUFFormatError(f"{gguf.path}: the buffer holds {size} bytes, expected the "
                              f"{gguf.file_size} bytes that were parsed",
                              path=str(gguf.path), tensor=info.name,
                              expected=gguf.file_size, found=size)
    end = info.data_offset + info.nbytes
    if info.data_offset < gguf.data_start or end > gguf.file_size:
        view.release()
        raise GGUFFormatError(f"{gguf.path}: tensor {info.name!r} spans bytes "
                              f"{info.data_offset}..{end}, outside the data section "
                              f"{gguf.data_start}..{gguf.file_size}", path=str(gguf.path),
                              tensor=info.name)
    return view[info.data_offset:end]
