"""models.exact: matrix products that do not depend on the order BLAS sums in."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from models import exact


def _operands(seed: int, n: int, k: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    # rows of very different magnitudes, and a massive outlier, as real activations have
    a = (rng.normal(size=(n, k)) * np.exp(rng.normal(0, 3, size=(n, 1)))).astype(np.float32)
    a[0, k // 2] = 22000.0
    b = rng.normal(size=(k, m)).astype(np.float32)
    return a, b


@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 9), k=st.integers(1, 300),
       m=st.integers(1, 9))
def test_the_product_does_not_depend_on_the_summation_order(seed, n, k, m) -> None:
    a, b = _operands(seed, n, k, m)
    perm = np.random.default_rng(seed + 1).permutation(k)
    ints = np.rint(np.random.default_rng(seed + 2).normal(0, 40, size=(k, m)))
    for got, again in (
        (exact.matmul(a, b), exact.matmul(a[:, perm], b[perm])),
        (exact.matmul(a, ints, b_integer=True), exact.matmul(a[:, perm], ints[perm],
                                                             b_integer=True)),
    ):
        assert got.tobytes() == again.tobytes()


@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 9), k=st.integers(1, 4096),
       m=st.integers(1, 5))
def test_the_product_is_the_float64_one_to_its_kept_bits(seed, n, k, m) -> None:
    a, b = _operands(seed, n, k, m)
    want = a.astype(np.float64) @ b.astype(np.float64)
    # each element kept to 2 * half bits below its row's (column's) maximum
    half = (exact.EXACT_BITS - 1 - max(1, int(np.ceil(np.log2(k))))) // 2
    bound = (np.abs(a).max(axis=1, keepdims=True) * np.abs(b).max(axis=0, keepdims=True)
             * k * 2.0 ** (2 - 2 * half))
    assert np.all(np.abs(exact.matmul(a, b) - want) <= bound)


def test_split_pieces_are_integers_within_their_bits_and_add_up() -> None:
    a, _ = _operands(7, 5, 64, 1)
    pieces = exact.split(a, -1, 20, 3)
    back = np.zeros(a.shape)
    for ints, unit in pieces:
        assert np.all(ints == np.rint(ints)) and np.abs(ints).max() <= 2**20
        assert np.all(np.frexp(unit)[0] == 0.5)  # powers of two
        back += ints * unit
    assert np.all(np.abs(back - a) <= np.abs(a).max(axis=1, keepdims=True) * 2.0**-59)


def test_batched_products_follow_matmul_broadcasting() -> None:
    rng = np.random.default_rng(3)
    q = rng.normal(size=(3, 4, 8)).astype(np.float32)
    k = rng.normal(size=(3, 8, 5)).astype(np.float32)
    got = exact.matmul(q, k)
    assert got.shape == (3, 4, 5)
    assert np.allclose(got, np.matmul(q.astype(np.float64), k), rtol=1e-10, atol=1e-12)


def test_integers_too_wide_for_the_sum_are_refused() -> None:
    a = np.ones((2, 4096))
    with pytest.raises(ValueError, match="leave"):
        exact.matmul(a, np.full((4096, 2), 2.0**35), b_integer=True)
    with pytest.raises(ValueError, match="non-integer"):
        exact.matmul(a, np.full((4096, 2), 0.5), b_integer=True)
    with pytest.raises(ValueError, match="chain"):
        exact.matmul(a, np.ones((3, 2)))


def _hadamard_by_recursion(n: int) -> np.ndarray:
    """Sylvester's doubling up to the power-of-two part, then a Kronecker product with
    Paley's order 12 per factor of 12 (the construction the factored one must equal)."""
    from models.compiler.rotation import _paley12

    twelves, rest = 0, n
    while rest % 12 == 0 and twelves < 2:
        rest //= 12
        twelves += 1
    h = np.ones((1, 1))
    while h.shape[0] < rest:
        h = np.block([[h, h], [h, -h]])
    for _ in range(twelves):
        h = np.kron(_paley12(), h)
    return h


@pytest.mark.parametrize("n", [1, 2, 64, 96, 576, 4096])
def test_a_product_with_the_hadamard_factors_is_the_whole_product_bit_for_bit(n) -> None:
    from models.compiler.rotation import hadamard_factors, hadamard_signs

    h = _hadamard_by_recursion(n)
    assert np.array_equal(hadamard_signs(n), h)
    assert np.array_equal(h @ h.T, n * np.eye(n))
    a, b = hadamard_factors(n)
    rng = np.random.default_rng(n)
    # magnitudes over many octaves, so the split rounds and the sums use every kept bit
    x = rng.standard_normal((37, n)) * np.exp(rng.uniform(-30, 30, (37, n)))
    assert np.array_equal(exact.matmul_signs_kron(x, [a, b]), exact.matmul(x, h, b_integer=True))
    x3 = rng.standard_normal((2, 5, n)).astype(np.float32)
    assert np.array_equal(exact.matmul_signs_kron(x3, [a, b]),
                          exact.matmul(x3, h, b_integer=True))


def test_kronecker_factors_must_be_signs_and_chain() -> None:
    with pytest.raises(ValueError, match="do not chain"):
        exact.matmul_signs_kron(np.ones((2, 6)), [np.ones((2, 2)), np.ones((2, 2))])
    with pytest.raises(ValueError, match="square \\+-1"):
        exact.matmul_signs_kron(np.ones((2, 4)), [np.full((2, 2), 2.0), np.ones((2, 2))])
