"""Device DRAM: ``channels`` independent channels, addresses interleaved across them.

A transfer of ``n`` bytes at ``addr`` costs the access latency once (not holding any
channel: requests are pipelined), then holds each channel it touches for the bytes that
fall on it at the channel's effective bandwidth. Each channel serves its requests one at
a time in arrival order (first come, first served): that is where concurrent transfers
contend. A channel is kept as the time it next falls free, which gives the same schedule
as a SimPy ``Resource`` of capacity 1 with one event per transfer instead of one process
per channel burst.

Effective channel bandwidth = bus width x data rate x efficiency (``DramConfig``).
"""

from __future__ import annotations

from sim.hw import DramConfig
from sim.units import ns_to_ps, transfer_ps
from traces.recorder import Recorder

from .kernel import AnyEnvironment


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
    def __init__(self, env: AnyEnvironment, cfg: DramConfig, recorder: Recorder):
        self.env = env
        self.cfg = cfg
        self.recorder = recorder
        self.free_ps = [0] * cfg.channels  # when each channel falls free
        self.channel_bytes_per_s = cfg.channel_effective_bytes_per_s
        self.latency_ps = ns_to_ps(cfg.access_latency_ns)
        self.bytes_read = 0
        self.bytes_written = 0
        self._stripe = cfg.interleave_bytes * cfg.channels
        self._plans: dict[tuple[int, int], tuple[tuple[int, int, int], ...]] = {}

    def chunk_plan(self, addr: int, nbytes: int) -> tuple[tuple[int, int, int], ...]:
        """``(channel, bytes, busy ps)`` for each channel a transfer of ``nbytes`` at
        ``addr`` touches, in channel order: the one place a DRAM transfer's time per
        channel is computed. Memoized: it depends only on ``addr`` modulo the interleave
        stripe and on ``nbytes``."""
        key = (addr % self._stripe, nbytes)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= 1 << 16:
                self._plans.clear()
            bw = self.channel_bytes_per_s
            split = bytes_per_channel(addr, nbytes, self.cfg.interleave_bytes,
                                      self.cfg.channels)
            plan = self._plans[key] = tuple(
                (c, b, transfer_ps(b, bw)) for c, b in enumerate(split) if b
            )
        return plan

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
        now = env.now
        end = now
        rec = self.recorder
        moved = rec.wants("ops")
        spans = rec.wants("tiles")
        free = self.free_ps
        for c, b, dur in self.chunk_plan(addr, nbytes):
            start = free[c]
            if start < now:
                start = now
            stop = start + dur
            free[c] = stop
            if stop > end:
                end = stop
            if moved:
                lane = f"ch{c}"
                rec.moved("dram", lane, start, stop, b)
                if spans:
                    rec.span("dram", lane, "write" if write else "read", start, stop,
                             detail="tiles", args={"bytes": b})
        if end > now:
            yield env.timeout(end - now)
