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
"""

from __future__ import annotations

import bisect
import hashlib
import json
import multiprocessing
import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from isa.instructions import HostRead, Program
from models.compiler import CompiledModel
from models.compiler.driver import (
    LOGITS_REGION,
    StepSeq,
    head_rows,
    lower_step,
    tiles_of,
)
from sim.device import Device
from sim.hw import HardwareConfig
from sim.progress import Phases
from traces.io import atomic_write_json

#: Bumped when the programs or the grid's meaning change (invalidates cached grids).
COST_MODEL_VERSION = 2
#: MoE layers averaged when extrapolating a MoE model's tile to all layers (one full turn
#: of the cache owner over ARIES's 8 cores).
MOE_PROBE_LAYERS = 8


def default_cache_dir() -> Path:
    """``$KVSIM_CACHE_DIR/step-costs`` or ``~/.cache/kvsim/step-costs``."""
    root = os.environ.get("KVSIM_CACHE_DIR")
    base = Path(root) if root else Path.home() / ".cache" / "kvsim"
    return base / "step-costs"


# --- interpolation --------------------------------------------------------------------------

def _bracket(xs: Sequence[float], x: float) -> tuple[int, float]:
    """Index ``i`` and weight ``w`` with ``x = (1 - w) xs[i] + w xs[i + 1]`` (``w`` outside
    [0, 1] past the ends: linear extrapolation); one point: ``(0, 0.0)``."""
    if len(xs) == 1:
        return 0, 0.0
    i = bisect.bisect_right(xs, x) - 1
    i = min(max(i, 0), len(xs) - 2)
    return i, (x - xs[i]) / (xs[i + 1] - xs[i])


@dataclass(frozen=True)
class Line:
    """Piecewise-linear ``f(x)`` through ``(xs[i], ys[i])``."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]

    def __call__(self, x: float) -> float:
        i, w = _bracket(self.xs, x)
        if len(self.xs) == 1:
            return self.ys[0]
        return self.ys[i] + w * (self.ys[i + 1] - self.ys[i])


@dataclass(frozen=True)
class Plane:
    """Bilinear ``f(x, y)`` over the grid ``xs x ys`` (``zs[i][j] = f(xs[i], ys[j])``)."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]
    zs: tuple[tuple[float, ...], ...]

    def __call__(self, x: float, y: float) -> float:
        i, u = _bracket(self.xs, x)
        j, v = _bracket(self.ys, y)
        z = self.zs
        if len(self.xs) == 1:
            a = z[0][j] if len(self.ys) == 1 else z[0][j] + v * (z[0][j + 1] - z[0][j])
            return a
        if len(self.ys) == 1:
            return z[i][0] + u * (z[i + 1][0] - z[i][0])
        a = z[i][j] + v * (z[i][j + 1] - z[i][j])
        b = z[i + 1][j] + v * (z[i + 1][j + 1] - z[i + 1][j])
        return a + u * (b - a)


# --- the grid --------------------------------------------------------------------------------

def _powers(top: int, start: int = 1, factor: int = 2) -> list[int]:
    out, x = [], start
    while x < top:
        out.append(x)
        x *= factor
    return out


@dataclass(frozen=True)
class GridSpec:
    """Where the cost model measures (all token counts and positions)."""

    decode_k: tuple[int, ...]  # sequences in a decode tile
    decode_ctx: tuple[int, ...]  # their (mean) context, tokens
    prefill_n: tuple[int, ...]  # tokens of a prefill piece
    prefill_pos: tuple[int, ...]  # its first cache position
    io_tokens: tuple[int, ...]  # tokens of a step (host input, input stages)
    head_r: tuple[int, ...]  # rows of a head pass
    logits_n: tuple[int, ...]  # sequences whose logits return

    @classmethod
    def default(cls, *, m_tile: int, cap: int, max_tokens: int, max_seqs: int,
                head_rows: int, fp_tokens: int = 0) -> GridSpec:
        """Powers of two up to the tile, contexts 1, 64, 256, 1024, ... up to the cache
        length, and the end of a format's full-precision tokens (``fp_tokens``: sink +
        window), where the bytes per token of the context change."""
        ks = sorted(set(_powers(m_tile)) | {m_tile})
        ctx = sorted({c for c in [1, *_powers(cap, 64, 4)] if c <= cap} | {cap}
                     | ({fp_tokens, fp_tokens + 64} if 0 < fp_tokens < cap - 64 else set()))
        pos = sorted({p for p in [0, *_powers(cap - m_tile, 64, 4)] if p <= cap - m_tile}
                     | {cap - m_tile} | ({fp_tokens} if 0 < fp_tokens < cap - m_tile
                                         else set()))
        io = sorted(set(_powers(max_tokens, 1, 4)) | {m_tile, max_tokens})
        rows = min(head_rows, max_seqs)  # a head pass never has more rows than samplers
        hr = sorted({1, max(1, rows // 4), max(1, rows // 2), rows})
        return cls(decode_k=tuple(ks), decode_ctx=tuple(ctx), prefill_n=tuple(ks),
                   prefill_pos=tuple(pos), io_tokens=tuple(io), head_r=tuple(hr),
                   logits_n=tuple(sorted({1, max_seqs})))

    def to_json(self) -> dict[str, list[int]]:
        return {k: list(v) for k, v in vars(self).items()}


# --- measurement (worker processes fork with the model in a global) --------------------------

_CTX: dict[str, Any] = {}


def _device(cm: CompiledModel, hw: HardwareConfig) -> Device:
    return Device(hw, functional=False, layout=cm.layout(host_bytes=hw.host.memory_bytes))


def _run_ps(prog: Program) -> int:
    return _device(_CTX["cm"], _CTX["hw"]).run(prog, validate=False).duration_ps


def _measure(task: tuple) -> int:
    """One grid measurement, picoseconds (runs in a worker)."""
    cm = _CTX["cm"]
    lw = cm.lowering()
    kind = task[0]
    if kind == "logits":
        n = task[1]
        base = cm.mm[LOGITS_REGION].base
        return _run_ps(Program((HostRead(src=base, dst=0, nbytes=4 * n * cm.model.vocab_size),),
                               name=f"logits of {n}"))
    if kind == "io":  # m tokens in pieces the cache length allows (no layers: no cache)
        m, part = task[1], cm.cap
        seqs = [StepSeq(0, min(part, m - a), 0, False) for a in range(0, m, part)]
        return _run_ps(lower_step(lw, seqs, layers=()))
    if kind == "head":
        r = task[1]
        return _run_ps(lower_step(lw, [StepSeq(0, 1, 0, True, i + 1) for i in range(r)],
                                  layers=()))
    # a tile through some layers: ("decode", k, ctx, layers) | ("prefill", n, pos, layers);
    # MoE routing keys that do not depend on the position, so that the grid is smooth in it
    _, a, b, layers = task
    if kind == "decode":
        seqs = [StepSeq(0, 1, b - 1, False, i + 1, (i + 1) << 32) for i in range(a)]
    else:
        seqs = [StepSeq(0, a, b, False, 1, 1 << 32)]
    return _run_ps(lower_step(lw, seqs, layers=layers))


def _run_tasks(cm: CompiledModel, hw: HardwareConfig, tasks: list[tuple], jobs: int,
               progress: Phases | None) -> dict[tuple, int]:
    _CTX["cm"], _CTX["hw"] = cm, hw
    out: dict[tuple, int] = {}
    if progress is not None:
        progress.start("measure the step-cost grid", total=len(tasks))
    if jobs <= 1 or len(tasks) < 2:
        for t in tasks:
            out[t] = _measure(t)
            if progress is not None:
                progress.advance()
        return out
    ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        for t, v in zip(tasks, pool.map(_measure, tasks, chunksize=1), strict=True):
            out[t] = v
            if progress is not None:
                progress.advance()
    return out


# --- the model -------------------------------------------------------------------------------

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
                    self._fit({_task_from_json(t): v for t, v in data["measured"]})
                    self.cache_hit = True
                    self.build_s = float(data.get("build_s", 0.0))
                    return
                except (ValueError, KeyError, TypeError):
                    pass  # a damaged cache file: measure again
        t0 = time.perf_counter()
        measured = _run_tasks(self.cm, self.hw, self._tasks(), jobs, progress)
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
            self._direct_cache[key] = _device(self.cm, self.hw).run(
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


def _task_from_json(t: list) -> tuple:
    return tuple(tuple(x) if isinstance(x, list) else x for x in t)
