"""The semantics of a 2-D DMA (rows of ``nbytes`` at a source and a destination stride):
on a memory with strided block access (``sim.device.memory.DeviceMemory``) one block read and
one block write; on a memory with only ``read`` / ``write``, one read of each span where
the spans allow it, else one read per block; all give the per-block loop's bytes,
whatever the strides, overlaps included."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from isa.instructions import DmaLoad, DmaStore, Space
from isa.semantics import execute
from sim.device.memory import DeviceMemory

SRAM = 1 << 14


def _memory(seed: int) -> DeviceMemory:
    mem = DeviceMemory(dram_bytes=1 << 16, sram_bytes=SRAM, num_cores=1, host_bytes=1 << 12)
    rng = np.random.default_rng(seed)
    mem.write(Space.DRAM, 0, 0, rng.integers(0, 256, 1 << 16, dtype=np.uint8))
    mem.write(Space.SRAM, 0, 0, rng.integers(0, 256, SRAM, dtype=np.uint8))
    return mem


class _Plain:
    """A memory with only ``read`` and ``write`` (no strided block access)."""

    def __init__(self, inner: DeviceMemory):
        self.inner = inner

    def read(self, space: Space, core: int, addr: int, nbytes: int) -> np.ndarray:
        return self.inner.read(space, core, addr, nbytes)

    def write(self, space: Space, core: int, addr: int, data: np.ndarray) -> None:
        self.inner.write(space, core, addr, data)


def _by_blocks(mem: DeviceMemory, src_space: Space, dst_space: Space, instr) -> None:
    s = instr.src_stride or instr.nbytes
    d = instr.dst_stride or instr.nbytes
    for r in range(instr.rows):
        data = mem.read(src_space, 0, instr.src + r * s, instr.nbytes)
        mem.write(dst_space, 0, instr.dst + r * d, data)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 96), st.integers(1, 12), st.integers(0, 160), st.integers(0, 160),
       st.integers(0, 4000), st.integers(0, 4000), st.booleans(), st.integers(0, 3),
       st.booleans())
def test_strided_dma_is_the_per_block_copy(nbytes: int, rows: int, s_stride: int,
                                           d_stride: int, src: int, dst: int, load: bool,
                                           seed: int, plain: bool) -> None:
    cls, spaces = (DmaLoad, (Space.DRAM, Space.SRAM)) if load else \
        (DmaStore, (Space.SRAM, Space.DRAM))
    instr = cls(src=src, dst=dst, nbytes=nbytes, rows=rows, src_stride=s_stride,
                dst_stride=d_stride)
    got, want = _memory(seed), _memory(seed)
    execute(instr, _Plain(got) if plain else got)
    _by_blocks(want, *spaces, instr)
    for space, size in ((Space.DRAM, 1 << 16), (Space.SRAM, SRAM)):
        assert np.array_equal(got.read(space, 0, 0, size), want.read(space, 0, 0, size))
