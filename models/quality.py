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


def _kl_consuming(lp: np.ndarray, lq: np.ndarray) -> np.ndarray:
    """:func:`_kl` of the same values, overwriting ``lp`` (two ``rows x vocab`` float64
    temporaries fewer: 0.4 GB for 512 rows of a 49,152-token vocabulary); elementwise
    operations in place compute what they compute into new arrays."""
    d = lp - lq
    np.exp(lp, out=lp)
    lp *= d
    return np.maximum(lp.sum(axis=-1), 0.0)


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
#: first bucket is what a KIVI format holds unquantized on a short text; from 1,024 on
#: the buckets double, so a long text's figures show the damage out to its end (a text
#: of up to 1,024 tokens keeps the three buckets it always had).
BUCKET_STARTS: tuple[int, ...] = (0, 128, 256, 1024, 2048, 4096)


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


#: Rows :meth:`QualityStream.add` works on at a time.
STREAM_ROWS = 64

class QualityStream:
    """:func:`compare` over logits that arrive a block of positions at a time: a long
    text's ``n x vocab`` logits (1.6 GB per side at 8,192 tokens of a 49,152-token
    vocabulary) are never held at once. Each :meth:`add` keeps the per-position figures
    of its rows (KL, top-1 hit, both NLLs: a few floats per position) and the degenerate
    checks' counts; :meth:`result` reduces them exactly as :func:`compare` reduces its
    whole arrays, so the figures are the same to the last bit (every per-position figure
    is computed row by row; the means run once over all positions)."""

    def __init__(self, tokens: Sequence[int], *, first: int = 0):
        self.tokens = np.asarray(list(tokens), dtype=np.int64)
        n = self.tokens.size
        if not 0 <= first <= n - 2:
            raise ValueError(f"first: {first} must lie in 0..{n - 2} (the text's predictions)")
        self.first = first
        self._next = first  # the next position a block must start at
        self._kl: list[np.ndarray] = []
        self._agree: list[np.ndarray] = []
        self._nll_q: list[np.ndarray] = []
        self._nll_p: list[np.ndarray] = []
        # degenerate_logits(npu[first:]) as counts: NaN/inf values, any nonzero value,
        # constant rows and the first of them, values seen
        self._nonfinite = 0
        self._nonzero = False
        self._const_rows = 0
        self._first_const: int | None = None
        self._values = 0
        self._rows = 0

    def add(self, ref: np.ndarray, npu: np.ndarray, start: int) -> None:
        """The logits ``(rows, vocab)`` of positions ``start .. start + rows - 1`` from
        both sides. Blocks come in order and cover every position from ``first`` to the
        text's last (rows before ``first`` are skipped)."""
        _check_pair(ref, npu)
        n = self.tokens.size
        end = start + npu.shape[0]
        if start > self._next or end > n:
            raise ValueError(f"QualityStream: block {start}..{end - 1} does not continue "
                             f"at position {self._next} within the text's {n} positions")
        lo = max(self._next, start)
        if lo >= end:
            return
        q_all = npu[lo - start:]
        self._degenerate_counts(q_all)
        hi = min(end, n - 1)  # the last position predicts nothing
        # STREAM_ROWS rows at a time: every figure is a row's own (its reductions run
        # along its vocabulary), so the same values without a whole block's float64
        # temporaries (four of rows x vocab: 0.8 GB for 512 rows of 49,152)
        for b0 in range(lo, hi, STREAM_ROWS):
            b1 = min(hi, b0 + STREAM_ROWS)
            r, q = ref[b0 - start : b1 - start], npu[b0 - start : b1 - start]
            lp, lq = log_softmax(r), log_softmax(q)
            self._agree.append(r.argmax(axis=-1) == q.argmax(axis=-1))
            tail = self.tokens[b0 : b1 + 1]
            self._nll_q.append(_nll(lq, tail))
            self._nll_p.append(_nll(lp, tail))
            self._kl.append(_kl_consuming(lp, lq))
        self._next = end

    def _degenerate_counts(self, a: np.ndarray) -> None:
        finite = np.isfinite(a)
        self._nonfinite += int((~finite).sum())
        self._nonzero = self._nonzero or bool(a.any())
        flat = np.flatnonzero(a.max(axis=-1) == a.min(axis=-1))
        if flat.size and self._first_const is None:
            self._first_const = self._rows + int(flat[0])
        self._const_rows += int(flat.size)
        self._values += a.size
        self._rows += a.shape[0]

    def degenerate(self) -> str | None:
        """:func:`degenerate_logits` of the NPU's rows from ``first`` on, from the counts."""
        if self._values == 0:
            return "no logits"
        if self._nonfinite:
            return f"{self._nonfinite} of {self._values} logits are NaN or inf"
        if not self._nonzero:
            return f"all {self._values} logits are zero"
        if self._const_rows:
            return (f"{self._const_rows} of {self._rows} logits rows are constant (first: "
                    f"row {self._first_const})")
        return None

    def result(self, *, allow_degenerate: bool = False, **config: Any) -> Quality:
        """The :class:`Quality` once every position has arrived (``config``: the other
        fields). Degenerate NPU logits raise :class:`DegenerateOutput`, or with
        ``allow_degenerate`` are measured anyway and named in ``degenerate``."""
        n = self.tokens.size
        if self._next != n:
            raise ValueError(f"QualityStream: positions {self._next}..{n - 1} never arrived")
        why = self.degenerate()
        if why is not None and not allow_degenerate:
            raise DegenerateOutput(f"NPU logits: {why} (the integer pipeline's output cannot "
                                   f"be right; allow_degenerate measures it anyway)")
        kl = np.concatenate(self._kl)
        agree = np.concatenate(self._agree)
        return Quality(tokens=n, perplexity=float(np.exp(np.concatenate(self._nll_q).mean())),
                       reference_perplexity=float(np.exp(np.concatenate(self._nll_p).mean())),
                       kl_mean=float(kl.mean()), kl_max=float(kl.max()),
                       top1_agreement=float(agree.mean()), degenerate=why,
                       buckets=position_buckets(kl, agree, first=self.first),
                       first_position=self.first, **config)


#: Rows :func:`compare` works on at a time (``rows x vocab`` float64 temporaries).
COMPARE_ROWS = 256


def compare(ref: np.ndarray, npu: np.ndarray, tokens: Sequence[int], *,
            allow_degenerate: bool = False, first: int = 0, **config: Any) -> Quality:
    """The :class:`Quality` of ``npu`` logits against ``ref`` logits, both ``(n, vocab)``
    for the text ``tokens``, over the predictions at positions ``first .. n - 2`` (0: all
    of them); ``config`` gives the other fields. Degenerate NPU logits raise
    :class:`DegenerateOutput`, or with ``allow_degenerate`` are measured anyway and named
    in ``degenerate``. Works :data:`COMPARE_ROWS` positions at a time
    (:class:`QualityStream`: the same figures as over the whole arrays at once)."""
    _check_pair(ref, npu)
    n = len(tokens)
    if not 0 <= first <= n - 2:
        raise ValueError(f"first: {first} must lie in 0..{n - 2} (the text's predictions)")
    if ref.shape[0] != n:
        raise ValueError(f"logits: {ref.shape[0]} rows for a text of {n} tokens")
    stream = QualityStream(tokens, first=first)
    for lo in range(first, n, COMPARE_ROWS):
        hi = min(lo + COMPARE_ROWS, n)
        stream.add(ref[lo:hi], npu[lo:hi], lo)
    return stream.result(allow_degenerate=allow_degenerate, **config)


__all__ = ["BUCKET_STARTS", "COLLAPSE_SHARE", "COMPARE_ROWS", "DegenerateOutput",
           "PositionBucket", "Quality", "QualityStream",
           "collapsed", "compare", "degenerate_logits", "kl_per_position", "log_softmax",
           "next_token_nll", "perplexity", "position_buckets", "repeat_share",
           "top1_agreement"]
