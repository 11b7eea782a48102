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
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .recorder import Span

#: Span lanes on the path, grouped as the report shows them (lane -> group).
LANE_GROUPS = {
    "dma_in": "DRAM → SRAM loads", "dma_out": "SRAM → DRAM stores",
    "mxu": "matrix unit", "vpu": "vector unit", "copy": "DRAM copy engine",
    "h2d": "host link", "d2h": "host link", "runtime": "host runtime",
}
OTHER = "other work"
GAP = "waiting (no work on the path)"
GROUPS = (*dict.fromkeys(LANE_GROUPS.values()), OTHER, GAP)


@dataclass(frozen=True)
class Link:
    """One piece of the path: ``group`` (a :data:`GROUPS` name) from ``start_ps`` to
    ``end_ps``; ``span`` is the work (None for a gap)."""

    group: str
    start_ps: int
    end_ps: int
    span: Span | None = None


def on_path(spans: Iterable[Span]) -> list[Span]:
    """The spans that can be on the path: instructions (``args["index"]``) and the host's
    runtime work; not the summary lanes (calls, layers) or DRAM channel bursts."""
    return [s for s in spans if (s.args is not None and "index" in s.args)
            or (s.block == "host" and s.lane == "runtime")]


def critical_path(spans: Sequence[Span], start_ps: int | None = None) -> list[Link]:
    """The path that ends the run, in time order, back to ``start_ps`` (default: the
    first span's start). ``spans`` as :func:`on_path` keeps them."""
    work = [s for s in on_path(spans) if s.end_ps > s.start_ps]
    if not work:
        return []
    first = min(s.start_ps for s in work) if start_ps is None else start_ps
    by_end: dict[int, list[Span]] = {}
    for s in work:
        by_end.setdefault(s.end_ps, []).append(s)
    ends = sorted(by_end)
    # the last span to end (ties: the one that started last, then by lane, for a fixed order)
    cur = max(by_end[ends[-1]], key=lambda s: (s.start_ps, s.block, s.lane))
    path = [Link(_group(cur), cur.start_ps, cur.end_ps, cur)]
    while cur.start_ps > first:
        t = cur.start_ps
        cands = [s for s in by_end.get(t, ()) if s.start_ps < t]
        if cands:
            same = [s for s in cands if (s.block, s.lane) == (cur.block, cur.lane)]
            nxt = min(same or cands, key=lambda s: (s.start_ps, s.block, s.lane))
        else:
            i = bisect.bisect_left(ends, t) - 1
            if i < 0 or ends[i] < first:
                path.append(Link(GAP, first, t))
                break
            nxt = min(by_end[ends[i]], key=lambda s: (s.start_ps, s.block, s.lane))
            path.append(Link(GAP, nxt.end_ps, t))
        path.append(Link(_group(nxt), nxt.start_ps, nxt.end_ps, nxt))
        cur = nxt
    path.reverse()
    return path


def _group(s: Span) -> str:
    return LANE_GROUPS.get(s.lane, OTHER)


def time_by_group(path: Sequence[Link], windows: Sequence[tuple[str, int, int]]
                  ) -> dict[str, dict[str, int]]:
    """Path time (ps) per group inside each window ``(name, start_ps, end_ps)`` (windows
    of one name add up), groups in :data:`GROUPS` order."""
    out: dict[str, dict[str, int]] = {}
    ends = [k.end_ps for k in path]  # in time order: the links follow each other
    for name, lo, hi in windows:
        row = out.setdefault(name, {})
        for link in path[bisect.bisect_right(ends, lo):]:
            if link.start_ps >= hi:
                break
            d = min(hi, link.end_ps) - max(lo, link.start_ps)
            if d > 0:
                row[link.group] = row.get(link.group, 0) + d
    order = {g: i for i, g in enumerate(GROUPS)}
    return {n: dict(sorted(r.items(), key=lambda kv: order.get(kv[0], len(order))))
            for n, r in out.items()}


__all__ = ["GAP", "GROUPS", "LANE_GROUPS", "OTHER", "Link", "critical_path", "on_path",
           "time_by_group"]
