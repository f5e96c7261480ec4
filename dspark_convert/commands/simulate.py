"""`dspark simulate RECORDING --cost-table cost.json`: the verify-length policies replayed
on recorded confidences and a cost table, without a model (scheduling/simulate.py), or
(``--check POLICY``) a scheduler's recorded decisions against the policy they claim
(scheduling/scheduler_check.py). docs/SCHEDULING.md says what each mode assumes.

The recording is a decisions file (decisions.jsonl, scheduling/decisions.py) or a smoke/eval
trace (DeepSpec's reference.json format, runtime/trace.py), read here as decisions of policy
``full`` at concurrency 1: each run of full-block proposals (confidence_threshold 0) one
request, each of its cycles one step, confidence = sigmoid(logit) in float64. Runs cut by a
threshold are left out (counted): a cut block says nothing of the tokens after the cut.

Order, as every command: the options (140 a policy, 148 a concurrency list), the report's
path (the one output rule, 30-32), the recording (146; a trace 77), the cost table (141),
then the work (140 a policy needing confidences a line lacks, 142 a step the table does not
reach). Nothing is written on a refusal; a check that fails still writes its report (-o).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from dspark_convert.errors import (ConcurrencyError, DecisionsError, SchedulerMismatchError,
                                   SchedulingPolicyError)
from dspark_convert.scheduling.cost_table import read_cost_table
from dspark_convert.scheduling.decisions import (Decisions, RequestDecision, decision_line,
                                                 read_decisions)
from dspark_convert.scheduling.policies import Policy, parse_policy
from dspark_convert.scheduling.scheduler_check import (SchedulerCheck, check_decisions,
                                                       mismatch_error)
from dspark_convert.scheduling.simulate import Figures, parse_concurrency, replay, sweep
from dspark_convert.util.atomic import Output, atomic_file, check_outputs
from dspark_convert.util.json_out import dumps
from dspark_convert.util.paths import check_input_file, check_path, open_regular
from dspark_convert.util.strict_json import MAX_CONFIG_BYTES, loads_strict


class SimulateReport(BaseModel):
    """What `dspark simulate` found (report.json with -o; --json prints it)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    recording: str
    kind: str                          # "decisions" or "trace"
    runs_used: int | None              # a trace: its runs of full-block proposals
    runs_left_out: int | None          # a trace: its runs cut by a confidence threshold
    recorded_policy: str
    recorded_steps: int
    cost_table: str
    mode: str                          # replay, sweep or check
    figures: list[Figures]             # per policy (and concurrency); empty for --check
    check: SchedulerCheck | None       # --check


def sigmoid(logit: float) -> float:
    """1 / (1 + e^-x) in float64, without overflow for a logit of either sign."""
    if logit >= 0:
        return 1.0 / (1.0 + math.exp(-logit))
    e = math.exp(logit)
    return e / (1.0 + e)


def _is_trace(path) -> bool:
    """Whether the file is one JSON object with ``runs`` (a smoke/eval trace) rather than
    decisions.jsonl; only a file within a trace's bound is tried, and anything else is left
    to the decisions reader, which says what is wrong with it."""
    try:
        if os.stat(path).st_size > MAX_CONFIG_BYTES:
            return False
        with open_regular(path, label=str(path), error=DecisionsError) as fh:
            doc = loads_strict(fh.read(MAX_CONFIG_BYTES + 1).decode("utf-8"))
    except (OSError, ValueError, RecursionError, DecisionsError):
        return False
    return isinstance(doc, dict) and "runs" in doc and "step" not in doc


def trace_decisions(path) -> tuple[Decisions, int, int]:
    """A smoke/eval trace as decisions (module docstring); with the runs used and left out.
    ReferenceTraceError (77) for a trace the runtime's reader refuses, DecisionsError for a
    cycle that is no verify step (accepted above the tokens proposed) or no full-block run."""
    from dspark_convert.runtime.trace import load_reference

    label = f"trace {path}"
    runs = load_reference(path)
    used = [run for run in runs if run.confidence_threshold <= 0.0]
    lines = []
    for run in used:
        for j, cycle in enumerate(run.data["cycles"]):
            logits = cycle["confidence_logits"] or []
            try:
                request = RequestDecision(id=f"run{run.index}",
                                          confidence=tuple(sigmoid(x) for x in logits),
                                          length=len(cycle["proposed"]),
                                          accepted=cycle["accepted"])
            except ValueError as exc:       # pydantic's ValidationError
                why = " ".join(str(exc).split())[:200]
                raise DecisionsError(f"{label}: runs[{run.index}].cycles[{j}]: not a verify "
                                     f"step: {why}", path=str(path),
                                     field=f"runs[{run.index}].cycles[{j}]") from None
            lines.append(decision_line(len(lines), "full", [request]))
    if not lines:
        raise DecisionsError(f"{label}: no cycle of a full-block proposal (a run with "
                             "confidence_threshold 0 and at least one cycle); expected one",
                             path=str(path), field="runs", expected="a full-block run",
                             found="none")
    return (Decisions(path=str(path), policy=Policy("full"), lines=tuple(lines)), len(used),
            len(runs) - len(used))


def _options(policies: Sequence[str], concurrency: str | None, check: str | None
             ) -> tuple[list[Policy], tuple[int, ...] | None, Policy | None]:
    chosen = [parse_policy(p) for p in policies]
    levels = parse_concurrency(concurrency) if concurrency is not None else None
    checked = parse_policy(check) if check is not None else None
    if checked is not None and chosen:
        raise SchedulingPolicyError("--check and --policy: expected one of them (--check "
                                    "checks the recording against its one policy)",
                                    field="--policy", expected="--check or --policy",
                                    found="both")
    if checked is not None and levels is not None:
        raise ConcurrencyError("--concurrency with --check: expected no concurrency (a check "
                               "is of the recorded steps as they were)", field="--concurrency",
                               expected="no --concurrency with --check", found=concurrency)
    return chosen, levels, checked


def run_simulate(recording: str | os.PathLike, *, cost_table: str | os.PathLike,
                 policies: Sequence[str] = (), concurrency: str | None = None,
                 check: str | None = None, output: str | None = None,
                 force: bool = False) -> SimulateReport:
    """Replay (no ``concurrency``), sweep (``concurrency``: "1,4,16") or check (``check``)
    ``recording`` on ``cost_table`` (module docstring). ``policies``: their spellings;
    none: the recorded policy. ``output``: report.json, written atomically (also when a
    check fails: ``simulate_failure`` says)."""
    chosen, levels, checked = _options(policies, concurrency, check)
    check_path(recording, what="the recording", error=DecisionsError)
    if output is not None:
        check_outputs([Output(output, "the report", directory=False)],
                      [(recording, "the recording"), (cost_table, "the cost table")],
                      force=force)
    path = check_input_file(recording, label=f"decisions {recording}", error=DecisionsError,
                            expected="a decisions.jsonl file or a smoke/eval trace")
    used = left_out = None
    if _is_trace(path):
        decisions, used, left_out = trace_decisions(path)
    else:
        decisions = read_decisions(path)
    costs = read_cost_table(cost_table)

    figures: list[Figures] = []
    result = None
    if checked is not None:
        result = check_decisions(decisions, checked, costs)
    else:
        for policy in chosen or [decisions.policy]:
            if levels is None:
                figures.append(replay(decisions, policy, costs))
            else:
                figures.extend(sweep(decisions, policy, costs, r) for r in levels)
    report = SimulateReport(
        recording=str(recording), kind="decisions" if used is None else "trace",
        runs_used=used, runs_left_out=left_out, recorded_policy=str(decisions.policy),
        recorded_steps=len(decisions.lines), cost_table=str(cost_table),
        mode="check" if checked is not None else ("replay" if levels is None else "sweep"),
        figures=figures, check=result)
    if output is not None:
        text = dumps(report, indent=2) + "\n"        # before the file is opened: NaN refused
        atomic_file(output, lambda fh: fh.write(text.encode()), force=force)
    return report


def simulate_failure(report: SimulateReport) -> SchedulerMismatchError | None:
    """The one line of a --check that found a difference (147); None otherwise."""
    if report.check is None:
        return None
    return mismatch_error(report.check, path=report.recording)
