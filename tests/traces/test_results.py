"""Typed results (``traces.results``): the regress figures read from metrics.json and back
under its names; everything metrics.json holds as frozen dataclasses that give the same
file back and the sweep's columns."""

from __future__ import annotations

import dataclasses
import json

import pytest

from traces.results import (
    CacheOpFigures,
    CacheOpRecord,
    GemvMetrics,
    GenerateMetrics,
    KvCacheFigures,
    ResultsError,
    RunFigures,
    TextFigures,
    run_metrics,
)

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


# --- everything metrics.json holds, typed ---------------------------------------------------

TINY = {"hardware": {"preset": "tiny"}, "model": {"preset": "tiny"},
        "compile": {"core_mode": "single"}}
#: three tiny runs: cache operations on the host and the device (timing), a functional run
#: (its ``text`` entry) and the GEMV demo (its own metrics)
RUNS = {
    "cache-ops": {**TINY, "workload": {"prompt_tokens": 48, "output_tokens": 4, "cache_ops": [
        {"at_token": 48, "op": "evict", "where": "host", "policy": "window", "sinks": 4,
         "recent": 20},
        {"at_token": 49, "op": "evict", "where": "device", "policy": "positions",
         "drop": [5, 6, 7]},
        {"at_token": 50, "op": "dump_load"}]}},
    "functional": {**TINY, "workload": {"prompt_tokens": 8, "output_tokens": 3},
                   "sim": {"fidelity": "functional"}},
    "gemv": {"hardware": {"preset": "tiny"},
             "workload": {"kind": "gemv", "k": 64, "n": 64, "w_bits": 8}},
}


@pytest.fixture(scope="module")
def runs() -> dict:
    """Each tiny run's result (its typed metrics and events)."""
    import copy

    from sim.app.config import build_run_config
    from sim.app.run import run

    out = {}
    for name, tree in RUNS.items():
        tree = copy.deepcopy(tree)
        tree["outputs"] = {"trace": "off"}
        out[name] = run(build_run_config(tree))
    return out


@pytest.fixture(scope="module")
def metrics_text(runs) -> dict[str, str]:
    """Each tiny run's ``metrics.json`` text, as ``kvsim run`` writes it."""
    from sim.app.run import render_outputs

    return {name: render_outputs(r)["metrics.json"] for name, r in runs.items()}


@pytest.mark.parametrize("name", list(RUNS))
def test_a_run_builds_its_typed_result_and_metrics_json_is_written_from_it(runs, metrics_text,
                                                                           name):
    typed = runs[name].metrics
    assert type(typed) is (GemvMetrics if name == "gemv" else GenerateMetrics)
    assert json.dumps(typed.to_metrics(), indent=1) + "\n" == metrics_text[name]
    # regress reads the same figures from the typed result as from the file
    assert RunFigures.of(typed) == RunFigures.from_metrics(json.loads(metrics_text[name]))


def _flat(tree, prefix=""):
    """The obvious flattening of a metrics tree the sweep wrote before its rows were typed:
    dicts by dotted names, lists of dicts by index, lists of values left out."""
    out = {}
    for key, value in tree.items():
        name = f"{prefix}.{key}" if prefix else key
        if not prefix and key in ("config", "calls"):
            continue
        if isinstance(value, dict):
            out.update(_flat(value, name))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, dict):
                    out.update(_flat(item, f"{name}[{i}]"))
        else:
            out[name] = value
    return out


@pytest.mark.parametrize("name", list(RUNS))
def test_metrics_json_round_trips_through_the_typed_result(metrics_text, name):
    text = metrics_text[name]
    typed = run_metrics(json.loads(text))
    assert type(typed) is (GemvMetrics if name == "gemv" else GenerateMetrics)
    assert json.dumps(typed.to_metrics(), indent=1) + "\n" == text  # keys, order, values
    # the sweep's row: every figure of the tree, in its order, none lost or renamed
    assert list(typed.columns().items()) == list(_flat(json.loads(text)).items())


def test_typed_results_carry_units_in_their_names(metrics_text):
    m = json.loads(metrics_text["cache-ops"])
    typed = run_metrics(m)
    assert isinstance(typed, GenerateMetrics)
    kv = typed.kv_cache
    assert isinstance(kv, KvCacheFigures)
    assert (kv.bytes, kv.bytes_per_token, kv.capacity_tokens) == (
        m["kv_cache"]["bytes"], m["kv_cache"]["bytes_per_token"],
        m["kv_cache"]["capacity_tokens"])
    assert typed.traffic_by_kind_bytes["kv_cache"] == m["traffic_by_kind"]["kv_cache"]
    assert typed.compiled.cache_tokens == m["compiled"]["cache_length"]
    assert [op.op for op in typed.cache_ops] == ["host_evict", "device_evict", "dump_load"]
    assert isinstance(typed.cache_ops[0], CacheOpRecord)
    assert typed.cache_ops[0].new_cache_size == 24  # 4 sinks + 20 recent kept
    assert typed.time_breakdown["decode"].critical == m["time_breakdown"]["decode"]["critical"]
    assert typed.roofline.decode_per_token.bound_s == m["roofline"]["decode_per_token"][
        "bound_s"]
    assert typed.text is None and not typed.functional
    with pytest.raises(dataclasses.FrozenInstanceError):
        typed.kv_cache.bytes = 0  # type: ignore[misc]
    with pytest.raises(TypeError):
        typed.traffic_bytes["dram_read"] = 0  # type: ignore[index]
    functional = run_metrics(json.loads(metrics_text["functional"]))
    assert isinstance(functional, GenerateMetrics) and functional.functional
    assert functional.text == TextFigures(None, None, False, None, None, None)
    assert "text.degenerate" in functional.columns()


def test_the_text_of_a_run_against_its_reference_round_trips():
    compared = {"prompt": "The capital", "generated_text": " of France",
                "reference_text": " of France", "first_difference": None, "degenerate": None}
    t = TextFigures.from_metrics(compared)
    assert t.reference_compared and t.first_difference_token is None
    assert t.to_metrics() == compared and list(t.to_metrics()) == list(compared)
    assert t.columns() == compared
    with pytest.raises(ResultsError, match=r"metrics.json.first_difference: missing"):
        TextFigures.from_metrics({k: v for k, v in compared.items()
                                  if k != "first_difference"})


@pytest.mark.parametrize(("edit", "needle"), [
    (lambda m: m["kv_cache"].pop("bytes"), r"metrics.json.kv_cache.bytes: missing"),
    (lambda m: m["kv_cache"].update(bits=4), r"metrics.json.kv_cache.bits: unknown key"),
    (lambda m: m.update(extra=1), r"metrics.json.extra: unknown key"),
    (lambda m: m["prefill"].update(ttft_s="fast"),
     r"metrics.json.prefill.ttft_s: expected a number, got 'fast'"),
    (lambda m: m["compiled"].update(m_tile=1.5),
     r"metrics.json.compiled.m_tile: expected an integer"),
    (lambda m: m["cache_ops"][1].update(where=None),
     r"metrics.json.cache_ops\[1\].where: expected a str"),
    (lambda m: m.update(calls={}), r"metrics.json.calls: expected a list"),
])
def test_a_tree_that_is_not_a_runs_metrics_names_the_entry(metrics_text, edit, needle):
    m = json.loads(metrics_text["cache-ops"])
    edit(m)
    with pytest.raises(ResultsError, match=needle):
        run_metrics(m)
