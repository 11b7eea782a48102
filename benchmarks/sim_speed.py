"""How fast does kvsim simulate? Instructions simulated per wall-clock second on a large
program (thousands of weight tiles), in timing-only and functional mode, on each engine
(``fast``, the default array loop; ``kernel``, the generator processes on the lean event
kernel; ``simpy``, the reference; their timelines are identical), per wall and per CPU
second (on a shared machine the wall time includes the neighbours). Validation is timed
apart from execution, and so is loading the compiled code of the array loop and of the
functional kernels (once per process, before the first measurement); peak RSS of the
process is printed at the end.

    python benchmarks/sim_speed.py [--k 8192] [--n 8192] [--tile-bytes 16384]
                                   [--engine fast simpy] [--json]
"""

from __future__ import annotations

import argparse
import json
import resource
import time

from isa.validate import validate_program
from models.demo import demo_data, gemv_layer
from sim.device.device import ENGINES, Device
from sim.device.hw import load_hardware
from traces.recorder import Recorder


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def measure(k: int, n: int, tile_bytes: int, functional: bool, trace: str,
            engine: str = "fast") -> dict:
    hw = load_hardware("aries")
    layer = gemv_layer(k=k, n=n, w_bits=8, num_cores=hw.cores.num_cores,
                       sram_bytes=hw.sram.bytes_per_core, dram_bytes=hw.dram.capacity_bytes,
                       host_bytes=hw.host.memory_bytes, tile_bytes=tile_bytes)
    dev = Device(hw, functional=functional, layout=layer.layout, recorder=Recorder(trace),
                 engine=engine)
    if functional:
        data = demo_data(layer, 0)
        dev.mem.dram.write(layer.w_dram, data["w_bytes"])
    t0 = time.perf_counter()
    validate_program(layer.program, layer.layout)
    validate_wall = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), time.process_time()
    run = dev.run(layer.program, validate=False)
    wall = time.perf_counter() - t0
    # CPU time too: on a shared machine the wall time measures the neighbours
    cpu = time.process_time() - c0
    return {
        "engine": engine,
        "mode": "functional" if functional else "timing",
        "trace": trace,
        "instructions": len(layer.program),
        "weight_tiles": sum(1 for i in layer.program if type(i).__name__ == "Gemm"),
        "simulated_s": run.duration_ps / 1e12,
        "simulated_end_ps": run.end_ps,
        "validate_wall_s": validate_wall,
        "wall_s": wall,
        "cpu_s": cpu,
        "instructions_per_wall_s": len(layer.program) / wall,
        "instructions_per_cpu_s": len(layer.program) / cpu,
        "simulated_bytes_per_wall_s": layer.weight_bytes() / wall,
    }


def warm_up(engines: list[str], hw_name: str = "aries") -> float:
    """Wall seconds to load (or compile) the code the measurements run, not measured: the
    array loop (one tiny program on the measured hardware: the loop is compiled once per
    kind of argument, and a preset's DRAM model decides some of them, so a warm-up on
    another preset could leave a load inside the first measurement) and the functional
    kernels (a small functional GEMV: otherwise the first functional run loads them)."""
    from isa.instructions import DmaLoad, Program

    t0 = time.perf_counter()
    hw = load_hardware(hw_name)
    if "fast" in engines:
        Device(hw, functional=False).run(
            Program((DmaLoad(core=0, src=0, dst=0, nbytes=64),)), validate=False)
    measure(512, 8 * hw.cores.num_cores, 4096, functional=True, trace="off", engine=engines[0])
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--k", type=int, default=8192)
    p.add_argument("--n", type=int, default=8192)
    p.add_argument("--tile-bytes", type=int, default=16384)
    p.add_argument("--engine", nargs="+", choices=ENGINES, default=list(ENGINES))
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    jit_wall = warm_up(a.engine)
    rows = [
        measure(a.k, a.n, a.tile_bytes, functional=f, trace=t, engine=e)
        for e in a.engine
        for f, t in ((False, "off"), (False, "ops"), (True, "off"))
    ]
    if a.json:
        print(json.dumps({"rows": rows, "jit_load_wall_s": jit_wall,
                          "peak_rss_bytes": peak_rss_bytes()}, indent=1))
        return
    print(f"GEMV {a.n}x{a.k} int8 on aries, {a.tile_bytes}-byte weight tiles "
          f"(array loop and kernels loaded in {jit_wall:.2f} s, before measuring)")
    for r in rows:
        print(f"  {r['engine']:5s} {r['mode']:10s} trace={r['trace']:4s} "
              f"{r['instructions']:6d} instr ({r['weight_tiles']} tiles) in "
              f"{r['wall_s']:.2f} s wall: {r['instructions_per_wall_s']:,.0f} instr/s "
              f"({r['instructions_per_cpu_s']:,.0f} per CPU s), "
              f"simulated {r['simulated_s'] * 1e6:.1f} us "
              f"(validation {r['validate_wall_s']:.2f} s)")
    print(f"peak RSS {peak_rss_bytes() / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
