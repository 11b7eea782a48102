"""Quality of the integer pipeline against the float reference: the metrics (pure numpy),
the typed result, and the degenerate-output guard.

Teacher forcing: a text of ``n`` tokens gives ``n - 1`` predictions (position ``i``'s
logits predict token ``i + 1``). Over them:

- ``perplexity``: ``exp(mean NLL)`` of the text under the NPU's logits (nats per token);
  ``reference_perplexity`` the same under the float reference's;
- ``kl_mean``: ``KL(reference || NPU)`` in nats, the mean over the positions: how much the
  NPU's next-token distribution departs from the reference's where the reference puts its
  mass;
- ``top1_agreement``: the fraction of positions whose argmax the two share.

The run that produces the NPU's logits is :func:`sim.quality.evaluate` (it drives the
simulated device; ``models`` does not import ``sim``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from isa.errors import KvsimError


class DegenerateOutput(KvsimError):
    """The NPU's output cannot be right (all-zero, constant or NaN logits; a text that
    collapses to one repeated token while the reference's does not)."""


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64 (``(..., vocab)``)."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def _check_pair(ref: np.ndarray, npu: np.ndarray) -> None:
    if ref.shape != npu.shape or ref.ndim != 2:
        raise ValueError(f"logits: reference {ref.shape} and NPU {npu.shape} must both be "
                         f"(positions, vocab)")


def next_token_nll(logits: np.ndarray, tokens: Sequence[int]) -> np.ndarray:
    """NLL (nats) of ``tokens[1:]`` under ``logits[:-1]`` (``n - 1`` values)."""
    t = np.asarray(tokens, dtype=np.int64)
    if logits.ndim != 2 or logits.shape[0] != t.size or t.size < 2:
        raise ValueError(f"logits {logits.shape}: need (n, vocab) for n = {t.size} >= 2 tokens")
    lp = log_softmax(logits[:-1])
    return -lp[np.arange(t.size - 1), t[1:]]


def perplexity(logits: np.ndarray, tokens: Sequence[int]) -> float:
    """``exp(mean NLL)`` of the text ``tokens`` under teacher-forced ``logits``."""
    return float(np.exp(next_token_nll(logits, tokens).mean()))


def kl_per_position(ref: np.ndarray, npu: np.ndarray) -> np.ndarray:
    """``KL(softmax(ref) || softmax(npu))`` per row, nats (>= 0)."""
    _check_pair(ref, npu)
    lp, lq = log_softmax(ref), log_softmax(npu)
    return np.maximum((np.exp(lp) * (lp - lq)).sum(axis=-1), 0.0)


def top1_agreement(ref: np.ndarray, npu: np.ndarray) -> float:
    """Fraction of rows whose argmax is the same."""
    _check_pair(ref, npu)
    return float(np.mean(ref.argmax(axis=-1) == npu.argmax(axis=-1)))


def degenerate_logits(logits: np.ndarray) -> str | None:
    """Why ``logits`` (any shape, last axis the vocabulary) cannot be a model's output, or
    None: NaN/inf values, every value zero, or a row that is constant (no preference
    between any two tokens)."""
    a = np.asarray(logits)
    if a.size == 0:
        return "no logits"
    if not np.isfinite(a).all():
        return f"{int((~np.isfinite(a)).sum())} of {a.size} logits are NaN or inf"
    if not a.any():
        return f"all {a.size} logits are zero"
    rows = a.reshape(-1, a.shape[-1])
    flat = np.flatnonzero(rows.max(axis=-1) == rows.min(axis=-1))
    if flat.size:
        return f"{flat.size} of {rows.shape[0]} logits rows are constant (first: row {flat[0]})"
    return None


#: A continuation "collapses" when its most common token fills at least this share of it
#: (an assumption: 0.9 of a greedy continuation of >= 8 tokens as one id is a stuck model,
#: not a list of repeated words).
COLLAPSE_SHARE = 0.9
COLLAPSE_MIN_TOKENS = 8


def repeat_share(tokens: Sequence[int]) -> float:
    """The share of ``tokens`` taken by its most common token (0 for no tokens)."""
    t = np.asarray(tokens, dtype=np.int64)
    return float(np.bincount(t - t.min()).max() / t.size) if t.size else 0.0


def collapsed(tokens: Sequence[int], reference: Sequence[int]) -> str | None:
    """Why ``tokens`` (the NPU's continuation) collapsed to one repeated token while the
    reference's continuation did not, or None."""
    if len(tokens) < COLLAPSE_MIN_TOKENS:
        return None
    s, r = repeat_share(tokens), repeat_share(reference)
    if s >= COLLAPSE_SHARE > r:
        tok = int(np.bincount(np.asarray(tokens, dtype=np.int64)).argmax())
        return (f"the continuation collapsed to token {tok} ({s:.0%} of {len(tokens)} "
                f"tokens) while the reference's did not ({r:.0%})")
    return None


@dataclass(frozen=True)
class Quality:
    """Teacher-forced quality of one configuration against the float reference."""

    model: str
    real_weights: bool
    tokens: int  # tokens of the text (``tokens - 1`` predictions)
    perplexity: float
    reference_perplexity: float
    kl_mean: float  # nats, KL(reference || NPU), mean over the predictions
    kl_max: float  # nats
    top1_agreement: float
    bits: str  # weight-bit label, e.g. "W8"
    numerics: dict[str, str]  # the [bits.numerics] options
    kv: str  # KV format
    kv_read: str  # "integer" | "dequant"
    hw: str
    prefill_s: float  # simulated time of the teacher-forced prefill calls
    #: why the NPU's logits are degenerate (measured anyway on request), or None
    degenerate: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare(ref: np.ndarray, npu: np.ndarray, tokens: Sequence[int], *,
            allow_degenerate: bool = False, **config: Any) -> Quality:
    """The :class:`Quality` of ``npu`` logits against ``ref`` logits, both ``(n, vocab)``
    for the text ``tokens``; ``config`` gives the other fields. Degenerate NPU logits
    raise :class:`DegenerateOutput`, or with ``allow_degenerate`` are measured anyway and
    named in ``degenerate``."""
    _check_pair(ref, npu)
    why = degenerate_logits(npu)
    if why is not None and not allow_degenerate:
        raise DegenerateOutput(f"NPU logits: {why} (the integer pipeline's output cannot be "
                               f"right; allow_degenerate measures it anyway)")
    kl = kl_per_position(ref[:-1], npu[:-1])
    return Quality(tokens=len(tokens), perplexity=perplexity(npu, tokens),
                   reference_perplexity=perplexity(ref, tokens), kl_mean=float(kl.mean()),
                   kl_max=float(kl.max()), top1_agreement=top1_agreement(ref[:-1], npu[:-1]),
                   degenerate=why, **config)


__all__ = ["COLLAPSE_SHARE", "DegenerateOutput", "Quality", "collapsed", "compare",
           "degenerate_logits", "kl_per_position", "log_softmax", "next_token_nll",
           "perplexity", "repeat_share", "top1_agreement"]
