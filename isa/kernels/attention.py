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

from .fixed import round_shift, sat8
from .softmax import softmax_q

#: Below this many multiply-accumulates an attention call stays on one thread.
PARALLEL_MIN_MACS = 1 << 20


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
    """Checked wrapper of :func:`attention` (threads for large calls); returns int8
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
    macs = L * H * T * (dk + v.shape[2])
    threads = numba.get_num_threads()
    args = (q, k, v, pos, score_mult, score_shift, out_mult, out_shift, out)
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
