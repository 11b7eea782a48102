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
``latency + ceil(bytes / bw)``.
"""

from __future__ import annotations

from typing import Literal

from sim.device.components.dram import Dram
from sim.device.engine.kernel import AnyEnvironment
from sim.device.hw import HostLinkConfig
from sim.units import ns_to_ps, transfer_ps
from traces.recorder import Recorder

LinkDirection = Literal["h2d", "d2h"]


class HostLink:
    def __init__(
        self, env: AnyEnvironment, cfg: HostLinkConfig, dram: Dram, recorder: Recorder
    ):
        self.env = env
        self.cfg = cfg
        self.dram = dram
        self.recorder = recorder
        self.block = "pcie" if cfg.kind == "pcie" else "hostlink"
        self.free_ps = {"h2d": 0, "d2h": 0}  # when each direction falls free
        self.bytes_per_s = {
            "h2d": cfg.h2d_effective_bytes_per_s,
            "d2h": cfg.d2h_effective_bytes_per_s,
        }
        self.latency_ps = ns_to_ps(cfg.latency_ns)

    def time_ps(self, direction: LinkDirection, nbytes: int) -> int:
        """Uncontended time of one transfer (the formula the simulation must match)."""
        return self.latency_ps + transfer_ps(nbytes, self.bytes_per_s[direction])

    def transfer(self, direction: LinkDirection, dram_addr: int, nbytes: int):
        """Process generator: move ``nbytes`` between host memory and DRAM at ``dram_addr``."""
        env = self.env
        if self.latency_ps:
            yield env.timeout(self.latency_ps)
        bw = self.bytes_per_s[direction]
        chunk = self.cfg.chunk_bytes
        done_ps = 0
        for off in range(0, nbytes, chunk):
            n = min(chunk, nbytes - off)
            end_ps = transfer_ps(off + n, bw)
            dur = end_ps - done_ps
            done_ps = end_ps
            # first come, first served per direction
            start = max(env.now, self.free_ps[direction])
            self.free_ps[direction] = start + dur
            if start > env.now:
                yield env.timeout(start - env.now)
            if self.cfg.kind == "pcie":
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
                self.free_ps[direction] = max(self.free_ps[direction], env.now)
            self.recorder.moved(self.block, direction, start, env.now, n)
            self.recorder.span(
                self.block, direction, "chunk", start, env.now, detail="tiles",
                args={"bytes": n},
            )
