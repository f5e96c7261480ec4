"""The target's cost table: verify steps per second by the tokens a verify step sends
(docs/REFERENCE.md §9: SPS(B), profiled once; docs/SCHEDULING.md "The cost table").

    {"tokens": [1, 2, 4, 8], "steps_per_second": [50.0, 49.1, 47.8, 44.0],
     "device": "...", "dtype": "bfloat16", "threads": 16, "versions": {"torch": "2.13.0"}}

``tokens`` are strictly increasing positive integers, each rate finite and positive, one
rate per entry. A B between two entries takes the next larger entry's rate: an engine pads
a batch to its next captured graph size, so a step of B tokens costs what that size costs.
A B beyond the largest entry is refused (CostTableRangeError): the table does not say what
it costs. A table measured on another machine is the same file.
"""

from __future__ import annotations

import bisect
import math
import os
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt

from dspark_convert.errors import CostTableError, CostTableRangeError
from dspark_convert.util.atomic import atomic_file
from dspark_convert.util.json_out import dumps_model
from dspark_convert.util.models import validated
from dspark_convert.util.paths import check_input_file
from dspark_convert.util.strict_json import parse_json_strict, read_capped


class CostTable(BaseModel):
    """cost_table.json: the target's verify steps per second at each batch size in tokens,
    and where it was measured (device, dtype, threads, library versions)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    # Tuples (frozen) read from JSON lists: the field is lax about the container only, its
    # items stay strict (no "4", no true, no 4.0 for a token count).
    tokens: Annotated[tuple[StrictInt, ...], Field(strict=False)]   # B, increasing, >= 1
    steps_per_second: Annotated[tuple[StrictFloat, ...], Field(strict=False)]   # SPS(B)
    device: str
    dtype: str
    threads: int
    versions: dict[str, str]
    # How a step of B tokens was measured: as this many requests' blocks (`dspark profile
    # --requests R`: the table of a concurrency of R); null: blocks of a fixed size, or a
    # table measured elsewhere that does not say.
    requests: int | None = None

    def steps_per_second_at(self, batch_tokens: int) -> float:
        """SPS(B): the rate of the smallest entry >= B (the graph size B is padded to);
        CostTableRangeError for a B beyond the largest entry or below 1."""
        largest = self.tokens[-1]
        if isinstance(batch_tokens, bool) or not isinstance(batch_tokens, int) \
                or not 1 <= batch_tokens <= largest:
            raise CostTableRangeError(
                f"cost table: a verify step of {batch_tokens} tokens; expected 1..{largest} "
                f"(the table's largest entry)", field="tokens", expected=f"1..{largest}",
                found=str(batch_tokens))
        return self.steps_per_second[bisect.bisect_left(self.tokens, batch_tokens)]


def table_problem(table: CostTable) -> str | None:
    """Why ``table`` is not a cost table (None when it is one): the rules the schema cannot
    state. Shared by the reader and the writer, so that nothing written is unreadable."""
    if not table.tokens:
        return "tokens: expected at least one entry, found none"
    if len(table.tokens) != len(table.steps_per_second):
        return (f"steps_per_second: expected one rate per entry of tokens "
                f"({len(table.tokens)}), found {len(table.steps_per_second)}")
    for i, b in enumerate(table.tokens):
        if b < 1 or (i and b <= table.tokens[i - 1]):
            return (f"tokens[{i}]: expected strictly increasing positive integers, found {b}"
                    + (f" after {table.tokens[i - 1]}" if i else ""))
    for i, rate in enumerate(table.steps_per_second):
        if not (math.isfinite(rate) and rate > 0.0):
            return f"steps_per_second[{i}]: expected a finite positive number, found {rate}"
    if table.threads < 1:
        return f"threads: expected a positive integer, found {table.threads}"
    if table.requests is not None and table.requests < 1:
        return f"requests: expected a positive integer or null, found {table.requests}"
    return None


def parse_cost_table(data: bytes, *, label: str, path: str) -> CostTable:
    """The bytes of a cost table file as a CostTable, or one CostTableError line naming
    ``label`` and the field."""
    raw = parse_json_strict(data, error=CostTableError, label=label, path=path)
    table = validated(CostTable, raw, error=CostTableError, label=label, path=path)
    why = table_problem(table)
    if why is not None:
        raise CostTableError(f"{label}: {why}", path=path)
    return table


def read_cost_table(path: str | os.PathLike) -> CostTable:
    """Read a cost table file (at most util/strict_json.MAX_CONFIG_BYTES)."""
    label = f"cost table {path}"
    path = check_input_file(path, label=label, error=CostTableError, expected="a cost table JSON file")
    return parse_cost_table(read_capped(path, error=CostTableError, label=label),
                            label=label, path=str(path))


def write_cost_table(table: CostTable, path: str | os.PathLike, *, force: bool = False) -> Path:
    """Write ``table`` whole or not at all (util/atomic); CostTableError for a table the
    reader would refuse."""
    why = table_problem(table)
    if why is not None:
        raise CostTableError(f"cost table {path}: {why}", path=str(path))
    text = dumps_model(table, indent=2) + "\n"
    return atomic_file(path, lambda fh: fh.write(text.encode()), force=force)
