"""`dspark conform --diagnose` (evaluation/misreadings.py, runtime/misreadings.py): a trace
made by the reference runtime under one misreading of the table is diagnosed as exactly
that misreading, for each row on one family (ROWS) and the rows of both families on
Gemma4 too (BOTH, slow); DeepSeek's own drafts still conform; a pair is named when no
single misreading explains the drafts, and "none" is an answer; the table and the runtime agree; the CLI's exit codes and JSON.

The traces are the perturbed reference's greedy drafts from fixed pseudo-random contexts
(any committed tokens are a context a trace may hold), so that each misreading changes
enough drafts to be told apart from the others. ``position_minus_one`` is the one the
golden models hardly see: a block seeded one position early moves their block's hidden
states by about 1e-2 and changes a few drafts in a hundred (RoPE at theta 1e6 over a
64-wide model), so its test checks the effect on the hidden states and runs more contexts."""

from __future__ import annotations

import json
import random

import pytest
from support.cli import assert_refused, run_cli
from support.gemma4 import GEMMA4_DRAFTERS, GEMMA4_TARGET
from support.paths import GOLDEN_TARGET

from dspark_convert.errors import DraftMismatchError, MisreadingDiagnosedError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

QWEN3_DSPARK, QWEN3_DFLASH = "vanilla_conf_markov", "dflash_shared"
GEMMA4_DSPARK = "gemma4_vanilla_conf_markov"
TARGETS = {QWEN3_DSPARK: GOLDEN_TARGET, QWEN3_DFLASH: GOLDEN_TARGET, GEMMA4_DSPARK: GEMMA4_TARGET}


@pytest.fixture(scope="module")
def artifacts(paired_artifacts, tmp_path_factory):
    from dspark_convert.commands.convert import convert

    out = {k: paired_artifacts[k] for k in (QWEN3_DSPARK, QWEN3_DFLASH)}
    out[GEMMA4_DSPARK] = tmp_path_factory.mktemp("diagnose") / GEMMA4_DSPARK
    convert(GEMMA4_DRAFTERS[GEMMA4_DSPARK], out[GEMMA4_DSPARK], target=GEMMA4_TARGET)
    return out


_LOADED: dict = {}


def loaded(artifacts, name):
    """(target, faithful drafter) of an artifact, loaded once."""
    import torch

    from dspark_convert.commands.binding import bind, open_run_target
    from dspark_convert.runtime.weights import load_drafter_weights

    if name not in _LOADED:
        b = bind(artifacts[name], open_run_target(TARGETS[name]))
        cpu = torch.device("cpu")
        model = b.runtime.Target(b.target_plan.directory, device=cpu, plan=b.target_plan)
        drafter = b.runtime.Drafter(load_drafter_weights(artifacts[name], plan=b.drafter_plan),
                                    embed=model.embed, lm_head=model.lm_head, device=cpu)
        _LOADED[name] = (model, drafter)
    return _LOADED[name]


def contexts(count=60, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(3, 490) for _ in range(rng.choice([4, 9, 17, 33, 70, 140]))]
            for _ in range(count)]


def drafts_under(model, drafter, ids, ctxs):
    """The reference's greedy drafts from each context under the misreadings ``ids``."""
    from dspark_convert.evaluation.proposals import ReferenceProposer
    from dspark_convert.runtime.misreadings import UNKNOWN, misread

    d = misread(drafter, ids, target=model)
    proposer = ReferenceProposer(model, d)
    out = []
    for c in ctxs:
        d.before_anchor = c[-2]
        draft = list(proposer.propose(c[:-1], c[-1]))
        out.append([0 if t == UNKNOWN else t for t in draft])   # row_early's unknown first
    return out


def write_trace(path, ctxs, drafts):
    path.write_text("".join(json.dumps({"id": f"c{i}", "context": c, "draft": d}) + "\n"
                            for i, (c, d) in enumerate(zip(ctxs, drafts))))
    return path


def conform(artifacts, name, trace, **kw):
    from dspark_convert.commands.conform import run_conform

    return run_conform(artifacts[name], target=TARGETS[name], trace=trace, device="cpu", **kw)


# Per row: the drafter it is proved on, and the other singles that reproduce some (never all)
# of its differing drafts on these contexts.
ROWS = {
    "row_late": QWEN3_DFLASH, "row_early": QWEN3_DSPARK, "tap_plus_one": QWEN3_DSPARK,
    "tap_minus_one": QWEN3_DSPARK, "final_norm_tap": QWEN3_DSPARK,
    "markov_prev_early": QWEN3_DSPARK, "no_markov": QWEN3_DSPARK,
    "head_is_embedding": QWEN3_DSPARK, "anchor_layout": QWEN3_DSPARK,
    "no_softcap": GEMMA4_DSPARK, "no_embed_scale": GEMMA4_DSPARK, "full_rope": GEMMA4_DSPARK,
}


def test_the_table_and_the_runtime_name_the_same_misreadings():
    from dspark_convert.evaluation.misreadings import MISREADINGS
    from dspark_convert.runtime.misreadings import MISREADINGS as COMPUTED

    assert tuple(m.id for m in MISREADINGS) == COMPUTED
    assert set(ROWS) | {"position_minus_one"} == set(COMPUTED)
    for m in MISREADINGS:
        assert m.what and m.seen and m.fix and set(m.families) <= {"Qwen3", "Gemma4"}


@pytest.mark.parametrize("misreading", sorted(ROWS))
def test_a_trace_made_under_one_misreading_is_diagnosed_as_it(artifacts, tmp_path, misreading):
    _diagnosed_as(artifacts, tmp_path, misreading, ROWS[misreading])


def _diagnosed_as(artifacts, tmp_path, misreading, name):
    model, drafter = loaded(artifacts, name)
    ctxs = contexts()
    drafts = drafts_under(model, drafter, [misreading], ctxs)
    result = conform(artifacts, name, write_trace(tmp_path / "t.jsonl", ctxs, drafts),
                     diagnose=True)
    assert not result.conforms
    differing = result.check.compared - result.check.equal
    best, *rest = result.diagnosis
    assert (best.misreading, best.explains, best.of) == (misreading, differing, differing)
    assert best.misreadings == [misreading] and best.fix
    assert result.diagnosis_scope.differing == result.diagnosis_scope.diagnosed == differing
    # No other misreading, nor pair, reproduces them all.
    assert all(e.explains < differing for e in rest), [(e.misreading, e.explains) for e in rest]
    # The faithful drafter's copy was not touched: its own drafts still conform.
    faithful = drafts_under(model, drafter, [], ctxs)
    again = conform(artifacts, name, write_trace(tmp_path / "f.jsonl", ctxs, faithful),
                    diagnose=True)
    assert again.conforms and again.diagnosis is None


# The rows of both families, proved on the other family too (Gemma4: DeepSeek's Gemma4 DSpark
# drafter on its gemma4_unified target; Qwen3: DeepSeek's DSpark drafter).
BOTH = {"row_late": GEMMA4_DSPARK, "row_early": GEMMA4_DSPARK, "tap_plus_one": GEMMA4_DSPARK,
        "tap_minus_one": GEMMA4_DSPARK, "final_norm_tap": GEMMA4_DSPARK,
        "markov_prev_early": GEMMA4_DSPARK, "no_markov": GEMMA4_DSPARK,
        "anchor_layout": GEMMA4_DSPARK}
# Not position_minus_one: on the Gemma4 drafter it changes 2 of these 60 drafts, which
# tap_minus_one and no_softcap reproduce as well (indistinguishable there).


@pytest.mark.slow   # the rows above, on the other family (about a minute)
@pytest.mark.parametrize("misreading", sorted(BOTH))
def test_the_rows_of_both_families_are_diagnosed_on_gemma4(artifacts, tmp_path, misreading):
    _diagnosed_as(artifacts, tmp_path, misreading, BOTH[misreading])


def test_position_minus_one_moves_the_block_and_is_named_where_it_changes_a_draft(artifacts, tmp_path):
    import torch

    from dspark_convert.runtime.misreadings import misread

    model, drafter = loaded(artifacts, QWEN3_DSPARK)
    ctx = contexts(1, seed=3)[0]
    hidden = []
    for ids in ([], ["position_minus_one"]):
        d = misread(drafter, ids, target=model)
        d.reset()
        with torch.inference_mode():
            from dspark_convert.runtime.qwen3 import KVCache
            out = model.forward(torch.tensor(ctx[:-1]), KVCache(), keep=d.hidden_state_indices)
            d.add_context(d.features(out.hidden_states))
        hidden.append(d.block_hidden(ctx[-1]))
    assert 1e-3 < float((hidden[0] - hidden[1]).abs().max()) < 1.0
    ctxs = contexts(120)
    drafts = drafts_under(model, drafter, ["position_minus_one"], ctxs)
    result = conform(artifacts, QWEN3_DSPARK, write_trace(tmp_path / "t.jsonl", ctxs, drafts),
                     diagnose=True)
    differing = result.check.compared - result.check.equal
    assert 1 <= differing <= len(ctxs) // 10
    best, *rest = result.diagnosis
    assert (best.misreading, best.explains, best.of) == ("position_minus_one", differing, differing)
    assert all(e.explains < differing for e in rest)


def test_deepseeks_own_drafts_conform_under_diagnose(artifacts, tmp_path):
    from hostile.conform_corpus import deepseek_trace, lines_text

    from support.paths import GOLDEN

    trace = tmp_path / "deepseek.jsonl"
    trace.write_text(lines_text(deepseek_trace(GOLDEN / "reference" / QWEN3_DSPARK / "reference.json")))
    result = conform(artifacts, QWEN3_DSPARK, trace, diagnose=True)
    assert result.conforms and result.diagnosis is None
    rows = result.agreement_by_depth
    assert [r.depth for r in rows] == ["0-63"] and rows[0].rates() == [1.0] * 7
    # DeepSeek's own acceptance, read back from its trace: position 0 accepted more often
    # than position 6.
    acc = result.acceptance_by_depth[0].rates()
    assert acc[0] is not None and acc[0] >= (acc[6] or 0.0)


def test_a_pair_is_named_when_no_single_misreading_explains_the_drafts(artifacts, tmp_path):
    model, drafter = loaded(artifacts, QWEN3_DSPARK)
    ctxs = contexts(30)
    drafts = drafts_under(model, drafter, ["no_markov", "head_is_embedding"], ctxs)
    result = conform(artifacts, QWEN3_DSPARK, write_trace(tmp_path / "t.jsonl", ctxs, drafts),
                     diagnose=True)
    best = result.diagnosis[0]
    assert best.misreading == "no_markov+head_is_embedding" and best.explains == best.of
    assert all(e.explains < best.of for e in result.diagnosis[1:])


def test_none_of_the_known_misreadings_is_an_answer_too(artifacts, tmp_path):
    """Drafts no misreading makes (each draft's tokens reversed): the diagnosis is empty,
    the first difference as without it, exit 97."""
    model, drafter = loaded(artifacts, QWEN3_DSPARK)
    ctxs = contexts(12)
    drafts = [d[::-1] for d in drafts_under(model, drafter, [], ctxs)]
    trace = write_trace(tmp_path / "t.jsonl", ctxs, drafts)
    proc = run_cli("conform", str(artifacts[QWEN3_DSPARK]), "--target", str(GOLDEN_TARGET),
                   "--trace", str(trace), "--device", "cpu", "--diagnose", "--json")
    assert_refused(proc, DraftMismatchError, ["none of the known misreadings"])
    doc = json.loads(proc.stdout)
    assert doc["diagnosis"] == [] and doc["exit_code"] == 97
    assert doc["check"]["first_difference"]["line"] == 1


def test_the_cli_names_the_misreading_with_its_fix_and_exits_162(artifacts, tmp_path):
    model, drafter = loaded(artifacts, QWEN3_DSPARK)
    ctxs = contexts(12)
    trace = write_trace(tmp_path / "t.jsonl", ctxs,
                        drafts_under(model, drafter, ["no_markov"], ctxs))
    out = tmp_path / "report"
    proc = run_cli("conform", str(artifacts[QWEN3_DSPARK]), "--target", str(GOLDEN_TARGET),
                   "--trace", str(trace), "--device", "cpu", "--diagnose", "--json", "-o", str(out))
    assert_refused(proc, MisreadingDiagnosedError, ["no_markov reproduces all of the",
                                                    "fix: run the drafter on the engine's DSpark path"])
    doc = json.loads(proc.stdout)
    assert doc["exit_code"] == 162 and doc["diagnosis"][0]["misreading"] == "no_markov"
    assert doc["diagnosis"][0]["explains"] == doc["diagnosis"][0]["of"] > 0
    assert "## Diagnosis" in (out / "report.md").read_text()
    # Without --diagnose: 97, no diagnosis.
    plain = run_cli("conform", str(artifacts[QWEN3_DSPARK]), "--target", str(GOLDEN_TARGET),
                    "--trace", str(trace), "--device", "cpu", "--json")
    assert json.loads(plain.stdout)["diagnosis"] is None and plain.returncode == 97


def test_the_diagnosis_line_says_which_it_cannot_tell_apart():
    """Two candidates reproducing as many drafts are named together, then the partial ones."""
    from dspark_convert.commands.conform import ConformResult, diagnosis_line
    from dspark_convert.evaluation.misreadings import BY_ID, DiagnosisScope, Explanation

    def e(ids, n):
        return Explanation(misreading="+".join(ids), misreadings=ids, explains=n, of=4,
                           lines=[1], fix=[BY_ID[m].fix for m in ids],
                           seen=[BY_ID[m].seen for m in ids])

    scope = DiagnosisScope(differing=9, diagnosed=4, candidates=48, not_applicable={},
                           max_combined=2, max_lines=4, target_tokens=10, seconds=0.1)
    result = ConformResult.model_construct(
        diagnosis=[e(["tap_plus_one"], 4), e(["final_norm_tap"], 4), e(["tap_minus_one"], 1)],
        diagnosis_scope=scope)
    text = diagnosis_line(result)
    assert text.startswith("tap_plus_one reproduces all of the 4 differing drafts diagnosed (of 9)")
    assert "not told apart on these drafts: final_norm_tap" in text
    assert text.endswith("also reproducing some: tap_minus_one (1)")
    none = ConformResult.model_construct(diagnosis=[], diagnosis_scope=scope)
    assert diagnosis_line(none).startswith("none of the known misreadings reproduces any")
