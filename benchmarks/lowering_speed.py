"""Processor time kvsim needs to lower programs (no device run): a decode step re-lowered at
successive cache positions (what every decode call of the runtime does), and long prefills
(their size too). Processor time, not wall time: on a shared machine the wall time
measures the neighbours.

    python benchmarks/lowering_speed.py [--model qwen2.5-0.5b] [--hw aries] [--decode 40]
                                        [--prefill 4096 8192 32768]
"""

from __future__ import annotations

import argparse
import json
import resource
import time

from models.bits import build_bit_config
from models.compiler import HardwareTarget, compile_model
from models.source import resolve_model
from sim.device.hw import load_hardware

#: Tokens of context before the first timed decode step (an assumption: a short prompt).
DECODE_START_TOKENS = 32


def measure(model_name: str, hw_name: str, decode_tokens: int, prefills: list[int]) -> dict:
    hw = load_hardware(hw_name)
    src = resolve_model(model_name)
    longest = max([DECODE_START_TOKENS, *prefills])
    c0 = time.process_time()
    cm = compile_model(src.config, build_bit_config({}), HardwareTarget.from_hw(hw),
                       functional=False, weights=src.weight_spec(), max_seq=longest,
                       cap=longest + decode_tokens + 2, store_programs=False)
    out: dict = {"model": model_name, "hw": hw_name, "m_tile": cm.m_tile,
                 "compile_cpu_s": time.process_time() - c0}
    cm.program(tokens=DECODE_START_TOKENS, cache_size=0)  # what a prompt's call lowers
    # the first decode step lowers every block of its shape; the next ones replay them
    c0 = time.process_time()
    cm.program(tokens=1, cache_size=DECODE_START_TOKENS)
    out["first_decode_lowering_cpu_s"] = time.process_time() - c0
    c0 = time.process_time()
    for i in range(1, decode_tokens + 1):
        prog = cm.program(tokens=1, cache_size=DECODE_START_TOKENS + i)
    out["decode_lowering_cpu_s_per_token"] = (time.process_time() - c0) / decode_tokens
    out["decode_instructions"] = len(prog)
    out["prefills"] = []
    for n in prefills:
        c0 = time.process_time()
        prog = cm.program(tokens=n, cache_size=0)
        out["prefills"].append({
            "tokens": n, "lowering_cpu_s": time.process_time() - c0,
            "instructions": len(prog),
            "distinct_instruction_objects": len({id(i) for i in prog.instructions}),
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024})
        del prog
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-0.5b")
    p.add_argument("--hw", default="aries")
    p.add_argument("--decode", type=int, default=40, help="decode steps to time")
    p.add_argument("--prefill", type=int, nargs="*", default=[4096, 8192],
                   help="prompt lengths whose prefill lowering to time")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    r = measure(a.model, a.hw, a.decode, a.prefill)
    if a.json:
        print(json.dumps(r, indent=1))
        return
    print(f"{r['model']} on {r['hw']} (token tile {r['m_tile']}): compile "
          f"{r['compile_cpu_s']:.2f} s CPU; first decode step "
          f"{r['first_decode_lowering_cpu_s'] * 1e3:.0f} ms CPU, then "
          f"{r['decode_lowering_cpu_s_per_token'] * 1e3:.2f} ms CPU per token "
          f"({r['decode_instructions']:,} instructions)")
    for f in r["prefills"]:
        print(f"  prefill of {f['tokens']:,} tokens: lowering {f['lowering_cpu_s']:.2f} s CPU, "
              f"{f['instructions']:,} instructions ({f['distinct_instruction_objects']:,} "
              f"distinct objects), peak RSS {f['peak_rss_bytes'] / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
