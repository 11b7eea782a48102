"""How many tokens verification calls accept, for runs that cannot measure it (timing-only
runs, where no logits exist, and the serving simulator): an :class:`AcceptanceProfile`.

Two kinds:

- **a rate** ``alpha``: every call drafts ``k`` tokens and each is accepted with
  probability ``alpha`` independently of the others, so ``k`` tokens are accepted with
  probability ``alpha**k`` and ``i < k`` with ``alpha**i (1 - alpha)`` (the model of
  Leviathan et al., ICML 2023, section 3: ``E[tokens per call] = (1 - alpha**(k+1)) /
  (1 - alpha)``);
- **measured counts**: ``(drafted, accepted, calls)`` triples, as a functional run records
  them (:meth:`AcceptanceProfile.measured`; ``kvsim generate --speculate ... --json``
  writes them under ``speculation.profile``); a draw picks a triple in proportion to its
  calls. A prompt-lookup drafter finds no match on some calls: those are ``(0, 0, n)``.

Draws come from a generator the caller seeds, so a run is deterministic.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvsim.errors import ConfigError


@dataclass(frozen=True)
class AcceptanceProfile:
    """Drafted and accepted tokens per verification call (module docstring)."""

    k: int
    rate: float | None = None
    counts: tuple[tuple[int, int, int], ...] = ()

    def __post_init__(self) -> None:
        if self.rate is None and not self.counts:
            raise ConfigError("acceptance: give a rate or measured counts")
        if self.rate is not None and not 0.0 <= self.rate <= 1.0:
            raise ConfigError(f"acceptance rate: must lie in 0..1, got {self.rate!r}")
        for i, (d, a, n) in enumerate(self.counts):
            if not (0 <= a <= d and n >= 0):
                raise ConfigError(f"acceptance counts[{i}]: ({d}, {a}, {n}) must have "
                                  f"0 <= accepted <= drafted and calls >= 0")
        if self.counts and sum(n for *_, n in self.counts) == 0:
            raise ConfigError("acceptance counts: no calls")

    # --- constructors -------------------------------------------------------------------
    @classmethod
    def measured(cls, calls: Iterable[tuple[int, int]], k: int) -> AcceptanceProfile:
        """The profile of ``(drafted, accepted)`` per verification call."""
        c = Counter((int(d), int(a)) for d, a in calls)
        if not c:
            raise ConfigError("acceptance: no verification calls to measure")
        return cls(k=k, counts=tuple((d, a, n) for (d, a), n in sorted(c.items())))

    @classmethod
    def from_json(cls, data: Any, *, where: str = "acceptance") -> AcceptanceProfile:
        """From ``{"k": K, "rate": R}`` or ``{"k": K, "counts": [[d, a, n], ...]}``."""
        if not isinstance(data, dict) or "k" not in data:
            raise ConfigError(f"{where}: expected an object with 'k' and 'rate' or 'counts'")
        try:
            counts = tuple((int(d), int(a), int(n)) for d, a, n in data.get("counts", ()))
            return cls(k=int(data["k"]), rate=data.get("rate"), counts=counts)
        except (TypeError, ValueError) as err:
            if isinstance(err, ConfigError):
                raise ConfigError(f"{where}: {err}") from None
            raise ConfigError(f"{where}: counts must be [drafted, accepted, calls] "
                              f"triples of integers") from None

    @classmethod
    def from_file(cls, path: str | Path, *, where: str = "acceptance_file") -> AcceptanceProfile:
        """A profile saved as JSON, alone or as the ``speculation.profile`` entry of
        ``kvsim generate --json`` or of a run's ``metrics.json``."""
        p = Path(path)
        try:
            data = json.loads(p.read_text())
        except OSError as err:
            raise ConfigError(f"{where}: cannot read {p}: {err.strerror or err}") from None
        except (ValueError, UnicodeDecodeError):
            raise ConfigError(f"{where}: {p} is not a JSON file") from None
        if isinstance(data, dict) and "speculation" in data:
            data = (data["speculation"] or {}).get("profile")
        return cls.from_json(data, where=f"{where} {p}")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"k": self.k}
        if self.rate is not None:
            out["rate"] = self.rate
        if self.counts:
            out["counts"] = [list(c) for c in self.counts]
        return out

    # --- figures ------------------------------------------------------------------------
    def _pmf(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(drafted, accepted, probability)`` of every outcome."""
        if self.counts:
            d, a, n = (np.asarray(x, np.int64) for x in zip(*self.counts, strict=True))
            return d, a, n / n.sum()
        k, r = self.k, float(self.rate)  # type: ignore[arg-type]
        a = np.arange(k + 1)
        p = np.where(a < k, r ** a * (1 - r), r ** k)
        return np.full(k + 1, k), a, p

    def acceptance_rate(self) -> float:
        """Accepted over drafted tokens (0 when nothing is drafted)."""
        d, a, p = self._pmf()
        drafted = float((d * p).sum())
        return float((a * p).sum()) / drafted if drafted else 0.0

    def tokens_per_call(self) -> float:
        """Expected tokens a verification call yields (accepted + the one after them)."""
        _, a, p = self._pmf()
        return float((a * p).sum()) + 1.0

    def draw(self, rng: np.random.Generator, room: int) -> tuple[int, int]:
        """``(drafted, accepted)`` of one call that may draft at most ``room`` tokens (a
        draw beyond it is cut to ``room``)."""
        d, a, p = self._pmf()
        i = int(rng.choice(p.size, p=p))
        dd = min(int(d[i]), room)
        return dd, min(int(a[i]), dd)


__all__ = ["AcceptanceProfile"]
