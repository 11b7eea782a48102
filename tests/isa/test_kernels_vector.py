"""Vector kernels against Python-int references written from their documented formulas."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from isa.kernels import vector as vk
from tests.isa.test_kernels_softmax import ref_isigmoid

SETTINGS = settings(max_examples=150, deadline=None)
I8 = st.integers(-128, 127)


def rs(v: int, s: int) -> int:
    """round half up of v / 2**s (0 past 62 bits, as the kernels define)."""
    if s > 62:
        return 0
    return (v + (1 << (s - 1))) >> s if s > 0 else v


def sat8(v: int) -> int:
    return max(-128, min(127, v))


@st.composite
def mats(draw, max_rows=3, max_cols=40):
    r = draw(st.integers(1, max_rows))
    c = draw(st.integers(1, max_cols))
    extreme = draw(st.booleans())
    el = st.sampled_from([-128, 127, 0]) if extreme else I8
    return draw(hnp.arrays(np.int8, (r, c), elements=el))


@SETTINGS
@given(st.data())
def test_requant_i32(data) -> None:
    x = data.draw(hnp.arrays(np.int32, (2, 7), elements=st.integers(-(2**31), 2**31 - 1)))
    mult = data.draw(st.integers(-(2**31), 2**31 - 1))
    shift = data.draw(st.integers(0, 70))
    out = np.zeros((2, 7), np.int8)
    vk.requant_i32(x, mult, shift, out)
    assert out.tolist() == [[sat8(rs(int(v) * mult, shift)) for v in row] for row in x]


@SETTINGS
@given(mats(), st.integers(-(2**31), 2**31 - 1), st.integers(-(2**31), 2**31 - 1),
       st.integers(0, 62), st.data())
def test_add_rescale(a, ma, mb, shift, data) -> None:
    b = data.draw(hnp.arrays(np.int8, a.shape, elements=I8))
    out = np.zeros(a.shape, np.int8)
    vk.add_rescale(a, b, ma, mb, shift, out)
    expected = [[sat8(rs(int(x) * ma + int(y) * mb, shift)) for x, y in zip(ra, rb, strict=True)]
                for ra, rb in zip(a, b, strict=True)]
    assert out.tolist() == expected


@SETTINGS
@given(mats(), st.integers(0, 2**31 - 1), st.integers(0, 50), st.data())
def test_rmsnorm(x, eps_q, shift, data) -> None:
    g = data.draw(hnp.arrays(np.int16, x.shape[1], elements=st.integers(-(2**15), 2**15 - 1)))
    out = np.zeros(x.shape, np.int8)
    vk.rmsnorm(x, g, eps_q, shift, out)
    for i, row in enumerate(x.tolist()):
        ms = sum(v * v for v in row) * 2**16 // len(row) + eps_q
        r = max(1, math.isqrt(ms))
        inv = 2**31 // r
        expected = [sat8(rs(v * int(gj) * inv, shift)) for v, gj in zip(row, g, strict=True)]
        assert out[i].tolist() == expected


def test_rmsnorm_is_close_to_float() -> None:
    rng = np.random.default_rng(0)
    x = rng.integers(-100, 100, (4, 896), dtype=np.int8)
    g = np.full(896, 64, np.int16)  # gamma 1.0 with scale 1/64
    out = np.zeros_like(x)
    # out ~= x / rms * 64 * 2**(23 - shift); shift 23 + 6 - 5 -> out ~= 32 * x / rms
    vk.rmsnorm(x, g, 0, 24, out)
    xf = x.astype(np.float64)
    ref = 32 * xf / np.sqrt((xf**2).mean(axis=1, keepdims=True))
    assert np.abs(out - np.clip(np.round(ref), -128, 127)).max() <= 1


@SETTINGS
@given(mats(), st.integers(0, 2**27 - 1), st.integers(0, 50), st.data())
def test_layernorm(x, eps_q, shift, data) -> None:
    g = data.draw(hnp.arrays(np.int16, x.shape[1], elements=st.integers(-(2**15), 2**15 - 1)))
    out = np.zeros(x.shape, np.int8)
    vk.layernorm(x, g, eps_q, shift, out)
    for i, row in enumerate(x.tolist()):
        c = len(row)
        mean = (sum(row) * 8 + c) // (2 * c)  # rs(sum * 4 / c): round half up
        xc = [4 * v - mean for v in row]
        ms = sum(v * v for v in xc) * 2**16 // c + 16 * eps_q
        inv = 2**31 // max(1, math.isqrt(ms))
        expected = [sat8(rs(v * int(gj) * inv, shift)) for v, gj in zip(xc, g, strict=True)]
        assert out[i].tolist() == expected


def test_layernorm_is_close_to_float() -> None:
    rng = np.random.default_rng(0)
    x = (rng.integers(-60, 60, (4, 512)) + 40).astype(np.int8)  # rows with a mean of ~40
    g = np.full(512, 64, np.int16)
    out = np.zeros_like(x)
    vk.layernorm(x, g, 0, 24, out)  # out ~= 32 * (x - mean) / std, as for RMSNorm
    xf = x.astype(np.float64)
    xc = xf - xf.mean(axis=1, keepdims=True)
    ref = 32 * xc / np.sqrt((xc**2).mean(axis=1, keepdims=True))
    assert np.abs(out - np.clip(np.round(ref), -128, 127)).max() <= 1


@SETTINGS
@given(mats(), st.data())
def test_silu_mul(a, data) -> None:
    b = data.draw(hnp.arrays(np.int8, a.shape, elements=I8))
    in_mult = data.draw(st.integers(-(2**31), 2**31 - 1))
    in_shift = data.draw(st.integers(0, 40))
    out_mult = data.draw(st.integers(-(2**24) + 1, 2**24 - 1))
    out_shift = data.draw(st.integers(0, 62))
    out = np.zeros(a.shape, np.int8)
    vk.silu_mul(a, b, in_mult, in_shift, out_mult, out_shift, out)
    for i in range(a.shape[0]):
        for j in range(a.shape[1]):
            xa = max(-(2**30), min(2**30, rs(int(a[i, j]) * in_mult, in_shift)))
            s = rs(xa * ref_isigmoid(xa), 20)
            assert out[i, j] == sat8(rs(s * int(b[i, j]) * out_mult, out_shift))


def test_silu_is_close_to_float() -> None:
    a = np.arange(-128, 128, dtype=np.int8).reshape(1, -1)
    b = np.ones_like(a)
    out = np.zeros_like(a)
    # a in units of 1/16: in_mult = 2**20 / 16; output in units of 1/16 (x 16 / 2**20)
    vk.silu_mul(a, b, 2**16, 0, 1, 16, out)
    x = a[0] / 16
    ref = np.clip(np.round(x / (1 + np.exp(-x)) * 16), -128, 127)
    assert np.abs(out[0] - ref).max() <= 1


def ref_gelu_gate(xa: int) -> int:
    """GELU's gate in Q20 (:func:`isa.kernels.vector.igelu_gate`), in Python integers."""
    xc = max(-(8 << 20), min(8 << 20, xa))
    t = 2**20 + rs(rs(xc * xc, 20) * vk.GELU_CUBIC, 20)
    return ref_isigmoid(rs(rs(xc * t, 20) * vk.GELU_C, 20))


def test_the_gelu_constants_are_the_tanh_forms():
    assert vk.GELU_C == round(2 * math.sqrt(2 / math.pi) * 2**20)
    assert vk.GELU_CUBIC == round(0.044715 * 2**20)


@SETTINGS
@given(mats(), st.data())
def test_gelu_mul(a, data) -> None:
    b = data.draw(hnp.arrays(np.int8, a.shape, elements=I8))
    in_mult = data.draw(st.integers(-(2**31), 2**31 - 1))
    in_shift = data.draw(st.integers(0, 40))
    out_mult = data.draw(st.integers(-(2**24) + 1, 2**24 - 1))
    out_shift = data.draw(st.integers(0, 62))
    out = np.zeros(a.shape, np.int8)
    vk.gelu_mul(a, b, in_mult, in_shift, out_mult, out_shift, out)
    for i in range(a.shape[0]):
        for j in range(a.shape[1]):
            xa = max(-(2**30), min(2**30, rs(int(a[i, j]) * in_mult, in_shift)))
            s = rs(xa * ref_gelu_gate(xa), 20)
            assert out[i, j] == sat8(rs(s * int(b[i, j]) * out_mult, out_shift))


def test_gelu_is_close_to_float() -> None:
    a = np.arange(-128, 128, dtype=np.int8).reshape(1, -1)
    b = np.ones_like(a)
    out = np.zeros_like(a)
    # as the SiLU test: a in units of 1/16 (x from -8 to 7.94), the output too
    vk.gelu_mul(a, b, 2**16, 0, 1, 16, out)
    x = a[0] / 16
    gelu = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    assert np.abs(out[0] - np.clip(np.round(gelu * 16), -128, 127)).max() <= 1
    # the gate saturates exactly past the clamp: a large x passes through, a large -x is 0
    assert ref_gelu_gate(64 << 20) == 2**20 and ref_gelu_gate(-(64 << 20)) == 0


@st.composite
def rope_cases(draw):
    heads = draw(st.integers(1, 3))
    head_dim = 2 * draw(st.integers(1, 8))
    rot = 2 * draw(st.integers(1, head_dim // 2))
    rows = draw(st.integers(1, 4))
    x = draw(hnp.arrays(np.int8, (rows, heads * head_dim), elements=I8))
    tab = st.integers(-(2**14), 2**14)
    cos = draw(hnp.arrays(np.int16, (rows, rot // 2), elements=tab))
    sin = draw(hnp.arrays(np.int16, (rows, rot // 2), elements=tab))
    return x, cos, sin, head_dim, rot


@SETTINGS
@given(rope_cases())
def test_rope(case) -> None:
    x, cos, sin, hd, rot = case
    out = np.zeros_like(x)
    vk.rope(x, cos, sin, hd, rot, out)
    half = rot // 2
    for i in range(x.shape[0]):
        for h in range(x.shape[1] // hd):
            v = [int(t) for t in x[i, h * hd:(h + 1) * hd]]
            exp = list(v)
            for d in range(half):
                c, s = int(cos[i, d]), int(sin[i, d])
                exp[d] = sat8(rs(v[d] * c - v[d + half] * s, 14))
                exp[d + half] = sat8(rs(v[d + half] * c + v[d] * s, 14))
            assert out[i, h * hd:(h + 1) * hd].tolist() == exp
    inplace = x.copy()
    vk.rope(inplace, cos, sin, hd, rot, inplace)
    assert np.array_equal(inplace, out)


def test_rope_tables() -> None:
    cos, sin = vk.rope_tables(np.array([0, 1, 7]), 8, 10000.0)
    assert cos.dtype == np.int16 and cos.shape == (3, 4)
    assert cos[0].tolist() == [16384] * 4 and sin[0].tolist() == [0] * 4
    assert cos[1, 0] == round(math.cos(1.0) * 16384)
    assert sin[2, 1] == round(math.sin(7 * 10000 ** (-2 / 8)) * 16384)
    with pytest.raises(ValueError):
        vk.rope_tables(np.arange(3), 7, 1e4)


def ref_from_f32(x: float, mult: int, shift: int) -> int:
    if math.isnan(x):
        return 0
    if math.isinf(x):
        return 0 if mult == 0 else (127 if (x > 0) == (mult > 0) else -128)
    from fractions import Fraction
    v = Fraction(x) * mult / 2**shift
    return sat8(math.floor(v + Fraction(1, 2)))


@SETTINGS
@given(st.lists(st.floats(width=32), min_size=1, max_size=20), st.integers(-(2**31), 2**31 - 1),
       st.integers(0, 60))
def test_from_f32(xs, mult, shift) -> None:
    arr = np.array(xs, np.float32)
    out = np.zeros(len(xs), np.int8)
    vk.from_f32(arr.view(np.uint32), mult, shift, out)
    assert out.tolist() == [ref_from_f32(float(v), mult, shift) for v in arr]


def test_from_f32_edges() -> None:
    arr = np.array([0.5, -0.5, 1.5, -1.5, 1e-45, -0.0, np.inf, -np.inf, np.nan, 1e30],
                   np.float32)
    out = np.zeros(arr.size, np.int8)
    vk.from_f32(arr.view(np.uint32), 1, 0, out)
    assert out.tolist() == [1, 0, 2, -1, 0, 0, 127, -128, 0, 127]
    assert struct.pack("<f", 1.0) == np.float32(1.0).tobytes()
