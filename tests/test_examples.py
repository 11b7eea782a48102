"""The example configs of configs/, one per user question: each validates, and each runs in
timing mode with the results the README quotes holding in direction (the slow test of the
suite: a few minutes; ``-m "not slow"`` leaves it out).

The quickstart's report.html is opened in headless Chromium (where there is one) and its
trace checked for Perfetto; the sweeps' reports are opened too.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from sim.app.cli.main import main
from sim.app.config import load_run_config
from sim.app.sweep.sweep import load_sweep, run_sweep
from tests.groups import QUICKSTART
from tests.traces.test_trace_levels import assert_perfetto_ready
from traces.browser import check, find_chromium

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
RUNS = ["quickstart.toml", "real-model.toml", "long-context-decode.toml"]
SWEEPS = ["kv-bits-sweep.toml", "w8-vs-w4v8.toml", "mla-quantmla-vs-bf16.toml",
          "host-vs-device-edit.toml"]


def _rows(out: Path) -> dict[tuple, dict]:
    """results.csv by the point's axis values."""
    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    axes = json.loads((out / "results.json").read_text())["sweep"]["axes"]
    return {tuple(r[a] for a in axes): r for r in rows}


def _browser_check(page: Path) -> None:
    if find_chromium() is None:
        return  # tests/traces/test_report_browser.py says why it skips
    count, problems = check(page)
    assert problems == [] and count > 0


def _cache_ops_executed() -> bool:
    """Whether ``kvsim run`` executes ``workload.cache_ops`` yet (a tiny run with one op)."""
    from sim.app.run import run

    cfg = load_run_config(None, [
        "hardware.preset=tiny", "model.preset=tiny", "compile.core_mode=single",
        "workload.prompt_tokens=8", "workload.output_tokens=2", "outputs.trace=off",
        'workload.cache_ops=[{at_token=8, op="dump_load"}]'])
    return bool(run(cfg).metrics.cache_ops)


def test_quickstart_is_the_embedded_default():
    assert load_run_config(CONFIGS / "quickstart.toml") == load_run_config(None)


@pytest.mark.parametrize("name", RUNS + SWEEPS)
def test_example_config_validates(name, capsys, monkeypatch):
    monkeypatch.chdir(CONFIGS.parent)  # model.hf_config paths are relative to the repository
    assert main(["check", str(CONFIGS / name)]) == 0
    assert capsys.readouterr().out.startswith("ok: ")


@pytest.mark.slow
@pytest.mark.xdist_group(QUICKSTART)
def test_quickstart_runs(embedded_default_run):
    # the run of the embedded default, which is this file's config (the test above), shared
    # with tests/sim/test_cli.py: one full run and its outputs for both (tests/conftest.py)
    out = embedded_default_run
    m = json.loads((out / "metrics.json").read_text())
    assert m["kv_cache"]["bytes_per_token"] == 6144
    assert m["prefill"]["ttft_s"] >= m["roofline"]["prefill"]["bound_s"]
    assert m["decode"]["time_per_token_s"] >= m["roofline"]["decode_per_token"]["bound_s"]
    trace = json.loads((out / "trace.json").read_text())
    assert_perfetto_ready(trace)
    assert trace["otherData"]["dropped_events"] == m["trace"]["dropped_events"]
    _browser_check(out / "report.html")


@pytest.mark.slow
def test_kv_bits_sweep_runs(tmp_path):
    out = tmp_path / "kv-bits"
    # the shipped file's shortest and longest contexts (its 28 points take minutes)
    res = run_sweep(load_sweep(CONFIGS / "kv-bits-sweep.toml",
                               axes=["workload.context_tokens=[512, 32764]"]),
                    out, workers=2, progress=False)
    assert not res.failed
    rows = _rows(out)
    per_token = {f: float(rows[(f, "512")]["kv_cache.bytes_per_token"])
                 for f in ("bf16", "int8", "kivi-4", "kivi-2")}
    assert per_token["bf16"] == 2 * per_token["int8"] == 12288
    assert per_token["int8"] > per_token["kivi-4"] > per_token["kivi-2"]
    kv_traffic = {f: int(rows[(f, "512")]["traffic_by_kind.kv_cache"]) for f in per_token}
    # KIVI keeps its 128 most recent tokens in fp16: at 512 tokens KIVI-4 moves nearly as
    # much as int8 (9,255,168 vs 9,492,480 bytes)
    assert kv_traffic["bf16"] > kv_traffic["int8"] > kv_traffic["kivi-4"] > kv_traffic[
        "kivi-2"]
    assert kv_traffic["kivi-4"] > 0.95 * kv_traffic["int8"]
    decode = {f: float(rows[(f, "32764")]["decode.time_per_token_s"]) for f in per_token}
    for f in per_token:  # a longer context costs more per decoded token
        assert decode[f] > float(rows[(f, "512")]["decode.time_per_token_s"])
    # at 32K tokens of context the cache's bits decide: fewer bits, faster decode
    assert decode["bf16"] > decode["int8"] > decode["kivi-4"] > decode["kivi-2"]
    _browser_check(out / "report.html")


@pytest.mark.slow
def test_w8_vs_w4v8_runs(tmp_path):
    out = tmp_path / "w8-vs-w4v8"
    res = run_sweep(load_sweep(CONFIGS / "w8-vs-w4v8.toml"), out, workers=2, progress=False)
    assert not res.failed
    rows = _rows(out)
    w8, w4 = rows[("W8",)], rows[("W4V8",)]
    # 4-bit weights but for the V projection and the (tied) LM head
    assert int(w4["compiled.weight_bytes"]) < 0.7 * int(w8["compiled.weight_bytes"])
    assert float(w4["decode.time_per_token_s"]) < float(w8["decode.time_per_token_s"])
    _browser_check(out / "report.html")


@pytest.mark.slow
def test_mla_quantmla_vs_bf16_runs(tmp_path):
    out = tmp_path / "mla"
    res = run_sweep(load_sweep(CONFIGS / "mla-quantmla-vs-bf16.toml"), out, workers=2,
                    progress=False)
    assert not res.failed
    rows = _rows(out)
    bf16, c4r4 = rows[("bf16",)], rows[("quantmla-c4r4",)]
    assert int(c4r4["kv_cache.capacity_tokens"]) > 3 * int(bf16["kv_cache.capacity_tokens"])
    assert int(c4r4["compiled.dram_bytes"]) < int(bf16["compiled.dram_bytes"])
    _browser_check(out / "report.html")


@pytest.mark.slow
def test_host_vs_device_edit_runs(tmp_path):
    if not _cache_ops_executed():
        pytest.skip("kvsim run validates workload.cache_ops but does not execute them yet "
                    "(the runtime's cache-op schedule); configs/host-vs-device-edit.toml "
                    "runs once it does")
    out = tmp_path / "edit"
    res = run_sweep(load_sweep(CONFIGS / "host-vs-device-edit.toml"), out, workers=2,
                    progress=False)
    assert not res.failed
    rows = _rows(out)
    host, device = rows[("host",)], rows[("device",)]
    assert host["cache_ops[0].where"] == "host" and device["cache_ops[0].where"] == "device"
    assert int(host["cache_ops[0].pcie_bytes"]) > 0 == int(device["cache_ops[0].pcie_bytes"])
    _browser_check(out / "report.html")
