"""Where a KV cache's records live: the DRAM region of one cache, and the byte traffic of
reading and appending to it. This is the one byte layout of a cache: what KvWrite, KvRead
and Attn address, what a cache dump returns, and what every size is counted from.

Which tokens are quantized depends on the cache length ``T``: ``q_end`` (:func:`quant_end`)
is the first token of the full-precision tail. Tokens ``[0, S')``, ``S' = min(sink, T)``,
are sink tokens (full precision), ``[S', q_end)`` are quantized and ``[q_end, T)`` are the
tail (full precision). For per-token groups (and raw int8) ``q_end = max(S', T - window)``:
a token is quantized as soon as it leaves the recent window. For per-channel groups of
``G`` tokens ``q_end = S' + G * floor(max(0, T - window - S') / G)``: a group is quantized
once all its ``G`` tokens have left the window, so the tail keeps the window plus the last
incomplete group (between ``window`` and ``window + G - 1`` tokens once the cache is long
enough). 16-bit formats keep every token in one kind of record.

A region with room for ``cap`` tokens (:func:`layout`, ``nbytes`` bytes) gives every record
a fixed place:

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

:func:`.traffic.cache_bytes` (``KVFormat.bytes``) counts the records a ``T``-token cache
holds (plus page padding for paged formats); a read of the whole cache moves the header and
those records. :func:`write` appends and quantizes tokens leaving the window (from their exact
full-precision values, so chunking does not change the result), clears slots that no longer
hold a cached token (functional tidiness, not counted as traffic; but see truncations below
for the quantized slot of a token in the tail), and :func:`read_bytes` /
:func:`write_bytes` give the DRAM traffic of reads and appends.

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
:func:`.traffic.write_bytes` prices a token leaving the window as reading its full-precision record
and writing its record.

The exception: a per-channel block that the truncation splits and a write completes again
shares one scale (and zero) per channel between its kept and its new tokens, so it is
re-quantized from what its kept tokens read and the new tokens (whether the truncating write
completes it or a later one does): its kept tokens read back re-quantized, not necessarily as
before. (Keeping the old block's scales instead would clamp the new tokens to the old tokens'
range.)

Every token-to-slot mapping goes through :func:`runs` (and :func:`_slot_span` for the
quantized slots of a token range), so the reads, writes and traffic (:mod:`.traffic`) are
built on them.

Sliding-window caches (``fmt.ring`` > 0) reuse their slots in a ring: a region of ``R =
min(cap, ring)`` record slots, token ``t`` in slot ``t % R`` (no sinks, no full-precision
tail), after a header of the token count ``T`` and the first position ``F`` it holds
(uint32 each; ``F >= T - R``). It holds positions ``F .. T-1``; reading an older one is an
error, not stale data. A truncating write (``pos`` below ``T``) keeps what it held below
``pos``; the positions it had overwritten stay lost. :func:`.traffic.cache_bytes` counts
the ``min(T, R)`` records held.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from ..errors import FormatError
from . import codec
from .header import held_from, length

if TYPE_CHECKING:
    from .format import KVFormat


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


Run = tuple[str, int, int, int]  # (kind, first token, end token, byte offset)


def quant_end(fmt: KVFormat, tokens: int) -> int:
    """First token of the full-precision tail of a cache of ``tokens`` tokens (0 for
    16-bit formats, whose every record is a full-precision one)."""
    if tokens < 0:
        raise FormatError(f"{fmt}: token count must be >= 0, got {tokens}")
    if fmt.bits == 16:
        return 0
    s = min(fmt.sink, tokens)
    if fmt.axis == "channel":
        return s + fmt.group * (max(0, tokens - fmt.window - s) // fmt.group)
    return max(s, tokens - fmt.window)


def _q_end(fmt: KVFormat, tokens: int) -> int:
    """End of the tokens stored in quantized slots (every token, for 16-bit formats)."""
    return tokens if fmt.bits == 16 else quant_end(fmt, tokens)


def layout(fmt: KVFormat, cap: int, width: int) -> RegionLayout:
    """The byte layout of a DRAM region holding up to ``cap`` tokens (see the module
    docstring): header, sink slots, quantized slots, full-precision ring."""
    fmt.check_width(width)
    if cap < 0:
        raise FormatError(f"{fmt}: capacity must be >= 0 tokens, got {cap}")
    fpb = fmt.fp_record_bytes(width)
    s = 0 if fmt.bits == 16 else min(fmt.sink, cap)
    rest = cap - s
    if fmt.ring:  # a ring of token records (sliding window): no sinks, no fp tail
        unit, slots, ring = fmt.record_bytes(width), min(cap, fmt.ring), 0
    elif fmt.axis == "channel":
        unit = fmt.block_bytes(width)
        slots = max(0, rest - fmt.window) // fmt.group
        ring = min(fmt.window + fmt.group - 1, rest)
    else:
        unit = fmt.record_bytes(width)
        slots = -(-cap // fmt.page) * fmt.page if fmt.page else max(0, rest - fmt.window)
        ring = min(fmt.window, rest)
    h = fmt.header_bytes
    q_off = h + s * fpb
    r_off = q_off + slots * unit
    return RegionLayout(cap, width, h, h, s, q_off, slots, unit, r_off, ring, fpb,
                        r_off + ring * fpb)


def runs(fmt: KVFormat, L: RegionLayout, T: int, t0: int, t1: int) -> list[Run]:
    """Tokens ``[t0, t1)`` of a cache of ``T`` tokens as runs ``(kind, a, b, offset)`` of
    consecutive slots: kind ``"fp"`` (sink or ring records) or ``"quant"`` (token records;
    for per-channel formats the blocks covering ``[a, b)``, offset of the first block)."""
    s = L.sink_slots
    qe = _q_end(fmt, T)
    out: list[Run] = []
    if t0 < min(t1, s):
        out.append(("fp", t0, min(t1, s), L.sink_offset + t0 * L.fp_slot_bytes))
    a, b = max(t0, s), min(t1, qe)
    if fmt.ring:  # slot t % R, split where the ring wraps
        n = L.quant_slots
        while a < b:
            e = min(b, a + n - a % n)
            out.append(("quant", a, e, L.quant_offset + a % n * L.quant_slot_bytes))
            a = e
        return out
    if a < b:
        if fmt.axis == "channel":
            off = L.quant_offset + (a - s) // fmt.group * L.quant_slot_bytes
        else:
            off = L.quant_offset + (a - s) * L.quant_slot_bytes
        out.append(("quant", a, b, off))
    a = max(t0, qe, s)
    while a < t1:
        slot = (a - s) % L.ring_slots
        b = min(t1, a + L.ring_slots - slot)
        out.append(("fp", a, b, L.ring_offset + slot * L.fp_slot_bytes))
        a = b
    return out


def span_bytes(fmt: KVFormat, L: RegionLayout, kind: str, a: int, b: int) -> int:
    """Bytes of the slots that hold tokens ``[a, b)`` of one run (whole blocks for a
    per-channel quantized run)."""
    if kind == "quant" and fmt.axis == "channel":
        s, g = L.sink_slots, fmt.group
        return ((b - s + g - 1) // g - (a - s) // g) * L.quant_slot_bytes
    return codec.run_bytes(fmt, kind, b - a, L.width)


def _get(fmt: KVFormat, buf: np.ndarray, L: RegionLayout, T: int, t0: int,
         t1: int, q24: bool = False) -> np.ndarray:
    """int8 values of tokens ``[t0, t1)`` (``q24``: int64 Q24 values, unrounded)."""
    out = np.empty((t1 - t0, L.width), np.int64 if q24 else np.int8)
    decode = codec.decode_q24 if q24 else codec.decode
    for kind, a, b, off in runs(fmt, L, T, t0, t1):
        nb = span_bytes(fmt, L, kind, a, b)
        if kind == "quant" and fmt.axis == "channel":
            s, g = L.sink_slots, fmt.group
            first = s + (a - s) // g * g
            n = nb // L.quant_slot_bytes * g
            vals = decode(fmt, buf[off:off + nb], n, L.width, kind="quant")
            out[a - t0:b - t0] = vals[a - first:b - first]
        else:
            out[a - t0:b - t0] = decode(fmt, buf[off:off + nb], b - a, L.width, kind=kind)
    return out


def _put(fmt: KVFormat, buf: np.ndarray, L: RegionLayout, T: int, t0: int, vals: np.ndarray,
         keep: tuple[int, int] = (0, 0)) -> list[tuple[int, int]]:
    """Store ``vals`` as tokens ``t0 ..`` of a cache of ``T`` tokens. Quantized records (or
    whole blocks) of tokens in ``keep`` (tokens that leave the tail, whose slots may still
    hold the records they came back to the tail with) are left as they are when they read
    back as ``vals``; every other record is quantized from ``vals``."""
    patches = []
    for kind, a, b, off in runs(fmt, L, T, t0, t0 + vals.shape[0]):
        if kind == "quant" and fmt.axis == "channel" and (
                (a - L.sink_slots) % fmt.group or (b - L.sink_slots) % fmt.group):
            raise FormatError(f"{fmt}: internal error, unaligned block write {a}..{b}")
        v = vals[a - t0:b - t0]
        if kind == "quant" and max(a, keep[0]) < min(b, keep[1]):
            patches += _put_keeping(fmt, buf, L, a, b, off, v, keep)
            continue
        data = codec.encode(fmt, v, kind=kind)
        buf[off:off + data.size] = data
        patches.append((off, data.size))
    return patches


def _put_keeping(fmt: KVFormat, buf: np.ndarray, L: RegionLayout, a: int, b: int, off: int,
                 vals: np.ndarray, keep: tuple[int, int]) -> list[tuple[int, int]]:
    """Quantized slots of tokens ``[a, b)`` (at byte ``off``; whole blocks for per-channel
    formats): a record or block all of whose tokens lie in ``keep`` and that reads back as
    its ``vals`` stays; the others are quantized from ``vals``."""
    u = fmt.group if fmt.axis == "channel" else 1
    ub = L.quant_slot_bytes
    n = (b - a) // u
    kept = np.zeros(n, bool)
    i0 = max(0, -(-(keep[0] - a) // u))
    i1 = min(n, (keep[1] - a) // u)
    if i0 < i1:
        old = codec.decode(fmt, buf[off + i0 * ub:off + i1 * ub], (i1 - i0) * u, L.width)
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
        data = codec.encode(fmt, vals[i * u:j * u], kind="quant")
        buf[off + i * ub:off + i * ub + data.size] = data
        patches.append((off + i * ub, data.size))
        i = j
    return patches


def _slot_span(fmt: KVFormat, L: RegionLayout, t0: int, t1: int) -> tuple[int, int] | None:
    """``(offset, nbytes)`` of the quantized slots of tokens ``[t0, t1)`` (their token
    records, or the blocks they fall in), whatever the cache length; None if none."""
    s, u = L.sink_slots, (fmt.group if fmt.axis == "channel" else 1)
    a = max(t0, s)
    if a >= t1:
        return None
    first, last = (a - s) // u, min(L.quant_slots, (t1 - s + u - 1) // u)
    if first >= last:
        return None
    return L.quant_offset + first * L.quant_slot_bytes, (last - first) * L.quant_slot_bytes


def _checked(fmt: KVFormat, buf: np.ndarray, cap: int, width: int) -> RegionLayout:
    L = layout(fmt, cap, width)
    if buf.dtype != np.uint8 or buf.ndim != 1 or buf.size != L.nbytes:
        raise FormatError(f"{fmt}: a region of {cap} tokens of width {width} is "
                          f"{L.nbytes} uint8 bytes, got {buf.dtype} {buf.shape}")
    return L


def write_ranges(fmt: KVFormat, T_old: int, pos: int, T_new: int) -> list[tuple[int, int]]:
    """Token ranges an append at ``pos`` (cache of ``T_old`` -> ``T_new`` tokens) rewrites:
    tokens before ``pos`` whose place changes (leaving the window, or coming back to it
    after a truncation), and the new tokens; per-channel ranges start on the block they
    fall in."""
    qo, qn = _q_end(fmt, T_old), _q_end(fmt, T_new)
    ranges = []
    lo, hi = min(qo, qn), min(max(qo, qn), pos)
    if lo < hi:
        ranges.append([lo, hi])
    ranges.append([pos, T_new])
    s = min(fmt.sink, T_new) if fmt.bits != 16 else 0
    if fmt.axis == "channel":
        for r in ranges:
            if s <= r[0] < qn:
                r[0] = s + (r[0] - s) // fmt.group * fmt.group
    ranges.sort()
    merged: list[list[int]] = []
    for a, b in ranges:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        elif a < b:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def write(fmt: KVFormat, buf: np.ndarray, cap: int, pos: int,
          x: np.ndarray) -> list[tuple[int, int]]:
    """KvWrite: append int8 ``x[n, width]`` at positions ``pos .. pos+n-1`` of the cache in
    region ``buf`` (uint8, modified in place); returns the ``(offset, nbytes)`` byte ranges
    written.

    Afterwards the cache holds ``pos + n`` tokens laid out as the module docstring says:
    tokens that left the window are quantized from their full-precision values (exact, so
    writing token by token and writing all at once give the same bytes). Formats with a
    header require ``pos <=`` the cached length; ``pos`` below it truncates the cache there:
    kept tokens read back as before (tokens that come back into the window are stored
    dequantized and keep their quantized records, which they leave the window with again,
    so they keep reading back as before), except the kept tokens of a per-channel block that
    the truncation splits and a write completes again: that block is re-quantized from its
    kept tokens' values and the new tokens.
    """
    x = np.asarray(x)
    if x.ndim != 2 or x.dtype != np.int8:
        raise FormatError(f"{fmt}: KV values must be int8 [tokens, width], "
                          f"got {x.dtype} {x.shape}")
    L = _checked(fmt, buf, cap, x.shape[1])
    T_new = pos + x.shape[0]
    if pos < 0 or T_new > cap:
        raise FormatError(f"{fmt}: tokens {pos}..{T_new - 1} do not fit a region of "
                          f"{cap} tokens")
    T_old = length(fmt, buf) if fmt.stateful else pos
    if T_old > cap:
        raise FormatError(f"{fmt}: region header says {T_old} tokens, capacity is {cap}")
    if pos > T_old:
        raise FormatError(f"{fmt}: writing at position {pos} would leave a gap after the "
                          f"{T_old} cached tokens")
    ranges = write_ranges(fmt, T_old, pos, T_new)
    values = []
    for a, b in ranges:  # read everything first: ring slots get reused
        old = _get(fmt, buf, L, T_old, a, min(b, pos)) if a < pos else None
        new = x[max(a, pos) - pos:b - pos] if b > pos else None
        parts = [p for p in (old, new) if p is not None and p.shape[0]]
        values.append(np.concatenate(parts) if len(parts) > 1 else parts[0])
    # Clear what no longer holds a cached token (ring slots of tokens leaving the tail,
    # records and blocks cut off by a truncation), so a region's bytes depend only on the
    # cached tokens, not on how the writes were chunked. A kept token that comes back into
    # the tail keeps its quantized record in its slot (the ring holds what it reads); when
    # it leaves the tail again that record stays, so the token reads back exactly as before
    # (re-quantizing what it reads need not give its codes back).
    patches = []
    qo, qn = _q_end(fmt, T_old), _q_end(fmt, T_new)
    held = held_from(fmt, buf, cap)
    clear = [(max(T_new, held), T_old)]
    if qo < qn:
        clear.append((qo, min(qn, T_old)))
    for a, b in clear:
        for kind, a0, b0, off in runs(fmt, L, T_old, a, b) if a < b else ():
            nb = span_bytes(fmt, L, kind, a0, b0)
            buf[off:off + nb] = 0
            patches.append((off, nb))
    span = _slot_span(fmt, L, pos, T_old) if fmt.stateful and not fmt.ring else None
    if span is not None:  # the slots of dropped and overwritten tokens
        off, nb = span
        buf[off:off + nb] = 0
        patches.append(span)
    keep = (qo, min(qn, pos))  # kept tokens that leave the tail with this write
    for (a, _), vals in zip(ranges, values, strict=True):
        patches += _put(fmt, buf, L, T_new, a, vals, keep)
    if fmt.ring:  # what it held below pos, then the new tokens
        first = max(min(held, pos), T_new - L.quant_slots)
        buf[:8] = np.array([T_new, first], "<u4").view(np.uint8)
        patches.append((0, 8))
    elif fmt.stateful:
        buf[:4] = np.array([T_new], "<u4").view(np.uint8)
        patches.append((0, 4))
    return patches


def read(fmt: KVFormat, buf: np.ndarray, cap: int, width: int, pos: int = 0,
         tokens: int | None = None, *, q24: bool = False) -> np.ndarray:
    """KvRead / Attn: int8 ``[tokens, width]`` of positions ``pos ..`` of the cache in
    region ``buf`` (``tokens`` defaults to the rest of the cached tokens; formats without a
    header need it). ``q24``: the exact dequantized values instead, int64 in Q24 units of
    the int8 grid (the dequantize-on-read path, :func:`isa.kv.codec.dequantize_q24`)."""
    L = _checked(fmt, buf, cap, width)
    T = length(fmt, buf)
    if T is not None and T > cap:
        raise FormatError(f"{fmt}: region header says {T} tokens, capacity is {cap}")
    if tokens is None:
        if T is None:
            raise FormatError(f"{fmt}: regions have no length header; give tokens")
        tokens = T - pos
    if T is None:
        T = pos + tokens
    if pos < 0 or tokens < 0 or pos + tokens > min(T, cap):
        raise FormatError(f"{fmt}: tokens {pos}..{pos + tokens - 1} are not in a cache of "
                          f"{T} tokens (capacity {cap})")
    if tokens and pos < held_from(fmt, buf, cap):
        raise FormatError(f"{fmt}: tokens {pos}..{pos + tokens - 1} are no longer in the "
                          f"sliding-window cache (it holds {held_from(fmt, buf, cap)}..{T - 1})")
    return _get(fmt, buf, L, T, pos, pos + tokens, q24)


def encode(fmt: KVFormat, x: np.ndarray, cap: int) -> np.ndarray:
    """A fresh region of ``cap`` tokens holding int8 ``x[T, width]``."""
    x = np.asarray(x)
    if x.ndim != 2:
        raise FormatError(f"{fmt}: a cache holds [tokens, width] values, got {x.shape}")
    buf = np.zeros(layout(fmt, cap, x.shape[1]).nbytes, np.uint8)
    write(fmt, buf, cap, 0, x)
    return buf


def round_trip(fmt: KVFormat, x: np.ndarray) -> np.ndarray:
    """int8 ``x[T, width]`` written at once to a region of ``T`` tokens and read back: what
    a cache of ``fmt`` gives back for those values."""
    x = np.asarray(x)
    if x.ndim != 2:
        raise FormatError(f"{fmt}: a cache holds [tokens, width] values, got {x.shape}")
    t, w = x.shape
    return read(fmt, encode(fmt, x, t), t, w, 0, t)
