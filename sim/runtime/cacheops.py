"""KV-cache operations: dump and load over the host link, on-device rearrangement
programs, and the host-side edit pipeline.

Two ways to edit a cache, so their costs can be compared on the same cache:

- **host**: dump every cache over PCIe (device to host), decode the bytes on the host,
  run the edit (a user function), encode, load everything back over PCIe (host to
  device). Host time comes from the hardware preset's host cost model
  (``host.edit_overhead_ns + bytes / host.edit_bytes_per_s``), or, in "in-the-loop" mode,
  from the measured wall time of the user's function; both are reported.
- **device**: a program per cache of ``KvRead`` (decode the kept runs of tokens into SRAM),
  ``DmaStore`` to a DRAM scratch area, then ``DmaLoad`` + ``KvWrite`` (re-encode them at
  their new positions): only DRAM traffic, no PCIe.

A cache region holds ``heads`` sub-caches (one per KV head) of ``head_bytes`` each, each in
the format's region layout (``isa.kvformats``).
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from isa.instructions import DmaLoad, DmaStore, HostRead, HostWrite, KvRead, KvWrite, Program
from kvsim.errors import KvsimError
from models.compiler import CompiledModel
from models.compiler.flags import CACHE_OPS, Flags
from models.compiler.kvspec import KvCacheSpec


class CacheOpError(KvsimError, ValueError):
    """A cache operation was refused (bad buffers, files, sizes, masks); the device cache
    is left exactly as it was."""


def head_caches(cm: CompiledModel, slot: int | None = None) -> list[tuple[KvCacheSpec, int]]:
    """Every KV head's sub-cache of the caches of ``slot`` (or of every slot): its cache's
    spec and its DRAM address."""
    return [(c, c.head_base(h)) for c in cm.kv_caches(slot) for h in range(c.heads)]


def runs_of(positions: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted positions as maximal runs ``(start, length)``."""
    out: list[tuple[int, int]] = []
    for p in positions:
        if out and out[-1][0] + out[-1][1] == p:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((p, 1))
    return out


def rearrange_program(cm: CompiledModel, *, slot: int, keep: Sequence[int], dst: int,
                      name: str = "rearrange") -> Program:
    """The device program that rewrites every cache of ``slot`` from position ``dst`` on
    with the tokens at positions ``keep`` (sorted, each ``>= dst``), in order.

    Per sub-cache, on cores in turn: ``KvRead`` each run of kept tokens into SRAM and store
    it to the core's DRAM scratch; then load the scratch back in chunks and ``KvWrite``
    them at ``dst, dst+1, ...`` (the write truncates the cache at ``dst`` first). With no
    kept tokens nothing is written: the host's ``cache_size`` says where the cache ends,
    and the next append truncates it there.
    """
    keep = list(keep)
    if any(p < dst for p in keep) or keep != sorted(set(keep)):
        raise CacheOpError("kept positions must be sorted, distinct and >= the first "
                           "rewritten position")
    cores = cm.cores
    flags = Flags(CACHE_OPS, cores)
    flag = {(c, f): flags.sem(c, f) for c in cores for f in CACHE_OPS.per_core}
    scratch = cm.mm["act.kvtmp"]
    ins = []
    formats: list[str] = []
    from isa import kvformats

    def fmt_index(fmt) -> int:
        text = kvformats.to_text(fmt)
        if text not in formats:
            formats.append(text)
        return formats.index(text)

    subs = head_caches(cm, slot)
    state = {c: {"stored": 0, "written": 0} for c in cores}
    for i, (sc, base) in enumerate(subs):
        c = cores[i % len(cores)]
        st = state[c]
        per_core = scratch.size // len(cores)
        tmp = scratch.base + cores.index(c) * per_core
        # SRAM budget: a quarter of the core's SRAM for the staging buffer
        chunk = max(1, (cm.hw.sram_bytes // 4) // sc.width)
        buf = 0
        f = fmt_index(sc.format)
        # phase 1: kept runs -> SRAM -> scratch (in order)
        off = 0
        for start, n in runs_of(keep):
            for a in range(start, start + n, chunk):
                k = min(chunk, start + n - a)
                ins.append(KvRead(core=c, fmt=f, tokens=k, width=sc.width, pos=a, cap=cm.cap,
                                  src=base, dst=buf, nbytes=sc.head_bytes,
                                  wait=(flag[(c, "out_vpu")],) if st["stored"] else (),
                                  signal=(flag[(c, "vpu_out")],)))
                ins.append(DmaStore(core=c, src=buf, dst=tmp + off * sc.width,
                                    nbytes=k * sc.width, wait=(flag[(c, "vpu_out")],),
                                    signal=(flag[(c, "out_vpu")],)))
                st["stored"] += 1
                off += k
        # the last store also releases phase 2
        if ins and isinstance(ins[-1], DmaStore) and off:
            ins[-1] = ins[-1].replace(signal=ins[-1].signal + (flag[(c, "out_in")],))
        # phase 2: scratch -> SRAM -> KvWrite at dst, dst+1, ...
        total = off
        if total == 0:
            continue
        for j, a in enumerate(range(0, total, chunk)):
            k = min(chunk, total - a)
            ins.append(DmaLoad(core=c, src=tmp + a * sc.width, dst=buf, nbytes=k * sc.width,
                               wait=((flag[(c, "out_in")],) if j == 0 else ())
                               + ((flag[(c, "vpu_in")],) if st["written"] else ()),
                               signal=(flag[(c, "in_vpu")],)))
            ins.append(KvWrite(core=c, fmt=f, tokens=k, width=sc.width, pos=dst + a,
                               cap=cm.cap, src=buf, dst=base, nbytes=sc.head_bytes,
                               wait=(flag[(c, "in_vpu")],), signal=(flag[(c, "vpu_in")],)))
            st["written"] += 1
    return Program(tuple(ins), formats=tuple(formats), name=name)


def requantize_program(cm: CompiledModel, *, slot: int, tokens: int, via,
                       name: str = "requantize",
                       firsts: dict[str, int] | None = None) -> Program:
    """The device program that passes tokens ``0 .. tokens-1`` of every cache of ``slot``
    through KV format ``via`` and back (the values end up on ``via``'s grid, stored in
    the model's own format; ``via`` a ``KVPair`` passes K caches through its ``k`` and V
    caches through its ``v``, an MLA latent cache through ``k``): per sub-cache,
    ``KvRead`` into SRAM, ``KvWrite`` into the scratch area in format ``via``, ``KvRead``
    it back, ``KvWrite`` into the cache.
    ``firsts``: per cache name, the first position it holds (a sliding-window ring holds
    only its last positions; it passes those, ``first .. tokens-1``)."""
    from isa import kvformats

    cores = cm.cores
    flags = Flags(CACHE_OPS, cores)
    flag = {(c, f): flags.sem(c, f) for c in cores for f in CACHE_OPS.per_core}
    scratch = cm.mm["act.kvtmp"]
    vias = via if isinstance(via, kvformats.KVPair) else kvformats.KVPair(via, via)
    ins = []
    # the via formats first (so a single via is entry 0, as before), then the caches'
    formats: list[str] = list(dict.fromkeys(kvformats.to_text(f) for f in vias))
    for i, (sc, base) in enumerate(head_caches(cm, slot)):
        c = cores[i % len(cores)]
        text = kvformats.to_text(sc.format)
        if text not in formats:
            formats.append(text)
        f = formats.index(text)
        via = vias.v if sc.component == "v" else vias.k
        fv = formats.index(kvformats.to_text(via))
        per_core = scratch.size // len(cores)
        tmp = scratch.base + cores.index(c) * per_core
        need = via.region_bytes(cm.cap, sc.width)
        if need > per_core:
            raise CacheOpError(f"{kvformats.to_text(via)}: a {cm.cap}-token region of "
                               f"{need} bytes exceeds the {per_core}-byte scratch area")
        first = (firsts or {}).get(sc.name, 0)
        n = tokens - first
        if n * sc.width > cm.hw.sram_bytes // 2:
            raise CacheOpError(f"requantizing {n} tokens at once needs "
                               f"{n * sc.width} bytes of SRAM; the core has "
                               f"{cm.hw.sram_bytes}")
        if n <= 0:
            continue
        ins += [
            KvRead(core=c, fmt=f, tokens=n, width=sc.width, pos=first, cap=cm.cap,
                   src=base, dst=0, nbytes=sc.head_bytes),
            KvWrite(core=c, fmt=fv, tokens=n, width=sc.width, pos=0, cap=cm.cap, src=0,
                    dst=tmp, nbytes=need),
            KvRead(core=c, fmt=fv, tokens=n, width=sc.width, pos=0, cap=cm.cap,
                   src=tmp, dst=0, nbytes=need),
            KvWrite(core=c, fmt=f, tokens=n, width=sc.width, pos=first, cap=cm.cap, src=0,
                    dst=base, nbytes=sc.head_bytes),
        ]
    del flag
    return Program(tuple(ins), formats=tuple(formats), name=name)


# --- dumps and files ----------------------------------------------------------------------

FILE_MAGIC = b"KVSIMKV\x00"
FILE_VERSION = 1
_HEADER = "<8sHII"  # magic, version, json length, crc32 of the payload


def model_identity(cm: CompiledModel) -> str:
    """What a cache dump must match to be loaded: model, the weights themselves (a cheap
    digest, :func:`models.digest.weights_digest`: a model of the same shape with other
    weights writes other keys and values), bits, formats, capacity, slots."""
    from isa import kvformats
    from models.digest import weights_digest

    m = cm.model
    return (f"{m.name or m.family}|L{m.num_layers}|H{m.hidden_size}|kv{m.num_kv_heads}x"
            f"{m.head_dim}|{weights_digest(cm.weights)}|{cm.bits.weights.model_dump_json()}|"
            f"{kvformats.to_text(cm.k_fmt)}|{kvformats.to_text(cm.v_fmt)}|cap{cm.cap}|"
            f"slots{cm.slots}")


def pack_file(meta: dict, payload: bytes) -> bytes:
    import json
    import struct

    js = json.dumps(meta, sort_keys=True).encode()
    head = struct.pack(_HEADER, FILE_MAGIC, FILE_VERSION, len(js), zlib.crc32(payload))
    return head + js + payload


def unpack_file(data: bytes, where: str) -> tuple[dict, bytes]:
    import json
    import struct

    n = struct.calcsize(_HEADER)
    if len(data) < n:
        raise CacheOpError(f"{where}: truncated header ({len(data)} bytes)")
    magic, version, jlen, crc = struct.unpack(_HEADER, data[:n])
    if magic != FILE_MAGIC:
        raise CacheOpError(f"{where}: not a kvsim cache file")
    if version != FILE_VERSION:
        raise CacheOpError(f"{where}: cache file version {version}, this kvsim reads "
                           f"{FILE_VERSION}")
    try:
        meta = json.loads(data[n : n + jlen])
    except (ValueError, UnicodeDecodeError):
        raise CacheOpError(f"{where}: corrupt header") from None
    if not isinstance(meta, dict):
        raise CacheOpError(f"{where}: corrupt header (a JSON {type(meta).__name__}, "
                           "not an object)")
    payload = data[n + jlen :]
    if len(payload) != meta.get("size"):
        raise CacheOpError(f"{where}: holds {len(payload)} bytes, its header says "
                           f"{meta.get('size')}")
    if zlib.crc32(payload) != crc:
        raise CacheOpError(f"{where}: checksum mismatch (the file is corrupt)")
    return meta, payload


# --- host-side edits ----------------------------------------------------------------------


@dataclass
class CacheView:
    """One decoded cache of the host-side edit pipeline: ``values`` int8 ``[tokens, heads,
    width]`` (edit them, or return new ones) and the raw region bytes it came from.
    ``values[i]`` is position ``first + i``: a sliding-window layer's ring (``window``
    set) holds only its last positions, ``first ..``; other caches hold every position
    (``first`` 0)."""

    name: str
    layer: int
    component: str
    values: np.ndarray
    raw: bytes
    fmt: Any
    first: int = 0
    window: int | None = None

    @property
    def end(self) -> int:
        """One past the last position the view holds."""
        return self.first + self.values.shape[0]


@dataclass
class EditResult:
    op: str
    where: str  # "host" | "device"
    time_s: float
    pcie_bytes: int
    dram_bytes: int
    host_model_s: float = 0.0
    host_measured_s: float = 0.0
    new_cache_size: int = 0
    details: dict = field(default_factory=dict)

    def as_metrics(self) -> dict:
        return {"op": self.op, "where": self.where, "time_s": self.time_s,
                "pcie_bytes": self.pcie_bytes, "dram_bytes": self.dram_bytes,
                "host_model_s": self.host_model_s, "host_measured_s": self.host_measured_s,
                "new_cache_size": self.new_cache_size}


EditFn = Callable[[list[CacheView]], list[np.ndarray] | None]


def _is_int(v: Any) -> bool:
    """An integer (numpy integers too; not bool, not a float)."""
    return isinstance(v, int | np.integer) and not isinstance(v, bool)


def check_positions(drop, cache_size: int | None = None, *, where: str = "evict") -> list[int]:
    """``drop`` as sorted distinct Python ints, or :class:`CacheOpError` naming the problem.

    Positions are integers (Python or numpy integers; not bools, not floats), each in
    ``0 .. cache_size-1`` (``>= 0`` when ``cache_size`` is None), given as a sequence or a
    1-D integer array. A boolean array is refused, not read as a mask: pass
    ``np.flatnonzero(mask)`` to drop the positions where a mask is true."""
    span = f"in 0..{cache_size - 1}" if cache_size is not None else ">= 0"
    if isinstance(drop, np.ndarray):
        if drop.dtype == bool:
            raise CacheOpError(f"{where}: positions must be integers, got a boolean array; "
                               "to drop where a mask is true pass np.flatnonzero(mask)")
        if drop.ndim != 1:
            raise CacheOpError(f"{where}: positions must be a 1-D sequence of integers "
                               f"{span}, got an array of shape {drop.shape}")
        items = list(drop)
    elif isinstance(drop, list | tuple | set | frozenset | range):
        items = list(drop)
    else:
        raise CacheOpError(f"{where}: positions must be a sequence of integers {span}, "
                           f"got {type(drop).__name__}")
    for p in items:
        if not _is_int(p):
            raise CacheOpError(f"{where}: positions must be integers {span}, got {p!r}")
    out = sorted({int(p) for p in items})
    bad = [p for p in out if p < 0 or (cache_size is not None and p >= cache_size)]
    if bad:
        raise CacheOpError(f"{where}: positions must lie {span}, got {bad[0]}")
    return out


def _check_count(name: str, v: Any, where: str) -> int:
    if not _is_int(v) or v < 0:
        raise CacheOpError(f"{where}: {name} must be an integer >= 0, got {v!r}")
    return int(v)


def as_format(fmt, where: str):
    """A KV format given as a ``KVFormat`` or its name/spec (``isa.kvformats.parse``);
    anything else, or an unknown name, raises :class:`CacheOpError` naming it."""
    from isa import kvformats
    from isa.errors import FormatError

    if isinstance(fmt, kvformats.KVFormat):
        return fmt
    if not isinstance(fmt, str):
        raise CacheOpError(f"{where}: expected a KV format or its name, got "
                           f"{type(fmt).__name__} {fmt!r}")
    try:
        return kvformats.parse(fmt)
    except FormatError as err:
        raise CacheOpError(f"{where}: {err}") from None


def as_layout(via, where: str):
    """A requantization's target: a ``KVFormat`` or ``KVPair`` as given, a K/V layout name
    whose K and V formats differ (``kivi-4``) as its ``KVPair``, else :func:`as_format`."""
    from isa import kvformats

    if isinstance(via, kvformats.KVPair):
        return via
    if isinstance(via, str) and via.strip() in kvformats.PAIRS:
        p = kvformats.PAIRS[via.strip()]
        return p if p.k != p.v else p.k
    return as_format(via, where)


def evict_positions(drop: Sequence[int]) -> EditFn:
    """A host edit that removes the tokens at positions ``drop`` from every cache.
    ``drop``: integers >= 0 (see :func:`check_positions`; a boolean mask is refused), checked
    here; a position at or past the cache's end is refused when the edit runs."""
    drop_set = set(check_positions(drop, where="evict_positions"))

    def edit(views: list[CacheView]) -> list[np.ndarray]:
        t = max((v.end for v in views), default=0)
        if drop_set and max(drop_set) >= t:
            raise CacheOpError(f"evict_positions: positions must lie in 0..{t - 1}, got "
                               f"{max(drop_set)}")
        check_held(views, drop_set, "evict_positions")
        return [v.values[[i for i in range(v.values.shape[0]) if v.first + i not in drop_set]]
                for v in views]

    return edit


def check_held(views: list[CacheView], drop: set[int], where: str) -> None:
    """Every dropped position must be held by every view: a sliding-window ring holds only
    ``first ..``; dropping an older position is refused, naming the cache and its span."""
    if not drop:
        return
    low = min(drop)
    for v in views:
        if low < v.first:
            raise CacheOpError(f"{where}: position {low} is outside the sliding window of "
                               f"layer {v.layer} ({v.name}): its ring holds positions "
                               f"{v.first}..{v.end - 1} only; positions older than the "
                               "window cannot be evicted")


def requantize_through(fmt) -> EditFn:
    """A host edit that passes every value through KV format ``fmt`` and back (e.g. an
    int8 cache requantized to 4 bits, stored again as int8). ``fmt``: a ``KVFormat`` or a
    name/spec ``isa.kvformats.parse`` accepts (checked here)."""
    fmt = as_format(fmt, "requantize_through")

    def edit(views: list[CacheView]) -> list[np.ndarray]:
        out = []
        for v in views:
            t, h, w = v.values.shape
            flat = v.values.transpose(1, 0, 2).reshape(h, t, w)
            back = np.stack([fmt.round_trip(flat[i]) for i in range(h)])
            out.append(back.reshape(h, t, w).transpose(1, 0, 2).copy())
        return out

    return edit


def round_trip(quantize: Callable, pack: Callable, unpack: Callable,
               dequantize: Callable) -> EditFn:
    """A user-defined quantize -> pack -> unpack -> dequantize pipeline applied to every
    cache's values (each function takes and returns numpy arrays)."""

    def edit(views: list[CacheView]) -> list[np.ndarray]:
        out = []
        for v in views:
            back = dequantize(unpack(pack(quantize(v.values))))
            back = np.asarray(back)
            if back.shape != v.values.shape:
                raise CacheOpError(f"{v.name}: the round trip returned shape {back.shape}, "
                                   f"expected {v.values.shape}")
            out.append(np.clip(np.rint(back), -128, 127).astype(np.int8))
        return out

    return edit


def score_eviction(keep_sinks: int, keep_recent: int, budget: int) -> EditFn:
    """An attention-score policy (H2O-style, scored on the host from the cache alone):
    keep the first ``keep_sinks`` and last ``keep_recent`` tokens, and from the rest the
    ``budget`` tokens whose keys have the largest L2 norm summed over layers and heads
    (large keys draw large attention scores). The same positions are evicted from every
    cache, so the model stays consistent. Each argument: an integer >= 0 (checked here)."""
    keep_sinks = _check_count("keep_sinks", keep_sinks, "score_eviction")
    keep_recent = _check_count("keep_recent", keep_recent, "score_eviction")
    budget = _check_count("budget", budget, "score_eviction")

    def edit(views: list[CacheView]) -> list[np.ndarray]:
        t = max((v.end for v in views), default=0)
        score = np.zeros(t)
        for v in views:  # a sliding-window ring scores the positions it holds
            if v.component in ("k", "c"):
                score[v.first:v.end] += np.linalg.norm(v.values.astype(np.float64),
                                                       axis=2).sum(axis=1)
        middle = list(range(keep_sinks, max(keep_sinks, t - keep_recent)))
        ranked = sorted(middle, key=lambda p: (-score[p], p))[:budget]
        keep = sorted(set(range(min(keep_sinks, t))) | set(ranked)
                      | set(range(max(keep_sinks, t - keep_recent), t)))
        check_held(views, set(range(t)) - set(keep), "score_eviction")
        return [v.values[[p - v.first for p in keep if p >= v.first]] for v in views]

    return edit


def measure(fn: EditFn, views: list[CacheView]) -> tuple[list[np.ndarray] | None, float]:
    t0 = time.perf_counter()
    out = fn(views)
    return out, time.perf_counter() - t0


__all__ = ["CacheOpError", "CacheView", "EditResult", "as_format", "as_layout", "check_held",
           "check_positions",
           "evict_positions", "requantize_through",
           "round_trip", "score_eviction", "rearrange_program", "requantize_program",
           "head_caches", "runs_of", "HostRead", "HostWrite"]
