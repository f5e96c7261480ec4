"""google/gemma-4-12B-it and DeepSeek's released 12B Gemma4 DSpark drafter, all-zero and
sparse, and what `dspark convert --target` and `dspark smoke` do with them.

As bench/sparse_models.py does for Qwen3: load time, forward time and memory depend on the
shapes, not on the values, so every weight is zero and ``model.safetensors`` is its header
followed by a hole (23.8 GB of target in a few kB of disk; reading a hole returns zeros).

- The TARGET (``target_config``): the Gemma4 golden target's config.json (golden/reference/
  gemma4/target/: the gemma4_unified form docs/REFERENCE.md §10.6 quotes, tied
  embedding, softcap 30, bos 2 / eos 1 / pad 0, the sliding layers' default RoPE 1e4 and
  the full ones' proportional 0.25 at 1e6, k_eq_v) with google/gemma-4-12B-it's sizes from
  section 6 (``GEMMA4_12B``: H 3840, 48 layers, 5 sliding : 1 full with the full ones at 5,
  11, ..., 47, 16 heads, sliding layers 8 KV heads of 256 with v_proj, full layers 1 KV
  head of 512 and no v_proj, window 1024, FFN 15360, V 262144, 262144 positions); its
  generation_config.json and tokenizer.json (Gemma's special tokens at ids 0-4, the
  drafter's mask token 4 among them; the pairing fingerprints it) too. The tensors are
  runtime/gemma4.py ``tensor_shapes`` of that config: exactly what `dspark smoke` plans
  and loads.
- The DRAFTER (``drafter_config``): the released config.json (golden/reference/gemma4/
  released_12b_config_quoted.json; with another geometry's sizes for smaller pairs) and
  the tensors the project's contract names for it (contract/families.py GEMMA4); at 12B
  both are checked against DeepSeek's (the quoted config exactly, released_shapes.json
  ``gemma4/vanilla+conf_with_markov`` key for key, 74 tensors). Its embed_tokens and
  lm_head are all-zero BF16 [262144, 3840] like the target's tied embedding, so the
  SHA-256 the pairing compares agrees.

    python bench/sparse_gemma4.py [--workdir /tmp/dspark-gemma4-12b-sparse] [--keep]

builds the pair, converts the drafter with --target (wall, peak RSS), then runs `dspark
smoke` on it with --max-memory 8GB in float32 and bfloat16: both must refuse (78) before
loading, at a small peak RSS; it prints the refusal lines and the estimate's parts
(runtime/memory.py ``estimate_memory`` on the same plans, in-process).

Measured on the development machine (2 cores, 23.5 GiB, 2026-12-02, 64-token prompt, 16 new
tokens; bench/RESULTS.md): convert --target 36-44 s at 91 MB peak RSS, 2.83 GB drafter.gguf;
smoke refused (78) in 6-10 s at 0.29 GB peak RSS, estimates 27.07 GB (bfloat16: target
23.81 GB, drafter 2.83 GB) and 53.77 GB (float32).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from sparse_models import write_sparse_safetensors

ROOT = Path(__file__).resolve().parent.parent
GEMMA4_GOLDEN = ROOT / "golden" / "reference" / "gemma4"
GOLDEN_TARGET = GEMMA4_GOLDEN / "target"
RELEASED_CONFIG = GEMMA4_GOLDEN / "released_12b_config_quoted.json"
RELEASED_SHAPES = ROOT / "golden" / "reference" / "released_shapes.json"
RELEASED_VARIANT = "gemma4/vanilla+conf_with_markov"
DSPARK = Path(sys.executable).parent / "dspark"

@dataclass(frozen=True)
class Gemma4Geometry:
    """A Gemma4 target's text path and its DSpark drafter, in config.json's words."""

    name: str
    hidden_size: int
    intermediate_size: int
    target_layers: int
    full_every: int              # layer i is full attention when i % full_every == full_every - 1
    heads: int
    head_dim: int                # sliding layers
    kv_heads: int
    global_head_dim: int         # full layers (and the drafter)
    global_kv_heads: int
    sliding_window: int
    vocab_size: int
    max_position_embeddings: int
    taps: tuple[int, ...]
    draft_layers: int = 5
    markov_rank: int = 256


# google/gemma-4-12B-it (docs/REFERENCE.md §10.6, third-party quotes) and DeepSeek's
# released drafter for it (the quoted config.json: taps [5, 17, 29, 41, 46], 5 draft
# layers, vanilla Markov head r 256): drafter_config(GEMMA4_12B) is that config.json.
GEMMA4_12B = Gemma4Geometry(
    "gemma-4-12b-it", hidden_size=3840, intermediate_size=15360, target_layers=48,
    full_every=6, heads=16, head_dim=256, kv_heads=8, global_head_dim=512, global_kv_heads=1,
    sliding_window=1024, vocab_size=262144, max_position_embeddings=262144,
    taps=(5, 17, 29, 41, 46))


def layer_types(g: Gemma4Geometry) -> list[str]:
    """``full_every - 1`` sliding layers, then a full one (12B: full at 5, 11, ..., 47)."""
    return ["full_attention" if i % g.full_every == g.full_every - 1 else "sliding_attention"
            for i in range(g.target_layers)]


def target_config(g: Gemma4Geometry) -> dict:
    """The golden Gemma4 target's config.json (the gemma4_unified form docs/REFERENCE.md §10.6
    quotes: architectures, model_type, tied embedding, bos 2 / eos 1 / pad 0, softcap 30,
    the RoPE of each kind of layer, GELU-tanh, k_eq_v) with ``g``'s sizes."""
    config = json.loads((GOLDEN_TARGET / "config.json").read_text())
    config["text_config"].update(
        hidden_size=g.hidden_size, intermediate_size=g.intermediate_size,
        num_hidden_layers=g.target_layers, layer_types=layer_types(g),
        num_attention_heads=g.heads, head_dim=g.head_dim, num_key_value_heads=g.kv_heads,
        global_head_dim=g.global_head_dim, num_global_key_value_heads=g.global_kv_heads,
        sliding_window=g.sliding_window, vocab_size=g.vocab_size,
        max_position_embeddings=g.max_position_embeddings)
    return config


def drafter_config(g: Gemma4Geometry) -> dict:
    """The released 12B drafter's config.json with ``g``'s sizes."""
    config = json.loads(RELEASED_CONFIG.read_text())
    config.update(
        hidden_size=g.hidden_size, intermediate_size=g.intermediate_size,
        num_attention_heads=g.heads, head_dim=g.head_dim, num_key_value_heads=g.kv_heads,
        global_head_dim=g.global_head_dim, num_global_key_value_heads=g.global_kv_heads,
        sliding_window=g.sliding_window, vocab_size=g.vocab_size,
        vocab_size_per_layer_input=g.vocab_size, num_target_layers=g.target_layers,
        target_layer_ids=list(g.taps), num_hidden_layers=g.draft_layers,
        layer_types=["full_attention"] * g.draft_layers, markov_rank=g.markov_rank,
        max_position_embeddings=g.max_position_embeddings)
    return config


def target_shapes(directory: Path) -> dict[str, list[int]]:
    """The target's tensors as the runtime plans them (runtime/gemma4.py tensor_shapes)."""
    from dspark_convert.runtime.gemma4 import read_target_config, tensor_shapes

    return {name: list(shape)
            for name, shape in tensor_shapes(read_target_config(directory)).items()}


def drafter_shapes(config: dict) -> dict[str, list[int]]:
    """Source name -> torch shape, from the project's contract for this config (the Gemma4
    family's, contract/families.py)."""
    from dspark_convert.contract.families import GEMMA4

    contract = GEMMA4.build_contract(GEMMA4.parse_config(config, path="config.json"),
                                     path="config.json", raw=config)
    return {t.source_name: list(t.shape) for t in contract.tensors}


def check_released(config: dict, shapes: dict[str, list[int]]) -> None:
    """The 12B drafter must be DeepSeek's: its config.json as quoted, its tensors DeepSpec's
    model's key for key (released_shapes.json)."""
    if config != json.loads(RELEASED_CONFIG.read_text()):
        raise SystemExit(f"drafter_config(GEMMA4_12B) is not {RELEASED_CONFIG.name}")
    released = json.loads(RELEASED_SHAPES.read_text())[RELEASED_VARIANT]
    if shapes != released:
        differ = sorted(k for k in set(shapes) | set(released) if shapes.get(k) != released.get(k))
        raise SystemExit(f"the contract's tensors differ from {RELEASED_VARIANT} at {differ[:5]}")


def make_sparse_pair(g: Gemma4Geometry, root: Path) -> tuple[Path, Path]:
    """``root/target`` (config.json, generation_config.json, tokenizer.json, a sparse
    model.safetensors) and ``root/drafter`` (config.json, a sparse model.safetensors);
    kept when ``root`` already holds the same pair."""
    tconfig, dconfig = target_config(g), drafter_config(g)
    stamp = {"target": tconfig, "drafter": dconfig, "format": 1}
    marker = root / ".sparse-gemma4.json"
    target, drafter = root / "target", root / "drafter"
    if marker.is_file() and json.loads(marker.read_text()) == stamp:
        return target, drafter
    shapes = drafter_shapes(dconfig)
    if g == GEMMA4_12B:
        check_released(dconfig, shapes)
    shutil.rmtree(root, ignore_errors=True)
    target.mkdir(parents=True)
    drafter.mkdir()
    (target / "config.json").write_text(json.dumps(tconfig, indent=2) + "\n")
    for name in ("generation_config.json", "tokenizer.json"):
        shutil.copy(GOLDEN_TARGET / name, target / name)
    write_sparse_safetensors(target / "model.safetensors", target_shapes(target))
    (drafter / "config.json").write_text(json.dumps(dconfig, indent=2) + "\n")
    write_sparse_safetensors(drafter / "model.safetensors", shapes)
    marker.write_text(json.dumps(stamp))
    return target, drafter


# --- the measurement ------------------------------------------------------------------------

# The command is started by a bare interpreter, not forked from this process: Linux carries
# the high-water RSS of a process' image before exec into its ru_maxrss, and this one has
# imported torch (runtime/gemma4.py's tensor table) by then (tests/test_runtime_memory.py).
LAUNCHER = """
import os, subprocess, sys
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
_, status, usage = os.wait4(proc.pid, 0)
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)
"""


def measured(*args: str) -> tuple[int, float, int, str]:
    """(exit code, wall seconds, peak RSS bytes, stderr) of `dspark ARGS` in its own
    process."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", LAUNCHER, str(DSPARK), *args],
                          capture_output=True, text=True, env={**os.environ, "COLUMNS": "400"})
    code, maxrss_kib = (int(word) for word in proc.stdout.split())
    return code, time.perf_counter() - start, maxrss_kib * 1024, proc.stderr


def estimates(target: Path, artifact: Path, prompt: int, new: int) -> dict[str, object]:
    """dtype -> runtime/memory.py's estimate on the same plans smoke makes (CPU)."""
    import torch

    from dspark_convert.runtime.gemma4 import plan_target
    from dspark_convert.runtime.memory import estimate_memory
    from dspark_convert.runtime.weights import plan_drafter

    tplan, dplan = plan_target(target), plan_drafter(artifact)
    return {str(dt).removeprefix("torch."): estimate_memory(
        tplan, dplan, dtype=dt, device=torch.device("cpu"), longest_prompt=prompt,
        max_new_tokens=new) for dt in (torch.float32, torch.bfloat16)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/dspark-gemma4-12b-sparse"))
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    root, art = args.workdir / "models", args.workdir / "artifact"
    prompt, new = 64, 16
    try:
        t0 = time.perf_counter()
        target, drafter = make_sparse_pair(GEMMA4_12B, root)
        print(f"sparse pair built in {time.perf_counter() - t0:.2f} s: target "
              f"{os.path.getsize(target / 'model.safetensors') / 1e9:.2f} GB, drafter "
              f"{os.path.getsize(drafter / 'model.safetensors') / 1e9:.2f} GB (holes)")
        shutil.rmtree(art, ignore_errors=True)
        code, wall, peak, err = measured("convert", str(drafter), "--target", str(target),
                                         "-o", str(art), "-q")
        print(f"convert --target  exit {code}  {wall:6.1f} s  peak RSS {peak / 1e6:6.1f} MB  "
              f"drafter.gguf {os.path.getsize(art / 'drafter.gguf') / 1e9:.2f} GB"
              if code == 0 else f"convert failed ({code}): {err.strip()}")
        if code != 0:
            return 1
        failed = False
        ids = ",".join(str(i) for i in range(10, 10 + prompt))
        for dtype in ("float32", "bfloat16"):
            code, wall, peak, err = measured(
                "smoke", str(art), "--target", str(target), "--device", "cpu", "--dtype", dtype,
                "--prompt-ids", ids, "--max-new-tokens", str(new), "--max-memory", "8GB")
            ok = code == 78 and "found an estimate of" in err
            failed |= not ok
            print(f"smoke {dtype:8s} exit {code}  {wall:6.1f} s  peak RSS {peak / 1e6:6.1f} MB  "
                  f"{'refused before loading' if ok else 'FAILED'}\n  {err.strip()}")
        for dtype, e in estimates(target, art, prompt, new).items():
            print(f"estimate {dtype}: total {e.total / 1e9:.2f} GB = target weights "
                  f"{e.target_weights / 1e9:.2f} GB + drafter {e.drafter_weights / 1e9:.2f} GB + "
                  f"activations {e.activations / 1e6:.1f} MB ({e.context_tokens} positions) + "
                  f"runtime {e.runtime / 1e6:.1f} MB")
        return 1 if failed else 0
    finally:
        if not args.keep:
            shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
