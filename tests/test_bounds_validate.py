"""validate and inspect stop at the first structural failure, in bounded memory and time
(hostile inputs). Where the bound is the point, run through the real CLI with an
address-space cap on the child (tests/support/bounded.py), so a regression fails here
instead of swapping the machine; where it is the refusal itself, in-process."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest
from conftest import REFERENCE_DRAFTER
from hostile import make_corpus  # the corpus' editing tools
from support.bounded import run_bounded
from support.cli import assert_one_error_line, run_cli

from dspark_convert.errors import MetadataError, TensorShapeError, UnexpectedTensorError

GGUF = "drafter.gguf"


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    from dspark_convert.commands.convert import convert

    out = tmp_path_factory.mktemp("good") / "art"
    convert(REFERENCE_DRAFTER, out)
    return out


def test_a_sparse_40_gb_drafter_is_refused_without_reading_it(artifact: Path, tmp_path: Path):
    """The last tensor's shape edited to span 40 GB and the file extended (sparse) to hold
    it: structure in bounds, but the inventory and the manifest's size fail, so nothing is
    read (it used to hash all 40 GB)."""
    art = tmp_path / "art"
    shutil.copytree(artifact, art)
    path = art / GGUF
    last = make_corpus.tensor_info(art, "conf_proj.bias")
    data_offset = int(last.data_offset)
    elements = 20_000_000_000                       # BF16: 40 GB
    make_corpus.patch(path, make_corpus.tensor_info_part_offset(art, "conf_proj.bias", 3),
                      struct.pack("<Q", elements))
    os.truncate(path, data_offset + -(-2 * elements // 32) * 32)
    assert path.stat().st_size > 40 * 10**9 and path.stat().st_blocks * 512 < 10**7

    proc = run_bounded("validate", str(art), "--json", memory_mb=400, seconds=15)
    assert_one_error_line(proc, TensorShapeError.exit_code)
    assert proc.seconds < 10, f"took {proc.seconds:.1f} s"
    report = json.loads(proc.stdout)
    status = {c["name"]: c["status"] for c in report["checks"]}
    assert status["gguf.inventory"] == "failed" and status["gguf.values"] == "skipped"
    assert status["integrity"] == "failed"            # the manifest's size, before any read

    proc = run_bounded("inspect", str(art), memory_mb=400, seconds=15)
    assert proc.returncode == TensorShapeError.exit_code, proc.stderr


@pytest.mark.parametrize(("key", "value", "vtype"), [
    ("dflash.target_layers", 3, "UINT32"),
    ("dflash.markov_rank", "16", "STRING"),
    ("dflash.attention.layer_norm_rms_epsilon", 1e300, "FLOAT64"),
])
def test_inspect_and_validate_refuse_a_key_of_the_wrong_type(artifact: Path, tmp_path: Path,
                                                            key: str, value, vtype: str):
    """inspect used to exit 1 on a scalar target_layers and blame markov_head_type for a
    string markov_rank: both read the metadata through the one typed reader now."""
    from gguf import GGUFValueType

    art = tmp_path / "art"
    shutil.copytree(artifact, art)
    make_corpus.rewrite_gguf_key(key, value, GGUFValueType[vtype])(art)
    for command in ("inspect", "validate"):
        proc = run_cli(command, str(art))
        line = assert_one_error_line(proc, MetadataError.exit_code)
        assert f"'{key}'" in line and f"found {vtype}" in line, line


@pytest.mark.slow
def test_inspect_lists_a_bounded_table_for_a_header_of_many_tensors(tmp_path: Path):
    """45,000 unexpected (empty) tensors: inspect refuses (21) quickly and prints at most a
    bounded number of rows, saying how many it left out."""
    src = tmp_path / "src"
    shutil.copytree(REFERENCE_DRAFTER, src)
    header, data = make_corpus.split_safetensors(src / "model.safetensors")
    for i in range(45_000):
        header[f"extra.{i}"] = {"dtype": "BF16", "shape": [0], "data_offsets": [len(data), len(data)]}
    make_corpus.write_safetensors(src / "model.safetensors", header, data)
    proc = run_bounded("inspect", str(src), memory_mb=600, seconds=30)
    assert_one_error_line(proc, UnexpectedTensorError.exit_code)
    assert proc.seconds < 15, f"took {proc.seconds:.1f} s"
    assert len(proc.stdout.splitlines()) < 200
    assert "44,9" in proc.stdout and "more unexpected tensors" in proc.stdout
    proc = run_bounded("inspect", str(src), "--json", memory_mb=600, seconds=30)
    result = json.loads(proc.stdout)
    assert result["unexpected_not_listed"] > 44_000 and len(result["rows"]) < 200
