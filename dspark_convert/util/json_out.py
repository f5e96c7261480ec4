"""The package's one JSON writer: every JSON document the tool prints or writes (``--json``
reports and errors, ``smoke --trace``, eval's report.json and calibration files) goes
through ``dumps``, which cannot emit NaN or Infinity.

``json.dumps`` writes a float NaN as the bare word ``NaN`` and infinity as ``Infinity``,
which no JSON parser must accept (our own readers, util/strict_json.py, refuse them: the
tool then refused its own trace). A value that is undefined (tau when no verify step ran,
a rate over nothing) is ``None`` where it is computed, and its schema field says it may be
null: ``undefined`` is that mapping, made on purpose where such a value is born. What
reaches ``dumps`` still non-finite is a bug, refused with NotJSONError naming where it is
(``runs[0].tau``), before anything is written.
"""

from __future__ import annotations

import json
import math


class NotJSONError(ValueError):
    """A value JSON cannot hold: ``where`` is its path in the document."""

    def __init__(self, where: str, why: str):
        super().__init__(f"{where or '<root>'}: {why}")
        self.where, self.why = where or "<root>", why


def undefined(value: float | None) -> float | None:
    """``value``, or None where it is undefined (NaN: 0/0, a mean of nothing) or not a
    finite number: for the fields whose schema says null means undefined."""
    if value is None or not math.isfinite(value):
        return None
    return float(value)


def _plain(value: object, where: str) -> object:
    """``value`` as JSON's types: a pydantic model dumped (its JSON mode: paths, enums),
    tuples as lists; refused where a float is not finite or a key is not a string."""
    if hasattr(value, "model_dump"):
        value = value.model_dump(mode="json")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise NotJSONError(where, f"{value} is not a JSON number; an undefined value is "
                               "written as null, and only where its schema allows null")
        return value
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise NotJSONError(where, f"key {key!r} is not a string")
            out[key] = _plain(item, f"{where}.{key}" if where else key)
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if value is None or isinstance(value, (str, int, bool)):
        return value
    raise NotJSONError(where, f"a {type(value).__name__} is not a JSON value")


def dumps(value: object, *, indent: int | None = None, compact: bool = False) -> str:
    """``value`` (plain data or pydantic models) as JSON text: ``indent`` for people,
    ``compact`` for large files (no spaces). NotJSONError where a value is not JSON."""
    separators = (",", ":") if compact else None
    return json.dumps(_plain(value, ""), indent=indent, separators=separators, allow_nan=False)


def dumps_model(model, *, indent: int | None = None) -> str:
    """A pydantic model as pydantic writes it (the bytes of files whose hashes are recorded,
    manifest.json, a lock, calibration.json, stay what they were), after the same check
    ``dumps`` makes: pydantic alone would write NaN as null, silently."""
    _plain(model, "")
    return model.model_dump_json(indent=indent)
