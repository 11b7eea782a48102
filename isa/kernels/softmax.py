"""Integer exp, sigmoid and softmax in the style of I-BERT's ``IntSoftmax``.

I-BERT (Kim et al., 2021, "I-BERT: Integer-only BERT Quantization", section 3.4) computes
``exp(x)`` for ``x <= 0`` by writing ``x = -z*ln2 + p`` with ``p`` in ``(-ln2, 0]``, so
``exp(x) = exp(p) >> z``, and approximating ``exp(p)`` on that interval by the second-order
polynomial ``a*p**2 + b*p + c`` with ``a = 0.35815147, b = 0.96963238, c = 1``. kvsim does
the same in fixed point with :data:`F` fractional bits (a fixed binary scale instead of
I-BERT's per-tensor float scale, so the constants are compile-time integers):

    z = floor(-x / LN2);  p = x + z*LN2                      (x, p in Q20)
    L = floor((floor(A*p / 2**F) + B) * p / 2**F) + C         (= a*p^2 + b*p + c, Q20)
    iexp(x) = L >> z   (0 when z > 30)

``iexp(0) = 2**20`` exactly; the relative error against ``exp`` is at most 0.34 % on
``[-5, 0]`` (the polynomial's); further out the Q20 resolution (``2**-20``) dominates.

Softmax of logits ``x_t`` (already in Q20, ``x_t = (s_t - max) * mult >> shift <= 0``):
``e_t = iexp(x_t)``, ``S = sum e_t``, ``inv = floor(2**62 / S)`` (one division per row, as
I-BERT's ``floor(2**32 / S)``), ``p_t = round_half_up(e_t * inv / 2**38)``: probabilities
in Q24 (``P`` fractional bits). ``S >= 2**20`` since the maximum contributes ``2**20``, so
``inv <= 2**42`` and ``e_t * inv <= 2**62``.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .fixed import round_shift, sat8

#: Fractional bits of the fixed-point logits and exponentials.
F = 20
#: Fractional bits of softmax probabilities.
P = 24
#: I-BERT's polynomial for exp on (-ln2, 0] (FACTS.md; Kim et al. 2021, IntSoftmax).
IBERT_A = 0.35815147
IBERT_B = 0.96963238
IBERT_C = 1.0
LN2_Q = round(math.log(2.0) * (1 << F))  # 726817
A_Q = round(IBERT_A * (1 << F))
B_Q = round(IBERT_B * (1 << F))
C_Q = round(IBERT_C * (1 << F))
ONE_Q = 1 << F
#: Logits below this (about -1024 in real units) are clamped; their exp is 0 anyway.
X_MIN = -(1 << 30)
_INV_BITS = 62


@njit(cache=True, inline="always")
def iexp(x):
    """``exp(x / 2**F) * 2**F`` for int64 ``x <= 0`` (positive ``x`` is treated as 0)."""
    if x > 0:
        x = 0
    if x < X_MIN:
        x = X_MIN
    z = (-x) // LN2_Q
    p = x + z * LN2_Q
    t = ((A_Q * p) >> F) + B_Q
    lq = ((t * p) >> F) + C_Q
    if z > 30:
        return np.int64(0)
    return np.int64(lq) >> z


@njit(cache=True, inline="always")
def isigmoid(x):
    """``sigmoid(x / 2**F) * 2**F`` for int64 ``x`` (Q20): ``e / (1 + e)`` with
    ``e = iexp(-|x|)``, mirrored for ``x >= 0``."""
    ax = x if x >= 0 else -x
    e = iexp(-ax)
    neg = (e << F) // (ONE_Q + e)  # sigmoid(-|x|), Q20
    if x >= 0:
        return ONE_Q - neg
    return neg


@njit(cache=True)
def softmax_q(x, out):
    """Probabilities (Q24, int64 ``out[n]``) of Q20 logits ``x[n]`` (int64, any sign: the
    row maximum is subtracted first). An empty row is left alone."""
    n = x.shape[0]
    if n == 0:
        return
    m = x[0]
    for t in range(1, n):
        if x[t] > m:
            m = x[t]
    s = np.int64(0)
    for t in range(n):
        e = iexp(x[t] - m)
        out[t] = e
        s += e
    inv = (np.int64(1) << _INV_BITS) // s
    for t in range(n):
        out[t] = round_shift(out[t] * inv, _INV_BITS - P)


@njit(cache=True)
def softmax_rows_i8(x, mult, shift, out_shift, out):
    """Vector softmax: int8 ``x[r, c]`` -> int8 ``out[r, c]``.

    Logits ``(x - rowmax) * mult >> shift`` (round half up) in Q20, probabilities in Q24,
    ``out = sat8(round_half_up(p / 2**out_shift))`` (``out_shift = 17`` gives Q7, where
    probability 1 saturates to 127). ``|x - max| * mult < 2**8 * 2**31`` fits int64.
    """
    r, c = x.shape
    logits = np.empty(c, np.int64)
    probs = np.empty(c, np.int64)
    for i in range(r):
        for t in range(c):
            logits[t] = np.int64(x[i, t])
        m = logits[0] if c else 0
        for t in range(c):
            if logits[t] > m:
                m = logits[t]
        for t in range(c):
            logits[t] = round_shift((logits[t] - m) * np.int64(mult), shift)
        softmax_q(logits, probs)
        for t in range(c):
            out[i, t] = sat8(round_shift(probs[t], out_shift))
