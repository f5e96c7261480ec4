"""artifact/engines.py's llama.cpp rule against llama.cpp's real loader.

A corpus of exported drafters with one edit each (a key missing or mistyped, a tensor's
shape or count changed, each head type), loaded by llama.cpp 0c1e570 itself
(llama-speculative-simple on the golden target, one token) and judged by the emulated rule.
They must agree on every case: the file loads and runs (exit 0) exactly when the emulated report
has no ``load_error`` or ``unsupported`` refusal. A ``misread`` is a file that loads and
runs wrongly, which only the emulation can say; those cases are listed in MISREAD and pinned
here too (docs/ENGINES.md, "The emulated rule against the real loader").

Marked slow (one llama.cpp run per case); in CI they run (support/llama_cpp.engine)."""

from __future__ import annotations

import pytest
from gguf import GGUFValueType as T

from support.llama_cpp import rewrite_gguf

from dspark_convert.artifact.engines import gguf_inputs, llama_cpp
from dspark_convert.formats.gguf_reader import read_gguf

pytestmark = pytest.mark.slow

H, V, R = 64, 512, 16          # the golden geometry (hidden, vocabulary, Markov rank)

# (case id, drafter, the edit (rewrite_gguf's keywords), the emulated rule expected first:
# None when the file loads as meant).
CORPUS = [
    ("as exported", "dspark", {}, None),
    ("as exported (DFlash)", "dflash", {}, None),
    # Loads and runs: with the embedding as the drafter's head (a misread, not blocking).
    ("kept embedding", "dspark-kept", {}, "embedding_as_head"),
    ("no context_length", "dspark", dict(drop_keys=("dflash.context_length",)),
     "key.dflash.context_length"),
    ("context_length u64", "dspark", dict(set_keys={"dflash.context_length": (512, T.UINT64, None)}),
     "key.dflash.context_length"),
    ("no embedding_length", "dspark", dict(drop_keys=("dflash.embedding_length",)),
     "key.dflash.embedding_length"),
    ("block_count i32", "dspark", dict(set_keys={"dflash.block_count": (2, T.INT32, None)}),
     "key.dflash.block_count"),
    ("no feed_forward_length", "dspark", dict(drop_keys=("dflash.feed_forward_length",)),
     "key.dflash.feed_forward_length"),
    ("no head_count", "dspark", dict(drop_keys=("dflash.attention.head_count",)),
     "key.dflash.attention.head_count"),
    ("head_count_kv string", "dspark",
     dict(set_keys={"dflash.attention.head_count_kv": ("2", T.STRING, None)}),
     "key.dflash.attention.head_count_kv"),
    ("rope freq_base f64", "dspark",
     dict(set_keys={"dflash.rope.freq_base": (1e6, T.FLOAT64, None)}), "key.dflash.rope.freq_base"),
    ("key_length u16", "dspark",
     dict(set_keys={"dflash.attention.key_length": (16, T.UINT16, None)}),
     "key.dflash.attention.key_length"),
    ("causal as a string", "dspark",
     dict(set_keys={"dflash.attention.causal": ("false", T.STRING, None)}),
     "key.dflash.attention.causal"),
    ("causal as a BOOL", "dspark",
     dict(set_keys={"dflash.attention.causal": (False, T.BOOL, None)}), None),
    ("no rms eps", "dspark", dict(drop_keys=("dflash.attention.layer_norm_rms_epsilon",)),
     "key.dflash.attention.layer_norm_rms_epsilon"),
    ("rms eps f64", "dspark",
     dict(set_keys={"dflash.attention.layer_norm_rms_epsilon": (1e-6, T.FLOAT64, None)}),
     "key.dflash.attention.layer_norm_rms_epsilon"),
    ("block_size string", "dspark", dict(set_keys={"dflash.block_size": ("7", T.STRING, None)}),
     "key.dflash.block_size"),
    ("no target_layers", "dspark", dict(drop_keys=("dflash.target_layers",)), "target_layers"),
    ("target_layers f32", "dspark",
     dict(set_keys={"dflash.target_layers": ([1.0, 3.0, 5.0], T.ARRAY, T.FLOAT32)}),
     "target_layers"),
    ("architecture qwen3", "dspark",
     dict(set_keys={"general.architecture": ("qwen3", T.STRING, None)}), "architecture"),
    ("no tokenizer tokens", "dspark", dict(drop_keys=("tokenizer.ggml.tokens",)), "tokenizer"),
    # It loads, with mask token -1, and aborts at the first draft: refused all the same.
    ("no mask token", "dspark", dict(drop_keys=("tokenizer.ggml.mask_token_id",)), "mask_token"),
    ("no tensor attn_q", "dspark", dict(drop_tensors=("blk.0.attn_q.weight",)), "tensor_shapes"),
    ("fc.weight shape", "dspark", dict(add_tensors={"fc.weight": ([2 * H, H], "BF16")}),
     "tensor_shapes"),
    ("attn_norm shape", "dspark", dict(add_tensors={"blk.1.attn_norm.weight": ([H + 1], "F32")}),
     "tensor_shapes"),
    ("no markov_w2", "dspark", dict(drop_tensors=("markov_w2.weight",)), "tensor_shapes"),
    ("markov_w2 rank", "dspark", dict(add_tensors={"markov_w2.weight": ([R + 1, V], "BF16")}),
     "tensor_shapes"),
    ("no markov_w1", "dspark", dict(drop_tensors=("markov_w1.weight",)), "tensor_count"),
    ("conf_proj without Markov input", "dspark",
     dict(add_tensors={"conf_proj.weight": ([H, 1], "BF16")}), "tensor_shapes"),
    ("no confidence head", "dspark",
     dict(drop_tensors=("conf_proj.weight", "conf_proj.bias"),
          set_keys={"dflash.has_confidence_head": (False, T.BOOL, None)}), None),
    ("gated Markov head", "dspark",
     dict(add_tensors={"markov_gate.weight": ([H + R, R], "BF16"), "markov_gate.bias": ([R], "F32")}),
     "tensor_count"),
    ("rnn Markov head", "dspark",
     dict(add_tensors={"markov_joint.weight": ([2 * R + H, 3 * R], "BF16"),
                       "markov_joint.bias": ([3 * R], "F32")}), "tensor_count"),
    ("a confidence head on DFlash", "dflash",
     dict(add_tensors={"conf_proj.weight": ([H, 1], "BF16"), "conf_proj.bias": ([1], "F32")}),
     "tensor_count"),
    ("an unknown tensor", "dspark", dict(add_tensors={"extra.weight": ([H], "F32")}),
     "tensor_count"),
    ("own head", "dspark", dict(add_tensors={"output.weight": ([H, V], "BF16")}), None),
    ("own head, wrong shape", "dspark", dict(add_tensors={"output.weight": ([H, V - 1], "BF16")}),
     "tensor_shapes"),
]
# Cases the real loader loads and runs although the emulation refuses them: the file is read
# as something else than the drafter means (kind "misread").
MISREAD = [
    ("no freq_base", "dspark", dict(drop_keys=("dflash.rope.freq_base",)), "rope_base"),
]


@pytest.fixture(scope="module")
def files(llama_golden):
    return {"dspark": llama_golden.exports["vanilla_conf_markov"],
            "dflash": llama_golden.exports["dflash_shared"],
            "dspark-kept": llama_golden.kept["vanilla_conf_markov"]}


def _judge(llama_golden, files, tmp_path, drafter, edit):
    path = rewrite_gguf(files[drafter], tmp_path / "edited.gguf", **edit)
    report = llama_cpp(*gguf_inputs(read_gguf(path)))
    kind = "dflash" if drafter == "dflash" else "dspark"
    real = llama_golden.engine.speculative(llama_golden.target, path, kind, "hello", 1)
    return report, real


def _real_error(run) -> str:
    return next((line for line in run.stderr.splitlines() if " E " in line), "")


@pytest.mark.parametrize("case, drafter, edit, first", CORPUS, ids=[c[0] for c in CORPUS])
def test_emulated_rule_and_real_loader_agree(llama_golden, files, tmp_path, case, drafter, edit,
                                             first):
    report, real = _judge(llama_golden, files, tmp_path, drafter, edit)
    blocking = [r for r in report.refusals if r.kind in ("load_error", "unsupported")]
    assert (real.returncode == 0) == (not blocking), (
        f"{case}: llama.cpp {'loads' if real.returncode == 0 else 'refuses'} "
        f"({_real_error(real)}); the emulation says {report.refusals}")
    got = report.refusals[0].rule.removeprefix("llama.cpp/") if report.refusals else None
    assert got == first, (case, report.refusals)


@pytest.mark.parametrize("case, drafter, edit, first", MISREAD, ids=[c[0] for c in MISREAD])
def test_misread_files_load_in_llama_cpp(llama_golden, files, tmp_path, case, drafter, edit,
                                         first):
    report, real = _judge(llama_golden, files, tmp_path, drafter, edit)
    assert real.returncode == 0, _real_error(real)
    assert [r.rule for r in report.refusals] == [f"llama.cpp/{first}"]
    assert report.refusals[0].kind == "misread"
