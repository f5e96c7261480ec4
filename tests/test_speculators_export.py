"""`dspark export --engine speculators` and speculators as an oracle
against speculators 0.9.0 itself, run in its own environment
(tools/speculators.py; a skip without it, a failure under CI=true).

- The export loads with speculators' own ``from_pretrained``: no missing, unexpected or
  mismatched key; its weights file is byte for byte the one speculators' own save_pretrained
  wrote for the same drafter (golden/speculators/); it is byte-reproducible, atomic, and
  converts back to the artifact's tensors.
- The oracle: speculators' DSpark model (torch, CPU, eager attention, float32) given the
  export and the target features the reference runtime computed for DeepSeek's first prompt
  gives the reference runtime's block logits (base, after the Markov head, confidence) for the
  vanilla, gated and rnn heads and plain DFlash. Tolerance 2e-5 absolute on logits of
  magnitude up to ~20 (both float32 from the same BF16 weights: what differs is only the
  order of float32 sums; measured 1.2e-6 on the base logits). Any real departure (a head's input order, a
  position, the anchor's slot) moves them by 1e-1 or more.
- The fixtures reproduce: golden/make_speculators_fixtures.py --check, with speculators.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch
from safetensors.torch import load_file, save_file

from support import speculators as spec_env
from support.cli import assert_refused, run_cli
from support.paths import GOLDEN, GOLDEN_TARGET as TARGET, ROOT
from support.tools import load_tool
from dspark_convert.commands.convert import convert
from dspark_convert.commands.export_speculators import export_speculators
from dspark_convert.commands.quantize import quantize_artifact
from dspark_convert.errors import FamilyExportError, QuantizedExportError
from dspark_convert.runtime.drafter import DSparkDrafter
from dspark_convert.runtime.qwen3 import KVCache, Qwen3Target
from dspark_convert.runtime.weights import load_drafter_weights

fixtures = load_tool("golden/make_speculators_fixtures.py")
HEADS = ("vanilla_conf_markov", "gated_conf_markov", "rnn_conf_plain", "dflash_shared")
PROMPT_0 = [1, 17, 33, 90, 250, 7, 7, 401]
ATOL = 2e-5

# Slow: each drafter is one run of speculators (~10 s to import it); `make test` runs them.
pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.slow]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """name -> (the twin's artifact, its speculators export); the verifier is the golden
    target by its absolute path, so speculators loads it from any working directory."""
    spec_env.python()
    root = tmp_path_factory.mktemp("speculators-export")
    out = {}
    for name in HEADS:
        twin = fixtures.write_twin(name, root / "twins" / name)
        artifact = convert(twin, root / f"{name}-artifact", target=TARGET).output
        out[name] = (artifact, export_speculators(artifact, os.path.abspath(TARGET),
                                                  root / f"{name}-speculators"))
    return out


@pytest.mark.parametrize("name", HEADS)
def test_the_export_loads_in_speculators_with_no_missing_or_unexpected_key(exported, ran, name):
    artifact, result = exported[name]
    got = ran[name][0]
    assert got["class"] == "DSparkDraftModel"
    assert got["info"] == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": [],
                           "error_msgs": []}
    assert got["sample_from_anchor"] is True and got["nan"] == []
    assert got["verifier"] == os.path.abspath(TARGET)
    config = json.loads((result.output / "config.json").read_text())
    assert config["sample_from_anchor"] is True
    assert config["aux_hidden_state_layer_ids"] == got["aux"]


@pytest.mark.parametrize("name", HEADS)
def test_the_weights_are_speculators_own_bytes(exported, name):
    """The file speculators' save_pretrained wrote for the same drafter (the fixture)."""
    _, result = exported[name]
    ours = (result.output / "model.safetensors").read_bytes()
    assert ours == (GOLDEN / "speculators" / name / "model.safetensors").read_bytes()


def test_byte_reproducible_and_converts_back(exported, tmp_path):
    artifact, first = exported["gated_conf_markov"]
    again = export_speculators(artifact, os.path.abspath(TARGET), tmp_path / "again")
    for f in ("config.json", "model.safetensors"):
        assert (first.output / f).read_bytes() == (again.output / f).read_bytes()
    assert first.files == again.files
    back = convert(first.output, tmp_path / "back", target=TARGET)
    original = json.loads((artifact / "manifest.json").read_text())
    assert [t.model_dump() for t in back.manifest.artifact.tensors] == \
        original["artifact"]["tensors"]
    assert back.manifest.source.speculators.layout_stated_by == "config"


def test_the_cli_writes_it_and_refuses_without_a_target(exported, tmp_path):
    artifact, _ = exported["vanilla_conf_markov"]
    out = tmp_path / "cli"
    proc = run_cli("export", str(artifact), "--engine", "speculators", "--target", str(TARGET),
                   "-o", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["verifier"] == str(TARGET)
    proc = run_cli("export", str(artifact), "--engine", "speculators", "-o", str(tmp_path / "x"))
    assert proc.returncode == 107 and not (tmp_path / "x").exists()


def test_refuses_quantized_and_gemma4_artifacts_writing_nothing(exported, tmp_path):
    artifact, _ = exported["vanilla_conf_markov"]
    q = quantize_artifact(artifact, tmp_path / "q8", "q8_0").output
    out = tmp_path / "out"
    proc = run_cli("export", str(q), "--engine", "speculators", "--target", str(TARGET),
                   "-o", str(out))
    assert_refused(proc, QuantizedExportError, ("quantized", "speculators' format holds BF16"))
    gemma = GOLDEN / "reference" / "gemma4"
    g = convert(gemma / "gemma4_vanilla_conf_markov" / "draft", tmp_path / "g",
                target=gemma / "target").output
    proc = run_cli("export", str(g), "--engine", "speculators", "--target",
                   str(gemma / "target"), "-o", str(out))
    assert_refused(proc, FamilyExportError, ("gemma4", "Qwen3 decoder layers"))
    assert not out.exists() and not [p for p in tmp_path.iterdir() if "tmp" in p.name]


# --- speculators as an oracle ----------------------------------------------------------------

# One run of speculators per drafter: its own from_pretrained (the loading report, then the
# model with the verifier's weights), then the oracle's forward.
SPECULATORS = r"""
import json, sys, torch
from safetensors.torch import load_file, save_file
from speculators import SpeculatorModel
from speculators.losses import resolve_loss_config
from speculators.models.dspark import DSparkDraftModel, DSparkSpeculatorConfig
torch.set_num_threads(1)
export, inputs, out = sys.argv[1:4]
loaded, info = SpeculatorModel.from_pretrained(export, output_loading_info=True)
full = SpeculatorModel.from_pretrained(export)        # with the verifier's weights
report = {
    "class": type(loaded).__name__, "info": {k: sorted(map(str, v)) for k, v in info.items()},
    "sample_from_anchor": loaded.config.sample_from_anchor,
    "aux": loaded.config.aux_hidden_state_layer_ids,
    "verifier": loaded.config.speculators_config.verifier.name_or_path,
    "nan": [n for n, p in full.state_dict().items() if p.is_floating_point() and p.isnan().any()],
}
config = DSparkSpeculatorConfig.from_pretrained(export)
config.transformer_layer_config._attn_implementation = "eager"
model = DSparkDraftModel.from_pretrained(export, config=config).float().eval()
x = load_file(inputs)
feats, anchor, drafts = x["features"], int(x["anchor"]), x["tokens"]
P, B, H = feats.shape[0], model.block_size, config.transformer_layer_config.hidden_size
T = P + B + 1          # the anchor must lie block_size before the end (select_anchors)
hidden = torch.zeros(1, T, feats.shape[1]); hidden[0, :P] = feats
ids = torch.zeros(1, T, dtype=torch.long); ids[0, P] = anchor
ids[0, P + 1:P + B] = drafts[:B - 1]           # the block's previous tokens: the drafts
loss_mask = torch.zeros(1, T); loss_mask[0, P] = 1   # one anchor: position P
got = {}
model.lm_head.register_forward_hook(lambda m, i, o: got.__setitem__("base", o[0].detach().clone()))
if model.confidence_head is not None:
    model.confidence_head.register_forward_hook(
        lambda m, i, o: got.__setitem__("confidence", o[0].detach().clone()))
if model.markov_head is not None:
    block_bias = model.markov_head.block_bias
    def record(**kw):
        bias = block_bias(**kw)
        got["bias"], got["prev"] = bias[0].detach().clone(), kw["prev_token_ids"][0].clone()
        return bias
    model.markov_head.block_bias = record
with torch.no_grad():
    model(hidden_states=hidden, input_ids=ids, loss_mask=loss_mask,
          verifier_last_hidden_states=torch.zeros(1, T, H),
          document_ids=torch.zeros(1, T, dtype=torch.long), max_anchors=1,
          loss_config=resolve_loss_config("kl_div", "eager"),
          tv_loss_fn=resolve_loss_config("tv", "eager")["tv"][0])
got["corrected"] = got["base"] + got["bias"] if "bias" in got else got["base"].clone()
save_file({k: v.contiguous() for k, v in got.items()}, out)
print(json.dumps({**report, "attention": model._attn_impl, "stages": sorted(got)}))
"""


def _reference_first_block(artifact):
    """The reference runtime's first proposal on DeepSeek's prompt 0: the context features,
    the anchor, the proposal."""
    cpu = torch.device("cpu")
    target = Qwen3Target(TARGET, device=cpu)
    drafter = DSparkDrafter(load_drafter_weights(artifact), embed=target.embed,
                            lm_head=target.lm_head, device=cpu)
    out = target.forward(torch.tensor(PROMPT_0), KVCache())
    features = drafter.features(out.hidden_states)
    anchor = int(out.logits[-1].argmax())
    drafter.add_context(features)
    return features, anchor, drafter.propose(anchor)


@pytest.fixture(scope="module")
def ran(exported, tmp_path_factory):
    """name -> (speculators' report, the stages it computed, the reference runtime's
    first block: anchor and proposal)."""
    root = tmp_path_factory.mktemp("speculators-runs")
    out = {}
    for name, (artifact, result) in exported.items():
        features, anchor, proposal = _reference_first_block(artifact)
        inputs, outputs = root / f"{name}-in.safetensors", root / f"{name}-out.safetensors"
        save_file({"features": features.contiguous(), "anchor": torch.tensor(anchor),
                   "tokens": proposal.tokens}, str(inputs))
        report = spec_env.run(SPECULATORS, str(result.output), str(inputs), str(outputs))
        out[name] = (report, load_file(outputs), anchor, proposal)
    return out


@pytest.mark.parametrize("name", HEADS)
def test_speculators_computes_the_reference_runtimes_block_logits(ran, name):
    report, theirs, anchor, proposal = ran[name]
    assert report["attention"] == "eager"
    stages = {"base": proposal.base_logits, "corrected": proposal.corrected_logits}
    if proposal.confidence_logits is not None:
        stages["confidence"] = proposal.confidence_logits
    assert set(stages) | ({"bias", "prev"} if "bias" in theirs else set()) == set(theirs)
    for stage, ours in stages.items():
        err = (theirs[stage] - ours).abs().max().item()
        assert err <= ATOL, f"{name} {stage}: max abs error {err:.3g} > {ATOL:g}"
    if "prev" in theirs:      # sample_from_anchor: slot k's Markov input is the token before it
        assert theirs["prev"].tolist() == [anchor] + proposal.tokens[:-1].tolist()
    # The same greedy drafts: speculators' corrected logits pick the runtime's tokens.
    assert theirs["corrected"].argmax(-1).tolist() == proposal.tokens.tolist()


def test_the_fixtures_are_what_speculators_writes():
    proc = subprocess.run([str(spec_env.python()), "-I", "golden/make_speculators_fixtures.py",
                           "--check"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "reproduced byte for byte" in proc.stdout
