"""JSON Schemas of the project's pydantic models, checked in under schemas/.

    python tools/schemas.py            # rewrite schemas/
    python tools/schemas.py --check    # exit 1 if schemas/ is stale (tests do this)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dspark_convert.contract.dspark import DSparkConfig, FeatureContract
from generated import generator_main  # tools/generated.py, beside this script
from dspark_convert.artifact.manifest import Manifest

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"


def _models() -> dict:
    from dspark_convert.commands.inspection import InspectResult
    from dspark_convert.source.hub.lockfile import LockFile
    from dspark_convert.commands.validate import ValidationReport
    from dspark_convert.evaluation.calibration import CalibrationFile
    from dspark_convert.evaluation.report import EvalReport
    from dspark_convert.commands.gate_policy import Policy
    from dspark_convert.commands.gate_report import GateReport
    from dspark_convert.commands.conform import ConformResult
    from dspark_convert.evaluation.conform import TraceRecord
    from dspark_convert.scheduling.cost_table import CostTable
    from dspark_convert.scheduling.decisions import DecisionLine
    from dspark_convert.commands.simulate import SimulateReport
    from dspark_convert.evaluation.serve_report import ServeBenchReport

    return {
        "dspark-config.schema.json": DSparkConfig,
        "feature-contract.schema.json": FeatureContract,
        "manifest.schema.json": Manifest,
        "validation-report.schema.json": ValidationReport,
        "inspect-result.schema.json": InspectResult,
        "lockfile.schema.json": LockFile,
        "eval-report.schema.json": EvalReport,
        "calibration.schema.json": CalibrationFile,
        "gate-policy.schema.json": Policy,
        "gate-report.schema.json": GateReport,
        "conform-trace.schema.json": TraceRecord,
        "conform-report.schema.json": ConformResult,
        "cost_table.schema.json": CostTable,
        "decisions.schema.json": DecisionLine,
        "simulate-report.schema.json": SimulateReport,
        "serve_bench_report.schema.json": ServeBenchReport,
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


def write(directory: Path = SCHEMA_DIR) -> None:
    directory.mkdir(exist_ok=True)
    for name, text in render().items():
        (directory / name).write_text(text)


def main() -> int:
    return generator_main("schemas/", lambda: [f"schemas/{n}" for n in stale()], write,
                          "python tools/schemas.py (make schemas)")


if __name__ == "__main__":
    sys.exit(main())
