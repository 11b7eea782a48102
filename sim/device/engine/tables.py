"""A program as the tables the array loop runs (:mod:`sim.device.engine.loop`).

The instructions' rows come from a :class:`sim.device.engine.rows.RowCache` (built once per
distinct instruction object); a program's tables are a gather of them: the table of its
distinct rows, one int32 row index per instruction, and what depends on the program
around a row: the cross-core barrier bit, waits and signals as index lists over dense
flag ids, the stats additions as ``(link, traffic kind)`` pair ids under the device's
memory map, the engine queues in the device's order (sorted by engine, then core; one
int32 instruction index per item) and the DRAM base and size of every distinct transfer
(for the chunk plans). Per instruction the tables hold 8 bytes (row index and queue item),
whatever the instruction.

A program held as columns (:class:`isa.columns.ColumnProgram`) has one row per
instruction, read from its columns without making objects. A program of the length and
formats of a recently built one (a decode step after the last) reuses that one's queues,
flags and cross-core bits when every changed position keeps its engine, core, waits and
signals, and patches the last one's tables at the changed positions (:func:`_incremental`
states the proof; the changed positions are those a program made by
:meth:`~isa.instructions.Program.patched` names, else an identity scan finds them; a
decode step's kept rows come first and :mod:`sim.device.engine.table_patch` appends the added
ones); the
tables are those of a full build, array for array.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import numpy as np

from isa.columns import ColumnProgram
from isa.instructions import PER_CORE_ENGINES, Engine, Patched, Program
from sim.device.engine import loopdefs as pl
from sim.device.engine.row_fill import ColumnRows
from sim.device.engine.row_lists import (
    MOVE_RUNS,
    a_position,
    move_rows,
    splice,
    unique_small,
)
from sim.device.engine.rows import (
    LAST_PER_CORE,
    LINKS,
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
    RowCache,
)
from sim.device.engine.table_patch import prefix_rows, prefix_tables, same_heads

__all__ = ["LINKS", "MOVE_RUNS", "RowCache", "Tables", "build", "engine_name", "gather",
           "instructions_of", "move_rows", "unique_small"]


@dataclass
class Tables:
    table: np.ndarray  # (distinct rows, programloop.I_FIELDS)
    row_of: np.ndarray  # int32: the row of each instruction
    w_ptr: np.ndarray  # per row: its waits and signals, as dense flag ids
    w_flag: np.ndarray
    s_ptr: np.ndarray
    s_flag: np.ndarray
    flags: np.ndarray  # program flag of each dense flag id
    q_ptr: np.ndarray
    q_items: np.ndarray  # int32: the instructions of each queue, in program order
    queues: list[tuple[int, int]]  # (engine, core) of each queue
    pairs: int  # stats (link, kind) pair ids: link id * kinds + kind id
    stream_base: np.ndarray  # DRAM base address and bytes of every distinct transfer
    stream_bytes: np.ndarray


def engine_name(engine: Engine, core: int) -> tuple[str, str]:
    """(block, lane) names of an engine queue, as they appear in traces and metrics."""
    if engine in PER_CORE_ENGINES:
        return f"core{core}", engine.name.lower()
    if engine in (Engine.H2D, Engine.D2H):
        return "pcie", engine.name.lower()
    return "device", engine.name.lower()


def instructions_of(program: Program):
    """``program``'s instructions as a sequence; a :class:`~isa.columns.ColumnProgram`'s
    are made only when an item is read (functional execution, span names)."""
    if isinstance(program, ColumnProgram):
        return program.lazy_instructions
    return program.instructions


def build(program: Program, cache: RowCache, kinds_of, kind_count: int, *,
          incremental: bool = True, kinds_key: object = None) -> Tables:
    """The tables of ``program`` with its rows from ``cache``; ``kinds_of(addresses)``
    gives each DRAM address's traffic kind as an id below ``kind_count``. A
    :class:`~isa.columns.ColumnProgram` has its rows read from its columns (one per
    instruction, no objects made), bypassing the cache. A program of the same length and
    formats as a recent one built with ``cache`` is built incrementally when it can be
    (:func:`_incremental`; not with ``incremental=False``): the same tables as a full
    build, in less time (``cache.incremental_builds`` counts them); ``kinds_key``: an
    object that is the same (``is``) only while ``kinds_of`` maps addresses the same way
    (the device's frozen memory layout), so that kept rows keep their stats pairs."""
    if isinstance(program, ColumnProgram):
        made = ColumnRows(program.columns, cache.cores, cache.num_cores, program.formats,
                          cache.shared_link)
        return gather(made.rows, made.row_of, made.flags, kinds_of, kind_count)
    instrs = program.instructions
    got = (_incremental(instrs, program.formats, cache, kinds_of, kind_count,
                        program.patched_from, kinds_key) if incremental else None)
    if got is None:
        index, store = cache.lookup(instrs, program.formats)
        present, row_of = _distinct(index, store)
        rows = store.rows if len(present) == len(store.objs) else np.take(
            store.rows, present, axis=0)
        tables = gather(rows, row_of, store.flags, kinds_of, kind_count)
        uses = np.bincount(tables.row_of, minlength=len(tables.table))
        nstream = np.ascontiguousarray(rows[:, X_NSTREAM])
    else:
        index, store, tables, present, nstream, uses = got
        cache.incremental_builds += 1
    # kept for the next program (the instructions too: their ids stay theirs while held)
    key = (len(instrs), program.formats)
    recent = cache.recent
    recent.pop(key, None)
    if len(instrs) <= RECENT_INSTRUCTIONS:
        recent[key] = _Previous(program.formats, instrs, index, cache.generation, store,
                                tables, present, uses, nstream, kinds_key)
    # the least recently built go first
    while len(recent) > RECENT_PROGRAMS or sum(n for n, _ in recent) > RECENT_INSTRUCTIONS:
        del recent[next(iter(recent))]
    return tables


#: Programs (of distinct lengths or formats) whose tables a cache keeps for incremental
#: builds: a decode step's, and a few others run between steps (a choice bounding memory:
#: each holds one program's tables and store rows).
RECENT_PROGRAMS = 4
#: Instructions those programs may hold in all (each costs about 24 bytes kept: its object
#: reference, store row, table row and queue item; each distinct row some 90 more: its
#: store row, use count and columns ``X_LINK1 ... X_SN2``); a longer program is not kept.
#: A choice bounding memory to some 25 MB (more when every instruction is distinct), not
#: a measurement.
RECENT_INSTRUCTIONS = 1 << 20


@dataclass(frozen=True)
class _Previous:
    """The last program a cache's tables were built for: its formats and instructions,
    the store row of each, the cache generation and store, its tables."""

    formats: tuple[str, ...]
    instrs: tuple
    index: np.ndarray
    generation: int
    store: object
    tables: Tables
    present: np.ndarray  # the store row of each table row (ascending)
    uses: np.ndarray  # the positions holding each table row
    nstream: np.ndarray  # the DRAM transfers of each table row (its column X_NSTREAM)
    kinds_key: object  # what its stats pairs were set under (``build``'s ``kinds_key``)


def _distinct(index: np.ndarray, store) -> tuple[np.ndarray, np.ndarray]:
    """``(present, row_of)``: the store rows of the distinct rows of a program whose
    instructions have the store rows ``index``, in the store's order (a count, not a
    sort), and the row of each instruction among them."""
    present = np.flatnonzero(np.bincount(index, minlength=len(store.objs)))
    if len(present) == len(store.objs):  # the program holds every row (a fresh store)
        return present, index.astype(np.int32)
    local = np.zeros(len(store.objs), np.int32)
    local[present] = np.arange(len(present), dtype=np.int32)
    return present, local[index]


def _incremental(instrs, formats: tuple[str, ...], cache: RowCache, kinds_of,
                 kind_count: int, hint: Patched | None = None, kinds_key: object = None):
    """``(index, store, tables, present, nstream, uses)`` of a program built from the
    tables of the last one of its length and formats (``present``, ``nstream``, ``uses``:
    the store row, DRAM transfers and positions of each table row, kept for the next), or
    None when that cannot be proved equal to a full build (the caller then builds in
    full).

    The changed positions are those the program names (``hint``: it was made from the
    last program's instructions by :meth:`~isa.instructions.Program.patched`, which
    holds every other position's object), else those an identity scan finds.

    The proof: the program has the last one's length and formats, the cache has not
    started afresh, and at every position whose object changed the new object's row has
    the old one's engine, queue core, waits and signals. Then every position keeps its
    queue (so the queues and their items are the last ones), the program's flags are the
    same (so the dense flag ids are the same numbers: a search, not a sort) and so are the
    cores that signal each flag; a row's cross-core bit depends only on its engine, core
    and waits and on those signallers, so it is the bit of the last row at any position
    that holds it. The tables are then patched, not gathered: the distinct rows are the
    last ones that some position still holds and the changed positions' rows new to the
    program, in the store's order as a full build numbers them; a kept row keeps its
    table row, waits and signals (moved by runs, :func:`move_rows`), a new one has them
    gathered; the stats pairs of every row are recomputed from its kept columns under the
    current memory map (a kept row keeps its pairs when ``kinds_key`` is the object it was
    last built under: the same map), and so are its transfers. So the tables are the full
    build's, array for array. When the kept rows are the first ones and the added ones
    come after them (a decode step drops the rows the last one added and adds rows new to
    the store), every kept array is a prefix of the last one: the cost is then a copy of
    those prefixes plus the changed positions' work."""
    prev = cache.recent.get((len(instrs), formats))
    if prev is None or prev.generation != cache.generation:
        return None
    if hint is not None and hint.base is prev.instrs:
        # made from the last program's instructions by ``Program.patched``: every other
        # position holds the last program's object (some of these may too)
        changed = np.fromiter(hint.positions, np.int64, len(hint.positions))
    else:  # the positions whose object changed (an identity test each: no ids needed)
        changed = np.flatnonzero(~np.fromiter(map(operator.is_, instrs, prev.instrs), bool,
                                              len(instrs)))
    store = prev.store
    index = prev.index.copy()
    if len(changed):
        sub, store = cache.lookup(list(map(instrs.__getitem__, changed.tolist())), formats)
        if cache.generation != prev.generation:
            # the new rows filled the cache and it started afresh with the changed objects
            # only: afresh again, so that the full build numbers rows as on a fresh cache
            cache.clear()
            return None
        if not same_heads(store.rows, store.flags, sub, prev.index[changed]):
            return None
        index[changed] = sub
    last = prev.tables
    present = prev.present
    # the rows the program still holds, the changed positions' rows new to it (in the
    # store's order, as a full build numbers them), and the number of each among them: a
    # decode step drops the rows the last one added and adds rows new to the store, so
    # the kept rows are the first ones and the added ones come after them (a prefix)
    prefix, nk, added, row_of, new_uses, pos = prefix_rows(
        changed, index[changed], last.row_of, prev.uses, present)
    if prefix:
        new_present = np.concatenate([present[:nk], added])
        added_at = slice(nk, nk + len(added))
    else:
        new_present, kept, kept_at, added, added_at, row_of, new_uses, pos = _moved_rows(
            changed, index, last.row_of, prev.uses, present)
    # the kept rows' table rows, waits and signals as the last program had them; the
    # added rows' gathered afresh (their cross-core bit: the last row's at a position
    # holding them)
    new = np.take(store.rows, added, axis=0)
    if prefix:
        table = np.empty((len(new_present), pl.I_FIELDS), np.int64)
        table[:nk] = last.table[:nk]
        ok, w_ptr, w_flag, s_ptr, s_flag, stream_base, stream_bytes, nstream = prefix_tables(
            table, last.table, nk, new, pos, last.row_of, store.flags, last.flags,
            last.w_ptr, last.w_flag, last.s_ptr, last.s_flag, last.stream_base,
            last.stream_bytes, prev.nstream)
        if not ok:
            return None  # not the same flags (cannot happen when the heads are the same)
    else:
        got = _moved_tables(last, new, store, kept, kept_at, added_at, pos, new_present)
        if got is None:
            return None
        table, w_ptr, w_flag, s_ptr, s_flag, stream_base, stream_bytes, nstream = got
    # the stats pairs under the current memory map (a kept row's are the last ones under
    # the same map)
    if kinds_key is not None and kinds_key is prev.kinds_key and last.pairs == len(
            LINKS) * kind_count:
        part = table[added_at]
        _set_pairs(part, new[:, X_LINK1: X_SN2 + 1], X_LINK1, kinds_of, kind_count)
        table[added_at] = part
    else:
        _set_pairs(table, store.rows[new_present, X_LINK1: X_SN2 + 1], X_LINK1, kinds_of,
                   kind_count)
    return index, store, Tables(
        table, row_of, w_ptr, w_flag, s_ptr, s_flag, last.flags, last.q_ptr, last.q_items,
        last.queues, len(LINKS) * kind_count, stream_base, stream_bytes), new_present, \
        nstream, new_uses


def _moved_tables(last: Tables, new: np.ndarray, store, kept: np.ndarray,
                  kept_at: np.ndarray, added_at: np.ndarray, pos: np.ndarray,
                  new_present: np.ndarray):
    """``(table, w_ptr, w_flag, s_ptr, s_flag, stream_base, stream_bytes, nstream)`` of a
    patched build whose kept rows are not all first
    (:func:`sim.device.engine.table_patch.prefix_tables`
    for the rest): the last tables' rows ``kept`` moved to rows ``kept_at``, the store rows
    ``new`` at ``added_at`` (each one's cross-core bit the last row's at position
    ``pos``), or None when an added row waits or signals a flag the program had not."""
    table = np.empty((len(new_present), pl.I_FIELDS), np.int64)
    move_rows(table, kept_at, last.table, kept)
    if len(new):
        table[added_at] = new[:, : pl.I_FIELDS]
        table[added_at, pl.I_FLAGS] |= (last.table[last.row_of[pos], pl.I_FLAGS]
                                        & pl.FL_CROSS)
    aw_ptr, as_ptr, wflat, sflat = _heads(new, store.flags)
    values = np.concatenate([wflat, sflat])
    dense = np.searchsorted(last.flags, values)
    if len(values) and (int(dense.max()) >= len(last.flags)
                        or not np.array_equal(last.flags[dense], values)):
        return None  # not the same flags (cannot happen when the heads are the same)
    w_ptr, w_flag = splice(last.w_ptr, last.w_flag, kept, kept_at, aw_ptr,
                           dense[: len(wflat)], added_at)
    s_ptr, s_flag = splice(last.s_ptr, last.s_flag, kept, kept_at, as_ptr,
                           dense[len(wflat):], added_at)
    cols = store.rows[new_present, X_LINK1: X_SN2 + 1]
    stream_base, stream_bytes = _streams(cols, X_LINK1)
    return (table, w_ptr, w_flag, s_ptr, s_flag, stream_base, stream_bytes,
            np.ascontiguousarray(cols[:, X_NSTREAM - X_LINK1]))


def _moved_rows(changed: np.ndarray, index: np.ndarray, last_row_of: np.ndarray,
                last_uses: np.ndarray, present: np.ndarray):
    """``(present, kept, kept_at, added, added_at, row_of, uses, first_at)`` of a patched
    build whose kept rows are not all first
    (:func:`sim.device.engine.table_patch.prefix_rows` for the
    rest): the store row of each table row, the last table's rows kept and their new rows,
    the store rows added and their rows, each position's row, the positions holding each
    row and a changed position holding each added row."""
    nr = len(present)
    uses = last_uses - np.bincount(last_row_of[changed], minlength=nr)
    want = np.unique(index[changed])
    k = np.minimum(np.searchsorted(present, want), max(nr - 1, 0))
    known = present[k] == want if nr else np.zeros(len(want), bool)
    keep = uses > 0
    keep[k[known]] = True
    added = want[~known]
    kept = np.flatnonzero(keep)
    new_present = present[kept]
    if len(added):
        new_present = np.insert(new_present, np.searchsorted(new_present, added), added)
    kept_at = np.searchsorted(new_present, present[kept])
    added_at = np.searchsorted(new_present, added)
    remap = np.full(nr, -1, np.int32)
    remap[kept] = kept_at
    row_of = remap[last_row_of]
    new_uses = np.zeros(len(new_present), np.int64)
    new_uses[kept_at] = uses[kept]
    row_of[changed] = np.searchsorted(new_present, index[changed])
    np.add.at(new_uses, row_of[changed], 1)
    return (new_present, kept, kept_at, added, added_at, row_of, new_uses,
            a_position(index, changed, added))


def _table(rows: np.ndarray, kinds_of, kind_count: int) -> np.ndarray:
    """The loop's table of the distinct ``rows``, with the stats additions' ``(link,
    kind)`` pairs under the current memory map."""
    table = np.ascontiguousarray(rows[:, : pl.I_FIELDS])
    _set_pairs(table, rows, 0, kinds_of, kind_count)
    return table


def _set_pairs(table: np.ndarray, cols: np.ndarray, shift: int, kinds_of,
               kind_count: int) -> None:
    """Sets the stats additions' ``(link, kind)`` pairs of the ``table`` rows under the
    current memory map, from ``cols``: the rows' columns from column ``shift`` on."""
    nadd = table[:, pl.I_NADD]
    has = (np.flatnonzero(nadd > 0), np.flatnonzero(nadd > 1))
    kinds = kinds_of(np.concatenate([cols[has[0], X_ADDR1 - shift],
                                     cols[has[1], X_ADDR2 - shift]]))
    for rows, kind, link, pair in ((has[0], kinds[: len(has[0])], X_LINK1, pl.I_PAIR1),
                                   (has[1], kinds[len(has[0]):], X_LINK2, pl.I_PAIR2)):
        table[rows, pair] = cols[rows, link - shift] * kind_count + kind


def _heads(rows: np.ndarray, held: np.ndarray):
    """``(w_ptr, s_ptr, waits, signals)``: the rows' waits and signals (held flat in
    ``held``) as flag lists with offsets per row."""
    wl, sl = rows[:, X_WLEN], rows[:, X_SLEN]
    nr = len(rows)
    w_ptr = np.zeros(nr + 1, np.int64)
    np.cumsum(wl, out=w_ptr[1:])
    s_ptr = np.zeros(nr + 1, np.int64)
    np.cumsum(sl, out=s_ptr[1:])
    wflat = held[np.repeat(rows[:, X_WOFF] - w_ptr[:-1], wl) + np.arange(w_ptr[-1])]
    sflat = held[np.repeat(rows[:, X_SOFF] - s_ptr[:-1], sl) + np.arange(s_ptr[-1])]
    return w_ptr, s_ptr, wflat, sflat


def _streams(rows: np.ndarray, shift: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The DRAM base and bytes of every transfer of the rows (for the chunk plans);
    ``rows``' columns are the rows' from column ``shift`` on."""
    ns = rows[:, X_NSTREAM - shift]
    one, two = np.flatnonzero(ns >= 1), np.flatnonzero(ns >= 2)
    sb1, sn1, sb2, sn2 = (c - shift for c in (X_SB1, X_SN1, X_SB2, X_SN2))
    return (np.concatenate([rows[one, sb1], rows[two, sb2]]),
            np.concatenate([rows[one, sn1], rows[two, sn2]]))


def gather(rows: np.ndarray, row_of: np.ndarray, held: np.ndarray, kinds_of,
           kind_count: int) -> Tables:
    """The tables of a program of the distinct ``rows`` (their waits and signals point into
    ``held``), instruction ``i`` having row ``row_of[i]``."""
    nr = len(rows)
    table = _table(rows, kinds_of, kind_count)

    # engine queues in sorted (engine, core) order, items in program order
    eng = rows[:, X_ENG]
    qcore = rows[:, X_QCORE]
    qkey = eng * (int(qcore.max(initial=0)) + 1) + qcore
    ukeys, q_of_row = unique_small(qkey)
    small = np.int16 if len(ukeys) <= np.iinfo(np.int16).max else np.int32
    q_of = q_of_row.astype(small)[row_of]
    q_items = np.argsort(q_of, kind="stable").astype(np.int32)  # radix sort: small ints
    q_ptr = np.zeros(len(ukeys) + 1, np.int64)
    np.cumsum(np.bincount(q_of, minlength=len(ukeys)), out=q_ptr[1:])
    del q_of
    first = row_of[q_items[q_ptr[:-1]]]
    queues = list(zip(eng[first].tolist(), qcore[first].tolist(), strict=True))

    # flags: the rows' waits and signals over dense ids
    w_ptr, s_ptr, wflat, sflat = _heads(rows, held)
    wl, sl = rows[:, X_WLEN], rows[:, X_SLEN]
    flags, dense = unique_small(np.concatenate([wflat, sflat]))

    # an instruction on a core's engine that waits on a flag some other core's engine
    # signals pays the barrier sync (``FixedCosts.sync_ps``): a row's own fields
    # and the program's signallers decide it, however often the row occurs
    per_core = eng <= LAST_PER_CORE
    nflags = len(flags)
    if nflags and len(wflat):
        sig_row = np.repeat(np.arange(nr, dtype=np.int64), sl)
        sig_flag = dense[len(wflat):]
        prod = per_core[sig_row]
        lo = np.full(nflags, np.iinfo(np.int64).max, np.int64)
        hi = np.full(nflags, -1, np.int64)
        np.minimum.at(lo, sig_flag[prod], qcore[sig_row[prod]])
        np.maximum.at(hi, sig_flag[prod], qcore[sig_row[prod]])
        wait_row = np.repeat(np.arange(nr, dtype=np.int64), wl)
        wait_flag = dense[: len(wflat)]
        wc = qcore[wait_row]
        other = (hi[wait_flag] >= 0) & ((lo[wait_flag] != wc) | (hi[wait_flag] != wc))
        cross = np.zeros(nr, bool)
        cross[wait_row[other & per_core[wait_row]]] = True
        table[cross, pl.I_FLAGS] |= pl.FL_CROSS

    stream_base, stream_bytes = _streams(rows)
    return Tables(table, row_of, w_ptr, dense[: len(wflat)], s_ptr, dense[len(wflat):], flags,
                  q_ptr, q_items, queues, len(LINKS) * kind_count, stream_base, stream_bytes)
