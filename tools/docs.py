"""Generated sections of docs/ARTIFACT_FORMAT.md and README.md, from the same tables the
writer and the validator use.

    python tools/docs.py            # rewrite the generated sections
    python tools/docs.py --check    # exit 1 if a generated section is stale
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from dspark_convert.artifact.format import METADATA_KEYS
from dspark_convert.errors import concrete_errors
from generated import generator_main  # tools/generated.py, beside this script
from dspark_convert.contract.tensor_table import SYMBOLS, TENSOR_RULES, pretty_dim

ROOT = Path(__file__).resolve().parent.parent
WHEN_TEXT = {"always": "always", "hub": "Hub source only", "markov": "markov_rank > 0",
             "confidence": "with a confidence head", "embed": "source has embed_tokens",
             "lm_head": "source has lm_head", "embedding": "optional; hashed, never written",
             "gated": "gated Markov head", "rnn": "rnn Markov head",
             "quantized": "quantized artifacts only (`dspark quantize`)"}


def metadata_table() -> str:
    rows = ["| key | GGUF type | present | value |", "|---|---|---|---|"]
    for key in METADATA_KEYS:
        gtype = key.type.name + (f"[{key.sub_type.name}]" if key.sub_type else "")
        rows.append(f"| `{key.key}` | {gtype} | {WHEN_TEXT[key.when]} | {key.doc} |")
    return "\n".join(rows)


def tensor_table() -> str:
    rows = ["| GGUF name | source name | torch shape | GGUF shape | kind | present |",
            "|---|---|---|---|---|---|"]
    for rule in TENSOR_RULES:
        torch_shape = ", ".join(pretty_dim(e) for e in rule.shape)
        gguf_shape = ", ".join(pretty_dim(e) for e in reversed(rule.shape))
        gguf = f"`{rule.gguf.replace('{i}', 'N')}`" if rule.gguf else "(not written)"
        source = f"`{rule.source.replace('{i}', 'N')}`"
        rows.append(f"| {gguf} | {source} | [{torch_shape}] | [{gguf_shape}] | {rule.kind} | {WHEN_TEXT[rule.when]} |")
    rows.append("")
    rows.append("Symbols: " + "; ".join(f"`{k}` = {v}" for k, v in SYMBOLS.items()) + ".")
    return "\n".join(rows)


def exit_code_table() -> str:
    entries = [(0, "-", "success"), (2, "usage", "bad command-line options (typer/click)")]
    entries += [(c.exit_code, f"`{c.__name__}`", " ".join((c.__doc__ or "").split()))
                for c in concrete_errors()]
    rows = ["| code | error | meaning |", "|---|---|---|"]
    rows += [f"| {code} | {name} | {doc} |" for code, name, doc in sorted(entries)]
    rows.append("| 130 / 143 | - | interrupted by SIGINT / SIGTERM; nothing was written |")
    return "\n".join(rows)


SECTIONS = {
    "docs/ARTIFACT_FORMAT.md": {"metadata": metadata_table, "tensors": tensor_table},
    "README.md": {"exit-codes": exit_code_table},
}


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
    for rel, sections in SECTIONS.items():
        path = ROOT / rel
        text = path.read_text()
        if _render(text, sections) != text:
            out.append(rel)
    return out


def write() -> None:
    for rel, sections in SECTIONS.items():
        path = ROOT / rel
        path.write_text(_render(path.read_text(), sections))


def main() -> int:
    return generator_main("the generated doc sections", stale, write,
                          "python tools/docs.py (make docs)")


if __name__ == "__main__":
    sys.exit(main())
