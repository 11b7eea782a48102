"""Integer exp / sigmoid / softmax against Python-int references written from the formulas,
plus accuracy bounds against the float functions."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from isa.kernels import softmax as sm

SETTINGS = settings(max_examples=200, deadline=None)
F = 20
LN2 = round(math.log(2) * 2**F)
A = round(0.35815147 * 2**F)
B = round(0.96963238 * 2**F)


def ref_iexp(x: int) -> int:
    x = max(min(x, 0), -(2**30))
    z = -x // LN2
    p = x + z * LN2
    poly = (((A * p) >> F) + B) * p >> F  # Python >> floors, as the spec says
    lq = poly + 2**F
    return lq >> z if z <= 30 else 0


def ref_isigmoid(x: int) -> int:
    e = ref_iexp(-abs(x))
    neg = (e << F) // (2**F + e)
    return 2**F - neg if x >= 0 else neg


def rhu_shift(v: int, s: int) -> int:
    return (v + (1 << (s - 1))) >> s if s > 0 else v


def ref_softmax_q(x: list[int]) -> list[int]:
    m = max(x)
    e = [ref_iexp(v - m) for v in x]
    inv = 2**62 // sum(e)
    return [rhu_shift(v * inv, 62 - 24) for v in e]


def test_constants_match_ibert() -> None:
    assert (sm.LN2_Q, sm.A_Q, sm.B_Q, sm.C_Q) == (LN2, A, B, 2**F) == (726817, A, B, 1 << 20)


@SETTINGS
@given(st.one_of(st.integers(-(2**40), 2**10), st.sampled_from([0, -1, -LN2, -LN2 - 1, -(2**30)])))
def test_iexp(x: int) -> None:
    assert sm.iexp(x) == ref_iexp(x)


def test_iexp_accuracy() -> None:
    assert sm.iexp(0) == 2**F
    for i in range(2001):
        x = -5.0 * i / 2000
        q = round(x * 2**F)
        assert abs(sm.iexp(q) / 2**F - math.exp(q / 2**F)) <= 0.0035 * math.exp(q / 2**F)


@SETTINGS
@given(st.integers(-(2**31), 2**31))
def test_isigmoid(x: int) -> None:
    assert sm.isigmoid(x) == ref_isigmoid(x)
    ref = 0.5 * (1 + math.tanh(x / 2**F / 2))  # sigmoid without overflow
    assert abs(sm.isigmoid(x) / 2**F - ref) < 2e-3


@SETTINGS
@given(st.lists(st.integers(-(2**34), 2**34), min_size=1, max_size=40))
def test_softmax_q(x: list[int]) -> None:
    out = np.zeros(len(x), np.int64)
    sm.softmax_q(np.array(x, np.int64), out)
    assert out.tolist() == ref_softmax_q(x)
    assert abs(sum(out.tolist()) - 2**24) <= len(x)  # each p rounded at most 1/2


@SETTINGS
@given(st.data())
def test_softmax_rows_i8(data) -> None:
    r = data.draw(st.integers(1, 3))
    c = data.draw(st.integers(1, 33))
    x = data.draw(hnp.arrays(np.int8, (r, c), elements=st.integers(-128, 127)))
    mult = data.draw(st.integers(-(2**31), 2**31 - 1))
    shift = data.draw(st.integers(0, 40))
    oshift = data.draw(st.integers(0, 30))
    out = np.zeros((r, c), np.int8)
    sm.softmax_rows_i8(x, mult, shift, oshift, out)
    for i in range(r):
        row = [int(v) for v in x[i]]
        m = max(row)
        logits = [rhu_shift((v - m) * mult, shift) for v in row]
        probs = ref_softmax_q(logits)
        assert out[i].tolist() == [max(-128, min(127, rhu_shift(p, oshift))) for p in probs]


def test_softmax_close_to_float() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(0, 3, 64)
    q = np.round(x * 2**F).astype(np.int64)
    out = np.zeros(64, np.int64)
    sm.softmax_q(q, out)
    ref = np.exp(x - x.max())
    ref /= ref.sum()
    assert np.abs(out / 2**24 - ref).max() < 3e-3 * ref.max()
