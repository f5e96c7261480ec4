"""The baseline: an eager converter that holds every tensor in memory before writing.

This is how llama.cpp's convert_hf_to_gguf.py (without lazy evaluation) and Strata's
tools/dflash_gguf.py work: load the whole state dict, hand every tensor to gguf-py's
``GGUFWriter.add_tensor``, then ``write_header_to_file`` / ``write_kv_data_to_file`` /
``write_tensors_to_file``. It writes the same 62 tensors under the same names as
`dspark convert` (embedding and head are loaded, as an eager converter loads everything,
but not written: Strata refuses them) and the same core dflash keys, but checks nothing:
no hashes, no finite-value scan, no manifest. The output is fsynced at the end so that
its wall time is comparable with `cp` + `sync` and our converter's atomic write.

    python bench/baseline_eager.py CHECKPOINT_DIR OUT.gguf
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFWriter
from gguf.constants import GGMLQuantizationType


def load_state_dict(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a BF16 safetensors file, read into memory (uint16 bit patterns; the
    safetensors numpy frontend has no BF16)."""
    with open(path, "rb") as fh:
        header_len = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(header_len))
        header.pop("__metadata__", None)
        start = 8 + header_len
        tensors = {}
        for name, info in header.items():
            begin, end = info["data_offsets"]
            fh.seek(start + begin)
            data = np.frombuffer(fh.read(end - begin), dtype="<u2")
            tensors[name] = data.reshape(info["shape"])
    return tensors


def gguf_names(config: dict) -> dict[str, str]:
    """Source name -> GGUF name for the tensors that are written (the project's table)."""
    from dspark_convert.contract.dspark import build_contract, parse_config

    contract = build_contract(parse_config(config))
    return {t.source_name: t.gguf_name for t in contract.written_tensors}


def convert_eager(checkpoint: Path, out: Path) -> None:
    config = json.loads((checkpoint / "config.json").read_text())
    tensors = load_state_dict(checkpoint / "model.safetensors")   # everything, in RAM
    names = gguf_names(config)

    writer = GGUFWriter(out, "dflash")
    writer.add_uint32("dflash.embedding_length", config["hidden_size"])
    writer.add_uint32("dflash.block_count", config["num_hidden_layers"])
    writer.add_uint32("dflash.attention.head_count", config["num_attention_heads"])
    writer.add_uint32("dflash.attention.head_count_kv", config["num_key_value_heads"])
    writer.add_uint32("dflash.attention.key_length", config["head_dim"])
    writer.add_uint32("dflash.feed_forward_length", config["intermediate_size"])
    writer.add_uint32("dflash.vocab_size", config["vocab_size"])
    writer.add_uint32("dflash.block_size", config["block_size"])
    writer.add_uint32("dflash.mask_token_id", config["mask_token_id"])
    writer.add_uint32("dflash.markov_rank", config.get("markov_rank", 0))
    for source_name, gguf_name in names.items():
        # uint16 bits with raw_dtype BF16: gguf-py keeps the numpy shape, reversed in GGUF.
        writer.add_tensor(gguf_name, tensors[source_name], raw_dtype=GGMLQuantizationType.BF16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with open(out, "rb+") as fh:
        os.fsync(fh.fileno())


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    convert_eager(Path(argv[0]), Path(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
