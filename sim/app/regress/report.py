"""The comparison of ``kvsim regress`` (``sim.app.regress.regress``): each figure's tolerance, one
row per figure (old, new, change, status) and the report as a table and as JSON.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from traces.results import RunFigures

#: Groups whose every numeric entry is a figure (their names in ``metrics.json``).
GROUP_FIGURES = tuple(RunFigures.GROUPS.values())


def tolerance_for(name: str, tolerances: Mapping[str, float]) -> float:
    """The tolerance of figure ``name``: its exact entry, else the longest matching pattern,
    else 0."""
    if name in tolerances:
        return tolerances[name]
    matches = [p for p in tolerances if fnmatch.fnmatchcase(name, p)]
    return tolerances[max(matches, key=len)] if matches else 0.0


@dataclass(frozen=True)
class Row:
    config: str  # the entry's label
    figure: str
    old: float | None  # None: not in the baseline
    new: float | None  # None: the run no longer reports it
    tolerance: float

    @property
    def change(self) -> float | None:
        """Relative change ``new / old - 1`` (inf when a zero became non-zero)."""
        if self.old is None or self.new is None:
            return None
        if self.old == 0:
            return 0.0 if self.new == 0 else math.copysign(math.inf, self.new)
        return (self.new - self.old) / abs(self.old)

    @property
    def status(self) -> str:
        if self.new is None:
            return "missing"
        if self.old is None:
            return "new"
        if self.old == self.new:
            return "ok"
        return "moved" if abs(self.change) > self.tolerance else "within"

    @property
    def failed(self) -> bool:
        return self.status in ("moved", "missing")

    def to_json(self) -> dict[str, Any]:
        ch = self.change
        return {"config": self.config, "figure": self.figure, "old": self.old, "new": self.new,
                "change": None if ch is None or math.isinf(ch) else ch,
                "tolerance": self.tolerance, "status": self.status}


@dataclass
class Report:
    baseline: Path
    rows: list[Row]
    wall_s: float = 0.0

    @property
    def failed(self) -> list[Row]:
        return [r for r in self.rows if r.failed]

    @property
    def ok(self) -> bool:
        return not self.failed

    def moved_names(self) -> list[str]:
        """``label: figure`` of every failed row."""
        return [f"{r.config}: {r.figure}" for r in self.failed]

    def to_json(self) -> dict[str, Any]:
        return {"baseline": str(self.baseline), "ok": self.ok,
                "failed": len(self.failed), "rows": [r.to_json() for r in self.rows]}


def compare(label: str, old: Mapping[str, float], new: Mapping[str, float],
            tolerances: Mapping[str, float]) -> list[Row]:
    names = sorted(set(old) | set(new))
    return [Row(label, n, old.get(n), new.get(n), tolerance_for(n, tolerances))
            for n in names]


def _fmt_value(name: str, v: float | None) -> str:
    if v is None:
        return "-"
    if name.endswith("tokens_per_s"):
        return f"{v:,.6g} /s"
    if name.endswith("_s"):
        for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns")):
            if abs(v) >= scale or unit == "ns":
                return f"{v / scale:,.6f} {unit}"
    if (name.startswith(GROUP_FIGURES) or name.endswith("_bytes")) and float(v).is_integer():
        return f"{int(v):,} B"
    return f"{v:,.6g}"


def _fmt_change(ch: float | None) -> str:
    if ch is None:
        return "-"
    if ch == 0:
        return "0"
    if math.isinf(ch):
        return "from 0"
    pct = ch * 100
    return f"{pct:+.2e} %" if abs(pct) < 1e-3 else f"{pct:+.3f} %"


def print_report(report: Report, console: Console, *, moved_only: bool = False) -> None:
    """A table of old vs new figures with the change in %, then a line naming every figure
    that moved beyond its tolerance."""
    rows = [r for r in report.rows if r.status != "ok"] if moved_only else report.rows
    style = {"moved": "bold red", "missing": "bold red", "within": "yellow", "new": "cyan"}
    t = Table(title=escape(f"kvsim regress {report.baseline}"))
    for col, just in (("config", "left"), ("figure", "left"), ("baseline", "right"),
                      ("now", "right"), ("change", "right"), ("tolerance", "right"),
                      ("status", "left")):
        t.add_column(col, justify=just, no_wrap=col in ("figure", "status"))
    for r in rows:
        t.add_row(escape(r.config), escape(r.figure), _fmt_value(r.figure, r.old),
                  _fmt_value(r.figure, r.new),
                  _fmt_change(r.change), f"{r.tolerance * 100:g} %", r.status.upper()
                  if r.failed else r.status, style=style.get(r.status))
    if rows:
        console.print(t)
    failed = report.failed
    n = len(report.rows)
    if not failed:
        console.print(f"[bold green]PASS[/]: {n} figures within tolerance "
                      f"({report.wall_s:.1f} s)", soft_wrap=True)
        return
    by_config: dict[str, list[str]] = {}
    for r in failed:
        by_config.setdefault(escape(r.config), []).append(
            escape(f"{r.figure} ({_fmt_change(r.change) if r.status == 'moved' else r.status})"))
    console.print(f"[bold red]FAIL[/]: {len(failed)} of {n} figures moved beyond tolerance",
                  soft_wrap=True)
    for config, names in by_config.items():
        console.print(f"  {config}: {', '.join(names)}", soft_wrap=True, highlight=False)


__all__ = ["GROUP_FIGURES", "Report", "Row", "compare", "print_report", "tolerance_for"]
