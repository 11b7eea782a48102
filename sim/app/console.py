"""The console kvsim's commands print their tables to."""

from __future__ import annotations

import sys

from rich.console import Console

#: Table width when the output is not a terminal (a CI log, a file, a pipe): wide enough
#: that figures are never cut to "107.…" as they would be at rich's default of 80.
LOG_WIDTH = 160


def make_console() -> Console:
    """A terminal's own width; :data:`LOG_WIDTH` columns when stdout is not a terminal.
    No emoji codes: kvsim's texts have colons in them (``row:bank:column`` would print a
    bank emoji)."""
    if sys.stdout.isatty():
        return Console(emoji=False)
    return Console(width=LOG_WIDTH, emoji=False)


def fmt_bytes_per_s(v: float) -> str:
    """A rate in GB/s, for the console."""
    return f"{v / 1e9:,.3f} GB/s"


def fmt_s(v: float) -> str:
    """Seconds in s, ms or µs, for the console."""
    if v >= 1:
        return f"{v:.3f} s"
    if v >= 1e-3:
        return f"{v * 1e3:.3f} ms"
    return f"{v * 1e6:.3f} µs"
