"""`dspark eval`: the target alone, DFlash and DSpark drafters on the same prompts, the
static confidence cutoff, DeepSpec's confidence metrics and Sequential Temperature Scaling.

- ``prompts``: the JSONL prompt set (strict schema) and the default golden set;
- ``metrics``: acceptance numbers, per-step time spreads, peak memory, and DeepSpec's
  per-position confidence metrics (ECE, AUROC, Brier, reliability);
- ``calibration``: STS, calibration.json, its loader and the temperature scaling itself;
- ``environment``: the target's identity and the machine;
- ``run``: ``run_eval(...) -> EvalReport`` (the CLI is a thin layer over it);
- ``report``: the report models, report.md, ``write_report(report, out_dir)``;
- ``plots``: the PNGs.

Nothing here is imported by ``dspark --help``; ``run`` imports torch when it runs.
"""
