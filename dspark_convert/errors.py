"""The closed error hierarchy of dspark-convert.

Every refusal the tool can make is one class here. Each class carries a stable exit code
and a one-line message that names the file, field or tensor, what was expected and what
was found. The CLI maps these to output and exit codes (``cli/errors.py``); library code
raises them and never prints or exits. The classes are the single source of
docs/EXIT_CODES.md (tools/docs.py generates it from them; a test keeps it current).
"""

from __future__ import annotations


def _one_line(message: str) -> str:
    """The message on one line without losing what an input held: a line break, tab or
    other whitespace character but the space is escaped (``\\x0a``, ``\\u2028``), as
    util/text.shown escapes it on output, instead of being collapsed into a space (which
    turned a spec ending in a newline, or a tensor name holding a carriage return, into a
    name that looked like something else). The CLI escapes the rest of what does not print
    when it writes the line."""
    return "".join(c if c == " " or not c.isspace() else
                   (f"\\x{ord(c):02x}" if ord(c) <= 0xFF else f"\\u{ord(c):04x}")
                   for c in str(message)).strip(" ")


def _json_number_or_text(value: object) -> bool:
    """Whether ``value`` is JSON as it is: text, a finite number, a list of such."""
    if isinstance(value, float):
        return value - value == 0.0          # False for NaN and the infinities
    if isinstance(value, list):
        return all(_json_number_or_text(v) for v in value)
    return isinstance(value, (int, str, bool))


class DSparkError(Exception):
    """Base of every refusal. ``exit_code`` is stable and documented in docs/EXIT_CODES.md."""

    exit_code: int = 1
    kind: str = "error"

    def __init__(self, message: str, *, path: str | None = None, field: str | None = None,
                 tensor: str | None = None, expected: object = None, found: object = None):
        # The message is one line: newlines would break the CLI's one-line contract.
        self.message = _one_line(message)
        self.path = path
        self.field = field
        self.tensor = tensor
        self.expected = expected
        self.found = found
        super().__init__(self.message)

    def to_dict(self) -> dict:
        out = {"error": type(self).__name__, "kind": self.kind, "exit_code": self.exit_code,
               "message": self.message}
        for key in ("path", "field", "tensor"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        for key in ("expected", "found"):
            value = getattr(self, key)
            if value is not None:
                # A NaN or infinity found in an input is named as text ("nan", "inf"): JSON
                # has no such number (util/json_out.py refuses to write one).
                out[key] = value if _json_number_or_text(value) else str(value)
        return out


# --- the source: directory layout and safetensors files -----------------------------------

class SourceError(DSparkError):
    kind = "source"


class SourceNotFoundError(SourceError):
    """The source path, its config.json or its weights do not exist."""
    exit_code = 10


class SourceLayoutError(SourceError):
    """The directory is laid out in a way we refuse: pickle-only weights, both single-file
    and sharded weights, stray or missing shards, links that leave the directory."""
    exit_code = 11


class SafetensorsFormatError(SourceError):
    """A safetensors file or its index is malformed (header length, JSON, offsets...)."""
    exit_code = 12


# --- the feature contract: what config.json declares ---------------------------------------

class ContractViolation(DSparkError):
    kind = "contract"


class ConfigError(ContractViolation):
    """config.json is unreadable, not JSON, or a field has the wrong type or is missing."""
    exit_code = 13


class UnsupportedArchitectureError(ContractViolation):
    """An architecture that is no family of contract/families.py (Qwen3DSparkModel,
    Gemma4DSparkModel)."""
    exit_code = 14


class UnsupportedFeatureError(ContractViolation):
    """A known feature the Strata format cannot express (attention bias, sliding window,
    RoPE scaling, another activation)."""
    exit_code = 15


class TargetLayerError(ContractViolation):
    """target_layer_ids: -1, out of range, the target's last layer, or not increasing."""
    exit_code = 16


class GeometryLimitError(ContractViolation):
    """A dimension outside what the format allows (block_size > 128, > 64 draft layers,
    zero sizes, heads that do not divide)."""
    exit_code = 17


class MaskTokenError(ContractViolation):
    """mask_token_id outside the vocabulary."""
    exit_code = 18


class HeadConfigMismatchError(ContractViolation):
    """Markov / confidence-head fields that disagree with each other or with the tensors."""
    exit_code = 19


# --- the Gemma4 family's own contract rules (exit codes 25-29; contract/gemma4.py) ----------

class MoEBlockError(ContractViolation):
    """A Gemma4 drafter config with enable_moe_block true: DeepSpec's Gemma4 drafter has
    dense MLPs only (it asserts so), and so does the format."""
    exit_code = 25


class PerLayerInputError(ContractViolation):
    """A Gemma4 drafter config with hidden_size_per_layer_input other than 0: per-layer
    input embeddings, which DeepSpec's Gemma4 drafter refuses."""
    exit_code = 26


class FinalLayerTapError(TargetLayerError):
    """A Gemma4 drafter tapping the target's final layer: transformers replaces that
    hidden state by the final-normed one, so DeepSpec's evaluator refuses it."""
    exit_code = 27


class RopeTypeError(ContractViolation):
    """A Gemma4 drafter's rope_parameters["full_attention"] with a RoPE type other than
    'proportional' or 'default' (the only ones the drafter's rotary computes here), or
    without that entry."""
    exit_code = 28


class KEqVMismatchError(ContractViolation):
    """A Gemma4 drafter whose attention_k_eq_v disagrees with its tensors: v_proj present
    under k_eq_v (V is then k_proj's output, normed), or missing without it."""
    exit_code = 29


# --- the tensor inventory against the contract ---------------------------------------------

class InventoryError(DSparkError):
    kind = "inventory"


class MissingTensorError(InventoryError):
    """A tensor the contract requires is not in the checkpoint or artifact."""
    exit_code = 20


class UnexpectedTensorError(InventoryError):
    """A tensor the contract does not name (or one out of the format's fixed order)."""
    exit_code = 21


class TensorShapeError(InventoryError):
    """Geometry mismatch: a tensor's shape differs from the contract's."""
    exit_code = 22


class TensorDtypeError(InventoryError):
    """A tensor's dtype is not the one the config declares (or not BF16 in an artifact)."""
    exit_code = 23


class NonFiniteTensorError(InventoryError):
    """A tensor holds NaN or Inf (or an F32 value that overflows BF16)."""
    exit_code = 24


# --- the output directory ------------------------------------------------------------------

class OutputError(DSparkError):
    kind = "output"


class OutputExistsError(OutputError):
    """The output already exists (pass --force to replace it atomically)."""
    exit_code = 30


class OutputWriteError(OutputError):
    """The output could not be written (permissions, disk full)."""
    exit_code = 31


class OutputPathError(OutputError):
    """The output path names no new entry: empty, whitespace only, ending in '.' or '..',
    '/', the working directory or one of its ancestors (with --force it would be wiped)."""
    exit_code = 32


# --- speculators-format sources: vllm-project/speculators 0.9.0's DSpark and DFlash checkpoints
# (exit codes 33-39; contract/speculators.py, docs/SPECULATORS.md) ---------------------------

class SpeculatorsError(DSparkError):
    kind = "speculators"


class SampleFromAnchorMissingError(SpeculatorsError):
    """A speculators-format config.json without ``sample_from_anchor``: speculators 0.9.0's
    own schema reads it true for a DSpark drafter (false for DFlash), vLLM 0.33 reads it false
    (vllm #56792: acceptance under 1%, still lossless, so nobody notices). The block layout is
    never guessed: ``--sample-from-anchor true|false`` states it."""
    exit_code = 33


class AnchorLayoutError(SpeculatorsError, ContractViolation):
    """``sample_from_anchor`` false: in a speculators config.json (its top level or its
    ``transformer_layer_config``), in DeepSpec's config.json (which vLLM and SGLang read as the
    block layout), or stated with --sample-from-anchor: the anchor-as-bonus layout (block slot
    k predicts position p+k, block_size - 1 drafts), another block layout than the artifact
    format's (anchor first: slot j predicts p+1+j), the only one Strata, llama.cpp and the
    reference runtime run. A contract violation too: a config's rule, wherever it is read."""
    exit_code = 34


class DraftVocabularyError(SpeculatorsError):
    """A reduced draft vocabulary: ``draft_vocab_size`` below the vocabulary, or ``d2t`` /
    ``t2d`` tensors (the draft-to-target map and its mask): the artifact format has no
    vocabulary map yet."""
    exit_code = 35


class SpeculatorsTargetError(SpeculatorsError):
    """A speculators-format source without a target (convert without --target; inspect, which
    reads none, points to convert): speculators never saves the embedding (nor a
    full-vocabulary head) and records no target layer count; the target supplies them, as the
    DeepSpec twin's copies would have been checked against it."""
    exit_code = 36


class SpeculatorsModelError(SpeculatorsError):
    """A speculators-format config the artifact format cannot express: a
    ``speculators_model_type`` other than dspark or dflash, a ``transformer_layer_config``
    that is not Qwen3's (speculators 0.9.0's DSpark and DFlash layers are Qwen3's, so a Gemma4
    DSpark drafter has no speculators form), a ``target_hidden_size`` other than the hidden
    size, or an algorithm or proposal that contradicts the config."""
    exit_code = 37


class SampleFromAnchorOptionError(SpeculatorsError):
    """--sample-from-anchor given for a source that is not in speculators' format (DeepSpec's
    layout is always anchor first), or contradicting the value its config.json states."""
    exit_code = 38


# --- artifacts (validate / inspect) --------------------------------------------------------

class ArtifactError(DSparkError):
    kind = "artifact"


class InvalidArtifactError(ArtifactError):
    """The artifact directory is missing or lacks drafter.gguf / manifest.json."""
    exit_code = 40


class GGUFFormatError(ArtifactError):
    """drafter.gguf cannot be parsed within bounds (truncated, counts, lengths, offsets)."""
    exit_code = 41


class ManifestError(ArtifactError):
    """manifest.json is not JSON or does not follow schemas/manifest.schema.json."""
    exit_code = 42


class MetadataError(ArtifactError):
    """A GGUF metadata key is missing, unexpected, of the wrong type, or has a bad value."""
    exit_code = 43


class IntegrityError(ArtifactError):
    """A size or SHA-256 differs from the one the manifest records."""
    exit_code = 44


class StrataRuleError(ArtifactError):
    """The artifact breaks a rule an engine's loader applies (the engines' rules,
    artifact/engines.py); also `validate --strict` and the gate's strict policy when a
    check only warned."""
    exit_code = 45


class ManifestMismatchError(ArtifactError):
    """The manifest disagrees with the GGUF (contract, tensor list, config)."""
    exit_code = 46


class EngineRequirementError(ArtifactError):
    """`validate --require ENGINE`: that engine (strata.open, strata.run, llama.cpp) does
    not accept the artifact; its first reason is named."""
    exit_code = 47


class QuantizedTensorError(ArtifactError):
    """A quantized tensor breaks its rules: a type strata.dflash.quantization does not
    name, a norm or head tensor that must stay BF16, a block scale that is NaN or
    infinite."""
    exit_code = 48


class FormatVersionMismatchError(ArtifactError):
    """manifest.json's format_version is not the version drafter.gguf's
    dspark.format_version holds (1 for Qwen3, 2 for a drafter family such as Gemma4); the
    one legacy case docs/ARTIFACT_FORMAT.md names (a Gemma4 manifest of version 1) is a
    warning instead."""
    exit_code = 49


# --- the Hugging Face Hub and pins (exit codes 50-59; dspark_convert/hub.py) ---------------

# (hub errors go here)

class HubError(DSparkError):
    kind = "hub"


class HubRepoNotFoundError(HubError):
    """The Hub repository does not exist (or is private or gated and no token gives access)."""
    exit_code = 50


class HubRevisionNotFoundError(HubError):
    """The commit, branch or tag is not in the Hub repository."""
    exit_code = 51


class HubFileNotFoundError(HubError):
    """A file conversion needs (config.json, weights, a shard) is not in the repository at
    that commit."""
    exit_code = 52


class HubOfflineError(HubError):
    """Offline (HF_HUB_OFFLINE=1) and the pinned commit's files are not in the local cache."""
    exit_code = 53


class HubNetworkError(HubError):
    """The Hub could not be reached or kept failing (connection, timeout, 5xx) after retries."""
    exit_code = 54


class HubTruncatedDownloadError(HubError):
    """A download ended short of the size the Hub declares."""
    exit_code = 55


class HubIntegrityError(HubError):
    """A file's SHA-256 (or git blob SHA-1) differs from the Hub's metadata or the cache's
    content address, or the Hub served another commit than the one pinned."""
    exit_code = 56


class PinMismatchError(HubError):
    """A file's SHA-256 differs from the one pinned with --sha256, or a pin names a file
    that is not downloaded."""
    exit_code = 57


class LockMismatchError(HubError):
    """The source differs from the lock file: another repo or commit, a missing, extra or
    changed file."""
    exit_code = 58


class HubSpecError(HubError):
    """A source spec, --sha256 pin or lock file that cannot be used: malformed, or a branch
    or tag given without --resolve."""
    exit_code = 59


# --- the target: geometry, embedding identity, tokenizer (exit codes 60-69) ----------------

# (target errors go here)

class TargetError(DSparkError):
    kind = "target"


class TargetNotFoundError(TargetError):
    """The target (directory, its config.json, weights or tokenizer.json) is missing or
    unreadable."""
    exit_code = 60


class TargetFormatError(TargetError):
    """The target's config.json, safetensors headers or tokenizer.json is malformed, or it
    lacks a tensor the pairing needs."""
    exit_code = 61


class TargetFamilyError(TargetError):
    """The target is of another drafter family than the drafter (a Gemma4 drafter on a
    Qwen3 target, a Qwen3 drafter on a gemma4 / gemma4_unified target), or of a family
    whose targets no reader reads; named by its model_type and both families."""
    exit_code = 68


class TargetGeometryError(TargetError):
    """Drafter and target disagree on the model type, hidden size, rope theta or RMS eps
    (Gemma4: also the full-attention heads, global head dim, KV heads and k_eq_v, the RoPE
    type and partial factor, and the logit softcap)."""
    exit_code = 62


class TargetVocabError(TargetError):
    """Drafter and target disagree on the vocabulary size, or the tokenizer has more tokens
    than the embedding has rows."""
    exit_code = 63


class TargetLayerMismatchError(TargetError):
    """num_target_layers differs from the target's layer count, or a tap is not a layer of
    the target or is its last one."""
    exit_code = 64


class EmbeddingIdentityError(TargetError):
    """The drafter's embed_tokens / lm_head (or the hashes an artifact records) differ
    from the target's."""
    exit_code = 65


class TokenizerMismatchError(TargetError):
    """The tokenizer fingerprint an artifact records differs from the target's."""
    exit_code = 66


class MaskTokenCollisionError(TargetError):
    """The mask token is outside the target's embedding, or a token its tokenizer
    produces for ordinary text."""
    exit_code = 67


# --- the reference runtime and `dspark smoke` (exit codes 70-79) ----------------------------

# (runtime errors go here)

class RuntimeRefusal(DSparkError):
    kind = "runtime"


class RuntimeTargetError(RuntimeRefusal):
    """The target directory cannot be run by the reference runtime (missing or unreadable
    config/weights, not a dense Qwen3 or a Gemma4 text model the runtime computes exactly, a
    tensor missing or misshapen)."""
    exit_code = 70


class DeviceUnavailableError(RuntimeRefusal):
    """--device cuda was asked for but CUDA is not available."""
    exit_code = 72


class SmokeInputError(RuntimeRefusal):
    """A smoke input is unusable: empty prompt, a token id outside the vocabulary, --prompt
    without tokenizer.json, an option out of range."""
    exit_code = 73


class LosslessnessError(RuntimeRefusal):
    """At temperature 0 the speculative output differs from the target's own greedy output."""
    exit_code = 74


class ReferenceDivergenceError(RuntimeRefusal):
    """The run differs from the reference trace (first run, cycle and field named)."""
    exit_code = 75


class AcceptanceFloorError(RuntimeRefusal):
    """The mean acceptance length tau is below the --min-tau floor."""
    exit_code = 76


class ReferenceTraceError(RuntimeRefusal):
    """The reference trace file is unreadable, malformed, or has no run for these settings."""
    exit_code = 77


class MemoryBudgetError(RuntimeRefusal):
    """The run's memory estimate (weights in the compute dtype, caches, activations, the
    runtime itself) exceeds what the device has available now, or --max-memory."""
    exit_code = 78


class FamilyRuntimeError(RuntimeRefusal):
    """An artifact of a drafter family the reference runtime does not run (none today:
    every family in contract/families.py names its runtime module): smoke and eval refuse
    it before the target is read."""
    exit_code = 79


class NumericOverflowError(RuntimeRefusal):
    """A model's forward pass gave NaN or infinity (its logits or confidence logits): the
    weights are finite but too large for the compute dtype (runtime/sampling.py). (A code
    apart from the runtime's 70s, which were all taken when it came.)"""
    exit_code = 99


# --- `dspark quantize` (exit codes 80-84; dspark_convert/commands/quantize.py) -------------

class QuantizeError(DSparkError):
    kind = "quantize"


class ParentArtifactError(QuantizeError):
    """The parent artifact given to `dspark quantize` does not pass `dspark validate`
    (its first failed check is named)."""
    exit_code = 80


class QuantRowWidthError(QuantizeError):
    """A matrix to quantize has a row width (GGUF ne0) that is not a multiple of the
    32-value block."""
    exit_code = 81


class QuantScaleOverflowError(QuantizeError):
    """A block of 32 values is too large for the type: its F16 scale would be infinite."""
    exit_code = 82


class QuantizedParentError(QuantizeError):
    """The parent artifact is already quantized; quantize from the BF16 artifact."""
    exit_code = 83


class QuantTypeError(QuantizeError):
    """--type or --heads names a type other than q8_0, q5_0, q4_0."""
    exit_code = 84


class FamilyQuantizeError(QuantizeError):
    """A parent artifact of a drafter family the quantized format does not define: a
    DFlash2 drafter or a Gemma 4 assistant (contract/families.py: quantize is not among
    their artifact commands)."""
    exit_code = 85


# --- `dspark eval`: prompt sets, options, calibration (exit codes 90-93) --------------------

class EvalRefusal(DSparkError):
    kind = "eval"


class PromptSetError(EvalRefusal):
    """The prompt set is unusable: unreadable, not JSONL, a line that breaks the schema
    (named by its line number), duplicate ids, a token outside the vocabulary, text without
    the target's tokenizer.json, or no prompt at all."""
    exit_code = 90


class EvalInputError(EvalRefusal):
    """An eval option is unusable: no artifact, the same artifact twice, a temperature,
    threshold, --held-out or --max-new-tokens out of range."""
    exit_code = 91


class CalibrationFileError(EvalRefusal):
    """A calibration.json is unreadable, not JSON, or does not follow its schema."""
    exit_code = 92


class CalibrationMismatchError(EvalRefusal):
    """The calibration was fitted for another artifact (drafter.gguf SHA-256), another
    target, or another block size than the one it is applied to."""
    exit_code = 93


# --- `dspark conform`: an engine's drafts against the reference runtime's (exit codes 94-98;
# dspark_convert/commands/conform.py, the trace format in evaluation/conform.py) ------------

class ConformRefusal(DSparkError):
    kind = "conform"


class TraceFormatError(ConformRefusal):
    """The trace given to `dspark conform` is unusable: not found, unreadable, over its
    bounds (bytes, a line's bytes, lines), not UTF-8 JSONL, or a line that breaks the
    format (not JSON, duplicate keys, an unknown or missing key, a token id that is a
    boolean, not an integer or negative, an empty context or draft, an empty id), named by
    its line number; or no line at all."""
    exit_code = 94


class TraceRangeError(ConformRefusal):
    """A trace line that does not fit the artifact and its target: a token id outside the
    target's vocabulary, a draft longer than the drafter's block, or a context that with the
    block runs past the target's positions (the line number named)."""
    exit_code = 95


class ConformInputError(ConformRefusal):
    """A `dspark conform` option is unusable: --device or --dtype not one of its values, a
    --max-memory size that does not parse."""
    exit_code = 96


class DraftMismatchError(ConformRefusal):
    """`dspark conform`: the engine's drafts are not the reference runtime's. The first
    difference is named: its trace line, the position, both tokens, the row offset when
    the engine's draft is the reference's read late, and the reference's logit margin
    (a near tie says so); the report (-o) has the agreement by position."""
    exit_code = 97


# --- `dspark export`: an artifact laid out for another engine (exit codes 100-109;
# dspark_convert/commands/export.py, export_deepspec.py) -------------------------------------

class ExportRefusal(DSparkError):
    kind = "export"


class ExportArtifactError(ExportRefusal):
    """The artifact given to `dspark export` does not pass `dspark validate` (its first
    failed check is named)."""
    exit_code = 100


class EngineMarkovHeadError(ExportRefusal):
    """The artifact's Markov head is of a type the engine does not implement (llama.cpp
    0c1e570: only the vanilla head; a gated or rnn head is refused)."""
    exit_code = 101


class EngineConfidenceHeadError(ExportRefusal):
    """The artifact's confidence head reads no Markov input; the engine implements only the
    head over [hidden; W1[prev]] (llama.cpp 0c1e570: conf_proj.weight is [H + r, 1])."""
    exit_code = 102


class TargetGGUFError(ExportRefusal):
    """--target-gguf names no readable GGUF file (missing, a directory, not GGUF, malformed)."""
    exit_code = 103


class TargetGGUFMismatchError(ExportRefusal):
    """The target GGUF is not the artifact's target: its architecture, hidden size,
    vocabulary, layer count (against the taps), or the embedding / head hash recorded at
    convert differ, or a tokenizer key cannot be carried into the drafter file as read (an
    array of arrays, an empty array); the key or tensor is named."""
    exit_code = 104


class FamilyExportError(ExportRefusal):
    """An artifact of a drafter family the engine cannot run as trained (llama.cpp 0c1e570
    applies no final logit softcap to a Gemma4 DSpark drafter): nothing written."""
    exit_code = 105


class QuantizedExportError(ExportRefusal):
    """A quantized artifact given to `dspark export --engine deepspec`: DeepSpec's layout
    holds the source's BF16 weights, which quantization has lost (export the BF16 parent
    the artifact names)."""
    exit_code = 106


class ExportOptionError(ExportRefusal):
    """`dspark export`'s options do not fit the engine: --engine llama.cpp needs
    --target-gguf, --engine deepspec needs --target, and an option of the other engine
    (--target, --target-gguf, --keep-embedding) is refused rather than ignored."""
    exit_code = 107


class ExportConfigSizeError(ExportRefusal):
    """The config.json `dspark export --engine deepspec|speculators` would write from the
    artifact (manifest.json's source.config, laid out as save_pretrained writes one) is over
    the size every config reader here accepts: the export would not read back as the
    checkpoint it stands for. A manifest convert wrote never is; a hand-made one can be."""
    exit_code = 86


# --- another engine's own runs beside ours: `dspark eval --engine` (exit codes 110-119;
# dspark_convert/evaluation/engine_llama_cpp.py) ---------------------------------------------

class EngineError(DSparkError):
    kind = "engine"


class EngineOptionError(EngineError):
    """--engine is not llama.cpp=BIN_DIR or dspark-mlx[=PYTHON], names one engine twice, or
    llama.cpp comes without the --target-gguf its runs need (or the reverse)."""
    exit_code = 110


class EngineBinaryError(EngineError):
    """The engine's directory lacks a binary the eval runs (llama-speculative-simple,
    llama-completion), or one is not an executable file."""
    exit_code = 111


class EngineRunError(EngineError):
    """An engine binary failed: a non-zero exit, a signal, a timeout, or an exit that left a
    process it started holding its output (stopped, with every process it started, 2 s
    after). Named in one line:
    the binary and which run (artifact, --spec-type, prompt), the signal by name, the
    command line, the engine's last log lines and, where its log shows one, the likely
    cause (weights repacked for AMX: --no-repack avoids it)."""
    exit_code = 112


class EngineOutputError(EngineError):
    """The engine's output cannot be read as expected: a line the parser needs is missing,
    a field is malformed or out of range (a token id outside the vocabulary, a count or a
    rate out of bounds, a timing not in printf's form), a line is not where llama.cpp
    writes it, the log exceeds its bound, or what it printed contradicts itself (a draft's
    context length, the prompt's token count); the eval refuses rather than guess."""
    exit_code = 113


# dspark-mlx's runs (dspark_convert/evaluation/engine_dspark_mlx.py): a Python library run by
# a script of ours in its own interpreter, its records read back as llama.cpp's log is.

class MlxInstallError(EngineError):
    """--engine dspark-mlx[=PYTHON]: the interpreter does not exist, is not an executable
    file or cannot be run, or it runs another dspark-mlx or mlx than the eval reads
    (dspark-mlx 0.1.0 with mlx 0.32.4: `make dspark-mlx` installs them)."""
    exit_code = 114


class MlxRunError(EngineError):
    """A dspark-mlx run failed: a non-zero exit (its traceback's last line names the
    exception), a signal, a timeout, or an exit that left a process it started holding its
    records or its output (stopped, with every process it started, 2 s after); named in one
    line with the run (the target alone,
    an artifact), the command line and the engine's last lines of output."""
    exit_code = 115


class MlxOutputError(EngineError):
    """dspark-mlx's records cannot be read as expected: a record that is not one strict JSON
    object of its kind's keys and types, out of its place, out of range (a token id outside
    the vocabulary, a block of another size, a time longer than the run), over its bound,
    or contradicting itself (the committed positions a draft was made from, a cycle's tokens
    that are not its accepted drafts and one more, a summary's counts); the eval refuses
    rather than guess."""
    exit_code = 116


class MlxWeightsError(EngineError):
    """The checkpoint handed to dspark-mlx would leave a parameter it builds at its random
    initialisation (dspark-mlx checks unexpected keys only, never missing ones: a missing
    embed_tokens or lm_head is silently random); named, with every such parameter. A
    confidence head's alone is reported, not refused: advisory, unused at threshold 0."""
    exit_code = 117


# --- `dspark gate`: the release policy and its verdict (exit codes 120-129) -----------------

class GateError(DSparkError):
    kind = "gate"


class GatePolicyError(GateError):
    """The gate's policy file is unusable: not TOML, an unknown or mistyped key, a missing
    one, a duplicate drafter name, a source or target that is not pinned (named by its
    drafter and key)."""
    exit_code = 120


class GateFailedError(GateError):
    """The gate ran and at least one drafter failed a stage (gate.json, gate.md and
    junit.xml in the output directory name each failed stage)."""
    exit_code = 121


class GateBaselineError(GateError):
    """--baseline: the directory, its gate.json, or the report in it is missing, malformed
    or incomplete."""
    exit_code = 122


class GateSelectionError(GateError):
    """--only NAME names no drafter of the policy."""
    exit_code = 123


class ReproducibilityError(GateError):
    """The gate's reproducibility stage: drafter.gguf rebuilt from the pinned source has
    another SHA-256 than the one the policy records, and the policy states no reason
    (``changed_because``)."""
    exit_code = 124


class AcceptanceRegressionError(GateError):
    """The gate's regression stage: tau below the policy's min_tau, or tau or the acceptance
    at a draft position dropped more than allowed against --baseline (or the baseline was
    measured with other settings)."""
    exit_code = 125


class GateEngineError(GateError):
    """The gate's llama.cpp stage: for a drafter that requires llama.cpp, llama.cpp's own
    run of the exported artifact is not lossless, its drafts differ from the reference
    runtime's (the first difference named), it could run no artifact or no prompt, or it
    compared nothing (no draft, or no text compared with the target alone): nothing
    compared is never a pass."""
    exit_code = 126


# --- verify-length scheduling: policies and the target's cost table (exit codes 140-142;
# dspark_convert/scheduling/; 130 and 143 are SIGINT and SIGTERM) ---------------------------

class SchedulingError(DSparkError):
    kind = "scheduling"


class SchedulingPolicyError(SchedulingError):
    """A verify-length policy cannot be used as given: its name is none of the table's
    (full, threshold=X, dspark, dspark-async, target-only), its parameter is missing, not
    wanted or out of range, or what it is handed is not a step it can decide (a confidence
    not a number in [0, 1], dspark-async without the confidences of two steps earlier)."""
    exit_code = 140


class CostTableError(SchedulingError):
    """A cost table (the target's verify steps per second by batch tokens) cannot be read:
    not a regular file, over its size bound, not strict JSON, a field missing, extra or of
    the wrong type, no entries, `tokens` and `steps_per_second` of different lengths,
    tokens not strictly increasing positive integers, or a rate not finite and positive."""
    exit_code = 141


class CostTableRangeError(SchedulingError):
    """A verify step of B tokens was looked up in a cost table whose largest entry is
    smaller (or B is not a positive integer): the table does not say what that step costs,
    and no rate is guessed for it."""
    exit_code = 142


class ProfileInputError(SchedulingError):
    """`dspark profile` cannot measure as asked: --tokens is not a comma list of strictly
    increasing positive integers (or is given with --max-tokens), --max-tokens, --context or
    --repeats is below 1, the warm-up runs are negative, or --device / --dtype is none of
    its values."""
    exit_code = 144


class ProfileRangeError(SchedulingError):
    """The profile does not fit the target: the context plus a request's block is beyond the
    target's context (max_position_embeddings), or the largest batch is over 65,536 tokens;
    nothing is loaded."""
    exit_code = 145


class DecisionsError(SchedulingError):
    """A decisions file (decisions.jsonl: one verify step a line, what a scheduler saw and
    chose) cannot be read: not a regular file, empty, over its size bounds, not UTF-8,
    a blank line, a line not strict JSON or not an object, a field missing, extra or of the
    wrong type, a confidence outside [0, 1], accepted above length, length above the
    block, an id repeated within a step, steps not consecutive from 0, or two policies in
    one file."""
    exit_code = 146


class SchedulerMismatchError(SchedulingError):
    """A scheduler's recorded decisions are not what the policy they claim chooses on the
    recorded confidences (`dspark simulate --check`): the first step and request that
    differ, the length expected and found, and why (a length Algorithm 1 would not choose,
    the stop skipped, a budget from fresher confidences than §5.2 allows)."""
    exit_code = 147


class ConcurrencyError(SchedulingError):
    """A concurrency list (`--concurrency` of `simulate` and `serve-bench`) is not a comma
    list of positive integers, strictly increasing (at most 64 of them, each at most
    65,536), is given with `simulate --check`, or asks `serve-bench` for more requests in
    flight than there are prompts."""
    exit_code = 148


# --- DFlash2 (speculators' dflash2 drafter) in the reference runtime ------------------------

class DFlash2ConfigError(ContractViolation):
    """A DFlash2 drafter's config.json is not one the reference runtime computes as
    speculators 0.9.0's DFlash2DraftModel does: not an object, a field missing, of the wrong
    type or out of range, another architecture or speculators_model_type (z-lab's flat
    layout included), fields that contradict each other or speculators' own constraints
    (conv_group_size not dividing hidden_size, conv_kernel_size over block_size,
    selector_top_k over the vocabulary, draft_vocab_size not the vocabulary, layer_types not
    one sliding_attention / full_attention per layer, a sliding layer without a window, the
    mask token outside the vocabulary), or what the runtime does not compute (biases,
    another activation, RoPE scaling, sample_from_anchor true)."""
    exit_code = 150


class DFlash2RunError(RuntimeRefusal):
    """A DFlash2 drafter cannot run against this target or as asked: a tapped hidden state
    the target does not have, a hidden size or vocabulary other than the target's, or a
    temperature above 0 (speculators 0.9.0 has no sampled selector walk, only the greedy
    one)."""
    exit_code = 151


# --- the Gemma 4 assistant (MTP drafter) in the reference runtime --------------------------

class AssistantConfigError(ContractViolation):
    """A Gemma 4 assistant's config.json (or generation_config.json) is not one the
    reference runtime computes as transformers' Gemma4UnifiedAssistantForCausalLM does: not
    an object, a field missing, of the wrong type or out of range, another architecture or
    model_type, a layer with KV projections of its own (num_kv_shared_layers below the layer
    count), MoE, per-layer inputs, a double-wide MLP, biases, another activation or RoPE,
    ordered (centroid-masked) embeddings, or an untied head."""
    exit_code = 152


class AssistantTargetError(RuntimeRefusal):
    """A Gemma 4 assistant cannot run against this target: its backbone_hidden_size is not
    the target's hidden size, its vocabulary differs, or one of its layers reads a KV of a
    type the target has not or of another geometry (head_dim, KV heads) than the target's
    last layer of that type; or its loop is asked for a KV mode it does not have (clean_kv,
    transformers)."""
    exit_code = 153


# --- llama.cpp 0c1e570 and the DFlash2 / Gemma 4 assistant drafters -------------------------

class LlamaCppDFlash2Error(ExportRefusal):
    """A DFlash2 drafter llama.cpp 0c1e570 cannot run as the reference runtime computes it,
    or a target GGUF it cannot run beside: sliding layers that are block-causal
    (sliding_window_non_causal false: llama.cpp's DFlash graph has one mask for every
    layer), a hidden size below top_k x (top_k + 1) or not a multiple of conv_group_size
    (src/models/dflash.cpp refuses both), a target GGUF of another architecture, hidden
    size, vocabulary or layer count than the drafter's."""
    exit_code = 157


class LlamaCppAssistantError(ExportRefusal):
    """A Gemma 4 assistant llama.cpp 0c1e570 cannot run as the reference runtime computes
    it, or a target GGUF it cannot run beside: ordered (centroid-masked) embeddings
    (llama.cpp drops them and computes dense logits), a hidden size equal to the
    backbone's or K and V head sizes that differ (src/models/gemma4-assistant.cpp refuses
    both), a target GGUF that is not gemma4, of another hidden size or vocabulary, or whose
    last two layers are not [sliding, full] (llama.cpp's assistant reads the KV of those two
    layers) of the assistant's geometry."""
    exit_code = 158


# --- DFlash2 and Gemma 4 assistant artifacts (convert, validate, the runtime's loaders) -------

class DFlash2TargetError(TargetError):
    """A DFlash2 drafter and the target it is converted or validated against disagree: a
    target that is not a Qwen3 model, another hidden size (fc reads m x hidden_size
    features) or vocabulary (the selector's codebooks index it), a tapped hidden state the
    target does not have (aux_hidden_state_layer_ids are HF hidden_states indices, 0 the
    embedding, num_hidden_layers the last), or an embedding hash other than the one the
    artifact recorded."""
    exit_code = 154


class KindTargetRequiredError(TargetError):
    """A DFlash2 drafter or a Gemma 4 assistant converted without --target: neither
    records what only its target holds (the embedding it reads, the hidden size, layers
    and KV it is checked against), so the artifact is made against one."""
    exit_code = 155


class ArtifactKindError(ArtifactError):
    """An artifact handed to the loader of another drafter kind (a DSpark artifact to the
    DFlash2 runtime, a DFlash2 one to the assistant's), or a directory that is neither an
    artifact nor a checkpoint of the kind."""
    exit_code = 156


# --- `dspark conform --diagnose` (exit codes 162-164; evaluation/misreadings.py) --------------

class MisreadingDiagnosedError(DraftMismatchError):
    """`dspark conform --diagnose`: the engine's drafts are not the reference runtime's,
    and one named misreading of the table in docs/CONFORMANCE.md (or a pair of them)
    reproduces every differing draft diagnosed: named with its fix. Still a failure; a
    diagnosis that explains only some of them, or none, is DraftMismatchError (97)."""
    exit_code = 162


class InternalError(DSparkError):
    """A bug: an unexpected exception; --debug shows its traceback."""
    exit_code = 1


def _all_error_classes() -> list[type[DSparkError]]:
    seen: list[type[DSparkError]] = []
    stack = [DSparkError]
    while stack:
        cls = stack.pop()
        if cls in seen:         # a class of two kinds (AnchorLayoutError) is met twice
            continue
        seen.append(cls)
        stack.extend(reversed(cls.__subclasses__()))
    return seen


def concrete_errors() -> list[type[DSparkError]]:
    """The classes that are raised (have their own exit code), in exit-code order."""
    classes = [c for c in _all_error_classes()
               if "exit_code" in c.__dict__ and c not in (DSparkError,)]
    return sorted(classes, key=lambda c: c.exit_code)


# Exit code -> class name; 0 is success and 2 is a command-line usage error (typer/click).
EXIT_CODES: dict[int, str] = {c.exit_code: c.__name__ for c in concrete_errors()}
