"""The bundled reference runtime: run a converted drafter against its target in PyTorch.

- ``weights``: the drafter's tensors, read from ``drafter.gguf`` only (our bounded reader).
- ``qwen3``: a minimal dense Qwen3 target from its HF safetensors directory, with a KV cache
  and the per-layer hidden-state taps the drafter needs.
- ``drafter``: the DSpark drafter of docs/REFERENCE.md §2 (context K/V, non-causal block,
  Markov heads, confidence head).
- ``speculative``: the loop, greedy and lossless rejection sampling.
- ``trace``: the reference.json trace format and the cycle-by-cycle comparison.

- ``memory``: the memory estimate made before loading; ``budget``: its check against what
  the device has, and the report both smoke and eval carry.

Everything here but ``budget`` imports torch; nothing here is imported by ``dspark --help``.
"""
