"""Matrix kernels: int8 activations x int8 or packed int4 weights -> int32, then requantize.

Operands (the Gemm instruction's layouts):

- ``a``: int8 ``[m, k]`` (a GEMV is ``m = 1``: ``x`` int8 ``[k]``).
- ``w``: output-channel-major, ``n`` rows of ``k`` values: int8 ``[n, k]``, or int4 packed
  two per byte, ``[n, ceil(k/2)]`` bytes, element ``2i`` in the low nibble, two's
  complement nibbles in [-8, 7]; with odd ``k`` the high nibble of a row's last byte is
  padding and ignored.
- accumulators: int32, ``acc[m, n] = sum_j a[m, j] * w[n, j]`` with two's complement
  wrap-around (as int32 hardware does; no overflow is possible for ``k < 2**17``).
- epilogue: ``acc + bias[n]`` (int32, wrapping), then either the int32 result or
  ``sat8(round_half_up((acc + bias[n]) * mult[n] / 2**shift))``: ``mult`` is the
  per-output-channel int32 multiplier that folds the weight scale of channel ``n``, the
  activation scale and the output scale (:func:`isa.kernels.fixed.quantize_multiplier`
  computes it on the host). The product is formed in int64, so it never overflows.

Speed: the inner products are written so that LLVM emits ``vpmovsxbw`` + ``vpmaddwd``
(int8 -> int16 pairs -> int32 lanes): each step is cast back to int32 explicitly, since
Numba would otherwise widen the accumulator to int64 and vectorize four times narrower.
Large matrices are split by output rows over Numba's threads (``prange``); every output
element is summed by one thread, and integer sums are exact, so results do not depend on
the thread count.

int8 weights with at least :data:`BLAS_MIN_ROWS` activation rows (a prefill's tiles) run
on float32 BLAS instead (:func:`matmul_blas`), bit for bit the same int32: every product
of two int8 values has magnitude at most ``2**14``, so any partial sum of at most
:data:`BLAS_K_CHUNK` of them stays below ``2**24``, where float32 holds every integer
exactly, whatever order BLAS adds them in; longer rows are summed in chunks of at most
that many and the chunks' int32 results added (no int32 sum can wrap for ``k < 2**17``).
Measured on the compiled programs' tiles (``python benchmarks/kernels.py --tiles``: four
shapes ``(40-86) x (576-1536) x (16-60)``, one thread, an idle 2-core machine, 2026-12-03):
26-37 G multiply-accumulates per second against 21-22 for the integer kernel.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from .exact import blas_one_thread
from .fixed import round_shift, sat8

#: Below this many weight bytes a matrix kernel runs on one thread (thread start-up costs
#: ~10-50 us, more than a small GEMV takes).
PARALLEL_MIN_WEIGHT_BYTES = 1 << 20
#: Activation rows from which an int8 GEMM runs on float32 BLAS (:func:`matmul_blas`):
#: below, converting the weights to float costs more than the integer kernel (a GEMV).
BLAS_MIN_ROWS = 32
#: The most int8 x int8 products (each of magnitude <= 2**14) one float32 sum takes:
#: 1023 * 2**14 < 2**24.
BLAS_K_CHUNK = 1023


@njit(cache=True)
def dot_i8(w_row, x):
    """int32 ``sum(w_row[j] * x[j])`` (wrapping), both int8."""
    acc = np.int32(0)
    for j in range(w_row.shape[0]):
        acc = np.int32(acc + np.int32(w_row[j]) * np.int32(x[j]))
    return acc


@njit(cache=True)
def dot_i4(w_row, xe, xo):
    """int32 dot of one packed int4 row (viewed as int8 bytes) with activations split into
    even (``xe``, multiplies low nibbles) and odd (``xo``, high nibbles) elements."""
    acc = np.int32(0)
    for j in range(w_row.shape[0]):
        b = w_row[j]
        lo = np.int32(np.int8(b << 4) >> 4)  # sign-extended low nibble
        hi = np.int32(b >> 4)  # arithmetic shift: sign-extended high nibble
        acc = np.int32(acc + lo * np.int32(xe[j]) + hi * np.int32(xo[j]))
    return acc


@njit(cache=True)
def split_even_odd(a, kb):
    """int8 ``[m, k]`` -> (even, odd) int8 ``[m, kb]`` with zero padding past ``k``."""
    m, k = a.shape
    xe = np.zeros((m, kb), np.int8)
    xo = np.zeros((m, kb), np.int8)
    for i in range(m):
        for j in range(k):
            if j % 2 == 0:
                xe[i, j // 2] = a[i, j]
            else:
                xo[i, j // 2] = a[i, j]
    return xe, xo


@njit(cache=True)
def _rows_i8(a, w, out, lo, hi):
    for n in range(lo, hi):
        row = w[n]
        for i in range(a.shape[0]):
            out[i, n] = dot_i8(row, a[i])


@njit(cache=True)
def _rows_i4(xe, xo, w, out, lo, hi):
    for n in range(lo, hi):
        row = w[n]
        for i in range(xe.shape[0]):
            out[i, n] = dot_i4(row, xe[i], xo[i])


@njit(cache=True)
def gemm_i8(a, w, out):
    """``out[m, n] = sum_j a[m, j] * w[n, j]``: a int8[m, k], w int8[n, k], out int32[m, n]."""
    _rows_i8(a, w, out, 0, w.shape[0])


@njit(cache=True, parallel=True)
def gemm_i8_par(a, w, out, chunks):
    """:func:`gemm_i8` with output rows split into ``chunks`` contiguous parts over threads."""
    n = w.shape[0]
    step = (n + chunks - 1) // chunks
    for c in prange(chunks):
        _rows_i8(a, w, out, c * step, min(n, (c + 1) * step))


@njit(cache=True)
def gemm_i4(a, w, out):
    """int4 weights: a int8[m, k], w packed as int8 bytes [n, ceil(k/2)], out int32[m, n]."""
    xe, xo = split_even_odd(a, w.shape[1])
    _rows_i4(xe, xo, w, out, 0, w.shape[0])


@njit(cache=True, parallel=True)
def gemm_i4_par(a, w, out, chunks):
    """:func:`gemm_i4` with output rows split into ``chunks`` contiguous parts over threads."""
    xe, xo = split_even_odd(a, w.shape[1])
    n = w.shape[0]
    step = (n + chunks - 1) // chunks
    for c in prange(chunks):
        _rows_i4(xe, xo, w, out, c * step, min(n, (c + 1) * step))


@njit(cache=True)
def add_bias(acc, bias, out):
    """int32 ``out[m, n] = acc[m, n] + bias[n]`` with wrap-around."""
    for i in range(acc.shape[0]):
        for n in range(acc.shape[1]):
            out[i, n] = np.int32(acc[i, n] + bias[n])


@njit(cache=True)
def requant_channels(acc, bias, mult, shift, out):
    """``out[m, n] = sat8(round_half_up((acc[m, n] + bias[n]) * mult[n] / 2**shift))``.

    ``acc + bias`` wraps in int32 first (an int32 adder); the product with ``mult`` is
    int64 (|int32 * int32| < 2**62). ``bias`` may be empty (no bias).
    """
    has_bias = bias.shape[0] > 0
    for i in range(acc.shape[0]):
        for n in range(acc.shape[1]):
            v = np.int64(acc[i, n])
            if has_bias:
                v = np.int64(np.int32(v + bias[n]))
            out[i, n] = sat8(round_shift(v * np.int64(mult[n]), shift))


def matmul(a: np.ndarray, w: np.ndarray, w_bits: int, k: int) -> np.ndarray:
    """int32 ``[m, n]`` products of ``a`` (int8 ``[m, k]``) and the weight operand ``w``
    (``[n, k]`` int8 or ``[n, ceil(k/2)]`` packed int4 bytes, any 8-bit dtype)."""
    a = np.ascontiguousarray(a, dtype=np.int8).reshape(-1, k)
    n = w.shape[0]
    wv = np.ascontiguousarray(w).view(np.int8)
    if w_bits == 8 and wv.shape != (n, k):
        raise ValueError(f"int8 weights must be [n, k] = [{n}, {k}], got {wv.shape}")
    if w_bits == 8 and a.shape[0] >= BLAS_MIN_ROWS:
        return matmul_blas(a, wv)
    out = np.empty((a.shape[0], n), np.int32)
    par = wv.nbytes >= PARALLEL_MIN_WEIGHT_BYTES and numba.get_num_threads() > 1
    if w_bits == 8:
        if par:
            gemm_i8_par(a, wv, out, numba.get_num_threads())
        else:
            gemm_i8(a, wv, out)
    elif w_bits == 4:
        if wv.shape != (n, (k + 1) // 2):
            raise ValueError(f"int4 weights must be [n, ceil(k/2)] bytes, got {wv.shape}")
        if par:
            gemm_i4_par(a, wv, out, numba.get_num_threads())
        else:
            gemm_i4(a, wv, out)
    else:
        raise ValueError(f"weight bits must be 4 or 8, got {w_bits}")
    return out


def matmul_blas(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """int32 ``a @ w.T`` of int8 ``a [m, k]`` and ``w [n, k]`` on float32 BLAS, exact (see
    the module docstring): ``k`` in even chunks of at most :data:`BLAS_K_CHUNK`, BLAS on
    one thread."""
    m, k = a.shape
    chunks = max(1, -(-k // BLAS_K_CHUNK))
    step = -(-k // chunks)
    out = np.zeros((m, w.shape[0]), np.int32)
    with blas_one_thread():
        for j in range(0, k, step):
            af = a[:, j:j + step].astype(np.float32)
            wf = w[:, j:j + step].astype(np.float32)
            out += (af @ wf.T).astype(np.int32)
    return out


def gemm(
    a: np.ndarray,
    w: np.ndarray,
    *,
    w_bits: int,
    k: int,
    bias: np.ndarray | None = None,
    mult: np.ndarray | None = None,
    shift: int = 0,
) -> np.ndarray:
    """The Gemm instruction: int32 ``[m, n]`` when ``mult`` is None, else int8 ``[m, n]``
    requantized per output channel (see the module docstring)."""
    acc = matmul(a, w, w_bits, k)
    n = acc.shape[1]
    b = np.zeros(0, np.int32) if bias is None else np.ascontiguousarray(bias, np.int32)
    if b.shape[0] not in (0, n):
        raise ValueError(f"bias must have {n} values, got {b.shape[0]}")
    if mult is None:
        if b.shape[0]:
            add_bias(acc, b, acc)
        return acc
    mu = np.ascontiguousarray(np.broadcast_to(np.asarray(mult, np.int32), (n,)))
    if shift < 0:
        raise ValueError(f"shift must be >= 0, got {shift}")
    out = np.empty(acc.shape, np.int8)
    requant_channels(acc, b, mu, shift, out)
    return out
