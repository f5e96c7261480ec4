"""Hostile traces for `dspark conform`: every named case, deterministically, into a directory.

    python tests/hostile/conform_corpus.py --out DIR    # build every case under DIR
    python tests/hostile/conform_corpus.py --readme     # rewrite tests/hostile/conform.md

Each case starts from a good trace, DeepSeek's own drafts (``deepseek_trace``: the
temperature-0 cycles of golden/reference/vanilla_conf_markov/reference.json, each cycle's
context the prompt and every token committed before it, up to and including the anchor),
and breaks one thing, by editing its text or bytes. A case is a directory ``DIR/<name>/``
holding ``trace.jsonl`` (or the broken thing under that name: a FIFO, a directory, nothing)
and ``case.json``: the error class (and so the exit code) `dspark conform` must refuse it
with. tests/test_conform_hostile.py runs every case through the real CLI against the
golden DSpark drafter and its target.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

from dspark_convert import errors  # noqa: E402

REFERENCE = ROOT / "golden" / "reference" / "vanilla_conf_markov" / "reference.json"
TRACE = "trace.jsonl"
README = HERE / "conform.md"


def deepseek_trace(reference: Path = REFERENCE, *, shift: int = 0) -> list[dict]:
    """DeepSeek's own drafts of a reference.json as trace records: every temperature-0 run's
    cycles that proposed something, each with its context (the prompt, the first token
    the target gave, and what each earlier cycle committed: accepted + 1, up to and
    including this cycle's anchor) and id ``run<i>/cycle<c>``. ``shift`` s > 0: each draft
    read s rows late (the reference's draft from position s on, padded with its last
    token), as an engine that misplaces the anchor would draft."""
    doc = json.loads(reference.read_text())
    out = []
    for i, run in enumerate(doc["runs"]):
        if run["temperature"] != 0:
            continue
        n = len(run["prompt"]) + 1           # the prompt and the target's first token
        for c, cycle in enumerate(run["cycles"]):
            draft = list(cycle["proposed"])
            if draft:
                if shift:
                    draft = draft[shift:] + [draft[-1]] * shift
                out.append({"id": f"run{i}/cycle{c}", "context": run["output_ids"][:n],
                            "draft": draft})
            n += run["acceptance_lengths"][c]
    return out


def lines_text(records: list) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


@dataclass(frozen=True)
class Case:
    name: str
    error: type[errors.DSparkError]
    about: str
    build: Callable[[Path, list[dict]], None]   # writes DIR/<name>/trace.jsonl (or not)


def text(edit: Callable[[list[dict]], str]) -> Callable[[Path, list[dict]], None]:
    def build(path: Path, good: list[dict]) -> None:
        path.write_text(edit([dict(r) for r in good]), encoding="utf-8")
    return build


def raw(edit: Callable[[bytes], bytes]) -> Callable[[Path, list[dict]], None]:
    def build(path: Path, good: list[dict]) -> None:
        path.write_bytes(edit(lines_text(good).encode()))
    return build


def second(edit: Callable[[dict], object]) -> Callable[[Path, list[dict]], None]:
    """The good trace with its second line replaced by ``edit(line)`` (a dict, or text)."""
    def make(records: list[dict]) -> str:
        new = edit(records[1])
        lines = [json.dumps(r) for r in records]
        lines[1] = new if isinstance(new, str) else json.dumps(new)
        return "\n".join(lines) + "\n"
    return text(make)


def with_(**fields) -> Callable[[dict], dict]:
    return lambda r: {**r, **fields}


def without(key: str) -> Callable[[dict], dict]:
    return lambda r: {k: v for k, v in r.items() if k != key}


def at(key: str, index: int, value: object) -> Callable[[dict], dict]:
    def edit(r: dict) -> dict:
        ids = list(r[key])
        ids[index] = value
        return {**r, key: ids}
    return edit


def build_fifo(path: Path, _good: list[dict]) -> None:
    os.mkfifo(path)


def build_directory(path: Path, _good: list[dict]) -> None:
    path.mkdir()


def build_nothing(path: Path, _good: list[dict]) -> None:
    return None


def long_line(path: Path, good: list[dict]) -> None:
    """A second line of 4 MiB + 1 byte: a context padded with spaces (valid JSON)."""
    from dspark_convert.evaluation.conform import MAX_TRACE_LINE_BYTES

    body = json.dumps(good[1])
    pad = MAX_TRACE_LINE_BYTES + 1 - len(body)
    line = body.replace('"context": [', '"context": [' + " " * pad, 1)
    assert len(line) == MAX_TRACE_LINE_BYTES + 1
    path.write_text(json.dumps(good[0]) + "\n" + line + "\n", encoding="utf-8")


F, R = errors.TraceFormatError, errors.TraceRangeError

CASES: list[Case] = [
    # the file
    Case("file-missing", F, "the trace does not exist", build_nothing),
    Case("file-directory", F, "the trace is a directory", build_directory),
    Case("file-fifo", F, "the trace is a FIFO (named pipe): refused unread, never waited on", build_fifo),
    Case("file-empty", F, "0 bytes: no draft", text(lambda good: "")),
    Case("file-one-newline", F, "a single newline: a blank line", text(lambda good: "\n")),
    Case("file-bom", F, "a UTF-8 byte-order mark before the first line",
         raw(lambda data: b"\xef\xbb\xbf" + data)),
    Case("file-not-utf8", F, "a 0xff byte inside the second line's id",
         raw(lambda data: data.replace(b'"run0/cycle1"', b'"run0/\xffcycle1"', 1))),
    Case("file-blank-line", F, "an empty line between the first and second drafts",
         raw(lambda data: data.replace(b"\n", b"\n\n", 1))),
    Case("file-crlf-only-line", F, "a line holding only a carriage return",
         raw(lambda data: data.replace(b"\n", b"\n\r\n", 1))),
    Case("line-over-limit", F, "a line of 4 MiB + 1 byte (MAX_TRACE_LINE_BYTES is 4 MiB)", long_line),
    # JSON
    Case("json-cut", F, "the second line cut in the middle", second(lambda r: json.dumps(r)[:30])),
    Case("json-array", F, "the second line is a JSON array", second(lambda r: json.dumps(r["context"]))),
    Case("json-string", F, "the second line is a JSON string", second(lambda r: '"context"')),
    Case("json-duplicate-key", F, "the second line names draft twice",
         second(lambda r: json.dumps(r)[:-1] + ', "draft": [1]}')),
    Case("json-nan", F, "the non-standard literal NaN as a token id",
         second(lambda r: json.dumps(r).replace('"draft": [', '"draft": [NaN, ', 1))),
    Case("json-deep", F, "a context nested 100,000 arrays deep",
         second(lambda r: '{"context": ' + "[" * 100_000 + "]" * 100_000 + ', "draft": [1]}')),
    Case("json-long-integer", F, "a token id of 5,000 digits",
         second(lambda r: json.dumps(r).replace('"draft": [', '"draft": [' + "9" * 5000 + ", ", 1))),
    # keys
    Case("key-unknown", F, "an extra key 'tokens'", second(with_(tokens=[1]))),
    Case("key-context-missing", F, "no context", second(without("context"))),
    Case("key-draft-missing", F, "no draft", second(without("draft"))),
    Case("key-anchor-apart", F, "the anchor given apart ('anchor') instead of as the context's last id",
         second(lambda r: {"context": r["context"][:-1], "anchor": r["context"][-1], "draft": r["draft"]})),
    # values
    Case("context-empty", F, "an empty context", second(with_(context=[]))),
    Case("draft-empty", F, "an empty draft (a call that proposed nothing: leave it out)", second(with_(draft=[]))),
    Case("context-object", F, "a context that is an object", second(with_(context={"0": 1}))),
    Case("context-bool", F, "true among the context's ids", second(at("context", 3, True))),
    Case("context-string", F, "\"17\" among the context's ids", second(at("context", 1, "17"))),
    Case("draft-float", F, "7.0 among the draft's ids", second(at("draft", 2, 7.0))),
    Case("draft-negative", F, "-1 among the draft's ids", second(at("draft", 0, -1))),
    Case("draft-beyond-int32", F, "2^31 among the draft's ids", second(at("draft", 4, 2**31))),
    Case("draft-null", F, "null among the draft's ids", second(at("draft", 1, None))),
    Case("id-null", F, "an explicit null id (leave the key out)", second(with_(id=None))),
    Case("id-empty", F, "an empty string id", second(with_(id=""))),
    Case("id-bool", F, "true as the id", second(with_(id=True))),
    Case("id-list", F, "a list as the id", second(with_(id=["run0"]))),
    Case("id-lone-surrogate", F, "an id holding the escape \\ud800 (not Unicode text)",
         second(with_(id="run\ud800"))),
    # against the artifact and its target (95)
    Case("range-vocabulary", R, "token 512 in a context, the target's vocabulary is 512",
         second(at("context", 2, 512))),
    Case("range-draft-past-block", R, "a draft of 8 tokens; the drafter's block is 7",
         second(lambda r: {**r, "draft": r["draft"] + [5]})),
    Case("range-context-past-positions", R, "a context of 507 tokens: with the block of 7, "
         "513 positions of the target's 512", second(with_(context=[7] * 507))),
]


def build_corpus(out: Path) -> list[Path]:
    good = deepseek_trace()
    dirs = []
    for case in CASES:
        d = out / case.name
        d.mkdir(parents=True)
        case.build(d / TRACE, good)
        (d / "case.json").write_text(json.dumps({"name": case.name, "error": case.error.__name__,
                                                 "exit_code": case.error.exit_code}) + "\n")
        dirs.append(d)
    return dirs


def readme() -> str:
    rows = [f"| `{c.name}` | `{c.error.__name__}` | {c.error.exit_code} | {c.about} |" for c in CASES]
    return "\n".join([
        "# Hostile traces for `dspark conform`", "",
        "Generated by `conform_corpus.py` (`--readme` rewrites this file; a test fails when it is "
        "stale). Each case starts from DeepSeek's own drafts (the temperature-0 cycles of "
        "`golden/reference/vanilla_conf_markov/reference.json` as a trace) and breaks one thing; "
        "`tests/test_conform_hostile.py` runs every case through the real CLI "
        "(`dspark conform ARTIFACT --target T --trace CASE -o OUT --json`): the intended error "
        "class and its exit code, one `error:` line naming the file (and the line), no "
        "traceback, nothing written.", "",
        f"{len(CASES)} cases.", "",
        "| case | refused with | exit | what is broken |", "|---|---|---|---|", *rows, ""])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--readme", action="store_true")
    args = parser.parse_args()
    if args.readme:
        README.write_text(readme())
    if args.out:
        build_corpus(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
