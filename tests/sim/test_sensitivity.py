"""kvsim hw sensitivity: TTFT and decode change per +-10 % of a hardware field, on the tiny
model and the tiny device (about 2 s per run)."""

import copy
import json

import pytest

from kvsim.errors import ConfigError
from sim.app.cli.main import main
from sim.app.config import build_run_config, set_field
from sim.app.run import run
from sim.app.sweep.sensitivity import perturbations, run_sensitivity

TREE = {
    "hardware": {"preset": "tiny"},
    "model": {"preset": "tiny"},
    "compile": {"core_mode": "single"},
    "workload": {"kind": "generate", "prompt_tokens": 8, "output_tokens": 2},
    "sim": {"fidelity": "timing"},
    "outputs": {"trace": "off"},
}


def _figures(sets: dict) -> tuple[float, float]:
    tree = copy.deepcopy(TREE)
    for k, v in sets.items():
        set_field(tree, k, v)
    m = run(build_run_config(tree)).metrics.to_metrics()
    return m["prefill"]["ttft_s"], m["decode"]["time_per_token_s"]


def test_changes_are_those_of_separate_runs_and_out_of_range_values_are_named():
    res = run_sensitivity(copy.deepcopy(TREE), only=["dram.data_rate_mtps", "dram.efficiency",
                                                     "host_link.pcie.lanes"])
    rows = {r.field: r for r in res.rows}
    assert sorted(rows) == ["dram.data_rate_mtps", "dram.efficiency", "host_link.pcie.lanes"]
    ttft0, dec0 = _figures({})
    assert res.base == {"prefill.ttft_s": ttft0, "decode.time_per_token_s": dec0}
    r = rows["dram.data_rate_mtps"]
    assert (r.base, r.low, r.high) == (1000.0, 900.0, 1100.0)
    for i, rate in enumerate((900.0, 1100.0)):
        ttft, dec = _figures({"hardware.dram.data_rate_mtps": rate})
        assert r.change_pct["prefill.ttft_s"][i] == (ttft / ttft0 - 1) * 100
        assert r.change_pct["decode.time_per_token_s"][i] == (dec / dec0 - 1) * 100
    # 10 % less bandwidth slows a weight-bound model: both figures grow
    assert r.change_pct["decode.time_per_token_s"][0] > 5
    # efficiency 1.0 of tiny cannot grow: +10 % is reported, not run; -10 % moves the
    # effective bandwidth exactly as -10 % of the data rate does
    e = rows["dram.efficiency"]
    assert e.high is None and "hardware.dram.efficiency" in e.note
    assert e.change_pct["prefill.ttft_s"][0] == pytest.approx(
        r.change_pct["prefill.ttft_s"][0], rel=1e-9)
    lanes = rows["host_link.pcie.lanes"]
    assert (lanes.low, lanes.high) == (None, None) and "rounds back to 1" in lanes.note


def test_every_numeric_field_the_dram_model_uses_is_perturbed():
    aries = copy.deepcopy(TREE)
    aries["hardware"] = {"preset": "aries"}
    fields = {p.field: p for p in perturbations(aries, 0.1)}
    # aries times DRAM with the protocol model: its timing is perturbed, the efficiency not
    assert "dram.efficiency" not in fields and "cores.macs_per_cycle.w8a8" in fields
    assert {"dram.timing.trcd_ns", "dram.timing.trfc_ab_ns", "cores.barrier_sync_ns",
            "cores.dispatch_cycles", "cores.program_launch_ns"} <= set(fields)
    assert fields["dram.timing.burst_length"].low is None  # BL 14 is not a burst length
    # 1024 B row runs at +-10 % are 922 and 1126 B: not whole 32 B bursts, snapped outward
    run = fields["dram.timing.row_run_bytes"]
    assert (run.base, run.low, run.high) == (1024, 896, 1152)
    assert "922 B snapped to 896 B (whole 32 B bursts)" in run.note
    aries["hardware"] = {"preset": "aries", "dram": {"model": "efficiency"}}
    fields = {p.field: p for p in perturbations(aries, 0.1)}
    assert "dram.efficiency" in fields
    assert not any(f.startswith("dram.timing.") for f in fields)
    assert fields["host_link.pcie.lanes"].low is None  # 7 is not a PCIe link width
    assert "host_link.pcie.lanes" in fields["host_link.pcie.lanes"].note
    with pytest.raises(ConfigError, match="--param: no numeric hardware field 'dram.nope'"):
        perturbations(aries, 0.1, ["dram.nope"])
    with pytest.raises(ConfigError, match="--fraction"):
        perturbations(aries, 1.5)


def test_cli_json(tmp_path, capsys):
    cfg = tmp_path / "tiny.toml"
    cfg.write_text('[hardware]\npreset = "tiny"\n[compile]\ncore_mode = "single"\n'
                   '[workload]\nkind = "generate"\nprompt_tokens = 8\noutput_tokens = 2\n'
                   '[sim]\nfidelity = "timing"\n')
    assert main(["hw", "sensitivity", "--model", "tiny", "--config", str(cfg), "--param",
                 "host.call_overhead_ns", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (row,) = data["rows"]
    assert row["field"] == "host.call_overhead_ns" and (row["low"], row["high"]) == (900, 1100)
    lo, hi = (row["change_pct"]["prefill.ttft_s"][k] for k in ("low", "high"))
    assert lo < 0 < hi  # less host overhead per call, earlier first token
    assert main(["hw", "sensitivity", "--model", "tiny", "--config", str(cfg), "--param",
                 "dram.nope"]) == 2
