"""`dspark conform ARTIFACT --target T --trace FILE`: another engine's drafts against the
reference runtime's, from a trace the engine recorded (docs/CONFORMANCE.md).

For each line of the trace (evaluation/conform.py: the committed tokens up to and including
the anchor, and the engine's draft) the reference runtime makes its greedy proposal from
the same context with the artifact's drafter, and compares token for token
(evaluation/proposals.py ``check_lines``: the one check, which `dspark eval --engine` runs
on the drafts it reads from llama.cpp's log too). The drafts conform when every one equals
the reference's over its length; else the first difference is named (``DraftMismatchError``,
97): the line, the position, both tokens, ``row_offset`` when the engine's draft is the
reference's read late, and the reference's logit margin there (below ``NEAR_TIE`` a near
tie, which another engine's arithmetic may break the other way). The agreement by position
is in the result and the report.

Order, as every command: the options (96), the trace read whole and checked (94) and the
report directory's path (the one output rule, 30-32) before the target is read; then the
one pairing (validate with the target: 40-67), each line against the vocabulary, the block
and the target's positions (95), the memory estimate (78), and only then the weights. A
failing check still writes its report (-o), so that it can be read.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from dspark_convert.commands.binding import bind, open_run_target, target_read
from dspark_convert.errors import (
    ConformInputError,
    DraftMismatchError,
    FamilyRuntimeError,
    InvalidArtifactError,
    MisreadingDiagnosedError,
    TraceFormatError,
)
from dspark_convert.evaluation.depth import DEPTH_BUCKETS, DepthRow
from dspark_convert.evaluation.misreadings import DiagnosisScope, Explanation
from dspark_convert.evaluation.proposals import NEAR_TIE, FirstDifference, ProposalCheck
from dspark_convert.runtime.budget import MemoryReport
from dspark_convert.util.atomic import Output, atomic_directory, check_outputs, write_error
from dspark_convert.util.json_out import dumps
from dspark_convert.util.paths import check_path
from dspark_convert.util.progress import NoProgress, Progress
from dspark_convert.util.text import shown

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("float32", "bfloat16")
REPORT_FILES = ("report.json", "report.md")


class ConformResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    artifact: str
    target: str
    trace: str
    trace_sha256: str
    family: str                        # the drafter family (Qwen3, Gemma4)
    markov_head: str                   # none, vanilla, gated, rnn
    block_size: int
    device: str
    dtype: str
    lines: int                         # drafts in the trace
    check: ProposalCheck               # compared, equal, by position, the first difference
    agreement_by_position: list[float | None]
    # By context depth (evaluation/depth.py: tokens before the anchor, in DEPTH_BUCKETS):
    # the agreement by position, and the engine's own acceptance by position as its trace
    # records it (a line's draft against what the contexts extending it committed).
    depth_buckets: list[int]
    agreement_by_depth: list[DepthRow]
    acceptance_by_depth: list[DepthRow]
    conforms: bool                     # every draft equals the reference's
    # --diagnose, when drafts differ: the misreadings (and pairs) that reproduce differing
    # drafts, best first (empty: none reproduces any), and what was diagnosed. None: not
    # asked, or every draft conforms.
    diagnosis: list[Explanation] | None = None
    diagnosis_scope: DiagnosisScope | None = None
    near_tie: float                    # the margin under which a difference is a near tie
    context_tokens: int                # tokens before the anchors, over every line: what a
                                       # prefill per line would run through the target
    target_tokens: int                 # what the target ran (shared prefixes once)
    load_seconds: float
    check_seconds: float               # the target's prefills and every proposal
    drafts_per_second: float
    memory: MemoryReport
    warnings: list[str]                # validate's
    report: str | None                 # -o: the report directory


def _check_options(device: str, dtype: str) -> None:
    for name, value, allowed in (("--device", device, DEVICES), ("--dtype", dtype, DTYPES)):
        if value not in allowed:
            raise ConformInputError(f"{name}: expected one of {', '.join(allowed)}, found "
                                    f"{shown(str(value))!r}", field=name.lstrip("-"),
                                    expected="|".join(allowed), found=shown(str(value)))


def run_conform(artifact: str | os.PathLike, *, target: str | os.PathLike,
                trace: str | os.PathLike, output: str | os.PathLike | None = None,
                force: bool = False, device: str = "auto", dtype: str = "float32",
                max_memory: int | None = None, progress: Progress | None = None,
                on_estimate: Callable[[MemoryReport], None] | None = None,
                diagnose: bool = False) -> ConformResult:
    """Check every draft of ``trace`` against the reference's proposal (module docstring).
    Returns the result whether the drafts conform or not (``conform_failure`` says);
    ``output``: the report directory (report.json, report.md), written atomically, also
    when they do not. ``diagnose``: when drafts differ, which known misreading reproduces
    them (evaluation/misreadings.py)."""
    from dspark_convert.evaluation.conform import check_fits, read_trace

    progress = progress or NoProgress()
    _check_options(device, dtype)
    check_path(artifact, what="the artifact", error=InvalidArtifactError)
    check_path(trace, what="--trace", error=TraceFormatError)
    from dspark_convert.commands.binding import refuse_family
    refuse_family(artifact, "conform")
    if output is not None:
        check_outputs([Output(output, "the report directory", directory=True)],
                      [(artifact, "the artifact"), target_read(target), (trace, "the trace")],
                      force=force)
    drafts = read_trace(trace)

    from dspark_convert.commands.smoke import resolve_device
    from dspark_convert.evaluation.proposals import ReferenceProposer, check_lines
    from dspark_convert.runtime.loading import compute_dtype, dtype_name
    from dspark_convert.runtime.memory import checked_estimate
    from dspark_convert.runtime.weights import load_drafter_weights

    torch_dtype = compute_dtype(dtype)
    dev = resolve_device(device)
    binding = bind(artifact, open_run_target(target, progress), progress=progress)
    family = binding.target.family
    if family.runtime is None:
        raise FamilyRuntimeError(f"{artifact}: a {family.name} artifact: the reference runtime "
                                 f"does not run the {family.name} family yet", path=str(artifact),
                                 field="dspark.family", found=family.name)
    target_plan, drafter_plan = binding.target_plan, binding.drafter_plan
    cfg, contract = target_plan.config, drafter_plan.contract
    block = contract.block.block_size
    check_fits(drafts, vocab_size=cfg.vocab_size, block_size=block,
               positions=cfg.max_position_embeddings,
               config=str(target_plan.directory / "config.json"))
    memory = checked_estimate(target_plan, drafter_plan, dtype=torch_dtype, device=dev,
                              longest_prompt=drafts.longest_context, max_new_tokens=block,
                              max_memory=max_memory, smaller="a trace of shorter contexts")
    if on_estimate is not None:
        on_estimate(memory)

    t0 = time.perf_counter()
    runtime = binding.runtime
    model = runtime.Target(target_plan.directory, device=dev, dtype=torch_dtype,
                           plan=target_plan, progress=progress)
    weights = load_drafter_weights(artifact, device=dev, dtype=torch_dtype, plan=drafter_plan,
                                   progress=progress)
    drafter = runtime.Drafter(weights, embed=model.embed, lm_head=model.lm_head, device=dev)
    load_seconds = time.perf_counter() - t0

    proposer = ReferenceProposer(model, drafter)
    t0 = time.perf_counter()
    proposals: dict[int, tuple[int, ...]] = {}
    check = check_lines(drafts.lines, proposer, progress=progress, proposals=proposals)
    seconds = time.perf_counter() - t0
    from dspark_convert.evaluation.depth import agreement_by_depth, trace_acceptance

    lines = drafts.lines
    width = len(check.positions_compared)
    agreement = agreement_by_depth(((lines[i].context_length - 1, lines[i].draft, ref)
                                    for i, ref in sorted(proposals.items())), width)
    accepted = trace_acceptance(lines, block)
    explanations = scope = None
    if diagnose and check.first_difference is not None:
        from dspark_convert.evaluation.misreadings import diagnose as run_diagnosis
        from dspark_convert.evaluation.proposals import differs

        differing = [lines[i] for i, ref in proposals.items() if differs(lines[i].draft, ref)]
        found = run_diagnosis(differing, model, drafter, progress=progress)
        explanations, scope = found.explanations, found.scope
    result = ConformResult(
        artifact=str(artifact), target=str(target_plan.directory), trace=str(drafts.path),
        trace_sha256=drafts.sha256, family=family.name, markov_head=contract.markov_head.type,
        block_size=block, device=str(dev), dtype=dtype_name(torch_dtype),
        lines=len(drafts.lines), check=check, agreement_by_position=check.agreement_by_position(),
        depth_buckets=list(DEPTH_BUCKETS), agreement_by_depth=agreement,
        acceptance_by_depth=accepted, diagnosis=explanations, diagnosis_scope=scope,
        conforms=check.first_difference is None, near_tie=NEAR_TIE,
        context_tokens=drafts.context_tokens, target_tokens=proposer.target_tokens,
        load_seconds=load_seconds, check_seconds=seconds,
        drafts_per_second=len(drafts.lines) / seconds if seconds > 0 else 0.0,
        memory=memory, warnings=binding.warnings,
        report=None if output is None else str(output))
    if output is not None:
        write_conform_report(result, output, force=force)
    return result


def difference_text(d: FirstDifference) -> str:
    """The first difference in words: where, both tokens, a block read late, the margin."""
    label = f" (id {shown(str(d.id))})" if d.id is not None else ""
    ours = "past the reference's block" if d.reference_token < 0 else f"{d.reference_token}"
    text = (f"line {d.line}{label}, position {d.position}: the engine drafted {d.engine_token}, "
            f"the reference {ours} (context {d.context_tokens} tokens, anchor {d.anchor})")
    if d.row_offset:
        text += (f"; the engine's draft is the reference's read {d.row_offset} row(s) late "
                 f"(row_offset {d.row_offset})")
    if d.reference_margin is not None:
        text += f"; the reference's logit margin {d.reference_margin:.4g}"
        if d.near_tie:
            text += (f": a near tie (under {NEAR_TIE:g}), which another engine's arithmetic "
                     "may break the other way")
    return text


def diagnosis_line(result: ConformResult) -> str | None:
    """The diagnosis in one sentence (None: not diagnosed)."""
    if result.diagnosis is None or result.diagnosis_scope is None:
        return None
    s = result.diagnosis_scope
    if not result.diagnosis:
        return (f"none of the known misreadings reproduces any of the {s.diagnosed} differing "
                f"drafts diagnosed ({s.candidates} misreadings and pairs tried)")
    best = result.diagnosis[0]
    share = "all" if best.explains == best.of else f"{best.explains}"
    text = (f"{best.misreading} reproduces {share} of the {best.of} differing drafts diagnosed"
            f"{'' if s.diagnosed == s.differing else f' (of {s.differing})'}; "
            f"fix: {'; and '.join(best.fix)}")
    tied = [e.misreading for e in result.diagnosis[1:] if e.explains == best.explains]
    if tied:
        text += "; reproducing as many, so not told apart on these drafts: " + ", ".join(tied)
    rest = [f"{e.misreading} ({e.explains})" for e in result.diagnosis[1 + len(tied):4 + len(tied)]]
    if rest:
        text += "; also reproducing some: " + ", ".join(rest)
    return text


def _fully_diagnosed(result: ConformResult) -> bool:
    return bool(result.diagnosis) and result.diagnosis[0].explains == result.diagnosis[0].of > 0


def conform_failure(result: ConformResult) -> DraftMismatchError | None:
    """``DraftMismatchError`` (97) naming the first difference when a draft differs;
    ``MisreadingDiagnosedError`` (162) when --diagnose found the misreading that reproduces
    every differing draft diagnosed."""
    c, d = result.check, result.check.first_difference
    if d is None:
        return None
    message = (f"trace {result.trace}: {c.compared - c.equal} of {c.compared} drafts differ "
               f"from the reference runtime's; the first: {difference_text(d)}")
    diagnosis = diagnosis_line(result)
    cls = DraftMismatchError
    if diagnosis is not None:
        message += f"; diagnosis: {diagnosis}"
        if _fully_diagnosed(result):
            cls = MisreadingDiagnosedError
    return cls(message, path=result.trace, field=f"line {d.line}.draft[{d.position}]",
               expected=d.reference_token, found=d.engine_token)


def render_markdown(result: ConformResult) -> str:
    c = result.check
    verdict = ("every draft equals the reference runtime's" if result.conforms else
               f"**{c.compared - c.equal} of {c.compared} drafts differ**")
    out = ["# dspark conform", "",
           f"Artifact `{shown(result.artifact)}` ({result.family}, Markov head "
           f"{result.markov_head}, block {result.block_size}), target `{shown(result.target)}`, "
           f"{result.device}, {result.dtype}.", "",
           f"Trace `{shown(result.trace)}` (SHA-256 `{result.trace_sha256}`): {result.lines} "
           f"drafts; {c.equal} of {c.compared} equal the reference's proposal from the same "
           f"context: {verdict}.", ""]
    if c.first_difference is not None:
        out += [f"First difference: {difference_text(c.first_difference)}.", "",
                f"- engine: `{c.first_difference.engine_draft}`",
                f"- reference: `{c.first_difference.reference_draft}`", ""]
    if c.positions_compared:
        out.append("| draft position | " + " | ".join(str(k) for k in range(len(c.positions_compared)))
                   + " |")
        out.append("|---|" + "---:|" * len(c.positions_compared))
        out.append("| drafts reaching it | " + " | ".join(str(n) for n in c.positions_compared) + " |")
        out.append("| equal to the reference's | "
                   + " | ".join(str(n) for n in c.positions_equal) + " |")
        out.append("| agreement | " + " | ".join("-" if a is None else f"{a:.3f}"
                                                  for a in result.agreement_by_position) + " |")
        out.append("")
    if result.diagnosis is not None and result.diagnosis_scope is not None:
        s = result.diagnosis_scope
        out += ["## Diagnosis", "",
                f"{s.diagnosed} of the {s.differing} differing drafts re-proposed under "
                f"{s.candidates} misreadings and pairs of them (at most {s.max_lines} lines, "
                f"{s.max_combined} misreadings combined; {s.seconds:.2f} s).", ""]
        if not result.diagnosis:
            out += ["None of the known misreadings reproduces any of them.", ""]
        else:
            out += ["| misreading | reproduces | of | fix |", "|---|---:|---:|---|"]
            out += [f"| `{e.misreading}` | {e.explains} | {e.of} | {shown('; '.join(e.fix))} |"
                    for e in result.diagnosis]
            out.append("")
    for title, rows in (("Agreement with the reference", result.agreement_by_depth),
                        ("The engine's acceptance (from its trace)", result.acceptance_by_depth)):
        if rows:
            width = len(rows[0].reached)
            out += [f"{title} by context depth (tokens before the anchor) and draft position:",
                    "", "| depth | drafts | " + " | ".join(str(k) for k in range(width)) + " |",
                    "|---|---:|" + "---:|" * width]
            out += [f"| {r.depth} | {r.drafts} | " + " | ".join(
                "-" if a is None else f"{a:.3f}" for a in r.rates()) + " |" for r in rows]
            out.append("")
    out += [f"The target ran {result.target_tokens:,} tokens for {result.context_tokens:,} "
            f"tokens of context (contexts that share a prefix share its prefill); the check "
            f"took {result.check_seconds:.2f} s ({result.drafts_per_second:,.1f} drafts/s) "
            f"after {result.load_seconds:.2f} s of loading.", ""]
    if result.warnings:
        out += ["validate's warnings:", ""] + [f"- {shown(w)}" for w in result.warnings] + [""]
    return "\n".join(out)


def write_conform_report(result: ConformResult, output: str | os.PathLike, *,
                         force: bool) -> list[Path]:
    """report.json and report.md, in one directory published atomically."""
    files = {"report.json": (dumps(result, indent=1) + "\n").encode(),
             "report.md": render_markdown(result).encode()}
    with atomic_directory(output, force=force) as tmp:
        for name, data in files.items():
            try:
                (tmp / name).write_bytes(data)
            except OSError as exc:
                raise write_error(exc, tmp / name) from None
    return [Path(output) / name for name in files]
