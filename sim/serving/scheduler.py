"""Continuous batching with vLLM's semantics (FACTS.md; vLLM v1's scheduler, with v0's swap
mode): pure logic, no time. The engine (:mod:`.engine`) asks for a step, runs it for as
long as the device takes, then completes it.

One step (:meth:`Scheduler.schedule`), within a budget of ``max_num_batched_tokens``:

1. Running requests, in the order they were admitted: each gets the tokens it has not
   computed yet (one for a decoding request; a chunk of its prompt, up to the budget, for
   one that is prefilling). When the blocks for them cannot be had, the most recently
   admitted running request is preempted (it may be the request itself, which then waits)
   until they can: in ``recompute`` mode its blocks are freed and it goes to the front of
   the waiting queue, to prefill everything it knows (prompt and the tokens it has
   generated) again when it is readmitted; in ``swap`` mode its blocks are copied to host
   memory (over PCIe, costed by the engine) and it goes to the front of the swapped queue.
2. Only if nobody was preempted in this step: swapped requests come back (their blocks
   copied back to the device) while blocks and ``max_num_seqs`` allow, then, once no
   request is swapped out, waiting requests are admitted in order (a prompt chunk each,
   up to the budget) while their blocks can be had.

A request samples a token when a step computes its last known token (the last chunk of a
prompt, or a decode step); it finishes when it has sampled ``output_tokens`` tokens, and
frees its blocks.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from itertools import accumulate, compress
from operator import sub
from typing import Literal

from models.compiler.driver import StepSeq
from sim.serving.blocks import KvGeometry
from sim.serving.decodeset import DecodeSet

Preemption = Literal["recompute", "swap"]


@dataclass(eq=False, slots=True)
class Request:
    """One request and what happened to it (times in picoseconds)."""

    rid: int
    arrival_ps: int
    prompt_tokens: int
    output_tokens: int
    chip: int = -1
    state: str = "new"  # waiting | running | swapped | finished
    generated: int = 0  # output tokens sampled
    computed: int = 0  # tokens whose KV is in the device cache
    high_water: int = 0  # most tokens ever computed (beyond it, work is new)
    blocks: int = 0  # device blocks held
    host_blocks: int = 0  # blocks swapped out to host memory
    admitted: int = -1  # admission order (running requests are preempted newest first)
    first_token_ps: int | None = None
    finish_ps: int | None = None
    preemptions: int = 0
    prompt_computed: int = 0  # prompt tokens computed for the first time
    decode_computed: int = 0  # generated tokens computed for the first time
    recomputed_tokens: int = 0  # tokens computed again after a preemption
    swapped_out_bytes: int = 0
    swapped_in_bytes: int = 0
    token_ps: list[int] = field(default_factory=list)  # when each output token was sampled

    @property
    def known(self) -> int:
        """Tokens the request knows: its prompt and the tokens it has sampled."""
        return self.prompt_tokens + self.generated

    @property
    def done(self) -> bool:
        return self.generated >= self.output_tokens


@dataclass
class StepPlan:
    """What one step runs: ``items`` (request, tokens) in scheduling order: the ``head``
    (the scheduler's decode set, one token each, at cache positions ``head_pos``), then
    the ``tail`` (request, tokens)."""

    index: int
    tail: list[tuple[Request, int]]
    head: list[Request] = field(default_factory=list)
    head_pos: list[int] = field(default_factory=list)
    head_items: list[tuple[int, int]] = field(default_factory=list)  # (rid, 1) each
    preempted: list[Request] = field(default_factory=list)
    swapped_in: list[Request] = field(default_factory=list)
    swap_out_bytes: int = 0
    swap_in_bytes: int = 0
    sampled: int = 0  # sequences that sampled a token (set when the step completes)
    # what the step's time depends on, gathered while scheduling (:meth:`batch`)
    dec_pos: list[int] = field(default_factory=list)
    pieces: list[tuple[int, int]] = field(default_factory=list)
    logits: int = 0
    decoding: int = 0  # leading tail items known to decode one token each and sample

    @property
    def items(self) -> list[tuple[Request, int]]:
        return [(r, 1) for r in self.head] + self.tail

    def rid_items(self) -> tuple[tuple[int, int], ...]:
        """``(rid, tokens)`` of every item, in order."""
        return (*self.head_items, *[(r.rid, n) for r, n in self.tail])

    def seqs(self, slots: int = 1) -> list[StepSeq]:
        """The step as the device runs it: decoding sequences first, then prompt chunks
        (fewer token tiles mix the two), each with its cache position and whether it
        samples."""
        head = [StepSeq(rid % slots, 1, c, True, rid + 1)
                for (rid, _), c in zip(self.head_items, self.head_pos, strict=True)]
        dec = [(r, n) for r, n in self.tail if n == 1]
        pre = [(r, n) for r, n in self.tail if n != 1]
        return head + [StepSeq(r.rid % slots, n, r.computed, r.computed + n == r.known,
                               r.rid + 1) for r, n in dec + pre]

    def batch(self) -> tuple[list[int], list[tuple[int, int]], int]:
        """The step as :meth:`seqs` gives it, reduced to what its time depends on: the
        cache positions of the one-token sequences (first, in order), the longer ones as
        (tokens, cache position) after them, and how many sequences sample. The scheduler
        gathers the same as ``dec_pos``, ``pieces`` and ``logits`` while it plans."""
        dec: list[int] = list(self.head_pos)
        pre: list[tuple[int, int]] = []
        sampled = len(self.head)
        for r, n in self.tail:
            c = r.computed
            if n == 1:
                dec.append(c)
            else:
                pre.append((n, c))
            if c + n == r.prompt_tokens + r.generated:
                sampled += 1
        return dec, pre, sampled

    @property
    def tokens(self) -> int:
        return sum(n for _, n in self.items)

    def log(self) -> tuple:
        """``(step, ((rid, tokens), ...), preempted rids, swapped-in rids)`` for tests."""
        return (self.index, tuple((r.rid, n) for r, n in self.items),
                tuple(r.rid for r in self.preempted), tuple(r.rid for r in self.swapped_in))


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    chunked_prefill: bool = True
    preemption: Preemption = "recompute"

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        if self.preemption not in ("recompute", "swap"):
            raise ValueError(f"preemption {self.preemption!r}: valid modes are recompute, swap")


class Scheduler:
    """The scheduler of one chip (one model replica)."""

    def __init__(self, cfg: SchedulerConfig, geometry: KvGeometry):
        self.cfg = cfg
        self.geo = geometry
        self.free = geometry.num_blocks
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.swapped: deque[Request] = deque()
        self.steps = 0
        self._admissions = 0
        self.num_preemptions = 0
        self.unfinished = 0
        self._blk = geometry.block_table()  # blocks held by n cached tokens, n = 0, 1, ...
        #: the leading running requests that decode one token a step, as arrays
        self._dec = DecodeSet(self._blk)

    # --- queues ---------------------------------------------------------------------------
    def add(self, req: Request) -> None:
        """A new request joins the waiting queue (at the back)."""
        if self.geo.blocks(req.prompt_tokens + req.output_tokens - 1) > self.geo.num_blocks:
            raise ValueError(f"request {req.rid}: {req.prompt_tokens} + {req.output_tokens} "
                             f"tokens need more KV blocks than the chip has "
                             f"({self.geo.num_blocks})")
        req.state = "waiting"
        self.waiting.append(req)
        self.unfinished += 1

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    @property
    def used_blocks(self) -> int:
        return self.geo.num_blocks - self.free

    # --- one step ----------------------------------------------------------------------------
    def schedule(self) -> StepPlan | None:
        """The next step, or None when there is nothing to run."""
        cfg, geo = self.cfg, self.geo
        budget = cfg.max_num_batched_tokens
        plan = StepPlan(self.steps, [])
        blk = self._blk
        running = self.running
        items = plan.tail
        dec_pos = plan.dec_pos
        nd = self._decode_set(plan, budget)
        budget -= nd
        left = self._all_running(plan, budget, nd)
        i = len(running) if left is not None else nd
        budget = left if left is not None else budget
        while i < len(running) and budget > 0:
            req = running[i]
            c = req.computed
            full = req.prompt_tokens + req.generated - c  # the tokens it knows, not computed
            n = full if full <= budget else budget
            need = blk[c + n] - req.blocks
            while need > self.free:
                victim = running.pop()
                self._preempt(victim, plan)
                if victim is req:
                    break
                need = blk[c + n] - req.blocks
            if req.state != "running":
                break
            self.free -= need
            req.blocks += need
            items.append((req, n))
            if n == 1:
                dec_pos.append(c)
            else:
                plan.pieces.append((n, c))
            if n == full:  # it computes its last known token: it samples
                plan.logits += 1
            budget -= n
            i += 1
        if not plan.preempted:
            while self.swapped and budget > 0 and len(self.running) < cfg.max_num_seqs:
                req = self.swapped[0]
                n = min(req.known - req.computed, budget)
                need = geo.blocks(req.computed + n)
                if need > self.free:
                    break
                self.swapped.popleft()
                plan.swap_in_bytes += req.host_blocks * geo.block_bytes
                req.swapped_in_bytes += req.host_blocks * geo.block_bytes
                req.host_blocks = 0
                plan.swapped_in.append(req)
                self._admit(req, need, n, plan)
                budget -= n
            while (not self.swapped and self.waiting and budget > 0
                   and len(self.running) < cfg.max_num_seqs):
                req = self.waiting[0]
                left = req.known - req.computed
                if not cfg.chunked_prefill and left > budget:
                    break
                n = min(left, budget)
                need = geo.blocks(req.computed + n) - req.blocks
                if need > self.free:
                    break
                self.waiting.popleft()
                self._admit(req, need, n, plan)
                budget -= n
        if not plan.tail and not plan.head:
            return None
        self.steps += 1
        return plan

    def _decode_set(self, plan: StepPlan, budget: int) -> int:
        """The decode set's part of step 1, at once, when the budget holds all its members
        and the free blocks all the blocks they take (as the loop in :meth:`schedule`
        would do: no member is cut or preempted); else its members' fields are written
        back and the loop schedules them. Returns the tokens scheduled."""
        d = self._dec
        nd = len(d)
        if not nd:
            return 0
        if nd <= budget:
            need = d.need()
            total = int(need.sum())
            if total <= self.free:
                self.free -= total
                d.take(need)
                plan.head = self.running[:nd]
                plan.head_pos = d.positions()
                plan.head_items = d.items[:]
                plan.dec_pos.extend(plan.head_pos)
                plan.logits += nd
                return nd
        d.flush()
        return 0

    def sync(self) -> None:
        """Every request's fields up to date (the decode set written back)."""
        self._dec.flush()

    def _all_running(self, plan: StepPlan, budget: int, skip: int = 0) -> int | None:
        """Step 1 at once when it is simple: every running request gets all the tokens it
        knows within ``budget`` and no request's blocks fail (every prefix of the blocks
        they take fits the free ones), which is what the loop in :meth:`schedule` would
        do; returns the budget left, or None (nothing changed) to take that loop. The
        first ``skip`` running requests (the decode set) are scheduled already."""
        running = self.running[skip:] if skip else self.running
        if not running:
            return budget
        known = [r.prompt_tokens + r.generated for r in running]
        cs = [r.computed for r in running]
        ns = list(map(sub, known, cs))
        total = sum(ns)
        if total > budget:
            return None
        blk = self._blk
        needs = [blk[k] - r.blocks for k, r in zip(known, running, strict=True)]
        taken = list(accumulate(needs))
        if max(taken) > self.free:
            return None
        self.free -= taken[-1]
        for r, nd in compress(zip(running, needs, strict=True), needs):
            r.blocks += nd
        plan.tail.extend(zip(running, ns, strict=True))
        if total == len(ns) and min(ns) == 1:  # every one decodes a token (the usual case)
            plan.dec_pos.extend(cs)
            plan.decoding = len(ns)
        else:
            plan.dec_pos.extend(compress(cs, [n == 1 for n in ns]))
            plan.pieces.extend((n, c) for n, c in zip(ns, cs, strict=True) if n != 1)
            k = len(ns)  # the newest admitted may still be prefilling: the rest decode
            while k and ns[k - 1] != 1:
                k -= 1
            if k and max(ns[:k]) == 1 == min(ns[:k]):
                plan.decoding = k
        plan.logits += len(running)
        return budget - total

    def _take(self, req: Request, blocks: int) -> None:
        self.free -= blocks
        req.blocks += blocks

    def _admit(self, req: Request, blocks: int, n: int, plan: StepPlan) -> None:
        req.state = "running"
        req.admitted = self._admissions
        self._admissions += 1
        self._take(req, blocks)
        self.running.append(req)
        plan.tail.append((req, n))
        c = req.computed
        if n == 1:
            plan.dec_pos.append(c)
        else:
            plan.pieces.append((n, c))
        if c + n == req.prompt_tokens + req.generated:
            plan.logits += 1

    def _preempt(self, req: Request, plan: StepPlan) -> None:
        self.free += req.blocks
        req.preemptions += 1
        self.num_preemptions += 1
        plan.preempted.append(req)
        if self.cfg.preemption == "swap":
            nbytes = req.blocks * self.geo.block_bytes
            plan.swap_out_bytes += nbytes
            req.swapped_out_bytes += nbytes
            req.host_blocks = req.blocks
            req.blocks = 0
            req.state = "swapped"
            self.swapped.appendleft(req)
        else:
            req.blocks = 0
            req.computed = 0
            req.state = "waiting"
            self.waiting.appendleft(req)

    # --- after the step ------------------------------------------------------------------------
    def complete(self, plan: StepPlan, now_ps: int) -> list[Request]:
        """Account the step's tokens (it ended at ``now_ps``); returns the requests that
        finished."""
        finished: list[Request] = []
        if plan.head:
            for req in self._dec.advance(now_ps):
                self._finish(req, now_ps, finished)
        items = plan.tail
        k = plan.decoding
        for req, _ in items[:k] if k else ():
            # one new token each, its last known: it samples (and sampled before)
            a = req.computed
            if a < req.high_water or a < req.prompt_tokens:
                self._account(req, 1, now_ps, finished)
                continue
            req.decode_computed += 1
            req.high_water = req.computed = a + 1
            g = req.generated = req.generated + 1
            req.token_ps.append(now_ps)
            if g >= req.output_tokens:
                self._finish(req, now_ps, finished)
        for req, n in items[k:] if k else items:
            self._account(req, n, now_ps, finished)
        plan.sampled = plan.logits  # those that computed their last known token
        self._promote()
        return finished

    def _promote(self) -> None:
        """The running requests right after the decode set that now decode one new token
        a step join it."""
        running = self.running
        i = j = len(self._dec)
        while j < len(running):
            r = running[j]
            c = r.computed
            if r.prompt_tokens + r.generated - c != 1 or c < r.high_water or c < r.prompt_tokens:
                break
            j += 1
        if j > i:
            self._dec.add(running[i:j])

    def _account(self, req: Request, n: int, now_ps: int, finished: list[Request]) -> None:
        """One item of a completed step: ``n`` tokens of ``req`` computed."""
        a = req.computed
        b = a + n
        hw = req.high_water
        p = req.prompt_tokens
        if a >= hw:  # all new work (the usual case)
            if a >= p:
                req.decode_computed += n
            elif b <= p:
                req.prompt_computed += n
            else:
                req.prompt_computed += p - a
                req.decode_computed += b - p
            req.high_water = b
        else:  # recomputes tokens it had before a preemption
            req.recomputed_tokens += min(b, hw) - a
            if b > hw:
                req.prompt_computed += max(0, min(b, p) - hw)
                req.decode_computed += max(0, b - max(hw, p))
                req.high_water = b
        req.computed = b
        if b == p + req.generated:
            req.generated += 1
            req.token_ps.append(now_ps)
            if req.first_token_ps is None:
                req.first_token_ps = now_ps
            if req.generated >= req.output_tokens:
                self._finish(req, now_ps, finished)

    def abort(self, req: Request, now_ps: int) -> None:
        """``req`` leaves before its ``output_tokens`` (an online server's request that hit a
        stop sequence or the end-of-sequence token, or whose client went away), at
        ``now_ps``, between steps: it finishes with the tokens it has sampled
        (``output_tokens`` becomes ``generated``) and frees its device and host blocks."""
        if req.state == "finished":
            return
        self.sync()  # the decode set's members get their fields back first
        if req.state == "running":
            self.running.remove(req)
        elif req.state == "waiting":
            self.waiting.remove(req)
        elif req.state == "swapped":
            self.swapped.remove(req)
        else:
            raise ValueError(f"request {req.rid} is not in this scheduler (state "
                             f"{req.state!r})")
        req.host_blocks = 0
        req.output_tokens = req.generated
        self._finish_out(req, now_ps)

    def _finish(self, req: Request, now_ps: int, finished: list[Request]) -> None:
        self.running.remove(req)
        self._finish_out(req, now_ps)
        finished.append(req)

    def _finish_out(self, req: Request, now_ps: int) -> None:
        """``req`` (out of every queue) is finished at ``now_ps``; its blocks are free."""
        req.state = "finished"
        req.finish_ps = now_ps
        self.free += req.blocks
        req.blocks = 0
        self.unfinished -= 1
