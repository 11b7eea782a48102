"""A whole program's event loop in Numba, with SimPy's exact event order.

The SimPy engine (:mod:`sim.device.engine.processes`) runs the device's processes (one
generator per engine queue, per multi-chunk DMA chunk, per attention stream) at Python
speed. This module runs the *same* processes written out as explicit state machines over
arrays, so one program costs a few machine instructions per event instead of a few Python
calls. The timing itself is the components' rules (``sim/device/components``), which
the state machines call as the processes do.

What is kept exactly is what makes the two timelines identical: every event SimPy
schedules is scheduled here too, at the same time, with the same priority and the next
insertion id, and processed in ``(time, priority, id)`` order; resources (DMA slots),
flags (counting semaphores), DRAM channel calendars, SRAM ports and link directions are
updated at the same points of the same processes. The state machines mirror, step by step:

- ``processes.queue`` (waits, the instruction's work, signals) and the program's join;
- ``DmaEngine.transfer`` / ``DmaEngine._chunk``; ``Dram.access``;
- ``HostLink.transfer`` (both kinds);
- SimPy's ``Resource``, ``Container``, ``AllOf`` and process start/end events
  (:mod:`sim.device.engine.loopprocs`).

The loop does not touch memory bytes or the recorder: it returns logs (instruction
starts and ends, DRAM bursts, link chunks, DMA chunks) that the caller replays, in order,
into the stats, the functional semantics and the recorder.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sim.device.components.dma import chunk_access, chunk_bytes_at, one_chunk, uses_port
from sim.device.components.link import PCIE, link_chunk, link_chunk_done
from sim.device.components.sram import reserve_port
from sim.device.engine import loopdefs as lp
from sim.device.engine import loopprocs as kp
from sim.device.engine.loopprocs import new_state

__all__ = ["new_state", "run_program"]


@njit(cache=True, error_model="numpy")
def run_program(  # noqa: C901 - one state machine per process kind, kept together
    state: tuple, flush_at: int, ins: np.ndarray, row_of: np.ndarray, w_ptr: np.ndarray,
    w_flag: np.ndarray,
    s_ptr: np.ndarray, s_flag: np.ndarray, q_ptr: np.ndarray, q_items: np.ndarray,
    res_cap: np.ndarray, res_setup: np.ndarray, res_chunk: np.ndarray,
    dram_free: np.ndarray, dram_lat: int, granule: int, ch_bps: float, spans: np.ndarray,
    port_free: np.ndarray, port_bps: float, link_free: np.ndarray,
    link_bps: np.ndarray, link_lat: int, link_chunk_bytes: int, link_kind: int,
    log_level: int,
    protocol: bool, d_params: np.ndarray, d_open: np.ndarray, d_act: np.ndarray,
    d_pre: np.ndarray, d_cas: np.ndarray, d_faw: np.ndarray, d_sc: np.ndarray,
    d_ref: np.ndarray, d_per: np.ndarray, tck_ps: float, launch_ps: int, dispatch_ps: int,
    sync_ps: int, direct: bool = True,
):
    """Runs one program from the ``state`` of :func:`new_state` (time, insertion id, the
    processes, flags, resources, results), which it updates, until it is done or, with
    ``flush_at > 0``, until its logs hold at least ``flush_at`` rows between two events:
    the caller replays them and calls again with the state returned (logs start afresh).
    Instruction ``i`` is row ``row_of[i]`` of ``ins`` (its waits and signals too); updates
    ``dram_free``, ``port_free`` and ``link_free`` in place. With ``protocol`` the DRAM
    chunks are timed by :func:`sim.device.dram.timing.chunk_channels_ck` over the channel state
    arrays ``d_*`` (updated in place, as ``Dram.chunk_plan`` does), else by the plans.
    ``launch_ps``, ``dispatch_ps`` and ``sync_ps`` are the fixed costs ``Device._engine``
    pays (0: none). With ``direct`` (the default) the next event is taken straight from
    where it was appended when it is the smallest (:func:`loopdefs.hnext`); false sifts
    and pops every event (the same timeline: tests/sim/test_engines.py).

    Returns ``(state, nlogs)``: the state as :func:`new_state` lays it out, the first
    ``nlogs`` rows of its logs the recorder's reports in order.
    """
    nq = q_ptr.shape[0] - 1
    (sc, heap, P, level, f_head, f_tail, users, r_head, r_tail, order, pair_bytes,
     pair_first, logs, blocked, counts) = state
    want_order = order.shape[0] > 0
    (now, eid, hs, np_used, free_head, nd, ops, n_pairs_seen, dram_read, dram_written,
     n_first_disp, n_first_sync, n_first_done, result) = kp.load_scalars(sc)
    nl = 0

    if not sc[lp.SC_STARTED]:
        sc[lp.SC_STARTED] = 1
        heap, hs, eid, np_used = kp.start_processes(heap, hs, P, np_used, now, eid, nq, q_ptr)

    paused = 0
    # the heap's rows before ``ordered`` are in heap order; pushes append after them
    lp.hsift(heap, 0, hs)
    ordered = hs
    pending = -1  # a process stopped between two steps for room in the arrays
    heap_extra = 0  # the rows it needs besides a row per process and four
    log_room = 4 + dram_free.shape[0]  # a step logs one row, a DRAM access one per channel
    ended = False
    # The arrays grow here, outside the event loop: the event loop breaks out to grow and
    # re-enters, so it never rebinds ``heap``, ``P`` or ``logs`` (code that may rebind an
    # array pays an atomic reference count increment and decrement each time it passes
    # there: once per event at the event loop's head when the growth was inside it).
    while not ended:
        # The heap keeps a row for each process a step or a callback may resume, besides
        # the few rows a step pushes itself (the waiter queues' helpers do not grow it).
        if pending >= 0 or hs + np_used + 4 > heap.shape[0]:
            heap = lp.grow_to(heap, hs + np_used + 4 + heap_extra)
            heap_extra = 0
            P = lp.grow_to(P, np_used + 4)
            logs = lp.grow_to(logs, nl + log_room)
        while True:
            if pending >= 0:
                # run the stopped process on from the step it stopped at (its state is in
                # P; the same event goes on)
                p = pending
                pending = -1
            else:
                if hs + np_used + 4 > heap.shape[0]:
                    break  # to grow
                if hs == 0:
                    ended = True
                    break
                if flush_at > 0 and nl >= flush_at:
                    paused = 1
                    ended = True
                    break
                hs, ordered = lp.hnext(heap, ordered, hs, direct)
                now = heap[hs, 0]
                kind = heap[hs, 3]
                arg = heap[hs, 4]
                if kind == lp.CB_GRANT:
                    hs, eid = kp.grant(heap, hs, eid, now, arg, users, res_cap, r_head, r_tail,
                                       P)
                    continue
                if kind == lp.CB_SERVE:
                    hs, eid = kp.serve_flag(heap, hs, eid, now, arg, level, f_head, f_tail, P)
                    continue
                if kind == lp.CB_END or kind == lp.CB_CHECK:
                    p = arg
                    if kind == lp.CB_END:
                        if P[p, lp.F_TYPE] == lp.P_JOIN:
                            result = lp.R_DONE
                            ended = True
                            break
                        parent = P[p, lp.F_PARENT]
                        # the process's record is free again
                        P[p, lp.F_NEXT] = free_head
                        free_head = p
                    else:
                        parent = p
                    P[parent, lp.F_AO_COUNT] += 1
                    if (P[parent, lp.F_AO_ON] == 1 and P[parent, lp.F_AO_TRIG] == 0
                            and P[parent, lp.F_AO_COUNT] == P[parent, lp.F_AO_N]):
                        P[parent, lp.F_AO_TRIG] = 1
                        hs = lp.hpush(heap, hs, now, lp.NORMAL, eid, lp.CB_RESUME, parent)
                        eid += 1
                    continue

                p = arg  # lp.CB_RESUME
            # run process p until it waits again or returns
            while True:
                if (hs + np_used + 4 > heap.shape[0] or np_used + 4 > P.shape[0]
                        or nl + log_room > logs.shape[0]):
                    pending = p  # stop for room before this step
                    break
                st = P[p, lp.F_STATE]
                # ---------------- engine: Device._engine --------------------------------------
                if st == lp.S_E_LAUNCH:
                    P[p, lp.F_STATE] = lp.S_E_NEXT
                    if launch_ps:
                        hs = lp.hpush(heap, hs, now + launch_ps, lp.NORMAL, eid, lp.CB_RESUME, p)
                        eid += 1
                        break
                    st = lp.S_E_NEXT
                if st == lp.S_E_NEXT:
                    q = P[p, lp.F_Q]
                    if P[p, lp.F_POS] >= q_ptr[q + 1]:
                        st = lp.S_END
                    else:
                        i = q_items[P[p, lp.F_POS]]
                        if dispatch_ps and ins[row_of[i], lp.I_FLAGS] & lp.FL_DISPATCH:
                            P[p, lp.F_STATE] = lp.S_E_DISPATCHED
                            hs = lp.hpush(heap, hs, now + dispatch_ps, lp.NORMAL, eid,
                                          lp.CB_RESUME, p)
                            eid += 1
                            break
                        P[p, lp.F_WK] = 0
                        P[p, lp.F_STATE] = lp.S_E_WAIT
                        continue
                if st == lp.S_E_DISPATCHED:
                    q = P[p, lp.F_Q]
                    if counts[q, 2] < 0:
                        counts[q, 2] = n_first_disp
                        n_first_disp += 1
                    counts[q, 0] += 1
                    P[p, lp.F_WK] = 0
                    P[p, lp.F_STATE] = lp.S_E_WAIT
                    continue
                if st == lp.S_E_RESUMED_WAIT:
                    blocked[P[p, lp.F_Q], 0] = -1
                    blocked[P[p, lp.F_Q], 1] = -1
                    P[p, lp.F_STATE] = lp.S_E_WAIT
                    continue
                if st == lp.S_E_WAIT:
                    i = q_items[P[p, lp.F_POS]]
                    ri = row_of[i]
                    k = w_ptr[ri] + P[p, lp.F_WK]
                    if k < w_ptr[ri + 1]:
                        f = w_flag[k]
                        P[p, lp.F_WK] += 1
                        if level[f] < 1:
                            blocked[P[p, lp.F_Q], 0] = i
                            blocked[P[p, lp.F_Q], 1] = f
                            P[p, lp.F_STATE] = lp.S_E_RESUMED_WAIT
                        else:
                            P[p, lp.F_STATE] = lp.S_E_WAIT
                        # Container.get
                        if level[f] >= 1 and f_head[f] < 0:
                            level[f] -= 1
                            hs = lp.hpush(heap, hs, now, lp.NORMAL, eid, lp.CB_RESUME, p)
                            eid += 1
                        else:
                            kp.enqueue(P, f_head, f_tail, f, p)
                            hs, eid = kp.serve_flag(heap, hs, eid, now, f, level, f_head, f_tail,
                                                    P)
                        break
                    if sync_ps and ins[ri, lp.I_FLAGS] & lp.FL_CROSS:
                        P[p, lp.F_STATE] = lp.S_E_SYNCED
                        hs = lp.hpush(heap, hs, now + sync_ps, lp.NORMAL, eid, lp.CB_RESUME, p)
                        eid += 1
                        break
                    st = lp.S_E_TIMING
                if st == lp.S_E_SYNCED:
                    q = P[p, lp.F_Q]
                    if counts[q, 3] < 0:
                        counts[q, 3] = n_first_sync
                        n_first_sync += 1
                    counts[q, 1] += 1
                    st = lp.S_E_TIMING
                if st == lp.S_E_TIMING:
                    i = q_items[P[p, lp.F_POS]]
                    ri = row_of[i]
                    P[p, lp.F_ISTART] = now
                    ik = ins[ri, lp.I_KIND]
                    if ik == lp.K_COMPUTE:
                        P[p, lp.F_STATE] = lp.S_E_FINISH
                        d = ins[ri, lp.I_DUR]
                        if d:
                            hs = lp.hpush(heap, hs, now + d, lp.NORMAL, eid, lp.CB_RESUME, p)
                            eid += 1
                            break
                        continue
                    # the stats additions, made as the instruction's timing begins
                    for a in range(ins[ri, lp.I_NADD]):
                        pr = ins[ri, lp.I_PAIR1 + 2 * a]
                        if pair_first[pr] < 0:
                            pair_first[pr] = n_pairs_seen
                            n_pairs_seen += 1
                        pair_bytes[pr] += ins[ri, lp.I_BYTES1 + 2 * a]
                    if ik == lp.K_DMA:
                        kp.set_transfer(P, p, ins, ri, lp.I_DIR1)
                        P[p, lp.F_T_RET] = lp.S_E_FINISH
                        P[p, lp.F_STATE] = lp.S_T_START
                        continue
                    if ik == lp.K_LINK:
                        P[p, lp.F_L_DIR] = ins[ri, lp.I_DIR1]
                        P[p, lp.F_L_ADDR] = ins[ri, lp.I_SRC1]
                        P[p, lp.F_L_N] = ins[ri, lp.I_N1]
                        P[p, lp.F_L_RET] = lp.S_E_FINISH
                        P[p, lp.F_STATE] = lp.S_L_START
                        continue
                    # K_PAR: all_of([timeout(dur), process(transfer 1), process(transfer 2)])
                    nsub = ins[ri, lp.I_NSUB]
                    P[p, lp.F_AO_COUNT] = 0
                    P[p, lp.F_AO_TRIG] = 0
                    P[p, lp.F_AO_ON] = 0
                    hs = lp.hpush(heap, hs, now + ins[ri, lp.I_DUR], lp.NORMAL, eid, lp.CB_CHECK,
                                  p)
                    eid += 1
                    for s in range(nsub):
                        c, free_head, np_used = kp.new_process(P, free_head, np_used)
                        P[c, lp.F_TYPE] = lp.P_XFER
                        P[c, lp.F_PARENT] = p
                        P[c, lp.F_STATE] = lp.S_T_START
                        P[c, lp.F_T_RET] = lp.S_XFER_RET
                        kp.set_transfer(P, c, ins, ri, lp.I_DIR1 if s == 0 else lp.I_DIR2)
                        hs = lp.hpush(heap, hs, now, lp.URGENT, eid, lp.CB_RESUME, c)
                        eid += 1
                    P[p, lp.F_AO_N] = 1 + nsub
                    P[p, lp.F_AO_ON] = 1
                    P[p, lp.F_STATE] = lp.S_E_FINISH
                    break
                if st == lp.S_E_FINISH:
                    i = q_items[P[p, lp.F_POS]]
                    ri = row_of[i]
                    nsig = s_ptr[ri + 1] - s_ptr[ri]
                    if hs + np_used + 4 + nsig > heap.shape[0]:
                        heap_extra = nsig  # stop for room for its signals before this step
                        pending = p
                        break
                    if want_order:
                        order[nd] = i
                    nd += 1
                    ops += ins[ri, lp.I_OPS]
                    q = P[p, lp.F_Q]
                    if counts[q, 5] < 0:
                        counts[q, 5] = n_first_done
                        n_first_done += 1
                    counts[q, 4] += now - P[p, lp.F_ISTART]
                    if log_level >= 1:
                        nl = lp.log_row(logs, nl, lp.LOG_INS, q, i, P[p, lp.F_ISTART], now, 0)
                    for k in range(s_ptr[ri], s_ptr[ri + 1]):
                        f = s_flag[k]
                        level[f] += 1
                        hs = lp.hpush(heap, hs, now, lp.NORMAL, eid, lp.CB_SERVE, f)
                        eid += 1
                    P[p, lp.F_POS] += 1
                    P[p, lp.F_STATE] = lp.S_E_NEXT
                    continue
                # ---------------- join: Device._join ---------------------------------------------
                if st == lp.S_JOIN_INIT:
                    if nq == 0:
                        st = lp.S_END
                    else:
                        P[p, lp.F_AO_N] = nq
                        P[p, lp.F_AO_ON] = 1
                        if P[p, lp.F_AO_COUNT] == nq:
                            P[p, lp.F_AO_TRIG] = 1
                            hs = lp.hpush(heap, hs, now, lp.NORMAL, eid, lp.CB_RESUME, p)
                            eid += 1
                        P[p, lp.F_STATE] = lp.S_END
                        break
                # ---------------- DmaEngine.transfer ---------------------------------------------
                if st == lp.S_T_START:
                    r = P[p, lp.F_T_RES]
                    if res_setup[r]:
                        P[p, lp.F_STATE] = lp.S_T_SETUP_DONE
                        hs = lp.hpush(heap, hs, now + res_setup[r], lp.NORMAL, eid, lp.CB_RESUME, p)
                        eid += 1
                        break
                    st = lp.S_T_SETUP_DONE
                if st == lp.S_T_SETUP_DONE or st == lp.S_T_MULTI_GOT:
                    r = P[p, lp.F_T_RES]
                    total = P[p, lp.F_T_N]
                    chunk = res_chunk[r]
                    if st == lp.S_T_SETUP_DONE:
                        if one_chunk(total, chunk):
                            P[p, lp.F_STATE] = lp.S_T_SINGLE_GOT
                        else:
                            P[p, lp.F_T_OFF] = 0
                            P[p, lp.F_AO_COUNT] = 0
                            P[p, lp.F_AO_TRIG] = 0
                            P[p, lp.F_AO_ON] = 0
                            P[p, lp.F_STATE] = lp.S_T_MULTI_GOT
                    else:
                        # a slot is ours: start the chunk at the current offset in its process
                        off = P[p, lp.F_T_OFF]
                        n = chunk_bytes_at(off, total, chunk)
                        c, free_head, np_used = kp.new_process(P, free_head, np_used)
                        P[c, lp.F_TYPE] = lp.P_CHUNK
                        P[c, lp.F_PARENT] = p
                        P[c, lp.F_STATE] = lp.S_C_START
                        P[c, lp.F_C_RET] = lp.S_CHUNK_RET
                        P[c, lp.F_T_RES] = r
                        P[c, lp.F_CORE] = P[p, lp.F_CORE]
                        P[c, lp.F_C_DIR] = P[p, lp.F_T_DIR]
                        P[c, lp.F_C_SRC] = P[p, lp.F_T_SRC] + off
                        P[c, lp.F_C_DST] = P[p, lp.F_T_DST] + off
                        P[c, lp.F_C_N] = n
                        hs = lp.hpush(heap, hs, now, lp.URGENT, eid, lp.CB_RESUME, c)
                        eid += 1
                        off += chunk
                        P[p, lp.F_T_OFF] = off
                        if off >= total:
                            nchunks = (total + chunk - 1) // chunk
                            P[p, lp.F_AO_N] = nchunks
                            P[p, lp.F_AO_ON] = 1
                            if P[p, lp.F_AO_COUNT] == nchunks:
                                P[p, lp.F_AO_TRIG] = 1
                                hs = lp.hpush(heap, hs, now, lp.NORMAL, eid, lp.CB_RESUME, p)
                                eid += 1
                            P[p, lp.F_STATE] = lp.S_T_DONE
                            break
                    # Resource.request, then wait for it
                    if r_head[r] < 0 and users[r] < res_cap[r]:
                        users[r] += 1
                        hs = lp.hpush(heap, hs, now, lp.NORMAL, eid, lp.CB_RESUME, p)
                        eid += 1
                    else:
                        kp.enqueue(P, r_head, r_tail, r, p)
                        hs, eid = kp.grant(heap, hs, eid, now, r, users, res_cap, r_head, r_tail,
                                           P)
                    break
                if st == lp.S_T_SINGLE_GOT:
                    P[p, lp.F_C_DIR] = P[p, lp.F_T_DIR]
                    P[p, lp.F_C_SRC] = P[p, lp.F_T_SRC]
                    P[p, lp.F_C_DST] = P[p, lp.F_T_DST]
                    P[p, lp.F_C_N] = P[p, lp.F_T_N]
                    P[p, lp.F_C_RET] = lp.S_T_SINGLE_RET
                    st = lp.S_C_START
                if st == lp.S_T_SINGLE_RET or st == lp.S_T_DONE:
                    P[p, lp.F_STATE] = P[p, lp.F_T_RET]
                    continue
                # ---------------- DmaEngine._chunk -----------------------------------------------
                if st == lp.S_C_START:
                    P[p, lp.F_C_START] = now
                    d = P[p, lp.F_C_DIR]
                    P[p, lp.F_A_N] = P[p, lp.F_C_N]
                    P[p, lp.F_C_PORT] = -1
                    if uses_port(d):
                        P[p, lp.F_C_PORT] = reserve_port(port_free[P[p, lp.F_CORE]], now,
                                                         P[p, lp.F_C_N], port_bps)
                    P[p, lp.F_C_K] = 0
                    st = lp.S_C_NEXT
                if st == lp.S_C_NEXT:
                    addr, w = chunk_access(P[p, lp.F_C_DIR], P[p, lp.F_C_K], P[p, lp.F_C_SRC],
                                           P[p, lp.F_C_DST])
                    if addr >= 0:
                        P[p, lp.F_A_ADDR] = addr
                        P[p, lp.F_A_W] = w
                        P[p, lp.F_C_K] += 1
                        P[p, lp.F_A_RET] = lp.S_C_NEXT
                        st = lp.S_A_START
                    else:
                        pd = P[p, lp.F_C_PORT]
                        if pd > now:
                            P[p, lp.F_STATE] = lp.S_C_PORT_DONE
                            hs = lp.hpush(heap, hs, pd, lp.NORMAL, eid, lp.CB_RESUME, p)
                            eid += 1
                            break
                        st = lp.S_C_PORT_DONE
                if st == lp.S_C_PORT_DONE:
                    r = P[p, lp.F_T_RES]
                    users[r] -= 1
                    hs = lp.hpush(heap, hs, now, lp.NORMAL, eid, lp.CB_GRANT, r)
                    eid += 1
                    if log_level >= 2:
                        nl = lp.log_row(logs, nl, lp.LOG_CHUNK, r, P[p, lp.F_C_DIR],
                                        P[p, lp.F_C_START], now, P[p, lp.F_C_N])
                    P[p, lp.F_STATE] = P[p, lp.F_C_RET]
                    continue
                # ---------------- Dram.access ----------------------------------------------------
                if st == lp.S_A_START:
                    if P[p, lp.F_A_W]:
                        dram_written += P[p, lp.F_A_N]
                    else:
                        dram_read += P[p, lp.F_A_N]
                    if dram_lat:
                        P[p, lp.F_STATE] = lp.S_A_AFTER_LAT
                        hs = lp.hpush(heap, hs, now + dram_lat, lp.NORMAL, eid, lp.CB_RESUME, p)
                        eid += 1
                        break
                    st = lp.S_A_AFTER_LAT
                if st == lp.S_A_AFTER_LAT:
                    end, nl = lp.dram_access(
                        now, P[p, lp.F_A_ADDR], P[p, lp.F_A_N], P[p, lp.F_A_W], protocol,
                        granule, ch_bps, tck_ps, d_params, d_open, d_act, d_pre, d_cas, d_faw,
                        d_sc, d_ref, d_per, dram_free, spans, logs, nl, log_level)
                    if end > now:
                        P[p, lp.F_STATE] = lp.S_A_DONE
                        hs = lp.hpush(heap, hs, end, lp.NORMAL, eid, lp.CB_RESUME, p)
                        eid += 1
                        break
                    st = lp.S_A_DONE
                if st == lp.S_A_DONE:
                    P[p, lp.F_STATE] = P[p, lp.F_A_RET]
                    continue
                # ---------------- HostLink.transfer (pcie) ---------------------------------------
                if st == lp.S_L_START:
                    P[p, lp.F_L_OFF] = 0
                    P[p, lp.F_L_DONE] = 0
                    if link_lat:
                        P[p, lp.F_STATE] = lp.S_L_CHUNK
                        hs = lp.hpush(heap, hs, now + link_lat, lp.NORMAL, eid, lp.CB_RESUME, p)
                        eid += 1
                        break
                    st = lp.S_L_CHUNK
                if st == lp.S_L_CHUNK:
                    off = P[p, lp.F_L_OFF]
                    n = P[p, lp.F_L_N]
                    if off >= n:
                        P[p, lp.F_STATE] = P[p, lp.F_L_RET]
                        continue
                    ld = P[p, lp.F_L_DIR]
                    nn, s0, dur, end_ps = link_chunk(link_free, ld, now, off, n,
                                                     link_chunk_bytes, link_bps[ld],
                                                     P[p, lp.F_L_DONE])
                    P[p, lp.F_L_DONE] = end_ps
                    P[p, lp.F_L_START] = s0
                    P[p, lp.F_L_NN] = nn
                    P[p, lp.F_A_N] = dur  # the chunk's duration, for the second timeout
                    if s0 > now:
                        P[p, lp.F_STATE] = lp.S_L_AFTER_WAIT
                        hs = lp.hpush(heap, hs, s0, lp.NORMAL, eid, lp.CB_RESUME, p)
                        eid += 1
                        break
                    st = lp.S_L_AFTER_WAIT
                if st == lp.S_L_AFTER_WAIT:
                    P[p, lp.F_STATE] = lp.S_L_AFTER_CHUNK
                    if link_kind == PCIE:
                        hs = lp.hpush(heap, hs, now + P[p, lp.F_A_N], lp.NORMAL, eid,
                                      lp.CB_RESUME, p)
                        eid += 1
                        break
                    # a host memcpy: all_of([timeout(the CPU's time), process(DRAM read),
                    # process(DRAM write)]) of the chunk's bytes at its DRAM address
                    P[p, lp.F_AO_COUNT] = 0
                    P[p, lp.F_AO_TRIG] = 0
                    P[p, lp.F_AO_ON] = 0
                    hs = lp.hpush(heap, hs, now + P[p, lp.F_A_N], lp.NORMAL, eid, lp.CB_CHECK, p)
                    eid += 1
                    for w in range(2):
                        c, free_head, np_used = kp.new_process(P, free_head, np_used)
                        P[c, lp.F_TYPE] = lp.P_ACCESS
                        P[c, lp.F_PARENT] = p
                        P[c, lp.F_STATE] = lp.S_A_START
                        P[c, lp.F_A_RET] = lp.S_ACCESS_RET
                        P[c, lp.F_A_ADDR] = P[p, lp.F_L_ADDR] + P[p, lp.F_L_OFF]
                        P[c, lp.F_A_N] = P[p, lp.F_L_NN]
                        P[c, lp.F_A_W] = w
                        hs = lp.hpush(heap, hs, now, lp.URGENT, eid, lp.CB_RESUME, c)
                        eid += 1
                    P[p, lp.F_AO_N] = 3
                    P[p, lp.F_AO_ON] = 1
                    break
                if st == lp.S_L_AFTER_CHUNK:
                    if link_kind != PCIE:
                        link_chunk_done(link_free, P[p, lp.F_L_DIR], now)
                    if log_level >= 1:
                        nl = lp.log_row(logs, nl, lp.LOG_LINK, P[p, lp.F_L_DIR], P[p, lp.F_L_START],
                                        now, P[p, lp.F_L_NN], 0)
                    P[p, lp.F_L_OFF] += link_chunk_bytes
                    P[p, lp.F_STATE] = lp.S_L_CHUNK
                    continue
                # ---------------- returns ---------------------------------------------------------
                if st == lp.S_XFER_RET or st == lp.S_CHUNK_RET or st == lp.S_ACCESS_RET:
                    st = lp.S_END
                if st == lp.S_END:
                    # the process's own event: its parent's all_of counts it when processed
                    hs = lp.hpush(heap, hs, now, lp.NORMAL, eid, lp.CB_END, p)
                    eid += 1
                    P[p, lp.F_STATE] = -1
                    break
                raise RuntimeError("program loop: unknown process state")
            if pending >= 0:
                break  # to grow

    kp.store_scalars(sc, now, eid, hs, np_used, free_head, nd, ops, n_pairs_seen, dram_read,
                     dram_written, n_first_disp, n_first_sync, n_first_done, result, paused)
    return (sc, heap, P, level, f_head, f_tail, users, r_head, r_tail, order, pair_bytes,
            pair_first, logs, blocked, counts), nl

