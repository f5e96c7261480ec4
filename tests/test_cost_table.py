"""The target's cost table (docs/SCHEDULING.md, docs/REFERENCE.md §9): SPS(B) padded to the next
entry, a B beyond the table refused, and the file read strictly: every bad table is one
CostTableError line (141) naming the field, arbitrary bytes give a table or that one
refusal, and a table that is written reads back as itself."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.fuzz import fuzz_settings, json_values

from dspark_convert.errors import CostTableError, CostTableRangeError, OutputExistsError
from dspark_convert.scheduling.cost_table import (
    CostTable,
    parse_cost_table,
    read_cost_table,
    write_cost_table,
)
from dspark_convert.util.strict_json import MAX_CONFIG_BYTES

GOOD = {"tokens": [1, 4, 8], "steps_per_second": [50.0, 40, 25.5], "device": "cpu",
        "dtype": "float32", "threads": 2, "versions": {"torch": "2.13.0"}}


def table(**changes) -> CostTable:
    return parse_cost_table(json.dumps({**GOOD, **changes}).encode(), label="t", path="t")


def test_lookup_takes_the_next_larger_entry():
    """A batch between entries costs what the graph it is padded to costs."""
    t = table()
    assert [t.steps_per_second_at(b) for b in range(1, 9)] == \
        [50.0, 40.0, 40.0, 40.0, 25.5, 25.5, 25.5, 25.5]


@pytest.mark.parametrize("batch", [0, -1, 9, 10 ** 30, True, 2.0])
def test_lookup_beyond_the_table_is_refused(batch):
    with pytest.raises(CostTableRangeError) as info:
        table().steps_per_second_at(batch)
    assert info.value.exit_code == 142
    assert "1..8" in info.value.message and "\n" not in info.value.message


def test_written_table_reads_back_as_itself(tmp_path):
    t = table()
    out = write_cost_table(t, tmp_path / "cost.json")
    assert read_cost_table(out) == t
    assert json.loads(out.read_text())["tokens"] == [1, 4, 8]
    with pytest.raises(OutputExistsError):
        write_cost_table(t, out)                       # no silent overwrite
    write_cost_table(t.model_copy(update={"threads": 4}), out, force=True)
    assert read_cost_table(out).threads == 4


def test_writer_refuses_a_table_the_reader_would_refuse(tmp_path):
    bad = CostTable.model_construct(**{**GOOD, "tokens": (1, 8, 4),
                                       "steps_per_second": (1.0, 1.0, 1.0)})
    with pytest.raises(CostTableError, match=r"tokens\[2\]"):
        write_cost_table(bad, tmp_path / "cost.json")
    assert list(tmp_path.iterdir()) == []              # nothing half-written


# (what is wrong, the document's text, what the one line must name)
BAD_TABLES = [
    ("empty", {"tokens": [], "steps_per_second": []}, "tokens: expected at least one"),
    ("lengths differ", {"steps_per_second": [1.0, 2.0]}, "steps_per_second: expected one rate per entry"),
    ("not increasing", {"tokens": [1, 8, 4]}, "tokens[2]: expected strictly increasing"),
    ("repeated entry", {"tokens": [1, 4, 4]}, "tokens[2]"),
    ("zero tokens", {"tokens": [0, 4, 8]}, "tokens[0]"),
    ("negative tokens", {"tokens": [-4, 4, 8]}, "tokens[0]"),
    ("zero rate", {"steps_per_second": [1.0, 0.0, 1.0]}, "steps_per_second[1]: expected a finite positive"),
    ("negative rate", {"steps_per_second": [1.0, 1.0, -2.0]}, "steps_per_second[2]"),
    ("zero threads", {"threads": 0}, "threads"),
    ("token as text", {"tokens": ["1", 4, 8]}, "tokens.0"),
    ("token as true", {"tokens": [True, 4, 8]}, "tokens.0"),
    ("token as 4.0", {"tokens": [1, 4.0, 8]}, "tokens.1"),
    ("rate as text", {"steps_per_second": [1.0, "2", 3.0]}, "steps_per_second.1"),
    ("tokens not a list", {"tokens": "1,4,8"}, "tokens"),
    ("version not text", {"versions": {"torch": 2}}, "versions.torch"),
    ("missing field", {"device": None}, "device"),
    ("extra field", {"graph": 1}, "graph"),
]


@pytest.mark.parametrize("what,changes,names", BAD_TABLES, ids=[b[0] for b in BAD_TABLES])
def test_bad_table_is_one_line_naming_the_field(tmp_path, what, changes, names):
    doc = {**GOOD, **changes}
    doc = {k: v for k, v in doc.items() if v is not None}
    path = tmp_path / "cost.json"
    path.write_text(json.dumps(doc))
    before = path.read_bytes()
    with pytest.raises(CostTableError) as info:
        read_cost_table(path)
    err = info.value
    assert err.exit_code == 141 and "\n" not in err.message
    assert err.message.startswith(f"cost table {path}: ") and names in err.message, err.message
    assert path.read_bytes() == before                 # input untouched


@pytest.mark.parametrize("text,names", [
    ('{"tokens": [1], "tokens": [2]}', "duplicate key"),
    ('{"tokens": [1], "steps_per_second": [NaN]}', "NaN"),
    ('{"tokens": [1], "steps_per_second": [1e999]}', "too large for a double"),
    ("[1, 2", "not valid JSON"),
    ("[]", "expected an object"),
], ids=["duplicate key", "NaN", "overflowing rate", "truncated", "not an object"])
def test_bad_json_is_refused_by_the_strict_reader(tmp_path, text, names):
    path = tmp_path / "cost.json"
    path.write_text(text)
    with pytest.raises(CostTableError) as info:
        read_cost_table(path)
    assert names in info.value.message and "\n" not in info.value.message


def test_not_a_file_and_oversized_are_refused(tmp_path):
    with pytest.raises(CostTableError, match="not found"):
        read_cost_table(tmp_path / "absent.json")
    with pytest.raises(CostTableError, match="not a regular file"):
        read_cost_table(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(CostTableError, match="not a regular file"):
        read_cost_table(fifo)                          # refused, not waited on
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (MAX_CONFIG_BYTES + 1))
    with pytest.raises(CostTableError, match=f"over {MAX_CONFIG_BYTES} bytes"):
        read_cost_table(big)


def _one_outcome(data: bytes) -> None:
    """A table that satisfies every rule, or exactly one CostTableError line."""
    try:
        t = parse_cost_table(data, label="fuzz", path="fuzz")
    except CostTableError as exc:
        assert "\n" not in exc.message and exc.message.startswith("fuzz: ")
        return
    assert t.tokens and len(t.tokens) == len(t.steps_per_second)
    assert all(b > a for a, b in zip(t.tokens, t.tokens[1:])) and t.tokens[0] >= 1
    assert all(0.0 < r < float("inf") for r in t.steps_per_second)
    assert t.steps_per_second_at(t.tokens[-1]) == t.steps_per_second[-1]


@fuzz_settings(300)
@given(st.binary(max_size=300))
def test_fuzz_arbitrary_bytes(data):
    _one_outcome(data)


# Documents near a table: each field of GOOD kept, dropped or replaced by any JSON value.
near_tables = st.fixed_dictionaries({}, optional={
    key: st.one_of(st.just(value), json_values,
                   st.lists(st.integers(-3, 20) | st.floats(-1, 100, allow_nan=False), max_size=5))
    for key, value in GOOD.items()})


@fuzz_settings(300)
@given(near_tables)
def test_fuzz_documents_near_a_table(doc):
    _one_outcome(json.dumps(doc).encode())
