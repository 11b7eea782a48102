"""One way to get a ready model (:mod:`sim.runtime.ready`): a run resolves its model once,
the same build is compiled once, and every caller gets its model there."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import models.source
import sim.runtime.ready as ready_mod
from models.bits import build_bit_config
from sim.app.config import load_run_config
from sim.app.run import run
from sim.runtime.ready import ready_model

TINY = ["hardware.preset=tiny", "model.preset=tiny", "compile.core_mode=single",
        "workload.prompt_tokens=8", "workload.output_tokens=3", "outputs.trace=off"]


@pytest.fixture
def resolutions(monkeypatch) -> list[str]:
    """Every resolution of a model by name, wherever the resolving functions were imported
    (``resolve_model``: a name to a source; ``load_model``: a name to an architecture)."""
    calls: list[str] = []
    for name in ("resolve_model", "load_model"):
        original = getattr(models.source, name)

        def counted(*args, _name=name, _original=original, **kwargs):
            calls.append(f"{_name}({args[0]!r})")
            return _original(*args, **kwargs)

        for module in list(sys.modules.values()):
            if getattr(module, name, None) is original:
                monkeypatch.setattr(module, name, counted)
    return calls


@pytest.mark.parametrize("sets", [[], ["sim.fidelity=functional"]],
                         ids=["timing", "functional"])
def test_a_run_resolves_its_model_once(resolutions, sets):
    cfg = load_run_config(None, [*TINY, *sets])
    assert resolutions == []  # loading the config names the model, resolves nothing
    result = run(cfg)
    assert resolutions == ["resolve_model('tiny')"]
    assert result.metrics.generated_tokens  # the run ran


def test_a_run_of_an_architecture_file_reads_it_once(resolutions):
    path = models.source.resources.files("models.presets").joinpath("qwen2.5-0.5b.json")
    run(load_run_config(None, ["hardware.preset=aries", f"model.hf_config={path}",
                               "workload.prompt_tokens=4", "workload.output_tokens=2",
                               "outputs.trace=off"]))
    assert resolutions == [f"load_model({Path(str(path))!r})"]


def test_the_same_build_is_compiled_once(monkeypatch):
    compiled = []
    original = ready_mod.compile_model

    def counted(*args, **kwargs):
        compiled.append(kwargs["max_seq"])
        return original(*args, **kwargs)

    monkeypatch.setattr(ready_mod, "compile_model", counted)
    monkeypatch.setattr(ready_mod, "_COMPILED", {})
    bits = build_bit_config({})
    a = ready_model("tiny", "tiny", bits=bits, core_mode="single", max_seq=8, cap=64,
                    functional=False)
    # another DRAM efficiency: the same compiler target, so the same compiled model
    from sim.device.hw import load_hardware

    other = load_hardware("tiny", {"dram.efficiency": 0.5})
    b = ready_model(a.source, other, bits=bits, core_mode="single", max_seq=8, cap=64,
                    functional=False)
    assert b.compiled is a.compiled and b.hw is other and compiled == [8]
    c = ready_model("tiny", "tiny", bits=bits, core_mode="single", max_seq=16, cap=64,
                    functional=False)
    assert c.compiled is not a.compiled and compiled == [8, 16]
    # the cache keeps the newest COMPILED_KEPT builds
    for n in range(4, 4 + ready_mod.COMPILED_KEPT):
        ready_model("tiny", "tiny", bits=bits, core_mode="single", max_seq=n, cap=64,
                    functional=False)
    assert len(ready_mod._COMPILED) == ready_mod.COMPILED_KEPT
    ready_model("tiny", "tiny", bits=bits, core_mode="single", max_seq=8, cap=64,
                functional=False)
    assert compiled[-1] == 8  # fell out of the cache: compiled again


def test_a_ready_model_launches_and_embeds_as_the_host_does():
    import numpy as np

    r = ready_model("tiny", "tiny", core_mode="single", max_seq=8, cap=64)
    assert r.functional and r.compiled.numerics.functional
    model = r.launch()
    x = r.embed([3, 1, 4])
    table = r.compiled.weight_source().tensor("embed")
    assert x.dtype == np.float32 and np.array_equal(x, table[[3, 1, 4]].astype(np.float32))
    [logits] = model.infer(x, cache_size=0)
    assert logits.shape == (r.compiled.model.vocab_size,)
    model.dispose()


def test_every_caller_gets_its_model_from_ready_model():
    """No module of the simulator compiles a model itself: ``compile_model`` is called in
    :mod:`sim.runtime.ready` only."""
    import ast

    root = Path(__file__).resolve().parents[2] / "sim"
    callers = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "compile_model":
                callers.append(path.relative_to(root.parent).as_posix())
    assert sorted(set(callers)) == ["sim/runtime/ready.py"]
