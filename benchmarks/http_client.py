"""A standard OpenAI-compatible benchmark client against ``kvsim serve --http`` (not a
test): the client's measured TTFT and inter-token latency beside kvsim's own simulated
figures for the same requests, joined by the client's X-Request-ID.

Starts the server (the embedded SmolLM2-135M on ``aries`` by default, timing mode,
``--pace real``), runs the client, stops the server (SIGTERM: it writes
``http_requests.csv``, the simulated TTFT and inter-token latency of each request), and
prints and writes ``table.md``: percentiles of TTFT and inter-token latency as the client
measured them (wall ms / time scale) and as kvsim simulated them (ms), and the per-request
differences. The client:

- ``--client aiperf`` (default): NVIDIA AIPerf, GenAI-Perf's successor (the published
  MLA100 figures were measured with GenAI-Perf). It is not a kvsim dependency: install it
  apart (``python -m venv aiperf-env && aiperf-env/bin/pip install aiperf``) and pass
  ``--aiperf aiperf-env/bin/aiperf``. It loads the served model's tokenizer from a Hugging
  Face folder, which this script writes from kvsim's tokenizer.
- ``--client openai``: a load script on the official ``openai`` client (asyncio,
  ``--concurrency`` workers, prompts of ``--isl`` token ids, ``ignore_eos``): TTFT to the
  first content chunk, inter-token latency (last - first chunk) / (tokens - 1).

    python benchmarks/http_client.py --aiperf aiperf-env/bin/aiperf [--time-scale 1]
        [--concurrency 4] [--requests 200] [--warmup 8] [--isl 240] [--osl 32]
    python benchmarks/http_client.py --client openai --requests 50
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PERCENTILES = (50, 90, 99)


def start_server(args, out: Path) -> tuple[subprocess.Popen, str, str]:
    cmd = [sys.executable, "-m", "sim", "serve", "--http", "--port", str(args.port),
           "--pace", args.pace, "--time-scale", str(args.time_scale), "--out", str(out),
           *(["--set", s] for s in args.set)]
    cmd = [c for part in cmd for c in (part if isinstance(part, list) else [part])]
    if args.config:
        cmd.insert(5, args.config)
    log = open(out.parent / "server.log", "w")  # noqa: SIM115 (the server's lifetime)
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True)
    line = proc.stdout.readline()
    m = re.search(r": (\S+) on .* at (http://\S+)/v1", line)
    if m is None:
        proc.kill()
        raise SystemExit(f"the server did not start: {line}\n"
                         f"{(out.parent / 'server.log').read_text()[-2000:]}")
    return proc, m.group(1), m.group(2)


def run_aiperf(args, url: str, model: str, tokenizer: Path, out: Path) -> list[dict]:
    cmd = [args.aiperf, "profile", "--model", model, "--url", url,
           "--endpoint-type", args.endpoint, "--streaming", "--tokenizer", str(tokenizer),
           "--prompt-input-tokens-mean", str(args.isl), "--prompt-input-tokens-stddev", "0",
           "--prompt-output-tokens-mean", str(args.osl), "--prompt-output-tokens-stddev",
           "0", "--concurrency", str(args.concurrency), "--request-count",
           str(args.requests), "--warmup-request-count", str(args.warmup),
           "--use-server-token-count", "--extra-inputs", "ignore_eos:true",
           "--random-seed", "0", "--ui-type", "none", "--output-artifact-dir", str(out),
           # one worker and one record processor: on a small machine the client's own
           # processes would take the cores the server paces on
           "--workers-max", "1", "--record-processors", "1"]
    with open(out.parent / "client.log", "w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)
    rows = []
    for line in (out / "profile_export.jsonl").read_text().splitlines():
        rec = json.loads(line)
        meta, m = rec["metadata"], rec["metrics"]
        if meta.get("benchmark_phase") != "profiling" or "time_to_first_token" not in m:
            continue
        rows.append({"id": meta["x_request_id"], "ttft_ms": m["time_to_first_token"]["value"],
                     "itl_ms": m["inter_token_latency"]["value"],
                     "start_unix_s": meta["request_start_ns"] / 1e9})
    return rows


async def _openai_load(args, url: str, model: str, vocab: int) -> list[dict]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
    rng = np.random.default_rng(0)
    todo = list(range(args.warmup + args.requests))
    rows: list[dict] = []

    async def one(i: int) -> None:
        prompt = rng.integers(100, vocab, size=args.isl).tolist()
        start_unix = time.time()
        t0 = time.perf_counter()
        times = []
        stream = await client.completions.create(
            model=model, prompt=prompt, max_tokens=args.osl, stream=True,
            extra_body={"ignore_eos": True}, extra_headers={"X-Request-ID": f"load-{i}"})
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].text is not None:
                times.append(time.perf_counter())
        if i >= args.warmup:
            rows.append({"id": f"load-{i}", "ttft_ms": (times[0] - t0) * 1e3,
                         "itl_ms": (times[-1] - times[0]) * 1e3 / (len(times) - 1),
                         "start_unix_s": start_unix})

    async def worker() -> None:
        while todo:
            await one(todo.pop(0))

    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    return rows


def stats(values) -> dict[str, float]:
    a = np.asarray(values, dtype=np.float64)
    return {f"p{q}": float(np.percentile(a, q)) for q in PERCENTILES} | {"mean": float(a.mean())}


def compare(client: list[dict], server: dict[str, dict], scale: float) -> dict:
    """Client figures (wall ms / time scale) against kvsim's (simulated ms), same requests."""
    pairs = [(c, server[c["id"]]) for c in client if c["id"] in server]
    out: dict = {"requests": len(pairs), "unmatched": len(client) - len(pairs)}
    for key, col in (("ttft", "ttft_s"), ("itl", "itl_s")):
        cl = [c[f"{key}_ms"] / scale for c, _ in pairs]
        sv = [float(s[col]) * 1e3 for _, s in pairs]
        diff = np.asarray(cl) - np.asarray(sv)
        # the server's own measure of how late it sent the tokens (wall s -> simulated ms):
        # the first token's lag delays TTFT; the last's less the first's, over the tokens
        # between, moves the inter-token latency
        if key == "ttft":
            lag = [float(s["lag_first_s"]) * 1e3 / scale for _, s in pairs]
        else:
            lag = [(float(s["lag_last_s"]) - float(s["lag_first_s"])) * 1e3 / scale
                   / (int(s["completion_tokens"]) - 1) for _, s in pairs]
        rest = diff - np.asarray(lag)
        out[key] = {"client": stats(cl), "kvsim": stats(sv),
                    "diff": stats(diff) | {"max_abs": float(np.abs(diff).max())},
                    "lag": stats(lag),
                    "rest": stats(rest) | {"max_abs": float(np.abs(rest).max())}}
    # where the client's TTFT went (wall ms, the machine's one clock): the request's way in,
    # the server from its arrival to its first token, the first chunk's way out
    inbound = [(float(s["received_unix_s"]) - c["start_unix_s"]) * 1e3 for c, s in pairs]
    server_ms = [(float(s["first_token_unix_s"]) - float(s["received_unix_s"])) * 1e3
                 for _, s in pairs]
    outbound = [(c["start_unix_s"] + c["ttft_ms"] / 1e3 - float(s["first_token_unix_s"]))
                * 1e3 for c, s in pairs]
    sim_wall = [float(s["ttft_s"]) * 1e3 * scale for _, s in pairs]
    out["ttft_wall"] = {"in": stats(inbound), "server": stats(server_ms),
                        "kvsim": stats(sim_wall),
                        "server_minus_kvsim": stats(np.asarray(server_ms) - sim_wall),
                        "out": stats(outbound)}
    return out


def table(res: dict, args, lag: dict) -> str:
    lines = [f"{res['requests']} requests ({args.client}, concurrency {args.concurrency}, "
             f"{args.isl} prompt + {args.osl} output tokens, time scale {args.time_scale:g}); "
             f"ms of simulated time (the client's wall ms / time scale)", "",
             "| figure | source | p50 | p90 | p99 | mean |", "|---|---|---|---|---|---|"]
    for key, name in (("ttft", "TTFT"), ("itl", "inter-token latency")):
        for src in ("client", "kvsim", "diff", "lag", "rest"):
            s = res[key][src]
            label = {"client": args.client, "kvsim": "kvsim (simulated)",
                     "diff": "client - kvsim, per request",
                     "lag": "the server's pacing lag (its own measure)",
                     "rest": "client - kvsim - lag, per request"}[src]
            lines.append(f"| {name} | {label} | " + " | ".join(
                f"{s[k]:.3f}" for k in ("p50", "p90", "p99", "mean")) + " |")
    w = res["ttft_wall"]
    lines += ["", "Where the client's TTFT went (wall ms on the machine's clock, per request):",
              "", "| part | p50 | p90 | p99 | mean |", "|---|---|---|---|---|"]
    for key, name in (("in", "request in: client send -> server arrival"),
                      ("server", "server: arrival -> first token sent"),
                      ("kvsim", "kvsim's simulated TTFT x time scale"),
                      ("server_minus_kvsim", "server - kvsim (pacing lag and server work)"),
                      ("out", "first chunk out: server send -> client receipt")):
        lines.append(f"| {name} | " + " | ".join(
            f"{w[key][k]:.2f}" for k in ("p50", "p90", "p99", "mean")) + " |")
    lines += ["", f"largest per-request difference: TTFT {res['ttft']['diff']['max_abs']:.3f} "
              f"ms ({res['ttft']['rest']['max_abs']:.3f} ms less the lag), inter-token latency "
              f"{res['itl']['diff']['max_abs']:.3f} ms ({res['itl']['rest']['max_abs']:.3f} ms "
              "less the lag); server pacing "
              f"lag (wall): largest {lag['lag_max_s'] * 1e3:.2f} ms, {lag['late_steps']} of "
              f"{lag['steps']} steps later than {lag['lag_tolerance_s'] * 1e3:g} ms"]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--client", choices=["aiperf", "openai"], default="aiperf")
    ap.add_argument("--aiperf", default="aiperf", help="the aiperf executable")
    ap.add_argument("--config", help="server config (default: kvsim serve --http's)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--endpoint", choices=["chat", "completions"], default="chat")
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--pace", choices=["real", "none"], default="real",
                    help="none: nothing is slept, so the client measures the HTTP path "
                    "alone (the baseline of its TTFT on this machine)")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--isl", type=int, default=240, help="prompt tokens")
    ap.add_argument("--osl", type=int, default=32, help="output tokens")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--out", default="http-bench")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from models.source import resolve_model
    from sim.app.server.config import load_http_config
    from sim.app.server.text import save_hf_tokenizer, server_tokenizer

    cfg = load_http_config(args.config, args.set)
    src = resolve_model(cfg.model.preset or cfg.model.hf_config)
    tok = server_tokenizer(cfg.server.tokenizer, src, functional=False)
    tok_dir = save_hf_tokenizer(tok, out / "tokenizer")
    t0 = time.perf_counter()
    proc, model, url = start_server(args, out / "server")
    try:
        if args.client == "aiperf":
            client = run_aiperf(args, url, model, tok_dir, out / "aiperf")
        else:
            client = asyncio.run(_openai_load(args, url, model, tok.vocab_size))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    with open(out / "server" / "http_requests.csv") as f:
        server = {r["client_request_id"]: r for r in csv.DictReader(f)}
    metrics = json.loads((out / "server" / "metrics.json").read_text())
    if args.pace == "none":
        text = (f"{len(client)} requests ({args.client}, --pace none: the HTTP path alone, "
                f"wall ms): TTFT {stats([c['ttft_ms'] for c in client])}, inter-token "
                f"latency {stats([c['itl_ms'] for c in client])}\n")
        (out / "table.md").write_text(text)
        print(text, end="")
        return 0
    lag = metrics["server"] | {"steps": metrics["serving"]["steps"]}
    res = compare(client, server, args.time_scale)
    text = table(res, args, lag)
    (out / "table.md").write_text(text)
    (out / "comparison.json").write_text(json.dumps(res, indent=1) + "\n")
    print(text, end="")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"wall {time.perf_counter() - t0:.1f} s; peak RSS of this script "
          f"{peak / 2**20:,.0f} MiB (the server and client run apart); pid {os.getpid()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
