"""decisions.jsonl: what a scheduler saw and chose, one verify step a line
(docs/SCHEDULING.md "The decisions file").

    {"step": 0, "policy": "dspark", "requests": [{"id": "p3", "confidence": [0.9, 0.4],
     "length": 1, "accepted": 1}, ...]}

- ``step``: 0, 1, 2 ... consecutive; one file holds one run (one artifact, one policy, one
  concurrency).
- ``policy``: the policy as ``str(Policy)`` spells it (``full``, ``threshold=0.6``,
  ``dspark``, ``dspark-async``, ``target-only``); the same on every line.
- ``requests``: in the order the policy saw them (the order they joined), at least one; per
  request its ``id`` (a non-empty string, unique within the step), the ``confidence`` c_1..
  c_gamma of its drafted block as the policy saw them (numbers in [0, 1]; ``[]`` on every
  line for a drafter without a confidence head, and for a request shown none because it can
  use no draft token: one token from its end, runtime/serving.py), ``length``: the draft tokens sent for verification
  (0..gamma; at most ``MAX_BLOCK`` where there are no confidences) and ``accepted``: how many
  of those the target accepted (0..length; the bonus/correction token is not counted).

The reader is as strict as every reader here: UTF-8 without a byte-order mark, one JSON
object a line (util/strict_json: duplicate keys, NaN/Infinity and overflowing numbers
refused), unknown keys, ``true`` for a number and ``"3"`` for an integer refused, no blank
line (a last newline is optional), an empty file refused, at most ``MAX_DECISIONS_BYTES``,
``MAX_DECISIONS_LINE_BYTES`` a line and ``MAX_DECISIONS_LINES`` lines. Every refusal is one
``DecisionsError`` (146) naming the file, the line and the field.

``dump_line`` writes a line the reader reads back to the same values (floats by repr, which
round-trips a double exactly). ``schemas/decisions.schema.json`` is ``DecisionLine``'s.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Annotated

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, StrictStr,
                      ValidationError, field_validator, model_validator)
from pydantic_core import PydanticCustomError

from dspark_convert.contract.dspark import MAX_BLOCK_SIZE
from dspark_convert.errors import DecisionsError, SchedulingPolicyError
from dspark_convert.scheduling.policies import Policy, parse_policy
from dspark_convert.util.models import first_problem
from dspark_convert.util.paths import check_input_file, open_regular
from dspark_convert.util.strict_json import json_error_text, loads_strict
from dspark_convert.util.text import shown

# Bounds, not targets. A serve-bench run of 1,000 prompts of 512 new tokens is ~170,000
# request-steps, ~35 MB as this writer writes them (~200 bytes a request-step with 7
# confidences); a longer run is split into files. What costs the reader most per byte is
# short numbers in full blocks: 64 MiB of zeros in 128-token blocks reads in ~1.4 GB and
# ~21 s on a 2-core VM (the slow test in tests/test_decisions.py runs it under a 2.5 GiB
# cap); a realistic file takes ~7 times its size.
MAX_DECISIONS_BYTES = 64 * 1024 * 1024
MAX_DECISIONS_LINE_BYTES = 1024 * 1024
MAX_DECISIONS_LINES = 1_000_000
# A length without confidences to bound it is bounded by the longest block a drafter may
# have (Strata's limit).
MAX_BLOCK = MAX_BLOCK_SIZE
MAX_ID_CHARS = 256



def _a_number(value: object) -> object:
    """A JSON number as a float (an integer 0 or 1 is a number in [0, 1]: some writers put
    1.0 as 1); true, a string or null is refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PydanticCustomError("float_type", "a number")
    return float(value)


Confidence = Annotated[float, Field(ge=0.0, le=1.0), BeforeValidator(_a_number)]


def _rule(where: str, why: str) -> PydanticCustomError:
    """A cross-field rule broken: the reader names ``where`` as the field."""
    return PydanticCustomError("decision_rule", "{where}: {why}", {"where": where, "why": why})


class RequestDecision(BaseModel):
    """One request of one verify step: what the policy saw of it and chose for it."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True,
                              title="decisions.jsonl request")

    id: Annotated[StrictStr, Field(min_length=1, max_length=MAX_ID_CHARS)] = Field(
        description="The request's id (the prompt's id); unique within a step.")
    # A tuple (frozen) read from a JSON list: lax about the container only.
    confidence: Annotated[tuple[Confidence, ...],
                          Field(strict=False, max_length=MAX_BLOCK)] = Field(
        description="c_1..c_gamma of the drafted block as the policy saw them (calibrated "
        "where a calibration was applied); [] for a drafter without a confidence head.")
    length: Annotated[StrictInt, Field(ge=0, le=MAX_BLOCK)] = Field(
        description="Draft tokens sent for verification (0..gamma).")
    accepted: Annotated[StrictInt, Field(ge=0, le=MAX_BLOCK)] = Field(
        description="How many of those the target accepted (0..length; the bonus or "
        "correction token is not counted).")

    @model_validator(mode="after")
    def _counts(self) -> "RequestDecision":
        if self.confidence and self.length > len(self.confidence):
            raise _rule("length", f"expected at most the block's {len(self.confidence)} "
                        f"confidences, found {self.length}")
        if self.accepted > self.length:
            raise _rule("accepted", f"expected 0..length ({self.length}), found {self.accepted}")
        return self


class DecisionLine(BaseModel):
    """One line of decisions.jsonl: one verify step."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True,
                              title="decisions.jsonl line")

    step: Annotated[StrictInt, Field(ge=0, le=MAX_DECISIONS_LINES)] = Field(
        description="0, 1, 2 ... consecutive within the file (one run).")
    policy: StrictStr = Field(
        description="The policy as str(Policy) spells it: full, threshold=X, dspark, "
        "dspark-async, target-only; the same on every line.")
    requests: Annotated[tuple[RequestDecision, ...], Field(strict=False, min_length=1)] = Field(
        description="The step's requests in the order the policy saw them (order of joining).")

    @field_validator("policy")
    @classmethod
    def _spelt_as_policy(cls, value: str) -> str:
        try:
            canonical = str(parse_policy(value))
        except SchedulingPolicyError as exc:
            raise ValueError(exc.message) from None
        if canonical != value:
            raise ValueError(f"the policy as str(Policy) spells it ({canonical!r})")
        return value

    @model_validator(mode="after")
    def _unique_ids(self) -> "DecisionLine":
        seen: dict[str, int] = {}
        for i, request in enumerate(self.requests):
            if request.id in seen:
                raise _rule(f"requests.{i}.id", f"expected ids unique within a step, found "
                            f"{shown(request.id)!r} again (requests.{seen[request.id]})")
            seen[request.id] = i
        return self


@dataclass(frozen=True)
class Decisions:
    """A whole decisions file: one run of one policy, its lines in step order."""

    path: str
    policy: Policy
    lines: tuple[DecisionLine, ...]

    @cached_property
    def headless(self) -> bool:
        """No request on any line has confidences: a drafter without a confidence head.
        (A request without them in a file that has some was shown none: no room left.)
        Cached: the replay, the sweep and the check ask at every step, and a scan of the
        whole file per step would make them quadratic in its lines."""
        return not any(r.confidence for line in self.lines for r in line.requests)


def _problem(exc: ValidationError) -> tuple[str, str]:
    """(field, why) of a validation error's first problem, one line."""
    err = exc.errors()[0]
    if err.get("type") == "decision_rule":
        loc = ".".join(str(p) for p in err.get("loc", ()))
        where = str(err["ctx"]["where"])
        field = f"{loc}.{where}" if loc else where
        return field, f"{field}: {err['ctx']['why']}"
    if err.get("type") in ("too_short", "too_long"):
        field = ".".join(str(p) for p in err.get("loc", ()))
        bound = err["ctx"].get("min_length", err["ctx"].get("max_length"))
        most = "least" if err["type"] == "too_short" else "most"
        return field, (f"field '{field}': expected at {most} {bound} entries, found "
                       f"{err['ctx'].get('actual_length')}")
    problem = first_problem(exc)
    return problem.field, shown(problem.message)


def decision_line(step: int, policy: str, requests: Sequence[RequestDecision]) -> DecisionLine:
    """A checked line (what a writer records); DecisionsError naming the field of a line the
    reader would refuse."""
    try:
        return DecisionLine(step=step, policy=policy, requests=tuple(requests))
    except ValidationError as exc:
        field, why = _problem(exc)
        raise DecisionsError(f"decision line of step {step}: {why}", field=field) from None


def dump_line(line: DecisionLine) -> str:
    """``line`` as one JSON line without its newline; each float written by repr (json's
    own float form), which reads back as the same double."""
    return json.dumps({"step": line.step, "policy": line.policy, "requests": [
        {"id": r.id, "confidence": list(r.confidence), "length": r.length,
         "accepted": r.accepted} for r in line.requests]}, allow_nan=False)


def _line(body: bytes, number: int, *, label: str, path: str) -> DecisionLine:
    where = f"{label}: line {number}"

    def refuse(why: str, field: str | None = None) -> DecisionsError:
        name = f"line {number}" + (f".{field}" if field else "")
        return DecisionsError(f"{where}: {why}", path=path, field=name)

    if len(body) > MAX_DECISIONS_LINE_BYTES:
        raise DecisionsError(f"{where}: {len(body)} bytes; expected at most "
                             f"{MAX_DECISIONS_LINE_BYTES} bytes a line", path=path,
                             field=f"line {number}", expected=MAX_DECISIONS_LINE_BYTES,
                             found=len(body))
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise refuse(f"not UTF-8 text (byte {exc.start})") from None
    if number == 1 and text.startswith("\ufeff"):
        raise refuse("starts with a byte-order mark; expected plain UTF-8")
    if not text.strip():
        raise refuse("blank line; expected one JSON object a line (one verify step)")
    try:
        obj = loads_strict(text)
    except (ValueError, RecursionError) as exc:
        raise refuse(f"not valid JSON: {json_error_text(exc)}") from None
    if not isinstance(obj, dict):
        raise refuse(f"expected a JSON object (one verify step), found {type(obj).__name__}")
    try:
        return DecisionLine.model_validate(obj)
    except ValidationError as exc:
        field, why = _problem(exc)
        raise refuse(why, field) from None


def parse_decisions(data: bytes, *, label: str, path: str) -> Decisions:
    """The bytes of a decisions file as Decisions, or one DecisionsError naming ``label``,
    the line and the field."""
    if len(data) > MAX_DECISIONS_BYTES:
        raise DecisionsError(f"{label}: over {MAX_DECISIONS_BYTES} bytes; expected at most "
                             f"{MAX_DECISIONS_BYTES}", path=path, expected=MAX_DECISIONS_BYTES,
                             found=f"> {MAX_DECISIONS_BYTES}")
    if not data:
        raise DecisionsError(f"{label}: empty; expected one JSON object a line (one verify "
                             "step)", path=path, expected="at least one step", found=0)
    bodies = data.split(b"\n")
    if bodies[-1] == b"":
        bodies.pop()                      # the final newline
    if len(bodies) > MAX_DECISIONS_LINES:
        raise DecisionsError(f"{label}: {len(bodies)} lines; expected at most "
                             f"{MAX_DECISIONS_LINES} steps", path=path,
                             expected=MAX_DECISIONS_LINES, found=len(bodies))
    lines: list[DecisionLine] = []
    for number, body in enumerate(bodies, start=1):
        line = _line(body, number, label=label, path=path)
        if line.step != number - 1:
            raise DecisionsError(f"{label}: line {number}: step: expected {number - 1} (steps "
                                 f"consecutive from 0, one run a file), found {line.step}",
                                 path=path, field=f"line {number}.step", expected=number - 1,
                                 found=line.step)
        if lines and line.policy != lines[0].policy:
            raise DecisionsError(f"{label}: line {number}: policy: expected {lines[0].policy!r} "
                                 f"(line 1's; one policy a file), found {line.policy!r}",
                                 path=path, field=f"line {number}.policy",
                                 expected=lines[0].policy, found=line.policy)
        lines.append(line)
    return Decisions(path=path, policy=parse_policy(lines[0].policy), lines=tuple(lines))


def read_decisions(path: str | os.PathLike) -> Decisions:
    """Read and check a whole decisions file (at most MAX_DECISIONS_BYTES read)."""
    label = f"decisions {path}"
    checked = check_input_file(path, label=label, error=DecisionsError,
                               expected="a decisions.jsonl file")
    try:
        with open_regular(checked, label=label, error=DecisionsError) as fh:
            data = fh.read(MAX_DECISIONS_BYTES + 1)     # parse_decisions refuses the one more
    except FileNotFoundError:
        raise DecisionsError(f"{label}: not found", path=str(checked),
                             expected="a decisions.jsonl file", found="nothing") from None
    except OSError as exc:
        raise DecisionsError(f"{label}: cannot read: {os.strerror(exc.errno or 0) or exc}",
                             path=str(checked)) from None
    return parse_decisions(data, label=label, path=str(Path(checked)))
