"""Drafters: what proposes the tokens a verification call checks.

Every drafter implements :class:`Drafter`: ``propose(context, k, cache_size)`` returns up
to ``k`` tokens (a :class:`Draft`, with the drafter's distributions when it samples) and
spends the simulated time drafting takes; ``simulate(context_len, drafted, cache_size)``
spends that time alone (timing-only runs, where tokens mean nothing and a profile says
how many are drafted and accepted).

- :class:`PromptLookup`: the latest earlier occurrence of the last ``n`` tokens of the
  prompt and the output so far (``n`` = ``ngram``, then shorter), and the tokens that
  followed it (Saxena, "Prompt Lookup Decoding", 2023; the n-gram proposers of Hugging
  Face transformers and vLLM work the same way). It runs on the host: its time is the
  host cost model of the hardware preset (``host.edit_overhead_ns`` for the call, and a
  pass of ``host.edit_bytes_per_s`` over the token ids compared, 4 bytes each, for every
  n-gram size tried), an assumption: the preset's host-side edit figures stand for any
  numpy pass over host arrays.
- :class:`ModelDrafter`: a draft model on the card (:class:`sim.runtime.draft.DraftModel`),
  one call per drafted token: self-speculation's layer-skipping draft (its caches are the
  verifier's) or any second model with caches of its own.
- :class:`CallableDrafter`: any host function ``fn(context, k) -> tokens``, with the host
  time per call its author states.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from sim.runtime import Accelerator
from sim.runtime.draft import DraftModel
from traces.speculation_results import SelfDraftDram

from .verify import softmax

#: Bytes of one token id in the host's arrays (int32).
TOKEN_ID_BYTES = 4


@dataclass(frozen=True)
class Draft:
    """Drafted tokens and, when the drafter sampled them, its distributions (one row per
    token); None: each token was chosen deterministically (a point mass)."""

    tokens: list[int]
    q: np.ndarray | None = None


@dataclass(frozen=True)
class DrafterInfo:
    """What a run reports about its drafter: the spec it was made from, and for a
    self-draft its layers, its launch's simulated seconds and the DRAM map's view of it
    (None for drafters that are not a draft on the card)."""

    spec: str
    layers: tuple[int, ...] | None = None
    launch_s: float | None = None
    dram: SelfDraftDram | None = None


class Drafter(Protocol):
    """What the speculative decoding loop asks of a drafter."""

    name: str

    def propose(self, context: Sequence[int], k: int, *, cache_size: int) -> Draft:
        """Up to ``k`` tokens to follow ``context`` (the prompt and the output so far; the
        verifier's cache holds its first ``cache_size`` tokens)."""
        ...

    def simulate(self, context_len: int, drafted: int, *, cache_size: int) -> None:
        """Spend the simulated time of drafting ``drafted`` tokens after a context of
        ``context_len`` tokens (timing-only runs)."""
        ...


def host_step(acc: Accelerator | None, ns: float, op: str) -> None:
    """Host-side work of ``ns`` nanoseconds, recorded as a call ``op`` that is no runtime
    call (``stats['host_only']``: the breakdown charges it no runtime overhead)."""
    if acc is None:
        return
    start, before = acc.begin()
    acc.host_work(ns, op)
    rec = acc.end(op, start, before)
    rec.stats["host_only"] = True
    rec.stats["host_work_ps"] = rec.end_ps - rec.start_ps


def lookup(context: Sequence[int], k: int, ngram: int) -> list[int]:
    """The tokens after the latest earlier occurrence of the longest suffix of ``context``
    of ``ngram`` .. 1 tokens that occurred before (at most ``k``; empty: no match)."""
    arr = np.asarray(context, np.int64)
    n_ctx = arr.size
    if k < 1 or n_ctx < 2:
        return []
    for n in range(min(ngram, n_ctx - 1), 0, -1):
        tail = arr[n_ctx - n:]
        # windows starting at 0 .. n_ctx - 1 - n: each has a token after it
        hits = np.flatnonzero((sliding_window_view(arr[:n_ctx - 1], n) == tail).all(axis=1))
        if hits.size:
            i = int(hits[-1]) + n
            return arr[i:i + k].tolist()
    return []


def lookup_host_ns(hw, context_len: int, ngram: int) -> float:
    """Host time (ns) of one prompt lookup over a context of ``context_len`` tokens on
    ``hw``'s host: the call, then one pass over the ids per n-gram size tried, ``n`` ids
    compared per window (every size counted: the worst case, a lookup that finds nothing)."""
    compared = context_len * sum(range(1, ngram + 1)) * TOKEN_ID_BYTES
    return hw.host.edit_overhead_ns + compared / hw.host.edit_bytes_per_s * 1e9


class PromptLookup:
    """Prompt lookup decoding (module docstring)."""

    def __init__(self, acc: Accelerator | None, *, ngram: int = 3):
        self.acc = acc
        self.ngram = ngram
        self.name = f"prompt-lookup (n-grams of {ngram}..1)"

    def host_ns(self, context_len: int) -> float:
        """Host time of one lookup (:func:`lookup_host_ns`)."""
        if self.acc is None:
            return 0.0
        return lookup_host_ns(self.acc.hw, context_len, self.ngram)

    def propose(self, context: Sequence[int], k: int, *, cache_size: int) -> Draft:
        host_step(self.acc, self.host_ns(len(context)), "draft_lookup")
        return Draft(lookup(context, k, self.ngram))

    def simulate(self, context_len: int, drafted: int, *, cache_size: int) -> None:
        host_step(self.acc, self.host_ns(context_len), "draft_lookup")


class ModelDrafter:
    """A draft model on the card (module docstring). ``embed(tokens)``: the host's float32
    embeddings ``(n, hidden)`` of the draft (the verifier's table for a self-draft).
    With ``shares_cache`` the draft's caches are the verifier's, whose first
    ``cache_size`` positions are exact: each proposal runs from the last token on. A
    draft with caches of its own runs from the first token it has not yet seen as it is
    in ``context`` (its rejected drafts are run again). ``temperature`` > 0 samples the
    drafts (seeded by ``seed``) and returns their distributions."""

    def __init__(self, draft: DraftModel, embed: Callable[[Sequence[int]], np.ndarray], *,
                 shares_cache: bool, temperature: float = 0.0, seed: int = 0,
                 name: str = "draft model"):
        self.draft = draft
        self.embed = embed
        self.shares_cache = shares_cache
        self.temperature = temperature
        self.rng = np.random.default_rng(np.random.SeedSequence([seed, 0xD4AF7]))
        self.name = name
        self.seen: list[int] = []  # the tokens whose K/V the draft's own caches hold

    def _feed(self, context: Sequence[int], cache_size: int) -> tuple[int, list[int]]:
        """Where the draft's first call starts in its cache, and the tokens it feeds."""
        if self.shares_cache:  # the verifier's cache holds all but the last token
            return cache_size, [int(context[-1])]
        n = 0
        for a, b in zip(self.seen, context, strict=False):
            if a != b:
                break
            n += 1
        n = min(n, len(context) - 1)
        return n, [int(t) for t in context[n:]]

    def propose(self, context: Sequence[int], k: int, *, cache_size: int) -> Draft:
        if k < 1:
            return Draft([])
        start, feed = self._feed(context, cache_size)
        max_seq = self.draft.compiled.max_seq
        logits = None
        for a in range(0, len(feed), max_seq):
            logits = self.draft.infer(self.embed(feed[a:a + max_seq]), start + a)
        tokens: list[int] = []
        qs: list[np.ndarray] = []
        pos = start + len(feed)
        for i in range(k):
            assert logits is not None
            if self.temperature > 0:
                q = softmax(logits, self.temperature)
                qs.append(q)
                t = int(self.rng.choice(q.size, p=q))
            else:
                t = int(np.argmax(logits))
            tokens.append(t)
            if i == k - 1:
                break
            logits = self.draft.infer(self.embed([t]), pos)
            pos += 1
        self.seen = list(context) + tokens[:-1]
        return Draft(tokens, np.stack(qs) if qs else None)

    def simulate(self, context_len: int, drafted: int, *, cache_size: int) -> None:
        hidden = self.draft.compiled.model.hidden_size
        zero = np.zeros((1, hidden), np.float32)
        for i in range(drafted):
            self.draft.infer(zero, cache_size + i)


class CallableDrafter:
    """A host function ``fn(context, k) -> tokens`` as a drafter; ``host_ns`` is the host
    time one call takes (its author's figure: kvsim cannot know it)."""

    def __init__(self, fn: Callable[[Sequence[int], int], Sequence[int]], *,
                 acc: Accelerator | None = None, host_ns: float = 0.0,
                 name: str = "callable"):
        self.fn = fn
        self.acc = acc
        self.host_ns = host_ns
        self.name = name

    def propose(self, context: Sequence[int], k: int, *, cache_size: int) -> Draft:
        host_step(self.acc, self.host_ns, "draft_callable")
        tokens = [int(t) for t in self.fn(list(context), k)][:k]
        return Draft(tokens)

    def simulate(self, context_len: int, drafted: int, *, cache_size: int) -> None:
        host_step(self.acc, self.host_ns, "draft_callable")


__all__ = ["DrafterInfo", "CallableDrafter", "Draft", "Drafter", "ModelDrafter", "PromptLookup",
           "TOKEN_ID_BYTES", "host_step", "lookup", "lookup_host_ns"]
