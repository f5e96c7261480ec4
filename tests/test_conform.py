"""`dspark conform` (commands/conform.py, the check in evaluation/proposals.py), on real
artifacts and targets: DeepSeek's own drafts (reference.json, written as a trace) conform,
for both families and both of DeepSeek's drafters each; a draft read one row late is named
with row_offset 1; every head type the reference runs (vanilla, gated, rnn, none, with and
without a confidence head) conforms on the reference runtime's own drafts; the prefix
sharing gives what a fresh computation gives, in any order of the lines (Gemma4's sliding
layers included); the CLI's exit codes, JSON and report."""

from __future__ import annotations

import json
import random

import pytest
from hostile.conform_corpus import deepseek_trace, lines_text
from support.cli import assert_refused, run_cli, temp_siblings
from support.gemma4 import GEMMA4, GEMMA4_DRAFTERS, GEMMA4_TARGET
from support.paths import GOLDEN, GOLDEN_TARGET

from dspark_convert.errors import (
    ConformInputError,
    DraftMismatchError,
    MemoryBudgetError,
    OutputExistsError,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# name -> (reference.json of DeepSeek's own runs, its target)
DEEPSEEK = {
    "vanilla_conf_markov": (GOLDEN / "reference" / "vanilla_conf_markov" / "reference.json", GOLDEN_TARGET),
    "dflash_shared": (GOLDEN / "reference" / "dflash_shared" / "reference.json", GOLDEN_TARGET),
    "gemma4_vanilla_conf_markov": (GEMMA4 / "gemma4_vanilla_conf_markov" / "reference.json", GEMMA4_TARGET),
    "gemma4_dflash": (GEMMA4 / "gemma4_dflash" / "reference.json", GEMMA4_TARGET),
}


@pytest.fixture(scope="module")
def artifacts(paired_artifacts, tmp_path_factory):
    """Every DeepSeek drafter converted with its target (the pairing recorded)."""
    from dspark_convert.commands.convert import convert

    out = dict(paired_artifacts)
    root = tmp_path_factory.mktemp("conform-gemma4")
    for name, src in GEMMA4_DRAFTERS.items():
        out[name] = root / name
        convert(src, out[name], target=GEMMA4_TARGET)
    return out


def write_trace(path, records):
    path.write_text(lines_text(records))
    return path


def conform(artifact, target, trace, **kw):
    from dspark_convert.commands.conform import run_conform

    return run_conform(artifact, target=target, trace=trace, device="cpu", **kw)


# --- DeepSeek's own drafts --------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(DEEPSEEK))
def test_deepseeks_own_drafts_conform(artifacts, tmp_path, name):
    """Every temperature-0 cycle of DeepSpec's own runs (the cutoff off and at 0.5: drafts
    of every length), from the context it was drafted after: all equal, at every position.
    The runs at both thresholds commit the same tokens (lossless), so their contexts are
    prefixes of one sequence a prompt: the target runs each prompt's longest context once."""
    reference, target = DEEPSEEK[name]
    records = deepseek_trace(reference)
    result = conform(artifacts[name], target, write_trace(tmp_path / "t.jsonl", records))
    c = result.check
    assert result.conforms and c.first_difference is None
    assert c.compared == c.equal == result.lines == len(records) > 10
    assert c.positions_compared[0] == len(records) and c.positions_equal == c.positions_compared
    cut = any(r["confidence_threshold"] > 0 for r in json.loads(reference.read_text())["runs"])
    assert cut == ("dflash" not in name) and (min(len(r["draft"]) for r in records) < 7) == cut
    assert result.agreement_by_position == [1.0] * 7
    # The target runs each distinct prefix of the contexts once (the nodes of their trie:
    # both prompts begin with token 1).
    cells = [r["context"][:-1] for r in records]
    assert result.target_tokens == len({tuple(c[:k]) for c in cells for k in range(1, len(c) + 1)})
    assert result.context_tokens == sum(len(r["context"]) - 1 for r in records) > 3 * result.target_tokens


@pytest.mark.parametrize("name", ["vanilla_conf_markov", "gemma4_vanilla_conf_markov"])
def test_a_draft_read_one_row_late_is_named_with_row_offset_1(artifacts, tmp_path, name):
    """DeepSeek's drafts, each read one row late (what llama.cpp's draft-dflash does with
    DeepSeek's block): 97, naming line 1, position 0, both tokens and row_offset 1; the
    report is written."""
    reference, target = DEEPSEEK[name]
    trace = write_trace(tmp_path / "late.jsonl", deepseek_trace(reference, shift=1))
    out = tmp_path / "report"
    proc = run_cli("conform", str(artifacts[name]), "--target", str(target), "--trace", str(trace),
                   "-o", str(out), "--device", "cpu", "--json")
    first = deepseek_trace(reference)[0]
    line = assert_refused(proc, DraftMismatchError, [
        str(trace), "line 1 (id run0/cycle0), position 0", f"the engine drafted {first['draft'][1]}",
        f"the reference {first['draft'][0]}", "read 1 row(s) late (row_offset 1)",
        "the reference's logit margin"])
    doc = json.loads(proc.stdout)
    d = doc["check"]["first_difference"]
    assert (doc["ok"], doc["error"], doc["exit_code"]) == (False, "DraftMismatchError", 97)
    assert (d["line"], d["position"], d["row_offset"], d["near_tie"]) == (1, 0, 1, False)
    assert d["engine_draft"][:6] == d["reference_draft"][1:] and d["reference_margin"] > 0.01
    assert doc["check"]["equal"] < doc["check"]["compared"]
    saved = json.loads((out / "report.json").read_text())
    assert saved["conforms"] is False and saved["check"] == doc["check"]
    assert "row_offset 1" in (out / "report.md").read_text() and line.startswith("error: trace ")


def test_one_changed_token_is_named_with_its_line_position_and_margin(artifacts, tmp_path):
    from dspark_convert.evaluation.proposals import NEAR_TIE

    reference, target = DEEPSEEK["vanilla_conf_markov"]
    records = deepseek_trace(reference)
    deepseeks = records[4]["draft"][3]
    records[4]["draft"][3] = (deepseeks + 1) % 512
    records[9]["draft"][0] = (records[9]["draft"][0] + 1) % 512     # a later line differs too
    result = conform(artifacts["vanilla_conf_markov"], target, write_trace(tmp_path / "t.jsonl", records))
    d, c = result.check.first_difference, result.check
    assert (d.line, d.id, d.position, d.row_offset) == (5, records[4]["id"], 3, None)
    assert d.engine_token == records[4]["draft"][3] and d.reference_token == deepseeks
    assert d.anchor == records[4]["context"][-1] and d.context_tokens == len(records[4]["context"]) - 1
    assert d.reference_margin > 0 and d.near_tie == (d.reference_margin < NEAR_TIE)
    assert (c.compared, c.equal) == (len(records), len(records) - 2)
    assert c.positions_equal[3] == c.positions_compared[3] - 1 and c.positions_equal[0] == c.positions_compared[0] - 1
    from dspark_convert.commands.conform import conform_failure
    failure = conform_failure(result)
    assert failure.exit_code == 97 and "2 of " in failure.message and "line 5" in failure.message


# --- every head type, on the reference runtime's own drafts ----------------------------------

def _drafter_for_golden_target(root, *, markov, confidence, with_markov, seed):
    """A drafter of the golden target's geometry with this head (random weights, the
    target's embedding and head as DeepSpec's training copies them), converted with it."""
    from safetensors.torch import load_file

    from dspark_convert.commands.convert import convert
    from dspark_convert.synthetic import synthetic_config, synthetic_tensors, write_checkpoint

    cfg = synthetic_config(hidden_size=64, intermediate_size=128, head_dim=16, vocab_size=512,
                           mask_token_id=500, markov_rank=16 if markov else 0,
                           markov_head_type=markov, enable_confidence_head=confidence,
                           confidence_head_with_markov=with_markov if confidence else None)
    tensors = synthetic_tensors(cfg, seed=seed)
    target = load_file(GOLDEN_TARGET / "model.safetensors")
    tensors["embed_tokens.weight"] = target["model.embed_tokens.weight"].float().numpy()
    tensors["lm_head.weight"] = target["lm_head.weight"].float().numpy()
    write_checkpoint(root / "src", cfg, tensors)
    convert(root / "src", root / "art", target=GOLDEN_TARGET)
    return root / "art"


HEADS = {"gated": ("gated", True, True), "rnn": ("rnn", True, False),
         "vanilla-no-confidence": ("vanilla", False, None), "none-confidence": (None, True, False)}


@pytest.mark.parametrize("head", sorted(HEADS))
def test_every_head_type_conforms_on_the_reference_runtimes_own_drafts(tmp_path, head):
    """The reference runtime as the engine (`dspark smoke --trace`, the reference.json
    format, at the cutoff off and at 0.5 where the drafter has a confidence head): its
    drafts conform; read one row late, row_offset 1."""
    from dspark_convert.commands.smoke import run_smoke

    markov, confidence, with_markov = HEADS[head]
    art = _drafter_for_golden_target(tmp_path, markov=markov, confidence=confidence,
                                     with_markov=with_markov, seed=len(head))
    records = []
    for threshold in ([0.0, 0.5] if confidence else [0.0]):
        smoke = tmp_path / f"smoke-{threshold}.json"
        run_smoke(art, target=GOLDEN_TARGET, prompts=[[1, 17, 33, 90, 250], [1, 300, 301]],
                  max_new_tokens=24, confidence_threshold=threshold, device="cpu", trace=smoke)
        records += deepseek_trace(smoke)
    result = conform(art, GOLDEN_TARGET, write_trace(tmp_path / "t.jsonl", records))
    assert result.markov_head == (markov or "none")
    assert result.conforms and result.check.compared == len(records) > 8
    late = [{**r, "draft": r["draft"][1:] + r["draft"][-1:]} for r in records if len(r["draft"]) > 1]
    d = conform(art, GOLDEN_TARGET, write_trace(tmp_path / "late.jsonl", late)).check.first_difference
    assert d is not None and d.line == 1 and d.row_offset == 1


# --- the prefix sharing -----------------------------------------------------------------------

def _proposer(artifact, target_dir):
    import torch

    from dspark_convert.commands.binding import bind, open_run_target
    from dspark_convert.evaluation.proposals import ReferenceProposer
    from dspark_convert.runtime.weights import load_drafter_weights

    binding = bind(artifact, open_run_target(target_dir))
    cpu = torch.device("cpu")
    model = binding.runtime.Target(binding.target_plan.directory, device=cpu,
                                   plan=binding.target_plan)
    drafter = binding.runtime.Drafter(load_drafter_weights(artifact, plan=binding.drafter_plan),
                                      embed=model.embed, lm_head=model.lm_head, device=cpu)
    return ReferenceProposer(model, drafter), (model, drafter)


@pytest.mark.parametrize("name", ["vanilla_conf_markov", "gemma4_vanilla_conf_markov"])
def test_cropped_and_extended_contexts_give_what_a_fresh_computation_gives(artifacts, name):
    """Contexts in a random order (extensions, prefixes, other prompts, one longer than
    Gemma4's sliding window of 8), each from the proposer that cropped the last one back:
    the same draft as a fresh proposer's, the same logits to float32 rounding."""
    import torch

    from dspark_convert.evaluation.proposals import ReferenceProposer

    reference, target = DEEPSEEK[name]
    contexts = [r["context"] for r in deepseek_trace(reference)] + [[1, 5], [9]]
    random.Random(3).shuffle(contexts)
    shared, models = _proposer(artifacts[name], target)
    for ctx in contexts:
        got = shared.propose(ctx[:-1], ctx[-1])
        fresh = ReferenceProposer(*models)
        assert got == fresh.propose(ctx[:-1], ctx[-1]), ctx
        torch.testing.assert_close(shared.logits, fresh.logits, atol=2e-5, rtol=0)
    assert shared.target_tokens < sum(len(c) - 1 for c in contexts)
    assert max(len(c) for c in contexts) > 8


def test_the_result_does_not_depend_on_the_order_of_the_lines(artifacts, tmp_path):
    reference, target = DEEPSEEK["dflash_shared"]
    records = deepseek_trace(reference)
    records[7]["draft"][2] = (records[7]["draft"][2] + 5) % 400
    records[2]["draft"][5] = (records[2]["draft"][5] + 5) % 400
    ordered = conform(artifacts["dflash_shared"], target, write_trace(tmp_path / "a.jsonl", records))
    shuffled = list(records)
    random.Random(5).shuffle(shuffled)
    other = conform(artifacts["dflash_shared"], target, write_trace(tmp_path / "b.jsonl", shuffled))
    first = ordered.check.first_difference
    assert first.line == 3 and first.id == records[2]["id"]
    d = other.check.first_difference
    assert d.line == min(shuffled.index(records[i]) for i in (2, 7)) + 1
    assert (other.check.compared, other.check.equal, other.check.positions_equal) == \
        (ordered.check.compared, ordered.check.equal, ordered.check.positions_equal)
    assert other.target_tokens == ordered.target_tokens


def test_the_drafter_crops_its_context_cells(artifacts):
    """DSparkDrafter.crop(n) keeps the first n cells: the cells added after it are those a
    fresh drafter computes for the same features."""
    import torch

    _, (model, drafter) = _proposer(artifacts["vanilla_conf_markov"], GOLDEN_TARGET)
    from dspark_convert.runtime.qwen3 import KVCache

    ids = torch.tensor([1, 17, 33, 90, 250, 7, 7, 401])
    out = model.forward(ids, KVCache(), keep=drafter.hidden_state_indices)
    feats = drafter.features(out.hidden_states)
    drafter.reset()
    drafter.add_context(feats)
    whole = [k.clone() for k in drafter.ctx_keys]
    drafter.crop(3)
    assert drafter.length == 3 and all(k.shape[1] == 3 for k in drafter.ctx_keys)
    drafter.add_context(feats[3:])
    for a, b in zip(drafter.ctx_keys, whole):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    drafter.crop(0)
    assert drafter.length == 0 and drafter.ctx_keys == [None] * drafter.layers
    with pytest.raises(ValueError, match="expected 0..0"):
        drafter.crop(1)


# --- the command line ------------------------------------------------------------------------

def test_conforming_drafts_exit_0_with_json_and_a_report(artifacts, tmp_path):
    reference, target = DEEPSEEK["gemma4_dflash"]
    trace = write_trace(tmp_path / "t.jsonl", deepseek_trace(reference))
    out = tmp_path / "report"
    proc = run_cli("conform", str(artifacts["gemma4_dflash"]), "--target", str(target), "--trace",
                   str(trace), "-o", str(out), "--device", "cpu", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] is True and doc["conforms"] is True and doc["family"] == "gemma4-dspark"
    assert doc["agreement_by_position"] == [1.0] * 7 and doc["report"] == str(out)
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "report.md"]
    md = (out / "report.md").read_text()
    assert "every draft equals the reference runtime's" in md and "| agreement |" in md
    proc = run_cli("conform", str(artifacts["gemma4_dflash"]), "--target", str(target), "--trace",
                   str(trace), "--device", "cpu")
    assert proc.returncode == 0 and "CONFORMS" in proc.stdout and "agreement by position: 1.00" in proc.stdout


@pytest.mark.parametrize("args, error, needle", [
    (["--device", "tpu"], ConformInputError, "--device: expected one of auto, cpu, cuda"),
    (["--dtype", "float16"], ConformInputError, "--dtype: expected one of float32, bfloat16"),
    (["--max-memory", "lots"], ConformInputError, "--max-memory"),
    (["--max-memory", "1KB"], MemoryBudgetError, "memory"),
])
def test_bad_options_are_refused(artifacts, tmp_path, args, error, needle):
    trace = write_trace(tmp_path / "t.jsonl", deepseek_trace(DEEPSEEK["vanilla_conf_markov"][0]))
    out = tmp_path / "report"
    proc = run_cli("conform", str(artifacts["vanilla_conf_markov"]), "--target", str(GOLDEN_TARGET),
                   "--trace", str(trace), "-o", str(out), *args)
    assert_refused(proc, error, [needle])
    assert not out.exists() and temp_siblings(out) == []


def test_the_report_directory_is_checked_before_the_trace_is_read(artifacts, tmp_path):
    """The one output rule first: an existing report directory (30), or one inside the
    artifact, is refused before a (here malformed) trace or the target is read."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    existing = tmp_path / "report"
    existing.mkdir()
    art = artifacts["vanilla_conf_markov"]
    for out in (existing, art / "report"):
        proc = run_cli("conform", str(art), "--target", str(GOLDEN_TARGET), "--trace", str(bad),
                       "-o", str(out))
        assert_refused(proc, OutputExistsError, [str(out)])
    assert not (art / "report").exists() and list(existing.iterdir()) == []
