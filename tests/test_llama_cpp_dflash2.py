"""A speculators DFlash2 drafter exported for llama.cpp 0c1e570 (commands/export.py
export_dflash2_llama_cpp, artifact/llama_cpp_dflash2.py) and run by it beside the reference
runtime (commands/evaluate_engine.run_kind_llama_cpp): the file as llama.cpp's own gguf-py
reads it, its runs lossless, every draft checked (docs/ENGINES.md, "DFlash2 and the Gemma 4
assistant in llama.cpp"). Skipped where the llama.cpp build is missing (support/llama_cpp)."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
import torch

from support.llama_cpp import engine
from support.paths import GOLDEN, GOLDEN_TARGET

from dspark_convert.artifact import llama_cpp_dflash2 as D
from dspark_convert.commands.evaluate_engine import run_kind_llama_cpp
from dspark_convert.commands.export import export_dflash2_llama_cpp
from dspark_convert.errors import LlamaCppDFlash2Error

pytestmark = pytest.mark.slow
DRAFT = GOLDEN / "reference" / "dflash2" / "draft"
PROMPTS = ["hello world the", "a b c d e f g h i j k l m n o p q r s t u v w x y z"]
# A prompt whose run ends at <|endoftext|> (400), which llama.cpp's verification names the
# target's token even when it was drafted.
ENDING = "the quick brown fox jumps over the lazy dog and then"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    llama = engine()
    root = tmp_path_factory.mktemp("llama_dflash2")
    target = llama.convert(GOLDEN_TARGET, root / "target.gguf")
    return llama, root, target


@pytest.fixture(scope="module")
def models():
    from dspark_convert.runtime.dflash2 import load_drafter
    from dspark_convert.runtime.qwen3 import Qwen3Target

    torch.set_num_threads(1)
    target = Qwen3Target(GOLDEN_TARGET, device=torch.device("cpu"))
    return target, load_drafter(DRAFT, target)


def _reader(llama):
    sys.path.insert(0, str(llama.source / "gguf-py"))
    try:
        import gguf
        return gguf.GGUFReader
    finally:
        sys.path.pop(0)


def test_export_is_what_llama_cpp_reads(built):
    llama, root, target = built
    result = export_dflash2_llama_cpp(DRAFT, target, root / "d.gguf")
    assert (result.spec_type, result.n_max, result.kind) == ("draft-dflash", 7, "dflash2")
    reader = _reader(llama)(str(result.output))
    fields = reader.fields
    assert fields["general.architecture"].contents() == "dflash"
    cfg = json.loads((DRAFT / "config.json").read_text())
    for key, want in (("dflash.block_size", 8), ("dflash.conv_kernel_size", 2),
                      ("dflash.conv_group_size", 16), ("dflash.selector_rank", 16),
                      ("dflash.selector_top_k", 6), ("dflash.attention.sliding_window", 64),
                      ("tokenizer.ggml.mask_token_id", cfg["mask_token_id"])):
        assert fields[key].contents() == want, key
    # llama.cpp's convention: HF hidden_states indices, = speculators' aux ids as they are.
    assert fields["dflash.target_layers"].contents() == cfg["aux_hidden_state_layer_ids"]
    assert fields["dflash.attention.sliding_window_pattern"].contents() == [True, False]
    assert fields["dflash.attention.causal"].contents() is False
    for absent in ("dflash.logit_scale", "dflash.final_logit_softcapping", "token_embd.weight"):
        assert absent not in fields
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    want = {dst: ("F32" if how == "f32" else "BF16") for _, dst, how in D.tensor_names(2)}
    assert types == want
    # The same inputs give the same bytes.
    again = export_dflash2_llama_cpp(DRAFT, target, root / "d2.gguf")
    assert again.sha256 == result.sha256


def test_llama_cpp_runs_it_lossless_every_draft_the_reference(built, models):
    """Every draft call of llama.cpp agrees with the reference's drafts for its context
    under llama.cpp's sliding window, as far as its log and output show a draft (the
    accepted prefix spelled as printed, the first rejected slot not the target's token):
    a run that ends at <|endoftext|> (the second prompt) included."""
    llama, _, target_gguf = built
    target, drafter = models
    run = run_kind_llama_cpp(llama.bin, target_gguf, kind="dflash2", drafter_dir=DRAFT,
                             target=target, drafter=drafter, prompts=[*PROMPTS, ENDING],
                             max_new_tokens=100)
    assert run.lossless
    assert run.every_draft_equal, run.prompts
    assert [p.cycles for p in run.prompts] == [47, 31, 7]
    assert run.tau > 2.5


def test_the_sliding_window_departure(built, models):
    """Past the draft's sliding window (64) the reference's window (context positions >=
    anchor - W for every block query, speculators) and llama.cpp's (> anchor + i - W for
    query i) give other drafts: on this run of 300 tokens llama.cpp's 139 draft calls are
    all the reference's under llama.cpp's window, and the 49th is the first that is not
    under speculators' (a context of 111 committed tokens)."""
    llama, _, target_gguf = built
    target, drafter = models
    runs = {w: run_kind_llama_cpp(llama.bin, target_gguf, kind="dflash2", drafter_dir=DRAFT,
                                  target=target, drafter=drafter, prompts=PROMPTS[:1],
                                  max_new_tokens=300, window=w)
            for w in ("llama.cpp", "reference")}
    [mine] = runs["llama.cpp"].prompts
    assert (mine.cycles, mine.drafts_equal, mine.first_difference) == (139, 139, None)
    [theirs] = runs["reference"].prompts
    assert (theirs.drafts_equal, theirs.first_difference) == (48, 49)
    assert runs["llama.cpp"].lossless


def test_refusals(built, tmp_path):
    llama, root, target = built
    broken = tmp_path / "draft"
    shutil.copytree(DRAFT, broken)
    cfg = json.loads((broken / "config.json").read_text())
    cfg["sliding_window_non_causal"] = False
    (broken / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(LlamaCppDFlash2Error) as info:
        export_dflash2_llama_cpp(broken, target, tmp_path / "x.gguf")
    assert info.value.exit_code == 157 and "sliding_window_non_causal" in info.value.message
    assert not (tmp_path / "x.gguf").exists()


    # A GGUF of another architecture as the target (the drafter's own export: dflash).
    other = export_dflash2_llama_cpp(DRAFT, target, tmp_path / "other.gguf").output
    with pytest.raises(LlamaCppDFlash2Error) as info:
        export_dflash2_llama_cpp(DRAFT, other, tmp_path / "y.gguf")
    assert "general.architecture" in info.value.message and not (tmp_path / "y.gguf").exists()


def test_eval_runs_the_drafter_in_llama_cpp(built, tmp_path):
    """`dspark eval DFLASH2_DIR --engine llama.cpp=BIN --target-gguf T.gguf`: exported, run
    with draft-dflash at n_max 7, every draft checked as far as llama.cpp's output shows
    it, lossless."""
    from support.cli import run_cli

    llama, _, target = built
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n"
                               for i, p in enumerate([*PROMPTS, ENDING])))
    out = tmp_path / "report"
    proc = run_cli("eval", str(DRAFT), "--target", str(GOLDEN_TARGET), "--prompts",
                   str(prompts), "--max-new-tokens", "100", "--threshold", "0", "--engine",
                   f"llama.cpp={llama.bin}", "--target-gguf", str(target), "-o", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "report.json").read_text())
    [run] = [r for r in report["engine_runs"] if r["kind"] == "drafter"]
    assert run["spec_type"] == "draft-dflash" and run["lossless"] is True
    p = run["proposals"]
    assert p["compared"] == p["equal"] == 47 + 31 + 7 and p["first_difference"] is None


def test_export_cli_from_the_artifact_is_the_checkpoints_file(built, tmp_path):
    """`dspark export ARTIFACT --engine llama.cpp`: a converted DFlash2 artifact exports to
    the same bytes as its checkpoint directory; --keep-embedding is refused (107)."""
    from support.cli import run_cli

    _, root, target = built
    art = tmp_path / "artifact"
    proc = run_cli("convert", str(DRAFT), "--target", str(GOLDEN_TARGET), "-o", str(art))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    outs = {}
    for name, source in (("artifact", art), ("checkpoint", DRAFT)):
        outs[name] = tmp_path / f"{name}.gguf"
        proc = run_cli("export", str(source), "--engine", "llama.cpp", "--target-gguf",
                       str(target), "-o", str(outs[name]))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "--spec-type draft-dflash --spec-draft-n-max 7" in proc.stdout
    assert outs["artifact"].read_bytes() == outs["checkpoint"].read_bytes()
    proc = run_cli("export", str(art), "--engine", "llama.cpp", "--target-gguf", str(target),
                   "--keep-embedding", "-o", str(tmp_path / "kept.gguf"))
    assert proc.returncode == 107 and "--keep-embedding" in proc.stderr
    assert not (tmp_path / "kept.gguf").exists()


def test_a_dflash2_log_is_read_strictly(built, models, tmp_path):
    """llama.cpp's DFlash2 log read as hostile input: a candidate line (which it never
    prints for this drafter) is refused (113); printed text that is not the reference's
    accepted drafts is the check's first difference, at the cycle and position it names."""
    import dataclasses
    import subprocess

    from dspark_convert.errors import EngineOutputError
    from dspark_convert.evaluation import engine_llama_cpp as L
    from dspark_convert.evaluation import log_drain
    from dspark_convert.runtime import llama_cpp_semantics as S

    llama, root, target_gguf = built
    target, drafter = models
    draft = export_dflash2_llama_cpp(DRAFT, target_gguf, tmp_path / "d.gguf").output
    vocab = L.read_vocabulary(target_gguf)
    bins = L.find_binaries(llama.bin)
    alone = L.run_target(bins, target_gguf, PROMPTS[0], vocab=vocab, max_new_tokens=40)
    prompt = tmp_path / "prompt.txt"
    prompt.write_bytes(PROMPTS[0].encode() + b"\n")
    args = L.speculative_args(target_gguf, draft, prompt, spec_type="draft-dflash", n_max=7,
                              max_new_tokens=40)
    for _ in range(L.ATTEMPTS):
        done = subprocess.run([str(bins.speculative), *args], capture_output=True, timeout=120,
                              stdin=subprocess.DEVNULL, env=log_drain.environment())
        if b"graphs reused" in done.stderr.splitlines()[-1]:
            break
    log = done.stderr
    parsed = L.parse_speculative(log, alone.prompt_ids, spec_type="draft-dflash", vocab=vocab,
                                 n_max=7, max_new_tokens=40, logged=False)
    assert parsed.drafts and all(set(d.tokens) == {L.UNLOGGED} for d in parsed.drafts)
    called = log.index(b" D spec common_specu: called impl")
    start = log.rindex(b"\n", 0, called) + 1
    stamp = log[start:called]
    forged = (log[:start] + stamp + b" D  - seq_id 0, draft candidate   0, pos   0:    "
              b"   5 (   1.000) '" + vocab.special[5] + b"'\n" + log[start:])
    with pytest.raises(EngineOutputError) as info:
        L.parse_speculative(forged, alone.prompt_ids, spec_type="draft-dflash", vocab=vocab,
                            n_max=7, max_new_tokens=40, logged=False)
    assert info.value.exit_code == 113 and "draft candidate" in info.value.message
    run = L.SpeculativeRun(spec_type="draft-dflash", drafts=parsed.drafts,
                           output_ids=parsed.output_ids, text=done.stdout, stats=parsed.stats,
                           seconds=1.0, decode_tokens=parsed.decode_tokens,
                           decode_seconds=parsed.decode_seconds)

    def propose(context, anchor):
        return S.dflash2_drafts(target, drafter, context, anchor, window="llama.cpp")

    resolved, where = L.resolve_unlogged(run, alone.prompt_ids, vocab, propose)
    assert where is None and len(resolved.drafts) == len(parsed.drafts)
    # The printed text of the first accepted draft changed: that cycle, its first position.
    d = next(d for d in resolved.drafts if d.accepted)
    piece = vocab.special[d.tokens[0]]
    echoed = vocab.text(alone.prompt_ids, special=True)
    before = vocab.text(d.committed[len(alone.prompt_ids):d.context_length + 1], special=True)
    offset = done.stdout.index(echoed) + len(echoed) + len(before)
    assert done.stdout[offset:offset + len(piece)] == piece
    other = done.stdout[:offset] + b"\x00" * len(piece) + done.stdout[offset + len(piece):]
    _, where = L.resolve_unlogged(dataclasses.replace(run, text=other), alone.prompt_ids,
                                  vocab, propose)
    assert where == (d.call, 0)


def test_the_key_table_is_what_is_written_and_documented(built, tmp_path):
    """Every key the file holds is a row of artifact/llama_cpp_dflash2.py's table (the
    target's tokenizer keys aside), in its order, and docs/ENGINES.md shows each row."""
    from support.paths import ROOT

    from dspark_convert.formats.gguf_reader import read_gguf

    _, _, target = built
    written = read_gguf(export_dflash2_llama_cpp(DRAFT, target, tmp_path / "d.gguf").output)
    keys = [k for k in written.kv if not k.startswith("tokenizer.")]
    rows = [k for k, _, _ in D.key_doc_rows() if not k.startswith("tokenizer.")]
    assert keys == rows
    for key in written.kv:
        if not key.startswith("tokenizer."):
            spec = next((k for k in D.KEYS if k.key == key), None)
            assert spec is None or written.kv[key].type == spec.type, key
    docs = (ROOT / "docs" / "ENGINES.md").read_text()
    for key, kind, doc in D.key_doc_rows():
        assert f"| `{key}` | {kind} | {doc} |" in docs, key
