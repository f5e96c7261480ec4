"""The feature contract: what a DSpark checkpoint declares and what it must hold.

Two pydantic v2 models:

* ``DSparkConfig`` reads ``config.json`` of a ``Qwen3DSparkModel`` checkpoint strictly: no
  coercion ("7" or ``true`` is not an int), no defaults for geometry, unknown fields kept
  (they are copied verbatim into the manifest) but never used.
* ``FeatureContract`` is derived from it: family, geometry, target feature taps, block
  layout, attention, Markov head, confidence head and the exact tensor inventory with
  concrete shapes, computed from ``tensor_table.TENSOR_RULES``.

``build_contract`` applies the semantic rules of docs/ARTIFACT_FORMAT.md and raises the specific
error class of each refusal. ``check_inventory`` compares a checkpoint's tensors with it.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from dspark_convert.errors import (
    ConfigError,
    GeometryLimitError,
    HeadConfigMismatchError,
    MaskTokenError,
    MissingTensorError,
    TargetLayerError,
    TensorDtypeError,
    TensorShapeError,
    UnexpectedTensorError,
    UnsupportedArchitectureError,
    UnsupportedFeatureError,
)
from dspark_convert.contract.tensor_table import TENSOR_RULES, TensorRule, eval_dim, expand_rule, pretty_dim

FAMILY = "qwen3-dspark"
ARCHITECTURE = "Qwen3DSparkModel"

# Limits Strata's loader applies (docs/REFERENCE.md §3) and the format inherits.
MAX_BLOCK_SIZE = 128
MAX_DRAFT_LAYERS = 64
MAX_TARGET_TAPS = 64

# Source dtypes we accept; everything is written as BF16 (F32/F16 rounded, nearest-even).
SOURCE_DTYPES = ("BF16", "F16", "F32")
CONFIG_DTYPE_NAMES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}

MarkovHeadType = Literal["vanilla", "gated", "rnn"]


class _Strict(BaseModel):
    # Unknown config.json fields are kept (the manifest copies the config verbatim) but
    # no code reads them.
    model_config = ConfigDict(strict=True, extra="allow", frozen=True)


class _Contract(BaseModel):
    # Our own records: nothing unknown is accepted when one is read back from a manifest.
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class RopeParameters(_Strict):
    rope_theta: float
    rope_type: str


class DSparkConfig(_Strict):
    """config.json of a Qwen3DSparkModel checkpoint (docs/REFERENCE.md §1).

    Geometry fields are required. ``markov_head_type`` exists only when
    ``markov_rank > 0`` and ``confidence_head_with_markov`` only with a confidence head,
    exactly as DeepSpec's ``build_draft_config`` writes them.
    """

    architectures: list[str]
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    attention_bias: bool
    hidden_act: str
    num_target_layers: int
    target_layer_ids: list[int]
    block_size: int
    mask_token_id: int
    markov_rank: int
    enable_confidence_head: bool
    markov_head_type: MarkovHeadType | None = None
    confidence_head_with_markov: bool | None = None
    # RoPE: transformers 5 writes rope_parameters; 4.x wrote rope_theta (+ rope_scaling).
    rope_parameters: RopeParameters | None = None
    rope_theta: float | None = None
    rope_scaling: dict | None = None
    use_sliding_window: bool | None = None
    dtype: str | None = None
    torch_dtype: str | None = None


class Geometry(_Contract):
    hidden_size: int
    intermediate_size: int
    num_draft_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float


class FeatureTaps(_Contract):
    """Which target hidden states are fused, in which order, and how wide the result is."""

    num_target_layers: int
    target_layer_ids: list[int]       # DeepSpec ids, unchanged (Strata's convention)
    hidden_state_indices: list[int]   # id + 1: index into HF hidden_states (0 = embeddings)
    feature_width: int                # m * hidden_size, the input width of fc


class BlockLayout(_Contract):
    block_size: int
    mask_token_id: int
    anchor_first: Literal[True]       # query j predicts position start+1+j


class Attention(_Contract):
    causal: Literal[False]            # block rows attend to each other both ways
    bias: Literal[False]


class MarkovHead(_Contract):
    rank: int
    type: Literal["none", "vanilla", "gated", "rnn"]


class ConfidenceHead(_Contract):
    enabled: bool
    with_markov: bool


class TensorSpec(_Contract):
    source_name: str
    gguf_name: str | None             # None: hashed and stripped, never written
    shape: list[int]                  # torch order [out, in]
    gguf_shape: list[int]             # GGUF order [ne0 = in, ne1 = out]
    shape_expr: list[str]             # the table's expressions, for messages and docs
    kind: Literal["matrix", "norm", "bias", "embedding"]
    required: bool


class FeatureContract(_Contract):
    family: Literal["qwen3-dspark"]
    architecture: Literal["Qwen3DSparkModel"]
    geometry: Geometry
    taps: FeatureTaps
    block: BlockLayout
    attention: Attention
    markov_head: MarkovHead
    confidence_head: ConfidenceHead
    tensors: list[TensorSpec]

    def symbols(self) -> dict[str, int]:
        g = self.geometry
        rank = self.markov_head.rank
        return {
            "H": g.hidden_size, "I": g.intermediate_size, "V": g.vocab_size,
            "nh": g.num_attention_heads, "nkv": g.num_key_value_heads, "d": g.head_dim,
            "m": len(self.taps.target_layer_ids), "r": rank,
            "rc": rank if self.confidence_head.with_markov else 0,
        }

    def tensor(self, source_name: str) -> TensorSpec | None:
        for spec in self.tensors:
            if spec.source_name == source_name:
                return spec
        return None

    @property
    def written_tensors(self) -> list[TensorSpec]:
        return [t for t in self.tensors if t.gguf_name is not None]


# --- parsing config.json ------------------------------------------------------------------

def _describe(value: object) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"


_EXPECTED_BY_ERROR = {
    "int_type": "an integer", "float_type": "a number", "bool_type": "true or false",
    "string_type": "a string", "list_type": "a list", "dict_type": "an object",
    "model_type": "an object", "missing": "a value", "literal_error": None,
}


def parse_config(data: object, *, path: str = "config.json") -> DSparkConfig:
    """Validate the parsed JSON of config.json; ConfigError names the first bad field."""
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object, found {type(data).__name__}",
                          path=path, expected="object", found=type(data).__name__)
    try:
        return DSparkConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "<root>"
        expected = _EXPECTED_BY_ERROR.get(err["type"]) or err["msg"].removeprefix("Input should be ")
        if err["type"] == "missing":
            message = f"{path}: required field '{field}' is missing"
            found = "nothing"
        else:
            found = _describe(err.get("input"))
            message = f"{path}: field '{field}': expected {expected}, found {found}"
        raise ConfigError(message, path=path, field=field, expected=expected, found=found) from None


# --- semantic rules -----------------------------------------------------------------------

def _rope_theta(cfg: DSparkConfig, path: str) -> float:
    thetas = []
    if cfg.rope_parameters is not None:
        if cfg.rope_parameters.rope_type != "default":
            raise UnsupportedFeatureError(
                f"{path}: field 'rope_parameters.rope_type': expected 'default', found "
                f"{cfg.rope_parameters.rope_type!r} (RoPE scaling is not expressible in the format)",
                path=path, field="rope_parameters.rope_type", expected="default",
                found=cfg.rope_parameters.rope_type)
        thetas.append(("rope_parameters.rope_theta", cfg.rope_parameters.rope_theta))
    if cfg.rope_theta is not None:
        thetas.append(("rope_theta", cfg.rope_theta))
    if cfg.rope_scaling is not None:
        raise UnsupportedFeatureError(
            f"{path}: field 'rope_scaling': expected null, found {cfg.rope_scaling!r} "
            "(RoPE scaling is not expressible in the format)",
            path=path, field="rope_scaling", expected=None, found=str(cfg.rope_scaling))
    if not thetas:
        raise ConfigError(f"{path}: required field 'rope_parameters.rope_theta' (or 'rope_theta') is missing",
                          path=path, field="rope_parameters.rope_theta", expected="a number",
                          found="nothing")
    if len(thetas) == 2 and thetas[0][1] != thetas[1][1]:
        raise ConfigError(f"{path}: field 'rope_theta' is {thetas[1][1]} but "
                          f"'rope_parameters.rope_theta' is {thetas[0][1]}; expected them equal",
                          path=path, field="rope_theta", expected=thetas[0][1], found=thetas[1][1])
    field, theta = thetas[0]
    if not (math.isfinite(theta) and theta > 0):
        raise GeometryLimitError(f"{path}: field '{field}': expected a positive finite number, found {theta}",
                                 path=path, field=field, expected="> 0", found=theta)
    return theta


def _positive(path: str, field: str, value: int, upper: int | None = None) -> None:
    if value <= 0 or (upper is not None and value > upper):
        bound = f"1..{upper}" if upper is not None else "a positive integer"
        raise GeometryLimitError(f"{path}: field '{field}': expected {bound}, found {value}",
                                 path=path, field=field, expected=bound, found=value)


def _check_taps(cfg: DSparkConfig, path: str) -> None:
    ids = cfg.target_layer_ids
    n = cfg.num_target_layers
    field = "target_layer_ids"
    if not ids:
        raise TargetLayerError(f"{path}: field '{field}': expected at least one target layer, found []",
                               path=path, field=field, expected="non-empty", found=[])
    if len(ids) > MAX_TARGET_TAPS:
        raise TargetLayerError(f"{path}: field '{field}': expected at most {MAX_TARGET_TAPS} taps, "
                               f"found {len(ids)}", path=path, field=field,
                               expected=MAX_TARGET_TAPS, found=len(ids))
    for pos, layer in enumerate(ids):
        where = f"{path}: field '{field}[{pos}]'"
        if layer == -1:
            raise TargetLayerError(f"{where}: found -1 (the embedding output), which the Strata "
                                   "format cannot express; expected a layer id in "
                                   f"[0, {n - 2}]", path=path, field=f"{field}[{pos}]",
                                   expected=f"0..{n - 2}", found=layer)
        if layer < 0 or layer >= n:
            raise TargetLayerError(f"{where}: expected a layer id in [0, {n - 2}] "
                                   f"(num_target_layers = {n}), found {layer}",
                                   path=path, field=f"{field}[{pos}]", expected=f"0..{n - 2}",
                                   found=layer)
        if layer == n - 1:
            raise TargetLayerError(f"{where}: found {layer}, the target's last layer, whose HF "
                                   f"hidden state is post-norm; expected a layer id in [0, {n - 2}]",
                                   path=path, field=f"{field}[{pos}]", expected=f"0..{n - 2}",
                                   found=layer)
        if pos and layer <= ids[pos - 1]:
            raise TargetLayerError(f"{where}: expected ids strictly increasing, found {ids[pos - 1]} "
                                   f"then {layer}", path=path, field=field,
                                   expected="strictly increasing", found=ids)


def _check_heads(cfg: DSparkConfig, path: str) -> None:
    if cfg.markov_rank < 0:
        raise GeometryLimitError(f"{path}: field 'markov_rank': expected >= 0, found {cfg.markov_rank}",
                                 path=path, field="markov_rank", expected=">= 0", found=cfg.markov_rank)
    if cfg.markov_rank > 0 and cfg.markov_head_type is None:
        raise HeadConfigMismatchError(
            f"{path}: field 'markov_head_type' is missing but markov_rank is {cfg.markov_rank}; "
            "expected 'vanilla', 'gated' or 'rnn'", path=path, field="markov_head_type",
            expected="vanilla|gated|rnn", found="nothing")
    if cfg.markov_rank == 0 and cfg.markov_head_type is not None:
        raise HeadConfigMismatchError(
            f"{path}: field 'markov_head_type' is {cfg.markov_head_type!r} but markov_rank is 0; "
            "expected no Markov head type without a Markov head", path=path,
            field="markov_head_type", expected="absent", found=cfg.markov_head_type)
    if cfg.enable_confidence_head and cfg.confidence_head_with_markov is None:
        raise HeadConfigMismatchError(
            f"{path}: field 'confidence_head_with_markov' is missing but enable_confidence_head "
            "is true; expected true or false", path=path, field="confidence_head_with_markov",
            expected="true|false", found="nothing")
    if not cfg.enable_confidence_head and cfg.confidence_head_with_markov is not None:
        raise HeadConfigMismatchError(
            f"{path}: field 'confidence_head_with_markov' is set but enable_confidence_head is "
            "false; expected it absent", path=path, field="confidence_head_with_markov",
            expected="absent", found=cfg.confidence_head_with_markov)
    if cfg.confidence_head_with_markov and cfg.markov_rank == 0:
        raise HeadConfigMismatchError(
            f"{path}: field 'confidence_head_with_markov' is true but markov_rank is 0; "
            "expected false (there are no Markov features)", path=path,
            field="confidence_head_with_markov", expected=False, found=True)


def build_contract(cfg: DSparkConfig, *, path: str = "config.json") -> FeatureContract:
    """Apply the format's rules to a parsed config and derive the feature contract."""
    if cfg.architectures != [ARCHITECTURE]:
        raise UnsupportedArchitectureError(
            f"{path}: field 'architectures': expected ['{ARCHITECTURE}'], found {cfg.architectures}",
            path=path, field="architectures", expected=[ARCHITECTURE], found=cfg.architectures)
    if cfg.attention_bias:
        raise UnsupportedFeatureError(
            f"{path}: field 'attention_bias': expected false, found true "
            "(q/k/v/o biases are not part of the format)", path=path, field="attention_bias",
            expected=False, found=True)
    if cfg.hidden_act != "silu":
        raise UnsupportedFeatureError(
            f"{path}: field 'hidden_act': expected 'silu', found {cfg.hidden_act!r}",
            path=path, field="hidden_act", expected="silu", found=cfg.hidden_act)
    if cfg.use_sliding_window:
        raise UnsupportedFeatureError(
            f"{path}: field 'use_sliding_window': expected false, found true",
            path=path, field="use_sliding_window", expected=False, found=True)
    for field in ("hidden_size", "intermediate_size", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "vocab_size", "num_target_layers"):
        _positive(path, field, getattr(cfg, field))
    _positive(path, "num_hidden_layers", cfg.num_hidden_layers, MAX_DRAFT_LAYERS)
    _positive(path, "block_size", cfg.block_size, MAX_BLOCK_SIZE)
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        raise GeometryLimitError(
            f"{path}: field 'num_key_value_heads': expected a divisor of num_attention_heads "
            f"({cfg.num_attention_heads}), found {cfg.num_key_value_heads}", path=path,
            field="num_key_value_heads", expected=f"divides {cfg.num_attention_heads}",
            found=cfg.num_key_value_heads)
    if not (math.isfinite(cfg.rms_norm_eps) and cfg.rms_norm_eps > 0):
        raise GeometryLimitError(f"{path}: field 'rms_norm_eps': expected a positive finite number, "
                                 f"found {cfg.rms_norm_eps}", path=path, field="rms_norm_eps",
                                 expected="> 0", found=cfg.rms_norm_eps)
    theta = _rope_theta(cfg, path)
    _check_taps(cfg, path)
    if not 0 <= cfg.mask_token_id < cfg.vocab_size:
        raise MaskTokenError(
            f"{path}: field 'mask_token_id': expected a token id in [0, {cfg.vocab_size - 1}] "
            f"(vocab_size = {cfg.vocab_size}), found {cfg.mask_token_id}", path=path,
            field="mask_token_id", expected=f"0..{cfg.vocab_size - 1}", found=cfg.mask_token_id)
    _check_heads(cfg, path)

    markov_type = cfg.markov_head_type if cfg.markov_rank > 0 else "none"
    partial = dict(
        family=FAMILY,
        architecture=ARCHITECTURE,
        geometry=Geometry(
            hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
            num_draft_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
            num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
            vocab_size=cfg.vocab_size, rms_norm_eps=cfg.rms_norm_eps, rope_theta=theta),
        taps=FeatureTaps(
            num_target_layers=cfg.num_target_layers, target_layer_ids=list(cfg.target_layer_ids),
            hidden_state_indices=[i + 1 for i in cfg.target_layer_ids],
            feature_width=len(cfg.target_layer_ids) * cfg.hidden_size),
        block=BlockLayout(block_size=cfg.block_size, mask_token_id=cfg.mask_token_id,
                          anchor_first=True),
        attention=Attention(causal=False, bias=False),
        markov_head=MarkovHead(rank=cfg.markov_rank, type=markov_type),
        confidence_head=ConfidenceHead(enabled=cfg.enable_confidence_head,
                                       with_markov=bool(cfg.confidence_head_with_markov)),
    )
    return contract_with_tensors(partial)


def _rule_applies(rule: TensorRule, markov: MarkovHead, conf: ConfidenceHead) -> bool:
    return {
        "always": True,
        "embedding": True,
        "markov": markov.rank > 0,
        "gated": markov.type == "gated",
        "rnn": markov.type == "rnn",
        "confidence": conf.enabled,
    }[rule.when]


def contract_with_tensors(parts: dict) -> FeatureContract:
    """Complete a contract's parts with the tensor inventory the table implies."""
    skeleton = FeatureContract(**parts, tensors=[])
    values = skeleton.symbols()
    rules = [r for r in TENSOR_RULES
             if _rule_applies(r, skeleton.markov_head, skeleton.confidence_head)]
    # File order: the table's order, with the per-layer rules grouped layer by layer
    # (blk.0.* then blk.1.* ...) where the first per-layer rule stands.
    layer_rules = [r for r in rules if r.per_layer]
    ordered: list[tuple[TensorRule, str, str | None]] = []
    for rule in rules:
        if not rule.per_layer:
            ordered += [(rule, s, g) for s, g, _i in expand_rule(rule, 0)]
        elif rule is layer_rules[0]:
            for layer in range(skeleton.geometry.num_draft_layers):
                for lr in layer_rules:
                    ordered.append((lr, lr.source.format(i=layer), lr.gguf.format(i=layer)))
    tensors = []
    for rule, source, gguf in ordered:
        shape = [eval_dim(e, values) for e in rule.shape]
        tensors.append(TensorSpec(
            source_name=source, gguf_name=gguf, shape=shape, gguf_shape=shape[::-1],
            shape_expr=[pretty_dim(e) for e in rule.shape], kind=rule.kind,
            required=rule.when != "embedding"))
    return skeleton.model_copy(update={"tensors": tensors})


# --- the inventory ------------------------------------------------------------------------

def _shape_text(spec: TensorSpec) -> str:
    return f"{spec.shape} (= [{', '.join(spec.shape_expr)}])"


def check_head_tensors(contract: FeatureContract, names: set[str], *, path: str) -> None:
    """Refuse Markov / confidence fields that disagree with the tensors present.

    Done before the one-by-one inventory so that a config that names the wrong head gets
    a message about the head, not a list of missing and unexpected tensors.
    """
    markov = contract.markov_head
    has_markov = any(n.startswith("markov_head.") for n in names)
    has_gate = any(n.startswith("markov_head.gate_proj.") for n in names)
    has_joint = any(n.startswith("markov_head.joint_proj.") for n in names)
    has_conf = any(n.startswith("confidence_head.") for n in names)
    if markov.rank == 0 and has_markov:
        raise HeadConfigMismatchError(
            f"{path}: config says markov_rank 0 but the weights hold markov_head.* tensors; "
            "expected no Markov head", path=path, field="markov_rank", expected=0,
            found="markov_head tensors")
    if markov.rank > 0 and not has_markov:
        raise HeadConfigMismatchError(
            f"{path}: config says markov_rank {markov.rank} but the weights hold no markov_head.* "
            "tensors", path=path, field="markov_rank", expected=markov.rank,
            found="no markov_head tensors")
    if markov.rank > 0:
        found_type = "gated" if has_gate else "rnn" if has_joint else "vanilla"
        if has_gate and has_joint:
            found_type = "gated and rnn"
        if found_type != markov.type:
            raise HeadConfigMismatchError(
                f"{path}: config says markov_head_type {markov.type!r} but the weights hold a "
                f"{found_type} Markov head", path=path, field="markov_head_type",
                expected=markov.type, found=found_type)
    if contract.confidence_head.enabled != has_conf:
        raise HeadConfigMismatchError(
            f"{path}: config says enable_confidence_head {str(contract.confidence_head.enabled).lower()} "
            f"but the weights {'hold' if has_conf else 'hold no'} confidence_head.* tensors",
            path=path, field="enable_confidence_head", expected=contract.confidence_head.enabled,
            found=has_conf)


def check_inventory(contract: FeatureContract, tensors: dict[str, tuple[str, list[int]]],
                    *, path: str, expected_dtype: str | None = None) -> str:
    """Compare {name: (dtype, torch shape)} with the contract; return the common dtype.

    Raises the error of the first problem in a fixed order: head fields, missing, unexpected,
    shape, dtype. ``expected_dtype`` comes from config.json's ``dtype`` when it has one;
    otherwise every tensor must share one dtype of SOURCE_DTYPES.
    """
    names = set(tensors)
    check_head_tensors(contract, names, path=path)
    specs = {t.source_name: t for t in contract.tensors}
    missing = [t.source_name for t in contract.tensors if t.required and t.source_name not in names]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        spec = specs[missing[0]]
        raise MissingTensorError(f"{path}: tensor '{missing[0]}' is missing; expected shape "
                                 f"{_shape_text(spec)}{more}", path=path, tensor=missing[0],
                                 expected=spec.shape, found="missing")
    unexpected = sorted(names - set(specs))
    if unexpected:
        more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
        raise UnexpectedTensorError(f"{path}: tensor '{unexpected[0]}' is not part of the "
                                    f"{contract.family} contract{more}", path=path,
                                    tensor=unexpected[0], expected="absent", found="present")
    for spec in contract.tensors:
        if spec.source_name not in tensors:
            continue
        _dtype, shape = tensors[spec.source_name]
        if list(shape) != spec.shape:
            raise TensorShapeError(f"{path}: tensor '{spec.source_name}': expected shape "
                                   f"{_shape_text(spec)}, found {list(shape)}", path=path,
                                   tensor=spec.source_name, expected=spec.shape, found=list(shape))
    dtype = expected_dtype
    # Say where the expectation comes from: config.json's dtype, or the first tensor.
    origin = " (config.json 'dtype')" if expected_dtype is not None else ""
    for spec in contract.tensors:
        if spec.source_name not in tensors:
            continue
        found = tensors[spec.source_name][0]
        if dtype is None:
            if found not in SOURCE_DTYPES:
                raise TensorDtypeError(f"{path}: tensor '{spec.source_name}': expected dtype one of "
                                       f"{', '.join(SOURCE_DTYPES)}, found {found}", path=path,
                                       tensor=spec.source_name, expected=list(SOURCE_DTYPES),
                                       found=found)
            dtype, origin = found, f" (as '{spec.source_name}')"
        elif found != dtype:
            raise TensorDtypeError(f"{path}: tensor '{spec.source_name}': expected dtype {dtype}"
                                   f"{origin}, found {found}", path=path, tensor=spec.source_name,
                                   expected=dtype, found=found)
    assert dtype is not None  # at least fc.weight is required and present
    return dtype


def config_dtype(cfg: DSparkConfig, *, path: str) -> str | None:
    """The tensor dtype config.json declares ('dtype', or the older 'torch_dtype'), if any."""
    name = cfg.dtype if cfg.dtype is not None else cfg.torch_dtype
    if name is None:
        return None
    if name not in CONFIG_DTYPE_NAMES:
        field = "dtype" if cfg.dtype is not None else "torch_dtype"
        raise ConfigError(f"{path}: field '{field}': expected one of "
                          f"{', '.join(CONFIG_DTYPE_NAMES)}, found {name!r}", path=path,
                          field=field, expected=list(CONFIG_DTYPE_NAMES), found=name)
    return CONFIG_DTYPE_NAMES[name]
