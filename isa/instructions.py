"""ISA v1: instruction types, opcodes, engines and the byte extents each one touches.

Every instruction is a frozen dataclass. Three header fields are common to all:

- ``core``: the NPU core whose engine queue runs it (0 for device-wide engines),
- ``wait``: flags (counting semaphores) the engine takes, one count each, before starting,
- ``signal``: flags it gives, one count each, when it has finished.

The other fields are unsigned or signed integers whose binary width is declared in the
field's metadata (``fmt``, a :mod:`struct` code), so the binary encoding and the text
assembly are derived from the dataclass and never drift from it.

Address spaces: ``DRAM`` (device memory, global), ``SRAM`` (per core), ``HOST`` (host
memory, reached over the host link). An address of :data:`NO_ADDR` means "no operand".

The core definitions (spaces, engines, opcodes, field declarators, :class:`Instruction`)
live in :mod:`isa.instr_base`, the matrix unit's GEMM family in :mod:`isa.instr_gemm`, the
DMA instructions in :mod:`isa.instr_dma`; this module re-exports them and holds the other
instructions, programs and layouts.
"""

from __future__ import annotations

import bisect
import operator
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar

from .errors import IsaError
from .instr_base import (
    NO_ADDR,
    PER_CORE_ENGINES,
    Access,
    Engine,
    Instruction,
    Opcode,
    Space,
    i32,
    sram_access,
    u8,
    u16,
    u32,
    u64,
)
from .instr_dma import DmaCopy, DmaLoad, DmaLoadIndexed, DmaStore
from .instr_gemm import Gemm, GemmGroup, GemmRow, GemmRowGroup
from .vecfuncs import VEC_OPS_PER_ELEMENT, VecFunc, vec_operand_bytes


@dataclass(frozen=True, kw_only=True)
class Nop(Instruction):
    """Does nothing on ``engine``'s queue; used to join or fan out flags."""

    opcode: ClassVar[Opcode] = Opcode.NOP
    mnemonic: ClassVar[str] = "nop"
    engine_kind: ClassVar[Engine] = Engine.VPU
    on: int = u8(enum=Engine)

    @property
    def engine(self) -> Engine:
        return Engine(self.on)


@dataclass(frozen=True, kw_only=True)
class HostWrite(Instruction):
    """Host memory -> device DRAM over the host link (h2d)."""

    opcode: ClassVar[Opcode] = Opcode.HOST_WRITE
    mnemonic: ClassVar[str] = "host.write"
    engine_kind: ClassVar[Engine] = Engine.H2D
    src: int = u64()
    dst: int = u64()
    nbytes: int = u32()

    def accesses(self) -> list[Access]:
        return [
            Access(Space.HOST, 0, self.src, self.nbytes, False, "src"),
            Access(Space.DRAM, 0, self.dst, self.nbytes, True, "dst"),
        ]


@dataclass(frozen=True, kw_only=True)
class HostRead(Instruction):
    """Device DRAM -> host memory over the host link (d2h)."""

    opcode: ClassVar[Opcode] = Opcode.HOST_READ
    mnemonic: ClassVar[str] = "host.read"
    engine_kind: ClassVar[Engine] = Engine.D2H
    src: int = u64()
    dst: int = u64()
    nbytes: int = u32()

    def accesses(self) -> list[Access]:
        return [
            Access(Space.DRAM, 0, self.src, self.nbytes, False, "src"),
            Access(Space.HOST, 0, self.dst, self.nbytes, True, "dst"),
        ]


@dataclass(frozen=True, kw_only=True)
class Vec(Instruction):
    """Vector-unit function ``func`` over ``rows x cols`` elements (int8, or int16/int32
    for the wide functions; see :class:`VecFunc` and ``isa.vecfuncs.vec_operand_bytes``;
    the meaning of ``p0..p3`` is in ``isa.semantics``).
    """

    opcode: ClassVar[Opcode] = Opcode.VEC
    mnemonic: ClassVar[str] = "vec"
    engine_kind: ClassVar[Engine] = Engine.VPU
    func: int = u8(enum=VecFunc)
    rows: int = u32()
    cols: int = u32()
    src0: int = u64()
    src1: int = u64(default=NO_ADDR)
    dst: int = u64()
    p0: int = i32(default=0)
    p1: int = i32(default=0)
    p2: int = i32(default=0)
    p3: int = i32(default=0)

    @property
    def elements(self) -> int:
        return self.rows * self.cols

    def accesses(self) -> list[Access]:
        c = self.core
        src0, src1, dst = vec_operand_bytes(self.func, self.rows, self.cols, self.p1, self.p2)
        return (
            sram_access(c, self.src0, src0, False, "src0")
            + (sram_access(c, self.src1, src1, False, "src1") if src1 else [])
            + sram_access(c, self.dst, dst, True, "dst")
        )

    def ops(self) -> int:
        return self.elements * VEC_OPS_PER_ELEMENT[VecFunc(self.func)]


@dataclass(frozen=True, kw_only=True)
class KvWrite(Instruction):
    """Append ``tokens`` tokens of ``width`` int8 values (SRAM ``src``, token-major) to a
    KV cache in DRAM: the vector unit quantizes and packs them into KV format ``fmt`` (an
    index into the program's format table) and writes them at positions
    ``pos .. pos+tokens-1`` of the cache whose ``cap``-token region starts at DRAM ``dst``
    (``nbytes`` = the region's bytes). Formats with a full-precision window re-quantize the
    tokens that leave it. The bytes actually moved in DRAM are the format's.
    """

    opcode: ClassVar[Opcode] = Opcode.KV_WRITE
    mnemonic: ClassVar[str] = "kv.write"
    engine_kind: ClassVar[Engine] = Engine.VPU
    fmt: int = u16()
    tokens: int = u32()
    width: int = u32()
    pos: int = u32(default=0)
    cap: int = u32(default=0)
    src: int = u64()
    dst: int = u64()
    nbytes: int = u32()

    def accesses(self) -> list[Access]:
        return sram_access(self.core, self.src, self.tokens * self.width, False, "src") + [
            Access(Space.DRAM, 0, self.dst, self.nbytes, True, "dst")
        ]

    def ops(self) -> int:
        return 4 * self.tokens * self.width


@dataclass(frozen=True, kw_only=True)
class KvRead(Instruction):
    """Read tokens ``pos .. pos+tokens-1`` of the KV cache at DRAM ``src`` (format ``fmt``,
    ``cap`` tokens, ``nbytes`` region bytes) and write them, dequantized onto the int8 grid
    they were written on, at SRAM ``dst`` (``tokens x width``)."""

    opcode: ClassVar[Opcode] = Opcode.KV_READ
    mnemonic: ClassVar[str] = "kv.read"
    engine_kind: ClassVar[Engine] = Engine.VPU
    fmt: int = u16()
    tokens: int = u32()
    width: int = u32()
    pos: int = u32(default=0)
    cap: int = u32(default=0)
    src: int = u64()
    dst: int = u64()
    nbytes: int = u32()

    def accesses(self) -> list[Access]:
        return [Access(Space.DRAM, 0, self.src, self.nbytes, False, "src")] + sram_access(
            self.core, self.dst, self.tokens * self.width, True, "dst"
        )

    def ops(self) -> int:
        return 3 * self.tokens * self.width


@dataclass(frozen=True, kw_only=True)
class Attn(Instruction):
    """Integer attention of ``q_len`` int8 queries of ``heads`` heads (``head_dim`` each,
    SRAM ``q``, token-major) over the first ``ctx`` tokens of one KV head's caches, which
    the attention unit streams from DRAM in their stored formats: K at ``k`` (format
    ``k_fmt``), V at ``v`` (format ``v_fmt``), each a ``cap``-token region of
    ``k_nbytes``/``v_nbytes`` bytes. ``heads`` is a multiple of ``kv_heads`` (grouped-query
    attention; one instruction serves one KV head, ``kv_heads = 1``, in compiled programs).
    Query ``i`` sits at position ``pos + i`` and attends to positions ``<= pos + i``.
    Scores are scaled by ``score_mult * 2**-score_shift`` before the integer softmax; the
    int8 output (SRAM ``out``, ``q_len x heads x head_dim``) by ``out_mult * 2**-out_shift``.
    """

    opcode: ClassVar[Opcode] = Opcode.ATTN
    mnemonic: ClassVar[str] = "attn"
    engine_kind: ClassVar[Engine] = Engine.MXU
    q_len: int = u32()
    ctx: int = u32()
    heads: int = u16()
    kv_heads: int = u16()
    head_dim: int = u16()
    pos: int = u32(default=0)
    cap: int = u32(default=0)
    k_fmt: int = u16()
    v_fmt: int = u16()
    q: int = u64()
    k: int = u64()
    v: int = u64()
    out: int = u64()
    k_nbytes: int = u32()
    v_nbytes: int = u32()
    score_mult: int = i32(default=1)
    score_shift: int = u8(default=0)
    out_mult: int = i32(default=1)
    out_shift: int = u8(default=0)

    def accesses(self) -> list[Access]:
        c = self.core
        qn = self.q_len * self.heads * self.head_dim
        return (
            sram_access(c, self.q, qn, False, "q")
            + [Access(Space.DRAM, 0, self.k, self.k_nbytes, False, "k"),
               Access(Space.DRAM, 0, self.v, self.v_nbytes, False, "v")]
            + sram_access(c, self.out, qn, True, "out")
        )

    def ops(self) -> int:
        # QK^T and PV: 2 matmuls of q_len x ctx x head_dim per head, 2 ops per MAC.
        return 2 * 2 * self.q_len * self.ctx * self.head_dim * self.heads


def f32_bits(value: float) -> int:
    """The IEEE-754 binary32 pattern of ``value`` (for the ``*_f32`` fields of attn.dq)."""
    return int(struct.unpack("<I", struct.pack("<f", value))[0])


def f32_value(bits: int) -> float:
    """The float a binary32 pattern holds."""
    return float(struct.unpack("<f", struct.pack("<I", bits & 0xFFFF_FFFF))[0])


@dataclass(frozen=True, kw_only=True)
class AttnDq(Attn):
    """Attention that dequantizes the cache on read: a vector-unit pass turns the K and V
    codes of the first ``ctx`` tokens into fp16 (``fp16(v' * k_scale)``, ``v'`` the exact
    dequantized int8-grid value of the stored code, :meth:`KVFormat.region_read_q24`),
    the queries into fp16 (``fp16(q * q_scale)``), then fp16 attention with fp32
    accumulation and a float softmax (``softmax(q.k * softmax_scale)``), and the output
    back to int8 (``sat8(round_half_up(o * out_scale))``). The ``*_f32`` fields hold
    binary32 patterns (:func:`f32_bits`); ``score_*``/``out_mult``/``out_shift`` are
    unused. This is the read path academic INT2/INT4 KV methods assume; :class:`Attn`
    consumes the cache as integers (what ARIES does).
    """

    opcode: ClassVar[Opcode] = Opcode.ATTN_DQ
    mnemonic: ClassVar[str] = "attn.dq"
    engine_kind: ClassVar[Engine] = Engine.MXU
    q_scale_f32: int = u32()
    k_scale_f32: int = u32()
    v_scale_f32: int = u32()
    softmax_scale_f32: int = u32()
    out_scale_f32: int = u32()

    #: the fields holding binary32 patterns (each must be a finite value > 0)
    FLOAT_FIELDS: ClassVar[tuple[str, ...]] = (
        "q_scale_f32", "k_scale_f32", "v_scale_f32", "softmax_scale_f32", "out_scale_f32")


INSTRUCTION_TYPES: tuple[type[Instruction], ...] = (
    Nop,
    DmaLoad,
    DmaLoadIndexed,
    DmaStore,
    DmaCopy,
    HostWrite,
    HostRead,
    Gemm,
    GemmRow,
    GemmGroup,
    GemmRowGroup,
    Vec,
    KvWrite,
    KvRead,
    Attn,
    AttnDq,
)
BY_OPCODE: dict[int, type[Instruction]] = {t.opcode: t for t in INSTRUCTION_TYPES}
BY_MNEMONIC: dict[str, type[Instruction]] = {t.mnemonic: t for t in INSTRUCTION_TYPES}


@dataclass(frozen=True, eq=False)
class Patched:
    """A program's instructions as :meth:`Program.patched` made them: the tuple ``base``
    (held, so that it stays the object it was) with new objects at ``positions``
    (increasing) and ``base``'s own object at every other position."""

    base: tuple[Instruction, ...]
    positions: tuple[int, ...]


@dataclass(frozen=True)
class Program:
    """A list of instructions plus its KV-format table and free-form metadata.

    ``formats`` holds the names (or serialized descriptions) of the KV formats that
    ``fmt``/``k_fmt``/``v_fmt`` fields index into. ``marks`` names ranges of instruction
    indices ``(name, first, end)`` (the compiler marks each layer of each token tile) for
    reports: metadata beside the program, never encoded and not compared, so a mark
    changes neither what the program does nor its encoded bytes.
    """

    instructions: tuple[Instruction, ...]
    formats: tuple[str, ...] = ()
    name: str = ""
    marks: tuple[tuple[str, int, int], ...] = field(default=(), compare=False, repr=False)
    #: how :meth:`patched` made the instructions from another program's (None: not so
    #: made); metadata like ``marks``, and not copied by ``dataclasses.replace``
    patched_from: Patched | None = field(default=None, init=False, compare=False, repr=False)

    @classmethod
    def patched(cls, base: tuple[Instruction, ...], positions: tuple[int, ...],
                objects: Sequence[Instruction], *, formats: tuple[str, ...] = (),
                name: str = "", marks: tuple[tuple[str, int, int], ...] = ()) -> Program:
        """The program of ``base``'s instructions with ``objects`` at ``positions``
        (increasing), which says so (:attr:`patched_from`): a consumer that holds what it
        made of ``base`` need then look only at ``positions`` (the program tables of a
        decode step after the last, :mod:`sim.device.engine.tables`)."""
        if len(positions) != len(objects):
            raise IsaError(f"Program.patched: {len(positions)} positions for "
                           f"{len(objects)} instructions")
        if not all(map(operator.lt, (-1, *positions), (*positions, len(base)))):
            raise IsaError("Program.patched: positions must increase within the program")
        ins = list(base)
        for at, obj in zip(positions, objects, strict=True):
            ins[at] = obj
        prog = cls(tuple(ins), formats=formats, name=name, marks=marks)
        # set once, here: the instructions were made from ``base`` by this method only
        object.__setattr__(prog, "patched_from", Patched(base, positions))
        return prog

    def __len__(self) -> int:
        return len(self.instructions)

    def __iter__(self):
        return iter(self.instructions)

    def ops(self) -> int:
        return sum(i.ops() for i in self.instructions)


@dataclass(frozen=True)
class Region:
    """A named extent of an address space with a traffic kind (weights, kv_cache, ...)."""

    name: str
    space: Space
    base: int
    size: int
    kind: str
    core: int = 0

    @property
    def end(self) -> int:
        return self.base + self.size


@dataclass(frozen=True)
class MemoryLayout:
    """Sizes of the address spaces and the regions a program may touch.

    When ``regions`` has entries for a space, every access to that space must fall inside
    one region; otherwise it must fall inside the space's size.
    """

    dram_bytes: int
    sram_bytes: int
    host_bytes: int
    num_cores: int
    regions: tuple[Region, ...] = ()

    def space_bytes(self, space: Space) -> int:
        return {Space.DRAM: self.dram_bytes, Space.SRAM: self.sram_bytes,
                Space.HOST: self.host_bytes}[space]

    @cached_property
    def _index(self) -> dict[tuple[Space, int], tuple[list[int], list[Region], list[int]]]:
        """Regions by (space, core) sorted by base (core 0 for DRAM and host), with the
        running maximum of their ends."""
        groups: dict[tuple[Space, int], list[Region]] = {}
        for r in self.regions:
            key = (r.space, r.core if r.space == Space.SRAM else 0)
            groups.setdefault(key, []).append(r)
        out = {}
        for key, regs in groups.items():
            regs = sorted(regs, key=lambda r: r.base)
            ends, top = [], 0
            for r in regs:
                top = max(top, r.end)
                ends.append(top)
            out[key] = ([r.base for r in regs], regs, ends)
        return out

    @cached_property
    def _spaces_with_regions(self) -> frozenset[Space]:
        return frozenset(r.space for r in self.regions)

    def has_regions(self, space: Space) -> bool:
        return space in self._spaces_with_regions

    def region_of(self, space: Space, core: int, addr: int, nbytes: int) -> Region | None:
        """The region wholly holding ``[addr, addr+nbytes)``, if any."""
        entry = self._index.get((space, core if space == Space.SRAM else 0))
        if entry is None:
            return None
        bases, regs, max_end = entry
        i = bisect.bisect_right(bases, addr) - 1
        while i >= 0 and max_end[i] > addr:
            r = regs[i]
            if addr + nbytes <= r.end:
                return r
            i -= 1
        return None


#: The ISA's public names (the core definitions and the GEMM family are re-exported from
#: :mod:`isa.instr_base` and :mod:`isa.instr_gemm`).
__all__ = [
    "Access", "Attn", "AttnDq", "BY_MNEMONIC", "BY_OPCODE", "DmaCopy", "DmaLoad", "DmaLoadIndexed",
    "DmaStore",
    "Engine", "f32_bits", "f32_value", "Gemm", "GemmGroup", "GemmRow", "GemmRowGroup",
    "HostRead", "HostWrite", "i32", "Instruction", "INSTRUCTION_TYPES", "KvRead", "KvWrite",
    "MemoryLayout", "NO_ADDR", "Nop", "Opcode", "PER_CORE_ENGINES", "Program", "Region",
    "Space", "sram_access", "u16", "u32", "u64", "u8", "Vec", "vec_operand_bytes",
    "VEC_OPS_PER_ELEMENT", "VecFunc",
]
