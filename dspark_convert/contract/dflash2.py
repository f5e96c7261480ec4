"""speculators' DFlash2 drafter checkpoint: its config.json read strictly, its tensors as a
table, and z-lab's layout (the one llama.cpp converts) as data.

vllm-project/speculators 0.9.0 saves a DFlash2 drafter (``DFlash2DraftModel``,
speculators/models/dflash2/core.py:29; config ``DFlash2SpeculatorConfig``, dflash2/config.py:20)
as ``config.json`` + ``model.safetensors``: the draft decoder's Qwen3 layer config nested in
``transformer_layer_config``, the DFlash2 fields at the top level, every weight under its
module name without a ``model.`` prefix, and neither the embedding nor the head (rebuilt from
the verifier by ``load_verifier_weights``, dflash/core.py:171). docs/REFERENCE.md ("DFlash2")
has the forward these fields drive.

z-lab's layout of the same drafter (a flat Qwen3 config with ``dflash_config``, what
llama.cpp's converter reads) is read by ``parse_any_config`` as the speculators config it
stands for (``zlab_as_speculators``: `dspark convert` takes both); the runtime's own reader
of a source directory (``read_config``) takes speculators' layout only. ``build_contract``
makes the artifact's contract (``DFlash2Contract``, docs/ARTIFACT_FORMAT.md "Drafter kinds:
DFlash2") of either.

``DFlash2Config`` is one strict frozen model of every field the forward reads, each
required: speculators' schema has defaults for most of them, but its ``save_pretrained``
writes them all, and a config without ``sample_from_anchor`` is read differently by
speculators and vLLM (docs/SPECULATORS.md), so none is guessed here. ``parse_config`` then
applies speculators' own constraints (dflash2/core.py:36-48, model_definitions.py:56-79,
117-124, 256-259) and what the reference runtime computes; each refusal is one
DFlash2ConfigError (150) line naming config.json and the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from dspark_convert.contract.dspark import (CONFIG_DTYPE_NAMES, Geometry, MAX_BLOCK_SIZE, MAX_DRAFT_LAYERS,
                                           MAX_TARGET_TAPS, TensorSpec, contract_with_tensors)
from dspark_convert.contract.tensor_table import DFLASH2_TENSOR_RULES
from dspark_convert.contract.qwen3 import (ConfigErrors, Qwen3Config, check_heads_divide,
                                          check_positive, check_positive_eps, rope_theta)
from dspark_convert.errors import DFlash2ConfigError
from dspark_convert.util.models import validated
from dspark_convert.util.strict_json import read_json_strict

ARCHITECTURE = "DFlash2DraftModel"
MODEL_TYPE = "dflash2"
LAYER_MODEL_TYPE = "qwen3"
SLIDING, FULL = "sliding_attention", "full_attention"
LAYER_TYPES = (SLIDING, FULL)
CONFIG_FILE = "config.json"

ERRORS = ConfigErrors(malformed=DFlash2ConfigError, unsupported=DFlash2ConfigError,
                      limit=DFlash2ConfigError)


class DFlash2LayerConfig(Qwen3Config):
    """``transformer_layer_config``: the one Qwen3 config model (contract/qwen3.py) with the
    per-layer attention types DFlash2's decoder has (speculators' Qwen3DFlashAttention
    takes a window on ``sliding_attention`` layers, dflash/model_definitions.py:89-95)."""

    architectures: list[str] | None = None     # the nested config is no model's own
    layer_types: list[str]
    sliding_window: int | None = None
    use_sliding_window: bool = False


class DFlash2Config(BaseModel):
    """The top level of a speculators DFlash2 config.json: what the forward reads. Unknown
    fields (``speculators_config``, ``auto_map``, ``dtype`` ...) are kept, never read."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)

    architectures: list[str]
    speculators_model_type: str
    aux_hidden_state_layer_ids: list[int]    # HF hidden_states indices (0 = the embedding)
    block_size: int
    mask_token_id: int
    sample_from_anchor: bool
    sliding_window_non_causal: bool
    conv_kernel_size: int
    conv_group_size: int
    selector_rank: int
    selector_top_k: int
    draft_vocab_size: int
    target_hidden_size: int | None
    transformer_layer_config: DFlash2LayerConfig

    @property
    def layer(self) -> DFlash2LayerConfig:
        return self.transformer_layer_config

    @property
    def hidden_size(self) -> int:
        return self.layer.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.layer.vocab_size

    @property
    def num_groups(self) -> int:
        """G = H / g: the channel groups that share one dynamic kernel coefficient."""
        return self.hidden_size // self.conv_group_size

    @property
    def drafts_per_block(self) -> int:
        """B - 1: slot 0 is the anchor, not drafted (sample_from_anchor false)."""
        return self.block_size - 1

    def window(self, layer: int) -> int | None:
        """The context window of a draft layer: ``sliding_window`` on a sliding layer, None
        (the whole context) on a full one."""
        return self.layer.sliding_window if self.layer.layer_types[layer] == SLIDING else None

    def rope_theta(self) -> float:
        return rope_theta(self.layer, path=CONFIG_FILE, errors=ERRORS)


# --- z-lab's layout, as data (what llama.cpp 0c1e570's converter reads) ---------------------
# z-lab/dflash's tests/fixtures/dflash2-config.json: a flat Qwen3 config with the DFlash2
# fields in a nested ``dflash_config``. The runtime reads speculators' layout only; a z-lab
# config is recognised and named in its refusal.

ZLAB_CONFIG_KEY = "dflash_config"
ZLAB_DFLASH_CONFIG_FIELDS = ("block_size", "conv_group_size", "conv_kernel_size",
                             "selector_rank", "selector_top_k", "mask_token_id",
                             "target_layer_ids", "output_multiplier", "final_logit_softcapping")
# speculators' aux_hidden_state_layer_ids = z-lab's target_layer_ids + 1
# (speculators/convert/dflash/converter.py:117-126).
ZLAB_LAYER_ID_SHIFT = 1
# z-lab fields speculators' DFlash2 has not: applied by z-lab (compute_logits) and llama.cpp
# (src/models/dflash.cpp:815-826) to the unary logits, never by speculators.
ZLAB_ONLY_FIELDS = {"output_multiplier": "scales the unary logits",
                    "final_logit_softcapping": "softcaps the unary logits"}


def is_zlab_config(raw: object) -> bool:
    """A z-lab DFlash2 config.json: a flat config with ``dflash_config`` and no
    ``speculators_model_type``."""
    return (isinstance(raw, dict) and isinstance(raw.get(ZLAB_CONFIG_KEY), dict)
            and "speculators_model_type" not in raw)


# --- the tensors --------------------------------------------------------------------------
# Torch shapes by name, in symbols of the config: H hidden, m taps, V vocabulary, R
# selector_rank, k conv_kernel_size, G = H / conv_group_size, nh / nkv heads, d head_dim, I
# intermediate (model_definitions.py:130-135, 261-263; dflash/core.py:122-130).

GLOBAL_TENSORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("fc.weight", ("H", "m*H")),
    ("hidden_norm.weight", ("H",)),
    ("norm.weight", ("H",)),
    ("candidate_selector.predecessor_codebook", ("V", "R")),
    ("candidate_selector.successor_codebook", ("V", "R")),
    ("candidate_selector.hidden_projection.weight", ("R", "H")),
)
LAYER_TENSORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("input_layernorm.weight", ("H",)),
    ("post_attention_layernorm.weight", ("H",)),
    ("self_attn.q_proj.weight", ("nh*d", "H")),
    ("self_attn.k_proj.weight", ("nkv*d", "H")),
    ("self_attn.v_proj.weight", ("nkv*d", "H")),
    ("self_attn.o_proj.weight", ("H", "nh*d")),
    ("self_attn.q_norm.weight", ("d",)),
    ("self_attn.k_norm.weight", ("d",)),
    ("mlp.gate_proj.weight", ("I", "H")),
    ("mlp.up_proj.weight", ("I", "H")),
    ("mlp.down_proj.weight", ("H", "I")),
    ("attention_conv.base_kernel", ("2", "k", "H")),
    ("attention_conv.kernel_projection.weight", ("2*k*G", "H")),
    ("mlp_conv.base_kernel", ("2", "k", "H")),
    ("mlp_conv.kernel_projection.weight", ("2*k*G", "H")),
)
# Never saved by speculators (rebuilt from the verifier): the runtime takes the embedding and
# the head from the target, as load_verifier_weights does.
NEVER_SAVED = ("embed_tokens.weight", "lm_head.weight", "verifier_lm_head.weight",
               "verifier_norm.weight")


def tensor_shapes(cfg: DFlash2Config) -> dict[str, tuple[int, ...]]:
    """Every saved tensor's torch shape, globals first, then layer by layer."""
    layer = cfg.layer
    H, d, k = cfg.hidden_size, layer.head_dim, cfg.conv_kernel_size
    size = {"H": H, "m*H": len(cfg.aux_hidden_state_layer_ids) * H, "V": cfg.vocab_size,
            "R": cfg.selector_rank, "2": 2, "k": k, "2*k*G": 2 * k * cfg.num_groups,
            "nh*d": layer.num_attention_heads * d, "nkv*d": layer.num_key_value_heads * d,
            "d": d, "I": layer.intermediate_size}
    shapes = {name: tuple(size[s] for s in dims) for name, dims in GLOBAL_TENSORS}
    for i in range(layer.num_hidden_layers):
        shapes.update({f"layers.{i}.{name}": tuple(size[s] for s in dims)
                       for name, dims in LAYER_TENSORS})
    return shapes


# --- reading ------------------------------------------------------------------------------

def _refuse(path: str, field: str, expected: object, found: object, why: str = ""
            ) -> DFlash2ConfigError:
    return DFlash2ConfigError(f"{path}: field '{field}': expected {expected}, found "
                              f"{found!r}{why}", path=path, field=field,
                              expected=str(expected), found=str(found))


def _in_range(path: str, field: str, value: int, low: int, high: int | None = None) -> None:
    if value < low or (high is not None and value > high):
        bound = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
        raise _refuse(path, field, bound, value)


def read_config(directory: str | Path) -> DFlash2Config:
    """``directory/config.json`` read strictly (util/strict_json) and checked."""
    path = Path(directory) / CONFIG_FILE
    raw = read_json_strict(path, error=DFlash2ConfigError, label=str(path))
    return parse_config(raw, path=str(path))


def parse_config(raw: object, *, path: str = CONFIG_FILE) -> DFlash2Config:
    """A parsed config.json as a DFlash2Config: types first (pydantic, strict), then the
    rules, each refusal one DFlash2ConfigError line naming ``path`` and the field."""
    if is_zlab_config(raw):
        raise DFlash2ConfigError(
            f"{path}: field '{ZLAB_CONFIG_KEY}': this is z-lab's DFlash2 layout (a flat Qwen3 "
            f"config with {ZLAB_CONFIG_KEY}); expected speculators' (speculators_model_type "
            f"'{MODEL_TYPE}', transformer_layer_config)", path=path, field=ZLAB_CONFIG_KEY,
            expected="speculators' layout", found="z-lab's layout")
    if not isinstance(raw, dict):
        raise DFlash2ConfigError(f"{path}: expected a JSON object, found {type(raw).__name__}",
                                 path=path, expected="object", found=type(raw).__name__)
    cfg = validated(DFlash2Config, raw, error=DFlash2ConfigError, label=path, path=path)
    _check_identity(cfg, path)
    _check_layer(cfg, path)
    _check_block(cfg, path)
    return cfg


def _check_identity(cfg: DFlash2Config, path: str) -> None:
    if cfg.architectures != [ARCHITECTURE]:
        raise _refuse(path, "architectures", [ARCHITECTURE], cfg.architectures)
    if cfg.speculators_model_type != MODEL_TYPE:
        raise _refuse(path, "speculators_model_type", repr(MODEL_TYPE),
                      cfg.speculators_model_type)
    if cfg.layer.model_type != LAYER_MODEL_TYPE:
        raise _refuse(path, "transformer_layer_config.model_type", repr(LAYER_MODEL_TYPE),
                      cfg.layer.model_type, " (speculators' DFlash2 layers are Qwen3's)")


def _check_layer(cfg: DFlash2Config, path: str) -> None:
    """The draft decoder: a Qwen3 block the runtime computes, its layer types, its window."""
    layer, where = cfg.layer, f"{path}: transformer_layer_config"
    if layer.attention_bias:
        raise _refuse(path, "transformer_layer_config.attention_bias", "false", True,
                      " (q/k/v/o biases are not computed)")
    if layer.hidden_act != "silu":
        raise _refuse(path, "transformer_layer_config.hidden_act", "'silu'", layer.hidden_act)
    _in_range(path, "transformer_layer_config.num_hidden_layers", layer.num_hidden_layers, 1,
              MAX_DRAFT_LAYERS)
    try:     # the Qwen3 rules every reader applies (contract/qwen3.py), on the nested config
        check_positive(layer, ("hidden_size", "intermediate_size", "num_attention_heads",
                               "num_key_value_heads", "head_dim", "vocab_size"),
                       path=where, errors=ERRORS)
        check_positive_eps(layer, path=where, errors=ERRORS)
        check_heads_divide(layer, path=where, errors=ERRORS)
        rope_theta(layer, path=where, errors=ERRORS)
    except DFlash2ConfigError as exc:
        exc.path, exc.field = path, f"transformer_layer_config.{exc.field}"
        raise
    if len(layer.layer_types) != layer.num_hidden_layers:
        raise _refuse(path, "transformer_layer_config.layer_types",
                      f"{layer.num_hidden_layers} types (one per layer)",
                      len(layer.layer_types))
    for i, kind in enumerate(layer.layer_types):
        if kind not in LAYER_TYPES:
            raise _refuse(path, f"transformer_layer_config.layer_types[{i}]",
                          " or ".join(repr(t) for t in LAYER_TYPES), kind)
    if SLIDING in layer.layer_types:
        # transformers drops sliding_window when use_sliding_window is false: the "sliding"
        # layers would then attend to the whole context. Refused as a contradiction.
        if not layer.use_sliding_window:
            raise _refuse(path, "transformer_layer_config.use_sliding_window", "true", False,
                          " (layer_types has sliding_attention layers)")
        if layer.sliding_window is None or layer.sliding_window < 1:
            raise _refuse(path, "transformer_layer_config.sliding_window",
                          "a positive integer (layer_types has sliding_attention layers)",
                          layer.sliding_window)


def _check_block(cfg: DFlash2Config, path: str) -> None:
    """The block, the taps, the convolutions and the selector: speculators' constraints."""
    H, V = cfg.hidden_size, cfg.vocab_size
    if cfg.sample_from_anchor:
        raise _refuse(path, "sample_from_anchor", "false", True,
                      " (the runtime computes DFlash2's layout: slot 0 is the anchor, "
                      "predecessors are the previous slot's token)")
    # B >= 2: slot 0 is the anchor, so a block of 1 drafts nothing.
    _in_range(path, "block_size", cfg.block_size, 2, MAX_BLOCK_SIZE)
    ids = cfg.aux_hidden_state_layer_ids
    if not 1 <= len(ids) <= MAX_TARGET_TAPS:
        raise _refuse(path, "aux_hidden_state_layer_ids",
                      f"1 to {MAX_TARGET_TAPS} hidden-state indices", len(ids))
    for i, index in enumerate(ids):
        _in_range(path, f"aux_hidden_state_layer_ids[{i}]", index, 0)
    _in_range(path, "mask_token_id", cfg.mask_token_id, 0, V - 1)
    if cfg.draft_vocab_size != V:
        raise _refuse(path, "draft_vocab_size", f"the vocabulary size {V} (DFlash2 has no "
                      "reduced draft vocabulary)", cfg.draft_vocab_size)
    if cfg.target_hidden_size is not None and cfg.target_hidden_size != H:
        raise _refuse(path, "target_hidden_size", f"null or the hidden size {H} (fc reads "
                      "m x hidden_size features)", cfg.target_hidden_size)
    _in_range(path, "conv_kernel_size", cfg.conv_kernel_size, 1, cfg.block_size)
    _in_range(path, "conv_group_size", cfg.conv_group_size, 1)
    if H % cfg.conv_group_size:
        raise _refuse(path, "conv_group_size", f"a divisor of hidden_size {H}",
                      cfg.conv_group_size)
    _in_range(path, "selector_rank", cfg.selector_rank, 1)
    _in_range(path, "selector_top_k", cfg.selector_top_k, 1, V)


# --- z-lab's layout read as speculators' ----------------------------------------------------

def zlab_as_speculators(raw: dict, *, path: str) -> dict:
    """A z-lab DFlash2 config.json (``is_zlab_config``) as the speculators config.json it
    stands for (speculators/convert/dflash/converter.py:117-126 maps it so): the flat Qwen3
    fields become ``transformer_layer_config``, ``dflash_config``'s fields the top level,
    ``target_layer_ids`` + 1 the ``aux_hidden_state_layer_ids`` (HF hidden_states indices).
    What speculators' DFlash2 does not compute is refused (150): unary logits scaled
    (``output_multiplier`` other than 1) or softcapped (``final_logit_softcapping`` not
    null), causal block attention (``is_causal`` / ``dflash_config.causal`` true)."""
    dc = raw[ZLAB_CONFIG_KEY]
    for field in ("block_size", "conv_group_size", "conv_kernel_size", "selector_rank",
                  "selector_top_k", "mask_token_id"):
        value = dc.get(field)
        if isinstance(value, bool) or not isinstance(value, int):
            raise _refuse(path, f"{ZLAB_CONFIG_KEY}.{field}", "an integer", value)
    ids = dc.get("target_layer_ids")
    if not (isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool)
                                          for i in ids)):
        raise _refuse(path, f"{ZLAB_CONFIG_KEY}.target_layer_ids", "a list of integers "
                      "(target layer ids; speculators' aux ids are these + 1)", ids)
    multiplier = dc.get("output_multiplier")
    if multiplier is not None and multiplier != 1:
        raise _refuse(path, f"{ZLAB_CONFIG_KEY}.output_multiplier", "null or 1", multiplier,
                      f" ({ZLAB_ONLY_FIELDS['output_multiplier']} in z-lab and llama.cpp; "
                      "speculators' DFlash2, which the runtime computes, has no such field)")
    softcap = dc.get("final_logit_softcapping")
    if softcap is not None:
        raise _refuse(path, f"{ZLAB_CONFIG_KEY}.final_logit_softcapping", "null", softcap,
                      f" ({ZLAB_ONLY_FIELDS['final_logit_softcapping']} in z-lab and llama.cpp; "
                      "speculators' DFlash2, which the runtime computes, has no such field)")
    for field, value in (("is_causal", raw.get("is_causal")),
                         (f"{ZLAB_CONFIG_KEY}.causal", dc.get("causal"))):
        if value not in (None, False):
            raise _refuse(path, field, "false or absent", value,
                          " (DFlash2's block attention is bidirectional)")
    skip = {ZLAB_CONFIG_KEY, "architectures", "is_causal", "num_target_layers", "auto_map",
            "transformers_version", "dtype", "torch_dtype"}
    layer = {k: v for k, v in raw.items() if k not in skip}
    out = {"architectures": raw.get("architectures"), "speculators_model_type": MODEL_TYPE,
           "aux_hidden_state_layer_ids": [i + ZLAB_LAYER_ID_SHIFT for i in ids],
           "block_size": dc["block_size"], "mask_token_id": dc["mask_token_id"],
           "sample_from_anchor": False, "sliding_window_non_causal": True,
           "conv_kernel_size": dc["conv_kernel_size"], "conv_group_size": dc["conv_group_size"],
           "selector_rank": dc["selector_rank"], "selector_top_k": dc["selector_top_k"],
           "draft_vocab_size": raw.get("vocab_size"), "target_hidden_size": None,
           "transformer_layer_config": layer}
    for field in ("dtype", "torch_dtype"):
        if field in raw:
            out[field] = raw[field]
    return out


def parse_any_config(raw: object, *, path: str = CONFIG_FILE) -> DFlash2Config:
    """config.json in either layout: speculators' (``parse_config``), or z-lab's read as
    speculators' (``zlab_as_speculators``). The artifact's contract is the same for both."""
    if is_zlab_config(raw):
        raw = zlab_as_speculators(raw, path=path)
    return parse_config(raw, path=path)


def source_layout(raw: object) -> str:
    """Which layout a config.json is in: 'z-lab' or 'speculators'."""
    return "z-lab" if is_zlab_config(raw) else "speculators"


# --- the artifact's contract --------------------------------------------------------------
# What a DFlash2 artifact holds (docs/ARTIFACT_FORMAT.md, "DFlash2"): every field the
# forward reads, from the config (either layout), and the tensor table
# (contract/tensor_table.DFLASH2_TENSOR_RULES). Rebuilt from drafter.gguf's metadata alone
# by validate (artifact/format.py's view of the metadata as a speculators config.json).

FAMILY = "qwen3-dflash2"


class _Contract(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


# The draft decoder's geometry is a DSpark drafter's: the same Qwen3 layers (one model, so
# that the writer, the validator and inspect read one set of fields).
DFlash2Geometry = Geometry


class DFlash2Taps(_Contract):
    """The target hidden states fc reads, as speculators numbers them: HF hidden_states
    indices (0 the embedding output, num_hidden_layers the final norm's output)."""
    hidden_state_indices: list[int]
    feature_width: int                 # m * hidden_size, fc's input width


class DFlash2Block(_Contract):
    block_size: int
    mask_token_id: int
    sample_from_anchor: Literal[False]     # slot 0 is the anchor, B - 1 drafts
    drafts_per_block: int


class DFlash2Attention(_Contract):
    layer_types: list[Literal["sliding_attention", "full_attention"]]
    sliding_window: int | None             # the sliding layers' window; None without one
    sliding_window_non_causal: bool        # false: the block is causal on sliding layers
    causal: Literal[False]                 # the block attends both ways (full layers)
    bias: Literal[False]


class DFlash2Conv(_Contract):
    kernel_size: int
    group_size: int
    num_groups: int                        # G = hidden_size / group_size


class DFlash2Selector(_Contract):
    rank: int
    top_k: int


class DFlash2Contract(_Contract):
    family: Literal["qwen3-dflash2"]
    architecture: Literal["DFlash2DraftModel"]
    geometry: DFlash2Geometry
    taps: DFlash2Taps
    block: DFlash2Block
    attention: DFlash2Attention
    conv: DFlash2Conv
    selector: DFlash2Selector
    tensors: list[TensorSpec]

    def symbols(self) -> dict[str, int]:
        g = self.geometry
        return {"H": g.hidden_size, "I": g.intermediate_size, "V": g.vocab_size,
                "nh": g.num_attention_heads, "nkv": g.num_key_value_heads, "d": g.head_dim,
                "m": len(self.taps.hidden_state_indices), "R": self.selector.rank,
                "k": self.conv.kernel_size, "G": self.conv.num_groups}

    def rule_applies(self, when: str) -> bool:
        return when == "always"

    def tensor(self, source_name: str) -> TensorSpec | None:
        return next((t for t in self.tensors if t.source_name == source_name), None)

    @property
    def written_tensors(self) -> list[TensorSpec]:
        return [t for t in self.tensors if t.gguf_name is not None]

    def headline(self) -> str:
        g, b, c, s = self.geometry, self.block, self.conv, self.selector
        return (f"{self.architecture}: {g.num_draft_layers} draft layers "
                f"({', '.join(self.attention.layer_types)}), H={g.hidden_size}, hidden states "
                f"{self.taps.hidden_state_indices}, block {b.block_size} ({b.drafts_per_block} "
                f"drafts), conv k={c.kernel_size} g={c.group_size}, selector R={s.rank} "
                f"top_k={s.top_k}")

    def summary(self) -> list[tuple[str, str]]:
        g, a = self.geometry, self.attention
        window = "" if a.sliding_window is None else f", window {a.sliding_window}"
        b = self.block
        return [("geometry", f"H={g.hidden_size} I={g.intermediate_size} layers="
                             f"{g.num_draft_layers} heads={g.num_attention_heads}/"
                             f"{g.num_key_value_heads}x{g.head_dim} V={g.vocab_size} "
                             f"eps={g.rms_norm_eps:g} theta={g.rope_theta:g}"),
                ("taps", f"hidden_states {self.taps.hidden_state_indices} (HF indices, 0 the "
                         f"embedding), feature width {self.taps.feature_width}"),
                ("block", f"size {b.block_size}, mask token {b.mask_token_id}, slot 0 the "
                          f"anchor: {b.drafts_per_block} drafts"),
                ("attention", f"{', '.join(a.layer_types)}{window}; block "
                              + ("non-causal on every layer" if a.sliding_window_non_causal
                                 else "causal on sliding layers") + ", no bias"),
                ("conv", f"two-tap grouped dynamic conv around each sublayer: kernel "
                         f"{self.conv.kernel_size}, group {self.conv.group_size} "
                         f"({self.conv.num_groups} groups)"),
                ("selector", f"rank {self.selector.rank}, top_k {self.selector.top_k}; "
                             "greedy walk from the anchor"),
                ("embedding", "the target's embedding and head (never saved by "
                              "speculators)")]


def build_contract(cfg: DFlash2Config, *, path: str = CONFIG_FILE) -> DFlash2Contract:
    """The artifact's contract of a checked config (parse_config / parse_any_config)."""
    layer = cfg.layer
    parts = dict(
        family=FAMILY, architecture=ARCHITECTURE,
        geometry=DFlash2Geometry(
            hidden_size=cfg.hidden_size, intermediate_size=layer.intermediate_size,
            num_draft_layers=layer.num_hidden_layers,
            num_attention_heads=layer.num_attention_heads,
            num_key_value_heads=layer.num_key_value_heads, head_dim=layer.head_dim,
            vocab_size=cfg.vocab_size, rms_norm_eps=layer.rms_norm_eps,
            rope_theta=cfg.rope_theta()),
        taps=DFlash2Taps(hidden_state_indices=list(cfg.aux_hidden_state_layer_ids),
                         feature_width=len(cfg.aux_hidden_state_layer_ids) * cfg.hidden_size),
        block=DFlash2Block(block_size=cfg.block_size, mask_token_id=cfg.mask_token_id,
                           sample_from_anchor=False, drafts_per_block=cfg.drafts_per_block),
        attention=DFlash2Attention(
            layer_types=list(layer.layer_types),
            sliding_window=layer.sliding_window if SLIDING in layer.layer_types else None,
            sliding_window_non_causal=cfg.sliding_window_non_causal, causal=False, bias=False),
        conv=DFlash2Conv(kernel_size=cfg.conv_kernel_size, group_size=cfg.conv_group_size,
                         num_groups=cfg.num_groups),
        selector=DFlash2Selector(rank=cfg.selector_rank, top_k=cfg.selector_top_k))
    return _with_tensors(parts)


def _with_tensors(parts: dict) -> DFlash2Contract:
    return contract_with_tensors(parts, model=DFlash2Contract, table=DFLASH2_TENSOR_RULES)


def config_dtype(cfg: DFlash2Config, *, path: str) -> str | None:
    """The tensor dtype config.json declares (its top-level ``dtype``), if any."""
    name = getattr(cfg, "dtype", None) or getattr(cfg, "torch_dtype", None)
    if name is None:
        return None
    if name not in CONFIG_DTYPE_NAMES:
        raise _refuse(path, "dtype", f"one of {', '.join(CONFIG_DTYPE_NAMES)}", name)
    return CONFIG_DTYPE_NAMES[name]
