"""The prompt set of `dspark eval`: JSONL, one object a line, strict schema.

A line is ``{"id": ..., "prompt": "text"}`` or ``{"id": ..., "prompt_ids": [...]}``, with an
optional ``"category"``. ``id`` is a non-empty string or an integer, unique in the file;
exactly one of ``prompt`` (encoded with the target's tokenizer as it is: no chat template,
the tokenizer's own special-token rules, as ``dspark smoke --prompt`` does) and
``prompt_ids`` (token ids, non-empty). Unknown keys, ``"7"`` for an integer, ``true`` for
an id, duplicate keys, NaN and a blank line between records are refused; every refusal is
one ``PromptSetError`` naming the file and the line. A last newline is optional.

The prompt set's identity in a report and in a calibration is the SHA-256 of the file's
bytes. ``DEFAULT_PROMPTS`` (package data, ``data/golden_prompts.jsonl``) is made for the
golden target (``golden/reference/target``: vocabulary 512, no chat template): the two
token-id prompts of DeepSpec's reference traces, three arithmetic progressions, three
repetitions, six random id sequences (numpy PCG64, seed 14, ids 3..399, after id 1 as the
traces begin) and two English sentences for the tokenizer path. Its token ids mean
nothing to another target.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError, model_validator

from dspark_convert.errors import PromptSetError
from dspark_convert.target.prompt import check_context as check_prompt_context, check_ids, encode_text
from dspark_convert.util.paths import check_input_file, open_regular
from dspark_convert.util.strict_json import json_error_text, loads_strict
from dspark_convert.util.text import shown

DEFAULT_PROMPTS = Path(__file__).resolve().parent / "data" / "golden_prompts.jsonl"
# Bounds, not targets: the file is read whole and every line kept as a record, so its size,
# a line's and the count bound the memory a prompt set takes (a 256 MiB file of one-token
# lines would have been millions of records, several GB). A 40,960-token prompt of Qwen3
# ids is ~300 KB as JSON, and as text well under 1 MiB even written as \u escapes; an eval
# runs every prompt through the target and each drafter, so 10,000 is hours of work.
MAX_PROMPT_FILE_BYTES = 16 * 1024 * 1024
MAX_PROMPT_LINE_BYTES = 1024 * 1024
MAX_PROMPTS = 10_000


class PromptRecord(BaseModel):
    """One line of the prompt set."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    id: StrictStr | StrictInt
    prompt: StrictStr | None = Field(default=None, min_length=1)
    prompt_ids: list[StrictInt] | None = Field(default=None, min_length=1)
    category: StrictStr | None = None

    @model_validator(mode="after")
    def _one_prompt(self) -> "PromptRecord":
        if (self.prompt is None) == (self.prompt_ids is None):
            raise ValueError("expected exactly one of 'prompt' (text) and 'prompt_ids' (token ids)")
        if isinstance(self.id, str) and not self.id:
            raise ValueError("'id' is empty")
        if self.prompt_ids is not None and any(t < 0 for t in self.prompt_ids):
            raise ValueError("'prompt_ids' holds a negative token id")
        return self

    @property
    def key(self) -> str:
        """The id as reports print it (integers as their decimal text)."""
        return str(self.id)


class PromptSetInfo(BaseModel):
    """What a report records about the prompt set."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    sha256: str
    count: int
    default: bool                  # the package's golden prompt set
    categories: dict[str, int]     # category -> prompts ("" for none)


@dataclass(frozen=True)
class PromptSet:
    path: Path
    sha256: str
    records: tuple[PromptRecord, ...]
    lines: tuple[int, ...]         # the line number of each record, for later refusals

    def info(self) -> PromptSetInfo:
        categories: dict[str, int] = {}
        for r in self.records:
            categories[r.category or ""] = categories.get(r.category or "", 0) + 1
        return PromptSetInfo(path=shown(self.path), sha256=self.sha256, count=len(self.records),
                             default=self.path == DEFAULT_PROMPTS, categories=categories)


@dataclass(frozen=True)
class Prompt:
    """A prompt ready to run: its token ids on the target's vocabulary."""

    key: str
    category: str | None
    ids: tuple[int, ...]
    line: int


_EXPECTED = {"id": "a non-empty string or an integer", "prompt": "a non-empty string",
             "prompt_ids": "a non-empty list of integer token ids",
             "category": "a string"}


def _first_error(exc: ValidationError, obj: dict) -> str:
    err = exc.errors()[0]
    loc = err.get("loc", ())
    if err.get("type") == "extra_forbidden":
        return f"unknown key {str(loc[0])!r}; expected id, prompt or prompt_ids, category"
    if err.get("type") == "missing":
        return f"{loc[0]}: missing; expected {_EXPECTED.get(str(loc[0]), 'a value')}"
    if loc and loc[0] in _EXPECTED:
        key = str(loc[0])
        found = obj.get(key)
        if key == "prompt_ids" and isinstance(found, list) and len(loc) > 1 and isinstance(loc[1], int):
            bad = found[loc[1]]
            return (f"prompt_ids[{loc[1]}]: expected an integer token id, found "
                    f"{json.dumps(bad)[:40]}")
        value = json.dumps(found)[:40] if not isinstance(found, (list, dict)) else type(found).__name__
        return f"{key}: expected {_EXPECTED[key]}, found {value}"
    return str(err.get("msg", "invalid")).removeprefix("Value error, ")


def load_prompt_set(path: str | os.PathLike | None = None) -> PromptSet:
    """Read and check a JSONL prompt set (``None``: the package's golden prompt set)."""
    path = DEFAULT_PROMPTS if path is None else Path(path)
    label = f"prompts {path}"
    path = check_input_file(path, label=label, error=PromptSetError, expected="a JSONL file")
    try:
        size = path.stat().st_size
        if size > MAX_PROMPT_FILE_BYTES:
            raise PromptSetError(f"{label}: {size} bytes; expected at most {MAX_PROMPT_FILE_BYTES}",
                                 path=str(path), expected=MAX_PROMPT_FILE_BYTES, found=size)
        with open_regular(path, label=label, error=PromptSetError) as fh:
            raw = fh.read(MAX_PROMPT_FILE_BYTES + 1)   # a file that grew since stat: still bounded
    except FileNotFoundError:
        raise PromptSetError(f"{label}: not found", path=str(path), expected="a JSONL file",
                             found="nothing") from None
    except OSError as exc:
        raise PromptSetError(f"{label}: cannot read: {os.strerror(exc.errno or 0) or exc}",
                             path=str(path)) from None

    if len(raw) > MAX_PROMPT_FILE_BYTES:
        raise PromptSetError(f"{label}: over {MAX_PROMPT_FILE_BYTES} bytes; expected at most "
                             f"{MAX_PROMPT_FILE_BYTES}", path=str(path),
                             expected=MAX_PROMPT_FILE_BYTES, found=f"> {MAX_PROMPT_FILE_BYTES}")
    text_lines = raw.split(b"\n")
    if text_lines and text_lines[-1] == b"":
        text_lines.pop()                      # the final newline
    if len(text_lines) > MAX_PROMPTS:      # a blank line is refused below: one prompt a line
        raise PromptSetError(f"{label}: {len(text_lines)} lines; expected at most {MAX_PROMPTS} "
                             "prompts", path=str(path), expected=MAX_PROMPTS, found=len(text_lines))
    records: list[PromptRecord] = []
    numbers: list[int] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(text_lines, start=1):
        where = f"{label}: line {number}"
        if len(line) > MAX_PROMPT_LINE_BYTES:
            raise PromptSetError(f"{where}: {len(line)} bytes; expected at most "
                                 f"{MAX_PROMPT_LINE_BYTES} bytes a line", path=str(path),
                                 field=f"line {number}", expected=MAX_PROMPT_LINE_BYTES,
                                 found=len(line))
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PromptSetError(f"{where}: not UTF-8 text (byte {exc.start})", path=str(path),
                                 field=f"line {number}") from None
        if number == 1 and text.startswith("\ufeff"):
            raise PromptSetError(f"{where}: starts with a byte-order mark; expected plain UTF-8",
                                 path=str(path), field="line 1")
        if not text.strip():
            raise PromptSetError(f"{where}: blank line; expected one JSON object a line",
                                 path=str(path), field=f"line {number}")
        try:
            obj = loads_strict(text)
        except (ValueError, RecursionError) as exc:
            multiline = ("; expected JSONL, one JSON object a line, not a JSON document over "
                         "several lines" if text.strip() in ("{", "[") else "")
            raise PromptSetError(f"{where}: not valid JSON: {json_error_text(exc)}{multiline}",
                                 path=str(path), field=f"line {number}") from None
        if not isinstance(obj, dict):
            raise PromptSetError(f"{where}: expected a JSON object, found {type(obj).__name__}",
                                 path=str(path), field=f"line {number}")
        try:
            record = PromptRecord.model_validate(obj)
        except ValidationError as exc:
            raise PromptSetError(f"{where}: {_first_error(exc, obj)}", path=str(path),
                                 field=f"line {number}") from None
        if record.key in seen:
            raise PromptSetError(f"{where}: id {record.key!r} repeats line {seen[record.key]}",
                                 path=str(path), field=f"line {number}.id",
                                 expected="a unique id", found=record.key)
        seen[record.key] = number
        records.append(record)
        numbers.append(number)
    if not records:
        raise PromptSetError(f"{label}: no prompt; expected one JSON object a line", path=str(path),
                             expected="at least one prompt", found=0)
    return PromptSet(path=path, sha256=hashlib.sha256(raw).hexdigest(), records=tuple(records),
                     lines=tuple(numbers))


def resolve_prompts(prompt_set: PromptSet, *, tokenizer, vocab_size: int,
                    context: int) -> list[Prompt]:
    """Token ids for every record: text through ``tokenizer`` (the opened target's,
    target/tokenizer.py ``TokenizerFingerprint``: the one reader of tokenizer.json), ids
    checked against the vocabulary, by the rules smoke applies (target/prompt.py); text
    that cannot fit ``context`` tokens is refused before it is encoded."""
    out = []
    for record, number in zip(prompt_set.records, prompt_set.lines):
        where, path = f"prompts {prompt_set.path}: line {number}", str(prompt_set.path)
        if record.prompt is not None:
            ids = encode_text(tokenizer, record.prompt, context=context, where=where,
                              error=PromptSetError, path=path, field=f"line {number}.prompt")
        else:
            ids = list(record.prompt_ids)
        check_ids(ids, vocab_size, where=where, error=PromptSetError, path=path,
                  field=f"line {number}.prompt_ids")
        out.append(Prompt(key=record.key, category=record.category, ids=tuple(ids), line=number))
    return out


def check_context(prompts: list[Prompt], prompt_set: PromptSet, *, max_new_tokens: int,
                  context: int, config: str) -> None:
    """Each prompt plus ``max_new_tokens`` within the target's context (target/prompt.py)."""
    for p in prompts:
        check_prompt_context(len(p.ids), max_new_tokens, context=context, config=config,
                             where=f"prompts {prompt_set.path}: line {p.line}",
                             error=PromptSetError, path=str(prompt_set.path),
                             field=f"line {p.line}")
