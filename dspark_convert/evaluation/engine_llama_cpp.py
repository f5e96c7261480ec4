"""llama.cpp's own runs, read back as data: the engine `dspark eval --engine llama.cpp=BIN_DIR`
puts beside the reference runtime (docs/ENGINES.md "llama.cpp's runs beside ours").

Two binaries of llama.cpp 0c1e570 (docs/REFERENCE.md §6, "As a runtime"), run as a user runs them:

- ``llama-completion -m TARGET.gguf -f PROMPT -n N --temp 0 -no-cnv --no-display-prompt
  --verbose-prompt``: the target alone. Its log echoes the prompt (``prompt: '%s'``) and
  lists its token ids as llama.cpp tokenized the text (``%6d -> '%s'``), the only way to
  learn them: both programs take a prompt as text only. It prints its ``system_info`` line
  (backends, CPU features). Its stdout is the generated text.
- ``llama-speculative-simple -m TARGET.gguf -md DRAFT.gguf --spec-type T --spec-draft-n-max B
  --spec-draft-p-min 0 --temp 0 -f PROMPT -n N -v``: speculative decoding. Its debug log
  names, for every draft call, each drafted token (``draft candidate 0, pos k: ID (P)
  'PIECE'``), the draft's length and the length of the committed context it was drafted
  from (``called impl T, hist size = H, ..., gen = G``), then the verification (``accepted
  A/G draft tokens, the last target token is: (ID)``). From these the committed tokens, the
  anchor and the proposal of every draft are rebuilt exactly: llama.cpp's first anchor is
  the last prompt token (its context the prompt before it), and each cycle commits the
  anchor, the A accepted drafts and makes the target's token the next anchor.

An engine's output is read as strictly as a user's file: it is hostile input.

- It is read as it comes, from the process's pipes, in bounded memory: one line of
  llama.cpp's own at most LINE_LIMIT bytes, the whole log at most ``log_limit`` (set by the
  prompt and max_new_tokens), the last TAIL lines kept for messages; never the whole log.
- Only llama.cpp's own lines are parsed. A log entry starts with the prefix forced on
  (``--log-prefix --log-timestamps``: ``0.00.211.417 I ``); an entry that embeds free text
  the eval knows (the prompt it passed, a token's piece in the vocabulary) is consumed by
  length, byte for byte, never by searching for the next prefix: a prompt that quotes a
  log line is the prompt. Free text the eval does not know (a GGUF's name, printed while
  the models load) can only add lines; every line the parser reads has its place in the
  log (its phase) and the singular ones come once, so an added line that looks like one is
  refused (a second ``decoded`` line, a verification before the speculative loop began),
  never read.
- Every field is range-checked: token ids inside the vocabulary, counts with a bounded
  number of digits and within what the run allows (-n, the prompt, the context), timings
  and rates in printf's exact form and finite, the statistics line's numbers in range and
  equal to what the cycles read say.

Whatever the parser needs and does not find, finds malformed or finds contradicting itself
is refused with ``EngineOutputError`` (113) naming the binary, the line and what was
expected: a wrong reading would make every later comparison wrong. A run that dies is an
``EngineRunError`` (112) naming the signal, the run, the command line and the last lines of
its log.

The generated text is compared as bytes, each token's piece taken from the target GGUF's
own vocabulary (``tokenizer.ggml.tokens``, a byte-level BPE vocabulary: GPT-2's byte
alphabet), as llama.cpp's ``common_token_to_piece`` renders it.
"""

from __future__ import annotations

import io
import os
import re
import shlex
import subprocess
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from dspark_convert.errors import (
    EngineBinaryError,
    EngineOutputError,
    EngineRunError,
    TargetGGUFError,
)
from dspark_convert.evaluation import log_drain
from dspark_convert.evaluation.engine_log import (
    CHUNK,
    F2,
    F3,
    ID,
    PREFIX,
    RATE,
    RATE2,
    Cut,
    Kind,
    Log,
    N,
    P,
    Reader,
    count,
    line_kind,
)
from dspark_convert.evaluation.engine_process import Abandoned, Watched, signal_name
from dspark_convert.util.text import shown

ENGINE = "llama.cpp"
SPECULATIVE = "llama-speculative-simple"
COMPLETION = "llama-completion"
BINARIES = (SPECULATIVE, COMPLETION)
SPEC_TYPES = {"dspark": "draft-dspark", "dflash": "draft-dflash",
              # the DFlash2 drafter (a dflash file with the selector) and the Gemma 4
              # assistant (common/speculative.cpp's MTP path)
              "dflash2": "draft-dflash", "mtp": "draft-mtp"}
# The kinds whose drafted tokens llama.cpp 0c1e570 does not log: the DFlash2 selector's
# walk (common/speculative.cpp:1237-1262) prints no candidate line, and the verification
# line gives the accepted count and the target's token only. Their drafts are read with
# UNLOGGED in place of each token (the count is known), resolved by the caller from the
# committed sequence (``resolve_unlogged``).
UNLOGGED_KINDS = ("dflash2",)
UNLOGGED = -1
TIMEOUT_SECONDS = 600
# Forced on every run: the parser depends on the prefix (level letter) and the timestamp,
# and on no colour codes around them.
LOG_ARGS = ("--log-prefix", "--log-timestamps", "--log-colors", "off")
# llama.cpp processes backslash escapes in a prompt by default (common/arg.cpp,
# string_process_escapes): the text passed must be the text run.
PROMPT_ARGS = ("--no-escape",)


@dataclass(frozen=True)
class Binaries:
    directory: Path
    speculative: Path
    completion: Path


def find_binaries(directory: str | os.PathLike) -> Binaries:
    """The two binaries in ``directory``, each an executable file, or EngineBinaryError."""
    d = Path(directory)
    if not d.is_dir():
        raise EngineBinaryError(f"--engine {ENGINE}={shown(d)}: not a directory; expected the "
                                f"directory of llama.cpp's binaries ({', '.join(BINARIES)})",
                                path=str(d), expected="a directory", found="not a directory")
    found = {}
    for name in BINARIES:
        p = d / name
        if not p.is_file() or not os.access(p, os.X_OK):
            raise EngineBinaryError(f"--engine {ENGINE}={shown(d)}: no executable {name} there; "
                                    f"expected llama.cpp's binaries {', '.join(BINARIES)} "
                                    "(`make llama-cpp` builds them)", path=str(p),
                                    expected="an executable file", found="missing")
        found[name] = p.absolute()
    return Binaries(d.absolute(), found[SPECULATIVE], found[COMPLETION])


# --- the vocabulary: token id -> the bytes llama.cpp prints --------------------------------

def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte alphabet, inverted: the character a byte-level BPE token spells for
    each byte (printable bytes are themselves, the others shifted past 255)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + n)] = b
            n += 1
    return chars


@dataclass(frozen=True)
class Vocabulary:
    """The target GGUF's token pieces as llama.cpp renders them (``common_token_to_piece``):
    ``pieces`` with ``special=false`` (control tokens as nothing: what llama-completion
    prints), ``special`` with ``special=true`` (control tokens as their text: what a prompt
    must spell for llama.cpp's tokenizer, which parses special tokens, to read them, and
    what its log prints beside a token id)."""

    pieces: tuple[bytes, ...]
    special: tuple[bytes, ...]

    def __len__(self) -> int:
        return len(self.pieces)

    @property
    def longest(self) -> int:
        return max(map(len, self.special), default=0)

    def text(self, ids, *, special: bool = False) -> bytes:
        table = self.special if special else self.pieces
        return b"".join(table[i] if 0 <= i < len(table) else b"" for i in ids)


def _decoded(text: str, decoder: dict[str, int]) -> bytes:
    """A NORMAL token's text through GPT-2's byte alphabet, as llama_decode_text renders it:
    a character outside the alphabet as ``[UNK_BYTE_0x..<text>]`` (src/llama-vocab.cpp)."""
    out = bytearray()
    for c in text:
        if c in decoder:
            out.append(decoder[c])
        else:
            out += b"[UNK_BYTE_0x" + c.encode("utf-8").hex().encode() + text.encode("utf-8") + b"]"
    return bytes(out)


def read_vocabulary(target_gguf: str | os.PathLike) -> Vocabulary:
    from dspark_convert.formats.gguf_reader import read_gguf

    path = Path(target_gguf)
    try:
        gguf = read_gguf(path)
    except Exception as exc:  # a DSparkError, or OSError for an unreadable file
        raise TargetGGUFError(f"{shown(path)}: not a readable GGUF file: {exc}", path=str(path),
                              expected="the target model's GGUF file") from None
    kv = gguf.kv
    model = kv.get("tokenizer.ggml.model")
    tokens = kv.get("tokenizer.ggml.tokens")
    if model is None or tokens is None or model.value != "gpt2":
        raise TargetGGUFError(f"{shown(path)}: tokenizer.ggml.model is "
                              f"{model.value if model else 'missing'!r}; the eval reads llama.cpp's "
                              "text back through a byte-level BPE vocabulary ('gpt2', as Qwen3's)",
                              path=str(path), field="tokenizer.ggml.model", expected="gpt2",
                              found=model.value if model else None)
    types = kv.get("tokenizer.ggml.token_type")
    type_of = list(types.value) if types is not None else [1] * len(tokens.value)
    decoder = _byte_decoder()
    pieces, special = [], []
    for text, kind in zip(tokens.value, type_of):
        if kind == 1:                        # NORMAL: GPT-2 byte alphabet
            piece = _decoded(text, decoder)
            pieces.append(piece)
            special.append(piece)
        elif kind == 4:                      # USER_DEFINED: the text itself
            pieces.append(text.encode("utf-8"))
            special.append(text.encode("utf-8"))
        elif kind in (2, 3):                 # UNKNOWN, CONTROL: their text only with special
            pieces.append(b"")
            special.append(text.encode("utf-8"))
        else:                                # UNUSED, BYTE, undefined: nothing
            pieces.append(b"")
            special.append(b"")
    return Vocabulary(tuple(pieces), tuple(special))


# --- the bounds of a run's output (evaluation/engine_log.py reads it) ----------------------

# What llama.cpp writes before and around the run at -v: 213 KB for the golden target and
# drafter (6 and 1 layers), mostly tensor and graph lines, about linear in the layers;
# 64 MiB covers a target of a few hundred layers.
LOG_BASE = 64 << 20
# A cycle of llama-speculative-simple at -v: three candidate lines a drafted position, the
# draft and verify lines and the graph lines of the steps it ran (4 KiB a cycle measured on
# the golden models); 64 KiB plus the candidate lines a cycle, and a cycle commits at least
# one token: a run of N tokens makes at most N + slack cycles.
CYCLE_BYTES = 64 << 10
LINE_BYTES = 128                         # one line of llama.cpp's, its piece aside
TOKEN_SLACK = 8                          # tokens a run may print past -n, besides a draft


def log_limit(*, prompt_bytes: int, max_new_tokens: int, n_max: int, longest_piece: int) -> int:
    """The most bytes of log a run of this prompt and -n may write (see the constants):
    over it, the run is refused (113) instead of read on."""
    line = LINE_BYTES + longest_piece
    cycles = max_new_tokens + n_max + TOKEN_SLACK
    return (LOG_BASE + 2 * (prompt_bytes + 1) * line
            + cycles * (CYCLE_BYTES + (3 * max(n_max, 1) + 4) * line))


def stdout_limit(*, prompt_bytes: int, max_new_tokens: int, n_max: int, longest_piece: int) -> int:
    """The most bytes a run may print on stdout: the prompt (llama-speculative-simple
    echoes it) and every token it may make, each at most the longest piece, with its blank
    lines and end-of-text marker."""
    return 4096 + prompt_bytes + (max_new_tokens + n_max + TOKEN_SLACK) * max(longest_piece, 1)


# load_tensors' line for weights ggml repacked into AMX tiles (ggml-cpu/amx: buffer "AMX").
_AMX_BUFFER = re.compile(rb"^\d{1,7}\.\d\d\.\d{3}\.\d{3} [IWED] \w+: +AMX model buffer size")

_SYSTEM_INFO = line_kind("system_info", rb"system_info:",
                     rb"system_info: n_threads = " + N + rb" \(n_threads_batch = " + N
                     + rb"\) / " + N + rb" \| ([ -~]{1,4000})")
_PROMPT_ECHO = line_kind("prompt", rb"\w+: prompt: ", rb"\w+: prompt: '", text=True)
_PROMPT_COUNT = line_kind("prompt token count", rb"\w+: number of tokens in prompt",
                      rb"\w+: number of tokens in prompt = " + N)
_PROMPT_TOKEN = line_kind("prompt token", rb" *-?\d+ -> ", rb" *" + ID + rb" -> '", text=True)
_EVAL_TIME = line_kind("eval time", rb"common_perf_print: +eval time",
                   rb"common_perf_print: +eval time = +" + F2 + rb" ms / +" + N
                   + rb" runs +\( +" + F2 + rb" ms per token, +" + RATE2
                   + rb" tokens per second\)")
_TOTAL_TIME = line_kind("total time", rb"common_perf_print: +total time",
                    rb"common_perf_print: +total time = +" + F2 + rb" ms / +" + N + rb" tokens")
_CLOSING = line_kind("graphs reused", rb"common_perf_print: +graphs reused",
                 rb"common_perf_print: +graphs reused = +" + N)
# The MTP path logs it through its own logger ("spec common_specu: ").
_ADDING = line_kind("speculative implementation",
                rb"(?:spec +)?\w+: adding speculative implementation",
                rb"(?:spec +)?\w+: adding speculative implementation '([a-z-]{1,40})'")
# The MTP path prints its candidate lines through its own logger ("spec        draft: ").
_CANDIDATE = line_kind("draft candidate", rb"(?:spec +draft: )? - seq_id ",
                   rb"(?:spec +draft: )? - seq_id " + N + rb", draft candidate +" + N + rb", pos +" + N
                   + rb": +" + ID + rb" \( *" + P + rb"\) '", text=True)
_CALLED = line_kind("draft call", rb"spec +\w+: called impl",
                rb"spec +\w+: called impl ([a-z-]{1,40}), hist size = " + N + rb", call_count = "
                + N + rb", gen = " + N)
_ACCEPTED = line_kind("verification", rb"accepted ",
                  rb"accepted " + N + rb"/" + N + rb" draft tokens, the last target token is: \("
                  + ID + rb"\)")
_PARTIAL = line_kind("partial acceptance", rb"partial acceptance:", rb"partial acceptance:.*")
_ENCODED = line_kind("encoded", rb"encoded ",
                 rb"encoded +" + N + rb" tokens in +" + F3 + rb" seconds, speed: +" + RATE + rb" t/s")
_DECODED = line_kind("decoded", rb"decoded ",
                 rb"decoded +" + N + rb" tokens in +" + F3 + rb" seconds, speed: +" + RATE + rb" t/s")
_COUNTS = {key: line_kind(f"{key} line", key.encode() + rb" +=", key.encode() + rb" += " + N)
           for key in ("n_predict", "n_drafted", "n_accept")}
_STATS = line_kind("statistics", rb"spec +\w+: statistics",
               rb"spec +\w+: statistics +([a-z-]{1,40}): #calls\(b,g,a\) = +" + N + rb" +" + N
               + rb" +" + N + rb", #gen drafts = +" + N + rb", #acc drafts = +" + N
               + rb", #gen tokens = +" + N + rb", #acc tokens = +" + N
               + rb"(?:, #mean acc len = (\d{1,10}\.\d\d), #acc rate/pos = \(((?:" + P[1:-1]
               + rb"(?:, )?){0,1024})\))?(?:, dur\(b,g,a\) = " + F3 + rb", " + F3 + rb", " + F3
               + rb" ms)?")


# --- the target alone: llama-completion ---------------------------------------------------

@dataclass(frozen=True)
class CompletionLog:
    prompt_ids: tuple[int, ...]
    system_info: str
    decode_tokens: int                 # llama.cpp's own eval timing: tokens, seconds
    decode_seconds: float


def _completion_limit(prompt: str, vocab: Vocabulary, max_new_tokens: int) -> int:
    return log_limit(prompt_bytes=len(prompt.encode("utf-8")), max_new_tokens=max_new_tokens,
                     n_max=0, longest_piece=vocab.longest)


def read_completion_log(read: Callable[[int], bytes], *, prompt: str, vocab: Vocabulary,
                        max_new_tokens: int, limit: int | None = None) -> CompletionLog | Cut:
    """llama-completion's log, read from ``read`` as it comes: system_info, the prompt echoed
    (consumed as the prompt passed), its token ids (each line consumed with the id's piece),
    then the eval timing and the closing line. Cut where it ends before that line."""
    log = Log(read, binary=COMPLETION,
              limit=limit or _completion_limit(prompt, vocab, max_new_tokens))
    return _read_completion(log, prompt=prompt, vocab=vocab, max_new_tokens=max_new_tokens)


def _read_completion(log: Log, *, prompt: str, vocab: Vocabulary,
                     max_new_tokens: int) -> CompletionLog | Cut:
    data = prompt.encode("utf-8")
    r = Reader(log, log.binary, vocab)
    body = (_SYSTEM_INFO, _PROMPT_ECHO, _PROMPT_COUNT, _PROMPT_TOKEN, _EVAL_TIME, _TOTAL_TIME,
            _CLOSING)
    info = None
    # Before the prompt: system_info, once.
    while True:
        got = r.next((_SYSTEM_INFO, _PROMPT_ECHO), elsewhere=body)
        if got is None:
            return r.cut()
        kind, m, start, line = got
        r.once(kind, line)
        if kind is _SYSTEM_INFO:
            info = line[PREFIX.match(line).end():].decode("ascii").rstrip()
            continue
        if info is None:
            raise r.fail("the prompt echoed before any system_info line",
                         "llama.cpp's system_info line first", line, "system_info")
        r.known(line, start, data, "the prompt echoed")
        break
    got = r.next((_PROMPT_COUNT,), elsewhere=body)
    if got is None:
        return r.cut()
    _, m, _, line = got
    # A token covers at least one byte of the text, with a BOS and an EOS added at most.
    n = count(m.group(1), len(data) + 2, "the prompt's token count", r, line)
    ids = []
    for _ in range(n):
        got = r.next((_PROMPT_TOKEN,), elsewhere=body)
        if got is None:
            return r.cut()
        _, m, start, line = got
        token = r.token(m.group(1), line, "a prompt token")
        r.known(line, start, vocab.special[token], f"token {token}'s piece")
        ids.append(token)
    decode = None
    while True:
        got = r.next((_EVAL_TIME, _TOTAL_TIME, _CLOSING), elsewhere=body)
        if got is None:
            return r.cut()
        kind, m, _, line = got
        r.once(kind, line)
        if kind is _EVAL_TIME:
            runs = count(m.group(2), max_new_tokens, "the eval runs", r, line)
            decode = (runs, float(m.group(1)) / 1000.0)
        elif kind is _CLOSING:
            break
    if decode is None:
        raise r.fail("no eval time line before the closing line",
                     "common_perf_print's eval time line", None, "eval time")
    _rest(r, body)
    return CompletionLog(tuple(ids), info, *decode)


def _rest(r: Reader, body: tuple[Kind, ...]) -> None:
    """After the closing line: nothing the parser reads."""
    if r.next((), elsewhere=body) is not None:
        raise AssertionError("unreachable: next() refuses every kind in elsewhere")


# --- speculative runs -----------------------------------------------------------------------

@dataclass(frozen=True)
class Draft:
    """One draft llama.cpp made and its verification. ``context``: the committed tokens
    before the anchor, a prefix of the run's committed tokens (shared, not copied: a run of
    N cycles holds O(N) ids, not O(N^2))."""

    call: int                          # 1, 2, ... in the order llama.cpp drafted
    committed: tuple[int, ...] = field(repr=False)   # the run's committed tokens (shared)
    context_length: int
    anchor: int                        # the last committed token, not yet in the context
    tokens: tuple[int, ...]            # what llama.cpp proposed after the anchor
    accepted: int
    next_token: int                    # the target's token after the accepted drafts

    @property
    def context(self) -> tuple[int, ...]:
        return self.committed[:self.context_length]


@dataclass(frozen=True)
class Stats:
    """llama.cpp's own statistics line (common_speculative_print_stats)."""

    line: str                          # as printed, without the timings
    mean_acceptance_length: float | None
    acceptance_rate_by_position: tuple[float, ...]


@dataclass(frozen=True)
class SpeculativeLog:
    drafts: tuple[Draft, ...]          # every cycle, in order; an empty draft has no tokens
    output_ids: tuple[int, ...]        # the generated tokens, in order (all llama.cpp made)
    stats: Stats
    decode_tokens: int                 # llama.cpp's "decoded N tokens in S seconds"
    decode_seconds: float


def _speculative_limit(prompt_ids, vocab: Vocabulary, n_max: int, max_new_tokens: int) -> int:
    return log_limit(prompt_bytes=len(vocab.text(prompt_ids, special=True)),
                     max_new_tokens=max_new_tokens, n_max=n_max, longest_piece=vocab.longest)


def read_speculative_log(read: Callable[[int], bytes], prompt_ids: tuple[int, ...], *,
                         spec_type: str, vocab: Vocabulary, n_max: int, max_new_tokens: int,
                         limit: int | None = None, logged: bool = True) -> SpeculativeLog | Cut:
    """The drafts of a ``-v`` run of llama-speculative-simple, read from ``read`` as they
    come and rebuilt with their context from ``prompt_ids`` (llama.cpp's own tokenization
    of the prompt). Cut where the log ends before its closing line."""
    log = Log(read, binary=SPECULATIVE,
              limit=limit or _speculative_limit(prompt_ids, vocab, n_max, max_new_tokens))
    return _read_speculative(log, prompt_ids, spec_type=spec_type, vocab=vocab, n_max=n_max,
                             max_new_tokens=max_new_tokens, logged=logged)


def _read_speculative(log: Log, prompt_ids: tuple[int, ...], *, spec_type: str,
                      vocab: Vocabulary, n_max: int, max_new_tokens: int,
                      logged: bool = True) -> SpeculativeLog | Cut:
    binary = log.binary
    if len(prompt_ids) < 2:
        raise EngineOutputError(f"{binary}: a prompt of {len(prompt_ids)} token(s); llama.cpp's "
                                "speculative loop needs at least 2 (its first anchor is the last "
                                "prompt token)", field="prompt", expected=">= 2 tokens",
                                found=len(prompt_ids))
    r = Reader(log, binary, vocab)
    loop = (_CANDIDATE, _CALLED, _ACCEPTED, _PARTIAL)
    end = (_ENCODED, _DECODED, *_COUNTS.values(), _STATS, _CLOSING)
    body = (_ADDING, *loop, *end)
    # The models load (free text of theirs printed) until the speculative implementation
    # is added, once; the loop follows.
    got = r.next((_ADDING,), elsewhere=body)
    if got is None:
        return r.cut()
    kind, m, _, line = got
    if m.group(1).decode() != spec_type:
        raise r.fail(f"it added the speculative implementation {m.group(1).decode()}",
                     spec_type, line, "spec type")
    r.once(kind, line)
    cycles = _Cycles(r, prompt_ids, spec_type=spec_type, n_max=n_max,
                     most=max_new_tokens + n_max + TOKEN_SLACK, logged=logged)
    while True:
        got = r.next((*loop, _ENCODED), elsewhere=body)
        if got is None:
            return r.cut()
        kind, m, start, line = got
        if kind is _ENCODED:
            r.once(kind, line)
            count(m.group(1), len(prompt_ids), "the encoded token count", r, line)
            if int(m.group(1)) != len(prompt_ids):
                raise r.fail(f"it encoded {int(m.group(1))} tokens",
                             f"the prompt's {len(prompt_ids)}", line, "encoded")
            break
        cycles.line(kind, m, start, line)
    cycles.finish()
    decode = None
    counts: dict[str, int] = {}
    stats = None
    while True:
        got = r.next(end[1:], elsewhere=body)
        if got is None:
            return r.cut()
        kind, m, _, line = got
        r.once(kind, line)
        if kind is _DECODED:
            n = count(m.group(1), cycles.most, "the decoded token count", r, line)
            decode = (n, float(m.group(2)))
        elif kind is _STATS:
            stats = cycles.stats(m, line)
        elif kind is _CLOSING:
            break
        else:
            counts[kind.name.split()[0]] = count(m.group(1), 1 << 40, kind.name, r, line)
    for name, got_line in (("decoded", decode), ("statistics", stats)):
        if got_line is None:
            raise r.fail(f"no {name} line before the closing line", f"llama.cpp's {name} line",
                         None, name)
    made = len(cycles.output)
    want = {"n_predict": made, "n_drafted": sum(len(d.tokens) for d in cycles.drafts),
            "n_accept": sum(d.accepted for d in cycles.drafts)}
    for name, value in (("decoded", decode[0]), *counts.items()):
        expected = made if name == "decoded" else want[name]
        if value != expected:
            raise r.fail(f"its {name} count is {value}", f"{expected}, what its cycles read make",
                         None, name)
    _rest(r, body)
    committed = tuple(cycles.committed)
    drafts = tuple(Draft(d.call, committed, d.context_length, d.anchor, d.tokens, d.accepted,
                         d.next_token) for d in cycles.drafts)
    return SpeculativeLog(drafts, tuple(cycles.output), stats, *decode)


@dataclass
class _Cycle:
    call: int
    context_length: int
    anchor: int
    tokens: tuple[int, ...]
    accepted: int
    next_token: int


class _Cycles:
    """The speculative loop's lines, cycle by cycle: candidates, the draft call, the
    verification; the committed tokens rebuilt as they come."""

    def __init__(self, r: Reader, prompt_ids, *, spec_type: str, n_max: int, most: int,
                 logged: bool = True) -> None:
        self.r, self.spec_type, self.n_max, self.most = r, spec_type, n_max, most
        self.logged = logged                    # False: no candidate line (UNLOGGED_KINDS)
        self.committed = list(prompt_ids[:-1])
        self.anchor = prompt_ids[-1]
        self.drafts: list[_Cycle] = []
        self.output: list[int] = []
        self.rows: dict[int, int] = {}          # pos -> candidate 0 of the draft being read
        self.called: tuple[int, int] | None = None

    def line(self, kind: Kind, m: re.Match, start: int, line: bytes) -> None:
        r = self.r
        if kind is _PARTIAL:
            raise r.fail("it restored a checkpoint after a partial acceptance (a target "
                         "without partial sequence removal)", "the plain loop, which the "
                         "eval reads", line, "partial acceptance")
        if kind is _CANDIDATE and not self.logged:
            raise r.fail("a draft candidate line", "none: llama.cpp 0c1e570 logs no "
                         "candidate of this drafter", line, "draft candidate")
        if kind is _CANDIDATE:
            seq, k, pos = (count(m.group(i), 1 << 12, what, r, line)
                           for i, what in ((1, "seq_id"), (2, "candidate"), (3, "pos")))
            token = r.token(m.group(4), line, "a draft candidate")
            r.known(line, start, r.vocab.special[token], f"token {token}'s piece")
            if seq != 0 or k != 0:
                return
            if pos in self.rows:
                raise r.fail(f"a second candidate 0 at position {pos} of one draft",
                             "one a position", line, "draft candidate")
            self.rows[pos] = token
        elif kind is _CALLED:
            if m.group(1).decode() != self.spec_type:
                raise r.fail(f"it drafted with {m.group(1).decode()}, not {self.spec_type}",
                             self.spec_type, line, "spec type")
            if self.called is not None:
                raise r.fail("a second draft call before the verification",
                             "one draft call a cycle", line, "draft call")
            hist = int(m.group(2))
            gen = count(m.group(4), self.n_max, "the draft's length", r, line)
            call = len(self.drafts) + 1
            if hist != len(self.committed):
                raise r.fail(f"draft {call} was made from {hist} committed tokens; the tokens "
                             f"read so far make {len(self.committed)}",
                             f"{len(self.committed)}", line, f"draft {call}")
            # Both layouts print the draft's own positions 0..G-1 (draft-dflash prints row
            # i as position i-1: common/speculative.cpp).
            if self.logged and (gen < 1 or any(p not in self.rows for p in range(gen))):
                raise r.fail(f"draft {call} holds {gen} tokens but its log names positions "
                             f"{sorted(self.rows)[:16]}", f"positions 0..{gen - 1}", line,
                             f"draft {call}")
            self.called = (hist, gen)
        else:
            accepted = int(m.group(1))
            n_draft = count(m.group(2), self.n_max, "the verified draft length", r, line)
            nxt = r.token(m.group(3), line, "the target's token")
            call = len(self.drafts) + 1
            if not self.called:
                tokens = ()
            elif self.logged:
                tokens = tuple(self.rows[p] for p in range(self.called[1]))
            else:
                tokens = (UNLOGGED,) * self.called[1]
            if n_draft != len(tokens) or accepted > len(tokens):
                raise r.fail(f"cycle {call} verified {n_draft} draft tokens (accepted "
                             f"{accepted}); its draft read has {len(tokens)}",
                             f"{len(tokens)}", line, f"draft {call}")
            self.drafts.append(_Cycle(call, len(self.committed), self.anchor, tokens, accepted,
                                      nxt))
            self.committed += [self.anchor, *tokens[:accepted]]
            self.output += [*tokens[:accepted], nxt]
            self.anchor = nxt
            self.rows, self.called = {}, None
            if len(self.output) > self.most:
                raise r.fail(f"its cycles made {len(self.output)} tokens",
                             f"at most {self.most} (-n, a draft and a few over)", line, "cycles")

    def finish(self) -> None:
        if self.called is not None or self.rows:
            raise self.r.fail("a draft with no verification before the run's timings",
                              "every draft verified", None, "cycles")
        if not self.drafts:
            raise self.r.fail("no verification line ('accepted A/G draft tokens')",
                              "one a cycle (was it run with -v?)", None, "cycles")

    def stats(self, m: re.Match, line: bytes) -> Stats:
        """The statistics line, each number checked against the cycles read."""
        r = self.r
        name = m.group(1).decode()
        if name != self.spec_type:
            raise r.fail(f"the statistics are of {name}", self.spec_type, line, "statistics")
        drafted = [d for d in self.drafts if d.tokens]
        # llama.cpp counts a verification from its first draft on (common_speculative_accept).
        first = next((i for i, d in enumerate(self.drafts) if d.tokens), len(self.drafts))
        verified = self.drafts[first:]
        want = {"#calls(a)": (4, len(verified)), "#gen drafts": (5, len(drafted)),
                "#acc drafts": (6, sum(d.accepted > 0 for d in drafted)),
                "#gen tokens": (7, sum(len(d.tokens) for d in drafted)),
                "#acc tokens": (8, sum(d.accepted for d in drafted))}
        for what, (group, value) in want.items():
            if int(m.group(group)) != value:
                raise r.fail(f"its {what} is {int(m.group(group))}",
                             f"{value}, what its cycles read make", line, "statistics")
        mean = float(m.group(9)) if m.group(9) else None
        rates = tuple(float(x) for x in m.group(10).split(b", ")) if m.group(10) else ()
        if (mean is None) != bool(not verified):
            raise r.fail("its acceptance figures are " + ("missing" if mean is None else "there"),
                         "them exactly when a draft was verified", line, "statistics")
        if mean is not None:
            if not 1.0 <= mean <= self.n_max + 1:
                raise r.fail(f"its mean acceptance length {mean}",
                             f"within [1, {self.n_max + 1}]", line, "statistics")
            if abs(mean - (1 + want["#acc tokens"][1] / len(verified))) > 0.006:
                raise r.fail(f"its mean acceptance length {mean}", "1 + accepted tokens / "
                             "verifications, from its cycles read", line, "statistics")
            longest = max(d.accepted for d in verified)
            expect = [sum(d.accepted > k for d in verified) / len(verified)
                      for k in range(longest)]
            if len(rates) != longest or any(abs(a - b) > 0.0006 for a, b in zip(rates, expect)):
                raise r.fail("its acceptance rates by position", "rates in [0, 1] equal to "
                             "its cycles read", line, "statistics")
        text = line[PREFIX.match(line).end():].decode("ascii", "replace")
        text = re.sub(r", dur\(b,g,a\).*$", "", text)
        return Stats(line=re.sub(r"^spec +\w+: statistics +", "", text),
                     mean_acceptance_length=mean, acceptance_rate_by_position=rates)


# --- running ------------------------------------------------------------------------------------

# llama.cpp 0c1e570 logs through a worker thread and never flushes it at exit (common/log.cpp,
# common_log_main: "logs may be lost if not flushed before the program exits"): without help
# the last lines of a run, its statistics included, are often missing (measured on a loaded
# 2-core machine: 16 of 40 runs). Every run gets that help, log_drain (the logger is let
# finish before the process ends: 0 of 270 runs cut there). A run whose log really looks cut
# (it exited 0, llama.cpp's own lines came and nothing was wrong in them, but the closing
# line did not) is run again: stdout goes through the same queue, in order, so a line
# printed last proves all before it. Empty or foreign output is refused at once.
ATTEMPTS = 4
_R = TypeVar("_R")


def rerun_while_cut(run: Callable[[], _R], whole: Callable[[_R], bool], *, attempts: int,
                    cut: Callable[[_R], Exception]) -> _R:
    """``run()`` until ``whole`` says its log is whole, up to ``attempts`` runs; when none
    is, ``cut(the last run)`` is raised. The one retry of llama.cpp's lost log lines (the
    eval's runs here, the tests' runs in tests/support/llama_cpp.py). ``whole`` decides
    what may be retried: it raises for what is wrong at once."""
    for _ in range(attempts):
        result = run()
        if whole(result):
            return result
    raise cut(result)


@dataclass(frozen=True)
class _Done:
    parsed: object                     # the parser's result, or a Cut
    stdout: bytes
    seconds: float


def _command(cmd: list[str]) -> str:
    """The command line, exact but shortened: each argument quoted, a long one cut."""
    parts = [shlex.quote(a if len(a) <= 120 else a[:60] + "…" + a[-40:]) for a in cmd]
    text = " ".join(parts)
    return text if len(text) <= 600 else text[:600] + "…"


def _crash(binary: Path, what: str, cmd: list[str], code: int, log: Log) -> EngineRunError:
    how = f"killed by {signal_name(code)}" if code < 0 else f"exit {code}"
    last = " | ".join(list(log.tail)[-5:]) or "no log line"
    cause = ("; likely cause: weights repacked for AMX (its log names an AMX buffer); "
             "llama.cpp's --no-repack (-nr) avoids it") if log.watched else ""
    return EngineRunError(f"{binary.name} ({what}) failed, {how}{cause}; command: "
                          f"{_command(cmd)}; its last log lines: {last}", path=str(binary),
                          field=what, expected="exit 0",
                          found=signal_name(code) if code < 0 else code)


def _run(binary: Path, args: list[str], what: str, parse: Callable[[Log], object], *,
         log_bytes: int, out_limit: int, timeout: float) -> _Done:
    """``binary args``, its stderr read by ``parse`` as it comes (at most ``log_bytes``) and
    its stdout kept up to ``out_limit`` bytes, by a thread; the run ends within ``timeout``
    whatever it starts (evaluation/engine_process.py: its session killed at the deadline,
    and once it exits), and is stopped at once when it writes past a limit or its log is
    refused."""
    cmd = [str(binary), *args]
    try:
        run = Watched(cmd, timeout=timeout, stdin=subprocess.DEVNULL,
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                      env=log_drain.environment())
    except OSError as exc:
        raise EngineRunError(f"{binary.name} ({what}): cannot run: "
                             f"{os.strerror(exc.errno or 0) or exc}", path=str(binary)) from None
    proc = run.proc
    out = bytearray()
    over = threading.Event()
    stdout = run.pipe(proc.stdout.fileno())
    stderr = run.pipe(proc.stderr.fileno())

    def drain_stdout() -> None:
        try:
            while chunk := stdout(CHUNK):
                if len(out) + len(chunk) > out_limit:
                    over.set()
                    run.stop()
                    return
                out.extend(chunk)
        except Abandoned:
            pass

    reader = threading.Thread(target=drain_stdout, daemon=True)
    reader.start()
    log = Log(stderr, binary=binary.name, limit=log_bytes, watch=_AMX_BUFFER)
    error: EngineOutputError | None = None
    parsed = None
    try:
        parsed = parse(log)
    except Abandoned:
        pass                            # the run ended; its marks say how
    except EngineOutputError as exc:
        error = exc
        run.stop()
    except BaseException:
        run.stop()                      # Ctrl-C or a bug: the process must not outlive it
        raise
    finally:
        code = run.finish(reader)
    last = " | ".join(list(log.tail)[-3:]) or "no log line"
    if run.timed_out.is_set():
        raise EngineRunError(f"{binary.name} ({what}): {run.timeout_text()}; its last log lines: "
                             f"{last}", path=str(binary), expected=f"done within {timeout:g} s",
                             found="timeout")
    if code != 0 and not run.stopped.is_set():
        raise _crash(binary, what, cmd, code, log)
    if run.orphaned.is_set():
        raise EngineRunError(f"{binary.name} ({what}): {run.orphan_text('its output')}; its "
                             f"last log lines: {last}", path=str(binary), field=what,
                             expected="its output closed when it exits",
                             found="a process it started holding its output")
    if error is not None:
        raise error
    if over.is_set():
        raise EngineOutputError(f"{binary.name} ({what}): its output exceeds {out_limit:,} "
                                "bytes, more than the prompt and every token -n allows at the "
                                "longest piece", path=str(binary), field="stdout",
                                expected=f"at most {out_limit} bytes",
                                found=f"more than {out_limit} bytes")
    return _Done(parsed, bytes(out), run.seconds)


def _cut_error(binary: str, what: str, cut: Cut, runs: int) -> EngineOutputError:
    if cut.entries == 0:
        return EngineOutputError(f"{binary} ({what}): no line of llama.cpp's log in "
                                 f"{cut.total:,} bytes of output; expected its prefixed lines "
                                 f"({' '.join(LOG_ARGS)})", path=binary, field="log",
                                 expected="llama.cpp's log", found=f"{cut.total} bytes")
    drain = log_drain.status()
    without = f"; it ran without the log drain: {drain.why_not}" if drain.why_not else ""
    return EngineOutputError(f"{binary} ({what}): its log ends after {cut.last!s} in {runs} "
                             "run(s), before llama.cpp's closing line (common_perf_print's "
                             f"graphs reused){without}; the eval reads only a whole log",
                             path=binary, field="log", expected="the closing line",
                             found=cut.last)


def _run_whole(binary: Path, args: list[str], what: str, parse, *, log_bytes: int,
               out_limit: int, timeout: float) -> _Done:
    """``_run`` again while the log only looks cut (see ATTEMPTS); a log with no line of
    llama.cpp's is refused at once."""
    runs = 0

    def whole(done: _Done) -> bool:
        nonlocal runs
        runs += 1
        if isinstance(done.parsed, Cut) and done.parsed.entries == 0:
            raise _cut_error(binary.name, what, done.parsed, runs)
        return not isinstance(done.parsed, Cut)

    return rerun_while_cut(lambda: _run(binary, args, what, parse, log_bytes=log_bytes,
                                        out_limit=out_limit, timeout=timeout),
                           whole, attempts=ATTEMPTS,
                           cut=lambda done: _cut_error(binary.name, what, done.parsed, runs))


def _prompt_file(directory: Path, text: str) -> Path:
    """The prompt as a file for ``-f``: llama.cpp drops one final newline of the file, so
    one is added (the text itself is passed unchanged, even one that ends in a newline)."""
    path = directory / "prompt.txt"
    path.write_bytes(text.encode("utf-8") + b"\n")
    return path


def _run_on_prompt(binary: Path, prompt_text: str, args: Callable[[Path], list[str]],
                   what: str, parse: Callable[[Log], object], *, vocab: Vocabulary,
                   max_new_tokens: int, n_max: int, timeout: float) -> _Done:
    """``binary`` with ``args(the prompt's file)``, its output bounded by what this prompt
    and -n allow (log_limit, stdout_limit) and read by ``parse``: either binary's run."""
    sizes = dict(prompt_bytes=len(prompt_text.encode("utf-8")), max_new_tokens=max_new_tokens,
                 n_max=n_max, longest_piece=vocab.longest)
    with tempfile.TemporaryDirectory(prefix="dspark-llama-") as tmp:
        return _run_whole(binary, args(_prompt_file(Path(tmp), prompt_text)), what, parse,
                          log_bytes=log_limit(**sizes), out_limit=stdout_limit(**sizes),
                          timeout=timeout)


def completion_args(target_gguf: Path, prompt_file: Path, *, max_new_tokens: int,
                    threads: int = 1, special: bool = False) -> list[str]:
    """llama-completion's arguments (without -v: its debug lines echo the prompt and the
    generated pieces once more, and nothing the eval reads is among them). ``special``:
    control tokens printed as their text (-sp), as llama-speculative-simple prints them."""
    return ["-m", str(target_gguf), "-f", str(prompt_file), "-n", str(max_new_tokens), "--temp",
            "0", "-no-cnv", "--no-display-prompt", "--verbose-prompt", "-t", str(threads),
            *(["-sp"] if special else []), *PROMPT_ARGS, *LOG_ARGS]


def speculative_args(target_gguf: Path, draft_gguf: Path, prompt_file: Path, *, spec_type: str,
                     n_max: int, max_new_tokens: int, threads: int = 1) -> list[str]:
    """llama-speculative-simple's arguments (-v: the draft lines are debug lines)."""
    return ["-m", str(target_gguf), "-md", str(draft_gguf), "--spec-type", spec_type,
            "--spec-draft-n-max", str(n_max), "--spec-draft-p-min", "0", "--temp", "0",
            "-f", str(prompt_file), "-n", str(max_new_tokens), "-t", str(threads), "-v",
            *PROMPT_ARGS, *LOG_ARGS]


@dataclass(frozen=True)
class TargetRun:
    prompt_ids: tuple[int, ...]        # the prompt as llama.cpp tokenized its text
    text: bytes                        # the generated text (the prompt not echoed)
    ended: bool                        # it stopped at an end-of-generation token
    seconds: float                     # the whole process
    decode_tokens: int                 # llama.cpp's own eval timing: tokens, seconds
    decode_seconds: float
    system_info: str                   # llama.cpp's own system_info line


def run_target(bins: Binaries, target_gguf: Path, prompt_text: str, *, vocab: Vocabulary,
               max_new_tokens: int, threads: int = 1, timeout: float = TIMEOUT_SECONDS,
               what: str = "the target alone", special: bool = False) -> TargetRun:
    """llama-completion on the target alone, greedy. ``what`` names the run in a message;
    ``special``: its text with control tokens as their text (completion_args)."""
    done = _run_on_prompt(
        bins.completion, prompt_text,
        lambda prompt: completion_args(target_gguf, prompt, max_new_tokens=max_new_tokens,
                                       threads=threads, special=special),
        what, lambda log: _read_completion(log, prompt=prompt_text, vocab=vocab,
                                           max_new_tokens=max_new_tokens),
        vocab=vocab, max_new_tokens=max_new_tokens, n_max=0, timeout=timeout)
    parsed: CompletionLog = done.parsed
    _within_the_run(parsed.decode_seconds, done.seconds, binary=COMPLETION, what=what,
                    field="eval time")
    text = done.stdout
    # What llama-completion prints after the tokens: " [end of text]\n" at an
    # end-of-generation token, then "\n\n" (tools/completion/completion.cpp).
    if not text.endswith(b"\n\n"):
        raise EngineOutputError(f"{COMPLETION} ({what}): its output does not end with the blank "
                                "line it prints after the generated text", field="stdout",
                                expected="text + '\\n\\n'", found=shown(text[-40:]))
    text = text[:-2]
    ended = text.endswith(b" [end of text]\n")
    if ended:
        text = text[: -len(b" [end of text]\n")]
    return TargetRun(prompt_ids=parsed.prompt_ids, text=text, ended=ended, seconds=done.seconds,
                     decode_tokens=parsed.decode_tokens, decode_seconds=parsed.decode_seconds,
                     system_info=parsed.system_info)


def _within_the_run(seconds: float, run_seconds: float, *, binary: str, what: str,
                    field: str) -> None:
    """A time llama.cpp reports for part of a run is at most the whole run we timed (and a
    second of clock slack): a longer one is a garbled log, not a measurement."""
    if seconds > run_seconds + 1.0:
        raise EngineOutputError(f"{binary} ({what}): its {field} time {seconds:.3f} s is longer "
                                f"than the run ({run_seconds:.3f} s)", path=binary, field=field,
                                expected="a time within the run", found=seconds)


@dataclass(frozen=True)
class SpeculativeRun:
    spec_type: str
    drafts: tuple[Draft, ...]          # every cycle, in order; an empty draft has no tokens
    output_ids: tuple[int, ...]        # the generated tokens, in order (all llama.cpp made)
    text: bytes                        # stdout as printed
    stats: Stats
    seconds: float                     # the whole process
    decode_tokens: int                 # llama.cpp's "decoded N tokens in S seconds"
    decode_seconds: float


def run_speculative(bins: Binaries, target_gguf: Path, draft_gguf: Path, *, kind: str,
                    prompt_text: str, prompt_ids: tuple[int, ...], vocab: Vocabulary,
                    max_new_tokens: int, n_max: int, threads: int = 1,
                    timeout: float = TIMEOUT_SECONDS, what: str | None = None) -> SpeculativeRun:
    """llama-speculative-simple at temperature 0, the confidence cut off (p-min 0), drafts of
    up to ``n_max`` tokens; ``kind`` a key of SPEC_TYPES (the --spec-type). A kind of
    UNLOGGED_KINDS comes back with UNLOGGED for each drafted token (``resolve_unlogged``)."""
    spec_type = SPEC_TYPES[kind]
    what = what or spec_type
    done = _run_on_prompt(
        bins.speculative, prompt_text,
        lambda prompt: speculative_args(target_gguf, draft_gguf, prompt, spec_type=spec_type,
                                        n_max=n_max, max_new_tokens=max_new_tokens,
                                        threads=threads),
        what, lambda log: _read_speculative(log, prompt_ids, spec_type=spec_type, vocab=vocab,
                                            n_max=n_max, max_new_tokens=max_new_tokens,
                                            logged=kind not in UNLOGGED_KINDS),
        vocab=vocab, max_new_tokens=max_new_tokens, n_max=n_max, timeout=timeout)
    parsed: SpeculativeLog = done.parsed
    _within_the_run(parsed.decode_seconds, done.seconds, binary=SPECULATIVE, what=what,
                    field="decoded")
    return SpeculativeRun(spec_type=spec_type, drafts=parsed.drafts, output_ids=parsed.output_ids,
                          text=done.stdout, stats=parsed.stats, seconds=done.seconds,
                          decode_tokens=parsed.decode_tokens,
                          decode_seconds=parsed.decode_seconds)


def resolve_unlogged(run: SpeculativeRun, prompt_ids, vocab: Vocabulary,
                     propose: Callable[[tuple[int, ...], int], list[int]], *,
                     stop: int | None = None
                     ) -> tuple[SpeculativeRun, tuple[int, int] | None]:
    """A run of an UNLOGGED_KINDS drafter with its accepted drafts' ids filled in, checked
    as far as llama.cpp shows them. Its log names each cycle's anchor, accepted count and
    target token, never a drafted token; its stdout is the text of every committed token.
    For each cycle in order, ``propose(context, anchor)`` (the reference runtime's drafts for
    the same committed context) must spell, in its first A tokens, exactly the bytes
    llama.cpp printed for its A accepted drafts, and its token A (when A < the draft's
    length) must not be the target's token, which llama.cpp's was not either, except for
    ``stop``, the end-of-generation token that ended the run: llama.cpp's verification
    ends at it and names it the target's token whether it was drafted or not. The first
    cycle where that fails is returned (its call number and the first position of the
    reference's draft that cannot be llama.cpp's; None: every cycle agreed) and ends the
    resolution: later contexts would be unknown. A rejected llama.cpp token stays
    UNLOGGED (no output shows it)."""
    text = run.text.lstrip(b"\n")
    prompt = vocab.text(prompt_ids, special=True)
    if not text.startswith(prompt):
        raise EngineOutputError(f"{SPECULATIVE}: its output does not begin with the prompt it "
                                "echoes", field="stdout", expected=shown(prompt[:40]),
                                found=shown(text[:40]))
    cursor = len(prompt)
    committed = list(prompt_ids[:-1])
    resolved: list[tuple[_Cycle, tuple[int, ...]]] = []
    first_difference = None
    for d in run.drafts:
        context = tuple(committed)
        mine = list(propose(context, d.anchor))[:len(d.tokens)] if d.tokens else []
        accepted = tuple(mine[:d.accepted])
        # llama-speculative-simple prints each token with special=true (control tokens as
        # their text: examples/speculative-simple/speculative-simple.cpp).
        # The end-of-generation token that ends the run is not printed.
        ends = d is run.drafts[-1] and d.next_token == stop
        spelled = (vocab.text(accepted, special=True)
                   + (b"" if ends else vocab.special[d.next_token]))
        agrees = (len(accepted) == d.accepted and text.startswith(spelled, cursor)
                  and (d.accepted == len(d.tokens) or mine[d.accepted] != d.next_token or ends))
        if not agrees:
            # The first position the reference's draft cannot be llama.cpp's: a token of the
            # accepted prefix whose text is not what llama.cpp printed; the last accepted one
            # when they spell only the start of it (llama.cpp's was a longer token); else
            # slot A (the reference drafted the target's own token there).
            position = next((k for k in range(len(accepted)) if not text.startswith(
                vocab.text(accepted[:k + 1], special=True), cursor)), None)
            if position is None:
                prefix = vocab.text(accepted, special=True)
                rest_ok = text.startswith(spelled[len(prefix):], cursor + len(prefix))
                position = d.accepted - 1 if accepted and not rest_ok else d.accepted
            first_difference = (d.call, position)
            break
        cursor += len(spelled)
        committed += [d.anchor, *accepted]
        resolved.append((d, accepted))
    whole = tuple(committed)
    drafts = tuple(Draft(d.call, whole, d.context_length, d.anchor,
                         accepted + d.tokens[d.accepted:], d.accepted, d.next_token)
                   for d, accepted in resolved)
    output: list[int] = []
    for d in drafts:
        output += [*d.tokens[:d.accepted], d.next_token]
    return (SpeculativeRun(spec_type=run.spec_type, drafts=drafts, output_ids=tuple(output),
                           text=run.text, stats=run.stats, seconds=run.seconds,
                           decode_tokens=run.decode_tokens, decode_seconds=run.decode_seconds),
            first_difference)


# --- a log given whole (the tests' hostile logs, a log saved by hand) -------------------------

def _whole(parsed, binary: str):
    if isinstance(parsed, Cut):
        raise _cut_error(binary, "a log given whole", parsed, 1)
    return parsed


def parse_completion(log: bytes, *, prompt: str, vocab: Vocabulary,
                     max_new_tokens: int) -> CompletionLog:
    """read_completion_log on bytes; a cut log is refused."""
    return _whole(read_completion_log(io.BytesIO(log).read, prompt=prompt, vocab=vocab,
                                      max_new_tokens=max_new_tokens), COMPLETION)


def parse_speculative(log: bytes, prompt_ids: tuple[int, ...], *, spec_type: str,
                      vocab: Vocabulary, n_max: int, max_new_tokens: int,
                      logged: bool = True) -> SpeculativeLog:
    """read_speculative_log on bytes; a cut log is refused. ``logged``: False for a kind of
    UNLOGGED_KINDS (no candidate line)."""
    return _whole(read_speculative_log(io.BytesIO(log).read, prompt_ids, spec_type=spec_type,
                                       vocab=vocab, n_max=n_max, max_new_tokens=max_new_tokens,
                                       logged=logged),
                  SPECULATIVE)


def text_of_prompt_ids(vocab: Vocabulary, ids) -> str | None:
    """The text whose llama.cpp tokenization may give back ``ids`` (checked by the caller),
    or None when the ids spell bytes that are not UTF-8 (a prompt is passed as text)."""
    try:
        return vocab.text(ids, special=True).decode("utf-8")
    except UnicodeDecodeError:
        return None
