"""DRAM protocol model: DRAM time per access from the JEDEC timing, not one efficiency.

The engine times every DMA chunk with it when ``dram.model = "protocol"`` (the ``aries``
preset): the DRAM component's chunk rule (``sim/device/components/dram.py``) calls
:data:`chunk_channels_ck` once per chunk, whichever engine runs it. The step reads a
channel's timing in whole cycles (:class:`~sim.device.dram.cycles.ProtocolTiming`, from the
standard's timing file: ``standards.py``); the description below uses LPDDR4X's names.

Address mapping (``dram.timing.address_mapping``, an assumption): the
channel is ``(addr // interleave_bytes) % channels`` as in ``sim/device/components/dram.py``; the
channel-local address keeps the granules of that channel back to back, and splits as
``row | bank | column`` (high to low): one page (row) of ``page_bytes``, then the same
columns of the next bank, and so on. ``"row:bank^row:column"`` hashes the bank: the bank
bits XOR the low bits of the row, so strides of a whole number of bank sets spread over
several banks instead of hitting one.

Per channel the model tracks, in whole channel clock cycles (nCK, ``tCK = 2 / data rate``):
the open row of each bank, the earliest ACTIVATE / column command / PRECHARGE per bank
(tRCD, tRAS, tRP, tRTP, tWR), the last ACTIVATE and the last four (tRRD, tFAW), when the data
bus takes the next column command (tCCD = BL/2), the direction of the last one (read-to-write
and write-to-read turnaround) and the next all-bank refresh (tRFCab every tREFI, after a
precharge-all, tRPab). A chunk is cut into pieces that stay in one granule and one row; each
piece is one row hit or one activation, then ``bursts`` column commands back to back: a short
loop per chunk, no per-burst events. Activations issue as early as their constraints allow
(an ideal open-page controller that looks ahead), so a sequential stream hides them behind
the data of the open rows. The command bus is not modelled: an ACTIVATE and a column command
take 4 cycles each (two 2-cycle commands, JESD209-4 command truth table) and a piece of
``b >= 1`` bursts needs ``4 + 4b <= 8b`` cycles of it, never more than its data takes.

The access patterns, their closed forms and the per-pattern summary are in
:mod:`sim.device.dram.patterns`.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from sim.device.dram.cycles import (
    P_BANKS,
    P_BURST,
    P_CCD,
    P_CH,
    P_FAW,
    P_GRAN,
    P_PAGE,
    P_PAGES_R,
    P_PAGES_W,
    P_RAS,
    P_RCD,
    P_RDONE,
    P_REFI,
    P_RFC,
    P_RPAB,
    P_RPPB,
    P_RRD,
    P_RTP2PRE,
    P_RTW,
    P_RUN,
    P_SH_BANKS,
    P_SH_BURST,
    P_SH_CH,
    P_SH_GRAN,
    P_SH_PAGE,
    P_WDONE,
    P_WR2PRE,
    P_WTRG,
    P_XOR,
    ChannelState,
    ProtocolTiming,
)
from sim.device.dram.standards import timing_from_config

# --- the per-chunk model -------------------------------------------------------------------

@njit(cache=True, inline="always")
def _refresh_until(p, c, start, open_row, act_ok, pre_ok, next_ref):
    """Do the all-bank refreshes due by ``start`` on channel ``c``: precharge-all once every
    bank may close, tRPab, then tRFCab; every bank is closed afterwards."""
    refi = p[P_REFI]
    if start < next_ref[c]:
        return
    # Refreshes that fell wholly in idle time cost nothing but close the rows.
    # (the division only then: one is tens of cycles, and most refreshes fall due in work)
    if start - next_ref[c] >= refi:
        next_ref[c] += (start - next_ref[c]) // refi * refi
    while start >= next_ref[c]:
        prea = next_ref[c]
        for k in range(p[P_BANKS]):
            if open_row[c, k] >= 0 and pre_ok[c, k] > prea:
                prea = pre_ok[c, k]
        done = prea + p[P_RPAB] + p[P_RFC]
        for k in range(p[P_BANKS]):
            open_row[c, k] = -1
            if act_ok[c, k] < done:
                act_ok[c, k] = done
        next_ref[c] += refi


# A refresh falls due about once per tREFI (thousands of cycles, tens of row runs): the
# channel step calls it, without reference counting, so that its loops stay out of the
# step's hot loop (the captured decode step's DRAM steps: 29.7 -> 28.0 ms).
@njit(cache=True, error_model="numpy", _nrt=False)
def _refresh_call(p, c, start, open_row, act_ok, pre_ok, next_ref):
    """:func:`_refresh_until`, called."""
    _refresh_until(p, c, start, open_row, act_ok, pre_ok, next_ref)


@njit(cache=True)
def _piece_ck(p, c, bank, row, at_run_start, bursts, nbytes, w, t0, open_row, act_ok, pre_ok,
              cas_ok, faw, sc, next_ref, per_ch):
    """One piece of channel ``c`` inside one granule and one row run (row ``row`` of bank
    ``bank``; ``at_run_start``: it begins at a row-run boundary inside the row; ``bursts``
    column commands for ``nbytes``): the refreshes due, a row hit or an ACTIVATE, then its
    bursts back to back. Updates the state arrays and ``per_ch[c]``; returns the cycle its
    last data has moved."""
    ccd = p[P_CCD]
    start = max(t0, sc[c, 2])
    _refresh_until(p, c, start, open_row, act_ok, pre_ok, next_ref)
    # another master's access closed the row at a run boundary inside it
    reopen = at_run_start and open_row[c, bank] == row
    if open_row[c, bank] != row or reopen:
        act_min = max(act_ok[c, bank], t0)
        if open_row[c, bank] >= 0:  # close the other row first
            act_min = max(act_min, max(pre_ok[c, bank], t0) + p[P_RPPB])
        pos = sc[c, 0]
        t_act = max(act_min, sc[c, 1] + p[P_RRD], faw[c, pos] + p[P_FAW])
        faw[c, pos] = t_act
        sc[c, 0] = pos + 1 if pos < 3 else 0  # the ring of the last four ACTIVATEs
        sc[c, 1] = t_act
        open_row[c, bank] = row
        cas_ok[c, bank] = t_act + p[P_RCD]
        pre_ok[c, bank] = t_act + p[P_RAS]
    t_cas = max(cas_ok[c, bank], sc[c, 2], t0)
    if sc[c, 4] == 0 and w == 1:
        t_cas = max(t_cas, sc[c, 3] + p[P_RTW])
    elif sc[c, 4] == 1 and w == 0:
        t_cas = max(t_cas, sc[c, 3] + p[P_WTRG])
    t_last = t_cas + (bursts - 1) * ccd
    sc[c, 2] = t_last + ccd
    sc[c, 3] = t_last
    sc[c, 4] = w
    close = t_last + (p[P_WR2PRE] if w == 1 else p[P_RTP2PRE])
    if close > pre_ok[c, bank]:
        pre_ok[c, bank] = close
    # the data ends the standard's READ (WRITE) command-to-last-data time later
    done = t_last + (p[P_WDONE] if w == 1 else p[P_RDONE])
    if per_ch[c, 0] == 0:
        per_ch[c, 1] = t_cas
        per_ch[c, 2] = done
    elif done > per_ch[c, 2]:
        per_ch[c, 2] = done
    per_ch[c, 0] += nbytes
    return done


@njit(cache=True)
def _chunk_end_ck(p, open_row, act_ok, pre_ok, cas_ok, faw, sc, next_ref, addr, nbytes,
                  is_write, t0, per_ch):
    """The reference: cycle at which the last data of ``[addr, addr + nbytes)`` has moved,
    for a request that arrives at cycle ``t0``, piece by piece in address order (each
    granule, page and row run a piece), the mapping computed afresh for every piece;
    updates the state arrays. ``per_ch`` (channels x 3, int64) receives per channel the
    bytes moved, the first column command's cycle and the cycle its last data has moved
    (bytes 0: untouched)."""
    per_ch[:, 0] = 0
    chans, gran, page, bb = p[P_CH], p[P_GRAN], p[P_PAGE], p[P_BURST]
    banks, run = p[P_BANKS], p[P_RUN]
    w = 1 if is_write else 0
    end = addr + nbytes
    done_all = t0
    a = addr
    while a < end:
        g = a // gran
        c = g % chans
        ca = (g // chans) * gran + (a - g * gran)  # channel-local address
        in_row = ca % page
        piece_end = min(end, (g + 1) * gran, a + (page - in_row), a + (run - in_row % run))
        ca_end = ca + (piece_end - a)
        row_idx = ca // page
        bank = row_idx % banks
        row = row_idx // banks
        if p[P_XOR]:
            bank ^= row % banks
        bursts = (ca_end - 1) // bb - ca // bb + 1
        done = _piece_ck(p, c, bank, row, in_row % run == 0 and in_row != 0, bursts,
                         piece_end - a, w, t0, open_row, act_ok, pre_ok, cas_ok, faw, sc,
                         next_ref, per_ch)
        if done > done_all:
            done_all = done
        a = piece_end
    return done_all


@njit(cache=True, inline="always")
def _div(x, d, shift):
    """``x // d`` for ``x >= 0``: a shift when ``d`` is a power of two (``shift >= 0``)."""
    return x >> shift if shift >= 0 else x // d


# The fast step: no division-by-zero checks (every divisor is a validated positive size, and
# ``timing_from_config`` checks tREFI), and the channel step inlined into the chunk step. Both
# matter because the step runs once per DMA chunk: the checks' raise paths keep Numba from
# pruning the reference counting of the nine state arrays (an atomic add each, per call).
@njit(cache=True, error_model="numpy", inline="always")
def _channel_run_ck(p, c, lo, hi, w, t0, open_row, act_ok, pre_ok, cas_ok, faw, sc,
                    next_ref, per_ch):
    """Channel ``c``'s share of a chunk, the contiguous local range ``[lo, hi)``: the same
    pieces as the reference in the same order, each the same step as :func:`_piece_ck`, with
    the row, bank, run and granule boundaries stepped instead of divided out and the
    channel's scalars (bus, last ACTIVATE and column command, direction, refresh, what
    ``per_ch[c]`` receives) held in locals. A piece that does not begin a row run is a row
    hit whose bursts follow the bus back to back (its bank's tRCD and the direction were
    settled by the run's first piece), unless a refresh is due at its start; so when the
    granule boundaries fall between bursts and no refresh is due at the start of a run's
    last piece, the run's remaining pieces are one step (their bursts back to back from the
    bus): one step per row run instead of one per granule piece."""
    gran, page, run, bb, ccd, banks = (p[P_GRAN], p[P_PAGE], p[P_RUN], p[P_BURST],
                                       p[P_CCD], p[P_BANKS])
    rrd, faw_ck, rcd, ras, rppb = p[P_RRD], p[P_FAW], p[P_RCD], p[P_RAS], p[P_RPPB]
    xor = p[P_XOR] != 0
    whole = gran % bb == 0  # granule boundaries fall between bursts
    shift, sg, sp, sb = p[P_SH_BURST], p[P_SH_GRAN], p[P_SH_PAGE], p[P_SH_BANKS]
    to_pre = p[P_WR2PRE] if w == 1 else p[P_RTP2PRE]
    lat = p[P_WDONE] if w == 1 else p[P_RDONE]
    turn = 0  # the spacing from the last column command when the direction changes
    if sc[c, 4] == 0 and w == 1:
        turn = p[P_RTW]
    elif sc[c, 4] == 1 and w == 0:
        turn = p[P_WTRG]
    pos, last_act, bus, last_cas = sc[c, 0], sc[c, 1], sc[c, 2], sc[c, 3]
    nref = next_ref[c]
    # The bank state is indexed by unsigned copies of the channel and bank: Numba wraps a
    # signed index around (a compare and an add per index, a dozen accesses per row run)
    # and an unsigned one it takes as it is (both are >= 0 here).
    uc = np.uintp(c)
    # Whole rows in closed form (below), from a channel state whose last four ACTIVATEs are
    # no later than the last one (every state the steps leave; each ACTIVATE is no earlier
    # than the one before, so the share keeps it so).
    pages = p[P_PAGES_W if w == 1 else P_PAGES_R] != 0 and max(
        faw[uc, 0], faw[uc, 1], faw[uc, 2], faw[uc, 3]) <= last_act
    first_cas = -1
    last_done = t0
    row_idx = _div(lo, page, sp)
    row_start = row_idx * page
    row = _div(row_idx, banks, sb)
    bank_lin = row_idx - row * banks  # the bank before hashing
    row_mod = row - _div(row, banks, sb) * banks
    run_start = (lo - row_start) // run * run  # in-row offsets of the current run
    run_end = min(page, run_start + run)
    g_next = 0  # the next granule boundary after a (set where the pieces' path begins)
    a = lo
    while True:
        seg_end = min(hi, row_start + run_end)
        bank = bank_lin ^ row_mod if xor else bank_lin
        ub = np.uintp(bank)
        at_run = turn == 0 and a - row_start == run_start  # a run's start, no turnaround
        if pages and at_run and (run_start != 0 or open_row[uc, ub] != row):
            # The run opens its row (or reopens it at a run boundary): its ACTIVATE and first
            # column command as the pieces' first step takes them, its bursts as the
            # whole-run step does. Each next run of the same row is then in closed form: its
            # ACTIVATE tRTP (tWR) + tRPpb after the last column command before it, its bursts
            # from tRCD later (pages_in_closed_form: nothing else binds, for the run before
            # is a full one). A run by whose last column command a refresh falls due is left
            # to the steps below, untouched.
            act_min = max(act_ok[uc, ub], t0)
            if open_row[uc, ub] >= 0:
                act_min = max(act_min, max(pre_ok[uc, ub], t0) + rppb)
            t_act = max(act_min, last_act + rrd, faw[uc, np.uintp(pos)] + faw_ck)
            t_cas = max(t_act + rcd, bus, t0)
            lc = t_cas + (_div(seg_end - 1, bb, shift) - _div(a, bb, shift)) * ccd
            if lc < nref:
                if first_cas < 0:
                    first_cas = t_cas
                faw[uc, np.uintp(pos)] = t_act
                pos = pos + 1 if pos < 3 else 0
                open_row[uc, ub] = row
                a = seg_end
                while a < hi and run_end < page:
                    nxt_end = min(page, run_end + run)
                    nxt_hi = min(hi, row_start + nxt_end)
                    act_n = lc + to_pre + rppb
                    lc_n = act_n + rcd + (_div(nxt_hi - 1, bb, shift) - _div(a, bb, shift)) * ccd
                    if lc_n >= nref:
                        break
                    t_act = act_n
                    lc = lc_n
                    faw[uc, np.uintp(pos)] = t_act
                    pos = pos + 1 if pos < 3 else 0
                    a = nxt_hi
                    run_start = run_end
                    run_end = nxt_end
                last_act = t_act
                cas_ok[uc, ub] = t_act + rcd
                pre_ok[uc, ub] = max(t_act + ras, lc + to_pre)
                last_cas = lc
                bus = lc + ccd
                if lc + lat > last_done:
                    last_done = lc + lat
        elif whole and at_run and max(t0, bus) < nref:
            # The run in one step, the pieces' first step and the whole-run step below with
            # what cannot happen here left out: ``a`` is the run's start and no turnaround is
            # pending. Taken only if no refresh falls due by its last column command; else
            # nothing is changed and the pieces' path does the run.
            o = open_row[uc, ub]
            opens = o != row or run_start != 0
            if opens:
                act_min = max(act_ok[uc, ub], t0)
                if o >= 0:
                    act_min = max(act_min, max(pre_ok[uc, ub], t0) + rppb)
                t_act = max(act_min, last_act + rrd, faw[uc, np.uintp(pos)] + faw_ck)
                cas_b = t_act + rcd
                pre_b = t_act + ras
            else:
                t_act = 0
                cas_b = cas_ok[uc, ub]
                pre_b = pre_ok[uc, ub]
            t_cas = max(cas_b, bus, t0)
            lc = t_cas + (_div(seg_end - 1, bb, shift) - _div(a, bb, shift)) * ccd
            if lc < nref:
                if opens:
                    faw[uc, np.uintp(pos)] = t_act
                    pos = pos + 1 if pos < 3 else 0
                    last_act = t_act
                    open_row[uc, ub] = row
                    cas_ok[uc, ub] = cas_b
                pre_ok[uc, ub] = max(pre_b, lc + to_pre)
                last_cas = lc
                bus = lc + ccd
                if lc + lat > last_done:
                    last_done = lc + lat
                if first_cas < 0:
                    first_cas = t_cas
                a = seg_end
        if a < seg_end:
            g_next = (_div(a, gran, sg) + 1) * gran  # the next granule boundary after a
        head = True
        while a < seg_end:
            sub = min(seg_end, g_next)
            if head or bus >= nref:
                start = max(t0, bus)
                if start >= nref:
                    _refresh_call(p, c, start, open_row, act_ok, pre_ok, next_ref)
                    nref = next_ref[c]
                in_row = a - row_start
                if open_row[uc, ub] != row or (head and in_row == run_start and in_row != 0):
                    act_min = max(act_ok[uc, ub], t0)
                    if open_row[uc, ub] >= 0:  # close the other row (or this one) first
                        act_min = max(act_min, max(pre_ok[uc, ub], t0) + rppb)
                    t_act = max(act_min, last_act + rrd, faw[uc, np.uintp(pos)] + faw_ck)
                    faw[uc, np.uintp(pos)] = t_act
                    pos = pos + 1 if pos < 3 else 0
                    last_act = t_act
                    open_row[uc, ub] = row
                    cas_ok[uc, ub] = t_act + rcd
                    pre_ok[uc, ub] = t_act + ras
                t_cas = max(cas_ok[uc, ub], bus, t0)
                if turn and t_cas < last_cas + turn:
                    t_cas = last_cas + turn
                turn = 0
                if first_cas < 0:
                    first_cas = t_cas
                head = False
            else:
                t_cas = bus
            if whole and sub < seg_end:
                # The rest of the row run in this one step: its granule pieces' bursts add up
                # to the bursts of [a, seg_end) (the boundaries fall between bursts), each
                # piece follows the bus, and no refresh falls due at a piece's start if none
                # is due at the start of the last one (the bus only moves forward).
                last_start = _div(seg_end - 1, gran, sg) * gran
                if t_cas + (_div(last_start, bb, shift) - _div(a, bb, shift)) * ccd < nref:
                    sub = seg_end
                elif nref > t_cas:
                    # Else the pieces before the one at whose start the refresh falls due in
                    # one step: each follows the bus and meets no refresh at its start (the
                    # first such start is the first granule boundary whose bursts from ``a``
                    # reach nref).
                    x = (_div(a, bb, shift) + (nref - t_cas + ccd - 1) // ccd) * bb
                    sub = max(sub, min(last_start, _div(x + gran - 1, gran, sg) * gran))
            if sub >= g_next:
                g_next = (_div(sub, gran, sg) + 1) * gran
            more = _div(sub - 1, bb, shift) - _div(a, bb, shift)
            last_cas = t_cas + more * ccd
            bus = last_cas + ccd
            if last_cas + to_pre > pre_ok[uc, ub]:
                pre_ok[uc, ub] = last_cas + to_pre
            if last_cas + lat > last_done:
                last_done = last_cas + lat
            a = sub
        if a >= hi:
            break
        if run_end == page:  # the next row index: the next bank, or row + 1 of bank 0
            row_start += page
            bank_lin += 1
            if bank_lin == banks:
                bank_lin = 0
                row += 1
                row_mod = row_mod + 1 if row_mod + 1 < banks else 0
            run_start = 0
        else:
            run_start = run_end
        run_end = min(page, run_start + run)
    sc[c, 0], sc[c, 1], sc[c, 2], sc[c, 3], sc[c, 4] = pos, last_act, bus, last_cas, w
    per_ch[c, 0] = hi - lo
    per_ch[c, 1] = first_cas
    per_ch[c, 2] = last_done
    return last_done


# Without reference counting (it allocates nothing): a call to it from other jitted code
# then costs no atomic increment and decrement of its nine arrays (sim/device/engine/loopdefs.py).
@njit(cache=True, error_model="numpy", _nrt=False)
def _chunk_runs_ck(p, open_row, act_ok, pre_ok, cas_ok, faw, sc, next_ref, addr, nbytes,
                   is_write, t0, per_ch):
    """:func:`_chunk_end_ck` channel by channel: the granules of a chunk on one channel are
    consecutive in its local addresses, and the channels share no state, so each channel's
    range is one :func:`_channel_run_ck` (equal to the reference: tests/sim/test_dram_timing)."""
    per_ch[:, 0] = 0
    if nbytes <= 0:
        return t0
    chans, gran = p[P_CH], p[P_GRAN]
    sg, sc_ = p[P_SH_GRAN], p[P_SH_CH]
    w = 1 if is_write else 0
    end = addr + nbytes
    g0 = _div(addr, gran, sg)
    g1 = _div(end - 1, gran, sg)
    done_all = t0
    for k in range(min(chans, g1 - g0 + 1)):
        g = g0 + k  # the channel's first granule
        gc = _div(g, chans, sc_)
        c = g - gc * chans
        lo = gc * gran + (addr - g * gran if k == 0 else 0)
        gl = g + _div(g1 - g, chans, sc_) * chans  # its last
        hi = _div(gl, chans, sc_) * gran + (end - gl * gran if gl == g1 else gran)
        done = _channel_run_ck(p, c, lo, hi, w, t0, open_row, act_ok, pre_ok, cas_ok, faw, sc,
                               next_ref, per_ch)
        if done > done_all:
            done_all = done
    return done_all


def chunk_time_ps(state: ChannelState, addr: int, nbytes: int, is_write: bool, now_ps: int,
                  timing: ProtocolTiming) -> int:
    """When (integer ps) a DMA chunk of ``nbytes`` at ``addr`` arriving at ``now_ps`` has
    all its data moved; ``state`` carries the open rows, bank timers, bus direction and
    refresh phase from chunk to chunk. Cycles are whole clock cycles of the channel."""
    if nbytes < 0 or addr < 0:
        raise ValueError(f"chunk_time_ps: addr ({addr}) and nbytes ({nbytes}) must be >= 0")
    if nbytes == 0:
        return now_ps
    # cycle edges become ps rounded up, so a time under 1 ps past an edge is that edge
    t0 = math.ceil((now_ps - 1) / timing.tck_ps)
    end_ck = _chunk_runs_ck(timing.vector, state.open_row, state.act_ok, state.pre_ok,
                           state.cas_ok, state.faw, state.scalars, state.next_ref, addr,
                           nbytes, is_write, t0, state.per_channel)
    return max(now_ps, math.ceil(end_ck * timing.tck_ps - 1e-6))


#: The per-chunk step for callers that keep their own state arrays
#: (``sim/device/components/dram.py``
#: and Numba code): ``(params, open_row, act_ok, pre_ok, cas_ok, faw, scalars, next_ref, addr,
#: nbytes, is_write, t0_ck, per_channel) -> end cycle``, all int64 arrays and scalars.
chunk_channels_ck = _chunk_runs_ck
#: The same step piece by piece in address order: the reference the tests hold it to.
chunk_channels_ck_reference = _chunk_end_ck


__all__ = ["ChannelState", "ProtocolTiming", "chunk_channels_ck", "chunk_channels_ck_reference",
           "chunk_time_ps", "timing_from_config"]
