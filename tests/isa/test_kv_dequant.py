"""The dequantize-on-read KV path: exact Q24 reads of every format, the fp16 attention of
``attn.dq`` against a float64 numpy reference, its validation and its cycle formula."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isa import kvformats as kf
from isa import semantics
from isa.errors import ProgramError
from isa.instructions import Attn, AttnDq, MemoryLayout, Program, Space, f32_bits, f32_value
from isa.validate import validate_program
from sim.device.components.core import DEQUANT_OPS_PER_VALUE, FLOAT_SOFTMAX_OPS, ComputeCore
from sim.device.hw import load_hardware
from tests.isa.kvref import format_and_values
from tests.isa.test_kv_region import FlatMemory


def round_q24(v: np.ndarray) -> np.ndarray:
    """The integer path's rounding of a Q24 value: half up, saturated to int8."""
    return np.clip((v + (1 << 23)) >> 24, -128, 127).astype(np.int8)


@settings(max_examples=150, deadline=None)
@given(format_and_values(), st.integers(0, 12))
def test_q24_read_rounds_to_the_integer_read(case, extra: int) -> None:
    """For every format (fp, quantized, per-token, per-channel, raw int8 runs), the exact
    dequantized values round to the integer path's int8 values."""
    f, x = case
    t, w = x.shape
    cap = t + extra
    region = f.region_encode(x, cap)
    fine = f.region_read_q24(region, cap, w, 0, t)
    assert fine.dtype == np.int64 and fine.shape == (t, w)
    assert np.array_equal(round_q24(fine), f.region_read(region, cap, w, 0, t))


def test_q24_read_keeps_what_the_integer_read_rounds_away() -> None:
    f = kf.parse("kivi-2.v")  # 2-bit per-token groups of 32: steps of about range/3
    rng = np.random.default_rng(0)
    x = rng.integers(-100, 100, (200, 64), dtype=np.int8)
    region = f.region_encode(x, 256)
    fine = f.region_read_q24(region, 256, 64, 0, 200)
    quant = fine[:72]  # the first 72 tokens left the 128-token fp16 window
    assert np.any(quant % (1 << 24) != 0)  # fractional grid values survive
    assert np.all(fine[72:] == x[72:].astype(np.int64) << 24)  # fp16 window: exact


def _fp16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float64)


def ref_attn_dq(q, kq24, vq24, *, pos, sq, sk, sv, sm, so):
    """float64 reference: fp16 operands, exact softmax, round half up, saturate."""
    qh, kh, vh = _fp16(q * sq), _fp16(kq24 * 2.0**-24 * sk), _fp16(vq24 * 2.0**-24 * sv)
    L, H, d = q.shape
    T = kh.shape[0]
    out = np.zeros((L, H, vh.shape[2]), np.int64)
    for i in range(L):
        n = min(T, pos + i + 1)
        for h in range(H):
            s = kh[:n, 0] @ qh[i, h] * sm
            p = np.exp(s - s.max())
            p /= p.sum()
            out[i, h] = np.clip(np.floor(p @ vh[:n, 0] * so + 0.5), -128, 127)
    return out


@pytest.mark.parametrize("layout", ["int8", "kivi-4", "kivi-2", "qserve-kv4", "tok2"])
def test_attn_dq_matches_the_float_reference(layout: str) -> None:
    kfmt, vfmt = kf.pair(layout)
    rng = np.random.default_rng(1)
    cap, hd, heads, T, L = 256, 64, 3, 200, 4
    k = rng.integers(-128, 128, (T, hd), dtype=np.int8)
    v = rng.integers(-128, 128, (T, hd), dtype=np.int8)
    q = rng.integers(-128, 128, (L, heads, hd), dtype=np.int8)
    kreg, vreg = 0x10000, 0x40000
    mem = FlatMemory()
    kb, vb = kfmt.region_encode(k, cap), vfmt.region_encode(v, cap)
    mem.write(Space.DRAM, 0, kreg, kb)
    mem.write(Space.DRAM, 0, vreg, vb)
    mem.write(Space.SRAM, 0, 0x8000, q)
    sq, sk, sv, sm, so = 0.02, 0.05, 0.03, 0.125, 1 / 0.02
    pos = T - L
    ins = AttnDq(q_len=L, ctx=T, heads=heads, kv_heads=1, head_dim=hd, pos=pos, cap=cap,
                 k_fmt=0, v_fmt=1, q=0x8000, k=kreg, v=vreg, out=0x9000,
                 k_nbytes=kfmt.read_bytes(0, T, hd), v_nbytes=vfmt.read_bytes(0, T, hd),
                 q_scale_f32=f32_bits(sq), k_scale_f32=f32_bits(sk), v_scale_f32=f32_bits(sv),
                 softmax_scale_f32=f32_bits(sm), out_scale_f32=f32_bits(so))
    semantics.execute(ins, mem, (kf.to_text(kfmt), kf.to_text(vfmt)))
    got = mem.read(Space.SRAM, 0, 0x9000, L * heads * hd).view(np.int8).reshape(L, heads, hd)
    f32 = [float(np.float32(x)) for x in (sq, sk, sv, sm, so)]
    want = ref_attn_dq(q, kfmt.region_read_q24(kb, cap, hd, 0, T)[:, None, :],
                       vfmt.region_read_q24(vb, cap, hd, 0, T)[:, None, :], pos=pos,
                       sq=f32[0], sk=f32[1], sv=f32[2], sm=f32[3], so=f32[4])
    diff = np.abs(got.astype(np.int64) - want)
    assert diff.max() <= 1  # fp32 accumulation vs float64: a rounding boundary at most
    assert np.mean(diff == 0) >= 0.97
    assert np.abs(want).max() > 20  # the test case is not trivially all-zero


def test_f32_fields_round_trip() -> None:
    assert f32_value(f32_bits(0.125)) == 0.125
    assert f32_bits(1.0) == 0x3F80_0000


_LAYOUT = MemoryLayout(dram_bytes=1 << 20, sram_bytes=1 << 20, host_bytes=0, num_cores=1)


def _dq(**over) -> AttnDq:
    base = dict(q_len=1, ctx=4, heads=2, kv_heads=1, head_dim=8, cap=8, k_fmt=0, v_fmt=0,
                q=0, k=0x1000, v=0x2000, out=0x100, k_nbytes=32, v_nbytes=32,
                q_scale_f32=f32_bits(1.0), k_scale_f32=f32_bits(1.0),
                v_scale_f32=f32_bits(1.0), softmax_scale_f32=f32_bits(0.35),
                out_scale_f32=f32_bits(2.0))
    return AttnDq(**{**base, **over})


@pytest.mark.parametrize(("field", "value"), [
    ("k_scale_f32", f32_bits(float("nan"))),
    ("v_scale_f32", 0),
    ("out_scale_f32", f32_bits(float("inf"))),
    ("softmax_scale_f32", f32_bits(-1.0)),
])
def test_validator_refuses_bad_float_fields(field: str, value: int) -> None:
    validate_program(Program((_dq(),), formats=("int8",)), _LAYOUT)
    with pytest.raises(ProgramError, match=f"{field} holds"):
        validate_program(Program((_dq(**{field: value}),), formats=("int8",)), _LAYOUT)


def test_attn_dq_cycles_follow_the_formula_and_exceed_the_integer_path() -> None:
    hw = load_hardware("aries")
    core = ComputeCore(hw.cores, 0)
    a = _dq(q_len=16, ctx=512, heads=7, head_dim=64, cap=512)
    lanes, issue = hw.cores.vector_lanes, hw.cores.issue_latency_cycles
    dequant = -(-(2 * 512 * 64 * DEQUANT_OPS_PER_VALUE) // lanes)
    mac = -(-(2 * 16 * 512 * 64 * 7) // hw.cores.macs_per_cycle["w16a16"])
    soft = -(-(16 * 512 * 7 * FLOAT_SOFTMAX_OPS) // lanes)
    conv = -(-(2 * 16 * 7 * 64) // lanes)
    assert core.cycles(a, ("int8", "int8")) == issue + dequant + mac + soft + conv
    fields = {f: getattr(a, f) for f in ("q_len", "ctx", "heads", "kv_heads", "head_dim",
                                          "cap", "k_fmt", "v_fmt", "q", "k", "v", "out",
                                          "k_nbytes", "v_nbytes")}
    assert core.cycles(a, ("int8", "int8")) > core.cycles(Attn(**fields), ("int8", "int8"))
