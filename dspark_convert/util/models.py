"""One way to turn a pydantic ValidationError into the one-line refusal every reader gives.

Configs, manifests, lock files, calibrations and prompt lines are all read by strict
pydantic models; the first problem pydantic finds becomes ``FieldProblem`` (the field's
dotted path, what was expected in words, what was found, short), and the reader raises its
own error class with ``problem.message`` (``validated`` does both for a whole document).
"""

from __future__ import annotations

from collections.abc import Collection

from dataclasses import dataclass
from typing import Annotated, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ValidationError

M = TypeVar("M", bound=BaseModel)


def exact_versions(*versions: int):
    """A format-version field that takes only the integers ``versions``: JSON's true and 1.0
    equal 1 in Python, and a Literal field took them even in strict mode, where an int field
    refuses both; the schema says const (or enum) of them."""
    words = " or ".join(str(v) for v in versions)

    def an_int(value: object) -> object:
        if type(value) is not int:
            raise ValueError(f"the integer {words}")
        return value

    return Annotated[Literal[versions], BeforeValidator(an_int)]


#: A document's format version: the integer 1 (not true, not 1.0); the schema says const 1.
VersionOne = exact_versions(1)

# pydantic error type -> what was expected, in words (for the types a JSON file holds).
_EXPECTED_BY_TYPE = {
    "int_type": "an integer", "int_parsing": "an integer", "float_type": "a number",
    "bool_type": "true or false", "string_type": "a string", "list_type": "a list",
    "dict_type": "an object", "model_type": "an object", "model_attributes_type": "an object",
    "extra_forbidden": "no such field",   # ("missing" is worded by FieldProblem itself)
}
_MAX_QUOTE = 60


def describe_value(value: object) -> str:
    """A value from a file, short and on one line, with its Python type: ``'32' (str)``
    (repr escapes control characters and quotes strings, so "32" and 32 read apart)."""
    text = repr(value)
    if len(text) > _MAX_QUOTE:
        text = text[:_MAX_QUOTE - 3] + "..."
    return f"{text} ({type(value).__name__})"


@dataclass(frozen=True)
class FieldProblem:
    field: str          # dotted path into the document; "<root>" for the document itself
    expected: str
    found: str          # "nothing" when the field is missing
    missing: bool

    @property
    def message(self) -> str:
        if self.missing:
            return f"required field '{self.field}' is missing"
        return f"field '{self.field}': expected {self.expected}, found {self.found}"


def first_problem(exc: ValidationError, tags: Collection[str] = ()) -> FieldProblem:
    """The first problem of a ValidationError. ``tags``: the tags of the model's tagged
    unions (a manifest's contract family), which pydantic puts in the location but are no
    field: left out of the field's name."""
    err = exc.errors()[0]
    loc = tuple(str(p) for p in err.get("loc", ()) if str(p) not in tags)
    field = ".".join(loc) or "<root>"
    kind = err.get("type", "")
    if kind == "missing":
        return FieldProblem(field, "a value", "nothing", True)
    expected = _EXPECTED_BY_TYPE.get(kind)
    if expected is None:
        expected = str(err.get("msg", "a valid value")).removeprefix("Input should be ") \
            .removeprefix("Value error, ")
    found = "present" if kind == "extra_forbidden" else describe_value(err.get("input"))
    return FieldProblem(field, expected, found, False)


def validated(model: type[M], raw: object, *, error, label: str, path: str,
              hint: str = "", tags: Collection[str] = ()) -> M:
    """``model.model_validate(raw)``; its first problem raised as one ``error`` line
    (``error`` a DSparkError class): "{label}: {problem}{hint}", with the field, what was
    expected and what was found as the error's context."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        problem = first_problem(exc, tags)
        raise error(f"{label}: {problem.message}{hint}", path=path, field=problem.field,
                    expected=problem.expected, found=problem.found) from None
