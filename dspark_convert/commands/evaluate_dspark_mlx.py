"""`dspark eval --engine dspark-mlx[=PYTHON]`: dspark-mlx's own runs beside the reference
runtime's (and llama.cpp's) on the eval's prompts (docs/ENGINES.md "dspark-mlx").

dspark-mlx reads DeepSpec's layout, so each artifact is handed to it as ``dspark export
--engine deepspec`` writes it (commands/export_deepspec.py: config.json + model.safetensors,
every tensor bit-exact, the embedding and head convert stripped taken from the target and
checked against the hashes the artifact recorded), into a temporary directory. What the
engine builds from it is checked too: dspark-mlx keeps a parameter no checkpoint key maps to
at its random initialisation without a word (it checks unexpected keys only), so every
parameter it built must be assigned from the export; one that is not is refused
(``MlxWeightsError``, 117), except the confidence head's, advisory and unused at threshold
0, which is reported (``random_parameters``).

On the eval's prompts (token ids: dspark-mlx takes ids, nothing is skipped), temperature 0,
the confidence cutoff off, max_new_tokens each, no stop token given to it (the outputs are
cut at the target's stop tokens afterwards, as the reference's are):

1. the target alone (dspark-mlx's host, greedy: evaluation/engine_dspark_mlx.py), its host
   picked by the first artifact's config (mlx-vlm for a Gemma4 drafter, mlx-lm otherwise);
2. each artifact, through dspark-mlx's ``generate_eager``: tau (mean accepted+1 per draft it
   made; its first draft is made from the prompt's last token, as llama.cpp's), acceptance by
   position, its speed (new tokens over its generation time), lossless (its output equal to
   its own target alone's) and the proposal check: its drafts, each with every committed
   token up to its anchor, written as a `dspark conform` trace
   (``trace-dspark-mlx-<artifact>-generate_eager.jsonl`` in the report directory, each line's
   id its prompt) and checked by conform's one check against the reference runtime's
   drafter, the one this eval loaded.

What dspark-mlx cannot run is listed in ``not_run`` with ``engine: "dspark-mlx"`` and the
reason: another temperature or a threshold; an artifact the DeepSpec export refuses (its
message); an artifact dspark-mlx's own loader refuses (its exception, where it was raised:
a plain DFlash drafter, whose Markov head of rank 0 its nn.Embedding cannot build; a gated
or rnn head, whose extra weights its strict update refuses; a model_type its registry does
not know); a target its host refuses.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from dspark_convert.commands.evaluate_engine import (
    cut_at_stop,
    mean_acceptance,
    merge_checks,
    rates_by_position,
)
from dspark_convert.errors import ExportRefusal, MlxWeightsError
from dspark_convert.evaluation import engine_dspark_mlx as M
from dspark_convert.evaluation.conform import trace_bytes
from dspark_convert.evaluation.proposals import (
    EngineDraft,
    ReferenceProposer,
    check_proposals,
    engine_lines,
)
from dspark_convert.evaluation.report import EngineInfo, EnginePromptRun, EngineRun, NotRun
from dspark_convert.util.progress import NoProgress, Progress
from dspark_convert.util.text import shown

ENGINE = M.ENGINE
LOOP = "generate_eager"                  # dspark-mlx's loop: the run's "spec type"
# The parameters dspark-mlx may keep at their random initialisation without changing a
# draft at threshold 0: its confidence head (advisory: generate_eager cuts on it only with a
# threshold above 0), built whether or not the drafter has one.
ADVISORY = ("confidence_head.",)


@dataclass(frozen=True)
class MlxSpec:
    name: str
    python: Path
    version: M.EngineVersion


def parse_python(value: str | None) -> MlxSpec:
    """``--engine dspark-mlx[=PYTHON]`` checked before anything runs: the interpreter exists
    and runs dspark-mlx 0.1.0 with mlx 0.32.4 (114 otherwise)."""
    python = M.find_python(value)
    return MlxSpec(name=ENGINE, python=python, version=M.probe(python))


def _not_run(kind: str, artifact: str | None, reason: str, *, threshold: float | None = 0.0,
             temperature: float | None = 0.0) -> NotRun:
    return NotRun(kind=kind, artifact=artifact, temperature=temperature,
                  confidence_threshold=threshold, engine=ENGINE, reason=reason)


def run_dspark_mlx(spec: MlxSpec, *, arts, prompts, target, model, max_new_tokens: int,
                   temperatures, thresholds, stops: tuple[int, ...], vocab_size: int,
                   progress: Progress | None = None
                   ) -> tuple[EngineInfo, list[EngineRun], list[NotRun]]:
    """dspark-mlx's runs: the target alone, then each artifact (see the module docstring).
    ``target``: the eval's opened target (its directory is what dspark-mlx's host loads,
    and what the export takes the embedding and head from); ``model``: the reference
    runtime's target, whose drafters (``art.drafter``) the proposal check runs."""
    from dspark_convert.commands.export_deepspec import WEIGHTS_FILE, export_deepspec

    progress = progress or NoProgress()
    not_run: list[NotRun] = []
    for t in temperatures:
        if t != 0.0:
            not_run.append(_not_run("target", None, "dspark-mlx is run at temperature 0 only: "
                                    "the proposal check and losslessness are greedy",
                                    threshold=None, temperature=t))
    for art in arts:
        for c in thresholds:
            if c > 0.0 and art.has_confidence:
                not_run.append(_not_run("drafter", art.name, "dspark-mlx is run with the cutoff "
                                        "off (threshold 0): the proposal check compares every "
                                        "draft whole", threshold=c))
    info = EngineInfo(engine=ENGINE, binaries=shown(spec.python), target_gguf=None,
                      target_gguf_sha256=None, system_info=spec.version.line)
    ids = [tuple(p.ids) for p in prompts]
    runs: list[EngineRun] = []
    with tempfile.TemporaryDirectory(prefix="dspark-eval-mlx-") as tmp:
        exported: list[tuple[object, Path, str]] = []
        for art in arts:
            out = Path(tmp) / art.name
            progress.start(f"dspark-mlx: export {art.name} --engine deepspec", 1)
            try:
                result = export_deepspec(art.path, target, out)
                progress.advance(1)
            except ExportRefusal as exc:
                not_run.append(_not_run("drafter", art.name,
                                        f"dspark export --engine deepspec refuses it: {exc.message}"))
                continue
            finally:
                progress.finish()
            sha = next(f.sha256 for f in result.files if f.path == WEIGHTS_FILE)
            exported.append((art, result.output, sha))
        if not exported:
            not_run.append(_not_run("target", None, "no artifact could be handed to dspark-mlx "
                                    "(its host is picked by the drafter's config)", threshold=None))
            return info, runs, not_run

        # 1. The target alone, through the host the first artifact's config picks.
        progress.start("dspark-mlx: target alone", len(ids))
        try:
            alone = M.run_target(spec.python, target.directory.absolute(),
                                 exported[0][1] / "config.json", ids, vocab_size=vocab_size,
                                 max_new_tokens=max_new_tokens)
            progress.advance(len(ids))
        finally:
            progress.finish()
        if isinstance(alone, M.Refused):
            not_run.append(_not_run("target", None, alone.reason, threshold=None))
            not_run += [_not_run("drafter", art.name, alone.reason) for art, _, _ in exported]
            return info, runs, not_run
        baseline = {p.key: cut_at_stop(o.tokens, max_new_tokens, stops)
                    for p, o in zip(prompts, alone.outputs)}
        target_runs = [EnginePromptRun(id=p.key, prompt_tokens=len(p.ids), new_tokens=len(out),
                                       completion_ids=out, text_sha256=None,
                                       seconds=o.seconds, acceptance_lengths=None,
                                       lossless=None, proposals=None, statistics=None)
                       for (p, o), out in zip(zip(prompts, alone.outputs), baseline.values())]
        made = sum(len(o.tokens) for o in alone.outputs)
        spent = sum(o.seconds for o in alone.outputs)
        runs.append(EngineRun(engine=ENGINE, kind="target", artifact=None, spec_type=None,
                              drafter_file_sha256=None, temperature=0.0, prompts=target_runs,
                              prompts_skipped=[], new_tokens=sum(r.new_tokens for r in target_runs),
                              seconds=alone.seconds, tokens_per_second=made / spent if spent > 0
                              else None, tau=None, acceptance_by_position=None, lossless=None,
                              proposals=None, system_info=spec.version.line))

        # 2. Each artifact, as DeepSpec's checkpoint.
        for art, checkpoint, sha in exported:
            progress.start(f"dspark-mlx: {art.name} ({LOOP})", 1)
            try:
                run = M.run_drafter(spec.python, checkpoint, target.directory.absolute(), ids,
                                    vocab_size=vocab_size, block_size=art.block_size,
                                    max_new_tokens=max_new_tokens,
                                    what=f"{shown(art.name)} with {LOOP}")
                progress.advance(1)
            finally:
                progress.finish()
            if isinstance(run, M.Refused):
                not_run.append(_not_run("drafter", art.name, run.reason))
                continue
            _check_weights(run.loaded, art.name)
            runs.append(_drafter_run(spec, art, run, sha, prompts, baseline, model,
                                     max_new_tokens=max_new_tokens, stops=stops,
                                     progress=progress))
    return info, runs, not_run


def _check_weights(loaded: M.Loaded, name: str) -> None:
    """Every parameter dspark-mlx built for the drafter assigned from the export, the
    advisory confidence head aside (117 otherwise)."""
    drafting = [p for p in loaded.random if not p.startswith(ADVISORY)]
    if drafting:
        raise MlxWeightsError(
            f"{shown(name)}: dspark-mlx would run {len(drafting)} of the {loaded.parameters} "
            f"parameters it built at their random initialisation ({', '.join(drafting[:6])}"
            f"{', ...' if len(drafting) > 6 else ''}): no key of the exported checkpoint maps "
            "to them, and dspark-mlx checks unexpected keys only; expected every one assigned",
            path=name, field="random_parameters", expected="none", found=drafting[:20])


def _drafter_run(spec: MlxSpec, art, run: M.DrafterRun, sha: str, prompts, baseline, model,
                 *, max_new_tokens: int, stops, progress: Progress) -> EngineRun:
    proposer = ReferenceProposer(model, art.drafter)
    prompt_runs, checks, lines, cycles, lengths = [], [], [], [], []
    progress.start(f"dspark-mlx: {art.name}: the proposal check", len(prompts))
    try:
        for p, pr in zip(prompts, run.prompts):
            # The trace's lines of this prompt, and conform's one check of exactly those.
            drafts = [EngineDraft(c.call, c.context, c.anchor, c.tokens) for c in pr.cycles]
            first = len(lines) + 1
            lines += engine_lines(drafts, first_line=first, id=p.key)
            check = check_proposals(drafts, proposer, first_line=first, id=p.key)
            checks.append((p.key, check))
            out = cut_at_stop(pr.output, max_new_tokens, stops)
            acc = [c.accepted + 1 for c in pr.cycles]
            lengths += acc
            cycles += pr.cycles
            prompt_runs.append(EnginePromptRun(
                id=p.key, prompt_tokens=len(p.ids), new_tokens=len(out), completion_ids=out,
                text_sha256=None, seconds=pr.seconds, acceptance_lengths=acc,
                lossless=out == baseline[p.key], proposals=check, statistics=None))
            progress.advance(1)
    finally:
        progress.finish()
    made = sum(len(pr.output) for pr in run.prompts)
    spent = sum(pr.seconds for pr in run.prompts)
    result = EngineRun(engine=ENGINE, kind="drafter", artifact=art.name, spec_type=LOOP,
                       drafter_file_sha256=sha, temperature=0.0, prompts=prompt_runs,
                       prompts_skipped=[], new_tokens=sum(r.new_tokens for r in prompt_runs),
                       seconds=run.seconds, tokens_per_second=made / spent if spent > 0 else None,
                       tau=mean_acceptance(lengths), acceptance_by_position=rates_by_position(cycles),
                       lossless=all(r.lossless for r in prompt_runs) if prompt_runs else None,
                       proposals=merge_checks(checks), system_info=spec.version.line,
                       random_parameters=list(run.loaded.random),
                       trace=f"trace-{ENGINE}-{art.name}-{LOOP}.jsonl" if lines else None)
    result._trace = trace_bytes(lines)
    return result
