"""The array loop takes the next event straight from where it was appended when it is the
smallest (``loopdefs.hnext``): the events must come out in exactly the (time, priority,
insertion id) order that sifting and popping every one gives, and a program must leave the
very same state with the shortcut on (the default) and off (``direct=False``)."""

from __future__ import annotations

import heapq

import numpy as np
import pytest

from isa.instructions import (
    DmaCopy,
    DmaLoad,
    DmaStore,
    Engine,
    Gemm,
    HostRead,
    HostWrite,
    Nop,
    Program,
    Vec,
    VecFunc,
)
from models.bits import build_bit_config
from models.compiler import HardwareTarget, compile_model
from models.source import load_preset
from sim.device.device import Device
from sim.device.engine import array as array_engine
from sim.device.engine import loopdefs as lp
from sim.device.engine.loop import run_program
from sim.device.hw import load_hardware
from tests.sim.test_engines import TINY, TINY_PROTOCOL
from traces.recorder import Recorder


@pytest.mark.parametrize("direct", [True, False])
def test_the_next_event_comes_out_in_time_priority_id_order(direct):
    rng = np.random.default_rng(11)
    heap = np.zeros((4096, 5), np.int64)
    n = ordered = eid = 0
    ref: list[tuple[int, int, int]] = []
    taken_appended = 0
    for _ in range(800):
        for _ in range(int(rng.integers(0, 5))):  # an event's pushes
            row = (int(rng.integers(0, 40)), int(rng.integers(0, 2)), eid, 0, eid)
            eid += 1
            n = lp.hpush(heap, n, *row)
            heapq.heappush(ref, row[:3])
        if n and rng.random() < 0.85:
            n, ordered = lp.hnext(heap, ordered, n, direct)
            taken_appended += ordered != n
            assert tuple(heap[n, :3]) == heapq.heappop(ref)
            assert ordered <= n
    assert len(ref) == n
    if direct:  # the shortcut was taken, often
        assert taken_appended > 200
    else:
        assert taken_appended == 0


def _state(hw, programs, direct: bool, monkeypatch, *, layout=None, level="tiles") -> dict:
    def run(*args):
        return run_program(*args, direct)

    monkeypatch.setattr(array_engine, "run_program", run)
    rec = Recorder(level=level)
    dev = Device(hw, functional=False, recorder=rec, layout=layout, engine="fast")
    assert array_engine.eligible(dev)
    runs = [dev.run(p, validate=False) for p in programs]
    return {"runs": runs, "now": dev.env.now, "eid": dev.env.insertion_id,
            "spans": rec.spans, "bytes": rec.bytes, "stats": dev.stats.snapshot(),
            "dram": (dev.dram.free_ps, dev.dram.bytes_read, dev.dram.bytes_written),
            "banks": ([a.tolist() for a in vars(dev.dram.state).values()]
                      if dev.dram.protocol else None),
            "link": dev.link.free_ps, "ports": [s.port_free_ps for s in dev.srams]}


CONTENTION = [
    # two DMAs on one channel and the slot limit, a strided store
    Program((DmaLoad(core=0, src=0, dst=0, nbytes=1024),
             DmaLoad(core=1, src=0, dst=0, nbytes=1024),
             DmaLoad(core=0, src=4096, dst=4096, nbytes=8192),
             DmaStore(core=1, src=0, dst=2048, nbytes=3000),
             DmaStore(core=0, src=0, dst=64, nbytes=100, rows=4, src_stride=200,
                      dst_stride=300))),
    # both PCIe directions and the copy engine at once
    Program((HostWrite(src=0, dst=0, nbytes=10_000),
             HostRead(src=0, dst=20_000, nbytes=9_000),
             DmaCopy(src=40_000, dst=60_000, nbytes=5_000),
             DmaLoad(core=0, src=41_000, dst=0, nbytes=4_000),
             HostWrite(src=0, dst=30_000, nbytes=4_097))),
    # flags across engines and cores, counts above one
    Program((Nop(on=Engine.DMA_IN, signal=(1, 1, 2)),
             Nop(on=Engine.DMA_OUT, signal=(1,)),
             DmaLoad(core=0, src=0, dst=0, nbytes=3000, signal=(5,)),
             Gemm(core=0, m=1, k=256, n=4, w_bits=8, a=0, w=0, out=4096, wait=(1, 1, 1, 5),
                  signal=(3,)),
             Vec(core=1, func=VecFunc.COPY, rows=1, cols=64, src0=0, dst=8192, wait=(2,),
                 signal=(3,)),
             Nop(on=Engine.COPY, wait=(3, 3), signal=(4, 4)),
             HostRead(src=0, dst=0, nbytes=64, wait=(4,)),
             DmaLoad(core=1, src=0, dst=0, nbytes=64, wait=(4,)),
             Gemm(core=1, m=1, k=64, n=1, w_bits=8, a=0, w=0, out=128))),
]


@pytest.mark.parametrize("hw", [TINY, TINY_PROTOCOL], ids=["tiny", "tiny-protocol"])
def test_contention_gives_the_same_state_with_and_without_the_shortcut(hw, monkeypatch):
    on = _state(hw, CONTENTION * 2, True, monkeypatch)
    off = _state(hw, CONTENTION * 2, False, monkeypatch)
    assert len(on["spans"]) > 50
    for key in on:
        assert on[key] == off[key], key


def test_a_qwen_decode_step_gives_the_same_state_with_and_without_the_shortcut(monkeypatch):
    hw = load_hardware("aries")
    cm = compile_model(load_preset("qwen2.5-0.5b"), build_bit_config({}),
                       HardwareTarget.from_hw(hw), max_seq=8, cap=320, functional=False)
    progs = [cm.program(tokens=1, cache_size=300), cm.program(tokens=1, cache_size=301)]
    layout = cm.layout(host_bytes=hw.host.memory_bytes)
    on = _state(hw, progs, True, monkeypatch, layout=layout, level="ops")
    off = _state(hw, progs, False, monkeypatch, layout=layout, level="ops")
    assert on["stats"]["instructions"] == sum(len(p) for p in progs) > 40_000
    for key in on:
        assert on[key] == off[key], key
