"""llama.cpp's own runs beside the reference runtime, against
the real binaries of llama.cpp 0c1e570 (tools/llama_cpp.py; support/llama_cpp.engine: a
missing build skips here and FAILS under CI=true).

What is read back from llama.cpp (evaluation/engine_llama_cpp.py), the proposal check
against it (evaluation/proposals.py) with the figures docs/ENGINES.md states as the cause
of the gap, `dspark eval --engine` end to end, and every refusal of the option. Every case
that needs the golden files in llama.cpp's format (converted by its own converter, exported
by us: the session's `llama_golden`, about half a minute) is marked slow; the refusals of
the option are not."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from support.cli import assert_refused, run_cli
from support.llama_cpp import engine
from support.paths import GOLDEN_TARGET

from dspark_convert.errors import (
    EngineBinaryError,
    EngineOptionError,
    OutputExistsError,
    TargetGGUFError,
)
from dspark_convert.evaluation import engine_llama_cpp as L
from dspark_convert.evaluation.proposals import EngineDraft, ReferenceProposer, check_proposals

DSPARK, DFLASH = "vanilla_conf_markov", "dflash_shared"
HELLO = "hello world"
N = 16


@pytest.fixture(scope="module")
def golden(llama_golden):
    return llama_golden


@pytest.fixture(scope="module")
def bins(golden):
    return L.find_binaries(golden.engine.bin)


@pytest.fixture(scope="module")
def hello_ids():
    from dspark_convert.target.tokenizer import fingerprint_tokenizer

    return tuple(fingerprint_tokenizer(GOLDEN_TARGET / "tokenizer.json").encode(HELLO))


@pytest.fixture(scope="module")
def vocab(golden):
    return L.read_vocabulary(golden.target)


@pytest.fixture(scope="module")
def target_alone(golden, bins, vocab):
    return L.run_target(bins, golden.target, HELLO, vocab=vocab, max_new_tokens=N)


@pytest.fixture(scope="module")
def proposers(paired_artifacts):
    import torch

    from dspark_convert.runtime.drafter import DSparkDrafter
    from dspark_convert.runtime.qwen3 import Qwen3Target
    from dspark_convert.runtime.weights import load_drafter_weights

    torch.set_num_threads(1)
    cpu = torch.device("cpu")
    target = Qwen3Target(GOLDEN_TARGET, device=cpu)

    def make(name):
        drafter = DSparkDrafter(load_drafter_weights(paired_artifacts[name]), embed=target.embed,
                                lm_head=target.lm_head, device=cpu)
        return ReferenceProposer(target, drafter)
    return {name: make(name) for name in (DSPARK, DFLASH)}


def _spec(golden, bins, hello_ids, draft: Path, kind: str) -> L.SpeculativeRun:
    return L.run_speculative(bins, golden.target, draft, kind=kind, prompt_text=HELLO,
                             prompt_ids=hello_ids, vocab=L.read_vocabulary(golden.target),
                             max_new_tokens=N, n_max=7)


def _check(run: L.SpeculativeRun, proposer):
    return check_proposals([EngineDraft(d.call, d.context, d.anchor, d.tokens)
                            for d in run.drafts if d.tokens], proposer)


# --- what is read back ------------------------------------------------------------------------

@pytest.mark.slow
def test_llama_cpp_tokenizes_the_prompt_as_our_tokenizer(target_alone, hello_ids):
    assert target_alone.prompt_ids == hello_ids
    # Its 16th token is <|endoftext|> (400), an end of generation to llama.cpp (the golden
    # target's generation_config names only </s>, 2, for the reference runtime).
    assert target_alone.text and target_alone.ended


@pytest.mark.slow
def test_every_draft_is_rebuilt_with_its_context(golden, bins, hello_ids, target_alone):
    """llama.cpp's first anchor is the last prompt token, its context the prompt before it;
    each cycle commits the anchor and the accepted drafts; the output is lossless."""
    run = _spec(golden, bins, hello_ids, golden.exports[DSPARK], "dspark")
    first = run.drafts[0]
    assert first.context == hello_ids[:-1] and first.anchor == hello_ids[-1]
    for before, after in zip(run.drafts, run.drafts[1:]):
        assert after.context == before.context + (before.anchor,) + before.tokens[:before.accepted]
        assert after.anchor == before.next_token
    vocab = L.read_vocabulary(golden.target)
    assert vocab.text(run.output_ids[:N]) == target_alone.text
    stated = re.search(rb"#mean acc len = ([0-9.]+)", run.stats.line.encode())
    lengths = [d.accepted + 1 for d in run.drafts if d.tokens]
    assert float(stated.group(1)) == pytest.approx(sum(lengths) / len(lengths), abs=0.006)


# --- the cause of the gap (docs/ENGINES.md), with the figures stated there --------------------

@pytest.mark.slow
def test_the_converters_layout_reads_the_embedding_as_head(golden, bins, hello_ids, proposers):
    """llama.cpp's own converter's layout (--keep-embedding writes it: token_embd, no
    output.weight): llama.cpp takes the embedding as the head; the first draft already
    differs at its first token, and the DeepSpec context of the hello-world prompt gives 379 219 351..."""
    run = _spec(golden, bins, hello_ids, golden.kept[DSPARK], "dspark")
    check = _check(run, proposers[DSPARK])
    d = check.first_difference
    assert run.stats.mean_acceptance_length == pytest.approx(1.33)
    assert (d.draft_call, d.position, d.engine_token, d.reference_token) == (1, 0, 211, 364)
    assert check.equal < check.compared
    second = run.drafts[1]
    assert second.context == hello_ids and second.anchor == 379
    assert second.tokens == (379, 219, 351, 124, 117, 117, 117)


@pytest.mark.slow
def test_the_export_drafts_exactly_what_the_reference_drafts(golden, bins, hello_ids, proposers):
    """Without token_embd llama.cpp binds the target's head: every DSpark draft equal; the
    rest of the gap to 3.20 is llama.cpp's loop (its extra first draft, the -n budget)."""
    run = _spec(golden, bins, hello_ids, golden.exports[DSPARK], "dspark")
    check = _check(run, proposers[DSPARK])
    assert (check.equal, check.first_difference) == (check.compared, None)
    assert run.stats.mean_acceptance_length == pytest.approx(2.67)
    assert [d.accepted + 1 for d in run.drafts] == [1, 6, 2, 1, 1, 5]
    assert run.drafts[1].tokens == (219, 351, 106, 185, 15, 479, 78)   # DeepSpec's first block


@pytest.mark.slow
def test_draft_dflash_reads_the_block_one_row_late(golden, bins, hello_ids, proposers):
    """draft-dflash reads rows 1..n (common/speculative.cpp): every draft is ours read one
    row late; draft-dspark on the same file reads DeepSpec's rows and every draft is ours."""
    late = _check(_spec(golden, bins, hello_ids, golden.exports[DFLASH], "dflash"), proposers[DFLASH])
    d = late.first_difference
    assert late.equal == 0 and late.compared > 0
    assert (d.draft_call, d.position, d.row_offset) == (1, 0, 1)
    assert d.engine_draft == d.reference_draft[1:]
    right = _check(_spec(golden, bins, hello_ids, golden.exports[DFLASH], "dspark"), proposers[DFLASH])
    assert (right.equal, right.first_difference) == (right.compared, None)


# (What llama.cpp's log must hold, and every hostile form of it, is tests/test_engine_output.py.)


# --- `dspark eval --engine` ------------------------------------------------------------------

@pytest.mark.slow
def test_eval_reports_llama_cpp_beside_the_reference(golden, paired_artifacts, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "hello", "prompt": HELLO}) + "\n"
                       + json.dumps({"id": "bytes", "prompt_ids": [1, 17, 33, 90, 250, 7, 7, 401]})
                       + "\n")
    out = tmp_path / "report"
    proc = run_cli("eval", str(paired_artifacts[DSPARK]), str(paired_artifacts[DFLASH]),
                   "--target", str(GOLDEN_TARGET), "--prompts", str(prompts), "--max-new-tokens",
                   str(N), "--threshold", "0.5", "--engine", f"llama.cpp={golden.engine.bin}",
                   "--target-gguf", str(golden.target), "-o", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["engine"]["engine"] == "llama.cpp"
    runs = {(r["artifact"] or "target", r["spec_type"]): r for r in report["engine_runs"]}
    assert set(runs) == {("target", None), (DSPARK, "draft-dspark"), (DFLASH, "draft-dflash"),
                         (DFLASH, "draft-dspark")}
    for r in runs.values():
        assert r["engine"] == "llama.cpp" and [p["id"] for p in r["prompts"]] == ["hello"]
        assert [s["id"] for s in r["prompts_skipped"]] == ["bytes"]
        # llama.cpp's own line: which backends and CPU features ran.
        assert r["system_info"] == report["engine"]["system_info"]
    assert re.match(r"system_info: n_threads = 1 .*\| CPU : .*AVX2 = 1", report["engine"]["system_info"])
    dspark, dflash = runs[(DSPARK, "draft-dspark")], runs[(DFLASH, "draft-dflash")]
    assert all(r["lossless"] is True for r in runs.values() if r["kind"] == "drafter")
    assert dspark["tau"] == pytest.approx(16 / 6)
    p = dspark["proposals"]
    assert (p["compared"], p["equal"], p["first_difference"]) == (6, 6, None)
    f = dflash["proposals"]["first_difference"]
    assert dflash["proposals"]["equal"] == 0
    assert (f["prompt"], f["draft_call"], f["position"], f["row_offset"]) == ("hello", 1, 0, 1)
    right = runs[(DFLASH, "draft-dspark")]["proposals"]     # what the export advises
    assert right["equal"] == right["compared"] > 0 and right["first_difference"] is None
    engine_not_run = [n for n in report["not_run"] if n["engine"] == "llama.cpp"]
    assert [(n["artifact"], n["confidence_threshold"]) for n in engine_not_run] == [(DSPARK, 0.5)]
    md = (out / "report.md").read_text()
    assert "## llama.cpp beside the reference" in md
    assert "| " + DFLASH + " | draft-dflash |" in md and "read 1 row(s) late" in md
    assert "llama.cpp dflash_shared (draft-dflash)" in proc.stdout


# --- refusals of the option ------------------------------------------------------------------

def _eval(tmp_path, paired_artifacts, *extra):
    return run_cli("eval", str(paired_artifacts[DSPARK]), "--target", str(GOLDEN_TARGET),
                   "-o", str(tmp_path / "report"), *extra)


@pytest.mark.parametrize("extra, error, needle", [
    (("--engine", "vllm=/usr/bin"), EngineOptionError, "expected NAME=BIN_DIR"),
    (("--engine", "llama.cpp"), EngineOptionError, "expected NAME=BIN_DIR"),
    (("--engine", "llama.cpp=/nonexistent"), EngineOptionError, "needs --target-gguf"),
    (("--target-gguf", "x.gguf"), EngineOptionError, "given without --engine"),
])
def test_the_option_is_refused(tmp_path, paired_artifacts, extra, error, needle):
    proc = _eval(tmp_path, paired_artifacts, *extra)
    assert_refused(proc, error, [needle])
    assert not (tmp_path / "report").exists()


def test_a_directory_without_the_binaries_is_refused(tmp_path, paired_artifacts):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / L.SPECULATIVE).write_text("not a program")   # not executable
    proc = _eval(tmp_path, paired_artifacts, "--engine", f"llama.cpp={tmp_path / 'bin'}",
                 "--target-gguf", str(tmp_path / "t.gguf"))
    assert_refused(proc, EngineBinaryError, [L.SPECULATIVE])
    assert not (tmp_path / "report").exists()


def test_a_target_gguf_that_is_not_one_is_refused(tmp_path, paired_artifacts):
    bins = engine().bin
    bad = tmp_path / "t.gguf"
    bad.write_bytes(b"not a gguf file")
    proc = _eval(tmp_path, paired_artifacts, "--engine", f"llama.cpp={bins}", "--target-gguf",
                 str(bad))
    assert_refused(proc, TargetGGUFError, ["t.gguf"])
    assert not (tmp_path / "report").exists()
    # The one input-file rule, as export's: a FIFO is named as one and never waited on.
    os.mkfifo(tmp_path / "fifo.gguf")
    proc = _eval(tmp_path, paired_artifacts, "--engine", f"llama.cpp={bins}", "--target-gguf",
                 str(tmp_path / "fifo.gguf"))
    assert_refused(proc, TargetGGUFError, ["fifo.gguf", "is a FIFO"])
    assert not (tmp_path / "report").exists()


def test_the_report_directory_is_never_the_target_gguf(tmp_path, paired_artifacts):
    """--force would delete what -o names: the target GGUF the engine reads is an input."""
    gguf = tmp_path / "target.gguf"
    gguf.write_bytes(b"GGUF")
    proc = run_cli("eval", str(paired_artifacts[DSPARK]), "--target", str(GOLDEN_TARGET),
                   "-o", str(gguf), "--force", "--engine", f"llama.cpp={tmp_path}",
                   "--target-gguf", str(gguf))
    assert_refused(proc, OutputExistsError, ["is the target GGUF"])
    assert gguf.read_bytes() == b"GGUF"
