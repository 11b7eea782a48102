"""Progress on a terminal (``sim.progress``): the phases of ``kvsim run`` as the runtime's
calls tell them, and quiet off a terminal or under CI."""

from __future__ import annotations

import io

from rich.console import Console

from sim.config import load_run_config
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
    from sim.cli import run_phases
    from sim.run import run

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
