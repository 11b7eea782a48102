"""``kvsim regress``: the committed baseline of configs/regress passes; a 1 % change of one
hardware parameter fails naming the moved figures; tolerances, --update, --create, bad
input; the pytest helper ``sim.testing.assert_no_regression``."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from kvsim.errors import KvsimError
from sim.app.regress.regress import (
    EXIT_BAD_INPUT,
    EXIT_MOVED,
    EXIT_PASS,
    RegressError,
    Row,
    create,
    load_baseline,
    main,
    run_figures,
    tolerance_for,
)
from sim.testing import assert_no_regression
from traces.results import RunFigures

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "configs" / "regress" / "baseline.json"
ARIES_DRAM_MTPS = 4167.0  # sim/device/presets/aries.toml
ONE_PERCENT_SLOWER = f"hardware.dram.data_rate_mtps={ARIES_DRAM_MTPS * 0.99!r}"
FAST = ("tiny-kivi4.toml", "gemv-aries.toml", "tiny-cache-ops.toml")  # the quick entries


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> dict:
    """A baseline of the quick committed configs, made now: the tests of the mechanism do
    not depend on the committed figures (only test_committed_baseline_passes does)."""
    folder = tmp_path_factory.mktemp("fresh")
    out = folder / "baseline.json"
    create([COMMITTED.parent / n for n in FAST], out)
    return json.loads(out.read_text())


def _subset(tmp_path: Path, fresh: dict, names=FAST, **changes) -> Path:
    """A copy of the fresh baseline with only the entries of ``names`` (config paths made
    absolute, so the copy can live anywhere), each updated with ``changes``."""
    entries = []
    for e in json.loads(json.dumps(fresh["entries"])):
        name = Path(e["config"]).name
        if name in names:
            e["config"] = str(COMMITTED.parent / name)
            e.update(changes)
            entries.append(e)
    out = tmp_path / "baseline.json"
    out.write_text(json.dumps({"version": fresh["version"], "entries": entries}))
    return out


#: The moved figure of the DRAM-bound GEMV, about +1 %: a little less for the fixed
#: latencies, a little more (+1.016 %) for the protocol model's timings rounded up to whole
#: cycles of the 1 % longer clock.
GEMV_MOVED = re.compile(r"gemv-aries\.toml: sim_time_s \(\+(0\.9\d\d|1\.0\d\d) %\)")


# --- the committed baseline, and the 1 % change ------------------------------------------


def test_committed_baseline_passes(capsys):
    assert main([str(COMMITTED), "-q"]) == EXIT_PASS
    out = capsys.readouterr().out
    assert "PASS: 67 figures within tolerance" in out
    assert "qwen-short.toml" in out and "qwen-short-w8.toml" in out and "prefill.ttft_s" in out


def test_one_percent_slower_dram_fails_naming_the_moved_figures_and_restoring_passes(
        tmp_path, capsys, fresh):
    baseline = _subset(tmp_path, fresh)
    before = baseline.read_bytes()
    assert main([str(baseline), "-q", "--set", ONE_PERCENT_SLOWER]) == EXIT_MOVED
    out = capsys.readouterr().out
    assert "FAIL: 8 of 43 figures moved beyond tolerance" in out
    # the summary names every moved figure, with its change
    assert GEMV_MOVED.search(out), out
    summary = {line.split(": ")[0].strip(): line for line in out.splitlines()
               if line.startswith("  ")}
    for name in ("decode.time_per_token_s", "decode.tokens_per_s", "prefill.ttft_s"):
        assert name in summary[str(COMMITTED.parent / "tiny-kivi4.toml")]
        assert name in summary[str(COMMITTED.parent / "tiny-cache-ops.toml")]
    # the on-device eviction (DRAM only) moved; the host-side ops (PCIe-bound) did not
    assert "cache_ops[1].time_s (+0.0" in summary[str(COMMITTED.parent / "tiny-cache-ops.toml")]
    assert "cache_ops[0]" not in out.split("FAIL")[1]
    # the table marks them; figures that do not depend on DRAM speed stay put
    moved = [line for line in out.splitlines() if "MOVED" in line]
    assert len(moved) == 8 and not any("traffic" in line for line in moved)
    assert baseline.read_bytes() == before  # a check never writes the baseline
    assert main([str(baseline), "-q"]) == EXIT_PASS  # restored: passes again
    assert "PASS: 43 figures" in capsys.readouterr().out


def test_scale_is_the_same_change_as_the_explicit_value(tmp_path, capsys, fresh):
    baseline = _subset(tmp_path, fresh, names=("gemv-aries.toml",))
    reports = []
    for args in (["--set", ONE_PERCENT_SLOWER], ["--scale", "hardware.dram.data_rate_mtps=0.99"]):
        assert main([str(baseline), "--json", *args]) == EXIT_MOVED
        reports.append(json.loads(capsys.readouterr().out))
    assert reports[0] == reports[1]
    row = next(r for r in reports[0]["rows"] if r["figure"] == "sim_time_s")
    assert row["status"] == "moved" and row["change"] == pytest.approx(0.01, abs=0.001)


def test_figures_do_not_depend_on_the_trace_level():
    # regress runs with outputs.trace=off (faster); the baseline holds for any trace level
    cfg = COMMITTED.parent / "tiny-kivi4.toml"
    assert run_figures(cfg, ["outputs.trace=tiles"]) == run_figures(cfg, ["outputs.trace=off"])


# --- tolerances, create, update ------------------------------------------------------------


def test_a_tolerance_lets_a_small_change_pass_and_is_per_figure(tmp_path, capsys, fresh):
    baseline = _subset(tmp_path, fresh, names=("gemv-aries.toml",),
                       tolerances={"sim_time_s": 0.02})
    assert main([str(baseline), "--json", "--set", ONE_PERCENT_SLOWER]) == EXIT_PASS
    rows = {r["figure"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["sim_time_s"]["status"] == "within"
    assert rows["traffic_bytes.dram_read"]["tolerance"] == 0
    # --tolerance on the command line overrides the file's
    assert main([str(baseline), "-q", "--set", ONE_PERCENT_SLOWER,
                 "--tolerance", "sim_*=0.001"]) == EXIT_PASS  # the exact name still wins
    assert main([str(baseline), "-q", "--set", ONE_PERCENT_SLOWER,
                 "--tolerance", "sim_time_s=0.001"]) == EXIT_MOVED


def test_tolerance_lookup_prefers_exact_names_then_longer_patterns():
    tols = {"*": 0.5, "decode.*": 0.1, "decode.tokens_per_s": 0.0}
    assert tolerance_for("decode.tokens_per_s", tols) == 0.0
    assert tolerance_for("decode.time_per_token_s", tols) == 0.1
    assert tolerance_for("prefill.ttft_s", tols) == 0.5
    assert tolerance_for("prefill.ttft_s", {}) == 0.0


def test_rows_report_missing_and_new_figures():
    assert Row("c", "f", 1.0, None, 0).status == "missing"  # a figure the run lost: fails
    assert Row("c", "f", 1.0, None, 0).failed
    assert Row("c", "f", None, 1.0, 0).status == "new"  # a figure added since: reported only
    assert not Row("c", "f", None, 1.0, 0).failed
    assert Row("c", "f", 0.0, 2.0, 0.5).change == math.inf and Row("c", "f", 0, 2, 9).failed
    assert Row("c", "f", 4.0, 5.0, 0.25).status == "within"


def test_create_check_update(tmp_path, capsys):
    cfg = COMMITTED.parent / "gemv-aries.toml"
    baseline = tmp_path / "b" / "baseline.json"
    baseline.parent.mkdir()
    assert main(["--create", str(baseline), str(cfg), "--set", "workload.n=1024",
                 "--tolerance", "traffic_*=0.5", "-q"]) == EXIT_PASS
    text = baseline.read_text()
    data = json.loads(text)
    assert text == json.dumps(data, indent=1, sort_keys=True) + "\n"  # sorted keys
    (entry,) = data["entries"]
    assert not Path(entry["config"]).is_absolute()  # relative to the baseline's folder
    assert (baseline.parent / entry["config"]).resolve() == cfg.resolve()
    assert entry["sets"] == ["workload.n=1024"]
    assert entry["tolerances"] == {"traffic_*": 0.5}
    figures = dict(entry["figures"])
    assert set(figures) >= {"sim_time_s", "traffic_bytes.dram_read"}
    capsys.readouterr()
    assert main([str(baseline), "-q"]) == EXIT_PASS
    # a baseline recorded before a (pretend) change: the check names it, --update records it
    data["entries"][0]["figures"]["sim_time_s"] *= 0.9
    baseline.write_text(json.dumps(data))
    assert main([str(baseline), "-q"]) == EXIT_MOVED
    assert "sim_time_s (+11.111 %)" in capsys.readouterr().out
    assert main([str(baseline), "--update", "-q"]) == EXIT_PASS
    assert "updated" in capsys.readouterr().out
    again = json.loads(baseline.read_text())
    assert again["entries"][0]["figures"] == figures
    assert again["entries"][0]["tolerances"] == {"traffic_*": 0.5}
    assert main([str(baseline), "-q"]) == EXIT_PASS
    assert not list(baseline.parent.glob(".*.tmp"))


def test_the_figures_read_cache_op_times_and_bytes_not_wall_time():
    metrics = {
        "prefill": {"ttft_s": 1.0}, "decode": {"time_per_token_s": 0.5, "tokens_per_s": 2.0},
        "sim_time_s": 9.0, "traffic_bytes": {"dram_read": 10, "odd": "x"},
        "traffic_by_kind": {"weights": 4},
        "cache_ops": [{"op": "dump_load", "time_s": 0.1, "pcie_bytes": 7, "at_token": 9},
                      {"op": "host_evict", "time_s": 0.2, "host_model_s": 0.3,
                       "host_measured_s": 0.01, "new_cache_size": 5}],
    }
    assert RunFigures.from_metrics(metrics).figures() == {
        "cache_ops[0].time_s": 0.1, "cache_ops[0].pcie_bytes": 7, "cache_ops[1].time_s": 0.2,
        "cache_ops[1].host_model_s": 0.3, "decode.time_per_token_s": 0.5,
        "decode.tokens_per_s": 2.0, "prefill.ttft_s": 1.0, "traffic_bytes.dram_read": 10,
        "traffic_by_kind.weights": 4,
    }


# --- bad input: exit 2, one line, the baseline untouched -------------------------------------


def _entry(**kw):
    e = {"config": str(COMMITTED.parent / "gemv-aries.toml"), "sets": [],
         "figures": {"sim_time_s": 1.0}, "tolerances": {}}
    e.update(kw)
    return e


BAD = [
    ("missing", None, [], "does not exist"),
    ("not json", b"{entries", [], "not a JSON baseline file"),
    ("a list", b"[]", [], "the top level must be an object"),
    ("version", {"version": 2, "entries": [_entry()]}, [], "baseline version 2 is not supported"),
    ("no entries", {"version": 1, "entries": []}, [], "entries: must be a non-empty list"),
    ("unknown key", {"version": 1, "entries": [_entry(color="red")]}, [],
     "entries[0].color: unknown key"),
    ("figure text", {"version": 1, "entries": [_entry(figures={"x": "1"})]}, [],
     "figures.x: must be a finite number"),
    ("tolerance < 0", {"version": 1, "entries": [_entry(tolerances={"x": -1})]}, [],
     "tolerances.x: tolerance must be a finite number >= 0"),
    ("sets not list", {"version": 1, "entries": [_entry(sets="a=1")]}, [],
     "entries[0].sets: must be a list"),
    ("config missing", {"version": 1, "entries": [_entry(config="nope.toml")]}, [],
     "entries[0] (nope.toml): config file"),
    ("bad set in entry", {"version": 1, "entries": [_entry(sets=["workload.n=-1"])]}, [],
     "workload.n: Input should be greater than or equal to 1"),
    ("refused by kvsim check", {"version": 1, "entries": [_entry(sets=["workload.n=3"])]}, [],
     "workload.n: 3 must be a multiple of the 8 cores"),
    ("bad --set", {"version": 1, "entries": [_entry()]}, ["--set", "hardware.dram.x=1"],
     "hardware.dram.x: unknown key"),
    ("bad --scale", {"version": 1, "entries": [_entry()]}, ["--scale", "hardware.name=2"],
     "--scale hardware.name: not a numeric config field"),
    ("bad --tolerance", {"version": 1, "entries": [_entry()]}, ["--tolerance", "x=fast"],
     "--tolerance 'x=fast': 'fast' is not a number"),
    ("negative --tolerance", {"version": 1, "entries": [_entry()]}, ["--tolerance", "x=-1"],
     "--tolerance.x: tolerance must be a finite number >= 0"),
    ("update with set", {"version": 1, "entries": [_entry()]},
     ["--update", "--set", "workload.n=8"], "--update records the configs as they are"),
    ("configs without create", {"version": 1, "entries": [_entry()]}, ["x.toml"],
     "CONFIG arguments go with --create"),
    ("create over a baseline", {"version": 1, "entries": [_entry()]}, ["--create", "x.toml"],
     "exists; rewrite its figures with --update"),
    ("unknown option", {"version": 1, "entries": [_entry()]}, ["--fast"], None),
]


@pytest.mark.parametrize("content,args,needle", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_exits_2_and_leaves_the_baseline_unchanged(tmp_path, capsys, content, args,
                                                            needle):
    baseline = tmp_path / "baseline.json"
    if content is not None:
        baseline.write_bytes(content if isinstance(content, bytes)
                             else json.dumps(content).encode())
    before = baseline.read_bytes() if content is not None else None
    assert main([str(baseline), "-q", *args]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    if needle is not None:
        line = err.strip()
        assert needle in line and "\n" not in line and "Traceback" not in line
    assert (baseline.read_bytes() if baseline.exists() else None) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == (["baseline.json"] if before else [])


def test_load_baseline_raises_the_documented_error(tmp_path):
    p = tmp_path / "b.json"
    p.write_text('{"version": 1, "entries": [5]}')
    with pytest.raises(RegressError, match=r"entries\[0\]: must be an object") as info:
        load_baseline(p)
    assert isinstance(info.value, KvsimError)


# --- the pytest helper ----------------------------------------------------------------------


def test_assert_no_regression_passes_and_fails_naming_the_figures(tmp_path, fresh):
    baseline = _subset(tmp_path, fresh, names=("gemv-aries.toml",))
    report = assert_no_regression(baseline)
    assert report.ok and len(report.rows) == 7
    with pytest.raises(AssertionError, match=GEMV_MOVED):
        assert_no_regression(baseline, sets=[ONE_PERCENT_SLOWER])
    assert assert_no_regression(baseline, sets=[ONE_PERCENT_SLOWER],
                                tolerances={"sim_time_s": 0.011}).ok
    with pytest.raises(RegressError):
        assert_no_regression(tmp_path / "missing.json")


def test_assert_no_regression_updates_on_request(tmp_path, monkeypatch, fresh):
    baseline = _subset(tmp_path, fresh, names=("gemv-aries.toml",))
    data = json.loads(baseline.read_text())
    data["entries"][0]["figures"]["sim_time_s"] = 1.0
    baseline.write_text(json.dumps(data))
    with pytest.raises(AssertionError, match="sim_time_s"):
        assert_no_regression(baseline)
    monkeypatch.setenv("KVSIM_UPDATE_BASELINE", "1")
    assert_no_regression(baseline)  # rewrites it
    monkeypatch.delenv("KVSIM_UPDATE_BASELINE")
    assert assert_no_regression(baseline).ok


def test_registers_as_a_kvsim_subcommand(tmp_path, capsys, fresh):
    # what sim/app/cli/main.py's build_parser does with `regress.add_parser(sub)`
    import argparse

    from rich.console import Console

    from sim.app.cli import main as cli
    from sim.app.regress import regress

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if "regress" not in sub.choices:
        regress.add_parser(sub)
    baseline = _subset(tmp_path, fresh, names=("gemv-aries.toml",))
    args = parser.parse_args(["regress", str(baseline), "-q", "--set", ONE_PERCENT_SLOWER])
    assert args.func(args, Console(width=160)) == EXIT_MOVED
    assert GEMV_MOVED.search(capsys.readouterr().out)
