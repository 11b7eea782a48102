"""Integer attention: int8 Q x int8 K -> int32 scores -> integer softmax -> P x V -> int8.

For query ``i`` (position ``pos + i``) and head ``h`` (KV head ``h // (heads/kv_heads)``,
grouped-query attention), over the tokens ``t < n_i = min(ctx, pos + i + 1)`` (causal):

    s_t  = sum_d q[i, h, d] * k[t, kvh, d]                  int32 (|s| < 2**14 * Dk)
    x_t  = round_half_up((s_t - max_t s_t) * score_mult / 2**score_shift)   logits, Q20
    p_t  = integer softmax of x_t (:func:`isa.kernels.softmax.softmax_q`)   Q24
    o_d  = sum_t p_t * v[t, kvh, d]                           int64 (|o| <= 2**31)
    out  = sat8(round_half_up(o_d * out_mult / 2**out_shift))

``score_mult / 2**score_shift`` is ``s_q * s_k / sqrt(Dk) * 2**20`` (the real logit scale in
Q20); ``out_mult / 2**out_shift`` is ``s_v / s_out / 2**24``. ``|s_t - max| * score_mult <
2**25 * 2**31`` and ``|o_d| * out_mult < 2**31 * 2**31`` fit int64.

K and V arrive here as int8: a cache in a low-bit format is first read through its format
(:meth:`isa.kv.format.KVFormat.region_read`: integer dequantization to
the int8 grid of the values that were written), which is what "K read from the cache in its
stored format" means in kvsim.

MLA (DeepSeek, absorbed form) is the same computation with one KV head whose key is the
cached row ``[latent (kv_lora_rank) | rope key (qk_rope_head_dim)]`` and whose value is the
latent part of the same row: :func:`attention_mla`.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from .exact import absmax, blas_one_thread, exact_float
from .fixed import round_shift, sat8
from .softmax import softmax_q

#: Below this many multiply-accumulates an attention call stays on one thread.
PARALLEL_MIN_MACS = 1 << 20
#: From this many scores (queries x heads x keys) on, :func:`attend` computes on float
#: BLAS (:func:`attention_blas`; below, the per-call conversions cost more than they save).
BLAS_MIN_SCORES = 1 << 14


@njit(cache=True)
def _attend_one(q, k, v, n, score_mult, score_shift, out_mult, out_shift, out, s, p):
    """One (query, head): q int8[Dk], k int8[T, Dk], v int8[T, Dv] -> out int8[Dv];
    ``s``/``p`` are int64 scratch of length >= n."""
    dk = q.shape[0]
    dv = out.shape[0]
    if n <= 0:
        for d in range(dv):
            out[d] = 0
        return
    m = np.int64(-(1 << 62))
    for t in range(n):
        acc = np.int32(0)
        for d in range(dk):
            acc = np.int32(acc + np.int32(q[d]) * np.int32(k[t, d]))
        s[t] = acc
        if acc > m:
            m = np.int64(acc)
    for t in range(n):
        s[t] = round_shift((s[t] - m) * np.int64(score_mult), score_shift)
    softmax_q(s[:n], p[:n])
    for d in range(dv):
        o = np.int64(0)
        for t in range(n):
            o += p[t] * np.int64(v[t, d])
        out[d] = sat8(round_shift(o * np.int64(out_mult), out_shift))


@njit(cache=True)
def _attend_range(q, k, v, pos, score_mult, score_shift, out_mult, out_shift, out, lo, hi):
    L, H, _ = q.shape
    T, KH, _ = k.shape
    group = H // KH
    s = np.empty(T, np.int64)
    p = np.empty(T, np.int64)
    for job in range(lo, hi):
        i = job // H
        h = job % H
        kh = h // group
        n = min(T, pos + i + 1)
        _attend_one(q[i, h], k[:, kh, :], v[:, kh, :], n, score_mult, score_shift,
                    out_mult, out_shift, out[i, h], s, p)


@njit(cache=True)
def attention(q, k, v, pos, score_mult, score_shift, out_mult, out_shift, out):
    """GQA attention: q int8[L, H, Dk], k int8[T, KH, Dk], v int8[T, KH, Dv] (H a multiple
    of KH), query ``i`` at position ``pos + i``; int8 ``out[L, H, Dv]``."""
    _attend_range(q, k, v, pos, score_mult, score_shift, out_mult, out_shift, out, 0,
                  q.shape[0] * q.shape[1])


@njit(cache=True, parallel=True)
def attention_par(q, k, v, pos, score_mult, score_shift, out_mult, out_shift, out, chunks):
    """:func:`attention` with the (query, head) pairs split over threads."""
    jobs = q.shape[0] * q.shape[1]
    step = (jobs + chunks - 1) // chunks
    for c in prange(chunks):
        _attend_range(q, k, v, pos, score_mult, score_shift, out_mult, out_shift, out,
                      c * step, min(jobs, (c + 1) * step))


# --- the same integers through float BLAS ------------------------------------------------
#
# Every integer of the kernel above, computed on float BLAS where the sums provably fit
# the float format exactly (isa.kernels.exact: an integer sum whose partial sums all stay
# within 2**24 in float32, or 2**53 in float64, is exact in any order of additions):
#   scores  sum_d q*k:  |q|, |k| <= 128, so |partial| <= Dk * max|q| * max|k| (2**20 for
#                       Dk = 64): float32 while that bound is < 2**24, else float64;
#   output  sum_t p*v:  p in Q24, |partial| <= T * max p * max|v| (2**44 for 8,192
#                       tokens): float64 while that bound is < 2**53.
# The softmax between them is the kernel's own (softmax_q), row by row. Where a bound
# does not hold, attend() runs the integer kernel. One KV head and its query group at a
# time, QUERY_BLOCK queries at once, each block over only the keys its last query sees.

#: Queries per block of the BLAS path (scores ``QUERY_BLOCK * group x T`` at a time).
QUERY_BLOCK = 128
#: The largest Q24 probability softmax_q returns (1.0; its rounding never exceeds it).
P_MAX = 1 << 24


@njit(cache=True, parallel=True)
def probs_rows(s, i0, group, pos, score_mult, score_shift, p):
    """Row ``r`` of ``s`` (float32 or float64 integer scores ``[R, T]``) is query ``i0 + r
    // group``: ``p[r, t]`` its Q24 probability (as :func:`_attend_one` computes it) for
    ``t < n`` (``n = min(T, pos + i + 1)``), 0 past ``n``."""
    R, T = s.shape
    for r in prange(R):
        i = i0 + r // group
        n = min(T, pos + i + 1)
        if n <= 0:
            for t in range(T):
                p[r, t] = 0.0
            continue
        x = np.empty(n, np.int64)
        pr = np.empty(n, np.int64)
        m = np.int64(s[r, 0])
        for t in range(n):
            x[t] = np.int64(s[r, t])
            if x[t] > m:
                m = x[t]
        for t in range(n):
            x[t] = round_shift((x[t] - m) * np.int64(score_mult), score_shift)
        softmax_q(x, pr)
        for t in range(n):
            p[r, t] = np.float64(pr[t])
        for t in range(n, T):
            p[r, t] = 0.0


@njit(cache=True)
def requant_rows(o, out_mult, out_shift, out):
    """``out = sat8(round_half_up(o * out_mult / 2**out_shift))`` of exact integer sums
    ``o`` (float64 ``[R, Dv]``) into int8 ``out[R, Dv]``."""
    R, D = o.shape
    for r in range(R):
        for d in range(D):
            out[r, d] = sat8(round_shift(np.int64(o[r, d]) * np.int64(out_mult), out_shift))


def blas_bounds(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.dtype | None:
    """The float type the scores' sums are exact in (float32 or float64) for these int8
    operands, or None when a sum could leave float64's exact range (the integer kernel
    runs instead)."""
    dk, T = q.shape[2], k.shape[0]
    if q.dtype == k.dtype == v.dtype == np.int8:  # |int8| <= 128: no scan when that fits
        worst = exact_float(dk * 128 * 128)
        if worst == np.float32 and exact_float(T * P_MAX * 128) is not None:
            return worst  # the narrowest type: a scan could not choose another
    if exact_float(T * P_MAX * absmax(v)) is None:  # P x V sums in float64
        return None
    return exact_float(dk * absmax(q) * absmax(k))


def attention_blas(q, k, v, pos, score_mult, score_shift, out_mult, out_shift, out,
                   score_type) -> None:
    """:func:`attention`'s integers on float BLAS (``score_type`` from
    :func:`blas_bounds`): the same int8 ``out``, bit for bit. BLAS runs on one thread
    here (the softmax between the products uses Numba's threads): measured on a shared
    2-core machine, OpenBLAS's own threads on these ``(384 x 64) x (64 x T)`` products
    cost 3-4x the CPU time of one thread once the cores are oversubscribed."""
    with blas_one_thread():
        _attention_blas(q, k, v, pos, score_mult, score_shift, out_mult, out_shift, out,
                        score_type)


def _attention_blas(q, k, v, pos, score_mult, score_shift, out_mult, out_shift, out,
                    score_type) -> None:
    L, H, dk = q.shape
    T, KH, dv = v.shape
    group = H // KH
    for kh in range(KH):
        kf = np.ascontiguousarray(k[:, kh, :], dtype=score_type)
        vf = np.ascontiguousarray(v[:, kh, :], dtype=np.float64)
        qh = q[:, kh * group:(kh + 1) * group, :]
        for i0 in range(0, L, QUERY_BLOCK):
            i1 = min(L, i0 + QUERY_BLOCK)
            seen = min(T, pos + i1)  # keys the block's last query sees
            rows = np.ascontiguousarray(qh[i0:i1], dtype=score_type).reshape(-1, dk)
            scores = rows @ kf[:seen].T
            probs = np.empty((rows.shape[0], seen), np.float64)
            if seen:
                probs_rows(scores, i0, group, pos, score_mult, score_shift, probs)
                o = probs @ vf[:seen]
            else:
                o = np.zeros((rows.shape[0], dv), np.float64)
            blk = np.empty((rows.shape[0], dv), np.int8)
            requant_rows(o, out_mult, out_shift, blk)
            out[i0:i1, kh * group:(kh + 1) * group, :] = blk.reshape(i1 - i0, group, dv)


def key_weights(q: np.ndarray, k: np.ndarray, *, pos: int, score_mult: int,
                score_shift: int, from_pos: int = 0) -> np.ndarray:
    """The attention weight each key gets, summed over the queries at positions
    ``>= from_pos`` and every head (float64 ``[T]``, in units of probability): the same
    Q24 probabilities :func:`attention` computes (an attention unit could accumulate them
    beside its softmax; kvsim's score readout for evictions)."""
    L, H, dk = q.shape
    T, KH, _ = k.shape
    group = H // KH
    out = np.zeros(T, np.float64)
    i0 = max(0, from_pos - pos)
    if i0 >= L or T == 0:
        return out
    score_type = exact_float(dk * 128 * 128) or np.dtype(np.float64)  # |int8| <= 128
    for kh in range(KH):
        rows = np.ascontiguousarray(q[i0:, kh * group:(kh + 1) * group, :],
                                    dtype=score_type).reshape(-1, dk)
        seen = min(T, pos + L)
        scores = rows @ np.ascontiguousarray(k[:seen, kh, :], dtype=score_type).T
        probs = np.empty((rows.shape[0], seen), np.float64)
        probs_rows(scores, i0, group, pos, score_mult, score_shift, probs)
        out[:seen] += probs.sum(axis=0) / P_MAX
    return out


def attend(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    pos: int,
    score_mult: int,
    score_shift: int,
    out_mult: int,
    out_shift: int,
) -> np.ndarray:
    """Checked wrapper of :func:`attention` (threads for large calls; large calls whose
    sums fit a float format exactly on float BLAS, :func:`attention_blas`); returns int8
    ``[L, H, Dv]``."""
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
        raise ValueError("attention: q, k, v must be 3-D [tokens, heads, dim]")
    L, H, dk = q.shape
    T, KH, dk2 = k.shape
    if dk2 != dk or v.shape[:2] != (T, KH):
        raise ValueError(f"attention: shapes q{q.shape} k{k.shape} v{v.shape} do not match")
    if KH == 0 or H % KH:
        raise ValueError(f"attention: {H} query heads is not a multiple of {KH} KV heads")
    if pos < 0 or score_shift < 0 or out_shift < 0:
        raise ValueError("attention: pos and shifts must be >= 0")
    out = np.empty((L, H, v.shape[2]), np.int8)
    args = (q, k, v, pos, score_mult, score_shift, out_mult, out_shift, out)
    score_type = blas_bounds(q, k, v) if L * H * T >= BLAS_MIN_SCORES else None
    if score_type is not None:
        attention_blas(*args, score_type)
        return out
    macs = L * H * T * (dk + v.shape[2])
    threads = numba.get_num_threads()
    if macs >= PARALLEL_MIN_MACS and threads > 1 and L * H > 1:
        attention_par(*args, min(threads, L * H))
    else:
        attention(*args)
    return out


def attention_mla(
    q: np.ndarray,
    cache: np.ndarray,
    *,
    v_dim: int,
    pos: int,
    score_mult: int,
    score_shift: int,
    out_mult: int,
    out_shift: int,
) -> np.ndarray:
    """MLA attention (absorbed form): q int8[L, H, Dk] (latent query ``q_nope @ W_UK`` and
    RoPE query, concatenated), cache int8[T, Dk] (latent ``c_kv`` then RoPE key). The value
    is the first ``v_dim`` columns of the same cache; returns int8 ``[L, H, v_dim]`` (the
    latent output, before ``W_UV``)."""
    if cache.ndim != 2 or not 0 < v_dim <= cache.shape[1]:
        raise ValueError(f"attention_mla: cache {cache.shape} and v_dim {v_dim} do not fit")
    k = cache[:, None, :]
    v = cache[:, None, :v_dim]
    return attend(q, k, v, pos=pos, score_mult=score_mult, score_shift=score_shift,
                  out_mult=out_mult, out_shift=out_shift)
