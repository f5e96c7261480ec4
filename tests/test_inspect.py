"""`dspark inspect`: the contract and tensor table of a checkpoint or an artifact."""

from __future__ import annotations

import json

from conftest import REFERENCE_DRAFTER
from support.cli import run_cli
from dspark_convert.errors import MissingTensorError, TensorShapeError
from dspark_convert.commands.inspection import inspect_path
from dspark_convert.synthetic import synthetic_config, synthetic_tensors, write_checkpoint


def test_inspect_checkpoint():
    result = inspect_path(REFERENCE_DRAFTER)
    assert result.kind == "checkpoint"
    assert result.problem is None
    statuses = {r.name: r.status for r in result.rows}
    assert statuses["embed_tokens.weight"] == "stripped"
    assert statuses["fc.weight"] == "ok"
    assert len(result.rows) == 31
    fc = next(r for r in result.rows if r.name == "fc.weight")
    assert fc.maps_to == "fc.weight" and fc.shape == [64, 192]


def test_inspect_artifact_dir_and_file(converted):
    for path in (converted["reference"], converted["reference"] / "drafter.gguf"):
        result = inspect_path(path)
        assert result.kind == "artifact"
        assert result.problem is None
        assert len(result.rows) == 29
        assert all(r.status == "ok" for r in result.rows)
    from_checkpoint = inspect_path(REFERENCE_DRAFTER).contract
    from_artifact = inspect_path(converted["reference"]).contract
    # eps comes back as the FLOAT32 the file holds; everything else is identical
    assert from_artifact.model_dump(exclude={"geometry"}) == from_checkpoint.model_dump(exclude={"geometry"})


def test_inspect_shows_every_problem_row(tmp_path):
    cfg = synthetic_config()
    tensors = synthetic_tensors(cfg)
    del tensors["layers.0.mlp.up_proj.weight"]
    tensors["fc.weight"] = tensors["fc.weight"].T.copy()
    tensors["extra.weight"] = tensors["norm.weight"]
    write_checkpoint(tmp_path / "bad", cfg, tensors)
    result = inspect_path(tmp_path / "bad")
    statuses = {r.name: r.status for r in result.rows}
    assert statuses["layers.0.mlp.up_proj.weight"] == "missing"
    assert statuses["fc.weight"] == "shape"
    assert statuses["extra.weight"] == "unexpected"
    assert result.problem["error"] == "MissingTensorError"
    assert result.problem_exit_code == MissingTensorError.exit_code


def test_cli_inspect_writes_nothing_and_exits_with_the_problem(tmp_path):
    cfg = synthetic_config()
    tensors = synthetic_tensors(cfg)
    tensors["fc.weight"] = tensors["fc.weight"][:, :10].copy()
    write_checkpoint(tmp_path / "bad", cfg, tensors)
    before = sorted(p.name for p in (tmp_path / "bad").iterdir())
    run = run_cli("inspect", str(tmp_path / "bad"))
    assert run.returncode == TensorShapeError.exit_code
    assert "fc.weight" in run.stdout
    assert run.stderr.count("\n") == 1 and run.stderr.startswith("error: ")
    assert sorted(p.name for p in (tmp_path / "bad").iterdir()) == before

    run = run_cli("inspect", str(REFERENCE_DRAFTER), "--json")
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    assert data["contract"]["taps"]["target_layer_ids"] == [0, 2, 4]
    assert data["kind"] == "checkpoint"


def test_an_artifact_whose_drafter_gguf_is_no_regular_file_is_refused_as_such(converted, tmp_path):
    """A FIFO there is refused without opening it (that would block), a dangling link by its
    name; neither is taken for a checkpoint without a config.json."""
    import os
    import shutil

    from support.cli import assert_one_error_line
    from dspark_convert.errors import GGUFFormatError

    art = tmp_path / "art"
    shutil.copytree(converted["reference"], art)
    (art / "drafter.gguf").unlink()
    os.mkfifo(art / "drafter.gguf")
    assert_one_error_line(run_cli("inspect", str(art)), GGUFFormatError.exit_code,
                          f"{art}/drafter.gguf: not a regular file")
    (art / "drafter.gguf").unlink()
    (art / "drafter.gguf").symlink_to(tmp_path / "gone")
    assert_one_error_line(run_cli("inspect", str(art)), GGUFFormatError.exit_code,
                          f"{art}/drafter.gguf: cannot read the file")
