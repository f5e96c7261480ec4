"""A Gemma 4 assistant (MTP drafter) exported for llama.cpp 0c1e570 (commands/export.py
export_assistant_llama_cpp, artifact/llama_cpp_assistant.py) and run by it with
--spec-type draft-mtp beside the reference runtime (commands/evaluate_engine
run_kind_llama_cpp): the file is llama.cpp's own converter's for the same checkpoint, its
runs lossless, every draft checked under llama.cpp's sliding window, and transformers'
window measured against it (docs/ENGINES.md, "DFlash2 and the Gemma 4 assistant in
llama.cpp"). Skipped where the llama.cpp build is missing (support/llama_cpp).

The golden Gemma4 target is converted by llama.cpp's own convert_hf_to_gguf.py, with what a
tiny test target needs of it (``CONVERT``): its tokenizer is a byte-level BPE (Gemma4Model
reads only Gemma's SentencePiece-style one: set_vocab is the GPT-2 path), its config has no
MoE field (find_hparam of moe_intermediate_size made optional, as a dense Gemma4 has it
null), and its 512 embedding rows are kept (Gemma3Model cuts token_embd to the tokenizer's
405 tokens, which llama.cpp then refuses beside the padded vocabulary)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from support.llama_cpp import engine
from support.paths import GOLDEN

from dspark_convert.commands.evaluate_engine import run_kind_llama_cpp
from dspark_convert.commands.export import export_assistant_llama_cpp
from dspark_convert.errors import LlamaCppAssistantError

pytestmark = pytest.mark.slow
GEMMA4_TARGET = GOLDEN / "reference" / "gemma4" / "target"
ASSISTANT = GOLDEN / "reference" / "gemma4_assistant" / "assistant"
# Prompts on which llama.cpp's target alone and its speculative run print the same text.
PROMPTS = ["hello world the", "a b c d e f g h i j k l m n o p q r s t u v w x y z"]

CONVERT = r"""
import runpy, sys
from pathlib import Path
src = Path(sys.argv.pop(1))
sys.path.insert(0, str(src))
sys.path.insert(1, str(src / "gguf-py"))
import conversion.base, conversion.gemma
conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
conversion.gemma.Gemma4Model.set_vocab = lambda self: self._set_vocab_gpt2()
find = conversion.base.ModelBase.find_hparam
def find_hparam(self, keys, optional=False):
    moe = keys == ["expert_intermediate_size", "moe_intermediate_size"]
    return find(self, keys, optional or moe)
conversion.base.ModelBase.find_hparam = find_hparam
cut = conversion.gemma.Gemma3Model.modify_tensors
def modify(self, data, name, bid):
    if "embed_tokens.weight" in name:
        return conversion.base.TextModel.modify_tensors(self, data, name, bid)
    return cut(self, data, name, bid)
conversion.gemma.Gemma3Model.modify_tensors = modify
sys.argv[0] = str(src / "convert_hf_to_gguf.py")
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def convert(llama, model: Path, out: Path) -> Path:
    done = subprocess.run([sys.executable, "-c", CONVERT, str(llama.source), str(model),
                           "--outtype", "bf16", "--outfile", str(out)], capture_output=True,
                          text=True, timeout=300,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    llama = engine()
    root = tmp_path_factory.mktemp("llama_assistant")
    return llama, root, convert(llama, GEMMA4_TARGET, root / "target.gguf")


@pytest.fixture(scope="module")
def models():
    from dspark_convert.runtime.gemma4 import Gemma4Target
    from dspark_convert.runtime.gemma4_assistant import Gemma4Assistant

    torch.set_num_threads(1)
    target = Gemma4Target(GEMMA4_TARGET, device=torch.device("cpu"))
    return target, Gemma4Assistant(ASSISTANT, target)


def _gguf(llama):
    sys.path.insert(0, str(llama.source / "gguf-py"))
    try:
        import gguf
        return gguf
    finally:
        sys.path.pop(0)


def test_export_is_llama_cpps_own_converters_file(built, tmp_path):
    """Key for key (but the tokenizer, which is the target's, and the name) and tensor for
    tensor, our file is what llama.cpp's converter writes for the checkpoint given the
    target's tokenizer (its embedding rows kept, as ``CONVERT`` keeps them)."""
    llama, root, target = built
    ours = export_assistant_llama_cpp(ASSISTANT, target, root / "a.gguf")
    assert (ours.spec_type, ours.n_max) == ("draft-mtp", 4)
    copy = tmp_path / "assistant"
    shutil.copytree(ASSISTANT, copy)
    shutil.copy(GEMMA4_TARGET / "tokenizer.json", copy / "tokenizer.json")
    theirs_path = convert(llama, copy, tmp_path / "converter.gguf")
    gguf = _gguf(llama)
    mine, theirs = gguf.GGUFReader(str(ours.output)), gguf.GGUFReader(str(theirs_path))

    def keys(reader):
        return {k: (f.types, f.contents()) for k, f in reader.fields.items()
                if k.startswith("gemma4-assistant.") or k in ("general.architecture",
                                                              "general.file_type")}
    assert keys(mine) == keys(theirs)
    a = {t.name: t for t in mine.tensors}
    b = {t.name: t for t in theirs.tensors}
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].tensor_type == b[name].tensor_type, name
        assert bytes(a[name].data) == bytes(b[name].data), name


def test_llama_cpp_runs_it_lossless_every_draft_under_its_window(built, models):
    llama, _, target_gguf = built
    target, assistant = models
    run = run_kind_llama_cpp(llama.bin, target_gguf, kind="gemma4-assistant",
                             drafter_dir=ASSISTANT, target=target, drafter=assistant,
                             prompts=PROMPTS[1:], max_new_tokens=60, window="llama.cpp")
    assert run.lossless
    assert run.every_draft_equal, run.prompts
    [p] = run.prompts
    assert (p.cycles, p.drafts_equal) == (15, 15)
    # transformers' window (W + 1 entries before the anchor, not W - 1) on the same drafts:
    # the measured departure.
    ref = run_kind_llama_cpp(llama.bin, target_gguf, kind="gemma4-assistant",
                             drafter_dir=ASSISTANT, target=target, drafter=assistant,
                             prompts=PROMPTS[1:], max_new_tokens=60, window="reference")
    [q] = ref.prompts
    assert (q.drafts_equal, q.first_difference) == (13, 1)


def test_refusals(built, tmp_path):
    llama, root, target = built
    qwen = llama.convert(GOLDEN / "reference" / "target", tmp_path / "qwen.gguf")
    with pytest.raises(LlamaCppAssistantError) as info:
        export_assistant_llama_cpp(ASSISTANT, qwen, tmp_path / "x.gguf")
    assert info.value.exit_code == 158 and "general.architecture" in info.value.message
    # The target's last two layers swapped in its metadata ([..., full, sliding]): llama.cpp's
    # assistant would read a full layer's KV as its sliding one's.
    swapped = _with_pattern(target, tmp_path / "swapped.gguf",
                            [True, True, False, True, False, True])
    with pytest.raises(LlamaCppAssistantError) as info:
        export_assistant_llama_cpp(ASSISTANT, swapped, tmp_path / "y.gguf")
    assert "sliding_window_pattern" in info.value.message
    assert not (tmp_path / "x.gguf").exists() and not (tmp_path / "y.gguf").exists()


def _with_pattern(source: Path, out: Path, pattern: list[bool]) -> Path:
    """``source`` with another gemma4.attention.sliding_window_pattern, tensors unchanged."""
    from gguf.constants import GGUFValueType

    from dspark_convert.artifact.format import padded
    from dspark_convert.artifact.writer import header_of
    from dspark_convert.formats.gguf_reader import read_gguf

    g = read_gguf(source)
    entries = [(k, pattern if k.endswith("sliding_window_pattern") else v.value, v.type,
                GGUFValueType.BOOL if k.endswith("sliding_window_pattern") else v.sub_type)
               for k, v in g.kv.items()]
    infos = [(t.name, list(reversed(t.shape)), t.nbytes, t.ggml_type) for t in g.tensors]
    header = header_of(g.kv["general.architecture"].value, entries, infos,
                       out.with_suffix(".header"))
    raw = source.read_bytes()
    body = b"".join(raw[t.data_offset:t.data_offset + t.nbytes] + bytes(padded(t.nbytes) - t.nbytes)
                    for t in g.tensors)
    out.write_bytes(header + body)
    return out


def test_eval_runs_the_assistant_in_llama_cpp(built, tmp_path):
    """`dspark eval ASSISTANT --engine llama.cpp=BIN --target-gguf T.gguf`: the assistant is
    exported and run with draft-mtp, every draft checked; the one difference on these
    prompts is a near tie (the reference's logit margin 0.0086), so named."""
    from support.cli import run_cli

    llama, _, target = built
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n"
                               for i, p in enumerate(["hello world the", *PROMPTS[1:]])))
    out = tmp_path / "report"
    proc = run_cli("eval", str(ASSISTANT), "--target", str(GEMMA4_TARGET), "--prompts",
                   str(prompts), "--max-new-tokens", "64", "--threshold", "0", "--engine",
                   f"llama.cpp={llama.bin}", "--target-gguf", str(target), "-o", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "report.json").read_text())
    [run] = [r for r in report["engine_runs"] if r["kind"] == "drafter"]
    assert run["spec_type"] == "draft-mtp" and run["lossless"] is True
    p = run["proposals"]
    assert (p["compared"], p["equal"]) == (38, 37)
    f = p["first_difference"]
    assert (f["prompt"], f["draft_call"], f["position"]) == ("p0", 20, 2)
    assert f["near_tie"] and f["reference_margin"] == pytest.approx(0.0086, abs=1e-4)
    # The drafts as a conform trace: one line a draft, the context and the draft.
    lines = (out / run["trace"]).read_text().splitlines()
    assert run["trace"] == "trace-llama.cpp-assistant-draft-mtp.jsonl" and len(lines) == 38
    assert all(1 <= len(json.loads(x)["draft"]) <= 4 for x in lines)


def test_export_cli_from_the_artifact_is_the_checkpoints_file(built, tmp_path):
    """`dspark export ARTIFACT --engine llama.cpp`: a converted assistant artifact exports
    to the same bytes as its checkpoint directory."""
    from support.cli import run_cli

    _, _, target = built
    art = tmp_path / "artifact"
    proc = run_cli("convert", str(ASSISTANT), "--target", str(GEMMA4_TARGET), "-o", str(art))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    outs = {}
    for name, source in (("artifact", art), ("checkpoint", ASSISTANT)):
        outs[name] = tmp_path / f"{name}.gguf"
        proc = run_cli("export", str(source), "--engine", "llama.cpp", "--target-gguf",
                       str(target), "-o", str(outs[name]), "--json")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        result = json.loads(proc.stdout)
        assert (result["kind"], result["spec_type"], result["n_max"]) == (
            "gemma4-assistant", "draft-mtp", 4)
    assert outs["artifact"].read_bytes() == outs["checkpoint"].read_bytes()


def test_the_key_table_is_what_is_written_and_documented(built, tmp_path):
    """Every key the file holds is a row of artifact/llama_cpp_assistant.py's table (the
    target's tokenizer keys aside), in its order and type, and docs/ENGINES.md shows each."""
    from support.paths import ROOT

    from dspark_convert.artifact import llama_cpp_assistant as S
    from dspark_convert.formats.gguf_reader import read_gguf

    _, _, target = built
    written = read_gguf(export_assistant_llama_cpp(ASSISTANT, target, tmp_path / "a.gguf").output)
    keys = [k for k in written.kv if not k.startswith("tokenizer.")]
    assert keys == [k for k, _, _ in S.key_doc_rows() if not k.startswith("tokenizer.")]
    for spec in S.KEYS:
        assert written.kv[spec.key].type == spec.type, spec.key
    docs = (ROOT / "docs" / "ENGINES.md").read_text()
    for key, kind, doc in S.key_doc_rows():
        assert f"| `{key}` | {kind} | {doc} |" in docs, key
