"""Property tests of the trace reader (evaluation/conform.py ``read_trace``): whatever bytes a
trace holds, it returns the lines or raises TraceFormatError in one line naming the file,
never anything else and never slowly; what it accepts is exactly what the format says (a
line is kept as written: its ids, its id, its number), and what the writer writes it reads
back unchanged.

The default run is short; DSPARK_FUZZ_EXAMPLES raises every example count (`make fuzz`).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.fuzz import fuzz_settings, json_values

from dspark_convert import errors
from dspark_convert.evaluation import conform as C
from dspark_convert.evaluation.proposals import TraceLine

pytestmark = pytest.mark.slow

MAX_SECONDS_PER_EXAMPLE = 1.0
fuzz = fuzz_settings
GOOD = (b'{"id": "r0", "context": [1, 17, 33, 90, 250, 7, 7, 401, 251], "draft": [490, 286, 489]}\n'
        b'{"context": [1, 17, 33, 90, 250, 7, 7, 401, 251, 23], "draft": [363, 461, 23, 363], "id": 4}\n')


@pytest.fixture(scope="module")
def scratch():
    with tempfile.TemporaryDirectory(prefix="dspark-conform-fuzz-") as d:
        yield Path(d) / "trace.jsonl"


def valid_record(obj) -> bool:
    """The format, said independently of the reader: a JSON object with context and draft
    (non-empty lists of integers 0..2^31-1, booleans not integers) and optionally an id (a
    non-empty string or an integer), nothing else."""
    def ids(v):
        return isinstance(v, list) and v and all(
            type(t) is int and 0 <= t <= 2**31 - 1 for t in v)
    if not isinstance(obj, dict) or not {"context", "draft"} <= obj.keys() <= {"id", "context", "draft"}:
        return False
    if "id" in obj and not (type(obj["id"]) is int or (isinstance(obj["id"], str) and obj["id"])):
        return False
    return bool(ids(obj["context"]) and ids(obj["draft"]))


def check(path: Path, content: bytes):
    path.write_bytes(content)
    start = time.perf_counter()
    try:
        trace = C.read_trace(path)
    except errors.DSparkError as exc:
        assert type(exc) is errors.TraceFormatError and exc.exit_code == 94
        assert "\n" not in exc.message and exc.message.startswith(f"trace {path}:"), exc.message
        trace = None
    assert time.perf_counter() - start < MAX_SECONDS_PER_EXAMPLE
    return trace


def test_the_good_trace_is_read(scratch):
    trace = check(scratch, GOOD)
    assert [x.id for x in trace.lines] == ["r0", 4] and trace.lines[1].anchor == 23


@fuzz(300)
@given(content=st.binary(max_size=300))
def test_arbitrary_bytes(scratch, content):
    check(scratch, content)


@fuzz(300)
@given(edits=st.lists(st.tuples(st.sampled_from(["flip", "insert", "delete"]),
                                st.integers(0, len(GOOD) - 1), st.integers(0, 255)),
                      min_size=1, max_size=5))
def test_byte_edits_of_a_good_trace(scratch, edits):
    data = bytearray(GOOD)
    for op, at, value in edits:
        at = min(at, len(data) - 1) if data else 0
        if op == "flip" and data:
            data[at] ^= value or 1
        elif op == "insert":
            data.insert(at, value)
        elif data:
            del data[at]
    check(scratch, bytes(data))


@fuzz(300)
@given(objs=st.lists(st.one_of(
    json_values,
    st.fixed_dictionaries({"context": json_values, "draft": json_values}),
    st.fixed_dictionaries({"context": st.lists(st.integers(-3, 2**31 + 3), max_size=4),
                           "draft": st.lists(st.one_of(st.integers(-1, 600), st.booleans()), max_size=3)},
                          optional={"id": st.one_of(st.text(max_size=3), st.integers(), st.none()),
                                    "anchor": st.integers(0, 9)})),
    min_size=1, max_size=4))
def test_a_line_is_accepted_exactly_when_it_follows_the_format(scratch, objs):
    """Lines of arbitrary JSON values and near-valid records: the trace is read exactly
    when every line follows the format (said independently above), and then each line is
    kept as written; else the first line that does not is named."""
    content = "".join(json.dumps(o) + "\n" for o in objs).encode()
    trace = check(scratch, content)
    good = [valid_record(o) for o in objs]
    if all(good):
        assert trace is not None
        assert [(x.line, x.id, x.context.tolist(), list(x.draft)) for x in trace.lines] == \
            [(n, o.get("id"), o["context"], o["draft"]) for n, o in enumerate(objs, start=1)]
    else:
        assert trace is None
        scratch.write_bytes(content)
        with pytest.raises(errors.TraceFormatError, match=f": line {good.index(False) + 1}: "):
            C.read_trace(scratch)


@fuzz(200)
@given(lines=st.lists(st.tuples(
    st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=40),
    st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=8),
    st.one_of(st.none(), st.integers(-2**70, 2**70), st.text(min_size=1, max_size=6).filter(
        lambda s: not any(0xD800 <= ord(c) <= 0xDFFF for c in s)))), min_size=1, max_size=6))
def test_what_the_writer_writes_is_read_back(scratch, lines):
    written = [TraceLine.of(n, c, d, i) for n, (c, d, i) in enumerate(lines, start=1)]
    trace = check(scratch, C.trace_bytes(written))
    assert [(x.line, x.id, x.context.tolist(), x.draft) for x in trace.lines] == \
        [(x.line, x.id, x.context.tolist(), x.draft) for x in written]
