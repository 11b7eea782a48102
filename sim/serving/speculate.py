"""Speculative decoding under load: what each request drafts and accepts per step
(:class:`SpecPolicy`, drawn from an acceptance profile) and what a step with verification
items costs beyond the batched step itself (:class:`SpecCosts`).

A step in which some requests verify drafts costs, one after the other:

1. **the drafts**: a self-draft runs ``max d`` batched decode steps of the draft model
   (its own step-cost grid, :class:`.costs.StepCostModel` of the layer-skipping model):
   step ``i`` holds every verifying request that drafts more than ``i`` tokens, at its
   position ``c + i``; prompt lookup runs on the host, one lookup per verifying request
   (:func:`sim.runtime.speculative.drafters.lookup_host_ns`, one after the other);
2. **the batched step** (the step-cost model): each verification is a piece of ``1 + d``
   tokens at its cache position whose every position's logits go to the host (the LM head
   over all of them, ``n x vocab`` logits back over the host link);
3. **the tail cuts**: one ``filter_cache_tail`` call per request that rejected drafts (the
   runtime takes one cache slot per call): the runtime overhead and, with ``cut =
   window``, the on-device program that rewrites the kept tokens
   (:func:`sim.runtime.cacheops.rearrange_program`, simulated once per kept-token count
   at position 0: its time is its fixed costs, dispatch and DMA set-up, not where it
   writes); ``cut = host`` costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from isa.instructions import Program
from models.compiler import CompiledModel
from sim.device.hw import HardwareConfig
from sim.runtime.cacheops import rearrange_program
from sim.runtime.speculative.drafters import lookup_host_ns
from sim.runtime.speculative.profile import AcceptanceProfile
from sim.runtime.speculative.spec import DraftSpec
from sim.serving.grid import timing_device
from sim.units import ns_to_ps
from traces.speculation_results import AcceptanceFigures, ServingSpeculationFigures

if TYPE_CHECKING:
    from sim.serving.costs import StepCostModel
    from sim.serving.scheduler import Request, StepPlan


@dataclass
class SpecPolicy:
    """Drafted and accepted tokens per verification, drawn from ``profile`` by a generator
    of each request's own (seeded by ``(seed, rid)``: a request's draws do not depend on
    which other requests share its steps)."""

    profile: AcceptanceProfile
    k: int
    seed: int = 0
    _rngs: dict[int, np.random.Generator] = field(default_factory=dict, repr=False)

    def draw(self, req: Request, room: int) -> tuple[int, int]:
        """``(drafted, accepted)`` of ``req``'s verification; at most ``room`` drafts."""
        if room < 1:
            return 0, 0
        rng = self._rngs.get(req.rid)
        if rng is None:
            rng = self._rngs[req.rid] = np.random.default_rng(
                np.random.SeedSequence([self.seed, req.rid]))
        return self.profile.draw(rng, room)


class SpecCosts:
    """The cost of a scheduled step with its drafts and tail cuts (module docstring);
    :meth:`plan_ps` replaces the step-cost model's in the serving loop."""

    def __init__(self, spec: DraftSpec, cost: StepCostModel, cm: CompiledModel,
                 hw: HardwareConfig, *, draft_cost: StepCostModel | None = None):
        if spec.method == "self" and draft_cost is None:
            raise ValueError("a self-draft needs the draft model's step costs")
        self.spec, self.cost, self.cm, self.hw = spec, cost, cm, hw
        self.draft_cost = draft_cost
        self.call_ps = ns_to_ps(hw.host.call_overhead_ns)
        self._cut_memo: dict[int, int] = {}
        self.draft_ps = self.cut_ps = self.verify_step_ps = 0  # totals over the run
        self.cuts = 0

    def cut_program_ps(self, kept: int) -> int:
        """The device time of the ``window`` cut's program keeping ``kept`` tokens."""
        v = self._cut_memo.get(kept)
        if v is None:
            prog: Program = rearrange_program(self.cm, slot=0, keep=list(range(kept)), dst=0,
                                              name="filter_cache_tail")
            v = self._cut_memo[kept] = (timing_device(self.cm, self.hw).run(
                prog, validate=False).duration_ps if prog.instructions else 0)
        return v

    def plan_ps(self, plan: StepPlan) -> int:
        t = self.cost.plan_ps(plan)
        if not plan.drafting:
            return t
        self.verify_step_ps += t
        draft = self._draft_ps(plan)
        cut = 0
        for r in plan.verify:
            if r.draft_accepted < r.draft and self.spec.cut != "host":
                cut += self.call_ps + (self.cut_program_ps(r.draft_accepted + 1)
                                       if self.spec.cut == "window" else 0)
                self.cuts += 1
        self.draft_ps += draft
        self.cut_ps += cut
        return t + draft + cut

    def _draft_ps(self, plan: StepPlan) -> int:
        if self.spec.method == "prompt-lookup":  # every request that looked, found or not
            return sum(ns_to_ps(lookup_host_ns(self.hw, r.computed + 1, self.spec.ngram))
                       for r in plan.drafting)
        assert self.draft_cost is not None
        verify = plan.verify
        if not verify:
            return 0
        t = 0
        for i in range(max(r.draft for r in verify)):
            pos = [r.computed + i for r in verify if r.draft > i]
            t += self.call_ps + self.draft_cost.batch_ps(pos, [], len(pos))
        return t

def speculation_metrics(requests: list[Request], costs: SpecCosts,
                        profile: AcceptanceProfile) -> ServingSpeculationFigures:
    """The ``serving.speculation`` figures: drafted, accepted and rejected tokens, the
    acceptance rate, tokens per verification and the time of drafts and tail cuts."""
    drafted = sum(r.drafted_tokens for r in requests)
    accepted = sum(r.accepted_tokens for r in requests)
    steps = sum(r.verify_steps for r in requests)
    return ServingSpeculationFigures(
        drafter=costs.spec.text(), draft_s=costs.draft_ps / 1e12,
        tail_cut_s=costs.cut_ps / 1e12, tail_cuts=costs.cuts,
        verify_steps_s=costs.verify_step_ps / 1e12,
        profile=AcceptanceFigures.from_metrics(profile.to_json(),
                                               "serving.speculation.profile"),
        profile_acceptance_rate=profile.acceptance_rate(), verifications=steps,
        drafted_tokens=drafted, accepted_tokens=accepted,
        rejected_tokens=sum(r.rejected_tokens for r in requests),
        acceptance_rate=accepted / drafted if drafted else 0.0,
        tokens_per_verification=(accepted + steps) / steps if steps else 0.0)


__all__ = ["SpecCosts", "SpecPolicy", "speculation_metrics"]
