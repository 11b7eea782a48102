"""Kernels of the wide integer pipeline: a residual stream of int16/int32 values and
per-token (per-row) dynamic int8 activation scales. Conventions as :mod:`.fixed`: ``rs(v,
s)`` is round half up of ``v / 2**s``, ``sat_b`` clamps to the signed ``b``-bit range, every
intermediate is int64 and each formula states why it fits.

- :func:`from_f32_wide`: float32 -> int16/int32, ``sat_b(round_half_up(x * mult / 2**shift))``.
- :func:`add_wide` (the second half of the fused residual epilogue, K1):
  ``out = sat_b(rs(r * ma, shift) + d)``; ``r`` is the wide residual, ``d`` the int32
  projection output already on the output residual's scale (:func:`requant_rows`).
- :func:`rmsnorm_wide` (K2): per row ``e = max(0, bitlen(max|x|) - 15)``, ``y = rs(x, e)``
  (``|y| <= 2**15``), ``ms = floor(sum(y^2) * 2**16 / cols) + floor(eps_q / 2**(2e))``,
  ``rms = max(1, isqrt(ms))`` (the RMS of ``y`` in Q8), ``inv = floor(2**31 / rms)``,
  ``out = sat32(rs(y * g * inv, shift))``: int32, ``x / rms(x) * g * 2**(23 - shift)``.
- :func:`quant_row` (K3): per row ``amax = max(1, max|w|)``, ``p = max(0, bitlen(amax) -
  15)``, ``a = rs(amax, p)``, ``f = floor(127 * 2**30 / a)``, ``q = sat8(rs(rs(w, p) * f,
  30))``; row metadata ``(fa, p)`` with ``fa = round(2**52 / f)`` (``< 2**31``), so that
  ``w ~= q * fa * 2**(p - 22)``: the consumer's per-row factor (:data:`ROW_FACTOR_Q`).
- :func:`rmsnorm_quant`: :func:`rmsnorm_wide` then :func:`quant_row` per row, fused (the
  int32 row stays in the vector unit).
- :func:`row_amax` / :func:`quant_row_amax` (K5): :func:`quant_row` of rows whose columns
  are split over the cores: each core finds its part's row maxima, the cores exchange
  them, and each quantizes its columns on the maximum of all parts (bit-identical to
  :func:`quant_row` of the whole rows).
- :func:`requant_rows` (K4, the GEMM epilogue with a per-row factor): without row
  metadata ``out = sat_b(sat32(rs((acc + bias[n]) * mult[n], shift)))`` (the bias in
  accumulator units, as :class:`~isa.instructions.Gemm`); with it the input's scale differs
  per row, so the bias is in output units and added last: ``t = sat32(rs(acc * mult[n],
  shift))``, ``out = sat_b(rs(t * fa[i], row_shift - p[i]) + bias[n])``; ``b`` = 8 or 32.
- :func:`silu_mul_wide`: SwiGLU of int32 gate/up: ``xa = clamp(rs(g * in_mult, in_shift),
  +-2**30)`` (Q20), ``s = rs(xa * isigmoid(xa), 20)``, ``t = clamp(rs(s * u, 20), +-2**40)``,
  ``out = sat32(rs(t * out_mult, out_shift))`` (needs ``out_mult < 2**22``).
- :func:`gelu_mul_wide`: GeGLU, the same with GELU's gate
  (:func:`isa.kernels.vector.igelu_gate`) in place of ``isigmoid(xa)``.
- :func:`layernorm_wide`: LayerNorm without bias of wide rows: :func:`rmsnorm_wide` on the
  centred values ``x * 2**2 - round(sum(x) * 2**2 / cols)`` (of a Sylvester-rotated row:
  ``x * 2**2`` with channel 0, the mean's direction, zeroed); same parameters and output.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .fixed import isqrt, round_shift, sat8, sat32
from .softmax import F, isigmoid
from .vector import igelu_gate

#: Fractional bits of a row factor ``fa`` of :func:`quant_row`: ``w ~= q * fa * 2**(p - 22)``.
ROW_FACTOR_Q = 22
#: Row metadata of a per-token int8 tensor: two int32 per row, ``(fa, p)``.
ROW_META_INTS = 2
#: Bits of ``|y|`` in :func:`rmsnorm_wide` after the per-row pre-shift.
NORM_IN_BITS = 15
#: Largest ``row_shift - p`` can go below zero never: ``p <= 17`` for int32 inputs, so the
#: epilogue needs ``row_shift >= 17``.
MIN_ROW_SHIFT = 17
SILU_T_MAX = 1 << 40
SILU_WIDE_OUT_MULT_BITS = 22
_RMS_Q = 8
_INV_BITS = 31
_SILU_X_MAX = 1 << 30


@njit(cache=True, inline="always")
def sat_bits(v, bits):
    """Clamp to the signed ``bits``-bit range (8, 16 or 32)."""
    hi = (np.int64(1) << (bits - 1)) - 1
    lo = -hi - 1
    if v < lo:
        return lo
    if v > hi:
        return hi
    return v


@njit(cache=True, inline="always")
def bitlen(v):
    """Number of bits of ``v >= 0`` (0 for 0)."""
    n = 0
    while v > 0:
        v >>= 1
        n += 1
    return n


@njit(cache=True)
def from_f32_wide(bits, mult, shift, out_bits, out):
    """float32 bit patterns ``bits[n]`` -> ``out[n]`` (int16/int32 array):
    ``sat_b(round_half_up(x * mult / 2**shift))`` exact in integers (NaN -> 0,
    infinities saturate); ``|significand * mult| < 2**55``."""
    lim = np.int64(1) << (out_bits - 1)
    for i in range(bits.shape[0]):
        b = np.int64(bits[i]) & 0xFFFFFFFF
        e = (b >> 23) & 0xFF
        m = b & 0x7FFFFF
        if e == 0xFF:
            if m != 0:
                out[i] = 0
                continue
            sig = np.int64(1) << 23
            k = 200
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
        elif k >= 0:
            if k >= out_bits or abs(v) > (lim >> k):  # |v << k| > 2**(b-1): saturates
                out[i] = sat_bits(lim if v > 0 else -lim - 1, out_bits)
            else:
                out[i] = sat_bits(v << k, out_bits)
        else:
            out[i] = sat_bits(round_shift(v, -k), out_bits)


@njit(cache=True)
def add_wide(r, d, ma, shift, out_bits, out):
    """``out = sat_b(rs(r * ma, shift) + d)``: ``r`` int16/int32 ``[m, n]``, ``ma < 2**31``
    (``|r * ma| < 2**62``), ``d`` int32."""
    for i in range(r.shape[0]):
        for j in range(r.shape[1]):
            v = round_shift(np.int64(r[i, j]) * np.int64(ma), shift) + np.int64(d[i, j])
            out[i, j] = sat_bits(v, out_bits)


@njit(cache=True)
def rmsnorm_wide(x, gamma, eps_q, shift, out):
    """RMSNorm of wide rows ``x[r, c]`` (int16/int32) with int16 gain ``gamma[c]``, int32
    ``out``. ``sum(y^2) < 2**30 * c`` and ``c < 2**16`` keep ``ss * 2**16 < 2**62``;
    ``|y * g * inv| <= 2**15 * 2**15 * 2**31``."""
    r, c = x.shape
    for i in range(r):
        amax = np.int64(0)
        for j in range(c):
            v = abs(np.int64(x[i, j]))
            if v > amax:
                amax = v
        e = bitlen(amax) - NORM_IN_BITS
        if e < 0:
            e = 0
        ss = np.int64(0)
        for j in range(c):
            y = round_shift(np.int64(x[i, j]), e)
            ss += y * y
        ms = ((ss << (2 * _RMS_Q)) // c) + (np.int64(eps_q) >> (2 * e))
        rms = isqrt(ms)
        if rms < 1:
            rms = np.int64(1)
        inv = (np.int64(1) << _INV_BITS) // rms
        for j in range(c):
            y = round_shift(np.int64(x[i, j]), e)
            out[i, j] = sat32(round_shift(y * np.int64(gamma[j]) * inv, shift))


@njit(cache=True, inline="always")
def quant_one_row(w, i, amax, out, meta):
    """Row ``i`` of :func:`quant_row` given its ``amax = max(1, max|w[i]|)`` (or the
    maximum over a row split across cores, :func:`quant_row_amax`)."""
    p = bitlen(amax) - NORM_IN_BITS
    if p < 0:
        p = 0
    a = round_shift(amax, p)
    f = (np.int64(127) << 30) // a
    for j in range(w.shape[1]):
        out[i, j] = sat8(round_shift(round_shift(np.int64(w[i, j]), p) * f, 30))
    meta[i, 0] = (2 * (np.int64(1) << 52) + f) // (2 * f)
    meta[i, 1] = p


@njit(cache=True, inline="always")
def row_absmax(w, i):
    """``max(1, max|w[i, :]|)``."""
    amax = np.int64(1)
    for j in range(w.shape[1]):
        v = abs(np.int64(w[i, j]))
        if v > amax:
            amax = v
    return amax


@njit(cache=True)
def quant_row(w, out, meta):
    """int32 ``w[r, c]`` -> int8 ``out`` with one dynamic scale per row; int32
    ``meta[r, 2] = (fa, p)``. ``|rs(w, p)| <= a <= 2**15`` and ``f <= 127 * 2**30``, so
    ``rs(w, p) * f < 2**52``."""
    for i in range(w.shape[0]):
        quant_one_row(w, i, row_absmax(w, i), out, meta)


@njit(cache=True)
def row_amax(w, out):
    """int32 ``w[r, c]`` -> ``out[r] = max(1, max|w[i, :]|)``, an unsigned 32-bit
    magnitude in an int32 word (a row holding -2**31 has magnitude 2**31, whose bits read
    back as -2**31 in int32): one core's part of the per-row maximum of a row split over
    the cores (K5a)."""
    for i in range(w.shape[0]):
        out[i] = row_absmax(w, i)


@njit(cache=True)
def quant_row_amax(w, amax, out, meta):
    """:func:`quant_row` of one core's columns ``w[r, c]`` of rows split over the cores,
    with the row maxima ``amax[g, r]`` of all ``g`` parts (:func:`row_amax`): the row's
    scale is that of its maximum over the parts, so the result equals :func:`quant_row`
    of the whole rows restricted to these columns, and every part writes the same
    ``meta`` (K5b)."""
    for i in range(w.shape[0]):
        top = np.int64(1)
        for g in range(amax.shape[0]):
            v = np.int64(amax[g, i]) & 0xFFFFFFFF  # ROW_AMAX's unsigned magnitude
            if v > top:
                top = v
        quant_one_row(w, i, top, out, meta)


@njit(cache=True)
def rmsnorm_quant(x, gamma, eps_q, shift, out, meta):
    """:func:`rmsnorm_wide` then :func:`quant_row`, row by row, with the int32 row held in
    the vector unit (K2+K3 fused: no int32 ``[r, c]`` buffer in SRAM)."""
    row = np.empty((1, x.shape[1]), np.int32)
    q = np.empty((1, x.shape[1]), np.int8)
    m1 = np.empty((1, 2), np.int32)
    for i in range(x.shape[0]):
        rmsnorm_wide(x[i:i + 1], gamma, eps_q, shift, row)
        quant_one_row(row, 0, row_absmax(row, 0), q, m1)
        for j in range(x.shape[1]):
            out[i, j] = q[0, j]
        meta[i, 0] = m1[0, 0]
        meta[i, 1] = m1[0, 1]


@njit(cache=True)
def requant_rows(acc, bias, mult, shift, meta, row_shift, out_bits, out):
    """GEMM epilogue with a per-row factor (``meta`` ``[m, 2]`` int32, or ``[0, 2]`` for a
    static input) into ``out`` (int8 or int32 ``[m, n]``). A static input's ``acc + bias``
    wraps in int32 (a row-scaled input adds ``bias`` in output units at the end);
    ``|acc * mult| < 2**62``; ``t`` is clamped to int32 so ``t * fa < 2**62``; with
    ``row_shift >= 17`` the per-row shift ``row_shift - p`` is never negative."""
    has_bias = bias.shape[0] > 0
    rowed = meta.shape[0] > 0
    for i in range(acc.shape[0]):
        for n in range(acc.shape[1]):
            v = np.int64(acc[i, n])
            if has_bias and not rowed:
                v = np.int64(np.int32(v + bias[n]))
            t = sat32(round_shift(v * np.int64(mult[n]), shift))
            if rowed:
                t = round_shift(t * np.int64(meta[i, 0]), row_shift - np.int64(meta[i, 1]))
                if has_bias:
                    t += np.int64(bias[n])
            out[i, n] = sat_bits(t, out_bits)


@njit(cache=True)
def silu_mul_wide(g, u, in_mult, in_shift, out_mult, out_shift, out):
    """SwiGLU ``silu(g) * u`` of int32 ``g``, ``u`` ``[r, c]`` into int32 ``out``."""
    for i in range(g.shape[0]):
        for j in range(g.shape[1]):
            xa = round_shift(np.int64(g[i, j]) * np.int64(in_mult), in_shift)
            if xa > _SILU_X_MAX:
                xa = np.int64(_SILU_X_MAX)
            elif xa < -_SILU_X_MAX:
                xa = np.int64(-_SILU_X_MAX)
            s = round_shift(xa * isigmoid(xa), F)
            t = round_shift(s * np.int64(u[i, j]), F)
            if t > SILU_T_MAX:
                t = np.int64(SILU_T_MAX)
            elif t < -SILU_T_MAX:
                t = np.int64(-SILU_T_MAX)
            out[i, j] = sat32(round_shift(t * np.int64(out_mult), out_shift))


@njit(cache=True)
def gelu_mul_wide(g, u, in_mult, in_shift, out_mult, out_shift, out):
    """GeGLU ``gelu(g) * u`` of int32 ``g``, ``u`` ``[r, c]`` into int32 ``out``:
    :func:`silu_mul_wide` with GELU's gate (:func:`isa.kernels.vector.igelu_gate`) in place
    of the sigmoid; the same parameters and bounds."""
    for i in range(g.shape[0]):
        for j in range(g.shape[1]):
            xa = round_shift(np.int64(g[i, j]) * np.int64(in_mult), in_shift)
            if xa > _SILU_X_MAX:
                xa = np.int64(_SILU_X_MAX)
            elif xa < -_SILU_X_MAX:
                xa = np.int64(-_SILU_X_MAX)
            s = round_shift(xa * igelu_gate(xa), F)
            t = round_shift(s * np.int64(u[i, j]), F)
            if t > SILU_T_MAX:
                t = np.int64(SILU_T_MAX)
            elif t < -SILU_T_MAX:
                t = np.int64(-SILU_T_MAX)
            out[i, j] = sat32(round_shift(t * np.int64(out_mult), out_shift))


# --- LayerNorm on the wide residual (LayerNorm models: Cohere / Command-R7B) --------------

#: Fraction bits of :func:`layernorm_wide`'s centred values (``x - mean`` in units of
#: ``2**-WIDE_LN_FRAC`` of the input's step; the row mean is rarely an integer).
WIDE_LN_FRAC = 2


@njit(cache=True)
def layernorm_wide(x, gamma, eps_q, shift, rotated, out):
    """LayerNorm without bias (Cohere's) of wide rows ``x[r, c]`` (int16/int32) with int16
    gain ``gamma[c]``, int32 ``out``: per row the centred values ``xc = x * 2**F -
    round_half_up(sum(x) * 2**F / c)`` (``F`` = :data:`WIDE_LN_FRAC`), then
    :func:`rmsnorm_wide`'s steps on ``xc`` with ``eps_q * 2**(2F)`` (``eps_q`` in the
    input's units, as for RMSNORM_WIDE): ``e = max(0, bitlen(max|xc|) - 15)``, ``y = rs(xc,
    e)``, ``ms = floor(sum(y^2) * 2**16 / c) + floor(eps_q * 2**(2F) / 2**(2e))``, ``rms =
    max(1, isqrt(ms))``, ``out = sat32(rs(y * g * floor(2**31 / rms), shift))``; so its
    parameters and output scale are RMSNORM_WIDE's. ``|sum(x)| < 2**47`` and ``|xc| <
    2**(33 + F)``; the rest is bounded as in :func:`rmsnorm_wide`.

    ``rotated`` (nonzero): the row is a residual rotated by a Sylvester Hadamard matrix
    ``R`` (``x' = x R``, ``models.compiler.rotation``), whose first row and column are
    constant: the mean of the unrotated row is ``x'[0] / sqrt(c)`` and centring it removes
    exactly channel 0 of ``x'``, so ``xc = x * 2**F`` with ``xc[0] = 0``."""
    r, c = x.shape
    for i in range(r):
        mean = np.int64(0)
        if not rotated:
            tot = np.int64(0)
            for j in range(c):
                tot += np.int64(x[i, j])
            mean = (tot * np.int64(2 << WIDE_LN_FRAC) + np.int64(c)) // np.int64(2 * c)
        j0 = 1 if rotated else 0  # a rotated row's channel 0 is its mean: centred away
        amax = np.int64(0)
        for j in range(j0, c):
            v = abs((np.int64(x[i, j]) << WIDE_LN_FRAC) - mean)
            if v > amax:
                amax = v
        e = bitlen(amax) - NORM_IN_BITS
        if e < 0:
            e = 0
        ss = np.int64(0)
        for j in range(j0, c):
            y = round_shift((np.int64(x[i, j]) << WIDE_LN_FRAC) - mean, e)
            ss += y * y
        ms = ((ss << (2 * _RMS_Q)) // c) + ((np.int64(eps_q) << (2 * WIDE_LN_FRAC)) >> (2 * e))
        rms = isqrt(ms)
        if rms < 1:
            rms = np.int64(1)
        inv = (np.int64(1) << _INV_BITS) // rms
        if j0:
            out[i, 0] = 0
        for j in range(j0, c):
            y = round_shift((np.int64(x[i, j]) << WIDE_LN_FRAC) - mean, e)
            out[i, j] = sat32(round_shift(y * np.int64(gamma[j]) * inv, shift))
