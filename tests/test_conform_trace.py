"""The trace format of `dspark conform` (evaluation/conform.py): what the reader accepts and
keeps, its bounds, the writer it round-trips with, the checks against an artifact and its
target, and the schema of one line. The refusals of every kind of broken line are the
hostile corpus' (tests/test_conform_hostile.py); here, what a user relies on beyond them."""

from __future__ import annotations

import hashlib
import json
import re

import pytest
from support.fuzz import patched_limits

from dspark_convert.errors import TraceFormatError, TraceRangeError
from dspark_convert.evaluation import conform as C
from dspark_convert.evaluation.proposals import TraceLine


def write(tmp_path, text, name="trace.jsonl"):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def test_lines_are_kept_with_their_numbers_ids_and_ids_as_given(tmp_path):
    path = write(tmp_path, '{"context": [1, 17, 33], "draft": [5, 6]}\n'
                           '{"id": "req-7", "draft": [9], "context": [4]}\n'
                           '{"context": [1, 17, 33, 5], "draft": [6, 7, 8], "id": 12}')  # no last newline
    trace = C.read_trace(path)
    assert [x.line for x in trace.lines] == [1, 2, 3]
    assert [x.id for x in trace.lines] == [None, "req-7", 12]
    assert [x.context.tolist() for x in trace.lines] == [[1, 17, 33], [4], [1, 17, 33, 5]]
    assert [x.anchor for x in trace.lines] == [33, 4, 5]
    assert [x.draft for x in trace.lines] == [(5, 6), (9,), (6, 7, 8)]
    assert trace.longest_context == 4 and trace.context_tokens == 2 + 0 + 3
    assert trace.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_writer_round_trips(tmp_path):
    lines = [TraceLine.of(1, [1, 2, 3], [4, 5]), TraceLine.of(2, [2**31 - 1], [0], id="a\u00e9\u2028"),
             TraceLine.of(3, [7, 8], [9], id=0)]
    data = C.trace_bytes(lines)
    assert data.endswith(b"\n") and data.count(b"\n") == 3 and data.isascii()
    back = C.read_trace(write(tmp_path, data)).lines
    assert [(x.line, x.id, x.context.tolist(), x.draft) for x in back] == \
        [(x.line, x.id, x.context.tolist(), x.draft) for x in lines]
    assert C.trace_bytes([]) == b""


def test_contexts_sort_as_token_sequences():
    """What check_lines orders by: a prefix before its extensions, numerically (not by
    the ids' text: 9 before 10)."""
    contexts = [[10], [9, 5], [9], [9, 5, 300], [2**31 - 1], [9, 256]]
    lines = [TraceLine.of(i, c, [1]) for i, c in enumerate(contexts)]
    assert [x.context.tolist() for x in sorted(lines, key=lambda x: x.packed)] == sorted(contexts)


@pytest.mark.parametrize("limits, text, needle", [
    ({"MAX_TRACE_BYTES": 100}, '{"context": [1], "draft": [2]}\n' * 4, "124 bytes; expected at most 100"),
    ({"MAX_TRACE_LINE_BYTES": 30}, '{"context": [1], "draft": [2]}\n{"context": [1, 2], "draft": [2]}\n',
     "line 2: over 30 bytes"),
    ({"MAX_TRACE_LINES": 3}, '{"context": [1], "draft": [2]}\n' * 4, "more than 3 lines"),
])
def test_bounds(tmp_path, limits, text, needle):
    path = write(tmp_path, text)
    with patched_limits(C, limits), pytest.raises(TraceFormatError, match=needle) as info:
        C.read_trace(path)
    assert info.value.exit_code == 94 and str(path) in info.value.message


def test_a_line_exactly_at_the_bound_is_read(tmp_path):
    line = '{"context": [1], "draft": [2]}'
    with patched_limits(C, {"MAX_TRACE_LINE_BYTES": len(line)}):
        assert len(C.read_trace(write(tmp_path, line + "\n" + line)).lines) == 2


def _trace(*contexts_drafts):
    lines = tuple(TraceLine.of(i + 1, c, d) for i, (c, d) in enumerate(contexts_drafts))
    from pathlib import Path
    return C.Trace(path=Path("t.jsonl"), sha256="0" * 64, lines=lines)


def test_the_fit_to_the_target_and_drafter():
    ok = _trace(([1] * 505, [3] * 7), ([511], [0]))
    C.check_fits(ok, vocab_size=512, block_size=7, positions=512, config="config.json")
    for trace, field, needle in [
        (_trace(([1], [2]), ([1, 2, 512], [3])), "line 2.context[2]", "context[2] is token 512"),
        (_trace(([1], [2, 600])), "line 1.draft[1]", "draft[1] is token 600"),
        (_trace(([1], [2] * 8)), "line 1.draft", "a draft of 8 tokens; the drafter proposes 7"),
        (_trace(([1] * 507, [2])), "line 1.context", "need 513 positions; config.json allows 512"),
    ]:
        with pytest.raises(TraceRangeError, match=re.escape(needle)) as info:
            C.check_fits(trace, vocab_size=512, block_size=7, positions=512, config="config.json")
        assert info.value.field == field and info.value.exit_code == 95
        assert info.value.message.startswith("trace t.jsonl: line ")


def test_the_schema_is_one_lines_and_says_what_the_reader_does():
    schema = json.loads((C.Path(__file__).resolve().parent.parent / "schemas" /
                         "conform-trace.schema.json").read_text())
    assert schema["required"] == ["context", "draft"] and schema["additionalProperties"] is False
    ids = schema["properties"]["context"]["items"]
    assert (ids["type"], ids["minimum"], ids["maximum"]) == ("integer", 0, 2**31 - 1)
    assert schema["properties"]["draft"]["minItems"] == 1
    assert {t["type"] for t in schema["properties"]["id"]["anyOf"]} == {"string", "integer"}
