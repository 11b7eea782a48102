"""Integer sums on float arithmetic: when a float matrix product of integers is exact.

A float type with a ``p``-bit significand (float32: 24, float64: 53; IEEE 754) holds every
integer of magnitude up to ``2**p``. A sum of integers whose partial sums all stay within
that range is computed exactly in any order of additions, with or without FMA. So a float
BLAS product of integer operands returns the exact integer sums, whatever kernel, blocking
or thread split the library picks on the machine, when ``k * max|a| * max|b|`` stays in
that range (``k`` terms per sum). kvsim rests two things on this:

- the integer attention on float BLAS (:func:`isa.kernels.attention.attention_blas`): int8
  operands, the float type checked per call against the operands' own magnitudes
  (:func:`exact_float`), the integer kernel where no float type is exact;
- the compiler's machine-independent float products (:mod:`models.exact`): float operands
  split into integer pieces small enough for float64 (:func:`product_bits`).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
from threadpoolctl import ThreadpoolController

#: Significand bits of each float type: every integer of magnitude up to ``2**bits`` is
#: exact in it.
SIGNIFICAND_BITS: dict[np.dtype, int] = {np.dtype(np.float32): 24, np.dtype(np.float64): 53}
#: float64's: the widest type kvsim sums integers in.
EXACT_BITS = SIGNIFICAND_BITS[np.dtype(np.float64)]


def exact_float(bound: int) -> np.dtype | None:
    """The narrowest float type (float32, then float64) in which sums of integers whose
    partial sums stay below ``bound`` in magnitude are exact, or None when neither is."""
    for dtype, bits in SIGNIFICAND_BITS.items():
        if bound < 1 << bits:
            return dtype
    return None


def product_bits(k: int) -> int:
    """Bits the two integer factors of a product may share when ``k`` of them are summed
    in float64: every partial sum stays within ``k * 2**bits <= 2**52`` (one bit to spare
    for a factor of exactly ``2**bits``, which rounding to ``bits`` bits can give)."""
    return EXACT_BITS - 1 - max(1, math.ceil(math.log2(max(k, 1))))


def absmax(a: np.ndarray) -> int:
    """The largest magnitude of the integer array ``a`` (0 when empty), as a Python int
    (int8's -128 included: no wrap)."""
    return int(np.abs(a.astype(np.int64)).max()) if a.size else 0


def int_bits(a: np.ndarray) -> int:
    """Bits of the largest magnitude of the integer-valued ``a`` (``|a| <= 2**bits``)."""
    top = float(np.max(np.abs(a))) if a.size else 0.0
    if top != math.floor(top):
        raise ValueError("int_bits: the array holds non-integer values")
    return max(0, math.ceil(math.log2(top))) if top >= 1 else 0


_CONTROLLER: list[ThreadpoolController] = []


def _blas_controller() -> ThreadpoolController:
    """The process's thread-pool controller, made once: ``threadpool_limits`` scans the
    loaded libraries on every call (~0.2 ms, measured), the controller's ``limit`` only
    sets the thread count (~8 us). The kernels that run exact integer sums on float BLAS
    hold BLAS to one thread with it: measured on a shared 2-core machine, OpenBLAS's own
    threads on these small products cost 3-4x the CPU time of one thread once the cores
    are oversubscribed (the sums are exact, so the thread count never changes a result)."""
    if not _CONTROLLER:
        _CONTROLLER.append(ThreadpoolController())
    return _CONTROLLER[0]


_DEPTH = [0]
_DEPTH_LOCK = threading.Lock()


@contextmanager
def blas_one_thread() -> Iterator[None]:
    """BLAS held to one thread (:func:`_blas_controller`) for the block; nested blocks cost
    nothing (a functional program run holds it once around all its instructions, so its
    GEMM tiles, ~0.1 ms each, do not pay the ~20 us of setting and restoring the count)."""
    with _DEPTH_LOCK:
        outer = _DEPTH[0] == 0
        _DEPTH[0] += 1
    try:
        if outer:
            with _blas_controller().limit(limits=1, user_api="blas"):
                yield
        else:
            yield
    finally:
        with _DEPTH_LOCK:
            _DEPTH[0] -= 1


__all__ = ["EXACT_BITS", "SIGNIFICAND_BITS", "absmax", "blas_one_thread", "exact_float",
           "int_bits", "product_bits"]
