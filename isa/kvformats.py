"""KV-cache formats as data: bit width, grouping, metadata dtypes, full-precision windows,
record padding, and the exact bytes a cache holds.

A :class:`KVFormat` describes how *one* cache (the K cache or the V cache of a layer, or the
latent cache of an MLA layer) stores ``tokens x width`` values. The compiler, the runtime
and the instruction semantics share it: programs name formats by text in their format
table (:func:`parse` / :func:`to_text`), e.g. ``"kivi-4.k"`` or a compact spec
``"b4.channel.g32.asym.scale-fp16.zero-fp16.fp-fp16.window128"``. :func:`pair` gives the
(K, V) formats of a layout named in FACTS.md (``kivi-4`` has different K and V formats).

Inputs are int8 values: on the device the K/V projections requantize to int8 (with the
static per-tensor or per-channel scale the compiler chose) before :class:`~isa.KvWrite`, so
every format quantizes int8 values, and every read gives int8 values back (the integer
dequantization of :mod:`isa.kernels.kvquant`). Consequently the 16-bit formats (``bf16``,
``fp16``) and full-precision tokens hold those int8 values exactly: they cost 2 bytes per
value and lose nothing. (Attention over a bf16 cache thus reads the exact int8 grid back; a
host edit that wrote a non-integer bf16 value reads back rounded half up and saturated.)

Stored layout of a cache holding ``T`` tokens of ``W`` values (``bytes(T, W)`` is its exact
size, and :meth:`KVFormat.encode_cache` produces exactly these bytes):

1. sink: tokens ``[0, S')``, ``S' = min(sink, T)``, as full-precision records;
2. quantized part: tokens ``[S', q_end)``;
3. tail: tokens ``[q_end, T)`` as full-precision records;
4. page padding (only formats with ``page``): zero records up to a multiple of ``page``
   tokens.

``q_end`` for per-token groups (and raw int8): ``max(S', T - window)``: a token is
quantized as soon as it leaves the recent window. For per-channel groups of ``G`` tokens:
``S' + G * floor(max(0, T - window - S') / G)``: a group is quantized once all its ``G``
tokens have left the window, so the tail keeps the window plus the last incomplete group
(between ``window`` and ``window + G - 1`` tokens once the cache is long enough). The
layout depends on ``T`` only, so ``bytes(T, W)`` is deterministic; it is not monotonic in
``T`` for per-channel formats (``G`` tail records collapse into one block), see
:meth:`KVFormat.max_bytes` for capacity planning.

Records (every record is zero-padded to a multiple of ``pad`` bytes):

- full-precision record (one token): ``W`` fp16/bf16 values, little-endian uint16.
- per-token record (one token): the content codes (first ``W - rope_width`` values at
  ``bits``), then the RoPE codes (last ``rope_width`` values at ``rope_bits``), each packed
  LSB-first (:mod:`isa.kernels.pack`) from a byte boundary; then one scale per group
  (content groups of ``group`` channels, then RoPE groups, the last of each possibly
  shorter); then one zero per group (asymmetric formats only).
- raw int8 record (``axis="none"``, ``bits=8``): the ``W`` int8 values.
- per-channel block (``G`` tokens): for each channel in order, its ``G`` codes packed
  LSB-first (``ceil(G*bits/8)`` bytes: KIVI's "32/b codes per int32" along tokens); then
  ``W`` scales; then ``W`` zeros.

Scales are fp16/bf16 patterns; zeros are fp16/bf16 patterns (the group minimum: KIVI,
QServe) or integer zero points (uint8/int8: QuantMLA). See :mod:`isa.kernels.kvquant` for
the exact quantization rules.

Segments (runs of records of one kind: ``"fp"``, or ``"quant"``: per-token records or
whole per-channel blocks starting at ``sink + k*G``) are encoded by
:meth:`KVFormat.encode` and sized by :meth:`KVFormat.segment_bytes`.

DRAM regions (what KvWrite, KvRead and Attn address): a cache with room for ``cap`` tokens
is a region of :meth:`KVFormat.region_bytes` bytes (:meth:`KVFormat.region` gives its
layout) where every record has a fixed place:

1. header (formats with a window or per-channel groups only, where a token's place
   depends on the cache length): the token count, uint32 little-endian, zero-padded to
   ``pad`` bytes. A zeroed region is an empty cache.
2. ``min(sink, cap)`` full-precision sink slots (token ``t`` in slot ``t``);
3. quantized slots: token ``t >= sink`` in record slot ``t - sink`` (per-token and raw
   formats; ``cap - sink - window`` slots, or ``cap`` rounded up to whole pages), or block
   ``(t - sink) // G`` (per-channel formats; ``(cap - sink - window) // G`` blocks);
4. a ring of full-precision slots for the tail: token ``t`` in slot
   ``(t - sink) % ring`` (``ring = min(window, cap - sink)`` for per-token formats,
   ``min(window + G - 1, cap - sink)`` for per-channel ones).

The used part of a region of a ``T``-token cache is thus ``header + bytes(T)`` bytes,
the compact layout's records in other places. :meth:`KVFormat.region_write` appends and
quantizes tokens leaving the window (from their exact full-precision values, so chunking
does not change the result), clears slots that no longer hold a cached token (functional
tidiness, not counted as traffic; but see truncations below for the quantized slot of a
token in the tail), and :meth:`KVFormat.read_bytes` / :meth:`KVFormat.write_bytes` give
the DRAM traffic of reads and appends.

A write at ``pos`` below the cached length truncates the cache there and goes straight from
the old layout to the new one: the kept tokens keep their records and read back as before,
with one exception (below), and a kept token that was quantized keeps reading back so after
any later appends (one still in full precision is quantized when it leaves the window, as
in any append). Kept tokens that come back into the tail are stored in their ring slots as
the values they read, and their quantized slots keep their records (a quantized slot has a
fixed place, so it exists while its token is in the tail); when a later write pushes such a
token out of the tail again, that record stays where it is, instead of being re-quantized
from what the token reads (the write uses it only if it reads back as the ring slot holds).
Re-quantizing would not be exact: with integer zero points (QuantMLA) a dequantized group
spans the grid points of its extreme codes, ``(c - zp) * s`` rounded, not its original
range ``[min(v, 0), max(v, 0)]``, so its scale, zero point and codes would be computed anew
and can differ; the region does not rely on any format's rule reproducing its own codes. So
appending in chunks after a truncation (as on-device eviction does, the first chunk
truncating) reads back exactly as appending at once, and leaves the same bytes: the slots
of dropped and overwritten tokens are cleared, so a region's bytes depend on the positions
and values written, not on how the writes were chunked. Traffic is counted as before:
:meth:`KVFormat.write_bytes` prices a token leaving the window as reading its
full-precision record and writing its record.

The exception: a per-channel block that the truncation splits and a write completes again
shares one scale (and zero) per channel between its kept and its new tokens, so it is
re-quantized from what its kept tokens read and the new tokens (whether the truncating write
completes it or a later one does): its kept tokens read back re-quantized, not necessarily as
before. (Keeping the old block's scales instead would clamp the new tokens to the old tokens'
range.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from .errors import FormatError
from .kernels import kvquant as kq
from .kernels.fpbits import BF16, FP16

BITS = (16, 8, 4, 2)
AXES = ("token", "channel", "none")
SCALE_DTYPES = ("fp16", "bf16")
ZERO_DTYPES = ("fp16", "bf16", "uint8", "int8")
FP_DTYPES = ("bf16", "fp16")
DTYPE_BYTES = {"fp16": 2, "bf16": 2, "uint8": 1, "int8": 1, "none": 0}
_FP_KIND = {"fp16": FP16, "bf16": BF16}
_ZK = {"none": kq.ZK_NONE, "fp16": kq.ZK_FP16, "bf16": kq.ZK_BF16, "uint8": kq.ZK_U8,
       "int8": kq.ZK_I8}
KINDS = ("fp", "quant")


def _align(n: int, pad: int) -> int:
    return -(-n // pad) * pad


class Segment(NamedTuple):
    """A run of ``tokens`` records of one ``kind`` (``"fp"``, ``"quant"``, ``"pad"``),
    starting at token ``start`` and byte ``offset`` of the stored cache."""

    kind: str
    start: int
    tokens: int
    offset: int
    nbytes: int


class RegionLayout(NamedTuple):
    """Byte layout of a DRAM region for up to ``cap`` tokens of ``width`` values: header,
    then ``sink_slots`` full-precision records, then ``quant_slots`` quantized slots (token
    records, or blocks of ``group`` tokens) of ``quant_slot_bytes``, then a ring of
    ``ring_slots`` full-precision records (token ``t`` of the tail in slot
    ``(t - sink_slots) % ring_slots``). ``nbytes`` is the region's size."""

    cap: int
    width: int
    header: int
    sink_offset: int
    sink_slots: int
    quant_offset: int
    quant_slots: int
    quant_slot_bytes: int
    ring_offset: int
    ring_slots: int
    fp_slot_bytes: int
    nbytes: int


@dataclass(frozen=True, eq=False)
class QuantizedKV:
    """One segment in quantized form (what :meth:`KVFormat.quantize` returns).

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


@dataclass(frozen=True)
class KVFormat:
    """How one KV cache stores ``tokens x width`` int8 values (see the module docstring).

    Fields: ``bits`` (16, 8, 4, 2); ``axis`` of the groups (``"token"``: groups of
    ``group`` channels within a token; ``"channel"``: groups of ``group`` tokens within a
    channel; ``"none"``: no groups, for 16 bits and raw int8); ``symmetric``;
    ``scale_dtype``; ``zero_dtype``; ``fp_dtype`` of full-precision tokens; ``window``
    (recent tokens kept full precision); ``sink`` (first tokens kept full precision);
    ``pad`` (record alignment in bytes); ``page`` (allocation unit in tokens, 0 = none);
    ``rope_width``/``rope_bits`` (the last ``rope_width`` values of a token, the MLA
    decoupled RoPE key, quantized separately at ``rope_bits``). Fields that cannot matter
    are normalized (e.g. no zero dtype when symmetric), so equal formats compare equal.
    ``name`` is the registry name, if any (not compared).
    """

    bits: int
    axis: str = "token"
    group: int = 32
    symmetric: bool = False
    scale_dtype: str = "fp16"
    zero_dtype: str = "fp16"
    fp_dtype: str = "bf16"
    window: int = 0
    sink: int = 0
    pad: int = 1
    page: int = 0
    rope_width: int = 0
    rope_bits: int = 0
    name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        def norm(attr: str, value) -> None:
            object.__setattr__(self, attr, value)

        if self.bits not in BITS:
            raise FormatError(f"KV format: bits must be one of {BITS}, got {self.bits}")
        if self.bits == 16:
            norm("axis", "none")
        if self.axis not in AXES:
            raise FormatError(f"KV format: axis must be one of {AXES}, got {self.axis!r}")
        if self.axis == "none":
            if self.bits not in (16, 8):
                raise FormatError(
                    f"KV format: axis 'none' (no scales) needs 16 or 8 bits, got {self.bits}")
            norm("group", 0)
            norm("symmetric", True)
            norm("scale_dtype", "none")
        else:
            if self.group < 1:
                raise FormatError(f"KV format: group must be >= 1, got {self.group}")
            if self.scale_dtype not in SCALE_DTYPES:
                raise FormatError(f"KV format: scale dtype must be one of {SCALE_DTYPES}, "
                                  f"got {self.scale_dtype!r}")
        if self.symmetric:
            norm("zero_dtype", "none")
        elif self.zero_dtype not in ZERO_DTYPES:
            raise FormatError(f"KV format: zero dtype must be one of {ZERO_DTYPES}, "
                              f"got {self.zero_dtype!r}")
        if self.fp_dtype not in FP_DTYPES:
            raise FormatError(f"KV format: fp dtype must be one of {FP_DTYPES}, "
                              f"got {self.fp_dtype!r}")
        if self.bits == 16:
            norm("window", 0)
            norm("sink", 0)
        for attr in ("window", "sink", "page", "rope_width"):
            if getattr(self, attr) < 0:
                raise FormatError(f"KV format: {attr} must be >= 0, got {getattr(self, attr)}")
        if self.pad < 1:
            raise FormatError(f"KV format: pad must be >= 1, got {self.pad}")
        if self.page and (self.window or self.sink or self.axis == "channel"):
            raise FormatError("KV format: pages need a format without windows, sinks and "
                              "per-channel groups")
        if self.rope_width:
            if self.axis != "token":
                raise FormatError("KV format: a RoPE part needs per-token groups")
            if self.rope_bits not in (8, 4, 2):
                raise FormatError(f"KV format: rope bits must be 8, 4 or 2, "
                                  f"got {self.rope_bits}")
        else:
            norm("rope_bits", 0)

    # --- sizes ---------------------------------------------------------------------------

    @property
    def scale_bytes(self) -> int:
        return DTYPE_BYTES[self.scale_dtype]

    @property
    def zero_bytes(self) -> int:
        return DTYPE_BYTES[self.zero_dtype]

    def _check_width(self, width: int) -> None:
        if width < 1:
            raise FormatError(f"{self}: width must be >= 1, got {width}")
        if self.rope_width and width <= self.rope_width:
            raise FormatError(f"{self}: width {width} leaves no content values before the "
                              f"{self.rope_width} RoPE values")

    def groups_per_token(self, width: int) -> int:
        """Scales per per-token record (content groups, then RoPE groups)."""
        if self.axis != "token":
            return 0
        wc = width - self.rope_width
        return -(-wc // self.group) + -(-self.rope_width // self.group)

    def fp_record_bytes(self, width: int) -> int:
        """Bytes of one full-precision token record."""
        self._check_width(width)
        return _align(2 * width, self.pad)

    def record_bytes(self, width: int) -> int:
        """Bytes of one quantized token record (per-token and raw formats)."""
        self._check_width(width)
        if self.bits == 16:
            return self.fp_record_bytes(width)
        if self.axis == "channel":
            raise FormatError(f"{self}: per-channel formats store blocks, not token records")
        if self.axis == "none":
            return _align(width, self.pad)
        wc = width - self.rope_width
        codes = (wc * self.bits + 7) // 8 + (self.rope_width * self.rope_bits + 7) // 8
        meta = self.groups_per_token(width) * (self.scale_bytes + self.zero_bytes)
        return _align(codes + meta, self.pad)

    def block_bytes(self, width: int) -> int:
        """Bytes of one per-channel block of ``group`` tokens."""
        self._check_width(width)
        if self.axis != "channel":
            raise FormatError(f"{self}: only per-channel formats store blocks")
        codes = width * ((self.group * self.bits + 7) // 8)
        return _align(codes + width * (self.scale_bytes + self.zero_bytes), self.pad)

    def quant_end(self, tokens: int) -> int:
        """First token of the full-precision tail of a cache of ``tokens`` tokens."""
        if tokens < 0:
            raise FormatError(f"{self}: token count must be >= 0, got {tokens}")
        if self.bits == 16:
            return 0
        s = min(self.sink, tokens)
        if self.axis == "channel":
            return s + self.group * (max(0, tokens - self.window - s) // self.group)
        return max(s, tokens - self.window)

    def segment_bytes(self, kind: str, tokens: int, width: int) -> int:
        """Bytes of ``tokens`` records of ``kind`` (``"fp"`` or ``"quant"``)."""
        if kind not in KINDS:
            raise FormatError(f"segment kind must be one of {KINDS}, got {kind!r}")
        if kind == "fp" or self.bits == 16:
            return tokens * self.fp_record_bytes(width)
        if self.axis == "channel":
            if tokens % self.group:
                raise FormatError(f"{self}: a quantized per-channel segment holds whole "
                                  f"groups of {self.group} tokens, got {tokens}")
            return tokens // self.group * self.block_bytes(width)
        return tokens * self.record_bytes(width)

    def layout(self, tokens: int, width: int) -> tuple[Segment, ...]:
        """The segments of the stored cache of ``tokens`` tokens, in byte order."""
        self._check_width(width)
        q_end = self.quant_end(tokens)
        s = 0 if self.bits == 16 else min(self.sink, tokens)
        parts = [("fp", 0, s), ("quant", s, q_end - s), ("fp", q_end, tokens - q_end)]
        if self.bits == 16:
            parts = [("fp", 0, tokens)]
        segs = []
        off = 0
        for kind, start, n in parts:
            if n > 0:
                nb = self.segment_bytes(kind, n, width)
                segs.append(Segment(kind, start, n, off, nb))
                off += nb
        if self.page and tokens % self.page:
            n = self.page - tokens % self.page
            nb = n * self.record_bytes(width)
            segs.append(Segment("pad", tokens, n, off, nb))
        return tuple(segs)

    def bytes(self, tokens: int, width: int) -> int:
        """Exact bytes of the stored cache of ``tokens`` tokens of ``width`` values."""
        return sum(s.nbytes for s in self.layout(tokens, width))

    def max_bytes(self, tokens: int, width: int) -> int:
        """Bytes a cache with room for ``tokens`` tokens occupies: its DRAM region
        (:meth:`region_bytes`), which holds the stored cache of every length up to
        ``tokens`` (``>= header_bytes + bytes(T)`` for all ``T <= tokens``)."""
        return self.region_bytes(tokens, width)

    # --- quantize / pack / unpack / dequantize -------------------------------------------

    def _kind(self, kind: str) -> str:
        if kind not in KINDS:
            raise FormatError(f"segment kind must be one of {KINDS}, got {kind!r}")
        return "fp" if self.bits == 16 else kind

    def quantize(self, x: np.ndarray, *, kind: str = "quant") -> QuantizedKV:
        """Quantize int8 ``x[tokens, width]`` as one segment of ``kind``."""
        x = np.asarray(x)
        if x.ndim != 2 or x.dtype != np.int8:
            raise FormatError(f"{self}: quantize takes int8 [tokens, width], "
                              f"got {x.dtype} {x.shape}")
        x = np.ascontiguousarray(x)
        t, w = x.shape
        self._check_width(w)
        kind = self._kind(kind)
        if kind == "fp":
            fp = np.empty((t, w), np.uint16)
            kq.int8_to_fp_bits(x, _FP_KIND[self.fp_dtype], fp)
            return QuantizedKV(self, "fp", t, w, fp=fp)
        if self.axis == "none":
            return QuantizedKV(self, "quant", t, w, codes=x.view(np.uint8).copy(),
                               scales=np.zeros((t, 0), np.uint16))
        codes = np.zeros((t, w), np.uint8)
        sk = _FP_KIND[self.scale_dtype]
        zk = _ZK[self.zero_dtype]
        if self.axis == "token":
            ng = self.groups_per_token(w)
            scales = np.zeros((t, ng), np.uint16)
            zeros = np.zeros((t, ng), np.int32)
            wc = w - self.rope_width
            kq.quant_tokens(x, 0, wc, self.group, self.bits, zk, sk, codes, scales, zeros, 0)
            if self.rope_width:
                kq.quant_tokens(x, wc, w, self.group, self.rope_bits, zk, sk, codes, scales,
                                zeros, -(-wc // self.group))
        else:
            self.segment_bytes("quant", t, w)  # checks whole groups
            scales = np.zeros((t // self.group, w), np.uint16)
            zeros = np.zeros((t // self.group, w), np.int32)
            kq.quant_channels(x, self.group, self.bits, zk, sk, codes, scales, zeros)
        return QuantizedKV(self, "quant", t, w, codes=codes, scales=scales,
                           zeros=None if self.symmetric else zeros)

    def pack(self, q: QuantizedKV) -> np.ndarray:
        """The stored bytes (uint8) of a quantized segment."""
        t, w = q.tokens, q.width
        out = np.empty(self.segment_bytes(q.kind, t, w), np.uint8)
        if q.kind == "fp":
            kq.pack_fp_records(q.fp, self.fp_record_bytes(w), out)
            return out
        zeros = q.zeros if q.zeros is not None else np.zeros(q.scales.shape, np.int32)
        if self.axis == "channel":
            kq.pack_channel_blocks(q.codes, q.scales, zeros, self.group, self.bits,
                                   self.scale_bytes, self.zero_bytes, self.block_bytes(w), out)
        else:
            wc = w - self.rope_width
            kq.pack_token_records(q.codes, q.scales, zeros, wc, self.bits, self.rope_bits,
                                  self.scale_bytes, self.zero_bytes, self.record_bytes(w), out)
        return out

    def unpack(self, buf: np.ndarray, tokens: int, width: int, *,
               kind: str = "quant") -> QuantizedKV:
        """Parse ``segment_bytes(kind, tokens, width)`` stored bytes back to codes and
        metadata."""
        kind = self._kind(kind)
        buf = np.ascontiguousarray(np.asarray(buf).reshape(-1).view(np.uint8))
        need = self.segment_bytes(kind, tokens, width)
        if buf.size != need:
            raise FormatError(f"{self}: {tokens} {kind} tokens of width {width} take {need} "
                              f"bytes, got {buf.size}")
        t, w = tokens, width
        if kind == "fp":
            fp = np.empty((t, w), np.uint16)
            kq.unpack_fp_records(buf, self.fp_record_bytes(w), fp)
            return QuantizedKV(self, "fp", t, w, fp=fp)
        codes = np.empty((t, w), np.uint8)
        zsigned = self.zero_dtype == "int8"
        if self.axis == "channel":
            scales = np.empty((t // self.group, w), np.uint16)
            zeros = np.empty((t // self.group, w), np.int32)
            kq.unpack_channel_blocks(buf, self.group, self.bits, self.scale_bytes,
                                     self.zero_bytes, zsigned, self.block_bytes(w), codes,
                                     scales, zeros)
        else:
            ng = self.groups_per_token(w)
            scales = np.empty((t, ng), np.uint16)
            zeros = np.empty((t, ng), np.int32)
            kq.unpack_token_records(buf, w - self.rope_width, self.bits, self.rope_bits,
                                    self.scale_bytes, self.zero_bytes, zsigned,
                                    self.record_bytes(w), codes, scales, zeros)
        return QuantizedKV(self, "quant", t, w, codes=codes, scales=scales,
                           zeros=None if self.symmetric else zeros)

    def dequantize(self, q: QuantizedKV) -> np.ndarray:
        """int8 ``[tokens, width]`` values of a quantized segment."""
        t, w = q.tokens, q.width
        out = np.empty((t, w), np.int8)
        if q.kind == "fp":
            kq.fp_bits_to_int8(q.fp, _FP_KIND[self.fp_dtype], out)
            return out
        if self.axis == "none":
            return q.codes.view(np.int8).copy()
        sk = _FP_KIND[self.scale_dtype]
        zk = _ZK[self.zero_dtype]
        zeros = q.zeros if q.zeros is not None else np.zeros(q.scales.shape, np.int32)
        if self.axis == "channel":
            kq.dequant_channels(q.codes, self.group, self.bits, zk, sk, q.scales, zeros, out)
        else:
            wc = w - self.rope_width
            kq.dequant_tokens(q.codes, 0, wc, self.group, self.bits, zk, sk, q.scales, zeros,
                              0, out)
            if self.rope_width:
                kq.dequant_tokens(q.codes, wc, w, self.group, self.rope_bits, zk, sk, q.scales,
                                  zeros, -(-wc // self.group), out)
        return out

    def encode(self, x: np.ndarray, *, kind: str = "quant") -> np.ndarray:
        """``pack(quantize(x, kind=kind))``: the bytes of one segment."""
        return self.pack(self.quantize(x, kind=kind))

    def decode(self, buf: np.ndarray, tokens: int, width: int, *,
               kind: str = "quant") -> np.ndarray:
        """``dequantize(unpack(buf, ...))``: int8 ``[tokens, width]`` of one segment."""
        return self.dequantize(self.unpack(buf, tokens, width, kind=kind))

    def encode_cache(self, x: np.ndarray) -> np.ndarray:
        """The stored cache (``bytes(T, W)`` uint8) of int8 ``x[T, W]``."""
        x = np.asarray(x)
        if x.ndim != 2:
            raise FormatError(f"{self}: encode_cache takes [tokens, width], got {x.shape}")
        t, w = x.shape
        out = np.zeros(self.bytes(t, w), np.uint8)
        for s in self.layout(t, w):
            if s.kind != "pad":
                out[s.offset:s.offset + s.nbytes] = self.encode(x[s.start:s.start + s.tokens],
                                                                kind=s.kind)
        return out

    def decode_cache(self, buf: np.ndarray, tokens: int, width: int) -> np.ndarray:
        """int8 ``[tokens, width]`` values of a stored cache of ``bytes(tokens, width)``."""
        buf = np.asarray(buf).reshape(-1).view(np.uint8)
        need = self.bytes(tokens, width)
        if buf.size != need:
            raise FormatError(f"{self}: a cache of {tokens} tokens of width {width} takes "
                              f"{need} bytes, got {buf.size}")
        out = np.empty((tokens, width), np.int8)
        for s in self.layout(tokens, width):
            if s.kind != "pad":
                out[s.start:s.start + s.tokens] = self.decode(
                    buf[s.offset:s.offset + s.nbytes], s.tokens, width, kind=s.kind)
        return out

    # --- DRAM regions ---------------------------------------------------------------------

    @property
    def stateful(self) -> bool:
        """Whether where a token is stored depends on the cache length (a window or
        per-channel groups): such regions start with a header holding that length."""
        return self.bits != 16 and (self.window > 0 or self.axis == "channel")

    @property
    def header_bytes(self) -> int:
        """Bytes of a region's header: the token count, uint32 little-endian, padded to
        ``pad`` (0 for formats whose layout does not depend on the length)."""
        return _align(4, self.pad) if self.stateful else 0

    def region(self, cap: int, width: int) -> RegionLayout:
        """The byte layout of a DRAM region holding up to ``cap`` tokens (see the module
        docstring): header, sink slots, quantized slots, full-precision ring."""
        self._check_width(width)
        if cap < 0:
            raise FormatError(f"{self}: capacity must be >= 0 tokens, got {cap}")
        fpb = self.fp_record_bytes(width)
        s = 0 if self.bits == 16 else min(self.sink, cap)
        rest = cap - s
        if self.axis == "channel":
            unit = self.block_bytes(width)
            slots = max(0, rest - self.window) // self.group
            ring = min(self.window + self.group - 1, rest)
        else:
            unit = self.record_bytes(width)
            slots = -(-cap // self.page) * self.page if self.page else max(0, rest - self.window)
            ring = min(self.window, rest)
        h = self.header_bytes
        q_off = h + s * fpb
        r_off = q_off + slots * unit
        return RegionLayout(cap, width, h, h, s, q_off, slots, unit, r_off, ring, fpb,
                            r_off + ring * fpb)

    def region_bytes(self, cap: int, width: int) -> int:
        """Bytes of a DRAM region of ``cap`` tokens (the KV instructions' ``nbytes``)."""
        return self.region(cap, width).nbytes

    def _region_q_end(self, tokens: int) -> int:
        return tokens if self.bits == 16 else self.quant_end(tokens)

    def _runs(self, L: RegionLayout, T: int, t0: int, t1: int) -> list[tuple[str, int, int, int]]:
        """Tokens ``[t0, t1)`` of a cache of ``T`` tokens as runs ``(kind, a, b, offset)``
        of consecutive slots: kind ``"fp"`` (sink or ring records) or ``"quant"`` (token
        records; for per-channel formats the blocks covering ``[a, b)``, offset of the
        first block)."""
        s = L.sink_slots
        qe = self._region_q_end(T)
        runs = []
        if t0 < min(t1, s):
            runs.append(("fp", t0, min(t1, s), L.sink_offset + t0 * L.fp_slot_bytes))
        a, b = max(t0, s), min(t1, qe)
        if a < b:
            if self.axis == "channel":
                off = L.quant_offset + (a - s) // self.group * L.quant_slot_bytes
            else:
                off = L.quant_offset + (a - s) * L.quant_slot_bytes
            runs.append(("quant", a, b, off))
        a = max(t0, qe, s)
        while a < t1:
            slot = (a - s) % L.ring_slots
            b = min(t1, a + L.ring_slots - slot)
            runs.append(("fp", a, b, L.ring_offset + slot * L.fp_slot_bytes))
            a = b
        return runs

    def _run_bytes(self, L: RegionLayout, kind: str, a: int, b: int) -> int:
        if kind == "quant" and self.axis == "channel":
            s, g = L.sink_slots, self.group
            return ((b - s + g - 1) // g - (a - s) // g) * L.quant_slot_bytes
        return self.segment_bytes(kind, b - a, L.width)

    def _get(self, buf: np.ndarray, L: RegionLayout, T: int, t0: int, t1: int) -> np.ndarray:
        out = np.empty((t1 - t0, L.width), np.int8)
        for kind, a, b, off in self._runs(L, T, t0, t1):
            nb = self._run_bytes(L, kind, a, b)
            if kind == "quant" and self.axis == "channel":
                s, g = L.sink_slots, self.group
                first = s + (a - s) // g * g
                n = nb // L.quant_slot_bytes * g
                vals = self.decode(buf[off:off + nb], n, L.width, kind="quant")
                out[a - t0:b - t0] = vals[a - first:b - first]
            else:
                out[a - t0:b - t0] = self.decode(buf[off:off + nb], b - a, L.width, kind=kind)
        return out

    def _put(self, buf: np.ndarray, L: RegionLayout, T: int, t0: int, vals: np.ndarray,
             keep: tuple[int, int] = (0, 0)) -> list[tuple[int, int]]:
        """Store ``vals`` as tokens ``t0 ..`` of a cache of ``T`` tokens. Quantized records
        (or whole blocks) of tokens in ``keep`` (tokens that leave the tail, whose slots may
        still hold the records they came back to the tail with) are left as they are when
        they read back as ``vals``; every other record is quantized from ``vals``."""
        patches = []
        for kind, a, b, off in self._runs(L, T, t0, t0 + vals.shape[0]):
            if kind == "quant" and self.axis == "channel" and (
                    (a - L.sink_slots) % self.group or (b - L.sink_slots) % self.group):
                raise FormatError(f"{self}: internal error, unaligned block write {a}..{b}")
            v = vals[a - t0:b - t0]
            if kind == "quant" and max(a, keep[0]) < min(b, keep[1]):
                patches += self._put_keeping(buf, L, a, b, off, v, keep)
                continue
            data = self.encode(v, kind=kind)
            buf[off:off + data.size] = data
            patches.append((off, data.size))
        return patches

    def _put_keeping(self, buf: np.ndarray, L: RegionLayout, a: int, b: int, off: int,
                     vals: np.ndarray, keep: tuple[int, int]) -> list[tuple[int, int]]:
        """Quantized slots of tokens ``[a, b)`` (at byte ``off``; whole blocks for
        per-channel formats): a record or block all of whose tokens lie in ``keep`` and
        that reads back as its ``vals`` stays; the others are quantized from ``vals``."""
        u = self.group if self.axis == "channel" else 1
        ub = L.quant_slot_bytes
        n = (b - a) // u
        kept = np.zeros(n, bool)
        i0 = max(0, -(-(keep[0] - a) // u))
        i1 = min(n, (keep[1] - a) // u)
        if i0 < i1:
            old = self.decode(buf[off + i0 * ub:off + i1 * ub], (i1 - i0) * u, L.width)
            same = old == vals[i0 * u:i1 * u]
            kept[i0:i1] = same.reshape(i1 - i0, -1).all(axis=1)
        patches = []
        i = 0
        while i < n:
            if kept[i]:
                i += 1
                continue
            j = i
            while j < n and not kept[j]:
                j += 1
            data = self.encode(vals[i * u:j * u], kind="quant")
            buf[off + i * ub:off + i * ub + data.size] = data
            patches.append((off + i * ub, data.size))
            i = j
        return patches

    def _slot_span(self, L: RegionLayout, t0: int, t1: int) -> tuple[int, int] | None:
        """``(offset, nbytes)`` of the quantized slots of tokens ``[t0, t1)`` (their token
        records, or the blocks they fall in), whatever the cache length; None if none."""
        s, u = L.sink_slots, (self.group if self.axis == "channel" else 1)
        a = max(t0, s)
        if a >= t1:
            return None
        first, last = (a - s) // u, min(L.quant_slots, (t1 - s + u - 1) // u)
        if first >= last:
            return None
        return L.quant_offset + first * L.quant_slot_bytes, (last - first) * L.quant_slot_bytes

    def region_length(self, buf: np.ndarray) -> int | None:
        """The token count in a region's header (None for formats without a header)."""
        if not self.stateful:
            return None
        b = np.asarray(buf).reshape(-1).view(np.uint8)
        return int(b[0]) | int(b[1]) << 8 | int(b[2]) << 16 | int(b[3]) << 24

    def _check_region(self, buf: np.ndarray, cap: int, width: int) -> RegionLayout:
        L = self.region(cap, width)
        if buf.dtype != np.uint8 or buf.ndim != 1 or buf.size != L.nbytes:
            raise FormatError(f"{self}: a region of {cap} tokens of width {width} is "
                              f"{L.nbytes} uint8 bytes, got {buf.dtype} {buf.shape}")
        return L

    def _write_ranges(self, T_old: int, pos: int, T_new: int) -> list[tuple[int, int]]:
        """Token ranges an append at ``pos`` (cache of ``T_old`` -> ``T_new`` tokens)
        rewrites: tokens before ``pos`` whose place changes (leaving the window, or coming
        back to it after a truncation), and the new tokens; per-channel ranges start on the
        block they fall in."""
        qo, qn = self._region_q_end(T_old), self._region_q_end(T_new)
        ranges = []
        lo, hi = min(qo, qn), min(max(qo, qn), pos)
        if lo < hi:
            ranges.append([lo, hi])
        ranges.append([pos, T_new])
        s = min(self.sink, T_new) if self.bits != 16 else 0
        if self.axis == "channel":
            for r in ranges:
                if s <= r[0] < qn:
                    r[0] = s + (r[0] - s) // self.group * self.group
        ranges.sort()
        merged: list[list[int]] = []
        for a, b in ranges:
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            elif a < b:
                merged.append([a, b])
        return [(a, b) for a, b in merged]

    def region_write(self, buf: np.ndarray, cap: int, pos: int,
                     x: np.ndarray) -> list[tuple[int, int]]:
        """KvWrite: append int8 ``x[n, width]`` at positions ``pos .. pos+n-1`` of the cache
        in region ``buf`` (uint8, modified in place); returns the ``(offset, nbytes)`` byte
        ranges written.

        Afterwards the cache holds ``pos + n`` tokens laid out as :meth:`layout` says:
        tokens that left the window are quantized from their full-precision values (exact,
        so writing token by token and writing all at once give the same bytes). Formats
        with a header require ``pos <= `` the cached length; ``pos`` below it truncates the
        cache there: kept tokens read back as before (tokens that come back into the window
        are stored dequantized and keep their quantized records, which they leave the
        window with again, so they keep reading back as before), except the kept tokens of a
        per-channel block that the truncation splits and a write completes again: that block
        is re-quantized from its kept tokens' values and the new tokens (see the module
        docstring).
        """
        x = np.asarray(x)
        if x.ndim != 2 or x.dtype != np.int8:
            raise FormatError(f"{self}: KV values must be int8 [tokens, width], "
                              f"got {x.dtype} {x.shape}")
        L = self._check_region(buf, cap, x.shape[1])
        T_new = pos + x.shape[0]
        if pos < 0 or T_new > cap:
            raise FormatError(f"{self}: tokens {pos}..{T_new - 1} do not fit a region of "
                              f"{cap} tokens")
        T_old = self.region_length(buf) if self.stateful else pos
        if T_old > cap:
            raise FormatError(f"{self}: region header says {T_old} tokens, capacity is {cap}")
        if pos > T_old:
            raise FormatError(f"{self}: writing at position {pos} would leave a gap after "
                              f"the {T_old} cached tokens")
        ranges = self._write_ranges(T_old, pos, T_new)
        values = []
        for a, b in ranges:  # read everything first: ring slots get reused
            old = self._get(buf, L, T_old, a, min(b, pos)) if a < pos else None
            new = x[max(a, pos) - pos:b - pos] if b > pos else None
            parts = [p for p in (old, new) if p is not None and p.shape[0]]
            values.append(np.concatenate(parts) if len(parts) > 1 else parts[0])
        # Clear what no longer holds a cached token (ring slots of tokens leaving the tail,
        # records and blocks cut off by a truncation), so a region's bytes depend only on
        # the cached tokens, not on how the writes were chunked. A kept token that comes
        # back into the tail keeps its quantized record in its slot (the ring holds what it
        # reads); when it leaves the tail again that record stays, so the token reads back
        # exactly as before (re-quantizing what it reads need not give its codes back).
        patches = []
        qo, qn = self._region_q_end(T_old), self._region_q_end(T_new)
        clear = [(T_new, T_old)]
        if qo < qn:
            clear.append((qo, min(qn, T_old)))
        for a, b in clear:
            for kind, a0, b0, off in self._runs(L, T_old, a, b) if a < b else ():
                nb = self._run_bytes(L, kind, a0, b0)
                buf[off:off + nb] = 0
                patches.append((off, nb))
        span = self._slot_span(L, pos, T_old) if self.stateful else None
        if span is not None:  # the slots of dropped and overwritten tokens
            off, nb = span
            buf[off:off + nb] = 0
            patches.append(span)
        keep = (qo, min(qn, pos))  # kept tokens that leave the tail with this write
        for (a, _), vals in zip(ranges, values, strict=True):
            patches += self._put(buf, L, T_new, a, vals, keep)
        if self.stateful:
            buf[:4] = np.array([T_new], "<u4").view(np.uint8)
            patches.append((0, 4))
        return patches

    def region_read(self, buf: np.ndarray, cap: int, width: int, pos: int = 0,
                    tokens: int | None = None) -> np.ndarray:
        """KvRead / Attn: int8 ``[tokens, width]`` of positions ``pos ..`` of the cache in
        region ``buf`` (``tokens`` defaults to the rest of the cached tokens; formats
        without a header need it)."""
        L = self._check_region(buf, cap, width)
        T = self.region_length(buf)
        if T is not None and T > cap:
            raise FormatError(f"{self}: region header says {T} tokens, capacity is {cap}")
        if tokens is None:
            if T is None:
                raise FormatError(f"{self}: regions have no length header; give tokens")
            tokens = T - pos
        if T is None:
            T = pos + tokens
        if pos < 0 or tokens < 0 or pos + tokens > min(T, cap):
            raise FormatError(f"{self}: tokens {pos}..{pos + tokens - 1} are not in a cache "
                              f"of {T} tokens (capacity {cap})")
        return self._get(buf, L, T, pos, pos + tokens)

    def region_encode(self, x: np.ndarray, cap: int) -> np.ndarray:
        """A fresh region of ``cap`` tokens holding int8 ``x[T, width]``."""
        x = np.asarray(x)
        buf = np.zeros(self.region_bytes(cap, x.shape[1]), np.uint8)
        self.region_write(buf, cap, 0, x)
        return buf

    def read_bytes(self, pos: int, tokens: int, width: int, *,
                   cached: int | None = None) -> int:
        """DRAM bytes a read of positions ``pos .. pos+tokens-1`` moves from a region whose
        cache holds ``cached`` tokens (default ``pos + tokens``): the header and every
        record or block it touches. Reading a whole cache of T tokens moves
        ``header_bytes + bytes(T)`` (page padding excluded)."""
        T = pos + tokens if cached is None else cached
        L = self.region(max(T, 1), width)
        return L.header + sum(self._run_bytes(L, k, a, b)
                              for k, a, b, _ in self._runs(L, T, pos, pos + tokens))

    def write_bytes(self, pos: int, tokens: int, width: int) -> tuple[int, int]:
        """DRAM ``(read, written)`` bytes of appending ``tokens`` tokens at ``pos`` to a
        cache of ``pos`` tokens: the header, the full-precision records re-quantized as
        they leave the window (read) and every record or block written."""
        T_new = pos + tokens
        L = self.region(max(T_new, 1), width)
        read = written = L.header
        for a, b in self._write_ranges(pos, pos, T_new):
            if a < pos:
                read += sum(self._run_bytes(L, k, a0, b0)
                            for k, a0, b0, _ in self._runs(L, pos, a, min(b, pos)))
            written += sum(self._run_bytes(L, k, a0, b0)
                           for k, a0, b0, _ in self._runs(L, T_new, a, b))
        return read, written

    # --- text ---------------------------------------------------------------------------

    def spec(self) -> str:
        """The compact spec string (always, even for a registered format)."""
        parts = [f"b{self.bits}", self.axis]
        if self.axis != "none":
            parts += [f"g{self.group}", "sym" if self.symmetric else "asym",
                      f"scale-{self.scale_dtype}"]
            if not self.symmetric:
                parts.append(f"zero-{self.zero_dtype}")
        parts.append(f"fp-{self.fp_dtype}")
        if self.window:
            parts.append(f"window{self.window}")
        if self.sink:
            parts.append(f"sink{self.sink}")
        if self.rope_width:
            parts.append(f"rope{self.rope_width}b{self.rope_bits}")
        if self.pad > 1:
            parts.append(f"pad{self.pad}")
        if self.page:
            parts.append(f"page{self.page}")
        return ".".join(parts)

    def to_text(self) -> str:
        """The registry name when this format is registered, else :meth:`spec`."""
        return to_text(self)

    def __str__(self) -> str:
        return self.name or self.spec()


class KVPair(NamedTuple):
    """The formats of a layer's K and V caches (the same object for an MLA latent cache)."""

    k: KVFormat
    v: KVFormat


def _named(name: str, **kw) -> KVFormat:
    return KVFormat(name=name, **kw)


def _kivi(bits: int, role: str) -> KVFormat:
    # KIVI (Liu et al. 2024; FACTS.md): asymmetric, fp16 scale and zero, G=32, R=128 fp16;
    # keys per-channel (groups of G tokens), values per-token (groups of G channels).
    axis = "channel" if role == "k" else "token"
    return _named(f"kivi-{bits}.{role}", bits=bits, axis=axis, group=32, scale_dtype="fp16",
                  zero_dtype="fp16", fp_dtype="fp16", window=128)


def _quantmla(content_bits: int) -> KVFormat:
    # QuantMLA (FACTS.md): per-token asymmetric, G=64, fp16 scale, uint8 zero, records padded
    # to 16 bytes, first 4 and last 128 tokens BF16; content and RoPE parts quantized apart.
    return _named(f"quantmla-c{content_bits}r4", bits=content_bits, axis="token", group=64,
                  scale_dtype="fp16", zero_dtype="uint8", fp_dtype="bf16", window=128,
                  sink=4, pad=16, rope_width=64, rope_bits=4)


#: Single-cache formats by name.
FORMATS: dict[str, KVFormat] = {
    f.name: f
    for f in (
        _named("bf16", bits=16, fp_dtype="bf16"),
        _named("fp16", bits=16, fp_dtype="fp16"),
        # The device's native int8 cache: the int8 values as written (1 byte each).
        _named("int8", bits=8, axis="none"),
        _kivi(2, "k"),
        _kivi(2, "v"),
        _kivi(4, "k"),
        _kivi(4, "v"),
        # QServe KV4 (Lin et al. 2024; FACTS.md): uint4 codes, fp16 scale and zero per token
        # per head, pages of 64 tokens. group=64 is "per head" for head_dim 64 (Qwen2.5-0.5B,
        # Llama-3.2-1B); QServe's own 8B models have head_dim 128 (spec ...g128...).
        _named("qserve-kv4", bits=4, axis="token", group=64, scale_dtype="fp16",
               zero_dtype="fp16", page=64),
        _quantmla(4),
        _quantmla(2),
    )
}

#: (K, V) layouts by name.
PAIRS: dict[str, KVPair] = {
    "bf16": KVPair(FORMATS["bf16"], FORMATS["bf16"]),
    "fp16": KVPair(FORMATS["fp16"], FORMATS["fp16"]),
    "int8": KVPair(FORMATS["int8"], FORMATS["int8"]),
    "kivi-2": KVPair(FORMATS["kivi-2.k"], FORMATS["kivi-2.v"]),
    "kivi-4": KVPair(FORMATS["kivi-4.k"], FORMATS["kivi-4.v"]),
    "qserve-kv4": KVPair(FORMATS["qserve-kv4"], FORMATS["qserve-kv4"]),
    "quantmla-c4r4": KVPair(FORMATS["quantmla-c4r4"], FORMATS["quantmla-c4r4"]),
    "quantmla-c2r4": KVPair(FORMATS["quantmla-c2r4"], FORMATS["quantmla-c2r4"]),
}

_BY_VALUE = {f: name for name, f in FORMATS.items()}

_SPEC_TOKENS = (
    (re.compile(r"b(\d+)$"), "bits"),
    (re.compile(r"(token|channel|none)$"), "axis"),
    (re.compile(r"g(\d+)$"), "group"),
    (re.compile(r"(sym|asym)$"), "symmetric"),
    (re.compile(r"scale-(\w+)$"), "scale_dtype"),
    (re.compile(r"zero-(\w+)$"), "zero_dtype"),
    (re.compile(r"fp-(\w+)$"), "fp_dtype"),
    (re.compile(r"window(\d+)$"), "window"),
    (re.compile(r"sink(\d+)$"), "sink"),
    (re.compile(r"pad(\d+)$"), "pad"),
    (re.compile(r"page(\d+)$"), "page"),
    (re.compile(r"rope(\d+)b(\d+)$"), "rope"),
)
SPEC_HELP = ("a spec like 'b4.channel.g32.asym.scale-fp16.zero-fp16.fp-fp16.window128' "
             "(tokens: b16|b8|b4|b2, token|channel|none, g<N>, sym|asym, scale-<fp16|bf16>, "
             "zero-<fp16|bf16|uint8|int8>, fp-<bf16|fp16>, window<N>, sink<N>, pad<N>, "
             "page<N>, rope<N>b<M>)")


def names() -> list[str]:
    """Every name :func:`parse` accepts besides specs (single formats and pair names)."""
    return sorted(set(FORMATS) | set(PAIRS))


def _match_token(text: str, tok: str) -> tuple[str, re.Match]:
    for pattern, key in _SPEC_TOKENS:
        m = pattern.match(tok)
        if m:
            return key, m
    raise FormatError(f"KV format spec {text!r}: unknown token {tok!r}; expected {SPEC_HELP}")


def _parse_spec(text: str) -> KVFormat:
    kw: dict = {}
    for tok in text.split("."):
        key, m = _match_token(text, tok)
        if key in kw or (key == "rope" and "rope_width" in kw):
            raise FormatError(f"KV format spec {text!r}: {key} given twice")
        if any(len(g) > 9 for g in m.groups() if g and g.isdigit()):
            raise FormatError(f"KV format spec {text[:40]!r}...: number too large "
                              f"({max(len(g) for g in m.groups() if g)} digits)")
        if key == "rope":
            kw["rope_width"] = int(m.group(1))
            kw["rope_bits"] = int(m.group(2))
        elif key == "symmetric":
            kw[key] = m.group(1) == "sym"
        elif key in ("axis", "scale_dtype", "zero_dtype", "fp_dtype"):
            kw[key] = m.group(1)
        else:
            kw[key] = int(m.group(1))
    if "bits" not in kw:
        raise FormatError(f"KV format spec {text!r}: the bit width (b16|b8|b4|b2) is missing")
    f = KVFormat(**kw)
    return KVFormat(**{**_fields(f), "name": _BY_VALUE.get(f, "")})


def _fields(f: KVFormat) -> dict:
    return {k: getattr(f, k) for k in f.__dataclass_fields__ if k != "name"}


def parse(text: str, role: str | None = None) -> KVFormat:
    """The format a program's format table names: a registered name (``"int8"``,
    ``"kivi-4.k"``), a pair name with ``role`` ``"k"``/``"v"`` (``parse("kivi-4", "k")``),
    or a spec string (:meth:`KVFormat.spec`). Unknown names raise :class:`FormatError`
    listing the valid ones."""
    if not isinstance(text, str):
        raise FormatError(f"a KV format is named by a string, got {type(text).__name__}")
    t = text.strip()
    if t in FORMATS:
        return FORMATS[t]
    if t.endswith((".k", ".v")) and t[:-2] in PAIRS:
        role, t = t[-1], t[:-2]
    if t in PAIRS:
        p = PAIRS[t]
        if p.k == p.v:
            return p.k
        if role not in ("k", "v"):
            raise FormatError(f"KV layout {t!r} has different K and V formats: name "
                              f"{t + '.k'!r} or {t + '.v'!r}")
        return p.k if role == "k" else p.v
    if re.match(r"b\d+(\.|$)", t):
        return _parse_spec(t)
    raise FormatError(f"unknown KV format {text!r}; valid names: {', '.join(names())}; "
                      f"or {SPEC_HELP}")


def to_text(fmt: KVFormat) -> str:
    """Text for a program's format table: the registry name, else the spec string;
    ``parse(to_text(f)) == f``."""
    return _BY_VALUE.get(fmt) or fmt.spec()


def pair(name: str) -> KVPair:
    """The (K, V) formats of a layout name (any single-format name or spec gives (f, f))."""
    if name in PAIRS:
        return PAIRS[name]
    f = parse(name)
    return KVPair(f, f)


def get(name: str) -> KVFormat:
    """Alias of :func:`parse` for registry look-ups."""
    return parse(name)
