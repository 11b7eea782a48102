"""The step-cost grid's measuring (sim/serving/grid.py): tasks that lower the same program
are simulated once, and the program key's claim holds on the device."""

from __future__ import annotations

from models.bits import BitConfig
from models.compiler import HardwareTarget, compile_model
from models.config import load_model
from sim.hw import load_hardware
from sim.serving import grid


def _tiny():
    hw = load_hardware("tiny")
    cm = compile_model(load_model("tiny"), BitConfig(), HardwareTarget.from_hw(hw), kv="int8",
                       core_mode="single", max_seq=64, cap=256, functional=False)
    return cm, hw


def test_a_one_token_prefill_piece_is_the_decode_of_one_sequence():
    cm, hw = _tiny()
    grid._CTX["cm"], grid._CTX["hw"] = cm, hw
    for layers in [(0,), (0, 1)]:
        pre, dec = ("prefill", 1, 63, layers), ("decode", 1, 64, layers)
        assert grid.program_key(pre) == grid.program_key(dec)
        assert grid.measure(pre) == grid.measure(dec)
    # a longer piece, another context or another layer set is another program
    keys = {grid.program_key(t) for t in [("prefill", 2, 63, (0,)), ("decode", 1, 65, (0,)),
                                          ("decode", 1, 64, (0, 1)), ("decode", 2, 64, (0,))]}
    assert len(keys) == 4


def test_run_tasks_simulates_each_program_once(monkeypatch):
    cm, hw = _tiny()
    seen = []

    def fake(task):
        seen.append(task)
        return 1000 * len(seen)

    monkeypatch.setattr(grid, "measure", fake)
    tasks = [("logits", 1), ("decode", 1, 1, (0,)), ("prefill", 1, 0, (0,)),
             ("prefill", 4, 0, (0,)), ("io", 8)]
    out = grid.run_tasks(cm, hw, tasks, jobs=1, progress=None)
    assert seen == [("logits", 1), ("decode", 1, 1, (0,)), ("prefill", 4, 0, (0,)), ("io", 8)]
    assert out == {("logits", 1): 1000, ("decode", 1, 1, (0,)): 2000,
                   ("prefill", 1, 0, (0,)): 2000, ("prefill", 4, 0, (0,)): 3000,
                   ("io", 8): 4000}
