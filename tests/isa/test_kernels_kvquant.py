"""Group quantization of int8 KV values, against exact rational references."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from isa.kernels import kvquant as kq
from isa.kernels.fpbits import BF16, FP16
from tests.isa.test_kernels_fixed import ref_bits_to_q, ref_nearest_bits, ref_value

SETTINGS = settings(max_examples=200, deadline=None)
ZKS = [kq.ZK_NONE, kq.ZK_FP16, kq.ZK_BF16, kq.ZK_U8, kq.ZK_I8]


def rhu(fr: Fraction) -> int:
    return math.floor(fr + Fraction(1, 2))


def clamp(v: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, v))


def ref_quant(vals: list[int], bits: int, zk: int, sk: int) -> tuple[list[int], int, int]:
    """(unsigned fields, scale bits, zero) following the rules in kvquant's docstring."""
    qmax = 2**bits - 1
    if zk == kq.ZK_NONE:
        qpos = 2 ** (bits - 1) - 1
        sb = ref_nearest_bits(Fraction(max(abs(v) for v in vals), qpos), sk)
        s = ref_value(sb, sk)
        codes = [clamp(rhu(v / s), -qpos, qpos) if s else 0 for v in vals]
        return [c % 2**bits for c in codes], sb, 0
    lo, hi = min(vals), max(vals)
    if zk in (kq.ZK_FP16, kq.ZK_BF16):
        zkind = FP16 if zk == kq.ZK_FP16 else BF16
        zb = ref_nearest_bits(Fraction(abs(lo)), zkind) | (0x8000 if lo < 0 else 0)
        z = ref_value(zb, zkind)
        assert z == lo
        sb = ref_nearest_bits(Fraction(hi - lo, qmax), sk)
        s = ref_value(sb, sk)
        return [clamp(rhu((v - z) / s), 0, qmax) if s else 0 for v in vals], sb, zb
    lo, hi = min(lo, 0), max(hi, 0)
    zmin, zmax = (0, 255) if zk == kq.ZK_U8 else (-128, 127)
    sb = ref_nearest_bits(Fraction(hi - lo, qmax), sk)
    s = ref_value(sb, sk)
    zp = clamp(rhu(-lo / s), zmin, zmax) if s else 0
    return [clamp(rhu(v / s) + zp, 0, qmax) if s else 0 for v in vals], sb, zp


def ref_dequant(fields: list[int], bits: int, zk: int, sk: int, sb: int, zero: int) -> list[int]:
    s = Fraction(ref_bits_to_q(sb, sk), 2**24)
    out = []
    for f in fields:
        f %= 2**bits
        if zk == kq.ZK_NONE:
            c = f - 2**bits if f >= 2 ** (bits - 1) else f
            v = c * s
        elif zk in (kq.ZK_FP16, kq.ZK_BF16):
            v = f * s + Fraction(ref_bits_to_q(zero, FP16 if zk == kq.ZK_FP16 else BF16), 2**24)
        else:
            v = (f - zero) * s
        out.append(clamp(rhu(v), -128, 127))
    return out


@st.composite
def groups(draw):
    n = draw(st.integers(1, 40))
    kind = draw(st.sampled_from(["any", "equal", "extreme", "small"]))
    if kind == "equal":
        v = draw(st.integers(-128, 127))
        vals = np.full(n, v, np.int8)
    elif kind == "extreme":
        vals = draw(hnp.arrays(np.int8, n, elements=st.sampled_from([-128, 127, 0])))
    elif kind == "small":
        vals = draw(hnp.arrays(np.int8, n, elements=st.integers(-2, 2)))
    else:
        vals = draw(hnp.arrays(np.int8, n, elements=st.integers(-128, 127)))
    return vals


@SETTINGS
@given(groups(), st.sampled_from([2, 4, 8]), st.sampled_from(ZKS), st.sampled_from([FP16, BF16]))
def test_quant_dequant_group(vals, bits, zk, sk) -> None:
    codes = np.zeros(vals.size, np.uint8)
    sb, zero = kq.quant_group(vals, bits, zk, sk, codes)
    fields, rsb, rzero = ref_quant([int(v) for v in vals], bits, zk, sk)
    assert (int(sb), int(zero)) == (rsb, rzero)
    assert codes.tolist() == fields
    out = np.zeros(vals.size, np.int8)
    kq.dequant_group(codes, bits, zk, sk, sb, zero, out)
    assert out.tolist() == ref_dequant(fields, bits, zk, sk, rsb, rzero)


@SETTINGS
@given(st.sampled_from([2, 4, 8]), st.sampled_from(ZKS), st.sampled_from([FP16, BF16]),
       st.integers(0, 0xFFFF), st.integers(-128, 255), st.data())
def test_dequant_any_stored_bytes(bits, zk, sk, sb, zero, data) -> None:
    """Edited caches hold arbitrary scale/zero patterns (inf, NaN, subnormals)."""
    if zk in (kq.ZK_FP16, kq.ZK_BF16):
        zero = data.draw(st.integers(0, 0xFFFF))
    codes = data.draw(hnp.arrays(np.uint8, 9, elements=st.integers(0, 255)))
    out = np.zeros(9, np.int8)
    kq.dequant_group(codes, bits, zk, sk, sb, zero, out)
    assert out.tolist() == ref_dequant(codes.tolist(), bits, zk, sk, sb, zero)


def test_zero_range_groups() -> None:
    codes = np.zeros(5, np.uint8)
    out = np.zeros(5, np.int8)
    for zk in ZKS:
        for v in (-128, -3, 0, 7, 127):
            vals = np.full(5, v, np.int8)
            sb, zero = kq.quant_group(vals, 2, zk, FP16, codes)
            kq.dequant_group(codes, 2, zk, FP16, sb, zero, out)
            if zk in (kq.ZK_FP16, kq.ZK_BF16):
                assert sb == 0 and out.tolist() == [v] * 5  # exactly the shared value
            else:
                assert sb != 0 or v == 0


def test_symmetric_codes_never_use_the_most_negative_field() -> None:
    vals = np.array([-128, 127, -1, 1, 0], np.int8)
    codes = np.zeros(5, np.uint8)
    for bits in (2, 4, 8):
        kq.quant_group(vals, bits, kq.ZK_NONE, FP16, codes)
        assert (2 ** (bits - 1)) not in codes.tolist()


@SETTINGS
@given(st.integers(1, 5), st.integers(1, 30), st.integers(1, 9), st.data())
def test_quant_tokens_groups_split_rows(t, w, group, data) -> None:
    x = data.draw(hnp.arrays(np.int8, (t, w), elements=st.integers(-128, 127)))
    ng = -(-w // group)
    codes = np.zeros((t, w), np.uint8)
    scales = np.zeros((t, ng), np.uint16)
    zeros = np.zeros((t, ng), np.int32)
    kq.quant_tokens(x, 0, w, group, 4, kq.ZK_FP16, FP16, codes, scales, zeros, 0)
    for i in range(t):
        for g in range(ng):
            sl = slice(g * group, min(w, (g + 1) * group))
            fields, sb, z = ref_quant([int(v) for v in x[i, sl]], 4, kq.ZK_FP16, FP16)
            assert codes[i, sl].tolist() == fields
            assert (scales[i, g], zeros[i, g]) == (sb, z)
    out = np.zeros((t, w), np.int8)
    kq.dequant_tokens(codes, 0, w, group, 4, kq.ZK_FP16, FP16, scales, zeros, 0, out)
    for i in range(t):
        for g in range(ng):
            sl = slice(g * group, min(w, (g + 1) * group))
            assert out[i, sl].tolist() == ref_dequant(codes[i, sl].tolist(), 4, kq.ZK_FP16,
                                                      FP16, int(scales[i, g]), int(zeros[i, g]))


@SETTINGS
@given(st.integers(1, 3), st.integers(1, 9), st.integers(1, 7), st.sampled_from([2, 4, 8]),
       st.data())
def test_quant_channels(blocks, group, w, bits, data) -> None:
    x = data.draw(hnp.arrays(np.int8, (blocks * group, w), elements=st.integers(-128, 127)))
    codes = np.zeros(x.shape, np.uint8)
    scales = np.zeros((blocks, w), np.uint16)
    zeros = np.zeros((blocks, w), np.int32)
    kq.quant_channels(x, group, bits, kq.ZK_U8, BF16, codes, scales, zeros)
    out = np.zeros(x.shape, np.int8)
    kq.dequant_channels(codes, group, bits, kq.ZK_U8, BF16, scales, zeros, out)
    for b in range(blocks):
        for c in range(w):
            col = [int(v) for v in x[b * group:(b + 1) * group, c]]
            fields, sb, z = ref_quant(col, bits, kq.ZK_U8, BF16)
            assert codes[b * group:(b + 1) * group, c].tolist() == fields
            assert (scales[b, c], zeros[b, c]) == (sb, z)
            assert out[b * group:(b + 1) * group, c].tolist() == ref_dequant(
                fields, bits, kq.ZK_U8, BF16, sb, z)
