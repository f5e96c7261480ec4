"""`dspark smoke`: run a converted drafter against its target and prove it.

``run_smoke`` validates the artifact (refusing with the failed check's own exit code),
binds the drafter to the target (geometry, and the embedding/head SHA-256 the GGUF records),
runs the speculative loop on each prompt and returns a frozen ``SmokeResult``: tau (mean
accepted+1 per verify step), acceptance rate by draft position, drafted and committed
tokens per second, the load time, the time per verify forward and per draft block, the
memory estimate and the measured peak. It fails loudly:

- temperature 0: the output must equal the target's own greedy output in the same dtype
  (losslessness; ``LosslessnessError``), whatever the drafter;
- ``reference``: every run is compared cycle by cycle with the run of the same prompt and
  settings in a DeepSpec reference.json (``ReferenceDivergenceError`` names run, cycle,
  field). At temperature > 0 this holds with the reference's seed: the random draws follow
  DeepSpec's order (seed 7 reproduces the golden runs). A reference computed in another
  dtype (DeepSpec's traces are float32; a bfloat16 run differs by rounding) is compared
  and the agreement reported per run (``reference_agreement``), not enforced;
- ``min_tau``: tau below the floor (``AcceptanceFloorError``).

Before any weight is loaded: the target's config and headers and the artifact's tensor
table are checked (plans), each prompt plus ``max_new_tokens`` must fit the target's
context (``max_position_embeddings``), and the memory estimate must fit what the device
has, or ``max_memory`` (``MemoryBudgetError``); ``on_estimate`` receives the estimate
then, so that the CLI prints it before the load starts. The weights are then loaded once,
in the compute dtype, on the compute device.

The trace (reference.json format, with the dtype) and the PNG are written atomically
before the verdict, so a failing run can be inspected.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from dspark_convert.commands.binding import bind, open_run_target, target_read
from dspark_convert.errors import (
    AcceptanceFloorError,
    CalibrationFileError,
    DeviceUnavailableError,
    DSparkError,
    InvalidArtifactError,
    LosslessnessError,
    ReferenceTraceError,
    SmokeInputError,
)
from dspark_convert.util.atomic import Output, atomic_files, check_outputs
from dspark_convert.util.json_out import dumps
from dspark_convert.util.paths import check_path
from dspark_convert.util.progress import NoProgress, Progress
from dspark_convert.evaluation.calibration import (
    AppliedCalibration,
    applied,
    check_calibration,
    read_calibration_file,
)
from dspark_convert.runtime.budget import MemoryReport
from dspark_convert.target.prompt import check_context, check_ids, encode_text
from dspark_convert.util.text import shown_int


class ReferenceAgreement(BaseModel):
    """A run against its reference run (runtime/trace.py ``Agreement``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    reference_dtype: str
    identical: bool                    # every cycle, acceptance length and token
    cycles: int                        # the reference's cycles
    cycles_tokens_identical: int       # leading cycles with the same tokens and counts
    confidence_max_abs_difference: float | None   # over those cycles
    new_tokens: int                    # the reference's generated tokens
    new_tokens_identical: int          # leading generated tokens equal
    first_difference: str | None


class RunSummary(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt: list[int]
    output_ids: list[int]
    new_tokens: int
    verify_steps: int
    tau: float | None                  # None (null): no verify step ran, tau is undefined
    lossless: bool | None              # temperature 0: equals the target's greedy output
    reference_run: int | None          # index of the reference run it was compared with
    reference_agreement: ReferenceAgreement | None   # enforced when the dtypes are the same


class SmokeResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    artifact: str
    target: str
    device: str
    dtype: str
    verify: str                                  # batched or stepwise (runtime/speculative.py)
    temperature: float
    confidence_threshold: float
    seed: int
    max_new_tokens: int
    block_size: int
    runs: list[RunSummary]
    tau: float | None                            # over every verify step of every run;
                                                 # None: no verify step ran (undefined)
    acceptance_by_position: list[float | None]   # P(accepted > i | proposed > i), DeepSpec's
    drafted_tokens: int
    committed_tokens: int
    drafted_tokens_per_second: float             # drafted tokens / time in the drafter
    committed_tokens_per_second: float           # new tokens / speculative wall time
    target_only_tokens_per_second: float | None  # the greedy baseline (temperature 0)
    load_seconds: float                          # target + drafter weights, once
    verify_seconds_per_cycle: float | None       # mean target verify forward
    draft_seconds_per_cycle: float | None        # mean drafter proposal + context update
    memory: MemoryReport
    lossless: bool | None
    reference: str | None
    min_tau: float | None
    warnings: list[str]                          # validate's warnings
    trace: str | None
    plot: str | None
    calibration: AppliedCalibration | None = None  # --calibration: applied before the threshold


VERIFY_MODES = ("auto", "batched", "stepwise")


def verify_mode(verify: str, dtype: str) -> str:
    """``--verify``: auto is batched in float32 (rows of one forward round ~1e-6 apart from
    single-token rows: far below any logit margin; DeepSpec's traces are batched) and
    stepwise in bfloat16 (rows round one ulp apart, which flips an argmax at a near-tie, so
    only token-by-token verification reproduces the target's greedy output exactly)."""
    if verify not in VERIFY_MODES:
        raise SmokeInputError(f"--verify: expected one of {', '.join(VERIFY_MODES)}, found "
                              f"{verify!r}", field="verify", expected="|".join(VERIFY_MODES),
                              found=str(verify))
    if verify == "auto":
        return "stepwise" if dtype == "bfloat16" else "batched"
    return verify


def _check_options(*, max_new_tokens: int, temperature: float, confidence_threshold: float,
                   min_tau: float | None, seed: int, max_memory: int | None) -> None:
    from dspark_convert.runtime.sampling import check_seed, check_temperature

    if max_new_tokens < 1:
        raise SmokeInputError(f"--max-new-tokens: expected at least 1, found {shown_int(max_new_tokens)}",
                              field="max_new_tokens", expected=">= 1", found=shown_int(max_new_tokens))
    check_temperature(temperature, error=SmokeInputError)
    if not 0.0 <= confidence_threshold <= 1.0:
        raise SmokeInputError(f"--confidence-threshold: expected 0..1, found {confidence_threshold}",
                              field="confidence_threshold", expected="0..1",
                              found=confidence_threshold)
    if min_tau is not None and not min_tau >= 0.0:
        raise SmokeInputError(f"--min-tau: expected a non-negative number, found {min_tau}",
                              field="min_tau", expected=">= 0", found=min_tau)
    check_seed(seed, error=SmokeInputError)
    if max_memory is not None and max_memory <= 0:
        raise SmokeInputError(f"--max-memory: expected a positive size, found {shown_int(max_memory)}",
                              field="max_memory", expected="> 0", found=shown_int(max_memory))


def resolve_device(device: str):
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda":
        if not torch.cuda.is_available():
            raise DeviceUnavailableError("--device cuda: CUDA is not available on this machine "
                                         f"(torch {torch.__version__}, built with CUDA "
                                         f"{torch.version.cuda or 'none'})", field="device",
                                         expected="a CUDA device", found="none")
        return torch.device("cuda")
    if device == "cpu":
        return torch.device("cpu")
    raise SmokeInputError(f"--device: expected auto, cpu or cuda, found {device!r}",
                          field="device", expected="auto|cpu|cuda", found=device)


def _write_reports(reports) -> None:
    """--trace and --plot are reports of this run: replaced when they exist (like a test
    runner's report), published together through hidden temporaries (util/atomic.py), so
    that a failure writing one (a full disk) leaves neither, and any old ones as they were."""
    atomic_files(reports, force=True)


def tau_text(tau: float | None) -> str:
    """tau for people: undefined (null in JSON) when no verify step ran, never 0.000."""
    return "tau undefined (no verify step ran)" if tau is None else f"tau {tau:.3f}"


def _plot(rates: list[float | None], tau: float | None, title: str):
    """The PNG of acceptance by draft position, rendered now: ``write(fh)`` saves it."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    try:
        positions = list(range(len(rates)))
        ax.bar(positions, [r if r is not None else 0.0 for r in rates], color="C0")
        ax.set_xticks(positions)
        ax.set_ylim(0, 1)
        ax.set_xlabel("draft position")
        ax.set_ylabel("acceptance rate")
        ax.set_title(f"{title}  ({tau_text(tau)})", fontsize=9)
        fig.tight_layout()
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=100)
    finally:
        plt.close(fig)
    data = png.getvalue()
    return lambda fh: fh.write(data)


def _peak_rss() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024   # Linux: KiB


def run_smoke(artifact: str | os.PathLike, *, target: str | os.PathLike,
              prompts: list[list[int]] | None = None, prompt_text: str | None = None,
              max_new_tokens: int = 64, temperature: float = 0.0,
              confidence_threshold: float = 0.0, seed: int = 0, device: str = "auto",
              dtype: str = "float32", verify: str = "auto", max_memory: int | None = None,
              trace: str | os.PathLike | None = None, plot: str | os.PathLike | None = None,
              reference: str | os.PathLike | None = None, min_tau: float | None = None,
              progress: Progress | None = None,
              calibration: str | os.PathLike | None = None,
              on_estimate: Callable[[MemoryReport], None] | None = None,
              reads: Sequence[tuple[str | os.PathLike, str]] = (),
              before_reports: Callable[[SmokeResult], None] | None = None) -> SmokeResult:
    """Run the artifact's drafter on ``target`` for each prompt and check the result.

    ``dtype``: the compute dtype, float32 (the reference for DeepSpec's traces) or bfloat16.
    ``verify``: batched, stepwise or auto (``verify_mode``).
    ``max_memory``: bytes to check the memory estimate against instead of what the device
    has available. ``on_estimate``: called with the estimate once it has passed, before
    the weights are loaded. ``reads``: (path, what) of other inputs of the same command
    (``smoke --compare``'s parent), which --trace and --plot must stay out of too.
    ``before_reports``: called with the passing result before --trace and --plot are
    written (``smoke --compare`` runs the parent there); when it raises, neither is: a
    failed command leaves no report. A run that fails its own verdict (losslessness,
    --reference, --min-tau) writes its reports first, so that it can be inspected."""
    progress = progress or NoProgress()
    _check_options(max_new_tokens=max_new_tokens, temperature=temperature,
                   confidence_threshold=confidence_threshold, min_tau=min_tau, seed=seed,
                   max_memory=max_memory)
    check_path(artifact, what="the artifact", error=InvalidArtifactError)
    from dspark_convert.commands.binding import refuse_family
    refuse_family(artifact, "smoke")
    if reference is not None:
        check_path(reference, what="--reference", error=ReferenceTraceError)
    if calibration is not None:
        check_path(calibration, what="--calibration", error=CalibrationFileError)
    # The one output rule (util/atomic.py), before any work: --trace and --plot replace
    # what was there (they are this run's reports) but never anything the run reads (a
    # report inside the artifact or the target would change what it reports on; over one
    # of their files, delete it), nor each other.
    outputs = [Output(out, what, directory=False)
               for out, what in ((trace, "--trace"), (plot, "--plot")) if out is not None]
    check_outputs(outputs, [(artifact, "the artifact"), target_read(target),
                            (reference, "the --reference trace"),
                            (calibration, "the --calibration file"), *reads], force=True)
    # The calibration file is read (and its schema checked) before torch is imported and the
    # target hashed: a missing, FIFO or malformed file is one line at once, not after the
    # target's identity (gigabytes of hashing at released scale). Matched after the pairing.
    cal_file = read_calibration_file(calibration) if calibration is not None else None
    import torch

    from dspark_convert.runtime.loading import compute_dtype, dtype_name
    from dspark_convert.runtime.memory import checked_estimate
    from dspark_convert.runtime.speculative import speculative_generate, target_greedy
    from dspark_convert.runtime.trace import (
        agreement,
        find_reference_run,
        implied_max_new_tokens,
        load_reference,
        run_to_json,
        trace_to_json,
    )
    from dspark_convert.runtime.weights import load_drafter_weights

    torch_dtype = compute_dtype(dtype)
    dtype = dtype_name(torch_dtype)
    verify = verify_mode(verify, dtype)
    artifact = Path(artifact)
    dev = resolve_device(device)
    # The one pairing (validate with the target), then everything that can be checked
    # without the weights, before loading them.
    # The reference is read before the pairing: a bad or oversized one is refused at once.
    ref_runs = load_reference(reference) if reference is not None else None
    binding = bind(artifact, open_run_target(target, progress), progress=progress)
    target_plan, drafter_plan = binding.target_plan, binding.drafter_plan
    # The drafter's kind (commands/evaluate_kinds.py): DSpark and DFlash run in
    # runtime/speculative.py's loop, DFlash2 and the Gemma 4 assistant in their own.
    from dspark_convert.commands.evaluate_kinds import DFLASH, DSPARK, KINDS, kind_of_plan

    kind = KINDS[kind_of_plan(drafter_plan)]
    own_loop = kind.name not in (DSPARK, DFLASH)     # runtime/speculative.py's loop
    if own_loop:
        _check_own_loop(kind, artifact, temperature=temperature,
                        confidence_threshold=confidence_threshold, reference=reference,
                        calibration=calibration)
    target_dir = target_plan.directory
    warnings = binding.warnings
    calibrated = (_calibration(cal_file, calibration, binding, progress)
                  if cal_file is not None else None)
    cfg = target_plan.config
    vocab, stops = cfg.vocab_size, cfg.stop_token_ids

    all_prompts = [list(p) for p in prompts or []]
    context, config = cfg.max_position_embeddings, target_plan.directory / "config.json"
    if prompt_text is not None:
        all_prompts.append(encode_text(binding.target.tokenizer, prompt_text, context=context,
                                       where="--prompt", error=SmokeInputError))
    if not all_prompts:
        if ref_runs is None:
            raise SmokeInputError("no prompt: pass --prompt-ids, --prompt or --reference",
                                  field="prompt", expected="a prompt", found="none")
        all_prompts = [list(r.prompt) for r in ref_runs
                       if r.temperature == temperature and r.confidence_threshold == confidence_threshold]
        if not all_prompts:
            raise ReferenceTraceError(f"reference {reference}: no run at temperature {temperature:g}, "
                                      f"confidence threshold {confidence_threshold:g}",
                                      path=str(reference), found="none")
    for i, ids in enumerate(all_prompts):
        check_ids(ids, vocab, where=f"prompt {i}", error=SmokeInputError)
        check_context(len(ids), max_new_tokens, context=context, config=config,
                      where=f"prompt {i}", error=SmokeInputError, path=str(config))
    matched = []
    if ref_runs is not None:
        for ids in all_prompts:
            ref = find_reference_run(ref_runs, ids, temperature, confidence_threshold, path=str(reference))
            implied = implied_max_new_tokens(ref, stops)
            if implied is not None and implied != max_new_tokens:
                raise ReferenceTraceError(
                    f"reference {reference}: runs[{ref.index}] generated {implied} new tokens; "
                    f"--max-new-tokens is {max_new_tokens}: the settings differ",
                    path=str(reference), field="max_new_tokens", expected=implied,
                    found=max_new_tokens)
            matched.append(ref)

    memory = checked_estimate(target_plan, drafter_plan, dtype=torch_dtype, device=dev,
                              longest_prompt=max(len(p) for p in all_prompts),
                              max_new_tokens=max_new_tokens, max_memory=max_memory,
                              smaller="a shorter prompt or fewer new tokens")
    if on_estimate is not None:
        on_estimate(memory)

    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    t_load = time.perf_counter()
    runtime = binding.runtime            # the target's family's (runtime/qwen3.py, gemma4.py)
    model = runtime.Target(target_dir, device=dev, dtype=torch_dtype, plan=target_plan,
                           progress=progress)
    if own_loop:
        drafter = kind.load(model, drafter_plan, path=artifact, device=dev, dtype=torch_dtype,
                            runtime=runtime, confidence_temperatures=None, progress=progress)
    else:
        weights = load_drafter_weights(artifact, device=dev, dtype=torch_dtype,
                                       plan=drafter_plan, progress=progress)
        drafter = runtime.Drafter(weights, embed=model.embed, lm_head=model.lm_head, device=dev,
                                  confidence_temperatures=(calibrated.temperatures
                                                           if calibrated else None))
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    load_seconds = time.perf_counter() - t_load

    runs_json, summaries, results, greedy_seconds = [], [], [], 0.0
    lossless_failure = None
    enforced = []          # (run index, reference run): same dtype, compared exactly
    progress.start("smoke", len(all_prompts))
    try:
        for i, ids in enumerate(all_prompts):
            if own_loop:
                run = _as_run(kind.generate(model, drafter, ids, max_new_tokens=max_new_tokens,
                                            temperature=temperature, threshold=0.0,
                                            stops=stops, seed=seed,
                                            stepwise=verify == "stepwise"),
                              ids, temperature=temperature, seed=seed)
            else:
                run = speculative_generate(model, drafter, ids, max_new_tokens=max_new_tokens,
                                           temperature=temperature,
                                           confidence_threshold=confidence_threshold,
                                           stop_token_ids=stops, seed=seed,
                                           stepwise_verify=verify == "stepwise")
            greedy = None
            if temperature == 0.0:
                g = target_greedy(model, ids, max_new_tokens=max_new_tokens, stop_token_ids=stops)
                greedy, greedy_seconds = g.output_ids, greedy_seconds + g.seconds
                if greedy != run.output_ids and lossless_failure is None:
                    lossless_failure = (i, run.output_ids, greedy)
            results.append(run)
            run_json = run_to_json(run, max_new_tokens=max_new_tokens, target_greedy=greedy)
            runs_json.append(run_json)
            agreed = None
            if matched:
                ref = matched[i]
                found = agreement(run_json, ref, label=f"prompt {i}", path=str(reference))
                agreed = ReferenceAgreement(**found.__dict__)
                if ref.dtype == dtype:
                    enforced.append((i, ref))
            steps = len(run.acceptance_lengths)
            summaries.append(RunSummary(
                prompt=ids, output_ids=list(run.output_ids), new_tokens=run.new_tokens,
                verify_steps=steps, tau=sum(run.acceptance_lengths) / steps if steps else None,
                lossless=None if greedy is None else greedy == run.output_ids,
                reference_run=matched[i].index if matched else None,
                reference_agreement=agreed))
            progress.advance(1)
    finally:
        progress.finish()

    B = kind.positions(drafter_plan) if own_loop else drafter.block_size
    proposed_at, accepted_at = [0] * B, [0] * B
    for run in results:
        for cycle in run.cycles:
            for k in range(B):
                proposed_at[k] += len(cycle.proposed) > k
                accepted_at[k] += cycle.accepted > k
    steps = [a for run in results for a in run.acceptance_lengths]
    tau = sum(steps) / len(steps) if steps else None
    drafted = sum(len(c.proposed) for run in results for c in run.cycles)
    committed = sum(run.new_tokens for run in results)
    draft_s = sum(run.draft_seconds for run in results)
    total_s = sum(run.total_seconds for run in results)
    cycles = [c for run in results for c in run.cycles]
    rates = [accepted_at[k] / proposed_at[k] if proposed_at[k] else None for k in range(B)]

    reports = []
    if trace is not None:
        doc = trace_to_json(runs_json, case=artifact.name, target=str(target_dir), dtype=dtype)
        text = dumps(doc, indent=1) + "\n"     # before any file is opened: NaN refused
        reports.append((trace, lambda fh: fh.write(text.encode())))
    if plot is not None:
        reports.append((plot, _plot(rates, tau,
                                    f"{artifact.name}: acceptance by draft position ({dtype})")))
    try:
        _verdict(lossless_failure, enforced, runs_json, reference, tau, min_tau, dtype)
    except DSparkError:
        if reports:          # a failing run's reports are written, so that it can be inspected
            _write_reports(reports)
        raise
    memory = memory.model_copy(update={
        "peak_rss_bytes": _peak_rss(),
        "cuda_max_allocated_bytes": torch.cuda.max_memory_allocated(dev) if dev.type == "cuda"
        else None})
    result = SmokeResult(
        artifact=str(artifact), target=str(target_dir), device=str(dev), dtype=dtype,
        verify=verify, temperature=temperature, confidence_threshold=confidence_threshold, seed=seed,
        max_new_tokens=max_new_tokens, block_size=B, runs=summaries, tau=tau,
        acceptance_by_position=rates, drafted_tokens=drafted, committed_tokens=committed,
        drafted_tokens_per_second=drafted / draft_s if draft_s > 0 else 0.0,
        committed_tokens_per_second=committed / total_s if total_s > 0 else 0.0,
        target_only_tokens_per_second=(committed / greedy_seconds
                                       if temperature == 0.0 and greedy_seconds > 0 else None),
        load_seconds=load_seconds,
        verify_seconds_per_cycle=(sum(c.verify_seconds for c in cycles) / len(cycles)
                                  if cycles else None),
        draft_seconds_per_cycle=(sum(c.draft_seconds for c in cycles) / len(cycles)
                                 if cycles else None),
        memory=memory, lossless=None if temperature > 0 else lossless_failure is None,
        reference=None if reference is None else str(reference), min_tau=min_tau,
        warnings=warnings, trace=None if trace is None else str(trace),
        plot=None if plot is None else str(plot), calibration=calibrated)
    if before_reports is not None:
        before_reports(result)   # smoke --compare's parent run: if it fails, no report is written
    if reports:
        _write_reports(reports)
    return result


def _check_own_loop(kind, artifact: Path, *, temperature: float, confidence_threshold: float,
                    reference, calibration) -> None:
    """What a DFlash2 or Gemma 4 assistant drafter cannot take in smoke, refused before any
    weight loads: a temperature its loop refuses (DFlash2 above 0: 151), a confidence
    threshold or a calibration (no confidence head), a DeepSpec --reference trace (its
    runs are DeepSpec's loop's; these kinds' references are speculators' and transformers'
    traces, reproduced by their tests)."""
    kind.check_temperature(temperature)
    for given, option in ((confidence_threshold, "--confidence-threshold"),
                          (calibration, "--calibration"), (reference, "--reference")):
        if given:
            why = ("compares runs of DeepSpec's loop" if option == "--reference"
                   else "needs a confidence head")
            raise SmokeInputError(
                f"{artifact}: {option} {why}, which the {kind.label} drafter has not: run it "
                f"without {option}", path=str(artifact),
                field=option.removeprefix("--").replace("-", "_"),
                expected=f"no {option} for a {kind.label} drafter", found=str(given))


def _as_run(generated, prompt, *, temperature: float, seed: int):
    """A kind's own loop's result (evaluate_kinds.Generated) as runtime/speculative.py's
    RunResult, which the rest of smoke (the trace, the summaries) reads."""
    from dspark_convert.runtime.speculative import Cycle, RunResult

    return RunResult(
        prompt=tuple(prompt), output_ids=tuple(generated.output_ids),
        acceptance_lengths=tuple(generated.acceptance_lengths),
        cycles=tuple(Cycle(proposed=s.proposed, accepted=s.accepted, next_token=s.next_token,
                           confidence_logits=None, draft_seconds=s.draft_seconds or 0.0,
                           verify_seconds=s.verify_seconds or 0.0) for s in generated.steps),
        temperature=temperature, confidence_threshold=0.0, seed=seed,
        draft_seconds=generated.draft_seconds, total_seconds=generated.total_seconds,
        prefill_seconds=generated.prefill_seconds)


def _verdict(lossless_failure, enforced, runs_json, reference, tau, min_tau, dtype) -> None:
    """Losslessness at temperature 0, the --reference comparison, the --min-tau floor."""
    from dspark_convert.runtime.trace import compare_run

    if lossless_failure is not None:
        i, got, want = lossless_failure
        pos = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        raise LosslessnessError(
            f"prompt {i}: temperature 0 output differs from the target's greedy output ({dtype}) "
            f"at position {pos}: expected {want[pos] if pos < len(want) else 'end'}, found "
            f"{got[pos] if pos < len(got) else 'end'}", field=f"runs[{i}].output_ids",
            expected=str(list(want)), found=str(list(got)))
    for i, ref in enforced:
        compare_run(runs_json[i], ref, label=f"prompt {i}", path=str(reference))
    if min_tau is not None and tau is None:
        raise AcceptanceFloorError(f"tau is undefined: no verify step ran (every prompt ended at "
                                   f"its first token); --min-tau {min_tau:g} cannot be met",
                                   field="tau", expected=f">= {min_tau}", found="undefined")
    if min_tau is not None and tau < min_tau:
        raise AcceptanceFloorError(f"tau (mean accepted+1 per verify step) is {tau:.3f}; "
                                   f"--min-tau is {min_tau:g}", field="tau", expected=f">= {min_tau}",
                                   found=round(tau, 6))


def _calibration(cal_file, path, binding, progress) -> AppliedCalibration:
    """--calibration FILE (``cal_file``: read_calibration_file's (file, SHA-256), read before
    the pairing): made for this artifact (drafter.gguf SHA-256, block size) and this target
    (its identity: config, weights, tokenizer, embedding and head hashes), or refused (93);
    its temperatures then scale the confidence logits before the threshold."""
    from dspark_convert.evaluation.environment import target_identity

    cal, sha256 = cal_file
    check_calibration(cal, path, drafter_gguf_sha256=binding.report.gguf_sha256,
                      block_size=binding.drafter_plan.contract.block.block_size,
                      target=target_identity(binding.target, progress))
    return applied(cal, path, sha256)


# --- smoke --compare: the same run of a second artifact (a quantized one against its parent) ---

class SmokeComparison(BaseModel):
    """A second artifact run on the prompts and settings of a smoke result: at temperature
    0 both are lossless by construction, so the difference in tau is the price of what
    differs between them (a quantized artifact against its BF16 parent: the precision)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    parent: SmokeResult                          # the --compare artifact's own result
    tau_difference: float | None                 # the artifact's tau minus the parent's
                                                 # (None: either is undefined)
    acceptance_difference: list[float | None]    # by draft position, the same order
    same_outputs: bool                           # every run's output ids equal


def check_comparable(*, calibration: str | os.PathLike | None) -> None:
    """``--compare`` runs both artifacts with the same settings; a calibration file is made
    for one artifact (its drafter.gguf SHA-256), so the two cannot share one."""
    if calibration is not None:
        raise SmokeInputError("--compare: expected the same settings for both artifacts; "
                              "--calibration belongs to one artifact (found both options)",
                              field="compare", expected="no --calibration",
                              found=str(calibration))


def compare_smoke(result: SmokeResult, parent: str | os.PathLike, *,
                  progress: Progress | None = None,
                  on_estimate: Callable[[MemoryReport], None] | None = None) -> SmokeComparison:
    """Run ``parent`` exactly as ``result`` was run (its target, its prompts as token ids,
    max new tokens, temperature, threshold, seed, device, dtype, verify mode and memory
    budget), checked the same way (validate, losslessness at temperature 0), and compare.
    The report options of the first run (--trace, --plot, --reference, --min-tau) are its
    own: the parent is measured, not gated."""
    check_comparable(calibration=result.calibration.path if result.calibration else None)
    budget = result.memory.budget_bytes if result.memory.budget_source == "--max-memory" else None
    other = run_smoke(parent, target=result.target, prompts=[list(r.prompt) for r in result.runs],
                      max_new_tokens=result.max_new_tokens, temperature=result.temperature,
                      confidence_threshold=result.confidence_threshold, seed=result.seed,
                      device=result.device, dtype=result.dtype, verify=result.verify,
                      max_memory=budget, progress=progress, on_estimate=on_estimate)
    positions = max(len(result.acceptance_by_position), len(other.acceptance_by_position))

    def at(rates: list[float | None], k: int) -> float | None:
        return rates[k] if k < len(rates) else None

    difference = []
    for k in range(positions):
        a, b = at(result.acceptance_by_position, k), at(other.acceptance_by_position, k)
        difference.append(None if a is None or b is None else a - b)
    return SmokeComparison(
        parent=other, tau_difference=(None if result.tau is None or other.tau is None
                                      else result.tau - other.tau),
        acceptance_difference=difference,
        same_outputs=[r.output_ids for r in result.runs] == [r.output_ids for r in other.runs])
