"""The codec of a KV format: int8 values to records and back.

A *run* is a sequence of consecutive records of one kind: ``"fp"`` (full-precision token
records) or ``"quant"`` (per-token or raw records, or whole per-channel blocks of ``group``
tokens). :func:`quantize` turns int8 ``[tokens, width]`` into codes and metadata
(:class:`QuantizedKV`), :func:`pack` lays them out as the records
:mod:`isa.kv.format` describes, and :func:`unpack` / :func:`dequantize` go back. The
quantization rules themselves are the Numba kernels of :mod:`isa.kernels.kvquant`. Where a
run lives in DRAM is :mod:`isa.kv.region`'s business.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..errors import FormatError
from ..kernels import kvdequant as kdq
from ..kernels import kvquant as kq
from ..kernels.fpbits import BF16, FP16

if TYPE_CHECKING:
    from .format import KVFormat

KINDS = ("fp", "quant")
_FP_KIND = {"fp16": FP16, "bf16": BF16}
_ZK = {"none": kq.ZK_NONE, "fp16": kq.ZK_FP16, "bf16": kq.ZK_BF16, "uint8": kq.ZK_U8,
       "int8": kq.ZK_I8}


@dataclass(frozen=True, eq=False)
class QuantizedKV:
    """One run in quantized form (what :func:`quantize` returns).

    ``codes``: uint8 ``[tokens, width]`` b-bit fields (quant kind); ``scales``: uint16
    patterns, ``[tokens, groups]`` for per-token groups or ``[tokens // group, width]`` for
    per-channel groups (empty for raw int8); ``zeros``: int32 of the same shape (float-zero
    patterns or integer zero points; ``None`` when symmetric); ``fp``: uint16
    ``[tokens, width]`` patterns (fp kind).
    """

    fmt: KVFormat
    kind: str
    tokens: int
    width: int
    codes: np.ndarray | None = None
    scales: np.ndarray | None = None
    zeros: np.ndarray | None = None
    fp: np.ndarray | None = None


def _kind(fmt: KVFormat, kind: str) -> str:
    if kind not in KINDS:
        raise FormatError(f"run kind must be one of {KINDS}, got {kind!r}")
    return "fp" if fmt.bits == 16 else kind


def run_bytes(fmt: KVFormat, kind: str, tokens: int, width: int) -> int:
    """Bytes of ``tokens`` consecutive records of ``kind`` (``"fp"`` or ``"quant"``)."""
    if _kind(fmt, kind) == "fp":
        return tokens * fmt.fp_record_bytes(width)
    if fmt.axis == "channel":
        if tokens % fmt.group:
            raise FormatError(f"{fmt}: a quantized per-channel run holds whole groups of "
                              f"{fmt.group} tokens, got {tokens}")
        return tokens // fmt.group * fmt.block_bytes(width)
    return tokens * fmt.record_bytes(width)


def quantize(fmt: KVFormat, x: np.ndarray, *, kind: str = "quant") -> QuantizedKV:
    """Quantize int8 ``x[tokens, width]`` as one run of ``kind``."""
    x = np.asarray(x)
    if x.ndim != 2 or x.dtype != np.int8:
        raise FormatError(f"{fmt}: quantize takes int8 [tokens, width], "
                          f"got {x.dtype} {x.shape}")
    x = np.ascontiguousarray(x)
    t, w = x.shape
    fmt.check_width(w)
    kind = _kind(fmt, kind)
    if kind == "fp":
        fp = np.empty((t, w), np.uint16)
        kq.int8_to_fp_bits(x, _FP_KIND[fmt.fp_dtype], fp)
        return QuantizedKV(fmt, "fp", t, w, fp=fp)
    if fmt.axis == "none":
        return QuantizedKV(fmt, "quant", t, w, codes=x.view(np.uint8).copy(),
                           scales=np.zeros((t, 0), np.uint16))
    codes = np.zeros((t, w), np.uint8)
    sk = _FP_KIND[fmt.scale_dtype]
    zk = _ZK[fmt.zero_dtype]
    if fmt.axis == "token":
        ng = fmt.groups_per_token(w)
        scales = np.zeros((t, ng), np.uint16)
        zeros = np.zeros((t, ng), np.int32)
        wc = w - fmt.rope_width
        kq.quant_tokens(x, 0, wc, fmt.group, fmt.bits, zk, sk, codes, scales, zeros, 0)
        if fmt.rope_width:
            kq.quant_tokens(x, wc, w, fmt.group, fmt.rope_bits, zk, sk, codes, scales,
                            zeros, -(-wc // fmt.group))
    else:
        run_bytes(fmt, "quant", t, w)  # checks whole groups
        scales = np.zeros((t // fmt.group, w), np.uint16)
        zeros = np.zeros((t // fmt.group, w), np.int32)
        kq.quant_channels(x, fmt.group, fmt.bits, zk, sk, codes, scales, zeros)
    return QuantizedKV(fmt, "quant", t, w, codes=codes, scales=scales,
                       zeros=None if fmt.symmetric else zeros)


def pack(fmt: KVFormat, q: QuantizedKV) -> np.ndarray:
    """The stored bytes (uint8) of a quantized run."""
    t, w = q.tokens, q.width
    out = np.empty(run_bytes(fmt, q.kind, t, w), np.uint8)
    if q.kind == "fp":
        kq.pack_fp_records(q.fp, fmt.fp_record_bytes(w), out)
        return out
    zeros = q.zeros if q.zeros is not None else np.zeros(q.scales.shape, np.int32)
    if fmt.axis == "channel":
        kq.pack_channel_blocks(q.codes, q.scales, zeros, fmt.group, fmt.bits,
                               fmt.scale_bytes, fmt.zero_bytes, fmt.block_bytes(w), out)
    else:
        wc = w - fmt.rope_width
        kq.pack_token_records(q.codes, q.scales, zeros, wc, fmt.bits, fmt.rope_bits,
                              fmt.scale_bytes, fmt.zero_bytes, fmt.record_bytes(w), out)
    return out


def unpack(fmt: KVFormat, buf: np.ndarray, tokens: int, width: int, *,
           kind: str = "quant") -> QuantizedKV:
    """Parse ``run_bytes(fmt, kind, tokens, width)`` stored bytes back to codes and
    metadata."""
    kind = _kind(fmt, kind)
    buf = np.ascontiguousarray(np.asarray(buf).reshape(-1).view(np.uint8))
    need = run_bytes(fmt, kind, tokens, width)
    if buf.size != need:
        raise FormatError(f"{fmt}: {tokens} {kind} tokens of width {width} take {need} "
                          f"bytes, got {buf.size}")
    t, w = tokens, width
    if kind == "fp":
        fp = np.empty((t, w), np.uint16)
        kq.unpack_fp_records(buf, fmt.fp_record_bytes(w), fp)
        return QuantizedKV(fmt, "fp", t, w, fp=fp)
    codes = np.empty((t, w), np.uint8)
    zsigned = fmt.zero_dtype == "int8"
    if fmt.axis == "channel":
        scales = np.empty((t // fmt.group, w), np.uint16)
        zeros = np.empty((t // fmt.group, w), np.int32)
        kq.unpack_channel_blocks(buf, fmt.group, fmt.bits, fmt.scale_bytes, fmt.zero_bytes,
                                 zsigned, fmt.block_bytes(w), codes, scales, zeros)
    else:
        ng = fmt.groups_per_token(w)
        scales = np.empty((t, ng), np.uint16)
        zeros = np.empty((t, ng), np.int32)
        kq.unpack_token_records(buf, w - fmt.rope_width, fmt.bits, fmt.rope_bits,
                                fmt.scale_bytes, fmt.zero_bytes, zsigned,
                                fmt.record_bytes(w), codes, scales, zeros)
    return QuantizedKV(fmt, "quant", t, w, codes=codes, scales=scales,
                       zeros=None if fmt.symmetric else zeros)


def dequantize(fmt: KVFormat, q: QuantizedKV) -> np.ndarray:
    """int8 ``[tokens, width]`` values of a quantized run."""
    t, w = q.tokens, q.width
    out = np.empty((t, w), np.int8)
    if q.kind == "fp":
        kq.fp_bits_to_int8(q.fp, _FP_KIND[fmt.fp_dtype], out)
        return out
    if fmt.axis == "none":
        return q.codes.view(np.int8).copy()
    sk = _FP_KIND[fmt.scale_dtype]
    zk = _ZK[fmt.zero_dtype]
    zeros = q.zeros if q.zeros is not None else np.zeros(q.scales.shape, np.int32)
    if fmt.axis == "channel":
        kq.dequant_channels(q.codes, fmt.group, fmt.bits, zk, sk, q.scales, zeros, out)
    else:
        wc = w - fmt.rope_width
        kq.dequant_tokens(q.codes, 0, wc, fmt.group, fmt.bits, zk, sk, q.scales, zeros, 0,
                          out)
        if fmt.rope_width:
            kq.dequant_tokens(q.codes, wc, w, fmt.group, fmt.rope_bits, zk, sk, q.scales,
                              zeros, -(-wc // fmt.group), out)
    return out


def dequantize_q24(fmt: KVFormat, q: QuantizedKV) -> np.ndarray:
    """int64 ``[tokens, width]`` exact dequantized values of a run in Q24 int8-grid units
    (the dequantize-on-read path, :mod:`isa.kernels.kvdequant`); rounding them to the
    nearest integer (half up) and saturating gives :func:`dequantize`."""
    t, w = q.tokens, q.width
    out = np.empty((t, w), np.int64)
    if q.kind == "fp":
        kdq.fp_bits_to_q24(q.fp, _FP_KIND[fmt.fp_dtype], out)
        return out
    if fmt.axis == "none":
        return kdq.raw_int8_to_q24(q.codes)
    sk = _FP_KIND[fmt.scale_dtype]
    zk = _ZK[fmt.zero_dtype]
    zeros = q.zeros if q.zeros is not None else np.zeros(q.scales.shape, np.int32)
    if fmt.axis == "channel":
        kdq.dequant_channels_q24(q.codes, fmt.group, fmt.bits, zk, sk, q.scales, zeros, out)
    else:
        wc = w - fmt.rope_width
        kdq.dequant_tokens_q24(q.codes, 0, wc, fmt.group, fmt.bits, zk, sk, q.scales, zeros,
                               0, out)
        if fmt.rope_width:
            kdq.dequant_tokens_q24(q.codes, wc, w, fmt.group, fmt.rope_bits, zk, sk,
                                   q.scales, zeros, -(-wc // fmt.group), out)
    return out


def encode(fmt: KVFormat, x: np.ndarray, *, kind: str = "quant") -> np.ndarray:
    """``pack(quantize(x, kind=kind))``: the bytes of one run."""
    return pack(fmt, quantize(fmt, x, kind=kind))


def decode(fmt: KVFormat, buf: np.ndarray, tokens: int, width: int, *,
           kind: str = "quant") -> np.ndarray:
    """``dequantize(unpack(buf, ...))``: int8 ``[tokens, width]`` of one run."""
    return dequantize(fmt, unpack(fmt, buf, tokens, width, kind=kind))


def decode_q24(fmt: KVFormat, buf: np.ndarray, tokens: int, width: int, *,
               kind: str = "quant") -> np.ndarray:
    """``dequantize_q24(unpack(buf, ...))``: int64 Q24 ``[tokens, width]`` of one run."""
    return dequantize_q24(fmt, unpack(fmt, buf, tokens, width, kind=kind))
