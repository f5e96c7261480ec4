"""The eval report: ``EvalReport`` (report.json), report.md, and writing a report directory.

``write_report(report, out_dir)`` builds the whole directory in a hidden temporary sibling
(``atomic.atomic_directory``) and renames it into place: ``report.json``, ``report.md``,
the PNGs of ``plots.py``, one ``calibration-<artifact>.json`` per calibrated artifact and
one trace of each engine run's drafts (``trace-<engine>-<artifact>-<spec type>.jsonl``).
An interrupted write leaves nothing; a partial report (``complete`` false, after Ctrl-C)
is written the same way and says so at the top of report.md.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, PrivateAttr

from dspark_convert.runtime.budget import MemoryReport
from dspark_convert.util.atomic import atomic_directory, write_error
from dspark_convert.util.json_out import dumps, dumps_model
from dspark_convert.evaluation.calibration import AppliedCalibration, CalibrationFile
from dspark_convert.evaluation.environment import Environment, TargetIdentity
from dspark_convert.evaluation.cells import md_cell, mib_cell, ms_cell, run_label
from dspark_convert.evaluation.depth import DepthRow
from dspark_convert.evaluation.metrics import Acceptance, ConfidenceReport, PeakMemory, Spread
from dspark_convert.evaluation.prompts import PromptSetInfo
from dspark_convert.evaluation.proposals import ProposalCheck
from dspark_convert.util.models import VersionOne

REPORT_FORMAT = "dspark-eval-report"
REPORT_VERSION = 1


class CycleRecord(BaseModel):
    """One verify step (the reference.json cycle, plus its times when the runtime has them)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    proposed: list[int]
    accepted: int
    next_token: int
    confidence_logits: list[float] | None
    draft_seconds: float | None
    verify_seconds: float | None


class PromptRun(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    category: str | None
    prompt_tokens: int
    new_tokens: int
    completion_ids: list[int]          # the new tokens (the prompt excluded)
    seconds: float
    acceptance_lengths: list[int] | None
    cycles: list[CycleRecord] | None
    lossless: bool | None              # temperature 0: equals the target's greedy output


# What decoded a run (commands/evaluate_kinds.py): the target alone, or a drafter of a kind.
METHOD = Literal["target", "dspark", "dflash", "dflash2", "mtp"]


class RunReport(BaseModel):
    """One combination over every prompt: the target alone, or an artifact at a
    temperature and confidence threshold (0: the cutoff off)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["target", "drafter"]   # the role: the baseline, or a drafter's run
    artifact: str | None               # the artifact's name in this report
    temperature: float
    confidence_threshold: float | None
    prompts: list[PromptRun]
    new_tokens: int
    seconds: float
    committed_tokens_per_second: float | None
    speedup: float | None              # over the target alone at the same temperature
    acceptance: Acceptance | None
    draft_seconds: float | None        # time in the drafter, all prompts
    draft_seconds_per_step: Spread | None
    verify_seconds_per_step: Spread | None
    timing_note: str | None
    peak_memory: PeakMemory | None
    lossless: bool | None
    confidence: ConfidenceReport | None   # threshold-0 runs of an artifact with a head (raw)
    # --calibration: the temperatures applied to the confidence logits before the
    # threshold's sigmoid in this run's cut (threshold > 0); None: the raw head.
    confidence_temperatures: list[float] | None
    # The drafter's kind ("target" for the target alone); None in a report written before
    # eval ran kinds other than DSpark and DFlash artifacts.
    method: METHOD | None = None
    # Latency per committed token after each prompt's first (evaluation/serve_bench.py's
    # rule: the tokens one verify step commits share its draft + verify time; the target
    # alone: the time of each forward), p50 and p99 over every prompt of the run.
    token_latency_p50_seconds: float | None = None
    token_latency_p99_seconds: float | None = None
    # The acceptance by draft position within each context depth (evaluation/depth.py's
    # buckets of committed tokens before the anchor): what a rate over every cycle hides
    # when a drafter degrades as its context grows. None for the target alone.
    acceptance_by_depth: list[DepthRow] | None = None


class NotRun(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["target", "drafter", "calibration"]
    artifact: str | None
    temperature: float | None
    confidence_threshold: float | None
    reason: str
    engine: str | None = None          # another engine's run ("llama.cpp"); None: ours
    method: METHOD | None = None       # the drafter's kind, as RunReport's


# --- another engine's runs beside ours (`--engine llama.cpp=BIN_DIR`) -------------------------

class SkippedPrompt(BaseModel):
    """A prompt the engine did not run, and why (its text does not give back its ids)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    reason: str


class EnginePromptRun(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    prompt_tokens: int
    new_tokens: int
    completion_ids: list[int] | None   # the new tokens; None for llama.cpp's target alone
                                       # (it prints its text only: ``text_sha256`` names it)
    # Of the generated text's first max_new_tokens tokens (llama.cpp); None where the engine
    # gives token ids, not text (dspark-mlx: ``completion_ids``).
    text_sha256: str | None
    seconds: float                     # llama.cpp: the whole process; dspark-mlx: its
                                       # generation of this prompt (the loading aside)
    acceptance_lengths: list[int] | None
    lossless: bool | None              # the output equals the engine's own target alone
    proposals: ProposalCheck | None
    statistics: str | None             # llama.cpp's own statistics line, timings left out


# The engines `dspark eval --engine` runs beside the reference runtime.
ENGINE_NAMES = Literal["llama.cpp", "dspark-mlx"]


class EngineRun(BaseModel):
    """One engine run over the prompts it could take: the target alone, or an artifact
    exported for it (``dspark export``: llama.cpp's GGUF, DeepSpec's layout for dspark-mlx).
    ``tau``: mean accepted+1 per draft the engine made (both make their first draft from the
    prompt's last token: docs/ENGINES.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    engine: ENGINE_NAMES
    kind: Literal["target", "drafter"]
    artifact: str | None
    spec_type: str | None              # llama.cpp's --spec-type (draft-dspark, draft-dflash);
                                       # dspark-mlx's loop (generate_eager)
    drafter_file_sha256: str | None    # the exported file the engine ran (dspark-mlx: the
                                       # export's model.safetensors)
    temperature: float
    prompts: list[EnginePromptRun]
    prompts_skipped: list[SkippedPrompt]
    new_tokens: int
    seconds: float
    tokens_per_second: float | None    # llama.cpp's own decode speed; dspark-mlx's new tokens
                                       # over its generation time; over all prompts
    tau: float | None
    acceptance_by_position: list[float] | None   # P(accepted > k | proposed > k)
    lossless: bool | None
    proposals: ProposalCheck | None    # compared 0: llama.cpp drafted nothing, nothing was
                                       # compared (never a pass: report.md says so)
    # llama.cpp's own "system_info: ..." line (threads, backends, CPU features: which code
    # path ran), as llama-completion of the same build printed it on this machine
    # (llama-speculative-simple prints none); None in a report written before it was recorded.
    system_info: str | None = None
    # The drafts the engine made, as a `dspark conform` trace (evaluation/conform.py): this
    # file in the report directory, what ``proposals`` checked; None for the target alone
    # and in a report written before traces were. ``_trace`` holds its bytes until written.
    trace: str | None = None
    _trace: bytes | None = PrivateAttr(default=None)
    # dspark-mlx: the parameters it built for the drafter that no key of the exported
    # checkpoint maps to, left at their random initialisation (it checks unexpected keys
    # only): [] when every one was assigned; only the advisory confidence head's may be
    # here (anything else is refused, 117). None for llama.cpp and the target alone.
    random_parameters: list[str] | None = None


class EngineInfo(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    engine: ENGINE_NAMES
    binaries: str                      # llama.cpp's bin directory; dspark-mlx's interpreter
    target_gguf: str | None            # llama.cpp's target file (None for dspark-mlx, which
    target_gguf_sha256: str | None     # runs --target's own directory)
    # The line every run of the build printed (llama.cpp's system_info); dspark-mlx: its
    # version, mlx's and its device, mlx-lm's and mlx-vlm's, Python's.
    system_info: str | None = None


class ArtifactReport(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    path: str
    drafter_gguf_sha256: str
    block_size: int
    markov_head: str                   # none, vanilla, gated, rnn
    confidence_head: bool
    validate_warnings: list[str]
    confidence: ConfidenceReport | None   # at the first temperature, threshold 0
    calibration: CalibrationFile | None
    calibration_file: str | None          # its name in the report directory
    held_out_raw: ConfidenceReport | None          # the held-out split, raw head
    held_out_calibrated: ConfidenceReport | None   # ... with the STS temperatures
    calibration_applied: AppliedCalibration | None  # --calibration FILE for this artifact
    confidence_calibrated: ConfidenceReport | None  # ``confidence`` with its temperatures
    # The drafter's kind; None in a report written before eval ran other kinds. For a
    # checkpoint run from its source directory (DFlash2, the Gemma 4 assistant),
    # ``drafter_gguf_sha256`` is the SHA-256 of its weights file, named by ``weights_file``.
    method: METHOD | None = None
    weights_file: str | None = None


class EvalSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    temperatures: list[float]
    thresholds: list[float]
    max_new_tokens: int
    seed: int
    device: str
    dtype: str                         # float32 or bfloat16: target and drafters compute in it
    verify: str                        # batched or stepwise (runtime/speculative.py)
    calibrate: bool
    held_out: float
    warmup: bool


class EvalReport(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal["dspark-eval-report"] = REPORT_FORMAT
    version: VersionOne = REPORT_VERSION
    complete: bool
    incomplete_reason: str | None
    settings: EvalSettings
    environment: Environment
    target: TargetIdentity | None
    prompt_set: PromptSetInfo
    artifacts: list[ArtifactReport]
    runs: list[RunReport]
    not_run: list[NotRun]
    lossless: bool | None              # every temperature-0 drafter run equals the target
    # The estimate checked before loading (the target and every artifact at once), what the
    # device had; None when nothing was loaded (no device).
    memory_estimate: MemoryReport | None = None
    # --engine: the other engine's own runs beside ours, on the prompts it could take.
    engine: EngineInfo | None = None   # the first --engine's (every one: ``engines``)
    engines: list[EngineInfo] = []     # each --engine, in the order given
    engine_runs: list[EngineRun] = []  # every engine's runs, by engine

    def run(self, kind: str, artifact: str | None, temperature: float,
            threshold: float | None) -> RunReport | None:
        for r in self.runs:
            if (r.kind, r.artifact, r.temperature, r.confidence_threshold) == \
                    (kind, artifact, temperature, threshold):
                return r
        return None


# Fields that measure time or memory: everything else is the same for the same seed.
MEASURED_FIELDS = frozenset({
    "seconds", "committed_tokens_per_second", "speedup", "draft_seconds",
    "draft_seconds_per_step", "verify_seconds_per_step", "verify_seconds", "peak_memory",
    "timing_note", "environment", "memory_estimate", "tokens_per_second",
    "token_latency_p50_seconds", "token_latency_p99_seconds"})


def comparable(report: EvalReport) -> dict:
    """The report as JSON data without the measured times, memory and environment: two runs
    with the same inputs and seed give equal values."""
    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in MEASURED_FIELDS}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return strip(report.model_dump(mode="json"))


# --- report.md ----------------------------------------------------------------------------

def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{100 * value:.{digits}f}%"


def render_markdown(report: EvalReport, *, plots: list[str] | None = None) -> str:
    out: list[str] = []
    env, s = report.environment, report.settings
    out.append("# dspark eval")
    out.append("")
    if not report.complete:
        out.append(f"> **INCOMPLETE**: {md_cell(report.incomplete_reason or 'interrupted')}. "
                   "The runs below finished; the rest are listed under *Not run*.")
        out.append("")
    target = report.target.path if report.target else "-"
    out.append(f"Target `{md_cell(target)}`, {report.prompt_set.count} prompts "
               f"(`{md_cell(report.prompt_set.path)}`, SHA-256 `{report.prompt_set.sha256[:16]}…`), "
               f"max {s.max_new_tokens} new tokens, seed {s.seed}; {md_cell(env.device)} "
               f"({md_cell(env.device_name)}), {s.dtype} ({s.verify} verify), torch {env.torch_version}, "
               f"{env.torch_threads} thread(s), dspark-convert {env.dspark_convert_version}.")
    out.append("")
    if report.lossless is not None:
        out.append("Temperature 0: every speculative output "
                   + ("**equals** the target's own greedy output." if report.lossless
                      else "**does not equal** the target's own greedy output: see `lossless` in report.json."))
        out.append("")

    out += _comparison(report)

    out.append("## Runs")
    out.append("")
    out.append("| run | T | tau | accepted / pass | mean L | accept rate | tok/s | speedup | "
               "draft ms p50 / p90 | verify ms p50 / p90 | peak MiB | lossless |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in report.runs:
        a = r.acceptance
        lossless = "-" if r.lossless is None else ("yes" if r.lossless else "**NO**")
        out.append(f"| {run_label(r)} | {r.temperature:g} | {_f(a.tau if a else None)} | "
                   f"{_f(a.accepted_per_verify if a else None)} | "
                   f"{_f(a.mean_verified_length if a else None)} | "
                   f"{_pct(a.acceptance_rate_verified if a else None)} | "
                   f"{_f(r.committed_tokens_per_second, 0)} | "
                   f"{'1.00x' if r.kind == 'target' else (_f(r.speedup) + 'x' if r.speedup else '-')} | "
                   f"{ms_cell(r.draft_seconds_per_step)} | {ms_cell(r.verify_seconds_per_step)} | "
                   f"{mib_cell(r.peak_memory)} | {lossless} |")
    out.append("")
    notes = sorted({r.timing_note for r in report.runs if r.timing_note})
    mem = next((r.peak_memory for r in report.runs if r.peak_memory), None)
    out.append("tau: mean accepted+1 per verify step; mean L: draft tokens verified per step "
               "(after the cutoff); accept rate: accepted / verified draft tokens; tok/s: new "
               "tokens / wall time; speedup: over the target alone at the same temperature.")
    if mem is not None:
        out.append(f"Peak memory: {mem.note}.")
    for note in notes:
        out.append(f"Timing: {note}.")
    out.append("")

    drafter_runs = [r for r in report.runs if r.kind == "drafter" and not r.confidence_threshold]
    if drafter_runs:
        B = max(len(r.acceptance.acceptance_by_position) for r in drafter_runs if r.acceptance)
        out.append("## Acceptance by draft position (cutoff off)")
        out.append("")
        out.append("Conditional P(accepted > k | proposed > k) (DeepSpec's; with the cutoff off "
                   "every position is proposed, so it equals the cumulative P(accepted > k)), "
                   "then given the prefix: P(accepted > k | positions 0..k-1 accepted).")
        out.append("")
        out.append("| artifact | T | " + " | ".join(f"k={k}" for k in range(B)) + " |")
        out.append("|---|---|" + "---|" * B)
        for r in drafter_runs:
            for which, rates in (("", r.acceptance.acceptance_by_position),
                                 (" cumulative", r.acceptance.acceptance_by_position_cumulative),
                                 (" given prefix", r.acceptance.acceptance_by_position_given_prefix)):
                cells = " | ".join(_f(x) for x in list(rates) + [None] * (B - len(rates)))
                out.append(f"| {md_cell(r.artifact)}{which} | {r.temperature:g} | {cells} |")
        out.append("")
        deep = [r for r in drafter_runs if r.acceptance_by_depth]
        if deep:
            out.append("### By context depth")
            out.append("")
            out.append("P(accepted > k | proposed > k) within each bucket of committed tokens "
                       "before the anchor (drafts: the verify steps in the bucket).")
            out.append("")
            out.append("| artifact | T | depth | drafts | " + " | ".join(f"k={k}" for k in range(B))
                       + " |")
            out.append("|---|---|---|---|" + "---|" * B)
            for r in deep:
                for row in r.acceptance_by_depth:
                    rates = row.rates()
                    cells = " | ".join(_f(x) for x in list(rates) + [None] * (B - len(rates)))
                    out.append(f"| {md_cell(r.artifact)} | {r.temperature:g} | {row.depth} | "
                               f"{row.drafts} | {cells} |")
            out.append("")

    cutoff = [r for r in report.runs if r.kind == "drafter" and r.confidence_threshold]
    if cutoff:
        out.append("## Static confidence cutoff")
        out.append("")
        out.append("| artifact | T | threshold | tau | mean L | accept rate | tok/s | speedup |")
        out.append("|---|---|---|---|---|---|---|---|")
        for art in report.artifacts:
            rows = sorted((r for r in report.runs if r.kind == "drafter" and r.artifact == art.name
                           and art.confidence_head),
                          key=lambda r: (r.temperature, r.confidence_threshold or 0.0))
            for r in rows:
                a = r.acceptance
                out.append(f"| {md_cell(art.name)} | {r.temperature:g} | "
                           f"{r.confidence_threshold or 0:g} | {_f(a.tau)} | "
                           f"{_f(a.mean_verified_length)} | {_pct(a.acceptance_rate_verified)} | "
                           f"{_f(r.committed_tokens_per_second, 0)} | "
                           f"{_f(r.speedup) + 'x' if r.speedup else '-'} |")
        out.append("")

    for art in report.artifacts:
        if art.confidence is None:
            continue
        c = art.confidence
        out.append(f"## Confidence head: {md_cell(art.name)} (T={c.temperature:g}, threshold 0, "
                   f"{c.proposals} proposals)")
        out.append("")
        out.append("DeepSpec's metrics of the cumulative prediction P_k = prod sigmoid(cl_i), "
                   "i <= k, against \"positions 0..k all accepted\".")
        out.append("")
        out.append("| position | weight | ECE | AUROC | Brier | mean pred | mean label |")
        out.append("|---|---|---|---|---|---|---|")
        for e in c.per_position:
            out.append(f"| {e.position} | {e.total_weight:g} | {_pct(e.ece, 2)} | {_f(e.auc, 3)} | "
                       f"{_f(e.brier, 4)} | {_f(e.pred_mean, 3)} | {_f(e.target_mean, 3)} |")
        m = c.summary
        out.append(f"| mean | | {_pct(m.ece_mean, 2)} | {_f(m.auc_mean, 3)} | {_f(m.brier_mean, 4)} | "
                   f"{_f(m.pred_mean, 3)} | {_f(m.target_mean, 3)} |")
        out.append("")
        if art.calibration_applied is not None:
            a, cc = art.calibration_applied, art.confidence_calibrated
            temps = ", ".join(f"{t:g}" for t in a.temperatures)
            out.append(f"Calibration applied (`--calibration`): `{md_cell(a.path)}` (SHA-256 "
                       f"`{a.sha256[:16]}…`), temperatures {temps}; {md_cell(a.note)}.")
            if cc is not None:
                out.append(f"With them, on these prompts: ECE {_pct(cc.summary.ece_mean, 2)} "
                           f"(raw {_pct(m.ece_mean, 2)}), AUROC {_f(cc.summary.auc_mean, 3)} "
                           f"(raw {_f(m.auc_mean, 3)}), Brier {_f(cc.summary.brier_mean, 4)} "
                           f"(raw {_f(m.brier_mean, 4)}).")
            out.append("")
        cal = art.calibration
        if cal is not None:
            out.append(f"### Sequential Temperature Scaling: {md_cell(art.name)}")
            out.append("")
            out.append(f"Fitted on {len(cal.split.calibration_ids)} prompts, scored on "
                       f"{len(cal.split.held_out_ids)} held-out prompts (seed {cal.split.seed}); "
                       f"`{md_cell(art.calibration_file)}`. {md_cell(cal.note)}.")
            out.append("")
            out.append("| position | T | held-out weight | ECE before | ECE after | ECE floor | "
                       "AUROC before | AUROC after | Brier before | Brier after |")
            out.append("|---|---|---|---|---|---|---|---|---|---|")
            for p in cal.per_position:
                out.append(f"| {p.position} | {p.temperature:g} | {p.total_weight:g} | "
                           f"{_pct(p.ece_before, 2)} | {_pct(p.ece_after, 2)} | "
                           f"{_pct(p.ece_floor_before, 2)} | "
                           f"{_f(p.auc_before, 3)} | {_f(p.auc_after, 3)} | "
                           f"{_f(p.brier_before, 4)} | {_f(p.brier_after, 4)} |")
            out.append(f"| mean | | | {_pct(cal.ece_mean_before, 2)} | {_pct(cal.ece_mean_after, 2)} "
                       f"| {_pct(cal.ece_floor_mean_before, 2)} | | | | |")
            out.append("")
            out.append("ECE floor: about the ECE a perfectly calibrated head would show on this many "
                       "held-out steps (sampling noise of 20 bins; not a DeepSpec metric). AUROC "
                       "is DeepSpec's, of the cumulative prediction: STS keeps the order of each "
                       "position's own confidence (P_0 moves only by binning), but P_k for k > 0 "
                       "multiplies positions scaled by different temperatures.")
            out.append("")

    out += _engine_section(report)

    if report.not_run:
        out.append("## Not run")
        out.append("")
        for n in report.not_run:
            what = n.kind if n.artifact is None else f"{n.kind} {n.artifact}"
            where = []
            if n.temperature is not None:
                where.append(f"T={n.temperature:g}")
            if n.confidence_threshold is not None:
                where.append(f"threshold {n.confidence_threshold:g}")
            suffix = f" ({', '.join(where)})" if where else ""
            what = f"{n.engine} {what}" if n.engine else what
            out.append(f"- {md_cell(what)}{suffix}: {md_cell(n.reason)}")
        out.append("")

    out.append("## Artifacts")
    out.append("")
    out.append("| name | path | drafter.gguf SHA-256 | block | Markov head | confidence head |")
    out.append("|---|---|---|---|---|---|")
    for art in report.artifacts:
        out.append(f"| {md_cell(art.name)} | `{md_cell(art.path)}` | `{art.drafter_gguf_sha256}` | "
                   f"{art.block_size} | {art.markov_head} | {'yes' if art.confidence_head else 'no'} |")
    if report.target is not None:
        t = report.target
        out.append("")
        out.append(f"Target identity: config `{t.config_sha256[:16]}…`, weights "
                   f"`{t.weights_sha256[:16]}…`, embedding `{t.embed_sha256[:16]}…`, head "
                   f"`{t.lm_head_sha256[:16]}…`.")
    if plots:
        out.append("")
        out.append("## Plots")
        out.append("")
        for name in plots:
            out.append(f"![{name}]({name})")
    out.append("")
    return "\n".join(out)


# How the comparison table names each method (RunReport.method).
METHOD_LABELS = {"target": "target alone", "dspark": "DSpark", "dflash": "DFlash",
                 "dflash2": "DFlash2", "mtp": "MTP (Gemma 4 assistant)"}


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1000 * seconds:.2f}"


def _comparison(report: EvalReport) -> list[str]:
    """One row per kind's run (the target alone, each drafter with the cutoff off), at each
    temperature: what decoding with it costs and gains on the same prompts, and what of
    each kind did not run, in one table."""
    rows = [r for r in report.runs if r.kind == "target" or not r.confidence_threshold]
    if not rows:
        return []
    out = ["## Comparison", "",
           "| kind | run | T | tau | accepted / pass | acceptance by position | "
           "latency / token ms p50 / p99 | tok/s | speedup | peak MiB | lossless |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r.temperature, r.kind != "target")):
        a = r.acceptance
        kind = METHOD_LABELS.get(r.method or r.kind, r.method or r.kind)
        by_position = ("-" if a is None else
                       " ".join(_f(x) for x in a.acceptance_by_position))
        lossless = "-" if r.lossless is None else ("yes" if r.lossless else "**NO**")
        speed = "1.00x" if r.kind == "target" else (_f(r.speedup) + "x" if r.speedup else "-")
        out.append(f"| {kind} | {'target alone' if r.kind == 'target' else md_cell(r.artifact)} | "
                   f"{r.temperature:g} | {_f(a.tau if a else 1.0 if r.kind == 'target' else None)} | "
                   f"{_f(a.accepted_per_verify if a else None)} | {by_position} | "
                   f"{_ms(r.token_latency_p50_seconds)} / {_ms(r.token_latency_p99_seconds)} | "
                   f"{_f(r.committed_tokens_per_second, 0)} | {speed} | {mib_cell(r.peak_memory)} | "
                   f"{lossless} |")
    out.append("")
    out.append("tau: mean tokens committed per verify pass (accepted + 1; the target alone commits "
               "1 per forward); accepted / pass: accepted draft tokens per verify pass; "
               "acceptance by position: P(accepted > k | proposed > k), k = 0, 1, ...; latency: "
               "per committed token after each prompt's first, a verify step's draft + verify "
               "time shared by the tokens it commits (the target alone: each forward); speedup: "
               "tok/s over the target alone's at the same temperature; lossless: at temperature "
               "0, every output equals the target's own greedy output.")
    kinds = {n.method for n in report.not_run if n.method and n.engine is None}
    if kinds:
        out.append("What did not run, by kind (the reasons are under *Not run*): "
                   + "; ".join(f"{METHOD_LABELS.get(k, k)}: "
                               + ", ".join(sorted({_where(n) for n in report.not_run
                                                   if n.method == k and n.engine is None}))
                               for k in sorted(kinds)) + ".")
    out.append("")
    return out


def _where(n: NotRun) -> str:
    parts = []
    if n.temperature is not None:
        parts.append(f"T={n.temperature:g}")
    if n.confidence_threshold:
        parts.append(f"threshold {n.confidence_threshold:g}")
    return " ".join(parts) or "-"


# How report.md introduces each engine's runs: what ran, on what, handed which files.
def _llama_cpp_intro(e: EngineInfo) -> str:
    return (f"Binaries `{md_cell(e.binaries)}`, target `{md_cell(e.target_gguf or '-')}` (SHA-256 "
            f"`{(e.target_gguf_sha256 or '-')[:16]}…`); temperature 0, the cutoff off; each "
            "artifact exported by `dspark export`. tau: mean accepted+1 per draft llama.cpp made "
            "(its first draft is made from the prompt's last token).")


def _dspark_mlx_intro(e: EngineInfo) -> str:
    return (f"Interpreter `{md_cell(e.binaries)}`, on --target's own directory; temperature 0, "
            "the cutoff off, token ids; each artifact exported by `dspark export --engine "
            "deepspec` (DeepSpec's layout, every tensor bit-exact) and run by its "
            "`generate_eager`. tau: mean accepted+1 per draft dspark-mlx made (its first draft is "
            "made from the prompt's last token).")


ENGINE_INTROS = {"llama.cpp": _llama_cpp_intro, "dspark-mlx": _dspark_mlx_intro}


def _engine_section(report: EvalReport) -> list[str]:
    """--engine: each other engine's runs beside ours, and the proposal check."""
    engines = report.engines or ([report.engine] if report.engine is not None else [])
    out: list[str] = []
    for e in engines:
        out += _one_engine(e, [r for r in report.engine_runs if r.engine == e.engine])
    return out


def _one_engine(e: EngineInfo, runs: list[EngineRun]) -> list[str]:
    out = [f"## {md_cell(e.engine)} beside the reference", "",
           ENGINE_INTROS[e.engine](e) + " Proposals: drafts equal, token for token, to the "
           "reference runtime's proposal from the same committed tokens and anchor.", "",
           "| run | spec type | prompts | tau | its own mean acc len (mean over prompts) | "
           "tok/s | lossless | "
           "proposals equal | first difference |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        lossless = "-" if r.lossless is None else ("yes" if r.lossless else "**NO**")
        p = r.proposals
        compared = "-" if p is None else f"{p.equal} / {p.compared}"
        if p is not None and p.compared == 0:
            compared = f"**none: {md_cell(e.engine)} drafted nothing**"
        first = "-"
        if p is not None and p.first_difference is not None:
            d = p.first_difference
            first = (f"prompt {md_cell(d.prompt or '-')}, draft {d.draft_call}, position "
                     f"{d.position}: {d.engine_token} vs ours {d.reference_token}"
                     + (f" (its draft is ours read {d.row_offset} row(s) late)"
                        if d.row_offset else "")
                     + (f" (our margin {d.reference_margin:.3g})"
                        if d.reference_margin is not None else ""))
        stated = [float(m.group(1)) for x in r.prompts if x.statistics
                  for m in [re.search(r"#mean acc len = (\d{1,10}\.\d\d)\b", x.statistics)] if m]
        mean = _f(sum(stated) / len(stated)) if stated else "-"
        out.append(f"| {'target alone' if r.kind == 'target' else md_cell(r.artifact)} | "
                   f"{r.spec_type or '-'} | {len(r.prompts)} | {_f(r.tau)} | {mean} | "
                   f"{_f(r.tokens_per_second, 0)} | {lossless} | "
                   f"{compared} | {first} |")
    out.append("")
    traces = [r.trace for r in runs if r.trace is not None]
    if traces:
        out += ["The drafts of each run, as `dspark conform` reads them (docs/CONFORMANCE.md): "
                + ", ".join(f"[{md_cell(t)}]({md_cell(t)})" for t in traces) + ".", ""]
    for r in runs:
        if r.random_parameters is None:
            continue
        if r.random_parameters:
            out.append(f"{md_cell(r.artifact)}: dspark-mlx keeps its "
                       f"{md_cell(', '.join(r.random_parameters))} at their random "
                       "initialisation (the artifact has no confidence head; dspark-mlx builds "
                       "one, advisory: unused at threshold 0).")
        else:
            out.append(f"{md_cell(r.artifact)}: every parameter dspark-mlx built was assigned "
                       "from the exported checkpoint (none left at its random initialisation).")
        out.append("")
    if e.system_info:
        out += [f"{md_cell(e.engine)}'s system info: `{md_cell(e.system_info)}`", ""]
    by_position = [r for r in runs if r.acceptance_by_position]
    if by_position:
        B = max(len(r.acceptance_by_position) for r in by_position)
        out.append(f"| {md_cell(e.engine)} acceptance by position | "
                   + " | ".join(f"k={k}" for k in range(B)) + " |")
        out.append("|---|" + "---|" * B)
        for r in by_position:
            out.append(f"| {md_cell(r.artifact)} ({r.spec_type}) | "
                       + " | ".join(_f(x) for x in r.acceptance_by_position) + " |")
        out.append("")
    skipped = runs[0].prompts_skipped if runs else []
    if skipped:
        out.append(f"Prompts {md_cell(e.engine)} did not run ({len(skipped)}):")
        out.append("")
        out += [f"- {md_cell(s.id)}: {md_cell(s.reason)}" for s in skipped]
        out.append("")
    return out


# --- writing the directory ----------------------------------------------------------------

def _write_bytes(path: Path, data: bytes) -> None:
    try:
        with open(path, "wb") as fh:
            fh.write(data)
    except OSError as exc:
        raise write_error(exc, path) from None


def write_report(report: EvalReport, out_dir: str | os.PathLike, *, force: bool = False,
                 plots: bool = True) -> list[Path]:
    """Write the report directory atomically; returns the final paths of what it wrote."""
    from dspark_convert.evaluation.plots import write_plots

    names: list[str] = []
    with atomic_directory(out_dir, force=force) as tmp:
        for art in report.artifacts:
            if art.calibration is not None and art.calibration_file:
                text = dumps_model(art.calibration, indent=1) + "\n"
                _write_bytes(tmp / art.calibration_file, text.encode())
                names.append(art.calibration_file)
        plot_names = write_plots(report, tmp) if plots else []
        names += plot_names
        for run in report.engine_runs:          # each engine run's drafts, as a trace
            if run.trace is not None and run._trace is not None:
                _write_bytes(tmp / run.trace, run._trace)
                names.append(run.trace)
        # Compact: the cycles of every prompt make an indented file ten times larger.
        _write_bytes(tmp / "report.json", (dumps(report, compact=True) + "\n").encode())
        _write_bytes(tmp / "report.md", render_markdown(report, plots=plot_names).encode())
        names += ["report.json", "report.md"]
    out = Path(out_dir)
    return [out / n for n in names]


def read_report(path: str | os.PathLike) -> EvalReport:
    """report.json back into the model (for tools that compare reports); raises
    ValueError or pydantic's ValidationError on a file that is not one."""
    from dspark_convert.util.strict_json import loads_strict

    return EvalReport.model_validate(loads_strict(Path(path).read_text(encoding="utf-8")))
