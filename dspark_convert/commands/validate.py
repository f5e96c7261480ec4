"""Re-check an artifact from scratch: the pre-release gate.

``validate_artifact`` never trusts what the converter did. It parses drafter.gguf with our
bounded reader, holds every metadata key to the format, rebuilds the contract from the
metadata (and re-applies the contract rules to it), checks the tensor inventory against
that contract (and a quantized artifact's types against the one type rule), recomputes
every SHA-256 and compares it with the manifest, checks every value (and every quantized
block's scale) is finite and reports what each engine makes of the file (artifact/engines.py:
Strata's loader and runtime, llama.cpp).

It returns a frozen ``ValidationReport``: one ``Check`` per step, each failure carrying the
error class (and so the exit code) of its kind. It raises nothing for a bad artifact.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from dspark_convert import CONVERTER_NAME
from gguf.constants import GGUFValueType

from dspark_convert.artifact.format import (
    ALIGNMENT,
    KEYS_BY_NAME,
    GGUF_FILE,
    LEGACY_MANIFEST_VERSIONS,
    LOCAL_REVISION,
    MANIFEST_FILE,
    Provenance,
    as_float32,
    contract_from_metadata,
    expected_metadata,
    padded,
    provenance_from_metadata,
    read_metadata,
)
from dspark_convert.contract.dspark import FeatureContract, config_dtype
from dspark_convert.contract.families import QWEN3, family_named, family_of
from dspark_convert.checks import Check
from dspark_convert.contract.inventory import check_gguf_inventory
from dspark_convert.errors import (
    ContractViolation,
    DSparkError,
    FormatVersionMismatchError,
    GGUFFormatError,
    IntegrityError,
    InvalidArtifactError,
    ManifestError,
    ManifestMismatchError,
    MetadataError,
    QuantizedTensorError,
    StrataRuleError,
)
from dspark_convert.formats.gguf_reader import GGUFFile, read_gguf
from dspark_convert.util.hashing import BLOCK, hash_file_and_spans, weights_digest
from dspark_convert.artifact.manifest import EngineName, EngineRecord, Manifest, parse_manifest
from dspark_convert.util.paths import check_path, file_kind
from dspark_convert.util.patterns import is_commit, is_sha256
from dspark_convert.util.strict_json import read_capped
from dspark_convert.util.text import shown
from dspark_convert.util.progress import NoProgress, Progress
from dspark_convert.formats.numerics import non_finite_error
from dspark_convert.artifact.engines import (
    ENGINES,
    EngineReport,
    engine_checks,
    engine_records,
    engine_verdicts,
    reports_for_gguf,
)
from dspark_convert.artifact.quantized import (
    PARENT_KEY,
    QUANTIZATION_KEY,
    QUANTIZATION_TOOL_SHAPE,
    any_quantized_type,
    check_quantized_types,
    is_head,
    is_quantization_tool,
    parent_gguf_size,
    rule_whens,
)
from dspark_convert.formats import quants


class ValidationReport(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    artifact: str
    ok: bool
    failed: int
    warnings: int
    checks: list[Check]
    engines: dict[EngineName, EngineRecord] | None = Field(
        description="strata.open, strata.run, llama.cpp: whether each accepts the artifact "
        "and, if not, its first reason (docs/ENGINES.md); null when drafter.gguf could not "
        "be parsed")
    required: list[EngineName] = Field(
        description="the engines `--require` named: a refusal of one of them is a failed "
        "check (EngineRequirementError)")
    # What the run built, for a caller that goes on with the artifact (smoke, eval): the
    # refusal behind each failed check, and the parsed drafter.gguf (validated as far as
    # the checks went), so it is never parsed twice.
    _errors: dict[str, DSparkError] = PrivateAttr(default_factory=dict)
    _gguf: GGUFFile | None = PrivateAttr(default=None)
    _gguf_sha256: str | None = PrivateAttr(default=None)
    _manifest: Manifest | None = PrivateAttr(default=None)
    _manifest_bytes: bytes | None = PrivateAttr(default=None)

    @property
    def first_failure(self) -> Check | None:
        return next((c for c in self.checks if c.status == "failed"), None)

    @property
    def gguf(self) -> GGUFFile | None:
        return self._gguf

    @property
    def manifest(self) -> tuple[Manifest, bytes] | None:
        """manifest.json as the run read and checked it: the model and its bytes (None if
        it could not be read or parsed)."""
        if self._manifest is None or self._manifest_bytes is None:
            return None
        return self._manifest, self._manifest_bytes

    @property
    def gguf_sha256(self) -> str | None:
        """drafter.gguf's SHA-256, as the run computed it (None if it did not read it)."""
        return self._gguf_sha256

    def first_error(self) -> DSparkError | None:
        """The refusal of the first failed check, as raised (its own class and exit code)."""
        failure = self.first_failure
        return None if failure is None else self._errors[failure.name]

    def raise_first_error(self, prefix: str = "", *, path: str | None = None) -> None:
        """Raise the first failed check's refusal again, its own class and exit code and
        context, its message after ``prefix`` and the check's name (the one way a command
        that goes on from a validation stops on it: smoke's pairing, the gate's stage);
        ``path`` stands in where the refusal names no file. Nothing when no check failed."""
        error = self.first_error()
        if error is None:
            return
        raise type(error)(f"{prefix}{self.first_failure.name}: {error.message}",
                          path=error.path if path is None else (error.path or path),
                          field=error.field, tensor=error.tensor, expected=error.expected,
                          found=error.found)

    def strict_message(self) -> str:
        """Why --strict fails a run whose checks all passed: every warning, by check name
        and detail (one line; what the table shows, without the table)."""
        warned = [c for c in self.checks if c.status == "warning"]
        return (f"--strict: {len(warned)} warning(s) count as failures: "
                + "; ".join(f"{shown(c.name)}: {shown(c.detail)}" for c in warned))

    def exit_code(self, *, strict: bool = False) -> int:
        failure = self.first_failure
        if failure is not None:
            return failure.exit_code or 1
        if strict and self.warnings:
            return StrataRuleError.exit_code
        return 0


class Checks:
    """The checks of one run, in order; a failure keeps its refusal for the report."""

    def __init__(self, require: Sequence[str] = ()) -> None:
        """``require``: engines (artifact/engines.ENGINES) whose refusal fails their check;
        an unknown name is a ValueError (the CLI refuses it as a usage error first)."""
        unknown = [name for name in require if name not in ENGINES]
        if unknown:
            raise ValueError(f"require: unknown engine {unknown[0]!r}; expected one of {ENGINES}")
        self.items: list[Check] = []
        self.errors: dict[str, DSparkError] = {}
        self.gguf: GGUFFile | None = None
        self.gguf_sha256: str | None = None
        self.manifest: Manifest | None = None
        self.manifest_bytes: bytes | None = None
        self.engines: dict[str, EngineReport] | None = None
        self.required: list[str] = [name for name in ENGINES if name in require]

    def passed(self, name: str, detail: str) -> None:
        self.items.append(Check.passed(name, detail))

    def warning(self, name: str, detail: str) -> None:
        self.items.append(Check.warning(name, detail))

    def info(self, name: str, detail: str) -> None:
        self.items.append(Check.info(name, detail))

    def skipped(self, name: str, detail: str) -> None:
        self.items.append(Check.skipped(name, detail))

    def failed(self, name: str, error: DSparkError) -> None:
        self.items.append(Check.failed(name, error))
        self.errors.setdefault(name, error)

    def add(self, check: Check) -> None:
        self.items.append(check)

    def report(self, root: Path) -> ValidationReport:
        failed = sum(c.status == "failed" for c in self.items)
        report = ValidationReport(artifact=str(root), ok=not failed, failed=failed,
                                  warnings=sum(c.status == "warning" for c in self.items),
                                  checks=self.items,
                                  engines=None if self.engines is None
                                  else engine_records(self.engines),
                                  required=self.required)
        report._errors.update(self.errors)
        report._gguf = self.gguf
        report._gguf_sha256 = self.gguf_sha256
        report._manifest, report._manifest_bytes = self.manifest, self.manifest_bytes
        return report


def _same_value(key: str, want: object, got: object) -> bool:
    spec = KEYS_BY_NAME.get(key)
    if spec is not None and spec.type == GGUFValueType.FLOAT32 and isinstance(want, float):
        return isinstance(got, float) and as_float32(want) == got
    return type(want) is type(got) and want == got


def _compare_metadata(kv: dict, expected: dict, label: str, error=MetadataError,
                      against: str = "the format") -> None:
    for key in expected:
        if key not in kv:
            raise error(f"{label}: metadata key '{key}' is missing (required by {against})",
                        path=label, field=key, expected=expected[key], found="missing")
    for key, got in kv.items():
        if key not in expected:
            raise error(f"{label}: metadata key '{key}' should not be present here ({against})",
                        path=label, field=key, expected="absent", found=got)
        if not _same_value(key, expected[key], got):
            raise error(f"{label}: metadata key '{key}': expected {expected[key]!r} ({against}), "
                        f"found {got!r}", path=label, field=key, expected=expected[key], found=got)


def _check_provenance_values(prov: Provenance, label: str) -> None:
    for key, value in (("dflash.source.sha256", prov.source_sha256),
                       ("dflash.target.embed_sha256", prov.embed_sha256),
                       ("dflash.target.lm_head_sha256", prov.lm_head_sha256),
                       (PARENT_KEY, prov.parent_sha256)):
        if value is not None and not is_sha256(value):
            raise MetadataError(f"{label}: metadata key '{key}': expected 64 lowercase hex digits, "
                                f"found {value!r}", path=label, field=key, expected="sha256 hex",
                                found=value)
    if prov.quantization is not None and prov.quantization not in quants.QUANT_TYPES:
        raise MetadataError(f"{label}: metadata key '{QUANTIZATION_KEY}': expected one of "
                            f"{', '.join(quants.QUANT_TYPES)} (upper case, as Strata writes it), "
                            f"found {prov.quantization!r}", path=label, field=QUANTIZATION_KEY,
                            expected="|".join(quants.QUANT_TYPES), found=prov.quantization)
    if (prov.quantization is None) != (prov.parent_sha256 is None):
        present, absent = ((QUANTIZATION_KEY, PARENT_KEY) if prov.parent_sha256 is None
                           else (PARENT_KEY, QUANTIZATION_KEY))
        raise MetadataError(f"{label}: metadata key '{absent}' is missing; a quantized artifact "
                            f"has both {QUANTIZATION_KEY} and {PARENT_KEY} ('{present}' is "
                            "present)", path=label, field=absent, expected="present",
                            found="missing")
    if prov.revision != LOCAL_REVISION and not is_commit(prov.revision):
        raise MetadataError(f"{label}: metadata key 'dflash.source.revision': expected a 40-hex "
                            f"commit or 'local', found {prov.revision!r}", path=label,
                            field="dflash.source.revision", expected="40-hex|local",
                            found=prov.revision)
    if not re.fullmatch(re.escape(CONVERTER_NAME) + r" \S+", prov.converter):
        raise MetadataError(f"{label}: metadata key 'dspark.converter': expected "
                            f"'{CONVERTER_NAME} <version>', found {prov.converter!r}", path=label,
                            field="dspark.converter", expected=f"{CONVERTER_NAME} <version>",
                            found=prov.converter)


def check_layout(gguf: GGUFFile, label: str) -> None:
    """The canonical layout gguf-py writes: tensors in table order, each at the next
    aligned offset, nothing in between."""
    if gguf.alignment != ALIGNMENT:
        raise GGUFFormatError(f"{label}: alignment is {gguf.alignment}; expected {ALIGNMENT}",
                              path=label, expected=ALIGNMENT, found=gguf.alignment)
    offset = 0
    for info in gguf.tensors:
        if info.offset != offset:
            raise GGUFFormatError(f"{label}: tensor '{info.name}' is at data offset {info.offset}; "
                                  f"expected {offset} (tensors packed in order, {ALIGNMENT}-aligned)",
                                  path=label, tensor=info.name, expected=offset, found=info.offset)
        offset += padded(info.nbytes)


@dataclass(frozen=True)
class _Scan:
    file_sha256: str
    tensor_sha256: dict[str, str]
    # The first NaN/Inf found, in file order: a BF16 value (NonFiniteTensorError) or a
    # quantized block's F16 scale (QuantizedTensorError).
    non_finite: DSparkError | None
    quantized: int = 0                          # tensors whose block scales were scanned
    # Each quantized tensor's largest and smallest non-zero |block scale|: what bounds the
    # error its manifest record may claim (_check_quantized_against_file).
    scales: dict[str, tuple[float, float]] = field(default_factory=dict)


def _bad_scale(name: str, scanner: quants.ScaleScanner, ne0: int, label: str) -> QuantizedTensorError:
    per_row = ne0 // quants.BLOCK_SIZE
    row, col = divmod(scanner.first_bad, per_row)
    first = col * quants.BLOCK_SIZE
    return QuantizedTensorError(
        f"{label}: tensor '{name}': the {scanner.name} block at row {row}, columns "
        f"{first}..{first + quants.BLOCK_SIZE - 1} (block {scanner.first_bad}) has the F16 scale "
        f"{scanner.bad_scale}; expected a finite scale in every block", path=label, tensor=name,
        expected="a finite F16 scale", found=str(scanner.bad_scale))


def scan_gguf(gguf: GGUFFile, label: str, progress=None) -> _Scan:
    """One sequential read of the file in fixed blocks: the file's SHA-256, each tensor's
    SHA-256, and the first non-finite BF16 value or quantized block scale (a block of a
    Q8_0/Q5_0/Q4_0 tensor is its F16 scale times small integers: its values are finite
    exactly when the scale is). Memory stays at one block whatever the file's size (a
    memory map would count every page read in the process's RSS)."""
    problems: list[DSparkError] = []
    infos = {info.name: info for info in gguf.tensors}
    bf16 = {name for name, info in infos.items() if info.ggml_type.name == "BF16"}
    scanners = {name: quants.ScaleScanner(info.ggml_type.name) for name, info in infos.items()
                if info.ggml_type.name in quants.QUANT_TYPES}

    def shrank():
        return GGUFFormatError(f"{label}: file shrank while validating", path=label)

    def scan(name: str, block, done: int) -> None:
        if problems:
            return
        if name in bf16:
            problem = non_finite_error(block, "BF16", done, name, label)
            if problem is not None:
                problems.append(problem)
        elif name in scanners:
            scanner = scanners[name]
            scanner.feed(block)
            if scanner.first_bad is not None:
                problems.append(_bad_scale(name, scanner, infos[name].shape[0], label))

    with open(gguf.path, "rb") as fh:
        if os.fstat(fh.fileno()).st_size != gguf.file_size:
            raise GGUFFormatError(f"{label}: file changed while validating", path=label)
        # The reader proved spans are in range and non-overlapping.
        file_sha, digests = hash_file_and_spans(
            fh, gguf.file_size, [(t.name, t.data_offset, t.nbytes) for t in gguf.tensors],
            BLOCK, progress or (lambda n: None), shrank, inspect=scan)
    return _Scan(file_sha, digests, problems[0] if problems else None, len(scanners),
                 {name: (sc.max_scale, sc.min_scale) for name, sc in scanners.items()})


def _manifest_provenance(manifest: Manifest) -> Provenance:
    stripped = {s.name: s.sha256 for s in manifest.source.stripped}
    # A drafter without its own copies records the target's hashes, when it had one.
    target = {t.role: t.sha256 for t in manifest.target.tensors} if manifest.target else {}
    # A quantized artifact names its type and its parent's drafter.gguf.
    parent = {f.path: f.sha256 for f in manifest.parent.files} if manifest.parent else {}
    return Provenance(name=manifest.source.name, repository=manifest.source.repo,
                      revision=manifest.source.revision,
                      source_sha256=manifest.source.weights_sha256,
                      embed_sha256=stripped.get("embed_tokens.weight", target.get("embedding")),
                      lm_head_sha256=stripped.get("lm_head.weight", target.get("head")),
                      # a quantized drafter.gguf keeps its parent's keys: the parent's
                      # converter, while manifest.json names the one that quantized it
                      converter=manifest.parent.converter if manifest.parent else
                      f"{manifest.converter.name} {manifest.converter.version}",
                      quantization=manifest.quantization.type if manifest.quantization else None,
                      parent_sha256=parent.get(GGUF_FILE) if manifest.quantization else None)


def _first_difference(want: object, got: object, where: str = "") -> tuple[str, object, object] | None:
    """The first path at which two JSON-like values differ, with both values there."""
    if isinstance(want, dict) and isinstance(got, dict):
        for key in list(want) + [k for k in got if k not in want]:
            inner = f"{where}.{key}" if where else str(key)
            if key not in want or key not in got:
                return inner, want.get(key), got.get(key)
            found = _first_difference(want[key], got[key], inner)
            if found:
                return found
        return None
    if isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        for i, (a, b) in enumerate(zip(want, got)):
            found = _first_difference(a, b, f"{where}[{i}]")
            if found:
                return found
        return None
    return None if want == got and type(want) is type(got) else (where, want, got)


def _check_manifest_layout(manifest: Manifest, gguf: GGUFFile, label: str) -> None:
    """What manifest.json says of the file that needs no read of its data: the size and
    the tensor list (names, types, shapes). Checked before the long read, so an artifact
    whose file is not the one recorded (a 40 GB sparse file, say) is refused at once."""
    art = manifest.artifact
    listed = [(t.name, t.type, t.shape) for t in art.tensors]
    actual = [(t.name, t.ggml_type.name, list(t.shape)) for t in gguf.tensors]
    if listed != actual:
        diff = next((i for i, (a, b) in enumerate(zip(listed, actual)) if a != b), min(len(listed), len(actual)))
        want = listed[diff] if diff < len(listed) else "nothing"
        got = actual[diff] if diff < len(actual) else "nothing"
        raise ManifestMismatchError(f"{MANIFEST_FILE}: artifact.tensors[{diff}] is {want}; "
                                    f"{label} holds {got}", path=MANIFEST_FILE,
                                    field=f"artifact.tensors[{diff}]", expected=str(got), found=str(want))
    if art.size != gguf.file_size:
        raise IntegrityError(f"{label}: size is {gguf.file_size} bytes; manifest.json records "
                             f"{art.size}", path=label, expected=art.size, found=gguf.file_size)


def _check_manifest_hashes(manifest: Manifest, digests: dict[str, str], file_sha: str,
                           label: str) -> None:
    art = manifest.artifact
    # Per-tensor digests first, so that changed bytes are reported with the tensor's name.
    for record in art.tensors:
        if digests[record.name] != record.sha256:
            raise IntegrityError(f"{label}: tensor '{record.name}' SHA-256 is {digests[record.name]}; "
                                 f"manifest.json records {record.sha256}", path=label,
                                 tensor=record.name, expected=record.sha256, found=digests[record.name])
    if art.sha256 != file_sha:
        raise IntegrityError(f"{label}: SHA-256 is {file_sha}; manifest.json records {art.sha256}",
                             path=label, expected=art.sha256, found=file_sha)


def _mismatch(field: str, found: object, expected: object, because: str) -> ManifestMismatchError:
    return ManifestMismatchError(f"{MANIFEST_FILE}: field '{field}' is {found!r}; {because} "
                                 f"{expected!r}", path=MANIFEST_FILE, field=field,
                                 expected=expected, found=found)


def _check_manifest_record(manifest: Manifest, kv: dict, engines: dict[str, EngineReport],
                           label: str) -> None:
    """Every field of manifest.json that the GGUF (through the contract its metadata
    rebuilds) can confirm, confirmed: the contract, source.config, the provenance keys,
    each tensor's source name, the stripped tensors, the source dtype, the recorded checks,
    the engine reports, a quantized artifact's parent and quantization records, the Hub
    record and the target's geometry."""
    label_cfg = f"{MANIFEST_FILE} source.config"
    try:
        family = family_of(manifest.source.config, path=label_cfg)
        source_cfg = family.parse(manifest.source.config, path=label_cfg,
                                  companion=manifest.source.companion,
                                  companion_path=f"{MANIFEST_FILE} source.companion")
        rebuilt = family.build_contract(source_cfg, path=label_cfg)
    except ContractViolation as exc:
        raise ManifestMismatchError(f"{exc.message} (the manifest's source.config no longer passes "
                                    "the conversion rules)", path=MANIFEST_FILE,
                                    field="source.config") from None
    where = _first_difference(rebuilt.model_dump(), manifest.contract.model_dump())
    if where is not None:
        field, want, got = where
        raise ManifestMismatchError(f"{MANIFEST_FILE}: field 'contract.{field}' is {got!r}; the "
                                    f"contract rebuilt from source.config has {want!r}",
                                    path=MANIFEST_FILE, field=f"contract.{field}", expected=want,
                                    found=got)
    weights = [(f.path, f.sha256) for f in manifest.source.files if f.path.endswith(".safetensors")]
    if not weights or weights_digest(weights) != manifest.source.weights_sha256:
        raise ManifestMismatchError(f"{MANIFEST_FILE}: field 'source.weights_sha256' does not match "
                                    "the weights files listed in source.files", path=MANIFEST_FILE,
                                    field="source.weights_sha256")
    # The parent and quantization records first: the two keys are confirmed from them.
    _check_quantization_record(manifest, label)
    _compare_metadata(kv, expected_metadata(manifest.contract, _manifest_provenance(manifest)),
                      label, error=ManifestMismatchError, against="manifest.json")
    contract = manifest.contract
    specs = {t.gguf_name: t for t in contract.written_tensors}
    for i, record in enumerate(manifest.artifact.tensors):
        want = specs[record.name].source_name
        if record.source != want:
            raise _mismatch(f"artifact.tensors[{i}].source", record.source, want,
                            f"the contract maps {record.name} from")
    _check_source_dtype(manifest, source_cfg, label_cfg, family)
    for i, stripped in enumerate(manifest.source.stripped):
        spec = contract.tensor(stripped.name)
        if spec is None or spec.gguf_name is not None:
            raise _mismatch(f"source.stripped[{i}].name", stripped.name,
                            [t.source_name for t in contract.tensors if t.gguf_name is None],
                            "the contract strips only")
        if stripped.shape != spec.shape:
            raise _mismatch(f"source.stripped[{i}].shape", stripped.shape, spec.shape,
                            "the contract's shape is")
        if stripped.dtype != manifest.source.dtype:
            raise _mismatch(f"source.stripped[{i}].dtype", stripped.dtype, manifest.source.dtype,
                            "every source tensor has source.dtype")
    for where_, checks in (("checks", manifest.checks),
                           ("target.checks", manifest.target.checks if manifest.target else [])):
        for i, check in enumerate(checks):
            if check.status == "failed":
                raise _mismatch(f"{where_}[{i}].status", "failed", "passed",
                                f"an artifact is written only when {check.name} has")
    _check_engine_record(manifest, engines, label)
    _check_hub_record(manifest)
    if manifest.target is not None:
        _check_target_geometry(manifest)


def _check_engine_record(manifest: Manifest, engines: dict[str, EngineReport],
                         label: str) -> None:
    """The engine checks and reports convert (or quantize) recorded, against the ones the
    file gives now (artifact/engines.py: the same rules on the same metadata and tensors)."""
    recorded = {c.name: c for c in manifest.checks if c.name.startswith("engine.")}
    for record in engine_checks(engines, label=label):
        got = recorded.get(record.name)
        if got is None or (got.status, got.detail) != (record.status, record.detail):
            raise _mismatch(f"checks[{record.name}]", None if got is None else got.status,
                            record.status, f"the engines' rules applied to {label} give")
    now = engine_records(engines)
    for engine in ENGINES:
        got = manifest.engines.get(engine)
        got = None if got is None else got.model_dump()
        if got != now[engine]:
            raise _mismatch(f"engines.{engine}", got, now[engine],
                            f"the engines' rules applied to {label} give")
    if list(manifest.engines) != list(ENGINES):
        raise _mismatch("engines", list(manifest.engines), list(ENGINES), "the engines are")


def _check_quantization_record(manifest: Manifest, label: str) -> None:
    """A quantized artifact's own records: ``parent`` and ``quantization`` together, the
    parent's two files, an error for every quantized tensor and none for a BF16 one, the
    head matrices in the recorded heads type. (The type and the parent's SHA-256 are
    confirmed against the two keys with the rest of the metadata.)"""
    quantized, parent = manifest.quantization, manifest.parent
    if (quantized is None) != (parent is None):
        field, other = ("parent", "quantization") if parent is None else ("quantization", "parent")
        raise _mismatch(field, None, "a record", f"manifest.json has '{other}'; a quantized "
                        "artifact records both its parent and its quantization: expected")
    if quantized is None:
        for i, record in enumerate(manifest.artifact.tensors):
            if record.error is not None:
                raise _mismatch(f"artifact.tensors[{i}].error", "a record", None,
                                "a BF16 artifact records no quantization error: expected")
        return
    paths = [f.path for f in parent.files]
    if paths != [GGUF_FILE, MANIFEST_FILE]:
        raise _mismatch("parent.files", paths, [GGUF_FILE, MANIFEST_FILE],
                        "the parent record names its")
    whens = rule_whens(manifest.contract)
    for i, record in enumerate(manifest.artifact.tensors):
        if (record.error is None) != (record.type == "BF16"):
            raise _mismatch(f"artifact.tensors[{i}].error",
                            None if record.error is None else "a record",
                            "a record" if record.error is None else None,
                            f"a {record.type} tensor records its error against the BF16 "
                            "values exactly when it is quantized: expected")
        if is_head(whens[record.name]) and len(record.shape) == 2 \
                and record.type != (quantized.heads or "BF16"):
            raise _mismatch("quantization.heads", quantized.heads, record.type,
                            f"the head matrix {record.name} is")
    if quantized.heads is not None and not any(is_head(whens[r.name]) and len(r.shape) == 2
                                               for r in manifest.artifact.tensors):
        raise _mismatch("quantization.heads", quantized.heads, None,
                        "the drafter has no Markov or confidence matrices: expected")


def _check_quantized_against_file(manifest: Manifest, gguf: GGUFFile, scan: _Scan,
                                  label: str) -> None:
    """What a quantized artifact's manifest says of things validate cannot read (the parent,
    the quantizer), confirmed as far as the file decides it:

    - ``quantization.tool`` is the one quantize writes (artifact/quantized.py);
    - ``parent.files``' drafter.gguf size is the size of the BF16 file whose keys and
      tensors this one holds (every key but the two quantize appends, every tensor in BF16,
      in the canonical layout; its SHA-256 is confirmed with the metadata key);
    - each tensor's ``error`` is possible for its blocks: max_abs within what the largest
      block scale in the file allows, rel_rms within the type's bound (and 0 when max_abs
      is: no error has a relative RMS)."""
    quantized, parent = manifest.quantization, manifest.parent
    if quantized is None or parent is None:
        return
    if not is_quantization_tool(quantized.tool):
        raise _mismatch("quantization.tool", quantized.tool, QUANTIZATION_TOOL_SHAPE,
                        "dspark quantize records the quantizer as")
    parent_size = parent_gguf_size(gguf)
    record = next(f for f in parent.files if f.path == GGUF_FILE)   # the record check named it
    if record.size != parent_size:
        raise _mismatch(f"parent.files[{GGUF_FILE}].size", record.size, parent_size,
                        f"the BF16 file {label} was quantized from (its keys and tensors in "
                        "BF16) is, in bytes,")
    for i, t in enumerate(manifest.artifact.tensors):
        if t.error is None or t.name not in scan.scales:
            continue
        max_scale, min_scale = scan.scales[t.name]
        bound = quants.max_abs_error_bound(t.type, max_scale)
        where = f"artifact.tensors[{i}].error"
        if t.error.max_abs > bound:
            raise _mismatch(f"{where}.max_abs", t.error.max_abs, f"<= {bound:.6g}",
                            f"the {t.type} blocks of {t.name} (largest scale {max_scale:.6g}) "
                            "allow an error of at most; expected")
        if min_scale >= quants.F16_MIN_NORMAL and \
                t.error.rel_rms > quants.rel_rms_error_bound(t.type):
            raise _mismatch(f"{where}.rel_rms", t.error.rel_rms,
                            f"<= {quants.rel_rms_error_bound(t.type):.6g}",
                            f"a {t.type} tensor's relative RMS error is at most; expected")
        if t.error.max_abs == 0 and t.error.rel_rms != 0:
            raise _mismatch(f"{where}.rel_rms", t.error.rel_rms, 0,
                            "max_abs is 0, so the relative RMS error is")


def _check_source_dtype(manifest: Manifest, cfg, label_cfg: str, family=QWEN3) -> None:
    src = manifest.source
    if src.rounded_to_bf16 != (src.dtype != "BF16"):
        raise _mismatch("source.rounded_to_bf16", src.rounded_to_bf16, src.dtype != "BF16",
                        f"a {src.dtype} source is rounded to BF16 exactly when it is not BF16:")
    declared = family.config_dtype(cfg, path=label_cfg)
    if declared is not None and declared != src.dtype:
        raise _mismatch("source.dtype", src.dtype, declared, "source.config declares the dtype")


def _check_hub_record(manifest: Manifest) -> None:
    src, hub = manifest.source, manifest.source.hub
    if hub is None:
        if src.repo is not None:
            raise _mismatch("source.hub", None, "a Hub record", f"a source from {src.repo} has")
        return
    for field, got, want in (("source.hub.repo", hub.repo, src.repo),
                             ("source.hub.commit", hub.commit, src.revision)):
        if got != want:
            raise _mismatch(field, got, want, "source says")
    by_path = {f.path: f for f in hub.files}
    for i, f in enumerate(src.files):
        verified = by_path.get(f.path)
        if verified is None or (verified.size, verified.sha256) != (f.size, f.sha256):
            raise _mismatch(f"source.files[{i}]", f.path, "the same size and SHA-256",
                            "source.hub.files records")


def _target_tensor_roles(manifest: Manifest, shape: list[int], why: str) -> dict:
    """The target record's tensors by role: exactly an embedding and a head, each of
    ``shape`` (``why`` says where that shape comes from)."""
    roles = {t.role: t for t in manifest.target.tensors}
    if set(roles) != {"embedding", "head"}:
        raise _mismatch("target.tensors", sorted(roles), ["embedding", "head"], "a target records")
    for role, t in roles.items():
        if t.shape != shape:
            raise _mismatch(f"target.tensors[{role}].shape", t.shape, shape, why)
    return roles


def _check_kind_target_geometry(manifest: Manifest) -> None:
    """A DFlash2 or assistant artifact's target record against its contract: the hidden
    size (an assistant's backbone_hidden_size) and vocabulary the pairing checked equal, the
    embedding (and head) recorded of [vocab_size, that hidden size]."""
    cfg, c = manifest.target.config, manifest.contract
    g = c.geometry
    hidden = getattr(g, "backbone_hidden_size", g.hidden_size)
    for field, got, want in (("hidden_size", cfg.hidden_size, hidden),
                             ("vocab_size", cfg.vocab_size, g.vocab_size)):
        if got != want:
            raise _mismatch(f"target.config.{field}", got, want,
                            "the pairing checked it equal to the contract's")
    _target_tensor_roles(manifest, [g.vocab_size, hidden],
                         "the contract's [vocab_size, the target's hidden size] is")


def _check_target_geometry(manifest: Manifest) -> None:
    """The target's config record against the contract: the pairing checked them equal."""
    from dspark_convert.target.model import target_reader

    if family_named(manifest.contract.family).kind != "dspark":
        _check_kind_target_geometry(manifest)
        return
    cfg, g, taps = manifest.target.config, manifest.contract.geometry, manifest.contract.taps
    # The record's rope_theta / rms_norm_eps are what the drafter copied, as its family's
    # target reader names them (a Gemma4 contract's theta is its full-attention RoPE's).
    inherited = {key: want for key, _t, _d, want in
                 target_reader(family_named(manifest.contract.family)).inherited(manifest.contract)}
    for field, got, want in (("hidden_size", cfg.hidden_size, g.hidden_size),
                             ("vocab_size", cfg.vocab_size, g.vocab_size),
                             ("num_hidden_layers", cfg.num_hidden_layers, taps.num_target_layers),
                             ("rope_theta", cfg.rope_theta, inherited["rope_theta"]),
                             ("rms_norm_eps", cfg.rms_norm_eps, inherited["rms_norm_eps"])):
        if got != want:
            raise _mismatch(f"target.config.{field}", got, want,
                            "the pairing checked it equal to the contract's")
    roles = _target_tensor_roles(manifest, [g.vocab_size, g.hidden_size],
                                 "the contract's [vocab_size, hidden_size] is")
    if cfg.tie_word_embeddings and roles["head"] != roles["embedding"].model_copy(update={"role": "head"}):
        raise _mismatch("target.tensors[head]", roles["head"].name, roles["embedding"].name,
                        "a tied head is the embedding:")


def check_metadata(checks: Checks, gguf: GGUFFile, label: str,
                   entries: dict | None = None) -> tuple[dict | None, FeatureContract | None]:
    """``gguf.metadata``: every key of its type, the contract rebuilt from the metadata with
    the conversion rules, every value what the contract and provenance imply; (values,
    contract), the contract None on a failure. ``entries``: read_metadata's."""
    kv = None
    try:
        kv = read_metadata(gguf, path=label, entries=entries)
        contract = contract_from_metadata(kv, path=label)
        prov = provenance_from_metadata(kv, path=label)
        _check_provenance_values(prov, label)
        _compare_metadata(kv, expected_metadata(contract, prov), label)
        checks.passed("gguf.metadata", f"{len(kv)} keys of the right types; the contract rebuilt "
                      "from them follows the format's rules")
        return kv, contract
    except DSparkError as exc:
        checks.failed("gguf.metadata", exc)
        return kv, None


def check_tensors(checks: Checks, gguf: GGUFFile, kv: dict | None,
                  contract: FeatureContract | None, label: str) -> bool:
    """``gguf.inventory`` against the rebuilt contract, and a quantized file's
    ``gguf.quantization``: whether the tensors are the contract's (the long read is not
    moot)."""
    qtype = kv.get(QUANTIZATION_KEY) if kv is not None and contract is not None else None
    structural = contract is not None
    if contract is not None:
        try:
            # A quantized artifact's tensors may hold any of the four types here; which one
            # each must hold is gguf.quantization's rule (its own error class, 48).
            check_gguf_inventory(gguf, contract, label, type_ok=any_quantized_type(qtype))
            checks.passed("gguf.inventory", f"{len(gguf.tensors)} tensors match the contract: "
                          "names, order, " + ("BF16, " if qtype is None else "") + "shapes")
        except DSparkError as exc:
            checks.failed("gguf.inventory", exc)
            structural = False
    else:
        checks.skipped("gguf.inventory", "no valid contract in the metadata")
    if qtype is not None:
        if not structural:
            checks.skipped("gguf.quantization", "needs the tensors to match the contract")
        else:
            try:
                checks.passed("gguf.quantization", check_quantized_types(gguf.tensors, contract, qtype,
                                                                         label))
            except DSparkError as exc:
                checks.failed("gguf.quantization", exc)
                structural = False
    return structural


def check_values(checks: Checks, gguf: GGUFFile, label: str, progress: Progress) -> _Scan | None:
    """``gguf.values``: one read of the file, every BF16 value and quantized block scale
    finite; the scan (hashes included), None when the file could not be read."""
    try:
        progress.start(f"validate {label}", gguf.file_size)
        try:
            scan = scan_gguf(gguf, label, progress.advance)
        finally:
            progress.finish()
        checks.gguf_sha256 = scan.file_sha256
        # The types scanned: BF16 and the block types (an artifact holds no other; a bare
        # file of another tool's layout may, e.g. llama.cpp's F32 norms, not read here).
        read = sum(t.ggml_type.name == "BF16" or t.ggml_type.name in quants.QUANT_TYPES
                   for t in gguf.tensors)
        if scan.non_finite is not None:
            checks.failed("gguf.values", scan.non_finite)
        else:
            scales = (f"; every block scale of the {scan.quantized} quantized ones finite"
                      if scan.quantized else "")
            rest = (f" ({len(gguf.tensors) - read} tensors of other types not read)"
                    if read < len(gguf.tensors) else "")
            checks.passed("gguf.values", f"every value of {read} tensors is "
                          f"finite{scales}{rest}")
        return scan
    except DSparkError as exc:
        checks.failed("gguf.values", exc)
    except OSError as exc:
        checks.failed("gguf.values", GGUFFormatError(f"{label}: cannot read: {exc}", path=label))
    return None


def _check_format_version(checks: Checks, manifest: Manifest, kv: dict, label: str) -> None:
    """manifest.json's format_version against drafter.gguf's dspark.format_version (the
    metadata check passed, so the file's version is its family's). The one legacy case is
    a warning (docs/ARTIFACT_FORMAT.md, "Format versions"): a manifest of the version
    LEGACY_MANIFEST_VERSIONS names for its family, written before the manifest carried the
    family's version; the file and the hashes are what they were, only the record is old."""
    name, family = "manifest.format_version", kv.get("dspark.family", QWEN3.name)
    want, got = kv["dspark.format_version"], manifest.format_version
    if got == want:
        checks.passed(name, f"{MANIFEST_FILE} and {GGUF_FILE} are format version {want}")
    elif LEGACY_MANIFEST_VERSIONS.get(family) == got and manifest.contract.family == family:
        checks.warning(name, f"{MANIFEST_FILE}: format_version {got} on a {family} artifact "
                       f"whose {GGUF_FILE} is format version {want}: a manifest written before "
                       f"it carried its family's version (read as version {want}); `dspark "
                       "convert` the checkpoint again to write it")
    else:
        checks.failed(name, FormatVersionMismatchError(
            f"{MANIFEST_FILE}: field 'format_version' is {got}; {GGUF_FILE}'s "
            f"dspark.format_version is {want} (a {family} artifact is format version {want})",
            path=MANIFEST_FILE, field="format_version", expected=want, found=got))


def _not_a_file(path: Path) -> str:
    """Why ``path`` is not the regular file an artifact holds: missing, a link, a FIFO ..."""
    try:
        st = os.lstat(path)
    except OSError:
        return "is missing"
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link, not a regular file"
    return f"is {file_kind(st.st_mode)}, not a regular file"


def validate_artifact(path: str | os.PathLike, *, progress: Progress | None = None,
                      target: str | os.PathLike | None = None,
                      require: Sequence[str] = ()) -> ValidationReport:
    """Every check, in order; ``progress`` is told of the one long read. With ``target``
    (a model directory, or an open ``target.Target``), the pairing checks are re-run
    against it (pairing.py: geometry, tokenizer and the recorded fingerprint, identity).
    ``require`` names engines (artifact/engines.ENGINES) whose refusal fails their
    ``engine.*`` check with EngineRequirementError (``validate --require``); an unknown
    name is a ValueError (the CLI refuses it as a usage error first).
    The long read (every byte hashed and checked finite) happens only once the structure,
    the metadata, the inventory and the size recorded in the manifest agree: an earlier
    failure makes it moot, and the file may be anything (a 40 GB sparse file)."""
    progress = progress or NoProgress()
    root = Path(path)
    checks = Checks(require)
    try:
        check_path(root, what="the artifact", error=InvalidArtifactError)
    except InvalidArtifactError as exc:
        checks.failed("artifact.files", exc)
        return checks.report(Path(shown(os.fspath(root))))

    # 1. the files
    gguf_path, manifest_path = root / GGUF_FILE, root / MANIFEST_FILE
    if not root.is_dir():
        what = "no such directory" if not root.exists() else "a file"
        hint = (f" (`dspark validate {shown(root)}` checks a GGUF file alone)"
                if root.exists() and root.name.lower().endswith(".gguf") else "")
        checks.failed("artifact.files", InvalidArtifactError(
            f"{root}: not an artifact directory ({what}); expected a directory holding "
            f"{GGUF_FILE} and {MANIFEST_FILE}, as `dspark convert` writes it{hint}",
            path=str(root)))
        return checks.report(root)
    missing = [p.name for p in (gguf_path, manifest_path) if not p.is_file() or p.is_symlink()]
    if missing:
        # A checkpoint or a target model given where an artifact is expected: say so.
        hint = (f": {root} holds config.json, a checkpoint or model directory (`dspark "
                "convert` makes an artifact of a drafter checkpoint)"
                if (root / "config.json").is_file() and not gguf_path.exists()
                and not manifest_path.exists() else "")
        checks.failed("artifact.files", InvalidArtifactError(
            f"{root}: {missing[0]} {_not_a_file(root / missing[0])}; expected {GGUF_FILE} "
            f"and {MANIFEST_FILE}{hint}", path=str(root / missing[0])))
        return checks.report(root)
    extra = sorted(shown(p.name) for p in root.iterdir() if p.name not in (GGUF_FILE, MANIFEST_FILE))
    if extra:
        checks.warning("artifact.files", f"unexpected file(s) in the artifact: {', '.join(extra)}")
    else:
        checks.passed("artifact.files", f"{GGUF_FILE} and {MANIFEST_FILE}")

    # 2. the manifest against its schema
    manifest = None
    try:
        # Read once: what is checked is what a caller goes on with (quantize copies it and
        # records its bytes' SHA-256; a second read could see another file).
        checks.manifest_bytes = read_capped(manifest_path, error=ManifestError,
                                            label=MANIFEST_FILE)
        manifest = checks.manifest = parse_manifest(checks.manifest_bytes, manifest_path)
        checks.passed("manifest.schema", "manifest.json follows schemas/manifest.schema.json")
    except DSparkError as exc:
        checks.failed("manifest.schema", exc)

    # 3. the GGUF structure, within bounds
    label = GGUF_FILE
    try:
        gguf = read_gguf(gguf_path)
        checks.gguf = gguf
        check_layout(gguf, label)
        checks.passed("gguf.structure", f"GGUF v{gguf.version}, {len(gguf.kv)} keys, "
                      f"{len(gguf.tensors)} tensors, offsets aligned, in range, non-overlapping")
    except DSparkError as exc:
        checks.failed("gguf.structure", exc)
        return checks.report(root)
    # What each engine makes of the file. Engines are laxer than the format about types
    # (Strata takes any integer type for a count), so their rules read the raw values and
    # types, even when the metadata check below fails: they must then take any value of any
    # type without raising (tests/test_engines.py).
    checks.engines = reports_for_gguf(gguf, path=label)

    # 4. metadata: types, the rebuilt contract, the contract rules, values
    kv, contract = check_metadata(checks, gguf, label)

    # 4b. one format version: the manifest's is the one drafter.gguf holds
    if manifest is not None and contract is not None:
        _check_format_version(checks, manifest, kv, label)

    # 5. the tensor inventory against the rebuilt contract; a quantized artifact's types
    structural = check_tensors(checks, gguf, kv, contract, label)

    # 6. the manifest's size and tensor list, before the long read
    layout_ok = manifest is not None
    if manifest is not None:
        try:
            _check_manifest_layout(manifest, gguf, label)
        except DSparkError as exc:
            checks.failed("integrity", exc)
            layout_ok = structural = False

    # 7. values and hashes, in one read of the file
    scan = check_values(checks, gguf, label, progress) if structural else None
    if not structural:
        checks.skipped("gguf.values", "an earlier failure makes reading the tensor data moot")

    # 8. integrity and agreement with the manifest
    if layout_ok and scan is not None:
        try:
            _check_manifest_hashes(manifest, scan.tensor_sha256, scan.file_sha256, label)
            _check_manifest_record(manifest, kv, checks.engines, label)
            _check_quantized_against_file(manifest, gguf, scan, label)
            checks.passed("integrity", f"file and {len(scan.tensor_sha256)} tensor SHA-256 match "
                          "manifest.json; every manifest field the GGUF can confirm agrees")
        except DSparkError as exc:
            checks.failed("integrity", exc)
    elif not any(c.name == "integrity" for c in checks.items):
        checks.skipped("integrity", "needs a valid manifest and readable tensors")

    # 9. the engines, by stage (artifact/engines.py; derived after the structure check)
    for record, error in engine_verdicts(checks.engines, require=checks.required, label=label):
        if error is not None:
            checks.failed(record.name, error)
        else:
            checks.add(record)

    # 10. the target, when one is given
    if target is not None:
        check_target(checks, target, contract, kv, manifest, label, progress)
    return checks.report(root)


def validated_input(path: Path, *, what: str, error: type[DSparkError], expected: str,
                    progress: Progress | None = None) -> ValidationReport:
    """The report of an artifact a command goes on from (export's artifact, quantize's
    parent), refused as ``error`` unless it passes every check; ``what`` names it in the
    line ("the artifact"), ``expected`` is the refusal's expected field."""
    report = validate_artifact(path, progress=progress)
    failure = report.first_failure
    if failure is not None:
        raise error(
            f"{path}: {what} does not validate: {failure.name}: {failure.detail}; "
            "expected an artifact that passes `dspark validate`", path=str(path),
            expected=expected, found=f"{failure.name} failed ({failure.error})")
    return report


def check_target(checks: Checks, target, contract: FeatureContract | None, kv: dict | None,
                  manifest: Manifest | None, label: str, progress: Progress) -> None:
    from dspark_convert.target.pairing import pair_artifact, target_record
    from dspark_convert.target.model import Target, hash_target_tensors, open_target

    if contract is None:
        checks.skipped("target", "needs a valid contract in the metadata")
        return
    try:
        opened = target if isinstance(target, Target) else open_target(target, progress=progress)
        records = pair_artifact(contract, kv, manifest, opened, label=label, progress=progress)
        if manifest is not None and manifest.target is not None:
            _compare_target_record(manifest, target_record(opened, hash_target_tensors(opened),
                                                           []))
    except DSparkError as exc:
        checks.failed("target", exc)
        return
    for record in records:
        checks.add(record)


def _compare_target_record(manifest: Manifest, actual) -> None:
    """manifest.json's target record against the target given now: its config, tensors and
    small files must be the ones recorded (the identity and tokenizer checks compare the
    hashes the GGUF holds; this confirms the rest of the record)."""
    recorded = manifest.target.model_dump(exclude={"checks", "repo", "revision", "path"})
    now = actual.model_dump(exclude={"checks", "repo", "revision", "path"})
    where = _first_difference(now, recorded)
    if where is not None:
        field, want, got = where
        raise ManifestMismatchError(f"{MANIFEST_FILE}: field 'target.{field}' is {got!r}; the "
                                    f"target given now has {want!r}", path=MANIFEST_FILE,
                                    field=f"target.{field}", expected=want, found=got)
