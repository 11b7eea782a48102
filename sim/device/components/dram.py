"""Device DRAM: ``channels`` independent channels, addresses interleaved across them.

A transfer of ``n`` bytes at ``addr`` costs the access latency once (controller and
interconnect; not holding any channel: requests are pipelined), then occupies each channel
it touches. Each channel serves its requests one at a time in arrival order (first come,
first served): that is where concurrent transfers contend. Two timing models
(``dram.model``), both in the rule :func:`chunk_spans`, the one place a chunk is timed:

- ``"efficiency"``: a channel is kept as the time it next falls free; the bytes on it take
  ``ceil(bytes / (bus width x data rate x efficiency))`` (:func:`efficiency_spans`).
- ``"protocol"``: the DRAM standard's protocol model (:func:`protocol_spans` over
  :func:`sim.device.dram.timing.chunk_channels_ck`, Numba over plain arrays) keeps per
  channel the open row and timers of every bank, the data bus, the direction of the last
  column command and the refresh phase: a chunk's time comes from row hits and misses,
  tRCD/tRP/tRAS/tRRD/tFAW, read/write turnaround and all-bank refresh, cycle by cycle of
  the channel clock but one call per chunk.

Every engine calls the same rule, and the state changes only when a chunk is timed, in
event order: the engines give one schedule.
"""

from __future__ import annotations

import numpy as np
import simpy

from sim.device.components.rules import rule, transfer_ps
from sim.device.dram.cycles import ChannelState
from sim.device.dram.standards import timing_from_config
from sim.device.dram.timing import chunk_channels_ck
from sim.device.hw import DramConfig
from sim.units import ns_to_ps
from traces.recorder import Recorder

#: The columns of a chunk's spans (:func:`chunk_spans`): one row per channel it touches.
SPAN_CHANNEL, SPAN_BYTES, SPAN_START, SPAN_STOP = range(4)


@rule
def bytes_per_channel_into(addr: int, nbytes: int, granule: int, channels: int,
                           out: np.ndarray) -> None:
    """``out[c]`` = how many bytes of ``[addr, addr+nbytes)`` fall on channel ``c`` when
    consecutive ``granule``-byte blocks go to consecutive channels."""
    for c in range(channels):
        out[c] = 0
    if nbytes <= 0:
        return
    end = addr + nbytes
    stripe = granule * channels
    # Whole stripes in the middle give every channel ``granule`` bytes each.
    first_stripe_end = min(end, (addr // stripe + 1) * stripe)
    last_stripe_start = max(first_stripe_end, (end // stripe) * stripe)
    full = (last_stripe_start - first_stripe_end) // stripe
    if full:
        for c in range(channels):
            out[c] += full * granule
    for edge in range(2):
        a = addr if edge == 0 else last_stripe_start
        hi = first_stripe_end if edge == 0 else end
        while a < hi:
            g_end = min(hi, (a // granule + 1) * granule)
            out[(a // granule) % channels] += g_end - a
            a = g_end


def bytes_per_channel(addr: int, nbytes: int, granule: int, channels: int) -> list[int]:
    """:func:`bytes_per_channel_into` as a list."""
    out = np.zeros(channels, np.int64)
    bytes_per_channel_into(addr, nbytes, granule, channels, out)
    return out.tolist()


@rule
def put_span(spans: np.ndarray, n: int, channel: int, nbytes: int, start: int,
             stop: int) -> None:
    """Row ``n`` of ``spans``: ``(channel, bytes, start, stop)``."""
    spans[n, SPAN_CHANNEL] = channel
    spans[n, SPAN_BYTES] = nbytes
    spans[n, SPAN_START] = start
    spans[n, SPAN_STOP] = stop


@rule
def efficiency_spans(now: int, addr: int, nbytes: int, granule: int,
                     channel_bytes_per_s: float, free: np.ndarray,
                     spans: np.ndarray) -> tuple:
    """The efficiency model: each channel the chunk touches (in channel order) moves its
    bytes in ``ceil(bytes / channel_bytes_per_s)`` from when it falls free (``free``,
    ps, updated). Writes ``spans`` rows ``(channel, bytes, start, stop)``; returns
    ``(rows, when the last channel is done)``."""
    channels = free.shape[0]
    bytes_per_channel_into(addr, nbytes, granule, channels, spans[:, SPAN_BYTES])
    n = 0
    end = now
    for c in range(channels):
        b = spans[c, SPAN_BYTES]
        if b == 0:
            continue
        start = max(now, free[c])
        stop = start + transfer_ps(b, channel_bytes_per_s)
        free[c] = stop
        put_span(spans, n, c, b, start, stop)
        n += 1
        end = max(end, stop)
    return n, end


@rule
def protocol_spans(now: int, addr: int, nbytes: int, write: int, tck_ps: float,
                   params: np.ndarray, open_row: np.ndarray, act_ok: np.ndarray,
                   pre_ok: np.ndarray, cas_ok: np.ndarray, faw: np.ndarray,
                   scalars: np.ndarray, next_ref: np.ndarray, per_ch: np.ndarray,
                   free: np.ndarray, spans: np.ndarray) -> tuple:
    """The protocol model: one :func:`~sim.device.dram.timing.chunk_channels_ck` step over
    the channel state arrays (updated), its cycles made picoseconds (rounded up; a time
    under 1 ps past a cycle edge counts as that edge); ``free`` is raised to each
    channel's end. Writes ``spans`` as :func:`efficiency_spans` does; returns ``(rows,
    when the last channel is done)``."""
    t0 = np.int64(np.ceil((now - 1) / tck_ps))
    chunk_channels_ck(params, open_row, act_ok, pre_ok, cas_ok, faw, scalars, next_ref, addr,
                      nbytes, write != 0, t0, per_ch)
    n = 0
    end = now
    for c in range(per_ch.shape[0]):
        b = per_ch[c, 0]
        if b == 0:
            continue
        start = max(now, np.int64(np.ceil(per_ch[c, 1] * tck_ps - 1e-6)))
        stop = max(start, np.int64(np.ceil(per_ch[c, 2] * tck_ps - 1e-6)))
        free[c] = max(free[c], stop)
        put_span(spans, n, c, b, start, stop)
        n += 1
        end = max(end, stop)
    return n, end


@rule
def chunk_spans(now: int, addr: int, nbytes: int, write: int, protocol: bool,
                granule: int, channel_bytes_per_s: float, tck_ps: float,
                params: np.ndarray, open_row: np.ndarray, act_ok: np.ndarray,
                pre_ok: np.ndarray, cas_ok: np.ndarray, faw: np.ndarray,
                scalars: np.ndarray, next_ref: np.ndarray, per_ch: np.ndarray,
                free: np.ndarray, spans: np.ndarray) -> tuple:
    """A chunk of ``nbytes`` at ``addr`` reaching the channels at ``now`` (after the access
    latency), timed by the DRAM's model: :func:`protocol_spans` or
    :func:`efficiency_spans` (whose arguments it takes: the protocol model's are unused in
    the efficiency model and may be placeholders)."""
    if protocol:
        return protocol_spans(now, addr, nbytes, write, tck_ps, params, open_row, act_ok,
                              pre_ok, cas_ok, faw, scalars, next_ref, per_ch, free, spans)
    return efficiency_spans(now, addr, nbytes, granule, channel_bytes_per_s, free, spans)


#: One channel's share of a planned chunk: (channel, bytes, start ps, end ps).
ChannelSpan = tuple[int, int, int, int]


class Dram:
    def __init__(self, env: simpy.Environment, cfg: DramConfig, recorder: Recorder):
        self.env = env
        self.cfg = cfg
        self.recorder = recorder
        self.free_ps = np.zeros(cfg.channels, np.int64)  # when each channel falls free
        self.channel_bytes_per_s = float(cfg.channel_effective_bytes_per_s)
        self.latency_ps = ns_to_ps(cfg.access_latency_ns)
        self.bytes_read = 0
        self.bytes_written = 0
        self.protocol = cfg.model == "protocol"
        if self.protocol:
            self.timing = timing_from_config(cfg)
            self.state = ChannelState.fresh(self.timing)
            self.tck_ps = float(self.timing.tck_ps)
            self.params = self.timing.vector
        else:  # the protocol model's arguments of the rule, unused
            self.state = _NO_CHANNEL_STATE
            self.tck_ps = 1.0
            self.params = _NO_PARAMS
        self._spans = np.zeros((cfg.channels, 4), np.int64)

    def chunk_plan(self, addr: int, nbytes: int, write: bool, now_ps: int) -> list[ChannelSpan]:
        """Schedule a chunk of ``nbytes`` at ``addr`` that reaches the channels at
        ``now_ps``: ``(channel, bytes, start ps, end ps)`` for each channel it touches, in
        channel order (:func:`chunk_spans`). Commits the channels' state (their next free
        time, and in the protocol model the banks, bus direction and refresh phase)."""
        st = self.state
        n, _ = chunk_spans(now_ps, addr, nbytes, int(write), self.protocol,
                           self.cfg.interleave_bytes, self.channel_bytes_per_s, self.tck_ps,
                           self.params, st.open_row, st.act_ok, st.pre_ok, st.cas_ok, st.faw,
                           st.scalars, st.next_ref, st.per_channel, self.free_ps, self._spans)
        return [tuple(r) for r in self._spans[:n].tolist()]

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


#: The protocol parameters of :func:`chunk_spans` in the efficiency model (unused): read-only
#: as a timing's vector is, so that the rule and the array loop are compiled once for both
#: models (Numba types a read-only array apart from a writable one).
_NO_PARAMS = np.zeros(1, np.int64)
_NO_PARAMS.setflags(write=False)
#: The channel state arguments of :func:`chunk_spans` in the efficiency model (unused).
_NO_CHANNEL_STATE = ChannelState(*(np.zeros((1, 1), np.int64) for _ in range(5)),
                                 scalars=np.zeros((1, 5), np.int64),
                                 next_ref=np.zeros(1, np.int64),
                                 per_channel=np.zeros((1, 3), np.int64))
