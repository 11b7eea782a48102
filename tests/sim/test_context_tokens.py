"""``workload.context_tokens``: a generate run that starts from a cache already holding a
context, whose prefill is not simulated; its decode steps cost exactly what they cost
after a real prefill of that length."""

from __future__ import annotations

import pytest

from kvsim.errors import ConfigError
from sim.app.config import cache_length, load_run_config
from sim.app.run import run

BASE = ["hardware.preset=tiny", "model.preset=tiny", "compile.core_mode=single",
        "outputs.trace=off", "compile.max_sequence_length=16"]


def _run(*sets: str):
    return run(load_run_config(None, [*BASE, *sets])).metrics.to_metrics()


def test_decode_after_a_context_costs_what_it_costs_after_its_prefill() -> None:
    ctx = _run("workload.context_tokens=40", "workload.prompt_tokens=8",
               "workload.output_tokens=4")
    full = _run("workload.prompt_tokens=48", "workload.output_tokens=4")
    assert ctx["compiled"]["cache_length"] == full["compiled"]["cache_length"]
    # the same decode steps at cache positions 48, 49, 50, cycle for cycle
    assert ctx["decode"]["time_per_call_s"] == full["decode"]["time_per_call_s"]
    assert ctx["decode"]["tokens"] == 3
    assert ctx["kv_cache"]["context_tokens"] == full["kv_cache"]["context_tokens"] == 51
    # only the 8 prompt tokens were prefilled, in one call
    assert ctx["prefill"]["calls"] == 1 and full["prefill"]["calls"] == 3
    assert ctx["prefill"]["ttft_s"] < full["prefill"]["ttft_s"]
    assert ctx["context"] == {"tokens": 40, "cache_holds": "no bytes (timing-only: only the "
                              "cache length is simulated)"}


def test_a_functional_context_is_the_devices_own_prefill_and_times_alike() -> None:
    sets = ("workload.context_tokens=20", "workload.prompt_tokens=4",
            "workload.output_tokens=3")
    fn = _run(*sets, "sim.fidelity=functional")
    timing = _run(*sets)
    assert fn["context"]["cache_holds"].startswith("the device's own prefill")
    assert fn["decode"]["time_per_call_s"] == timing["decode"]["time_per_call_s"]
    assert fn["prefill"]["ttft_s"] == timing["prefill"]["ttft_s"]
    assert len(fn["generated_tokens"]) == 3
    # the metrics count the prompt and decode calls, not the context's prefill
    assert [c["phase"] for c in fn["calls"]] == ["launch", "prefill", "decode", "decode"]


def test_the_cache_is_sized_for_context_prompt_and_output() -> None:
    cfg = load_run_config(None, [*BASE, "workload.context_tokens=1000",
                                 "workload.prompt_tokens=8", "workload.output_tokens=4"])
    assert cache_length(cfg) >= 1012


def test_a_context_the_cache_cannot_hold_is_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError, match="compile.cache_length: 64 tokens cannot hold the "
                       "67 tokens .*context_tokens 60"):
        _run("workload.context_tokens=60", "workload.prompt_tokens=4",
             "workload.output_tokens=4", "compile.cache_length=64")
