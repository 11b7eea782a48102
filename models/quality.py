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

The run that produces the NPU's logits is :func:`sim.app.quality.evaluate` (it drives the
simulated device; ``models`` does not import ``sim``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from kvsim.errors import KvsimError


class DegenerateOutput(KvsimError):
    """The NPU's output cannot be right (all-zero, constant or NaN logits; a text that
    collapses to one repeated token while the reference's does not)."""


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64 (``(..., vocab)``)."""
    z = np.array(logits, dtype=np.float64)  # a copy, worked on in place (the same values)
    z -= z.max(axis=-1, keepdims=True)
    z -= np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return z


def _check_pair(ref: np.ndarray, npu: np.ndarray) -> None:
    if ref.shape != npu.shape or ref.ndim != 2:
        raise ValueError(f"logits: reference {ref.shape} and NPU {npu.shape} must both be "
                         f"(positions, vocab)")


def next_token_nll(logits: np.ndarray, tokens: Sequence[int]) -> np.ndarray:
    """NLL (nats) of ``tokens[1:]`` under ``logits[:-1]`` (``n - 1`` values)."""
    t = np.asarray(tokens, dtype=np.int64)
    if logits.ndim != 2 or logits.shape[0] != t.size or t.size < 2:
        raise ValueError(f"logits {logits.shape}: need (n, vocab) for n = {t.size} >= 2 tokens")
    return _nll(log_softmax(logits[:-1]), t)


def _nll(logp: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """NLL (nats) of ``tokens[1:]`` under the log-probabilities ``logp`` of the rows that
    predict them."""
    return -logp[np.arange(tokens.size - 1), tokens[1:]]


def perplexity(logits: np.ndarray, tokens: Sequence[int]) -> float:
    """``exp(mean NLL)`` of the text ``tokens`` under teacher-forced ``logits``."""
    return float(np.exp(next_token_nll(logits, tokens).mean()))


def kl_per_position(ref: np.ndarray, npu: np.ndarray) -> np.ndarray:
    """``KL(softmax(ref) || softmax(npu))`` per row, nats (>= 0)."""
    _check_pair(ref, npu)
    return _kl(log_softmax(ref), log_softmax(npu))


def _kl(lp: np.ndarray, lq: np.ndarray) -> np.ndarray:
    """``KL(p || q)`` per row (nats, >= 0) from the log-probabilities of both."""
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


#: Where the position buckets of :class:`Quality` start (prediction positions; the last
#: bucket runs to the end of the text). An assumption: 128 is KIVI's fp16 window, so the
#: first bucket is what a KIVI format holds unquantized on a short text.
BUCKET_STARTS: tuple[int, ...] = (0, 128, 256)


@dataclass(frozen=True)
class PositionBucket:
    """The figures of the predictions at positions ``start .. end - 1``."""

    start: int
    end: int
    kl_mean: float  # nats
    top1_agreement: float

    @property
    def positions(self) -> int:
        return self.end - self.start


def position_buckets(kl: np.ndarray, agree: np.ndarray, *, first: int = 0,
                     starts: Sequence[int] = BUCKET_STARTS) -> tuple[PositionBucket, ...]:
    """Per-position KL (nats) and top-1 hits (bools) of the predictions at positions
    ``first ..`` cut at ``starts`` into buckets (empty ones left out). The buckets
    partition the positions, so their position-weighted means are the totals."""
    kl, agree = np.asarray(kl, np.float64), np.asarray(agree, bool)
    if kl.shape != agree.shape or kl.ndim != 1:
        raise ValueError(f"position_buckets: kl {kl.shape} and agree {agree.shape} must be "
                         f"the same 1-D shape")
    if list(starts) != sorted(set(starts)) or not starts or starts[0] != 0:
        raise ValueError(f"position_buckets: starts {tuple(starts)} must rise from 0")
    end = first + kl.size
    edges = [*starts, max(end, starts[-1])]
    out = []
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        lo, hi = max(lo, first), min(hi, end)
        if lo < hi:
            sel = slice(lo - first, hi - first)
            out.append(PositionBucket(lo, hi, float(kl[sel].mean()),
                                      float(agree[sel].mean())))
    return tuple(out)


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
    #: damage against context length: one :class:`PositionBucket` per range of
    #: prediction positions (:data:`BUCKET_STARTS`), from the same per-position figures
    buckets: tuple[PositionBucket, ...] = ()
    #: the first prediction position the figures cover (0: the whole text; after a cache
    #: edit, the position where the edit took effect)
    first_position: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare(ref: np.ndarray, npu: np.ndarray, tokens: Sequence[int], *,
            allow_degenerate: bool = False, first: int = 0, **config: Any) -> Quality:
    """The :class:`Quality` of ``npu`` logits against ``ref`` logits, both ``(n, vocab)``
    for the text ``tokens``, over the predictions at positions ``first .. n - 2`` (0: all
    of them); ``config`` gives the other fields. Degenerate NPU logits raise
    :class:`DegenerateOutput`, or with ``allow_degenerate`` are measured anyway and named
    in ``degenerate``."""
    _check_pair(ref, npu)
    n = len(tokens)
    if not 0 <= first <= n - 2:
        raise ValueError(f"first: {first} must lie in 0..{n - 2} (the text's predictions)")
    why = degenerate_logits(npu[first:])
    if why is not None and not allow_degenerate:
        raise DegenerateOutput(f"NPU logits: {why} (the integer pipeline's output cannot be "
                               f"right; allow_degenerate measures it anyway)")
    r, q = ref[first:-1], npu[first:-1]
    # each side's log-softmax once, for its KL and its perplexity (the rows that predict
    # the text are the rows the KL compares; log_softmax works row by row, so the figures
    # are those of kl_per_position and perplexity, bit for bit)
    lp, lq = log_softmax(r), log_softmax(q)
    kl = _kl(lp, lq)
    agree = r.argmax(axis=-1) == q.argmax(axis=-1)
    tail = np.asarray(list(tokens)[first:], dtype=np.int64)
    return Quality(tokens=n, perplexity=float(np.exp(_nll(lq, tail).mean())),
                   reference_perplexity=float(np.exp(_nll(lp, tail).mean())),
                   kl_mean=float(kl.mean()), kl_max=float(kl.max()),
                   top1_agreement=float(agree.mean()), degenerate=why,
                   buckets=position_buckets(kl, agree, first=first), first_position=first,
                   **config)


__all__ = ["BUCKET_STARTS", "COLLAPSE_SHARE", "DegenerateOutput", "PositionBucket", "Quality",
           "collapsed", "compare", "degenerate_logits", "kl_per_position", "log_softmax",
           "next_token_nll", "perplexity", "position_buckets", "repeat_share",
           "top1_agreement"]
