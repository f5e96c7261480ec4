"""GGML block quantization of BF16 matrices: Q8_0, Q5_0, Q4_0 (ISSUE 13).

The arithmetic is gguf-py's own (``gguf.quants.quantize`` / ``dequantize``), applied to the
BF16 values widened exactly to float32 (the BF16 bits shifted into the high half of a
float32), which is what Strata's ``tools/dflash_quantize.py`` (``export``) does: so the
tensor bytes written here equal that tool's, bit for bit. Nothing here re-implements a
quantizer; this module adds what a converter needs around it:

- row-chunked streaming (``TensorQuantizer``): every GGML block covers 32 consecutive
  values of one row and is computed from those values alone (gguf-py's
  ``__Quant.quantize_blocks`` works block by block), so quantizing whole rows in chunks
  gives exactly the bytes of quantizing the whole tensor at once (tests/test_quants.py
  proves it against gguf-py on the whole tensor);
- the refusals gguf-py leaves to its caller: a row width (GGUF ne0) that is not a
  multiple of the 32-value block (gguf-py raises its own QuantError), a NaN/Inf value
  (gguf-py would quantize it into a NaN scale), and a block whose F16 scale overflows
  (gguf-py stores an infinite scale silently);
- the per-block scale check ``validate`` needs for a quantized tensor it did not write;
- the error of the quantized values against the BF16 ones (max absolute, relative RMS).

Block layouts (ggml-common.h, gguf-py ``GGML_QUANT_SIZES``): every type here starts each
block with its F16 scale ``d``; Q8_0 = d + 32 int8 (34 bytes), Q5_0 = d + 4 bytes of high
bits + 16 bytes of nibbles (22), Q4_0 = d + 16 bytes of nibbles (18).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as _gguf_dequantize
from gguf.quants import quantize as _gguf_quantize

from dspark_convert.errors import QuantRowWidthError, QuantScaleOverflowError, QuantTypeError
from dspark_convert.formats.numerics import non_finite_error

#: The types Strata's DFlash loader and tools/dflash_quantize.py accept for matrices.
QUANT_TYPES: tuple[str, ...] = ("Q8_0", "Q5_0", "Q4_0")
#: Values per block; the same for every type above.
BLOCK_SIZE = 32
#: What the largest |value| of a block is divided by to give its scale ``d``, as gguf-py's
#: ``quantize_blocks`` computes it (Q8_0: amax / 127; Q5_0: max / -16; Q4_0: max / -8).
SCALE_DIVISOR = {"Q8_0": 127, "Q5_0": 16, "Q4_0": 8}
#: Rows are quantized in chunks of about this many BF16 bytes (bounded memory: the float32
#: widening, gguf-py's temporaries and the dequantized copy are a few times this).
CHUNK_BYTES = 4 * 1024 * 1024

_F16_MAX = float(np.finfo(np.float16).max)


def quant_type(name: str) -> str:
    """The canonical type name ("Q8_0") for a user's spelling ("q8_0"), or QuantTypeError."""
    canon = str(name).strip().upper()
    if canon not in QUANT_TYPES:
        raise QuantTypeError(f"quantization type {name!r}: expected one of "
                             f"{', '.join(t.lower() for t in QUANT_TYPES)}",
                             field="type", expected="|".join(QUANT_TYPES), found=str(name))
    return canon


def ggml_type(name: str) -> GGMLQuantizationType:
    return GGMLQuantizationType[quant_type(name)]


def type_size(name: str) -> int:
    """Bytes per 32-value block."""
    return GGML_QUANT_SIZES[ggml_type(name)][1]


def row_nbytes(ne0: int, name: str) -> int:
    """Bytes of one row of ``ne0`` values (ne0 a multiple of the block)."""
    return ne0 // BLOCK_SIZE * type_size(name)


def tensor_nbytes(shape: list[int] | tuple[int, ...], name: str) -> int:
    """Bytes of a tensor of GGUF shape ``shape`` (ne0 first) in type ``name``."""
    return row_nbytes(shape[0], name) * math.prod(shape[1:])


def check_row_width(ne0: int, name: str, *, tensor: str, label: str) -> None:
    if ne0 % BLOCK_SIZE:
        raise QuantRowWidthError(
            f"{label}: tensor '{tensor}': row width (GGUF ne0) is {ne0}, not a multiple of the "
            f"{quant_type(name)} block of {BLOCK_SIZE} values; expected ne0 % {BLOCK_SIZE} == 0 "
            "(keep this tensor BF16)", path=label, tensor=tensor,
            expected=f"multiple of {BLOCK_SIZE}", found=ne0)


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    """BF16 bit patterns (uint16) widened exactly to float32 (the bits become the high half)."""
    return (np.asarray(bits, dtype="<u2").astype(np.uint32) << 16).view(np.float32)


def block_scales(data, name: str) -> np.ndarray:
    """The F16 scale ``d`` of every block of quantized bytes ``data``, as float32."""
    blocks = np.frombuffer(data, dtype=np.uint8).reshape(-1, type_size(name))
    return np.ascontiguousarray(blocks[:, :2]).view("<f2").reshape(-1).astype(np.float32)


def first_bad_scale(data, name: str) -> int | None:
    """Index of the first block whose F16 scale is NaN or infinite, or None."""
    bad = ~np.isfinite(block_scales(data, name))
    return int(np.argmax(bad)) if bad.any() else None


class ScaleScanner:
    """``first_bad_scale`` over a tensor's bytes fed in arbitrary pieces (validate reads in
    8 MiB blocks, which do not end on block boundaries): keeps the partial block between
    calls. ``first_bad`` is the index of the first block whose scale is NaN/Inf, or None;
    ``bad_scale`` that scale."""

    def __init__(self, name: str) -> None:
        self.size = type_size(name)
        self.name = quant_type(name)
        self.carry = b""
        self.blocks = 0
        self.first_bad: int | None = None
        self.bad_scale: float | None = None
        self.max_scale = 0.0          # the largest |scale|: what bounds the tensor's error
        self.min_scale = math.inf     # the smallest non-zero |scale|

    def feed(self, data) -> None:
        if self.first_bad is not None:
            return
        data = self.carry + bytes(data) if self.carry else memoryview(data).cast("B")
        whole = len(data) - len(data) % self.size
        if whole:
            index = first_bad_scale(data[:whole], self.name)
            if index is None:
                scales = np.abs(block_scales(data[:whole], self.name))
                self.max_scale = max(self.max_scale, float(scales.max()))
                nonzero = scales[scales > 0]
                if nonzero.size:
                    self.min_scale = min(self.min_scale, float(nonzero.min()))
            if index is not None:
                block = data[index * self.size:(index + 1) * self.size]
                self.first_bad = self.blocks + index
                self.bad_scale = float(block_scales(block, self.name)[0])
            self.blocks += whole // self.size
        self.carry = bytes(data[whole:])


# What a block's error can be, in units of its stored F16 scale d (gguf-py's arithmetic:
# q = round(x / d) clamped to the type's range, with d in float32; the file keeps d in F16).
# Q8_0 rounds to the nearest of +-127 steps: |x - q d| <= d / 2. Q5_0 and Q4_0 divide the
# signed max by -16 and -8, so the opposite extreme (|x| = 16 d, 8 d) clamps one step short:
# <= d. Storing d in F16 moves q d by at most |q| 2^-11 d (plus an F16 subnormal's absolute
# step, 2^-24, times |q|). The relative RMS of a block is then at most sqrt(32) times that
# over its largest |value|, 127 d, 16 d or 8 d; of a tensor, at most the largest block's.
_STEP_ERROR = {"Q8_0": 0.5, "Q5_0": 1.0, "Q4_0": 1.0}
_MAX_LEVEL = {"Q8_0": 127, "Q5_0": 16, "Q4_0": 8}
_F16_STEP = 2.0 ** -11
_F16_SUBNORMAL_STEP = 2.0 ** -24


def max_abs_error_bound(name: str, max_scale: float) -> float:
    """The largest max |quantized - x| a tensor of type ``name`` whose largest block scale
    is ``max_scale`` can have against the values it was quantized from."""
    name = quant_type(name)
    q = _MAX_LEVEL[name]
    return (max_scale * (_STEP_ERROR[name] + q * _F16_STEP) + q * _F16_SUBNORMAL_STEP) * 1.001


#: Below this |scale| F16 is subnormal: its rounding is absolute, not relative, and the
#: relative bound does not hold for a block of such small values.
F16_MIN_NORMAL = 2.0 ** -14


def rel_rms_error_bound(name: str) -> float:
    """The largest relative RMS error a tensor of type ``name`` can have when each of its
    non-zero block scales is at least F16_MIN_NORMAL."""
    name = quant_type(name)
    q = _MAX_LEVEL[name]
    return math.sqrt(BLOCK_SIZE) * (_STEP_ERROR[name] + q * _F16_STEP) / q * 1.001


def dequantize(data, name: str, ne0: int) -> np.ndarray:
    """Quantized bytes of whole rows of ``ne0`` values -> float32 [rows, ne0] (gguf-py)."""
    rows = np.frombuffer(data, dtype=np.uint8).reshape(-1, row_nbytes(ne0, name))
    return _gguf_dequantize(rows, ggml_type(name))


def quantize_bf16(bits: np.ndarray, ne0: int, name: str, *, tensor: str, label: str,
                  row0: int = 0) -> np.ndarray:
    """Quantize whole rows of BF16 bits (``ne0`` values a row) -> uint8 [rows, row bytes].

    ``row0`` is the index of the first row in its tensor (for messages). Refuses a row
    width that is not a multiple of the block, a NaN/Inf value and an overflowing scale.
    """
    check_row_width(ne0, name, tensor=tensor, label=label)
    bits = np.asarray(bits, dtype="<u2").reshape(-1, ne0)
    problem = non_finite_error(bits.reshape(-1), "BF16", row0 * ne0 * 2, tensor, label)
    if problem is not None:
        raise problem
    with np.errstate(over="ignore"):     # an overflowing scale is refused just below
        packed = _gguf_quantize(bf16_to_float32(bits), ggml_type(name))
    bad = first_bad_scale(packed, name)
    if bad is not None:
        raise _overflow(bits, bad, ne0, name, tensor=tensor, label=label, row0=row0)
    return packed


def _overflow(bits: np.ndarray, block: int, ne0: int, name: str, *, tensor: str, label: str,
              row0: int) -> QuantScaleOverflowError:
    per_row = ne0 // BLOCK_SIZE
    row, col = divmod(block, per_row)
    values = bf16_to_float32(bits[row, col * BLOCK_SIZE:(col + 1) * BLOCK_SIZE])
    amax = float(np.abs(values).max())
    limit = _F16_MAX * SCALE_DIVISOR[name]
    return QuantScaleOverflowError(
        f"{label}: tensor '{tensor}': the block at row {row0 + row}, columns "
        f"{col * BLOCK_SIZE}..{col * BLOCK_SIZE + BLOCK_SIZE - 1} holds |x| up to {amax:g}; its "
        f"{name} scale (|x| / {SCALE_DIVISOR[name]}) overflows F16; expected |x| below about "
        f"{limit:.4g} (keep this tensor BF16)", path=label, tensor=tensor,
        expected=f"|x| < {limit:.4g}", found=amax)


@dataclass(frozen=True)
class QuantError:
    """The error of a quantized tensor against its BF16 values."""
    max_abs: float      # max |q - x|
    rel_rms: float      # sqrt(sum (q - x)^2 / sum x^2); 0 when both are 0


class ErrorStats:
    """Accumulates QuantError over chunks (float64 sums, so chunking does not change it
    beyond rounding of the sums)."""

    def __init__(self) -> None:
        self.max_abs = 0.0
        self.sum_sq_diff = 0.0
        self.sum_sq_ref = 0.0

    def update(self, reference: np.ndarray, approx: np.ndarray) -> None:
        ref = np.asarray(reference, dtype=np.float64)
        diff = np.asarray(approx, dtype=np.float64) - ref
        if diff.size:
            self.max_abs = max(self.max_abs, float(np.abs(diff).max()))
        self.sum_sq_diff += float(np.dot(diff.reshape(-1), diff.reshape(-1)))
        self.sum_sq_ref += float(np.dot(ref.reshape(-1), ref.reshape(-1)))

    def result(self) -> QuantError:
        if self.sum_sq_ref == 0.0:
            rel = 0.0 if self.sum_sq_diff == 0.0 else math.inf
        else:
            rel = math.sqrt(self.sum_sq_diff / self.sum_sq_ref)
        return QuantError(max_abs=self.max_abs, rel_rms=rel)


def rows_per_chunk(ne0: int, chunk_bytes: int | None = None) -> int:
    """Whole rows of BF16 per chunk (of about ``chunk_bytes``, default CHUNK_BYTES): at
    least one."""
    return max(1, (chunk_bytes or CHUNK_BYTES) // (2 * ne0))


class TensorQuantizer:
    """Quantizes one BF16 matrix fed in chunks of whole rows, in order.

    ``feed(bits)`` returns the quantized bytes of those rows (to be written in order);
    ``finish()`` checks every row was fed and returns the error against the BF16 values.
    """

    def __init__(self, shape: list[int] | tuple[int, ...], name: str, *, tensor: str,
                 label: str) -> None:
        self.name = quant_type(name)
        self.ne0 = int(shape[0])
        self.rows = math.prod(shape[1:])
        self.tensor, self.label = tensor, label
        check_row_width(self.ne0, self.name, tensor=tensor, label=label)
        self.done = 0
        self.stats = ErrorStats()

    def feed(self, bits: np.ndarray) -> np.ndarray:
        bits = np.asarray(bits, dtype="<u2")
        if bits.size % self.ne0 or self.done + bits.size // self.ne0 > self.rows:
            raise ValueError(f"{self.tensor}: fed {bits.size} values; expected whole rows of "
                             f"{self.ne0}, at most {self.rows - self.done} rows")
        packed = quantize_bf16(bits, self.ne0, self.name, tensor=self.tensor, label=self.label,
                               row0=self.done)
        self.stats.update(bf16_to_float32(bits).reshape(-1, self.ne0),
                          dequantize(packed, self.name, self.ne0))
        self.done += bits.size // self.ne0
        return packed

    def finish(self) -> QuantError:
        if self.done != self.rows:
            raise ValueError(f"{self.tensor}: {self.done} of {self.rows} rows quantized")
        return self.stats.result()
