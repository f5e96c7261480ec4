"""Prove that a drafter belongs to a target: geometry, embedding identity, tokenizer.

A drafter converted against the wrong target loads and then proposes garbage, or reads
out of bounds. Three groups of checks, each raising the error class of its kind with a
message naming both values, and returning one ``Check`` per check that passed (or
warned):

* ``check_compatibility``: config geometry (family, hidden size, vocabulary, layer count
  and taps, mask token inside the embedding, and what the drafter copied from the target's
  config as its family's target reader lists it: rope theta and RMS eps; for Gemma4 the
  full-attention RoPE type and partial factor and the logit softcap too) and the tokenizer
  (no token beyond the embedding, the mask token never produced for ordinary text, the
  fingerprint an artifact recorded). Reads no tensor byte.
* ``check_identity``: the drafter's ``embed_tokens`` / ``lm_head`` copies against the
  target's, by SHA-256 of the same-dtype bytes.
* ``target_record``: all of it, for the manifest.

``pair_source`` / ``SourcePairing.finish`` are what ``convert(..., target=)`` calls (before
anything is written / before the output is renamed into place); ``pair_artifact`` is what
``validate_artifact(..., target=)`` calls.

The drafter side is a ``Drafter``: a contract plus how to name its fields in messages
(config.json fields for a checkpoint, GGUF metadata keys for an artifact).
"""

from __future__ import annotations

from dspark_convert.checks import Check

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING


from dspark_convert.artifact.format import CONFIG_FIELD_KEYS, as_float32
from dspark_convert.contract.dspark import FeatureContract, tap_problem
from dspark_convert.contract.families import family_named, target_family_of
from dspark_convert.errors import (
    EmbeddingIdentityError,
    MaskTokenCollisionError,
    TargetGeometryError,
    TargetFamilyError,
    TargetLayerMismatchError,
    TargetVocabError,
    TokenizerMismatchError,
)
from dspark_convert.artifact.manifest import TargetRecord, TargetTensorRecord, TokenizerRecord
from dspark_convert.util.progress import NoProgress, Progress
from dspark_convert.formats.safetensors import TensorEntry
from dspark_convert.target.model import (
    first_different_row,
    Target,
    hash_target_tensors,
    open_target,
    target_reader,
    tensor_sha256,
)
from dspark_convert.util.text import shown
from dspark_convert.target.tokenizer import fingerprint_difference

if TYPE_CHECKING:
    from dspark_convert.artifact.manifest import Manifest
    from dspark_convert.source.checkpoint import Source

# The drafter's own copies, by the role they play in the target.
DRAFTER_TENSOR_ROLES = {"embed_tokens.weight": "embedding", "lm_head.weight": "head"}
# Where an artifact keeps what a checkpoint's config.json field or tensor held.
_METADATA_NAMES = {**CONFIG_FIELD_KEYS, "embed_tokens.weight": "dflash.target.embed_sha256",
                   "lm_head.weight": "dflash.target.lm_head_sha256"}


@dataclass(frozen=True)
class Drafter:
    """The drafter side of a pairing."""

    label: str                      # "drafter <dir>/config.json" or "artifact <dir>/drafter.gguf"
    contract: FeatureContract
    model_type: str | None = None   # config.json model_type; None for an artifact (implied)
    from_metadata: bool = False     # name fields by GGUF metadata keys

    def field(self, name: str) -> str:
        key = _METADATA_NAMES.get(name, name) if self.from_metadata else name
        # A key in another family's namespace (dspark.gemma4.* for a Qwen3 file) is not in
        # this file: the field is implied by the family, so it keeps config.json's name.
        parts = key.split(".")
        if self.from_metadata and parts[0] == "dspark" and len(parts) > 2 and \
                not self.contract.family.startswith(parts[1] + "-"):
            key = name
        return f"{self.label} {key}"


def _short(sha: str) -> str:
    return sha[:16] + "…"


# --- geometry ----------------------------------------------------------------------------------

def check_geometry(drafter: Drafter, target: Target) -> list[Check]:
    tcfg, g = target.config, drafter.contract.geometry
    where = f"target {target.checkpoint.files.config}"
    checks = []

    family, theirs = family_named(drafter.contract.family), target_family_of(target.raw_config)
    if theirs is not None and theirs is not family:
        # A target of another known family (a Gemma4 drafter on a Qwen3 target): named by
        # both families, not as a geometry detail.
        raise TargetFamilyError(
            f"{where}: model_type {tcfg.model_type!r} is a target of the {theirs.name} family; "
            f"the drafter ({drafter.contract.architecture}, {family.name}) pairs with a "
            f"{' / '.join(family.target_model_types)} target", path=where, field="model_type",
            expected=list(family.target_model_types), found=tcfg.model_type)
    problem = target_reader(family).model_type_problem(drafter.contract, drafter.model_type,
                                                        target.read)
    if problem is not None:
        field, found, expected, drafter_field = problem
        raise TargetGeometryError(
            f"{where}: {field} is {found!r}; the drafter "
            f"({drafter.contract.architecture}) expects {expected!r} ({drafter.field(drafter_field)})",
            path=where, field=field, expected=expected, found=found)
    checks.append(Check.passed("target.family", f"{tcfg.model_type} ({', '.join(tcfg.architectures)})"))

    # The text model's fields: at the top of a Qwen3 config.json, in a Gemma4 text_config.
    field = target.read.field
    if tcfg.hidden_size != g.hidden_size:
        raise TargetGeometryError(
            f"{where}: {field('hidden_size')} is {tcfg.hidden_size}; the drafter expects "
            f"{g.hidden_size} ({drafter.field('hidden_size')})", path=where,
            field=field("hidden_size"), expected=g.hidden_size, found=tcfg.hidden_size)
    checks.append(Check.passed("target.hidden_size", f"{g.hidden_size} on both sides"))

    if tcfg.vocab_size != g.vocab_size:
        raise TargetVocabError(
            f"{where}: {field('vocab_size')} is {tcfg.vocab_size}; the drafter expects "
            f"{g.vocab_size} ({drafter.field('vocab_size')})", path=where,
            field=field("vocab_size"), expected=g.vocab_size, found=tcfg.vocab_size)
    checks.append(Check.passed("target.vocab_size", f"{g.vocab_size} embedding rows on both sides"))

    checks.append(_check_layers(drafter, target, where))

    mask = drafter.contract.block.mask_token_id
    if not 0 <= mask < tcfg.vocab_size:
        raise MaskTokenCollisionError(
            f"{drafter.field('mask_token_id')} is {mask}; the target's embedding has "
            f"{tcfg.vocab_size} rows ({where} {field('vocab_size')}), expected an id in "
            f"[0, {tcfg.vocab_size - 1}]", path=drafter.label, field="mask_token_id",
            expected=f"0..{tcfg.vocab_size - 1}", found=mask)

    checks += _check_norms(drafter, target, where)
    return checks


def _check_layers(drafter: Drafter, target: Target, where: str) -> Check:
    n, layers = target.config.num_hidden_layers, target.read.field("num_hidden_layers")
    taps = drafter.contract.taps
    for pos, layer in enumerate(taps.target_layer_ids):
        field = f"{drafter.field('target_layer_ids')}[{pos}]"
        problem = tap_problem(layer, n)
        if problem is not None:
            raise TargetLayerMismatchError(
                f"{field} is {layer}, {problem} ({where} {layers} = {n}); expected a "
                f"layer id in [0, {n - 2}]", path=drafter.label,
                field=f"target_layer_ids[{pos}]", expected=f"0..{n - 2}", found=layer)
    if taps.num_target_layers != n:
        raise TargetLayerMismatchError(
            f"{where}: {layers} is {n}; the drafter expects {taps.num_target_layers} "
            f"({drafter.field('num_target_layers')})", path=where, field=layers,
            expected=taps.num_target_layers, found=n)
    return Check.passed("target.layers", f"{n} target layers; taps {taps.target_layer_ids} are "
                   f"layers of it, none the last")


def _check_norms(drafter: Drafter, target: Target, where: str) -> list[Check]:
    """What the drafter copied from the target's config and computes with (its family's
    reader lists them: RoPE, RMS eps, ...), equal on both sides; a value unusual for the
    family's released targets is a warning."""
    reader = target_reader(target.family)
    values = target.read.values
    checks = []
    for key, target_field, drafter_field, want in reader.inherited(drafter.contract):
        as_given = values[key]
        # An artifact holds rms_norm_eps as FLOAT32: compare what the file can hold.
        got = as_float32(as_given) if drafter.from_metadata and key == "rms_norm_eps" else as_given
        if want != got:
            raise TargetGeometryError(
                f"{where}: {target_field} is {as_given}; the drafter expects {want} "
                f"({drafter.field(drafter_field)})", path=where, field=target_field,
                expected=want, found=as_given)
    checks.append(Check.passed("target.norms", reader.inherited_detail(target.read)))
    unusual = [f"{name} {values[key]:g} ({who} uses {norm:g})"
               for key, (name, norm, who) in reader.USUAL.items()
               if not math.isclose(values[key], norm, rel_tol=1e-6)]
    if unusual:
        checks.append(Check.warning("target.family_norms", "unusual for the family: "
                               + "; ".join(unusual)))
    return checks


# --- tokenizer ---------------------------------------------------------------------------------

def check_tokenizer(drafter: Drafter, target: Target,
                    recorded: TokenizerRecord | None = None) -> list[Check]:
    """The tokenizer against the embedding and the mask token, and against the
    fingerprint an artifact recorded (``recorded``; None: nothing to compare with)."""
    tok = target.tokenizer
    rec = tok.record
    where = f"target {target.directory / rec.file}"
    rows = target.config.vocab_size
    checks = []

    if rec.max_token_id >= rows:
        kind, content = tok.classify(rec.max_token_id)
        raise TargetVocabError(
            f"{where}: has token id {rec.max_token_id} ({content!r}); the embedding has only "
            f"{rows} rows (target config.json {target.read.field('vocab_size')}), expected "
            f"every id below {rows}",
            path=where, field="vocab_size", expected=f"< {rows}", found=rec.max_token_id)
    if rec.max_token_id + 1 < rows:
        detail = (f"{rec.vocab_size} tokens (ids up to {rec.max_token_id}) in {rows} embedding "
                  f"rows: the embedding is padded beyond the tokenizer, which is normal")
    else:
        detail = f"{rec.vocab_size} tokens fill the {rows} embedding rows"
    checks.append(Check.passed("target.tokenizer_vocab", detail))

    mask = drafter.contract.block.mask_token_id
    kind, content = tok.classify(mask)
    field = drafter.field("mask_token_id")
    if kind in ("ordinary", "added"):
        what = ("a token of its vocabulary, produced for ordinary text" if kind == "ordinary"
                else "an added token that is not special, produced whenever its text appears")
        raise MaskTokenCollisionError(
            f"{field} is {mask}, which {where} maps to {content!r}, {what}; expected a padding "
            "row or a special token", path=drafter.label, field="mask_token_id",
            expected="an id the tokenizer never produces for ordinary text",
            found=f"{mask} = {content!r}")
    if mask in rec.probe_ids:
        raise MaskTokenCollisionError(
            f"{field} is {mask}, which {where} produces for the probe text {rec.probe_text!r}; "
            "expected an id the tokenizer never produces for ordinary text", path=drafter.label,
            field="mask_token_id", expected="not in the probe's ids", found=mask)
    checks.append(Check.passed("target.mask_token", f"{mask} is " + (
        f"the special token {content!r}" if kind == "special"
        else "a padding row: no token of the tokenizer")))

    if recorded is not None:
        diff = fingerprint_difference(recorded, rec)
        if diff is not None:
            name, want, got = diff
            raise TokenizerMismatchError(
                f"{where}: tokenizer {name} is {_shown(got)}; the drafter was converted with a "
                f"tokenizer whose {name} is {_shown(want)} (manifest.json target.tokenizer)",
                path=where, field=f"tokenizer.{name}", expected=_shown(want), found=_shown(got))
        checks.append(Check.passed("target.tokenizer_fingerprint",
                              f"tokenizer.json {_short(rec.sha256)} matches the recorded fingerprint"))
    else:
        checks.append(Check.passed("target.tokenizer_fingerprint",
                              f"tokenizer.json {_short(rec.sha256)}: {rec.vocab_size} tokens, "
                              f"{len(rec.special_tokens)} special"
                              + ("" if drafter.from_metadata else "; fingerprint recorded")))
    return checks


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_compatibility(drafter: Drafter, target: Target,
                        recorded: TokenizerRecord | None = None) -> list[Check]:
    """Geometry and tokenizer checks; no tensor byte is read."""
    return check_geometry(drafter, target) + check_tokenizer(drafter, target, recorded)


# --- identity ----------------------------------------------------------------------------------

def check_identity(drafter: Drafter, target: Target, target_tensors: list[TargetTensorRecord],
                   drafter_tensors: dict[str, tuple[str, str]], *,
                   drafter_entries: dict[str, TensorEntry] | None = None,
                   progress: Progress | None = None) -> list[Check]:
    """Compare the drafter's copies {name: (dtype, sha256)} with the target's tensors
    (``hash_target_tensors``). A copy in another dtype is compared with the target's bytes
    cast to that dtype. ``drafter_entries`` (the checkpoint's tensors) let a mismatch name
    the first row that differs. A drafter without a copy records the target's hash."""
    progress = progress or NoProgress()
    by_role = {t.role: t for t in target_tensors}
    entries = {"embedding": target.embed, "head": target.head}
    checks = []
    for name, role in DRAFTER_TENSOR_ROLES.items():
        theirs = by_role[role]
        tied = " (tied: the head is the embedding)" if role == "head" and target.head_tied else ""
        if name not in drafter_tensors and drafter.from_metadata:
            # An artifact converted without a target from a drafter without copies.
            checks.append(Check.warning(f"target.identity.{role}",
                                   f"the artifact records no {role} hash "
                                   f"({drafter.field(name)}): the runtime cannot check that it "
                                   "binds this target; convert with --target to record it"))
            continue
        if name not in drafter_tensors:
            checks.append(Check.passed(f"target.identity.{role}",
                                  f"the drafter has no {name}; the target's {theirs.name}{tied} "
                                  f"SHA-256 {_short(theirs.sha256)} is recorded for the runtime"))
            continue
        dtype, ours = drafter_tensors[name]
        want = theirs.sha256
        if dtype != theirs.dtype:
            progress.start(f"hash target {role} as {dtype}", entries[role].nbytes)
            try:
                want = tensor_sha256(entries[role], as_dtype=dtype, progress=progress)
            finally:
                progress.finish()
        if ours != want:
            row = ""
            if drafter_entries and name in drafter_entries:
                first = first_different_row(drafter_entries[name], entries[role])
                row = f"; first differing row {first}" if first is not None else ""
            cast = f" cast to {dtype}" if dtype != theirs.dtype else ""
            raise EmbeddingIdentityError(
                f"{drafter.field(name)} SHA-256 is {_short(ours)}; the target's "
                f"{theirs.name}{tied}{cast} is {_short(want)}: not this target's "
                f"{role}{row}", path=drafter.label, tensor=name, expected=want, found=ours)
        checks.append(Check.passed(f"target.identity.{role}",
                              f"{name} equals the target's {theirs.name}{tied} "
                              f"(SHA-256 {_short(want)}, {dtype})"))
    return checks


def recorded_hashes(drafter_tensors: dict[str, tuple[str, str]],
                    target_tensors: list[TargetTensorRecord] | None) -> tuple[str | None, str | None]:
    """dflash.target.embed_sha256 / lm_head_sha256: the drafter's own copies' hashes, or
    the target's where the drafter has none and a target was given."""
    by_role = {t.role: t.sha256 for t in target_tensors or []}
    out = []
    for name, role in DRAFTER_TENSOR_ROLES.items():
        out.append(drafter_tensors[name][1] if name in drafter_tensors else by_role.get(role))
    return out[0], out[1]


def target_record(target: Target, tensors: list[TargetTensorRecord],
                  checks: list[Check]) -> TargetRecord:
    return TargetRecord(
        repo=target.repo, revision=target.revision,
        path=None if target.repo is not None else shown(target.spec),
        files=list(target.files), config=target.config, tensors=tensors,
        tokenizer=target.tokenizer.record, checks=checks)


# --- a checkpoint being converted --------------------------------------------------------------

@dataclass(frozen=True)
class SourcePairing:
    """A checkpoint paired with its target before conversion: the compatibility checks
    passed and the target's embedding and head hashed. ``finish`` compares the drafter's
    copies (hashed by the converter's pass) and returns the manifest's record."""

    source: Source
    target: Target
    checks: list[Check]
    tensors: list[TargetTensorRecord]

    def target_sha256(self, drafter_name: str) -> str | None:
        """The hash dflash.target.* records for a copy the drafter does not have."""
        if drafter_name in self.source.checkpoint.tensors:
            return None
        role = DRAFTER_TENSOR_ROLES[drafter_name]
        return next(t.sha256 for t in self.tensors if t.role == role)

    def finish(self, tensor_sha256: dict[str, str], progress: Progress | None = None) -> TargetRecord:
        entries = self.source.checkpoint.tensors
        ours = {n: (entries[n].dtype, tensor_sha256[n]) for n in DRAFTER_TENSOR_ROLES if n in entries}
        weights = self.source.checkpoint.files.index or self.source.checkpoint.files.weights[0]
        drafter = Drafter(label=f"drafter {weights}", contract=self.source.contract)
        identity = check_identity(drafter, self.target, self.tensors, ours,
                                  drafter_entries=dict(entries), progress=progress)
        return target_record(self.target, self.tensors, self.checks + identity)


def pair_source(source: Source, target: Target | str | os.PathLike,
                progress: Progress | None = None) -> SourcePairing:
    """Open the target (unless given open), run the compatibility checks against the
    checkpoint's config and hash the target's embedding and head. Writes nothing."""
    if not isinstance(target, Target):
        target = open_target(target, progress=progress)
    drafter = Drafter(label=f"drafter {source.checkpoint.files.config}", contract=source.contract,
                      model_type=model_type if isinstance(model_type := source.raw_config.get(
                          "model_type"), str) else None)
    checks = check_compatibility(drafter, target)
    return SourcePairing(source=source, target=target, checks=checks,
                         tensors=hash_target_tensors(target, progress))


# --- an artifact being validated ---------------------------------------------------------------

def pair_artifact(contract: FeatureContract, kv: dict[str, object], manifest: Manifest | None,
                  target: Target | str | os.PathLike, *, label: str,
                  progress: Progress | None = None) -> list[Check]:
    """Re-run the pairing on an artifact: its contract (rebuilt from the metadata) against
    the target's config and tokenizer, the fingerprint manifest.json recorded, and the
    embedding / head hashes the metadata records (dflash.target.*) against the target's."""
    if not isinstance(target, Target):
        target = open_target(target, progress=progress)
    drafter = Drafter(label=f"artifact {label}", contract=contract, from_metadata=True)
    recorded = manifest.target.tokenizer if manifest is not None and manifest.target else None
    checks = check_compatibility(drafter, target, recorded)
    tensors = hash_target_tensors(target, progress)
    # The dtype each recorded hash was taken in: the drafter's own copy's (source.stripped),
    # else the target's, whose hash was recorded in the drafter's place.
    dtypes = {s.name: s.dtype for s in manifest.source.stripped} if manifest is not None else {}
    by_role = {t.role: t.dtype for t in tensors}
    ours = {}
    for name, role in DRAFTER_TENSOR_ROLES.items():
        value = kv.get(_METADATA_NAMES[name])
        if isinstance(value, str):
            ours[name] = (dtypes.get(name, by_role[role]), value)
    return checks + check_identity(drafter, target, tensors, ours, progress=progress)
