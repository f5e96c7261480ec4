"""An engine's log, read as hostile input: bounded, line by line, the free text
the reader knows consumed by its length; the state machine that tells each line of the
engine's own by its prefix and its kind, and refuses one out of place.

The machinery only: which lines an engine writes, and in which order, is the engine's
module's (evaluation/engine_llama_cpp.py, llama.cpp 0c1e570's two binaries). Everything it
refuses is an EngineOutputError (113) naming the binary, the line and what was expected.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Sized
from dataclasses import dataclass

from dspark_convert.errors import EngineOutputError
from dspark_convert.util.text import shown

# One line llama.cpp writes of its own: under 400 bytes measured (system_info, the statistics
# line with a draft of 16); a model's metadata printed while it loads is cut at 40 bytes a
# value, a token's text is not (its name, its EOS token): 1 MiB is far above any of it. Free
# text the eval knows (the prompt, a token's piece) is read by its length, not as a line.
LINE_LIMIT = 1 << 20
TAIL = 20                                # lines kept for a message
CHUNK = 1 << 16                          # bytes read from a pipe at a time


def printed(text: bytes) -> bytes:
    """What printf's %s writes of ``text``: up to its first NUL byte."""
    return text.split(b"\0", 1)[0]


def seen(line: bytes, width: int = 160) -> str:
    """A line for a message: at most ``width`` characters, escaped."""
    text = shown(line[:4 * width].decode("utf-8", "replace"))
    return text if len(text) <= width and len(line) <= 4 * width else text[:width] + "…"


class Log:
    """A process's stderr, read as it comes (``read(n)``: os.read on the pipe, or a
    BytesIO's read for a log given whole): lines of at most LINE_LIMIT bytes, spans of
    known bytes, the whole at most ``limit`` bytes; the last TAIL lines kept for messages;
    ``watched``: whether a line of the engine's own matched ``watch`` (a crash's cause)."""

    def __init__(self, read: Callable[[int], bytes], *, binary: str, limit: int,
                 watch: re.Pattern | None = None) -> None:
        self._read, self.binary, self.limit = read, binary, limit
        self._watch = watch
        self._buf = bytearray()
        self._scanned = 0                 # bytes of _buf known to hold no newline
        self._eof = False
        self.total = 0                    # bytes read
        self.lines = 0                    # lines consumed
        self.tail: deque[str] = deque(maxlen=TAIL)
        self.watched = False              # a line of the engine's own matched ``watch``

    def _fill(self) -> bool:
        if self._eof:
            return False
        chunk = self._read(CHUNK)
        if not chunk:
            self._eof = True
            return False
        self.total += len(chunk)
        if self.total > self.limit:
            raise EngineOutputError(f"{self.binary}: its log exceeds {self.limit:,} bytes (the "
                                    "most a run of this prompt and -n writes; "
                                    "evaluation/engine_llama_cpp.py log_limit); refused "
                                    "rather than read on", path=self.binary, field="log",
                                    expected=f"at most {self.limit} bytes",
                                    found=f"more than {self.limit} bytes")
        self._buf += chunk
        return True

    def peek(self) -> tuple[bytes, bool] | None:
        """The next line without its newline and whether it is whole (False: its first
        LINE_LIMIT bytes, no newline among them, or a last line without one); None at the
        end. Nothing is consumed."""
        while True:
            nl = self._buf.find(b"\n", self._scanned)
            if 0 <= nl <= LINE_LIMIT:
                return bytes(self._buf[:nl]), True
            if nl > LINE_LIMIT or len(self._buf) > LINE_LIMIT:
                return bytes(self._buf[:LINE_LIMIT]), False
            self._scanned = len(self._buf)
            if not self._fill():
                return (bytes(self._buf), False) if self._buf else None

    def _consumed(self, n: int, shown_line: bytes) -> None:
        del self._buf[:n]
        self._scanned = 0
        self.lines += 1
        self.tail.append(seen(shown_line))

    def skip(self) -> None:
        """Consume the line peek() returned (and its newline)."""
        line, whole = self.peek()
        if not whole and len(line) >= LINE_LIMIT:
            raise EngineOutputError(f"{self.binary}: line {self.lines + 1} of its log is longer "
                                    f"than {LINE_LIMIT:,} bytes ({seen(line[:80])}); expected "
                                    "llama.cpp's own lines, each far shorter", path=self.binary,
                                    field=f"log line {self.lines + 1}",
                                    expected=f"at most {LINE_LIMIT} bytes",
                                    found=f"more than {LINE_LIMIT} bytes")
        self._consumed(len(line) + whole, line)
        # Only a line of the engine's own (never known free text, read by expect: a prompt
        # that quotes the watched line is not the engine saying it).
        if self._watch is not None and self._watch.search(line):
            self.watched = True

    def expect(self, data: bytes) -> int | None:
        """Consume exactly ``data`` when the log holds it next (one entry whose free text is
        known: it may hold newlines); else consume nothing and return the offset of the
        first byte that differs (or len(data) where the log ends first)."""
        i = 0
        while i < len(data):
            while len(self._buf) <= i and self._fill():
                pass
            if len(self._buf) <= i:
                return i
            n = min(len(self._buf), len(data)) - i
            if self._buf[i:i + n] != data[i:i + n]:
                return i + next(k for k in range(n) if self._buf[i + k] != data[i + k])
            i += n
            if i < len(data) and len(self._buf) > 2 * LINE_LIMIT:
                # A long known span: what matched is let go of as it is read.
                drop = i - 1
                del self._buf[:drop]
                data, i = data[drop:], i - drop
        self._consumed(len(data), data.rstrip(b"\n"))
        return None


# One entry's prefix: M.SS.mmm.uuu (minutes, seconds, ms, us since start) and a level.
PREFIX = re.compile(rb"(\d{1,7})\.(\d\d)\.(\d\d\d)\.(\d\d\d) ([IWED]) ")

# Numbers as llama.cpp prints them, with a bounded count of digits: a count with thousands
# of digits is a malformed line, never an int() of it.
N = rb"(\d{1,10})"                                  # %d, %zu
ID = rb"(-?\d{1,10})"                               # a token id (range-checked)
F3 = rb"(\d{1,12}\.\d{3})"                          # %.3f of a non-negative time
RATE = rb"(\d{1,15}\.\d{3}|inf|-?nan)"              # %.3f of a rate (x / 0 is inf)
P = rb"(\d\.\d{3})"                                 # %.3f of a probability or a rate
F2 = rb"(\d{1,12}\.\d\d)"                          # %.2f of a non-negative time
RATE2 = rb"(\d{1,15}\.\d\d|inf|-?nan)"              # %.2f of a rate


@dataclass(frozen=True)
class Kind:
    """One line of llama.cpp's the parser reads: ``head`` names it (matched at the start of
    the message), ``form`` is its whole form (a line whose head matches and whose form does
    not is malformed, never skipped); ``text``: the form stops where free text the parser
    knows begins (consumed by length)."""

    name: str
    head: re.Pattern
    form: re.Pattern
    text: bool = False


def line_kind(name: str, head: bytes, form: bytes, text: bool = False) -> Kind:
    return Kind(name, re.compile(head), re.compile(form), text)


@dataclass(frozen=True)
class Cut:
    """A log that ended before llama.cpp's closing line, with nothing wrong in what came:
    how much came and its last line (None: no line of llama.cpp's)."""

    entries: int                       # llama.cpp's own entries read
    total: int                         # bytes
    last: str | None


class Reader:
    """The line-by-line state machine both logs share: each entry is told by its prefix,
    each line the parser reads by its kind's head; a kind read outside its phase, or a
    singular one twice, is refused (see the module docstring)."""

    def __init__(self, log: Log, binary: str, vocab: Sized) -> None:
        self.log, self.binary, self.vocab = log, binary, vocab
        self.entries = 0
        self.last: bytes | None = None
        self.seen: set[str] = set()

    def fail(self, what: str, expected: str, line: bytes | None = None,
             field: str | None = None) -> EngineOutputError:
        where = f"line {self.log.lines + 1} of its log" if line is not None else "its log"
        quoted = f" ({seen(line)})" if line is not None else ""
        return EngineOutputError(f"{self.binary}: {where}, {what}{quoted}; expected {expected}",
                                 path=self.binary, field=field or what, expected=expected,
                                 found=seen(line) if line is not None else None)

    def next(self, kinds: tuple[Kind, ...], *, elsewhere: tuple[Kind, ...]):
        """The next line of one of ``kinds`` as (kind, match, line), skipping lines of no
        kind the parser reads; a line of a kind in ``elsewhere`` (read at another point of
        the log) is refused. None at the end of the log."""
        while True:
            peeked = self.log.peek()
            if peeked is None:
                return None
            line, whole = peeked
            prefix = PREFIX.match(line)
            if prefix is None:                       # a continuation, or not llama.cpp's
                self.log.skip()
                continue
            self.entries += 1
            message = line[prefix.end():]
            for kind in (*kinds, *elsewhere):
                if not kind.head.match(message):
                    continue
                if kind not in kinds:
                    article = "an" if kind.name[0] in "aeiou" else "a"
                    raise self.fail(f"{article} {kind.name} line where none belongs", "each of "
                                    "llama.cpp's lines in its place, the singular ones once "
                                    "(free text printed while a model loads may look like one)",
                                    line, kind.name)
                m = (kind.form.match if kind.text else kind.form.fullmatch)(message)
                if m is None or (not whole and not kind.text):
                    raise self.fail(f"a malformed {kind.name} line",
                                    f"llama.cpp 0c1e570's {kind.name} line", line, kind.name)
                if not kind.text:
                    self.last = line
                    self.log.skip()
                return kind, m, prefix.end() + m.end(), line
            self.last = line
            self.log.skip()

    def once(self, kind: Kind, line: bytes) -> None:
        if kind.name in self.seen:
            raise self.fail(f"a second {kind.name} line", f"one {kind.name} line a run", line,
                            kind.name)
        self.seen.add(kind.name)

    def known(self, line: bytes, start: int, text: bytes, what: str) -> None:
        """Consume the entry whose text from ``start`` is ``text`` + "'\\n" exactly."""
        entry = line[:start] + printed(text) + b"'\n"
        at = self.log.expect(entry)
        if at is not None:
            raise self.fail(f"{what} differs from what the eval knows at byte {at - start}",
                            f"{seen(printed(text), 80)!s} quoted, byte for byte", line, what)
        self.last = entry.rstrip(b"\n")

    def token(self, value: bytes, line: bytes, what: str) -> int:
        n = int(value)
        if not 0 <= n < len(self.vocab):
            raise self.fail(f"{what} {n} is outside the vocabulary",
                            f"a token id in [0, {len(self.vocab)})", line, what)
        return n

    def cut(self) -> Cut:
        return Cut(self.entries, self.log.total,
                   seen(self.last) if self.last is not None else None)


def count(value: bytes, limit: int, what: str, reader: Reader, line: bytes) -> int:
    n = int(value)
    if n > limit:
        raise reader.fail(f"{what} {n} is over {limit:,}", f"at most {limit}", line, what)
    return n


