"""The target model a drafter is paired with, read as little as possible.

``open_target`` reads a target's ``config.json`` strictly, through the reader of the family
its model_type names (contract/families.py: target/qwen3.py, target/gemma4.py, whose text
model sits in a nested text_config), the safetensors HEADERS of its
weights (single file or sharded with an index; ``safetensors_reader``), and its
``tokenizer.json`` (``tokenizer_fingerprint``). It never loads the model: the only tensor
bytes ever read are those of the embedding and the head, one tensor at a time, streamed
through SHA-256 by ``hash_target_tensors``. A tied head (``tie_word_embeddings``) is the
embedding; the record says so.

A Hub spec ``org/name@<40-hex commit>`` is resolved to a local snapshot directory by
``resolve_hub``, by default ``hub_resolver()``: ``hub.fetch_snapshot`` downloads (or finds
in the HF cache) config.json, tokenizer.json and the safetensors files, pinned to the
commit and verified like a drafter's (the SHA-256 of every file against the Hub's
metadata). Without the Hub there is no range read, so the weights files are downloaded
whole; the pairing still parses only their headers and the two tensors it hashes.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dspark_convert.contract.families import FAMILIES, QWEN3, Family, target_family_of
from dspark_convert.contract.qwen3 import ConfigErrors, Qwen3Config
from dspark_convert.errors import (
    TargetFamilyError,
    SafetensorsFormatError,
    SourceError,
    SourceNotFoundError,
    TargetFormatError,
    TargetNotFoundError,
)
from dspark_convert.util.hashing import BLOCK, read_blocks, read_full, sha256_file, weights_digest
from dspark_convert.artifact.manifest import FileRecord, TargetConfigRecord, TargetTensorRecord
from dspark_convert.formats.numerics import RAW_DTYPES, round_to_bf16
from dspark_convert.util.paths import check_path
from dspark_convert.util.patterns import is_repo_id, split_hub_spec
from dspark_convert.util.progress import NoProgress, Progress
from dspark_convert.formats.safetensors import (
    Checkpoint,
    TensorEntry,
    _allowed_roots,
    _check_openable,
    read_checkpoint,
)
from dspark_convert.util.strict_json import parse_json_strict, read_capped
from dspark_convert.target.tokenizer import (
    TOKENIZER_FILE,
    TokenizerFingerprint,
    fingerprint_tokenizer,
)

LOCAL_REVISION = "local"
# A Qwen3 target's embedding and (untied) head; another family's embedding is under its
# reader's weights prefix (TargetConfig.weights_prefix), its untied head is lm_head.weight.
EMBED_NAME = "model.embed_tokens.weight"
HEAD_NAME = "lm_head.weight"
TENSOR_DTYPES = ("BF16", "F16", "F32")
# What a Qwen3 drafter's target must be (the drafter config is a copy of the target's).
TARGET_MODEL_TYPE = "qwen3"

# A layer's tensors: <weights prefix>layers.<id>. (the prefix is the family reader's).
_LAYER_NAME = r"^{prefix}layers\.(\d+)\."
# A layer index longer than this is out of any range without converting it (int() refuses
# more than 4300 digits, and a tensor name may be megabytes long).
_MAX_LAYER_DIGITS = 18

# (repo, revision) -> (local snapshot directory, resolved 40-hex commit)
HubResolver = Callable[[str, str], tuple[Path, str]]
# What a Hub target's snapshot holds: never pickle files, never more than the pairing reads.
TARGET_HUB_PATTERNS = ("config.json", "tokenizer.json", "*.safetensors",
                       "model.safetensors.index.json")


def hub_resolver(*, progress: Progress | None = None, **options) -> HubResolver:
    """A ``resolve_hub`` that fetches the target with ``hub.fetch_snapshot`` (``options``:
    its keyword arguments, e.g. ``endpoint``, ``cache_dir``, ``resolve``); a refusal there
    raises its Hub error (exit codes 50-59)."""
    def resolve(repo: str, revision: str) -> tuple[Path, str]:
        from dspark_convert.source.hub.snapshot import fetch_snapshot

        # A target is pinned by commit in every command (none offers --resolve for it).
        snap = fetch_snapshot(f"{repo}@{revision}", allow_patterns=TARGET_HUB_PATTERNS,
                              required=("config.json", TOKENIZER_FILE), progress=progress,
                              **{"resolve": None, **options})
        return snap.directory, snap.commit
    return resolve


# A target's config problems: the target's format (61), whatever the kind.
TARGET_ERRORS = ConfigErrors(malformed=TargetFormatError, unsupported=TargetFormatError,
                             limit=TargetFormatError)


@dataclass(frozen=True)
class TargetConfig:
    """What a family's target reader (target/qwen3.py, target/gemma4.py; contract/families.py
    names it) makes of config.json."""

    record: TargetConfigRecord      # what the pairing compares, as the manifest records it
    model: object                   # the family's parsed config (Qwen3Config, ...)
    field_prefix: str               # where the text model's fields are: "" or "text_config."
    weights_prefix: str             # where its tensors are: "model." or "model.language_model."
    context_length: int
    # What the drafter copied from the target and computes with, by the reader's keys.
    values: dict[str, object]

    def field(self, name: str) -> str:
        return self.field_prefix + name


def target_reader(family: Family):
    """The module that reads ``family``'s targets (its row's target_reader)."""
    return importlib.import_module(family.target_reader)


@dataclass(frozen=True)
class Target:
    spec: str                       # as the user gave it
    directory: Path                 # the local directory (a Hub snapshot for a Hub spec)
    repo: str | None
    revision: str                   # 40-hex commit, or "local"
    raw_config: dict
    family: Family                  # the family whose targets have its model_type
    read: TargetConfig              # config.json as the family's reader read it
    qwen3: Qwen3Config | None       # a Qwen3 target's config.json (None for another family)
    config: TargetConfigRecord      # what the pairing compares, as the manifest records it
    checkpoint: Checkpoint          # headers only
    embed: TensorEntry
    head: TensorEntry               # the embedding itself when tied
    tokenizer: TokenizerFingerprint
    files: tuple[FileRecord, ...]   # config.json and tokenizer.json, hashed
    # The embedding's and head's hashes, once read (hash_target_tensors): one read of those
    # bytes per run, however many artifacts are paired with this target.
    _tensor_hashes: list = field(default_factory=list, repr=False, compare=False)

    @property
    def head_tied(self) -> bool:
        return self.config.tie_word_embeddings

    @property
    def label(self) -> str:
        return f"target {self.spec}"


def parse_hub_spec(spec: str) -> tuple[str, str] | None:
    """(repo, revision) of ``org/name@revision``, or None if ``spec`` is not one."""
    return split_hub_spec(spec)


def open_target(spec: str | os.PathLike, *, resolve_hub: HubResolver | None = None,
                progress: Progress | None = None) -> Target:
    """Open a target: a local Hugging Face model directory, or ``org/name@revision``
    resolved by ``resolve_hub`` (default: ``hub_resolver``). Reads config.json, the
    weights' headers and tokenizer.json; no tensor byte."""
    text = str(spec)
    directory, repo, revision = Path(text), None, LOCAL_REVISION
    check_path(text, what="the target", error=TargetNotFoundError)
    if not directory.exists():
        hub = parse_hub_spec(text)
        if hub is None:
            pinned = (f"{text.rstrip('/')}@<40-hex commit>" if is_repo_id(text.rstrip("/"))
                      else "org/name@<40-hex commit>")
            raise TargetNotFoundError(f"target {text}: no such directory; expected a local model "
                                      f"directory or a pinned Hub repo, {pinned}",
                                      path=text,
                                      expected="a target directory", found="nothing")
        resolve_hub = resolve_hub or hub_resolver(progress=progress)
        repo = hub[0]
        directory, revision = resolve_hub(*hub)
    if not directory.is_dir():
        raise TargetNotFoundError(f"target {text}: not a directory; expected a model directory "
                                  "(config.json, tokenizer.json, safetensors weights)", path=text,
                                  expected="a directory", found="a file")
    if not (directory / "config.json").exists() and (directory / "drafter.gguf").exists():
        raise TargetNotFoundError(
            f"target {text}: an artifact (drafter.gguf, manifest.json), not a target; expected "
            "the target model's directory (config.json, tokenizer.json, safetensors weights)",
            path=text, expected="a target directory", found="an artifact")
    try:
        checkpoint = read_checkpoint(directory)
    except SourceError as exc:
        cls = TargetNotFoundError if isinstance(exc, SourceNotFoundError) else TargetFormatError
        raise cls(f"target {exc.message}", path=exc.path, field=exc.field, tensor=exc.tensor,
                  expected=exc.expected, found=exc.found) from None

    config_path = checkpoint.files.config
    # Read once: parsed here and hashed into the target record below.
    config_bytes = read_capped(config_path, error=TargetFormatError, label=f"target {config_path}")
    raw = parse_json_strict(config_bytes, error=TargetFormatError, label=f"target {config_path}",
                            path=str(config_path))
    family = _family(raw, f"target {config_path}")
    read = target_reader(family).read_config(raw, f"target {config_path}")
    config = read.record

    tokenizer_path = directory / TOKENIZER_FILE
    tok_label = f"target {tokenizer_path}"
    if not tokenizer_path.exists() and not tokenizer_path.is_symlink():
        drafter = _drafter_architecture(raw)
        if drafter is not None:
            raise TargetNotFoundError(
                f"target {text}: a drafter checkpoint ({drafter}), not a target; expected the "
                "target model the drafter drafts for (config.json, tokenizer.json, safetensors "
                "weights)", path=str(tokenizer_path), expected=TOKENIZER_FILE, found="nothing")
        raise TargetNotFoundError(f"{tok_label}: not found; the pairing needs the target's "
                                  "tokenizer", path=str(tokenizer_path), expected=TOKENIZER_FILE,
                                  found="nothing")
    try:
        _check_openable(tokenizer_path, _allowed_roots(directory))
    except SourceError as exc:
        raise TargetFormatError(f"target {exc.message}", path=exc.path, expected=exc.expected,
                                found=exc.found) from None
    tokenizer = fingerprint_tokenizer(tokenizer_path, label=tok_label)

    weights_label = f"target {checkpoint.files.index or checkpoint.files.weights[0]}"
    _check_layers(checkpoint, read, weights_label, f"target {config_path}")
    embed = _tensor(checkpoint, read.weights_prefix + "embed_tokens.weight", config, weights_label)
    head = embed if config.tie_word_embeddings else _tensor(checkpoint, HEAD_NAME, config,
                                                            weights_label, tied_hint=True)
    # tokenizer.json as fingerprinted: the same bytes, not a second (unbounded) read.
    files = (FileRecord(path=config_path.name, size=len(config_bytes),
                        sha256=hashlib.sha256(config_bytes).hexdigest()),
             FileRecord(path=tokenizer_path.name, size=tokenizer.record.size,
                        sha256=tokenizer.record.sha256))
    return Target(spec=text, directory=directory, repo=repo, revision=revision, raw_config=raw,
                  family=family, read=read,
                  qwen3=read.model if isinstance(read.model, Qwen3Config) else None,
                  config=config, checkpoint=checkpoint, embed=embed, head=head,
                  tokenizer=tokenizer, files=files)


def _drafter_architecture(raw: object) -> str | None:
    """The drafter architecture config.json names (a drafter given as the target), or None."""
    names = raw.get("architectures") if isinstance(raw, dict) else None
    if isinstance(names, list):
        return next((n for n in names if isinstance(n, str) and n in FAMILIES), None)
    return None


def _family(raw: object, label: str) -> Family:
    """The family whose targets have config.json's model_type (contract/families.py); one
    of none is read as Qwen3's, whose strict reader names what is wrong. A family without
    a target reader is refused naming its model_type and family, instead of the Qwen3
    reader's first missing field."""
    family = target_family_of(raw) or QWEN3
    if family.target_reader is None:
        raise TargetFamilyError(
            f"{label}: model_type {raw['model_type']!r} is a target of the {family.name} family "
            f"({family.architecture} drafters); the target reader does not read it yet",
            path=label, field="model_type", expected="a target of a family read",
            found=raw["model_type"])
    return family


def _check_layers(checkpoint: Checkpoint, read: TargetConfig, weights_label: str,
                  config_label: str) -> None:
    """The weights must hold exactly the layers config.json counts: the pairing trusts
    num_hidden_layers for the taps, so a config that lies about it must not pass.

    Compared without building range(num_hidden_layers): the count comes from a 1 KB file
    and may be 2**40. Distinct non-negative ids are exactly 0..n-1 when there are n of them
    and the largest is n-1."""
    pattern = re.compile(_LAYER_NAME.format(prefix=re.escape(read.weights_prefix)))
    layers = {_layer_index(m[1]) for name in checkpoint.tensors if (m := pattern.match(name))}
    n, field = read.record.num_hidden_layers, read.field("num_hidden_layers")
    if len(layers) != n or (layers and max(layers) != n - 1):
        found = f"layers {min(layers)}..{max(layers)} ({len(layers)})" if layers else "no layers"
        raise TargetFormatError(f"{weights_label}: holds {found}; {config_label} says "
                                f"{field} = {n}", path=weights_label, field=field,
                                expected=n, found=len(layers))


def _layer_index(digits: str) -> int:
    """The layer id a tensor name holds; beyond 18 digits, a stand-in larger than any
    layer count a config can pass with (the weights cannot hold 10**18 layers)."""
    return int(digits) if len(digits) <= _MAX_LAYER_DIGITS else 10**_MAX_LAYER_DIGITS


def _tensor(checkpoint: Checkpoint, name: str, config: TargetConfigRecord, label: str,
            tied_hint: bool = False) -> TensorEntry:
    entry = checkpoint.tensors.get(name)
    if entry is None:
        hint = " (config.json tie_word_embeddings is false)" if tied_hint else ""
        raise TargetFormatError(f"{label}: tensor '{name}' is missing{hint}; the pairing hashes it",
                                path=label, tensor=name, expected="present", found="missing")
    want = [config.vocab_size, config.hidden_size]
    if list(entry.shape) != want:
        raise TargetFormatError(f"{label}: tensor '{name}': expected shape {want} (= [vocab_size, "
                                f"hidden_size] of config.json), found {list(entry.shape)}",
                                path=label, tensor=name, expected=want, found=list(entry.shape))
    if entry.dtype not in TENSOR_DTYPES:
        raise TargetFormatError(f"{label}: tensor '{name}': expected dtype one of "
                                f"{', '.join(TENSOR_DTYPES)}, found {entry.dtype}", path=label,
                                tensor=name, expected=list(TENSOR_DTYPES), found=entry.dtype)
    return entry


# --- reading the embedding and the head -----------------------------------------------------

def tensor_sha256(entry: TensorEntry, *, as_dtype: str | None = None,
                  progress: Progress | None = None) -> str:
    """SHA-256 of one tensor's bytes, read by itself in blocks. With ``as_dtype``, of the
    bytes it has once cast to that dtype (via float32, exact from BF16/F16; to BF16
    nearest-even), so that a copy kept in another dtype can be compared."""
    progress = progress or NoProgress()
    convert = as_dtype is not None and as_dtype != entry.dtype
    if as_dtype is not None and as_dtype not in TENSOR_DTYPES:
        raise TargetFormatError(f"cannot compare tensor '{entry.name}' as {as_dtype}; expected "
                                f"one of {', '.join(TENSOR_DTYPES)}", tensor=entry.name,
                                expected=list(TENSOR_DTYPES), found=as_dtype)
    digest = hashlib.sha256()
    # Whole elements per block, so that a conversion never splits one.
    view = memoryview(bytearray(BLOCK - BLOCK % 4))

    try:
        with open(entry.file, "rb") as fh:
            fh.seek(entry.begin)
            for block in read_blocks(fh, entry.nbytes, view, [] if convert else [digest],
                                     progress.advance, lambda: shrank_error(entry)):
                if convert:
                    digest.update(_cast(block, entry.dtype, as_dtype))
    except OSError as exc:
        raise read_error(entry, exc) from None
    return digest.hexdigest()


def shrank_error(entry: TensorEntry) -> TargetFormatError:
    """A target weights file that ended before ``entry``'s bytes: it shrank after its header
    was read (the header proved the bytes were there)."""
    return TargetFormatError(f"target {entry.file}: the file shrank while '{entry.name}' was "
                             "read; expected it unchanged", path=str(entry.file),
                             tensor=entry.name)


def read_error(entry: TensorEntry, exc: OSError) -> TargetNotFoundError:
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    return TargetNotFoundError(f"target {entry.file}: cannot read '{entry.name}': {reason}",
                               path=str(entry.file), tensor=entry.name)


def _cast(block, src: str, dst: str) -> bytes:
    raw = np.frombuffer(block, dtype=RAW_DTYPES[src])
    wide = (raw.astype(np.uint32) << 16).view(np.float32) if src == "BF16" else raw.astype(np.float32)
    if dst == "BF16":
        return round_to_bf16(wide).tobytes()
    return wide.astype(RAW_DTYPES[dst]).tobytes()


def hash_target_tensors(target: Target, progress: Progress | None = None) -> list[TargetTensorRecord]:
    """The embedding's and the head's SHA-256 in their own dtype (one read each; one for a
    tied head)."""
    if target._tensor_hashes:
        return list(target._tensor_hashes)
    progress = progress or NoProgress()
    entries = [target.embed] + ([] if target.head_tied else [target.head])
    progress.start("hash target embedding and head", sum(e.nbytes for e in entries))
    try:
        digests = {e.name: tensor_sha256(e, progress=progress) for e in entries}
    finally:
        progress.finish()
    records = [TargetTensorRecord(role=role, name=e.name, dtype=e.dtype, shape=list(e.shape),
                                  sha256=digests[e.name])
               for role, e in (("embedding", target.embed), ("head", target.head))]
    target._tensor_hashes.extend(records)
    return records


def weights_sha256(target: Target, progress: Progress | None = None) -> str:
    """dflash.source.sha256's rule applied to the target's weights files (one file: its
    SHA-256; shards: of the sorted "<file> <sha256>" lines): the identity of its weights
    as a whole, for a report (`dspark eval`). Reads every weights byte once."""
    progress = progress or NoProgress()
    files = target.checkpoint.files.weights
    progress.start("hash target weights", sum(p.stat().st_size for p in files))
    try:
        return weights_digest([(p.name, sha256_file(p, progress.advance)) for p in files])
    finally:
        progress.finish()


# --- comparing a drafter's copy with the target's, row by row ------------------------------

def first_different_row(a: TensorEntry, b: TensorEntry) -> int | None:
    """The first row where two [rows, cols] tensors of one dtype differ, read a block of
    rows at a time; None when they cannot be compared that way or do not differ. ``a`` is
    the drafter checkpoint's copy, ``b`` the target's: a file that shrank while it was read
    is refused with its side's error (12 or 61) before any short block is compared."""
    if a.dtype != b.dtype or a.shape != b.shape or len(a.shape) != 2:
        return None
    row_bytes = a.nbytes // a.shape[0] if a.shape[0] else 0
    if not row_bytes:
        return None
    rows_per_block = max(1, BLOCK // row_bytes)
    buffers = (bytearray(rows_per_block * row_bytes), bytearray(rows_per_block * row_bytes))
    with _open_tensor(a, target=False) as fa, _open_tensor(b, target=True) as fb:
        for start in range(0, a.shape[0], rows_per_block):
            count = min(rows_per_block, a.shape[0] - start) * row_bytes
            xa = _read_rows(fa, a, start * row_bytes, memoryview(buffers[0])[:count], False)
            xb = _read_rows(fb, b, start * row_bytes, memoryview(buffers[1])[:count], True)
            differs = (xa.reshape(-1, row_bytes) != xb.reshape(-1, row_bytes)).any(axis=1)
            if differs.any():
                return start + int(np.argmax(differs))
    return None


def _open_tensor(entry: TensorEntry, *, target: bool):
    try:
        return open(entry.file, "rb")
    except OSError as exc:
        raise _read_error(entry, exc, target) from None


def _read_rows(fh, entry: TensorEntry, offset: int, view: memoryview, target: bool) -> np.ndarray:
    """``len(view)`` bytes of ``entry`` from ``offset`` into it, all of them or refused."""
    try:
        fh.seek(entry.begin + offset)
        got = read_full(fh, view)
    except OSError as exc:
        raise _read_error(entry, exc, target) from None
    if got != len(view):
        if target:
            raise shrank_error(entry)
        raise SafetensorsFormatError(f"{entry.file}: the file shrank while '{entry.name}' was "
                                     "read; expected it unchanged during conversion",
                                     path=str(entry.file), tensor=entry.name)
    return np.frombuffer(view, dtype=np.uint8)


def _read_error(entry: TensorEntry, exc: OSError, target: bool):
    if target:
        return read_error(entry, exc)
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    return SourceNotFoundError(f"{entry.file}: cannot read '{entry.name}': {reason}",
                               path=str(entry.file), tensor=entry.name)
