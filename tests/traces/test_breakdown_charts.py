"""Where the time went in the sweep and serving reports: the charts' numbers from the rows
and step records they are drawn from."""

from __future__ import annotations

from types import SimpleNamespace

from traces.breakdown_chart import serving_breakdown, sweep_breakdowns
from traces.sweep_report import sweep_report


def _row(i: int, fmt: str, weights_s: float) -> dict:
    tb = "time_breakdown.decode_per_token."
    return {"index": i, "status": "ok", "error": "", "kv.format": fmt,
            "decode.time_per_token_s": 2 * weights_s, f"{tb}elapsed_s": 2 * weights_s,
            f"{tb}dram_weights_s": weights_s, f"{tb}dram_kv_cache_s": weights_s / 4,
            f"{tb}compute_s": weights_s / 8}


def test_a_sweep_gets_one_breakdown_per_phase_with_one_bar_per_point():
    rows = [_row(0, "bf16", 1e-3), _row(1, "int8", 2e-3),
            {"index": 2, "status": "error", "error": "boom", "kv.format": "kivi-2"}]
    figs = sweep_breakdowns(rows, lambda r: r["kv.format"])
    assert len(figs) == 1  # no point has a prefill breakdown
    bars = {t.name: list(t.x) for t in figs[0].data}
    assert bars["DRAM: weight streaming"] == [1.0, 2.0]  # ms, the failed point left out
    assert bars["DRAM: KV-cache reads + writes"] == [0.25, 0.5]
    assert bars["host link (both directions)"] == [0.0, 0.0]
    assert bars["elapsed (wall of the phase)"] == [2.0, 4.0]
    assert list(figs[0].data[0].y) == ["bf16", "int8"]
    page = sweep_report("s", {"kv.format": ["bf16", "int8", "kivi-2"]}, rows,
                        ["decode.time_per_token_s"])
    assert "Where the time went, decode, per token" in page


def _step(chip, start, end, swap=0, prefill=0):
    return SimpleNamespace(chip=chip, start_ps=start, end_ps=end, swap_ps=swap,
                           prefill_tokens=prefill)


def test_serving_splits_each_chips_time_by_what_its_steps_did():
    ms = 10**9  # ps
    steps = [[_step(0, 0, 3 * ms, prefill=4), _step(0, 3 * ms, 5 * ms, swap=ms)],
             [_step(1, 0, 1 * ms)]]
    fig = serving_breakdown(steps, duration_s=6e-3)
    bars = {t.name: list(t.x) for t in fig.data}
    assert bars == {"decode-only steps": [1.0, 1.0], "steps with prompt tokens": [3.0, 0.0],
                    "KV swaps (host link)": [1.0, 0.0],
                    "idle (no request ready)": [1.0, 5.0]}
    assert serving_breakdown([[]], 1.0) is None
