"""What the docs say that the code knows, checked against the code: every exit code, range
of codes and error class a page names; every `--option`; every limit quoted in bytes,
lines or digits; docs/FUZZING.md's table of property tests and scripts/fuzz.sh against
the tests that exist; and no comment or doc that cites a tracker number, a review round or
a file outside the repository. A doc that names a code, class, option or limit that does
not exist, or quotes one that differs, fails here."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from conftest import ROOT
from support.tools import load_tool

from dspark_convert import errors
from dspark_convert.errors import concrete_errors

cli_docs = load_tool("tools/cli_docs.py")

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CODES = {c.exit_code: c for c in concrete_errors()}
# The codes no class holds: success, a usage error, SIGINT / SIGTERM (docs/EXIT_CODES.md).
PROCESS_CODES = {0, 1, 2, 130, 143}


def _rel(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _base(code: int) -> type:
    """The family of a code: the first class directly under DSparkError its class derives
    from (docs/EXIT_CODES.md's generated table of families, tools/docs.py)."""
    return next(c for c in CODES[code].__mro__ if errors.DSparkError in c.__bases__)


# --- exit codes -------------------------------------------------------------------------------

# A hyphenated range of numbers, not a line span (file:12-20, L12-20, §3-4), a date, a
# decimal or a size/time (16-23 s, 93-94 MB).
RANGE = re.compile(r"(?<![\w.:/#§+-])(\d{2,3})-(\d{2,3})(?![\w.%/-]|\.\d| ?(?:s|ms|MB|GB|MiB|"
                   r"GiB|KiB|bytes|tokens|min|%|°)\b)")


def code_ranges() -> list[tuple[str, int, str]]:
    """(page, line, range) for every NN-MM of a page whose both ends are exit codes."""
    out = []
    for page in PAGES:
        if page.name == "REFERENCE.md":          # upstream facts: line spans of their files
            continue
        for i, line in enumerate(page.read_text().splitlines(), 1):
            for m in RANGE.finditer(line):
                a, b = int(m.group(1)), int(m.group(2))
                if a < b and a in CODES and b in CODES:
                    out.append((_rel(page), i, m.group(0)))
    return out


def range_problem(a: int, b: int) -> str | None:
    """A range of codes is every code from a to b, cut where a family of errors changes:
    a gap, or a family that goes on past either end (60-67 when 68 is a target error too),
    is a range the code has outrun."""
    gaps = [c for c in range(a, b + 1) if c not in CODES]
    if gaps:
        return f"no exit code {gaps[0]}"
    if b + 1 in CODES and _base(b + 1) is _base(b):
        return f"{b + 1} ({CODES[b + 1].__name__}) is a {_base(b).__name__} too"
    if a - 1 in CODES and _base(a - 1) is _base(a):
        return f"{a - 1} ({CODES[a - 1].__name__}) is a {_base(a).__name__} too"
    return None


def test_the_range_rule_catches_a_range_the_code_has_outran():
    assert range_problem(60, 67) == "68 (TargetFamilyError) is a TargetError too"
    assert range_problem(70, 78) == "no exit code 71"
    assert range_problem(30, 32) is None
    assert range_problem(40, 49) is None
    assert code_ranges(), "the scan finds the pages' ranges"


def test_every_range_of_exit_codes_is_whole():
    wrong = []
    for page, line, text in code_ranges():
        a, b = map(int, text.split("-"))
        problem = range_problem(a, b)
        if problem:
            wrong.append(f"{page}:{line}: {text}: {problem}")
    assert not wrong, "\n".join(wrong)


# A number said to be an exit code: "exit 45", "exits 105", "exit code 70", "code 86",
# "refused (106)", "refused with 94", "fails with 114".
SAID_CODE = re.compile(r"\b(?:exit(?:s|ed)?(?: code| status)?|(?:exit |its )?code|refused(?: with)?"
                       r"|refuses(?: it)?(?: with)?|fails(?: the stage)?,? with)\s*\(?(\d{1,3})\b(?![\w.,]\d|-\d| ?%)")


# A number alone in parentheses, "refused (105)", "(60-68; ...)" aside: the docs' way of
# naming the code of what they describe; a limit's value follows its `CONSTANT` instead.
PAREN_CODE = re.compile(r"(?<![\w`])(?<!` )\((\d{2,3})(?:\)|[,;] )")


def said_codes() -> list[tuple[str, int, int]]:
    out = []
    for page in PAGES:
        if page.name == "REFERENCE.md":
            continue
        for i, line in enumerate(page.read_text().splitlines(), 1):
            out += [(_rel(page), i, int(m.group(1))) for m in SAID_CODE.finditer(line)]
            out += [(_rel(page), i, int(m.group(1))) for m in PAREN_CODE.finditer(line)]
    return out


def test_every_number_said_to_be_an_exit_code_is_one():
    said = said_codes()
    assert len(said) > 150, len(said)            # the scan finds them
    # timeout(1)'s 124 in a fuzz log line is a code too (ReproducibilityError's): no exception
    wrong = [f"{page}:{line}: {code}" for page, line, code in said
             if code not in CODES and code not in PROCESS_CODES]
    assert not wrong, wrong


# An error class and the code written beside it: `TargetFamilyError` 68, `OutputPathError`
# (32), `OutputPathError` | 32.
CLASS_CODE = re.compile(r"`?\b([A-Z]\w*(?:Error|Refusal|Violation))\b`?\s*(?:\||,|:)?\s*\(?(\d{1,3})\b(?!\.\d)")
CLASS_NAME = re.compile(r"`([A-Z]\w*(?:Error|Refusal|Violation))`")
NOT_OURS = {"KeyboardInterrupt", "AttributeError", "ValueError", "OSError", "TypeError",
            "RuntimeError", "KeyError", "IndexError", "MemoryError", "RecursionError",
            "UnicodeDecodeError", "ValidationError", "ImportError", "ModuleNotFoundError",
            "OverflowError", "FileNotFoundError", "PermissionError", "NotImplementedError",
            "AssertionError", "ZeroDivisionError", "SafetensorError", "HfHubHTTPError",
            "BrokenPipeError", "TimeoutError", "EOFError", "JSONDecodeError", "StopIteration",
            "GatedRepoError", "RepositoryNotFoundError", "RevisionNotFoundError",
            "EntryNotFoundError", "LocalEntryNotFoundError", "SubprocessError",
            "CalledProcessError", "UnicodeEncodeError", "IsADirectoryError", "OutOfMemoryError",
            "InterruptedError", "BadZipFile"}


def test_every_error_class_named_exists_with_the_code_beside_it():
    ours = {name for name in dir(errors) if isinstance(getattr(errors, name), type)}
    wrong = []
    for page in PAGES:
        text = page.read_text()
        for name in set(CLASS_NAME.findall(text)) - ours - NOT_OURS:
            wrong.append(f"{_rel(page)}: `{name}`: no such class in dspark_convert/errors.py")
        for m in CLASS_CODE.finditer(text):
            cls = getattr(errors, m.group(1), None)
            if isinstance(cls, type) and getattr(cls, "exit_code", None) is not None \
                    and cls in CODES.values() and int(m.group(2)) != cls.exit_code:
                wrong.append(f"{_rel(page)}: {m.group(0)!r}: {m.group(1)} exits "
                             f"{cls.exit_code}")
    assert not wrong, wrong


def test_the_artifact_formats_title_names_every_format_version():
    from dspark_convert.artifact.format import FORMAT_VERSIONS

    title = (ROOT / "docs" / "ARTIFACT_FORMAT.md").read_text().splitlines()[0]
    versions = sorted(set(FORMAT_VERSIONS.values()))
    assert title.endswith(f"format versions {versions[0]} to {versions[-1]}"), title
    assert versions == list(range(versions[0], versions[-1] + 1))


# --- options ----------------------------------------------------------------------------------

# Options of the other programs the docs show (each doc says whose it is).
OTHER_TOOLS = {
    "--dry-run": "pip", "--ignore-installed": "pip", "--no-binary": "pip",
    "--no-build-isolation": "pip", "--no-deps": "pip", "--require-hashes": "pip",
    "--report": "pip", "--python": "tools/speculators.py", "--revision": "hf download",
    "--hypothesis-show-statistics": "pytest", "--readme": "tests/hostile/make_corpus.py",
    "--geometry": "bench/", "--quantize": "bench/", "--native": "tools/llama_cpp.py",
    "--no-display-prompt": "llama.cpp", "--no-escape": "llama.cpp", "--no-repack": "llama.cpp",
    "--outfile": "llama.cpp's converter", "--outtype": "llama.cpp's converter",
    "--spec-draft-n-max": "llama.cpp", "--spec-draft-p-min": "llama.cpp",
    "--spec-min-p": "llama.cpp", "--spec-type": "llama.cpp", "--temp": "llama.cpp",
    "--verbose-prompt": "llama.cpp", "--speculative-algorithm": "SGLang",
    "--target-model-dir": "DeepSpec's eval",
}


def _dspark_options() -> set[str]:
    _, cmds = cli_docs.commands()
    return {o for cmd in cmds.values() for p in cmd.params if p.param_type_name == "option"
            for o in (*p.opts, *p.secondary_opts)} | {"--help", "--version"}


def test_every_option_named_is_one_that_exists():
    ours = _dspark_options()
    named: dict[str, set[str]] = {}
    for page in PAGES:
        for m in re.finditer(r"(?<![\w-])(--[a-z][\w-]*)", page.read_text()):
            named.setdefault(m.group(1), set()).add(_rel(page))
    wrong = {o: sorted(p) for o, p in named.items() if o not in ours and o not in OTHER_TOOLS}
    assert not wrong, f"no dspark command takes these (a renamed option?): {wrong}"
    # another program's option that is also ours would hide a misspelt one of ours
    assert not (set(OTHER_TOOLS) & ours), set(OTHER_TOOLS) & ours


# --- limits -----------------------------------------------------------------------------------

UNITS = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "digits": 1, "lines": 1,
         "runs": 1, "": 1}


def _value(number: str, unit: str) -> int:
    return int(number.replace(",", "")) * UNITS[unit]


# (page, the quote with its number as a group and the unit as a second group, the module
# and constant it quotes). A limit a page quotes in prose is one of these.
QUOTES = [
    ("docs/CLI.md", r"length cap \(([\d,]+) (bytes)\)", "dspark_convert.formats.safetensors",
     "MAX_HEADER_BYTES"),
    ("docs/CLI.md", r"over the source, ([\d,]+) (MiB) at a time", "dspark_convert.util.hashing",
     "BLOCK"),
    ("docs/CLI.md", r"holds one ([\d,]+) (MiB) staging buffer", "dspark_convert.runtime.loading",
     "STAGING_BYTES"),
    ("docs/CONFORMANCE.md", r"At most ([\d,]+) (MiB), [\d,]+ MiB a line", "dspark_convert.evaluation.conform",
     "MAX_TRACE_BYTES"),
    ("docs/CONFORMANCE.md", r"At most [\d,]+ MiB, ([\d,]+) (MiB) a line", "dspark_convert.evaluation.conform",
     "MAX_TRACE_LINE_BYTES"),
    ("docs/CONFORMANCE.md", r"MiB a line, ([\d,]+) (lines)", "dspark_convert.evaluation.conform",
     "MAX_TRACE_LINES"),
    ("docs/SCHEDULING.md", r"at most ([\d,]+) (MiB)\)", "dspark_convert.util.strict_json",
     "MAX_CONFIG_BYTES"),
    ("docs/SPECULATORS.md", r"in more than the ([\d,]+) (MiB) any\s+config reader",
     "dspark_convert.util.strict_json", "MAX_CONFIG_BYTES"),
    ("docs/ENGINES.md", r"a line is at most ([\d,]+) (MiB), the log", "dspark_convert.evaluation.engine_log",
     "LINE_LIMIT"),
    ("docs/ENGINES.md", r"the log at\s+most ([\d,]+) (MiB) plus", "dspark_convert.evaluation.engine_llama_cpp",
     "LOG_BASE"),
    ("docs/ENGINES.md", r"a record at most ([\d,]+) (MiB)", "dspark_convert.evaluation.engine_dspark_mlx",
     "LINE_LIMIT"),
    ("docs/ENGINES.md", r"its own stdout/stderr ([\d,]+) (MiB)", "dspark_convert.evaluation.engine_dspark_mlx",
     "OUTPUT_LIMIT"),
    ("docs/FUZZING.md", r"more than ([\d,]+) (digits) is", "dspark_convert.util.text", "MAX_INT_DIGITS"),
    ("docs/FUZZING.md", r"expected at most ([\d,]+)()\"", "dspark_convert.util.text", "MAX_INT_DIGITS"),
    ("docs/FUZZING.md", r"a component over ([\d,]+) (bytes)", "dspark_convert.util.paths", "NAME_MAX"),
    ("docs/FUZZING.md", r"a path over ([\d,]+)() \(", "dspark_convert.util.paths", "PATH_MAX"),
    ("docs/FUZZING.md", r"`MAX_REFERENCE_RUNS` \(([\d,]+)\)() runs", "dspark_convert.runtime.trace",
     "MAX_REFERENCE_RUNS"),
]
# A limit in prose: "at most N unit", "cap (N unit)", "more than N unit", "over N unit".
LIMIT_PHRASE = re.compile(r"(?i)\b(?:at most|cap|limit|more than|over|bound)\b[^.;|\n]{0,30}?"
                          r"\b([\d,]+) ?(bytes|KiB|MiB|GiB)\b")


@pytest.mark.parametrize("page, pattern, module, name", QUOTES,
                         ids=[f"{q[0]}:{q[3]}" for q in QUOTES])
def test_every_limit_quoted_is_the_constant(page, pattern, module, name):
    text = " ".join((ROOT / page).read_text().split())
    found = re.findall(pattern.replace(r"\s+", " "), text)
    assert found, f"{page} no longer quotes {name}: update this table with the page"
    constant = getattr(importlib.import_module(module), name)
    for number, unit in found:
        assert _value(number, unit) == constant, \
            f"{page} quotes {name} as {number} {unit}; the code's is {constant:,}"


def test_every_limit_constant_named_exists():
    """A page names a limit by its constant (`MAX_TRACE_BYTES`): the package defines it."""
    defined = set()
    for module in (ROOT / "dspark_convert").rglob("*.py"):
        defined |= set(re.findall(r"^\s*(MAX_\w+)\s*[:=]", module.read_text(), re.M))
    named = {(_rel(page), name) for page in PAGES
             for name in re.findall(r"`(MAX_[A-Z0-9_]+)`", page.read_text())}
    assert len(named) > 20
    missing = sorted(f"{page}: {name}" for page, name in named if name not in defined)
    assert not missing, missing


def test_every_limit_in_prose_is_a_quote_checked_here():
    unchecked = []
    for page in PAGES:
        if page.name in ("REFERENCE.md", "BAD_INPUTS.md"):   # upstream's; generated limits
            continue
        text = " ".join(page.read_text().split())
        covered = [m.span(1) for q in QUOTES if q[0] == _rel(page)
                   for m in re.finditer(q[1].replace(r"\s+", " "), text)]
        for m in LIMIT_PHRASE.finditer(text):
            if not any(a <= m.start(1) < b for a, b in covered):
                unchecked.append(f"{_rel(page)}: {m.group(0)!r}")
    assert not unchecked, ("a limit in prose that no QUOTES entry ties to its constant: "
                           f"{unchecked}")


def _packaged_prompts() -> str:
    from dspark_convert.evaluation.prompts import DEFAULT_PROMPTS

    return str(len(DEFAULT_PROMPTS.read_text().splitlines()))


def _eval_default(name: str) -> str:
    import inspect

    from dspark_convert.commands.evaluate import run_eval

    return " ".join(str(v) for v in inspect.signature(run_eval).parameters[name].default)


# Other numbers a page quotes from the code: (page, the quote, its number(s) as group 1, what
# the code says).
FACTS = [
    ("docs/CLI.md", r"the package's (\d+) prompts", _packaged_prompts),
    ("docs/CLI.md", r"`--threshold C` \(repeatable, default ([\d. ]+?);", lambda: _eval_default("thresholds")),
]


@pytest.mark.parametrize("page, pattern, fact", FACTS, ids=[f"{f[0]}:{f[1][:24]}" for f in FACTS])
def test_every_number_quoted_from_the_code_is_the_codes(page, pattern, fact):
    text = " ".join((ROOT / page).read_text().split())
    found = re.findall(pattern, text)
    assert found, f"{page} no longer says {pattern!r}: update FACTS with the page"
    assert set(found) == {fact()}, (found, fact())


# --- property tests: docs/FUZZING.md and scripts/fuzz.sh ----------------------------------------

def property_tests() -> dict[str, list[str]]:
    """test file -> the node ids (Class::test) of its tests that hold a hypothesis property
    (a @given on the test or on a function inside it)."""
    out = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        found = []

        def given(fn) -> bool:
            for n in ast.walk(fn):
                for d in getattr(n, "decorator_list", []):
                    f = d.func if isinstance(d, ast.Call) else d
                    if getattr(f, "id", getattr(f, "attr", None)) == "given":
                        return True
            return False

        def walk(body, prefix):
            for node in body:
                if isinstance(node, ast.ClassDef):
                    walk(node.body, prefix + node.name + "::")
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                        and node.name.startswith("test") and given(node):
                    found.append(prefix + node.name)
        walk(ast.parse(path.read_text()).body, "")
        if found:
            out[str(path.relative_to(ROOT))] = found
    return out


def fuzzing_table() -> dict[str, int]:
    text = (ROOT / "docs" / "FUZZING.md").read_text()
    section = text.split("## Every property test", 1)[1].split("\n## ", 1)[0]
    return {m.group(1): int(m.group(2))
            for m in re.finditer(r"^\| `(tests/[^`]+)` \|[^|]*\| (\d+) \|", section, re.M)}


def fuzz_targets() -> list[str]:
    script = (ROOT / "scripts" / "fuzz.sh").read_text()
    return script.split("TARGETS=(", 1)[1].split(")", 1)[0].split()


def test_the_fuzzing_table_lists_every_property_test_file_with_its_count():
    found = {path: len(tests) for path, tests in property_tests().items()}
    assert "tests/test_conform_fuzz.py" in found and "tests/test_output_rules.py" in found
    assert fuzzing_table() == found


def test_make_fuzz_runs_every_property_test():
    targets = fuzz_targets()
    assert all((ROOT / t.split("::")[0]).is_file() for t in targets), targets
    missing = [f"{path}::{test}" for path, tests in property_tests().items() for test in tests
               if path not in targets and f"{path}::{test}" not in targets]
    assert not missing, f"scripts/fuzz.sh does not run: {missing}"
    props = {f"{p}::{t}" for p, tests in property_tests().items() for t in tests}
    stray = [t for t in targets if "::" in t and t not in props]
    assert not stray, f"scripts/fuzz.sh names tests that hold no property: {stray}"


# --- citations --------------------------------------------------------------------------------

# A tracker number, a review round, a deliverable of a ticket, a file of the team's shared
# folder (outside the repository): what a reader of the repository cannot see.
CITATION = re.compile(r"[Ii]ssue[ -]?#?[0-9]+|issue-[0-9]+|\b[Rr]ound[ _-]?[0-9]|(?<![\w])shared/"
                      r"|REFERENCE_GEMMA4|\b[Dd]eliver(?:able)? [0-9]|\b[Ii]ssue(?:'s|s)?\b")
# Upstream threads are references a reader can open: "vllm #56792", "sglang #30982", a
# github.com issues link.
UPSTREAM = re.compile(r"(?i)(?:vllm|sglang|llama\.cpp|speculators|transformers|torch|pytorch|"
                      r"hypothesis|huggingface_hub|gguf)[^\n]{0,20}#\d+|github\.com/[\w.-]+/[\w.-]+/"
                      r"(?:issues|pull)/\d+")
SCANNED = ["dspark_convert", "tests", "tools", "bench", "docs", "golden", "scripts"]
SUFFIXES = {".py", ".md", ".sh", ".toml", ".txt", ".json", ".cfg", ".yml", ".yaml"}


def citations(paths) -> list[str]:
    out = []
    for path in paths:
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        for i, line in enumerate(text.splitlines(), 1):
            stripped = UPSTREAM.sub("", line)
            for m in CITATION.finditer(stripped):
                out.append(f"{path.relative_to(ROOT)}:{i}: {m.group(0)!r}")
    return out


def _scanned_files():
    # this file holds the pattern and its examples
    files = [ROOT / "Makefile"]
    for top in SCANNED:
        files += [p for p in (ROOT / top).rglob("*") if p.is_file() and p.suffix in SUFFIXES
                  and "__pycache__" not in p.parts and p.stat().st_size < 2_000_000
                  and p != Path(__file__).resolve()]
    return files


def test_the_citation_scan_finds_one():
    sample = ROOT / "build" / "citation-sample.md"
    sample.parent.mkdir(exist_ok=True)
    sample.write_text("see issue 25\nfixed in round 3\nthe layout of shared/REFERENCE.md\n"
                      "vllm #56792 and sglang #30982 are upstream\n")
    try:
        assert len(citations([sample])) == 3     # each of the first three lines, once
    finally:
        sample.unlink()


def test_no_comment_or_doc_cites_a_tracker_or_a_file_outside_the_repository():
    found = citations(_scanned_files())
    assert not found, ("say what it guards instead; facts cite docs/REFERENCE.md or the "
                       f"upstream file and line: {found}")


def test_no_test_file_is_named_after_a_review_round():
    named = [p.name for p in (ROOT / "tests").rglob("*.py") if re.search(r"round\d|hostile_round", p.name)]
    assert not named, named
