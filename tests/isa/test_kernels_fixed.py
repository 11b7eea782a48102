"""Fixed-point helpers and fp16/bf16 bit patterns against slow exact references
(Python integers and fractions, tables of every representable value)."""

from __future__ import annotations

import bisect
import math
from fractions import Fraction
from functools import cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isa.kernels import fixed, fpbits

SETTINGS = settings(max_examples=200, deadline=None)


def ref_round_half_up(fr: Fraction) -> int:
    return math.floor(fr + Fraction(1, 2))


@SETTINGS
@given(st.integers(-(2**61), 2**61), st.integers(0, 70))
def test_round_shift(v: int, s: int) -> None:
    expected = ref_round_half_up(Fraction(v, 2**s)) if s <= 62 else 0
    assert fixed.round_shift(v, s) == expected


def test_round_shift_ties_go_up() -> None:
    assert [fixed.round_shift(v, 1) for v in (-5, -3, -1, 1, 3, 5)] == [-2, -1, 0, 1, 2, 3]


@SETTINGS
@given(st.integers(-(2**40), 2**40))
def test_saturation(v: int) -> None:
    assert fixed.sat8(v) == min(127, max(-128, v))
    assert fixed.sat32(v) == min(2**31 - 1, max(-(2**31), v))


@SETTINGS
@given(st.one_of(st.integers(0, 2**62 - 1), st.sampled_from([0, 1, 2, 3, 4, 2**62 - 1])))
def test_isqrt(n: int) -> None:
    assert fixed.isqrt(n) == math.isqrt(n)


@SETTINGS
@given(st.integers(-(2**40), 2**40), st.integers(1, 2**20))
def test_div_round(num: int, den: int) -> None:
    assert fixed.div_round(num, den) == ref_round_half_up(Fraction(num, den))


@SETTINGS
@given(st.floats(1e-12, 1e9, allow_nan=False))
def test_quantize_multiplier(real: float) -> None:
    mult, shift = fixed.quantize_multiplier(real)
    assert 0 <= mult < 2**31 and 0 <= shift <= 62
    if shift < 62:
        assert mult >= 2**30
        assert abs(mult / 2**shift - real) <= real * 2**-30


def test_quantize_multiplier_rejects_negative() -> None:
    with pytest.raises(ValueError):
        fixed.quantize_multiplier(-1.0)
    assert fixed.quantize_multiplier(0.0) == (0, 0)


# --- fp16 / bf16 ---------------------------------------------------------------------------

LAYOUT = {fpbits.FP16: (10, 15, 31), fpbits.BF16: (7, 127, 255)}


def ref_value(bits: int, kind: int) -> Fraction | None:
    """Textbook value of a bit pattern (None for inf/NaN)."""
    p, bias, emax = LAYOUT[kind]
    sign = -1 if bits & 0x8000 else 1
    e = (bits >> p) & emax
    m = bits & ((1 << p) - 1)
    if e == emax:
        return None
    if e == 0:
        return sign * Fraction(m, 2**p) * Fraction(2) ** (1 - bias)
    return sign * (1 + Fraction(m, 2**p)) * Fraction(2) ** (e - bias)


@cache
def positive_table(kind: int) -> tuple[list[Fraction], list[int]]:
    """Every finite non-negative value and its bits, ascending."""
    p, _, emax = LAYOUT[kind]
    bits = list(range(0, emax << p))
    return [ref_value(b, kind) for b in bits], bits


def ref_nearest_bits(fr: Fraction, kind: int) -> int:
    """Nearest representable value, ties to the even pattern; beyond the largest finite
    value: the largest finite value (kvsim's saturating rule)."""
    values, bits = positive_table(kind)
    if fr >= values[-1]:
        return bits[-1]
    i = bisect.bisect_left(values, fr)
    if values[i] == fr:
        return bits[i]
    lo, hi = i - 1, i
    dlo, dhi = fr - values[lo], values[hi] - fr
    if dlo < dhi:
        return bits[lo]
    if dhi < dlo:
        return bits[hi]
    return bits[lo] if bits[lo] % 2 == 0 else bits[hi]


KINDS = st.sampled_from([fpbits.FP16, fpbits.BF16])


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 70000), st.integers(1, 300), KINDS)
def test_ratio_to_bits(num: int, den: int, kind: int) -> None:
    assert fpbits.ratio_to_bits(num, den, kind) == ref_nearest_bits(Fraction(num, den), kind)


@pytest.mark.parametrize("kind", [fpbits.FP16, fpbits.BF16])
def test_ratio_to_bits_all_int8_ranges(kind: int) -> None:
    """Every scale an int8 group can produce: (range 0..255) / (qmax 1, 3, 7, 15, 127, 255)."""
    for den in (1, 3, 7, 15, 127, 255):
        for num in range(256):
            assert fpbits.ratio_to_bits(num, den, kind) == ref_nearest_bits(
                Fraction(num, den), kind), (num, den)


def test_ratio_to_bits_matches_numpy_fp16_for_integers() -> None:
    for v in range(0, 5000, 7):
        assert fpbits.ratio_to_bits(v, 1, fpbits.FP16) == np.float16(v).view(np.uint16)


def test_tiny_and_huge_ratios() -> None:
    # below the smallest fp16 subnormal's half -> 0; huge -> largest finite (0x7BFF)
    assert fpbits.ratio_to_bits(1, 2**26, fpbits.FP16) == 0
    assert fpbits.ratio_to_bits(1, 2**24, fpbits.FP16) == 1
    assert fpbits.ratio_to_bits(10**6, 1, fpbits.FP16) == 0x7BFF


@SETTINGS
@given(st.integers(-256, 256), KINDS)
def test_int_to_bits_exact(v: int, kind: int) -> None:
    b = int(fpbits.int_to_bits(v, kind))
    assert ref_value(b, kind) == v


def ref_bits_to_q(bits: int, kind: int) -> int:
    val = ref_value(bits, kind)
    cap = 2**47
    if val is None:
        m = bits & ((1 << LAYOUT[kind][0]) - 1)
        if m:
            return 0
        return -cap if bits & 0x8000 else cap
    q = ref_round_half_up(val * 2**24)
    return max(-cap, min(cap, q))


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 0xFFFF), KINDS)
def test_bits_to_q(bits: int, kind: int) -> None:
    assert fpbits.bits_to_q(bits, kind) == ref_bits_to_q(bits, kind)


@SETTINGS
@given(st.integers(0, 0xFFFF), KINDS)
def test_bits_to_int8(bits: int, kind: int) -> None:
    expected = max(-128, min(127, ref_round_half_up(Fraction(ref_bits_to_q(bits, kind), 2**24))))
    assert fpbits.bits_to_int8(bits, kind) == expected


def test_every_fp16_is_exact_in_q24() -> None:
    for b in range(0, 0x7C00, 13):
        assert Fraction(int(fpbits.bits_to_q(b, fpbits.FP16)), 2**24) == ref_value(b, fpbits.FP16)
