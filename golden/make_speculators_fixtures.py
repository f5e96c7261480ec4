"""Speculators-format drafters made by speculators' own save_pretrained, and the
DeepSpec twin each is made from.

    SPEC=$(.venv/bin/python tools/speculators.py path)    # speculators 0.9.0's interpreter
    $SPEC golden/make_speculators_fixtures.py             # rewrite golden/speculators/
    $SPEC golden/make_speculators_fixtures.py --check     # remake in a temp dir and compare

Run from the repository root with speculators' own environment (tools/speculators.py,
`make speculators`): each fixture is a real speculators 0.9.0 model (``DSparkDraftModel`` or
``DFlashDraftModel``, transformers 5.19.0) built from its config, given its DeepSpec twin's
weights with ``load_state_dict`` (strict but for the verifier's two tensors, which speculators
never saves) and written by ``save_pretrained`` in BF16. Kept: config.json and
model.safetensors as saved; save_pretrained's ``config.py`` (a copy of speculators' config
module, written for ``auto_map``) is not kept. The verifier is the golden target, by the path
``golden/reference/target`` (relative: a loader run from the repository root finds it).

The twins (``twin``: config.json + tensors of a DeepSpec ``Qwen3DSparkModel`` checkpoint):
DeepSeek's two drafters as they are, and for the heads DeepSeek's fixtures lack, DeepSeek's
vanilla drafter with that head put in its place (values from torch's generator with a fixed
seed, rounded to BF16: untrained, for the conversion and the oracle, not for acceptance). The
tests import this file (torch and safetensors only at import) to rebuild the same twins.

Fixtures (golden/speculators/<name>/): see FIXTURES; golden/README.md has their provenance.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

HERE = Path(__file__).resolve().parent
REFERENCE = HERE / "reference"
OUT = HERE / "speculators"
VERIFIER = "golden/reference/target"        # relative to the repository root
VERIFIER_ARCHITECTURES = ["Qwen3ForCausalLM"]
# DeepSpec's fields that are not the drafter's Qwen3 layer config.
DSPARK_FIELDS = ("architectures", "target_layer_ids", "num_target_layers", "block_size",
                 "mask_token_id", "markov_rank", "markov_head_type", "enable_confidence_head",
                 "confidence_head_with_markov", "num_anchors", "dtype", "transformers_version")

# name -> (twin, how speculators saves it). twin: (DeepSeek's drafter, head put in its place
# or None, seed); model: dspark or dflash; drop_layout: config.json saved without
# sample_from_anchor; reduced: a draft vocabulary of the even token ids.
FIXTURES: dict[str, dict] = {
    "vanilla_conf_markov": dict(base="vanilla_conf_markov", head=None, model="dspark"),
    "gated_conf_markov": dict(base="vanilla_conf_markov", head=("gated", True), seed=11,
                              model="dspark"),
    "rnn_conf_plain": dict(base="vanilla_conf_markov", head=("rnn", False), seed=12,
                           model="dspark"),
    "dflash_shared": dict(base="dflash_shared", head=None, model="dflash"),
    "no_layout": dict(base="vanilla_conf_markov", head=None, model="dspark", drop_layout=True),
    "reduced_vocab": dict(base="vanilla_conf_markov", head=None, model="dspark", reduced=True),
}


def _bf16(gen: torch.Generator, *shape: int, std: float = 0.05) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * std).to(torch.bfloat16)


def twin(name: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """The DeepSpec twin of a fixture: its config.json (parsed) and its tensors."""
    spec = FIXTURES[name]
    draft = REFERENCE / spec["base"] / "draft"
    config = json.loads((draft / "config.json").read_text())
    tensors = load_file(draft / "model.safetensors")
    if spec["head"] is None:
        return config, tensors
    kind, with_markov = spec["head"]
    gen = torch.Generator().manual_seed(spec["seed"])
    H, r = config["hidden_size"], config["markov_rank"]
    config = {**config, "markov_head_type": kind, "confidence_head_with_markov": with_markov}
    if kind == "gated":
        tensors["markov_head.gate_proj.weight"] = _bf16(gen, r, H + r, std=0.2)
        tensors["markov_head.gate_proj.bias"] = _bf16(gen, r, std=0.2)
    else:
        tensors["markov_head.joint_proj.weight"] = _bf16(gen, 3 * r, 2 * r + H, std=0.2)
        tensors["markov_head.joint_proj.bias"] = _bf16(gen, 3 * r, std=0.2)
        # The rnn head's output is tanh-bounded: a larger W2 makes its bias matter.
        tensors["markov_head.markov_w2.weight"] = _bf16(gen, config["vocab_size"], r, std=0.5)
    if not with_markov:
        tensors["confidence_head.proj.weight"] = _bf16(gen, 1, H, std=0.2)
    return config, tensors


def write_twin(name: str, dest: Path) -> Path:
    """The twin as DeepSpec's trainer saves a checkpoint: config.json + model.safetensors."""
    config, tensors = twin(name)
    dest.mkdir(parents=True)
    (dest / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_file(tensors, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest


# --- what speculators does (its own environment only) --------------------------------------

def _speculators_model(name: str):
    from speculators import SpeculatorsConfig, VerifierConfig
    from speculators.models.dflash import DFlashDraftModel, DFlashSpeculatorConfig
    from speculators.models.dspark import DSparkDraftModel, DSparkSpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import Qwen3Config

    spec = FIXTURES[name]
    config, tensors = twin(name)
    layer = Qwen3Config(**{k: v for k, v in config.items() if k not in DSPARK_FIELDS})
    block = config["block_size"]
    reduced = spec.get("reduced", False)
    vocab = config["vocab_size"]
    common = dict(
        transformer_layer_config=layer, draft_vocab_size=vocab // 2 if reduced else vocab,
        block_size=block, mask_token_id=config["mask_token_id"],
        aux_hidden_state_layer_ids=[i + 1 for i in config["target_layer_ids"]],
        sample_from_anchor=True,
        speculators_config=SpeculatorsConfig(
            algorithm=spec["model"], default_proposal_method="greedy",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=block)],
            verifier=VerifierConfig(name_or_path=VERIFIER, architectures=VERIFIER_ARCHITECTURES)))
    if spec["model"] == "dflash":
        model = DFlashDraftModel(DFlashSpeculatorConfig(**common))
    else:
        rank = config["markov_rank"]
        model = DSparkDraftModel(DSparkSpeculatorConfig(
            **common, markov_rank=rank, markov_head_type=config.get("markov_head_type", "vanilla"),
            enable_confidence_head=config["enable_confidence_head"],
            confidence_head_with_markov=bool(config.get("confidence_head_with_markov"))))
    if reduced:
        # The draft vocabulary: the even target ids (t2d), d2t[i] = 2i - i; its head and
        # Markov W2 are the target's rows of those ids.
        keep = torch.arange(vocab) % 2 == 0
        model.load_vocab_mappings(keep, torch.arange(vocab // 2, dtype=torch.long))
        tensors = dict(tensors)
        tensors["lm_head.weight"] = tensors["lm_head.weight"][keep]
        tensors["markov_head.markov_w2.weight"] = tensors["markov_head.markov_w2.weight"][keep]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    allowed = {"verifier_lm_head.weight", "verifier_norm.weight", "t2d", "d2t"}
    if set(missing) - allowed or unexpected:
        raise SystemExit(f"{name}: speculators' model and the twin differ: missing {missing}, "
                         f"unexpected {unexpected}")
    return model.to(torch.bfloat16)


def make(name: str, dest: Path) -> None:
    model = _speculators_model(name)
    model.save_pretrained(str(dest))
    (dest / "config.py").unlink()           # speculators' own code, for auto_map: not kept
    if FIXTURES[name].get("drop_layout"):
        path = dest / "config.json"
        config = json.loads(path.read_text())
        del config["sample_from_anchor"]
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (dest / "model.safetensors").chmod(0o644)


def build(root: Path) -> None:
    for name in FIXTURES:
        make(name, root / name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="remake into a temporary directory and compare with golden/speculators/")
    args = parser.parse_args(argv)
    if not args.check:
        if OUT.exists():
            shutil.rmtree(OUT)
        build(OUT)
        print(f"wrote {len(FIXTURES)} fixtures to {OUT}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        build(Path(tmp))
        bad = [f"{name}/{f}" for name in FIXTURES for f in ("config.json", "model.safetensors")
               if not filecmp.cmp(Path(tmp) / name / f, OUT / name / f, shallow=False)]
    if bad:
        print("differ: " + ", ".join(bad), file=sys.stderr)
        return 1
    print(f"{len(FIXTURES)} fixtures reproduced byte for byte")
    return 0


if __name__ == "__main__":
    sys.exit(main())
