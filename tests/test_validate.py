"""Tests of dspark_convert.commands.validate: `validate_artifact` and `dspark validate`.

Good checkpoints are converted once per module; each test copies an artifact and tampers
with its real bytes. Byte positions come from our own reader (a tensor's absolute
``data_offset``, a key or tensor-info entry found by searching its length-prefixed name),
and files with a specific metadata or tensor-table change are re-written whole with gguf-py's
GGUFWriter (kv and tensors copied from the good file, one thing changed). The manifest's
hashes are then left stale or recomputed, depending on the check a test targets: checks run
in a fixed order (artifact.files, manifest.schema, gguf.structure, gguf.metadata,
gguf.inventory, gguf.values, integrity, engine.*) and each case asserts the *first* failure.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFWriter
from gguf.constants import GGMLQuantizationType, GGUFValueType
from support.cli import assert_refused, run_cli

from dspark_convert.artifact.engines import LLAMA_EXPORT_HINT
from dspark_convert.commands.convert import convert
from dspark_convert.errors import (
    ContractViolation,
    DSparkError,
    EngineRequirementError,
    GeometryLimitError,
    MaskTokenError,
    TargetLayerError,
    GGUFFormatError,
    IntegrityError,
    InvalidArtifactError,
    ManifestError,
    ManifestMismatchError,
    MetadataError,
    MissingTensorError,
    NonFiniteTensorError,
    StrataRuleError,
    TensorDtypeError,
    TensorShapeError,
    UnexpectedTensorError,
)
from dspark_convert.formats.gguf_reader import GGUFFile, read_gguf
from dspark_convert.synthetic import make_synthetic_checkpoint
from dspark_convert.commands.validate import ValidationReport, validate_artifact

VT = GGUFValueType
QT = GGMLQuantizationType

GGUF = "drafter.gguf"
MANIFEST = "manifest.json"
DSPARK = ("reference", "gated", "rnn", "sharded", "f32")
CHECK_ORDER = ("artifact.files", "manifest.schema", "gguf.structure", "gguf.metadata",
               "manifest.format_version",
               "gguf.inventory", "gguf.values", "integrity", "engine.strata.open",
               "engine.strata.run", "engine.llama.cpp")
# What Strata's loader says of a good DSpark artifact: it does not implement the heads yet
# (an info), and nothing else.
DSPARK_REFUSED = "refuses it (unsupported): dflash: this artifact carries DSpark extras"

# A plain DFlash drafter as Strata's current loader reads it (docs/REFERENCE.md §3), plus the
# format's provenance keys (unknown keys are ignored by Strata).
PLAIN_KEYS = [
    "general.architecture", "general.alignment", "general.name",
    "dflash.embedding_length", "dflash.block_count", "dflash.attention.head_count",
    "dflash.attention.head_count_kv", "dflash.attention.key_length",
    "dflash.feed_forward_length", "dflash.vocab_size", "dflash.block_size",
    "dflash.mask_token_id", "dflash.target_layers", "dflash.rope.frequency_base",
    "dflash.attention.layer_norm_rms_epsilon", "dflash.sample_from_anchor",
    "dflash.attention.causal", "dflash.markov_rank", "dflash.has_confidence_head",
    "dflash.target.num_layers", "dflash.source.revision", "dflash.source.sha256",
    "dspark.format_version", "dspark.converter",
]
LAYER_TENSORS = ("attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                 "attn_q_norm", "attn_k_norm", "ffn_gate", "ffn_up", "ffn_down")


# --------------------------------------------------------------------------------------------
# fixtures: convert once per module, copy per test
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def built(tmp_path_factory, converted) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("validate_artifacts")
    sources = {
        "plain": dict(markov_rank=0, enable_confidence_head=False, include_embeddings=False),
        "gated": dict(markov_head_type="gated", seed=1),
        "rnn": dict(markov_head_type="rnn", seed=2, confidence_head_with_markov=False),
        "sharded": dict(shards=3, seed=3),
        "f32": dict(dtype="F32", seed=4),
    }
    out = {}
    for name, kw in sources.items():
        src = make_synthetic_checkpoint(root / "src" / name, **kw)
        convert(src, root / name)
        out[name] = root / name
    out["reference"] = converted["reference"]   # the session's (``artifact`` copies before editing)
    return out


@pytest.fixture
def artifact(built, tmp_path):
    """artifact(name) -> a private copy of a good artifact."""
    def copy(name: str = "reference") -> Path:
        dst = tmp_path / name
        shutil.copytree(built[name], dst)
        return dst
    return copy


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------

def check(report: ValidationReport, name: str):
    found = [c for c in report.checks if c.name == name]
    assert len(found) == 1, f"expected one check {name!r}: {[c.name for c in report.checks]}"
    return found[0]


def assert_fails(report: ValidationReport, name: str, error: type[DSparkError], *fragments: str):
    """The first failure is check ``name`` with ``error``'s class and exit code, and its
    detail holds every fragment."""
    assert isinstance(report, ValidationReport)
    assert report.ok is False
    first = report.first_failure
    assert first is not None, report.checks
    assert (first.name, first.status, first.error) == (name, "failed", error.__name__), \
        f"{first!r}\nall: {report.checks!r}"
    assert first.exit_code == error.exit_code
    assert report.exit_code() == error.exit_code
    assert report.exit_code(strict=True) == error.exit_code
    assert report.failed >= 1
    # Fragments are matched with the temporary directory (which holds the test's name)
    # taken out of the detail, so that a fragment cannot match the path by accident.
    detail = first.detail.replace(str(Path(report.artifact).parent), "<tmp>")
    for fragment in fragments:
        assert fragment in detail, f"{fragment!r} not in {detail!r}"
    # The detail is one line (the CLI prints it as one `error:` line).
    assert "\n" not in first.detail
    return first


def gguf_of(art: Path) -> GGUFFile:
    return read_gguf(art / GGUF)


def patch(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(data)


def read_at(path: Path, offset: int, n: int) -> bytes:
    with open(path, "rb") as fh:
        fh.seek(offset)
        return fh.read(n)


def _find_unique(buf: bytes, needle: bytes, end: int) -> int:
    at = buf.find(needle, 0, end)
    assert at >= 0, needle
    assert buf.find(needle, at + 1, end) < 0, f"{needle!r} is not unique"
    return at


def key_value_offset(art: Path, key: str) -> tuple[int, int]:
    """(offset of the u32 value type, offset of the value) of metadata ``key``."""
    g = gguf_of(art)
    buf = (art / GGUF).read_bytes()
    raw = key.encode()
    at = _find_unique(buf, struct.pack("<Q", len(raw)) + raw, g.data_start)
    type_at = at + 8 + len(raw)
    return type_at, type_at + 4


def tensor_info_offset_field(art: Path, name: str) -> int:
    """Offset of the u64 data offset of tensor ``name`` in the tensor-info table."""
    g = gguf_of(art)
    info = next(t for t in g.tensors if t.name == name)
    buf = (art / GGUF).read_bytes()
    raw = name.encode()
    at = _find_unique(buf, struct.pack("<Q", len(raw)) + raw, g.data_start)
    field = at + 8 + len(raw) + 4 + 8 * len(info.shape) + 4
    assert struct.unpack_from("<Q", buf, field)[0] == info.offset  # located the right field
    return field


def element_offset(art: Path, tensor: str, index: int = 0) -> int:
    info = next(t for t in gguf_of(art).tensors if t.name == tensor)
    assert info.ggml_type.name == "BF16" and 2 * index < info.nbytes
    return info.data_offset + 2 * index


def load_manifest(art: Path) -> dict:
    return json.loads((art / MANIFEST).read_text())


def save_manifest(art: Path, data: dict) -> None:
    (art / MANIFEST).write_text(json.dumps(data, indent=2) + "\n")


def refresh_manifest(art: Path, *, tensors: bool = False) -> None:
    """Record the current drafter.gguf's size and SHA-256 in the manifest (and, with
    ``tensors``, every tensor's SHA-256), so that the integrity check gets past them."""
    path = art / GGUF
    data = load_manifest(art)
    data["artifact"]["size"] = path.stat().st_size
    data["artifact"]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    if tensors:
        g = read_gguf(path)
        buf = path.read_bytes()
        digests = {t.name: hashlib.sha256(buf[t.data_offset:t.data_offset + t.nbytes]).hexdigest()
                   for t in g.tensors}
        for record in data["artifact"]["tensors"]:
            record["sha256"] = digests[record["name"]]
    save_manifest(art, data)


def rewrite_gguf(art: Path, *, kv=None, tensors=None, arch: str = "dflash",
                 alignment: int = 32) -> None:
    """Re-write drafter.gguf with GGUFWriter from the good file's kv and tensors.

    ``kv(list of [key, type, sub_type, value]) -> list`` and
    ``tensors(list of [name, ndarray (torch order), raw_dtype]) -> list`` edit the copies.
    BF16 tensors are uint16 bit arrays, written raw."""
    path = art / GGUF
    g = read_gguf(path)
    buf = path.read_bytes()
    items = [[k, v.type, v.sub_type, v.value] for k, v in g.kv.items()
             if k != "general.architecture"]
    arrays = []
    for t in g.tensors:
        assert t.ggml_type == QT.BF16
        bits = np.frombuffer(buf[t.data_offset:t.data_offset + t.nbytes], dtype="<u2")
        arrays.append([t.name, bits.reshape(tuple(reversed(t.shape))).copy(), QT.BF16])
    if kv is not None:
        items = kv(items)
    if tensors is not None:
        arrays = tensors(arrays)
    tmp = path.with_suffix(".tmp")
    writer = GGUFWriter(tmp, arch)
    writer.data_alignment = alignment
    for key, vtype, sub_type, value in items:
        writer.add_key_value(key, value, vtype, sub_type=sub_type)
    for name, array, raw_dtype in arrays:
        writer.add_tensor(name, array, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, path)


def set_kv(key: str, vtype, value, sub_type=None):
    def edit(items):
        for item in items:
            if item[0] == key:
                item[1:] = [vtype, sub_type, value]
                return items
        raise AssertionError(key)
    return edit


def drop_kv(key: str):
    def edit(items):
        assert any(i[0] == key for i in items), key
        return [i for i in items if i[0] != key]
    return edit


def add_kv(key: str, vtype, value, sub_type=None):
    return lambda items: items + [[key, vtype, sub_type, value]]


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


# --------------------------------------------------------------------------------------------
# good artifacts
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ("plain",) + DSPARK)
def test_good_artifact_validates(artifact, name):
    art = artifact(name)
    report = validate_artifact(art)
    assert report.ok is True, report.first_failure
    assert report.failed == 0 and report.first_failure is None
    assert report.artifact == str(art)
    names = [c.name for c in report.checks]
    assert names[:len(CHECK_ORDER)] == list(CHECK_ORDER)
    assert all(c.status in ("passed", "info") for c in report.checks)
    assert all(c.error is None and c.exit_code is None for c in report.checks)
    assert report.exit_code() == 0
    assert report.warnings == 0
    infos = [c.name for c in report.checks if c.status == "info"]
    if name == "plain":
        # opened by Strata; run only at the Flash-Next shape; llama.cpp reads its own format
        assert check(report, "engine.strata.open").status == "passed"
        assert infos == ["engine.strata.run", "engine.llama.cpp"]
    else:
        # Today's loader refuses DSpark heads: worth saying, not a risk, so --strict passes.
        assert infos == ["engine.strata.open", "engine.strata.run", "engine.llama.cpp"]
        assert DSPARK_REFUSED in check(report, "engine.strata.open").detail
    assert report.engines is not None and list(report.engines) == ["strata.open", "strata.run",
                                                                    "llama.cpp"]
    assert report.exit_code(strict=True) == 0


def test_validate_is_read_only(artifact):
    art = artifact("reference")
    before = {p.name: p.read_bytes() for p in art.iterdir()}
    validate_artifact(art)
    assert {p.name: p.read_bytes() for p in art.iterdir()} == before


def test_f32_source_is_recorded_as_rounded(artifact):
    data = load_manifest(artifact("f32"))
    assert data["source"]["dtype"] == "F32" and data["source"]["rounded_to_bf16"] is True
    assert {t["type"] for t in data["artifact"]["tensors"]} == {"BF16"}


def test_rewrite_helper_round_trips_byte_for_byte(artifact):
    """The GGUFWriter re-write used below reproduces a good file exactly, so each edit
    changes only what the test means to change."""
    art = artifact("reference")
    before = (art / GGUF).read_bytes()
    rewrite_gguf(art)
    assert (art / GGUF).read_bytes() == before
    assert validate_artifact(art).ok


def test_plain_dflash_is_what_strata_loads_today(artifact):
    art = artifact("plain")
    g = gguf_of(art)
    kv = {k: v.value for k, v in g.kv.items()}
    assert list(kv) == PLAIN_KEYS
    assert kv["general.architecture"] == "dflash"
    assert kv["general.alignment"] == 32 and g.alignment == 32
    assert kv["dflash.markov_rank"] == 0
    assert kv["dflash.has_confidence_head"] == "false"
    assert kv["dflash.sample_from_anchor"] == "true" and kv["dflash.attention.causal"] == "false"
    assert not any("markov_head_type" in k or "confidence_head_with" in k or "selector" in k
                   for k in kv)
    for key in ("dflash.embedding_length", "dflash.block_count", "dflash.attention.head_count",
                "dflash.attention.head_count_kv", "dflash.feed_forward_length",
                "dflash.vocab_size", "dflash.block_size"):
        assert g.kv[key].type == VT.UINT32 and kv[key] > 0, key
    assert kv["dflash.block_count"] <= 64 and kv["dflash.block_size"] <= 128
    taps = g.kv["dflash.target_layers"]
    assert (taps.type, taps.sub_type, taps.value) == (VT.ARRAY, VT.UINT32, [0, 2, 4])
    assert g.kv["dflash.rope.frequency_base"].type == VT.FLOAT64

    # Tensors: exactly Strata's names, in the format's order, BF16, GGUF shapes [in, out].
    H, I, nh, nkv, d, taps_n = 32, 64, 4, 2, 8, 3
    shapes = {"attn_norm": [H], "ffn_norm": [H], "attn_q": [H, nh * d], "attn_k": [H, nkv * d],
              "attn_v": [H, nkv * d], "attn_output": [nh * d, H], "attn_q_norm": [d],
              "attn_k_norm": [d], "ffn_gate": [H, I], "ffn_up": [H, I], "ffn_down": [I, H]}
    expected = [("fc.weight", [taps_n * H, H]), ("enc.output_norm.weight", [H]),
                ("output_norm.weight", [H])]
    for n in range(kv["dflash.block_count"]):
        expected += [(f"blk.{n}.{t}.weight", shapes[t]) for t in LAYER_TENSORS]
    assert [(t.name, list(t.shape)) for t in g.tensors] == expected
    assert {t.ggml_type for t in g.tensors} == {QT.BF16}
    names = {t.name for t in g.tensors}
    assert not names & {"token_embd.weight", "output.weight"}
    assert not any(p in n for n in names for p in ("markov", "conf_proj", "selector", "d2t"))

    # Cross-check with gguf-py's reader.
    reader = GGUFReader(art / GGUF)
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert list(fields) == PLAIN_KEYS
    for key, field in fields.items():
        assert field.types[0] == g.kv[key].type, key
        assert field.contents() == kv[key] or key == "dflash.attention.layer_norm_rms_epsilon", key
    assert fields["dflash.target_layers"].types == [VT.ARRAY, VT.UINT32]
    assert [(t.name, t.tensor_type, [int(x) for x in t.shape]) for t in reader.tensors] == \
        [(n, QT.BF16, s) for n, s in expected]
    buf = (art / GGUF).read_bytes()
    for ours, theirs in zip(g.tensors, reader.tensors):
        assert theirs.data_offset == ours.data_offset
        assert bytes(theirs.data.tobytes()) == buf[ours.data_offset:ours.data_offset + ours.nbytes]


def test_extra_file_is_a_warning_and_fails_strict(artifact):
    art = artifact("plain")
    (art / "notes.txt").write_text("hi")
    report = validate_artifact(art)
    assert report.ok is True
    files = check(report, "artifact.files")
    assert files.status == "warning" and "notes.txt" in files.detail
    assert report.exit_code() == 0 and report.exit_code(strict=True) == 45


# --------------------------------------------------------------------------------------------
# tensor bytes
# --------------------------------------------------------------------------------------------

def _flip_low_mantissa_bit(art: Path, tensor: str, index: int) -> None:
    at = element_offset(art, tensor, index)
    lo = read_at(art / GGUF, at, 1)[0]
    patch(art / GGUF, at, bytes([lo ^ 0x01]))  # little-endian: bit 0 of the mantissa


@pytest.mark.parametrize("tensor", ["fc.weight", "blk.1.ffn_down.weight", "conf_proj.bias",
                                    "markov_w2.weight"])
def test_flipped_byte_names_the_tensor_when_file_hash_is_refreshed(artifact, tensor):
    art = artifact("reference")
    _flip_low_mantissa_bit(art, tensor, 3 if tensor != "conf_proj.bias" else 0)
    refresh_manifest(art)  # file size and SHA agree; the per-tensor SHA does not
    report = validate_artifact(art)
    assert check(report, "gguf.values").status == "passed"  # still finite
    assert_fails(report, "integrity", IntegrityError, f"tensor '{tensor}'", "SHA-256",
                 "manifest.json records")


def test_flipped_byte_fails_integrity(artifact):
    art = artifact("reference")
    _flip_low_mantissa_bit(art, "blk.0.attn_q.weight", 10)
    report = validate_artifact(art)
    assert check(report, "gguf.values").status == "passed"
    assert_fails(report, "integrity", IntegrityError, "drafter.gguf", "SHA-256",
                 "manifest.json records")


def test_flipped_byte_without_manifest_edit_names_the_tensor(artifact):
    art = artifact("reference")
    _flip_low_mantissa_bit(art, "blk.0.attn_q.weight", 10)
    assert_fails(validate_artifact(art), "integrity", IntegrityError, "'blk.0.attn_q.weight'")


@pytest.mark.parametrize("tensor,index,bits", [
    ("blk.0.attn_k.weight", 5, 0x7FC0),       # NaN
    ("output_norm.weight", 0, 0x7F80),        # +inf
    ("markov_w1.weight", 17, 0xFF80),         # -inf
    ("fc.weight", 0, 0xFFC1),                 # negative NaN with payload
])
def test_non_finite_value(artifact, tensor, index, bits):
    art = artifact("reference")
    patch(art / GGUF, element_offset(art, tensor, index), struct.pack("<H", bits))
    report = validate_artifact(art)
    assert_fails(report, "gguf.values", NonFiniteTensorError, f"tensor '{tensor}'",
                 f"element {index}")
    # The same single read hashed the file: the changed tensor is named by integrity too.
    integrity = check(report, "integrity")
    assert integrity.status == "failed" and integrity.error == "IntegrityError"
    assert f"tensor '{tensor}'" in integrity.detail


def test_non_finite_value_in_plain_dflash(artifact):
    art = artifact("plain")
    patch(art / GGUF, element_offset(art, "blk.1.attn_v.weight", 7), struct.pack("<H", 0x7FC0))
    assert_fails(validate_artifact(art), "gguf.values", NonFiniteTensorError,
                 "'blk.1.attn_v.weight'", "element 7")


# --------------------------------------------------------------------------------------------
# GGUF structure
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["data", "last_tensor", "tensor_info", "kv", "magic", "empty"])
def test_truncated_gguf(artifact, where):
    art = artifact("reference")
    g = gguf_of(art)
    size = {"data": g.tensors[3].data_offset + 5, "last_tensor": g.file_size - 40,
            "tensor_info": g.data_start - 200, "kv": 100, "magic": 3, "empty": 0}[where]
    os.truncate(art / GGUF, size)
    report = validate_artifact(art)
    # A cut in the header is "truncated"; a cut in the data leaves a tensor spanning past
    # the end of the file.
    fragment = "file ends at byte" if where in ("data", "last_tensor") else "truncated at byte"
    first = assert_fails(report, "gguf.structure", GGUFFormatError, "drafter.gguf", fragment,
                         f"byte {size}")
    # Nothing after an unreadable structure runs.
    assert report.checks[-1] is first


def test_truncated_in_data_names_a_tensor(artifact):
    art = artifact("reference")
    g = gguf_of(art)
    os.truncate(art / GGUF, g.tensors[3].data_offset + 5)
    first = assert_fails(validate_artifact(art), "gguf.structure", GGUFFormatError)
    assert f"'{g.tensors[3].name}'" in first.detail, first.detail


def test_trailing_garbage(artifact):
    art = artifact("reference")
    with open(art / GGUF, "ab") as fh:
        fh.write(b"\0" * 64)
    assert_fails(validate_artifact(art), "gguf.structure", GGUFFormatError, "trailing garbage")


def test_tensor_offset_out_of_range(artifact):
    art = artifact("reference")
    field = tensor_info_offset_field(art, "blk.1.attn_q.weight")
    patch(art / GGUF, field, struct.pack("<Q", 1 << 40))
    assert_fails(validate_artifact(art), "gguf.structure", GGUFFormatError,
                 "'blk.1.attn_q.weight'", "file ends")


def test_tensor_offset_overflowing_u64(artifact):
    art = artifact("reference")
    field = tensor_info_offset_field(art, "fc.weight")
    patch(art / GGUF, field, struct.pack("<Q", 2**64 - 32))
    assert_fails(validate_artifact(art), "gguf.structure", GGUFFormatError, "'fc.weight'")


def test_tensor_offset_unaligned(artifact):
    art = artifact("reference")
    g = gguf_of(art)
    info = next(t for t in g.tensors if t.name == "output_norm.weight")
    patch(art / GGUF, tensor_info_offset_field(art, info.name), struct.pack("<Q", info.offset + 2))
    assert_fails(validate_artifact(art), "gguf.structure", GGUFFormatError,
                 "'output_norm.weight'", "not aligned")


def test_tensors_overlapping(artifact):
    art = artifact("reference")
    g = gguf_of(art)
    first = next(t for t in g.tensors if t.name == "enc.output_norm.weight")
    patch(art / GGUF, tensor_info_offset_field(art, "output_norm.weight"),
          struct.pack("<Q", first.offset))
    assert_fails(validate_artifact(art), "gguf.structure", GGUFFormatError,
                 "'output_norm.weight'", "overlaps", "'enc.output_norm.weight'")


def test_tensors_overlapping_partially(artifact):
    art = artifact("reference")
    g = gguf_of(art)
    fc = g.tensors[0]
    assert fc.name == "fc.weight" and fc.nbytes > 64
    patch(art / GGUF, tensor_info_offset_field(art, "blk.0.attn_q.weight"),
          struct.pack("<Q", fc.offset + 32))
    assert_fails(validate_artifact(art), "gguf.structure", GGUFFormatError,
                 "'blk.0.attn_q.weight'", "overlaps", "'fc.weight'")


def test_tensor_offsets_swapped(artifact):
    """Two same-size tensors with swapped offsets: in range and non-overlapping, but not the
    canonical packed layout (and their bytes are each other's)."""
    art = artifact("reference")
    g = gguf_of(art)
    a, b = (next(t for t in g.tensors if t.name == n)
            for n in ("enc.output_norm.weight", "output_norm.weight"))
    assert a.nbytes == b.nbytes
    field_a, field_b = (tensor_info_offset_field(art, t.name) for t in (a, b))
    patch(art / GGUF, field_a, struct.pack("<Q", b.offset))
    patch(art / GGUF, field_b, struct.pack("<Q", a.offset))
    assert_fails(validate_artifact(art), "gguf.structure", GGUFFormatError,
                 "'enc.output_norm.weight'", f"data offset {b.offset}", f"expected {a.offset}")


def test_bad_magic_and_version(artifact):
    art = artifact("reference")
    patch(art / GGUF, 0, b"GGUG")
    assert_fails(validate_artifact(art), "gguf.structure", GGUFFormatError, "magic")
    art2 = artifact("plain")
    patch(art2 / GGUF, 4, struct.pack("<I", 2))
    assert_fails(validate_artifact(art2), "gguf.structure", GGUFFormatError, "version")


def test_alignment_other_than_32_written_consistently(artifact):
    """A well-formed GGUF laid out with alignment 16: readable, but not the format."""
    art = artifact("reference")
    rewrite_gguf(art, kv=set_kv("general.alignment", VT.UINT32, 16), alignment=16)
    assert gguf_of(art).alignment == 16
    assert_fails(validate_artifact(art), "gguf.structure", GGUFFormatError,
                 "alignment is 16; expected 32")


def test_alignment_patched_in_place(artifact):
    """general.alignment patched 32 -> 16 without moving any byte: the data section now
    starts elsewhere, which the reader reports (as trailing bytes, not by naming the key)."""
    art = artifact("reference")
    _type_at, value_at = key_value_offset(art, "general.alignment")
    assert read_at(art / GGUF, value_at, 4) == struct.pack("<I", 32)
    patch(art / GGUF, value_at, struct.pack("<I", 16))
    assert_fails(validate_artifact(art), "gguf.structure", GGUFFormatError, "drafter.gguf")


def test_tensor_ggml_type_patched_to_f16(artifact):
    """The tensor-info type field patched BF16 -> F16 (same size): the layout still parses,
    the inventory refuses the type."""
    art = artifact("reference")
    field = tensor_info_offset_field(art, "blk.0.attn_q.weight")
    type_at = field - 4
    assert read_at(art / GGUF, type_at, 4) == struct.pack("<I", int(QT.BF16))
    patch(art / GGUF, type_at, struct.pack("<I", int(QT.F16)))
    report = validate_artifact(art)
    assert_fails(report, "gguf.inventory", TensorDtypeError, "'blk.0.attn_q.weight'", "BF16",
                 "F16")
    loader = check(report, "engine.strata.open")
    assert loader.status == "failed" and "'blk.0.attn_q.weight' is F16" in loader.detail


# --------------------------------------------------------------------------------------------
# metadata
# --------------------------------------------------------------------------------------------

def test_metadata_type_patched_in_place_uint32_to_int32(artifact):
    """Same 4 value bytes, only the u32 type field changes: UINT32 (4) -> INT32 (5)."""
    art = artifact("reference")
    type_at, value_at = key_value_offset(art, "dflash.block_size")
    assert read_at(art / GGUF, type_at, 8) == struct.pack("<II", int(VT.UINT32), 7)
    patch(art / GGUF, type_at, struct.pack("<I", int(VT.INT32)))
    report = validate_artifact(art)
    assert_fails(report, "gguf.metadata", MetadataError, "'dflash.block_size'",
                 "expected type UINT32", "found INT32")
    # Strata's loader takes any integer type: only the DSpark heads are refused.
    loader = check(report, "engine.strata.open")
    assert loader.status == "info" and DSPARK_REFUSED in loader.detail


@pytest.mark.parametrize("key,vtype,value,sub,found", [
    ("dflash.block_size", VT.UINT64, 7, None, "UINT64"),
    ("dflash.block_size", VT.INT32, 7, None, "INT32"),
    ("dflash.embedding_length", VT.UINT16, 64, None, "UINT16"),
    ("dflash.rope.frequency_base", VT.FLOAT32, 1000000.0, None, "FLOAT32"),
    ("dflash.attention.layer_norm_rms_epsilon", VT.FLOAT64, 1e-6, None, "FLOAT64"),
    ("dflash.target_layers", VT.ARRAY, [0, 2, 4], VT.INT32, "ARRAY[INT32]"),
    ("dflash.target_layers", VT.ARRAY, [0, 2, 4], VT.UINT64, "ARRAY[UINT64]"),
    ("dflash.target_layers", VT.UINT32, 0, None, "UINT32"),
    ("dflash.has_confidence_head", VT.BOOL, True, None, "BOOL"),
    ("dflash.markov_rank", VT.STRING, "16", None, "STRING"),
    ("general.alignment", VT.UINT64, 32, None, "UINT64"),
])
def test_metadata_key_of_the_wrong_type(artifact, key, vtype, value, sub, found):
    art = artifact("reference")
    rewrite_gguf(art, kv=set_kv(key, vtype, value, sub))
    report = validate_artifact(art)
    if key == "general.alignment":
        # The reader needs alignment to place tensors: it is refused as structure.
        assert_fails(report, "gguf.structure", GGUFFormatError, "general.alignment", found)
        return
    assert_fails(report, "gguf.metadata", MetadataError, f"'{key}'", f"found {found}")


def test_target_layers_int32_array_is_ok_for_strata_but_not_the_format(artifact):
    art = artifact("plain")
    rewrite_gguf(art, kv=set_kv("dflash.target_layers", VT.ARRAY, [0, 2, 4], VT.INT32))
    report = validate_artifact(art)
    assert_fails(report, "gguf.metadata", MetadataError, "'dflash.target_layers'",
                 "ARRAY[UINT32]", "ARRAY[INT32]")
    assert check(report, "engine.strata.open").status == "passed"
    assert check(report, "gguf.inventory").status == "skipped"


@pytest.mark.parametrize("key,value", [
    ("dflash.has_confidence_head", "yes"),
    ("dflash.has_confidence_head", "1"),
    ("dflash.confidence_head_with_markov", "True"),
    ("dflash.sample_from_anchor", "yes"),
    ("dflash.attention.causal", "no"),
])
def test_flag_not_true_or_false(artifact, key, value):
    art = artifact("reference")
    rewrite_gguf(art, kv=set_kv(key, VT.STRING, value))
    assert_fails(validate_artifact(art), "gguf.metadata", MetadataError, f"'{key}'",
                 repr(value))


def test_causal_true_fails_metadata_and_strata(artifact):
    art = artifact("plain")
    rewrite_gguf(art, kv=set_kv("dflash.attention.causal", VT.STRING, "true"))
    report = validate_artifact(art)
    first = assert_fails(report, "gguf.metadata", MetadataError)
    assert "causal" in first.detail
    loader = check(report, "engine.strata.open")
    assert loader.status == "failed" and loader.error == "StrataRuleError"
    assert loader.exit_code == StrataRuleError.exit_code
    assert "declares causal block attention" in loader.detail


def test_sample_from_anchor_false_fails_metadata_and_strata(artifact):
    art = artifact("plain")
    rewrite_gguf(art, kv=set_kv("dflash.sample_from_anchor", VT.STRING, "false"))
    report = validate_artifact(art)
    first = assert_fails(report, "gguf.metadata", MetadataError)
    assert "anchor" in first.detail
    loader = check(report, "engine.strata.open")
    assert loader.status == "failed" and "generic 1+N fill-in layout" in loader.detail


@pytest.mark.parametrize("key,vtype,value", [
    ("dflash.selector_top_k", VT.UINT32, 4),
    ("general.file_type", VT.UINT32, 32),
    ("dflash.context_length", VT.UINT32, 4096),
    ("dspark.note", VT.STRING, "hello"),
])
def test_unknown_extra_key(artifact, key, vtype, value):
    art = artifact("plain")
    rewrite_gguf(art, kv=add_kv(key, vtype, value))
    report = validate_artifact(art)
    # dflash.selector_top_k is a DFlash2 artifact's key (format version 3), not a DSpark one's.
    why = ("should not be present here" if key == "dflash.selector_top_k"
           else "not part of the format")
    assert_fails(report, "gguf.metadata", MetadataError, f"'{key}'", why)
    loader = check(report, "engine.strata.open")
    if key == "dflash.selector_top_k":
        # DFlash2 is out of Strata's scope: unsupported, as DSpark heads are
        assert loader.status == "info" and "DFlash2 selector" in loader.detail
    else:
        assert loader.status == "passed"  # Strata ignores unknown keys


@pytest.mark.parametrize("key", ["dflash.mask_token_id", "dflash.block_size", "dflash.target_layers",
                                 "dflash.source.sha256", "dspark.format_version",
                                 "dflash.markov_head_type", "dflash.confidence_head_with_markov",
                                 "general.name"])
def test_missing_required_key(artifact, key):
    art = artifact("reference")
    rewrite_gguf(art, kv=drop_kv(key))
    report = validate_artifact(art)
    assert_fails(report, "gguf.metadata", MetadataError, f"'{key}'", "missing")
    loader = check(report, "engine.strata.open")
    if key in ("dflash.block_size", "dflash.target_layers"):
        assert loader.status == "failed" and f"dflash: missing {'metadata key ' * (key == 'dflash.block_size')}{key}" in loader.detail
    else:
        assert loader.status == "info" and DSPARK_REFUSED in loader.detail


def test_markov_head_type_for_plain_dflash_is_unexpected(artifact):
    art = artifact("plain")
    rewrite_gguf(art, kv=add_kv("dflash.markov_head_type", VT.STRING, "vanilla"))
    assert_fails(validate_artifact(art), "gguf.metadata", MetadataError,
                 "'dflash.markov_head_type'", "should not be present")


@pytest.mark.parametrize("key,vtype,value,fragment", [
    ("dflash.markov_head_type", VT.STRING, "lstm", "'lstm'"),
    ("dflash.source.sha256", VT.STRING, "ABC", "'dflash.source.sha256'"),
    ("dflash.source.revision", VT.STRING, "main", "'dflash.source.revision'"),
    ("dspark.converter", VT.STRING, "someone-else 1.0", "'dspark.converter'"),
    ("dspark.format_version", VT.UINT32, 2, "'dspark.format_version'"),
    ("general.architecture", VT.STRING, "llama", "'general.architecture'"),
])
def test_metadata_bad_value(artifact, key, vtype, value, fragment):
    art = artifact("reference")
    if key == "general.architecture":
        rewrite_gguf(art, arch=value)
    else:
        rewrite_gguf(art, kv=set_kv(key, vtype, value))
    report = validate_artifact(art)
    assert_fails(report, "gguf.metadata", MetadataError, fragment)
    if key == "general.architecture":
        loader = check(report, "engine.strata.open")
        assert loader.status == "failed" and "general.architecture is 'llama'" in loader.detail


def test_optional_provenance_key_dropped(artifact):
    """dflash.target.embed_sha256 is optional in the format (absent when the source has no
    embedding), so the GGUF alone is valid; the manifest records the stripped embedding."""
    art = artifact("reference")
    rewrite_gguf(art, kv=drop_kv("dflash.target.embed_sha256"))
    refresh_manifest(art)
    report = validate_artifact(art)
    assert check(report, "gguf.metadata").status == "passed"
    assert_fails(report, "integrity", ManifestMismatchError, "'dflash.target.embed_sha256'",
                 "missing", "manifest.json")


# Metadata values of the right type that break a contract rule when the contract is rebuilt
# from them: (key, u32 or f64/f32 format, value, error class, fragment of the detail).
CONTRACT_RULE_EDITS = [
    ("dflash.block_size", "<I", 200, GeometryLimitError, "200"),
    ("dflash.block_count", "<I", 65, GeometryLimitError, "65"),
    ("dflash.mask_token_id", "<I", 600, MaskTokenError, "600"),
    ("dflash.embedding_length", "<I", 0, GeometryLimitError, "found 0"),
    ("dflash.attention.head_count", "<I", 3, GeometryLimitError, "(3)"),
    ("dflash.target.num_layers", "<I", 4, TargetLayerError, "num_target_layers = 4"),
    ("dflash.rope.frequency_base", "<d", float("nan"), GeometryLimitError, "nan"),
    ("dflash.attention.layer_norm_rms_epsilon", "<f", float("inf"), GeometryLimitError, "inf"),
]


def test_markov_rank_zeroed_leaves_an_orphan_head_type_key(artifact):
    """markov_rank patched to 0 in a DSpark artifact: the Markov head type key is now one
    the format forbids, a metadata error naming both."""
    art = artifact("reference")
    _patch_value(art, "dflash.markov_rank", "<I", 0)
    assert_fails(validate_artifact(art), "gguf.metadata", MetadataError,
                 "'dflash.markov_head_type'", "markov_rank is 0")


def _patch_value(art: Path, key: str, fmt: str, value) -> None:
    _type_at, value_at = key_value_offset(art, key)
    patch(art / GGUF, value_at, struct.pack(fmt, value))


@pytest.mark.parametrize("key,fmt,value,error,fragment", CONTRACT_RULE_EDITS,
                         ids=[e[0] for e in CONTRACT_RULE_EDITS])
def test_metadata_value_breaking_a_contract_rule(artifact, key, fmt, value, error, fragment):
    """The contract rules are re-applied to the metadata; the failure carries the rule's
    own class (a contract error, exit 16-19) under the gguf.metadata check."""
    art = artifact("reference")
    _patch_value(art, key, fmt, value)
    report = validate_artifact(art)
    assert issubclass(error, ContractViolation)
    first = assert_fails(report, "gguf.metadata", error, fragment)
    assert first.detail.startswith("drafter.gguf")
    if key in ("dflash.block_size", "dflash.block_count"):
        loader = check(report, "engine.strata.open")
        field = {"dflash.block_size": "block_size", "dflash.block_count": "layers"}[key]
        assert loader.status == "failed" and "implausible geometry" in loader.detail
        assert f" {field}={value}" in loader.detail


@pytest.mark.parametrize("key,fmt,value", [("dflash.block_count", "<I", 65),
                                           ("dflash.embedding_length", "<I", 0)])
def test_metadata_value_breaking_a_contract_rule_names_the_key(artifact, key, fmt, value):
    art = artifact("reference")
    _patch_value(art, key, fmt, value)
    first = validate_artifact(art).first_failure
    assert f"'{key}'" in first.detail, first.detail


@pytest.mark.parametrize("key,value,fragment", [
    ("dflash.mask_token_id", 499, "'dflash.mask_token_id'"),
    ("dflash.block_size", 8, "'dflash.block_size'"),
    ("dflash.rope.frequency_base", 500000.0, "'dflash.rope.frequency_base'"),
])
def test_metadata_edited_consistently_but_not_in_manifest(artifact, key, value, fragment):
    """A valid, self-consistent GGUF whose metadata no longer matches the manifest: the
    failing check names the key."""
    art = artifact("reference")
    vtype = VT.FLOAT64 if isinstance(value, float) else VT.UINT32
    rewrite_gguf(art, kv=set_kv(key, vtype, value))
    refresh_manifest(art)  # file SHA and size agree; tensors unchanged
    report = validate_artifact(art)
    for name in ("gguf.structure", "gguf.metadata", "gguf.inventory", "gguf.values"):
        assert check(report, name).status == "passed", check(report, name)
    assert_fails(report, "integrity", ManifestMismatchError, fragment, str(value))


def test_metadata_edit_in_place_with_stale_manifest(artifact):
    """Patching a value in place without touching the manifest is caught by the file SHA."""
    art = artifact("reference")
    _type_at, value_at = key_value_offset(art, "dflash.mask_token_id")
    patch(art / GGUF, value_at, struct.pack("<I", 499))
    report = validate_artifact(art)
    assert check(report, "gguf.metadata").status == "passed"
    assert_fails(report, "integrity", IntegrityError, "SHA-256")


# --------------------------------------------------------------------------------------------
# tensor inventory
# --------------------------------------------------------------------------------------------

def _edit_tensor(name: str, fn):
    def edit(arrays):
        for item in arrays:
            if item[0] == name:
                fn(item)
                return arrays
        raise AssertionError(name)
    return edit


def test_tensor_order_swapped(artifact):
    art = artifact("reference")

    def swap(arrays):
        arrays[1], arrays[2] = arrays[2], arrays[1]
        return arrays
    rewrite_gguf(art, tensors=swap)
    report = validate_artifact(art)
    assert_fails(report, "gguf.inventory", UnexpectedTensorError, "tensor 1",
                 "'output_norm.weight'", "expected 'enc.output_norm.weight'", "order")
    assert check(report, "engine.strata.open").status == "info"  # Strata reads by name


def test_tensor_wrong_shape_transposed(artifact):
    art = artifact("reference")

    def transpose(item):
        item[1] = np.ascontiguousarray(item[1].T)
    rewrite_gguf(art, tensors=_edit_tensor("fc.weight", transpose))
    report = validate_artifact(art)
    assert_fails(report, "gguf.inventory", TensorShapeError, "'fc.weight'",
                 "expected GGUF shape [192, 64]", "found [64, 192]")


def test_tensor_wrong_shape_norm(artifact):
    art = artifact("plain")

    def shorten(item):
        item[1] = item[1][:16].copy()
    rewrite_gguf(art, tensors=_edit_tensor("blk.1.ffn_norm.weight", shorten))
    assert_fails(validate_artifact(art), "gguf.inventory", TensorShapeError,
                 "'blk.1.ffn_norm.weight'", "[32]", "[16]")


@pytest.mark.parametrize("tensor,strata_fragment", [
    (name, f"tensor '{name}' is F32; expected BF16 norms and BF16, Q8_0, Q5_0 or Q4_0 matrices")
    for name in ("output_norm.weight", "blk.0.attn_q_norm.weight", "blk.1.ffn_up.weight")
])
def test_tensor_f32_instead_of_bf16(artifact, tensor, strata_fragment):
    art = artifact("plain")

    def to_f32(item):
        item[1], item[2] = bf16_to_f32(item[1]), None
    rewrite_gguf(art, tensors=_edit_tensor(tensor, to_f32))
    assert next(t for t in gguf_of(art).tensors if t.name == tensor).ggml_type == QT.F32
    report = validate_artifact(art)
    assert_fails(report, "gguf.inventory", TensorDtypeError, f"'{tensor}'",
                 "expected type BF16", "found F32")
    loader = check(report, "engine.strata.open")
    assert loader.status == "failed" and loader.error == "StrataRuleError"
    assert strata_fragment in loader.detail


@pytest.mark.parametrize("name", ["token_embd.weight", "output.weight"])
def test_extra_embedding_or_head_tensor(artifact, name):
    art = artifact("plain")
    vocab, hidden = 256, 32
    bits = np.full((vocab, hidden), 0x3F80, dtype=np.uint16)  # 1.0
    rewrite_gguf(art, tensors=lambda arrays: arrays + [[name, bits, QT.BF16]])
    report = validate_artifact(art)
    assert_fails(report, "gguf.inventory", UnexpectedTensorError, f"'{name}'",
                 "not part of the contract")
    loader = check(report, "engine.strata.open")
    assert loader.status == "failed"
    assert f"the artifact ships its own '{name}'" in loader.detail


def test_extra_markov_tensor_in_plain_dflash(artifact):
    art = artifact("plain")
    bits = np.full((256, 8), 0x3F80, dtype=np.uint16)
    rewrite_gguf(art, tensors=lambda arrays: arrays + [["markov_w1.weight", bits, QT.BF16]])
    report = validate_artifact(art)
    assert_fails(report, "gguf.inventory", UnexpectedTensorError, "'markov_w1.weight'")
    current = check(report, "engine.strata.open")
    assert current.status == "info" and "markov_w1.weight" in current.detail


@pytest.mark.parametrize("name", ["blk.1.ffn_down.weight", "fc.weight", "markov_w1.weight",
                                  "conf_proj.bias"])
def test_missing_tensor(artifact, name):
    art = artifact("reference")
    rewrite_gguf(art, tensors=lambda arrays: [a for a in arrays if a[0] != name])
    report = validate_artifact(art)
    assert_fails(report, "gguf.inventory", MissingTensorError, f"'{name}'", "missing")
    loader = check(report, "engine.strata.open")
    if name in ("blk.1.ffn_down.weight", "fc.weight"):
        canon = {"blk.1.ffn_down.weight": "layers.1.mlp.down_proj", "fc.weight": "fc"}[name]
        assert loader.status == "failed" and f"missing required tensor '{canon}'" in loader.detail
    else:
        assert loader.status == "info" and DSPARK_REFUSED in loader.detail


def test_tensor_renamed_to_hf_name(artifact):
    """Strata accepts the raw HF names; the format does not."""
    art = artifact("plain")

    def rename(item):
        item[0] = "layers.0.mlp.down_proj.weight"
    rewrite_gguf(art, tensors=_edit_tensor("blk.0.ffn_down.weight", rename))
    report = validate_artifact(art)
    assert_fails(report, "gguf.inventory", MissingTensorError, "'blk.0.ffn_down.weight'")
    assert check(report, "engine.strata.open").status == "passed"


def test_inventory_edit_with_refreshed_manifest_still_fails(artifact):
    """A consistent manifest does not make a tensor table the format refuses acceptable."""
    art = artifact("plain")

    def swap(arrays):
        arrays[3], arrays[4] = arrays[4], arrays[3]
        return arrays
    rewrite_gguf(art, tensors=swap)
    refresh_manifest(art, tensors=True)
    report = validate_artifact(art)
    assert_fails(report, "gguf.inventory", UnexpectedTensorError, "'blk.0.ffn_norm.weight'")
    # The manifest still lists the format's order, so integrity disagrees too.
    integrity = check(report, "integrity")
    assert integrity.status == "failed" and integrity.error == "ManifestMismatchError"


# --------------------------------------------------------------------------------------------
# manifest.json
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("missing", [MANIFEST, GGUF])
def test_artifact_file_missing(artifact, missing):
    art = artifact("reference")
    (art / missing).unlink()
    report = validate_artifact(art)
    assert_fails(report, "artifact.files", InvalidArtifactError, missing, "missing")
    assert len(report.checks) == 1


def test_artifact_file_is_a_directory_or_symlink(artifact, tmp_path):
    art = artifact("reference")
    (art / MANIFEST).unlink()
    (art / MANIFEST).mkdir()
    assert_fails(validate_artifact(art), "artifact.files", InvalidArtifactError, MANIFEST)

    art2 = artifact("plain")
    real = tmp_path / "elsewhere.gguf"
    shutil.move(art2 / GGUF, real)
    (art2 / GGUF).symlink_to(real)
    assert_fails(validate_artifact(art2), "artifact.files", InvalidArtifactError, GGUF)


def test_artifact_path_missing(tmp_path):
    report = validate_artifact(tmp_path / "nope")
    assert_fails(report, "artifact.files", InvalidArtifactError, "nope", "not an artifact directory")
    assert len(report.checks) == 1


def test_artifact_path_is_a_file(artifact):
    art = artifact("reference")
    report = validate_artifact(art / GGUF)
    assert_fails(report, "artifact.files", InvalidArtifactError, "drafter.gguf",
                 "not an artifact directory")


@pytest.mark.parametrize("text,fragment", [
    ("", "not valid JSON"),
    ("{not json", "not valid JSON"),
    ("[1, 2, 3]", "manifest.json"),
    ('{"format": "strata-dspark-artifact", "format": "strata-dspark-artifact"}', "format"),
    ('{"a": NaN}', "NaN"),
    (b"\xff\xfe{}", "UTF-8"),
])
def test_manifest_not_json(artifact, text, fragment):
    art = artifact("reference")
    if isinstance(text, bytes):
        (art / MANIFEST).write_bytes(text)
    else:
        (art / MANIFEST).write_text(text)
    report = validate_artifact(art)
    assert_fails(report, "manifest.schema", ManifestError, "manifest.json", fragment)
    # The GGUF is still checked; integrity needs a manifest.
    assert check(report, "gguf.values").status == "passed"
    assert check(report, "integrity").status == "skipped"


def test_manifest_duplicate_key_deep(artifact):
    art = artifact("reference")
    text = (art / MANIFEST).read_text()
    # Duplicate a nested key by inserting it again right after its first occurrence.
    needle = '"block_size": 7,'
    at = text.index(needle)
    (art / MANIFEST).write_text(text[:at] + needle + " " + text[at:])
    assert_fails(validate_artifact(art), "manifest.schema", ManifestError, "block_size")


def _edit(path_: str, value):
    def apply(data):
        *parents, last = path_.split(".")
        node = data
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        if value is _DELETE:
            del node[last]
        elif isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return apply


_DELETE = object()


@pytest.mark.parametrize("field,value,fragment", [
    ("artifact.size", "46080", "artifact.size"),
    ("artifact.size", 1.5, "artifact.size"),
    ("artifact.size", True, "artifact.size"),
    ("artifact.size", -1, "artifact.size"),
    ("format_version", 5, "format_version"),
    ("format", "something-else", "format"),
    ("artifact.file", "model.gguf", "artifact.file"),
    ("artifact.sha256", "not-a-sha", "artifact.sha256"),
    ("artifact.tensors.0.type", "F32", "artifact.tensors.0.type"),
    ("artifact.tensors.0.shape", "[192, 64]", "artifact.tensors.0.shape"),
    ("source.dtype", "FP8", "source.dtype"),
    ("source.config", [], "source.config"),
    ("contract.block.block_size", "7", "contract.block.block_size"),
    ("target", {"repo": "x"}, "target"),
    ("extra_field", 1, "extra_field"),
    ("artifact.extra", 1, "artifact.extra"),
    ("contract.geometry.extra", 1, "contract.geometry.extra"),
    ("converter.name", "other", "converter.name"),
    ("checks", _DELETE, "checks"),
    ("artifact.tensors", _DELETE, "artifact.tensors"),
])
def test_manifest_schema(artifact, field, value, fragment):
    art = artifact("reference")
    data = load_manifest(art)
    _edit(field, value)(data)
    save_manifest(art, data)
    report = validate_artifact(art)
    assert_fails(report, "manifest.schema", ManifestError, f"field '{fragment}", "manifest.json")


def test_manifest_artifact_sha_edited(artifact):
    art = artifact("reference")
    data = load_manifest(art)
    real = data["artifact"]["sha256"]
    data["artifact"]["sha256"] = "0" * 64
    save_manifest(art, data)
    assert_fails(validate_artifact(art), "integrity", IntegrityError, "drafter.gguf",
                 f"SHA-256 is {real}", "records " + "0" * 64)


def test_manifest_artifact_size_edited(artifact):
    art = artifact("reference")
    data = load_manifest(art)
    size = data["artifact"]["size"]
    data["artifact"]["size"] = size + 1
    save_manifest(art, data)
    assert_fails(validate_artifact(art), "integrity", IntegrityError, f"size is {size} bytes",
                 str(size + 1))


@pytest.mark.parametrize("index", [0, 7, -1])
def test_manifest_tensor_sha_edited(artifact, index):
    art = artifact("reference")
    data = load_manifest(art)
    record = data["artifact"]["tensors"][index]
    record["sha256"] = "f" * 64
    save_manifest(art, data)
    assert_fails(validate_artifact(art), "integrity", IntegrityError,
                 f"tensor '{record['name']}'", "f" * 64)


@pytest.mark.parametrize("edit,fragment", [
    (lambda t: t.pop(5), "artifact.tensors[5]"),
    (lambda t: t.append(dict(t[0], name="extra.weight")), "artifact.tensors[29]"),
    (lambda t: t.__setitem__(2, dict(t[2], shape=[63])), "artifact.tensors[2]"),
    (lambda t: t.__setitem__(0, dict(t[0], name="fc2.weight")), "artifact.tensors[0]"),
])
def test_manifest_tensor_list_disagrees(artifact, edit, fragment):
    art = artifact("reference")
    data = load_manifest(art)
    edit(data["artifact"]["tensors"])
    save_manifest(art, data)
    assert_fails(validate_artifact(art), "integrity", ManifestMismatchError, fragment)


@pytest.mark.parametrize("path_,value", [
    ("contract.block.block_size", 8),
    ("contract.block.mask_token_id", 499),
    ("contract.geometry.rope_theta", 10000.0),
    ("contract.taps.feature_width", 191),
])
def test_manifest_contract_edited(artifact, path_, value):
    art = artifact("reference")
    data = load_manifest(art)
    _edit(path_, value)(data)
    save_manifest(art, data)
    assert_fails(validate_artifact(art), "integrity", ManifestMismatchError, f"'{path_}'",
                 "rebuilt from source.config")


@pytest.mark.parametrize("field,value", [
    ("block_size", 8),
    ("mask_token_id", 499),
    ("markov_rank", 8),
    ("target_layer_ids", [0, 2, 3]),
])
def test_manifest_source_config_edited(artifact, field, value):
    art = artifact("reference")
    data = load_manifest(art)
    data["source"]["config"][field] = value
    save_manifest(art, data)
    first = assert_fails(validate_artifact(art), "integrity", ManifestMismatchError, "contract",
                         "source.config")
    assert first.detail.startswith("manifest.json")


def test_manifest_source_config_no_longer_valid(artifact):
    """source.config edited into something the contract rules refuse: reported, never raised."""
    art = artifact("reference")
    data = load_manifest(art)
    data["source"]["config"]["block_size"] = 1000
    save_manifest(art, data)
    report = validate_artifact(art)
    assert report.ok is False
    first = report.first_failure
    assert first.name == "integrity" and "block_size" in first.detail
    assert "source.config" in first.detail


def test_manifest_weights_digest_edited(artifact):
    art = artifact("reference")
    data = load_manifest(art)
    data["source"]["weights_sha256"] = "a" * 64
    save_manifest(art, data)
    assert_fails(validate_artifact(art), "integrity", ManifestMismatchError,
                 "source.weights_sha256")


def test_manifest_stripped_hash_edited(artifact):
    art = artifact("reference")
    data = load_manifest(art)
    assert data["source"]["stripped"], "the reference has an embedding and a head"
    data["source"]["stripped"][0]["sha256"] = "b" * 64
    save_manifest(art, data)
    assert_fails(validate_artifact(art), "integrity", ManifestMismatchError,
                 "'dflash.target.", "manifest.json")


# --------------------------------------------------------------------------------------------
# never raises: sweeps over real corruptions
# --------------------------------------------------------------------------------------------

@pytest.mark.slow   # validate on ~300 corrupted copies of the header
def test_every_header_byte_flip_is_reported_not_raised(artifact):
    art = artifact("reference")
    path = art / GGUF
    good = path.read_bytes()
    header_end = gguf_of(art).data_start
    artifact_codes = {c.exit_code for c in (GGUFFormatError, MetadataError, IntegrityError,
                                            ManifestMismatchError, TensorDtypeError,
                                            TensorShapeError, MissingTensorError,
                                            UnexpectedTensorError, NonFiniteTensorError)}
    # The value bytes of dflash.block_count are left to test_huge_block_count_*: a flipped
    # high bit there currently makes validate build billions of tensor specs.
    _t, count_at = key_value_offset(art, "dflash.block_count")
    skip = range(count_at, count_at + 4)
    seen = set()
    for pos in range(0, header_end, 5):
        if pos in skip:
            continue
        bad = bytearray(good)
        bad[pos] ^= 0x01 if pos % 2 else 0x80
        path.write_bytes(bytes(bad))
        report = validate_artifact(art)
        assert report.ok is False, pos
        first = report.first_failure
        assert first.error is not None and first.exit_code == report.exit_code()
        seen.add(first.error)
        assert first.exit_code != 1, (pos, first)  # never an internal error
        assert first.exit_code in artifact_codes or 13 <= first.exit_code <= 19, (pos, first)
    assert {"GGUFFormatError", "MetadataError", "IntegrityError"} <= seen


_BOUNDED_VALIDATE = r"""
import json, resource, sys
from dspark_convert.commands.validate import validate_artifact
with open("/proc/self/status") as fh:
    vm = next(int(l.split()[1]) for l in fh if l.startswith("VmSize:")) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + (512 << 20), resource.getrlimit(resource.RLIMIT_AS)[1]))
try:
    report = validate_artifact(sys.argv[1])
except MemoryError:
    sys.exit(3)
print(json.dumps(report.first_failure.model_dump() if report.first_failure else None))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc and RLIMIT_AS")
@pytest.mark.parametrize("count", [2 | 1 << 31, 0xFFFFFFFF])
def test_huge_block_count_is_reported_within_bounded_memory(artifact, count):
    """A single flipped bit in dflash.block_count (2 -> 2**31 + 2) must be refused from the
    value, not by first expanding the per-layer tensor list for every layer. Run in a child
    process under a 512 MiB address-space limit so that the bug cannot take the machine."""
    art = artifact("reference")
    _t, value_at = key_value_offset(art, "dflash.block_count")
    patch(art / GGUF, value_at, struct.pack("<I", count))
    proc = subprocess.run([sys.executable, "-c", _BOUNDED_VALIDATE, str(art)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, f"validate_artifact raised MemoryError (rc {proc.returncode})"
    first = json.loads(proc.stdout)
    assert first["name"] == "gguf.metadata" and first["exit_code"] in (17, 43), first
    assert str(count) in first["detail"]


def test_every_truncation_is_reported_not_raised(artifact):
    art = artifact("plain")
    path = art / GGUF
    good = path.read_bytes()
    for size in list(range(0, 200, 7)) + list(range(200, len(good), 997)) + [len(good) - 1]:
        path.write_bytes(good[:size])
        report = validate_artifact(art)
        first = report.first_failure
        assert report.ok is False and first.name == "gguf.structure", size
        assert first.error == "GGUFFormatError" and first.exit_code == 41


# --------------------------------------------------------------------------------------------
# the CLI (in-process, tests/support/cli.py: the real app, its streams and its exit code)
# --------------------------------------------------------------------------------------------

def test_cli_json_good_artifact(built):
    proc = run_cli("validate", str(built["plain"]), "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["ok"] is True and data["exit_code"] == 0 and data["strict"] is False
    assert data["failed"] == 0 and data["warnings"] == 0
    assert [c["name"] for c in data["checks"]][:len(CHECK_ORDER)] == list(CHECK_ORDER)
    assert [c["name"] for c in data["checks"] if c["status"] != "passed"] == [
        "engine.strata.run", "engine.llama.cpp"]            # infos: the two engines' refusals
    assert data["engines"] == {
        "strata.open": {"accepts": True, "reason": None},
        "strata.run": {"accepts": False, "reason": "dflash: embedding_length = 32; the runtime's "
                       "geometry-specific fast path implements the published Flash-Next "
                       "drafter (2560) only"},
        "llama.cpp": {"accepts": False, "reason": "key not found in model: dflash.context_length"
                      + LLAMA_EXPORT_HINT}}
    assert data["required"] == []
    assert "error:" not in proc.stderr and "Traceback" not in proc.stderr


def test_cli_json_bad_artifact(artifact):
    art = artifact("reference")
    _flip_low_mantissa_bit(art, "blk.0.attn_k.weight", 5)
    refresh_manifest(art)
    proc = run_cli("validate", str(art), "--json")
    assert proc.returncode == IntegrityError.exit_code == 44, proc.stderr
    data = json.loads(proc.stdout)
    assert data["ok"] is False and data["exit_code"] == 44 and data["failed"] == 1
    failed = [c for c in data["checks"] if c["status"] == "failed"]
    assert failed[0]["name"] == "integrity"
    assert failed[0]["error"] == "IntegrityError" and failed[0]["exit_code"] == 44
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: integrity: ")
    assert "'blk.0.attn_k.weight'" in lines[0]
    assert "Traceback" not in proc.stderr


def test_cli_json_non_finite(artifact):
    art = artifact("reference")
    patch(art / GGUF, element_offset(art, "blk.0.attn_k.weight", 5), struct.pack("<H", 0x7FC0))
    proc = run_cli("validate", str(art), "--json")
    assert proc.returncode == NonFiniteTensorError.exit_code == 24, proc.stderr
    data = json.loads(proc.stdout)
    assert data["ok"] is False and data["exit_code"] == 24
    failed = [c for c in data["checks"] if c["status"] == "failed"]
    assert (failed[0]["name"], failed[0]["error"]) == ("gguf.values", "NonFiniteTensorError")
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: gguf.values: ")
    assert "blk.0.attn_k.weight" in lines[0] and "Traceback" not in proc.stderr


def test_cli_human_bad_artifact_and_missing_path(artifact, tmp_path):
    art = artifact("plain")
    os.truncate(art / GGUF, 1000)
    proc = run_cli("validate", str(art))
    assert proc.returncode == GGUFFormatError.exit_code
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: gguf.structure: ")
    assert "FAILED" in proc.stdout and "Traceback" not in proc.stderr + proc.stdout

    proc = run_cli("validate", str(tmp_path / "missing"), "--json")
    assert proc.returncode == InvalidArtifactError.exit_code
    assert json.loads(proc.stdout)["checks"][0]["error"] == "InvalidArtifactError"
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: artifact.files: ")


def test_cli_strict_on_dspark_artifact(built):
    """A DSpark drafter passes the strict gate: today's loader refusal is info, not a risk."""
    proc = run_cli("validate", str(built["reference"]), "--strict", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["ok"] is True and data["strict"] is True and data["exit_code"] == 0
    assert data["warnings"] == 0
    assert [c["name"] for c in data["checks"] if c["status"] == "info"] == [
        "engine.strata.open", "engine.strata.run", "engine.llama.cpp"]
    assert proc.stderr == ""

    proc = run_cli("validate", str(built["plain"]), "--strict")
    assert proc.returncode == 0 and proc.stderr == ""


def test_cli_strict_fails_a_warning(artifact):
    art = artifact("reference")
    (art / "notes.txt").write_text("not part of the artifact\n")
    proc = run_cli("validate", str(art), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["warnings"] == 1

    proc = run_cli("validate", str(art), "--strict", "--json")
    assert proc.returncode == StrataRuleError.exit_code == 45
    data = json.loads(proc.stdout)
    assert data["ok"] is True and data["strict"] is True and data["exit_code"] == 45
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "Traceback" not in proc.stderr


# --------------------------------------------------------------------------------------------
# engines: --require, the engines table
# --------------------------------------------------------------------------------------------

def test_cli_require_fails_the_engines_refusal_only(built):
    """The golden plain drafter: Strata opens it (required: passes), its runtime does not
    run H = 32 (required: 47, one line naming the check and the reason), llama.cpp reads
    another format (not required: an info)."""
    plain = str(built["plain"])
    proc = run_cli("validate", plain, "--require", "strata.open", "--strict")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert "strata.open (required)" in proc.stdout
    proc = run_cli("validate", plain, "--require", "strata.run", "--json")
    line = assert_refused(proc, EngineRequirementError,
                          ["error: engine.strata.run: drafter.gguf: --require strata.run: ",
                           "embedding_length = 32"])
    data = json.loads(proc.stdout)
    assert data["ok"] is False and data["exit_code"] == 47 and data["required"] == ["strata.run"]
    failed = [c for c in data["checks"] if c["status"] == "failed"]
    assert [(c["name"], c["error"]) for c in failed] == [("engine.strata.run",
                                                          "EngineRequirementError")]
    assert line == f"error: {failed[0]['name']}: {failed[0]['detail']}"
    # every other check as without --require
    assert [c["status"] for c in data["checks"] if c["name"] != "engine.strata.run"] == \
        ["passed"] * 9 + ["info"]
    proc = run_cli("validate", str(built["reference"]), "--require", "llama.cpp",
                   "--require", "strata.open")
    assert proc.returncode == 47 and "engine.strata.open" in proc.stderr    # the first failure
    assert proc.stdout.count("(required)") == 2


def test_cli_require_names_an_engine(built):
    proc = run_cli("validate", str(built["plain"]), "--require", "strata")
    assert proc.returncode == 2
    assert "expected one of strata.open, strata.run, llama.cpp, found 'strata'" in proc.stderr
    with pytest.raises(ValueError):
        validate_artifact(built["plain"], require=["vllm"])


def test_the_engines_record_is_confirmed(artifact):
    """manifest.json's engines record is what the rules give on drafter.gguf: an edit is
    a manifest mismatch (46) naming the engine."""
    art = artifact("plain")
    manifest = json.loads((art / MANIFEST).read_text())
    assert manifest["engines"]["strata.open"] == {"accepts": True, "reason": None}
    manifest["engines"]["strata.run"] = {"accepts": True, "reason": None}
    (art / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    assert_fails(validate_artifact(art), "integrity", ManifestMismatchError,
                 "field 'engines.strata.run'", "'accepts': True")
