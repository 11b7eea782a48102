"""The wide pipeline's instructions: GemmRow and the wide Vec functions compute what their
kernels compute, price their extra work, declare the bytes they touch, and the validator
names what is wrong with them."""

from __future__ import annotations

import numpy as np
import pytest

from isa.errors import ProgramError
from isa.instructions import NO_ADDR, GemmRow, MemoryLayout, Program, Space, Vec, VecFunc
from isa.kernels import matrix as kmat
from isa.kernels import wide
from isa.semantics import execute
from isa.validate import validate_program
from isa.vecfuncs import ROW_META_BYTES

LAYOUT = MemoryLayout(dram_bytes=1 << 16, sram_bytes=1 << 16, host_bytes=1 << 12, num_cores=1)


class Mem:
    def __init__(self) -> None:
        self.sram = np.zeros(1 << 16, np.uint8)

    def read(self, space: Space, core: int, addr: int, nbytes: int) -> np.ndarray:
        assert space == Space.SRAM
        return self.sram[addr:addr + nbytes].copy()

    def write(self, space: Space, core: int, addr: int, data: np.ndarray) -> None:
        self.sram[addr:addr + data.size] = data.reshape(-1).view(np.uint8)

    def put(self, addr: int, arr: np.ndarray) -> None:
        self.write(Space.SRAM, 0, addr, np.ascontiguousarray(arr).view(np.uint8))

    def get(self, addr: int, n: int, dtype) -> np.ndarray:
        return self.sram[addr:addr + n * np.dtype(dtype).itemsize].view(dtype).copy()


def test_quant_row_then_gemm_row_is_the_kernels_chain() -> None:
    rng = np.random.default_rng(1)
    m, k, n = 3, 16, 8
    x = rng.integers(-(2**20), 2**20, (m, k)).astype(np.int32)
    w = rng.integers(-127, 128, (n, k)).astype(np.int8)
    mult = rng.integers(1, 2**30, n).astype(np.int32)
    mem = Mem()
    mem.put(0x0, x)
    mem.put(0x1000, w)
    mem.put(0x2000, mult)
    execute(Vec(func=VecFunc.QUANT_ROW, rows=m, cols=k, src0=0x0, dst=0x400), mem)
    q = np.empty((m, k), np.int8)
    meta = np.empty((m, 2), np.int32)
    wide.quant_row(x, q, meta)
    assert mem.get(0x400, m * k, np.int8).tolist() == q.reshape(-1).tolist()
    assert mem.get(0x400 + m * k, 2 * m, np.int32).tolist() == meta.reshape(-1).tolist()
    g = GemmRow(m=m, k=k, n=n, w_bits=8, a=0x400, w=0x1000, out=0x3000, scale=0x2000,
                shift=24, row_meta=0x400 + m * k, row_shift=22, out_bits=32)
    execute(g, mem)
    expect = np.empty((m, n), np.int32)
    wide.requant_rows(kmat.matmul(q, w, 8, k), np.zeros(0, np.int32), mult, 24, meta, 22, 32,
                      expect)
    assert mem.get(0x3000, m * n, np.int32).tolist() == expect.reshape(-1).tolist()
    # ops: the GEMM's MACs plus one multiply and shift per output element
    assert g.ops() == 2 * m * k * n + 2 * m * n
    roles = {a.role: a.nbytes for a in g.accesses()}
    assert roles["row_meta"] == ROW_META_BYTES * m and roles["out"] == 4 * m * n


def test_wide_norm_and_add_operand_sizes() -> None:
    v = Vec(func=VecFunc.RMSNORM_WIDE, rows=2, cols=8, src0=0, src1=0x100, dst=0x200, p2=16)
    assert [(a.role, a.nbytes) for a in v.accesses()] == [
        ("src0", 32), ("src1", 16), ("dst", 64)]
    a = Vec(func=VecFunc.ADD_WIDE, rows=2, cols=8, src0=0, src1=0x100, dst=0x200, p2=32)
    assert [(x.role, x.nbytes) for x in a.accesses()] == [
        ("src0", 64), ("src1", 64), ("dst", 64)]
    q = Vec(func=VecFunc.QUANT_ROW, rows=2, cols=8, src0=0, dst=0x200)
    assert q.accesses()[-1].nbytes == 16 + 2 * ROW_META_BYTES


def test_wide_add_executes_the_kernel() -> None:
    r = np.array([[1000, -2000, 32767]], np.int16)
    d = np.array([[5, 7, 100]], np.int32)
    mem = Mem()
    mem.put(0, r)
    mem.put(0x100, d)
    execute(Vec(func=VecFunc.ADD_WIDE, rows=1, cols=3, src0=0, src1=0x100, dst=0x200,
                p0=1 << 29, p1=30, p2=16), mem)
    assert mem.get(0x200, 3, np.int16).tolist() == [505, -993, 16484]


@pytest.mark.parametrize(("ins", "reason"), [
    (GemmRow(m=1, k=8, n=8, w_bits=8, a=0, w=0x100, out=0x200, scale=NO_ADDR),
     "gemm.row needs scale"),
    (GemmRow(m=1, k=8, n=8, w_bits=8, a=0, w=0x100, out=0x200, scale=0x300, out_bits=16),
     "out_bits must be 8 or 32, got 16"),
    (GemmRow(m=1, k=8, n=8, w_bits=8, a=0, w=0x100, out=0x200, scale=0x300,
             row_meta=0x400, row_shift=5), "row_shift must be >= 17"),
    (Vec(func=VecFunc.ADD_WIDE, rows=1, cols=8, src0=0, src1=0x100, dst=0x200, p2=8),
     "ADD_WIDE: p2 (the wide operand's bits) must be one of (16, 32), got 8"),
])
def test_validator_names_the_fault(ins, reason: str) -> None:
    with pytest.raises(ProgramError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        validate_program(Program(instructions=(ins,)), LAYOUT)


def test_wide_layernorm_executes_the_kernel_and_sizes_its_operands() -> None:
    v = Vec(func=VecFunc.LAYERNORM_WIDE, rows=1, cols=4, src0=0, src1=0x100, dst=0x200,
            p0=0, p1=20, p2=16)
    assert [(a.role, a.nbytes) for a in v.accesses()] == [
        ("src0", 8), ("src1", 8), ("dst", 16)]
    assert v.ops() == 4 * 10  # RMSNORM_WIDE's 8 per element, + the row sum and the mean
    x = np.array([[1000, -2000, 3000, 30000]], np.int16)
    g = np.full(4, 16384, np.int16)
    mem = Mem()
    mem.put(0, x)
    mem.put(0x100, g)
    execute(v, mem)
    expect = np.empty((1, 4), np.int32)
    wide.layernorm_wide(x, g, 0, 20, 0, expect)
    assert mem.get(0x200, 4, np.int32).tolist() == expect[0].tolist()
    assert abs(int(expect[0].sum())) <= 4  # mean-free


def test_wide_quant_row_reads_an_int16_operand() -> None:
    v = Vec(func=VecFunc.QUANT_ROW_WIDE, rows=2, cols=4, src0=0, dst=0x200, p2=16)
    assert [(a.role, a.nbytes) for a in v.accesses()] == [
        ("src0", 16), ("dst", 8 + 2 * ROW_META_BYTES)]
    x = np.array([[1000, -2000, 3000, 30000], [1, 2, -3, 0]], np.int16)
    mem = Mem()
    mem.put(0, x)
    execute(v, mem)
    q = np.empty((2, 4), np.int8)
    meta = np.empty((2, 2), np.int32)
    wide.quant_row(x, q, meta)
    assert mem.get(0x200, 8, np.int8).tolist() == q.reshape(-1).tolist()
    assert mem.get(0x208, 4, np.int32).tolist() == meta.reshape(-1).tolist()
