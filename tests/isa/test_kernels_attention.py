"""Integer attention (GQA, causal, MLA) against a Python-int reference written from the
documented formula, threaded == serial, and closeness to float attention."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from isa.kernels import attention as at
from isa.kernels.fixed import quantize_multiplier
from tests.isa.test_kernels_softmax import ref_softmax_q

SETTINGS = settings(max_examples=80, deadline=None)
I8 = st.integers(-128, 127)


def rs(v: int, s: int) -> int:
    if s > 62:
        return 0
    return (v + (1 << (s - 1))) >> s if s > 0 else v


def ref_attention(q, k, v, pos, sm, ss, om, osh):
    L, H, dk = q.shape
    T, KH, _ = k.shape
    dv = v.shape[2]
    out = np.zeros((L, H, dv), np.int64)
    for i in range(L):
        n = min(T, pos + i + 1)
        for h in range(H):
            kh = h // (H // KH)
            if n <= 0:
                continue
            s = [sum(int(q[i, h, d]) * int(k[t, kh, d]) for d in range(dk)) for t in range(n)]
            m = max(s)
            probs = ref_softmax_q([rs((x - m) * sm, ss) for x in s])
            for d in range(dv):
                o = sum(p * int(v[t, kh, d]) for t, p in enumerate(probs))
                out[i, h, d] = max(-128, min(127, rs(o * om, osh)))
    return out


@st.composite
def cases(draw):
    kh = draw(st.integers(1, 2))
    h = kh * draw(st.integers(1, 3))
    dk = draw(st.integers(1, 9))
    dv = draw(st.integers(1, 9))
    t = draw(st.integers(0, 12))
    lq = draw(st.integers(1, 3))
    pos = draw(st.integers(0, t + 1))
    el = draw(st.sampled_from([I8, st.sampled_from([-128, 127])]))
    q = draw(hnp.arrays(np.int8, (lq, h, dk), elements=el))
    k = draw(hnp.arrays(np.int8, (t, kh, dk), elements=el))
    v = draw(hnp.arrays(np.int8, (t, kh, dv), elements=el))
    sm = draw(st.integers(0, 2**31 - 1))
    ss = draw(st.integers(0, 40))
    om = draw(st.integers(-(2**31), 2**31 - 1))
    osh = draw(st.integers(0, 70))
    return q, k, v, pos, sm, ss, om, osh


@SETTINGS
@given(cases())
def test_attention_matches_reference(case) -> None:
    q, k, v, pos, sm, ss, om, osh = case
    expected = ref_attention(q, k, v, pos, sm, ss, om, osh)
    out = np.full((q.shape[0], q.shape[1], v.shape[2]), 99, np.int8)
    at.attention(q, k, v, pos, sm, ss, om, osh, out)
    assert out.tolist() == expected.tolist()
    out2 = np.zeros_like(out)
    at.attention_par(q, k, v, pos, sm, ss, om, osh, out2, 2)
    assert np.array_equal(out, out2)


def test_threaded_wrapper_equals_serial_on_a_decode_step() -> None:
    rng = np.random.default_rng(0)
    q = rng.integers(-128, 128, (1, 14, 64), dtype=np.int8)
    k = rng.integers(-128, 128, (2048, 2, 64), dtype=np.int8)
    v = rng.integers(-128, 128, (2048, 2, 64), dtype=np.int8)
    kw = dict(pos=2047, score_mult=2**20, score_shift=20, out_mult=1, out_shift=24)
    got = at.attend(q, k, v, **kw)  # 14 * 2048 * 128 MACs: threaded
    out = np.zeros_like(got)
    at.attention(q, k, v, 2047, 2**20, 20, 1, 24, out)
    assert np.array_equal(got, out)


def test_close_to_float_attention() -> None:
    rng = np.random.default_rng(1)
    L, H, KH, D, T = 3, 4, 2, 32, 50
    qf = rng.normal(0, 1, (L, H, D))
    kf = rng.normal(0, 1, (T, KH, D))
    vf = rng.normal(0, 1, (T, KH, D))
    sq, sk, sv = [np.abs(a).max() / 127 for a in (qf, kf, vf)]
    q8, k8, v8 = [np.round(a / s).astype(np.int8) for a, s in ((qf, sq), (kf, sk), (vf, sv))]
    so = 1.0 / 127
    sm, ss = quantize_multiplier(sq * sk / math.sqrt(D) * 2**20)
    om, osh = quantize_multiplier(sv / so / 2**24)
    out = at.attend(q8, k8, v8, pos=T - L, score_mult=sm, score_shift=ss, out_mult=om,
                    out_shift=osh).astype(np.float64) * so
    ref = np.zeros((L, H, D))
    for i in range(L):
        n = T - L + i + 1
        for h in range(H):
            s = kf[:n, h // 2] @ qf[i, h] / math.sqrt(D)
            p = np.exp(s - s.max())
            ref[i, h] = p / p.sum() @ vf[:n, h // 2]
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 0.05


def test_mla_is_single_head_gqa_on_one_cache() -> None:
    rng = np.random.default_rng(2)
    q = rng.integers(-128, 128, (2, 4, 24), dtype=np.int8)
    cache = rng.integers(-128, 128, (9, 24), dtype=np.int8)
    kw = dict(pos=7, score_mult=3 << 20, score_shift=22, out_mult=1, out_shift=24)
    got = at.attention_mla(q, cache, v_dim=16, **kw)
    assert got.shape == (2, 4, 16)
    expected = ref_attention(q, cache[:, None, :], cache[:, None, :16], 7, 3 << 20, 22, 1, 24)
    assert got.tolist() == expected.tolist()


def test_wrapper_checks_shapes() -> None:
    q = np.zeros((1, 3, 4), np.int8)
    k = np.zeros((5, 2, 4), np.int8)
    with pytest.raises(ValueError, match="multiple"):
        at.attend(q, k, k, pos=0, score_mult=1, score_shift=0, out_mult=1, out_shift=0)
    with pytest.raises(ValueError):
        at.attention_mla(q, np.zeros((5, 4), np.int8), v_dim=5, pos=0, score_mult=1,
                         score_shift=0, out_mult=1, out_shift=0)


@SETTINGS
@given(cases())
def test_blas_path_equals_the_integer_kernel(case) -> None:
    """The float-BLAS path computes the integer kernel's output bit for bit (its sums are
    exact: blas_bounds), whatever the shapes, the positions and the multipliers."""
    q, k, v, pos, sm, ss, om, osh = case
    want = np.empty((q.shape[0], q.shape[1], v.shape[2]), np.int8)
    at.attention(q, k, v, pos, sm, ss, om, osh, want)
    score_type = at.blas_bounds(q, k, v)
    assert score_type == np.float32  # |q.k| <= 9 * 2**14 < 2**24
    got = np.empty_like(want)
    at.attention_blas(q, k, v, pos, sm, ss, om, osh, got, score_type)
    assert np.array_equal(got, want)


@pytest.mark.parametrize(("L", "T", "pos", "dk", "score_type"), [
    (300, 300, 0, 64, np.float32),  # a prefill over several query blocks
    (130, 700, 570, 64, np.float32),  # a later call: keys before the block
    (5, 40, 2, 2048, np.float64),  # 2048 * 2**14 = 2**25: float32 would not be exact
])
def test_blas_path_on_long_calls(L, T, pos, dk, score_type) -> None:
    rng = np.random.default_rng(L + T)
    q = rng.integers(-128, 128, (L, 6, dk), dtype=np.int8)
    k = rng.integers(-128, 128, (T, 2, dk), dtype=np.int8)
    v = rng.integers(-128, 128, (T, 2, 32), dtype=np.int8)
    kw = dict(score_mult=1 << 20, score_shift=27 if dk > 64 else 24, out_mult=1 << 20,
              out_shift=27)
    want = np.empty((L, 6, 32), np.int8)
    at.attention(q, k, v, pos, kw["score_mult"], kw["score_shift"], kw["out_mult"],
                 kw["out_shift"], want)
    assert at.blas_bounds(q, k, v) == score_type
    assert np.array_equal(at.attend(q, k, v, pos=pos, **kw), want)


def test_blas_bounds_scan_only_where_the_int8_worst_case_does_not_settle_it() -> None:
    """int8 at Dk = 64: float32 without a scan (64 * 2**14 < 2**24). At Dk = 2,048 the worst
    case needs float64, but small values fit float32 (the scan decides); an int16 operand
    is always scanned, and one too wide for float64's sums is refused."""
    rng = np.random.default_rng(3)
    q = rng.integers(-128, 128, (2, 2, 64), dtype=np.int8)
    kv = rng.integers(-128, 128, (9, 1, 64), dtype=np.int8)
    assert at.blas_bounds(q, kv, kv) == np.float32
    small = np.full((2, 2, 2048), 8, np.int8)
    assert at.blas_bounds(small, small[:, :1], small[:, :1]) == np.float32  # 2048 * 64
    assert at.blas_bounds(q.astype(np.int16) * 2, kv, kv) == np.float32  # 64 * 2**15
    assert at.blas_bounds(q.astype(np.int16) * 256, kv, kv) == np.float64
    wide_v = np.full((9, 1, 64), 1 << 30, np.int64)
    assert at.blas_bounds(q, kv, wide_v) is None
