"""Cache edits of a model with sliding-window layers, whose K/V caches are rings
(``isa.kv.region``): a ring of ``R`` slots holds only the positions ``F .. T-1`` of a
cache of ``T`` tokens (``F >= T - R``); the older ones are overwritten and gone.

What follows for the cache operations (dump, load, host edits, on-device eviction and the
tail rearrangements, which truncate the cache at the first rewritten position):

- a position a ring no longer holds cannot be evicted, filtered or moved: the operation
  is refused before anything runs, naming the layer and the positions its ring holds;
- after the edit, the next token's window (``W`` positions ending at it) must still be
  held by every ring, else that token could not attend to its window: refused as well;
- a dump file of a ring cache says its window and which positions it holds, and a dump
  of a different window is refused by name (``window``) when it is loaded.

In functional mode a ring's held positions come from its region header (the device's
real bytes); in timing-only mode (no real bytes) from the host's ``cache_size``: a ring
holds the last ``min(cache_size, R)`` positions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from isa.kv import header
from models.compiler.kvspec import KvCacheSpec
from sim.runtime.cacheops import CacheOpError

if TYPE_CHECKING:
    from sim.runtime.model import Model


def ring_slots(spec: KvCacheSpec, cap: int) -> int:
    """Record slots of a ring cache's region (0 for a cache that keeps every token)."""
    if not spec.format.ring:
        return 0
    return spec.format.region(cap, spec.width).quant_slots


def held_in(spec: KvCacheSpec, data: np.ndarray, cap: int) -> tuple[int, int]:
    """``(first, end)``: the positions a cache region (one slot's bytes, every head; the
    heads share one header) holds by its header; ``(0, T)`` for non-ring formats with a
    header, ``(0, 0)`` for formats without one."""
    fmt = spec.format
    head = np.asarray(data, np.uint8)[:spec.head_bytes]
    end = fmt.region_length(head)
    if end is None:
        return 0, 0
    return (_first(spec, head, cap) if fmt.ring else 0), end


def _first(spec: KvCacheSpec, head: np.ndarray, cap: int) -> int:
    return header.held_from(spec.format, head, cap)


def ring_specs(model: Model, slot: int) -> list[KvCacheSpec]:
    """The ring caches (sliding-window layers) of cache slot ``slot``."""
    return [c for c in model.compiled.kv_caches(slot) if c.format.ring]


def held_on_device(model: Model, spec: KvCacheSpec, cache_size: int) -> int:
    """The first position ring cache ``spec`` holds on the device: from its header
    (functional mode), else ``max(0, cache_size - R)``."""
    cap = model.compiled.cap
    if not model.acc.functional:
        return max(0, cache_size - ring_slots(spec, cap))
    head = model.acc.device.mem.dram.read(spec.region.base, spec.head_bytes)
    return _first(spec, np.asarray(head, np.uint8), cap)


def check_window(*, name: str, layer: int, window: int, first: int, end: int,
                 new_size: int, where: str) -> None:
    """The next token after an edit leaving ``new_size`` tokens attends to the ``window``
    positions ending at it: the ring of cache ``name`` (holding ``first .. end-1``) must
    still hold them, else :class:`CacheOpError`."""
    need = max(0, new_size - window + 1)
    if need < first:
        raise CacheOpError(
            f"{where}: after the edit the cache holds {new_size} tokens and the next "
            f"token's window of {window} positions starts at {need}, but the sliding-"
            f"window ring of layer {layer} ({name}) no longer holds positions below "
            f"{first} (it holds {first}..{end - 1}); evict fewer positions")


def check_rearrange(model: Model, *, dst: int, new_size: int, cache_size: int,
                    cache_id: int, where: str) -> None:
    """An on-device rearrangement rewriting slot ``cache_id`` from position ``dst`` on
    (keeping ``new_size`` tokens) must touch only positions every ring holds, and leave
    the next token's window held; else :class:`CacheOpError` before anything runs."""
    for spec in ring_specs(model, cache_id):
        first = held_on_device(model, spec, cache_size)
        if dst < first:
            raise CacheOpError(
                f"{where}: position {dst} is outside the sliding window of layer "
                f"{spec.layer} ({spec.name}): its ring holds positions {first}.."
                f"{cache_size - 1} only; positions older than the window cannot be "
                "evicted or moved")
        assert spec.window is not None
        check_window(name=spec.name, layer=spec.layer, window=spec.window, first=first,
                     end=cache_size, new_size=new_size, where=where)


def check_dump_window(spec: KvCacheSpec, meta: dict, where: str) -> None:
    """A dump file's ``window`` (absent: a cache that keeps every token) must be the
    window of the cache it is loaded into."""
    got = meta.get("window")
    if got != spec.window:
        def say(w):
            return "none (every token kept)" if w is None else f"{w} tokens"

        raise CacheOpError(f"{where}: window {say(got)} (the dumped cache's sliding "
                           f"window) differs from this model's window of {spec.name}: "
                           f"{say(spec.window)}; dump and load with the same model")


def dump_meta(model: Model, spec: KvCacheSpec, blob: bytes, slot: int | None) -> dict:
    """The keys a dump file of ring cache ``spec`` adds: its window, its ring's slots and
    ``held`` ``[first, end]`` per dumped slot (the positions it holds)."""
    cm = model.compiled
    size = spec.region.size
    data = np.frombuffer(blob, np.uint8)
    held = []
    for i in range(1 if slot is not None else cm.slots):
        first, end = held_in(spec, data[i * size:(i + 1) * size], cm.cap)
        held.append([first, end])
    return {"window": spec.window, "ring_slots": ring_slots(spec, cm.cap), "held": held}


__all__ = ["check_dump_window", "check_rearrange", "check_window", "dump_meta", "held_in",
           "held_on_device", "ring_slots", "ring_specs"]
