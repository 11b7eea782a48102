"""Speculation under load: the scheduler's exact schedule with verification items (the last
token and its drafts, accepted as the profile draws), every token accounted for, and a
serving run on the tiny model whose drafts and tail cuts are costed from the model."""

from __future__ import annotations

import json

import pytest

from kvsim.errors import ConfigError
from sim.app.serve.config import load_serve_config
from sim.app.serve.run import run_serving, serving_metrics
from sim.runtime.speculative import AcceptanceProfile
from sim.serving.blocks import simple_geometry
from sim.serving.engine import ServingSim
from sim.serving.scheduler import Request, SchedulerConfig
from sim.serving.speculate import SpecPolicy
from tests.sim.test_serving import toy_cost
from traces.serving_results import serving_metrics_of


def _sim(profile: AcceptanceProfile, k: int) -> tuple[ServingSim, list[Request]]:
    reqs = [Request(i, 0, prompt_tokens=4, output_tokens=6) for i in range(2)]
    geo = simple_geometry(block_tokens=4, num_blocks=16, max_tokens=64, block_bytes=100)
    sim = ServingSim(reqs, chips=1, geometry=geo, step_cost=toy_cost,
                     scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16),
                     spec=SpecPolicy(profile, k))
    sim.run()
    return sim, reqs


def test_verification_items_are_scheduled_and_accounted_exactly():
    # every verification drafts 2 and accepts 1: 2 tokens a step, one draft cut
    sim, reqs = _sim(AcceptanceProfile(k=2, counts=((2, 1, 1),)), 2)
    assert [(s.index, s.items, s.start_ps, s.end_ps) for s in sim.chips[0].steps] == [
        (0, ((0, 4), (1, 4)), 0, 1080),  # the prompts: each samples its first token
        (1, ((0, 3), (1, 3)), 1080, 2140),  # last token + 2 drafts each (toy: 10 ps a token)
        (2, ((0, 3), (1, 3)), 2140, 3200),
        (3, ((0, 1), (1, 1)), 3200, 4220),  # one token left to sample: nothing to draft
    ]
    r0 = reqs[0]
    assert r0.token_ps == [1080, 2140, 2140, 3200, 3200, 4220]
    assert (r0.drafted_tokens, r0.accepted_tokens, r0.rejected_tokens, r0.verify_steps) == (
        4, 2, 2, 2)
    assert r0.decode_computed == 5 and r0.computed == 9 and r0.blocks == 0
    m = serving_metrics(reqs, [sim.chips[0].steps], sim.chips[0].scheduler.geo)
    # every computed token: prompt, decode, or a draft computed and cut
    assert m.computed_tokens == 22 == 8 + m.decode_tokens_computed + 4
    assert m.output_tokens == 12


@pytest.mark.parametrize("accepted, steps", [(0, 6), (3, 3)])
def test_nothing_accepted_is_plain_decoding_and_everything_k_plus_1_a_step(accepted, steps):
    sim, reqs = _sim(AcceptanceProfile(k=3, counts=((3, accepted, 1),)), 3)
    assert len(sim.chips[0].steps) == steps
    assert all(r.generated == 6 and r.state == "finished" for r in reqs)


def _serve(tmp_path, *sets: str):
    return load_serve_config(None, [
        "hardware.preset=tiny", "model.preset=tiny", "compile.core_mode=single",
        "serving.workload.requests=3", "serving.workload.prompt_tokens=12",
        "serving.workload.output_tokens=10", "serving.max_num_seqs=3",
        "serving.max_num_batched_tokens=48", "serving.workload.arrival=all_at_once",
        f"serving.cost.cache_dir={tmp_path}", *sets])


def test_a_serving_run_costs_drafts_and_tail_cuts_from_the_model(tmp_path):
    plain = run_serving(_serve(tmp_path)).metrics
    assert plain.serving.speculation is None
    assert "speculation" not in plain.to_metrics()["serving"]
    results = {d: run_serving(_serve(tmp_path, f"serving.speculate.drafter={d}",
                                     "serving.speculate.acceptance_rate=0.5")).metrics
               for d in ("prompt-lookup:k=3", "prompt-lookup:k=3,cut=host",
                         "self:layers=1,k=3")}
    runs = {d: r.serving for d, r in results.items()}
    for d, m in runs.items():
        s = m.speculation
        assert s is not None and s.drafter.startswith(d.split(",cut")[0]), d
        assert m.output_tokens == plain.serving.output_tokens == 30, d
        assert s.drafted_tokens == s.accepted_tokens + s.rejected_tokens, d
        assert m.computed_tokens == (m.prompt_tokens_computed + m.decode_tokens_computed
                                     + s.rejected_tokens)
        # metrics.json holds the typed figures and reads back to them
        tree = json.loads(json.dumps(results[d].to_metrics()))
        assert serving_metrics_of(tree) == results[d]
    assert runs["prompt-lookup:k=3,cut=host"].speculation.tail_cut_s == 0
    assert runs["prompt-lookup:k=3"].speculation.tail_cut_s > 0
    assert (runs["self:layers=1,k=3"].speculation.draft_s
            > runs["prompt-lookup:k=3"].speculation.draft_s)


@pytest.mark.parametrize("sets, needle", [
    (["serving.speculate.drafter=prompt-lookup:k=4"], "serving.speculate: the serving "
     "simulator has no logits"),
    (["serving.speculate.drafter=prompt-lookup:k=4", "serving.speculate.acceptance_rate=0.5",
      "serving.cost.mode=direct"], "serving.cost.mode: speculation is costed on the grid"),
    (["serving.speculate.drafter=lookup:k=4", "serving.speculate.acceptance_rate=0.5"],
     "serving.speculate.drafter: 'lookup:k=4': unknown drafter"),
    (["serving.speculate.drafter=prompt-lookup:k=2", "serving.speculate.acceptance_counts="
      "[[3, 1, 4]]"], "serving.speculate.acceptance_counts: the profile drafts up to 3"),
])
def test_serving_speculation_refuses_bad_config_by_name(tmp_path, sets, needle):
    with pytest.raises(ConfigError) as err:
        _serve(tmp_path, *sets)
    assert needle in str(err.value)


def test_the_example_config_speculates_with_measured_counts():
    from pathlib import Path

    cfg = load_serve_config(Path(__file__).resolve().parents[2]
                            / "configs" / "serving-speculative.toml")
    sp = cfg.serving.speculate
    assert sp is not None and sp.spec().text() == "prompt-lookup:k=4,ngram=3"
    profile = sp.profile(where="serving.speculate")
    assert profile.k == 4 and round(profile.acceptance_rate(), 3) == 0.223
