"""Strict reading of a source checkpoint's layout and safetensors headers.

This module finds a checkpoint's files (``locate_checkpoint``), parses every safetensors
header (``read_safetensors_header``) and checks a sharded index against the headers
(``read_checkpoint``). It never reads a tensor's bytes: it only returns, for each tensor,
the absolute byte range ``[begin, end)`` in its file, which later stages map with ``mmap``.

Why our own parser instead of the ``safetensors`` library:

* This is a release gate. Every refusal must be a one-line message naming the file, the
  tensor or field, what was expected and what was found, carried by one of our error
  classes (``errors.py``). The library raises a generic ``SafetensorError`` whose text is
  neither stable nor precise enough for that.
* The library (0.8) tolerates things we refuse: duplicate JSON keys (the last one silently
  wins), unknown keys in a tensor entry, ``"__metadata__": null``, dtypes newer than the
  ones we list. A header that two readers could interpret differently must not pass.
  (Python's own ``json`` is laxer still: NaN, lone surrogates; we refuse those too.)
  Property tests check the other direction: every file we accept, the library accepts
  and reads as the same tensors.
* Its numpy frontend cannot represent BF16, the dtype of every released drafter, and we do
  not want torch in the conversion path just to reach bytes. So the converter reads the raw
  bytes itself by mmap, and that is only safe once the offsets have been proven in range,
  sorted, contiguous and covering the data section exactly, which is what this module does
  before any tensor byte is touched.

Memory stays bounded by the declared sizes, not by the Python objects a header could make
``json`` build: the header is at most MAX_HEADER_BYTES, and before it is parsed the
characters that open a JSON value (``{``, ``[`` and ``,``: every value and key follows one)
are counted against MAX_HEADER_ITEMS (MAX_INDEX_ITEMS for an index), so a header of
millions of empty tensors or empty arrays is refused in a fraction of a second instead of
growing to gigabytes; the text it decodes to is bounded by MAX_HEADER_TEXT_BYTES. A header
may then hold at most MAX_HEADER_TENSORS tensors.

Pickle files (``*.bin``, ``*.pt``, ``*.pth``, ``*.pkl``, ``*.pickle``, ``*.ckpt``) are
never opened: unpickling runs arbitrary code. They are only listed as ``ignored``.
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from dspark_convert.errors import SafetensorsFormatError, SourceLayoutError, SourceNotFoundError
from dspark_convert.util.paths import file_kind
from dspark_convert.util.hashing import read_full
from dspark_convert.util.strict_json import DuplicateKeyError, json_error_text, loads_strict

__all__ = [
    "MAX_HEADER_BYTES",
    "MAX_HEADER_TENSORS",
    "MAX_HEADER_ITEMS",
    "MAX_INDEX_ITEMS",
    "MAX_HEADER_TEXT_BYTES",
    "json_items",
    "DTYPE_SIZES",
    "TensorEntry",
    "SafetensorsHeader",
    "read_safetensors_header",
    "CheckpointFiles",
    "locate_checkpoint",
    "read_index",
    "Checkpoint",
    "read_checkpoint",
]

# The safetensors library refuses headers above MAX_HEADER_SIZE = 100_000_000 bytes (decimal
# 100 MB, not 100 MiB: checked against safetensors 0.8, which accepts 100_000_000 and refuses
# 100_000_001). We use the same cap so that we never accept a file the library refuses, any
# file it writes passes here, and a hostile length cannot make us allocate gigabytes.
MAX_HEADER_BYTES = 100_000_000

# Most tensors in one safetensors file. The largest real checkpoints hold about 10^4 tensors
# per shard (a drafter a few dozen, a Qwen3 dense target under a thousand); 65536 is the
# GGUF reader's MAX_TENSORS too. The library has no such cap: a header of two million
# empty tensors (95 MB, under the byte cap) is a valid file to it, and would otherwise cost
# us gigabytes of Python objects before the inventory refuses it.
MAX_HEADER_TENSORS = 65536

# Most '{', '[' and ',' characters in a header, counted on the raw bytes before json parses
# them (those inside strings count too: an upper bound). Each JSON value and key follows one
# of these characters, so this bounds the objects json can build (an empty array or object
# costs ~60 bytes, 20-30 times its text) whatever their shape. A tensor entry takes 6 plus
# its number of dimensions; 16 per tensor leaves room for shapes of up to 8 dimensions, for
# metadata, and for commas inside names.
MAX_HEADER_ITEMS = 16 * MAX_HEADER_TENSORS

# The same bound for model.safetensors.index.json, whose weight_map takes one comma per
# tensor of the whole checkpoint: the largest real indexes (MoE models with per-expert
# tensors) list about 10^5 tensors.
MAX_INDEX_ITEMS = 2**18

# Most memory the header (or index) text may take once decoded. CPython stores a string at
# 1, 2 or 4 bytes per character, whichever its widest character needs, so 95 MB of ASCII
# holding one emoji decodes to 380 MB, and json then copies the long string out of it. The
# bound is checked before decoding, from the UTF-8 lead bytes present; an ASCII or Latin-1
# header always passes (it is at most MAX_HEADER_BYTES).
MAX_HEADER_TEXT_BYTES = MAX_HEADER_BYTES
# UTF-8 lead bytes by the storage width of the character they start: C4..EF start U+0100..
# U+FFFF (2 bytes), F0..FF characters beyond U+FFFF (4 bytes; F5..FF are invalid and refused
# by the decoder anyway). Everything else (ASCII, continuation bytes, C0..C3) is 0.
_WIDTH_OF_BYTE = bytes(4 if b >= 0xF0 else 2 if b >= 0xC4 else 0 for b in range(256))
_WIDTH_SCAN_CHUNK = 1 << 20

# Bytes per element for each dtype name the safetensors format defines and we accept.
# Newer sub-byte / exotic dtypes (F4, F6_*, E8M0, C64) are refused as unknown: no DSpark
# checkpoint uses them and we cannot size them the same way.
DTYPE_SIZES: dict[str, int] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}

CONFIG_NAME = "config.json"
SINGLE_WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
SAFETENSORS_SUFFIX = ".safetensors"

# The keys every tensor entry must have, no more and no fewer.
_ENTRY_KEYS = frozenset({"dtype", "shape", "data_offsets"})
# An index is a small JSON file; the cap only stops a hostile one from exhausting memory.
_MAX_INDEX_BYTES = MAX_HEADER_BYTES
# Messages quote values from untrusted files: keep them short and on one line.
_MAX_QUOTE = 120


# --------------------------------------------------------------------------------------------
# Data model
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a safetensors file: where its bytes are, not the bytes themselves."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: Path  # the shard holding it
    begin: int  # absolute byte offset in the file (8 + header_len + data_offsets[0])
    end: int  # absolute end offset (exclusive)

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class SafetensorsHeader:
    path: Path
    file_size: int
    header_len: int  # N, the length of the JSON header
    data_start: int  # 8 + N: where the data section begins
    metadata: dict[str, str]  # the __metadata__ object, or {}
    tensors: tuple[TensorEntry, ...]  # sorted by begin


@dataclass(frozen=True)
class CheckpointFiles:
    directory: Path
    config: Path  # config.json
    weights: tuple[Path, ...]  # model.safetensors, or the index's shards sorted by name
    index: Path | None  # model.safetensors.index.json when sharded
    ignored: tuple[str, ...]  # names present but deliberately not opened


@dataclass(frozen=True)
class Checkpoint:
    files: CheckpointFiles
    headers: tuple[SafetensorsHeader, ...]  # one per weights file, same order
    tensors: dict[str, TensorEntry]  # every tensor by name, sorted by name


# --------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------

def _quote(value: object) -> str:
    """An untrusted value for a one-line message, cut short. Strings by repr() (readable,
    and control characters or lone surrogates come out escaped); other values as JSON, the
    way the header spelled them (true, null)."""
    if isinstance(value, str):
        text = repr(value)
    else:
        try:
            text = json.dumps(value, ensure_ascii=True)
        except (TypeError, ValueError, RecursionError):
            text = f"<{_json_kind(value)}>"
    if len(text) > _MAX_QUOTE:
        text = text[: _MAX_QUOTE - 3] + "..."
    return text


def _short(name: str) -> str:
    """A tensor name for the ``tensor=`` attribute, bounded like the message."""
    return name if len(name) <= _MAX_QUOTE else name[: _MAX_QUOTE - 3] + "..."


def _json_kind(value: object) -> str:
    """What a decoded JSON value is, in JSON's words, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _is_int(value: object) -> bool:
    # JSON true/false decode to bool, a subclass of int: a shape of [true] is not valid.
    return type(value) is int


def _has_surrogates(text: str) -> bool:
    # json.loads decodes "\ud800" to a lone surrogate, which is not Unicode text and which
    # the reference (Rust) reader refuses; it would also break printing the name later.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _stat_regular_file(path: Path) -> os.stat_result:
    """stat() a file we are about to open, refusing anything that is not a regular file
    (opening a FIFO would block forever, a directory cannot be parsed)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise SourceNotFoundError(f"{path}: file not found", path=str(path),
                                  expected="a regular file", found="nothing") from None
    except OSError as exc:
        raise SourceNotFoundError(f"{path}: cannot stat: {exc.strerror}", path=str(path),
                                  expected="a readable regular file",
                                  found=str(exc.strerror)) from None
    if not stat.S_ISREG(st.st_mode):
        raise SourceLayoutError(f"{path}: expected a regular file, found {file_kind(st.st_mode)}",
                                path=str(path), expected="a regular file",
                                found=file_kind(st.st_mode))
    return st


# --------------------------------------------------------------------------------------------
# One safetensors header
# --------------------------------------------------------------------------------------------

def read_safetensors_header(path: str | os.PathLike) -> SafetensorsHeader:
    """Read and check the header of one safetensors file. No tensor byte is read.

    Layout: an unsigned 64-bit little-endian N, N bytes of UTF-8 JSON, then the data section,
    which the tensors' data_offsets (relative to the data section) must tile exactly.
    """
    path = Path(path)
    _stat_regular_file(path)
    try:
        with open(path, "rb") as fh:
            # fstat on the open handle: the size that goes with the bytes we read.
            file_size = os.fstat(fh.fileno()).st_size
            prefix = fh.read(8)
            buf = bytearray(prefix)
            if len(prefix) == 8:
                header_len = _check_header_length(prefix, file_size, path)
                # Read straight into one buffer (no second copy of a 100 MB header); a file
                # that shrank leaves it short, which the parser refuses.
                buf = bytearray(8 + header_len)
                buf[:8] = prefix
                got = read_full(fh, memoryview(buf)[8:])
                del buf[8 + got:]
    except OSError as exc:
        raise SourceNotFoundError(f"{path}: cannot read: {exc.strerror}", path=str(path),
                                  expected="a readable file", found=str(exc.strerror)) from None
    return _parse_header_bytes(buf, file_size, path)


def _check_header_length(prefix: bytes | bytearray, file_size: int, path: Path) -> int:
    """Validate the 8-byte length prefix against the cap and the file size; return N."""
    if file_size >= 8 and len(prefix) < 8:
        # Only reachable when the file shrank while we read it (or a caller passed too few
        # bytes to the in-memory parser).
        raise SafetensorsFormatError(
            f"{path}: read {len(prefix)} bytes of the 8-byte header length prefix, expected 8",
            path=str(path), field="header_len", expected=8, found=len(prefix))
    if file_size < 8:
        raise SafetensorsFormatError(
            f"{path}: file is {file_size} bytes, shorter than the 8-byte header length prefix",
            path=str(path), field="header_len", expected=">= 8 bytes", found=file_size)
    (header_len,) = struct.unpack("<Q", prefix[:8])
    if header_len == 0:
        raise SafetensorsFormatError(
            f"{path}: header length is 0, expected a JSON header of at least 2 bytes",
            path=str(path), field="header_len", expected=">= 2", found=0)
    if header_len > MAX_HEADER_BYTES:
        raise SafetensorsFormatError(
            f"{path}: header length {header_len} exceeds the cap of {MAX_HEADER_BYTES} bytes",
            path=str(path), field="header_len", expected=f"<= {MAX_HEADER_BYTES}",
            found=header_len)
    if header_len > file_size - 8:
        raise SafetensorsFormatError(
            f"{path}: header length {header_len} exceeds the {file_size - 8} bytes after the "
            f"length prefix (file size {file_size})",
            path=str(path), field="header_len", expected=f"<= {file_size - 8}",
            found=header_len)
    return header_len


def _parse_header_bytes(buf: bytes | bytearray, file_size: int,
                        path: Path) -> SafetensorsHeader:
    """Check a header given the file's leading bytes (the prefix and the JSON; more is
    ignored) and the file's total size. Split out so property tests can fuzz in memory."""
    path = Path(path)
    header_len = _check_header_length(buf, file_size, path)
    available = min(len(buf) - 8, header_len)
    if available != header_len:
        # The file shrank between fstat and read, or the caller passed too few bytes.
        raise SafetensorsFormatError(
            f"{path}: read {available} header bytes, expected {header_len}",
            path=str(path), field="header", expected=header_len, found=available)
    _check_json_items(buf, 8, 8 + header_len, MAX_HEADER_ITEMS, path, "header")
    _check_text_size(buf, 8, 8 + header_len, path, "header")

    try:
        # Decoded from a view: no copy of the header bytes besides the text itself.
        with memoryview(buf) as view:
            text = str(view[8: 8 + header_len], "utf-8")
    except UnicodeDecodeError as exc:
        raise SafetensorsFormatError(
            f"{path}: header is not UTF-8 (invalid byte at offset {8 + exc.start})",
            path=str(path), field="header", expected="UTF-8 JSON",
            found=f"invalid byte at offset {8 + exc.start}") from None
    try:
        doc = loads_strict(text)
    except DuplicateKeyError as dup:
        raise SafetensorsFormatError(
            f"{path}: header JSON has duplicate key {_quote(dup.key)}",
            path=str(path), field="header", expected="unique keys",
            found=f"duplicate key {_quote(dup.key)}") from None
    except (ValueError, RecursionError) as exc:
        raise SafetensorsFormatError(
            f"{path}: header is not valid JSON ({json_error_text(exc)})",
            path=str(path), field="header", expected="JSON",
            found=json_error_text(exc)) from None
    if not isinstance(doc, dict):
        raise SafetensorsFormatError(
            f"{path}: header JSON is {_json_kind(doc)}, expected an object",
            path=str(path), field="header", expected="a JSON object",
            found=_json_kind(doc))

    tensor_count = len(doc) - ("__metadata__" in doc)
    if tensor_count > MAX_HEADER_TENSORS:
        raise SafetensorsFormatError(
            f"{path}: header lists {tensor_count} tensors, more than the limit of "
            f"{MAX_HEADER_TENSORS} tensors in one file",
            path=str(path), field="header", expected=f"<= {MAX_HEADER_TENSORS} tensors",
            found=tensor_count)

    data_start = 8 + header_len
    data_len = file_size - data_start
    metadata: dict[str, str] = {}
    entries: list[TensorEntry] = []
    for name, spec in doc.items():
        if name == "__metadata__":
            metadata = _check_metadata(spec, path)
        else:
            entries.append(_check_entry(name, spec, path, data_start))

    _check_tiling(entries, path, data_start, data_len)
    entries.sort(key=lambda e: (e.begin, e.end, e.name))
    return SafetensorsHeader(path=path, file_size=file_size, header_len=header_len,
                             data_start=data_start, metadata=metadata,
                             tensors=tuple(entries))


def json_items(buf: bytes | bytearray, start: int = 0, end: int | None = None,
               stop_above: int | None = None) -> int:
    """The '{', '[' and ',' characters in JSON text ``buf[start:end]``: every JSON value and
    key follows one of them (or is the top-level value), so this bounds the objects json
    would build, before it builds any. Three byte counts at C speed, no copy (a hostile
    95 MB header is counted in a fraction of a second); counting stops once the total
    passes ``stop_above``."""
    end = len(buf) if end is None else end
    items = 0
    for char in (b",", b"{", b"["):
        items += buf.count(char, start, end)
        if stop_above is not None and items > stop_above:
            break
    return items


def _check_json_items(buf: bytes | bytearray, start: int, end: int, limit: int, path: Path,
                      what: str) -> None:
    """Refuse JSON text ``buf[start:end]`` with more than ``limit`` values (``json_items``)
    before json.loads builds an object for each of them."""
    if json_items(buf, start, end, stop_above=limit) > limit:
        raise SafetensorsFormatError(
            f"{path}: {what} JSON has more than {limit} values (counted by the '{{', '[' and "
            f"',' before each); expected at most {limit}",
            path=str(path), field=what, expected=f"<= {limit} JSON values",
            found=f"more than {limit}")


def _check_text_size(buf: bytes | bytearray, start: int, end: int, path: Path,
                     what: str) -> None:
    """Refuse UTF-8 ``buf[start:end]`` whose decoded text could take more than
    MAX_HEADER_TEXT_BYTES (see there), before it is decoded. Scanned in 1 MiB pieces, each
    skipped at C speed when it is ASCII."""
    width = 1
    with memoryview(buf) as view:
        for at in range(start, end, _WIDTH_SCAN_CHUNK):
            chunk = bytes(view[at:min(at + _WIDTH_SCAN_CHUNK, end)])
            if chunk.isascii():
                continue
            widths = chunk.translate(_WIDTH_OF_BYTE)
            if b"\x04" in widths:
                width = 4
                break
            if b"\x02" in widths:
                width = 2
    size = (end - start) * width
    if size > MAX_HEADER_TEXT_BYTES:
        raise SafetensorsFormatError(
            f"{path}: {what} is {end - start} bytes of UTF-8 holding characters stored "
            f"{width} bytes each, up to {size} bytes as text; expected at most "
            f"{MAX_HEADER_TEXT_BYTES}",
            path=str(path), field=what, expected=f"<= {MAX_HEADER_TEXT_BYTES} bytes as text",
            found=size)


def _check_metadata(spec: object, path: Path) -> dict[str, str]:
    if not isinstance(spec, dict):
        raise SafetensorsFormatError(
            f"{path}: __metadata__ is {_json_kind(spec)}, expected an object of strings",
            path=str(path), field="__metadata__", expected="object of str -> str",
            found=_json_kind(spec))
    for key, value in spec.items():
        if not isinstance(value, str):
            raise SafetensorsFormatError(
                f"{path}: __metadata__[{_quote(key)}] is {_json_kind(value)}, "
                f"expected a string",
                path=str(path), field=f"__metadata__.{_short(key)}", expected="str",
                found=_json_kind(value))
        if _has_surrogates(key) or _has_surrogates(value):
            raise SafetensorsFormatError(
                f"{path}: __metadata__[{_quote(key)}] holds a lone UTF-16 surrogate, "
                f"expected Unicode text",
                path=str(path), field="__metadata__", expected="Unicode text",
                found="lone surrogate")
    return dict(spec)


def _check_entry(name: str, spec: object, path: Path, data_start: int) -> TensorEntry:
    """Check one tensor entry on its own (the offsets against each other come later)."""
    if name == "":
        raise SafetensorsFormatError(
            f"{path}: a tensor has an empty name, expected a non-empty tensor name",
            path=str(path), tensor="",
            expected="a non-empty tensor name", found="''")
    if _has_surrogates(name):
        raise SafetensorsFormatError(
            f"{path}: tensor name {_quote(name)} holds a lone UTF-16 surrogate, "
            f"expected Unicode text",
            path=str(path), tensor=_short(name), expected="Unicode text",
            found="lone surrogate")
    where = f"{path}: tensor {_quote(name)}"
    tensor = _short(name)

    if not isinstance(spec, dict):
        raise SafetensorsFormatError(
            f"{where}: entry is {_json_kind(spec)}, expected an object with keys "
            f"dtype, shape, data_offsets",
            path=str(path), tensor=tensor, expected="object", found=_json_kind(spec))
    keys = set(spec)
    if keys != _ENTRY_KEYS:
        missing = sorted(_ENTRY_KEYS - keys)
        extra = sorted(keys - _ENTRY_KEYS)
        found = "; ".join(part for part in (
            f"missing {', '.join(missing)}" if missing else "",
            f"unexpected {', '.join(_quote(k) for k in extra)}" if extra else "") if part)
        raise SafetensorsFormatError(
            f"{where}: entry keys must be exactly dtype, shape, data_offsets; found {found}",
            path=str(path), tensor=tensor, expected="dtype, shape, data_offsets", found=found)

    dtype = spec["dtype"]
    if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
        raise SafetensorsFormatError(
            f"{where}: unknown dtype {_quote(dtype)}, expected one of "
            f"{', '.join(DTYPE_SIZES)}",
            path=str(path), tensor=tensor, field="dtype", expected=sorted(DTYPE_SIZES),
            found=_quote(dtype))

    shape = spec["shape"]
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise SafetensorsFormatError(
            f"{where}: shape {_quote(shape)} is not a list of non-negative integers",
            path=str(path), tensor=tensor, field="shape",
            expected="list of non-negative integers", found=_quote(shape))

    # The reference reader multiplies the dimensions and the element size in bits in a 64-bit
    # integer and refuses an overflow. Python's integers never overflow, so without this a
    # shape like [2**70, 0] would pass here and fail there. Zero dimensions are left out of
    # the product: a zero anywhere makes the tensor empty whatever the other sizes are.
    nonzero_elements = math.prod(d for d in shape if d)
    if nonzero_elements * DTYPE_SIZES[dtype] * 8 >= 2**64:
        raise SafetensorsFormatError(
            f"{where}: shape {_quote(shape)} is too large: its size in bits does not fit in "
            f"64 bits",
            path=str(path), tensor=tensor, field="shape", expected="< 2**64 bits",
            found=_quote(shape))

    offsets = spec["data_offsets"]
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(_is_int(o) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]):
        raise SafetensorsFormatError(
            f"{where}: data_offsets {_quote(offsets)} is not two integers "
            f"with 0 <= begin <= end",
            path=str(path), tensor=tensor, field="data_offsets",
            expected="[begin, end] with 0 <= begin <= end", found=_quote(offsets))
    begin, end = offsets

    # math.prod of Python ints never overflows, so a hostile shape cannot wrap around.
    expected_bytes = math.prod(shape) * DTYPE_SIZES[dtype]
    if end - begin != expected_bytes:
        raise SafetensorsFormatError(
            f"{where}: data_offsets [{begin}, {end}] cover {end - begin} bytes, expected "
            f"{expected_bytes} (shape {shape} of {dtype})",
            path=str(path), tensor=tensor, field="data_offsets",
            expected=expected_bytes, found=end - begin)

    return TensorEntry(name=name, dtype=dtype, shape=tuple(shape), file=path,
                       begin=data_start + begin, end=data_start + end)


def _check_tiling(entries: list[TensorEntry], path: Path, data_start: int,
                  data_len: int) -> None:
    """The tensors sorted by offset must tile the data section exactly: start at 0, no gap,
    no overlap, end at the end of the file. Anything else is bytes no tensor owns (room to
    smuggle data past a hash of the tensors) or bytes two tensors share."""
    ordered = sorted(entries, key=lambda e: (e.begin, e.end, e.name))
    cursor = data_start  # absolute offset where the next tensor must begin
    previous: TensorEntry | None = None
    for entry in ordered:
        if entry.begin > cursor:
            after = f"after tensor {_quote(previous.name)}" if previous else "at the start"
            raise SafetensorsFormatError(
                f"{path}: gap of {entry.begin - cursor} bytes in the data section {after}, "
                f"before tensor {_quote(entry.name)} (data offset {entry.begin - data_start}, "
                f"expected {cursor - data_start})",
                path=str(path), tensor=_short(entry.name), field="data_offsets",
                expected=cursor - data_start, found=entry.begin - data_start)
        if entry.begin < cursor:
            # Only reachable with a previous tensor: the first one is checked against 0.
            assert previous is not None
            raise SafetensorsFormatError(
                f"{path}: tensors {_quote(previous.name)} and {_quote(entry.name)} overlap "
                f"(data offset {entry.begin - data_start} is before the end of the previous "
                f"tensor at {cursor - data_start})",
                path=str(path), tensor=_short(entry.name), field="data_offsets",
                expected=cursor - data_start, found=entry.begin - data_start)
        cursor = entry.end
        previous = entry

    covered = cursor - data_start
    if covered < data_len:
        after = f"after tensor {_quote(previous.name)}" if previous else "with no tensors"
        raise SafetensorsFormatError(
            f"{path}: {data_len - covered} trailing bytes in the data section {after} "
            f"(tensors cover {covered} of {data_len} bytes)",
            path=str(path), field="data_offsets", expected=data_len, found=covered)
    if covered > data_len:
        assert previous is not None
        raise SafetensorsFormatError(
            f"{path}: data truncated: tensor {_quote(previous.name)} ends at data offset "
            f"{covered} but the data section is {data_len} bytes",
            path=str(path), tensor=_short(previous.name), field="data_offsets",
            expected=data_len, found=covered)


# --------------------------------------------------------------------------------------------
# The checkpoint directory
# --------------------------------------------------------------------------------------------

def locate_checkpoint(directory: str | os.PathLike) -> CheckpointFiles:
    """Find config.json and the weights of a checkpoint directory, refusing ambiguous,
    pickle-only or mixed layouts and links that leave the directory. Opens only the index."""
    return _locate(directory)[0]


def _locate(directory: str | os.PathLike) -> tuple[CheckpointFiles, dict[str, str] | None]:
    """locate_checkpoint, also returning the index's weight_map (None when single-file)."""
    directory = Path(directory)
    if not directory.exists():
        raise SourceNotFoundError(f"{directory}: source directory not found",
                                  path=str(directory), expected="a directory",
                                  found="nothing")
    if not directory.is_dir():
        raise SourceNotFoundError(f"{directory}: source is not a directory",
                                  path=str(directory), expected="a directory",
                                  found="a file")
    roots = _allowed_roots(directory)
    try:
        names = sorted(os.listdir(directory))
    except OSError as exc:
        raise SourceNotFoundError(f"{directory}: cannot list the directory: {exc.strerror}",
                                  path=str(directory), expected="a readable directory",
                                  found=str(exc.strerror)) from None
    present = set(names)

    config = directory / CONFIG_NAME
    if CONFIG_NAME not in present:
        raise SourceNotFoundError(f"{config}: config.json not found", path=str(config),
                                  expected="config.json", found="nothing")
    _check_openable(config, roots)

    has_single = SINGLE_WEIGHTS_NAME in present
    has_index = INDEX_NAME in present
    safetensors_names = [n for n in names if n.lower().endswith(SAFETENSORS_SUFFIX)]

    if has_single and has_index:
        raise SourceLayoutError(
            f"{directory}: both {SINGLE_WEIGHTS_NAME} and {INDEX_NAME} are present; "
            f"ambiguous which are the weights",
            path=str(directory), expected=f"{SINGLE_WEIGHTS_NAME} or {INDEX_NAME}",
            found="both")
    if not has_single and not has_index:
        pickles = [n for n in names if n.lower().endswith(PICKLE_SUFFIXES)]
        if pickles:
            raise SourceLayoutError(
                f"{directory}: only pickle weights ({', '.join(pickles)}); pickle files are "
                f"never opened, expected {SINGLE_WEIGHTS_NAME} or {INDEX_NAME}",
                path=str(directory), expected=f"{SINGLE_WEIGHTS_NAME} or {INDEX_NAME}",
                found=", ".join(pickles))
        if safetensors_names:
            # Shards with no index to say which tensors they hold and that none is missing.
            raise SourceLayoutError(
                f"{directory}: safetensors files without {SINGLE_WEIGHTS_NAME} or "
                f"{INDEX_NAME} ({', '.join(safetensors_names)})",
                path=str(directory), expected=f"{SINGLE_WEIGHTS_NAME} or {INDEX_NAME}",
                found=", ".join(safetensors_names))
        raise SourceNotFoundError(
            f"{directory}: no weights found, expected {SINGLE_WEIGHTS_NAME} or {INDEX_NAME}",
            path=str(directory), expected=f"{SINGLE_WEIGHTS_NAME} or {INDEX_NAME}",
            found="nothing")

    weight_map: dict[str, str] | None = None
    if has_single:
        index = None
        weights = (directory / SINGLE_WEIGHTS_NAME,)
        _check_openable(weights[0], roots)
    else:
        index = directory / INDEX_NAME
        _check_openable(index, roots)
        weight_map = read_index(index)
        shard_names = sorted(set(weight_map.values()))
        for shard in shard_names:
            if shard not in present:
                raise SourceNotFoundError(
                    f"{directory / shard}: shard named by {INDEX_NAME} not found",
                    path=str(directory / shard), expected="the shard file", found="nothing")
        weights = tuple(directory / shard for shard in shard_names)
        for shard_path in weights:
            _check_openable(shard_path, roots)

    weight_names = {p.name for p in weights}
    stray = [n for n in safetensors_names if n not in weight_names]
    if stray:
        raise SourceLayoutError(
            f"{directory}: mixed shards: {', '.join(stray)} present but not part of the "
            f"weights ({', '.join(sorted(weight_names))})",
            path=str(directory / stray[0]), expected=", ".join(sorted(weight_names)),
            found=", ".join(stray))

    opened = {CONFIG_NAME, *weight_names} | ({INDEX_NAME} if index else set())
    ignored = tuple(n for n in names if n not in opened)
    files = CheckpointFiles(directory=directory, config=config, weights=weights,
                            index=index, ignored=ignored)
    return files, weight_map


def _allowed_roots(directory: Path) -> tuple[Path, ...]:
    """Where a symlinked file may point: the directory itself, and for a Hugging Face cache
    snapshot (``<repo>/snapshots/<rev>/``) that repository's own ``blobs/``, where the hub
    keeps the content its snapshot links point to. ``blobs`` must be a real directory of
    that repository, not itself a link: a ``blobs`` linked to ``/`` would otherwise let a
    snapshot link reach any file on the machine. Links are checked after resolving every
    level (``_check_openable``)."""
    real = directory.resolve()
    roots = [real]
    if real.parent.name == "snapshots":
        repo = real.parent.parent
        blobs = repo / "blobs"
        if blobs.is_dir() and not blobs.is_symlink() and blobs.resolve() == repo.resolve() / "blobs":
            roots.append(blobs.resolve())
    return tuple(roots)


def _check_openable(path: Path, roots: tuple[Path, ...]) -> None:
    """A file we will open must be a regular file; if it is a symlink, its final target must
    be a regular file inside one of ``roots`` (links are resolved through every hop)."""
    if not path.is_symlink():
        _stat_regular_file(path)
        return
    target = os.readlink(path)
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError):  # dangling link or a loop
        raise SourceLayoutError(
            f"{path}: symlink to {target} does not resolve to an existing file",
            path=str(path), expected="a link to a regular file", found=target) from None
    if not any(real.is_relative_to(root) for root in roots):
        raise SourceLayoutError(
            f"{path}: symlink to {target} leaves the source directory (resolves to {real})",
            path=str(path), expected=f"a target inside {roots[0]}"
            + (f" or {roots[1]}" if len(roots) > 1 else ""), found=str(real))
    if not real.is_file():
        raise SourceLayoutError(
            f"{path}: symlink to {target} resolves to {real}, which is not a regular file",
            path=str(path), expected="a regular file", found=str(real))


def read_index(index: Path) -> dict[str, str]:
    """Parse model.safetensors.index.json: a JSON object whose ``weight_map`` maps each
    tensor name to a shard's plain file name. Other keys (``metadata``) are not used."""
    st = _stat_regular_file(index)
    if st.st_size > _MAX_INDEX_BYTES:
        raise SafetensorsFormatError(
            f"{index}: index is {st.st_size} bytes, above the cap of {_MAX_INDEX_BYTES}",
            path=str(index), expected=f"<= {_MAX_INDEX_BYTES} bytes", found=st.st_size)
    try:
        with open(index, "rb") as fh:
            raw = fh.read(_MAX_INDEX_BYTES + 1)
    except OSError as exc:
        raise SourceNotFoundError(f"{index}: cannot read: {exc.strerror}", path=str(index),
                                  expected="a readable file", found=str(exc.strerror)) from None
    if len(raw) > _MAX_INDEX_BYTES:     # it grew since the stat
        raise SafetensorsFormatError(
            f"{index}: index is more than {_MAX_INDEX_BYTES} bytes, above the cap",
            path=str(index), expected=f"<= {_MAX_INDEX_BYTES} bytes", found=len(raw))
    _check_json_items(raw, 0, len(raw), MAX_INDEX_ITEMS, index, "index")
    _check_text_size(raw, 0, len(raw), index, "index")
    try:
        doc = loads_strict(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise SafetensorsFormatError(
            f"{index}: index is not UTF-8 (invalid byte at offset {exc.start})",
            path=str(index), expected="UTF-8 JSON", found=f"invalid byte at {exc.start}"
        ) from None
    except DuplicateKeyError as dup:
        raise SafetensorsFormatError(
            f"{index}: index JSON has duplicate key {_quote(dup.key)}", path=str(index),
            expected="unique keys", found=f"duplicate key {_quote(dup.key)}") from None
    except (ValueError, RecursionError) as exc:
        raise SafetensorsFormatError(
            f"{index}: index is not valid JSON ({json_error_text(exc)})", path=str(index),
            expected="JSON", found=json_error_text(exc)) from None
    if not isinstance(doc, dict):
        raise SafetensorsFormatError(
            f"{index}: index JSON is {_json_kind(doc)}, expected an object",
            path=str(index), expected="a JSON object", found=_json_kind(doc))
    if "weight_map" not in doc:
        raise SafetensorsFormatError(
            f"{index}: index has no weight_map", path=str(index), field="weight_map",
            expected="an object of tensor name -> shard file", found="nothing")
    weight_map = doc["weight_map"]
    if not isinstance(weight_map, dict):
        raise SafetensorsFormatError(
            f"{index}: weight_map is {_json_kind(weight_map)}, expected an object",
            path=str(index), field="weight_map", expected="object",
            found=_json_kind(weight_map))
    if not weight_map:
        raise SafetensorsFormatError(
            f"{index}: weight_map is empty, expected at least one tensor", path=str(index),
            field="weight_map", expected="at least one tensor", found=0)
    for name, shard in weight_map.items():
        if name == "" or _has_surrogates(name):
            raise SafetensorsFormatError(
                f"{index}: weight_map has an invalid tensor name {_quote(name)}",
                path=str(index), field="weight_map", tensor=_short(name),
                expected="a non-empty tensor name", found=_quote(name))
        if not _is_plain_shard_name(shard):
            raise SafetensorsFormatError(
                f"{index}: weight_map[{_quote(name)}] = {_quote(shard)} is not a plain "
                f"*.safetensors file name in the source directory",
                path=str(index), field="weight_map", tensor=_short(name),
                expected="a plain file name ending in .safetensors", found=_quote(shard))
    return weight_map


def _is_plain_shard_name(shard: object) -> bool:
    # A shard must live in the checkpoint directory itself: no separators, no parent
    # references, no absolute path. Requiring the .safetensors suffix keeps the index from
    # pointing at config.json or a pickle and keeps the "mixed shards" rule meaningful.
    return (isinstance(shard, str)
            and shard.endswith(SAFETENSORS_SUFFIX)
            and len(shard) > len(SAFETENSORS_SUFFIX)
            and "/" not in shard and "\\" not in shard and ".." not in shard
            and "\x00" not in shard
            and not os.path.isabs(shard)
            and not _has_surrogates(shard))


def read_checkpoint(directory: str | os.PathLike) -> Checkpoint:
    """Locate a checkpoint, read every safetensors header and, when sharded, check that the
    index and the headers agree tensor for tensor. No tensor byte is read."""
    files, weight_map = _locate(directory)
    headers = tuple(read_safetensors_header(p) for p in files.weights)

    owner: dict[str, TensorEntry] = {}
    for header in headers:
        for entry in header.tensors:
            first = owner.get(entry.name)
            if first is not None:
                raise SafetensorsFormatError(
                    f"{files.directory}: tensor {_quote(entry.name)} is in two files: "
                    f"{first.file.name} and "
                    f"{entry.file.name}",
                    path=str(entry.file), tensor=_short(entry.name),
                    expected=f"only in {first.file.name}",
                    found=f"also in {entry.file.name}")
            owner[entry.name] = entry

    if weight_map is not None:
        assert files.index is not None
        index = files.index
        # Every header tensor must be listed, under its own shard.
        for name, entry in owner.items():
            listed = weight_map.get(name)
            if listed is None:
                raise SafetensorsFormatError(
                    f"{index}: tensor {_quote(name)} is in {entry.file.name} but not in the "
                    f"index's weight_map",
                    path=str(index), tensor=_short(name), field="weight_map",
                    expected=entry.file.name, found="not listed")
            if listed != entry.file.name:
                raise SafetensorsFormatError(
                    f"{index}: weight_map puts tensor {_quote(name)} in {listed} but it is in "
                    f"{entry.file.name}",
                    path=str(index), tensor=_short(name), field="weight_map",
                    expected=entry.file.name, found=listed)
        # Every listed tensor must exist in its shard.
        for name, shard in weight_map.items():
            if name not in owner:
                raise SafetensorsFormatError(
                    f"{index}: weight_map lists tensor {_quote(name)} in {shard} but "
                    f"{shard}'s header does not have it",
                    path=str(files.directory / shard), tensor=_short(name),
                    field="weight_map", expected=f"{_quote(name)} in {shard}",
                    found="absent")

    tensors = {name: owner[name] for name in sorted(owner)}
    return Checkpoint(files=files, headers=headers, tensors=tensors)
