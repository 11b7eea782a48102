"""DMA engines: DRAM->SRAM (load), SRAM->DRAM (store) and DRAM->DRAM (copy).

A transfer pays ``setup_latency`` once, then is split into ``chunk_bytes`` chunks; up to
``max_outstanding_chunks`` are in flight at once (the engine's request queue), each one
moving its bytes through the DRAM channels it touches and, for loads and stores, through
an SRAM port at the same time. A copy chunk reads then writes DRAM.
"""

from __future__ import annotations

from typing import Literal

import simpy

from sim.hw import DmaConfig
from sim.units import ns_to_ps
from traces.recorder import Recorder

from .dram import Dram
from .sram import Sram

Direction = Literal["load", "store", "copy"]


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
        Packed blocks are one stream; strided blocks are split into chunks per block."""
        env = self.env
        if self.setup_ps:
            yield env.timeout(self.setup_ps)
        chunk = self.cfg.chunk_bytes
        s_step = src_stride or nbytes
        d_step = dst_stride or nbytes
        if s_step == nbytes and d_step == nbytes:
            nbytes, rows = nbytes * rows, 1
        pending = []
        for r in range(rows):
            s0, d0 = src + r * s_step, dst + r * d_step
            for off in range(0, nbytes, chunk):
                n = min(chunk, nbytes - off)
                req = self.slots.request()
                yield req
                pending.append(env.process(self._chunk(req, direction, s0 + off, d0 + off, n)))
        if pending:
            yield env.all_of(pending)

    def _chunk(self, req, direction: Direction, src: int, dst: int, nbytes: int):
        env = self.env
        start = env.now
        try:
            if direction == "copy":
                yield from self.dram.access(src, nbytes, write=False)
                yield from self.dram.access(dst, nbytes, write=True)
            else:
                dram_addr = src if direction == "load" else dst
                yield env.all_of(
                    [
                        env.process(
                            self.dram.access(dram_addr, nbytes, write=direction == "store")
                        ),
                        env.process(self.sram.port_access(nbytes)),
                    ]
                )
        finally:
            self.slots.release(req)
        self.recorder.span(
            self.block, self.lane, f"{direction} chunk", start, env.now,
            detail="tiles", args={"bytes": nbytes},
        )
