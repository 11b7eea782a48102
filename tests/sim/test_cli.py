import json

import pytest

from sim.app.cli.main import main
from tests.groups import QUICKSTART

TINY = ["--set", "hardware.preset=tiny", "--set", "model.preset=tiny", "--set",
        "compile.core_mode=single", "--set", "workload.prompt_tokens=8", "--set",
        "workload.output_tokens=4"]


@pytest.mark.xdist_group(QUICKSTART)
def test_run_embedded_default_writes_metrics_trace_and_report(embedded_default_run):
    tmp_path = embedded_default_run  # `kvsim run --out DIR -q`, shared (tests/conftest.py)
    m = json.loads((tmp_path / "metrics.json").read_text())
    for key in ("config", "sim_time_s", "traffic_bytes", "engine_busy_s", "traffic_by_kind"):
        assert key in m
    assert set(m["traffic_bytes"]) >= {"dram_read", "dram_write", "pcie_h2d", "pcie_d2h"}
    assert set(m["traffic_by_kind"]) == {"weights", "kv_cache", "activations", "host_io"}
    assert m["prefill"]["ttft_s"] > 0
    assert m["decode"]["tokens_per_s"] == pytest.approx(1 / m["decode"]["time_per_token_s"])
    assert m["kv_cache"]["bytes_per_token"] == 6144  # Qwen2.5-0.5B int8: 24 x 2 x 2 x 64
    assert m["kv_cache"]["compression_vs_bf16"] == 2.0
    assert m["kv_cache"]["capacity_tokens"] > 0
    assert m["prefill"]["ttft_s"] >= m["roofline"]["prefill"]["bound_s"]
    assert m["decode"]["time_per_token_s"] >= m["roofline"]["decode_per_token"]["bound_s"]
    trace = json.loads((tmp_path / "trace.json").read_text())
    phases = {e["ph"] for e in trace["traceEvents"]}
    assert {"M", "X", "C"} <= phases
    assert "displayTimeUnit" not in trace
    assert (tmp_path / "report.html").stat().st_size > 1_000_000  # plotly.js embedded


def test_two_runs_are_byte_identical(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    args = TINY + ["--set", "sim.fidelity=functional", "-q"]
    assert main(["run", "--out", str(a), *args]) == 0
    assert main(["run", "--out", str(b), *args]) == 0
    for name in ("metrics.json", "trace.json", "report.html"):
        assert (a / name).read_bytes() == (b / name).read_bytes()


def test_gemv_demo_and_hardware_overrides(tmp_path):
    out = tmp_path / "o"
    assert main(["run", "--out", str(out), "-q", "--set", "workload.kind=gemv",
                 "--set", "hardware.dram.efficiency=0.5", "--set", "workload.n=1024",
                 "--set", "sim.fidelity=functional"]) == 0
    m = json.loads((out / "metrics.json").read_text())
    assert m["config"]["hardware"]["dram"]["efficiency"] == 0.5
    assert m["functional_check"] == "match"


@pytest.mark.parametrize(
    "sets, needle",
    [
        (["hardware.dram.efficency=0.5"], "hardware.dram.efficency: unknown key"),
        (["hardware.preset=nosuch"], "unknown preset 'nosuch'; valid: aries, regulus, tiny"),
        (["workload.w_bits=3"], "workload.w_bits"),
        (["workload.n=-1"], "workload.n"),
        (["outputs.trace=everything"], "outputs.trace"),
        (["nonsense"], "expected key=value"),
    ],
)
def test_bad_input_is_one_line_naming_the_field_and_no_output(tmp_path, capsys, sets, needle):
    out = tmp_path / "o"
    args = ["run", "--out", str(out), "-q"]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err and "Traceback" not in err
    assert not out.exists()


def test_hw_show_json_has_derived_figures(capsys):
    assert main(["hw", "show", "aries", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    d = data["derived"]
    for key in ("pcie_h2d_effective_bytes_per_s", "pcie_d2h_effective_bytes_per_s",
                "dram_effective_bytes_per_s", "peak_ops_per_s_w8a8"):
        assert d[key] > 0
    assert d["peak_ops_per_s_w8a8"] == pytest.approx(80e12)
    assert data["config"]["dram"]["capacity_bytes"] == 16 * 2**30


def test_hw_show_prints_sources_and_assumptions(capsys):
    assert main(["hw", "show", "aries"]) == 0
    out = capsys.readouterr().out
    assert "assumption" in out and "source" in out and "derived figures" in out


def test_hw_list_names_every_preset(capsys):
    assert main(["hw", "list"]) == 0
    out = capsys.readouterr().out
    for name in ("aries", "regulus", "tiny"):
        assert name in out


def test_every_subcommand_is_registered():
    from sim.app.cli.main import build_parser

    p = build_parser()
    for argv in (["run"], ["check", "x.toml"], ["sweep", "x.toml"], ["serve"],
                 ["regress", "b.json"], ["compile", "--model", "tiny", "-o", "x"],
                 ["kv", "--model", "tiny", "--format", "int8", "--context", "4"],
                 ["hw", "list"]):
        assert callable(p.parse_args(argv).func)


def test_hw_show_keeps_bracketed_text_of_the_sources(capsys):
    """A source or assumption that names a TOML table (``[dram.timing]``) is printed as
    written, not taken for console markup."""
    from sim.device.hw import load_hardware

    hw = load_hardware("aries")
    notes = [t for t in (*hw.sources.values(), *hw.assumptions.values()) if "[" in t]
    assert any("[dram.timing]" in t for t in notes)
    assert main(["hw", "show", "aries"]) == 0
    assert "[dram.timing]" in capsys.readouterr().out
