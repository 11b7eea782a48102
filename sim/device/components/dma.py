"""DMA engines: DRAM->SRAM (load), SRAM->DRAM (store) and DRAM->DRAM (copy); ``read`` and
``write`` only touch DRAM (the attention unit's and the KV packer's own streams, whose
other end is inside the unit).

A transfer pays ``setup_latency`` once, then is split into ``chunk_bytes`` chunks; up to
``max_outstanding_chunks`` are in flight at once (the engine's request queue), each one
moving its bytes through the DRAM channels it touches and, for loads and stores, through
an SRAM port at the same time. A copy chunk reads then writes DRAM.
"""

from __future__ import annotations

from typing import Literal

from sim.device.components.dram import Dram
from sim.device.components.sram import Sram
from sim.device.engine.kernel import AnyEnvironment, resource_for
from sim.device.hw import DmaConfig
from sim.units import ns_to_ps
from traces.recorder import Recorder

Direction = Literal["load", "store", "copy", "read", "write"]


class DmaEngine:
    def __init__(
        self,
        env: AnyEnvironment,
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
        self.slots = resource_for(env, cfg.max_outstanding_chunks)
        self.setup_ps = ns_to_ps(cfg.setup_latency_ns)

    def transfer(
        self,
        direction: Direction,
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
        if self.setup_ps:
            yield env.timeout(self.setup_ps)
        chunk = self.cfg.chunk_bytes
        total = nbytes * rows
        if total <= chunk:
            # one chunk: run it in this process (same schedule, no extra process)
            req = self.slots.request()
            yield req
            yield from self._chunk(req, direction, src, dst, total)
            return
        pending = []
        for off in range(0, total, chunk):
            n = min(chunk, total - off)
            req = self.slots.request()
            yield req
            pending.append(env.process(self._chunk(req, direction, src + off, dst + off, n)))
        if pending:
            yield env.all_of(pending)

    def _chunk(self, req, direction: Direction, src: int, dst: int, nbytes: int):
        env = self.env
        start = env.now
        try:
            if direction == "copy":
                yield from self.dram.access(src, nbytes, write=False)
                yield from self.dram.access(dst, nbytes, write=True)
            elif direction == "read":
                yield from self.dram.access(src, nbytes, write=False)
            elif direction == "write":
                yield from self.dram.access(dst, nbytes, write=True)
            else:
                dram_addr = src if direction == "load" else dst
                port_done = self.sram.reserve_port(nbytes)
                yield from self.dram.access(dram_addr, nbytes, write=direction == "store")
                if port_done > env.now:
                    yield env.timeout(port_done - env.now)
        finally:
            self.slots.release(req)
        self.recorder.span(
            self.block, self.lane, f"{direction} chunk", start, env.now,
            detail="tiles", args={"bytes": nbytes},
        )
