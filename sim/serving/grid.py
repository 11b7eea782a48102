"""Where the step-cost model (:mod:`.costs`) measures, and the measuring itself: the grid
of batch shapes, the timing-only simulations of its points (in worker processes that fork
with the model in a global), and where measured grids are cached on disk."""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from isa.instructions import HostRead, Program
from models.compiler import CompiledModel
from models.compiler.driver import LOGITS_REGION, StepSeq, lower_step
from sim.device.device import Device
from sim.device.hw import HardwareConfig
from sim.progress import Phases


def default_cache_dir() -> Path:
    """``$KVSIM_CACHE_DIR/step-costs`` or ``~/.cache/kvsim/step-costs``."""
    root = os.environ.get("KVSIM_CACHE_DIR")
    base = Path(root) if root else Path.home() / ".cache" / "kvsim"
    return base / "step-costs"


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


def timing_device(cm: CompiledModel, hw: HardwareConfig) -> Device:
    """A timing-only device laid out for ``cm`` (what every grid point runs on)."""
    return Device(hw, functional=False, layout=cm.layout(host_bytes=hw.host.memory_bytes))


def _run_ps(prog: Program) -> int:
    return timing_device(_CTX["cm"], _CTX["hw"]).run(prog, validate=False).duration_ps


def measure(task: tuple) -> int:
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
    seqs, layers = tile_step(task)
    return _run_ps(lower_step(lw, list(seqs), layers=layers))


def tile_step(task: tuple) -> tuple[tuple[StepSeq, ...], tuple[int, ...]]:
    """The step of a tile task, ``("decode", k, ctx, layers)`` (``k`` one-token sequences
    at context ``ctx``) or ``("prefill", n, pos, layers)`` (one piece of ``n`` tokens at
    cache position ``pos``): its sequences and layers. MoE routing keys do not depend on
    the position, so that the grid is smooth in it."""
    kind, a, b, layers = task
    if kind == "decode":
        seqs = tuple(StepSeq(0, 1, b - 1, False, i + 1, (i + 1) << 32) for i in range(a))
    else:
        seqs = (StepSeq(0, a, b, False, 1, 1 << 32),)
    return seqs, layers


def program_key(task: tuple) -> tuple:
    """What the program of ``task`` is made from: two tasks with one key lower the same
    program and so take the same time (a one-token prefill piece at position ``p`` is the
    decode of one sequence at context ``p + 1``)."""
    return tile_step(task) if task[0] in ("decode", "prefill") else task


def run_tasks(cm: CompiledModel, hw: HardwareConfig, tasks: list[tuple], jobs: int,
              progress: Phases | None) -> dict[tuple, int]:
    """Measure every task (:func:`measure`'s forms), in ``jobs`` forked workers if more
    than one; returns picoseconds by task."""
    _CTX["cm"], _CTX["hw"] = cm, hw
    first: dict[tuple, tuple] = {}  # program key -> the first task that lowers it
    for t in tasks:
        first.setdefault(program_key(t), t)
    unique = list(first.values())  # each program is simulated once, in the tasks' order
    by_task: dict[tuple, int] = {}
    if progress is not None:
        progress.start("measure the step-cost grid", total=len(unique))
    if jobs <= 1 or len(unique) < 2:
        for t in unique:
            by_task[t] = measure(t)
            if progress is not None:
                progress.advance()
    else:
        # the cheapest program first, here: the device's compiled kernels are then loaded
        # once, before the workers fork, instead of once in every worker
        warm = min(unique, key=cheapness)
        by_task[warm] = measure(warm)
        if progress is not None:
            progress.advance()
        rest = [t for t in unique if t != warm]
        ctx = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
            for t, v in zip(rest, pool.map(measure, rest, chunksize=1), strict=True):
                by_task[t] = v
                if progress is not None:
                    progress.advance()
    return {t: by_task[first[program_key(t)]] for t in tasks}


def cheapness(task: tuple) -> tuple[int, int, int]:
    """Orders tasks from the cheapest to simulate: a logits return (one host-link DMA), the
    input stages, a head pass, then tiles by layers and tokens."""
    rank = ("logits", "io", "head").index(task[0]) if len(task) == 2 else 3
    return (rank, len(task[3]), task[1]) if rank == 3 else (rank, 0, task[1])


def task_from_json(t: list) -> tuple:
    """A task as read back from a cached grid's JSON (lists to tuples)."""
    return tuple(tuple(x) if isinstance(x, list) else x for x in t)
