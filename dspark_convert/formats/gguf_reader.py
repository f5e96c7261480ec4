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

Memory is bounded by the file's declared sizes, not by the Python objects its metadata
could become: every decoded key, value and tensor info is charged (at its Python size) to
one budget per file, MAX_DECODED_BYTES, and a long array of fixed-size scalars is kept
packed (a :class:`GGUFArray`, one byte per UINT8 element) instead of a list of Python
objects. The file is read, not mapped: in small windows for the header, in one read for a
long array, so that a file that shrinks while it is parsed is refused (a mapped page past
the new end would kill the process with SIGBUS), and so that a process under an address
space limit does not pay for the whole file.

Limits (each a module constant; a refusal names the key or tensor)::

    MAX_TENSORS              65536      tensor infos in one file
    MAX_KV_PAIRS             65536      metadata key/value pairs
    MAX_KEY_LENGTH           65535 B    one key (the GGUF spec's own cap)
    MAX_TENSOR_NAME_LENGTH   65535 B    one tensor name
    MAX_STRING_LENGTH        16 MiB     one string value
    MAX_ARRAY_LENGTH         1 Mi       elements of one array
    MAX_ARRAY_DEPTH          2          array nesting
    MAX_ARRAYS               65536      arrays in one file, nested ones included
    MAX_DIMS                 4          dimensions of a tensor (GGML_MAX_DIMS)
    MAX_LIST_LENGTH          65536      scalar arrays up to this are lists, longer GGUFArray
    MAX_DECODED_BYTES        64 MiB     everything decoded from one file, as Python objects

Every count and length is also checked against the bytes left in the file first.

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

import array
import os
import stat
import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gguf.constants import GGML_QUANT_SIZES, GGUF_MAGIC, GGMLQuantizationType, GGUFValueType

from dspark_convert.errors import GGUFFormatError

__all__ = [
    "GGUFValue", "GGUFArray", "GGUFTensorInfo", "GGUFFile", "read_gguf", "parse_gguf_bytes",
    "tensor_data", "SUPPORTED_VERSION", "DEFAULT_ALIGNMENT", "STRICT_ALIGNMENT_TYPES",
    "ANY_INTEGER_ALIGNMENT", "MAX_TENSORS", "MAX_KV_PAIRS",
    "MAX_KEY_LENGTH", "MAX_TENSOR_NAME_LENGTH", "MAX_STRING_LENGTH", "MAX_ARRAY_LENGTH",
    "MAX_ARRAY_DEPTH", "MAX_ARRAYS", "MAX_DIMS", "MAX_LIST_LENGTH", "MAX_DECODED_BYTES",
]

# --- limits ----------------------------------------------------------------------------------

#: The only GGUF version we read (and write). v1/v2 differ in field widths.
SUPPORTED_VERSION = 3

#: The GGUF types general.alignment may have. gguf-py's GGUFReader ("Bad type for
#: general.alignment field") and llama.cpp's gguf_init_from_file ("key 'general.alignment'
#: must be of type u32") take UINT32 only: the default. Strata's tools/dflash_quantize.py
#: re-adds it as a Python int, which its writer stores as INT64; a bare file's check reads
#: any integer type (the alignment is its value either way) and reports the engines' rule.
STRICT_ALIGNMENT_TYPES = frozenset({GGUFValueType.UINT32})
ANY_INTEGER_ALIGNMENT = frozenset({GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16,
                                   GGUFValueType.INT16, GGUFValueType.UINT32, GGUFValueType.INT32,
                                   GGUFValueType.UINT64, GGUFValueType.INT64})

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

#: Most elements in one metadata array (1M: four times a 256k-token vocabulary, more than
#: twice the merges of the largest BPE vocabularies). It also bounds what a caller makes of
#: an array (``list(value)`` of 1M values is 8 MB of slots; of 16M it was 128 MB). In
#: addition, the count may never exceed what the remaining bytes could hold at the element
#: type's minimum encoded size, so no list is ever sized by a lie.
MAX_ARRAY_LENGTH = 1024 * 1024

#: Array nesting depth: an array (depth 1) may hold arrays (depth 2) but those may not hold
#: arrays again. gguf-py can write one level of nesting; nothing real uses more, and
#: unbounded nesting would let a small file drive deep recursion.
MAX_ARRAY_DEPTH = 2

#: Most dimensions of a tensor (GGML_MAX_DIMS in ggml.h; gguf-py does not export it).
MAX_DIMS = 4

#: Most arrays in one file, nested ones included. A real model's GGUF holds about ten; each
#: takes a few microseconds to decode however short it is, so this bounds the time that
#: millions of one-element nested arrays (13 bytes each) would take.
MAX_ARRAYS = 65536

#: Longest array of fixed-size scalars returned as a Python list; a longer one is a
#: :class:`GGUFArray` holding the packed values (a list costs 8 bytes a slot plus an object
#: per value, 8 to 40 times the file's bytes). Every array a drafter's metadata holds is far
#: shorter, so callers comparing values with lists see lists.
MAX_LIST_LENGTH = 65536

#: Most memory the decoded keys, values and tensor infos of one file may take as Python
#: objects: strings at their real size, lists at 8 bytes a slot plus an object per value,
#: packed arrays at their bytes. A drafter's metadata takes a few KiB; the whole metadata of
#: a full model (a 128k-256k-token vocabulary with its merges, scores and token types) takes
#: about 20-30 MiB. Without it, 100 MB of two-character strings or of empty nested arrays
#: grew to 700-850 MB and took 40-80 s before any check saw them (and 65536 keys of
#: MAX_ARRAY_LENGTH bytes each would still be 64 GiB of lists).
MAX_DECODED_BYTES = 64 * 1024 * 1024

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
_SCALAR_STRUCTS = {t: struct.Struct("<" + f) for t, f in _SCALAR_FORMATS.items()}
_SCALAR_SIZES = {t: packer.size for t, packer in _SCALAR_STRUCTS.items()}
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")

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


def _array_typecode(fmt: str) -> str:
    """The ``array`` module typecode holding struct format ``fmt`` at the same size (the C
    sizes of 'I'/'L' differ between platforms, so pick by size, not by letter)."""
    size = struct.calcsize("<" + fmt)
    candidates = {"B": "B", "b": "b", "H": "H", "h": "h", "I": "IL", "i": "il", "Q": "QL",
                  "q": "ql", "f": "f", "d": "d"}[fmt]
    return next(c for c in candidates if array.array(c).itemsize == size)


# array typecode of each fixed-size element type (BOOL is stored as its 0/1 bytes).
_ARRAY_TYPECODES = {t: _array_typecode(f) for t, f in _SCALAR_FORMATS.items()}

# What the decoded values cost in memory, for MAX_DECODED_BYTES (CPython 3, 64-bit; upper
# bounds where objects may be shared, such as small ints and bools).
_OBJECT_COST = 32          # an int or float object
_LIST_COST = 56            # an empty list; each element adds a slot
_SLOT_COST = 8
_ENTRY_COST = 200          # a GGUFValue or GGUFTensorInfo, its dict slot or tuple and shape


# --- public data ---------------------------------------------------------------------------

class GGUFArray(Sequence):
    """A metadata array of more than MAX_LIST_LENGTH fixed-size scalars, kept packed (an
    ``array.array``; BOOL as its 0/1 bytes) instead of as a list of Python objects. It reads
    like a tuple of the values: ``len``, indexing (bools for a BOOL array), iteration, and
    ``==`` with another GGUFArray or element by element with a list or tuple. Its repr is
    short, so an error message that shows a value stays one short line."""

    __slots__ = ("element_type", "data")

    def __init__(self, element_type: GGUFValueType, data: array.array):
        self.element_type = element_type
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return list(self._values(self.data[index]))
        value = self.data[index]
        return bool(value) if self.element_type == GGUFValueType.BOOL else value

    def __iter__(self):
        return self._values(self.data)

    def _values(self, data):
        return map(bool, data) if self.element_type == GGUFValueType.BOOL else iter(data)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, GGUFArray):
            return self.element_type == other.element_type and self.data == other.data
        if isinstance(other, (list, tuple)):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # mutable-looking like a list; never a dict key

    def __repr__(self) -> str:
        return f"<GGUF array of {len(self)} {self.element_type.name}>"

    def tobytes(self) -> bytes:
        """The values as the file stores them (little-endian)."""
        if sys.byteorder == "big" and self.data.itemsize > 1:
            swapped = array.array(self.data.typecode, self.data)
            swapped.byteswap()
            return swapped.tobytes()
        return self.data.tobytes()


@dataclass(frozen=True)
class GGUFValue:
    """One metadata value. ``value`` is a Python int, float, bool, str or list (nested lists
    for arrays of arrays), or a :class:`GGUFArray` for an array of more than MAX_LIST_LENGTH
    fixed-size scalars; ``sub_type`` is the element type of an array, else None."""

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
    # Bytes as stored: each key/value pair, and the header up to the end of the tensor-info
    # table (before the padding), so that a caller can size a file with other keys
    # (validate: a quantized artifact's BF16 parent is this header less two pairs).
    kv_nbytes: dict[str, int] = field(default_factory=dict)
    header_nbytes: int = 0


# --- the parser ----------------------------------------------------------------------------

def _align_up(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


class _Shrank(Exception):
    """The file ended before its size at open: it shrank while it was parsed."""


class _BufferSource:
    """Reads of a whole file held in memory: bytes, a byte memoryview or an mmap. Reads are
    copied out (bytes), so no view of the caller's buffer outlives a read and a caller's
    mmap can be closed as soon as we return (or raise)."""

    def __init__(self, buf):
        self.buf = buf
        self.size = len(buf)

    def read(self, offset: int, n: int) -> bytes:
        return bytes(self.buf[offset:offset + n])

    def read_into(self, offset: int, view: memoryview) -> None:
        view[:] = self.buf[offset:offset + len(view)]


class _FileSource:
    """Reads of an open file at absolute offsets (``os.pread``), never past ``size`` (its
    size at open, which the parser's bounds use). Small reads are served from a window of
    WINDOW bytes (the parser reads in file order); a large one goes to its own buffer. A
    read that finds fewer bytes than the size promised raises _Shrank."""

    WINDOW = 1 << 20

    def __init__(self, fd: int, size: int):
        self.fd = fd
        self.size = size
        self.window = b""
        self.window_start = 0

    def _pread(self, offset: int, n: int, need: int) -> bytes:
        """Up to ``n`` bytes at ``offset`` (fewer only at the end of the file); _Shrank when
        fewer than ``need`` are there."""
        parts, got = [], 0
        while got < n:
            part = os.pread(self.fd, n - got, offset + got)
            if not part:
                break
            parts.append(part)
            got += len(part)
        if got < need:
            raise _Shrank()
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def read(self, offset: int, n: int) -> bytes:
        if n > self.WINDOW:
            return self._pread(offset, n, n)
        start = offset - self.window_start
        if start < 0 or start + n > len(self.window):
            self.window_start, start = offset, 0
            self.window = self._pread(offset, min(self.WINDOW, self.size - offset), n)
        return self.window[start:start + n]

    def read_into(self, offset: int, view: memoryview) -> None:
        done = 0
        while done < len(view):
            n = os.preadv(self.fd, [view[done:]], offset + done)
            if not n:
                raise _Shrank()
            done += n


def _text(what) -> str:
    """A read's description: a string, or a callable that builds it (so that the hot path
    of a long array formats nothing unless a read fails)."""
    return what() if callable(what) else what


class _Parser:
    """A cursor over the file. Every read goes through :meth:`_take`, which refuses to read
    past the end; every failure goes through :meth:`fail`, which names the file; everything
    decoded is charged to the file's MAX_DECODED_BYTES through :meth:`charge`."""

    def __init__(self, source, path: str, alignment_types: frozenset = frozenset()):
        self.source = source
        self.size = source.size
        self.path = path
        self.alignment_types = alignment_types or STRICT_ALIGNMENT_TYPES
        self.pos = 0
        self.decoded = 0
        self.arrays = 0

    # -- errors and bounds --

    def fail(self, message: str, **kw) -> GGUFFormatError:
        """Build (the caller raises) a GGUFFormatError whose message starts with the file."""
        return GGUFFormatError(f"{self.path}: {message}", path=self.path, **kw)

    def _need(self, n: int, what, **kw) -> int:
        """Check that ``n`` bytes can be read at the cursor; return the start and advance."""
        start = self.pos
        if n < 0 or start + n > self.size:
            raise self.fail(
                f"truncated at byte {self.size} while reading {_text(what)} at byte {start}: "
                f"expected {n} bytes, found {self.size - start}",
                expected=n, found=self.size - start, **kw)
        self.pos = start + n
        return start

    def _take(self, n: int, what, **kw) -> bytes:
        """The next ``n`` bytes, bounds-checked; the cursor moves past them."""
        start = self._need(n, what, **kw)
        try:
            return self.source.read(start, n)
        except _Shrank:
            raise self._shrank(start, what, **kw) from None

    def _shrank(self, start: int, what, **kw) -> GGUFFormatError:
        return self.fail(f"the file shrank while {_text(what)} at byte {start} was read: "
                         f"expected {self.size} bytes, its size when opened",
                         expected=self.size, found="fewer bytes", **kw)

    def remaining(self) -> int:
        return self.size - self.pos

    def charge(self, nbytes: int, what, **kw) -> None:
        """Count ``nbytes`` of decoded Python objects against MAX_DECODED_BYTES: before a
        list or packed array is allocated, once a string is decoded."""
        self.decoded += nbytes
        if self.decoded > MAX_DECODED_BYTES:
            raise self.fail(f"{_text(what)} at byte {self.pos} brings the decoded metadata to "
                            f"{self.decoded} bytes in memory: expected at most "
                            f"{MAX_DECODED_BYTES} for the whole file",
                            expected=MAX_DECODED_BYTES, found=self.decoded, **kw)

    # -- primitive reads --

    def scalar(self, vtype: GGUFValueType, what, **kw):
        packer = _SCALAR_STRUCTS[vtype]
        return packer.unpack(self._take(packer.size, what, **kw))[0]

    def u32(self, what, **kw) -> int:
        return _U32.unpack(self._take(4, what, **kw))[0]

    def u64(self, what, **kw) -> int:
        return _U64.unpack(self._take(8, what, **kw))[0]

    def string(self, what, limit: int, **kw) -> str:
        """A GGUF string: u64 length then UTF-8 bytes. ``limit`` bounds the length before
        anything is read or allocated; the decoded string is charged at its real size
        (1, 2 or 4 bytes a character, whichever its widest one needs)."""
        at = self.pos
        length = self.u64(lambda: f"the length of {_text(what)}", **kw)
        if length > limit:
            raise self.fail(f"{_text(what)} at byte {at} is {length} bytes long: expected at "
                            f"most {limit}", expected=limit, found=length, **kw)
        data = self._take(length, what, **kw)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"{_text(what)} at byte {at} is not valid UTF-8 (bad byte at "
                            f"string offset {exc.start})", **kw) from None
        self.charge(sys.getsizeof(text), what, **kw)
        return text

    def value_type(self, what, **kw) -> GGUFValueType:
        at = self.pos
        raw = self.u32(what, **kw)
        vtype = _VALUE_TYPES.get(raw)
        if vtype is None:
            raise self.fail(f"unknown {_text(what)} {raw} at byte {at}: expected one of 0..12 "
                            f"(GGUFValueType)", expected="GGUFValueType", found=raw, **kw)
        return vtype

    # -- metadata values --

    def value(self, vtype: GGUFValueType, key: str) -> object:
        """Read the value of key/value pair ``key``, of type ``vtype`` (not an array)."""
        kw = {"field": key}
        if vtype == GGUFValueType.STRING:
            return self.string(f"string value of {key!r}", MAX_STRING_LENGTH, **kw)
        at = self.pos
        what = f"{vtype.name} value of {key!r}"
        value = self.scalar(vtype, what, **kw)
        self.charge(_OBJECT_COST, what, **kw)
        if vtype == GGUFValueType.BOOL:
            if value > 1:
                raise self.fail(f"BOOL value of {key!r} at byte {at}: expected 0 or 1, found "
                                f"{value}", expected="0 or 1", found=value, **kw)
            return bool(value)
        return value

    def array(self, key: str, depth: int, prepaid: bool = False
              ) -> tuple[GGUFValueType, list | GGUFArray]:
        """An array value: u32 element type, u64 count, elements; returns (element type,
        elements: a list, or a GGUFArray for more than MAX_LIST_LENGTH fixed-size scalars).
        Counts are checked against MAX_ARRAY_LENGTH and against the bytes left, and the
        memory the elements take against MAX_DECODED_BYTES, before they are read.
        ``prepaid``: the enclosing array has already counted this one and charged its empty
        list."""
        kw = {"field": key}
        type_at = self.pos
        if not prepaid:
            self._count_arrays(1, type_at, key)
        # Descriptions are built only if a read fails: an array of arrays runs this for
        # each element.
        sub = self.value_type(lambda: f"array element type of {key!r}", **kw)
        # Refuse the nesting as soon as the element type declares it (even for an empty
        # array), before any recursion: depth is bounded without reading further.
        if sub == GGUFValueType.ARRAY and depth + 1 > MAX_ARRAY_DEPTH:
            raise self.fail(f"array {key!r} at byte {type_at} nests arrays {depth + 1} deep: "
                            f"expected at most {MAX_ARRAY_DEPTH}",
                            expected=MAX_ARRAY_DEPTH, found=depth + 1, **kw)
        at = self.pos
        count = self.u64(lambda: f"array length of {key!r}", **kw)
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

        def what() -> str:
            return f"array {key!r}"

        own = 0 if prepaid else _LIST_COST
        if sub in _SCALAR_FORMATS:
            if count > MAX_LIST_LENGTH:
                self.charge(own + count * _SCALAR_SIZES[sub], what, **kw)
                return sub, GGUFArray(sub, self._packed(sub, count, what, **kw))
            # A short one: the same packed read, then a list of Python values.
            self.charge(own + count * (_SLOT_COST + _OBJECT_COST), what, **kw)
            values = self._packed(sub, count, what, **kw)
            if sub == GGUFValueType.BOOL:
                return sub, [b == 1 for b in values]
            return sub, values.tolist()
        if sub == GGUFValueType.STRING:
            # Each string is charged when decoded; the list's slots now.
            self.charge(own + count * _SLOT_COST, what, **kw)
            return sub, self._strings(count, lambda: f"string element of array {key!r}", key)
        # Nested arrays: each is at least an empty list, counted and charged here for all
        # of them, so that millions of empty arrays are refused before one is read.
        self._count_arrays(count, at, key)
        self.charge(own + count * (_SLOT_COST + _LIST_COST), what, **kw)
        return sub, [self.array(key, depth + 1, prepaid=True)[1] for _ in range(count)]

    def _count_arrays(self, n: int, at: int, key: str) -> None:
        """Count ``n`` more arrays against MAX_ARRAYS."""
        self.arrays += n
        if self.arrays > MAX_ARRAYS:
            raise self.fail(f"array {key!r} at byte {at} brings the arrays in the file to "
                            f"{self.arrays}: expected at most {MAX_ARRAYS}, nested ones "
                            f"included", expected=MAX_ARRAYS, found=self.arrays, field=key)

    def _strings(self, count: int, what, key: str) -> list[str]:
        """``count`` strings: :meth:`string` unrolled (the same checks, in the same order),
        since a vocabulary holds 10^5 of them and each call of the general path costs."""
        out: list[str] = []
        append, read, size, unpack = out.append, self.source.read, self.size, _U64.unpack
        try:
            for _ in range(count):
                at = self.pos
                if at + 8 > size:
                    return [self.string(what, MAX_STRING_LENGTH, field=key)]  # raises
                (length,) = unpack(read(at, 8))
                if length > MAX_STRING_LENGTH or at + 8 + length > size:
                    return [self.string(what, MAX_STRING_LENGTH, field=key)]  # raises
                try:
                    text = read(at + 8, length).decode("utf-8")
                except UnicodeDecodeError:
                    return [self.string(what, MAX_STRING_LENGTH, field=key)]  # raises
                self.pos = at + 8 + length
                self.decoded += sys.getsizeof(text)
                if self.decoded > MAX_DECODED_BYTES:
                    self.charge(0, what, field=key)  # raises
                append(text)
        except _Shrank:
            raise self._shrank(self.pos, what, field=key) from None
        return out

    def _packed(self, sub: GGUFValueType, count: int, what, **kw) -> array.array:
        """``count`` fixed-size elements read straight into a packed array (already
        charged)."""
        start = self._need(count * _SCALAR_SIZES[sub], what, **kw)
        data = array.array(_ARRAY_TYPECODES[sub], [0]) * count   # one zeroed allocation
        try:
            with memoryview(data) as view, view.cast("B") as octets:
                self.source.read_into(start, octets)
        except _Shrank:
            raise self._shrank(start, what, **kw) from None
        if sys.byteorder == "big" and data.itemsize > 1:
            data.byteswap()
        if sub == GGUFValueType.BOOL:
            self._check_bools(data.tobytes(), start, kw["field"])
        return data

    def _check_bools(self, data: bytes, start: int, key: str) -> None:
        if data.translate(None, b"\x00\x01"):
            bad = next(i for i, b in enumerate(data) if b > 1)
            raise self.fail(f"BOOL element {bad} of array {key!r} at byte {start + bad}: "
                            f"expected 0 or 1, found {data[bad]}",
                            expected="0 or 1", found=data[bad], field=key)

    # -- the file --

    def parse(self) -> GGUFFile:
        magic = self._take(4, "the magic")
        if magic != struct.pack("<I", GGUF_MAGIC):
            raise self.fail(f"bad magic at byte 0: expected b'GGUF', found {magic!r}: not a "
                            "GGUF file",
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
                        alignment=alignment, kv=kv, tensors=tensors, data_start=data_start,
                        kv_nbytes=self.kv_nbytes, header_nbytes=ti_end)

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
        self.kv_nbytes: dict[str, int] = {}
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
            self.charge(_ENTRY_COST, f"key/value pair {key!r}", field=key)
            vtype = self.value_type(f"value type of {key!r}", field=key)
            if vtype == GGUFValueType.ARRAY:
                sub, value = self.array(key, 1)
                kv[key] = GGUFValue(type=vtype, value=value, sub_type=sub)
            else:
                kv[key] = GGUFValue(type=vtype, value=self.value(vtype, key))
            self.kv_nbytes[key] = self.pos - at
        return kv

    def _alignment(self, kv: dict[str, GGUFValue]) -> int:
        entry = kv.get("general.alignment")
        if entry is None:
            return DEFAULT_ALIGNMENT
        if entry.type not in self.alignment_types:
            want = " or ".join(sorted(t.name for t in self.alignment_types))
            raise self.fail(f"general.alignment has type {entry.type.name}: expected {want}",
                            field="general.alignment", expected=want, found=entry.type.name)
        value = entry.value
        if value <= 0 or value & (value - 1):
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
            self.charge(_ENTRY_COST, f"tensor info {name!r}", **kw)
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

def parse_gguf_bytes(buf: bytes | memoryview, *, path: str = "<bytes>",
                     alignment_types: frozenset = STRICT_ALIGNMENT_TYPES) -> GGUFFile:
    """Parse a whole GGUF file held in memory (bytes, a memoryview or an mmap).

    Returns the parsed header, metadata and tensor table, or raises GGUFFormatError; the
    tensor bytes are not copied (see :func:`tensor_data`). ``alignment_types``: as for
    :func:`read_gguf`."""
    if isinstance(buf, memoryview) and (buf.format != "B" or buf.ndim != 1):
        buf = buf.cast("B")
    return _Parser(_BufferSource(buf), str(path), alignment_types).parse()


def read_gguf(path: str | os.PathLike, *,
              alignment_types: frozenset = STRICT_ALIGNMENT_TYPES) -> GGUFFile:
    """Parse the GGUF file at ``path``. Only the header (metadata and tensor infos) is read,
    not the tensor data. Raises GGUFFormatError (also for a file that cannot be opened or
    read, and for one that shrinks while it is parsed). ``alignment_types``: the GGUF types
    ``general.alignment`` may have: UINT32 (STRICT_ALIGNMENT_TYPES, gguf-py's and llama.cpp's
    rule, the default), or any integer type (ANY_INTEGER_ALIGNMENT, for a file another tool
    wrote: Strata's quantizer writes it INT64; the value is read the same)."""
    name = os.fspath(path)
    try:
        # Refuse directories, FIFOs and devices before opening: opening a FIFO would block
        # and a device has no meaningful size.
        if not stat.S_ISREG(os.stat(name).st_mode):
            raise GGUFFormatError(f"{name}: not a regular file", path=name)
        with open(name, "rb") as fh:
            # The size the bounds are checked against: what fstat says at open.
            size = os.fstat(fh.fileno()).st_size
            return _Parser(_FileSource(fh.fileno(), size), name, alignment_types).parse()
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
