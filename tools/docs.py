"""Generated sections of the docs, from the code they describe: docs/ARTIFACT_FORMAT.md's
tables from the same tables the writer and the validator use, docs/EXIT_CODES.md from
errors.py (and tools/raisers.py's scan of which commands raise each class),
docs/BAD_INPUTS.md's limits from the constants the readers check, and docs/CLI.md from the
typer app (tools/cli_docs.py).

    python tools/docs.py            # rewrite the generated sections
    python tools/docs.py --check    # exit 1 if a generated section is stale
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from dspark_convert.artifact.format import (ASSISTANT_METADATA_KEYS, DFLASH2_METADATA_KEYS,
                                            METADATA_KEYS)
from dspark_convert.errors import concrete_errors
import cli_docs  # tools/cli_docs.py, beside this script
import raisers  # tools/raisers.py, beside this script
from generated import generator_main  # tools/generated.py, beside this script
from dspark_convert.contract.tensor_table import (ASSISTANT_TENSOR_RULES, DFLASH2_TENSOR_RULES,
                                                  GEMMA4_TENSOR_RULES, SYMBOLS, TENSOR_RULES,
                                                  pretty_dim)

ROOT = Path(__file__).resolve().parent.parent
WHEN_TEXT = {"always": "always", "hub": "Hub source only", "markov": "markov_rank > 0",
             "confidence": "with a confidence head", "embed": "source has embed_tokens",
             "lm_head": "source has lm_head", "embedding": "optional; hashed, never written",
             "gated": "gated Markov head", "rnn": "rnn Markov head",
             "quantized": "quantized artifacts only (`dspark quantize`)",
             "gemma4": "gemma4-dspark artifacts only", "softcap": "gemma4-dspark, softcap not null",
             "v_proj": "without attention_k_eq_v",
             "sliding": "with sliding_attention layers", "full": "with full_attention layers"}


def metadata_table(keys=METADATA_KEYS) -> str:
    rows = ["| key | GGUF type | present | value |", "|---|---|---|---|"]
    for key in keys:
        gtype = key.type.name + (f"[{key.sub_type.name}]" if key.sub_type else "")
        rows.append(f"| `{key.key}` | {gtype} | {WHEN_TEXT[key.when]} | {key.doc} |")
    return "\n".join(rows)


def tensor_table(rules=TENSOR_RULES) -> str:
    rows = ["| GGUF name | source name | torch shape | GGUF shape | kind | present |",
            "|---|---|---|---|---|---|"]
    for rule in rules:
        torch_shape = ", ".join(pretty_dim(e) for e in rule.shape)
        gguf_shape = ", ".join(pretty_dim(e) for e in reversed(rule.shape))
        gguf = f"`{rule.gguf.replace('{i}', 'N')}`" if rule.gguf else "(not written)"
        source = f"`{rule.source.replace('{i}', 'N')}`"
        rows.append(f"| {gguf} | {source} | [{torch_shape}] | [{gguf_shape}] | {rule.kind} | {WHEN_TEXT[rule.when]} |")
    rows.append("")
    rows.append("Symbols: " + "; ".join(f"`{k}` = {v}" for k, v in SYMBOLS.items()) + ".")
    return "\n".join(rows)


def exit_code_table() -> str:
    every = "every command"
    by = raisers.raised_by()
    entries = [(0, "-", "success", every), (2, "usage", "bad command-line options (typer/click)", every)]
    for c in concrete_errors():
        commands = by[c.__name__]
        shown = every if c.__name__ == "InternalError" else (
            ", ".join(f"`{name}`" for name in commands) or "none yet")
        entries.append((c.exit_code, f"`{c.__name__}`", " ".join((c.__doc__ or "").split()), shown))
    rows = ["| code | error | meaning | raised by |", "|---|---|---|---|"]
    rows += [f"| {code} | {name} | {doc} | {shown} |" for code, name, doc, shown in sorted(entries)]
    rows.append(f"| 130 / 143 | - | interrupted by SIGINT / SIGTERM: nothing was written, or, once "
                "an output was published, the line names it, in place and whole "
                f"(cli/errors.interrupt_line) | {every} |")
    return "\n".join(rows)


def _runs(codes: list[int]) -> str:
    """Sorted codes as their contiguous runs: 60-68, 154, 155."""
    out, start = [], None
    for i, code in enumerate(codes):
        if start is None:
            start = code
        if i + 1 == len(codes) or codes[i + 1] != code + 1:
            out.append(str(start) if code == start else
                       f"{start}, {code}" if code == start + 1 else f"{start}-{code}")
            start = None
    return ", ".join(out)


def exit_code_families_table() -> str:
    """Each family of refusals (a class directly under DSparkError) with its `kind` (the
    --json error object's) and its codes: what a range of codes in prose must agree with
    (tests/test_docs_facts.py)."""
    from dspark_convert import errors

    families: dict[type, list[int]] = {}
    for c in concrete_errors():
        if c.__name__ == "InternalError":
            continue
        base = next(b for b in c.__mro__ if errors.DSparkError in b.__bases__)
        families.setdefault(base, []).append(c.exit_code)
    rows = ["| family | `kind` | codes |", "|---|---|---|"]
    for base, codes in sorted(families.items(), key=lambda item: min(item[1])):
        rows.append(f"| `{base.__name__}` | `{base.kind}` | {_runs(sorted(codes))} |")
    return "\n".join(rows)


# The limits that bound what an input may declare (docs/BAD_INPUTS.md):
# (module, constant, what it bounds). Read from the code, so the table cannot drift.
LIMITS = [
    ("dspark_convert.formats.safetensors", "MAX_HEADER_BYTES", "bytes of one safetensors JSON header (the library's own cap)"),
    ("dspark_convert.formats.safetensors", "MAX_HEADER_TENSORS", "tensors in one safetensors header"),
    ("dspark_convert.formats.safetensors", "MAX_HEADER_ITEMS", "JSON values in one safetensors header, counted before parsing"),
    ("dspark_convert.formats.safetensors", "MAX_INDEX_ITEMS", "JSON values in model.safetensors.index.json"),
    ("dspark_convert.util.strict_json", "MAX_CONFIG_BYTES", "bytes of config.json, manifest.json, a lock file, a trace"),
    ("dspark_convert.util.strict_json", "MAX_VERBATIM_DEPTH", "nesting of a config kept verbatim in manifest.json"),
    ("dspark_convert.util.text", "MAX_INT_DIGITS", "digits of an integer in an option, a JSON file or the gate's TOML policy"),
    ("dspark_convert.contract.dspark", "MAX_DRAFT_LAYERS", "draft layers (Strata's limit)"),
    ("dspark_convert.contract.dspark", "MAX_BLOCK_SIZE", "block size (Strata's limit)"),
    ("dspark_convert.contract.dspark", "MAX_TARGET_TAPS", "target layer taps (Strata's limit)"),
    ("dspark_convert.formats.gguf_reader", "MAX_TENSORS", "tensors in drafter.gguf"),
    ("dspark_convert.formats.gguf_reader", "MAX_KV_PAIRS", "metadata keys in drafter.gguf"),
    ("dspark_convert.formats.gguf_reader", "MAX_KEY_LENGTH", "bytes of a metadata key or tensor name"),
    ("dspark_convert.formats.gguf_reader", "MAX_STRING_LENGTH", "bytes of one metadata string"),
    ("dspark_convert.formats.gguf_reader", "MAX_ARRAY_LENGTH", "elements of one metadata array"),
    ("dspark_convert.formats.gguf_reader", "MAX_ARRAYS", "metadata arrays in one file (nested ones included)"),
    ("dspark_convert.formats.gguf_reader", "MAX_DECODED_BYTES", "memory all decoded metadata may take"),
    ("dspark_convert.formats.gguf_reader", "MAX_DIMS", "dimensions of a tensor"),
    ("dspark_convert.target.tokenizer", "MAX_TOKENIZER_BYTES", "bytes of the target's tokenizer.json"),
    ("dspark_convert.target.tokenizer", "MAX_TOKENIZER_ITEMS", "JSON values in tokenizer.json, counted before the library parses it"),
    ("dspark_convert.target.tokenizer", "MAX_TOKENIZER_TOKENS", "tokens in the target's tokenizer"),
    ("dspark_convert.evaluation.prompts", "MAX_PROMPT_FILE_BYTES", "bytes of `eval`'s prompt set"),
    ("dspark_convert.evaluation.prompts", "MAX_PROMPT_LINE_BYTES", "bytes of one line of the prompt set"),
    ("dspark_convert.evaluation.prompts", "MAX_PROMPTS", "prompts in the prompt set"),
    ("dspark_convert.runtime.trace", "MAX_REFERENCE_RUNS", "runs in `smoke --reference`'s reference.json"),
    ("dspark_convert.evaluation.conform", "MAX_TRACE_BYTES", "bytes of `conform`'s trace of an engine's drafts"),
    ("dspark_convert.evaluation.conform", "MAX_TRACE_LINE_BYTES", "bytes of one line of that trace"),
    ("dspark_convert.evaluation.conform", "MAX_TRACE_LINES", "drafts (lines) in that trace"),
    ("dspark_convert.scheduling.decisions", "MAX_DECISIONS_BYTES", "bytes of a decisions.jsonl (`simulate`)"),
    ("dspark_convert.scheduling.decisions", "MAX_DECISIONS_LINE_BYTES", "bytes of one line (one verify step) of decisions.jsonl"),
    ("dspark_convert.scheduling.decisions", "MAX_DECISIONS_LINES", "verify steps (lines) in decisions.jsonl"),
    ("dspark_convert.util.paths", "NAME_MAX", "bytes of one path component"),
    ("dspark_convert.util.paths", "PATH_MAX", "bytes of a whole path (exclusive)"),
    ("dspark_convert.commands.inspection", "MAX_UNEXPECTED_ROWS", "unexpected tensors `inspect` lists (the rest are counted)"),
]


def limits_table() -> str:
    import importlib

    rows = ["| limit | value | bounds | where |", "|---|---|---|---|"]
    for module, name, what in LIMITS:
        value = getattr(importlib.import_module(module), name)
        rows.append(f"| `{name}` | {value:,} | {what} | `{module.replace('.', '/')}.py` |")
    rows.append("")
    rows.append("Also checked before anything is sized by them: a target's layer count against "
                "the layers its headers hold; a prompt's text against what the context can hold "
                "(its length in tokens times the tokenizer's longest token) before it is "
                "encoded, and the prompt plus `--max-new-tokens` against the target's "
                "`max_position_embeddings` (`smoke` 73, `eval` 90); the memory estimate of "
                "`smoke` and `eval` against what the device has (78).")
    return "\n".join(rows)


def kind_keys_table(module: str) -> str:
    """The keys a DFlash2 or assistant export writes, in file order (artifact/llama_cpp_dflash2.py
    and llama_cpp_assistant.py ``key_doc_rows``, the tables the writer uses)."""
    import importlib

    rows = ["| key | type | what it holds |", "|---|---|---|"]
    rows += [f"| `{key}` | {gtype} | {doc} |"
             for key, gtype, doc in importlib.import_module(module).key_doc_rows()]
    return "\n".join(rows)


def llama_cpp_export_table() -> str:
    """What `dspark export --engine llama.cpp` writes (artifact/llama_cpp.py)."""
    from dspark_convert.artifact import llama_cpp

    rows = ["| key | GGUF type | value |", "|---|---|---|"]
    rows += [f"| `{key}` | {gtype} | {doc} |" for key, gtype, doc in llama_cpp.key_doc_rows()]
    rows.append("")
    rows.append("Tensors: the artifact's, in its order, names and GGUF shapes unchanged; 1-D "
                f"tensors of kind {' and '.join(llama_cpp.F32_KINDS)} widened from BF16 to F32, "
                "every other tensor copied as it is (BF16, or the Q8_0/Q5_0/Q4_0 of a quantized "
                f"artifact). With `--keep-embedding` the target GGUF's `{llama_cpp.TARGET_EMBEDDING}` "
                "first, as it is in the target GGUF.")
    return "\n".join(rows)


def _cell(text: str | None) -> str:
    return "-" if text is None else text.replace("|", "\\|")


def speculators_fields_table() -> str:
    """config.json in DeepSpec's and speculators' formats (contract/speculators.FIELDS)."""
    from dspark_convert.contract.speculators import FIELDS

    rows = ["| DeepSpec `config.json` | speculators `config.json` | rule |", "|---|---|---|"]
    for r in FIELDS:
        deepspec = f"`{r.deepspec}`" if r.deepspec and " " not in r.deepspec else _cell(r.deepspec)
        spec = f"`{r.speculators}`" if r.speculators else "-"
        rows.append(f"| {deepspec} | {spec} | {_cell(r.rule)} |")
    return "\n".join(rows)


def speculators_keys_table() -> str:
    """The weights in both formats (contract/speculators.KEYS)."""
    from dspark_convert.contract.speculators import KEYS

    rows = ["| DeepSpec weight | speculators weight | rule |", "|---|---|---|"]
    for r in KEYS:
        deepspec = f"`{r.deepspec}`" if r.deepspec and " " not in r.deepspec else _cell(r.deepspec)
        spec = f"`{r.speculators}`" if r.speculators and " " not in r.speculators else \
            _cell(r.speculators)
        rows.append(f"| {deepspec} | {spec} | {_cell(r.rule)} |")
    return "\n".join(rows)


def misreadings_table() -> str:
    """`dspark conform --diagnose`'s misreadings (evaluation/misreadings.MISREADINGS)."""
    from dspark_convert.evaluation.misreadings import MISREADINGS

    rows = ["| id | what the engine does | seen | fix | families |", "|---|---|---|---|---|"]
    for m in MISREADINGS:
        rows.append(f"| `{m.id}` | {_cell(m.what)} | {_cell(m.seen)} | {_cell(m.fix)} | "
                    f"{', '.join(m.families)} |")
    return "\n".join(rows)


# --- README.md: what each drafter kind goes through, by command and engine ---------------------

# Each family's row label (contract/families.py's FAMILIES; a family without one is an error).
KIND_LABELS = {"qwen3-dspark": "DSpark, DFlash (Qwen3; DeepSeek)",
               "gemma4-dspark": "DSpark, DFlash (Gemma 4; DeepSeek)",
               "qwen3-dflash2": "DFlash2 (Qwen3; speculators, z-lab)",
               "gemma4-assistant": "Gemma 4 assistant (MTP)"}
# Which families Strata's DFlash loader opens (artifact/engines.py's STRATA_OPEN_RULES: plain
# DFlash only; tests/test_readme.py runs the rules on each golden artifact to hold this).
STRATA_OPENS = {"qwen3-dspark": "dflash"}


def drafter_kinds_table() -> str:
    """README.md's family x command x engine table: a cell is ✓ when the command takes the
    family (contract/families.py's artifact_commands), else the exit code of the class it
    refuses it with (commands/binding.refuse_family's table; export --engine speculators
    raises FamilyExportError itself, commands/export_speculators._refuse); eval --engine
    lists a drafter it does not hand the engine as not run (commands/evaluate.engine_kinds)."""
    from dspark_convert.artifact import llama_cpp as L
    from dspark_convert.commands import binding, evaluate
    from dspark_convert.contract.families import FAMILIES
    from dspark_convert.contract.speculators import SPECULATORS_VERSION
    from dspark_convert.errors import (EngineConfidenceHeadError, EngineMarkovHeadError,
                                       EngineRequirementError, FamilyExportError,
                                       QuantizedExportError)
    from dspark_convert.evaluation.engine_dspark_mlx import DSPARK_MLX

    refusals = {c: error.exit_code for c, (error, _why) in binding._FAMILY_REFUSALS.items()}
    refusals["export-speculators"] = FamilyExportError.exit_code

    def cell(family, command: str) -> str:
        return "✓" if command in family.artifact_commands else str(refusals[command])

    def engine_eval(family, engine: str, export: str, dspark_note: str = "") -> str:
        taken = family.kind in evaluate.engine_kinds(engine) and export in family.artifact_commands
        return ("✓" + (dspark_note if family.kind == "dspark" else "")) if taken else "not run¹"

    def strata(family) -> str:
        opens = STRATA_OPENS.get(family.name)
        code = EngineRequirementError.exit_code
        return f"✓ plain DFlash; DSpark heads {code}" if opens == "dflash" else str(code)

    heads = f"{EngineMarkovHeadError.exit_code}, {EngineConfidenceHeadError.exit_code}²"
    rows = ["| drafter kind (family) | convert, validate, inspect | quantize | smoke, eval | "
            "conform | Strata: `validate --require strata.open` | llama.cpp "
            f"{L.LLAMA_CPP_COMMIT}: `export` | llama.cpp: `eval --engine` | DeepSpec layout: "
            f"`export --engine deepspec` | dspark-mlx {DSPARK_MLX}: `eval --engine` | "
            f"speculators {SPECULATORS_VERSION}: `export --engine speculators` |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for family in FAMILIES.values():
        smoke_eval = {cell(family, "smoke"), cell(family, "eval")}
        llama = cell(family, "export")
        if llama == "✓" and family.kind == "dspark":
            llama = f"✓ (heads: {heads})"
        rows.append(
            f"| {KIND_LABELS[family.name]} `{family.name}` | ✓ | {cell(family, 'quantize')} | "
            f"{' / '.join(sorted(smoke_eval))} | {cell(family, 'conform')} | {strata(family)} | "
            f"{llama} | {engine_eval(family, L.ENGINE, 'export')} | "
            f"{cell(family, 'export-deepspec')} | "
            f"{engine_eval(family, 'dspark-mlx', 'export-deepspec', ' (heads³)')} | "
            f"{cell(family, 'export-speculators')} |")
    rows += ["",
             "¹ not handed to the engine: report.md lists the drafter as not run, with the "
             "reason. "
             f"² refused: a gated or rnn Markov head ({EngineMarkovHeadError.exit_code}), a "
             f"confidence head without Markov input ({EngineConfidenceHeadError.exit_code}); "
             f"llama.cpp {L.LLAMA_CPP_COMMIT} implements the vanilla head only, and its eval "
             f"lists such a drafter as not run. ³ dspark-mlx {DSPARK_MLX}'s loader refuses a "
             "gated or rnn head's weights: listed as not run. A quantized artifact has no "
             f"DeepSpec or speculators form ({QuantizedExportError.exit_code}): export the BF16 "
             "artifact it was made from."]
    return "\n".join(rows)


SECTIONS = {
    "docs/CONFORMANCE.md": {"misreadings": misreadings_table},
    "docs/ARTIFACT_FORMAT.md": {"metadata": metadata_table, "tensors": tensor_table,
                                "gemma4-tensors": lambda: tensor_table(GEMMA4_TENSOR_RULES),
                                "dflash2-metadata": lambda: metadata_table(DFLASH2_METADATA_KEYS),
                                "dflash2-tensors": lambda: tensor_table(DFLASH2_TENSOR_RULES),
                                "assistant-metadata":
                                    lambda: metadata_table(ASSISTANT_METADATA_KEYS),
                                "assistant-tensors":
                                    lambda: tensor_table(ASSISTANT_TENSOR_RULES)},
    "docs/EXIT_CODES.md": {"exit-codes": exit_code_table,
                           "exit-code-families": exit_code_families_table},
    "docs/BAD_INPUTS.md": {"limits": limits_table},
    "docs/ENGINES.md": {"llama-cpp-export": llama_cpp_export_table,
                        "llama-cpp-dflash2-keys":
                            lambda: kind_keys_table("dspark_convert.artifact.llama_cpp_dflash2"),
                        "llama-cpp-assistant-keys":
                            lambda: kind_keys_table("dspark_convert.artifact.llama_cpp_assistant")},
    "docs/SPECULATORS.md": {"speculators-fields": speculators_fields_table,
                            "speculators-keys": speculators_keys_table},
    "README.md": {"drafter-kinds": drafter_kinds_table},
}
# Pages whose generated parts depend on what the page holds (one block per command).
RENDERERS = {"docs/CLI.md": cli_docs.render}


def _page(rel: str, text: str) -> str:
    if rel in RENDERERS:
        return RENDERERS[rel](text)
    return _render(text, SECTIONS[rel])


def _render(text: str, sections: dict) -> str:
    for name, fn in sections.items():
        pattern = re.compile(rf"(<!-- BEGIN GENERATED {name} -->\n).*?(<!-- END GENERATED {name} -->)",
                             re.DOTALL)
        if not pattern.search(text):
            raise SystemExit(f"missing generated section '{name}'")
        body = fn()
        text = pattern.sub(lambda m, body=body: m.group(1) + body + "\n" + m.group(2), text)
    return text


def stale() -> list[str]:
    out = []
    for rel in [*SECTIONS, *RENDERERS]:
        text = (ROOT / rel).read_text()
        if _page(rel, text) != text:
            out.append(rel)
    return out


def write() -> None:
    for rel in [*SECTIONS, *RENDERERS]:
        path = ROOT / rel
        path.write_text(_page(rel, path.read_text()))


def main() -> int:
    return generator_main("the generated doc sections", stale, write,
                          "python tools/docs.py (make docs)")


if __name__ == "__main__":
    sys.exit(main())
