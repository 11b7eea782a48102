"""Wide-pipeline kernels (isa.kernels.wide) against Python-int references written from
their documented formulas, bit for bit."""

from __future__ import annotations

import math
import struct

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from isa.kernels import wide
from tests.isa.test_kernels_softmax import ref_isigmoid
from tests.isa.test_kernels_vector import ref_gelu_gate

SETTINGS = settings(max_examples=150, deadline=None)
I32 = st.integers(-(2**31), 2**31 - 1)


def rs(v: int, s: int) -> int:
    if s > 62:
        return 0
    return (v + (1 << (s - 1))) >> s if s > 0 else v


def sat(v: int, bits: int) -> int:
    hi = (1 << (bits - 1)) - 1
    return max(-hi - 1, min(hi, v))


@st.composite
def wide_mats(draw, dtype=np.int32, max_rows=3, max_cols=40):
    r = draw(st.integers(1, max_rows))
    c = draw(st.integers(1, max_cols))
    info = np.iinfo(dtype)
    top = draw(st.sampled_from([127, 2**14, info.max]))
    el = st.integers(max(info.min, -top - 1), top)
    return draw(hnp.arrays(dtype, (r, c), elements=el))


def ref_quant_row(w: list[int]) -> tuple[list[int], int, int]:
    amax = max([1] + [abs(v) for v in w])
    p = max(0, amax.bit_length() - 15)
    a = rs(amax, p)
    f = (127 << 30) // a
    q = [sat(rs(rs(v, p) * f, 30), 8) for v in w]
    return q, (2 * 2**52 + f) // (2 * f), p


@SETTINGS
@given(wide_mats())
def test_quant_row(w: np.ndarray) -> None:
    out = np.empty(w.shape, np.int8)
    meta = np.empty((w.shape[0], 2), np.int32)
    wide.quant_row(w, out, meta)
    for i, row in enumerate(w.tolist()):
        q, fa, p = ref_quant_row(row)
        assert out[i].tolist() == q
        assert meta[i].tolist() == [fa, p]
        assert 0 < fa < 2**31
        # the factor reconstructs the row to within one int8 step (plus rounding)
        amax = max([1] + [abs(v) for v in row])
        step = fa * 2.0 ** (p - wide.ROW_FACTOR_Q)
        assert abs(step * 127 - amax) <= 2e-2 * amax + step


def ref_rmsnorm_wide(x: list[int], g: list[int], eps_q: int, shift: int) -> list[int]:
    c = len(x)
    e = max(0, max(abs(v) for v in x).bit_length() - 15)
    y = [rs(v, e) for v in x]
    ms = (sum(v * v for v in y) << 16) // c + (eps_q >> (2 * e))
    rms = max(1, math.isqrt(ms))
    inv = 2**31 // rms
    return [sat(rs(v * gj * inv, shift), 32) for v, gj in zip(y, g, strict=True)]


@SETTINGS
@given(st.sampled_from([np.int16, np.int32]).flatmap(wide_mats), st.data())
def test_rmsnorm_wide(x: np.ndarray, data) -> None:
    c = x.shape[1]
    g = data.draw(hnp.arrays(np.int16, c, elements=st.integers(-32767, 32767)))
    eps_q = data.draw(st.integers(0, 2**40))
    shift = data.draw(st.integers(0, 40))
    out = np.empty(x.shape, np.int32)
    wide.rmsnorm_wide(x, g, eps_q, shift, out)
    for i, row in enumerate(x.tolist()):
        assert out[i].tolist() == ref_rmsnorm_wide(row, g.tolist(), eps_q, shift)


def test_rmsnorm_wide_is_scale_free() -> None:
    """A row and the same row times 2**10 normalise to the same output up to the Q8 RMS's
    resolution (1e-3 relative here)."""
    x = np.array([[3, -7, 12, 100, -5, 0, 1, 2]], np.int32)
    g = np.full(8, 16384, np.int16)
    a = np.empty(x.shape, np.int32)
    b = np.empty(x.shape, np.int32)
    wide.rmsnorm_wide(x, g, 0, 20, a)
    wide.rmsnorm_wide(x * 1024, g, 0, 20, b)
    assert np.abs(a - b).max() <= 1e-3 * np.abs(a).max()
    rms = math.sqrt(float((x.astype(np.float64) ** 2).mean()))
    expect = x[0] / rms * 16384 * 2.0 ** (23 - 20)
    assert np.allclose(a[0], expect, rtol=1e-3, atol=2)


@SETTINGS
@given(st.sampled_from([(np.int16, 16), (np.int32, 32)]).flatmap(
    lambda t: st.tuples(wide_mats(t[0]), st.just(t[1]))), st.data())
def test_add_wide(rb, data) -> None:
    r, bits = rb
    d = data.draw(hnp.arrays(np.int32, r.shape, elements=I32))
    ma = data.draw(st.integers(0, 2**31 - 1))
    shift = data.draw(st.integers(0, 40))
    out = np.empty(r.shape, r.dtype)
    wide.add_wide(r, d, ma, shift, bits, out)
    ref = [[sat(rs(a * ma, shift) + b, bits) for a, b in zip(ra, rd, strict=True)]
           for ra, rd in zip(r.tolist(), d.tolist(), strict=True)]
    assert out.tolist() == ref


@SETTINGS
@given(st.integers(1, 3), st.integers(1, 12), st.booleans(), st.booleans(),
       st.sampled_from([8, 32]), st.data())
def test_requant_rows(m: int, n: int, with_bias: bool, rowed: bool, bits: int, data) -> None:
    acc = data.draw(hnp.arrays(np.int32, (m, n), elements=I32))
    bias = (data.draw(hnp.arrays(np.int32, n, elements=I32)) if with_bias
            else np.zeros(0, np.int32))
    mult = data.draw(hnp.arrays(np.int32, n, elements=st.integers(0, 2**31 - 1)))
    shift = data.draw(st.integers(0, 62))
    if rowed:
        fa = data.draw(hnp.arrays(np.int32, m, elements=st.integers(1, 2**31 - 1)))
        p = data.draw(hnp.arrays(np.int32, m, elements=st.integers(0, 17)))
        meta = np.stack([fa, p], axis=1).astype(np.int32)
    else:
        meta = np.zeros((0, 2), np.int32)
    row_shift = data.draw(st.integers(wide.MIN_ROW_SHIFT, 62))
    out = np.empty((m, n), np.int8 if bits == 8 else np.int32)
    wide.requant_rows(acc, bias, mult, shift, meta, row_shift, bits, out)
    for i in range(m):
        for j in range(n):
            v = int(acc[i, j])
            if with_bias and not rowed:
                v = int(np.int32(np.int64(v) + int(bias[j])))  # int32 wrap-around
            t = sat(rs(v * int(mult[j]), shift), 32)
            if rowed:
                t = rs(t * int(meta[i, 0]), row_shift - int(meta[i, 1]))
                if with_bias:  # in output units, after the row factor
                    t += int(bias[j])
            assert int(out[i, j]) == sat(t, bits)


def ref_silu_wide(g: int, u: int, im: int, ish: int, om: int, osh: int) -> int:
    xa = max(-(2**30), min(2**30, rs(g * im, ish)))
    s = rs(xa * ref_isigmoid(xa), 20)
    t = max(-(2**40), min(2**40, rs(s * u, 20)))
    return sat(rs(t * om, osh), 32)


@SETTINGS
@given(wide_mats(max_cols=12), st.data())
def test_silu_mul_wide(g: np.ndarray, data) -> None:
    u = data.draw(hnp.arrays(np.int32, g.shape, elements=I32))
    im = data.draw(st.integers(0, 2**31 - 1))
    ish = data.draw(st.integers(0, 62))
    om = data.draw(st.integers(0, 2**wide.SILU_WIDE_OUT_MULT_BITS - 1))
    osh = data.draw(st.integers(0, 62))
    out = np.empty(g.shape, np.int32)
    wide.silu_mul_wide(g, u, im, ish, om, osh, out)
    ref = [[ref_silu_wide(a, b, im, ish, om, osh) for a, b in zip(ra, rb, strict=True)]
           for ra, rb in zip(g.tolist(), u.tolist(), strict=True)]
    assert out.tolist() == ref


def ref_gelu_wide(g: int, u: int, im: int, ish: int, om: int, osh: int) -> int:
    xa = max(-(2**30), min(2**30, rs(g * im, ish)))
    s = rs(xa * ref_gelu_gate(xa), 20)
    t = max(-(2**40), min(2**40, rs(s * u, 20)))
    return sat(rs(t * om, osh), 32)


@SETTINGS
@given(wide_mats(max_cols=12), st.data())
def test_gelu_mul_wide(g: np.ndarray, data) -> None:
    u = data.draw(hnp.arrays(np.int32, g.shape, elements=I32))
    im = data.draw(st.integers(0, 2**31 - 1))
    ish = data.draw(st.integers(0, 62))
    om = data.draw(st.integers(0, 2**wide.SILU_WIDE_OUT_MULT_BITS - 1))
    osh = data.draw(st.integers(0, 62))
    out = np.empty(g.shape, np.int32)
    wide.gelu_mul_wide(g, u, im, ish, om, osh, out)
    ref = [[ref_gelu_wide(a, b, im, ish, om, osh) for a, b in zip(ra, rb, strict=True)]
           for ra, rb in zip(g.tolist(), u.tolist(), strict=True)]
    assert out.tolist() == ref


def ref_from_f32(x: float, mult: int, shift: int, bits: int) -> int:
    if math.isnan(x):
        return 0
    if math.isinf(x):  # saturates, unless the multiplier is 0
        return 0 if mult == 0 else sat(2**40 if x > 0 else -(2**40), bits)
    from fractions import Fraction
    v = Fraction(x) * mult / Fraction(2) ** shift
    return sat(math.floor(v + Fraction(1, 2)), bits)


@SETTINGS
@given(st.lists(st.floats(width=32, allow_nan=True), min_size=1, max_size=20),
       st.integers(0, 2**31 - 1), st.integers(0, 60), st.sampled_from([16, 32]))
def test_from_f32_wide(xs: list[float], mult: int, shift: int, bits: int) -> None:
    arr = np.array(xs, np.float32)
    raw = np.frombuffer(struct.pack(f"<{len(xs)}f", *xs), np.uint32)
    out = np.empty(len(xs), np.int16 if bits == 16 else np.int32)
    wide.from_f32_wide(raw, mult, shift, bits, out)
    assert out.tolist() == [ref_from_f32(float(v), mult, shift, bits) for v in arr]


# --- LAYERNORM_WIDE ------------------------------------------------------------------------

def ref_layernorm_wide(x: list[int], g: list[int], eps_q: int, shift: int,
                       rotated: bool = False) -> list[int]:
    """The documented formula in Python integers: RMSNORM_WIDE's steps on the centred
    values ``x * 4 - round_half_up(sum(x) * 4 / c)`` (rotated: ``x * 4``, channel 0
    zeroed)."""
    c = len(x)
    f = wide.WIDE_LN_FRAC
    if rotated:
        xc = [0] + [v << f for v in x[1:]]
    else:
        mean = (sum(x) * (2 << f) + c) // (2 * c)
        xc = [(v << f) - mean for v in x]
    e = max(0, max(abs(v) for v in xc).bit_length() - 15)
    y = [rs(v, e) for v in xc]
    ms = (sum(v * v for v in y) << 16) // c + ((eps_q << (2 * f)) >> (2 * e))
    rms = max(1, math.isqrt(ms))
    inv = 2**31 // rms
    return [sat(rs(v * gj * inv, shift), 32) for v, gj in zip(y, g, strict=True)]


@SETTINGS
@given(st.sampled_from([np.int16, np.int32]).flatmap(wide_mats), st.data())
def test_layernorm_wide(x: np.ndarray, data) -> None:
    c = x.shape[1]
    g = data.draw(hnp.arrays(np.int16, c, elements=st.integers(-32767, 32767)))
    eps_q = data.draw(st.integers(0, 2**40))
    shift = data.draw(st.integers(0, 40))
    rotated = data.draw(st.booleans())
    out = np.empty(x.shape, np.int32)
    wide.layernorm_wide(x, g, eps_q, shift, int(rotated), out)
    for i, row in enumerate(x.tolist()):
        assert out[i].tolist() == ref_layernorm_wide(row, g.tolist(), eps_q, shift, rotated)


def test_layernorm_wide_is_the_float_layernorm() -> None:
    """A row with a large offset (the mean LayerNorm removes): the output is ``(x - mean)
    / std * g * 2**(23 - shift)`` to within 2e-3 of its largest value (the resolution of
    ``floor(2**31 / rms)`` when the Q8 RMS is ~2**21, as here), and adding a constant to
    the row changes nothing."""
    x = np.array([[3, -7, 12, 100, -5, 0, 1, 2]], np.int32) * 1000 + 20_000_000
    g = np.full(8, 16384, np.int16)
    a = np.empty(x.shape, np.int32)
    b = np.empty(x.shape, np.int32)
    wide.layernorm_wide(x, g, 0, 20, 0, a)
    wide.layernorm_wide(x - 20_000_000, g, 0, 20, 0, b)
    assert np.array_equal(a, b)
    xc = x[0].astype(np.float64) - x[0].mean()
    expect = xc / math.sqrt((xc**2).mean()) * 16384 * 2.0 ** (23 - 20)
    assert np.abs(a[0] - expect).max() <= 2e-3 * np.abs(expect).max()


@SETTINGS
@given(wide_mats(np.int16))
def test_quant_row_of_an_int16_residual(w: np.ndarray) -> None:
    """QUANT_ROW_WIDE runs :func:`quant_row` on int16 rows (a post-norm block's unnormalised
    residual): the same formula, bit for bit."""
    out = np.empty(w.shape, np.int8)
    meta = np.empty((w.shape[0], 2), np.int32)
    wide.quant_row(w, out, meta)
    for i, row in enumerate(w.tolist()):
        q, fa, p = ref_quant_row(row)
        assert out[i].tolist() == q and meta[i].tolist() == [fa, p]


def test_a_rotated_layernorm_is_the_layernorm_of_the_unrotated_row() -> None:
    """Under a Sylvester Hadamard rotation ``x' = x R`` the LayerNorm of ``x``, rotated, is
    the rotated mode's output on ``x'`` (channel 0 zeroed): to the kernel's resolution."""
    from models.compiler.rotation import hadamard

    rng = np.random.default_rng(3)
    n = 16
    x = rng.standard_normal(n) * 3000 + 9000
    r = hadamard(n)
    xr = np.rint(x @ r).astype(np.int32)[None]
    g = np.full(n, 16384, np.int16)
    got = np.empty((1, n), np.int32)
    wide.layernorm_wide(xr, g, 0, 20, 1, got)
    xc = x - x.mean()
    want = (xc / math.sqrt((xc**2).mean())) @ r * 16384 * 2.0 ** (23 - 20)
    assert got[0, 0] == 0
    assert np.abs(got[0] - want).max() <= 2e-3 * np.abs(want).max()


@SETTINGS
@given(st.sampled_from([np.int16, np.int32]).flatmap(wide_mats), st.data())
def test_rmsnorm_quant_is_rmsnorm_wide_then_quant_row(x: np.ndarray, data) -> None:
    """The fused kernel: the references of its two halves, row by row."""
    c = x.shape[1]
    g = data.draw(hnp.arrays(np.int16, c, elements=st.integers(-(2**15), 2**15 - 1)))
    eps_q = data.draw(st.integers(0, 2**20))
    shift = data.draw(st.integers(14, 40))
    out = np.empty(x.shape, np.int8)
    meta = np.empty((x.shape[0], 2), np.int32)
    wide.rmsnorm_quant(x, g, eps_q, shift, out, meta)
    for i, row in enumerate(x.tolist()):
        q, fa, p = ref_quant_row(ref_rmsnorm_wide(row, g.tolist(), eps_q, shift))
        assert out[i].tolist() == q
        assert meta[i].tolist() == [fa, p]


@SETTINGS
@given(wide_mats(max_rows=3, max_cols=48), st.integers(1, 4), st.data())
def test_row_split_quantization_equals_quant_row_of_whole_rows(w: np.ndarray, parts: int,
                                                                data) -> None:
    """Rows split over ``parts`` cores by columns: each part's ROW_AMAX, then each part's
    QUANT_ROW_AMAX on all maxima, give QUANT_ROW of the whole rows (codes and metadata)."""
    cuts = sorted(data.draw(st.lists(st.integers(0, w.shape[1]), min_size=parts - 1,
                                     max_size=parts - 1)))
    bounds = list(zip([0] + cuts, cuts + [w.shape[1]], strict=True))
    amax = np.empty((parts, w.shape[0]), np.int32)
    for g, (lo, hi) in enumerate(bounds):
        wide.row_amax(np.ascontiguousarray(w[:, lo:hi]), amax[g])
        for i, row in enumerate(w[:, lo:hi].tolist()):
            # an unsigned magnitude: 2**31 (bits of int32 -2**31) for a row holding -2**31
            assert int(amax.view(np.uint32)[g, i]) == max([1] + [abs(v) for v in row])
    for lo, hi in bounds:
        part = np.ascontiguousarray(w[:, lo:hi])
        out = np.empty(part.shape, np.int8)
        meta = np.empty((w.shape[0], 2), np.int32)
        wide.quant_row_amax(part, amax, out, meta)
        for i, row in enumerate(w.tolist()):
            q, fa, p = ref_quant_row(row)
            assert out[i].tolist() == q[lo:hi]
            assert meta[i].tolist() == [fa, p]


def test_the_fused_and_split_quantizations_state_their_bytes_and_refuse_zero_parts() -> None:
    from isa.vecfuncs import VecFunc, vec_operand_bytes, vec_problem

    # (src0, src1, dst) bytes of 3 rows x 10 columns: int8 rows then 8 bytes of meta a row
    assert vec_operand_bytes(VecFunc.RMSNORM_QUANT, 3, 10, 0, 16) == (60, 20, 30 + 24)
    assert vec_operand_bytes(VecFunc.ROW_AMAX, 3, 10, 0, 0) == (120, 0, 12)
    assert vec_operand_bytes(VecFunc.QUANT_ROW_AMAX, 3, 10, 4, 0) == (120, 48, 30 + 24)
    assert vec_problem(VecFunc.QUANT_ROW_AMAX, 0, p1=4) is None
    assert "QUANT_ROW_AMAX: p1 (the parts of each row) must be >= 1, got 0" == vec_problem(
        VecFunc.QUANT_ROW_AMAX, 0, p1=0)
    assert "RMSNORM_QUANT: p2" in vec_problem(VecFunc.RMSNORM_QUANT, 8)
