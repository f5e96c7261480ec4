"""The readers' bounds, through the real CLI where a user meets
them: a file that shrinks while it is read is refused as having shrunk (never a short block
reaching numpy), counts from a target's config.json allocate nothing, and a header or
metadata that would grow 10-30 times into Python objects is refused within a memory and
time bound (tests/support/bounded.py caps the child's address space, so a regression fails
here instead of swapping the machine).

Each CLI case asserts the error class's exit code, exactly one `error:` line, no traceback.
The inputs are built with the hostile corpus' builders (tests/hostile/make_corpus.py) at full
size (10-100 MB); the corpus itself holds the smallest input past each limit. A bounded
child costs an interpreter start-up and its input's 10-100 MB: one case of each reader runs
in the fast loop, the others are marked slow.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import GOLDEN, REFERENCE_DRAFTER
from hostile import make_corpus
from support.bounded import run_bounded
from support.cli import assert_refused, dspark_cmd, run_cli, temp_siblings
from support.targets import GOLDEN_TARGET, make_target

from dspark_convert.formats import gguf_reader
from dspark_convert.formats import safetensors as safetensors_reader
from dspark_convert.errors import (
    GGUFFormatError,
    SafetensorsFormatError,
    TargetFormatError,
)
from dspark_convert.util.hashing import (
    ThreadedFileHash,
    hash_file_and_spans,
    read_blocks,
    read_full,
)
from dspark_convert.target.model import first_different_row
from dspark_convert.formats.safetensors import TensorEntry
from dspark_convert.target.model import tensor_sha256

PLAIN = GOLDEN / "synthetic" / "dflash_plain"
MiB = 1024 * 1024

# The bound for a refusal: what `dspark convert/validate` needs to start (support/bounded.py:
# under 300 MiB of address space) plus the 95-100 MB input read whole where a reader must
# (a safetensors header is one JSON document); far below the 0.7-1.7 GB these took before.
MEMORY_MB = 400
SECONDS = 20.0
slow = pytest.mark.slow


def refused(result, error) -> str:
    assert result.seconds < SECONDS
    return assert_refused(result.proc, error, [])


# --- item 7: a file that shrinks while it is read --------------------------------------------

def odd_file(tmp_path: Path, size: int) -> Path:
    """A file of ``size`` (odd) bytes, standing for a BF16 tensor file that shrank to it."""
    path = tmp_path / "shrunk.bin"
    path.write_bytes(bytes(range(256)) * (size // 256) + bytes(size % 256))
    return path


def shrank() -> Exception:
    return SafetensorsFormatError("shrank")


def test_read_full_retries_short_reads(tmp_path):
    # A pipe hands out what has been written so far: readinto returns short counts that are
    # not the end. read_full keeps reading; only the writer closing ends it.
    r, w = os.pipe()
    payload = os.urandom(3 * MiB + 1)

    def writer():
        with os.fdopen(w, "wb", buffering=0) as out:
            for at in range(0, len(payload), 4093):
                out.write(payload[at:at + 4093])

    thread = threading.Thread(target=writer)
    thread.start()
    with os.fdopen(r, "rb", buffering=0) as fh:
        view = memoryview(bytearray(2 * MiB))
        assert read_full(fh, view) == 2 * MiB and bytes(view) == payload[:2 * MiB]
        assert read_full(fh, view) == MiB + 1          # the end: fewer, never a hang
        assert bytes(view[:MiB + 1]) == payload[2 * MiB:]
    thread.join()


@pytest.mark.parametrize("reader", ["blocks", "read_blocks", "hash_file_and_spans"])
def test_block_readers_refuse_a_file_that_ends_early(tmp_path, reader):
    # The layout says 6 MiB; the file now ends at an odd length inside the second block.
    declared, block_size = 6 * MiB, 2 * MiB
    path = odd_file(tmp_path, 3 * MiB + 1)
    seen = []

    with open(path, "rb") as fh, pytest.raises(SafetensorsFormatError, match="shrank"):
        if reader == "blocks":
            with ThreadPoolExecutor(1) as pool:
                for block in ThreadedFileHash(pool, block_size).blocks(
                        fh, declared, lambda n: None, shrank):
                    seen.append(len(block))
        elif reader == "read_blocks":
            view = memoryview(bytearray(block_size))
            for block in read_blocks(fh, declared, view, [hashlib.sha256()], lambda n: None,
                                     shrank):
                seen.append(len(block))
        else:
            hash_file_and_spans(fh, declared, [("t", 64, declared - 64)], block_size,
                                lambda n: None, shrank,
                                inspect=lambda name, block, done: seen.append(len(block)))
    # Only whole blocks were handed on; the odd tail never was.
    assert seen and all(n % 2 == 0 for n in seen)
    assert sum(seen) <= 3 * MiB


def test_target_tensor_hash_refuses_a_file_that_shrank(tmp_path):
    path = odd_file(tmp_path, 5 * MiB + 1)
    entry = TensorEntry(name="model.embed_tokens.weight", dtype="BF16", shape=(8 * MiB // 64, 32),
                        file=path, begin=0, end=8 * MiB)
    for as_dtype in (None, "F32"):    # the cast path views every block as BF16
        with pytest.raises(TargetFormatError, match="shrank while 'model.embed_tokens.weight'"):
            tensor_sha256(entry, as_dtype=as_dtype)


def test_first_different_row_refuses_the_side_that_shrank(tmp_path):
    whole = tmp_path / "whole.bin"
    whole.write_bytes(bytes(4 * MiB))
    short = odd_file(tmp_path, 3 * MiB + 1)

    def entry(path):
        return TensorEntry(name="embed_tokens.weight", dtype="BF16", shape=(4 * MiB // 64, 32),
                           file=path, begin=0, end=4 * MiB)

    with pytest.raises(SafetensorsFormatError, match="shrank"):      # the drafter's copy
        first_different_row(entry(short), entry(whole))
    with pytest.raises(TargetFormatError, match="shrank"):           # the target's
        first_different_row(entry(whole), entry(short))


def test_gguf_reader_refuses_a_file_shorter_than_at_open(tmp_path, artifact):
    # read_gguf checks every bound against the size fstat gave at open; the file then ends
    # inside the metadata. Mapped, this was a SIGBUS; read, it is the shrank refusal.
    good = (artifact / "drafter.gguf").read_bytes()
    path = tmp_path / "drafter.gguf"
    path.write_bytes(good[:501])
    with open(path, "rb") as fh:
        parser = gguf_reader._Parser(gguf_reader._FileSource(fh.fileno(), len(good)), str(path))
        with pytest.raises(GGUFFormatError, match="the file shrank while .* was read"):
            parser.parse()


def fdinfo_position(pid: int, target: Path) -> int | None:
    """The read position of ``pid``'s open descriptor of ``target`` (Linux /proc)."""
    fd_dir = Path(f"/proc/{pid}/fd")
    try:
        for fd in os.listdir(fd_dir):
            try:
                if os.readlink(fd_dir / fd) == str(target):
                    for line in (Path(f"/proc/{pid}/fdinfo") / fd).read_text().splitlines():
                        if line.startswith("pos:"):
                            return int(line.split()[1])
            except OSError:
                continue
    except OSError:
        return None
    return None


def sparse_source(root: Path, vocab: int) -> Path:
    """The plain fixture with an all-zero embed_tokens.weight copy [vocab, 32] last in the
    file, as a sparse file (the bytes read are zeros: finite)."""
    shutil.copytree(PLAIN, root)
    cfg = json.loads((root / "config.json").read_text())
    cfg["vocab_size"] = vocab
    (root / "config.json").write_text(json.dumps(cfg))
    header, data = make_corpus.split_safetensors(root / "model.safetensors")
    header["embed_tokens.weight"] = {"dtype": "BF16", "shape": [vocab, 32],
                                     "data_offsets": [len(data), len(data) + vocab * 64]}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(root / "model.safetensors", "wb") as fh:
        fh.write(struct.pack("<Q", len(text)) + text + data)
        fh.truncate(8 + len(text) + len(data) + vocab * 64)
    return root / "model.safetensors"


@slow   # a child reading a 1 GiB (sparse) source while it is cut
@pytest.mark.skipif(not Path("/proc/self/fdinfo").is_dir(), reason="needs Linux /proc")
def test_convert_refuses_a_source_that_shrinks_to_an_odd_length_while_read(tmp_path):
    # A 1 GiB (sparse) source is cut, while convert reads it, to an odd length 128 MiB past
    # where the reader is: the block that reaches the new end comes back short and odd.
    # Before: "buffer size must be a multiple of element size", exit 1.
    weights = sparse_source(tmp_path / "src", vocab=2**24)
    out = tmp_path / "out" / "art"
    proc = subprocess.Popen(dspark_cmd("convert", str(tmp_path / "src"), "-o", str(out), "-q"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "200"})
    cut_at = None
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        pos = fdinfo_position(proc.pid, weights)
        if pos is not None and pos >= 8 * MiB:
            cut_at = (pos + 128 * MiB) | 1
            os.truncate(weights, cut_at)
            break
        time.sleep(0.001)
    stdout, stderr = proc.communicate(timeout=120)
    assert cut_at is not None, "convert finished before the file could be cut"
    line = assert_refused(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr),
                          SafetensorsFormatError, ["model.safetensors", "shrank"])
    assert "multiple" not in line
    assert not out.exists() and not temp_siblings(out)


# --- item 10: counts from a target's config.json ---------------------------------------------

@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    from dspark_convert.commands.convert import convert

    out = tmp_path_factory.mktemp("bounds") / "art"
    convert(REFERENCE_DRAFTER, out, target=GOLDEN_TARGET)
    return out


# The fast loop's case of the eight: the one that was killed for memory at 23 GB.
COUNTS_CANARY = ("convert", "num_hidden_layers", 2**40)


@pytest.mark.parametrize("command, field, value", [
    pytest.param(command, field, value,
                 marks=() if (command, field, value) == COUNTS_CANARY else slow)
    for command in ("convert", "validate")
    for field, value in [
        ("num_hidden_layers", 20_000_000),   # 1.2 GB before the bound
        ("num_hidden_layers", 2**40),        # was killed for memory at 23 GB
        ("vocab_size", 2**40),
        ("hidden_size", 2**40),
    ]
])
def test_huge_target_counts_are_refused_without_allocating(tmp_path, artifact, command, field,
                                                            value):
    target = tmp_path / "target"
    shutil.copytree(GOLDEN_TARGET, target)
    cfg = json.loads((target / "config.json").read_text())
    cfg[field] = value
    (target / "config.json").write_text(json.dumps(cfg))
    if command == "convert":
        out = tmp_path / "out"
        result = run_bounded("convert", str(REFERENCE_DRAFTER), "-o", str(out), "-q",
                             "--target", str(target), memory_mb=MEMORY_MB, seconds=SECONDS)
        assert not out.exists() and not temp_siblings(out)
    else:
        result = run_bounded("validate", str(artifact), "--target", str(target),
                             memory_mb=MEMORY_MB, seconds=SECONDS)
    line = refused(result, TargetFormatError)
    assert "config.json" in line and field in line and str(value) in line


def test_layer_index_of_thousands_of_digits_is_refused(tmp_path):
    # int() refuses more than 4300 digits: a tensor name must not turn into exit 1.
    target = make_target(tmp_path / "target")
    weights = target / "model.safetensors"
    header, data = make_corpus.split_safetensors(weights)
    header["model.layers." + "9" * 5000 + ".extra"] = {"dtype": "BF16", "shape": [0],
                                                     "data_offsets": [0, 0]}
    make_corpus.write_safetensors(weights, header, data)
    out = tmp_path / "out"
    # In-process: the point is the exit code and its line, not memory (the name is 5 kB).
    line = assert_refused(run_cli("convert", str(REFERENCE_DRAFTER), "-o", str(out), "-q",
                                  "--target", str(target)), TargetFormatError)
    assert "num_hidden_layers" in line and "1000000000000000000" in line


@slow
def test_tokenizer_of_a_million_tokens_is_refused_in_bounded_memory(tmp_path):
    # 19 MB of tiny tokens: the tokenizers library alone takes ~300 MB to load it, and the
    # vocabulary maps took as much again (a 60 MB one took 1.5 GB, the old cap was 256 MiB).
    target = make_target(tmp_path / "target")
    doc = json.loads((target / "tokenizer.json").read_text())
    doc["model"]["vocab"] = {f"t{i}": i for i in range(1_000_000)}
    doc["model"]["merges"] = []
    doc["added_tokens"] = []
    (target / "tokenizer.json").write_text(json.dumps(doc))
    out = tmp_path / "out"
    result = run_bounded("convert", str(REFERENCE_DRAFTER), "-o", str(out), "-q", "--target",
                         str(target), memory_mb=MEMORY_MB + 300, seconds=SECONDS)
    line = refused(result, TargetFormatError)
    assert "tokenizer.json" in line and "1000000 tokens" in line


@slow
def test_tokenizer_values_are_counted_before_the_library_parses(tmp_path):
    target = make_target(tmp_path / "target")
    doc = json.loads((target / "tokenizer.json").read_text())
    doc["model"]["merges"] = [["a", "b"]] * 400_000      # 1.2 million values, 6 MB
    (target / "tokenizer.json").write_text(json.dumps(doc))
    result = run_bounded("convert", str(REFERENCE_DRAFTER), "-o", str(tmp_path / "out"), "-q",
                         "--target", str(target), memory_mb=MEMORY_MB, seconds=SECONDS)
    line = refused(result, TargetFormatError)
    assert "tokenizer.json" in line and "1048576 JSON values" in line


# --- item 12: headers and metadata that would grow into Python objects -----------------------

def build(builder, tmp_path: Path) -> Path:
    inp = tmp_path / "input"
    builder(inp, make_corpus.Corpus(tmp_path / "scratch"))
    return inp


def convert_bounded(src: Path, tmp_path: Path):
    out = tmp_path / "out" / "art"
    result = run_bounded("convert", str(src), "-o", str(out), "-q", memory_mb=MEMORY_MB,
                         seconds=SECONDS)
    assert not out.exists() and not temp_siblings(out)
    return result


@pytest.mark.parametrize("edit, needle", [
    # The case that bound was made for: 95 MB of empty tensors, 1.7 GB and 45 s before exit 21.
    pytest.param(make_corpus.header_with_empty_tensors(1_575_000), "more than 1048576 values",
                 marks=slow),
    (make_corpus.header_with_empty_tensors(70_000), "more than the limit of 65536 tensors"),
    # 90 MB of empty arrays in one shape: no object for a json hook to count.
    pytest.param(make_corpus.header_with_shape_of_arrays(30_000_000), "more than 1048576 values",
                 marks=slow),
    # 95 MB with one emoji in a metadata string: accepted before, at 980 MB.
    pytest.param(make_corpus.header_with_wide_metadata(95_000_000), "stored 4 bytes each",
                 marks=slow),
], ids=["95MB-empty-tensors", "70k-tensors", "90MB-shape-of-arrays", "95MB-wide-text"])
def test_safetensors_header_amplification_is_refused_in_bounded_memory(tmp_path, edit, needle):
    src = build(make_corpus.edit_header(edit), tmp_path)
    line = refused(convert_bounded(src, tmp_path), SafetensorsFormatError)
    assert "model.safetensors" in line and needle in line


@slow
def test_safetensors_index_amplification_is_refused_in_bounded_memory(tmp_path):
    # 95 MB of index entries would be about 1.2 GB of dict and strings.
    src = build(make_corpus.build_index_with_entries(2_100_000), tmp_path)
    assert (src / "model.safetensors.index.json").stat().st_size > 90_000_000
    line = refused(convert_bounded(src, tmp_path), SafetensorsFormatError)
    assert "model.safetensors.index.json" in line and "more than 262144 values" in line


GGUF_AMPLIFICATIONS = [
    # The case that bound was made for: six 16M-element byte arrays in a 100 MB file, 1 GB before.
    ("6x16M-bytes", make_corpus.uint8_arrays(6, 16 * MiB), "16777216 elements: expected at most 1048576"),
    # Under the per-array limit, 70 of them: packed, they are charged their bytes.
    ("70x1M-bytes", make_corpus.uint8_arrays(70, MiB), "expected at most 67108864 for the whole file"),
    # 100 MB of two-character strings: 860 MB and 40 s before.
    ("10x1M-strings", make_corpus.string_arrays(10, 1_000_000), "expected at most 67108864 for the whole file"),
    ("160x64k-strings", make_corpus.string_arrays(160, 65_536), "expected at most 67108864 for the whole file"),
    # 96 MB of empty nested arrays: 710 MB and 80 s before.
    ("8x1M-nested", make_corpus.nested_arrays(MiB, 8), "expected at most 65536, nested ones included"),
]


@pytest.mark.parametrize("command, pairs, needle", [
    pytest.param(command, pairs, needle, id=f"{command}-{name}",
                 marks=() if (command, name) == ("validate", "70x1M-bytes") else slow)
    for name, pairs, needle in GGUF_AMPLIFICATIONS for command in ("validate", "inspect")
])
def test_gguf_metadata_amplification_is_refused_in_bounded_memory(tmp_path, artifact, command,
                                                                   pairs, needle):
    art = tmp_path / "art"
    shutil.copytree(artifact, art)
    make_corpus.insert_gguf_kv(pairs)(art)
    result = run_bounded(command, str(art), memory_mb=MEMORY_MB, seconds=SECONDS)
    if command == "validate":
        # validate reports every check; its first failure is the structure's.
        assert result.returncode == GGUFFormatError.exit_code and result.seconds < SECONDS
        assert "Traceback" not in result.stderr
        assert [ln for ln in result.stderr.splitlines() if ln.startswith("error:")] == [
            result.stderr.strip()]
        line = result.stderr
    else:
        line = refused(result, GGUFFormatError)
    assert "drafter.gguf" in line and needle in line


# --- the readers' limits, in process ----------------------------------------------------------

@slow   # writes and reads GGUF arrays of a million elements and more (~2.5 s)
def test_large_scalar_arrays_are_packed_and_compare_like_lists(tmp_path):
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    path = tmp_path / "packed.gguf"
    long_u32 = list(range(gguf_reader.MAX_LIST_LENGTH + 1))
    long_bool = [i % 3 == 0 for i in range(gguf_reader.MAX_LIST_LENGTH + 5)]
    w = GGUFWriter(path, "dflash")
    w.add_key_value("long.u32", long_u32, GGUFValueType.ARRAY, sub_type=GGUFValueType.UINT32)
    w.add_key_value("long.bool", long_bool, GGUFValueType.ARRAY, sub_type=GGUFValueType.BOOL)
    w.add_key_value("short.u32", [1, 2, 3], GGUFValueType.ARRAY, sub_type=GGUFValueType.UINT32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    g = gguf_reader.read_gguf(path)
    packed, flags = g.kv["long.u32"].value, g.kv["long.bool"].value
    assert isinstance(packed, gguf_reader.GGUFArray) and isinstance(flags, gguf_reader.GGUFArray)
    assert packed == long_u32 and flags == long_bool and packed != long_u32[:-1]
    assert packed[-1] == gguf_reader.MAX_LIST_LENGTH and flags[0] is True and flags[1] is False
    assert list(flags[:4]) == [True, False, False, True]
    assert len(repr(packed)) < 60                       # an error line that shows it stays short
    assert packed.tobytes() == struct.pack(f"<{len(long_u32)}I", *long_u32)
    assert GGUFReader(path).fields["long.u32"].contents() == list(packed)
    assert g.kv["short.u32"].value == [1, 2, 3] and type(g.kv["short.u32"].value) is list
    assert g == gguf_reader.parse_gguf_bytes(path.read_bytes(), path=str(path))


@slow   # decodes 2 x 3 MB of two-character strings up to the budget
def test_gguf_decoded_budget_counts_string_sizes():
    # 2-character strings are 10 bytes in the file and ~60 in memory: charged at the latter.
    per_array = gguf_reader.MAX_DECODED_BYTES // 100     # two arrays: 10 MB of file
    buf = (b"GGUF" + struct.pack("<IQQ", 3, 0, 2)
           + b"".join(make_corpus.string_arrays(2, per_array)()))
    start = time.perf_counter()
    with pytest.raises(GGUFFormatError, match="string element of array 'x.strings1' .* "
                                               "expected at most 67108864"):
        gguf_reader.parse_gguf_bytes(buf)
    assert time.perf_counter() - start < 10


def test_safetensors_limits_are_documented_and_consistent():
    assert safetensors_reader.MAX_HEADER_TENSORS == gguf_reader.MAX_TENSORS == 65536
    # room for a header of MAX_HEADER_TENSORS tensors of 8 dimensions
    assert safetensors_reader.MAX_HEADER_ITEMS >= 16 * safetensors_reader.MAX_HEADER_TENSORS
    assert safetensors_reader.MAX_HEADER_TEXT_BYTES == safetensors_reader.MAX_HEADER_BYTES
    for name in ("MAX_HEADER_BYTES", "MAX_HEADER_TENSORS", "MAX_HEADER_ITEMS",
                 "MAX_HEADER_TEXT_BYTES", "MAX_INDEX_ITEMS"):
        assert name in safetensors_reader.__doc__, name
    text = gguf_reader.__doc__
    for name in ("MAX_TENSORS", "MAX_KV_PAIRS", "MAX_STRING_LENGTH", "MAX_ARRAY_LENGTH",
                 "MAX_ARRAYS", "MAX_LIST_LENGTH", "MAX_DECODED_BYTES"):
        assert name in text, name
