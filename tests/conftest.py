"""Shared fixtures: the golden data and a converted copy of each golden checkpoint. Helpers
shared by test modules live in tests/support/; test modules never import each other."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

# The interrupt tests send SIGINT to in-process code and to `dspark` children. A suite started
# in the background of a non-interactive shell (`make test &`, nohup) inherits SIGINT ignored,
# and an ignored SIGINT is inherited through exec: Python then installs no KeyboardInterrupt
# handler, in pytest or in any child, and those tests fail for the way they were started.
# The suite takes SIGINT as an interactive one does; a Python handler is reset to the default
# on exec, so the children get theirs too.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Re-exported: test modules read the data's paths and the CLI's argv from here.
from support.cli import dspark_cmd  # noqa: F401
from support.paths import EXPECTED, GOLDEN, REFERENCE_DRAFTER, ROOT, golden_source  # noqa: F401


@pytest.fixture(scope="session")
def big_source(tmp_path_factory) -> Path:
    """A ~130 MB synthetic checkpoint (the two Markov matrices, V=65536 x r=512 in BF16):
    its conversion keeps the hidden temporary sibling on disk long enough to be seen and
    the process to be signalled while it writes drafter.gguf. Only its size matters: the
    values are the seeded synthetic ones of a 256-token vocabulary repeated down the rows
    (drawing 67 M normals took 4 of the fixture's 6 s)."""
    import numpy as np

    from dspark_convert.contract.dspark import build_contract, parse_config
    from dspark_convert.synthetic import synthetic_config, synthetic_tensors, write_checkpoint

    geometry = dict(markov_rank=512, hidden_size=256)
    config = synthetic_config(vocab_size=65536, **geometry)
    shapes = {t.source_name: tuple(t.shape) for t in build_contract(parse_config(config)).tensors}
    block = synthetic_tensors(synthetic_config(vocab_size=256, **geometry), include_embeddings=False)
    tensors = {name: v if v.shape == shapes[name] else np.tile(v, (shapes[name][0] // v.shape[0], 1))
               for name, v in block.items()}
    assert {name: v.shape for name, v in tensors.items()} == {
        name: shapes[name] for name in tensors}
    src = tmp_path_factory.mktemp("big") / "src"
    write_checkpoint(src, config, tensors)
    assert (src / "model.safetensors").stat().st_size > 130_000_000
    return src


@pytest.fixture(scope="session")
def converted(tmp_path_factory):
    """name -> artifact directory, each golden checkpoint converted once per session."""
    from dspark_convert.commands.convert import convert

    root = tmp_path_factory.mktemp("converted")
    out = {}
    for name in EXPECTED:
        out[name] = root / name
        convert(golden_source(name), out[name])
    return out


@pytest.fixture(scope="session")
def paired_artifacts(tmp_path_factory):
    """name -> artifact of each DeepSpec-trained golden drafter, converted once per session
    with --target (the pairing recorded): what eval and smoke --calibration run on."""
    from support.paths import GOLDEN_TARGET, TRAINED_DRAFTERS

    from dspark_convert.commands.convert import convert

    root = tmp_path_factory.mktemp("paired")
    out = {}
    for name, src in TRAINED_DRAFTERS.items():
        out[name] = root / name
        convert(src, out[name], target=GOLDEN_TARGET)
    return out


# --- the runtime tests (torch is imported inside, so that other tests never pay for it) ---

@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny matrices: one torch thread is ~50x faster than two contended ones on a busy
    runner. Runtime test modules ask for it with pytestmark."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def golden_models(converted):
    """The golden target and the converted reference drafter bound to it, on the CPU."""
    import torch

    from dspark_convert.runtime.drafter import DSparkDrafter
    from dspark_convert.runtime.qwen3 import Qwen3Target
    from dspark_convert.runtime.weights import load_drafter_weights

    cpu = torch.device("cpu")
    target = Qwen3Target(GOLDEN / "reference" / "target", device=cpu)
    drafter = DSparkDrafter(load_drafter_weights(converted["reference"]), embed=target.embed,
                            lm_head=target.lm_head, device=cpu)
    return target, drafter


# --- llama.cpp: the engine, its converter's files and our exports, built once ---

@pytest.fixture(scope="session")
def llama_golden(tmp_path_factory, paired_artifacts):
    """support/llama_cpp.Golden: the golden target converted by llama.cpp's own converter,
    both trained drafters converted by it and exported by us. Skips where llama.cpp is not
    built, fails under CI=true (support/llama_cpp.engine)."""
    from support.llama_cpp import make_golden

    return make_golden(tmp_path_factory.mktemp("llama_cpp"), paired_artifacts)
