"""Vector-unit functions: their codes, operation counts and operand sizes.

``Vec`` (``isa.instructions``) names one of these in its ``func`` field; the parameters
``p0..p3`` are per-function (``isa.semantics`` lists them). The int8 functions work on
``rows x cols`` int8 elements; the wide functions (the wide integer pipeline,
``isa.kernels.wide``) read or write int16/int32 elements whose width is a parameter.
"""

from __future__ import annotations

from enum import IntEnum


class VecFunc(IntEnum):
    """Vector-unit functions. Parameters ``p0..p3`` are per-function (see ``isa.semantics``)."""

    COPY = 0
    ADD = 1  # residual add with rescale
    RMSNORM = 2
    SILU_MUL = 3  # SwiGLU: silu(src0) * src1
    ROPE = 4
    SOFTMAX = 5
    REQUANT = 6  # int32 -> int8 with multiplier and shift
    FROM_F32 = 7  # float32 input -> int8 (the input converter at the host boundary)
    LAYERNORM = 8  # LayerNorm without bias (Cohere): RMSNorm of the mean-free row
    TOPK_GATE = 9  # MoE router: int8 logits -> top-k (expert id, Q24 weight) int32 pairs
    GATE_ACC = 10  # MoE: int32 rows scaled by a Q24 gate per row (from SRAM), accumulated
    SIGMOID = 11  # int8 logits -> int32 Q24 sigmoid (Qwen2-MoE's shared-expert gate)
    GELU_MUL = 12  # GeGLU: gelu(src0) * src1, GELU's tanh form (Gemma)
    # --- the wide pipeline (codes from 16 on) ----------------------------------------
    ADD_WIDE = 16  # wide residual + int32 projection output -> wide residual
    RMSNORM_WIDE = 17  # int16/int32 rows -> int32
    QUANT_ROW = 18  # int32 -> int8 with one dynamic scale per row (+ row metadata)
    SILU_MUL_WIDE = 19  # SwiGLU of int32 gate/up -> int32
    FROM_F32_WIDE = 20  # float32 input -> int16/int32
    # --- the wide pipeline for LayerNorm models ----------------------------------------
    LAYERNORM_WIDE = 21  # int16/int32 rows -> int32 LayerNorm without bias (Cohere);
    # p3 = 1: the rows are Hadamard-rotated (Sylvester), their mean is channel 0
    # --- the wide pipeline for post-norm blocks (EXAONE-4.0: no norm before projections)
    QUANT_ROW_WIDE = 22  # int16/int32 rows -> int8 with one dynamic scale per row (+ meta)
    RMSNORM_QUANT = 23  # RMSNORM_WIDE then QUANT_ROW fused: int16/int32 rows -> int8 + meta
    ROW_AMAX = 24  # int32 rows -> int32 per-row max(1, max|x|) (one core's part of a row)
    QUANT_ROW_AMAX = 25  # QUANT_ROW on the maximum of p1 parts' ROW_AMAX results
    GELU_MUL_WIDE = 26  # GeGLU of int32 gate/up -> int32


#: Integer ops per element of each vector function, for the vector unit's timing
#: (an assumption of the model: count of multiply/add/shift/compare steps per element).
#: The wide functions count their extra passes: RMSNORM_WIDE and QUANT_ROW find the row's
#: largest magnitude first (+1 compare, +1 shift per element).
VEC_OPS_PER_ELEMENT = {
    VecFunc.COPY: 1,
    VecFunc.ADD: 3,
    VecFunc.RMSNORM: 6,
    VecFunc.SILU_MUL: 8,
    VecFunc.ROPE: 6,
    VecFunc.SOFTMAX: 10,
    VecFunc.REQUANT: 3,
    VecFunc.FROM_F32: 3,
    VecFunc.LAYERNORM: 8,  # RMSNorm's 6 plus the row sum and the subtraction of the mean
    # SOFTMAX's 10 plus a compare and a select per element for the top-k selection
    VecFunc.TOPK_GATE: 12,
    VecFunc.GATE_ACC: 3,  # multiply, shift, add
    # SOFTMAX's exponential and one division per element
    VecFunc.SIGMOID: 10,
    # SILU_MUL's 8 plus the cubic of the gate's argument (square, multiply, add, multiply)
    VecFunc.GELU_MUL: 12,
    VecFunc.ADD_WIDE: 3,
    VecFunc.RMSNORM_WIDE: 8,
    VecFunc.QUANT_ROW: 4,
    VecFunc.SILU_MUL_WIDE: 9,
    VecFunc.FROM_F32_WIDE: 3,
    # RMSNORM_WIDE's 8 plus the row sum and the subtraction of the mean
    VecFunc.LAYERNORM_WIDE: 10,
    VecFunc.QUANT_ROW_WIDE: 4,  # QUANT_ROW's steps on a wide operand
    VecFunc.RMSNORM_QUANT: 12,  # RMSNORM_WIDE's 8 + QUANT_ROW's 4, one pass over SRAM
    VecFunc.ROW_AMAX: 2,  # |x|, compare
    VecFunc.QUANT_ROW_AMAX: 3,  # QUANT_ROW without its own maximum search
    VecFunc.GELU_MUL_WIDE: 13,  # SILU_MUL_WIDE's 9 plus GELU_MUL's cubic (4)
}

#: Bytes of row metadata :data:`VecFunc.QUANT_ROW` writes after its int8 output, per row:
#: two int32, the row factor and its exponent (``isa.kernels.wide.quant_row``).
ROW_META_BYTES = 8
#: Bytes of one routing-table entry TOPK_GATE writes (int32 expert id, int32 Q24 weight;
#: ``isa.kernels.moe``) and the largest k it takes (an assumption; see there).
TOPK_ENTRY_BYTES = 8
MAX_TOPK = 16
#: Element widths (bits) of a wide residual operand (``p2`` of ADD_WIDE, RMSNORM_WIDE and
#: FROM_F32_WIDE).
WIDE_BITS = (16, 32)
#: Functions whose ``p2`` is the width of their wide operand.
_WIDTH_PARAM = (VecFunc.ADD_WIDE, VecFunc.RMSNORM_WIDE, VecFunc.FROM_F32_WIDE,
                VecFunc.LAYERNORM_WIDE, VecFunc.QUANT_ROW_WIDE, VecFunc.RMSNORM_QUANT)


def wide_bytes(bits: int) -> int:
    """Bytes per element of a wide operand of ``bits`` (16 -> 2, 32 -> 4; else 4)."""
    return 2 if bits == 16 else 4


def vec_operand_bytes(func: int, rows: int, cols: int, p1: int,
                      p2: int) -> tuple[int, int, int]:
    """``(src0, src1, dst)`` bytes a ``Vec`` of ``func`` over ``rows x cols`` reads and
    writes (src1 0: no second operand)."""
    f = VecFunc(func)
    n = rows * cols
    if f in (VecFunc.REQUANT, VecFunc.FROM_F32):
        return 4 * n, 0, n
    if f in (VecFunc.ADD, VecFunc.SILU_MUL, VecFunc.GELU_MUL):
        return n, n, n
    if f in (VecFunc.RMSNORM, VecFunc.LAYERNORM):
        return n, 2 * cols, n  # int16 gain per column
    if f == VecFunc.ROPE:
        return n, 2 * rows * max(p1, 0), n  # int16 cos and sin, rows x rot_dim/2 each
    if f == VecFunc.ADD_WIDE:
        return wide_bytes(p2) * n, 4 * n, wide_bytes(p2) * n
    if f in (VecFunc.RMSNORM_WIDE, VecFunc.LAYERNORM_WIDE):
        return wide_bytes(p2) * n, 2 * cols, 4 * n
    if f == VecFunc.QUANT_ROW:
        return 4 * n, 0, n + ROW_META_BYTES * rows
    if f == VecFunc.QUANT_ROW_WIDE:
        return wide_bytes(p2) * n, 0, n + ROW_META_BYTES * rows
    if f in (VecFunc.SILU_MUL_WIDE, VecFunc.GELU_MUL_WIDE):
        return 4 * n, 4 * n, 4 * n
    if f == VecFunc.RMSNORM_QUANT:
        return wide_bytes(p2) * n, 2 * cols, n + ROW_META_BYTES * rows
    if f == VecFunc.ROW_AMAX:
        return 4 * n, 0, 4 * rows
    if f == VecFunc.QUANT_ROW_AMAX:
        return 4 * n, 4 * max(p1, 0) * rows, n + ROW_META_BYTES * rows
    if f == VecFunc.FROM_F32_WIDE:
        return 4 * n, 0, wide_bytes(p2) * n
    if f == VecFunc.TOPK_GATE:
        return n, 0, TOPK_ENTRY_BYTES * rows * max(p2, 0)  # p2 = k entries per row
    if f == VecFunc.GATE_ACC:  # one int32 gate per row, p1 bytes apart
        return 4 * n, gate_stride(p1) * (rows - 1) + 4 if rows else 0, 4 * n
    if f == VecFunc.SIGMOID:
        return n, 0, 4 * n
    return n, 0, n


#: ``p2`` bit of GATE_ACC: add to ``dst`` (else overwrite it).
GATE_ACCUMULATE = 1


def gate_stride(p1: int) -> int:
    """Bytes between the gates of consecutive rows of GATE_ACC (``p1``; 0: packed int32)."""
    return p1 if p1 > 0 else 4


def vec_problem(func: int, p2: int, cols: int | None = None, *, p1: int = 1
                ) -> str | None:
    """What is wrong with a ``Vec``'s parameters, if anything (the validator's check;
    ``cols``: the row width, for the functions whose parameters it bounds; ``p1``: the
    parts of each row, for QUANT_ROW_AMAX)."""
    if func == VecFunc.QUANT_ROW_AMAX and p1 < 1:
        return f"QUANT_ROW_AMAX: p1 (the parts of each row) must be >= 1, got {p1}"
    if func in _WIDTH_PARAM and p2 not in WIDE_BITS:
        return (f"{VecFunc(func).name}: p2 (the wide operand's bits) must be one of "
                f"{WIDE_BITS}, got {p2}")
    if func == VecFunc.GATE_ACC and (p1 < 0 or p1 % 4):
        return ("GATE_ACC: p1 (the bytes between rows' gates) must be 0 or a positive "
                f"multiple of 4, got {p1}")
    if func == VecFunc.TOPK_GATE:
        top = MAX_TOPK if cols is None else min(MAX_TOPK, cols)
        if not 1 <= p2 <= top:
            return (f"TOPK_GATE: p2 (k, the experts chosen per row) must be in 1..{top} "
                    f"(at most cols and {MAX_TOPK}), got {p2}")
    return None
