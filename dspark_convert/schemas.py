"""JSON Schemas of the project's pydantic models, checked in under schemas/.

    python -m dspark_convert.schemas            # rewrite schemas/
    python -m dspark_convert.schemas --check    # exit 1 if schemas/ is stale (tests do this)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .contract import DSparkConfig, FeatureContract
from .manifest import Manifest

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"


def _models() -> dict:
    from .inspect import InspectResult
    from .validate import ValidationReport

    return {
        "dspark-config.schema.json": DSparkConfig,
        "feature-contract.schema.json": FeatureContract,
        "manifest.schema.json": Manifest,
        "validation-report.schema.json": ValidationReport,
        "inspect-result.schema.json": InspectResult,
    }


def render() -> dict[str, str]:
    out = {}
    for name, model in _models().items():
        schema = model.model_json_schema(mode="validation")
        schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
        out[name] = json.dumps(schema, indent=2, sort_keys=False) + "\n"
    return out


def stale(directory: Path = SCHEMA_DIR) -> list[str]:
    problems = []
    for name, text in render().items():
        path = directory / name
        if not path.is_file() or path.read_text() != text:
            problems.append(name)
    known = set(render())
    problems += [p.name for p in directory.glob("*.schema.json") if p.name not in known]
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description="Write or check schemas/")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    if args.check:
        problems = stale()
        for name in problems:
            print(f"schemas/{name} is stale: run python -m dspark_convert.schemas")
        return 1 if problems else 0
    SCHEMA_DIR.mkdir(exist_ok=True)
    for name, text in render().items():
        (SCHEMA_DIR / name).write_text(text)
    print(f"wrote {len(render())} schemas to {SCHEMA_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
