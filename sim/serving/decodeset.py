"""The running requests that decode one token per step, as arrays (a scheduler's hot set).

While a request is in the set, the set's arrays, not the :class:`.scheduler.Request`, hold
its cache position, sampled tokens and blocks; its sampling times are the set's step end
times since it joined. Every member computes its one known token and samples in every step
it is in the set, so a step advances all of them at once. A request's fields are written
back (:meth:`DecodeSet.write_back`) when it leaves the set: it finishes, or the scheduler
needs the per-request path (a member's blocks or the token budget would not fit).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .scheduler import Request


class DecodeSet:
    """Members in admission order (a prefix of the scheduler's running list)."""

    def __init__(self, block_table: Sequence[int]):
        self.blk = np.asarray(block_table, dtype=np.int64)  # blocks of n cached tokens
        self.reqs: list[Request] = []
        self.comp = np.empty(0, np.int64)  # cached tokens
        self.gen = np.empty(0, np.int64)  # tokens sampled
        self.out = np.empty(0, np.int64)  # tokens to sample
        self.blocks = np.empty(0, np.int64)  # device blocks held
        self.start = np.empty(0, np.int64)  # index in ends of the first step in the set
        self.rid = np.empty(0, np.int64)
        self.ends: list[int] = []  # end time (ps) of every step the set advanced

    def __len__(self) -> int:
        return len(self.reqs)

    def need(self) -> np.ndarray:
        """Blocks each member takes to cache one more token."""
        return self.blk[self.comp + 1] - self.blocks

    def add(self, reqs: list[Request]) -> None:
        """Requests (in running order, after the members) that decode one token a step."""
        if not reqs:
            return
        f = np.array([(r.computed, r.generated, r.output_tokens, r.blocks, r.rid)
                      for r in reqs], dtype=np.int64)
        self.reqs.extend(reqs)
        self.comp = np.concatenate([self.comp, f[:, 0]])
        self.gen = np.concatenate([self.gen, f[:, 1]])
        self.out = np.concatenate([self.out, f[:, 2]])
        self.blocks = np.concatenate([self.blocks, f[:, 3]])
        self.rid = np.concatenate([self.rid, f[:, 4]])
        self.start = np.concatenate([self.start, np.full(len(reqs), len(self.ends), np.int64)])

    def write_back(self, idx: Sequence[int]) -> list[Request]:
        """Members ``idx`` get their fields back (they stay in the set's arrays)."""
        out = []
        ends = self.ends
        k = len(ends)
        for j in idx:
            r = self.reqs[j]
            s = int(self.start[j])
            r.computed = r.high_water = int(self.comp[j])
            r.generated = int(self.gen[j])
            r.blocks = int(self.blocks[j])
            r.decode_computed += k - s
            r.token_ps.extend(ends[s:])
            out.append(r)
        return out

    def flush(self) -> None:
        """Every member leaves the set, its fields written back."""
        if self.reqs:
            self.write_back(range(len(self.reqs)))
        self.__init__(self.blk)

    def advance(self, now_ps: int) -> list[Request]:
        """A step (ended at ``now_ps``) computed one token of each member and each sampled;
        returns the members that finished (written back and out of the set)."""
        self.comp += 1
        self.gen += 1
        self.ends.append(now_ps)
        done = self.gen >= self.out
        if not done.any():
            return []
        gone = self.write_back(np.flatnonzero(done).tolist())
        keep = ~done
        self.reqs = [r for r, k in zip(self.reqs, keep.tolist(), strict=True) if k]
        for name in ("comp", "gen", "out", "blocks", "start", "rid"):
            setattr(self, name, getattr(self, name)[keep])
        return gone
