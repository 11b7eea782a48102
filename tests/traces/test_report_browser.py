"""Reports open in a real browser: headless Chromium loads report.html of a run and of a
sweep, every figure draws its SVG, and the page logs nothing to the console (no
JavaScript error). The quickstart's own report is opened by tests/test_examples.py."""

from __future__ import annotations

import pytest

from sim.cli import main
from sim.config import load_run_config
from sim.run import render_outputs, run
from traces.browser import check, find_chromium, render

pytestmark = pytest.mark.skipif(
    find_chromium() is None,
    reason="no Chromium binary found: install Debian's chromium package (apt-get install "
           "chromium; .ci/run does it where apt works) or set CHROMIUM to a Chrome binary",
)

#: The quickstart's settings on the tiny model and device (a second instead of a minute).
TINY = ["hardware.preset=tiny", "model.preset=tiny", "compile.core_mode=single",
        "workload.prompt_tokens=8", "workload.output_tokens=4"]


def _assert_renders(page, figures: int) -> None:
    count, problems = check(page)
    assert problems == []
    assert count == figures


def test_run_report_renders_every_figure_without_errors(tmp_path):
    args = ["run", "--out", str(tmp_path), "-q"]
    for s in [*TINY, "outputs.trace=tiles"]:
        args += ["--set", s]
    assert main(args) == 0
    # timeline, bandwidth, traffic, utilization
    _assert_renders(tmp_path / "report.html", 4)


def test_cache_ops_figure_renders(tmp_path):
    result = run(load_run_config(None, TINY))
    result.metrics["cache_ops"] = [
        {"op": "host_edit", "where": "host", "time_s": 2e-3, "pcie_bytes": 1 << 20,
         "dram_bytes": 1 << 20},
        {"op": "device_evict", "where": "device", "time_s": 5e-4, "pcie_bytes": 0,
         "dram_bytes": 3 << 20},
    ]
    page = tmp_path / "report.html"
    page.write_text(render_outputs(result)["report.html"])
    _assert_renders(page, 5)
    assert "Cost of each cache operation" in page.read_text()


def test_sweep_report_renders_every_figure_without_errors(tmp_path):
    sweep = tmp_path / "s.toml"
    sweep.write_text(
        "[base]\n" + "\n".join(
            f"{k} = {v if v.isdigit() else repr(v)}" for k, v in (s.split("=") for s in TINY))
        + '\n[axes]\nkv.format = ["bf16", "int8", "kivi-2"]\nworkload.prompt_tokens = [8, 64]\n'
        '[outputs]\nmetrics = ["decode.time_per_token_s", "kv_cache.bytes_per_token", '
        '"prefill.ttft_s"]\n')
    out = tmp_path / "o"
    assert main(["sweep", str(sweep), "--out", str(out), "--workers", "1", "-q"]) == 0
    _assert_renders(out / "report.html", 3 * 2)  # each metric against each axis


def test_the_checker_sees_javascript_errors(tmp_path):
    page = tmp_path / "bad.html"
    page.write_text('<html><body><div id="fig0"></div><script>'
                    'throw new Error("boom")</script></body></html>')
    r = render(page)
    assert r.figures() == {"fig0": False}
    assert any("Uncaught Error: boom" in line for line in r.console)
