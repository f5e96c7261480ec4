"""decisions.jsonl (scheduling/decisions.py; docs/SCHEDULING.md "The decisions file"): what
the writer writes reads back as the same lines, floats to the bit; every bad file is one
DecisionsError line (146) naming the file, the line and the field; the size bounds hold
before anything is parsed."""

from __future__ import annotations

import json
import os

import pytest
from support.decisions import as_bytes, of_policy, record
from support.fuzz import patched_limits

from dspark_convert.errors import DecisionsError
from dspark_convert.scheduling import decisions as D
from dspark_convert.scheduling.decisions import (
    RequestDecision,
    decision_line,
    dump_line,
    parse_decisions,
    read_decisions,
)

LINE = {"step": 0, "policy": "dspark", "requests": [
    {"id": "p0", "confidence": [0.9, 0.5], "length": 1, "accepted": 1},
    {"id": "p1", "confidence": [0.1, 0.2], "length": 0, "accepted": 0}]}


def parse(data: bytes):
    return parse_decisions(data, label="decisions d.jsonl", path="d.jsonl")


def one(**changes) -> bytes:
    return json.dumps({**LINE, **changes}).encode() + b"\n"


def request(**changes) -> bytes:
    return one(requests=[{**LINE["requests"][0], **changes}])


def test_written_lines_read_back_as_themselves(tmp_path):
    lines = record(of_policy("dspark-async"), "dspark-async")
    path = tmp_path / "d.jsonl"
    path.write_bytes(as_bytes(lines))
    d = read_decisions(path)
    assert str(d.policy) == "dspark-async" and len(d.lines) == len(lines)
    assert [dump_line(x) for x in d.lines] == lines
    # repr round-trips a double: the awkward ones come back to the bit.
    awkward = (0.1 + 0.2, 1 / 3, 5e-324, 1.0 - 2 ** -53, 0.0)
    line = decision_line(0, "full", [RequestDecision(id="x", confidence=awkward, length=5,
                                                     accepted=2)])
    (back,) = parse(dump_line(line).encode()).lines
    assert back == line and back.requests[0].confidence == awkward
    assert "\n" not in dump_line(line)


def test_the_last_newline_is_optional_and_integers_0_and_1_are_confidences():
    assert parse(one().rstrip(b"\n")).lines == parse(one()).lines
    (line,) = parse(request(confidence=[1, 0], length=1, accepted=0)).lines
    assert line.requests[0].confidence == (1.0, 0.0)
    assert all(type(c) is float for c in line.requests[0].confidence)


def test_a_line_without_confidences_may_send_up_to_the_block_bound():
    (line,) = parse(request(confidence=[], length=7, accepted=7)).lines
    assert line.requests[0].length == 7


BAD = [
    # (what, bytes, needles in the one line)
    ("empty", b"", ["empty"]),
    ("blank line", one() + b"\n", ["line 2", "blank line"]),
    ("blank first line", b"\n" + one(), ["line 1", "blank line"]),
    ("whitespace line", one() + b"  \n", ["line 2", "blank"]),
    ("byte-order mark", b"\xef\xbb\xbf" + one(), ["line 1", "byte-order mark"]),
    ("not UTF-8", b'{"step": "\xff"}\n', ["line 1", "not UTF-8"]),
    ("not JSON", b"{step: 0}\n", ["line 1", "not valid JSON"]),
    ("an array", b"[1, 2]\n", ["line 1", "expected a JSON object", "list"]),
    ("a number", b"7\n", ["line 1", "expected a JSON object"]),
    ("duplicate key", b'{"step": 0, "step": 0}\n', ["duplicate key 'step'"]),
    ("NaN", request(confidence=[0.5]).replace(b"0.5", b"NaN"), ["NaN"]),
    ("Infinity", request(confidence=[0.5]).replace(b"0.5", b"Infinity"), ["Infinity"]),
    ("overflowing number", request(confidence=[0.5]).replace(b"0.5", b"1e999"), ["too large"]),
    ("huge integer", one(step=10 ** 30), ["step"]),
    ("unknown key", one(extra=1), ["extra", "no such field"]),
    ("unknown request key", request(why="x"), ["requests.0.why"]),
    ("step missing", json.dumps({"policy": "dspark", "requests": LINE["requests"]}).encode(), ["'step'", "missing"]),
    ("step a string", one(step="0"), ["step", "an integer"]),
    ("step a float", one(step=0.0), ["step", "an integer"]),
    ("step a bool", one(step=False), ["step"]),
    ("step negative", one(step=-1), ["step"]),
    ("step not from 0", one(step=1), ["step: expected 0", "found 1"]),
    ("steps not consecutive", one() + one(step=2), ["line 2", "step: expected 1", "found 2"]),
    ("step repeated", one() + one(), ["line 2", "step: expected 1", "found 0"]),
    ("policy misspelt", one(policy="dsprk"), ["policy", "dsprk"]),
    ("policy not as str(Policy) spells it", one(policy="threshold=0.60"), ["policy", "'threshold=0.6'"]),
    ("policy without its parameter", one(policy="threshold"), ["policy"]),
    ("policy a number", one(policy=1), ["policy", "a string"]),
    ("two policies", one() + one(step=1, policy="full"), ["line 2", "policy", "one policy a file"]),
    ("no requests", one(requests=[]), ["requests", "at least 1"]),
    ("requests an object", one(requests={}), ["requests"]),
    ("a request not an object", one(requests=[7]), ["requests.0"]),
    ("id repeated", one(requests=[LINE["requests"][0], LINE["requests"][0]]), ["requests.1.id", "'p0' again"]),
    ("id empty", request(id=""), ["requests.0.id"]),
    ("id a number", request(id=3), ["requests.0.id", "a string"]),
    ("id too long", request(id="x" * 257), ["requests.0.id"]),
    ("confidence above 1", request(confidence=[1.5]), ["requests.0.confidence.0", "1.5"]),
    ("confidence negative", request(confidence=[-0.1]), ["requests.0.confidence.0"]),
    ("confidence a bool", request(confidence=[True]), ["requests.0.confidence.0", "a number"]),
    ("confidence a string", request(confidence=["0.5"]), ["requests.0.confidence.0", "a number"]),
    ("confidence null", request(confidence=None), ["requests.0.confidence"]),
    ("confidence nested", request(confidence=[[0.5]]), ["requests.0.confidence.0"]),
    ("block past the bound", request(confidence=[0.5] * 129, length=1), ["requests.0.confidence", "at most 128"]),
    ("length past the block", request(length=3), ["requests.0.length", "2 confidences", "found 3"]),
    ("length past the bound", request(confidence=[], length=129, accepted=0), ["requests.0.length"]),
    ("length negative", request(length=-1, accepted=0), ["requests.0.length"]),
    ("length a float", request(length=1.0), ["requests.0.length", "an integer"]),
    ("accepted above length", request(length=1, accepted=2), ["requests.0.accepted", "0..length (1)", "found 2"]),
    ("accepted negative", request(accepted=-1), ["requests.0.accepted"]),
    ("accepted missing", one(requests=[{"id": "a", "confidence": [], "length": 0}]), ["requests.0.accepted", "missing"]),
    ("deep nesting", b"[" * 100_000 + b"]" * 100_000 + b"\n", ["line 1"]),
]


@pytest.mark.parametrize("what, data, needles", BAD, ids=[b[0] for b in BAD])
def test_each_bad_file_is_one_line_naming_the_line_and_field(what, data, needles):
    with pytest.raises(DecisionsError) as info:
        parse(data)
    error = info.value
    assert error.exit_code == 146
    assert error.message.startswith("decisions d.jsonl")
    assert "\n" not in error.message and len(error.message) < 600
    for needle in needles:
        assert needle in error.message, (needle, error.message)


def test_the_bounds_hold_before_parsing(tmp_path):
    with patched_limits(D, {"MAX_DECISIONS_BYTES": 1000, "MAX_DECISIONS_LINE_BYTES": 300,
                            "MAX_DECISIONS_LINES": 3}):
        with pytest.raises(DecisionsError, match="over 1000 bytes"):
            parse(b"x" * 1001)
        with pytest.raises(DecisionsError, match="line 1: 301 bytes; expected at most 300"):
            parse(b"{" + b" " * 300 + b"\n")
        with pytest.raises(DecisionsError, match="4 lines; expected at most 3"):
            parse(b"{}\n" * 4)
        big = tmp_path / "big.jsonl"
        big.write_bytes(b"x" * 5000)
        with pytest.raises(DecisionsError, match="over 1000 bytes"):
            read_decisions(big)


def test_the_file_itself(tmp_path):
    for path, needle in ((tmp_path / "none.jsonl", "not found"), (tmp_path, "not a regular file")):
        with pytest.raises(DecisionsError, match=needle):
            read_decisions(path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(DecisionsError, match="FIFO"):      # refused, never waited on
        read_decisions(fifo)


def test_the_writer_refuses_what_the_reader_would():
    with pytest.raises(DecisionsError) as info:
        decision_line(3, "dspark", [RequestDecision(id="a", confidence=(0.5,), length=1,
                                                     accepted=0)] * 2)
    assert "step 3" in info.value.message and "requests.1.id" in info.value.message
    with pytest.raises(DecisionsError, match="policy"):
        decision_line(0, "threshold=0.60", [])
    with pytest.raises(ValueError):          # pydantic's: a request is checked when made
        RequestDecision(id="a", confidence=(0.5,), length=1, accepted=2)


def _worst_file(path, budget: int) -> None:
    """A decisions file of up to ``budget`` bytes of what costs the reader most per byte:
    3,000 requests a step, each a full block (128) of the confidence 0."""
    block = "[" + ",".join(["0"] * 128) + "]"
    requests = ",".join(f'{{"id":"{i}","confidence":{block},"length":0,"accepted":0}}'
                        for i in range(3000))
    with open(path, "w") as fh:
        size, step = 0, 0
        while True:
            line = f'{{"step":{step},"policy":"full","requests":[{requests}]}}\n'
            if size + len(line) > budget:
                break
            fh.write(line)
            size, step = size + len(line), step + 1


def test_a_file_over_the_bound_is_refused_in_bounded_memory(tmp_path):
    from support.bounded import run_bounded
    from support.decisions import COSTS
    from dspark_convert.scheduling.cost_table import write_cost_table

    big = tmp_path / "big.jsonl"
    with open(big, "wb") as fh:                 # sparse: the reader must not read it all
        fh.truncate(D.MAX_DECISIONS_BYTES + 4096)
    cost = write_cost_table(COSTS, tmp_path / "cost.json")
    bounded = run_bounded("simulate", str(big), "--cost-table", str(cost), memory_mb=600,
                          seconds=20)
    assert bounded.returncode == 146, bounded.stderr
    assert f"over {D.MAX_DECISIONS_BYTES} bytes" in bounded.stderr


@pytest.mark.slow
def test_the_costliest_file_within_the_bound_reads_in_bounded_memory_and_time(tmp_path):
    """Measured: about 1.4 GB resident and 21 s on a 2-core VM for 64 MiB of zeros in full
    blocks; the child is capped at 2.5 GiB of address space and 90 s."""
    from support.bounded import run_bounded
    from dspark_convert.scheduling.cost_table import CostTable, write_cost_table

    worst = tmp_path / "worst.jsonl"
    _worst_file(worst, D.MAX_DECISIONS_BYTES)
    small = write_cost_table(CostTable(tokens=(1, 64), steps_per_second=(2.0, 1.0), device="d",
                                       dtype="t", threads=1, versions={}), tmp_path / "c.json")
    bounded = run_bounded("simulate", str(worst), "--cost-table", str(small),
                          memory_mb=2560, seconds=90)
    # Read whole (no 146), then its first step of 3,000 requests is past the table (142).
    assert bounded.returncode == 142, bounded.stderr
    assert "step 0: cost table: a verify step of 387000 tokens" in bounded.stderr
