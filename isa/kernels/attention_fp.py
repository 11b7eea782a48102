"""fp16 attention of the dequantize-on-read path (``attn.dq``): fp16 operands, fp32
accumulation, a float softmax, int8 output.

Operands arrive as float32 arrays holding fp16 values (the vector unit's dequant pass
rounds them, :mod:`isa.semantics`). For query ``i`` (position ``pos + i``), head ``h``
(KV head ``h // (H/KH)``), over the tokens ``t < n_i = min(ctx, pos + i + 1)``:

    s_t = fp32(sum_d q[i, h, d] * k[t, kvh, d]) * scale     (fp32, d in order)
    e_t = exp(s_t - max_t s_t),  Z = sum_t e_t                (fp32, t in order)
    o_d = (sum_t e_t * v[t, kvh, d]) / Z                      (fp32)
    out = sat8(floor(o_d * out_scale + 1/2))

Every sum runs in a fixed order in one thread (a block of queries with the heads of one
KV head is a thread's unit of work), so results do not depend on the thread count. The
kernel reads K and V a tile of keys at a time for every (query, head) of a block, four
channels or four keys per pass (each sum still added in order): 1.7x faster than one
(query, head) at a time over the whole cache at 8,192 keys (``python
benchmarks/kernels.py --attention``, a SmolLM2 8K prefill's call: 25 against 44 ms on
one thread, 2026-12-03, the 2-core machine at load ~1).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

#: Below this many multiply-accumulates the kernel stays on one thread.
PARALLEL_MIN_MACS = 1 << 20
#: Keys taken at a time for every (query, head) of a block: a tile of K and of V (64
#: channels of float32: 64 KiB each) stays in the core's L2 while the block reads it.
KEY_TILE = 256
#: Queries per block (with the heads that share a KV head).
QUERY_BLOCK = 8


@njit(cache=True, inline="always")
def _add4(acc, a0, r0, a1, r1, a2, r2, a3, r3, n):
    """``acc[u] += a0*r0[u]``, then ``a1*r1[u]``, ``a2*r2[u]``, ``a3*r3[u]``, each added in
    that order and rounded to float32 (four terms of each sum per pass over ``acc``)."""
    for u in range(n):
        x = np.float32(acc[u] + a0 * r0[u])
        x = np.float32(x + a1 * r1[u])
        x = np.float32(x + a2 * r2[u])
        acc[u] = np.float32(x + a3 * r3[u])


@njit(cache=True)
def _attend_fp_blocks(q, kt, vt, pos, scale, out_scale, out, lo, hi, qblock):
    """Blocks ``lo .. hi-1``: block ``b`` is the queries ``qblock * (b // KH) ..`` (at most
    ``qblock``) with the ``H/KH`` heads of KV head ``b % KH``. ``kt`` is K transposed,
    ``[KH, Dk, T]``; ``vt`` is V ``[KH, T, Dv]``.

    Each sum runs in the order the module docstring gives (a score over ``d`` in order,
    ``Z`` and each output over ``t`` in order). The loops run across independent sums (a
    score per key, an output per channel), so they vectorize over contiguous memory
    without reordering any one sum's additions; the keys are taken a tile of
    :data:`KEY_TILE` at a time for every (query, head) of the block, so each tile of K and
    V is read from memory once per block, not once per (query, head)."""
    L, H, dk = q.shape
    KH, T, dv = vt.shape
    group = H // KH
    jobs = qblock * group
    e = np.empty((jobs, T), np.float32)
    o = np.empty((jobs, dv), np.float32)
    z = np.empty(jobs, np.float32)
    for b in range(lo, hi):
        kh = b % KH
        i0 = (b // KH) * qblock
        nq = min(qblock, L - i0)
        nj = nq * group
        top = min(T, pos + i0 + nq)  # keys seen by the block's last query
        for t0 in range(0, top, KEY_TILE):
            t1 = min(top, t0 + KEY_TILE)
            for j in range(nj):
                i = i0 + j // group
                h = kh * group + j % group
                w = min(t1, T, pos + i + 1) - t0
                if w <= 0:
                    continue
                ej = e[j, t0:t0 + w]  # 1-D views indexed from 0: the loops vectorize
                for u in range(w):
                    ej[u] = np.float32(0.0)
                d = 0
                while d + 4 <= dk:  # four channels per pass over the tile, added in order
                    q0, q1, q2, q3 = q[i, h, d], q[i, h, d + 1], q[i, h, d + 2], q[i, h, d + 3]
                    k0 = kt[kh, d, t0:t0 + w]
                    k1 = kt[kh, d + 1, t0:t0 + w]
                    k2 = kt[kh, d + 2, t0:t0 + w]
                    k3 = kt[kh, d + 3, t0:t0 + w]
                    _add4(ej, q0, k0, q1, k1, q2, k2, q3, k3, w)
                    d += 4
                for dd in range(d, dk):
                    qd = q[i, h, dd]
                    kd = kt[kh, dd, t0:t0 + w]
                    for u in range(w):
                        ej[u] = np.float32(ej[u] + qd * kd[u])
        for j in range(nj):
            n = min(T, pos + i0 + j // group + 1)
            ej = e[j]
            m = np.float32(-np.inf)
            for t in range(n):
                ej[t] = np.float32(ej[t] * scale)
                if ej[t] > m:
                    m = ej[t]
            zj = np.float32(0.0)
            for t in range(n):
                ej[t] = np.float32(np.exp(np.float32(ej[t] - m)))
                zj = np.float32(zj + ej[t])
            z[j] = zj
            oj = o[j]
            for d in range(dv):
                oj[d] = np.float32(0.0)
        for t0 in range(0, top, KEY_TILE):
            t1 = min(top, t0 + KEY_TILE)
            for j in range(nj):
                oj = o[j]
                end = min(t1, T, pos + i0 + j // group + 1)
                t = t0
                while t + 4 <= end:  # four keys per pass over the channels, added in order
                    e0, e1, e2, e3 = e[j, t], e[j, t + 1], e[j, t + 2], e[j, t + 3]
                    v0, v1, v2, v3 = vt[kh, t], vt[kh, t + 1], vt[kh, t + 2], vt[kh, t + 3]
                    _add4(oj, e0, v0, e1, v1, e2, v2, e3, v3, dv)
                    t += 4
                for tt in range(t, end):
                    et = e[j, tt]
                    vr = vt[kh, tt]
                    for d in range(dv):
                        oj[d] = np.float32(oj[d] + et * vr[d])
        for j in range(nj):
            i = i0 + j // group
            h = kh * group + j % group
            if min(T, pos + i + 1) <= 0:
                for d in range(dv):
                    out[i, h, d] = 0
                continue
            for d in range(dv):
                x = np.floor(np.float32(o[j, d] / z[j]) * out_scale + np.float32(0.5))
                if not x >= -128.0:  # NaN reads as -128 only if it ever occurs; see attend_fp
                    x = -128.0
                if x > 127.0:
                    x = 127.0
                out[i, h, d] = np.int8(x)


@njit(cache=True)
def attention_fp(q, kt, vt, pos, scale, out_scale, out):
    """q float32[L, H, Dk], kt float32[KH, Dk, T] (K transposed), vt float32[KH, T, Dv]
    -> int8 out."""
    blocks = vt.shape[0] * ((q.shape[0] + QUERY_BLOCK - 1) // QUERY_BLOCK)
    _attend_fp_blocks(q, kt, vt, pos, scale, out_scale, out, 0, blocks, QUERY_BLOCK)


@njit(cache=True, parallel=True)
def attention_fp_par(q, kt, vt, pos, scale, out_scale, out, chunks):
    """:func:`attention_fp` with the blocks split over threads."""
    blocks = vt.shape[0] * ((q.shape[0] + QUERY_BLOCK - 1) // QUERY_BLOCK)
    step = (blocks + chunks - 1) // chunks
    for c in prange(chunks):
        _attend_fp_blocks(q, kt, vt, pos, scale, out_scale, out, c * step,
                          min(blocks, (c + 1) * step), QUERY_BLOCK)


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
    q = np.ascontiguousarray(q, np.float32)
    kt = np.ascontiguousarray(k.transpose(1, 2, 0), np.float32)  # [KH, Dk, T]
    vt = np.ascontiguousarray(v.transpose(1, 0, 2), np.float32)  # [KH, T, Dv]
    out = np.empty((L, H, v.shape[2]), np.int8)
    args = (q, kt, vt, pos, np.float32(scale), np.float32(out_scale), out)
    threads = numba.get_num_threads()
    blocks = KH * -(-L // QUERY_BLOCK)
    if L * H * T * (dk + v.shape[2]) >= PARALLEL_MIN_MACS and threads > 1 and blocks > 1:
        attention_fp_par(*args, min(threads, blocks))
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
