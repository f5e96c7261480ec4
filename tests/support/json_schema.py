"""A document against a generated JSON Schema (schemas/), for the keywords tools/schemas.py
writes ($ref into $defs, anyOf, type, const, enum, properties, required,
additionalProperties, items): the environment holds no JSON Schema library, and the tests
check that what a command writes is what its published schema says."""

from __future__ import annotations

_KINDS = {"object": dict, "array": list, "string": str, "number": (int, float), "integer": int,
          "boolean": bool, "null": type(None)}


def schema_problems(value, schema, root=None, where="$") -> list[str]:
    """What of ``value`` the JSON Schema ``schema`` refuses (empty when it accepts it);
    ``root``: the document ``$ref``s point into (``schema`` itself when not given)."""
    root = schema if root is None else root
    if "$ref" in schema:
        schema = root["$defs"][schema["$ref"].rsplit("/", 1)[1]]
    if "anyOf" in schema:
        if all(schema_problems(value, s, root, where) for s in schema["anyOf"]):
            return [f"{where}: none of anyOf matches {value!r:.60}"]
    kind = schema.get("type")
    if kind is not None and (not isinstance(value, _KINDS[kind])
                             or (isinstance(value, bool) and kind != "boolean")):
        return [f"{where}: expected {kind}, found {type(value).__name__}"]
    if "const" in schema and value != schema["const"]:
        return [f"{where}: expected {schema['const']!r}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{where}: expected one of {schema['enum']}"]
    problems = []
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        problems += [f"{where}: {k} missing" for k in schema.get("required", ()) if k not in value]
        for key, item in value.items():
            if key in properties:
                problems += schema_problems(item, properties[key], root, f"{where}.{key}")
            elif schema.get("additionalProperties") is False:
                problems.append(f"{where}: {key} not allowed")
            elif isinstance(schema.get("additionalProperties"), dict):
                problems += schema_problems(item, schema["additionalProperties"], root,
                                            f"{where}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            problems += schema_problems(item, schema["items"], root, f"{where}[{i}]")
    return problems
