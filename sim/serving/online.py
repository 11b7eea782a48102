"""Serving online: requests enter the serving simulation as they arrive, not from a workload
known in advance (``kvsim serve --http`` drives it; :mod:`.engine` is the offline form).

The caller stamps each request with its arrival on the simulated clock and submits it to a
chip (:meth:`OnlineServing.route` picks one, as the offline router does). It waits in the
chip's inbox and joins the scheduler at the first step boundary at or after its arrival,
as a request that arrives while a step runs does on vLLM and in
:class:`.engine.ServingSim`. :meth:`OnlineServing.step` plans a chip's next step at the
chip's clock from what the scheduler holds then and completes it at once (its time comes
from the step cost model); the chip's clock stays at the step's start until the caller has
delivered the step's tokens and calls :meth:`OnlineServing.reach`. A request stamped in
between arrived during the step: it waits for the next boundary. So the simulation never
sees a request before its arrival, and a request never changes a step that began before it
arrived; given the same arrivals (none at the very picosecond a step starts, where the
offline engine's order of simultaneous events decides), both engines give the same
schedule.

A request can leave early (:meth:`OnlineServing.abort`: a stop sequence, the
end-of-sequence token, a client that went away). Between steps every request's fields are
up to date (the scheduler's decode set is written back after each step), so the caller
reads which requests sampled a token in a step from :attr:`OnlineStep.sampled`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from sim.serving.blocks import KvGeometry
from sim.serving.engine import PlanCost, Router, StepCost, StepRecord, SwapCost, step_record
from sim.serving.scheduler import Request, Scheduler, SchedulerConfig


@dataclass(frozen=True)
class OnlineStep:
    """A step of one chip, completed (times in picoseconds)."""

    record: StepRecord
    sampled: list[Request]  # requests that sampled a token at the step's end, in item order
    finished: list[Request]  # requests that sampled their last output token in it

    @property
    def start_ps(self) -> int:
        return self.record.start_ps

    @property
    def end_ps(self) -> int:
        return self.record.end_ps


@dataclass(eq=False)
class OnlineChip:
    """One chip: its scheduler, clock, inbox of arrived requests and steps so far."""

    index: int
    scheduler: Scheduler
    clock_ps: int = 0  # the last boundary reached, or the start of the step in flight
    inbox: deque[Request] = field(default_factory=deque)
    steps: list[StepRecord] = field(default_factory=list)
    in_flight: OnlineStep | None = None
    busy_ps: int = 0
    #: requests that finish at the end of the step in flight (the scheduler, completed at
    #: once, no longer counts them; until that end they are the chip's)
    leaving: int = 0

    @property
    def load(self) -> int:
        """Unfinished requests at the chip's clock, the inbox's included (the least-loaded
        router's count)."""
        return self.scheduler.unfinished + len(self.inbox) + self.leaving


class OnlineServing:
    """Chips stepped one at a time by the caller (see the module docstring)."""

    def __init__(self, *, chips: int, scheduler: SchedulerConfig, geometry: KvGeometry,
                 step_cost: StepCost, swap_cost: SwapCost | None = None,
                 plan_cost: PlanCost | None = None, router: Router = "round_robin",
                 slots: int = 1):
        if chips < 1:
            raise ValueError(f"chips must be >= 1, got {chips}")
        if router not in ("round_robin", "least_loaded"):
            raise ValueError(f"router {router!r}: valid routers are round_robin, least_loaded")
        if scheduler.preemption == "swap" and swap_cost is None:
            raise ValueError("swap mode needs a swap cost")
        self.geometry = geometry
        self.chips = [OnlineChip(i, Scheduler(scheduler, geometry)) for i in range(chips)]
        self.step_cost = step_cost
        self.plan_cost = plan_cost  # equals step_cost(plan.seqs(slots)) (engine.ServingSim)
        self.swap_cost = swap_cost
        self.router = router
        self.slots = slots
        self._rr = 0
        #: every request submitted, in submission order
        self.requests: list[Request] = []

    # --- arrivals ----------------------------------------------------------------------
    def route(self) -> OnlineChip:
        """The chip the next request goes to (round robin: in turn; least loaded: the
        fewest unfinished requests, ties to the lowest chip)."""
        if self.router == "round_robin":
            chip = self.chips[self._rr % len(self.chips)]
            self._rr += 1
            return chip
        return min(self.chips, key=lambda c: (c.load, c.index))

    def fits(self, prompt_tokens: int, output_tokens: int) -> bool:
        """Whether a request of these lengths fits one chip's KV pool at its longest (the
        scheduler's admission rule)."""
        geo = self.geometry
        n = prompt_tokens + output_tokens - 1
        return n <= geo.max_tokens and geo.blocks(n) <= geo.num_blocks

    def submit(self, req: Request, chip: OnlineChip) -> None:
        """``req`` (``arrival_ps`` set, not before the chip's clock nor before the chip's
        last submitted request) arrives at ``chip``."""
        if req.arrival_ps < chip.clock_ps:
            raise ValueError(f"request {req.rid} arrives at {req.arrival_ps} ps, before chip "
                             f"{chip.index}'s clock ({chip.clock_ps} ps)")
        if chip.inbox and req.arrival_ps < chip.inbox[-1].arrival_ps:
            raise ValueError(f"request {req.rid} arrives before the request submitted "
                             f"before it")
        if not self.fits(req.prompt_tokens, req.output_tokens):
            raise ValueError(f"request {req.rid}: {req.prompt_tokens} + {req.output_tokens} "
                             f"tokens need more KV blocks than the chip has "
                             f"({self.geometry.num_blocks})")
        req.chip = chip.index
        chip.inbox.append(req)
        self.requests.append(req)

    def _admit(self, chip: OnlineChip) -> None:
        inbox = chip.inbox
        while inbox and inbox[0].arrival_ps <= chip.clock_ps:
            chip.scheduler.add(inbox.popleft())

    # --- steps -------------------------------------------------------------------------
    def idle(self, chip: OnlineChip) -> bool:
        """Nothing to run: no request in the scheduler and none in the inbox."""
        return not chip.scheduler.has_work() and not chip.inbox

    def step(self, chip: OnlineChip) -> OnlineStep | None:
        """Plan ``chip``'s next step at its clock (an idle chip's clock moves to its first
        arrival) and complete it; None when the chip has nothing to run. The step is in
        flight until :meth:`reach`."""
        if chip.in_flight is not None:
            raise RuntimeError(f"chip {chip.index}: the step in flight was not reached")
        sched = chip.scheduler
        self._admit(chip)
        if not sched.has_work():
            if not chip.inbox:
                return None
            chip.clock_ps = chip.inbox[0].arrival_ps
            self._admit(chip)
        plan = sched.schedule()
        if plan is None:
            raise RuntimeError(f"chip {chip.index}: requests wait but none can run "
                               f"(KV pool of {sched.geo.num_blocks} blocks)")
        start = chip.clock_ps
        swap = 0
        if plan.swap_out_bytes:
            swap += self.swap_cost("out", plan.swap_out_bytes)
        if plan.swap_in_bytes:
            swap += self.swap_cost("in", plan.swap_in_bytes)
        dur = swap + (self.plan_cost(plan) if self.plan_cost is not None
                      else self.step_cost(plan.seqs(self.slots)))
        end = start + dur
        # the decode set is written back after every step, so no item is in plan.head
        before = [(r, r.generated) for r, _ in plan.items]
        finished = sched.complete(plan, end)
        sched.sync()
        sampled = [r for r, g in before if r.generated > g]
        record = step_record(chip.index, sched, plan, start, end, swap)
        chip.steps.append(record)
        chip.busy_ps += dur
        chip.in_flight = OnlineStep(record, sampled, finished)
        chip.leaving = len(finished)
        return chip.in_flight

    def reach(self, chip: OnlineChip) -> None:
        """The step in flight has ended: the chip's clock moves to its end."""
        if chip.in_flight is None:
            raise RuntimeError(f"chip {chip.index}: no step in flight")
        chip.clock_ps = chip.in_flight.end_ps
        chip.in_flight = None
        chip.leaving = 0

    def abort(self, req: Request, at_ps: int) -> None:
        """``req`` leaves at ``at_ps`` with the tokens it has sampled (see
        :meth:`.scheduler.Scheduler.abort`); a request still in the inbox never ran."""
        chip = self.chips[req.chip]
        if req.state == "finished":
            return
        if chip.in_flight is not None and at_ps > chip.clock_ps:
            chip.leaving += 1  # it leaves at the end of the step in flight
        if req in chip.inbox:
            chip.inbox.remove(req)
            req.state = "finished"
            req.finish_ps = at_ps
            req.output_tokens = req.generated
            return
        chip.scheduler.abort(req, at_ps)

    def steps(self) -> list[list[StepRecord]]:
        """Every chip's steps so far."""
        return [c.steps for c in self.chips]


def replay(requests: Sequence[Request], online: OnlineServing) -> None:
    """Serve ``requests`` (arrival times set, in arrival order) with ``online`` as a server
    would with a clock that never lags: arrivals and step ends in time order (the requests of
    one instant all arrive before an idle chip plans; an arrival at the picosecond a step
    ends arrives before the end). For tests and offline checks."""
    pending = deque(sorted(requests, key=lambda r: (r.arrival_ps, r.rid)))
    chips = online.chips
    while True:
        ends = [(c.in_flight.end_ps, c.index) for c in chips if c.in_flight is not None]
        nxt = min(ends) if ends else None
        if pending and (nxt is None or pending[0].arrival_ps <= nxt[0]):
            t = pending[0].arrival_ps
            while pending and pending[0].arrival_ps == t:  # all of one instant, then steps
                online.submit(pending.popleft(), online.route())
            for chip in chips:
                if chip.in_flight is None:
                    online.step(chip)
            continue
        if nxt is None:
            return
        chip = chips[nxt[1]]
        online.reach(chip)
        online.step(chip)
