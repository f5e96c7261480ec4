"""`dspark conform --diagnose` on llama.cpp's own runs (llama.cpp 0c1e570, the real binaries:
support/llama_cpp.engine, a missing build skips here and fails under CI=true): its two real
slips on the golden drafters are named, each as exactly its misreading, with the fix.

- ``draft-dflash`` on DeepSeek's plain DFlash drafter reads the block one row late
  (docs/ENGINES.md): diagnosed ``row_late``;
- llama.cpp's own converter's file of the DSpark drafter (token_embd kept, lm_head
  dropped: the loader takes the embedding as the head of the golden target, which is
  untied): diagnosed ``head_is_embedding``;
- the default export run with ``draft-dspark`` conforms (nothing to diagnose).

The drafts are read from llama.cpp's log (evaluation/engine_llama_cpp.py, what `dspark eval
--engine` reads) on two prompts and written as a conform trace; slow: the session's
``llama_golden`` converts and exports first."""

from __future__ import annotations

import json

import pytest
from support.cli import assert_refused, run_cli
from support.paths import GOLDEN_TARGET

from dspark_convert.errors import MisreadingDiagnosedError

pytestmark = pytest.mark.slow

DSPARK, DFLASH = "vanilla_conf_markov", "dflash_shared"
PROMPTS = ("hello world", "the sea and the sky")
N = 24


def _trace(golden, draft_file, kind, path):
    """llama.cpp's drafts of both prompts, as a conform trace (each line's id its prompt)."""
    from dspark_convert.evaluation import engine_llama_cpp as L
    from dspark_convert.evaluation.conform import trace_bytes
    from dspark_convert.evaluation.proposals import EngineDraft, engine_lines
    from dspark_convert.target.tokenizer import fingerprint_tokenizer

    bins = L.find_binaries(golden.engine.bin)
    vocab = L.read_vocabulary(golden.target)
    tokenizer = fingerprint_tokenizer(GOLDEN_TARGET / "tokenizer.json")
    lines = []
    for prompt in PROMPTS:
        ids = tuple(tokenizer.encode(prompt))
        run = L.run_speculative(bins, golden.target, draft_file, kind=kind, prompt_text=prompt,
                                prompt_ids=ids, vocab=vocab, max_new_tokens=N, n_max=7)
        lines += engine_lines([EngineDraft(d.call, d.context, d.anchor, d.tokens)
                               for d in run.drafts], first_line=len(lines) + 1, id=prompt)
    path.write_bytes(trace_bytes(lines))
    return path, len(lines)


def _diagnose(artifact, trace):
    return run_cli("conform", str(artifact), "--target", str(GOLDEN_TARGET), "--trace",
                   str(trace), "--device", "cpu", "--diagnose", "--json")


@pytest.mark.parametrize("name, file, kind, misreading, fix", [
    (DFLASH, "exports", "dflash", "row_late", "--spec-type draft-dspark"),
    (DSPARK, "converter", "dspark", "head_is_embedding", "token_embd.weight"),
], ids=["draft-dflash", "converter-file"])
def test_llama_cpps_real_slips_are_diagnosed(llama_golden, paired_artifacts, tmp_path, name,
                                             file, kind, misreading, fix):
    trace, n = _trace(llama_golden, getattr(llama_golden, file)[name], kind, tmp_path / "t.jsonl")
    proc = _diagnose(paired_artifacts[name], trace)
    assert_refused(proc, MisreadingDiagnosedError, [f"{misreading} reproduces all of the", fix])
    doc = json.loads(proc.stdout)
    best, *rest = doc["diagnosis"]
    differing = doc["check"]["compared"] - doc["check"]["equal"]
    assert n > 4 and differing > 0
    assert (best["misreading"], best["explains"], best["of"]) == (misreading, differing, differing)
    assert all(e["explains"] < differing for e in rest), rest


def test_the_default_export_conforms_with_nothing_to_diagnose(llama_golden, paired_artifacts,
                                                              tmp_path):
    trace, n = _trace(llama_golden, llama_golden.exports[DSPARK], "dspark", tmp_path / "t.jsonl")
    proc = _diagnose(paired_artifacts[DSPARK], trace)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["conforms"] and doc["diagnosis"] is None and doc["lines"] == n > 4
