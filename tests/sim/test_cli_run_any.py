"""``kvsim run FILE`` runs any kvsim config as its own command would; ``--version``;
``run --help`` lists the config sections; unknown keys name the valid ones."""

from __future__ import annotations

import json

import pytest

from sim.app.cli.main import main

TINY_SWEEP = """
[base.hardware]
preset = "tiny"
[base.model]
preset = "tiny"
[base.compile]
core_mode = "single"
[base.workload]
prompt_tokens = 8
output_tokens = 2
[axes]
kv.format = ["bf16", "int8"]
[outputs]
metrics = ["decode.time_per_token_s"]
"""

TINY_SERVE = """
[hardware]
preset = "tiny"
[model]
preset = "tiny"
[compile]
core_mode = "single"
[serving]
max_num_seqs = 2
max_num_batched_tokens = 16
[serving.workload]
requests = 2
prompt_tokens = 4
output_tokens = 2
"""


def _rows(folder):
    return [{k: v for k, v in r.items() if "wall" not in k}
            for r in json.loads((folder / "results.json").read_text())["rows"]]


def test_run_of_a_sweep_file_is_the_sweep(tmp_path, monkeypatch):
    f = tmp_path / "s.toml"
    f.write_text(TINY_SWEEP)
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(f), "-q"]) == 0  # into the sweep's own default folder
    assert main(["sweep", str(f), "-q", "--out", "direct", "--workers", "1"]) == 0
    rows = _rows(tmp_path / "kvsim-sweep")
    assert len(rows) == 2 and rows == _rows(tmp_path / "direct")
    assert not (tmp_path / "kvsim-out").exists()


def test_run_of_a_serving_file_is_the_serving_run(tmp_path):
    f = tmp_path / "serve.toml"
    f.write_text(TINY_SERVE + f'[serving.cost]\ncache_dir = "{tmp_path / "grid"}"\n')
    assert main(["run", str(f), "-q", "--out", str(tmp_path / "a")]) == 0
    assert main(["serve", str(f), "-q", "--out", str(tmp_path / "b")]) == 0
    a, b = (json.loads((tmp_path / d / "metrics.json").read_text())["serving"]
            for d in ("a", "b"))
    assert a["finished_requests"] == 2 and a == b
    assert (tmp_path / "a" / "requests.csv").read_bytes() == \
        (tmp_path / "b" / "requests.csv").read_bytes()


def test_version(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"kvsim {version('kvsim')}"


def test_run_help_lists_the_sections_with_an_example(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    for section in ("hardware", "model", "bits", "kv", "compile", "workload", "sim",
                    "outputs"):
        assert f"  [{section}]" in out
    assert "context_tokens, prompt_tokens, prompt, chat, output_tokens" in out
    assert "a sweep file: [base]" in out and "[serving]" in out
    assert 'example' in out and 'format = "kivi-4"' in out


@pytest.mark.parametrize("toml,needle", [
    ("[hardware]\npcie = 3\n", "hardware.pcie: unknown key (did you mean 'host_link.pcie'?), "
     "valid keys here: name, description, dram, sram, dma, host_link, cores, host"),
    ("[workload]\nprompt_token = 3\n", "workload.prompt_token: unknown key (did you mean "
     "'prompt_tokens'?), valid keys here: kind, context_tokens, prompt_tokens, prompt, chat, "
     "output_tokens"),
    ("[wrkload]\nprompt_tokens = 3\n", "wrkload: unknown key (did you mean 'workload'?), "
     "valid keys here: hardware, model, bits, kv, compile, workload, sim, outputs"),
    ("[kv]\nzzz = 3\n", "kv.zzz: unknown key, valid keys here: format"),
])
def test_an_unknown_key_names_the_valid_keys_and_the_nearest(tmp_path, capsys, toml, needle):
    f = tmp_path / "c.toml"
    f.write_text(toml)
    assert main(["run", str(f), "-q", "--out", str(tmp_path / "o")]) == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_check_knows_a_serving_file(tmp_path, capsys):
    f = tmp_path / "serve.toml"
    f.write_text(TINY_SERVE)
    assert main(["check", str(f)]) == 0
    assert capsys.readouterr().out.strip() == "ok: serving 2 requests of tiny on 1 x tiny"
    assert main(["check", str(f), "--set", "serving.chip=2"]) == 2
    assert "serving.chip: unknown key (did you mean 'chips'?)" in capsys.readouterr().err


def test_a_run_collects_garbage_less_often_and_restores_the_thresholds():
    import gc

    from sim.app.cli.run import RUN_GC_THRESHOLDS, fewer_collections

    before = gc.get_threshold()
    with pytest.raises(KeyError), fewer_collections():
        assert gc.get_threshold() == RUN_GC_THRESHOLDS
        raise KeyError("a failed run")
    assert gc.get_threshold() == before
