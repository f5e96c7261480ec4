"""The memory check before loading, shared by `dspark smoke` and `dspark eval`.

``budget_report`` turns an estimate (runtime/memory.py ``estimate_memory``) and what the
device has (``available_memory``, or ``--max-memory``) into the ``MemoryReport`` both
reports carry, or refuses the run (``MemoryBudgetError``, 78) before a weight is loaded.

No torch here: the report models that hold a ``MemoryReport`` are imported by commands
that never load torch (`--help`, the schema generator).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from dspark_convert.errors import MemoryBudgetError


@dataclass(frozen=True)
class MemoryEstimate:
    device: str
    dtype: str
    target_weights: int       # bytes, in the compute dtype
    drafter_weights: int
    activations: int
    runtime: int
    context_tokens: int       # the positions the caches are sized for

    @property
    def weights(self) -> int:
        return self.target_weights + self.drafter_weights

    @property
    def total(self) -> int:
        return self.weights + self.activations + self.runtime


class MemoryReport(BaseModel):
    """The estimate made before loading, what the device had, and the measured peaks."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    device: str
    dtype: str
    estimate_bytes: int                # the sum of the four below
    target_weights_bytes: int
    drafter_weights_bytes: int         # every drafter loaded (eval loads them all at once)
    activations_bytes: int             # caches at context_tokens + one forward's working set
    runtime_bytes: int                 # the process itself (CPU) / allocator slack (CUDA)
    context_tokens: int
    available_bytes: int | None        # what the device had before loading
    available_source: str
    budget_bytes: int | None           # what the estimate was checked against
    budget_source: str                 # "--max-memory" or available_source
    peak_rss_bytes: int | None = None  # measured at the end (this process's max RSS)
    cuda_max_allocated_bytes: int | None = None


_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?", re.IGNORECASE)


def parse_memory_size(text: str, *, error) -> int:
    """``--max-memory``: bytes, or a number with K, M, G, T (powers of 1000) or KiB, MiB,
    GiB, TiB (powers of 1024), the B optional: ``20GB``, ``19.5G``, ``16GiB``. ``error``:
    the command's own option error class (smoke 73, eval 91)."""
    match = _SIZE.fullmatch(text.strip()) if len(text) < 40 else None
    if match is None:
        shown = text if len(text) < 40 and text.isprintable() else f"{len(text)} characters"
        raise error(f"--max-memory: expected a size such as 20GB or 16GiB, found {shown!r}",
                    field="max_memory", expected="a size", found=shown)
    number, unit, binary = match.groups()
    power = " kmgt".index(unit.lower()) if unit else 0
    value = int(float(number) * (1024 if binary else 1000) ** power)
    if value <= 0:
        raise error(f"--max-memory: expected a positive size, found {text!r}",
                    field="max_memory", expected="> 0", found=text)
    return value


def format_bytes(nbytes: int | None) -> str:
    """Decimal units, as the memory figures in the reports: 9.66 GB, 350 MB."""
    if nbytes is None:
        return "?"
    if nbytes >= 1e9:
        return f"{nbytes / 1e9:.2f} GB"
    return f"{nbytes / 1e6:.1f} MB" if nbytes >= 1e5 else f"{nbytes} bytes"


def budget_report(estimate: MemoryEstimate, *, available: int | None, source: str,
                  max_memory: int | None, smaller: str) -> MemoryReport:
    """The report of ``estimate`` against ``max_memory`` (when given) or ``available``;
    refused with MemoryBudgetError when over. ``smaller``: what makes this run smaller, in
    words, for the hint ("a shorter prompt or fewer new tokens")."""
    budget, budget_source = (max_memory, "--max-memory") if max_memory is not None \
        else (available, source)
    memory = MemoryReport(
        device=estimate.device, dtype=estimate.dtype, estimate_bytes=estimate.total,
        target_weights_bytes=estimate.target_weights,
        drafter_weights_bytes=estimate.drafter_weights, activations_bytes=estimate.activations,
        runtime_bytes=estimate.runtime, context_tokens=estimate.context_tokens,
        available_bytes=available, available_source=source, budget_bytes=budget,
        budget_source=budget_source)
    if budget is not None and estimate.total > budget:
        hint = ("--dtype bfloat16, " if estimate.dtype == "float32" else "") + \
            f"{smaller}, or --max-memory to override"
        gb = format_bytes
        raise MemoryBudgetError(
            f"memory: expected at most {gb(budget)} ({budget_source} on {estimate.device}), "
            f"found an estimate of {gb(estimate.total)} for {estimate.dtype} (weights "
            f"{gb(estimate.weights)}: {gb(estimate.target_weights)} target + "
            f"{gb(estimate.drafter_weights)} drafter, activations {gb(estimate.activations)} "
            f"at {estimate.context_tokens:,} positions, runtime {gb(estimate.runtime)}); use "
            f"{hint}", field="memory", expected=budget,
            found=estimate.total)
    return memory
