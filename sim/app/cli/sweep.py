"""``kvsim sweep FILE``: a parameter sweep, its table of results on the console."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console
from rich.table import Table

from kvsim.errors import ConfigError
from sim.progress import progress_enabled


def _metric_column(name: str, values: list) -> tuple[str, list[str]]:
    """A results column for the console: its label with the unit, and its cells."""
    from traces.report import fmt_number, quantity

    def number(v) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool)

    label, scale = quantity(name, [v for v in values if number(v)])
    cells = [fmt_number(v / scale if scale != 1 else v) if number(v) else
             ("" if v is None else str(v)) for v in values]
    return label, cells


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
    result = run_sweep(sweep, args.out, executor=args.executor, workers=args.workers,
                       scheduler=args.scheduler,
                       progress=not args.quiet and progress_enabled())
    failed = result.failed
    if not args.quiet:
        t = Table(title=f"{len(result.rows)} points in {result.wall_s:,.1f} s "
                        f"({result.executor}, {result.workers} workers)")
        shown = [_metric_column(m, [r.get(m) for r in result.rows])
                 for m in sweep.metrics if m in result.columns]
        for col in ("#", *sweep.axes, "status", *(label for label, _ in shown)):
            t.add_column(col, justify="right", overflow="fold")
        for i, r in enumerate(result.rows):
            t.add_row(str(r["index"]), *(str(r[a]) for a in sweep.axes), r["status"],
                      *(cells[i] for _, cells in shown))
        console.print(t)
        for name, p in result.paths.items():
            console.print(f"{name}: {p}")
    for r in failed:
        point = sweep.points[r["index"]]
        print(f"kvsim: point {r['index']} ({point.label}) failed: {r['error']}\n"
              f"  to run it alone: {sweep.rerun_hint(point)}", file=sys.stderr)
    if failed:
        print(f"kvsim: {len(failed)} of {len(result.rows)} points failed; the others' "
              f"results are in {args.out}", file=sys.stderr)
        return 1
    return 0
