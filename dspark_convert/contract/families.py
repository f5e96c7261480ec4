"""The drafter families, as data: one row per checkpoint ``architectures`` entry.

A checkpoint's family is chosen here, by its config.json's ``architectures`` (never by
``model_type``: a Gemma4 drafter's says gemma4_text or gemma4_unified_text depending on
how it was saved), and everything family-specific is reached through its row: the config
reader, the contract builder, the tensor table, the check of the tensors against the
attention the config names, and what the rest of the tool can do with it yet.

Four rows: the DSpark families (Qwen3's, Gemma4's; kind ``dspark``), speculators' DFlash2
(kind ``dflash2``) and the Gemma 4 assistant (kind ``mtp``). The kind is what eval and
export tell drafters apart by; the last two are converted against a target
(``needs_target``) and refuse quantize (``artifact_commands``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Literal, Union

from pydantic import Field

from dspark_convert.contract import dflash2, dspark, gemma4, gemma4_assistant
from dspark_convert.contract.inventory import check_head_tensors
from dspark_convert.contract.tensor_table import (ASSISTANT_TENSOR_RULES, DFLASH2_TENSOR_RULES,
                                                  GEMMA4_TENSOR_RULES, TENSOR_RULES, TensorRule)
from dspark_convert.errors import UnsupportedArchitectureError


# A contract of any family, told apart by its ``family`` field (manifest.json, inspect).
AnyContract = Annotated[Union[dspark.FeatureContract, gemma4.Gemma4Contract,
                              dflash2.DFlash2Contract, gemma4_assistant.AssistantContract],
                        Field(discriminator="family")]

# The kinds of drafter (what eval and export tell apart, never by family name): DSpark /
# DFlash block drafters with DeepSpec's heads, speculators' DFlash2 (conv + candidate
# selector), and the MTP assistant over the target's KV (the Gemma 4 assistant).
Kind = Literal["dspark", "dflash2", "mtp"]


def _no_more_checks(_contract, _names: set[str], *, path: str) -> None:
    return None


@dataclass(frozen=True)
class Family:
    name: str                                   # the contract's ``family``
    architecture: str                           # config.json's ``architectures`` entry
    parse_config: Callable[..., object]         # (raw, *, path) -> the family's config model
    build_contract: Callable[..., object]       # (cfg, *, path) -> the family's contract
    tensor_rules: tuple[TensorRule, ...]
    # Family-specific checks of the tensor names against the contract, run before the
    # inventory (the Markov / confidence head checks are every family's, inventory.py).
    check_tensors: Callable[..., None]
    # The model_type values of this family's targets (top level of their config.json), and
    # the module that reads them (target/qwen3.py says what it provides), if any.
    target_model_types: tuple[str, ...]
    target_reader: str | None
    # The commands past convert / validate / inspect that handle this family's artifacts
    # (smoke, eval: the reference runtime; conform: DeepSeek's block drafter re-proposing an
    # engine's drafts; quantize; export: llama.cpp's file; export-deepspec and
    # export-speculators: those checkpoint formats): the others refuse them
    # (commands/binding.refuse_family, one line naming the commands that take it).
    artifact_commands: frozenset[str]
    # The reference runtime's module for this family (runtime/qwen3.py says what it
    # provides: plan_for, Target, Drafter), if it runs the family.
    runtime: str | None = None
    # The kind of drafter (Kind): what eval and export tell apart.
    kind: Kind = "dspark"
    # A second JSON file of the checkpoint the config reader reads beside config.json, when
    # present (the assistant's generation_config.json: its drafts per cycle); recorded in
    # manifest.json verbatim (source.companion) and hashed with the source's files.
    companion_file: str | None = None
    # The source dtype config.json declares, if any: (cfg, *, path) -> "BF16" | ... | None.
    config_dtype: Callable[..., str | None] = dspark.config_dtype
    # Whether convert needs --target (the drafter records neither the embedding nor what
    # its pairing checks): a DSpark checkpoint in DeepSpec's format does not.
    needs_target: bool = False

    def parse(self, raw: object, *, path: str, companion: object = None,
              companion_path: str | None = None):
        """config.json (and the companion file's parsed JSON, for a family with one) as
        the family's config model."""
        if self.companion_file is None:
            return self.parse_config(raw, path=path)
        return self.parse_config(raw, path=path, companion=companion,
                                 companion_path=companion_path or self.companion_file)


QWEN3 = Family(name=dspark.FAMILY, architecture=dspark.ARCHITECTURE,
               parse_config=dspark.parse_config, build_contract=dspark.build_contract,
               tensor_rules=TENSOR_RULES, check_tensors=_no_more_checks,
               target_model_types=("qwen3",), target_reader="dspark_convert.target.qwen3",
               artifact_commands=frozenset({"smoke", "eval", "quantize", "export",
                                            "export-deepspec", "export-speculators",
                                            "conform"}),
               runtime="dspark_convert.runtime.qwen3")

GEMMA4 = Family(name=gemma4.FAMILY, architecture=gemma4.ARCHITECTURE,
                parse_config=gemma4.parse_config,
                build_contract=lambda cfg, *, path, raw=None: gemma4.build_contract(
                    cfg, path=path, raw=raw),
                tensor_rules=GEMMA4_TENSOR_RULES, check_tensors=gemma4.check_tensors,
                # DeepSpec's builder accepts gemma4 and gemma4_unified targets; the text
                # model types are their nested text_config's.
                target_model_types=("gemma4", "gemma4_unified", "gemma4_text",
                                    "gemma4_unified_text"),
                target_reader="dspark_convert.target.gemma4",
                # llama.cpp 0c1e570 applies no final logit softcap to a Gemma4 DSpark
                # drafter (and its converter refuses one): export refuses the family.
                artifact_commands=frozenset({"quantize", "smoke", "eval", "export-deepspec",
                                            "conform"}),
                runtime="dspark_convert.runtime.gemma4")

DFLASH2 = Family(name=dflash2.FAMILY, architecture=dflash2.ARCHITECTURE,
                 # speculators' layout or z-lab's (contract/dflash2.py): one contract.
                 parse_config=dflash2.parse_any_config,
                 build_contract=dflash2.build_contract,
                 tensor_rules=DFLASH2_TENSOR_RULES, check_tensors=_no_more_checks,
                 target_model_types=("qwen3",), target_reader="dspark_convert.target.qwen3",
                 artifact_commands=frozenset({"smoke", "eval", "export", "export-speculators"}),
                 runtime="dspark_convert.runtime.dflash2", kind="dflash2",
                 config_dtype=dflash2.config_dtype, needs_target=True)

ASSISTANT = Family(name=gemma4_assistant.FAMILY, architecture=gemma4_assistant.ARCHITECTURE,
                   parse_config=gemma4_assistant.parse_config,
                   build_contract=gemma4_assistant.build_contract,
                   tensor_rules=ASSISTANT_TENSOR_RULES, check_tensors=_no_more_checks,
                   target_model_types=("gemma4_unified",),
                   target_reader="dspark_convert.target.gemma4",
                   artifact_commands=frozenset({"smoke", "eval", "export"}),
                   runtime="dspark_convert.runtime.gemma4_assistant", kind="mtp",
                   companion_file=gemma4_assistant.GENERATION_CONFIG,
                   config_dtype=gemma4_assistant.config_dtype, needs_target=True)

FAMILIES: dict[str, Family] = {f.architecture: f for f in (QWEN3, GEMMA4, DFLASH2, ASSISTANT)}
# Architectures a family's module knows but does not read: refused by name (14).
NOT_READ: dict[str, str] = dict(gemma4_assistant.OTHER_ARCHITECTURES)
BY_NAME: dict[str, Family] = {f.name: f for f in FAMILIES.values()}


def family_of(raw: object, *, path: str) -> Family:
    """The family config.json's ``architectures`` names. A well-formed list naming no
    family is refused here (14), naming the ones there are; a missing or mistyped
    ``architectures`` is left to the Qwen3 reader, whose strict model names the field (13),
    as it always has."""
    archs = raw.get("architectures") if isinstance(raw, dict) else None
    if not (isinstance(archs, list) and archs and all(isinstance(a, str) for a in archs)):
        return QWEN3
    if len(archs) == 1 and archs[0] in FAMILIES:
        return FAMILIES[archs[0]]
    if len(archs) == 1 and archs[0] in NOT_READ:
        raise UnsupportedArchitectureError(
            f"{path}: field 'architectures': {archs[0]} is {NOT_READ[archs[0]]}", path=path,
            field="architectures", expected=[[a] for a in FAMILIES], found=archs)
    known = " or ".join(f"['{a}']" for a in FAMILIES)
    # A target model's config where a drafter's is expected: the likeliest slip of all.
    hint = ("; this is a target model (model_type "
            f"{raw['model_type']!r}): give the drafter's checkpoint here, the target to --target"
            if target_family_of(raw) is not None else "")
    raise UnsupportedArchitectureError(
        f"{path}: field 'architectures': expected {known}, found {archs}{hint}", path=path,
        field="architectures", expected=[[a] for a in FAMILIES], found=archs)


def target_family_of(raw: object) -> Family | None:
    """The family whose targets have this config.json's model_type, if any is known."""
    model_type = raw.get("model_type") if isinstance(raw, dict) else None
    return next((f for f in FAMILIES.values() if model_type in f.target_model_types), None)


def family_named(name: str) -> Family:
    """The family of a contract (its ``family`` field)."""
    return BY_NAME[name]
