"""A program as the tables the array loop runs (:mod:`sim.components.programloop`).

The instructions' rows come from a :class:`sim.program_rows.RowCache` (built once per
distinct instruction object); a program's tables are a gather of them: the table of its
distinct rows, one int32 row index per instruction, and what depends on the program
around a row: the cross-core barrier bit, waits and signals as index lists over dense
flag ids, the stats additions as ``(link, traffic kind)`` pair ids under the device's
memory map, the engine queues in the device's order (sorted by engine, then core; one
int32 instruction index per item) and the DRAM base and size of every distinct transfer
(for the chunk plans). Per instruction the tables hold 8 bytes (row index and queue item),
whatever the instruction.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from isa.instructions import Program
from sim.components import loopdefs as pl
from sim.program_rows import (
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

__all__ = ["LINKS", "RowCache", "Tables", "build"]


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


def build(program: Program, cache: RowCache, kinds_of, kind_count: int) -> Tables:
    """The tables of ``program`` with its rows from ``cache``; ``kinds_of(addresses)``
    gives each DRAM address's traffic kind as an id below ``kind_count``."""
    instrs = program.instructions
    index, store = cache.lookup(instrs, program.formats)
    # the program's distinct rows, in the cache's order (a count, not a sort)
    present = np.flatnonzero(np.bincount(index, minlength=len(store.objs)))
    if len(present) == len(store.objs):  # the program holds every row (a fresh store)
        row_of = index.astype(np.int32)
        rows = store.rows
    else:
        local = np.zeros(len(store.objs), np.int32)
        local[present] = np.arange(len(present), dtype=np.int32)
        row_of = local[index]
        rows = store.rows[present]
        del local
    del index
    nr = len(rows)
    table = np.ascontiguousarray(rows[:, : pl.I_FIELDS])

    # the stats additions' (link, kind) pairs under the current memory map
    for k, (link, addr, pair) in enumerate(((X_LINK1, X_ADDR1, pl.I_PAIR1),
                                            (X_LINK2, X_ADDR2, pl.I_PAIR2))):
        has = np.flatnonzero(rows[:, pl.I_NADD] > k)
        table[has, pair] = rows[has, link] * kind_count + kinds_of(rows[has, addr])

    # engine queues in sorted (engine, core) order, items in program order
    eng = rows[:, X_ENG]
    qcore = rows[:, X_QCORE]
    qkey = eng * (int(qcore.max(initial=0)) + 1) + qcore
    ukeys, q_of_row = np.unique(qkey, return_inverse=True)
    small = np.int16 if len(ukeys) <= np.iinfo(np.int16).max else np.int32
    q_of = q_of_row.reshape(-1).astype(small)[row_of]
    q_items = np.argsort(q_of, kind="stable").astype(np.int32)  # radix sort: small ints
    q_ptr = np.zeros(len(ukeys) + 1, np.int64)
    np.cumsum(np.bincount(q_of, minlength=len(ukeys)), out=q_ptr[1:])
    del q_of
    first = row_of[q_items[q_ptr[:-1]]]
    queues = list(zip(eng[first].tolist(), qcore[first].tolist(), strict=True))

    # flags: the rows' waits and signals (held flat in the store) over dense ids
    wl, sl = rows[:, X_WLEN], rows[:, X_SLEN]
    w_ptr = np.zeros(nr + 1, np.int64)
    np.cumsum(wl, out=w_ptr[1:])
    s_ptr = np.zeros(nr + 1, np.int64)
    np.cumsum(sl, out=s_ptr[1:])
    held = store.flags
    wflat = held[np.repeat(rows[:, X_WOFF] - w_ptr[:-1], wl) + np.arange(w_ptr[-1])]
    sflat = held[np.repeat(rows[:, X_SOFF] - s_ptr[:-1], sl) + np.arange(s_ptr[-1])]
    flags, dense = np.unique(np.concatenate([wflat, sflat]), return_inverse=True)
    dense = dense.reshape(-1).astype(np.int64)

    # an instruction on a core's engine that waits on a flag some other core's engine
    # signals pays the barrier sync (``sim.device.cross_core_waits``): a row's own fields
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

    ns = rows[:, X_NSTREAM]
    one, two = np.flatnonzero(ns >= 1), np.flatnonzero(ns >= 2)
    stream_base = np.concatenate([rows[one, X_SB1], rows[two, X_SB2]])
    stream_bytes = np.concatenate([rows[one, X_SN1], rows[two, X_SN2]])
    return Tables(table, row_of, w_ptr, dense[: len(wflat)], s_ptr, dense[len(wflat):], flags,
                  q_ptr, q_items, queues, len(LINKS) * kind_count, stream_base, stream_bytes)
