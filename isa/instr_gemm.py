"""The matrix unit's instructions: :class:`Gemm` and its variants (per-row input factors,
group-wise 4-bit weights, both). :mod:`isa.instructions` re-exports them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .instr_base import (
    NO_ADDR,
    Access,
    Engine,
    Instruction,
    Opcode,
    sram_access,
    u8,
    u16,
    u32,
    u64,
)
from .kernels.gemm_group import group_count, group_row_bytes
from .vecfuncs import ROW_META_BYTES


@dataclass(frozen=True, kw_only=True)
class Gemm(Instruction):
    """``out[m, n] = requant(a[m, k] @ w[k, n] + bias[n])`` on the matrix unit.

    ``a`` is int8, row-major. ``w`` is stored output-channel-major (``n`` rows of ``k``
    values): int8, or int4 packed two per byte with element ``2i`` in the low nibble.
    ``bias`` (int32[n]) and ``scale`` (int32[n] multipliers) are optional (:data:`NO_ADDR`);
    with a scale the int32 accumulator is requantized to int8 by ``(acc * scale[n])`` rounded
    and shifted right by ``shift`` bits and saturated; without one the output is int32.
    Output row ``i`` starts at ``out + i * out_stride`` (0 = packed rows of ``n``), so the
    tiles of a wide matrix write their column blocks straight into one row-major output.
    """

    opcode: ClassVar[Opcode] = Opcode.GEMM
    mnemonic: ClassVar[str] = "gemm"
    engine_kind: ClassVar[Engine] = Engine.MXU
    m: int = u32()
    k: int = u32()
    n: int = u32()
    w_bits: int = u8()
    a: int = u64()
    w: int = u64()
    out: int = u64()
    bias: int = u64(default=NO_ADDR)
    scale: int = u64(default=NO_ADDR)
    shift: int = u8(default=0)
    out_stride: int = u32(default=0)

    @property
    def out_bytes_per_element(self) -> int:
        return 4 if self.scale == NO_ADDR else 1

    @property
    def w_nbytes(self) -> int:
        return (self.k * self.w_bits + 7) // 8 * self.n

    def accesses(self) -> list[Access]:
        c = self.core
        return (
            sram_access(c, self.a, self.m * self.k, False, "a")
            + sram_access(c, self.w, self.w_nbytes, False, "w")
            + sram_access(c, self.bias, 4 * self.n, False, "bias")
            + sram_access(c, self.scale, 4 * self.n, False, "scale")
            + sram_access(c, self.out, self.out_extent, True, "out")
        )

    @property
    def out_extent(self) -> int:
        row = self.n * self.out_bytes_per_element
        step = self.out_stride or row
        return (self.m - 1) * step + row if self.m else 0

    @property
    def macs(self) -> int:
        """Multiply-accumulates of the matrix unit (the timing model's work count)."""
        return self.m * self.k * self.n

    def ops(self) -> int:
        return 2 * self.macs

    @property
    def precision(self) -> str:
        return f"w{self.w_bits}a8"


@dataclass(frozen=True, kw_only=True)
class GemmRow(Gemm):
    """:class:`Gemm` whose input rows carry their own dynamic scales (the wide pipeline's
    per-token int8 activations) and whose output may stay int32.

    ``row_meta`` (SRAM, ``m`` pairs of int32 ``(fa, p)`` written by ``Vec`` QUANT_ROW; or
    :data:`NO_ADDR` for a static input) gives each input row's factor; the epilogue is
    ``t = sat32(rs(acc * scale[n], shift))``, ``out = sat_b(rs(t * fa[i], row_shift - p[i])
    + bias[n])`` (the bias in output units) for ``out_bits`` b = 8 or 32; a static input
    adds the bias to ``acc`` as :class:`Gemm` does (``isa.kernels.wide.requant_rows``).
    ``scale`` is required. One extra multiply and shift per output element over
    :class:`Gemm` (counted in :meth:`ops`).
    """

    opcode: ClassVar[Opcode] = Opcode.GEMM_ROW
    mnemonic: ClassVar[str] = "gemm.row"
    row_meta: int = u64(default=NO_ADDR)
    row_shift: int = u8(default=0)
    out_bits: int = u8(default=8)

    @property
    def out_bytes_per_element(self) -> int:
        return 4 if self.out_bits == 32 else 1

    def accesses(self) -> list[Access]:
        meta = sram_access(self.core, self.row_meta, ROW_META_BYTES * self.m, False, "row_meta")
        return super().accesses() + meta

    def ops(self) -> int:
        extra = 2 * self.m * self.n if self.row_meta != NO_ADDR else 0
        return super().ops() + extra


@dataclass(frozen=True, kw_only=True)
class GemmGroup(Gemm):
    """:class:`Gemm` with group-wise asymmetric 4-bit weights (``w_bits`` = 4): each row
    of ``w`` is a row image of codes, int16 group minima and uint8 group steps for groups
    of ``group`` weights (:mod:`isa.kernels.gemm_group`), accumulated in int64. The
    multipliers at ``scale`` must lie in ``[0, 2**24)``; without ``scale`` the output is
    the int32-saturated accumulator plus bias. The matrix unit does 2 extra MACs per group
    per output and the ``m*k`` additions of the activations' group sums.
    """

    opcode: ClassVar[Opcode] = Opcode.GEMM_GROUP
    mnemonic: ClassVar[str] = "gemm.g"
    engine_kind: ClassVar[Engine] = Engine.MXU
    group: int = u16()

    @property
    def w_nbytes(self) -> int:
        return group_row_bytes(self.k, self.group) * self.n

    @property
    def macs(self) -> int:
        return (self.m * self.k * self.n + 2 * self.m * self.n * group_count(self.k, self.group)
                + self.m * self.k)


@dataclass(frozen=True, kw_only=True)
class GemmRowGroup(GemmRow, GemmGroup):
    """:class:`GemmGroup` weights (group-wise 4-bit row images, int64 accumulator) with the
    epilogue of :class:`GemmRow` (per-row input factors at ``row_meta``, int8 or int32
    output): the wide pipeline's projections on 4-bit group-wise weights. The multipliers
    at ``scale`` must lie in ``[0, 2**24)`` (``|acc * mult| < 2**62``); a static input
    (``row_meta`` = :data:`NO_ADDR`) adds the bias to the int64 accumulator. Work: the
    group MACs of :class:`GemmGroup` plus the row-factor multiply of :class:`GemmRow`.
    """

    opcode: ClassVar[Opcode] = Opcode.GEMM_ROW_GROUP
    mnemonic: ClassVar[str] = "gemm.gr"

