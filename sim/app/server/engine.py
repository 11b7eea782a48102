"""The server's engine: HTTP requests into the online serving simulation, tokens out on the
simulated schedule.

Each chip runs a loop (an asyncio task): plan and complete the next step at the chip's
clock (:meth:`.online.OnlineServing.step`), take a token for every request that sampled
one, wait until the step's end on the wall clock (``pace = "real"``: the end's simulated
time x ``time_scale`` after the server started; ``"none"``: no wait), reach the boundary,
then hand the tokens to their requests. A request is stamped on arrival with the latest
of the wall clock when its HTTP request arrived (in simulated time), its chip's clock
(just after the start of a step in flight) and the request before it, and joins at the
next boundary.
When a step's tokens leave later than their time (the simulator or the text behind the
clock), the lag is measured and reported (the request's header and chunks, ``/metrics``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from sim.app.server.metrics import ServerMetrics
from sim.app.server.text import Detokenizer, Sampling, StopText
from sim.serving.online import OnlineChip, OnlineServing, OnlineStep
from sim.serving.scheduler import Request
from sim.units import PS_PER_S

log = logging.getLogger("kvsim.server")


class Closing(Exception):
    """The server is shutting down: no new request is taken."""


class Pacer:
    """Simulated picoseconds against the event loop's clock (seconds)."""

    def __init__(self, pace: str, time_scale: float):
        self.pace = pace
        self.scale = time_scale
        self.t0 = 0.0
        self.loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.t0 = self.loop.time()

    def now_ps(self, at: float | None = None) -> int:
        """The wall clock (now, or the loop time ``at``) since the start, in simulated
        picoseconds."""
        t = self.loop.time() if at is None else at
        return int((t - self.t0) / self.scale * PS_PER_S)

    def wall(self, ps: int) -> float:
        return self.t0 + ps / PS_PER_S * self.scale

    async def until(self, ps: int) -> float | None:
        """Wait until simulated time ``ps`` on the wall clock (pace real); the lag past it
        in wall seconds (None: pace none, where no time is kept)."""
        if self.pace != "real":
            await asyncio.sleep(0)  # let the requests in between steps
            return None
        target = self.wall(ps)
        wait = target - self.loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        else:
            await asyncio.sleep(0)
        return max(0.0, self.loop.time() - target)


@dataclass(frozen=True)
class Piece:
    """What a request hears after a step: text, the token's simulated time and the lag."""

    text: str
    token_index: int  # 0-based output token index; -1: no token (the end only)
    t_ps: int
    lag_s: float | None
    finish: str | None = None  # "stop" | "length" | "cancelled" | "error"
    error: str | None = None


@dataclass(eq=False)
class Live:
    """A request in the server."""

    rid: int
    req: Request
    sampling: Sampling
    stream: object  # the token source's stream (next(), close())
    detok: Detokenizer
    stops: StopText
    pieces: asyncio.Queue[Piece] = field(default_factory=asyncio.Queue)
    tokens: list[int] = field(default_factory=list)
    finish: str | None = None
    cancelled: bool = False
    lag_max_s: float | None = None  # pace real: the largest lag of its tokens (wall s)
    lag_first_s: float | None = None  # ... of its first token
    lag_last_s: float | None = None  # ... of its latest token
    scheduled_ps: int | None = None  # start of the first step it was in
    client_id: str | None = None  # the client's X-Request-ID, if it sent one
    received_unix: float | None = None  # when its HTTP request arrived (time.time())
    first_unix: float | None = None  # when its first token was handed to the response
    endpoint: str = ""  # "completions" | "chat"
    stream_mode: bool = False

    def release(self) -> None:
        """The request has ended: its text state goes (the figures stay)."""
        self.stream.close()
        self.detok = self.stops = None

    def accept(self, token: int, stop_ids: frozenset[int]) -> tuple[str, str | None]:
        """The request's next token: ``(text to send, finish reason or None)``. Before
        ``min_tokens`` neither an end token (end of sequence or of the chat turn:
        ``stop_ids``, :attr:`models.tokenizer.Tokenizer.stop_ids`) nor a stop sequence ends
        the text (vLLM's rule); the end token's own text is not sent."""
        s = self.sampling
        self.tokens.append(token)
        n = len(self.tokens)
        eos_hit = token in stop_ids and not s.ignore_eos and n >= s.min_tokens
        piece = self.detok.flush() if eos_hit else self.detok.add(token)
        if n >= s.max_tokens:
            piece += self.detok.flush()
        if n < s.min_tokens:
            text, stopped = self.stops.flush() + piece, False
        else:
            text, stopped = self.stops.push(piece)
        if stopped or eos_hit:
            return text, "stop"
        if n >= s.max_tokens:
            return text + self.stops.flush(), "length"
        return text, None


class ServerEngine:
    """The online serving simulation behind the HTTP endpoints."""

    def __init__(self, online: OnlineServing, text, *, pacer: Pacer, metrics: ServerMetrics,
                 tokenizer, lag_tolerance_s: float):
        self.online = online
        self.text = text
        self.pacer = pacer
        self.metrics = metrics
        self.tok = tokenizer
        self.lag_tolerance_s = lag_tolerance_s
        self.lives: dict[int, Live] = {}
        self._ids = itertools.count()
        self._wake = [asyncio.Event() for _ in online.chips]
        self._cancelled: list[list[Live]] = [[] for _ in online.chips]  # to drop, per chip
        self._tasks: list[asyncio.Task] = []
        self.closing = False
        self.failed: str | None = None
        self.lag_max_s = 0.0
        self.late_steps = 0
        self._last_arrival = 0

    # --- life ----------------------------------------------------------------------------
    def start(self) -> None:
        self.pacer.start()
        self._tasks = [asyncio.create_task(self._run_chip(c), name=f"kvsim-chip{c.index}")
                       for c in self.online.chips]

    async def drain(self, grace_s: float) -> None:
        """Take no new request; wait up to ``grace_s`` for those in flight to finish, then
        cancel the rest (each ends at its chip's next boundary); stop the chips. Once
        drained, a second call returns at once."""
        self.closing = True
        loop = asyncio.get_running_loop()
        end = loop.time() + grace_s
        while (any(lv.finish is None for lv in self.lives.values()) and loop.time() < end
               and self.failed is None):
            await asyncio.sleep(0.01)
        for lv in self.lives.values():
            if lv.finish is None:
                self.cancel(lv)
        for ev in self._wake:
            ev.set()
        # the chips apply the cancels at their next boundary and stop when idle
        running = [t for t in self._tasks if not t.done()]
        if running:
            _, pending = await asyncio.wait(running, timeout=max(1.0, grace_s))
            for t in pending:
                t.cancel()
        for lv in self.lives.values():
            self._finish_cancelled(lv, self.online.chips[lv.req.chip].clock_ps)

    # --- requests --------------------------------------------------------------------------
    def fits(self, prompt_tokens: int, max_tokens: int) -> bool:
        return self.online.fits(prompt_tokens, max_tokens)

    def submit(self, prompt: Sequence[int], sampling: Sampling, *,
               received: float | None = None, **about) -> Live:
        """A new request (its tokens checked to fit): stamped, routed, its text opened.
        ``received``: the loop time its HTTP request arrived (default: now); ``about``
        sets :class:`Live`'s ``client_id``, ``endpoint``, ``stream_mode``."""
        if self.closing or self.failed is not None:
            raise Closing(self.failed or "the server is shutting down")
        rid = next(self._ids)
        chip = self.online.route()
        # arrivals in submission order (the order the router saw them), never before the
        # chip's clock, and after the start of a step in flight (it was planned without
        # them): replayed offline, the same arrivals give the same schedule
        inflight = 1 if chip.in_flight is not None else 0
        arrival = max(self.pacer.now_ps(received), chip.clock_ps + inflight,
                      self._last_arrival)
        self._last_arrival = arrival
        req = Request(rid, arrival, prompt_tokens=len(prompt), output_tokens=sampling.max_tokens)
        self.online.submit(req, chip)
        live = Live(rid, req, sampling, self.text.open(rid, prompt, sampling),
                    Detokenizer(self.tok), StopText(sampling.stop), **about)
        self.lives[rid] = live
        self.metrics.arrived(chip.index)
        self._wake[chip.index].set()
        return live

    def cancel(self, live: Live) -> None:
        """The client went away: the request leaves at its chip's next boundary."""
        if live.finish is None and not live.cancelled:
            live.cancelled = True
            live.stream.close()
            self._cancelled[live.req.chip].append(live)
            self._wake[live.req.chip].set()

    # --- the chips ---------------------------------------------------------------------------
    async def _run_chip(self, chip: OnlineChip) -> None:
        try:
            await self._chip_loop(chip)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # a fault of the server, not of a request
            log.exception("chip %d stopped", chip.index)
            self.failed = f"the simulation stopped: {type(err).__name__}: {err}"
            for lv in self.lives.values():
                if lv.finish is None:
                    lv.finish = "error"
                    lv.pieces.put_nowait(Piece("", -1, chip.clock_ps, None, "error",
                                               self.failed))

    async def _chip_loop(self, chip: OnlineChip) -> None:
        online = self.online
        wake = self._wake[chip.index]
        while True:
            self._drop_cancelled(chip)
            step = online.step(chip)
            if step is None:
                if self.closing:
                    return
                wake.clear()
                await wake.wait()
                continue
            out = await self._tokens(chip, step)
            lag = await self.pacer.until(step.end_ps)
            online.reach(chip)
            late = lag is not None and lag > self.lag_tolerance_s
            if lag is not None:
                self.lag_max_s = max(self.lag_max_s, lag)
                self.late_steps += late
            self.metrics.step(chip, step, lag, late)
            now_unix = time.time()
            for live, piece in out:
                if live.first_unix is None and piece.token_index >= 0:
                    live.first_unix = now_unix
                if lag is not None and piece.token_index >= 0:
                    live.lag_max_s = max(live.lag_max_s or 0.0, lag)
                    if live.lag_first_s is None:
                        live.lag_first_s = lag
                    live.lag_last_s = lag
                live.pieces.put_nowait(Piece(piece.text, piece.token_index, piece.t_ps, lag,
                                             piece.finish, piece.error))
                if piece.finish is not None:
                    self.metrics.finished(live)

    async def _tokens(self, chip: OnlineChip, step: OnlineStep) -> list[tuple[Live, Piece]]:
        """A token for each request the step sampled; a request whose text ended leaves at
        the step's end."""
        end = step.end_ps
        for rid, _ in step.record.items:
            lv = self.lives[rid]
            if lv.scheduled_ps is None:
                lv.scheduled_ps = step.start_ps
        out = []
        for req in step.sampled:
            lv = self.lives[req.rid]
            if lv.finish is not None or lv.cancelled:  # it leaves at the next boundary
                continue
            try:
                token = await lv.stream.next()
            except Exception as err:  # the text source failed for this request
                lv.finish = "error"
                online_abort(self.online, req, end)
                out.append((lv, Piece("", -1, end, None, "error", str(err))))
                continue
            text, finish = lv.accept(token, self.tok.stop_ids)
            if finish is None and req.state == "finished":
                raise RuntimeError(f"request {req.rid} finished in the simulation with its "
                                   f"text going on ({len(lv.tokens)} tokens)")
            if finish is not None:
                lv.finish = finish
                lv.release()
                online_abort(self.online, req, end)
            out.append((lv, Piece(text, len(lv.tokens) - 1, end, None, finish)))
        return out

    def _drop_cancelled(self, chip: OnlineChip) -> None:
        gone = self._cancelled[chip.index]
        while gone:
            self._finish_cancelled(gone.pop(), chip.clock_ps)

    def _finish_cancelled(self, lv: Live, at_ps: int) -> None:
        if lv.finish is not None:
            return
        lv.finish = "cancelled"
        lv.release()
        online_abort(self.online, lv.req, at_ps)
        lv.pieces.put_nowait(Piece("", -1, at_ps, None, "cancelled"))
        self.metrics.finished(lv)


def online_abort(online: OnlineServing, req: Request, at_ps: int) -> None:
    if req.state != "finished":
        online.abort(req, at_ps)
