"""Latency regression checks: a baseline file records the key figures of a list of run
configs; ``kvsim regress BASELINE`` runs them again and fails when a figure moved.

Simulated time is deterministic (integer picoseconds, every random source seeded), so the
default tolerance of every figure is 0: any change in a timeline shows up, and is either a
bug or a change to record on purpose with ``--update``::

    kvsim regress --create configs/regress/baseline.json configs/regress/*.toml
    kvsim regress configs/regress/baseline.json            # exit 0 pass, 1 moved, 2 bad input
    kvsim regress configs/regress/baseline.json --set hardware.dram.data_rate_mtps=4125.33
    kvsim regress configs/regress/baseline.json --scale hardware.dram.data_rate_mtps=0.99
    kvsim regress configs/regress/baseline.json --update   # record the new figures

The baseline is JSON (sorted keys, written atomically; its format and checks in
:mod:`sim.app.regress.baseline`)::

    {"version": 1,
     "entries": [{"config": "tiny.toml",         # relative to the baseline's folder
                  "sets": ["workload.seed=1"],   # --set overrides of this entry
                  "figures": {"prefill.ttft_s": 0.000111533523, ...},
                  "tolerances": {"traffic_bytes.*": 0.01}}]}

A tolerance is a relative change (0.01 = 1 %) for a figure name or an ``fnmatch``
pattern; an exact name wins over a pattern, a longer pattern over a shorter one.
The figures (:func:`figures_of`): ``prefill.ttft_s``, ``decode.time_per_token_s``,
``decode.tokens_per_s``, ``launch.time_s``, ``sim_time_s`` (workloads without a prefill,
e.g. the GEMV demo), ``traffic_bytes.*`` (DRAM and host-link bytes), ``traffic_by_kind.*``
(weights, KV cache, activations, host I/O) and, for each scheduled cache operation, its
time and bytes (``cache_ops[i].time_s``, ``.host_model_s``, ``.pcie_bytes``,
``.dram_bytes``).

The comparison and its report (:class:`Row`, :class:`Report`, :func:`print_report`) are
in :mod:`sim.app.regress.report`; this module runs the configs and holds the command line.
The public names of both are importable from here. In a test suite,
:func:`sim.testing.assert_no_regression` does the same check.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from kvsim.errors import KvsimError
from sim.app.console import make_console
from sim.app.regress.baseline import (
    BASELINE_VERSION,
    Baseline,
    Entry,
    RegressError,
    check_tolerances,
    is_number,
    load_baseline,
)
from sim.app.regress.report import GROUP_FIGURES, Report, Row, compare, print_report, tolerance_for
from sim.progress import Phases, progress_enabled
from traces.results import RunFigures, RunMetrics

EXIT_PASS, EXIT_MOVED, EXIT_BAD_INPUT = 0, 1, 2
#: Runs for a regression check need no trace; the trace level changes no figure
#: (tests/test_regress.py checks that). An entry's own sets, or --set, can override it.
RUN_SETS = ("outputs.trace=off",)
DESCRIPTION = ("Re-run the configs of a baseline file and compare their key figures (TTFT, "
               "time per token, DRAM/PCIe bytes by kind, cache-op times). Exit 0: pass, 1: a "
               "figure moved beyond its tolerance, 2: bad input.")


# --- figures --------------------------------------------------------------------------------


def _config_value(tree: Mapping[str, Any], dotted: str) -> Any:
    """A field of a resolved run config by its ``--set`` name (``hardware.dram.efficiency``);
    None if there is none. (Config fields are named by dotted paths; metrics are read
    through :mod:`traces.results`.)"""
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def figures_of(metrics: RunMetrics) -> dict[str, float]:
    """The key figures of a run's typed result, by dotted name, sorted: its
    :class:`traces.results.RunFigures` under their ``metrics.json`` names."""
    return RunFigures.of(metrics).figures()


# --- running ----------------------------------------------------------------------------------


def _scaled_sets(config: Path | None, sets: list[str], scales: Sequence[str]) -> list[str]:
    """``--scale key=factor``: a ``--set`` of the config's own value times ``factor``."""
    if not scales:
        return []
    from sim.app.config import load_run_config

    resolved = load_run_config(config, sets).resolved()
    out = []
    for item in scales:
        key, eq, text = item.partition("=")
        key = key.strip()
        try:
            factor = float(text)
        except ValueError:
            factor = math.nan
        if not eq or not key or not math.isfinite(factor):
            raise RegressError(f"--scale {item!r}: expected key=factor (a number)")
        value = _config_value(resolved, key)
        if not is_number(value):
            raise RegressError(f"--scale {key}: not a numeric config field")
        new = value * factor
        out.append(f"{key}={round(new) if isinstance(value, int) else repr(float(new))}")
    return out


@dataclass
class _Prepared:
    entry: Entry
    config: Path | None
    sets: list[str]


def _prepare(baseline: Baseline, sets: Sequence[str], scales: Sequence[str]) -> list[_Prepared]:
    """Check every entry's config (with the sets) as ``kvsim run`` does, before running
    any: a bad entry fails fast, with the entry named."""
    from sim.app.check import check_run
    from sim.app.config import load_run_config

    out = []
    for i, entry in enumerate(baseline.entries):
        config = baseline.config_path(entry)
        all_sets = [*RUN_SETS, *entry.sets, *sets]
        try:
            all_sets += _scaled_sets(config, all_sets, scales)
            check_run(load_run_config(config, all_sets))
        except KvsimError as err:
            raise RegressError(f"{baseline.path}: entries[{i}] ({entry.label}): {err}") \
                from None
        out.append(_Prepared(entry, config, all_sets))
    return out


def run_figures(config: str | os.PathLike | None, sets: Sequence[str] = ()) -> dict[str, float]:
    """Run a config (with ``--set`` overrides) and return its figures (no files written)."""
    from sim.app.config import load_run_config
    from sim.app.run import run

    return figures_of(run(load_run_config(config, list(sets))).metrics)

# --- the three operations ---------------------------------------------------------------------


def _running(progress: Phases | None, prepared: Sequence[_Prepared], what: str) -> None:
    if progress is not None:
        progress.start(f"{what}: {len(prepared)} configs", total=len(prepared))


def _ran(progress: Phases | None) -> None:
    if progress is not None:
        progress.advance()


def check(baseline: str | os.PathLike | Baseline, *, sets: Sequence[str] = (),
          scales: Sequence[str] = (), tolerances: Mapping[str, float] | None = None,
          progress: Phases | None = None) -> Report:
    """Run every entry of ``baseline`` (each with ``sets`` and ``scales`` added) and compare
    its figures with the recorded ones. ``tolerances`` override the entries' own;
    ``progress`` counts the entries run."""
    base = baseline if isinstance(baseline, Baseline) else load_baseline(baseline)
    extra = check_tolerances(tolerances or {}, "tolerances")
    prepared = _prepare(base, sets, scales)
    t0 = time.perf_counter()
    rows: list[Row] = []
    _running(progress, prepared, "run the baseline's configs")
    for p in prepared:
        new = run_figures(p.config, p.sets)
        rows += compare(p.entry.label, p.entry.figures, new, {**p.entry.tolerances, **extra})
        _ran(progress)
    return Report(base.path, rows, time.perf_counter() - t0)


def update(baseline: str | os.PathLike, *, progress: Phases | None = None) -> Report:
    """Run every entry again and rewrite the baseline with the new figures (tolerances,
    configs and sets kept); return the report of what changed. The baseline is written
    once, atomically, after every entry ran: an interrupt leaves it as it was."""
    base = load_baseline(baseline)
    prepared = _prepare(base, (), ())
    t0 = time.perf_counter()
    rows: list[Row] = []
    entries = []
    _running(progress, prepared, "run the baseline's configs")
    for p in prepared:
        new = run_figures(p.config, p.sets)
        rows += compare(p.entry.label, p.entry.figures, new, p.entry.tolerances)
        entries.append(Entry(p.entry.config, p.entry.sets, new, p.entry.tolerances))
        _ran(progress)
    Baseline(base.path, entries).save()
    return Report(base.path, rows, time.perf_counter() - t0)


def create(configs: Iterable[str | os.PathLike], out: str | os.PathLike, *,
           sets: Sequence[str] = (), tolerances: Mapping[str, float] | None = None,
           progress: Phases | None = None) -> Baseline:
    """Run ``configs`` (each with ``sets``) and write their figures as a new baseline at
    ``out``; config paths are stored relative to ``out``'s folder."""
    out = Path(out)
    configs = [Path(c) for c in configs]
    if not configs:
        raise RegressError("--create: give at least one config")
    tols = check_tolerances(tolerances or {}, "tolerances")
    folder = out.parent.resolve()
    entries = [Entry(Path(os.path.relpath(c.resolve(), folder)).as_posix(), list(sets), {},
                     tols) for c in configs]
    base = Baseline(out, entries)
    prepared = _prepare(base, (), ())
    _running(progress, prepared, "run the configs")
    for p in prepared:
        p.entry.figures = run_figures(p.config, p.sets)
        _ran(progress)
    base.save()
    return base


# --- command line -----------------------------------------------------------------------------


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("baseline", help="baseline file (JSON)")
    p.add_argument("configs", nargs="*", metavar="CONFIG",
                   help="with --create: the run configs to record")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--create", action="store_true",
                      help="run CONFIG... and write a new baseline")
    mode.add_argument("--update", action="store_true",
                      help="run the baseline's configs and rewrite its figures on purpose")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field of every entry, e.g. "
                        "--set hardware.dram.data_rate_mtps=4125.33")
    p.add_argument("--scale", action="append", default=[], metavar="KEY=FACTOR",
                   help="multiply a numeric field of every entry's config, e.g. "
                        "--scale hardware.dram.data_rate_mtps=0.99")
    p.add_argument("--tolerance", action="append", default=[], metavar="FIGURE=REL",
                   help="relative tolerance of a figure or fnmatch pattern, e.g. "
                        "--tolerance 'traffic_bytes.*=0.01' (default 0)")
    p.add_argument("--moved-only", action="store_true", help="list only figures that changed")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress bar (it shows only on a terminal, never under CI)")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``kvsim regress`` on the CLI's subparsers (``sim.app.cli.main.build_parser``)."""
    p = subparsers.add_parser(
        "regress", help="check run figures against a baseline (exit 1 when one moved)",
        description=DESCRIPTION)
    _add_arguments(p)
    p.set_defaults(func=cmd)
    return p


def _parse_tolerances(items: Sequence[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in items:
        key, eq, text = item.partition("=")
        if not eq or not key.strip():
            raise RegressError(f"--tolerance {item!r}: expected FIGURE=REL")
        try:
            value = float(text)
        except ValueError:
            raise RegressError(f"--tolerance {item!r}: {text!r} is not a number (a relative "
                               "tolerance, 0.01 = 1 %)") from None
        out[key.strip()] = value
    return check_tolerances(out, "--tolerance")


def cmd(args: argparse.Namespace, console: Console) -> int:
    """``kvsim regress``: exit 0 pass, 1 a figure moved, 2 bad input. A progress bar of the
    configs run shows on a terminal only (``sim.progress``), gone before the report."""
    try:
        with Phases(enabled=not (args.quiet or args.json) and progress_enabled()) as progress:
            done = _work(args, progress)
    except KvsimError as err:
        print(f"kvsim: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if isinstance(done, Baseline):
        n = sum(len(e.figures) for e in done.entries)
        console.print(f"wrote {args.baseline}: {len(done.entries)} configs, {n} figures",
                      soft_wrap=True)
        return EXIT_PASS
    if args.json:
        print(json.dumps(done.to_json(), indent=1))
    else:
        print_report(done, console, moved_only=args.moved_only)
        if args.update:
            console.print(f"updated {done.baseline}", soft_wrap=True)
    return EXIT_PASS if args.update or done.ok else EXIT_MOVED


def _work(args: argparse.Namespace, progress: Phases) -> Report | Baseline:
    """What ``args`` asks: the new baseline of ``--create``, else the report."""
    tolerances = _parse_tolerances(args.tolerance)
    if args.create:
        if Path(args.baseline).exists():
            raise RegressError(f"{args.baseline} exists; rewrite its figures with "
                               f"--update, or remove it first")
        return create(args.configs, args.baseline, sets=args.set, tolerances=tolerances,
                      progress=progress)
    if args.configs:
        raise RegressError("CONFIG arguments go with --create")
    if args.update:
        if args.set or args.scale or tolerances:
            raise RegressError("--update records the configs as they are: put changes "
                               "in the config files or the entries' sets, not --set, "
                               "--scale or --tolerance")
        return update(args.baseline, progress=progress)
    return check(args.baseline, sets=args.set, scales=args.scale, tolerances=tolerances,
                 progress=progress)


def main(argv: Sequence[str] | None = None) -> int:
    """``kvsim regress`` on its own (``argv`` without the word ``regress``)."""
    p = argparse.ArgumentParser(prog="kvsim regress", description=DESCRIPTION)
    _add_arguments(p)
    try:
        args = p.parse_intermixed_args(argv)
    except SystemExit as e:  # argparse: usage errors are bad input
        return EXIT_BAD_INPUT if e.code not in (0, None) else EXIT_PASS
    console = make_console()
    return cmd(args, console)



__all__ = ["BASELINE_VERSION", "DESCRIPTION", "EXIT_BAD_INPUT", "EXIT_MOVED", "EXIT_PASS",
           "GROUP_FIGURES", "RUN_SETS", "Baseline", "Entry", "RegressError", "Report", "Row",
           "add_parser", "check", "check_tolerances", "cmd", "compare", "create", "figures_of",
           "load_baseline", "main", "print_report", "run_figures", "tolerance_for", "update"]


if __name__ == "__main__":
    sys.exit(main())
