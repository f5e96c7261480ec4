"""`dspark gate POLICY -o OUT_DIR`: the pre-release gate (docs/GATE.md).

For each drafter of the policy (commands/gate_policy.py), in order, these stages, each one
the library function its command runs (nothing re-implemented, nothing in a subprocess):

1. ``pin``: the source still at its pinned commit with the bytes the lock records
   (source/hub: the listing against the lock before any download, every small file
   hashed; the weights are hashed by convert's own pass, which the lock also binds), and
   the target opened (a Hub target fetched and verified at its commit);
2. ``convert`` with the target (the pairing recorded);
3. ``reproducibility``: drafter.gguf's SHA-256 against the policy's ``sha256`` (none yet:
   recorded; different with ``changed_because``: passed, saying why);
4. ``validate`` with the target and ``require`` (``strict``: warnings fail);
5. ``quantize.TYPE`` for each variant: quantize, then validate the variant as in 4;
6. ``smoke`` at temperature 0 on the prompts: lossless, else it fails;
7. ``eval`` on the prompts (the target alone, the artifact and each variant built): the
   acceptance measured, losslessness checked again;
8. ``llama.cpp``: llama.cpp's own run beside the reference runtime, for a drafter that
   requires llama.cpp when ``[defaults] llama_cpp`` names a build (each engine run recorded
   with the engine's system-info line; nothing compared is never a pass);
9. ``dspark-mlx``: dspark-mlx's own run of the BF16 artifact beside the reference runtime,
   for a drafter that requires dspark-mlx (``[defaults] dspark_mlx``, or the interpreter
   `make dspark-mlx` installs), judged as llama.cpp's;
10. ``regression``: ``min_tau``, and against ``--baseline`` (a previous gate's gate.json)
   ``max_tau_drop``, ``max_acceptance_drop`` at any draft position and
   ``max_depth_acceptance_drop`` at any draft position within any context depth
   (evaluation/depth.py buckets; the stage names the position and the depth).

A failed stage fails its drafter and skips the stages that need it; the other drafters go
on. Everything is written into OUT_DIR atomically (util/atomic.py): the artifacts, every
stage's report, gate.json, gate.md and junit.xml (commands/gate_report.py). Ctrl-C stops
the run, writes what finished with gate.json ``complete: false`` (the rest ``not_run``),
and raises ``GateInterrupted`` carrying the result.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from dspark_convert import CONVERTER_NAME, __version__
from dspark_convert.commands.gate_policy import (
    RUN_ENGINES,
    Entry,
    LoadedPolicy,
    check_updatable,
    load_policy,
    updated_path,
    with_hashes,
)
from dspark_convert.commands.gate_report import (
    STAGES,
    ArtifactSummary,
    EngineRunRecord,
    EntryReport,
    GateReport,
    Measured,
    Measurement,
    StageReport,
    read_gate_report,
    render_markdown,
    write_reports,
)
from dspark_convert.errors import (
    AcceptanceRegressionError,
    DSparkError,
    GateEngineError,
    GateSelectionError,
    OutputExistsError,
    OutputWriteError,
    ReproducibilityError,
    SourceNotFoundError,
    StrataRuleError,
)
from dspark_convert.evaluation.depth import acceptance_by_depth, run_steps
from dspark_convert.evaluation.proposals import NEAR_TIE
from dspark_convert.util.json_out import dumps
from dspark_convert.util.atomic import (
    PACKAGE_READ,
    Output,
    atomic_directory,
    atomic_file,
    check_outputs,
    overlap,     # the one overlap rule (links, hard links, bind mounts), for the summary
)
from dspark_convert.util.paths import check_path, file_kind
from dspark_convert.util.progress import NoProgress, Progress
from dspark_convert.util.text import shown

BF16 = "bf16"                           # the converted artifact's directory and eval name
# A stage and the stages it needs (each must have passed or recorded).
NEEDS: dict[str, tuple[str, ...]] = {
    "pin": (), "convert": ("pin",), "reproducibility": ("convert",), "validate": ("convert",),
    "quantize": ("validate",), "smoke": ("validate",), "eval": ("validate",),
    "llama.cpp": ("validate",), "dspark-mlx": ("validate",), "regression": ("eval",),
}
# Float comparisons of measured rates: a drop exactly at the limit passes.
_EPS = 1e-9

StageCallback = Callable[[Entry, StageReport], None]


class GateInterrupted(KeyboardInterrupt):
    """Ctrl-C during the gate; ``result`` holds what was written (gate.json incomplete)."""

    def __init__(self, result: "GateResult") -> None:
        super().__init__("interrupted")
        self.result = result


@dataclass(frozen=True)
class GateResult:
    report: GateReport
    output: Path
    files: tuple[str, ...]             # gate.json, gate.md, junit.xml
    updated_policy: Path | None        # --update's copy
    summary_warning: str | None = None  # why the step summary could not be appended


class _Stop(Exception):
    """A stage's own verdict other than passed: (status, detail)."""

    def __init__(self, status: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


def _relocated(text: str, tmp: Path, out: Path) -> str:
    """A report's text with the temporary output directory's path replaced by the final
    one (the run works in the hidden sibling util/atomic renames into place)."""
    for a, b in ((str(tmp), str(out)), (json.dumps(str(tmp))[1:-1], json.dumps(str(out))[1:-1])):
        text = text.replace(a, b)
    return text


class _EntryRun:
    """One drafter's stages, into ``tmp / name``."""

    def __init__(self, gate: "_Gate", entry: Entry) -> None:
        self.gate, self.entry = gate, entry
        self.dir = gate.tmp / entry.name
        self.stages: list[StageReport] = []
        self.artifacts: dict[str, ArtifactSummary] = {}
        self.measurement: Measurement | None = None
        self.target = None
        self.variants: list[str] = []          # variant names that validated
        self.prompt_set = None
        self.engine_runs: list[EngineRunRecord] = []   # the running stage's engine runs

    # -- the bookkeeping ------------------------------------------------------------------

    def _status(self, name: str) -> str | None:
        found = [s.status for s in self.stages if s.name == name or s.name.startswith(name + ".")]
        if not found:
            return None
        return "failed" if "failed" in found else found[0]

    def run(self, name: str, body: Callable[[], tuple[str, list[str]]], *, needs: str | None = None) -> None:
        """Run one stage: ``body`` returns (detail, files) for passed, raises _Stop for
        another verdict, or a DSparkError for a failure."""
        for need in NEEDS[needs or name]:
            status = self._status(need)
            if status not in ("passed", "recorded"):
                why = "did not run" if status in (None, "not_run") else status
                self._add(StageReport(name=name, status="skipped",
                                      detail=f"needs {need}, which {why}"))
                return
        start = time.perf_counter()
        self.engine_runs = []
        try:
            detail, files = body()
            report = StageReport(name=name, status="passed", detail=detail, files=files)
        except _Stop as stop:
            report = StageReport(name=name, status=stop.status, detail=stop.detail)
        except DSparkError as exc:
            report = StageReport(name=name, status="failed", detail=shown(exc.message),
                                 error=type(exc).__name__, exit_code=exc.exit_code)
        self._add(report.model_copy(update={"seconds": round(time.perf_counter() - start, 3),
                                            "engine_runs": list(self.engine_runs)}))

    def _add(self, report: StageReport) -> None:
        report = report.model_copy(update={"detail": _relocated(report.detail, self.gate.tmp,
                                                                self.gate.out)})
        self.stages.append(report)
        self.gate.on_stage(self.entry, report)

    def rel(self, path: Path) -> str:
        return path.relative_to(self.gate.tmp).as_posix()

    def write_json(self, name: str, doc: dict) -> str:
        path = self.dir / name
        text = _relocated(dumps(doc, indent=1), self.gate.tmp, self.gate.out) + "\n"
        _write(path, text.encode())
        return self.rel(path)

    # -- the stages ---------------------------------------------------------------------

    def stages_all(self) -> None:
        e = self.entry
        try:
            self.dir.mkdir()
        except OSError as exc:
            from dspark_convert.util.atomic import write_error

            raise write_error(exc, self.gate.out / e.name) from None
        self.run("pin", self.pin)
        self.run("convert", self.convert)
        self.run("reproducibility", self.reproducibility)
        self.run("validate", self.validate)
        if not e.quantize:
            self.run("quantize", self.nothing("no variants: the policy's quantize is empty"))
        for qtype in e.quantize:
            self.run(f"quantize.{qtype}", lambda q=qtype: self.quantize(q), needs="quantize")
        self.run("smoke", self.smoke)
        self.run("eval", self.evaluate)
        self.run("llama.cpp", self.llama_cpp)
        self.run("dspark-mlx", self.dspark_mlx)
        self.run("regression", self.regression)

    @staticmethod
    def nothing(why: str):
        def body():
            raise _Stop("not_run", why)
        return body

    def pin(self):
        from dspark_convert.source.hub.source import HubOptions, open_hub_source

        e, parts = self.entry, []
        if e.source.hub is not None:
            hub = open_hub_source(e.source.hub, HubOptions(lock=e.lock), self.gate.progress)
            snap = hub.snapshot
            where = "the local cache (offline)" if snap.offline else snap.endpoint
            parts.append(f"source {snap.repo}@{snap.commit} from {where}: {len(snap.files)} "
                         "file(s)" + (f", as the lock {e.lock.name} records" if e.lock else
                                      " (no lock)"))
        else:
            path = e.source.path
            if not path.is_dir():
                raise SourceNotFoundError(f"source {path}: no such directory; expected a "
                                          "checkpoint directory or org/name@<40-hex commit>",
                                          path=str(path), expected="a directory", found="nothing")
            parts.append(f"source {path}: a local directory (nothing to pin: convert records "
                         "each file's SHA-256)")
        self.target = self.gate.open_target(e.target.spec)
        t = self.target
        parts.append(f"target {t.repo}@{t.revision}" if t.repo else f"target {t.directory}")
        return "; ".join(parts), []

    def convert(self):
        from dspark_convert.commands.convert import convert
        from dspark_convert.source.hub.source import HubOptions

        e = self.entry
        hub = HubOptions(lock=e.lock) if e.source.hub is not None else None
        out = self.dir / BF16
        result = convert(e.source.spec, out, target=self.target, hub=hub,
                         sample_from_anchor=e.sample_from_anchor, progress=self.gate.progress)
        self.artifacts[BF16] = ArtifactSummary(path=self.rel(out), size=result.gguf_size,
                                               sha256=result.gguf_sha256)
        return (f"drafter.gguf {result.gguf_size:,} bytes, SHA-256 {result.gguf_sha256}; "
                f"{len(result.manifest.artifact.tensors)} tensors",
                [self.rel(out / "drafter.gguf"), self.rel(out / "manifest.json")])

    def reproducibility(self):
        e, got = self.entry, self.artifacts[BF16].sha256
        if e.sha256 is None:
            raise _Stop("recorded", f"drafter.gguf SHA-256 {got}; the policy names none yet "
                        "(--update writes it)")
        if got == e.sha256:
            if e.changed_because:
                return (f"drafter.gguf SHA-256 {got}, the policy's (changed_because is no "
                        "longer needed)", [])
            return f"drafter.gguf SHA-256 {got}, the one the policy records", []
        if e.changed_because:
            return (f"drafter.gguf SHA-256 {got}; the policy records {e.sha256}, changed "
                    f"because: {e.changed_because}", [])
        raise ReproducibilityError(
            f"drafter.gguf SHA-256 is {got}; the policy records {e.sha256} (the last "
            "release's); expected the same bytes, or changed_because saying why not",
            field="sha256", expected=e.sha256, found=got)

    def _validate(self, artifact: Path, report_name: str) -> tuple[str, str]:
        from dspark_convert.commands.validate import validate_artifact

        e = self.entry
        # An engine the gate runs reads what `dspark export` writes for it, not the artifact:
        # its requirement is its stage's (export, then its own run), not validate's
        require = [name for name in e.require if name not in RUN_ENGINES]
        report = validate_artifact(artifact, target=self.target, require=require,
                                   progress=self.gate.progress)
        code = report.exit_code(strict=e.strict)
        written = self.write_json(report_name, {**report.model_dump(), "strict": e.strict,
                                                "exit_code": code})
        report.raise_first_error()
        if code:
            first = next(c for c in report.checks if c.status == "warning")
            raise StrataRuleError(f"strict: a warning counts as a failure: {first.name}: "
                                  f"{first.detail}", field=first.name)
        engines = ", ".join(f"{name} {'yes' if r.accepts else 'no'}"
                            for name, r in (report.engines or {}).items())
        required = f"; required: {', '.join(require)}" if require else ""
        return (f"{len(report.checks)} checks, {report.warnings} warning(s); engines: "
                f"{engines}{required}", written)

    def validate(self):
        detail, written = self._validate(self.dir / BF16, "validate.json")
        return detail, [written]

    def quantize(self, qtype: str):
        from dspark_convert.commands.quantize import quantize_artifact

        out = self.dir / qtype
        result = quantize_artifact(self.dir / BF16, out, qtype, progress=self.gate.progress)
        self.artifacts[qtype] = ArtifactSummary(path=self.rel(out), size=result.gguf_size,
                                                sha256=result.gguf_sha256)
        detail, written = self._validate(out, f"validate-{qtype}.json")
        same = self._same_as_baseline(qtype, result.gguf_sha256)
        self.variants.append(qtype)
        return (f"drafter.gguf {result.gguf_size:,} bytes, SHA-256 {result.gguf_sha256}"
                f"{same}; validate: {detail}", [self.rel(out / "drafter.gguf"),
                                                self.rel(out / "manifest.json"), written])

    def _same_as_baseline(self, qtype: str, sha256: str) -> str:
        """A variant against the baseline's: quantized from the same BF16 bytes, it must be
        the same bytes (quantize is byte-reproducible: a difference is the quantizer's);
        from other BF16 bytes it follows its parent. Nothing to compare: ''."""
        before = self.gate.baseline.entry(self.entry.name) if self.gate.baseline else None
        old = before.artifacts.get(qtype) if before else None
        parent = before.artifacts.get(BF16) if before else None
        if old is None or parent is None:
            return ""
        if parent.sha256 != self.artifacts[BF16].sha256:
            return " (its BF16 parent differs from the baseline's, so does it)"
        if old.sha256 == sha256:
            return ", the baseline's"
        raise ReproducibilityError(
            f"{qtype}: drafter.gguf SHA-256 is {sha256}; the baseline's, quantized from the same "
            f"BF16 drafter.gguf, is {old.sha256}; expected the same bytes (the quantizer or "
            "its gguf-py changed?)", field=f"artifacts.{qtype}.sha256", expected=old.sha256,
            found=sha256)

    def _prompts(self):
        """The prompt set, loaded once per drafter (PromptSetError for a bad one)."""
        from dspark_convert.evaluation.prompts import load_prompt_set

        if self.prompt_set is None:
            self.prompt_set = load_prompt_set(self.entry.prompts)
        return self.prompt_set

    def smoke(self):
        from dspark_convert.commands.smoke import run_smoke, tau_text
        from dspark_convert.evaluation.prompts import resolve_prompts

        e, t = self.entry, self.target
        prompts = resolve_prompts(self._prompts(), tokenizer=t.tokenizer,
                                  vocab_size=t.config.vocab_size, context=t.read.context_length)
        trace = self.dir / "smoke-trace.json"
        result = run_smoke(self.dir / BF16, target=t.directory, prompts=[list(p.ids) for p in prompts],
                           max_new_tokens=e.max_new_tokens, temperature=0.0, device=e.device,
                           dtype=e.dtype, trace=trace, progress=self.gate.progress)
        written = self.write_json("smoke.json", result)
        return (f"{len(result.runs)} prompt(s) at temperature 0, every output the target's own "
                f"greedy output ({result.dtype}, {result.device}); {tau_text(result.tau)}",
                [written, self.rel(trace)])

    def _run_eval(self, names: list[str], **engine):
        """run_eval on the artifacts ``names`` at temperature 0, the cutoff off, on the
        drafter's prompts and settings (``engine``: llama.cpp's runs beside), its paths
        those of the final output."""
        from dspark_convert.commands.evaluate import run_eval
        from dspark_convert.evaluation.report import EvalReport

        e = self.entry
        report = run_eval([self.dir / n for n in names], self.target.directory, self._prompts(),
                          temperatures=(0.0,), thresholds=(), max_new_tokens=e.max_new_tokens,
                          device=e.device, dtype=e.dtype, progress=self.gate.progress, **engine)
        return EvalReport.model_validate_json(
            _relocated(dumps(report, compact=True), self.gate.tmp, self.gate.out))

    def evaluate(self):
        from dspark_convert.commands.evaluate import report_failure
        from dspark_convert.evaluation.report import write_report

        e = self.entry
        names = [BF16, *self.variants]
        report = self._run_eval(names)
        written = write_report(report, self.dir / "eval")
        failure = report_failure(report, self.gate.out / self.entry.name / "eval")
        measured = {}
        for name in names:
            run = next((r for r in report.runs if r.kind == "drafter" and r.artifact == name
                        and r.confidence_threshold == 0.0), None)
            if run is not None and run.acceptance is not None:
                block = len(run.acceptance.acceptance_by_position)
                measured[name] = Measured(tau=run.acceptance.tau,
                                          acceptance_by_position=run.acceptance.acceptance_by_position,
                                          lossless=run.lossless,
                                          acceptance_by_depth=acceptance_by_depth(
                                              run_steps(run), block))
        self.measurement = Measurement(
            prompt_set_sha256=report.prompt_set.sha256, prompts=report.prompt_set.count,
            max_new_tokens=e.max_new_tokens, dtype=report.settings.dtype,
            device=report.environment.device, artifacts=measured)
        if failure is not None:
            raise failure
        taus = ", ".join(f"{n} tau {m.tau:.3f}" for n, m in measured.items() if m.tau is not None)
        return (f"{report.prompt_set.count} prompt(s), {e.max_new_tokens} new tokens, "
                f"{report.settings.dtype} on {report.environment.device}: {taus}; lossless",
                [self.rel(p) for p in written])

    def llama_cpp(self):
        """llama.cpp's own run (`dspark eval --engine llama.cpp=BIN_DIR`): each artifact
        exported for it on the fly, run by its binaries on the prompts llama.cpp takes as
        their ids, lossless, and every draft equal to the reference runtime's."""
        e = self.entry
        if "llama.cpp" not in e.require:
            raise _Stop("not_run", "the drafter does not require llama.cpp")
        if e.llama_cpp is None:
            raise _Stop("not_run", "not run: no llama.cpp build given ([defaults] llama_cpp)")
        if e.target_gguf is None:
            raise _Stop("not_run", "not run: no target GGUF given (the drafter's target_gguf: "
                        "the target as llama.cpp runs it)")
        return self._engine_stage("llama.cpp", [BF16, *self.variants],
                                  engine=f"llama.cpp={e.llama_cpp}", target_gguf=e.target_gguf)

    def dspark_mlx(self):
        """dspark-mlx's own run (`dspark eval --engine dspark-mlx[=PYTHON]`): the BF16
        artifact handed to it as `dspark export --engine deepspec` writes it (DeepSpec's
        layout holds BF16 weights: a quantized variant has no such form), run by its
        generate_eager loop on the prompts' ids, lossless, and every draft the reference
        runtime's (near ties aside)."""
        e = self.entry
        if "dspark-mlx" not in e.require:
            raise _Stop("not_run", "the drafter does not require dspark-mlx")
        python = f"dspark-mlx={e.dspark_mlx}" if e.dspark_mlx is not None else "dspark-mlx"
        return self._engine_stage("dspark-mlx", [BF16], engine=python)

    def _engine_stage(self, stage: str, names: list[str], **options):
        """The engine stage ``stage``: the eval of ``names`` with the engine's runs beside
        (``options``: run_eval's engine and target_gguf), its report in the engine's
        directory, each engine run recorded, and the verdict (engine_verdict)."""
        from dspark_convert.evaluation.report import write_report

        report = self._run_eval(names, **options)
        directory = self.dir / ENGINE_STAGES[stage].report_dir
        written = [self.rel(p) for p in write_report(report, directory)]
        self.engine_runs = engine_records(report)
        return engine_verdict(report, names, stage), written

    def regression(self):
        return regression(self.entry, self.measurement, self.gate.baseline)


# The llama.cpp stage's tolerance. A draft of llama.cpp that differs from the reference
# runtime's where our logit margin between the two tokens is under NEAR_TIE is a near tie its
# bf16 arithmetic broke the other way (docs/ENGINES.md measures 0.003), not a misreading,
# which leaves a wide margin or reads the block rows late: the proposal check's own
# ``near_tie`` (evaluation/proposals.py, the check `dspark conform` runs); and at least
# MIN_AGREEMENT of the drafts must be equal (only the first difference of each prompt is
# located).
MIN_AGREEMENT = 0.9


@dataclass(frozen=True)
class RunEngine:
    """An engine the gate runs in a stage of its own (``require`` names it)."""
    name: str
    advised: str            # the run each artifact is judged by (its spec type / loop)
    near_tie: float         # our logit margin under which a different draft is a near tie
    report_dir: str         # the stage's eval report, in the drafter's directory


# The engine stages, one per engine a policy's ``require`` may name for a run of its own
# (gate_policy.RUN_ENGINES). llama.cpp: the --spec-type `dspark export` advises for every drafter;
# the proposal check's own near tie (NEAR_TIE). dspark-mlx: its generate_eager loop; its
# target and the head's input run in bfloat16, and every difference from the reference
# measured on the golden drafters is one token at a margin under 0.02 with no row offset,
# moving with the arithmetic (docs/ENGINES.md, "What dspark-mlx 0.1.0 departs from").
ENGINE_STAGES: dict[str, RunEngine] = {
    "llama.cpp": RunEngine("llama.cpp", "draft-dspark", NEAR_TIE, "eval-llama.cpp"),
    "dspark-mlx": RunEngine("dspark-mlx", "generate_eager", 0.02, "eval-dspark-mlx"),
}
ADVISED = ENGINE_STAGES["llama.cpp"].advised


def _difference(d, prompt: str, engine: str) -> str:
    late = f"; its draft is ours read {d.row_offset} row(s) late" if d.row_offset else ""
    margin = f" (our margin {d.reference_margin:.3g})" if d.reference_margin is not None else ""
    return (f"draft {d.draft_call} of prompt {prompt} differs from the reference runtime's at "
            f"position {d.position}: {engine} {d.engine_token}, ours {d.reference_token}"
            f"{margin}{late}")


def _misread(run, engine: RunEngine) -> str | None:
    """Why an engine's drafts are not the reference's, or None (near ties aside)."""
    for p in run.prompts:
        d = p.proposals.first_difference if p.proposals is not None else None
        if d is not None and not d.within(engine.near_tie):
            return _difference(d, p.id, engine.name)
    c = run.proposals
    if c is not None and c.compared and c.equal < MIN_AGREEMENT * c.compared:
        return f"only {c.equal} of {c.compared} drafts equal the reference runtime's"
    return None


def engine_records(report) -> list[EngineRunRecord]:
    """Each engine run of an eval report as gate.json records it: what ran, and the
    engine's own system-info line (which code path: backends, CPU features)."""
    return [EngineRunRecord(kind=r.kind, artifact=r.artifact, spec_type=r.spec_type,
                            system_info=r.system_info)
            for r in report.engine_runs]


def engine_verdict(report, names: Sequence[str], engine: str = "llama.cpp") -> str:
    """An engine stage's line from an eval report with the engine's runs (ENGINE_STAGES:
    llama.cpp, dspark-mlx). Each artifact is judged by its run with the engine's advised
    spec type (llama.cpp: the --spec-type `dspark export` advises): run on at least one
    prompt, lossless, at least one draft compared with the reference runtime's (a run that
    drafted nothing, or whose text was compared with nothing, fails: nothing compared is
    never a pass), and (the BF16 artifact) every draft the reference runtime's, near
    ties aside; a quantized variant's drafts are compared and reported, not held to that
    (ggml computes a quantized matrix product with the activations quantized too). Else
    the first problem, as GateEngineError."""
    eng = ENGINE_STAGES[engine]
    refused = {n.artifact: n.reason for n in report.not_run
               if n.engine == engine and n.kind == "drafter" and n.artifact in names}
    problems, parts = [], []
    for name in names:
        runs = [r for r in report.engine_runs if r.engine == engine and r.kind == "drafter"
                and r.artifact == name]
        run = next((r for r in runs if r.spec_type == eng.advised), runs[0] if runs else None)
        if run is None:
            problems.append(f"{name}: {engine} did not run it: "
                            f"{refused.get(name, 'no run in the report')}")
            continue
        if not run.prompts:
            skipped = run.prompts_skipped[0] if run.prompts_skipped else None
            problems.append(f"{name}: {engine} ran no prompt"
                            + (f" (prompt {skipped.id}: {skipped.reason})" if skipped else ""))
            continue
        if run.lossless is None:
            problems.append(f"{name}: {engine}'s {run.spec_type} output of no prompt could be "
                            "compared with its own target alone; expected each prompt's text "
                            "equal to the target's (nothing compared is never a pass)")
            continue
        if run.lossless is not True:
            bad = next((p.id for p in run.prompts if p.lossless is False), "?")
            problems.append(f"{name}: {engine}'s {run.spec_type} output of prompt {bad} differs "
                            "from its own target alone at temperature 0")
            continue
        c = run.proposals
        if c is None or c.compared == 0:
            problems.append(f"{name}: {engine}'s {run.spec_type} run on {len(run.prompts)} "
                            "prompt(s) made no draft compared with the reference runtime's "
                            f"({'no draft check' if c is None else '0 compared'}); expected at "
                            "least one (nothing compared is never a pass)")
            continue
        misread = _misread(run, eng)
        if misread is not None and name == BF16:
            problems.append(f"{name}: {engine}'s ({run.spec_type}) {misread}; "
                            f"{c.equal} of {c.compared} drafts equal")
            continue
        agree = f"{c.equal} of {c.compared} drafts the reference's"
        if misread is not None:
            agree += " (a quantized variant: compared, not required equal)"
        elif c.equal < c.compared:
            agree += f" (each first difference a near tie, our margin < {eng.near_tie:g})"
        ours = _tau_on(report, name, {p.id for p in run.prompts})
        line = (f"{name}: {run.spec_type} on {len(run.prompts)} prompt(s), lossless, {agree}; "
                f"tau {_num(run.tau)} (ours {_num(ours)} on those prompts)")
        for other in (r for r in runs if r is not run and r.proposals is not None):
            wrong = _misread(other, eng)
            line += (f"; with {other.spec_type} (which {engine} picks for the file) "
                     f"{other.proposals.equal} of {other.proposals.compared} drafts equal"
                     + (f": {wrong}" if wrong else ""))
        parts.append(line)
    if problems:
        raise GateEngineError(_first_of(problems), field=engine, found=len(problems))
    return "; ".join(parts)


def _tau_on(report, name: str, ids: set[str]) -> float | None:
    """The reference runtime's tau for ``name`` on the prompts ``ids`` only (llama.cpp runs
    the prompts whose text it tokenizes back to their ids; dspark-mlx runs every one)."""
    run = next((r for r in report.runs if r.kind == "drafter" and r.artifact == name
                and r.confidence_threshold == 0.0), None)
    lengths = [a for p in (run.prompts if run else []) if p.id in ids
               for a in (p.acceptance_lengths or [])]
    return sum(lengths) / len(lengths) if lengths else None


def regression(entry: Entry, measurement: Measurement, baseline: GateReport | None):
    """The regression stage's verdict: (detail, []) when every check holds, _Stop when
    nothing could be compared, AcceptanceRegressionError for the first problem."""
    problems, checked = [], []
    for name, m in measurement.artifacts.items():
        if entry.min_tau is not None:
            if m.tau is None or m.tau < entry.min_tau - _EPS:
                problems.append(f"{name}: tau {_num(m.tau)} is below min_tau {entry.min_tau:g}")
            else:
                checked.append(f"{name} tau {m.tau:.3f} >= {entry.min_tau:g}")
    before = baseline.entry(entry.name) if baseline is not None else None
    limits = (entry.max_tau_drop is not None or entry.max_acceptance_drop is not None
              or entry.max_depth_acceptance_drop is not None)
    note = None
    if baseline is None:
        note = "no --baseline" if limits else None
    elif before is None or before.measurement is None:
        note = f"the baseline has no measurement of {entry.name}"
    elif before.measurement.settings() != measurement.settings():
        problems.append(f"the baseline measured with other settings ({_settings(before.measurement)}; "
                        f"now {_settings(measurement)}); expected the same prompts and settings")
    else:
        for name, m in measurement.artifacts.items():
            b = before.measurement.artifacts.get(name)
            if b is None:
                checked.append(f"{name}: new (not in the baseline)")
                continue
            if entry.max_tau_drop is not None and b.tau is not None:
                drop = b.tau - (m.tau or 0.0)
                if drop > entry.max_tau_drop + _EPS:
                    problems.append(f"{name}: tau {_num(m.tau)} dropped {drop:.3f} from the "
                                    f"baseline's {b.tau:.3f}; max_tau_drop is {entry.max_tau_drop:g}")
                else:
                    checked.append(f"{name} tau {_num(m.tau)} (baseline {b.tau:.3f})")
            if entry.max_acceptance_drop is not None:
                for k, (rb, rn) in enumerate(zip(b.acceptance_by_position, m.acceptance_by_position)):
                    if rb is not None and (rb - (rn or 0.0)) > entry.max_acceptance_drop + _EPS:
                        problems.append(f"{name}: the acceptance at draft position {k} is "
                                        f"{_num(rn)}, {rb - (rn or 0.0):.3f} below the baseline's "
                                        f"{rb:.3f}; max_acceptance_drop is "
                                        f"{entry.max_acceptance_drop:g}")
                        break
                else:
                    checked.append(f"{name} acceptance by position within "
                                   f"{entry.max_acceptance_drop:g} of the baseline")
            if entry.max_depth_acceptance_drop is not None:
                problem = depth_regression(name, b, m, entry.max_depth_acceptance_drop)
                if problem is not None:
                    problems.append(problem)
                elif b.acceptance_by_depth is None or m.acceptance_by_depth is None:
                    checked.append(f"{name}: acceptance by depth not in the baseline")
                else:
                    checked.append(f"{name} acceptance by position at each depth within "
                                   f"{entry.max_depth_acceptance_drop:g} of the baseline")
    if problems:
        raise AcceptanceRegressionError(_first_of(problems), field="regression",
                                        found=len(problems))
    if not checked:
        raise _Stop("recorded" if note else "not_run",
                    (note + "; measured, nothing to compare") if note
                    else "no min_tau, no --baseline: nothing to check")
    return "; ".join(checked + ([note] if note else [])), []


def depth_regression(name: str, before, now, tolerance: float) -> str | None:
    """The first drop of the acceptance at a draft position within a context depth
    (evaluation/depth.py buckets) beyond ``tolerance`` against the baseline, in words; None
    when none (or either side has no table). A position is compared where both measured
    a step reaching it at that depth; a depth the baseline did not reach is not compared."""
    if before.acceptance_by_depth is None or now.acceptance_by_depth is None:
        return None
    ours = {r.depth: r for r in now.acceptance_by_depth}
    for b in before.acceptance_by_depth:
        n = ours.get(b.depth)
        if n is None:
            continue
        for k, (rb, rn) in enumerate(zip(b.rates(), n.rates())):
            if rb is not None and rn is not None and rb - rn > tolerance + _EPS:
                return (f"{name}: at context depth {b.depth} tokens the acceptance at draft "
                        f"position {k} is {rn:.3f}, {rb - rn:.3f} below the baseline's "
                        f"{rb:.3f}; max_depth_acceptance_drop is {tolerance:g}")
    return None


def _first_of(problems: list[str]) -> str:
    """A stage's one error line: its first problem, and how many more there are."""
    return problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")


def _num(x: float | None) -> str:
    return "none" if x is None or not math.isfinite(x) else f"{x:.3f}"


def _settings(m: Measurement) -> str:
    return ", ".join(f"{k} {v}" for k, v in m.settings().items())


def _write(path: Path, data: bytes) -> None:
    try:
        path.write_bytes(data)
    except OSError as exc:
        from dspark_convert.util.atomic import write_error

        raise write_error(exc, path) from None


class _Gate:
    def __init__(self, policy: LoadedPolicy, out: Path, tmp: Path, baseline: GateReport | None,
                 progress: Progress, on_stage: StageCallback) -> None:
        self.policy, self.out, self.tmp, self.baseline = policy, out, tmp, baseline
        self.progress, self.on_stage = progress, on_stage
        self._targets: dict[str, object] = {}

    def open_target(self, spec: str):
        """Each target once per gate (the pairing reuses its headers and hashes)."""
        from dspark_convert.target.model import open_target

        if spec not in self._targets:
            self._targets[spec] = open_target(spec, progress=self.progress)
        return self._targets[spec]


def _reads(policy: LoadedPolicy, baseline: str | os.PathLike | None) -> list[tuple[object, str]]:
    """What the gate reads, which its output must stay out of."""
    from dspark_convert.source.hub.cache import hub_cache_dir

    reads: list[tuple[object, str]] = [(policy.path, "the policy file")]
    for e in policy.entries:
        reads += [(e.source.path, "a drafter's source"), (e.target.path, "a target model"),
                  (e.lock, "a lock file"), (e.prompts, "a prompt set"),
                  (e.llama_cpp, "the llama.cpp build"), (e.target_gguf, "a target GGUF"),
                  (e.dspark_mlx, "dspark-mlx's interpreter")]
        if e.source.hub or e.target.hub:
            reads.append((hub_cache_dir(None), "the Hugging Face cache"))
    if baseline is not None:
        reads.append((baseline, "the baseline"))
    return [(p, what) for p, what in reads if p is not None]


def run_gate(policy: str | os.PathLike, output: str | os.PathLike, *,
             baseline: str | os.PathLike | None = None, only: Sequence[str] = (),
             update: bool = False, force: bool = False, progress: Progress | None = None,
             on_stage: StageCallback | None = None,
             step_summary: str | os.PathLike | None = None) -> GateResult:
    """Run the gate (see the module docstring) and return its result; the verdict is
    ``result.report.passed``. Raises a DSparkError before anything runs for a bad policy
    (120), --only naming no drafter (123), a bad --baseline (122), an existing OUT_DIR
    without ``force`` (30) or one overlapping what the gate reads, and, with ``update``, a
    policy whose layout the copy's edit cannot follow (120); ``step_summary`` (the CLI's
    $GITHUB_STEP_SUMMARY) is checked then too (check_step_summary) and appended to once
    OUT_DIR is published, never waited on (``result.summary_warning`` says why it was not).
    GateInterrupted on Ctrl-C once the drafters have begun (OUT_DIR then holds an
    incomplete gate.json). A refusal after OUT_DIR is published (--update's copy) says
    where the reports are; an interrupt then carries ``gate_output``."""
    progress = progress or NoProgress()
    on_stage = on_stage or (lambda entry, stage: None)
    loaded = load_policy(policy)
    if update:
        check_updatable(loaded)        # the copy's edit proved possible before any work
    for name in only:
        if loaded.entry(name) is None:
            raise GateSelectionError(f"--only {shown(name)}: no drafter of {shown(loaded.path)} has "
                                     f"this name; expected one of "
                                     f"{', '.join(e.name for e in loaded.entries)}",
                                     field="only", expected=[e.name for e in loaded.entries],
                                     found=shown(name))
    entries = [e for e in loaded.entries if not only or e.name in only]
    before = read_gate_report(baseline) if baseline is not None else None
    # The one output rule for both outputs of the run, before any work: an empty or
    # '.'-like -o, overlaps with what the gate reads and with each other (through links),
    # the "exists" rule and writability.
    outputs = [Output(output, "the output directory")]
    if update:
        outputs.append(Output(updated_path(loaded.path), "--update's copy of the policy",
                              directory=False))
    reads = _reads(loaded, baseline)
    checked = check_outputs(outputs, reads, force=force)
    out, updated = checked[0], (checked[1] if update else None)
    summary = None
    if step_summary is not None:
        summary = check_step_summary(step_summary, [*reads, PACKAGE_READ,
                                                    *((p, o.what) for p, o in zip(checked, outputs))])

    runs: list[_EntryRun] = []
    interrupted = False
    with atomic_directory(out, force=force) as tmp:
        gate = _Gate(loaded, out, tmp, before, progress, on_stage)
        try:
            for entry in entries:
                run = _EntryRun(gate, entry)
                runs.append(run)
                run.stages_all()
        except KeyboardInterrupt:
            interrupted = True
        report = _report(loaded, entries, runs, baseline, list(only), interrupted)
        files = write_reports(report, tmp, _write)
    result = GateResult(report, out, tuple(files), None)
    # OUT_DIR is published: whatever happens now must not say that nothing was written.
    try:
        if updated is not None and not interrupted:
            hashes = {r.entry.index: r.artifacts[BF16].sha256 for r in runs if BF16 in r.artifacts}
            text = with_hashes(loaded.text, hashes, shown(loaded.path)).encode()
            atomic_file(updated, lambda fh: fh.write(text), force=force)
            result = replace(result, updated_policy=updated)
        if summary is not None:
            result = replace(result, summary_warning=append_step_summary(
                summary, render_markdown(report) + "\n"))
    except DSparkError as exc:
        raise type(exc)(f"{exc.message} (the gate ran: its reports are in {shown(out)})",
                        path=exc.path, field=exc.field, tensor=exc.tensor,
                        expected=exc.expected, found=exc.found) from None
    except BaseException as exc:
        # Ctrl-C or SIGTERM here: the CLI says where the reports are, not "nothing written"
        exc.gate_output = out
        raise
    if interrupted:
        raise GateInterrupted(result)
    return result


def check_step_summary(path: str | os.PathLike, others: Sequence[tuple[object, str]]) -> Path:
    """The step summary file ($GITHUB_STEP_SUMMARY) under the output rules, before any
    work: a name a file system can hold; not, not holding and not inside anything the gate
    reads or writes (``others``: (path, what) pairs, through links); and a regular file or
    a device (``/dev/null``, a terminal), existing, or new in an existing directory. A
    FIFO, a socket or a directory is refused: it would be waited on or cannot be appended
    to. Returns the absolute path."""
    label = f"GITHUB_STEP_SUMMARY {shown(os.fspath(path))}"
    summary = Path(os.path.abspath(check_path(path, what=label, error=OutputWriteError)))
    for other, what in others:
        if other is None:
            continue
        # a path not there yet counts too: OUT_DIR is created by this run
        relation = overlap(summary, Path(other))
        if relation is not None:
            raise OutputExistsError(f"{label}: {relation} {what} ({shown(os.fspath(other))}), which "
                                    "this gate reads or writes; expected a file of its own to "
                                    "append the summary to",
                                    path=str(summary), field="GITHUB_STEP_SUMMARY",
                                    expected=f"a path outside {shown(os.fspath(other))}",
                                    found=relation)
    try:
        mode = os.stat(summary).st_mode
    except FileNotFoundError:
        if not summary.parent.is_dir():
            raise OutputWriteError(f"{label}: cannot append the summary: the directory "
                                   f"{shown(str(summary.parent))} does not exist",
                                   path=str(summary), field="GITHUB_STEP_SUMMARY",
                                   expected="an existing directory", found="nothing") from None
        return summary
    except OSError as exc:
        raise OutputWriteError(f"{label}: cannot append the summary: "
                               f"{os.strerror(exc.errno or 0) or exc}", path=str(summary),
                               field="GITHUB_STEP_SUMMARY") from None
    if not (stat.S_ISREG(mode) or stat.S_ISCHR(mode)):
        raise OutputWriteError(f"{label}: is {file_kind(mode)}; expected a regular file to append "
                               "the summary to (never waited on)", path=str(summary),
                               field="GITHUB_STEP_SUMMARY", expected="a regular file",
                               found=file_kind(mode))
    return summary


def append_step_summary(path: Path, text: str) -> str | None:
    """Append ``text`` to the step summary, never waiting: opened non-blocking and checked
    on the open descriptor (a file swapped for a FIFO since check_step_summary is not
    written to), each write taken as it comes. The runner's file is appended to, never
    replaced. Returns None, or why it could not be (the verdict stands without it)."""
    flags = (os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOCTTY
             | getattr(os, "O_CLOEXEC", 0))
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        return os.strerror(exc.errno or 0) or str(exc)
    try:
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISCHR(mode)):
            return f"it is now {file_kind(mode)}; nothing appended"
        data = text.encode("utf-8")
        while data:
            data = data[os.write(fd, data):]
    except OSError as exc:
        if exc.errno == errno.EAGAIN:
            return "it would have to be waited on; the summary is cut short"
        return os.strerror(exc.errno or 0) or str(exc)
    finally:
        os.close(fd)
    return None


# The stages a drafter has, in order (gate_report.STAGES, "quantize" one per variant), for
# the ones an interrupted run never reached.
def _planned(entry: Entry) -> list[str]:
    quantize = [f"quantize.{q}" for q in entry.quantize] or ["quantize"]
    return [name for stage in STAGES for name in (quantize if stage == "quantize" else [stage])]


def _report(policy: LoadedPolicy, entries: list[Entry], runs: list[_EntryRun],
            baseline, only: list[str], interrupted: bool) -> GateReport:
    reason = "interrupted (Ctrl-C) before it finished"
    out = []
    for i, entry in enumerate(entries):
        run = runs[i] if i < len(runs) else None
        stages = list(run.stages) if run else []
        done = {s.name for s in stages}
        stages += [StageReport(name=n, status="not_run", detail=reason)
                   for n in _planned(entry) if n not in done]
        out.append(EntryReport(
            name=entry.name, source=entry.source.text, target=entry.target.text,
            passed=all(s.ok or s.status == "not_run" for s in stages) and not (
                interrupted and any(s.detail == reason for s in stages)),
            stages=stages, expected_sha256=entry.sha256,
            artifacts=dict(run.artifacts) if run else {},
            measurement=run.measurement if run else None))
    return GateReport(complete=not interrupted, incomplete_reason=reason if interrupted else None,
                      converter=f"{CONVERTER_NAME} {__version__}", policy=shown(policy.path),
                      policy_sha256=policy.sha256,
                      baseline=None if baseline is None else shown(os.fspath(baseline)),
                      only=only, passed=not interrupted and all(e.passed for e in out),
                      entries=out)
