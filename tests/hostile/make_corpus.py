"""Build the hostile-input corpus: every named case, deterministically, into a directory.

    python tests/hostile/make_corpus.py --out DIR      # build every case under DIR
    python tests/hostile/make_corpus.py --readme       # rewrite tests/hostile/README.md

Each case starts from a golden fixture (``golden/``) and breaks one thing, with the real
writers (safetensors, torch, gguf-py through ``dspark convert``) where the point is a
well-formed file holding bad content, and with byte edits where the point is a malformed
file. A case is a directory ``DIR/<name>/`` holding ``input/`` (a checkpoint directory for
``convert`` cases, an artifact directory for ``validate`` cases; for directory cases
``input`` may itself be the broken thing) and ``case.json``: the command to run and the
error class (and so the exit code) it must be refused with. ``tests/test_hostile_corpus.py``
builds the corpus into a temporary directory and runs every case through the real CLI.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

from dspark_convert import errors

GOLDEN = ROOT / "golden"
PLAIN = GOLDEN / "synthetic" / "dflash_plain"           # markov_rank 0, no confidence head
DSPARK = GOLDEN / "reference" / "vanilla_conf_markov" / "draft"   # DeepSpec-made DSpark drafter
WEIGHTS = "model.safetensors"
GGUF = "drafter.gguf"
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Case:
    name: str
    group: str              # safetensors | config | directory | artifact
    command: str            # convert | validate
    error: type[errors.DSparkError]
    about: str
    build: Callable[[Path, Corpus], None]    # writes the case's input/ directory
    # The target the command is run against (--target), relative to the repository; the
    # DFlash2 and Gemma 4 assistant kinds are converted against one.
    target: str | None = None


class Corpus:
    """Shared good inputs (each golden checkpoint converted once) for the builders."""

    def __init__(self, scratch: Path):
        self.scratch = scratch
        self._artifacts: dict[str, Path] = {}

    def artifact(self, base: Path, target: str | None = None) -> Path:
        """``base`` converted once (against ``target``, relative to the repository, for the
        kinds that need one)."""
        if base not in self._artifacts:
            from dspark_convert.commands.convert import convert

            out = self.scratch / f"good-{base.parent.name}-{base.name}"
            convert(base, out, target=None if target is None else ROOT / target)
            self._artifacts[base] = out
        return self._artifacts[base]


# --- small tools ----------------------------------------------------------------------------

def copy_source(dst: Path, base: Path = PLAIN) -> Path:
    shutil.copytree(base, dst)
    for path in dst.iterdir():
        path.chmod(0o644)
    return dst


def split_safetensors(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + length]), raw[8 + length:]


def write_safetensors(path: Path, header: dict | bytes, data: bytes, length: int | None = None) -> None:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text) if length is None else length) + text + data)


def edit_header(edit: Callable[[dict], dict | bytes | None]) -> Callable[[Path, Corpus], None]:
    """A source whose safetensors header is changed by ``edit`` (in place, or returned)."""
    def build(inp: Path, _c: Corpus) -> None:
        copy_source(inp)
        header, data = split_safetensors(inp / WEIGHTS)
        result = edit(header)
        write_safetensors(inp / WEIGHTS, header if result is None else result, data)
    return build


def edit_weights_bytes(edit: Callable[[bytes], bytes]) -> Callable[[Path, Corpus], None]:
    def build(inp: Path, _c: Corpus) -> None:
        copy_source(inp)
        path = inp / WEIGHTS
        path.write_bytes(edit(path.read_bytes()))
    return build


def tensor_order(header: dict) -> list[str]:
    return sorted((n for n in header if n != "__metadata__"), key=lambda n: header[n]["data_offsets"][0])


def edit_tensors(edit: Callable[[dict], None], base: Path = PLAIN) -> Callable[[Path, Corpus], None]:
    """A source re-saved by the safetensors library after ``edit`` changed its torch tensors."""
    def build(inp: Path, _c: Corpus) -> None:
        from safetensors.torch import load_file, save_file

        copy_source(inp, base)
        tensors = load_file(str(inp / WEIGHTS))
        edit(tensors)
        save_file(tensors, str(inp / WEIGHTS), metadata={"format": "pt"})
    return build


def poke(name: str, index: int, value: float) -> Callable[[dict], None]:
    def edit(tensors: dict) -> None:
        tensors[name].view(-1)[index] = value
    return edit


def edit_config(edit: Callable[[dict], None], base: Path = PLAIN) -> Callable[[Path, Corpus], None]:
    def build(inp: Path, _c: Corpus) -> None:
        copy_source(inp, base)
        config = json.loads((inp / "config.json").read_text())
        edit(config)
        (inp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return build


def set_field(key: str, value: object, base: Path = PLAIN) -> Callable[[Path, Corpus], None]:
    return edit_config(lambda c: c.__setitem__(key, value), base)


def config_text(edit: Callable[[str], str]) -> Callable[[Path, Corpus], None]:
    def build(inp: Path, _c: Corpus) -> None:
        copy_source(inp)
        (inp / "config.json").write_text(edit((inp / "config.json").read_text()))
    return build


class _Unpickled:
    """Unpickling this creates ``path``: the corpus test checks it never appears."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


# --- artifact edits -------------------------------------------------------------------------

def edit_artifact(edit: Callable[[Path], None], base: Path = DSPARK,
                  target: str | None = None) -> Callable[[Path, Corpus], None]:
    def build(inp: Path, corpus: Corpus) -> None:
        shutil.copytree(corpus.artifact(base, target), inp)
        edit(inp)
    return build


def patch(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(data)


def kv_type_offset(art: Path, key: str) -> int:
    """Offset of the value-type word of metadata ``key`` (found by gguf-py's reader)."""
    from gguf import GGUFReader

    field = GGUFReader(art / GGUF).fields[key]
    return field.offset + sum(p.nbytes for p in field.parts[:2])


def tensor_info(art: Path, name: str):
    from gguf import GGUFReader

    return next(t for t in GGUFReader(art / GGUF).tensors if t.name == name)


def tensor_info_part_offset(art: Path, name: str, part: int) -> int:
    """Offset of part ``part`` of a tensor-info record: 2 n_dims, 3 dims, 4 type, 5 offset."""
    field = tensor_info(art, name).field
    return field.offset + sum(p.nbytes for p in field.parts[:part])


def set_tensor_offset(name: str, value: Callable[[Path], int]) -> Callable[[Path], None]:
    def edit(art: Path) -> None:
        patch(art / GGUF, tensor_info_part_offset(art, name, 5), struct.pack("<Q", value(art)))
    return edit


def first_tensor_offset(art: Path) -> int:
    return int(tensor_info(art, "fc.weight").field.parts[5][0])


def element(art: Path, name: str, index: int) -> int:
    return int(tensor_info(art, name).data_offset) + 2 * index


def flip_low_bit(name: str, index: int) -> Callable[[Path], None]:
    """Flip the lowest mantissa bit of one BF16 value: still finite, bytes differ."""
    def edit(art: Path) -> None:
        at = element(art, name, index)
        with open(art / GGUF, "r+b") as fh:
            fh.seek(at)
            lo = fh.read(1)[0]
            fh.seek(at)
            fh.write(bytes([lo ^ 1]))
    return edit


def edit_manifest(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(art: Path) -> None:
        data = json.loads((art / MANIFEST).read_text())
        edit(data)
        (art / MANIFEST).write_text(json.dumps(data, indent=2) + "\n")
    return apply


def other_hex(value: str) -> str:
    return ("0" if value[0] != "0" else "1") + value[1:]


def truncate_to(size: Callable[[Path], int]) -> Callable[[Path], None]:
    def edit(art: Path) -> None:
        os.truncate(art / GGUF, size(art))
    return edit


# --- directory builders ---------------------------------------------------------------------

def build_empty_dir(inp: Path, _c: Corpus) -> None:
    inp.mkdir()


def build_pickle_only(inp: Path, _c: Corpus) -> None:
    inp.mkdir()
    shutil.copy(PLAIN / "config.json", inp / "config.json")
    sentinel = inp.parent / "UNPICKLED"
    (inp / "pytorch_model.bin").write_bytes(pickle.dumps(_Unpickled(str(sentinel))))


def build_link_out(link: str) -> Callable[[Path, Corpus], None]:
    """``link`` (config.json or the weights) is a symlink to a copy outside the directory."""
    def build(inp: Path, _c: Corpus) -> None:
        outside = inp.parent / "outside"
        copy_source(outside)
        copy_source(inp)
        (inp / link).unlink()
        (inp / link).symlink_to(Path("..") / "outside" / link)   # relative: reproducible
    return build


def build_sharded(inp: Path) -> dict:
    """The plain fixture split into two shards by the safetensors library, with an index."""
    from safetensors.torch import load_file, save_file

    copy_source(inp)
    tensors = load_file(str(inp / WEIGHTS))
    (inp / WEIGHTS).unlink()
    names = sorted(tensors)
    weight_map = {}
    for i, group in enumerate((names[0::2], names[1::2]), start=1):
        shard = f"model-{i:05d}-of-00002.safetensors"
        save_file({n: tensors[n] for n in group}, str(inp / shard), metadata={"format": "pt"})
        weight_map.update({n: shard for n in group})
    index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
    (inp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return index


def build_single_and_sharded(inp: Path, _c: Corpus) -> None:
    build_sharded(inp)
    shutil.copy(PLAIN / WEIGHTS, inp / WEIGHTS)


def build_missing_shard(inp: Path, _c: Corpus) -> None:
    build_sharded(inp)
    (inp / "model-00002-of-00002.safetensors").unlink()


def build_stray_shard(inp: Path, _c: Corpus) -> None:
    build_sharded(inp)
    shutil.copy(inp / "model-00001-of-00002.safetensors", inp / "model-00001-of-00003.safetensors")


def build_tensor_in_two_shards(inp: Path, _c: Corpus) -> None:
    """Both shards hold fc.weight; the index names only one of them."""
    from safetensors.torch import load_file, save_file

    index = build_sharded(inp)
    first = index["weight_map"]["fc.weight"]
    second = next(s for s in set(index["weight_map"].values()) if s != first)
    tensors = load_file(str(inp / second))
    tensors["fc.weight"] = load_file(str(inp / first))["fc.weight"]
    save_file(tensors, str(inp / second), metadata={"format": "pt"})


def build_fifo(name: str, base: Path = PLAIN) -> Callable[[Path, Corpus], None]:
    """The checkpoint with ``name`` replaced by a FIFO (named pipe): reading it would wait
    for a writer forever, so it must be refused unread."""
    def build(inp: Path, _c: Corpus) -> None:
        copy_source(inp, base)
        (inp / name).unlink()
        os.mkfifo(inp / name)
    return build


def _fifo_in_artifact(name: str) -> Callable[[Path], None]:
    def edit(art: Path) -> None:
        (art / name).unlink()
        os.mkfifo(art / name)
    return edit


def build_source_is_file(inp: Path, _c: Corpus) -> None:
    shutil.copy(PLAIN / WEIGHTS, inp)


def build_index_escapes(inp: Path, _c: Corpus) -> None:
    index = build_sharded(inp)
    index["weight_map"]["fc.weight"] = "../outside.safetensors"
    (inp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


# --- the cases ------------------------------------------------------------------------------

E = errors
H = 2**63


def _dup_tensor_json(header: dict) -> bytes:
    # json.dumps cannot write a duplicate key: splice the first tensor in a second time.
    name = tensor_order(header)[0]
    text = json.dumps(header)
    return (text[:-1] + ", " + json.dumps(name) + ": " + json.dumps(header[name]) + "}").encode()


def _overlap(header: dict) -> None:
    a, b = tensor_order(header)[:2]
    size = header[b]["data_offsets"][1] - header[b]["data_offsets"][0]
    start = header[a]["data_offsets"][0]
    header[b]["data_offsets"] = [start, start + size]


def _gap(header: dict) -> None:
    # Every tensor after the first moves 2 bytes up: a gap, and the data runs past the end.
    for name in tensor_order(header)[1:]:
        header[name]["data_offsets"] = [x + 2 for x in header[name]["data_offsets"]]


def _set_entry(field: str, value: object) -> Callable[[dict], None]:
    def edit(header: dict) -> None:
        header["fc.weight"][field] = value
    return edit


def _drop(name: str) -> Callable[[dict], None]:
    return lambda tensors: tensors.pop(name)


def _transpose(name: str) -> Callable[[dict], None]:
    def edit(tensors: dict) -> None:
        tensors[name] = tensors[name].t().contiguous()
    return edit


def _to_f16(name: str) -> Callable[[dict], None]:
    def edit(tensors: dict) -> None:
        import torch

        tensors[name] = tensors[name].to(torch.float16)
    return edit


def _add_bias(tensors: dict) -> None:
    import torch

    tensors["layers.0.self_attn.q_proj.bias"] = torch.zeros(32, dtype=torch.bfloat16)


def _pop_field(key: str) -> Callable[[dict], None]:
    return lambda config: config.pop(key)


def _rank_zero_with_conf_markov(config: dict) -> None:
    config.update(markov_rank=0)
    config.pop("markov_head_type")


def _contract_block_size(data: dict) -> None:
    data["contract"]["block"]["block_size"] += 1


CASES: list[Case] = [
    # --- safetensors headers and data (convert) -----------------------------------------
    Case("st-empty-file", "safetensors", "convert", E.SafetensorsFormatError,
         "model.safetensors is 0 bytes", edit_weights_bytes(lambda b: b"")),
    Case("st-short-length-prefix", "safetensors", "convert", E.SafetensorsFormatError,
         "the file ends inside the 8-byte header length", edit_weights_bytes(lambda b: b[:5])),
    Case("st-header-length-huge", "safetensors", "convert", E.SafetensorsFormatError,
         "header length 2^63 - 1", edit_weights_bytes(lambda b: struct.pack("<Q", H - 1) + b[8:])),
    Case("st-header-length-negative", "safetensors", "convert", E.SafetensorsFormatError,
         "header length -1 as a signed 64-bit integer",
         edit_weights_bytes(lambda b: struct.pack("<q", -1) + b[8:])),
    Case("st-header-length-past-end", "safetensors", "convert", E.SafetensorsFormatError,
         "header length one byte more than the file holds",
         edit_weights_bytes(lambda b: struct.pack("<Q", len(b) - 7) + b[8:])),
    Case("st-header-length-zero", "safetensors", "convert", E.SafetensorsFormatError,
         "header length 0", edit_weights_bytes(lambda b: struct.pack("<Q", 0) + b[8:])),
    Case("st-header-bad-json", "safetensors", "convert", E.SafetensorsFormatError,
         "the header's closing brace removed",
         edit_header(lambda h: json.dumps(h).encode()[:-1] + b" ")),
    Case("st-header-not-utf8", "safetensors", "convert", E.SafetensorsFormatError,
         "a 0xff byte inside a tensor name",
         edit_header(lambda h: json.dumps(h).encode().replace(b"fc.weight", b"fc.w\xffight", 1))),
    Case("st-header-duplicate-key", "safetensors", "convert", E.SafetensorsFormatError,
         "the first tensor's entry appears twice", edit_header(_dup_tensor_json)),
    Case("st-header-not-object", "safetensors", "convert", E.SafetensorsFormatError,
         "the header is a JSON array", edit_header(lambda h: b"[]")),
    Case("st-offsets-overlapping", "safetensors", "convert", E.SafetensorsFormatError,
         "the second tensor starts where the first does", edit_header(_overlap)),
    Case("st-offsets-gapped", "safetensors", "convert", E.SafetensorsFormatError,
         "two unused bytes between the first and second tensor", edit_header(_gap)),
    Case("st-offsets-reversed", "safetensors", "convert", E.SafetensorsFormatError,
         "fc.weight's data_offsets end before they begin",
         edit_header(lambda h: h["fc.weight"].__setitem__("data_offsets", h["fc.weight"]["data_offsets"][::-1]))),
    Case("st-offsets-huge", "safetensors", "convert", E.SafetensorsFormatError,
         "fc.weight's end offset is 2^64 - 1", edit_header(lambda h: h["fc.weight"].__setitem__(
             "data_offsets", [h["fc.weight"]["data_offsets"][0], 2**64 - 1]))),
    Case("st-data-truncated", "safetensors", "convert", E.SafetensorsFormatError,
         "the last 10 bytes of tensor data cut off", edit_weights_bytes(lambda b: b[:-10])),
    Case("st-trailing-bytes", "safetensors", "convert", E.SafetensorsFormatError,
         "16 bytes after the last tensor", edit_weights_bytes(lambda b: b + bytes(16))),
    Case("st-unknown-dtype", "safetensors", "convert", E.SafetensorsFormatError,
         "fc.weight has dtype BF17", edit_header(_set_entry("dtype", "BF17"))),
    Case("st-negative-shape", "safetensors", "convert", E.SafetensorsFormatError,
         "fc.weight has shape [-32, -96]", edit_header(_set_entry("shape", [-32, -96]))),
    Case("st-shape-span-mismatch", "safetensors", "convert", E.SafetensorsFormatError,
         "fc.weight's shape needs twice the bytes its offsets give",
         edit_header(_set_entry("shape", [64, 96]))),
    Case("st-bool-in-shape", "safetensors", "convert", E.SafetensorsFormatError,
         "fc.weight's shape holds true", edit_header(_set_entry("shape", [True, 3072]))),
    Case("st-metadata-not-strings", "safetensors", "convert", E.SafetensorsFormatError,
         "__metadata__ maps format to a number",
         edit_header(lambda h: h.__setitem__("__metadata__", {"format": 1}))),
    Case("st-wrong-dtype", "safetensors", "convert", E.TensorDtypeError,
         "one F16 tensor among BF16 (saved by the safetensors library)",
         edit_tensors(_to_f16("layers.1.self_attn.k_norm.weight"))),
    Case("st-wrong-shape", "safetensors", "convert", E.TensorShapeError,
         "fc.weight saved transposed", edit_tensors(_transpose("fc.weight"))),
    Case("st-missing-tensor", "safetensors", "convert", E.MissingTensorError,
         "layers.1.mlp.down_proj.weight left out", edit_tensors(_drop("layers.1.mlp.down_proj.weight"))),
    Case("st-unexpected-tensor", "safetensors", "convert", E.UnexpectedTensorError,
         "a q_proj bias the config does not declare", edit_tensors(_add_bias)),
    Case("st-nan", "safetensors", "convert", E.NonFiniteTensorError,
         "a NaN in layers.0.mlp.up_proj.weight",
         edit_tensors(poke("layers.0.mlp.up_proj.weight", 17, float("nan")))),
    Case("st-inf", "safetensors", "convert", E.NonFiniteTensorError,
         "-inf in the DSpark drafter's markov_w2",
         edit_tensors(poke("markov_head.markov_w2.weight", 5, float("-inf")), base=DSPARK)),
    # --- configs (convert) ----------------------------------------------------------------
    Case("cfg-string-for-int", "config", "convert", E.ConfigError,
         'hidden_size is "32"', set_field("hidden_size", "32")),
    Case("cfg-bool-for-int", "config", "convert", E.ConfigError,
         "num_hidden_layers is true", set_field("num_hidden_layers", True)),
    Case("cfg-float-for-int", "config", "convert", E.ConfigError,
         "block_size is 7.0", set_field("block_size", 7.0)),
    Case("cfg-list-for-int", "config", "convert", E.ConfigError,
         "vocab_size is [256]", set_field("vocab_size", [256])),
    Case("cfg-missing-field", "config", "convert", E.ConfigError,
         "vocab_size removed", edit_config(_pop_field("vocab_size"))),
    Case("cfg-missing-taps", "config", "convert", E.ConfigError,
         "target_layer_ids removed", edit_config(_pop_field("target_layer_ids"))),
    Case("cfg-not-json", "config", "convert", E.ConfigError,
         "config.json cut in the middle", config_text(lambda t: t[:len(t) // 2])),
    Case("cfg-duplicate-key", "config", "convert", E.ConfigError,
         "a second vocab_size key", config_text(lambda t: t.replace("{", '{\n  "vocab_size": 512,', 1))),
    Case("cfg-nan-literal", "config", "convert", E.ConfigError,
         "rms_norm_eps is the non-standard literal NaN",
         config_text(lambda t: t.replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": NaN'))),
    Case("cfg-not-object", "config", "convert", E.ConfigError,
         "config.json is a JSON string", config_text(lambda t: '"Qwen3DSparkModel"\n')),
    Case("cfg-heads-do-not-divide", "config", "convert", E.GeometryLimitError,
         "4 attention heads over 3 KV heads", set_field("num_key_value_heads", 3)),
    Case("cfg-zero-hidden-size", "config", "convert", E.GeometryLimitError,
         "hidden_size 0", set_field("hidden_size", 0)),
    Case("cfg-block-size-too-big", "config", "convert", E.GeometryLimitError,
         "block_size 129 (Strata's limit is 128)", set_field("block_size", 129)),
    Case("cfg-too-many-layers", "config", "convert", E.GeometryLimitError,
         "65 draft layers (Strata's limit is 64)", set_field("num_hidden_layers", 65)),
    Case("cfg-taps-out-of-range", "config", "convert", E.TargetLayerError,
         "target layer 6 of a 6-layer target", set_field("target_layer_ids", [0, 2, 6])),
    Case("cfg-taps-unordered", "config", "convert", E.TargetLayerError,
         "target_layer_ids [0, 4, 2]", set_field("target_layer_ids", [0, 4, 2])),
    Case("cfg-taps-minus-one", "config", "convert", E.TargetLayerError,
         "target layer -1 (the embedding output)", set_field("target_layer_ids", [-1, 2, 4])),
    Case("cfg-unknown-head-type", "config", "convert", E.ConfigError,
         "markov_head_type lstm", set_field("markov_head_type", "lstm", base=DSPARK)),
    Case("cfg-head-fields-disagree", "config", "convert", E.HeadConfigMismatchError,
         "confidence head with Markov features but markov_rank 0",
         edit_config(_rank_zero_with_conf_markov, base=DSPARK)),
    Case("cfg-architecture-gemma4", "config", "convert", E.ConfigError,
         "a Qwen3 config labelled architectures [Gemma4DSparkModel]: the Gemma4 family's "
         "reader names its first missing field", set_field("architectures", ["Gemma4DSparkModel"])),
    Case("cfg-architecture-unknown", "config", "convert", E.UnsupportedArchitectureError,
         "architectures [Llama4DSparkModel], no family", set_field("architectures", ["Llama4DSparkModel"])),
    Case("cfg-attention-bias", "config", "convert", E.UnsupportedFeatureError,
         "attention_bias true", set_field("attention_bias", True)),
    Case("cfg-mask-out-of-vocab", "config", "convert", E.MaskTokenError,
         "mask_token_id 256 of a 256-token vocabulary", set_field("mask_token_id", 256)),
    # --- directories (convert) ------------------------------------------------------------
    Case("dir-empty", "directory", "convert", E.SourceNotFoundError,
         "an empty directory", build_empty_dir),
    Case("dir-source-is-a-file", "directory", "convert", E.SourceNotFoundError,
         "the source is model.safetensors itself", build_source_is_file),
    Case("dir-config-fifo", "directory", "convert", E.SourceLayoutError,
         "config.json is a FIFO (named pipe): refused unread, never waited on",
         build_fifo("config.json")),
    Case("dir-weights-fifo", "directory", "convert", E.SourceLayoutError,
         "model.safetensors is a FIFO (named pipe): refused unread, never waited on",
         build_fifo(WEIGHTS)),
    Case("dir-pickle-only", "directory", "convert", E.SourceLayoutError,
         "config.json and pytorch_model.bin (a pickle that would create a directory)",
         build_pickle_only),
    Case("dir-weights-symlink-out", "directory", "convert", E.SourceLayoutError,
         "model.safetensors links to a file outside the directory", build_link_out(WEIGHTS)),
    Case("dir-config-symlink-out", "directory", "convert", E.SourceLayoutError,
         "config.json links to a file outside the directory", build_link_out("config.json")),
    Case("dir-single-and-sharded", "directory", "convert", E.SourceLayoutError,
         "model.safetensors next to an index and its shards", build_single_and_sharded),
    Case("dir-stray-shard", "directory", "convert", E.SourceLayoutError,
         "a shard of another split next to an index that does not name it", build_stray_shard),
    Case("dir-missing-shard", "directory", "convert", E.SourceNotFoundError,
         "the index names a shard that is not there", build_missing_shard),
    Case("dir-index-path-escapes", "directory", "convert", E.SafetensorsFormatError,
         "the index maps fc.weight to ../outside.safetensors", build_index_escapes),
    Case("dir-tensor-in-two-shards", "directory", "convert", E.SafetensorsFormatError,
         "fc.weight stored in both shards", build_tensor_in_two_shards),
    # --- artifacts (validate --strict --json) ---------------------------------------------
    Case("art-manifest-fifo", "artifact", "validate", E.InvalidArtifactError,
         "manifest.json is a FIFO (named pipe): refused unread, never waited on",
         edit_artifact(_fifo_in_artifact(MANIFEST))),
    Case("art-flipped-tensor-byte", "artifact", "validate", E.IntegrityError,
         "one bit flipped in blk.0.attn_k.weight (still finite)",
         edit_artifact(flip_low_bit("blk.0.attn_k.weight", 5))),
    Case("art-nan-in-tensor", "artifact", "validate", E.NonFiniteTensorError,
         "a BF16 NaN written into blk.1.ffn_up.weight",
         edit_artifact(lambda a: patch(a / GGUF, element(a, "blk.1.ffn_up.weight", 3), b"\xc0\x7f"))),
    Case("art-truncated-in-data", "artifact", "validate", E.GGUFFormatError,
         "drafter.gguf cut in the middle of its tensor data",
         edit_artifact(truncate_to(lambda a: (a / GGUF).stat().st_size // 2))),
    Case("art-truncated-in-header", "artifact", "validate", E.GGUFFormatError,
         "drafter.gguf cut inside its metadata", edit_artifact(truncate_to(lambda a: 200))),
    Case("art-bad-magic", "artifact", "validate", E.GGUFFormatError,
         "the magic GGUF changed to GGML", edit_artifact(lambda a: patch(a / GGUF, 0, b"GGML"))),
    Case("art-tensor-count-huge", "artifact", "validate", E.GGUFFormatError,
         "tensor count 2^63", edit_artifact(lambda a: patch(a / GGUF, 8, struct.pack("<Q", H)))),
    Case("art-metadata-type-edited", "artifact", "validate", E.MetadataError,
         "dflash.block_count's type UINT32 changed to INT32 (same bytes)",
         edit_artifact(lambda a: patch(a / GGUF, kv_type_offset(a, "dflash.block_count"),
                                       struct.pack("<I", 5)))),
    Case("art-metadata-key-renamed", "artifact", "validate", E.MetadataError,
         "dflash.block_count renamed dflash.block_cOunt in place",
         edit_artifact(lambda a: patch(a / GGUF, (a / GGUF).read_bytes().index(b"dflash.block_count"),
                                       b"dflash.block_cOunt"))),
    Case("art-tensor-offset-out-of-range", "artifact", "validate", E.GGUFFormatError,
         "conf_proj.bias's data offset points past the end of the file",
         edit_artifact(set_tensor_offset("conf_proj.bias", lambda a: (a / GGUF).stat().st_size))),
    Case("art-tensor-offsets-overlapping", "artifact", "validate", E.GGUFFormatError,
         "enc.output_norm.weight's data offset is fc.weight's",
         edit_artifact(set_tensor_offset("enc.output_norm.weight", first_tensor_offset))),
    Case("art-tensor-offset-unaligned", "artifact", "validate", E.GGUFFormatError,
         "output_norm.weight's data offset moved by 2 bytes",
         edit_artifact(set_tensor_offset("output_norm.weight",
                                         lambda a: int(tensor_info(a, "output_norm.weight").field.parts[5][0]) + 2))),
    Case("art-tensor-type-edited", "artifact", "validate", E.TensorDtypeError,
         "blk.0.attn_norm.weight's type BF16 changed to F16 (same size)",
         edit_artifact(lambda a: patch(a / GGUF, tensor_info_part_offset(a, "blk.0.attn_norm.weight", 4),
                                       struct.pack("<I", 1)))),
    Case("art-manifest-file-hash-edited", "artifact", "validate", E.IntegrityError,
         "artifact.sha256 in manifest.json changed",
         edit_artifact(edit_manifest(lambda m: m["artifact"].__setitem__(
             "sha256", other_hex(m["artifact"]["sha256"]))))),
    Case("art-manifest-tensor-hash-edited", "artifact", "validate", E.IntegrityError,
         "the sha256 of artifact.tensors[3] changed",
         edit_artifact(edit_manifest(lambda m: m["artifact"]["tensors"][3].__setitem__(
             "sha256", other_hex(m["artifact"]["tensors"][3]["sha256"]))))),
    Case("art-manifest-size-edited", "artifact", "validate", E.IntegrityError,
         "artifact.size one byte larger",
         edit_artifact(edit_manifest(lambda m: m["artifact"].__setitem__("size", m["artifact"]["size"] + 1)))),
    Case("art-manifest-source-hash-edited", "artifact", "validate", E.ManifestMismatchError,
         "source.weights_sha256 changed",
         edit_artifact(edit_manifest(lambda m: m["source"].__setitem__(
             "weights_sha256", other_hex(m["source"]["weights_sha256"]))))),
    Case("art-manifest-contract-edited", "artifact", "validate", E.ManifestMismatchError,
         "contract.block.block_size one larger than source.config's",
         edit_artifact(edit_manifest(_contract_block_size))),
    Case("art-manifest-not-json", "artifact", "validate", E.ManifestError,
         "manifest.json cut in half",
         edit_artifact(lambda a: (a / MANIFEST).write_text((a / MANIFEST).read_text()[:500]))),
    Case("art-manifest-unknown-field", "artifact", "validate", E.ManifestError,
         "an extra top-level field in manifest.json",
         edit_artifact(edit_manifest(lambda m: m.__setitem__("signed_by", "nobody")))),
    Case("art-manifest-missing", "artifact", "validate", E.InvalidArtifactError,
         "manifest.json deleted", edit_artifact(lambda a: (a / MANIFEST).unlink())),
    Case("art-gguf-missing", "artifact", "validate", E.InvalidArtifactError,
         "drafter.gguf deleted", edit_artifact(lambda a: (a / GGUF).unlink())),
    Case("art-gguf-symlink", "artifact", "validate", E.InvalidArtifactError,
         "drafter.gguf replaced by a symlink to a copy outside the artifact",
         edit_artifact(lambda a: _replace_by_link(a / GGUF))),
]


# --- numbers, verbatim configs, manifests the GGUF contradicts ----------------------

TARGET_DIR = GOLDEN / "reference" / "target"


def edit_artifact_with_target(edit: Callable[[Path], None]) -> Callable[[Path, Corpus], None]:
    """An artifact converted with --target (its manifest has a target record), then edited."""
    def build(inp: Path, corpus: Corpus) -> None:
        from dspark_convert.commands.convert import convert

        convert(DSPARK, inp, target=TARGET_DIR)
        edit(inp)
    return build


def _copy_keys(reader, writer, replaced: dict | None = None) -> None:
    """Every key of a drafter.gguf ``reader`` holds into ``writer``, as read (not the GGUF.*
    header fields nor the architecture: GGUFWriter writes those); ``replaced``:
    {key: (value, GGUFValueType)} written in the file's place instead."""
    from gguf import GGUFValueType

    for field in reader.fields.values():
        name = field.name
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if replaced and name in replaced:
            writer.add_key_value(name, *replaced[name])
            continue
        ftype = field.types[0]
        if ftype == GGUFValueType.ARRAY:
            writer.add_key_value(name, [int(field.parts[i][0]) for i in field.data],
                                 ftype, sub_type=field.types[1])
        elif ftype == GGUFValueType.STRING:
            writer.add_key_value(name, bytes(field.parts[-1]).decode(), ftype)
        else:
            writer.add_key_value(name, field.parts[-1][0].item(), ftype)


def rewrite_gguf_key(key: str, value: object, vtype) -> Callable[[Path], None]:
    """drafter.gguf written again by gguf-py with one key's value and type replaced (the
    file's size changes, so this cannot be a byte patch); tensors copied unchanged."""
    def edit(art: Path) -> None:
        import numpy as np
        from gguf import GGUFReader, GGUFWriter

        reader = GGUFReader(art / GGUF)
        out = art / "rewritten.gguf"
        writer = GGUFWriter(out, "dflash")
        _copy_keys(reader, writer, {key: (value, vtype)})
        for t in reader.tensors:   # BF16 only: raw 16-bit words in torch order [out, in]
            words = np.frombuffer(t.data.tobytes(), dtype=np.uint16)
            writer.add_tensor(t.name, words.reshape(list(reversed(t.shape.tolist()))),
                              raw_dtype=t.tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        out.replace(art / GGUF)
    return edit


def _manifest_set(*path_and_value) -> Callable[[dict], None]:
    *path, value = path_and_value

    def edit(m: dict) -> None:
        node = m
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value(node[path[-1]]) if callable(value) else value
    return edit


def _unused_field(text: str) -> Callable[[str], str]:
    return lambda t: t.rstrip().rstrip("}") + f', "unused_by_the_format": {text}}}\n'


from gguf import GGUFValueType as _VT  # noqa: E402

CASES += [
    # Numbers that do not fit the GGUF type they are stored as (exit 1 before).
    Case("cfg-num-target-layers-beyond-u32", "config", "convert", E.GeometryLimitError,
         "num_target_layers 2^32 (dflash.target.num_layers is UINT32)",
         set_field("num_target_layers", 2**32)),
    Case("cfg-vocab-size-beyond-u32", "config", "convert", E.GeometryLimitError,
         "vocab_size 2^32 (dflash.vocab_size is UINT32)", set_field("vocab_size", 2**32)),
    Case("cfg-rms-eps-beyond-f32", "config", "convert", E.GeometryLimitError,
         "rms_norm_eps 1e300 (FLOAT32 would hold inf)", set_field("rms_norm_eps", 1e300)),
    Case("cfg-rms-eps-below-f32", "config", "convert", E.GeometryLimitError,
         "rms_norm_eps 1e-50 (FLOAT32 would hold 0.0, which validate refuses)",
         set_field("rms_norm_eps", 1e-50)),
    # Config text that JSON allows but manifest.json could not keep verbatim.
    Case("cfg-unused-lone-surrogate", "config", "convert", E.ConfigError,
         'an unused field holding "\\ud800" (not Unicode text)',
         config_text(_unused_field('"\\ud800"'))),
    Case("cfg-unused-deeply-nested", "config", "convert", E.ConfigError,
         "an unused field nested 300 levels deep",
         config_text(_unused_field("[" * 300 + "]" * 300))),
    Case("cfg-unused-number-beyond-double", "config", "convert", E.ConfigError,
         "an unused field 1e400 (parses to infinity; would be recorded as null)",
         config_text(_unused_field("1e400"))),
    # Metadata of the wrong type where the rules would otherwise crash (exit 1 before).
    Case("art-rms-eps-float64-huge", "artifact", "validate", E.MetadataError,
         "layer_norm_rms_epsilon stored as FLOAT64 1e300",
         edit_artifact(rewrite_gguf_key("dflash.attention.layer_norm_rms_epsilon", 1e300,
                                        _VT.FLOAT64))),
    Case("art-target-layers-scalar", "artifact", "validate", E.MetadataError,
         "dflash.target_layers stored as a UINT32 scalar",
         edit_artifact(rewrite_gguf_key("dflash.target_layers", 3, _VT.UINT32))),
    Case("art-markov-rank-string", "artifact", "validate", E.MetadataError,
         "dflash.markov_rank stored as the string '16'",
         edit_artifact(rewrite_gguf_key("dflash.markov_rank", "16", _VT.STRING))),
    # Manifests that contradict what the GGUF (or the target record's own contract) confirms.
    Case("art-manifest-tensor-source-edited", "artifact", "validate", E.ManifestMismatchError,
         "artifact.tensors[0].source names another source tensor",
         edit_artifact(edit_manifest(_manifest_set("artifact", "tensors", 0, "source",
                                                   "hidden_norm.weight")))),
    Case("art-manifest-stripped-shape-edited", "artifact", "validate", E.ManifestMismatchError,
         "source.stripped[0].shape transposed",
         edit_artifact(edit_manifest(_manifest_set("source", "stripped", 0, "shape",
                                                   lambda s: s[::-1])))),
    Case("art-manifest-stripped-dtype-edited", "artifact", "validate", E.ManifestMismatchError,
         "source.stripped[0].dtype F16",
         edit_artifact(edit_manifest(_manifest_set("source", "stripped", 0, "dtype", "F16")))),
    Case("art-manifest-source-dtype-edited", "artifact", "validate", E.ManifestMismatchError,
         "source.dtype F32 (and rounded_to_bf16 true) for a config that declares bfloat16",
         edit_artifact(edit_manifest(lambda m: (
             _manifest_set("source", "dtype", "F32")(m),
             _manifest_set("source", "rounded_to_bf16", True)(m),
             [s.__setitem__("dtype", "F32") for s in m["source"]["stripped"]])))),
    Case("art-manifest-check-failed", "artifact", "validate", E.ManifestMismatchError,
         "checks[0] recorded as failed",
         edit_artifact(edit_manifest(_manifest_set("checks", 0, "status", "failed")))),
    Case("art-manifest-strata-check-edited", "artifact", "validate", E.ManifestMismatchError,
         "the recorded engine.strata.open note says Strata's loader accepts it",
         edit_artifact(edit_manifest(lambda m: [c.update(status="passed", detail="accepted")
                                                for c in m["checks"]
                                                if c["name"] == "engine.strata.open"]))),
    Case("art-manifest-target-hidden-size-edited", "artifact", "validate", E.ManifestMismatchError,
         "target.config.hidden_size 65 (the artifact was converted with --target)",
         edit_artifact_with_target(edit_manifest(_manifest_set("target", "config", "hidden_size",
                                                               65)))),
]


# --- readers: bounded memory for headers and metadata ----
# A header or metadata that is valid as far as its format goes but would grow 10-30 times
# into Python objects is refused by the reader's own limits (safetensors_reader.py:
# MAX_HEADER_ITEMS, MAX_HEADER_TENSORS, MAX_HEADER_TEXT_BYTES, MAX_INDEX_ITEMS;
# gguf_reader.py: MAX_ARRAY_LENGTH, MAX_ARRAYS, MAX_DECODED_BYTES). The cases here are the
# smallest inputs past each limit; tests/test_bounds_readers.py runs full-size inputs
# (95-100 MB) under a memory and time bound with the same builders.

_EMPTY_TENSOR = '{"dtype":"BF16","shape":[0],"data_offsets":[0,0]}'


def header_with_empty_tensors(count: int) -> Callable[[dict], bytes]:
    """The header plus ``count`` empty tensors (valid to the safetensors library: a zero-size
    tensor at offset 0 takes no bytes)."""
    def edit(header: dict) -> bytes:
        extra = "".join(f',"e{i}":{_EMPTY_TENSOR}' for i in range(count))
        return (json.dumps(header)[:-1] + extra + "}").encode()
    return edit


def header_with_shape_of_arrays(count: int) -> Callable[[dict], bytes]:
    """One more tensor whose shape holds ``count`` empty arrays: no object for a json hook
    to count, 3 bytes of text for each 64-byte list."""
    def edit(header: dict) -> bytes:
        shape = ",".join(["[]"] * count)
        return (json.dumps(header)[:-1]
                + f',"z":{{"dtype":"BF16","shape":[{shape}],"data_offsets":[0,0]}}}}').encode()
    return edit


def header_with_wide_metadata(chars: int) -> Callable[[dict], bytes]:
    """A metadata string of ``chars`` ASCII characters and one emoji: Python stores the whole
    text 4 bytes a character."""
    def edit(header: dict) -> bytes:
        header["__metadata__"]["note"] = "a" * chars + "\U0001F600"
        return json.dumps(header, ensure_ascii=False).encode()
    return edit


def build_index_with_entries(count: int) -> Callable[[Path, Corpus], None]:
    """The sharded fixture whose index also lists ``count`` tensors no shard holds."""
    def build(inp: Path, _c: Corpus) -> None:
        index = build_sharded(inp)
        shard = next(iter(index["weight_map"].values()))
        extra = "".join(f',"x{i}":"{shard}"' for i in range(count))
        text = json.dumps(index)
        at = text.index('"weight_map": {') + len('"weight_map": {')
        close = text.index("}", at)
        (inp / "model.safetensors.index.json").write_text(text[:close] + extra + text[close:])
    return build


def gguf_key(name: str) -> bytes:
    raw = name.encode()
    return struct.pack("<Q", len(raw)) + raw


def gguf_array(name: str, element_type: int, count: int, elements: bytes) -> bytes:
    """One key/value pair: ``name`` = ARRAY of ``count`` elements of GGUF type ``element_type``
    whose encoding is ``elements``."""
    return gguf_key(name) + struct.pack("<IIQ", 9, element_type, count) + elements


def insert_gguf_kv(pairs: Callable[[], list[bytes]]) -> Callable[[Path], None]:
    """drafter.gguf with the key/value pairs ``pairs()`` added after its own (the count
    raised, the tensor infos and data moved, the data section re-padded to 32): a file
    that is well-formed up to what the pairs hold."""
    def edit(art: Path) -> None:
        from gguf import GGUFReader

        path = art / GGUF
        reader = GGUFReader(path)
        fields = [f for k, f in reader.fields.items() if not k.startswith("GGUF.")]
        kv_end = max(f.offset + sum(p.nbytes for p in f.parts) for f in fields)
        ti_end = max(t.field.offset + sum(p.nbytes for p in t.field.parts)
                     for t in reader.tensors)
        raw = path.read_bytes()
        extra = pairs()
        (kv_count,) = struct.unpack_from("<Q", raw, 16)
        head = (raw[:16] + struct.pack("<Q", kv_count + len(extra)) + raw[24:kv_end]
                + b"".join(extra) + raw[kv_end:ti_end])
        path.write_bytes(head + bytes(-len(head) % 32) + raw[reader.data_offset:])
    return edit


def uint8_arrays(count: int, length: int) -> Callable[[], list[bytes]]:
    return lambda: [gguf_array(f"x.bytes{i}", 0, length, bytes(length)) for i in range(count)]


def string_arrays(count: int, length: int) -> Callable[[], list[bytes]]:
    """``count`` arrays of ``length`` two-character strings (10 bytes each in the file,
    about 60 in memory)."""
    one = struct.pack("<Q", 2) + b"ab"
    return lambda: [gguf_array(f"x.strings{i}", 8, length, one * length) for i in range(count)]


def nested_arrays(length: int, count: int = 1) -> Callable[[], list[bytes]]:
    """``count`` arrays of ``length`` empty UINT8 arrays (12 bytes each in the file)."""
    empty = struct.pack("<IQ", 0, 0)
    return lambda: [gguf_array(f"x.nested{i}", 9, length, empty * length) for i in range(count)]


CASES += [
    # safetensors headers (convert): valid to the library, refused before json builds them
    Case("st-header-empty-tensors-past-value-limit", "safetensors", "convert",
         E.SafetensorsFormatError,
         "160,000 empty tensors: more JSON values than MAX_HEADER_ITEMS (2^20)",
         edit_header(header_with_empty_tensors(160_000))),
    Case("st-header-too-many-tensors", "safetensors", "convert", E.SafetensorsFormatError,
         "70,000 empty tensors: more than MAX_HEADER_TENSORS (65536)",
         edit_header(header_with_empty_tensors(70_000))),
    Case("st-header-shape-of-empty-arrays", "safetensors", "convert", E.SafetensorsFormatError,
         "a tensor whose shape holds 1.1 million empty arrays",
         edit_header(header_with_shape_of_arrays(1_100_000))),
    Case("st-header-text-too-wide", "safetensors", "convert", E.SafetensorsFormatError,
         "26 MB of header with one emoji: over 100 MB as Python text",
         edit_header(header_with_wide_metadata(26_000_000))),
    Case("dir-index-past-value-limit", "directory", "convert", E.SafetensorsFormatError,
         "an index listing 270,000 tensors: more JSON values than MAX_INDEX_ITEMS (2^18)",
         build_index_with_entries(270_000)),
    # GGUF metadata (validate): refused by the reader, in bounded memory
    Case("art-metadata-array-too-long", "artifact", "validate", E.GGUFFormatError,
         "a UINT8 metadata array of 2^20 + 1 elements (MAX_ARRAY_LENGTH is 2^20)",
         edit_artifact(insert_gguf_kv(uint8_arrays(1, 2**20 + 1)))),
    Case("art-metadata-strings-past-budget", "artifact", "validate", E.GGUFFormatError,
         "20 arrays of 65,536 two-character strings: 13 MB, over 64 MiB as Python strings",
         edit_artifact(insert_gguf_kv(string_arrays(20, 65_536)))),
    Case("art-metadata-nested-arrays-past-limit", "artifact", "validate", E.GGUFFormatError,
         "an array of 65,536 empty arrays: more arrays than MAX_ARRAYS (65536)",
         edit_artifact(insert_gguf_kv(nested_arrays(65_536)))),
]

def _replace_by_link(path: Path) -> None:
    outside = path.parent.parent / "outside.gguf"
    shutil.copy(path, outside)
    path.unlink()
    path.symlink_to(Path("..") / outside.name)


# --- quantized artifacts (`dspark quantize`) and the engines' record ----------------
# Each starts from the plain golden drafter quantized by the real `dspark quantize` code
# (H = 32: every matrix holds whole 32-value blocks), then one byte patch breaks one rule,
# keeping the file's layout (sizes and offsets) intact so that the rule itself refuses it.

def quantized_artifact(edit: Callable[[Path], None], qtype: str = "q8_0",
                       base: Path = PLAIN) -> Callable[[Path, Corpus], None]:
    def build(inp: Path, corpus: Corpus) -> None:
        from dspark_convert.commands.quantize import quantize_artifact

        quantize_artifact(corpus.artifact(base), inp, qtype)
        edit(inp)
    return build


def set_tensor_dims(name: str, dims: tuple[int, ...]) -> Callable[[Path], None]:
    """New GGUF dims for a tensor, of the same element count (so the same byte size)."""
    def edit(art: Path) -> None:
        info = tensor_info(art, name)
        assert len(dims) == len(info.shape) and _prod(dims) == _prod(info.shape.tolist())
        patch(art / GGUF, tensor_info_part_offset(art, name, 3), struct.pack(f"<{len(dims)}Q", *dims))
    return edit


def _prod(values) -> int:
    out = 1
    for v in values:
        out *= int(v)
    return out


def set_block_scale(name: str, block: int, f16_bits: int) -> Callable[[Path], None]:
    """The F16 scale (the first two bytes) of one block of a Q8_0 tensor (34-byte blocks)."""
    def edit(art: Path) -> None:
        patch(art / GGUF, int(tensor_info(art, name).data_offset) + 34 * block,
              struct.pack("<H", f16_bits))
    return edit


def set_tensor_type(name: str, ggml_type: int) -> Callable[[Path], None]:
    def edit(art: Path) -> None:
        patch(art / GGUF, tensor_info_part_offset(art, name, 4), struct.pack("<I", ggml_type))
    return edit


def set_string_value(key: str, value: str) -> Callable[[Path], None]:
    """A string key's value replaced by one of the same length (type u32, length u64, bytes)."""
    def edit(art: Path) -> None:
        from gguf import GGUFReader

        old = bytes(GGUFReader(art / GGUF).fields[key].parts[-1]).decode()
        assert len(old.encode()) == len(value.encode()), (old, value)
        patch(art / GGUF, kv_type_offset(art, key) + 4 + 8, value.encode())
    return edit


def _drop_error(m: dict) -> None:
    next(t for t in m["artifact"]["tensors"] if "error" in t).pop("error")


CASES += [
    Case("art-q-row-not-whole-blocks", "artifact", "validate", E.GGUFFormatError,
         "a Q8_0 matrix's dims patched from [32, 32] to [16, 64]: rows of 16 values, not whole "
         "32-value blocks (the same bytes)",
         quantized_artifact(set_tensor_dims("blk.0.attn_q.weight", (16, 64)))),
    Case("art-q-nan-block-scale", "artifact", "validate", E.QuantizedTensorError,
         "the F16 scale of block 3 of a Q8_0 matrix patched to NaN (0x7e00)",
         quantized_artifact(set_block_scale("blk.1.ffn_down.weight", 3, 0x7E00))),
    Case("art-q-inf-block-scale", "artifact", "validate", E.QuantizedTensorError,
         "the F16 scale of the last block of fc.weight patched to -inf (0xfc00)",
         quantized_artifact(set_block_scale("fc.weight", 32 * 3 - 1, 0xFC00))),
    Case("art-q-norm-quantized", "artifact", "validate", E.QuantizedTensorError,
         "a 32-value norm's type patched BF16 -> Q8_0 (34 bytes, padded to the same 64)",
         quantized_artifact(set_tensor_type("blk.0.attn_norm.weight", 8))),
    Case("art-q-type-not-the-keys", "artifact", "validate", E.QuantizedTensorError,
         "strata.dflash.quantization patched to Q5_0 in a Q8_0 artifact: its matrices are of "
         "a type the key does not name",
         quantized_artifact(set_string_value("strata.dflash.quantization", "Q5_0"))),
    Case("art-q-type-lower-case", "artifact", "validate", E.MetadataError,
         "strata.dflash.quantization patched to q8_0 (Strata writes the name upper case)",
         quantized_artifact(set_string_value("strata.dflash.quantization", "q8_0"))),
    Case("art-q-manifest-parent-removed", "artifact", "validate", E.ManifestMismatchError,
         "manifest.json's parent record removed from a quantized artifact",
         quantized_artifact(edit_manifest(lambda m: m.pop("parent")))),
    Case("art-q-manifest-error-removed", "artifact", "validate", E.ManifestMismatchError,
         "manifest.json's quantization error of one quantized tensor removed",
         quantized_artifact(edit_manifest(_drop_error))),
    Case("art-manifest-engines-edited", "artifact", "validate", E.ManifestMismatchError,
         "manifest.json's engines record says strata.open accepts a DSpark drafter",
         edit_artifact(edit_manifest(_manifest_set("engines", "strata.open",
                                                   {"accepts": True, "reason": None})))),
]


# --- what a quantized manifest claims, confirmed against the file; JSON that
# parses but cannot be written back; a matrix of a type no rule names ------------------------

def _first_error(**values) -> Callable[[dict], None]:
    return lambda m: next(t for t in m["artifact"]["tensors"] if "error" in t)["error"].update(values)


def _parent_gguf_size(delta: int) -> Callable[[dict], None]:
    def edit(m: dict) -> None:
        next(f for f in m["parent"]["files"] if f["path"] == GGUF)["size"] += delta
    return edit


def lone_surrogate_in_manifest(art: Path) -> None:
    """A recorded check's detail ends in the JSON escape \\ud800 (no file confirms it)."""
    path = art / MANIFEST
    text = path.read_text()
    detail = json.dumps(json.loads(text)["checks"][0]["detail"])
    path.write_text(text.replace(detail, detail[:-1] + '\\ud800"', 1))


def requantize_tensor(name: str, ggml_type: str) -> Callable[[Path], None]:
    """drafter.gguf written again by gguf-py with tensor ``name`` quantized to
    ``ggml_type`` from its dequantized values (a well-formed file, of another size: no byte
    patch can change a block type), every other key and tensor copied raw."""
    def edit(art: Path) -> None:
        import numpy as np
        from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
        from gguf.quants import dequantize, quantize

        reader = GGUFReader(art / GGUF)
        out = art / "rewritten.gguf"
        writer = GGUFWriter(out, "dflash")
        _copy_keys(reader, writer)
        for t in reader.tensors:
            data, kind = np.asarray(t.data), t.tensor_type
            if t.name == name:
                values = dequantize(data, kind).reshape(list(reversed(t.shape.tolist())))
                kind = GGMLQuantizationType[ggml_type]
                data = quantize(values.astype(np.float32), kind)
            writer.add_tensor(t.name, data, raw_shape=data.shape, raw_dtype=kind)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        out.replace(art / GGUF)
    return edit


CASES += [
    Case("art-q-manifest-error-impossible", "artifact", "validate", E.ManifestMismatchError,
         "a Q8_0 tensor's recorded max_abs error set to 5.0: more than its largest block "
         "scale allows",
         quantized_artifact(edit_manifest(_first_error(max_abs=5.0)))),
    Case("art-q-manifest-rel-rms-impossible", "artifact", "validate", E.ManifestMismatchError,
         "a Q8_0 tensor's recorded relative RMS error set to 0.5 (Q8_0 allows at most 0.025)",
         quantized_artifact(edit_manifest(_first_error(rel_rms=0.5)))),
    Case("art-q-manifest-parent-size", "artifact", "validate", E.ManifestMismatchError,
         "parent.files' drafter.gguf size 32 bytes more than the BF16 file this one was "
         "quantized from",
         quantized_artifact(edit_manifest(_parent_gguf_size(32)))),
    Case("art-q-manifest-tool", "artifact", "validate", E.ManifestMismatchError,
         "quantization.tool names another quantizer (llama-quantize)",
         quantized_artifact(edit_manifest(_manifest_set("quantization", "tool",
                                                        "llama-quantize b4500")))),
    Case("art-q-manifest-heads-without-heads", "artifact", "validate", E.ManifestMismatchError,
         "quantization.heads Q8_0 for a plain DFlash drafter, which has no head matrices",
         quantized_artifact(edit_manifest(_manifest_set("quantization", "heads", "Q8_0")))),
    Case("art-manifest-lone-surrogate", "artifact", "validate", E.ManifestError,
         "a recorded check's detail holding the escape \\ud800 (a lone surrogate: it passed "
         "validate and crashed quantize's writer)",
         edit_artifact(lone_surrogate_in_manifest)),
    Case("art-q-q4_1-matrix", "artifact", "validate", E.QuantizedTensorError,
         "fc.weight written as a real Q4_1 tensor in a Q8_0 artifact (it was 'expected type "
         "BF16', 23)",
         quantized_artifact(requantize_tensor("fc.weight", "Q4_1"))),
]


# --- the DFlash2 and Gemma 4 assistant kinds (convert --target) -----------------------------

DFLASH2 = GOLDEN / "reference" / "dflash2" / "draft"
ASSISTANT = GOLDEN / "reference" / "gemma4_assistant" / "assistant"
QWEN3_TARGET = "golden/reference/target"
GEMMA4_TARGET = "golden/reference/gemma4/target"


def _zlab(config: dict) -> dict:
    """A speculators DFlash2 config.json rewritten in z-lab's layout (what llama.cpp's
    converter reads): the layer config flat, the DFlash2 fields in dflash_config, target
    layer ids = aux ids - 1."""
    flat = dict(config["transformer_layer_config"])
    flat.update(architectures=config["architectures"], dtype=config.get("dtype"),
                is_causal=False, num_target_layers=6)
    flat["dflash_config"] = {
        "block_size": config["block_size"], "conv_group_size": config["conv_group_size"],
        "conv_kernel_size": config["conv_kernel_size"], "selector_rank": config["selector_rank"],
        "selector_top_k": config["selector_top_k"], "mask_token_id": config["mask_token_id"],
        "target_layer_ids": [i - 1 for i in config["aux_hidden_state_layer_ids"]],
        "output_multiplier": 1.0, "final_logit_softcapping": None}
    return flat


def _zlab_with(field: str, value: object) -> Callable[[dict], dict]:
    def edit(config: dict) -> None:
        z = _zlab(config)
        z["dflash_config"][field] = value
        config.clear()
        config.update(z)
    return edit


def _assistant_backbone(hb: int) -> Callable[[Path, Corpus], None]:
    """An assistant whose backbone_hidden_size is ``hb`` (its projections of that width):
    a well-formed assistant for another target."""
    def build(inp: Path, corpus: Corpus) -> None:
        import torch

        def widths(tensors: dict) -> None:
            h = tensors["model.norm.weight"].shape[0]
            tensors["pre_projection.weight"] = torch.zeros(h, 2 * hb, dtype=torch.bfloat16)
            tensors["post_projection.weight"] = torch.zeros(hb, h, dtype=torch.bfloat16)
        edit_tensors(widths, ASSISTANT)(inp, corpus)
        config = json.loads((inp / "config.json").read_text())
        config["backbone_hidden_size"] = hb
        (inp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return build


def _generation(field: str, value: object) -> Callable[[Path, Corpus], None]:
    def build(inp: Path, _c: Corpus) -> None:
        copy_source(inp, ASSISTANT)
        path = inp / "generation_config.json"
        generation = json.loads(path.read_text())
        generation[field] = value
        path.write_text(json.dumps(generation, indent=2) + "\n")
    return build


def _rewrite_kind_key(key: str, value: int) -> Callable[[Path], None]:
    """drafter.gguf written again with one UINT32 key's value replaced, its architecture
    kept (tests/support/llama_cpp.rewrite_gguf)."""
    def edit(art: Path) -> None:
        from gguf import GGUFValueType

        sys.path.insert(0, str(ROOT / "tests"))
        from support.llama_cpp import rewrite_gguf

        out = art / "rewritten.gguf"
        rewrite_gguf(art / GGUF, out, set_keys={key: (value, GGUFValueType.UINT32, None)})
        out.replace(art / GGUF)
    return edit


def _drop_tensor(name: str) -> Callable[[dict], None]:
    return lambda tensors: tensors.pop(name)


CASES += [
    Case("dflash2-missing-conv-tensor", "safetensors", "convert", E.MissingTensorError,
         "a DFlash2 drafter without layers.0.attention_conv.base_kernel",
         edit_tensors(_drop_tensor("layers.0.attention_conv.base_kernel"), DFLASH2),
         QWEN3_TARGET),
    Case("dflash2-nan-codebook", "safetensors", "convert", E.NonFiniteTensorError,
         "a NaN in a DFlash2 selector's successor codebook",
         edit_tensors(poke("candidate_selector.successor_codebook", 5, float("nan")), DFLASH2),
         QWEN3_TARGET),
    Case("dflash2-selector-top-k-over-vocab", "config", "convert", E.DFlash2ConfigError,
         "DFlash2 selector_top_k 513 over a vocabulary of 512",
         set_field("selector_top_k", 513, DFLASH2), QWEN3_TARGET),
    Case("dflash2-group-not-dividing", "config", "convert", E.DFlash2ConfigError,
         "DFlash2 conv_group_size 24 does not divide hidden_size 64",
         set_field("conv_group_size", 24, DFLASH2), QWEN3_TARGET),
    Case("dflash2-zlab-softcap", "config", "convert", E.DFlash2ConfigError,
         "a z-lab-layout DFlash2 config whose unary logits are softcapped (20.0)",
         edit_config(_zlab_with("final_logit_softcapping", 20.0), DFLASH2), QWEN3_TARGET),
    Case("dflash2-zlab-taps-not-ints", "config", "convert", E.DFlash2ConfigError,
         "a z-lab-layout DFlash2 config whose target_layer_ids are strings",
         edit_config(_zlab_with("target_layer_ids", ["0", "2"]), DFLASH2), QWEN3_TARGET),
    Case("dflash2-tap-beyond-target", "config", "convert", E.DFlash2TargetError,
         "aux_hidden_state_layer_ids [1, 3, 7] on a target of 6 layers (indices 0..6)",
         set_field("aux_hidden_state_layer_ids", [1, 3, 7], DFLASH2), QWEN3_TARGET),
    Case("dflash2-gemma4-target", "config", "convert", E.DFlash2TargetError,
         "a DFlash2 drafter converted against a gemma4_unified target",
         edit_config(lambda c: None, DFLASH2), GEMMA4_TARGET),
    Case("dflash2-without-target", "config", "convert", E.KindTargetRequiredError,
         "a DFlash2 drafter converted without --target", edit_config(lambda c: None, DFLASH2)),
    Case("assistant-backbone-mismatch", "config", "convert", E.AssistantTargetError,
         "an assistant for a backbone of hidden size 48 against a target of 64",
         _assistant_backbone(48), GEMMA4_TARGET),
    Case("assistant-wrong-layer-type", "config", "convert", E.AssistantConfigError,
         "layer 1 declared sliding_attention with the full layer's geometry (two geometries "
         "for one KV type)",
         edit_config(lambda c: c["text_config"].__setitem__(
             "layer_types", ["sliding_attention", "sliding_attention"]), ASSISTANT),
         GEMMA4_TARGET),
    Case("assistant-qwen3-target", "config", "convert", E.AssistantTargetError,
         "a Gemma 4 assistant converted against a Qwen3 target",
         edit_config(lambda c: None, ASSISTANT), QWEN3_TARGET),
    Case("assistant-other-class", "config", "convert", E.UnsupportedArchitectureError,
         "architectures Gemma4AssistantForCausalLM (the gemma4_text assistant)",
         set_field("architectures", ["Gemma4AssistantForCausalLM"], ASSISTANT), GEMMA4_TARGET),
    Case("assistant-zero-drafts", "config", "convert", E.AssistantConfigError,
         "generation_config.json num_assistant_tokens 0",
         _generation("num_assistant_tokens", 0), GEMMA4_TARGET),
    Case("assistant-without-target", "config", "convert", E.KindTargetRequiredError,
         "a Gemma 4 assistant converted without --target",
         edit_config(lambda c: None, ASSISTANT)),
    Case("dflash2-art-flipped-conv-bit", "artifact", "validate", E.IntegrityError,
         "one low mantissa bit of a DFlash2 artifact's blk.0.attn_conv_base flipped",
         edit_artifact(flip_low_bit("blk.0.attn_conv_base", 3), DFLASH2, QWEN3_TARGET)),
    Case("dflash2-art-selector-top-k", "artifact", "validate", E.DFlash2ConfigError,
         "a DFlash2 artifact's dflash.selector_top_k rewritten to 513, over its vocabulary",
         edit_artifact(_rewrite_kind_key("dflash.selector_top_k", 513), DFLASH2,
                       QWEN3_TARGET)),
    Case("assistant-art-flipped-head-bit", "artifact", "validate", E.IntegrityError,
         "one low mantissa bit of an assistant artifact's token_embd.weight (its own head)",
         edit_artifact(flip_low_bit("token_embd.weight", 7), ASSISTANT, GEMMA4_TARGET)),
    Case("assistant-art-drafts-tampered", "artifact", "validate", E.ManifestMismatchError,
         "manifest.json's source.companion says 5 drafts per cycle, the file 4",
         edit_artifact(edit_manifest(lambda m: m["source"]["companion"].__setitem__(
             "num_assistant_tokens", 5)), ASSISTANT, GEMMA4_TARGET)),
    Case("assistant-missing-q-norm", "safetensors", "convert", E.MissingTensorError,
         "an assistant without model.layers.1.self_attn.q_norm.weight",
         edit_tensors(_drop_tensor("model.layers.1.self_attn.q_norm.weight"), ASSISTANT),
         GEMMA4_TARGET),
]


# --- building -------------------------------------------------------------------------------

def case_record(case: Case) -> dict:
    record = {"name": case.name, "group": case.group, "command": case.command,
              "error": case.error.__name__, "exit_code": case.error.exit_code,
              "about": case.about}
    if case.target is not None:
        record["target"] = case.target
    return record


def build_corpus(out: Path, names: list[str] | None = None) -> list[Path]:
    """Build every case (or those named) under ``out``; returns the case directories."""
    out.mkdir(parents=True, exist_ok=True)
    scratch = out / ".good"
    corpus = Corpus(scratch)
    built = []
    for case in CASES:
        if names is not None and case.name not in names:
            continue
        directory = out / case.name
        if directory.exists():
            shutil.rmtree(directory)
        directory.mkdir()
        case.build(directory / "input", corpus)
        (directory / "case.json").write_text(json.dumps(case_record(case), indent=2) + "\n")
        built.append(directory)
    shutil.rmtree(scratch, ignore_errors=True)
    return built


def readme_text() -> str:
    groups = {"safetensors": "safetensors headers and data", "config": "configs",
              "directory": "directories", "artifact": "artifacts"}
    lines = [
        "# Hostile-input corpus",
        "",
        "Generated by `make_corpus.py` (never hand-edited bytes): each case starts from a golden",
        "fixture and breaks one thing. `tests/test_hostile_corpus.py` builds the corpus into a",
        "temporary directory and runs every case through the real CLI (`dspark convert ... --json`",
        "or `dspark validate --strict --json`; in-process, a canary of each group and, in the slow",
        "set, every case also as a `dspark` process): the intended error class and its exit code,",
        "one `error:` line on stderr, no traceback, and nothing written (no output, no temporary",
        "sibling, the input unchanged).",
        "",
        "```sh",
        ".venv/bin/python tests/hostile/make_corpus.py --out /tmp/corpus   # build it by hand",
        ".venv/bin/python tests/hostile/make_corpus.py --readme            # rewrite this file",
        "```",
        "",
        "This list is generated from the script's `CASES` (a test fails when it is stale).",
        "",
        f"{len(CASES)} cases.",
    ]
    for group, title in groups.items():
        lines += ["", f"## {title}", "", "| case | command | refused with | exit | what is broken |",
                  "|---|---|---|---|---|"]
        for case in (c for c in CASES if c.group == group):
            lines.append(f"| `{case.name}` | {case.command} | `{case.error.__name__}` | "
                         f"{case.error.exit_code} | {case.about} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="build every case under this directory")
    parser.add_argument("--readme", action="store_true", help="rewrite tests/hostile/README.md")
    args = parser.parse_args(argv)
    if not args.out and not args.readme:
        parser.error("give --out DIR and/or --readme")
    if args.readme:
        (HERE / "README.md").write_text(readme_text())
        print("wrote tests/hostile/README.md")
    if args.out:
        built = build_corpus(args.out)
        print(f"built {len(built)} cases under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
