"""The critical path read back from the event log: tiny timelines with a known chain, and
on a real run, a path that covers every call exactly."""

from __future__ import annotations

import pytest

from sim.app.config import load_run_config
from sim.app.run import run
from traces.critical import GAP, critical_path, path_columns, time_by_group
from traces.recorder import Span


def _ins(block, lane, start, end, index):
    return Span(block, lane, "x", start, end, {"index": index})


def _chain(path):
    return [(k.group, k.start_ps, k.end_ps) for k in path]


def test_the_path_follows_what_each_piece_waited_for():
    # load 0-10 feeds the gemm 10-30 (a flag: another lane); a second load 10-25 on the
    # load lane ends before the gemm, so it is off the path; the store 30-40 waits for
    # the gemm; a vec 5-12 ends at no start on the path
    spans = [_ins("core0", "dma_in", 0, 10, 0), _ins("core0", "dma_in", 10, 25, 1),
             _ins("core0", "mxu", 10, 30, 2), _ins("core0", "vpu", 5, 12, 3),
             _ins("core0", "dma_out", 30, 40, 4)]
    assert _chain(critical_path(spans)) == [
        ("DRAM → SRAM loads", 0, 10), ("matrix unit", 10, 30), ("SRAM → DRAM stores", 30, 40)]


def test_same_lane_first_and_a_gap_where_nothing_ends():
    # two spans end at 20: the store lane's own previous store is taken over the gemm;
    # before 12 nothing ends at the store's start: a gap back to the vec's end
    spans = [_ins("core0", "vpu", 0, 8, 0), _ins("core0", "dma_out", 12, 20, 1),
             _ins("core0", "mxu", 14, 20, 2), _ins("core0", "dma_out", 20, 30, 3)]
    assert _chain(critical_path(spans)) == [
        ("vector unit", 0, 8), (GAP, 8, 12), ("SRAM → DRAM stores", 12, 20),
        ("SRAM → DRAM stores", 20, 30)]
    # the summary lanes (calls, layers) are never on the path
    more = [*spans, Span("runtime", "calls", "infer", 0, 30),
            Span("runtime", "layers", "layer 0", 0, 30)]
    assert _chain(critical_path(more)) == _chain(critical_path(spans))


def test_time_by_group_clips_the_path_to_each_window():
    spans = [_ins("core0", "dma_in", 0, 10, 0), _ins("core0", "mxu", 10, 30, 1)]
    path = critical_path(spans)
    got = time_by_group(path, [("a", 0, 5), ("b", 5, 25), ("a", 25, 30)])
    assert got == {"a": {"DRAM → SRAM loads": 5, "matrix unit": 5},
                   "b": {"DRAM → SRAM loads": 5, "matrix unit": 15}}


@pytest.fixture(scope="module")
def tiny():
    return run(load_run_config(None, [
        "hardware.preset=tiny", "model.preset=tiny", "compile.core_mode=single",
        "workload.prompt_tokens=8", "workload.output_tokens=4"]))


def test_on_a_run_the_path_covers_every_call_and_is_as_long_as_the_run(tiny):
    rec = tiny.recorder
    path = critical_path(rec.spans)
    calls = [s for s in rec.spans if s.block == "runtime" and s.lane == "calls"]
    assert path[0].start_ps == 0 and path[-1].end_ps == calls[-1].end_ps
    for a, b in zip(path, path[1:], strict=False):  # links follow each other
        assert a.end_ps == b.start_ps
    windows = [(f"{i}", s.start_ps, s.end_ps) for i, s in enumerate(calls)]
    per_call = time_by_group(path, windows)
    for i, s in enumerate(calls):
        assert sum(per_call[f"{i}"].values()) == s.end_ps - s.start_ps
    # the launch is the weights over the host link; prefill mostly loads weights
    assert max(per_call["0"], key=per_call["0"].get) == "host link"
    assert max(per_call["1"], key=per_call["1"].get) == "DRAM → SRAM loads"


def _reference_path(spans, start_ps=None):
    """The walk as first written, one Python object per span: the array walk must give
    the same links (ties included) on every trace."""
    import bisect

    from traces.critical import LANE_GROUPS, OTHER, Link, on_path

    def group(s):
        return LANE_GROUPS.get(s.lane, OTHER)

    def key(s):
        return (s.start_ps, s.block, s.lane)

    work = [s for s in on_path(spans) if s.end_ps > s.start_ps]
    if not work:
        return []
    first = min(s.start_ps for s in work) if start_ps is None else start_ps
    by_end = {}
    for s in work:
        by_end.setdefault(s.end_ps, []).append(s)
    ends = sorted(by_end)
    cur = max(by_end[ends[-1]], key=key)
    path = [Link(group(cur), cur.start_ps, cur.end_ps, cur)]
    while cur.start_ps > first:
        t = cur.start_ps
        cands = [s for s in by_end.get(t, ()) if s.start_ps < t]
        if cands:
            same = [s for s in cands if (s.block, s.lane) == (cur.block, cur.lane)]
            nxt = min(same or cands, key=key)
        else:
            i = bisect.bisect_left(ends, t) - 1
            if i < 0 or ends[i] < first:
                path.append(Link(GAP, first, t))
                break
            nxt = min(by_end[ends[i]], key=key)
            path.append(Link(GAP, nxt.end_ps, t))
        path.append(Link(group(nxt), nxt.start_ps, nxt.end_ps, nxt))
        cur = nxt
    path.reverse()
    return path


def _reference_time_by_group(path, windows):
    """time_by_group as first written, one link at a time."""
    import bisect

    from traces.critical import GROUPS

    out = {}
    ends = [k.end_ps for k in path]
    for name, lo, hi in windows:
        row = out.setdefault(name, {})
        for link in path[bisect.bisect_right(ends, lo):]:
            if link.start_ps >= hi:
                break
            d = min(hi, link.end_ps) - max(lo, link.start_ps)
            if d > 0:
                row[link.group] = row.get(link.group, 0) + d
    order = {g: i for i, g in enumerate(GROUPS)}
    return {n: dict(sorted(r.items(), key=lambda kv: order[kv[0]])) for n, r in out.items()}


def _random_trace(seed, n):
    """Spans on a few lanes with times on a coarse grid, so that many end (and start)
    at one instant: ties on every rule of the walk; some zero-length, some summary lanes
    and DRAM bursts that are never on the path, some host runtime work."""
    import random

    rng = random.Random(seed)
    lanes = [("core0", "dma_in"), ("core0", "mxu"), ("core1", "mxu"), ("core0", "vpu"),
             ("pcie", "h2d"), ("core1", "dma_out"), ("core0", "odd")]
    out = []
    for i in range(n):
        start = rng.randrange(0, 60) * 5
        end = start + rng.choice((0, 5, 5, 10, 15, 40))
        kind = rng.random()
        if kind < 0.08:
            out.append(Span("host", "runtime", "call", start, end))
        elif kind < 0.15:
            out.append(Span("dram", "ch0", "read", start, end, {"bytes": 64}))
        elif kind < 0.2:
            out.append(Span("runtime", "calls", "infer", start, end))
        else:
            out.append(Span(*rng.choice(lanes), "x", start, end, {"index": i}))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_the_array_walk_gives_the_reference_path_on_random_traces(seed):
    spans = _random_trace(seed, 10 + 7 * seed)
    for start_ps in (50, None):
        want = _reference_path(spans, start_ps)
        assert critical_path(spans, start_ps) == want
    windows = [("a", 0, 40), ("b", 35, 180), ("a", 150, 400), ("c", 500, 600)]
    got = time_by_group(path_columns(spans), windows)
    assert got == _reference_time_by_group(want, windows)
    assert time_by_group(want, windows) == got
    assert list(got) == ["a", "b", "c"] and got["c"] == {}


def test_the_array_walk_gives_the_reference_path_on_a_run(tiny):
    spans = tiny.recorder.spans
    want = _reference_path(spans)
    assert len(want) > 100
    assert critical_path(spans) == want
    cols = path_columns(spans)
    assert cols.span.tolist() == [-1 if k.span is None else spans.index(k.span)
                                  for k in want]
