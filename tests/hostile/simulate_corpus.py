"""Hostile inputs for `dspark simulate`: every named case, deterministically, into a directory.

    python tests/hostile/simulate_corpus.py --out DIR    # build every case under DIR
    python tests/hostile/simulate_corpus.py --readme     # rewrite tests/hostile/simulate.md

Each case starts from a good recording, a dspark run of six steps written by the project's
own writer (tests/support/decisions.py: synthetic confidences, Algorithm 1's lengths on a
staircase cost table, seeded acceptances), its cost table and no option, and breaks one
thing: the decisions file's bytes or a line's value, a smoke/eval trace given instead, the
cost table, or an option. A case is a directory ``DIR/<name>/`` holding ``decisions.jsonl``
(or the broken thing under that name), ``cost.json`` and ``case.json``: the options given
and the error class (so the exit code) `dspark simulate` must refuse it with.
tests/test_simulate_hostile.py runs every case through the real CLI.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))      # tests/, for support/ when run as a script

from hostile.conform_corpus import (  # noqa: E402 (the same edits of JSON-line records)
    build_directory,
    build_fifo,
    build_nothing,
    lines_text,
    raw,
    second,
    text,
    with_,
    without,
)
from support.decisions import COSTS, of_policy, record  # noqa: E402

from dspark_convert import errors  # noqa: E402
from dspark_convert.scheduling.cost_table import write_cost_table  # noqa: E402

DECISIONS = "decisions.jsonl"
COST = "cost.json"
README = HERE / "simulate.md"


def good_lines() -> list[dict]:
    return [json.loads(line) for line in record(of_policy("dspark"), "dspark", steps=6)]


Build = Callable[[Path, list[dict]], None]


@dataclass(frozen=True)
class Case:
    name: str
    error: type[errors.DSparkError]
    about: str
    build: Build                                   # writes DIR/<name>/decisions.jsonl (or not)
    options: tuple[str, ...] = ()                  # after `--cost-table cost.json`
    cost: Callable[[Path], None] | None = None     # writes DIR/<name>/cost.json (else the good one)
    needles: tuple[str, ...] = field(default=())   # what the one line must also say


def request(**fields) -> Callable[[dict], dict]:
    """The line's first request with ``fields`` changed (None: the key removed)."""
    def edit(r: dict) -> dict:
        first = {k: v for k, v in {**r["requests"][0], **fields}.items() if v is not None}
        return {**r, "requests": [first, *r["requests"][1:]]}
    return edit


def build_sparse_over_limit(path: Path, _good: list[dict]) -> None:
    """MAX_DECISIONS_BYTES + 1 bytes, sparse: refused by its size, never read whole."""
    from dspark_convert.scheduling.decisions import MAX_DECISIONS_BYTES

    with open(path, "wb") as fh:
        fh.truncate(MAX_DECISIONS_BYTES + 1)


def long_line(path: Path, good: list[dict]) -> None:
    """A second line of 1 MiB + 1 byte: a request list padded with spaces (valid JSON)."""
    from dspark_convert.scheduling.decisions import MAX_DECISIONS_LINE_BYTES

    body = json.dumps(good[1])
    pad = MAX_DECISIONS_LINE_BYTES + 1 - len(body)
    line = body.replace('"requests": [', '"requests": [' + " " * pad, 1)
    assert len(line) == MAX_DECISIONS_LINE_BYTES + 1
    path.write_text(json.dumps(good[0]) + "\n" + line + "\n", encoding="utf-8")


def trace(edit: Callable[[dict], dict]) -> Build:
    """A smoke/eval trace (reference.json format) instead of decisions: one run of two cycles
    of full-block proposals, edited."""
    run = {"prompt": [1, 2], "output_ids": [1, 2, 9, 9, 9], "acceptance_lengths": [2, 1],
           "cycles": [{"proposed": [9, 9, 4], "accepted": 1, "next_token": 9,
                       "confidence_logits": [2.0, -1.0, 0.5]},
                      {"proposed": [9, 5, 5], "accepted": 0, "next_token": 9,
                       "confidence_logits": [-0.2, 0.1, 3.0]}],
           "temperature": 0.0, "confidence_threshold": 0.0}
    doc = {"case": "hostile", "target": "t", "prompts": [[1, 2]], "runs": [run]}

    def build(path: Path, _good: list[dict]) -> None:
        path.write_text(json.dumps(edit(json.loads(json.dumps(doc)))), encoding="utf-8")
    return build


def first_cycle(**fields) -> Callable[[dict], dict]:
    def edit(doc: dict) -> dict:
        doc["runs"][0]["cycles"][0].update(fields)
        return doc
    return edit


def cost_text(content: str) -> Callable[[Path], None]:
    return lambda path: path.write_text(content, encoding="utf-8")


def cost_missing(path: Path) -> None:
    return None


def cost_small(path: Path) -> None:
    """A table whose largest entry (4 tokens) is below the good file's step 3."""
    from dspark_convert.scheduling.cost_table import CostTable

    write_cost_table(CostTable(tokens=(1, 2, 4), steps_per_second=(3.0, 2.0, 1.0), device="d",
                               dtype="t", threads=1, versions={}), path)


def no_confidences(path: Path, good: list[dict]) -> None:
    first = good[0]["requests"][0]
    line = {"step": 0, "policy": "full", "requests": [{**first, "confidence": [],
                                                        "length": 7}]}
    path.write_text(json.dumps(line) + "\n", encoding="utf-8")


GOOD_COST = json.dumps({"tokens": [1, 2, 4], "steps_per_second": [1.0, 1.0, 1.0],
                        "device": "d", "dtype": "t", "threads": 1, "versions": {}})
D, C, G, P, K, T = (errors.DecisionsError, errors.CostTableError, errors.CostTableRangeError,
                    errors.SchedulingPolicyError, errors.ConcurrencyError,
                    errors.ReferenceTraceError)

CASES: list[Case] = [
    # the file
    Case("file-missing", D, "the decisions file does not exist", build_nothing),
    Case("file-directory", D, "the decisions file is a directory", build_directory),
    Case("file-fifo", D, "a FIFO (named pipe): refused unread, never waited on", build_fifo),
    Case("file-empty", D, "0 bytes: no step", text(lambda good: "")),
    Case("file-one-newline", D, "a single newline: a blank line", text(lambda good: "\n")),
    Case("file-bom", D, "a UTF-8 byte-order mark before the first line",
         raw(lambda data: b"\xef\xbb\xbf" + data)),
    Case("file-not-utf8", D, "a 0xff byte inside the second line's policy",
         raw(lambda data: data.replace(b'"dspark"', b'"dsp\xffark"', 2))),
    Case("file-blank-line", D, "an empty line between the first and second steps",
         raw(lambda data: data.replace(b"\n", b"\n\n", 1))),
    Case("file-crlf-only-line", D, "a line holding only a carriage return",
         raw(lambda data: data.replace(b"\n", b"\n\r\n", 1))),
    Case("file-over-limit", D, "MAX_DECISIONS_BYTES + 1 bytes (sparse)", build_sparse_over_limit),
    Case("line-over-limit", D, "a line of 1 MiB + 1 byte (MAX_DECISIONS_LINE_BYTES)", long_line),
    # JSON
    Case("json-cut", D, "the second line cut in the middle", second(lambda r: json.dumps(r)[:30])),
    Case("json-array", D, "the second line is a JSON array", second(lambda r: json.dumps(r["requests"]))),
    Case("json-string", D, "the second line is a JSON string", second(lambda r: '"step"')),
    Case("json-duplicate-key", D, "the second line names policy twice",
         second(lambda r: json.dumps(r)[:-1] + ', "policy": "full"}')),
    Case("json-nan", D, "NaN as a confidence",
         second(lambda r: json.dumps(r).replace('"confidence": [', '"confidence": [NaN, ', 1))),
    Case("json-infinity", D, "-Infinity as a confidence",
         second(lambda r: json.dumps(r).replace('"confidence": [', '"confidence": [-Infinity, ', 1))),
    Case("json-overflow", D, "1e999 as a confidence (infinite as a double)",
         second(lambda r: json.dumps(r).replace('"confidence": [', '"confidence": [1e999, ', 1))),
    Case("json-deep", D, "requests nested 100,000 arrays deep",
         second(lambda r: '{"step": 1, "policy": "dspark", "requests": ' + "[" * 100_000
                + "]" * 100_000 + "}")),
    Case("json-long-integer", D, "a length of 5,000 digits",
         second(lambda r: json.dumps(r).replace('"length": ', '"length": ' + "9" * 5000, 1))),
    # keys
    Case("key-unknown", D, "an extra key 'budget'", second(with_(budget=3))),
    Case("key-step-missing", D, "no step", second(without("step"))),
    Case("key-requests-missing", D, "no requests", second(without("requests"))),
    Case("key-request-unknown", D, "a request with an extra key 'verify_len'",
         second(request(verify_len=3))),
    Case("key-accepted-missing", D, "a request without accepted", second(request(accepted=None))),
    # values
    Case("step-string", D, "step \"1\"", second(with_(step="1"))),
    Case("step-bool", D, "step true", second(with_(step=True))),
    Case("step-skipped", D, "the second line's step is 2", second(with_(step=2))),
    Case("step-repeated", D, "the second line's step is 0 again", second(with_(step=0))),
    Case("policy-misspelt", D, "policy 'dsprk'", second(with_(policy="dsprk"))),
    Case("policy-not-canonical", D, "policy 'threshold=0.60' (str(Policy) writes threshold=0.6)",
         text(lambda good: lines_text([{**r, "policy": "threshold=0.60"} for r in good]))),
    Case("policy-changes", D, "the second line's policy is full: two policies in one file",
         second(with_(policy="full"))),
    Case("requests-empty", D, "a step with no request", second(with_(requests=[]))),
    Case("requests-not-objects", D, "a request that is a number", second(with_(requests=[3]))),
    Case("id-repeated", D, "the same id twice in a step",
         second(lambda r: {**r, "requests": [r["requests"][0], r["requests"][0]]})),
    Case("id-empty", D, "an empty id", second(request(id=""))),
    Case("id-number", D, "an id that is a number", second(request(id=3))),
    Case("id-lone-surrogate", D, "an id holding the escape \\ud800 (not Unicode text)",
         second(request(id="p\ud800"))),
    Case("confidence-above-1", D, "a confidence of 1.5",
         second(lambda r: request(confidence=[1.5] + r["requests"][0]["confidence"][1:])(r))),
    Case("confidence-negative", D, "a confidence of -0.25",
         second(lambda r: request(confidence=[-0.25] + r["requests"][0]["confidence"][1:])(r))),
    Case("confidence-bool", D, "true as a confidence",
         second(lambda r: request(confidence=[True] + r["requests"][0]["confidence"][1:])(r))),
    Case("confidence-string", D, "\"0.5\" as a confidence",
         second(lambda r: request(confidence=["0.5"] + r["requests"][0]["confidence"][1:])(r))),
    Case("confidence-past-block-bound", D, "129 confidences (the block bound is 128)",
         second(request(confidence=[0.5] * 129, length=0, accepted=0))),
    Case("length-past-block", D, "a length of 8 on a block of 7 confidences",
         second(request(length=8, accepted=0))),
    Case("length-negative", D, "a length of -1", second(request(length=-1, accepted=0))),
    Case("length-float", D, "a length of 2.0", second(request(length=2.0))),
    Case("accepted-past-length", D, "accepted 3 of a length 2", second(request(length=2, accepted=3))),
    # a smoke/eval trace given instead
    Case("trace-runs-not-list", T, "a trace whose runs is an object",
         trace(lambda doc: {**doc, "runs": {"0": doc["runs"][0]}})),
    Case("trace-accepted-past-proposed", D, "a trace cycle that accepted 4 of 3 proposed",
         trace(first_cycle(accepted=4))),
    Case("trace-only-threshold-runs", D, "a trace whose only run was cut by a threshold",
         trace(lambda doc: {**doc, "runs": [{**doc["runs"][0], "confidence_threshold": 0.5}]})),
    # the cost table
    Case("cost-missing", C, "the cost table does not exist", raw(lambda d: d), cost=cost_missing),
    Case("cost-not-json", C, "the cost table is not JSON", raw(lambda d: d), cost=cost_text("{tokens")),
    Case("cost-decreasing", C, "the cost table's tokens decrease", raw(lambda d: d),
         cost=cost_text(GOOD_COST.replace("[1, 2, 4]", "[1, 4, 2]"))),
    Case("cost-too-small", G, "the table's largest entry (4 tokens) is below a step's B",
         raw(lambda d: d), cost=cost_small, needles=("step 3: cost table",)),
    # options
    Case("option-policy-misspelt", P, "--policy dsprk", raw(lambda d: d), options=("--policy", "dsprk")),
    Case("option-threshold-out-of-range", P, "--policy threshold=1.5", raw(lambda d: d),
         options=("--policy", "threshold=1.5")),
    Case("option-check-and-policy", P, "--check with --policy", raw(lambda d: d),
         options=("--check", "dspark", "--policy", "full")),
    Case("option-needs-confidences", P, "--policy dspark on a request recorded without "
         "confidences", no_confidences, options=("--policy", "dspark"), needles=("step 0",)),
    Case("option-concurrency-zero", K, "--concurrency 0", raw(lambda d: d), options=("--concurrency", "0")),
    Case("option-concurrency-decreasing", K, "--concurrency 4,2", raw(lambda d: d),
         options=("--concurrency", "4,2")),
    Case("option-concurrency-not-a-list", K, "--concurrency 1;4", raw(lambda d: d),
         options=("--concurrency", "1;4")),
    Case("option-concurrency-empty", K, "--concurrency ''", raw(lambda d: d), options=("--concurrency", "")),
    Case("option-concurrency-with-check", K, "--concurrency with --check", raw(lambda d: d),
         options=("--concurrency", "1", "--check", "dspark")),
]


def build_corpus(out: Path) -> list[Path]:
    good = good_lines()
    dirs = []
    for case in CASES:
        d = out / case.name
        d.mkdir(parents=True)
        case.build(d / DECISIONS, good)
        if case.cost is None:
            write_cost_table(COSTS, d / COST)
        else:
            case.cost(d / COST)
        (d / "case.json").write_text(json.dumps({
            "name": case.name, "error": case.error.__name__, "exit_code": case.error.exit_code,
            "options": list(case.options)}) + "\n")
        dirs.append(d)
    return dirs


def readme() -> str:
    def shown(case: Case) -> str:
        return " ".join(f"`{o}`" for o in case.options) or "-"

    rows = [f"| `{c.name}` | {shown(c)} | `{c.error.__name__}` | {c.error.exit_code} | {c.about} |"
            for c in CASES]
    return "\n".join([
        "# Hostile inputs for `dspark simulate`", "",
        "Generated by `simulate_corpus.py` (`--readme` rewrites this file; a test fails when it "
        "is stale). Each case starts from a good recording (a six-step dspark run written by "
        "`tests/support/decisions.py`), its cost table and no option, and breaks one thing; "
        "`tests/test_simulate_hostile.py` runs every case through the real CLI (`dspark "
        "simulate CASE/decisions.jsonl --cost-table CASE/cost.json OPTIONS -o OUT --json`): the "
        "intended error class and its exit code, one `error:` line, no traceback, nothing "
        "written, the case's files unchanged.", "",
        f"{len(CASES)} cases.", "",
        "| case | options | refused with | exit | what is broken |", "|---|---|---|---|---|",
        *rows, ""])


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
