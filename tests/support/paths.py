"""Where the tests' data lives: the repository and its golden fixtures (golden/). Tests read
them from here or through conftest.py, which re-exports them."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
GOLDEN = ROOT / "golden"
REFERENCE_DRAFTER = GOLDEN / "reference" / "vanilla_conf_markov" / "draft"
GOLDEN_TARGET = GOLDEN / "reference" / "target"
# The two drafters DeepSpec trained for the golden target: DSpark and plain DFlash.
TRAINED_DRAFTERS = {"vanilla_conf_markov": GOLDEN / "reference" / "vanilla_conf_markov" / "draft",
                    "dflash_shared": GOLDEN / "reference" / "dflash_shared" / "draft"}
# DeepSpec's own trace of the reference drafter on the golden target, and its prompts.
REFERENCE_TRACE = GOLDEN / "reference" / "vanilla_conf_markov" / "reference.json"
REFERENCE_PROMPTS = json.loads(REFERENCE_TRACE.read_text())["prompts"]
EXPECTED = json.loads((GOLDEN / "expected.json").read_text())


def golden_source(name: str) -> Path:
    return GOLDEN / EXPECTED[name]["source"]
