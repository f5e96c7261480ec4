"""The levels of Strata's loader findings: what --strict fails and what it does not."""

from __future__ import annotations

from dspark_convert.artifact.format import LOCAL_REVISION, Provenance, expected_metadata
from dspark_convert.contract.dspark import build_contract, parse_config
from dspark_convert.artifact.strata_rules import strata_findings
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


# --- hostile metadata: Strata's rules run even when our metadata check failed ---------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                       lambda inner: st.lists(inner, max_size=4), max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(expected_metadata(
           build_contract(parse_config(synthetic_config())), PROV)) + ["dflash.selector_top_k"]),
       _VALUES, max_size=12),
       st.lists(st.tuples(st.text(max_size=20), st.sampled_from(["BF16", "F32", "Q8_0", "Q4_1"]),
                          st.lists(st.integers(0, 2**40), max_size=3)), max_size=5))
def test_any_value_of_any_type_gives_findings_never_an_exception(kv, tensors):
    """A FLOAT64 rms eps of 1e300, a scalar for target_layers, a string for a count ... are
    findings (or nothing), never a crash: validate runs these rules on raw values."""
    for finding in strata_findings(kv, tensors):
        assert finding.level in ("passed", "info", "warning", "failed")


def test_an_rms_eps_beyond_float32_is_a_warning_not_a_crash():
    contract = build_contract(parse_config(synthetic_config(markov_rank=0, enable_confidence_head=False)))
    kv = {**expected_metadata(contract, PROV), "dflash.attention.layer_norm_rms_epsilon": 1e300}
    got = {f.rule: f for f in strata_findings(kv, [])}
    assert got["rms_eps"].level == "warning" and "1e+300" in got["rms_eps"].message
