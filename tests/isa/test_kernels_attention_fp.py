"""The fp16 attention of the dequantize-on-read path (``attn.dq``) against its formula
computed one sum at a time, in the documented order: the kernel's loops run across
independent sums (vectorized) but must not reorder any one sum's additions."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from numba import njit

from isa.kernels.attention_fp import attend_fp


@njit(cache=True)
def ref_attend_fp(q, k, v, pos, scale, out_scale, out):
    """One (query, head) at a time, every sum a scalar loop in the documented order."""
    L, H, dk = q.shape
    T, KH, dv = v.shape
    e = np.empty(T, np.float32)
    for i in range(L):
        for h in range(H):
            kh = h // (H // KH)
            n = min(T, pos + i + 1)
            if n <= 0:
                out[i, h, :] = 0
                continue
            m = np.float32(-np.inf)
            for t in range(n):
                acc = np.float32(0.0)
                for d in range(dk):
                    acc = np.float32(acc + q[i, h, d] * k[t, kh, d])
                e[t] = np.float32(acc * scale)
                m = max(m, e[t])
            z = np.float32(0.0)
            for t in range(n):
                e[t] = np.float32(np.exp(np.float32(e[t] - m)))
                z = np.float32(z + e[t])
            for d in range(dv):
                o = np.float32(0.0)
                for t in range(n):
                    o = np.float32(o + e[t] * v[t, kh, d])
                x = np.floor(np.float32(o / z) * out_scale + np.float32(0.5))
                out[i, h, d] = np.int8(min(127.0, max(-128.0, x)))


F16 = st.floats(-60.0, 60.0, width=16)


@st.composite
def cases(draw):
    kh = draw(st.integers(1, 2))
    h = kh * draw(st.integers(1, 3))
    dk, dv = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    t = draw(st.integers(0, 40))
    lq = draw(st.integers(1, 3))
    pos = draw(st.integers(0, t + 1))
    q = draw(hnp.arrays(np.float16, (lq, h, dk), elements=F16)).astype(np.float32)
    k = draw(hnp.arrays(np.float16, (t, kh, dk), elements=F16)).astype(np.float32)
    v = draw(hnp.arrays(np.float16, (t, kh, dv), elements=F16)).astype(np.float32)
    scale = draw(st.floats(1e-3, 0.2))
    out_scale = draw(st.floats(0.1, 4.0))
    return q, k, v, pos, scale, out_scale


@settings(max_examples=60, deadline=None)
@given(cases())
def test_attend_fp_is_the_formula_bit_for_bit(case) -> None:
    q, k, v, pos, scale, out_scale = case
    want = np.empty((q.shape[0], q.shape[1], v.shape[2]), np.int8)
    ref_attend_fp(q, k, v, pos, np.float32(scale), np.float32(out_scale), want)
    assert np.array_equal(attend_fp(q, k, v, pos=pos, scale=scale, out_scale=out_scale), want)


def test_attend_fp_threaded_long_call() -> None:
    rng = np.random.default_rng(5)
    q = rng.normal(0, 2, (40, 6, 64)).astype(np.float16).astype(np.float32)
    k = rng.normal(0, 2, (600, 2, 64)).astype(np.float16).astype(np.float32)
    v = rng.normal(0, 2, (600, 2, 64)).astype(np.float16).astype(np.float32)
    want = np.empty((40, 6, 64), np.int8)
    ref_attend_fp(q, k, v, 560, np.float32(0.125), np.float32(20.0), want)
    assert np.array_equal(attend_fp(q, k, v, pos=560, scale=0.125, out_scale=20.0), want)


def test_attend_fp_blocks_and_key_tiles_on_one_thread_and_many() -> None:
    """Queries past one block, keys past several tiles, a causal edge inside a tile: the
    serial kernel and the threaded one (any split of the blocks) give the formula."""
    from isa.kernels.attention_fp import KEY_TILE, QUERY_BLOCK, attention_fp, attention_fp_par

    rng = np.random.default_rng(11)
    L, H, KH, T, pos = 2 * QUERY_BLOCK + 3, 6, 2, 3 * KEY_TILE + 37, 2 * KEY_TILE + 5
    q = rng.normal(0, 2, (L, H, 64)).astype(np.float16).astype(np.float32)
    k = rng.normal(0, 2, (T, KH, 64)).astype(np.float16).astype(np.float32)
    v = rng.normal(0, 2, (T, KH, 48)).astype(np.float16).astype(np.float32)
    want = np.empty((L, H, 48), np.int8)
    ref_attend_fp(q, k, v, pos, np.float32(0.125), np.float32(20.0), want)
    kt = np.ascontiguousarray(k.transpose(1, 2, 0))
    vt = np.ascontiguousarray(v.transpose(1, 0, 2))
    args = (q, kt, vt, pos, np.float32(0.125), np.float32(20.0))
    got = np.empty_like(want)
    attention_fp(*args, got)
    assert np.array_equal(got, want)
    for chunks in (2, 5):
        got = np.empty_like(want)
        attention_fp_par(*args, got, chunks)
        assert np.array_equal(got, want)
