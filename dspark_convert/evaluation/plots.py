"""The report's PNGs (matplotlib, Agg backend; nothing is shown).

- ``acceptance.png``: acceptance rate by draft position, conditional, one line per
  artifact (cutoff off, at each temperature);
- ``static_cutoff.png``: tau and mean verified length against the confidence threshold
  (threshold 0 = cutoff off), per artifact with a confidence head and temperature;
- ``reliability-<artifact>.png``: DeepSpec's reliability diagram per draft position
  (mean observed against mean predicted prefix acceptance per non-empty bin, bin weights
  behind), raw head, and after STS on the held-out split when calibrated;
- ``speed.png``: the speed table (tokens/s, speedup, per-step times, peak memory).
"""

from __future__ import annotations

from pathlib import Path

from dspark_convert.evaluation.metrics import PositionConfidence


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path, *, tight: bool = False) -> None:
    from dspark_convert.util.atomic import write_error

    plt = _plt()
    try:
        fig.savefig(path, format="png", dpi=100, bbox_inches="tight" if tight else None)
    except OSError as exc:
        raise write_error(exc, path) from None
    finally:
        plt.close(fig)


def _tau_text(tau: float | None) -> str:
    """tau for a legend: undefined (None) when the run had no verify step, as report.md says."""
    return "tau undefined: no verify step" if tau is None else f"tau {tau:.2f}"


def _y(value: float | None) -> float:
    """A value to plot: an undefined one (None) is a gap in its line, not a zero."""
    return float("nan") if value is None else value


def acceptance_plot(report, path: Path) -> bool:
    runs = [r for r in report.runs if r.kind == "drafter" and not r.confidence_threshold
            and r.acceptance is not None]
    if not runs:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    several_t = len({r.temperature for r in runs}) > 1
    for r in runs:
        rates = r.acceptance.acceptance_by_position
        xs = [k for k, v in enumerate(rates) if v is not None]
        label = r.artifact + (f" T={r.temperature:g}" if several_t else "")
        ax.plot(xs, [rates[k] for k in xs], "o-", label=f"{label} ({_tau_text(r.acceptance.tau)})")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("draft position k")
    ax.set_ylabel("P(accepted > k | proposed > k)")
    ax.set_title("Acceptance by draft position (cutoff off)", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, path)
    return True


def cutoff_plot(report, path: Path) -> bool:
    series = {}
    for r in report.runs:
        if r.kind != "drafter" or r.acceptance is None:
            continue
        art = next(a for a in report.artifacts if a.name == r.artifact)
        if not art.confidence_head:
            continue
        series.setdefault((r.artifact, r.temperature), []).append(
            (r.confidence_threshold or 0.0, r.acceptance.tau, r.acceptance.mean_verified_length))
    series = {k: sorted(v) for k, v in series.items() if len(v) > 1}
    if not series:
        return False
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.8))
    for (name, t), points in series.items():
        xs = [p[0] for p in points]
        ax1.plot(xs, [_y(p[1]) for p in points], "o-", label=f"{name} T={t:g}")
        ax2.plot(xs, [_y(p[2]) for p in points], "o-", label=f"{name} T={t:g}")
    ax1.set_ylabel("tau (accepted+1 per verify step)")
    ax2.set_ylabel("mean verified length L")
    for ax in (ax1, ax2):
        ax.set_xlabel("confidence threshold (0 = off)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Static confidence cutoff", fontsize=10)
    fig.tight_layout()
    _save(fig, path)
    return True


def _reliability_axes(ax, entry: PositionConfidence, color: str, label: str) -> None:
    bins = entry.reliability
    if not bins:
        return
    ax.plot([b.avg_pred for b in bins], [b.avg_target for b in bins], "o-", color=color,
            markersize=3, linewidth=1.2, label=f"{label} ECE {100 * entry.ece:.1f}%")


def reliability_plot(artifact, path: Path, held_out_raw=None, held_out_calibrated=None) -> bool:
    """Raw: the artifact's confidence (all prompts). With a calibration: also the held-out
    split before and after STS."""
    conf = artifact.confidence
    if conf is None:
        return False
    plt = _plt()
    B = len(conf.per_position)
    ncols = min(4, B)
    nrows = (B + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.2 * ncols, 3.0 * nrows), squeeze=False)
    for k, entry in enumerate(conf.per_position):
        ax = axes[k // ncols][k % ncols]
        ax.plot([0, 1], [0, 1], "--", color="0.7", linewidth=1)
        _reliability_axes(ax, entry, "C0", "raw")
        if held_out_raw is not None and held_out_calibrated is not None:
            _reliability_axes(ax, held_out_raw[k], "C1", "held-out raw")
            _reliability_axes(ax, held_out_calibrated[k], "C2", "held-out STS")
        if entry.reliability:
            twin = ax.twinx()
            twin.bar([(b.range[0] + b.range[1]) / 2 for b in entry.reliability],
                     [b.weight for b in entry.reliability], width=0.05, color="C0", alpha=0.15)
            twin.set_yticks([])
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        if k % ncols == 0:
            ax.set_ylabel("observed", fontsize=8)
        if k + ncols >= B:
            ax.set_xlabel("predicted", fontsize=8)
        auc = "-" if entry.auc is None else f"{entry.auc:.3f}"
        ax.set_title(f"k={k}  AUROC {auc}", fontsize=8)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6, loc="upper left")
        else:       # no draft token reached position k: nothing to calibrate against
            ax.text(0.5, 0.5, "no data", ha="center", va="center", fontsize=8, color="0.5")
        ax.tick_params(labelsize=7)
    for k in range(B, nrows * ncols):
        axes[k // ncols][k % ncols].axis("off")
    fig.suptitle(f"{artifact.name}: predicted vs observed prefix acceptance "
                 f"(T={conf.temperature:g})", fontsize=10)
    fig.tight_layout()
    _save(fig, path)
    return True


def speed_plot(report, path: Path) -> bool:
    if not report.runs:
        return False
    from dspark_convert.evaluation.cells import mib_cell, ms_cell, run_label

    plt = _plt()
    header = ["run", "T", "tok/s", "speedup", "draft ms p50/p90", "verify ms p50/p90", "peak MiB"]
    rows = []
    for r in report.runs:
        speed = "1.00x" if r.kind == "target" else (f"{r.speedup:.2f}x" if r.speedup else "-")
        tps = "-" if r.committed_tokens_per_second is None else f"{r.committed_tokens_per_second:.0f}"
        rows.append([run_label(r).replace("\\|", "|"), f"{r.temperature:g}", tps, speed,
                     ms_cell(r.draft_seconds_per_step), ms_cell(r.verify_seconds_per_step),
                     mib_cell(r.peak_memory)])
    fig, ax = plt.subplots(figsize=(8, 0.3 * (len(rows) + 2)))
    ax.axis("off")
    table = ax.table(cellText=rows, colLabels=header, loc="center", cellLoc="left")
    table.auto_set_font_size(False)
    table.set_fontsize(8)
    table.auto_set_column_width(list(range(len(header))))
    table.scale(1.0, 1.3)
    env = report.environment
    ax.set_title(f"Speed on {env.device} ({env.device_name}), {env.dtype}, "
                 f"{env.torch_threads} thread(s)", fontsize=9)
    _save(fig, path, tight=True)
    return True


def write_plots(report, directory: Path) -> list[str]:
    """Every plot the report has data for; returns the file names written."""
    names = []
    if acceptance_plot(report, directory / "acceptance.png"):
        names.append("acceptance.png")
    if cutoff_plot(report, directory / "static_cutoff.png"):
        names.append("static_cutoff.png")
    for art in report.artifacts:
        name = f"reliability-{art.name}.png"
        raw = art.held_out_raw.per_position if art.held_out_raw else None
        calibrated = art.held_out_calibrated.per_position if art.held_out_calibrated else None
        if reliability_plot(art, directory / name, raw, calibrated):
            names.append(name)
    if speed_plot(report, directory / "speed.png"):
        names.append("speed.png")
    return names
