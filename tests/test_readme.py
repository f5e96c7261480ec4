"""The README as a landing page: its table of what each drafter kind goes through is the
code's (tools/docs.py's drafter_kinds_table, regenerated and compared), the Strata column
and the export refusals it states are what the real rules and commands do on the golden
drafters, and the page stays short, lists every doc and defines its terms."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from conftest import ROOT
from support.cli import run_cli
from support.paths import GOLDEN, GOLDEN_TARGET
from support.tools import load_tool

docs_tool = load_tool("tools/docs.py", siblings=("generated", "cli_docs", "raisers"))

README = ROOT / "README.md"
G = GOLDEN / "reference"
GEMMA4_TARGET = G / "gemma4" / "target"
# One golden drafter of every family (and both forms of the DSpark families' heads):
# (source, target, family, plain DFlash).
DRAFTERS = {
    "qwen3-dspark": (G / "vanilla_conf_markov" / "draft", GOLDEN_TARGET, "qwen3-dspark", False),
    "qwen3-dflash": (G / "dflash_shared" / "draft", GOLDEN_TARGET, "qwen3-dspark", True),
    "gemma4-dspark": (G / "gemma4" / "gemma4_vanilla_conf_markov" / "draft", GEMMA4_TARGET,
                      "gemma4-dspark", False),
    "gemma4-dflash": (G / "gemma4" / "gemma4_dflash" / "draft", GEMMA4_TARGET, "gemma4-dspark",
                      True),
    "dflash2": (G / "dflash2" / "draft", GOLDEN_TARGET, "qwen3-dflash2", False),
    "assistant": (G / "gemma4_assistant" / "assistant", GEMMA4_TARGET, "gemma4-assistant", False),
}
SECTION = re.compile(r"<!-- BEGIN GENERATED drafter-kinds -->\n(.*?)<!-- END GENERATED "
                     r"drafter-kinds -->", re.S)


def table_rows() -> dict[str, list[str]]:
    """family -> its row's cells, as the README shows them."""
    body = SECTION.search(README.read_text()).group(1)
    out = {}
    for line in body.splitlines():
        m = re.match(r"^\| [^|`]*`([\w-]+)` \|(.*)\|$", line)
        if m:
            out[m.group(1)] = [c.strip() for c in m.group(2).split("|")]
    return out


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    from dspark_convert.commands.convert import convert

    root = tmp_path_factory.mktemp("readme")
    out = {}
    for name, (source, target, _family, _plain) in DRAFTERS.items():
        out[name] = root / name
        convert(source, out[name], target=target)
    return out


def test_the_readme_table_is_generated_from_the_code():
    rows = table_rows()
    from dspark_convert.contract.families import FAMILIES

    assert set(rows) == {f.name for f in FAMILIES.values()}
    assert docs_tool._render(README.read_text(), docs_tool.SECTIONS["README.md"]) == \
        README.read_text(), "run: python tools/docs.py (make docs)"


def test_the_table_changes_when_a_family_row_does(monkeypatch):
    """Not vacuous: a command taken from a family's row turns its cell into the refusal's
    exit code, and the README then reads as stale."""
    from dspark_convert.contract import families
    from dspark_convert.errors import FamilyQuantizeError

    qwen3 = families.FAMILIES["Qwen3DSparkModel"]
    monkeypatch.setitem(families.FAMILIES, "Qwen3DSparkModel",
                        replace(qwen3, artifact_commands=qwen3.artifact_commands - {"quantize"}))
    table = docs_tool.drafter_kinds_table()
    row = next(line for line in table.splitlines() if "`qwen3-dspark`" in line)
    assert row.split("|")[3].strip() == str(FamilyQuantizeError.exit_code)
    assert docs_tool._render(README.read_text(), docs_tool.SECTIONS["README.md"]) != \
        README.read_text()


def test_the_strata_column_is_what_strata_s_rules_make_of_each_golden_drafter(artifacts):
    """strata.open accepts the plain DFlash Qwen3 artifact only; the README's Strata cell of
    each family says so (✓ for plain DFlash and the refusal's 47 for DSpark heads, else 47)."""
    from dspark_convert.artifact.engines import reports_for_gguf
    from dspark_convert.errors import EngineRequirementError
    from dspark_convert.formats.gguf_reader import read_gguf

    rows = table_rows()
    strata = 4          # convert, quantize, smoke/eval, conform, then Strata
    code = str(EngineRequirementError.exit_code)
    for name, (_s, _t, family, plain) in DRAFTERS.items():
        accepts = reports_for_gguf(read_gguf(artifacts[name] / "drafter.gguf"))["strata.open"].accepts
        cell = rows[family][strata]
        if accepts:
            assert plain and cell.startswith("✓ plain DFlash"), (name, cell)
        else:
            assert cell == code or (not plain and cell.endswith(f"DSpark heads {code}")), \
                (name, cell)
    # And validate --require strata.open exits with the code the cells name.
    proc = run_cli("validate", str(artifacts["qwen3-dspark"]), "--require", "strata.open")
    assert proc.returncode == EngineRequirementError.exit_code, proc.stderr
    proc = run_cli("validate", str(artifacts["qwen3-dflash"]), "--require", "strata.open")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("name", ["gemma4-dspark", "assistant", "dflash2"])
def test_the_export_cells_are_what_export_exits_with(name, artifacts, tmp_path):
    """The llama.cpp, DeepSpec and speculators export cells of a family: a number is the exit
    code that export refuses its golden artifact with, before it writes anything."""
    rows = table_rows()
    _s, target, family, _plain = DRAFTERS[name]
    cells = dict(zip(("llama.cpp", "deepspec", "speculators"),
                     (rows[family][i] for i in (5, 7, 9))))
    for engine, cell in cells.items():
        if not cell.isdigit():
            continue
        out = tmp_path / engine
        option = ("--target-gguf", str(tmp_path / "none.gguf")) if engine == "llama.cpp" \
            else ("--target", str(target))
        proc = run_cli("export", str(artifacts[name]), "--engine", engine, *option, "-o", str(out))
        assert proc.returncode == int(cell), (engine, proc.stderr)
        assert not out.exists()


def test_the_readme_is_a_landing_page():
    text = README.read_text()
    assert len(text.splitlines()) <= 160
    # The first block says what it is, for whom, and what runs where, before any set-up.
    head = text.split("\n## ", 1)[0]
    for engine in ("Strata", "llama.cpp", "dspark-mlx", "speculators"):
        assert engine in head, engine
    glossary = text.split("\n## Glossary\n", 1)[1].split("\n## ", 1)[0]
    for term in ("drafter", "target", "block", "anchor", "tap", "Markov head",
                 "confidence head", "DFlash", "tau", "lossless"):
        assert re.search(rf"^- \*\*{re.escape(term)}\*\*", glossary, re.M | re.I), term
    for url in ("github.com/Niko1221/Strata", "github.com/deepseek-ai/DeepSpec",
                "github.com/ggml-org/llama.cpp", "github.com/vllm-project/vllm",
                "github.com/sgl-project/sglang", "pypi.org/project/dspark-mlx",
                "github.com/vllm-project/speculators"):
        assert url in text, url


def test_every_doc_is_listed_with_its_audience():
    docs = README.read_text().split("\n## Documentation\n", 1)[1].split("\n## ", 1)[0]
    for page in sorted((ROOT / "docs").glob("*.md")):
        line = next((l for l in docs.splitlines() if f"(docs/{page.name})" in l), None)
        # Each page on its own line, saying whom it is for.
        assert line is not None and re.search(r"\bfor\b", line), page.name


def test_the_versions_and_codes_the_readme_names_are_the_code_s():
    """The engine versions, the refusal code and the format versions the first lines and the
    doc list state by hand are the constants the code pins."""
    from dspark_convert.artifact.format import FORMAT_VERSIONS
    from dspark_convert.artifact.llama_cpp import LLAMA_CPP_COMMIT
    from dspark_convert.contract.speculators import SPECULATORS_VERSION
    from dspark_convert.errors import FamilyExportError
    from dspark_convert.evaluation.engine_dspark_mlx import DSPARK_MLX

    text = README.read_text()
    head = text.split("\n## ", 1)[0]
    assert f"**llama.cpp {LLAMA_CPP_COMMIT}**" in head
    assert f"**dspark-mlx {DSPARK_MLX}**" in head
    assert f"**speculators {SPECULATORS_VERSION}**" in head
    assert f"not Gemma 4 DSpark ({FamilyExportError.exit_code})" in head
    versions = sorted(FORMAT_VERSIONS.values())
    assert versions == list(range(1, len(versions) + 1))
    assert f"versions 1 to {versions[-1]} (one per family)" in text
    for version in re.findall(r"llama\.cpp ([0-9a-f]{7})\b", text):
        assert version == LLAMA_CPP_COMMIT
