"""Execute a :class:`RunConfig` and write its outputs (``metrics.json``, ``trace.json``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from isa.errors import KvsimError
from models.demo import demo_data, gemv_layer
from traces.chrome import chrome_trace
from traces.io import atomic_write_json, atomic_write_text
from traces.recorder import Recorder
from traces.report import run_report

from .config import RunConfig
from .device import Device
from .stats import LINKS
from .units import PS_PER_S, ps_to_s


@dataclass
class RunResult:
    config: RunConfig
    metrics: dict[str, Any]
    recorder: Recorder = field(repr=False)


def _engine_metrics(busy_ps: dict[str, int], total_ps: int) -> tuple[dict, dict]:
    busy = {k: ps_to_s(v) for k, v in sorted(busy_ps.items())}
    util = {k: (v / total_ps if total_ps else 0.0) for k, v in sorted(busy_ps.items())}
    return busy, util


def run_gemv(cfg: RunConfig) -> RunResult:
    hw = cfg.hardware
    w = cfg.workload
    functional = cfg.sim.fidelity == "functional"
    layer = gemv_layer(
        k=w.k,
        n=w.n,
        w_bits=w.w_bits,
        num_cores=hw.cores.num_cores,
        sram_bytes=hw.sram.bytes_per_core,
        dram_bytes=hw.dram.capacity_bytes,
        host_bytes=hw.host.memory_bytes,
        tile_bytes=w.tile_bytes,
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
    dram_bytes = st["traffic"].get("dram_read", 0) + st["traffic"].get("dram_write", 0)
    peak_ops = hw.cores.peak_ops_per_s(f"w{w.w_bits}a8")
    bound_dram_s = dram_bytes / hw.dram.effective_bytes_per_s
    bound_ops_s = st["ops"] / peak_ops
    busy, util = _engine_metrics(st["busy_ps"], total_ps)
    metrics = {
        "config": cfg.resolved(),
        "scenario": layer.program.name,
        "sim_time_s": total_ps / PS_PER_S,
        "sim_time_ps": total_ps,
        "traffic_bytes": {k: st["traffic"].get(k, 0) for k in LINKS}
        | {k: v for k, v in st["traffic"].items() if k not in LINKS},
        "traffic_by_kind": dict(sorted(st["by_kind"].items())),
        "engine_busy_s": busy,
        "engine_utilization": util,
        "instructions": st["instructions"],
        "ops": st["ops"],
        "weight_bytes": layer.weight_bytes(),
        "weight_stream_bytes_per_s": layer.weight_bytes() / ps_to_s(total_ps),
        "roofline": {
            "dram_bound_s": bound_dram_s,
            "compute_bound_s": bound_ops_s,
            "bound_s": max(bound_dram_s, bound_ops_s),
        },
        "functional_check": check,
        "trace": {"level": recorder.level, "dropped_events": recorder.dropped},
    }
    return RunResult(cfg, metrics, recorder)


def run(cfg: RunConfig) -> RunResult:
    if cfg.workload.kind == "gemv":
        return run_gemv(cfg)
    raise KvsimError(f"workload.kind: {cfg.workload.kind!r} is not supported")


def write_outputs(result: RunResult, out_dir: str | Path) -> dict[str, Path]:
    """Write ``metrics.json``, ``trace.json`` and ``report.html`` (each atomically) into
    ``out_dir``."""
    out = Path(out_dir)
    paths = {"metrics": out / "metrics.json", "report": out / "report.html"}
    trace_text = None
    if result.recorder.level != "off":
        trace = chrome_trace(result.recorder, counter_bins=result.config.outputs.counter_bins)
        trace_text = json.dumps(trace, separators=(",", ":"))
        paths["trace"] = out / "trace.json"
    # Serialise everything before touching the disk, so an error leaves no files.
    metrics_text = json.dumps(result.metrics, indent=1)
    report_text = run_report(result.metrics, result.recorder,
                             bins=result.config.outputs.counter_bins)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(paths["report"], report_text)
    if trace_text is not None:
        atomic_write_text(paths["trace"], trace_text)
    atomic_write_text(paths["metrics"], metrics_text + "\n")
    return paths


__all__ = ["RunResult", "run", "write_outputs", "atomic_write_json"]
