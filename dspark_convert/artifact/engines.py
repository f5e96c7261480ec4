"""Which engine can do what with an artifact: reports by stage (docs/ENGINES.md).

Three consumers, each judged by re-deriving the rules its own code applies (cited per rule
in docs/ENGINES.md; no engine code is copied):

- ``strata.open``: Strata's DFlash loader, ``DFlashArtifact::open`` (src/core/dflash.cpp,
  the build that reads quantized matrices, Strata commit 40c92fc): metadata, bounds, the
  DSpark/DFlash2 refusals, the 58-tensor inventory with its type and shape rules.
- ``strata.run``: what the runtime then demands, ``DFlashArtifact::validate_supported``
  (the one drafter geometry its fast path implements: the published Flash-Next drafter)
  and the fixed rms eps of src/core/dflash_runtime.cpp; everything ``strata.open``
  refuses is refused here first.
- ``llama.cpp``: how llama.cpp's DFlash/DSpark loader would read the file (docs/REFERENCE.md §6:
  llama.cpp 0c1e570; src/llama-model.cpp, src/models/dflash.cpp, src/llama-vocab.cpp,
  src/llama-model-loader.cpp): its required keys with their exact GGUF types, the
  ``target_layers`` convention, the embedded tokenizer and mask token, the vanilla-only
  Markov head, the exact tensor count and the embedding it takes for the head; checked
  against llama.cpp's real loader on a corpus of edited files
  (tests/test_llama_cpp_loader.py). The file llama.cpp does load is ``dspark export``'s
  (artifact/llama_cpp.py).

The rules judge a file by its drafter family (``dspark.family``; none: Qwen3's). A Gemma4
artifact (``gemma4-dspark``) is one no engine here runs: each engine's own rules say where it
stops and why (``FAMILY_NOTES`` appends our reason to its words), and the ``gemma4.*`` rules
what each would compute otherwise were it loaded (docs/ENGINES.md, "A Gemma4 artifact, stage
by stage"). Its refusals are all information (``MADE_FOR``), never a failed check.

Every function here is pure: it reads a metadata mapping (key -> value), the GGUF type of
each key (key -> ``"UINT32"``, ``"STRING"``, ``"ARRAY[UINT32]"`` ...: llama.cpp's rules
depend on exact types) and the tensor list ``(name, ggml type name, GGUF shape)``. An
engine's report lists every refusal its rules find, in the order the engine meets them,
so its ``reason`` (the first) is what the engine itself would say first. Each refusal has
a kind:

- ``load_error``: the engine stops loading the file (a broken or foreign artifact);
- ``unsupported``: a drafter the engine does not implement (DSpark heads in Strata today,
  any geometry but Flash-Next in Strata's runtime, a gated/rnn head in llama.cpp);
- ``misread``: the engine loads it but reads something else than the drafter means (a
  tap convention, a default rope base, a fixed rms eps): it would run, wrongly.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from dspark_convert.artifact import llama_cpp as L
from dspark_convert.artifact.engine_names import ENGINES
from dspark_convert.checks import Check
from dspark_convert.contract import dflash2, dspark, gemma4, gemma4_assistant
from dspark_convert.contract.tensor_table import TENSOR_RULES, eval_dim, expand_rule
from dspark_convert.errors import DSparkError, EngineRequirementError, StrataRuleError

Kind = Literal["load_error", "unsupported", "misread"]
TensorRow = tuple[str, str, Sequence[int]]          # (name, ggml type name, GGUF shape)


@dataclass(frozen=True)
class Refusal:
    rule: str           # stable id: "<engine>/<rule>"
    kind: Kind
    message: str        # in the engine's own terms


@dataclass(frozen=True)
class EngineReport:
    engine: str
    refusals: tuple[Refusal, ...]
    family: str = dspark.FAMILY     # the artifact's drafter family (its rules chose by it)

    @property
    def accepts(self) -> bool:
        return not self.refusals

    @property
    def reason(self) -> str | None:
        """The first refusal: what the engine itself would report first."""
        return self.refusals[0].message if self.refusals else None

    def to_dict(self) -> dict:
        """The form ``validate --json`` reports: ``{"accepts": bool, "reason": str|None}``."""
        return {"accepts": self.accepts, "reason": self.reason}


# --- the artifact as the rules see it ----------------------------------------------------------

_INTEGER_TYPES = {"UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "UINT64", "INT64"}
_NUMERIC_TYPES = _INTEGER_TYPES | {"FLOAT32", "FLOAT64", "BOOL"}


# The drafter families the rules know (contract/families.py's rows): a file without
# dspark.family (format version 1, a foreign DFlash file, a `dspark export` file) is Qwen3's.
QWEN3 = dspark.FAMILY
GEMMA4 = gemma4.FAMILY
DFLASH2 = dflash2.FAMILY
ASSISTANT = gemma4_assistant.FAMILY
KNOWN_FAMILIES = (QWEN3, GEMMA4, DFLASH2, ASSISTANT)
ONLY_QWEN3 = frozenset({QWEN3})
ONLY_GEMMA4 = frozenset({GEMMA4})
ONLY_DFLASH2 = frozenset({DFLASH2})
ONLY_ASSISTANT = frozenset({ASSISTANT})
DSPARK_FAMILIES = frozenset({QWEN3, GEMMA4})
# Files under llama.cpp's `dflash` architecture (every family but the assistant's).
DFLASH_ARCH_FAMILIES = frozenset({QWEN3, GEMMA4, DFLASH2})


def file_family(kv: Mapping[str, object]) -> str:
    """The family whose rules apply to a file: its dspark.family when that names a known
    family; when there is none, the assistant's for a `gemma4-assistant` file, else Qwen3's;
    else the value as read (FAMILY_RULE refuses it)."""
    family = kv.get("dspark.family")
    if family is None:
        # A file of llama.cpp's gemma4-assistant architecture (its converter's, or `dspark
        # export`'s) is judged by the assistant's rules; any other by Qwen3's.
        return ASSISTANT if kv.get("general.architecture") == gemma4_assistant.FAMILY else QWEN3
    return family if isinstance(family, str) else repr(family)


@dataclass
class _View:
    kv: Mapping[str, object]
    types: Mapping[str, str]
    tensors: tuple[tuple[str, str, tuple[int, ...]], ...]
    path: str
    family: str = QWEN3
    found: dict = field(default_factory=dict)      # what earlier rules parsed (geometry ...)

    def type_of(self, key: str) -> str | None:
        return self.types.get(key)

    @property
    def names(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        return {n: (t, s) for n, t, s in self.tensors}


def _view(kv: Mapping[str, object], types: Mapping[str, str],
          tensors: Iterable[TensorRow], path: str) -> _View:
    rows = tuple((str(n), str(t), tuple(int(d) for d in s)) for n, t, s in tensors)
    return _View(kv=kv, types=types, tensors=rows, path=path, family=file_family(kv))


@dataclass(frozen=True)
class Rule:
    """One rule: ``check(view)`` returns the refusal message, or None. Rules run in order;
    ``needs`` names what earlier rules must have parsed (``view.found``) for it to apply;
    ``families`` the drafter families whose files it judges (None: every file)."""
    id: str
    kind: Kind
    check: Callable[[_View], str | None]
    needs: tuple[str, ...] = ()
    final: bool = False     # a refusal of this rule is the whole report (no rule after it)
    families: frozenset[str] | None = None


def _run(engine: str, rules: Sequence[Rule], view: _View) -> tuple[Refusal, ...]:
    out = []
    for rule in rules:
        if rule.families is not None and view.family not in rule.families:
            continue
        if any(view.found.get(need) is None for need in rule.needs):
            continue
        message = rule.check(view)
        if message is not None:
            rule_id = f"{engine}/{rule.id}"
            note = FAMILY_NOTES.get((view.family, rule_id))
            out.append(Refusal(rule_id, rule.kind, f"{message} ({note})" if note else message))
            if rule.final:
                break
    return tuple(out)


def _family(view: _View) -> str | None:
    """A dspark.family these rules do not know (validate refuses the file): nothing of an
    engine's rules can be said of it."""
    if view.family in KNOWN_FAMILIES:
        return None
    arch = view.kv.get("general.architecture")
    return (f"general.architecture is '{arch}': a {view.family} drafter (dspark.family), a "
            f"family these engine rules do not know ({' or '.join(KNOWN_FAMILIES)})")


FAMILY_RULE = Rule("family", "unsupported", _family, final=True)

# What an engine's own words mean for one family's artifacts, appended to the refusal of
# that rule: (family, rule id) -> the reason, in our words (docs/ENGINES.md, "A Gemma4
# artifact, stage by stage").
FAMILY_NOTES: dict[tuple[str, str], str] = {
    (GEMMA4, "strata.open/architecture"):
        f"a {GEMMA4} drafter, which Strata's DFlash loader and runtime do not implement; they "
        "read the Qwen3-style DFlash drafter: two norms a layer, a v_proj, SiLU, full NeoX "
        "RoPE, an unscaled embedding, attention scaled by 1/16, no softcap",
    (GEMMA4, "strata.open/tensor_inventory"):
        "Strata requires a Qwen3 layer's 11 tensors, v_proj among them; a Gemma4 drafter "
        "under attention_k_eq_v has none: V is the RMS norm of k_proj's output",
    (DFLASH2, "strata.open/sample_from_anchor"):
        "a DFlash2 drafter (speculators' DFlash2DraftModel): slot 0 is the anchor and the "
        "candidate selector walks the block; Strata's loader reads DeepSpec's anchor-first "
        "DFlash and refuses DFlash2 (its selector and conv tensors too)",
    (DFLASH2, "llama.cpp/key.dflash.context_length"):
        "this is our DFlash2 artifact: llama.cpp's keys and tensor names, but none of what its "
        "converter (conversion/qwen.py:664, z-lab's layout, --target-model-dir) adds from the "
        "target: context length, tokenizer, mask token key",
    (GEMMA4, "llama.cpp/architecture"):
        f"a {GEMMA4} artifact, in Strata's layout: llama.cpp 0c1e570 reads Gemma4 DSpark "
        "drafters under 'dflash', as its own converter writes them, and `dspark export` "
        "writes none (105)",
}


# --- strata.open: DFlashArtifact::open (src/core/dflash.cpp) ----------------------------------

STRATA_QUANT_TYPES = ("Q8_0", "Q5_0", "Q4_0")       # GGML types 8, 6, 2 in `require`
STRATA_MAX_LAYERS = 64
STRATA_MAX_BLOCK_SIZE = 128
STRATA_MAX_TAPS = 64                                # "the reader keeps a 64-item sample"
# Substrings of a tensor name that mark a DFlash2/DSpark extension Strata refuses today.
STRATA_EXTENSION_PARTS = ("selector", "conv_base", "conv_proj", "markov", "conf_proj", "d2t")
STRATA_OWN_EMBEDDING = ("token_embd.weight", "output.weight")

# (geometry field, metadata keys in the order Strata looks them up, required): the `nums`
# table of DFlashArtifact::open. The first key present wins, even when it is not a number.
STRATA_NUMBERS: tuple[tuple[str, tuple[str, ...], bool], ...] = (
    ("hidden", ("dflash.embedding_length", "qwen3.embedding_length",
                "qwen3_dflash.embedding_length"), True),
    ("layers", ("dflash.block_count", "qwen3.block_count", "qwen3_dflash.block_count"), True),
    ("n_head", ("dflash.attention.head_count", "qwen3.attention.head_count"), True),
    ("n_head_kv", ("dflash.attention.head_count_kv", "qwen3.attention.head_count_kv"), True),
    ("intermediate", ("dflash.feed_forward_length", "qwen3.feed_forward_length"), True),
    ("vocab", ("dflash.vocab_size", "qwen3.vocab_size"), True),
    ("block_size", ("dflash.block_size",), True),
    ("head_dim", ("dflash.attention.key_length", "qwen3.attention.key_length"), False),
    ("mask_token_id", ("dflash.mask_token_id",), False),
    ("markov_rank", ("dflash.markov_rank",), False),
    ("selector_top_k", ("dflash.selector_top_k",), False),
)
STRATA_DEFAULTS = {"head_dim": 0, "mask_token_id": -1, "markov_rank": 0, "selector_top_k": 0}
STRATA_ROPE_KEYS = ("dflash.rope.frequency_base", "qwen3.rope.frequency_base")
# (flag, keys, default): meta_flag reads "true"/"1" strings and non-zero numbers.
STRATA_FLAGS = (("sample_from_anchor", ("dflash.sample_from_anchor",), True),
                ("causal", ("dflash.attention.causal", "dflash.causal"), False),
                ("confidence_head", ("dflash.has_confidence_head",), False))
STRATA_TAP_KEYS = ("dflash.target_layers", "target_layers")


def _first_key(view: _View, keys: Sequence[str]) -> str | None:
    return next((k for k in keys if k in view.kv), None)


def _is_num(view: _View, key: str) -> bool:
    value = view.kv[key]
    # GGUF BOOL is a number to Strata's MetaValue (a u8); a string or array is not.
    return view.type_of(key) in _NUMERIC_TYPES and isinstance(value, numbers.Real)


def _c_int(value: numbers.Real) -> int:
    """(int64_t) of a number, as C converts it: toward zero. C leaves a NaN or an infinity
    undefined; it is read here as 0, which every bound refuses."""
    if isinstance(value, float) and not math.isfinite(value):
        return 0
    return int(value)


def _c_double(value: numbers.Real) -> float:
    """(double) of a number; an integer beyond the double range is an infinity, as a C
    conversion makes it (Python raises instead)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _strata_parse_numbers(view: _View) -> str | None:
    geom = {}
    for name, keys, required in STRATA_NUMBERS:
        key = _first_key(view, keys)
        if key is None or not _is_num(view, key):
            if required:
                many = len(keys) > 1
                return (f"dflash: missing metadata key{' (any of' if many else ''} {keys[0]}"
                        f"{'...)' if many else ''} in {view.path}")
            geom[name] = STRATA_DEFAULTS[name]
            continue
        geom[name] = _c_int(view.kv[key])
    view.found["numbers"] = geom
    return None


def _strata_head_dim(view: _View) -> str | None:
    g = view.found["numbers"]
    if g["head_dim"] <= 0:
        if g["hidden"] <= 0 or g["n_head"] <= 0 or g["hidden"] % g["n_head"]:
            return "dflash: cannot derive the head dim from embedding_length / attention.head_count"
        g["head_dim"] = g["hidden"] // g["n_head"]
    return None


def _strata_flag(view: _View, keys: Sequence[str], default: bool) -> bool:
    key = _first_key(view, keys)
    if key is None:
        return default
    value = view.kv[key]
    if view.type_of(key) == "STRING":
        return value in ("true", "1")
    if _is_num(view, key):
        return value != 0
    return default


def _strata_parse_rest(view: _View) -> str | None:
    """rope theta and the flags: read without refusing (meta_f64 / meta_flag)."""
    key = _first_key(view, STRATA_ROPE_KEYS)
    view.found["rope_theta"] = _c_double(view.kv[key]) if key and _is_num(view, key) else 0.0
    view.found["flags"] = {name: _strata_flag(view, keys, default)
                           for name, keys, default in STRATA_FLAGS}
    return None


def _is_array(value: object) -> bool:
    """A metadata array as the reader returns it: a list, or formats/gguf_reader.GGUFArray
    (a long scalar array kept packed, a Sequence); a string is no array."""
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def _strata_taps(view: _View) -> str | None:
    key = _first_key(view, STRATA_TAP_KEYS)
    if key is None:
        return "dflash: missing dflash.target_layers (the taps this drafter was trained against)"
    value, gtype = view.kv[key], view.type_of(key) or ""
    if not gtype.startswith("ARRAY") or gtype == "ARRAY[STRING]" or not _is_array(value):
        return "dflash: target_layers must be an integer array"
    if len(value) > STRATA_MAX_TAPS:
        return "dflash: implausibly long target_layers array"
    if not all(isinstance(x, numbers.Real) for x in value):
        return "dflash: target_layers must be an integer array"
    view.found["taps"] = [_c_int(x) for x in value]
    return None


def _strata_bounds(view: _View) -> str | None:
    g = view.found["numbers"]
    sane = (g["hidden"] > 0 and 0 < g["layers"] <= STRATA_MAX_LAYERS and g["n_head"] > 0
            and g["n_head_kv"] > 0 and g["head_dim"] > 0 and g["intermediate"] > 0
            and g["vocab"] > 0 and 0 < g["block_size"] <= STRATA_MAX_BLOCK_SIZE)
    if not sane:
        return (f"dflash: implausible geometry (hidden={g['hidden']} layers={g['layers']} "
                f"heads={g['n_head']}/{g['n_head_kv']} head_dim={g['head_dim']} "
                f"intermediate={g['intermediate']} vocab={g['vocab']} "
                f"block_size={g['block_size']})")
    view.found["geometry"] = g
    return None


def _strata_tap_order(view: _View) -> str | None:
    taps = view.found["taps"]
    if any(t < 0 for t in taps) or any(b <= a for a, b in zip(taps, taps[1:])):
        return (f"dflash: target_layers must be strictly increasing and non-negative, got "
                f"[{taps[0]}, ..., {taps[-1]}]")
    return None


def _strata_anchor(view: _View) -> str | None:
    if not view.found["flags"]["sample_from_anchor"]:
        return ("dflash: this artifact declares the generic 1+N fill-in layout "
                "(dflash.sample_from_anchor=false); this implementation supports only the "
                "DeepSpec anchor layout (query_zero_predicts_next)")
    return None


def _strata_causal(view: _View) -> str | None:
    if view.found["flags"]["causal"]:
        return ("dflash: this artifact declares causal block attention; the DeepSpec drafter "
                "is trained non-causal (dflash.attention.causal=false)")
    return None


def _strata_dspark(view: _View) -> str | None:
    if view.found["numbers"]["markov_rank"] > 0 or view.found["flags"]["confidence_head"]:
        return ("dflash: this artifact carries DSpark extras (Markov head / confidence gate); "
                "this implementation supports plain DeepSpec DFlash only")
    return None


def _strata_selector(view: _View) -> str | None:
    top_k = view.found["numbers"]["selector_top_k"]
    if top_k > 0:
        return (f"dflash: this artifact carries a DFlash2 selector (dflash.selector_top_k="
                f"{top_k}); DFlash2 is out of scope")
    return None


def _strata_own_embedding(view: _View) -> str | None:
    for name, _t, _s in view.tensors:
        if name in STRATA_OWN_EMBEDDING:
            return (f"dflash: the artifact ships its own '{name}'; the DeepSpec drafter strips "
                    "both and binds them from the target at load")
    return None


def _strata_extension_tensor(view: _View) -> str | None:
    for name, _t, _s in view.tensors:
        if name not in STRATA_OWN_EMBEDDING and any(p in name for p in STRATA_EXTENSION_PARTS):
            return (f"dflash: unexpected tensor '{name}' (DFlash2/DSpark extension); this "
                    "implementation reads plain DeepSpec DFlash artifacts")
    return None


def _strata_canon(hf_name: str) -> str:
    # Strata's canonical names are the HF names without ".weight" ("layers.0.self_attn.q_proj").
    return hf_name.removesuffix(".weight")


def strata_inventory(geometry: Mapping[str, int],
                     taps: int) -> list[tuple[str, tuple[str, ...], tuple[int, ...]]]:
    """(canonical name, names Strata accepts, GGUF shape) of every tensor Strata requires, in
    the order `open` resolves them: fc, hidden_norm, norm, then layer by layer. Names and
    shapes come from our own tensor table (the same 58 tensors for 5 layers)."""
    symbols = {"H": geometry["hidden"], "I": geometry["intermediate"], "nh": geometry["n_head"],
               "nkv": geometry["n_head_kv"], "d": geometry["head_dim"], "m": taps,
               "V": geometry["vocab"], "r": 0, "rc": 0}
    rules = [r for r in TENSOR_RULES if r.when == "always" and r.gguf is not None]
    out = []

    def add(hf: str, gguf: str, shape_expr: tuple[str, ...]) -> None:
        names = (gguf,) if gguf == hf else (gguf, hf)
        shape = tuple(eval_dim(e, symbols) for e in reversed(shape_expr))
        out.append((_strata_canon(hf), names, shape))

    for rule in rules:
        if not rule.per_layer:
            add(rule.source, rule.gguf, rule.shape)
    for layer in range(geometry["layers"]):
        for rule in rules:
            if rule.per_layer:
                add(rule.source.format(i=layer), rule.gguf.format(i=layer), rule.shape)
    return out


def _strata_require(view: _View) -> str | None:
    """`DFlashArtifact::require` for every tensor, in order: one name only, present, a type
    Strata reads for that tensor, the expected shape."""
    g, taps = view.found["geometry"], view.found["taps"]
    present = view.names
    resolved = set()
    for canon, names, shape in strata_inventory(g, len(taps)):
        found = [n for n in names if n in present]
        if len(found) > 1:
            return (f"dflash: tensor '{canon}' is present under two names ('{found[0]}' and "
                    f"'{found[1]}'); the artifact must pick one family")
        if not found:
            looked = "".join(f" '{n}'," for n in names)
            return f"dflash: missing required tensor '{canon}' (looked for{looked} in {view.path})"
        name = found[0]
        gtype, gshape = present[name]
        quant_ok = len(shape) == 2 and shape[0] % 32 == 0 and gtype in STRATA_QUANT_TYPES
        if gtype != "BF16" and not quant_ok:
            return (f"dflash: tensor '{name}' is {gtype}; expected BF16 norms and BF16, Q8_0, "
                    "Q5_0 or Q4_0 matrices")
        if tuple(gshape) != shape:
            return (f"dflash: tensor '{name}' has shape {_shape(gshape)}, expected "
                    f"{_shape(shape)} for '{canon}'")
        resolved.add(name)
    view.found["resolved"] = resolved
    return None


def _shape(shape: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _strata_unknown(view: _View) -> str | None:
    for name, _t, _s in view.tensors:
        flagged = name in STRATA_OWN_EMBEDDING or any(p in name for p in STRATA_EXTENSION_PARTS)
        if name not in view.found["resolved"] and not flagged:
            return f"dflash: unknown tensor '{name}' in the artifact"
    return None


# What the tensors of a Gemma4 layer that Strata's inventory has no place for are.
GEMMA4_TENSOR_ROLES = {"layer_output_scale.weight": "the layer scalar",
                       "post_attention_norm.weight": "the norm of the attention output",
                       "post_ffw_norm.weight": "the norm of the MLP output"}


def _per_layer_pattern(name: str) -> str:
    """'blk.3.post_ffw_norm.weight' -> 'blk.N.post_ffw_norm.weight'."""
    parts = name.split(".")
    if len(parts) > 2 and parts[0] == "blk" and parts[1].isdigit():
        return ".".join(["blk", "N", *parts[2:]])
    return name


def _strata_gemma4_unknown(view: _View) -> str | None:
    """`open`'s last check, unknown tensors, judged against every name its inventory
    accepts (not only those it resolved): on a Gemma4 file it is never reached, since the
    inventory refuses the missing v_proj first, but these tensors are what it would meet
    next, whatever Strata's tensor order."""
    names = {n for _canon, aliases, _shape in strata_inventory(view.found["geometry"],
                                                               len(view.found["taps"]))
             for n in aliases}
    unknown = [name for name, _t, _s in view.tensors
               if name not in names and name not in STRATA_OWN_EMBEDDING
               and not any(p in name for p in STRATA_EXTENSION_PARTS)]
    if not unknown:
        return None
    patterns = list(dict.fromkeys(_per_layer_pattern(n) for n in unknown))
    described = "; ".join(
        p + next((f", {role}" for suffix, role in GEMMA4_TENSOR_ROLES.items()
                  if p.endswith("." + suffix)), "") for p in patterns)
    return (f"dflash: unknown tensor '{unknown[0]}' in the artifact (its inventory has no "
            f"place for {len(unknown)} of this drafter's tensors: {described})")


def _strata_architecture(view: _View) -> str | None:
    if "general.architecture" not in view.kv:
        return "dflash: missing general.architecture"
    value = view.kv["general.architecture"]
    text = value if isinstance(value, str) else ""
    if text != "dflash":
        return f"dflash: general.architecture is '{text}', a DFlash artifact declares 'dflash'"
    return None


def _strata_assistant(view: _View) -> str | None:
    arch = view.kv.get("general.architecture")
    return (f"dflash: general.architecture is '{arch}', a DFlash artifact declares 'dflash' "
            "(an MTP assistant drafting over the target's KV is not a block drafter Strata's "
            "DFlash loader implements)")


STRATA_OPEN_RULES: tuple[Rule, ...] = (
    FAMILY_RULE,
    Rule("assistant", "load_error", _strata_assistant, final=True, families=ONLY_ASSISTANT),
    Rule("architecture", "load_error", _strata_architecture),
    Rule("metadata_numbers", "load_error", _strata_parse_numbers),
    Rule("head_dim", "load_error", _strata_head_dim, ("numbers",)),
    Rule("metadata_flags", "load_error", _strata_parse_rest),        # a parse step: never refuses
    Rule("target_layers", "load_error", _strata_taps),
    Rule("geometry_bounds", "load_error", _strata_bounds, ("numbers",)),
    Rule("target_layers_order", "load_error", _strata_tap_order, ("taps",)),
    Rule("sample_from_anchor", "load_error", _strata_anchor, ("flags",)),
    Rule("causal", "load_error", _strata_causal, ("flags",)),
    Rule("dspark_extras", "unsupported", _strata_dspark, ("numbers", "flags")),
    Rule("dflash2_selector", "unsupported", _strata_selector, ("numbers",)),
    Rule("own_embedding", "load_error", _strata_own_embedding),
    Rule("extension_tensor", "unsupported", _strata_extension_tensor),
    Rule("tensor_inventory", "load_error", _strata_require, ("geometry", "taps")),
    Rule("unknown_tensor", "load_error", _strata_unknown, ("resolved",), families=ONLY_QWEN3),
    Rule("gemma4.unknown_tensors", "load_error", _strata_gemma4_unknown, ("geometry", "taps"),
         families=ONLY_GEMMA4),
)


# --- strata.run: DFlashArtifact::validate_supported + the runtime's fixed rms eps --------------

# (geometry field, Strata's name for it, the Flash-Next value): validate_supported's `fixed`.
FLASH_NEXT: tuple[tuple[str, str, int], ...] = (
    ("hidden", "embedding_length", 2560),
    ("layers", "block_count", 5),
    ("n_head", "attention.head_count", 24),
    ("n_head_kv", "attention.head_count_kv", 2),
    ("head_dim", "attention.key_length", 256),
    ("intermediate", "feed_forward_length", 7680),
)
FLASH_NEXT_TAPS = 5
STRATA_RUNTIME_RMS_EPS = 1e-6       # kEps, src/core/dflash_runtime.cpp


def _fixed_rule(field_name: str, what: str, want: int) -> Rule:
    def check(view: _View) -> str | None:
        got = view.found["geometry"][field_name]
        if got != want:
            return (f"dflash: {what} = {got}; the runtime's geometry-specific fast path "
                    f"implements the published Flash-Next drafter ({want}) only")
        return None
    return Rule(f"geometry.{what}", "unsupported", check, ("geometry",))


def _run_taps(view: _View) -> str | None:
    taps = view.found["taps"]
    if len(taps) != FLASH_NEXT_TAPS:
        return (f"dflash: target_layers holds {len(taps)} taps; the runtime implements "
                "five-tap drafters only")
    return None


def _run_rope(view: _View) -> str | None:
    if not view.found["rope_theta"] > 0:
        return "dflash: rope.frequency_base missing or non-positive"
    return None


def _run_rms_eps(view: _View) -> str | None:
    eps = view.kv.get("dflash.attention.layer_norm_rms_epsilon")
    if isinstance(eps, numbers.Real) and not math.isclose(_c_double(eps), STRATA_RUNTIME_RMS_EPS,
                                                          rel_tol=1e-6):
        return (f"Strata's runtime fixes the rms eps at 1e-6 (kEps) and reads no key for it; "
                f"this drafter declares dflash.attention.layer_norm_rms_epsilon = {_c_double(eps):g}: it "
                "would run with the wrong epsilon")
    return None


# --- a Gemma4 drafter in Strata's runtime: what it would compute otherwise, were it loaded ---
# Strata's drafter forward (src/core/dflash_runtime.cpp, DFlashDrafter::propose and
# fusion_rows; docs/DFLASH.md "The drafter"; its attention kernels,
# src/kernels/cuda/qsa_decode_attn.cu) against the Gemma4 drafter's (docs/REFERENCE.md
# §10.0, §10.3). Each reads the family's own keys (artifact/format.py); what the two compute alike
# (RMSNorm as x·w, eps 1e-6, k_norm then RoPE, the fc + hidden_norm fusion, the target's
# head) is no rule.
GEMMA4_KEYS = {"k_eq_v": "dspark.gemma4.attention.k_eq_v", "rope_type": "dspark.gemma4.rope.type",
               "rope_factor": "dspark.gemma4.rope.partial_rotary_factor",
               "activation": "dspark.gemma4.hidden_activation",
               "softcap": "dspark.gemma4.final_logit_softcapping"}


def _text(view: _View, key: str) -> str | None:
    value = view.kv.get(key)
    return value if isinstance(value, str) else None


def _real(view: _View, key: str) -> float | None:
    value = view.kv.get(key)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        value = _c_double(value)
        return value if math.isfinite(value) else None
    return None


def _rotated_pairs(view: _View, head_dim: int) -> tuple[int, float, str] | None:
    """(pairs rotated, factor, RoPE type) of a drafter whose RoPE leaves some of the
    head_dim/2 pairs unrotated (proportional: int(f·D // 2) of them), else None."""
    factor = _real(view, GEMMA4_KEYS["rope_factor"])
    if factor is None or not 0 < factor < 1 or head_dim <= 1:
        return None
    return int(factor * head_dim // 2), factor, _text(view, GEMMA4_KEYS["rope_type"]) or "partial"


def _sqrt(n: int) -> float:
    return math.sqrt(_c_double(n))


def _g4_run_embedding(view: _View) -> str | None:
    hidden = view.found["numbers"]["hidden"]
    scale = f" = {_sqrt(hidden):g}" if hidden > 0 else ""
    return ("Strata's runtime feeds the target's embedding rows to the drafter unscaled "
            "(docs/DFLASH.md: 'raw target embedding, scale 1'); this drafter scales them by "
            f"sqrt(embedding_length){scale} (Gemma4's scaled embedding)")


def _g4_run_attention_scale(_view: _View) -> str | None:
    return ("Strata's drafter attention scales q·k by 1/16 = 1/sqrt(256), a constant of its "
            "kernels (head dim 256 compiled in; docs/DFLASH.md 'scaling 1/16'); this "
            "drafter's scale is 1.0 (q and k are RMS-normed per head)")


def _g4_run_rope(view: _View) -> str | None:
    head_dim = view.found["numbers"]["head_dim"]
    partial = _rotated_pairs(view, head_dim)
    if partial is None:
        return None
    n, factor, rope_type = partial
    half = head_dim // 2
    return (f"Strata's runtime rotates all {half} pairs of each head (NeoX RoPE over "
            f"key_length {head_dim}, dflash_rope_neox_apply); this drafter's {rope_type} RoPE "
            f"(partial_rotary_factor {factor:g}) rotates the first {n} alike and leaves the "
            f"other {half - n} as they are")


def _g4_run_value(view: _View) -> str | None:
    k_eq_v = _text(view, GEMMA4_KEYS["k_eq_v"])
    if k_eq_v == "true":
        return ("Strata's runtime takes V from v_proj, un-normalised (docs/DFLASH.md: "
                "v = v_proj(ctx)); under attention_k_eq_v this drafter has no v_proj: V is the "
                "RMS norm (no weight) of k_proj's output, before k_norm and RoPE")
    if k_eq_v == "false":
        return ("Strata's runtime takes V from v_proj, un-normalised (docs/DFLASH.md: "
                "v = v_proj(ctx)); this drafter RMS-normalises v_proj's output (v_norm, no "
                "weight)")
    return None


def _g4_run_activation(view: _View) -> str | None:
    activation = _text(view, GEMMA4_KEYS["activation"])
    if activation is None or activation == "silu":
        return None
    return ("Strata's MLP is SwiGLU, down(silu(gate(x))·up(x)) (swiglu_inplace; docs/DFLASH.md "
            f"'SiLU MLP'); this drafter's is down({activation}(gate(x))·up(x))")


def _g4_run_norms(_view: _View) -> str | None:
    return ("Strata's decoder layer has two norms: input_layernorm before attention, and "
            "before the MLP the one it binds as post_attention_layernorm (blk.N.ffn_norm.weight: "
            "here the drafter's pre_feedforward_layernorm, the right one); it adds the "
            "attention and MLP outputs to the residual as they are, which this drafter first "
            "RMS-normalises (blk.N.post_attention_norm, blk.N.post_ffw_norm)")


def _g4_run_layer_scalar(_view: _View) -> str | None:
    return ("Strata's decoder layer ends at its residual add; this drafter then multiplies the "
            "residual stream by its layer scalar (blk.N.layer_output_scale)")


def _g4_run_softcap(view: _View) -> str | None:
    cap = _real(view, GEMMA4_KEYS["softcap"])
    if cap is None or cap <= 0:
        return None
    return ("Strata drafts from the head's raw logits z (their argmax, and the top probability "
            f"its --spec-min-p gate reads); this drafter's logits are {cap:g}·tanh(z/{cap:g}): "
            "the argmax is the same (tanh is monotonic), the probabilities are not")


STRATA_RUN_RULES: tuple[Rule, ...] = (
    *(_fixed_rule(f, w, v) for f, w, v in FLASH_NEXT),
    Rule("geometry.target_layers", "unsupported", _run_taps, ("taps",)),
    Rule("rope_base", "unsupported", _run_rope, ("rope_theta",)),
    Rule("rms_eps", "misread", _run_rms_eps),
    Rule("gemma4.embedding_scale", "misread", _g4_run_embedding, ("numbers",),
         families=ONLY_GEMMA4),
    Rule("gemma4.attention_scale", "misread", _g4_run_attention_scale, families=ONLY_GEMMA4),
    Rule("gemma4.rope", "misread", _g4_run_rope, ("numbers",), families=ONLY_GEMMA4),
    Rule("gemma4.value", "misread", _g4_run_value, families=ONLY_GEMMA4),
    Rule("gemma4.activation", "misread", _g4_run_activation, families=ONLY_GEMMA4),
    Rule("gemma4.norms", "misread", _g4_run_norms, families=ONLY_GEMMA4),
    Rule("gemma4.layer_scalar", "misread", _g4_run_layer_scalar, families=ONLY_GEMMA4),
    Rule("gemma4.softcap", "misread", _g4_run_softcap, families=ONLY_GEMMA4),
)


# --- llama.cpp: llama_model::load_hparams, llama_model_dflash, llama_vocab ------------------------

# The names, key types and conventions are artifact/llama_cpp.py's (the one table `dspark
# export` writes by); this section is how llama.cpp's loader reads a file.
ARCH = L.ARCH
# ggml's names for the GGUF value types (gguf_type_name), as its "wrong type" error prints them.
GGUF_TYPE_NAMES = {"UINT8": "u8", "INT8": "i8", "UINT16": "u16", "INT16": "i16", "UINT32": "u32",
                   "INT32": "i32", "FLOAT32": "f32", "BOOL": "bool", "STRING": "str",
                   "ARRAY": "arr", "UINT64": "u64", "INT64": "i64", "FLOAT64": "f64"}
LLAMA_DEFAULT_ROPE_BASE = L.DEFAULT_ROPE_BASE
LLAMA_KEYS = L.LOADER_KEYS
_PER_LAYER_OK = set(L.PER_LAYER_KEYS)
LLAMA_TAP_KEY = L.TAP_KEY
# Keys that mark a file of Strata's conventions (DeepSpec tap ids): ours, and the rope base
# under Strata's name, which Strata's tools/dflash_gguf.py and our format write and
# llama.cpp's converter (and `dspark export`) never do (it writes dflash.rope.freq_base).
STRATA_CONVENTION_KEYS = ("dspark.format_version", "dflash.rope.frequency_base")
# LLAMA_MAX_LAYERS (src/llama-hparams.h): the per-layer arrays' size; get_key_or_arr
# refuses a layer count above it before it reads a per-layer key.
LLAMA_MAX_LAYERS = 512
LLAMA_TOKENIZER_KEYS = L.TOKENIZER_REQUIRED
LLAMA_MASK_KEY = L.MASK_KEY
# What the first refusal of one of our own artifacts adds: the file llama.cpp does load.
LLAMA_EXPORT_HINT = ("; this is the Strata-layout artifact: `dspark export ARTIFACT --engine "
                     "llama.cpp --target-gguf TARGET.gguf -o DRAFTER.gguf` writes the drafter "
                     "file llama.cpp 0c1e570 loads")
# The families `dspark export` writes a llama.cpp file for (artifact/llama_cpp.py), by hint.
LLAMA_EXPORT_HINTS = {QWEN3: LLAMA_EXPORT_HINT}


def _llama_alignment_type(view: _View) -> str | None:
    """gguf_init_from_reader (ggml/src/gguf.cpp): a general.alignment of another type than
    u32 fails the file before any model code reads it (gguf-py's GGUFReader refuses it too:
    "Bad type for general.alignment field"). Strata's tools/dflash_quantize.py writes it
    INT64."""
    got = view.type_of("general.alignment")
    if got is None or got == "UINT32":
        return None
    return (f"gguf_init_from_reader: key 'general.alignment' must be of type u32 but is "
            f"{GGUF_TYPE_NAMES.get(got.split('[')[0], got)}")


def _key_rule(key: str, want: str, required: bool) -> Rule:
    def check(view: _View) -> str | None:
        if key not in view.kv:
            return f"key not found in model: {key}" if required else None
        got = view.type_of(key) or "?"
        if got == want or (key in _PER_LAYER_OK and got.startswith("ARRAY")):
            return None
        return (f"key {key} has wrong type {GGUF_TYPE_NAMES.get(got.split('[')[0], got)} but "
                f"expected type {GGUF_TYPE_NAMES[want]}")
    return Rule(f"key.{key}", "load_error", check, families=DFLASH_ARCH_FAMILIES)


def _llama_max_layers(view: _View) -> str | None:
    layers, key = _dim(view, f"{ARCH}.block_count"), f"{ARCH}.feed_forward_length"
    if layers is not None and layers > LLAMA_MAX_LAYERS and key in view.kv:
        return f"n > N_MAX: {layers % 2**32} > {LLAMA_MAX_LAYERS} for key {key}"
    return None


def _llama_arch(view: _View) -> str | None:
    arch = view.kv.get("general.architecture")
    if arch != ARCH:
        return f"unknown model architecture: '{arch}'"
    return None


def _llama_rope_base(view: _View) -> str | None:
    if f"{ARCH}.rope.freq_base" in view.kv:
        return None
    theta = view.kv.get("dflash.rope.frequency_base")
    if isinstance(theta, numbers.Real) and _c_double(theta) == LLAMA_DEFAULT_ROPE_BASE:
        return None
    declared = f"{_c_double(theta):g} (dflash.rope.frequency_base)" if isinstance(
        theta, numbers.Real) else "unknown"
    return (f"llama.cpp reads the rope base from {ARCH}.rope.freq_base (f32); it is absent, so "
            f"llama.cpp would use its default {LLAMA_DEFAULT_ROPE_BASE:g} instead of the "
            f"drafter's {declared}")


def _llama_taps(view: _View) -> str | None:
    if LLAMA_TAP_KEY not in view.kv:
        return "DFlash model requires 'target_layers' in GGUF metadata"
    gtype, value = view.type_of(LLAMA_TAP_KEY) or "", view.kv[LLAMA_TAP_KEY]
    integers = _is_array(value) and all(
        isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in value)
    if gtype not in ("ARRAY[INT32]", "ARRAY[UINT32]") or not integers:
        return (f"array type mismatch for {LLAMA_TAP_KEY}: expected an INT32 or UINT32 array, "
                f"found {gtype or 'unknown'}")
    view.found["llama_taps"] = [int(t) for t in value]
    return None


def _llama_tap_convention(view: _View) -> str | None:
    """llama.cpp stores DeepSpec id + 1 (it taps the input of that layer, i.e. the output of
    layer id); our format, like Strata, stores the id. A file of Strata's convention (ours,
    dspark.format_version present, or Strata's own, STRATA_CONVENTION_KEYS) read by
    llama.cpp taps one layer too early."""
    if not any(key in view.kv for key in STRATA_CONVENTION_KEYS):
        return None
    taps = view.found["llama_taps"]
    wanted = [t + 1 for t in taps]
    read_as = ", ".join("embeddings" if t == 0 else f"layer {t - 1}" for t in taps)
    return (f"{LLAMA_TAP_KEY} holds DeepSpec ids {taps} (Strata's convention); llama.cpp reads "
            f"id + 1 ({wanted} for this drafter) and would feed it the outputs of "
            f"[{read_as}] instead of layers {taps}")


def _llama_tokenizer(view: _View) -> str | None:
    for key in LLAMA_TOKENIZER_KEYS:
        if key not in view.kv:
            return (f"key not found in model: {key} (llama.cpp loads the target's tokenizer "
                    "from the drafter file; its converter embeds it from --target-model-dir)")
    return None


def _llama_mask(view: _View) -> str | None:
    if LLAMA_MASK_KEY in view.kv:
        return None
    ours = view.kv.get("dflash.mask_token_id")
    where = f" (this file records dflash.mask_token_id = {ours})" if ours is not None else ""
    return (f"llama.cpp takes the DFlash mask token from {LLAMA_MASK_KEY}, which is absent"
            f"{where}: it loads the drafter with mask token -1 and aborts at its first draft "
            "(get_sub_batch: failed to add embedding)")


def _dim(view: _View, key: str) -> int | None:
    value = view.kv.get(key)
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    return None


def _llama_geometry(view: _View) -> str | None:
    """Dimensions the tensor shapes are checked against (no refusal of its own: the key
    rules above refuse missing or mistyped keys)."""
    h, nh = _dim(view, f"{ARCH}.embedding_length"), _dim(view, f"{ARCH}.attention.head_count")
    layers, ff = _dim(view, f"{ARCH}.block_count"), _dim(view, f"{ARCH}.feed_forward_length")
    if None in (h, nh, layers, ff) or nh == 0 or "llama_taps" not in view.found:
        return None
    if layers > LLAMA_MAX_LAYERS:       # refused above (max_layers); and never expanded
        return None
    nkv = _dim(view, f"{ARCH}.attention.head_count_kv") or nh
    d = _dim(view, f"{ARCH}.attention.key_length") or h // nh
    vocab = _dim(view, "dflash.vocab_size")
    if vocab is None and isinstance(view.kv.get("tokenizer.ggml.tokens"), list):
        vocab = len(view.kv["tokenizer.ggml.tokens"])
    if vocab is None:
        return None
    view.found["llama_geometry"] = {"H": h, "I": ff, "nh": nh, "nkv": nkv, "d": d, "V": vocab,
                                    "m": len(view.found["llama_taps"]), "layers": layers}
    return None


def _llama_expected(view: _View) -> dict[str, tuple[int, ...]]:
    """name -> GGUF shape of every tensor llama_model_dflash::load_arch_tensors creates for
    this file: the backbone (required), the optional embedding/head, and the DSpark head
    when markov_w1.weight is present (rank = its ne0; conf_proj optional, [H + r, 1])."""
    g = view.found["llama_geometry"]
    symbols = {**g, "r": 0, "rc": 0}
    out: dict[str, tuple[int, ...]] = {}
    for rule in TENSOR_RULES:
        if rule.when == "always" and rule.gguf is not None:
            for _src, gguf, _i in expand_rule(rule, g["layers"]):
                out[gguf] = tuple(eval_dim(e, symbols) for e in reversed(rule.shape))
    present = view.names
    optional = {"token_embd.weight": (g["H"], g["V"]), "output.weight": (g["H"], g["V"])}
    if "markov_w1.weight" in present:
        shape = present["markov_w1.weight"][1]
        r = shape[0] if shape else 0
        out["markov_w1.weight"] = (r, g["V"])
        out["markov_w2.weight"] = (r, g["V"])
        optional.update({"conf_proj.weight": (g["H"] + r, 1), "conf_proj.bias": (1,)})
    out.update({name: shape for name, shape in optional.items() if name in present})
    return out


def _llama_shapes(view: _View) -> str | None:
    present = view.names
    for name, shape in _llama_expected(view).items():
        if name not in present:
            return f"check_tensor_dims: tensor '{name}' not found"
        got = tuple(present[name][1])
        if got != shape:
            return (f"check_tensor_dims: tensor '{name}' has wrong shape; expected "
                    f"{_lshape(shape)}, got {_lshape(got)}")
    return None


def _lshape(shape: Sequence[int]) -> str:
    return ", ".join(f"{d:5d}" for d in shape)


def _llama_count(view: _View) -> str | None:
    expected = _llama_expected(view)
    extra = [name for name, _t, _s in view.tensors if name not in expected]
    if not extra:
        return None
    why = {"markov_gate": "llama.cpp implements only the vanilla Markov head",
           "markov_joint": "llama.cpp implements only the vanilla Markov head",
           "conf_proj": "llama.cpp reads conf_proj only beside a Markov head"}
    reason = next((text for part, text in why.items() if extra[0].startswith(part)),
                  "llama.cpp does not read it")
    return (f"done_getting_tensors: wrong number of tensors; expected {len(view.tensors)}, got "
            f"{len(view.tensors) - len(extra)} ('{extra[0]}' is not read: {reason})")


def _llama_embedding_as_head(view: _View) -> str | None:
    """llama_model_dflash::load_arch_tensors: with no output.weight and a token_embd.weight,
    ``output = tok_embd`` (TENSOR_DUPLICATED); only a drafter with neither takes both from
    the target (ctx_other). A DeepSpec drafter's head is the target's lm_head."""
    names = view.names
    if L.TARGET_EMBEDDING in names and L.TARGET_HEAD not in names:
        return (f"{L.TARGET_EMBEDDING} is present and {L.TARGET_HEAD} is not: llama.cpp uses "
                "the drafter's embedding as its head too (output = tok_embd), not the target's "
                "head; right only for a target that ties its embeddings (`dspark export` "
                "without --keep-embedding writes neither, and llama.cpp binds both from the target)")
    return None


# --- a Gemma4 drafter as llama.cpp 0c1e570 reads one --------------------------------------------
# Its DFlash loader has a Gemma4 DSpark path (src/models/dflash.cpp; the converter's
# Gemma4DSparkModel, conversion/gemma.py): V from k_proj when attn_v is absent, the
# post-attention / post-FFN norms and the layer scalar by our tensor names, and the rest from
# keys of its own that our file does not carry. The llama.cpp keys (src/llama-arch.cpp):
LLAMA_GEMMA4_KEYS = {"embedding_scale": f"{ARCH}.embedding_scale",
                     "attention_scale": f"{ARCH}.attention.scale",
                     "activation": f"{ARCH}.hidden_activation",
                     "rope_dims": f"{ARCH}.rope.dimension_count"}
LLAMA_ROPE_FREQS = "rope_freqs.weight"      # frequency factors: proportional RoPE
# The activations llama.cpp's DFlash loader maps to its GELU (load_arch_hparams).
LLAMA_GELU_NAMES = ("gelu", "gelu_pytorch_tanh")


def _absent_or(view: _View, key: str) -> str:
    return "absent here" if key not in view.kv else f"{view.kv[key]!r} here"


def _g4_llama_softcap(view: _View) -> str | None:
    cap = _real(view, GEMMA4_KEYS["softcap"])
    if cap is None or cap <= 0:
        return None
    rank = _real(view, "dflash.markov_rank")
    markov = ", the Markov bias added after" if rank is not None and rank > 0 else ""
    return ("llama.cpp 0c1e570 softcaps a DFlash/DSpark drafter's logits only when it has a "
            "DFlash2 selector (src/models/dflash.cpp), and its converter refuses a Gemma4 "
            "DSpark checkpoint with final_logit_softcapping ('Gemma4 DSpark logit softcapping "
            f"is not supported'); this drafter's logits are {cap:g}·tanh(z/{cap:g}){markov}")


def _g4_llama_embedding(view: _View) -> str | None:
    hidden = _dim(view, f"{ARCH}.embedding_length")
    if hidden is None or hidden <= 0:
        return None
    key, want = LLAMA_GEMMA4_KEYS["embedding_scale"], _sqrt(hidden)
    got = _real(view, key)
    if got is not None and math.isclose(got, want, rel_tol=1e-3):
        return None
    does = f"scaled by {got:g}" if got else "unscaled"       # 0: no scale (load_arch_hparams)
    return (f"llama.cpp scales the drafter's embedding rows by {key}, {_absent_or(view, key)}: "
            f"it would feed them {does} instead of by sqrt(embedding_length) = {want:g}")


def _g4_llama_attention_scale(view: _View) -> str | None:
    key = LLAMA_GEMMA4_KEYS["attention_scale"]
    got = _real(view, key)
    if got == 1.0:
        return None
    head_dim = _dim(view, f"{ARCH}.attention.key_length")
    used = f"{got:g}" if got else (f"1/sqrt({head_dim})" if head_dim else "1/sqrt(key_length)")
    return (f"llama.cpp scales attention by {key} (absent or 0: 1/sqrt(key_length)), "
            f"{_absent_or(view, key)}: it would use {used} instead of this drafter's 1.0")


def _g4_llama_activation(view: _View) -> str | None:
    activation = _text(view, GEMMA4_KEYS["activation"])
    key = LLAMA_GEMMA4_KEYS["activation"]
    if activation not in LLAMA_GELU_NAMES or view.kv.get(key) in LLAMA_GELU_NAMES:
        return None
    return (f"llama.cpp takes the MLP's activation from {key} (SiLU when absent), "
            f"{_absent_or(view, key)}: it would not run this drafter's {activation}")


def _g4_llama_rope(view: _View) -> str | None:
    head_dim = _dim(view, f"{ARCH}.attention.key_length")
    partial = _rotated_pairs(view, head_dim) if head_dim else None
    if partial is None or LLAMA_ROPE_FREQS in view.names:
        return None
    n, factor, rope_type = partial
    return (f"llama.cpp rotates the whole head (NeoX over {LLAMA_GEMMA4_KEYS['rope_dims']}, "
            f"default key_length) unless a {LLAMA_ROPE_FREQS} tensor holds frequency "
            "factors, as its converter writes for proportional RoPE; none here: it would "
            f"rotate all {head_dim // 2} pairs, where this drafter's {rope_type} RoPE (factor "
            f"{factor:g}) rotates {n}")


# --- llama.cpp and the DFlash2 / assistant kinds (facts: docs/ENGINES.md, llama.cpp 0c1e570's
# src/models/dflash.cpp, src/models/gemma4-assistant.cpp, common/speculative.cpp) ------------

LLAMA_DFLASH2_DEFAULT_N_MAX = 3      # --spec-draft-n-max's default (common/common.h:328)


def _d2_int(view: _View, key: str) -> int | None:
    value = view.kv.get(key)
    return int(value) if isinstance(value, numbers.Integral) and not isinstance(value, bool) \
        else None


def _llama_dflash2_selector(view: _View) -> str | None:
    """src/models/dflash.cpp:142-151: every DFlash2 key > 0, H % g == 0, H >= K (K + 1)."""
    h, g = _d2_int(view, "dflash.embedding_length"), _d2_int(view, "dflash.conv_group_size")
    k = _d2_int(view, "dflash.selector_top_k")
    if None in (h, g, k):
        return None
    if g <= 0 or h % g:
        return f"DFlash2: embedding_length {h} is not a multiple of conv_group_size {g}"
    if h < k * (k + 1):
        return (f"DFlash2: embedding_length {h} < selector_top_k x (selector_top_k + 1) = "
                f"{k * (k + 1)} (its selector packs a K x K score table into the hidden row)")
    return None


def _llama_dflash2_block(view: _View) -> str | None:
    b = _d2_int(view, "dflash.block_size")
    if b is None or b - 1 == LLAMA_DFLASH2_DEFAULT_N_MAX:
        return None
    return (f"llama.cpp drafts --spec-draft-n-max tokens (default {LLAMA_DFLASH2_DEFAULT_N_MAX}) "
            f"in a block of n_max + 1; block attention being bidirectional, a shorter block "
            f"changes every draft: run it with --spec-draft-n-max {b - 1} to compute this "
            f"drafter's block of {b}")


def _llama_dflash2_causal(view: _View) -> str | None:
    if view.kv.get("dspark.dflash2.sliding_window_non_causal") != "false":
        return None
    return ("the block is causal on this drafter's sliding layers "
            "(sliding_window_non_causal false); llama.cpp's DFlash graph has one block mask "
            "for every layer")


def _llama_sliding_window(key: str, what: str) -> Callable[[_View], str | None]:
    def check(view: _View) -> str | None:
        if key not in view.kv:
            return None
        return (f"llama.cpp's sliding layers use its standard per-query window ({key} = "
                f"{view.kv[key]}); {what}: the two agree only while the context fits the "
                "window")
    return check


def _llama_assistant_keys(view: _View) -> str | None:
    key = f"{gemma4_assistant.FAMILY}.context_length"
    if key in view.kv:
        return None
    ours = ("" if "dspark.format_version" not in view.kv else
            " (this is our assistant artifact: llama.cpp's gemma4-assistant keys and tensor "
            "names, but none of what its converter, conversion/gemma.py:933, adds from the "
            "checkpoint's tokenizer and config)")
    return f"key not found in model: {key}{ours}"


def _llama_assistant_hidden(view: _View) -> str | None:
    a = gemma4_assistant.FAMILY
    h, hb = _d2_int(view, f"{a}.embedding_length"), _d2_int(view, f"{a}.embedding_length_out")
    if h is not None and h == hb:
        return (f"gemma4-assistant: embedding_length {h} equals embedding_length_out "
                "(src/models/gemma4-assistant.cpp:30 requires the assistant's hidden size to "
                "differ from the target's)")
    return None


LLAMA_RULES: tuple[Rule, ...] = (
    Rule("gguf.alignment_type", "load_error", _llama_alignment_type, final=True),
    FAMILY_RULE,
    # The assistant: llama.cpp's gemma4-assistant architecture (conversion/gemma.py:933).
    Rule("assistant.context_length", "load_error", _llama_assistant_keys,
         families=ONLY_ASSISTANT),
    Rule("assistant.tokenizer", "load_error", _llama_tokenizer, families=ONLY_ASSISTANT),
    Rule("assistant.hidden_size", "load_error", _llama_assistant_hidden,
         families=ONLY_ASSISTANT),
    Rule("assistant.sliding_window", "misread", _llama_sliding_window(
        f"{gemma4_assistant.FAMILY}.attention.sliding_window",
        "transformers' assistant sees the last W + 1 shared entries, llama.cpp W - 1 before "
        "the anchor"), families=ONLY_ASSISTANT),
    # The `dflash` architecture's loader (DSpark families, DFlash2).
    Rule("architecture", "load_error", _llama_arch, families=DFLASH_ARCH_FAMILIES),
    *(_key_rule(k, t, req) for k, t, req in LLAMA_KEYS[:3]),
    Rule("max_layers", "load_error", _llama_max_layers, families=DFLASH_ARCH_FAMILIES),
    *(_key_rule(k, t, req) for k, t, req in LLAMA_KEYS[3:6]),
    Rule("rope_base", "misread", _llama_rope_base, families=DFLASH_ARCH_FAMILIES),
    *(_key_rule(k, t, req) for k, t, req in LLAMA_KEYS[6:]),
    Rule("target_layers", "load_error", _llama_taps, families=DFLASH_ARCH_FAMILIES),
    # A DFlash2 artifact holds llama.cpp's own convention (HF hidden_states indices).
    Rule("target_layers_convention", "misread", _llama_tap_convention, ("llama_taps",),
         families=DSPARK_FAMILIES),
    Rule("tokenizer", "load_error", _llama_tokenizer, families=DFLASH_ARCH_FAMILIES),
    Rule("mask_token", "load_error", _llama_mask, families=DFLASH_ARCH_FAMILIES),
    Rule("dflash2.selector", "load_error", _llama_dflash2_selector, families=ONLY_DFLASH2),
    Rule("dflash2.block_causal", "unsupported", _llama_dflash2_causal, families=ONLY_DFLASH2),
    Rule("dflash2.sliding_window", "misread", _llama_sliding_window(
        "dflash.attention.sliding_window",
        "speculators' window is anchored at the anchor (context >= anchor - W)"),
        families=ONLY_DFLASH2),
    Rule("dflash2.draft_length", "misread", _llama_dflash2_block, families=ONLY_DFLASH2),
    # The tensors by Qwen3's table (a Gemma4 file's names are llama.cpp's own: ENGINES.md).
    Rule("geometry", "load_error", _llama_geometry,                  # a parse step: never refuses
         families=ONLY_QWEN3),
    Rule("tensor_shapes", "load_error", _llama_shapes, ("llama_geometry",), families=ONLY_QWEN3),
    Rule("tensor_count", "unsupported", _llama_count, ("llama_geometry",), families=ONLY_QWEN3),
    Rule("embedding_as_head", "misread", _llama_embedding_as_head, ("llama_geometry",),
         families=ONLY_QWEN3),
    Rule("gemma4.softcap", "unsupported", _g4_llama_softcap, families=ONLY_GEMMA4),
    Rule("gemma4.embedding_scale", "misread", _g4_llama_embedding, families=ONLY_GEMMA4),
    Rule("gemma4.attention_scale", "misread", _g4_llama_attention_scale, families=ONLY_GEMMA4),
    Rule("gemma4.activation", "misread", _g4_llama_activation, families=ONLY_GEMMA4),
    Rule("gemma4.rope", "misread", _g4_llama_rope, families=ONLY_GEMMA4),
)


# --- the reports -------------------------------------------------------------------------------

def strata_open(kv: Mapping[str, object], types: Mapping[str, str], tensors: Iterable[TensorRow],
                *, path: str = "drafter.gguf") -> EngineReport:
    view = _view(kv, types, tensors, path)
    return EngineReport("strata.open", _run("strata.open", STRATA_OPEN_RULES, view), view.family)


def strata_run(kv: Mapping[str, object], types: Mapping[str, str], tensors: Iterable[TensorRow],
               *, path: str = "drafter.gguf") -> EngineReport:
    """Open's refusals first (the runtime never sees a file the loader refused), then the
    geometry gate and the fixed eps, evaluated on what open could parse."""
    view = _view(kv, types, tensors, path)
    opened = _run("strata.open", STRATA_OPEN_RULES, view)
    if opened and opened[0].rule == "strata.open/family":
        return EngineReport("strata.run", opened, view.family)
    return EngineReport("strata.run", opened + _run("strata.run", STRATA_RUN_RULES, view),
                        view.family)


def llama_cpp(kv: Mapping[str, object], types: Mapping[str, str], tensors: Iterable[TensorRow],
              *, path: str = "drafter.gguf") -> EngineReport:
    """llama.cpp's refusals; on one of our own artifacts (dspark.format_version present) of
    a family `dspark export` writes a file for, the first one also names that file, the one
    llama.cpp does load."""
    view = _view(kv, types, tensors, path)
    refusals = _run("llama.cpp", LLAMA_RULES, view)
    hint = LLAMA_EXPORT_HINTS.get(view.family)
    if refusals and "dspark.format_version" in kv and hint:
        first = refusals[0]
        refusals = (Refusal(first.rule, first.kind, first.message + hint), *refusals[1:])
    return EngineReport("llama.cpp", refusals, view.family)


def engine_reports(kv: Mapping[str, object], types: Mapping[str, str],
                   tensors: Iterable[TensorRow], *, path: str = "drafter.gguf"
                   ) -> dict[str, EngineReport]:
    """engine name -> its report, in ENGINES order."""
    tensors = list(tensors)
    return {"strata.open": strata_open(kv, types, tensors, path=path),
            "strata.run": strata_run(kv, types, tensors, path=path),
            "llama.cpp": llama_cpp(kv, types, tensors, path=path)}


def gguf_type_name(value_type, sub_type=None) -> str:
    """"UINT32", "STRING", "ARRAY[UINT32]" from gguf-py's GGUFValueType members."""
    name = value_type.name
    return f"{name}[{sub_type.name}]" if sub_type is not None else name


def gguf_inputs(gguf) -> tuple[dict[str, object], dict[str, str], list[TensorRow]]:
    """(values, types, tensors) of a parsed ``gguf_reader.GGUFFile``."""
    values = {k: v.value for k, v in gguf.kv.items()}
    types = {k: gguf_type_name(v.type, v.sub_type) for k, v in gguf.kv.items()}
    tensors = [(t.name, t.ggml_type.name, list(t.shape)) for t in gguf.tensors]
    return values, types, tensors


def format_types(kv: Mapping[str, object]) -> dict[str, str]:
    """The GGUF type of every key of our format, as the writer emits it (for a report made
    before the file exists, e.g. convert's summary from ``expected_metadata``)."""
    from dspark_convert.artifact.format import KEYS_BY_NAME

    return {k: gguf_type_name(KEYS_BY_NAME[k].type, KEYS_BY_NAME[k].sub_type)
            for k in kv if k in KEYS_BY_NAME}


def as_written(kv: Mapping[str, object]) -> tuple[dict[str, object], dict[str, str]]:
    """(values, types) of metadata our writer is about to emit, each value as the file will
    hold it (a FLOAT32 key rounded to float32): the reports convert and quantize record
    are then the ones validate derives from the file."""
    from dspark_convert.artifact.format import as_float32

    types = format_types(kv)
    values = {k: as_float32(v) if types.get(k) == "FLOAT32" and isinstance(v, float) else v
              for k, v in kv.items()}
    return values, types


def written_reports(kv: Mapping[str, object], records: Iterable) -> dict[str, EngineReport]:
    """The reports of a file about to be written: its metadata ``kv`` as the writer emits
    it and its tensor records (objects with ``name``, ``type``, GGUF ``shape``: manifest
    TensorRecords). convert and quantize record these; validate re-derives them from the
    file it reads (``gguf_inputs``)."""
    values, types = as_written(kv)
    return engine_reports(values, types, [(t.name, t.type, t.shape) for t in records])


def reports_for_gguf(gguf, *, path: str | None = None) -> dict[str, EngineReport]:
    values, types, tensors = gguf_inputs(gguf)
    return engine_reports(values, types, tensors, path=path or str(gguf.path))


# --- the reports as checks (convert, quantize and validate record them by this one rule) -------

#: What each engine name stands for, in a check's detail.
ENGINE_TITLES = {
    "strata.open": "Strata's DFlash loader (DFlashArtifact::open)",
    "strata.run": "Strata's runtime (DFlashArtifact::validate_supported, fixed rms eps)",
    "llama.cpp": "llama.cpp's DFlash/DSpark loader (0c1e570)",
}
# The refusals that stay a risk whatever the engine's support: Strata's runtime would run
# the drafter with its fixed eps, not the one it was trained with.
WARNING_RULES = ("strata.run/rms_eps",)
# The engine each family's artifacts are made for: a load_error there is a broken artifact.
# A family no engine implements yet (Gemma4) has none: every refusal is worth knowing.
MADE_FOR = {QWEN3: "strata.open"}


def check_name(engine: str) -> str:
    return f"engine.{engine}"


def _decisive(report: EngineReport, made_for: Mapping[str, str] = MADE_FOR
              ) -> tuple[str, Refusal | None]:
    """The check status of a report, and the refusal that decides it:

    - ``failed``: the engine the artifact's family is made for (MADE_FOR: Strata's loader
      for Qwen3's) stops on it (a ``load_error`` at ``strata.open``): the artifact is broken
      for the engine it is made for, as the old loader-rule check said;
    - ``warning``: a real risk (a rule of WARNING_RULES);
    - ``info``: any other refusal: a drafter the engine does not implement (DSpark heads,
      a geometry other than Flash-Next, llama.cpp's own format): worth knowing, not a
      risk, so ``validate --strict`` passes it;
    - ``passed``: the engine accepts it."""
    if report.accepts:
        return "passed", None
    if report.engine == made_for.get(report.family):
        broken = next((r for r in report.refusals if r.kind == "load_error"), None)
        if broken is not None:
            return "failed", broken
    risk = next((r for r in report.refusals if r.rule in WARNING_RULES), None)
    if risk is not None:
        return "warning", risk
    return "info", report.refusals[0]


def _detail(report: EngineReport, decisive: Refusal | None, name_rule: bool = False) -> str:
    title = ENGINE_TITLES[report.engine]
    if decisive is None:
        return f"{title} accepts it"
    others = [r.rule for r in report.refusals if r is not decisive]
    more = f" ({len(others)} more: {', '.join(others)})" if others else ""
    rule = f", {decisive.rule}" if name_rule else ""
    return f"{title} refuses it ({decisive.kind}{rule}): {decisive.message}{more}"


def engine_verdicts(reports: Mapping[str, EngineReport], *, require: Sequence[str] = (),
                    label: str = "drafter.gguf", made_for: Mapping[str, str] = MADE_FOR,
                    name_rules: bool = False) -> list[tuple[Check, DSparkError | None]]:
    """One check per engine, ``engine.<name>``, in ENGINES order, each with the refusal of a
    failed one. ``require`` names engines whose refusal fails the check with
    EngineRequirementError (``validate --require``); a check already failed keeps its own
    error. ``made_for``: family -> the engine whose load_error fails the check (MADE_FOR;
    none for a bare file that is not of our format: it is said what each engine makes of
    it, not judged broken). ``name_rules``: the detail names the deciding rule's id (the
    bare file's checks; an artifact's keep the form manifest.json records)."""
    out: list[tuple[Check, DSparkError | None]] = []
    for engine in ENGINES:
        report = reports[engine]
        status, decisive = _decisive(report, made_for)
        name, detail = check_name(engine), _detail(report, decisive, name_rules)
        error: DSparkError | None = None
        if status == "failed":
            error = StrataRuleError(f"{label}: {detail}", path=label, field=engine)
        elif engine in require and not report.accepts:
            error = EngineRequirementError(f"{label}: --require {engine}: {detail}", path=label,
                                           field=engine, expected="accepts", found=report.reason)
        if error is not None:
            out.append((Check.failed(name, error), error))
        else:
            out.append((Check(name=name, status=status,
                              detail=detail + (" (required)" if engine in require else "")),
                        None))
    return out


def engine_checks(reports: Mapping[str, EngineReport], *, require: Sequence[str] = (),
                  label: str = "drafter.gguf") -> list[Check]:
    """The checks of ``engine_verdicts``: what convert and quantize record in manifest.json
    (no ``require``) and validate confirms."""
    return [check for check, _error in engine_verdicts(reports, require=require, label=label)]


def engine_records(reports: Mapping[str, EngineReport]) -> dict[str, dict]:
    """{engine: {"accepts", "reason"}}: what the manifest records and validate --json
    reports."""
    return {engine: reports[engine].to_dict() for engine in ENGINES}
