"""Property tests: whatever bytes a safetensors file holds, read_safetensors_header either
returns a header or raises SafetensorsFormatError, never anything else. And whenever it
accepts a file, the safetensors library accepts it too and sees the same tensors: our
checks are at least as strict as the reference reader's.

The default run is short (a few seconds). Set DSPARK_FUZZ_EXAMPLES to raise the number of
examples per property for a long run, e.g. ``DSPARK_FUZZ_EXAMPLES=20000``.
"""

from __future__ import annotations

import json
import struct
import time
import tempfile
from pathlib import Path

import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from safetensors import safe_open
from support.fuzz import fuzz_settings, patched_limits

from dspark_convert.formats import safetensors as safetensors_reader
from dspark_convert.errors import SafetensorsFormatError
from dspark_convert.formats.safetensors import (
    DTYPE_SIZES,
    SafetensorsHeader,
    _parse_header_bytes,
    read_safetensors_header,
)

# Property tests: hundreds of generated examples per property, several seconds a module:
# `make test` (and `make fuzz`, longer) runs them; the fast loop leaves them out.
pytestmark = pytest.mark.slow

# Reading a header of a few KiB must be near-instant (per example; hypothesis's own
# deadline is off because the first examples pay for imports).
MAX_SECONDS_PER_PARSE = 1.0


@pytest.fixture(scope="module")
def scratch():
    # One file rewritten per example: hypothesis cannot use the function-scoped tmp_path.
    with tempfile.TemporaryDirectory(prefix="dspark-fuzz-") as d:
        yield Path(d) / "fuzz.safetensors"


def st_bytes(header: bytes, data: bytes = b"", length: int | None = None) -> bytes:
    return struct.pack("<Q", len(header) if length is None else length) + header + data


def check_file(path: Path, content: bytes) -> SafetensorsHeader | None:
    """The property: read returns or raises SafetensorsFormatError; the in-memory parser
    agrees with the file reader; an accepted file is accepted by the library, identically."""
    path.write_bytes(content)
    start = time.perf_counter()
    try:
        header = read_safetensors_header(path)
    except SafetensorsFormatError as err:
        assert "\n" not in err.message and err.path == str(path)
        with pytest.raises(SafetensorsFormatError):
            _parse_header_bytes(content, len(content), path)
        assert time.perf_counter() - start < MAX_SECONDS_PER_PARSE
        return None
    # A parser that loops or allocates by a length field shows up as a slow example.
    assert time.perf_counter() - start < MAX_SECONDS_PER_PARSE
    assert _parse_header_bytes(content, len(content), path) == header
    agree_with_library(path, header)
    return header


def agree_with_library(path: Path, header: SafetensorsHeader) -> None:
    ours = {t.name: t for t in header.tensors}
    assert len(ours) == len(header.tensors)
    with safe_open(str(path), framework="pt") as f:
        assert sorted(f.keys()) == sorted(ours)
        assert (f.metadata() or {}) == header.metadata
        for name in f.keys():
            sl = f.get_slice(name)
            assert sl.get_dtype() == ours[name].dtype
            assert tuple(sl.get_shape()) == ours[name].shape
    # Our own invariants: sorted, contiguous, covering the data section exactly.
    cursor = header.data_start
    for t in header.tensors:
        assert t.begin == cursor and t.nbytes == DTYPE_SIZES[t.dtype] * _prod(t.shape)
        cursor = t.end
    assert cursor == header.file_size


def _prod(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# --------------------------------------------------------------------------------------------
# strategies
# --------------------------------------------------------------------------------------------

json_scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
                | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=4),
    max_leaves=12)
dtypes = st.sampled_from(sorted(DTYPE_SIZES))
# Names as they appear in real checkpoints, plus arbitrary text.
names = st.from_regex(r"[a-z_]{1,6}(\.[0-9a-z_]{1,6}){0,3}", fullmatch=True) | st.text(
    min_size=1, max_size=12)


@st.composite
def valid_specs(draw):
    """A valid file: (header dict, data bytes). Tensors are laid out contiguously in an order
    unrelated to the order of the header's keys, as real writers do."""
    tensor_names = draw(st.lists(names.filter(lambda n: n != "__metadata__"),
                                 max_size=6, unique=True))
    specs = [(n, draw(dtypes), draw(st.lists(st.integers(0, 4), max_size=3)))
             for n in tensor_names]
    order = draw(st.permutations(range(len(specs))))
    header: dict = {}
    if draw(st.booleans()):
        header["__metadata__"] = draw(st.dictionaries(st.text(max_size=5), st.text(max_size=5),
                                                      max_size=3))
    offset = 0
    offsets = {}
    for i in order:
        name, dtype, shape = specs[i]
        size = _prod(shape) * DTYPE_SIZES[dtype]
        offsets[name] = [offset, offset + size]
        offset += size
    for name, dtype, shape in specs:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": offsets[name]}
    data = draw(st.binary(min_size=offset, max_size=offset))
    return header, data


def encode(header: dict, pad: int = 0) -> bytes:
    return json.dumps(header).encode("utf-8") + b" " * pad


# --------------------------------------------------------------------------------------------
# properties
# --------------------------------------------------------------------------------------------

@fuzz_settings(300)
@given(content=st.binary(max_size=256))
def test_arbitrary_bytes(scratch, content):
    check_file(scratch, content)


@fuzz_settings(200)
@given(header=st.binary(max_size=256), data=st.binary(max_size=32),
       length_delta=st.sampled_from([0, 0, 0, -1, 1, 8]))
def test_arbitrary_header_bytes_with_plausible_length(scratch, header, data, length_delta):
    check_file(scratch, st_bytes(header, data, max(0, len(header) + length_delta)))


@fuzz_settings(60)
@given(doc=json_values, data=st.binary(max_size=16))
def test_arbitrary_json_headers(scratch, doc, data):
    check_file(scratch, st_bytes(json.dumps(doc).encode(), data))


@fuzz_settings(60)
@given(spec=valid_specs(), pad=st.integers(0, 7))
def test_valid_files_are_accepted(scratch, spec, pad):
    header, data = spec
    parsed = check_file(scratch, st_bytes(encode(header, pad), data))
    assert parsed is not None
    assert {t.name for t in parsed.tensors} == set(header) - {"__metadata__"}
    for t in parsed.tensors:
        begin, end = header[t.name]["data_offsets"]
        assert (t.begin, t.end) == (parsed.data_start + begin, parsed.data_start + end)


MUTATIONS = ["set_field", "drop_key", "add_key", "offset_delta", "data_delta",
             "length_delta", "metadata", "rename", "duplicate", "trailing_text"]


@fuzz_settings(120)
@given(spec=valid_specs(), kind=st.sampled_from(MUTATIONS), data=st.data())
def test_structured_mutations(scratch, spec, kind, data):
    """Start from a valid file and break one thing, close to valid so the deep checks run."""
    header, body = spec
    names_present = [n for n in header if n != "__metadata__"]
    target = data.draw(st.sampled_from(names_present)) if names_present else None
    length_delta = 0
    raw_header = None
    if kind == "set_field" and target:
        field = data.draw(st.sampled_from(["dtype", "shape", "data_offsets"]))
        header[target][field] = data.draw(json_values | st.lists(st.integers(-2, 9), max_size=3))
    elif kind == "drop_key" and target:
        del header[target][data.draw(st.sampled_from(["dtype", "shape", "data_offsets"]))]
    elif kind == "add_key" and target:
        header[target][data.draw(st.text(max_size=4))] = data.draw(json_scalars)
    elif kind == "offset_delta" and target:
        which = data.draw(st.integers(0, 1))
        header[target]["data_offsets"][which] += data.draw(st.integers(-3, 3))
    elif kind == "data_delta":
        delta = data.draw(st.integers(-3, 3))
        body = body[:delta] if delta < 0 else body + bytes(delta)
    elif kind == "length_delta":
        length_delta = data.draw(st.integers(-3, 3))
    elif kind == "metadata":
        header["__metadata__"] = data.draw(json_values)
    elif kind == "rename" and target:
        header[data.draw(st.sampled_from(["", "__metadata__", "\ud800x", target + "2"]))] = \
            header.pop(target)
    elif kind == "duplicate" and target:
        # json.dumps cannot write a duplicate key: splice the raw text.
        text = json.dumps(header)
        raw_header = (text[:-1] + ", " + json.dumps(target) + ": "
                      + json.dumps(header[target]) + "}").encode()
    elif kind == "trailing_text":
        raw_header = encode(header) + data.draw(st.sampled_from(
            [b" ", b"\n", b"\x00", b"}", b",", b" {}", b"\xff"]))
    if raw_header is None:
        raw_header = json.dumps(header).encode("utf-8", "surrogatepass")
    length = max(0, len(raw_header) + length_delta)
    check_file(scratch, st_bytes(raw_header, body, length))


@fuzz_settings(120)
@given(spec=valid_specs(), edits=st.lists(
    st.tuples(st.sampled_from(["flip", "insert", "delete", "truncate"]),
              st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4))
def test_byte_mutations(scratch, spec, edits):
    """Random byte edits of a valid file, mostly landing in the length prefix and header."""
    header, data = spec
    content = bytearray(st_bytes(encode(header), data))
    for op, pos, byte in edits:
        if not content:
            break
        pos %= len(content)
        if op == "flip":
            content[pos] ^= byte or 1
        elif op == "insert":
            content.insert(pos, byte)
        elif op == "delete":
            del content[pos]
        else:
            del content[pos:]
    check_file(scratch, bytes(content))


@fuzz_settings(200)
@given(content=st.binary(max_size=128), file_size=st.integers(0, 2**64))
def test_in_memory_parser_never_escapes(content, file_size):
    """The in-memory parser on a prefix with any claimed file size (including sizes the
    bytes cannot back) only ever raises SafetensorsFormatError."""
    try:
        _parse_header_bytes(content, file_size, Path("mem.safetensors"))
    except SafetensorsFormatError:
        pass


# --------------------------------------------------------------------------------------------
# the memory bounds (MAX_HEADER_TENSORS, MAX_HEADER_ITEMS, MAX_HEADER_TEXT_BYTES), lowered so
# that headers of a few hundred bytes reach them
# --------------------------------------------------------------------------------------------

TIGHT = {"MAX_HEADER_TENSORS": 3, "MAX_HEADER_ITEMS": 40, "MAX_HEADER_TEXT_BYTES": 300}


def tight_limits():
    return patched_limits(safetensors_reader, TIGHT)


def _width(text: str) -> int:
    widest = max(map(ord, text), default=0)
    return 4 if widest > 0xFFFF else 2 if widest > 0xFF else 1


@fuzz_settings(200)
@given(spec=valid_specs(), wide=st.sampled_from(["", "é", "中", "\U0001F600"]),
       pad=st.integers(0, 7))
def test_bounds_are_exact_on_valid_files(scratch, spec, wide, pad):
    """A valid file (the library reads it) under lowered limits: refused, with its own
    message, exactly when it passes one of them; otherwise read as without the limits."""
    header, data = spec
    if wide:
        header.setdefault("__metadata__", {})["w"] = wide
    raw = json.dumps(header, ensure_ascii=False).encode() + b" " * pad
    content = st_bytes(raw, data)
    scratch.write_bytes(content)
    unbounded = read_safetensors_header(scratch)     # the defaults: a valid file passes

    items = sum(raw.count(c) for c in (b",", b"{", b"["))
    tensors = len(header) - ("__metadata__" in header)
    text_bytes = len(raw) * _width(raw.decode())
    with tight_limits():
        try:
            bounded = read_safetensors_header(scratch)
        except SafetensorsFormatError as err:
            assert "\n" not in err.message and err.path == str(scratch)
            if items > TIGHT["MAX_HEADER_ITEMS"]:
                event("refused: items")
                assert "JSON has more than 40 values" in err.message
            elif text_bytes > TIGHT["MAX_HEADER_TEXT_BYTES"]:
                event("refused: text size")
                assert "as text; expected at most 300" in err.message
            else:
                event("refused: tensors")
                assert tensors > TIGHT["MAX_HEADER_TENSORS"]
                assert f"lists {tensors} tensors, more than the limit of 3" in err.message
            return
    event("accepted")
    assert items <= 40 and text_bytes <= 300 and tensors <= 3
    assert bounded == unbounded


@fuzz_settings(200)
@given(doc=json_values, wide=st.booleans())
def test_bounds_hold_for_any_json(doc, wide):
    """Any JSON header under lowered limits: refused with our error, or accepted within
    them (the count that bounds json's objects is taken before they exist)."""
    raw = json.dumps(doc, ensure_ascii=not wide).encode()
    with tight_limits():
        try:
            _parse_header_bytes(st_bytes(raw), 8 + len(raw), Path("mem.safetensors"))
        except SafetensorsFormatError as err:
            assert "\n" not in err.message
            return
    assert sum(raw.count(c) for c in (b",", b"{", b"[")) <= 40
