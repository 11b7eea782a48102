"""Memory of long runs: peak resident memory (RSS) of a long timing-only decode run with
tracing off, its growth per call, and the same run with tracing on, bounded by
``max_trace_events``; and, where ``sim.serving`` exists, a serving run of many requests.

    python benchmarks/long_run_memory.py [--steps 2000] [--requests 10000] [--json]

Each scenario runs in a fresh process, so each peak is its own (the interpreter, numpy,
numba and the simulator's modules take about 150 MiB before any work). The bound to meet:
a long run with tracing off stays under 1 GiB.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

GIB = 1 << 30
LIMIT_BYTES = GIB
PROMPT = 16


def _rss_bytes() -> tuple[int, int]:
    """(current, peak) resident bytes of this process (Linux /proc; ru_maxrss elsewhere)."""
    cur = peak = 0
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                cur = int(line.split()[1]) * 1024
            elif line.startswith("VmHWM:"):
                peak = int(line.split()[1]) * 1024
    except OSError:
        pass
    ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    ru_bytes = ru if sys.platform == "darwin" else ru * 1024
    return cur or ru_bytes, peak or ru_bytes


def decode_run(steps: int, trace: str, max_events: int) -> dict:
    """Prefill 16 tokens of the tiny model on the aries preset (timing only), then ``steps``
    decode calls through the runtime; RSS at checkpoints."""
    import numpy as np

    from models.bits import build_bit_config
    from models.compiler import HardwareTarget, compile_model
    from models.source import load_preset
    from sim.device.hw import load_hardware
    from sim.runtime import Accelerator, Model
    from traces.recorder import Recorder

    hw = load_hardware("aries")
    cfg = load_preset("tiny")
    cap = -(-(PROMPT + steps + 1) // 256) * 256
    cm = compile_model(cfg, build_bit_config({}), HardwareTarget.from_hw(hw), max_seq=PROMPT,
                       cap=cap, functional=False)
    recorder = Recorder(level=trace, max_events=max_events)
    acc = Accelerator(hw=hw, functional=False, recorder=recorder)
    model = Model(cm)
    model.launch(acc)
    model.infer(np.zeros((PROMPT, cfg.hidden_size), np.float32), cache_size=0)
    x = np.zeros((1, cfg.hidden_size), np.float32)
    start_rss = _rss_bytes()[0]
    checkpoints = []
    t0 = time.perf_counter()
    every = max(1, steps // 8)
    for i in range(steps):
        model.infer(x, cache_size=PROMPT + i)
        if (i + 1) % every == 0 or i + 1 == steps:
            checkpoints.append((i + 1, _rss_bytes()[0]))
    wall = time.perf_counter() - t0
    cur, peak = _rss_bytes()
    half = next((c for c in checkpoints if c[0] >= steps // 2), checkpoints[0])
    growth = (checkpoints[-1][1] - half[1]) / max(1, checkpoints[-1][0] - half[0])
    return {
        "scenario": f"decode {steps} steps, trace={trace}"
                    + (f", max_trace_events={max_events:,}" if trace != "off" else ""),
        "steps": steps, "wall_s": wall, "simulated_s": acc.now_s,
        "rss_after_setup_bytes": start_rss, "rss_end_bytes": cur, "peak_rss_bytes": peak,
        "growth_bytes_per_step": growth, "calls": acc.num_calls,
        "call_records_kept": len(acc.calls),
        "trace_events": len(recorder.spans) + recorder.byte_records,
        "dropped_events": recorder.dropped,
        "checkpoints": checkpoints,
    }


def serving_run(requests: int) -> dict:
    """The embedded default serving scenario (Qwen2.5-0.5B W8 on one ARIES chip, 512 prompt
    + 128 output tokens per request, all at once) with ``requests`` requests, tracing and
    every output file off (needs ``sim.serving``)."""
    scenario = f"serving {requests:,} requests, trace off"
    try:
        from sim.app.serve.config import load_serve_config
        from sim.app.serve.run import run_serving
    except ImportError as err:
        return {"scenario": scenario, "skipped": f"sim.serving is not available ({err})"}
    t0 = time.perf_counter()
    cfg = load_serve_config(None, [f"serving.workload.requests={requests}",
                                   "outputs.trace=false", "outputs.report=false",
                                   "outputs.requests_csv=false"])
    start_rss = _rss_bytes()[0]
    result = run_serving(cfg)
    cur, peak = _rss_bytes()
    return {"scenario": scenario, "wall_s": time.perf_counter() - t0,
            "rss_after_setup_bytes": start_rss, "rss_end_bytes": cur, "peak_rss_bytes": peak,
            "simulated_s": result.metrics.serving.duration_s,
            "steps": result.metrics.serving.steps}


def _child(args: list[str]) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True,
                         text=True)
    if out.returncode != 0:
        return {"scenario": " ".join(args), "error": out.stderr.strip().splitlines()[-1:]}
    return json.loads(out.stdout)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2000, help="decode steps (default 2000)")
    p.add_argument("--requests", type=int, default=10_000, help="serving requests")
    p.add_argument("--max-trace-events", type=int, default=100_000)
    p.add_argument("--json", action="store_true")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        kind, *rest = a.child
        res = (decode_run(int(rest[0]), rest[1], int(rest[2])) if kind == "decode"
               else serving_run(int(rest[0])))
        print(json.dumps(res))
        return
    results = [
        _child(["decode", str(a.steps), "off", "0"]),
        _child(["decode", str(a.steps), "tiles", str(a.max_trace_events)]),
        _child(["serving", str(a.requests)]),
    ]
    if a.json:
        print(json.dumps(results, indent=1))
        return
    mib = 1 / (1 << 20)
    for r in results:
        print(r["scenario"])
        if "skipped" in r or "error" in r:
            print(f"  {r.get('skipped') or r.get('error')}")
            continue
        print(f"  peak RSS {r['peak_rss_bytes'] * mib:,.0f} MiB "
              f"({'under' if r['peak_rss_bytes'] < LIMIT_BYTES else 'OVER'} the 1 GiB bound), "
              f"wall {r['wall_s']:.1f} s, simulated {r['simulated_s']:.4f} s")
        if "growth_bytes_per_step" in r:
            print(f"  RSS after setup {r['rss_after_setup_bytes'] * mib:,.0f} MiB, at the end "
                  f"{r['rss_end_bytes'] * mib:,.0f} MiB; growth "
                  f"{r['growth_bytes_per_step'] / 1024:,.2f} KiB per decode step "
                  f"({r['calls']:,} runtime calls, {r['call_records_kept']:,} records kept)")
            print(f"  trace events kept {r['trace_events']:,}, dropped "
                  f"{r['dropped_events']:,}")


if __name__ == "__main__":
    main()
