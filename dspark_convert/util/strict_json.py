"""JSON as a release gate reads it: duplicate keys, NaN/Infinity and overflowing numbers
refused.

Python's ``json.loads`` silently keeps the last of two duplicate keys and accepts the
non-standard constants NaN, Infinity and -Infinity; a config or header that relies on
either is ambiguous, so every JSON file we read goes through ``loads_strict``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from dspark_convert.util.paths import open_regular
from dspark_convert.util.text import parse_int


class DuplicateKeyError(ValueError):
    def __init__(self, key: str):
        super().__init__(f"duplicate key {key!r}")
        self.key = key


def _no_duplicates_hook(pairs: list[tuple[str, object]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKeyError(key)
        out[key] = value
    return out


def _refuse_constant(name: str) -> object:
    raise ValueError(f"non-standard JSON constant {name}")


def _finite_float(text: str) -> float:
    """A JSON number as its double; one too large for a double (``1e999``) is refused: it
    would be read as infinity, the value the NaN/Infinity refusal keeps out (a gate
    baseline's tau of 1e999 was once compared as inf)."""
    value = float(text)
    if value in (float("inf"), float("-inf")):
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise ValueError(f"the number {shown} is too large for a double")
    return value


def loads_strict(text: str) -> object:
    """json.loads with duplicate keys, NaN/Infinity and numbers that overflow a double
    refused.

    Raises DuplicateKeyError, ValueError (bad JSON, or an integer too long to convert) or
    RecursionError (absurd nesting); callers turn these into one-line errors.
    """
    return json.loads(text, object_pairs_hook=_no_duplicates_hook,
                      parse_constant=_refuse_constant, parse_float=_finite_float,
                      # Python's refusal of a long integer advises set_int_max_str_digits;
                      # ours says what the number was.
                      parse_int=parse_int)


def json_error_text(exc: BaseException) -> str:
    """One line describing why loads_strict refused a text."""
    if isinstance(exc, RecursionError):
        return "nesting too deep"
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} (line {exc.lineno} column {exc.colno})"
    return " ".join(str(exc).split())


# A config nests two or three levels (rope_parameters, quantization_config); the cap is far
# above any real file and far below what the manifest writer (pydantic) can serialize.
MAX_VERBATIM_DEPTH = 64


class NotVerbatimError(ValueError):
    """A parsed JSON value that cannot be written back as the same JSON: ``where`` is its
    path (``a.b[2]``), ``why`` what is wrong with it."""

    def __init__(self, where: str, why: str):
        if len(where) > 80:       # a path hundreds of levels deep: its start says enough
            where = where[:77] + "..."
        super().__init__(f"{where}: {why}")
        self.where, self.why = where, why


def check_verbatim(value: object, where: str = "", depth: int = 0) -> None:
    """Refuse what JSON parses but cannot be written back unchanged: a number too large
    for a double (``1e400`` parses to infinity, which JSON cannot hold and pydantic writes
    as null), a string or key that is not Unicode text (a lone ``\\ud800`` escape), or
    nesting deeper than MAX_VERBATIM_DEPTH. Everything else is kept exactly: objects in
    their key order, arrays, strings, integers of any size, finite floats (as the double
    they parse to), booleans and null."""
    if depth > MAX_VERBATIM_DEPTH:
        raise NotVerbatimError(where or "<root>",
                               f"nested more than {MAX_VERBATIM_DEPTH} levels deep")
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise NotVerbatimError(where or "<root>", "a number too large for a double "
                                   "(it would be recorded as null)")
    elif isinstance(value, str):
        _check_text(value, where)
    elif isinstance(value, dict):
        for key, item in value.items():
            inner = f"{where}.{key}" if where else str(key)
            _check_text(key, inner)
            check_verbatim(item, inner, depth + 1)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_verbatim(item, f"{where}[{i}]", depth + 1)


def _check_text(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise NotVerbatimError(where.encode("utf-8", "backslashreplace").decode() or "<root>",
                               "a string that is not Unicode text (a lone UTF-16 surrogate "
                               "escape)") from None


MAX_CONFIG_BYTES = 4 * 1024 * 1024


def read_json_strict(path: Path, *, error, label: str | None = None) -> object:
    """A small JSON file (a config, a manifest, a lock, a trace) read with duplicate keys and
    NaN refused and at most MAX_CONFIG_BYTES read: ``error`` (a DSparkError class) names
    the file (``label``, else its name) in every refusal."""
    label = label or path.name
    return parse_json_strict(read_capped(path, error=error, label=label), error=error,
                             label=label, path=str(path))


def read_capped(path: Path, *, error, label: str) -> bytes:
    """At most MAX_CONFIG_BYTES + 1 bytes of ``path`` (``parse_json_strict`` refuses the
    one more): for a small file that is parsed and also hashed, read once. A FIFO or
    other special file is refused, not waited on (paths.open_regular)."""
    try:
        with open_regular(path, label=label, error=error) as fh:
            return fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise error(f"{label}: cannot read: {os.strerror(exc.errno or 0) or exc}",
                    path=str(path)) from None


def parse_json_strict(data: bytes, *, error, label: str, path: str) -> object:
    """``read_json_strict`` for bytes already read (a file that is also hashed)."""
    if len(data) > MAX_CONFIG_BYTES:
        raise error(f"{label}: file is over {MAX_CONFIG_BYTES} bytes; expected at most "
                    f"{MAX_CONFIG_BYTES}", path=path, expected=MAX_CONFIG_BYTES,
                    found=f"> {MAX_CONFIG_BYTES}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{label}: not UTF-8 text (byte {exc.start})", path=path) from None
    try:
        return loads_strict(text)
    except (ValueError, RecursionError) as exc:
        raise error(f"{label}: not valid JSON: {json_error_text(exc)}", path=path) from None
