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
    from sim.serving.scheduler import Request


#: Rows of :attr:`DecodeSet.f`: cached tokens, tokens still to sample, device blocks
#: held, index in ``ends`` of the first step in the set.
COMP, LEFT, BLOCKS, START = range(4)
#: What one step adds to each row.
_STEP = np.array([[1], [-1], [0], [0]], dtype=np.int64)


class DecodeSet:
    """Members in admission order (a prefix of the scheduler's running list)."""

    def __init__(self, block_table: Sequence[int]):
        self.blk = np.asarray(block_table, dtype=np.int64)  # blocks of n cached tokens
        self.reqs: list[Request] = []
        self.f = np.empty((4, 0), np.int64)  # one column per member (rows: COMP, ...)
        self.ends: list[int] = []  # end time (ps) of every step the set advanced
        self.items: list[tuple[int, int]] = []  # (rid, 1) of each member: a step's items
        self.steps_to_finish = 0  # steps until the first member samples its last token

    def __len__(self) -> int:
        return len(self.reqs)

    def need(self) -> np.ndarray:
        """Blocks each member takes to cache one more token."""
        f = self.f
        return self.blk[f[COMP] + 1] - f[BLOCKS]

    def take(self, need: np.ndarray) -> None:
        """Each member takes ``need`` more blocks."""
        self.f[BLOCKS] += need

    def positions(self) -> list[int]:
        """Cache position of each member's next token."""
        return self.f[COMP].tolist()

    def add(self, reqs: list[Request]) -> None:
        """Requests (in running order, after the members) that decode one token a step."""
        if not reqs:
            return
        k = len(self.ends)
        new = np.array([(r.computed, r.output_tokens - r.generated, r.blocks, k)
                        for r in reqs], dtype=np.int64).T
        first = int(new[LEFT].min())
        self.steps_to_finish = first if not self.reqs else min(self.steps_to_finish, first)
        self.reqs.extend(reqs)
        self.items.extend([(r.rid, 1) for r in reqs])
        self.f = np.concatenate([self.f, new], axis=1)

    def write_back(self, idx: Sequence[int]) -> list[Request]:
        """Members ``idx`` get their fields back (they stay in the set's arrays)."""
        out = []
        ends = self.ends
        k = len(ends)
        f = self.f
        for j in idx:
            r = self.reqs[j]
            c, left, blocks, s = f[:, j].tolist()
            r.computed = r.high_water = c
            r.generated = r.output_tokens - left
            r.blocks = blocks
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
        f = self.f
        f += _STEP
        self.ends.append(now_ps)
        self.steps_to_finish -= 1
        if self.steps_to_finish > 0:
            return []
        done = f[LEFT] <= 0
        idx = np.flatnonzero(done).tolist()
        gone = self.write_back(idx)
        for j in reversed(idx):
            del self.reqs[j]
            del self.items[j]
        self.f = f = f[:, ~done]
        self.steps_to_finish = int(f[LEFT].min()) if self.reqs else 0
        return gone
