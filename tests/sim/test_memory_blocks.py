"""Strided block access of the functional memories (``read_blocks`` / ``write_blocks``):
the bytes, the allocated pages and the errors of one ``read`` / ``write`` per block, on
pages small enough that runs of blocks share pages, cross page boundaries and skip pages."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from isa.instructions import Space
from kvsim.errors import DeviceError
from sim.device.memory import DeviceMemory, SparseMemory

PAGE_BYTES = 64
SIZE_BYTES = 4096


def _sparse(seed: int, pages: list[int]) -> SparseMemory:
    mem = SparseMemory(SIZE_BYTES, "DRAM", page_bytes=PAGE_BYTES)
    rng = np.random.default_rng(seed)
    for p in pages:  # some pages written, the others never allocated
        mem.write(p * PAGE_BYTES, rng.integers(0, 256, PAGE_BYTES, dtype=np.uint8))
    return mem


_blocks = st.tuples(st.integers(0, 3000), st.integers(0, 40), st.integers(0, 90),
                    st.integers(0, 200))


def _outside(addr: int, rows: int, nbytes: int, stride: int) -> bool:
    return rows > 0 and addr + (rows - 1) * stride + nbytes > SIZE_BYTES


@given(_blocks, st.lists(st.integers(0, SIZE_BYTES // PAGE_BYTES - 1), max_size=30),
       st.integers(0, 3))
def test_sparse_read_blocks_is_one_read_per_block(blocks, pages, seed) -> None:
    addr, rows, nbytes, stride = blocks
    mem = _sparse(seed, pages)
    if _outside(addr, rows, nbytes, stride):  # one of the blocks' reads would fail
        with pytest.raises(DeviceError, match="outside 4096 bytes"):
            mem.read_blocks(addr, rows, nbytes, stride)
        return
    want = np.array([mem.read(addr + r * stride, nbytes) for r in range(rows)],
                    dtype=np.uint8).reshape(rows, nbytes)
    got = mem.read_blocks(addr, rows, nbytes, stride)
    assert got.dtype == np.uint8 and got.shape == (rows, nbytes)
    assert np.array_equal(got, want)


@given(_blocks, st.lists(st.integers(0, SIZE_BYTES // PAGE_BYTES - 1), max_size=30),
       st.integers(0, 3))
def test_sparse_write_blocks_is_one_write_per_block(blocks, pages, seed) -> None:
    addr, rows, nbytes, stride = blocks
    stride = max(stride, nbytes)  # written blocks do not overlap
    got, want = _sparse(seed, pages), _sparse(seed, pages)
    data = np.random.default_rng(seed + 10).integers(0, 256, (rows, nbytes), dtype=np.uint8)
    if _outside(addr, rows, nbytes, stride):  # nothing written, nothing allocated
        with pytest.raises(DeviceError, match="outside 4096 bytes"):
            got.write_blocks(addr, data, stride)
        assert got.resident_bytes == want.resident_bytes
        assert np.array_equal(got.read(0, SIZE_BYTES), want.read(0, SIZE_BYTES))
        return
    got.write_blocks(addr, data, stride)
    for r in range(rows):
        want.write(addr + r * stride, data[r])
    assert got.resident_bytes == want.resident_bytes  # as many pages allocated
    assert np.array_equal(got.read(0, SIZE_BYTES), want.read(0, SIZE_BYTES))


def test_sparse_blocks_check_the_whole_span_before_writing() -> None:
    mem = _sparse(0, [])
    with pytest.raises(DeviceError, match=r"DRAM: access \[0xf00, 0x1010\) outside 4096"):
        mem.write_blocks(0xF00, np.ones((3, 16), np.uint8), 0x80)
    assert mem.resident_bytes == 0  # the first two blocks fitted, and were not written
    with pytest.raises(DeviceError, match=r"access \[0xf00, 0x1010\) outside"):
        mem.read_blocks(0xF00, 3, 16, 0x80)
    with pytest.raises(ValueError, match="blocks of 16 bytes every 8 bytes overlap"):
        mem.write_blocks(0, np.ones((2, 16), np.uint8), 8)


@given(_blocks, st.integers(0, 3), st.booleans())
def test_device_blocks_are_one_access_per_block(blocks, seed, sram) -> None:
    addr, rows, nbytes, stride = blocks
    stride = max(stride, nbytes)
    space = Space.SRAM if sram else Space.DRAM

    def memory() -> DeviceMemory:
        mem = DeviceMemory(dram_bytes=SIZE_BYTES, sram_bytes=SIZE_BYTES, num_cores=2,
                           host_bytes=SIZE_BYTES)
        rng = np.random.default_rng(seed)
        mem.write(space, 1, 0, rng.integers(0, 256, SIZE_BYTES, dtype=np.uint8))
        return mem

    got, want = memory(), memory()
    if _outside(addr, rows, nbytes, stride):
        with pytest.raises(DeviceError):
            got.read_blocks(space, 1, addr, rows, nbytes, stride)
        return
    read = got.read_blocks(space, 1, addr, rows, nbytes, stride)
    assert np.array_equal(read.reshape(rows, nbytes), np.array(
        [want.read(space, 1, addr + r * stride, nbytes) for r in range(rows)],
        dtype=np.uint8).reshape(rows, nbytes))
    data = np.random.default_rng(seed + 10).integers(0, 256, (rows, nbytes), dtype=np.uint8)
    got.write_blocks(space, 1, addr, data, stride)
    for r in range(rows):
        want.write(space, 1, addr + r * stride, data[r])
    assert np.array_equal(got.read(space, 1, 0, SIZE_BYTES), want.read(space, 1, 0, SIZE_BYTES))
    assert np.array_equal(got.read(space, 0, 0, SIZE_BYTES), want.read(space, 0, 0, SIZE_BYTES))


def test_sram_blocks_check_the_span_before_writing() -> None:
    mem = DeviceMemory(dram_bytes=SIZE_BYTES, sram_bytes=SIZE_BYTES, num_cores=1,
                       host_bytes=SIZE_BYTES)
    with pytest.raises(DeviceError, match=r"SRAM of core 0: access \[0xf00, 0x1010\) "
                                          "overflows 4096 bytes"):
        mem.write_blocks(Space.SRAM, 0, 0xF00, np.ones((3, 16), np.uint8), 0x80)
    assert not mem.sram[0].any()
    with pytest.raises(DeviceError, match="SRAM: core 1 does not exist"):
        mem.read_blocks(Space.SRAM, 1, 0, 2, 16, 32)
    with pytest.raises(ValueError, match="SRAM: blocks of 16 bytes every 8 bytes overlap"):
        mem.write_blocks(Space.SRAM, 0, 0, np.ones((2, 16), np.uint8), 8)
