"""The block memo (:class:`models.compiler.builder.BlockMemo`): replayed blocks give the
programs a fresh lowering gives, byte for byte; a block seen from another builder state
is lowered again; the memo stays bounded."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isa.encoding import encode_instruction, encode_program
from models.bits import build_bit_config
from models.compiler import HardwareTarget, compile_model
from models.compiler.builder import BlockMemo, Builder, Matrix, Target, remade
from models.compiler.sram import SramPlan
from models.source import load_preset
from sim.device.hw import load_hardware
from tests.isa.strategies import flag_lists, instructions, values_for

TINY_HW = load_hardware("tiny")
TINY = load_preset("tiny")


def _compile(kv: str = "int8"):
    return compile_model(TINY, build_bit_config({}), HardwareTarget.from_hw(TINY_HW), kv=kv,
                         core_mode="single", max_seq=48, cap=256, functional=False,
                         tile_bytes=28672)


def test_replayed_programs_equal_fresh_lowerings_byte_for_byte() -> None:
    warm = _compile("kivi-4")
    lw = warm.lowering(warm.tile_for(1))
    for c in range(60, 70):  # successive decode steps: MLP, O projection and head replay
        warm.program(tokens=1, cache_size=c)
    assert lw.memo.hits > 0
    for tokens, cache in ((1, 70), (1, 200), (48, 0), (19, 5)):
        fresh = _compile("kivi-4")
        got = warm.program(tokens=tokens, cache_size=cache)
        want = fresh.program(tokens=tokens, cache_size=cache)
        assert encode_program(got) == encode_program(want), (tokens, cache)


def test_decode_steps_lower_only_their_attention_again() -> None:
    cm = _compile()
    lw = cm.lowering(cm.tile_for(1))
    cm.program(tokens=1, cache_size=100)
    misses = lw.memo.misses
    cm.program(tokens=1, cache_size=101)
    # every layer's MLP and O projection, and the head, come from the memo
    assert lw.memo.misses == misses
    assert lw.memo.hits >= 2 * TINY.num_layers + 1


def _gemm_block(b: Builder, mat: Matrix) -> None:
    b.gemm(0, mat, (0, mat.n), a=0, m=1, out=4096, plan=SramPlan(b.target, 0))


def test_a_block_from_another_builder_state_is_lowered_again() -> None:
    target = Target((0,), 1 << 20, 1024)
    mat = Matrix("w", n=64, k=64, bits=8, w_addr=0, p_addr=1 << 16, has_bias=False,
                 requant=False, shift=0)  # 64-byte rows, 16 per tile: 4 tiles
    memo = BlockMemo()
    odd = Builder(target)
    b0 = Builder(target)
    b0.tile_load(0, mat, 0, 1)  # one tile issued: the next load goes to buffer 1
    odd.tile_load(0, mat, 0, 1)
    memo.lower(b0, "gemm", lambda: _gemm_block(b0, mat))
    even = Builder(target)
    memo.lower(even, "gemm", lambda: _gemm_block(even, mat))
    assert (memo.hits, memo.misses) == (0, 2)
    plain = Builder(target)
    _gemm_block(plain, mat)
    assert even.ins == plain.ins
    assert even.ins != b0.ins[1:]  # the buffers alternate the other way round
    memo.lower(odd, "gemm", lambda: _gemm_block(odd, mat))
    assert memo.hits == 1
    assert odd.ins == b0.ins and odd.tiles == b0.tiles and odd.bar_due == b0.bar_due


def test_the_memo_keeps_at_most_its_bound() -> None:
    target = Target((0,), 1 << 20, 1024)
    memo = BlockMemo(max_entries=3)
    b = Builder(target)
    for i in range(5):
        mat = Matrix(f"w{i}", n=16, k=64, bits=8, w_addr=0, p_addr=1 << 16, has_bias=False,
                     requant=False, shift=0)
        memo.lower(b, i, lambda mat=mat: _gemm_block(b, mat))
    assert len(memo) == 3


def test_a_compile_without_stored_programs_lowers_the_same_programs() -> None:
    lean = compile_model(TINY, build_bit_config({}), HardwareTarget.from_hw(TINY_HW),
                         kv="int8", core_mode="single", max_seq=48, cap=256,
                         functional=False, tile_bytes=28672, store_programs=False)
    full = _compile()
    assert lean.programs == {} and set(full.programs) == {"prefill_48", "decode"}
    assert encode_program(lean.program(tokens=48, cache_size=0)) == encode_program(
        full.programs["prefill_48"])
    assert encode_program(lean.program(tokens=1, cache_size=48)) == encode_program(
        full.programs["decode"])


def test_equal_instructions_share_one_object() -> None:
    """The builder keeps one object per distinct instruction it emits (prefill tiles
    re-emit the same weight loads and GEMMs); the instructions themselves are unchanged."""
    from isa.instructions import DmaLoad

    b = Builder(Target(cores=(0,), sram_bytes=1 << 16, tile_bytes=1024))
    first = DmaLoad(src=0, dst=64, nbytes=128)
    b.emit(first)
    b.emit(DmaLoad(src=0, dst=64, nbytes=128))
    b.emit(DmaLoad(src=0, dst=64, nbytes=256))
    assert b.ins[1] is first
    assert b.ins[2] is not first and b.ins[2].nbytes == 256
    assert b.ins == [first, first, DmaLoad(src=0, dst=64, nbytes=256)]


def _fresh(lw):
    """The same lowering context with a memo that keeps nothing (every block lowered)."""
    from dataclasses import replace

    return replace(lw, memo=BlockMemo(max_entries=0))


def test_replayed_attention_follows_the_positions_byte_for_byte() -> None:
    """Attention stages replayed at other positions (decode steps, prefill chunks, a
    sliding window filling and then sliding, QK norm) equal fresh lowerings."""
    from models.compiler.driver import lower_call

    for preset, kv in (("tiny", "kivi-4"), ("tiny-cohere2", "int8"),
                       ("tiny-exaone4", "qserve-kv4")):
        cm = compile_model(load_preset(preset), build_bit_config({}),
                           HardwareTarget.from_hw(TINY_HW), kv=kv, core_mode="single",
                           max_seq=48, cap=256, functional=False, store_programs=False)
        calls = [(1, c) for c in (3, 4, 5, 6, 9, 10, 11, 40, 41, 200)]
        calls += [(5, 0), (5, 7), (5, 20), (48, 0), (48, 100)]
        for tokens, cache in calls:
            lw = cm.lowering(cm.tile_for(min(tokens, cm.m_tile)))
            got = cm.program(tokens=tokens, cache_size=cache)
            want = lower_call(_fresh(lw), n=tokens, cache_size=cache)
            assert encode_program(got) == encode_program(want), (preset, tokens, cache)
        assert lw.memo.hits > 0


def test_batched_steps_replay_attention_at_their_own_positions() -> None:
    from models.compiler.driver import StepSeq, lower_step

    cm = _compile("kivi-4")
    lw = cm.lowering(cm.tile_for(1))
    for base in (30, 31, 64, 65, 90):
        seqs = [StepSeq(0, 1, base + 7 * i, False) for i in range(3)]
        seqs.append(StepSeq(0, 4, 2 * base, False))
        got = lower_step(lw, seqs)
        want = lower_step(_fresh(lw), seqs)
        assert encode_program(got) == encode_program(want), base
    assert lw.memo.hits > 0


def test_a_decode_step_remakes_only_its_position_dependent_instructions() -> None:
    """From one decode step to the next only the RoPE table loads (cos, sin), the K and V
    cache appends and the attention of each KV head are new objects; every other
    instruction is the object the previous step emitted."""
    cm = _compile()
    cm.program(tokens=1, cache_size=99)
    a = cm.program(tokens=1, cache_size=100).instructions
    lw = cm.lowering(cm.tile_for(1))
    misses = lw.memo.misses
    b = cm.program(tokens=1, cache_size=101).instructions
    assert lw.memo.misses == misses  # attention too comes from the memo
    new = [type(y).__name__ for x, y in zip(a, b, strict=True) if x is not y]
    per_layer = ["DmaLoad"] * 2 + ["KvWrite"] * 2 * TINY.num_kv_heads + [
        "Attn"] * TINY.num_kv_heads
    assert sorted(new) == sorted(per_layer * TINY.num_layers)
    # a repeated call gets the very objects of the last call at that position
    again = cm.program(tokens=1, cache_size=101).instructions
    assert all(x is y for x, y in zip(b, again, strict=True))


def test_a_varying_instruction_needs_the_varying_arguments() -> None:
    from isa.instructions import DmaLoad

    target = Target((0,), 1 << 20, 1024)
    memo = BlockMemo()
    b = Builder(target)

    def block() -> None:
        b.emit(DmaLoad(src=0, dst=0, nbytes=4), lambda ins, pos: ins.replace(src=pos))

    with pytest.raises(RuntimeError, match="without its varying arguments"):
        memo.lower(b, "x", block)
    with pytest.raises(RuntimeError, match="cannot be part of another"):
        memo.lower(b, "outer", lambda: memo.lower(b, "inner", block, args=1), args=0)
    with pytest.raises(RuntimeError, match="without its varying arguments"):
        memo.lower(b, "outer", lambda: memo.lower(b, "inner", block), args=0)
    # blocks that do not vary nest: the outer one's replay holds the inner one's
    n = len(b.ins)
    plain = lambda: b.emit(DmaLoad(src=4, dst=0, nbytes=4))  # noqa: E731
    memo.lower(b, "p", lambda: (plain(), memo.lower(b, "q", plain)))
    memo.lower(b, "p", lambda: (plain(), memo.lower(b, "q", plain)))
    assert len(b.ins) == n + 4 and len(set(map(id, b.ins[n:]))) == 1
    hits = memo.hits
    memo.lower(b, "y", block, args=8)
    memo.lower(b, "y", block, args=16)
    assert [i.src for i in b.ins[-2:]] == [0, 16] and memo.hits == hits + 1


def test_an_sram_probe_without_the_head_is_the_call_up_to_its_head() -> None:
    from isa.instructions import HostRead
    from kvsim.errors import ConfigError
    from models.compiler.driver import lower_call

    cm = _compile()
    lw = cm.lowering(cm.tile_for(5))
    full = lower_call(_fresh(lw), n=5, cache_size=0).instructions
    probe = lower_call(_fresh(lw), n=5, cache_size=0, head=False).instructions
    assert 0 < len(probe) < len(full) and probe == full[:len(probe)]
    assert isinstance(full[-1], HostRead) and not any(isinstance(i, HostRead) for i in probe)
    with pytest.raises(ConfigError, match="always runs its head"):
        lower_call(lw, n=5, cache_size=0, all_logits=True, head=False)


@settings(max_examples=150, deadline=None)
@given(ins=instructions(), data=st.data())
def test_remade_instructions_equal_replaced_ones(ins, data) -> None:
    """:func:`remade` copies field values past the constructor: for any instruction and
    any change of its fields it gives what ``replace`` gives (the instruction types keep
    a constructor that only stores)."""
    cls = type(ins)
    assert "__post_init__" not in vars(cls) and not hasattr(cls, "__slots__")
    fields = data.draw(st.lists(st.sampled_from(cls.body_fields()), unique=True, max_size=3))
    changes = {f.name: data.draw(values_for(f)) for f in fields}
    if data.draw(st.booleans()):
        changes["wait"] = data.draw(flag_lists())
    got = remade(ins, **changes)
    want = ins.replace(**changes)
    assert type(got) is cls and got == want and hash(got) == hash(want)
    assert encode_instruction(got) == encode_instruction(want)
    assert got is not ins


def test_remade_refuses_a_field_the_instruction_lacks() -> None:
    from isa.instructions import DmaLoad

    with pytest.raises(TypeError, match="DmaLoad has no field nbytez"):
        remade(DmaLoad(src=0, dst=0, nbytes=4), nbytez=4)
