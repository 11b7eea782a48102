"""Dequantize-on-read of KV-cache codes: the values a vector unit hands to fp16 attention.

The integer read path (:mod:`.kvquant`) dequantizes a group onto the int8 grid it was
written on, ``sat8(round(v'))``; this path keeps the exact dequantized value ``v'`` in
Q24 fixed point (``Q`` = 24 fractional bits of an int8-grid unit), before any rounding:

- symmetric: ``v'Q = code * sQ``; float zero: ``v'Q = code * sQ + zQ``; integer zero
  point: ``v'Q = (code - zp) * sQ`` (``sQ``, ``zQ`` the stored fp16/bf16 scale and zero
  in Q24, as :func:`.kvquant.dequant_group` uses);
- full-precision records (fp16/bf16): the stored value in Q24 (:func:`.fpbits.bits_to_q`);
- raw int8: ``v << 24``.

``sat8(round_half_up(v'Q / 2**24))`` of this is exactly the integer path's value (a test
checks it for every format); the attention instruction ``attn.dq`` turns ``v'Q * 2**-24``
times the tensor's static scale into fp16.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .fpbits import BF16, FP16, Q, bits_to_q
from .kvquant import ZK_BF16, ZK_FP16, ZK_NONE


@njit(cache=True)
def dequant_group_q24(codes, bits, zk, sk, sb, zero, out):
    """One group's ``codes[n]`` -> int64 Q24 values ``out[n]`` (see the module docstring)."""
    n = codes.shape[0]
    s = bits_to_q(sb, sk)
    mask = (1 << bits) - 1
    if zk == ZK_NONE:
        half = 1 << (bits - 1)
        for i in range(n):
            c = np.int64(codes[i]) & mask
            if c >= half:
                c -= 1 << bits
            out[i] = c * s
    elif zk == ZK_FP16 or zk == ZK_BF16:
        zq = bits_to_q(zero, FP16 if zk == ZK_FP16 else BF16)
        for i in range(n):
            out[i] = (np.int64(codes[i]) & mask) * s + zq
    else:
        for i in range(n):
            out[i] = ((np.int64(codes[i]) & mask) - zero) * s


@njit(cache=True)
def dequant_tokens_q24(codes, c0, c1, group, bits, zk, sk, scales, zeros, g_off, out):
    """Per-token groups over channels ``[c0, c1)`` into int64 ``out[T, W]``."""
    for t in range(codes.shape[0]):
        g = 0
        lo = c0
        while lo < c1:
            hi = min(c1, lo + group)
            dequant_group_q24(codes[t, lo:hi], bits, zk, sk, scales[t, g_off + g],
                              zeros[t, g_off + g], out[t, lo:hi])
            g += 1
            lo = hi


@njit(cache=True)
def dequant_channels_q24(codes, group, bits, zk, sk, scales, zeros, out):
    """Per-channel groups of ``group`` tokens into int64 ``out[B*group, W]``."""
    for b in range(codes.shape[0] // group):
        t0 = b * group
        for c in range(codes.shape[1]):
            dequant_group_q24(codes[t0:t0 + group, c], bits, zk, sk, scales[b, c],
                              zeros[b, c], out[t0:t0 + group, c])


@njit(cache=True)
def fp_bits_to_q24(bits, kind, out):
    """fp16/bf16 patterns ``[T, W]`` -> int64 Q24 (saturating as :func:`bits_to_q`)."""
    for t in range(bits.shape[0]):
        for c in range(bits.shape[1]):
            out[t, c] = bits_to_q(bits[t, c], kind)


def raw_int8_to_q24(codes: np.ndarray) -> np.ndarray:
    """Raw int8 records (uint8 storage) -> int64 Q24."""
    return codes.view(np.int8).astype(np.int64) << Q
