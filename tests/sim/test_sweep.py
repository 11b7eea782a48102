"""Sweeps: the cartesian product of the axes, validated before anything runs, run on the
local process pool and on a Dask LocalCluster with byte-identical results; a failed point
keeps the others."""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path

import pytest

from kvsim.errors import ConfigError
from sim.app.cli.main import main
from sim.app.sweep.sweep import build_sweep, flatten_metrics, load_sweep, run_sweep

#: 4 x 4 = 16 points of the tiny model on the tiny device (a fraction of a second each).
TINY_SWEEP = """
[base.hardware]
preset = "tiny"
[base.model]
preset = "tiny"
[base.compile]
core_mode = "single"
[base.workload]
prompt_tokens = 8
output_tokens = 3

[axes]
kv.format = ["bf16", "int8", "kivi-4", "kivi-2"]
workload.prompt_tokens = [8, 16, 32, 64]

[outputs]
metrics = ["decode.time_per_token_s", "kv_cache.bytes_per_token"]
"""


@pytest.fixture
def sweep_file(tmp_path: Path) -> Path:
    p = tmp_path / "tiny-sweep.toml"
    p.write_text(TINY_SWEEP)
    return p


def _files(out: Path) -> dict[str, bytes]:
    return {name: (out / name).read_bytes() for name in ("results.csv", "results.json")}


def test_points_are_the_product_in_order(sweep_file):
    sweep = load_sweep(sweep_file)
    assert len(sweep.points) == 16
    assert sweep.points[0].values == (("kv.format", "bf16"), ("workload.prompt_tokens", 8))
    assert sweep.points[1].values == (("kv.format", "bf16"), ("workload.prompt_tokens", 16))
    assert sweep.points[15].values == (("kv.format", "kivi-2"), ("workload.prompt_tokens", 64))
    assert sweep.points[5].tree["kv"]["format"] == "int8"
    assert sweep.points[5].tree["workload"]["prompt_tokens"] == 16
    assert sweep.points[5].sets == ["kv.format=int8", "workload.prompt_tokens=16"]


def test_local_and_dask_give_identical_results(sweep_file, tmp_path):
    distributed = pytest.importorskip("dask.distributed",
                                      reason="the 'dask' extra is not installed")
    sweep = load_sweep(sweep_file)
    serial = run_sweep(sweep, tmp_path / "serial", workers=1, progress=False)
    local = run_sweep(sweep, tmp_path / "local", workers=2, progress=False)
    assert not serial.failed and not local.failed
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
        dask = run_sweep(sweep, tmp_path / "dask", executor="dask",
                         scheduler=cluster.scheduler_address, progress=False)
    assert not dask.failed
    ref = _files(tmp_path / "serial")
    assert _files(tmp_path / "local") == ref
    assert _files(tmp_path / "dask") == ref
    rows = list(csv.DictReader((tmp_path / "dask" / "results.csv").open()))
    assert [int(r["index"]) for r in rows] == list(range(16))
    assert {r["status"] for r in rows} == {"ok"}
    # the cache grows with the prompt; per token it is the format's size
    by = {(r["kv.format"], int(r["workload.prompt_tokens"])): r for r in rows}
    assert float(by[("int8", 64)]["kv_cache.bytes_per_token"]) * 2 == float(
        by[("bf16", 64)]["kv_cache.bytes_per_token"])
    assert float(by[("bf16", 64)]["decode.time_per_token_s"]) > float(
        by[("bf16", 8)]["decode.time_per_token_s"])


def test_results_have_one_row_per_point_and_every_metric_a_column(sweep_file, tmp_path):
    sweep = build_sweep({**_tree(sweep_file), "axes": {"kv": {"format": ["int8", "bf16"]}}})
    res = run_sweep(sweep, tmp_path / "o", workers=1, progress=False)
    with (tmp_path / "o" / "results.csv").open() as f:
        header = next(csv.reader(f))
    assert header[:4] == ["index", "kv.format", "status", "error"]
    for col in ("prefill.ttft_s", "decode.time_per_token_s", "decode.tokens_per_s",
                "traffic_bytes.dram_read", "traffic_by_kind.kv_cache",
                "kv_cache.bytes_per_token", "roofline.bound_s", "engine_busy_s.core0.mxu"):
        assert col in header
    # bulky or per-call values are not columns
    assert not any(c.startswith("config") or c in ("generated_tokens",
                                                   "decode.time_per_call_s") for c in header)
    doc = json.loads((tmp_path / "o" / "results.json").read_text())
    assert doc["columns"] == header == res.columns
    assert [r["kv.format"] for r in doc["rows"]] == ["int8", "bf16"]
    assert doc["sweep"]["axes"] == {"kv.format": ["int8", "bf16"]}
    html = (tmp_path / "o" / "report.html").read_text()
    assert "decode time per token vs KV format" in html
    assert not re.search(r"<script[^>]*\bsrc=", html)  # plotly.js embedded: works offline


def _tree(path: Path) -> dict:
    import tomllib

    return tomllib.loads(path.read_text())


def test_a_failed_point_keeps_the_others(sweep_file, tmp_path, capsys):
    # 2 KiB of SRAM passes the config checks but the model does not fit it when compiling
    sweep_file.write_text(TINY_SWEEP.replace(
        'workload.prompt_tokens = [8, 16, 32, 64]',
        "hardware.sram.bytes_per_core = [65536, 2048, 32768]"))
    out = tmp_path / "o"
    assert main(["sweep", str(sweep_file), "--out", str(out), "--workers", "2", "-q"]) == 1
    err = capsys.readouterr().err
    assert "4 of 12 points failed" in err
    assert "point 1 (kv.format=bf16, hardware.sram.bytes_per_core=2048) failed" in err
    assert "does not fit" in err
    assert "--set kv.format=bf16 --set hardware.sram.bytes_per_core=2048" in err  # rerun hint
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == 12
    failed = [r for r in rows if r["status"] == "error"]
    assert [int(r["index"]) for r in failed] == [1, 4, 7, 10]
    assert all("does not fit tiny's SRAM" in r["error"] and r["decode.time_per_token_s"] == ""
               for r in failed)
    assert all(r["error"] == "" and float(r["decode.time_per_token_s"]) > 0
               for r in rows if r["status"] == "ok")
    assert "error: " in (out / "report.html").read_text()


@pytest.mark.parametrize(
    "axes, needle",
    [
        ('kv.format = ["int8", "int3"]', "point 1 (kv.format=int3): kv.format: unknown KV format"),
        ("workload.prompt_tokens = [8, -1]",
         "point 1 (workload.prompt_tokens=-1): workload.prompt_tokens: Input should be greater"),
        ('kv.formatt = ["int8"]', "point 0 (kv.formatt=int8): kv.formatt: unknown key"),
        ("workload.prompt_tokens = 8", "axes.workload.prompt_tokens: an axis is a list of values"),
        ("workload.prompt_tokens = []", "axes.workload.prompt_tokens: an axis needs at least"),
        ("kv.format = ['int8', 'int8']", "axes.kv.format: value int8 is listed twice"),
        ('hardware.preset = ["tiny", "nosuch"]', "point 1 (hardware.preset=nosuch): "
                                                 "hardware.preset: unknown preset 'nosuch'"),
    ],
)
def test_a_bad_axis_value_names_the_point_and_field(tmp_path, capsys, axes, needle):
    p = tmp_path / "bad.toml"
    p.write_text(TINY_SWEEP.split("[axes]")[0] + "[axes]\n" + axes + "\n")
    out = tmp_path / "o"
    assert main(["sweep", str(p), "--out", str(out), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err and "Traceback" not in err
    assert not out.exists()
    assert main(["check", str(p)]) == 2
    assert needle in capsys.readouterr().err


def test_sweep_file_errors(tmp_path, capsys):
    p = tmp_path / "s.toml"
    for text, needle in [
        ('bases = "x.toml"\n[axes]\nkv.format = ["int8"]', "bases: unknown key"),
        ('base = "missing.toml"\n[axes]\nkv.format = ["int8"]', "base: run config file"),
        ("[axes]\n[outputs]\nmetrics = []", "axes: a sweep needs at least one axis"),
        ('[axes]\nkv.format = ["int8"]\n[outputs]\nplots = 1', "outputs.plots: unknown key"),
        ('set = "kv.format=int8"\n[axes]\nkv.format = ["int8"]', "set: a list of"),
    ]:
        p.write_text(text)
        assert main(["sweep", str(p), "--out", str(tmp_path / "o")]) == 2
        assert needle in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_base_file_set_and_axis_overrides(tmp_path, capsys):
    (tmp_path / "base.toml").write_text(TINY_SWEEP.split("[axes]")[0].replace("base.", ""))
    p = tmp_path / "s.toml"
    p.write_text('base = "base.toml"\nset = ["workload.seed=3", "workload.output_tokens=5"]\n'
                 '[axes]\nkv.format = ["int8", "bf16"]\n')
    sweep = load_sweep(p, sets=["workload.output_tokens=2"],
                       axes=["workload.prompt_tokens=[8, 12]"])
    assert sweep.base["workload"]["seed"] == 3  # the file's set, then the command line's
    assert [pt.values for pt in sweep.points][:2] == [
        (("kv.format", "int8"), ("workload.prompt_tokens", 8)),
        (("kv.format", "int8"), ("workload.prompt_tokens", 12))]
    assert all(pt.tree["workload"]["output_tokens"] == 2 for pt in sweep.points)
    assert main(["check", str(p), "--axis", "workload.prompt_tokens=[8,12,16]"]) == 0
    assert "ok: sweep of 6 points: kv.format (2) x workload.prompt_tokens (3)" in (
        capsys.readouterr().out)


def test_save_points_writes_each_points_outputs(sweep_file, tmp_path):
    sweep_file.write_text(TINY_SWEEP.split("[axes]")[0] + '[axes]\nkv.format = ["bf16", '
                          '"int8"]\n[outputs]\nsave_points = true\n')
    sweep = load_sweep(sweep_file)
    assert len(sweep.points) == 2
    run_sweep(sweep, tmp_path / "o", workers=1, progress=False)
    for i in range(2):
        names = sorted(f.name for f in (tmp_path / "o" / "points" / str(i)).iterdir())
        assert names == ["metrics.json", "report.html", "trace.json"]


def test_missing_dask_is_a_clear_error(sweep_file, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "dask", None)
    with pytest.raises(ConfigError, match=r"pip install 'kvsim\[dask\]'"):
        run_sweep(load_sweep(sweep_file), tmp_path / "o", executor="dask", progress=False)
    assert not (tmp_path / "o").exists()


def test_a_points_row_is_the_columns_of_its_typed_result():
    from sim.app.config import build_run_config
    from sim.app.run import run
    from traces.results import ResultsError, run_metrics

    tree = {"hardware": {"preset": "tiny"}, "workload": {"kind": "gemv", "k": 64, "n": 64,
                                                          "w_bits": 8}}
    typed = run(build_run_config(tree)).metrics
    metrics = typed.to_metrics()
    row = flatten_metrics(metrics)
    assert row == run_metrics(metrics).columns() == typed.columns()
    assert row["sim_time_s"] == metrics["sim_time_s"]
    assert row["roofline.bound_s"] == metrics["roofline"]["bound_s"]
    assert row["time_breakdown.gemv.critical"] == metrics["time_breakdown"]["gemv"]["critical"]
    # the resolved config and the per-call rows are not columns
    assert not any(c.startswith(("config", "calls")) for c in row)
    with pytest.raises(ResultsError, match=r"metrics.json.roofline: missing"):
        flatten_metrics({k: v for k, v in metrics.items() if k != "roofline"})


def test_kvsim_run_of_a_sweep_file_runs_the_sweep(sweep_file, tmp_path):
    out = tmp_path / "o"
    assert main(["run", str(sweep_file), "--out", str(out)]) == 0
    assert (out / "results.csv").is_file() and (out / "report.html").is_file()


def test_the_sweep_table_keeps_every_figure_whole_at_80_columns():
    """On an 80-column terminal the table is split into parts that fit, each with the
    point's number, axes and status, instead of folding numbers over two lines."""
    import io

    from rich.console import Console

    from sim.app.cli.sweep import metric_column, print_sweep_table
    from sim.app.sweep.sweep import SweepResult

    sweep = load_sweep(Path(__file__).resolve().parents[2] / "configs" / "kv-bits-sweep.toml")
    # figures of the kv-bits sweep's int8 row at 512 and 32,764 tokens of context
    values = {"decode.time_per_token_s": [0.01385, 0.01838],
              "kv_cache.bytes_per_token": [6144.0, 6144.0],
              "kv_cache.bytes": [3_151_872, 201_308_160],
              "traffic_by_kind.kv_cache": [3_153_792, 201_310_080],
              "kv_cache.capacity_tokens": [2_714_418, 2_714_418]}
    rows = [{"index": i, "kv.format": "int8", "workload.context_tokens": n, "status": "ok",
             "error": None, **{m: v[i] for m, v in values.items()}}
            for i, n in enumerate((512, 32764))]
    result = SweepResult(sweep, list(rows[0]), rows, {}, 12.3, "local", 2)
    screen = io.StringIO()
    print_sweep_table(sweep, result, Console(file=screen, width=80, emoji=False))
    lines = screen.getvalue().splitlines()
    table = [line for line in lines if line[:1] in "┏┃┡│└"]
    assert len(table) > 6 and max(len(line) for line in lines) <= 80
    assert all(line[-1] in "┓┃┩│┘" for line in table)  # every table whole, none cut
    for m in sweep.metrics:
        label, cells = metric_column(m, [r[m] for r in rows])
        for cell in cells:  # each figure whole on one line
            assert any(cell in line for line in lines), (m, cell, screen.getvalue())
