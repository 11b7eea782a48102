"""fp16 attention of the dequantize-on-read path (``attn.dq``): fp16 operands, fp32
accumulation, a float softmax, int8 output.

Operands arrive as float32 arrays holding fp16 values (the vector unit's dequant pass
rounds them, :mod:`isa.semantics`). For query ``i`` (position ``pos + i``), head ``h``
(KV head ``h // (H/KH)``), over the tokens ``t < n_i = min(ctx, pos + i + 1)``:

    s_t = fp32(sum_d q[i, h, d] * k[t, kvh, d]) * scale     (fp32, d in order)
    e_t = exp(s_t - max_t s_t),  Z = sum_t e_t                (fp32, t in order)
    o_d = (sum_t e_t * v[t, kvh, d]) / Z                      (fp32)
    out = sat8(floor(o_d * out_scale + 1/2))

Every sum runs in a fixed order in one thread per (query, head), so results do not depend
on the thread count.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

#: Below this many multiply-accumulates the kernel stays on one thread.
PARALLEL_MIN_MACS = 1 << 20


@njit(cache=True)
def _attend_fp_range(q, kt, v, pos, scale, out_scale, out, lo, hi):
    """Jobs ``lo .. hi-1`` ((query, head) pairs); ``kt`` is K transposed, ``[KH, Dk, T]``.

    Each sum runs in the order the module docstring gives (a score over ``d`` in order,
    ``Z`` and each output over ``t`` in order), but the loops run across the independent
    sums (a score per key, an output per channel), so they vectorize over contiguous
    memory without reordering any one sum's additions."""
    L, H, dk = q.shape
    T, KH, dv = v.shape
    group = H // KH
    e = np.empty(T, np.float32)
    o = np.empty(dv, np.float32)
    for job in range(lo, hi):
        i = job // H
        h = job % H
        kh = h // group
        n = min(T, pos + i + 1)
        if n <= 0:
            for d in range(dv):
                out[i, h, d] = 0
            continue
        for t in range(n):
            e[t] = np.float32(0.0)
        for d in range(dk):
            qd = q[i, h, d]
            for t in range(n):
                e[t] = np.float32(e[t] + qd * kt[kh, d, t])
        m = np.float32(-np.inf)
        for t in range(n):
            e[t] = np.float32(e[t] * scale)
            if e[t] > m:
                m = e[t]
        z = np.float32(0.0)
        for t in range(n):
            e[t] = np.float32(np.exp(np.float32(e[t] - m)))
            z = np.float32(z + e[t])
        for d in range(dv):
            o[d] = np.float32(0.0)
        for t in range(n):
            et = e[t]
            for d in range(dv):
                o[d] = np.float32(o[d] + et * v[t, kh, d])
        for d in range(dv):
            x = np.floor(np.float32(o[d] / z) * out_scale + np.float32(0.5))
            if not x >= -128.0:  # NaN reads as -128 only if it ever occurs; see attend_fp
                x = -128.0
            if x > 127.0:
                x = 127.0
            out[i, h, d] = np.int8(x)


@njit(cache=True)
def attention_fp(q, kt, v, pos, scale, out_scale, out):
    """q float32[L, H, Dk], kt float32[KH, Dk, T] (K transposed), v float32[T, KH, Dv]
    -> int8 out."""
    _attend_fp_range(q, kt, v, pos, scale, out_scale, out, 0, q.shape[0] * q.shape[1])


@njit(cache=True, parallel=True)
def attention_fp_par(q, kt, v, pos, scale, out_scale, out, chunks):
    """:func:`attention_fp` with the (query, head) pairs split over threads."""
    jobs = q.shape[0] * q.shape[1]
    step = (jobs + chunks - 1) // chunks
    for c in prange(chunks):
        _attend_fp_range(q, kt, v, pos, scale, out_scale, out, c * step,
                         min(jobs, (c + 1) * step))


def attend_fp(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, pos: int, scale: float,
              out_scale: float) -> np.ndarray:
    """Checked wrapper of :func:`attention_fp`; int8 ``[L, H, Dv]``. Non-finite operands
    are refused (a NaN would otherwise pass as a number)."""
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
        raise ValueError("attn.dq: q, k, v must be 3-D [tokens, heads, dim]")
    L, H, dk = q.shape
    T, KH, dk2 = k.shape
    if dk2 != dk or v.shape[:2] != (T, KH) or KH == 0 or H % KH or pos < 0:
        raise ValueError(f"attn.dq: shapes q{q.shape} k{k.shape} v{v.shape} (pos {pos}) "
                         "do not match")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not np.all(np.isfinite(x)):
            raise ValueError(f"attn.dq: {name} holds non-finite values after the fp16 "
                             "conversion (a scale too large for fp16?)")
    q, v = (np.ascontiguousarray(x, np.float32) for x in (q, v))
    kt = np.ascontiguousarray(k.transpose(1, 2, 0), np.float32)  # [KH, Dk, T]
    out = np.empty((L, H, v.shape[2]), np.int8)
    args = (q, kt, v, pos, np.float32(scale), np.float32(out_scale), out)
    threads = numba.get_num_threads()
    if L * H * T * (dk + v.shape[2]) >= PARALLEL_MIN_MACS and threads > 1 and L * H > 1:
        attention_fp_par(*args, min(threads, L * H))
    else:
        attention_fp(*args)
    return out


def key_weights_fp(q: np.ndarray, k: np.ndarray, *, pos: int, scale: float,
                   from_pos: int = 0) -> np.ndarray:
    """The attention weight each key gets under the float softmax of this path, summed
    over the queries at positions ``>= from_pos`` and every head (float64 ``[T]``; the
    products in float64: a readout of the scores, not the kernel's exact float32 sums)."""
    L, H, dk = q.shape
    T, KH, _ = k.shape
    group = H // KH
    out = np.zeros(T, np.float64)
    i0 = max(0, from_pos - pos)
    seen = min(T, pos + L)
    if i0 >= L or seen == 0:
        return out
    qpos = pos + np.arange(i0, L)
    mask = np.arange(seen)[None, :] > qpos[:, None]
    for h in range(H):
        s = (q[i0:, h, :].astype(np.float64) @ k[:seen, h // group, :].astype(np.float64).T
             ) * scale
        s[mask] = -np.inf
        e = np.exp(s - s.max(axis=1, keepdims=True))
        out[:seen] += (e / e.sum(axis=1, keepdims=True)).sum(axis=0)
    return out
