"""The KV format as data: its fields, their validation, and the sizes of its records.

A :class:`KVFormat` describes how *one* cache (the K cache or the V cache of a layer, or the
latent cache of an MLA layer) stores ``tokens x width`` int8 values. This module owns the
fields and what follows from them alone (record and block sizes, the compact spec text);
the bytes are made by :mod:`isa.kv.codec` (one record or block) and :mod:`isa.kv.region`
(where each record lives in a cache's DRAM region), and names are read and printed by
:mod:`isa.kv.grammar`. The methods below that quantize, pack, read or write delegate to
those modules, so callers hold one object.

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

A sliding-window layer's cache (``ring`` > 0) keeps only its last ``ring`` tokens: its
records sit in a ring of ``ring`` slots (token ``t`` in slot ``t % ring``), and attention
over it sees, for a query at position ``p``, the positions ``p - slide + 1 .. p``
(:mod:`isa.kv.region`). Its header holds the token count and the first position the ring
still holds; ring formats have no full-precision window, sinks, pages or per-channel groups.

Scales are fp16/bf16 patterns; zeros are fp16/bf16 patterns (the group minimum: KIVI,
QServe) or integer zero points (uint8/int8: QuantMLA). See :mod:`isa.kernels.kvquant` for
the exact quantization rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import FormatError
from . import codec, header, traffic
from . import region as rg

BITS = (16, 8, 4, 2)
AXES = ("token", "channel", "none")
SCALE_DTYPES = ("fp16", "bf16")
ZERO_DTYPES = ("fp16", "bf16", "uint8", "int8")
FP_DTYPES = ("bf16", "fp16")
#: Bytes of one stored value of each metadata dtype ("none": not stored).
DTYPE_BYTES = {"fp16": 2, "bf16": 2, "uint8": 1, "int8": 1, "none": 0}
#: Bytes of a region header: the token count as a little-endian uint32.
HEADER_COUNT_BYTES = 4
#: Bytes of a ring region's header: the token count, then the first position it holds.
RING_HEADER_BYTES = 8


def align(n: int, pad: int) -> int:
    """``n`` rounded up to a multiple of ``pad``."""
    return -(-n // pad) * pad


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
    ring: int = 0
    slide: int = 0
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
        for attr in ("window", "sink", "page", "rope_width", "ring", "slide"):
            if getattr(self, attr) < 0:
                raise FormatError(f"KV format: {attr} must be >= 0, got {getattr(self, attr)}")
        if self.pad < 1:
            raise FormatError(f"KV format: pad must be >= 1, got {self.pad}")
        if self.page and (self.window or self.sink or self.axis == "channel"):
            raise FormatError("KV format: pages need a format without windows, sinks and "
                              "per-channel groups")
        if self.ring or self.slide:
            if not 1 <= self.slide <= self.ring:
                raise FormatError(f"KV format: a sliding-window cache needs 1 <= slide <= "
                                  f"ring, got slide {self.slide}, ring {self.ring}")
            if self.window or self.sink or self.page or self.axis == "channel":
                raise FormatError("KV format: a sliding-window cache (ring) needs a format "
                                  "without windows, sinks, pages and per-channel groups")
        if self.rope_width:
            if self.axis != "token":
                raise FormatError("KV format: a RoPE part needs per-token groups")
            if self.rope_bits not in (8, 4, 2):
                raise FormatError(f"KV format: rope bits must be 8, 4 or 2, "
                                  f"got {self.rope_bits}")
        else:
            norm("rope_bits", 0)

    # --- record sizes --------------------------------------------------------------------

    @property
    def scale_bytes(self) -> int:
        return DTYPE_BYTES[self.scale_dtype]

    @property
    def zero_bytes(self) -> int:
        return DTYPE_BYTES[self.zero_dtype]

    def check_width(self, width: int) -> None:
        """Raise :class:`FormatError` unless tokens of ``width`` values fit this format."""
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
        self.check_width(width)
        return align(2 * width, self.pad)

    def record_bytes(self, width: int) -> int:
        """Bytes of one quantized token record (per-token and raw formats)."""
        self.check_width(width)
        if self.bits == 16:
            return self.fp_record_bytes(width)
        if self.axis == "channel":
            raise FormatError(f"{self}: per-channel formats store blocks, not token records")
        if self.axis == "none":
            return align(width, self.pad)
        wc = width - self.rope_width
        codes = (wc * self.bits + 7) // 8 + (self.rope_width * self.rope_bits + 7) // 8
        meta = self.groups_per_token(width) * (self.scale_bytes + self.zero_bytes)
        return align(codes + meta, self.pad)

    def block_bytes(self, width: int) -> int:
        """Bytes of one per-channel block of ``group`` tokens."""
        self.check_width(width)
        if self.axis != "channel":
            raise FormatError(f"{self}: only per-channel formats store blocks")
        codes = width * ((self.group * self.bits + 7) // 8)
        return align(codes + width * (self.scale_bytes + self.zero_bytes), self.pad)

    @property
    def stateful(self) -> bool:
        """Whether where a token is stored depends on the cache length (a window or
        per-channel groups): such regions start with a header holding that length."""
        return self.ring > 0 or (self.bits != 16 and (self.window > 0 or self.axis == "channel"))

    @property
    def header_bytes(self) -> int:
        """Bytes of a region's header: the token count, uint32 little-endian (a ring's also
        its first held position), padded to ``pad`` (0 for formats whose layout does not
        depend on the length)."""
        if self.ring:
            return align(RING_HEADER_BYTES, self.pad)
        return align(HEADER_COUNT_BYTES, self.pad) if self.stateful else 0

    def sliding(self, *, ring: int, slide: int) -> KVFormat:
        """This format as a sliding-window layer's cache (see the module docstring)."""
        kw = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "name"}
        return KVFormat(**{**kw, "ring": ring, "slide": slide})

    # --- the codec (isa.kv.codec) ----------------------------------------------------------

    def quantize(self, x: np.ndarray, *, kind: str = "quant") -> codec.QuantizedKV:
        """Quantize int8 ``x[tokens, width]`` as one run of records of ``kind``."""
        return codec.quantize(self, x, kind=kind)

    def pack(self, q: codec.QuantizedKV) -> np.ndarray:
        """The stored bytes (uint8) of a quantized run."""
        return codec.pack(self, q)

    def unpack(self, buf: np.ndarray, tokens: int, width: int, *,
               kind: str = "quant") -> codec.QuantizedKV:
        """Parse the stored bytes of a run back to codes and metadata."""
        return codec.unpack(self, buf, tokens, width, kind=kind)

    def dequantize(self, q: codec.QuantizedKV) -> np.ndarray:
        """int8 ``[tokens, width]`` values of a quantized run."""
        return codec.dequantize(self, q)

    def encode(self, x: np.ndarray, *, kind: str = "quant") -> np.ndarray:
        """``pack(quantize(x, kind=kind))``: the bytes of one run."""
        return codec.encode(self, x, kind=kind)

    def decode(self, buf: np.ndarray, tokens: int, width: int, *,
               kind: str = "quant") -> np.ndarray:
        """``dequantize(unpack(buf, ...))``: int8 ``[tokens, width]`` of one run."""
        return codec.decode(self, buf, tokens, width, kind=kind)

    def run_bytes(self, kind: str, tokens: int, width: int) -> int:
        """Bytes of ``tokens`` consecutive records of ``kind`` (``"fp"`` or ``"quant"``)."""
        return codec.run_bytes(self, kind, tokens, width)

    # --- the DRAM region (isa.kv.region) --------------------------------------------------

    def quant_end(self, tokens: int) -> int:
        """First token of the full-precision tail of a cache of ``tokens`` tokens."""
        return rg.quant_end(self, tokens)

    def region(self, cap: int, width: int) -> rg.RegionLayout:
        """The byte layout of a DRAM region holding up to ``cap`` tokens."""
        return rg.layout(self, cap, width)

    def region_bytes(self, cap: int, width: int) -> int:
        """Bytes of a DRAM region of ``cap`` tokens (the KV instructions' ``nbytes``)."""
        return rg.layout(self, cap, width).nbytes

    def max_bytes(self, tokens: int, width: int) -> int:
        """Bytes a cache with room for ``tokens`` tokens occupies: its DRAM region."""
        return self.region_bytes(tokens, width)

    def bytes(self, tokens: int, width: int) -> int:
        """Bytes of the records a cache of ``tokens`` tokens holds (its region's used part
        without the header), plus page padding for paged formats."""
        return traffic.cache_bytes(self, tokens, width)

    def region_length(self, buf: np.ndarray) -> int | None:
        """The token count in a region's header (None for formats without a header)."""
        return header.length(self, buf)

    def region_write(self, buf: np.ndarray, cap: int, pos: int,
                     x: np.ndarray) -> list[tuple[int, int]]:
        """KvWrite: store int8 ``x[n, width]`` at positions ``pos ..`` of the cache in
        region ``buf`` (modified in place); returns the ``(offset, nbytes)`` ranges
        written. See :func:`isa.kv.region.write`."""
        return rg.write(self, buf, cap, pos, x)

    def region_first(self, buf: np.ndarray, cap: int, keys: int) -> int:
        """The first position of the last ``keys`` cached tokens of region ``buf`` (Attn
        over a ring reads those); 0 for other formats, whose Attn reads from position 0."""
        return header.last_keys_first(self, buf, cap, keys)

    def region_read(self, buf: np.ndarray, cap: int, width: int, pos: int = 0,
                    tokens: int | None = None) -> np.ndarray:
        """KvRead / Attn: int8 ``[tokens, width]`` of positions ``pos ..`` of the cache in
        region ``buf``. See :func:`isa.kv.region.read`."""
        return rg.read(self, buf, cap, width, pos, tokens)

    def region_read_q24(self, buf: np.ndarray, cap: int, width: int, pos: int = 0,
                        tokens: int | None = None) -> np.ndarray:
        """attn.dq: the exact dequantized values of :meth:`region_read`'s tokens, int64
        in Q24 units of the int8 grid (rounded half up and saturated they are
        :meth:`region_read`'s int8 values)."""
        return rg.read(self, buf, cap, width, pos, tokens, q24=True)

    def region_encode(self, x: np.ndarray, cap: int) -> np.ndarray:
        """A fresh region of ``cap`` tokens holding int8 ``x[T, width]``."""
        return rg.encode(self, x, cap)

    def round_trip(self, x: np.ndarray) -> np.ndarray:
        """int8 ``x[T, width]`` written to a cache of this format at once and read back."""
        return rg.round_trip(self, x)

    def read_bytes(self, pos: int, tokens: int, width: int, *,
                   cached: int | None = None) -> int:
        """DRAM bytes a read of positions ``pos .. pos+tokens-1`` moves (header included).
        See :func:`isa.kv.traffic.read_bytes`."""
        return traffic.read_bytes(self, pos, tokens, width, cached=cached)

    def write_bytes(self, pos: int, tokens: int, width: int) -> tuple[int, int]:
        """DRAM ``(read, written)`` bytes of appending ``tokens`` tokens at ``pos``.
        See :func:`isa.kv.traffic.write_bytes`."""
        return traffic.write_bytes(self, pos, tokens, width)

    # --- text (isa.kv.grammar) ------------------------------------------------------------

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
        if self.ring:
            parts += [f"ring{self.ring}", f"slide{self.slide}"]
        return ".".join(parts)

    def __str__(self) -> str:
        return self.name or self.spec()
