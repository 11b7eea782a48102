"""``kvsim serve --http`` on the command line, before any server starts: bad flags and
fields name themselves (exit 2), a server config is checked by ``kvsim check`` and refused
by ``kvsim run``, a missing extra says how to install it."""

from __future__ import annotations

import sys

import pytest

from sim.app.cli.main import main
from tests.sim.server_util import need_server

SERVER_TOML = """
[hardware]
preset = "tiny"
[model]
preset = "tiny"
[compile]
core_mode = "single"
[server]
pace = "none"
port = 0
"""


@pytest.mark.parametrize("args,words", [
    (["--port", "5"], "--port: only with --http"),
    (["--pace", "none"], "--pace: only with --http"),
    (["--http", "--time-scale", "0"], "server.time_scale"),
    (["--http", "--time-scale", "nan"], "server.time_scale"),
    (["--http", "--port", "70000"], "server.port"),
    (["--http", "--set", "server.pace=fast"], "server.pace"),
    (["--http", "--set", "server.colour=1"], "server.colour: unknown key"),
])
def test_bad_server_arguments_name_the_field(args, words, capsys, tmp_path):
    # the config is checked before the server extra is looked for: named without it too
    _bad_arguments(args, words, capsys, tmp_path)


@pytest.mark.parametrize("args,words", [
    (["--http", "--tokenizer", "no/such/file.gguf"], "server.tokenizer"),
    (["--http", "--fidelity", "functional", "--set", "model.preset=qwen2.5-0.5b",
      "--tokenizer", "bytes"], "functional mode needs the model's own tokenizer"),
])
def test_bad_tokenizers_name_the_field(args, words, capsys, tmp_path):
    need_server()  # the tokenizer is resolved with the model, after the extra is found
    _bad_arguments(args, words, capsys, tmp_path)


def _bad_arguments(args, words, capsys, tmp_path):
    tiny = ["--set", "hardware.preset=tiny", "--set", "model.preset=tiny", "--set",
            "compile.core_mode=single", "--out", str(tmp_path / "o")]
    assert main(["serve", *tiny, *args]) == 2  # the later --set wins
    assert words in capsys.readouterr().err


def test_server_configs_are_checked_not_run(tmp_path, capsys):
    cfg = tmp_path / "server.toml"
    cfg.write_text(SERVER_TOML)
    assert main(["check", str(cfg)]) == 0
    assert "ok: server of tiny on 1 x tiny" in capsys.readouterr().out
    assert main(["run", str(cfg)]) == 2
    assert f"start it with kvsim serve --http {cfg}" in capsys.readouterr().err


def test_without_the_extra_the_command_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # import uvicorn raises ImportError
    assert main(["serve", "--http"]) == 2
    assert "pip install 'kvsim[server]'" in capsys.readouterr().err
