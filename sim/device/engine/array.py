"""Run a program on the array event loop (:mod:`sim.device.engine.loop`).

A program becomes tables (:mod:`sim.device.engine.tables`: one row per distinct instruction
object, built once per object by the device's :class:`sim.device.engine.rows.RowCache`, and
one row index per instruction; waits and signals as index lists; engine queues in the
device's order; dispatch and cross-core bits), the DRAM timing of every distinct chunk is
planned as ``Dram`` plans it in the efficiency model (the protocol model runs in the loop
on the DRAM's own bank-state arrays, which it updates in place), the loop runs (summing
the stats additions, busy times and ops as it goes), and its logs are replayed in order
into what the generator processes would have changed: the stats (the same additions, so
counters keep their key order; the fixed costs of launch, dispatch and sync), the
recorder (the same calls in the same order), the components' state (DRAM
channels, SRAM ports, link directions, the device's clock) and, in
functional mode, memory (``isa.semantics`` in the order instructions ended, which is the
order the processes execute them: an instruction's bytes never influence timing).

:func:`eligible` says when a device can use it; otherwise the device runs the generator
processes on the event kernel (the same timeline, more slowly).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter

import numpy as np

from isa import semantics
from isa.instructions import Engine, Program
from sim.device.components.dma import DIRECTIONS as _DIRECTIONS
from sim.device.engine import loopdefs as pl
from sim.device.engine import tables as program_tables
from sim.device.engine.loop import new_state, run_program
from sim.device.engine.processes import resources
from sim.device.engine.tables import engine_name
from traces.recorder import Span

#: Log rows the loop gathers before it hands them over for replay (each 48 bytes): bounds
#: the memory of a traced long program. A choice of this module, not a measurement.
LOG_FLUSH_ROWS = 1 << 16
#: Log rows below which a batch whose order matters is replayed one call per row rather
#: than in halves (a choice of this module: halving costs a check per half).
REPLAY_EACH_ROWS = 1 << 10
#: ``Span(*fields)`` from a tuple of all six fields, without the generated ``__new__``'s
#: Python frame (``tuple.__new__(Span, fields)``)
_new_span = tuple.__new__
_MNEMONIC = attrgetter("mnemonic")



@dataclass(frozen=True)
class LoopResult:
    """What the loop left for the device: whether the program completed, and if not,
    ``blocked`` = {engine name: (instruction index, flag)} as the processes report it."""

    completed: bool
    blocked: dict[str, tuple[int, int]]


#: The host link kinds and DRAM models the loop has the processes of (every kind the
#: hardware config accepts today; a new one must be added to the loop, or is refused).
LINK_KINDS = ("pcie", "shared_dram")
DRAM_MODELS = ("efficiency", "protocol")


def unsupported(hw) -> str | None:
    """Why the array loop cannot run programs on hardware ``hw``, or None when it can:
    both DRAM models, both host link kinds and the fixed costs of dispatch, launch and
    barriers are modelled."""
    if hw.host_link.kind not in LINK_KINDS:
        return f"hardware.host_link.kind {hw.host_link.kind!r} has no model in the array loop"
    if hw.dram.model not in DRAM_MODELS:
        return f"hardware.dram.model {hw.dram.model!r} has no model in the array loop"
    return None


def run(dev, program: Program) -> LoopResult:
    """Runs ``program`` on ``dev`` (a device of the fast engine, whose clock nothing else
    schedules on)."""
    instrs = program_tables.instructions_of(program)
    tb = dev.plan(program)
    names = [engine_name(Engine(eng), core) for eng, core in tb.queues]
    dram = dev.dram
    res = resources(dev)
    res_cap = np.asarray([r.outstanding for r in res], np.int64)
    res_setup = np.asarray([r.setup_ps for r in res], np.int64)
    res_chunk = np.asarray([r.chunk_bytes for r in res], np.int64)
    # the components' state, copied in and written back once the loop has returned
    dram_free = dram.free_ps.copy()
    port_free = np.stack([s.port_free_ps for s in dev.srams])
    link = dev.link
    link_free = link.free_ps.copy()
    rec = dev.recorder
    log_level = 2 if rec.wants("tiles") else 1 if rec.wants("ops") else 0
    env = dev.env
    ds = dram.state
    banks = [a.copy() for a in (ds.open_row, ds.act_ok, ds.pre_ok, ds.cas_ok, ds.faw,
                                ds.scalars, ds.next_ref, ds.per_channel)]
    spans = np.zeros((dram.cfg.channels, 4), np.int64)
    costs = dev.costs

    state = new_state(env.now, 0, len(tb.queues), len(tb.flags), len(res),
                      len(instrs), tb.pairs, log_level=log_level, keep_order=dev.functional)
    while True:  # the logs handed over in bounded batches, replayed in order
        state, nl = run_program(
            state, LOG_FLUSH_ROWS, tb.table, tb.row_of, tb.w_ptr, tb.w_flag, tb.s_ptr,
            tb.s_flag, tb.q_ptr, tb.q_items, res_cap, res_setup, res_chunk, dram_free,
            dram.latency_ps, dram.cfg.interleave_bytes, dram.channel_bytes_per_s, spans,
            port_free, dev.srams[0].port_bytes_per_s, link_free, link.bytes_per_s,
            link.latency_ps, link.chunk_bytes, link.kind, log_level, dram.protocol, dram.params,
            *banks, dram.tck_ps, costs.launch_ps, costs.dispatch_ps, costs.sync_ps)
        if nl:
            _replay(rec, state[pl.ST_LOGS][:nl], names, instrs, res, link.block)
        if not state[pl.ST_SC][pl.SC_PAUSED]:
            break
    sc = state[pl.ST_SC]
    result, now, pending = (int(sc[k]) for k in (pl.SC_RESULT, pl.SC_NOW, pl.SC_HS))
    d_read, d_written, nd, ops = (int(sc[k]) for k in (pl.SC_DREAD, pl.SC_DWRITE, pl.SC_ND,
                                                         pl.SC_OPS))
    order, pair_bytes, pair_first, blocked, counts = (state[k] for k in (
        pl.ST_ORDER, pl.ST_PAIR_BYTES, pl.ST_PAIR_FIRST, pl.ST_BLOCKED, pl.ST_COUNTS))
    if pending:
        raise RuntimeError(f"program {program.name!r}: {pending} events left scheduled")

    # the components' state and the device's clock
    if now > env.now:
        env.run(until=int(now))
    dram.free_ps[:] = dram_free
    if dram.protocol:  # the bank state
        for dst, src in zip((ds.open_row, ds.act_ok, ds.pre_ok, ds.cas_ok, ds.faw, ds.scalars,
                             ds.next_ref, ds.per_channel), banks, strict=True):
            dst[...] = src
    dram.bytes_read += int(d_read)
    dram.bytes_written += int(d_written)
    for c, s in enumerate(dev.srams):
        s.port_free_ps[:] = port_free[c]
    link.free_ps[:] = link_free

    st = dev.stats
    st.launch_ps += costs.launch_ps  # once per program, as Device.start adds it
    # the fixed costs per engine queue, keys in the order the processes first add them
    for col, first, counter, ps in ((0, 2, st.dispatch_ps, costs.dispatch_ps),
                                    (1, 3, st.sync_ps, costs.sync_ps)):
        qs = np.flatnonzero(counts[: len(names), first] >= 0)
        for q in qs[np.argsort(counts[qs, first])].tolist():
            block, lane = names[q]
            counter[f"{block}.{lane}"] += int(counts[q, col]) * ps
    # the additions the processes make when an instruction's timing begins, summed per
    # (link, kind) in the order each pair first occurs: every counter then gets the same
    # keys in the same order and the same totals (busy time likewise per engine queue)
    nkinds = len(dev.kind_names)
    seen = np.flatnonzero(pair_first >= 0)
    for pair in seen[np.argsort(pair_first[seen])].tolist():
        link_id, kind_id = divmod(pair, nkinds)
        for name in program_tables.LINKS[link_id]:
            st.add(name, dev.kind_names[kind_id], int(pair_bytes[pair]))
    st.instructions += int(nd)
    st.ops += int(ops)
    qs = np.flatnonzero(counts[: len(names), 5] >= 0)
    for q in qs[np.argsort(counts[qs, 5])].tolist():
        block, lane = names[q]
        st.busy_ps[f"{block}.{lane}"] += int(counts[q, 4])

    if dev.functional:
        mem = dev.mem
        for i in order[:nd].tolist():
            semantics.execute(instrs[i], mem, program.formats)

    blocked_by = {}
    if result != pl.R_DONE:
        for q, (i, f) in enumerate(blocked.tolist()[: len(names)]):
            if i >= 0:
                block, lane = names[q]
                blocked_by[f"{block}.{lane}"] = (i, int(tb.flags[f]))
    return LoopResult(result == pl.R_DONE, blocked_by)


def _replay(rec, logs: np.ndarray, names, instrs, res, link_block: str) -> None:
    """The recorder's calls the loop logged, in order. When nothing can be dropped at the
    event limit (so order cannot matter to it), the bytes moved go in one batch
    (``Recorder.moved_many``: the same bins) and the spans at once (level ``ops``) or one
    call each; otherwise each half of the rows in turn, the same way."""
    code = logs[:, 0]
    is_move = (code == pl.LOG_DRAM) | (code == pl.LOG_LINK)
    moves = np.flatnonzero(is_move)
    if not rec.can_take(len(logs), logs[moves, 2], logs[moves, 3]):
        # order matters somewhere in the batch (the event limit): its halves in turn, each
        # replayed at once where its order cannot matter, down to one call per row
        if len(logs) <= REPLAY_EACH_ROWS:
            _replay_each(rec, logs.tolist(), names, instrs, res, link_block)
        else:
            half = len(logs) // 2
            _replay(rec, logs[:half], names, instrs, res, link_block)
            _replay(rec, logs[half:], names, instrs, res, link_block)
        return
    tiles = rec.wants("tiles")
    span = rec.span
    if not tiles:  # the rows of detail "tiles" are no-ops: the instruction spans at once
        _add_instruction_spans(rec, logs[code == pl.LOG_INS], names, instrs)
        rows = logs[:0]
    else:
        rows = logs
    if rec.full():
        # full and staying full (``can_take``): every span is dropped, one count each; of
        # the rows only instruction spans are of detail "ops", the rest are "tiles"
        ins = int((rows[:, 0] == pl.LOG_INS).sum())
        rec.drop((ins if rec.wants("ops") else 0) + (len(rows) - ins if tiles else 0))
        rows = rows[:0]
    for code_, a, b, c, d, e in rows.tolist():
        if code_ == pl.LOG_INS:
            block, lane = names[a]
            span(block, lane, instrs[b].mnemonic, c, d, args={"index": b})
        elif code_ == pl.LOG_DRAM:
            span("dram", f"ch{a}", "write" if e else "read", b, c, detail="tiles",
                 args={"bytes": d})
        elif code_ == pl.LOG_LINK:
            span(link_block, "h2d" if a == 0 else "d2h", "chunk", b, c, detail="tiles",
                 args={"bytes": d})
        else:
            r = res[a]
            span(r.block, r.lane, f"{_DIRECTIONS[b]} chunk", c, d, detail="tiles",
                 args={"bytes": e})
    if not len(moves):
        return
    m = logs[moves]
    dram = m[:, 0] == pl.LOG_DRAM
    channels = int(m[dram, 1].max(initial=-1)) + 1
    tracks = [("dram", f"ch{c}") for c in range(channels)] + [(link_block, "h2d"),
                                                               (link_block, "d2h")]
    track_of = np.where(dram, m[:, 1], channels + m[:, 1])
    rec.moved_many(tracks, track_of, m[:, 2], m[:, 3], m[:, 4])


def _add_instruction_spans(rec, rows: np.ndarray, names, instrs) -> None:
    """``rec.span`` of each instruction row in turn, in one ``Recorder.add_spans``: the
    spans built in C-level maps, only as many as the recorder has room for (the rest
    counted as dropped, as those calls would)."""
    if not rec.wants("ops") or not len(rows):
        return
    total = len(rows)
    rows = rows[:min(total, rec.room())]
    queue, index = rows[:, 1], rows[:, 2].tolist()
    blocks = np.array([b for b, _ in names], object)[queue].tolist()
    lanes = np.array([lane for _, lane in names], object)[queue].tolist()
    mnemonics = list(map(_MNEMONIC, map(instrs.__getitem__, index)))
    args = [{"index": i} for i in index]
    spans = list(map(_new_span, repeat(Span), zip(blocks, lanes, mnemonics,
                                                   rows[:, 3].tolist(), rows[:, 4].tolist(),
                                                   args, strict=True)))
    rec.add_spans(spans)
    if total > len(rows):
        rec.drop(total - len(rows))


def _replay_each(rec, logs: list[list[int]], names, instrs, res, link_block: str) -> None:
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
