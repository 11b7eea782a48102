"""Functional semantics of each instruction: what it computes, never how long it takes.

``execute(instr, mem, formats)`` reads its operands from ``mem`` (any object with the
:class:`Memory` interface: byte reads and writes per address space), computes with the
integer kernels of :mod:`isa.kernels` and the KV formats of :mod:`isa.kv`, and
writes its results back. The device calls it when the instruction completes.

Vector functions (``Vec``, ``rows x cols`` int8 unless noted; ``rs`` = round half up of a
right shift, ``sat8`` = clamp to int8; formulas in :mod:`isa.kernels.vector`):

========== =========================================== ==================================
func       operands                                    p0, p1, p2, p3
========== =========================================== ==================================
COPY       src0 -> dst                                 -
ADD        ``sat8(rs(src0*p0 + src1*p1, p2))``         ma, mb, shift
RMSNORM    src0, gain int16[cols] at src1              eps_q, shift
LAYERNORM  as RMSNORM, of the row minus its mean          eps_q, shift
SILU_MUL   ``silu(src0) * src1``                       in_mult, in_shift, out_mult, out_shift
GELU_MUL   ``gelu(src0) * src1`` (tanh form)           in_mult, in_shift, out_mult, out_shift
ROPE       src0, cos then sin int16[rows, p1/2] at src1  head_dim, rot_dim
SOFTMAX    row softmax, int8 probabilities (Q7)        mult, shift, out_shift
REQUANT    int32 src0 -> int8                          mult, shift
FROM_F32   float32 src0 -> int8, ``x * p0 / 2**p1``    mult, shift
TOPK_GATE  router logits -> int32 (id, Q24 weight) x k   mult, shift, k, flags
GATE_ACC   int32 src0 x gate -> int32 dst (see below)    shift, gate stride, accumulate
SIGMOID    int8 src0 -> int32 Q24 sigmoid                mult, shift
========== =========================================== ==================================

TOPK_GATE (:mod:`isa.kernels.moe`) writes ``8 * k`` bytes per row at ``dst``: the routing
table of a MoE layer. GATE_ACC reads row ``r``'s int32 gate at ``src1 + r * p1`` (``p1`` 0:
4) and writes ``dst = sat32(rs(src0 * gate, p0))``, plus the old ``dst`` when ``p2 & 1``
(it reads ``dst`` then): a routed expert's output weighted and summed per token.

The wide functions (``isa.kernels.wide``; "wide" = int16 or int32 as ``p2`` says):

============= ========================================== =================================
func          operands                                   p0, p1, p2, p3
============= ========================================== =================================
ADD_WIDE      wide src0, int32 src1 -> wide              ma, shift, bits
RMSNORM_WIDE  wide src0, gain int16[cols] at src1 -> i32 eps_q, shift, bits
QUANT_ROW     int32 src0 -> int8, then (fa, p) per row   -
SILU_MUL_WIDE int32 src0, src1 -> int32                  in_mult, in_shift, out_mult, out_shift
GELU_MUL_WIDE as SILU_MUL_WIDE, with GELU's gate          in_mult, in_shift, out_mult, out_shift
FROM_F32_WIDE float32 src0 -> wide                       mult, shift, bits
RMSNORM_QUANT RMSNORM_WIDE then QUANT_ROW: wide -> int8  eps_q, shift, bits
ROW_AMAX      int32 src0 -> u32 max(1, max|row|)         -
============= ========================================== =================================

``QUANT_ROW_AMAX``: int32 src0 and the row maxima ``int32[p1, rows]`` at src1 (``p1``
parts' ROW_AMAX results) -> QUANT_ROW's int8 rows and metadata on their maximum.

``GemmRow`` is a ``Gemm`` whose epilogue applies a per-row factor (``row_meta``, the pairs
QUANT_ROW writes) and whose output is int8 or int32 (``out_bits``); ``GemmRowGroup``
(``gemm.gr``) is that epilogue over the int64 accumulators of ``GemmGroup``'s group-wise
4-bit weights.

KV caches (``KvWrite``, ``KvRead``, ``Attn``): each cache is a DRAM region of
``fmt.region_bytes(cap, width)`` bytes laid out as :mod:`isa.kv.region` describes (header
with the token count for formats with a window or per-channel groups, sink slots,
quantized slots, full-precision ring). ``KvWrite`` (``nbytes`` = the region's bytes)
appends ``tokens`` int8 rows at ``pos`` (``pos`` below the cached length truncates first)
and re-quantizes the tokens that leave the window (:meth:`KVFormat.region_write`; only the
touched bytes are written back). ``KvRead`` returns positions ``pos .. pos+tokens-1`` on
the int8 grid. ``Attn`` reads the first ``ctx`` tokens of the K and V regions at ``k``/``v``
(``k_nbytes``/``v_nbytes`` are the bytes the attention unit streams, for timing; the
values come from the regions) and runs :func:`isa.kernels.attention.attend`. MLA form: when
``v`` lies inside the K region and both use the same format, the one latent cache is both
key and value (the value is the whole cached row; its first ``kv_lora_rank`` columns are
the latent output). Over a sliding-window cache (format ``ring``/``slide``) ``Attn`` reads
the *last* ``ctx`` positions the cache holds, ``pos`` counts from the first of them, and
query ``i`` sees only the ``slide`` positions up to its own.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .errors import IsaError
from .instructions import (
    NO_ADDR,
    Attn,
    AttnDq,
    DmaCopy,
    DmaLoad,
    DmaLoadIndexed,
    DmaStore,
    Gemm,
    GemmGroup,
    GemmRow,
    GemmRowGroup,
    HostRead,
    HostWrite,
    Instruction,
    KvRead,
    KvWrite,
    Nop,
    Space,
    Vec,
    VecFunc,
)
from .kernels import gemm_group as kgg
from .kernels import matrix as kmat
from .kernels import softmax as ksm
from .kernels import vector as kvec
from .kernels import wide as kwide
from .kernels.exact import blas_one_thread
from .semantics_kv import attn, attn_dq, format_of, kv_read, kv_write
from .semantics_moe import MOE_FUNCS, moe_vec
from .vecfuncs import ROW_META_BYTES, wide_bytes


class Memory(Protocol):
    """The bytes the instructions read and write. A memory may also offer strided block
    access (:class:`BlockMemory`, as ``sim.device.memory.DeviceMemory`` does): the copies and the
    GEMM outputs with a stride then move all their blocks in one call instead of one call
    per block, with the same bytes."""

    def read(self, space: Space, core: int, addr: int, nbytes: int) -> np.ndarray: ...

    def write(self, space: Space, core: int, addr: int, data: np.ndarray) -> None: ...


class BlockMemory(Memory, Protocol):
    """A :class:`Memory` with strided block access: ``rows`` blocks of ``nbytes`` bytes,
    the first at ``addr``, each ``stride`` bytes after the one before, as
    ``uint8[rows, nbytes]`` (what one ``read`` / ``write`` per block gives; written blocks
    do not overlap, ``stride >= nbytes``)."""

    def read_blocks(self, space: Space, core: int, addr: int, rows: int, nbytes: int,
                    stride: int) -> np.ndarray: ...

    def write_blocks(self, space: Space, core: int, addr: int, blocks: np.ndarray,
                     stride: int) -> None: ...


def _entry(mem: Memory, instr: DmaLoadIndexed) -> int:
    """The table entry a :class:`DmaLoadIndexed` reads: the int32 at its ``index``."""
    i = int(_sram(mem, instr.core, instr.index, 4, np.int32)[0])
    if not 0 <= i < instr.count:
        raise IsaError(f"dma.load.ix: index {i} (SRAM 0x{instr.index:x} of core "
                       f"{instr.core}) outside the table's entries 0..{instr.count - 1}")
    return i


#: A strided copy whose source and destination spans are at most this many times its
#: bytes moves in one read (and write) of each span instead of one per block.
_SPAN_PER_BYTE = 4


def _copy(mem: Memory, src_space: Space, dst_space: Space, instr, offset: int = 0) -> None:
    """Copy ``instr``'s blocks, its source ``offset`` bytes further on."""
    rows = getattr(instr, "rows", 1)
    n = instr.nbytes
    s_step = getattr(instr, "src_stride", 0) or n
    d_step = getattr(instr, "dst_stride", 0) or n
    if rows == 1 or (s_step == n and d_step == n):
        mem.write(dst_space, instr.core, instr.dst,
                  mem.read(src_space, instr.core, instr.src + offset, n * rows))
        return
    src, dst = instr.src + offset, instr.dst
    s_span, d_span = (rows - 1) * s_step + n, (rows - 1) * d_step + n
    same = src_space == dst_space and src < dst + d_span and dst < src + s_span
    apart = 0 < s_step and n <= d_step and not same  # no block overwrites one still to read
    if apart and hasattr(mem, "read_blocks"):
        # all blocks in one strided read and one strided write: the per-block loop's
        # result, as the source and destination spans do not overlap
        blocks = mem.read_blocks(src_space, instr.core, src, rows, n, s_step)
        if d_step == n:
            mem.write(dst_space, instr.core, dst, blocks)
        else:
            mem.write_blocks(dst_space, instr.core, dst, blocks, d_step)
        return
    if apart and max(s_span, d_span) <= _SPAN_PER_BYTE * rows * n:
        # the blocks in one read of the source span (and one read-modify-write of the
        # destination span): the per-block loop's result, as the spans do not overlap
        span = mem.read(src_space, instr.core, src, s_span).view(np.uint8)
        blocks = as_strided(span, (rows, n), (s_step, 1), writeable=False)
        if d_step == n:
            mem.write(dst_space, instr.core, dst, blocks)
            return
        out = mem.read(dst_space, instr.core, dst, d_span).view(np.uint8)
        as_strided(out, (rows, n), (d_step, 1))[:] = blocks
        mem.write(dst_space, instr.core, dst, out)
        return
    for r in range(rows):
        data = mem.read(src_space, instr.core, src + r * s_step, n)
        mem.write(dst_space, instr.core, dst + r * d_step, data)


def requantize(acc: np.ndarray, mult: np.ndarray | int, shift: int) -> np.ndarray:
    """int32 -> int8: ``(acc * mult + 2**(shift-1)) >> shift`` (round half up), saturated."""
    v = acc.astype(np.int64) * np.asarray(mult, dtype=np.int64)
    if shift > 0:
        v = (v + (1 << (shift - 1))) >> shift
    return np.clip(v, -128, 127).astype(np.int8)


def _sram(mem: Memory, core: int, addr: int, nbytes: int, dtype=np.int8) -> np.ndarray:
    return mem.read(Space.SRAM, core, addr, nbytes).view(dtype)


def _gemm(g: Gemm, mem: Memory) -> None:
    c = g.core
    a = _sram(mem, c, g.a, g.m * g.k).reshape(g.m, g.k)
    w = mem.read(Space.SRAM, c, g.w, g.w_nbytes).reshape(g.n, -1)
    bias = None if g.bias == NO_ADDR else _sram(mem, c, g.bias, 4 * g.n, np.int32)
    mult = None if g.scale == NO_ADDR else _sram(mem, c, g.scale, 4 * g.n, np.int32)
    if isinstance(g, GemmRowGroup):
        out = _gemm_row_group_out(g, mem, a, w, bias, mult)
    elif isinstance(g, GemmGroup):
        try:
            out = kgg.gemm_group(a, w, k=g.k, group=g.group, bias=bias, mult=mult,
                                 shift=g.shift)
        except ValueError as err:
            raise IsaError(str(err)) from None
    elif g.w_bits not in (4, 8):
        raise IsaError(f"gemm: w_bits {g.w_bits} is not supported (4 or 8)")
    elif isinstance(g, GemmRow):
        out = _gemm_row_out(g, mem, a, w, bias, mult)
    else:
        out = kmat.gemm(a, w, w_bits=g.w_bits, k=g.k, bias=bias, mult=mult, shift=g.shift)
    row = g.n * g.out_bytes_per_element
    step = g.out_stride or row
    flat = np.ascontiguousarray(out).reshape(g.m, -1).view(np.uint8)
    if step == row:
        mem.write(Space.SRAM, c, g.out, flat.reshape(-1))
    elif step > row and hasattr(mem, "write_blocks"):
        mem.write_blocks(Space.SRAM, c, g.out, flat, step)
    else:
        for i in range(g.m):
            mem.write(Space.SRAM, c, g.out + i * step, flat[i])


def _gemm_row_group_out(g: GemmRowGroup, mem: Memory, a: np.ndarray, w: np.ndarray,
                        bias: np.ndarray | None, mult: np.ndarray | None) -> np.ndarray:
    """gemm.gr: the int64 group accumulators through GemmRow's epilogue (a static input's
    bias added in int64: the group accumulator is not an int32 register)."""
    if mult is None:
        raise IsaError("gemm.gr: scale (the per-channel multipliers) is required")
    try:
        acc = kgg.group_accumulate(a, w, k=g.k, group=g.group)
        mult = kgg.group_multipliers(mult, acc.shape[1])
    except ValueError as err:
        raise IsaError(str(err).replace("gemm.g:", "gemm.gr:")) from None
    if bias is not None and g.row_meta == NO_ADDR:
        acc = acc + bias.astype(np.int64)
        bias = None
    return _gemm_row_out(g, mem, a, w, bias, mult, acc)


def _gemm_row_out(g: GemmRow, mem: Memory, a: np.ndarray, w: np.ndarray,
                  bias: np.ndarray | None, mult: np.ndarray | None,
                  acc: np.ndarray | None = None) -> np.ndarray:
    if mult is None:
        raise IsaError(f"{g.mnemonic}: scale (the per-channel multipliers) is required")
    if g.out_bits not in (8, 32):
        raise IsaError(f"{g.mnemonic}: out_bits must be 8 or 32, got {g.out_bits}")
    if acc is None:
        acc = kmat.matmul(a, w, g.w_bits, g.k)
    b = np.zeros(0, np.int32) if bias is None else np.ascontiguousarray(bias, np.int32)
    if g.row_meta == NO_ADDR:
        meta = np.zeros((0, 2), np.int32)
    else:
        meta = _sram(mem, g.core, g.row_meta, ROW_META_BYTES * g.m, np.int32).reshape(g.m, 2)
    out = np.empty(acc.shape, np.int8 if g.out_bits == 8 else np.int32)
    kwide.requant_rows(acc, b, np.ascontiguousarray(mult, np.int32), g.shift, meta,
                       g.row_shift, g.out_bits, out)
    return out


def _wide_dtype(bits: int):
    return np.int16 if bits == 16 else np.int32


def _vec_wide(v: Vec, mem: Memory, f: VecFunc) -> np.ndarray:
    """The wide functions' results (any dtype; QUANT_ROW's int8 rows then metadata)."""
    c, r, cols = v.core, v.rows, v.cols
    n = r * cols

    def wide_in(addr: int, bits: int) -> np.ndarray:
        return _sram(mem, c, addr, wide_bytes(bits) * n, _wide_dtype(bits)).reshape(r, cols)

    def i32(addr: int) -> np.ndarray:
        return _sram(mem, c, addr, 4 * n, np.int32).reshape(r, cols)

    if f == VecFunc.ADD_WIDE:
        out = np.empty((r, cols), _wide_dtype(v.p2))
        kwide.add_wide(wide_in(v.src0, v.p2), i32(v.src1), v.p0, v.p1, v.p2, out)
        return out
    if f in (VecFunc.RMSNORM_WIDE, VecFunc.LAYERNORM_WIDE):
        out = np.empty((r, cols), np.int32)
        g = _sram(mem, c, v.src1, 2 * cols, np.int16)
        if f == VecFunc.RMSNORM_WIDE:
            kwide.rmsnorm_wide(wide_in(v.src0, v.p2), g, v.p0, v.p1, out)
        else:  # p3: the row is rotated (a Sylvester Hadamard)
            kwide.layernorm_wide(wide_in(v.src0, v.p2), g, v.p0, v.p1, v.p3, out)
        return out
    if f in (VecFunc.QUANT_ROW, VecFunc.QUANT_ROW_WIDE):
        q = np.empty((r, cols), np.int8)
        meta = np.empty((r, 2), np.int32)
        kwide.quant_row(i32(v.src0) if f == VecFunc.QUANT_ROW else wide_in(v.src0, v.p2), q,
                        meta)
        return np.concatenate([q.reshape(-1).view(np.uint8), meta.reshape(-1).view(np.uint8)])
    if f in (VecFunc.QUANT_ROW_AMAX, VecFunc.RMSNORM_QUANT):
        q = np.empty((r, cols), np.int8)
        meta = np.empty((r, 2), np.int32)
        if f == VecFunc.QUANT_ROW_AMAX:
            amax = _sram(mem, c, v.src1, 4 * v.p1 * r, np.int32).reshape(v.p1, r)
            kwide.quant_row_amax(i32(v.src0), amax, q, meta)
        else:
            g = _sram(mem, c, v.src1, 2 * cols, np.int16)
            kwide.rmsnorm_quant(wide_in(v.src0, v.p2), g, v.p0, v.p1, q, meta)
        return np.concatenate([q.reshape(-1).view(np.uint8), meta.reshape(-1).view(np.uint8)])
    if f == VecFunc.ROW_AMAX:
        out = np.empty(r, np.int32)
        kwide.row_amax(i32(v.src0), out)
        return out
    if f in (VecFunc.SILU_MUL_WIDE, VecFunc.GELU_MUL_WIDE):
        out = np.empty((r, cols), np.int32)
        fn = kwide.silu_mul_wide if f == VecFunc.SILU_MUL_WIDE else kwide.gelu_mul_wide
        fn(i32(v.src0), i32(v.src1), v.p0, v.p1, v.p2, v.p3, out)
        return out
    if f == VecFunc.FROM_F32_WIDE:
        flat = np.empty(n, _wide_dtype(v.p2))
        kwide.from_f32_wide(_sram(mem, c, v.src0, 4 * n, np.uint32), v.p0, v.p1, v.p2, flat)
        return flat
    raise IsaError(f"vec: unknown function {v.func}")  # pragma: no cover


def _vec(v: Vec, mem: Memory) -> None:
    c = v.core
    r, cols = v.rows, v.cols
    n = r * cols
    f = VecFunc(v.func)
    if f >= VecFunc.ADD_WIDE:
        wide = np.ascontiguousarray(_vec_wide(v, mem, f))
        mem.write(Space.SRAM, c, v.dst, wide.reshape(-1).view(np.uint8))
        return
    out = np.empty((r, cols), np.int8)
    if f == VecFunc.COPY:
        out[:] = _sram(mem, c, v.src0, n).reshape(r, cols)
    elif f == VecFunc.ADD:
        a = _sram(mem, c, v.src0, n).reshape(r, cols)
        b = _sram(mem, c, v.src1, n).reshape(r, cols)
        kvec.add_rescale(a, b, v.p0, v.p1, v.p2, out)
    elif f == VecFunc.RMSNORM:
        x = _sram(mem, c, v.src0, n).reshape(r, cols)
        g = _sram(mem, c, v.src1, 2 * cols, np.int16)
        kvec.rmsnorm(x, g, v.p0, v.p1, out)
    elif f == VecFunc.LAYERNORM:
        x = _sram(mem, c, v.src0, n).reshape(r, cols)
        g = _sram(mem, c, v.src1, 2 * cols, np.int16)
        kvec.layernorm(x, g, v.p0, v.p1, out)
    elif f in (VecFunc.SILU_MUL, VecFunc.GELU_MUL):
        a = _sram(mem, c, v.src0, n).reshape(r, cols)
        b = _sram(mem, c, v.src1, n).reshape(r, cols)
        fn = kvec.silu_mul if f == VecFunc.SILU_MUL else kvec.gelu_mul
        fn(a, b, v.p0, v.p1, v.p2, v.p3, out)
    elif f == VecFunc.ROPE:
        half = v.p1 // 2
        x = _sram(mem, c, v.src0, n).reshape(r, cols)
        tab = _sram(mem, c, v.src1, 4 * r * half, np.int16)
        cos = tab[: r * half].reshape(r, half)
        sin = tab[r * half :].reshape(r, half)
        kvec.rope(x, cos, sin, v.p0, v.p1, out)
    elif f == VecFunc.SOFTMAX:
        x = _sram(mem, c, v.src0, n).reshape(r, cols)
        ksm.softmax_rows_i8(x, v.p0, v.p1, v.p2, out)
    elif f == VecFunc.REQUANT:
        x = _sram(mem, c, v.src0, 4 * n, np.int32).reshape(r, cols)
        kvec.requant_i32(x, v.p0, v.p1, out)
    elif f == VecFunc.FROM_F32:
        bits = _sram(mem, c, v.src0, 4 * n, np.uint32)
        flat = np.empty(n, np.int8)
        kvec.from_f32(bits, v.p0, v.p1, flat)
        out = flat.reshape(r, cols)
    elif f in MOE_FUNCS:
        moe_vec(v, mem)
        return
    else:  # pragma: no cover - the validator rejects unknown functions
        raise IsaError(f"vec: unknown function {v.func}")
    mem.write(Space.SRAM, c, v.dst, out.reshape(-1).view(np.uint8))


def execute_all(instrs, order, mem: Memory, formats: tuple[str, ...] = ()) -> None:
    """``execute(instrs[i], ...)`` for each ``i`` of ``order``, with BLAS on one thread
    once for all of them (:func:`isa.kernels.exact.blas_one_thread`)."""
    with blas_one_thread():
        for i in order:
            execute(instrs[i], mem, formats)


def execute(instr: Instruction, mem: Memory, formats: tuple[str, ...] = ()) -> None:
    """Apply ``instr``'s effect to ``mem``."""
    if isinstance(instr, Nop):
        return
    if isinstance(instr, DmaLoadIndexed):
        _copy(mem, Space.DRAM, Space.SRAM, instr, offset=_entry(mem, instr) * instr.stride)
    elif isinstance(instr, DmaLoad):
        _copy(mem, Space.DRAM, Space.SRAM, instr)
    elif isinstance(instr, DmaStore):
        _copy(mem, Space.SRAM, Space.DRAM, instr)
    elif isinstance(instr, DmaCopy):
        _copy(mem, Space.DRAM, Space.DRAM, instr)
    elif isinstance(instr, HostWrite):
        _copy(mem, Space.HOST, Space.DRAM, instr)
    elif isinstance(instr, HostRead):
        _copy(mem, Space.DRAM, Space.HOST, instr)
    elif isinstance(instr, Gemm):
        _gemm(instr, mem)
    elif isinstance(instr, Vec):
        _vec(instr, mem)
    elif isinstance(instr, KvWrite):
        kv_write(instr, mem, format_of(formats, instr.fmt))
    elif isinstance(instr, KvRead):
        kv_read(instr, mem, format_of(formats, instr.fmt))
    elif isinstance(instr, AttnDq):
        attn_dq(instr, mem, format_of(formats, instr.k_fmt), format_of(formats, instr.v_fmt))
    elif isinstance(instr, Attn):
        attn(instr, mem, format_of(formats, instr.k_fmt), format_of(formats, instr.v_fmt))
    else:
        raise IsaError(f"no semantics for {type(instr).__name__}")
