"""Progress on a terminal (``sim.progress``): the phases of ``kvsim run`` as the runtime's
calls tell them, and quiet off a terminal or under CI."""

from __future__ import annotations

import io
import os

import pytest
from rich.console import Console

from sim.app.config import load_run_config
from sim.progress import Phases, progress_enabled

TINY = ["hardware.preset=tiny", "model.preset=tiny", "compile.core_mode=single",
        "compile.max_sequence_length=8", "workload.prompt_tokens=20",
        "workload.output_tokens=4", "outputs.trace=off"]


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_shows_on_a_terminal_only_and_never_under_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    assert progress_enabled(_Tty()) and not progress_enabled(io.StringIO())
    monkeypatch.setenv("CI", "1")
    assert not progress_enabled(_Tty())


def test_run_phases_follow_the_runtime_calls():
    from sim.app.cli.main import run_phases
    from sim.app.run import run

    cfg = load_run_config(None, TINY)
    screen = _Tty()
    console = Console(file=screen, force_terminal=True, width=100)
    with run_phases(cfg, enabled=True, console=console) as ph:
        run(cfg)
        ph.start("write outputs")
    # 20 prompt tokens in calls of 8: 3 prefill calls; 4 output tokens: 3 decode calls
    assert ph.history == [("compile", 0, None), ("launch (weights over the host link)", 0, None),
                          ("prefill calls", 3, 3), ("decode tokens", 3, 3),
                          ("write outputs", 0, None)]
    assert "decode tokens" in screen.getvalue()


def test_phases_off_record_the_same_and_print_nothing():
    screen = _Tty()
    with Phases(enabled=False, console=Console(file=screen, force_terminal=True)) as ph:
        ph.start("a", total=2)
        ph.advance()
        ph.advance()
        ph.start("b")
    assert ph.history == [("a", 2, 2), ("b", 0, None)] and screen.getvalue() == ""


# --- kvsim serve and kvsim regress: progress on a terminal, quiet in pipes, clean Ctrl-C ---

SERVE = """
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
requests = 3
prompt_tokens = 4
output_tokens = 2
[serving.cost]
mode = "direct"
"""


@pytest.fixture
def serve_file(tmp_path):
    f = tmp_path / "serve.toml"
    f.write_text(SERVE)
    return f


def _terminal(monkeypatch, module) -> tuple[_Tty, list]:
    """Make ``module``'s progress think stderr is a terminal; returns the screen and the
    Phases made."""
    import sim.progress

    screen, made = _Tty(), []

    class Shown(sim.progress.Phases):
        def __init__(self, *, enabled: bool):
            super().__init__(enabled=enabled,
                             console=Console(file=screen, force_terminal=True, width=100))
            made.append(self)

    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setattr(module, "Phases", Shown)
    monkeypatch.setattr(module, "progress_enabled", lambda stream=None: True)
    return screen, made


def test_serve_shows_its_phases_and_requests_done_on_a_terminal(serve_file, tmp_path,
                                                                 monkeypatch, capsys):
    import sim.progress
    from sim.app.cli.main import main

    screen, made = _terminal(monkeypatch, sim.progress)
    assert main(["serve", str(serve_file), "--out", str(tmp_path / "o")]) == 0
    assert made[0].enabled
    assert made[0].history == [("compile", 0, None), ("serve requests", 3, 3),
                               ("write outputs", 0, None)]
    assert "serve requests" in screen.getvalue()
    assert "serve requests" not in capsys.readouterr().out  # the bar is not the summary


def test_serve_and_regress_print_no_progress_into_a_pipe(serve_file, tmp_path, capsys):
    from sim.app.cli.main import main

    assert main(["serve", str(serve_file), "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr()
    assert out.err == "" and "serve requests" not in out.out and "compile" not in out.out
    assert "output tokens/s" in out.out  # the summary still comes
    base = _baseline(tmp_path)
    assert main(["regress", str(base)]) == 0
    out = capsys.readouterr()
    assert out.err == "" and "configs" not in out.out.split("\n")[0]


def _baseline(tmp_path):
    """A baseline of two quick configs, written with the real figures."""
    from sim.app.regress.regress import create

    cfg = tmp_path / "gemv.toml"
    cfg.write_text('[hardware]\npreset = "tiny"\n[workload]\nkind = "gemv"\nk = 64\nn = 64\n'
                   "w_bits = 8\n")
    base = tmp_path / "base.json"
    create([cfg, cfg], base, sets=[])
    return base


def test_regress_counts_its_configs_on_a_terminal(tmp_path, monkeypatch):
    import sim.app.regress.regress

    base = _baseline(tmp_path)
    screen, made = _terminal(monkeypatch, sim.app.regress.regress)
    assert sim.app.regress.regress.main([str(base)]) == 0
    assert made[0].history == [("run the baseline's configs: 2 configs", 2, 2)]
    assert "run the baseline's configs" in screen.getvalue()


def test_ctrl_c_while_serving_leaves_no_output(serve_file, tmp_path, monkeypatch, capsys):
    from sim.app.cli.main import main
    from sim.serving import engine

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(engine.ServingSim, "run", interrupted)
    out = tmp_path / "o"
    assert main(["serve", str(serve_file), "--out", str(out)]) == 130
    assert not out.exists() or list(out.iterdir()) == []
    assert "interrupted" in capsys.readouterr().err


def test_ctrl_c_while_serve_writes_leaves_only_whole_files(serve_file, tmp_path, monkeypatch):
    from kvsim import files as tio
    from sim.app.cli.main import main

    out = tmp_path / "o"
    assert main(["serve", str(serve_file), "-q", "--out", str(out)]) == 0
    old = {p.name: p.read_bytes() for p in out.iterdir()}
    serve_file.write_text(SERVE.replace("requests = 3", "requests = 2"))
    real, calls = tio._write_all, []

    def half_then_interrupt(fd, data):  # the second file: half its bytes, then Ctrl-C
        calls.append(fd)
        if len(calls) == 2:
            os.write(fd, data[: len(data) // 2])
            raise KeyboardInterrupt
        real(fd, data)

    monkeypatch.setattr(tio, "_write_all", half_then_interrupt)
    assert main(["serve", str(serve_file), "-q", "--out", str(out)]) == 130
    new = {p.name: p.read_bytes() for p in out.iterdir()}
    assert set(new) == set(old)  # no temporary left behind
    assert new == old  # the earlier set whole: no new file beside old ones


def test_ctrl_c_during_regress_update_leaves_the_baseline_as_it_was(tmp_path, monkeypatch):
    import sim.app.regress.regress
    from sim.app.cli.main import main

    base = _baseline(tmp_path)
    before = base.read_bytes()
    real, calls = sim.app.regress.regress.run_figures, []

    def second_interrupts(config, sets=()):
        calls.append(config)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return {k: v * 2 for k, v in real(config, sets).items()}

    monkeypatch.setattr(sim.app.regress.regress, "run_figures", second_interrupts)
    assert main(["regress", str(base), "--update"]) == 130
    assert base.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base.json", "gemv.toml"]


# --- kvsim hw sensitivity and sweeps: one progress style, on a terminal only ---------------

SENSITIVITY = ["hw", "sensitivity", "--set", "hardware.preset=tiny", "--set", "model.preset=tiny",
               "--set", "compile.core_mode=single", "--set", "workload.prompt_tokens=8",
               "--set", "workload.output_tokens=2", "--set", "outputs.trace=off",
               "--param", "cores.clock_hz", "--workers", "1"]


def test_sensitivity_prints_no_progress_into_a_pipe(capsys, monkeypatch):
    from sim.app.cli.main import main

    monkeypatch.delenv("CI", raising=False)
    assert main(SENSITIVITY) == 0  # stderr is captured: not a terminal
    out, err = capsys.readouterr()
    assert err == "" and "cores.clock_hz" in out


def test_sensitivity_shows_its_points_on_a_terminal_under_its_own_name(monkeypatch, capsys):
    import sim.app.cli.main as cli
    import sim.app.sweep.executor as ex
    import sim.progress
    from sim.app.cli.main import main

    screen, made = _terminal(monkeypatch, sim.progress)
    monkeypatch.setattr(ex, "Phases", sim.progress.Phases)  # the executor's, shown
    monkeypatch.setattr(cli, "progress_enabled", lambda stream=None: True)
    assert main(SENSITIVITY) == 0
    assert [h[:3] for p in made for h in p.history] == [("hardware points", 3, 3)]
    assert "hardware points" in screen.getvalue() and "kvsim sweep" not in screen.getvalue()


def test_sensitivity_runs_one_worker_per_cpu_by_default(monkeypatch, capsys):
    from sim.app.cli.main import build_parser

    args = build_parser().parse_args(["hw", "sensitivity"])
    assert args.workers is None  # execute() takes None as one process per CPU
    import sim.app.sweep.executor as ex

    assert ex.worker_count(None, points=100) == (os.cpu_count() or 1)


def test_the_progress_line_says_what_its_times_are():
    screen = _Tty()
    with Phases(enabled=True, console=Console(file=screen, force_terminal=True, width=120)) as ph:
        ph.start("decode tokens", total=4)
        ph.advance()
        ph._progress.refresh()
    shown = screen.getvalue()
    assert "elapsed" in shown and "left" in shown
    assert shown.index("elapsed") < shown.index("left")  # "0:00:01 elapsed, 0:00:03 left"


def test_one_progress_library():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    uses = [str(p.relative_to(root)) for d in ("sim", "models", "isa", "traces", "kvsim")
            for p in (root / d).rglob("*.py") if "tqdm" in p.read_text()]
    assert uses == []
    import tomllib

    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    # kvsim's own dependencies and extras; the vendor extra lists what the vendor's packages
    # import (transformers-mblt imports tqdm), which kvsim itself never does (above)
    extras = {k: v for k, v in project["optional-dependencies"].items() if k != "vendor"}
    deps = [*project["dependencies"], *(d for v in extras.values() for d in v)]
    assert [d for d in deps if d.startswith("tqdm")] == []
