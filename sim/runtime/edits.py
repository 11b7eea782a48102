"""Cache edits: on the host (dump over PCIe, decode, the user's function, encode, load
back) and the same edits on the device (KvRead/KvWrite programs through DRAM scratch, no
PCIe), so their costs can be compared on the same cache (``sim.runtime.cacheops`` has the edit
functions and the programs)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from sim.runtime.cacheops import (
    CacheOpError,
    CacheView,
    EditFn,
    EditResult,
    as_layout,
    check_positions,
    measure,
    requantize_program,
)
from sim.runtime.checks import check_size
from sim.runtime.deviceops import cache_groups, rearrange
from sim.runtime.rings import check_window, held_in, held_on_device, ring_specs
from sim.runtime.types import CallRecord

if TYPE_CHECKING:
    from sim.runtime.model import Model


def cache_views(model: Model, bufs: list[bytes], cache_size: int,
                cache_id: int) -> list[CacheView]:
    """Slot ``cache_id`` of every dumped cache decoded into a view (tokens x heads x width)."""
    cm = model.compiled
    views = []
    for group, blob in zip(cache_groups(model), bufs, strict=True):
        c = group[cache_id]
        region = np.frombuffer(blob, np.uint8, c.region.size,
                               cache_id * c.region.size)
        fmt, w, hb = c.format, c.width, c.head_bytes
        # a sliding-window ring holds only its last positions
        first = min(held_in(c, region, cm.cap)[0], cache_size) if fmt.ring else 0
        heads = [fmt.region_read(region[h * hb:(h + 1) * hb], cm.cap, w, first,
                                 cache_size - first) for h in range(c.heads)]
        views.append(CacheView(c.name, c.layer, c.component,
                               np.stack(heads, axis=1), blob, fmt, first=first,
                               window=c.window if fmt.ring else None))
    return views


def edit_on_host(model: Model, fn: EditFn, *, cache_size: int, cache_id: int = 0,
                 mode: str = "model", op: str = "host_edit") -> EditResult:
    """Dump every cache over PCIe, decode cache ``cache_id`` into views (tokens x heads
    x width int8, plus the raw bytes), run ``fn(views)`` (it returns new values per
    view, or None to keep them; edits made in place to ``view.values`` are applied
    either way), encode the changes, and load everything back over PCIe. Host time: the
    hardware's host cost model (``mode="model"``, the default, deterministic) or the
    measured wall time of ``fn`` (``mode="in_the_loop"``); both are reported. Returns
    the cost and the new cache size. ``fn`` must be callable (checked before the dump);
    what it returns must be None or a list of one int8 array (tokens, heads, width) per
    view, else :class:`CacheOpError` (after the dump: the time is spent, the cache is
    left as it was)."""
    cache_size, cache_id = check_size(model.compiled, cache_size, cache_id)
    if not callable(fn):
        raise CacheOpError(f"edit_cache_on_host: fn must be callable (views -> list of "
                           f"arrays or None), got {type(fn).__name__} {fn!r}")
    if mode not in ("model", "in_the_loop"):
        raise CacheOpError(f"mode must be 'model' or 'in_the_loop', got {mode!r}")
    acc, cm = model.acc, model.compiled
    start, before = model.acc.begin()
    bufs = model.dump_cache_memory()
    nbytes = sum(len(b) for b in bufs)
    host = acc.hw.host
    # decode and re-encode pass over every dumped byte once each
    modelled = (host.edit_overhead_ns * 1e-9 + 2 * nbytes / host.edit_bytes_per_s)
    if not acc.functional:
        # timing-only: the bytes are not real, only the costs are simulated
        if mode == "in_the_loop":
            raise CacheOpError("in-the-loop host time needs functional mode (real bytes "
                               "for the user's function)")
        acc.host_work(modelled * 1e9, op)
        model.load_cache_memory(bufs)
        rec = model.acc.end(op, start, before)
        t = rec.stats.get("traffic", {})
        return EditResult(op, "host", rec.time_s,
                          t.get("pcie_h2d", 0) + t.get("pcie_d2h", 0),
                          t.get("dram_read", 0) + t.get("dram_write", 0),
                          host_model_s=modelled, new_cache_size=cache_size)
    views = cache_views(model, bufs, cache_size, cache_id)
    # the decoded values as they were: the edit may change view.values in place
    olds = [v.values.copy() for v in views]
    new, measured = measure(fn, views)
    out = []
    if new is None:
        new = [v.values for v in views]
    new = check_edit(new, views)
    # a ring's values start at its first held position: its length counts from there
    sizes = {v.first + x.shape[0] for v, x in zip(views, new, strict=True)}
    if len(sizes) != 1:
        raise CacheOpError(f"the edit left caches of different lengths {sorted(sizes)}")
    new_size = sizes.pop()
    for v in views:
        if v.window is not None:
            check_window(name=v.name, layer=v.layer, window=v.window, first=v.first,
                         end=v.end, new_size=new_size, where="edit_cache_on_host")
    for group, blob, view, old_vals, vals in zip(cache_groups(model), bufs, views, olds,
                                                 new, strict=True):
        c = group[cache_id]
        if vals.dtype != np.int8 or vals.shape[1:] != old_vals.shape[1:]:
            raise CacheOpError(f"{view.name}: the edit returned {vals.dtype} "
                               f"{vals.shape}, expected int8 (tokens,"
                               f" {old_vals.shape[1]}, {old_vals.shape[2]})")
        if new_size > cm.cap:
            raise CacheOpError(f"{view.name}: {new_size} tokens exceed the capacity "
                               f"{cm.cap}")
        region = bytearray(blob)
        base = cache_id * c.region.size
        fmt, hb = c.format, c.head_bytes
        for h in range(c.heads):
            old, nv = old_vals[:, h], vals[:, h]
            same = min(len(old), len(nv))
            diff = np.nonzero((old[:same] != nv[:same]).any(axis=1))[0]
            dst = int(diff[0]) if diff.size else same
            if dst == len(nv) and len(nv) == len(old):
                continue
            sub = np.frombuffer(region, np.uint8, hb, base + h * hb).copy()
            if dst < len(nv):
                fmt.region_write(sub, cm.cap, view.first + dst, nv[dst:])
            region[base + h * hb: base + (h + 1) * hb] = sub.tobytes()
        out.append(bytes(region))
    acc.host_work((modelled if mode == "model" else measured) * 1e9, op)
    model.load_cache_memory(out)
    rec = model.acc.end(op, start, before)
    t = rec.stats.get("traffic", {})
    return EditResult(op, "host", rec.time_s, t.get("pcie_h2d", 0) + t.get("pcie_d2h", 0),
                      t.get("dram_read", 0) + t.get("dram_write", 0),
                      host_model_s=modelled, host_measured_s=measured,
                      new_cache_size=new_size)

def evict_on_device(model: Model, drop, *, cache_size: int, cache_id: int = 0,
                    op: str = "device_evict") -> EditResult:
    """Remove the tokens at positions ``drop`` from every cache with an on-device
    program (compaction by KvRead/KvWrite through DRAM scratch): no PCIe traffic.
    ``drop``: a sequence (or 1-D integer array) of integer positions in
    ``0 .. cache_size-1``; bools and floats are refused, and so is a boolean mask (pass
    ``np.flatnonzero(mask)``)."""
    cache_size, cache_id = check_size(model.compiled, cache_size, cache_id)
    drop_set = set(check_positions(drop, cache_size, where="evict"))
    if not drop_set:
        raise CacheOpError("evict: no positions to drop")
    first = min(drop_set)
    keep = [p for p in range(first, cache_size) if p not in drop_set]
    start, before = model.acc.begin()
    rearrange(model, op, keep, first, cache_id, cache_size=cache_size)
    rec = model.acc.calls[-1]
    rec = model.acc.calls[-1] = CallRecord(op, start, rec.end_ps, rec.stats)
    t = rec.stats.get("traffic", {})
    return EditResult(op, "device", rec.time_s, t.get("pcie_h2d", 0) + t.get("pcie_d2h", 0),
                      t.get("dram_read", 0) + t.get("dram_write", 0),
                      new_cache_size=first + len(keep))

def requantize_on_device(model: Model, via, *, cache_size: int, cache_id: int = 0,
                         op: str = "device_requantize") -> EditResult:
    """Pass every cached value through KV format ``via`` (a ``KVFormat``, or a name or
    spec ``isa.kvformats.parse`` accepts; a ``KVPair`` or a K/V layout name such as
    ``kivi-2``: K caches through its K format, V caches through its V format) and back,
    on the device. With
    ``cache_size=0`` there is nothing to requantize: only the call is paid."""
    cache_size, cache_id = check_size(model.compiled, cache_size, cache_id)
    via = as_layout(via, "requantize_on_device: via")
    acc = model.acc
    # built before any work: a format the scratch area or SRAM cannot hold is refused;
    # a sliding-window ring passes the positions it holds
    firsts = {c.name: min(held_on_device(model, c, cache_size), cache_size)
              for c in ring_specs(model, cache_id)}
    prog = requantize_program(model.compiled, slot=cache_id, tokens=cache_size, via=via,
                              name=op, firsts=firsts)
    start, before = model.acc.begin()
    acc.host_work(acc.hw.host.call_overhead_ns, op)
    if cache_size:  # an empty cache: only the call
        acc.run(prog, op)
    rec = model.acc.end(op, start, before)
    t = rec.stats.get("traffic", {})
    return EditResult(op, "device", rec.time_s, t.get("pcie_h2d", 0) + t.get("pcie_d2h", 0),
                      t.get("dram_read", 0) + t.get("dram_write", 0),
                      new_cache_size=cache_size)


def check_edit(new: Any, views: list[CacheView]) -> list[np.ndarray]:
    """What a host edit returned, as one 3-D array per view, or :class:`CacheOpError`."""
    want = (f"expected a list of {len(views)} int8 arrays (tokens, heads, width) or None")
    if not isinstance(new, list | tuple):
        raise CacheOpError(f"edit_cache_on_host: the edit returned {type(new).__name__}; "
                           f"{want}")
    if len(new) != len(views):
        raise CacheOpError(f"edit_cache_on_host: the edit returned {len(new)} caches, "
                           f"expected {len(views)}")
    out = []
    for view, x in zip(views, new, strict=True):
        what = type(x).__name__
        try:
            a = np.asarray(x) if isinstance(x, np.ndarray | list | tuple) else None
        except (TypeError, ValueError):
            a, what = None, f"ragged {what}"
        if a is None or a.ndim != 3 or a.dtype == object:
            if a is not None:
                what = f"{what} {a.dtype} {a.shape}"
            raise CacheOpError(f"{view.name}: the edit returned {what}; {want}")
        out.append(a)
    return out


__all__ = ["cache_views", "check_edit", "edit_on_host", "evict_on_device",
           "requantize_on_device"]
