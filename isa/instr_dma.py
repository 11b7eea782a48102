"""The DMA instructions: DRAM <-> SRAM loads and stores (2-D), the indexed load of a MoE
layer's expert weights, and the device-wide DRAM copy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .instr_base import Access, Engine, Instruction, Opcode, Space, u32, u64


def _rows_extent(nbytes: int, rows: int, stride: int) -> int:
    """Bytes spanned by ``rows`` blocks of ``nbytes`` placed ``stride`` apart (0 = packed)."""
    step = stride or nbytes
    return (rows - 1) * step + nbytes if rows else 0


@dataclass(frozen=True, kw_only=True)
class DmaLoad(Instruction):
    """DRAM -> SRAM of ``core``: ``rows`` blocks of ``nbytes`` (a 2-D transfer); block
    ``r`` goes from ``src + r*src_stride`` to ``dst + r*dst_stride`` (a stride of 0 means
    ``nbytes``, i.e. contiguous)."""

    opcode: ClassVar[Opcode] = Opcode.DMA_LOAD
    mnemonic: ClassVar[str] = "dma.load"
    engine_kind: ClassVar[Engine] = Engine.DMA_IN
    src: int = u64()
    dst: int = u64()
    nbytes: int = u32()
    rows: int = u32(default=1)
    src_stride: int = u32(default=0)
    dst_stride: int = u32(default=0)

    @property
    def total_bytes(self) -> int:
        return self.nbytes * self.rows

    def accesses(self) -> list[Access]:
        return [
            Access(Space.DRAM, 0, self.src,
                   _rows_extent(self.nbytes, self.rows, self.src_stride), False, "src"),
            Access(Space.SRAM, self.core, self.dst,
                   _rows_extent(self.nbytes, self.rows, self.dst_stride), True, "dst"),
        ]


@dataclass(frozen=True, kw_only=True)
class DmaLoadIndexed(DmaLoad):
    """A :class:`DmaLoad` whose source is entry ``i`` of a table of ``count`` equal blocks
    ``stride`` bytes apart from ``src``: ``i`` is the int32 at SRAM ``index`` of the same
    core (a routing table a TOPK_GATE wrote), read when the load runs; an ``i`` outside
    ``0 .. count-1`` is an error.

    Timing does not depend on ``i``: every engine times it as the :class:`DmaLoad` of entry
    0 (same bytes, rows and strides, so the same DRAM channels, banks and row switches up
    to the constant offset ``i * stride``), so a program takes the same cycles whatever the
    table holds, and a timing-only run (no data) takes the cycles of a functional one.
    """

    opcode: ClassVar[Opcode] = Opcode.DMA_LOAD_INDEXED
    mnemonic: ClassVar[str] = "dma.load.ix"
    index: int = u64()
    stride: int = u64()
    count: int = u32(default=1)

    def accesses(self) -> list[Access]:
        # one extent per entry: the entries may be regions of their own (a MoE layer's
        # experts), each of which must hold its whole block
        extent = _rows_extent(self.nbytes, self.rows, self.src_stride)
        return [
            *(Access(Space.DRAM, 0, self.src + i * self.stride, extent, False,
                     f"src[{i}]" if i else "src") for i in range(max(self.count, 1))),
            Access(Space.SRAM, self.core, self.index, 4, False, "index"),
            Access(Space.SRAM, self.core, self.dst,
                   _rows_extent(self.nbytes, self.rows, self.dst_stride), True, "dst"),
        ]


@dataclass(frozen=True, kw_only=True)
class DmaStore(Instruction):
    """SRAM of ``core`` -> DRAM, 2-D like :class:`DmaLoad`."""

    opcode: ClassVar[Opcode] = Opcode.DMA_STORE
    mnemonic: ClassVar[str] = "dma.store"
    engine_kind: ClassVar[Engine] = Engine.DMA_OUT
    src: int = u64()
    dst: int = u64()
    nbytes: int = u32()
    rows: int = u32(default=1)
    src_stride: int = u32(default=0)
    dst_stride: int = u32(default=0)

    @property
    def total_bytes(self) -> int:
        return self.nbytes * self.rows

    def accesses(self) -> list[Access]:
        return [
            Access(Space.SRAM, self.core, self.src,
                   _rows_extent(self.nbytes, self.rows, self.src_stride), False, "src"),
            Access(Space.DRAM, 0, self.dst,
                   _rows_extent(self.nbytes, self.rows, self.dst_stride), True, "dst"),
        ]


@dataclass(frozen=True, kw_only=True)
class DmaCopy(Instruction):
    """DRAM -> DRAM on the device-wide copy engine (cache compaction, moves)."""

    opcode: ClassVar[Opcode] = Opcode.DMA_COPY
    mnemonic: ClassVar[str] = "dma.copy"
    engine_kind: ClassVar[Engine] = Engine.COPY
    src: int = u64()
    dst: int = u64()
    nbytes: int = u32()

    def accesses(self) -> list[Access]:
        return [
            Access(Space.DRAM, 0, self.src, self.nbytes, False, "src"),
            Access(Space.DRAM, 0, self.dst, self.nbytes, True, "dst"),
        ]
