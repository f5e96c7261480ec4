"""BF16 rounding and the finite-value scan, against torch as the oracle."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from dspark_convert.formats import numerics


def _torch_bf16_bits(values: np.ndarray) -> np.ndarray:
    return torch.from_numpy(values.astype(np.float32)).to(torch.bfloat16).view(torch.uint16).numpy()


@settings(max_examples=200, deadline=None)
@given(arrays(np.float32, st.integers(0, 300),
              elements=st.floats(width=32, allow_nan=False, allow_infinity=False)))
def test_round_to_bf16_matches_torch(values):
    ours = numerics.round_to_bf16(values)
    assert np.array_equal(ours, _torch_bf16_bits(values))


def test_round_to_bf16_ties_to_even_and_f16():
    ties = np.array([1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, -1.0 - 2 ** -8], dtype=np.float32)
    assert np.array_equal(numerics.round_to_bf16(ties), _torch_bf16_bits(ties))
    halves = np.array([0.1, -2.5, 65504.0], dtype=np.float16)
    assert np.array_equal(numerics.round_to_bf16(halves), _torch_bf16_bits(halves.astype(np.float32)))


def test_first_non_finite_bf16():
    bits = _torch_bf16_bits(np.array([1.0, -2.0, 3.0, 4.0], dtype=np.float32))
    assert numerics.first_non_finite(bits, "BF16") is None
    for bad in (0x7F80, 0xFF80, 0x7FC0, 0x7F81):      # +inf, -inf, qNaN, sNaN
        b = bits.copy()
        b[2] = bad
        assert numerics.first_non_finite(b, "BF16") == 2
    assert numerics.describe_value(np.array([0x7F80], dtype=np.uint16), 0, "BF16") == "inf"


def test_first_non_finite_across_chunks(monkeypatch):
    monkeypatch.setattr(numerics, "CHUNK_ELEMENTS", 4)
    values = np.ones(11, dtype=np.float32)
    values[9] = np.nan
    assert numerics.first_non_finite(values, "F32") == 9
    assert numerics.first_non_finite(np.ones(11, dtype=np.float16), "F16") is None
