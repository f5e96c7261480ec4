"""Parity and speed of the reference runtime on a GPU, in one short run.

    .venv/bin/python bench/cuda_check.py [--device cuda] [--out cuda_check.json]

1. converts the golden DSpark drafter (golden/reference/vanilla_conf_markov/draft);
2. parity on the device: every stage of the first proposal against
   first_block.safetensors (max abs errors), and `run_smoke` against DeepSpec's
   reference.json at temperature 0 (threshold 0 and 0.5) and temperature 1 (seed 7);
3. speed: drafted and committed tokens per second over 256 new tokens per prompt, on the
   device and on the CPU, and the target alone;
4. the Gemma4 family: DeepSeek's Gemma4 DSpark drafter (golden/reference/gemma4/) against
   its reference.json on the device, float32 (enforced) and bfloat16 (lossless).
5. the other drafter kinds, converted: speculators' DFlash2 drafter (golden/reference/
   dflash2/) and transformers' Gemma 4 assistant (golden/reference/gemma4_assistant/, its
   runs with the KV trimmed after each rejection) on the device in their own loops: float32
   outputs equal to their reference code's, bfloat16 lossless.

Prints one JSON document and writes it to --out. Exit 0 only when every parity check passed.
`--device cpu` runs the same script without a GPU (to check the script itself). The golden
target is tiny (64 hidden, 6 layers): its GPU speed measures launch overhead, not the
arithmetic of a real 4B target; the numbers are for comparing runs of this script.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GOLDEN = ROOT / "golden" / "reference"
DRAFT = GOLDEN / "vanilla_conf_markov" / "draft"
TARGET = GOLDEN / "target"
REFERENCE = GOLDEN / "vanilla_conf_markov" / "reference.json"
GEMMA4 = GOLDEN / "gemma4"
FIRST_BLOCK = GOLDEN / "vanilla_conf_markov" / "first_block.safetensors"


def first_block(artifact: Path, device) -> dict:
    import torch
    from safetensors.torch import load_file

    from dspark_convert.runtime.drafter import DSparkDrafter
    from dspark_convert.runtime.qwen3 import KVCache, Qwen3Target
    from dspark_convert.runtime.weights import load_drafter_weights

    target = Qwen3Target(TARGET, device=device)
    drafter = DSparkDrafter(load_drafter_weights(artifact, device=device), embed=target.embed,
                            lm_head=target.lm_head, device=device)
    ref = load_file(FIRST_BLOCK)
    out = target.forward(torch.tensor([1, 17, 33, 90, 250, 7, 7, 401], device=device), KVCache())
    features = drafter.features(out.hidden_states)
    drafter.add_context(features)
    proposal = drafter.propose(int(out.logits[-1].argmax()))
    errors = {"context_features": features}
    errors.update({k: getattr(proposal, k) for k in
                   ("block_hidden", "base_logits", "corrected_logits", "confidence_logits")})
    result = {k: float((v.cpu() - ref[k]).abs().max()) for k, v in errors.items()}
    result["draft_tokens_equal"] = proposal.tokens.cpu().tolist() == ref["draft_tokens"].tolist()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--out", default="cuda_check.json")
    args = parser.parse_args()

    import torch

    from dspark_convert.commands.convert import convert
    from dspark_convert.errors import DSparkError
    from dspark_convert.commands.smoke import resolve_device, run_smoke

    device = resolve_device(args.device)
    report: dict = {"device": str(device), "torch": torch.__version__,
                    "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None}
    with tempfile.TemporaryDirectory() as tmp:
        artifact = Path(tmp) / "reference"
        convert(DRAFT, artifact)
        report["first_block_max_abs_error"] = fb = first_block(artifact, device)
        parity = {}
        for temperature, threshold, seed in ((0.0, 0.0, 0), (0.0, 0.5, 0), (1.0, 0.0, 7)):
            key = f"T{temperature:g}_thr{threshold:g}_seed{seed}"
            try:
                r = run_smoke(artifact, target=TARGET, max_new_tokens=24, temperature=temperature,
                              confidence_threshold=threshold, seed=seed, device=args.device,
                              reference=REFERENCE)
                parity[key] = {"passed": True, "tau": r.tau}
            except DSparkError as exc:
                parity[key] = {"passed": False, "error": exc.message}
        report["reference_traces"] = parity
        prompts = json.loads(REFERENCE.read_text())["prompts"]
        speed = {}
        for dev in dict.fromkeys([args.device, "cpu"]):
            start = time.perf_counter()
            r = run_smoke(artifact, target=TARGET, prompts=prompts, max_new_tokens=256, device=dev)
            speed[dev] = {"tau": r.tau, "drafted_tokens_per_second": r.drafted_tokens_per_second,
                          "committed_tokens_per_second": r.committed_tokens_per_second,
                          "target_only_tokens_per_second": r.target_only_tokens_per_second,
                          "lossless": r.lossless, "wall_seconds": time.perf_counter() - start}
        report["speed_256_new_tokens"] = speed
        gemma4 = Path(tmp) / "gemma4"
        convert(GEMMA4 / "gemma4_vanilla_conf_markov" / "draft", gemma4, target=GEMMA4 / "target")
        for dtype, temperature, threshold, seed in (("float32", 0.0, 0.0, 0),
                                                    ("float32", 0.0, 0.5, 0),
                                                    ("float32", 1.0, 0.0, 7),
                                                    ("bfloat16", 0.0, 0.0, 0)):
            key = f"gemma4_{dtype}_T{temperature:g}_thr{threshold:g}_seed{seed}"
            try:
                r = run_smoke(gemma4, target=GEMMA4 / "target", max_new_tokens=24, dtype=dtype,
                              temperature=temperature, confidence_threshold=threshold, seed=seed,
                              device=args.device,
                              reference=GEMMA4 / "gemma4_vanilla_conf_markov" / "reference.json")
                parity[key] = {"passed": True, "tau": r.tau, "lossless": r.lossless}
            except DSparkError as exc:
                parity[key] = {"passed": False, "error": exc.message}
        kinds = (("dflash2", GOLDEN / "dflash2", "draft", TARGET, "runs"),
                 ("assistant", GOLDEN / "gemma4_assistant", "assistant", GEMMA4 / "target",
                  "runs_clean_kv"))
        for name, fixture, source, target, runs_key in kinds:
            converted = Path(tmp) / name
            convert(fixture / source, converted, target=target)
            runs = json.loads((fixture / "reference.json").read_text())[runs_key]
            for dtype in ("float32", "bfloat16"):
                key, equal, lossless = f"{name}_{dtype}_T0", [], []
                try:
                    for run in runs:
                        new = len(run["output_ids"]) - len(run["prompt"])
                        r = run_smoke(converted, target=target, prompts=[run["prompt"]],
                                      max_new_tokens=new, dtype=dtype, device=args.device)
                        equal.append(list(r.runs[0].output_ids) == run["output_ids"])
                        lossless.append(bool(r.lossless))
                    passed = all(lossless) and (dtype != "float32" or all(equal))
                    parity[key] = {"passed": passed, "reference_outputs_equal": equal,
                                   "lossless": lossless}
                except DSparkError as exc:
                    parity[key] = {"passed": False, "error": exc.message}
    ok = (fb["draft_tokens_equal"] and fb["block_hidden"] < 3e-4 and fb["corrected_logits"] < 1.5e-3
          and all(v["passed"] for v in parity.values()))
    report["passed"] = ok
    text = json.dumps(report, indent=2)
    print(text)
    Path(args.out).write_text(text + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
