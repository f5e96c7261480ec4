"""speculators' format and DeepSpec's, as one mapping table (docs/SPECULATORS.md).

vllm-project/speculators 0.9.0 (``speculators/models/dflash/config.py``,
``speculators/models/dspark/{config,core,model_definitions}.py``) trains DSpark and DFlash
drafters and saves them in its own format, which vLLM serves: a ``config.json`` with
``speculators_model_type`` and the drafter's Qwen3 layer config nested in
``transformer_layer_config``, and the weights under DeepSpec's own names, less the embedding
(never saved: the verifier's) and the head (saved only for a reduced draft vocabulary, with
its ``d2t`` / ``t2d`` map).

``FIELDS`` (config.json) and ``KEYS`` (the weights) are the one statement of how the two
formats correspond. The reader (``read_config``: a speculators checkpoint as the DeepSpec twin
it converts like, source/checkpoint.py), the writer (``write_config`` / ``written_tensors``:
`dspark export --engine speculators`, commands/export_speculators.py) and the generated table
of docs/SPECULATORS.md (tools/docs.py) all read them: each row's ``kind`` says which rule of
this module applies it.

The trap the format holds: ``sample_from_anchor``. True is DeepSpec's block layout (the anchor
first: block slot j predicts position p+1+j, block_size drafts); false is another (the anchor
is the bonus token, slot k predicts p+k, block_size - 1 drafts). A config without it is read
true by speculators' own schema for DSpark and false by vLLM 0.33 (vllm #56792), so it is never
defaulted here: refused (33) unless the user states it; false is refused (34); the writer
always writes it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from dspark_convert.errors import (
    AnchorLayoutError,
    ConfigError,
    DraftVocabularyError,
    SampleFromAnchorMissingError,
    SampleFromAnchorOptionError,
    SpeculatorsModelError,
)

SPECULATORS_VERSION = "0.9.0"
# speculators_model_type -> the architectures save_pretrained writes (the model class's name).
MODEL_TYPES: dict[str, str] = {"dspark": "DSparkDraftModel", "dflash": "DFlashDraftModel"}
# What the writer writes: a DeepSpec drafter of any heads is speculators' DSpark (markov_rank 0
# and no confidence head is speculators' own "pure DFlash drafting" in DSpark's layout);
# speculators' dflash defaults to the other layout, and vLLM reads it so.
WRITTEN_MODEL_TYPE = "dspark"
# How the readers of the format read a config without sample_from_anchor, by model type: the
# line a refusal (33) names.
MISSING_LAYOUT_READINGS: dict[str, str] = {
    "dspark": "speculators 0.9.0's schema reads it true (DSparkSpeculatorConfig), vLLM 0.33 "
              "reads it false (vllm #56792)",
    "dflash": "speculators 0.9.0's schema reads it false (DFlashSpeculatorConfig), and so does "
              "vLLM 0.33",
}
DEEPSPEC_ARCHITECTURE = "Qwen3DSparkModel"
QWEN3_MODEL_TYPE = "qwen3"
# The Qwen3 fields the writer puts in transformer_layer_config (what DeepSpec's drafter and the
# contract read): from the contract where it holds them, else from the source's config.json.
QWEN3_FIELDS = ("model_type", "vocab_size", "hidden_size", "intermediate_size",
                "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                "hidden_act", "attention_bias", "rms_norm_eps", "rope_parameters",
                "max_position_embeddings", "use_sliding_window", "tie_word_embeddings",
                "pad_token_id", "bos_token_id", "eos_token_id")

FieldKind = Literal["architecture", "layer", "shift", "target", "copy", "markov", "confidence",
                    "vocabulary", "layout", "hidden", "written"]


@dataclass(frozen=True)
class FieldRow:
    """One field of config.json in both formats. ``deepspec``: DeepSpec's config.json field
    (None: speculators' only); ``speculators``: speculators' (dotted when nested; None:
    DeepSpec's only); ``kind``: the rule that maps it; ``rule``: that rule in words (docs)."""
    deepspec: str | None
    speculators: str | None
    kind: FieldKind
    rule: str


FIELDS: tuple[FieldRow, ...] = (
    FieldRow("architectures", "speculators_model_type", "architecture",
             "`['Qwen3DSparkModel']` is `dspark` (read: `dflash` too, as markov_rank 0 and no "
             "confidence head); written `dspark`, with `architectures` "
             "`['DSparkDraftModel']`; another model type is refused (37)"),
    FieldRow("every Qwen3 field (hidden_size, num_hidden_layers, head_dim, rope_parameters, ...)",
             "transformer_layer_config.<the same name>", "layer",
             "the drafter's own layer config, nested; its model_type must be `qwen3` "
             "(speculators 0.9.0's DSpark and DFlash layers are Qwen3's; another is refused, 37); "
             "a field DeepSpec's config holds at speculators' top level (block_size, "
             "markov_rank, ...) is read from the top level only, as speculators reads it; "
             "a nested `speculators_model_type` is refused (13: the twin would be read as "
             "speculators' format), a nested `sample_from_anchor` is DeepSpec's (true or absent)"),
    FieldRow("target_layer_ids", "aux_hidden_state_layer_ids", "shift",
             "aux = id + 1: an index into the target's hidden states, 0 being the embedding "
             "(which the format cannot tap: 16)"),
    FieldRow("num_target_layers", None, "target",
             "not in speculators' config: the target's num_hidden_layers (--target)"),
    FieldRow("block_size", "block_size", "copy", "the same"),
    FieldRow("mask_token_id", "mask_token_id", "copy", "the same (speculators allows null: 13)"),
    FieldRow("dtype", "dtype", "copy", "the same (the weights' dtype)"),
    FieldRow("markov_rank", "markov_rank", "markov", "the same; `dflash`: 0"),
    FieldRow("markov_head_type", "markov_head_type", "markov",
             "the same when markov_rank > 0; speculators always writes one (`vanilla` by "
             "default), DeepSpec none without a Markov head"),
    FieldRow("enable_confidence_head", "enable_confidence_head", "confidence",
             "the same; `dflash`: false"),
    FieldRow("confidence_head_with_markov", "confidence_head_with_markov", "confidence",
             "the same with a confidence head; speculators always writes one, DeepSpec none "
             "without a confidence head (written false then)"),
    FieldRow(None, "draft_vocab_size", "vocabulary",
             "the vocabulary size; a smaller one is a reduced draft vocabulary (`d2t` / `t2d`): "
             "refused (35), the artifact format has no vocabulary map yet"),
    FieldRow(None, "sample_from_anchor", "layout",
             "true: DeepSpec's block layout (anchor first; DeepSpec's own config.json holds "
             "none, which vLLM and SGLang read as true, or true); false refused (34); null or "
             "another type (\"true\", 1) refused (13); missing refused (33) unless "
             "--sample-from-anchor states it; always written (true)"),
    FieldRow(None, "target_hidden_size", "hidden",
             "null or the hidden size (DeepSpec's drafter has the target's); another is "
             "refused (37); written null"),
    FieldRow(None, "sliding_window_non_causal", "written",
             "written false (DeepSpec's drafters have no sliding layers: 15)"),
    FieldRow(None, "speculators_config", "written",
             "written: algorithm `dspark`, the greedy proposal with speculative_tokens = "
             "block_size, the verifier's name_or_path and architectures (the target, "
             "--target); read: its algorithm must be speculators_model_type (37)"),
    FieldRow(None, "speculators_version", "written", f"written `{SPECULATORS_VERSION}`"),
)


@dataclass(frozen=True)
class KeyRow:
    """One weight in both formats (None: absent from that format)."""
    deepspec: str | None
    speculators: str | None
    rule: str
    never_saved: bool = False       # speculators never writes it
    vocabulary_map: bool = False    # a reduced draft vocabulary's: refused (35)


KEYS: tuple[KeyRow, ...] = (
    KeyRow("embed_tokens.weight", None,
           "never saved (speculators loads the verifier's); read: the target's, recorded as the "
           "twin's copy (hashed, never written); written: never", never_saved=True),
    KeyRow("lm_head.weight", None,
           "saved by speculators only for a reduced vocabulary ([draft_vocab_size, H]: 35); "
           "full vocabulary: the verifier's, so read as the target's; written: never",
           never_saved=True),
    KeyRow(None, "d2t", "draft-to-target offsets (int64; target id = i + d2t[i]): 35",
           vocabulary_map=True),
    KeyRow(None, "t2d", "the target ids the draft vocabulary keeps (bool): 35",
           vocabulary_map=True),
    KeyRow(None, "verifier_lm_head.weight", "never saved (the verifier's head, for training)",
           never_saved=True),
    KeyRow(None, "verifier_norm.weight", "never saved (the verifier's final norm, for training)",
           never_saved=True),
    KeyRow("every other tensor of the tensor table (fc, hidden_norm, norm, layers.N.*, "
           "markov_head.*, confidence_head.*)", "the same name",
           "the same name, shape and bytes (no `model.` prefix)"),
)
VOCABULARY_MAP = tuple(k.speculators for k in KEYS if k.vocabulary_map)
NEVER_SAVED = tuple(k.deepspec or k.speculators for k in KEYS if k.never_saved)


def _row(kind: FieldKind) -> tuple[FieldRow, ...]:
    return tuple(r for r in FIELDS if r.kind == kind)


# The field that marks speculators' format: this reader's test, and vLLM's.
MODEL_TYPE_FIELD = _row("architecture")[0].speculators


def is_speculators_config(raw: object) -> bool:
    """Whether a parsed config.json is speculators' (it names a speculators_model_type)."""
    return isinstance(raw, dict) and MODEL_TYPE_FIELD in raw


def speculators_field(deepspec_field: str) -> str:
    """The speculators field a DeepSpec field (``target_layer_ids[2]``, ``rms_norm_eps``)
    was read from: for messages about the twin's config."""
    base, bracket, rest = deepspec_field.partition("[")
    suffix = bracket + rest
    for row in FIELDS:
        if row.deepspec == base and row.speculators is not None:
            return row.speculators + suffix
    if any(base == r.deepspec for r in FIELDS):        # DeepSpec's only (num_target_layers)
        return f"{base} (the target's num_hidden_layers)"
    return f"transformer_layer_config.{deepspec_field}"


# --- reading: a speculators config.json as its DeepSpec twin's ---------------------------------

@dataclass(frozen=True)
class Reading:
    """A speculators config.json read as the DeepSpec config its twin has."""
    twin: dict                                   # DeepSpec's config.json, as the contract reads it
    model_type: str                              # speculators_model_type: dspark or dflash
    sample_from_anchor: bool                     # always True (False is refused)
    layout_stated_by: Literal["config", "option"]


_MISSING = object()
MAX_QUOTED = 60


def quoted_value(value: object) -> str:
    """A value from config.json as JSON on one line, cut to MAX_QUOTED characters (a refusal
    quotes what it found, never a whole 4 MiB list)."""
    text = json.dumps(value)
    return text if len(text) <= MAX_QUOTED else text[:MAX_QUOTED - 3] + "..."


def _malformed(path: str, field: str, expected: str, found: object) -> ConfigError:
    shown = "nothing" if found is _MISSING else quoted_value(found)
    return ConfigError(f"{path}: field '{field}': expected {expected}, found {shown}", path=path,
                       field=field, expected=expected, found=shown)


def _get(raw: dict, field: str, path: str, kind: type | tuple[type, ...], expected: str,
         *, required: bool = True):
    """``raw[field]`` of JSON type ``kind`` (a bool is never an int); absent or null is
    None where the field is optional, else refused (13) like a value of another type."""
    if field not in raw or raw[field] is None:
        if required:
            raise _malformed(path, field, expected, raw.get(field, _MISSING))
        return None
    value = raw[field]
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in
                                       (kind if isinstance(kind, tuple) else (kind,))):
        raise _malformed(path, field, expected, value)
    return value


# The block layout's field: speculators' top-level one, and the one vLLM and SGLang read in
# DeepSpec's config.json (contract/dspark.check_block_layout).
LAYOUT_FIELD = _row("layout")[0].speculators


def anchor_layout_error(where: str, *, path: str, field: str) -> AnchorLayoutError:
    """The refusal (34) of the anchor-as-bonus block layout, ``where`` saying who stated it
    (a field of a config, DeepSpec's or speculators', or the layout a user stated)."""
    return AnchorLayoutError(
        f"{where}: the anchor-as-bonus block layout (slot k predicts position p+k, "
        "block_size - 1 drafts); the artifact format, Strata, llama.cpp and the reference "
        "runtime run only the anchor-first one (slot j predicts p+1+j), so its drafts "
        "would be for other positions", path=path, field=field, expected=True, found=False)


# Who states a layout a config lacks, in the words of every command that can: convert's
# option, a gate policy's key (a refusal names no option its command lacks).
STATED_LAYOUT = ("the stated layout (`dspark convert --sample-from-anchor`, or a gate policy "
                 "drafter's sample_from_anchor)")


def _layout(raw: dict, model_type: str, path: str,
            option: bool | None) -> tuple[bool, Literal["config", "option"]]:
    field = LAYOUT_FIELD
    # Absent is the one "not stated"; null states no layout (speculators' schema refuses
    # it): a value of the wrong type (13), like "true" or 1, which speculators coerces and a
    # reader of its truth value does not ("false" is true).
    stated = None
    if field in raw:
        stated = raw[field]
        if not isinstance(stated, bool):
            raise _malformed(path, field, "true or false (a JSON boolean)", stated)
    if stated is not None and option is not None and stated != option:
        raise SampleFromAnchorOptionError(
            f"{STATED_LAYOUT} is {str(option).lower()}: {path} says {field} "
            f"{str(stated).lower()}; expected a stated layout only for a config without it",
            path=path, field=field, expected=stated, found=option)
    if stated is None and option is None:
        raise SampleFromAnchorMissingError(
            f"{path}: field '{field}' is missing; for a {model_type} drafter "
            f"{MISSING_LAYOUT_READINGS[model_type]}: the block layout is not guessed; state it as "
            "trained: `dspark convert --sample-from-anchor true|false`, or a gate policy "
            "drafter's sample_from_anchor", path=path, field=field,
            expected="true or false", found="nothing")
    value, by = (stated, "config") if stated is not None else (option, "option")
    if not value:
        where = f"{path}: field '{field}' is false" if by == "config" else \
            f"{STATED_LAYOUT} is false"
        raise anchor_layout_error(where, path=path, field=field)
    return True, by


def read_config(raw: dict, *, path: str, num_target_layers: int,
                sample_from_anchor: bool | None = None) -> Reading:
    """A speculators config.json (parsed, ``is_speculators_config``) read as the config.json
    of its DeepSpec twin, by FIELDS. ``num_target_layers``: the target's layer count;
    ``sample_from_anchor``: the layout the user stated (--sample-from-anchor), if any.
    Refusals: 13 (a field of the wrong type or missing), 33, 34, 35, 37, 38; what the twin's
    own contract refuses is left to it (contract/dspark.py)."""
    (arch,) = _row("architecture")
    model_type = raw[arch.speculators]
    if not isinstance(model_type, str):
        raise _malformed(path, arch.speculators, "a string ('dspark' or 'dflash')", model_type)
    if model_type not in MODEL_TYPES:
        raise SpeculatorsModelError(
            f"{path}: field '{arch.speculators}': expected one of "
            f"{', '.join(repr(m) for m in MODEL_TYPES)}, found {quoted_value(model_type)} (the "
            "speculators models the artifact format can express)", path=path,
            field=arch.speculators, expected=list(MODEL_TYPES), found=model_type)
    (layer,) = _row("layer")
    nested = layer.speculators.split(".")[0]
    tl = _get(raw, nested, path, dict, "a JSON object (the drafter's layer config)")
    tl_type = tl.get("model_type", QWEN3_MODEL_TYPE)
    if not isinstance(tl_type, str):
        raise _malformed(path, f"{nested}.model_type", "a string ('qwen3')", tl_type)
    if tl_type != QWEN3_MODEL_TYPE:
        raise SpeculatorsModelError(
            f"{path}: field '{nested}.model_type': expected 'qwen3', found "
            f"{quoted_value(tl_type)}: speculators {SPECULATORS_VERSION}'s DSpark and DFlash "
            "drafters are Qwen3 layers (a Gemma4 DSpark drafter has no speculators form)",
            path=path, field=f"{nested}.model_type", expected=QWEN3_MODEL_TYPE,
            found=tl_type)
    proposal = _get(raw, "speculators_config", path, dict,
                    "a JSON object (the algorithm, proposal and verifier)", required=False)
    algorithm = None if proposal is None else proposal.get("algorithm")
    if algorithm is not None and not isinstance(algorithm, str):
        raise _malformed(path, "speculators_config.algorithm", "a string", algorithm)
    if algorithm is not None and algorithm != model_type:
        raise SpeculatorsModelError(
            f"{path}: field 'speculators_config.algorithm' is {quoted_value(algorithm)} but "
            f"speculators_model_type is {quoted_value(model_type)}; expected them equal",
            path=path, field="speculators_config.algorithm", expected=model_type,
            found=algorithm)
    value, by = _layout(raw, model_type, path, sample_from_anchor)

    # "layer": every field of the layer config, unchanged, but those DeepSpec's config holds
    # at the top of speculators' (block_size, markov_rank, ...): speculators reads those from
    # the top level alone, and so does the twin (a nested copy is not the drafter's).
    from_top = {r.deepspec for r in FIELDS if r.kind != "layer" and r.deepspec is not None}
    twin: dict = {k: v for k, v in tl.items() if k not in from_top}
    twin["model_type"] = tl_type
    twin[arch.deepspec] = [DEEPSPEC_ARCHITECTURE]
    (vocab,) = _row("vocabulary")
    vocab_size = tl.get("vocab_size")
    draft = _get(raw, vocab.speculators, path, int, "an integer (the draft vocabulary's size)")
    if isinstance(vocab_size, int) and not isinstance(vocab_size, bool) and draft != vocab_size:
        raise DraftVocabularyError(
            f"{path}: field '{vocab.speculators}' is {quoted_value(draft)} but "
            f"'{nested}.vocab_size' is {quoted_value(vocab_size)}: a reduced draft vocabulary "
            "(d2t/t2d); the artifact format has no vocabulary map yet", path=path,
            field=vocab.speculators, expected=vocab_size, found=draft)
    (hidden,) = _row("hidden")
    target_hidden = _get(raw, hidden.speculators, path, int, "null or an integer",
                         required=False)
    if target_hidden is not None and target_hidden != tl.get("hidden_size"):
        raise SpeculatorsModelError(
            f"{path}: field '{hidden.speculators}' is {quoted_value(target_hidden)} but "
            f"'{nested}.hidden_size' is {quoted_value(tl.get('hidden_size'))}; expected null or "
            "the same (a DeepSpec drafter has its target's hidden size)", path=path,
            field=hidden.speculators, expected=tl.get("hidden_size"), found=target_hidden)
    (shift,) = _row("shift")
    aux = _get(raw, shift.speculators, path, list, "a list of integers (the target's hidden "
               "states the drafter taps; 0 = the embedding)")
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in aux):
        raise _malformed(path, shift.speculators, "a list of integers", aux)
    twin[shift.deepspec] = [i - 1 for i in aux]
    (target,) = _row("target")
    twin[target.deepspec] = num_target_layers
    for row in _row("copy"):
        if row.speculators in raw:
            twin[row.deepspec] = raw[row.speculators]
    for field in ("block_size", "mask_token_id"):
        _get(raw, field, path, int, "an integer")
    dspark = model_type == "dspark"
    rank_row, type_row = _row("markov")
    rank = _get(raw, rank_row.speculators, path, int, "an integer") if dspark else 0
    twin[rank_row.deepspec] = rank
    # speculators writes markov_head_type and confidence_head_with_markov always: their type
    # is checked where DeepSpec's config has none of them too.
    head_type = _get(raw, type_row.speculators, path, str, "'vanilla', 'gated' or 'rnn'",
                     required=rank > 0) if dspark else None
    if rank > 0:
        twin[type_row.deepspec] = head_type
    enabled_row, with_row = _row("confidence")
    enabled = _get(raw, enabled_row.speculators, path, bool, "true or false") if dspark else False
    twin[enabled_row.deepspec] = enabled
    with_markov = _get(raw, with_row.speculators, path, bool, "true or false",
                       required=enabled) if dspark else None
    if enabled:
        twin[with_row.deepspec] = with_markov
    return Reading(twin=twin, model_type=model_type, sample_from_anchor=value,
                   layout_stated_by=by)


def vocabulary_map_error(path: str, names: set[str]) -> DraftVocabularyError | None:
    """The refusal of weights holding a reduced vocabulary's map (d2t / t2d), if they do."""
    held = sorted(n for n in VOCABULARY_MAP if n in names)
    if not held:
        return None
    return DraftVocabularyError(
        f"{path}: tensor '{held[0]}': a reduced draft vocabulary's map (d2t/t2d); the artifact "
        "format has no vocabulary map yet", path=path, tensor=held[0], expected="absent",
        found="present")


# --- writing: an artifact's contract as speculators' config.json --------------------------------

def write_config(contract, source_config: dict, *, verifier_name: str,
                 verifier_architectures: list[str]) -> dict:
    """speculators' config.json for a Qwen3 DSpark contract (contract/dspark.FeatureContract),
    by FIELDS: the contract's geometry, taps, block and heads; the Qwen3 fields the contract
    does not hold from the source's config.json (``source_config``: the DeepSpec config the
    artifact was converted from); the verifier (the target). BF16 weights."""
    g = contract.geometry
    from_contract = {
        "model_type": QWEN3_MODEL_TYPE, "vocab_size": g.vocab_size,
        "hidden_size": g.hidden_size, "intermediate_size": g.intermediate_size,
        "num_hidden_layers": g.num_draft_layers, "num_attention_heads": g.num_attention_heads,
        "num_key_value_heads": g.num_key_value_heads, "head_dim": g.head_dim,
        "hidden_act": "silu", "attention_bias": False, "rms_norm_eps": g.rms_norm_eps,
        "rope_parameters": {"rope_theta": g.rope_theta, "rope_type": "default"},
        "use_sliding_window": False, "tie_word_embeddings": False,
    }
    tl = {}
    for name in QWEN3_FIELDS:
        if name in from_contract:
            tl[name] = from_contract[name]
        elif source_config.get(name) is not None:
            tl[name] = source_config[name]
    out: dict = {"architectures": [MODEL_TYPES[WRITTEN_MODEL_TYPE]]}
    for row in FIELDS:
        kind, key = row.kind, row.speculators
        if key is None:                                  # DeepSpec's only: not in the format
            continue
        if kind == "architecture":
            out[key] = WRITTEN_MODEL_TYPE
        elif kind == "layer":
            out[key.split(".")[0]] = tl
        elif kind == "shift":
            out[key] = [i + 1 for i in contract.taps.target_layer_ids]
        elif kind == "copy":
            out[key] = {"block_size": contract.block.block_size,
                        "mask_token_id": contract.block.mask_token_id,
                        "dtype": "bfloat16"}[row.deepspec]
        elif kind == "markov":
            out[key] = (contract.markov_head.rank if row.deepspec == "markov_rank" else
                        contract.markov_head.type if contract.markov_head.rank > 0 else "vanilla")
        elif kind == "confidence":
            out[key] = (contract.confidence_head.enabled if row.deepspec == "enable_confidence_head"
                        else contract.confidence_head.with_markov)
        elif kind == "vocabulary":
            out[key] = g.vocab_size
        elif kind == "layout":
            out[key] = contract.block.anchor_first      # always true: the format's layout
        elif kind == "hidden":
            out[key] = None
        elif key == "sliding_window_non_causal":
            out[key] = False
        elif key == "speculators_config":
            out[key] = {"algorithm": WRITTEN_MODEL_TYPE, "default_proposal_method": "greedy",
                        "proposal_methods": [{"accept_tolerance": 0.0, "proposal_type": "greedy",
                                              "speculative_tokens": contract.block.block_size,
                                              "verifier_accept_k": 1}],
                        "verifier": {"architectures": list(verifier_architectures),
                                     "name_or_path": verifier_name}}
        elif key == "speculators_version":
            out[key] = SPECULATORS_VERSION
        else:  # a row no rule writes: the table and this function disagree
            raise AssertionError(f"FIELDS row {key!r} of kind {kind!r} has no writer")
    out["tie_word_embeddings"] = False
    return out


def config_bytes(config: dict) -> bytes:
    """config.json as transformers' save_pretrained writes one (sorted keys, two-space indent,
    a final newline); NaN is refused (a contract never holds one)."""
    return (json.dumps(config, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()


def written_tensors(source_names: list[str]) -> list[str]:
    """The weights speculators' format holds of an artifact's tensors (source names), by KEYS:
    every one, less those speculators never saves."""
    return [n for n in source_names if n not in NEVER_SAVED]
