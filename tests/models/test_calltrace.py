"""Whole calls replayed from the last call of their shape (:mod:`models.compiler.calltrace`)
equal fresh lowerings byte for byte, say which positions they re-made, and are made only
for calls whose every block keys by the call's shape."""

from __future__ import annotations

from dataclasses import replace

import pytest

from isa.encoding import encode_program
from models.bits import build_bit_config
from models.compiler import HardwareTarget, compile_model
from models.compiler.builder import BlockMemo
from models.compiler.driver import StepSeq, lower_call, lower_step
from models.config import build_model
from models.source import load_preset
from sim.device.hw import load_hardware

TINY_HW = load_hardware("tiny")
#: The tiny preset with three sliding layers of a 4-token window, then a full layer
#: without positional embedding (as tests/models/test_sliding.py builds it)
SWA = build_model({**load_preset("tiny").model_dump(exclude_none=True), "name": "tiny-swa",
                   "num_layers": 4, "sliding_window": 4, "rope_layers": "sliding",
                   "layer_types": ["sliding_attention"] * 3 + ["full_attention"]})


def _compile(preset: str = "tiny", kv: str = "int8", **kw):
    cfg = SWA if preset == "tiny-swa" else load_preset(preset)
    return compile_model(cfg, build_bit_config({}),
                         HardwareTarget.from_hw(TINY_HW), kv=kv, core_mode="single",
                         max_seq=48, cap=256, functional=False, store_programs=False, **kw)


def _fresh(lw):
    """The same lowering context with a memo that keeps nothing (every block lowered)."""
    return replace(lw, memo=BlockMemo(max_entries=0))


@pytest.mark.parametrize(("preset", "kv", "traced"), [
    ("tiny", "kivi-4", True), ("tiny-swa", "int8", True),  # sliding window
    ("tiny-mixtral", "int8", True),  # mixture of experts
    # MLPs that key by the positions: parallel (Cohere2), post-norm (EXAONE-4.0)
    ("tiny-cohere2", "int8", False), ("tiny-exaone4", "qserve-kv4", False)])
def test_replayed_calls_equal_fresh_lowerings(preset, kv, traced) -> None:
    cm = _compile(preset, kv)
    # decode steps forward, back, repeated and far; prefill calls of one and more tiles
    calls = [(1, c) for c in (3, 4, 5, 6, 5, 5, 9, 10, 11, 40, 41, 200)]
    calls += [(5, 0), (5, 7), (5, 20), (48, 0), (48, 100), (1, 12)]
    for tokens, cache in calls:
        lw = cm.lowering(cm.tile_for(min(tokens, cm.m_tile)))
        got = cm.program(tokens=tokens, cache_size=cache)
        want = lower_call(_fresh(lw), n=tokens, cache_size=cache)
        assert encode_program(got) == encode_program(want), (preset, tokens, cache)
        assert got.name == want.name and got.marks == want.marks
    lw = cm.lowering(cm.tile_for(1))
    assert bool(lw.memo.calls) == traced
    assert (cm.program(tokens=1, cache_size=13).patched_from is not None) == traced


def test_a_replayed_call_says_which_positions_it_remade() -> None:
    cm = _compile("tiny", "kivi-4")
    first = cm.program(tokens=1, cache_size=99)
    assert first.patched_from is None  # the first call of its shape: lowered
    a = cm.program(tokens=1, cache_size=100)
    assert a.patched_from.base is first.instructions  # made from the lowered one
    b = cm.program(tokens=1, cache_size=101)
    hint = b.patched_from
    assert hint.base is a.instructions
    # every other position holds the last program's object; each named one a new object
    assert list(hint.positions) == [i for i, (x, y) in enumerate(
        zip(a.instructions, b.instructions, strict=True)) if x is not y]
    # equal re-made instructions are one object (the RoPE table loads of every layer)
    made = [b.instructions[p] for p in hint.positions]
    assert len(set(made)) == len({id(x) for x in made}) < len(made)
    # a repeated call: its positions named again, the very objects of the last call
    again = cm.program(tokens=1, cache_size=101)
    assert again.patched_from.base is b.instructions
    assert again.patched_from.positions == hint.positions
    assert all(x is y for x, y in zip(b.instructions, again.instructions, strict=True))


def test_a_call_longer_than_the_bound_keeps_no_trace(monkeypatch) -> None:
    from models.compiler import calltrace

    cm = _compile("tiny", "kivi-4")
    n = len(cm.program(tokens=1, cache_size=20).instructions)
    monkeypatch.setattr(calltrace, "CALL_TRACE_INSTRUCTIONS", n - 1)
    cm = _compile("tiny", "kivi-4")
    for cache in (20, 21):
        got = cm.program(tokens=1, cache_size=cache)
        assert got.patched_from is None  # lowered each time
        lw = cm.lowering(cm.tile_for(1))
        assert not lw.memo.calls
        assert encode_program(got) == encode_program(
            lower_call(_fresh(lw), n=1, cache_size=cache))
    monkeypatch.setattr(calltrace, "CALL_TRACE_INSTRUCTIONS", n)
    cm.program(tokens=1, cache_size=22)
    assert cm.program(tokens=1, cache_size=23).patched_from is not None


def test_steps_replay_unless_an_instruction_is_outside_a_block() -> None:
    from sim.runtime.deviceops import step_compiled

    # with the regions of the sampling rows and their logits
    cm = step_compiled(_compile("tiny", "kivi-4"), TINY_HW.dram.capacity_bytes, 4)
    lw = cm.lowering(cm.tile_for(1))
    for base in (30, 31, 64):
        # no sequence samples: every instruction comes from a block
        quiet = [StepSeq(0, 1, base + 7 * i, False) for i in range(3)]
        got = lower_step(lw, quiet)
        assert encode_program(got) == encode_program(lower_step(_fresh(lw), quiet))
        assert (got.patched_from is not None) == (base != 30)
    held = len(lw.memo.calls)
    for base in (30, 31):  # the gathered sampling rows are emitted outside the blocks
        sampling = [StepSeq(0, 1, base, True), StepSeq(0, 4, 2 * base, True)]
        got = lower_step(lw, sampling)
        assert encode_program(got) == encode_program(lower_step(_fresh(lw), sampling))
        assert got.patched_from is None
    assert len(lw.memo.calls) == held
