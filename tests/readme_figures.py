"""The simulated figures the README quotes, each with the fresh run that produces it.

A :class:`Quote` is a piece of the README with its figures as format fields
(``"| decode time per token | {tpot} ms = ..."``); its :class:`Source` runs what the README
says produces them (a kvsim run, sweep, serving run, ``kvsim kv``, a test's own figures)
and returns the fields, formatted as the README prints them. ``tests/test_readme_figures.py``
checks that every quote, filled in from a fresh run, stands in the README word for word
(whitespace aside): a figure the simulator moves, or a README edit that misquotes one,
fails it.

Sources that take seconds run in the test suite; the heavy ones (minutes: the validation
runs, the sweeps, the serving scenarios, the quality tables) run when asked:

    KVSIM_README_FIGURES=all python -m pytest -q tests/test_readme_figures.py
    python -m tests.readme_figures SOURCE...       # one source's fresh figures and misses

Figures a test of the suite already asserts from a fresh run (the MoE and MLA cosines, the
w4g32 quality) are tied to that test: the quote's figures are the literals it asserts.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MINUS = "\u2212"  # the README's minus sign in signed percentages


@dataclass
class Fresh:
    """Where a source may write, and the shared run of the embedded default (the test
    suite's ``embedded_default_run`` fixture), when there is one."""

    tmp: Path
    default_run: Path | None = None


@dataclass(frozen=True)
class Source:
    name: str
    command: str  # what the README says produces the figures
    produce: Callable[[Fresh], dict[str, str]]
    heavy: bool = False
    quotes: list[str] = field(default_factory=list)


SOURCES: dict[str, Source] = {}


def source(name: str, command: str, *quotes: str, heavy: bool = False):
    def register(fn: Callable[[Fresh], dict[str, str]]) -> Callable[[Fresh], dict[str, str]]:
        SOURCES[name] = Source(name, command, fn, heavy, list(quotes))
        return fn
    return register


def normalized(text: str) -> str:
    return " ".join(text.split())


def signed_pct(new: float, ref: float, digits: int = 1) -> str:
    """``+4.7`` / ``−0.05``: the change of ``new`` against ``ref`` in percent, with the
    README's minus sign."""
    v = (new / ref - 1) * 100
    return f"{v:+.{digits}f}".replace("-", MINUS)


def _metrics(sets: list[str], config: str | None = None) -> dict[str, Any]:
    from sim.app.config import load_run_config
    from sim.app.run import run

    return run(load_run_config(None if config is None else ROOT / config, sets)).metrics \
        .to_metrics()


def _sweep(config: str, tmp: Path, sets: list[str] | None = None) -> list[dict[str, Any]]:
    from sim.app.sweep.sweep import load_sweep, run_sweep

    res = run_sweep(load_sweep(ROOT / config, sets), tmp / Path(config).stem, progress=False)
    assert not res.failed, [r["error"] for r in res.failed]
    return res.rows


def _serve(sets: list[str], config: str | None = None) -> dict[str, Any]:
    from sim.app.serve.config import load_serve_config
    from sim.app.serve.run import run_serving

    cfg = load_serve_config(None if config is None else ROOT / config, sets)
    return run_serving(cfg).metrics.to_metrics()["serving"]


# --- in the test suite (seconds) -----------------------------------------------------------


@source("default run", "kvsim run",
        "| time to first token (TTFT) | {ttft} ms (roofline bound {ttft_bound} ms) |",
        "| decode time per token | {tpot} ms = {tok_s} tokens/s (roofline bound {tpot_bound} ms) |",
        "| launch ({launch_mb} MB of weights over PCIe) | {launch} ms |",
        "| KV cache bytes per token | {kv} (24 layers × K,V × 2 heads × 64), {kv_x}× smaller "
        "than bf16 |")
def _default_run(fresh: Fresh) -> dict[str, str]:
    if fresh.default_run is not None:
        m = json.loads((fresh.default_run / "metrics.json").read_text())
    else:
        m = _metrics([])
    return {"ttft": f"{m['prefill']['ttft_s'] * 1e3:.1f}",
            "ttft_bound": f"{m['roofline']['prefill']['bound_s'] * 1e3:.1f}",
            "tpot": f"{m['decode']['time_per_token_s'] * 1e3:.2f}",
            "tok_s": f"{m['decode']['tokens_per_s']:.1f}",
            "tpot_bound": f"{m['roofline']['decode_per_token']['bound_s'] * 1e3:.2f}",
            "launch_mb": f"{m['launch']['pcie_h2d_bytes'] / 1e6:.0f}",
            "launch": f"{m['launch']['time_s'] * 1e3:.1f}",
            "kv": f"{m['kv_cache']['bytes_per_token']:,.0f}",
            "kv_x": f"{m['kv_cache']['compression_vs_bf16']:.2f}"}


KV_ROWS = (("qwen2.5-0.5b", "int8", "`int8`"),
           ("qwen2.5-0.5b", "kivi-4", "`kivi-4` (K per-channel, V per-token, G=32, 128 recent "
                                       "tokens fp16)"),
           ("qwen2.5-0.5b", "qserve-kv4", "`qserve-kv4`"),
           ("qwen2.5-0.5b", "kivi-2", "`kivi-2`"),
           ("deepseek-v2-lite", "quantmla-c4r4", "`quantmla-c4r4`"),
           ("deepseek-v2-lite", "quantmla-c2r4", "`quantmla-c2r4`"))


@source("kv formats", "kvsim kv --model M --format F --context 8192 --json",
        *(f"| {m} | {label} | {{bpt{i}}} | {{x{i}}}× |" for i, (m, _, label)
          in enumerate(KV_ROWS)))
def _kv_formats(fresh: Fresh) -> dict[str, str]:
    from sim.app.cli.main import main

    out: dict[str, str] = {}
    for i, (model, fmt, _) in enumerate(KV_ROWS):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert main(["kv", "--model", model, "--format", fmt, "--context", "8192",
                         "--json"]) == 0
        d = json.loads(buf.getvalue())
        out[f"bpt{i}"] = f"{d['bytes_per_token']:,.0f}"
        out[f"x{i}"] = f"{d['compression_vs_bf16']:.2f}"
    return out


@source("aries preset", "kvsim hw show aries --json",
        "16 GiB LPDDR4X at {dram} GB/s, PCIe Gen4 x8",
        "| `aries` | MLA100: 2 clusters × 4 cores, {tops} TOPS INT8, 16 GiB LPDDR4X ({dram} GB/s "
        "peak), PCIe Gen4 x8 ({h2d} GB/s h2d, {d2h} GB/s d2h effective) |")
def _aries(fresh: Fresh) -> dict[str, str]:
    from sim.device.hw import load_hardware

    d = load_hardware("aries").derived
    return {"dram": f"{d['dram_peak_bytes_per_s'] / 1e9:.1f}",
            "tops": f"{d['peak_ops_per_s_w8a8'] / 1e12:.0f}",
            "h2d": f"{d['pcie_h2d_effective_bytes_per_s'] / 1e9:.1f}",
            "d2h": f"{d['pcie_d2h_effective_bytes_per_s'] / 1e9:.1f}"}


@source("counts", "the bad-input table and the committed baseline",
        "(`tests/test_bad_input.py`, {cases} cases;",
        "of the {figures} figures of the committed baseline")
def _counts(fresh: Fresh) -> dict[str, str]:
    from tests import test_bad_input

    base = json.loads((ROOT / "configs" / "regress" / "baseline.json").read_text())
    return {"cases": f"{len(test_bad_input.CASES)}",
            "figures": f"{sum(len(e['figures']) for e in base['entries'])}"}


@source("DRAM patterns", "kvsim hw show aries --json (dram_protocol)",
        "a long weight stream {weights} of peak, per-head KV token reads {reads}, appends "
        "{appends}.")
def _dram_patterns(fresh: Fresh) -> dict[str, str]:
    from sim.device.dram.patterns import protocol_summary
    from sim.device.hw import load_hardware

    eff = protocol_summary(load_hardware("aries").dram).to_json()["sustained_efficiency"]
    return {"weights": f"{eff['weight_stream']:.2f}", "reads": f"{eff['kv_token_read']:.2f}",
            "appends": f"{eff['kv_token_append']:.2f}"}


#: Figures the suite asserts from its own fresh runs: (test file, README quote with the
#: literals). The quote must stand in the README and each literal in the test.
ASSERTED = {
    "tests/models/test_mla_functional.py": "cosine to the float reference): bf16 0.9908, C4R4 "
                                           "0.9875, C2R4 0.9718.",
    "tests/models/test_moe_functional.py": "cosines 0.9936 (tiny-qwen2-moe), 0.9907 "
                                           "(tiny-mixtral) and 0.9934 (tiny-mla, MLA + MoE,",
    "tests/sim/test_numerics_w4.py": "top-1 0.855, KL 0.078, perplexity 19.56 (float 17.53) "
                                     "(`tests/sim/test_numerics_w4.py`). The `w8` preset "
                                     "through the dequant read path (`[kv] read = \"dequant\"`):"
                                     " top-1 0.945, KL 0.021.",
}


# --- heavy: minutes of runs, on demand ----------------------------------------------------


@source("serving default", "kvsim serve",
        "The default (64 requests of Qwen2.5-0.5B on one ARIES, int8 KV) prints {tok_s} output "
        "tokens/s, TTFT p50 {ttft} s, time per output token p50 {tpot} ms, {preempted}.",
        heavy=True)
def _serving_default(fresh: Fresh) -> dict[str, str]:
    s = _serve([])
    n = s["num_preemptions"]
    return {"tok_s": f"{s['output_tokens_per_s']:.1f}", "ttft": f"{s['ttft_s_p50']:.1f}",
            "tpot": f"{s['tpot_s_p50'] * 1e3:.0f}",
            "preempted": "no preemption" if n == 0 else f"{n:,} preemptions"}


#: The published MLA100 figures (README, "Validation against the real chip").
#: The published points (FACTS.md): key, README label, TTFT (ms, as the README writes it),
#: output tokens/s per user.
VALIDATION_POINTS = (("b1", "Llama-3.2-1B", "430.56", 30.73),
                     ("b8", "Llama-3.1-8B", "4,430.71", 5.81))


@source("validation", "kvsim run configs/validate-llama-3.2-1b.toml [--set "
        "model.hf_config=configs/models/llama-3.1-8b.json]",
        *(f"| {label} | TTFT | {pub_ttft} ms | {{{k}_c_ttft}} ms ({{{k}_c_ttft_d}} %) | "
          f"{{{k}_ttft}} ms |" for k, label, pub_ttft, _ in VALIDATION_POINTS),
        *(f"| {label} | output tokens/s per user | {pub_tps} | {{{k}_c_tps}} ({{{k}_c_tps_d}} %)"
          f" | {{{k}_tps}} ({{{k}_tpot}} ms/token) |" for k, label, _, pub_tps
          in VALIDATION_POINTS), heavy=True)
def _validation(fresh: Fresh) -> dict[str, str]:
    cfg = "configs/validate-llama-3.2-1b.toml"
    out = {}
    for k, _, pub_ttft, pub_tps in VALIDATION_POINTS:
        sets = ["outputs.trace=off"]
        if k == "b8":
            sets.append("model.hf_config='configs/models/llama-3.1-8b.json'")
        m = _metrics(sets, cfg)
        c_ttft, c_tps = m["client"]["ttft_s"] * 1e3, m["client"]["tokens_per_s"]
        out |= {f"{k}_c_ttft": f"{c_ttft:,.2f}",
                f"{k}_c_ttft_d": signed_pct(c_ttft, float(pub_ttft.replace(",", "")), 2),
                f"{k}_c_tps": f"{c_tps:.2f}", f"{k}_c_tps_d": signed_pct(c_tps, pub_tps, 2),
                f"{k}_ttft": f"{m['prefill']['ttft_s'] * 1e3:,.2f}",
                f"{k}_tps": f"{m['decode']['tokens_per_s']:.2f}",
                f"{k}_tpot": f"{m['decode']['time_per_token_s'] * 1e3:.2f}"}
    return out


def _decode_call(m: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in reversed(m["calls"]) if c["phase"] == "decode")


@source("long context", "kvsim run configs/long-context-decode.toml",
        "{tpot} ms per token against a DRAM roofline of {bound} ms; each step streams {w} GB of "
        "weights and {kv} GB of KV cache", heavy=True)
def _long_context(fresh: Fresh) -> dict[str, str]:
    m = _metrics(["outputs.trace=off"], "configs/long-context-decode.toml")
    step = _decode_call(m)["dram_bytes_by_kind"]
    return {"tpot": f"{m['decode']['time_per_token_s'] * 1e3:.1f}",
            "bound": f"{m['roofline']['decode_per_token']['bound_s'] * 1e3:.1f}",
            "w": f"{step['weights'] / 1e9:.1f}", "kv": f"{step['kv_cache'] / 1e9:.1f}"}


@source("32K prompt", "kvsim run configs/quickstart.toml --set workload.prompt_tokens=32753 "
        "--set workload.output_tokens=16 --set outputs.trace=off",
        "tokens): TTFT {ttft} s simulated, decode {tpot} ms per token at that context",
        heavy=True)
def _prompt_32k(fresh: Fresh) -> dict[str, str]:
    m = _metrics(["workload.prompt_tokens=32753", "workload.output_tokens=16",
                  "outputs.trace=off"], "configs/quickstart.toml")
    return {"ttft": f"{m['prefill']['ttft_s']:.2f}",
            "tpot": f"{m['decode']['time_per_token_s'] * 1e3:.2f}"}


@source("W8 vs W4V8", "kvsim sweep configs/w8-vs-w4v8.toml",
        "**W8 vs W4V8**: {w8_mb} vs {w4_mb} MB of weights; decode is bound by weight streaming: "
        "TTFT {w8_ttft} vs {w4_ttft} ms, decode {w8_tpot} vs {w4_tpot} ms per token.",
        heavy=True)
def _w8_w4v8(fresh: Fresh) -> dict[str, str]:
    rows = {r["bits.preset"]: r for r in _sweep("configs/w8-vs-w4v8.toml", fresh.tmp)}
    out = {}
    for key, name in (("w8", "W8"), ("w4", "W4V8")):
        r = rows[name]
        out |= {f"{key}_mb": f"{r['compiled.weight_bytes'] / 1e6:.1f}",
                f"{key}_ttft": f"{r['prefill.ttft_s'] * 1e3:.1f}",
                f"{key}_tpot": f"{r['decode.time_per_token_s'] * 1e3:.2f}"}
    return out


@source("QuantMLA", "kvsim sweep configs/mla-quantmla-vs-bf16.toml",
        "grows from {bf16_cap} to {c4_cap} tokens ({ratio}×); decode time at a one-token "
        "context is about the same ({bf16_tpot} vs {c4_tpot} ms;", heavy=True)
def _mla(fresh: Fresh) -> dict[str, str]:
    rows = {r["kv.format"]: r for r in _sweep("configs/mla-quantmla-vs-bf16.toml", fresh.tmp)}
    b, c = rows["bf16"], rows["quantmla-c4r4"]
    return {"bf16_cap": f"{b['kv_cache.capacity_tokens']:,}",
            "c4_cap": f"{c['kv_cache.capacity_tokens']:,}",
            "ratio": f"{c['kv_cache.capacity_tokens'] / b['kv_cache.capacity_tokens']:.2f}",
            "bf16_tpot": f"{b['decode.time_per_token_s'] * 1e3:.2f}",
            "c4_tpot": f"{c['decode.time_per_token_s'] * 1e3:.2f}"}


@source("eviction sweep", "kvsim sweep configs/host-vs-device-edit.toml",
        "host {host_ms} ms and {host_mb} MB over PCIe; device {dev_ms} ms and {dev_mb} MB of "
        "DRAM traffic", heavy=True)
def _eviction(fresh: Fresh) -> dict[str, str]:
    rows = {r["workload.cache_ops[0].where"]: r
            for r in _sweep("configs/host-vs-device-edit.toml", fresh.tmp)}
    h, d = rows["host"], rows["device"]
    return {"host_ms": f"{h['cache_ops[0].time_s'] * 1e3:.3f}",
            "host_mb": f"{h['cache_ops[0].pcie_bytes'] / 1e6:.2f}",
            "dev_ms": f"{d['cache_ops[0].time_s'] * 1e3:.3f}",
            "dev_mb": f"{d['cache_ops[0].dram_bytes'] / 1e6:.2f}"}


KV_BITS = (("bf16", "bf16"), ("int8", "int8"), ("kivi-4", "KIVI-4"), ("kivi-2", "KIVI-2"))


@source("KV bit width", "kvsim sweep configs/kv-bits-sweep.toml",
        *(f"| {label} | " + " | ".join(f"{{{fmt}{j}}}" for j in range(7)) + " |"
          for fmt, label in KV_BITS),
        "against bf16, KIVI-4 and KIVI-2 from **{k_from}** and int8 from **{i8_from}**; "
        "against int8, KIVI-4 and KIVI-2 from **{k_int8}** tokens",
        "At 32K tokens the cache is {bf16_mb} MB in bf16, {int8_mb} MB int8, {kivi-4_mb} MB "
        "KIVI-4, {kivi-2_mb} MB KIVI-2 (bytes per token {bf16_bpt} / {int8_bpt} / "
        "{kivi-4_bpt} / {kivi-2_bpt}).", heavy=True)
def _kv_bits(fresh: Fresh) -> dict[str, str]:
    from traces.sweep_report import PAYS_BY

    rows = _sweep("configs/kv-bits-sweep.toml", fresh.tmp)
    ctx = sorted({r["workload.context_tokens"] for r in rows})
    t = {(r["kv.format"], r["workload.context_tokens"]): r["decode.time_per_token_s"]
         for r in rows}
    out: dict[str, str] = {}
    for fmt, _ in KV_BITS:
        for j, n in enumerate(ctx):
            v = t[fmt, n] * 1e3
            out[f"{fmt}{j}"] = (f"{v:.2f}" if fmt == "bf16"
                                else f"{v:.2f} ({(1 - t[fmt, n] / t['bf16', n]) * 100:.1f} %)")
        last = next(r for r in rows if r["kv.format"] == fmt
                    and r["workload.context_tokens"] == ctx[-1])
        out[f"{fmt}_mb"] = f"{last['kv_cache.bytes'] / 1e6:.0f}"
        out[f"{fmt}_bpt"] = f"{last['kv_cache.bytes_per_token']:,.0f}"

    def pays_from(fmt: str, base: str) -> int | None:
        start = None
        for n in reversed(ctx):
            if 1 - t[fmt, n] / t[base, n] < PAYS_BY:
                break
            start = n
        return start

    k = {pays_from("kivi-4", "bf16"), pays_from("kivi-2", "bf16")}
    k8 = {pays_from("kivi-4", "int8"), pays_from("kivi-2", "int8")}
    assert len(k) == 1 and len(k8) == 1, (k, k8)  # the README names one for both
    out |= {"k_from": f"{k.pop():,} tokens", "i8_from": f"{pays_from('int8', 'bf16'):,}",
            "k_int8": f"{k8.pop():,}"}
    return out


def _examples_compare() -> Callable[..., list[dict[str, Any]]]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("host_vs_device_edit",
                                                  ROOT / "examples" / "host_vs_device_edit.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.compare


@source("eviction example", "python examples/host_vs_device_edit.py",
        *(f"| {n:,} | {where} | {{{where}{n}_ms}} ms | {{{where}{n}_pcie}} | "
          f"{{{where}{n}_dram}} |" for n in (512, 2048, 8192) for where in ("host", "device")),
        heavy=True)
def _eviction_example(fresh: Fresh) -> dict[str, str]:
    out = {}
    for r in _examples_compare()("aries", "int8", [512, 2048, 8192]):
        key = f"{r['where']}{r['tokens']}"
        out |= {f"{key}_ms": f"{r['time_s'] * 1e3:.2f}", f"{key}_pcie": f"{r['pcie_bytes']:,}",
                f"{key}_dram": f"{r['dram_bytes']:,}"}
    return out


@source("serving formats", "kvsim serve configs/serving-qwen.toml --set kv.format=F [--set "
        "serving.kv_budget_bytes=1073741824 [--set serving.preemption=swap]]",
        "16 GiB in any format (bf16 {bf16}, int8 {int8}, qserve-kv4 {q4} tok/s); with a 1 GiB KV "
        "budget bf16 preempts {bf16_pre} times ({bf16_b} tok/s; swap {swap}) while int8 and "
        "4-bit do not.", heavy=True)
def _serving_formats(fresh: Fresh) -> dict[str, str]:
    cfg = "configs/serving-qwen.toml"
    out = {}
    for key, fmt in (("bf16", "bf16"), ("int8", "int8"), ("q4", "qserve-kv4")):
        out[key] = f"{_serve([f'kv.format={fmt!r}'], cfg)['output_tokens_per_s']:.1f}"
    budget = "serving.kv_budget_bytes=1073741824"
    b = _serve(["kv.format='bf16'", budget], cfg)
    sw = _serve(["kv.format='bf16'", budget, "serving.preemption='swap'"], cfg)
    for fmt in ("int8", "qserve-kv4"):
        assert _serve([f"kv.format={fmt!r}", budget], cfg)["num_preemptions"] == 0, fmt
    return out | {"bf16_pre": f"{b['num_preemptions']:,}",
                  "bf16_b": f"{b['output_tokens_per_s']:.0f}",
                  "swap": f"{sw['output_tokens_per_s']:.0f}"}


@source("DeepSeek serving", "kvsim serve configs/serving-deepseek-long.toml --set kv.format=F "
        "[--set serving.preemption=swap]",
        "| bf16, recompute | {r_tps} | {r_pre} | {r_rec} |",
        "| bf16, swap | {s_tps} | {s_pre} | 0 ({s_gb} GB over PCIe) |",
        "| quantmla-c4r4 | {q_tps} | {q_pre} | {q_rec} |", heavy=True)
def _deepseek(fresh: Fresh) -> dict[str, str]:
    cfg = "configs/serving-deepseek-long.toml"
    r = _serve(["kv.format='bf16'"], cfg)
    s = _serve(["kv.format='bf16'", "serving.preemption='swap'"], cfg)
    q = _serve(["kv.format='quantmla-c4r4'"], cfg)
    return {"r_tps": f"{r['output_tokens_per_s']:.2f}", "r_pre": f"{r['num_preemptions']:,}",
            "r_rec": f"{r['recomputed_tokens']:,}", "s_tps": f"{s['output_tokens_per_s']:.2f}",
            "s_pre": f"{s['num_preemptions']:,}", "s_gb": f"{s['swapped_bytes'] / 1e9:.1f}",
            "q_tps": f"{q['output_tokens_per_s']:.2f}", "q_pre": f"{q['num_preemptions']:,}",
            "q_rec": f"{q['recomputed_tokens']:,}"}


@source("regression scale", "kvsim regress configs/regress/baseline.json --scale "
        "hardware.dram.data_rate_mtps=0.99",
        "a 1 % slower DRAM moves {moved} of the", heavy=True)
def _regress_scale(fresh: Fresh) -> dict[str, str]:
    from sim.app.cli.main import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        rc = main(["regress", str(ROOT / "configs" / "regress" / "baseline.json"), "--scale",
                   "hardware.dram.data_rate_mtps=0.99", "--json"])
    assert rc == 1
    return {"moved": str(json.loads(buf.getvalue())["failed"])}


SMOL = ["model.preset='smollm2-135m'", "outputs.trace=off"]


@source("read paths", "kvsim run --set model.preset=smollm2-135m --set "
        "workload.prompt_tokens=256 [--set kv.read=dequant]; decode: --set kv.format=kivi-2 "
        "--set workload.context_tokens=4000 --set workload.prompt_tokens=1",
        "a 256-token prefill takes {p_int} ms (int8, integer) vs {p_dq} ms (int8, dequant); "
        "decode at 4,000 tokens of `kivi-2` {d_int} vs {d_dq} ms", heavy=True)
def _read_paths(fresh: Fresh) -> dict[str, str]:
    out = {}
    for key, read in (("int", "integer"), ("dq", "dequant")):
        p = _metrics([*SMOL, "workload.prompt_tokens=256", "workload.output_tokens=2",
                      f"kv.read={read!r}"])
        d = _metrics([*SMOL, "kv.format='kivi-2'", "workload.context_tokens=4000",
                      "workload.prompt_tokens=1", "workload.output_tokens=3",
                      f"kv.read={read!r}"])
        out |= {f"p_{key}": f"{p['prefill']['ttft_s'] * 1e3:.2f}",
                f"d_{key}": f"{d['decode']['time_per_token_s'] * 1e3:.3f}"}
    return out


@source("weight groups", "kvsim run --set model.preset=smollm2-135m --set bits.preset=W4V8 "
        "--set bits.numerics.weight_group=G --set workload.prompt_tokens=255",
        "W4V8 weights {ch} MB (channel), {g128} MB (g128), {g32} MB (g32); decode at 255 tokens "
        "on `aries` {d_ch} / {d_g128} / {d_g32} ms", heavy=True)
def _weight_groups(fresh: Fresh) -> dict[str, str]:
    out = {}
    for key in ("channel", "g128", "g32"):
        m = _metrics([*SMOL, "bits.preset='W4V8'", f"bits.numerics.weight_group={key!r}",
                      "workload.prompt_tokens=255", "workload.output_tokens=3"])
        k = "ch" if key == "channel" else key
        out |= {k: f"{m['compiled']['weight_bytes'] / 1e6:.2f}",
                f"d_{k}": f"{m['decode']['time_per_token_s'] * 1e3:.3f}"}
    return out


@source("gemma 3", "kvsim run configs/quickstart.toml --set model.preset=gemma-3-1b",
        "TTFT {ttft} ms (roofline bound {ttft_bound} ms), {tpot} ms per token (bound "
        "{tpot_bound} ms), {kv} KV bytes per token.", heavy=True)
def _gemma3(fresh: Fresh) -> dict[str, str]:
    m = _metrics(["model.preset='gemma-3-1b'", "outputs.trace=off"], "configs/quickstart.toml")
    return {"ttft": f"{m['prefill']['ttft_s'] * 1e3:.1f}",
            "ttft_bound": f"{m['roofline']['prefill']['bound_s'] * 1e3:.1f}",
            "tpot": f"{m['decode']['time_per_token_s'] * 1e3:.1f}",
            "tpot_bound": f"{m['roofline']['decode_per_token']['bound_s'] * 1e3:.1f}",
            "kv": f"{m['kv_cache']['bytes_per_token']:,.0f}"}


@source("tiny-gemma3 cosines", "the functional tiny-gemma3 runs of tests/models/test_gemma.py",
        "mean logit cosine to the float reference {int8} with the static int8 numerics, "
        "{wide} with `w8` without the rotation", heavy=True)
def _tiny_gemma3(fresh: Fresh) -> dict[str, str]:
    from models.bits import build_numerics
    from tests.models.test_gemma import _cosines

    out = {}
    for key, numerics in (("int8", None), ("wide", build_numerics(
            {"preset": "w8", "rotation": "none"}).model_dump())):
        cos = _cosines(numerics)
        out[key] = f"{sum(cos) / len(cos):.4f}"
    return out


def _vendor_tps() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("vendor_tps",
                                                  ROOT / "benchmarks" / "vendor_tps.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


#: ``kvsim vendor folder --out smol``'s compile settings (its defaults; aries' widest mode).
SMOL_FOLDER = {"model": "smollm2-135m", "bits": "W8", "numerics": "w8", "kv": "int8",
               "hw": "aries", "core_mode": "global8", "max_seq": 128, "cache_length": 2048}


@source("vendor TPS, kvsim run", "python benchmarks/vendor_tps.py --folder smol --harness "
        "tps.json (its kvsim run column; the harness's own figures: MEASURED)",
        "| measure: TTFT, prefill 128 | 17.873633 ms (7161.39 tok/s) | {m_ttft} ms ({m_tps} "
        "tok/s) |",
        "| measure: decode, 32 tokens | 6.706158 ms/token (149.117 tok/s) | {m_tpot} ms/token |",
        "| sweep: TTFT, prefill 256 / 384 / 512 | 35.927449 / 54.274029 / 72.801866 ms | "
        "{p256} / {p384} / {p512} ms |",
        "| sweep: decode at cache 128, `count_npu_time` | 6.706038 ms/token | {d128} ms/token |",
        "| sweep: decode at cache 128, harness total | 6.946815 ms/token (143.95 tok/s) | "
        "{d128} ms/token |",
        "| sweep: decode at cache 512 / 1024 | 6.819463 / 6.937057 ms/token | {d512} / {d1024} "
        "ms/token |", heavy=True)
def _vendor_kvsim_run(fresh: Fresh) -> dict[str, str]:
    mod = _vendor_tps()
    m = mod._run(SMOL_FOLDER, prompt=128, out=33)
    out = {"m_ttft": f"{m['prefill']['ttft_s'] * 1e3:.6f}",
           "m_tps": f"{m['prefill']['tokens_per_s']:.2f}",
           "m_tpot": f"{m['decode']['time_per_token_s'] * 1e3:.6f}"}
    for p in (256, 384, 512):
        out[f"p{p}"] = f"{mod.kvsim_prefill_s(SMOL_FOLDER, p) * 1e3:.6f}"
    for c in (128, 512, 1024):  # the sweep's --decode-window 8
        out[f"d{c}"] = f"{mod.kvsim_decode_s(SMOL_FOLDER, c, 8) * 1e3:.6f}"
    return out


#: Figures the README quotes that no run of kvsim alone reproduces: measured by clients and
#: packages kvsim does not install (AIPerf; transformers-mblt's TPS harness and generate()
#: under ``kvsim exec``), or by the functional server's start (minutes, the server extra).
#: The quote, and the command that measured it; each quote must stand in the README, and
#: its figures are as measured on the date the README gives (not re-run by the suite).
MEASURED = {
    "France is Paris.\" (8 tokens, the last `<|im_end|>`, which ends the text and is not sent; "
    "simulated TTFT 8.1 ms)": "kvsim serve --http --fidelity functional and the chat request "
                              "of the README",
    "| TTFT, kvsim | 129.36 | 136.41 | 137.85 | 107.97 |":
        "python benchmarks/http_client.py --aiperf ... (kvsim's figures for AIPerf's requests)",
    "| inter-token latency, kvsim | 7.62 | 10.79 | 10.79 | 8.41 |":
        "python benchmarks/http_client.py --aiperf ...",
    "`count_npu_time` reports 6.936 ms of prefill (1 call) and 100.535 ms of decode (15 calls)":
        "transformers-mblt generate() under kvsim exec",
    "| measure: TTFT, prefill 240 (one 256-token call) | 451.000904 ms (532.15 tok/s) | "
    "450.998264 ms | 451.000905 ms |": "transformers-mblt tps measure on a Llama-3.2-1B "
                                       "folder and benchmarks/vendor_tps.py",
    "| measure: decode, 10 tokens | 34.335527 ms/token (29.124 tok/s) | 34.335528 ms/token | "
    "34.335528 ms/token |": "transformers-mblt tps measure on a Llama-3.2-1B folder and "
                            "benchmarks/vendor_tps.py",
}


def missing(src: Source, values: dict[str, str]) -> list[str]:
    """The quotes of ``src``, filled in with ``values``, that the README does not hold."""
    text = normalized(README.read_text(encoding="utf-8"))
    return [q.format(**values) for q in src.quotes
            if normalized(q.format(**values)) not in text]


def main(names: list[str]) -> int:
    import tempfile

    bad = 0
    for name in names or list(SOURCES):
        src = SOURCES[name]
        with tempfile.TemporaryDirectory() as tmp:
            values = src.produce(Fresh(Path(tmp)))
        print(f"{name}: {json.dumps(values)}")
        for q in missing(src, values):
            bad += 1
            print(f"  not in the README: {q}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
