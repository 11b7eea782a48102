"""Chrome Trace Event export (opens in Perfetto and chrome://tracing).

One ``pid`` per hardware block (cores, DMA, DRAM, PCIe, host), one ``tid`` per engine or
channel, ``X`` events for work, ``C`` counters for bandwidth per DRAM channel and per link
direction. ``ts``/``dur`` are in microseconds (the format's unit); no ``displayTimeUnit``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import numpy as np

from .recorder import Recorder, Span, span_times

PS_PER_US = 1e6

#: Blocks in display order; others follow alphabetically.
BLOCK_ORDER = ("runtime", "host", "pcie", "hostlink", "device", "dram")


def _block_key(block: str) -> tuple[int, str]:
    if block in BLOCK_ORDER:
        return (BLOCK_ORDER.index(block), block)
    if block.startswith("core") and block[4:].isdigit():
        return (len(BLOCK_ORDER), f"{int(block[4:]):04d}")
    return (len(BLOCK_ORDER) + 1, block)


def bandwidth_series(
    recorder: Recorder, *, bins: int = 200, end_ps: int | None = None
) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
    """Bytes/s over time per (block, lane), from the recorder's byte bins.

    Returns ``{(block, lane): (bin_start_ps, bytes_per_s)}`` with at most ``bins`` bins
    from 0 to ``end_ps`` (default: the end of the last transfer). A bin is a whole number
    of the recorder's byte bins wide (see :mod:`traces.recorder`), so each recorder bin
    falls in one of them: a bin's bytes are those of the transfers' parts that fell in it,
    as if every transfer had been spread uniformly over its duration, and the bytes under
    each curve are the track's recorded bytes.
    """
    records = recorder.bytes
    if not records:
        return {}
    stop = end_ps if end_ps is not None else max(b.end_ps for b in records)
    stop = max(stop, 1)
    unit = recorder.byte_bin_width_ps
    width = -(-max(1, -(-stop // bins)) // unit) * unit
    bins = -(-stop // width)
    edges = np.arange(bins + 1, dtype=np.float64) * width
    grouped: dict[tuple[str, str], list] = defaultdict(list)
    for b in records:
        grouped[(b.block, b.lane)].append((b.start_ps, b.end_ps, b.nbytes))
    out = {}
    for key, items in grouped.items():
        arr = np.asarray(items, dtype=np.float64)
        s, e, n = arr[:, 0], np.maximum(arr[:, 1], arr[:, 0] + 1), arr[:, 2]
        rate = n / (e - s)  # bytes per ps
        acc = np.zeros(bins)
        # overlap of each interval with each bin, vectorised over bins per interval chunk
        for lo in range(0, len(s), 4096):
            sl = slice(lo, lo + 4096)
            ss, ee, rr = s[sl, None], e[sl, None], rate[sl, None]
            ov = np.clip(np.minimum(ee, edges[None, 1:]) - np.maximum(ss, edges[None, :-1]),
                         0, None)
            acc += (ov * rr).sum(axis=0)
        out[key] = (edges[:-1].astype(np.int64), acc / width * 1e12)
    return out


def _tracks(spans: list[Span]) -> list[int]:
    """A track number per span of one lane such that the spans of each track nest
    (Perfetto drops ``X`` events that partly overlap on one thread): overlapping work on
    a lane, e.g. DMA chunks in flight together, goes to tracks 1, 2, ..."""
    order = sorted(range(len(spans)), key=lambda i: (spans[i].start_ps, -spans[i].end_ps, i))
    stacks: list[list[int]] = []  # per track: end times of the open spans
    track = [0] * len(spans)

    def fits(stack: list[int], s: Span) -> bool:
        while stack and stack[-1] <= s.start_ps:  # spans that ended before s starts
            stack.pop()
        return not stack or s.end_ps <= stack[-1]

    for i in order:
        s = spans[i]
        k = next((j for j, stack in enumerate(stacks) if fits(stack, s)), len(stacks))
        if k == len(stacks):
            stacks.append([])
        stacks[k].append(s.end_ps)
        track[i] = k
    return track


def lane_tracks(starts: np.ndarray, ends: np.ndarray) -> list[int]:
    """:func:`_tracks` of one lane's spans from their start and end times (int64 arrays):
    when no span starts before an earlier-starting one has ended (an engine's
    instructions), every span is on track 0, found with numpy; else span by span."""
    if len(starts) < 2:
        return [0] * len(starts)
    order = np.lexsort((-ends, starts))  # as _tracks visits them: start, longest first
    s, e = starts[order], ends[order]
    if (s[1:] >= np.maximum.accumulate(e)[:-1]).all():
        return [0] * len(starts)
    spans = [Span("", "", "", a, b) for a, b in zip(starts.tolist(), ends.tolist(),
                                                       strict=True)]
    return _tracks(spans)


@dataclass(frozen=True)
class _Layout:
    """Where each span goes: ``pid`` per block, the lanes of each block (``by_block``), per
    span its lane's index in ``lanes``, its track and its times; ``tid[(block, lane,
    track)]``; ``tracks`` per lane."""

    blocks: list[str]
    pid: dict[str, int]
    lanes: list[tuple[str, str]]
    by_block: dict[str, list[str]]
    span_lane: np.ndarray
    span_track: np.ndarray
    start_ps: np.ndarray
    end_ps: np.ndarray
    tracks: dict[tuple[str, str], int]
    tid: dict[tuple[str, str, int], int]


def _layout(recorder: Recorder) -> _Layout:
    spans = recorder.spans
    n = len(spans)
    block_lane = itemgetter(0, 1)
    lanes = list(dict.fromkeys(map(block_lane, spans)))  # in order of first span
    blocks = sorted({b for b, _ in lanes} | {b.block for b in recorder.bytes}, key=_block_key)
    pid = {b: i + 1 for i, b in enumerate(blocks)}
    lane_id = {bl: i for i, bl in enumerate(lanes)}
    span_lane = np.fromiter(map(lane_id.__getitem__, map(block_lane, spans)), np.int64, n)
    start, end = span_times(spans)
    span_track = np.zeros(n, np.int64)
    tracks: dict[tuple[str, str], int] = {}
    by_lane = np.argsort(span_lane, kind="stable")
    cuts = np.searchsorted(span_lane[by_lane], np.arange(len(lanes) + 1))
    for i, key in enumerate(lanes):
        idx = by_lane[cuts[i]:cuts[i + 1]]  # the lane's spans in recorded order
        k = np.array(lane_tracks(start[idx], end[idx]), np.int64)
        span_track[idx] = k
        tracks[key] = int(k.max()) + 1
    by_block: dict[str, list[str]] = defaultdict(list)
    for b, lane in lanes:
        by_block[b].append(lane)
    tid: dict[tuple[str, str, int], int] = {}
    for b, ls in by_block.items():
        m = 0
        for lane in sorted(ls):
            for k in range(tracks[(b, lane)]):
                m += 1
                tid[(b, lane, k)] = m
    return _Layout(blocks, pid, lanes, by_block, span_lane, span_track, start, end, tracks,
                   tid)


def chrome_trace(recorder: Recorder, *, counter_bins: int = 200) -> dict[str, Any]:
    """The trace as a JSON-ready dict (``{"traceEvents": [...]}``)."""
    lay = _layout(recorder)
    return {"traceEvents": [*_head_events(recorder, lay), *_span_events(recorder, lay),
                            *_counter_events(recorder, lay, counter_bins)],
            "otherData": _meta(recorder)}


def chrome_trace_json(recorder: Recorder, *, counter_bins: int = 200) -> str:
    """``json.dumps(chrome_trace(...), separators=(",", ":"))``, the same text, without a
    dict per span: the spans' events are written from columns (names, arguments and
    times encoded as the json module encodes them: ``repr`` of the float, each distinct
    name once), so a long run's events are never all held as dicts at once."""
    encode = json.JSONEncoder(separators=(",", ":")).encode
    lay = _layout(recorder)
    head = ",".join(map(encode, _head_events(recorder, lay)))
    spans = ",".join(_span_texts(recorder, lay, encode))  # batches, each already joined
    tail = ",".join(map(encode, _counter_events(recorder, lay, counter_bins)))
    events = ",".join(t for t in (head, spans, tail) if t)
    return f'{{"traceEvents":[{events}],"otherData":{encode(_meta(recorder))}}}'


def _meta(recorder: Recorder) -> dict[str, Any]:
    return {"dropped_events": recorder.dropped, "trace_level": recorder.level}


def _head_events(recorder: Recorder, lay: _Layout) -> Iterator[dict[str, Any]]:
    """The names of processes and threads."""
    for b in lay.blocks:
        p = lay.pid[b]
        yield {"ph": "M", "name": "process_name", "pid": p, "tid": 0, "args": {"name": b}}
        yield {"ph": "M", "name": "process_sort_index", "pid": p, "tid": 0,
               "args": {"sort_index": p}}
        for lane in sorted(lay.by_block.get(b, [])):
            for k in range(lay.tracks[(b, lane)]):
                yield {"ph": "M", "name": "thread_name", "pid": p, "tid": lay.tid[(b, lane, k)],
                       "args": {"name": lane if k == 0 else f"{lane} #{k + 1}"}}


def _span_ids(lay: _Layout) -> tuple[list[int], list[int]]:
    """Each span's ``pid`` and ``tid``."""
    width = max(lay.tracks.values(), default=1)
    tid = np.zeros((len(lay.lanes), width), np.int64)
    for i, (b, lane) in enumerate(lay.lanes):
        for k in range(lay.tracks[(b, lane)]):
            tid[i, k] = lay.tid[(b, lane, k)]
    pid = np.array([lay.pid[b] for b, _ in lay.lanes], np.int64)
    return pid[lay.span_lane].tolist(), tid[lay.span_lane, lay.span_track].tolist()


def _span_events(recorder: Recorder, lay: _Layout) -> Iterator[dict[str, Any]]:
    for s, p, t in zip(recorder.spans, *_span_ids(lay), strict=True):
        ev = {"ph": "X", "name": s.name, "pid": p, "tid": t, "ts": s.start_ps / PS_PER_US,
              "dur": (s.end_ps - s.start_ps) / PS_PER_US}
        if s.args:
            ev["args"] = s.args
        yield ev


#: Spans encoded per batch: the texts of one batch are held at a time, not of all.
SPAN_BATCH = 65_536


def _span_texts(recorder: Recorder, lay: _Layout, encode: Callable[[Any], str]
                ) -> Iterator[str]:
    """The text of the spans' events (``","``-joined per batch of :data:`SPAN_BATCH`),
    as ``encode`` gives it for each of :func:`_span_events`: the text up to ``"ts":``
    once per distinct (name, pid, tid), an instruction's ``{"index": i}`` formatted
    directly, other arguments encoded."""
    spans = recorder.spans
    pids, tids = _span_ids(lay)
    heads: dict[tuple[str, int, int], str] = {}
    for m, p, t in set(zip(map(itemgetter(2), spans), pids, tids, strict=True)):
        heads[(m, p, t)] = f'{{"ph":"X","name":{encode(m)},"pid":{p},"tid":{t},"ts":'
    for lo in range(0, len(spans), SPAN_BATCH):
        batch = spans[lo:lo + SPAN_BATCH]
        n = len(batch)
        head = map(heads.__getitem__, zip(map(itemgetter(2), batch), pids[lo:lo + n],
                                          tids[lo:lo + n], strict=True))
        start, end = lay.start_ps[lo:lo + n], lay.end_ps[lo:lo + n]
        # an int64 over a float64 as Python divides an int by a float (exact below 2**53)
        ts = (start / PS_PER_US).tolist()
        dur = ((end - start) / PS_PER_US).tolist()
        tail = ["}" if not a else f',"args":{{"index":{a["index"]}}}}}'
                if len(a) == 1 and type(a.get("index")) is int else f',"args":{encode(a)}}}'
                for a in map(itemgetter(5), batch)]
        yield ",".join([f'{h}{a!r},"dur":{d!r}{x}'
                        for h, a, d, x in zip(head, ts, dur, tail, strict=True)])


def _counter_events(recorder: Recorder, lay: _Layout, counter_bins: int
                    ) -> Iterator[dict[str, Any]]:
    for (block, lane), (t_ps, bps) in sorted(bandwidth_series(recorder, bins=counter_bins).items()):
        name = f"{lane} GB/s"
        for t, v in zip(t_ps.tolist(), bps.tolist(), strict=True):
            yield {"ph": "C", "name": name, "pid": lay.pid[block], "tid": 0,
                   "ts": t / PS_PER_US, "args": {"GB/s": round(v / 1e9, 6)}}
