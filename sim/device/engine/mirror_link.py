"""The array loop's host link process: ``HostLink.transfer`` (``sim/device/components/
link.py``, both kinds) as a state machine over the loop's arrays.

A step returns as :mod:`sim.device.engine.mirror_queue`'s do. The timing is the link's
rules, called where the generator calls them: each chunk's bytes, start (first come, first
served per direction) and telescoping duration (``link.link_chunk``) and, over shared
DRAM, the direction held until the chunk's DRAM read and write are done too
(``link.link_chunk_done``).
"""

from __future__ import annotations

from numba import njit

from sim.device.components.link import PCIE, link_chunk, link_chunk_done
from sim.device.engine import loopdefs as lp
from sim.device.engine import loopprocs as kp


@njit(cache=True, error_model="numpy", inline="always")
def link_step(p, now, hs, eid, nl, ls, link, log_level):
    """``HostLink.transfer``: the latency, then chunk by chunk: wait for the direction,
    then the chunk's time (PCIe), or the host's copy time beside its DRAM read and write
    (shared DRAM: all_of a timeout and two access processes)."""
    P, heap = ls.P, ls.heap
    st = P[p, lp.F_STATE]
    if st == lp.S_L_START:
        P[p, lp.F_L_OFF] = 0
        P[p, lp.F_L_DONE] = 0
        if link.latency_ps:
            P[p, lp.F_STATE] = lp.S_L_CHUNK
            hs, eid = lp.push(heap, hs, eid, now + link.latency_ps, lp.NORMAL, lp.CB_RESUME, p)
            return hs, eid, nl, lp.WAITS, 0
        st = lp.S_L_CHUNK
    if st == lp.S_L_CHUNK:
        off = P[p, lp.F_L_OFF]
        n = P[p, lp.F_L_N]
        if off >= n:  # the transfer is done
            P[p, lp.F_STATE] = P[p, lp.F_L_RET]
            return hs, eid, nl, lp.GO_ON, 0
        ld = P[p, lp.F_L_DIR]
        nn, s0, dur, end_ps = link_chunk(link.free, ld, now, off, n, link.chunk_bytes,
                                         link.bytes_per_s[ld], P[p, lp.F_L_DONE])
        P[p, lp.F_L_DONE] = end_ps
        P[p, lp.F_L_START] = s0
        P[p, lp.F_L_NN] = nn
        P[p, lp.F_A_N] = dur  # the chunk's duration, for the second timeout
        if s0 > now:
            P[p, lp.F_STATE] = lp.S_L_AFTER_WAIT
            hs, eid = lp.push(heap, hs, eid, s0, lp.NORMAL, lp.CB_RESUME, p)
            return hs, eid, nl, lp.WAITS, 0
        st = lp.S_L_AFTER_WAIT
    if st == lp.S_L_AFTER_WAIT:
        P[p, lp.F_STATE] = lp.S_L_AFTER_CHUNK
        if link.kind == PCIE:
            hs, eid = lp.push(heap, hs, eid, now + P[p, lp.F_A_N], lp.NORMAL, lp.CB_RESUME, p)
            return hs, eid, nl, lp.WAITS, 0
        # a host memcpy: all_of([timeout(the CPU's time), process(DRAM read),
        # process(DRAM write)]) of the chunk's bytes at its DRAM address
        P[p, lp.F_AO_COUNT] = 0
        P[p, lp.F_AO_TRIG] = 0
        P[p, lp.F_AO_ON] = 0
        hs, eid = lp.push(heap, hs, eid, now + P[p, lp.F_A_N], lp.NORMAL, lp.CB_CHECK, p)
        for w in range(2):
            c = kp.spawn(P, ls.sc)
            P[c, lp.F_TYPE] = lp.P_ACCESS
            P[c, lp.F_PARENT] = p
            P[c, lp.F_STATE] = lp.S_A_START
            P[c, lp.F_A_RET] = lp.S_ACCESS_RET
            P[c, lp.F_A_ADDR] = P[p, lp.F_L_ADDR] + P[p, lp.F_L_OFF]
            P[c, lp.F_A_N] = P[p, lp.F_L_NN]
            P[c, lp.F_A_W] = w
            hs, eid = lp.push(heap, hs, eid, now, lp.URGENT, lp.CB_RESUME, c)
        P[p, lp.F_AO_N] = 3
        P[p, lp.F_AO_ON] = 1
        return hs, eid, nl, lp.WAITS, 0
    # S_L_AFTER_CHUNK: the chunk is done
    if link.kind != PCIE:
        link_chunk_done(link.free, P[p, lp.F_L_DIR], now)
    if log_level >= 1:
        nl = lp.log_row(ls.logs, nl, lp.LOG_LINK, P[p, lp.F_L_DIR], P[p, lp.F_L_START], now,
                        P[p, lp.F_L_NN], 0)
    P[p, lp.F_L_OFF] += link.chunk_bytes
    P[p, lp.F_STATE] = lp.S_L_CHUNK
    return hs, eid, nl, lp.GO_ON, 0
