"""``gemm.gr`` (GemmRowGroup): group-wise 4-bit weights under GemmRow's per-row epilogue,
against a Python-int reference; its encoding, validation and work count."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isa.encoding import decode_program, encode_program
from isa.errors import IsaError, ProgramError
from isa.instructions import NO_ADDR, GemmGroup, GemmRow, GemmRowGroup, MemoryLayout, Program
from isa.kernels.gemm_group import group_count, pack_group_rows
from isa.semantics import execute
from isa.validate import validate_program
from tests.isa.test_kernels_wide import rs, sat
from tests.isa.test_wide_instructions import Mem

LAYOUT = MemoryLayout(dram_bytes=1 << 16, sram_bytes=1 << 16, host_bytes=1 << 12, num_cores=1)
A, W, SCALE, BIAS, META, OUT = 0x0, 0x1000, 0x4000, 0x4800, 0x5000, 0x6000


def _case(rng: np.random.Generator, m: int, k: int, n: int, group: int):
    a = rng.integers(-128, 128, (m, k)).astype(np.int8)
    codes = rng.integers(0, 16, (n, k)).astype(np.uint8)
    ng = group_count(k, group)
    d = rng.integers(1, 256, (n, ng)).astype(np.uint8)
    mins = rng.integers(-(2**15), 2**15, (n, ng)).astype(np.int16)
    return a, codes, d, mins


def _ref(a, codes, d, mins, group, mult, shift, bias, meta, row_shift, out_bits):
    m, k = a.shape
    n = codes.shape[0]
    out = []
    for i in range(m):
        row = []
        for j in range(n):
            acc = sum(int(a[i, c]) * (int(d[j, c // group]) * int(codes[j, c])
                                      + int(mins[j, c // group])) for c in range(k))
            b = 0 if bias is None else int(bias[j])
            if meta is None:
                t = sat(rs((acc + b) * int(mult[j]), shift), 32)
            else:
                t = sat(rs(acc * int(mult[j]), shift), 32)
                t = rs(t * int(meta[i, 0]), row_shift - int(meta[i, 1])) + b
            row.append(sat(t, out_bits))
        out.append(row)
    return out


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), m=st.integers(1, 3), k=st.sampled_from([8, 30, 64, 70]),
       n=st.integers(1, 5), group=st.sampled_from([2, 8, 32]), rowed=st.booleans(),
       with_bias=st.booleans(), out_bits=st.sampled_from([8, 32]))
def test_gemm_gr_is_the_group_accumulator_through_the_row_epilogue(
        seed, m, k, n, group, rowed, with_bias, out_bits) -> None:
    rng = np.random.default_rng(seed)
    a, codes, d, mins = _case(rng, m, k, n, group)
    mult = rng.integers(0, 2**24, n).astype(np.int32)
    bias = rng.integers(-(2**31), 2**31, n).astype(np.int32) if with_bias else None
    meta = None
    if rowed:
        meta = np.stack([rng.integers(1, 2**31, m), rng.integers(0, 18, m)], 1).astype(np.int32)
    shift, row_shift = int(rng.integers(20, 40)), 40
    mem = Mem()
    mem.put(A, a)
    mem.put(W, pack_group_rows(codes, d, mins))
    mem.put(SCALE, mult)
    if bias is not None:
        mem.put(BIAS, bias)
    if meta is not None:
        mem.put(META, meta)
    g = GemmRowGroup(m=m, k=k, n=n, w_bits=4, group=group, a=A, w=W, out=OUT, scale=SCALE,
                     bias=BIAS if with_bias else NO_ADDR, shift=shift,
                     row_meta=META if rowed else NO_ADDR, row_shift=row_shift,
                     out_bits=out_bits)
    validate_program(Program(instructions=(g,)), LAYOUT)
    execute(g, mem)
    got = mem.get(OUT, m * n, np.int8 if out_bits == 8 else np.int32).reshape(m, n)
    assert got.tolist() == _ref(a, codes, d, mins, group, mult, shift, bias, meta, row_shift,
                                out_bits)


def test_gemm_gr_encodes_and_counts_both_variants_work() -> None:
    g = GemmRowGroup(m=2, k=96, n=40, w_bits=4, group=32, a=0, w=0x100, out=0x200,
                     scale=0x300, shift=7, row_meta=0x400, row_shift=20, out_bits=32)
    prog = Program(instructions=(g,))
    assert decode_program(encode_program(prog)).instructions == (g,)
    assert g.mnemonic == "gemm.gr" and isinstance(g, GemmRow) and isinstance(g, GemmGroup)
    # weight bytes and MACs of gemm.g, plus gemm.row's multiply and shift per output
    plain = GemmGroup(m=2, k=96, n=40, w_bits=4, group=32, a=0, w=0x100, out=0x200)
    assert g.w_nbytes == plain.w_nbytes == 40 * (48 + 3 * 3)
    assert g.macs == plain.macs and g.ops() == 2 * plain.macs + 2 * 2 * 40
    roles = {x.role: x.nbytes for x in g.accesses()}
    assert roles["w"] == g.w_nbytes and roles["out"] == 4 * 2 * 40 and roles["row_meta"] == 16


@pytest.mark.parametrize(("fields", "reason"), [
    ({"scale": NO_ADDR}, "gemm.row needs scale"),
    ({"group": 3}, "group 3: weight groups must hold an even number"),
    ({"w_bits": 8}, "w_bits must be 4, got 8"),
    ({"row_shift": 5}, "row_shift must be >= 17"),
])
def test_validator_names_the_fault_of_gemm_gr(fields, reason: str) -> None:
    base = dict(m=1, k=8, n=8, w_bits=4, group=8, a=0, w=0x100, out=0x200, scale=0x300,
                row_meta=0x400, row_shift=20)
    with pytest.raises(ProgramError, match=reason):
        validate_program(Program(instructions=(GemmRowGroup(**{**base, **fields}),)), LAYOUT)


def test_gemm_gr_refuses_multipliers_past_24_bits() -> None:
    mem = Mem()
    mem.put(SCALE, np.full(4, 2**24, np.int32))
    g = GemmRowGroup(m=1, k=8, n=4, w_bits=4, group=8, a=A, w=W, out=OUT, scale=SCALE)
    with pytest.raises(IsaError, match=r"gemm.gr: multipliers must lie in \[0, 2\*\*24\)"):
        execute(g, mem)
