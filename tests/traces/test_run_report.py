"""The data behind the run report (per-call rows, the time breakdown, long-timeline bins)
and the layout of the sweep report, checked without a browser."""

from __future__ import annotations

import html
import re

import pytest

from sim.app.config import load_run_config
from sim.app.run import run
from traces.recorder import Span
from traces.report import _binned_lanes, run_report
from traces.sweep_report import sweep_report, x_axis

TINY = ["hardware.preset=tiny", "model.preset=tiny", "compile.core_mode=single",
        "workload.prompt_tokens=8", "workload.output_tokens=4"]


@pytest.fixture(scope="module")
def tiny():
    return run(load_run_config(None, TINY))


def test_one_row_per_call_with_phase_step_tokens_and_cache(tiny):
    m = tiny.metrics
    calls = m.calls
    assert [(c.phase, c.step, c.tokens, c.cache_tokens) for c in calls] == [
        ("launch", 0, 0, 0), ("prefill", 0, 8, 8), ("decode", 1, 1, 9), ("decode", 2, 1, 10),
        ("decode", 3, 1, 11)]
    # calls follow each other; the last one ends the run
    for a, b in zip(calls, calls[1:], strict=False):
        assert a.end_s == b.start_s
    assert calls[-1].kv_cache_bytes == m.kv_cache.bytes
    assert calls[1].time_s == m.prefill.ttft_s
    assert tuple(c.time_s for c in calls[2:]) == m.decode.time_per_call_s
    # DRAM bytes of every kind add up to the run's DRAM traffic
    t = m.traffic_bytes
    assert sum(sum(c.dram_bytes_by_kind.values()) for c in calls[1:]) == (
        t["dram_read"] + t["dram_write"])
    assert sum(c.dram_bytes for c in calls[1:]) == t["dram_read"] + t["dram_write"]


def test_time_breakdown_is_each_resources_demand(tiny):
    m = tiny.metrics.to_metrics()  # the metrics.json tree
    hw = tiny.config.hardware
    tb = m["time_breakdown"]
    assert list(tb) == ["launch", "prefill", "decode", "decode_per_token"]
    pre = tb["prefill"]
    assert pre["elapsed_s"] == m["prefill"]["ttft_s"]
    row = m["calls"][1]["dram_bytes_by_kind"]
    bw = hw.dram.effective_bytes_per_s
    assert pre["dram_weights_s"] == row["weights"] / bw
    assert pre["dram_kv_cache_s"] == row["kv_cache"] / bw
    assert pre["runtime_overhead_s"] == hw.host.call_overhead_ns * 1e-9
    demands = {"dram": sum(v for k, v in pre.items() if k.startswith("dram_")),
               "compute": pre["compute_s"], "host_link": pre["host_link_s"],
               "runtime_overhead": pre["runtime_overhead_s"]}
    assert pre["critical"] == max(demands, key=demands.get)
    # no resource needs more than the phase took (host link: its two directions summed)
    for key in ("compute_s", "runtime_overhead_s"):
        assert pre[key] <= pre["elapsed_s"]
    assert demands["dram"] <= pre["elapsed_s"]
    assert tb["launch"]["critical"] == "host_link"
    per = tb["decode_per_token"]
    assert per["elapsed_s"] == pytest.approx(m["decode"]["time_per_token_s"], rel=1e-12)
    assert per["calls"] == 1 and tb["decode"]["calls"] == 3


def test_compute_demand_is_the_busiest_cores_mxu_and_vpu(tiny):
    busy = tiny.metrics.engine_busy_s
    tb = tiny.metrics.to_metrics()["time_breakdown"]
    total = sum(tb[p]["compute_s"] for p in ("launch", "prefill", "decode"))
    assert total == pytest.approx(busy["core0.mxu"] + busy["core0.vpu"], rel=1e-12)


def test_headline_cards_carry_the_metrics_they_show(tiny):
    page = run_report(tiny.metrics, tiny.recorder)
    cards = re.findall(r'<div class="card" data-metric="([^"]+)" data-value="([^"]+)">'
                       r'<div class="label">([^<]*)</div><div class="value">([^<]*)</div>',
                       page)
    got = {metric: (float(value), html.unescape(text)) for metric, value, _, text in cards}
    m = tiny.metrics.to_metrics()
    assert got["prefill.ttft_s"] == (m["prefill"]["ttft_s"],
                                     f"{m['prefill']['ttft_s'] * 1e6:,.2f} µs")
    assert got["decode.tokens_per_s"] == (m["decode"]["tokens_per_s"],
                                          f"{m['decode']['tokens_per_s']:,.1f} tokens/s")
    assert got["kv_cache.capacity_tokens"][1] == f"{m['kv_cache']['capacity_tokens']:,} tokens"
    # the headline comes before the first chart
    assert page.index('class="cards"') < page.index('id="fig0"')


def test_long_timelines_are_binned_with_exact_busy_fractions():
    # one lane, 0..100 ps, bins of 25 ps: gemm 0-30, vec 30-40, gemm 60-100
    spans = [Span("core0", "mxu", "gemm", 0, 30), Span("core0", "vpu", "vec", 30, 40),
             Span("core0", "mxu", "gemm", 60, 100)]
    bins = _binned_lanes(spans, 4)
    lane = ("core0", "mxu")
    gemm = sorted((r[1] * 1e9, r[3], r[4]) for r in bins["gemm"] if r[0] == lane)
    # bin starts (ps), busy fraction, instructions that started in the bin
    assert gemm == [(0.0, 1.0, 1), (25.0, 0.2, 0), (50.0, 0.6, 1), (75.0, 1.0, 0)]
    assert [(r[0], r[1] * 1e9, r[3]) for r in bins["vec"]] == [(("core0", "vpu"), 25.0, 0.4)]


def test_sweep_puts_the_numeric_axis_along_x_and_formats_as_series():
    axes = {"kv.format": ["bf16", "int8"], "workload.prompt_tokens": [8, 64, 512]}
    assert x_axis(axes) == "workload.prompt_tokens"
    assert x_axis({"kv.format": ["bf16", "int8"], "bits.preset": ["W8"]}) == "kv.format"
    rows = [{"index": i, "status": "ok", "kv.format": f, "workload.prompt_tokens": n,
             "decode.time_per_token_s": 1e-3 * (i + 1), "kv_cache.bytes_per_token": 64.0}
            for i, (f, n) in enumerate((f, n) for f in axes["kv.format"]
                                       for n in axes["workload.prompt_tokens"])]
    page = sweep_report("s", axes, rows, ["decode.time_per_token_s",
                                          "kv_cache.bytes_per_token"])
    assert page.count('class="plotly-graph-div"') == 2  # one chart per metric
    assert "decode time per token vs prompt tokens" in page
    assert '"name":"KV format bf16"' in page and '"name":"KV format int8"' in page
    assert "1 – 6 ms" in page  # the range card of decode time
    assert "lowest at KV format bf16, prompt tokens 8" in page


def test_layer_marks_become_one_span_per_layer_of_each_call(tiny):
    rec = tiny.recorder
    calls = [s for s in rec.spans if s.block == "runtime" and s.lane == "calls"
             and s.name == "infer"]
    layers = [s for s in rec.spans if s.block == "runtime" and s.lane == "layers"]
    # tiny: 2 layers, the 8-token prefill in one token tile, then 3 decode calls
    assert [s.name for s in layers] == ["layer 0", "layer 1"] * 4
    for i, call in enumerate(calls):
        l0, l1 = layers[2 * i : 2 * i + 2]
        assert call.start_ps < l0.start_ps < l1.start_ps and l1.end_ps <= call.end_ps
        # a layer spans exactly its instructions' spans (the recorded ones of its call)
        own = [s for s in rec.spans if s.args and "index" in s.args
               and call.start_ps <= s.start_ps and s.end_ps <= call.end_ps
               and l0.args["first"] <= s.args["index"] < l0.args["end"]]
        assert l0.start_ps == min(s.start_ps for s in own)
        assert l0.end_ps == max(s.end_ps for s in own)
        assert l0.args["end"] == l1.args["first"]
    page = run_report(tiny.metrics, rec)
    assert '"y":["layers","layers","layers","layers"]' in page


def test_marks_change_neither_the_encoded_program_nor_its_equality(tiny):
    from dataclasses import replace

    from isa.encoding import decode_program, encode_program
    from sim.app.check import run_source
    from sim.app.run import ready_for_run

    cm = ready_for_run(tiny.config, run_source(tiny.config)).compiled
    prog = cm.program(tokens=1, cache_size=8)
    assert [m[0] for m in prog.marks] == ["layer 0", "layer 1"]
    bare = replace(prog, marks=())
    assert encode_program(bare) == encode_program(prog)
    assert bare == prog
    assert decode_program(encode_program(prog)) == prog


def test_the_breakdown_draws_the_critical_path_beside_the_largest_demand(tiny):
    page = run_report(tiny.metrics, tiny.recorder)
    assert "on the critical path" in page and "largest demand" in page
    assert "◀ critical" not in page  # the largest demand is not called the critical path


def test_a_gemv_run_has_the_where_the_time_went_breakdown():
    g = run(load_run_config(None, ["hardware.preset=tiny", "workload.kind=gemv",
                                   "workload.k=64", "workload.n=64", "workload.w_bits=8"]))
    tb = g.metrics.time_breakdown
    assert list(tb) == ["gemv"]
    assert tb["gemv"].elapsed_s == g.metrics.sim_time_s
    assert tb["gemv"].runtime_overhead_s == 0.0  # no runtime call: the program alone
    assert [c.phase for c in g.metrics.calls] == ["gemv"]
    page = run_report(g.metrics, g.recorder)
    assert "Where the time went" in page and "on the critical path" in page


# decode time per token (ms) of the kv-bits sweep as the README quotes it
KV_BITS = {"bf16": [13.94, 14.07, 14.40, 14.98, 16.11, 18.40, 22.94],
           "int8": [13.85, 13.94, 14.07, 14.40, 14.96, 16.09, 18.38],
           "kivi-4": [13.85, 13.90, 14.00, 14.17, 14.54, 15.27, 16.66],
           "kivi-2": [13.85, 13.87, 13.93, 14.04, 14.24, 14.70, 15.54]}
CONTEXTS = [512, 1024, 2048, 4096, 8192, 16384, 32764]


def _cards_of(page: str) -> dict[str, tuple[str, str]]:
    """label -> (value text, note) of every card of a page."""
    found = re.findall(r'<div class="card"[^>]*><div class="label">([^<]*)</div>'
                       r'<div class="value">([^<]*)</div>(?:<div class="note">([^<]*)</div>)?',
                       page)
    return {html.unescape(a): (html.unescape(b), html.unescape(c)) for a, b, c in found}


def test_sweep_cards_say_where_each_format_starts_to_pay():
    axes = {"kv.format": list(KV_BITS), "workload.context_tokens": CONTEXTS}
    rows = [{"index": len(KV_BITS) * 0 + i * len(CONTEXTS) + j, "status": "ok",
             "kv.format": f, "workload.context_tokens": n,
             "decode.time_per_token_s": KV_BITS[f][j] / 1e3}
            for i, f in enumerate(KV_BITS) for j, n in enumerate(CONTEXTS)]
    cards = _cards_of(sweep_report("kv bits", axes, rows, ["decode.time_per_token_s"]))
    # as the README reads the table: decode at least 1 % faster, at every longer context
    assert cards["int8 vs bf16"][0] == "pays from 2,048 tokens"
    assert cards["kivi-4 vs bf16"][0] == "pays from 1,024 tokens"
    assert cards["kivi-2 vs bf16"][0] == "pays from 1,024 tokens"
    assert cards["kivi-2 vs bf16"][1] == ("decode time per token at least 1 % lower from "
                                          "there on; 32.3 % lower at 32,764 tokens")


def test_sweep_cards_of_one_axis_compare_with_its_first_value():
    axes = {"bits.preset": ["W8", "W4V8"]}
    rows = [{"index": i, "status": "ok", "bits.preset": b, "decode.time_per_token_s": t}
            for i, (b, t) in enumerate((("W8", 0.01318), ("W4V8", 0.00854)))]
    cards = _cards_of(sweep_report("w", axes, rows, ["decode.time_per_token_s"]))
    assert cards["W4V8 vs W8"] == ("35.2 % lower decode time per token",
                                   "8.54 ms against 13.18 ms")


def test_a_series_that_never_pays_says_so():
    axes = {"kv.format": ["int8", "bf16"], "workload.context_tokens": [512, 1024]}
    rows = [{"index": i, "status": "ok", "kv.format": f, "workload.context_tokens": n,
             "decode.time_per_token_s": t}
            for i, (f, n, t) in enumerate((("int8", 512, 1.0), ("int8", 1024, 1.1),
                                           ("bf16", 512, 1.0), ("bf16", 1024, 1.2)))]
    cards = _cards_of(sweep_report("s", axes, rows, ["decode.time_per_token_s"]))
    assert cards["bf16 vs int8"][0] == "does not pay up to 1,024 tokens"


def test_a_real_model_run_reports_real_weights_and_its_texts(tiny):
    from dataclasses import replace

    from traces.results import TextFigures, WeightsFigures

    metrics = replace(tiny.metrics, weights=WeightsFigures(kind="gguf", real=True),
                      text=TextFigures(prompt="The capital of France is",
                                       generated_text=" Paris <b>", reference_compared=True,
                                       reference_text=" Paris.", first_difference_token=1,
                                       degenerate=None))
    page = run_report(metrics, tiny.recorder)
    assert "<th>weights</th><td>real (gguf)</td>" in page
    text = page[page.index("<h2>Text</h2>"):page.index('<div class="grid">')]
    for label, value in (("prompt", "The capital of France is"), ("NPU", " Paris &lt;b&gt;"),
                         ("float reference", " Paris."),
                         ("first difference", "at generated token 1")):
        assert f"<th>{label}</th><td>{value}</td>" in text, label
    synthetic = run_report(tiny.metrics, tiny.recorder)
    assert "<th>weights</th><td>synthetic (seed 0)</td>" in synthetic
    assert "<h2>Text</h2>" not in synthetic
