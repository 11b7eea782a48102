"""The vendor's TPS harness on kvsim beside kvsim's own figures for the same workloads.

Reads what ``transformers-mblt tps measure|sweep --json FILE`` wrote when it ran under
``kvsim exec`` on a folder of ``kvsim vendor folder``, runs ``kvsim run`` (timing fidelity:
the same simulated times as a functional run) with the folder's compile settings for each
workload the harness measured, and prints both side by side (markdown)::

    kvsim vendor folder --out smol
    kvsim exec -- transformers-mblt tps measure --model smol --prefill 128 --decode 32 \\
        --no-device-metrics --json tps.json
    python benchmarks/vendor_tps.py --folder smol --harness tps.json

The workloads, as the harness runs them: ``measure`` prefills ``--prefill`` random tokens in
``npu_prefill_chunk_size`` chunks and decodes ``--decode`` tokens (TTFT: the prefill calls;
decode TPS: ``--decode`` over the decode calls); the sweep's prefill points do the same with
one decoded token, and its decode points decode a window after a cache "fake-prefilled" to
each length (the first call at that length). kvsim's counterparts: a run of ``P`` prompt
tokens (its TTFT), and a run with ``workload.context_tokens = C`` and a one-token prompt
(the prompt call and the next window - 1 decode calls: the harness's positions).

A ``kvsim run`` starts on a freshly launched card; the harness's calls follow its warmup
and its earlier points, and a simulated card's DRAM (open rows, refresh schedule) carries
state from call to call. The last column replays the harness's calls in its order on
kvsim's own runtime (``sim.runtime``, timing-only), including the one non-infer call it
makes (a ``dump_cache_memory``: transformers-mblt saves the previous generate's cache when
the sweep's first fake-prefilled cache takes its slot), so what is left between the harness
and a ``kvsim run`` is accounted for call by call.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def _run(settings: dict[str, Any], *, prompt: int, out: int, context: int = 0) -> dict:
    from sim.app.config import load_run_config
    from sim.app.run import run

    sets = [f"model.preset={settings['model']}", f"bits.preset={settings['bits']}",
            f"kv.format={settings['kv']}", f"hardware.preset={settings['hw']}",
            f"compile.core_mode={settings['core_mode']}",
            f"compile.max_sequence_length={settings['max_seq']}",
            f"compile.cache_length={settings['cache_length']}",
            f"workload.prompt_tokens={prompt}", f"workload.output_tokens={out}",
            f"workload.context_tokens={context}", "sim.fidelity=timing", "outputs.trace=off"]
    if isinstance(settings.get("numerics"), str):
        sets.append(f"bits.numerics.preset={settings['numerics']}")
    return run(load_run_config(None, sets)).metrics.to_metrics()


def kvsim_prefill_s(settings: dict[str, Any], tokens: int) -> float:
    return _run(settings, prompt=tokens, out=2)["prefill"]["ttft_s"]


def kvsim_decode_s(settings: dict[str, Any], cache: int, window: int) -> float:
    """Mean time of ``window`` one-token calls at cache sizes ``cache .. cache+window-1``."""
    m = _run(settings, prompt=1, out=window, context=cache)
    calls = [m["prefill"]["ttft_s"], *m["decode"]["time_per_call_s"]]
    return sum(calls[:window]) / window


class Replay:
    """The harness's calls, in its order, on kvsim's own runtime (timing-only)."""

    #: the sweep's warmup generate (transformers-mblt cli/tps.py: 128 + 32 tokens)
    SWEEP_WARMUP = (128, 32)

    def __init__(self, folder: Path, settings: dict[str, Any]):
        from sim.runtime import Accelerator, Model

        self.acc = Accelerator(hw=settings["hw"], functional=False)
        self.model = Model(next(folder.glob("*.kvm")))
        self.model.launch(self.acc)
        self.chunk = settings["max_seq"]
        self.hidden = self.model.compiled.model.hidden_size

    def _call(self, tokens: int, cache: int) -> float:
        import numpy as np

        self.model.infer(np.zeros((tokens, self.hidden), np.float32), cache_size=cache)
        return self.acc.calls[-1].time_s

    def generate(self, prefill: int, decode: int) -> tuple[float, list[float]]:
        """A generate of ``decode + 1`` new tokens: (TTFT s, the decode calls' s)."""
        ttft = sum(self._call(min(self.chunk, prefill - a), a)
                   for a in range(0, prefill, self.chunk))
        return ttft, [self._call(1, prefill + i) for i in range(decode)]

    def dump_s(self) -> float:
        self.model.dump_cache_memory(0)
        return self.acc.calls[-1].time_s


def rows(harness: dict[str, Any], settings: dict[str, Any], folder: Path,
         warmup: int) -> list[tuple]:
    """(workload, harness value, kvsim run value, replay value, unit) rows."""
    out = []
    rp = Replay(folder, settings)
    if "aggregate" in harness:  # a sweep
        agg = harness["aggregate"]
        pre, dec = agg["prefill_sweep"], agg["decode_sweep"]
        for _ in range(warmup):
            rp.generate(*Replay.SWEEP_WARMUP)
        for p, t in zip(pre["x_values"], pre["time_values"], strict=True):
            out.append((f"TTFT, prefill {p}", t * 1e3, kvsim_prefill_s(settings, p) * 1e3,
                        rp.generate(p, 1)[0] * 1e3, "ms"))
        window = round(dec["time_values"][0] / dec["avg_total_token_latency_values"][0])
        dump = rp.dump_s()  # the residency save before the first fake-prefilled window
        for i, (c, t, npu) in enumerate(zip(dec["x_values"], dec["avg_total_token_latency_values"],
                                            dec["avg_npu_token_latency_values"], strict=True)):
            k = kvsim_decode_s(settings, c, window) * 1e3
            calls = [rp._call(1, c + j) for j in range(window)]
            r = sum(calls) / window * 1e3
            out.append((f"decode/token at cache {c} (count_npu_time)", npu * 1e3, k, r, "ms"))
            if i == 0:
                r += dump / window * 1e3
            out.append((f"decode/token at cache {c} (harness total)", t * 1e3, k, r, "ms"))
        return out
    run = harness["runs"][-1]
    p, d = run["num_prefill"], run["num_decode"]
    m = _run(settings, prompt=p, out=d + 1)
    for _ in range(warmup + len(harness["runs"])):
        ttft, calls = rp.generate(p, d)
    out.append((f"TTFT, prefill {p}", run["prefill_latency_ns"] / 1e6,
                m["prefill"]["ttft_s"] * 1e3, ttft * 1e3, "ms"))
    out.append((f"decode/token, {d} tokens after {p}",
                run["avg_total_decode_token_latency_ns"] / 1e6,
                m["decode"]["time_per_token_s"] * 1e3, sum(calls) / d * 1e3, "ms"))
    out.append(("prefill TPS", run["prefill_tps"], m["prefill"]["tokens_per_s"], p / ttft,
                "tok/s"))
    out.append(("decode TPS", run["decode_tps"], m["decode"]["tokens_per_s"],
                d / sum(calls), "tok/s"))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folder", required=True, help="the model folder the harness ran")
    ap.add_argument("--harness", required=True, help="the harness's --json output")
    ap.add_argument("--warmup", type=int, default=1, help="the harness's --warmup (default 1)")
    args = ap.parse_args(argv)
    folder = Path(args.folder)
    settings = json.loads((folder / "config.json").read_text())["kvsim"]
    harness = json.loads(Path(args.harness).read_text())
    print("| workload | TPS harness under kvsim exec | kvsim run (fresh card) | difference "
          "| kvsim runtime, the harness's call order | difference |")
    print("|---|---|---|---|---|---|")
    for name, h, k, r, unit in rows(harness, settings, folder, args.warmup):
        print(f"| {name} | {h:.6f} {unit} | {k:.6f} {unit} | {100 * (h - k) / k:+.4f} % "
              f"| {r:.6f} {unit} | {100 * (h - r) / r:+.4f} % |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
