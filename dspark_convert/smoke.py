"""`dspark smoke`: run a converted drafter against its target and prove it.

``run_smoke`` validates the artifact (refusing with the failed check's own exit code),
binds the drafter to the target (geometry, and the embedding/head SHA-256 the GGUF records),
runs the speculative loop on each prompt and returns a frozen ``SmokeResult``: tau (mean
accepted+1 per verify step), acceptance rate by draft position, drafted and committed
tokens per second. It fails loudly:

- temperature 0: the output must equal the target's own greedy output (losslessness;
  ``LosslessnessError``), whatever the drafter;
- ``reference``: every run is compared cycle by cycle with the run of the same prompt and
  settings in a DeepSpec reference.json (``ReferenceDivergenceError`` names run, cycle,
  field). At temperature > 0 this holds with the reference's seed: the random draws follow
  DeepSpec's order (seed 7 reproduces the golden runs);
- ``min_tau``: tau below the floor (``AcceptanceFloorError``).

The trace (reference.json format) and the PNG are written atomically before the verdict,
so a failing run can be inspected.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from . import errors as errors_module
from .artifact_format import GGUF_FILE
from .atomic import write_error
from .errors import (
    AcceptanceFloorError,
    DeviceUnavailableError,
    DSparkError,
    InternalError,
    LosslessnessError,
    OutputWriteError,
    ReferenceTraceError,
    SmokeInputError,
    TargetBindingError,
)
from .progress import NoProgress, Progress


class RunSummary(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt: list[int]
    output_ids: list[int]
    new_tokens: int
    verify_steps: int
    tau: float
    lossless: bool | None              # temperature 0: equals the target's greedy output
    reference_run: int | None          # index of the reference run it matched, cycle by cycle


class SmokeResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    artifact: str
    target: str
    device: str
    temperature: float
    confidence_threshold: float
    seed: int
    max_new_tokens: int
    block_size: int
    runs: list[RunSummary]
    tau: float                                   # over every verify step of every run
    acceptance_by_position: list[float | None]   # P(accepted > i | proposed > i), DeepSpec's
    drafted_tokens: int
    committed_tokens: int
    drafted_tokens_per_second: float             # drafted tokens / time in the drafter
    committed_tokens_per_second: float           # new tokens / speculative wall time
    target_only_tokens_per_second: float | None  # the greedy baseline (temperature 0)
    lossless: bool | None
    reference: str | None
    min_tau: float | None
    warnings: list[str]                          # validate's warnings
    trace: str | None
    plot: str | None


def _check_options(*, max_new_tokens: int, temperature: float, confidence_threshold: float,
                   min_tau: float | None) -> None:
    if max_new_tokens < 1:
        raise SmokeInputError(f"--max-new-tokens: expected at least 1, found {max_new_tokens}",
                              field="max_new_tokens", expected=">= 1", found=max_new_tokens)
    if not 0.0 <= temperature <= 100.0:
        raise SmokeInputError(f"--temperature: expected 0..100, found {temperature}",
                              field="temperature", expected="0..100", found=temperature)
    if not 0.0 <= confidence_threshold <= 1.0:
        raise SmokeInputError(f"--confidence-threshold: expected 0..1, found {confidence_threshold}",
                              field="confidence_threshold", expected="0..1",
                              found=confidence_threshold)
    if min_tau is not None and not min_tau >= 0.0:
        raise SmokeInputError(f"--min-tau: expected a non-negative number, found {min_tau}",
                              field="min_tau", expected=">= 0", found=min_tau)


def resolve_device(device: str):
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda":
        if not torch.cuda.is_available():
            raise DeviceUnavailableError("--device cuda: CUDA is not available on this machine "
                                         f"(torch {torch.__version__}, built with CUDA "
                                         f"{torch.version.cuda or 'none'})", field="device",
                                         expected="a CUDA device", found="none")
        return torch.device("cuda")
    if device == "cpu":
        return torch.device("cpu")
    raise SmokeInputError(f"--device: expected auto, cpu or cuda, found {device!r}",
                          field="device", expected="auto|cpu|cuda", found=device)


def _validate(artifact: Path, progress: Progress) -> list[str]:
    """validate_artifact first; a failure is raised as its own error class and exit code."""
    from .validate import validate_artifact

    report = validate_artifact(artifact, progress=progress)
    failure = report.first_failure
    if failure is not None:
        cls = getattr(errors_module, failure.error or "", None)
        if not (isinstance(cls, type) and issubclass(cls, DSparkError)):
            cls = InternalError
        raise cls(f"{artifact}: validate: {failure.name}: {failure.detail}", path=str(artifact))
    return [f"{c.name}: {c.detail}" for c in report.checks if c.status == "warning"]


def bind_target(weights, target) -> None:
    """The artifact must fit the target: geometry, layer count, and the embedding/head the
    GGUF's hashes name (SHA-256 of the raw bytes of the target's tensors)."""
    g, cfg = weights.contract.geometry, target.config
    pairs = [("hidden_size", g.hidden_size, cfg.hidden_size, "dflash.embedding_length"),
             ("vocab_size", g.vocab_size, cfg.vocab_size, "dflash.vocab_size"),
             ("num_hidden_layers", weights.contract.taps.num_target_layers, cfg.num_hidden_layers,
              "dflash.target.num_layers")]
    for name, want, found, key in pairs:
        if want != found:
            raise TargetBindingError(f"target config.json: {name} is {found}; the drafter expects "
                                     f"{want} ({key})", path=str(target.directory / "config.json"),
                                     field=name, expected=want, found=found)
    for key, want, found, tensor in (
            ("dflash.target.embed_sha256", weights.embed_sha256, target.embed_sha256,
             "model.embed_tokens.weight"),
            ("dflash.target.lm_head_sha256", weights.lm_head_sha256, target.lm_head_sha256,
             "lm_head.weight")):
        if want is not None and want != found:
            raise TargetBindingError(f"target {target.directory}: tensor {tensor!r} has SHA-256 "
                                     f"{found}; {GGUF_FILE} records {want} ({key})",
                                     path=str(target.directory), tensor=tensor, field=key,
                                     expected=want, found=found)


def _encode_text(target_dir: Path, text: str, vocab_size: int) -> list[int]:
    path = target_dir / "tokenizer.json"
    if not path.is_file():
        raise SmokeInputError(f"--prompt: {path} not found; the target has no tokenizer, pass "
                              "token ids with --prompt-ids", path=str(path), field="prompt",
                              expected="tokenizer.json", found="nothing")
    from tokenizers import Tokenizer

    try:
        ids = Tokenizer.from_file(str(path)).encode(text).ids
    except Exception as exc:  # the tokenizers library raises its own exception types
        raise SmokeInputError(f"--prompt: {path}: cannot tokenize: {exc}", path=str(path),
                              field="prompt") from None
    return list(ids)


def _check_prompt(ids: list[int], vocab_size: int, label: str) -> None:
    if not ids:
        raise SmokeInputError(f"{label}: empty prompt", field="prompt", expected="at least one token",
                              found=0)
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise SmokeInputError(f"{label}: token id {bad} is outside the vocabulary 0..{vocab_size - 1}",
                              field="prompt", expected=f"0..{vocab_size - 1}", found=bad)


def _write_atomic(path: Path, write) -> None:
    """Write a file through a hidden temporary sibling renamed into place."""
    path = Path(path)
    tmp = path.parent / f".{path.name}.dspark-tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        with open(tmp, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        raise write_error(exc, path) from None
    finally:
        if tmp.exists():
            tmp.unlink()


def _plot(path: Path, rates: list[float | None], tau: float, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    positions = list(range(len(rates)))
    ax.bar(positions, [r if r is not None else 0.0 for r in rates], color="C0")
    ax.set_xticks(positions)
    ax.set_ylim(0, 1)
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate")
    ax.set_title(f"{title}  (tau = {tau:.2f})", fontsize=9)
    fig.tight_layout()
    try:
        _write_atomic(path, lambda fh: fig.savefig(fh, format="png", dpi=100))
    finally:
        plt.close(fig)


def run_smoke(artifact: str | os.PathLike, *, target: str | os.PathLike,
              prompts: list[list[int]] | None = None, prompt_text: str | None = None,
              max_new_tokens: int = 64, temperature: float = 0.0,
              confidence_threshold: float = 0.0, seed: int = 0, device: str = "auto",
              trace: str | os.PathLike | None = None, plot: str | os.PathLike | None = None,
              reference: str | os.PathLike | None = None, min_tau: float | None = None,
              progress: Progress | None = None) -> SmokeResult:
    """Run the artifact's drafter on ``target`` for each prompt and check the result."""
    progress = progress or NoProgress()
    _check_options(max_new_tokens=max_new_tokens, temperature=temperature,
                   confidence_threshold=confidence_threshold, min_tau=min_tau)
    for out in (trace, plot):
        if out is not None and not Path(out).parent.is_dir():
            raise OutputWriteError(f"{out}: cannot write the output: the directory "
                                   f"{Path(out).parent} does not exist", path=str(out),
                                   expected="an existing directory", found="nothing")
    from .runtime.drafter import DSparkDrafter
    from .runtime.qwen3 import Qwen3Target
    from .runtime.speculative import speculative_generate, target_greedy
    from .runtime.trace import (
        compare_run,
        find_reference_run,
        implied_max_new_tokens,
        load_reference,
        run_to_json,
        trace_to_json,
    )
    from .runtime.weights import load_drafter_weights

    artifact, target_dir = Path(artifact), Path(target)
    dev = resolve_device(device)
    warnings = _validate(artifact, progress)
    model = Qwen3Target(target_dir, device=dev)
    weights = load_drafter_weights(artifact, device=dev)
    bind_target(weights, model)
    drafter = DSparkDrafter(weights, embed=model.embed, lm_head=model.lm_head, device=dev)
    vocab = model.config.vocab_size
    stops = model.config.stop_token_ids

    ref_runs = load_reference(reference) if reference is not None else None
    all_prompts = [list(p) for p in prompts or []]
    if prompt_text is not None:
        all_prompts.append(_encode_text(target_dir, prompt_text, vocab))
    if not all_prompts:
        if ref_runs is None:
            raise SmokeInputError("no prompt: pass --prompt-ids, --prompt or --reference",
                                  field="prompt", expected="a prompt", found="none")
        all_prompts = [list(r.prompt) for r in ref_runs
                       if r.temperature == temperature and r.confidence_threshold == confidence_threshold]
        if not all_prompts:
            raise ReferenceTraceError(f"reference {reference}: no run at temperature {temperature:g}, "
                                      f"confidence threshold {confidence_threshold:g}",
                                      path=str(reference), found="none")
    for i, ids in enumerate(all_prompts):
        _check_prompt(ids, vocab, f"prompt {i}")
    matched = []
    if ref_runs is not None:
        for ids in all_prompts:
            ref = find_reference_run(ref_runs, ids, temperature, confidence_threshold, path=str(reference))
            implied = implied_max_new_tokens(ref, stops)
            if implied is not None and implied != max_new_tokens:
                raise ReferenceTraceError(
                    f"reference {reference}: runs[{ref.index}] generated {implied} new tokens; "
                    f"--max-new-tokens is {max_new_tokens}: the settings differ",
                    path=str(reference), field="max_new_tokens", expected=implied,
                    found=max_new_tokens)
            matched.append(ref)

    runs_json, summaries, results, greedy_seconds = [], [], [], 0.0
    lossless_failure = None
    progress.start("smoke", len(all_prompts))
    try:
        for i, ids in enumerate(all_prompts):
            run = speculative_generate(model, drafter, ids, max_new_tokens=max_new_tokens,
                                       temperature=temperature,
                                       confidence_threshold=confidence_threshold,
                                       stop_token_ids=stops, seed=seed)
            greedy = None
            if temperature == 0.0:
                g = target_greedy(model, ids, max_new_tokens=max_new_tokens, stop_token_ids=stops)
                greedy, greedy_seconds = g.output_ids, greedy_seconds + g.seconds
                if greedy != run.output_ids and lossless_failure is None:
                    lossless_failure = (i, run.output_ids, greedy)
            results.append(run)
            runs_json.append(run_to_json(run, max_new_tokens=max_new_tokens, target_greedy=greedy))
            steps = len(run.acceptance_lengths)
            summaries.append(RunSummary(
                prompt=ids, output_ids=list(run.output_ids), new_tokens=run.new_tokens,
                verify_steps=steps, tau=sum(run.acceptance_lengths) / steps if steps else 0.0,
                lossless=None if greedy is None else greedy == run.output_ids,
                reference_run=matched[i].index if matched else None))
            progress.advance(1)
    finally:
        progress.finish()

    B = drafter.block_size
    proposed_at, accepted_at = [0] * B, [0] * B
    for run in results:
        for cycle in run.cycles:
            for k in range(B):
                proposed_at[k] += len(cycle.proposed) > k
                accepted_at[k] += cycle.accepted > k
    steps = [a for run in results for a in run.acceptance_lengths]
    tau = sum(steps) / len(steps) if steps else 0.0
    drafted = sum(len(c.proposed) for run in results for c in run.cycles)
    committed = sum(run.new_tokens for run in results)
    draft_s = sum(run.draft_seconds for run in results)
    total_s = sum(run.total_seconds for run in results)
    rates = [accepted_at[k] / proposed_at[k] if proposed_at[k] else None for k in range(B)]

    if trace is not None:
        doc = trace_to_json(runs_json, case=artifact.name, target=str(target_dir))
        _write_atomic(Path(trace), lambda fh: fh.write((json.dumps(doc, indent=1) + "\n").encode()))
    if plot is not None:
        _plot(Path(plot), rates, tau, f"{artifact.name}: acceptance by draft position")

    if lossless_failure is not None:
        i, got, want = lossless_failure
        pos = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        raise LosslessnessError(
            f"prompt {i}: temperature 0 output differs from the target's greedy output at position "
            f"{pos}: expected {want[pos] if pos < len(want) else 'end'}, found "
            f"{got[pos] if pos < len(got) else 'end'}", field=f"runs[{i}].output_ids",
            expected=str(list(want)), found=str(list(got)))
    for i, ref in enumerate(matched):
        compare_run(runs_json[i], ref, label=f"prompt {i}", path=str(reference))
    if min_tau is not None and tau < min_tau:
        raise AcceptanceFloorError(f"tau (mean accepted+1 per verify step) is {tau:.3f}; "
                                   f"--min-tau is {min_tau:g}", field="tau", expected=f">= {min_tau}",
                                   found=round(tau, 6))
    return SmokeResult(
        artifact=str(artifact), target=str(target_dir), device=str(dev), temperature=temperature,
        confidence_threshold=confidence_threshold, seed=seed, max_new_tokens=max_new_tokens,
        block_size=B, runs=summaries, tau=tau, acceptance_by_position=rates,
        drafted_tokens=drafted, committed_tokens=committed,
        drafted_tokens_per_second=drafted / draft_s if draft_s > 0 else 0.0,
        committed_tokens_per_second=committed / total_s if total_s > 0 else 0.0,
        target_only_tokens_per_second=(committed / greedy_seconds
                                       if temperature == 0.0 and greedy_seconds > 0 else None),
        lossless=None if temperature > 0 else lossless_failure is None,
        reference=None if reference is None else str(reference), min_tau=min_tau,
        warnings=warnings, trace=None if trace is None else str(trace),
        plot=None if plot is None else str(plot))
