"""Access patterns the programs make, the DRAM protocol model's (``sim/device/dram/timing.py``)
efficiency on each (``stream_efficiency``), their closed forms, and the summary ``kvsim hw
show`` prints: what each pattern sustains.

Closed forms (``closed_form_efficiency``), in cycles, B = BL/2:
- refresh stall per tREFI: close the rows (read: tRTP - B after the last READ's data; write:
  WL + 1 + tWR), tRPab, tRFCab, reopen (tRCD);
- lone sequential stream: ``1 - stall / tREFI`` = ``(1 - tRFCab/tREFI) x (1 - (close + tRPab +
  tRCD) / (tREFI - tRFCab))``; with a row run shorter than the page (``row_run_bytes``: other
  masters close the row), times ``D / (D + r x reopen)`` for ``D`` cycles of data per page,
  ``r = ceil(page / run) - 1`` reopens per page, each ``close + tRPpb + tRCD``;
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
from typing import TYPE_CHECKING, Literal

import numpy as np
from numba import njit

from sim.device.dram.cycles import ChannelState, ProtocolTiming
from sim.device.dram.standards import timing_from_config
from sim.device.dram.timing import chunk_channels_ck
from sim.units import KiB, MiB

if TYPE_CHECKING:
    from sim.device.hw import DramConfig


@njit(cache=True)
def _stream_end_ck(p, open_row, act_ok, pre_ok, cas_ok, faw, sc, next_ref, addrs, sizes,
                   writes, per_ch):
    end = 0
    for i in range(addrs.shape[0]):
        e = chunk_channels_ck(p, open_row, act_ok, pre_ok, cas_ok, faw, sc, next_ref,
                              addrs[i], sizes[i], writes[i] != 0, 0, per_ch)
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


def stream_efficiency(pattern: AccessPattern, timing: ProtocolTiming,
                      chunk_bytes: int = 64 * KiB) -> float:
    """Useful bytes / (peak of the channels it touches x time), from the per-chunk model:
    the whole stream issued at once on idle channels (first refresh due at tREFI)."""
    addrs, sizes, writes = pattern.accesses(chunk_bytes)
    state = ChannelState.fresh(timing)
    end_ck = _stream_end_ck(timing.vector, state.open_row, state.act_ok, state.pre_ok,
                            state.cas_ok, state.faw, state.scalars, state.next_ref, addrs,
                            sizes, writes, state.per_channel)
    touched = int(np.count_nonzero(state.scalars[:, 4] >= 0))
    return float(sizes.sum()) / (timing.bytes_per_ck * touched * end_ck)



def refresh_loss(t: ProtocolTiming) -> float:
    """The share of time the channel spends in all-bank refresh: tRFCab / tREFI."""
    return t.refresh_loss()


def refresh_stall_ck(t: ProtocolTiming, write: bool = False) -> int:
    """Data-bus idle time per refresh of a busy channel
    (:meth:`ProtocolTiming.refresh_stall_ck`)."""
    return t.refresh_stall_ck(write)


def banks_in_turn(t: ProtocolTiming, stride_bytes: int) -> int:
    """How many banks records ``stride_bytes`` apart take turns on, when every record lands
    on the same channel and in its own row (the closed form's condition)."""
    stripe = t.granule_bytes * t.channels
    per_channel = stride_bytes // t.channels
    if stride_bytes % stripe or per_channel % t.page_bytes:
        raise ValueError(f"stride_bytes {stride_bytes}: the closed form needs a multiple of "
                         f"channels x interleave ({stripe} B) whose per-channel share is a "
                         f"multiple of page_bytes ({t.page_bytes} B)")
    step = per_channel // t.page_bytes  # row indices between records
    if not t.bank_xor:
        return t.banks // math.gcd(t.banks, step % t.banks)
    # XOR-hashed banks: the banks the records visit over banks^2 records, evenly in turn
    return len({(k * step % t.banks) ^ (k * step // t.banks % t.banks)
                for k in range(t.banks * t.banks)})


def act_to_precharge_ck(t: ProtocolTiming, bursts: int, write: bool) -> int:
    """ACTIVATE to the earliest PRECHARGE of a row that serves ``bursts`` bursts."""
    to_pre = t.write_to_precharge_ck if write else t.read_to_precharge_ck
    return max(t.ras_ck, t.rcd_ck + (bursts - 1) * t.ccd_ck + to_pre)


def record_cycle_ck(t: ProtocolTiming, bursts: int, write: bool, banks: int) -> float:
    """Cycles per record when each record opens its own row: bus, tRRD, tFAW/4 and the row
    cycle (ACTIVATE to PRECHARGE, then tRPpb) of one bank shared by ``banks`` banks."""
    row_cycle = act_to_precharge_ck(t, bursts, write) + t.rp_pb_ck
    return max(bursts * t.ccd_ck, t.rrd_ck, t.faw_ck / 4, row_cycle / banks)


def record_refresh_stall_ck(t: ProtocolTiming, bursts: int, write: bool, banks: int) -> float:
    """Time a refresh adds to a stream of one-row records: the precharge-all waits for the
    last row opened (ACTIVATE to PRECHARGE), then tRPab and tRFCab, and the next ACTIVATE
    comes then instead of one record cycle after the last."""
    return (act_to_precharge_ck(t, bursts, write) + t.rp_ab_ck + t.rfc_ab_ck
            - record_cycle_ck(t, bursts, write, banks))


def reopens_per_page(t: ProtocolTiming) -> int:
    """Times a sequential stream reopens each row (:meth:`ProtocolTiming.reopens_per_page`)."""
    return t.reopens_per_page()


def closed_form_efficiency(pattern: AccessPattern, t: ProtocolTiming) -> float | None:
    """The analytic sustained efficiency of a pattern (None when it has no closed form)."""
    refresh = 1 - refresh_stall_ck(t, pattern.write) / t.refi_ck
    if pattern.kind == "sequential":
        return t.sequential_efficiency(pattern.write)
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
    if pattern.switch_bytes % (t.granule_bytes * t.channels) or per_channel % t.page_bytes \
            or t.run_bytes:
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

    model: str = "protocol"  # dram.model: whether the engine uses these figures
    standard: str = ""  # the timing file the cycles come from (``standards.STANDARDS``)

    @property
    def note(self) -> str:
        return ENGINE_NOTE[self.model]

    def to_json(self) -> dict:
        return {"note": self.note, "model": self.model, "tck_ps": self.tck_ps,
                "timing_cycles": self.cycles,
                "refresh_loss": self.refresh_loss,
                "sustained_efficiency": {p.name: p.efficiency for p in self.patterns},
                "closed_form_efficiency": {p.name: p.closed_form for p in self.patterns},
                "sustained_bytes_per_s": {p.name: p.sustained_bytes_per_s
                                          for p in self.patterns}}


#: What the engine does with the protocol figures, by ``dram.model``.
ENGINE_NOTE = {
    "protocol": "dram.model = protocol: the engine times every DMA chunk with this model "
                "(bank state, refresh and turnaround per channel); dram.efficiency is unused",
    "efficiency": "dram.model = efficiency: the engine moves bytes at dram.efficiency of "
                  "peak; these figures are what dram.model = protocol would use"}


def protocol_summary(dram: DramConfig) -> ProtocolSummary:
    """What the protocol model predicts for ``dram``, pattern by pattern."""
    t = timing_from_config(dram)
    out = []
    for pat in standard_patterns(dram):
        eff = stream_efficiency(pat, t)
        out.append(PatternFigures(pat.name, pat.description, eff,
                                  closed_form_efficiency(pat, t),
                                  eff * dram.peak_bytes_per_s))
    return ProtocolSummary(t.cycles(), t.tck_ps, refresh_loss(t), out, dram.model, t.standard)


__all__ = ["ENGINE_NOTE", "AccessPattern", "PatternFigures", "PatternKind", "ProtocolSummary",
           "closed_form_efficiency", "protocol_summary", "refresh_loss", "refresh_stall_ck",
           "reopens_per_page", "standard_patterns", "stream_efficiency"]
