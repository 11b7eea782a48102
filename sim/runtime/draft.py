"""A draft program beside a launched model, sharing its weights and KV caches in DRAM
(kvsim's own: the vendor runtime runs one model per launch).

Self-speculative decoding drafts with the model itself, some layers skipped
(:mod:`models.skip`): a compiled model of its own (its own program, its own integer
parameters, calibrated for the layers it runs), whose weight codes are the model's. So the
card needs no second copy of them: :func:`launch_draft` maps each region of the draft's
memory map either onto a region of the launched model (``share(name)`` names it: weight
codes, KV caches, activation and host-I/O buffers) or onto a new region of its own
(``draft.<name>``, past the model's regions: the draft's integer parameters), loads only
its own regions over the host link, and checks, in functional mode, that every shared
weight region already holds exactly the bytes the draft would have loaded into it.

A draft call (:meth:`DraftModel.infer`) costs what an ``infer`` costs: the runtime
overhead, the embeddings over the host link, the draft's program, the last token's logits
back. It writes the K/V of the layers it runs at the positions it is given, in the shared
caches: a verification call that follows at the same positions overwrites them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from isa.instructions import HostWrite, MemoryLayout, Program, Region, Space
from models.compiler import CompiledModel
from models.compiler.memmap import REGION_ALIGN, MemoryMap, align
from sim.runtime.deviceops import HOST_IN, HOST_OUT_ALIGN
from sim.runtime.errors import RuntimeApiError
from traces.speculation_results import SelfDraftDram

if TYPE_CHECKING:
    from sim.runtime.model import Model

#: Prefix of the draft's own regions in the device's memory layout.
OWN_PREFIX = "draft."


@dataclass(frozen=True)
class DraftMap:
    """Where the draft's regions are: ``shared`` draft region -> the model's region it
    uses; ``own`` the draft's own regions as placed in the device layout."""

    shared: dict[str, str]
    own: tuple[Region, ...]
    shared_weight_bytes: int  # the model's weight regions the draft reads (not copied)
    model_bytes: int  # the launched model's memory map
    model_weight_bytes: int

    @property
    def own_bytes(self) -> int:
        return sum(r.size for r in self.own)

    def as_metrics(self) -> SelfDraftDram:
        """What the DRAM map says about the draft (bytes)."""
        return SelfDraftDram(
            model_bytes=self.model_bytes, model_weight_bytes=self.model_weight_bytes,
            draft_shared_weight_bytes=self.shared_weight_bytes, draft_own_bytes=self.own_bytes,
            draft_own_regions=len(self.own), draft_shared_regions=len(self.shared),
            draft_copied_weight_bytes=sum(r.size for r in self.own
                                          if r.name.startswith(OWN_PREFIX + "w.")),
            total_bytes=self.model_bytes + self.own_bytes)


class DraftModel:
    """A draft program launched beside a model (:func:`launch_draft`)."""

    def __init__(self, model: Model, compiled: CompiledModel, dmap: DraftMap):
        self.model = model
        self.compiled = compiled
        self.map = dmap

    def infer(self, x: np.ndarray, cache_size: int) -> np.ndarray | None:
        """Run input embeddings ``x`` ``(tokens, hidden)`` at cache positions ``cache_size
        ..``: the last token's float32 logits ``(vocab,)`` (None in timing-only mode)."""
        acc, cm = _launched(self.model, "draft infer"), self.compiled
        x = np.asarray(x, np.float32)
        if x.ndim != 2 or x.shape[1] != cm.model.hidden_size:
            raise RuntimeApiError(f"draft infer: inputs must have shape (tokens, "
                                  f"{cm.model.hidden_size}), got {x.shape}")
        seq = x.shape[0]
        if not 1 <= seq <= cm.max_seq or not 0 <= cache_size <= cm.cap - seq:
            raise RuntimeApiError(f"draft infer: {seq} tokens at cache_size {cache_size} do "
                                  f"not fit calls of 1..{cm.max_seq} tokens and a cache of "
                                  f"{cm.cap}")
        dev = acc.device
        host_out = -(-4 * seq * cm.model.hidden_size // HOST_OUT_ALIGN + 1) * HOST_OUT_ALIGN
        if acc.functional:
            dev.host_write(HOST_IN, np.ascontiguousarray(x).view(np.uint8))
        prog = cm.program(tokens=seq, cache_size=cache_size, host_in=HOST_IN,
                          host_out=host_out)
        start, before = acc.begin()
        acc.host_work(acc.hw.host.call_overhead_ns, "draft")
        acc.run(prog, "draft", shape=(seq, "draft"))
        acc.end("draft", start, before)
        if not acc.functional:
            return None
        vocab = cm.model.vocab_size
        acc_i32 = dev.host_read(host_out, 4 * vocab).view(np.int32)
        return (acc_i32 * cm.numerics.head_row_scale).astype(np.float32)


def _launched(model: Model, where: str):
    """The accelerator ``model`` runs on, or a :class:`RuntimeApiError`."""
    if model.acc is None:
        raise RuntimeApiError(f"{where}: the model is not launched (or was disposed)")
    return model.acc


def launch_draft(model: Model, draft: CompiledModel,
                 share: Callable[[str], str | None]) -> DraftModel:
    """Launch ``draft`` beside the launched ``model`` (see the module docstring).
    ``share(name)``: the model's region that the draft's region ``name`` uses, or None
    for a region of the draft's own. Refused before anything changes if the draft does
    not match the model (hardware, core mode, cache) or a shared region is too small."""
    acc, cm = _launched(model, "launch_draft"), model.compiled
    for what, a, b in (("core mode", draft.core_mode, cm.core_mode),
                       ("cache length", draft.cap, cm.cap), ("cache slots", draft.slots, cm.slots),
                       ("hardware", draft.hw.name, cm.hw.name),
                       ("KV format", draft.kv, cm.kv),
                       ("functional mode", draft.numerics.functional, acc.functional)):
        if a != b:
            raise RuntimeApiError(f"launch_draft: the draft's {what} ({a!r}) differs from the "
                                  f"launched model's ({b!r})")
    layout = acc.device.layout
    placed = {r.name: r for r in layout.regions if r.space == Space.DRAM}
    top = align(max((r.end for r in placed.values()), default=0), REGION_ALIGN)
    mapped: list[Region] = []
    shared: dict[str, str] = {}
    own: list[Region] = []
    for r in draft.mm.regions:
        target = share(r.name)
        if target is not None:
            if target not in placed:
                raise RuntimeApiError(f"launch_draft: region {r.name!r} shares {target!r}, "
                                      f"which the launched model does not have")
            t = placed[target]
            if r.size > t.size:
                raise RuntimeApiError(f"launch_draft: region {r.name!r} ({r.size} bytes) does "
                                      f"not fit the model's {target!r} ({t.size} bytes)")
            mapped.append(Region(r.name, Space.DRAM, t.base, r.size, t.kind))
            shared[r.name] = target
        else:
            base = align(top, REGION_ALIGN)
            own.append(Region(OWN_PREFIX + r.name, Space.DRAM, base, r.size, r.kind))
            mapped.append(Region(r.name, Space.DRAM, base, r.size, r.kind))
            top = base + r.size
    new_layout = MemoryLayout(dram_bytes=layout.dram_bytes, sram_bytes=layout.sram_bytes,
                              host_bytes=layout.host_bytes, num_cores=layout.num_cores,
                              regions=(*layout.regions, *own))
    if top > acc.hw.dram.capacity_bytes:
        raise RuntimeApiError(f"launch_draft: the draft's own regions end at {top} bytes; "
                              f"{acc.hw.name} has {acc.hw.dram.capacity_bytes}")
    mm = MemoryMap.from_json([{"name": r.name, "base": r.base, "size": r.size,
                               "kind": r.kind} for r in mapped])
    placed_draft = replace(draft, mm=mm, programs={})
    weights = {placed[t].name for t in shared.values() if placed[t].kind == "weights"}
    dmap = DraftMap(shared=shared, own=tuple(own),
                    shared_weight_bytes=sum(placed[n].size for n in weights),
                    model_bytes=align(max((r.end for r in placed.values()), default=0),
                                      REGION_ALIGN),
                    model_weight_bytes=sum(r.size for r in placed.values()
                                           if r.kind == "weights"))
    _load_own(model, draft, placed_draft, own, new_layout)
    return DraftModel(model, placed_draft, dmap)


def _load_own(model: Model, draft: CompiledModel, placed: CompiledModel,
              own: list[Region], layout: MemoryLayout) -> None:
    """The launch call of the draft: its own regions over the host link. Functional: the
    bytes of its weight image that fall in its own regions; every other entry must equal
    what the model's shared region already holds (checked before the layout changes)."""
    acc = model.acc
    dev = acc.device
    own_names = {r.name[len(OWN_PREFIX):] for r in own}
    writes: list[HostWrite] = []
    staged: list[tuple[int, np.ndarray]] = []
    if acc.functional:
        by_base = sorted(draft.mm.regions, key=lambda r: r.base)
        bases = [r.base for r in by_base]
        off = 0
        for addr, data in draft.weight_image():
            i = int(np.searchsorted(bases, addr, side="right")) - 1
            r = by_base[i]
            dst = placed.mm[r.name].base + (addr - r.base)
            if r.name in own_names:
                staged.append((off, data))
                writes.append(HostWrite(src=HOST_IN + off, dst=dst, nbytes=data.size))
                off += data.size
            elif not np.array_equal(dev.mem.dram.read(dst, data.size), data):
                raise RuntimeApiError(f"launch_draft: the draft's {r.name!r} differs from the "
                                      f"model's bytes at {dst:#x}: they cannot be shared")
    else:
        writes = [HostWrite(src=HOST_IN, dst=placed.mm[r.name[len(OWN_PREFIX):]].base,
                            nbytes=r.size) for r in own if r.kind == "weights"]
    dev.set_layout(layout)
    for off, data in staged:
        dev.host_write(HOST_IN + off, data)
    start, before = acc.begin()
    acc.host_work(acc.hw.host.call_overhead_ns, "launch_draft")
    if writes:
        acc.run(Program(tuple(writes), name="load draft parameters"), "launch_draft")
    acc.end("launch_draft", start, before)
    if staged:
        dev.host_discard(HOST_IN, sum(d.size for _, d in staged))


__all__ = ["OWN_PREFIX", "DraftMap", "DraftModel", "launch_draft"]
