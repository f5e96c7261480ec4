"""The proposal check (evaluation/proposals.py): the reference runtime's proposal
from a committed context and an anchor, and the comparison that names the first difference.

The reference side is checked against DeepSeek's own traces (reference.json: the first
proposal after the prompt), and the comparison against drafts made from the reference's
own proposals, read one row late or with one token changed, as an engine that departs
from the layout would make them."""

from __future__ import annotations

import json

import pytest

from support.paths import GOLDEN_TARGET, TRAINED_DRAFTERS

from dspark_convert.evaluation.proposals import (
    EngineDraft,
    ReferenceProposer,
    check_proposals,
    row_offset,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _models(artifact):
    import torch

    from dspark_convert.runtime.drafter import DSparkDrafter
    from dspark_convert.runtime.qwen3 import Qwen3Target
    from dspark_convert.runtime.weights import load_drafter_weights

    cpu = torch.device("cpu")
    target = Qwen3Target(GOLDEN_TARGET, device=cpu)
    drafter = DSparkDrafter(load_drafter_weights(artifact), embed=target.embed,
                            lm_head=target.lm_head, device=cpu)
    return target, drafter


@pytest.fixture(scope="module")
def models(paired_artifacts):
    return {name: _models(paired_artifacts[name]) for name in TRAINED_DRAFTERS}


def _greedy_runs(name):
    trace = json.loads((TRAINED_DRAFTERS[name].parent / "reference.json").read_text())
    return [r for r in trace["runs"] if r["temperature"] == 0 and r["confidence_threshold"] == 0]


@pytest.mark.parametrize("name", sorted(TRAINED_DRAFTERS))
def test_the_reference_proposal_is_deepspecs_first_block(models, name):
    """Context = the prompt, anchor = the target's token after it: DeepSpec's first cycle."""
    proposer = ReferenceProposer(*models[name])
    for run in _greedy_runs(name):
        prompt = run["prompt"]
        anchor = run["output_ids"][len(prompt)]
        assert list(proposer.propose(prompt, anchor)) == run["cycles"][0]["proposed"]


def test_growing_contexts_are_extended_as_a_fresh_computation_gives_them(models):
    """Each context extends the last (what an engine's cycles commit): the incremental
    cells give the proposals a fresh proposer gives; a context that is not an extension
    starts afresh."""
    target, drafter = models["vanilla_conf_markov"]
    run = _greedy_runs("vanilla_conf_markov")[0]
    out = run["output_ids"]
    P = len(run["prompt"])
    steps = [(out[:n], out[n]) for n in (P - 1, P, P + 3, P + 4, P + 9)] + [(out[:P - 2], out[P - 2])]
    incremental = ReferenceProposer(target, drafter)
    for context, anchor in steps:
        got = incremental.propose(context, anchor)
        assert got == ReferenceProposer(target, drafter).propose(context, anchor)


def _drafts(models, shift=0, change=None):
    """Engine drafts of the first four prefixes of a trace: the reference's own proposals,
    read ``shift`` rows late, or with position ``change`` replaced."""
    target, drafter = models["vanilla_conf_markov"]
    run = _greedy_runs("vanilla_conf_markov")[0]
    out, P = run["output_ids"], len(run["prompt"])
    proposer = ReferenceProposer(target, drafter)
    drafts = []
    for call, n in enumerate(range(P - 1, P + 3), start=1):
        ref = proposer.propose(out[:n], out[n])
        tokens = list(ref[shift:]) if shift else list(ref)
        if change is not None and call == 2:
            tokens[change] = (tokens[change] + 1) % 400
        drafts.append(EngineDraft(call=call, context=tuple(out[:n]), anchor=out[n],
                                  tokens=tuple(tokens)))
    return drafts, proposer


def test_equal_drafts_compare_equal(models):
    drafts, proposer = _drafts(models)
    check = check_proposals(drafts, proposer)
    assert (check.compared, check.equal, check.first_difference) == (4, 4, None)
    assert check.positions_equal == check.positions_compared == [4] * 7


def test_a_block_read_one_row_late_shows_at_the_first_draft(models):
    drafts, proposer = _drafts(models, shift=1)
    check = check_proposals(drafts, proposer)
    d = check.first_difference
    assert check.compared == 4 and check.equal < 4
    assert d.draft_call == 1 and d.row_offset == 1
    assert d.engine_token == d.engine_draft[d.position] != d.reference_token
    assert d.engine_draft == d.reference_draft[1:]
    assert d.context_tokens == len(drafts[0].context) and d.anchor == drafts[0].anchor


def test_one_changed_token_is_named_with_its_call_and_position(models):
    drafts, proposer = _drafts(models, change=3)
    check = check_proposals(drafts, proposer)
    d = check.first_difference
    assert (check.compared, check.equal) == (4, 3)
    assert (d.draft_call, d.position, d.row_offset) == (2, 3, None)
    assert d.engine_token == (d.reference_token + 1) % 400
    assert check.positions_equal[3] == 3 and check.positions_equal[2] == 4


def test_an_empty_draft_is_not_compared(models):
    drafts, proposer = _drafts(models)
    empty = EngineDraft(call=9, context=drafts[-1].context, anchor=drafts[-1].anchor, tokens=())
    assert check_proposals([*drafts, empty], proposer).compared == 4


@pytest.mark.parametrize("engine, reference, offset", [
    ([2, 3, 4], [1, 2, 3, 4], 1),
    ([3, 4], [1, 2, 3, 4], 2),
    ([1, 2, 3], [1, 2, 3], None),       # equal is not an offset
    ([9, 3, 4], [1, 2, 3, 4], None),
    ([5], [5], None),                   # nothing left to compare at an offset
])
def test_row_offset(engine, reference, offset):
    assert row_offset(engine, reference) == offset
