"""Run a program on the array event loop (:mod:`sim.device.engine.loop`).

A program becomes its plan (``Device.plan``: the tables of :mod:`sim.device.engine.tables`,
which the SimPy engine runs too: one row per distinct instruction object, built once per
object by the device's :class:`sim.device.engine.rows.RowCache`, and one row index per
instruction; waits and signals as index lists; engine queues in the device's order;
dispatch and cross-core bits), the components' state is copied into the loop's arrays
(:func:`device_arrays`), the loop runs (summing the stats additions, busy times and ops as
it goes), and its logs are replayed in order (:mod:`sim.device.engine.replay`) into what
the SimPy processes would have changed: the stats (the same additions, so counters keep
their key order; the fixed costs of launch, dispatch and sync), the recorder (the same
calls in the same order), the components' state (DRAM channels and banks, SRAM ports, link
directions, the device's clock: :func:`write_back`) and, in functional mode, memory
(``isa.semantics`` in the order instructions ended, which is the order the processes
execute them: an instruction's bytes never influence timing).

The loop has the processes of every host link kind and DRAM model the hardware config
accepts; hardware it has none of is refused by name (:func:`unsupported`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from isa import semantics
from isa.instructions import Engine, Program
from sim.device.engine import loopdefs as pl
from sim.device.engine import tables as program_tables
from sim.device.engine.loop import new_state, run_program
from sim.device.engine.processes import resources
from sim.device.engine.replay import replay
from sim.device.engine.tables import engine_name

#: Log rows the loop gathers before it hands them over for replay (each 48 bytes): bounds
#: the memory of a traced long program. A choice of this module, not a measurement.
LOG_FLUSH_ROWS = 1 << 16
#: The host link kinds and DRAM models the loop has the processes of (every kind the
#: hardware config accepts today; a new one must be added to the loop, or is refused).
LINK_KINDS = ("pcie", "shared_dram")
DRAM_MODELS = ("efficiency", "protocol")


@dataclass(frozen=True)
class LoopResult:
    """What the loop left for the device: whether the program completed, and if not,
    ``blocked`` = {engine name: (instruction index, flag)} as the processes report it."""

    completed: bool
    blocked: dict[str, tuple[int, int]]


def unsupported(hw) -> str | None:
    """Why the array loop cannot run programs on hardware ``hw``, or None when it can:
    both DRAM models, both host link kinds and the fixed costs of dispatch, launch and
    barriers are modelled."""
    if hw.host_link.kind not in LINK_KINDS:
        return f"hardware.host_link.kind {hw.host_link.kind!r} has no model in the array loop"
    if hw.dram.model not in DRAM_MODELS:
        return f"hardware.dram.model {hw.dram.model!r} has no model in the array loop"
    return None


def device_arrays(dev) -> pl.DeviceArrays:
    """The components' state (copies: written back by :func:`write_back` once the loop has
    returned) and parameters, as the loop takes them."""
    res = resources(dev)
    dram, link, ds = dev.dram, dev.link, dev.dram.state
    return pl.DeviceArrays(
        pl.DmaArrays(np.asarray([r.outstanding for r in res], np.int64),
                     np.asarray([r.setup_ps for r in res], np.int64),
                     np.asarray([r.chunk_bytes for r in res], np.int64)),
        pl.DramArrays(dram.free_ps.copy(), dram.latency_ps, dram.cfg.interleave_bytes,
                      dram.channel_bytes_per_s, dram.protocol, dram.tck_ps, dram.params,
                      *(a.copy() for a in (ds.open_row, ds.act_ok, ds.pre_ok, ds.cas_ok,
                                           ds.faw, ds.scalars, ds.next_ref, ds.per_channel)),
                      np.zeros((dram.cfg.channels, 4), np.int64)),
        pl.SramArrays(np.stack([s.port_free_ps for s in dev.srams]),
                      dev.srams[0].port_bytes_per_s),
        pl.LinkArrays(link.free_ps.copy(), link.bytes_per_s, link.latency_ps,
                      link.chunk_bytes, link.kind),
        pl.Costs(dev.costs.launch_ps, dev.costs.dispatch_ps, dev.costs.sync_ps))


def write_back(dev, d: pl.DeviceArrays, sc: np.ndarray) -> None:
    """The components' state and the device's clock as the loop left them."""
    dram, ds = dev.dram, dev.dram.state
    if sc[pl.SC_NOW] > dev.env.now:
        dev.env.run(until=int(sc[pl.SC_NOW]))
    dram.free_ps[:] = d.dram.free
    if dram.protocol:  # the bank state
        for dst, src in zip((ds.open_row, ds.act_ok, ds.pre_ok, ds.cas_ok, ds.faw, ds.scalars,
                             ds.next_ref, ds.per_channel),
                            (d.dram.open_row, d.dram.act_ok, d.dram.pre_ok, d.dram.cas_ok,
                             d.dram.faw, d.dram.scalars, d.dram.next_ref,
                             d.dram.per_channel), strict=True):
            dst[...] = src
    dram.bytes_read += int(sc[pl.SC_DREAD])
    dram.bytes_written += int(sc[pl.SC_DWRITE])
    for c, s in enumerate(dev.srams):
        s.port_free_ps[:] = d.sram.port_free[c]
    dev.link.free_ps[:] = d.link.free


def run(dev, program: Program) -> LoopResult:
    """Runs ``program`` on ``dev`` (a device of the fast engine, whose clock nothing else
    schedules on)."""
    instrs = program_tables.instructions_of(program)
    tb = dev.plan(program)
    names = [engine_name(Engine(eng), core) for eng, core in tb.queues]
    rec = dev.recorder
    log_level = 2 if rec.wants("tiles") else 1 if rec.wants("ops") else 0
    res = resources(dev)
    arrays = device_arrays(dev)
    prog = pl.ProgramArrays(tb.table, tb.row_of, tb.w_ptr, tb.w_flag, tb.s_ptr, tb.s_flag,
                            tb.q_ptr, tb.q_items)
    state = new_state(dev.env.now, 0, len(tb.queues), len(tb.flags), len(res),
                      len(instrs), tb.pairs, log_level=log_level, keep_order=dev.functional)
    while True:  # the logs handed over in bounded batches, replayed in order
        state, nl = run_program(state, LOG_FLUSH_ROWS, prog, arrays, log_level)
        if nl:
            replay(rec, state.logs[:nl], names, instrs, res, dev.link.block)
        if not state.sc[pl.SC_PAUSED]:
            break
    sc = state.sc
    if sc[pl.SC_HS]:
        raise RuntimeError(f"program {program.name!r}: {sc[pl.SC_HS]} events left scheduled")
    write_back(dev, arrays, sc)
    _add_stats(dev, state, names)
    nd = int(sc[pl.SC_ND])
    if dev.functional:
        semantics.execute_all(instrs, state.order[:nd].tolist(), dev.mem, program.formats)
    blocked_by = {}
    if sc[pl.SC_RESULT] != pl.R_DONE:
        for q, (i, f) in enumerate(state.blocked.tolist()[: len(names)]):
            if i >= 0:
                block, lane = names[q]
                blocked_by[f"{block}.{lane}"] = (i, int(tb.flags[f]))
    return LoopResult(sc[pl.SC_RESULT] == pl.R_DONE, blocked_by)


def _add_stats(dev, state: pl.LoopState, names: list[tuple[str, str]]) -> None:
    """What the processes add to the device's stats: the launch once, the fixed costs
    per engine queue, the traffic, instructions, ops and busy times, every counter with
    the keys in the order the processes first add them."""
    st, costs, counts = dev.stats, dev.costs, state.counts
    st.launch_ps += costs.launch_ps  # once per program, as processes.start adds it
    for col, first, counter, ps in ((0, 2, st.dispatch_ps, costs.dispatch_ps),
                                    (1, 3, st.sync_ps, costs.sync_ps)):
        qs = np.flatnonzero(counts[: len(names), first] >= 0)
        for q in qs[np.argsort(counts[qs, first])].tolist():
            block, lane = names[q]
            counter[f"{block}.{lane}"] += int(counts[q, col]) * ps
    # the additions the processes make when an instruction's work begins, summed per
    # (link, kind) in the order each pair first occurs: every counter then gets the same
    # keys in the same order and the same totals (busy time likewise per engine queue)
    nkinds = len(dev.kind_names)
    pair_first, pair_bytes = state.pair_first, state.pair_bytes
    seen = np.flatnonzero(pair_first >= 0)
    for pair in seen[np.argsort(pair_first[seen])].tolist():
        link_id, kind_id = divmod(pair, nkinds)
        for name in program_tables.LINKS[link_id]:
            st.add(name, dev.kind_names[kind_id], int(pair_bytes[pair]))
    st.instructions += int(state.sc[pl.SC_ND])
    st.ops += int(state.sc[pl.SC_OPS])
    qs = np.flatnonzero(counts[: len(names), 5] >= 0)
    for q in qs[np.argsort(counts[qs, 5])].tolist():
        block, lane = names[q]
        st.busy_ps[f"{block}.{lane}"] += int(counts[q, 4])
