"""The MoE router kernel (TOPK_GATE): bit for bit against a Python-int reference written
from its formulas, close to the float softmax, and through the instruction's semantics,
operand sizes and validation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from isa.errors import ProgramError
from isa.instructions import MemoryLayout, Program, Vec, VecFunc
from isa.kernels import moe
from isa.semantics import execute
from isa.validate import validate_program
from tests.isa.test_kernels_softmax import ref_isigmoid, ref_softmax_q, rhu_shift
from tests.isa.test_wide_instructions import Mem

SETTINGS = settings(max_examples=150, deadline=None)


def ref_topk_gate(x: np.ndarray, mult: int, shift: int, k: int, flags: int) -> list[list[int]]:
    """One row's entries per token: stable sort of the negated logits (ties to the lower
    id), Q20 logits relative to the row maximum, Q24 softmax over all or over the top k."""
    out = []
    for row in x.astype(int).tolist():
        ids = sorted(range(len(row)), key=lambda t: -row[t])[:k]  # sorted() is stable
        m = max(row)
        logits = [rhu_shift((v - m) * mult, shift) for v in row]
        if flags & moe.RENORM:
            w = ref_softmax_q([logits[t] for t in ids])
        else:
            p = ref_softmax_q(logits)
            w = [p[t] for t in ids]
        out.append([v for pair in zip(ids, w, strict=True) for v in pair])
    return out


@st.composite
def router_cases(draw):
    r = draw(st.integers(1, 5))
    e = draw(st.integers(1, 24))
    x = draw(hnp.arrays(np.int8, (r, e), elements=st.integers(-128, 127)))
    k = draw(st.integers(1, min(e, 16)))
    mult = draw(st.integers(1, 2**31 - 1))
    shift = draw(st.integers(0, 30))
    return x, mult, shift, k, draw(st.sampled_from([0, moe.RENORM]))


@SETTINGS
@given(router_cases())
def test_topk_gate_matches_the_reference(case) -> None:
    x, mult, shift, k, flags = case
    out = np.zeros((x.shape[0], 2 * k), np.int32)
    moe.topk_gate_rows(x, mult, shift, k, flags, out)
    assert out.tolist() == ref_topk_gate(x, mult, shift, k, flags)


def test_ties_go_to_the_lower_expert() -> None:
    x = np.array([[5, 9, 9, 1, 9]], np.int8)
    out = np.zeros((1, 6), np.int32)
    moe.topk_gate_rows(x, 1 << 20, 0, 3, moe.RENORM, out)
    assert out[0, 0::2].tolist() == [1, 2, 4]
    assert out[0, 1::2].tolist() == [5592405, 5592405, 5592405]  # 2**24 / 3, rounded


def test_gate_weights_are_close_to_the_float_softmax() -> None:
    rng = np.random.default_rng(0)
    s = 0.05  # the logits' scale: real logit = s * x
    x = rng.integers(-128, 128, (64, 8)).astype(np.int8)
    mult, shift = round(s * 2**20 * 2**10), 10  # Q20 logits: x * s * 2**20
    for flags in (0, moe.RENORM):
        out = np.zeros((64, 4), np.int32)
        moe.topk_gate_rows(x, mult, shift, 2, flags, out)
        z = s * x.astype(np.float64)
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        ids = np.argsort(-x.astype(np.int64), axis=1, kind="stable")[:, :2]
        np.testing.assert_array_equal(out[:, 0::2], ids)
        want = np.take_along_axis(p, ids, 1)
        if flags:
            want /= want.sum(1, keepdims=True)
        np.testing.assert_allclose(out[:, 1::2] / 2**24, want, atol=4e-3)


def test_the_instruction_writes_the_routing_table() -> None:
    x = np.array([[3, -7, 40, 12], [0, 0, -1, 2]], np.int8)
    mem = Mem()
    mem.put(0x0, x)
    ins = Vec(func=VecFunc.TOPK_GATE, rows=2, cols=4, src0=0x0, dst=0x100,
              p0=1 << 20, p1=4, p2=2, p3=moe.RENORM)
    validate_program(Program(instructions=(ins,)), LAYOUT)
    assert [a.nbytes for a in ins.accesses()] == [8, 2 * 2 * 8]
    assert ins.ops() == 8 * 12
    execute(ins, mem)
    assert mem.get(0x100, 8, np.int32).reshape(2, 4).tolist() == ref_topk_gate(
        x, 1 << 20, 4, 2, moe.RENORM)


LAYOUT = MemoryLayout(dram_bytes=1 << 16, sram_bytes=1 << 16, host_bytes=1 << 12,
                      num_cores=1)


@pytest.mark.parametrize(("k", "cols"), [(0, 4), (5, 4), (17, 32)])
def test_k_out_of_range_is_refused(k: int, cols: int) -> None:
    ins = Vec(func=VecFunc.TOPK_GATE, rows=1, cols=cols, src0=0x0, dst=0x100, p2=k)
    with pytest.raises(ProgramError, match=r"TOPK_GATE: p2 \(k, the experts chosen per row\)"):
        validate_program(Program(instructions=(ins,)), LAYOUT)


# --- GATE_ACC and SIGMOID (the MoE block's gate weights) --------------------------------


def ref_gate_acc(y: np.ndarray, gates: list[int], shift: int, acc: np.ndarray | None
                 ) -> np.ndarray:
    """Python ints: ``sat32((acc or 0) + rhu(y * g, shift))`` per element."""
    out = np.zeros(y.shape, np.int64)
    for i, row in enumerate(y.astype(int).tolist()):
        for j, v in enumerate(row):
            t = rhu_shift(v * gates[i], shift) + (int(acc[i, j]) if acc is not None else 0)
            out[i, j] = min(max(t, -(2**31)), 2**31 - 1)
    return out.astype(np.int32)


@SETTINGS
@given(y=hnp.arrays(np.int32, st.tuples(st.integers(1, 4), st.integers(1, 9)),
                    elements=st.integers(-(2**31), 2**31 - 1)),
       gates=st.lists(st.integers(0, 2**24), min_size=4, max_size=4),
       shift=st.integers(0, 30), accumulate=st.booleans(), seed=st.integers(0, 99))
def test_gate_acc_rows_matches_reference(y, gates, shift, accumulate, seed) -> None:
    r = y.shape[0]
    acc = np.random.default_rng(seed).integers(-(2**31), 2**31, y.shape).astype(np.int32)
    out = acc.copy()
    moe.gate_acc_rows(y, np.array(gates[:r], np.int32), shift, accumulate, out)
    np.testing.assert_array_equal(
        out, ref_gate_acc(y, gates, shift, acc if accumulate else None))


@SETTINGS
@given(x=hnp.arrays(np.int8, st.tuples(st.integers(1, 4), st.integers(1, 6))),
       mult=st.integers(1, 2**31 - 1), shift=st.integers(0, 40))
def test_sigmoid_rows_matches_reference(x, mult, shift) -> None:
    out = np.zeros(x.shape, np.int32)
    moe.sigmoid_rows(x, mult, shift, out)
    want = [[ref_isigmoid(rhu_shift(v * mult, shift)) << 4 for v in row]
            for row in x.astype(int).tolist()]
    np.testing.assert_array_equal(out, np.array(want, np.int64).astype(np.int32))


def test_gate_acc_instruction_reads_strided_gates_and_accumulates() -> None:
    """GATE_ACC through the semantics: row r's gate at src1 + r * p1 (a routing table's
    weights, 8 bytes apart), added onto dst with p2 = 1, overwriting it with p2 = 0."""
    from isa.vecfuncs import GATE_ACCUMULATE, vec_operand_bytes

    mem = Mem()
    y = np.array([[1000, -2000, 3], [7, 8, -9]], np.int32)
    table = np.array([5, 1 << 23, 6, 1 << 24], np.int32)  # (id, gate) pairs
    old = np.array([[1, 2, 3], [4, 5, 6]], np.int32)
    mem.put(0x0, y)
    mem.put(0x100, table)
    for flag, base in ((GATE_ACCUMULATE, old), (0, None)):
        mem.put(0x200, old)
        v = Vec(core=0, func=VecFunc.GATE_ACC, rows=2, cols=3, src0=0x0, src1=0x104,
                dst=0x200, p0=24, p1=8, p2=flag)
        execute(v, mem)
        got = mem.get(0x200, 6, np.int32).reshape(2, 3)
        np.testing.assert_array_equal(got, ref_gate_acc(y, [1 << 23, 1 << 24], 24, base))
    assert vec_operand_bytes(VecFunc.GATE_ACC, 2, 3, 8, 0) == (24, 12, 24)
    bad = Vec(core=0, func=VecFunc.GATE_ACC, rows=2, cols=3, src0=0x0, src1=0x104,
              dst=0x200, p0=24, p1=6)
    with pytest.raises(ProgramError, match="GATE_ACC: p1"):
        validate_program(Program((bad,)), MemoryLayout(dram_bytes=1 << 20,
                                                       sram_bytes=1 << 16, host_bytes=0,
                                                       num_cores=1))
