"""The DRAM traffic of a KV cache region (:mod:`.region`): what a read of some positions
moves, what an append reads and writes, and how many bytes of records a cache of ``T``
tokens holds. Built on the region's token-to-slot runs (:func:`.region.runs`), so the
traffic counts the same records the reads and writes touch.

The counts are pure functions of (format, positions, width) and are asked for again and
again (every layer's attention of a decode step reads the same length; the simulator times
each instruction by them), so they are kept per argument tuple (:data:`CACHED_COUNTS`
entries each), computed from plain ints."""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

from ..errors import FormatError
from .region import layout, runs, span_bytes, write_ranges

if TYPE_CHECKING:
    from .format import KVFormat


#: Argument tuples whose counts each function keeps (least recently used beyond).
CACHED_COUNTS = 1 << 16


def read_bytes(fmt: KVFormat, pos: int, tokens: int, width: int, *,
               cached: int | None = None) -> int:
    """DRAM bytes a read of positions ``pos .. pos+tokens-1`` moves (see
    :func:`_read_bytes`)."""
    return _read_bytes(fmt, int(pos), int(tokens), int(width),
                       None if cached is None else int(cached))


@lru_cache(maxsize=CACHED_COUNTS)
def _read_bytes(fmt: KVFormat, pos: int, tokens: int, width: int,
                cached: int | None) -> int:
    """DRAM bytes a read of positions ``pos .. pos+tokens-1`` moves from a region whose
    cache holds ``cached`` tokens (default ``pos + tokens``): the header and every record
    or block it touches. Reading a whole cache of T tokens moves
    ``header_bytes + bytes(T)`` (page padding excluded)."""
    T = pos + tokens if cached is None else cached
    L = layout(fmt, max(T, 1), width)
    return L.header + sum(span_bytes(fmt, L, k, a, b)
                          for k, a, b, _ in runs(fmt, L, T, pos, pos + tokens))


def write_bytes(fmt: KVFormat, pos: int, tokens: int, width: int) -> tuple[int, int]:
    """DRAM ``(read, written)`` bytes of appending ``tokens`` tokens at ``pos`` (see
    :func:`_write_bytes`)."""
    return _write_bytes(fmt, int(pos), int(tokens), int(width))


@lru_cache(maxsize=CACHED_COUNTS)
def _write_bytes(fmt: KVFormat, pos: int, tokens: int, width: int) -> tuple[int, int]:
    """DRAM ``(read, written)`` bytes of appending ``tokens`` tokens at ``pos`` to a cache
    of ``pos`` tokens: the header, the full-precision records re-quantized as they leave
    the window (read) and every record or block written."""
    T_new = pos + tokens
    L = layout(fmt, max(T_new, 1), width)
    rd = wr = L.header
    for a, b in write_ranges(fmt, pos, pos, T_new):
        if a < pos:
            rd += sum(span_bytes(fmt, L, k, a0, b0)
                      for k, a0, b0, _ in runs(fmt, L, pos, a, min(b, pos)))
        wr += sum(span_bytes(fmt, L, k, a0, b0) for k, a0, b0, _ in runs(fmt, L, T_new, a, b))
    return rd, wr


def cache_bytes(fmt: KVFormat, tokens: int, width: int) -> int:
    """Bytes of the records a region holding ``tokens`` tokens uses (header excluded), plus
    the zero records that fill the last page of a paged format. Not monotonic in ``tokens``
    for per-channel formats (``G`` tail records collapse into one block); the region
    (:func:`layout`) holds every length up to its capacity."""
    if tokens < 0:
        raise FormatError(f"{fmt}: token count must be >= 0, got {tokens}")
    L = layout(fmt, max(tokens, 1), width)
    t0 = max(0, tokens - fmt.ring) if fmt.ring else 0  # a ring holds its last R tokens
    used = sum(span_bytes(fmt, L, k, a, b) for k, a, b, _ in runs(fmt, L, tokens, t0, tokens))
    if fmt.page and tokens % fmt.page:
        used += (fmt.page - tokens % fmt.page) * fmt.record_bytes(width)
    return used
