"""Wall time and peak memory of ``kvsim eval`` on long texts, and the functional run's
integer ops per second beside the host's measured float64 GEMM rate.

    python benchmarks/long_eval.py [--tokens 2048,8192] [--kv int8] [--kv-read integer]
                                   [--text models/data/long_english.txt] [--json]

Each length runs ``kvsim eval --json`` in a fresh process (its peak RSS is its own, read
from ``wait4``), over the first N tokens of the text (``models/data/long_english.txt``,
9,266 tokens). The goal: <= 30 s at 2,048 tokens, <= 3 min and <= 3 GB at 8,192 on a
2-core machine. Wall time depends on what else the machine runs: the load average and the
process's CPU seconds are printed beside it.

Integer ops of the run: 2 x the multiply-accumulates of the integer pipeline (every
projection and the LM head over every position, as all-position logits need; attention
``Q K^T`` and ``P V`` over each query's causal context), counted from the model's shape.
The host's float64 GEMM rate: the best of a few 1,024-cubed ``numpy`` products.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TEXT = ROOT / "models" / "data" / "long_english.txt"


def integer_macs(cfg, n: int) -> int:
    """Multiply-accumulates of a teacher-forced run of ``n`` tokens (all-position logits)."""
    h, d = cfg.hidden_size, cfg.head_dim
    qkvo = h * d * (2 * cfg.num_heads + 2 * cfg.num_kv_heads)
    mlp = 3 * h * cfg.intermediate_size
    per_token = cfg.num_layers * (qkvo + mlp) + h * cfg.vocab_size
    attn = cfg.num_layers * cfg.num_heads * 2 * d * (n * (n + 1) // 2)
    return n * per_token + attn


def float64_gemm_rate(size: int = 1024, repeats: int = 3) -> float:
    """The host's float64 GEMM rate, flop/s (best of ``repeats``)."""
    a = np.random.default_rng(0).standard_normal((size, size))
    b = a.T.copy()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * size**3 / best


def run_eval(tokens: int, text: Path, kv: str, kv_read: str) -> dict:
    cmd = [sys.executable, "-m", "sim", "eval", "--json", "--text", str(text),
           "--max-tokens", str(tokens), "--kv", kv, "--kv-read", kv_read]
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, cwd=ROOT, text=True)
    out = proc.stdout.read() if proc.stdout else ""
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if status != 0:
        raise SystemExit(f"kvsim eval failed at {tokens} tokens (status {status})")
    q = json.loads(out)
    rss = ru.ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    return {"tokens": q["tokens"], "wall_s": round(wall, 1),
            "cpu_s": round(ru.ru_utime + ru.ru_stime, 1), "peak_rss_bytes": rss,
            "load_before": round(load0, 2), "load_after": round(os.getloadavg()[0], 2),
            "perplexity": q["perplexity"], "kl_mean": q["kl_mean"],
            "top1_agreement": q["top1_agreement"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="2048,8192")
    ap.add_argument("--text", default=str(TEXT))
    ap.add_argument("--kv", default="int8")
    ap.add_argument("--kv-read", default="integer")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    from models.source import resolve_model

    cfg = resolve_model("smollm2-135m").config
    rate = float64_gemm_rate()
    rows = []
    for n in (int(x) for x in a.tokens.split(",")):
        r = run_eval(n, Path(a.text), a.kv, a.kv_read)
        r["integer_ops"] = 2 * integer_macs(cfg, r["tokens"])
        r["integer_ops_per_s"] = r["integer_ops"] / r["wall_s"]
        rows.append(r)
        if not a.json:
            print(f"{r['tokens']:>6} tokens: {r['wall_s']:8.1f} s wall, {r['cpu_s']:8.1f} s CPU, "
                  f"peak RSS {r['peak_rss_bytes'] / 2**30:.2f} GiB, "
                  f"{r['integer_ops_per_s'] / 1e9:.2f} G integer ops/s "
                  f"(load {r['load_before']} -> {r['load_after']})", flush=True)
    if a.json:
        print(json.dumps({"float64_gemm_flop_per_s": rate, "runs": rows}))
    else:
        print(f"host float64 GEMM (1024^3, numpy): {rate / 1e9:.2f} Gflop/s; cores: "
              f"{os.cpu_count()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
