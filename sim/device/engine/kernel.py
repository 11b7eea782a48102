"""A lean discrete-event kernel with SimPy's exact scheduling order, for speed.

The device's components are SimPy processes; this kernel runs the very same process
generators (``env.timeout``, ``env.process``, ``env.all_of``, a ``Resource`` and a
``Container``) at a fraction of SimPy's cost per event, because it keeps only what the
device uses: no failure propagation through events (an exception in a process stops the
run at once), no interrupts, no condition values, event values always ``None``.

What it keeps exactly is the order in which events are processed, which is what makes
simultaneous requests for a DRAM channel, an SRAM port, a DMA slot or a flag resolve the
same way as under SimPy (simpy 4.1, ``simpy/core.py``, ``events.py``, ``resources/``):

- one heap of ``(time, priority, insertion id, event)``; URGENT (0) for a process's
  start and for ``run(until=time)``'s stop event, NORMAL (1) for everything else; every
  scheduling takes the next insertion id;
- an event's callbacks run in the order they were added; a process that yields an event
  already processed continues at once, otherwise it is resumed by the event's callback;
- a process's own event is scheduled (NORMAL, now) when its generator returns;
- ``all_of`` succeeds (scheduled NORMAL, now) when the last of its events is processed;
- ``Container`` (unbounded, amounts of 1): a put raises the level at once and schedules
  its event, whose processing serves waiting gets in FIFO order while the level allows;
  a get is served at once (in FIFO order behind older waiters) or waits;
- ``Resource``: a request is granted at once if a slot is free and it is at the head of
  the queue; a release frees the slot at once and schedules its event, whose processing
  grants the head of the queue (at most one grant per trigger, as SimPy's ``_do_put``
  returns a false value).

``tests/sim/test_engines.py`` checks that both kernels give identical timelines.
"""

from __future__ import annotations

from collections import deque
from heapq import heappop, heappush
from typing import Any

import simpy

URGENT = 0
NORMAL = 1


class _Stop(Exception):
    pass


class Event:
    """An event: ``callbacks`` is a list until the event is processed, then None."""

    __slots__ = ("callbacks", "triggered")

    def __init__(self) -> None:
        self.callbacks: list | None = []
        self.triggered = False


class Process(Event):
    __slots__ = ("env", "gen", "resume")

    def __init__(self, env: Environment, gen) -> None:
        self.callbacks = []
        self.triggered = False
        self.env = env
        self.gen = gen
        self.resume = self._resume  # one bound method, reused for every wait
        init = Event()
        init.callbacks.append(self.resume)
        init.triggered = True
        env._push(init, URGENT, 0)

    def _resume(self, _event: Event) -> None:
        send = self.gen.send
        while True:
            try:
                event = send(None)
            except StopIteration:
                self.triggered = True
                self.env._push(self, NORMAL, 0)
                return
            callbacks = event.callbacks
            if callbacks is not None:
                callbacks.append(self.resume)
                return


class AllOf(Event):
    __slots__ = ("env", "count", "n")

    def __init__(self, env: Environment, events: list[Event]) -> None:
        self.callbacks = []
        self.triggered = False
        self.env = env
        self.count = 0
        self.n = len(events)
        if not events:
            self.triggered = True
            env._push(self, NORMAL, 0)
            return
        for event in events:
            if event.callbacks is None:
                self._check(event)
            else:
                event.callbacks.append(self._check)

    def _check(self, _event: Event) -> None:
        if self.triggered:
            return
        self.count += 1
        if self.count == self.n:
            self.triggered = True
            self.env._push(self, NORMAL, 0)


class Container:
    """An unbounded counting semaphore taking and giving amounts of 1 (the device's flags)."""

    __slots__ = ("env", "level", "waiters", "_serve_cb")

    def __init__(self, env: Environment) -> None:
        self.env = env
        self.level = 0
        self.waiters: deque[Event] = deque()
        self._serve_cb = self._serve

    def get(self, amount: int = 1) -> Event:
        if amount != 1:
            raise ValueError("this Container takes amounts of 1")
        event = Event()
        if self.level >= 1 and not self.waiters:
            # what _serve would do with this getter alone in the queue
            self.level -= 1
            event.triggered = True
            env = self.env
            heappush(env._queue, (env.now, NORMAL, env._eid, event))
            env._eid += 1
        else:
            self.waiters.append(event)
            self._serve(None)
        return event

    def put(self, amount: int = 1) -> Event:
        if amount != 1:
            raise ValueError("this Container gives amounts of 1")
        self.level += 1
        event = Event()
        event.callbacks.append(self._serve_cb)
        event.triggered = True
        self.env._push(event, NORMAL, 0)
        return event

    def _serve(self, _event: Event | None) -> None:
        waiters = self.waiters
        env = self.env
        while waiters and self.level >= 1:
            self.level -= 1
            event = waiters.popleft()
            event.triggered = True
            env._push(event, NORMAL, 0)


class Resource:
    """``capacity`` slots granted first come, first served."""

    __slots__ = ("env", "capacity", "users", "queue", "_grant_cb")

    def __init__(self, env: Environment, capacity: int = 1) -> None:
        if capacity <= 0:
            raise ValueError('"capacity" must be > 0.')
        self.env = env
        self.capacity = capacity
        self.users = 0
        self.queue: deque[Event] = deque()
        self._grant_cb = self._grant

    def request(self) -> Event:
        event = Event()
        if not self.queue and self.users < self.capacity:
            # what _grant would do with this request alone in the queue
            self.users += 1
            event.triggered = True
            env = self.env
            heappush(env._queue, (env.now, NORMAL, env._eid, event))
            env._eid += 1
        else:
            self.queue.append(event)
            self._grant(None)
        return event

    def release(self, _request: Event) -> Event:
        self.users -= 1
        event = Event()
        event.callbacks.append(self._grant_cb)
        event.triggered = True
        self.env._push(event, NORMAL, 0)
        return event

    def _grant(self, _event: Event | None) -> None:
        queue = self.queue
        if queue and self.users < self.capacity:
            self.users += 1
            event = queue.popleft()
            event.triggered = True
            self.env._push(event, NORMAL, 0)


class Environment:
    """The kernel's environment: ``now`` (an attribute), ``timeout``, ``process``,
    ``all_of`` and ``run`` with SimPy's meaning."""

    def __init__(self, initial_time: int = 0) -> None:
        self.now = initial_time
        self._queue: list = []
        self._eid = 0

    def _push(self, event: Event, priority: int, delay: int) -> None:
        heappush(self._queue, (self.now + delay, priority, self._eid, event))
        self._eid += 1

    def timeout(self, delay: int) -> Event:
        if delay < 0:
            raise ValueError(f"Negative delay {delay}")
        event = Event()
        event.triggered = True
        heappush(self._queue, (self.now + delay, NORMAL, self._eid, event))
        self._eid += 1
        return event

    def process(self, gen) -> Process:
        return Process(self, gen)

    def all_of(self, events: list[Event]) -> AllOf:
        return AllOf(self, list(events))

    @property
    def insertion_id(self) -> int:
        """The id the next scheduled event takes (ties at one time and priority are
        processed in id order)."""
        return self._eid

    def advance(self, now: int, insertion_id: int) -> None:
        """Set the clock and the next insertion id after events were processed elsewhere
        (the array loop of ``sim.device.engine.loop``); the queue must be empty."""
        if self._queue:
            raise RuntimeError("cannot advance a kernel with events scheduled")
        if now < self.now or insertion_id < self._eid:
            raise ValueError("the clock and the insertion id only move forward")
        self.now = now
        self._eid = insertion_id

    @property
    def pending(self) -> int:
        """Events scheduled and not yet processed."""
        return len(self._queue)

    def run(self, until: Any = None) -> None:
        if until is not None:
            if not isinstance(until, Event):
                at = until if isinstance(until, int) else float(until)
                if at <= self.now:
                    raise ValueError(
                        f"until ({at}) must be greater than the current simulation time"
                    )
                until = Event()
                until.triggered = True
                self._push(until, URGENT, at - self.now)
            elif until.callbacks is None:
                return
            until.callbacks.append(_stop)
        queue = self._queue
        try:
            while queue:
                self.now, _, _, event = heappop(queue)
                callbacks, event.callbacks = event.callbacks, None
                for callback in callbacks:
                    callback(event)
        except _Stop:
            return
        if until is not None:
            raise RuntimeError(
                f'No scheduled events left but "until" event was not triggered: {until}'
            )


def _stop(_event: Event) -> None:
    raise _Stop


#: Either event kernel (the components take one as ``env``).
AnyEnvironment = simpy.Environment | Environment


def resource_for(env: Any, capacity: int) -> Resource | simpy.Resource:
    """A ``Resource`` of the kernel ``env`` belongs to (SimPy's or this one)."""
    if isinstance(env, Environment):
        return Resource(env, capacity)
    return simpy.Resource(env, capacity=capacity)


def container_for(env: Any) -> Container | simpy.Container:
    """An unbounded ``Container`` of the kernel ``env`` belongs to."""
    if isinstance(env, Environment):
        return Container(env)
    return simpy.Container(env)
