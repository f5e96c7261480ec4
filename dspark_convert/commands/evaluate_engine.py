"""`dspark eval --engine llama.cpp=BIN_DIR --target-gguf TARGET.gguf`: llama.cpp's own runs
beside the reference runtime's (docs/ENGINES.md "llama.cpp's runs beside ours").

On the eval's prompts and settings, at temperature 0 with the confidence cut off:

1. the target alone (``llama-completion`` on TARGET.gguf), which also says how llama.cpp
   tokenizes each prompt: llama.cpp takes text only, so a prompt of ids is passed as the
   text its ids spell in the target GGUF's vocabulary, and a prompt whose llama.cpp
   tokens are not exactly its ids is not run by llama.cpp (``prompts_skipped``, with both
   lists): no re-tokenization drift is compared;
2. each artifact llama.cpp can run, exported for it on the fly (``dspark export``, the
   default layout) into a temporary directory, with the --spec-type llama.cpp itself picks
   for the file (draft-dspark with a Markov head, else draft-dflash:
   common_speculative_types_from_gguf), and a plain DFlash drafter also with draft-dspark
   (what ``dspark export`` advises: draft-dflash reads DeepSpec's block one row late):
   tau, acceptance by position, llama.cpp's decode speed, lossless (its text equal to
   llama.cpp's target alone) and the proposal check of every draft against the reference
   runtime's drafter, the one this eval loaded: the drafts read from llama.cpp's log are
   written as a `dspark conform` trace (``trace-llama.cpp-<artifact>-<spec type>.jsonl`` in
   the report directory, each line's id its prompt) and checked by conform's one check
   (evaluation/proposals.py ``check_lines``), prompt by prompt, the first difference naming
   its trace line and llama.cpp's draft call.

What llama.cpp cannot run is listed in ``not_run`` with ``engine: "llama.cpp"`` and the
reason: another temperature or a confidence threshold (the check is greedy, the cutoff
off), an artifact ``dspark export`` refuses for itself (its message), among them one of a
family its export does not take (Gemma4; the families' table, ``refuse_family``), listed
before anything runs: with none left, llama.cpp runs nothing, not even the target alone. A --target-gguf that
is not the artifacts' target is refused (104) before anything runs, by export's own check
(``check_target_gguf``): it is no artifact's fault, and llama.cpp's runs of another model
would be reported as the drafter's.

Each run is named in a refusal (the binary, the artifact and spec type, the prompt); each
records llama.cpp's own system_info line (backends, CPU features: which code path ran).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dspark_convert.errors import (
    EngineOptionError,
    EngineOutputError,
    ExportRefusal,
    FamilyExportError,
    TargetGGUFError,
    TargetGGUFMismatchError,
)
from dspark_convert.evaluation import engine_llama_cpp as L
from dspark_convert.evaluation.conform import trace_bytes
from dspark_convert.evaluation.proposals import (
    EngineDraft,
    FirstDifference,
    ProposalCheck,
    ReferenceProposer,
    check_proposals,
    engine_lines,
)
from dspark_convert.evaluation.report import (
    EngineInfo,
    EnginePromptRun,
    EngineRun,
    NotRun,
    SkippedPrompt,
)
from dspark_convert.util.hashing import sha256_file
from dspark_convert.util.paths import check_input_file
from dspark_convert.util.progress import NoProgress, Progress
from dspark_convert.util.text import shown

# The drafter kinds eval hands llama.cpp (commands/evaluate_kinds.KINDS): DSpark-family
# artifacts (exported by export_llama_cpp), and DFlash2 drafters and Gemma 4 assistants
# (exported from their plans: KIND_EXPORTS), each run with its own --spec-type.
DSPARK_KINDS = ("dspark", "dflash")
KIND_EXPORTS = {"dflash2": "export_dflash2_llama_cpp", "mtp": "export_assistant_llama_cpp"}
RUN_ENGINE_KINDS = frozenset((*DSPARK_KINDS, *KIND_EXPORTS))

# The engines --engine names: llama.cpp=BIN_DIR (here), dspark-mlx[=PYTHON]
# (commands/evaluate_dspark_mlx.py). The same name twice is refused.
ENGINES = (L.ENGINE, "dspark-mlx")
ENGINE_FORMS = {L.ENGINE: "llama.cpp=BIN_DIR", "dspark-mlx": "dspark-mlx[=PYTHON]"}


def _engine_hint(name: str, sep: str) -> str:
    """What a newcomer most likely meant: llama.cpp without its directory, or a known
    engine's name misspelt ("llamacpp", "mlx")."""
    if name == L.ENGINE and not sep:
        return (f"; {L.ENGINE} needs the directory of its binaries, --engine {L.ENGINE}=BIN_DIR "
                "(`python tools/llama_cpp.py path` prints the one `make llama-cpp` builds)")
    if name not in ENGINES:
        import difflib

        close = difflib.get_close_matches(name.lower(), ENGINES, n=1, cutoff=0.5)
        if close:
            return f"; did you mean {close[0]}?"
    return ""


def split_engines(specs: str | Sequence[str] | None,
                  target_gguf: str | os.PathLike | None) -> dict[str, str | None]:
    """Each ``--engine NAME[=VALUE]``, checked before anything runs (110): a known engine,
    each once, llama.cpp with its BIN_DIR, --target-gguf with llama.cpp and only then.
    Returns name -> value (None: dspark-mlx's default interpreter), in the order given."""
    specs = [specs] if isinstance(specs, str) else list(specs or ())
    out: dict[str, str | None] = {}
    for spec in specs:
        name, sep, value = spec.partition("=")
        if name not in ENGINES or (sep and not value) or (name == L.ENGINE and not sep):
            raise EngineOptionError(f"--engine {shown(spec)!r}: expected NAME=BIN_DIR with NAME "
                                    f"{L.ENGINE}, or dspark-mlx[=PYTHON]{_engine_hint(name, sep)}",
                                    field="engine",
                                    expected=" | ".join(ENGINE_FORMS.values()), found=shown(spec))
        if name in out:
            raise EngineOptionError(f"--engine {name}: given twice; expected each engine once",
                                    field="engine", expected="each engine once", found=name)
        out[name] = value if sep else None
    if target_gguf is not None and L.ENGINE not in out:
        raise EngineOptionError("--target-gguf: given without --engine llama.cpp=BIN_DIR; "
                                "expected both or neither", field="target_gguf",
                                expected="--engine llama.cpp=DIR", found=str(target_gguf))
    return out


@dataclass(frozen=True)
class EngineSpec:
    name: str
    binaries: L.Binaries
    target_gguf: Path
    vocabulary: L.Vocabulary
    target_sha256: str


def parse_engine(spec: str | None, target_gguf: str | os.PathLike | None) -> EngineSpec | None:
    """``--engine llama.cpp=BIN_DIR`` with ``--target-gguf``: checked before anything runs
    (run_eval splits the --engine options first: ``split_engines``)."""
    if spec is None:
        if target_gguf is not None:
            raise EngineOptionError("--target-gguf: given without --engine; expected both or "
                                    "neither", field="target_gguf", expected="--engine llama.cpp=DIR",
                                    found=str(target_gguf))
        return None
    name, sep, directory = spec.partition("=")
    if not sep or name != L.ENGINE or not directory:
        raise EngineOptionError(f"--engine {shown(spec)!r}: expected llama.cpp=BIN_DIR",
                                field="engine", expected="llama.cpp=BIN_DIR", found=shown(spec))
    if target_gguf is None:
        raise EngineOptionError(f"--engine {name}: needs --target-gguf TARGET.gguf, the target as "
                                "llama.cpp runs it (its converter's file)", field="target_gguf",
                                expected="a GGUF file", found=None)
    bins = L.find_binaries(directory)
    # The one input-file rule, as export's --target-gguf: not found, a directory or a FIFO
    # is one line (a FIFO is never waited on).
    path = check_input_file(target_gguf, label=f"--target-gguf {shown(str(target_gguf))}",
                            error=TargetGGUFError,
                            expected="the target model's GGUF file (the -m of llama.cpp)")
    vocab = L.read_vocabulary(path)
    try:
        sha = sha256_file(path)           # in blocks: a target GGUF is gigabytes
    except OSError as exc:
        raise TargetGGUFError(f"{shown(path)}: cannot read: {os.strerror(exc.errno or 0)}",
                              path=str(path)) from None
    return EngineSpec(name=name, binaries=bins, target_gguf=path.absolute(), vocabulary=vocab,
                      target_sha256=sha)


def family_refusals(arts) -> dict[str, str]:
    """artifact name -> why `dspark export --engine llama.cpp` refuses its family (the
    families' own table: commands/binding.refuse_family), for the artifacts it refuses."""
    from dspark_convert.commands.binding import refuse_family

    refused = {}
    for art in arts:
        if getattr(art, "kind", "dspark") not in DSPARK_KINDS:
            continue                    # exported from its plan (KIND_EXPORTS)
        try:
            refuse_family(art.path, "export")
        except FamilyExportError as exc:
            refused[art.name] = exc.message
    return refused


def check_target_gguf(spec: EngineSpec, arts) -> None:
    """``spec.target_gguf`` against each artifact as `dspark export` checks it, with export's
    own functions (commands/export.py: the architecture, hidden size, layer count against
    the taps, vocabulary, and the embedding and head hashes recorded at convert): a GGUF of
    another target is refused (104) before anything runs, as export refuses it. An artifact
    of a family llama.cpp's export does not take is not checked: llama.cpp runs nothing of
    it (``run_engine`` lists it as not run)."""
    from dspark_convert.artifact.format import GGUF_FILE, read_metadata
    from dspark_convert.commands import export as X
    from dspark_convert.formats.gguf_reader import read_gguf

    label = str(spec.target_gguf)
    gguf = X.read_target_gguf(spec.target_gguf)
    refused = family_refusals(arts)
    for art in arts:
        if getattr(art, "kind", "dspark") in KIND_EXPORTS:
            # The export's own checks of the target GGUF (157, 158), nothing written.
            getattr(X, KIND_EXPORTS[art.kind])(art.plan, spec.target_gguf, None, check_only=True)
    for art in (a for a in arts if a.name not in refused
                and getattr(a, "kind", "dspark") in DSPARK_KINDS):
        kv = read_metadata(read_gguf(art.path / GGUF_FILE), path=str(art.path / GGUF_FILE))
        X.check_target_gguf(gguf, art.contract, kv, label, [])


def _system_info(lines: list[str], binary: str) -> str | None:
    """The one system_info line of a binary's runs; runs that print different ones (the
    same build on one machine cannot) are refused."""
    distinct = sorted(set(lines))
    if len(distinct) > 1:
        raise EngineOutputError(f"{binary}: its runs print {len(distinct)} different system_info "
                                f"lines ({' / '.join(shown(x)[:200] for x in distinct[:2])}); "
                                "expected one build on one machine to print one",
                                path=binary, field="system_info", expected="one line",
                                found=len(distinct))
    return distinct[0] if distinct else None


def _kinds(art) -> list[str]:
    """The --spec-type(s) an artifact is run with: llama.cpp's own pick for the file, and for
    a plain DFlash drafter also draft-dspark, the one that reads DeepSpec's block as meant
    (``dspark export`` says to run it so: docs/ENGINES.md, the cause of the gap)."""
    return ["dflash", "dspark"] if art.markov == "none" else ["dspark"]


def mean_acceptance(lengths: list[int]) -> float | None:
    """tau: the mean of accepted+1 over an engine's drafts (None: it drafted nothing)."""
    return sum(lengths) / len(lengths) if lengths else None


def rates_by_position(drafts) -> list[float] | None:
    """P(accepted > k | proposed > k) over the drafts (DeepSpec's conditional rate)."""
    longest = max((len(d.tokens) for d in drafts), default=0)
    if not longest:
        return None
    out = []
    for k in range(longest):
        proposed = [d for d in drafts if len(d.tokens) > k]
        out.append(sum(d.accepted > k for d in proposed) / len(proposed))
    return out


def merge_checks(checks: list[tuple[str, ProposalCheck]]) -> ProposalCheck | None:
    """The per-prompt proposal checks of a run as one (the first difference of the first
    prompt that has one, naming it)."""
    if not checks:
        return None
    width = max(len(c.positions_compared) for _, c in checks)
    pc, pe = [0] * width, [0] * width
    first: FirstDifference | None = None
    for key, c in checks:
        for k, (a, b) in enumerate(zip(c.positions_compared, c.positions_equal)):
            pc[k] += a
            pe[k] += b
        if first is None and c.first_difference is not None:
            first = c.first_difference.model_copy(update={"prompt": key})
    return ProposalCheck(compared=sum(c.compared for _, c in checks),
                         equal=sum(c.equal for _, c in checks), positions_compared=pc,
                         positions_equal=pe, first_difference=first)


def cut_at_stop(ids, n: int, stops) -> list[int]:
    """An engine's output as the eval compares it: its first ``n`` tokens, up to and with
    the first stop token."""
    out = list(ids)[:n]
    hit = next((i for i, t in enumerate(out) if t in stops), None)
    return out if hit is None else out[: hit + 1]


def run_engine(spec: EngineSpec, *, arts, prompts, texts: dict[str, str | None], model,
               max_new_tokens: int, temperatures, thresholds, stops: tuple[int, ...],
               progress: Progress | None = None) -> tuple[EngineInfo, list[EngineRun], list[NotRun]]:
    """llama.cpp's runs: the target alone, then each artifact; see the module docstring.
    ``texts``: each prompt's text (None for a prompt given as ids: spelled from the ids)."""
    from dspark_convert.commands.export import export_llama_cpp

    progress = progress or NoProgress()
    not_run: list[NotRun] = []
    # An artifact of a family llama.cpp's export does not take: not run, with export's own
    # reason; with none left, nothing runs (not even the target alone: the target GGUF is
    # no artifact's target llama.cpp could run).
    refused = family_refusals(arts)
    not_run += [NotRun(kind="drafter", artifact=name, temperature=0.0, confidence_threshold=0.0,
                       engine=spec.name, reason=f"dspark export refuses it: {why}")
                for name, why in refused.items()]
    arts = [a for a in arts if a.name not in refused]
    if not arts:
        not_run.append(NotRun(kind="target", artifact=None, temperature=0.0,
                              confidence_threshold=None, engine=spec.name,
                              reason="no artifact of a family llama.cpp's export takes: "
                                     "nothing to run beside the target alone"))
        return (EngineInfo(engine=spec.name, binaries=shown(spec.binaries.directory),
                           target_gguf=shown(spec.target_gguf),
                           target_gguf_sha256=spec.target_sha256, system_info=None),
                [], not_run)
    for t in temperatures:
        if t != 0.0:
            not_run.append(NotRun(kind="target", artifact=None, temperature=t,
                                  confidence_threshold=None, engine=spec.name,
                                  reason="llama.cpp is run at temperature 0 only: the proposal "
                                         "check and losslessness are greedy"))
    for art in arts:
        for c in thresholds:
            if c > 0.0 and art.has_confidence:
                not_run.append(NotRun(kind="drafter", artifact=art.name, temperature=0.0,
                                      confidence_threshold=c, engine=spec.name,
                                      reason="llama.cpp is run with the cutoff off (p-min 0): its "
                                             "--spec-draft-p-min cuts on sigmoid(cl_k), not "
                                             "DeepSpec's threshold rule, so the runs would not "
                                             "compare"))
    vocab = spec.vocabulary

    # 1. The target alone, which also tokenizes every prompt as llama.cpp does.
    kept, skipped, target_runs, target_out = [], [], [], {}
    progress.start("llama.cpp: target alone", len(prompts))
    try:
        for p in prompts:
            text = texts.get(p.key)
            if text is None:
                text = L.text_of_prompt_ids(vocab, p.ids)
            if text is None or not text:
                skipped.append(SkippedPrompt(id=p.key, reason="its token ids spell bytes that are "
                                             "not UTF-8 text, and llama.cpp takes a prompt as text"))
                progress.advance(1)
                continue
            run = L.run_target(spec.binaries, spec.target_gguf, text, vocab=vocab,
                               max_new_tokens=max_new_tokens,
                               what=f"the target alone, prompt {shown(p.key)}")
            if list(run.prompt_ids) != list(p.ids):
                skipped.append(SkippedPrompt(id=p.key, reason=f"llama.cpp tokenizes its text to "
                                             f"{list(run.prompt_ids)[:24]}, not its ids "
                                             f"{list(p.ids)[:24]}"))
            elif len(p.ids) < 2:
                skipped.append(SkippedPrompt(id=p.key, reason="one token: llama.cpp's speculative "
                                             "loop drafts from the prompt's last token after the "
                                             "others"))
            else:
                kept.append((p, text))
                target_out[p.key] = run
                target_runs.append(EnginePromptRun(
                    # llama.cpp's eval runs after the prompt's own pass, which gives the first
                    id=p.key, prompt_tokens=len(p.ids), new_tokens=run.decode_tokens + 1,
                    completion_ids=None, text_sha256=hashlib.sha256(run.text).hexdigest(),
                    seconds=run.seconds, acceptance_lengths=None, lossless=None, proposals=None,
                    statistics=None))
            progress.advance(1)
    finally:
        progress.finish()
    dec_tokens = sum(target_out[k].decode_tokens for k in target_out)
    dec_seconds = sum(target_out[k].decode_seconds for k in target_out)
    # llama-speculative-simple prints no system_info line; it is the same build's library on
    # the same machine, so llama-completion's line stands for both (docs/ENGINES.md).
    system_info = _system_info([r.system_info for r in target_out.values()], L.COMPLETION)
    info = EngineInfo(engine=spec.name, binaries=shown(spec.binaries.directory),
                      target_gguf=shown(spec.target_gguf), target_gguf_sha256=spec.target_sha256,
                      system_info=system_info)
    runs = [EngineRun(engine=spec.name, kind="target", artifact=None, spec_type=None,
                      drafter_file_sha256=None, temperature=0.0, prompts=target_runs,
                      prompts_skipped=skipped, new_tokens=sum(r.new_tokens for r in target_runs),
                      seconds=sum(r.seconds for r in target_runs),
                      tokens_per_second=dec_tokens / dec_seconds if dec_seconds > 0 else None,
                      tau=None, acceptance_by_position=None, lossless=None, proposals=None,
                      system_info=system_info)]

    # 2. Each artifact, exported for llama.cpp.
    with tempfile.TemporaryDirectory(prefix="dspark-eval-engine-") as tmp:
        for art in (a for a in arts if getattr(a, "kind", "dspark") in KIND_EXPORTS):
            runs.append(_kind_run(spec, art, Path(tmp), kept, skipped, target_out, model,
                                  max_new_tokens=max_new_tokens, stops=stops,
                                  progress=progress, system_info=system_info))
        for art in (a for a in arts if getattr(a, "kind", "dspark") not in KIND_EXPORTS):
            out = Path(tmp) / f"{art.name}.gguf"
            try:
                exported = export_llama_cpp(art.path, spec.target_gguf, out)
            except (TargetGGUFError, TargetGGUFMismatchError):
                raise                   # not the artifact's fault (check_target_gguf's refusal)
            except ExportRefusal as exc:
                not_run.append(NotRun(kind="drafter", artifact=art.name, temperature=0.0,
                                      confidence_threshold=0.0, engine=spec.name,
                                      reason=f"dspark export refuses it: {exc.message}"))
                continue
            for kind in _kinds(art):
                runs.append(_drafter_run(spec, art, kind, exported, out, kept, skipped, target_out,
                                         model, max_new_tokens=max_new_tokens, stops=stops,
                                         progress=progress, system_info=system_info))
    return info, runs, not_run


def _drafter_run(spec: EngineSpec, art, kind: str, exported, draft: Path, kept, skipped,
                 target_out, model, *, max_new_tokens: int, stops, progress: Progress,
                 system_info: str | None) -> EngineRun:
    proposer = ReferenceProposer(model, art.drafter)
    vocab = spec.vocabulary
    prompt_runs, checks, all_drafts, lengths, trace = [], [], [], [], []
    dec_tokens = dec_seconds = 0.0
    progress.start(f"llama.cpp: {art.name} ({L.SPEC_TYPES[kind]})", len(kept))
    try:
        for p, text in kept:
            run = L.run_speculative(spec.binaries, spec.target_gguf, draft, kind=kind,
                                    prompt_text=text, prompt_ids=tuple(p.ids), vocab=vocab,
                                    max_new_tokens=max_new_tokens, n_max=art.block_size,
                                    what=f"{shown(art.name)} with {L.SPEC_TYPES[kind]}, prompt "
                                         f"{shown(p.key)}")
            drafted = [d for d in run.drafts if d.tokens]
            engine = [EngineDraft(d.call, d.context, d.anchor, d.tokens) for d in drafted]
            # The trace's lines of this prompt, and the check of exactly those lines.
            first_line = len(trace) + 1
            trace += engine_lines(engine, first_line=first_line, id=p.key)
            check = check_proposals(engine, proposer, first_line=first_line, id=p.key)
            checks.append((p.key, check))
            new = cut_at_stop(run.output_ids, max_new_tokens, stops)
            target = target_out[p.key]
            mine = vocab.text(new)
            lossless = mine.startswith(target.text) if target.ended else mine == target.text
            acc = [d.accepted + 1 for d in drafted]
            lengths += acc
            all_drafts += drafted
            dec_tokens += run.decode_tokens
            dec_seconds += run.decode_seconds
            prompt_runs.append(EnginePromptRun(
                id=p.key, prompt_tokens=len(p.ids), new_tokens=len(new), completion_ids=new,
                text_sha256=hashlib.sha256(mine).hexdigest(), seconds=run.seconds,
                acceptance_lengths=acc, lossless=lossless, proposals=check,
                statistics=run.stats.line))
            progress.advance(1)
    finally:
        progress.finish()
    losses = [r.lossless for r in prompt_runs if r.lossless is not None]
    result = EngineRun(engine=spec.name, kind="drafter", artifact=art.name,
                       spec_type=L.SPEC_TYPES[kind], drafter_file_sha256=exported.sha256,
                       temperature=0.0, prompts=prompt_runs, prompts_skipped=list(skipped),
                       new_tokens=sum(r.new_tokens for r in prompt_runs),
                       seconds=sum(r.seconds for r in prompt_runs),
                       tokens_per_second=dec_tokens / dec_seconds if dec_seconds > 0 else None,
                       tau=mean_acceptance(lengths), acceptance_by_position=rates_by_position(all_drafts),
                       lossless=all(losses) if losses else None, proposals=merge_checks(checks),
                       system_info=system_info,
                       trace=(f"trace-{spec.name}-{art.name}-{L.SPEC_TYPES[kind]}.jsonl"
                              if trace else None))     # no draft, no trace (nothing compared)
    result._trace = trace_bytes(trace)
    return result


# --- DFlash2 and the Gemma 4 assistant in llama.cpp ---------------------------------------------
# Drafters that are not artifacts of the DSpark family: exported from the runtime's plan
# (commands/export.py export_dflash2_llama_cpp / export_assistant_llama_cpp), run by
# llama-speculative-simple with the reference's block (DFlash2: --spec-draft-n-max B - 1;
# the assistant: num_assistant_tokens), and every draft checked against the reference
# runtime's drafts for the same committed context (runtime/llama_cpp_semantics.py).

@dataclass(frozen=True)
class KindPromptRun:
    id: str
    prompt_tokens: int
    cycles: int                        # draft calls llama.cpp made
    drafts_checked: int                # cycles whose draft was compared
    drafts_equal: int
    first_difference: int | None       # llama.cpp's draft call, None: every one equal
    acceptance_lengths: tuple[int, ...]
    lossless: bool                     # its text is llama.cpp's target alone's


@dataclass(frozen=True)
class KindRun:
    kind: str                          # "dflash2" | "gemma4-assistant"
    spec_type: str
    n_max: int
    window: str                        # the reference's sliding-window mode checked against
    drafter_file_sha256: str
    prompts: tuple[KindPromptRun, ...]

    @property
    def tau(self) -> float | None:
        lengths = [n for p in self.prompts for n in p.acceptance_lengths]
        return mean_acceptance(lengths)

    @property
    def every_draft_equal(self) -> bool:
        return all(p.first_difference is None and p.drafts_checked == p.cycles
                   for p in self.prompts)

    @property
    def lossless(self) -> bool:
        return all(p.lossless for p in self.prompts)


def run_kind_llama_cpp(bin_dir: str | os.PathLike, target_gguf: str | os.PathLike, *,
                       kind: str, drafter_dir, target, drafter, prompts: Sequence[str],
                       max_new_tokens: int, window: str = "llama.cpp",
                       progress: Progress | None = None) -> KindRun:
    """llama.cpp's runs of a DFlash2 drafter (``kind`` "dflash2") or a Gemma 4 assistant
    ("gemma4-assistant") beside the reference runtime: ``drafter_dir`` (a checkpoint
    directory or the runtime's plan) exported for llama.cpp into a temporary file,
    ``target`` / ``drafter`` the reference runtime's loaded models, ``prompts`` texts.
    Per prompt: llama.cpp's target alone (its tokenization, its text), the speculative run,
    each draft compared with the reference's for the same context under ``window``
    (runtime/llama_cpp_semantics.WINDOWS), lossless against the target alone."""
    from dspark_convert.commands.export import (export_assistant_llama_cpp,
                                                export_dflash2_llama_cpp)
    from dspark_convert.runtime import llama_cpp_semantics as S

    progress = progress or NoProgress()
    bins = L.find_binaries(bin_dir)
    target_path = check_input_file(target_gguf, label=f"--target-gguf {shown(str(target_gguf))}",
                                   error=TargetGGUFError,
                                   expected="the target model's GGUF file (the -m of llama.cpp)")
    vocab = L.read_vocabulary(target_path)
    export = {"dflash2": export_dflash2_llama_cpp,
              "gemma4-assistant": export_assistant_llama_cpp}.get(kind)
    if export is None:
        raise EngineOptionError(f"kind {shown(kind)!r}: expected dflash2 or gemma4-assistant",
                                field="kind", expected="dflash2 | gemma4-assistant",
                                found=shown(kind))
    engine_kind = "dflash2" if kind == "dflash2" else "mtp"
    runs = []
    with tempfile.TemporaryDirectory(prefix="dspark-eval-kind-") as tmp:
        exported = export(drafter_dir, target_path, Path(tmp) / f"{kind}.gguf")
        n_max = exported.n_max
        progress.start(f"llama.cpp: {kind} ({exported.spec_type})", len(prompts))
        try:
            for index, text in enumerate(prompts):
                key = str(index)
                alone = L.run_target(bins, target_path, text, vocab=vocab,
                                     max_new_tokens=max_new_tokens, special=True,
                                     what=f"the target alone, prompt {key}")
                ids = tuple(alone.prompt_ids)
                run = L.run_speculative(bins, target_path, exported.output, kind=engine_kind,
                                        prompt_text=text, prompt_ids=ids, vocab=vocab,
                                        max_new_tokens=max_new_tokens, n_max=n_max,
                                        what=f"{kind} with {exported.spec_type}, prompt {key}")
                cycles = len(run.drafts)
                acceptance = tuple(d.accepted + 1 for d in run.drafts if d.tokens)
                # A run that ended before -n ended at its last target token.
                stop = run.drafts[-1].next_token if alone.ended and run.drafts else None
                if kind == "dflash2":
                    run, where = L.resolve_unlogged(
                        run, ids, vocab,
                        lambda c, a: S.dflash2_drafts(target, drafter, c, a, window=window),
                        stop=stop)
                    first = where[0] if where is not None else None
                    checked = len(run.drafts) + (first is not None)
                    equal = len(run.drafts)
                else:
                    checked = equal = 0
                    first = None
                    for d in run.drafts:
                        if not d.tokens:
                            continue
                        mine = S.assistant_drafts(target, drafter, d.context, d.anchor,
                                                  len(d.tokens), window=window)
                        checked += 1
                        if mine == list(d.tokens):
                            equal += 1
                        elif first is None:
                            first = d.call
                # llama-speculative-simple prints the prompt and every token it made (control
                # tokens as their text, as the target alone is run: special), a few past -n
                # at most (its last verification accepts a whole draft): lossless when that
                # text continues the target alone's exactly.
                # A run that ended at an end-of-generation token: the target alone prints
                # it (special), the speculative run does not.
                printed = run.text.strip(b"\n")
                echoed = vocab.text(ids, special=True)
                want = alone.text
                if alone.ended and stop is not None and want.endswith(vocab.special[stop]):
                    want = want[:len(want) - len(vocab.special[stop])]
                rest = printed[len(echoed):]
                lossless = printed.startswith(echoed) and (rest == want if alone.ended
                                                           else rest.startswith(want))
                runs.append(KindPromptRun(
                    id=key, prompt_tokens=len(ids), cycles=cycles, drafts_checked=checked,
                    drafts_equal=equal, first_difference=first,
                    acceptance_lengths=acceptance,
                    lossless=lossless))
                progress.advance(1)
        finally:
            progress.finish()
    return KindRun(kind=kind, spec_type=exported.spec_type, n_max=n_max, window=window,
                   drafter_file_sha256=exported.sha256, prompts=tuple(runs))


def _kind_check(kind: str, run, propose, vocab, prompt_ids, *, stop: int | None, key: str,
                proposer=None, first_line: int = 1) -> tuple[object, ProposalCheck, list]:
    """One speculative run of a DFlash2 drafter or an assistant checked draft by draft:
    (the run, its ProposalCheck, the drafts checked). DFlash2's drafts are read through
    resolve_unlogged (positions 0 .. A of each: the accepted prefix and the first rejected
    slot; an engine token llama.cpp never shows is -1 in a FirstDifference); the
    assistant's are in its log, checked whole by conform's check with ``proposer``
    (runtime/llama_cpp_semantics.AssistantProposer), its lines numbered from
    ``first_line`` (the run's trace)."""
    pc: list[int] = []
    pe: list[int] = []

    def count(k: int, equal: bool) -> None:
        while len(pc) <= k:
            pc.append(0)
            pe.append(0)
        pc[k] += 1
        pe[k] += int(equal)

    first = None
    compared = equal = 0
    if kind == "dflash2":
        resolved, where = L.resolve_unlogged(run, prompt_ids, vocab, propose, stop=stop)
        for d in resolved.drafts:
            shown_to = min(d.accepted + 1, len(d.tokens))
            for k in range(shown_to):
                count(k, True)
        compared, equal = len(resolved.drafts), len(resolved.drafts)
        if where is not None:
            call, position = where
            d = run.drafts[call - 1]
            context = resolved.drafts[-1].committed if resolved.drafts else tuple(prompt_ids[:-1])
            mine = list(propose(tuple(context), d.anchor))
            compared += 1
            for k in range(position):
                count(k, True)
            count(position, False)
            first = FirstDifference(
                line=compared, id=key, draft_call=d.call, position=position, engine_token=-1,
                reference_token=mine[position] if position < len(mine) else -1,
                context_tokens=len(context), anchor=d.anchor,
                engine_draft=[-1] * len(d.tokens), reference_draft=mine, row_offset=None,
                reference_margin=None, near_tie=False)
        return resolved, ProposalCheck(compared=compared, equal=equal, positions_compared=pc,
                                       positions_equal=pe, first_difference=first), resolved.drafts
    # The assistant's drafts are in the log: conform's one check (proposals.check_lines),
    # with the reference's margin at a difference.
    engine = [EngineDraft(d.call, d.context, d.anchor, d.tokens) for d in run.drafts
              if d.tokens]
    return run, check_proposals(engine, proposer, first_line=first_line, id=key), engine


def _kind_run(spec: EngineSpec, art, tmp: Path, kept, skipped, target_out, model, *,
              max_new_tokens: int, stops, progress: Progress,
              system_info: str | None) -> EngineRun:
    """A DFlash2 drafter or a Gemma 4 assistant exported from its plan and run by
    llama.cpp on the prompts the target alone kept, every draft checked against the
    reference runtime's for the same context under llama.cpp's sliding window
    (runtime/llama_cpp_semantics.py; docs/ENGINES.md: the reference's own window is a
    stated departure of llama.cpp's)."""
    from dspark_convert.commands import export as X
    from dspark_convert.runtime import llama_cpp_semantics as S

    exported = getattr(X, KIND_EXPORTS[art.kind])(art.plan, spec.target_gguf,
                                                  tmp / f"{art.name}.gguf")
    if art.kind == "dflash2":
        def propose(context, anchor):
            return S.dflash2_drafts(model, art.drafter, context, anchor, window="llama.cpp")
    else:
        def propose(context, anchor):
            return S.assistant_drafts(model, art.drafter, context, anchor, exported.n_max,
                                      window="llama.cpp")
    proposer = (S.AssistantProposer(model, art.drafter, exported.n_max, window="llama.cpp")
                if art.kind == "mtp" else None)
    vocab = spec.vocabulary
    prompt_runs, checks, all_drafts, lengths, trace = [], [], [], [], []
    dec_tokens = dec_seconds = 0.0
    progress.start(f"llama.cpp: {art.name} ({exported.spec_type})", len(kept))
    try:
        for p, text in kept:
            run = L.run_speculative(spec.binaries, spec.target_gguf, exported.output,
                                    kind=art.kind, prompt_text=text, prompt_ids=tuple(p.ids),
                                    vocab=vocab, max_new_tokens=max_new_tokens,
                                    n_max=exported.n_max,
                                    what=f"{shown(art.name)} with {exported.spec_type}, prompt "
                                         f"{shown(p.key)}")
            target = target_out[p.key]
            stop = run.drafts[-1].next_token if target.ended and run.drafts else None
            acc = [d.accepted + 1 for d in run.drafts if d.tokens]
            all_drafts += [d for d in run.drafts if d.tokens]
            checked, check, engine = _kind_check(art.kind, run, propose, vocab, tuple(p.ids),
                                                 stop=stop, key=p.key, proposer=proposer,
                                                 first_line=len(trace) + 1)
            if art.kind == "mtp":
                trace += engine_lines(engine, first_line=len(trace) + 1, id=p.key)
            checks.append((p.key, check))
            # Lossless where every committed token is known (every draft resolved);
            # otherwise llama.cpp's output does not say (None).
            complete = len(checked.drafts) == len(run.drafts)
            new = cut_at_stop(checked.output_ids, max_new_tokens, stops)
            mine = vocab.text(new)
            lossless = ((mine.startswith(target.text) if target.ended else mine == target.text)
                        if complete else None)
            lengths += acc
            dec_tokens += run.decode_tokens
            dec_seconds += run.decode_seconds
            prompt_runs.append(EnginePromptRun(
                id=p.key, prompt_tokens=len(p.ids), new_tokens=len(new),
                completion_ids=new if complete else None,
                text_sha256=hashlib.sha256(mine).hexdigest() if complete else None,
                seconds=run.seconds, acceptance_lengths=acc, lossless=lossless,
                proposals=check, statistics=run.stats.line))
            progress.advance(1)
    finally:
        progress.finish()
    losses = [r.lossless for r in prompt_runs if r.lossless is not None]
    result = EngineRun(engine=spec.name, kind="drafter", artifact=art.name,
                       spec_type=exported.spec_type, drafter_file_sha256=exported.sha256,
                       temperature=0.0, prompts=prompt_runs, prompts_skipped=list(skipped),
                       new_tokens=sum(r.new_tokens for r in prompt_runs),
                       seconds=sum(r.seconds for r in prompt_runs),
                       tokens_per_second=dec_tokens / dec_seconds if dec_seconds > 0 else None,
                       tau=mean_acceptance(lengths),
                       acceptance_by_position=rates_by_position(all_drafts),
                       lossless=all(losses) if losses else None, proposals=merge_checks(checks),
                       system_info=system_info,
                       # The assistant's drafts as a `dspark conform` trace; DFlash2's are
                       # not logged whole, so it has none.
                       trace=(f"trace-{spec.name}-{art.name}-{exported.spec_type}.jsonl"
                              if trace else None))
    result._trace = trace_bytes(trace)
    return result
