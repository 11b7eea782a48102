"""``kvsim sweep FILE``: a parameter sweep, its table of results on the console (figures
never folded)."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvsim.errors import ConfigError, OutputError
from sim.progress import progress_enabled


def metric_column(name: str, values: list) -> tuple[str, list[str]]:
    """A results column for the console: its label with the unit, and its cells."""
    from traces.report import fmt_number, quantity

    def number(v) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool)

    label, scale = quantity(name, [v for v in values if number(v)])
    cells = [fmt_number(v / scale if scale != 1 else v) if number(v) else
             ("" if v is None else str(v)) for v in values]
    return label, cells


def print_sweep_table(sweep, result, console: Console) -> None:
    """The sweep's results as a table, then the files written. Figures are never folded:
    each metric column is as wide as its widest figure (its header wraps at spaces), and
    when they do not all fit the console, the metrics go into several tables, each with the
    point's number, axes and status."""
    keys = [("#", [str(r["index"]) for r in result.rows]),
            *((a, [escape(str(r[a])) for r in result.rows]) for a in sweep.axes),
            ("status", [escape(str(r["status"])) for r in result.rows])]
    shown = [metric_column(m, [r.get(m) for r in result.rows])
             for m in sweep.metrics if m in result.columns]

    def width(col: tuple[str, list[str]], fold: int | None = None) -> int:
        """A column's text plus padding and rule: its widest cell, and its header's
        longest word (or ``fold`` characters of it, for an axis name folded anywhere)."""
        label, cells = col
        head = max(len(w) for w in label.split()) if fold is None else min(len(label), fold)
        return max([head] + [len(c) for c in cells]) + 3

    parts: list[list[tuple[str, list[str]]]] = [[]]
    base = 1 + sum(width(k, fold=10) for k in keys)
    used = base
    for col in shown:
        if parts[-1] and used + width(col) > console.width:
            parts.append([])
            used = base
        parts[-1].append(col)
        used += width(col)
    title = (f"{len(result.rows)} points in {result.wall_s:,.1f} s "
             f"({result.executor}, {result.workers} workers)")
    for n, part in enumerate(parts, start=1):
        t = Table(title=title + (f", part {n} of {len(parts)}" if len(parts) > 1 else ""))
        # the widths packed above, fixed: no figure or metric header word folds; headers
        # unfolded where the whole part fits so
        wide = 1 + sum(width(c, fold=len(c[0])) for c in (*keys, *part)) <= console.width
        for col in keys:
            t.add_column(col[0], justify="right", overflow="fold",
                         width=width(col, len(col[0]) if wide else 10) - 3)
        for col in part:
            t.add_column(col[0], justify="right", overflow="fold",
                         width=width(col, len(col[0]) if wide else None) - 3)
        for i in range(len(result.rows)):
            t.add_row(*(cells[i] for _, cells in keys), *(cells[i] for _, cells in part))
        console.print(t)
    for name, p in result.paths.items():
        console.print(f"{name}: {p}")


def cmd_sweep(args: argparse.Namespace, console: Console) -> int:
    from kvsim.files import check_out_folder
    from sim.app.sweep.sweep import load_sweep, run_sweep

    sweep = load_sweep(args.sweep, args.set, args.axis)
    check_out_folder(args.out, "--out")
    if args.workers is not None and args.workers < 1:
        raise ConfigError(f"--workers: must be >= 1, got {args.workers}")
    if args.scheduler and args.executor != "dask":
        raise ConfigError("--scheduler: only with --executor dask")
    if not args.quiet:
        where = (f"dask scheduler {args.scheduler}" if args.scheduler else
                 "a dask LocalCluster" if args.executor == "dask" else "local processes")
        console.print(f"[bold]kvsim sweep[/bold] {args.sweep}: {len(sweep.points)} points "
                      f"on {where}")
    try:
        result = run_sweep(sweep, args.out, executor=args.executor, workers=args.workers,
                           scheduler=args.scheduler,
                           progress=not args.quiet and progress_enabled())
    except OutputError as err:  # the table still reaches the user; then where it could not go
        if err.result is not None and not args.quiet:
            print_sweep_table(sweep, err.result, console)
        raise
    failed = result.failed
    if not args.quiet:
        print_sweep_table(sweep, result, console)
    for r in failed:
        point = sweep.points[r["index"]]
        print(f"kvsim: point {r['index']} ({point.label}) failed: {r['error']}\n"
              f"  to run it alone: {sweep.rerun_hint(point)}", file=sys.stderr)
    if failed:
        print(f"kvsim: {len(failed)} of {len(result.rows)} points failed; the others' "
              f"results are in {args.out}", file=sys.stderr)
        return 1
    return 0
