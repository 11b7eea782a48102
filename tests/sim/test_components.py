"""Exact timelines of the components on the ``tiny`` preset (round numbers).

tiny: DRAM 2 channels x 1 GB/s (1 byte/ns each), access latency 100 ns, interleave 1 KiB;
DMA chunks of 1 KiB, 2 outstanding, no setup; SRAM 64 B/cycle at 1 GHz; PCIe Gen4 x1,
latency 1 us, 4 KiB link chunks.
"""

import math

import pytest
import simpy
from hypothesis import given
from hypothesis import strategies as st

from kvsim.errors import DeviceError
from sim.device.components import ComputeCore, DmaEngine, Dram, HostLink, Sram
from sim.device.components.dram import bytes_per_channel
from sim.device.hw import load_hardware
from sim.units import PS_PER_S, ns_to_ps, transfer_ps

TINY = load_hardware("tiny")
NS = 1000  # ps


@pytest.fixture
def env():
    return simpy.Environment()


def timed(env, log, who, gen):
    def proc():
        start = env.now
        yield from gen
        log.append((who, start, env.now))

    return env.process(proc())


# --- DRAM -------------------------------------------------------------------------------


@given(
    addr=st.integers(0, 10_000),
    nbytes=st.integers(0, 20_000),
    granule=st.sampled_from([64, 256, 1000, 1024]),
    channels=st.integers(1, 8),
)
def test_bytes_per_channel_matches_byte_by_byte_count(addr, nbytes, granule, channels):
    ref = [0] * channels
    for a in range(addr, addr + nbytes):
        ref[(a // granule) % channels] += 1
    assert bytes_per_channel(addr, nbytes, granule, channels) == ref


def test_dram_lone_access_is_latency_plus_bytes_over_channel_bandwidth(env, log, recorder):
    dram = Dram(env, TINY.dram, recorder)
    timed(env, log, "a", dram.access(0, 1024, write=False))
    env.run()
    assert log == [("a", 0, 100 * NS + 1024 * NS)]


def test_dram_access_striped_over_both_channels_runs_them_in_parallel(env, log, recorder):
    dram = Dram(env, TINY.dram, recorder)
    timed(env, log, "a", dram.access(0, 2048, write=False))
    env.run()
    assert log == [("a", 0, 1124 * NS)]


def test_two_accesses_on_one_channel_queue(env, log, recorder):
    dram = Dram(env, TINY.dram, recorder)
    timed(env, log, "a", dram.access(0, 1024, write=False))  # channel 0
    timed(env, log, "b", dram.access(2048, 1024, write=True))  # channel 0 as well
    timed(env, log, "c", dram.access(1024, 1024, write=False))  # channel 1: no contention
    env.run()
    assert log == [("a", 0, 1124 * NS), ("c", 0, 1124 * NS), ("b", 0, 2148 * NS)]
    assert dram.bytes_read == 2048 and dram.bytes_written == 1024


# --- SRAM -------------------------------------------------------------------------------


def test_sram_allocation_that_does_not_fit_is_an_error(env):
    sram = Sram(env, TINY.sram, TINY.cores.clock_hz, core=0)
    a = sram.alloc(40_000)
    with pytest.raises(DeviceError, match="do not fit"):
        sram.alloc(30_000)
    sram.free(a)
    assert sram.alloc(65_536) == 0


def test_sram_first_fit_reuses_freed_hole(env):
    sram = Sram(env, TINY.sram, TINY.cores.clock_hz, core=0)
    a = sram.alloc(1000)
    b = sram.alloc(1000)
    sram.free(a)
    assert sram.alloc(500) == a
    assert b == 1024  # 64-byte alignment


def test_sram_port_time_is_bytes_over_port_bandwidth(env, log):
    sram = Sram(env, TINY.sram, TINY.cores.clock_hz, core=0)
    timed(env, log, "a", sram.port_access(640))
    timed(env, log, "b", sram.port_access(64))  # one port: waits for a
    env.run()
    assert log == [("a", 0, 10 * NS), ("b", 0, 11 * NS)]


# --- DMA --------------------------------------------------------------------------------


def _dma(env, recorder, lane="dma_in"):
    dram = Dram(env, TINY.dram, recorder)
    sram = Sram(env, TINY.sram, TINY.cores.clock_hz, core=0)
    return dram, DmaEngine(env, "core0", lane, TINY.dma, dram, sram, recorder)


def test_dma_load_keeps_two_chunks_in_flight(env, log, recorder):
    _, dma = _dma(env, recorder)
    timed(env, log, "load", dma.transfer("load", 0, 0, 4096))
    env.run()
    # chunks 0 and 1 on channels 0 and 1 in parallel (100 + 1024 ns), then chunks 2 and 3.
    assert log == [("load", 0, 2248 * NS)]
    chunks = [(s.start_ps, s.end_ps) for s in recorder.spans if s.lane == "dma_in"]
    assert chunks == [(0, 1124 * NS), (0, 1124 * NS), (1124 * NS, 2248 * NS),
                      (1124 * NS, 2248 * NS)]


def test_two_dmas_on_one_channel_contend(env, log, recorder):
    dram, load = _dma(env, recorder)
    sram1 = Sram(env, TINY.sram, TINY.cores.clock_hz, core=1)
    other = DmaEngine(env, "core1", "dma_in", TINY.dma, dram, sram1, recorder)
    timed(env, log, "core0", load.transfer("load", 0, 0, 1024))
    timed(env, log, "core1", other.transfer("load", 2048, 0, 1024))
    env.run()
    assert log == [("core0", 0, 1124 * NS), ("core1", 0, 2148 * NS)]


def test_dma_copy_reads_then_writes_each_chunk(env, log, recorder):
    dram = Dram(env, TINY.dram, recorder)
    copy = DmaEngine(env, "device", "copy", TINY.dma, dram, None, recorder)
    timed(env, log, "copy", copy.transfer("copy", 0, 4096, 1024))
    env.run()
    assert log == [("copy", 0, 2 * 1124 * NS)]


def test_dram_stream_reaches_configured_effective_bandwidth(env, recorder):
    # the efficiency model (the protocol model's streams: tests/sim/test_dram_wired.py)
    aries = load_hardware("aries", {"dram.model": "efficiency"})
    dram = Dram(env, aries.dram, recorder)
    sram = Sram(env, aries.sram, aries.cores.clock_hz, core=0)
    dma = DmaEngine(env, "core0", "dma_in", aries.dma, dram, sram, recorder)
    nbytes = 4 * 2**20
    env.process(dma.transfer("load", 0, 0, nbytes))
    env.run()
    achieved = nbytes / (env.now / PS_PER_S)
    expected = aries.dram.effective_bytes_per_s
    # Only the one-off setup and access latency separate the stream from the bound.
    overhead_ps = ns_to_ps(aries.dma.setup_latency_ns + aries.dram.access_latency_ns)
    assert env.now == pytest.approx(overhead_ps + transfer_ps(nbytes, expected), rel=1e-3)
    assert achieved == pytest.approx(expected, rel=0.01)


# --- host link --------------------------------------------------------------------------


def test_pcie_gen4_x8_effective_bandwidth_is_physically_plausible():
    pcie = load_hardware("aries").host_link.pcie
    assert pcie.raw_bytes_per_s == pytest.approx(8 * 16e9 * 128 / 130 / 8)
    assert 12e9 <= pcie.d2h_effective_bytes_per_s <= 14.5e9
    assert 12e9 <= pcie.h2d_effective_bytes_per_s <= 14.5e9
    # 256-byte payload with 24 bytes of TLP overhead: 91.4 % before DLLPs (FACTS.md: 91 %)
    assert 256 / (256 + pcie.write_tlp_overhead_bytes) == pytest.approx(0.914, abs=1e-3)


@pytest.mark.parametrize("preset", ["tiny", "aries"])
@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_lone_pcie_transfer_is_latency_plus_bytes_over_effective_bandwidth(
    env, log, recorder, preset, direction
):
    hw = load_hardware(preset)
    link = HostLink(env, hw.host_link, Dram(env, hw.dram, recorder), recorder)
    nbytes = 3 * 2**20 + 17
    timed(env, log, direction, link.transfer(direction, 0, nbytes))
    env.run()
    bw = getattr(hw.host_link, f"{direction}_effective_bytes_per_s")
    expected = ns_to_ps(hw.host_link.latency_ns) + math.ceil(nbytes * PS_PER_S / bw)
    assert log == [(direction, 0, expected)]


def test_pcie_directions_are_independent_and_one_direction_is_shared(env, log, recorder):
    link = HostLink(env, TINY.host_link, Dram(env, TINY.dram, recorder), recorder)
    n = 8192
    timed(env, log, "h2d", link.transfer("h2d", 0, n))
    timed(env, log, "d2h", link.transfer("d2h", 0, n))
    env.run()
    assert log == sorted(
        [("h2d", 0, link.time_ps("h2d", n)), ("d2h", 0, link.time_ps("d2h", n))],
        key=lambda x: x[2],
    )

    env2 = type(env)()
    link2 = HostLink(env2, TINY.host_link, Dram(env2, TINY.dram, recorder), recorder)
    log2 = []
    timed(env2, log2, "a", link2.transfer("h2d", 0, n))
    timed(env2, log2, "b", link2.transfer("h2d", 0, n))
    env2.run()
    # Same direction: 4 KiB chunks alternate a, b, a, b; a ends one chunk before b.
    chunk = transfer_ps(4096, TINY.host_link.h2d_effective_bytes_per_s)
    lat = ns_to_ps(TINY.host_link.latency_ns)
    assert log2 == [("a", 0, lat + 3 * chunk), ("b", 0, lat + 4 * chunk)]


def test_shared_dram_host_link_uses_dram_channels(env, log, recorder):
    hw = load_hardware("regulus")
    dram = Dram(env, hw.dram, recorder)
    link = HostLink(env, hw.host_link, dram, recorder)
    n = 2**20
    timed(env, log, "d2h", link.transfer("d2h", 0, n))
    env.run()
    assert dram.bytes_read == n and dram.bytes_written == n
    cpu_ps = transfer_ps(n, hw.host_link.shared_dram.host_copy_bytes_per_s)
    assert log[0][2] >= ns_to_ps(hw.host_link.latency_ns) + cpu_ps


# --- compute ----------------------------------------------------------------------------


def test_gemm_cycles_are_macs_over_array_rate():
    from isa.instructions import Gemm, Vec, VecFunc

    core = ComputeCore(TINY.cores, 0)
    g = Gemm(m=2, k=64, n=32, w_bits=8, a=0, w=0, out=0)
    assert core.cycles(g) == 2 * 64 * 32 // 64
    assert core.duration_ps(g) == 64 * NS
    v = Vec(func=VecFunc.ADD, rows=1, cols=160, src0=0, src1=0, dst=0)
    assert core.cycles(v) == math.ceil(160 * 3 / 16)
