"""The levels of Strata's loader findings: what --strict fails and what it does not."""

from __future__ import annotations

from dspark_convert.artifact_format import LOCAL_REVISION, Provenance, expected_metadata
from dspark_convert.contract import build_contract, parse_config
from dspark_convert.strata_rules import strata_findings
from dspark_convert.synthetic import synthetic_config

PROV = Provenance(name="x", repository=None, revision=LOCAL_REVISION, source_sha256="0" * 64,
                  embed_sha256=None, lm_head_sha256=None)


def findings(**config_args) -> dict[str, tuple[str, str]]:
    contract = build_contract(parse_config(synthetic_config(**config_args)))
    kv = expected_metadata(contract, PROV)
    tensors = [(t.gguf_name, "BF16", t.gguf_shape) for t in contract.written_tensors]
    return {f.rule: (f.level, f.message) for f in strata_findings(kv, tensors)}


def test_plain_dflash_passes_everything():
    got = findings(markov_rank=0, enable_confidence_head=False)
    assert {rule: level for rule, (level, _m) in got.items()} == {
        "loader_rules": "passed", "current_loader": "passed"}


def test_dspark_heads_are_info_not_warning():
    level, message = findings()["current_loader"]
    assert level == "info"
    assert "markov_rank 8 > 0" in message and "a confidence head" in message


def test_rms_eps_other_than_strata_is_still_a_warning():
    got = findings(rms_norm_eps=1e-5, markov_rank=0, enable_confidence_head=False)
    assert got["rms_eps"][0] == "warning" and "1e-05" in got["rms_eps"][1]
    assert got["current_loader"][0] == "passed"
