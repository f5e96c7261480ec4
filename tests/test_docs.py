"""The README and the docs say only what is true of the repository: every relative link
resolves (its file, and its #anchor to a heading of that page), every `dspark` command shown
is a registered command with options it has, every `make` target shown is in the Makefile,
every --help points to the exit-code page, the exit-code scan agrees with what the hostile
corpus is refused with, and the README's quick start runs (tests/test_quick_start.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import ROOT
from support.cli import run_cli
from support.tools import load_tool

docs_tool = load_tool("tools/docs.py", siblings=("generated", "cli_docs", "raisers"))
cli_docs = load_tool("tools/cli_docs.py")
raisers = load_tool("tools/raisers.py")

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(```|~~~)[^\n]*\n.*?^\1[ \t]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")


def prose(text: str) -> str:
    """The text without fenced blocks and code spans (a link inside code is not a link)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def code(text: str) -> list[str]:
    """Every code span and every line of a fenced block."""
    out = [m.group(2) for m in CODE_SPAN.finditer(FENCE.sub("", text))]
    for block in FENCE.finditer(text):
        out += block.group(0).splitlines()[1:-1]
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation but '-' and '_'
    removed, each space a '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)     # a link: its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a page's headings (a repeated one gets -1, -2 ... as on GitHub)."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[str]:
    return LINK.findall(prose(path.read_text()))


def test_the_pages_have_links_to_check():
    # The checks below are not vacuous: the README links the reference, the reference
    # links within itself.
    assert "docs/CLI.md" in links(ROOT / "README.md")
    assert any(t.startswith("#") for t in links(ROOT / "docs" / "CLI.md"))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):      # https:, mailto: ...
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (page.parent / file_part).resolve() if file_part else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and (resolved.suffix != ".md" or anchor not in anchors(resolved)):
            broken.append(f"{target}: no heading with anchor #{anchor}")
    assert not broken, broken


def test_the_slugs_are_githubs():
    assert slug("The drafter against its target: `--target`") == "the-drafter-against-its-target---target"
    assert slug("What `make demo` ends with") == "what-make-demo-ends-with"
    assert slug("dspark eval") == "dspark-eval"


# --- commands shown ---------------------------------------------------------------------

def _app_commands() -> dict[str, set[str]]:
    """command name -> every option it takes (long and short names)."""
    _, cmds = cli_docs.commands()
    out = {}
    for name, cmd in cmds.items():
        out[name] = {o for p in cmd.params if p.param_type_name == "option"
                     for o in (*p.opts, *p.secondary_opts)} | {"--help"}
    return out


# `dspark NAME` then its words up to the end of the command (a shell separator).
DSPARK = re.compile(r"(?:^|[\s/(`$])dspark\s+([^\s|;&)`]+)((?:[^|;&)`\n]|\\\n)*)")


def shown_commands() -> list[tuple[str, str, str]]:
    """(page, command, its words) for every `dspark ...` in code on every page."""
    out = []
    for page in PAGES:
        for snippet in code(page.read_text()):
            for m in DSPARK.finditer(snippet):
                out.append((str(page.relative_to(ROOT)), m.group(1), m.group(2)))
    return out


def test_every_dspark_command_shown_exists_with_its_options():
    commands = _app_commands()
    shown = shown_commands()
    assert len(shown) > 30, shown        # the scan finds the snippets
    wrong = []
    for page, name, words in shown:
        if name.startswith("-"):
            if name not in ("--help", "--version"):
                wrong.append(f"{page}: dspark {name}")
            continue
        if name not in commands:
            # prose may name commands in a list (`dspark convert`, `validate` ...): only a
            # lower-case word can be a command; ARTIFACT... and the like are placeholders
            if re.fullmatch(r"[a-z][a-z-]*", name):
                wrong.append(f"{page}: dspark {name}: no such command")
            continue
        for option in re.findall(r"(?:^|\s)(--?[a-zA-Z][\w-]*)", words):
            if option not in commands[name]:
                wrong.append(f"{page}: dspark {name} {option}: no such option")
    assert not wrong, wrong


def test_every_make_target_shown_exists():
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, re.M))
    shown = {m.group(1) for page in PAGES for snippet in code(page.read_text())
             for m in re.finditer(r"(?:^|\s)make\s+([a-z][\w-]*)", snippet)}
    assert {"demo", "test", "docs"} <= shown
    assert shown <= targets, shown - targets


# A path of the repository in code (`tools/docs.py`, `golden/reference/target`); a glob
# (`tests/test_bounds_*.py`) must match something. Not paths of this repository: Strata's
# quantizer, the policy of "another repository" in the CI examples, and a test module a
# record of a past fuzz run names (docs/FUZZING.md).
REPO_PATH = re.compile(r"(?<![\w./-])((?:dspark_convert|tools|tests|golden|release|schemas|docs|bench"
                       r"|scripts|\.github)/[\w./*-]*[\w/*])")
NOT_OURS = {"tools/dflash_quantize.py", "release/policy.toml", "tests/test_strata_rules.py",
            "scripts/data/prepare_target_cache.py"}     # DeepSpec's (docs/REFERENCE.md §10)


def test_every_repository_path_shown_exists():
    shown = {m.group(1) for page in PAGES for snippet in code(page.read_text())
             for m in REPO_PATH.finditer(snippet)}
    assert "tools/docs.py" in shown and "golden/reference/target" in shown
    missing = sorted(path for path in shown - NOT_OURS
                     if not re.search(r"[<>{}]|\bN\b", path)     # placeholders: blk.N, <name>
                     and not (list(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()))
    assert not missing, missing


def test_every_help_points_to_the_exit_code_page():
    assert (ROOT / "docs" / "EXIT_CODES.md").is_file()
    for name in [*_app_commands(), None]:
        result = run_cli(*([name] if name else []), "--help")
        assert result.returncode == 0, result.stderr
        assert "docs/EXIT_CODES.md" in " ".join(result.stdout.split()), name


# --- the generated reference --------------------------------------------------------------

def test_a_registered_command_without_a_section_gets_one():
    page = (ROOT / "docs" / "CLI.md").read_text()
    # the inspect section and its notes taken out, as if the command were new
    start = page.index("\n## dspark inspect\n")
    end = page.index("\n## ", start + 1)
    without = page[:start] + page[end:]
    rendered = cli_docs.render(without)
    assert rendered.rstrip().endswith(cli_docs.NO_NOTES)
    assert "<!-- BEGIN GENERATED cli:inspect -->\n```\ndspark inspect [OPTIONS] PATH\n```" in rendered
    assert "| [`dspark inspect`](#dspark-inspect) |" in rendered


def test_a_section_for_an_unregistered_command_is_an_error():
    page = (ROOT / "docs" / "CLI.md").read_text()
    extra = page + "\n## dspark frobnicate\n\n<!-- BEGIN GENERATED cli:frobnicate -->\n" \
                   "<!-- END GENERATED cli:frobnicate -->\n"
    with pytest.raises(SystemExit, match="frobnicate"):
        cli_docs.render(extra)


def test_the_reference_lists_every_option_of_every_command():
    page = (ROOT / "docs" / "CLI.md").read_text()
    for name, options in _app_commands().items():
        section = page.split(f"<!-- BEGIN GENERATED cli:{name} -->", 1)[1].split("<!-- END", 1)[0]
        for option in options - {"--help"}:
            assert f"`{option}`" in section, (name, option)


@pytest.fixture(scope="module")
def raised() -> dict[str, list[str]]:
    """The scan (a few seconds: every module of the package parsed), once."""
    return raisers.raised_by()


def test_the_exit_code_scan_covers_what_the_hostile_corpus_is_refused_with(raised):
    make_corpus = load_tool("tests/hostile/make_corpus.py")
    missing = [(case.name, case.command, case.error.__name__) for case in make_corpus.CASES
               if case.command not in raised[case.error.__name__]]
    assert not missing, missing


def test_the_exit_code_scan_tells_commands_apart(raised):
    # An upper bound, but not everything everywhere: the quantizer's refusals are not
    # convert's or validate's, the prompt set's not quantize's, and inspect writes nothing.
    assert "quantize" in raised["QuantizedParentError"]
    assert not {"convert", "validate", "inspect"} & set(raised["QuantizedParentError"])
    assert "eval" in raised["PromptSetError"]
    assert not {"convert", "validate", "inspect", "quantize", "lock"} & set(raised["PromptSetError"])
    assert "inspect" not in raised["OutputExistsError"]
    assert {"convert", "lock"} <= set(raised["LockMismatchError"])
