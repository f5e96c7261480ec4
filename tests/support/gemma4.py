"""Where the Gemma4 golden fixtures live (golden/reference/gemma4/, DeepSeek's own data; its
README.md gives their provenance and SHA-256s)."""

from __future__ import annotations

from support.paths import GOLDEN

GEMMA4 = GOLDEN / "reference" / "gemma4"
GEMMA4_TARGET = GEMMA4 / "target"
# DeepSpec's two drafters for the tiny gemma4_unified target: DSpark and plain DFlash.
GEMMA4_DRAFTERS = {"gemma4_vanilla_conf_markov": GEMMA4 / "gemma4_vanilla_conf_markov" / "draft",
                   "gemma4_dflash": GEMMA4 / "gemma4_dflash" / "draft"}
# The config.json DeepSpec's trainer writes (model_type gemma4_unified_text), beside each case.
GEMMA4_TRAINER_CONFIGS = {name: path.parent / "trainer_saved_config.json"
                          for name, path in GEMMA4_DRAFTERS.items()}
GEMMA4_RELEASED_CONFIG = GEMMA4 / "released_12b_config_quoted.json"
