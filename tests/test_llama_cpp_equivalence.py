"""llama.cpp runs our export exactly as it runs its own converter's file.

For both DeepSpec-trained golden drafters (DSpark `vanilla_conf_markov`, plain DFlash
`dflash_shared`): llama.cpp 0c1e570, built from the pinned sdist, runs the target GGUF its
own convert_hf_to_gguf.py makes, with (a) its converter's drafter file, (b) `dspark export
--keep-embedding` (the converter's layout) and (c) `dspark export` (the default layout).
(a) and (b) give the same text and the same statistics line; all three are lossless (the
text of llama-completion on the target alone, greedy; support/llama_cpp.lossless). The two files of (a) and (b) hold
the same tensors (names, types, shapes, bytes) and the same keys but for the documented
ones.

In CI these run (a missing build fails them: support/llama_cpp.engine); marked slow: the
fixture converts and exports, and each case runs llama.cpp."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from gguf import GGUFReader

from support.llama_cpp import KINDS

pytestmark = pytest.mark.slow

PROMPTS = ("hello world", "hello world, the quick brown fox")
N = 16
# Keys our file and the converter's may hold differently: the model's display name and
# size label (the converter names the drafter after its directory and counts parameters),
# and our provenance (dspark.export.*), which the converter does not write.
DISPLAY_KEYS = {"general.name", "general.size_label"}
PROVENANCE_PREFIX = "dspark.export."


@pytest.fixture(scope="module")
def golden(llama_golden):
    return llama_golden


def _keys(path) -> dict[str, tuple]:
    reader = GGUFReader(path)
    out = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        value = field.contents()
        out[key] = (tuple(t.name for t in field.types), value)
    return out


def _tensors(path) -> dict[str, tuple]:
    reader = GGUFReader(path)
    return {t.name: (t.tensor_type.name, tuple(int(d) for d in t.shape),
                     hashlib.sha256(np.ascontiguousarray(t.data).view(np.uint8)).hexdigest())
            for t in reader.tensors}


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("name", sorted(KINDS))
def test_converter_layout_runs_exactly_like_llama_cpp_own_file(golden, name, prompt):
    llama, kind = golden.engine, KINDS[name]
    theirs = llama.speculative(golden.target, golden.converter[name], kind, prompt, N)
    ours = llama.speculative(golden.target, golden.kept[name], kind, prompt, N)
    assert theirs.returncode == ours.returncode == 0, ours.stderr[-2000:]
    assert theirs.stats is not None and ours.stats is not None
    assert ours.stats == theirs.stats
    assert ours.out == theirs.out
    assert llama.lossless(golden.target, ours, prompt, N), "speculative text is not the target's"


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("name", sorted(KINDS))
def test_default_export_is_lossless_and_accepts_at_least_as_much(golden, name, prompt):
    """The default layout binds the target's head (no token_embd in the drafter): the text
    is still the target's, and llama.cpp accepts at least as many tokens as with the file
    whose embedding it takes for the head."""
    llama, kind = golden.engine, KINDS[name]
    ours = llama.speculative(golden.target, golden.exports[name], kind, prompt, N)
    theirs = llama.speculative(golden.target, golden.converter[name], kind, prompt, N)
    assert ours.returncode == theirs.returncode == 0, ours.stderr[-2000:]
    assert llama.lossless(golden.target, ours, prompt, N), "speculative text is not the target's"
    assert ours.mean_acceptance >= theirs.mean_acceptance, (ours.stats, theirs.stats)


@pytest.mark.parametrize("name", sorted(KINDS))
def test_files_hold_the_same_tensors_and_keys(golden, name):
    theirs_t, ours_t = _tensors(golden.converter[name]), _tensors(golden.kept[name])
    assert ours_t == theirs_t
    default_t = _tensors(golden.exports[name])
    assert default_t == {k: v for k, v in theirs_t.items() if k != "token_embd.weight"}

    theirs_k, ours_k = _keys(golden.converter[name]), _keys(golden.kept[name])
    shared = set(theirs_k) - DISPLAY_KEYS
    assert shared <= set(ours_k), f"keys the converter writes and we do not: {shared - set(ours_k)}"
    for key in sorted(shared):
        assert ours_k[key] == theirs_k[key], key
    extra = set(ours_k) - set(theirs_k) - DISPLAY_KEYS
    assert extra and all(k.startswith(PROVENANCE_PREFIX) for k in extra), extra
    # The default layout differs in tensors only.
    assert _keys(golden.exports[name]) == ours_k


@pytest.mark.parametrize("name", sorted(KINDS))
def test_export_is_byte_reproducible(golden, name, tmp_path):
    from dspark_convert.commands.export import export_llama_cpp

    again = export_llama_cpp(golden.artifacts[name], golden.target, tmp_path / "again.gguf")
    assert again.output.read_bytes() == golden.exports[name].read_bytes()


def test_dflash_export_runs_as_the_export_recommends(golden):
    """`dspark export` tells a DFlash user to run --spec-type draft-dspark: lossless, and it
    accepts more than draft-dflash, which reads DeepSpec's block one row late."""
    llama, path = golden.engine, golden.exports["dflash_shared"]
    dspark = llama.speculative(golden.target, path, "dspark", PROMPTS[0], N)
    dflash = llama.speculative(golden.target, path, "dflash", PROMPTS[0], N)
    assert dspark.returncode == dflash.returncode == 0, dspark.stderr[-2000:]
    assert llama.lossless(golden.target, dspark, PROMPTS[0], N)
    assert dspark.mean_acceptance > dflash.mean_acceptance, (dspark.stats, dflash.stats)


@pytest.mark.parametrize("qtype", ["q8_0", "q4_0"])
def test_quantized_export_runs_in_llama_cpp(golden, tmp_path, qtype):
    from dspark_convert.commands.export import export_llama_cpp
    from dspark_convert.commands.quantize import quantize_artifact

    art = quantize_artifact(golden.artifacts["vanilla_conf_markov"], tmp_path / "q", qtype).output
    out = export_llama_cpp(art, golden.target, tmp_path / "q.gguf").output
    run = golden.engine.speculative(golden.target, out, "dspark", PROMPTS[0], N)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stats is not None
    assert golden.engine.lossless(golden.target, run, PROMPTS[0], N)
