"""The host link.

``pcie``: two independent directions (h2d: the device reads host memory, data returns in
read completions; d2h: the device writes host memory with posted writes), each a SimPy
resource at its effective bandwidth (``PcieConfig``: generation, lanes, 128b/130b, TLP
overheads, DLLPs). A transfer pays ``latency`` once and then moves ``chunk_bytes`` chunks;
transfers in the same direction share the link chunk by chunk.

``shared_dram`` (a host CPU on the same SoC): a transfer is a memcpy by the host CPU,
limited by ``host_copy_bytes_per_s`` and by the DRAM channels it reads and writes (both
buffers live in the same DRAM), so it contends with the NPU's own DRAM traffic.

Chunk durations telescope (chunk k ends at ``ceil(cum_bytes_k / bw)`` after the first
chunk starts, when uncontended), so a lone transfer takes exactly
``latency + ceil(bytes / bw)``. The rules: :func:`link_chunk` (a chunk's bytes, start and
duration) and :func:`link_chunk_done` (a shared-DRAM chunk holds its direction until its
DRAM traffic is done too).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import simpy

from sim.device.components.dram import Dram
from sim.device.components.rules import rule, transfer_ps
from sim.device.hw import HostLinkConfig
from sim.units import ns_to_ps
from traces.recorder import Recorder

LinkDirection = Literal["h2d", "d2h"]
#: The directions by number, as the rules and the array loop take them.
DIRECTIONS: tuple[LinkDirection, ...] = ("h2d", "d2h")
H2D, D2H = 0, 1
#: The link kinds by number.
KINDS = ("pcie", "shared_dram")
PCIE, SHARED_DRAM = 0, 1


@rule
def link_chunk(free: np.ndarray, d: int, now: int, off: int, nbytes: int, chunk: int,
               bytes_per_s: float, done_ps: int) -> tuple:
    """The chunk at ``off`` of a transfer of ``nbytes`` in direction ``d`` (``free``: when
    each direction falls free, ps; ``done_ps``: the time of the transfer's bytes before
    it): ``(its bytes, start, duration, the time of the bytes up to its end)``. Durations
    telescope: the bytes up to a chunk's end take ``ceil(bytes / bw)``. First come, first
    served per direction: the direction is booked from the chunk's start."""
    n = min(chunk, nbytes - off)
    end_ps = transfer_ps(off + n, bytes_per_s)
    dur = end_ps - done_ps
    start = max(now, free[d])
    free[d] = start + dur
    return n, start, dur, end_ps


@rule
def link_chunk_done(free: np.ndarray, d: int, now: int) -> None:
    """A shared-DRAM chunk ends at ``now``, when its DRAM reads and writes are done too:
    the direction is busy until then."""
    if now > free[d]:
        free[d] = now


class HostLink:
    def __init__(
        self, env: simpy.Environment, cfg: HostLinkConfig, dram: Dram, recorder: Recorder
    ):
        self.env = env
        self.cfg = cfg
        self.dram = dram
        self.recorder = recorder
        self.kind = KINDS.index(cfg.kind)
        self.block = "pcie" if cfg.kind == "pcie" else "hostlink"
        self.free_ps = np.zeros(2, np.int64)  # when each direction falls free (H2D, D2H)
        #: effective bandwidth of each direction (H2D, D2H), bytes/s
        self.bytes_per_s = np.array([cfg.h2d_effective_bytes_per_s,
                                     cfg.d2h_effective_bytes_per_s], np.float64)
        self.latency_ps = ns_to_ps(cfg.latency_ns)
        self.chunk_bytes = cfg.chunk_bytes

    def time_ps(self, direction: LinkDirection, nbytes: int) -> int:
        """Uncontended time of one transfer (the formula the simulation must match)."""
        bw = float(self.bytes_per_s[DIRECTIONS.index(direction)])
        return self.latency_ps + transfer_ps(nbytes, bw)

    def transfer(self, direction: LinkDirection | int, dram_addr: int, nbytes: int):
        """Process generator: move ``nbytes`` between host memory and DRAM at ``dram_addr``."""
        env = self.env
        d = direction if isinstance(direction, int) else DIRECTIONS.index(direction)
        lane = DIRECTIONS[d]
        if self.latency_ps:
            yield env.timeout(self.latency_ps)
        bw = float(self.bytes_per_s[d])
        done_ps = off = 0
        while off < nbytes:
            n, start, dur, done_ps = link_chunk(self.free_ps, d, env.now, off, nbytes,
                                                self.chunk_bytes, bw, done_ps)
            if start > env.now:
                yield env.timeout(start - env.now)
            if self.kind == PCIE:
                yield env.timeout(dur)
            else:
                # host memcpy: CPU time, and DRAM reads + writes on the shared channels
                yield env.all_of(
                    [
                        env.timeout(dur),
                        env.process(self.dram.access(dram_addr + off, n, write=False)),
                        env.process(self.dram.access(dram_addr + off, n, write=True)),
                    ]
                )
                link_chunk_done(self.free_ps, d, env.now)
            self.recorder.moved(self.block, lane, start, env.now, n)
            self.recorder.span(
                self.block, lane, "chunk", start, env.now, detail="tiles",
                args={"bytes": n},
            )
            off += self.chunk_bytes
