"""Pass-key retrieval through the integer pipeline (``kvsim needle``).

A five-digit pass key is hidden in filler text at a depth of the context (0 %: right
after the instruction, 100 %: right before the question), the task of Mohtashami and
Jaggi ("Landmark Attention", 2023), in kvsim's own words. Per cell (context length,
depth) and seeded trial (one key per trial, the same keys in every cell), the text
``instruction + filler + needle + filler + question + answer`` is teacher-forced:

- **retrieved**: greedy decoding after the question writes the answer (a space, then the
  key's five digits): the argmax at each of the answer's positions is the answer's token
  (a greedy decode writes the key exactly when every one of these holds);
- **log-probability**: the mean natural log-probability of the key's digits.

Every trial of a cell shares the text before its needle, and a shallower cell's text is
the start of a deeper one's: the prefix runs once per context, its cache is dumped at
each depth's needle and loaded back before each trial (the bytes the device holds: the
same cache as a run from the start).

The float reference runs the same texts on the float model (its own cache snapshots).
Results are cached on disk per cell (``cells/*.json`` in the output folder), so a long
grid resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvsim.errors import ConfigError
from kvsim.files import atomic_write_text
from models.bits import BitConfig
from models.compiler.calibrate_wide import float_weights
from models.quality import log_softmax
from models.reference import ReferenceModel
from models.source import ModelSource
from sim.app.quality import bits_label, ready_for_text
from sim.device.hw import HardwareConfig
from sim.runtime import ModelConfig
from sim.runtime.ready import hardware_of, source_of

#: The text around the key (kvsim's own wording of the pass-key task).
INSTRUCTION = ("A pass key is hidden somewhere in the long text below. Find it and keep it "
               "in mind: at the end you will be asked what it is.")
FILLER = (" The day was warm and still. The river ran slowly past the old mill. A cart "
          "went by on the road to the town. Nothing else happened for a long time.")
NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = " What is the pass key? The pass key is"
ANSWER = " {key}"
#: Bumped whenever the text above or the measure changes (cached cells of another
#: version are not reused).
PROMPT_VERSION = 1
KEY_DIGITS = 5
#: How a cell's text is cut into the NPU's calls (part of an NPU cell's cache key): 2, the
#: text before the answer in calls of ``max_seq`` tokens from position 0, the answer in one
#: call, whatever other depths the run has (before, a trial's calls began at the previous
#: depth's needle, and the cut moves an INT2 cache's results: KIVI's fp16 window and its
#: groups are flushed at a call's end).
CALLS_VERSION = 2
DEFAULT_CONTEXTS = (1024, 2048, 4096, 8192)
DEFAULT_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
DEFAULT_TRIALS = 5


def trial_keys(trials: int, seed: int = 0) -> list[int]:
    """The pass key of each trial: five digits, seeded (``seed + trial``)."""
    return [int(np.random.default_rng(seed + t).integers(10 ** (KEY_DIGITS - 1),
                                                         10 ** KEY_DIGITS))
            for t in range(trials)]


@dataclass(frozen=True)
class NeedleText:
    """One trial's text: ``ids`` (fed, the answer's last token left out: nothing after it
    is predicted), the answer's tokens, where the needle starts and which answer tokens
    are the key's digits."""

    ids: list[int]
    answer: list[int]
    needle_at: int
    digits: list[int]  # indices into ``answer``

    @property
    def context(self) -> int:
        return len(self.ids) + 1


class NeedleBuilder:
    """Texts of a given total length (instruction, filler, needle, question, answer)."""

    def __init__(self, tok):
        self.tok = tok
        self.instruction = tok.encode(INSTRUCTION)
        self.question = tok.encode(QUESTION)
        self.unit = tok.encode(FILLER)
        # a sentence ends after each "." token of the filler: the needle goes there
        dot = tok.encode(".")[-1]
        self.ends = [i + 1 for i, t in enumerate(self.unit) if t == dot]
        probe = tok.encode(NEEDLE.format(key="1" * KEY_DIGITS))
        self.needle_len = len(probe)
        self.answer_len = len(tok.encode(ANSWER.format(key="1" * KEY_DIGITS)))

    def filler_len(self, context: int) -> int:
        n = context - len(self.instruction) - self.needle_len - len(self.question) \
            - self.answer_len
        if n < len(self.unit):
            raise ConfigError(f"context: {context} tokens leave {n} of filler; the task "
                              f"needs at least {len(self.unit)} (one filler passage)")
        return n

    def needle_offset(self, context: int, depth: float) -> int:
        """Filler tokens before the needle: ``depth`` of the filler, moved back to the end
        of a sentence."""
        n = self.filler_len(context)
        want = int(round(depth * n))
        u = len(self.unit)
        ends = [r * u + e for r in range(n // u + 1) for e in [0, *self.ends]
                if r * u + e <= min(want, n)]
        return max(ends)

    def filler(self, n: int) -> list[int]:
        reps = -(-n // len(self.unit))
        return (self.unit * reps)[:n]

    def text(self, context: int, depth: float, key: int) -> NeedleText:
        n = self.filler_len(context)
        at = self.needle_offset(context, depth)
        fill = self.filler(n)
        needle = self.tok.encode(NEEDLE.format(key=key))
        answer = self.tok.encode(ANSWER.format(key=key))
        if len(needle) != self.needle_len or len(answer) != self.answer_len:
            raise ConfigError(f"key {key}: its text tokenizes to another length")
        ids = [*self.instruction, *fill[:at], *needle, *fill[at:], *self.question,
               *answer[:-1]]
        digits = [i for i, t in enumerate(answer) if self.tok.decode([t]).strip().isdigit()]
        if len(digits) != KEY_DIGITS:
            raise ConfigError(f"key {key}: the answer's digits are not {KEY_DIGITS} tokens")
        return NeedleText(ids, answer, len(self.instruction) + at, digits)


@dataclass(frozen=True)
class Trial:
    key: int
    retrieved: bool
    logprob_mean: float  # nats, mean over the key's digits, teacher-forced
    greedy: str  # the argmax tokens at the answer's positions, decoded


@dataclass(frozen=True)
class Cell:
    """One (configuration, context, depth) cell."""

    config: str  # "float" or "<kv label> <read path>"
    kv: str | None
    kv_read: str | None
    context: int
    depth: float
    needle_at: int  # token position of the needle
    trials: list[Trial]
    wall_s: float  # host seconds the cell's trials took (its share of the prefix too)

    @property
    def retrieved(self) -> float:
        return float(np.mean([t.retrieved for t in self.trials]))

    @property
    def logprob_mean(self) -> float:
        return float(np.mean([t.logprob_mean for t in self.trials]))

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "retrieved": self.retrieved,
                "logprob_mean": self.logprob_mean}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Cell:
        trials = [Trial(**t) for t in d["trials"]]
        return Cell(d["config"], d["kv"], d["kv_read"], d["context"], d["depth"],
                    d["needle_at"], trials, d["wall_s"])


def score(tok, text: NeedleText, logits: np.ndarray, key: int) -> Trial:
    """A trial's figures from the logits ``(answer tokens, vocab)`` of the positions that
    predict the answer."""
    lp = log_softmax(logits)
    ans = np.asarray(text.answer)
    greedy = lp.argmax(axis=-1)
    return Trial(key=key, retrieved=bool((greedy == ans).all()),
                 logprob_mean=float(np.mean([lp[i, ans[i]] for i in text.digits])),
                 greedy=tok.decode([int(t) for t in greedy]))


# --- runners: the prefix once per context, a snapshot per depth ------------------------


class NpuRunner:
    """The simulated NPU (functional): a model ready for ``context`` tokens, prefill in
    calls of ``cm.max_seq`` tokens, the answer's rows read with all-position logits."""

    def __init__(self, src: ModelSource, bits: BitConfig, kv: str, hw: HardwareConfig,
                 context: int):
        self.ready = ready_for_text(src, bits, kv=kv, hw=hw, tokens=context)
        self.cm = self.ready.compiled
        self.model = self.ready.launch(ModelConfig(all_logits=True))
        self.acc = self.model.acc
        self.chunk = self.cm.max_seq  # feed() cuts its tokens into calls of this many
        self.embed = self.ready.embed  # the host's float32 embeddings of token ids
        self.size = 0  # tokens in the cache
        self.pos = 0  # the text position of the next token (beyond size after an eviction)

    def feed(self, ids: Sequence[int], *, rows: int = 0) -> np.ndarray | None:
        """Append ``ids`` to the cache; the logits of the last ``rows`` of them (0: none)."""
        ids = np.asarray(ids, np.int64)
        end = ids.size - rows
        for t0 in range(0, end, self.cm.max_seq):
            chunk = ids[t0:min(t0 + self.cm.max_seq, end)]
            self.step(chunk, all_logits=False)
        if not rows:
            return None
        return self.step(ids[end:], all_logits=True)

    def step(self, chunk: np.ndarray, *, all_logits: bool) -> np.ndarray | None:
        [out] = self.model.infer(self.embed(chunk), cache_size=self.size, all_logits=all_logits,
                                 position=None if self.pos == self.size else self.pos)
        self.size += chunk.size
        self.pos += chunk.size
        return out

    def snapshot(self) -> tuple[int, int, list[bytes]]:
        return self.size, self.pos, self.model.dump_cache_memory()

    def restore(self, snap: tuple[int, int, list[bytes]]) -> None:
        self.size, self.pos = snap[0], snap[1]
        self.model.load_cache_memory(snap[2])

    def close(self) -> None:
        self.model.dispose()


class FloatRunner:
    """The float reference with the same interface (its own cache snapshots)."""

    chunk = 1  # its results do not depend on where a feed begins

    def __init__(self, src: ModelSource, seed: int = 0):
        self.ref = ReferenceModel(src.config, float_weights(src.config, src.weight_spec(seed)))

    def feed(self, ids: Sequence[int], *, rows: int = 0) -> np.ndarray | None:
        if not rows:
            self.ref.final_hidden(self.ref.embed(ids))
            return None
        return self.ref.forward_embeddings(self.ref.embed(ids), last_rows=rows)

    def snapshot(self):
        return self.ref.kv_cache()

    def restore(self, snap) -> None:
        self.ref.set_kv_cache(snap)

    def close(self) -> None:
        pass


# --- the grid, cached per cell ---------------------------------------------------------


@dataclass(frozen=True)
class NeedleConfig:
    """One row of the grid: the float reference (``kv`` None) or a KV format and read
    path."""

    label: str  # e.g. "int8", "kivi-2"
    kv: str | None  # the format's name or spec
    kv_read: str | None

    @property
    def name(self) -> str:
        return "float" if self.kv is None else f"{self.label} {self.kv_read}"


def cell_path(out: Path, key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    slug = f"{key['config'].replace(' ', '-')}-{key['context']}-{key['depth']:.2f}"
    return out / "cells" / f"{slug}-{digest}.json"


@dataclass(frozen=True)
class ReadPathPair:
    """One format at one context through both read paths, trial by trial (the same keys
    at the same depths): the question whether integer-only attention hurts retrieval
    more than dequantize-on-read."""

    format: str  # the KV format's label
    context: int
    trials: int  # paired trials (every depth's)
    integer: int  # retrieved through integer reads
    dequant: int  # retrieved through dequantize-on-read
    only_integer: int  # retrieved through integer reads only
    only_dequant: int  # ... through dequantize-on-read only
    logprob_integer: float  # mean key log-probability (nats)
    logprob_dequant: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_path_pairs(cells: Sequence[Cell]) -> list[ReadPathPair]:
    """Every (format, context) whose cells ran through both read paths, their trials
    paired by depth and key."""
    by = {(c.kv, c.kv_read, c.context, c.depth): c for c in cells if c.kv is not None}
    label = {c.kv: c.config.rsplit(" ", 1)[0] for c in cells if c.kv is not None}
    out = []
    for kv, ctx in dict.fromkeys((k[0], k[2]) for k in by):
        pairs = []
        for (k, read, c, d), cell in by.items():
            other = by.get((kv, "dequant", ctx, d))
            if k != kv or c != ctx or read != "integer" or other is None:
                continue
            mine = {t.key: t for t in cell.trials}
            pairs.extend((mine[t.key], t) for t in other.trials if t.key in mine)
        if not pairs:
            continue
        out.append(ReadPathPair(
            label[kv], ctx, len(pairs), sum(a.retrieved for a, _ in pairs),
            sum(b.retrieved for _, b in pairs),
            sum(a.retrieved and not b.retrieved for a, b in pairs),
            sum(b.retrieved and not a.retrieved for a, b in pairs),
            float(np.mean([a.logprob_mean for a, _ in pairs])),
            float(np.mean([b.logprob_mean for _, b in pairs]))))
    return out


def cached_cells(out: Path, *, trials: int = DEFAULT_TRIALS, seed: int = 0,
                 stale: list[Path] | None = None) -> list[Cell]:
    """Every cell cached in ``out/cells`` whose trials are those of ``trials`` seeded keys
    (``seed``), in a stable order (float first, then by configuration, context, depth);
    none is run. A cell file that cannot be read is named. Cells written by an older
    kvsim (no key stored, another :data:`PROMPT_VERSION`, or an NPU cell of another
    :data:`CALLS_VERSION`) are left out, their paths added to ``stale``."""
    keys = trial_keys(trials, seed)
    cells = []
    for path in sorted((out / "cells").glob("*.json")):
        try:
            d = json.loads(path.read_text())
            cell = Cell.from_dict(d)
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ConfigError(f"{path}: not a needle cell ({err})") from err
        key = d.get("key") or {}
        if key.get("version") != PROMPT_VERSION or (
                key.get("kv") is not None and key.get("calls") != CALLS_VERSION):
            if stale is not None:
                stale.append(path)
            continue
        if [t.key for t in cell.trials] == keys:
            cells.append(cell)
    return sorted(cells, key=lambda c: (c.kv is not None, c.config, c.context, c.depth))


def run_grid(source: str | Path | ModelSource, configs: Sequence[NeedleConfig], *,
             bits: Callable[[str], BitConfig], contexts: Sequence[int] = DEFAULT_CONTEXTS,
             depths: Sequence[float] = DEFAULT_DEPTHS, trials: int = DEFAULT_TRIALS,
             seed: int = 0, hw: str | HardwareConfig = "aries", out: Path | None = None,
             progress: Callable[[str], None] | None = None, jobs: int = 1,
             make_runner: Callable[..., Any] | None = None) -> list[Cell]:
    """Every cell of ``configs x contexts x depths`` (``bits(read path)``: the bit config
    of a read path). With ``out``, each cell is read from / written to ``out/cells``
    (resumable). ``jobs`` > 1 runs the (configuration, context) groups on that many
    processes (:func:`_run_pool`); the cells are the same and come in the same order.
    ``make_runner(src, cfg, bits, hw, context, seed)`` makes a group's model (default: the
    float reference or the simulated NPU; a top-level callable, so that a process pool can
    take it)."""
    src = source_of(source)
    tok = src.tokenizer()
    hwc = hardware_of(hw)
    builder = NeedleBuilder(tok)
    keys = trial_keys(trials, seed)
    if jobs < 1:
        raise ConfigError(f"jobs: must be >= 1, got {jobs}")
    for d in depths:
        if not 0.0 <= d <= 1.0:
            raise ConfigError(f"depths: {d} is not a fraction in 0..1")
    groups = []
    for cfg in configs:
        for ctx in sorted(contexts):
            builder.filler_len(ctx)  # a context too short fails before any run
            groups.append((cfg, ctx))
    bcs = {cfg: None if cfg.kv is None else bits(cfg.kv_read) for cfg in configs}
    job = _GroupJob(src, hwc, sorted(depths), keys, seed, out, make_runner or _make_runner)
    if jobs == 1 or len(groups) == 1:
        return [cell for cfg, ctx in groups
                for cell in job.run(cfg, bcs[cfg], ctx, tok, builder, progress)]
    return _run_pool(job, groups, bcs, min(jobs, len(groups)), progress)


def _make_runner(src: ModelSource, cfg: NeedleConfig, bits: BitConfig | None,
                 hw: HardwareConfig, context: int, seed: int):
    return FloatRunner(src, seed) if cfg.kv is None else NpuRunner(src, bits, cfg.kv, hw,
                                                                   context)


@dataclass(frozen=True)
class _GroupJob:
    """What every (configuration, context) group of a grid shares (picklable: a pool's
    processes receive it)."""

    src: ModelSource
    hw: HardwareConfig
    depths: list[float]
    keys: list[int]
    seed: int
    out: Path | None
    make_runner: Callable[..., Any]

    def run(self, cfg: NeedleConfig, bits: BitConfig | None, ctx: int, tok=None,
            builder: NeedleBuilder | None = None, progress=None) -> list[Cell]:
        tok = tok if tok is not None else self.src.tokenizer()
        builder = builder or NeedleBuilder(tok)
        return _context_cells(self, tok, builder, cfg, bits, ctx, progress)


def _pool_group(job: _GroupJob, cfg: NeedleConfig, bits: BitConfig | None, ctx: int,
                threads: int) -> list[Cell]:
    """One group in a pool process, on ``threads`` threads (Numba's and BLAS's)."""
    import numba
    from threadpoolctl import threadpool_limits

    numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))
    threadpool_limits(threads)  # for the life of this worker process
    return job.run(cfg, bits, ctx)


def _run_pool(job: _GroupJob, groups: list[tuple[NeedleConfig, int]],
              bcs: dict[NeedleConfig, BitConfig | None], workers: int,
              progress: Callable[[str], None] | None) -> list[Cell]:
    """The groups on ``workers`` processes (spawned: they start clean), each on
    ``cpu_count // workers`` threads; a group's cells are reported as it ends. A group
    that fails stops the grid with its error (the cells done stay cached)."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor, as_completed

    threads = max(1, (os.cpu_count() or 1) // workers)
    done: dict[tuple[NeedleConfig, int], list[Cell]] = {}
    pool = ProcessPoolExecutor(max_workers=workers,
                               mp_context=multiprocessing.get_context("spawn"))
    try:
        futures = {pool.submit(_pool_group, job, cfg, bcs[cfg], ctx, threads): (cfg, ctx)
                   for cfg, ctx in groups}
        for fut in as_completed(futures):
            done[futures[fut]] = fut.result()
            if progress is not None:
                for cell in done[futures[fut]]:
                    progress(_cell_line(cell))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return [cell for g in groups for cell in done[g]]


def _cell_line(cell: Cell) -> str:
    return (f"{cell.config} {cell.context} tokens depth {cell.depth:.0%}: retrieved "
            f"{cell.retrieved:.0%}, log-prob {cell.logprob_mean:.3f} ({cell.wall_s:.0f} s)")


def _cell_key(src: ModelSource, cfg: NeedleConfig, bits: BitConfig | None, hw: str,
              ctx: int, depth: float, keys: list[int]) -> dict[str, Any]:
    key = {"version": PROMPT_VERSION, "model": src.name, "config": cfg.name, "kv": cfg.kv,
           "bits": None if bits is None else bits.model_dump_json(), "hw": hw,
           "context": ctx, "depth": depth, "keys": keys}
    if cfg.kv is not None:  # the NPU's cells before CALLS_VERSION followed the run's depths
        key["calls"] = CALLS_VERSION
    return key


def _context_cells(job: _GroupJob, tok, builder: NeedleBuilder, cfg: NeedleConfig,
                   bc: BitConfig | None, ctx: int, progress) -> list[Cell]:
    src, hwc, depths, keys, out = job.src, job.hw, job.depths, job.keys, job.out
    found: dict[float, Cell] = {}
    cell_keys = {d: _cell_key(src, cfg, bc, hwc.name, ctx, d, keys) for d in depths}
    paths: dict[float, Path] = {}
    for d in depths:
        if out is not None:
            paths[d] = cell_path(out, cell_keys[d])
            if paths[d].exists():
                raw = json.loads(paths[d].read_text())
                found[d] = Cell.from_dict(raw)
                if "key" not in raw:  # an older kvsim's file at this key's path: its key
                    atomic_write_text(paths[d], json.dumps({**raw, "key": cell_keys[d]}))
    if len(found) == len(depths):
        return [found[d] for d in depths]
    t_start = time.perf_counter()
    runner = job.make_runner(src, cfg, bc, hwc, ctx, job.seed)
    cells = []
    try:
        prefix = builder.text(ctx, 1.0, keys[0]).ids  # the shared text: any key's
        done = 0
        for d in depths:
            if d in found:
                cells.append(found[d])
                continue
            t0 = time.perf_counter()
            first = builder.text(ctx, d, keys[0])
            # the snapshot at the last call boundary before the needle: each trial's calls
            # are then those of its whole text from position 0 (the runner's results may
            # depend on where its calls begin: the NPU's do)
            at = first.needle_at - first.needle_at % runner.chunk
            runner.feed(prefix[done:at])
            done = at
            snap = runner.snapshot()
            trials = []
            for key in keys:
                text = builder.text(ctx, d, key)
                rows = runner.feed(text.ids[done:], rows=len(text.answer))
                trials.append(score(tok, text, rows, key))
                runner.restore(snap)
            wall = time.perf_counter() - t0
            if not found and not cells:
                wall += t0 - t_start  # the first cell carries the set-up
            cell = Cell(cfg.name, cfg.label if cfg.kv else None, cfg.kv_read, ctx, d,
                        first.needle_at, trials, round(wall, 3))
            if out is not None:
                paths[d].parent.mkdir(parents=True, exist_ok=True)
                atomic_write_text(paths[d], json.dumps({**cell.as_dict(), "key": cell_keys[d]}))
            if progress is not None:
                progress(_cell_line(cell))
            cells.append(cell)
    finally:
        runner.close()
    return cells


__all__ = ["ANSWER", "DEFAULT_CONTEXTS", "DEFAULT_DEPTHS", "DEFAULT_TRIALS", "FILLER",
           "ReadPathPair", "cached_cells", "read_path_pairs",
           "INSTRUCTION", "NEEDLE", "QUESTION", "Cell", "FloatRunner", "NeedleBuilder",
           "NeedleConfig", "NeedleText", "NpuRunner", "Trial", "bits_label", "cell_path",
           "run_grid", "score", "trial_keys"]
