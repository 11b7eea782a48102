"""Run a program on the array event loop (:mod:`sim.components.programloop`).

A program becomes tables (one row per instruction: kind, precomputed duration, DMA
engine, transfers; waits and signals as index lists; engine queues in the device's
order), the DRAM timing of every distinct chunk comes from ``Dram.chunk_plan``, the loop
runs, and its logs are replayed in order into what the generator processes would have
changed: the stats (the same additions, so counters keep their key order), the recorder
(the same calls in the same order), the components' state (DRAM channels, SRAM ports,
link directions, the kernel's clock and insertion id) and, in functional mode, memory
(``isa.semantics`` in the order instructions ended, which is the order the processes
execute them: an instruction's bytes never influence timing).

:func:`eligible` says when a device can use it; otherwise the device runs the generator
processes on the event kernel (the same timeline, more slowly).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from isa import kvformats, semantics
from isa.errors import DeviceError
from isa.instructions import (
    PER_CORE_ENGINES,
    Attn,
    DmaCopy,
    DmaLoad,
    DmaStore,
    Engine,
    Gemm,
    HostRead,
    HostWrite,
    KvRead,
    KvWrite,
    Nop,
    Program,
    Vec,
)
from sim.components import kernel
from sim.components import programloop as pl

_DIRECTIONS = ("load", "store", "copy", "read", "write")
#: The engine queue of each instruction type (Nop names its own).
_ENGINE_OF = {t: int(t.engine_kind) for t in (DmaLoad, DmaStore, DmaCopy, HostWrite, HostRead,
                                              Attn, KvWrite, KvRead, Gemm, Vec)}
#: Engines numbered up to this one have one queue per core.
_LAST_PER_CORE = max(int(e) for e in PER_CORE_ENGINES)
if {int(e) for e in PER_CORE_ENGINES} != set(range(_LAST_PER_CORE + 1)):
    raise ImportError("per-core engines must be numbered first")


@dataclass(frozen=True)
class LoopResult:
    """What the loop left for the device: whether the program completed, and if not,
    ``blocked`` = {engine name: (instruction index, flag)} as the processes report it."""

    completed: bool
    blocked: dict[str, tuple[int, int]]


def eligible(dev) -> bool:
    """Whether ``dev``'s program runs can use the array loop: the lean kernel with no
    other events pending, a PCIe host link and float bandwidths (the loop's rounding
    equals Python's only for float divisors)."""
    env = dev.env
    if not isinstance(env, kernel.Environment) or env.pending:
        return False
    if dev.hw.host_link.kind != "pcie":
        return False
    bws = [dev.link.bytes_per_s["h2d"], dev.link.bytes_per_s["d2h"],
           dev.srams[0].port_bytes_per_s]
    return all(isinstance(b, float) for b in bws)


def _resources(dev) -> list:
    # the loop's resource ids: dma_in per core, dma_out per core, kv_stream per core, copy
    return [*dev.dma_in, *dev.dma_out, *dev.kv_stream, dev.copy_engine]


def run(dev, program: Program, queue_names: list[tuple[str, str]] | None = None
        ) -> LoopResult:
    """Runs ``program`` on ``dev`` (which must be :func:`eligible`)."""
    from sim.device import engine_name

    n_cores = dev.num_cores
    instrs = program.instructions
    n = len(instrs)
    formats = program.formats
    fmt_cache: dict[str, kvformats.KVFormat] = {}
    rows: list[tuple[int, ...]] = []
    waits: list[int] = []
    w_ptr = [0]
    signals: list[int] = []
    s_ptr = [0]
    flag_ids: dict[int, int] = {}
    adds: list[tuple | None] = [None] * n
    ops: list[int] = []
    queues: dict[tuple[int, int], list[int]] = {}
    streams: list[tuple[int, int]] = []  # (DRAM base address, total bytes) of each transfer
    prefix = "pcie"
    kind_of = dev.kind_of
    cores = dev.cores
    durations: dict[tuple, int] = {}
    for i, ins in enumerate(instrs):
        t = type(ins)
        eng = ins.on if t is Nop else _ENGINE_OF.get(t)
        if eng is None:
            raise DeviceError(f"no engine executes {t.__name__}")
        core = ins.core if eng <= _LAST_PER_CORE else 0
        key = (eng, core)
        items = queues.get(key)
        if items is None:
            items = queues[key] = []
        items.append(i)
        if ins.wait:
            for f in ins.wait:
                fid = flag_ids.get(f)
                if fid is None:
                    fid = flag_ids[f] = len(flag_ids)
                waits.append(fid)
        w_ptr.append(len(waits))
        if ins.signal:
            for f in ins.signal:
                fid = flag_ids.get(f)
                if fid is None:
                    fid = flag_ids[f] = len(flag_ids)
                signals.append(fid)
        s_ptr.append(len(signals))
        ops.append(ins.ops())
        if t is DmaLoad:
            total = ins.nbytes * ins.rows
            adds[i] = (("dram_read", kind_of(ins.src), total),)
            streams.append((ins.src, total))
            rows.append((pl.K_DMA, 0, ins.core, ins.core, 0, pl.D_LOAD, ins.src, ins.dst, total))
        elif t is DmaStore:
            total = ins.nbytes * ins.rows
            adds[i] = (("dram_write", kind_of(ins.dst), total),)
            streams.append((ins.dst, total))
            rows.append((pl.K_DMA, 0, n_cores + ins.core, ins.core, 0, pl.D_STORE, ins.src,
                         ins.dst, total))
        elif t is DmaCopy:
            total = ins.nbytes
            adds[i] = (("dram_read", kind_of(ins.src), total),
                       ("dram_write", kind_of(ins.dst), total))
            streams.append((ins.src, total))
            streams.append((ins.dst, total))
            rows.append((pl.K_DMA, 0, 3 * n_cores, ins.core, 0, pl.D_COPY, ins.src, ins.dst,
                         total))
        elif t is HostWrite:
            kind = kind_of(ins.dst)
            adds[i] = ((f"{prefix}_h2d", kind, ins.nbytes), ("dram_write", kind, ins.nbytes))
            rows.append((pl.K_LINK, 0, 0, 0, 0, 0, 0, 0, ins.nbytes))
        elif t is HostRead:
            kind = kind_of(ins.src)
            adds[i] = ((f"{prefix}_d2h", kind, ins.nbytes), ("dram_read", kind, ins.nbytes))
            rows.append((pl.K_LINK, 0, 0, 0, 0, 1, 0, 0, ins.nbytes))
        elif t is Attn or t is KvWrite or t is KvRead:
            dkey = ((3, ins.core, ins.q_len, ins.ctx, ins.head_dim, ins.heads, ins.k_fmt,
                     ins.v_fmt) if t is Attn else (2, ins.core, t, ins.ops()))
            dur = durations.get(dkey)
            if dur is None:
                dur = durations[dkey] = cores[ins.core].duration_ps(ins, formats)
            subs: list[tuple[int, int, int, int]] = []
            if t is Attn:
                adds[i] = (("dram_read", kind_of(ins.k), ins.k_nbytes + ins.v_nbytes),)
                subs = [(pl.D_READ, ins.k, 0, ins.k_nbytes), (pl.D_READ, ins.v, 0, ins.v_nbytes)]
            else:
                text = formats[ins.fmt]
                fmt = fmt_cache.get(text)
                if fmt is None:
                    fmt = fmt_cache[text] = kvformats.parse(text)
                if t is KvWrite:
                    rd, wr = fmt.write_bytes(ins.pos, ins.tokens, ins.width)
                    base = ins.dst
                else:
                    rd, wr = fmt.read_bytes(ins.pos, ins.tokens, ins.width), 0
                    base = ins.src
                kind = kind_of(base)
                parts = []
                if rd:
                    parts.append(("dram_read", kind, rd))
                    subs.append((pl.D_READ, base, 0, rd))
                if wr:
                    parts.append(("dram_write", kind, wr))
                    subs.append((pl.D_WRITE, 0, base, wr))
                adds[i] = tuple(parts)
            row = [pl.K_PAR, dur, 2 * n_cores + ins.core, ins.core, len(subs)]
            for d, src, dst, nb in subs:
                row += (d, src, dst, nb)
                streams.append((src if d == pl.D_READ else dst, nb))
            rows.append(tuple(row))
        else:
            # compute-only (and Nop on any engine): one timeout of the core's duration
            if t is Nop:
                dur = 0
            else:
                dkey = ((0, core, ins.m, ins.k, ins.n, ins.w_bits) if t is Gemm
                        else (1, core, t, ins.ops()))
                dur = durations.get(dkey)
                if dur is None:
                    dur = durations[dkey] = cores[core].duration_ps(ins, formats)
            rows.append((pl.K_COMPUTE, dur))
    table = np.zeros((n, pl.I_FIELDS), np.int64)
    for width in {len(r) for r in rows}:
        sel = [k for k, r in enumerate(rows) if len(r) == width]
        table[sel, :width] = np.asarray([rows[k] for k in sel], np.int64).reshape(-1, width)
    w_ptr = np.asarray(w_ptr, np.int64)
    s_ptr = np.asarray(s_ptr, np.int64)
    ops = np.asarray(ops, np.int64)
    keys_sorted = sorted(queues)
    q_ptr = np.zeros(len(keys_sorted) + 1, np.int64)
    q_items = np.zeros(n, np.int64)
    q_of = np.zeros(n, np.int64)
    pos = 0
    for q, key in enumerate(keys_sorted):
        items = queues[key]
        q_items[pos: pos + len(items)] = items
        q_of[items] = q
        pos += len(items)
        q_ptr[q + 1] = pos
    names = [engine_name(Engine(eng), core) for eng, core in keys_sorted]

    # DRAM timing of every distinct chunk, from the DRAM component
    dram = dev.dram
    chunk = dev.hw.dma.chunk_bytes
    stripe = dram.cfg.interleave_bytes * dram.cfg.channels
    key_mul = chunk + 1
    if streams:
        arr = np.asarray(streams, np.int64)
        base, total = arr[:, 0], arr[:, 1]
        counts = np.maximum(1, -(-total // chunk))
        first = np.cumsum(counts) - counts
        k = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(first, counts)
        off = k * chunk
        nb = np.minimum(chunk, np.repeat(total, counts) - off)
        keys = np.unique(((np.repeat(base, counts) + off) % stripe) * key_mul + nb)
    else:
        keys = np.zeros(0, np.int64)
    plan_ptr = np.zeros(len(keys) + 1, np.int64)
    plan_rows: list[tuple[int, int, int]] = []
    for u, key in enumerate(keys.tolist()):
        plan_rows.extend(dram.chunk_plan(key // key_mul, key % key_mul))
        plan_ptr[u + 1] = len(plan_rows)
    plan = np.asarray(plan_rows, np.int64).reshape(-1, 3)

    res = _resources(dev)
    res_cap = np.asarray([r.cfg.max_outstanding_chunks for r in res], np.int64)
    res_setup = np.asarray([r.setup_ps for r in res], np.int64)
    res_chunk = np.asarray([r.cfg.chunk_bytes for r in res], np.int64)
    dram_free = np.asarray(dram.free_ps, np.int64)
    port_free = np.asarray([s.port_free_ps for s in dev.srams], np.int64)
    link = dev.link
    link_free = np.asarray([link.free_ps["h2d"], link.free_ps["d2h"]], np.int64)
    link_bps = np.asarray([link.bytes_per_s["h2d"], link.bytes_per_s["d2h"]], np.float64)
    rec = dev.recorder
    log_level = 2 if rec.wants("tiles") else 1 if rec.wants("ops") else 0
    env = dev.env

    (result, now, eid, d_read, d_written, done, nd, starts, nst, logs, nl, blocked,
     pending) = pl.run_program(
        env.now, env.insertion_id, table, w_ptr, np.asarray(waits, np.int64), s_ptr,
        np.asarray(signals, np.int64), q_ptr, q_items, len(flag_ids), res_cap, res_setup,
        res_chunk, dram_free, dram.latency_ps, keys, plan_ptr, plan[:, 0].copy(),
        plan[:, 1].copy(), plan[:, 2].copy(), stripe, key_mul, port_free,
        float(dev.srams[0].port_bytes_per_s), link_free, link_bps, link.latency_ps,
        link.cfg.chunk_bytes, log_level)
    if pending:
        raise RuntimeError(f"program {program.name!r}: {pending} events left scheduled")

    # the components' state and the kernel's clock
    env.advance(int(now), int(eid))
    dram.free_ps[:] = dram_free.tolist()
    dram.bytes_read += int(d_read)
    dram.bytes_written += int(d_written)
    for c, s in enumerate(dev.srams):
        s.port_free_ps[:] = port_free[c].tolist()
    link.free_ps["h2d"], link.free_ps["d2h"] = (int(x) for x in link_free)

    # stats: the additions the processes make, summed per (link, kind) in the order each
    # pair first occurs, which gives every counter the same keys in the same order
    st = dev.stats
    summed: dict[tuple[str, str], int] = {}
    for i in starts[:nst].tolist():
        for link_name, kind, nbytes in adds[i]:
            pair = (link_name, kind)
            summed[pair] = summed.get(pair, 0) + nbytes
    for (link_name, kind), nbytes in summed.items():
        st.add(link_name, kind, nbytes)
    done = done[:nd]
    idx = done[:, 0]
    st.instructions += nd
    st.ops += int(ops[idx].sum())
    if nd:
        qd = q_of[idx]
        busy = np.zeros(len(names), np.int64)
        np.add.at(busy, qd, done[:, 2] - done[:, 1])
        _, firsts = np.unique(qd, return_index=True)
        for q in qd[np.sort(firsts)].tolist():
            block, lane = names[q]
            st.busy_ps[f"{block}.{lane}"] += int(busy[q])

    if dev.functional:
        mem = dev.mem
        for i in idx.tolist():
            semantics.execute(instrs[i], mem, formats)

    if nl:
        _replay(rec, logs[:nl].tolist(), names, instrs, res, link.block)

    blocked_by = {}
    if result != pl.R_DONE:
        inv = {v: k for k, v in flag_ids.items()}
        for q, (i, f) in enumerate(blocked.tolist()[: len(names)]):
            if i >= 0:
                block, lane = names[q]
                blocked_by[f"{block}.{lane}"] = (i, inv[f])
    return LoopResult(result == pl.R_DONE, blocked_by)


def _replay(rec, logs: list[list[int]], names, instrs, res, link_block: str) -> None:
    tiles = rec.wants("tiles")
    span = rec.span
    moved = rec.moved
    lanes = {}
    for code, a, b, c, d, e in logs:
        if code == pl.LOG_INS:
            block, lane = names[a]
            span(block, lane, instrs[b].mnemonic, c, d, args={"index": b})
        elif code == pl.LOG_DRAM:
            lane = lanes.get(a)
            if lane is None:
                lane = lanes[a] = f"ch{a}"
            moved("dram", lane, b, c, d)
            if tiles:
                span("dram", lane, "write" if e else "read", b, c, detail="tiles",
                     args={"bytes": d})
        elif code == pl.LOG_LINK:
            direction = "h2d" if a == 0 else "d2h"
            moved(link_block, direction, b, c, d)
            span(link_block, direction, "chunk", b, c, detail="tiles", args={"bytes": d})
        else:
            r = res[a]
            span(r.block, r.lane, f"{_DIRECTIONS[b]} chunk", c, d, detail="tiles",
                 args={"bytes": e})
