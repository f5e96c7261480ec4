"""JSON as a release gate reads it: duplicate keys and NaN/Infinity refused.

Python's ``json.loads`` silently keeps the last of two duplicate keys and accepts the
non-standard constants NaN, Infinity and -Infinity; a config or header that relies on
either is ambiguous, so every JSON file we read goes through ``loads_strict``.
"""

from __future__ import annotations

import json


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


def loads_strict(text: str) -> object:
    """json.loads with duplicate keys and NaN/Infinity refused.

    Raises DuplicateKeyError, ValueError (bad JSON, or an integer too long to convert) or
    RecursionError (absurd nesting); callers turn these into one-line errors.
    """
    return json.loads(text, object_pairs_hook=_no_duplicates_hook,
                      parse_constant=_refuse_constant)


def json_error_text(exc: BaseException) -> str:
    """One line describing why loads_strict refused a text."""
    if isinstance(exc, RecursionError):
        return "nesting too deep"
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} (line {exc.lineno} column {exc.colno})"
    return " ".join(str(exc).split())
