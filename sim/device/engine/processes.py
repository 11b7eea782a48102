"""The SimPy engine: a program's engine queues as SimPy processes on the device's
components, the readable model every faster engine replays.

Each engine queue (per core: DMA load, DMA store, matrix unit, vector unit; device-wide:
DRAM copy engine, host link h2d and d2h) is one process that runs its instructions in
program order (:func:`queue`): the program's launch once, then per instruction its
dispatch, its flags (one count of each flag it waits on, counting semaphores), a
cross-core synchronisation when it waits on a flag another core signals, its work on the
components (:func:`work`), and its signals. What an instruction does on which component
(its compute time, the DMA engine and the transfers it runs, the link transfer, the
traffic it adds to the stats) is read from its row of the program's plan, the tables of
:mod:`sim.device.engine.tables` that the array loop runs too: both engines read one
statement of it (:mod:`sim.device.engine.row_fill`), and the components' own timing
rules (``sim/device/components``) do the rest.
"""

from __future__ import annotations

import simpy

from isa import semantics
from isa.instructions import Engine, Program
from sim.device.engine import loopdefs as pl
from sim.device.engine.tables import LINKS, Tables, engine_name, instructions_of


def resources(dev) -> list:
    """The DMA engines by a plan row's ``I_RES``: the load engine of each core, the store
    engine of each core, the KV stream of each core, the copy engine."""
    return [*dev.dma_in, *dev.dma_out, *dev.kv_stream, dev.copy_engine]


def start(dev, program: Program, tb: Tables):
    """Start ``program`` (planned as ``tb``) on ``dev``'s engine queues; returns the
    process that ends when every queue is done. Waiting queues are noted in
    ``dev._blocked`` (for the deadlock report)."""
    env = dev.env
    flags = [simpy.Container(env) for _ in range(len(tb.flags))]
    rows = tb.table.tolist()
    dev.stats.launch_ps += dev.costs.launch_ps
    dev._blocked = {}
    procs = [env.process(queue(dev, q, tb, rows, flags, program))
             for q in range(len(tb.queues))]
    return env.process(_join(env, procs))


def _join(env, procs):
    if procs:
        yield env.all_of(procs)


def queue(dev, q: int, tb: Tables, rows: list, flags: list, program: Program):
    """Process of engine queue ``q``: its instructions in program order."""
    eng, core = tb.queues[q]
    block, lane = engine_name(Engine(eng), core)
    who = f"{block}.{lane}"
    env = dev.env
    rec = dev.recorder
    traced = rec.wants("ops")
    stats = dev.stats
    functional = dev.functional
    instrs = instructions_of(program)
    costs = dev.costs
    row_of, w_ptr, w_flag, s_ptr, s_flag = tb.row_of, tb.w_ptr, tb.w_flag, tb.s_ptr, tb.s_flag
    if costs.launch_ps:  # the program reaches every engine queue after its launch
        yield env.timeout(costs.launch_ps)
    for i in tb.q_items[tb.q_ptr[q]: tb.q_ptr[q + 1]].tolist():
        r = int(row_of[i])
        row = rows[r]
        if costs.dispatch_ps and row[pl.I_FLAGS] & pl.FL_DISPATCH:
            # fetch and decode, before (and overlapping) the wait for its flags
            yield env.timeout(costs.dispatch_ps)
            stats.dispatch_ps[who] += costs.dispatch_ps
        for f in w_flag[w_ptr[r]: w_ptr[r + 1]].tolist():
            flag = flags[f]
            if flag.level < 1:
                dev._blocked[who] = (i, int(tb.flags[f]))
                yield flag.get(1)
                dev._blocked.pop(who, None)
            else:
                yield flag.get(1)
        if costs.sync_ps and row[pl.I_FLAGS] & pl.FL_CROSS:
            yield env.timeout(costs.sync_ps)
            stats.sync_ps[who] += costs.sync_ps
        start_ps = env.now
        if row[pl.I_KIND] == pl.K_COMPUTE:
            if row[pl.I_DUR]:
                yield env.timeout(row[pl.I_DUR])
        else:
            yield from work(dev, row, tb)
        if functional:
            semantics.execute(instrs[i], dev.mem, program.formats)
        end = env.now
        stats.busy_ps[who] += end - start_ps
        stats.instructions += 1
        stats.ops += row[pl.I_OPS]
        if traced:
            rec.span(block, lane, instrs[i].mnemonic, start_ps, end, args={"index": i})
        for f in s_flag[s_ptr[r]: s_ptr[r + 1]].tolist():
            flags[f].put(1)


def work(dev, row: list, tb: Tables):
    """Process generator: an instruction's work on the components, from its plan row: the
    traffic it adds to the stats, then a DMA transfer, a host link transfer, or its compute
    time beside the transfers of its KV stream (an attention's K and V reads, a KV
    record's read and write)."""
    env = dev.env
    nkinds = len(dev.kind_names)
    for a in range(row[pl.I_NADD]):
        link, kind = divmod(row[pl.I_PAIR1 + 2 * a], nkinds)
        for name in LINKS[link]:
            dev.stats.add(name, dev.kind_names[kind], row[pl.I_BYTES1 + 2 * a])
    kind = row[pl.I_KIND]
    if kind == pl.K_DMA:
        yield from resources(dev)[row[pl.I_RES]].transfer(
            row[pl.I_DIR1], row[pl.I_SRC1], row[pl.I_DST1], row[pl.I_N1])
    elif kind == pl.K_LINK:
        yield from dev.link.transfer(row[pl.I_DIR1], row[pl.I_SRC1], row[pl.I_N1])
    else:  # K_PAR
        stream = resources(dev)[row[pl.I_RES]]
        parts = [env.timeout(row[pl.I_DUR])]
        for base in (pl.I_DIR1, pl.I_DIR2)[: row[pl.I_NSUB]]:
            parts.append(env.process(stream.transfer(row[base], row[base + 1], row[base + 2],
                                                     row[base + 3])))
        yield env.all_of(parts)
