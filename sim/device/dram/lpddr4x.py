"""The LPDDR4X timing of one channel in whole clock cycles, and the state the protocol model
(:mod:`sim.device.dram.timing`) keeps per channel and bank between chunks.

``LpddrTiming.vector`` is the parameter vector the jitted steps read; its order is that of
the ``_P_*`` indices in :mod:`sim.device.dram.timing`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from sim.device.hw import DramConfig

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
    bank_xor: bool = False  # bank = (row index mod banks) XOR (row mod banks)
    run_bytes: int = 0  # a row is reopened every run_bytes of a channel (0: never)

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

    def pages_in_closed_form(self, write: bool) -> bool:
        """Whether a whole row of a channel's share (its row runs after the first, each
        reopening the row) may be timed in closed form for this direction (the proof is at
        the channel step of :mod:`sim.device.dram.timing`): granules and row runs hold whole
        bursts, and with ``L`` a row run's last column command, ``A`` its ACTIVATE and
        ``L >= A + tRCD + (n - 1) tCCD`` for a full run of ``n`` bursts, the next run's
        ACTIVATE is bound by its PRECHARGE alone: tRAS by the close (``tRCD + (n - 1) tCCD
        + to_pre >= tRAS``), and tRRD, tFAW (the ACTIVATE four back is no later than
        ``A``) and tCCD by the precharge time."""
        run = self.run_bytes or self.page_bytes
        bb, ccd = self.burst_bytes, self.ccd_ck
        if self.granule_bytes % bb or run % bb or self.page_bytes % bb:
            return False
        to_pre = self.write_to_precharge_ck if write else self.read_to_precharge_ck
        after_act = self.rcd_ck + (run // bb - 1) * ccd + to_pre  # A to the PRECHARGE
        return (after_act >= self.ras_ck and max(self.rrd_ck, self.faw_ck)
                <= after_act + self.rp_pb_ck and ccd <= to_pre + self.rp_pb_ck + self.rcd_ck)

    @cached_property
    def vector(self) -> np.ndarray:
        """The parameters as the int64 vector the jitted loop reads (the ``_P_*`` order of
        sim/device/dram/timing.py); built
        once per timing, so a call per chunk allocates nothing."""
        v = np.array([self.channels, self.granule_bytes, self.banks, self.page_bytes,
                         self.burst_bytes, self.ccd_ck, self.rcd_ck, self.rp_pb_ck,
                         self.rp_ab_ck, self.ras_ck, self.rrd_ck, self.faw_ck, self.rfc_ab_ck,
                         self.refi_ck, self.rl_ck, self.wl_ck, self.read_to_write_ck,
                         self.write_to_read_ck, self.read_to_precharge_ck,
                         self.write_to_precharge_ck, int(self.bank_xor),
                         self.run_bytes or self.page_bytes,
                         *(_log2_or_none(x) for x in (self.granule_bytes, self.page_bytes,
                                                      self.banks, self.channels,
                                                      self.burst_bytes)),
                         int(self.pages_in_closed_form(False)),
                         int(self.pages_in_closed_form(True))], dtype=np.int64)
        v.setflags(write=False)
        return v


def _log2_or_none(x: int) -> int:
    """``log2(x)`` when ``x`` is a power of two, else -1: the loops divide by a power of two
    with a shift (a 64-bit division by a value read at run time costs tens of cycles, and a
    chunk needs a dozen of them per channel)."""
    return x.bit_length() - 1 if x > 0 and x & (x - 1) == 0 else -1


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
    if t.trefi_ns < tck_ns:
        raise ValueError(f"dram.timing.trefi_ns ({t.trefi_ns}) is under one clock cycle "
                         f"({tck_ns:.3f} ns): refreshes would never end")
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
        dqsck_ck=_min_cycles(t.tdqsck_max_ns, tck_ns), wpre_ck=t.write_preamble_ck,
        bank_xor=t.address_mapping == "row:bank^row:column",
        run_bytes=0 if t.row_run_bytes is None or t.row_run_bytes >= t.page_bytes
        else t.row_run_bytes)


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
    per_channel: np.ndarray  # (channels, 3): the last chunk's bytes, first CAS, end per channel

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
                   next_ref=np.full(c, t.refi_ck, dtype=np.int64),
                   per_channel=np.zeros((c, 3), dtype=np.int64))
