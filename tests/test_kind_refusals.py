"""What a DFlash2 or Gemma 4 assistant artifact cannot go through, refused in one line from
drafter.gguf's header (commands/binding.refuse_family, the families table's
artifact_commands), naming the commands that do take it; nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.cli import assert_refused, run_cli
from dspark_convert.errors import FamilyExportError, FamilyQuantizeError, FamilyRuntimeError

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "reference"
CASES = {"dflash2": (GOLDEN / "dflash2" / "draft", GOLDEN / "target"),
         "assistant": (GOLDEN / "gemma4_assistant" / "assistant", GOLDEN / "gemma4" / "target")}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    from dspark_convert.commands.convert import convert

    root = tmp_path_factory.mktemp("kind-refusals")
    for name, (source, target) in CASES.items():
        convert(source, root / name, target=target)
    return root


@pytest.mark.parametrize("name", sorted(CASES))
def test_conform_export_deepspec_and_quantize_refuse_them(name, artifacts, tmp_path):
    art, target = artifacts / name, CASES[name][1]
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"context": [1, 2, 3], "draft": [4, 5]}\n')
    takes = "smoke" if name == "assistant" else "export --engine speculators"
    for args, error, needles in (
            (("conform", str(art), "--target", str(target), "--trace", str(trace)),
             FamilyRuntimeError, ["conform:", "its own loop", "eval --engine llama.cpp", takes]),
            (("export", str(art), "--engine", "deepspec", "--target", str(target), "-o",
              str(tmp_path / "out")), FamilyExportError,
             ["export --engine deepspec:", "DeepSpec's DSpark and DFlash drafters only", takes]),
            (("quantize", str(art), "-o", str(tmp_path / "q"), "--type", "Q8_0"),
             FamilyQuantizeError, ["quantize:", "export --engine llama.cpp", takes])):
        assert_refused(run_cli(*args), error, needles)
        assert not (tmp_path / "out").exists() and not (tmp_path / "q").exists()
    if name == "assistant":     # no speculators form: listed as no command it takes
        proc = run_cli("quantize", str(art), "-o", str(tmp_path / "q"), "--type", "Q8_0")
        assert "export --engine speculators" not in proc.stderr
