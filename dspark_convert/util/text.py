"""Untrusted text (file, tensor and key names, paths, values from inputs) made safe to show.

A name read from a file or a directory listing can hold terminal escape sequences (an
error line that erases itself), other control or format characters (bidi overrides), or
bytes that are not UTF-8 (kept by Python as surrogate escapes, which a UTF-8 terminal,
a JSON writer or a GGUF string cannot carry). ``shown`` escapes exactly those, and leaves
every printable character (accents, CJK, emoji) as it is. It is applied where such text
leaves the program: the CLI's output and error lines, and names recorded in an artifact
(general.name, manifest.json).
"""

from __future__ import annotations

import unicodedata

# Unicode categories that do not print: controls (Cc), format characters such as bidi
# overrides (Cf), line/paragraph separators (Zl, Zp), surrogates (Cs), private use (Co)
# and unassigned code points (Cn).
_HIDDEN = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})


def _escape(ch: str) -> str:
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:          # a byte that was not UTF-8 (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def shown(text: object) -> str:
    """``text`` with every non-printing character escaped (``\\x1b``, ``\\u202e``,
    ``\\xff`` for a byte that was not UTF-8); printable text unchanged. Plain ASCII text
    (the common case) is returned as it is without a per-character walk."""
    text = str(text)
    if text.isascii() and text.isprintable():
        return text
    return "".join(_escape(ch) if (ch != " " and unicodedata.category(ch) in _HIDDEN)
                   or (ch.isspace() and ch != " ") else ch for ch in text)


def shown_int(value: int) -> str:
    """An integer from an input, for a message: a huge one by its size (str() of a
    5,000-digit int raises)."""
    return str(value) if value.bit_length() <= 128 else f"an integer of {value.bit_length()} bits"


# The most digits an integer written by a user may have (a command-line option, a number in
# a JSON file). Python itself refuses more than 4300 (sys.get_int_max_str_digits), with
# advice about set_int_max_str_digits that names no option or field; no count, id, size or
# seed the tool reads needs more than 20 digits, so the bound is far above any real value
# and a refusal says what it was.
MAX_INT_DIGITS = 4300


def parse_int(text: str) -> int:
    """A decimal integer written by a user: ``int(text)``, or ValueError with a one-line
    message that a refusal can quote: "an integer of 5000 digits; expected at most 4300",
    or "expected an integer, found '1.5'"."""
    stripped = text.strip()
    digits = len(stripped.lstrip("+-"))
    if digits > MAX_INT_DIGITS and stripped.lstrip("+-").isdigit():
        raise ValueError(f"an integer of {digits} digits; expected at most {MAX_INT_DIGITS}")
    try:
        return int(stripped)
    except ValueError:
        quoted = stripped if len(stripped) <= 40 else stripped[:37] + "..."
        raise ValueError(f"expected an integer, found {shown(quoted)!r}") from None
