"""``dump_cache_memory_to(dir)`` / ``load_cache_memory_from(dir)``: one file per cache,
``cache_<layer_hash>.bin``, each with a header (format version, model and KV-format
identity, cache name, size, the slot it holds, CRC-32 of the bytes; ``sim.runtime.cacheops``
packs it; a sliding-window layer's ring adds its ``window``, ``ring_slots`` and the
positions ``held`` per slot, :func:`.rings.dump_meta`). A load checks every file before
it changes anything (a ring dump of another window is refused by its ``window``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import sim.runtime.deviceops as deviceops
from sim.runtime.cacheops import CacheOpError, model_identity, pack_file, unpack_file
from sim.runtime.checks import check_bufs, folder
from sim.runtime.rings import check_dump_window, dump_meta

if TYPE_CHECKING:
    from sim.runtime.model import Model


def dump_to(model: Model, directory: Any, slot: int | None) -> list[Path]:
    """Dump the caches (of ``slot``; None: every slot) into ``directory``. Files are
    written atomically; a folder that cannot be made or written costs no device time."""
    from kvsim.files import atomic_write_bytes, probe_writable

    d = folder(directory, "dump_cache_memory_to")
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise CacheOpError(f"dump_cache_memory_to: cannot make the folder {str(d)!r} "
                           f"({err.strerror or err})") from None
    try:  # for real: os.access says yes to root on a read-only file system
        probe_writable(d, make=False)
    except OSError as err:
        raise CacheOpError(f"dump_cache_memory_to: cannot write into the folder "
                           f"{str(d)!r} ({err.strerror or err})") from None
    bufs = deviceops.dump(model, slot)
    ident = model_identity(model.compiled)
    paths = []
    groups = deviceops.cache_groups(model)
    for info, group, blob in zip(model.get_cache_infos(), groups, bufs, strict=True):
        meta = {"model": ident, "name": info.name, "cache_type": info.cache_type,
                "layer_hash": info.layer_hash, "size": len(blob),
                "num_batches": info.num_batches}
        if slot is not None:  # whole-model dumps keep the header they always had
            meta["cache_id"] = slot
        if group[0].format.ring:  # a sliding-window ring: its window, what it holds
            meta |= dump_meta(model, group[0], blob, slot)
        p = d / f"cache_{info.layer_hash}.bin"
        try:
            atomic_write_bytes(p, pack_file(meta, blob))
        except OSError as err:
            raise CacheOpError(f"dump_cache_memory_to: cannot write {str(p)!r} "
                               f"({err.strerror or err})") from None
        paths.append(p)
    return paths


#: The parts of :func:`sim.runtime.cacheops.model_identity`, in order.
IDENTITY_PARTS = ("model", "layers", "hidden size", "KV heads", "weights", "weight bits",
                  "K format", "V format", "capacity", "slots")


def _which_differs(dumped: Any, ident: str) -> str:
    """``: its weights differ`` (the first part of the identities that differs), or ''."""
    if not isinstance(dumped, str):
        return ""
    a, b = dumped.split("|"), ident.split("|")
    if len(a) != len(b) or len(b) != len(IDENTITY_PARTS):
        return ""
    return next((f": its {name} differ" + ("s" if not name.endswith("s") else "")
                 for name, x, y in zip(IDENTITY_PARTS, a, b, strict=True) if x != y), "")


def load_from(model: Model, directory: Any, slot: int | None) -> None:
    """Load the files :func:`dump_to` wrote into the caches (of ``slot``; None: every
    slot). Every file is checked first (present, header, model and format identity, name,
    size, checksum, whole-model or one-slot dump as asked); any problem refuses the whole
    load and leaves the device cache as it was. A one-slot dump loads into any slot."""
    d = folder(directory, "load_cache_memory_from")
    if not d.is_dir():
        raise CacheOpError(f"load_cache_memory_from: {str(d)!r} is not a directory")
    ident = model_identity(model.compiled)
    infos = model.get_cache_infos()
    bufs = []
    for info, group in zip(infos, deviceops.cache_groups(model), strict=True):
        p = d / f"cache_{info.layer_hash}.bin"
        if not p.is_file():
            raise CacheOpError(f"load_cache_memory_from: {p.name} is missing")
        meta, payload = unpack_file(p.read_bytes(), p.name)
        check_dump_window(group[0], meta, p.name)
        if meta.get("model") != ident:
            raise CacheOpError(f"{p.name}: dumped from another model or KV format"
                               f"{_which_differs(meta.get('model'), ident)} "
                               f"({meta.get('model')!r}; this model is {ident!r})")
        if meta.get("name") != info.name:
            raise CacheOpError(f"{p.name}: holds cache {meta.get('name')!r}, expected "
                               f"{info.name!r}")
        held = "all" if "cache_id" not in meta else meta["cache_id"]
        if (held == "all") != (slot is None):
            raise CacheOpError(f"{p.name}: holds {'every slot' if held == 'all' else 'slot '}"
                               f"{'' if held == 'all' else held}; this load takes "
                               f"{'every slot' if slot is None else 'one slot'} (dump and "
                               f"load with the same cache_id argument)")
        bufs.append(payload)
    model.load_cache_memory(check_bufs(bufs, infos, slot), slot)


__all__ = ["dump_to", "load_from"]
