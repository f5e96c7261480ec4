"""What `dspark gate` writes about a run: gate.json (``GateReport``, schema
schemas/gate-report.schema.json), gate.md (the step summary) and junit.xml (one test
suite per drafter, one test case per stage).

A stage ends in one of five states:

- ``passed``; ``recorded``: measured, with nothing to compare against (no ``sha256`` in
  the policy yet, a drafter the baseline does not have), which does not fail the gate;
- ``failed``: its refusal's class, exit code and one line, the JUnit failure's message;
- ``skipped``: a stage it needs did not pass;
- ``not_run``: nothing to do (no variants to build, an engine not required or no llama.cpp
  build given, no baseline and no floor) or the run was interrupted before it; never a failure.
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from dspark_convert.errors import GateBaselineError
from dspark_convert.evaluation.depth import DepthRow
from dspark_convert.evaluation.options import MAX_NEW_TOKENS_LIMIT
from dspark_convert.util.json_out import dumps
from dspark_convert.util.models import VersionOne, validated
from dspark_convert.util.paths import check_input_file, check_path
from dspark_convert.util.patterns import SHA256_PATTERN
from dspark_convert.util.strict_json import NotVerbatimError, check_verbatim, parse_json_strict, read_capped
from dspark_convert.util.text import shown

REPORT_FORMAT = "dspark-gate-report"
GATE_JSON, GATE_MD, JUNIT_XML = "gate.json", "gate.md", "junit.xml"
StageStatus = Literal["passed", "recorded", "failed", "skipped", "not_run"]
# The stages in the order they run (quantize: "quantize.TYPE" per variant, or "quantize"
# alone when there is none).
STAGES = ("pin", "convert", "reproducibility", "validate", "quantize", "smoke", "eval",
          "llama.cpp", "dspark-mlx", "regression")
OK_STATUSES = ("passed", "recorded")


class _Model(BaseModel):
    # strict: a --baseline is read back with these models, and a tau of "2.5" or a prompt
    # count of true is a wrong file, not a number (as every other file the tool reads).
    # Every number has its range too (a tau of -100 or an acceptance rate of 7.0 would be
    # compared as data), and none may be infinite (1e999 parses to inf).
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


def _sha256(text: str) -> str:
    if re.fullmatch(SHA256_PATTERN.strip("^$"), text) is None:
        raise ValueError("a SHA-256 (64 lowercase hex digits)")
    return text


# The schema says the pattern; the check says it in words.
Sha256 = Annotated[str, AfterValidator(_sha256), Field(json_schema_extra={"pattern": SHA256_PATTERN})]
# The fraction of drafts accepted at a draft position.
Rate = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]


class EngineRunRecord(_Model):
    """One run of another engine in its stage (llama.cpp, dspark-mlx): what it ran, and the
    engine's own system-info line (None: its log had none)."""
    kind: Literal["target", "drafter"]
    artifact: str | None = Field(description="the artifact (bf16, a variant); None: the target alone")
    spec_type: str | None
    system_info: str | None = Field(description="the engine's own system_info line: its "
                                    "backends and the CPU features it was built for and uses")


class StageReport(_Model):
    name: str = Field(description="pin, convert, reproducibility, validate, quantize.TYPE, "
                      "smoke, eval, llama.cpp, dspark-mlx, regression")
    status: StageStatus
    detail: str = Field(description="one line: what was found, or the refusal")
    error: str | None = Field(None, description="a failure's error class")
    exit_code: int | None = Field(None, ge=1, le=255,
                                  description="a failure's exit code (`dspark` command's)")
    seconds: float = Field(0.0, ge=0, allow_inf_nan=False)
    files: list[str] = Field(default_factory=list, description="what it wrote, relative "
                             "to the output directory")
    engine_runs: list[EngineRunRecord] = Field(default_factory=list, description=(
        "an engine's stage (llama.cpp, dspark-mlx): each run of the engine, with the "
        "system-info line it printed (its backends and CPU features: which code path ran)"))

    @property
    def ok(self) -> bool:
        return self.status in OK_STATUSES

    @property
    def line(self) -> str:
        """The stage's error line (JUnit's failure message)."""
        return f"{self.error}: {self.detail}" if self.error else self.detail


class ArtifactSummary(_Model):
    path: str = Field(description="relative to the output directory")
    size: int = Field(ge=0)
    sha256: Sha256


class Measured(_Model):
    """One artifact's acceptance at temperature 0 on the prompts (eval's threshold-0 run)."""
    tau: float | None = Field(ge=1, allow_inf_nan=False, description=(
        "the mean acceptance length (accepted + 1 per verify step: at least 1)"))
    acceptance_by_position: list[Rate | None]
    lossless: bool | None
    # By context depth (evaluation/depth.py): per bucket, the steps reaching each draft
    # position and those accepting it. None in a report written before it was measured.
    acceptance_by_depth: list[DepthRow] | None = None


class Measurement(_Model):
    """The eval's settings and, per artifact (bf16 and each variant), its acceptance: what
    a later gate's --baseline compares with."""
    prompt_set_sha256: Sha256
    prompts: int = Field(ge=1)
    max_new_tokens: int = Field(ge=1, le=MAX_NEW_TOKENS_LIMIT)
    dtype: str
    device: str
    artifacts: dict[str, Measured]

    def settings(self) -> dict:
        return {"prompt set SHA-256": self.prompt_set_sha256[:12], "prompts": self.prompts,
                "max_new_tokens": self.max_new_tokens, "dtype": self.dtype}


class EntryReport(_Model):
    name: str
    source: str = Field(description="as the policy writes it")
    target: str
    passed: bool = Field(description="every stage passed, recorded or had nothing to do")
    stages: list[StageReport]
    expected_sha256: Sha256 | None = Field(description="drafter.gguf's SHA-256 the policy names")
    artifacts: dict[str, ArtifactSummary] = Field(
        description="bf16 (the converted artifact) and each quantized variant built")
    measurement: Measurement | None

    def stage(self, name: str) -> StageReport | None:
        return next((s for s in self.stages if s.name == name), None)

    @property
    def first_failure(self) -> StageReport | None:
        return next((s for s in self.stages if s.status == "failed"), None)


class GateReport(_Model):
    format: Literal["dspark-gate-report"] = REPORT_FORMAT
    version: VersionOne = 1
    complete: bool = Field(description="false: interrupted (Ctrl-C); the stages that did "
                           "not run say so")
    incomplete_reason: str | None
    converter: str
    policy: str
    policy_sha256: Sha256
    baseline: str | None = Field(description="the --baseline directory, as given")
    only: list[str]
    passed: bool = Field(description="complete, and every entry passed")
    entries: list[EntryReport]

    def entry(self, name: str) -> EntryReport | None:
        return next((e for e in self.entries if e.name == name), None)


def gate_json(report: GateReport) -> bytes:
    return (dumps(report, indent=1) + "\n").encode()


def read_gate_report(directory: str | os.PathLike) -> GateReport:
    """A previous gate's gate.json (--baseline), complete; anything else one refusal."""
    root = check_path(directory, what="--baseline", error=GateBaselineError)
    path = root / GATE_JSON
    if not root.is_dir() or not path.exists():
        what = "no such directory" if not root.is_dir() else f"no {GATE_JSON} in it"
        raise GateBaselineError(f"--baseline {root}: {what}; expected the output directory of "
                                "an earlier `dspark gate`", path=str(path),
                                expected=GATE_JSON, found="nothing")
    # A gate.json that is a FIFO or a directory says so (and a FIFO is never waited on).
    check_input_file(path, label=f"--baseline {path}", error=GateBaselineError,
                     expected=f"the {GATE_JSON} of an earlier `dspark gate`")
    label = f"--baseline {path}"
    raw = parse_json_strict(read_capped(path, error=GateBaselineError, label=label),
                            error=GateBaselineError, label=label, path=str(path))
    try:
        # 1e999 parses to inf (the JSON reader refuses only the constants NaN, Infinity)
        check_verbatim(raw)
    except NotVerbatimError as exc:
        expected = "a finite number" if "number" in exc.why else "what JSON holds unchanged"
        raise GateBaselineError(f"{label}: field '{exc.where}': {exc.why}; expected {expected}",
                                path=str(path), field=exc.where, expected=expected,
                                found=exc.why) from None
    report = validated(GateReport, raw, error=GateBaselineError, label=label, path=str(path),
                       hint=f" (a {REPORT_FORMAT} v1 file)")
    if not report.complete:
        raise GateBaselineError(f"{label}: the gate it records did not finish "
                                f"({_unfinished(report)}); expected a complete gate",
                                path=str(path), field="complete", expected=True, found=False)
    return report


def _unfinished(report: GateReport) -> str:
    """What an incomplete gate lacks: its reason, and the stages that never ran."""
    why = report.incomplete_reason or "complete is false, no reason recorded"
    missing = [f"{e.name} {s.name}" for e in report.entries for s in e.stages
               if s.status == "not_run" and s.detail == report.incomplete_reason]
    if not missing:
        return why
    more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
    return f"{why}: {len(missing)} stage(s) never ran, {', '.join(missing[:3])}{more}"


# --- gate.md ----------------------------------------------------------------------------------

_MARK = {"passed": "✅", "recorded": "📝", "failed": "❌", "skipped": "⏭️", "not_run": "➖"}


def _cell(text: str) -> str:
    return shown(text).replace("|", "\\|")


def render_markdown(report: GateReport) -> str:
    passed = sum(e.passed for e in report.entries)
    verdict = ("PASSED" if report.passed else "INCOMPLETE" if not report.complete else "FAILED")
    out = [f"# dspark gate: {verdict}", "",
           f"{passed} of {len(report.entries)} drafter(s) passed; policy `{_cell(report.policy)}` "
           f"(SHA-256 {report.policy_sha256[:12]}…)"
           + (f", baseline `{_cell(report.baseline)}`" if report.baseline else ", no baseline")
           + f"; {report.converter}.", ""]
    if not report.complete:
        out += [f"> **INCOMPLETE**: {_cell(report.incomplete_reason or '')}", ""]
    names = sorted(dict.fromkeys(s.name for e in report.entries for s in e.stages),
                   key=lambda n: (STAGES.index("quantize" if n.startswith("quantize.") else n)
                                  if n in STAGES or n.startswith("quantize.") else len(STAGES), n))
    out += ["| drafter | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for e in report.entries:
        by = {s.name: s for s in e.stages}
        cells = [_MARK[by[n].status] if n in by else "" for n in names]
        out.append(f"| {'✅' if e.passed else '❌'} `{_cell(e.name)}` | " + " | ".join(cells) + " |")
    out += ["", "✅ passed · 📝 recorded (nothing to compare with) · ❌ failed · ⏭️ skipped "
            "(needs a failed stage) · ➖ not run", ""]
    failures = [(e, s) for e in report.entries for s in e.stages if s.status == "failed"]
    if failures:
        out += ["## Failures", ""]
        out += [f"- `{_cell(e.name)}` **{_cell(s.name)}**: {_cell(s.line)}" for e, s in failures]
        out.append("")
    for e in report.entries:
        out += [f"## {_cell(e.name)}", "", f"source `{_cell(e.source)}`, target `{_cell(e.target)}`", ""]
        out += [f"- {_MARK[s.status]} **{_cell(s.name)}**: {_cell(s.line)}" for s in e.stages]
        # which code path the engine ran (one line per distinct system info: every run of
        # one machine prints the same)
        out += [f"- {_cell(s.name)} system info: "
                + (_cell(info.removeprefix("system_info: ")) if info is not None
                   else "none in the engine's log")
                for s in e.stages for info in dict.fromkeys(r.system_info for r in s.engine_runs)]
        if e.measurement is not None:
            m = e.measurement
            out += ["", f"Acceptance at temperature 0 ({m.prompts} prompts, {m.max_new_tokens} new "
                    f"tokens, {m.dtype}, {m.device}):", "",
                    "| artifact | tau | acceptance by draft position |", "|---|---|---|"]
            for name, a in m.artifacts.items():
                rates = " ".join("-" if r is None else f"{r:.2f}" for r in a.acceptance_by_position)
                tau = "-" if a.tau is None else f"{a.tau:.3f}"
                out.append(f"| {_cell(name)} | {tau} | {rates} |")
        out.append("")
    return "\n".join(out)


# --- junit.xml --------------------------------------------------------------------------------

def render_junit(report: GateReport) -> bytes:
    """JUnit XML as CI systems read it: <testsuites> of one <testsuite> per drafter, one
    <testcase> per stage; a failed stage has <failure message=its line type=its error>,
    a skipped or not-run one <skipped message=why>. Text goes through ``shown`` (no
    control character, which XML 1.0 cannot carry)."""
    def count(entries, status):
        return sum(s.status in status for e in entries for s in e.stages)

    root = ET.Element("testsuites", {
        "name": "dspark gate", "tests": str(count(report.entries, _ALL)),
        "failures": str(count(report.entries, ("failed",))), "errors": "0",
        "skipped": str(count(report.entries, ("skipped", "not_run"))),
        "time": f"{sum(s.seconds for e in report.entries for s in e.stages):.3f}"})
    for e in report.entries:
        suite = ET.SubElement(root, "testsuite", {
            "name": shown(e.name), "tests": str(len(e.stages)),
            "failures": str(count([e], ("failed",))), "errors": "0",
            "skipped": str(count([e], ("skipped", "not_run"))),
            "time": f"{sum(s.seconds for s in e.stages):.3f}"})
        for s in e.stages:
            case = ET.SubElement(suite, "testcase", {"classname": f"dspark-gate.{shown(e.name)}",
                                                     "name": shown(s.name),
                                                     "time": f"{s.seconds:.3f}"})
            if s.status == "failed":
                failure = ET.SubElement(case, "failure", {"message": shown(s.line),
                                                          "type": shown(s.error or "failed")})
                failure.text = shown(s.line)
            elif s.status in ("skipped", "not_run"):
                ET.SubElement(case, "skipped", {"message": shown(s.detail)})
            else:
                ET.SubElement(case, "system-out").text = shown(f"{s.status}: {s.detail}")
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"


_ALL = ("passed", "recorded", "failed", "skipped", "not_run")


def write_reports(report: GateReport, directory: Path, write) -> list[str]:
    """gate.json, gate.md and junit.xml into ``directory`` through ``write(path, bytes)``."""
    write(directory / GATE_JSON, gate_json(report))
    write(directory / GATE_MD, render_markdown(report).encode())
    write(directory / JUNIT_XML, render_junit(report))
    return [GATE_JSON, GATE_MD, JUNIT_XML]


def as_json_document(report: GateReport) -> str:
    return dumps(report, indent=1)
