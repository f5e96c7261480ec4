"""Tests of dspark_convert.formats.gguf_reader: agreement with gguf-py on real files, and one
targeted test per refusal on hand-built hostile files."""

from __future__ import annotations

import dataclasses
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFWriter
from gguf.constants import GGMLQuantizationType, GGUFValueType

from dspark_convert.errors import GGUFFormatError
from dspark_convert.formats.gguf_reader import (
    MAX_ARRAY_LENGTH, MAX_KV_PAIRS, MAX_STRING_LENGTH, MAX_TENSORS, GGUFFile, GGUFTensorInfo,
    GGUFValue, parse_gguf_bytes, read_gguf, tensor_data,
)

VT = GGUFValueType
QT = GGMLQuantizationType


# --- real files written by gguf-py -----------------------------------------------------------

def _add_many_kv(w: GGUFWriter) -> None:
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_uint64("t.u64", 2**64 - 1)
    w.add_int64("t.i64", -(2**63))
    w.add_float32("t.f32", 0.25)
    w.add_float64("t.f64", 1e300)
    w.add_bool("t.bool_true", True)
    w.add_bool("t.bool_false", False)
    w.add_string("t.str", "héllo wörld ✓")
    w.add_key_value("t.arr_u32", [1, 2, 3, 4_000_000_000], VT.ARRAY, sub_type=VT.UINT32)
    w.add_array("t.arr_str", ["a", "bb", "ccc", "ünï"])
    w.add_array("t.arr_f32", [0.5, -1.5])
    w.add_key_value("t.arr_bool", [True, False, True], VT.ARRAY, sub_type=VT.BOOL)


# Tensors: (name, numpy data, raw_dtype). BF16 as uint16 bits; Q8_0 as its raw bytes.
def _tensors() -> list[tuple[str, np.ndarray, QT | None]]:
    rng = np.random.default_rng(0)
    return [
        ("fc.weight", rng.integers(0, 2**16, size=(3, 8), dtype=np.uint16), QT.BF16),
        ("output_norm.weight", rng.integers(0, 2**16, size=(5,), dtype=np.uint16), QT.BF16),
        ("f32.weight", rng.standard_normal((2, 3, 4)).astype(np.float32), None),
        # Q8_0: 2 rows of 64 elements = 2 blocks each of 34 bytes -> byte shape (2, 68).
        ("q8.weight", rng.integers(0, 256, size=(2, 68), dtype=np.uint8), QT.Q8_0),
        ("bias", rng.integers(0, 2**16, size=(1,), dtype=np.uint16), QT.BF16),
    ]


def write_streaming(path: Path, alignment: int | None = None) -> list:
    """The streaming API: add_tensor_info, header, kv, ti, then write_tensor_data."""
    tensors = _tensors()
    w = GGUFWriter(path, "dflash")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    _add_many_kv(w)
    for name, arr, raw in tensors:
        w.add_tensor_info(name, arr.shape, arr.dtype, arr.nbytes, raw_dtype=raw)
    w.write_header_to_file(path)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for _name, arr, _raw in tensors:
        w.write_tensor_data(arr)
    w.close()
    return tensors


def write_plain(path: Path) -> list:
    """The plain API: add_tensor then write_tensors_to_file."""
    tensors = _tensors()
    w = GGUFWriter(path, "dflash")
    w.add_uint32("general.alignment", 32)
    _add_many_kv(w)
    for name, arr, raw in tensors:
        w.add_tensor(name, arr, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tensors


def _assert_matches_gguf_py(path: Path, tensors: list) -> GGUFFile:
    ours = read_gguf(path)
    ref = GGUFReader(path)
    assert ours.version == 3
    assert ours.file_size == path.stat().st_size
    assert ours.data_start == ref.data_offset
    assert ours.alignment == ref.alignment

    ref_fields = {k: f for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    assert list(ours.kv) == list(ref_fields)
    for key, field in ref_fields.items():
        value = ours.kv[key]
        assert value.type == field.types[0], key
        if value.type == VT.ARRAY:
            assert value.sub_type == field.types[-1], key
        else:
            assert value.sub_type is None
        expected = field.contents()
        if value.type == VT.ARRAY and value.sub_type == VT.FLOAT32 or value.type == VT.FLOAT32:
            assert np.allclose(value.value, expected), key
        else:
            assert value.value == expected, key
            # Same Python type: bools stay bools, ints stay ints.
            if value.type != VT.ARRAY:
                assert type(value.value) is type(expected), key

    assert [t.name for t in ours.tensors] == [t.name for t in ref.tensors]
    with open(path, "rb") as fh:
        raw = fh.read()
    for info, rt, (name, arr, _raw) in zip(ours.tensors, ref.tensors, tensors):
        assert info.name == rt.name == name
        assert info.shape == tuple(int(d) for d in rt.shape)
        assert info.ggml_type == rt.tensor_type
        assert info.data_offset == rt.data_offset
        assert info.nbytes == rt.n_bytes == arr.nbytes
        view = tensor_data(ours, info, raw)
        assert bytes(view) == rt.data.tobytes() == arr.tobytes()
    return ours


def test_streaming_file_matches_gguf_py(tmp_path):
    path = tmp_path / "s.gguf"
    tensors = write_streaming(path)
    g = _assert_matches_gguf_py(path, tensors)
    # torch shape (3, 8) is stored ne0-first.
    assert g.tensors[0].shape == (8, 3)
    assert g.tensors[3].ggml_type == QT.Q8_0 and g.tensors[3].shape == (64, 2)
    assert g.tensors[3].nbytes == 2 * 68
    assert g.kv["t.u64"] == GGUFValue(VT.UINT64, 2**64 - 1, None)
    assert g.kv["t.arr_u32"] == GGUFValue(VT.ARRAY, [1, 2, 3, 4_000_000_000], VT.UINT32)
    assert g.kv["t.bool_false"].value is False


def test_plain_file_matches_gguf_py(tmp_path):
    path = tmp_path / "p.gguf"
    tensors = write_plain(path)
    _assert_matches_gguf_py(path, tensors)


def test_custom_alignment(tmp_path):
    path = tmp_path / "a.gguf"
    tensors = write_streaming(path, alignment=64)
    g = _assert_matches_gguf_py(path, tensors)
    assert g.alignment == 64 and g.data_start % 64 == 0
    assert all(t.offset % 64 == 0 for t in g.tensors)


def test_parse_bytes_and_memoryview_agree_with_read(tmp_path):
    path = tmp_path / "s.gguf"
    write_streaming(path)
    data = path.read_bytes()
    from_file = read_gguf(path)
    from_bytes = parse_gguf_bytes(data, path=str(path))
    from_view = parse_gguf_bytes(memoryview(bytearray(data)), path=str(path))
    assert from_file == from_bytes == from_view


def test_read_gguf_on_mmap_then_tensor_data(tmp_path):
    import mmap
    path = tmp_path / "s.gguf"
    tensors = write_streaming(path)
    g = read_gguf(path)
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        for info, (_n, arr, _r) in zip(g.tensors, tensors):
            view = tensor_data(g, info, mm)
            assert bytes(view) == arr.tobytes()
            view.release()


def test_dataclasses_are_frozen(tmp_path):
    path = tmp_path / "s.gguf"
    write_streaming(path)
    g = read_gguf(path)
    assert isinstance(g.tensors[0], GGUFTensorInfo)
    for obj, attr in ((g, "version"), (g.tensors[0], "name"), (g.kv["t.u8"], "value")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, attr, 1)


def test_zero_tensors_allowed(tmp_path):
    # write_tensors_to_file pads the tensor-info table to the alignment.
    padded = tmp_path / "padded.gguf"
    w = GGUFWriter(padded, "dflash")
    w.add_uint32("x", 1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    g = read_gguf(padded)
    assert g.tensors == () and g.data_start == g.file_size
    # The streaming API without tensors leaves the table unpadded: also accepted.
    bare = tmp_path / "bare.gguf"
    w = GGUFWriter(bare, "dflash")
    w.add_uint32("x", 1)
    w.write_header_to_file(bare)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    assert read_gguf(bare).tensors == ()
    assert GGUFReader(bare).tensors == []


# --- a hand builder for hostile files --------------------------------------------------------

def gstr(s: str | bytes) -> bytes:
    b = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    return gstr(key) + struct.pack("<I", vtype) + payload


def kv_u32(key: str, v: int) -> bytes:
    return kv(key, VT.UINT32, struct.pack("<I", v))


def arr(sub: int, items: list[bytes], count: int | None = None) -> bytes:
    return struct.pack("<IQ", sub, len(items) if count is None else count) + b"".join(items)


def ti(name: str | bytes, dims: list[int], gtype: int = QT.BF16, offset: int = 0,
       n_dims: int | None = None) -> bytes:
    out = gstr(name) + struct.pack("<I", len(dims) if n_dims is None else n_dims)
    out += b"".join(struct.pack("<Q", d) for d in dims)
    return out + struct.pack("<IQ", gtype, offset)


def build(kvs: list[bytes] = (), tis: list[bytes] = (), data: bytes = b"", *,
          alignment: int = 32, n_tensors: int | None = None, n_kv: int | None = None,
          magic: bytes = b"GGUF", version: bytes = struct.pack("<I", 3),
          pad: bool = True) -> bytes:
    head = magic + version + struct.pack("<QQ", len(tis) if n_tensors is None else n_tensors,
                                         len(kvs) if n_kv is None else n_kv)
    out = head + b"".join(kvs) + b"".join(tis)
    if pad:
        out += b"\0" * (-len(out) % alignment)
    return out + data


def good() -> bytes:
    """A small valid file: two BF16 tensors of 8 elements (16 bytes, padded to 32)."""
    return build([kv_u32("general.alignment", 32), kv("k.s", VT.STRING, gstr("v"))],
                 [ti("a", [8]), ti("b", [4, 2], offset=32)],
                 b"\x11" * 16 + b"\0" * 16 + b"\x22" * 16)


def refused(buf: bytes, *fragments: str) -> GGUFFormatError:
    with pytest.raises(GGUFFormatError) as info:
        parse_gguf_bytes(buf, path="x.gguf")
    err = info.value
    assert err.message.startswith("x.gguf: "), err.message
    assert "\n" not in err.message
    assert err.path == "x.gguf" and err.exit_code == 41
    for fragment in fragments:
        assert fragment in err.message, (fragment, err.message)
    return err


def test_hand_built_good_file_parses():
    g = parse_gguf_bytes(good())
    assert [t.name for t in g.tensors] == ["a", "b"]
    assert g.tensors[1].shape == (4, 2) and g.tensors[1].nbytes == 16
    assert g.kv["k.s"] == GGUFValue(VT.STRING, "v", None)
    # Trailing padding up to the alignment after the last tensor is allowed.
    assert parse_gguf_bytes(good() + b"\0" * 16).file_size == len(good()) + 16


# --- header -------------------------------------------------------------------------------

def test_bad_magic():
    refused(build(magic=b"GGUG"), "bad magic", "b'GGUG'")


def test_version_2():
    refused(build(version=struct.pack("<I", 2)), "version", "expected 3, found 2")


def test_big_endian():
    refused(build(version=struct.pack(">I", 3)), "big-endian")


def test_empty_buffer():
    refused(b"", "truncated at byte 0", "magic")


@pytest.mark.parametrize("cut, what", [
    (3, "magic"), (6, "version"), (12, "tensor count"), (20, "key/value count"),
])
def test_truncated_header(cut, what):
    refused(good()[:cut], "truncated", what)


def test_huge_tensor_count():
    err = refused(build(n_tensors=2**64 - 1), "tensor count", f"at most {MAX_TENSORS}")
    assert err.found == 2**64 - 1


def test_tensor_count_beyond_file():
    refused(build(n_tensors=1000), "truncated", "tensor count")


def test_huge_kv_count():
    refused(build(n_kv=2**40), "key/value count", f"at most {MAX_KV_PAIRS}")


def test_kv_count_beyond_file():
    refused(build(n_kv=100), "truncated", "key/value count")


# --- metadata -----------------------------------------------------------------------------

def test_truncated_in_kv():
    first = kv_u32("k.a", 1)  # 19 bytes
    full = build([first, kv("k.string", VT.STRING, gstr("a long string value"))])
    at = 24 + len(first)  # start of the second pair
    refused(full[:3], "truncated", "magic")
    refused(full[:at + 8 + 5], "truncated", "key of key/value pair 1")
    refused(full[:at + 16 + 2], "truncated", "value type of 'k.string'")
    refused(full[:at + 20 + 4], "truncated", "length of string value of 'k.string'")
    refused(full[:at + 20 + 8 + 10], "truncated", "string value of 'k.string'")


def test_huge_string_length():
    big = struct.pack("<Q", 2**63)
    err = refused(build([kv("k.s", VT.STRING, big)]), "string value of 'k.s'",
                  f"expected at most {MAX_STRING_LENGTH}")
    assert err.field == "k.s"


def test_string_length_beyond_file():
    refused(build([kv("k.s", VT.STRING, struct.pack("<Q", 1000) + b"abc")]), "truncated")


def test_huge_key_length():
    refused(build([struct.pack("<Q", 2**62) + b"k"]), "key of key/value pair 0",
            "expected at most 65535")


def test_empty_key():
    refused(build([kv(b"", VT.UINT8, b"\x01")]), "empty")


def test_huge_array_length():
    payload = struct.pack("<IQ", VT.UINT32, 2**60)
    refused(build([kv("k.a", VT.ARRAY, payload)]), "array 'k.a'",
            f"expected at most {MAX_ARRAY_LENGTH}")


def test_array_length_beyond_remaining_bytes():
    # Within the limit, but 1M u32 cannot fit in the few bytes left: refused before reading.
    payload = struct.pack("<IQ", VT.UINT32, 1_000_000) + b"\0" * 8
    refused(build([kv("k.a", VT.ARRAY, payload)]), "truncated", "array 'k.a'", "4000000")
    # Strings need at least 8 bytes each.
    payload = struct.pack("<IQ", VT.STRING, 100) + b"\0" * 16
    refused(build([kv("k.a", VT.ARRAY, payload)]), "truncated", "STRING")


def test_unknown_value_type():
    err = refused(build([kv("k.x", 13, b"\0" * 8)]), "unknown value type of 'k.x' 13")
    assert err.field == "k.x"


def test_unknown_array_element_type():
    refused(build([kv("k.a", VT.ARRAY, struct.pack("<IQ", 99, 1) + b"\0" * 8)]),
            "unknown array element type of 'k.a' 99")


def test_bad_bool_byte():
    refused(build([kv("k.b", VT.BOOL, b"\x02")]), "BOOL value of 'k.b'", "0 or 1, found 2")


def test_bad_bool_byte_in_array():
    refused(build([kv("k.b", VT.ARRAY, arr(VT.BOOL, [b"\x01", b"\x00", b"\xff"]))]),
            "BOOL element 2 of array 'k.b'", "found 255")


def test_invalid_utf8_value():
    refused(build([kv("k.s", VT.STRING, gstr(b"ok\xff"))]), "not valid UTF-8")


def test_invalid_utf8_key():
    refused(build([kv(b"k\xc3", VT.UINT8, b"\x01")]), "key of key/value pair 0",
            "not valid UTF-8")


def test_invalid_utf8_in_string_array():
    refused(build([kv("k.a", VT.ARRAY, arr(VT.STRING, [gstr("a"), gstr(b"\xed\xa0\x80")]))]),
            "not valid UTF-8")


def test_duplicate_key():
    err = refused(build([kv_u32("k.a", 1), kv_u32("k.a", 2)]), "duplicate key 'k.a' at byte 43",
                  "first seen at byte 24")
    assert err.field == "k.a"


def test_nested_arrays_depth_two_allowed():
    inner = [arr(VT.UINT8, [b"\x01", b"\x02"]), arr(VT.UINT8, [b"\x03"])]
    g = parse_gguf_bytes(build([kv("k.n", VT.ARRAY, arr(VT.ARRAY, inner))]))
    assert g.kv["k.n"] == GGUFValue(VT.ARRAY, [[1, 2], [3]], VT.ARRAY)


def test_nesting_too_deep():
    deepest = arr(VT.UINT8, [b"\x01"])
    middle = arr(VT.ARRAY, [deepest])
    refused(build([kv("k.n", VT.ARRAY, arr(VT.ARRAY, [middle]))]), "nests arrays 3 deep",
            "at most 2")


def test_alignment_not_power_of_two():
    err = refused(build([kv_u32("general.alignment", 48)]), "general.alignment is 48",
                  "power of two")
    assert err.field == "general.alignment"


def test_alignment_zero():
    refused(build([kv_u32("general.alignment", 0)]), "general.alignment is 0")


def test_alignment_wrong_type():
    refused(build([kv("general.alignment", VT.UINT64, struct.pack("<Q", 32))]),
            "general.alignment has type UINT64", "expected UINT32")


# --- tensor infos --------------------------------------------------------------------------

@pytest.mark.parametrize("delta, what", [
    (9, "n_dims of tensor 'b'"), (13, "dimension 0 of tensor 'b'"),
    (21, "dimension 1 of tensor 'b'"), (29, "ggml type of tensor 'b'"),
    (33, "offset of tensor 'b'"),
])
def test_truncated_in_tensor_info(delta, what):
    full = good()
    # Cut inside the second tensor's info (name "b", 2 dims): the earlier checks pass.
    start = full.index(gstr("b"))
    refused(full[:start + delta + 2], "truncated", what)


def test_duplicate_tensor_name():
    err = refused(build([], [ti("a", [8]), ti("a", [8], offset=32)], b"\0" * 48),
                  "duplicate tensor name 'a'")
    assert err.tensor == "a"


def test_empty_tensor_name():
    refused(build([], [ti(b"", [8])], b"\0" * 16), "name of tensor 0", "empty")


def test_invalid_utf8_tensor_name():
    refused(build([], [ti(b"\x80", [8])], b"\0" * 16), "name of tensor 0", "not valid UTF-8")


@pytest.mark.parametrize("n_dims", [0, 5, 2**32 - 1])
def test_bad_n_dims(n_dims):
    err = refused(build([], [ti("a", [8], n_dims=n_dims)], b"\0" * 16),
                  f"n_dims {n_dims}", "expected 1..4")
    assert err.tensor == "a"


def test_zero_dim():
    refused(build([], [ti("a", [8, 0])], b"\0" * 16), "zero dimension", "[8, 0]")


@pytest.mark.parametrize("gtype", [4, 31, 999, 2**32 - 1])
def test_unknown_ggml_type(gtype):
    refused(build([], [ti("a", [8], gtype=gtype)], b"\0" * 16), f"unknown ggml type {gtype}")


def test_ne0_not_multiple_of_block_size():
    refused(build([], [ti("q", [48, 1], gtype=QT.Q8_0)], b"\0" * 64),
            "ne0 48 is not a multiple of the Q8_0 block size 32")


def test_block_sizes_respected():
    # Q8_0: 64 x 3 elements = 2 blocks per row of 34 bytes = 204 bytes.
    g = parse_gguf_bytes(build([], [ti("q", [64, 3], gtype=QT.Q8_0)], b"\0" * 204))
    assert g.tensors[0].nbytes == 204


def test_misaligned_offset():
    err = refused(build([], [ti("a", [8]), ti("b", [8], offset=16)], b"\0" * 32),
                  "tensor 'b' offset 16 is not aligned to 32")
    assert err.tensor == "b"


def test_offset_out_of_range():
    refused(build([], [ti("a", [8], offset=2**64 - 32)], b"\0" * 16),
            "tensor 'a' spans", "file ends at byte")


def test_tensor_data_truncated():
    refused(good()[:-1], "tensor 'b' spans", "file ends at byte")


def test_huge_dims_do_not_overflow():
    refused(build([], [ti("a", [2**64 - 1] * 4)], b"\0" * 16), "tensor 'a' spans")


def test_data_section_beyond_file():
    # The tensor-info table ends unpadded and there are tensors: data_start > file size.
    refused(build([], [ti("a", [8])], pad=False), "truncated", "data section starts")


def test_overlapping_tensors():
    err = refused(build([], [ti("a", [32]), ti("b", [8], offset=32)], b"\0" * 64),
                  "overlaps tensor 'a'")
    assert err.tensor == "b"


def test_overlapping_tensors_listed_out_of_order():
    refused(build([], [ti("b", [8], offset=32), ti("a", [8], offset=32)], b"\0" * 64),
            "overlaps")


def test_trailing_garbage():
    refused(good() + b"\0" * 16 + b"x", "trailing garbage: 1 bytes")


def test_trailing_garbage_without_tensors():
    refused(build([kv_u32("k", 1)]) + b"\0" * 32, "trailing garbage", "no tensors")


# --- read_gguf and tensor_data -------------------------------------------------------------

def test_read_gguf_missing_file(tmp_path):
    with pytest.raises(GGUFFormatError, match="cannot read"):
        read_gguf(tmp_path / "missing.gguf")


def test_read_gguf_directory(tmp_path):
    with pytest.raises(GGUFFormatError, match="not a regular file"):
        read_gguf(tmp_path)


def test_read_gguf_fifo_does_not_block(tmp_path):
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    with pytest.raises(GGUFFormatError, match="not a regular file"):
        read_gguf(fifo)


def test_read_gguf_empty_file(tmp_path):
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    with pytest.raises(GGUFFormatError, match="truncated at byte 0"):
        read_gguf(path)


def test_read_gguf_hostile_file_closes_map(tmp_path):
    # A refusal inside the mapped parse must still surface as GGUFFormatError (the map is
    # closed without a BufferError).
    path = tmp_path / "bad.gguf"
    path.write_bytes(good() + b"\0" * 16 + b"garbage")
    with pytest.raises(GGUFFormatError, match="trailing garbage") as info:
        read_gguf(path)
    assert info.value.path == str(path)


def test_tensor_data_wrong_buffer():
    g = parse_gguf_bytes(good())
    assert bytes(tensor_data(g, g.tensors[1], good())) == b"\x22" * 16
    with pytest.raises(GGUFFormatError, match="expected the"):
        tensor_data(g, g.tensors[0], good()[:-1])
