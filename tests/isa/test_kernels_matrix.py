"""GEMV/GEMM int8 x int8|int4 -> int32 and the requantizing epilogue, against Python-int
references (exact sums, explicit int32 wrap-around)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from isa.kernels import matrix

SETTINGS = settings(max_examples=100, deadline=None)
I8 = st.integers(-128, 127)
I32 = st.integers(-(2**31), 2**31 - 1)


def wrap32(v: int) -> int:
    return (v + 2**31) % 2**32 - 2**31


def ref_unpack_int4_row(row: list[int], k: int) -> list[int]:
    vals = []
    for b in row:
        for nib in (b & 15, b >> 4):
            vals.append(nib - 16 if nib >= 8 else nib)
    return vals[:k]


def ref_matmul(a: np.ndarray, w: list[list[int]]) -> list[list[int]]:
    return [[wrap32(sum(int(x) * int(y) for x, y in zip(arow, wrow, strict=True)))
             for wrow in w] for arow in a]


def ref_requant(v: int, mult: int, shift: int) -> int:
    r = math.floor(Fraction(v * mult, 2**shift) + Fraction(1, 2))
    return max(-128, min(127, r))


@st.composite
def gemm_cases(draw, bits: int):
    m = draw(st.integers(1, 4))
    k = draw(st.integers(1, 70))
    n = draw(st.integers(1, 6))
    extreme = draw(st.booleans())
    elems = st.sampled_from([-128, 127]) if extreme else I8
    a = draw(hnp.arrays(np.int8, (m, k), elements=elems))
    if bits == 8:
        w = draw(hnp.arrays(np.int8, (n, k), elements=elems))
    else:
        w = draw(hnp.arrays(np.uint8, (n, (k + 1) // 2), elements=st.integers(0, 255)))
    return a, w, k


@SETTINGS
@given(gemm_cases(8))
def test_gemm_i8(case) -> None:
    a, w, k = case
    expected = ref_matmul(a, w.tolist())
    out = np.zeros((a.shape[0], w.shape[0]), np.int32)
    matrix.gemm_i8(a, w, out)
    assert out.tolist() == expected
    out[:] = 0
    matrix.gemm_i8_par(a, w, out, 3)
    assert out.tolist() == expected


@SETTINGS
@given(gemm_cases(4))
def test_gemm_i4(case) -> None:
    a, w, k = case
    wv = [ref_unpack_int4_row(r, k) for r in w.tolist()]  # odd k: last high nibble ignored
    expected = ref_matmul(a, wv)
    out = np.zeros((a.shape[0], w.shape[0]), np.int32)
    matrix.gemm_i4(a, w.view(np.int8), out)
    assert out.tolist() == expected
    out[:] = 0
    matrix.gemm_i4_par(a, w.view(np.int8), out, 2)
    assert out.tolist() == expected
    assert matrix.matmul(a, w, 4, k).tolist() == expected


def test_int32_accumulator_wraps() -> None:
    k = 2**17 + 5  # 2**17 * 2**14 = 2**31: one past int32
    a = np.full((1, k), -128, np.int8)
    w = np.full((1, k), -128, np.int8)
    out = np.zeros((1, 1), np.int32)
    matrix.gemm_i8(a, w, out)
    assert out[0, 0] == wrap32(k * 16384)


@SETTINGS
@given(st.data())
def test_requant_channels(data) -> None:
    m = data.draw(st.integers(1, 3))
    n = data.draw(st.integers(1, 5))
    acc = data.draw(hnp.arrays(np.int32, (m, n), elements=I32))
    bias = data.draw(hnp.arrays(np.int32, (n,), elements=I32))
    mult = data.draw(hnp.arrays(np.int32, (n,), elements=I32))
    shift = data.draw(st.integers(0, 70))
    use_bias = data.draw(st.booleans())
    out = np.zeros((m, n), np.int8)
    matrix.requant_channels(acc, bias if use_bias else np.zeros(0, np.int32), mult, shift, out)
    for i in range(m):
        for j in range(n):
            v = int(acc[i, j]) + (int(bias[j]) if use_bias else 0)
            v = wrap32(v)
            expected = ref_requant(v, int(mult[j]), shift) if shift <= 62 else 0
            assert out[i, j] == expected


def test_requant_rounds_half_up() -> None:
    acc = np.array([[-3, -1, 1, 3, 5]], np.int32)
    out = np.zeros((1, 5), np.int8)
    matrix.requant_channels(acc, np.zeros(0, np.int32), np.ones(5, np.int32), 1, out)
    assert out.tolist() == [[-1, 0, 1, 2, 3]]


@SETTINGS
@given(gemm_cases(8), st.integers(0, 40), st.booleans())
def test_gemm_wrapper(case, shift: int, requant: bool) -> None:
    a, w, k = case
    n = w.shape[0]
    rng = np.random.default_rng(shift)
    bias = rng.integers(-(2**20), 2**20, n).astype(np.int32)
    mult = rng.integers(1, 2**16, n).astype(np.int32)
    acc = ref_matmul(a, w.tolist())
    if requant:
        got = matrix.gemm(a, w, w_bits=8, k=k, bias=bias, mult=mult, shift=shift)
        assert got.dtype == np.int8
        for i in range(a.shape[0]):
            for j in range(n):
                assert got[i, j] == ref_requant(wrap32(acc[i][j] + int(bias[j])),
                                                int(mult[j]), shift)
    else:
        got = matrix.gemm(a, w, w_bits=8, k=k, bias=bias)
        assert got.dtype == np.int32
        assert got.tolist() == [[wrap32(acc[i][j] + int(bias[j])) for j in range(n)]
                                for i in range(a.shape[0])]


def test_large_gemv_parallel_equals_serial() -> None:
    rng = np.random.default_rng(0)
    k, n = 1536, 1024  # 1.5 MiB of int8 weights: takes the threaded path
    x = rng.integers(-128, 128, (1, k), dtype=np.int8)
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    ref = (w.astype(np.int64) @ x[0].astype(np.int64)).astype(np.int32)
    assert np.array_equal(matrix.matmul(x, w, 8, k)[0], ref)
    w4 = rng.integers(0, 256, (n, k), dtype=np.uint8)  # k = 2 * 1536 int4 weights
    lo = (w4 & 15).astype(np.int64)
    hi = (w4 >> 4).astype(np.int64)
    lo[lo >= 8] -= 16
    hi[hi >= 8] -= 16
    x2 = rng.integers(-128, 128, (1, 2 * k), dtype=np.int8)
    ref4 = lo @ x2[0, 0::2].astype(np.int64) + hi @ x2[0, 1::2].astype(np.int64)
    assert np.array_equal(matrix.matmul(x2, w4, 4, 2 * k)[0], ref4.astype(np.int32))


@settings(max_examples=40, deadline=None)
@given(st.integers(matrix.BLAS_MIN_ROWS, 70), st.integers(1, 2600), st.integers(1, 5),
       st.sampled_from(["random", "-128", "127", "mixed"]), st.integers(0, 2**32 - 1))
def test_int8_gemm_on_float_blas_is_the_integer_kernel(m, k, n, kind, seed) -> None:
    """Prefill-sized GEMMs take float32 BLAS (:func:`matrix.matmul_blas`); the int32 must be
    the integer kernel's bit for bit, also where a whole row's sum leaves float32's exact
    range (``k * 2**14 > 2**24``: summed in chunks)."""
    rng = np.random.default_rng(seed)
    if kind == "random":
        a = rng.integers(-128, 128, (m, k), dtype=np.int8)
        w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    elif kind == "mixed":
        a = rng.choice(np.array([-128, 127], np.int8), (m, k))
        w = rng.choice(np.array([-128, 127], np.int8), (n, k))
    else:
        a = np.full((m, k), int(kind), np.int8)
        w = np.full((n, k), int(kind), np.int8)
    want = np.zeros((m, n), np.int32)
    matrix.gemm_i8(a, w, want)
    assert np.array_equal(matrix.matmul(a, w, 8, k), want)


def test_a_row_sum_past_float32_exactness_stays_exact() -> None:
    # 1,535 products of 127 x 127: 24,758,015, odd and above 2**24, so one float32 sum
    # could not hold it; the chunked sums do
    k = 1535
    a = np.full((matrix.BLAS_MIN_ROWS, k), 127, np.int8)
    w = np.full((3, k), 127, np.int8)
    assert k * 127 * 127 == 24_758_015 > 2**24
    assert (matrix.matmul(a, w, 8, k) == 24_758_015).all()
    assert matrix.BLAS_K_CHUNK * 128 * 128 < 2**24


def test_wrapper_rejects_bad_shapes() -> None:
    a = np.zeros((1, 4), np.int8)
    with pytest.raises(ValueError):
        matrix.matmul(a, np.zeros((2, 3), np.int8), 8, 4)
    with pytest.raises(ValueError):
        matrix.matmul(a, np.zeros((2, 3), np.uint8), 4, 4)
    with pytest.raises(ValueError):
        matrix.matmul(a, np.zeros((2, 4), np.int8), 2, 4)
