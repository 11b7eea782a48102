"""What one batched step costs on the device: the cycle model, evaluated on a grid and
interpolated.

A serving run takes thousands of steps; simulating each one's program (tens of thousands
of instructions) would take hours. The step's program (:func:`models.compiler.driver.
lower_step`) is a sequence of parts that run one after the other, each ending at a barrier:
the host input and the input stage, then the token tiles (each through every layer), then
the LM head passes and the logits' return over the host link. So its time is close to the
sum of its parts', and each part depends on a few numbers only:

- ``io(m)``: host input and input stages of ``m`` tokens (a program with no layers);
- a token tile: a decode group of ``k`` sequences at mean context ``c``, ``D(k, c)``, or a
  prefill piece of ``n`` tokens at cache position ``p``, ``P(n, p)`` (measured as a tile
  through every layer, minus ``io``); a tile that mixes them costs ``P(m, 0)`` (the tile's
  tokens with no attention to speak of) plus each group's excess over the same tokens
  without attention: ``D(k, c) - P(k, 0)`` and ``P(n, p) - P(n, 0)``;
- a head pass of ``r`` rows, ``hp(r)``, and the logits' return, ``logits(n)`` (linear).

Each is simulated on the device (timing-only) at grid points and interpolated
(piecewise-linear in each dimension). Layers repeat, so a tile is simulated through a few
layers and extrapolated to all (``extrapolate``): layers ``(0,)`` and ``(0, 1)`` for a
dense model, ``(0,)`` and ``(0, .., 8)`` for a MoE model (its MoE layers differ in their
routing and rotate their cache owner over the 8 cores, so 8 of them are averaged).
:meth:`StepCostModel.validate` measures the model's error against a direct simulation of
whole steps. Grids are cached on disk, keyed by everything that changes the programs.

Where the grid lies and how its points are measured: :mod:`.grid`; the interpolation:
:mod:`.interp` (both re-exported here).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvsim.files import atomic_write_json
from models.compiler import CompiledModel
from models.compiler.driver import StepSeq, head_rows, lower_step, tiles_of
from sim.device.hw import HardwareConfig
from sim.progress import Phases
from sim.serving.grid import GridSpec, default_cache_dir, run_tasks, task_from_json, timing_device
from sim.serving.interp import Line, Plane

__all__ = ["COST_MODEL_VERSION", "MOE_PROBE_LAYERS", "GridSpec", "Line", "Plane",
           "StepCostModel", "default_cache_dir"]

#: Bumped when the programs or the grid's meaning change (invalidates cached grids).
COST_MODEL_VERSION = 2
#: MoE layers averaged when extrapolating a MoE model's tile to all layers (one full turn
#: of the cache owner over ARIES's 8 cores).
MOE_PROBE_LAYERS = 8


class StepCostModel:
    """Step latency of a compiled model on one chip (see the module docstring).

    ``cm`` must have the batch regions (:func:`models.compiler.driver.
    batch_memory_map`) and ``max_seq`` = the most tokens of a step. ``mode="direct"``
    simulates every step's program instead (exact; for small runs and validation).
    """

    def __init__(self, cm: CompiledModel, hw: HardwareConfig, *, max_seqs: int,
                 mode: str = "grid", extrapolate: bool = True, jobs: int | None = None,
                 cache_dir: str | Path | None = None,
                 grid: GridSpec | None = None,
                 progress: Phases | None = None):
        self.cm = cm
        self.hw = hw
        self.mode = mode
        self.extrapolate = extrapolate
        self.lw = cm.lowering()
        self.m_tile = cm.m_tile
        self.head_rows = head_rows(self.lw)  # rows of a head pass (lower_step's)
        self.max_tokens = cm.max_seq
        self.max_seqs = max_seqs
        pair_k = cm.k_fmt
        fp = 0 if pair_k.bits == 16 else pair_k.sink + pair_k.window
        self.spec = grid or GridSpec.default(m_tile=cm.m_tile, cap=cm.cap,
                                             max_tokens=cm.max_seq, max_seqs=max_seqs,
                                             head_rows=self.head_rows, fp_tokens=fp)
        self.build_s = 0.0
        self.cache_hit = False
        self.cache_path: Path | None = None
        self._direct_cache: dict[tuple, int] = {}
        self._pre_memo: dict[tuple[int, int], float] = {}
        self._run_memo: dict[tuple[int, int], tuple[tuple[float, ...], int]] = {}
        self._dec_memo: dict[tuple[int, int], float] = {}
        self._ends_memo: dict[tuple[int, int], float] = {}
        if mode == "grid":
            self._load_or_build(jobs or max(1, min(8, os.cpu_count() or 1)),
                                cache_dir, progress)
        elif mode != "direct":
            raise ValueError(f"cost mode {mode!r}: valid modes are grid, direct")

    # --- layers -------------------------------------------------------------------------------
    def probe_layers(self) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """The two layer sets whose difference gives the time per layer (None: simulate
        every layer)."""
        cfg = self.cm.model
        L = cfg.num_layers
        if not self.extrapolate or L <= 2:
            return None
        if cfg.is_moe:
            first = cfg.first_k_dense_replace or 0
            if L - first <= MOE_PROBE_LAYERS + 1 or not all(
                    cfg.layer_is_moe(i) for i in range(first, L)):
                return None  # few layers, or dense layers between MoE ones (Qwen2-MoE)
            dense = tuple(range(first))
            return dense + (first,), dense + tuple(range(first, first + MOE_PROBE_LAYERS + 1))
        return (0,), (0, 1)

    def anchored(self) -> bool:
        """Whether extrapolated tiles are anchored to a simulation of every layer: a MoE
        model's layers differ in their experts (the probe layers' routing is not the
        average), so each tile size is also simulated through every layer at one context,
        and the extrapolation gives only how the time changes with the context."""
        return self.probe_layers() is not None and self.cm.model.is_moe

    def _full(self, t_a: int, t_b: int, la: tuple[int, ...], lb: tuple[int, ...]) -> float:
        """Time of all layers from the times of layer sets ``la`` and ``lb``."""
        per = (t_b - t_a) / (len(lb) - len(la))
        return t_a + (self.cm.model.num_layers - len(la)) * per

    # --- grid ---------------------------------------------------------------------------------
    def key(self) -> str:
        cm = self.cm
        ident = {
            "version": COST_MODEL_VERSION, "model": cm.model.model_dump(mode="json"),
            "bits": cm.bits.model_dump(mode="json"), "kv": cm.kv,
            "hw": self.hw.model_dump(mode="json", exclude={"sources", "assumptions",
                                                           "description"}),
            "core_mode": cm.core_mode, "cap": cm.cap, "slots": cm.slots,
            "m_tile": cm.m_tile, "tile_bytes": self.lw.target.tile_bytes,
            "max_tokens": self.max_tokens, "max_seqs": self.max_seqs,
            "extrapolate": self.extrapolate, "grid": self.spec.to_json(),
        }
        text = json.dumps(ident, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    def _tasks(self) -> list[tuple]:
        s = self.spec
        probe = self.probe_layers()
        layer_sets = [tuple(range(self.cm.model.num_layers))] if probe is None else list(probe)
        tasks: list[tuple] = [("logits", n) for n in s.logits_n]
        tasks += [("io", m) for m in s.io_tokens]
        tasks += [("head", r) for r in s.head_r]
        for ls in layer_sets:
            tasks += [("decode", k, c, ls) for k in s.decode_k for c in s.decode_ctx]
            tasks += [("prefill", n, p, ls) for n in s.prefill_n for p in s.prefill_pos
                      if p + n <= self.cm.cap]
        if self.anchored():  # every layer at one context per tile size
            every = tuple(range(self.cm.model.num_layers))
            tasks += [("decode", k, s.decode_ctx[0], every) for k in s.decode_k]
            tasks += [("prefill", n, s.prefill_pos[0], every) for n in s.prefill_n]
        # most expensive first: the pool's workers finish together
        tasks.sort(key=lambda t: -(len(t[3]) * (t[1] if t[0] == "prefill" else 1)
                                   if len(t) == 4 else 0))
        return tasks

    def _load_or_build(self, jobs: int, cache_dir, progress) -> None:
        path = None
        if cache_dir != "":
            path = Path(cache_dir) if cache_dir else default_cache_dir()
            path = path / f"{self.key()}.json"
            self.cache_path = path
            if path.is_file():
                try:
                    data = json.loads(path.read_text())
                    self._fit({task_from_json(t): v for t, v in data["measured"]})
                    self.cache_hit = True
                    self.build_s = float(data.get("build_s", 0.0))
                    return
                except (ValueError, KeyError, TypeError):
                    pass  # a damaged cache file: measure again
        t0 = time.perf_counter()
        measured = run_tasks(self.cm, self.hw, self._tasks(), jobs, progress)
        self.build_s = time.perf_counter() - t0
        self._fit(measured)
        if path is not None:
            try:
                atomic_write_json(path, {"key": self.key(), "build_s": self.build_s,
                                         "grid": self.spec.to_json(),
                                         "measured": [[list(t), v]
                                                      for t, v in measured.items()]})
            except OSError:  # a cache that cannot be written only costs the next run time
                self.cache_path = None

    def _fit(self, meas: dict[tuple, int]) -> None:
        s = self.spec
        self._pre_memo = {}
        self._run_memo: dict[tuple[int, int], tuple[tuple[float, ...], int]] = {}
        self._dec_memo = {}
        self._ends_memo = {}
        self.logits = Line(tuple(map(float, s.logits_n)),
                           tuple(float(meas[("logits", n)]) for n in s.logits_n))
        self.io = Line(tuple(map(float, s.io_tokens)),
                       tuple(float(meas[("io", m)]) for m in s.io_tokens))
        # a head pass: the zero-layer step with r sampling sequences, less its input part
        # and its logits' return
        self.head_pass = Line(tuple(map(float, s.head_r)), tuple(
            meas[("head", r)] - self.io(r) - self.logits(r) for r in s.head_r))
        probe = self.probe_layers()

        every = tuple(range(self.cm.model.num_layers))
        ref = {"decode": s.decode_ctx[0], "prefill": s.prefill_pos[0]}

        def full(kind: str, a: int, b: int) -> float:
            if probe is None:
                t = meas[(kind, a, b, every)]
            else:
                la, lb = probe

                def ext(x: int) -> float:
                    return self._full(meas[(kind, a, x, la)], meas[(kind, a, x, lb)], la, lb)

                t = ext(b)
                if self.anchored():
                    t += meas[(kind, a, ref[kind], every)] - ext(ref[kind])
            return t - self.io(a)  # a = the tile's tokens

        self.decode = Plane(tuple(map(float, s.decode_k)), tuple(map(float, s.decode_ctx)),
                            tuple(tuple(full("decode", k, c) for c in s.decode_ctx)
                                  for k in s.decode_k))
        # prefill: positions whose pieces do not fit the cache reuse the last that does
        rows = []
        for n in s.prefill_n:
            row, last = [], None
            for p in s.prefill_pos:
                if p + n <= self.cm.cap:
                    last = full("prefill", n, p)
                row.append(last)
            rows.append(tuple(v if v is not None else row[-1] for v in row))
        self.prefill = Plane(tuple(map(float, s.prefill_n)), tuple(map(float, s.prefill_pos)),
                             tuple(rows))
        self.points = len(meas)

    # --- evaluation ---------------------------------------------------------------------------
    def tile_ps(self, segs) -> float:
        """Time of one token tile through every layer (pieces: ``.n``, ``.pos0``)."""
        dec_k = 0
        dec_ctx = 0
        pre = []
        m = 0
        for sq in segs:
            m += sq.n
            if sq.n == 1:
                dec_k += 1
                dec_ctx += sq.pos0 + 1
            else:
                pre.append((sq.n, sq.pos0))
        return self._tile(dec_k, dec_ctx, pre, m)

    def _pre(self, n: int, pos: int) -> float:
        """``prefill(n, pos)``, memoized (a pure function of the grid)."""
        key = (n, pos)
        v = self._pre_memo.get(key)
        if v is None:
            v = self._pre_memo[key] = self.prefill(n, pos)
        return v

    def _dec(self, k: int, ctx: int) -> float:
        """``decode(k, ctx / k)``: ``k`` one-token pieces whose contexts sum to ``ctx``,
        memoized (a pure function of the grid)."""
        key = (k, ctx)
        v = self._dec_memo.get(key)
        if v is None:
            v = self._dec_memo[key] = self.decode(k, ctx / k)
        return v

    def _tile(self, dec_k: int, dec_ctx: int, pre: list[tuple[int, int]], m: int) -> float:
        """A tile of ``m`` tokens: ``dec_k`` one-token pieces whose contexts sum to
        ``dec_ctx`` and the longer pieces ``pre`` (tokens, first position)."""
        if not pre:
            return self._dec(dec_k, dec_ctx)
        if dec_k == 0 and len(pre) == 1:
            return self._pre(*pre[0])
        t = self._pre(m, 0)
        if dec_k:
            t += self._dec(dec_k, dec_ctx) - self._pre(dec_k, 0)
        for n, p in pre:
            t += self._pre(n, p) - self._pre(n, 0)
        return t

    def batch_ps(self, dec_pos: Sequence[int], pre: Sequence[tuple[int, int]],
                 sampled: int) -> int:
        """:meth:`model_ps` of a step given as its decoding sequences' cache positions
        ``dec_pos`` (one token each, first), its longer pieces ``pre`` (tokens, cache
        position; after them) and how many sequences sample: the same tiles and the
        same arithmetic in the same order, without building the step's sequences."""
        mt = self.m_tile
        m = len(dec_pos)
        for n, _ in pre:
            m += n
        key = (m, sampled)
        t = self._ends_memo.get(key)
        if t is None:  # host I/O and the head: a pure function of the grid, memoized
            t = self._ends_memo[key] = self.io(m) + self.head_ps(sampled)
        nd = len(dec_pos)
        i = 0
        while nd - i >= mt:  # tiles of decoding sequences only
            t += self._dec(mt, sum(dec_pos[i:i + mt]) + mt)
            i += mt
        dec_k = nd - i  # the rest of them open the first tile of the longer pieces
        dec_ctx = sum(dec_pos[i:]) + dec_k
        fill = dec_k
        cur: list[tuple[int, int]] = []
        for n, p in pre:
            if fill:  # its first part joins the open tile
                k = min(n, mt - fill)
                if k == 1:
                    dec_k += 1
                    dec_ctx += p + 1
                else:
                    cur.append((k, p))
                fill += k
                if fill == mt:
                    t += self._tile(dec_k, dec_ctx, cur, fill)
                    dec_k = dec_ctx = fill = 0
                    cur = []
                n -= k
                p += k
                if not n:
                    continue
            full, rest = self._run(n, p)  # the tiles it fills alone, then its rest
            for v in full:
                t += v
            if rest == 1:
                dec_k, dec_ctx, fill = 1, p + n, 1
            elif rest:
                cur, fill = [(rest, p + n - rest)], rest
        if fill:
            t += self._tile(dec_k, dec_ctx, cur, fill)
        return int(round(t))

    def _run(self, n: int, p: int) -> tuple[tuple[float, ...], int]:
        """A piece of ``n`` tokens at position ``p`` that starts a tile: the times of the
        whole tiles it fills alone (in order) and the tokens left for the next tile
        (memoized; the same values :meth:`_tile` gives those tiles)."""
        key = (n, p)
        v = self._run_memo.get(key)
        if v is None:
            mt = self.m_tile
            full = tuple(self._tile(1, q + 1, [], 1) if mt == 1 else self._tile(0, 0, [(mt, q)], mt)
                         for q in range(p, p + n - mt + 1, mt))
            v = self._run_memo[key] = (full, n % mt)
        return v

    def plan_ps(self, plan) -> int:
        """The grid model's time of a scheduled step (a :class:`.scheduler.StepPlan`)."""
        return self.batch_ps(plan.dec_pos, plan.pieces, plan.logits)

    def head_ps(self, n_out: int) -> float:
        if n_out <= 0:
            return 0.0
        r = self.head_rows
        full, rest = divmod(n_out, r)
        t = full * self.head_pass(r) + (self.head_pass(rest) if rest else 0.0)
        return t + self.logits(n_out)

    def model_ps(self, seqs: Sequence[StepSeq]) -> int:
        """The grid model's time of a step."""
        m = sum(s.tokens for s in seqs)
        t = self.io(m) + self.head_ps(sum(1 for s in seqs if s.logits))
        for segs in tiles_of(seqs, self.m_tile):
            t += self.tile_ps(segs)
        return int(round(t))

    def direct_ps(self, seqs: Sequence[StepSeq]) -> int:
        """Simulate the step's program (every layer, every tile)."""
        key = tuple(seqs)
        if key not in self._direct_cache:
            prog = lower_step(self.lw, seqs)
            self._direct_cache[key] = timing_device(self.cm, self.hw).run(
                prog, validate=False).duration_ps
        return self._direct_cache[key]

    def step_ps(self, seqs: Sequence[StepSeq]) -> int:
        return self.direct_ps(seqs) if self.mode == "direct" else self.model_ps(seqs)

    def validate(self, shapes: Sequence[Sequence[StepSeq]]) -> list[dict[str, Any]]:
        """The grid model against direct simulation on ``shapes`` (held out: not grid
        points)."""
        out = []
        for seqs in shapes:
            t0 = time.perf_counter()
            direct = self.direct_ps(seqs)
            wall = time.perf_counter() - t0
            model = self.model_ps(seqs)
            out.append({
                "sequences": len(seqs), "tokens": sum(s.tokens for s in seqs),
                "decoding": sum(1 for s in seqs if s.tokens == 1),
                "logits": sum(1 for s in seqs if s.logits),
                "direct_s": direct / 1e12, "model_s": model / 1e12,
                "error": (model - direct) / direct, "direct_wall_s": wall,
            })
        return out

    def describe(self) -> dict[str, Any]:
        probe = self.probe_layers()
        return {
            "mode": self.mode, "m_tile": self.m_tile, "head_rows": self.head_rows,
            "extrapolated_from_layers": [list(p) for p in probe] if probe else None,
            "anchored_to_all_layers": self.anchored(),
            "grid_points": getattr(self, "points", 0), "grid": self.spec.to_json(),
            "build_s": self.build_s, "cache_hit": self.cache_hit,
            "cache_file": str(self.cache_path) if self.cache_path else None,
        }
