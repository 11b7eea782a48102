"""DMA engines: DRAM->SRAM (load), SRAM->DRAM (store) and DRAM->DRAM (copy); ``read`` and
``write`` only touch DRAM (the attention unit's and the KV packer's own streams, whose
other end is inside the unit).

A transfer pays ``setup_latency`` once (:func:`setup_ps`), then is split into
``chunk_bytes`` chunks (:func:`chunk_bytes_at`); up to ``max_outstanding_chunks`` are in
flight at once (the engine's request queue), each one moving its bytes through the DRAM
channels it touches and, for loads and stores, through an SRAM port at the same time
(:func:`uses_port`, :func:`chunk_access`). A copy chunk reads then writes DRAM.
"""

from __future__ import annotations

from typing import Literal

import simpy

from sim.device.components.dram import Dram
from sim.device.components.rules import rule
from sim.device.components.sram import Sram
from sim.device.hw import DmaConfig
from sim.units import ns_to_ps
from traces.recorder import Recorder

Direction = Literal["load", "store", "copy", "read", "write"]
#: The directions by number, as the rules and the array loop take them.
DIRECTIONS: tuple[Direction, ...] = ("load", "store", "copy", "read", "write")
LOAD, STORE, COPY, READ, WRITE = range(5)


def setup_ps(cfg: DmaConfig) -> int:
    """What a transfer pays once before its first chunk (descriptor fetch), ps."""
    return ns_to_ps(cfg.setup_latency_ns)


@rule
def one_chunk(total: int, chunk: int) -> bool:
    """Whether a transfer of ``total`` bytes is one chunk (run in the transfer's own
    process, as the only request of its slot)."""
    return total <= chunk


@rule
def chunk_bytes_at(off: int, total: int, chunk: int) -> int:
    """The bytes of the chunk at offset ``off`` of a transfer of ``total`` bytes."""
    return min(chunk, total - off)


@rule
def uses_port(direction: int) -> bool:
    """Whether a chunk moves through an SRAM port (loads and stores: the port is booked
    as the chunk starts, and the chunk ends no earlier than the port is done)."""
    return direction == LOAD or direction == STORE


@rule
def chunk_access(direction: int, k: int, src: int, dst: int) -> tuple:
    """The ``k``-th DRAM access of a chunk, in order: ``(DRAM address, write)``, or
    ``(-1, 0)`` past its last. A copy reads its source, then writes its destination;
    a load and a read read the source, a store and a write write the destination."""
    if k == 0:
        if direction == STORE or direction == WRITE:
            return dst, 1
        return src, 0
    if k == 1 and direction == COPY:
        return dst, 1
    return -1, 0


class DmaEngine:
    def __init__(
        self,
        env: simpy.Environment,
        block: str,
        lane: str,
        cfg: DmaConfig,
        dram: Dram,
        sram: Sram | None,
        recorder: Recorder,
    ):
        self.env = env
        self.block = block
        self.lane = lane
        self.cfg = cfg
        self.dram = dram
        self.sram = sram
        self.recorder = recorder
        self.slots = simpy.Resource(env, capacity=cfg.max_outstanding_chunks)
        self.setup_ps = setup_ps(cfg)
        self.chunk_bytes = cfg.chunk_bytes
        self.outstanding = cfg.max_outstanding_chunks

    def transfer(
        self,
        direction: Direction | int,
        src: int,
        dst: int,
        nbytes: int,
        *,
        rows: int = 1,
        src_stride: int = 0,
        dst_stride: int = 0,
    ):
        """Process generator moving ``rows`` blocks of ``nbytes`` from ``src`` to ``dst``
        (addresses in the spaces implied by ``direction``; a stride of 0 means packed).

        A strided (2-D) transfer is timed as one stream of ``rows * nbytes`` bytes from
        ``src``: the engine walks its descriptor without per-row set-up, and the rows spread
        over the DRAM channels like a packed stream of the same size (an approximation:
        rows shorter than the interleave granule load channels less evenly)."""
        env = self.env
        d = direction if isinstance(direction, int) else DIRECTIONS.index(direction)
        if self.setup_ps:
            yield env.timeout(self.setup_ps)
        chunk = self.chunk_bytes
        total = nbytes * rows
        if one_chunk(total, chunk):
            # one chunk: run it in this process (same schedule, no extra process)
            req = self.slots.request()
            yield req
            yield from self._chunk(req, d, src, dst, total)
            return
        pending = []
        off = 0
        while off < total:
            n = chunk_bytes_at(off, total, chunk)
            req = self.slots.request()
            yield req
            pending.append(env.process(self._chunk(req, d, src + off, dst + off, n)))
            off += chunk
        yield env.all_of(pending)

    def _chunk(self, req, d: int, src: int, dst: int, nbytes: int):
        env = self.env
        start = env.now
        try:
            port_done = self.sram.reserve_port(nbytes) if uses_port(d) else 0
            k = 0
            while True:
                addr, write = chunk_access(d, k, src, dst)
                if addr < 0:
                    break
                yield from self.dram.access(addr, nbytes, write=bool(write))
                k += 1
            if port_done > env.now:
                yield env.timeout(port_done - env.now)
        finally:
            self.slots.release(req)
        self.recorder.span(
            self.block, self.lane, f"{DIRECTIONS[d]} chunk", start, env.now,
            detail="tiles", args={"bytes": nbytes},
        )
