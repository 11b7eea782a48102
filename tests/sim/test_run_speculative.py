"""A run config's ``[speculate]`` section: validated like every other section, a timing-only
run draws acceptance from its profile (seeded: the same run twice is the same run), and
metrics.json and the report show the rounds; ``kvsim generate --speculate`` refuses a bad
spec before it compiles anything."""

from __future__ import annotations

import json

import pytest

from kvsim.errors import ConfigError
from sim.app.cli.main import main
from sim.app.config import load_run_config
from sim.app.run import render_outputs, run
from traces.results import ResultsError, run_metrics

BASE = ["hardware.preset=tiny", "model.preset=tiny", "compile.core_mode=single",
        "compile.max_sequence_length=16", "workload.prompt_tokens=20",
        "workload.output_tokens=16", "outputs.trace=off"]


def _cfg(*sets: str):
    return load_run_config(None, [*BASE, *sets])


def test_a_timing_run_draws_its_rounds_and_reports_them():
    cfg = _cfg("speculate.drafter=prompt-lookup:k=4", "speculate.acceptance_rate=0.5")
    a, b = run(cfg), run(cfg)
    assert a.metrics == b.metrics  # seeded draws: deterministic
    m = a.metrics
    assert m.speculation is not None
    s = m.speculation.summary
    assert s.decode_tokens == m.decode.tokens == 15
    # the decode time is the rounds' time, and the calls are labelled by phase
    assert m.decode.time_per_token_s == pytest.approx(s.decode_s / 15, rel=1e-12)
    phases = {c.phase for c in m.calls}
    assert phases == {"launch", "prefill", "draft", "verify", "tail_cut"}
    assert {"draft", "verify", "tail_cut"} <= set(m.time_breakdown)
    # a lookup is host work, no runtime call: no call overhead is charged for it
    assert m.time_breakdown["draft"].runtime_overhead_s == 0
    assert m.time_breakdown["draft"].host_work_s > 0
    assert m.time_breakdown["verify"].host_work_s is None
    html = render_outputs(a)["report.html"]
    assert "Speculative rounds" in html and "draft acceptance" in html


def test_the_speculation_figures_are_typed_and_round_trip_through_metrics_json():
    m = run(_cfg("speculate.drafter=prompt-lookup:k=4", "speculate.acceptance_rate=0.5")
            ).metrics
    tree = json.loads(json.dumps(m.to_metrics()))
    assert list(tree)[-1] == "speculation"
    assert list(tree["speculation"]) == ["spec", "summary", "profile", "rounds", "acceptance"]
    assert "host_work_s" in tree["time_breakdown"]["draft"]
    assert "host_work_s" not in tree["time_breakdown"]["verify"]
    assert run_metrics(tree) == m
    assert m.columns()["speculation.summary.acceptance_rate"] == \
        m.speculation.summary.acceptance_rate
    tree["speculation"]["summary"]["k"] = "four"
    with pytest.raises(ResultsError, match="speculation.summary.k: expected an integer"):
        run_metrics(tree)


def test_without_speculation_the_metrics_have_no_speculation_entry():
    m = run(_cfg()).metrics
    assert m.speculation is None
    tree = m.to_metrics()
    assert "speculation" not in tree and "speculation" not in json.dumps(m.columns())
    assert all("host_work_s" not in row for row in tree["time_breakdown"].values())
    assert run_metrics(tree) == m


@pytest.mark.parametrize("sets, needle", [
    (["speculate.drafter=prompt-lookup:k=4"],
     "speculate: a timing-only run has no logits"),
    (["speculate.drafter=prompt-lookup:k=4", "speculate.acceptance_rate=0.5",
      "sim.fidelity=functional"], "speculate: a functional run measures acceptance"),
    (["speculate.drafter=prompt-lookup:k=20", "speculate.acceptance_rate=0.5"],
     "compile.max_sequence_length: 16 tokens cannot hold a verification call of k + 1 = 21"),
    (["speculate.drafter=self:layer=1", "speculate.acceptance_rate=0.5"],
     "speculate.drafter: 'self:layer=1': unknown key 'layer' (did you mean 'layers'?)"),
    (["speculate.drafter=prompt-lookup", "speculate.acceptance_rate=0.5",
      "speculate.acceptance_counts=[[4, 1, 2]]"], "speculate.acceptance_counts: give one of"),
    (["speculate.drafter=prompt-lookup", "speculate.accept=0.5"],
     "speculate.accept: unknown key"),
    (["speculate.drafter=prompt-lookup", "speculate.acceptance_rate=0.5",
      'workload.cache_ops=[{at_token=20, op="dump_load"}]'],
     "speculate: a run with workload.cache_ops cannot decode speculatively"),
])
def test_the_section_refuses_bad_input_by_name(sets, needle):
    with pytest.raises(ConfigError) as err:
        _cfg(*sets)
    assert needle in str(err.value)


def test_check_knows_a_self_draft_needs_fewer_layers_than_the_model(capsys, tmp_path):
    f = tmp_path / "r.toml"
    f.write_text('[hardware]\npreset = "tiny"\n[model]\npreset = "tiny"\n[compile]\n'
                 'core_mode = "single"\n[speculate]\ndrafter = "self:layers=2,k=2"\n'
                 'acceptance_rate = 0.5\n')
    assert main(["check", str(f)]) == 2
    assert "speculate.drafter: layers=2 must be 1..1" in capsys.readouterr().err


def test_generate_refuses_a_bad_spec_before_it_runs(capsys):
    assert main(["generate", "--prompt", "x", "--speculate", "prompt-lookup:k=0"]) == 2
    err = capsys.readouterr().err
    assert "--speculate 'prompt-lookup:k=0': k=0 must be 1..31" in err


def test_a_measured_profile_file_feeds_a_timing_run(tmp_path):
    prof = tmp_path / "metrics.json"
    prof.write_text(json.dumps({"speculation": {"profile": {"k": 4, "counts": [
        [4, 4, 3], [4, 0, 1], [0, 0, 2]]}}}))
    m = run(_cfg("speculate.drafter=prompt-lookup:k=4",
                 f"speculate.acceptance_file={prof}")).metrics
    drawn = {(r.drafted, r.accepted) for r in m.speculation.rounds}
    assert drawn <= {(4, 4), (4, 0), (0, 0), (3, 3), (2, 2), (1, 1), (3, 0), (2, 0), (1, 0)}
    with pytest.raises(ConfigError, match="the profile drafts up to 4 tokens per call; the "
                                          "drafter drafts k=2"):
        run(_cfg("speculate.drafter=prompt-lookup:k=2", f"speculate.acceptance_file={prof}"))
