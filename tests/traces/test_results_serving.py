"""A serving run's metrics.json as typed data (``traces.serving_results``): the same file
back, units in the field names, a tree of another shape refused by name."""

from __future__ import annotations

import dataclasses
import json

import pytest

from traces.results import ResultsError
from traces.serving_results import ServingMetrics, serving_metrics_of

#: three requests of the tiny model on the tiny device, step costs computed directly
TREE = {"hardware": {"preset": "tiny"}, "model": {"preset": "tiny"},
        "compile": {"core_mode": "single"},
        "serving": {"max_num_seqs": 2, "max_num_batched_tokens": 16,
                    "workload": {"requests": 3, "prompt_tokens": 4, "output_tokens": 2},
                    "cost": {"mode": "direct"}},
        "outputs": {"trace": False, "report": False, "requests_csv": False}}


@pytest.fixture(scope="module")
def metrics_text(tmp_path_factory) -> str:
    from sim.app.serve.config import build_serve_config
    from sim.app.serve.run import run_serving, write_serving_outputs

    out = tmp_path_factory.mktemp("serve")
    paths = write_serving_outputs(run_serving(build_serve_config(TREE)), out)
    return paths["metrics"].read_text()


def test_serving_metrics_json_round_trips_through_the_typed_result(metrics_text):
    typed = serving_metrics_of(json.loads(metrics_text))
    assert isinstance(typed, ServingMetrics)
    assert json.dumps(typed.to_metrics(), indent=1) + "\n" == metrics_text


def test_serving_figures_are_typed_with_units_in_their_names(metrics_text):
    m = json.loads(metrics_text)
    s = serving_metrics_of(m).serving
    assert (s.requests, s.finished_requests, s.output_tokens) == (3, 3, 6)
    assert s.computed_tokens == s.prompt_tokens_computed + s.decode_tokens_computed + \
        s.recomputed_tokens
    assert s.ttft_s_p99 == m["serving"]["ttft_s_p99"] and s.num_preemptions == 0
    assert s.kv.bytes_per_token == m["serving"]["kv"]["bytes_per_token"]
    assert [c.chip for c in s.chips] == [0]
    assert s.kv_occupancy["chip0"].used_blocks == tuple(
        m["serving"]["kv_occupancy"]["chip0"]["used_blocks"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.requests = 4  # type: ignore[misc]
    cols = serving_metrics_of(m).columns()
    assert cols["serving.output_tokens_per_s"] == m["serving"]["output_tokens_per_s"]
    assert cols["compiled.cache_length"] == m["compiled"]["cache_length"]
    # the config, the cost model's description, wall and processor time are not figures
    assert not any(c.startswith(("config", "cost_model", "wall_s", "cpu_s",
                                 "serving.kv_occupancy")) for c in cols)


@pytest.mark.parametrize(("edit", "needle"), [
    (lambda m: m["serving"].pop("num_preemptions"),
     r"metrics.json.serving.num_preemptions: missing"),
    (lambda m: m["serving"]["chips"][0].update(power_w=1.0),
     r"metrics.json.serving.chips\[0\].power_w: unknown key"),
    (lambda m: m["serving"]["kv"].update(num_blocks=1.5),
     r"metrics.json.serving.kv.num_blocks: expected an integer"),
])
def test_a_serving_tree_of_another_shape_names_the_entry(metrics_text, edit, needle):
    m = json.loads(metrics_text)
    edit(m)
    with pytest.raises(ResultsError, match=needle):
        serving_metrics_of(m)
