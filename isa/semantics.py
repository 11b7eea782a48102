"""Functional semantics of each instruction: what it computes, never how long it takes.

``execute(instr, mem, formats)`` reads its operands from ``mem`` (any object with the
:class:`Memory` interface: byte reads and writes per address space), computes, and writes
its results back. The device calls it when the instruction completes.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from .errors import IsaError
from .instructions import (
    NO_ADDR,
    Attn,
    DmaCopy,
    DmaLoad,
    DmaStore,
    Gemm,
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


class Memory(Protocol):
    def read(self, space: Space, core: int, addr: int, nbytes: int) -> np.ndarray: ...

    def write(self, space: Space, core: int, addr: int, data: np.ndarray) -> None: ...


def _copy(mem: Memory, src_space: Space, dst_space: Space, instr) -> None:
    rows = getattr(instr, "rows", 1)
    n = instr.nbytes
    s_step = getattr(instr, "src_stride", 0) or n
    d_step = getattr(instr, "dst_stride", 0) or n
    if rows == 1 or (s_step == n and d_step == n):
        mem.write(dst_space, instr.core, instr.dst,
                  mem.read(src_space, instr.core, instr.src, n * rows))
        return
    for r in range(rows):
        data = mem.read(src_space, instr.core, instr.src + r * s_step, n)
        mem.write(dst_space, instr.core, instr.dst + r * d_step, data)


def requantize(acc: np.ndarray, mult: np.ndarray | int, shift: int) -> np.ndarray:
    """int32 -> int8: ``(acc * mult + 2**(shift-1)) >> shift`` (round half up), saturated."""
    v = acc.astype(np.int64) * np.asarray(mult, dtype=np.int64)
    if shift > 0:
        v = (v + (1 << (shift - 1))) >> shift
    return np.clip(v, -128, 127).astype(np.int8)


def unpack_int4(packed: np.ndarray, n: int, k: int) -> np.ndarray:
    """Packed int4 rows (element 2i in the low nibble) -> int8 array (n, k)."""
    b = packed.reshape(n, (k + 1) // 2)
    lo = (b & 0x0F).astype(np.int8)
    hi = (b >> 4).astype(np.int8)
    lo = np.where(lo > 7, lo - 16, lo)
    hi = np.where(hi > 7, hi - 16, hi)
    out = np.empty((n, 2 * b.shape[1]), dtype=np.int8)
    out[:, 0::2] = lo
    out[:, 1::2] = hi
    return out[:, :k]


def _gemm(g: Gemm, mem: Memory) -> None:
    c = g.core
    a = mem.read(Space.SRAM, c, g.a, g.m * g.k).view(np.int8).reshape(g.m, g.k)
    wbytes = mem.read(Space.SRAM, c, g.w, g.w_nbytes)
    if g.w_bits == 8:
        w = wbytes.view(np.int8).reshape(g.n, g.k)
    elif g.w_bits == 4:
        w = unpack_int4(wbytes, g.n, g.k)
    else:
        raise IsaError(f"gemm: w_bits {g.w_bits} is not supported")
    acc = a.astype(np.int32) @ w.astype(np.int32).T
    if g.bias != NO_ADDR:
        acc += mem.read(Space.SRAM, c, g.bias, 4 * g.n).view(np.int32)
    if g.scale == NO_ADDR:
        out = acc.astype(np.int32)
    else:
        mult = mem.read(Space.SRAM, c, g.scale, 4 * g.n).view(np.int32)
        out = requantize(acc, mult, g.shift)
    row = g.n * g.out_bytes_per_element
    step = g.out_stride or row
    flat = np.ascontiguousarray(out).reshape(g.m, -1).view(np.uint8)
    if step == row:
        mem.write(Space.SRAM, c, g.out, flat.reshape(-1))
    else:
        for i in range(g.m):
            mem.write(Space.SRAM, c, g.out + i * step, flat[i])


def _vec(v: Vec, mem: Memory) -> None:
    c = v.core
    n = v.elements
    f = VecFunc(v.func)
    if f == VecFunc.COPY:
        mem.write(Space.SRAM, c, v.dst, mem.read(Space.SRAM, c, v.src0, n))
    elif f == VecFunc.ADD:
        x = mem.read(Space.SRAM, c, v.src0, n).view(np.int8).astype(np.int64)
        y = mem.read(Space.SRAM, c, v.src1, n).view(np.int8).astype(np.int64)
        out = requantize(x * v.p0 + y * v.p1, 1, v.p2)
        mem.write(Space.SRAM, c, v.dst, out.view(np.uint8))
    elif f == VecFunc.REQUANT:
        acc = mem.read(Space.SRAM, c, v.src0, 4 * n).view(np.int32)
        mem.write(Space.SRAM, c, v.dst, requantize(acc, v.p0, v.p1).view(np.uint8))
    else:
        raise IsaError(f"vec: function {f.name.lower()} has no semantics in this build")


def execute(instr: Instruction, mem: Memory, formats: tuple[str, ...] = ()) -> None:
    """Apply ``instr``'s effect to ``mem``."""
    if isinstance(instr, Nop):
        return
    if isinstance(instr, DmaLoad):
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
    elif isinstance(instr, (KvWrite, KvRead)):
        raise IsaError(f"{instr.mnemonic} has no semantics in this build")
    elif isinstance(instr, Attn):
        raise IsaError("attn has no semantics in this build")
    else:
        raise IsaError(f"no semantics for {type(instr).__name__}")
