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

from typing import Literal

from pydantic import BaseModel, ConfigDict

from dspark_convert.errors import (
    ConfigError,
    GeometryLimitError,
    HeadConfigMismatchError,
    MaskTokenError,
    TargetLayerError,
    UnsupportedArchitectureError,
    UnsupportedFeatureError,
)
from dspark_convert.contract.qwen3 import (
    ConfigErrors,
    Qwen3Config,
    check_dense,
    check_heads_divide,
    check_positive_eps,
    parse_qwen3_config,
    rope_theta,
)
from dspark_convert.contract.speculators import (LAYOUT_FIELD, MODEL_TYPE_FIELD,
                                                 anchor_layout_error, quoted_value)
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


class _Contract(BaseModel):
    # Our own records: nothing unknown is accepted when one is read back from a manifest.
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class DSparkConfig(Qwen3Config):
    """config.json of a Qwen3DSparkModel checkpoint (docs/REFERENCE.md §1): the target's
    Qwen3 config (contract/qwen3.py) plus DeepSpec's fields.

    Geometry fields are required, and so are ``attention_bias`` and ``hidden_act``
    (DeepSpec's ``build_draft_config`` always writes them). ``markov_head_type`` exists
    only when ``markov_rank > 0`` and ``confidence_head_with_markov`` only with a
    confidence head, exactly as DeepSpec writes them.
    """

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


# A drafter's config problems are contract violations: malformed (13), a feature the format
# cannot express (15), a value beyond a limit (17).
DRAFTER_ERRORS = ConfigErrors(malformed=ConfigError, unsupported=UnsupportedFeatureError,
                              limit=GeometryLimitError)


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
    kind: Literal["matrix", "norm", "bias", "embedding", "scalar", "conv", "codebook"]
    required: bool


class ContractTensors:
    """What every family's contract answers alike, from the fields each has (geometry,
    taps, markov_head, confidence_head, tensors): the tensor table's symbols and
    conditions, its tensors by source name. A family adds its own conditions by
    overriding ``conditions``."""

    def symbols(self) -> dict[str, int]:
        g = self.geometry
        rank = self.markov_head.rank
        return {
            "H": g.hidden_size, "I": g.intermediate_size, "V": g.vocab_size,
            "nh": g.num_attention_heads, "nkv": g.num_key_value_heads, "d": g.head_dim,
            "m": len(self.taps.target_layer_ids), "r": rank,
            "rc": rank if self.confidence_head.with_markov else 0,
        }

    def conditions(self) -> dict[str, bool]:
        """Each tensor-table condition and whether it holds for this contract."""
        return {
            "always": True,
            "embedding": True,
            "markov": self.markov_head.rank > 0,
            "gated": self.markov_head.type == "gated",
            "rnn": self.markov_head.type == "rnn",
            "confidence": self.confidence_head.enabled,
        }

    def rule_applies(self, when: str) -> bool:
        """Whether a tensor-table rule with this condition names a tensor of this contract."""
        return self.conditions()[when]

    def tensor(self, source_name: str) -> TensorSpec | None:
        return next((t for t in self.tensors if t.source_name == source_name), None)

    @property
    def written_tensors(self) -> list[TensorSpec]:
        return [t for t in self.tensors if t.gguf_name is not None]


class FeatureContract(ContractTensors, _Contract):
    family: Literal["qwen3-dspark"]
    architecture: Literal["Qwen3DSparkModel"]
    geometry: Geometry
    taps: FeatureTaps
    block: BlockLayout
    attention: Attention
    markov_head: MarkovHead
    confidence_head: ConfidenceHead
    tensors: list[TensorSpec]

    def summary(self) -> list[tuple[str, str]]:
        """(label, text) lines that say this family's geometry and attention (inspect)."""
        g = self.geometry
        return [("geometry", f"H={g.hidden_size} I={g.intermediate_size} layers={g.num_draft_layers} "
                             f"heads={g.num_attention_heads}/{g.num_key_value_heads}x{g.head_dim} "
                             f"V={g.vocab_size} eps={g.rms_norm_eps:g} theta={g.rope_theta:g}"),
                ("attention", "non-causal, no bias")]


# --- parsing config.json ------------------------------------------------------------------

def parse_config(data: object, *, path: str = "config.json") -> DSparkConfig:
    """Validate the parsed JSON of config.json; ConfigError names the first bad field."""
    return parse_qwen3_config(data, path=path, errors=DRAFTER_ERRORS, model=DSparkConfig)


# --- semantic rules -----------------------------------------------------------------------

def _positive(path: str, field: str, value: int, upper: int | None = None) -> None:
    if value <= 0 or (upper is not None and value > upper):
        bound = f"1..{upper}" if upper is not None else "a positive integer"
        raise GeometryLimitError(f"{path}: field '{field}': expected {bound}, found {value}",
                                 path=path, field=field, expected=bound, found=value)


def tap_problem(layer: int, num_layers: int) -> str | None:
    """Why ``layer`` (a DeepSpec target_layer_id) cannot be a feature tap of a target of
    ``num_layers`` layers, or None: the one rule the contract (against num_target_layers)
    and the pairing (against the target's own count) apply."""
    if layer == -1:
        return "the embedding output, which the Strata format cannot express"
    if not 0 <= layer < num_layers:
        return f"not a layer of a {num_layers}-layer target"
    if layer == num_layers - 1:
        return "the target's last layer, whose HF hidden state is post-norm"
    return None


def _check_mask_token(cfg, path: str) -> None:
    """The mask token is a token of the vocabulary (every family's drafter fills its block
    with it)."""
    if not 0 <= cfg.mask_token_id < cfg.vocab_size:
        raise MaskTokenError(
            f"{path}: field 'mask_token_id': expected a token id in [0, {cfg.vocab_size - 1}] "
            f"(vocab_size = {cfg.vocab_size}), found {cfg.mask_token_id}", path=path,
            field="mask_token_id", expected=f"0..{cfg.vocab_size - 1}", found=cfg.mask_token_id)


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
        problem = tap_problem(layer, n)
        if problem is not None:
            raise TargetLayerError(f"{where}: found {layer}, {problem}; expected a layer id in "
                                   f"[0, {n - 2}] (num_target_layers = {n})", path=path,
                                   field=f"{field}[{pos}]", expected=f"0..{n - 2}", found=layer)
        if pos and layer <= ids[pos - 1]:
            raise TargetLayerError(f"{where}: expected ids strictly increasing, found {ids[pos - 1]} "
                                   f"then {layer}", path=path, field=field,
                                   expected="strictly increasing", found=ids)


def check_block_layout(cfg, path: str) -> None:
    """DeepSpec's config.json (every family's; a speculators config's twin, whose layer config
    it copies) in the one block layout the artifact format records: ``sample_from_anchor``
    absent (DeepSpec writes none, and vLLM's and SGLang's DSpark proposers read a config
    without it as true: docs/CONFORMANCE.md) or a JSON true. False is the anchor-as-bonus
    layout (34); any other value (0, 1, "true", null) states none (13): speculators' schema
    coerces "false" to false, a reader of its truth value takes it for true. And no
    ``speculators_model_type``: a config naming one is speculators' format (this reader's,
    vLLM's), which the twin written back would be read as (13)."""
    extra = cfg.model_extra or {}
    if MODEL_TYPE_FIELD in extra:
        raise ConfigError(
            f"{path}: field '{MODEL_TYPE_FIELD}': expected absent from DeepSpec's "
            "config.json (it marks speculators' format, whose top level it belongs to), "
            f"found {quoted_value(extra[MODEL_TYPE_FIELD])}", path=path,
            field=MODEL_TYPE_FIELD, expected="absent",
            found=quoted_value(extra[MODEL_TYPE_FIELD]))
    if LAYOUT_FIELD not in extra or extra[LAYOUT_FIELD] is True:
        return
    value = extra[LAYOUT_FIELD]
    if value is False:
        raise anchor_layout_error(f"{path}: field '{LAYOUT_FIELD}' is false", path=path,
                                  field=LAYOUT_FIELD)
    raise ConfigError(f"{path}: field '{LAYOUT_FIELD}': expected true (a JSON boolean; absent "
                      f"reads true), found {quoted_value(value)}", path=path, field=LAYOUT_FIELD,
                      expected=True, found=quoted_value(value))


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
    check_dense(cfg, path=path, errors=DRAFTER_ERRORS)
    for field in ("hidden_size", "intermediate_size", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "vocab_size", "num_target_layers"):
        _positive(path, field, getattr(cfg, field))
    _positive(path, "num_hidden_layers", cfg.num_hidden_layers, MAX_DRAFT_LAYERS)
    _positive(path, "block_size", cfg.block_size, MAX_BLOCK_SIZE)
    check_heads_divide(cfg, path=path, errors=DRAFTER_ERRORS)
    check_positive_eps(cfg, path=path, errors=DRAFTER_ERRORS)
    theta = rope_theta(cfg, path=path, errors=DRAFTER_ERRORS)
    _check_taps(cfg, path)
    _check_mask_token(cfg, path)
    _check_heads(cfg, path)
    check_block_layout(cfg, path)

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


def contract_with_tensors(parts: dict, *, model: type[BaseModel] = FeatureContract,
                          table: tuple[TensorRule, ...] = TENSOR_RULES):
    """Complete a contract's parts with the tensor inventory its family's table implies
    (``model`` has ``symbols()`` and ``rule_applies(when)``)."""
    skeleton = model(**parts, tensors=[])
    values = skeleton.symbols()
    rules = [r for r in table if skeleton.rule_applies(r.when)]
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
