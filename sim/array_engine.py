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
from isa.instructions import (
    PER_CORE_ENGINES,
    Attn,
    DmaCopy,
    DmaLoad,
    DmaStore,
    Engine,
    HostRead,
    HostWrite,
    KvRead,
    KvWrite,
    Program,
)
from sim.components import kernel
from sim.components import programloop as pl

_DIRECTIONS = ("load", "store", "copy", "read", "write")


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
    table = np.zeros((n, pl.I_FIELDS), np.int64)
    waits: list[int] = []
    w_ptr = np.zeros(n + 1, np.int64)
    signals: list[int] = []
    s_ptr = np.zeros(n + 1, np.int64)
    flag_ids: dict[int, int] = {}
    adds: list[tuple | None] = [None] * n
    ops = np.zeros(n, np.int64)
    queues: dict[tuple[Engine, int], list[int]] = {}
    streams: list[tuple[int, int]] = []  # (DRAM base address, total bytes) of each transfer
    prefix = "pcie"
    kind_of = dev.kind_of
    cores = dev.cores
    for i, ins in enumerate(instrs):
        eng = ins.engine
        core = ins.core if eng in PER_CORE_ENGINES else 0
        queues.setdefault((eng, core), []).append(i)
        for f in ins.wait:
            waits.append(flag_ids.setdefault(f, len(flag_ids)))
        w_ptr[i + 1] = len(waits)
        for f in ins.signal:
            signals.append(flag_ids.setdefault(f, len(flag_ids)))
        s_ptr[i + 1] = len(signals)
        ops[i] = ins.ops()
        row = table[i]
        t = type(ins)
        if t is DmaLoad or t is DmaStore or t is DmaCopy:
            row[pl.I_KIND] = pl.K_DMA
            row[pl.I_CORE] = ins.core
            if t is DmaCopy:
                total = ins.nbytes
                row[pl.I_RES] = 3 * n_cores
                row[pl.I_DIR1] = pl.D_COPY
                adds[i] = (("dram_read", kind_of(ins.src), total),
                           ("dram_write", kind_of(ins.dst), total))
                streams.append((ins.src, total))
                streams.append((ins.dst, total))
            elif t is DmaLoad:
                total = ins.total_bytes
                row[pl.I_RES] = ins.core
                row[pl.I_DIR1] = pl.D_LOAD
                adds[i] = (("dram_read", kind_of(ins.src), total),)
                streams.append((ins.src, total))
            else:
                total = ins.total_bytes
                row[pl.I_RES] = n_cores + ins.core
                row[pl.I_DIR1] = pl.D_STORE
                adds[i] = (("dram_write", kind_of(ins.dst), total),)
                streams.append((ins.dst, total))
            row[pl.I_SRC1] = ins.src
            row[pl.I_DST1] = ins.dst
            row[pl.I_N1] = total
        elif t is HostWrite or t is HostRead:
            row[pl.I_KIND] = pl.K_LINK
            row[pl.I_N1] = ins.nbytes
            if t is HostWrite:
                row[pl.I_DIR1] = 0
                kind = kind_of(ins.dst)
                adds[i] = ((f"{prefix}_h2d", kind, ins.nbytes), ("dram_write", kind, ins.nbytes))
            else:
                row[pl.I_DIR1] = 1
                kind = kind_of(ins.src)
                adds[i] = ((f"{prefix}_d2h", kind, ins.nbytes), ("dram_read", kind, ins.nbytes))
        elif t is Attn or t is KvWrite or t is KvRead:
            row[pl.I_KIND] = pl.K_PAR
            row[pl.I_CORE] = ins.core
            row[pl.I_RES] = 2 * n_cores + ins.core
            row[pl.I_DUR] = cores[ins.core].duration_ps(ins, formats)
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
            row[pl.I_NSUB] = len(subs)
            for s, (d, src, dst, nb) in enumerate(subs):
                base_col = pl.I_DIR1 if s == 0 else pl.I_DIR2
                row[base_col] = d
                row[base_col + 1] = src
                row[base_col + 2] = dst
                row[base_col + 3] = nb
                streams.append((src if d == pl.D_READ else dst, nb))
        else:
            # compute-only (and Nop on any engine): one timeout of the core's duration
            row[pl.I_KIND] = pl.K_COMPUTE
            if eng in PER_CORE_ENGINES:
                row[pl.I_DUR] = cores[core].duration_ps(ins, formats)
            else:
                row[pl.I_DUR] = cores[ins.core].duration_ps(ins, formats)
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
    names = [engine_name(eng, core) for eng, core in keys_sorted]

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

    # stats: the same additions in the same order
    st = dev.stats
    for i in starts[:nst].tolist():
        for link_name, kind, nbytes in adds[i]:
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
