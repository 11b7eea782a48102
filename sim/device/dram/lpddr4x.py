"""LPDDR4/LPDDR4X (JEDEC JESD209-4): the timing file of the standard.

What a hardware preset writes under ``[dram.timing]`` (:class:`TimingConfig`: datasheet
minimums in ns, latencies set in mode registers in cycles), how those become whole cycles
of the channel clock and the command spacings the standard's rules give
(:func:`to_cycles`, read by the protocol step through
:class:`~sim.device.dram.cycles.ProtocolTiming`), and the values of the speed grades this
project uses, each with its sources (:data:`GRADES`: a preset may name one,
``dram.timing = "lpddr4x-3733"``).

The channel clock is half the data rate (DDR: two transfers per clock), so a burst of
BL beats takes BL/2 cycles.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from models.schema import Frozen
from sim.device.dram.cycles import Grade, ProtocolTiming, channel_fields, check_refresh, core_cycles

if TYPE_CHECKING:
    from sim.device.hw import DramConfig

NAME = "lpddr4x"


class TimingConfig(Frozen):
    """LPDDR4/LPDDR4X organisation and timing of one x16 channel (JEDEC JESD209-4).

    Times are the datasheet minimums in ns (``trefi_ns`` is the maximum average refresh
    interval); :func:`to_cycles` rounds each to whole cycles of the channel clock
    (``data_rate_mtps / 2``). Latencies set in mode registers (RL, WL, write preamble) are
    already in cycles. The engine uses them when ``dram.model = "protocol"``.
    """

    #: the standard (the default: a table without the key is LPDDR4X); not written out
    standard: Literal["lpddr4x"] = Field("lpddr4x", exclude=True)
    address_mapping: Literal["row:bank:column", "row:bank^row:column"] = Field(
        description="how a channel-local address splits into row, bank and column (high to "
        "low bits); the channel bits sit at the interleave granule. 'row:bank^row:column' "
        "hashes the bank: bank bits XOR the low row bits, as controllers do to spread "
        "power-of-two strides over the banks")
    banks_per_channel: int = Field(ge=1)
    page_bytes: int = Field(ge=32, description="row (page) size of one channel in bytes")
    burst_length: Literal[16, 32] = Field(description="beats per READ/WRITE command (BL)")
    trcd_ns: float = Field(ge=0, description="ACTIVATE to READ/WRITE")
    trp_pb_ns: float = Field(ge=0, description="per-bank PRECHARGE period")
    trp_ab_ns: float = Field(ge=0, description="all-bank PRECHARGE period")
    tras_ns: float = Field(ge=0, description="ACTIVATE to PRECHARGE, same bank")
    trrd_ns: float = Field(ge=0, description="ACTIVATE to ACTIVATE, different banks")
    tfaw_ns: float = Field(ge=0, description="window holding at most four ACTIVATEs")
    twr_ns: float = Field(ge=0, description="write recovery: end of write data to PRECHARGE")
    twtr_ns: float = Field(ge=0, description="end of write data to READ (turnaround)")
    trtp_ns: float = Field(ge=0, description="READ to PRECHARGE")
    trfc_ab_ns: float = Field(ge=0, description="all-bank REFRESH cycle time")
    trefi_ns: float = Field(gt=0, description="average interval between all-bank REFRESHes")
    tdqsck_max_ns: float = Field(ge=0, description="read data strobe delay from clock, max")
    read_latency_ck: int = Field(ge=1, description="RL: READ command to first data, cycles")
    write_latency_ck: int = Field(ge=1, description="WL: WRITE command to first data, cycles")
    write_preamble_ck: int = Field(ge=0, description="tWPRE: write DQS preamble, cycles")
    row_run_bytes: int | None = Field(
        None, ge=32, description="multi-master row interference (a controller property, "
        "not JEDEC): an open row serves this many bytes of one stream before other "
        "masters' accesses to the bank close it and it must be reopened (tRTP/tWR, tRPpb, "
        "tRCD): runs from the row's start, so ceil(page_bytes / row_run_bytes) - 1 reopens "
        "per row of a stream; None or >= page_bytes: never")

    @model_validator(mode="after")
    def _refresh_fits(self) -> TimingConfig:
        check_refresh(self)
        return self


def to_cycles(dram: DramConfig) -> ProtocolTiming:
    """``dram.timing`` in whole cycles of the channel clock, with the command spacings of
    JESD209-4 (BL16; the formulas beside each)."""
    t = dram.timing
    tck_ns = 2000.0 / dram.data_rate_mtps  # DDR: two transfers per clock
    ck, refi = core_cycles(t, tck_ns, (
        ("tRCD", "trcd_ns"), ("tRPpb", "trp_pb_ns"), ("tRPab", "trp_ab_ns"),
        ("tRAS", "tras_ns"), ("tRRD", "trrd_ns"), ("tFAW", "tfaw_ns"), ("tWR", "twr_ns"),
        ("tWTR", "twtr_ns"), ("tRTP", "trtp_ns"), ("tRFCab", "trfc_ab_ns"),
        ("tDQSCK(max)", "tdqsck_max_ns")))
    ccd = t.burst_length // 2  # BL/2: data cycles of one burst, READ-to-READ spacing
    rl, wl, wpre = t.read_latency_ck, t.write_latency_ck, t.write_preamble_ck
    named = {"tCCD (BL/2)": ccd, "tRCD": ck["tRCD"], "tRPpb": ck["tRPpb"],
             "tRPab": ck["tRPab"], "tRAS": ck["tRAS"], "tRC": ck["tRAS"] + ck["tRPpb"],
             "tRRD": ck["tRRD"], "tFAW": ck["tFAW"], "tWR": ck["tWR"], "tWTR": ck["tWTR"],
             "tRTP": ck["tRTP"], "tRFCab": ck["tRFCab"], "tREFI": refi, "RL": rl, "WL": wl,
             "tDQSCK(max)": ck["tDQSCK(max)"], "tWPRE": wpre}
    return ProtocolTiming(
        standard=NAME, **channel_fields(t, dram, tck_ns), ccd_ck=ccd, rcd_ck=ck["tRCD"],
        rp_pb_ck=ck["tRPpb"], rp_ab_ck=ck["tRPab"], ras_ck=ck["tRAS"], rrd_ck=ck["tRRD"],
        faw_ck=ck["tFAW"], rfc_ab_ck=ck["tRFCab"], refi_ck=refi,
        # RL + RU(tDQSCKmax/tCK) + BL/2 - WL + tWPRE + RD(tRPST); tRPST 0.5 nCK rounds to 0
        read_to_write_ck=rl + ck["tDQSCK(max)"] + ccd - wl + wpre,
        write_to_read_ck=wl + 1 + ccd + ck["tWTR"],  # WL + 1 + BL/2 + RU(tWTR/tCK)
        read_to_precharge_ck=ccd + max(8, ck["tRTP"]) - 8,  # BL/2 + max(8, nRTP) - 8
        write_to_precharge_ck=wl + ccd + 1 + ck["tWR"],  # WL + BL/2 + 1 + RU(tWR/tCK)
        read_done_ck=rl + ccd,  # read data ends RL + BL/2 after the READ
        write_done_ck=wl + 1 + ccd,  # write data WL + 1 + BL/2 after the WRITE
        named=named)


#: The core timings in ns are the same in every LPDDR4X speed grade (JESD209-4 core AC
#: timing: the minimums do not depend on the clock); RL and WL are the mode-register
#: settings of the grade's data rate (write latency set A, read DBI off).
_CORE_NS = {"trcd_ns": 18.0, "trp_pb_ns": 18.0, "trp_ab_ns": 21.0, "tras_ns": 42.0,
            "trrd_ns": 10.0, "tfaw_ns": 40.0, "twr_ns": 18.0, "twtr_ns": 10.0,
            "trtp_ns": 7.5, "trfc_ab_ns": 380.0, "trefi_ns": 3904.0, "tdqsck_max_ns": 3.5}
_CORE_SOURCES = {
    "banks_per_channel": "8 banks per channel: JEDEC JESD209-4 (LPDDR4/4X); Micron "
    "MT53D512M32D2 LPDDR4/LPDDR4X datasheet; DRAMSys memspecs JEDEC_1Gbx16_LPDDR4-*.json "
    "(nbrOfBanks 8)",
    "page_bytes": "1024 columns x 16 bits = 2 KiB per row of an x16 channel: DRAMSys "
    "JEDEC_1Gbx16_LPDDR4-*.json (nbrOfColumns 1024, width 16)",
    "burst_length": "BL16 (BL32 on the fly): Micron MT53D512M32D2 datasheet; 16 beats x 16 "
    "bits = 32 bytes per READ/WRITE",
    "trcd_ns": "tRCD = max(18 ns, 4 nCK): JESD209-4 core timing",
    "trp_pb_ns": "tRPpb = max(18 ns, 4 nCK): JESD209-4",
    "trp_ab_ns": "tRPab = max(21 ns, 4 nCK): JESD209-4",
    "tras_ns": "tRAS = max(42 ns, 3 nCK): JESD209-4",
    "trrd_ns": "tRRD = max(10 ns, 4 nCK): JESD209-4",
    "tfaw_ns": "tFAW = 40 ns: JESD209-4",
    "twr_ns": "tWR = max(18 ns, 6 nCK): JESD209-4",
    "twtr_ns": "tWTR = max(10 ns, 8 nCK): JESD209-4",
    "trtp_ns": "tRTP = max(7.5 ns, 8 nCK): JESD209-4",
    "trfc_ab_ns": "tRFCab = 380 ns for 12/16 Gb per channel: JESD209-4",
    "trefi_ns": "tREFI = 3.904 us (32 ms / 8192 refreshes, T <= 85 C): JESD209-4",
    "write_preamble_ck": "tWPRE = 2 nCK: JESD209-4",
}
_CORE_ASSUMPTIONS = {
    "address_mapping": "not published for any device: row:bank:column within a channel",
    "tdqsck_max_ns": "tDQSCK max 3.5 ns (JESD209-4 range 1.5-3.5 ns as commonly quoted): "
    "enters only the read-to-write turnaround",
}


def _grade(rl: int, wl: int, rate: str) -> Grade:
    table = {"address_mapping": "row:bank:column", "banks_per_channel": 8,
             "page_bytes": 2048, "burst_length": 16, **_CORE_NS, "read_latency_ck": rl,
             "write_latency_ck": wl, "write_preamble_ck": 2}
    latency = (f"RL = {rl} nCK (read DBI off), WL = {wl} nCK (set A) up to {rate} MT/s: "
               f"JESD209-4 read and write latency table; DRAMSys "
               f"JEDEC_1Gbx16_LPDDR4-{rate}.json (RL {rl}, WL {wl})")
    return Grade(table, {**_CORE_SOURCES, "read_latency_ck": latency,
                         "write_latency_ck": latency}, _CORE_ASSUMPTIONS)


#: Speed grades by name (``dram.timing = NAME`` in a preset; set ``dram.data_rate_mtps``
#: at or below the grade's rate: its RL and WL hold up to it).
GRADES = {"lpddr4x-4266": _grade(36, 18, "4266"), "lpddr4x-3733": _grade(32, 16, "3733")}
