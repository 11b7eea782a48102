"""The serving engine as a discrete-event simulation (SimPy): requests arrive, a router
sends each to a chip, and each chip's engine runs one step at a time, for as long as the
device takes (:class:`.costs.StepCostModel`, plus the PCIe time of any swap), then starts
the next. Requests that arrive during a step wait for the next one, as with vLLM.

Several chips (MLA400: four ARIES chips, each with its own DRAM and PCIe link) are
data-parallel replicas, each with its own scheduler and KV pool; the router picks a chip
per request: ``round_robin`` (in turn) or ``least_loaded`` (the fewest unfinished
requests; ties to the lowest chip).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import simpy

from models.compiler.driver import StepSeq
from sim.serving.blocks import KvGeometry
from sim.serving.scheduler import Request, Scheduler, SchedulerConfig, StepPlan

Router = Literal["round_robin", "least_loaded"]
StepCost = Callable[[list[StepSeq]], int]
SwapCost = Callable[[str, int], int]  # ("out" | "in", bytes) -> picoseconds
PlanCost = Callable[[StepPlan], int]  # the same time as StepCost of the plan's sequences


@dataclass(frozen=True)
class StepRecord:
    """One step of one chip (times in picoseconds)."""

    chip: int
    index: int
    start_ps: int
    end_ps: int
    swap_ps: int
    tokens: int
    decode_seqs: int
    prefill_tokens: int
    sampled: int
    preempted: tuple[int, ...]
    swapped_in: tuple[int, ...]
    swap_out_bytes: int
    swap_in_bytes: int
    used_blocks: int  # after the step
    running: int
    waiting: int
    swapped: int
    items: tuple[tuple[int, int], ...]  # (rid, tokens) in scheduling order


@dataclass
class Chip:
    index: int
    scheduler: Scheduler
    steps: list[StepRecord] = field(default_factory=list)
    wake: simpy.Event | None = None
    busy_ps: int = 0


class ServingSim:
    """Requests -> router -> chips; :meth:`run` returns when every request finished."""

    def __init__(self, requests: Sequence[Request], *, chips: int,
                 scheduler: SchedulerConfig, geometry: KvGeometry, step_cost: StepCost,
                 swap_cost: SwapCost | None = None, router: Router = "round_robin",
                 slots: int = 1, on_finish: Callable[[int], None] | None = None,
                 plan_cost: PlanCost | None = None):
        if chips < 1:
            raise ValueError(f"chips must be >= 1, got {chips}")
        if router not in ("round_robin", "least_loaded"):
            raise ValueError(f"router {router!r}: valid routers are round_robin, least_loaded")
        if scheduler.preemption == "swap" and swap_cost is None:
            raise ValueError("swap mode needs a swap cost")
        self.env = simpy.Environment()
        self.requests = sorted(requests, key=lambda r: (r.arrival_ps, r.rid))
        self.chips = [Chip(i, Scheduler(scheduler, geometry)) for i in range(chips)]
        self.step_cost = step_cost
        #: The step's time straight from its plan (no sequences built); it must equal
        #: ``step_cost(plan.seqs(slots))`` (:meth:`.costs.StepCostModel.plan_ps` does).
        self.plan_cost = plan_cost
        self.swap_cost = swap_cost
        self.router = router
        self.slots = slots
        self._rr = 0
        self._finished = 0
        #: Called with the number of requests a step finished (progress; not timing).
        self.on_finish = on_finish
        self.done = self.env.event()

    def pick(self) -> Chip:
        if self.router == "round_robin":
            chip = self.chips[self._rr % len(self.chips)]
            self._rr += 1
            return chip
        return min(self.chips, key=lambda c: (c.scheduler.unfinished, c.index))

    def _arrivals(self):
        env = self.env
        i = 0
        reqs = self.requests
        while i < len(reqs):
            t = reqs[i].arrival_ps
            if t > env.now:
                yield env.timeout(t - env.now)
            # every request of this instant joins before any engine looks
            while i < len(reqs) and reqs[i].arrival_ps == t:
                chip = self.pick()
                reqs[i].chip = chip.index
                chip.scheduler.add(reqs[i])
                if chip.wake is not None and not chip.wake.triggered:
                    chip.wake.succeed()
                i += 1

    def _engine(self, chip: Chip):
        env = self.env
        sched = chip.scheduler
        while True:
            if not sched.has_work():
                chip.wake = env.event()
                yield chip.wake
                chip.wake = None
                continue
            plan = sched.schedule()
            if plan is None:
                raise RuntimeError(f"chip {chip.index}: requests wait but none can run "
                                   f"(KV pool of {sched.geo.num_blocks} blocks)")
            start = env.now
            swap = self._swap_ps(plan)
            dur = swap + (self.plan_cost(plan) if self.plan_cost is not None
                          else self.step_cost(plan.seqs(self.slots)))
            yield env.timeout(dur)
            chip.busy_ps += dur
            finished = len(sched.complete(plan, env.now))
            self._finished += finished
            if finished and self.on_finish is not None:
                self.on_finish(finished)
            chip.steps.append(self._record(chip, plan, start, env.now, swap))
            if self._finished == len(self.requests):
                self.done.succeed()
                return

    def _swap_ps(self, plan: StepPlan) -> int:
        t = 0
        if plan.swap_out_bytes:
            t += self.swap_cost("out", plan.swap_out_bytes)
        if plan.swap_in_bytes:
            t += self.swap_cost("in", plan.swap_in_bytes)
        return t

    def _record(self, chip: Chip, plan: StepPlan, start: int, end: int,
                swap: int) -> StepRecord:
        return step_record(chip.index, chip.scheduler, plan, start, end, swap)

    def run(self) -> None:
        env = self.env
        if not self.requests:
            return
        env.process(self._arrivals())
        for c in self.chips:
            env.process(self._engine(c))
        # the loop allocates short-lived lists and tuples by the million, and each time
        # the cycle collector would re-scan every live request (about a tenth of the
        # loop's time): it is paused for the loop and runs again after it
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            env.run(until=self.done)
        finally:
            for c in self.chips:
                c.scheduler.sync()
            if was_enabled:
                gc.enable()
        lost = [r.rid for r in self.requests if r.state != "finished"]
        if lost:
            raise RuntimeError(f"requests {lost[:10]} did not finish")


def step_record(chip: int, s: Scheduler, plan: StepPlan, start: int, end: int,
                swap: int) -> StepRecord:
    """The record of a completed step of ``chip`` (``s`` as the step left it)."""
    dec = len(plan.dec_pos)  # the one-token items (plan.tokens without a pass over them)
    tokens = dec + sum([n for n, _ in plan.pieces])
    return StepRecord(
        chip=chip, index=plan.index, start_ps=start, end_ps=end, swap_ps=swap,
        tokens=tokens, decode_seqs=dec, prefill_tokens=tokens - dec, sampled=plan.sampled,
        preempted=tuple(r.rid for r in plan.preempted),
        swapped_in=tuple(r.rid for r in plan.swapped_in),
        swap_out_bytes=plan.swap_out_bytes, swap_in_bytes=plan.swap_in_bytes,
        used_blocks=s.used_blocks, running=len(s.running), waiting=len(s.waiting),
        swapped=len(s.swapped), items=plan.rid_items())
