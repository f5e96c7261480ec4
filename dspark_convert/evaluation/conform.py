"""The trace of `dspark conform`: the drafts an engine made, one JSON object a line.

A line is ``{"context": [...], "draft": [...]}`` with an optional ``"id"``:

- ``context``: every committed token id up to and including the anchor (the last committed
  token, which the engine put in the block's first row), in order: the prompt and
  everything the engine committed since. Non-empty.
- ``draft``: the token ids the engine proposed after the anchor, in order. Non-empty (a
  draft call that proposed nothing has nothing to compare: leave it out).
- ``id``: a label of the engine's own (a request, a prompt, a draft call): a non-empty
  string or an integer; it need not be unique. A refusal or a difference names it.

Token ids are JSON integers from 0 to 2^31 - 1: ``true``, ``7.0``, ``"7"`` and negatives
are refused; the ids are checked against the target's vocabulary, the draft against the
drafter's block and the context against the target's positions once the artifact and its
target are read (``check_fits``, 95). The file is read as strictly as `dspark eval`'s
prompt set (evaluation/prompts.py): UTF-8 without a byte-order mark, one object a line, no
blank line, duplicate keys, NaN and unknown keys refused, at most ``MAX_TRACE_BYTES``
bytes, ``MAX_TRACE_LINE_BYTES`` a line and ``MAX_TRACE_LINES`` lines; a last newline is
optional. Every refusal is one ``TraceFormatError`` (94) naming the file and the line.
The file is read line by line (never whole) and each context kept as 4 bytes an id.

``schemas/conform-trace.schema.json`` is ``TraceRecord``'s schema (tools/schemas.py);
docs/CONFORMANCE.md says how to write a trace from an engine and from DeepSpec's own
reference.json.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

from dspark_convert.errors import TraceFormatError, TraceRangeError
from dspark_convert.evaluation.proposals import TraceLine
from dspark_convert.util.paths import check_input_file, open_regular
from dspark_convert.util.strict_json import json_error_text, loads_strict
from dspark_convert.util.text import shown

# Bounds, not targets. A 262,144-token context of 6-digit ids is 1.8 MB as JSON; 10,000
# drafts of 2,000-token contexts are 120 MB. What is kept is 4 bytes an id of context.
MAX_TRACE_BYTES = 256 * 1024 * 1024
MAX_TRACE_LINE_BYTES = 4 * 1024 * 1024
MAX_TRACE_LINES = 1_000_000
MAX_TOKEN_ID = 2**31 - 1

TokenId = Annotated[StrictInt, Field(ge=0, le=MAX_TOKEN_ID)]


class TraceRecord(BaseModel):
    """One line of a conform trace: one draft an engine made."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True,
                              title="dspark conform trace line")

    # No None in the type: an absent id is None, an explicit null is refused.
    id: Annotated[StrictStr, Field(min_length=1)] | StrictInt = Field(
        default=None, description="A label of the engine's own (request, prompt, draft call); "
        "need not be unique.")
    context: list[TokenId] = Field(
        min_length=1, description="Every committed token id up to and including the anchor "
        "(the block's first row).")
    draft: list[TokenId] = Field(
        min_length=1, description="The token ids the engine proposed after the anchor.")


@dataclass(frozen=True)
class Trace:
    path: Path
    sha256: str                    # of the file's bytes
    lines: tuple[TraceLine, ...]   # line numbers are the file's

    @property
    def longest_context(self) -> int:
        return max(x.context_length for x in self.lines)

    @property
    def context_tokens(self) -> int:
        """Tokens before the anchors, over every line: what one prefill a line would run."""
        return sum(x.context_length - 1 for x in self.lines)


_EXPECTED = {"id": "a non-empty string or an integer",
             "context": "a non-empty list of token ids (integers 0..2^31-1)",
             "draft": "a non-empty list of token ids (integers 0..2^31-1)"}


def _found(value: object) -> str:
    if isinstance(value, (list, dict)):
        return f"a JSON {'array' if isinstance(value, list) else 'object'}"
    return shown(json.dumps(value))[:40]


def _first_error(exc: ValidationError, obj: dict) -> str:
    err = exc.errors()[0]
    loc = err.get("loc", ())
    kind = err.get("type")
    if kind == "extra_forbidden":
        return f"unknown key {shown(str(loc[0]))!r}; expected context, draft and optionally id"
    if kind == "missing":
        return f"{loc[0]}: missing; expected {_EXPECTED[str(loc[0])]}"
    key = str(loc[0]) if loc else ""
    value = obj.get(key)
    if key in ("context", "draft") and isinstance(value, list) and len(loc) > 1 \
            and isinstance(loc[1], int):
        return (f"{key}[{loc[1]}]: expected a token id (an integer 0..2^31-1), found "
                f"{_found(value[loc[1]])}")
    if key in ("context", "draft") and value == []:
        return f"{key}: empty; expected {_EXPECTED[key]}"
    if kind == "string_unicode":
        return f"{key}: not Unicode text (a lone surrogate escape), found {_found(value)}"
    if key in _EXPECTED:
        return f"{key}: expected {_EXPECTED[key]}, found {_found(value)}"
    return shown(str(err.get("msg", "invalid")))


def _record(text: str, where: str, path: str, number: int) -> TraceRecord:
    def refuse(why: str) -> TraceFormatError:
        return TraceFormatError(f"{where}: {why}", path=path, field=f"line {number}")

    if not text.strip():
        raise refuse("blank line; expected one JSON object a line")
    try:
        obj = loads_strict(text)
    except (ValueError, RecursionError) as exc:
        multiline = ("; expected JSONL, one JSON object a line, not a JSON document over "
                     "several lines" if text.strip() in ("{", "[") else "")
        raise refuse(f"not valid JSON: {json_error_text(exc)}{multiline}") from None
    if not isinstance(obj, dict):
        raise refuse(f"expected a JSON object, found {_found(obj)}")
    try:
        record = TraceRecord.model_validate(obj)
    except ValidationError as exc:
        raise refuse(_first_error(exc, obj)) from None
    return record


def read_trace(path: str | os.PathLike) -> Trace:
    """Read and check a trace file, line by line, in bounded memory."""
    label = f"trace {path}"
    path = check_input_file(path, label=label, error=TraceFormatError, expected="a JSONL file")
    where_file = str(path)
    try:
        size = path.stat().st_size
        if size > MAX_TRACE_BYTES:
            raise TraceFormatError(f"{label}: {size} bytes; expected at most {MAX_TRACE_BYTES}",
                                   path=where_file, expected=MAX_TRACE_BYTES, found=size)
        lines: list[TraceLine] = []
        digest = hashlib.sha256()
        total = 0
        with open_regular(path, label=label, error=TraceFormatError) as fh:
            number = 0
            while True:
                raw = fh.readline(MAX_TRACE_LINE_BYTES + 2)   # the line, its newline, one more
                if not raw:
                    break
                number += 1
                total += len(raw)
                digest.update(raw)
                where = f"{label}: line {number}"
                if total > MAX_TRACE_BYTES:     # a file that grew since stat: still bounded
                    raise TraceFormatError(f"{label}: over {MAX_TRACE_BYTES} bytes; expected at "
                                           f"most {MAX_TRACE_BYTES}", path=where_file,
                                           expected=MAX_TRACE_BYTES, found=f"> {MAX_TRACE_BYTES}")
                body = raw[:-1] if raw.endswith(b"\n") else raw
                if len(body) > MAX_TRACE_LINE_BYTES:
                    raise TraceFormatError(f"{where}: over {MAX_TRACE_LINE_BYTES} bytes; expected "
                                           f"at most {MAX_TRACE_LINE_BYTES} bytes a line",
                                           path=where_file, field=f"line {number}",
                                           expected=MAX_TRACE_LINE_BYTES,
                                           found=f"> {MAX_TRACE_LINE_BYTES}")
                if number > MAX_TRACE_LINES:
                    raise TraceFormatError(f"{label}: more than {MAX_TRACE_LINES} lines; expected "
                                           f"at most {MAX_TRACE_LINES} drafts", path=where_file,
                                           expected=MAX_TRACE_LINES, found=f"> {MAX_TRACE_LINES}")
                try:
                    text = body.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise TraceFormatError(f"{where}: not UTF-8 text (byte {exc.start})",
                                           path=where_file, field=f"line {number}") from None
                if number == 1 and text.startswith("\ufeff"):
                    raise TraceFormatError(f"{where}: starts with a byte-order mark; expected "
                                           "plain UTF-8", path=where_file, field="line 1")
                record = _record(text, where, where_file, number)
                lines.append(TraceLine.of(number, record.context, record.draft, record.id))
    except FileNotFoundError:
        raise TraceFormatError(f"{label}: not found", path=where_file, expected="a JSONL file",
                               found="nothing") from None
    except OSError as exc:
        raise TraceFormatError(f"{label}: cannot read: {os.strerror(exc.errno or 0) or exc}",
                               path=where_file) from None
    if not lines:
        raise TraceFormatError(f"{label}: no line; expected one JSON object a line (a draft)",
                               path=where_file, expected="at least one draft", found=0)
    return Trace(path=path, sha256=digest.hexdigest(), lines=tuple(lines))


def check_fits(trace: Trace, *, vocab_size: int, block_size: int, positions: int,
               config: str) -> None:
    """Every line against the artifact and its target (95): ids inside the vocabulary, a
    draft no longer than the block, the context and the block within the target's
    positions (``positions``: its max_position_embeddings, read from ``config``)."""
    label = f"trace {trace.path}"
    for x in trace.lines:
        where = f"{label}: line {x.line}"
        for key, ids in (("context", x.context), ("draft", np.asarray(x.draft))):
            outside = np.flatnonzero(ids >= vocab_size)
            if outside.size:
                over = int(outside[0])
                raise TraceRangeError(f"{where}: {key}[{over}] is token {int(ids[over])}; the "
                                      f"target's vocabulary has {vocab_size} tokens (0.."
                                      f"{vocab_size - 1})", path=str(trace.path),
                                      field=f"line {x.line}.{key}[{over}]",
                                      expected=f"< {vocab_size}", found=int(ids[over]))
        if len(x.draft) > block_size:
            raise TraceRangeError(f"{where}: a draft of {len(x.draft)} tokens; the drafter "
                                  f"proposes {block_size} (its block size)", path=str(trace.path),
                                  field=f"line {x.line}.draft", expected=f"<= {block_size}",
                                  found=len(x.draft))
        # The context's cells at 0 .. n-2, the block at n-1 .. n-2+B.
        if x.context_length - 1 + block_size > positions:
            raise TraceRangeError(f"{where}: a context of {x.context_length} tokens and the "
                                  f"block of {block_size} need {x.context_length - 1 + block_size} "
                                  f"positions; {config} allows {positions} "
                                  "(max_position_embeddings)", path=str(trace.path),
                                  field=f"line {x.line}.context",
                                  expected=f"<= {positions - block_size + 1} tokens",
                                  found=x.context_length)


def trace_bytes(lines: Sequence[TraceLine]) -> bytes:
    """The lines as a trace file (what ``read_trace`` reads back): id first when set."""
    out = []
    for x in lines:
        record = {} if x.id is None else {"id": x.id}
        record["context"] = x.context.tolist()
        record["draft"] = list(x.draft)
        out.append(json.dumps(record, separators=(",", ":")))
    return ("\n".join(out) + "\n").encode("ascii") if out else b""
