"""Execute a :class:`RunConfig` and write its outputs (``metrics.json``, ``trace.json``,
``report.html``).

``workload.kind = "generate"`` compiles the model and runs it through the host runtime:
launch (weights over the host link), prefill of ``prompt_tokens`` in calls of at most
``max_sequence_length`` tokens, then ``output_tokens - 1`` decode calls (the first output
token comes from the prefill's logits). ``"gemv"`` runs the hand-written demo layer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from isa import kvformats
from kvsim.errors import KvsimError
from models.bits import default_numerics
from models.compiler import CompiledModel
from models.demo import demo_data, gemv_layer
from models.source import ModelSource
from sim.app.breakdown import Labelled, call_rows, time_breakdown
from sim.app.check import check_run, run_source
from sim.app.config import RunConfig, cache_length
from sim.device.device import Device
from sim.device.stats import LINKS
from sim.runtime import CallRecord, Model, ModelConfig
from sim.runtime.ready import ReadyModel, ready_model
from sim.units import PS_PER_S, ps_to_s
from traces.chrome import chrome_trace_json
from traces.recorder import Recorder
from traces.report import run_report
from traces.results import (
    Bound,
    CacheOpRecord,
    ClientFigures,
    CompiledFigures,
    ContextFigures,
    DecodeFigures,
    GemvMetrics,
    GenerateMetrics,
    KvCacheFigures,
    LaunchFigures,
    PrefillFigures,
    RooflineFigures,
    TraceFigures,
    WeightsFigures,
)


@dataclass
class RunResult:
    """A run's config, its typed results (what ``metrics.json`` holds) and its events."""

    config: RunConfig
    metrics: GenerateMetrics | GemvMetrics
    recorder: Recorder = field(repr=False)


def _engine_metrics(busy_ps: dict[str, int], total_ps: int) -> tuple[Any, Any]:
    busy = {k: ps_to_s(v) for k, v in sorted(busy_ps.items())}
    util = {k: (v / total_ps if total_ps else 0.0) for k, v in sorted(busy_ps.items())}
    return MappingProxyType(busy), MappingProxyType(util)


def _traffic(traffic: dict[str, int]) -> Any:
    """Bytes per link, the links of :data:`LINKS` first (0 when unused), then the others."""
    return MappingProxyType({k: traffic.get(k, 0) for k in LINKS}
                            | {k: v for k, v in traffic.items() if k not in LINKS})


def _sum_stats(calls: list[CallRecord]) -> dict:
    out: dict[str, Any] = {"traffic": {}, "by_kind": {}, "busy_ps": {}, "ops": 0}
    for c in calls:
        for key in ("traffic", "by_kind", "busy_ps"):
            for k, v in c.stats.get(key, {}).items():
                out[key][k] = out[key].get(k, 0) + v
        out["ops"] += c.stats.get("ops", 0)
    return out


def roofline_s(stats: dict, hw, precision: str) -> Bound:
    """Lower bound of a program: ``max(DRAM bytes / DRAM bandwidth, ops / peak ops)``."""
    t = stats.get("traffic", {})
    dram = t.get("dram_read", 0) + t.get("dram_write", 0)
    d = dram / hw.dram.bound_bytes_per_s
    c = stats.get("ops", 0) / hw.cores.peak_ops_per_s(precision)
    return Bound(dram_bound_s=d, compute_bound_s=c, bound_s=max(d, c))


def ready_for_run(cfg: RunConfig, source: ModelSource) -> ReadyModel:
    """The model a run config describes (``source``: its model, resolved), compiled for the
    run: ``model.safetensors`` replaces the source's weights, ``model.weights_seed`` seeds
    synthetic ones, and without ``[bits.numerics]`` the numerics are those of the weights
    (:func:`models.bits.default_numerics`)."""
    m = cfg.model
    weights = ({"kind": "safetensors", "paths": m.safetensors} if m.safetensors
               else source.weight_spec(seed=m.weights_seed))
    bits = cfg.bits.bit_config(cfg.kv)
    if not cfg.bits.numerics:  # none named: the default for these weights
        bits = bits.model_copy(update={
            "numerics": default_numerics(weights.get("kind") != "synthetic")})
    cap = cache_length(cfg)
    return ready_model(
        source, cfg.hardware, bits=bits, kv=cfg.kv.format, core_mode=cfg.compile.core_mode,
        max_seq=min(cfg.compile.max_sequence_length, cap), cap=cap,
        slots=cfg.compile.cache_slots, tile_bytes=cfg.compile.tile_bytes,
        functional=cfg.sim.fidelity == "functional", weights=weights,
        store_programs=False,  # the run lowers the programs of its own calls
    )


def kv_metrics(cm: CompiledModel, tokens: int, hw) -> KvCacheFigures:
    """Bytes per token of the stored cache at ``tokens`` tokens (all layers), the
    compression against bf16, and how many tokens fit in the DRAM the model leaves free."""
    bf16 = kvformats.parse("bf16")
    per, ref = 0, 0
    for c in cm.kv_caches():
        if c.slot:
            continue
        per += c.heads * c.format.bytes(tokens, c.width)
        ref += c.heads * bf16.bytes(tokens, c.width)
    fixed = sum(r.size for r in cm.mm.regions if r.kind != "kv_cache")
    per_cap = sum(c.heads * c.format.max_bytes(cm.cap, c.width)
                  for c in cm.kv_caches() if not c.slot) / cm.cap
    return KvCacheFigures(
        format=cm.kv, context_tokens=tokens, bytes=per,
        bytes_per_token=per / tokens if tokens else 0.0, bf16_bytes=ref,
        compression_vs_bf16=ref / per if per else 0.0,
        capacity_tokens=int((hw.dram.capacity_bytes - fixed) // per_cap))


def run_generate(cfg: RunConfig, source: ModelSource | None = None,
                 checked: Any = None) -> RunResult:
    """A ``workload.kind = "generate"`` run of ``cfg`` (``source``: its model, resolved;
    default: resolved here, :func:`sim.app.check.run_source`); ``checked`` (a
    :class:`sim.app.check.Checked` of ``cfg``) carries a prompt text already tokenized by
    the check."""
    from sim.app.run_text import Guard, text_figures, with_prompt

    src = run_source(cfg) if source is None else source
    if checked is not None and checked.config is not None:
        cfg, prompt_ids, tok = checked.config, checked.prompt_ids, checked.tokenizer
    else:
        cfg, prompt_ids, tok = with_prompt(cfg, src)
    hw = cfg.hardware
    w = cfg.workload
    functional = cfg.sim.fidelity == "functional"
    ready = ready_for_run(cfg, src)
    cm = ready.compiled
    real = cm.weights.get("kind") != "synthetic"
    guard = Guard.for_run(cfg, real)
    recorder = Recorder(level=cfg.outputs.trace, max_events=cfg.outputs.max_trace_events)
    # speculation verifies drafts with the logits of every position of a call
    model = ready.launch(ModelConfig(all_logits=True) if cfg.speculate is not None else None,
                         recorder=recorder)
    acc = model.acc
    launch = acc.calls[-1]
    labelled = [Labelled(launch, "launch", 0, 0, 0)]
    cfgm = cm.model
    rng = np.random.default_rng(np.random.SeedSequence([w.seed, 0x70C5]))
    prompt = rng.integers(0, cfgm.vocab_size, size=w.prompt_tokens)
    if prompt_ids is not None:
        prompt = np.asarray(prompt_ids)

    def embeddings(tokens: np.ndarray) -> np.ndarray:
        if not functional:  # timing-only: the values are never read
            return np.zeros((len(tokens), cfgm.hidden_size), np.float32)
        return ready.embed(tokens)

    prefill_calls: list[CallRecord] = []
    # tokens in the cache (what infer's cache_size says), from the context on
    cache = fill_context(model, w.context_tokens, embeddings, functional, w.seed)
    seq = cache  # tokens of the sequence so far (what cache-op schedules count)
    logits = None
    pending = list(w.cache_ops)
    op_results: list[CacheOpRecord] = []

    def run_ops() -> None:
        nonlocal cache
        while pending and pending[0].at_token == seq:
            op = pending.pop(0)
            before = acc.num_calls
            res = run_cache_op(model, op, cache, functional)
            cache = res.new_cache_size
            labelled.extend(Labelled(c, "cache_op", len(op_results), 0, cache)
                            for c in acc.calls_since(before))
            op_results.append(CacheOpRecord(at_token=op.at_token, **res.as_metrics()))

    generated: list[int] = []
    decode_calls: list[CallRecord] = []
    speculated = None
    if cfg.speculate is not None:
        from sim.app.run_spec import decode_speculatively

        speculated = decode_speculatively(cfg, model, prompt, embeddings, guard, cache)
        prefill_calls, decode_calls = speculated.prefill_calls, speculated.decode_calls
        generated, cache = speculated.tokens, speculated.cache
        labelled.extend(speculated.labelled)
    for t0 in range(0, w.prompt_tokens if speculated is None else 0, cm.max_seq):
        chunk = prompt[t0 : t0 + cm.max_seq]
        logits = model.infer(embeddings(chunk), cache_size=cache)[0]
        prefill_calls.append(acc.calls[-1])
        cache += len(chunk)
        labelled.append(Labelled(acc.calls[-1], "prefill", len(prefill_calls) - 1,
                                 len(chunk), cache))
        seq += len(chunk)
        run_ops()
    if speculated is None:
        guard.logits(logits, "the prompt")
    for i in range(w.output_tokens if speculated is None else 0):
        token = int(np.argmax(logits)) if logits is not None else int(
            rng.integers(0, cfgm.vocab_size))
        generated.append(token)
        if i == w.output_tokens - 1:
            break
        logits = model.infer(embeddings(np.array([token])), cache_size=cache)[0]
        cache += 1
        seq += 1
        decode_calls.append(acc.calls[-1])
        labelled.append(Labelled(acc.calls[-1], "decode", len(decode_calls), 1, cache))
        run_ops()
        guard.logits(logits, f"output token {len(generated)}")
    work = prefill_calls + decode_calls
    start_ps, end_ps = work[0].start_ps, work[-1].end_ps
    st = _sum_stats(work)
    precision = "w8a8"
    ttft = (prefill_calls[-1].end_ps - prefill_calls[0].start_ps) / PS_PER_S
    # one call per token, or speculation's rounds: every output token after the first
    decode_tokens = len(decode_calls) if speculated is None else max(0, len(generated) - 1)
    tpot = (sum(c.end_ps - c.start_ps for c in decode_calls) / decode_tokens / PS_PER_S
            if decode_tokens else 0.0)
    busy, util = _engine_metrics(st["busy_ps"], end_ps - start_ps)
    prefill_stats = _sum_stats(prefill_calls)
    roof_prefill = roofline_s(prefill_stats, hw, precision)
    roof_decode = roofline_s(_sum_stats(decode_calls), hw, precision)
    per_token = max(1, decode_tokens)
    metrics = GenerateMetrics(
        config=MappingProxyType(cfg.resolved()),
        scenario=(f"{cfgm.name or cfgm.family} {cfg.bits.label} kv={cm.kv}: "
                  + (f"context {w.context_tokens} + " if w.context_tokens else "")
                  + f"prefill {w.prompt_tokens} + decode {w.output_tokens} on {hw.name}"),
        sim_time_s=(end_ps - start_ps) / PS_PER_S,
        launch=LaunchFigures(time_s=launch.time_s,
                             pcie_h2d_bytes=launch.stats.get("traffic", {}).get("pcie_h2d", 0)),
        context=ContextFigures(tokens=w.context_tokens,
                               cache_holds=context_contents(w.context_tokens, functional)),
        prefill=PrefillFigures(ttft_s=ttft, tokens=w.prompt_tokens, calls=len(prefill_calls),
                               tokens_per_s=w.prompt_tokens / ttft,
                               weight_bytes_per_token=prefill_stats["by_kind"].get(
                                   "weights", 0) / w.prompt_tokens),
        decode=DecodeFigures(tokens=decode_tokens, time_per_token_s=tpot,
                             tokens_per_s=1.0 / tpot if tpot else 0.0,
                             time_per_call_s=tuple(c.time_s for c in decode_calls)),
        client=client_figures(hw.stack, ttft, tpot if decode_tokens else None),
        traffic_bytes=_traffic(st["traffic"]),
        traffic_by_kind_bytes=MappingProxyType({
            k: st["by_kind"].get(k, 0) for k in ("weights", "kv_cache", "activations",
                                                 "host_io")}),
        kv_cache=kv_metrics(cm, cache, hw),
        roofline=RooflineFigures(
            prefill=roof_prefill,
            decode_per_token=Bound(dram_bound_s=roof_decode.dram_bound_s / per_token,
                                   compute_bound_s=roof_decode.compute_bound_s / per_token,
                                   bound_s=roof_decode.bound_s / per_token),
            bound_s=roof_prefill.bound_s + roof_decode.bound_s,
            dram_bytes_per_s=hw.dram.bound_bytes_per_s,
            peak_ops_per_s=hw.cores.peak_ops_per_s(precision)),
        calls=call_rows(labelled, lambda n: kv_metrics(cm, n, hw).bytes),
        time_breakdown=time_breakdown(labelled, hw),
        engine_busy_s=busy,
        engine_utilization=util,
        instructions=sum(c.stats.get("instructions", 0) for c in work),
        compiled=CompiledFigures(core_mode=cm.core_mode, max_sequence_tokens=cm.max_seq,
                                 cache_tokens=cm.cap, m_tile_tokens=cm.m_tile,
                                 weight_tile_bytes=cm.tile_bytes,
                                 decode_tile_bytes=cm.big_tile_bytes,
                                 dram_bytes=cm.mm.total_bytes,
                                 weight_bytes=cm.mm.bytes_of_kind("weights")),
        generated_tokens=tuple(generated),
        weights=WeightsFigures(kind=cm.weights.get("kind"), real=real),
        text=(text_figures(cfg, src, prompt_ids, tok, generated, guard) if functional
              else None),
        cache_ops=tuple(op_results),
        functional=functional,
        trace=TraceFigures(level=recorder.level, dropped_events=recorder.dropped),
        speculation=None if speculated is None else speculated.figures,
    )
    model.dispose()
    return RunResult(cfg, metrics, recorder)


def client_figures(stack, ttft_s: float, tpot_s: float | None) -> ClientFigures:
    """TTFT and time per output token as a client of a serving stack measures them
    (GenAI-Perf: TTFT from the request to the first streamed token; output tokens/s per
    user is 1 / the mean inter-token latency), from the card's figures (the runtime's calls:
    ``ttft_s``, ``tpot_s``) and the stack's costs (``hardware.stack``, ``StackConfig``)."""
    req, tok = stack.request_ns / 1e9, stack.token_ns / 1e9
    tpot = None if tpot_s is None else tpot_s + tok
    return ClientFigures(ttft_s=req + ttft_s + tok, stack_request_s=req, stack_token_s=tok,
                         time_per_token_s=tpot, tokens_per_s=None if not tpot else 1.0 / tpot)


def fill_context(model: Model, tokens: int, embeddings, functional: bool, seed: int) -> int:
    """Start the cache at ``tokens`` tokens of context (``workload.context_tokens``);
    returns the cache size. Timing-only: nothing is computed, the calls that follow just
    read a cache of that length (its bytes are not simulated). Functional: the device
    prefills ``tokens`` random tokens (seeded by ``seed``) in calls of at most
    ``max_sequence_length`` tokens, so the cache holds what the device itself writes for
    them; those calls are not part of the run's metrics (their time and traffic count in
    no phase)."""
    if not functional or not tokens:
        return tokens
    cm = model.compiled
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xC0A7]))
    context = rng.integers(0, cm.model.vocab_size, size=tokens)
    for t0 in range(0, tokens, cm.max_seq):
        model.infer(embeddings(context[t0 : t0 + cm.max_seq]), cache_size=t0)
    return tokens


def context_contents(tokens: int, functional: bool) -> str:
    """What the cache's first ``tokens`` tokens hold (see :func:`fill_context`)."""
    if not tokens:
        return "nothing"
    if functional:
        return "the device's own prefill of random tokens (not counted in the metrics)"
    return "no bytes (timing-only: only the cache length is simulated)"


def run_cache_op(model: Model, op, cache_size: int, functional: bool):
    """Execute one scheduled cache operation (``sim.app.config.CacheOp``) on a cache of
    ``cache_size`` tokens; returns its :class:`sim.runtime.cacheops.EditResult`."""
    from isa import kvformats
    from sim.runtime.cacheops import EditResult, evict_positions, requantize_through, score_eviction

    if op.op == "dump_load":
        acc = model.acc
        start = acc.device.env.now
        before = acc.num_calls
        model.load_cache_memory(model.dump_cache_memory())
        calls = acc.calls_since(before)
        t = _sum_stats(calls)["traffic"]
        return EditResult("dump_load", "host", (acc.device.env.now - start) / PS_PER_S,
                          t.get("pcie_h2d", 0) + t.get("pcie_d2h", 0),
                          t.get("dram_read", 0) + t.get("dram_write", 0),
                          new_cache_size=cache_size)
    if op.op == "requantize":
        fmt = kvformats.parse(op.format)
        if op.where == "device":
            return model.requantize_on_device(fmt, cache_size=cache_size)
        return model.edit_cache_on_host(requantize_through(fmt), cache_size=cache_size,
                                        op="host_requantize")
    # evict
    sinks, recent = op.sinks or 0, op.recent or 0
    if op.policy == "positions":
        drop = sorted(set(op.drop or []))
    else:
        middle = list(range(min(sinks, cache_size), max(sinks, cache_size - recent)))
        keep_mid = middle[: op.budget or 0] if op.policy == "key_norm" else []
        drop = [p for p in middle if p not in set(keep_mid)]
    if not drop:
        return EditResult("evict", op.where, 0.0, 0, 0, new_cache_size=cache_size)
    if op.where == "device":
        return model.evict_on_device(drop, cache_size=cache_size)
    if op.policy == "key_norm" and functional:
        fn = score_eviction(keep_sinks=sinks, keep_recent=recent, budget=op.budget or 0)
    else:
        fn = evict_positions(drop)
    res = model.edit_cache_on_host(fn, cache_size=cache_size, op="host_evict")
    if not functional:  # timing-only: the edit is not applied, its size is known
        res.new_cache_size = cache_size - len(drop)
    return res


def run_gemv(cfg: RunConfig) -> RunResult:
    """A ``workload.kind = "gemv"`` run: the hand-written demo layer on the device."""
    hw = cfg.hardware
    w = cfg.workload
    functional = cfg.sim.fidelity == "functional"
    layer = gemv_layer(
        k=w.k, n=w.n, w_bits=w.w_bits, num_cores=hw.cores.num_cores,
        sram_bytes=hw.sram.bytes_per_core, dram_bytes=hw.dram.capacity_bytes,
        host_bytes=hw.host.memory_bytes, tile_bytes=w.tile_bytes,
    )
    recorder = Recorder(level=cfg.outputs.trace, max_events=cfg.outputs.max_trace_events)
    dev = Device(hw, functional=functional, recorder=recorder, layout=layer.layout)
    data = demo_data(layer, w.seed) if functional else None
    if functional:
        # Weights are resident in DRAM before the call (loaded at model launch).
        dev.mem.dram.write(layer.w_dram, data["w_bytes"])
        scales = next(r for r in layer.layout.regions if r.name == "scales")
        dev.mem.dram.write(scales.base, data["scale"].view(np.uint8))
        dev.host_write(layer.x_host, data["x"].view(np.uint8))
    run = dev.run(layer.program)
    total_ps = run.duration_ps
    st = run.stats
    check = None
    if functional:
        y = dev.host_read(layer.y_host, w.n).view(np.int8)
        acc = data["w"].astype(np.int64) @ data["x"].astype(np.int64) * data["scale"]
        ref = np.clip((acc + (1 << (layer.shift - 1))) >> layer.shift, -128, 127)
        check = "match" if np.array_equal(y, ref) else "MISMATCH"
        if check != "match":
            raise KvsimError("functional result differs from the numpy reference")
    busy, util = _engine_metrics(st["busy_ps"], total_ps)
    # the one program as the run's one call, so its time breakdown reads as a run's
    call = [Labelled(CallRecord("gemv", run.start_ps, run.end_ps, st), "gemv", 0, 0, 0)]
    metrics = GemvMetrics(
        config=MappingProxyType(cfg.resolved()),
        scenario=layer.program.name,
        sim_time_s=total_ps / PS_PER_S,
        traffic_bytes=_traffic(st["traffic"]),
        traffic_by_kind_bytes=MappingProxyType(dict(sorted(st["by_kind"].items()))),
        engine_busy_s=busy,
        engine_utilization=util,
        instructions=st["instructions"],
        ops=st["ops"],
        weight_bytes=layer.weight_bytes(),
        weight_stream_bytes_per_s=layer.weight_bytes() / ps_to_s(total_ps),
        roofline=roofline_s(st, hw, f"w{w.w_bits}a8"),
        calls=call_rows(call, lambda n: 0),
        # the demo runs its program on the device directly: no runtime call overhead
        time_breakdown=time_breakdown(call, hw.model_copy(update={
            "host": hw.host.model_copy(update={"call_overhead_ns": 0.0})})),
        functional_check=check,
        trace=TraceFigures(level=recorder.level, dropped_events=recorder.dropped),
    )
    return RunResult(cfg, metrics, recorder)


def run(cfg: RunConfig) -> RunResult:
    """Run ``cfg`` after checking it (``sim.app.check.check_run``): bad input is a
    ``ConfigError`` naming the field, before anything is compiled or simulated. The
    model is resolved once (:func:`sim.app.check.run_source`), for the check and the run;
    a prompt text is checked at its real token count."""
    if cfg.workload.kind == "gemv":
        check_run(cfg)
        return run_gemv(cfg)
    src = run_source(cfg)
    checked = check_run(cfg, src)
    return run_generate(cfg, src, checked)


def render_outputs(result: RunResult) -> dict[str, str]:
    """The output files of a run as text, by name: ``metrics.json``, ``report.html`` and,
    unless the trace level is ``off``, ``trace.json``."""
    texts = {}
    if result.recorder.level != "off":
        texts["trace.json"] = chrome_trace_json(result.recorder,
                                                counter_bins=result.config.outputs.counter_bins)
    texts["report.html"] = run_report(result.metrics, result.recorder,
                                      bins=result.config.outputs.counter_bins)
    texts["metrics.json"] = json.dumps(result.metrics.to_metrics(), indent=1) + "\n"
    return texts


#: Every file a run's output set may hold (an earlier run's that this one lacks goes).
RUN_OUTPUTS = ("report.html", "trace.json", "metrics.json")


def write_outputs(result: RunResult, out_dir: str | Path, *,
                  flag: str = "--out") -> dict[str, Path]:
    """Write ``metrics.json``, ``trace.json`` and ``report.html`` into ``out_dir`` as one
    set (:func:`kvsim.files.write_output_set`: whole or not at all; a failure is a
    :class:`kvsim.errors.OutputError` naming ``flag``, the file and the folder)."""
    from kvsim.files import write_output_set

    # Serialise everything before touching the disk, so an error leaves no files.
    texts = render_outputs(result)
    ordered = {n: texts[n] for n in RUN_OUTPUTS if n in texts}  # metrics.json last
    written = write_output_set(out_dir, ordered, flag=flag, members=RUN_OUTPUTS)
    paths = {"metrics": written["metrics.json"], "report": written["report.html"]}
    if "trace.json" in written:
        paths["trace"] = written["trace.json"]
    return paths
