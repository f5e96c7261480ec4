"""A rich progress bar behind the library's Progress protocol (on stderr)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)


class RichProgress:
    """``counted``: the bars count items (prompts: "3/16", elapsed, remaining) instead of
    bytes (size, speed, remaining)."""

    def __init__(self, enabled: bool = True, *, counted: bool = False) -> None:
        self._counted = counted
        self._console = Console(stderr=True)
        # Bars only on a terminal, and transient: a log or a CI job gets no bar debris,
        # and an error stays the one line after them.
        self._enabled = enabled and self._console.is_terminal
        self._progress: Progress | None = None
        self._task = None

    def start(self, label: str, total: int) -> None:
        if not self._enabled:
            return
        self.finish()
        amounts = (MofNCompleteColumn(), TimeElapsedColumn()) if self._counted \
            else (DownloadColumn(), TransferSpeedColumn())
        self._progress = Progress(TextColumn("{task.description:<20}"), BarColumn(), *amounts,
                                  TimeRemainingColumn(), console=self._console, transient=True)
        self._progress.start()
        self._task = self._progress.add_task(label, total=total)

    def advance(self, amount: int) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, amount)

    def finish(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
