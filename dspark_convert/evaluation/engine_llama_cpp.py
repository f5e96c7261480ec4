"""llama.cpp's own runs, read back as data: the engine `dspark eval --engine llama.cpp=BIN_DIR`
puts beside the reference runtime (issue 20; docs/ENGINES.md "llama.cpp's runs beside ours").

Two binaries of llama.cpp 0c1e570 (docs/REFERENCE.md §6, "As a runtime"), run as a user runs them:

- ``llama-completion -m TARGET.gguf -f PROMPT -n N --temp 0 -no-cnv --no-display-prompt
  --verbose-prompt``: the target alone. Its log lists the prompt's token ids as llama.cpp
  tokenized the text (``%6d -> '%s'``), the only way to learn them: both programs take a
  prompt as text only. Its stdout is the generated text.
- ``llama-speculative-simple -m TARGET.gguf -md DRAFT.gguf --spec-type T --spec-draft-n-max B
  --spec-draft-p-min 0 --temp 0 -f PROMPT -n N -v``: speculative decoding. Its debug log
  names, for every draft call, each drafted token (``draft candidate 0, pos k: ID``), the
  draft's length and the length of the committed context it was drafted from (``called
  impl T, hist size = H, ..., gen = G``), then the verification (``accepted A/G draft
  tokens, the last target token is: (ID)``). From these the committed tokens, the anchor
  and the proposal of every draft are rebuilt exactly: llama.cpp's first anchor is the
  last prompt token (its context the prompt before it), and each cycle commits the
  anchor, the A accepted drafts and makes the target's token the next anchor.

Everything is parsed from the bytes llama.cpp writes, with the log prefix and timestamps
forced on (``--log-prefix --log-timestamps``) so that a line of the log is told from a
token's text that happens to contain a newline. Whatever the parser needs and does not
find, or finds contradicting itself (a context length that is not the one rebuilt, a
prompt token count that is not the number of ids listed), is refused with
``EngineOutputError``: a wrong reading would make every later comparison wrong.

The generated text is compared as bytes, each token's piece taken from the target GGUF's
own vocabulary (``tokenizer.ggml.tokens``, a byte-level BPE vocabulary: GPT-2's byte
alphabet), as llama.cpp's ``common_token_to_piece`` renders it.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from dspark_convert.errors import (
    EngineBinaryError,
    EngineOutputError,
    EngineRunError,
    TargetGGUFError,
)
from dspark_convert.evaluation import log_drain
from dspark_convert.util.text import shown

ENGINE = "llama.cpp"
SPECULATIVE = "llama-speculative-simple"
COMPLETION = "llama-completion"
BINARIES = (SPECULATIVE, COMPLETION)
SPEC_TYPES = {"dspark": "draft-dspark", "dflash": "draft-dflash"}
TIMEOUT_SECONDS = 600
# Forced on every run: the parser depends on the prefix (level letter) and the timestamp.
LOG_ARGS = ("--log-prefix", "--log-timestamps")

# One log line: "0.00.211.417 D <message>". A token's piece may hold a newline, so every
# pattern is anchored at a line that starts with this prefix.
_PREFIX = rb"(?m)^\d+\.\d+\.\d+\.\d+ [A-Z] "
_CANDIDATE = re.compile(_PREFIX + rb" - seq_id (\d+), draft candidate +(\d+), pos +(\d+): +(-?\d+) \(")
_CALLED = re.compile(_PREFIX + rb"spec [^:\n]*: called impl (\S+), hist size = (\d+), "
                     rb"call_count = (\d+), gen = (\d+)")
_ACCEPTED = re.compile(_PREFIX + rb"accepted (\d+)/(\d+) draft tokens, the last target token is: "
                       rb"\((-?\d+)\)")
_PARTIAL = re.compile(_PREFIX + rb"partial acceptance:")
_STATS = re.compile(_PREFIX + rb"spec [^:\n]*: statistics +(\S+): (.*?)(?:, dur\(b,g,a\).*)?$")
_DECODED = re.compile(_PREFIX + rb"decoded +(\d+) tokens in +([0-9.]+) seconds, speed: +([0-9.]+|inf|nan) t/s")
_PROMPT_COUNT = re.compile(_PREFIX + rb"[^\n]*: number of tokens in prompt = (\d+)")
_PROMPT_TOKEN = re.compile(_PREFIX + rb" *(-?\d+) -> '")
_ERROR_LINE = re.compile(_PREFIX.replace(b"[A-Z]", b"E") + rb"(.*)$")
_EVAL_TIME = re.compile(_PREFIX + rb"common_perf_print: +eval time = +([0-9.]+) ms / +(\d+) runs")


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
    must spell for llama.cpp's tokenizer, which parses special tokens, to read them)."""

    pieces: tuple[bytes, ...]
    special: tuple[bytes, ...]

    def text(self, ids, *, special: bool = False) -> bytes:
        table = self.special if special else self.pieces
        return b"".join(table[i] if 0 <= i < len(table) else b"" for i in ids)


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
            piece = bytes(decoder[c] for c in text if c in decoder)
            pieces.append(piece)
            special.append(piece)
        elif kind == 4:                      # USER_DEFINED: the text itself
            pieces.append(text.encode("utf-8"))
            special.append(text.encode("utf-8"))
        elif kind == 3:                      # CONTROL: its text only with special
            pieces.append(b"")
            special.append(text.encode("utf-8"))
        else:                                # UNUSED, UNKNOWN, BYTE: nothing
            pieces.append(b"")
            special.append(b"")
    return Vocabulary(tuple(pieces), tuple(special))


# --- running ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Output:
    stdout: bytes
    stderr: bytes
    seconds: float


def _run(binary: Path, args: list[str], *, timeout: float) -> Output:
    cmd = [str(binary), *args]
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL,
                              env=log_drain.environment())
    except subprocess.TimeoutExpired:
        raise EngineRunError(f"{binary.name}: still running after {timeout:g} s; stopped",
                             path=str(binary), expected=f"done within {timeout:g} s",
                             found="timeout") from None
    except OSError as exc:
        raise EngineRunError(f"{binary.name}: cannot run: {os.strerror(exc.errno or 0) or exc}",
                             path=str(binary)) from None
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        errors = [m.group(1).decode("utf-8", "replace").strip() for m in _ERROR_LINE.finditer(done.stderr)]
        why = errors[-1] if errors else (done.stderr.decode("utf-8", "replace").strip().splitlines()
                                         or ["no message"])[-1]
        how = f"signal {-done.returncode}" if done.returncode < 0 else f"exit {done.returncode}"
        raise EngineRunError(f"{binary.name} failed ({how}): {why[:300]}", path=str(binary),
                             expected="exit 0", found=done.returncode)
    return Output(done.stdout, done.stderr, seconds)


# llama.cpp 0c1e570 logs through a worker thread and never flushes it at exit (common/log.cpp,
# common_log_main: "logs may be lost if not flushed before the program exits"): without help
# the last lines of a run, its statistics included, are often missing (measured on a loaded
# 2-core machine: 16 of 40 runs). Every run gets that help, log_drain (the logger is let
# finish before the process ends: 0 of 270 runs cut there). A run whose closing line is
# still missing (no C compiler for the drain, a thread that never rests) is run again: stdout
# goes through the same queue, in order, so a line printed last proves all before it.
ATTEMPTS = 4
_R = TypeVar("_R")
_TOTAL_TIME = re.compile(_PREFIX + rb"common_perf_print: +total time =")


def rerun_while_cut(run: Callable[[], _R], whole: Callable[[_R], bool], *, attempts: int,
                    cut: Callable[[_R], Exception]) -> _R:
    """``run()`` until ``whole`` says its log is whole, up to ``attempts`` runs; when none
    is, ``cut(the last run)`` is raised. The one retry of llama.cpp's lost log lines (the
    eval's runs here, the tests' runs in tests/support/llama_cpp.py)."""
    for _ in range(attempts):
        result = run()
        if whole(result):
            return result
    raise cut(result)


def _run_whole(binary: Path, args: list[str], *, last: re.Pattern, timeout: float) -> Output:
    def cut(_out: Output) -> EngineOutputError:
        drain = log_drain.status()
        without = f"; run without the log drain: {drain.why_not}" if drain.why_not else ""
        return EngineOutputError(f"{binary.name}: its log lost its last lines at exit in "
                                 f"{ATTEMPTS} runs (llama.cpp does not flush its logger at exit: "
                                 f"common/log.cpp){without}; the eval reads only a whole log",
                                 path=str(binary), field="log",
                                 expected="the closing timings line", found="missing")

    return rerun_while_cut(lambda: _run(binary, args, timeout=timeout),
                           lambda out: last.search(out.stderr) is not None,
                           attempts=ATTEMPTS, cut=cut)


def _prompt_file(directory: Path, text: str) -> Path:
    """The prompt as a file for ``-f``: llama.cpp drops one final newline of the file, so
    one is added (the text itself is passed unchanged, even one that ends in a newline)."""
    path = directory / "prompt.txt"
    path.write_bytes(text.encode("utf-8") + b"\n")
    return path


def _need(value, what: str, binary: str):
    if value is None:
        raise EngineOutputError(f"{binary}: its output has no {what}; expected the line "
                                f"{ENGINE} 0c1e570 prints (the eval reads nothing else)",
                                field=what, expected="present", found="missing")
    return value


@dataclass(frozen=True)
class TargetRun:
    prompt_ids: tuple[int, ...]        # the prompt as llama.cpp tokenized its text
    text: bytes                        # the generated text (the prompt not echoed)
    ended: bool                        # it stopped at an end-of-generation token
    seconds: float                     # the whole process
    decode_tokens: int                 # llama.cpp's own eval timing: tokens, seconds
    decode_seconds: float


def parse_prompt_ids(stderr: bytes, binary: str = COMPLETION) -> tuple[int, ...]:
    count = _need(_PROMPT_COUNT.search(stderr), "'number of tokens in prompt' line", binary)
    n = int(count.group(1))
    ids = [int(m.group(1)) for m in _PROMPT_TOKEN.finditer(stderr, count.end())][:n]
    if len(ids) != n:
        raise EngineOutputError(f"{binary}: --verbose-prompt listed {len(ids)} token ids for a "
                                f"prompt of {n} tokens", field="prompt tokens", expected=n,
                                found=len(ids))
    return tuple(ids)


def run_target(bins: Binaries, target_gguf: Path, prompt_text: str, *, max_new_tokens: int,
               threads: int = 1, timeout: float = TIMEOUT_SECONDS) -> TargetRun:
    """llama-completion on the target alone, greedy."""
    with tempfile.TemporaryDirectory(prefix="dspark-llama-") as tmp:
        prompt = _prompt_file(Path(tmp), prompt_text)
        out = _run_whole(bins.completion, ["-m", str(target_gguf), "-f", str(prompt), "-n",
                                           str(max_new_tokens), "--temp", "0", "-no-cnv",
                                           "--no-display-prompt", "--verbose-prompt",
                                           "-t", str(threads), "-v", *LOG_ARGS],
                         last=_TOTAL_TIME, timeout=timeout)
    ids = parse_prompt_ids(out.stderr)
    text = out.stdout
    # What llama-completion prints after the tokens: " [end of text]\n" at an
    # end-of-generation token, then "\n\n" (tools/completion/completion.cpp).
    if not text.endswith(b"\n\n"):
        raise EngineOutputError(f"{COMPLETION}: its output does not end with the blank line it "
                                "prints after the generated text", field="stdout",
                                expected="text + '\\n\\n'", found=shown(text[-40:]))
    text = text[:-2]
    ended = text.endswith(b" [end of text]\n")
    if ended:
        text = text[: -len(b" [end of text]\n")]
    m = _need(_EVAL_TIME.search(out.stderr), "'eval time' line", COMPLETION)
    return TargetRun(prompt_ids=ids, text=text, ended=ended, seconds=out.seconds,
                     decode_tokens=int(m.group(2)), decode_seconds=float(m.group(1)) / 1000.0)


# --- speculative runs -----------------------------------------------------------------------

@dataclass(frozen=True)
class Draft:
    """One draft llama.cpp made and its verification."""

    call: int                          # 1, 2, ... in the order llama.cpp drafted
    context: tuple[int, ...]           # the committed tokens before the anchor
    anchor: int                        # the last committed token, not yet in the context
    tokens: tuple[int, ...]            # what llama.cpp proposed after the anchor
    accepted: int
    next_token: int                    # the target's token after the accepted drafts


@dataclass(frozen=True)
class Stats:
    """llama.cpp's own statistics line (common_speculative_print_stats)."""

    line: str                          # as printed, without the timings
    mean_acceptance_length: float | None
    acceptance_rate_by_position: tuple[float, ...]


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


def parse_speculative(stderr: bytes, prompt_ids: tuple[int, ...], *, spec_type: str,
                      binary: str = SPECULATIVE) -> tuple[tuple[Draft, ...], Stats]:
    """The drafts of a ``-v`` run of llama-speculative-simple, rebuilt with their context
    from ``prompt_ids`` (llama.cpp's own tokenization of the prompt)."""
    if len(prompt_ids) < 2:
        raise EngineOutputError(f"{binary}: a prompt of {len(prompt_ids)} token(s); llama.cpp's "
                                "speculative loop needs at least 2 (its first anchor is the last "
                                "prompt token)", field="prompt", expected=">= 2 tokens",
                                found=len(prompt_ids))
    if _PARTIAL.search(stderr):
        raise EngineOutputError(f"{binary}: it restored a checkpoint after a partial acceptance "
                                "(a target without partial sequence removal); the eval reads only "
                                "the plain loop", field="partial acceptance")
    events = sorted([(m.start(), "cand", m) for m in _CANDIDATE.finditer(stderr)]
                    + [(m.start(), "called", m) for m in _CALLED.finditer(stderr)]
                    + [(m.start(), "accepted", m) for m in _ACCEPTED.finditer(stderr)],
                    key=lambda e: e[0])
    context, anchor = list(prompt_ids[:-1]), prompt_ids[-1]
    drafts: list[Draft] = []
    rows: dict[int, int] = {}          # pos -> candidate 0 of the draft being read
    called = None
    for _, kind, m in events:
        if kind == "cand":
            if int(m.group(2)) == 0 and int(m.group(1)) == 0:
                rows.setdefault(int(m.group(3)), int(m.group(4)))
        elif kind == "called":
            if m.group(1).decode() != spec_type:
                raise EngineOutputError(f"{binary}: drafted with {m.group(1).decode()}, not "
                                        f"{spec_type}", field="spec type", expected=spec_type,
                                        found=m.group(1).decode())
            called = (int(m.group(2)), int(m.group(4)))
        else:
            accepted, n_draft, nxt = (int(m.group(i)) for i in (1, 2, 3))
            call = len(drafts) + 1
            tokens: tuple[int, ...] = ()
            if called is not None:
                hist, gen = called
                if hist != len(context):
                    raise EngineOutputError(
                        f"{binary}: draft {call} was made from {hist} committed tokens; the "
                        f"tokens read so far make {len(context)}", field=f"draft {call}",
                        expected=len(context), found=hist)
                # Both layouts print the draft's own positions 0..G-1 (draft-dflash prints
                # row i as position i-1: common/speculative.cpp).
                if any(p not in rows for p in range(gen)):
                    raise EngineOutputError(f"{binary}: draft {call} holds {gen} tokens but its "
                                            f"log names positions {sorted(rows)}",
                                            field=f"draft {call}", expected=gen, found=len(rows))
                tokens = tuple(rows[p] for p in range(gen))
            if n_draft != len(tokens) or accepted > len(tokens):
                raise EngineOutputError(f"{binary}: cycle {call} verified {n_draft} draft tokens "
                                        f"(accepted {accepted}); its draft read has {len(tokens)}",
                                        field=f"draft {call}", expected=len(tokens), found=n_draft)
            drafts.append(Draft(call=call, context=tuple(context), anchor=anchor, tokens=tokens,
                                accepted=accepted, next_token=nxt))
            context += [anchor, *tokens[:accepted]]
            anchor = nxt
            rows, called = {}, None
    if not drafts:
        raise EngineOutputError(f"{binary}: no verification line ('accepted A/G draft tokens'); "
                                "expected one a cycle (was it run with -v?)", field="cycles",
                                expected="at least one", found=0)
    stats_m = _need(_STATS.search(stderr), "statistics line", binary)
    body = stats_m.group(2).decode("utf-8", "replace")
    mean = re.search(r"#mean acc len = ([0-9.]+)", body)
    rate = re.search(r"#acc rate/pos = \(([^)]*)\)", body)
    rates = tuple(float(x) for x in rate.group(1).split(",") if x.strip()) if rate else ()
    stats = Stats(line=f"{stats_m.group(1).decode()}: {body}",
                  mean_acceptance_length=float(mean.group(1)) if mean else None,
                  acceptance_rate_by_position=rates)
    return tuple(drafts), stats


def run_speculative(bins: Binaries, target_gguf: Path, draft_gguf: Path, *, kind: str,
                    prompt_text: str, prompt_ids: tuple[int, ...], max_new_tokens: int,
                    n_max: int, threads: int = 1,
                    timeout: float = TIMEOUT_SECONDS) -> SpeculativeRun:
    """llama-speculative-simple at temperature 0, the confidence cut off (p-min 0), drafts of
    up to ``n_max`` tokens; ``kind`` "dspark" or "dflash" (the --spec-type)."""
    spec_type = SPEC_TYPES[kind]
    with tempfile.TemporaryDirectory(prefix="dspark-llama-") as tmp:
        prompt = _prompt_file(Path(tmp), prompt_text)
        out = _run_whole(bins.speculative, ["-m", str(target_gguf), "-md", str(draft_gguf),
                                            "--spec-type", spec_type, "--spec-draft-n-max",
                                            str(n_max), "--spec-draft-p-min", "0", "--temp", "0",
                                            "-f", str(prompt), "-n", str(max_new_tokens), "-t",
                                            str(threads), "-v", *LOG_ARGS],
                         last=_TOTAL_TIME, timeout=timeout)
    drafts, stats = parse_speculative(out.stderr, prompt_ids, spec_type=spec_type)
    output: list[int] = []
    for d in drafts:
        output += [*d.tokens[:d.accepted], d.next_token]
    m = _need(_DECODED.search(out.stderr), "'decoded N tokens' line", SPECULATIVE)
    return SpeculativeRun(spec_type=spec_type, drafts=drafts, output_ids=tuple(output),
                          text=out.stdout, stats=stats, seconds=out.seconds,
                          decode_tokens=int(m.group(1)), decode_seconds=float(m.group(2)))


def text_of_prompt_ids(vocab: Vocabulary, ids) -> str | None:
    """The text whose llama.cpp tokenization may give back ``ids`` (checked by the caller),
    or None when the ids spell bytes that are not UTF-8 (a prompt is passed as text)."""
    try:
        return vocab.text(ids, special=True).decode("utf-8")
    except UnicodeDecodeError:
        return None
