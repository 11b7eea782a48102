"""Parameter sweeps: a base run config and axes, run as the cartesian product of the axes'
values on a local process pool or a Dask distributed cluster.

A sweep file (TOML)::

    base = "quickstart.toml"        # a run config, relative to this file; or a [base] table
                                    # holding one; without it, the embedded default
    set = ["workload.output_tokens=4"]   # overrides of the base, as --set
    [axes]                          # dotted config fields -> lists of values
    kv.format = ["bf16", "int8", "kivi-4", "kivi-2"]
    workload.prompt_tokens = [512, 2048]

    [outputs]
    metrics = ["decode.time_per_token_s", "kv_cache.bytes_per_token"]   # plotted
    save_points = false             # also write each point's metrics.json, trace.json and
                                    # report.html into points/NNN/

Points are numbered in the product's order (the first axis varies slowest). Each point is
the base config with its axis values set as ``--set`` would set them, and every point is
validated (schema and :func:`sim.app.check.check_run`) before any runs: a bad value is one
error naming the point and the field (``sim.app.sweep.file``). Each point returns the columns
of its typed result (:meth:`traces.results.GenerateMetrics.columns`: one level of dotted
names, ``decode.time_per_token_s``; the resolved config and per-call lists are left out),
or its error; a failed point does not lose the others (``sim.app.sweep.executor``). The results
are written as ``results.csv`` and ``results.json`` (one row per point, every metric a
column, sorted by point: the same sweep gives byte-identical files on any executor and any number of
workers) and ``report.html`` (each plotted metric against each axis).

Points run without a trace (``outputs.trace = "off"``) unless ``save_points`` asks for
their files: a sweep writes no trace of its own. On a Dask cluster, every worker needs
kvsim installed (the same version as the client): a point is a call of
:func:`run_point`. The public names of the three modules are importable from here.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sim.app.sweep.executor import error_line, execute, flatten_metrics, run_point
from sim.app.sweep.file import (
    DEFAULT_METRICS,
    SWEEP_KEYS,
    Point,
    SweepConfig,
    SweepOutputs,
    build_sweep,
    is_sweep_tree,
    load_sweep,
    parse_axis,
    validate_point,
)


@dataclass
class SweepResult:
    sweep: SweepConfig
    columns: list[str]
    rows: list[dict[str, Any]]
    paths: dict[str, Path]
    wall_s: float
    executor: str
    workers: int

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["status"] != "ok"]


# --- results --------------------------------------------------------------------------------

def table(sweep: SweepConfig, results: list[dict[str, Any]]) -> tuple[list[str], list[dict]]:
    """Columns and rows: ``index``, the axes, ``status``, ``error``, then every metric any
    point has, in the order the points (by index) first give them."""
    metric_cols: dict[str, None] = {}
    for res in results:
        metric_cols.update(dict.fromkeys(res["metrics"]))
    columns = ["index", *sweep.axes, "status", "error", *metric_cols]
    rows = []
    for point, res in zip(sweep.points, results, strict=True):
        assert point.index == res["index"]
        row: dict[str, Any] = {"index": point.index, **dict(point.values),
                               "status": "ok" if res["error"] is None else "error",
                               "error": res["error"] or ""}
        for c in metric_cols:
            row[c] = res["metrics"].get(c)
        rows.append(row)
    return columns, rows


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    if isinstance(value, int | str):
        return str(value)
    return json.dumps(value, sort_keys=True)


def results_csv(columns: list[str], rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for row in rows:
        w.writerow([_cell(row.get(c)) for c in columns])
    return buf.getvalue()


def results_json(sweep: SweepConfig, columns: list[str], rows: list[dict[str, Any]]) -> str:
    doc = {"sweep": {"base": sweep.base, "axes": sweep.axes, "points": len(sweep.points),
                     "metrics": sweep.metrics},
           "columns": columns, "rows": rows}
    return json.dumps(doc, indent=1, allow_nan=False, default=str) + "\n"


def report_html(sweep: SweepConfig, rows: list[dict[str, Any]]) -> str:
    from traces.report import sweep_report

    title = f"kvsim sweep: {Path(sweep.source).name}" if sweep.source else "kvsim sweep"
    return sweep_report(title, sweep.axes, rows, sweep.metrics)


#: Every file a sweep's output set may hold.
SWEEP_OUTPUTS = ("results.csv", "results.json", "report.html")


def run_sweep(sweep: SweepConfig, out_dir: str | Path, *,
              executor: Literal["local", "dask"] = "local", workers: int | None = None,
              scheduler: str | None = None, progress: bool = True,
              flag: str = "--out") -> SweepResult:
    """Run a validated sweep and write ``results.csv``, ``results.json`` and
    ``report.html`` into ``out_dir`` as one set (whole or not at all); with
    ``outputs.save_points``, each point's run outputs into ``out_dir/points/NNN/`` as
    it arrives. Outputs that cannot be written are a :class:`kvsim.errors.OutputError`
    naming ``flag`` and where, after every point has run; it carries the sweep's
    result (``err.result``, without paths), so the caller can still show it."""
    from kvsim.errors import OutputError
    from kvsim.files import write_output_set
    from sim.app.run import RUN_OUTPUTS

    out = Path(out_dir)
    t0 = time.perf_counter()
    width = len(str(len(sweep.points) - 1))
    n_workers = max(1, min(workers or os.cpu_count() or 1, len(sweep.points)))
    paths: dict[str, Path] = {}
    unsaved: list[str] = []  # the points whose files could not be written, and why

    def save_files(res: dict) -> None:
        # written as each point arrives: a long sweep's finished points are on disk early
        files = res.get("files", {})
        res["files"] = {}
        if not files:
            return
        ordered = {n: files[n] for n in RUN_OUTPUTS if n in files}
        try:
            write_output_set(out / "points" / f"{res['index']:0{width}d}", ordered,
                             flag=flag, members=RUN_OUTPUTS)
        except OutputError as err:  # the sweep goes on: its results are still in memory
            unsaved.append(str(err))

    results = execute(sweep, executor=executor, workers=workers, scheduler=scheduler,
                      progress=progress, on_result=save_files)
    wall = time.perf_counter() - t0
    columns, rows = table(sweep, results)
    texts = {"results.csv": results_csv(columns, rows),
             "results.json": results_json(sweep, columns, rows),
             "report.html": report_html(sweep, rows)}
    result = SweepResult(sweep, columns, rows, paths, wall, executor, n_workers)
    try:
        written = write_output_set(out, texts, flag=flag, members=SWEEP_OUTPUTS)
    except OutputError as err:
        err.result = result
        raise
    for key, name in (("results_csv", "results.csv"), ("results_json", "results.json"),
                      ("report", "report.html")):
        paths[key] = written[name]
    if sweep.outputs.save_points:
        paths["points"] = out / "points"
    if unsaved:
        err = OutputError(f"{len(unsaved)} of {len(sweep.points)} points' run outputs "
                          f"could not be written into {str(out / 'points')!r}; the first: "
                          f"{unsaved[0]} (results.csv, results.json and report.html were "
                          f"written)")
        err.result = result
        raise err
    return result


__all__ = ["DEFAULT_METRICS", "SWEEP_KEYS", "Point", "SweepConfig", "SweepOutputs",
           "SweepResult", "build_sweep", "error_line", "execute", "flatten_metrics",
           "is_sweep_tree", "load_sweep", "parse_axis", "report_html", "results_csv",
           "results_json", "run_point", "run_sweep", "table", "validate_point"]
