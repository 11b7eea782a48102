"""Run a serving config: workload -> compiled model (with the batch buffers) -> KV block
pool -> step cost model -> the serving simulation -> metrics, ``requests.csv``,
``trace.json`` and ``report.html``.

Timing-only throughout (``functional=False``): serving is about time and bytes.
"""

from __future__ import annotations

import csv
import io
import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from isa.instructions import HostRead, HostWrite, Program
from kvsim.errors import ConfigError
from kvsim.files import write_output_set
from models.bits import BitConfig
from models.compiler import CompiledModel, CompileError
from models.compiler.compiled import build_memory_map
from models.compiler.dram import batch_memory_map
from models.compiler.driver import StepSeq
from models.config import ModelConfig
from models.skip import subset_config
from models.source import ModelSource
from sim.app.check import run_source
from sim.app.serve.config import ServeConfig
from sim.device.device import Device
from sim.device.hw import HardwareConfig
from sim.progress import Phases
from sim.runtime.ready import ready_model, source_of
from sim.runtime.speculative.spec import DraftSpec
from sim.serving.blocks import KvGeometry, kv_geometry
from sim.serving.costs import StepCostModel
from sim.serving.engine import ServingSim, StepRecord
from sim.serving.scheduler import Request, SchedulerConfig
from sim.serving.speculate import SpecCosts, SpecPolicy, speculation_metrics
from sim.serving.workload import make_requests
from traces.serving_results import (
    ChipFigures,
    HttpServingMetrics,
    KvPoolFigures,
    OccupancySeries,
    ServingCompiledFigures,
    ServingCpuFigures,
    ServingFigures,
    ServingMetrics,
    ServingWallFigures,
)
from traces.speculation_results import ServingSpeculationFigures

#: Token count the compiler first fits its token tile under (grown while the tile fills it).
FIRST_TILE_PROBE = 8
#: Largest single host-link DMA of a swap (the instruction's byte count is 32-bit).
SWAP_DMA_BYTES = 1 << 30
#: Most points of each chip's KV occupancy series in metrics.json (the trace has all).
SERIES_POINTS = 2000


@dataclass
class ServeResult:
    """A serving run's config, its typed results (what ``metrics.json`` holds), its
    requests and steps."""

    config: ServeConfig | None
    metrics: ServingMetrics | HttpServingMetrics
    requests: list[Request]
    steps: list[list[StepRecord]]
    geometry: KvGeometry
    cost: StepCostModel | None = field(default=None, repr=False)


def compile_for_serving(model: str | Path | ModelSource | ModelConfig, bits: BitConfig,
                        hw: HardwareConfig, *, kv: str, core_mode: str, cap: int,
                        max_tokens: int, max_seqs: int,
                        tile_bytes: int | None = None) -> CompiledModel:
    """Compile ``model`` (timing-only, one cache slot of ``cap`` tokens:
    :func:`sim.runtime.ready.ready_model`) and give it the buffers of a batched step of up
    to ``max_tokens`` tokens and ``max_seqs`` sampling sequences
    (:func:`models.compiler.dram.batch_memory_map`)."""
    src = source_of(model)
    probe = FIRST_TILE_PROBE
    while True:
        ms = min(probe, cap, max_tokens)
        cm = ready_model(src, hw, bits=bits, kv=kv, core_mode=core_mode, max_seq=ms, cap=cap,
                         tile_bytes=tile_bytes, functional=False).compiled
        if cm.m_tile < ms or ms == min(cap, max_tokens):
            break
        probe *= 4  # the tile filled the probe: it may hold more tokens
    max_seq = max(max_tokens, cm.m_tile)
    mm = batch_memory_map(
        lambda n: build_memory_map(cm.model, cm.bits, cm.kv, cap=cm.cap, slots=cm.slots,
                                   max_seq=n, m_tile=cm.m_tile),
        max_tokens=max_seq, max_seqs=max_seqs, hidden=cm.model.hidden_size,
        vocab=cm.model.vocab_size, residual_bytes=cm.numerics.residual_bytes)
    cm = replace(cm, max_seq=max_seq, mm=mm, programs={})
    if cm.mm.total_bytes > hw.dram.capacity_bytes:
        raise CompileError(f"the model with its serving buffers needs "
                           f"{cm.mm.total_bytes / 2**30:.2f} GiB of DRAM; {hw.name} has "
                           f"{hw.dram.capacity_bytes / 2**30:.2f} GiB")
    return cm


class SwapCost:
    """PCIe time of moving KV blocks between device DRAM and host memory, from the device
    model (a host-link DMA of the bytes, ``out``: device -> host)."""

    def __init__(self, cm: CompiledModel, hw: HardwareConfig):
        self.cm, self.hw = cm, hw
        kv = [r for r in cm.mm.regions if r.kind == "kv_cache"]
        self.addr = kv[0].base if kv else 0
        self._memo: dict[tuple[str, int], int] = {}

    def __call__(self, direction: str, nbytes: int) -> int:
        key = (direction, nbytes)
        if key not in self._memo:
            ins = []
            for off in range(0, nbytes, SWAP_DMA_BYTES):
                n = min(SWAP_DMA_BYTES, nbytes - off)
                ins.append(HostRead(src=self.addr, dst=0, nbytes=n) if direction == "out"
                           else HostWrite(src=0, dst=self.addr, nbytes=n))
            dev = Device(self.hw, functional=False,
                         layout=self.cm.layout(host_bytes=self.hw.host.memory_bytes))
            self._memo[key] = dev.run(Program(tuple(ins), name=f"swap {direction}"),
                                      validate=False).duration_ps
        return self._memo[key]


def _percentiles(values: list[float], prefix: str) -> dict[str, float]:
    if not values:
        return {f"{prefix}_p{q}": 0.0 for q in (50, 90, 99)} | {f"{prefix}_mean": 0.0}
    a = np.asarray(values, dtype=np.float64)
    out = {f"{prefix}_p{q}": float(np.percentile(a, q)) for q in (50, 90, 99)}
    out[f"{prefix}_mean"] = float(a.mean())
    return out


def request_records(requests: list[Request]) -> list[dict[str, Any]]:
    """One row per request (times in seconds)."""
    rows = []
    for r in sorted(requests, key=lambda r: r.rid):
        arrival = r.arrival_ps / 1e12
        first = r.first_token_ps / 1e12 if r.first_token_ps is not None else None
        finish = r.finish_ps / 1e12 if r.finish_ps is not None else None
        tpot = ((finish - first) / (r.output_tokens - 1)
                if first is not None and finish is not None and r.output_tokens > 1 else None)
        rows.append({
            "rid": r.rid, "chip": r.chip, "arrival_s": arrival,
            "prompt_tokens": r.prompt_tokens, "output_tokens": r.output_tokens,
            "generated_tokens": r.generated,
            "first_token_s": first, "finish_s": finish,
            "ttft_s": first - arrival if first is not None else None,
            "tpot_s": tpot, "e2e_s": finish - arrival if finish is not None else None,
            "preemptions": r.preemptions, "recomputed_tokens": r.recomputed_tokens,
            "swapped_out_bytes": r.swapped_out_bytes, "swapped_in_bytes": r.swapped_in_bytes,
        })
    return rows


def _series(steps: list[StepRecord], points: int) -> OccupancySeries:
    """KV blocks in use over time (after each step), at most ``points`` points: each kept
    point is the largest of the steps it stands for."""
    t = [s.end_ps / 1e12 for s in steps]
    u = [s.used_blocks for s in steps]
    if len(t) > points:
        k = -(-len(t) // points)
        t = [t[min(i + k, len(t)) - 1] for i in range(0, len(t), k)]
        u = [max(u[i:i + k]) for i in range(0, len(u), k)]
    return OccupancySeries(t_s=tuple(t), used_blocks=tuple(u))


def serving_metrics(requests: list[Request], steps: list[list[StepRecord]],
                    geo: KvGeometry, *,
                    speculation: ServingSpeculationFigures | None = None) -> ServingFigures:
    """The ``serving`` figures of a finished simulation (``speculation``: what its drafts
    did, :func:`sim.serving.speculate.speculation_metrics`)."""
    rows = request_records(requests)
    end = max((r.finish_ps for r in requests if r.finish_ps is not None), default=0)
    duration = end / 1e12
    out_tokens = sum(r.generated for r in requests)
    every = [s for chip in steps for s in chip]
    computed = sum(s.tokens for s in every)
    prompt = sum(r.prompt_computed for r in requests)
    decode = sum(r.decode_computed for r in requests)
    recomputed = sum(r.recomputed_tokens for r in requests)
    rejected = sum(r.rejected_tokens for r in requests)  # drafts computed and cut
    busy = [sum(s.end_ps - s.start_ps for s in chip) for chip in steps]
    m: dict[str, Any] = {
        "requests": len(requests),
        "finished_requests": sum(1 for r in requests if r.state == "finished"),
        "duration_s": duration,
        "output_tokens": out_tokens,
        "output_tokens_per_s": out_tokens / duration if duration else 0.0,
        "requests_per_s": len(requests) / duration if duration else 0.0,
        "total_tokens_per_s": (sum(r.prompt_tokens for r in requests) + out_tokens)
        / duration if duration else 0.0,
    }
    m |= _percentiles([r["ttft_s"] for r in rows if r["ttft_s"] is not None], "ttft_s")
    m |= _percentiles([r["tpot_s"] for r in rows if r["tpot_s"] is not None], "tpot_s")
    m |= _percentiles([r["e2e_s"] for r in rows if r["e2e_s"] is not None], "e2e_s")
    m |= {
        "num_preemptions": sum(r.preemptions for r in requests),
        "preempted_requests": sum(1 for r in requests if r.preemptions),
        "recomputed_tokens": recomputed,
        "swapped_out_bytes": sum(r.swapped_out_bytes for r in requests),
        "swapped_in_bytes": sum(r.swapped_in_bytes for r in requests),
        "swapped_bytes": sum(r.swapped_out_bytes + r.swapped_in_bytes for r in requests),
        "swap_time_s": sum(s.swap_ps for s in every) / 1e12,
        # work done: every token the device computed = prompt + decode + recomputation
        "computed_tokens": computed,
        "prompt_tokens_computed": prompt,
        "decode_tokens_computed": decode,
        "prefill_tokens": prompt + recomputed,
        "steps": len(every),
        "mean_batch_tokens": computed / len(every) if every else 0.0,
        "mean_decode_batch": (sum(s.decode_seqs for s in every) / len(every)
                              if every else 0.0),
        "kv": KvPoolFigures(**geo.describe()),
        "kv_peak_used_blocks": max((s.used_blocks for s in every), default=0),
        "kv_peak_occupancy": (max((s.used_blocks for s in every), default=0)
                              / geo.num_blocks if geo.num_blocks else 0.0),
        "kv_mean_occupancy": _mean_occupancy(steps, geo),
        "chips": tuple(ChipFigures(chip=i, requests=sum(1 for r in requests if r.chip == i),
                                   steps=len(chip), busy_s=busy[i] / 1e12,
                                   utilization=busy[i] / end if end else 0.0)
                       for i, chip in enumerate(steps)),
        "kv_occupancy": MappingProxyType({f"chip{i}": _series(chip, SERIES_POINTS)
                                          for i, chip in enumerate(steps)}),
    }
    if computed != prompt + decode + recomputed + rejected:
        raise AssertionError("token accounting does not add up")
    return ServingFigures(**m, speculation=speculation)


def _mean_occupancy(steps: list[list[StepRecord]], geo: KvGeometry) -> float:
    """Time-weighted mean of the blocks in use, over the busy time of every chip."""
    num = den = 0
    for chip in steps:
        for s in chip:
            num += s.used_blocks * (s.end_ps - s.start_ps)
            den += s.end_ps - s.start_ps
    return num / den / geo.num_blocks if den and geo.num_blocks else 0.0


@dataclass
class ServingParts:
    """What a serving simulation runs on, built from a config: the compiled model, the KV
    block pool, the step and swap cost models and the scheduler's settings."""

    cm: CompiledModel
    geometry: KvGeometry
    cost: StepCostModel
    swap: SwapCost
    scheduler: SchedulerConfig
    compile_s: float  # wall time of the compile
    cost_s: float  # wall time of the step cost model (its grid)
    #: ``[serving.speculate]``: the cost of drafts and tail cuts, and the draft policy
    spec: tuple[SpecCosts, SpecPolicy] | None = None


def prepare_serving(cfg: ServeConfig, max_len: int, *,
                    progress: Phases | None = None) -> ServingParts:
    """Compile the config's model for sequences of up to ``max_len`` tokens, and build the
    KV pool and the cost models (``progress`` hears the compile and the grid's points)."""
    s = cfg.serving
    hw = cfg.hardware
    src = run_source(cfg)  # the model, resolved once
    bits = cfg.bits.bit_config(cfg.kv)
    dspec = s.speculate.spec() if s.speculate is not None else None
    # a verification returns the logits of its every token: room for them in DRAM
    rows = s.max_num_seqs if dspec is None else min(s.max_num_seqs * (dspec.k + 1),
                                                    s.max_num_batched_tokens)
    if progress is not None:
        progress.start("compile")
    t0 = time.perf_counter()
    cm = compile_for_serving(src, bits, hw, kv=cfg.kv.format,
                             core_mode=cfg.compile.core_mode, cap=max_len,
                             max_tokens=s.max_num_batched_tokens, max_seqs=rows,
                             tile_bytes=cfg.compile.tile_bytes)
    compile_s = time.perf_counter() - t0
    try:
        geo = kv_geometry(cm, hw.dram.capacity_bytes, block_tokens=s.block_tokens,
                          max_tokens=max_len, budget_bytes=s.kv_budget_bytes)
    except ValueError as err:
        raise ConfigError(f"serving: {err}") from None
    c = s.cost
    t0 = time.perf_counter()
    cost = StepCostModel(cm, hw, max_seqs=rows, mode=c.mode,
                         extrapolate=c.extrapolate_layers, jobs=c.jobs,
                         cache_dir=c.cache_dir, progress=progress)
    spec = None if dspec is None else speculation_costs(cfg, dspec, src.config, bits, cm,
                                                         cost, max_len, progress)
    cost_s = time.perf_counter() - t0
    sched = SchedulerConfig(max_num_seqs=s.max_num_seqs,
                            max_num_batched_tokens=s.max_num_batched_tokens,
                            chunked_prefill=s.chunked_prefill, preemption=s.preemption)
    return ServingParts(cm, geo, cost, SwapCost(cm, hw), sched, compile_s, cost_s, spec)


def run_serving(cfg: ServeConfig, *, progress: Phases | None = None) -> ServeResult:
    """Compile, build the step-cost model, serve every request, gather the metrics;
    ``progress`` hears the phases (compile, the cost grid's points, requests finished)."""
    t_start = time.perf_counter()
    s = cfg.serving
    hw = cfg.hardware
    requests = make_requests(s.workload)
    longest = max(r.prompt_tokens + r.output_tokens for r in requests)
    max_len = s.max_model_len or longest
    if longest > max_len:
        raise CompileError(f"serving.max_model_len {max_len} is shorter than the longest "
                           f"request ({longest} tokens)")
    parts = prepare_serving(cfg, max_len, progress=progress)
    cm, geo, cost, c = parts.cm, parts.geometry, parts.cost, s.cost
    compile_s, cost_s = parts.compile_s, parts.cost_s
    if progress is not None:
        progress.start("serve requests", total=len(requests))
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    spec = parts.spec
    sim = ServingSim(requests, chips=s.chips, scheduler=parts.scheduler, geometry=geo,
                     step_cost=cost.step_ps, swap_cost=parts.swap, router=s.router,
                     plan_cost=(spec[0].plan_ps if spec is not None else
                                cost.plan_ps if c.mode == "grid" else None),
                     on_finish=None if progress is None else progress.advance,
                     spec=None if spec is None else spec[1])
    try:
        sim.run()
    except ValueError as err:  # a request that cannot fit the KV pool
        raise ConfigError(f"serving: {err}") from None
    sim_s = time.perf_counter() - t0
    sim_cpu_s = time.process_time() - cpu0
    steps = [chip.steps for chip in sim.chips]
    serving = serving_metrics(requests, steps, geo, speculation=None if spec is None else
                              speculation_metrics(requests, spec[0], spec[1].profile))
    cost_info = cost.describe()
    if c.validate_steps and c.mode == "grid":
        if progress is not None:
            progress.start("validate the cost model")
        cost_info["validation"] = validate_on_run(cost, steps, requests, c.validate_steps)
    name = cfg.model.preset or Path(cfg.model.hf_config).stem
    dspec = s.speculate.spec() if s.speculate is not None else None
    metrics = ServingMetrics(
        config=MappingProxyType(cfg.resolved()),
        scenario=(f"serve {len(requests)} requests: {name} {cfg.bits.label} "
                  f"kv={cfg.kv.format} on {s.chips} x {hw.name}, {s.preemption}"
                  + (f", speculative {dspec.text()}" if dspec is not None else "")),
        serving=serving,
        cost_model=MappingProxyType(cost_info),
        compiled=ServingCompiledFigures(m_tile_tokens=cm.m_tile, cache_tokens=cm.cap,
                                        weight_bytes=cm.mm.bytes_of_kind("weights"),
                                        max_step_tokens=cm.max_seq),
        wall_s=ServingWallFigures(total=time.perf_counter() - t_start, compile=compile_s,
                                  cost_model=cost_s, simulation=sim_s),
        # processor time of this process (a shared machine's wall time is not the code's)
        cpu_s=ServingCpuFigures(simulation=sim_cpu_s),
    )
    return ServeResult(cfg, metrics, requests, steps, geo, cost)


def speculation_costs(cfg: ServeConfig, dspec: DraftSpec, model, bits, cm: CompiledModel,
                      cost: StepCostModel, max_len: int, progress: Phases | None
                      ) -> tuple[SpecCosts, SpecPolicy]:
    """What speculation adds to a serving run: the cost of drafts and tail cuts (a
    self-draft's from its own step-cost grid: the layer-skipping model compiled as the
    verifier is) and the policy that draws each request's drafts."""
    s = cfg.serving
    assert s.speculate is not None
    profile = s.speculate.profile(where="serving.speculate")
    draft_cost = None
    if dspec.method == "self":
        keep = dspec.keep(model.num_layers, where="serving.speculate.drafter")
        dcm = compile_for_serving(subset_config(model, keep), bits, cfg.hardware,
                                  kv=cfg.kv.format, core_mode=cfg.compile.core_mode,
                                  cap=max_len, max_tokens=s.max_num_batched_tokens,
                                  max_seqs=s.max_num_seqs, tile_bytes=cfg.compile.tile_bytes)
        c = s.cost
        draft_cost = StepCostModel(dcm, cfg.hardware, max_seqs=s.max_num_seqs, mode="grid",
                                   extrapolate=c.extrapolate_layers, jobs=c.jobs,
                                   cache_dir=c.cache_dir, progress=progress)
    return (SpecCosts(dspec, cost, cm, cfg.hardware, draft_cost=draft_cost),
            SpecPolicy(profile, dspec.k, seed=s.speculate.seed))


def validate_on_run(cost: StepCostModel, steps: list[list[StepRecord]],
                    requests: list[Request], count: int) -> dict[str, Any]:
    """The grid model against direct simulation on ``count`` steps of the run, spread
    over it (their shapes rebuilt from the step records)."""
    every = [s for chip in steps for s in chip]
    if not every:
        return {}
    prompts = {r.rid: r.prompt_tokens for r in requests}
    picks = sorted({int(i) for i in np.linspace(0, len(every) - 1, count)})
    return summarize_validation(cost.validate([step_shape(every[i], every, prompts)
                                               for i in picks]))


def summarize_validation(rows: list[dict[str, Any]]) -> dict[str, Any]:
    errs = [abs(r["error"]) for r in rows]
    return {"shapes": rows, "max_abs_error": max(errs, default=0.0),
            "mean_abs_error": sum(errs) / len(errs) if errs else 0.0}


def step_shape(step: StepRecord, every: list[StepRecord],
               prompts: dict[int, int]) -> list[StepSeq]:
    """A step's batch (as :meth:`.scheduler.StepPlan.seqs` gives it) from the records:
    each request's cache position and sampled tokens replayed over the steps before it
    on the same chip (an item advances its request by its tokens and samples when it
    reaches the tokens the request knows; a recompute preemption empties its cache)."""
    pos: dict[int, int] = {}
    gen: dict[int, int] = {}
    for s in every:
        if s.chip != step.chip:
            continue
        if s.index == step.index:
            break
        if not s.swap_out_bytes:
            for rid in s.preempted:
                pos[rid] = 0
        for rid, n in s.items:
            pos[rid] = pos.get(rid, 0) + n
            if pos[rid] == prompts[rid] + gen.get(rid, 0):
                gen[rid] = gen.get(rid, 0) + 1
    items = list(step.items)
    dec = [(r, n) for r, n in items if n == 1]
    pre = [(r, n) for r, n in items if n != 1]
    return [StepSeq(0, n, pos.get(r, 0), pos.get(r, 0) + n == prompts[r] + gen.get(r, 0),
                    r + 1) for r, n in dec + pre]


#: Every file a serving run's output set may hold (``http_requests.csv``: a ``kvsim serve
#: --http`` run's, which an offline run into the same folder removes with the rest).
SERVE_OUTPUTS = ("http_requests.csv", "metrics.json", "requests.csv", "trace.json",
                 "report.html")


def serving_output_texts(result: ServeResult) -> dict[str, str]:
    """The output files of a serving run as text, by name (those its ``outputs`` ask
    for); ``metrics.json`` last."""
    from traces.serving_report import serving_report_html, serving_trace

    cfg = result.config
    want = cfg.outputs if cfg is not None else None
    texts: dict[str, str] = {}
    rows = request_records(result.requests)
    if want is None or want.requests_csv:
        texts["requests.csv"] = csv_text(rows)
    if want is None or want.trace:
        texts["trace.json"] = json.dumps(serving_trace(result.steps, result.geometry),
                                         separators=(",", ":"))
    if want is None or want.report:
        texts["report.html"] = serving_report_html(result.metrics, rows, result.steps,
                                                   result.geometry)
    texts["metrics.json"] = json.dumps(result.metrics.to_metrics(), indent=1) + "\n"
    return texts


def csv_text(rows: list[dict[str, Any]]) -> str:
    """``rows`` as CSV text (a header of the first row's keys; ``rid`` alone if none)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else ["rid"],
                       lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def write_serving_outputs(result: ServeResult, out_dir: str | Path, *,
                          flag: str = "--out") -> dict[str, Path]:
    """``metrics.json``, ``requests.csv``, ``trace.json``, ``report.html`` as one set
    (everything is serialised before the first file is written; the set is put in place
    whole or not at all, :func:`kvsim.files.write_output_set`; a failure is a
    :class:`kvsim.errors.OutputError`)."""
    written = write_output_set(out_dir, serving_output_texts(result), flag=flag,
                               members=SERVE_OUTPUTS)
    return {name.split(".")[0]: p for name, p in written.items()}
