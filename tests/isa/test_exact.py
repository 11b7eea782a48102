"""isa.kernels.exact: the bounds within which float arithmetic sums integers exactly."""

from __future__ import annotations

import numpy as np

from isa.kernels.exact import absmax, exact_float, int_bits, product_bits


def test_the_narrowest_exact_type_and_where_each_stops() -> None:
    assert exact_float(0) == np.float32
    assert exact_float(2**24 - 1) == np.float32
    assert exact_float(2**24) == np.float64
    assert exact_float(2**53 - 1) == np.float64
    assert exact_float(2**53) is None
    # what the bounds stand for: the first integer each type cannot hold
    for dtype, bits in ((np.float32, 24), (np.float64, 53)):
        top = dtype(2**bits)
        assert top + dtype(1) == top and top - dtype(1) != top


def test_magnitudes_and_bits() -> None:
    assert absmax(np.array([-128, 5], np.int8)) == 128  # no int8 wrap
    assert absmax(np.zeros(0, np.int8)) == 0
    assert int_bits(np.array([-4.0, 3.0])) == 2 and int_bits(np.array([5.0])) == 3
    # k products of factors sharing product_bits(k) bits stay within 2**52, and the
    # budget gives away less than two bits
    for k in (1, 2, 3, 576, 1536, 49152):
        assert 2**50 < k * 2 ** product_bits(k) <= 2**52
