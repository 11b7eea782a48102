"""Typed run figures (``sim.results``): read from metrics.json, back under its names."""

from __future__ import annotations

import dataclasses

import pytest

from sim.results import CacheOpFigures, RunFigures

METRICS = {
    "prefill": {"ttft_s": 1.0}, "decode": {"time_per_token_s": 0.5, "tokens_per_s": 2.0},
    "launch": {"time_s": 0.25, "pcie_h2d_bytes": 3}, "sim_time_s": 9.0,
    "traffic_bytes": {"dram_read": 10, "odd": "x"}, "traffic_by_kind": {"weights": 4},
    "cache_ops": [{"op": "dump_load", "time_s": 0.1, "pcie_bytes": 7},
                  {"op": "host_evict", "time_s": 0.2, "host_model_s": 0.3,
                   "host_measured_s": 0.01}],
}


def test_figures_are_typed_fields_with_units_in_their_names():
    f = RunFigures.from_metrics(METRICS)
    assert (f.ttft_s, f.time_per_token_s, f.decode_tokens_per_s, f.launch_time_s) == (
        1.0, 0.5, 2.0, 0.25)
    assert f.sim_time_s is None  # a run with prefill: its figures are TTFT and per token
    assert f.traffic_bytes == (("dram_read", 10),)
    assert f.traffic_by_kind_bytes == (("weights", 4),)
    assert f.cache_ops == (CacheOpFigures(time_s=0.1, pcie_bytes=7),
                           CacheOpFigures(time_s=0.2, host_model_s=0.3))
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.ttft_s = 2.0  # type: ignore[misc]


def test_figures_come_back_under_their_metrics_json_names():
    assert RunFigures.from_metrics(METRICS).figures() == {
        "cache_ops[0].pcie_bytes": 7, "cache_ops[0].time_s": 0.1,
        "cache_ops[1].host_model_s": 0.3, "cache_ops[1].time_s": 0.2,
        "decode.time_per_token_s": 0.5, "decode.tokens_per_s": 2.0, "launch.time_s": 0.25,
        "prefill.ttft_s": 1.0, "traffic_bytes.dram_read": 10, "traffic_by_kind.weights": 4}
    gemv = RunFigures.from_metrics({"sim_time_s": 3.0, "traffic_bytes": {"dram_read": 1}})
    assert gemv.figures() == {"sim_time_s": 3.0, "traffic_bytes.dram_read": 1}
