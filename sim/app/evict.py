"""Evictions judged by what they forget: four policies cut a long cache to a budget of
tokens, as a cache edit on the host (dump, edit, load) or on the device (its compaction
program), with the edit's simulated time and PCIe bytes beside the pass-key retrieval
and the KL divergence it leaves at that budget.

Policies (each keeps the same positions in every cache: the runtime's edits move whole
positions; the papers' per-head choices have no such op):

- ``recent``: the last ``budget`` tokens.
- ``streaming`` (StreamingLLM, Xiao et al. 2023): the first :data:`SINKS` tokens (the
  attention sinks) and the last ``budget - SINKS``.
- ``h2o`` (H2O, Zhang et al. 2023): half the budget to the most recent tokens, half to
  the heavy hitters, the older tokens with the largest attention accumulated over every
  query so far (the device's score readout, :mod:`sim.runtime.scores`).
- ``snapkv`` (SnapKV, Li et al. 2024): the last :data:`SNAP_WINDOW` tokens (the
  observation window) and the older tokens the window's queries attend to most, their
  weights max-pooled over :data:`SNAP_POOL` neighbours (the readout with ``from_pos`` at
  the window).

Positions after an edit (``positions``): kept keys keep the rotation of their original
positions in either case.

- ``"text"`` (default): the next tokens keep the text's positions (``Model.infer(position=
  ...)``, a kvsim extension: the program reads other rows of the RoPE tables), so every
  query sees each kept key at its true distance, as H2O's and SnapKV's implementations do.
- ``"cache"``: the next tokens sit at the new cache size, as the vendor's runtime places
  them (its ``infer`` has no position). After cutting 3,584 tokens to 512 a new query at
  position 512 sees the kept recent keys (rotated for positions up to 3,583) about 3,000
  positions in its future: an ablation showing why an eviction needs the position. (A
  StreamingLLM that re-numbers positions within the cache would re-rotate the kept keys:
  not built.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from kvsim.errors import ConfigError
from models.quality import QualityStream
from sim.app.needle import NeedleBuilder, NpuRunner, score, trial_keys
from sim.app.quality import bits_label, reference_rows
from sim.runtime.cacheops import EditResult, evict_positions
from sim.runtime.scores import ScoreTap, arm, read_scores

POLICIES = ("recent", "streaming", "h2o", "snapkv")
#: Attention-sink tokens StreamingLLM keeps (its paper keeps 4 initial tokens).
SINKS = 4
#: SnapKV's observation window (queries at the end of the prompt; its paper's 32).
SNAP_WINDOW = 32
#: Neighbours a SnapKV weight is max-pooled over (an assumption: SnapKV pools the
#: window's weights with a small 1-D kernel; 7 here).
SNAP_POOL = 7
SIDES = ("host", "device")
POSITIONS = ("text", "cache")


def keep_positions(policy: str, n: int, budget: int,
                   scores: np.ndarray | None = None) -> list[int]:
    """The positions of an ``n``-token cache that ``policy`` keeps within ``budget``
    (``scores``: the per-position attention weight h2o and snapkv rank by)."""
    if policy not in POLICIES:
        raise ConfigError(f"policy: {policy!r} is not one of {', '.join(POLICIES)}")
    if budget < 1:
        raise ConfigError(f"budget: must be >= 1, got {budget}")
    if budget >= n:
        return list(range(n))
    if policy == "recent":
        return list(range(n - budget, n))
    if policy == "streaming":
        s = min(SINKS, budget)
        return [*range(s), *range(n - (budget - s), n)]
    if scores is None or scores.shape != (n,):
        raise ConfigError(f"{policy}: needs one attention score per position ({n})")
    if policy == "h2o":
        recent = budget - budget // 2
        older = np.arange(n - recent)
        heavy = older[np.argsort(-scores[: n - recent], kind="stable")[: budget // 2]]
        return sorted([*heavy.tolist(), *range(n - recent, n)])
    window = min(SNAP_WINDOW, budget)
    older = scores[: n - window]
    pad = SNAP_POOL // 2
    padded = np.concatenate([np.full(pad, -np.inf), older, np.full(pad, -np.inf)])
    pooled = np.max(np.lib.stride_tricks.sliding_window_view(padded, SNAP_POOL), axis=1)
    picked = np.argsort(-pooled, kind="stable")[: budget - window]
    return sorted([*picked.tolist(), *range(n - window, n)])


class TappedRunner(NpuRunner):
    """:class:`sim.app.needle.NpuRunner` with the score readout armed (two accumulators:
    every query, and the queries from ``window_from`` on); snapshots carry the taps."""

    def __init__(self, *args, window_from: int, positions: str = "text", **kw):
        if positions not in POSITIONS:
            raise ConfigError(f"positions: {positions!r} is not one of {', '.join(POSITIONS)}")
        super().__init__(*args, **kw)
        self.positions = positions
        self.taps = {"all": ScoreTap(self.model, from_pos=0),
                     "window": ScoreTap(self.model, from_pos=window_from)}
        arm(self.model, _Both(self.taps))

    def snapshot(self):
        return super().snapshot(), {k: t.copy() for k, t in self.taps.items()}

    def restore(self, snap) -> None:
        base, taps = snap
        super().restore(base)
        self.taps = {k: t.copy() for k, t in taps.items()}
        arm(self.model, _Both(self.taps))

    def disarm(self) -> None:
        arm(self.model, None)

    def evict(self, policy: str, budget: int, side: str) -> tuple[EditResult, list[int]]:
        """Cut the cache to ``budget`` tokens by ``policy`` on ``side``; the cost (the
        score readout included where the policy needs it) and the positions kept."""
        n = self.size
        cost = None
        scores = None
        if policy in ("h2o", "snapkv"):
            tap = self.taps["all" if policy == "h2o" else "window"]
            sums, cost = read_scores(self.model, tap, n)
            scores = sums.astype(np.float64).sum(axis=(0, 1))
        keep = keep_positions(policy, n, budget, scores)
        drop = sorted(set(range(n)) - set(keep))
        arm(self.model, None)  # the edit's programs are not attention
        if not drop:
            res = EditResult(f"evict {policy}", side, 0.0, 0, 0, new_cache_size=n)
        elif side == "host":
            res = self.model.edit_cache_on_host(evict_positions(drop), cache_size=n)
        else:
            res = self.model.evict_on_device(drop, cache_size=n)
        if cost is not None:
            res = EditResult(res.op, res.where, res.time_s + cost.time_s,
                             res.pcie_bytes + cost.pcie_bytes, res.dram_bytes + cost.dram_bytes,
                             res.host_model_s, res.host_measured_s, res.new_cache_size)
        self.size = res.new_cache_size
        if self.positions == "cache":
            self.pos = self.size
        return res, keep


class _Both:
    """One tap object for the device that feeds every armed accumulator."""

    def __init__(self, taps: dict[str, ScoreTap]):
        self.taps = list(taps.values())

    def add(self, k_base: int, weights) -> None:
        for t in self.taps:
            t.add(k_base, weights)


@dataclass(frozen=True)
class EvictRow:
    policy: str
    budget: int
    side: str
    retrieved: float | None  # share of needle trials retrieved
    logprob_mean: float | None
    kl_mean: float | None  # nats, predictions after the edit
    top1_agreement: float | None
    edit_s: float  # simulated time of the edit (readout included)
    pcie_bytes: int
    dram_bytes: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _cost_key(res: EditResult) -> tuple[float, int, int]:
    return res.time_s, res.pcie_bytes, res.dram_bytes


def retrieval(src, bits, kv: str, hw, *, context: int, budgets: Sequence[int],
              policies: Sequence[str], depths: Sequence[float], trials: int, seed: int = 0,
              positions: str = "text",
              progress=None) -> dict[tuple[str, int], list[bool | float]]:
    """Per (policy, budget): the needle trials' (retrieved, log-prob) with the cache cut
    after the prompt (all but its last token), on the host (the device's edit keeps the
    same positions, so the same logits: :func:`edit_costs` checks it)."""
    tok = src.tokenizer()
    b = NeedleBuilder(tok)
    keys = trial_keys(trials, seed)
    texts = {(d, k): b.text(context, d, k) for d in depths for k in keys}
    a = b.answer_len
    cut = len(next(iter(texts.values())).ids) - a  # the cache size at the edit
    runner = TappedRunner(src, bits, kv, hw, context, window_from=cut - SNAP_WINDOW,
                          positions=positions)
    out: dict[tuple[str, int], list] = {(p, bud): [] for p in policies for bud in budgets}
    try:
        prefix = texts[(max(depths), keys[0])].ids
        done = 0
        for d in sorted(depths):
            at = texts[(d, keys[0])].needle_at
            at -= at % runner.chunk  # a call boundary: each text's calls from position 0
            runner.feed(prefix[done:at])
            done = at
            depth_snap = runner.snapshot()
            for key in keys:
                t = texts[(d, key)]
                runner.feed(t.ids[done:cut])
                prompt_snap = runner.snapshot()
                for p in policies:
                    for bud in budgets:
                        runner.restore(prompt_snap)
                        runner.evict(p, bud, "host")
                        runner.disarm()
                        rows = runner.feed(t.ids[cut:], rows=a)
                        tr = score(tok, t, rows, key)
                        out[(p, bud)].append((tr.retrieved, tr.logprob_mean))
                runner.restore(depth_snap)
                if progress:
                    progress(f"evictions: depth {d:.0%} key {key} done")
    finally:
        runner.close()
    return out


def divergence(src, bits, kv: str, hw, ids: Sequence[int], *, at: int,
               budgets: Sequence[int], policies: Sequence[str], positions: str = "text"
               ) -> dict[tuple[str, int] | str, tuple[float, float]]:
    """Per (policy, budget) and for ``"none"``: (KL mean, top-1) of the predictions after
    ``at`` teacher-forced tokens of ``ids``, the cache cut at ``at`` on the host."""
    ref = reference_rows(src, ids)
    runner = TappedRunner(src, bits, kv, hw, len(ids), window_from=at - SNAP_WINDOW,
                          positions=positions)
    out: dict = {}
    try:
        runner.feed(ids[:at])
        snap = runner.snapshot()
        for p, bud in [("none", 0), *((p, b) for p in policies for b in budgets)]:
            runner.restore(snap)
            if p != "none":
                runner.evict(p, bud, "host")
            runner.disarm()
            stream = QualityStream(ids, first=at)
            pos = at
            rest = np.asarray(ids[at:])
            for t0 in range(0, rest.size, runner.cm.max_seq):
                chunk = rest[t0:t0 + runner.cm.max_seq]
                rows = runner.step(chunk, all_logits=True)
                stream.add(ref.rows(pos, pos + chunk.size), rows, pos)
                pos += chunk.size
            q = stream.result(model=src.name, real_weights=src.real, bits=bits_label(bits),
                              numerics=bits.numerics.model_dump(), kv=kv,
                              kv_read=bits.kv_read, hw=hw.name, prefill_s=0.0)
            out["none" if p == "none" else (p, bud)] = (q.kl_mean, q.top1_agreement)
    finally:
        runner.close()
    return out


def edit_costs(src, bits, kv: str, hw, ids: Sequence[int], *, at: int,
               budgets: Sequence[int], policies: Sequence[str]
               ) -> dict[tuple[str, int, str], EditResult]:
    """The simulated cost of each (policy, budget, side) edit on a cache of ``at`` tokens
    of ``ids``; checks that the host and device edits leave the same next logits."""
    runner = TappedRunner(src, bits, kv, hw, len(ids), window_from=at - SNAP_WINDOW)
    out = {}
    try:
        runner.feed(ids[:at])
        snap = runner.snapshot()
        for p in policies:
            for bud in budgets:
                logits = {}
                for side in SIDES:
                    runner.restore(snap)
                    res, _ = runner.evict(p, bud, side)
                    runner.disarm()
                    out[(p, bud, side)] = res
                    logits[side] = runner.feed(ids[at:at + 2], rows=2)
                if not np.array_equal(logits["host"], logits["device"]):
                    raise AssertionError(f"{p} {bud}: the host and device edits differ")
    finally:
        runner.close()
    return out


__all__ = ["POLICIES", "POSITIONS", "SIDES", "SINKS", "SNAP_POOL", "SNAP_WINDOW", "EvictRow",
           "TappedRunner", "divergence", "edit_costs", "keep_positions", "retrieval"]
