"""What a KV cache region's header says (:mod:`.region`): the token count ``T`` (uint32
little-endian; formats whose records' places depend on the cache length only), and for a
sliding-window ring also the first position ``F`` it still holds (a second uint32), from
which follow the positions a ring holds and the keys an attention over it reads."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..errors import FormatError

if TYPE_CHECKING:
    from .format import KVFormat


def length(fmt: KVFormat, buf: np.ndarray) -> int | None:
    """The token count in a region's header (None for formats without a header)."""
    if not fmt.stateful:
        return None
    b = np.asarray(buf).reshape(-1).view(np.uint8)
    return int(b[0]) | int(b[1]) << 8 | int(b[2]) << 16 | int(b[3]) << 24


def held_from(fmt: KVFormat, buf: np.ndarray, cap: int) -> int:
    """The first position a region still holds (0 except for rings: header word 2)."""
    if not fmt.ring:
        return 0
    first = int(np.asarray(buf).reshape(-1).view(np.uint8)[4:8].view("<u4")[0])
    return max(first, length(fmt, buf) - min(cap, fmt.ring))


def last_keys_first(fmt: KVFormat, buf: np.ndarray, cap: int, keys: int) -> int:
    """The first of the last ``keys`` positions of a ring region's cache (what Attn over a
    sliding-window cache reads); 0 for other formats. An error if the ring no longer holds
    them all."""
    if not fmt.ring:
        return 0
    T = length(fmt, buf)
    first = T - keys
    if keys < 1 or first < held_from(fmt, buf, cap):
        raise FormatError(f"{fmt}: the last {keys} positions of a cache of {T} tokens are "
                          f"not all held (it holds {held_from(fmt, buf, cap)}..{T - 1})")
    return first
