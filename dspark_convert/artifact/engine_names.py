"""The consumers an artifact's engine reports name (artifact/engines.py holds their rules).

A module of its own, importing neither pydantic nor gguf, so that the CLI can offer the
names (`validate --require`) without paying for the rules at `dspark --help`.
"""

from __future__ import annotations

from typing import Literal, get_args

EngineName = Literal["strata.open", "strata.run", "llama.cpp"]
ENGINES: tuple[str, ...] = get_args(EngineName)
