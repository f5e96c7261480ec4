"""Property tests of dspark_convert.formats.gguf_reader on hostile input.

The property: ``parse_gguf_bytes`` either returns a GGUFFile whose tensors lie inside the
file, aligned and non-overlapping, or raises GGUFFormatError; never anything else, and
always quickly. The default run is short; set DSPARK_FUZZ_EXAMPLES (e.g. 20000) for a long
run, which raises max_examples of every hypothesis test here.
"""

from __future__ import annotations

import os
import struct
import tempfile
import time
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter
from gguf.constants import GGMLQuantizationType, GGUFValueType
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from dspark_convert.formats import gguf_reader
from dspark_convert.errors import GGUFFormatError
from dspark_convert.formats.gguf_reader import GGUFArray, GGUFFile, parse_gguf_bytes
from support.fuzz import patched_limits

# Property tests: hundreds of generated examples per property, several seconds a module:
# `make test` (and `make fuzz`, longer) runs them; the fast loop leaves them out.
pytestmark = pytest.mark.slow

# Default examples per hypothesis test; keeps the whole file well under 20 s.
_DEFAULT_EXAMPLES = 500
MAX_EXAMPLES = int(os.environ.get("DSPARK_FUZZ_EXAMPLES", _DEFAULT_EXAMPLES))
# A parse of a few KiB must be near-instant; a generous bound that still catches a parser
# that loops or allocates by a length field.
MAX_SECONDS_PER_PARSE = 1.0

FUZZ = settings(max_examples=MAX_EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


@lru_cache(maxsize=1)
def seed_file() -> bytes:
    """A small valid file written by gguf-py: every kv type, BF16/F32/Q8_0 tensors."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "seed.gguf"
        w = GGUFWriter(path, "dflash")
        w.add_uint32("general.alignment", 32)
        w.add_uint8("k.u8", 7)
        w.add_int16("k.i16", -7)
        w.add_uint64("k.u64", 2**40)
        w.add_float32("k.f32", 0.5)
        w.add_float64("k.f64", 0.25)
        w.add_bool("k.b", True)
        w.add_string("k.s", "hello")
        w.add_key_value("k.au32", [3, 5, 7], GGUFValueType.ARRAY, sub_type=GGUFValueType.UINT32)
        w.add_array("k.astr", ["x", "yz"])
        w.add_array("k.nested", [[1, 2], [3]])
        w.add_tensor("a.weight", np.arange(12, dtype=np.uint16).reshape(3, 4),
                     raw_dtype=GGMLQuantizationType.BF16)
        w.add_tensor("b.weight", np.ones((2, 2), dtype=np.float32))
        w.add_tensor("q.weight", np.zeros((1, 34), dtype=np.uint8),
                     raw_dtype=GGMLQuantizationType.Q8_0)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return path.read_bytes()


def check_parse(buf: bytes) -> GGUFFile | None:
    """The property itself. Returns the parse or None when refused."""
    start = time.perf_counter()
    try:
        g = parse_gguf_bytes(buf, path="fuzz.gguf")
    except GGUFFormatError as err:
        # A clean refusal: one line naming the file.
        assert err.message.startswith("fuzz.gguf: ") and "\n" not in err.message
        g = None
    # Anything else propagates and fails the test.
    assert time.perf_counter() - start < MAX_SECONDS_PER_PARSE
    if g is not None:
        assert g.file_size == len(buf) and g.version == 3
        assert g.alignment > 0 and g.alignment & (g.alignment - 1) == 0
        assert g.data_start % g.alignment == 0
        spans = sorted((t.data_offset, t.data_offset + t.nbytes) for t in g.tensors)
        for (s0, e0), (s1, _e1) in zip(spans, spans[1:]):
            assert e0 <= s1
        for t in g.tensors:
            assert t.data_offset == g.data_start + t.offset
            assert t.offset % g.alignment == 0
            assert g.data_start <= t.data_offset and t.data_offset + t.nbytes <= g.file_size
            assert 1 <= len(t.shape) <= 4 and all(d >= 1 for d in t.shape)
    return g


def test_seed_is_valid():
    g = check_parse(seed_file())
    assert g is not None and len(g.tensors) == 3


# (a) arbitrary bytes; half of them start with a valid header so the fuzzer gets past it.
_HEADER = b"GGUF\x03\x00\x00\x00"


@FUZZ
@given(st.binary(max_size=512), st.booleans())
def test_arbitrary_bytes(data, with_header):
    check_parse(_HEADER + data if with_header else data)


@FUZZ
@given(st.integers(0, 70), st.integers(0, 70), st.binary(max_size=512))
def test_small_counts_then_arbitrary_bytes(n_tensors, n_kv, rest):
    # Plausible counts make the parser walk kv and tensor-info tables built from noise.
    buf = _HEADER + n_tensors.to_bytes(8, "little") + n_kv.to_bytes(8, "little") + rest
    check_parse(buf)


# (b) a valid file with random byte mutations.
@FUZZ
@given(st.data())
def test_mutated_valid_file(data):
    buf = bytearray(seed_file())
    n = data.draw(st.integers(1, 8), label="n_mutations")
    for _ in range(n):
        pos = data.draw(st.integers(0, len(buf) - 1), label="pos")
        kind = data.draw(st.sampled_from(["set", "flip", "u64", "insert", "delete"]),
                         label="kind")
        if kind == "set":
            buf[pos] = data.draw(st.integers(0, 255), label="byte")
        elif kind == "flip":
            buf[pos] ^= 1 << data.draw(st.integers(0, 7), label="bit")
        elif kind == "u64":
            # Overwrite with an extreme 64-bit value: lengths, counts, dims and offsets.
            value = data.draw(st.sampled_from([0, 1, 2**31, 2**32 - 1, 2**63, 2**64 - 1]),
                              label="u64")
            buf[pos:pos + 8] = value.to_bytes(8, "little")
        elif kind == "insert":
            buf[pos:pos] = data.draw(st.binary(min_size=1, max_size=16), label="insert")
        elif len(buf) > 1:
            del buf[pos:pos + data.draw(st.integers(1, 16), label="delete")]
    check_parse(bytes(buf))


@FUZZ
@given(st.integers(0, 400), st.integers(0, 2**64 - 1), st.sampled_from([1, 2, 4, 8]))
def test_header_region_integer_overwrites(pos, value, width):
    # Focus on the header/kv/tensor-info region, where all length and count fields live.
    buf = bytearray(seed_file())
    pos = min(pos, len(buf) - width)
    buf[pos:pos + width] = (value % (1 << (8 * width))).to_bytes(width, "little")
    check_parse(bytes(buf))


# (c) a valid file truncated at every length: exhaustive.
def test_every_truncation():
    buf = seed_file()
    g = parse_gguf_bytes(buf)
    data_end = max(t.data_offset + t.nbytes for t in g.tensors)
    for cut in range(len(buf)):
        result = check_parse(buf[:cut])
        if cut < data_end:
            # Missing part of the header, tables or tensor data: must be refused.
            assert result is None, cut
        else:
            # Only padding after the last tensor is missing: still a complete file.
            assert result is not None, cut


# (d) the memory bounds (MAX_ARRAY_LENGTH, MAX_ARRAYS, MAX_LIST_LENGTH, MAX_DECODED_BYTES),
# lowered so that files of a few hundred bytes reach them.

TIGHT = {"MAX_ARRAY_LENGTH": 10, "MAX_ARRAYS": 6, "MAX_LIST_LENGTH": 4,
         "MAX_DECODED_BYTES": 1500}


def tight_limits():
    return patched_limits(gguf_reader, TIGHT)


_SCALAR_TYPES = {GGUFValueType.UINT8: ("B", st.integers(0, 255)),
                 GGUFValueType.INT16: ("h", st.integers(-2**15, 2**15 - 1)),
                 GGUFValueType.UINT32: ("I", st.integers(0, 2**32 - 1)),
                 GGUFValueType.INT64: ("q", st.integers(-2**63, 2**63 - 1)),
                 GGUFValueType.FLOAT32: ("f", st.sampled_from([0.0, 0.5, -2.0, 1e30])),
                 GGUFValueType.FLOAT64: ("d", st.floats(allow_nan=False)),
                 GGUFValueType.BOOL: ("?", st.booleans())}


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


@st.composite
def arrays(draw, nested_ok: bool = True):
    """(encoding after the ARRAY type word, Python value, [lengths of it and its arrays])."""
    kind = draw(st.sampled_from(["scalar", "string", "nested"] if nested_ok else
                                ["scalar", "string"]))
    if kind == "scalar":
        vtype = draw(st.sampled_from(sorted(_SCALAR_TYPES)))
        fmt, values = _SCALAR_TYPES[vtype]
        items = draw(st.lists(values, max_size=14))
        if fmt == "f":   # what FLOAT32 holds
            items = [struct.unpack("<f", struct.pack("<f", v))[0] for v in items]
        body = struct.pack(f"<{len(items)}{fmt}", *items)
        return struct.pack("<IQ", vtype, len(items)) + body, items, [len(items)]
    if kind == "string":
        items = draw(st.lists(st.text(max_size=6), max_size=14))
        return (struct.pack("<IQ", GGUFValueType.STRING, len(items))
                + b"".join(map(_string, items)), items, [len(items)])
    inner = draw(st.lists(arrays(nested_ok=False), max_size=8))
    return (struct.pack("<IQ", GGUFValueType.ARRAY, len(inner)) + b"".join(i[0] for i in inner),
            [i[1] for i in inner], [len(inner)] + [n for i in inner for n in i[2]])


@FUZZ
@given(st.lists(arrays(), max_size=5))
def test_bounds_are_exact_on_valid_metadata(pairs):
    """Valid metadata arrays under lowered limits: refused, naming the key, when an array is
    longer than MAX_ARRAY_LENGTH or the file holds more than MAX_ARRAYS arrays; else
    accepted with long scalar arrays packed, equal to what the default limits read."""
    buf = (_HEADER + struct.pack("<QQ", 0, len(pairs))
           + b"".join(_string(f"k.{i}") + struct.pack("<I", GGUFValueType.ARRAY) + enc
                      for i, (enc, _v, _n) in enumerate(pairs)))
    unbounded = parse_gguf_bytes(buf, path="fuzz.gguf")   # the defaults: valid, read
    for i, (_enc, value, _n) in enumerate(pairs):
        assert unbounded.kv[f"k.{i}"].value == value
    lengths = [n for _e, _v, ns in pairs for n in ns]
    with tight_limits():
        bounded = check_parse(buf)
    if bounded is None:
        with tight_limits(), pytest.raises(GGUFFormatError) as info:
            parse_gguf_bytes(buf, path="fuzz.gguf")
        message, field = info.value.message, info.value.field
        if "elements: expected at most 10" in message:
            event("refused: array length")
            assert max(lengths) > 10 and field.startswith("k.")
        elif "nested ones included" in message:
            event("refused: arrays")
            assert len(lengths) > 6 and field.startswith("k.")
        else:   # the key itself may be what passes the budget: no field then
            assert field is None or field.startswith("k.")
            event("refused: decoded bytes")
            assert "expected at most 1500 for the whole file" in message
        return
    event("accepted")
    assert max(lengths, default=0) <= 10 and len(lengths) <= 6
    assert bounded == unbounded
    for i, (_enc, value, _n) in enumerate(pairs):
        got = bounded.kv[f"k.{i}"]
        if got.sub_type not in (GGUFValueType.STRING, GGUFValueType.ARRAY):
            assert isinstance(got.value, GGUFArray) == (len(value) > 4)
        assert got.value == value
