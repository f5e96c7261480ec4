"""The closed error hierarchy of dspark-convert.

Every refusal the tool can make is one class here. Each class carries a stable exit code
and a one-line message that names the file, field or tensor, what was expected and what
was found. The CLI maps these to output and exit codes (``cli/errors.py``); library code
raises them and never prints or exits. The table ``EXIT_CODES`` is the single source for
the README's exit-code table (a test keeps the two in agreement).
"""

from __future__ import annotations


class DSparkError(Exception):
    """Base of every refusal. ``exit_code`` is stable and documented in the README."""

    exit_code: int = 1
    kind: str = "error"

    def __init__(self, message: str, *, path: str | None = None, field: str | None = None,
                 tensor: str | None = None, expected: object = None, found: object = None):
        # The message is one line: newlines would break the CLI's one-line contract.
        self.message = " ".join(str(message).split())
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
                out[key] = value if isinstance(value, (int, float, str, bool, list)) else str(value)
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
    """An architecture other than Qwen3DSparkModel."""
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
    """The artifact breaks a rule Strata's DFlash loader applies."""
    exit_code = 45


class ManifestMismatchError(ArtifactError):
    """The manifest disagrees with the GGUF (contract, tensor list, config)."""
    exit_code = 46


# --- the Hugging Face Hub and pins (exit codes 50-59; dspark_convert/hub.py) ---------------

# (hub errors go here)


# --- the target: geometry, embedding identity, tokenizer (exit codes 60-69) ----------------

# (target errors go here)


# --- the reference runtime and `dspark smoke` (exit codes 70-79) ----------------------------

# (runtime errors go here)


class InternalError(DSparkError):
    """A bug: an unexpected exception; --debug shows its traceback."""
    exit_code = 1


def _all_error_classes() -> list[type[DSparkError]]:
    seen: list[type[DSparkError]] = []
    stack = [DSparkError]
    while stack:
        cls = stack.pop()
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
