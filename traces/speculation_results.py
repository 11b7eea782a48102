"""Speculative decoding's results as typed data, units in the field names: the
``speculation`` entry of a generate run's ``metrics.json`` (:class:`SpeculationFigures`,
built by ``sim.runtime.speculative.decode`` and ``sim.app.run_spec``) and the
``serving.speculation`` entry of a serving run's (:class:`ServingSpeculationFigures`,
``sim.serving.speculate``). Runs without speculation have neither entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType

from .typed_json import OPTIONAL, Record

NOT_A_COLUMN = MappingProxyType({"column": False})


@dataclass(frozen=True)
class SpecRound(Record):
    """One draft-verify-cut round: the tokens in the cache before it, the tokens drafted,
    accepted and added to the output, and the simulated seconds of its draft, its
    verification call and its tail cut."""

    step: int
    cache_size: int
    drafted: int
    accepted: int
    emitted: int
    draft_s: float
    verify_s: float
    cut_s: float

    @property
    def time_s(self) -> float:
        return self.draft_s + self.verify_s + self.cut_s


@dataclass(frozen=True)
class SpeculationSummary(Record):
    """A speculative decode's totals: tokens drafted and accepted, the acceptance rate
    (accepted over drafted), output tokens per verification call, the decode time split
    into draft, verify and tail cut, the tail cuts' share of it, and decode tokens per
    second (the tokens after the first, which the prefill's logits give, over the rounds'
    time)."""

    drafter: str
    k: int
    cut: str
    verify_calls: int
    rounds_with_drafts: int
    drafted_tokens: int
    accepted_tokens: int
    acceptance_rate: float
    tokens_per_verify_call: float
    tail_cuts: int
    draft_s: float
    verify_s: float
    cut_s: float
    decode_s: float
    tail_cut_share: float
    decode_tokens: int
    decode_tokens_per_s: float


@dataclass(frozen=True)
class AcceptanceFigures(Record):
    """Drafted and accepted tokens per verification call (``AcceptanceProfile.to_json``):
    a rate, or measured ``[drafted, accepted, calls]`` counts."""

    k: int
    rate: float | None = field(default=None, metadata=OPTIONAL)
    counts: tuple[tuple[int, ...], ...] | None = field(default=None, metadata=OPTIONAL)


@dataclass(frozen=True)
class SelfDraftDram(Record):
    """The DRAM map's view of a self-draft launched beside its model (bytes): the model's,
    the weight codes the draft reads in place, the draft's own regions (its integer
    parameters) and any weight codes copied (none when every weight is shared)."""

    model_bytes: int
    model_weight_bytes: int
    draft_shared_weight_bytes: int
    draft_own_bytes: int
    draft_own_regions: int
    draft_shared_regions: int
    draft_copied_weight_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class SpeculationFigures(Record):
    """A generate run's speculative decode: the drafter spec, a self-draft's layers, its
    launch time and DRAM figures (absent for prompt lookup), the totals, the measured
    acceptance (None without rounds), every round, and where acceptance came from (the
    run's own logits, or a profile it drew from)."""

    spec: str
    layers: tuple[int, ...] | None = field(metadata=OPTIONAL)
    launch_s: float | None = field(metadata=OPTIONAL)
    dram: SelfDraftDram | None = field(metadata=OPTIONAL)
    summary: SpeculationSummary = field()
    profile: AcceptanceFigures | None = field()
    rounds: tuple[SpecRound, ...] = field(metadata=NOT_A_COLUMN)
    acceptance: str = field()


@dataclass(frozen=True)
class ServingSpeculationFigures(Record):
    """Speculation in a serving run: the drafter, the simulated seconds of drafting, of
    the tail cuts (and how many ``filter_cache_tail`` calls) and of the steps that held
    verifications, the acceptance profile drawn from and its rate, and what the requests
    drafted, accepted and rejected (computed, then cut) over their verifications."""

    drafter: str
    draft_s: float
    tail_cut_s: float
    tail_cuts: int
    verify_steps_s: float
    profile: AcceptanceFigures
    profile_acceptance_rate: float
    verifications: int
    drafted_tokens: int
    accepted_tokens: int
    rejected_tokens: int
    acceptance_rate: float
    tokens_per_verification: float


__all__ = ["AcceptanceFigures", "SelfDraftDram", "ServingSpeculationFigures",
           "SpecRound", "SpeculationFigures", "SpeculationSummary"]
