"""The drafter kinds `dspark eval` and `dspark serve-bench` run, as a table.

Each kind is one row (``KINDS``): how its drafter is loaded beside the target, the batch-1
loop that generates with it, and why a combination of the plan can never run with it (a
temperature its loop refuses, a confidence threshold without a confidence head). eval and
serve-bench dispatch on the row, never on ``if`` chains:

- ``dspark`` and ``dflash``: a converted artifact (drafter.gguf), the family runtime's
  Drafter and ``runtime/speculative.speculative_generate`` (DFlash: no Markov and no
  confidence head);
- ``dflash2``: speculators' DFlash2 drafter (runtime/dflash2.py) and
  ``runtime/dflash2_loop.dflash2_generate``, greedy only: a temperature above 0 is never
  run, with the loop's own refusal (DFlash2RunError's message) as the reason;
- ``mtp``: the Gemma 4 assistant (runtime/gemma4_assistant.py) and ``assisted_generate``
  in its ``clean_kv`` mode (the target's KV of the committed tokens; the exact speculative
  sampler at temperature > 0).

A DFlash2 or assistant checkpoint is taken as it is (its source directory: config.json and
model.safetensors, no drafter.gguf) or, once converted, as the artifact ``bind`` plans
(commands/binding.py: a drafter plan of the kind's own type). ``kind_of_plan`` names the
kind from the plan's type, ``source_kind`` from a directory's config.json.

Every loop's result is brought to one shape (``Generated``: the output, accepted+1 per
cycle, per cycle the drafts, accepted, the target's token and the cycle's draft and verify
seconds), which is what the report's metrics are computed from.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dspark_convert.errors import AssistantTargetError, DFlash2TargetError, DSparkError

TARGET = "target"
DSPARK, DFLASH, DFLASH2, MTP = "dspark", "dflash", "dflash2", "mtp"
# Every ``method`` a run of the report may have, the target alone first.
METHODS: tuple[str, ...] = (TARGET, DSPARK, DFLASH, DFLASH2, MTP)
# The kinds that run from a checkpoint's own directory, by its config.json ``architectures``.
SOURCE_ARCHITECTURES = {"DFlash2DraftModel": DFLASH2,
                        "Gemma4UnifiedAssistantForCausalLM": MTP}
# The target family (contract/families.py's ``name``) each source kind drafts for, and the
# refusal of a target of another family.
SOURCE_TARGET_FAMILY = {DFLASH2: ("qwen3-dspark", DFlash2TargetError),
                        MTP: ("gemma4-dspark", AssistantTargetError)}
MTP_MODE = "clean_kv"
NO_HEAD = ("a {label} drafter has no confidence head: a threshold has nothing to cut on")


@dataclass(frozen=True)
class Step:
    """One verify cycle, whatever the kind."""

    proposed: tuple[int, ...]
    accepted: int
    next_token: int
    confidence_logits: tuple[float, ...] | None
    draft_seconds: float | None
    verify_seconds: float | None
    end_seconds: float | None = None   # the cycle's end from the run's start, where timed

    @property
    def committed(self) -> int:
        """Tokens this cycle committed: the accepted drafts and the target's token."""
        return self.accepted + 1


@dataclass(frozen=True)
class Generated:
    """One prompt generated with a drafter (``output_ids``: the prompt included)."""

    output_ids: tuple[int, ...]
    acceptance_lengths: tuple[int, ...]
    steps: tuple[Step, ...]
    total_seconds: float
    draft_seconds: float
    prefill_seconds: float = 0.0


@dataclass(frozen=True)
class DrafterKind:
    """One row of the table (module docstring)."""

    name: str                         # the report's ``method``
    label: str                        # how the report names it
    # (the loaded target, the kind's drafter plan, *, path, device, dtype, runtime,
    # confidence_temperatures, progress) -> the runtime drafter, bound to the target.
    load: Callable[..., object]
    # (target, drafter, prompt ids, *, max_new_tokens, temperature, threshold, stops, seed,
    # stepwise) -> Generated
    generate: Callable[..., Generated]
    # (temperature, threshold, has_confidence) -> why the combination never runs, or None.
    never: Callable[[float, float, bool], str | None]
    # (temperature) -> None, or the loop's own refusal of that temperature raised (serve-bench
    # refuses before anything loads what eval lists as not run).
    check_temperature: Callable[[float], None]
    # Whether `serve-bench` packs its requests (runtime/serving.serve: DSpark, DFlash,
    # DFlash2) or serves them one at a time with the batch-1 loop
    # (runtime/serving.serve_one_by_one: the Gemma 4 assistant).
    packed: bool
    # The most drafts one cycle proposes, from the plan (acceptance by position's width).
    positions: Callable[[object], int]


# --- dspark / dflash: converted artifacts, runtime/speculative.py ------------------------

def _load_dspark(model, plan, *, path, device, dtype, runtime, confidence_temperatures,
                 progress):
    from dspark_convert.runtime.weights import load_drafter_weights

    weights = load_drafter_weights(path, device=device, dtype=dtype, plan=plan,
                                   progress=progress)
    return runtime.Drafter(weights, embed=model.embed, lm_head=model.lm_head, device=device,
                           confidence_temperatures=confidence_temperatures)


def _generate_dspark(model, drafter, prompt, *, max_new_tokens, temperature, threshold, stops,
                     seed, stepwise) -> Generated:
    from dspark_convert.runtime.speculative import speculative_generate

    r = speculative_generate(model, drafter, list(prompt), max_new_tokens=max_new_tokens,
                             temperature=temperature, confidence_threshold=threshold,
                             stop_token_ids=stops, seed=seed, stepwise_verify=stepwise)
    return Generated(output_ids=tuple(r.output_ids), acceptance_lengths=tuple(r.acceptance_lengths),
                     steps=tuple(Step(proposed=tuple(c.proposed), accepted=c.accepted,
                                      next_token=c.next_token,
                                      confidence_logits=c.confidence_logits,
                                      draft_seconds=c.draft_seconds,
                                      verify_seconds=c.verify_seconds) for c in r.cycles),
                     total_seconds=r.total_seconds, draft_seconds=r.draft_seconds)


def _never_artifact(temperature: float, threshold: float, has_confidence: bool) -> str | None:
    """A DSpark-family artifact runs at any temperature; a threshold needs its head."""
    if threshold and not has_confidence:
        return "the artifact has no confidence head: a threshold has nothing to cut on"
    return None


def _dspark_positions(plan) -> int:
    return int(plan.contract.block.block_size)


# --- dflash2: runtime/dflash2.py, dflash2_loop.py -----------------------------------------

def _load_dflash2(model, plan, *, path, device, dtype, runtime, confidence_temperatures,
                  progress):
    from dspark_convert.runtime.dflash2 import DFlash2Drafter, check_target, load_weights

    check_target(plan.config, model.config, path=str(plan.directory / "config.json"))
    weights = load_weights(plan, device=device, dtype=dtype)
    return DFlash2Drafter(weights, embed=model.embed, lm_head=model.lm_head, device=device)


def _generate_dflash2(model, drafter, prompt, *, max_new_tokens, temperature, threshold, stops,
                      seed, stepwise) -> Generated:
    from dspark_convert.runtime.dflash2_loop import dflash2_generate

    r = dflash2_generate(model, drafter, list(prompt), max_new_tokens=max_new_tokens,
                         temperature=temperature, stop_token_ids=stops,
                         stepwise_verify=stepwise)
    return _from_timed(r)


def _never_dflash2(temperature: float, threshold: float, has_confidence: bool) -> str | None:
    from dspark_convert.errors import DFlash2RunError

    if threshold:
        return NO_HEAD.format(label="DFlash2")
    try:
        _greedy_only(temperature)
    except DFlash2RunError as exc:
        return exc.message
    return None


def _dflash2_positions(plan) -> int:
    return int(plan.config.block_size) - 1


# --- mtp: the Gemma 4 assistant -----------------------------------------------------------

def _load_mtp(model, plan, *, path, device, dtype, runtime, confidence_temperatures,
              progress):
    from dspark_convert.runtime.gemma4_assistant import Gemma4Assistant

    return Gemma4Assistant(plan.directory, model, plan=plan)


def _generate_mtp(model, drafter, prompt, *, max_new_tokens, temperature, threshold, stops,
                  seed, stepwise) -> Generated:
    from dspark_convert.runtime.gemma4_assistant import assisted_generate

    r = assisted_generate(model, drafter, list(prompt), max_new_tokens=max_new_tokens,
                          mode=MTP_MODE, temperature=temperature, seed=seed,
                          stop_token_ids=stops)
    return _from_timed(r)


def _never_mtp(temperature: float, threshold: float, has_confidence: bool) -> str | None:
    return NO_HEAD.format(label="Gemma 4 assistant (MTP)") if threshold else None


def _mtp_positions(plan) -> int:
    return int(plan.spec.num_assistant_tokens)


def _from_timed(r) -> Generated:
    """A DFlash2Run or AssistantRun (their cycles with ``timings`` beside them)."""
    timings = list(r.timings) if len(r.timings) == len(r.cycles) else [None] * len(r.cycles)
    return Generated(
        output_ids=tuple(r.output_ids), acceptance_lengths=tuple(r.acceptance_lengths),
        steps=tuple(Step(proposed=tuple(c.proposed), accepted=c.accepted,
                         next_token=c.next_token, confidence_logits=None,
                         draft_seconds=t.draft_seconds if t else None,
                         verify_seconds=t.verify_seconds if t else None,
                         end_seconds=t.end_seconds if t else None)
                    for c, t in zip(r.cycles, timings)),
        total_seconds=r.total_seconds, draft_seconds=r.draft_seconds,
        prefill_seconds=r.prefill_seconds)


def _any_temperature(temperature: float) -> None:
    return None


def _greedy_only(temperature: float) -> None:
    from dspark_convert.runtime.dflash2_loop import check_greedy

    check_greedy(temperature)


KINDS: dict[str, DrafterKind] = {k.name: k for k in (
    DrafterKind(name=DSPARK, label="DSpark", load=_load_dspark, generate=_generate_dspark,
                never=_never_artifact, check_temperature=_any_temperature, packed=True,
                positions=_dspark_positions),
    DrafterKind(name=DFLASH, label="DFlash", load=_load_dspark, generate=_generate_dspark,
                never=_never_artifact, check_temperature=_any_temperature, packed=True,
                positions=_dspark_positions),
    DrafterKind(name=DFLASH2, label="DFlash2", load=_load_dflash2, generate=_generate_dflash2,
                never=_never_dflash2, check_temperature=_greedy_only, packed=True,
                positions=_dflash2_positions),
    DrafterKind(name=MTP, label="MTP (Gemma 4 assistant)", load=_load_mtp,
                generate=_generate_mtp, never=_never_mtp, check_temperature=_any_temperature,
                packed=False, positions=_mtp_positions),
)}


def kind_of_plan(plan) -> str:
    """The kind of a bound drafter plan: by its type (DFlash2Plan, AssistantPlan), else a
    DSpark-family contract's heads (no Markov and no confidence head: plain DFlash)."""
    from dspark_convert.runtime.dflash2 import DFlash2Plan
    from dspark_convert.runtime.gemma4_assistant import AssistantPlan

    if isinstance(plan, DFlash2Plan):
        return DFLASH2
    if isinstance(plan, AssistantPlan):
        return MTP
    c = plan.contract
    if str(c.markov_head.type) == "none" and not c.confidence_head.enabled:
        return DFLASH
    return DSPARK


def source_kind(path: str | os.PathLike) -> str | None:
    """The kind of a checkpoint directory eval runs as it is (no drafter.gguf, a
    config.json whose ``architectures`` is one of SOURCE_ARCHITECTURES), or None."""
    from dspark_convert.artifact.format import GGUF_FILE

    directory = Path(path)
    if (directory / GGUF_FILE).exists() or not (directory / "config.json").is_file():
        return None
    try:
        raw = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    archs = raw.get("architectures") if isinstance(raw, dict) else None
    if isinstance(archs, list) and len(archs) == 1 and archs[0] in SOURCE_ARCHITECTURES:
        return SOURCE_ARCHITECTURES[archs[0]]
    return None


@dataclass(frozen=True)
class SourceBinding:
    """A checkpoint directory bound to the target for a run: what ``bind`` gives for an
    artifact, for a kind that runs from its source directory (no validate report: its
    plan checked config.json and every tensor header; the weights' SHA-256 names it)."""

    artifact: Path
    target: object
    target_plan: object
    drafter_plan: object
    sha256: str
    warnings: tuple[str, ...] = ()

    @property
    def runtime(self):
        from dspark_convert.commands.binding import runtime_of

        return runtime_of(self.target.family)


def bind_source(path: str | os.PathLike, kind: str, target, *, target_plan=None,
                progress=None) -> SourceBinding:
    """Plan a DFlash2 or assistant checkpoint directory against ``target``: a target of
    another family is refused (DFlash2TargetError 154, AssistantTargetError 153), then the
    kind's own refusals of the checkpoint (its config, its tensor headers, the target's
    taps, hidden size and vocabulary for DFlash2; the assistant's KV layers at load)."""
    from dspark_convert.commands.binding import runtime_of
    from dspark_convert.util.hashing import sha256_file

    directory = Path(path)
    want, error = SOURCE_TARGET_FAMILY[kind]
    if target.family.name != want:
        raise error(
            f"{directory}: a {KINDS[kind].label} checkpoint drafts for a {want} family's "
            f"target; expected one, found a {target.family.name} target ({target.directory})",
            path=str(directory), field="architectures", expected=want,
            found=target.family.name)
    target_plan = target_plan or runtime_of(target.family).plan_for(target)
    if kind == DFLASH2:
        from dspark_convert.runtime.dflash2 import check_target, plan_drafter

        plan = plan_drafter(directory)
        check_target(plan.config, target_plan.config, path=str(directory / "config.json"))
    else:
        from dspark_convert.runtime.gemma4_assistant import plan_assistant

        plan = plan_assistant(directory)
    weights = sorted({Path(t.file) for t in plan.tensors.values()})
    digest = sha256_file(weights[0]) if len(weights) == 1 else _digest_all(weights)
    return SourceBinding(artifact=directory, target=target, target_plan=target_plan,
                         drafter_plan=plan, sha256=digest)


def _digest_all(files) -> str:
    import hashlib

    from dspark_convert.util.hashing import sha256_file

    h = hashlib.sha256()
    for f in files:
        h.update(f"{Path(f).name}:{sha256_file(f)}\n".encode())
    return h.hexdigest()


def bind_any(path: str | os.PathLike, target, *, target_plan=None, progress=None):
    """``bind`` for an artifact, ``bind_source`` for a checkpoint directory of a kind that
    runs from its source: (binding, kind)."""
    from dspark_convert.commands.binding import bind

    kind = source_kind(path)
    if kind is not None:
        return bind_source(path, kind, target, target_plan=target_plan, progress=progress), kind
    binding = bind(path, target, progress=progress, target_plan=target_plan)
    return binding, kind_of_plan(binding.drafter_plan)


def never_runs(kind: str, temperature: float, threshold: float | None,
               has_confidence: bool) -> str | None:
    """Why ``kind`` at this temperature and threshold never runs (None: it can)."""
    try:
        return KINDS[kind].never(temperature, threshold or 0.0, has_confidence)
    except DSparkError as exc:            # a check that refuses instead of answering
        return exc.message


def alone_runner(kind: str, model, drafter, *, temperature: float, stops: tuple[int, ...]):
    """For `serve-bench`: a kind that is not packed (``packed`` false) serves each request
    with its batch-1 loop; this is that loop as runtime/serving.serve_one_by_one calls it,
    (request, its seed) -> serving.AloneRun."""
    from dspark_convert.runtime.serving import AloneRun, AloneStep

    generate = KINDS[kind].generate

    def run_one(request, seed):
        g = generate(model, drafter, list(request.prompt), max_new_tokens=request.max_new_tokens,
                     temperature=temperature, threshold=0.0, stops=stops, seed=seed,
                     stepwise=False)
        return AloneRun(output_ids=g.output_ids, prefill_seconds=g.prefill_seconds,
                        steps=tuple(AloneStep(length=len(s.proposed), accepted=s.accepted,
                                              committed=n, draft_seconds=s.draft_seconds or 0.0,
                                              verify_seconds=s.verify_seconds or 0.0,
                                              end_seconds=s.end_seconds or 0.0)
                                    for s, n in zip(g.steps, g.acceptance_lengths)))
    return run_one
