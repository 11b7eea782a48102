"""The ``[speculate]`` section of a run config (and ``[serving.speculate]`` of a serving
config): speculative decoding with a drafter, and, where no logits exist to measure it
(timing-only runs, the serving simulator), how many drafts are accepted::

    [speculate]
    drafter = "prompt-lookup:k=4"          # or "self:layers=26,k=2" (sim.runtime.speculative.spec)
    acceptance_rate = 0.6                  # timing only: each draft accepted with this
                                           # probability, independently (Leviathan et al.)
    # acceptance_counts = [[4, 0, 10], [4, 4, 6], [0, 0, 3]]   # or measured (drafted,
    #                                      # accepted, calls) triples
    # acceptance_file = "metrics.json"     # or the profile a functional run measured
    seed = 0                               # the draws' seed

A functional run measures acceptance from its own logits and takes none of the three.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field, model_validator

from kvsim.errors import ConfigError
from models.schema import Frozen
from sim.runtime.speculative import AcceptanceProfile, DraftSpec, parse_speculate

if TYPE_CHECKING:
    from models.config import ModelConfig
    from sim.app.config import RunConfig


class SpeculateSection(Frozen):
    """Speculative decoding (module docstring)."""

    drafter: str = Field(description="prompt-lookup:k=K[,ngram=N] or self:layers=N,k=K "
                         "(or self:skip=A-B,k=K); ,cut=window|rejected|host")
    acceptance_rate: float | None = Field(None, ge=0.0, le=1.0, description="timing only: "
                                          "per-draft acceptance probability")
    acceptance_counts: list[tuple[int, int, int]] | None = Field(
        None, description="timing only: measured [drafted, accepted, calls] triples")
    acceptance_file: str | None = Field(None, description="timing only: a JSON acceptance "
                                        "profile (or a metrics.json / generate --json holding "
                                        "speculation.profile)")
    seed: int = Field(0, ge=0, description="seed of the acceptance draws and of sampling")

    @model_validator(mode="after")
    def _valid(self) -> SpeculateSection:
        try:
            spec = self.spec()
        except ConfigError as err:
            raise ValueError(f"drafter: {err}") from None
        given = [k for k in ("acceptance_rate", "acceptance_counts", "acceptance_file")
                 if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"{given[1]}: give one of acceptance_rate, acceptance_counts, "
                             f"acceptance_file (both {given[0]} and {given[1]} are set)")
        if self.acceptance_counts is not None:
            try:
                prof = AcceptanceProfile(k=spec.k, counts=tuple(self.acceptance_counts))
            except ConfigError as err:
                raise ValueError(f"acceptance_counts: {err}") from None
            check_profile_k(prof, spec, "acceptance_counts")
        return self

    def spec(self) -> DraftSpec:
        return parse_speculate(self.drafter, where="")

    def given_profile(self) -> bool:
        return any(v is not None for v in (self.acceptance_rate, self.acceptance_counts,
                                           self.acceptance_file))

    def profile(self, where: str = "speculate") -> AcceptanceProfile:
        """The acceptance profile the section gives (reading ``acceptance_file``)."""
        spec = self.spec()
        if self.acceptance_rate is not None:
            return AcceptanceProfile(k=spec.k, rate=self.acceptance_rate)
        if self.acceptance_counts is not None:
            return AcceptanceProfile(k=spec.k, counts=tuple(self.acceptance_counts))
        if self.acceptance_file is not None:
            prof = AcceptanceProfile.from_file(self.acceptance_file,
                                               where=f"{where}.acceptance_file")
            check_profile_k(prof, spec, f"{where}.acceptance_file")
            return prof
        raise ConfigError(f"{where}: without logits (timing-only) speculation needs "
                          f"acceptance_rate, acceptance_counts or acceptance_file")


def check_profile_k(prof: AcceptanceProfile, spec: DraftSpec, where: str) -> None:
    """Measured counts must come from drafts of at most the drafter's ``k`` tokens."""
    most = max((d for d, _, _ in prof.counts), default=0)
    if most > spec.k:
        raise ConfigError(f"{where}: the profile drafts up to {most} tokens per call; the "
                          f"drafter drafts k={spec.k}")


def check_speculate(cfg: RunConfig) -> None:
    """Cross-field checks of ``[speculate]``: a generate workload without scheduled cache
    ops, calls long enough for a verification (k + 1 tokens), and acceptance given exactly
    where no logits measure it (timing-only runs)."""
    s = cfg.speculate
    if s is None:
        return
    spec = s.spec()
    if cfg.workload.kind != "generate":
        raise ConfigError(f"speculate: only a 'generate' workload decodes (kind is "
                          f"{cfg.workload.kind!r})")
    if cfg.workload.cache_ops:
        raise ConfigError("speculate: a run with workload.cache_ops cannot decode "
                          "speculatively (the ops are scheduled at token counts that a "
                          "verification call may step over)")
    if cfg.workload.output_tokens < 1:
        raise ConfigError("workload.output_tokens: 0 tokens leave nothing to decode "
                          "speculatively")
    if cfg.compile.max_sequence_length < spec.k + 1:
        raise ConfigError(f"compile.max_sequence_length: {cfg.compile.max_sequence_length} "
                          f"tokens cannot hold a verification call of k + 1 = {spec.k + 1}")
    functional = cfg.sim.fidelity == "functional"
    if functional and s.given_profile():
        raise ConfigError("speculate: a functional run measures acceptance from its own "
                          "logits; remove acceptance_rate / acceptance_counts / "
                          "acceptance_file (or set sim.fidelity = 'timing')")
    if not functional and not s.given_profile():
        raise ConfigError("speculate: a timing-only run has no logits to accept drafts with: "
                          "give acceptance_rate, acceptance_counts or acceptance_file")




def check_speculate_model(cfg: RunConfig, model: ModelConfig) -> None:
    """What only the model tells (``kvsim check`` and a run, before compiling): that a
    self-draft's layers exist and can be skipped, and a timing-only run's acceptance file."""
    from models.skip import check_keep

    s = cfg.speculate
    if s is None:
        return
    spec = s.spec()
    if spec.method == "self":
        check_keep(model, spec.keep(model.num_layers, where="speculate.drafter"),
                   where="speculate.drafter")
    if cfg.sim.fidelity == "timing":
        s.profile()


__all__ = ["SpeculateSection", "check_profile_k", "check_speculate", "check_speculate_model"]
