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

The baseline is JSON (sorted keys, written atomically)::

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

In a test suite, :func:`sim.testing.assert_no_regression` does the same check.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from isa.errors import KvsimError
from sim.console import make_console
from sim.progress import Phases, progress_enabled
from sim.results import RunFigures

BASELINE_VERSION = 1
EXIT_PASS, EXIT_MOVED, EXIT_BAD_INPUT = 0, 1, 2
#: Groups whose every numeric entry is a figure (their names in ``metrics.json``).
GROUP_FIGURES = tuple(RunFigures.GROUPS.values())
#: Runs for a regression check need no trace; the trace level changes no figure
#: (tests/test_regress.py checks that). An entry's own sets, or --set, can override it.
RUN_SETS = ("outputs.trace=off",)
DESCRIPTION = ("Re-run the configs of a baseline file and compare their key figures (TTFT, "
               "time per token, DRAM/PCIe bytes by kind, cache-op times). Exit 0: pass, 1: a "
               "figure moved beyond its tolerance, 2: bad input.")


class RegressError(KvsimError, ValueError):
    """A baseline file or a regress argument is invalid; the message names the entry or
    field at fault."""


# --- figures --------------------------------------------------------------------------------


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _get(tree: Mapping[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def figures_of(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The key figures of a run's metrics (``metrics.json``), by dotted name, sorted: the
    typed :class:`sim.results.RunFigures` under their ``metrics.json`` names."""
    return RunFigures.from_metrics(metrics).figures()


# --- the baseline file ------------------------------------------------------------------------


@dataclass
class Entry:
    config: str | None  # relative to the baseline's folder; None: the embedded default
    sets: list[str] = field(default_factory=list)
    figures: dict[str, float] = field(default_factory=dict)
    tolerances: dict[str, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        name = self.config or "(embedded default)"
        return f"{name} [{' '.join(self.sets)}]" if self.sets else name

    def to_json(self) -> dict[str, Any]:
        return {"config": self.config, "sets": list(self.sets), "figures": dict(self.figures),
                "tolerances": dict(self.tolerances)}


@dataclass
class Baseline:
    path: Path
    entries: list[Entry]

    def config_path(self, entry: Entry) -> Path | None:
        return None if entry.config is None else self.path.parent / entry.config

    def to_json(self) -> dict[str, Any]:
        return {"version": BASELINE_VERSION, "entries": [e.to_json() for e in self.entries]}

    def save(self) -> None:
        from traces.io import atomic_write_json

        atomic_write_json(self.path, self.to_json(), indent=1, sort_keys=True)


def check_tolerances(tols: Any, where: str) -> dict[str, float]:
    if not isinstance(tols, Mapping):
        raise RegressError(f"{where}: must be an object of figure name (or pattern) -> "
                           f"relative tolerance")
    out = {}
    for k, v in tols.items():
        if not isinstance(k, str) or not k:
            raise RegressError(f"{where}: figure names must be non-empty strings")
        if not _is_number(v) or not math.isfinite(v) or v < 0:
            raise RegressError(f"{where}.{k}: tolerance must be a finite number >= 0, got "
                               f"{v!r}")
        out[k] = float(v)
    return out


def _entry(raw: Any, i: int, where: str) -> Entry:
    at = f"{where}: entries[{i}]"
    if not isinstance(raw, Mapping):
        raise RegressError(f"{at}: must be an object")
    unknown = sorted(set(raw) - {"config", "sets", "figures", "tolerances"})
    if unknown:
        raise RegressError(f"{at}.{unknown[0]}: unknown key")
    if "config" not in raw or "figures" not in raw:
        raise RegressError(f"{at}: needs 'config' and 'figures'")
    config = raw["config"]
    if config is not None and (not isinstance(config, str) or not config):
        raise RegressError(f"{at}.config: must be a path (string) or null")
    sets = raw.get("sets", [])
    if not isinstance(sets, list) or not all(isinstance(s, str) for s in sets):
        raise RegressError(f"{at}.sets: must be a list of 'key=value' strings")
    figures = raw["figures"]
    if not isinstance(figures, Mapping):
        raise RegressError(f"{at}.figures: must be an object of name -> number")
    for k, v in figures.items():
        if not _is_number(v) or not math.isfinite(v):
            raise RegressError(f"{at}.figures.{k}: must be a finite number, got {v!r}")
    return Entry(config, list(sets), dict(figures),
                 check_tolerances(raw.get("tolerances", {}), f"{at}.tolerances"))


def load_baseline(path: str | os.PathLike) -> Baseline:
    """Read and validate a baseline file (:class:`RegressError` on any problem)."""
    p = Path(path)
    if not p.is_file():
        raise RegressError(f"baseline {str(p)!r} does not exist "
                           f"(make one with: kvsim regress --create {p} CONFIG...)")
    try:
        data = json.loads(p.read_bytes())
    except (ValueError, UnicodeDecodeError) as err:
        raise RegressError(f"{p}: not a JSON baseline file ({err})") from None
    if not isinstance(data, dict):
        raise RegressError(f"{p}: the top level must be an object")
    unknown = sorted(set(data) - {"version", "entries"})
    if unknown:
        raise RegressError(f"{p}: {unknown[0]}: unknown key")
    if data.get("version") != BASELINE_VERSION:
        raise RegressError(f"{p}: baseline version {data.get('version')!r} is not supported "
                           f"(this kvsim reads version {BASELINE_VERSION})")
    entries = data.get("entries")
    if not isinstance(entries, list) or not entries:
        raise RegressError(f"{p}: entries: must be a non-empty list")
    return Baseline(p, [_entry(e, i, str(p)) for i, e in enumerate(entries)])


# --- running ----------------------------------------------------------------------------------


def _scaled_sets(config: Path | None, sets: list[str], scales: Sequence[str]) -> list[str]:
    """``--scale key=factor``: a ``--set`` of the config's own value times ``factor``."""
    if not scales:
        return []
    from .config import load_run_config

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
        value = _get(resolved, key)
        if not _is_number(value):
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
    from .check import check_run
    from .config import load_run_config

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
    from .config import load_run_config
    from .run import run

    return figures_of(run(load_run_config(config, list(sets))).metrics)


# --- reports ----------------------------------------------------------------------------------


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
    """Register ``kvsim regress`` on the CLI's subparsers (``sim.cli.build_parser``)."""
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


if __name__ == "__main__":
    sys.exit(main())
