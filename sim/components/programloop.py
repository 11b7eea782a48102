"""A whole program's event loop in Numba, with the event kernel's exact event order.

:mod:`sim.components.kernel` runs the device's SimPy-style processes (one generator per
engine queue, per multi-chunk DMA chunk, per attention stream) at Python speed. This
module runs the *same* processes written out as explicit state machines over arrays, so
one program costs a few machine instructions per event instead of a few Python calls.

What is kept exactly is what makes the two timelines identical: every event the kernel
schedules is scheduled here too, at the same time, with the same priority and the next
insertion id, and processed in ``(time, priority, id)`` order; resources (DMA slots),
flags (counting semaphores), DRAM channel calendars, SRAM ports and link directions are
updated at the same points of the same processes. The state machines mirror, line by line:

- ``Device._engine`` (waits, the instruction's timing, signals), ``Device._join``;
- ``DmaEngine.transfer`` / ``DmaEngine._chunk``; ``Dram.access``; ``Sram.reserve_port``;
- ``HostLink.transfer`` for ``kind = "pcie"``;
- the kernel's ``Resource``, ``Container``, ``AllOf`` and process start/end events.

DRAM chunks are timed as ``Dram.chunk_plan`` times them: in the protocol model by the
same Numba step (:func:`sim.dram_timing.chunk_channels_ck`) over the same channel state
arrays, at the same point of the same process; in the efficiency model from plans
precomputed for every distinct ``(address modulo the interleave stripe, bytes)`` a
program's chunks use (:mod:`sim.array_engine`).
The fixed costs (launch, dispatch, cross-core sync) are timeouts where
``Device._engine`` yields them.

The loop does not touch memory bytes or the recorder: it returns logs (instruction
starts and ends, DRAM bursts, link chunks, DMA chunks) that the caller replays, in order,
into the stats, the functional semantics and the recorder.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from . import loopdefs as lp


@njit(cache=True)
def run_program(  # noqa: C901 - one state machine per process kind, kept together
    state: tuple, flush_at: int, ins: np.ndarray, row_of: np.ndarray, w_ptr: np.ndarray,
    w_flag: np.ndarray,
    s_ptr: np.ndarray, s_flag: np.ndarray, q_ptr: np.ndarray, q_items: np.ndarray,
    res_cap: np.ndarray, res_setup: np.ndarray, res_chunk: np.ndarray,
    dram_free: np.ndarray, dram_lat: int, plan_keys: np.ndarray, plan_ptr: np.ndarray,
    plan_ch: np.ndarray, plan_b: np.ndarray, plan_dur: np.ndarray, stripe: int,
    key_mul: int, port_free: np.ndarray, port_bps: float, link_free: np.ndarray,
    link_bps: np.ndarray, link_lat: int, link_chunk: int, log_level: int,
    protocol: bool, d_params: np.ndarray, d_open: np.ndarray, d_act: np.ndarray,
    d_pre: np.ndarray, d_cas: np.ndarray, d_faw: np.ndarray, d_sc: np.ndarray,
    d_ref: np.ndarray, d_per: np.ndarray, tck_ps: float, launch_ps: int, dispatch_ps: int,
    sync_ps: int,
):
    """Runs one program from the ``state`` of :func:`new_state` (time, insertion id, the
    processes, flags, resources, results), which it updates, until it is done or, with
    ``flush_at > 0``, until its logs hold at least ``flush_at`` rows between two events:
    the caller replays them and calls again with the state returned (logs start afresh).
    Instruction ``i`` is row ``row_of[i]`` of ``ins`` (its waits and signals too); updates
    ``dram_free``, ``port_free`` and ``link_free`` in place. With ``protocol`` the DRAM
    chunks are timed by :func:`sim.dram_timing.chunk_channels_ck` over the channel state
    arrays ``d_*`` (updated in place, as ``Dram.chunk_plan`` does), else by the plans.
    ``launch_ps``, ``dispatch_ps`` and ``sync_ps`` are the fixed costs ``Device._engine``
    pays (0: none).

    Returns ``(state, nlogs)``. The state's scalars (``loopdefs.SC_*``) hold the result,
    whether the run paused, the time and next insertion id, the DRAM bytes read and
    written, how many instructions ended and their ops, and the events left scheduled
    (none after a complete program); its arrays: ``order`` the instructions in the order
    they ended (if the state was made to keep it), ``logs`` rows the recorder's reports in
    order (level 0: none, 1: instruction spans and bytes moved, 2: also chunk spans; the
    first ``nlogs``), ``blocked[q]`` = ``(instruction, flag)`` for each queue waiting on a
    flag it found empty, else ``-1``; ``counts[q]`` = (dispatches done, syncs done, order
    of the first dispatch, order of the first sync, busy ps, order of the first
    instruction ended; -1: none); ``pair_bytes[k]`` the bytes
    of the stats additions of pair ``k`` (made when an instruction's timing begins) and
    ``pair_first[k]`` the order of its first addition (-1: none).
    """
    nq = q_ptr.shape[0] - 1
    (sc, heap, P, level, f_head, f_tail, users, r_head, r_tail, order, pair_bytes,
     pair_first, logs, blocked, counts) = state
    want_order = order.shape[0] > 0
    now = sc[lp.SC_NOW]
    eid = sc[lp.SC_EID]
    hs = sc[lp.SC_HS]
    np_used = sc[lp.SC_NP]
    free_head = sc[lp.SC_FREE]
    nd = sc[lp.SC_ND]
    ops = sc[lp.SC_OPS]
    n_pairs_seen = sc[lp.SC_NPAIRS]
    dram_read = sc[lp.SC_DREAD]
    dram_written = sc[lp.SC_DWRITE]
    n_first_disp = sc[lp.SC_FDISP]
    n_first_sync = sc[lp.SC_FSYNC]
    n_first_done = sc[lp.SC_FDONE]
    result = sc[lp.SC_RESULT]
    nl = 0
    nports = port_free.shape[1]

    if not sc[lp.SC_STARTED]:
        sc[lp.SC_STARTED] = 1
        # the engine processes, in queue order, then the join: each starts with an URGENT
        # event
        for q in range(nq):
            p = np_used
            np_used += 1
            P[p, lp.F_TYPE] = lp.P_ENGINE
            P[p, lp.F_STATE] = lp.S_E_LAUNCH
            P[p, lp.F_Q] = q
            P[p, lp.F_POS] = q_ptr[q]
            P[p, lp.F_PARENT] = nq
            hs = lp.hpush(heap, hs, now, lp.URGENT, eid, lp.CB_RESUME, p)
            eid += 1
        join = np_used
        np_used += 1
        P[join, lp.F_TYPE] = lp.P_JOIN
        P[join, lp.F_STATE] = lp.S_JOIN_INIT
        P[join, lp.F_PARENT] = -1
        hs = lp.hpush(heap, hs, now, lp.URGENT, eid, lp.CB_RESUME, join)
        eid += 1

    paused = 0
    while hs > 0:
        if flush_at > 0 and nl >= flush_at:
            paused = 1
            break
        hs = lp.hpop(heap, hs)
        now = heap[hs, 0]
        kind = heap[hs, 3]
        arg = heap[hs, 4]
        if kind == lp.CB_GRANT:
            r = arg
            if r_head[r] >= 0 and users[r] < res_cap[r]:
                users[r] += 1
                h = r_head[r]
                r_head[r] = P[h, lp.F_NEXT]
                if r_head[r] < 0:
                    r_tail[r] = -1
                if hs + 2 > heap.shape[0]:
                    heap = lp.grow(heap)
                hs = lp.hpush(heap, hs, now, lp.NORMAL, eid, lp.CB_RESUME, h)
                eid += 1
            continue
        if kind == lp.CB_SERVE:
            f = arg
            while f_head[f] >= 0 and level[f] >= 1:
                level[f] -= 1
                w = f_head[f]
                f_head[f] = P[w, lp.F_NEXT]
                if f_head[f] < 0:
                    f_tail[f] = -1
                if hs + 2 > heap.shape[0]:
                    heap = lp.grow(heap)
                hs = lp.hpush(heap, hs, now, lp.NORMAL, eid, lp.CB_RESUME, w)
                eid += 1
            continue
        if kind == lp.CB_END or kind == lp.CB_CHECK:
            p = arg
            if kind == lp.CB_END:
                if P[p, lp.F_TYPE] == lp.P_JOIN:
                    result = lp.R_DONE
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
                if hs + 2 > heap.shape[0]:
                    heap = lp.grow(heap)
                hs = lp.hpush(heap, hs, now, lp.NORMAL, eid, lp.CB_RESUME, parent)
                eid += 1
            continue

        # lp.CB_RESUME: run process p until it waits again or returns
        p = arg
        while True:
            if hs + 4 > heap.shape[0]:
                heap = lp.grow(heap)
            if np_used + 4 > P.shape[0]:
                P = lp.grow(P)
            if nl + 4 > logs.shape[0]:
                logs = lp.grow(logs)
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
                        P[p, lp.F_NEXT] = -1
                        if f_tail[f] >= 0:
                            P[f_tail[f], lp.F_NEXT] = p
                        else:
                            f_head[f] = p
                        f_tail[f] = p
                        while f_head[f] >= 0 and level[f] >= 1:
                            level[f] -= 1
                            w = f_head[f]
                            f_head[f] = P[w, lp.F_NEXT]
                            if f_head[f] < 0:
                                f_tail[f] = -1
                            if hs + 2 > heap.shape[0]:
                                heap = lp.grow(heap)
                            hs = lp.hpush(heap, hs, now, lp.NORMAL, eid, lp.CB_RESUME, w)
                            eid += 1
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
                    P[p, lp.F_T_RES] = ins[ri, lp.I_RES]
                    P[p, lp.F_T_DIR] = ins[ri, lp.I_DIR1]
                    P[p, lp.F_T_SRC] = ins[ri, lp.I_SRC1]
                    P[p, lp.F_T_DST] = ins[ri, lp.I_DST1]
                    P[p, lp.F_T_N] = ins[ri, lp.I_N1]
                    P[p, lp.F_CORE] = ins[ri, lp.I_CORE]
                    P[p, lp.F_T_RET] = lp.S_E_FINISH
                    P[p, lp.F_STATE] = lp.S_T_START
                    continue
                if ik == lp.K_LINK:
                    P[p, lp.F_L_DIR] = ins[ri, lp.I_DIR1]
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
                    if free_head >= 0:
                        c = free_head
                        free_head = P[c, lp.F_NEXT]
                    else:
                        c = np_used
                        np_used += 1
                    P[c, lp.F_TYPE] = lp.P_XFER
                    P[c, lp.F_PARENT] = p
                    P[c, lp.F_STATE] = lp.S_T_START
                    P[c, lp.F_T_RET] = lp.S_XFER_RET
                    P[c, lp.F_T_RES] = ins[ri, lp.I_RES]
                    P[c, lp.F_CORE] = ins[ri, lp.I_CORE]
                    base = lp.I_DIR1 if s == 0 else lp.I_DIR2
                    P[c, lp.F_T_DIR] = ins[ri, base]
                    P[c, lp.F_T_SRC] = ins[ri, base + 1]
                    P[c, lp.F_T_DST] = ins[ri, base + 2]
                    P[c, lp.F_T_N] = ins[ri, base + 3]
                    hs = lp.hpush(heap, hs, now, lp.URGENT, eid, lp.CB_RESUME, c)
                    eid += 1
                P[p, lp.F_AO_N] = 1 + nsub
                P[p, lp.F_AO_ON] = 1
                P[p, lp.F_STATE] = lp.S_E_FINISH
                break
            if st == lp.S_E_FINISH:
                i = q_items[P[p, lp.F_POS]]
                ri = row_of[i]
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
                    logs[nl, 0] = lp.LOG_INS
                    logs[nl, 1] = P[p, lp.F_Q]
                    logs[nl, 2] = i
                    logs[nl, 3] = P[p, lp.F_ISTART]
                    logs[nl, 4] = now
                    nl += 1
                for k in range(s_ptr[ri], s_ptr[ri + 1]):
                    if hs + 2 > heap.shape[0]:
                        heap = lp.grow(heap)
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
                    if total <= chunk:
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
                    n = min(chunk, total - off)
                    if free_head >= 0:
                        c = free_head
                        free_head = P[c, lp.F_NEXT]
                    else:
                        c = np_used
                        np_used += 1
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
                    P[p, lp.F_NEXT] = -1
                    if r_tail[r] >= 0:
                        P[r_tail[r], lp.F_NEXT] = p
                    else:
                        r_head[r] = p
                    r_tail[r] = p
                    if r_head[r] >= 0 and users[r] < res_cap[r]:
                        users[r] += 1
                        h = r_head[r]
                        r_head[r] = P[h, lp.F_NEXT]
                        if r_head[r] < 0:
                            r_tail[r] = -1
                        hs = lp.hpush(heap, hs, now, lp.NORMAL, eid, lp.CB_RESUME, h)
                        eid += 1
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
                n = P[p, lp.F_C_N]
                P[p, lp.F_A_N] = n
                P[p, lp.F_C_PORT] = -1
                if d == lp.D_COPY or d == lp.D_READ:
                    P[p, lp.F_A_ADDR] = P[p, lp.F_C_SRC]
                    P[p, lp.F_A_W] = 0
                elif d == lp.D_WRITE:
                    P[p, lp.F_A_ADDR] = P[p, lp.F_C_DST]
                    P[p, lp.F_A_W] = 1
                else:
                    # Sram.reserve_port: the earliest free port (the lowest index on ties)
                    core = P[p, lp.F_CORE]
                    best = 0
                    for k in range(1, nports):
                        if port_free[core, k] < port_free[core, best]:
                            best = k
                    s0 = max(now, port_free[core, best])
                    port_free[core, best] = s0 + lp.transfer_ps(n, port_bps)
                    P[p, lp.F_C_PORT] = port_free[core, best]
                    if d == lp.D_LOAD:
                        P[p, lp.F_A_ADDR] = P[p, lp.F_C_SRC]
                        P[p, lp.F_A_W] = 0
                    else:
                        P[p, lp.F_A_ADDR] = P[p, lp.F_C_DST]
                        P[p, lp.F_A_W] = 1
                P[p, lp.F_A_RET] = lp.S_C_AFTER_A1
                st = lp.S_A_START
            if st == lp.S_C_AFTER_A1:
                if P[p, lp.F_C_DIR] == lp.D_COPY:
                    P[p, lp.F_A_ADDR] = P[p, lp.F_C_DST]
                    P[p, lp.F_A_W] = 1
                    P[p, lp.F_A_RET] = lp.S_C_AFTER_A2
                    st = lp.S_A_START
                else:
                    st = lp.S_C_AFTER_A2
            if st == lp.S_C_AFTER_A2:
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
                    logs[nl, 0] = lp.LOG_CHUNK
                    logs[nl, 1] = r
                    logs[nl, 2] = P[p, lp.F_C_DIR]
                    logs[nl, 3] = P[p, lp.F_C_START]
                    logs[nl, 4] = now
                    logs[nl, 5] = P[p, lp.F_C_N]
                    nl += 1
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
                a = P[p, lp.F_A_ADDR]
                n = P[p, lp.F_A_N]
                # room for one log row per channel
                if log_level >= 1 and nl + dram_free.shape[0] > logs.shape[0]:
                    logs = lp.grow_to(logs, nl + dram_free.shape[0])
                if protocol:
                    end, nl = lp.protocol_access(now, a, n, P[p, lp.F_A_W], tck_ps, d_params,
                                                 d_open, d_act, d_pre, d_cas, d_faw, d_sc,
                                                 d_ref, d_per, dram_free, logs, nl, log_level)
                else:
                    u = lp.plan_index(plan_keys, (a % stripe) * key_mul + n)
                    if u < 0:
                        raise RuntimeError("program loop: a DRAM access has no chunk plan")
                    end, nl = lp.planned_access(now, u, P[p, lp.F_A_W], plan_ptr, plan_ch,
                                                plan_b, plan_dur, dram_free, logs, nl,
                                                log_level)
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
                nn = min(link_chunk, n - off)
                end_ps = lp.transfer_ps(off + nn, link_bps[ld])
                dur = end_ps - P[p, lp.F_L_DONE]
                P[p, lp.F_L_DONE] = end_ps
                s0 = max(now, link_free[ld])
                link_free[ld] = s0 + dur
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
                hs = lp.hpush(heap, hs, now + P[p, lp.F_A_N], lp.NORMAL, eid, lp.CB_RESUME, p)
                eid += 1
                break
            if st == lp.S_L_AFTER_CHUNK:
                if log_level >= 1:
                    logs[nl, 0] = lp.LOG_LINK
                    logs[nl, 1] = P[p, lp.F_L_DIR]
                    logs[nl, 2] = P[p, lp.F_L_START]
                    logs[nl, 3] = now
                    logs[nl, 4] = P[p, lp.F_L_NN]
                    nl += 1
                P[p, lp.F_L_OFF] += link_chunk
                P[p, lp.F_STATE] = lp.S_L_CHUNK
                continue
            # ---------------- returns ----------------------------------------------------------
            if st == lp.S_XFER_RET or st == lp.S_CHUNK_RET:
                st = lp.S_END
            if st == lp.S_END:
                # the process's own event: its parent's all_of counts it when processed
                hs = lp.hpush(heap, hs, now, lp.NORMAL, eid, lp.CB_END, p)
                eid += 1
                P[p, lp.F_STATE] = -1
                break
            raise RuntimeError("program loop: unknown process state")

    sc[lp.SC_NOW] = now
    sc[lp.SC_EID] = eid
    sc[lp.SC_HS] = hs
    sc[lp.SC_NP] = np_used
    sc[lp.SC_FREE] = free_head
    sc[lp.SC_ND] = nd
    sc[lp.SC_OPS] = ops
    sc[lp.SC_NPAIRS] = n_pairs_seen
    sc[lp.SC_DREAD] = dram_read
    sc[lp.SC_DWRITE] = dram_written
    sc[lp.SC_FDISP] = n_first_disp
    sc[lp.SC_FSYNC] = n_first_sync
    sc[lp.SC_FDONE] = n_first_done
    sc[lp.SC_RESULT] = result
    sc[lp.SC_PAUSED] = paused
    return (sc, heap, P, level, f_head, f_tail, users, r_head, r_tail, order, pair_bytes,
            pair_first, logs, blocked, counts), nl


def new_state(now: int, eid: int, queues: int, flags: int, resources: int,
              instructions: int, pairs: int, *, log_level: int, keep_order: bool) -> tuple:
    """The state :func:`run_program` starts a program from: at time ``now`` with insertion
    ids from ``eid``, no process started, every flag empty and every resource free."""
    sc = np.zeros(lp.SC_FIELDS, np.int64)
    sc[lp.SC_NOW] = now
    sc[lp.SC_EID] = eid
    sc[lp.SC_FREE] = -1
    sc[lp.SC_RESULT] = lp.R_DEADLOCK
    counts = np.full((max(queues, 1), 6), -1, np.int64)
    counts[:, :2] = 0
    counts[:, 4] = 0
    return (
        sc,
        np.zeros((256, 5), np.int64),  # the event heap
        np.zeros((max(64, 2 * queues + 8), lp.P_FIELDS), np.int64),  # the processes
        np.zeros(flags, np.int64),  # flag levels, waiter queues
        np.full(flags, -1, np.int64),
        np.full(flags, -1, np.int64),
        np.zeros(resources, np.int64),  # resource users, waiter queues
        np.full(resources, -1, np.int64),
        np.full(resources, -1, np.int64),
        np.zeros(instructions if keep_order else 0, np.int32),
        np.zeros(pairs, np.int64),
        np.full(pairs, -1, np.int64),
        np.zeros((1024 if log_level else 1, lp.LOG_FIELDS), np.int64),
        np.full((max(queues, 1), 2), -1, np.int64),
        counts,
    )
