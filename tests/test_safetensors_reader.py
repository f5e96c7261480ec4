"""Tests for dspark_convert.formats.safetensors on real files.

Valid files are written by the safetensors library itself (``save_file``); hostile ones are
assembled byte by byte (``st_bytes``) so each refusal is exercised exactly once.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
from conftest import REFERENCE_DRAFTER
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from dspark_convert.formats import safetensors as sr
from dspark_convert.errors import (
    SafetensorsFormatError,
    SourceLayoutError,
    SourceNotFoundError,
)
from dspark_convert.formats.safetensors import (
    DTYPE_SIZES,
    MAX_HEADER_BYTES,
    locate_checkpoint,
    read_checkpoint,
    read_safetensors_header,
)

REFERENCE_DRAFT = REFERENCE_DRAFTER   # golden/: DeepSpec-made, in the repository


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------

def st_bytes(header: dict | str | bytes, data: bytes = b"", *, length: int | None = None) -> bytes:
    """Assemble a safetensors file: 8-byte LE length, header, data. ``length`` overrides N."""
    if isinstance(header, dict):
        header = json.dumps(header)
    if isinstance(header, str):
        header = header.encode("utf-8")
    n = len(header) if length is None else length
    return struct.pack("<Q", n) + header + data


def ent(dtype: str, shape: list, begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def write(path: Path, content: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        content = content.encode("utf-8")
    path.write_bytes(content)
    return path


def tensors_abc() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "a.weight": torch.randn(4, 3, generator=g).to(torch.bfloat16),
        "b.weight": torch.randn(5, generator=g),  # F32
        "c.weight": torch.randn(2, 2, 2, generator=g).to(torch.bfloat16),
        "d.weight": torch.randn(3, generator=g).to(torch.bfloat16),
    }


def make_single(directory: Path, tensors: dict[str, torch.Tensor] | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    write(directory / "config.json", "{}")
    save_file(tensors if tensors is not None else tensors_abc(), str(directory / "model.safetensors"))
    return directory


def make_sharded(directory: Path, shards: dict[str, list[str]] | None = None,
                 weight_map: dict[str, str] | None = None) -> Path:
    """Write shards holding the named tensors of tensors_abc(), and an index (by default the
    truthful one; pass weight_map to lie)."""
    directory.mkdir(parents=True, exist_ok=True)
    write(directory / "config.json", "{}")
    shards = shards or {
        "model-00001-of-00002.safetensors": ["a.weight", "b.weight"],
        "model-00002-of-00002.safetensors": ["c.weight", "d.weight"],
    }
    all_tensors = tensors_abc()
    truthful = {}
    for shard, names in shards.items():
        save_file({n: all_tensors[n] for n in names}, str(directory / shard))
        truthful.update({n: shard for n in names})
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map or truthful}
    write(directory / "model.safetensors.index.json", json.dumps(index))
    return directory


def expect(exc_type, fragment: str, func, *args, **attrs):
    """Call func, assert it raises exc_type with a one-line message containing fragment and
    the given attributes; return the exception."""
    with pytest.raises(exc_type) as info:
        func(*args)
    err = info.value
    assert type(err) is exc_type
    assert "\n" not in err.message
    assert fragment in err.message, err.message
    for key, value in attrs.items():
        assert getattr(err, key) == value, (key, getattr(err, key), err.message)
    return err


# --------------------------------------------------------------------------------------------
# the published-style reference checkpoint
# --------------------------------------------------------------------------------------------

def test_reference_header_matches_safe_open_and_bytes():
    path = REFERENCE_DRAFT / "model.safetensors"
    header = read_safetensors_header(path)
    assert header.file_size == path.stat().st_size
    assert header.data_start == 8 + header.header_len
    assert [t.begin for t in header.tensors] == sorted(t.begin for t in header.tensors)
    assert header.tensors[-1].end == header.file_size
    ours = {t.name: t for t in header.tensors}
    raw = path.read_bytes()
    with safe_open(str(path), framework="pt") as f:
        assert sorted(f.keys()) == sorted(ours)
        assert header.metadata == (f.metadata() or {})
        for name in f.keys():
            tensor = f.get_tensor(name)
            entry = ours[name]
            assert entry.dtype == "BF16" and tensor.dtype == torch.bfloat16
            assert list(entry.shape) == list(tensor.shape)
            assert entry.nbytes == tensor.numel() * 2
            assert raw[entry.begin:entry.end] == tensor.view(torch.uint16).numpy().tobytes()


def test_reference_read_checkpoint():
    ckpt = read_checkpoint(REFERENCE_DRAFT)
    assert ckpt.files.config == REFERENCE_DRAFT / "config.json"
    assert ckpt.files.weights == (REFERENCE_DRAFT / "model.safetensors",)
    assert ckpt.files.index is None and ckpt.files.ignored == ()
    assert list(ckpt.tensors) == sorted(ckpt.tensors)
    assert "markov_head.markov_w1.weight" in ckpt.tensors
    assert ckpt.headers[0].tensors == tuple(sorted(ckpt.tensors.values(), key=lambda t: t.begin))


# --------------------------------------------------------------------------------------------
# valid files
# --------------------------------------------------------------------------------------------

def test_save_file_bf16_and_f32(tmp_path):
    tensors = tensors_abc()
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt", "note": "x"})
    header = read_safetensors_header(path)
    assert header.metadata == {"format": "pt", "note": "x"}
    raw = path.read_bytes()
    assert {t.name for t in header.tensors} == set(tensors)
    for entry in header.tensors:
        t = tensors[entry.name]
        assert entry.file == path
        assert entry.shape == tuple(t.shape)
        assert entry.dtype == {torch.bfloat16: "BF16", torch.float32: "F32"}[t.dtype]
        assert entry.nbytes == t.numel() * DTYPE_SIZES[entry.dtype]
        bits = t.view(torch.uint16) if t.dtype == torch.bfloat16 else t
        assert raw[entry.begin:entry.end] == bits.numpy().tobytes()
    # tiled in order, from the data start to the end of the file
    assert header.tensors[0].begin == header.data_start
    for prev, nxt in zip(header.tensors, header.tensors[1:]):
        assert prev.end == nxt.begin
    assert header.tensors[-1].end == header.file_size


def test_zero_tensors_allowed(tmp_path):
    path = write(tmp_path / "m.safetensors", st_bytes({}))
    header = read_safetensors_header(path)
    assert header.tensors == () and header.metadata == {}
    path = write(tmp_path / "n.safetensors", st_bytes({"__metadata__": {"a": "b"}}))
    assert read_safetensors_header(path).metadata == {"a": "b"}


def test_zero_size_tensors_and_padding_allowed(tmp_path):
    header = {"e": ent("F32", [0, 4], 0, 0), "x": ent("U8", [3], 0, 3), "z": ent("I64", [0], 3, 3)}
    text = json.dumps(header) + "    "  # writers pad the header with spaces for alignment
    path = write(tmp_path / "m.safetensors", st_bytes(text, b"abc"))
    parsed = read_safetensors_header(path)
    assert [(t.name, t.nbytes) for t in parsed.tensors] == [("e", 0), ("x", 3), ("z", 0)]
    assert parsed.tensors[1].begin == 8 + len(text)


def test_dtype_sizes_table():
    assert DTYPE_SIZES == {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2,
                           "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4,
                           "I64": 8, "U64": 8, "F64": 8}
    assert MAX_HEADER_BYTES == 100_000_000  # the library's MAX_HEADER_SIZE, decimal


def test_missing_file_and_directory_as_file(tmp_path):
    expect(SourceNotFoundError, "not found", read_safetensors_header, tmp_path / "nope.safetensors")
    (tmp_path / "d.safetensors").mkdir()
    expect(SourceLayoutError, "regular file", read_safetensors_header, tmp_path / "d.safetensors")


# --------------------------------------------------------------------------------------------
# header refusals: one case per check
# --------------------------------------------------------------------------------------------

GOOD = {"w": ent("BF16", [2, 2], 0, 8)}
GOOD_DATA = bytes(8)

# (id, file bytes, message fragment, tensor attribute or None)
HOSTILE = [
    ("empty-file", b"", "shorter than the 8-byte", None),
    ("short-file", b"\x01\x00\x00", "file is 3 bytes", None),
    ("length-zero", struct.pack("<Q", 0) + b"{}", "header length is 0", None),
    ("length-over-cap", struct.pack("<Q", MAX_HEADER_BYTES + 1) + b"{}",
     "exceeds the cap", None),
    ("length-over-file", st_bytes("{}", length=100), "header length 100 exceeds the 2 bytes", None),
    ("length-huge", struct.pack("<Q", 2**64 - 1) + b"{}", "exceeds the cap", None),
    ("not-utf8", st_bytes(b'{"\xff": 1}'), "not UTF-8", None),
    ("not-json", st_bytes("{not json"), "not valid JSON", None),
    ("nan-constant", st_bytes('{"w": NaN}'), "not valid JSON", None),
    ("json-list", st_bytes("[1, 2]"), "is an array, expected an object", None),
    ("json-string", st_bytes('"x"'), "is a string, expected an object", None),
    ("duplicate-tensor", st_bytes('{"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},'
                                  ' "w": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}',
                                  b"ab"), "duplicate key 'w'", None),
    ("duplicate-nested", st_bytes('{"w": {"dtype": "U8", "dtype": "U8", "shape": [1],'
                                  ' "data_offsets": [0, 1]}}', b"a"), "duplicate key 'dtype'", None),
    ("duplicate-metadata", st_bytes('{"__metadata__": {"a": "1", "a": "2"}}'),
     "duplicate key 'a'", None),
    ("metadata-not-object", st_bytes({"__metadata__": ["a"]}), "__metadata__ is an array", None),
    ("metadata-null", st_bytes({"__metadata__": None}), "__metadata__ is null", None),
    ("metadata-value-not-str", st_bytes({"__metadata__": {"total": 3}}),
     "__metadata__['total'] is a number", None),
    ("entry-not-object", st_bytes({"w": [0, 1]}), "tensor 'w': entry is an array", "w"),
    ("entry-missing-key", st_bytes({"w": {"dtype": "U8", "shape": [1]}}, b"a"),
     "missing data_offsets", "w"),
    ("entry-extra-key", st_bytes({"w": {**ent("U8", [1], 0, 1), "extra": 1}}, b"a"),
     "unexpected 'extra'", "w"),
    ("unknown-dtype", st_bytes({"w": ent("F4", [2], 0, 1)}, b"a"), "unknown dtype 'F4'", "w"),
    ("dtype-not-str", st_bytes({"w": ent(2, [2], 0, 1)}, b"a"), "unknown dtype 2", "w"),
    ("dtype-lowercase", st_bytes({"w": ent("bf16", [1], 0, 2)}, b"ab"), "unknown dtype 'bf16'", "w"),
    ("shape-not-list", st_bytes({"w": ent("U8", 4, 0, 4)}, b"abcd"), "shape 4 is not a list", "w"),
    ("shape-negative", st_bytes({"w": ent("U8", [-1], 0, 0)}), "shape [-1]", "w"),
    ("shape-bool", st_bytes({"w": ent("U8", [True], 0, 1)}, b"a"), "shape [true]", "w"),
    ("shape-float", st_bytes({"w": ent("U8", [1.0], 0, 1)}, b"a"), "shape [1.0]", "w"),
    ("offsets-not-list", st_bytes({"w": {"dtype": "U8", "shape": [1], "data_offsets": 1}}, b"a"),
     "data_offsets 1 is not two integers", "w"),
    ("offsets-three", st_bytes({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1, 2]}},
                               b"a"), "data_offsets [0, 1, 2]", "w"),
    ("offsets-float", st_bytes({"w": ent("U8", [1], 0.0, 1.0)}, b"a"), "data_offsets [0.0, 1.0]", "w"),
    ("offsets-bool", st_bytes({"w": ent("U8", [1], False, True)}, b"a"),
     "data_offsets [false, true]", "w"),
    ("offsets-reversed", st_bytes({"w": ent("U8", [1], 1, 0)}, b"a"), "0 <= begin <= end", "w"),
    ("offsets-negative", st_bytes({"w": ent("U8", [1], -1, 0)}, b"a"), "data_offsets [-1, 0]", "w"),
    ("shape-overflow", st_bytes({"w": ent("U8", [2**70, 0], 0, 0)}), "too large", "w"),
    ("shape-overflow-bits", st_bytes({"w": ent("U8", [2**61, 0], 0, 0)}), "too large", "w"),
    ("byte-count", st_bytes({"w": ent("BF16", [2, 3], 0, 6)}, bytes(6)),
     "cover 6 bytes, expected 12 (shape [2, 3] of BF16)", "w"),
    ("gap-at-start", st_bytes({"w": ent("U8", [2], 1, 3)}, b"abc"),
     "gap of 1 bytes in the data section at the start, before tensor 'w'", "w"),
    ("gap-between", st_bytes({"a": ent("U8", [2], 0, 2), "b": ent("U8", [2], 3, 5)}, b"abcde"),
     "gap of 1 bytes in the data section after tensor 'a', before tensor 'b'", "b"),
    ("overlap", st_bytes({"a": ent("U8", [3], 0, 3), "b": ent("U8", [2], 2, 4)}, b"abcd"),
     "tensors 'a' and 'b' overlap", "b"),
    ("same-range", st_bytes({"a": ent("U8", [2], 0, 2), "b": ent("U8", [2], 0, 2)}, b"ab"),
     "tensors 'a' and 'b' overlap", "b"),
    ("trailing-bytes", st_bytes(GOOD, GOOD_DATA + b"xx"),
     "2 trailing bytes in the data section after tensor 'w'", None),
    ("trailing-no-tensors", st_bytes({}, b"x"), "1 trailing bytes in the data section with no tensors",
     None),
    ("truncated", st_bytes(GOOD, GOOD_DATA[:5]),
     "data truncated: tensor 'w' ends at data offset 8 but the data section is 5 bytes", "w"),
    ("empty-name", st_bytes({"": ent("U8", [1], 0, 1)}, b"a"), "empty name", ""),
    ("lone-surrogate", st_bytes('{"\\ud800": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}',
                                b"a"), "lone UTF-16 surrogate", "\ud800"),
    ("deep-nesting", st_bytes("[" * 100_000 + "]" * 100_000), "nesting too deep", None),
]


@pytest.mark.parametrize("content,fragment,tensor", [h[1:] for h in HOSTILE],
                         ids=[h[0] for h in HOSTILE])
def test_header_refusals(tmp_path, content, fragment, tensor):
    path = write(tmp_path / "bad.safetensors", content)
    err = expect(SafetensorsFormatError, fragment, read_safetensors_header, path)
    assert err.message.startswith(f"{path}: "), err.message
    assert err.path == str(path)
    assert err.tensor == tensor
    assert err.exit_code == 12


def test_header_cap_matches_the_library(tmp_path):
    # A sparse file whose length prefix is one above the cap: both readers refuse it before
    # reading the header, so the file need not hold 100 MB of real bytes.
    path = tmp_path / "big.safetensors"
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", MAX_HEADER_BYTES + 1))
        fh.truncate(8 + MAX_HEADER_BYTES + 1)
    expect(SafetensorsFormatError, f"header length {MAX_HEADER_BYTES + 1} exceeds the cap",
           read_safetensors_header, path)
    with pytest.raises(Exception, match="header too large"):
        with safe_open(str(path), framework="pt"):
            pass


def test_byte_count_error_carries_expected_and_found(tmp_path):
    path = write(tmp_path / "m.safetensors", st_bytes({"w": ent("F32", [3], 0, 8)}, bytes(8)))
    err = expect(SafetensorsFormatError, "tensor 'w'", read_safetensors_header, path)
    assert (err.expected, err.found, err.field) == (12, 8, "data_offsets")


def test_hostile_values_are_quoted_short(tmp_path):
    long_dtype = "X" * 10_000
    path = write(tmp_path / "m.safetensors", st_bytes({"w": ent(long_dtype, [1], 0, 1)}, b"a"))
    err = expect(SafetensorsFormatError, "unknown dtype", read_safetensors_header, path)
    assert len(err.message) < 600


def test_parse_header_bytes_in_memory():
    buf = st_bytes(GOOD)
    header = sr._parse_header_bytes(buf, len(buf) + 8, Path("mem.safetensors"))
    assert header.tensors[0].begin == len(buf) and header.tensors[0].end == len(buf) + 8


# --------------------------------------------------------------------------------------------
# directory layout
# --------------------------------------------------------------------------------------------

def test_single_file_layout_and_ignored(tmp_path):
    d = make_single(tmp_path / "ckpt")
    write(d / "README.md", "hi")
    write(d / "pytorch_model.bin", b"\x80\x04 not really a pickle")
    write(d / "generation_config.json", "{}")
    files = locate_checkpoint(d)
    assert files.directory == d and files.config == d / "config.json"
    assert files.weights == (d / "model.safetensors",) and files.index is None
    assert files.ignored == ("README.md", "generation_config.json", "pytorch_model.bin")


def test_pickle_files_are_never_opened(tmp_path, monkeypatch):
    d = make_sharded(tmp_path / "ckpt")
    for name in ("pytorch_model.bin", "x.pt", "y.pth", "z.pkl", "w.ckpt"):
        write(d / name, b"\x80\x04")
    opened: list[str] = []
    real_open = open

    def recording_open(file, *args, **kwargs):
        opened.append(os.fspath(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(sr, "open", recording_open, raising=False)
    ckpt = read_checkpoint(d)
    assert len(ckpt.tensors) == 4
    assert opened, "the recording hook must see the files we do open"
    assert not [p for p in opened if p.endswith((".bin", ".pt", ".pth", ".pkl", ".ckpt"))]
    assert set(ckpt.files.ignored) == {"pytorch_model.bin", "x.pt", "y.pth", "z.pkl", "w.ckpt"}


def test_source_missing(tmp_path):
    expect(SourceNotFoundError, "source directory not found", locate_checkpoint, tmp_path / "nope")


def test_source_is_a_file(tmp_path):
    f = write(tmp_path / "file", "x")
    expect(SourceNotFoundError, "not a directory", locate_checkpoint, f)


def test_config_missing(tmp_path):
    d = make_single(tmp_path / "ckpt")
    (d / "config.json").unlink()
    expect(SourceNotFoundError, "config.json not found", locate_checkpoint, d)


def test_config_is_a_directory(tmp_path):
    d = make_single(tmp_path / "ckpt")
    (d / "config.json").unlink()
    (d / "config.json").mkdir()
    expect(SourceLayoutError, "expected a regular file, found a directory", locate_checkpoint, d)


def test_weights_is_a_directory(tmp_path):
    d = tmp_path / "ckpt"
    write(d / "config.json", "{}")
    (d / "model.safetensors").mkdir()
    expect(SourceLayoutError, "model.safetensors: expected a regular file", locate_checkpoint, d)


def test_both_layouts_ambiguous(tmp_path):
    d = make_sharded(tmp_path / "ckpt")
    save_file(tensors_abc(), str(d / "model.safetensors"))
    expect(SourceLayoutError, "both model.safetensors and model.safetensors.index.json",
           locate_checkpoint, d)


def test_pickle_only_refused(tmp_path):
    d = tmp_path / "ckpt"
    write(d / "config.json", "{}")
    write(d / "pytorch_model.bin", b"\x80\x04")
    err = expect(SourceLayoutError, "pickle files are never opened", locate_checkpoint, d)
    assert "pytorch_model.bin" in err.message


def test_no_weights(tmp_path):
    d = tmp_path / "ckpt"
    write(d / "config.json", "{}")
    expect(SourceNotFoundError, "no weights found", locate_checkpoint, d)


def test_shards_without_index_refused(tmp_path):
    d = make_sharded(tmp_path / "ckpt")
    (d / "model.safetensors.index.json").unlink()
    expect(SourceLayoutError, "safetensors files without", locate_checkpoint, d)


def test_stray_safetensors_beside_single_file(tmp_path):
    d = make_single(tmp_path / "ckpt")
    save_file({"x": torch.zeros(1)}, str(d / "adapter_model.safetensors"))
    err = expect(SourceLayoutError, "mixed shards: adapter_model.safetensors", locate_checkpoint, d)
    assert err.path == str(d / "adapter_model.safetensors")


# --------------------------------------------------------------------------------------------
# sharded checkpoints
# --------------------------------------------------------------------------------------------

def test_two_shards(tmp_path):
    d = make_sharded(tmp_path / "ckpt")
    ckpt = read_checkpoint(d)
    s1, s2 = d / "model-00001-of-00002.safetensors", d / "model-00002-of-00002.safetensors"
    assert ckpt.files.index == d / "model.safetensors.index.json"
    assert ckpt.files.weights == (s1, s2)
    assert [h.path for h in ckpt.headers] == [s1, s2]
    assert list(ckpt.tensors) == ["a.weight", "b.weight", "c.weight", "d.weight"]
    assert ckpt.tensors["a.weight"].file == s1 and ckpt.tensors["d.weight"].file == s2
    ref = tensors_abc()
    raw = s2.read_bytes()
    c = ckpt.tensors["c.weight"]
    assert raw[c.begin:c.end] == ref["c.weight"].view(torch.uint16).numpy().tobytes()


def test_missing_shard(tmp_path):
    d = make_sharded(tmp_path / "ckpt")
    (d / "model-00002-of-00002.safetensors").unlink()
    err = expect(SourceNotFoundError, "model-00002-of-00002.safetensors: shard named by",
                 locate_checkpoint, d)
    assert err.path == str(d / "model-00002-of-00002.safetensors")


def test_tensor_in_wrong_shard(tmp_path):
    d = tmp_path / "ckpt"
    wm = {"a.weight": "model-00002-of-00002.safetensors",  # lie: it is in shard 1
          "b.weight": "model-00001-of-00002.safetensors",
          "c.weight": "model-00002-of-00002.safetensors",
          "d.weight": "model-00002-of-00002.safetensors"}
    make_sharded(d, weight_map=wm)
    err = expect(SafetensorsFormatError,
                 "weight_map puts tensor 'a.weight' in model-00002-of-00002.safetensors but it "
                 "is in model-00001-of-00002.safetensors", read_checkpoint, d, tensor="a.weight")
    assert err.path == str(d / "model.safetensors.index.json")


def test_tensor_in_two_shards(tmp_path):
    d = make_sharded(tmp_path / "ckpt", shards={
        "model-00001-of-00002.safetensors": ["a.weight", "b.weight"],
        "model-00002-of-00002.safetensors": ["b.weight", "c.weight"],
    })
    expect(SafetensorsFormatError,
           "tensor 'b.weight' is in two files: model-00001-of-00002.safetensors and "
           "model-00002-of-00002.safetensors", read_checkpoint, d, tensor="b.weight")


def test_header_tensor_not_in_index(tmp_path):
    d = tmp_path / "ckpt"
    make_sharded(d, weight_map={"a.weight": "model-00001-of-00002.safetensors",
                                "c.weight": "model-00002-of-00002.safetensors",
                                "d.weight": "model-00002-of-00002.safetensors"})
    expect(SafetensorsFormatError, "tensor 'b.weight' is in model-00001-of-00002.safetensors "
           "but not in the index's weight_map", read_checkpoint, d, tensor="b.weight")


def test_index_tensor_not_in_shard(tmp_path):
    d = tmp_path / "ckpt"
    make_sharded(d, weight_map={"a.weight": "model-00001-of-00002.safetensors",
                                "b.weight": "model-00001-of-00002.safetensors",
                                "c.weight": "model-00002-of-00002.safetensors",
                                "d.weight": "model-00002-of-00002.safetensors",
                                "e.weight": "model-00002-of-00002.safetensors"})
    err = expect(SafetensorsFormatError, "lists tensor 'e.weight' in "
                 "model-00002-of-00002.safetensors but", read_checkpoint, d, tensor="e.weight")
    assert err.path == str(d / "model-00002-of-00002.safetensors")


def test_stray_extra_shard(tmp_path):
    d = make_sharded(tmp_path / "ckpt")
    save_file({"z": torch.zeros(2)}, str(d / "model-00003-of-00003.safetensors"))
    expect(SourceLayoutError, "mixed shards: model-00003-of-00003.safetensors present but not "
           "part of the weights", locate_checkpoint, d)


def test_bad_shard_header_names_the_shard(tmp_path):
    d = make_sharded(tmp_path / "ckpt")
    shard = d / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes() + b"extra")
    err = expect(SafetensorsFormatError, "5 trailing bytes", read_checkpoint, d)
    assert err.path == str(shard)


BAD_INDEXES = [
    ("not-json", b"{oops", "index is not valid JSON"),
    ("not-utf8", b'{"weight_map": {"\xff": "a.safetensors"}}', "index is not UTF-8"),
    ("duplicate-key", b'{"weight_map": {"a": "s.safetensors", "a": "s.safetensors"}}',
     "duplicate key 'a'"),
    ("duplicate-top", b'{"weight_map": {}, "weight_map": {}}', "duplicate key 'weight_map'"),
    ("list", b"[]", "index JSON is an array"),
    ("no-weight-map", b'{"metadata": {}}', "index has no weight_map"),
    ("weight-map-list", b'{"weight_map": []}', "weight_map is an array"),
    ("weight-map-empty", b'{"weight_map": {}}', "weight_map is empty"),
    ("shard-slash", b'{"weight_map": {"a": "sub/s.safetensors"}}', "not a plain"),
    ("shard-parent", b'{"weight_map": {"a": "..s.safetensors"}}', "not a plain"),
    ("shard-dotdot-dir", b'{"weight_map": {"a": "../s.safetensors"}}', "not a plain"),
    ("shard-absolute", b'{"weight_map": {"a": "/tmp/s.safetensors"}}', "not a plain"),
    ("shard-backslash", b'{"weight_map": {"a": "..\\\\s.safetensors"}}', "not a plain"),
    ("shard-not-str", b'{"weight_map": {"a": 1}}', "not a plain"),
    ("shard-not-safetensors", b'{"weight_map": {"a": "config.json"}}', "not a plain"),
    ("shard-pickle", b'{"weight_map": {"a": "pytorch_model.bin"}}', "not a plain"),
    ("empty-tensor-name", b'{"weight_map": {"": "s.safetensors"}}', "invalid tensor name"),
]


@pytest.mark.parametrize("content,fragment", [b[1:] for b in BAD_INDEXES],
                         ids=[b[0] for b in BAD_INDEXES])
def test_bad_index(tmp_path, content, fragment):
    d = tmp_path / "ckpt"
    write(d / "config.json", "{}")
    index = write(d / "model.safetensors.index.json", content)
    err = expect(SafetensorsFormatError, fragment, locate_checkpoint, d)
    assert err.message.startswith(f"{index}: ")
    assert err.path == str(index)


# --------------------------------------------------------------------------------------------
# symlinks
# --------------------------------------------------------------------------------------------

def test_symlink_escaping_directory_refused(tmp_path):
    d = make_single(tmp_path / "ckpt")
    outside = tmp_path / "elsewhere.safetensors"
    (d / "model.safetensors").rename(outside)
    os.symlink(outside, d / "model.safetensors")
    err = expect(SourceLayoutError, "leaves the source directory", locate_checkpoint, d)
    assert f"{d / 'model.safetensors'}: symlink to {outside}" in err.message


def test_relative_symlink_escaping_refused(tmp_path):
    d = make_sharded(tmp_path / "ckpt")
    shard = d / "model-00002-of-00002.safetensors"
    shard.rename(tmp_path / "s2.safetensors")
    os.symlink("../s2.safetensors", shard)
    expect(SourceLayoutError, "symlink to ../s2.safetensors leaves the source directory",
           locate_checkpoint, d)


def test_config_symlink_escaping_refused(tmp_path):
    d = make_single(tmp_path / "ckpt")
    (d / "config.json").unlink()
    os.symlink(write(tmp_path / "config.json", "{}"), d / "config.json")
    expect(SourceLayoutError, "config.json: symlink to", locate_checkpoint, d)


def test_dangling_symlink_refused(tmp_path):
    d = make_single(tmp_path / "ckpt")
    (d / "model.safetensors").unlink()
    os.symlink("gone.safetensors", d / "model.safetensors")
    expect(SourceLayoutError, "does not resolve to an existing file", locate_checkpoint, d)


def test_symlink_to_directory_inside_refused(tmp_path):
    d = make_single(tmp_path / "ckpt")
    (d / "sub").mkdir()
    (d / "model.safetensors").unlink()
    os.symlink("sub", d / "model.safetensors")
    expect(SourceLayoutError, "which is not a regular file", locate_checkpoint, d)


def test_symlink_inside_accepted(tmp_path):
    d = make_single(tmp_path / "ckpt")
    (d / "blobs").mkdir()
    (d / "model.safetensors").rename(d / "blobs" / "abc123")
    os.symlink("blobs/abc123", d / "model.safetensors")
    ckpt = read_checkpoint(d)
    assert ckpt.files.weights == (d / "model.safetensors",)
    assert ckpt.tensors["a.weight"].file == d / "model.safetensors"
    assert ckpt.files.ignored == ("blobs",)


def _hf_cache(tmp_path: Path) -> tuple[Path, Path]:
    """A Hugging Face cache repo: blobs/<hash> files and snapshots/<rev>/ relative links."""
    repo = tmp_path / "hub" / "models--deepseek-ai--dspark_test"
    staging = make_sharded(tmp_path / "staging")
    blobs = repo / "blobs"
    blobs.mkdir(parents=True)
    snap = repo / "snapshots" / ("0123456789abcdef" * 2 + "01234567")
    snap.mkdir(parents=True)
    for i, f in enumerate(sorted(staging.iterdir())):
        f.rename(blobs / f"blob{i:02d}")
        os.symlink(f"../../blobs/blob{i:02d}", snap / f.name)
    return repo, snap


def test_hf_cache_snapshot_accepted(tmp_path):
    _, snap = _hf_cache(tmp_path)
    ckpt = read_checkpoint(snap)
    assert len(ckpt.tensors) == 4
    assert ckpt.files.weights[0] == snap / "model-00001-of-00002.safetensors"


def test_blobs_links_refused_outside_a_snapshot(tmp_path):
    repo, snap = _hf_cache(tmp_path)
    # the same links from a directory not named snapshots/<rev> leave the directory
    other = repo / "not_snapshots" / snap.name
    other.parent.mkdir()
    snap.rename(other)
    expect(SourceLayoutError, "leaves the source directory", locate_checkpoint, other)


def test_hf_snapshot_link_outside_blobs_refused(tmp_path):
    repo, snap = _hf_cache(tmp_path)
    (snap / "config.json").unlink()
    write(repo / "config.json", "{}")
    os.symlink("../../config.json", snap / "config.json")
    expect(SourceLayoutError, "leaves the source directory", locate_checkpoint, snap)
