"""Host-side encoding of group-wise asymmetric 4-bit weights (``bits.numerics.weight_group``
= ``g128`` / ``g32``) for the ``gemm.g`` instruction (:mod:`isa.kernels.gemm_group`).

Per output row ``n`` and group ``g`` of ``G`` weights (the numerics study's two-level
integer form, scratch report section 5, K6):

    d = (max - min) / 15                        the group's float step
    s1[n] = max(max_g d / 255, max_g |min| / 32767)    one float per row (the channel scale)
    D = clamp(round(d / s1), 1, 255)            uint8
    M = clamp(round(min / s1), -32768, 32767)   int16
    c = clamp(round((w - M s1) / (D s1)), 0, 15)

so ``w ~= s1 * (D c + M)``; ``s1`` goes into the per-channel multiplier of the epilogue as
a per-channel weight scale does. ``weight_group`` concerns 4-bit matrices only: 8-bit
matrices of the same config (W4V8 keeps ``v_proj`` and the head at 8 bits) stay
symmetric per channel, and a config whose weights are all 8-bit is refused
(:class:`models.bits.BitConfig`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from isa.kernels.gemm_group import MULT_BITS, group_row_bytes, pack_group_rows, unpack_group_rows

from ..bits import BitConfig
from ..weights import QuantizedWeight, quantize_weight

#: Weights per group of each ``weight_group`` option (0: one scale per output channel).
GROUP_SIZES: dict[str, int] = {"channel": 0, "g128": 128, "g32": 32}
__all__ = ["MULT_BITS", "GROUP_SIZES", "GroupQuantizedWeight", "matrix_group", "quantize_group",
           "quantize_matrix", "weight_group_size", "weight_row_bytes"]
CODE_MAX = 15  # uint4 codes
D_MAX = 255  # uint8 group steps
M_MAX = 32767  # int16 group minima


def weight_group_size(bits: BitConfig) -> int:
    """``G`` of the config's 4-bit matrices (0: per channel)."""
    return GROUP_SIZES[bits.numerics.weight_group]


def matrix_group(weight_bits: int, group: int) -> int:
    """The group size a matrix of ``weight_bits`` gets: ``group`` at 4 bits, else 0."""
    return group if weight_bits == 4 else 0


def weight_row_bytes(k: int, weight_bits: int, group: int) -> int:
    """DRAM bytes of one output row: packed codes, plus M and D per group when grouped."""
    g = matrix_group(weight_bits, group)
    return group_row_bytes(k, g) if g else (k * weight_bits + 7) // 8


@dataclass(frozen=True, eq=False)
class GroupQuantizedWeight:
    """A matrix in group-wise 4-bit form: ``data`` the ``gemm.g`` row images (uint8
    ``[n, row_bytes]``), ``scales`` the per-row ``s1`` (float32 ``[n]``)."""

    n: int
    k: int
    group: int
    data: np.ndarray
    scales: np.ndarray
    bits: int = 4

    @property
    def row_bytes(self) -> int:
        return group_row_bytes(self.k, self.group)

    @property
    def nbytes(self) -> int:
        return self.n * self.row_bytes

    def integer_weights(self) -> np.ndarray:
        """``D c + M`` per weight, int32 ``[n, k]`` (what the kernel multiplies by)."""
        codes, d, mins = unpack_group_rows(self.data, self.k, self.group)
        g_of = np.arange(self.k) // self.group
        return (d.astype(np.int32)[:, g_of] * codes.astype(np.int32)
                + mins.astype(np.int32)[:, g_of])

    def dequantize(self) -> np.ndarray:
        """``s1 * (D c + M)`` as float32 ``[n, k]``."""
        return (self.integer_weights().astype(np.float64)
                * self.scales.astype(np.float64)[:, None]).astype(np.float32)


def quantize_group(w: np.ndarray, group: int) -> GroupQuantizedWeight:
    """Encode a float ``(n, k)`` matrix in groups of ``group`` (see the module docstring)."""
    w = np.asarray(w, dtype=np.float64)
    if w.ndim != 2 or w.shape[1] < 1:
        raise ValueError(f"quantize_group: expected a 2-D (n, k) matrix, got shape {w.shape}")
    if group < 2 or group % 2:
        raise ValueError(f"quantize_group: group must be an even number >= 2, got {group}")
    n, k = w.shape
    ng = -(-k // group)
    pad = np.full((n, ng * group), np.nan)
    pad[:, :k] = w
    blocks = pad.reshape(n, ng, group)
    lo = np.nanmin(blocks, axis=2)
    hi = np.nanmax(blocks, axis=2)
    step = (hi - lo) / CODE_MAX
    s1 = np.maximum(step.max(axis=1) / D_MAX, np.abs(lo).max(axis=1) / M_MAX)
    s1 = np.where(s1 > 0, s1, 1.0).astype(np.float32).astype(np.float64)
    d = np.clip(np.rint(step / s1[:, None]), 1, D_MAX)
    mins = np.clip(np.rint(lo / s1[:, None]), -M_MAX - 1, M_MAX)
    g_of = np.arange(k) // group
    codes = np.rint((w - mins[:, g_of] * s1[:, None]) / (d[:, g_of] * s1[:, None]))
    codes = np.clip(codes, 0, CODE_MAX).astype(np.uint8)
    rows = pack_group_rows(codes, d.astype(np.uint8), mins.astype(np.int16))
    return GroupQuantizedWeight(n, k, group, rows, s1.astype(np.float32))


def quantize_matrix(w: np.ndarray, weight_bits: int,
                    group: int) -> QuantizedWeight | GroupQuantizedWeight:
    """``w`` at ``weight_bits``: group-wise when 4-bit and ``group`` > 0, else symmetric
    per channel (:func:`models.weights.quantize_weight`)."""
    g = matrix_group(weight_bits, group)
    return quantize_group(w, g) if g else quantize_weight(w, weight_bits)
