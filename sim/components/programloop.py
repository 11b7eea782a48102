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

Per-chunk DRAM timing is not computed here: ``Dram.chunk_plan`` computes it for every
distinct ``(address modulo the interleave stripe, bytes)`` a program's chunks use (see
:mod:`sim.components.program_arrays`), and the loop looks the plan up.

The loop does not touch memory bytes or the recorder: it returns logs (instruction
starts and ends, DRAM bursts, link chunks, DMA chunks) that the caller replays, in order,
into the stats, the functional semantics and the recorder.
"""

from __future__ import annotations

import numpy as np
from numba import njit

URGENT = 0
NORMAL = 1

# --- callback kinds of a scheduled event --------------------------------------------------
CB_RESUME = 0  # resume process ``arg``
CB_END = 1  # process ``arg`` has ended: count it in its parent's all_of
CB_CHECK = 2  # a part (a timeout) of process ``arg``'s all_of is done
CB_GRANT = 3  # a resource ``arg`` was released: grant the head of its queue
CB_SERVE = 4  # flag ``arg`` was given a count: serve its waiters

# --- instruction kinds -----------------------------------------------------------------------
K_COMPUTE = 0  # one timeout of I_DUR (none when 0)
K_DMA = 1  # one DMA transfer, run in the engine's own process
K_LINK = 2  # one host-link transfer (pcie), run in the engine's own process
K_PAR = 3  # timeout of I_DUR in parallel with 1 or 2 stream transfers (own processes)

# --- DMA directions --------------------------------------------------------------------------
D_LOAD = 0
D_STORE = 1
D_COPY = 2
D_READ = 3
D_WRITE = 4

# --- instruction fields (columns of the instruction table) ---------------------------------
I_KIND = 0
I_DUR = 1
I_RES = 2
I_CORE = 3
I_NSUB = 4
I_DIR1 = 5
I_SRC1 = 6
I_DST1 = 7
I_N1 = 8
I_DIR2 = 9
I_SRC2 = 10
I_DST2 = 11
I_N2 = 12
I_FIELDS = 13

# --- process types and fields --------------------------------------------------------------
P_ENGINE = 0
P_JOIN = 1
P_XFER = 2  # a stream transfer of an attention / KV instruction
P_CHUNK = 3  # one chunk of a multi-chunk transfer

F_TYPE = 0
F_STATE = 1
F_PARENT = 2
F_NEXT = 3  # next in a waiter queue (flag or resource)
F_Q = 4  # engine: queue
F_POS = 5  # engine: position in its queue
F_WK = 6  # engine: next wait of the current instruction
F_ISTART = 7  # engine: start of the current instruction
F_AO_N = 8  # all_of: parts, parts done, waiting on it, triggered
F_AO_COUNT = 9
F_AO_ON = 10
F_AO_TRIG = 11
F_T_RES = 12  # transfer: resource, direction, src, dst, total bytes, next offset
F_T_DIR = 13
F_T_SRC = 14
F_T_DST = 15
F_T_N = 16
F_T_OFF = 17
F_T_RET = 18  # state to continue at when the transfer is done
F_C_DIR = 19  # chunk: direction, src, dst, bytes, start, SRAM port done, core
F_C_SRC = 20
F_C_DST = 21
F_C_N = 22
F_C_START = 23
F_C_PORT = 24
F_C_RET = 25
F_A_ADDR = 26  # DRAM access: address, bytes, write, state to continue at
F_A_N = 27
F_A_W = 28
F_A_RET = 29
F_L_DIR = 30  # link transfer: direction, bytes, next offset, bytes done in ps, chunk start
F_L_N = 31
F_L_OFF = 32
F_L_DONE = 33
F_L_START = 34
F_L_NN = 35
F_L_RET = 36
F_CORE = 37
P_FIELDS = 38

# --- process states ----------------------------------------------------------------------------
S_E_NEXT = 0
S_E_WAIT = 1
S_E_RESUMED_WAIT = 2
S_E_TIMING = 3
S_E_FINISH = 4
S_JOIN_INIT = 5
S_JOIN_DONE = 6
S_T_START = 10
S_T_SETUP_DONE = 11
S_T_SINGLE_GOT = 12
S_T_MULTI_GOT = 13
S_T_DONE = 14
S_C_START = 20
S_C_AFTER_A1 = 21
S_C_AFTER_A2 = 22
S_C_PORT_DONE = 23
S_C_DONE = 24
S_A_START = 30
S_A_AFTER_LAT = 31
S_A_DONE = 32
S_L_START = 40
S_L_CHUNK = 41
S_L_AFTER_WAIT = 42
S_L_AFTER_CHUNK = 43
S_END = 50  # the process returns
S_XFER_RET = 51  # a P_XFER's transfer is done
S_CHUNK_RET = 52  # a P_CHUNK's chunk is done
S_T_SINGLE_RET = 53  # a transfer's single chunk (run in its own process) is done

# --- log codes ---------------------------------------------------------------------------------
LOG_INS = 0  # queue, instruction, start, end
LOG_DRAM = 1  # channel, start, stop, bytes, write
LOG_LINK = 2  # direction, start, end, bytes
LOG_CHUNK = 3  # resource, direction, start, end, bytes
LOG_FIELDS = 6

# --- results -----------------------------------------------------------------------------------
R_DONE = 0
R_DEADLOCK = 1


@njit(cache=True)
def _grow(a: np.ndarray) -> np.ndarray:
    out = np.empty((a.shape[0] * 2, a.shape[1]), a.dtype)
    out[: a.shape[0]] = a
    return out


@njit(cache=True)
def _less(h: np.ndarray, i: int, j: int) -> bool:
    if h[i, 0] != h[j, 0]:
        return h[i, 0] < h[j, 0]
    if h[i, 1] != h[j, 1]:
        return h[i, 1] < h[j, 1]
    return h[i, 2] < h[j, 2]


@njit(cache=True)
def _swap(h: np.ndarray, i: int, j: int) -> None:
    for k in range(5):
        t = h[i, k]
        h[i, k] = h[j, k]
        h[j, k] = t


@njit(cache=True)
def _hpush(h: np.ndarray, n: int, t: int, prio: int, eid: int, kind: int, arg: int) -> int:
    h[n, 0] = t
    h[n, 1] = prio
    h[n, 2] = eid
    h[n, 3] = kind
    h[n, 4] = arg
    i = n
    while i > 0:
        parent = (i - 1) >> 1
        if _less(h, i, parent):
            _swap(h, i, parent)
            i = parent
        else:
            break
    return n + 1


@njit(cache=True)
def _hpop(h: np.ndarray, n: int) -> int:
    """Moves the smallest entry to row ``n - 1``; returns the new size."""
    n -= 1
    _swap(h, 0, n)
    i = 0
    while True:
        lo = 2 * i + 1
        if lo >= n:
            break
        c = lo
        if lo + 1 < n and _less(h, lo + 1, lo):
            c = lo + 1
        if _less(h, c, i):
            _swap(h, i, c)
            i = c
        else:
            break
    return n


@njit(cache=True)
def transfer_ps(nbytes: int, bytes_per_s: float) -> int:
    """``sim.units.transfer_ps`` for a float ``bytes_per_s``: ``ceil(nbytes * 1e12 / bw)``.
    With ``nbytes < 2**53`` float(nbytes) is exact and the product is the correctly
    rounded exact product, which is what Python divides too (a test checks it)."""
    if nbytes <= 0:
        return 0
    return int(np.ceil(np.float64(nbytes) * 1e12 / bytes_per_s))


@njit(cache=True)
def _plan_index(keys: np.ndarray, key: int) -> int:
    i = np.searchsorted(keys, key)
    if i >= keys.shape[0] or keys[i] != key:
        return -1
    return i


@njit(cache=True)
def run_program(  # noqa: C901 - one state machine per process kind, kept together
    now0: int, eid0: int, ins: np.ndarray, w_ptr: np.ndarray, w_flag: np.ndarray,
    s_ptr: np.ndarray, s_flag: np.ndarray, q_ptr: np.ndarray, q_items: np.ndarray,
    nflags: int, res_cap: np.ndarray, res_setup: np.ndarray, res_chunk: np.ndarray,
    dram_free: np.ndarray, dram_lat: int, plan_keys: np.ndarray, plan_ptr: np.ndarray,
    plan_ch: np.ndarray, plan_b: np.ndarray, plan_dur: np.ndarray, stripe: int,
    key_mul: int, port_free: np.ndarray, port_bps: float, link_free: np.ndarray,
    link_bps: np.ndarray, link_lat: int, link_chunk: int, log_level: int,
):
    """Runs one program from time ``now0`` with insertion ids from ``eid0``; updates
    ``dram_free``, ``port_free`` and ``link_free`` in place.

    Returns ``(result, now, eid, dram_read, dram_written, done, ndone, starts, nstarts,
    logs, nlogs, blocked, pending)``: ``done`` rows are ``(instruction, start, end)`` in the order
    instructions ended, ``starts`` the non-compute instructions in the order their timing
    began, ``logs`` rows the recorder's reports in order (level 0: none, 1: instruction
    spans and bytes moved, 2: also chunk spans), ``blocked[q]`` = ``(instruction, flag)``
    for each queue waiting on a flag it found empty, else ``-1``; ``pending``
    the events left scheduled (none after a complete program).
    """
    nq = q_ptr.shape[0] - 1
    nres = res_cap.shape[0]
    now = now0
    eid = eid0
    heap = np.zeros((256, 5), np.int64)
    hs = 0
    P = np.zeros((max(64, 2 * nq + 8), P_FIELDS), np.int64)
    np_used = 0
    free_head = -1
    level = np.zeros(nflags, np.int64)
    f_head = np.full(nflags, -1, np.int64)
    f_tail = np.full(nflags, -1, np.int64)
    users = np.zeros(nres, np.int64)
    r_head = np.full(nres, -1, np.int64)
    r_tail = np.full(nres, -1, np.int64)
    done = np.zeros((ins.shape[0] + 1, 3), np.int64)
    nd = 0
    starts = np.zeros(ins.shape[0] + 1, np.int64)
    nst = 0
    logs = np.zeros((1024 if log_level else 1, LOG_FIELDS), np.int64)
    nl = 0
    blocked = np.full((max(nq, 1), 2), -1, np.int64)
    dram_read = 0
    dram_written = 0
    nports = port_free.shape[1]

    # the engine processes, in queue order, then the join: each starts with an URGENT event
    for q in range(nq):
        p = np_used
        np_used += 1
        P[p, F_TYPE] = P_ENGINE
        P[p, F_STATE] = S_E_NEXT
        P[p, F_Q] = q
        P[p, F_POS] = q_ptr[q]
        P[p, F_PARENT] = nq
        hs = _hpush(heap, hs, now, URGENT, eid, CB_RESUME, p)
        eid += 1
    join = np_used
    np_used += 1
    P[join, F_TYPE] = P_JOIN
    P[join, F_STATE] = S_JOIN_INIT
    P[join, F_PARENT] = -1
    hs = _hpush(heap, hs, now, URGENT, eid, CB_RESUME, join)
    eid += 1

    result = R_DEADLOCK
    while hs > 0:
        hs = _hpop(heap, hs)
        now = heap[hs, 0]
        kind = heap[hs, 3]
        arg = heap[hs, 4]
        if kind == CB_GRANT:
            r = arg
            if r_head[r] >= 0 and users[r] < res_cap[r]:
                users[r] += 1
                h = r_head[r]
                r_head[r] = P[h, F_NEXT]
                if r_head[r] < 0:
                    r_tail[r] = -1
                if hs + 2 > heap.shape[0]:
                    heap = _grow(heap)
                hs = _hpush(heap, hs, now, NORMAL, eid, CB_RESUME, h)
                eid += 1
            continue
        if kind == CB_SERVE:
            f = arg
            while f_head[f] >= 0 and level[f] >= 1:
                level[f] -= 1
                w = f_head[f]
                f_head[f] = P[w, F_NEXT]
                if f_head[f] < 0:
                    f_tail[f] = -1
                if hs + 2 > heap.shape[0]:
                    heap = _grow(heap)
                hs = _hpush(heap, hs, now, NORMAL, eid, CB_RESUME, w)
                eid += 1
            continue
        if kind == CB_END or kind == CB_CHECK:
            p = arg
            if kind == CB_END:
                if P[p, F_TYPE] == P_JOIN:
                    result = R_DONE
                    break
                parent = P[p, F_PARENT]
                # the process's record is free again
                P[p, F_NEXT] = free_head
                free_head = p
            else:
                parent = p
            P[parent, F_AO_COUNT] += 1
            if (P[parent, F_AO_ON] == 1 and P[parent, F_AO_TRIG] == 0
                    and P[parent, F_AO_COUNT] == P[parent, F_AO_N]):
                P[parent, F_AO_TRIG] = 1
                if hs + 2 > heap.shape[0]:
                    heap = _grow(heap)
                hs = _hpush(heap, hs, now, NORMAL, eid, CB_RESUME, parent)
                eid += 1
            continue

        # CB_RESUME: run process p until it waits again or returns
        p = arg
        while True:
            if hs + 4 > heap.shape[0]:
                heap = _grow(heap)
            if np_used + 4 > P.shape[0]:
                P = _grow(P)
            if nl + 4 > logs.shape[0]:
                logs = _grow(logs)
            st = P[p, F_STATE]
            # ---------------- engine: Device._engine --------------------------------------
            if st == S_E_NEXT:
                q = P[p, F_Q]
                if P[p, F_POS] >= q_ptr[q + 1]:
                    st = S_END
                else:
                    P[p, F_WK] = 0
                    P[p, F_STATE] = S_E_WAIT
                    continue
            if st == S_E_RESUMED_WAIT:
                blocked[P[p, F_Q], 0] = -1
                blocked[P[p, F_Q], 1] = -1
                P[p, F_STATE] = S_E_WAIT
                continue
            if st == S_E_WAIT:
                i = q_items[P[p, F_POS]]
                k = w_ptr[i] + P[p, F_WK]
                if k < w_ptr[i + 1]:
                    f = w_flag[k]
                    P[p, F_WK] += 1
                    if level[f] < 1:
                        blocked[P[p, F_Q], 0] = i
                        blocked[P[p, F_Q], 1] = f
                        P[p, F_STATE] = S_E_RESUMED_WAIT
                    else:
                        P[p, F_STATE] = S_E_WAIT
                    # Container.get
                    if level[f] >= 1 and f_head[f] < 0:
                        level[f] -= 1
                        hs = _hpush(heap, hs, now, NORMAL, eid, CB_RESUME, p)
                        eid += 1
                    else:
                        P[p, F_NEXT] = -1
                        if f_tail[f] >= 0:
                            P[f_tail[f], F_NEXT] = p
                        else:
                            f_head[f] = p
                        f_tail[f] = p
                        while f_head[f] >= 0 and level[f] >= 1:
                            level[f] -= 1
                            w = f_head[f]
                            f_head[f] = P[w, F_NEXT]
                            if f_head[f] < 0:
                                f_tail[f] = -1
                            if hs + 2 > heap.shape[0]:
                                heap = _grow(heap)
                            hs = _hpush(heap, hs, now, NORMAL, eid, CB_RESUME, w)
                            eid += 1
                    break
                P[p, F_ISTART] = now
                ik = ins[i, I_KIND]
                if ik == K_COMPUTE:
                    P[p, F_STATE] = S_E_FINISH
                    d = ins[i, I_DUR]
                    if d:
                        hs = _hpush(heap, hs, now + d, NORMAL, eid, CB_RESUME, p)
                        eid += 1
                        break
                    continue
                starts[nst] = i
                nst += 1
                if ik == K_DMA:
                    P[p, F_T_RES] = ins[i, I_RES]
                    P[p, F_T_DIR] = ins[i, I_DIR1]
                    P[p, F_T_SRC] = ins[i, I_SRC1]
                    P[p, F_T_DST] = ins[i, I_DST1]
                    P[p, F_T_N] = ins[i, I_N1]
                    P[p, F_CORE] = ins[i, I_CORE]
                    P[p, F_T_RET] = S_E_FINISH
                    P[p, F_STATE] = S_T_START
                    continue
                if ik == K_LINK:
                    P[p, F_L_DIR] = ins[i, I_DIR1]
                    P[p, F_L_N] = ins[i, I_N1]
                    P[p, F_L_RET] = S_E_FINISH
                    P[p, F_STATE] = S_L_START
                    continue
                # K_PAR: all_of([timeout(dur), process(transfer 1), process(transfer 2)])
                nsub = ins[i, I_NSUB]
                P[p, F_AO_COUNT] = 0
                P[p, F_AO_TRIG] = 0
                P[p, F_AO_ON] = 0
                hs = _hpush(heap, hs, now + ins[i, I_DUR], NORMAL, eid, CB_CHECK, p)
                eid += 1
                for s in range(nsub):
                    if free_head >= 0:
                        c = free_head
                        free_head = P[c, F_NEXT]
                    else:
                        c = np_used
                        np_used += 1
                    P[c, F_TYPE] = P_XFER
                    P[c, F_PARENT] = p
                    P[c, F_STATE] = S_T_START
                    P[c, F_T_RET] = S_XFER_RET
                    P[c, F_T_RES] = ins[i, I_RES]
                    P[c, F_CORE] = ins[i, I_CORE]
                    base = I_DIR1 if s == 0 else I_DIR2
                    P[c, F_T_DIR] = ins[i, base]
                    P[c, F_T_SRC] = ins[i, base + 1]
                    P[c, F_T_DST] = ins[i, base + 2]
                    P[c, F_T_N] = ins[i, base + 3]
                    hs = _hpush(heap, hs, now, URGENT, eid, CB_RESUME, c)
                    eid += 1
                P[p, F_AO_N] = 1 + nsub
                P[p, F_AO_ON] = 1
                P[p, F_STATE] = S_E_FINISH
                break
            if st == S_E_FINISH:
                i = q_items[P[p, F_POS]]
                done[nd, 0] = i
                done[nd, 1] = P[p, F_ISTART]
                done[nd, 2] = now
                nd += 1
                if log_level >= 1:
                    logs[nl, 0] = LOG_INS
                    logs[nl, 1] = P[p, F_Q]
                    logs[nl, 2] = i
                    logs[nl, 3] = P[p, F_ISTART]
                    logs[nl, 4] = now
                    nl += 1
                for k in range(s_ptr[i], s_ptr[i + 1]):
                    if hs + 2 > heap.shape[0]:
                        heap = _grow(heap)
                    f = s_flag[k]
                    level[f] += 1
                    hs = _hpush(heap, hs, now, NORMAL, eid, CB_SERVE, f)
                    eid += 1
                P[p, F_POS] += 1
                P[p, F_STATE] = S_E_NEXT
                continue
            # ---------------- join: Device._join ---------------------------------------------
            if st == S_JOIN_INIT:
                if nq == 0:
                    st = S_END
                else:
                    P[p, F_AO_N] = nq
                    P[p, F_AO_ON] = 1
                    if P[p, F_AO_COUNT] == nq:
                        P[p, F_AO_TRIG] = 1
                        hs = _hpush(heap, hs, now, NORMAL, eid, CB_RESUME, p)
                        eid += 1
                    P[p, F_STATE] = S_END
                    break
            # ---------------- DmaEngine.transfer ---------------------------------------------
            if st == S_T_START:
                r = P[p, F_T_RES]
                if res_setup[r]:
                    P[p, F_STATE] = S_T_SETUP_DONE
                    hs = _hpush(heap, hs, now + res_setup[r], NORMAL, eid, CB_RESUME, p)
                    eid += 1
                    break
                st = S_T_SETUP_DONE
            if st == S_T_SETUP_DONE or st == S_T_MULTI_GOT:
                r = P[p, F_T_RES]
                total = P[p, F_T_N]
                chunk = res_chunk[r]
                if st == S_T_SETUP_DONE:
                    if total <= chunk:
                        P[p, F_STATE] = S_T_SINGLE_GOT
                    else:
                        P[p, F_T_OFF] = 0
                        P[p, F_AO_COUNT] = 0
                        P[p, F_AO_TRIG] = 0
                        P[p, F_AO_ON] = 0
                        P[p, F_STATE] = S_T_MULTI_GOT
                else:
                    # a slot is ours: start the chunk at the current offset in its process
                    off = P[p, F_T_OFF]
                    n = min(chunk, total - off)
                    if free_head >= 0:
                        c = free_head
                        free_head = P[c, F_NEXT]
                    else:
                        c = np_used
                        np_used += 1
                    P[c, F_TYPE] = P_CHUNK
                    P[c, F_PARENT] = p
                    P[c, F_STATE] = S_C_START
                    P[c, F_C_RET] = S_CHUNK_RET
                    P[c, F_T_RES] = r
                    P[c, F_CORE] = P[p, F_CORE]
                    P[c, F_C_DIR] = P[p, F_T_DIR]
                    P[c, F_C_SRC] = P[p, F_T_SRC] + off
                    P[c, F_C_DST] = P[p, F_T_DST] + off
                    P[c, F_C_N] = n
                    hs = _hpush(heap, hs, now, URGENT, eid, CB_RESUME, c)
                    eid += 1
                    off += chunk
                    P[p, F_T_OFF] = off
                    if off >= total:
                        nchunks = (total + chunk - 1) // chunk
                        P[p, F_AO_N] = nchunks
                        P[p, F_AO_ON] = 1
                        if P[p, F_AO_COUNT] == nchunks:
                            P[p, F_AO_TRIG] = 1
                            hs = _hpush(heap, hs, now, NORMAL, eid, CB_RESUME, p)
                            eid += 1
                        P[p, F_STATE] = S_T_DONE
                        break
                # Resource.request, then wait for it
                if r_head[r] < 0 and users[r] < res_cap[r]:
                    users[r] += 1
                    hs = _hpush(heap, hs, now, NORMAL, eid, CB_RESUME, p)
                    eid += 1
                else:
                    P[p, F_NEXT] = -1
                    if r_tail[r] >= 0:
                        P[r_tail[r], F_NEXT] = p
                    else:
                        r_head[r] = p
                    r_tail[r] = p
                    if r_head[r] >= 0 and users[r] < res_cap[r]:
                        users[r] += 1
                        h = r_head[r]
                        r_head[r] = P[h, F_NEXT]
                        if r_head[r] < 0:
                            r_tail[r] = -1
                        hs = _hpush(heap, hs, now, NORMAL, eid, CB_RESUME, h)
                        eid += 1
                break
            if st == S_T_SINGLE_GOT:
                P[p, F_C_DIR] = P[p, F_T_DIR]
                P[p, F_C_SRC] = P[p, F_T_SRC]
                P[p, F_C_DST] = P[p, F_T_DST]
                P[p, F_C_N] = P[p, F_T_N]
                P[p, F_C_RET] = S_T_SINGLE_RET
                st = S_C_START
            if st == S_T_SINGLE_RET or st == S_T_DONE:
                P[p, F_STATE] = P[p, F_T_RET]
                continue
            # ---------------- DmaEngine._chunk -----------------------------------------------
            if st == S_C_START:
                P[p, F_C_START] = now
                d = P[p, F_C_DIR]
                n = P[p, F_C_N]
                P[p, F_A_N] = n
                P[p, F_C_PORT] = -1
                if d == D_COPY or d == D_READ:
                    P[p, F_A_ADDR] = P[p, F_C_SRC]
                    P[p, F_A_W] = 0
                elif d == D_WRITE:
                    P[p, F_A_ADDR] = P[p, F_C_DST]
                    P[p, F_A_W] = 1
                else:
                    # Sram.reserve_port: the earliest free port (the lowest index on ties)
                    core = P[p, F_CORE]
                    best = 0
                    for k in range(1, nports):
                        if port_free[core, k] < port_free[core, best]:
                            best = k
                    s0 = max(now, port_free[core, best])
                    port_free[core, best] = s0 + transfer_ps(n, port_bps)
                    P[p, F_C_PORT] = port_free[core, best]
                    if d == D_LOAD:
                        P[p, F_A_ADDR] = P[p, F_C_SRC]
                        P[p, F_A_W] = 0
                    else:
                        P[p, F_A_ADDR] = P[p, F_C_DST]
                        P[p, F_A_W] = 1
                P[p, F_A_RET] = S_C_AFTER_A1
                st = S_A_START
            if st == S_C_AFTER_A1:
                if P[p, F_C_DIR] == D_COPY:
                    P[p, F_A_ADDR] = P[p, F_C_DST]
                    P[p, F_A_W] = 1
                    P[p, F_A_RET] = S_C_AFTER_A2
                    st = S_A_START
                else:
                    st = S_C_AFTER_A2
            if st == S_C_AFTER_A2:
                pd = P[p, F_C_PORT]
                if pd > now:
                    P[p, F_STATE] = S_C_PORT_DONE
                    hs = _hpush(heap, hs, pd, NORMAL, eid, CB_RESUME, p)
                    eid += 1
                    break
                st = S_C_PORT_DONE
            if st == S_C_PORT_DONE:
                r = P[p, F_T_RES]
                users[r] -= 1
                hs = _hpush(heap, hs, now, NORMAL, eid, CB_GRANT, r)
                eid += 1
                if log_level >= 2:
                    logs[nl, 0] = LOG_CHUNK
                    logs[nl, 1] = r
                    logs[nl, 2] = P[p, F_C_DIR]
                    logs[nl, 3] = P[p, F_C_START]
                    logs[nl, 4] = now
                    logs[nl, 5] = P[p, F_C_N]
                    nl += 1
                P[p, F_STATE] = P[p, F_C_RET]
                continue
            # ---------------- Dram.access ----------------------------------------------------
            if st == S_A_START:
                if P[p, F_A_W]:
                    dram_written += P[p, F_A_N]
                else:
                    dram_read += P[p, F_A_N]
                if dram_lat:
                    P[p, F_STATE] = S_A_AFTER_LAT
                    hs = _hpush(heap, hs, now + dram_lat, NORMAL, eid, CB_RESUME, p)
                    eid += 1
                    break
                st = S_A_AFTER_LAT
            if st == S_A_AFTER_LAT:
                a = P[p, F_A_ADDR]
                n = P[p, F_A_N]
                end = now
                u = _plan_index(plan_keys, (a % stripe) * key_mul + n)
                if u < 0:
                    raise RuntimeError("program loop: a DRAM access has no chunk plan")
                for k in range(plan_ptr[u], plan_ptr[u + 1]):
                    c = plan_ch[k]
                    s0 = dram_free[c]
                    if s0 < now:
                        s0 = now
                    stop = s0 + plan_dur[k]
                    dram_free[c] = stop
                    if stop > end:
                        end = stop
                    if log_level >= 1:
                        if nl + 1 > logs.shape[0]:
                            logs = _grow(logs)
                        logs[nl, 0] = LOG_DRAM
                        logs[nl, 1] = c
                        logs[nl, 2] = s0
                        logs[nl, 3] = stop
                        logs[nl, 4] = plan_b[k]
                        logs[nl, 5] = P[p, F_A_W]
                        nl += 1
                if end > now:
                    P[p, F_STATE] = S_A_DONE
                    hs = _hpush(heap, hs, end, NORMAL, eid, CB_RESUME, p)
                    eid += 1
                    break
                st = S_A_DONE
            if st == S_A_DONE:
                P[p, F_STATE] = P[p, F_A_RET]
                continue
            # ---------------- HostLink.transfer (pcie) ---------------------------------------
            if st == S_L_START:
                P[p, F_L_OFF] = 0
                P[p, F_L_DONE] = 0
                if link_lat:
                    P[p, F_STATE] = S_L_CHUNK
                    hs = _hpush(heap, hs, now + link_lat, NORMAL, eid, CB_RESUME, p)
                    eid += 1
                    break
                st = S_L_CHUNK
            if st == S_L_CHUNK:
                off = P[p, F_L_OFF]
                n = P[p, F_L_N]
                if off >= n:
                    P[p, F_STATE] = P[p, F_L_RET]
                    continue
                ld = P[p, F_L_DIR]
                nn = min(link_chunk, n - off)
                end_ps = transfer_ps(off + nn, link_bps[ld])
                dur = end_ps - P[p, F_L_DONE]
                P[p, F_L_DONE] = end_ps
                s0 = max(now, link_free[ld])
                link_free[ld] = s0 + dur
                P[p, F_L_START] = s0
                P[p, F_L_NN] = nn
                P[p, F_A_N] = dur  # the chunk's duration, for the second timeout
                if s0 > now:
                    P[p, F_STATE] = S_L_AFTER_WAIT
                    hs = _hpush(heap, hs, s0, NORMAL, eid, CB_RESUME, p)
                    eid += 1
                    break
                st = S_L_AFTER_WAIT
            if st == S_L_AFTER_WAIT:
                P[p, F_STATE] = S_L_AFTER_CHUNK
                hs = _hpush(heap, hs, now + P[p, F_A_N], NORMAL, eid, CB_RESUME, p)
                eid += 1
                break
            if st == S_L_AFTER_CHUNK:
                if log_level >= 1:
                    logs[nl, 0] = LOG_LINK
                    logs[nl, 1] = P[p, F_L_DIR]
                    logs[nl, 2] = P[p, F_L_START]
                    logs[nl, 3] = now
                    logs[nl, 4] = P[p, F_L_NN]
                    nl += 1
                P[p, F_L_OFF] += link_chunk
                P[p, F_STATE] = S_L_CHUNK
                continue
            # ---------------- returns ----------------------------------------------------------
            if st == S_XFER_RET or st == S_CHUNK_RET:
                st = S_END
            if st == S_END:
                # the process's own event: its parent's all_of counts it when processed
                hs = _hpush(heap, hs, now, NORMAL, eid, CB_END, p)
                eid += 1
                P[p, F_STATE] = -1
                break
            raise RuntimeError("program loop: unknown process state")

    return (result, now, eid, dram_read, dram_written, done, nd, starts, nst, logs, nl,
            blocked, hs)
