"""Fixed-point building blocks shared by every kernel.

Rounding rule (everywhere in kvsim): **round half up**, i.e. ``floor(x + 1/2)``, done in
integers as ``(v + 2**(s-1)) >> s`` with an arithmetic (flooring) shift. Ties go toward
+infinity (``-2.5 -> -2``, ``2.5 -> 3``). Saturation clamps to the destination range.
All intermediate products are int64; each kernel documents why its products fit.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

INT8_MIN = -128
INT8_MAX = 127
INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1


@njit(cache=True, inline="always")
def round_shift(v, s):
    """``round_half_up(v / 2**s)`` for int64 ``|v| < 2**62`` and ``s >= 0`` (0 when s > 62)."""
    if s <= 0:
        return np.int64(v)
    if s > 62:
        return np.int64(0)
    return (np.int64(v) + (np.int64(1) << (s - 1))) >> s


@njit(cache=True, inline="always")
def sat8(v):
    """Clamp to [-128, 127]."""
    if v < INT8_MIN:
        return INT8_MIN
    if v > INT8_MAX:
        return INT8_MAX
    return v


@njit(cache=True, inline="always")
def sat32(v):
    """Clamp to the int32 range."""
    if v < INT32_MIN:
        return INT32_MIN
    if v > INT32_MAX:
        return INT32_MAX
    return v


@njit(cache=True, inline="always")
def requant1(v, mult, shift):
    """One value: ``sat8(round_shift(v * mult, shift))`` (``v * mult`` must fit int64)."""
    return sat8(round_shift(np.int64(v) * np.int64(mult), shift))


@njit(cache=True, inline="always")
def div_round(num, den):
    """``round_half_up(num / den)`` for int64 ``num`` and ``den > 0`` (floor division)."""
    return (2 * np.int64(num) + den) // (2 * np.int64(den))


@njit(cache=True)
def isqrt(n):
    """``floor(sqrt(n))`` for ``0 <= n < 2**62`` (Newton's method, integers only)."""
    if n <= 0:
        return np.int64(0)
    # Start above the root: 2**ceil(bits/2).
    bits = 0
    m = n
    while m > 0:
        m >>= 1
        bits += 1
    x = np.int64(1) << ((bits + 1) // 2)
    while True:
        y = (x + n // x) >> 1
        if y >= x:
            return x
        x = y


def quantize_multiplier(
    real: float, *, mult_bits: int = 31, max_shift: int = 62
) -> tuple[int, int]:
    """Host-side helper: ``(mult, shift)`` with ``mult * 2**-shift ~= real`` (``real >= 0``).

    ``mult`` is below ``2**mult_bits`` and as large as possible (most precision), ``shift``
    lies in ``[0, max_shift]``. Compilers use it to turn a float scale ratio into the integer
    multiplier/shift pairs the kernels take; the kernels themselves never see a float.
    """
    if not math.isfinite(real) or real < 0:
        raise ValueError(f"quantize_multiplier: scale must be finite and >= 0, got {real}")
    if real == 0:
        return 0, 0
    mant, exp = math.frexp(real)  # real = mant * 2**exp, 0.5 <= mant < 1
    shift = mult_bits - exp
    if shift > max_shift:
        shift = max_shift
    if shift < 0:
        raise ValueError(f"quantize_multiplier: {real} needs a negative shift")
    mult = round(real * 2.0**shift)
    if mult >= 1 << mult_bits:  # rounding carried into a new bit
        mult >>= 1
        shift -= 1
    return int(mult), int(shift)
