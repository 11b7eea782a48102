"""Matrix products whose result does not depend on the machine.

A float matrix product from BLAS sums its terms in an order the library picks per CPU
(kernel blocking, vector width, FMA), so its last bits differ between machines. Where
those bits decide integers — the calibrated scales of the integer numerics, the rounding
of rotated weights — a program compiled on one machine would differ from the same
program compiled on another. The products here are exact where it matters: each operand
is split into pieces that are integers times a power of two per row (or column), small
enough that every partial sum of a piece product is an integer below 2**53; float64 adds
such integers exactly in any order, so BLAS may sum them as it likes and the result is the
same everywhere. The pieces are then scaled (by powers of two: exact) and added in a fixed
order.

The split keeps ``bits`` bits per piece below the largest magnitude of its row: with
``pieces`` pieces an element is kept to ``pieces * bits`` bits below its row's maximum
(everything of a float32 row within ``2**(pieces * bits - 24)`` of the maximum, and an
absolute error below ``max * 2**-(pieces * bits)`` for smaller elements). That is a fixed,
documented rounding, not the library's.
"""

from __future__ import annotations

import numpy as np

# when a float product of integers is exact (isa.kernels.exact: the same bounds the
# integer attention on float BLAS rests on)
from isa.kernels.exact import EXACT_BITS, int_bits, product_bits


def split(a: np.ndarray, axis: int, bits: int, pieces: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``a`` (float) as ``sum(ints * unit)``: ``pieces`` pairs of integer-valued float64
    arrays of magnitude at most ``2**bits`` and power-of-two units (one per slice along
    ``axis``, broadcastable against ``a``), the first piece holding the top ``bits`` bits
    below each slice's largest magnitude, the next the following ``bits``."""
    r = np.asarray(a, dtype=np.float64)
    top = np.max(np.abs(r), axis=axis, keepdims=True)
    _, exp = np.frexp(top)  # top < 2**exp
    unit = np.ldexp(1.0, (exp - bits).astype(np.int64))
    out = []
    for p in range(pieces):
        ints = np.rint(r / unit)  # |r| < 2**bits * unit: |ints| <= 2**bits
        out.append((ints, unit))
        if p + 1 < pieces:
            r = r - ints * unit  # exact: ints * unit is r rounded to a multiple of unit
            unit = unit / 2.0**bits
    return out


def matmul(a: np.ndarray, b: np.ndarray, *, b_integer: bool = False,
           pieces: int = 2) -> np.ndarray:
    """``a @ b`` in float64 (``a`` ``(..., n, k)``, ``b`` ``(..., k, m)``, batch axes as
    ``np.matmul``), the same on every machine.

    ``b_integer``: ``b`` holds integers (quantized weight codes, a Hadamard matrix of
    signs): it is used whole and only ``a`` is split, into one piece of the bits left (a
    product with int8 codes keeps ~34 bits of ``a``). Otherwise both are split into
    ``pieces`` pieces of half the budget each, and the products of pieces whose order sum
    is below ``pieces`` are added (the lower-order cross terms fall below the kept bits).
    """
    k = a.shape[-1]
    if b.shape[-2] != k:
        raise ValueError(f"exact.matmul: shapes {a.shape} and {b.shape} do not chain")
    budget = product_bits(k)
    if b_integer:
        bb = int_bits(b)
        ba = budget - bb
        if ba < 8:
            raise ValueError(f"exact.matmul: {bb}-bit integers summed over {k} terms leave "
                             f"{ba} bits for the other factor")
        [(ai, au)] = split(a, -1, ba, 1)
        return np.matmul(ai, np.asarray(b, np.float64)) * au
    half = budget // 2
    sa = split(a, -1, half, pieces)
    sb = split(b, -2, half, pieces)
    out = None
    for order in range(pieces):  # most significant first, a fixed order of the adds
        for i in range(order + 1):
            ai, au = sa[i]
            bi, bu = sb[order - i]
            term = np.matmul(ai, bi) * au * bu
            out = term if out is None else out + term
    assert out is not None
    return out


def matmul_signs_kron(a: np.ndarray, factors: list[np.ndarray]) -> np.ndarray:
    """``a @ kron(*factors)`` for square matrices of signs (+-1), bit for bit
    :func:`matmul` ``(a, kron(*factors), b_integer=True)``, in ``sum(sizes)`` instead of
    ``prod(sizes)`` products per element: ``a`` is split the same way (one piece of
    :func:`product_bits` of the whole order), then each factor is applied along its own
    axis. Every partial sum is a signed sum of at most ``prod(sizes)`` of the integers, below
    ``2**52`` as in the whole product, so float64 adds it exactly and the result is the
    same integers."""
    sizes = [f.shape[0] for f in factors]
    k = int(np.prod(sizes))
    if a.shape[-1] != k:
        raise ValueError(f"exact.matmul_signs_kron: {a.shape} and a Kronecker product of "
                         f"order {k} do not chain")
    for f in factors:
        if f.ndim != 2 or f.shape[0] != f.shape[1] or not np.all(np.abs(f) == 1):
            raise ValueError("exact.matmul_signs_kron: the factors must be square +-1 "
                             "matrices")
    [(ai, au)] = split(a, -1, product_bits(k), 1)
    lead = ai.shape[:-1]
    x = ai.reshape(-1, k)
    outer = 1
    for f, n in zip(factors, sizes, strict=True):  # f along its axis: [outer, n, inner]
        inner = k // (outer * n)
        x = np.matmul(np.asarray(f, np.float64).T, x.reshape(-1, n, inner))
        outer *= n
    return x.reshape(*lead, k) * au


def weight_product(x: np.ndarray, qw) -> np.ndarray:
    """``x @ W.T`` for a quantized matrix ``W = ints * scales[:, None]`` (``qw`` with
    ``integer_weights()`` ``[n, k]`` and ``scales`` ``[n]``; ``x`` ``[m, k]``), float32, the
    same on every machine: :func:`matmul` over the integers, then the row scales."""
    y = matmul(x, qw.integer_weights().T.astype(np.float64), b_integer=True)
    return (y * np.asarray(qw.scales, np.float64)[None, :]).astype(np.float32)


__all__ = ["EXACT_BITS", "int_bits", "matmul", "matmul_signs_kron", "product_bits", "split",
           "weight_product"]
