"""16-bit float formats handled as integer bit patterns (uint16), with integers only.

Stored KV metadata (scales, float zeros) and full-precision tokens are fp16 or bf16 bit
patterns. The kernels never compute in floating point: they make those patterns from
integers (correctly rounded, round to nearest even) and read them back as fixed-point
integers with :data:`Q` fractional bits.

Kinds: :data:`FP16` (IEEE binary16: 1 sign, 5 exponent, 10 mantissa bits) and
:data:`BF16` (1 sign, 8 exponent, 7 mantissa bits).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .fixed import round_shift

FP16 = 1
BF16 = 2

#: Fractional bits of the fixed-point values read from fp16/bf16 patterns. Every finite fp16
#: value (subnormals included: 2**-24 steps) is exact in Q24, and so is every bf16 value of
#: magnitude >= 2**-17 (all scales made from int8 ranges are >= 1/255).
Q = 24
#: Magnitude cap of a Q24 value (2**23 in real units): larger values and infinities saturate
#: here, which keeps ``code * scale`` products far inside int64.
Q_CAP = np.int64(1) << 47


@njit(cache=True, inline="always")
def _layout(kind):
    """(mantissa bits, exponent bias, max biased exponent) of ``kind``."""
    if kind == FP16:
        return 10, 15, 31
    return 7, 127, 255


@njit(cache=True)
def ratio_to_bits(num, den, kind):
    """Bits of ``num / den`` rounded to nearest even, for integers ``num >= 0``, ``den >= 1``.

    Results beyond the largest finite value become the largest finite value; results below
    the smallest normal round to a subnormal (or zero), as IEEE rounding does.
    """
    if num <= 0:
        return np.uint16(0)
    p, bias, emax = _layout(kind)
    num = np.int64(num)
    den = np.int64(den)
    # Find k with 2**p <= num * 2**k / den < 2**(p+1).
    nb = 0
    t = num
    while t > 0:
        t >>= 1
        nb += 1
    db = 0
    t = den
    while t > 0:
        t >>= 1
        db += 1
    k = p - (nb - db)
    while True:
        if k >= 0:
            a = num << k
            b = den
        else:
            a = num
            b = den << (-k)
        if a < (b << p):
            k += 1
        elif a >= (b << (p + 1)):
            k -= 1
        else:
            break
    # value = num / den = (a / b) * 2**-k, with 2**p <= a / b < 2**(p+1); exponent e = p - k.
    e = p - k
    biased = e + bias
    shift_extra = 0
    if biased < 1:  # subnormal: the mantissa loses (1 - biased) more bits
        shift_extra = 1 - biased
        biased = 0
        if shift_extra > p + 2:  # below half the smallest subnormal
            return np.uint16(0)
    b = b << shift_extra
    q = a // b
    r = a - q * b
    if 2 * r > b or (2 * r == b and (q & 1) == 1):
        q += 1
    if biased == 0:
        if q >= (1 << p):  # rounded up into the smallest normal
            return np.uint16((1 << p) | (q - (1 << p)))
        return np.uint16(q)
    if q == (1 << (p + 1)):
        q >>= 1
        biased += 1
    if biased >= emax:
        return np.uint16(((emax - 1) << p) | ((1 << p) - 1))
    return np.uint16((biased << p) | (q - (1 << p)))


@njit(cache=True)
def int_to_bits(v, kind):
    """Bits of the integer ``v`` (round to nearest even; exact for ``|v| <= 256``)."""
    if v < 0:
        return np.uint16(0x8000 | np.int64(ratio_to_bits(-np.int64(v), 1, kind)))
    return ratio_to_bits(v, 1, kind)


@njit(cache=True)
def bits_to_q(bits, kind):
    """Value of a bit pattern in fixed point with :data:`Q` fractional bits (int64).

    Round half up where the value has more fractional bits than Q (only tiny bf16 values);
    magnitudes above :data:`Q_CAP` and infinities saturate to +-Q_CAP; NaN reads as 0.
    """
    bits = np.int64(bits) & 0xFFFF
    p, bias, emax = _layout(kind)
    sign = (bits >> 15) & 1
    e = (bits >> p) & emax
    m = bits & ((1 << p) - 1)
    if e == emax:
        if m != 0:
            return np.int64(0)
        mag = Q_CAP
    else:
        if e == 0:
            sig = m
            e = 1
        else:
            sig = m | (1 << p)
        # value = sig * 2**(e - bias - p); in Q: sig * 2**(e - bias - p + Q)
        sh = e - bias - p + Q
        if sh < 0:
            if sh < -62:
                return np.int64(0)
            return round_shift(-sig if sign else sig, -sh)
        if sh > 40 or (sig << sh) > Q_CAP:
            mag = Q_CAP
        else:
            mag = sig << sh
    return -mag if sign else mag


@njit(cache=True)
def bits_to_int8(bits, kind):
    """The integer nearest to a bit pattern's value (round half up), saturated to int8."""
    v = round_shift(bits_to_q(bits, kind), Q)
    if v < -128:
        return -128
    if v > 127:
        return 127
    return v
