"""The row of each distinct instruction object, as the array loop reads it, and a bounded
cache of those rows keyed by object identity.

A row holds what the array loop (:mod:`sim.device.engine.loop`) needs of one
instruction, whatever program it appears in: its kind, precomputed duration, DMA
resource, core and up to two transfers (the loop's columns ``loopdefs.I_*``), its
integer ops, the stats additions it makes when its timing begins (up to two: link,
DRAM address, bytes) and the DRAM transfers the efficiency model plans chunks for (up
to two: base, bytes), plus the engine queue it runs on. What depends on the program
around it (the cross-core barrier bit, dense flag ids, the traffic kind of an address
under the device's current memory map) is added per program by :mod:`sim.device.engine.tables`.

The rows are built by :mod:`sim.device.engine.row_fill` (whose row layout, ``X_*`` and
:data:`ROW_FIELDS`, this module re-exports).

Instructions are frozen values and the compiler emits one object per distinct
instruction (``Builder.emit``), so a decode step shares most of its objects with the
previous one: :class:`RowCache` builds each object's row once and holds the object (so
that its ``id`` stays its own) until the cache is full, then starts afresh.
"""

from __future__ import annotations

from itertools import chain, count

import numpy as np

from isa.identity import object_ids
from isa.instructions import Instruction
from sim.device.engine.row_fill import (
    FAMILIES,
    LAST_PER_CORE,
    LINKS,
    ROW_FIELDS,
    X_ADDR1,
    X_ADDR2,
    X_ENG,
    X_LINK1,
    X_LINK2,
    X_NSTREAM,
    X_QCORE,
    X_SB1,
    X_SB2,
    X_SLEN,
    X_SN1,
    X_SN2,
    X_SOFF,
    X_WLEN,
    X_WOFF,
    Built,
    build_rows,
    unique_rows,
)

__all__ = [
    "FAMILIES", "LAST_PER_CORE", "LINKS", "MAX_ROWS", "ROW_FIELDS", "X_ADDR1", "X_ADDR2",
    "X_ENG", "X_LINK1", "X_LINK2", "X_NSTREAM", "X_QCORE", "X_SB1", "X_SB2", "X_SLEN", "X_SN1",
    "X_SN2", "X_SOFF", "X_WLEN", "X_WOFF", "Built", "RowCache", "RowStore", "build_rows",
    "unique_rows",
]

#: Rows a :class:`RowCache` holds before it starts afresh. An assumption sized for memory:
#: a row is ROW_FIELDS int64 (280 bytes) plus its index entry, so a full cache is about
#: 100 MB; a decode step of Qwen2.5-0.5B has ~13,600 distinct objects, ~1,000 of them new.
MAX_ROWS = 1 << 18

class RowStore:
    """The rows of one KV-format table's objects: an index by identity (the objects' ids,
    sorted, and the row of each), the objects (held so that no other object takes their
    id) and the rows, in order of arrival (a program's new objects in :class:`Built`'s
    order: by type), and the flags their rows point into (``X_WOFF`` ...): each the used
    head of a buffer that grows (:data:`GROWTH`) as it fills."""

    def __init__(self) -> None:
        self._ids = np.zeros(0, np.int64)
        self._at = np.zeros(0, np.int64)
        self.objs: list[Instruction] = []
        self._rows = np.zeros((0, ROW_FIELDS), np.int64)
        self._flags = np.zeros(0, np.int64)
        self._nflags = 0
        self._reserved: np.ndarray | None = None  # rows handed out by :meth:`reserve`
        self._dirty_end = 0  # rows past the used head may have been written up to here

    @property
    def rows(self) -> np.ndarray:
        return self._rows[: len(self.objs)]

    @property
    def flags(self) -> np.ndarray:
        return self._flags[: self._nflags]

    def find(self, ids: np.ndarray) -> np.ndarray:
        """The row of each object id of ``ids`` (-1: not held)."""
        held = self._ids
        if not len(held):
            return np.full(len(ids), -1, np.int64)
        k = np.searchsorted(held, ids)
        k[k == len(held)] = 0
        return np.where(held[k] == ids, self._at[k], -1)

    def reserve(self, n: int) -> np.ndarray:
        """The buffer's next ``n`` rows past the used head, zeros: rows written there
        (:class:`Built`'s ``out``) and then appended (:meth:`append`) are not copied."""
        base = len(self.objs)
        grown = _room(self._rows, base, base + n)
        if grown is not self._rows:
            self._rows, self._dirty_end = grown, 0
        elif self._dirty_end > base:  # rows written but never appended
            self._rows[base: self._dirty_end] = 0
        self._dirty_end = base + n
        self._reserved = self._rows[base: base + n]
        return self._reserved

    def append(self, objs: list[Instruction], rows: np.ndarray,
               ids: np.ndarray | None = None, pairs: list | None = None,
               pair_of: np.ndarray | None = None, id_order: np.ndarray | None = None) -> int:
        """Adds the rows of new objects (``ids``: their ids, ``id_order`` the order that
        sorts them; ``pairs``: their distinct ``(wait, signal)`` pairs and ``pair_of`` the
        number of each object's, if known, as :class:`Built` gives them) and their flags;
        returns the index of the first. Each distinct pair is held once, and the rows that
        have it point at it. ``rows`` are written (their flag columns); the rows of
        :meth:`reserve` are taken where they are."""
        base = len(self.objs)
        end = base + len(objs)
        if pairs is None or pair_of is None:
            pairs, pair_of = _pairs([(i.wait, i.signal) for i in objs])
        which = pair_of
        waits = [w for w, _ in pairs]
        sigs = [s for _, s in pairs]
        wl = np.fromiter(map(len, waits), np.int64, len(waits))
        sl = np.fromiter(map(len, sigs), np.int64, len(sigs))
        nw, ns = int(wl.sum()), int(sl.sum())
        flags = np.fromiter(chain(chain.from_iterable(waits), chain.from_iterable(sigs)),
                            np.int64, nw + ns)
        f0 = self._nflags
        rows[:, X_WLEN] = wl[which]
        rows[:, X_WOFF] = (f0 + np.cumsum(wl) - wl)[which]
        rows[:, X_SLEN] = sl[which]
        rows[:, X_SOFF] = (f0 + nw + np.cumsum(sl) - sl)[which]
        if rows is not self._reserved:
            self._rows = _room(self._rows, base, end)
            self._rows[base:end] = rows
        self._reserved = None
        self._flags = _room(self._flags, f0, f0 + nw + ns)
        self._flags[f0: f0 + nw + ns] = flags
        self._nflags += nw + ns
        if ids is None:
            ids = object_ids(objs)
        order = np.argsort(ids) if id_order is None else id_order
        new = ids[order]
        at = np.searchsorted(self._ids, new)
        self._ids = np.insert(self._ids, at, new)
        self._at = np.insert(self._at, at, base + order)
        self.objs.extend(objs)
        return base


def _pairs(heads: list) -> tuple[list, np.ndarray]:
    """``(pairs, pair_of)``: the distinct of ``heads`` in the order they first occur, and
    the number of each head among them."""
    first_of: dict = {}
    first = np.fromiter(map(first_of.setdefault, heads, count()), np.int64, len(heads))
    distinct, which = np.unique(first, return_inverse=True)
    return list(map(heads.__getitem__, distinct.tolist())), which.reshape(-1)


#: How much room a store's buffer leaves when it grows: ``GROWTH`` times the rows it needs.
#: A choice: a model's first decode step (~13,600 new objects on Qwen2.5-0.5B) then fits
#: beside its prefill's (~25,600) without copying them; the room beyond the used head is
#: zeros never written (pages the system maps only when touched).
GROWTH = 2


def _room(buf: np.ndarray, used: int, need: int) -> np.ndarray:
    """``buf`` (of which ``used`` rows are used), grown to ``GROWTH`` times ``need`` rows
    if it has fewer than ``need``."""
    if need <= len(buf):
        return buf
    out = np.zeros((max(GROWTH * need, 2 * len(buf)), *buf.shape[1:]), buf.dtype)
    out[:used] = buf[:used]
    return out


class RowCache:
    """The rows of the instruction objects a device has run, built once per object.

    ``cores`` are the device's compute cores (their durations), ``num_cores`` their count,
    ``shared_link`` whether its host link copies through shared DRAM;
    rows depend on a program's KV-format table too, so they are kept per table. Past
    ``max_rows`` rows in all the cache starts afresh before taking a program's new rows (so
    it holds at most ``max_rows`` or one program's distinct objects, whichever is more)."""

    def __init__(self, cores: list, num_cores: int, max_rows: int = MAX_ROWS, *,
                 shared_link: bool = False) -> None:
        if max_rows < 1:
            raise ValueError(f"max_rows {max_rows}: must be at least 1")
        self.cores = cores
        self.num_cores = num_cores
        #: the device's host link copies through shared DRAM (the host rows' additions)
        self.shared_link = shared_link
        self.max_rows = max_rows
        self._by_formats: dict[tuple[str, ...], RowStore] = {}
        self._held = 0
        #: how often the cache has started afresh (a row index of an earlier generation
        #: means nothing in this one)
        self.generation = 0
        #: what :mod:`sim.device.engine.tables` keeps of the last programs it built (by length
        #: and formats), to build the next ones incrementally (dropped with the rows)
        self.recent: dict = {}
        self.incremental_builds = 0  # programs whose tables were built from the last one's

    def __len__(self) -> int:
        return self._held

    def clear(self) -> None:
        self._by_formats.clear()
        self._held = 0
        self.generation += 1
        self.recent.clear()

    def lookup(self, instrs, formats: tuple[str, ...]) -> tuple[np.ndarray, RowStore]:
        """``(index, store)``: the row of each of ``instrs`` as an index into ``store`` (the
        rows of ``formats``' objects), building the rows of objects not seen before."""
        store = self._by_formats.get(formats)
        n = len(instrs)
        objs = np.fromiter(instrs, object, n)
        ids = object_ids(objs)
        if store is not None:
            index = store.find(ids)
            missing = np.flatnonzero(index < 0)
            if not len(missing):
                return index, store
            ids = ids[missing]
        else:  # every object is new
            index = np.empty(n, np.int64)
            missing = None
        uniq, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
        # the new objects in the order they first occur (their first places, sorted by a
        # mask: no sort), and the place of each of ``uniq`` among them
        is_first = np.zeros(len(ids), bool)
        is_first[first] = True
        firsts = np.flatnonzero(is_first)
        first_at = np.cumsum(is_first)[first] - 1
        pick = firsts if missing is None else missing[firsts]
        # (every object new and distinct: the program's own order)
        new = list(instrs) if len(pick) == n else objs[pick].tolist()
        if self._held + len(new) > self.max_rows and self._held:
            Built(new, self.cores, self.num_cores, formats,  # may raise: no change
                  shared_link=self.shared_link)
            self.clear()
            if store is not None:  # the program's other objects are new again too
                return self.lookup(instrs, formats)
        made = store is None
        if made:
            store = self._by_formats[formats] = RowStore()
        try:
            built = Built(new, self.cores, self.num_cores, formats, store.reserve(len(new)),
                          shared_link=self.shared_link)
        except BaseException:
            if made:  # no change
                del self._by_formats[formats]
            raise
        # the row of each new object (in ``uniq``'s order), past the store's head
        place = np.empty(len(new), np.int64)
        place[built.order] = np.arange(len(new))
        place = place[first_at]
        rank = np.empty(len(new), np.int64)  # the number in ``uniq`` of each new object
        rank[first_at] = np.arange(len(new))
        base = store.append(built.objs, built.rows, uniq[rank[built.order]], built.pairs,
                            built.pair_of, place)
        index[slice(None) if missing is None else missing] = (base + place)[inverse.reshape(-1)]
        self._held += len(new)
        return index, store
