"""The array loop's engine queue process: :func:`sim.device.engine.processes.queue` (and the
program's join) as a state machine over the loop's arrays.

A step runs process ``p`` from its state (``P[p, F_STATE]``) until it waits for an event
it scheduled (``WAITS``), hands over to another state the loop dispatches (``GO_ON``:
the instruction's DMA or link transfer runs in this same process, as the generator's
``yield from``), or needs room in the heap first (``ROOM``). It returns ``(heap size,
next insertion id, log rows, what, extra heap rows)``. Where the generator yields, the
step schedules the same event (the same time, priority and next insertion id); what it
waits for and how long comes from the plan row (``loopdefs.I_*``) and the fixed costs.
"""

from __future__ import annotations

from numba import njit

from sim.device.engine import loopdefs as lp
from sim.device.engine import loopprocs as kp


@njit(cache=True, error_model="numpy", inline="always")
def queue_step(p, now, hs, eid, nl, ls, prog, dev, log_level):  # noqa: C901 - one state each
    """One step of engine queue ``p`` (or of the join) from its state."""
    P, heap, sc = ls.P, ls.heap, ls.sc
    costs = dev.costs
    st = P[p, lp.F_STATE]
    if st == lp.S_E_LAUNCH:  # the program reaches every engine queue after its launch
        P[p, lp.F_STATE] = lp.S_E_NEXT
        if costs.launch_ps:
            hs, eid = lp.push(heap, hs, eid, now + costs.launch_ps, lp.NORMAL, lp.CB_RESUME, p)
            return hs, eid, nl, lp.WAITS, 0
        st = lp.S_E_NEXT
    if st == lp.S_E_NEXT:  # the next instruction: its dispatch, before its flags
        q = P[p, lp.F_Q]
        if P[p, lp.F_POS] >= prog.q_ptr[q + 1]:
            P[p, lp.F_STATE] = lp.S_END
            return hs, eid, nl, lp.GO_ON, 0
        i = prog.q_items[P[p, lp.F_POS]]
        if costs.dispatch_ps and prog.ins[prog.row_of[i], lp.I_FLAGS] & lp.FL_DISPATCH:
            P[p, lp.F_STATE] = lp.S_E_DISPATCHED
            hs, eid = lp.push(heap, hs, eid, now + costs.dispatch_ps, lp.NORMAL, lp.CB_RESUME,
                              p)
            return hs, eid, nl, lp.WAITS, 0
        P[p, lp.F_WK] = 0
        P[p, lp.F_STATE] = lp.S_E_WAIT
        return hs, eid, nl, lp.GO_ON, 0
    if st == lp.S_E_DISPATCHED:
        _count(ls.counts, sc, P[p, lp.F_Q], 0, 2, lp.SC_FDISP)
        P[p, lp.F_WK] = 0
        P[p, lp.F_STATE] = lp.S_E_WAIT
        return hs, eid, nl, lp.GO_ON, 0
    if st == lp.S_E_RESUMED_WAIT:
        ls.blocked[P[p, lp.F_Q], 0] = -1
        ls.blocked[P[p, lp.F_Q], 1] = -1
        P[p, lp.F_STATE] = lp.S_E_WAIT
        return hs, eid, nl, lp.GO_ON, 0
    if st == lp.S_E_WAIT:  # its flags, one count of each in turn, then a cross-core sync
        i = prog.q_items[P[p, lp.F_POS]]
        ri = prog.row_of[i]
        k = prog.w_ptr[ri] + P[p, lp.F_WK]
        if k < prog.w_ptr[ri + 1]:
            f = prog.w_flag[k]
            P[p, lp.F_WK] += 1
            if ls.level[f] < 1:
                ls.blocked[P[p, lp.F_Q], 0] = i
                ls.blocked[P[p, lp.F_Q], 1] = f
                P[p, lp.F_STATE] = lp.S_E_RESUMED_WAIT
            else:
                P[p, lp.F_STATE] = lp.S_E_WAIT
            # Container.get
            if ls.level[f] >= 1 and ls.f_head[f] < 0:
                ls.level[f] -= 1
                hs, eid = lp.push(heap, hs, eid, now, lp.NORMAL, lp.CB_RESUME, p)
            else:
                kp.enqueue(P, ls.f_head, ls.f_tail, f, p)
                hs, eid = kp.serve_flag(heap, hs, eid, now, f, ls.level, ls.f_head, ls.f_tail,
                                        P)
            return hs, eid, nl, lp.WAITS, 0
        if costs.sync_ps and prog.ins[ri, lp.I_FLAGS] & lp.FL_CROSS:
            P[p, lp.F_STATE] = lp.S_E_SYNCED
            hs, eid = lp.push(heap, hs, eid, now + costs.sync_ps, lp.NORMAL, lp.CB_RESUME, p)
            return hs, eid, nl, lp.WAITS, 0
        st = lp.S_E_TIMING
    if st == lp.S_E_SYNCED:
        _count(ls.counts, sc, P[p, lp.F_Q], 1, 3, lp.SC_FSYNC)
        st = lp.S_E_TIMING
    if st == lp.S_E_TIMING:
        return _work(p, now, hs, eid, nl, ls, prog, dev)
    if st == lp.S_E_FINISH:
        return _finish(p, now, hs, eid, nl, ls, prog, log_level)
    if st == lp.S_JOIN_INIT:  # all_of(every queue's process)
        nq = prog.q_ptr.shape[0] - 1
        if nq == 0:
            P[p, lp.F_STATE] = lp.S_END
            return hs, eid, nl, lp.GO_ON, 0
        hs, eid = kp.wait_all(heap, hs, eid, now, P, p, nq)
        P[p, lp.F_STATE] = lp.S_END
        return hs, eid, nl, lp.WAITS, 0
    raise RuntimeError("program loop: unknown engine queue state")


@njit(cache=True, error_model="numpy", inline="always")
def _count(counts, sc, q, col, first_col, first_sc):
    """One more dispatch (``col`` 0) or sync (1) of queue ``q``, noting the order in
    which the queues first made one (the stats' keys keep the processes' order)."""
    if counts[q, first_col] < 0:
        counts[q, first_col] = sc[first_sc]
        sc[first_sc] += 1
    counts[q, col] += 1


@njit(cache=True, error_model="numpy", inline="always")
def _work(p, now, hs, eid, nl, ls, prog, dev):
    """The instruction's work (``processes.work``): its stats additions, then its compute
    time, or a DMA or link transfer in this process, or its compute time beside its KV
    stream's transfers (all_of: a timeout and one process per transfer)."""
    P, heap, sc = ls.P, ls.heap, ls.sc
    i = prog.q_items[P[p, lp.F_POS]]
    ri = prog.row_of[i]
    P[p, lp.F_ISTART] = now
    ik = prog.ins[ri, lp.I_KIND]
    if ik == lp.K_COMPUTE:
        P[p, lp.F_STATE] = lp.S_E_FINISH
        d = prog.ins[ri, lp.I_DUR]
        if d:
            hs, eid = lp.push(heap, hs, eid, now + d, lp.NORMAL, lp.CB_RESUME, p)
            return hs, eid, nl, lp.WAITS, 0
        return hs, eid, nl, lp.GO_ON, 0
    # the stats additions, made as the instruction's work begins
    for a in range(prog.ins[ri, lp.I_NADD]):
        pr = prog.ins[ri, lp.I_PAIR1 + 2 * a]
        if ls.pair_first[pr] < 0:
            ls.pair_first[pr] = sc[lp.SC_NPAIRS]
            sc[lp.SC_NPAIRS] += 1
        ls.pair_bytes[pr] += prog.ins[ri, lp.I_BYTES1 + 2 * a]
    if ik == lp.K_DMA:
        kp.set_transfer(P, p, prog.ins, ri, lp.I_DIR1)
        P[p, lp.F_T_RET] = lp.S_E_FINISH
        P[p, lp.F_STATE] = lp.S_T_START
        return hs, eid, nl, lp.GO_ON, 0
    if ik == lp.K_LINK:
        P[p, lp.F_L_DIR] = prog.ins[ri, lp.I_DIR1]
        P[p, lp.F_L_ADDR] = prog.ins[ri, lp.I_SRC1]
        P[p, lp.F_L_N] = prog.ins[ri, lp.I_N1]
        P[p, lp.F_L_RET] = lp.S_E_FINISH
        P[p, lp.F_STATE] = lp.S_L_START
        return hs, eid, nl, lp.GO_ON, 0
    # K_PAR: all_of([timeout(dur), process(transfer 1), process(transfer 2)])
    nsub = prog.ins[ri, lp.I_NSUB]
    P[p, lp.F_AO_COUNT] = 0
    P[p, lp.F_AO_TRIG] = 0
    P[p, lp.F_AO_ON] = 0
    hs, eid = lp.push(heap, hs, eid, now + prog.ins[ri, lp.I_DUR], lp.NORMAL, lp.CB_CHECK, p)
    for s in range(nsub):
        c = kp.spawn(P, sc)
        P[c, lp.F_TYPE] = lp.P_XFER
        P[c, lp.F_PARENT] = p
        P[c, lp.F_STATE] = lp.S_T_START
        P[c, lp.F_T_RET] = lp.S_XFER_RET
        kp.set_transfer(P, c, prog.ins, ri, lp.I_DIR1 if s == 0 else lp.I_DIR2)
        hs, eid = lp.push(heap, hs, eid, now, lp.URGENT, lp.CB_RESUME, c)
    P[p, lp.F_AO_N] = 1 + nsub
    P[p, lp.F_AO_ON] = 1
    P[p, lp.F_STATE] = lp.S_E_FINISH
    return hs, eid, nl, lp.WAITS, 0


@njit(cache=True, error_model="numpy", inline="always")
def _finish(p, now, hs, eid, nl, ls, prog, log_level):
    """The instruction ends: its order, ops and busy time, its span, its signals (one
    count of each flag, each served in an event of its own); then the next one."""
    P, heap, sc = ls.P, ls.heap, ls.sc
    i = prog.q_items[P[p, lp.F_POS]]
    ri = prog.row_of[i]
    nsig = prog.s_ptr[ri + 1] - prog.s_ptr[ri]
    if hs + sc[lp.SC_NP] + 4 + nsig > heap.shape[0]:
        return hs, eid, nl, lp.ROOM, nsig  # room for its signals first
    if ls.order.shape[0] > 0:
        ls.order[sc[lp.SC_ND]] = i
    sc[lp.SC_ND] += 1
    sc[lp.SC_OPS] += prog.ins[ri, lp.I_OPS]
    q = P[p, lp.F_Q]
    if ls.counts[q, 5] < 0:
        ls.counts[q, 5] = sc[lp.SC_FDONE]
        sc[lp.SC_FDONE] += 1
    ls.counts[q, 4] += now - P[p, lp.F_ISTART]
    if log_level >= 1:
        nl = lp.log_row(ls.logs, nl, lp.LOG_INS, q, i, P[p, lp.F_ISTART], now, 0)
    for k in range(prog.s_ptr[ri], prog.s_ptr[ri + 1]):
        f = prog.s_flag[k]
        ls.level[f] += 1
        hs, eid = lp.push(heap, hs, eid, now, lp.NORMAL, lp.CB_SERVE, f)
    P[p, lp.F_POS] += 1
    P[p, lp.F_STATE] = lp.S_E_NEXT
    return hs, eid, nl, lp.GO_ON, 0
