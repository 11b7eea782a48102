"""Wall time kvsim needs per simulated decode token (and per prefill), in timing-only and
in functional mode, for a model on a hardware preset, on each event kernel; each decode
token's wall time is split into the device's execution (``Device.run``) and the rest
(lowering the program, the runtime). Peak RSS is the process's so far. ``--model`` takes
any model name (a preset, ``smollm2-135m`` with its real weights, a GGUF file, a Hugging
Face folder); ``--mode functional`` measures only the functional runs.

    python benchmarks/model_speed.py [--model qwen2.5-0.5b] [--hw aries] [--tokens 4]
                                     [--engine fast simpy] [--mode timing functional]
    python benchmarks/model_speed.py --compile-only [--model qwen2.5-0.5b]
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import numpy as np

from models.bits import build_bit_config
from models.compiler import HardwareTarget, compile_model
from models.source import resolve_model
from sim.device.device import ENGINES, Device
from sim.device.hw import load_hardware
from sim.runtime import Accelerator, Model


def measure(model_name: str, hw_name: str, functional: bool, prompt: int, tokens: int,
            engine: str = "fast") -> dict:
    hw = load_hardware(hw_name)
    src = resolve_model(model_name)
    cfg = src.config
    t0, c0 = time.perf_counter(), time.process_time()
    cm = compile_model(cfg, build_bit_config({}), HardwareTarget.from_hw(hw),
                       max_seq=prompt, cap=prompt + tokens + 1, functional=functional,
                       weights=src.weight_spec())
    t_compile = time.perf_counter() - t0
    # CPU time too: on a shared machine the wall time measures the neighbours
    cpu_compile = time.process_time() - c0
    acc = Accelerator(hw=hw, functional=functional)
    acc.device = dev = Device(hw, functional=functional, recorder=acc.recorder, engine=engine)
    run_walls: list[float] = []
    run_cpus: list[float] = []
    device_run = dev.run

    def timed_run(*args, **kw):
        t, c = time.perf_counter(), time.process_time()
        try:
            return device_run(*args, **kw)
        finally:
            run_walls.append(time.perf_counter() - t)
            run_cpus.append(time.process_time() - c)

    dev.run = timed_run
    model = Model(cm)
    t0 = time.perf_counter()
    model.launch(acc)
    t_launch = time.perf_counter() - t0
    emb = (cm.weight_source().tensor("embed") if functional
           else np.zeros((cfg.vocab_size, cfg.hidden_size), np.float32))
    rng = np.random.default_rng(0)
    toks = rng.integers(0, cfg.vocab_size, size=prompt)
    t0 = time.perf_counter()
    logits = model.infer(emb[toks], cache_size=0)[0]
    t_prefill = time.perf_counter() - t0
    walls, cpus = [], []
    run_walls.clear()
    run_cpus.clear()
    for i in range(tokens):
        tok = int(np.argmax(logits)) if logits is not None else int(rng.integers(cfg.vocab_size))
        t0, c0 = time.perf_counter(), time.process_time()
        logits = model.infer(emb[[tok]], cache_size=prompt + i)[0]
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return {
        "model": model_name, "weights": "real" if src.real else "synthetic",
        "hw": hw_name, "engine": engine,
        "mode": "functional" if functional else "timing",
        "compile_wall_s": t_compile, "compile_cpu_s": cpu_compile, "launch_wall_s": t_launch,
        "prefill_tokens": prompt, "prefill_wall_s": t_prefill,
        "decode_wall_s_per_token": float(np.mean(walls)),
        "decode_cpu_s_per_token": float(np.mean(cpus)),
        "decode_device_run_wall_s_per_token": float(np.sum(run_walls) / tokens),
        "decode_device_run_cpu_s_per_token": float(np.sum(run_cpus) / tokens),
        "simulated_decode_s_per_token": acc.calls[-1].time_s,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def measure_compile(model_name: str, hw_name: str) -> dict:
    """What ``kvsim compile --timing-only`` does: compile, encode and write the ``.kvm``
    file, and the static roofline of each program; wall and CPU time of each part."""
    import tempfile
    from pathlib import Path

    from sim.device.device import static_roofline

    hw = load_hardware(hw_name)
    src = resolve_model(model_name)
    out: dict = {"model": model_name, "hw": hw_name}
    t0, c0 = time.perf_counter(), time.process_time()
    cm = compile_model(src.config, build_bit_config({}), HardwareTarget.from_hw(hw),
                       functional=False, weights=src.weight_spec())
    out["compile_wall_s"], out["compile_cpu_s"] = time.perf_counter() - t0, time.process_time() - c0
    out["instructions"] = {n: len(p) for n, p in cm.programs.items()}
    with tempfile.TemporaryDirectory() as tmp:
        t0, c0 = time.perf_counter(), time.process_time()
        cm.save(Path(tmp) / "model.kvm")
        out["save_wall_s"], out["save_cpu_s"] = time.perf_counter() - t0, time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    for p in cm.programs.values():
        static_roofline(p, hw)
    out["roofline_wall_s"] = time.perf_counter() - t0
    out["roofline_cpu_s"] = time.process_time() - c0
    out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-0.5b")
    p.add_argument("--hw", default="aries")
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--tokens", type=int, default=4)
    p.add_argument("--engine", nargs="+", choices=ENGINES, default=list(ENGINES))
    p.add_argument("--mode", nargs="+", choices=("timing", "functional"),
                   default=["timing", "functional"])
    p.add_argument("--json", action="store_true")
    p.add_argument("--compile-only", action="store_true",
                   help="measure what kvsim compile --timing-only does, nothing else")
    a = p.parse_args()
    if a.compile_only:
        r = measure_compile(a.model, a.hw)
        if a.json:
            print(json.dumps(r, indent=1))
            return
        print(f"{r['model']} on {r['hw']}: compile {r['compile_wall_s']:.2f} s wall "
              f"({r['compile_cpu_s']:.2f} s CPU), save {r['save_wall_s']:.2f} s "
              f"({r['save_cpu_s']:.2f} s CPU), rooflines {r['roofline_wall_s']:.2f} s "
              f"({r['roofline_cpu_s']:.2f} s CPU); instructions {r['instructions']}; "
              f"peak RSS {r['peak_rss_bytes'] / 2**30:.2f} GiB")
        return
    rows = [measure(a.model, a.hw, f == "functional", a.prompt, a.tokens, e)
            for e in a.engine for f in a.mode]
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    for r in rows:
        print(f"{r['model']} ({r['weights']} weights) on {r['hw']}, {r['engine']:5s} "
              f"{r['mode']:10s}: compile "
              f"{r['compile_wall_s']:.1f} s ({r['compile_cpu_s']:.1f} s CPU), launch "
              f"{r['launch_wall_s']:.1f} s, prefill of {r['prefill_tokens']} "
              f"{r['prefill_wall_s']:.2f} s, decode {r['decode_wall_s_per_token']:.3f} s wall "
              f"({r['decode_cpu_s_per_token']:.3f} s CPU) per token, of which device run "
              f"{r['decode_device_run_wall_s_per_token']:.3f} s "
              f"({r['decode_device_run_cpu_s_per_token']:.3f} s CPU) "
              f"(simulated {r['simulated_decode_s_per_token'] * 1e3:.2f} ms), "
              f"peak RSS {r['peak_rss_bytes'] / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
