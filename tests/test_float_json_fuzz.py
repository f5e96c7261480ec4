"""Property tests for two rules (docs/FUZZING.md): the one float rule for decoding
(runtime/sampling.py) and the one JSON writer (util/json_out.py).

- Any finite float32 logits and any temperature the rule accepts (subnormals included) give
  a distribution: finite, non-negative, summing to 1, its largest probability at the
  largest logit; where z / T is finite in float32 it is torch.softmax(z / T) bit for bit
  (DeepSpec's arithmetic, so the golden traces cannot move). Non-finite logits are refused
  with NumericOverflowError at every temperature. A temperature is accepted exactly when it
  is 0 or in (0, 100].
- Any value of JSON's types (floats of every kind, NaN and the infinities included) is
  either written as strict JSON that reads back equal, or refused with NotJSONError
  exactly when it holds a non-finite float; ``undefined`` maps exactly the non-finite to
  None.
"""

from __future__ import annotations

import json
import math
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from dspark_convert.errors import NumericOverflowError, SmokeInputError  # noqa: E402
from dspark_convert.runtime.sampling import (  # noqa: E402
    check_temperature,
    pick,
    probs_from_logits,
)
from dspark_convert.util.json_out import NotJSONError, dumps, undefined  # noqa: E402

EXAMPLES = int(os.environ.get("DSPARK_FUZZ_EXAMPLES", "200"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])

FLOAT32_MAX = 3.4028234663852886e38
finite32 = st.floats(min_value=-FLOAT32_MAX, max_value=FLOAT32_MAX, allow_nan=False,
                     allow_infinity=False, width=32)
# Every accepted positive temperature: subnormal doubles, the float32 edge, ordinary values.
temperatures = st.one_of(
    st.floats(min_value=5e-324, max_value=1e-300),
    st.floats(min_value=1e-40, max_value=1e-30),
    st.floats(min_value=1e-3, max_value=100.0),
    st.sampled_from([5e-324, 3e-38, 1e-38, 0.6, 1.0, 100.0]))
rows = st.lists(st.one_of(finite32, st.sampled_from([FLOAT32_MAX, -FLOAT32_MAX, 0.0])),
                min_size=1, max_size=64)


@FUZZ
@given(rows, temperatures)
def test_any_finite_logits_give_a_distribution(row, temperature):
    z = torch.tensor(row, dtype=torch.float32)
    p = probs_from_logits(z, temperature, what="fuzz")
    assert p.dtype == torch.float32 and bool(torch.isfinite(p).all())
    assert bool((p >= 0).all())
    assert math.isclose(float(p.double().sum()), 1.0, rel_tol=1e-5)
    assert float(p[int(z.argmax())]) == float(p.max())
    scaled = z / temperature
    if bool(torch.isfinite(scaled).all()):
        assert torch.equal(p, torch.softmax(scaled, dim=-1))
    g = torch.Generator().manual_seed(0)
    token = pick(z, temperature, g, what="fuzz")
    assert 0 <= token < len(row) and float(p[token]) > 0


@FUZZ
@given(rows, st.one_of(st.just(0.0), temperatures),
       st.sampled_from([math.nan, math.inf, -math.inf]), st.integers(0, 63))
def test_non_finite_logits_are_refused_at_every_temperature(row, temperature, bad, where):
    row = list(row)
    row[where % len(row)] = bad
    z = torch.tensor(row, dtype=torch.float32)
    with pytest.raises(NumericOverflowError, match="fuzz: the forward pass gave a non-finite"):
        probs_from_logits(z, temperature, what="fuzz")
    with pytest.raises(NumericOverflowError):
        pick(z, temperature, torch.Generator().manual_seed(0), what="fuzz")


@FUZZ
@given(st.one_of(st.floats(), st.integers(), st.booleans(), st.text(max_size=3), st.none()))
def test_a_temperature_is_zero_or_in_the_range(value):
    ok = (not isinstance(value, bool) and isinstance(value, (int, float))
          and math.isfinite(value) and 0 <= value <= 100)
    if ok:
        assert check_temperature(value, error=SmokeInputError) == float(value)
    else:
        with pytest.raises(SmokeInputError, match="--temperature"):
            check_temperature(value, error=SmokeInputError)


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=4), inner, max_size=4)),
    max_leaves=20)


def _has_non_finite(value) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, list):
        return any(_has_non_finite(v) for v in value)
    if isinstance(value, dict):
        return any(_has_non_finite(v) for v in value.values())
    return False


def _strict_loads(text: str):
    def refuse(name):
        raise AssertionError(f"the writer emitted {name}")
    return json.loads(text, parse_constant=refuse)


@FUZZ
@given(json_values, st.sampled_from([None, 1, 2]), st.booleans())
def test_the_writer_never_emits_nan(value, indent, compact):
    if _has_non_finite(value):
        with pytest.raises(NotJSONError):
            dumps(value, indent=indent, compact=compact)
        return
    text = dumps(value, indent=indent, compact=compact)
    assert _strict_loads(text) == value


@FUZZ
@given(st.one_of(st.none(), st.floats()))
def test_undefined_maps_exactly_the_non_finite_to_null(value):
    got = undefined(value)
    if value is None or not math.isfinite(value):
        assert got is None
    else:
        assert got == value


# --- the one JSON reader: a number that overflows a double is refused -----------

@FUZZ
@given(st.one_of(st.floats(allow_nan=False, allow_infinity=False).map(repr),
                 st.integers(min_value=309, max_value=99999).map(lambda e: f"1e{e}"),
                 st.integers(min_value=309, max_value=99999).map(lambda e: f"-2.5E+{e}"),
                 st.integers(min_value=1, max_value=99999).map(lambda e: f"1e-{e}")))
def test_the_reader_keeps_every_finite_number_and_refuses_an_overflow(text):
    """loads_strict (every JSON file the tool reads) gives a number's double exactly when it
    is finite: ``1e999`` is refused instead of read as infinity, the value NaN/Infinity's
    refusal keeps out; an underflow is the double it rounds to (0.0 at worst)."""
    from dspark_convert.util.strict_json import loads_strict

    expected = float(text)
    if math.isinf(expected):
        with pytest.raises(ValueError, match="too large for a double"):
            loads_strict(f'{{"tau": {text}}}')
    else:
        assert loads_strict(f'{{"tau": {text}}}') == {"tau": expected}
