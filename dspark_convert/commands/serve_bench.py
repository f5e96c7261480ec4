"""`dspark serve-bench`: verify-length policies swept under concurrent load in the reference
runtime (docs/SCHEDULING.md "Sweeping: dspark serve-bench").

``run_serve_bench`` checks every input before anything loads, in this order, each refusal
one line with its own code: the options eval shares (``check_options``: 91, a bad
``--device`` / ``--dtype`` among them), the concurrency list (148), each policy (140), the
cost table (141), the family of each artifact, the target and every artifact bound to it
(``bind``: validate with the target), the prompts (90), a concurrency beyond the prompts
given (148), a policy that reads confidences with an artifact that has no confidence head
(140, naming the artifact), a cost table whose largest entry is below max concurrency ×
(1 + block size) (142), a profile that does not fit the target's context (145). Then it
loads the target and every drafter once, profiles the target when a dspark policy needs a
cost table and none was given (scheduling/profile.py, up to that same size), warms the
models up (untimed), and runs the sweep (evaluation/serve_bench.py).

Each artifact is loaded and run by its kind's row (commands/evaluate_kinds.py KINDS): DSpark,
DFlash and DFlash2 drafters packed by runtime/serving.serve (DFlash2 greedy and under
``full`` only: no confidence head); the Gemma 4 assistant (no confidence head, no packed
pass) under ``full`` only, each request alone through its batch-1 loop
(``serve_one_by_one``), which the report states (``packed`` false).

Requests are the prompts, every one in every run; ``target-only`` always runs, once per
concurrency, as the baseline: at temperature 0 every other run's outputs must equal its
(``report_failure``: 74 in float32, where the batched verify is exact enough that a
difference is a bug).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from dspark_convert.errors import CostTableRangeError, LosslessnessError, SchedulingPolicyError
from dspark_convert.evaluation.serve_report import TARGET_ONLY, ServeBenchReport
from dspark_convert.scheduling.cost_table import CostTable
from dspark_convert.scheduling.decisions import DecisionLine
from dspark_convert.scheduling.policies import Policy, parse_policy
from dspark_convert.util.progress import NoProgress, Progress
from dspark_convert.util.text import shown

DEFAULT_POLICIES: tuple[str, ...] = ("full", "dspark")
DEFAULT_MAX_NEW_TOKENS = 64
# Policies whose choice needs the confidence head's output, and those that need the costs.
NEEDS_CONFIDENCE = frozenset({"threshold", "dspark", "dspark-async"})
NEEDS_COSTS = frozenset({"dspark", "dspark-async"})
WARMUP_TOKENS = 8


@dataclass(frozen=True)
class ServeBenchOutcome:
    """The report, each run's decisions by file name, and whether the cost table was
    measured by this run (then written as cost_table.json beside the report)."""

    report: ServeBenchReport
    decisions: dict[str, tuple[DecisionLine, ...]]
    profiled: bool


def parse_policies(specs: Sequence[str]) -> tuple[Policy, ...]:
    """Each ``--policy`` parsed (140 for a bad one), in order, each once; ``target-only``
    is the baseline every sweep runs anyway, so it is not repeated per artifact."""
    out: list[Policy] = []
    for spec in specs:
        policy = parse_policy(spec)
        if policy.name != TARGET_ONLY and policy not in out:
            out.append(policy)
    return tuple(out)


def check_serve_dir(out: str | os.PathLike, *, force: bool, artifacts: Sequence,
                    target: str | os.PathLike, prompts: str | os.PathLike | None,
                    cost_table: str | os.PathLike | None, calibrations: Sequence = ()) -> Path:
    """``-o DIR`` by eval's rule for its report directory (commands/evaluate.py
    ``check_report_dir``), and never the cost table read or anything around it."""
    from dspark_convert.commands.evaluate import check_report_dir
    from dspark_convert.util.atomic import refuse_overlap

    checked = check_report_dir(out, force=force, artifacts=artifacts, target=target,
                               prompts=prompts, calibrations=calibrations)
    refuse_overlap(out, [(cost_table, "the cost table")])
    return checked


def _check_confidence(policies: Sequence[Policy], arts) -> None:
    from dspark_convert.commands.evaluate_kinds import KINDS

    for art in arts:
        for policy in policies:
            if policy.name in NEEDS_CONFIDENCE and not art.has_confidence:
                raise SchedulingPolicyError(
                    f"{art.path}: policy {policy} reads the confidence head, and this artifact "
                    f"has none (a {KINDS[art.kind].label} drafter); expected full or an "
                    f"artifact with a confidence head", path=str(art.path), field="policy",
                    expected="full", found=str(policy))


def _check_temperatures(temperature: float, arts) -> None:
    """A kind whose loop refuses the temperature (DFlash2 above 0: DFlash2RunError, 151)
    is refused before anything loads."""
    from dspark_convert.commands.evaluate_kinds import KINDS

    for art in arts:
        KINDS[art.kind].check_temperature(temperature)


def _weights_file(art) -> str | None:
    """For a checkpoint run from its source directory, the file its SHA-256 is of."""
    if not art.source:
        return None
    return ", ".join(sorted({Path(t.file).name for t in art.plan.tensors.values()}))


def report_failure(report: ServeBenchReport, out: str | os.PathLike) -> LosslessnessError | None:
    """At temperature 0 in float32, a request whose output differs from the target alone
    at the same concurrency is a lossless bug: LosslessnessError (74) naming the first.
    In bfloat16 the packed verify rounds rows one ulp apart, which may flip a near tie:
    report.md still says so, loudly, but it is no failure."""
    bad = report.mismatches()
    if not bad or report.settings.temperature != 0.0 or report.settings.dtype != "float32":
        return None
    i, run, request = bad[0]
    return LosslessnessError(
        f"{run.artifact} {run.policy} at concurrency {run.concurrency}: at temperature 0 the "
        f"output of request {shown(request.id)} differs from the target alone's "
        f"({len(bad)} request output(s) in all); the report is in {out}", path=str(out),
        field=f"runs[{i}].requests", expected="equal", found="differs")


@dataclass(frozen=True)
class _Checked:
    """Every input of a sweep, checked, before anything loads."""

    concurrencies: tuple[int, ...]
    policies: tuple[Policy, ...]
    table: CostTable | None          # the one given
    prompt_set: object               # evaluation/prompts.PromptSet
    prompts: list                    # its Prompts, resolved on the target's vocabulary
    opened: object                   # the target (target/model.Target)
    identity: object                 # evaluation/environment.TargetIdentity
    arts: list                       # commands/evaluate._Artifact, calibration matched
    bindings: dict                   # name -> commands/binding.Binding
    largest: int                     # max concurrency x (1 + the largest block size)
    profile: bool                    # a dspark policy asked and no table given


def _check_inputs(artifacts, target, prompts, *, concurrencies, policies, cost_table,
                  max_new_tokens, temperature, seed, device, dtype, calibrations,
                  progress) -> _Checked:
    """The refusals of the module docstring, in its order; nothing is loaded."""
    from dspark_convert.commands.binding import open_run_target, refuse_family
    from dspark_convert.commands.evaluate import (
        DEFAULT_HELD_OUT,
        artifact_names,
        bind_artifacts,
        check_options,
        match_calibrations,
        prompts_for,
    )
    from dspark_convert.evaluation.calibration import read_calibration_file
    from dspark_convert.evaluation.environment import target_identity
    from dspark_convert.evaluation.prompts import load_prompt_set
    from dspark_convert.evaluation.serve_bench import check_concurrencies
    from dspark_convert.scheduling.cost_table import read_cost_table
    from dspark_convert.scheduling.profile import DEFAULT_CONTEXT, check_fits
    from dspark_convert.scheduling.simulate import parse_concurrency

    check_options(artifacts=artifacts, temperatures=[temperature], thresholds=(),
                  max_new_tokens=max_new_tokens, seed=seed, held_out=DEFAULT_HELD_OUT,
                  dtype=dtype, device=device)
    concurrencies = parse_concurrency(concurrencies if isinstance(concurrencies, str)
                                      else ",".join(str(c) for c in concurrencies))
    chosen = parse_policies(policies)
    table = read_cost_table(cost_table) if cost_table is not None else None
    # Each --calibration read (its schema checked) before the target is hashed; matched to
    # its artifact and the target's identity once both are known, as eval does.
    calibration_files = [(c, *read_calibration_file(c)) for c in calibrations]
    for artifact in artifacts:
        refuse_family(artifact, "eval")

    prompt_set = load_prompt_set(prompts)
    opened = open_run_target(target, progress)
    arts, bindings, target_plan = bind_artifacts(artifacts, artifact_names([Path(a) for a in artifacts]),
                                                 opened, progress)
    cfg = target_plan.config
    resolved = prompts_for(prompt_set, opened, target_plan, max_new_tokens)
    check_concurrencies(concurrencies, len(resolved), where=f"prompts {shown(prompt_set.path)}")
    identity = target_identity(opened, progress)
    match_calibrations(calibration_files, arts, identity)
    _check_confidence(chosen, arts)
    _check_temperatures(temperature, arts)
    block = max(a.block_size for a in arts)
    largest = concurrencies[-1] * (1 + block)
    if table is not None and table.tokens[-1] < largest:
        raise CostTableRangeError(
            f"cost table {cost_table}: its largest entry is {table.tokens[-1]} tokens; expected "
            f"at least {largest} (concurrency {concurrencies[-1]} x (1 + block size {block})), "
            f"the largest verify step the sweep may send", path=str(cost_table), field="tokens",
            expected=f">= {largest}", found=table.tokens[-1])
    profile = table is None and any(p.name in NEEDS_COSTS for p in chosen)
    if profile:
        check_fits((largest,), DEFAULT_CONTEXT, positions=cfg.max_position_embeddings,
                   where=f"target {shown(opened.directory / 'config.json')}", segment=1 + block)
    return _Checked(concurrencies=concurrencies, policies=chosen, table=table,
                    prompt_set=prompt_set, prompts=resolved, opened=opened, identity=identity,
                    arts=arts, bindings=bindings, largest=largest, profile=profile)


def run_serve_bench(artifacts: Sequence[str | os.PathLike], target: str | os.PathLike,
                    prompts: str | os.PathLike | None = None, *,
                    concurrencies: str | Sequence[int],
                    policies: Sequence[str] = DEFAULT_POLICIES,
                    cost_table: str | os.PathLike | None = None,
                    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, temperature: float = 0.0,
                    seed: int = 0, device: str = "auto", dtype: str = "float32",
                    calibrations: Sequence[str | os.PathLike] = (),
                    max_memory: int | None = None,
                    progress: Progress | None = None,
                    run_progress: Progress | None = None) -> ServeBenchOutcome:
    """Run the sweep and return its report (module docstring). ``concurrencies``: the
    ``--concurrency`` text (``1,4,16``) or the integers. ``calibrations``: calibration.json
    files, each applied to the artifact it was made for as eval applies it (its temperatures
    scale the confidence logits the policies see). ``progress``: the checks, loading and
    profiling; ``run_progress`` (default ``progress``): one bar per run, in tokens."""
    progress = progress or NoProgress()
    run_progress = run_progress or progress
    c = _check_inputs(artifacts, target, prompts, concurrencies=concurrencies,
                      policies=policies, cost_table=cost_table, max_new_tokens=max_new_tokens,
                      temperature=temperature, seed=seed, device=device, dtype=dtype,
                      calibrations=calibrations, progress=progress)

    from dspark_convert.commands.smoke import resolve_device
    from dspark_convert.evaluation.environment import describe_environment
    from dspark_convert.evaluation.serve_bench import Drafter, sweep
    from dspark_convert.evaluation.serve_report import ServeArtifact, ServeBenchSettings
    from dspark_convert.runtime.loading import compute_dtype
    from dspark_convert.runtime.memory import checked_estimate
    from dspark_convert.commands.evaluate_kinds import KINDS, alone_runner
    from dspark_convert.runtime.serving import Request
    from dspark_convert.scheduling.profile import default_tokens, profile_target

    dev = resolve_device(device)
    torch_dtype = compute_dtype(dtype)
    first = c.bindings[c.arts[0].name]
    runtime = first.runtime
    # Before any weight is loaded (78 when over): the target, every drafter, and at the
    # largest concurrency that many requests' caches and a packed step of their blocks
    # (every kind of drafter: runtime/memory.py drafter_shape).
    estimated = [c.bindings[a.name].drafter_plan for a in c.arts]
    if estimated:
        checked_estimate(first.target_plan, estimated, dtype=torch_dtype, device=dev,
                         longest_prompt=max(len(p.ids) for p in c.prompts),
                         max_new_tokens=max_new_tokens, max_memory=max_memory,
                         requests=c.concurrencies[-1],
                         smaller="a lower concurrency, fewer artifacts, shorter prompts or "
                                 "fewer new tokens")
    model = runtime.Target(c.opened.directory, device=dev, dtype=torch_dtype,
                           plan=first.target_plan, progress=progress)
    stops = tuple(model.config.stop_token_ids)
    drafters = []
    for a in c.arts:                   # each by its kind's loader (evaluate_kinds.KINDS)
        kind = KINDS[a.kind]
        drafter = kind.load(model, c.bindings[a.name].drafter_plan, path=a.path, device=dev,
                            dtype=torch_dtype, runtime=runtime,
                            confidence_temperatures=a.calibration.temperatures
                            if a.calibration is not None else None, progress=progress)
        drafters.append(Drafter(name=a.name, block_size=a.positions, drafter=drafter,
                                run_one=None if kind.packed else alone_runner(
                                    a.kind, model, drafter, temperature=temperature,
                                    stops=stops)))
    table = c.table
    if c.profile:
        block = max(a.block_size for a in c.arts)
        table = profile_target(model, tokens=default_tokens(c.largest), segment=1 + block,
                               progress=progress)
    requests = [Request(id=p.key, prompt=tuple(p.ids), max_new_tokens=max_new_tokens)
                for p in c.prompts]
    # Untimed warm-up (torch's first calls allocate and pick kernels): one short request
    # through the same loop, the target alone and each drafter under the first policy;
    # WARMUP_TOKENS where the context has room (check_context left room for at least
    # max_new_tokens), so that a verify step runs even when the sweep's requests make none.
    head = c.prompts[0]
    room = first.target_plan.config.max_position_embeddings - len(head.ids)
    sweep(model, drafters, [Request(id=head.key, prompt=tuple(head.ids),
                                    max_new_tokens=min(WARMUP_TOKENS, room))],
          policies=c.policies[:1], concurrencies=(1,), costs=table, temperature=temperature,
          seed=seed, stop_token_ids=stops)
    done = sweep(model, drafters, requests, policies=c.policies, concurrencies=c.concurrencies,
                 costs=table, temperature=temperature, seed=seed, stop_token_ids=stops,
                 progress=run_progress)

    settings = ServeBenchSettings(
        policies=[str(p) for p in c.policies], concurrencies=list(c.concurrencies),
        max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, device=device,
        dtype=dtype, cost_table_source="profiled" if c.profile else
        ("given" if cost_table is not None else "none"),
        cost_table_path=None if cost_table is None else shown(str(cost_table)))
    checks = [r.lossless for r in done.runs if r.lossless is not None]
    report = ServeBenchReport(
        settings=settings, environment=describe_environment(dev, device, dtype),
        target=c.identity, prompt_set=c.prompt_set.info(),
        artifacts=[ServeArtifact(name=a.name, path=shown(a.path), drafter_gguf_sha256=a.sha256,
                                 block_size=a.block_size, confidence_head=a.has_confidence,
                                 calibration=a.applied, method=a.kind,
                                 weights_file=_weights_file(a), packed=KINDS[a.kind].packed)
                   for a in c.arts],
        cost_table=table, runs=list(done.runs),
        lossless=(all(checks) if checks else None) if temperature == 0.0 else None)
    return ServeBenchOutcome(report=report, decisions=done.decisions, profiled=c.profile)
