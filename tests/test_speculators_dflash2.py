"""`dspark export --engine speculators` of a DFlash2 drafter
(commands/export_speculators_dflash2.py), and speculators 0.9.0 as the oracle of the
reference runtime's DFlash2 drafter (tools/dflash2_oracle.py; docs/SPECULATORS.md, "DFlash2").

- Round trip: golden/reference/dflash2/draft (speculators' own save_pretrained output)
  converted against its target, then exported, is that directory again: model.safetensors
  byte for byte, config.json field by field but for three fields, each for its reason
  (``auto_map``, ``transformers_version``, the verifier's ``name_or_path``); the checkpoint
  exported directly gives the same bytes; the export converts back to the artifact's
  tensors and contract; an F32 copy of the drafter exports to the same BF16 bytes; refusals
  write nothing.
- With speculators (its own environment; a skip without it, a failure under CI=true, slow):
  ``from_pretrained`` loads the export with no missing, unexpected or mismatched key, and
  the config speculators reads is ours field by field (its save_pretrained adds only
  ``transformers_version``); speculators' ``_backbone_forward`` with one anchor and its
  ``CandidateSelector.select`` walk, on 8 contexts (the 3 prompts, the 3 runs' whole outputs,
  80 and 150 tokens: the last two longer than the sliding layer's window of 64), give the
  reference runtime's (loaded from the artifact) block hidden, unary logits, selector
  projection and scores within ATOL, and the same candidates, chosen indices and drafts.
  Measured (float32, one thread): at most 8.3e-7 on the block hidden (scale up to 2.5),
  3.8e-6 on the unary logits (up to 19), 3.6e-7 on the projection, 3.8e-6 on the scores (up
  to 17): the order of float32 sums. ATOL 2e-5 is 5x that; the runtime with the sliding
  layer made full (its window ignored) moves the two long contexts' logits by 0.77 and 0.97
  and leaves the short ones within ATOL.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from support import speculators as spec_env
from support.cli import assert_refused, run_cli
from support.edited import edited_copy
from support.paths import GOLDEN, GOLDEN_TARGET
from support.tools import load_tool
from dspark_convert.commands.convert import convert
from dspark_convert.commands.export_speculators import export_speculators
from dspark_convert.commands.export_speculators_dflash2 import check_target, write_config
from dspark_convert.contract.dflash2 import read_config
from dspark_convert.errors import (DFlash2TargetError, ExportArtifactError, ExportOptionError,
                                   OutputExistsError)
from dspark_convert.target.model import open_target

oracle = load_tool("tools/dflash2_oracle.py")
FIXTURE = GOLDEN / "reference" / "dflash2"
DRAFT = FIXTURE / "draft"
TARGET = os.path.abspath(GOLDEN_TARGET)      # the verifier speculators loads, from anywhere
REFERENCE = json.loads((FIXTURE / "reference.json").read_text())
ATOL = 2e-5
WINDOW = 64                                  # the fixture's sliding layer's
# The fields an export writes otherwise than speculators' save_pretrained did, and why:
# auto_map names the config.py copy of speculators' source save_pretrained writes (code, not
# the drafter; left out, as the DSpark export leaves it); transformers_version names the
# library that saved the file; the verifier is the target given to export.
DIFFERS = {"auto_map", "transformers_version", "speculators_config.verifier.name_or_path"}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _flat(config: dict, prefix: str = "") -> dict:
    """Every leaf by its dotted path (auto_map's one key is the empty string)."""
    out = {}
    for key, value in config.items():
        name = f"{prefix}.{key}" if prefix and key else prefix or key
        if isinstance(value, dict) and value:
            out.update(_flat(value, name))
        else:
            out[name] = value
    return out


def _differing(a: dict, b: dict) -> set[str]:
    fa, fb = _flat(a), _flat(b)
    return {k for k in set(fa) | set(fb) if fa.get(k, KeyError) != fb.get(k, KeyError)}


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    """golden/reference/dflash2/draft converted against its target."""
    return convert(DRAFT, tmp_path_factory.mktemp("dflash2") / "artifact", target=TARGET).output


@pytest.fixture(scope="module")
def exported(artifact):
    return export_speculators(artifact, TARGET, artifact.parent / "export")


# --- the export --------------------------------------------------------------------------------

def test_the_export_is_speculators_own_directory_again(exported):
    out = exported.output
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
    assert (out / "model.safetensors").read_bytes() == (DRAFT / "model.safetensors").read_bytes()
    ours = json.loads((out / "config.json").read_text())
    source = json.loads((DRAFT / "config.json").read_text())
    assert _differing(ours, source) == DIFFERS
    assert ours["speculators_config"]["verifier"] == {"architectures": ["Qwen3ForCausalLM"],
                                                      "name_or_path": TARGET}
    assert ours["sample_from_anchor"] is False
    assert ours["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 7
    # Written as transformers writes a config: sorted keys, two-space indent, a newline.
    assert (out / "config.json").read_text() == json.dumps(ours, indent=2, sort_keys=True) + "\n"
    assert exported.tensors == 36 and exported.verifier == TARGET
    names = [c.name for c in exported.checks]
    assert names[-2:] == ["export.tensors", "export.config"]
    assert {"target.hidden_size", "target.layers", "target.identity.embedding"} <= set(names)
    assert all(c.status == "passed" for c in exported.checks)
    # The export reads back as the drafter it came from.
    assert read_config(out).model_dump(exclude={"speculators_config"}) == \
        read_config(DRAFT).model_dump(exclude={"speculators_config", "auto_map",
                                               "transformers_version"})


def test_byte_reproducible_from_the_artifact_or_the_checkpoint(artifact, exported, tmp_path):
    """The same bytes again, and from the checkpoint the artifact was converted from."""
    again = export_speculators(artifact, TARGET, tmp_path / "again")
    direct = export_speculators(DRAFT, TARGET, tmp_path / "direct")
    for name in ("config.json", "model.safetensors"):
        assert (again.output / name).read_bytes() == (exported.output / name).read_bytes()
        assert (direct.output / name).read_bytes() == (exported.output / name).read_bytes()
    assert again.files == exported.files == direct.files
    assert exported.artifact_sha256 == \
        json.loads((artifact / "manifest.json").read_text())["artifact"]["sha256"]
    assert direct.checks[0].name == "target.dflash2"


def test_converts_back_to_the_artifacts_tensors(artifact, exported, tmp_path):
    back = convert(exported.output, tmp_path / "back", target=TARGET).output
    original = json.loads((artifact / "manifest.json").read_text())
    again = json.loads((back / "manifest.json").read_text())
    assert again["artifact"]["tensors"] == original["artifact"]["tensors"]
    assert again["contract"] == original["contract"]


def test_a_zlab_checkpoint_exports_in_speculators_layout(exported, tmp_path):
    """The same drafter in z-lab's layout (a flat Qwen3 config with ``dflash_config``,
    target_layer_ids = aux ids - 1), converted then exported: speculators' directory, the
    same two files."""
    src = tmp_path / "zlab"
    src.mkdir()
    shutil.copy(DRAFT / "model.safetensors", src)
    config = json.loads((DRAFT / "config.json").read_text())
    zlab = {**config["transformer_layer_config"], "architectures": ["DFlash2DraftModel"],
            "dtype": "bfloat16", "dflash_config": {
                **{k: config[k] for k in ("block_size", "conv_group_size", "conv_kernel_size",
                                          "selector_rank", "selector_top_k", "mask_token_id")},
                "target_layer_ids": [i - 1 for i in config["aux_hidden_state_layer_ids"]]}}
    (src / "config.json").write_text(json.dumps(zlab, indent=2))
    art = convert(src, tmp_path / "art", target=TARGET).output
    result = export_speculators(art, TARGET, tmp_path / "out")
    for name in ("config.json", "model.safetensors"):
        assert (result.output / name).read_bytes() == (exported.output / name).read_bytes()


def test_an_f32_drafter_exports_to_the_same_bf16_bytes(exported, tmp_path):
    """F32 weights are rounded to BF16 as torch rounds them: BF16 values widened to F32
    come back to exactly their bytes."""
    src = edited_copy(DRAFT, tmp_path / "f32", lambda c: c.update(dtype="float32"))
    weights = load_file(DRAFT / "model.safetensors")
    save_file({k: v.float() for k, v in weights.items()}, str(src / "model.safetensors"),
              metadata={"format": "pt"})
    result = export_speculators(src, TARGET, tmp_path / "out")
    assert (result.output / "model.safetensors").read_bytes() == \
        (exported.output / "model.safetensors").read_bytes()
    assert json.loads((result.output / "config.json").read_text())["dtype"] == "bfloat16"
    assert "rounded to BF16" in result.checks[1].detail


def test_the_cli_writes_it_and_refuses_without_a_target(artifact, tmp_path):
    out = tmp_path / "cli"
    proc = run_cli("export", str(artifact), "--engine", "speculators", "--target", TARGET,
                   "-o", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["verifier"] == TARGET and report["tensors"] == 36
    assert report["drafter"].startswith("DFlash2DraftModel")
    proc = run_cli("export", str(artifact), "--engine", "speculators", "-o",
                   str(tmp_path / "x"))
    assert_refused(proc, ExportOptionError, ("--target",))
    proc = run_cli("export", str(artifact), "--engine", "speculators", "--target", TARGET,
                   "-o", str(out))
    assert_refused(proc, OutputExistsError)
    assert not (tmp_path / "x").exists()


def test_a_target_that_is_not_the_drafters_is_refused_writing_nothing(tmp_path):
    """154: another model type, a hidden state the target has not (the tiny target has 6
    layers: hidden_states 0..6), another hidden size or vocabulary."""
    gemma = GOLDEN / "reference" / "gemma4" / "target"
    proc = run_cli("export", str(DRAFT), "--engine", "speculators", "--target", str(gemma),
                   "-o", str(tmp_path / "out"))
    assert_refused(proc, DFlash2TargetError, ("model_type", "'qwen3'"))
    taps = edited_copy(DRAFT, tmp_path / "taps",
                       lambda c: c.update(aux_hidden_state_layer_ids=[1, 3, 7]))
    proc = run_cli("export", str(taps), "--engine", "speculators", "--target", TARGET,
                   "-o", str(tmp_path / "out"))
    assert_refused(proc, DFlash2TargetError, ("aux_hidden_state_layer_ids[2]", "[0, 6]"))
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if "tmp" in p.name]
    cfg, target = read_config(DRAFT), open_target(TARGET)
    for field, value in (("hidden_size", 128), ("vocab_size", 1024)):
        wrong = cfg.model_copy(update={"transformer_layer_config": cfg.layer.model_copy(
            update={field: value})})
        with pytest.raises(DFlash2TargetError, match=f"transformer_layer_config.{field}"):
            check_target(wrong, target, path="config.json")


def test_an_artifact_is_validated_with_the_target_first(artifact, tmp_path):
    """154 for a target it does not pair with; 100 for an artifact that does not validate
    (here: manifest.json's source.config, which the export writes, edited)."""
    gemma = GOLDEN / "reference" / "gemma4" / "target"
    proc = run_cli("export", str(artifact), "--engine", "speculators", "--target", str(gemma),
                   "-o", str(tmp_path / "out"))
    assert_refused(proc, DFlash2TargetError, ("gemma4_unified", "qwen3"))
    edited = tmp_path / "edited"
    shutil.copytree(artifact, edited)
    manifest = json.loads((edited / "manifest.json").read_text())
    manifest["source"]["config"]["selector_top_k"] = 5
    (edited / "manifest.json").write_text(json.dumps(manifest, indent=2))
    proc = run_cli("export", str(edited), "--engine", "speculators", "--target", TARGET,
                   "-o", str(tmp_path / "out"))
    assert_refused(proc, ExportArtifactError, ("source.config", "top_k"))
    assert not (tmp_path / "out").exists()


def test_speculative_tokens_follow_the_layout():
    """speculators' rule: B - 1 drafts when slot 0 is the anchor (DFlash2's layout)."""
    cfg = read_config(DRAFT)
    written = write_config(cfg, verifier_name="t", verifier_architectures=["A"])
    assert written["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == \
        cfg.block_size - 1
    assert written["transformer_layer_config"] == \
        json.loads((DRAFT / "config.json").read_text())["transformer_layer_config"]


# --- speculators as the oracle ------------------------------------------------------------------

@pytest.fixture(scope="module")
def ran(artifact, exported, tmp_path_factory):
    """speculators' report and stages for every context (from the export), the runtime's
    proposals (from the artifact)."""
    python = spec_env.python()
    tokens = oracle.context_tokens(REFERENCE)
    inputs, proposals = oracle.our_blocks(artifact, TARGET, tokens)
    report, theirs = oracle.run_speculators(str(python), str(exported.output), inputs,
                                            str(tmp_path_factory.mktemp("oracle")))
    return report, theirs, inputs, proposals, tokens


@pytest.mark.slow
def test_speculators_loads_the_export(exported, ran):
    report = ran[0]
    assert report["class"] == "DFlash2DraftModel" and report["attention"] == "eager"
    assert report["info"] == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": [],
                              "error_msgs": []}
    assert report["nan"] == [] and report["sample_from_anchor"] is False
    assert report["verifier"] == TARGET and report["aux"] == [1, 3, 5]
    ours = json.loads((exported.output / "config.json").read_text())
    assert _differing(report["config"], ours) == {"transformers_version"}


@pytest.mark.slow
def test_speculators_computes_the_runtimes_blocks(ran):
    _, theirs, _, proposals, tokens = ran
    assert len(proposals) == 8 and max(map(len, tokens)) > 2 * WINDOW
    rows = oracle.compare(proposals, theirs)
    for row, ids in zip(rows, tokens):
        for name in oracle.FLOAT_STAGES:
            assert row[name] <= ATOL, f"context of {len(ids)} tokens, {name}: {row[name]:.3g}"
        for name in oracle.INT_STAGES:
            assert row[name], f"context of {len(ids)} tokens: {name} differ"
    # The first context is the fixture's first block: speculators' own recorded drafts.
    assert theirs["ctx0.tokens"].tolist() == REFERENCE["runs"][0]["cycles"][0]["proposed"]


@pytest.mark.slow
def test_the_long_contexts_see_the_sliding_window(artifact, ran):
    """The runtime with its sliding layer made full attends to the whole context: the same
    blocks where the context fits the window, far past ATOL where it does not."""
    _, theirs, inputs, _, tokens = ran
    from dspark_convert.runtime.dflash2 import load_drafter
    from dspark_convert.runtime.qwen3 import Qwen3Target

    target = Qwen3Target(TARGET, device=torch.device("cpu"))
    drafter = load_drafter(artifact, target)
    cfg = drafter.config
    drafter.config = cfg.model_copy(update={"transformer_layer_config": cfg.layer.model_copy(
        update={"layer_types": ["full_attention"] * cfg.layer.num_hidden_layers})})
    for c, ids in enumerate(tokens):
        drafter.reset()
        drafter.add_context(inputs[f"ctx{c}.features"])
        proposal = drafter.propose(int(inputs[f"ctx{c}.anchor"]))
        err = float((proposal.unary_logits - theirs[f"ctx{c}.unary_logits"]).abs().max())
        assert (err > 100 * ATOL) if len(ids) > WINDOW else (err <= ATOL), (len(ids), err)

