"""Group quantization of int8 KV values to 2/4/8-bit codes, and the byte records they live in.

A *group* is a run of int8 values sharing one scale (and zero): ``G`` channels of one token
(per-token groups) or ``G`` tokens of one channel (per-channel groups). Its scale ``s`` is
stored as an fp16/bf16 pattern (:mod:`.fpbits`); every rule below uses the *stored*
(rounded) scale, so quantization and dequantization agree exactly. Integers only; ``sQ``
and ``zQ`` are the stored scale and float zero in Q24 (exact for fp16, and for bf16 scales
made from int8 ranges). ``round`` is round half up, ``qmax = 2**b - 1``.

- symmetric (``zk = ZK_NONE``): ``qpos = 2**(b-1) - 1``, ``s = fp(max|v| / qpos)``,
  ``code = clamp(round(v / s), -qpos, qpos)`` stored as a b-bit two's complement field
  (the most negative field value is never produced), ``v' = code * s``.
- asymmetric with a float zero (``ZK_FP16``/``ZK_BF16``, KIVI, QServe): ``z = fp(min v)``
  (exact), ``s = fp((max - min) / qmax)``, ``code = clamp(round((v - z) / s), 0, qmax)``,
  ``v' = code * s + z``.
- asymmetric with an integer zero point (``ZK_U8``/``ZK_I8``, QuantMLA): the range is
  widened to include 0 (``lo = min(min v, 0)``, ``hi = max(max v, 0)``),
  ``s = fp((hi - lo) / qmax)``, ``zp = clamp(round(-lo / s), zmin, zmax)`` (dtype range),
  ``code = clamp(round(v / s) + zp, 0, qmax)``, ``v' = (code - zp) * s``.
- a group whose scale is 0 (all values equal for a float zero; all zero otherwise) gets
  code 0 everywhere and reads back as ``z`` (float zero) or 0.

Dequantization back to the int8 grid: ``out = sat8(round(v'))`` computed as
``sat8(round_half_up(v'Q / 2**24))``.

Quantizing dequantized values need not give the codes back: with an integer zero point a
dequantized group spans the (rounded) grid points ``(c - zp) * s`` of its extreme codes, not
``[lo, hi]``, so ``s``, ``zp`` and the codes come out anew. :mod:`isa.kv.region` keeps a
token's record rather than re-quantizing what it reads back (truncations).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .fixed import round_shift, sat8
from .fpbits import BF16, FP16, Q, bits_to_q, int_to_bits, ratio_to_bits
from .pack import pack_row, unpack_row

ZK_NONE = 0
ZK_FP16 = 1
ZK_BF16 = 2
ZK_U8 = 3
ZK_I8 = 4

__all__ = ["BF16", "FP16", "ZK_BF16", "ZK_FP16", "ZK_I8", "ZK_NONE", "ZK_U8"]


@njit(cache=True)
def quant_group(vals, bits, zk, sk, codes):
    """Quantize one group (int8 ``vals[n]``, n >= 1) into unsigned b-bit fields ``codes[n]``;
    returns ``(scale_bits, zero)`` (``zero``: float zero bits, integer zero point, or 0)."""
    n = vals.shape[0]
    qmax = (1 << bits) - 1
    if zk == ZK_NONE:
        qpos = (1 << (bits - 1)) - 1
        amax = 0
        for i in range(n):
            a = abs(np.int64(vals[i]))
            if a > amax:
                amax = a
        sb = ratio_to_bits(amax, qpos, sk)
        s = bits_to_q(sb, sk)
        for i in range(n):
            c = 0
            if s > 0:
                c = (2 * (np.int64(vals[i]) << Q) + s) // (2 * s)
                if c > qpos:
                    c = qpos
                elif c < -qpos:
                    c = -qpos
            codes[i] = c & qmax
        return sb, np.int64(0)
    lo = np.int64(vals[0])
    hi = lo
    for i in range(1, n):
        v = np.int64(vals[i])
        if v < lo:
            lo = v
        if v > hi:
            hi = v
    if zk == ZK_FP16 or zk == ZK_BF16:
        zkind = FP16 if zk == ZK_FP16 else BF16
        zb = int_to_bits(lo, zkind)
        zq = bits_to_q(zb, zkind)
        sb = ratio_to_bits(hi - lo, qmax, sk)
        s = bits_to_q(sb, sk)
        for i in range(n):
            c = 0
            if s > 0:
                c = (2 * ((np.int64(vals[i]) << Q) - zq) + s) // (2 * s)
                if c > qmax:
                    c = qmax
                elif c < 0:
                    c = 0
            codes[i] = c
        return sb, np.int64(zb)
    # integer zero point
    if lo > 0:
        lo = np.int64(0)
    if hi < 0:
        hi = np.int64(0)
    zmin = 0 if zk == ZK_U8 else -128
    zmax = 255 if zk == ZK_U8 else 127
    sb = ratio_to_bits(hi - lo, qmax, sk)
    s = bits_to_q(sb, sk)
    zp = np.int64(0)
    if s > 0:
        zp = (2 * ((-lo) << Q) + s) // (2 * s)
        if zp > zmax:
            zp = np.int64(zmax)
        elif zp < zmin:
            zp = np.int64(zmin)
    for i in range(n):
        c = np.int64(0)
        if s > 0:
            c = (2 * (np.int64(vals[i]) << Q) + s) // (2 * s) + zp
        if c > qmax:
            c = qmax
        elif c < 0:
            c = 0
        codes[i] = c
    return sb, zp


@njit(cache=True)
def dequant_group(codes, bits, zk, sk, sb, zero, out):
    """Inverse of :func:`quant_group` onto the int8 grid: ``out[n]`` int8."""
    n = codes.shape[0]
    s = bits_to_q(sb, sk)
    if zk == ZK_NONE:
        half = 1 << (bits - 1)
        for i in range(n):
            c = np.int64(codes[i]) & ((1 << bits) - 1)
            if c >= half:
                c -= 1 << bits
            out[i] = sat8(round_shift(c * s, Q))
    elif zk == ZK_FP16 or zk == ZK_BF16:
        zq = bits_to_q(zero, FP16 if zk == ZK_FP16 else BF16)
        for i in range(n):
            c = np.int64(codes[i]) & ((1 << bits) - 1)
            out[i] = sat8(round_shift(c * s + zq, Q))
    else:
        for i in range(n):
            c = np.int64(codes[i]) & ((1 << bits) - 1)
            out[i] = sat8(round_shift((c - zero) * s, Q))


@njit(cache=True)
def quant_tokens(x, c0, c1, group, bits, zk, sk, codes, scales, zeros, g_off):
    """Per-token groups over channels ``[c0, c1)`` of int8 ``x[T, W]``: groups of ``group``
    channels (the last may be shorter) write ``scales``/``zeros`` columns ``g_off + g``."""
    for t in range(x.shape[0]):
        g = 0
        lo = c0
        while lo < c1:
            hi = min(c1, lo + group)
            sb, z = quant_group(x[t, lo:hi], bits, zk, sk, codes[t, lo:hi])
            scales[t, g_off + g] = sb
            zeros[t, g_off + g] = z
            g += 1
            lo = hi


@njit(cache=True)
def dequant_tokens(codes, c0, c1, group, bits, zk, sk, scales, zeros, g_off, out):
    """Inverse of :func:`quant_tokens` into int8 ``out[T, W]``."""
    for t in range(codes.shape[0]):
        g = 0
        lo = c0
        while lo < c1:
            hi = min(c1, lo + group)
            dequant_group(codes[t, lo:hi], bits, zk, sk, scales[t, g_off + g],
                          zeros[t, g_off + g], out[t, lo:hi])
            g += 1
            lo = hi


@njit(cache=True)
def quant_channels(x, group, bits, zk, sk, codes, scales, zeros):
    """Per-channel groups: int8 ``x[B*group, W]`` -> ``codes`` and ``scales``/``zeros``
    ``[B, W]`` (block ``b`` holds tokens ``b*group .. b*group + group - 1``)."""
    nb = x.shape[0] // group
    for b in range(nb):
        t0 = b * group
        for c in range(x.shape[1]):
            sb, z = quant_group(x[t0:t0 + group, c], bits, zk, sk, codes[t0:t0 + group, c])
            scales[b, c] = sb
            zeros[b, c] = z


@njit(cache=True)
def dequant_channels(codes, group, bits, zk, sk, scales, zeros, out):
    """Inverse of :func:`quant_channels` into int8 ``out[B*group, W]``."""
    nb = codes.shape[0] // group
    for b in range(nb):
        t0 = b * group
        for c in range(codes.shape[1]):
            dequant_group(codes[t0:t0 + group, c], bits, zk, sk, scales[b, c], zeros[b, c],
                          out[t0:t0 + group, c])


@njit(cache=True, inline="always")
def _put(out, off, value, nbytes):
    """Little-endian ``nbytes`` of ``value`` at ``out[off:]``."""
    for i in range(nbytes):
        out[off + i] = (np.int64(value) >> (8 * i)) & 0xFF


@njit(cache=True, inline="always")
def _get(buf, off, nbytes, signed):
    v = np.int64(0)
    for i in range(nbytes):
        v |= np.int64(buf[off + i]) << (8 * i)
    if signed and nbytes > 0 and v >= (np.int64(1) << (8 * nbytes - 1)):
        v -= np.int64(1) << (8 * nbytes)
    return v


@njit(cache=True)
def pack_token_records(codes, scales, zeros, wc, bits, rbits, sbytes, zbytes, rec, out):
    """Per-token records into ``out`` (uint8[T * rec], zero-filled padding): content codes
    (``codes[t, :wc]`` at ``bits``), RoPE codes (``codes[t, wc:]`` at ``rbits``), each bit
    stream starting on a byte; then ``scales[t, :]`` (``sbytes`` each, little-endian); then
    ``zeros[t, :]`` (``zbytes`` each); then padding to ``rec`` bytes."""
    T, W = codes.shape
    ng = scales.shape[1]
    cb = (wc * bits + 7) // 8
    rb = ((W - wc) * rbits + 7) // 8
    for t in range(T):
        off = t * rec
        for i in range(rec):
            out[off + i] = 0
        pack_row(codes[t, :wc], bits, out[off:off + cb])
        if W > wc:
            pack_row(codes[t, wc:], rbits, out[off + cb:off + cb + rb])
        o = off + cb + rb
        for g in range(ng):
            _put(out, o, scales[t, g], sbytes)
            o += sbytes
        for g in range(ng):
            _put(out, o, zeros[t, g], zbytes)
            o += zbytes


@njit(cache=True)
def unpack_token_records(buf, wc, bits, rbits, sbytes, zbytes, zsigned, rec, codes, scales,
                         zeros):
    """Inverse of :func:`pack_token_records` (padding ignored)."""
    T, W = codes.shape
    ng = scales.shape[1]
    cb = (wc * bits + 7) // 8
    rb = ((W - wc) * rbits + 7) // 8
    for t in range(T):
        off = t * rec
        unpack_row(buf[off:off + cb], bits, wc, codes[t, :wc])
        if W > wc:
            unpack_row(buf[off + cb:off + cb + rb], rbits, W - wc, codes[t, wc:])
        o = off + cb + rb
        for g in range(ng):
            scales[t, g] = _get(buf, o, sbytes, False)
            o += sbytes
        for g in range(ng):
            zeros[t, g] = _get(buf, o, zbytes, zsigned)
            o += zbytes


@njit(cache=True)
def pack_channel_blocks(codes, scales, zeros, group, bits, sbytes, zbytes, blk, out):
    """Per-channel blocks of ``group`` tokens into ``out`` (uint8[B * blk]): for each
    channel ``c`` in order, the bit stream of its ``group`` codes (``ceil(group*bits/8)``
    bytes); then ``scales[b, :]``; then ``zeros[b, :]``; then padding to ``blk`` bytes."""
    B = scales.shape[0]
    W = codes.shape[1]
    cb = (group * bits + 7) // 8
    col = np.empty(group, np.uint8)
    for b in range(B):
        off = b * blk
        for i in range(blk):
            out[off + i] = 0
        for c in range(W):
            for t in range(group):
                col[t] = codes[b * group + t, c]
            pack_row(col, bits, out[off + c * cb:off + (c + 1) * cb])
        o = off + W * cb
        for c in range(W):
            _put(out, o, scales[b, c], sbytes)
            o += sbytes
        for c in range(W):
            _put(out, o, zeros[b, c], zbytes)
            o += zbytes


@njit(cache=True)
def unpack_channel_blocks(buf, group, bits, sbytes, zbytes, zsigned, blk, codes, scales,
                          zeros):
    """Inverse of :func:`pack_channel_blocks`."""
    B = scales.shape[0]
    W = codes.shape[1]
    cb = (group * bits + 7) // 8
    col = np.empty(group, np.uint8)
    for b in range(B):
        off = b * blk
        for c in range(W):
            unpack_row(buf[off + c * cb:off + (c + 1) * cb], bits, group, col)
            for t in range(group):
                codes[b * group + t, c] = col[t]
        o = off + W * cb
        for c in range(W):
            scales[b, c] = _get(buf, o, sbytes, False)
            o += sbytes
        for c in range(W):
            zeros[b, c] = _get(buf, o, zbytes, zsigned)
            o += zbytes


@njit(cache=True)
def int8_to_fp_bits(x, kind, out):
    """int8 ``x[T, W]`` -> exact fp16/bf16 patterns ``out`` uint16[T, W]."""
    for t in range(x.shape[0]):
        for c in range(x.shape[1]):
            out[t, c] = int_to_bits(np.int64(x[t, c]), kind)


@njit(cache=True)
def fp_bits_to_int8(bits, kind, out):
    """fp16/bf16 patterns -> nearest integer (round half up), saturated to int8; NaN -> 0."""
    for t in range(bits.shape[0]):
        for c in range(bits.shape[1]):
            out[t, c] = sat8(round_shift(bits_to_q(bits[t, c], kind), Q))


@njit(cache=True)
def pack_fp_records(bits, rec, out):
    """uint16 patterns ``bits[T, W]`` -> records of ``rec`` bytes (little-endian values,
    then zero padding)."""
    T, W = bits.shape
    for t in range(T):
        off = t * rec
        for i in range(rec):
            out[off + i] = 0
        for c in range(W):
            out[off + 2 * c] = bits[t, c] & 0xFF
            out[off + 2 * c + 1] = bits[t, c] >> 8


@njit(cache=True)
def unpack_fp_records(buf, rec, out):
    """Inverse of :func:`pack_fp_records` into uint16 ``out[T, W]``."""
    T, W = out.shape
    for t in range(T):
        off = t * rec
        for c in range(W):
            out[t, c] = np.uint16(buf[off + 2 * c]) | (np.uint16(buf[off + 2 * c + 1]) << 8)
