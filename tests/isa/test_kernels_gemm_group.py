"""K6: group-wise asymmetric 4-bit weights (``gemm.g``) against a numpy reference that
forms ``w = D*c + M`` explicitly and sums in Python integers; the row image layout; the
instruction's validation, work count and semantics."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from isa.errors import IsaError, ProgramError
from isa.instructions import NO_ADDR, Gemm, GemmGroup, MemoryLayout, Program, Space
from isa.kernels import gemm_group as kgg
from isa.semantics import execute
from isa.validate import validate_program

SETTINGS = settings(max_examples=100, deadline=None)


def ref_gemm_group(a, codes, d, mins, group, bias, mult, shift):
    """Exact reference: dequantized integer weights, Python-int sums, Fraction rounding."""
    n, k = codes.shape
    g_of = np.arange(k) // group
    w = d.astype(np.int64)[:, g_of] * codes.astype(np.int64) + mins.astype(np.int64)[:, g_of]
    out = []
    for arow in a:
        row = []
        for j in range(n):
            v = sum(int(x) * int(y) for x, y in zip(arow, w[j], strict=True))
            if bias is not None:
                v += int(bias[j])
            if mult is None:
                row.append(max(-(2**31), min(2**31 - 1, v)))
            else:
                r = math.floor(Fraction(v * int(mult[j]), 2**shift) + Fraction(1, 2))
                row.append(max(-128, min(127, r)))
        out.append(row)
    return np.array(out, np.int64)


@st.composite
def cases(draw):
    m = draw(st.integers(1, 3))
    group = draw(st.sampled_from([2, 4, 8, 32]))
    k = draw(st.integers(1, 80)) * 2
    n = draw(st.integers(1, 5))
    ng = kgg.group_count(k, group)
    extreme = draw(st.booleans())
    a = draw(hnp.arrays(np.int8, (m, k), elements=st.sampled_from([-128, 127]) if extreme
                        else st.integers(-128, 127)))
    codes = draw(hnp.arrays(np.uint8, (n, k), elements=st.integers(0, 15)))
    d = draw(hnp.arrays(np.uint8, (n, ng), elements=st.integers(0, 255)))
    mins = draw(hnp.arrays(np.int16, (n, ng), elements=st.integers(-(2**15), 2**15 - 1)))
    bias = draw(st.none() | hnp.arrays(np.int32, (n,), elements=st.integers(-(2**31),
                                                                             2**31 - 1)))
    mult = draw(st.none() | hnp.arrays(np.int32, (n,),
                                       elements=st.integers(0, kgg.MULT_LIMIT - 1)))
    shift = draw(st.integers(0, 40))
    return a, codes, d, mins, group, bias, mult, shift


@SETTINGS
@given(cases())
def test_gemm_group_is_bit_exact(case):
    a, codes, d, mins, group, bias, mult, shift = case
    k = codes.shape[1]
    rows = kgg.pack_group_rows(codes, d, mins)
    got = kgg.gemm_group(a, rows, k=k, group=group, bias=bias, mult=mult, shift=shift)
    assert got.dtype == (np.int8 if mult is not None else np.int32)
    np.testing.assert_array_equal(got.astype(np.int64),
                                  ref_gemm_group(a, codes, d, mins, group, bias, mult, shift))


@pytest.mark.parametrize("k", [kgg.INT32_DOT_MAX_K - 1, kgg.INT32_DOT_MAX_K,
                               kgg.INT32_DOT_MAX_K + 1])
@pytest.mark.parametrize("extreme", [True, False])
def test_accumulators_are_exact_on_both_sides_of_the_int32_dot_bound(k, extreme):
    """At ``INT32_DOT_MAX_K`` the one int32 dot per output reaches its largest magnitude
    without wrapping; one element more takes the per-group sums; an odd ``k`` below the
    bound ends on a half byte: all exact (the int64
    reference cannot overflow: ``|w| <= 255*15 + 2**15``, ``k * 128 * |w| < 2**35``)."""
    rng = np.random.default_rng(k)
    group, m, n = 32, 2, 3
    ng = kgg.group_count(k, group)
    if extreme:  # the largest |a * D c| everywhere, of either sign
        a = np.array([[-128] * k, [127] * k], np.int8)
        codes = np.full((n, k), 15, np.uint8)
        d = np.full((n, ng), 255, np.uint8)
        mins = np.array([[-(2**15)] * ng, [2**15 - 1] * ng, [0] * ng], np.int16)
    else:
        a = rng.integers(-128, 128, (m, k), dtype=np.int8)
        codes = rng.integers(0, 16, (n, k), dtype=np.uint8)
        d = rng.integers(0, 256, (n, ng), dtype=np.uint8)
        mins = rng.integers(-(2**15), 2**15, (n, ng), dtype=np.int16)
    g_of = np.arange(k) // group
    w = d.astype(np.int64)[:, g_of] * codes.astype(np.int64) + mins.astype(np.int64)[:, g_of]
    got = kgg.group_accumulate(a, kgg.pack_group_rows(codes, d, mins), k=k, group=group)
    np.testing.assert_array_equal(got, a.astype(np.int64) @ w.T)
    # the bound is tight: one element more could wrap the int32 dot
    assert 128 * 255 * 15 * kgg.INT32_DOT_MAX_K < 2**31 <= 128 * 255 * 15 * (
        kgg.INT32_DOT_MAX_K + 1)


@SETTINGS
@given(cases())
def test_row_image_round_trips(case):
    _, codes, d, mins, group, *_ = case
    k = codes.shape[1]
    rows = kgg.pack_group_rows(codes, d, mins)
    assert rows.shape == (codes.shape[0], kgg.group_row_bytes(k, group))
    c2, d2, m2 = kgg.unpack_group_rows(rows, k, group)
    np.testing.assert_array_equal(c2, codes)
    np.testing.assert_array_equal(d2, d)
    np.testing.assert_array_equal(m2, mins)


def test_row_image_layout_is_codes_then_minima_then_steps():
    codes = np.array([[1, 2, 3, 4]], np.uint8)
    rows = kgg.pack_group_rows(codes, np.array([[7, 9]], np.uint8),
                               np.array([[-2, 300]], np.int16))
    assert rows.tolist() == [[0x21, 0x43, 0xFE, 0xFF, 0x2C, 0x01, 7, 9]]


def test_group_bytes_and_extra_macs():
    # 576 = 18 groups of 32 (4.5 of 128: the last group of 128 is short)
    assert kgg.group_row_bytes(576, 32) == 288 + 3 * 18
    assert kgg.group_row_bytes(576, 128) == 288 + 3 * 5
    g = GemmGroup(m=2, k=576, n=64, w_bits=4, a=0, w=0, out=0, group=32)
    assert g.w_nbytes == 64 * 342
    assert g.macs == 2 * 576 * 64 + 2 * 2 * 64 * 18 + 2 * 576
    assert g.ops() == 2 * g.macs
    assert Gemm(m=2, k=576, n=64, w_bits=4, a=0, w=0, out=0).macs == 2 * 576 * 64


def test_multiplier_out_of_range_is_refused():
    rows = kgg.pack_group_rows(np.zeros((1, 4), np.uint8), np.ones((1, 1), np.uint8),
                               np.zeros((1, 1), np.int16))
    with pytest.raises(ValueError, match=r"2\*\*24"):
        kgg.gemm_group(np.zeros((1, 4), np.int8), rows, k=4, group=4,
                       mult=np.array([kgg.MULT_LIMIT], np.int32))


class _Mem:
    def __init__(self, n: int):
        self.sram = np.zeros(n, np.uint8)

    def read(self, space, core, addr, nbytes):
        assert space == Space.SRAM
        return self.sram[addr:addr + nbytes].copy()

    def write(self, space, core, addr, data):
        self.sram[addr:addr + data.size] = data.reshape(-1).view(np.uint8)


def test_instruction_semantics_match_the_kernel():
    rng = np.random.default_rng(3)
    m, k, n, group = 2, 64, 6, 32
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    codes = rng.integers(0, 16, (n, k), dtype=np.uint8)
    d = rng.integers(1, 256, (n, 2), dtype=np.uint8)
    mins = rng.integers(-3000, 3000, (n, 2), dtype=np.int16)
    rows = kgg.pack_group_rows(codes, d, mins)
    mult = rng.integers(0, 1 << 23, n, dtype=np.int32)
    mem = _Mem(8192)
    mem.write(Space.SRAM, 0, 0, a.view(np.uint8))
    mem.write(Space.SRAM, 0, 256, rows)
    mem.write(Space.SRAM, 0, 2048, mult.view(np.uint8))
    g = GemmGroup(m=m, k=k, n=n, w_bits=4, a=0, w=256, out=4096, scale=2048, shift=30,
                  group=group)
    execute(g, mem)
    got = mem.sram[4096:4096 + m * n].view(np.int8).reshape(m, n)
    np.testing.assert_array_equal(got, ref_gemm_group(a, codes, d, mins, group, None, mult,
                                                      30))
    big = GemmGroup(m=1, k=4, n=1, w_bits=4, a=0, w=256, out=4096, scale=2048, shift=0,
                    group=4)
    mem.write(Space.SRAM, 0, 2048, np.array([kgg.MULT_LIMIT], np.int32).view(np.uint8))
    with pytest.raises(IsaError, match="gemm.g"):
        execute(big, mem)


@pytest.mark.parametrize(("fields", "message"), [
    ({"w_bits": 8}, "w_bits must be 4"),
    ({"group": 0}, "even number >= 2"),
    ({"group": 31}, "even number >= 2"),
    ({"k": 40000, "group": 32}, "int64 group accumulator"),
])
def test_validator_refuses_bad_group_gemms(fields, message):
    base = {"m": 1, "k": 64, "n": 4, "w_bits": 4, "a": 0, "w": 1024, "out": 60000,
            "group": 32, "scale": NO_ADDR}
    layout = MemoryLayout(dram_bytes=1 << 20, sram_bytes=1 << 20, host_bytes=0, num_cores=1)
    validate_program(Program((GemmGroup(**base),)), layout)
    with pytest.raises(ProgramError, match=message):
        validate_program(Program((GemmGroup(**{**base, **fields}),)), layout)
