"""The device side of the runtime calls: the programs a call runs on the simulated card
and the bytes it moves. Arguments arrive checked (:mod:`.checks`); each function here
records one call on the accelerator and returns what the call returns."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from isa.instructions import HostRead, HostWrite, Nop, Program
from models.compiler import CompiledModel
from sim.runtime.cacheops import rearrange_program
from sim.runtime.checks import Request
from sim.runtime.errors import RuntimeApiError
from sim.runtime.rings import check_rearrange

if TYPE_CHECKING:
    from sim.device.hw import HardwareConfig
    from sim.runtime.accelerator import Accelerator
    from sim.runtime.model import Model

#: Host-memory layout the runtime uses for its staging buffers.
HOST_IN = 0
HOST_OUT_ALIGN = 1 << 20


def _host_out(model: Model, tokens: int) -> int:
    """Where a call's logits land in host memory: past its input, on a 1 MiB boundary."""
    h = model.compiled.model.hidden_size
    return -(-4 * tokens * h // HOST_OUT_ALIGN + 1) * HOST_OUT_ALIGN


def forward(model: Model, req: Request, *, all_logits: bool = False) -> np.ndarray | None:
    """One forward call: the runtime overhead, the embeddings over the host link, the
    forward program, the logits back. Returns the last token's float32 logits
    ``(vocab,)``, or with ``all_logits`` every token's ``(tokens, vocab)`` (the program
    runs the LM head over every token and the host reads them all back: ``model.wide``,
    the compiled model with the regions for it); None in timing-only mode."""
    acc = model.acc
    cm = model.wide if all_logits else model.compiled
    dev = acc.device
    seq = req.x.shape[0]
    host_out = _host_out(model, seq)
    if acc.functional:
        dev.host_write(HOST_IN, np.ascontiguousarray(req.x).view(np.uint8))
    prog = cm.program(tokens=seq, cache_size=req.cache_size, slot=req.cache_id,
                      host_in=HOST_IN, host_out=host_out, all_logits=all_logits,
                      shift=req.shift)
    start, before = acc.begin()
    acc.host_work(acc.hw.host.call_overhead_ns, "infer")
    acc.run(prog, "infer", shape=(seq, req.cache_id, *(("all",) if all_logits else ())))
    acc.end("infer", start, before)
    model.last_call = (seq, req.cache_size, req.cache_id)  # for infer_speedrun
    if not acc.functional:
        return None
    vocab = cm.model.vocab_size
    rows = seq if all_logits else 1
    acc_i32 = dev.host_read(host_out, 4 * rows * vocab).view(np.int32).reshape(rows, vocab)
    logits = (acc_i32 * cm.numerics.head_row_scale).astype(np.float32)
    return logits if all_logits else logits[0]


def batches(cm: CompiledModel) -> bool:
    """Whether a batch runs as one device program: a model of several cache slots that is
    neither MLA nor MoE (the batched MLA/MoE stages are timing-only)."""
    return cm.slots >= 2 and not cm.model.is_mla and not cm.model.is_moe


def step_compiled(cm: CompiledModel, dram_bytes: int, rows: int) -> CompiledModel | None:
    """The compiled model with the two regions a program with many logits rows needs (the
    gathered last hidden states and the logits of ``rows`` rows, after every other region:
    no other region moves), or None if they do not fit the card's DRAM."""
    from models.compiler.dram import batch_memory_map

    mm = batch_memory_map(lambda _: copy.deepcopy(cm.mm), max_tokens=cm.max_seq,
                          max_seqs=rows, hidden=cm.model.hidden_size,
                          vocab=cm.model.vocab_size,
                          residual_bytes=cm.numerics.residual_bytes)
    return dataclasses.replace(cm, mm=mm) if mm.total_bytes <= dram_bytes else None


def batch_compiled(cm: CompiledModel, dram_bytes: int) -> CompiledModel | None:
    """The compiled model a batched step runs on (:func:`step_compiled` with one logits row
    per cache slot), or None where batching runs request by request: a model for which
    :func:`batches` is false, or one whose extra regions do not fit the card's DRAM."""
    return step_compiled(cm, dram_bytes, cm.slots) if batches(cm) else None


def step_models(cm: CompiledModel, hw: HardwareConfig, *, all_logits: bool
                ) -> tuple[CompiledModel | None, CompiledModel | None]:
    """The compiled models a launch on ``hw`` adds: the one of all-position logits (with
    ``ModelConfig.all_logits``, else None) and the one batched steps run on (None: batches
    run request by request). A :class:`RuntimeApiError` if all-position logits do not fit
    the card's DRAM beside the model."""
    if not all_logits:
        return None, batch_compiled(cm, hw.dram.capacity_bytes)
    wide = step_compiled(cm, hw.dram.capacity_bytes, max(cm.slots, cm.max_seq))
    if wide is None:
        raise RuntimeApiError(f"ModelConfig.all_logits: the logits of {cm.max_seq} positions "
                              f"do not fit {hw.name}'s DRAM beside the model; compile with a "
                              f"smaller max_sequence_length")
    return wide, wide if batches(cm) else None


def load_weights(model: Model, acc: Accelerator) -> None:
    """The launch call: the device's memory layout (of the widest compiled model the launch
    placed), then every weight region over the host link (functional: one transfer of its
    bytes per region; timing-only: one program of all regions); the simulated clock
    advances by their time."""
    cm, hw = model.compiled, acc.hw
    acc.device.set_layout((model.wide or model.batched or cm).layout(
        host_bytes=hw.host.memory_bytes))
    start, before = acc.begin()
    acc.host_work(hw.host.call_overhead_ns, "launch")
    if acc.functional:
        # one program, as in timing-only mode (a program per region would pay the
        # program launch once per region): the image is staged in host memory, region
        # after region, and the staging pages are dropped once it has crossed the link
        writes, off = [], 0
        for addr, data in cm.weight_image():
            acc.device.host_write(HOST_IN + off, data)
            writes.append(HostWrite(src=HOST_IN + off, dst=addr, nbytes=data.size))
            off += data.size
        acc.run(Program(tuple(writes), name="load weights"), "launch")
        acc.device.host_discard(HOST_IN, off)
    else:
        regions = [r for r in cm.mm.regions if r.kind == "weights"]
        acc.run(Program(tuple(HostWrite(src=HOST_IN, dst=r.base, nbytes=r.size)
                              for r in regions), name="load weights"), "launch")
    acc.end("launch", start, before)


def forward_batch(model: Model, reqs: list[Request]) -> list[np.ndarray | None]:
    """A batch of requests as one device program (``models.compiler.driver.lower_step``): the
    runtime overhead once, every request's embeddings in one upload, the weights streamed
    once per token tile of the whole batch, every request's logits in one download."""
    from models.compiler.driver import StepSeq, lower_step
    from models.compiler.sram import SramOverflow

    acc, bcm = model.acc, model.batched
    dev = acc.device
    x = np.concatenate([r.x for r in reqs])
    tokens = x.shape[0]
    host_out = _host_out(model, tokens)
    if acc.functional:
        dev.host_write(HOST_IN, np.ascontiguousarray(x).view(np.uint8))
    seqs = [StepSeq(r.cache_id, r.x.shape[0], r.cache_size) for r in reqs]
    try:  # the decode pass's tile, if the step's head rows fit beside it (sized for one)
        prog = lower_step(bcm.lowering(bcm.tile_for(min(tokens, bcm.m_tile))), seqs,
                          host_in=HOST_IN, host_out=host_out)
    except SramOverflow:
        prog = lower_step(bcm.lowering(bcm.tile_bytes), seqs, host_in=HOST_IN,
                          host_out=host_out)
    start, before = acc.begin()
    acc.host_work(acc.hw.host.call_overhead_ns, "infer")
    acc.run(prog, "infer", shape=("batch", *((s.tokens, s.slot) for s in seqs)))
    acc.end("infer", start, before)
    model.last_call = (reqs[-1].x.shape[0], reqs[-1].cache_size, reqs[-1].cache_id)
    vocab = bcm.model.vocab_size
    if not acc.functional:
        return [None] * len(reqs)
    acc_i32 = dev.host_read(host_out, 4 * len(reqs) * vocab).view(np.int32)
    rows = (acc_i32.reshape(len(reqs), vocab) * bcm.numerics.head_row_scale)
    return list(rows.astype(np.float32))


def speedrun(model: Model, tokens: int, cache_size: int, cache_id: int) -> float:
    """The forward program of ``tokens`` tokens at ``cache_size`` with its host-link
    transfers replaced by no-ops (same flags, no time): NPU time without upload or
    download. The cache is left as it was (its bytes are restored after the run).
    Returns the simulated seconds."""
    acc, cm = model.acc, model.compiled
    prog = cm.program(tokens=tokens, cache_size=cache_size, slot=cache_id, host_in=HOST_IN,
                      host_out=_host_out(model, tokens))
    ins = tuple(Nop(on=type(i).engine_kind, core=i.core, wait=i.wait, signal=i.signal)
                if isinstance(i, HostWrite | HostRead) else i for i in prog.instructions)
    bare = Program(ins, formats=prog.formats, name=f"{prog.name} (speedrun)")
    saved = _cache_bytes(model) if acc.functional else None
    start, before = acc.begin()
    acc.run(bare, "infer_speedrun", shape=(tokens, cache_id))
    rec = acc.end("infer_speedrun", start, before)
    if saved is not None:
        for c, data in zip(cm.kv_caches(), saved, strict=True):
            acc.device.mem.dram.write(c.region.base, data)
    return rec.time_s


def _cache_bytes(model: Model) -> list[np.ndarray]:
    dram = model.acc.device.mem.dram
    return [dram.read(c.region.base, c.region.size).copy()
            for c in model.compiled.kv_caches()]


def cache_groups(model: Model) -> list[list[dict]]:
    """Per cache (get_cache_infos order): its regions, one per slot."""
    groups: dict[tuple[int, str], list[dict]] = {}
    for c in model.compiled.kv_caches():
        groups.setdefault((c.layer, c.component), []).append(c)
    return [sorted(v, key=lambda c: c.slot) for _, v in sorted(groups.items())]


def _regions(model: Model, slot: int | None,
             which: Sequence[int] | None = None) -> list[list[dict]]:
    """Per cache (of the caches at indexes ``which``; None: all), the regions a dump or
    load of ``slot`` (None: every slot) covers."""
    groups = cache_groups(model)
    return [[c for c in groups[i] if slot is None or c.slot == slot]
            for i in (range(len(groups)) if which is None else which)]


def dump(model: Model, slot: int | None, which: Sequence[int] | None = None,
         op: str = "dump_cache_memory") -> list[bytes]:
    """Every cache's bytes (of the caches at indexes ``which``; None: all) of ``slot``
    (None: all slots, concatenated) over the host link, device to host. In timing-only
    mode the bytes are zeros (the transfer is simulated)."""
    acc = model.acc
    dev = acc.device
    start, before = acc.begin()
    acc.host_work(acc.hw.host.call_overhead_ns, op)
    addr = HOST_IN
    reads, spans = [], []
    groups = _regions(model, slot, which)
    for group in groups:
        for c in group:
            r = c.region
            reads.append(HostRead(src=r.base, dst=addr, nbytes=r.size))
            spans.append((addr, r.size))
            addr += r.size
    acc.run(Program(tuple(reads), name="dump caches"), op)
    acc.end(op, start, before)
    out, i = [], 0
    for group in groups:
        parts = []
        for _ in group:
            a, n = spans[i]
            i += 1
            parts.append(dev.host_read(a, n).tobytes() if acc.functional else bytes(n))
        out.append(b"".join(parts))
    return out


def load(model: Model, data: list[bytes], slot: int | None,
         which: Sequence[int] | None = None, op: str = "load_cache_memory") -> None:
    """Write ``data`` (checked buffers, one per cache of ``which``; None: every cache) into
    the caches of ``slot`` (None: every slot) over the host link, host to device."""
    acc = model.acc
    dev = acc.device
    start, before = acc.begin()
    acc.host_work(acc.hw.host.call_overhead_ns, op)
    writes = []
    addr = HOST_IN
    for group, blob in zip(_regions(model, slot, which), data, strict=True):
        off = 0
        for c in group:
            r = c.region
            if acc.functional:
                dev.host_write(addr, np.frombuffer(blob, np.uint8, r.size, off))
            writes.append(HostWrite(src=addr, dst=r.base, nbytes=r.size))
            addr += r.size
            off += r.size
    acc.run(Program(tuple(writes), name="load caches"), op)
    acc.end(op, start, before)


def reset(model: Model, specs: Sequence | None = None, op: str = "reset_cache_memory") -> None:
    """Clear every cache (of ``specs``, :meth:`CompiledModel.kv_caches` entries; None:
    all). Cost: the runtime call; the driver clears the caches' length headers, which is
    not timed further."""
    acc = model.acc
    start, before = acc.begin()
    acc.host_work(acc.hw.host.call_overhead_ns, op)
    if acc.functional:
        for c in model.compiled.kv_caches() if specs is None else specs:
            r = c.region
            acc.device.mem.dram.write(r.base, np.zeros(r.size, np.uint8))
    acc.end(op, start, before)


def rearrange(model: Model, op: str, keep: list[int], dst: int, cache_id: int, *,
              cache_size: int) -> None:
    """Move the tokens at positions ``keep`` of slot ``cache_id`` (a cache of
    ``cache_size`` tokens) to ``dst..`` with an on-device program (KvRead / DRAM scratch /
    KvWrite): no host-link traffic. A sliding-window ring must hold every position from
    ``dst`` on and, afterwards, the next token's window (:func:`.rings.check_rearrange`):
    else refused before anything runs."""
    check_rearrange(model, dst=dst, new_size=dst + len(keep), cache_size=cache_size,
                    cache_id=cache_id, where=op)
    acc = model.acc
    start, before = acc.begin()
    acc.host_work(acc.hw.host.call_overhead_ns, op)
    prog = rearrange_program(model.compiled, slot=cache_id, keep=keep, dst=dst, name=op)
    if prog.instructions:
        acc.run(prog, op)
    acc.end(op, start, before)


__all__ = ["HOST_IN", "batch_compiled", "batches", "cache_groups", "dump", "forward",
           "forward_batch", "load", "rearrange", "reset", "speedrun", "step_compiled"]
