"""The fast engines and SimPy give identical timelines.

Each scenario runs on three devices, one per engine: ``simpy`` (the reference), ``kernel``
(the same processes on the lean event kernel) and ``fast`` (the array loop of
``sim.device.engine.loop`` wherever the device is eligible, which these scenarios
check it used), and compares everything a run leaves behind: every recorder span
(instructions, DMA chunks, DRAM bursts, link chunks) in order with its times and
arguments, the byte bins and totals, the per-program timing and stats, the device's
counters, the state of every channel, port and link direction and, in functional mode,
the bytes in memory and the results.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim.runtime.accelerator
from isa.instructions import (
    Attn,
    DmaCopy,
    DmaLoad,
    DmaStore,
    Engine,
    Gemm,
    HostRead,
    HostWrite,
    KvRead,
    KvWrite,
    Nop,
    Program,
    Vec,
    VecFunc,
)
from kvsim.errors import DeviceError
from models.bits import build_bit_config
from models.compiler import HardwareTarget, compile_model
from models.demo import demo_data, gemv_layer
from models.source import load_preset
from sim.device.device import Device, cross_core_waits
from sim.device.engine import array as array_engine
from sim.device.engine import kernel, loopdefs
from sim.device.engine import tables as program_tables
from sim.device.hw import load_hardware, preset_dict
from sim.runtime import Accelerator, Model
from traces.recorder import Recorder

TINY = load_hardware("tiny")
#: tiny with the LPDDR4X protocol model (aries' timing on its 2 x8 channels: 16 B bursts)
#: and every fixed cost of hardware.cores
TINY_PROTOCOL = load_hardware("tiny", {
    "dram.model": "protocol", "dram.timing": preset_dict("aries")["dram"]["timing"],
    "dram.timing.row_run_bytes": 512, "cores.dispatch_cycles": 3,
    "cores.program_launch_ns": 250.0, "cores.barrier_sync_ns": 40.0})
ENGINES = ("simpy", "kernel", "fast")


def _state(dev: Device, rec: Recorder, runs: list) -> dict:
    return {
        "runs": runs,
        "now": dev.env.now,
        "spans": rec.spans,
        "bytes": rec.bytes,
        "byte_totals": rec.byte_totals,
        "dropped": rec.dropped,
        "stats": dev.stats.snapshot(),
        "busy_order": list(dev.stats.busy_ps),
        "dram": (dev.dram.free_ps, dev.dram.bytes_read, dev.dram.bytes_written),
        "dram_banks": ([a.tolist() for a in vars(dev.dram.state).values()]
                       if dev.dram.protocol else None),
        "link": dev.link.free_ps,
        "ports": [s.port_free_ps for s in dev.srams],
    }


def _run(engine: str, hw, programs, *, functional=False, layout=None, setup=None,
         level="tiles", max_events: int | None = None) -> dict:
    rec = Recorder(level=level) if max_events is None else Recorder(level=level,
                                                                     max_events=max_events)
    dev = Device(hw, functional=functional, recorder=rec, layout=layout, engine=engine)
    assert dev.engine == engine
    if engine == "fast" and array_engine.eligible(dev):
        dev.start = _no_processes  # the array loop must run these programs
    if setup is not None:
        setup(dev)
    runs = []
    for p in programs:
        try:
            runs.append(dev.run(p, validate=False))
        except DeviceError as err:  # a deadlock must be reported the same way
            runs.append(str(err))
            break
    out = _state(dev, rec, runs)
    if functional:
        out["dram_pages"] = {k: v.tobytes() for k, v in dev.mem.dram._pages.items()}
        out["host_pages"] = {k: v.tobytes() for k, v in dev.mem.host._pages.items()}
        out["sram"] = [s.tobytes() for s in dev.mem.sram]
    return out


def _no_processes(*_args, **_kw):
    raise AssertionError("the fast engine ran generator processes on an eligible device")


def assert_same(hw, programs, **kw) -> dict:
    a = _run("simpy", hw, programs, **kw)
    for engine in ("kernel", "fast"):
        b = _run(engine, hw, programs, **kw)
        for key in a:
            assert a[key] == b[key], (engine, key)
    return a


# --- hand-built contention ----------------------------------------------------------------


def test_two_dmas_on_one_channel_and_the_slot_limit():
    # both cores load from the same 1 KiB granule at once (one channel), and core 0 loads
    # 8 chunks through 2 outstanding slots while core 1 stores
    out = assert_same(TINY, [Program((
        DmaLoad(core=0, src=0, dst=0, nbytes=1024),
        DmaLoad(core=1, src=0, dst=0, nbytes=1024),
        DmaLoad(core=0, src=4096, dst=4096, nbytes=8192),
        DmaStore(core=1, src=0, dst=2048, nbytes=3000),
        DmaStore(core=0, src=0, dst=64, nbytes=100, rows=4, src_stride=200, dst_stride=300),
    ))])
    chunks = [s for s in out["spans"] if s.name == "load chunk"]
    assert len(chunks) == 10  # the contention really happened in the scenario
    assert len({(s.start_ps, s.end_ps) for s in chunks if s.block == "core0"}) == 9


def test_both_pcie_directions_and_the_copy_engine_at_once():
    assert_same(TINY, [Program((
        HostWrite(src=0, dst=0, nbytes=10_000),
        HostRead(src=0, dst=20_000, nbytes=9_000),
        DmaCopy(src=40_000, dst=60_000, nbytes=5_000),
        DmaLoad(core=0, src=41_000, dst=0, nbytes=4_000),
        HostWrite(src=0, dst=30_000, nbytes=4_097),
    ))])


def test_flags_across_engines_with_counts_above_one():
    assert_same(TINY, [Program((
        Nop(on=Engine.DMA_IN, signal=(1, 1, 2)),
        Nop(on=Engine.DMA_OUT, signal=(1,)),
        Gemm(core=0, m=1, k=256, n=4, w_bits=8, a=0, w=0, out=4096, wait=(1, 1, 1),
             signal=(3,)),
        Vec(core=0, func=VecFunc.COPY, rows=1, cols=64, src0=0, dst=8192, wait=(2,),
            signal=(3,)),
        Nop(on=Engine.COPY, wait=(3, 3), signal=(4, 4)),
        HostRead(src=0, dst=0, nbytes=64, wait=(4,)),
        DmaLoad(core=1, src=0, dst=0, nbytes=64, wait=(4,)),
        Gemm(core=1, m=1, k=64, n=1, w_bits=8, a=0, w=0, out=128),
    ))])


def test_attention_and_kv_writes_share_the_kv_stream():
    hw = load_hardware("aries")
    formats = ("int8", "bf16")
    assert_same(hw, [Program((
        Attn(core=0, q_len=1, ctx=300, heads=7, kv_heads=1, head_dim=64, cap=512, k_fmt=0,
             v_fmt=0, q=0, k=0, v=1 << 20, out=4096, k_nbytes=300 * 64, v_nbytes=300 * 64),
        KvWrite(core=0, fmt=1, tokens=4, width=128, pos=10, cap=512, src=0, dst=2 << 20,
                nbytes=512 * 256),
        KvRead(core=0, fmt=0, tokens=100, width=64, pos=0, cap=512, src=0, dst=8192,
               nbytes=512 * 64),
        DmaLoad(core=0, src=3 << 20, dst=0, nbytes=200_000),
        Attn(core=1, q_len=2, ctx=100, heads=2, kv_heads=1, head_dim=64, cap=512, k_fmt=1,
             v_fmt=1, q=0, k=0, v=1 << 20, out=4096, k_nbytes=100 * 128,
             v_nbytes=100 * 128),
    ), formats=formats)])


def test_programs_back_to_back_carry_channel_and_link_state():
    p = Program((DmaLoad(core=0, src=0, dst=0, nbytes=5000),
                 HostWrite(src=0, dst=0, nbytes=6000)))
    assert_same(TINY, [p, p, Program(()), p])


@pytest.mark.parametrize("level", ["ops", "tiles"])
@pytest.mark.parametrize("max_events", [1, 7, 40, 120])
def test_an_event_limit_drops_the_same_spans_and_bins(level, max_events):
    # programs back to back fill the recorder part way through: the array loop's replay
    # of a full recorder counts its drops in bulk, the processes one call each
    p = Program((DmaLoad(core=0, src=0, dst=0, nbytes=5000),
                 HostWrite(src=0, dst=0, nbytes=6000),
                 DmaLoad(core=1, src=0, dst=0, nbytes=3000),
                 HostRead(src=0, dst=20_000, nbytes=2_000)))
    out = assert_same(TINY, [p] * 6, level=level, max_events=max_events)
    assert out["dropped"] > 0  # the limit was reached


@pytest.mark.parametrize("level", ["ops", "tiles"])
@pytest.mark.parametrize("max_events", [7, 40, 120])
def test_a_batch_whose_order_matters_replays_in_halves_as_row_by_row(monkeypatch, level,
                                                                    max_events):
    # halved down to single rows: every batch that meets the event limit is split, each
    # half replayed at once where its order cannot matter
    monkeypatch.setattr(array_engine, "REPLAY_EACH_ROWS", 1)
    p = Program((DmaLoad(core=0, src=0, dst=0, nbytes=5000),
                 HostWrite(src=0, dst=0, nbytes=6000),
                 DmaLoad(core=1, src=0, dst=0, nbytes=3000),
                 HostRead(src=0, dst=20_000, nbytes=2_000)))
    out = assert_same(TINY, [p] * 6, level=level, max_events=max_events)
    assert out["dropped"] > 0


def test_arrays_grown_from_one_row_give_the_same_timeline(monkeypatch):
    """The array loop stops a process between two steps when its heap, process records or
    logs run short, grows them and runs it on (the same event): from one row of the heap
    and the logs and just the process records the start needs (one per engine queue and
    the join), so it grows over and over, partway through processes with chunks in
    flight, flags with waiters and DRAM accesses logging a row per channel."""
    made = array_engine.new_state

    def one_row(now, eid, queues, *args, **kw):
        state = list(made(now, eid, queues, *args, **kw))
        state[1] = state[1][:1].copy()  # the heap
        state[2] = state[2][:queues + 1].copy()  # the process records
        state[12] = state[12][:1].copy()  # the logs
        return tuple(state)

    programs = [Program((
        DmaLoad(core=0, src=0, dst=0, nbytes=3000, signal=(1,)),
        DmaLoad(core=1, src=512, dst=0, nbytes=20_000),
        Gemm(core=0, m=1, k=256, n=4, w_bits=8, a=0, w=0, out=4096, wait=(1,), signal=(2, 2)),
        Vec(core=1, func=VecFunc.COPY, rows=1, cols=64, src0=0, dst=8192, wait=(2,),
            signal=(3,)),
        Nop(on=Engine.DMA_OUT, wait=(2, 3), signal=(4,)),
        HostWrite(src=0, dst=10_000, nbytes=5_000),
        HostRead(src=0, dst=700, nbytes=2_000, wait=(4,)),
        DmaCopy(src=0, dst=20_000, nbytes=4_000),
    ))] * 2
    want = _run("simpy", TINY_PROTOCOL, programs)
    monkeypatch.setattr(array_engine, "new_state", one_row)
    assert _run("fast", TINY_PROTOCOL, programs) == want


def test_a_deadlock_is_reported_the_same_way():
    prog = Program((Nop(on=Engine.DMA_IN, wait=(5,), signal=(6,)),
                    Nop(on=Engine.DMA_OUT, wait=(6,), signal=(5,))), name="cycle")
    msgs = []
    for engine in ENGINES:  # the array loop reports it from its own state
        with pytest.raises(DeviceError) as info:
            Device(TINY, functional=False, engine=engine).run(prog, validate=False)
        msgs.append(str(info.value))
    assert msgs[0] == msgs[1] == msgs[2] and "deadlocked" in msgs[0]


def test_fixed_costs_and_protocol_dram_on_hand_built_contention():
    # cross-core flags (core 0 -> core 1 and back: barrier syncs), Nops (no dispatch),
    # two DMAs on one channel, both PCIe directions and the copy engine, reads after
    # writes on one bank (turnaround), on the protocol model with every fixed cost
    out = assert_same(TINY_PROTOCOL, [Program((
        DmaLoad(core=0, src=0, dst=0, nbytes=3000, signal=(1,)),
        DmaLoad(core=1, src=512, dst=0, nbytes=1024),
        Gemm(core=0, m=1, k=256, n=4, w_bits=8, a=0, w=0, out=4096, wait=(1,), signal=(2,)),
        Vec(core=1, func=VecFunc.COPY, rows=1, cols=64, src0=0, dst=8192, wait=(2,),
            signal=(3, 3)),
        Nop(on=Engine.DMA_OUT, wait=(3,), signal=(4,)),
        DmaStore(core=0, src=0, dst=700, nbytes=900, wait=(3,)),
        HostWrite(src=0, dst=10_000, nbytes=5_000),
        HostRead(src=0, dst=700, nbytes=2_000, wait=(4,)),
        DmaCopy(src=0, dst=20_000, nbytes=4_000),
    ))] * 2)
    st_ = out["stats"]
    # per program: the Vec waits on core 0, the Nop and the DmaStore on core 1 (40 ns each)
    assert st_["sync_ps"] == {"core1.vpu": 2 * 40_000, "core0.dma_out": 4 * 40_000}
    assert st_["launch_ps"] == 2 * 250_000
    # the Nop pays no dispatch: one dispatch per program on either queue
    assert st_["dispatch_ps"]["core0.dma_out"] == st_["dispatch_ps"]["core1.vpu"] > 0
    assert out["dram_banks"] is not None


def test_a_deadlock_after_dispatch_is_reported_the_same_way():
    # the Gemm is dispatched (its cost counted) and then blocks on a flag nobody gives
    prog = Program((Gemm(core=1, m=1, k=64, n=1, w_bits=8, a=0, w=0, out=128, wait=(9,)),
                    DmaLoad(core=0, src=0, dst=0, nbytes=64, signal=(8,))), name="stuck")
    out = assert_same(TINY_PROTOCOL, [prog])
    assert "deadlocked" in out["runs"][0]
    assert out["stats"]["dispatch_ps"]["core1.mxu"] > 0


def test_the_fixed_cost_bits_are_the_devices():
    hw = load_hardware("aries")
    cm = compile_model(load_preset("qwen2.5-0.5b"), build_bit_config({}),
                       HardwareTarget.from_hw(hw), max_seq=8, cap=320, functional=False)
    prog = cm.program(tokens=1, cache_size=300)
    dev = Device(hw, functional=False)
    tb = program_tables.build(prog, dev.program_rows, dev.kinds_of, len(dev.kind_names))
    bits = tb.table[tb.row_of, loopdefs.I_FLAGS]
    cross = np.flatnonzero(bits & loopdefs.FL_CROSS)
    assert cross.tolist() == sorted(cross_core_waits(prog)) and len(cross) > 0
    nops = np.asarray([isinstance(i, Nop) for i in prog.instructions])
    assert ((bits & loopdefs.FL_DISPATCH) == 0).tolist() == nops.tolist()


def test_aries_decode_steps_back_to_back_on_the_array_loop_match_the_kernel():
    # the bank state, refresh phase and bus direction carry from one program to the next
    hw = load_hardware("aries")
    assert array_engine.eligible(Device(hw, functional=False))
    cm = compile_model(load_preset("qwen2.5-0.5b"), build_bit_config({}),
                       HardwareTarget.from_hw(hw), max_seq=8, cap=320, functional=False)
    progs = [cm.program(tokens=1, cache_size=300), cm.program(tokens=1, cache_size=301)]
    layout = cm.layout(host_bytes=hw.host.memory_bytes)
    a = _run("kernel", hw, progs, layout=layout, level="off")
    b = _run("fast", hw, progs, layout=layout, level="off")
    assert a == b
    first, second = a["runs"]
    assert second.start_ps == first.end_ps and second.stats["sync_ps"]


def test_an_unknown_engine_is_refused():
    with pytest.raises(DeviceError, match="engine 'numba'"):
        Device(TINY, engine="numba")


def test_a_shared_dram_host_link_falls_back_to_processes_with_the_same_timeline():
    # the array loop models the PCIe link only: a host memcpy over shared DRAM channels
    # runs on the kernel's processes, and must still match the reference
    hw = load_hardware("regulus")
    assert not array_engine.eligible(Device(hw, functional=False))
    assert_same(hw, [Program((
        HostWrite(src=0, dst=0, nbytes=10_000),
        DmaLoad(core=0, src=2048, dst=0, nbytes=6_000),
        HostRead(src=0, dst=20_000, nbytes=5_000),
    ))])


def test_the_array_loop_is_not_used_with_events_pending():
    dev = Device(TINY, functional=False)
    assert array_engine.eligible(dev)
    dev.env.timeout(5)
    assert not array_engine.eligible(dev)


@settings(max_examples=300, deadline=None)
@given(nbytes=st.integers(0, 2**40), bw=st.floats(1e6, 1e13))  # up to 1 TiB at >= 1 MB/s
def test_the_loops_transfer_time_rounds_like_python(nbytes, bw):
    from sim.units import transfer_ps

    assert loopdefs.transfer_ps(nbytes, bw) == transfer_ps(nbytes, bw)


def test_the_kernel_clock_only_moves_forward_with_an_empty_queue():
    env = kernel.Environment()
    env.advance(10, 3)
    assert (env.now, env.insertion_id) == (10, 3)
    with pytest.raises(ValueError, match="only move forward"):
        env.advance(9, 3)
    env.timeout(1)
    with pytest.raises(RuntimeError, match="events scheduled"):
        env.advance(20, 9)


def test_the_kernel_runs_until_a_time_like_simpy():
    import simpy

    for env in (simpy.Environment(), kernel.Environment()):
        env.run(until=5)
        assert env.now == 5
        with pytest.raises(ValueError, match="greater than the current"):
            env.run(until=5)


# --- random programs: every engine, chunking, contention and flags ------------------------


@st.composite
def programs(draw):
    """Programs mixing every engine on two cores, each wait taking a count signalled by an
    earlier instruction (waiters on other engines may still take it first: the rare
    deadlock that follows must then be reported identically)."""
    n = draw(st.integers(1, 25))
    instrs = []
    given_flags: list[int] = []
    for _ in range(n):
        core = draw(st.integers(0, 1))
        kind = draw(st.sampled_from(["load", "store", "copy", "h2d", "d2h", "gemm", "nop"]))
        picks = draw(st.lists(st.integers(0, max(len(given_flags) - 1, 0)), unique=True,
                              max_size=min(2, len(given_flags))))
        wait = tuple(given_flags[k] for k in picks)
        signal = tuple(draw(st.lists(st.integers(1, 6), max_size=2)))
        nbytes = draw(st.integers(1, 6000))
        addr = draw(st.integers(0, 8192))
        hdr = {"wait": wait, "signal": signal}
        if kind == "load":
            ins = DmaLoad(core=core, src=addr, dst=0, nbytes=nbytes, **hdr)
        elif kind == "store":
            ins = DmaStore(core=core, src=0, dst=addr, nbytes=nbytes, **hdr)
        elif kind == "copy":
            ins = DmaCopy(src=addr, dst=addr + 10_000, nbytes=nbytes, **hdr)
        elif kind == "h2d":
            ins = HostWrite(src=0, dst=addr, nbytes=nbytes, **hdr)
        elif kind == "d2h":
            ins = HostRead(src=addr, dst=0, nbytes=nbytes, **hdr)
        elif kind == "gemm":
            ins = Gemm(core=core, m=1, k=64 * draw(st.integers(1, 8)), n=4, w_bits=8, a=0,
                       w=0, out=0, **hdr)
        else:
            ins = Nop(on=draw(st.sampled_from(list(Engine))), **hdr)
        if ins.engine not in (Engine.DMA_IN, Engine.DMA_OUT, Engine.MXU, Engine.VPU):
            ins = ins.replace(core=0)
        instrs.append(ins)
        given_flags.extend(signal)
        # a flag waited on more often than signalled would deadlock: keep the balance
        for f in wait:
            given_flags.remove(f)
    return Program(tuple(instrs))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(progs=st.lists(programs(), min_size=1, max_size=3))
def test_random_programs_give_identical_timelines(progs):
    assert_same(TINY, progs)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(progs=st.lists(programs(), min_size=1, max_size=3))
def test_random_programs_with_the_protocol_model_and_fixed_costs_are_identical(progs):
    out = assert_same(TINY_PROTOCOL, progs)
    assert out["dram_banks"] is not None



# --- whole programs and model steps -------------------------------------------------------


def test_a_functional_double_buffered_gemv_is_identical():
    hw = load_hardware("aries")
    layer = gemv_layer(k=512, n=1024, w_bits=4, num_cores=hw.cores.num_cores,
                       sram_bytes=hw.sram.bytes_per_core, dram_bytes=hw.dram.capacity_bytes,
                       host_bytes=hw.host.memory_bytes, tile_bytes=4096)
    data = demo_data(layer, seed=3)

    def setup(dev):
        dev.mem.dram.write(layer.w_dram, data["w_bytes"])
        dev.host_write(layer.x_host, data["x"].view(np.uint8))

    assert_same(hw, [layer.program], functional=True, layout=layer.layout, setup=setup)


def _model_steps(engine: str, monkeypatch, cm, functional: bool, emb):
    monkeypatch.setattr(sim.runtime.accelerator, "Device", functools.partial(Device, engine=engine))
    rec = Recorder(level="tiles")
    acc = Accelerator(hw=TINY, functional=functional, recorder=rec)
    assert acc.device.engine == engine
    if engine == "fast":
        acc.device.start = _no_processes
    model = Model(cm)
    model.launch(acc)
    outs = [model.infer(emb[:16], cache_size=0)[0]]
    for t in range(16, 19):
        outs.append(model.infer(emb[t : t + 1], cache_size=t)[0])
    calls = [(c.op, c.start_ps, c.end_ps, c.stats) for c in acc.calls]
    return _state(acc.device, rec, calls), outs


@pytest.mark.parametrize("functional", [False, True])
def test_tiny_model_launch_prefill_and_decode_are_identical(monkeypatch, functional):
    cfg = load_preset("tiny")
    cm = compile_model(cfg, build_bit_config({}), HardwareTarget.from_hw(TINY), kv="int8",
                       core_mode="single", max_seq=16, cap=64, functional=functional)
    emb = np.random.default_rng(0).standard_normal((32, cfg.hidden_size)).astype(np.float32)
    a, la = _model_steps("simpy", monkeypatch, cm, functional, emb)
    b, lb = _model_steps("fast", monkeypatch, cm, functional, emb)
    for key in a:
        assert a[key] == b[key], key
    for x, y in zip(la, lb, strict=True):
        if functional:
            np.testing.assert_array_equal(x, y)
        else:
            assert x is None and y is None


def test_a_qwen_decode_step_is_identical():
    hw = load_hardware("aries")
    cm = compile_model(load_preset("qwen2.5-0.5b"), build_bit_config({}),
                       HardwareTarget.from_hw(hw), max_seq=8, cap=320, functional=False)
    prog = cm.program(tokens=1, cache_size=300)
    layout = cm.layout(host_bytes=hw.host.memory_bytes)
    out = assert_same(hw, [prog], layout=layout, level="ops")
    assert out["stats"]["instructions"] == len(prog) > 20_000
    # aries: the protocol model's bank state and every fixed cost were exercised
    assert hw.dram.model == "protocol" and out["dram_banks"] is not None
    assert out["stats"]["sync_ps"] and out["stats"]["dispatch_ps"]
    assert out["stats"]["launch_ps"] == round(hw.cores.program_launch_ns * 1000)  # one program



# --- the recorder's byte bins (its multi-bin path is written for speed) -------------------


class _ReferenceBins:
    """The byte binning of ``Recorder.moved``, written plainly, bin by bin."""

    def __init__(self, rec: Recorder):
        self.rec = rec

    def moved(self, block, lane, start_ps, end_ps, nbytes):
        rec = self.rec
        key = (block, lane)
        rec.byte_totals[key] = rec.byte_totals.get(key, 0) + nbytes
        last = end_ps - 1 if end_ps > start_ps else start_ps
        while last // rec._width >= rec.max_byte_bins:
            rec._coarsen()
        w = rec._width
        k0, k1 = start_ps // w, last // w
        track = rec._bins.setdefault(key, {})
        new = sum(k not in track for k in range(k0, k1 + 1))
        if new and not rec._room(new):
            return
        rec._nbins += new
        done = 0
        for k in range(k0, k1 + 1):
            lo, hi = max(start_ps, k * w), min(end_ps, (k + 1) * w)
            upto = nbytes * (hi - start_ps) // (end_ps - start_ps) if k1 > k0 else nbytes
            n, done = upto - done, upto
            cell = track.get(k)
            if cell is None:
                track[k] = [n, lo, hi]
            else:
                cell[0] += n
                cell[1], cell[2] = min(cell[1], lo), max(cell[2], hi)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(moves=st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 60_000),
                                st.integers(0, 9_000), st.integers(0, 10_000)),
                      min_size=1, max_size=40),
       max_events=st.integers(1, 80), max_bins=st.integers(1, 16))
def test_recorder_byte_bins_match_the_plain_binning(moves, max_events, max_bins):
    fast = Recorder(level="ops", max_events=max_events, byte_bin_ps=100,
                    max_byte_bins=max_bins)
    ref = Recorder(level="ops", max_events=max_events, byte_bin_ps=100,
                   max_byte_bins=max_bins)
    plain = _ReferenceBins(ref)
    for lane, start, dur, nbytes in moves:
        fast.moved("dram", lane, start, start + dur, nbytes)
        plain.moved("dram", lane, start, start + dur, nbytes)
    assert fast._bins == ref._bins
    assert (fast._nbins, fast.dropped, fast.byte_totals, fast.byte_bin_width_ps) == (
        ref._nbins, ref.dropped, ref.byte_totals, ref.byte_bin_width_ps)
    assert fast.bytes == ref.bytes
