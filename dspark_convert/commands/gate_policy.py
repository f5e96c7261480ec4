"""The release policy `dspark gate` reads (docs/GATE.md): a TOML file, read with the
standard library's ``tomllib`` (``tomli`` before Python 3.11), held to a strict pydantic
model (schemas/gate-policy.schema.json): an unknown key, a value of the wrong type, a
missing key or a duplicate drafter name is refused with one line naming the drafter (by
name and index) and the key.

Relative paths (a local source or target, a lock file, a prompt set, the llama.cpp
build, dspark-mlx's interpreter) are relative to the policy file, so a policy means the same from any directory.
A Hub source or target must be pinned to a 40-hex commit: a release gate that follows a
branch would not gate anything.

``with_hashes`` is ``--update``: the measured drafter.gguf SHA-256s written into a copy of
the policy's text, by a minimal edit of each ``[[drafter]]`` table's ``sha256 = "..."`` line
(comments and layout kept), re-read to prove the edit says what was meant.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dspark_convert.artifact.engine_names import ENGINES
from dspark_convert.errors import GatePolicyError
from dspark_convert.evaluation.options import DEVICES, DTYPES, MAX_NEW_TOKENS_LIMIT
from dspark_convert.source.hub.spec import parse_spec
from dspark_convert.util.models import first_problem
from dspark_convert.util.paths import check_input_file
from dspark_convert.util.patterns import SHA256_PATTERN, is_commit, is_repo_id
from dspark_convert.util.strict_json import MAX_CONFIG_BYTES, read_capped
from dspark_convert.util.text import MAX_INT_DIGITS, shown

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10: the same parser, from PyPI (pyproject's marker)
    import tomli as tomllib

# A drafter's name is a directory of the gate's output and a JUnit test suite.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
# The gate's own files in OUT_DIR (gate_report.GATE_JSON, GATE_MD, JUNIT_XML): a drafter
# named so would take the name first and leave the reports nowhere to go. Compared without
# case, as a case-insensitive file system (macOS, Windows) compares them.
RESERVED_NAMES = ("gate.json", "gate.md", "junit.xml")
# How deep a policy may nest ([[drafter]] > a table > a list is 3). tomllib recurses once a
# level: a few hundred brackets (about 1 KB) exhaust Python's stack, so deeper text is
# refused before it is parsed, with one line.
MAX_NESTING = 16
QuantName = Literal["q8_0", "q5_0", "q4_0"]      # `dspark quantize --type`
# What ``require`` names: the engines whose rules validate applies (`validate --require`,
# artifact/engine_names.py), and the engines the gate runs in a stage of their own, each on
# what it reads (`dspark eval --engine`: llama.cpp the file `dspark export` writes, dspark-mlx
# the checkpoint `dspark export --engine deepspec` writes). llama.cpp is both: validate leaves
# it to its stage.
RUN_ENGINES = ("llama.cpp", "dspark-mlx")
Requirement = Literal[tuple(dict.fromkeys((*ENGINES, *RUN_ENGINES)))]
DEFAULT_MAX_NEW_TOKENS = 32


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class Defaults(_Strict):
    """``[defaults]``: what every drafter runs with unless it says otherwise."""

    prompts: str | None = Field(None, min_length=1, description=(
        "a JSONL prompt set (the `dspark eval --prompts` format) that smoke and eval run "
        "on; default: the package's prompt set for the golden target"))
    max_new_tokens: int = Field(DEFAULT_MAX_NEW_TOKENS, ge=1, le=MAX_NEW_TOKENS_LIMIT,
                                description="new tokens per prompt (smoke and eval)")
    device: Literal[DEVICES] = Field("auto", description="smoke's and eval's device")
    dtype: Literal[DTYPES] = Field("float32", description="their compute dtype")
    strict: bool = Field(True, description="a validate warning fails the validate stage "
                         "(`dspark validate --strict`)")
    llama_cpp: str | None = Field(None, min_length=1, description=(
        "a llama.cpp BIN_DIR: eval runs the llama.cpp engine beside the reference runtime "
        "for each drafter that requires llama.cpp"))
    dspark_mlx: str | None = Field(None, min_length=1, description=(
        "dspark-mlx's Python interpreter (`dspark eval --engine dspark-mlx=PYTHON`) for each "
        "drafter that requires dspark-mlx; default: the one `make dspark-mlx` installs"))


class Drafter(_Strict):
    """One ``[[drafter]]``: a drafter the release ships, and what it must still do."""

    name: str = Field(pattern=NAME_PATTERN, max_length=100,
                      description="the entry's name: its directory in the output, its test suite")
    source: str = Field(min_length=1, description="org/name@<40-hex commit> on the Hub, or a "
                        "local checkpoint directory")
    lock: str | None = Field(None, min_length=1, description="a lock file from `dspark lock` "
                             "(Hub sources): every file's size and SHA-256")
    target: str = Field(min_length=1, description="org/name@<40-hex commit>, or a local "
                        "target model directory")
    sha256: str | None = Field(None, pattern=SHA256_PATTERN, description=(
        "drafter.gguf's SHA-256 in the last release; absent: measured and recorded "
        "(`--update` writes it)"))
    changed_because: str | None = Field(None, min_length=1, description=(
        "why drafter.gguf's bytes differ from `sha256` in this release: the "
        "reproducibility stage then passes, saying so"))
    require: list[Requirement] = Field(default_factory=list, description=(
        "engines that must accept the artifact and each variant (`validate --require`: "
        "strata.open, strata.run), and engines that must run it losslessly, drafting as the "
        "reference runtime does (a stage each: llama.cpp, dspark-mlx)"))
    sample_from_anchor: bool | None = Field(None, description=(
        "a speculators-format source whose config.json has no sample_from_anchor: its block "
        "layout as trained (`dspark convert --sample-from-anchor`); refused by convert for "
        "any other source"))
    quantize: list[QuantName] = Field(default_factory=list,
                                      description="variants to build and validate")
    # At least 1: every draft commits at least one token, so tau >= 1 and a floor below it
    # would pass everything while looking like a policy.
    min_tau: float | None = Field(None, ge=1, allow_inf_nan=False, description=(
        "the lowest mean acceptance length at temperature 0 on the prompts, for the "
        "artifact and each variant (at least 1: tau always is)"))
    max_tau_drop: float | None = Field(None, ge=0, allow_inf_nan=False,
                                       description="the largest drop of tau against --baseline")
    max_acceptance_drop: float | None = Field(None, ge=0, le=1, allow_inf_nan=False, description=(
        "the largest drop of the acceptance rate at any draft position against --baseline"))
    max_depth_acceptance_drop: float | None = Field(None, ge=0, le=1, allow_inf_nan=False,
                                                    description=(
        "the largest drop of the acceptance rate at any draft position within any context "
        "depth (tokens before the anchor: 0-63, 64-255, 256-1023, 1024+) against --baseline; "
        "a drop beyond it fails the regression stage naming the position and the depth"))
    target_gguf: str | None = Field(None, min_length=1, description=(
        "the target as llama.cpp runs it (its converter's GGUF): with `llama.cpp` in "
        "require and [defaults] llama_cpp, the llama.cpp stage runs the exported drafter "
        "against it"))
    prompts: str | None = Field(None, min_length=1, description="this drafter's prompt set")
    max_new_tokens: int | None = Field(None, ge=1, le=MAX_NEW_TOKENS_LIMIT,
                                       description="this drafter's new tokens per prompt")

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        if name.casefold() in RESERVED_NAMES:
            raise ValueError(f"a name other than the gate's own files ({', '.join(RESERVED_NAMES)}, "
                             "in any case)")
        return name

    @field_validator("require", "quantize")
    @classmethod
    def _once_each(cls, values: list[str]) -> list[str]:
        repeated = next((v for i, v in enumerate(values) if v in values[:i]), None)
        if repeated is not None:
            raise ValueError(f"each name once ({repeated!r} is listed twice)")
        return values


class Policy(_Strict):
    """The whole file: optional ``[defaults]``, one ``[[drafter]]`` table per drafter."""

    defaults: Defaults = Field(default_factory=Defaults)
    drafter: list[Drafter] = Field(min_length=1, description="one [[drafter]] table each")

    @model_validator(mode="after")
    def _unique_names(self) -> "Policy":
        seen: dict[str, int] = {}
        for i, entry in enumerate(self.drafter):
            # Each name is a directory of OUT_DIR: names that differ only in case are one
            # directory on a case-insensitive file system.
            key = entry.name.casefold()
            if key in seen:
                # Raised by load_policy with its own wording (a ValueError here would
                # name the whole list, not the entry).
                raise ValueError(f"duplicate:{i}:{seen[key]}")
            seen[key] = i
        return self


# --- what a loaded policy resolves to --------------------------------------------------------

@dataclass(frozen=True)
class Place:
    """A source or target: a pinned Hub spec, or a local directory."""
    text: str                    # as the policy writes it
    hub: str | None              # org/name@<commit>
    path: Path | None            # the local directory, relative paths resolved

    @property
    def spec(self) -> str:
        return self.hub if self.hub is not None else str(self.path)


@dataclass(frozen=True)
class Entry:
    """One drafter with every default applied and every path resolved."""
    index: int
    name: str
    source: Place
    lock: Path | None
    target: Place
    sha256: str | None
    changed_because: str | None
    require: tuple[str, ...]
    quantize: tuple[str, ...]
    min_tau: float | None
    max_tau_drop: float | None
    max_acceptance_drop: float | None
    prompts: Path | None         # None: the package's prompt set
    max_new_tokens: int
    device: str
    dtype: str
    strict: bool
    llama_cpp: Path | None
    target_gguf: Path | None
    sample_from_anchor: bool | None = None
    dspark_mlx: Path | None = None        # None: the interpreter `make dspark-mlx` installs
    max_depth_acceptance_drop: float | None = None


@dataclass(frozen=True)
class LoadedPolicy:
    path: Path
    text: str
    sha256: str
    model: Policy
    entries: tuple[Entry, ...]

    def entry(self, name: str) -> Entry | None:
        return next((e for e in self.entries if e.name == name), None)


def _where(raw: object, loc: tuple) -> tuple[str, str]:
    """(which table, which key) of a pydantic error location, in the policy's words."""
    parts = [str(p) for p in loc]
    if parts and parts[0] == "drafter" and len(loc) > 1 and isinstance(loc[1], int):
        i = loc[1]
        items = raw.get("drafter") if isinstance(raw, dict) else None
        name = items[i].get("name") if isinstance(items, list) and i < len(items) \
            and isinstance(items[i], dict) else None
        table = f"drafter[{i}]" + (f" {shown(name)!r}" if isinstance(name, str) else "")
        rest = loc[2:]
    elif parts and parts[0] == "defaults" and len(loc) > 1:
        table, rest = "[defaults]", loc[1:]
    else:
        table, rest = "", loc
    key = ""
    for p in rest:
        key += f"[{p}]" if isinstance(p, int) else (f".{p}" if key else str(p))
    return table, key


def _allowed(table: str) -> str:
    model = Drafter if table.startswith("drafter") else Defaults if table == "[defaults]" else Policy
    return ", ".join(model.model_fields)


def _policy_error(label: str, raw: object, exc: ValidationError) -> GatePolicyError:
    err = exc.errors()[0]
    loc = tuple(err.get("loc", ()))
    problem = first_problem(exc)
    if err.get("type") == "value_error" and str(err.get("msg", "")).startswith("Value error, duplicate:"):
        _, i, first = str(err["msg"]).removeprefix("Value error, ").split(":")
        name = raw["drafter"][int(i)]["name"]
        other = raw["drafter"][int(first)]["name"]
        # each name is a directory of OUT_DIR
        case = "" if other == name else (f" ({shown(other)!r}: one directory on a "
                                         "case-insensitive file system)")
        return GatePolicyError(f"{label}: drafter[{i}] {shown(name)!r}: key 'name': the name of "
                               f"drafter[{first}] too{case}; expected each drafter's name once",
                               path=label, field=f"drafter[{i}].name", expected="a unique name",
                               found=shown(name))
    table, key = _where(raw, loc)
    where = f"{table}: " if table else ""
    if err.get("type") == "missing":
        what = f"key {key!r} is missing" if key else "a required key is missing"
    elif err.get("type") == "extra_forbidden":
        what = f"key {key!r}: unknown key; expected one of {_allowed(table)}"
    else:
        what = f"key {key!r}: expected {problem.expected}, found {problem.found}"
        if key == "drafter":
            what += " (write each drafter as a [[drafter]] table)"
    return GatePolicyError(f"{label}: {where}{what}", path=label,
                           field=f"{table}.{key}".strip(".") or None,
                           expected=problem.expected, found=problem.found)


def read_policy_text(path: str | os.PathLike) -> tuple[Path, str, bytes]:
    """(the path, its text, its bytes), or one refusal."""
    # Not found, a directory or a FIFO: one line each (a FIFO is never waited on).
    path = check_input_file(path, label=f"policy {shown(str(path))}", error=GatePolicyError,
                            expected="a TOML file")
    data = read_capped(path, error=GatePolicyError, label=str(path))
    if len(data) > MAX_CONFIG_BYTES:
        raise GatePolicyError(f"{path}: over {MAX_CONFIG_BYTES} bytes; expected a policy file",
                              path=str(path), expected=f"<= {MAX_CONFIG_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise GatePolicyError(f"{path}: not UTF-8 (byte {exc.start}); expected a TOML file",
                              path=str(path), expected="UTF-8") from None
    return path, text, data


# TOML text as the nesting bound sees it. A key part or a value: a bare word, or one of the
# four kinds of string (a multi-line one may close with one or two more quotes); each string
# is matched to its end or, unclosed, to where it would end, never failing once opened (no
# backtracking: linear in the text). A comment, a dot, a bracket; anything else (=, a
# comma, a line's end) ends a dotted key.
_TOML_TOKEN = re.compile("|".join([
    r"(?P<comment>#[^\n]*)",
    r'(?P<part>"""(?:[^"\\]|\\[\s\S]|"(?!""))*(?:"""(?:""?)?)?'
    r"|'''(?:[^']|'(?!''))*(?:'''(?:''?)?)?"
    r'|"(?:[^"\\\n]|\\.)*"?'
    r"|'[^'\n]*'?"
    r"|[A-Za-z0-9_+-]+)",
    r"(?P<dot>\.)",
    r"(?P<open>[\[{])",
    r"(?P<close>[\]}])",
    r"(?P<space>[ \t]+)",
    r"(?P<other>[\s\S])",
]))


def _nesting(text: str) -> tuple[int, int]:
    """(how deep ``text`` nests, the offset where that depth is first reached): the
    deepest of arrays and inline tables (brackets and braces outside strings and
    comments), and the most parts of a dotted key (``a.b.c``: 3; tomllib's time grows with
    the square of a key's parts). In text that is not TOML (an unclosed string) the count
    may be off; tomllib refuses such text."""
    depth = deepest = where = 0
    parts = 1
    for m in _TOML_TOKEN.finditer(text):
        kind = m.lastgroup
        if kind == "dot":
            parts += 1
            if parts > deepest:
                deepest, where = parts, m.start()
        elif kind in ("part", "space"):
            continue
        else:
            parts = 1
            if kind == "open":
                depth += 1
                if depth > deepest:
                    deepest, where = depth, m.start()
            elif kind == "close":
                depth = max(0, depth - 1)
    return deepest, where


def parse_policy(text: str, label: str) -> Policy:
    """The text as a Policy, or one GatePolicyError naming the drafter and the key."""
    deepest, where = _nesting(text)
    if deepest > MAX_NESTING:
        line = text.count("\n", 0, where) + 1
        raise GatePolicyError(f"{label}: line {line}: nested {deepest} deep (arrays, inline "
                              f"tables or the parts of a dotted key); expected at most "
                              f"{MAX_NESTING} (a policy nests 3)", path=label,
                              expected=f"nesting <= {MAX_NESTING}", found=deepest)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise GatePolicyError(f"{label}: not TOML: {exc}", path=label,
                              expected="TOML") from None
    except ValueError as exc:
        # tomllib has no integer hook: an integer past Python's 4300 digits escapes as
        # int()'s ValueError (advising set_int_max_str_digits); named as the JSON readers
        # name it (util/text.parse_int).
        digits = re.search(r"value has (\d+) digits", str(exc))
        why = (f"an integer of {digits[1]} digits; expected at most {MAX_INT_DIGITS}" if digits
               else " ".join(str(exc).split()))
        raise GatePolicyError(f"{label}: not TOML: {why}", path=label, expected="TOML") from None
    except RecursionError:
        # _nesting's bound keeps the parser far from the stack's end; this is its backstop.
        raise GatePolicyError(f"{label}: nested too deep; expected at most {MAX_NESTING} levels",
                              path=label, expected=f"nesting <= {MAX_NESTING}") from None
    deep = _too_deep(raw)
    if deep is not None:
        raise GatePolicyError(f"{label}: key {deep!r}: nested more than {MAX_NESTING} deep "
                              f"(dotted keys or tables); expected at most {MAX_NESTING} (a policy "
                              "nests 3)", path=label, field=deep,
                              expected=f"nesting <= {MAX_NESTING}", found="deeper")
    try:
        return Policy.model_validate(raw)
    except ValidationError as exc:
        raise _policy_error(label, raw, exc) from None


def _too_deep(raw: object) -> str | None:
    """The key path (shortened) of the first value nested deeper than MAX_NESTING in
    tomllib's result, or None. Dotted keys (``a.b.c = 1``) nest without brackets, which
    _nesting cannot see; pydantic and repr would recurse through them. Walked without
    recursion."""
    stack: list[tuple[object, str, int]] = [(raw, "", 0)]
    while stack:
        value, where, depth = stack.pop()
        if depth > MAX_NESTING:
            return where if len(where) <= 60 else where[:57] + "..."
        if isinstance(value, dict):
            stack += [(v, f"{where}.{k}" if where else str(k), depth + 1) for k, v in value.items()]
        elif isinstance(value, list):
            stack += [(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    return None


def _relative(base: Path, text: str) -> Path:
    path = Path(os.path.expanduser(text))
    return path if path.is_absolute() else base / path


def _place(base: Path, text: str, label: str, entry: Drafter, i: int, key: str) -> Place:
    """``org/name@<40-hex>`` (when no such local path exists), or a local directory."""
    local = _relative(base, text)
    repo, at, revision = text.partition("@")
    if at and is_repo_id(repo) and not os.path.lexists(local):
        spec = parse_spec(text) if is_commit(revision.lower()) else None
        if spec is None:
            raise GatePolicyError(f"{label}: drafter[{i}] {shown(entry.name)!r}: key {key!r}: "
                                  f"{shown(text)!r} is not pinned; expected org/name@<40-hex "
                                  "commit> (a branch or tag would not gate a release)",
                                  path=label, field=f"drafter[{i}].{key}",
                                  expected="org/name@<40-hex commit>", found=shown(text))
        return Place(text=text, hub=str(spec), path=None)
    return Place(text=text, hub=None, path=local)


def load_policy(path: str | os.PathLike) -> LoadedPolicy:
    """Read, check and resolve a policy file; every problem one GatePolicyError."""
    path, text, data = read_policy_text(path)
    label = shown(path)
    policy = parse_policy(text, label)
    base = path.parent
    d = policy.defaults
    entries = []
    for i, e in enumerate(policy.drafter):
        source = _place(base, e.source, label, e, i, "source")
        target = _place(base, e.target, label, e, i, "target")
        if e.lock is not None and source.hub is None:
            raise GatePolicyError(f"{label}: drafter[{i}] {shown(e.name)!r}: key 'lock': a lock "
                                  "pins a Hub source; expected source = org/name@<40-hex commit> "
                                  f"(source is the local path {shown(e.source)!r})", path=label,
                                  field=f"drafter[{i}].lock", expected="a Hub source",
                                  found=shown(e.source))
        if e.changed_because is not None and e.sha256 is None:
            raise GatePolicyError(f"{label}: drafter[{i}] {shown(e.name)!r}: key "
                                  "'changed_because': says why drafter.gguf differs from "
                                  "'sha256', which is absent; expected both or neither",
                                  path=label, field=f"drafter[{i}].changed_because",
                                  expected="sha256 too", found="no sha256")
        prompts = e.prompts if e.prompts is not None else d.prompts
        entries.append(Entry(
            index=i, name=e.name, source=source,
            lock=_relative(base, e.lock) if e.lock is not None else None, target=target,
            sha256=e.sha256, changed_because=e.changed_because, require=tuple(e.require),
            quantize=tuple(e.quantize), min_tau=e.min_tau, max_tau_drop=e.max_tau_drop,
            max_acceptance_drop=e.max_acceptance_drop,
            max_depth_acceptance_drop=e.max_depth_acceptance_drop,
            prompts=_relative(base, prompts) if prompts is not None else None,
            max_new_tokens=e.max_new_tokens if e.max_new_tokens is not None else d.max_new_tokens,
            device=d.device, dtype=d.dtype, strict=d.strict,
            llama_cpp=_relative(base, d.llama_cpp) if d.llama_cpp is not None else None,
            target_gguf=_relative(base, e.target_gguf) if e.target_gguf is not None else None,
            sample_from_anchor=e.sample_from_anchor,
            dspark_mlx=_relative(base, d.dspark_mlx) if d.dspark_mlx is not None else None))
    return LoadedPolicy(path=path, text=text, sha256=hashlib.sha256(data).hexdigest(),
                        model=policy, entries=tuple(entries))


# --- --update: the measured hashes in a copy of the policy ------------------------------------

_DRAFTER_HEADER = re.compile(r"^\s*\[\[\s*drafter\s*\]\]\s*(#.*)?$")
_OTHER_HEADER = re.compile(r"^\s*\[")
_SHA_LINE = re.compile(r"^(?P<head>\s*sha256\s*=\s*)(?P<q>[\"'])[^\"']*(?P=q)(?P<tail>\s*(#.*)?)$")
_NAME_LINE = re.compile(r"^\s*name\s*=")


def updated_path(policy: Path) -> Path:
    """Where --update writes: beside the policy, ``NAME.updated.toml``."""
    return policy.with_name(f"{policy.stem}.updated{policy.suffix or '.toml'}")


def with_hashes(text: str, hashes: dict[int, str], label: str) -> str:
    """``text`` with drafter ``i``'s ``sha256`` set to ``hashes[i]``: its ``sha256 = "..."``
    line rewritten (a trailing comment kept), or one added after its ``name`` line, with
    the line ending of the text (CRLF kept). The result is parsed again and must hold
    exactly those hashes, every other value the same; a layout this edit cannot follow (an
    inline table, a multi-line value) is refused."""
    # Lines as TOML ends them (LF or CRLF): str.splitlines would also split inside a string
    # holding U+2028 or a form feed.
    lines = [line for line in re.split(r"(?<=\n)", text) if line]
    eol = _ending(lines[0], "\n") if lines else "\n"
    out: list[str] = []
    seen = index = -1                # drafter tables seen; the one we are in (-1: none)
    pending = None                   # where a missing sha256 line goes (after its name)
    done: set[int] = set()

    def close() -> None:
        if index in hashes and index not in done:
            at = pending if pending is not None else len(out)
            if at and not _ending(out[at - 1], ""):
                out[at - 1] += eol
            ending = _ending(out[at - 1], eol) if at else eol
            out.insert(at, f'sha256 = "{hashes[index]}"{ending}')
            done.add(index)

    for line in lines:
        body = line.rstrip("\n").rstrip("\r")
        if _DRAFTER_HEADER.match(body) or _OTHER_HEADER.match(body):
            close()
            if _DRAFTER_HEADER.match(body):
                seen += 1               # drafters counted apart: [defaults] may come between
            index = seen if _DRAFTER_HEADER.match(body) else -1
            out.append(line)
            pending = len(out) if index >= 0 else None
            continue
        m = _SHA_LINE.match(body)
        if index >= 0 and m and index in hashes:
            out.append(f'{m["head"]}"{hashes[index]}"{m["tail"]}{line[len(body):]}')
            done.add(index)
            continue
        out.append(line)
        if index >= 0 and _NAME_LINE.match(body):
            pending = len(out)
    close()
    result = "".join(out)
    _check_update(text, result, hashes, label)
    return result


def _ending(line: str, default: str) -> str:
    """``line``'s line ending ("\\r\\n" or "\\n"), or ``default`` when it has none."""
    return "\r\n" if line.endswith("\r\n") else "\n" if line.endswith("\n") else default


def check_updatable(policy: LoadedPolicy) -> None:
    """--update before anything runs: the edit ``with_hashes`` makes must be possible in
    this policy's layout (each drafter a [[drafter]] table with single-line values), proved
    by making it with a placeholder hash for every drafter; else the one GatePolicyError
    it raises (120), before the gate has run or written anything."""
    with_hashes(policy.text, {e.index: "0" * 64 for e in policy.entries}, shown(policy.path))


def _check_update(before: str, after: str, hashes: dict[int, str], label: str) -> None:
    old, new = parse_policy(before, label), None
    try:
        new = parse_policy(after, label)
    except GatePolicyError:
        pass
    want = [e.model_copy(update={"sha256": hashes.get(i, e.sha256)})
            for i, e in enumerate(old.drafter)]
    if new is None or list(new.drafter) != want or new.defaults != old.defaults:
        raise GatePolicyError(f"{label}: --update cannot write the measured hashes into this "
                              "layout; expected each drafter as a [[drafter]] table with "
                              "single-line values", path=label, field="sha256",
                              expected="[[drafter]] tables")

