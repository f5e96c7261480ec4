"""`dspark eval`: the target alone and drafters of every kind on the same prompts.

``run_eval`` checks every input first (options, the prompt set, every artifact through
``validate`` and its binding to the target, or a DFlash2 / Gemma 4 assistant checkpoint
directory through its kind's plan), then runs, all on the same prompts, device and settings:

1. the target alone at each temperature (the baseline: one token per forward, its argmax
   at temperature 0 as the runtime's ``target_greedy``; at T > 0 its own sampling from
   softmax(z/T));
2. each drafter at each temperature with the confidence cutoff off (threshold 0), by its
   kind's loop (commands/evaluate_kinds.py KINDS: DSpark and DFlash artifacts, DFlash2,
   the Gemma 4 assistant); each run records its ``method``;
3. each artifact with a confidence head at each threshold > 0, at each temperature.

Every run computes in one dtype (``dtype``: the target and every drafter loaded once in
it; bfloat16 verifies token by token, as ``smoke --dtype bfloat16`` does, so that
temperature 0 stays lossless). A calibration (``calibrations``, calibration.json from
``--calibrate``) scales its artifact's confidence logits before the threshold's sigmoid in
the threshold > 0 runs; the report keeps the raw logits and names the file applied.

Sampling uses the seed for every prompt, exactly as ``dspark smoke --seed`` does, so a
``smoke`` run of the same prompt and settings reproduces an eval run cycle by cycle, and
the same seed gives the same report (times and memory aside: ``report.comparable``).
Before the timed runs each model generates a few tokens once, untimed (warm-up).

A combination that cannot run is listed in ``not_run`` with the reason (CUDA not
available, no confidence head, DFlash2 above temperature 0 with its loop's own refusal, too
few prompts to calibrate, a kind or a checkpoint directory an engine does not run); none is
dropped. Ctrl-C
raises ``EvalInterrupted``, a KeyboardInterrupt carrying the partial report
(``complete`` false; the runs that finished, the rest in ``not_run``), for the caller to
write before it exits.
"""

from __future__ import annotations

import inspect
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable
from typing import Sequence

from dspark_convert.errors import (
    CalibrationFileError,
    CalibrationMismatchError,
    DeviceUnavailableError,
    DSparkError,
    EvalInputError,
    InvalidArtifactError,
    LosslessnessError,
    PromptSetError,
)
from dspark_convert.runtime.budget import MemoryReport
from dspark_convert.util.atomic import Output, check_outputs
from dspark_convert.util.paths import check_path
from dspark_convert.util.progress import NoProgress, Progress
from dspark_convert.util.text import shown
from dspark_convert.commands.evaluate_kinds import KINDS, TARGET, never_runs
from dspark_convert.evaluation.calibration import (
    AppliedCalibration,
    CalibrationFile,
    CalibrationSplit,
    applied,
    calibrate as fit_calibration,
    check_calibration,
    read_calibration_file,
    split_prompts,
)
from dspark_convert.evaluation.environment import TargetIdentity, describe_environment, target_identity
from dspark_convert.evaluation.depth import acceptance_by_depth, run_steps
from dspark_convert.evaluation.metrics import (
    MemoryProbe,
    acceptance,
    confidence_data,
    confidence_report,
    spread,
    token_latencies,
)
# The option ranges eval shares with the gate's policy (one place: evaluation/options.py).
from dspark_convert.evaluation.options import DEVICES, DTYPES, MAX_NEW_TOKENS_LIMIT
from dspark_convert.evaluation.prompts import (
    DEFAULT_PROMPTS,
    Prompt,
    PromptSet,
    check_context,
    load_prompt_set,
    resolve_prompts,
)
from dspark_convert.evaluation.report import (
    ArtifactReport,
    CycleRecord,
    EvalReport,
    EvalSettings,
    NotRun,
    PromptRun,
    RunReport,
)

DEFAULT_TEMPERATURES: tuple[float, ...] = (0.0,)
DEFAULT_THRESHOLDS: tuple[float, ...] = (0.1, 0.3, 0.5, 0.7, 0.9)
DEFAULT_MAX_NEW_TOKENS = 64
DEFAULT_HELD_OUT = 0.5
WARMUP_TOKENS = 8
TIMING_MISSING = ("per-step draft and verify times need Cycle.draft_seconds / "
                  "Cycle.verify_seconds, which this runtime does not record; draft_seconds is "
                  "the run's total time in the drafter")


class EvalInterrupted(KeyboardInterrupt):
    """Ctrl-C during an eval; ``report`` is the partial report (``complete`` false)."""

    def __init__(self, report: EvalReport) -> None:
        super().__init__("interrupted")
        self.report = report


@dataclass
class _Artifact:
    name: str
    path: Path
    sha256: str
    warnings: list[str]
    contract: object                  # the FeatureContract its GGUF metadata declares (None:
                                      # a DFlash2 or assistant plan, which has none)
    drafter: object = None
    calibration: CalibrationFile | None = None      # --calibration, matched by SHA-256
    applied: AppliedCalibration | None = None
    kind: str = "dspark"              # commands/evaluate_kinds.KINDS
    plan: object = None               # the kind's drafter plan (bind / bind_source)
    source: bool = False              # a checkpoint run from its source directory

    @property
    def block_size(self) -> int:
        """The block (DSpark, DFlash, DFlash2's config) or the drafts per cycle (MTP)."""
        if self.contract is not None:
            return self.contract.block.block_size
        if self.kind == "dflash2":
            return int(self.plan.config.block_size)
        return KINDS[self.kind].positions(self.plan)

    @property
    def positions(self) -> int:
        """The most drafts one cycle proposes (acceptance by position's width)."""
        return KINDS[self.kind].positions(self.plan) if self.plan is not None else self.block_size

    @property
    def has_confidence(self) -> bool:
        return self.contract is not None and bool(self.contract.confidence_head.enabled)

    @property
    def markov(self) -> str:
        return str(self.contract.markov_head.type) if self.contract is not None else "none"


def _unique(values: Sequence[float]) -> list[float]:
    return list(dict.fromkeys(float(v) for v in values))


def check_options(*, artifacts: Sequence, temperatures: Sequence[float],
                  thresholds: Sequence[float], max_new_tokens: int, seed: int,
                  held_out: float, dtype: str = "float32", device: str = "auto",
                  max_memory: int | None = None) -> None:
    from dspark_convert.runtime.sampling import check_seed, check_temperature

    if not artifacts:
        raise EvalInputError("no artifact: expected at least one ARTIFACT directory",
                             field="artifacts", expected="at least one", found=0)
    seen: dict[Path, str] = {}
    for a in artifacts:
        key = Path(a).resolve()
        if key in seen:
            raise EvalInputError(f"{a}: the same artifact as {seen[key]}; expected each once",
                                 path=str(a), field="artifacts", expected="distinct artifacts",
                                 found=str(a))
        seen[key] = str(a)
    if not temperatures:
        raise EvalInputError("--temperature: expected at least one", field="temperature",
                             expected="at least one", found=0)
    for t in temperatures:
        check_temperature(t, error=EvalInputError)
    for c in thresholds:
        if not (isinstance(c, (int, float)) and math.isfinite(c) and 0.0 <= c <= 1.0):
            raise EvalInputError(f"--threshold: expected 0..1, found {c}", field="threshold",
                                 expected="0..1", found=c)
    if not (isinstance(max_new_tokens, int) and 1 <= max_new_tokens <= MAX_NEW_TOKENS_LIMIT):
        raise EvalInputError(f"--max-new-tokens: expected 1..{MAX_NEW_TOKENS_LIMIT}, found "
                             f"{max_new_tokens}", field="max_new_tokens",
                             expected=f"1..{MAX_NEW_TOKENS_LIMIT}", found=max_new_tokens)
    check_seed(seed, error=EvalInputError)
    if not (isinstance(held_out, (int, float)) and 0.0 < held_out < 1.0):
        raise EvalInputError(f"--held-out: expected a fraction strictly between 0 and 1, found "
                             f"{held_out}", field="held_out", expected="(0, 1)", found=held_out)
    if device not in DEVICES:
        raise EvalInputError(f"--device: expected one of {', '.join(DEVICES)}, found "
                             f"{shown(device)!r}", field="device", expected="|".join(DEVICES),
                             found=shown(device))
    if max_memory is not None and not (isinstance(max_memory, int) and max_memory > 0):
        raise EvalInputError(f"--max-memory: expected a positive size, found {max_memory}",
                             field="max_memory", expected="> 0", found=str(max_memory))
    if dtype not in DTYPES:
        raise EvalInputError(f"--dtype: expected one of {', '.join(DTYPES)}, found {shown(dtype)!r}",
                             field="dtype", expected="|".join(DTYPES), found=shown(dtype))


def check_report_dir(out: str | os.PathLike, *, force: bool, artifacts: Sequence,
                     target: str | os.PathLike, prompts: str | os.PathLike | None = None,
                     calibrations: Sequence = (),
                     target_gguf: str | os.PathLike | None = None) -> Path:
    """``-o REPORT_DIR`` before anything runs, by the one output rule (atomic.check_outputs):
    a path naming a new directory (32), that does not exist without ``force`` (30), can be
    created (31: a parent that is a file, or unwritable), and is never the directory of,
    inside or around anything the eval reads, the packaged prompt set included (--force
    would delete it; a report inside an artifact is a stray file)."""
    from dspark_convert.commands.binding import target_read

    for a in artifacts:
        check_path(a, what="the artifact", error=InvalidArtifactError)
    if prompts is not None:
        check_path(prompts, what="--prompts", error=PromptSetError)
    for c in calibrations:
        check_path(c, what="--calibration", error=CalibrationFileError)
    reads = [(a, "the artifact") for a in artifacts] + [target_read(target)]
    reads.append((prompts if prompts is not None else DEFAULT_PROMPTS, "the prompt set"))
    reads += [(c, "the calibration file") for c in calibrations]
    if target_gguf is not None:            # --engine's target, as the engine runs it
        reads.append((target_gguf, "the target GGUF"))
    return check_outputs([Output(out, "the report directory", directory=True)], reads,
                         force=force)[0]


def report_failure(report: EvalReport, out: str | os.PathLike) -> DSparkError | None:
    """What makes a written report a failed eval, as the refusal the CLI exits with: nothing
    could run on the requested device (72: every combination is in ``not_run`` with the
    reason), or at temperature 0 an output differs from the target's own greedy output (74,
    the first such run and prompt named)."""
    if report.environment.device == "none":
        reason = report.not_run[0].reason if report.not_run else "no device"
        return DeviceUnavailableError(f"{reason}; nothing ran (every run is listed as not run "
                                      f"in {out})", path=str(out), field="device",
                                      expected="a CUDA device", found="none")
    for i, run in enumerate(report.runs):
        bad = next((p for p in run.prompts if p.lossless is False), None)
        if bad is not None:
            return LosslessnessError(
                f"{run.artifact}: at temperature 0 (threshold {run.confidence_threshold:g}, "
                f"{report.settings.dtype}) the output of prompt {shown(bad.id)} differs from the "
                f"target's own greedy output; the report is in {out}", path=str(out),
                field=f"runs[{i}].prompts", expected="equal", found="differs")
    return None


def artifact_names(paths: Sequence[Path]) -> list[str]:
    """Report names: the directory name, made file-name safe, numbered when two clash."""
    names: list[str] = []
    for p in paths:
        base = re.sub(r"[^A-Za-z0-9._-]+", "_", p.name or "artifact").strip("._") or "artifact"
        name, i = base, 2
        while name in names:
            name, i = f"{base}-{i}", i + 1
        names.append(name)
    return names


# --- the runs -----------------------------------------------------------------------------

def _target_sample(model, prompt: Sequence[int], *, max_new_tokens: int, temperature: float,
                   stop_token_ids: tuple[int, ...], seed: int):
    """The target alone: one token per forward, its argmax at T = 0 (what
    ``speculative.target_greedy`` computes), else drawn from softmax(z/T) with a CPU
    generator seeded like the speculative runs. Returns (output ids, seconds, each new
    token's time from the start)."""
    import torch

    from dspark_convert.runtime.sampling import pick
    from dspark_convert.runtime.speculative import TARGET_LOGITS
    from dspark_convert.runtime.qwen3 import KVCache

    generator = torch.Generator(device="cpu")
    generator.manual_seed(seed)
    device = model.device
    # The runtime's forward may keep only some hidden states and the last logits; the
    # baseline asks for as little as target_greedy does, when it can.
    params = inspect.signature(model.forward).parameters
    step_kw = {"keep": ()} if "keep" in params else {}
    prefill_kw = dict(step_kw, last_logits_only=True) if "last_logits_only" in params else step_kw
    with torch.inference_mode():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        cache = KVCache()
        out = model.forward(torch.tensor(list(prompt), dtype=torch.long, device=device), cache,
                            **prefill_kw)
        x = list(prompt)
        times: list[float] = []
        for _ in range(max_new_tokens):
            token = pick(out.logits[-1], temperature, generator, what=TARGET_LOGITS)
            x.append(token)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
            if token in stop_token_ids or len(x) >= len(prompt) + max_new_tokens:
                break
            out = model.forward(torch.tensor([token], dtype=torch.long, device=device), cache,
                                **step_kw)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return tuple(x), time.perf_counter() - t0, times


def _cycle_record(c) -> CycleRecord:
    return CycleRecord(proposed=list(c.proposed), accepted=c.accepted, next_token=c.next_token,
                       confidence_logits=None if c.confidence_logits is None
                       else [float(v) for v in c.confidence_logits],
                       draft_seconds=getattr(c, "draft_seconds", None),
                       verify_seconds=getattr(c, "verify_seconds", None))


class _Runner:
    def __init__(self, *, model, prompts: list[Prompt], max_new_tokens: int, seed: int,
                 stepwise: bool, progress: Progress) -> None:
        self.model = model
        self.stepwise = stepwise           # verify token by token (bfloat16: see verify_mode)
        self.prompts = prompts
        self.max_new_tokens = max_new_tokens
        self.seed = seed
        self.progress = progress
        self.stops = tuple(model.config.stop_token_ids)
        self.greedy: dict[str, tuple[int, ...]] = {}       # prompt key -> target greedy output
        self.baseline_tps: dict[float, float] = {}         # temperature -> target alone tok/s

    def warm_up(self, arts) -> None:
        from dspark_convert.runtime.speculative import target_greedy

        ids = list(self.prompts[0].ids)
        n = min(WARMUP_TOKENS, self.max_new_tokens)
        target_greedy(self.model, ids, max_new_tokens=n, stop_token_ids=self.stops)
        for a in arts:
            KINDS[a.kind].generate(self.model, a.drafter, ids, max_new_tokens=n, temperature=0.0,
                                   threshold=0.0, stops=self.stops, seed=self.seed,
                                   stepwise=self.stepwise)

    def target(self, temperature: float) -> RunReport:
        probe = MemoryProbe(self.model.device)
        runs, latencies = [], []
        self.progress.start(f"target alone, T={temperature:g}", len(self.prompts))
        try:
            probe.start()
            for p in self.prompts:
                output, seconds, times = _target_sample(self.model, p.ids,
                                                        max_new_tokens=self.max_new_tokens,
                                                        temperature=temperature,
                                                        stop_token_ids=self.stops, seed=self.seed)
                if temperature == 0.0:
                    self.greedy[p.key] = output
                latencies += [b - a for a, b in zip(times, times[1:])]
                runs.append(PromptRun(id=p.key, category=p.category, prompt_tokens=len(p.ids),
                                      new_tokens=len(output) - len(p.ids),
                                      completion_ids=list(output[len(p.ids):]), seconds=seconds,
                                      acceptance_lengths=None, cycles=None, lossless=None))
                self.progress.advance(1)
            memory = probe.stop()
        finally:
            self.progress.finish()
        new = sum(r.new_tokens for r in runs)
        seconds = sum(r.seconds for r in runs)
        tps = new / seconds if seconds > 0 else None
        if tps:
            self.baseline_tps[temperature] = tps
        return RunReport(kind="target", artifact=None, temperature=temperature,
                         confidence_threshold=None, prompts=runs, new_tokens=new, seconds=seconds,
                         committed_tokens_per_second=tps, speedup=None, acceptance=None,
                         draft_seconds=None, draft_seconds_per_step=None,
                         verify_seconds_per_step=None, timing_note=None, peak_memory=memory,
                         lossless=None, confidence=None, confidence_temperatures=None,
                         method=TARGET, **_latency(latencies))

    def drafter(self, art: _Artifact, temperature: float, threshold: float):
        """The RunReport and the raw steps (proposed, accepted, confidence logits), the
        artifact's kind's loop (evaluate_kinds.KINDS) on every prompt."""
        generate = KINDS[art.kind].generate
        probe = MemoryProbe(self.model.device)
        runs, results = [], []
        label = f"{art.name}, T={temperature:g}, " + (f"threshold {threshold:g}" if threshold
                                                      else "cutoff off")
        self.progress.start(label, len(self.prompts))
        try:
            probe.start()
            for p in self.prompts:
                r = generate(self.model, art.drafter, list(p.ids),
                             max_new_tokens=self.max_new_tokens, temperature=temperature,
                             threshold=threshold, stops=self.stops, seed=self.seed,
                             stepwise=self.stepwise)
                lossless = None
                if temperature == 0.0 and p.key in self.greedy:
                    lossless = tuple(r.output_ids) == tuple(self.greedy[p.key])
                results.append(r)
                runs.append(PromptRun(id=p.key, category=p.category, prompt_tokens=len(p.ids),
                                      new_tokens=len(r.output_ids) - len(p.ids),
                                      completion_ids=list(r.output_ids[len(p.ids):]),
                                      seconds=r.total_seconds,
                                      acceptance_lengths=list(r.acceptance_lengths),
                                      cycles=[_cycle_record(c) for c in r.steps],
                                      lossless=lossless))
                self.progress.advance(1)
            memory = probe.stop()
        finally:
            self.progress.finish()
        cycles = [c for r in results for c in r.steps]
        acc = acceptance([(c.proposed, c.accepted) for c in cycles],
                         [a for r in results for a in r.acceptance_lengths],
                         block_size=art.positions, stop_token_ids=self.stops)
        draft_t = [c.draft_seconds for c in cycles if getattr(c, "draft_seconds", None) is not None]
        verify_t = [c.verify_seconds for c in cycles if getattr(c, "verify_seconds", None) is not None]
        timed = len(draft_t) == len(cycles) and len(verify_t) == len(cycles)
        latencies = [t for r in results for t in token_latencies(
            [(c.draft_seconds + c.verify_seconds, n) for c, n in zip(r.steps, r.acceptance_lengths)]
            if timed else [])]
        new = sum(len(r.output_ids) - len(p.ids) for r, p in zip(results, self.prompts))
        seconds = sum(r.total_seconds for r in results)
        tps = new / seconds if seconds > 0 else None
        base = self.baseline_tps.get(temperature)
        checks = [x.lossless for x in runs if x.lossless is not None]
        steps = [(c.proposed, c.accepted, c.confidence_logits) for c in cycles]
        confidence = None
        if art.has_confidence and threshold == 0.0:
            confidence = confidence_report(
                confidence_data(steps, block_size=art.block_size, stop_token_ids=self.stops),
                temperature=temperature)
        report = RunReport(
            kind="drafter", artifact=art.name, temperature=temperature,
            confidence_threshold=threshold, prompts=runs, new_tokens=new, seconds=seconds,
            committed_tokens_per_second=tps,
            speedup=tps / base if tps and base else None, acceptance=acc,
            draft_seconds=sum(r.draft_seconds for r in results),
            draft_seconds_per_step=spread(draft_t) if timed else None,
            verify_seconds_per_step=spread(verify_t) if timed else None,
            timing_note=None if timed else TIMING_MISSING, peak_memory=memory,
            lossless=(all(checks) if checks else None), confidence=confidence,
            confidence_temperatures=(list(art.calibration.temperatures)
                                     if art.calibration is not None and threshold > 0 else None),
            method=art.kind, **_latency(latencies))
        report = report.model_copy(update={"acceptance_by_depth": acceptance_by_depth(
            run_steps(report), art.positions)})
        per_prompt_steps = {p.key: [(c.proposed, c.accepted, c.confidence_logits) for c in r.steps]
                            for p, r in zip(self.prompts, results)}
        return report, per_prompt_steps


def _latency(values: Sequence[float]) -> dict:
    """RunReport's token_latency_p50_seconds / p99 (None without any)."""
    import numpy as np

    if not values:
        return {"token_latency_p50_seconds": None, "token_latency_p99_seconds": None}
    arr = np.asarray(values, dtype=np.float64)
    return {"token_latency_p50_seconds": float(np.percentile(arr, 50)),
            "token_latency_p99_seconds": float(np.percentile(arr, 99))}


# --- the whole eval -----------------------------------------------------------------------

def bind_artifacts(paths, names, opened, progress) -> tuple[list, dict, object]:
    """Every artifact validated against the opened target (the one pairing) before anything
    runs, a broken or foreign one refused, not skipped: (their _Artifact records, name ->
    Binding, the target's plan, made once). eval's and serve-bench's one binding loop.
    A DFlash2 or Gemma 4 assistant checkpoint directory (no drafter.gguf) is planned from
    its source (evaluate_kinds.bind_any); each record names its kind."""
    from dspark_convert.commands.evaluate_kinds import SourceBinding, bind_any

    arts, bindings, target_plan = [], {}, None
    for name, path in zip(names, paths):
        binding, kind = bind_any(path, opened, progress=progress, target_plan=target_plan)
        bindings[name], target_plan = binding, binding.target_plan   # planned once
        source = isinstance(binding, SourceBinding)
        plan = binding.drafter_plan
        arts.append(_Artifact(name=name, path=Path(path),
                              sha256=binding.sha256 if source else binding.report.gguf_sha256,
                              warnings=list(binding.warnings),
                              contract=getattr(plan, "contract", None), kind=kind, plan=plan,
                              source=source))
    return arts, bindings, target_plan


def prompts_for(prompt_set, opened, target_plan, max_new_tokens: int) -> list:
    """The prompt set resolved on the target's tokenizer and vocabulary, each prompt plus
    ``max_new_tokens`` checked to fit its context."""
    cfg = target_plan.config
    resolved = resolve_prompts(prompt_set, tokenizer=opened.tokenizer, vocab_size=cfg.vocab_size,
                               context=cfg.max_position_embeddings)
    check_context(resolved, prompt_set, max_new_tokens=max_new_tokens,
                  context=cfg.max_position_embeddings,
                  config=shown(opened.directory / "config.json"))
    return resolved


def run_eval(artifacts: Sequence[str | os.PathLike], target: str | os.PathLike,
             prompts: str | os.PathLike | PromptSet | None = None, *,
             temperatures: Sequence[float] = DEFAULT_TEMPERATURES,
             thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
             max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, seed: int = 0, device: str = "auto",
             calibrate: bool = False, held_out: float = DEFAULT_HELD_OUT,
             dtype: str = "float32", calibrations: Sequence[str | os.PathLike] = (),
             max_memory: int | None = None,
             on_estimate: Callable[[MemoryReport], None] | None = None,
             progress: Progress | None = None,
             run_progress: Progress | None = None,
             engine: str | Sequence[str] | None = None,
             target_gguf: str | os.PathLike | None = None) -> EvalReport:
    """Run the eval and return its report (see the module docstring). ``prompts``: a JSONL
    path, a loaded ``PromptSet`` or None (the package's golden prompt set). A threshold of
    0 is the cutoff-off run, always made. The per-artifact confidence metrics and
    ``calibrate`` (STS, split by prompt with ``held_out`` and ``seed``) use the threshold-0
    run at the first temperature; every threshold-0 run carries its own metrics.

    ``dtype``: the compute dtype of the target and every drafter (float32, the reference
    for DeepSpec's traces, or bfloat16); bfloat16 verifies token by token
    (``smoke.verify_mode``), so that temperature 0 stays lossless. ``calibrations``:
    calibration.json files (``--calibration``), each applied to the artifact whose
    drafter.gguf SHA-256 it names (refused, 93, when none or another target). ``progress``
    reports the checks (bytes read and hashed); ``run_progress`` (default: ``progress``)
    one bar per run, counted in prompts.

    Before loading, the memory estimate of the target with every artifact loaded beside it
    (runtime/memory.py, the one smoke makes) is checked against what the device has, or
    ``max_memory`` bytes: over it, MemoryBudgetError (78); ``on_estimate`` receives it, and
    the report records it.

    Raises a DSparkError for a bad input (before any run), EvalInterrupted on Ctrl-C once
    the runs have begun (a Ctrl-C while the inputs are checked and the models loaded is a
    plain KeyboardInterrupt: nothing to report).

    ``engine``: one or more of "llama.cpp=BIN_DIR" (with ``target_gguf``) and
    "dspark-mlx[=PYTHON]": each engine's own runs beside ours on the same prompts
    (commands/evaluate_engine.py, commands/evaluate_dspark_mlx.py), in the order given, each
    checked before anything runs."""
    progress = progress or NoProgress()
    run_progress = run_progress or progress
    # The options first: a bad one is refused before torch is imported.
    check_options(artifacts=artifacts, temperatures=temperatures, thresholds=thresholds,
                  max_new_tokens=max_new_tokens, seed=seed, held_out=held_out, dtype=dtype,
                  device=device, max_memory=max_memory)
    from dspark_convert.commands.evaluate_dspark_mlx import parse_python, run_dspark_mlx
    from dspark_convert.commands.evaluate_engine import (
        check_target_gguf,
        parse_engine,
        run_engine,
        split_engines,
    )

    engines = split_engines(engine, target_gguf)
    engine_spec = (parse_engine(f"llama.cpp={engines['llama.cpp']}", target_gguf)
                   if "llama.cpp" in engines else None)
    # dspark-mlx's interpreter is run once (what it runs: 114 unless the pinned versions).
    mlx_spec = parse_python(engines["dspark-mlx"]) if "dspark-mlx" in engines else None
    from dspark_convert.commands.binding import refuse_family
    for artifact in artifacts:
        refuse_family(artifact, "eval")
    # Each --calibration is read (its schema checked) before torch is imported, the
    # artifacts are validated and the target is hashed: a missing, FIFO or malformed file is
    # one line at once. Matched with its artifact and the target's identity after those.
    calibration_files = [(c, *read_calibration_file(c)) for c in calibrations]
    engine_infos, engine_runs = [], []
    from dspark_convert.commands.binding import open_run_target
    from dspark_convert.commands.smoke import resolve_device, verify_mode
    from dspark_convert.runtime.loading import compute_dtype
    from dspark_convert.runtime.memory import checked_estimate
    from dspark_convert.runtime.weights import load_drafter_weights

    torch_dtype, verify = compute_dtype(dtype), verify_mode("auto", dtype)
    temps = _unique(temperatures)
    cuts = [c for c in _unique(thresholds) if c > 0.0]
    prompt_set = prompts if isinstance(prompts, PromptSet) else load_prompt_set(prompts)
    settings = EvalSettings(temperatures=temps, thresholds=cuts, max_new_tokens=max_new_tokens,
                            seed=seed, device=device, dtype=dtype, verify=verify,
                            calibrate=calibrate, held_out=held_out, warmup=True)
    paths = [Path(a) for a in artifacts]
    names = artifact_names(paths)

    # Every artifact is validated against the target (the one pairing) before anything
    # runs: a broken or foreign one is refused, not skipped.
    opened = open_run_target(target, progress)
    arts, bindings, target_plan = bind_artifacts(paths, names, opened, progress)
    cfg = target_plan.config
    resolved = prompts_for(prompt_set, opened, target_plan, max_new_tokens)
    identity = target_identity(opened, progress)
    match_calibrations(calibration_files, arts, identity)
    if engine_spec is not None:
        # --target-gguf checked against every artifact as `dspark export` checks it (104),
        # before the model loads: llama.cpp's runs of another model are no report.
        check_target_gguf(engine_spec, arts)

    plan: list[tuple[str, _Artifact | None, float, float | None]] = []
    plan += [("target", None, t, None) for t in temps]
    plan += [("drafter", a, t, 0.0) for a in arts for t in temps]
    plan += [("drafter", a, t, c) for a in arts for t in temps for c in cuts]

    try:
        dev = resolve_device(device)
    except DeviceUnavailableError as exc:
        return _no_device_report(exc.message, arts, plan, settings, prompt_set, device,
                                 identity, calibrate=calibrate)

    # Every drafter of every kind (runtime/memory.py drafter_shape), before any weight loads.
    estimated = [bindings[a.name].drafter_plan for a in arts]
    memory = None if not estimated else checked_estimate(target_plan, estimated,
                              dtype=torch_dtype, device=dev,
                              longest_prompt=max(len(p.ids) for p in resolved),
                              max_new_tokens=max_new_tokens, max_memory=max_memory,
                              smaller="fewer artifacts, shorter prompts or fewer new tokens")
    if on_estimate is not None and memory is not None:
        on_estimate(memory)

    # Loaded once, in the compute dtype, on the device (runtime/loading.py).
    runtime = bindings[arts[0].name].runtime   # the target's family's
    model = runtime.Target(opened.directory, device=dev, dtype=torch_dtype,
                           plan=target_plan, progress=progress)
    for a in arts:                     # each by its kind's loader (evaluate_kinds.KINDS)
        a.drafter = KINDS[a.kind].load(model, bindings[a.name].drafter_plan, path=a.path,
                                       device=dev, dtype=torch_dtype, runtime=runtime,
                                       confidence_temperatures=a.calibration.temperatures
                                       if a.calibration is not None else None, progress=progress)
    environment = describe_environment(dev, device, dtype)

    runner = _Runner(model=model, prompts=resolved, max_new_tokens=max_new_tokens, seed=seed,
                     stepwise=verify == "stepwise", progress=run_progress)
    runs: list[RunReport] = []
    not_run: list[NotRun] = []
    steps_by_run: dict[tuple[str, float], dict[str, list]] = {}
    fitted: dict[str, tuple] = {}      # --calibrate: artifact -> (file, held-out raw, calibrated)
    done = 0                           # plan entries finished (run or listed in not_run)
    interrupted = False
    try:
        runner.warm_up(arts)
        for kind, art, t, c in plan:
            if kind == "target":
                runs.append(runner.target(t))
            elif _never_runs(art, c, t) is not None:
                not_run.append(NotRun(kind="drafter", artifact=art.name, temperature=t,
                                      confidence_threshold=c, reason=_never_runs(art, c, t),
                                      method=art.kind))
            else:
                report, steps = runner.drafter(art, t, c)
                runs.append(report)
                if c == 0.0:
                    steps_by_run[(art.name, t)] = steps
            done += 1
        for art in arts if calibrate else []:
            result = _calibrate(art, steps_by_run.get((art.name, temps[0])), resolved,
                                stops=runner.stops, identity=identity, prompt_set=prompt_set,
                                temperature=temps[0], held_out=held_out, seed=seed)
            if isinstance(result, str):
                not_run.append(NotRun(kind="calibration", artifact=art.name, temperature=temps[0],
                                      confidence_threshold=0.0, reason=result))
            else:
                fitted[art.name] = result
        for name in engines:
            # An engine runs converted artifacts of the kinds it takes; the rest are not run.
            taken, refused = _engine_arts(name, arts)
            not_run += refused
            if name == "llama.cpp":
                engine_info, runs_of, engine_not_run = run_engine(
                    engine_spec, arts=taken, prompts=resolved,
                    texts={r.key: r.prompt for r in prompt_set.records}, model=model,
                    max_new_tokens=max_new_tokens, temperatures=temps, thresholds=cuts,
                    stops=runner.stops, progress=run_progress)
            else:
                engine_info, runs_of, engine_not_run = run_dspark_mlx(
                    mlx_spec, arts=taken, prompts=resolved, target=opened, model=model,
                    max_new_tokens=max_new_tokens, temperatures=temps, thresholds=cuts,
                    stops=runner.stops, vocab_size=cfg.vocab_size, progress=run_progress)
            engine_infos.append(engine_info)
            engine_runs += runs_of
            not_run += engine_not_run
    except KeyboardInterrupt:
        interrupted = True
        # What the interruption stopped; what could never have run keeps its own reason.
        reason = "interrupted (Ctrl-C) before it finished"
        not_run += [NotRun(kind=kind, artifact=art.name if art else None, temperature=t,
                           confidence_threshold=c,
                           reason=(art and _never_runs(art, c, t)) or reason,
                           method=art.kind if art else TARGET)
                    for kind, art, t, c in plan[done:]]
        listed = {n.artifact for n in not_run if n.kind == "calibration"}
        not_run += [NotRun(kind="calibration", artifact=a.name, temperature=temps[0],
                           confidence_threshold=0.0,
                           reason=_never_calibrates(a, len(resolved)) or reason)
                    for a in arts if calibrate and a.name not in fitted
                    and a.name not in listed]
        finished = {e.engine for e in engine_infos}
        not_run += [NotRun(kind="target", artifact=None, temperature=0.0,
                           confidence_threshold=None, engine=name, reason=reason)
                    for name in engines if name not in finished]

    artifacts_out = []
    for art in arts:
        primary = next((r for r in runs if r.kind == "drafter" and r.artifact == art.name
                        and r.temperature == temps[0] and r.confidence_threshold == 0.0), None)
        cal, held_raw, held_cal = fitted.get(art.name, (None, None, None))
        steps = steps_by_run.get((art.name, temps[0]))
        with_temps = None
        if art.calibration is not None and primary is not None and steps is not None:
            with_temps = confidence_report(
                confidence_data([s for k in steps for s in steps[k]], block_size=art.block_size,
                                stop_token_ids=runner.stops),
                temperature=temps[0], temperatures=art.calibration.temperatures)
        artifacts_out.append(ArtifactReport(
            name=art.name, path=shown(art.path), drafter_gguf_sha256=art.sha256,
            block_size=art.block_size, markov_head=art.markov, confidence_head=art.has_confidence,
            validate_warnings=art.warnings, confidence=primary.confidence if primary else None,
            calibration=cal, calibration_file=f"calibration-{art.name}.json" if cal else None,
            held_out_raw=held_raw, held_out_calibrated=held_cal,
            calibration_applied=art.applied, confidence_calibrated=with_temps,
            **_kind_fields(art)))
    checks = [r.lossless for r in runs if r.kind == "drafter" and r.lossless is not None]
    report = EvalReport(
        complete=not interrupted,
        incomplete_reason="interrupted (Ctrl-C)" if interrupted else None,
        settings=settings, environment=environment, target=identity,
        prompt_set=prompt_set.info(), artifacts=artifacts_out, runs=runs, not_run=not_run,
        lossless=all(checks) if checks else None, memory_estimate=memory,
        engine=engine_infos[0] if engine_infos else None, engines=engine_infos,
        engine_runs=engine_runs)
    if interrupted:
        raise EvalInterrupted(report) from None
    return report


def _kind_fields(art: _Artifact) -> dict:
    """ArtifactReport's ``method`` and, for a checkpoint run from its source directory,
    the weights file its SHA-256 is of."""
    files = sorted({Path(t.file).name for t in art.plan.tensors.values()}) if art.source else []
    return {"method": art.kind, "weights_file": ", ".join(files) if files else None}


def _never_runs(art: _Artifact, threshold: float, temperature: float = 0.0) -> str | None:
    """Why a drafter run of the plan can never run whatever happens (None: it can): its
    kind's row says (evaluate_kinds.KINDS: a threshold without a confidence head, DFlash2
    above temperature 0 with its own refusal's reason)."""
    return never_runs(art.kind, temperature, threshold, art.has_confidence)


# The kinds eval hands each engine of --engine: DSpark-family artifacts, which
# commands/evaluate_engine.run_engine and commands/evaluate_dspark_mlx.run_dspark_mlx run;
# llama.cpp takes more once run_engine's module names them (its RUN_ENGINE_KINDS).
ENGINE_KINDS = {"llama.cpp": frozenset({"dspark", "dflash"}),
                "dspark-mlx": frozenset({"dspark", "dflash"})}


def engine_kinds(engine: str) -> frozenset[str]:
    """The drafter kinds eval hands ``engine`` (ENGINE_KINDS, or for llama.cpp what
    commands/evaluate_engine declares it runs)."""
    if engine == "llama.cpp":
        from dspark_convert.commands import evaluate_engine

        return frozenset(getattr(evaluate_engine, "RUN_ENGINE_KINDS", ENGINE_KINDS[engine]))
    return ENGINE_KINDS.get(engine, frozenset())


def _engine_arts(engine: str, arts: list[_Artifact]) -> tuple[list[_Artifact], list[NotRun]]:
    """The artifacts ``engine`` is handed, and a not-run entry, with the reason, for each
    drafter of a kind eval does not hand it."""
    taken, refused = [], []
    kinds = engine_kinds(engine)
    for a in arts:
        if a.kind not in kinds:
            runs = " and ".join(KINDS[k].label for k in KINDS if k in kinds)
            reason = (f"eval's {engine} runs take {runs} drafters; a {KINDS[a.kind].label} "
                      f"drafter is not one of them")
        else:
            taken.append(a)
            continue
        refused.append(NotRun(kind="drafter", artifact=a.name, temperature=0.0,
                              confidence_threshold=0.0, reason=reason, engine=engine,
                              method=a.kind))
    return taken, refused


def _never_calibrates(art: _Artifact, prompts: int) -> str | None:
    """Why --calibrate can never fit this artifact on this prompt set (None: it can)."""
    if not art.has_confidence:
        return "the artifact has no confidence head"
    if prompts < 2:
        return f"{prompts} prompt(s): a calibration split and a held-out split need at least 2"
    return None


def _calibrate(art: _Artifact, steps: dict[str, list] | None, prompts: list[Prompt], *, stops,
               identity, prompt_set: PromptSet, temperature: float, held_out: float, seed: int):
    """(CalibrationFile, held-out raw, held-out calibrated), or why it could not be made."""
    never = _never_calibrates(art, len(prompts))
    if never is not None:
        return never
    if steps is None:
        return "its threshold-0 run did not finish"
    split = split_prompts([p.key for p in prompts], held_out=held_out, seed=seed)
    fit_keys, held_keys = split
    fit = confidence_data([s for k in fit_keys for s in steps[k]], block_size=art.block_size,
                          stop_token_ids=stops)
    held = confidence_data([s for k in held_keys for s in steps[k]], block_size=art.block_size,
                           stop_token_ids=stops)
    if len(fit.lengths) == 0:
        return "the calibration split has no verify step with draft tokens"
    cal = fit_calibration(fit, held, artifact=shown(art.path), drafter_gguf_sha256=art.sha256,
                          target=identity, prompt_set_sha256=prompt_set.sha256,
                          split=CalibrationSplit(seed=seed, held_out=held_out,
                                                 calibration_ids=fit_keys, held_out_ids=held_keys),
                          decoding_temperature=temperature)
    return (cal, confidence_report(held, temperature=temperature),
            confidence_report(held, temperature=temperature, temperatures=cal.temperatures))


def match_calibrations(files: Sequence[tuple[str | os.PathLike, CalibrationFile, str]],
                        arts: list[_Artifact], identity: TargetIdentity) -> None:
    """``--calibration FILE``... (``files``: each path with read_calibration_file's (file,
    SHA-256), read before the runs): each file to the artifact whose drafter.gguf SHA-256
    it names (with one artifact, that one: the refusal then names both hashes), checked
    against the artifact's block size and the target's identity (calibration.py)."""
    for path, cal, sha256 in files:
        art = next((a for a in arts if a.sha256 == cal.drafter_gguf_sha256), None)
        if art is None and len(arts) == 1:
            art = arts[0]
        if art is None:
            raise CalibrationMismatchError(
                f"calibration {path}: made for drafter.gguf SHA-256 "
                f"{cal.drafter_gguf_sha256[:12]}…, which none of the {len(arts)} artifacts has",
                path=str(path), field="drafter_gguf_sha256",
                expected=" or ".join(a.sha256 for a in arts), found=cal.drafter_gguf_sha256)
        check_calibration(cal, path, drafter_gguf_sha256=art.sha256, block_size=art.block_size,
                          target=identity)
        if not art.has_confidence:
            raise CalibrationMismatchError(
                f"calibration {path}: the artifact {art.path} has no confidence head; "
                "expected a calibration for a DSpark drafter with one", path=str(path),
                field="drafter_gguf_sha256", expected="an artifact with a confidence head",
                found=str(art.path))
        if art.calibration is not None:
            raise EvalInputError(f"--calibration: {path} and {art.applied.path} are both for "
                                 f"{art.path}; expected one calibration per artifact",
                                 path=str(path), field="calibration",
                                 expected="one per artifact", found=2)
        art.calibration, art.applied = cal, applied(cal, path, sha256)


def _no_device_report(reason: str, arts: list[_Artifact], plan, settings: EvalSettings,
                      prompt_set: PromptSet, requested: str, identity: TargetIdentity, *,
                      calibrate: bool) -> EvalReport:
    """--device cuda without CUDA: nothing runs; every combination says why."""
    not_run = [NotRun(kind=kind, artifact=art.name if art else None, temperature=t,
                      confidence_threshold=c, reason=(art and _never_runs(art, c, t)) or reason,
                      method=art.kind if art else TARGET)
               for kind, art, t, c in plan]
    if calibrate:
        not_run += [NotRun(kind="calibration", artifact=a.name, temperature=settings.temperatures[0],
                           confidence_threshold=0.0,
                           reason=_never_calibrates(a, len(prompt_set.records)) or reason)
                    for a in arts]
    out = []
    for a in arts:
        out.append(ArtifactReport(name=a.name, path=shown(a.path), drafter_gguf_sha256=a.sha256,
                                  block_size=a.block_size, markov_head=a.markov,
                                  confidence_head=a.has_confidence, validate_warnings=a.warnings,
                                  confidence=None, calibration=None, calibration_file=None,
                                  held_out_raw=None, held_out_calibrated=None,
                                  calibration_applied=a.applied, confidence_calibrated=None,
                                  **_kind_fields(a)))
    return EvalReport(complete=True, incomplete_reason=None, settings=settings,
                      environment=describe_environment(None, requested, settings.dtype),
                      target=identity,
                      prompt_set=prompt_set.info(), artifacts=out, runs=[], not_run=not_run,
                      lossless=None)
