"""`dspark profile --target T -o cost.json`: measure the target's cost table (SPS(B), its
verify steps per second at B tokens) on this device, and write it whole or not at all.

Order, as every command: the options (144) and the output path (the one output rule,
30-32: never inside the target, never over an existing file without --force) before the
target is read; then the target (a directory or org/name@<commit>, as smoke and eval take
it: config, weights' headers, tokenizer; no drafter: nothing is paired), the context plus
the largest B against its max_position_embeddings (145), and only then its weights. The
measurement is scheduling/profile.py's ``profile_target``.
"""

from __future__ import annotations

import os
import time

from pydantic import BaseModel, ConfigDict

from dspark_convert.commands.binding import open_run_target, runtime_of, target_read
from dspark_convert.errors import FamilyRuntimeError, ProfileInputError
from dspark_convert.evaluation.options import DEVICES, DTYPES
from dspark_convert.scheduling.cost_table import CostTable, write_cost_table
from dspark_convert.scheduling.profile import (
    DEFAULT_CONTEXT,
    DEFAULT_MAX_TOKENS,
    DEFAULT_REPEATS,
    DEFAULT_SEGMENT,
    DEFAULT_WARMUP,
    check_at_least,
    check_fits,
    check_tokens,
    default_tokens,
    profile_target,
)
from dspark_convert.util.atomic import Output, check_outputs
from dspark_convert.util.progress import NoProgress, Progress
from dspark_convert.util.text import shown


class ProfileResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    target: str
    output: str                      # the cost table written
    context: int                     # tokens prefilled before each verify forward
    repeats: int                     # timed forwards per B (their median is the rate)
    segment: int                     # a request's block: B is measured in blocks of this
    requests: int | None             # or: B spread over this many requests
    warmup: int                      # untimed forwards per B before them
    load_seconds: float              # the target's weights, once
    table: CostTable


def _check_options(*, max_tokens: int | None, tokens, context: int, repeats: int,
                   segment: int, requests: int | None, device: str,
                   dtype: str) -> tuple[int, ...]:
    """The B to measure, once every option is checked (ProfileInputError)."""
    for name, value, allowed in (("--device", device, DEVICES), ("--dtype", dtype, DTYPES)):
        if value not in allowed:
            raise ProfileInputError(f"{name}: expected one of {', '.join(allowed)}, found "
                                    f"{shown(str(value))!r}", field=name.lstrip("-"),
                                    expected="|".join(allowed), found=shown(str(value)))
    check_at_least("--context", context, 1)
    check_at_least("--repeats", repeats, 1)
    check_at_least("--segment", segment, 1)
    if requests is not None:
        check_at_least("--requests", requests, 1)
    if tokens is not None and max_tokens is not None:
        raise ProfileInputError("--tokens and --max-tokens: expected one of them, found both "
                                "(--tokens lists every B measured; --max-tokens ends the "
                                "default staircase)", field="tokens", expected="one of them",
                                found="both")
    if tokens is not None:
        return check_tokens(tokens)
    return default_tokens(DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens)


def run_profile(target: str | os.PathLike, *, output: str | os.PathLike,
                max_tokens: int | None = None, tokens=None, context: int = DEFAULT_CONTEXT,
                repeats: int = DEFAULT_REPEATS, segment: int = DEFAULT_SEGMENT,
                requests: int | None = None, device: str = "auto", dtype: str = "float32",
                force: bool = False, progress: Progress | None = None) -> ProfileResult:
    """Measure ``target``'s cost table and write it to ``output`` (module docstring).
    ``tokens``: every B to measure; else the staircase ``default_tokens(max_tokens)``
    (``max_tokens`` 1024 when not given; giving both is refused)."""
    progress = progress or NoProgress()
    batch_tokens = _check_options(max_tokens=max_tokens, tokens=tokens, context=context,
                                  repeats=repeats, segment=segment, requests=requests,
                                  device=device, dtype=dtype)
    check_outputs([Output(output, "the cost table", directory=False)], [target_read(target)],
                  force=force)

    from dspark_convert.commands.smoke import resolve_device
    from dspark_convert.runtime.loading import compute_dtype

    dev = resolve_device(device)
    opened = open_run_target(target, progress)
    family = opened.family
    if family.runtime is None:
        raise FamilyRuntimeError(f"{opened.label}: a {family.name} target: the reference "
                                 f"runtime does not run the {family.name} family yet",
                                 path=str(opened.directory), found=family.name)
    runtime = runtime_of(family)
    plan = runtime.plan_for(opened)
    check_fits(batch_tokens, context, positions=plan.config.max_position_embeddings,
               where=f"target {plan.directory / 'config.json'}", segment=segment,
               requests=requests)

    start = time.perf_counter()
    model = runtime.Target(plan.directory, device=dev, dtype=compute_dtype(dtype), plan=plan,
                           progress=progress)
    load_seconds = time.perf_counter() - start
    table = profile_target(model, tokens=batch_tokens, context=context, repeats=repeats,
                           warmup=DEFAULT_WARMUP, segment=segment, requests=requests,
                           progress=progress)
    written = write_cost_table(table, output, force=force)
    return ProfileResult(target=shown(str(target)), output=str(written), context=context,
                         repeats=repeats, segment=segment, requests=requests,
                         warmup=DEFAULT_WARMUP,
                         load_seconds=load_seconds,
                         table=table)
