"""Speed of kvsim's serving simulation (not a test): 1,000 requests of 512 prompt and 128
output tokens, all at once, on one ARIES chip (Qwen2.5-0.5B W8, configs/serving-qwen.toml),
with the step-cost grid warm (already built and cached) and, with ``--cold``, built afresh.

Prints the wall time (total and its parts: compile, step-cost model, simulation), the
requests simulated per second of wall and of processor time (the serving loop alone),
the grid's build time (wall; with ``--cold`` also the processor time of its workers),
the simulated figures, and the peak memory of the process (``ru_maxrss``).

    python benchmarks/serving.py [--kv int8] [--requests 1000] [--cold] [--json]
    python benchmarks/serving.py --validate 8   # and the grid's error on 8 of the run's steps
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.app.serve.config import load_serve_config  # noqa: E402
from sim.app.serve.run import run_serving  # noqa: E402
from sim.progress import Phases, progress_enabled  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "serving-qwen.toml"))
    ap.add_argument("--kv", default=None, help="KV format (default: the config's)")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--cold", action="store_true", help="build the step-cost grid afresh "
                    "(in a temporary cache folder) before the timed run")
    ap.add_argument("--validate", type=int, default=0, metavar="N",
                    help="after the run, simulate N of its steps directly (slow)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sets = [f"serving.workload.requests={args.requests}", *args.set]
    if args.kv:
        sets.append(f"kv.format={args.kv}")
    if args.validate:
        sets.append(f"serving.cost.validate_steps={args.validate}")
    tmp = None
    if args.cold:
        tmp = tempfile.TemporaryDirectory()
        sets.append(f"serving.cost.cache_dir={tmp.name}")
    cfg = load_serve_config(args.config, sets)
    t0 = time.perf_counter()
    with Phases(enabled=progress_enabled()) as ph:
        result = run_serving(cfg, progress=ph)
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    m = result.metrics.to_metrics()  # the metrics.json tree
    s = m["serving"]
    sim_wall, sim_cpu = m["wall_s"]["simulation"], m["cpu_s"]["simulation"]
    out = {
        "scenario": m["scenario"], "wall_s": wall, "wall_parts_s": m["wall_s"],
        "peak_memory_bytes": peak, "grid_cached": m["cost_model"]["cache_hit"],
        "grid_points": m["cost_model"]["grid_points"],
        "grid_build_s": m["cost_model"]["build_s"],
        "grid_workers_cpu_s": kids.ru_utime + kids.ru_stime if args.cold else None,
        "simulated_requests_per_wall_s": s["requests"] / sim_wall if sim_wall else 0.0,
        "simulated_requests_per_cpu_s": s["requests"] / sim_cpu if sim_cpu else 0.0,
        "steps": s["steps"],
        "simulated_s": s["duration_s"], "output_tokens_per_s": s["output_tokens_per_s"],
        "ttft_s_p50": s["ttft_s_p50"], "tpot_s_p50": s["tpot_s_p50"],
        "num_preemptions": s["num_preemptions"],
    }
    if "validation" in m["cost_model"]:
        out["grid_error_max"] = m["cost_model"]["validation"]["max_abs_error"]
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{out['scenario']}")
    print(f"wall time: {wall:.1f} s (compile {m['wall_s']['compile']:.1f} s, step-cost model "
          f"{m['wall_s']['cost_model']:.1f} s{' (cached)' if out['grid_cached'] else ''}, "
          f"simulation {m['wall_s']['simulation']:.1f} s), {s['steps']:,} steps")
    print(f"serving loop: {out['simulated_requests_per_wall_s']:,.0f} requests/s of wall time, "
          f"{out['simulated_requests_per_cpu_s']:,.0f} of processor time ({sim_cpu:.2f} s)")
    if args.cold:
        print(f"cold grid: {out['grid_points']} points in {out['grid_build_s']:.1f} s "
              f"(workers' processor time {out['grid_workers_cpu_s']:.1f} s)")
    print(f"peak memory: {peak / 2**20:,.0f} MiB")
    print(f"simulated: {s['duration_s']:,.1f} s, {s['output_tokens_per_s']:,.1f} output "
          f"tokens/s, TTFT p50 {s['ttft_s_p50']:.2f} s, TPOT p50 "
          f"{s['tpot_s_p50'] * 1e3:.1f} ms, {s['num_preemptions']} preemptions")
    if "grid_error_max" in out:
        print(f"grid model error vs direct simulation: max {100 * out['grid_error_max']:.2f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
