"""LPDDR5 (JEDEC JESD209-5): the timing file of the standard.

What a hardware preset writes under ``[dram.timing]`` with ``standard = "lpddr5"``
(:class:`TimingConfig`: datasheet minimums in ns, latencies set in mode registers in
cycles), how those become whole cycles of the command clock CK and the command spacings
(:func:`to_cycles`, read by the protocol step through
:class:`~sim.device.dram.cycles.ProtocolTiming`), and the sourced values of a speed grade
(:data:`GRADES`: a preset may name one, ``dram.timing = "lpddr5-6400"``).

Clocks: LPDDR5 moves data on the write clock WCK, double data rate, and takes commands on
CK, which runs at WCK / ``wck_ck_ratio`` (4:1 above 3200 MT/s). So tCK = 2 x ratio / data
rate (LPDDR5-6400: WCK 3200 MHz, CK 800 MHz, tCK 1.25 ns), one CK cycle carries
``2 x ratio`` beats and a burst of BL beats takes BL / (2 x ratio) cycles (BL16 at 4:1:
2 nCK). Every value the model reads is in CK cycles.

Bank architecture: bank-group mode (BG mode: 4 bank groups of 4 banks, 16 banks, BL16 or
BL32), the mode JESD209-5 gives above 3200 MT/s (16B mode, 16 banks without groups, is
limited to 3200 MT/s; 8B mode has 8 banks and BL32 only).

What the standard-neutral protocol model cannot express, and how this file stands in for it
(each also an entry of the grade's assumptions):

- **Bank groups.** The model has banks but no groups, so it has one column-to-column
  spacing: tCCD_S (= the burst's data time, BL/n), as when consecutive bursts alternate
  bank groups, which controllers arrange with the address mapping. tCCD_L (4 nCK at BL16,
  4:1) for back-to-back bursts to one group is not modelled: a stream held in one bank
  group would reach half the data rate at most. Likewise write-to-read uses tWTR_S (a read
  to another group); tWTR_L is not modelled. tRRD and tFAW do not depend on the group.
- **WCK.** WCK-to-CK synchronisation (CAS-WCK_SYNC before a burst after the clock idled,
  tWCKENL, tWCKPRE) and the WCK-to-DQ offsets are not modelled: WCK is taken to run always
  (WCK always-on mode), and read-to-write turnaround is RL + BL/n - WL plus a fixed
  ``read_to_write_gap_ck``.
- **Per-bank refresh.** Only all-bank refresh is modelled (tRFCab every tREFI, after a
  precharge-all), as for LPDDR4X; REFpb (tRFCpb, tPBR2PBR) is not.
- **Command bus.** Not modelled, as for LPDDR4X: an ACTIVATE (ACT-1 + ACT-2) takes 2 CK,
  a READ or WRITE 1 CK, so a piece of ``b >= 2`` bursts needs ``2 + b <= 2b`` cycles of
  the bus; a lone one-burst row open (3 CK of command for 2 of data) is under-counted by
  at most one cycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from models.schema import Frozen
from sim.device.dram.cycles import Grade, ProtocolTiming, channel_fields, check_refresh, core_cycles

if TYPE_CHECKING:
    from sim.device.hw import DramConfig

NAME = "lpddr5"

#: The highest CK of JESD209-5 (LPDDR5-6400 at WCK:CK 4:1), in MHz.
MAX_CK_MHZ = 800.0


class TimingConfig(Frozen):
    """LPDDR5 organisation and timing of one x16 channel in BG mode (JEDEC JESD209-5).

    Times are datasheet minimums in ns (``trefi_ns`` is the maximum average refresh
    interval); :func:`to_cycles` rounds each to whole CK cycles (CK = data rate /
    (2 x ``wck_ck_ratio``)). Latencies set in mode registers (RL, WL) are in CK cycles.
    """

    #: the standard: required (and written out), so a dumped table reads back as LPDDR5
    standard: Literal["lpddr5"]
    address_mapping: Literal["row:bank:column", "row:bank^row:column"] = Field(
        description="how a channel-local address splits into row, bank and column (high to "
        "low bits); 'row:bank^row:column' hashes the bank bits with the low row bits")
    wck_ck_ratio: Literal[2, 4] = Field(
        description="WCK:CK frequency ratio (mode register): data beats per CK = 2 x ratio")
    banks_per_channel: int = Field(ge=1, description="banks of one channel (BG mode: 16)")
    page_bytes: int = Field(ge=32, description="row (page) size of one channel in bytes")
    burst_length: Literal[16, 32] = Field(description="beats per READ/WRITE command (BL)")
    trcd_ns: float = Field(ge=0, description="ACTIVATE to READ/WRITE")
    trp_pb_ns: float = Field(ge=0, description="per-bank PRECHARGE period")
    trp_ab_ns: float = Field(ge=0, description="all-bank PRECHARGE period")
    tras_ns: float = Field(ge=0, description="ACTIVATE to PRECHARGE, same bank")
    trrd_ns: float = Field(ge=0, description="ACTIVATE to ACTIVATE, different banks")
    tfaw_ns: float = Field(ge=0, description="window holding at most four ACTIVATEs")
    twr_ns: float = Field(ge=0, description="write recovery: end of write data to PRECHARGE")
    twtr_ns: float = Field(ge=0, description="tWTR_S: end of write data to READ of another "
                           "bank group (the model has no groups)")
    trtp_ns: float = Field(ge=0, description="READ to PRECHARGE")
    trfc_ab_ns: float = Field(ge=0, description="all-bank REFRESH cycle time")
    trefi_ns: float = Field(gt=0, description="average interval between all-bank REFRESHes")
    read_latency_ck: int = Field(ge=1, description="RL: READ command to first data, CK")
    write_latency_ck: int = Field(ge=1, description="WL: WRITE command to first data, CK")
    read_to_write_gap_ck: int = Field(
        ge=0, description="bus turnaround added to RL + BL/n - WL between a READ and a "
        "WRITE, CK (stands in for the WCK-to-DQ offset and write preamble)")
    row_run_bytes: int | None = Field(
        None, ge=32, description="multi-master row interference (a controller property, "
        "not JEDEC): an open row serves this many bytes of one stream before it must be "
        "reopened; None or >= page_bytes: never")

    @model_validator(mode="after")
    def _refresh_fits(self) -> TimingConfig:
        check_refresh(self)
        return self


def to_cycles(dram: DramConfig) -> ProtocolTiming:
    """``dram.timing`` in whole CK cycles, with the command spacings of JESD209-5 in the
    model's terms (BG mode, bursts alternating bank groups; the formulas beside each)."""
    t = dram.timing
    beats_per_ck = 2 * t.wck_ck_ratio  # WCK is double data rate
    tck_ns = 1000.0 * beats_per_ck / dram.data_rate_mtps
    if 1000.0 / tck_ns > MAX_CK_MHZ + 1e-6:
        raise ValueError(
            f"dram.timing.wck_ck_ratio: CK would run at {1000.0 / tck_ns:.0f} MHz at "
            f"{dram.data_rate_mtps:g} MT/s with WCK:CK {t.wck_ck_ratio}:1; JESD209-5's CK "
            f"tops out at {MAX_CK_MHZ:g} MHz (use 4:1 above 3200 MT/s)")
    if t.burst_length % beats_per_ck:
        raise ValueError(f"dram.timing.burst_length ({t.burst_length}) is not a whole "
                         f"number of CK cycles at {beats_per_ck} beats per CK")
    ck, refi = core_cycles(t, tck_ns, (
        ("tRCD", "trcd_ns"), ("tRPpb", "trp_pb_ns"), ("tRPab", "trp_ab_ns"),
        ("tRAS", "tras_ns"), ("tRRD", "trrd_ns"), ("tFAW", "tfaw_ns"), ("tWR", "twr_ns"),
        ("tWTR_S", "twtr_ns"), ("tRTP", "trtp_ns"), ("tRFCab", "trfc_ab_ns")))
    ccd = t.burst_length // beats_per_ck  # BL/n: the burst's data cycles, = tCCD_S
    rl, wl = t.read_latency_ck, t.write_latency_ck
    named = {"tCCD_S (BL/n)": ccd, "tRCD": ck["tRCD"], "tRPpb": ck["tRPpb"],
             "tRPab": ck["tRPab"], "tRAS": ck["tRAS"], "tRC": ck["tRAS"] + ck["tRPpb"],
             "tRRD": ck["tRRD"], "tFAW": ck["tFAW"], "tWR": ck["tWR"],
             "tWTR_S": ck["tWTR_S"], "tRTP": ck["tRTP"], "tRFCab": ck["tRFCab"],
             "tREFI": refi, "RL": rl, "WL": wl}
    return ProtocolTiming(
        standard=NAME, **channel_fields(t, dram, tck_ns), ccd_ck=ccd, rcd_ck=ck["tRCD"],
        rp_pb_ck=ck["tRPpb"], rp_ab_ck=ck["tRPab"], ras_ck=ck["tRAS"],
        rrd_ck=ck["tRRD"], faw_ck=ck["tFAW"], rfc_ab_ck=ck["tRFCab"], refi_ck=refi,
        read_to_write_ck=rl + ccd - wl + t.read_to_write_gap_ck,  # RL + BL/n - WL + gap
        write_to_read_ck=wl + ccd + ck["tWTR_S"],  # WL + BL/n + RU(tWTR_S/tCK)
        read_to_precharge_ck=max(ccd, ck["tRTP"]),  # tRTP, never before the burst's data
        write_to_precharge_ck=wl + ccd + ck["tWR"],  # WL + BL/n + RU(tWR/tCK)
        read_done_ck=rl + ccd,  # read data ends RL + BL/n after the READ
        write_done_ck=wl + ccd,  # write data ends WL + BL/n after the WRITE
        named=named)


#: Ramulator2's LPDDR5 model (CMU-SAFARI/ramulator2, src/dram/impl/LPDDR5.cpp), preset
#: LPDDR5_6400 at tCK 1.25 ns: a public cross-check of the cycle counts below.
_RAMULATOR = "Ramulator2 LPDDR5.cpp preset LPDDR5_6400 (tCK_ps 1250)"

_SOURCES = {
    "standard": "LPDDR5: JEDEC JESD209-5",
    "wck_ck_ratio": "WCK:CK 4:1 above 3200 MT/s (CK at most 800 MHz, WCK 3200 MHz at "
    "6400 MT/s): JESD209-5",
    "banks_per_channel": "16 banks in BG mode (4 bank groups x 4 banks), the bank "
    "architecture of JESD209-5 above 3200 MT/s (16B mode up to 3200 MT/s, 8B mode BL32 "
    f"only); {_RAMULATOR} organisation LPDDR5_*_x16 (4 bank groups x 4 banks)",
    "page_bytes": "1024 columns x 16 bits = 2 KiB per row of an x16 channel (1 KiB per "
    f"byte lane): {_RAMULATOR} organisation LPDDR5_16Gb_x16 (1024 columns, DQ 16)",
    "burst_length": "BL16 (BG mode takes BL16 and BL32): JESD209-5; 16 beats x 16 bits = "
    "32 bytes per READ/WRITE of an x16 channel",
    "trcd_ns": f"tRCD = 18 ns: JESD209-5 core timing; {_RAMULATOR}: nRCD 15",
    "trp_pb_ns": f"tRPpb = 18 ns: JESD209-5; {_RAMULATOR}: nRPpb 15",
    "trp_ab_ns": f"tRPab = 21 ns: JESD209-5; {_RAMULATOR}: nRPab 17",
    "tras_ns": f"tRAS = 42 ns: JESD209-5; {_RAMULATOR}: nRAS 34",
    "trrd_ns": f"tRRD = 5 ns (2 KiB page): JESD209-5; {_RAMULATOR}: nRRD 4",
    "tfaw_ns": f"tFAW = 20 ns (2 KiB page): JESD209-5; {_RAMULATOR}: nFAW 16",
    "twr_ns": f"tWR = 34 ns: JESD209-5; {_RAMULATOR}: nWR 28",
    "twtr_ns": f"tWTR_S = 6.25 ns: JESD209-5; {_RAMULATOR}: nWTRS 5 (nWTRL 10, tWTR_L "
    "12 ns, not modelled)",
    "trfc_ab_ns": f"tRFCab = 280 ns for a 16 Gb die: JESD209-5; {_RAMULATOR} tRFCab table "
    "(2/4/8/16 Gb: 130/180/210/280 ns)",
    "trefi_ns": f"tREFI = 3.906 us (32 ms / 8192 refreshes, T <= 85 C): JESD209-5; "
    f"{_RAMULATOR}: tREFI_BASE 3906 ns",
    "read_latency_ck": f"RL = 20 nCK at 6400 MT/s, WCK:CK 4:1: {_RAMULATOR} (nCL 20)",
    "write_latency_ck": f"WL = 11 nCK at 6400 MT/s, WCK:CK 4:1: {_RAMULATOR} (nCWL 11)",
}
_ASSUMPTIONS = {
    "address_mapping": "not published for any device: row:bank:column within a channel",
    "burst_length": "bank groups are not modelled: consecutive bursts are taken to "
    "alternate bank groups (tCCD_S = BL/n = 2 nCK at BL16, 4:1); tCCD_L (4 nCK) of "
    "back-to-back bursts to one group is not modelled",
    "wck_ck_ratio": "WCK is not modelled: taken to run always (WCK always-on), so no "
    "CAS-WCK_SYNC, tWCKENL or tWCKPRE before a burst",
    "trefi_ns": "only all-bank refresh is modelled (tRFCab every tREFI); per-bank refresh "
    "(tRFCpb 140 ns for 16 Gb, JESD209-5) is not",
    "read_to_write_gap_ck": "2 nCK, standing in for the WCK-to-DQ offset and the write "
    f"preamble that the model does not time: {_RAMULATOR} spaces READ to WRITE by nCL + "
    "nBL16 + 2 - nCWL",
    "trtp_ns": "tRTP = 7.5 ns, READ to PRECHARGE (LPDDR4X's value, JESD209-4; JESD209-5 "
    f"states it as tRBTP from the burst's end); {_RAMULATOR} uses nRTP 4 (5 ns)",
}


def _grade() -> Grade:
    table = {"standard": NAME, "address_mapping": "row:bank:column", "wck_ck_ratio": 4,
             "banks_per_channel": 16, "page_bytes": 2048, "burst_length": 16,
             "trcd_ns": 18.0, "trp_pb_ns": 18.0, "trp_ab_ns": 21.0, "tras_ns": 42.0,
             "trrd_ns": 5.0, "tfaw_ns": 20.0, "twr_ns": 34.0, "twtr_ns": 6.25,
             "trtp_ns": 7.5, "trfc_ab_ns": 280.0, "trefi_ns": 3906.0,
             "read_latency_ck": 20, "write_latency_ck": 11, "read_to_write_gap_ck": 2}
    return Grade(table, dict(_SOURCES), dict(_ASSUMPTIONS))


#: Speed grades by name (``dram.timing = NAME`` in a preset; set ``dram.data_rate_mtps``
#: at or below the grade's rate: its RL and WL hold up to it).
GRADES = {"lpddr5-6400": _grade()}
