"""How a report's values read in a table cell (report.md and the speed plot share them)."""

from __future__ import annotations

from dspark_convert.util.text import shown


def ms_cell(spread) -> str:
    """A time spread (metrics.Spread: median and p90, seconds) as "median / p90" in ms."""
    return "-" if spread is None else f"{1000 * spread.median:.2f} / {1000 * spread.p90:.2f}"


def mib_cell(mem) -> str:
    """A peak memory (metrics.PeakMemory) in MiB."""
    return "-" if mem is None else f"{mem.bytes / 2 ** 20:.0f}"


def md_cell(text: object) -> str:
    """A value from the inputs as a table cell: escaped (text.shown), no pipe."""
    return shown(text).replace("|", "\\|")


def run_label(run) -> str:
    """A run (report.RunReport) as the tables name it."""
    if run.kind == "target":
        return "target alone"
    thr = "off" if not run.confidence_threshold else f"{run.confidence_threshold:g}"
    calibrated = ", calibrated" if run.confidence_temperatures and run.confidence_threshold else ""
    return f"{md_cell(run.artifact)} (cutoff {thr}{calibrated})"
