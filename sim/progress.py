"""Progress of long commands on a terminal: one phase at a time (a spinner, or a bar with
the count, ``0:00:12 elapsed, 0:00:30 left`` when the phase knows its total). The one
progress display of kvsim (runs, sweeps, serving, sensitivity). Quiet when stderr is not
a terminal or ``CI`` is set, so logs and pipes get only the results.

    with Phases(enabled=progress_enabled()) as ph:
        ph.start("compile")
        ph.start("decode tokens", total=n)
        ph.advance()
"""

from __future__ import annotations

import os
import sys
from typing import IO, Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


def progress_enabled(stream: IO[str] | None = None) -> bool:
    """Whether to show progress: ``stream`` (default stderr) is a terminal and ``CI`` is
    not set."""
    stream = sys.stderr if stream is None else stream
    if os.environ.get("CI"):
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class Phases:
    """A context manager showing one phase at a time on ``console`` (default: stderr).
    ``history`` lists every phase as ``(name, completed, total)`` once it is done (total
    None for a phase without one), shown or not."""

    def __init__(self, *, enabled: bool, console: Console | None = None):
        self.enabled = enabled
        self.history: list[tuple[str, int, int | None]] = []
        self._current: tuple[str, int, int | None] | None = None
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        if enabled:
            self._progress = Progress(
                SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("elapsed,"),
                TimeRemainingColumn(), TextColumn("left"), console=console or Console(stderr=True),
                transient=True)

    def __enter__(self) -> Phases:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._finish()
        if self._progress is not None:
            self._progress.stop()

    def _finish(self) -> None:
        if self._current is not None:
            self.history.append(self._current)
            self._current = None
        if self._progress is not None and self._task is not None:
            self._progress.remove_task(self._task)
            self._task = None

    def start(self, name: str, total: int | None = None) -> None:
        """End the current phase and start ``name`` (of ``total`` steps, if known)."""
        self._finish()
        self._current = (name, 0, total)
        if self._progress is not None:
            self._task = self._progress.add_task(name, total=total)

    def advance(self, n: int = 1) -> None:
        if self._current is None:
            return
        name, done, total = self._current
        self._current = (name, done + n, total)
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, n)

    @property
    def current(self) -> tuple[str, int, int | None] | None:
        return self._current


__all__ = ["Phases", "progress_enabled"]
