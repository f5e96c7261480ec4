"""An artifact bound to its target for a run (`dspark smoke`, `dspark eval`).

The one pairing decides whether they belong together: ``validate_artifact`` with the
target (target/pairing.py: geometry, layer count and taps, tokenizer and the recorded
fingerprint, the embedding and head by SHA-256), each mismatch with its own exit code
(62-67), before any weight is loaded. The plans that follow reuse what was read: the
target's config as the pairing parsed it, the drafter's GGUF as validate parsed it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from dspark_convert.artifact.format import GGUF_FILE, metadata_family, read_metadata
from dspark_convert.commands.validate import ValidationReport, validate_artifact
from dspark_convert.errors import (
    DSparkError,
    FamilyExportError,
    FamilyQuantizeError,
    FamilyRuntimeError,
)
from dspark_convert.formats.gguf_reader import read_gguf
from dspark_convert.target.model import Target, open_target
from dspark_convert.util.progress import NoProgress, Progress


@dataclass(frozen=True)
class Binding:
    artifact: Path
    target: Target
    report: ValidationReport       # validate with the target: every check passed
    target_plan: object            # the family runtime's TargetPlan
    # The drafter's plan, by its kind (KIND_PLANS): runtime.weights.DrafterPlan (DSpark),
    # runtime.dflash2.DFlash2Plan (DFlash2), runtime.gemma4_assistant.AssistantPlan (the
    # assistant); each kind's ``load`` takes it (runtime.dflash2.load_drafter(plan, target),
    # runtime.gemma4_assistant.load_assistant(plan, target)).
    drafter_plan: object
    kind: str = "dspark"           # contract/families.Family.kind of the artifact

    @property
    def runtime(self):
        """The reference runtime's module for the target's family (runtime_of)."""
        return runtime_of(self.target.family)

    @property
    def warnings(self) -> list[str]:
        return [f"{c.name}: {c.detail}" for c in self.report.checks if c.status == "warning"]


def runtime_of(family):
    """The runtime module of a family (its row's ``runtime``: runtime/qwen3.py,
    runtime/gemma4.py), with ``plan_for``, ``Target`` and ``Drafter``. A family without
    one is refused before this by ``refuse_family``."""
    import importlib

    return importlib.import_module(family.runtime)


def target_read(spec: str | os.PathLike) -> tuple[Path, str]:
    """What a run's target is read from, for the output rule (atomic.check_outputs): the
    model directory, or for ``org/name@revision`` the Hugging Face cache it lives in."""
    from dspark_convert.source.hub.cache import hub_cache_dir

    if os.path.exists(os.fspath(spec)):
        return Path(spec), "the target model"
    return hub_cache_dir(), "the Hugging Face cache"


def open_run_target(spec: str | os.PathLike, progress: Progress | None = None) -> Target:
    """The target of a run, opened once for every artifact bound to it."""
    return open_target(spec, progress=progress or NoProgress())


def bind(artifact: str | os.PathLike, target: Target, *, progress: Progress | None = None,
         target_plan=None) -> Binding:
    """Validate ``artifact`` against ``target`` and plan both for loading (no weight is
    read). A failed check is raised as its own refusal, naming the artifact.
    ``target_plan``: the target's plan from an earlier binding to the same target (eval
    binds several artifacts to one), instead of planning it again."""
    import importlib

    progress = progress or NoProgress()
    artifact = Path(artifact)
    report = validate_artifact(artifact, target=target, progress=progress)
    report.raise_first_error(f"{artifact}: validate: ", path=str(artifact))
    label = str(artifact / GGUF_FILE)
    kind = metadata_family(read_metadata(report.gguf, path=label), path=label).kind
    module, function = KIND_PLANS[kind]
    plan = getattr(importlib.import_module(module), function)
    return Binding(artifact=artifact, target=target, report=report,
                   target_plan=target_plan or runtime_of(target.family).plan_for(target),
                   drafter_plan=plan(artifact, gguf=report.gguf), kind=kind)


# Each drafter kind's plan of an artifact (module, function (artifact, *, gguf)).
KIND_PLANS = {"dspark": ("dspark_convert.runtime.weights", "plan_drafter"),
              "dflash2": ("dspark_convert.runtime.dflash2", "plan_drafter"),
              "mtp": ("dspark_convert.runtime.gemma4_assistant", "plan_assistant")}


# Why a command cannot take an artifact of a family that lacks it (contract/families.py's
# artifact_commands), and its error class.
_FAMILY_REFUSALS = {
    "smoke": (FamilyRuntimeError, "the reference runtime does not run the {family} family yet"),
    "eval": (FamilyRuntimeError, "the reference runtime does not run the {family} family yet"),
    "quantize": (FamilyQuantizeError, "the quantized format does not define the {family} "
                                      "family yet"),
    # llama.cpp 0c1e570 has a Gemma4 DSpark graph (src/models/dflash.cpp) but applies the
    # final logit softcap only to DFlash2 drafters, and its converter refuses a Gemma4 DSpark
    # checkpoint with one (conversion/gemma.py): every DeepSeek Gemma4 drafter has softcap 30.
    "export": (FamilyExportError, "llama.cpp 0c1e570 does not run {family} drafters as trained "
                                  "(its DSpark graph applies no final logit softcap, and its "
                                  "converter refuses one), so there is no file to write for it"),
    # DeepSpec's checkpoint (config.json + model.safetensors of its DSpark model) holds its
    # own drafters only: a DFlash2 drafter is speculators', a Gemma 4 assistant transformers'.
    "export-deepspec": (FamilyExportError, "DeepSpec's checkpoint format holds DeepSpec's "
                                           "DSpark and DFlash drafters only, and a {family} "
                                           "drafter is none"),
    # conform re-proposes each line with DeepSpec's block drafter (evaluation/proposals.py);
    # these kinds draft in their own loops, whose drafts eval --engine llama.cpp checks.
    "conform": (FamilyRuntimeError, "conform re-proposes drafts with DeepSpec's block drafter, "
                                    "and a {family} drafter drafts in its own loop (eval "
                                    "--engine llama.cpp checks those drafts)"),
}

# What every family's artifact takes, whatever its row says.
_EVERY_FAMILY = ("convert", "validate", "inspect")
# The artifact_commands entries as a user types them.
COMMAND_NAMES = {"export": "export --engine llama.cpp", "export-deepspec": "export --engine deepspec",
                 "export-speculators": "export --engine speculators"}


def refuse_family(artifact: str | os.PathLike, command: str) -> None:
    """Refuse, in one line naming the family, an artifact whose family ``command`` does not
    handle yet, from drafter.gguf's header alone (before a target, a weight or a long
    validation is read). A file that does not parse is left to validate, which names what
    is wrong."""
    label = str(Path(artifact) / GGUF_FILE)
    try:
        family = metadata_family(read_metadata(read_gguf(label), path=label), path=label)
    except DSparkError:
        return
    if command in family.artifact_commands:
        return
    error, why = _FAMILY_REFUSALS[command]
    handled = [*_EVERY_FAMILY, *sorted(COMMAND_NAMES.get(c, c) for c in family.artifact_commands)]
    raise error(f"{label}: a {family.name} artifact ({family.architecture}): "
                f"{COMMAND_NAMES.get(command, command)}: "
                f"{why.format(family=family.name)}; {', '.join(handled[:-1])} and "
                f"{handled[-1]} take it",
                path=label, field="dspark.family", expected="a family this command handles",
                found=family.name)
