"""Device DRAM: ``channels`` independent channels, addresses interleaved across them.

A transfer of ``n`` bytes at ``addr`` costs the access latency once (controller and
interconnect; not holding any channel: requests are pipelined), then occupies each channel
it touches. Each channel serves its requests one at a time in arrival order (first come,
first served): that is where concurrent transfers contend. Two timing models
(``dram.model``), both in :meth:`Dram.chunk_plan`, the one place a chunk is timed:

- ``"efficiency"``: a channel is kept as the time it next falls free; the bytes on it take
  ``ceil(bytes / (bus width x data rate x efficiency))``.
- ``"protocol"``: the LPDDR4X protocol model (:func:`sim.device.dram.timing.chunk_channels_ck`,
  Numba over plain arrays) keeps per channel the open row and timers of every bank, the
  data bus, the direction of the last column command and the refresh phase: a chunk's
  time comes from row hits and misses, tRCD/tRP/tRAS/tRRD/tFAW, read/write turnaround and
  all-bank refresh, cycle by cycle of the channel clock but one call per chunk.

Both give the same schedule under either event kernel: the state changes only when a
chunk is planned, in event order.
"""

from __future__ import annotations

import math

from sim.device.dram.timing import ChannelState, chunk_channels_ck, timing_from_config
from sim.device.engine.kernel import AnyEnvironment
from sim.device.hw import DramConfig
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


def efficiency_split(addr: int, nbytes: int, granule: int, channels: int,
                     channel_bytes_per_s: float) -> tuple[tuple[int, int, int], ...]:
    """The efficiency model's plan of a chunk: ``(channel, bytes, busy ps)`` for each channel
    it touches, in channel order, the bytes taking ``ceil(bytes / channel_bytes_per_s)``.
    ``Dram`` and the array loop's plans (``sim/device/engine/array.py``) both use it."""
    split = bytes_per_channel(addr, nbytes, granule, channels)
    return tuple((c, b, transfer_ps(b, channel_bytes_per_s)) for c, b in enumerate(split) if b)


#: One channel's share of a planned chunk: (channel, bytes, start ps, end ps).
ChannelSpan = tuple[int, int, int, int]


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
        self.protocol = cfg.model == "protocol"
        if self.protocol:
            self.timing = timing_from_config(cfg)
            self.state = ChannelState.fresh(self.timing)
            self._params = self.timing.vector

    def _efficiency_split(self, addr: int, nbytes: int) -> tuple[tuple[int, int, int], ...]:
        """``(channel, bytes, busy ps)`` per channel touched; memoized on ``addr`` modulo
        the interleave stripe and ``nbytes``."""
        key = (addr % self._stripe, nbytes)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= 1 << 16:
                self._plans.clear()
            plan = self._plans[key] = efficiency_split(
                addr, nbytes, self.cfg.interleave_bytes, self.cfg.channels,
                self.channel_bytes_per_s)
        return plan

    def chunk_plan(self, addr: int, nbytes: int, write: bool, now_ps: int) -> list[ChannelSpan]:
        """Schedule a chunk of ``nbytes`` at ``addr`` that reaches the channels at
        ``now_ps``: ``(channel, bytes, start ps, end ps)`` for each channel it touches, in
        channel order. Commits the channels' state (their next free time, and in the
        protocol model the banks, bus direction and refresh phase)."""
        free = self.free_ps
        out = []
        if not self.protocol:
            for c, b, dur in self._efficiency_split(addr, nbytes):
                start = free[c]
                if start < now_ps:
                    start = now_ps
                stop = start + dur
                free[c] = stop
                out.append((c, b, start, stop))
            return out
        st = self.state
        tck = self.timing.tck_ps
        # a time under 1 ps past a cycle edge counts as that edge (ps are rounded up)
        t0 = math.ceil((now_ps - 1) / tck)
        chunk_channels_ck(self._params, st.open_row, st.act_ok, st.pre_ok, st.cas_ok, st.faw,
                          st.scalars, st.next_ref, addr, nbytes, write, t0, st.per_channel)
        for c, (b, first, last) in enumerate(st.per_channel.tolist()):
            if b:
                start = max(now_ps, math.ceil(first * tck - 1e-6))
                stop = max(start, math.ceil(last * tck - 1e-6))
                if stop > free[c]:
                    free[c] = stop
                out.append((c, b, start, stop))
        return out

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
        for c, b, start, stop in self.chunk_plan(addr, nbytes, write, now):
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
