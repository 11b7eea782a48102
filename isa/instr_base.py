"""ISA v1 core definitions shared by every instruction module: address spaces, engines,
opcodes, byte extents, the field declarators (binary widths in the field metadata) and the
:class:`Instruction` base. :mod:`isa.instructions` re-exports all of them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import IntEnum
from typing import ClassVar, NamedTuple

NO_ADDR = 0xFFFF_FFFF_FFFF_FFFF


class Space(IntEnum):
    DRAM = 0
    SRAM = 1
    HOST = 2


class Engine(IntEnum):
    """Engine kinds. Per-core kinds have one queue per core; device-wide kinds have one."""

    DMA_IN = 0  # per core: DRAM -> SRAM
    DMA_OUT = 1  # per core: SRAM -> DRAM
    MXU = 2  # per core: matrix unit
    VPU = 3  # per core: vector unit
    COPY = 4  # device: DRAM -> DRAM copy engine
    H2D = 5  # device: host -> device over the host link
    D2H = 6  # device: device -> host over the host link


PER_CORE_ENGINES = frozenset({Engine.DMA_IN, Engine.DMA_OUT, Engine.MXU, Engine.VPU})


class Opcode(IntEnum):
    NOP = 0x00
    DMA_LOAD = 0x10
    DMA_STORE = 0x11
    DMA_COPY = 0x12
    DMA_LOAD_INDEXED = 0x13
    HOST_WRITE = 0x20
    HOST_READ = 0x21
    GEMM = 0x30
    GEMM_ROW = 0x31
    GEMM_GROUP = 0x32
    GEMM_ROW_GROUP = 0x33
    VEC = 0x40
    KV_WRITE = 0x50
    KV_READ = 0x51
    ATTN = 0x60
    ATTN_DQ = 0x61


class Access(NamedTuple):
    """A byte extent an instruction reads or writes."""

    space: Space
    core: int
    addr: int
    nbytes: int
    write: bool
    role: str


def _field(fmt: str, default=dataclasses.MISSING, enum: type[IntEnum] | None = None):
    meta = {"fmt": fmt} if enum is None else {"fmt": fmt, "enum": enum}
    return field(default=default, metadata=meta)


def u64(default=dataclasses.MISSING, enum=None):
    return _field("Q", default, enum)


def u32(default=dataclasses.MISSING, enum=None):
    return _field("I", default, enum)


def u16(default=dataclasses.MISSING, enum=None):
    return _field("H", default, enum)


def u8(default=dataclasses.MISSING, enum=None):
    return _field("B", default, enum)


def i32(default=dataclasses.MISSING, enum=None):
    return _field("i", default, enum)


@dataclass(frozen=True, kw_only=True)
class Instruction:
    """Base of all instructions (never instantiated itself)."""

    opcode: ClassVar[Opcode]
    mnemonic: ClassVar[str]
    engine_kind: ClassVar[Engine]

    core: int = 0
    wait: tuple[int, ...] = ()
    signal: tuple[int, ...] = ()

    @property
    def engine(self) -> Engine:
        return self.engine_kind

    def accesses(self) -> list[Access]:
        return []

    def ops(self) -> int:
        """Integer operations (for the roofline), 1 MAC = 2 ops."""
        return 0

    @classmethod
    def body_fields(cls) -> list[dataclasses.Field]:
        return [f for f in dataclasses.fields(cls) if f.name not in ("core", "wait", "signal")]

    def replace(self, **changes) -> Instruction:
        return dataclasses.replace(self, **changes)


def sram_access(core: int, addr: int, nbytes: int, write: bool, role: str) -> list[Access]:
    """The SRAM extent of an operand (none for :data:`NO_ADDR`)."""
    if addr == NO_ADDR:
        return []
    return [Access(Space.SRAM, core, addr, nbytes, write, role)]

