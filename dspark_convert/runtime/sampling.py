"""The one float rule for decoding: what a temperature and a seed may be, and how logits
become a token or a distribution (docs/REFERENCE.md §2), for every command that decodes
(smoke, eval) and every model that is decoded from (the target, the drafter).

- A temperature is 0 (greedy: the argmax, DeepSpec's convention) or a finite number in
  (0, MAX_TEMPERATURE]: every such number, however small, gives a distribution.
- Sampling is softmax(z / T) in float32 (bfloat16 logits widened first), DeepSpec's own
  arithmetic, bit for bit, whenever z / T is finite in float32. Only where it is not (a
  temperature near 0, such as 3e-38, or logits near float32's limit) the same softmax is
  computed in float64 on each row's gaps to its maximum: ``(z - max z) / T`` is <= 0, so it
  cannot overflow, the maximum gets exp(0) = 1 and the sum is at least 1, never NaN. As T
  goes to 0 that distribution goes to the argmax, as it should.
- Logits that are not finite cannot be decoded from by any rule: a model whose weights are
  finite but whose forward overflows the compute dtype (a BF16 norm of 3e38 passes
  ``validate``: it checks values, not their products) is refused with NumericOverflowError
  naming the model and what overflowed, at every temperature (greedy too: an argmax over
  NaN picks a meaningless token and would report a tau for arithmetic that failed).
- A seed is an integer in 0..SEED_MAX, the range of ``torch.Generator.manual_seed``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from dspark_convert.errors import NumericOverflowError
from dspark_convert.util.text import shown_int

if TYPE_CHECKING:
    import torch

# torch is imported inside the functions that compute: the option rules run before any
# work, and a refused option must not pay for torch (tests/test_import_cost.py).

MAX_TEMPERATURE = 100.0
SEED_MAX = 2 ** 64 - 1               # torch.Generator.manual_seed's range (from 0)


def temperature_problem(value: object) -> str | None:
    """Why ``value`` is not a temperature (None when it is one)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"expected a number, found {type(value).__name__}"
    if not (math.isfinite(value) and 0.0 <= value <= MAX_TEMPERATURE):
        return f"expected 0 (greedy) or a number in (0, {MAX_TEMPERATURE:g}], found {value}"
    return None


def check_temperature(value: object, *, error, option: str = "--temperature") -> float:
    """``value`` as a temperature, or ``error`` (a DSparkError class) naming ``option``."""
    why = temperature_problem(value)
    if why is not None:
        raise error(f"{option}: {why}", field=option.lstrip("-").replace("-", "_"),
                    expected=f"0..{MAX_TEMPERATURE:g}", found=str(value))
    return float(value)


def check_seed(value: object, *, error, option: str = "--seed") -> int:
    """``value`` as a seed (0..2^64-1), or ``error`` naming ``option``: smoke's and eval's
    one rule (eval's seed also orders the calibration split, which takes any integer)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SEED_MAX:
        found = shown_int(value) if isinstance(value, int) else str(value)
        raise error(f"{option}: expected 0..2^64-1 (a torch.Generator seed), found {found}",
                    field=option.lstrip("-"), expected="0..2^64-1", found=found)
    return value


def require_finite(values: torch.Tensor, what: str) -> None:
    """NumericOverflowError when ``values`` (a model's output) holds NaN or infinity."""
    import torch

    finite = torch.isfinite(values)
    if bool(finite.all()):
        return
    flat = finite.reshape(-1)
    index = int((~flat).nonzero()[0, 0])
    value = float(values.reshape(-1)[index])
    raise NumericOverflowError(
        f"{what}: the forward pass gave a non-finite value ({value}) at element {index} of "
        f"{flat.numel()}; the weights are finite but overflow the compute dtype "
        f"({str(values.dtype).removeprefix('torch.')}); expected finite outputs",
        field=what, expected="finite", found=str(value))


def probs_from_logits(logits: torch.Tensor, temperature: float, *,
                      what: str = "the logits") -> torch.Tensor:
    """softmax(z / T) over the last dimension (the module's rule); at temperature 0 a
    one-hot at the argmax (DeepSpec's convention). ``what`` names the model for a refusal."""
    import torch

    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    require_finite(logits, what)
    if temperature <= 0.0:
        out = torch.zeros_like(logits)
        out.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
        return out
    scaled = logits / temperature
    if bool(torch.isfinite(scaled).all()):
        return torch.softmax(scaled, dim=-1)       # DeepSpec's arithmetic, unchanged
    wide = logits.to(torch.float64)
    gaps = (wide - wide.amax(-1, keepdim=True)) / temperature
    return torch.softmax(gaps, dim=-1).to(logits.dtype)


def pick(logits: torch.Tensor, temperature: float, generator: torch.Generator | None, *,
         what: str = "the logits") -> int:
    """argmax at temperature 0, else one draw from ``probs_from_logits`` (on the
    generator's device)."""
    import torch

    if temperature <= 0.0:
        require_finite(logits, what)
        return int(logits.argmax())
    probs = probs_from_logits(logits, temperature, what=what)
    device = generator.device if generator is not None else probs.device
    return int(torch.multinomial(probs.to(device), 1, generator=generator))
