import numpy as np
import pytest

from isa.instructions import (
    DmaLoad,
    DmaStore,
    Engine,
    Gemm,
    HostRead,
    HostWrite,
    Nop,
    Program,
)
from kvsim.errors import DeviceError
from models.demo import demo_data, gemv_layer
from sim.device.device import Device
from sim.device.hw import load_hardware
from traces.recorder import Recorder

TINY = load_hardware("tiny")


@pytest.fixture(autouse=True, params=["simpy", "fast"])
def engine(request, monkeypatch):
    """Every test below runs, with the same exact figures, on both engines."""
    cls = Device

    def make(*args, **kw):
        dev = cls(*args, engine=request.param, **kw)
        assert dev.engine == request.param
        return dev

    monkeypatch.setitem(globals(), "Device", make)
    return request.param
NS = 1000


def _timeline(rec):
    return [(f"{s.block}.{s.lane}", s.name, s.start_ps, s.end_ps) for s in rec.spans]


def test_flags_order_engines_and_the_timeline_is_exact():
    rec = Recorder(level="ops")
    dev = Device(TINY, recorder=rec)
    prog = Program(
        (
            HostWrite(src=0, dst=0, nbytes=1024, signal=(1,)),
            DmaLoad(core=0, src=0, dst=0, nbytes=1024, wait=(1,), signal=(2,)),
            Gemm(core=0, m=1, k=1024, n=1, w_bits=8, a=0, w=0, out=2048, wait=(2,),
                 signal=(3,)),
            DmaStore(core=0, src=2048, dst=4096, nbytes=4, wait=(3,), signal=(4,)),
            HostRead(src=4096, dst=8192, nbytes=4, wait=(4,)),
        ),
        name="chain",
    )
    run = dev.run(prog)
    h2d = dev.link.time_ps("h2d", 1024)
    load_end = h2d + 100 * NS + 1024 * NS
    gemm_end = load_end + 16 * NS  # 1024 MACs / 64 per cycle
    store_end = gemm_end + 100 * NS + 4 * NS
    read_end = store_end + dev.link.time_ps("d2h", 4)
    assert _timeline(rec) == [
        ("pcie.h2d", "host.write", 0, h2d),
        ("core0.dma_in", "dma.load", h2d, load_end),
        ("core0.mxu", "gemm", load_end, gemm_end),
        ("core0.dma_out", "dma.store", gemm_end, store_end),
        ("pcie.d2h", "host.read", store_end, read_end),
    ]
    assert run.duration_ps == read_end
    assert run.stats["traffic"] == {
        "pcie_h2d": 1024, "dram_write": 1024 + 4, "dram_read": 1024 + 4, "pcie_d2h": 4,
    }


def test_engines_without_dependencies_overlap():
    rec = Recorder(level="ops")
    dev = Device(TINY, recorder=rec, functional=False)
    prog = Program(
        (
            DmaLoad(core=0, src=0, dst=0, nbytes=1024),
            DmaLoad(core=1, src=1024, dst=0, nbytes=1024),  # other channel: no contention
        )
    )
    run = dev.run(prog)
    assert run.duration_ps == 1124 * NS


def test_a_deadlocked_program_is_reported_with_the_waiting_engine():
    dev = Device(TINY, functional=False)
    prog = Program(
        (
            Nop(on=Engine.DMA_IN, wait=(5,), signal=(6,)),
            Nop(on=Engine.DMA_OUT, wait=(6,), signal=(5,)),
        ),
        name="cycle",
    )
    with pytest.raises(DeviceError, match=r"deadlocked: core0.dma_in at instruction 0 waiting "
                                          r"on flag 5"):
        dev.run(prog, validate=False)


@pytest.mark.parametrize("w_bits", [8, 4])
@pytest.mark.parametrize("preset", ["tiny", "aries"])
def test_double_buffered_gemv_computes_the_numpy_result(preset, w_bits):
    hw = load_hardware(preset)
    layer = gemv_layer(k=512, n=256 if preset == "tiny" else 1024, w_bits=w_bits,
                       num_cores=hw.cores.num_cores, sram_bytes=hw.sram.bytes_per_core,
                       dram_bytes=hw.dram.capacity_bytes, host_bytes=hw.host.memory_bytes,
                       tile_bytes=4096)
    dev = Device(hw, layout=layer.layout)
    data = demo_data(layer, seed=3)
    dev.mem.dram.write(layer.w_dram, data["w_bytes"])
    scales = next(r for r in layer.layout.regions if r.name == "scales")
    dev.mem.dram.write(scales.base, data["scale"].view(np.uint8))
    dev.host_write(layer.x_host, data["x"].view(np.uint8))
    dev.run(layer.program)
    y = dev.host_read(layer.y_host, layer.n).view(np.int8)
    acc = data["w"].astype(np.int64) @ data["x"].astype(np.int64) * data["scale"]
    ref = np.clip((acc + (1 << (layer.shift - 1))) >> layer.shift, -128, 127)
    np.testing.assert_array_equal(y, ref)


def test_double_buffering_overlaps_weight_loads_with_compute():
    hw = load_hardware("tiny")
    layer = gemv_layer(k=1024, n=64, w_bits=8, num_cores=1, sram_bytes=hw.sram.bytes_per_core,
                       dram_bytes=hw.dram.capacity_bytes, host_bytes=hw.host.memory_bytes,
                       tile_bytes=8192)
    rec = Recorder(level="ops")
    dev = Device(hw, recorder=rec, layout=layer.layout, functional=False)
    dev.run(layer.program)
    loads = [s for s in rec.spans if s.name == "dma.load" and s.args["index"] > 3]
    gemms = [s for s in rec.spans if s.name == "gemm"]
    assert len(gemms) == 8
    # the load of tile t+1 starts before the GEMM of tile t ends
    for g, nxt in zip(gemms, loads[1:], strict=False):
        assert nxt.start_ps < g.end_ps


def test_timing_only_and_functional_runs_take_the_same_simulated_time():
    hw = load_hardware("tiny")
    layer = gemv_layer(k=512, n=256, w_bits=8, num_cores=2, sram_bytes=hw.sram.bytes_per_core,
                       dram_bytes=hw.dram.capacity_bytes, host_bytes=hw.host.memory_bytes,
                       tile_bytes=4096)
    a = Device(hw, layout=layer.layout, functional=True).run(layer.program)
    b = Device(hw, layout=layer.layout, functional=False).run(layer.program)
    assert a.duration_ps == b.duration_ps and a.stats == b.stats


def test_traffic_is_attributed_to_region_kinds():
    hw = load_hardware("tiny")
    layer = gemv_layer(k=512, n=256, w_bits=8, num_cores=2, sram_bytes=hw.sram.bytes_per_core,
                       dram_bytes=hw.dram.capacity_bytes, host_bytes=hw.host.memory_bytes,
                       tile_bytes=4096)
    run = Device(hw, layout=layer.layout, functional=False).run(layer.program)
    lk = run.stats["link_kind"]
    assert lk[("dram_read", "weights")] == 512 * 256 + 4 * 256
    assert lk[("pcie_h2d", "host_io")] == 512
    assert lk[("pcie_d2h", "host_io")] == 256
