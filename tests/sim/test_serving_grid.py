"""The step-cost grid's measuring (sim/serving/grid.py): tasks that lower the same program
are simulated once, and the program key's claim holds on the device."""

from __future__ import annotations

from models.bits import BitConfig
from models.compiler import HardwareTarget, compile_model
from models.source import load_model
from sim.device.hw import load_hardware
from sim.serving import grid


def _tiny():
    hw = load_hardware("tiny")
    cm = compile_model(load_model("tiny"), BitConfig(), HardwareTarget.from_hw(hw), kv="int8",
                       core_mode="single", max_seq=64, cap=256, functional=False)
    return cm, hw


def test_a_one_token_prefill_piece_is_the_decode_of_one_sequence():
    cm, hw = _tiny()
    for layers in [(0,), (0, 1)]:
        pre, dec = ("prefill", 1, 63, layers), ("decode", 1, 64, layers)
        assert grid.program_key(pre) == grid.program_key(dec)
        # each simulated on its own
        assert (grid.run_tasks(cm, hw, [pre], jobs=1, progress=None)[pre]
                == grid.run_tasks(cm, hw, [dec], jobs=1, progress=None)[dec])
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


def test_workers_measure_what_one_process_measures():
    cm, hw = _tiny()
    tasks = [("decode", 2, 64, (0, 1)), ("prefill", 1, 0, (0,)), ("decode", 1, 1, (0,)),
             ("prefill", 8, 32, (0,)), ("decode", 4, 128, (0,))]
    one = grid.run_tasks(cm, hw, tasks, jobs=1, progress=None)
    assert grid.run_tasks(cm, hw, tasks, jobs=2, progress=None) == one
    assert one[("prefill", 1, 0, (0,))] == one[("decode", 1, 1, (0,))]
    assert len(set(one.values())) == 4 and min(one.values()) > 0


def test_the_program_run_before_the_fork_is_the_cheapest():
    tasks = [("decode", 2, 64, (0, 1)), ("prefill", 4, 0, (0,)), ("decode", 1, 1, (0, 1)),
             ("head", 8), ("io", 4), ("decode", 1, 64, (0,))]
    assert min(tasks, key=grid.cheapness) == ("io", 4)
    assert min(tasks[:4] + tasks[5:], key=grid.cheapness) == ("head", 8)
    assert min(tasks[:3] + tasks[5:], key=grid.cheapness) == ("decode", 1, 64, (0,))
