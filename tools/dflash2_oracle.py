"""speculators 0.9.0 as the oracle of a DFlash2 drafter: its own code, loaded from a
speculators directory (``dspark export --engine speculators``'s), computes each context's
block and the selector's greedy walk; the reference runtime (runtime/dflash2.py) computes the
same from the artifact; the two are compared (docs/SPECULATORS.md, "DFlash2").

Two sides in one file:

- ``--speculators EXPORT INPUTS OUT``, run by speculators' own interpreter (tools/speculators.py's
  install, ``-I``: nothing of this checkout is imported): ``SpeculatorModel.from_pretrained``
  (its loading report), then per context of INPUTS (``ctx{i}.features`` [P, m*H], the target's
  tapped hidden states at positions 0..P-1, and ``ctx{i}.anchor``, the token at position P)
  ``DFlash2DraftModel._backbone_forward`` with one anchor (speculators' own anchor-block mask,
  eager attention, float32), then ``CandidateSelector.select`` slot by slot, the greedy walk
  (predecessor: the anchor, then the token chosen). Writes every stage to OUT (safetensors)
  and prints one JSON line (the loading report).
- ``compare`` (the default, run by the checkout's venv): the same contexts through the
  reference runtime, speculators run on them, and each stage's largest absolute difference.

Usage (figures in docs/SPECULATORS.md)::

    .venv/bin/python tools/dflash2_oracle.py ARTIFACT_OR_DRAFT EXPORT --target TARGET

The speculators side uses only torch, safetensors and speculators; the compare side imports
dspark_convert where it runs.
"""

from __future__ import annotations

import json
import sys

FLOAT_STAGES = ("block_hidden", "unary_logits", "hidden_projection", "scores")
INT_STAGES = ("candidates", "chosen_index", "tokens")


# --- speculators' side ---------------------------------------------------------------------

def speculators_side(export: str, inputs: str, out: str) -> dict:
    import torch
    from safetensors.torch import load_file, save_file
    from speculators import SpeculatorModel
    from speculators.models.dflash2 import DFlash2DraftModel, DFlash2SpeculatorConfig

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    loaded, info = SpeculatorModel.from_pretrained(export, output_loading_info=True)
    report = {
        "class": type(loaded).__name__,
        "info": {k: sorted(map(str, v)) for k, v in info.items()},
        "sample_from_anchor": loaded.config.sample_from_anchor,
        "aux": loaded.config.aux_hidden_state_layer_ids,
        "verifier": loaded.config.speculators_config.verifier.name_or_path,
        # The config speculators reads, as its own save_pretrained would write it.
        "config": json.loads(loaded.config.to_json_string()),
    }
    config = DFlash2SpeculatorConfig.from_pretrained(export)
    config.transformer_layer_config._attn_implementation = "eager"
    model = DFlash2DraftModel.from_pretrained(export, config=config).float().eval()
    report["attention"] = model._attn_impl
    # With the verifier's embedding and head (load_verifier_weights): nothing left unset.
    report["nan"] = [n for n, p in model.state_dict().items()
                     if p.is_floating_point() and p.isnan().any()]
    x = load_file(inputs)
    count = len({k.split(".")[0] for k in x})
    B = model.block_size
    H = config.transformer_layer_config.hidden_size
    got = {}
    with torch.no_grad():
        for c in range(count):
            feats, anchor = x[f"ctx{c}.features"], int(x[f"ctx{c}.anchor"])
            P = feats.shape[0]
            T = P + B + 1          # select_anchors excludes the last block_size positions
            hidden_states = torch.zeros(1, T, feats.shape[1])
            hidden_states[0, :P] = feats
            ids = torch.zeros(1, T, dtype=torch.long)
            ids[0, P] = anchor
            loss_mask = torch.zeros(1, T)
            loss_mask[0, P] = 1                              # one anchor: position P
            hidden, logits, _targets, _mask, indices = model._backbone_forward(
                hidden_states, ids, loss_mask, torch.zeros(1, T, H),
                torch.zeros(1, T, dtype=torch.long), max_anchors=1)
            assert indices.tolist() == list(range(P, P + B)), indices.tolist()
            hidden, logits = hidden[0], logits[0]
            selector = model.candidate_selector
            candidates, scores, chosen, tokens = [], [], [], []
            previous = anchor
            for slot in range(1, B):
                ids_k, row = selector.select(logits[slot], hidden[slot],
                                             torch.tensor(previous))
                index = int(row.argmax())
                previous = int(ids_k[index])
                candidates.append(ids_k)
                scores.append(row)
                chosen.append(index)
                tokens.append(previous)
            stages = {
                "block_hidden": hidden, "unary_logits": logits,
                "hidden_projection": selector.hidden_projection(hidden[1:]),
                "candidates": torch.stack(candidates), "scores": torch.stack(scores),
                "chosen_index": torch.tensor(chosen), "tokens": torch.tensor(tokens)}
            got.update({f"ctx{c}.{k}": v.detach().contiguous() for k, v in stages.items()})
    save_file(got, out)
    report["contexts"] = count
    return report


# --- the checkout's side ----------------------------------------------------------------------

def context_tokens(reference: dict) -> list[list[int]]:
    """The contexts compared, from golden/reference/dflash2/reference.json: each prompt (the
    first block after the prefill), each run's whole output (a block after 24 new tokens,
    the accepted drafts' features in the context), and two longer than the sliding layer's
    window (64): 80 and 150 tokens of a fixed sequence, where speculators' window is anchored
    at the anchor."""
    out = [list(p) for p in reference["prompts"]]
    out += [list(r["output_ids"]) for r in reference["runs"]]
    out += [[1] + [(7 * i + 3) % 499 for i in range(n - 1)] for n in (80, 150)]
    return out


def our_blocks(drafter: str, target: str, tokens: list[list[int]]):
    """(speculators' inputs, the reference runtime's proposals): per context the target's
    tapped features over the tokens (positions 0..P-1), the anchor (its argmax after them,
    at position P), and the runtime's proposal for the block after it. float32, CPU."""
    import torch
    from dspark_convert.runtime.dflash2 import load_drafter
    from dspark_convert.runtime.qwen3 import KVCache, Qwen3Target

    target_model = Qwen3Target(target, device=torch.device("cpu"))
    model = load_drafter(drafter, target_model)
    inputs, proposals = {}, []
    for c, ids in enumerate(tokens):
        out = target_model.forward(torch.tensor(ids), KVCache())
        features = model.features(out.hidden_states)
        anchor = int(out.logits[-1].argmax())
        model.reset()
        model.add_context(features)
        proposals.append(model.propose(anchor))
        inputs[f"ctx{c}.features"] = features.contiguous()
        inputs[f"ctx{c}.anchor"] = torch.tensor(anchor)
    return inputs, proposals


def our_stages(proposal) -> dict:
    return {"block_hidden": proposal.block_hidden, "unary_logits": proposal.unary_logits,
            "hidden_projection": proposal.hidden_projection, "scores": proposal.scores,
            "candidates": proposal.candidates, "chosen_index": proposal.chosen_index,
            "tokens": proposal.tokens}


def compare(proposals, theirs: dict) -> list[dict]:
    """Per context: each float stage's largest absolute difference and its scale (max
    |speculators'|), and whether each integer stage is equal."""
    rows = []
    for c, proposal in enumerate(proposals):
        ours = our_stages(proposal)
        row = {"context": c}
        for name in FLOAT_STAGES:
            want = theirs[f"ctx{c}.{name}"]
            row[name] = float((ours[name].float() - want).abs().max())
            row[name + "_scale"] = float(want.abs().max())
        for name in INT_STAGES:
            row[name] = ours[name].tolist() == theirs[f"ctx{c}.{name}"].tolist()
        rows.append(row)
    return rows


def run_speculators(python: str, export: str, inputs: dict, work: str,
                    timeout: float = 600) -> tuple[dict, dict]:
    """This file's speculators side, run by ``python`` (speculators' interpreter, isolated,
    one thread, offline): (its JSON report, the stages it wrote)."""
    import os
    import subprocess
    from pathlib import Path

    from safetensors.torch import load_file, save_file

    src, out = Path(work) / "oracle-in.safetensors", Path(work) / "oracle-out.safetensors"
    save_file(inputs, str(src))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}
    proc = subprocess.run([python, "-I", __file__, "--speculators", str(export), str(src),
                           str(out)], capture_output=True, text=True, timeout=timeout,
                          env=env, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise RuntimeError("speculators' side failed (exit %d):\n%s" % (
            proc.returncode, "\n".join(proc.stderr.strip().splitlines()[-25:])))
    return json.loads(proc.stdout.strip().splitlines()[-1]), load_file(str(out))


def main(argv: list[str]) -> int:
    if argv[:1] == ["--speculators"]:
        print(json.dumps(speculators_side(*argv[1:4])))
        return 0
    import argparse
    import tempfile
    from pathlib import Path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("drafter", help="what the reference runtime reads: the artifact, or "
                        "a DFlash2 checkpoint directory")
    parser.add_argument("export", help="the speculators directory speculators loads "
                        "(dspark export --engine speculators)")
    parser.add_argument("--target", required=True, help="the target model directory")
    parser.add_argument("--reference", default=str(Path(__file__).resolve().parent.parent /
                        "golden" / "reference" / "dflash2" / "reference.json"),
                        help="the trace whose prompts and outputs are the contexts")
    parser.add_argument("--python", help="speculators' interpreter (default: "
                        "tools/speculators.py's install)")
    args = parser.parse_args(argv)
    python = args.python
    if python is None:
        import speculators as install      # tools/speculators.py, beside this script
        problem = install.install_problem()
        if problem is not None:
            raise SystemExit(f"speculators is not installed ({problem}): run `make "
                             "speculators`, or name its interpreter with --python")
        python = str(install.python_path())
    tokens = context_tokens(json.loads(Path(args.reference).read_text()))
    inputs, proposals = our_blocks(args.drafter, args.target, tokens)
    with tempfile.TemporaryDirectory() as work:
        report, theirs = run_speculators(python, args.export, inputs, work)
    rows = compare(proposals, theirs)
    report.pop("config")
    print(json.dumps(report))
    print("ctx    P  " + "  ".join(f"{n:>17}" for n in FLOAT_STAGES) + "  integers equal")
    for row, ids in zip(rows, tokens):
        cells = "  ".join(f"{row[n]:8.2e}/{row[n + '_scale']:<8.3g}" for n in FLOAT_STAGES)
        print(f"{row['context']:>3} {len(ids):>4}  {cells}  "
              f"{all(row[n] for n in INT_STAGES)}")
    worst = {n: max(r[n] for r in rows) for n in FLOAT_STAGES}
    print("max abs difference: " + ", ".join(f"{n} {v:.3g}" for n, v in worst.items()))
    return 0 if all(all(r[n] for n in INT_STAGES) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
