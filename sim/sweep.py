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
validated (schema and :func:`sim.check.check_run`) before any runs: a bad value is one
error naming the point and the field. Each point returns its metrics flattened to one
level (``decode.time_per_token_s``; the resolved config and per-call lists are left out),
or its error; a failed point does not lose the others. The results are written as
``results.csv`` and ``results.json`` (one row per point, every metric a column, sorted by
point: the same sweep gives byte-identical files on any executor and any number of
workers) and ``report.html`` (each plotted metric against each axis).

Points run without a trace (``outputs.trace = "off"``) unless ``save_points`` asks for
their files: a sweep writes no trace of its own. On a Dask cluster, every worker needs
kvsim installed (the same version as the client): a point is a call of
:func:`run_point`.
"""

from __future__ import annotations

import copy
import csv
import io
import itertools
import json
import math
import os
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError

from isa.errors import ConfigError, KvsimError
from models.schema import Frozen, validation_message

from .config import (
    apply_sets,
    build_run_config,
    load_tree,
    parse_value,
    set_field,
    split_assignment,
)

SWEEP_KEYS = ("base", "set", "axes", "outputs")
#: Metrics plotted when the sweep file names none (those the points have).
DEFAULT_METRICS = (
    "prefill.ttft_s",
    "decode.time_per_token_s",
    "decode.tokens_per_s",
    "kv_cache.bytes_per_token",
    "traffic_by_kind.kv_cache",
    "sim_time_s",
)
#: Metrics left out of the results: bulky or not a figure of the point (the resolved
#: config; the per-call rows, one table per runtime call: thousands of columns).
SKIPPED_METRICS = ("config", "calls")


class SweepOutputs(Frozen):

    metrics: list[str] | None = Field(None, description="metrics plotted against each axis")
    save_points: bool = Field(False, description="write each point's run outputs too")


@dataclass(frozen=True)
class Point:
    """One point of a sweep: its index, its axis values and its run-config tree."""

    index: int
    values: tuple[tuple[str, Any], ...]
    tree: dict[str, Any] = field(repr=False)

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={_literal(v)}" for k, v in self.values)

    @property
    def sets(self) -> list[str]:
        """The point as ``--set`` arguments of ``kvsim run``."""
        return [f"{k}={_literal(v)}" for k, v in self.values]


@dataclass(frozen=True)
class SweepConfig:
    base: dict[str, Any]
    axes: dict[str, list[Any]]
    outputs: SweepOutputs
    points: list[Point]
    source: str | None = None
    base_file: str | None = None  # the run config file the base came from, if any
    base_sets: tuple[str, ...] = ()  # the overrides applied to it (the file's, then --set)

    def rerun_hint(self, point: Point) -> str:
        """How to run one point alone with ``kvsim run``."""
        sets = " ".join(f"--set {s}" for s in [*self.base_sets, *point.sets])
        if self.base_file is not None:
            return f"kvsim run {self.base_file} {sets}"
        where = f"of {self.source}" if self.source else ""
        return f"kvsim run with the [base] table {where} as the config, {sets}"

    @property
    def metrics(self) -> list[str]:
        return list(self.outputs.metrics) if self.outputs.metrics else list(DEFAULT_METRICS)


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


# --- the sweep file -------------------------------------------------------------------------

def _literal(value: Any) -> str:
    """A value as ``--set`` text (TOML): strings quoted only where a bare word would not
    parse back to the same string."""
    if isinstance(value, str):
        return value if parse_value(value) == value and value.strip() == value else json.dumps(
            value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(value)


def _axis_values(path: str, values: Any) -> list[Any]:
    if not isinstance(values, list):
        raise ConfigError(f"{path}: an axis is a list of values, got {_literal(values)}")
    if not values:
        raise ConfigError(f"{path}: an axis needs at least one value")
    seen: list[Any] = []
    for v in values:
        if v in seen:
            raise ConfigError(f"{path}: value {_literal(v)} is listed twice")
        seen.append(v)
    return values


def _flatten_axes(table: Any, prefix: str = "") -> dict[str, list[Any]]:
    """``{"kv": {"format": [...]}}`` (TOML dotted keys) -> ``{"kv.format": [...]}``."""
    if not isinstance(table, dict):
        raise ConfigError(f"axes{'.' + prefix if prefix else ''}: must be a table of config "
                          "fields -> lists of values")
    out: dict[str, list[Any]] = {}
    for key, value in table.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict):
            out.update(_flatten_axes(value, path))
        else:
            out[path] = _axis_values(f"axes.{path}", value)
    return out


def parse_axis(text: str) -> tuple[str, list[Any]]:
    """``--axis key=[v1, v2]`` -> ``(key, [v1, v2])`` (a single value is a one-point axis)."""
    key, parsed = split_assignment(text, "--axis", "key=[value, ...]")
    return key, _axis_values(f"--axis {key}", parsed if isinstance(parsed, list) else [parsed])


def _base_tree(data: dict[str, Any], folder: Path | None) -> tuple[dict[str, Any], str | None]:
    """The base run-config tree, and the file it came from (None: inline or default)."""
    base = data.get("base")
    if base is None:
        return load_tree(None), None
    if isinstance(base, str):
        p = Path(base)
        if not p.is_absolute() and folder is not None:
            p = folder / p
        if not p.is_file():
            raise ConfigError(f"base: run config file {str(p)!r} does not exist")
        return load_tree(p), str(p)
    if isinstance(base, dict):
        return copy.deepcopy(base), None
    raise ConfigError("base: give a run config file name or a [base] table")


def is_sweep_tree(tree: dict[str, Any]) -> bool:
    """Whether a TOML tree is a sweep file (it has axes) rather than a run config."""
    return "axes" in tree


def build_sweep(data: dict[str, Any], *, folder: Path | None = None,
                sets: list[str] | None = None, axes: list[str] | None = None,
                source: str | None = None) -> SweepConfig:
    """Validate a sweep tree: the base config with ``sets`` applied, the axes with
    ``axes`` (``--axis key=[...]``) replacing or adding axes, and every point."""
    unknown = [k for k in data if k not in SWEEP_KEYS]
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown key; a sweep file has "
                          f"{', '.join(SWEEP_KEYS)}")
    base, base_file = _base_tree(data, folder)
    file_sets = data.get("set", [])
    if not isinstance(file_sets, list) or not all(isinstance(x, str) for x in file_sets):
        raise ConfigError('set: a list of "key=value" overrides of the base config')
    base_sets = (*file_sets, *(sets or []))
    apply_sets(base, list(base_sets))
    table = _flatten_axes(data.get("axes", {}))
    for text in axes or []:
        key, values = parse_axis(text)
        table[key] = values
    if not table:
        raise ConfigError("axes: a sweep needs at least one axis (a config field and a list "
                          "of values)")
    try:
        outputs = SweepOutputs.model_validate(data.get("outputs", {}))
    except ValidationError as err:
        raise ConfigError(validation_message(err, "outputs")) from None
    points = []
    names = list(table)
    for index, combo in enumerate(itertools.product(*(table[k] for k in names))):
        tree = copy.deepcopy(base)
        values = tuple(zip(names, combo, strict=True))
        point = Point(index, values, tree)
        try:
            for key, value in values:
                set_field(tree, key, copy.deepcopy(value))
            validate_point(tree)
        except ConfigError as err:
            raise ConfigError(f"point {index} ({point.label}): {err}") from None
        points.append(point)
    return SweepConfig(base, table, outputs, points, source, base_file, base_sets)


def validate_point(tree: dict[str, Any]):
    """A point's run config, validated as ``kvsim check`` does."""
    from .check import check_run

    cfg = build_run_config(tree)
    check_run(cfg)
    return cfg


def load_sweep(path: str | Path, sets: list[str] | None = None,
               axes: list[str] | None = None) -> SweepConfig:
    """A sweep file, with ``--set`` overrides of the base and ``--axis`` overrides."""
    p = Path(path)
    data = load_tree(p)
    return build_sweep(data, folder=p.parent, sets=sets, axes=axes, source=str(p))


# --- running points ---------------------------------------------------------------------------

def flatten_metrics(metrics: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested metrics as one level of dotted names (``decode.time_per_token_s``); a list of
    tables, such as the cache operations, by index (``cache_ops[0].time_s``). Lists of
    values (per-call times, generated tokens) and the resolved config are left out."""
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        name = f"{prefix}.{key}" if prefix else key
        if not prefix and key in SKIPPED_METRICS:
            continue
        if isinstance(value, dict):
            out.update(flatten_metrics(value, name))
        elif isinstance(value, list | tuple):
            for i, item in enumerate(value):
                if isinstance(item, dict):
                    out.update(flatten_metrics(item, f"{name}[{i}]"))
        else:
            out[name] = value
    return out


def run_point(index: int, tree: dict[str, Any], save: bool = False) -> dict[str, Any]:
    """Run one point (in a worker process): ``{"index", "error", "metrics", "files"}``.
    Any exception becomes the point's error (its type and message, one line)."""
    from .run import render_outputs, run

    tree = copy.deepcopy(tree)
    try:
        if not save:
            set_field(tree, "outputs.trace", "off")
        cfg = build_run_config(tree)
        result = run(cfg)
        files = render_outputs(result) if save else {}
        return {"index": index, "error": None, "metrics": flatten_metrics(result.metrics),
                "files": files}
    except Exception as err:  # a failed point is a result, not the end of the sweep
        return {"index": index, "error": error_line(err), "metrics": {}, "files": {}}


def error_line(err: BaseException) -> str:
    """An exception as one line: documented errors by their message, others with their
    type."""
    text = " ".join(str(err).split()) or repr(err)
    return text if isinstance(err, KvsimError) else f"{type(err).__name__}: {text}"


def _progress(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc="kvsim sweep", unit="point", disable=not enabled,
                dynamic_ncols=True, leave=True)


def _run_serial(points: list[Point], save: bool, bar) -> Iterable[dict[str, Any]]:
    for p in points:
        res = run_point(p.index, p.tree, save)
        bar.update(1)
        yield res


def _run_local(points: list[Point], save: bool, workers: int, bar) -> Iterable[dict]:
    import multiprocessing

    # spawn: workers start clean (no threads or locks copied from this process)
    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx)
    try:
        futures = {pool.submit(run_point, p.index, p.tree, save): p for p in points}
        for fut in as_completed(futures):
            p = futures[fut]
            try:
                res = fut.result()
            except Exception as err:  # the worker died (out of memory, killed)
                res = {"index": p.index, "error": f"worker failed: {error_line(err)}",
                       "metrics": {}, "files": {}}
            bar.update(1)
            yield res
    finally:
        # on Ctrl-C or an error here, drop the points not started instead of waiting
        pool.shutdown(wait=True, cancel_futures=True)


def _dask():
    try:
        from dask import distributed
    except ImportError:
        raise ConfigError("--executor dask: Dask is not installed; install the extra: "
                          "pip install 'kvsim[dask]'") from None
    return distributed


def _run_dask(points: list[Point], save: bool, workers: int, scheduler: str | None,
              bar) -> Iterable[dict]:
    distributed = _dask()
    cluster = None
    try:
        if scheduler:
            try:
                client = distributed.Client(scheduler, timeout="30s")
            except (OSError, TimeoutError) as err:
                raise ConfigError(f"--scheduler {scheduler}: cannot connect: "
                                  f"{error_line(err)}") from None
        else:
            cluster = distributed.LocalCluster(n_workers=workers, threads_per_worker=1,
                                               dashboard_address=None)
            client = distributed.Client(cluster)
        with client:
            token = uuid.uuid4().hex[:12]
            futures = {client.submit(run_point, p.index, p.tree, save, pure=False,
                                     key=f"kvsim-point-{p.index}-{token}"): p
                       for p in points}
            for fut in distributed.as_completed(futures):
                p = futures[fut]
                try:
                    res = fut.result()
                except Exception as err:  # the worker died or the task was lost
                    res = {"index": p.index, "error": f"worker failed: {error_line(err)}",
                           "metrics": {}, "files": {}}
                bar.update(1)
                yield res
    finally:
        if cluster is not None:
            cluster.close()


def execute(sweep: SweepConfig, *, executor: Literal["local", "dask"] = "local",
            workers: int | None = None, scheduler: str | None = None, progress: bool = True,
            on_result: Callable[[dict], None] | None = None) -> list[dict[str, Any]]:
    """Run every point; results sorted by point index. ``workers``: processes of the
    local pool (default: one per CPU, at most one per point; 1 runs in this process), or
    workers of the LocalCluster that ``dask`` starts without a ``scheduler``."""
    points = sweep.points
    workers = max(1, min(workers or os.cpu_count() or 1, len(points)))
    save = sweep.outputs.save_points
    with _progress(len(points), progress) as bar:
        if executor == "dask":
            it = _run_dask(points, save, workers, scheduler, bar)
        elif executor == "local":
            it = _run_serial(points, save, bar) if workers == 1 else _run_local(
                points, save, workers, bar)
        else:
            raise ConfigError(f"--executor: {executor!r} is not one of local, dask")
        results = []
        for res in it:
            if on_result is not None:
                on_result(res)
            results.append(res)
    return sorted(results, key=lambda r: r["index"])


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


def run_sweep(sweep: SweepConfig, out_dir: str | Path, *,
              executor: Literal["local", "dask"] = "local", workers: int | None = None,
              scheduler: str | None = None, progress: bool = True) -> SweepResult:
    """Run a validated sweep and write ``results.csv``, ``results.json`` and
    ``report.html`` (each atomically) into ``out_dir``; with ``outputs.save_points``,
    each point's run outputs into ``out_dir/points/NNN/``."""
    from traces.io import atomic_write_text

    out = Path(out_dir)
    t0 = time.perf_counter()
    width = len(str(len(sweep.points) - 1))
    n_workers = max(1, min(workers or os.cpu_count() or 1, len(sweep.points)))
    paths: dict[str, Path] = {}

    def save_files(res: dict) -> None:
        # written as each point arrives: a long sweep's finished points are on disk early
        for name, text in res.get("files", {}).items():
            atomic_write_text(out / "points" / f"{res['index']:0{width}d}" / name, text)
        res["files"] = {}

    results = execute(sweep, executor=executor, workers=workers, scheduler=scheduler,
                      progress=progress, on_result=save_files)
    wall = time.perf_counter() - t0
    columns, rows = table(sweep, results)
    texts = {"results.csv": results_csv(columns, rows),
             "results.json": results_json(sweep, columns, rows),
             "report.html": report_html(sweep, rows)}
    out.mkdir(parents=True, exist_ok=True)
    for key, name in (("results_csv", "results.csv"), ("results_json", "results.json"),
                      ("report", "report.html")):
        atomic_write_text(out / name, texts[name])
        paths[key] = out / name
    if sweep.outputs.save_points:
        paths["points"] = out / "points"
    return SweepResult(sweep, columns, rows, paths, wall, executor, n_workers)
