"""How the library reports long steps. The CLI draws them as rich progress bars
(cli/progress.py); library code never prints."""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    def start(self, label: str, total: int) -> None: ...
    def advance(self, amount: int) -> None: ...
    def finish(self) -> None: ...


class NoProgress:
    """The default: report nothing."""

    def start(self, label: str, total: int) -> None:
        pass

    def advance(self, amount: int) -> None:
        pass

    def finish(self) -> None:
        pass
