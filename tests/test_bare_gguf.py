"""`dspark validate FILE.gguf` on a drafter file that came without a manifest: files written
the way Strata's own tools write them (support/strata_files.py: tools/dflash_gguf.py and
tools/dflash_quantize.py, their keys, types and order), our own drafter.gguf alone, and
llama.cpp's converter's (slow: where llama.cpp is built). What needs the manifest is
skipped, never failed; what the file is is said; each engine reads it as it reads files
(Strata any numeric type, llama.cpp and gguf-py exact types), each verdict naming its rule;
a broken file is refused with the reader's code, one line, bounded."""

from __future__ import annotations

import json
import shutil
import struct

import pytest
from gguf import GGUFReader, GGUFValueType as VT

from support.bounded import run_bounded
from support.cli import assert_refused, run_cli
from support.llama_cpp import rewrite_gguf, write_target_gguf
from support.paths import GOLDEN
from support.strata_files import strata_convert, strata_quantize
from dspark_convert import errors as E
from dspark_convert.commands.inspection import inspect_path
from dspark_convert.commands.quantize import quantize_artifact
from dspark_convert.commands.validate_bare import validate_path
from dspark_convert.formats.gguf_reader import read_gguf

PLAIN_DFLASH = GOLDEN / "reference" / "dflash_shared" / "draft"   # DeepSpec's plain DFlash
NEVER_FAILED = ("manifest.schema", "manifest.format_version", "integrity")


@pytest.fixture(scope="module")
def strata_files(tmp_path_factory):
    """DeepSpec's plain DFlash drafter packed by Strata's converter, and that file quantized
    by Strata's quantizer (Q8_0 and Q4_0)."""
    root = tmp_path_factory.mktemp("strata")
    bf16 = strata_convert(PLAIN_DFLASH, root / "dflash.gguf")
    return {"BF16": bf16, "Q8_0": strata_quantize(bf16, root / "dflash.q8_0.gguf", "Q8_0"),
            "Q4_0": strata_quantize(bf16, root / "dflash.q4_0.gguf", "Q4_0")}


def checks(report) -> dict:
    return {c.name: c for c in report.checks}


def cli_json(path, *args):
    proc = run_cli("validate", str(path), "--json", *args)
    return proc, json.loads(proc.stdout)


def assert_bare(report) -> dict:
    """What every bare report holds: the note, and nothing failed for a missing manifest."""
    by = checks(report)
    assert by["artifact.files"].status == "info" and "no manifest.json" in by["artifact.files"].detail
    for name in NEVER_FAILED:
        assert by[name].status == "skipped", by[name]
    return by


@pytest.mark.parametrize("kind", ["BF16", "Q8_0", "Q4_0"])
def test_a_strata_written_file_is_said_what_it_is_and_opens_in_strata(strata_files, kind):
    path = strata_files[kind]
    report = validate_path(path)
    by = assert_bare(report)
    assert report.ok and report.exit_code(strict=True) == 0, report.first_failure
    assert "Strata's layout" in by["gguf.kind"].detail and by["gguf.kind"].status == "info"
    assert by["gguf.values"].status == "passed"
    assert "gguf.metadata" not in by                 # not our format: not held to it
    assert report.engines["strata.open"].accepts
    run = report.engines["strata.run"]               # the tiny golden geometry: not Flash-Next
    assert not run.accepts and run.reason.startswith("dflash: embedding_length = 64")
    assert "strata.run/geometry.embedding_length" in by["engine.strata.run"].detail
    llama = by["engine.llama.cpp"]
    assert llama.status == "info"
    if kind == "BF16":
        assert "(load_error, llama.cpp/key.dflash.context_length)" in llama.detail
        # Strata's convention: DeepSpec tap ids, which llama.cpp would read one layer early
        assert "llama.cpp/target_layers_convention" in llama.detail


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0"])
def test_strata_quantizer_retyping_is_read_as_each_engine_reads_it(strata_files, kind):
    """Strata's quantizer re-adds general.alignment as INT64 and every u32 as INT64: Strata
    reads any numeric type (opens it), llama.cpp's gguf_init and gguf-py refuse the file at
    the alignment's type; our strict reader (an artifact's) refuses it too, the bare check
    reads the value."""
    path = strata_files[kind]
    gguf = read_gguf(path, alignment_types=frozenset(VT))
    assert gguf.kv["general.alignment"].type == VT.INT64
    assert gguf.kv["dflash.block_count"].type == VT.INT64
    assert gguf.kv["dflash.target_layers"].sub_type == VT.INT32
    assert gguf.kv["dflash.rope.frequency_base"].type == VT.FLOAT64
    with pytest.raises(ValueError, match="general.alignment"):
        GGUFReader(path)                              # gguf-py itself
    with pytest.raises(E.GGUFFormatError, match="general.alignment has type INT64"):
        read_gguf(path)
    proc, data = cli_json(path)
    assert proc.returncode == 0, proc.stderr
    assert data["engines"]["strata.open"] == {"accepts": True, "reason": None}
    assert data["engines"]["llama.cpp"] == {
        "accepts": False, "reason": "gguf_init_from_reader: key 'general.alignment' must "
                                    "be of type u32 but is i64"}
    structure = next(c for c in data["checks"] if c["name"] == "gguf.structure")
    assert "general.alignment is INT64" in structure["detail"]


def test_require_turns_an_engines_refusal_of_a_bare_file_into_a_failure(strata_files):
    path = str(strata_files["Q8_0"])
    assert run_cli("validate", path, "--require", "strata.open").returncode == 0
    assert_refused(run_cli("validate", path, "--require", "llama.cpp"),
                   E.EngineRequirementError,
                   ["engine.llama.cpp", "llama.cpp/gguf.alignment_type", "must be of type u32"])


def test_our_drafter_file_alone_is_held_to_the_format(tmp_path, converted):
    """drafter.gguf copied without its manifest: every check the file allows, as in its
    artifact, the same engine verdicts manifest.json recorded."""
    art = converted["reference"]
    alone = tmp_path / "drafter.gguf"
    shutil.copyfile(art / "drafter.gguf", alone)
    report = validate_path(alone)
    by = assert_bare(report)
    assert report.ok, report.first_failure
    for name in ("gguf.structure", "gguf.metadata", "gguf.inventory", "gguf.values"):
        assert by[name].status == "passed", by[name]
    assert "our format" in by["gguf.kind"].detail
    manifest = json.loads((art / "manifest.json").read_text())
    assert report.model_dump()["engines"] == manifest["engines"]
    assert manifest["artifact"]["sha256"] in by["integrity"].detail


def test_our_file_quantized_by_strata_is_our_format_with_retyped_keys(tmp_path, converted):
    """Strata's quantizer on our plain DFlash drafter.gguf: the keys our format types
    exactly come back INT64 / FLOAT64 / an INT32 array; read as Strata reads them they are
    our values, so the file is held to the format and passes, its quantized tensors the
    bytes `dspark quantize` writes."""
    art = converted["dflash_plain"]
    strata = strata_quantize(art / "drafter.gguf", tmp_path / "strata.q8_0.gguf", "Q8_0")
    report = validate_path(strata)
    by = assert_bare(report)
    assert report.ok, report.first_failure
    types = by["gguf.types"].detail
    for retyped in ("general.alignment: INT64 as UINT32", "dflash.block_count: INT64 as UINT32",
                    "dflash.target_layers: ARRAY[INT32] as ARRAY[UINT32]"):
        assert retyped in types, types
    assert "dflash.attention.layer_norm_rms_epsilon: FLOAT64 as FLOAT32" in types
    for name in ("gguf.metadata", "gguf.inventory", "gguf.quantization", "gguf.values"):
        assert by[name].status == "passed", by[name]
    assert by["engine.llama.cpp"].detail.count("llama.cpp/gguf.alignment_type") == 1
    ours = quantize_artifact(art, tmp_path / "ours", "q8_0").output
    mine, theirs = read_gguf(ours / "drafter.gguf"), read_gguf(strata, alignment_types=frozenset(VT))
    data_mine, data_theirs = (ours / "drafter.gguf").read_bytes(), strata.read_bytes()
    for a, b in zip(mine.tensors, theirs.tensors, strict=True):
        assert (a.name, a.ggml_type, a.shape) == (b.name, b.ggml_type, b.shape)
        assert data_mine[a.data_offset:a.data_offset + a.nbytes] == \
            data_theirs[b.data_offset:b.data_offset + b.nbytes], a.name


# A key of our format stored under another type whose value the format's type does not
# hold exactly: not re-typed, so refused as for an artifact (one line, its own code).
RETYPED_BEYOND = {
    "count beyond u32": ({"dflash.block_count": (2**40, VT.INT64, None)}, E.MetadataError,
                         ["'dflash.block_count'", "expected type UINT32, found INT64"]),
    "negative count": ({"dflash.block_count": (-1, VT.INT64, None)}, E.MetadataError,
                       ["'dflash.block_count'", "found INT64"]),
    "count as a bool": ({"dflash.block_count": (True, VT.BOOL, None)}, E.MetadataError,
                        ["'dflash.block_count'", "found BOOL"]),
    "count as a float": ({"dflash.vocab_size": (512.0, VT.FLOAT64, None)}, E.MetadataError,
                         ["'dflash.vocab_size'", "found FLOAT64"]),
    "eps no FLOAT32 holds": ({"dflash.attention.layer_norm_rms_epsilon": (1e-300, VT.FLOAT64, None)},
                             E.MetadataError, ["layer_norm_rms_epsilon", "found FLOAT64"]),
    "eps NaN": ({"dflash.attention.layer_norm_rms_epsilon": (float("nan"), VT.FLOAT64, None)},
                E.GeometryLimitError, ["layer_norm_rms_epsilon", "positive finite", "nan"]),
    "float taps": ({"dflash.target_layers": ([1.0, 3.0], VT.ARRAY, VT.FLOAT32)},
                   E.MetadataError, ["'dflash.target_layers'", "ARRAY[FLOAT32]"]),
    "version a string": ({"dspark.format_version": ("1", VT.STRING, None)}, E.MetadataError,
                         ["'dspark.format_version'", "found STRING"]),
}


@pytest.mark.parametrize("name", sorted(RETYPED_BEYOND))
def test_a_key_of_our_format_retyped_beyond_its_type_is_refused(tmp_path, converted, name):
    keys, error, needles = RETYPED_BEYOND[name]
    bad = rewrite_gguf(converted["dflash_plain"] / "drafter.gguf", tmp_path / "bad.gguf",
                       set_keys=keys)
    assert_refused(run_cli("validate", str(bad)), error, ["gguf.metadata", *needles])


def test_a_file_that_is_no_drafter_is_said_so(tmp_path):
    target = write_target_gguf(tmp_path / "target.gguf")
    report = validate_path(target)
    by = assert_bare(report)
    assert report.ok
    assert "not a DFlash/DSpark drafter file: general.architecture is 'qwen3'" in \
        by["gguf.kind"].detail
    assert by["gguf.values"].status == "skipped"
    assert not any(report.engines[e].accepts for e in report.engines)


def _gguf_header(kv: bytes, n_kv: int) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, 0, n_kv) + kv


def _kv(key: str, vtype: VT, payload: bytes) -> bytes:
    return struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", vtype) + payload


# Bad bare files: each refused by the reader (41), one line, inputs untouched.
BAD_FILES = {
    "not GGUF": b"this is a text file, not a model\n",
    "empty": b"",
    "alignment INT64 48": _gguf_header(_kv("general.alignment", VT.INT64, struct.pack("<q", 48)), 1),
    "alignment INT64 negative": _gguf_header(_kv("general.alignment", VT.INT64,
                                                 struct.pack("<q", -32)), 1),
    "alignment a string": _gguf_header(_kv("general.alignment", VT.STRING,
                                           struct.pack("<Q", 2) + b"32"), 1),
    "key count a lie": _gguf_header(b"", 2**40),
    "array length a lie": _gguf_header(_kv("a", VT.ARRAY, struct.pack("<IQ", VT.UINT32, 2**60)), 1),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_a_bad_bare_file_is_refused_by_the_reader(tmp_path, name):
    path = tmp_path / "bad.gguf"
    path.write_bytes(BAD_FILES[name])
    before = path.read_bytes()
    line = assert_refused(run_cli("validate", str(path)), E.GGUFFormatError, ["gguf.structure"])
    assert "bad.gguf" in line
    assert path.read_bytes() == before


def test_a_truncated_drafter_file_is_refused_in_bounded_memory(tmp_path, strata_files):
    data = strata_files["Q8_0"].read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[:len(data) // 2])
    proc = run_bounded("validate", str(path))
    assert_refused(proc.proc, E.GGUFFormatError, ["gguf.structure", "cut.gguf"])


def test_a_bare_file_of_our_format_is_paired_with_its_target(tmp_path, paired_artifacts):
    """--target on our drafter.gguf alone: the pairing checks run on the contract and
    hashes the file holds (a changed target is refused as for an artifact)."""
    from support.paths import GOLDEN_TARGET

    name = next(iter(paired_artifacts))
    alone = tmp_path / "drafter.gguf"
    shutil.copyfile(paired_artifacts[name] / "drafter.gguf", alone)
    report = validate_path(alone, target=GOLDEN_TARGET)
    assert report.ok, report.first_failure
    assert checks(report)["target.identity.head"].status == "passed"
    strata = strata_convert(PLAIN_DFLASH, tmp_path / "strata.gguf")
    assert checks(validate_path(strata, target=GOLDEN_TARGET))["target"].status == "skipped"


def test_an_artifacts_own_drafter_file_is_its_artifact(converted):
    """drafter.gguf with its manifest.json beside it: the artifact's check (as inspect)."""
    art = converted["reference"]
    report = validate_path(art / "drafter.gguf")
    assert report.ok and report.artifact == str(art)
    assert checks(report)["integrity"].status == "passed"


def test_a_directory_is_still_an_artifact(tmp_path, converted):
    art = tmp_path / "art"
    shutil.copytree(converted["reference"], art)
    (art / "manifest.json").unlink()
    assert_refused(run_cli("validate", str(art)), E.InvalidArtifactError, ["manifest.json"])


def test_inspect_says_what_a_bare_file_is(tmp_path, strata_files, converted):
    """inspect FILE.gguf: a Strata file (not ours: its tensors as stored and the engines),
    and our file as Strata's quantizer re-typed it (the contract, the re-typed keys)."""
    proc = run_cli("inspect", str(strata_files["Q8_0"]), "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["kind"] == "gguf" and data["contract"] is None and "Strata's layout" in data["file"]
    assert len(data["tensors"]) == 25 and data["tensors"][0] == {
        "name": "fc.weight", "type": "Q8_0", "shape": [192, 64]}
    assert data["engines"]["strata.open"]["accepts"] is True
    assert data["engines"]["llama.cpp"]["reason"].startswith("gguf_init_from_reader")
    retyped = strata_quantize(converted["dflash_plain"] / "drafter.gguf",
                              tmp_path / "ours.q4_0.gguf", "Q4_0")
    result = inspect_path(retyped)
    assert result.kind == "artifact" and result.problem is None and result.contract is not None
    assert "dflash.vocab_size: INT64 as UINT32" in result.retyped
    assert all(row.status == "ok" for row in result.rows)
    text = run_cli("inspect", str(retyped))
    assert text.returncode == 0 and "retyped" in text.stdout and "engines" in text.stdout


def test_inspect_refuses_a_bad_bare_file_with_the_readers_code(tmp_path):
    path = tmp_path / "bad.gguf"
    path.write_bytes(BAD_FILES["alignment INT64 48"])
    assert_refused(run_cli("inspect", str(path)), E.GGUFFormatError, ["general.alignment is 48"])


@pytest.mark.slow
def test_llama_cpp_converter_output_is_read_as_llama_cpp_reads_it(llama_golden):
    """llama.cpp's convert_hf_to_gguf.py on both trained golden drafters (llama.cpp loads
    and runs them: tests/test_llama_cpp_loader.py), and `dspark export` of each."""
    for name, path in llama_golden.converter.items():
        report = validate_path(path)
        by = assert_bare(report)
        assert report.ok, (name, report.first_failure)
        assert "llama.cpp's layout" in by["gguf.kind"].detail, name
        llama = report.engines["llama.cpp"]
        # its own converter's layout: it loads (no load_error, nothing unsupported); the
        # drafter's embedding kept as its head is the one thing it reads otherwise
        assert llama.accepts or "llama.cpp/embedding_as_head" in by["engine.llama.cpp"].detail
        assert not report.engines["strata.open"].accepts
    for name, path in llama_golden.exports.items():
        report = validate_path(path)
        assert report.ok and report.engines["llama.cpp"].accepts, name
        assert "dspark export" in checks(report)["gguf.kind"].detail


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["BF16", "Q8_0"])
def test_llama_cpp_itself_refuses_strata_files_as_reported(llama_golden, strata_files, kind):
    """The real llama.cpp 0c1e570 on Strata's files: its first error is the reason the
    report gives (the INT64 alignment at gguf init; the missing context length)."""
    path = strata_files[kind]
    run = llama_golden.engine.completion(path, "hi", 1)
    errors = [line.split(" E ", 1)[1] for line in run.stderr.splitlines() if " E " in line]
    assert run.returncode != 0 and errors, run.stderr[-2000:]
    reason = validate_path(path).engines["llama.cpp"].reason
    assert reason.split(" (")[0] in errors[0], (reason, errors[0])
