"""Per-row lists and row moves: the array operations a patched build of the program
tables (:mod:`sim.device.engine.tables`) assembles its arrays with.

A per-row list is ``(ptr, flat)``: row ``j``'s items are ``flat[ptr[j]: ptr[j + 1]]`` (the
tables' waits and signals of each distinct row).
"""

from __future__ import annotations

import numpy as np

#: Above this many runs :func:`move_rows` moves rows by an index instead of by slices: a
#: choice (a slice copy costs about a microsecond, an indexed row some 50 ns), not a
#: measurement of this machine.
MOVE_RUNS = 256


def move_rows(dst: np.ndarray, dst_at: np.ndarray, src: np.ndarray, src_at: np.ndarray) -> None:
    """``dst[dst_at] = src[src_at]`` for increasing ``dst_at`` and ``src_at``, by slices
    over the runs where both step by one (a decode step keeps its rows in a few runs)."""
    n = len(dst_at)
    if not n:
        return
    cut = np.flatnonzero((np.diff(dst_at) != 1) | (np.diff(src_at) != 1)) + 1
    if len(cut) > MOVE_RUNS:
        dst[dst_at] = src[src_at]
        return
    starts = [0, *cut.tolist()]
    ends = [*starts[1:], n]
    for a, b, d, s in zip(starts, ends, dst_at[starts].tolist(), src_at[starts].tolist(),
                          strict=True):
        dst[d: d + b - a] = src[s: s + b - a]


def a_position(index: np.ndarray, changed: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """A changed position holding each of the store ``rows`` (each held at one)."""
    held = index[changed]
    order = np.argsort(held, kind="stable")
    return changed[order[np.searchsorted(held[order], rows)]]


def splice(ptr: np.ndarray, flat: np.ndarray, kept: np.ndarray, kept_at: np.ndarray,
            add_ptr: np.ndarray, add_flat: np.ndarray, added_at: np.ndarray):
    """``(ptr, flat)``: per-row lists (row ``j``'s: ``flat[ptr[j]: ptr[j + 1]]``) of the
    rows ``kept`` of ``ptr``/``flat``, now rows ``kept_at``, and of rows given by
    ``add_ptr``/``add_flat``, now rows ``added_at``."""
    n = len(kept_at) + len(added_at)
    lens = np.empty(n, np.int64)
    start = np.empty(n, np.int64)  # where each row's list starts in flat, then add_flat
    lens[kept_at] = ptr[kept + 1] - ptr[kept]
    start[kept_at] = ptr[kept]
    lens[added_at] = np.diff(add_ptr)
    start[added_at] = len(flat) + add_ptr[:-1]
    out_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=out_ptr[1:])
    src = np.repeat(start - out_ptr[:-1], lens) + np.arange(out_ptr[-1])
    return out_ptr, np.concatenate([flat, add_flat])[src]


#: Above this many times the values' count (plus a margin), :func:`unique_small` sorts
#: instead of counting: a choice bounding its memory, not a measurement.
COUNT_SPAN_PER_VALUE = 8
COUNT_SPAN_MARGIN = 1 << 16


def unique_small(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(unique, inverse)`` of int64 ``values`` as ``np.unique(values,
    return_inverse=True)`` gives them (sorted distinct values, int64 inverse), by counting
    when the values are non-negative and their span is small, else by sorting."""
    n = len(values)
    top = int(values.max(initial=0))
    if n == 0 or int(values.min()) < 0 or top > COUNT_SPAN_PER_VALUE * n + COUNT_SPAN_MARGIN:
        u, inv = np.unique(values, return_inverse=True)
        return u, inv.reshape(-1).astype(np.int64)
    seen = np.zeros(top + 1, bool)
    seen[values] = True
    u = np.flatnonzero(seen)
    number = np.zeros(top + 1, np.int64)
    number[u] = np.arange(len(u))
    return u.astype(values.dtype), number[values]
