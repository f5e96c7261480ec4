"""Property tests of the decisions reader (scheduling/decisions.py ``parse_decisions``):
whatever bytes a decisions file holds, it returns the steps or raises DecisionsError in one
line naming the file, never anything else and never slowly; a mutated valid file (a value
replaced by any JSON value, a line dropped or repeated, bytes flipped) likewise; and what
it accepts keeps the format's rules, said here independently of the reader.

The default run is short; DSPARK_FUZZ_EXAMPLES raises every example count (`make fuzz`).
"""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.decisions import as_bytes, of_policy, record
from support.fuzz import fuzz_settings, json_values

from dspark_convert.errors import DecisionsError
from dspark_convert.scheduling.decisions import Decisions, parse_decisions

pytestmark = pytest.mark.slow

MAX_SECONDS_PER_EXAMPLE = 1.0
GOOD = record(of_policy("dspark"), "dspark", steps=4)


def outcome(data: bytes) -> Decisions | None:
    """The reader's verdict: Decisions, or None for its one-line refusal; anything else
    (another exception, a slow parse) fails the test."""
    start = time.perf_counter()
    try:
        result = parse_decisions(data, label="decisions f.jsonl", path="f.jsonl")
    except DecisionsError as exc:
        assert exc.exit_code == 146
        assert exc.message.startswith("decisions f.jsonl") and "\n" not in exc.message
        result = None
    assert time.perf_counter() - start < MAX_SECONDS_PER_EXAMPLE
    return result


def keeps_the_format(d: Decisions) -> None:
    """What an accepted file must be, said again from docs/SCHEDULING.md."""
    policies = {line.policy for line in d.lines}
    assert policies == {str(d.policy)}
    assert [line.step for line in d.lines] == list(range(len(d.lines)))
    for line in d.lines:
        ids = [r.id for r in line.requests]
        assert ids and len(set(ids)) == len(ids)
        for r in line.requests:
            assert all(type(c) is float and 0.0 <= c <= 1.0 for c in r.confidence)
            assert 0 <= r.accepted <= r.length
            assert not r.confidence or r.length <= len(r.confidence)


@given(st.binary(max_size=400))
@fuzz_settings(300)
def test_arbitrary_bytes(data):
    result = outcome(data)
    if result is not None:
        keeps_the_format(result)


def _paths(value, where=()):
    """Every place in a JSON value (as index tuples), the value itself included."""
    yield where
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, where + (key,))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _paths(item, where + (i,))


def _replaced(doc, where, value):
    if not where:
        return value
    head, rest = where[0], where[1:]
    if isinstance(doc, dict):
        return {**doc, head: _replaced(doc[head], rest, value)}
    out = list(doc)
    out[head] = _replaced(doc[head], rest, value)
    return out


@given(st.data())
@fuzz_settings(300)
def test_mutated_valid_files(data):
    docs = [json.loads(line) for line in GOOD]
    n = data.draw(st.integers(0, len(docs) - 1))
    places = list(_paths(docs[n]))
    where = data.draw(st.sampled_from(places))
    docs[n] = _replaced(docs[n], where, data.draw(json_values))
    lines = [json.dumps(doc) for doc in docs]
    edit = data.draw(st.sampled_from(["none", "drop", "repeat", "swap"]))
    k = data.draw(st.integers(0, len(lines) - 1))
    if edit == "drop":
        del lines[k]
    elif edit == "repeat":
        lines.insert(k, lines[k])
    elif edit == "swap" and k + 1 < len(lines):
        lines[k], lines[k + 1] = lines[k + 1], lines[k]
    raw = bytearray(as_bytes(lines))
    for _ in range(data.draw(st.integers(0, 2))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    result = outcome(bytes(raw))
    if result is not None:
        keeps_the_format(result)


def test_the_valid_file_is_accepted():
    """The mutations start from a file the reader takes (else they would test nothing)."""
    d = outcome(as_bytes(GOOD))
    assert d is not None and len(d.lines) == 4
    keeps_the_format(d)
