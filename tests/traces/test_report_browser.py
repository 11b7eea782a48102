"""Reports open in a real browser (Playwright driving the system Chromium, never a
downloaded one): every figure draws, the page logs nothing to the console, the headline
figures are the numbers of metrics.json, and hovering a chart shows its tooltip. The
quickstart's own report is opened by tests/test_examples.py."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from sim.app.cli.main import main
from sim.app.config import load_run_config
from sim.app.run import render_outputs, run
from traces.browser import check, open_page, playwright_missing
from traces.results import CacheOpRecord

pytestmark = pytest.mark.skipif(
    playwright_missing() is not None,
    reason=f"browser tests skipped: {playwright_missing()} (.ci/run installs Debian's "
           "chromium package where apt works)",
)

#: The quickstart's settings on the tiny model and device (a second instead of a minute).
TINY = ["hardware.preset=tiny", "model.preset=tiny", "compile.core_mode=single",
        "workload.prompt_tokens=8", "workload.output_tokens=4"]
#: Figures of a generate run's report, in page order.
RUN_FIGURES = ["Where the time went", "Timeline", "Roofline", "KV cache in DRAM",
               "DRAM bandwidth", "Host link bandwidth", "Traffic by kind", "Traffic by link",
               "Engine utilization"]
#: Units a headline figure may be shown in, as factors from the metric's own unit.
UNITS = {"ms": 1e-3, "µs": 1e-6, "s": 1.0, "tokens/s": 1.0, "bytes": 1.0, "tokens": 1.0}


def _titles(page) -> list[str]:
    return page.page.evaluate(
        "() => Array.from(document.querySelectorAll('div[id^=fig]'))"
        ".filter(d => d.layout).map(d => d.layout.title.text)")


def _dig(metrics: dict, path: str):
    for part in path.split("."):
        metrics = metrics[part]
    return metrics


def _run_tiny(tmp_path, *extra: str):
    args = ["run", "--out", str(tmp_path), "-q"]
    for s in [*TINY, *extra]:
        args += ["--set", s]
    assert main(args) == 0
    return json.loads((tmp_path / "metrics.json").read_text())


def test_run_report_draws_every_figure_without_errors(tmp_path):
    _run_tiny(tmp_path, "outputs.trace=tiles")
    count, problems = check(tmp_path / "report.html")
    assert problems == []
    assert count == len(RUN_FIGURES)
    with open_page(tmp_path / "report.html") as p:
        titles = _titles(p)
    assert len(titles) == len(RUN_FIGURES)
    for title, start in zip(titles, RUN_FIGURES, strict=True):
        assert title.startswith(start)


def test_headline_figures_equal_metrics_json_and_sit_above_the_fold(tmp_path):
    metrics = _run_tiny(tmp_path)
    with open_page(tmp_path / "report.html") as p:
        cards = p.page.evaluate(
            "() => Array.from(document.querySelectorAll('.card[data-metric]')).map(c => "
            "[c.dataset.metric, c.dataset.value, c.querySelector('.value').textContent, "
            "c.getBoundingClientRect().bottom])")
        fold = p.page.viewport_size["height"]
    shown = [c[0] for c in cards]
    assert shown[:5] == ["prefill.ttft_s", "decode.time_per_token_s", "decode.tokens_per_s",
                         "kv_cache.bytes_per_token", "kv_cache.capacity_tokens"]
    for metric, value, text, bottom in cards:
        expected = _dig(metrics, metric)
        assert float(value) == expected, metric
        number, unit = re.fullmatch(r"([\d,.]+) (\S+)", text).groups()
        shown_value = float(number.replace(",", "")) * UNITS[unit]
        decimals = len(number.split(".")[1]) if "." in number else 0
        # the text is the metric rounded to the digits it shows
        assert abs(shown_value - expected) <= 0.5 * 10 ** -decimals * UNITS[unit], metric
        assert bottom <= fold, f"{metric} is below the fold"


def test_roofline_bounds_beside_the_latencies(tmp_path):
    metrics = _run_tiny(tmp_path)
    with open_page(tmp_path / "report.html") as p:
        notes = dict(p.page.evaluate(
            "() => Array.from(document.querySelectorAll('.card[data-metric]')).map(c => "
            "[c.dataset.metric, c.querySelector('.note').textContent])"))
    bound_us = metrics["roofline"]["prefill"]["bound_s"] * 1e6
    assert notes["prefill.ttft_s"].startswith(f"roofline bound {bound_us:,.2f} µs")


def test_a_hover_shows_a_tooltip(tmp_path):
    _run_tiny(tmp_path)
    with open_page(tmp_path / "report.html") as p:
        page = p.page
        assert page.locator(".hoverlayer .hovertext").count() == 0
        # the timeline's lane of runtime calls: hover the middle of the first prefill bar
        # (its traces come first: launch, prefill, decode)
        bar = page.locator("#fig1 .barlayer .trace.bars").nth(1).locator(".point").first
        bar.scroll_into_view_if_needed()
        r = bar.bounding_box()
        box = (r["x"] + r["width"] / 2, r["y"] + r["height"] / 2)
        page.mouse.move(*box)
        tip = page.locator("#fig1 .hoverlayer .hovertext")
        tip.first.wait_for(timeout=10_000)
        assert "prefill (8 tokens)" in tip.first.text_content()
        assert "ms" in tip.first.text_content()


def test_cache_ops_figure_draws(tmp_path):
    result = run(load_run_config(None, TINY))
    ops = (CacheOpRecord(at_token=8, op="host_edit", where="host", time_s=2e-3,
                         pcie_bytes=1 << 20, dram_bytes=1 << 20, host_model_s=0.0,
                         host_measured_s=0.0, new_cache_size=8),
           CacheOpRecord(at_token=9, op="device_evict", where="device", time_s=5e-4,
                         pcie_bytes=0, dram_bytes=3 << 20, host_model_s=0.0,
                         host_measured_s=0.0, new_cache_size=6))
    result.metrics = dataclasses.replace(result.metrics, cache_ops=ops)
    page = tmp_path / "report.html"
    page.write_text(render_outputs(result)["report.html"])
    count, problems = check(page)
    assert problems == []
    assert count == len(RUN_FIGURES) + 1
    with open_page(page) as p:
        assert _titles(p)[-1] == "Cost of each cache operation"


def test_sweep_report_draws_formats_as_series_of_one_chart_per_metric(tmp_path):
    sweep = tmp_path / "s.toml"
    sweep.write_text(
        "[base]\n" + "\n".join(
            f"{k} = {v if v.isdigit() else repr(v)}" for k, v in (s.split("=") for s in TINY))
        + '\n[axes]\nkv.format = ["bf16", "int8", "kivi-2"]\nworkload.prompt_tokens = [8, 64]\n'
        '[outputs]\nmetrics = ["decode.time_per_token_s", "kv_cache.bytes_per_token", '
        '"prefill.ttft_s"]\n')
    out = tmp_path / "o"
    assert main(["sweep", str(sweep), "--out", str(out), "--workers", "1", "-q"]) == 0
    count, problems = check(out / "report.html")
    assert problems == []
    assert count == 3 + 2  # one chart per metric; where the time went, prefill and decode
    with open_page(out / "report.html") as p:
        series = p.page.evaluate(
            "() => Array.from(document.querySelectorAll('div[id^=fig]')).filter(d => d.data)"
            ".map(d => [d.layout.xaxis.title.text, d.data.map(t => t.name)])")
        titles = _titles(p)
        # every chart is drawn inside its grid cell (the first one was laid out while it was
        # alone in the grid and took the whole row, under its neighbour)
        overflow = p.page.evaluate(
            "() => Array.from(document.querySelectorAll('div[id^=fig]')).filter(d => d.data)"
            ".map(d => d._fullLayout.width - d.parentElement.getBoundingClientRect().width)")
    assert max(overflow) <= 0, overflow
    assert [t.split(":")[0] for t in titles[3:]] == ["Where the time went, prefill",
                                                     "Where the time went, decode, per token"]
    for xlabel, names in series[:3]:
        assert xlabel == "prompt tokens"
        assert names == ["KV format bf16", "KV format int8", "KV format kivi-2"]


def test_serving_report_draws_and_its_headline_equals_metrics_json(tmp_path):
    args = ["serve", "--out", str(tmp_path), "-q"]
    for s in ("hardware.preset=tiny", "model.preset=tiny", "compile.core_mode=single",
              "serving.workload.requests=12", "serving.workload.prompt_tokens=32",
              "serving.workload.output_tokens=4", "serving.max_num_seqs=4",
              "serving.max_num_batched_tokens=64"):
        args += ["--set", s]
    assert main(args) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    count, problems = check(tmp_path / "report.html")
    assert problems == []
    assert count == 5
    with open_page(tmp_path / "report.html") as p:
        assert _titles(p)[0].startswith("Where the time went")
        cards = p.page.evaluate(
            "() => Array.from(document.querySelectorAll('.card[data-metric]')).map(c => "
            "[c.dataset.metric, c.dataset.value])")
    assert [c[0] for c in cards][:3] == ["serving.output_tokens_per_s", "serving.ttft_s_p50",
                                         "serving.tpot_s_p50"]
    for metric, value in cards:
        assert float(value) == _dig(metrics, metric), metric


def test_the_checker_sees_javascript_errors(tmp_path):
    page = tmp_path / "bad.html"
    page.write_text('<html><body><div id="fig0"></div><script>'
                    'throw new Error("boom")</script></body></html>')
    with open_page(page) as p:
        assert p.figures() == {"fig0": False}
        assert any("boom" in line for line in p.console)
    count, problems = check(page)
    assert count == 1
    assert "figure fig0 did not draw" in problems
