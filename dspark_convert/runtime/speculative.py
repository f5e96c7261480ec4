"""The speculative loop of docs/REFERENCE.md §2 (DeepSpec's generate_decoding_sample, batch 1).

prefill: the target runs the prompt; x[P] is picked from its last logits; the drafter's
context cells are the prompt's features. Each cycle: the drafter proposes L tokens after the
anchor x[start]; the target verifies ``[anchor, t_0 .. t_{L-1}]`` and the longest accepted
prefix plus one target token (correction or bonus) is committed; the context cells of the
anchor and the accepted tokens are written only after verification (they are the target's
features at those positions); the target's cache is cut back to the committed tokens.

Greedy (temperature 0): accept while t_i equals the target's argmax; the correction is the
argmax. Sampled: accept t_i with probability min(1, p_i(t_i)/q_i(t_i)); on the first
rejection draw from norm(max(p_i - q_i, 0)), else draw a bonus token from p_L. That is
lossless: the committed tokens are distributed exactly as the target's own samples. The
random draws (draft tokens, the L uniforms, the correction/bonus) are made in DeepSpec's
order from one ``torch.Generator`` on the CPU, so a seed gives the same run on any device.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from dspark_convert.runtime.drafter import DSparkDrafter
from dspark_convert.runtime.sampling import pick, probs_from_logits
from dspark_convert.runtime.qwen3 import KVCache, Qwen3Target, TargetOutput


# How a refusal names the target's logits (runtime/sampling.py: NumericOverflowError).
TARGET_LOGITS = "the target's logits"


@dataclass(frozen=True)
class Cycle:
    proposed: tuple[int, ...]
    accepted: int
    next_token: int
    confidence_logits: tuple[float, ...] | None
    # Wall time of this cycle (device-synchronised), for `dspark eval`; not in the trace
    # (trace.run_to_json leaves them out: a trace is the same bytes on every run).
    draft_seconds: float = 0.0    # the drafter: this proposal + the context cells it commits
    verify_seconds: float = 0.0   # the target's verify forward over [anchor, drafts]


@dataclass(frozen=True)
class RunResult:
    prompt: tuple[int, ...]
    output_ids: tuple[int, ...]              # prompt included
    acceptance_lengths: tuple[int, ...]      # accepted+1 per verify step (accepted at a stop)
    cycles: tuple[Cycle, ...]
    temperature: float
    confidence_threshold: float
    seed: int | None
    draft_seconds: float                     # time in the drafter (proposals + context)
    total_seconds: float                     # the whole speculative generation
    prefill_seconds: float = 0.0             # the target's prefill + the first context cells

    @property
    def new_tokens(self) -> int:
        return len(self.output_ids) - len(self.prompt)


def residual_probs(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(p - q, 0)); falls back to p when the residual has no mass (p == q)."""
    residual = torch.clamp(p - q, min=0.0)
    mass = residual.sum()
    if mass <= 1e-8:
        return p
    return residual / mass


def verify(p: torch.Tensor, q: torch.Tensor | None, draft: list[int], *,
           stop_token_ids: tuple[int, ...] = (), generator: torch.Generator | None = None
           ) -> tuple[int, int, bool]:
    """Accept a prefix of ``draft`` and pick the next token.

    p [L+1, V]: the target's distributions at the anchor and each draft position; q [L, V]:
    the drafter's (None when L = 0). With a generator (sampling): accept t_i while
    u_i < min(1, p_i(t_i) / q_i(t_i)) (u_i uniform, all L drawn at once), then draw the
    correction from norm(max(p_a - q_a, 0)) or, when all L were accepted, a bonus token
    from p_L. Without one (greedy, p and q one-hot): accept while t_i is p_i's argmax and
    take the argmax as the next token. An accepted stop token ends the prefix there.
    Returns (accepted, next_token, stopped_at_a_stop_token).
    """
    L = len(draft)
    if L and generator is not None:
        idx = torch.tensor(draft, device=p.device)
        rows = torch.arange(L, device=p.device)
        ratio = torch.clamp(p[rows, idx] / q[rows, idx].clamp_min(1e-8), max=1.0)
        u = torch.rand(L, generator=generator)
        accepted = int((u < ratio.cpu()).long().cumprod(0).sum())
    elif L:
        best = p[:L].argmax(-1).tolist()
        accepted = next((i for i in range(L) if draft[i] != best[i]), L)
    else:
        accepted = 0
    stopped = False
    hit = _first_stop(draft[:accepted], stop_token_ids)
    if hit is not None:
        accepted, stopped = hit + 1, True
    if generator is None:
        next_token = int(p[accepted].argmax())
    elif 0 < L and accepted < L:        # a rejection (or a cut at a stop): the residual
        dist = residual_probs(p[accepted], q[accepted])
        next_token = int(torch.multinomial(dist.cpu(), 1, generator=generator))
    else:                               # every draft token accepted: a bonus token
        next_token = int(torch.multinomial(p[-1].cpu(), 1, generator=generator))
    return accepted, next_token, stopped


def verify_forward(target: Qwen3Target, ids: torch.Tensor, cache: KVCache, *,
                   keep, stepwise: bool) -> TargetOutput:
    """The target over ``[anchor, drafts]``: one forward of L+1 rows (batched, as engines
    verify), or L+1 single-token forwards (stepwise). Stepwise computes every row exactly
    as the target alone does one token at a time (the same shapes, so the same kernels and
    the same rounding), so at temperature 0 the output equals the greedy output bit for
    bit. Batched rows differ from single-token rows by the GEMM's rounding: ~1e-6 relative
    in float32, far below any logit margin, but one ulp (0.4%) in bfloat16, which flips an
    argmax at a near-tie (measured: a random-weight 114M target diverged from its own
    greedy output within 43-126 new tokens in bfloat16, 3 prompts of 3; in float32 none)."""
    if not stepwise or len(ids) == 1:
        return target.forward(ids, cache, keep=keep)
    outs = [target.forward(ids[i:i + 1], cache, keep=keep) for i in range(len(ids))]
    hidden = tuple(None if outs[0].hidden_states[j] is None
                   else torch.cat([o.hidden_states[j] for o in outs])
                   for j in range(len(outs[0].hidden_states)))
    return TargetOutput(logits=torch.cat([o.logits for o in outs]), hidden_states=hidden)


def prefill(target, prompt: list[int], cache: KVCache, *, keep, temperature: float = 0.0,
            generator: torch.Generator | None = None) -> tuple[TargetOutput, int]:
    """The target over the prompt into ``cache`` (the last row's logits only; the hidden
    states ``keep`` names, for the drafter's first context cells) and the first new token
    picked from it: every loop's start (this one, serving, DFlash2's)."""
    out = target.forward(torch.tensor(prompt, dtype=torch.long, device=target.device), cache,
                         keep=keep, last_logits_only=True)
    return out, pick(out.logits[-1], temperature, generator, what=TARGET_LOGITS)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _first_stop(tokens: list[int], stops: tuple[int, ...]) -> int | None:
    return next((i for i, t in enumerate(tokens) if t in stops), None)


def trim_at_stop(output: list[int], prompt_len: int, stops: tuple[int, ...]) -> list[int]:
    hit = _first_stop(output[prompt_len:], stops)
    return output if hit is None else output[: prompt_len + hit + 1]


@torch.inference_mode()
def speculative_generate(target: Qwen3Target, drafter: DSparkDrafter, prompt: list[int], *,
                         max_new_tokens: int, temperature: float = 0.0,
                         confidence_threshold: float = 0.0, stop_token_ids: tuple[int, ...] = (),
                         seed: int | None = None, stepwise_verify: bool = False) -> RunResult:
    """The speculative loop. ``stepwise_verify``: verify token by token (``verify_forward``),
    so that temperature 0 reproduces the target's greedy output exactly in any dtype."""
    device = target.device
    generator = None
    if temperature > 0.0:
        generator = torch.Generator(device="cpu")
        generator.manual_seed(0 if seed is None else seed)
    sampled = generator is not None

    synchronize(device)
    t_begin = time.perf_counter()
    draft_seconds = 0.0
    cache = KVCache()
    drafter.reset()
    taps = drafter.hidden_state_indices
    P = len(prompt)
    max_length = P + max_new_tokens
    out, first = prefill(target, prompt, cache, keep=taps, temperature=temperature,
                         generator=generator)
    x = list(prompt) + [first]

    cycles: list[Cycle] = []
    acceptance: list[int] = []
    start = P
    if x[P] not in stop_token_ids:
        t0 = time.perf_counter()
        drafter.add_context(drafter.features(out.hidden_states))
        synchronize(device)
        draft_seconds += time.perf_counter() - t0
    prefill_seconds = time.perf_counter() - t_begin
    if x[P] not in stop_token_ids:
        while start < max_length:
            synchronize(device)
            t0 = time.perf_counter()
            proposal = drafter.propose(x[start], temperature=temperature,
                                       confidence_threshold=confidence_threshold, generator=generator)
            L = proposal.length
            draft = proposal.tokens[:L].tolist()
            synchronize(device)
            t1 = time.perf_counter()
            cycle_draft = t1 - t0

            verify_ids = torch.tensor([x[start], *draft], dtype=torch.long, device=device)
            out = verify_forward(target, verify_ids, cache, keep=taps, stepwise=stepwise_verify)
            synchronize(device)
            cycle_verify = time.perf_counter() - t1
            p = probs_from_logits(out.logits, temperature, what=TARGET_LOGITS)
            q = proposal.draft_probs(temperature) if L else None
            accepted, next_token, stopped = verify(p, q, draft, stop_token_ids=stop_token_ids,
                                                   generator=generator)

            conf = proposal.confidence_logits
            conf_list = tuple(float(c) for c in conf[:L].tolist()) if conf is not None and L else None
            x.extend(draft[:accepted])     # x[start] is the anchor and x ends there
            if stopped:
                acceptance.append(accepted)
                start += accepted
            else:
                x.append(next_token)
                acceptance.append(accepted + 1)
                start += accepted + 1
                cache.crop(start)
                # Context cells after verification: the anchor and the accepted tokens.
                t0 = time.perf_counter()
                drafter.add_context(drafter.features(out.hidden_states)[: accepted + 1])
                synchronize(device)
                cycle_draft += time.perf_counter() - t0
            draft_seconds += cycle_draft
            cycles.append(Cycle(proposed=tuple(draft), accepted=accepted, next_token=next_token,
                                confidence_logits=conf_list, draft_seconds=cycle_draft,
                                verify_seconds=cycle_verify))
            if stopped or next_token in stop_token_ids:
                break
    synchronize(device)
    total = time.perf_counter() - t_begin
    output = trim_at_stop(x[: min(start + 1, max_length)], P, stop_token_ids)
    return RunResult(prompt=tuple(prompt), output_ids=tuple(output),
                     acceptance_lengths=tuple(acceptance), cycles=tuple(cycles),
                     temperature=temperature, confidence_threshold=confidence_threshold,
                     seed=seed if sampled else None, draft_seconds=draft_seconds,
                     total_seconds=total, prefill_seconds=prefill_seconds)


@dataclass(frozen=True)
class GreedyResult:
    output_ids: tuple[int, ...]
    seconds: float


@torch.inference_mode()
def target_greedy(target: Qwen3Target, prompt: list[int], *, max_new_tokens: int,
                  stop_token_ids: tuple[int, ...] = ()) -> GreedyResult:
    """The target alone, one token at a time: what temperature 0 must reproduce."""
    device = target.device
    synchronize(device)
    t_begin = time.perf_counter()
    cache = KVCache()
    out = target.forward(torch.tensor(prompt, dtype=torch.long, device=device), cache, keep=(),
                         last_logits_only=True)
    x = list(prompt)
    for _ in range(max_new_tokens):
        token = pick(out.logits[-1], 0.0, None, what=TARGET_LOGITS)
        x.append(token)
        if token in stop_token_ids or len(x) >= len(prompt) + max_new_tokens:
            break
        out = target.forward(torch.tensor([token], dtype=torch.long, device=device), cache,
                             keep=())
    synchronize(device)
    return GreedyResult(output_ids=tuple(x), seconds=time.perf_counter() - t_begin)
