"""`dspark export --engine llama.cpp`: an artifact as the drafter file llama.cpp 0c1e570 loads
(the layout is artifact/llama_cpp.py, the facts docs/REFERENCE.md §6).

- The artifact must pass ``validate_artifact`` (any artifact: DSpark or plain DFlash, BF16
  or quantized: quantized matrices are copied as they are).
- Heads llama.cpp does not implement are refused before anything is read: a gated or rnn
  Markov head (101), a confidence head without Markov input (102).
- The target GGUF, the one the user runs llama.cpp with, is checked against the artifact
  (its metadata before validate hashes the artifact, against the header's contract, and
  again after):
  architecture, hidden size, vocabulary (token count and the embedding's shape), layer
  count against the taps, and the embedding / head SHA-256 recorded at convert when its
  tensors are BF16 (the recorded hashes are of BF16 bytes; another type cannot be compared,
  which the result says in one line). Its tokenizer keys are copied into the drafter, each
  with the type and element type it was read with, so llama.cpp's token-by-token vocabulary
  check compares a vocabulary with itself; a key the file cannot carry as read (an array
  of arrays, which llama.cpp's GGUF reader refuses, or an empty array) is refused (104).
- The embedding and head: by default the file carries neither, and llama.cpp binds the
  target's (``keep_embedding`` writes llama.cpp's own converter's layout instead; see
  ``export_llama_cpp`` and docs/ENGINES.md).
- One sequential write through util/atomic.atomic_file: the header (gguf-py), then each
  tensor streamed in blocks of util/hashing.BLOCK (1-D tensors widened from BF16 to F32 on
  the way), hashed as it is read and compared with what was checked (validate's hashes,
  the target's embedding digest), and the file's tensor table read back against the plan
  before the rename. Nothing is written on a refusal; the same inputs give the same bytes
  (no paths, no timestamps).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf.constants import GGMLQuantizationType, GGUFValueType

from dspark_convert import CONVERTER_NAME, __version__
from dspark_convert.artifact import llama_cpp as L
from dspark_convert.artifact.format import GGUF_FILE, contract_from_metadata, padded, read_metadata
from dspark_convert.artifact.writer import KeyValue, header_of
from dspark_convert.checks import Check
from dspark_convert.commands.export_deepspec import ENGINE as DEEPSPEC
from dspark_convert.commands.export_speculators import ENGINE as SPECULATORS
from dspark_convert.contract.dspark import FeatureContract
from dspark_convert.errors import (
    DSparkError,
    EngineConfidenceHeadError,
    EngineMarkovHeadError,
    ExportArtifactError,
    ExportOptionError,
    FamilyExportError,
    InternalError,
    IntegrityError,
    TargetGGUFError,
    TargetGGUFMismatchError,
)
from dspark_convert.formats.gguf_reader import GGUFFile, GGUFTensorInfo, read_gguf
from dspark_convert.util.atomic import Output, atomic_file, check_outputs, write_error
from dspark_convert.util.hashed_output import HashedOutput
from dspark_convert.util.hashing import BLOCK, read_blocks
from dspark_convert.util.paths import check_input_file
from dspark_convert.util.progress import NoProgress, Progress
from dspark_convert.util.text import shown

ENGINES = (L.ENGINE, DEEPSPEC, SPECULATORS)  # the engines `export` lays files out for

# The options each engine's export takes, and the one it needs (--engine deepspec:
# commands/export_deepspec.py), with what it names; any other is refused (107), not ignored.
ENGINE_OPTIONS: dict[str, tuple[tuple[str, ...], str]] = {
    L.ENGINE: (("--target-gguf", "--keep-embedding"), "--target-gguf"),
    DEEPSPEC: (("--target",), "--target"),
    SPECULATORS: (("--target",), "--target"),     # the verifier (commands/export_speculators.py)
}
_NEEDED_FOR = {
    "--target-gguf": "TARGET.gguf, the target model's GGUF file llama.cpp runs (-m)",
    "--target": ("the target model (a directory or org/name@<commit>): the embedding and head "
                 "the artifact stripped are the target's (speculators: the verifier it records)"),
}


@dataclass(frozen=True)
class ExportResult:
    output: Path
    engine: str                        # "llama.cpp"
    drafter: str                       # what llama.cpp will run: "DSpark (...)" / "DFlash"
    size: int
    sha256: str                        # of the written file
    tensors: int
    artifact_sha256: str               # the artifact's drafter.gguf
    embedding_kept: bool               # token_embd.weight carried (keep_embedding)
    checks: tuple[Check, ...]          # the target GGUF against the artifact, in order


@dataclass(frozen=True)
class _Planned:
    name: str
    type: str                          # the type written
    gguf_shape: tuple[int, ...]
    nbytes: int                        # written
    source: Path                       # the file it is read from
    source_offset: int
    source_nbytes: int
    widen: bool                        # BF16 -> F32


def check_engine_options(engine: str, given: dict[str, object]) -> None:
    """``given`` (option -> value; None or False: not given) against what ``engine``'s
    export takes (ENGINE_OPTIONS): the option it needs present, none of another engine's."""
    takes, needs = ENGINE_OPTIONS[engine]
    if given.get(needs) is None:
        raise ExportOptionError(f"--engine {engine}: needs {needs} {_NEEDED_FOR[needs]}",
                                field=needs, expected=f"{needs} given", found="missing")
    for option, value in given.items():
        if value is not None and value is not False and option not in takes:
            others = [e for e, (opts, _) in ENGINE_OPTIONS.items() if option in opts]
            raise ExportOptionError(
                f"{option}: given with --engine {engine}, which takes {', '.join(takes)}; "
                f"expected it only with --engine {' or '.join(others)}", field=option,
                expected=f"not given with --engine {engine}", found="given")


# --- the artifact -----------------------------------------------------------------------------

def _validated(artifact: Path, progress: Progress):
    from dspark_convert.commands.validate import validated_input  # the whole checking stack

    return validated_input(artifact, what="the artifact", error=ExportArtifactError,
                           expected="a valid artifact", progress=progress)


def _refuse_heads(contract: FeatureContract, label: str) -> None:
    """What llama.cpp 0c1e570 does not implement (src/models/dflash.cpp creates markov_w1,
    markov_w2 and conf_proj [H + r, 1] only)."""
    head = contract.markov_head
    if head.rank > 0 and head.type not in L.MARKOV_HEAD_TYPES:
        raise EngineMarkovHeadError(
            f"{label}: metadata key 'dflash.markov_head_type' is '{head.type}'; llama.cpp "
            f"{L.LLAMA_CPP_COMMIT} implements only the vanilla Markov head (its DSpark graph "
            "has no gate or recurrent state), so it cannot run this drafter",
            path=label, field="dflash.markov_head_type", expected="vanilla", found=head.type)
    conf = contract.confidence_head
    if conf.enabled and not (conf.with_markov and head.rank > 0):
        raise EngineConfidenceHeadError(
            f"{label}: the confidence head reads no Markov input "
            "(dflash.confidence_head_with_markov is false or there is no Markov head); "
            f"llama.cpp {L.LLAMA_CPP_COMMIT} implements only conf_proj over [hidden; "
            "W1[prev]] ([H + r, 1]) and would refuse this conf_proj.weight", path=label,
            field="dflash.confidence_head_with_markov", expected="true", found="false")


def describe(contract: FeatureContract) -> str:
    head, conf = contract.markov_head, contract.confidence_head
    if head.rank == 0:
        # llama.cpp picks draft-dflash for a file without markov_w1, which reads the block
        # one row late for DeepSpec's layout (common/speculative.cpp reads rows 1..n);
        # draft-dspark reads rows 0..n-1 and adds no Markov bias without markov_w1
        # (docs/ENGINES.md, the cause of the gap).
        return ("DFlash (no Markov head): run it with --spec-type draft-dspark (draft-dflash, "
                "which llama.cpp picks for it, reads DeepSpec's block one row late)")
    extra = ", confidence head" if conf.enabled else ""
    return f"DSpark (vanilla Markov head, rank {head.rank}{extra}): --spec-type draft-dspark"


# --- the target GGUF --------------------------------------------------------------------------

def _read_target(path: Path) -> GGUFFile:
    # A FIFO or a directory says what it is, and a FIFO is never waited on.
    check_input_file(path, label=f"--target-gguf {shown(str(path))}", error=TargetGGUFError,
                     expected="the target model's GGUF file (the -m of llama.cpp)")
    try:
        return read_gguf(path)
    except DSparkError as exc:
        raise TargetGGUFError(f"{path}: not a readable GGUF file: {exc.message}",
                              path=str(path), expected="a GGUF file", found=exc.message) from None


def _kv(target: GGUFFile, key: str, gtype: GGUFValueType, label: str, why: str):
    value = target.kv.get(key)
    if value is None or value.type != gtype:
        found = "missing" if value is None else value.type.name
        raise TargetGGUFMismatchError(
            f"{label}: metadata key '{key}' is {found}; expected {gtype.name} ({why})",
            path=label, field=key, expected=gtype.name, found=found)
    return value.value


def _mismatch(label: str, what: str, key: str, want: object, got: object) -> TargetGGUFMismatchError:
    return TargetGGUFMismatchError(
        f"{label}: {what}: '{key}' is {got}; the artifact expects {want} (is this the "
        "drafter's target?)", path=label, field=key, expected=str(want), found=str(got))


@dataclass(frozen=True)
class _Target:
    gguf: GGUFFile
    arch: str
    context_length: int
    embedding: GGUFTensorInfo
    head: GGUFTensorInfo | None
    tokenizer: tuple[KeyValue, ...]


def _check_target(target: GGUFFile, contract: FeatureContract, label: str,
                  checks: list[Check]) -> _Target:
    g, taps = contract.geometry, contract.taps
    want_arch = L.TARGET_ARCHITECTURES.get(contract.family)
    if want_arch is None:
        # The families llama.cpp's export takes are those of its table (refuse_family says
        # it first, from the families' own table; a caller that has not is refused here).
        raise FamilyExportError(
            f"{label}: cannot be checked against a {contract.family} artifact: llama.cpp "
            f"{L.LLAMA_CPP_COMMIT}'s export takes the {', '.join(L.TARGET_ARCHITECTURES)} "
            "family only", path=label, field="dspark.family",
            expected=list(L.TARGET_ARCHITECTURES), found=contract.family)
    arch = _kv(target, "general.architecture", GGUFValueType.STRING, label, "the model's architecture")
    if arch != want_arch:
        raise _mismatch(label, "architecture", "general.architecture", f"'{want_arch}'", f"'{arch}'")
    hidden = _kv(target, f"{arch}.embedding_length", GGUFValueType.UINT32, label, "hidden size")
    if hidden != g.hidden_size:
        raise _mismatch(label, "hidden size", f"{arch}.embedding_length", g.hidden_size, hidden)
    layers = _kv(target, f"{arch}.block_count", GGUFValueType.UINT32, label, "layer count")
    if layers != taps.num_target_layers:
        raise _mismatch(label, "layer count", f"{arch}.block_count",
                        f"{taps.num_target_layers} (dflash.target.num_layers; the taps "
                        f"{taps.target_layer_ids} are of that model)", layers)
    context = _kv(target, f"{arch}.context_length", GGUFValueType.UINT32, label, "context length")
    for key in L.TOKENIZER_REQUIRED:
        if key not in target.kv:
            raise TargetGGUFMismatchError(
                f"{label}: metadata key '{key}' is missing; expected the target's tokenizer "
                "embedded (llama.cpp loads the drafter's vocabulary from it)", path=label,
                field=key, expected="present", found="missing")
    tokens_value = target.kv["tokenizer.ggml.tokens"]
    if tokens_value.type != GGUFValueType.ARRAY or tokens_value.sub_type != GGUFValueType.STRING:
        raise TargetGGUFMismatchError(
            f"{label}: metadata key 'tokenizer.ggml.tokens' is not a string array; expected "
            "the target's token texts", path=label, field="tokenizer.ggml.tokens",
            expected="ARRAY[STRING]", found=tokens_value.type.name)
    tokens = tokens_value.value
    if len(tokens) != g.vocab_size:
        raise _mismatch(label, "vocabulary", "tokenizer.ggml.tokens",
                        f"{g.vocab_size} tokens (dflash.vocab_size)", f"{len(tokens)} tokens")
    infos = {t.name: t for t in target.tensors}
    embedding = infos.get(L.TARGET_EMBEDDING)
    if embedding is None or tuple(embedding.shape) != (g.hidden_size, g.vocab_size):
        got = "missing" if embedding is None else list(embedding.shape)
        raise _mismatch(label, "embedding", L.TARGET_EMBEDDING,
                        f"GGUF shape {[g.hidden_size, g.vocab_size]}", got)
    head = infos.get(L.TARGET_HEAD)
    if head is not None and tuple(head.shape) != (g.hidden_size, g.vocab_size):
        raise _mismatch(label, "head", L.TARGET_HEAD, f"GGUF shape {[g.hidden_size, g.vocab_size]}",
                        list(head.shape))
    checks.append(Check.passed("target.geometry", (
        f"{label}: {arch}, hidden size {hidden}, {len(tokens)} tokens, {layers} layers "
        f"(taps {taps.target_layer_ids} in range)")))
    copied = {k: v for k, v in target.kv.items()
              if k.startswith(L.TOKENIZER_PREFIX) and k != L.MASK_KEY}
    for key, value in copied.items():
        _refuse_uncopyable(key, value, label)
    # Each value with the type and element type it was read with: gguf-py guesses an
    # element type only when none is passed (a UINT32 array would come back INT32).
    tokenizer = tuple((k, v.value, v.type, v.sub_type) for k, v in copied.items())
    return _Target(target, arch, context, embedding, head, tokenizer)


def _refuse_uncopyable(key: str, value, label: str) -> None:
    """A tokenizer key the drafter file cannot carry as it was read. An array of arrays:
    llama.cpp 0c1e570's GGUF reader refuses any (ggml/src/gguf.cpp: "key '%s' has invalid
    GGUF type 9"), so neither the target nor a drafter holding one loads, and gguf-py
    would write its inner arrays with guessed element types. An empty array: gguf-py
    cannot write one, and llama.cpp's converter (gguf-py) never wrote the target's."""
    if value.type != GGUFValueType.ARRAY:
        return
    if value.sub_type == GGUFValueType.ARRAY:
        raise TargetGGUFMismatchError(
            f"{label}: metadata key '{key}' is an array of arrays; expected a flat array "
            f"(llama.cpp {L.LLAMA_CPP_COMMIT}'s GGUF reader refuses nested arrays: neither "
            "this target nor a drafter carrying the key would load)", path=label, field=key,
            expected="a flat array", found="ARRAY[ARRAY]")
    if len(value.value) == 0:
        raise TargetGGUFMismatchError(
            f"{label}: metadata key '{key}' is an empty {value.sub_type.name} array; expected "
            "a non-empty one (llama.cpp's converter never writes an empty array, and the "
            "drafter file cannot carry one)",
            path=label, field=key, expected="a non-empty array",
            found=f"empty ARRAY[{value.sub_type.name}]")


def _comparable(info: GGUFTensorInfo, recorded: str | None, what: str, label: str,
                key: str) -> str | None:
    """None when the tensor's bytes can be compared with the recorded hash, else why not."""
    if recorded is None:
        return f"the artifact records no {what} hash ({key}); {label}'s {info.name} not compared"
    if info.ggml_type.name != "BF16":
        return (f"{label}'s {info.name} is {info.ggml_type.name}; the {what} hash recorded at "
                f"convert ({key}) is of BF16 bytes, so it could not be compared")
    return None


# The digests of target GGUF spans this process has read, by the file's identity (device,
# inode, size, mtime) and the span: eval checks the target against every artifact before it
# runs, then exports each with export's own check, and a tied target's head is its
# embedding; a span of gigabytes is read once. A file changed since is another key.
_SPAN_DIGESTS: dict[tuple[int, int, int, int, int, int], str] = {}


def _sha_of_span(path: Path, offset: int, nbytes: int, label: str) -> str:
    st = os.stat(path)
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, offset, nbytes)
    if key not in _SPAN_DIGESTS:
        digest = hashlib.sha256()
        buffer = memoryview(bytearray(min(BLOCK, max(nbytes, 1))))
        with open(path, "rb") as fh:
            fh.seek(offset)
            for _ in read_blocks(fh, nbytes, buffer, [digest], lambda n: None,
                                 lambda: _shrank(label)):
                pass
        _SPAN_DIGESTS[key] = digest.hexdigest()
    return _SPAN_DIGESTS[key]


def _shrank(label: str) -> TargetGGUFError:
    return TargetGGUFError(f"{label}: the file shrank while it was read; expected it unchanged",
                           path=label)


def _check_hash(target: _Target, info: GGUFTensorInfo, kv: dict, key: str, what: str,
                name: str, label: str, checks: list[Check]) -> str | None:
    """``info``'s bytes against the hash the artifact recorded at convert (``key``); returns
    the digest read, None when the two could not be compared (one info line says why)."""
    why = _comparable(info, kv.get(key), what, label, key)
    if why is not None:
        checks.append(Check.info(name, why))
        return None
    got = _sha_of_span(target.gguf.path, info.data_offset, info.nbytes, label)
    if got != kv[key]:
        raise TargetGGUFMismatchError(
            f"{label}: tensor '{info.name}' has SHA-256 {got}; the artifact was converted "
            f"against a {what} of SHA-256 {kv[key]} ({key}): another target", path=label,
            tensor=info.name, expected=kv[key], found=got)
    checks.append(Check.passed(name, f"{label}'s {info.name} is the {what} the artifact was "
                               f"converted against ({key})"))
    return got


# --- the file ---------------------------------------------------------------------------------

def _file_type(kv: dict) -> int:
    return L.FILE_TYPES[kv.get("strata.dflash.quantization") or "BF16"]


def _value(source: str, kv: dict, contract: FeatureContract, target: _Target,
           artifact_sha: str) -> object:
    kind, _, arg = source.partition(":")
    if kind == "artifact":
        return kv[arg]
    if kind == "target":
        return target.context_length if arg == "context_length" else None
    if kind == "const":
        return {"true": True, "false": False}.get(arg, int(arg) if arg.isdigit() else arg)
    return {
        "name": lambda: kv["general.name"],
        "taps": lambda: [t + L.TAP_OFFSET for t in contract.taps.target_layer_ids],
        "file_type": lambda: _file_type(kv),
        "confidence": lambda: contract.confidence_head.enabled,
        "anchor": lambda: contract.block.anchor_first,
        "converter": lambda: f"{CONVERTER_NAME} {__version__}",
        "artifact_sha256": lambda: artifact_sha,
    }[kind]()


def _kind_provenance() -> list[KeyValue]:
    """The provenance a DFlash2 or assistant export writes (artifact/llama_cpp.py
    KIND_PROVENANCE), valued by the DSpark export's own reader: both are constants (the
    engine's commit, the converter's version), so no artifact, contract or target is read."""
    return [(k.key, _value(k.source, {}, None, None, ""), k.type, k.sub_type)
            for k in L.KIND_PROVENANCE]


def metadata(kv: dict, contract: FeatureContract, target: _Target, artifact_sha: str
             ) -> list[KeyValue]:
    """(key, value, type, sub_type) of every key, in file order (artifact/llama_cpp.py)."""
    def row(k: L.LlamaKey):
        return (k.key, _value(k.source, kv, contract, target, artifact_sha), k.type, k.sub_type)

    return [*(row(k) for k in L.LLAMA_KEYS), *target.tokenizer, row(L.MASK),
            *(row(k) for k in L.PROVENANCE)]


def _plan(artifact_gguf: GGUFFile, contract: FeatureContract, target: _Target, *,
          keep_embedding: bool) -> list[_Planned]:
    """With ``keep_embedding`` the target's token_embd first (llama.cpp creates it first),
    then every tensor of the artifact in its order; 1-D BF16 tensors become F32."""
    kinds = {t.gguf_name: t.kind for t in contract.written_tensors}
    plan = []
    if keep_embedding:
        emb = target.embedding
        plan.append(_Planned(emb.name, emb.ggml_type.name, tuple(emb.shape), emb.nbytes,
                             target.gguf.path, emb.data_offset, emb.nbytes, False))
    for info in artifact_gguf.tensors:
        widen = kinds[info.name] in L.F32_KINDS and info.ggml_type.name == "BF16"
        plan.append(_Planned(info.name, "F32" if widen else info.ggml_type.name,
                             tuple(info.shape), info.nbytes * 2 if widen else info.nbytes,
                             artifact_gguf.path, info.data_offset, info.nbytes, widen))
    return plan


def _header(entries: list[KeyValue], plan: list[_Planned], scratch: Path) -> bytes:
    tensors = [(t.name, list(reversed(t.gguf_shape)), t.nbytes, GGMLQuantizationType[t.type])
               for t in plan]
    return header_of(L.ARCH, entries, tensors, scratch)


class _Writer(HashedOutput):
    """The one sequential write: header, then each tensor and its padding, hashed."""

    def __init__(self, fh, plan: list[_Planned], progress: Progress, shown: Path) -> None:
        super().__init__(fh, shown)
        self.plan, self.progress = plan, progress
        self.tensor_sha: dict[str, str] = {}     # of the bytes read, per source tensor

    def run(self, header: bytes) -> None:
        self.put(header)
        buffer = memoryview(bytearray(BLOCK))
        handles: dict[Path, object] = {}
        try:
            for t in self.plan:
                if t.source not in handles:
                    handles[t.source] = open(t.source, "rb")
                fh = handles[t.source]
                fh.seek(t.source_offset)
                source_hash = hashlib.sha256()
                for block in read_blocks(fh, t.source_nbytes, buffer, [source_hash],
                                         self.progress.advance, lambda: _shrank(str(t.source))):
                    if t.widen:
                        wide = np.frombuffer(block, dtype="<u2").astype("<u4") << 16
                        self.put(wide.tobytes())
                    else:
                        self.put(block)
                self.tensor_sha[t.name] = source_hash.hexdigest()
                self.put(bytes(padded(t.nbytes) - t.nbytes))
        finally:
            for handle in handles.values():
                handle.close()


def read_target_gguf(path: str | os.PathLike) -> GGUFFile:
    """The target GGUF, read as export reads it (one line for a missing, special or
    unreadable file: 103/104)."""
    return _read_target(Path(path))


def check_target_gguf(target_file: GGUFFile, contract: FeatureContract, kv: dict, label: str,
                      checks: list[Check]) -> tuple[_Target, str | None]:
    """``target_file`` against an artifact's contract and the hashes it recorded at convert:
    the architecture, hidden size, layer count against the taps, vocabulary, tokenizer
    arrays, then the embedding's and the head's bytes. The one check of a target GGUF:
    export's and eval's (--engine ... --target-gguf). A GGUF of another target is refused
    (104); returns the target read and the embedding's digest (None where not comparable)."""
    target = _check_target(target_file, contract, label, checks)
    embed_sha = _check_hash(target, target.embedding, kv, "dflash.target.embed_sha256",
                            "embedding", "target.embedding", label, checks)
    # A tied target has no output.weight: its head is token_embd.
    _check_hash(target, target.head or target.embedding, kv, "dflash.target.lm_head_sha256",
                "head", "target.lm_head", label, checks)
    return target, embed_sha


def export_llama_cpp(artifact: str | os.PathLike, target_gguf: str | os.PathLike,
                     output: str | os.PathLike, *, force: bool = False,
                     keep_embedding: bool = False,
                     progress: Progress | None = None) -> ExportResult:
    """Write ``output``, the drafter file llama.cpp 0c1e570 runs beside ``target_gguf``.

    ``keep_embedding``: carry the target's ``token_embd.weight`` as llama.cpp's own converter
    does (its file for the same checkpoint, tensor for tensor). llama.cpp 0c1e570 then also
    takes that embedding as the drafter's head (``load_arch_tensors``: no ``output.weight``,
    so ``output = token_embd``), which is wrong for a target with untied embeddings. Without
    it (the default) the file carries neither, and llama.cpp binds the target's embedding
    and head (``ctx_other``), as the DeepSpec drafter binds its frozen copies of both.
    Raises a DSparkError subclass for every refusal and writes nothing then."""
    progress = progress or NoProgress()
    artifact, target_path = Path(artifact), Path(target_gguf)
    # The one output rule (an empty or '.'-like -o, overlaps through links, writability),
    # before any work; the raw ``output`` keeps an empty -o apart from '.'.
    [out] = check_outputs([Output(output, "the output", directory=False)],
                          [(artifact, "the artifact"), (target_path, "the target GGUF")], force=force)
    label = str(artifact / GGUF_FILE)
    from dspark_convert.commands.binding import refuse_family
    refuse_family(artifact, "export")

    # The heads first, from the header alone: a refusal costs no read of the weights. A
    # header that does not parse is left to validate, which names what is wrong.
    try:
        peek = contract_from_metadata(read_metadata(read_gguf(artifact / GGUF_FILE), path=label),
                                      path=label)
    except DSparkError:
        peek = None
    target_label = str(target_path)
    target_file = None
    if peek is not None:
        _refuse_heads(peek, label)
        # The target's metadata too, against the header's contract: a wrong or unusable
        # target GGUF is refused before validate reads and hashes every tensor.
        target_file = _read_target(target_path)
        _check_target(target_file, peek, target_label, [])

    report = _validated(artifact, progress)
    gguf = report.gguf
    kv = read_metadata(gguf, path=label)
    contract = contract_from_metadata(kv, path=label)
    _refuse_heads(contract, label)
    artifact_sha = report.gguf_sha256

    # Again against the contract validate read (the artifact could have changed since the
    # peek); the target file is read once.
    checks: list[Check] = []
    target, embed_sha = check_target_gguf(target_file or _read_target(target_path), contract, kv,
                                          target_label, checks)

    plan = _plan(gguf, contract, target, keep_embedding=keep_embedding)
    entries = metadata(kv, contract, target, artifact_sha)
    recorded = _recorded_tensor_hashes(report)
    result: dict[str, object] = {}

    def write(fh) -> None:
        try:
            header = _header(entries, plan, Path(fh.name).with_name(Path(fh.name).name + ".header"))
        except OSError as exc:
            raise write_error(exc, out) from None
        expected = len(header) + sum(padded(t.nbytes) for t in plan)
        writer = _Writer(fh, plan, progress, out)
        progress.start(f"export {out.name} for llama.cpp", sum(t.source_nbytes for t in plan))
        try:
            writer.run(header)
        finally:
            progress.finish()
        for t in plan:
            # What was copied is what was checked: validate's hashes for the artifact's
            # tensors, the digest above for the target's embedding.
            want = recorded.get(t.name) if t.source == gguf.path else embed_sha
            got = writer.tensor_sha[t.name]
            if want is not None and want != got:
                shown = label if t.source == gguf.path else target_label
                raise IntegrityError(
                    f"{shown}: tensor '{t.name}' changed while it was exported (SHA-256 {got}, "
                    f"checked as {want}); expected the file unchanged", path=shown,
                    tensor=t.name, expected=want, found=got)
        fh.flush()
        if writer.size != expected:
            raise InternalError(f"{out}: wrote {writer.size} bytes, planned {expected}")
        _read_back(Path(fh.name), plan, out)
        result["sha"], result["size"] = writer.digest.hexdigest(), writer.size

    atomic_file(out, write, force=force)
    return ExportResult(output=out.absolute(), engine=L.ENGINE, drafter=describe(contract),
                        size=int(result["size"]), sha256=str(result["sha"]),
                        tensors=len(plan), artifact_sha256=artifact_sha,
                        embedding_kept=keep_embedding, checks=tuple(checks))


def _recorded_tensor_hashes(report) -> dict[str, str]:
    """Each tensor's SHA-256 as manifest.json records it, from the manifest validate read
    and compared with the file (read once: a manifest swapped after validate is never
    used): the export's copy is compared with them, so a file changed after validate is
    refused, not exported."""
    manifest, _bytes = report.manifest
    return {t.name: t.sha256 for t in manifest.artifact.tensors}


def _read_back(path: Path, plan: list[_Planned], shown: Path) -> None:
    written = read_gguf(path)
    table = [(t.name, t.ggml_type.name, tuple(t.shape)) for t in written.tensors]
    if table != [(t.name, t.type, t.gguf_shape) for t in plan]:
        raise InternalError(f"{shown}: the tensor table read back differs from the plan")


# --- DFlash2 and the Gemma 4 assistant: from their checkpoints ---------------------------------
# artifact/llama_cpp_dflash2.py and artifact/llama_cpp_assistant.py hold the layouts; these
# write them from the runtime's plan of a checkpoint (runtime/dflash2.plan_drafter,
# runtime/gemma4_assistant.plan_assistant: a directory is planned first), so what llama.cpp
# runs is what the reference runtime computes from the same bytes.

@dataclass(frozen=True)
class DrafterExportResult:
    output: Path
    engine: str                        # "llama.cpp"
    kind: str                          # "dflash2" | "gemma4-assistant"
    spec_type: str                     # the --spec-type llama.cpp runs it with
    n_max: int                         # the --spec-draft-n-max of the reference's block
    size: int
    sha256: str                        # of the written file
    tensors: int
    checks: tuple[Check, ...]          # the target GGUF against the drafter, in order


# The llama_ftype a file of these matrices is (include/llama.h): BF16 32, F16 1, F32 0.
_FTYPES = {"BF16": 32, "F16": 1, "F32": 0}
_GGML_OF = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}


@dataclass(frozen=True)
class _Stored:
    """One tensor of a DFlash2 / assistant file: where its bytes come from, read in blocks
    when written (a released drafter's tensors are never all in memory)."""

    name: str
    shape: tuple[int, ...]             # torch order
    ggml: str                          # the type it is stored as
    nbytes: int                        # written
    spec: object = None                # the checkpoint tensor (runtime/loading.StoredTensor)
    widen: str | None = None           # "BF16" / "F16": widened to F32 on the way
    data: bytes | None = None          # a computed tensor (rope_freqs)

    def chunks(self):
        if self.data is not None:
            yield self.data
            return
        spec = self.spec
        with open(spec.file, "rb") as fh:
            fh.seek(spec.offset)
            left = spec.nbytes
            while left:
                block = fh.read(min(BLOCK, left))
                if not block:
                    raise IntegrityError(
                        f"{spec.file}: tensor '{spec.name}' ends past the end of the file",
                        path=str(spec.file), tensor=spec.name,
                        expected=f"{spec.nbytes} bytes", found=f"{spec.nbytes - left} bytes")
                left -= len(block)
                if self.widen == "BF16":
                    yield (np.frombuffer(block, dtype="<u2").astype("<u4") << 16).tobytes()
                elif self.widen == "F16":
                    yield np.frombuffer(block, dtype="<f2").astype("<f4").tobytes()
                else:
                    yield block


def _stored(name: str, spec, how: str) -> _Stored:
    """A checkpoint tensor as the file stores it: ``matrix`` in its own element type,
    ``f32`` widened exactly."""
    dtype = str(spec.dtype).removeprefix("torch.")
    stored = _GGML_OF.get(dtype)
    if stored is None:
        raise InternalError(f"{spec.file}: tensor '{spec.name}' is {dtype}; the plan admits "
                            "float types only")
    if how == "matrix" or stored == "F32":
        return _Stored(name, tuple(spec.shape), stored, spec.nbytes, spec=spec)
    return _Stored(name, tuple(spec.shape), "F32", spec.nbytes * 2, spec=spec, widen=stored)


def _target_tokenizer(target: GGUFFile, label: str, *, arch: str, hidden: int, vocab: int,
                      error: type[DSparkError]) -> tuple[dict, tuple[KeyValue, ...]]:
    """The target GGUF's architecture, hidden size and vocabulary against the drafter's
    (``error``), and its tokenizer keys as the drafter file carries them."""
    got_arch = target.kv.get("general.architecture")
    got_arch = got_arch.value if got_arch is not None else None
    if got_arch != arch:
        raise error(f"{label}: metadata key 'general.architecture' is {got_arch!r}; expected "
                    f"'{arch}', the drafter's target architecture", path=label,
                    field="general.architecture", expected=arch, found=str(got_arch))

    def value(key: str):
        v = target.kv.get(key)
        return None if v is None else v.value

    got_hidden = value(f"{arch}.embedding_length")
    if got_hidden != hidden:
        raise error(f"{label}: metadata key '{arch}.embedding_length' is {got_hidden}; expected "
                    f"{hidden}, the hidden size the drafter reads (is this its target?)",
                    path=label, field=f"{arch}.embedding_length", expected=hidden,
                    found=got_hidden)
    for key in L.TOKENIZER_REQUIRED:
        if key not in target.kv:
            raise error(f"{label}: metadata key '{key}' is missing; expected the target's "
                        "tokenizer embedded", path=label, field=key, expected="present",
                        found="missing")
    tokens = value("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or len(tokens) != vocab:
        found = len(tokens) if isinstance(tokens, list) else None
        raise error(f"{label}: metadata key 'tokenizer.ggml.tokens' holds {found} tokens; "
                    f"expected {vocab}, the drafter's vocabulary", path=label,
                    field="tokenizer.ggml.tokens", expected=vocab, found=found)
    embedding = next((t for t in target.tensors if t.name == L.TARGET_EMBEDDING), None)
    if embedding is None or tuple(embedding.shape) != (hidden, vocab):
        found = "missing" if embedding is None else list(embedding.shape)
        raise error(f"{label}: tensor '{L.TARGET_EMBEDDING}' is {found}; expected GGUF shape "
                    f"{[hidden, vocab]} (llama.cpp binds the drafter's embedding to it)",
                    path=label, tensor=L.TARGET_EMBEDDING, expected=[hidden, vocab],
                    found=found)
    copied = {k: v for k, v in target.kv.items()
              if k.startswith(L.TOKENIZER_PREFIX) and k != L.MASK_KEY}
    for key, v in copied.items():
        _refuse_uncopyable(key, v, label)
    return ({k: v.value for k, v in target.kv.items()},
            tuple((k, v.value, v.type, v.sub_type) for k, v in copied.items()))


def _write_drafter(out: Path, arch: str, entries: list[KeyValue], tensors: list[_Stored], *,
                   force: bool) -> tuple[int, str]:
    """One GGUF file: header_of's header, then each tensor padded, streamed in blocks;
    returns (size, sha256)."""
    infos = [(t.name, list(t.shape), t.nbytes, GGMLQuantizationType[t.ggml]) for t in tensors]
    result: dict[str, object] = {}

    def write(fh) -> None:
        try:
            header = header_of(arch, entries, infos,
                               Path(fh.name).with_name(Path(fh.name).name + ".header"))
        except OSError as exc:
            raise write_error(exc, out) from None
        digest = hashlib.sha256()
        size = 0

        def put(chunk: bytes) -> None:
            nonlocal size
            fh.write(chunk)
            digest.update(chunk)
            size += len(chunk)

        put(header)
        for t in tensors:
            wrote = size
            for chunk in t.chunks():
                put(chunk)
            if size - wrote != t.nbytes:
                raise InternalError(f"{out}: tensor '{t.name}' wrote {size - wrote} bytes, "
                                    f"planned {t.nbytes}")
            put(bytes(padded(t.nbytes) - t.nbytes))
        fh.flush()
        written = read_gguf(Path(fh.name))
        table = [(t.name, t.ggml_type.name) for t in written.tensors]
        if table != [(t.name, t.ggml) for t in tensors]:
            raise InternalError(f"{out}: the tensor table read back differs from the plan")
        result["size"], result["sha"] = size, digest.hexdigest()

    atomic_file(out, write, force=force)
    return int(result["size"]), str(result["sha"])


def _outputs(output, sources: list[tuple[Path, str]], force: bool) -> Path:
    [out] = check_outputs([Output(output, "the output", directory=False)], sources, force=force)
    return out


def _drafter_name(plan, default: str) -> str:
    """general.name: an artifact's own (its drafter.gguf's), else the checkpoint
    directory's name, so that a checkpoint and its artifact export the same bytes."""
    gguf = Path(plan.directory) / GGUF_FILE
    if gguf.is_file():
        try:
            value = read_gguf(gguf).kv.get("general.name")
        except DSparkError:
            value = None
        if value is not None and isinstance(value.value, str) and value.value:
            return value.value
    return Path(plan.directory).name or default


def _file_type_of(types: set[str]) -> int:
    matrices = types - {"F32"} or {"F32"}
    return _FTYPES[sorted(matrices)[0]]


def export_dflash2_llama_cpp(plan_or_dir, target_gguf: str | os.PathLike,
                             output: str | os.PathLike | None, *, force: bool = False,
                             check_only: bool = False) -> DrafterExportResult | None:
    """Write ``output``, a speculators DFlash2 drafter as llama.cpp 0c1e570 runs it beside
    ``target_gguf`` (artifact/llama_cpp_dflash2.py): ``plan_or_dir`` is
    runtime/dflash2.plan_drafter's plan or what it plans (a checkpoint directory).
    Run it with ``--spec-type draft-dflash --spec-draft-n-max block_size - 1``.
    LlamaCppDFlash2Error (157) for what llama.cpp cannot run as the runtime computes it or
    a target GGUF that is not the drafter's; nothing is written then. ``check_only``: those
    checks alone (no ``output``, nothing written; None returned)."""
    from dspark_convert.artifact import llama_cpp_dflash2 as D
    from dspark_convert.errors import LlamaCppDFlash2Error
    from dspark_convert.runtime.dflash2 import DFlash2Plan, plan_drafter

    plan = plan_or_dir if isinstance(plan_or_dir, DFlash2Plan) else plan_drafter(plan_or_dir)
    cfg, layer = plan.config, plan.config.layer
    label = str(plan.directory / "config.json")
    target_path = Path(target_gguf)
    out = None if check_only else _outputs(
        output, [(plan.directory, "the drafter"), (target_path, "the target GGUF")], force)
    H, K = cfg.hidden_size, cfg.selector_top_k
    sliding = [t == "sliding_attention" for t in layer.layer_types]
    if any(sliding) and not cfg.sliding_window_non_causal:
        raise LlamaCppDFlash2Error(
            f"{label}: field 'sliding_window_non_causal' is false: the sliding layers' block is "
            f"block-causal, which llama.cpp {L.LLAMA_CPP_COMMIT}'s DFlash graph cannot compute "
            "(one attention mask for every layer)", path=label,
            field="sliding_window_non_causal", expected="true", found="false")
    if H < K * (K + 1) or H % cfg.conv_group_size:
        raise LlamaCppDFlash2Error(
            f"{label}: hidden size {H} with selector_top_k {K} and conv_group_size "
            f"{cfg.conv_group_size}; llama.cpp {L.LLAMA_CPP_COMMIT} needs H >= K (K + 1) = "
            f"{K * (K + 1)} and H a multiple of conv_group_size (src/models/dflash.cpp packs "
            "the selector's K x K scores into one hidden row)", path=label,
            field="transformer_layer_config.hidden_size",
            expected=f">= {K * (K + 1)}, a multiple of {cfg.conv_group_size}", found=H)
    target_label = str(target_path)
    target = _read_target(target_path)
    target_kv, tokenizer = _target_tokenizer(target, target_label, arch=D.TARGET_ARCHITECTURE,
                                             hidden=H, vocab=cfg.vocab_size,
                                             error=LlamaCppDFlash2Error)
    n = target_kv.get(f"{D.TARGET_ARCHITECTURE}.block_count")
    deepest = max(cfg.aux_hidden_state_layer_ids)
    if not isinstance(n, int) or deepest > n:
        raise LlamaCppDFlash2Error(
            f"{target_label}: metadata key '{D.TARGET_ARCHITECTURE}.block_count' is {n}; the "
            f"drafter taps hidden state {deepest} (aux_hidden_state_layer_ids), which needs at "
            f"least {deepest} layers", path=target_label,
            field=f"{D.TARGET_ARCHITECTURE}.block_count", expected=f">= {deepest}", found=n)
    checks = [Check.passed("target.geometry", (
        f"{target_label}: {D.TARGET_ARCHITECTURE}, hidden size {H}, {cfg.vocab_size} tokens, "
        f"{n} layers (taps {list(cfg.aux_hidden_state_layer_ids)} in range)"))]
    if check_only:
        return None
    tensors = []
    for src, dst, how in D.tensor_names(layer.num_hidden_layers):
        spec = plan.tensors[src]
        tensors.append(_stored(dst, spec, how))
    values = {
        "name": _drafter_name(plan, "dflash2"), "rope_theta": cfg.rope_theta(),
        "target:context_length": target_kv.get(f"{D.TARGET_ARCHITECTURE}.context_length"),
        "file_type": _file_type_of({t.ggml for t in tensors}),
        "sliding_window": layer.sliding_window, "sliding_pattern": sliding,
    }

    def value(source: str):
        kind, _, arg = source.partition(":")
        if kind == "const":
            return {"true": True, "false": False}.get(arg, int(arg) if arg.isdigit() else arg)
        if kind == "layer":
            return getattr(layer, arg)
        if kind == "config":
            v = getattr(cfg, arg)
            return list(v) if isinstance(v, (list, tuple)) else v
        return values[source]

    entries: list[KeyValue] = []
    for k in D.KEYS:
        if k.source in ("sliding_window", "sliding_pattern") and not any(sliding):
            continue
        entries.append((k.key, value(k.source), k.type, k.sub_type))
    entries += [*tokenizer, (D.MASK_KEY, cfg.mask_token_id, GGUFValueType.UINT32, None),
                *_kind_provenance()]
    size, sha = _write_drafter(out, D.ARCH, entries, tensors, force=force)
    return DrafterExportResult(output=out.absolute(), engine=L.ENGINE, kind="dflash2",
                               spec_type="draft-dflash", n_max=cfg.block_size - 1, size=size,
                               sha256=sha, tensors=len(tensors), checks=tuple(checks))


def export_assistant_llama_cpp(plan_or_dir, target_gguf: str | os.PathLike,
                               output: str | os.PathLike | None, *, force: bool = False,
                               check_only: bool = False) -> DrafterExportResult | None:
    """Write ``output``, a Gemma 4 assistant as llama.cpp 0c1e570 runs it beside
    ``target_gguf`` (artifact/llama_cpp_assistant.py): ``plan_or_dir`` is
    runtime/gemma4_assistant.plan_assistant's plan or what it plans. Run it with
    ``--spec-type draft-mtp --spec-draft-n-max num_assistant_tokens``.
    LlamaCppAssistantError (158) for what llama.cpp cannot run as the runtime computes it
    or a target GGUF that is not the assistant's; nothing is written then. ``check_only``:
    those checks alone (no ``output``, nothing written; None returned)."""
    from dspark_convert.artifact import llama_cpp_assistant as S
    from dspark_convert.errors import LlamaCppAssistantError
    from dspark_convert.runtime.gemma4_assistant import AssistantPlan, plan_assistant

    plan = plan_or_dir if isinstance(plan_or_dir, AssistantPlan) else plan_assistant(plan_or_dir)
    spec = plan.spec
    t, Hb = spec.text, spec.backbone_hidden_size
    label = str(plan.directory / "config.json")
    target_path = Path(target_gguf)
    out = None if check_only else _outputs(
        output, [(plan.directory, "the assistant"), (target_path, "the target GGUF")], force)
    if spec.config.use_ordered_embeddings:
        raise LlamaCppAssistantError(
            f"{label}: field 'use_ordered_embeddings' is true; llama.cpp {L.LLAMA_CPP_COMMIT} "
            "drops masked_embedding.* and computes dense logits (conversion/gemma.py "
            "Gemma4AssistantModel), other drafts than the checkpoint's", path=label,
            field="use_ordered_embeddings", expected="false", found="true")
    if t.hidden_size == Hb:
        raise LlamaCppAssistantError(
            f"{label}: text_config.hidden_size {t.hidden_size} equals backbone_hidden_size; "
            f"llama.cpp {L.LLAMA_CPP_COMMIT} refuses such an assistant "
            "(src/models/gemma4-assistant.cpp: embedding_length_out must differ)", path=label,
            field="text_config.hidden_size", expected=f"not {Hb}", found=t.hidden_size)
    by_kind = {layer.kind: layer for layer in spec.layers}
    target_label = str(target_path)
    target = _read_target(target_path)
    arch = S.TARGET_ARCHITECTURE
    target_kv, tokenizer = _target_tokenizer(target, target_label, arch=arch, hidden=Hb,
                                             vocab=t.vocab_size, error=LlamaCppAssistantError)
    n = target_kv.get(f"{arch}.block_count")
    pattern = target_kv.get(f"{arch}.attention.sliding_window_pattern")
    kv_heads = target_kv.get(f"{arch}.attention.head_count_kv")
    if not isinstance(n, int) or n < 2 or not isinstance(pattern, list) or len(pattern) != n \
            or list(pattern[-2:]) != [True, False]:
        raise LlamaCppAssistantError(
            f"{target_label}: metadata key '{arch}.attention.sliding_window_pattern' is "
            f"{shown(str(pattern))[:80]}; expected the last two of {n} layers [sliding, full]: "
            f"llama.cpp {L.LLAMA_CPP_COMMIT}'s assistant reads the KV of layers n - 2 (sliding) "
            "and n - 1 (full) (src/llama-model.cpp), the target's last layer of each type",
            path=target_label, field=f"{arch}.attention.sliding_window_pattern",
            expected="[..., true, false]", found=shown(str(pattern))[:80])
    heads_of = (lambda i: kv_heads[i]) if isinstance(kv_heads, list) else (lambda i: kv_heads)
    geometry = {S.SLIDING: (target_kv.get(f"{arch}.attention.key_length_swa"), heads_of(n - 2)),
                S.FULL: (target_kv.get(f"{arch}.attention.key_length"), heads_of(n - 1))}
    for kind, layer in by_kind.items():
        if geometry[kind] != (layer.head_dim, layer.kv_heads):
            raise LlamaCppAssistantError(
                f"{target_label}: the target's last {kind} layer has head_dim "
                f"{geometry[kind][0]} and {geometry[kind][1]} KV heads; the assistant's "
                f"{kind} layers read its KV with head_dim {layer.head_dim}, {layer.kv_heads} KV "
                "heads", path=target_label, field=f"{arch}.attention", expected=[
                    layer.head_dim, layer.kv_heads], found=list(geometry[kind]))
    checks = [Check.passed("target.geometry", (
        f"{target_label}: {arch}, hidden size {Hb}, {t.vocab_size} tokens, {n} layers ending "
        "[sliding, full] of the assistant's geometry"))]
    if check_only:
        return None
    tensors = []
    full = by_kind.get(S.FULL)
    if full is not None:
        pairs = full.rotated_pairs if full.rotated_pairs is not None else full.head_dim // 2
        freqs = np.asarray(S.rope_freqs(full.head_dim, pairs), dtype="<f4")
        tensors.append(_Stored(S.ROPE_FREQS, (full.head_dim // 2,), "F32", freqs.nbytes,
                               data=freqs.tobytes()))
    for src, dst, how in S.tensor_names(len(spec.layers)):
        stored = plan.tensors[src]
        tensors.append(_stored(dst, stored, how))
    sliding = by_kind.get(S.SLIDING)
    values = {
        "name": _drafter_name(plan, "assistant"), "layers": len(spec.layers),
        "target:context_length": target_kv.get(f"{arch}.context_length"),
        "hidden": t.hidden_size, "intermediate": t.intermediate_size,
        "heads": t.num_attention_heads, "kv_heads": [layer.kv_heads for layer in spec.layers],
        "full_theta": full.rope_theta if full else sliding.rope_theta,
        "sliding_theta": sliding.rope_theta if sliding else full.rope_theta,
        "eps": t.rms_norm_eps, "full_head_dim": (full or sliding).head_dim,
        "sliding_head_dim": (sliding or full).head_dim,
        "file_type": _file_type_of({x.ggml for x in tensors if x.name != S.ROPE_FREQS}),
        "window": t.sliding_window or 0,
        "pattern": [layer.kind == S.SLIDING for layer in spec.layers], "backbone": Hb,
    }

    def value(source: str):
        kind, _, arg = source.partition(":")
        if kind == "const":
            return int(arg) if arg.isdigit() else arg
        return values[source]

    entries: list[KeyValue] = [(k.key, value(k.source), k.type, k.sub_type) for k in S.KEYS]
    entries += [*tokenizer, *_kind_provenance()]
    size, sha = _write_drafter(out, S.ARCH, entries, tensors, force=force)
    return DrafterExportResult(output=out.absolute(), engine=L.ENGINE, kind="gemma4-assistant",
                               spec_type="draft-mtp", n_max=spec.num_assistant_tokens,
                               size=size, sha256=sha, tensors=len(tensors), checks=tuple(checks))


# The export of each kind of drafter for llama.cpp (contract/families.py Family.kind; a
# checkpoint directory run as it is: commands/evaluate_kinds.source_kind).
KIND_EXPORTS = {"dflash2": export_dflash2_llama_cpp, "mtp": export_assistant_llama_cpp}


def drafter_kind(path: str | os.PathLike) -> str | None:
    """"dflash2" or "mtp" for a DFlash2 / Gemma 4 assistant checkpoint directory or
    artifact, None for anything else (a DSpark-family artifact, or what validate names)."""
    from dspark_convert.artifact.format import metadata_family
    from dspark_convert.commands.evaluate_kinds import source_kind

    kind = source_kind(path)
    if kind is not None:
        return kind if kind in KIND_EXPORTS else None
    label = str(Path(path) / GGUF_FILE)
    try:
        family = metadata_family(read_metadata(read_gguf(label), path=label), path=label)
    except (DSparkError, OSError):
        return None
    return family.kind if family.kind in KIND_EXPORTS else None


def export_any_llama_cpp(path: str | os.PathLike, target_gguf: str | os.PathLike,
                         output: str | os.PathLike, *, force: bool = False,
                         keep_embedding: bool = False, progress: Progress | None = None):
    """`dspark export --engine llama.cpp`: a DFlash2 drafter or a Gemma 4 assistant (its
    checkpoint directory or its artifact) by its kind's export, anything else by
    ``export_llama_cpp``. ``keep_embedding`` is the DSpark layout's choice: refused for the
    other kinds (107: llama.cpp binds a DFlash2 drafter's embedding and head from the
    target; an assistant carries its own)."""
    kind = drafter_kind(path)
    if kind is None:
        return export_llama_cpp(path, target_gguf, output, force=force,
                                keep_embedding=keep_embedding, progress=progress)
    if keep_embedding:
        what = "DFlash2 drafter" if kind == "dflash2" else "Gemma 4 assistant"
        raise ExportOptionError(
            f"--keep-embedding: given for a {what}; expected it only for a DSpark or DFlash "
            "artifact (llama.cpp binds a DFlash2 drafter's embedding and head from the "
            "target; an assistant carries its own)", field="--keep-embedding",
            expected="not given", found="given")
    return KIND_EXPORTS[kind](path, target_gguf, output, force=force)
