"""``dma.load.ix`` (a load from the table entry an SRAM index names, as a MoE layer's
expert weights are chosen by the router's table): functional runs copy the entry the
index names, and every engine times it as the load of entry 0, so timing-only and
functional runs agree cycle for cycle whatever the index holds."""

from __future__ import annotations

import numpy as np
import pytest

from isa.errors import IsaError
from isa.instructions import DmaLoad, DmaLoadIndexed, DmaStore, Program, Space
from sim.device.device import Device
from sim.device.hw import load_hardware

TABLE = 0x10000  # DRAM: 4 entries of STRIDE bytes
STRIDE = 4096
ENTRIES = 4
BLOCK = 1024  # bytes loaded from the entry
INDEX_DRAM = 0x8000
OUT = 0x20000


def _program(indexed: bool = True) -> Program:
    load = (DmaLoadIndexed(core=0, src=TABLE, dst=0x100, nbytes=BLOCK, index=0x0,
                           stride=STRIDE, count=ENTRIES, wait=(1,), signal=(2,))
            if indexed else
            DmaLoad(core=0, src=TABLE, dst=0x100, nbytes=BLOCK, wait=(1,), signal=(2,)))
    return Program(instructions=(
        DmaLoad(core=0, src=INDEX_DRAM, dst=0x0, nbytes=4, signal=(1,)),
        load,
        DmaStore(core=0, src=0x100, dst=OUT, nbytes=BLOCK, wait=(2,)),
    ))


def _device(engine: str, functional: bool, index: int) -> Device:
    dev = Device(load_hardware("tiny"), functional=functional, engine=engine)
    if functional:
        table = np.repeat(np.arange(1, ENTRIES + 1, dtype=np.uint8), STRIDE)
        dev.mem.write(Space.DRAM, 0, TABLE, table)
        dev.mem.write(Space.DRAM, 0, INDEX_DRAM, np.array([index], np.int32).view(np.uint8))
    return dev


@pytest.mark.parametrize("engine", ["simpy", "fast"])
def test_functional_copies_the_named_entry_in_the_cycles_of_a_timing_run(engine) -> None:
    timing = _device(engine, False, 0).run(_program())
    plain = _device(engine, False, 0).run(_program(indexed=False))
    assert timing.duration_ps == plain.duration_ps > 0  # timed as the load of entry 0
    for index in range(ENTRIES):
        dev = _device(engine, True, index)
        run = dev.run(_program())
        assert run.duration_ps == timing.duration_ps
        assert run.stats == timing.stats
        out = dev.mem.read(Space.DRAM, 0, OUT, BLOCK)
        assert np.all(out == index + 1)


def test_an_index_outside_the_table_is_an_error_naming_it() -> None:
    dev = _device("simpy", True, ENTRIES)
    with pytest.raises(IsaError, match=r"dma.load.ix: index 4 \(SRAM 0x0 of core 0\) outside "
                                       r"the table's entries 0..3"):
        dev.run(_program())
