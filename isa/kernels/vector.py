"""Vector kernels, integers and fixed point only (rows x cols, row-major).

Each kernel states its formula; "rs(v, s)" is round half up of ``v / 2**s`` (arithmetic
shift, :func:`isa.kernels.fixed.round_shift`) and "sat8" clamps to [-128, 127].

- :func:`requant_i32`: ``out = sat8(rs(x * mult, shift))``, int32 -> int8.
- :func:`add_rescale`: residual add, ``out = sat8(rs(a*ma + b*mb, shift))``.
- :func:`rmsnorm`: ``out_i = sat8(rs(x_i * g_i * inv, shift))`` with
  ``inv = floor(2**31 / r)``, ``r = max(1, isqrt(floor(sum(x^2) * 2**16 / cols) + eps_q))``
  (``r`` is the row's RMS in Q8, ``eps_q`` is epsilon in units of ``x^2 / 2**16``).
  Real meaning: ``out ~= x * g * 2**(23 - shift) / rms(x)``, so the compiler picks ``shift``
  (and the gamma scale) to land in the next layer's int8 scale.
- :func:`silu_mul`: SwiGLU. ``xa = clamp(rs(a * in_mult, in_shift), +-2**30)`` is ``a`` in
  Q20, ``silu = rs(xa * isigmoid(xa), 20)`` (Q20), ``out = sat8(rs(silu * b * out_mult,
  out_shift))``. Needs ``|out_mult| < 2**24`` (then ``2**30 * 2**7 * 2**24 < 2**62``).
- :func:`gelu_mul`: GeGLU, SwiGLU's form with GELU's tanh approximation in place of
  SiLU (:func:`igelu_gate`): ``out = sat8(rs(rs(xa * igelu_gate(xa), 20) * b * out_mult,
  out_shift))``, ``xa`` as for :func:`silu_mul`; the same parameters.
- :func:`from_f32`: the host-boundary input converter, float32 -> int8:
  ``out = sat8(round_half_up(x * mult / 2**shift))`` computed exactly in integers from the
  float's bits (NaN -> 0, infinities saturate).
- :func:`rope`: rotate-half rotary embedding with Q14 cos/sin tables (see
  :func:`rope_tables`): for ``i < half``, ``out_i = sat8(rs(x_i*c_i - x_{i+half}*s_i, 14))``
  and ``out_{i+half} = sat8(rs(x_{i+half}*c_i + x_i*s_i, 14))``; dims past ``rot_dim`` are
  copied. The scale of ``x`` is unchanged; a rotation can grow a pair by up to sqrt(2), so
  K/Q scales should leave that headroom or saturate.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .fixed import isqrt, round_shift, sat8
from .softmax import ONE_Q, F, isigmoid

#: Fractional bits of the RoPE cos/sin tables (int16: |value| <= 2**14 fits).
ROPE_Q = 14
#: Fractional bits of the RMS value inside :func:`rmsnorm`.
RMS_Q = 8
_INV_BITS = 31
SILU_X_MAX = 1 << 30
#: GELU's tanh approximation (Hendrycks & Gimpel, "Gaussian Error Linear Units", 2016, eq.
#: for "0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))"; HF's ``gelu_pytorch_tanh``) in its
#: sigmoid form ``x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3))``, constants in Q20:
#: ``2 sqrt(2/pi) = 1.5957691216`` and ``0.044715``.
GELU_C = 1673285
GELU_CUBIC = 46887
#: The gate's argument is computed on ``x`` clamped to +-8 (Q20): there it is beyond +-49,
#: where the Q20 sigmoid is exactly 0 or 1, as it is for any larger ``|x|``.
GELU_X_MAX = 8 << F


@njit(cache=True)
def requant_i32(x, mult, shift, out):
    """int32 ``x[r, c]`` -> int8 ``out``: ``sat8(rs(x * mult, shift))`` (per tensor)."""
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            out[i, j] = sat8(round_shift(np.int64(x[i, j]) * np.int64(mult), shift))


@njit(cache=True)
def add_rescale(a, b, ma, mb, shift, out):
    """Residual add of int8 ``a`` and ``b`` with their own multipliers, int8 ``out``."""
    for i in range(a.shape[0]):
        for j in range(a.shape[1]):
            v = np.int64(a[i, j]) * np.int64(ma) + np.int64(b[i, j]) * np.int64(mb)
            out[i, j] = sat8(round_shift(v, shift))


@njit(cache=True)
def rmsnorm(x, gamma, eps_q, shift, out):
    """RMSNorm of int8 rows ``x[r, c]`` with integer gain ``gamma[c]`` (int8/int16) and
    ``eps_q >= 0``; int8 ``out``. ``sum(x^2) * 2**16 < 2**14 * cols * 2**16`` fits int64."""
    r, c = x.shape
    for i in range(r):
        ss = np.int64(0)
        for j in range(c):
            v = np.int64(x[i, j])
            ss += v * v
        ms = ((ss << (2 * RMS_Q)) // c) + np.int64(eps_q)
        rms = isqrt(ms)
        if rms < 1:
            rms = np.int64(1)
        inv = (np.int64(1) << _INV_BITS) // rms
        for j in range(c):
            v = np.int64(x[i, j]) * np.int64(gamma[j]) * inv  # < 2**15 * 2**15 * 2**31
            out[i, j] = sat8(round_shift(v, shift))


#: Fraction bits of LayerNorm's centred values: ``x - mean`` is kept in units of
#: ``2**-LN_FRAC`` of the input's step (the mean is rarely an integer).
LN_FRAC = 2


@njit(cache=True)
def layernorm(x, gamma, eps_q, shift, out):
    """LayerNorm without bias (Cohere's) of int8 rows ``x[r, c]``: the centred values
    ``xc = x * 2**LN_FRAC - rs(sum(x) * 2**LN_FRAC / c)`` (round half up), then RMSNorm's
    steps on ``xc`` with ``eps_q * 2**(2 * LN_FRAC)`` (``eps_q`` in the input's units, as
    for RMSNorm): ``sat8(rs(xc * gamma * floor(2**31 / rms), shift))``, so its parameters
    are RMSNorm's. ``|xc| < 2**10``: every product fits int64."""
    r, c = x.shape
    for i in range(r):
        tot = np.int64(0)
        for j in range(c):
            tot += np.int64(x[i, j])
        mean = (tot * np.int64(2 << LN_FRAC) + np.int64(c)) // np.int64(2 * c)
        ss = np.int64(0)
        for j in range(c):
            v = (np.int64(x[i, j]) << LN_FRAC) - mean
            ss += v * v
        ms = ((ss << (2 * RMS_Q)) // c) + (np.int64(eps_q) << (2 * LN_FRAC))
        rms = isqrt(ms)
        if rms < 1:
            rms = np.int64(1)
        inv = (np.int64(1) << _INV_BITS) // rms
        for j in range(c):
            v = ((np.int64(x[i, j]) << LN_FRAC) - mean) * np.int64(gamma[j]) * inv
            out[i, j] = sat8(round_shift(v, shift))


@njit(cache=True)
def silu_mul(a, b, in_mult, in_shift, out_mult, out_shift, out):
    """SwiGLU ``silu(a) * b`` of int8 ``a``, ``b`` [r, c] into int8 ``out``."""
    for i in range(a.shape[0]):
        for j in range(a.shape[1]):
            xa = round_shift(np.int64(a[i, j]) * np.int64(in_mult), in_shift)
            if xa > SILU_X_MAX:
                xa = np.int64(SILU_X_MAX)
            elif xa < -SILU_X_MAX:
                xa = np.int64(-SILU_X_MAX)
            s = round_shift(xa * isigmoid(xa), F)
            v = s * np.int64(b[i, j]) * np.int64(out_mult)
            out[i, j] = sat8(round_shift(v, out_shift))


@njit(cache=True, inline="always")
def igelu_gate(xa):
    """GELU's gate ``sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3)) * 2**20`` of ``x = xa /
    2**20`` (int64, any magnitude): with ``xc = clamp(xa, +-GELU_X_MAX)``,
    ``z = rs(rs(xc * (2**20 + rs(rs(xc * xc, 20) * GELU_CUBIC, 20)), 20) * GELU_C, 20)``
    and :func:`~isa.kernels.softmax.isigmoid` of it. Every product stays below ``2**50``."""
    xc = xa
    if xc > GELU_X_MAX:
        xc = np.int64(GELU_X_MAX)
    elif xc < -GELU_X_MAX:
        xc = np.int64(-GELU_X_MAX)
    x2 = round_shift(xc * xc, F)  # < 2**26
    t = np.int64(ONE_Q) + round_shift(x2 * np.int64(GELU_CUBIC), F)  # < 2**22
    u = round_shift(xc * t, F)  # < 2**25
    return isigmoid(round_shift(u * np.int64(GELU_C), F))


@njit(cache=True)
def gelu_mul(a, b, in_mult, in_shift, out_mult, out_shift, out):
    """GeGLU ``gelu(a) * b`` of int8 ``a``, ``b`` [r, c] into int8 ``out``: :func:`silu_mul`
    with :func:`igelu_gate` in place of the sigmoid."""
    for i in range(a.shape[0]):
        for j in range(a.shape[1]):
            xa = round_shift(np.int64(a[i, j]) * np.int64(in_mult), in_shift)
            if xa > SILU_X_MAX:
                xa = np.int64(SILU_X_MAX)
            elif xa < -SILU_X_MAX:
                xa = np.int64(-SILU_X_MAX)
            s = round_shift(xa * igelu_gate(xa), F)
            v = s * np.int64(b[i, j]) * np.int64(out_mult)
            out[i, j] = sat8(round_shift(v, out_shift))


@njit(cache=True)
def rope(x, cos_q, sin_q, head_dim, rot_dim, out):
    """Rotary embedding of int8 ``x[r, heads*head_dim]`` (row ``i`` uses table row ``i``
    of int16 ``cos_q``/``sin_q`` ``[r, rot_dim/2]``) into int8 ``out`` (may alias ``x``)."""
    r, c = x.shape
    heads = c // head_dim
    half = rot_dim // 2
    for i in range(r):
        for h in range(heads):
            base = h * head_dim
            for d in range(half):
                x1 = np.int64(x[i, base + d])
                x2 = np.int64(x[i, base + d + half])
                co = np.int64(cos_q[i, d])
                si = np.int64(sin_q[i, d])
                out[i, base + d] = sat8(round_shift(x1 * co - x2 * si, ROPE_Q))
                out[i, base + d + half] = sat8(round_shift(x2 * co + x1 * si, ROPE_Q))
            for d in range(2 * half, head_dim):
                out[i, base + d] = x[i, base + d]


def rope_tables(
    positions: np.ndarray, rot_dim: int, theta: float
) -> tuple[np.ndarray, np.ndarray]:
    """Q14 int16 tables ``(cos, sin)`` of shape ``[len(positions), rot_dim // 2]``:
    ``round(cos(pos * theta**(-2d/rot_dim)) * 2**14)``.

    The tables are constant data (a ROM the compiler or the vector unit holds), built once
    on the host in float64 and rounded to integers; the kernels only read them. Angles use
    the plain (unscaled) RoPE frequencies of HF ``rotate_half`` models.
    """
    if rot_dim <= 0 or rot_dim % 2:
        raise ValueError(f"rot_dim must be a positive even number, got {rot_dim}")
    d = np.arange(rot_dim // 2, dtype=np.float64)
    inv_freq = 1.0 / (float(theta) ** (2.0 * d / rot_dim))
    ang = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    one = 1 << ROPE_Q
    cos = np.floor(np.cos(ang) * one + 0.5).astype(np.int16)
    sin = np.floor(np.sin(ang) * one + 0.5).astype(np.int16)
    return cos, sin


@njit(cache=True)
def from_f32(bits, mult, shift, out):
    """float32 values given as their uint32 bit patterns ``bits[n]`` -> int8 ``out[n]``:
    ``sat8(round_half_up(x * mult / 2**shift))``, exact (``|significand * mult| < 2**55``)."""
    for i in range(bits.shape[0]):
        b = np.int64(bits[i]) & 0xFFFFFFFF
        e = (b >> 23) & 0xFF
        m = b & 0x7FFFFF
        if e == 0xFF:
            if m != 0:
                out[i] = 0
                continue
            sig = np.int64(1) << 23
            k = 200  # infinity: saturates below
        elif e == 0:
            sig = m
            k = 1 - 150 - shift
        else:
            sig = m | (np.int64(1) << 23)
            k = e - 150 - shift
        v = sig * np.int64(mult)
        if (b >> 31) & 1:
            v = -v
        if v == 0:
            out[i] = 0
        elif k >= 0:  # |v| >= 1, so any k > 7 or |v| > 128 saturates
            if k > 7 or v > 128 or v < -128:
                out[i] = 127 if v > 0 else -128
            else:
                out[i] = sat8(v << k)
        else:
            out[i] = sat8(round_shift(v, -k))
