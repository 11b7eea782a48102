"""The event recorder: components report what happened; they never write files.

Detail levels: ``off`` records nothing, ``ops`` one span per instruction / runtime call,
``tiles`` also one span per DMA chunk, DRAM channel burst and link chunk. ``max_events``
bounds memory on long runs: past it, spans are counted in ``dropped`` and not stored.

Bytes moved (for bandwidth counters) are kept at ``ops`` and above, binned as they are
recorded: per track (a DRAM channel, a link direction) into bins of fixed simulated time,
so memory grows with the number of bins, not with the number of transfers. Bins start
``byte_bin_ps`` wide; whenever a transfer ends past ``max_byte_bins`` bins, the width
doubles (neighbouring bins merge), so a track never holds more than ``max_byte_bins``
bins. A transfer spanning several bins is split over them in proportion to its overlap
with each, in whole bytes (cumulative floor: the parts add up to the transfer exactly);
each bin also keeps the earliest start and latest end of the bytes in it. Byte totals are
exact: :attr:`Recorder.byte_totals` counts every transfer reported, and the bins hold
exactly the bytes of every transfer they accepted. Each non-empty bin is one event
towards ``max_events``; a transfer that would need a new bin past the limit is counted
in ``dropped`` (whole, never split) and left out of the bins, not out of ``byte_totals``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import is_not, itemgetter
from typing import Any, NamedTuple

LEVELS = {"off": 0, "ops": 1, "tiles": 2}


class Span(NamedTuple):
    """One piece of recorded work. A named tuple, not a dataclass: a long run records
    millions (up to ``max_events``), and a tuple is built several times faster than a
    frozen dataclass (whose ``__init__`` sets each field through ``object.__setattr__``),
    and its fields read into columns by position (:func:`span_times`)."""

    block: str  # a hardware block: "core0", "dram", "pcie", "host", "runtime"
    lane: str  # an engine or channel inside it: "dma_in", "ch3", "h2d"
    name: str
    start_ps: int
    end_ps: int
    args: dict[str, Any] | None = None


def span_times(spans: Sequence[Span]) -> tuple[Any, Any]:
    """The start and end times (ps) of ``spans`` as two ``int64`` arrays, read one field
    at a time (a transposing ``zip(*spans)`` makes an iterator per span and costs more)."""
    import numpy as np

    n = len(spans)
    return (np.fromiter(map(itemgetter(3), spans), np.int64, n),
            np.fromiter(map(itemgetter(4), spans), np.int64, n))


#: ``Span(*fields)`` without the generated ``__new__``'s Python frame (half the cost of
#: building a span); for the recorder's own calls, which always pass all six fields.
_new_tuple = tuple.__new__


def _cells(cell, size: int):
    """``np.unique(cell, return_inverse=True)`` of int64 values in ``[0, size)``, counted
    instead of sorted (millions of transfer parts fall in at most ``size`` cells)."""
    import numpy as np

    seen = np.bincount(cell, minlength=size) > 0
    cells = np.flatnonzero(seen)
    where = np.cumsum(seen) - 1
    return cells.astype(np.int64), where[cell].astype(np.int64)


@dataclass(frozen=True, slots=True)
class ByteInterval:
    """Bytes moved on one track between two times: since byte intervals are binned, one
    bin's bytes, between the earliest start and the latest end of what fell in it."""

    block: str
    lane: str
    start_ps: int
    end_ps: int
    nbytes: int


@dataclass
class Recorder:
    level: str = "ops"
    max_events: int = 2_000_000
    #: Width of the byte bins at the start of a run (simulated ps); doubles as needed.
    byte_bin_ps: int = 1_000
    #: Most byte bins per track (the width doubles to stay within it).
    max_byte_bins: int = 4096
    spans: list[Span] = field(default_factory=list)
    dropped: int = 0
    #: Exact bytes reported per (block, lane), whether or not their bins were stored.
    byte_totals: dict[tuple[str, str], int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"trace level {self.level!r}: valid levels are {', '.join(LEVELS)}")
        if self.byte_bin_ps < 1 or self.max_byte_bins < 1:
            raise ValueError("byte_bin_ps and max_byte_bins must be at least 1")
        self._rank = LEVELS[self.level]
        self._width = self.byte_bin_ps
        # per track: {bin index: [bytes, earliest start ps, latest end ps]}
        self._bins: dict[tuple[str, str], dict[int, list[int]]] = {}
        self._nbins = 0

    def wants(self, detail: str) -> bool:
        return self._rank >= LEVELS[detail]

    def _room(self, n: int = 1) -> bool:
        if len(self.spans) + self._nbins + n <= self.max_events:
            return True
        self.dropped += 1
        return False

    def span(
        self,
        block: str,
        lane: str,
        name: str,
        start_ps: int,
        end_ps: int,
        *,
        detail: str = "ops",
        args: dict[str, Any] | None = None,
    ) -> None:
        # the hot call of a long run: ``_room`` inlined (room for one more event)
        if self._rank >= LEVELS[detail]:
            if len(self.spans) + self._nbins < self.max_events:
                self.spans.append(_new_tuple(Span, (block, lane, name, start_ps, end_ps, args)))
            else:
                self.dropped += 1

    def mark(self, since: int, marks: Sequence[tuple[str, int, int]], *,
             block: str = "runtime", lane: str = "layers") -> int:
        """One span on ``block``/``lane`` per mark ``(name, first, end)`` of a program whose
        instruction spans (``args["index"]``) were recorded from ``spans[since]`` on: from
        the first start to the last end of the instructions ``first <= index < end``
        (marks without a recorded instruction are left out). Returns the spans added."""
        import numpy as np

        if self._rank < 1 or not marks:
            return 0
        tail = self.spans[since:]
        index = [a.get("index") if a else None for a in map(itemgetter(5), tail)]
        # the spans of instructions, picked in C-level maps (a long program has millions)
        held = np.fromiter(map(is_not, index, repeat(None)), bool, len(index))
        if not held.any():
            return 0
        idx = np.fromiter(compress(index, held.tolist()), np.int64, int(held.sum()))
        pos = np.flatnonzero(held)
        start, end = span_times(tail)
        start, end = start[pos], end[pos]
        # per instruction index (sorted): its spans' first start and last end
        order = np.argsort(idx, kind="stable")
        order_idx, cut = np.unique(idx[order], return_index=True)
        lo = np.minimum.reduceat(start[order], cut)
        hi = np.maximum.reduceat(end[order], cut)
        added = 0
        for name, first, stop in marks:
            i0, i1 = np.searchsorted(order_idx, [first, stop], side="left").tolist()
            if i0 == i1:
                continue
            before = len(self.spans)
            self.span(block, lane, name, int(lo[i0:i1].min()), int(hi[i0:i1].max()),
                      args={"first": first, "end": stop})
            added += len(self.spans) - before
        return added

    def moved(self, block: str, lane: str, start_ps: int, end_ps: int, nbytes: int) -> None:
        """Bytes that crossed a channel or link between two times (for bandwidth counters)."""
        if self._rank < 1:
            return
        key = (block, lane)
        totals = self.byte_totals
        totals[key] = totals.get(key, 0) + nbytes
        w = self._width
        last = end_ps - 1 if end_ps > start_ps else start_ps
        while last // w >= self.max_byte_bins:
            self._coarsen()
            w = self._width
        k0, k1 = start_ps // w, last // w
        track = self._bins.get(key)
        if track is None:
            track = self._bins[key] = {}
        if k0 == k1:  # the common case: the whole transfer in one bin
            cell = track.get(k0)
            if cell is not None:
                cell[0] += nbytes
                if start_ps < cell[1]:
                    cell[1] = start_ps
                if end_ps > cell[2]:
                    cell[2] = end_ps
            elif self._room():
                track[k0] = [nbytes, start_ps, end_ps]
                self._nbins += 1
            return
        held = len(track.keys() & range(k0, k1 + 1))  # bins of this span already stored
        new = k1 - k0 + 1 - held
        if new and not self._room(new):
            return
        self._nbins += new
        dur = end_ps - start_ps
        # bin k covers [lo, hi): the first bin starts at start_ps, the last ends at end_ps,
        # the ones between are whole; each gets the bytes moved by its ``hi`` (floor)
        # minus those moved by its ``lo``
        his = [*range((k0 + 1) * w, k1 * w + 1, w), end_ps]
        uptos = [nbytes * (hi - start_ps) // dur for hi in his]
        if held == 0:
            prev = 0
            lo = start_ps
            for k, hi, upto in zip(range(k0, k1 + 1), his, uptos, strict=True):
                track[k] = [upto - prev, lo, hi]
                prev = upto
                lo = hi
            return
        prev = 0
        for k, hi, upto in zip(range(k0, k1 + 1), his, uptos, strict=True):
            lo = start_ps if k == k0 else k * w
            n, prev = upto - prev, upto
            cell = track.get(k)
            if cell is None:
                track[k] = [n, lo, hi]
            else:
                cell[0] += n
                if lo < cell[1]:
                    cell[1] = lo
                if hi > cell[2]:
                    cell[2] = hi

    def _widths(self, last):
        """The bin width each transfer of a batch is binned at, one call each in order:
        that which the latest end so far needs (``last``: an int64 array)."""
        import numpy as np

        need = np.maximum.accumulate(last) if len(last) else last
        w = np.full(len(last), self._width, np.int64)
        wide = need // w >= self.max_byte_bins
        while wide.any():
            w[wide] *= 2
            wide = need // w >= self.max_byte_bins
        return w

    def full(self) -> bool:
        """Whether the recorder is at ``max_events``: every further span is dropped."""
        return len(self.spans) + self._nbins >= self.max_events

    def drop(self, spans: int) -> None:
        """Count ``spans`` spans dropped at the event limit, as that many :meth:`span`
        calls (of a detail this level wants) on a full recorder would."""
        if spans < 0:
            raise ValueError(f"drop: spans must be at least 0, got {spans}")
        if spans and not self.full():
            raise ValueError("drop: the recorder is not full; its spans are not dropped")
        self.dropped += spans

    def room(self) -> int:
        """How many more events (spans or byte bins) fit under ``max_events``."""
        return max(0, self.max_events - len(self.spans) - self._nbins)

    def add_spans(self, spans: Sequence[Span], *, detail: str = "ops") -> None:
        """:meth:`span` of each of ``spans`` in turn (of ``detail``): the same record, the
        ones past ``max_events`` counted in ``dropped``."""
        if self._rank < LEVELS[detail]:
            return
        room = self.room()
        self.spans.extend(spans[:room])
        self.dropped += max(0, len(spans) - room)

    def can_take(self, spans: int, start_ps, end_ps) -> bool:
        """Whether ``spans`` more spans and transfers over ``start_ps .. end_ps`` (arrays,
        in order) give the same record in any order. Either they all fit under
        ``max_events``: each transfer counted with every bin it could open at the width
        it would be binned at (coarsening only merges bins); or the recorder is already
        full and stays so (no bin merges on the way): then every span is dropped and a
        transfer is kept exactly when all its bins are already stored, whatever the
        order."""
        import numpy as np

        start = np.asarray(start_ps, np.int64)
        end = np.asarray(end_ps, np.int64)
        last = np.where(end > start, end - 1, start)
        w = self._widths(last)
        if self.full() and not (w != self._width).any():
            return True
        could_open = int((last // w - start // w + 1).sum())
        return len(self.spans) + self._nbins + spans + could_open <= self.max_events

    def moved_many(self, tracks: Sequence[tuple[str, str]], track_of, start_ps, end_ps,
                   nbytes) -> None:
        """:meth:`moved` of many transfers, transfer ``j`` on track ``tracks[track_of[j]]``
        (arrays of int64): the same totals, bins and track order as calling it for each in
        turn. Binned at once at the width the last of them needs, which gives the bins
        that coarsening finer ones would (each bin's bytes are differences of the same
        cumulative floors, taken at edges every coarser width shares); when the event
        limit could be reached on the way, or the floor products could leave int64, it
        calls :meth:`moved` for each instead, since the limit depends on the order."""
        import numpy as np

        if self._rank < 1 or not len(start_ps):
            return
        start = np.asarray(start_ps, np.int64)
        end = np.asarray(end_ps, np.int64)
        nb = np.asarray(nbytes, np.int64)
        tid = np.asarray(track_of, np.int64)
        last = np.where(end > start, end - 1, start)
        too_big = bool(((end - start).astype(np.float64) * nb.astype(np.float64)
                        >= 2.0 ** 62).any())
        if too_big:
            self._moved_each(tracks, tid, start, end, nb)
            return
        if not self.can_take(0, start, end):
            if self.full() or int(self._widths(last)[-1]) != self._width:
                # bins may merge on the way and make room again: the order decides
                self._moved_each(tracks, tid, start, end, nb)
                return
            # room for some: one call each until the recorder is full, then the rest at
            # once (full and staying so, order no longer matters)
            j = 0
            tl, sl, el, nl = tid.tolist(), start.tolist(), end.tolist(), nb.tolist()
            while j < len(tl) and not self.full():
                self.moved(*tracks[tl[j]], sl[j], el[j], nl[j])
                j += 1
            if j == len(tl):
                return
            start, end, nb, tid, last = start[j:], end[j:], nb[j:], tid[j:], last[j:]
        # the tracks in the order they first occur, totals per track
        first = np.full(len(tracks), len(tid), np.int64)  # each track's first transfer
        np.minimum.at(first, tid, np.arange(len(tid)))
        sums = np.zeros(len(tracks), np.int64)
        np.add.at(sums, tid, nb)
        for t in np.argsort(first, kind="stable")[:int((first < len(tid)).sum())].tolist():
            key = tracks[t]
            self.byte_totals[key] = self.byte_totals.get(key, 0) + int(sums[t])
            if key not in self._bins:
                self._bins[key] = {}
        while int(last.max()) // self._width >= self.max_byte_bins:
            self._coarsen()
        w = self._width
        k0, k1 = start // w, last // w
        # every (transfer, bin) part: bin k covers [lo, hi) and gets the bytes moved by
        # its hi (floor) minus those moved by its lo; a one-bin transfer gets them all
        parts = k1 - k0 + 1
        if (parts == 1).all():  # the common case: each transfer inside one bin
            j, k, lo, hi, upto_hi = np.arange(len(start)), k0, start, end, nb
            upto_lo = np.zeros(len(start), np.int64)
        else:
            j = np.repeat(np.arange(len(start)), parts)
            k = k0[j] + np.arange(int(parts.sum())) - np.repeat(np.cumsum(parts) - parts,
                                                                 parts)
            lo = np.where(k == k0[j], start[j], k * w)
            hi = np.where(k == k1[j], end[j], (k + 1) * w)
            dur = np.maximum(end - start, 1)[j]
            upto_hi = np.where(k == k1[j], nb[j], nb[j] * (hi - start[j]) // dur)
            upto_lo = np.where(k == k0[j], 0, nb[j] * (lo - start[j]) // dur)
        per = int(k1.max()) + 1  # at most max_byte_bins: cells span a small range
        cell = tid[j] * per + k
        cells, inv = _cells(cell, len(tracks) * per)
        if self.full():
            # full (and staying so): a transfer is kept when all its bins are stored,
            # else dropped whole, as one call each would decide
            stored = np.array([divmod(c, per)[1] in self._bins[tracks[divmod(c, per)[0]]]
                               for c in cells.tolist()], bool)
            lacking = np.zeros(len(start), np.int64)
            np.add.at(lacking, j, (~stored[inv]).astype(np.int64))
            keep = lacking == 0
            self.dropped += int((~keep).sum())
            part = keep[j]
            lo, hi, upto_hi, upto_lo, cell = (lo[part], hi[part], upto_hi[part],
                                              upto_lo[part], cell[part])
            cells, inv = _cells(cell, len(tracks) * per)
        add = np.zeros(len(cells), np.int64)
        np.add.at(add, inv, upto_hi - upto_lo)
        first_lo = np.full(len(cells), np.iinfo(np.int64).max, np.int64)
        np.minimum.at(first_lo, inv, lo)
        last_hi = np.full(len(cells), np.iinfo(np.int64).min, np.int64)
        np.maximum.at(last_hi, inv, hi)
        for c, n, a, b in zip(cells.tolist(), add.tolist(), first_lo.tolist(),
                              last_hi.tolist(), strict=True):
            t, kk = divmod(c, per)
            track = self._bins[tracks[t]]
            held = track.get(kk)
            if held is None:
                track[kk] = [n, a, b]
                self._nbins += 1
            else:
                held[0] += n
                if a < held[1]:
                    held[1] = a
                if b > held[2]:
                    held[2] = b

    def _moved_each(self, tracks, tid, start, end, nb) -> None:
        for t, a, b, n in zip(tid.tolist(), start.tolist(), end.tolist(), nb.tolist(),
                              strict=True):
            self.moved(*tracks[t], a, b, n)

    def _coarsen(self) -> None:
        """Double the bin width: bins ``2j`` and ``2j + 1`` merge into bin ``j``."""
        self._width *= 2
        n = 0
        for key, track in self._bins.items():
            merged: dict[int, list[int]] = {}
            for k in sorted(track):
                cell = track[k]
                into = merged.get(k >> 1)
                if into is None:
                    merged[k >> 1] = cell
                else:
                    into[0] += cell[0]
                    into[1] = min(into[1], cell[1])
                    into[2] = max(into[2], cell[2])
            self._bins[key] = merged
            n += len(merged)
        self._nbins = n

    @property
    def byte_bin_width_ps(self) -> int:
        """The current width of the byte bins (simulated ps)."""
        return self._width

    @property
    def byte_records(self) -> int:
        """How many byte bins are stored (each one event towards ``max_events``)."""
        return self._nbins

    @property
    def bytes(self) -> list[ByteInterval]:
        """The byte bins as intervals, per track in time order (built on each access)."""
        return [ByteInterval(block, lane, cell[1], cell[2], cell[0])
                for (block, lane), track in self._bins.items()
                for _, cell in sorted(track.items())]

    def binned_totals(self) -> dict[tuple[str, str], int]:
        """Bytes per (block, lane) held in the bins: equal to :attr:`byte_totals` for
        every track unless byte transfers were dropped at the event limit."""
        return {key: sum(cell[0] for cell in track.values())
                for key, track in self._bins.items()}
