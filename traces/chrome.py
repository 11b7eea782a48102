"""Chrome Trace Event export (opens in Perfetto and chrome://tracing).

One ``pid`` per hardware block (cores, DMA, DRAM, PCIe, host), one ``tid`` per engine or
channel, ``X`` events for work, ``C`` counters for bandwidth per DRAM channel and per link
direction. ``ts``/``dur`` are in microseconds (the format's unit); no ``displayTimeUnit``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import numpy as np

from .recorder import Recorder, Span

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


def chrome_trace(recorder: Recorder, *, counter_bins: int = 200) -> dict[str, Any]:
    """The trace as a JSON-ready dict (``{"traceEvents": [...]}``)."""
    return {"traceEvents": list(_events(recorder, counter_bins)),
            "otherData": _meta(recorder)}


def chrome_trace_json(recorder: Recorder, *, counter_bins: int = 200) -> str:
    """``json.dumps(chrome_trace(...), separators=(",", ":"))``, the same text, encoded one
    event at a time: a long run's events are never all held as dicts at once (each
    encoded event is a short string), which bounds the peak memory of writing it."""
    encode = json.JSONEncoder(separators=(",", ":")).encode
    events = ",".join(map(encode, _events(recorder, counter_bins)))
    return f'{{"traceEvents":[{events}],"otherData":{encode(_meta(recorder))}}}'


def _meta(recorder: Recorder) -> dict[str, Any]:
    return {"dropped_events": recorder.dropped, "trace_level": recorder.level}


def _events(recorder: Recorder, counter_bins: int) -> Iterator[dict[str, Any]]:
    """The trace's events in order: names of processes and threads, spans, counters."""
    blocks = sorted({s.block for s in recorder.spans} | {b.block for b in recorder.bytes},
                    key=_block_key)
    pid = {b: i + 1 for i, b in enumerate(blocks)}
    by_lane: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, s in enumerate(recorder.spans):
        by_lane[(s.block, s.lane)].append(i)
    span_track = [0] * len(recorder.spans)
    tracks: dict[tuple[str, str], int] = {}
    for key, idx in by_lane.items():
        for i, k in zip(idx, _tracks([recorder.spans[i] for i in idx]), strict=True):
            span_track[i] = k
        tracks[key] = max(span_track[i] for i in idx) + 1
    lanes: dict[str, list[str]] = defaultdict(list)
    for b, lane in by_lane:
        lanes[b].append(lane)
    tid: dict[tuple[str, str, int], int] = {}
    for b, ls in lanes.items():
        n = 0
        for lane in sorted(ls):
            for k in range(tracks[(b, lane)]):
                n += 1
                tid[(b, lane, k)] = n
    for b in blocks:
        yield {"ph": "M", "name": "process_name", "pid": pid[b], "tid": 0,
               "args": {"name": b}}
        yield {"ph": "M", "name": "process_sort_index", "pid": pid[b], "tid": 0,
               "args": {"sort_index": pid[b]}}
        for lane in sorted(lanes.get(b, [])):
            for k in range(tracks[(b, lane)]):
                yield {"ph": "M", "name": "thread_name", "pid": pid[b],
                       "tid": tid[(b, lane, k)],
                       "args": {"name": lane if k == 0 else f"{lane} #{k + 1}"}}
    for s, k in zip(recorder.spans, span_track, strict=True):
        ev = {
            "ph": "X",
            "name": s.name,
            "pid": pid[s.block],
            "tid": tid[(s.block, s.lane, k)],
            "ts": s.start_ps / PS_PER_US,
            "dur": (s.end_ps - s.start_ps) / PS_PER_US,
        }
        if s.args:
            ev["args"] = s.args
        yield ev
    for (block, lane), (t_ps, bps) in sorted(bandwidth_series(recorder, bins=counter_bins).items()):
        name = f"{lane} GB/s"
        for t, v in zip(t_ps.tolist(), bps.tolist(), strict=True):
            yield {"ph": "C", "name": name, "pid": pid[block], "tid": 0,
                   "ts": t / PS_PER_US, "args": {"GB/s": round(v / 1e9, 6)}}
