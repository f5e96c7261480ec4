"""A newcomer's most likely mistakes, command by command, through the real CLI: each refused in
one line that names what was given and what was expected (a usage error, exit 2, as click
prints it, naming the option and the value).

The mistakes: a Hub repo without its @commit, a file where a directory is expected (a
config.json, a weights file, a GGUF file), the target model or an artifact given to convert, a checkpoint or a
target model given where an artifact is expected, the drafter or an artifact given as
--target, a missing option (-o, --target, --type, --engine, --trace), an engine's name
misspelt or llama.cpp without its directory, a JSON file given as a GGUF file, a JSON document given as JSONL, a decimal comma ("0,7"), an output inside the
input, an output that exists, and --strict failing on warnings it must name.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.cli import assert_refused, run_cli
from support.paths import GOLDEN_TARGET, REFERENCE_DRAFTER

from dspark_convert import errors as E

SRC = str(REFERENCE_DRAFTER)
TARGET = str(GOLDEN_TARGET)


@pytest.fixture(scope="module")
def places(tmp_path_factory) -> dict[str, str]:
    """The paths a case names: the golden checkpoint and target, a converted artifact of
    it (paired with the target), its drafter.gguf copied alone, and a work directory."""
    from dspark_convert.commands.convert import convert

    root = tmp_path_factory.mktemp("newcomer")
    art = root / "art"
    convert(REFERENCE_DRAFTER, art, target=GOLDEN_TARGET)
    gguf = root / "drafter-copy.gguf"
    shutil.copyfile(art / "drafter.gguf", gguf)
    (root / "work").mkdir()
    # A JSON document written over several lines, where a JSONL file is expected.
    json_doc = root / "prompts.json"
    json_doc.write_text('{\n  "id": "a",\n  "prompt": "hello"\n}\n')
    return {"src": SRC, "target": TARGET, "art": str(art), "gguf": str(gguf),
            "work": str(root / "work"), "json_doc": str(json_doc)}


@dataclass(frozen=True)
class Mistake:
    id: str
    argv: tuple[str, ...]
    error: type | None           # None: a usage error (exit 2)
    needles: tuple[str, ...]


MISTAKES = [
    # convert
    Mistake("convert-hub-repo-without-commit", ("convert", "org/name", "-o", "{work}/a"),
            E.SourceNotFoundError, ("org/name: no such directory", "org/name@<40-hex commit>",
                                    "--resolve")),
    Mistake("convert-hub-branch-without-resolve", ("convert", "org/name@main", "-o", "{work}/a"),
            E.HubSpecError, ("'main' is a branch or tag", "--resolve")),
    Mistake("convert-config-json", ("convert", "{src}/config.json", "-o", "{work}/a"),
            E.SourceNotFoundError, ("a file, not a directory", "the directory holding it, {src}")),
    Mistake("convert-weights-file", ("convert", "{src}/model.safetensors", "-o", "{work}/a"),
            E.SourceNotFoundError, ("a file, not a directory", "the directory holding it, {src}")),
    Mistake("convert-gguf-file", ("convert", "{gguf}", "-o", "{work}/a"),
            E.SourceNotFoundError, ("a GGUF file, already converted", "`dspark validate`")),
    Mistake("convert-an-artifact", ("convert", "{art}", "-o", "{work}/a"),
            E.SourceNotFoundError, ("an artifact (drafter.gguf, manifest.json), already converted",
                                    "expected a checkpoint directory")),
    Mistake("convert-the-target-model", ("convert", "{target}", "-o", "{work}/a"),
            E.UnsupportedArchitectureError, ("found ['Qwen3ForCausalLM']",
                                             "this is a target model (model_type 'qwen3')",
                                             "the target to --target")),
    Mistake("convert-without-output", ("convert", "{src}", "{work}/a"), None, ("'--output' / '-o'",)),
    Mistake("convert-output-inside-source", ("convert", "{src}", "-o", "{src}/out"),
            E.OutputExistsError, ("lies inside the source checkpoint", "expected an output outside it")),
    Mistake("convert-output-exists", ("convert", "{src}", "-o", "{art}"),
            E.OutputExistsError, ("output already exists", "--force")),
    Mistake("convert-target-is-the-drafter", ("convert", "{src}", "-o", "{work}/a", "--target", "{src}"),
            E.TargetNotFoundError, ("a drafter checkpoint (Qwen3DSparkModel), not a target",
                                    "the target model the drafter drafts for")),
    Mistake("convert-target-is-an-artifact", ("convert", "{src}", "-o", "{work}/a", "--target", "{art}"),
            E.TargetNotFoundError, ("an artifact (drafter.gguf, manifest.json), not a target",)),
    Mistake("convert-target-hub-repo-without-commit",
            ("convert", "{src}", "-o", "{work}/a", "--target", "Qwen/Qwen3-8B"),
            E.TargetNotFoundError, ("no such directory", "Qwen/Qwen3-8B@<40-hex commit>")),
    # validate
    Mistake("validate-a-checkpoint", ("validate", "{src}"),
            E.InvalidArtifactError, ("drafter.gguf is missing", "holds config.json",
                                     "`dspark convert` makes an artifact")),
    Mistake("validate-a-target-model", ("validate", "{target}"),
            E.InvalidArtifactError, ("drafter.gguf is missing", "holds config.json")),
    Mistake("validate-nothing-there", ("validate", "{work}/none"),
            E.InvalidArtifactError, ("not an artifact directory (no such directory)",
                                     "drafter.gguf and manifest.json")),
    Mistake("validate-engine-misspelt", ("validate", "{art}", "--require", "llamacpp"),
            None, ("--require", "expected one of strata.open, strata.run, llama.cpp",
                   "'llamacpp'")),
    Mistake("validate-target-is-the-drafter", ("validate", "{art}", "--target", "{src}"),
            E.TargetNotFoundError, ("a drafter checkpoint (Qwen3DSparkModel), not a target",)),
    Mistake("validate-a-json-file", ("validate", "{art}/manifest.json"),
            E.GGUFFormatError, ("bad magic at byte 0", "not a GGUF file")),
    # inspect
    Mistake("inspect-the-target-model", ("inspect", "{target}"),
            E.UnsupportedArchitectureError, ("this is a target model (model_type 'qwen3')",)),
    Mistake("inspect-hub-repo", ("inspect", "org/name"),
            E.SourceNotFoundError, ("no such directory", "a local path",
                                    "dspark convert org/name@<40-hex commit>")),
    Mistake("inspect-a-json-file", ("inspect", "{art}/manifest.json"),
            E.SourceNotFoundError, ("a file, not a directory",
                                    "a checkpoint or artifact directory, or a GGUF file")),
    # smoke
    Mistake("smoke-without-target", ("smoke", "{art}"), None, ("'--target'",)),
    Mistake("smoke-a-checkpoint", ("smoke", "{src}", "--target", "{target}"),
            E.InvalidArtifactError, ("holds config.json", "`dspark convert` makes an artifact")),
    Mistake("smoke-a-gguf-file", ("smoke", "{gguf}", "--target", "{target}"),
            E.InvalidArtifactError, ("not an artifact directory (a file)",
                                     "checks a GGUF file alone")),
    Mistake("smoke-arguments-swapped", ("smoke", "{target}", "--target", "{art}"),
            E.TargetNotFoundError, ("an artifact (drafter.gguf, manifest.json), not a target",)),
    Mistake("smoke-decimal-comma", ("smoke", "{art}", "--target", "{target}", "--temperature", "0,7"),
            None, ("--temperature", "expected a number with a decimal point", "'0,7'", "write 0.7")),
    Mistake("smoke-confidence-as-a-percentage",
            ("smoke", "{art}", "--target", "{target}", "--confidence-threshold", "70"),
            None, ("--confidence-threshold", "expected a confidence in [0, 1], found 70")),
    Mistake("smoke-device-misspelt", ("smoke", "{art}", "--target", "{target}", "--device", "gpu"),
            E.SmokeInputError, ("--device: expected auto, cpu or cuda, found 'gpu'",)),
    Mistake("smoke-dtype-shorthand", ("smoke", "{art}", "--target", "{target}", "--dtype", "bf16"),
            E.SmokeInputError, ("--dtype: expected one of float32, bfloat16",)),
    # eval
    Mistake("eval-without-output", ("eval", "{art}", "--target", "{target}"), None, ("'--output' / '-o'",)),
    Mistake("eval-engine-misspelt",
            ("eval", "{art}", "--target", "{target}", "-o", "{work}/e", "--engine", "llamacpp"),
            E.EngineOptionError, ("'llamacpp'", "did you mean llama.cpp?")),
    Mistake("eval-llama-cpp-without-its-directory",
            ("eval", "{art}", "--target", "{target}", "-o", "{work}/e", "--engine", "llama.cpp"),
            E.EngineOptionError, ("--engine llama.cpp=BIN_DIR", "tools/llama_cpp.py path")),
    Mistake("eval-decimal-comma",
            ("eval", "{art}", "--target", "{target}", "-o", "{work}/e", "--threshold", "0,5"),
            None, ("--threshold", "expected a number with a decimal point", "write 0.5")),
    Mistake("eval-not-a-number",
            ("eval", "{art}", "--target", "{target}", "-o", "{work}/e", "--temperature", "hot"),
            None, ("--temperature", "expected a number, found 'hot'")),
    Mistake("eval-output-inside-the-artifact",
            ("eval", "{art}", "--target", "{target}", "-o", "{art}/report"),
            E.OutputExistsError, ("lies inside the artifact", "expected an output outside it")),
    Mistake("eval-a-checkpoint", ("eval", "{src}", "--target", "{target}", "-o", "{work}/e"),
            E.InvalidArtifactError, ("holds config.json", "`dspark convert` makes an artifact")),
    # export
    Mistake("export-engine-misspelt", ("export", "{art}", "--engine", "llamacpp", "-o", "{work}/x.gguf"),
            None, ("--engine", "'llamacpp'", "'llama.cpp'")),
    Mistake("export-llama-cpp-without-target-gguf",
            ("export", "{art}", "--engine", "llama.cpp", "-o", "{work}/x.gguf"),
            E.ExportOptionError, ("needs --target-gguf TARGET.gguf",)),
    Mistake("export-target-directory-for-target-gguf",
            ("export", "{art}", "--engine", "llama.cpp", "--target-gguf", "{target}", "-o", "{work}/x.gguf"),
            E.TargetGGUFError, ("is a directory, not a regular file", "GGUF file")),
    Mistake("export-deepspec-without-target",
            ("export", "{art}", "--engine", "deepspec", "-o", "{work}/ds"),
            E.ExportOptionError, ("needs --target",)),
    # quantize
    Mistake("quantize-type-misspelt", ("quantize", "{art}", "-o", "{work}/q", "--type", "q4"),
            E.QuantTypeError, ("'q4'", "expected one of q8_0, q5_0, q4_0")),
    Mistake("quantize-a-checkpoint", ("quantize", "{src}", "-o", "{work}/q", "--type", "q8_0"),
            E.ParentArtifactError, ("holds config.json", "`dspark convert` makes an artifact")),
    Mistake("quantize-over-its-parent", ("quantize", "{art}", "-o", "{art}", "--type", "q8_0"),
            E.OutputExistsError, ("is the parent artifact", "expected an output outside it")),
    # lock
    Mistake("lock-a-local-directory", ("lock", "{src}", "-o", "{work}/l.json"),
            E.HubSpecError, ("not a Hub spec", "org/name@<40-hex commit>")),
    Mistake("lock-hub-repo-without-commit", ("lock", "org/name", "-o", "{work}/l.json"),
            E.HubSpecError, ("no revision", "org/name@<40-hex commit>", "--resolve")),
    # conform
    Mistake("conform-trace-is-a-json-document",
            ("conform", "{art}", "--target", "{target}", "--trace", "{json_doc}"),
            E.TraceFormatError, ("line 1: not valid JSON", "expected JSONL, one JSON object a line")),
    Mistake("eval-prompts-is-a-json-document",
            ("eval", "{art}", "--target", "{target}", "-o", "{work}/e", "--prompts", "{json_doc}"),
            E.PromptSetError, ("not valid JSON", "expected JSONL, one JSON object a line")),
    Mistake("conform-trace-is-a-directory",
            ("conform", "{art}", "--target", "{target}", "--trace", "{target}"),
            E.TraceFormatError, ("is a directory, not a regular file", "JSONL file")),
]


@pytest.mark.parametrize("mistake", MISTAKES, ids=[m.id for m in MISTAKES])
def test_a_newcomers_mistake_is_refused_in_one_line_that_teaches(mistake: Mistake, places) -> None:
    argv = [a.format(**places) for a in mistake.argv]
    needles = [n.format(**places) for n in mistake.needles]
    proc = run_cli(*argv)
    if mistake.error is None:
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr
        for needle in needles:
            assert needle in proc.stderr, f"{needle!r} not in {proc.stderr!r}"
    else:
        assert_refused(proc, mistake.error, needles)


def test_strict_names_every_warning_it_counts_as_a_failure(places, tmp_path: Path) -> None:
    """Two unexpected files in an artifact are one warning (artifact.files); --strict fails
    on it and its line names the check and the files, where it said only "warnings count
    as failures"."""
    art = tmp_path / "art"
    shutil.copytree(places["art"], art)
    (art / "notes.txt").write_text("mine\n")
    (art / "README").write_text("mine\n")
    assert run_cli("validate", str(art)).returncode == 0
    line = assert_refused(run_cli("validate", str(art), "--strict"), E.StrataRuleError,
                          ["--strict: 1 warning(s) count as failures",
                           "artifact.files: unexpected file(s) in the artifact: README, notes.txt"])
    # --json: the same line on stderr, the report on stdout.
    proc = run_cli("validate", str(art), "--strict", "--json")
    assert proc.stderr.strip() == line


def test_strict_message_lists_each_warning(places, tmp_path: Path) -> None:
    """ValidationReport.strict_message, on a report with two warnings of different checks:
    each named, in the report's order."""
    from dspark_convert.checks import Check
    from dspark_convert.commands.validate import validate_artifact

    report = validate_artifact(places["art"])
    checks = [*report.checks, Check.warning("one.check", "first detail"),
              Check.warning("two.check", "second detail")]
    warned = report.model_copy(update={"checks": checks, "warnings": 2})
    assert warned.strict_message() == ("--strict: 2 warning(s) count as failures: one.check: "
                                       "first detail; two.check: second detail")
