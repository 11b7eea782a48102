"""Group-wise asymmetric 4-bit weights, integers only (the ``gemm.g`` instruction).

Weights (output-channel-major, ``n`` rows of ``k``) are stored as

    w[n, j] = s1[n] * (D[n, g] * c[n, j] + M[n, g]),   g = j // G

``c`` unsigned 4-bit codes (0..15), ``D`` uint8 (the group's step in units of ``s1[n]``),
``M`` int16 (the group's minimum in units of ``s1[n]``), ``G`` the group size (the last
group of a row may be shorter). ``s1[n]`` never reaches the device: it is folded into the
per-channel multiplier of the epilogue, as a per-channel weight scale is for ``gemm``.

Row image (one row's bytes, rows packed back to back; :func:`group_row_bytes` bytes):
``[codes: ceil(k/2) bytes, element 2i in the low nibble | M: int16 little-endian x ng |
D: uint8 x ng]`` with ``ng = ceil(k/G)``. A tile of whole rows is one contiguous DMA.

Per activation row ``i`` and group ``g`` (``a`` int8):

    A[i, g]    = sum_{j in g} a[i, j]                        (shared by all n)
    P[i, n, g] = sum_{j in g} a[i, j] * c[n, j]              int32: |P| <= 128*15*G
    acc[i, n]  = sum_g D[n, g] * P[i, n, g] + M[n, g] * A[i, g]      int64

which equals ``sum_j a[i, j] * (D c + M)[n, j]`` exactly. Bound: one element contributes
at most ``128 * (255*15 + 32768) < 2**22.2``, so ``|acc| < 2**37.2`` for ``k <= 2**15``
(:data:`MAX_K`). Epilogue: ``v = acc + bias[n]`` (int64, no wrap), then either
``sat32(v)`` (no multiplier: int32 output) or ``sat8(round_half_up(v * mult[n] / 2**shift))``
with ``0 <= mult < 2**24`` (:data:`MULT_LIMIT`) so that ``|v * mult| < 2**62``.

Speed (same integers): ``sum_g D[n, g] * P[i, n, g] = sum_j a[i, j] * E[n, j]`` with
``E = D c`` (``0 <= E <= 255 * 15``, an int16), an int32 dot product whose partial sums
cannot wrap while ``k * 128 * 255 * 15 < 2**31`` (:data:`INT32_DOT_MAX_K`, 4,386: every
model's ``k``); the kernel then runs one int8 x int16 dot per output, as ``gemm``'s
kernels do (:mod:`.matrix`), instead of one short dot per group. Longer rows take the
per-group sums above.

Work beyond ``gemm``'s ``m*k*n`` MACs: 2 MACs per group per output (``D*P`` and ``M*A``)
and the ``m*k`` additions of the group sums (+6.3 % at G=32 for k=576..1536, +1.6 % at
G=128; the numerics study, scratch report section 6).

Host-side encoding (float weights -> c, D, M, s1) is the compiler's
(:mod:`models.compiler.wgroup`); this module fixes the layout and the arithmetic.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from .fixed import round_shift, sat8, sat32

#: Largest ``k`` whose int64 accumulator cannot overflow (see the module docstring).
MAX_K = 1 << 15
#: Multipliers of the requantizing epilogue must lie in ``[0, MULT_LIMIT)``.
MULT_LIMIT = 1 << 24
MULT_BITS = 24
#: Below this many weight bytes the kernel runs on one thread (as :mod:`.matrix`).
PARALLEL_MIN_WEIGHT_BYTES = 1 << 20


def group_count(k: int, group: int) -> int:
    """Groups of one row: ``ceil(k / group)`` (``group`` < 1 counts as 1)."""
    return -(-k // max(group, 1))


def group_row_bytes(k: int, group: int) -> int:
    """Bytes of one row image: ``ceil(k/2)`` code bytes + 2 (M) + 1 (D) per group."""
    return (k + 1) // 2 + 3 * group_count(k, group)


def pack_group_rows(codes: np.ndarray, d: np.ndarray, mins: np.ndarray) -> np.ndarray:
    """Row images (uint8 ``[n, group_row_bytes]``) of codes uint8 ``[n, k]`` (0..15), ``D``
    uint8 ``[n, ng]`` and ``M`` int16 ``[n, ng]``."""
    codes = np.asarray(codes, np.uint8)
    n, k = codes.shape
    d = np.asarray(d, np.uint8)
    mins = np.asarray(mins, np.int16)
    ng = d.shape[1]
    if d.shape != (n, ng) or mins.shape != (n, ng) or ng < 1 or -(-k // ng) > k:
        raise ValueError(f"pack_group_rows: codes {codes.shape}, D {d.shape}, M {mins.shape}")
    cb = (k + 1) // 2
    out = np.zeros((n, cb + 3 * ng), np.uint8)
    pad = np.zeros((n, 2 * cb), np.uint8)
    pad[:, :k] = codes & 15
    out[:, :cb] = pad[:, 0::2] | (pad[:, 1::2] << 4)
    out[:, cb:cb + 2 * ng] = mins.astype("<i2").view(np.uint8).reshape(n, 2 * ng)
    out[:, cb + 2 * ng:] = d
    return out


def unpack_group_rows(rows: np.ndarray, k: int, group: int
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Inverse of :func:`pack_group_rows`: (codes uint8 ``[n, k]``, D uint8, M int16)."""
    rows = np.asarray(rows, np.uint8)
    ng = group_count(k, group)
    cb = (k + 1) // 2
    if rows.ndim != 2 or rows.shape[1] != cb + 3 * ng:
        raise ValueError(f"unpack_group_rows: rows of {group_row_bytes(k, group)} bytes "
                         f"expected for k={k}, G={group}, got shape {rows.shape}")
    n = rows.shape[0]
    codes = np.empty((n, 2 * cb), np.uint8)
    codes[:, 0::2] = rows[:, :cb] & 15
    codes[:, 1::2] = rows[:, :cb] >> 4
    mins = np.ascontiguousarray(rows[:, cb:cb + 2 * ng]).view("<i2").astype(np.int16)
    return codes[:, :k].copy(), rows[:, cb + 2 * ng:].copy(), mins


@njit(cache=True)
def group_sums(a, group, out):
    """``out[i, g] = sum_{j in group g} a[i, j]`` (int8 ``a[m, k]`` -> int64 ``[m, ng]``)."""
    m, k = a.shape
    for i in range(m):
        for g in range(out.shape[1]):
            s = np.int64(0)
            for j in range(g * group, min(k, (g + 1) * group)):
                s += np.int64(a[i, j])
            out[i, g] = s


@njit(cache=True, inline="always")
def _codes_and_mins(row, cb, ng, c, mm):
    """One row image's codes into ``c`` (0..15, two per byte, low nibble first) and its
    ``M`` (little-endian int16 per group) into ``mm``: :func:`unpack_group_rows` per row."""
    for jb in range(cb):  # unpack without a branch per element (vectorizes)
        c[2 * jb] = row[jb] & 15
        c[2 * jb + 1] = row[jb] >> 4
    for g in range(ng):
        v = np.int32(row[cb + 2 * g]) | (np.int32(row[cb + 2 * g + 1]) << 8)
        mm[g] = np.int64(v - 65536 if v >= 32768 else v)


@njit(cache=True)
def _rows_w4g(a, asum, w, k, group, out, lo, hi):
    m = a.shape[0]
    ng = asum.shape[1]
    cb = (k + 1) // 2
    c = np.zeros(2 * cb, np.int8)
    dd = np.empty(ng, np.int64)
    mm = np.empty(ng, np.int64)
    for n in range(lo, hi):
        row = w[n]
        _codes_and_mins(row, cb, ng, c, mm)
        for g in range(ng):
            dd[g] = np.int64(row[cb + 2 * ng + g])
        for i in range(m):
            acc = np.int64(0)
            ai = a[i]
            for g in range(ng):
                j0 = g * group
                j1 = min(k, j0 + group)
                p = np.int32(0)
                for j in range(j0, j1):
                    p = np.int32(p + np.int32(ai[j]) * np.int32(c[j]))
                acc += dd[g] * np.int64(p) + mm[g] * asum[i, g]
            out[i, n] = acc


#: Largest ``k`` whose int32 dot of int8 activations with ``E = D c`` (at most 255 * 15)
#: cannot wrap: ``k * 128 * 255 * 15 < 2**31``.
INT32_DOT_MAX_K = (2**31 - 1) // (128 * 255 * 15)


@njit(cache=True)
def _rows_w4g_dot(a, asum, w, k, group, out, lo, hi):
    """:func:`_rows_w4g` for ``k <= INT32_DOT_MAX_K``: ``sum_j a[i, j] * E[n, j]`` in one
    int32 dot (no partial sum can wrap), plus ``sum_g M[n, g] * A[i, g]``."""
    m = a.shape[0]
    ng = asum.shape[1]
    cb = (k + 1) // 2
    c = np.zeros(2 * cb, np.int16)
    e = np.zeros(k, np.int16)
    mm = np.empty(ng, np.int64)
    for n in range(lo, hi):
        row = w[n]
        _codes_and_mins(row, cb, ng, c, mm)
        for g in range(ng):
            d = np.int16(row[cb + 2 * ng + g])
            for j in range(g * group, min(k, (g + 1) * group)):
                e[j] = np.int16(d * c[j])
        for i in range(m):
            ai = a[i]
            p = np.int32(0)
            for j in range(k):  # cast back to int32 each step: vpmaddwd lanes (.matrix)
                p = np.int32(p + np.int32(ai[j]) * np.int32(e[j]))
            acc = np.int64(p)
            for g in range(ng):
                acc += mm[g] * asum[i, g]
            out[i, n] = acc


@njit(cache=True)
def _rows_w4g_any(a, asum, w, k, group, out, lo, hi):
    if k <= INT32_DOT_MAX_K:
        _rows_w4g_dot(a, asum, w, k, group, out, lo, hi)
    else:
        _rows_w4g(a, asum, w, k, group, out, lo, hi)


@njit(cache=True)
def gemm_w4g(a, w, k, group, out):
    """int64 ``out[m, n]``: int8 ``a[m, k]`` times the row images ``w`` uint8 ``[n, rb]``."""
    asum = np.empty((a.shape[0], -(-k // group)), np.int64)
    group_sums(a, group, asum)
    _rows_w4g_any(a, asum, w, k, group, out, 0, w.shape[0])


@njit(cache=True, parallel=True)
def gemm_w4g_par(a, w, k, group, out, chunks):
    """:func:`gemm_w4g` with output rows split into ``chunks`` parts over threads."""
    asum = np.empty((a.shape[0], -(-k // group)), np.int64)
    group_sums(a, group, asum)
    n = w.shape[0]
    step = (n + chunks - 1) // chunks
    for ch in prange(chunks):
        _rows_w4g_any(a, asum, w, k, group, out, ch * step, min(n, (ch + 1) * step))


@njit(cache=True)
def epilogue_wide(acc, bias, mult, shift, requant, out8, out32):
    """``v = acc + bias[n]`` (int64); ``out8 = sat8(rs(v * mult[n], shift))`` when
    ``requant``, else ``out32 = sat32(v)``. ``bias`` may be empty."""
    has_bias = bias.shape[0] > 0
    for i in range(acc.shape[0]):
        for n in range(acc.shape[1]):
            v = acc[i, n]
            if has_bias:
                v += np.int64(bias[n])
            if requant:
                out8[i, n] = sat8(round_shift(v * np.int64(mult[n]), shift))
            else:
                out32[i, n] = sat32(v)


def gemm_group(
    a: np.ndarray,
    w: np.ndarray,
    *,
    k: int,
    group: int,
    bias: np.ndarray | None = None,
    mult: np.ndarray | None = None,
    shift: int = 0,
) -> np.ndarray:
    """The ``gemm.g`` instruction: int8 ``[m, n]`` (with ``mult``) or int32 ``[m, n]``."""
    acc = group_accumulate(a, w, k=k, group=group)
    n = acc.shape[1]
    b = np.zeros(0, np.int32) if bias is None else np.ascontiguousarray(bias, np.int32)
    if b.shape[0] not in (0, n):
        raise ValueError(f"gemm.g: bias must have {n} values, got {b.shape[0]}")
    if shift < 0:
        raise ValueError(f"gemm.g: shift must be >= 0, got {shift}")
    requant = mult is not None
    mu = np.zeros(n, np.int32)
    if requant:
        mu = group_multipliers(mult, n)
    out8 = np.empty(acc.shape if requant else (0, 0), np.int8)
    out32 = np.empty((0, 0) if requant else acc.shape, np.int32)
    epilogue_wide(acc, b, mu, shift, requant, out8, out32)
    return out8 if requant else out32


def group_accumulate(a: np.ndarray, w: np.ndarray, *, k: int, group: int) -> np.ndarray:
    """The exact int64 accumulators ``[m, n]`` of int8 ``a`` ``[m, k]`` against the row
    images ``w`` (``n`` rows of :func:`group_row_bytes`), before any epilogue."""
    if group < 1 or not 0 < k <= MAX_K:
        raise ValueError(f"gemm.g: need group >= 1 and 0 < k <= {MAX_K}, got G={group}, k={k}")
    a = np.ascontiguousarray(a, dtype=np.int8).reshape(-1, k)
    wv = np.ascontiguousarray(w).view(np.uint8)
    rb = group_row_bytes(k, group)
    if wv.ndim != 2 or wv.shape[1] != rb:
        raise ValueError(f"gemm.g: weight rows must be {rb} bytes for k={k}, G={group}, "
                         f"got shape {wv.shape}")
    acc = np.empty((a.shape[0], wv.shape[0]), np.int64)
    if wv.nbytes >= PARALLEL_MIN_WEIGHT_BYTES and numba.get_num_threads() > 1:
        gemm_w4g_par(a, wv, k, group, acc, numba.get_num_threads())
    else:
        gemm_w4g(a, wv, k, group, acc)
    return acc


def group_multipliers(mult: np.ndarray, n: int) -> np.ndarray:
    """``mult`` as int32 ``[n]``, refused unless every value lies in ``[0, MULT_LIMIT)``
    (so that the int64 product with a group accumulator cannot overflow)."""
    mu = np.ascontiguousarray(np.broadcast_to(np.asarray(mult, np.int32), (n,)))
    if n and (int(mu.min()) < 0 or int(mu.max()) >= MULT_LIMIT):
        raise ValueError(f"gemm.g: multipliers must lie in [0, 2**{MULT_BITS}) so the "
                         f"int64 product cannot overflow, got {int(mu.min())}..{int(mu.max())}")
    return mu
