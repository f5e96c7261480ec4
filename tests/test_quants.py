"""formats/quants.py: gguf-py's quantizers, streamed in row chunks, with the refusals and
checks a converter needs around them.

The oracle is gguf-py itself applied to the whole tensor at once (what Strata's
tools/dflash_quantize.py calls): the chunked bytes must equal it bit for bit.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from dspark_convert.errors import (NonFiniteTensorError, QuantRowWidthError,
                                   QuantScaleOverflowError, QuantTypeError)
from dspark_convert.formats import quants
from dspark_convert.formats.gguf_reader import read_gguf

TYPES = quants.QUANT_TYPES


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> BF16 bit patterns, nearest-even (as torch rounds)."""
    u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    return ((u + (np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1)))) >> 16).astype(np.uint16)


def whole_tensor_oracle(bits: np.ndarray, qtype: str) -> np.ndarray:
    """gguf-py on the whole tensor, from the BF16 bits widened to float32."""
    widened = (bits.astype(np.uint32) << 16).view(np.float32)
    return gguf_quantize(widened, GGMLQuantizationType[qtype])


def chunked(bits: np.ndarray, qtype: str, rows_per_feed: int) -> tuple[bytes, quants.QuantError]:
    ne1, ne0 = bits.shape
    q = quants.TensorQuantizer([ne0, ne1], qtype, tensor="t", label="x.gguf")
    out = b"".join(q.feed(bits[r:r + rows_per_feed]).tobytes() for r in range(0, ne1, rows_per_feed))
    return out, q.finish()


def hostile_matrix(rng, rows: int, cols: int) -> np.ndarray:
    """Weights with what trips block quantizers: outliers, an all-zero block, a block whose
    largest magnitude is negative, tiny values, exact ties for the block maximum."""
    x = rng.standard_normal((rows, cols)).astype(np.float32) * 0.02
    x[0, :32] = 0.0
    x[1, 32:64] = -np.abs(x[1, 32:64])
    x[1, 40] = -3.5
    x[2, :] *= 1e-30
    x[3, 5] = 250.0
    x[4, :32] = 0.5
    x[4, 7] = -0.5
    return x


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("rows_per_feed", [1, 3, 16, 17, 64])
def test_chunked_bytes_equal_gguf_py_on_the_whole_tensor(qtype, rows_per_feed):
    rng = np.random.default_rng(13)
    bits = bf16_bits(hostile_matrix(rng, 64, 96))
    got, _ = chunked(bits, qtype, rows_per_feed)
    want = whole_tensor_oracle(bits, qtype)
    assert want.dtype == np.uint8 and want.shape == (64, 96 // 32 * GGML_QUANT_SIZES[GGMLQuantizationType[qtype]][1])
    assert got == want.tobytes()


@pytest.mark.parametrize("qtype", TYPES)
def test_chunked_bytes_equal_gguf_py_on_a_trained_matrix(converted, qtype):
    """The golden reference drafter's fc.weight (DeepSpec-trained BF16), fed a few rows at
    a time, gives exactly gguf-py's bytes for the whole matrix."""
    gguf = read_gguf(converted["reference"] / "drafter.gguf")
    info = next(t for t in gguf.tensors if t.name == "fc.weight")
    raw = (converted["reference"] / "drafter.gguf").read_bytes()
    bits = np.frombuffer(raw[info.data_offset:info.data_offset + info.nbytes], "<u2")
    bits = bits.reshape(info.shape[1], info.shape[0])
    got, _ = chunked(bits, qtype, 5)
    assert got == whole_tensor_oracle(bits, qtype).tobytes()


@pytest.mark.parametrize("qtype", TYPES)
def test_dequantize_is_gguf_py_and_the_error_is_measured_against_bf16(qtype):
    rng = np.random.default_rng(5)
    bits = bf16_bits(rng.standard_normal((40, 128)).astype(np.float32) * 0.05)
    packed, error = chunked(bits, qtype, 7)
    back = quants.dequantize(packed, qtype, 128)
    oracle = gguf_dequantize(np.frombuffer(packed, np.uint8).reshape(40, -1),
                             GGMLQuantizationType[qtype])
    assert np.array_equal(back, oracle)
    ref = quants.bf16_to_float32(bits).astype(np.float64)
    diff = back.astype(np.float64) - ref
    assert error.max_abs == float(np.abs(diff).max())
    assert math.isclose(error.rel_rms, math.sqrt((diff ** 2).sum() / (ref ** 2).sum()), rel_tol=1e-9)
    # The precision ordering a release engineer relies on, on the same values.
    bound = {"Q8_0": 0.01, "Q5_0": 0.06, "Q4_0": 0.12}[qtype]
    assert 0 < error.rel_rms < bound


def test_round_trip_is_exact_for_values_on_the_grid():
    """Q8_0 with a power-of-two scale and integer multiples of it: nothing to round."""
    d = 2.0 ** -7
    ints = np.tile(np.arange(-127, 128, 8, dtype=np.float32), 2)[:32]
    ints[0] = 127.0      # the block maximum defines d = 127 d / 127
    values = np.tile(ints * d, (3, 1))
    bits = bf16_bits(values)
    packed, error = chunked(bits, "Q8_0", 1)
    assert np.array_equal(quants.dequantize(packed, "Q8_0", 32), values)
    assert error.max_abs == 0.0 and error.rel_rms == 0.0


def test_all_zero_tensor_round_trips_to_zero_with_zero_error():
    bits = np.zeros((4, 64), np.uint16)
    for qtype in TYPES:
        packed, error = chunked(bits, qtype, 2)
        assert not quants.dequantize(packed, qtype, 64).any()
        assert error == quants.QuantError(0.0, 0.0)


def test_sizes_are_ggmls():
    for qtype in TYPES:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
        assert block == quants.BLOCK_SIZE
        assert quants.type_size(qtype) == size
        assert quants.tensor_nbytes([2560, 9728], qtype) == 2560 // 32 * size * 9728


def test_type_names_are_normalised_and_others_refused():
    assert quants.quant_type("q8_0") == "Q8_0" and quants.quant_type(" Q4_0 ") == "Q4_0"
    for bad in ("q6_k", "bf16", "F32", "q8"):
        with pytest.raises(QuantTypeError) as exc:
            quants.quant_type(bad)
        assert exc.value.exit_code == 84 and "q8_0, q5_0, q4_0" in exc.value.message


# --- refusals ---------------------------------------------------------------------------------

def test_row_width_not_a_multiple_of_the_block_is_refused():
    with pytest.raises(QuantRowWidthError) as exc:
        quants.TensorQuantizer([80, 1], "Q8_0", tensor="conf_proj.weight", label="d.gguf")
    assert exc.value.exit_code == 81
    assert exc.value.message == ("d.gguf: tensor 'conf_proj.weight': row width (GGUF ne0) is 80, "
                                 "not a multiple of the Q8_0 block of 32 values; expected "
                                 "ne0 % 32 == 0 (keep this tensor BF16)")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_are_refused_with_their_element(bad):
    values = np.full((3, 64), 0.25, np.float32)
    values[2, 10] = bad
    q = quants.TensorQuantizer([64, 3], "Q4_0", tensor="blk.0.attn_q.weight", label="d.gguf")
    q.feed(bf16_bits(values[:2]))        # the first rows are fine
    with pytest.raises(NonFiniteTensorError) as exc:
        q.feed(bf16_bits(values[2:]))
    assert exc.value.exit_code == 24
    assert f"element {2 * 64 + 10}" in exc.value.message      # counted from the tensor's start
    assert exc.value.tensor == "blk.0.attn_q.weight"


def test_a_block_whose_scale_overflows_f16_is_refused_per_type():
    """8e6 fits Q8_0 (scale 8e6/127 < 65504) but not Q5_0 or Q4_0 (/16, /8): gguf-py would
    silently store an infinite scale."""
    values = np.full((2, 64), 0.01, np.float32)
    values[1, 40] = 8e6
    bits = bf16_bits(values)
    packed, _ = chunked(bits, "Q8_0", 2)
    assert quants.first_bad_scale(packed, "Q8_0") is None
    with np.errstate(over="ignore"):
        silent = gguf_quantize(quants.bf16_to_float32(bits), GGMLQuantizationType.Q4_0)
    assert quants.first_bad_scale(silent, "Q4_0") == 3    # gguf-py alone: an Inf scale, no error
    for qtype in ("Q5_0", "Q4_0"):
        with pytest.raises(QuantScaleOverflowError) as exc:
            chunked(bits, qtype, 1)
        assert exc.value.exit_code == 82
        assert "row 1, columns 32..63" in exc.value.message and qtype in exc.value.message


# --- block scales (validate) ------------------------------------------------------------------

@pytest.mark.parametrize("qtype", TYPES)
def test_hostile_block_scales_are_found(qtype):
    rng = np.random.default_rng(2)
    packed = bytearray(whole_tensor_oracle(bf16_bits(rng.standard_normal((4, 64)).astype(np.float32)),
                                           qtype).tobytes())
    size = quants.type_size(qtype)
    assert quants.first_bad_scale(bytes(packed), qtype) is None
    for pattern, block in ((b"\x00\x7e", 5), (b"\x00\x7c", 3), (b"\x00\xfc", 6)):  # NaN, +Inf, -Inf
        hostile = bytearray(packed)
        hostile[block * size:block * size + 2] = pattern
        assert quants.first_bad_scale(bytes(hostile), qtype) == block
        assert np.isnan(quants.block_scales(bytes(hostile), qtype)[block]) == (pattern == b"\x00\x7e")
        # fed in pieces that cut blocks anywhere (validate reads 8 MiB blocks)
        scanner = quants.ScaleScanner(qtype)
        for i in range(0, len(hostile), 7):
            scanner.feed(memoryview(bytes(hostile))[i:i + 7])
        assert scanner.first_bad == block
    clean = quants.ScaleScanner(qtype)
    clean.feed(bytes(packed[:11]))
    clean.feed(bytes(packed[11:]))
    assert clean.first_bad is None and clean.blocks == len(packed) // size


def test_rows_per_chunk_is_whole_rows_within_the_budget():
    assert quants.rows_per_chunk(12800) == quants.CHUNK_BYTES // (2 * 12800)
    assert quants.rows_per_chunk(10 ** 9) == 1
    assert quants.rows_per_chunk(32, chunk_bytes=100) == 1


def test_feeding_more_rows_than_the_tensor_has_or_too_few_is_a_bug():
    q = quants.TensorQuantizer([32, 2], "Q8_0", tensor="t", label="x")
    with pytest.raises(ValueError):
        q.feed(np.zeros(3 * 32, np.uint16))
    q.feed(np.zeros(32, np.uint16))
    with pytest.raises(ValueError):
        q.finish()
