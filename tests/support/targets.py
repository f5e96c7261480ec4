"""Targets for the pairing tests: the golden one, and variants of it written with the real
safetensors and tokenizers libraries (``make_target``: wrong in one way each, so that only
the pairing can object; ``byte_bpe``: another tokenizer.json)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

from dspark_convert.target.model import EMBED_NAME, HEAD_NAME
from support.paths import GOLDEN_TARGET


def make_target(root: Path, *, hidden: int | None = None, vocab: int | None = None,
                layers: int | None = None, tie: bool = False, shift_embedding: int = 0,
                tokenizer: str | Path | None = None, config: dict | None = None,
                sharded: bool = False) -> Path:
    """A variant of the golden target in ``root``: other hidden size / vocabulary / layer
    count (embedding and head resized to match, so only the pairing can object), a tied
    head, embedding rows rolled by ``shift_embedding``, another tokenizer.json, config
    overrides, or its weights in two shards with an index."""
    root.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((GOLDEN_TARGET / "config.json").read_text())
    tensors = load_file(GOLDEN_TARGET / "model.safetensors")
    n_layers = layers if layers is not None else cfg["num_hidden_layers"]
    layer0 = {k.split(".", 3)[3]: v for k, v in tensors.items() if k.startswith("model.layers.0.")}
    tensors = {k: v for k, v in tensors.items()
               if not k.startswith("model.layers.") or int(k.split(".")[2]) < n_layers}
    for i in range(cfg["num_hidden_layers"], n_layers):   # more layers: copies of layer 0
        tensors.update({f"model.layers.{i}.{k}": v.clone() for k, v in layer0.items()})
    cfg["num_hidden_layers"] = n_layers
    cfg["layer_types"] = ["full_attention"] * n_layers
    for name in (EMBED_NAME, HEAD_NAME):
        t = tensors[name]
        if vocab is not None:
            t = t.repeat((vocab + t.shape[0] - 1) // t.shape[0], 1)[:vocab]
        if hidden is not None:
            t = t.repeat(1, (hidden + t.shape[1] - 1) // t.shape[1])[:, :hidden]
        tensors[name] = t.contiguous()
    if shift_embedding:
        tensors[EMBED_NAME] = torch.roll(tensors[EMBED_NAME], shift_embedding, dims=0).contiguous()
    cfg["vocab_size"] = vocab or cfg["vocab_size"]
    cfg["hidden_size"] = hidden or cfg["hidden_size"]
    if tie:
        del tensors[HEAD_NAME]
        cfg["tie_word_embeddings"] = True
    cfg.update(config or {})
    (root / "config.json").write_text(json.dumps(cfg, indent=2))
    if sharded:
        names = sorted(tensors)
        halves = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
                  "model-00002-of-00002.safetensors": names[len(names) // 2:]}
        weight_map = {}
        for shard, part in halves.items():
            save_file({k: tensors[k] for k in part}, root / shard)
            weight_map.update({k: shard for k in part})
        (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    else:
        save_file(tensors, root / "model.safetensors")
    if isinstance(tokenizer, str):
        (root / "tokenizer.json").write_text(tokenizer)
    else:
        shutil.copy(tokenizer or GOLDEN_TARGET / "tokenizer.json", root / "tokenizer.json")
    return root


def byte_bpe(size_extra: int = 0, added=()) -> str:
    """A byte-level BPE with 256 byte tokens (+ ``size_extra`` padding words) and added
    tokens, as a tokenizer.json string."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {t: i for i, t in enumerate(alphabet)}
    for i in range(size_extra):
        vocab[f"w{i:04d}"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    for content, special in added:
        if special:
            tok.add_special_tokens([AddedToken(content, special=True)])
        else:
            tok.add_tokens([AddedToken(content, special=False)])
    return tok.to_str()
