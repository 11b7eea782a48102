"""A second DRAM standard is its timing file: LPDDR5 (sim/device/dram/lpddr5.py) next to
LPDDR4X, chosen by ``[dram.timing] standard``. Its grade's cycles by hand from JESD209-5's
ns at tCK = 2 x 4 / 6400 MT/s = 1.25 ns, a preset on it validating and refusing bad fields
by name, and both engines giving one timeline on it."""

import pytest

from isa.instructions import DmaCopy, DmaLoad, DmaStore, HostWrite, Program
from kvsim.errors import ConfigError
from sim.app.cli.main import main
from sim.device.dram import lpddr5
from sim.device.dram.standards import STANDARDS, grade, grade_names, timing_from_config
from sim.device.hw import HardwareConfig, load_hardware
from tests.sim.test_engines import assert_same

LPDDR5_6400 = dict(grade("lpddr5-6400").table)
#: tiny (2 x8 channels at 1000 MT/s: CK 125 MHz at WCK:CK 4:1, 16 B bursts) on the LPDDR5
#: protocol model, rows reopened every 512 B
TINY_LPDDR5 = load_hardware("tiny", {
    "dram.model": "protocol", "dram.timing": {**LPDDR5_6400, "row_run_bytes": 512}})


def _x16_at_6400(**timing):
    """One LPDDR5-6400 x16 channel per the grade, with ``timing`` fields changed."""
    return load_hardware("tiny", {
        "dram.model": "protocol", "dram.data_rate_mtps": 6400.0,
        "dram.bus_width_bits_per_channel": 16, "dram.timing": {**LPDDR5_6400, **timing}})


def test_lpddr5_is_one_timing_file_and_one_line_of_standards():
    assert STANDARDS["lpddr5"] is lpddr5 and list(STANDARDS) == ["lpddr4x", "lpddr5"]
    assert "lpddr5-6400" in grade_names() and "lpddr4x-4266" in grade_names()


def test_lpddr5_6400_grade_in_whole_ck_cycles():
    t = timing_from_config(_x16_at_6400().dram)
    assert t.standard == "lpddr5"
    assert t.tck_ps == 1250.0  # CK 800 MHz: 6400 MT/s / (2 x WCK:CK 4)
    # ceil(ns / 1.25): tRCD 18 -> 14.4 -> 15, tRPpb 18 -> 15, tRPab 21 -> 16.8 -> 17,
    # tRAS 42 -> 33.6 -> 34, tRRD 5 -> 4, tFAW 20 -> 16, tRFCab 280 -> 224; tREFI
    # floor(3906 / 1.25 = 3124.8) = 3124
    assert (t.rcd_ck, t.rp_pb_ck, t.rp_ab_ck, t.ras_ck, t.rrd_ck, t.faw_ck) == (
        15, 15, 17, 34, 4, 16)
    assert (t.rfc_ab_ck, t.refi_ck, t.rc_ck) == (224, 3124, 49)
    n = t.named  # tWR 34 -> 27.2 -> 28, tWTR_S 6.25 -> 5, tRTP 7.5 -> 6
    assert (n["tWR"], n["tWTR_S"], n["tRTP"], n["RL"], n["WL"]) == (28, 5, 6, 20, 11)
    # BL16 at 8 beats per CK: 2 cycles of data (tCCD_S), 32 B of an x16 channel
    assert (t.ccd_ck, t.burst_bytes, t.banks, t.page_bytes) == (2, 32, 16, 2048)
    assert t.channel_peak_bytes_per_s == pytest.approx(2 * 6400e6)
    # RD->WR = RL + BL/n - WL + 2 = 20 + 2 - 11 + 2; WR->RD = WL + BL/n + tWTR_S = 11 + 2 + 5
    # RD->PRE = max(BL/n, tRTP) = 6; WR->PRE = WL + BL/n + tWR = 11 + 2 + 28
    assert (t.read_to_write_ck, t.write_to_read_ck) == (13, 18)
    assert (t.read_to_precharge_ck, t.write_to_precharge_ck) == (6, 41)
    assert (t.read_done_ck, t.write_done_ck) == (22, 13)


def test_a_preset_on_lpddr5_validates_round_trips_and_keeps_its_notes():
    hw = load_hardware("tiny", {"dram.model": "protocol", "dram.timing": "lpddr5-6400"})
    assert hw.dram.timing.standard == "lpddr5" and hw.dram.timing.wck_ck_ratio == 4
    dumped = hw.model_dump()
    assert dumped["dram"]["timing"]["standard"] == "lpddr5"
    assert HardwareConfig.model_validate(dumped) == hw
    for field in LPDDR5_6400:  # every value of the grade: a source or an assumption
        key = f"dram.timing.{field}"
        assert key in hw.sources or key in hw.assumptions, key
    assert "bank groups" in hw.assumptions["dram.timing.burst_length"]
    assert "WCK" in hw.assumptions["dram.timing.wck_ck_ratio"]
    # LPDDR4X tables, which name no standard, are LPDDR4X as before and dump as before
    aries = load_hardware("aries")
    assert aries.dram.timing.standard == "lpddr4x"
    assert "standard" not in aries.model_dump()["dram"]["timing"]


@pytest.mark.parametrize(("timing", "needle"), [
    ({"trcd_ns": -1.0}, r"hardware\.dram\.timing\.trcd_ns: Input should be greater"),
    ({"tdqsck_max_ns": 3.5}, r"hardware\.dram\.timing\.tdqsck_max_ns: unknown key"),
    ({"wck_ck_ratio": 3}, r"hardware\.dram\.timing\.wck_ck_ratio: Input should be 2 or 4"),
    ({"standard": "ddr9"}, r"hardware\.dram\.timing\.standard: unknown DRAM standard "
                           r"'ddr9'; valid: lpddr4x, lpddr5"),
    ({"wck_ck_ratio": 2}, r"dram\.timing\.wck_ck_ratio: CK would run at 1600 MHz"),
    ({"trefi_ns": 250.0}, r"hardware\.dram\.timing: trfc_ab_ns \+ trp_ab_ns"),
])
def test_a_bad_lpddr5_field_is_refused_by_name(timing, needle):
    with pytest.raises(ConfigError, match=needle):
        _x16_at_6400(**timing)


def test_an_lpddr4x_error_still_names_its_field_without_the_standard():
    with pytest.raises(ConfigError, match=r"hardware\.dram\.timing\.trcd_ns: Input"):
        load_hardware("aries", {"dram.timing.trcd_ns": -1.0})


def test_both_engines_give_one_timeline_on_lpddr5():
    # loads over both channels and rows reopened every 512 B, a store and a copy (read to
    # write turnarounds on the same banks), a host write, twice (state carried over)
    prog = Program((
        DmaLoad(core=0, src=0, dst=0, nbytes=6000, signal=(1,)),
        DmaLoad(core=1, src=512, dst=0, nbytes=2048),
        DmaStore(core=0, src=0, dst=700, nbytes=3000, wait=(1,)),
        DmaCopy(src=0, dst=20_000, nbytes=4_000),
        HostWrite(src=0, dst=40_000, nbytes=5_000),
    ))
    out = assert_same(TINY_LPDDR5, [prog, prog])
    assert out["dram_banks"] is not None  # the protocol model ran
    # moving one LPDDR5 value moves both engines alike
    slower = load_hardware("tiny", {"dram.model": "protocol", "dram.timing": {
        **LPDDR5_6400, "row_run_bytes": 512, "trcd_ns": 60.0}})
    assert assert_same(slower, [prog, prog])["now"] > out["now"]


def test_hw_show_prints_the_lpddr5_cycles(capsys):
    sets = ["--set", "dram.model=protocol", "--set", "dram.timing=lpddr5-6400"]
    assert main(["hw", "show", "tiny", *sets]) == 0
    text = capsys.readouterr().out
    assert "DRAM protocol timing (LPDDR5)" in text and "tWTR_S" in text
