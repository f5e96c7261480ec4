"""`dspark serve-bench`'s report: ``ServeBenchReport`` (report.json), report.md, its two
plots, and writing the report directory (docs/SCHEDULING.md "Sweeping: dspark serve-bench").

``write_serve_report`` builds the whole directory in a hidden temporary sibling
(util/atomic ``atomic_directory``) and renames it into place: ``report.json``,
``report.md``, ``throughput.png`` and ``per_request.png`` (one line per policy against
concurrency, the target alone included), ``decisions/<artifact>.<policy>.c<R>.jsonl`` (one
file per run, written through scheduling/decisions.py) and, when the sweep profiled the
target, ``cost_table.json``. An interrupted or failed write leaves nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from dspark_convert.evaluation.calibration import AppliedCalibration
from dspark_convert.evaluation.cells import md_cell
from dspark_convert.evaluation.environment import Environment, TargetIdentity
from dspark_convert.evaluation.prompts import PromptSetInfo
from dspark_convert.scheduling.cost_table import CostTable, write_cost_table
from dspark_convert.scheduling.decisions import DecisionLine, dump_line
from dspark_convert.util.atomic import atomic_directory, write_error
from dspark_convert.util.json_out import dumps
from dspark_convert.util.models import VersionOne

REPORT_FORMAT = "dspark-serve-bench-report"
REPORT_VERSION = 1
TARGET_ONLY = "target-only"
DECISIONS_DIR = "decisions"
COST_TABLE_FILE = "cost_table.json"
THROUGHPUT_PLOT = "throughput.png"
PER_REQUEST_PLOT = "per_request.png"

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class RequestOutput(BaseModel):
    """One request of a run: what it generated, and whether it is the target's own."""

    model_config = _FROZEN

    id: str = Field(description="The prompt's id.")
    output_ids: list[int] = Field(description="The new tokens (the prompt excluded).")
    sha256: str = Field(description="SHA-256 of the output ids written as a compact JSON "
                        "list (`[1,2,3]`, no spaces).")
    equal_to_target_only: bool | None = Field(
        description="At temperature 0: whether output_ids equal the target-only run's at the "
        "same concurrency; null at temperature > 0 (samples differ) and for target-only.")


class ServeRun(BaseModel):
    """One run: an artifact under a policy at a concurrency (or the target alone), every
    prompt served; its figures."""

    model_config = _FROZEN

    artifact: str | None = Field(description="The artifact's name in this report; null for "
                                 "target-only.")
    policy: str = Field(description="The policy as str(Policy) spells it.")
    concurrency: int
    requests: list[RequestOutput]
    new_tokens: int = Field(description="New tokens of every request.")
    verify_steps: int
    total_seconds: float
    verify_seconds: float = Field(description="Σ over the verify steps of the target's verify "
                                  "forward (device-synchronised): what a cost table predicts.")
    draft_seconds: float = Field(description="Σ over the verify steps of the drafter's pass "
                                 "(proposals, the policy, the context cells committed).")
    prefill_seconds: float = Field(description="Time in the requests' prefills.")
    tokens_per_second: float | None = Field(
        description="new_tokens / total_seconds: the throughput of the whole run.")
    per_request_tokens_per_second: float | None = Field(
        description="Mean over requests of the tokens after the first / (finished - first "
        "token): each request's decoding speed once it has its first token (that token's wait "
        "is time_to_first_token); requests of one token left out; null when none is left.")
    accepted_per_step: float | None = Field(
        description="Mean acceptance length (accepted + 1, the bonus or correction token "
        "included) over every request's verify steps; null with none.")
    verify_tokens: int = Field(description="Σ B over the verify steps: every token the "
                               "target verified (anchors and drafts).")
    draft_tokens_sent: int = Field(description="Σ length: draft tokens sent for verification.")
    draft_tokens_wasted: int = Field(description="Σ (length - accepted): sent draft tokens "
                                     "the target did not accept.")
    acceptance_by_position: list[float | None] = Field(
        description="For position j = 1..gamma: the fraction of request-steps with length >= j "
        "whose accepted >= j; null where no step sent j tokens.")
    token_latency_p50_seconds: float | None = Field(
        description="Median per-token latency after a request's first token: each token a "
        "step commits gets the gap since the request's previous commit divided by the tokens "
        "that step committed (all requests pooled; numpy's linear interpolation).")
    token_latency_p99_seconds: float | None
    time_to_first_token_p50_seconds: float | None = Field(
        description="Median time from the run's start (every request arrives at 0) to a "
        "request's first token; the wait for a place in the batch counts.")
    peak_memory_bytes: int = Field(description="CUDA: torch's peak allocated bytes; CPU: the "
                                   "process's peak RSS (never decreases within a process).")
    decisions: str | None = Field(description="Its decisions file in the report directory; "
                                  "null when the run made no verify step.")
    lossless: bool | None = Field(description="At temperature 0: every request equal to the "
                                  "target-only run's; null otherwise.")


class ServeArtifact(BaseModel):
    model_config = _FROZEN

    name: str
    path: str
    drafter_gguf_sha256: str
    block_size: int
    confidence_head: bool
    calibration: AppliedCalibration | None = Field(
        description="--calibration applied to this artifact: the policies saw its "
        "calibrated confidences (sigmoid(logit / T_k)); null: the head's raw ones.")
    method: Literal["dspark", "dflash", "dflash2", "mtp"] | None = Field(
        default=None, description="The drafter's kind; null in a report written before "
        "serve-bench ran kinds other than DSpark and DFlash artifacts.")
    weights_file: str | None = Field(
        default=None, description="A checkpoint run from its source directory (DFlash2, the "
        "Gemma 4 assistant): the weights file drafter_gguf_sha256 is the SHA-256 of; null "
        "for an artifact (its drafter.gguf).")
    packed: bool = Field(
        default=True, description="true: its requests were packed into each step's batched "
        "drafter pass and verify (runtime/serving.serve: DSpark, DFlash, DFlash2); false "
        "(the Gemma 4 assistant): served one request at a time by its batch-1 loop under "
        "full only, so "
        "the concurrency bounds nothing and the run's throughput is the batch-1 loop's.")


class ServeBenchSettings(BaseModel):
    model_config = _FROZEN

    policies: list[str] = Field(description="Each artifact's policies (target-only runs once "
                                "per concurrency beside them).")
    concurrencies: list[int]
    max_new_tokens: int
    temperature: float
    seed: int
    device: str
    dtype: str
    cost_table_source: Literal["given", "profiled", "none"] = Field(
        description="given: --cost-table; profiled: measured first (cost_table.json); none: "
        "no policy needed one.")
    cost_table_path: str | None


class ServeBenchReport(BaseModel):
    model_config = _FROZEN

    format: Literal["dspark-serve-bench-report"] = REPORT_FORMAT
    version: VersionOne = REPORT_VERSION
    settings: ServeBenchSettings
    environment: Environment
    target: TargetIdentity
    prompt_set: PromptSetInfo
    artifacts: list[ServeArtifact]
    cost_table: CostTable | None
    runs: list[ServeRun]
    lossless: bool | None = Field(description="At temperature 0: every run equal to the "
                                  "target alone; null at temperature > 0.")

    def mismatches(self) -> list[tuple[int, ServeRun, RequestOutput]]:
        """(index, run, request) of every request whose output differs from the target's."""
        return [(i, run, r) for i, run in enumerate(self.runs) for r in run.requests
                if r.equal_to_target_only is False]


def decisions_name(artifact: str | None, policy: str, concurrency: int) -> str:
    """A run's decisions file, relative to the report directory: ``<artifact>.<policy>.
    c<R>.jsonl``, or ``target-only.c<R>.jsonl`` for the target alone."""
    run = policy if artifact is None else f"{artifact}.{policy}"
    return f"{DECISIONS_DIR}/{run}.c{concurrency}.jsonl"


# --- report.md ----------------------------------------------------------------------------

def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{1000 * value:.1f}"


_HEADER = ("| policy | R | tok/s | per-request tok/s | accepted/step | verify tokens | "
           "sent | wasted | latency p50/p99 ms | TTFT p50 ms | peak MiB | = target |")


def _row(run: ServeRun) -> str:
    same = {True: "yes", False: "**NO**", None: "-"}[run.lossless]
    return (f"| {md_cell(run.policy)} | {run.concurrency} | {_num(run.tokens_per_second, '.1f')} | "
            f"{_num(run.per_request_tokens_per_second, '.1f')} | "
            f"{_num(run.accepted_per_step, '.2f')} | {run.verify_tokens} | "
            f"{run.draft_tokens_sent} | {run.draft_tokens_wasted} | "
            f"{_ms(run.token_latency_p50_seconds)} / {_ms(run.token_latency_p99_seconds)} | "
            f"{_ms(run.time_to_first_token_p50_seconds)} | "
            f"{run.peak_memory_bytes / 2 ** 20:.0f} | {same} |")


def render_markdown(report: ServeBenchReport, *, plots: list[str]) -> str:
    s, env = report.settings, report.environment
    out = ["# dspark serve-bench", ""]
    bad = report.mismatches()
    if bad:
        out += [f"**LOSSLESS FAILURE: {len(bad)} request output(s) differ from the target "
                "alone at temperature 0** (a bug: speculative decoding at temperature 0 must "
                "reproduce the target's greedy output):", ""]
        out += [f"- {md_cell(run.artifact)} {md_cell(run.policy)} c{run.concurrency}: request "
                f"{md_cell(r.id)}" for _, run, r in bad[:20]]
        out.append("")
    table = {"given": f"given ({md_cell(s.cost_table_path)})",
             "profiled": f"profiled first ([{COST_TABLE_FILE}]({COST_TABLE_FILE}))",
             "none": "none (no policy needed one)"}[s.cost_table_source]
    out += [f"Target {md_cell(report.target.path)} on {md_cell(env.device)} "
            f"({md_cell(env.device_name)}), {s.dtype}, {env.torch_threads} thread(s); "
            f"{report.prompt_set.count} prompts, max {s.max_new_tokens} new tokens, "
            f"temperature {s.temperature:g}, seed {s.seed}; concurrency "
            f"{', '.join(map(str, s.concurrencies))}; cost table: {table}.", "",
            "All requests arrive at time 0 (closed loop); a finished request's place is taken "
            "at the next verify step. tok/s: all new tokens / the run's wall time; "
            "per-request tok/s: mean of each request's tokens after the first / (finished "
            "- first token); accepted/step: mean acceptance length (accepted + 1); sent / wasted: "
            "draft tokens verified / not accepted; latency: gaps between a request's "
            "consecutive tokens (the tokens one verify step commits share its time: a gap of "
            "0 is a token that came with others).", ""]
    baseline = [r for r in report.runs if r.artifact is None]
    for art in report.artifacts:
        out += [f"## {md_cell(art.name)}", "",
                f"{md_cell(art.path)}: block size {art.block_size}, confidence head "
                f"{'yes' if art.confidence_head else 'no'}, "
                f"{md_cell(art.weights_file or 'drafter.gguf')} {art.drafter_gguf_sha256[:16]}…"
                + (f"; confidences calibrated by {md_cell(art.calibration.path)} (T "
                   f"{', '.join(f'{t:g}' for t in art.calibration.temperatures)})"
                   if art.calibration is not None else "")
                + (f"; kind {art.method}" if art.method else "")
                + ("" if art.packed else "; **not packed**: served one request at a time by "
                   "its batch-1 loop (full only), so concurrency bounds nothing here"),
                "", _HEADER,
                "|" + "|".join(["---"] * (_HEADER.count("|") - 1)) + "|"]
        runs = sorted([r for r in report.runs if r.artifact == art.name] + baseline,
                      key=lambda r: (r.concurrency, r.artifact is not None))
        out += [_row(r) for r in runs]
        out.append("")
        positions = [r for r in report.runs if r.artifact == art.name and r.draft_tokens_sent]
        if positions:
            out += ["Acceptance by draft position (fraction of request-steps that sent j "
                    "tokens and had j accepted):", "",
                    "| policy | R | " + " | ".join(f"j={j}" for j in
                                                    range(1, art.block_size + 1)) + " |",
                    "|" + "|".join(["---"] * (art.block_size + 2)) + "|"]
            out += [f"| {md_cell(r.policy)} | {r.concurrency} | " +
                    " | ".join(_num(v, '.2f') for v in r.acceptance_by_position) + " |"
                    for r in positions]
            out.append("")
    for name in plots:
        out += [f"![{name}]({name})", ""]
    out += ["Each run's verify steps: `decisions/<artifact>.<policy>.c<R>.jsonl` (one JSON "
            "line per step: what the policy saw and chose; `dspark simulate` reads it).", ""]
    return "\n".join(out)


# --- plots --------------------------------------------------------------------------------

def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _series(report: ServeBenchReport, value) -> dict[str, list[tuple[int, float]]]:
    """Label -> [(concurrency, value)], one line per artifact and policy and one for the
    target alone; an undefined value is a gap (NaN), not a zero."""
    several = len(report.artifacts) > 1
    out: dict[str, list[tuple[int, float]]] = {}
    for run in report.runs:
        label = TARGET_ONLY if run.artifact is None else (
            f"{run.artifact} {run.policy}" if several else run.policy)
        v = value(run)
        out.setdefault(label, []).append((run.concurrency, float("nan") if v is None else v))
    return {k: sorted(v) for k, v in out.items()}


def _line_plot(report: ServeBenchReport, path: Path, value, ylabel: str, title: str) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4.0))
    for label, points in _series(report, value).items():
        baseline = label == TARGET_ONLY
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o",
                linestyle="--" if baseline else "-", color="k" if baseline else None,
                label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(report.settings.concurrencies)
    ax.set_xticklabels([str(c) for c in report.settings.concurrencies])
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(path, format="png", dpi=100)
    except OSError as exc:
        raise write_error(exc, path) from None
    finally:
        plt.close(fig)


def write_plots(report: ServeBenchReport, directory: Path) -> list[str]:
    """The two plots; returns their file names."""
    env = report.environment
    where = f"{env.device_name}, {report.settings.dtype}"
    _line_plot(report, directory / THROUGHPUT_PLOT, lambda r: r.tokens_per_second,
               "output tokens per second (all requests)", f"Throughput ({where})")
    _line_plot(report, directory / PER_REQUEST_PLOT, lambda r: r.per_request_tokens_per_second,
               "tokens per second per request", f"Per-request speed ({where})")
    return [THROUGHPUT_PLOT, PER_REQUEST_PLOT]


# --- the directory ------------------------------------------------------------------------

def _write_text(path: Path, text: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        raise write_error(exc, path) from None


def write_serve_report(report: ServeBenchReport,
                       decisions: dict[str, list[DecisionLine]], out_dir: str | os.PathLike,
                       *, force: bool = False, profiled: bool = False) -> list[Path]:
    """Write the report directory whole or not at all; ``decisions``: each run's lines by
    its file name (``decisions_name``). ``profiled``: also write the report's cost table as
    cost_table.json. Returns the final paths written."""
    names: list[str] = []
    with atomic_directory(out_dir, force=force) as tmp:
        (tmp / DECISIONS_DIR).mkdir()
        for name, lines in decisions.items():
            _write_text(tmp / name, "".join(dump_line(line) + "\n" for line in lines))
            names.append(name)
        if profiled and report.cost_table is not None:
            write_cost_table(report.cost_table, tmp / COST_TABLE_FILE)
            names.append(COST_TABLE_FILE)
        plots = write_plots(report, tmp)
        names += plots
        _write_text(tmp / "report.json", dumps(report, compact=True) + "\n")
        _write_text(tmp / "report.md", render_markdown(report, plots=plots))
        names += ["report.json", "report.md"]
    out = Path(out_dir)
    return [out / n for n in names]
