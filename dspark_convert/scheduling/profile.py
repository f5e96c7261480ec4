"""Measuring a target's cost table (docs/SCHEDULING.md "Profiling a target"): SPS(B), the
target's verify steps per second at B tokens, on the device and in the dtype it is loaded in.

How a point is measured, as the serving runtime verifies (runtime/serving.py): a step of B
tokens is ceil(B / segment) requests' blocks of at most ``segment`` tokens (the anchor and
its drafts: 1 + the block size), packed into one forward (``forward_packed``: every linear
layer one GEMM over all B rows, attention per block against its own cache), each block after
a context of ``context`` tokens in a KV cache of its own. The context (deterministic ids,
counting up through the vocabulary) is prefilled once (``PREFILL_CHUNK`` tokens a forward)
and every block's cache starts as that one (its tensors shared, never written: a forward
appends by concatenation), so every B is measured after the same context; logits of every
row, as a verify needs; no hidden state kept. ``warmup`` untimed runs, then ``repeats``
timed ones, each synchronised with the device (CUDA runs asynchronously: without it the
clock would time the launch, not the work); SPS(B) = 1 / the median time.

The positions a profile needs are ``context + segment``, not ``context + B``: R requests'
blocks sit at their own positions, as in serving.

The target is handed in loaded (the family's runtime: runtime/qwen3.py, runtime/gemma4.py);
torch is imported when a profile runs, never at import.
"""

from __future__ import annotations

import importlib
import statistics
import sys
import time
from collections.abc import Sequence

from dspark_convert import __version__
from dspark_convert.errors import ProfileInputError, ProfileRangeError
from dspark_convert.scheduling.cost_table import CostTable
from dspark_convert.util.machine import cpu_name
from dspark_convert.util.progress import NoProgress, Progress
from dspark_convert.util.text import parse_int, shown, shown_int

DEFAULT_MAX_TOKENS = 1024
DEFAULT_CONTEXT = 64
DEFAULT_REPEATS = 5
DEFAULT_WARMUP = 1
# 1 + a block of 7 (DeepSeek's golden drafters; the serving sweep passes 1 + its drafters'
# largest block).
DEFAULT_SEGMENT = 8
# The largest step a profile measures: engines cap a step's tokens well below it (vLLM's
# max_num_batched_tokens defaults to 8,192 or 16,384); a larger B is a typing slip, and the
# default staircase up to it would be tens of thousands of forwards.
MAX_BATCH_TOKENS = 65536
# Every B up to here is measured: small steps are where a scheduler chooses most often, and
# a GPU's cost is flattest there (one more row is nearly free).
EVERY_TOKEN_UP_TO = 16
# Beyond it, this many evenly spaced B per doubling (16..32 by 4, 32..64 by 8, ...): an
# engine pads a step to its next graph size, and graph sizes are spaced like this too.
POINTS_PER_DOUBLING = 4
# The context is prefilled this many tokens a forward: a long --context in one forward would
# hold its whole attention-score matrix (context x context per head) at once, more than any
# verify measured after it up to this many rows.
PREFILL_CHUNK = 256


def default_tokens(max_tokens: int) -> tuple[int, ...]:
    """The B a profile measures up to ``max_tokens``: every B 1..16, then four per doubling
    (20, 24, 28, 32, then 40, 48, 56, 64, then 80 ... 128, 160 ... 256, ...), always ending
    exactly at ``max_tokens`` (added when the staircase does not land on it)."""
    check_at_least("--max-tokens", max_tokens, 1)
    tokens = list(range(1, min(max_tokens, EVERY_TOKEN_UP_TO) + 1))
    low = EVERY_TOKEN_UP_TO
    while low < max_tokens:
        step = low // POINTS_PER_DOUBLING
        tokens += [b for b in range(low + step, 2 * low + 1, step) if b <= max_tokens]
        low *= 2
    if tokens[-1] != max_tokens:
        tokens.append(max_tokens)
    return tuple(tokens)


def check_at_least(option: str, value: int, least: int) -> None:
    """ProfileInputError unless ``value`` is an integer >= ``least``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        found = shown_int(value) if isinstance(value, int) else shown(repr(value))
        raise ProfileInputError(f"{option}: expected an integer >= {least}, found {found}",
                                field=option.lstrip("-"), expected=f">= {least}", found=found)


def check_tokens(tokens: Sequence[int], *, option: str = "--tokens") -> tuple[int, ...]:
    """``tokens`` as a tuple, or ProfileInputError naming the first entry that is not a
    positive integer above the one before it (a cost table's rule, cost_table.py)."""
    tokens = tuple(tokens)
    if not tokens:
        raise ProfileInputError(f"{option}: expected at least one batch size, found none",
                                field=option.lstrip("-"), expected="B1,B2,...", found="none")
    for i, b in enumerate(tokens):
        if isinstance(b, bool) or not isinstance(b, int) or b < 1 or (i and b <= tokens[i - 1]):
            found = shown_int(b) if isinstance(b, int) else shown(repr(b))
            after = (f" after {shown_int(tokens[i - 1])}" if i and isinstance(b, int) and b >= 1
                     else "")
            raise ProfileInputError(
                f"{option}: entry {i + 1}: expected strictly increasing positive integers, "
                f"found {found}{after}", field=option.lstrip("-"),
                expected="strictly increasing positive integers", found=found)
    return tokens


def parse_tokens(text: str, *, option: str = "--tokens") -> tuple[int, ...]:
    """``--tokens 1,2,4,8``: comma-separated decimal integers, strictly increasing and
    positive; ProfileInputError naming the entry otherwise (an empty one, a word, a
    5,000-digit number: util/text.parse_int's rule)."""
    tokens = []
    for i, part in enumerate(str(text).split(",")):
        if not part.strip():
            raise ProfileInputError(f"{option}: entry {i + 1} is empty; expected comma-separated "
                                    "batch sizes such as 1,2,4,8", field=option.lstrip("-"),
                                    expected="B1,B2,...", found=shown(str(text)[:80]))
        try:
            tokens.append(parse_int(part))
        except ValueError as exc:
            raise ProfileInputError(f"{option}: entry {i + 1}: {exc}", field=option.lstrip("-"),
                                    expected="an integer", found=shown(part.strip()[:40])) from None
    return check_tokens(tokens, option=option)


def check_fits(tokens: Sequence[int], context: int, *, positions: int, where: str,
               segment: int = DEFAULT_SEGMENT, requests: int | None = None) -> None:
    """ProfileRangeError when the largest B is over MAX_BATCH_TOKENS, or the context plus
    the longest block measured (``segment``, or the largest B when smaller) is beyond the target's ``positions`` (max_position_embeddings,
    read from ``where``): positions past it are none the model was made for. The line names
    no option: `serve-bench` profiles through it too, with options of its own."""
    if max(tokens) > MAX_BATCH_TOKENS:
        raise ProfileRangeError(
            f"{where}: a batch of {shown_int(max(tokens))} tokens; expected at most "
            f"{MAX_BATCH_TOKENS} (the largest verify step a profile measures)", path=where,
            field="tokens", expected=f"<= {MAX_BATCH_TOKENS}", found=shown_int(max(tokens)))
    block = max(blocks_of(max(tokens), segment, requests))
    need = context + block
    if need > positions:
        raise ProfileRangeError(
            f"{where}: a context of {shown_int(context)} tokens plus a block of "
            f"{shown_int(block)} = {shown_int(need)} positions; expected at most the "
            f"target's max_position_embeddings {positions}", path=where,
            field="max_position_embeddings", expected=f"<= {positions}", found=shown_int(need))


def blocks_of(batch: int, segment: int, requests: int | None = None) -> list[int]:
    """A step of ``batch`` tokens as requests' blocks: of at most ``segment`` tokens each,
    or, ``requests`` given, spread as evenly as they go over that many requests (fewer
    when ``batch`` is smaller: a request sends at least its anchor)."""
    if requests is not None:
        n = min(requests, batch)
        base, more = divmod(batch, n)
        return [base + 1] * more + [base] * (n - more)
    full, rest = divmod(batch, segment)
    return [segment] * full + ([rest] if rest else [])


def describe_device(device) -> str:
    """The device as the cost table records it: the GPU's name, or "cpu (<model name>)"."""
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type} ({cpu_name()})"


def profile_target(target, *, tokens: Sequence[int], context: int = DEFAULT_CONTEXT,
                   repeats: int = DEFAULT_REPEATS, warmup: int = DEFAULT_WARMUP,
                   segment: int = DEFAULT_SEGMENT, requests: int | None = None,
                   progress: Progress | None = None) -> CostTable:
    """The cost table of ``target`` at each B of ``tokens`` (module docstring: one prefill of
    ``context`` tokens, then per B ``warmup`` untimed and ``repeats`` timed packed verify
    forwards of B tokens in blocks of at most ``segment`` (or spread over ``requests``
    requests: the table of a concurrency of R), each block after its own copy of the
    context, device-synchronised; SPS = 1 / median).

    ``target``: a loaded runtime target (runtime/qwen3.Qwen3Target, runtime/gemma4.Gemma4Target:
    ``forward``, ``forward_packed``, ``device``, ``dtype``, ``config``). ProfileInputError
    for bad counts or tokens, ProfileRangeError when the context plus a block is beyond the
    target's max_position_embeddings, both before any forward. ``progress``: one step per B."""
    import torch

    tokens = check_tokens(tokens)
    check_at_least("--context", context, 1)
    check_at_least("--repeats", repeats, 1)
    check_at_least("--segment", segment, 1)
    if requests is not None:
        check_at_least("--requests", requests, 1)
    check_at_least("warmup", warmup, 0)
    cfg = target.config
    check_fits(tokens, context, positions=cfg.max_position_embeddings,
               where=f"target {target.directory / 'config.json'}", segment=segment,
               requests=requests)
    progress = progress or NoProgress()
    device = target.device
    # The KV cache of the target's own runtime module: this layer sits below runtime/ in the
    # package's layout and names no runtime module; the family's runtime module has one.
    new_cache = importlib.import_module(type(target).__module__).KVCache
    longest = max(blocks_of(tokens[-1], segment, requests))
    ids = torch.arange(context + longest, device=device) % cfg.vocab_size

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    rates = []
    with torch.inference_mode():
        prefilled = new_cache()
        for start in range(0, context, PREFILL_CHUNK):
            target.forward(ids[start:min(start + PREFILL_CHUNK, context)], prefilled, keep=(),
                           last_logits_only=True)
        progress.start("profile", len(tokens))
        try:
            for b in tokens:
                seconds = []
                for run in range(warmup + repeats):
                    step = [(ids[context:context + n],
                             new_cache(keys=list(prefilled.keys), values=list(prefilled.values)))
                            for n in blocks_of(b, segment, requests)]
                    synchronize()
                    start = time.perf_counter()
                    target.forward_packed(step, keep=())
                    synchronize()
                    elapsed = time.perf_counter() - start
                    if run >= warmup:
                        seconds.append(elapsed)
                rates.append(1.0 / statistics.median(seconds))
                progress.advance(1)
        finally:
            progress.finish()
    return CostTable(tokens=tokens, steps_per_second=tuple(rates), device=describe_device(device),
                     dtype=str(target.dtype).removeprefix("torch."),
                     threads=torch.get_num_threads(), requests=requests,
                     versions={"torch": torch.__version__, "dspark-convert": __version__,
                               "python": sys.version.split()[0]})
