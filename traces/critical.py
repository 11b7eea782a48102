"""The critical path of a run, read back from its event log: the chain of work that ends
the run, each link the work that the next one waited for.

An instruction starts at the simulated instant its engine is free and its wait flags are
set, and a flag is set at the instant its signaller ends; so the work an instruction (or a
runtime call's host-side work) waited for *ends exactly when it starts*. Walking back
from the span that ends last, each step takes a span ending at the current one's start
(the same lane first: the engine's previous instruction; else any lane: a flag's
signaller). Where nothing ends at that instant, time passed with no recorded work on the
path (a link's latency, a host-side gap); the walk records that as a gap and goes on from
the latest span ending before. The result depends only on the spans, so it is as exact
as the trace: at trace level ``off`` there is no path, and a trace cut short by
``max_trace_events`` gives the path of what was kept.

A long run keeps millions of spans and its path has as many links, so the walk runs over
column arrays (:func:`path_columns`, the walk itself a small Numba loop) and
:func:`time_by_group` sums the path with numpy; :func:`critical_path` gives the same path
as :class:`Link` objects.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import itemgetter

import numpy as np
from numba import njit

from .recorder import Span, span_times

#: Span lanes on the path, grouped as the report shows them (lane -> group).
LANE_GROUPS = {
    "dma_in": "DRAM → SRAM loads", "dma_out": "SRAM → DRAM stores",
    "mxu": "matrix unit", "vpu": "vector unit", "copy": "DRAM copy engine",
    "h2d": "host link", "d2h": "host link", "runtime": "host runtime",
}
OTHER = "other work"
GAP = "waiting (no work on the path)"
GROUPS = (*dict.fromkeys(LANE_GROUPS.values()), OTHER, GAP)
_GROUP_ID = {g: i for i, g in enumerate(GROUPS)}


@dataclass(frozen=True)
class Link:
    """One piece of the path: ``group`` (a :data:`GROUPS` name) from ``start_ps`` to
    ``end_ps``; ``span`` is the work (None for a gap)."""

    group: str
    start_ps: int
    end_ps: int
    span: Span | None = None


@dataclass(frozen=True)
class PathColumns:
    """The path as columns, one entry per link in time order: ``span`` the index of the
    link's work in the spans the path was read from (-1 for a gap), ``group`` the index
    of its :data:`GROUPS` name, ``start_ps``/``end_ps`` its times (all int64 arrays)."""

    span: np.ndarray
    group: np.ndarray
    start_ps: np.ndarray
    end_ps: np.ndarray

    def __len__(self) -> int:
        return len(self.span)


def on_path(spans: Iterable[Span]) -> list[Span]:
    """The spans that can be on the path: instructions (``args["index"]``) and the host's
    runtime work; not the summary lanes (calls, layers) or DRAM channel bursts."""
    return [s for s in spans if _can_be_on_path(s)]


def _can_be_on_path(s: Span) -> bool:
    return (s.args is not None and "index" in s.args) or (s.block == "host"
                                                            and s.lane == "runtime")


@njit(cache=True)
def _first_at_or_after(a, v, lo, hi):
    """The first position in ``a[lo:hi]`` (sorted) holding ``v`` or more."""
    while lo < hi:
        mid = (lo + hi) // 2
        if a[mid] < v:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def _walk(end, start, lane, first):
    """The walk of :func:`critical_path` over spans sorted by (end, start, lane, order):
    the positions on the path in time order, -1 for a gap (it lasts from the link
    before it, or ``first``, to the link after it). Among spans ending at one instant the
    first in that order is the one the walk takes (the same lane's first, if any), so
    every choice is a scan of one run of equal ends."""
    n = len(end)
    pos = np.empty(2 * n, np.int64)  # each step takes a span that starts earlier
    p = n - 1  # the last to end; of equal (start, lane), the first recorded
    while p > 0 and end[p - 1] == end[p] and start[p - 1] == start[p] \
            and lane[p - 1] == lane[p]:
        p -= 1
    k = 0
    pos[k] = p
    k += 1
    while start[p] > first:
        t = start[p]
        lo = _first_at_or_after(end, t, 0, n)
        hi = _first_at_or_after(end, t + 1, lo, n)
        if lo < hi:
            q = lo
            for r in range(lo, hi):
                if lane[r] == lane[p]:
                    q = r
                    break
        else:
            pos[k] = -1
            k += 1
            if lo == 0 or end[lo - 1] < first:
                break
            q = _first_at_or_after(end, end[lo - 1], 0, lo)
        p = q
        pos[k] = p
        k += 1
    return pos[:k][::-1].copy()


def path_columns(spans: Sequence[Span], start_ps: int | None = None) -> PathColumns:
    """:func:`critical_path` as columns (:class:`PathColumns`), read from the spans as
    columns: no object per link."""
    empty = np.zeros(0, np.int64)
    if not spans:
        return PathColumns(empty, empty, empty, empty)
    n = len(spans)
    start, end = span_times(spans)
    block_lane = itemgetter(0, 1)
    names = sorted(set(map(block_lane, spans)))  # (block, lane) ranked as the walk's ties
    rank = {bl: r for r, bl in enumerate(names)}
    lane = np.fromiter(map(rank.__getitem__, map(block_lane, spans)), np.int64, n)
    keep = np.fromiter(map(_can_be_on_path, spans), bool, n) & (end > start)
    idx = np.flatnonzero(keep)
    if not len(idx):
        return PathColumns(empty, empty, empty, empty)
    start, end, lane = start[idx], end[idx], lane[idx]
    first = int(start.min()) if start_ps is None else start_ps
    order = np.lexsort((lane, start, end))  # stable: ties keep the recorded order
    pos = _walk(end[order], start[order], lane[order], first)
    group_of_lane = np.array([_GROUP_ID[LANE_GROUPS.get(ln, OTHER)] for _, ln in names],
                             np.int64)
    work = pos >= 0
    span = np.full(len(pos), -1, np.int64)
    span[work] = idx[order[pos[work]]]
    group = np.full(len(pos), _GROUP_ID[GAP], np.int64)
    group[work] = group_of_lane[lane[order[pos[work]]]]
    lo = np.zeros(len(pos), np.int64)
    hi = np.zeros(len(pos), np.int64)
    lo[work], hi[work] = start[order[pos[work]]], end[order[pos[work]]]
    gaps = np.flatnonzero(~work)  # between the links around them (first: from ``first``)
    hi[gaps] = lo[gaps + 1]
    lo[gaps] = np.where(gaps > 0, hi[np.maximum(gaps - 1, 0)], first)
    return PathColumns(span, group, lo, hi)


def critical_path(spans: Sequence[Span], start_ps: int | None = None) -> list[Link]:
    """The path that ends the run, in time order, back to ``start_ps`` (default: the
    first span's start). ``spans`` as :func:`on_path` keeps them."""
    cols = path_columns(spans, start_ps)
    return [Link(GROUPS[g], a, b, None if i < 0 else spans[i])
            for i, g, a, b in zip(cols.span.tolist(), cols.group.tolist(),
                                  cols.start_ps.tolist(), cols.end_ps.tolist(), strict=True)]


def time_by_group(path: Sequence[Link] | PathColumns, windows: Sequence[tuple[str, int, int]]
                  ) -> dict[str, dict[str, int]]:
    """Path time (ps) per group inside each window ``(name, start_ps, end_ps)`` (windows
    of one name add up), groups in :data:`GROUPS` order."""
    if not isinstance(path, PathColumns):
        path = PathColumns(np.full(len(path), -1, np.int64),
                           np.array([_GROUP_ID[k.group] for k in path], np.int64),
                           np.array([k.start_ps for k in path], np.int64),
                           np.array([k.end_ps for k in path], np.int64))
    starts, ends = path.start_ps, path.end_ps  # in time order: the links follow each other
    out: dict[str, dict[str, int]] = {}
    for name, lo, hi in windows:
        row = out.setdefault(name, {})
        i0 = int(np.searchsorted(ends, lo, side="right"))
        i1 = max(i0, int(np.searchsorted(starts, hi, side="left")))
        d = np.minimum(hi, ends[i0:i1]) - np.maximum(lo, starts[i0:i1])
        inside = d > 0
        per = np.zeros(len(GROUPS), np.int64)
        np.add.at(per, path.group[i0:i1][inside], d[inside])
        for g in np.flatnonzero(np.bincount(path.group[i0:i1][inside],
                                            minlength=len(GROUPS))).tolist():
            row[GROUPS[g]] = row.get(GROUPS[g], 0) + int(per[g])
    return {n: dict(sorted(r.items(), key=lambda kv: _GROUP_ID[kv[0]])) for n, r in out.items()}


__all__ = ["GAP", "GROUPS", "LANE_GROUPS", "OTHER", "Link", "PathColumns", "critical_path",
           "on_path", "path_columns", "time_by_group"]
