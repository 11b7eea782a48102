"""A DRAM channel's timing in whole cycles of its command clock: what the protocol step
(:mod:`sim.device.dram.timing`) reads, whatever the standard.

A standard's timing file (``lpddr4x.py``, ``lpddr5.py``, listed in ``standards.py``)
rounds its datasheet values to cycles and works out the command spacings its own rules
give (READ to WRITE, WRITE to READ, READ or WRITE to PRECHARGE, a column command to its
last data); this module holds them as one :class:`ProtocolTiming`, lays them out as the
parameter vector the jitted step reads (:attr:`ProtocolTiming.vector`, indices ``P_*``,
both here so they cannot drift apart), keeps the channel state the step updates
(:class:`ChannelState`) and the closed forms of a lone stream that the hardware config
and the pattern summary (``patterns.py``) quote.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

#: "Never" for the state arrays: far enough in the past that no constraint binds.
LONG_AGO_CK = -(10**15)

#: The indices of the parameters in :attr:`ProtocolTiming.vector`.
(P_CH, P_GRAN, P_BANKS, P_PAGE, P_BURST, P_CCD, P_RCD, P_RPPB, P_RPAB, P_RAS,
 P_RRD, P_FAW, P_RFC, P_REFI, P_RDONE, P_WDONE, P_RTW, P_WTRG, P_RTP2PRE,
 P_WR2PRE, P_XOR, P_RUN, P_SH_GRAN, P_SH_PAGE, P_SH_BANKS, P_SH_CH,
 P_SH_BURST, P_PAGES_R, P_PAGES_W) = range(29)


def min_cycles(ns: float, tck_ns: float) -> int:
    """A minimum time in whole cycles, rounded up (JEDEC: nCK = RU(t / tCK)); 1e-9 absorbs
    float noise."""
    return max(0, math.ceil(ns / tck_ns - 1e-9))


def check_refresh(t) -> None:
    """A timing table's refresh must leave the channel time to work: tRFCab plus the
    precharge-all before it shorter than tREFI (every standard's ``TimingConfig``)."""
    if t.trfc_ab_ns + t.trp_ab_ns >= t.trefi_ns:
        raise ValueError("trfc_ab_ns + trp_ab_ns must be shorter than trefi_ns (the "
                         "channel would do nothing but refresh)")


def core_cycles(t, tck_ns: float, fields: tuple[tuple[str, str], ...]
                ) -> tuple[dict[str, int], int]:
    """The minimum times ``fields`` (``(JEDEC name, field of t)``) in whole cycles of
    ``tck_ns`` (rounded up), and tREFI in cycles (a maximum interval: rounded down)."""
    if t.trefi_ns < tck_ns:
        raise ValueError(f"dram.timing.trefi_ns ({t.trefi_ns}) is under one clock cycle "
                         f"({tck_ns:.3f} ns): refreshes would never end")
    ck = {name: min_cycles(getattr(t, f), tck_ns) for name, f in fields}
    return ck, math.floor(t.trefi_ns / tck_ns + 1e-9)


def channel_fields(t, dram, tck_ns: float) -> dict:
    """The :class:`ProtocolTiming` fields every standard fills alike: the clock, the
    organisation, the address mapping and the row interference."""
    return {"tck_ps": tck_ns * 1000, "channels": dram.channels,
            "granule_bytes": dram.interleave_bytes, "banks": t.banks_per_channel,
            "page_bytes": t.page_bytes,
            "burst_bytes": t.burst_length * dram.bus_width_bits_per_channel // 8,
            "bank_xor": t.address_mapping == "row:bank^row:column",
            "run_bytes": 0 if t.row_run_bytes is None or t.row_run_bytes >= t.page_bytes
            else t.row_run_bytes}


@dataclass(frozen=True)
class ProtocolTiming:
    """The timing of one channel in whole cycles of its command clock (``tck_ps``)."""

    standard: str  # the timing file it comes from (``standards.STANDARDS``)
    tck_ps: float
    channels: int
    granule_bytes: int
    banks: int
    page_bytes: int
    burst_bytes: int
    ccd_ck: int  # data cycles of one burst, and the spacing of column commands
    rcd_ck: int
    rp_pb_ck: int
    rp_ab_ck: int
    ras_ck: int
    rrd_ck: int
    faw_ck: int
    rfc_ab_ck: int
    refi_ck: int
    read_to_write_ck: int  # READ to WRITE command spacing (turnaround)
    write_to_read_ck: int  # WRITE to READ command spacing (turnaround)
    read_to_precharge_ck: int  # READ to PRECHARGE, same bank
    write_to_precharge_ck: int  # WRITE to PRECHARGE, same bank
    read_done_ck: int  # READ command to the end of its data
    write_done_ck: int  # WRITE command to the end of its data
    bank_xor: bool = False  # bank = (row index mod banks) XOR (row mod banks)
    run_bytes: int = 0  # a row is reopened every run_bytes of a channel (0: never)
    #: the standard's own values by their JEDEC names, for ``kvsim hw show``
    named: Mapping[str, int] = field(default_factory=dict, compare=False)

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
        """The rounded values by JEDEC name, then the command spacings they give."""
        return {**self.named, "READ-to-WRITE": self.read_to_write_ck,
                "WRITE-to-READ": self.write_to_read_ck,
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
        """The parameters as the int64 vector the jitted step reads (indices ``P_*``);
        built once per timing, so a call per chunk allocates nothing."""
        v = np.array([self.channels, self.granule_bytes, self.banks, self.page_bytes,
                      self.burst_bytes, self.ccd_ck, self.rcd_ck, self.rp_pb_ck,
                      self.rp_ab_ck, self.ras_ck, self.rrd_ck, self.faw_ck, self.rfc_ab_ck,
                      self.refi_ck, self.read_done_ck, self.write_done_ck,
                      self.read_to_write_ck, self.write_to_read_ck, self.read_to_precharge_ck,
                      self.write_to_precharge_ck, int(self.bank_xor),
                      self.run_bytes or self.page_bytes,
                      *(_log2_or_none(x) for x in (self.granule_bytes, self.page_bytes,
                                                   self.banks, self.channels,
                                                   self.burst_bytes)),
                      int(self.pages_in_closed_form(False)),
                      int(self.pages_in_closed_form(True))], dtype=np.int64)
        v.setflags(write=False)
        return v

    # --- closed forms of a lone stream (the derivations: ``patterns.py``) ----------------
    def refresh_loss(self) -> float:
        """The share of time the channel spends in all-bank refresh: tRFCab / tREFI."""
        return self.rfc_ab_ck / self.refi_ck

    def refresh_stall_ck(self, write: bool = False) -> int:
        """Data-bus idle time per refresh of a busy channel: close the open rows after the
        last column command's data, precharge-all, refresh, reopen."""
        close = self.write_to_precharge_ck if write else self.read_to_precharge_ck
        return close - self.ccd_ck + self.rp_ab_ck + self.rfc_ab_ck + self.rcd_ck

    def reopens_per_page(self) -> int:
        """Times a sequential stream reopens each row: a run of ``run_bytes`` from the
        row's start, then the next, so ``ceil(page / run) - 1`` reopens per page."""
        if not self.run_bytes:
            return 0
        return -(-self.page_bytes // self.run_bytes) - 1

    def reopen_gap_ck(self, write: bool = False) -> int:
        """Data-bus idle time of one reopen of the same row: close after the last column
        command's data (tRTP or write recovery), tRPpb, then tRCD (runs long enough that
        tRAS has passed)."""
        close = self.write_to_precharge_ck if write else self.read_to_precharge_ck
        return close - self.ccd_ck + self.rp_pb_ck + self.rcd_ck

    def sequential_efficiency(self, write: bool = False) -> float:
        """Sustained / peak of a lone sequential stream: the refresh stalls, and the
        reopens of each row when a row run is shorter than the page."""
        refresh = 1 - self.refresh_stall_ck(write) / self.refi_ck
        data = self.page_bytes / self.burst_bytes * self.ccd_ck  # cycles of data per page
        return refresh * data / (data + self.reopens_per_page() * self.reopen_gap_ck(write))


def _log2_or_none(x: int) -> int:
    """``log2(x)`` when ``x`` is a power of two, else -1: the loops divide by a power of two
    with a shift (a 64-bit division by a value read at run time costs tens of cycles, and a
    chunk needs a dozen of them per channel)."""
    return x.bit_length() - 1 if x > 0 and x & (x - 1) == 0 else -1


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
    def fresh(cls, t: ProtocolTiming) -> ChannelState:
        """All banks closed, nothing issued, the first refresh due at tREFI."""
        c, b = t.channels, t.banks
        scalars = np.full((c, 5), LONG_AGO_CK, dtype=np.int64)
        scalars[:, 0] = 0
        scalars[:, 4] = -1
        return cls(open_row=np.full((c, b), -1, dtype=np.int64),
                   act_ok=np.full((c, b), LONG_AGO_CK, dtype=np.int64),
                   pre_ok=np.full((c, b), LONG_AGO_CK, dtype=np.int64),
                   cas_ok=np.full((c, b), LONG_AGO_CK, dtype=np.int64),
                   faw=np.full((c, 4), LONG_AGO_CK, dtype=np.int64), scalars=scalars,
                   next_ref=np.full(c, t.refi_ck, dtype=np.int64),
                   per_channel=np.zeros((c, 3), dtype=np.int64))


@dataclass(frozen=True)
class Grade:
    """A named speed grade of a standard: its ``[dram.timing]`` table as a preset writes
    it, and where each value comes from (``sources``, keyed by field) or why it was chosen
    (``assumptions``): a preset naming the grade takes all three."""

    table: Mapping[str, object]
    sources: Mapping[str, str]
    assumptions: Mapping[str, str] = field(default_factory=dict)
