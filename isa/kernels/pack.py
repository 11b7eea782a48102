"""Bit packing of 2-, 4- and 8-bit codes, LSB first.

Layout: code ``i`` of a row occupies bits ``[i*b, (i+1)*b)`` of the row's little-endian
bit stream, so with ``b = 4`` element ``2i`` is the low nibble of byte ``i`` and ``2i+1``
the high nibble (QServe, the Gemm int4 ``w`` operand), and with ``b = 2`` byte ``i`` holds
codes ``4i..4i+3`` from its lowest bits up. Read as little-endian int32 words this is
KIVI's "32/b codes per int32, LSB first". A row of ``n`` codes takes ``ceil(n*b/8)``
bytes; the unused high bits of its last byte are zero when packing and ignored when
unpacking.

Codes are unsigned ``b``-bit fields (``uint8`` holding ``0 .. 2**b - 1``; higher bits of a
code are ignored). Signed values go through :func:`pack_int4` / :func:`unpack_int4`
(two's complement nibbles) or are masked by the caller.
"""

from __future__ import annotations

import numpy as np
from numba import njit


def packed_bytes(n: int, bits: int) -> int:
    """Bytes of one packed row of ``n`` codes of ``bits`` bits."""
    return (n * bits + 7) // 8


@njit(cache=True)
def pack_row(codes, bits, out):
    """Pack ``codes`` (uint8[n]) into ``out`` (uint8[ceil(n*bits/8)]), ``bits`` in 2, 4, 8."""
    n = codes.shape[0]
    if bits == 8:
        for i in range(n):
            out[i] = codes[i]
    elif bits == 4:
        full = n // 2
        for j in range(full):
            out[j] = (codes[2 * j] & 15) | ((codes[2 * j + 1] & 15) << 4)
        if n % 2:
            out[full] = codes[n - 1] & 15
    else:  # 2
        full = n // 4
        for j in range(full):
            out[j] = (
                (codes[4 * j] & 3)
                | ((codes[4 * j + 1] & 3) << 2)
                | ((codes[4 * j + 2] & 3) << 4)
                | ((codes[4 * j + 3] & 3) << 6)
            )
        rem = n - 4 * full
        if rem:
            b = 0
            for t in range(rem):
                b |= (codes[4 * full + t] & 3) << (2 * t)
            out[full] = b


@njit(cache=True)
def unpack_row(buf, bits, n, out):
    """Unpack ``n`` codes of ``bits`` bits from ``buf`` into ``out`` (uint8[n])."""
    if bits == 8:
        for i in range(n):
            out[i] = buf[i]
    elif bits == 4:
        full = n // 2
        for j in range(full):
            b = buf[j]
            out[2 * j] = b & 15
            out[2 * j + 1] = b >> 4
        if n % 2:
            out[n - 1] = buf[full] & 15
    else:  # 2
        full = n // 4
        for j in range(full):
            b = buf[j]
            out[4 * j] = b & 3
            out[4 * j + 1] = (b >> 2) & 3
            out[4 * j + 2] = (b >> 4) & 3
            out[4 * j + 3] = b >> 6
        for t in range(n - 4 * full):
            out[4 * full + t] = (buf[full] >> (2 * t)) & 3


@njit(cache=True)
def pack_rows(codes, bits, out):
    """Row-wise :func:`pack_row`: ``codes`` uint8[r, n] -> ``out`` uint8[r, ceil(n*bits/8)]."""
    for r in range(codes.shape[0]):
        pack_row(codes[r], bits, out[r])


@njit(cache=True)
def unpack_rows(buf, bits, n, out):
    """Row-wise :func:`unpack_row`: ``buf`` uint8[r, ceil(n*bits/8)] -> ``out`` uint8[r, n]."""
    for r in range(buf.shape[0]):
        unpack_row(buf[r], bits, n, out[r])


@njit(cache=True)
def pack_int4(vals, out):
    """Signed int4 values (int8[r, k] in [-8, 7]; higher bits ignored) -> two's complement
    nibbles ``out`` uint8[r, ceil(k/2)], element ``2i`` in the low nibble."""
    r, k = vals.shape
    full = k // 2
    for i in range(r):
        for j in range(full):
            out[i, j] = np.uint8((vals[i, 2 * j] & 15) | ((vals[i, 2 * j + 1] & 15) << 4))
        if k % 2:
            out[i, full] = np.uint8(vals[i, k - 1] & 15)


@njit(cache=True)
def unpack_int4(buf, k, out):
    """Two's complement nibbles ``buf`` uint8[r, ceil(k/2)] -> int8 ``out`` [r, k]."""
    r = buf.shape[0]
    full = k // 2
    for i in range(r):
        for j in range(full):
            b = np.int32(buf[i, j])
            out[i, 2 * j] = np.int8(((b & 15) ^ 8) - 8)
            out[i, 2 * j + 1] = np.int8(((b >> 4) ^ 8) - 8)
        if k % 2:
            out[i, k - 1] = np.int8(((np.int32(buf[i, full]) & 15) ^ 8) - 8)
