"""Device DRAM: ``channels`` independent channels, addresses interleaved across them.

A transfer of ``n`` bytes at ``addr`` costs the access latency once (not holding any
channel: requests are pipelined), then holds each channel it touches for the bytes that
fall on it at the channel's effective bandwidth. Channels are SimPy resources, so
concurrent transfers that touch the same channel queue in arrival order: that is where
contention happens.

Effective channel bandwidth = bus width x data rate x efficiency (``DramConfig``).
"""

from __future__ import annotations

import simpy

from sim.hw import DramConfig
from sim.units import ns_to_ps, transfer_ps
from traces.recorder import Recorder


def bytes_per_channel(addr: int, nbytes: int, granule: int, channels: int) -> list[int]:
    """How many bytes of ``[addr, addr+nbytes)`` fall on each channel when consecutive
    ``granule``-byte blocks go to consecutive channels."""
    out = [0] * channels
    if nbytes <= 0:
        return out
    end = addr + nbytes
    stripe = granule * channels
    # Whole stripes in the middle give every channel ``granule`` bytes each.
    first_stripe_end = min(end, (addr // stripe + 1) * stripe)
    last_stripe_start = max(first_stripe_end, (end // stripe) * stripe)
    full = (last_stripe_start - first_stripe_end) // stripe
    if full:
        for c in range(channels):
            out[c] += full * granule
    for lo, hi in ((addr, first_stripe_end), (last_stripe_start, end)):
        a = lo
        while a < hi:
            g_end = min(hi, (a // granule + 1) * granule)
            out[(a // granule) % channels] += g_end - a
            a = g_end
    return out


class Dram:
    def __init__(self, env: simpy.Environment, cfg: DramConfig, recorder: Recorder):
        self.env = env
        self.cfg = cfg
        self.recorder = recorder
        self.channels = [simpy.Resource(env, capacity=1) for _ in range(cfg.channels)]
        self.channel_bytes_per_s = cfg.channel_effective_bytes_per_s
        self.latency_ps = ns_to_ps(cfg.access_latency_ns)
        self.bytes_read = 0
        self.bytes_written = 0

    def access(self, addr: int, nbytes: int, *, write: bool):
        """Process generator: move ``nbytes`` at ``addr`` (use with ``yield from`` or
        ``env.process``). Completes when the last channel has finished."""
        env = self.env
        if write:
            self.bytes_written += nbytes
        else:
            self.bytes_read += nbytes
        if self.latency_ps:
            yield env.timeout(self.latency_ps)
        split = bytes_per_channel(addr, nbytes, self.cfg.interleave_bytes, self.cfg.channels)
        parts = [env.process(self._burst(c, b, write)) for c, b in enumerate(split) if b]
        if len(parts) == 1:
            yield parts[0]
        elif parts:
            yield env.all_of(parts)

    def _burst(self, channel: int, nbytes: int, write: bool):
        res = self.channels[channel]
        with res.request() as req:
            yield req
            start = self.env.now
            yield self.env.timeout(transfer_ps(nbytes, self.channel_bytes_per_s))
        lane = f"ch{channel}"
        self.recorder.moved("dram", lane, start, self.env.now, nbytes)
        self.recorder.span(
            "dram", lane, "write" if write else "read", start, self.env.now,
            detail="tiles", args={"bytes": nbytes},
        )
