"""Functional semantics of the MoE vector functions (``isa.semantics`` dispatches them
here): TOPK_GATE, GATE_ACC and SIGMOID, their operands as ``isa.semantics`` documents."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .instructions import Space, Vec, VecFunc
from .kernels import moe as kmoe
from .vecfuncs import GATE_ACCUMULATE, gate_stride

if TYPE_CHECKING:
    from .semantics import Memory

#: The vector functions :func:`moe_vec` computes.
MOE_FUNCS = (VecFunc.TOPK_GATE, VecFunc.GATE_ACC, VecFunc.SIGMOID)


def _read(mem: Memory, core: int, addr: int, nbytes: int, dtype) -> np.ndarray:
    return mem.read(Space.SRAM, core, addr, nbytes).view(dtype)


def moe_vec(v: Vec, mem: Memory) -> None:
    """Apply the MoE vector function ``v`` to the SRAM of its core."""
    c, r, cols = v.core, v.rows, v.cols
    n = r * cols
    f = VecFunc(v.func)
    if f == VecFunc.TOPK_GATE:
        x = _read(mem, c, v.src0, n, np.int8).reshape(r, cols)
        out = np.empty((r, 2 * v.p2), np.int32)
        kmoe.topk_gate_rows(x, v.p0, v.p1, v.p2, v.p3, out)
    elif f == VecFunc.SIGMOID:
        x = _read(mem, c, v.src0, n, np.int8).reshape(r, cols)
        out = np.empty((r, cols), np.int32)
        kmoe.sigmoid_rows(x, v.p0, v.p1, out)
    elif f == VecFunc.GATE_ACC:
        # int32 rows at src0 times each row's int32 gate (at src1, p1 apart) into (or
        # onto, p2 & 1) the int32 rows at dst
        y = _read(mem, c, v.src0, 4 * n, np.int32).reshape(r, cols)
        step = gate_stride(v.p1)
        raw = mem.read(Space.SRAM, c, v.src1, step * (r - 1) + 4) if r else np.zeros(0,
                                                                                   np.uint8)
        gates = np.array([int.from_bytes(raw[i * step:i * step + 4].tobytes(), "little",
                                         signed=True) for i in range(r)], np.int32)
        acc = v.p2 & GATE_ACCUMULATE
        out = (_read(mem, c, v.dst, 4 * n, np.int32).reshape(r, cols).copy() if acc
               else np.zeros((r, cols), np.int32))
        kmoe.gate_acc_rows(y, gates, v.p0, bool(acc), out)
    else:
        raise ValueError(f"moe_vec: {f.name} is not a MoE vector function")
    mem.write(Space.SRAM, c, v.dst, np.ascontiguousarray(out).reshape(-1).view(np.uint8))
