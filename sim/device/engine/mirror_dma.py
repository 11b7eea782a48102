"""The array loop's DMA processes: ``DmaEngine.transfer``, ``DmaEngine._chunk`` and
``Dram.access`` (``sim/device/components``) as state machines over the loop's arrays.

Each step runs process ``p`` from its state until it waits (``WAITS``) or hands over to
another state (``GO_ON``), returning ``(heap size, next insertion id, log rows, what, 0)``
as :mod:`sim.device.engine.mirror_queue`'s steps do. The timing is the components' rules,
called where the generators call them: the set-up latency, chunking and slots of the
engine (``dma.setup_ps``, ``one_chunk``, ``chunk_bytes_at``), the SRAM port
(``sram.reserve_port``), a chunk's DRAM accesses (``dma.uses_port``,
``dma.chunk_access``) and the DRAM chunk (``dram.chunk_spans``, in
:func:`sim.device.engine.loopdefs.dram_access`).
"""

from __future__ import annotations

from numba import njit

from sim.device.components.dma import chunk_access, chunk_bytes_at, one_chunk, uses_port
from sim.device.components.sram import reserve_port
from sim.device.engine import loopdefs as lp
from sim.device.engine import loopprocs as kp


@njit(cache=True, error_model="numpy", inline="always")
def transfer_step(p, now, hs, eid, nl, ls, dma):
    """``DmaEngine.transfer``: the set-up latency, then one chunk in this process or each
    chunk in a process of its own as a slot falls free, then all of them."""
    P, heap = ls.P, ls.heap
    st = P[p, lp.F_STATE]
    r = P[p, lp.F_T_RES]
    if st == lp.S_T_START:
        if dma.setup_ps[r]:
            P[p, lp.F_STATE] = lp.S_T_SETUP_DONE
            hs, eid = lp.push(heap, hs, eid, now + dma.setup_ps[r], lp.NORMAL, lp.CB_RESUME, p)
            return hs, eid, nl, lp.WAITS, 0
        st = lp.S_T_SETUP_DONE
    if st == lp.S_T_SETUP_DONE or st == lp.S_T_MULTI_GOT:
        total = P[p, lp.F_T_N]
        chunk = dma.chunk_bytes[r]
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
            c = kp.spawn(P, ls.sc)
            P[c, lp.F_TYPE] = lp.P_CHUNK
            P[c, lp.F_PARENT] = p
            P[c, lp.F_STATE] = lp.S_C_START
            P[c, lp.F_C_RET] = lp.S_CHUNK_RET
            P[c, lp.F_T_RES] = r
            P[c, lp.F_CORE] = P[p, lp.F_CORE]
            P[c, lp.F_C_DIR] = P[p, lp.F_T_DIR]
            P[c, lp.F_C_SRC] = P[p, lp.F_T_SRC] + off
            P[c, lp.F_C_DST] = P[p, lp.F_T_DST] + off
            P[c, lp.F_C_N] = chunk_bytes_at(off, total, chunk)
            hs, eid = lp.push(heap, hs, eid, now, lp.URGENT, lp.CB_RESUME, c)
            off += chunk
            P[p, lp.F_T_OFF] = off
            if off >= total:  # all_of(the chunks' processes)
                hs, eid = kp.wait_all(heap, hs, eid, now, P, p, (total + chunk - 1) // chunk)
                P[p, lp.F_STATE] = lp.S_T_DONE
                return hs, eid, nl, lp.WAITS, 0
        # Resource.request, then wait for it
        if ls.r_head[r] < 0 and ls.users[r] < dma.cap[r]:
            ls.users[r] += 1
            hs, eid = lp.push(heap, hs, eid, now, lp.NORMAL, lp.CB_RESUME, p)
        else:
            kp.enqueue(P, ls.r_head, ls.r_tail, r, p)
            hs, eid = kp.grant(heap, hs, eid, now, r, ls.users, dma.cap, ls.r_head, ls.r_tail,
                               P)
        return hs, eid, nl, lp.WAITS, 0
    if st == lp.S_T_SINGLE_GOT:  # the one chunk, run in this process
        P[p, lp.F_C_DIR] = P[p, lp.F_T_DIR]
        P[p, lp.F_C_SRC] = P[p, lp.F_T_SRC]
        P[p, lp.F_C_DST] = P[p, lp.F_T_DST]
        P[p, lp.F_C_N] = P[p, lp.F_T_N]
        P[p, lp.F_C_RET] = lp.S_T_SINGLE_RET
        P[p, lp.F_STATE] = lp.S_C_START
        return hs, eid, nl, lp.GO_ON, 0
    # S_T_SINGLE_RET or S_T_DONE: the transfer is done
    P[p, lp.F_STATE] = P[p, lp.F_T_RET]
    return hs, eid, nl, lp.GO_ON, 0


@njit(cache=True, error_model="numpy", inline="always")
def chunk_step(p, now, hs, eid, nl, ls, sram, log_level):
    """``DmaEngine._chunk``: the SRAM port booked (loads and stores), the chunk's DRAM
    accesses in turn, the port's end, then its slot released."""
    P, heap = ls.P, ls.heap
    st = P[p, lp.F_STATE]
    if st == lp.S_C_START:
        P[p, lp.F_C_START] = now
        P[p, lp.F_A_N] = P[p, lp.F_C_N]
        P[p, lp.F_C_PORT] = -1
        if uses_port(P[p, lp.F_C_DIR]):
            P[p, lp.F_C_PORT] = reserve_port(sram.port_free[P[p, lp.F_CORE]], now,
                                             P[p, lp.F_C_N], sram.port_bytes_per_s)
        P[p, lp.F_C_K] = 0
        st = lp.S_C_NEXT
    if st == lp.S_C_NEXT:
        addr, w = chunk_access(P[p, lp.F_C_DIR], P[p, lp.F_C_K], P[p, lp.F_C_SRC],
                               P[p, lp.F_C_DST])
        if addr >= 0:  # the next access, in this process
            P[p, lp.F_A_ADDR] = addr
            P[p, lp.F_A_W] = w
            P[p, lp.F_C_K] += 1
            P[p, lp.F_A_RET] = lp.S_C_NEXT
            P[p, lp.F_STATE] = lp.S_A_START
            return hs, eid, nl, lp.GO_ON, 0
        pd = P[p, lp.F_C_PORT]
        if pd > now:
            P[p, lp.F_STATE] = lp.S_C_PORT_DONE
            hs, eid = lp.push(heap, hs, eid, pd, lp.NORMAL, lp.CB_RESUME, p)
            return hs, eid, nl, lp.WAITS, 0
    # S_C_PORT_DONE: Resource.release
    r = P[p, lp.F_T_RES]
    ls.users[r] -= 1
    hs, eid = lp.push(heap, hs, eid, now, lp.NORMAL, lp.CB_GRANT, r)
    if log_level >= 2:
        nl = lp.log_row(ls.logs, nl, lp.LOG_CHUNK, r, P[p, lp.F_C_DIR], P[p, lp.F_C_START],
                        now, P[p, lp.F_C_N])
    P[p, lp.F_STATE] = P[p, lp.F_C_RET]
    return hs, eid, nl, lp.GO_ON, 0


@njit(cache=True, error_model="numpy", inline="always")
def access_step(p, now, hs, eid, nl, ls, dram, log_level):
    """``Dram.access``: the bytes counted, the access latency, then the chunk timed on the
    channels (the DRAM's rule) and its end."""
    P, heap, sc = ls.P, ls.heap, ls.sc
    st = P[p, lp.F_STATE]
    if st == lp.S_A_START:
        sc[lp.SC_DWRITE if P[p, lp.F_A_W] else lp.SC_DREAD] += P[p, lp.F_A_N]
        if dram.latency_ps:
            P[p, lp.F_STATE] = lp.S_A_AFTER_LAT
            hs, eid = lp.push(heap, hs, eid, now + dram.latency_ps, lp.NORMAL, lp.CB_RESUME, p)
            return hs, eid, nl, lp.WAITS, 0
        st = lp.S_A_AFTER_LAT
    if st == lp.S_A_AFTER_LAT:
        end, nl = lp.dram_access(
            now, P[p, lp.F_A_ADDR], P[p, lp.F_A_N], P[p, lp.F_A_W], dram.protocol,
            dram.granule, dram.channel_bytes_per_s, dram.tck_ps, dram.params, dram.open_row,
            dram.act_ok, dram.pre_ok, dram.cas_ok, dram.faw, dram.scalars, dram.next_ref,
            dram.per_channel, dram.free, dram.spans, ls.logs, nl, log_level)
        if end > now:
            P[p, lp.F_STATE] = lp.S_A_DONE
            hs, eid = lp.push(heap, hs, eid, end, lp.NORMAL, lp.CB_RESUME, p)
            return hs, eid, nl, lp.WAITS, 0
    # S_A_DONE
    P[p, lp.F_STATE] = P[p, lp.F_A_RET]
    return hs, eid, nl, lp.GO_ON, 0
