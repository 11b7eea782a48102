"""LPDDR4X protocol model: DRAM time per access from the JEDEC timing, not one efficiency.

Not yet used by the engine (``sim/components/dram.py`` still moves bytes at
``dram.efficiency`` of peak); this module is the standalone, tested model to wire in.

Address mapping (``dram.timing.address_mapping = "row:bank:column"``, an assumption): the
channel is ``(addr // interleave_bytes) % channels`` as in ``sim/components/dram.py``; the
channel-local address keeps the granules of that channel back to back, and splits as
``row | bank | column`` (high to low): one page (row) of ``page_bytes``, then the same
columns of the next bank, and so on.

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

Closed forms (``closed_form_efficiency``), in cycles, B = BL/2:
- refresh stall per tREFI: close the rows (read: tRTP - B after the last READ's data; write:
  WL + 1 + tWR), tRPab, tRFCab, reopen (tRCD);
- lone sequential stream: ``1 - stall / tREFI`` = ``(1 - tRFCab/tREFI) x (1 - (close + tRPab +
  tRCD) / (tREFI - tRFCab))``;
- records each in its own row, b bursts each, on ``k`` banks in turn: one record per
  ``max(b B, tRRD, tFAW / 4, row cycle / k)`` with row cycle ``max(tRAS, tRCD + (b-1) B +
  to-precharge) + tRPpb``; a refresh adds ACTIVATE-to-PRECHARGE + tRPab + tRFCab minus one
  record cycle;
- reads and writes alternating every ``n`` bursts: ``2 n B / (2 n B + (tRTW - B) + (tWTR,gap
  - B))`` with tRTW = RL + tDQSCK(max) + B - WL + tWPRE and tWTR,gap = WL + 1 + B + tWTR.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

import numpy as np
from numba import njit

from sim.hw import DramConfig
from sim.units import KiB, MiB

#: "Never" for the state arrays: far enough in the past that no constraint binds.
_LONG_AGO_CK = -(10**15)


@dataclass(frozen=True)
class LpddrTiming:
    """The timing of one channel in whole cycles of its clock, from a ``DramConfig``."""

    tck_ps: float
    channels: int
    granule_bytes: int
    banks: int
    page_bytes: int
    burst_bytes: int
    ccd_ck: int  # BL/2: data cycles of one burst, and the READ-to-READ spacing
    rcd_ck: int
    rp_pb_ck: int
    rp_ab_ck: int
    ras_ck: int
    rrd_ck: int
    faw_ck: int
    wr_ck: int
    wtr_ck: int
    rtp_ck: int
    rfc_ab_ck: int
    refi_ck: int
    rl_ck: int
    wl_ck: int
    dqsck_ck: int
    wpre_ck: int

    @property
    def read_to_write_ck(self) -> int:
        """READ to WRITE command spacing (JESD209-4: RL + RU(tDQSCKmax/tCK) + BL/2 - WL +
        tWPRE + RD(tRPST); tRPST of 0.5 nCK rounds down to 0)."""
        return self.rl_ck + self.dqsck_ck + self.ccd_ck - self.wl_ck + self.wpre_ck

    @property
    def write_to_read_ck(self) -> int:
        """WRITE to READ command spacing (JESD209-4: WL + 1 + BL/2 + RU(tWTR/tCK))."""
        return self.wl_ck + 1 + self.ccd_ck + self.wtr_ck

    @property
    def read_to_precharge_ck(self) -> int:
        """READ to PRECHARGE, same bank (JESD209-4, BL16: BL/2 + max(8, nRTP) - 8)."""
        return self.ccd_ck + max(8, self.rtp_ck) - 8

    @property
    def write_to_precharge_ck(self) -> int:
        """WRITE to PRECHARGE, same bank (JESD209-4: WL + BL/2 + 1 + RU(tWR/tCK))."""
        return self.wl_ck + self.ccd_ck + 1 + self.wr_ck

    @property
    def rc_ck(self) -> int:
        return self.ras_ck + self.rp_pb_ck

    @property
    def bytes_per_ck(self) -> float:
        return self.burst_bytes / self.ccd_ck

    @property
    def channel_peak_bytes_per_s(self) -> float:
        return self.bytes_per_ck / (self.tck_ps * 1e-12)

    def ns_of(self, cycles: int) -> float:
        return cycles * self.tck_ps / 1000

    def cycles(self) -> dict[str, int]:
        """The tCK-rounded values, by JEDEC name."""
        return {"tCCD (BL/2)": self.ccd_ck, "tRCD": self.rcd_ck, "tRPpb": self.rp_pb_ck,
                "tRPab": self.rp_ab_ck, "tRAS": self.ras_ck, "tRC": self.rc_ck,
                "tRRD": self.rrd_ck, "tFAW": self.faw_ck, "tWR": self.wr_ck,
                "tWTR": self.wtr_ck, "tRTP": self.rtp_ck, "tRFCab": self.rfc_ab_ck,
                "tREFI": self.refi_ck, "RL": self.rl_ck, "WL": self.wl_ck,
                "tDQSCK(max)": self.dqsck_ck, "tWPRE": self.wpre_ck,
                "READ-to-WRITE": self.read_to_write_ck, "WRITE-to-READ": self.write_to_read_ck,
                "READ-to-PRECHARGE": self.read_to_precharge_ck,
                "WRITE-to-PRECHARGE": self.write_to_precharge_ck}

    @cached_property
    def vector(self) -> np.ndarray:
        """The parameters as the int64 vector the jitted loop reads (``_P_*`` order); built
        once per timing, so a call per chunk allocates nothing."""
        v = np.array([self.channels, self.granule_bytes, self.banks, self.page_bytes,
                         self.burst_bytes, self.ccd_ck, self.rcd_ck, self.rp_pb_ck,
                         self.rp_ab_ck, self.ras_ck, self.rrd_ck, self.faw_ck, self.rfc_ab_ck,
                         self.refi_ck, self.rl_ck, self.wl_ck, self.read_to_write_ck,
                         self.write_to_read_ck, self.read_to_precharge_ck,
                         self.write_to_precharge_ck], dtype=np.int64)
        v.setflags(write=False)
        return v


(_P_CH, _P_GRAN, _P_BANKS, _P_PAGE, _P_BURST, _P_CCD, _P_RCD, _P_RPPB, _P_RPAB, _P_RAS,
 _P_RRD, _P_FAW, _P_RFC, _P_REFI, _P_RL, _P_WL, _P_RTW, _P_WTRG, _P_RTP2PRE,
 _P_WR2PRE) = range(20)


def _min_cycles(ns: float, tck_ns: float) -> int:
    """A minimum time in whole cycles (rounded up; 1e-9 absorbs float noise)."""
    return max(0, math.ceil(ns / tck_ns - 1e-9))


def timing_from_config(dram: DramConfig) -> LpddrTiming:
    """Round the ``[dram.timing]`` values to cycles of the channel clock."""
    t = dram.timing
    if t is None:
        raise ValueError("dram.timing: this hardware has no [dram.timing] table; the protocol "
                         "model needs one (see the aries preset)")
    tck_ns = 2000.0 / dram.data_rate_mtps  # DDR: two transfers per clock
    burst_bytes = t.burst_length * dram.bus_width_bits_per_channel // 8
    return LpddrTiming(
        tck_ps=tck_ns * 1000, channels=dram.channels, granule_bytes=dram.interleave_bytes,
        banks=t.banks_per_channel, page_bytes=t.page_bytes, burst_bytes=burst_bytes,
        ccd_ck=t.burst_length // 2, rcd_ck=_min_cycles(t.trcd_ns, tck_ns),
        rp_pb_ck=_min_cycles(t.trp_pb_ns, tck_ns), rp_ab_ck=_min_cycles(t.trp_ab_ns, tck_ns),
        ras_ck=_min_cycles(t.tras_ns, tck_ns), rrd_ck=_min_cycles(t.trrd_ns, tck_ns),
        faw_ck=_min_cycles(t.tfaw_ns, tck_ns), wr_ck=_min_cycles(t.twr_ns, tck_ns),
        wtr_ck=_min_cycles(t.twtr_ns, tck_ns), rtp_ck=_min_cycles(t.trtp_ns, tck_ns),
        rfc_ab_ck=_min_cycles(t.trfc_ab_ns, tck_ns),
        refi_ck=math.floor(t.trefi_ns / tck_ns + 1e-9),  # a maximum interval: round down
        rl_ck=t.read_latency_ck, wl_ck=t.write_latency_ck,
        dqsck_ck=_min_cycles(t.tdqsck_max_ns, tck_ns), wpre_ck=t.write_preamble_ck)


# --- the per-chunk model -------------------------------------------------------------------

@dataclass
class ChannelState:
    """What the model remembers between chunks, per channel (and per bank): all in cycles."""

    open_row: np.ndarray  # (channels, banks), -1 closed
    act_ok: np.ndarray  # (channels, banks): earliest ACTIVATE
    pre_ok: np.ndarray  # (channels, banks): earliest PRECHARGE
    cas_ok: np.ndarray  # (channels, banks): earliest READ/WRITE
    faw: np.ndarray  # (channels, 4): the last four ACTIVATEs, a ring
    scalars: np.ndarray  # (channels, 5): faw ring position, last ACT, bus free, last CAS,
    #                      direction of the last CAS (-1 none, 0 read, 1 write)
    next_ref: np.ndarray  # (channels,): when the next all-bank refresh is due

    @classmethod
    def fresh(cls, t: LpddrTiming) -> ChannelState:
        """All banks closed, nothing issued, the first refresh due at tREFI."""
        c, b = t.channels, t.banks
        scalars = np.full((c, 5), _LONG_AGO_CK, dtype=np.int64)
        scalars[:, 0] = 0
        scalars[:, 4] = -1
        return cls(open_row=np.full((c, b), -1, dtype=np.int64),
                   act_ok=np.full((c, b), _LONG_AGO_CK, dtype=np.int64),
                   pre_ok=np.full((c, b), _LONG_AGO_CK, dtype=np.int64),
                   cas_ok=np.full((c, b), _LONG_AGO_CK, dtype=np.int64),
                   faw=np.full((c, 4), _LONG_AGO_CK, dtype=np.int64), scalars=scalars,
                   next_ref=np.full(c, t.refi_ck, dtype=np.int64))


@njit(cache=True)
def _refresh_until(p, c, start, open_row, act_ok, pre_ok, next_ref):
    """Do the all-bank refreshes due by ``start`` on channel ``c``: precharge-all once every
    bank may close, tRPab, then tRFCab; every bank is closed afterwards."""
    refi = p[_P_REFI]
    if start < next_ref[c]:
        return
    # Refreshes that fell wholly in idle time cost nothing but close the rows.
    skip = (start - next_ref[c]) // refi
    if skip > 0:
        next_ref[c] += skip * refi
    while start >= next_ref[c]:
        prea = next_ref[c]
        for k in range(p[_P_BANKS]):
            if open_row[c, k] >= 0 and pre_ok[c, k] > prea:
                prea = pre_ok[c, k]
        done = prea + p[_P_RPAB] + p[_P_RFC]
        for k in range(p[_P_BANKS]):
            open_row[c, k] = -1
            if act_ok[c, k] < done:
                act_ok[c, k] = done
        next_ref[c] += refi


@njit(cache=True)
def _chunk_end_ck(p, open_row, act_ok, pre_ok, cas_ok, faw, sc, next_ref, addr, nbytes,
                  is_write, t0):
    """Cycle at which the last data of ``[addr, addr + nbytes)`` has moved, for a request
    that arrives at cycle ``t0``; updates the state arrays."""
    chans, gran, page, bb, ccd = p[_P_CH], p[_P_GRAN], p[_P_PAGE], p[_P_BURST], p[_P_CCD]
    banks = p[_P_BANKS]
    w = 1 if is_write else 0
    end = addr + nbytes
    done_all = t0
    a = addr
    while a < end:
        g = a // gran
        c = g % chans
        ca = (g // chans) * gran + (a - g * gran)  # channel-local address
        piece_end = min(end, (g + 1) * gran, a + (page - ca % page))
        ca_end = ca + (piece_end - a)
        row_idx = ca // page
        bank = row_idx % banks
        row = row_idx // banks
        bursts = (ca_end - 1) // bb - ca // bb + 1
        start = max(t0, sc[c, 2])
        _refresh_until(p, c, start, open_row, act_ok, pre_ok, next_ref)
        if open_row[c, bank] != row:
            act_min = max(act_ok[c, bank], t0)
            if open_row[c, bank] >= 0:  # close the other row first
                act_min = max(act_min, max(pre_ok[c, bank], t0) + p[_P_RPPB])
            pos = sc[c, 0]
            t_act = max(act_min, sc[c, 1] + p[_P_RRD], faw[c, pos] + p[_P_FAW])
            faw[c, pos] = t_act
            sc[c, 0] = (pos + 1) % 4
            sc[c, 1] = t_act
            open_row[c, bank] = row
            cas_ok[c, bank] = t_act + p[_P_RCD]
            pre_ok[c, bank] = t_act + p[_P_RAS]
        t_cas = max(cas_ok[c, bank], sc[c, 2], t0)
        if sc[c, 4] == 0 and w == 1:
            t_cas = max(t_cas, sc[c, 3] + p[_P_RTW])
        elif sc[c, 4] == 1 and w == 0:
            t_cas = max(t_cas, sc[c, 3] + p[_P_WTRG])
        t_last = t_cas + (bursts - 1) * ccd
        sc[c, 2] = t_last + ccd
        sc[c, 3] = t_last
        sc[c, 4] = w
        close = t_last + (p[_P_WR2PRE] if w == 1 else p[_P_RTP2PRE])
        if close > pre_ok[c, bank]:
            pre_ok[c, bank] = close
        # read data ends RL + BL/2 after the READ; write data WL + 1 + BL/2 after the WRITE
        done = t_last + (p[_P_WL] + 1 + ccd if w == 1 else p[_P_RL] + ccd)
        if done > done_all:
            done_all = done
        a = piece_end
    return done_all


def chunk_time_ps(state: ChannelState, addr: int, nbytes: int, is_write: bool, now_ps: int,
                  timing: LpddrTiming) -> int:
    """When (integer ps) a DMA chunk of ``nbytes`` at ``addr`` arriving at ``now_ps`` has
    all its data moved; ``state`` carries the open rows, bank timers, bus direction and
    refresh phase from chunk to chunk. Cycles are whole clock cycles of the channel."""
    if nbytes < 0 or addr < 0:
        raise ValueError(f"chunk_time_ps: addr ({addr}) and nbytes ({nbytes}) must be >= 0")
    if nbytes == 0:
        return now_ps
    # cycle edges become ps rounded up, so a time under 1 ps past an edge is that edge
    t0 = math.ceil((now_ps - 1) / timing.tck_ps)
    end_ck = _chunk_end_ck(timing.vector, state.open_row, state.act_ok, state.pre_ok,
                           state.cas_ok, state.faw, state.scalars, state.next_ref, addr,
                           nbytes, is_write, t0)
    return max(now_ps, math.ceil(end_ck * timing.tck_ps - 1e-6))


@njit(cache=True)
def _stream_end_ck(p, open_row, act_ok, pre_ok, cas_ok, faw, sc, next_ref, addrs, sizes,
                   writes):
    end = 0
    for i in range(addrs.shape[0]):
        e = _chunk_end_ck(p, open_row, act_ok, pre_ok, cas_ok, faw, sc, next_ref, addrs[i],
                          sizes[i], writes[i] != 0, 0)
        if e > end:
            end = e
    return end


# --- access patterns -----------------------------------------------------------------------

PatternKind = Literal["sequential", "records", "mixed"]


@dataclass(frozen=True)
class AccessPattern:
    """A stream the programs make. ``sequential``: one long run of bytes. ``records``:
    ``record_bytes`` every ``stride_bytes``. ``mixed``: a read run and a write run far
    apart, alternating every ``switch_bytes``; the write run starts ``write_base`` bytes
    on, which on aries is 4 banks over (64 KiB = 4 pages x 8 channels past a multiple of
    the 16 KiB x 8 banks that bring back the same bank), so the two runs do not fight over
    rows of one bank."""

    name: str
    description: str
    kind: PatternKind
    write: bool = False
    record_bytes: int = 0
    stride_bytes: int = 0
    switch_bytes: int = 0
    total_bytes: int = 8 * MiB
    write_base: int = 256 * MiB + 64 * KiB  # the write run of ``mixed``: 4 banks over

    def accesses(self, chunk_bytes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The stream as (addresses, sizes, write flags), all issued at once."""
        if self.kind == "sequential":
            n = self.total_bytes // chunk_bytes
            return (np.arange(n, dtype=np.int64) * chunk_bytes,
                    np.full(n, chunk_bytes, dtype=np.int64),
                    np.full(n, int(self.write), dtype=np.int64))
        if self.kind == "records":
            n = self.total_bytes // self.record_bytes
            return (np.arange(n, dtype=np.int64) * self.stride_bytes,
                    np.full(n, self.record_bytes, dtype=np.int64),
                    np.full(n, int(self.write), dtype=np.int64))
        n = self.total_bytes // self.switch_bytes
        half = np.arange(n, dtype=np.int64) // 2 * self.switch_bytes
        writes = np.arange(n, dtype=np.int64) % 2
        return (half + writes * self.write_base, np.full(n, self.switch_bytes, dtype=np.int64),
                writes)


def stream_efficiency(pattern: AccessPattern, timing: LpddrTiming,
                      chunk_bytes: int = 64 * KiB) -> float:
    """Useful bytes / (peak of the channels it touches x time), from the per-chunk model:
    the whole stream issued at once on idle channels (first refresh due at tREFI)."""
    addrs, sizes, writes = pattern.accesses(chunk_bytes)
    state = ChannelState.fresh(timing)
    end_ck = _stream_end_ck(timing.vector, state.open_row, state.act_ok, state.pre_ok,
                            state.cas_ok, state.faw, state.scalars, state.next_ref, addrs,
                            sizes, writes)
    touched = int(np.count_nonzero(state.scalars[:, 4] >= 0))
    return float(sizes.sum()) / (timing.bytes_per_ck * touched * end_ck)


def refresh_loss(t: LpddrTiming) -> float:
    """The share of time the channel spends in all-bank refresh: tRFCab / tREFI."""
    return t.rfc_ab_ck / t.refi_ck


def refresh_stall_ck(t: LpddrTiming, write: bool = False) -> int:
    """Data-bus idle time per refresh of a busy channel: close the open rows after the last
    column command's data, precharge-all, refresh, reopen."""
    close = t.write_to_precharge_ck if write else t.read_to_precharge_ck
    return close - t.ccd_ck + t.rp_ab_ck + t.rfc_ab_ck + t.rcd_ck


def banks_in_turn(t: LpddrTiming, stride_bytes: int) -> int:
    """How many banks records ``stride_bytes`` apart take turns on, when every record lands
    on the same channel and in its own row (the closed form's condition)."""
    stripe = t.granule_bytes * t.channels
    per_channel = stride_bytes // t.channels
    if stride_bytes % stripe or per_channel % t.page_bytes:
        raise ValueError(f"stride_bytes {stride_bytes}: the closed form needs a multiple of "
                         f"channels x interleave ({stripe} B) whose per-channel share is a "
                         f"multiple of page_bytes ({t.page_bytes} B)")
    step = (per_channel // t.page_bytes) % t.banks
    return t.banks // math.gcd(t.banks, step)


def act_to_precharge_ck(t: LpddrTiming, bursts: int, write: bool) -> int:
    """ACTIVATE to the earliest PRECHARGE of a row that serves ``bursts`` bursts."""
    to_pre = t.write_to_precharge_ck if write else t.read_to_precharge_ck
    return max(t.ras_ck, t.rcd_ck + (bursts - 1) * t.ccd_ck + to_pre)


def record_cycle_ck(t: LpddrTiming, bursts: int, write: bool, banks: int) -> float:
    """Cycles per record when each record opens its own row: bus, tRRD, tFAW/4 and the row
    cycle (ACTIVATE to PRECHARGE, then tRPpb) of one bank shared by ``banks`` banks."""
    row_cycle = act_to_precharge_ck(t, bursts, write) + t.rp_pb_ck
    return max(bursts * t.ccd_ck, t.rrd_ck, t.faw_ck / 4, row_cycle / banks)


def record_refresh_stall_ck(t: LpddrTiming, bursts: int, write: bool, banks: int) -> float:
    """Time a refresh adds to a stream of one-row records: the precharge-all waits for the
    last row opened (ACTIVATE to PRECHARGE), then tRPab and tRFCab, and the next ACTIVATE
    comes then instead of one record cycle after the last."""
    return (act_to_precharge_ck(t, bursts, write) + t.rp_ab_ck + t.rfc_ab_ck
            - record_cycle_ck(t, bursts, write, banks))


def closed_form_efficiency(pattern: AccessPattern, t: LpddrTiming) -> float | None:
    """The analytic sustained efficiency of a pattern (None when it has no closed form)."""
    refresh = 1 - refresh_stall_ck(t, pattern.write) / t.refi_ck
    if pattern.kind == "sequential":
        return refresh
    if pattern.kind == "records":
        if pattern.record_bytes > t.granule_bytes or pattern.record_bytes % t.burst_bytes:
            return None
        try:
            banks = banks_in_turn(t, pattern.stride_bytes)
        except ValueError:
            return None
        bursts = pattern.record_bytes // t.burst_bytes
        cycle = record_cycle_ck(t, bursts, pattern.write, banks)
        stall = record_refresh_stall_ck(t, bursts, pattern.write, banks)
        return (1 - stall / t.refi_ck) * pattern.record_bytes / (t.bytes_per_ck * cycle)
    per_channel = pattern.switch_bytes // t.channels
    if pattern.switch_bytes % (t.granule_bytes * t.channels) or per_channel % t.page_bytes:
        return None
    data = 2 * (per_channel // t.burst_bytes) * t.ccd_ck
    turn = (t.read_to_write_ck - t.ccd_ck) + (t.write_to_read_ck - t.ccd_ck)
    return refresh * data / (data + turn)


def standard_patterns(dram: DramConfig) -> list[AccessPattern]:
    """The access patterns the compiled programs make, sized for ``dram``."""
    stripe = dram.interleave_bytes * dram.channels
    return [
        AccessPattern("weight_stream", "long sequential read (a weight matrix, DMA load)",
                      "sequential"),
        AccessPattern("kv_token_read", "one token's 64 B K record of each head: heads are "
                      "4096 x 64 B apart ([head][token][dim] cache of 4096 int8 tokens)",
                      "records", record_bytes=64, stride_bytes=4096 * 64, total_bytes=128 * KiB),
        AccessPattern("kv_token_append", "the same records written (decode appends one token "
                      "to every head)", "records", write=True, record_bytes=64,
                      stride_bytes=4096 * 64, total_bytes=128 * KiB),
        AccessPattern("activation_store", "strided write: a core's 1 KiB slice of each token "
                      "row of an 8192-wide int8 activation (1/8 of the columns)", "records",
                      write=True, record_bytes=1024, stride_bytes=8192, total_bytes=2 * MiB),
        AccessPattern("mixed_rw", f"reads and writes alternating every {stripe * 8 // KiB} "
                      "KiB (one page per channel) between two far-apart runs", "mixed",
                      switch_bytes=stripe * 8),
    ]


@dataclass(frozen=True)
class PatternFigures:
    name: str
    description: str
    efficiency: float  # from the per-chunk model
    closed_form: float | None
    sustained_bytes_per_s: float  # efficiency x peak of the whole DRAM


@dataclass(frozen=True)
class ProtocolSummary:
    cycles: dict[str, int]
    tck_ps: float
    refresh_loss: float
    patterns: list[PatternFigures] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"note": ENGINE_NOTE, "tck_ps": self.tck_ps, "timing_cycles": self.cycles,
                "refresh_loss": self.refresh_loss,
                "sustained_efficiency": {p.name: p.efficiency for p in self.patterns},
                "closed_form_efficiency": {p.name: p.closed_form for p in self.patterns},
                "sustained_bytes_per_s": {p.name: p.sustained_bytes_per_s
                                          for p in self.patterns}}


ENGINE_NOTE = ("the engine still moves bytes at dram.efficiency of peak; these efficiencies "
               "come from the LPDDR4X protocol model and are not used until it is wired in")


def protocol_summary(dram: DramConfig) -> ProtocolSummary:
    """What the protocol model predicts for ``dram``, pattern by pattern."""
    t = timing_from_config(dram)
    out = []
    for pat in standard_patterns(dram):
        eff = stream_efficiency(pat, t)
        out.append(PatternFigures(pat.name, pat.description, eff,
                                  closed_form_efficiency(pat, t),
                                  eff * dram.peak_bytes_per_s))
    return ProtocolSummary(t.cycles(), t.tck_ps, refresh_loss(t), out)


__all__ = ["AccessPattern", "ChannelState", "LpddrTiming", "ProtocolSummary", "ENGINE_NOTE",
           "chunk_time_ps", "closed_form_efficiency", "protocol_summary", "refresh_loss",
           "refresh_stall_ck", "standard_patterns", "stream_efficiency", "timing_from_config",
]
