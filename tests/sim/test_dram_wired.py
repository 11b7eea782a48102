"""The LPDDR4X protocol model wired into the engine (``dram.model = "protocol"``), and the
fixed costs of ``hardware.cores`` where they are modelled: exact times against hand
calculations from the timing parameters (aries: 4167 MT/s, tCK = 0.47996 ns)."""

import math

import pytest

from isa.instructions import DmaLoad, Engine, Gemm, Nop, Program
from sim.app.breakdown import FIXED_COSTS, Labelled, time_breakdown
from sim.device.components import Dram
from sim.device.device import Device, cross_core_waits
from sim.device.engine import kernel
from sim.device.hw import load_hardware
from sim.runtime import CallRecord
from sim.units import KiB, ns_to_ps
from traces.recorder import Recorder

TCK_PS = 2e6 / 4167.0
#: aries with the JEDEC-ideal schedule (no row interference from other masters)
IDEAL = {"dram.timing.row_run_bytes": None}
ARIES = load_hardware("aries", IDEAL)


def _ps(cycles: int) -> int:
    return math.ceil(cycles * TCK_PS - 1e-6)


def _dram(overrides: dict | None = None) -> tuple[kernel.Environment, Dram]:
    hw = load_hardware("aries", {**IDEAL, **overrides}) if overrides else ARIES
    env = kernel.Environment()
    return env, Dram(env, hw.dram, Recorder(level="off"))


def _issue_all(env, dram, accesses) -> int:
    """Start every ``(addr, nbytes, write)`` at time 0, in order; when the last one ends."""
    for addr, n, w in accesses:
        env.process(dram.access(addr, n, write=w))
    env.run()
    return env.now


def _arrival_ck(dram: Dram) -> int:
    """The channel cycle at which a request issued at 0 reaches the channels (after the
    controller's access latency)."""
    return math.ceil((dram.latency_ps - 1) / TCK_PS)


def test_aries_uses_the_protocol_model():
    assert load_hardware("aries").dram.model == "protocol"
    # the stream figure the breakdown and summaries use: 1 - (tRTP - BL/2 + tRPab + tRFCab +
    # tRCD) / tREFI = 1 - (16 - 8 + 44 + 792 + 38) / 8133
    assert ARIES.dram.streaming_efficiency == pytest.approx(1 - 882 / 8133, abs=1e-15)
    assert ARIES.dram.bound_bytes_per_s == ARIES.dram.peak_bytes_per_s


def test_a_lone_sequential_stream_through_dram_is_the_hand_calculation():
    env, dram = _dram()
    t0 = _arrival_ck(dram)
    assert dram.latency_ps == ns_to_ps(ARIES.dram.access_latency_ns)
    # 3 chunks of 64 KiB = 8 KiB per channel each: 768 bursts per channel, READs tCCD = 8
    # apart from tRCD after the arrival, the last data RL + BL/2 after the last READ; the
    # activations of later rows hide behind the data; all before the first refresh
    assert t0 + 38 + 768 * 8 < 8133
    end = _issue_all(env, dram, [(k * 64 * KiB, 64 * KiB, False) for k in range(3)])
    assert end == _ps(t0 + 38 + 767 * 8 + 36 + 8)
    assert dram.bytes_read == 3 * 64 * KiB
    assert dram.free_ps == [end] * 8  # every channel busy to the end


def test_row_interference_reopens_the_row_every_run():
    env, dram = _dram({"dram.timing.row_run_bytes": 1024})
    t0 = _arrival_ck(dram)
    # one 64 KiB chunk: 4 pages per channel, each reopened once at its middle: the bus waits
    # tRTP - BL/2 + tRPpb + tRCD = 16 - 8 + 38 + 38 = 84 cycles per reopen
    end = _issue_all(env, dram, [(0, 64 * KiB, False)])
    assert end == _ps(t0 + 38 + 255 * 8 + 4 * 84 + 36 + 8)
    # the long-stream closed form: one reopen per 512 cycles of data per page
    assert dram.cfg.streaming_efficiency == pytest.approx(
        (1 - 882 / 8133) * 512 / (512 + 84), abs=1e-15)


def test_refresh_only_loss_through_dram():
    # with closing and reopening free (tRTP within the burst, tRAS = tRPab = tRCD = 0) a
    # stream pays tRFCab = 792 cycles per refresh and nothing else
    free = {"dram.timing.trtp_ns": 0.0, "dram.timing.trp_ab_ns": 0.0,
            "dram.timing.trcd_ns": 0.0, "dram.timing.tras_ns": 0.0}
    env, dram = _dram(free)
    t0 = _arrival_ck(dram)
    chunks = 64  # 4 MiB: 512 KiB = 16,384 bursts per channel, 131,072 cycles of data
    end = _issue_all(env, dram, [(k * 64 * KiB, 64 * KiB, False) for k in range(chunks)])
    # hand: the channel moves one 256 B granule (8 bursts, 64 cycles) after another; a
    # granule that would start at or after a due refresh waits tRFCab first
    t, due, refreshes = t0, 8133, 0
    for _ in range(chunks * 64 * KiB // 8 // 256):
        if t >= due:
            t += 792
            due += 8133
            refreshes += 1
        t += 64
    assert refreshes == 17
    assert end == _ps(t - 8 + 36 + 8)
    busy = (t - t0) * TCK_PS
    assert 1 - 64 * 2048 * TCK_PS / busy == pytest.approx(17 * 792 / (t - t0), abs=1e-12)


def test_page_miss_bound_strided_records_through_dram():
    env, dram = _dram()
    t0 = _arrival_ck(dram)
    n = 32
    # 64 B (2 bursts) every 256 KiB: channel 0, bank 0, a new row each time; record i's
    # ACTIVATE at t0 + i x tRC (PRECHARGE at tRAS = 88, then tRPpb = 38: 126), its READs at
    # +tRCD and +tRCD + 8, data RL + BL/2 after the second
    end = _issue_all(env, dram, [(i * 256 * KiB, 64, False) for i in range(n)])
    assert end == _ps(t0 + (n - 1) * 126 + 38 + 8 + 36 + 8)
    # one record per tRC: 64 B per 126 cycles of a 4 B/cycle channel, 12.7 % of its peak
    ck = (end - dram.latency_ps) / TCK_PS
    assert n * 64 / (4 * ck) == pytest.approx(64 / (4 * 126), rel=0.03)


def test_bank_xor_hashing_spreads_the_same_stride_over_four_banks():
    env, dram = _dram({"dram.timing.address_mapping": "row:bank^row:column"})
    t0 = _arrival_ck(dram)
    n = 32
    # row 2i of the plain bank 0 goes to bank (2i mod 8): banks 0, 2, 4, 6 in turn. ACTs
    # tRRD = 21 apart, and a bank again after tRC = 126: ACT i at (i // 4) x 126 + (i % 4) x 21
    end = _issue_all(env, dram, [(i * 256 * KiB, 64, False) for i in range(n)])
    last_act = (n - 1) // 4 * 126 + (n - 1) % 4 * 21
    assert end == _ps(t0 + last_act + 38 + 8 + 36 + 8)


def test_a_write_after_reads_pays_the_turnaround_through_dram():
    env, dram = _dram()
    t0 = _arrival_ck(dram)
    # one burst read, then one burst written in the same open row: WRITE at READ + RD->WR
    # (36), its data done WL + 1 + BL/2 after it
    end = _issue_all(env, dram, [(0, 32, False), (32, 32, True)])
    assert end == _ps(t0 + 38 + 36 + 18 + 1 + 8)


# --- the fixed costs, exactly where they are modelled --------------------------------------

FIXED = {"cores.dispatch_cycles": 5, "cores.program_launch_ns": 200.0,
         "cores.barrier_sync_ns": 30.0}


def test_launch_dispatch_and_barrier_sync_on_a_tiny_program():
    hw = load_hardware("tiny", FIXED)  # 1 GHz: a cycle is 1000 ps
    rec = Recorder(level="ops")
    dev = Device(hw, functional=False, recorder=rec, engine="fast")
    # core 0's MXU: 64 x 256 x 1 MACs / 64 per cycle = 256 cycles, signals core 1's GEMM;
    # the nop joining a flag costs no dispatch
    prog = Program((
        Gemm(core=0, m=1, k=256, n=64, w_bits=8, a=0, w=0, out=4096, signal=(16,)),
        Gemm(core=1, m=1, k=64, n=64, w_bits=8, a=0, w=0, out=4096, wait=(16,),
                signal=(17,)),
        Nop(on=Engine.VPU, core=1, wait=(17,)),
    ))
    assert cross_core_waits(prog) == frozenset({1})
    run = dev.run(prog, validate=False)
    spans = [(s.block, s.lane, s.start_ps, s.end_ps) for s in rec.spans
             if s.block.startswith("core")]
    launch, dispatch, sync = 200_000, 5_000, 30_000
    g0 = (launch + dispatch, launch + dispatch + 256_000)
    g1 = (g0[1] + sync, g0[1] + sync + 64_000)
    assert spans == [("core0", "mxu", *g0), ("core1", "mxu", *g1),
                     ("core1", "vpu", g1[1], g1[1])]
    assert run.end_ps == g1[1]
    st = run.stats
    assert st["launch_ps"] == launch
    assert st["dispatch_ps"] == {"core0.mxu": dispatch, "core1.mxu": dispatch}
    assert st["sync_ps"] == {"core1.mxu": sync}
    tb = time_breakdown([Labelled(CallRecord("infer", run.start_ps, run.end_ps, st),
                                  "decode", 0, 1, 1)], hw)["decode"]
    assert {k: getattr(tb, k) for k in FIXED_COSTS} == {
        "program_launch_s": 200e-9, "dispatch_s": 5e-9, "barrier_sync_s": 30e-9}


def test_no_fixed_costs_without_the_parameters():
    hw = load_hardware("tiny")
    dev = Device(hw, functional=False, engine="fast")
    run = dev.run(Program((DmaLoad(core=0, src=0, dst=0, nbytes=1024),)), validate=False)
    assert (run.stats["launch_ps"], run.stats["dispatch_ps"], run.stats["sync_ps"]) == (
        0, {}, {})


def test_protocol_needs_a_timing_table():
    from kvsim.errors import ConfigError

    with pytest.raises(ConfigError, match=r"dram.*\[dram\.timing\]"):
        load_hardware("tiny", {"dram.model": "protocol"})


# --- the calibration's parameters ------------------------------------------------------------


def test_row_runs_give_each_reopen_count_once_and_the_fit_is_inside_its_bounds():
    from sim.app.calibration import RUN_BOUNDS_BYTES, SRAM_BOUNDS_BYTES, run_lengths
    from sim.device.dram.patterns import reopens_per_page
    from sim.device.dram.timing import timing_from_config

    runs = run_lengths()
    assert runs == [2048, 1024, 704, 512, 416, 352, 320, 256]
    counts = [reopens_per_page(timing_from_config(load_hardware(
        "aries", {"dram.timing.row_run_bytes": r}).dram)) for r in runs]
    assert counts == list(range(8))  # ceil(2048 / run) - 1
    aries = load_hardware("aries")
    assert RUN_BOUNDS_BYTES[0] <= aries.dram.timing.row_run_bytes <= RUN_BOUNDS_BYTES[1]
    assert SRAM_BOUNDS_BYTES[0] <= aries.sram.bytes_per_core <= SRAM_BOUNDS_BYTES[1]
