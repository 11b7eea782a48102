"""Running a sweep's points (``sim.app.sweep.sweep``): in this process, on a local process pool or
on a Dask distributed cluster. Each point returns the columns of its typed result
(:mod:`traces.results`), or its error; a failed point does not lose the others. On a Dask
cluster, every worker needs kvsim installed (the same version as the client): a point is
a call of :func:`run_point`.
"""

from __future__ import annotations

import copy
import os
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, Literal

from kvsim.errors import ConfigError, KvsimError
from sim.app.config import build_run_config, set_field
from sim.app.sweep.file import Point, SweepConfig
from sim.progress import Phases
from traces.results import run_metrics


def flatten_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """A run's metrics as the row of a sweep: the columns of its typed result
    (:meth:`traces.results.GenerateMetrics.columns`), one level of dotted names
    (``decode.time_per_token_s``; a list of records by index, ``cache_ops[0].time_s``).
    Lists of values (per-call times, generated tokens), the resolved config and the
    per-call rows are left out. A tree that is not a run's metrics is a
    :class:`traces.results.ResultsError` naming the entry at fault."""
    return run_metrics(metrics).columns()


def run_point(index: int, tree: dict[str, Any], save: bool = False) -> dict[str, Any]:
    """Run one point (in a worker process): ``{"index", "error", "metrics", "files"}``.
    Any exception becomes the point's error (its type and message, one line)."""
    from sim.app.run import render_outputs, run

    tree = copy.deepcopy(tree)
    try:
        if not save:
            set_field(tree, "outputs.trace", "off")
        cfg = build_run_config(tree)
        result = run(cfg)
        files = render_outputs(result) if save else {}
        return {"index": index, "error": None, "metrics": result.metrics.columns(),
                "files": files}
    except Exception as err:  # a failed point is a result, not the end of the sweep
        return {"index": index, "error": error_line(err), "metrics": {}, "files": {}}


def error_line(err: BaseException) -> str:
    """An exception as one line: documented errors by their message, others with their
    type."""
    text = " ".join(str(err).split()) or repr(err)
    return text if isinstance(err, KvsimError) else f"{type(err).__name__}: {text}"


def worker_count(workers: int | None, *, points: int) -> int:
    """Processes for ``points`` points: ``workers``, or one per CPU when None; never more
    than the points, never fewer than one."""
    return max(1, min(workers or os.cpu_count() or 1, points))


def _run_serial(points: list[Point], save: bool, bar: Phases) -> Iterable[dict[str, Any]]:
    for p in points:
        res = run_point(p.index, p.tree, save)
        bar.advance()
        yield res


def _run_local(points: list[Point], save: bool, workers: int, bar: Phases) -> Iterable[dict]:
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
            bar.advance()
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
              bar: Phases) -> Iterable[dict]:
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
                bar.advance()
                yield res
    finally:
        if cluster is not None:
            cluster.close()


def execute(sweep: SweepConfig, *, executor: Literal["local", "dask"] = "local",
            workers: int | None = None, scheduler: str | None = None, progress: bool = True,
            on_result: Callable[[dict], None] | None = None,
            label: str = "sweep points") -> list[dict[str, Any]]:
    """Run every point; results sorted by point index. ``workers``: processes of the
    local pool (default: one per CPU, at most one per point; 1 runs in this process), or
    workers of the LocalCluster that ``dask`` starts without a ``scheduler``. With
    ``progress``, the points done are shown as ``label`` (``sim.progress``: the caller
    says whether stderr is a terminal)."""
    points = sweep.points
    workers = worker_count(workers, points=len(points))
    save = sweep.outputs.save_points
    with Phases(enabled=progress) as bar:
        bar.start(label, total=len(points))
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
