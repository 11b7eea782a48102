"""Slow references and hypothesis strategies for the KV-format tests: records, sizes and
whole DRAM regions written from the layout descriptions of :mod:`isa.kv.format` and
:mod:`isa.kv.region`, not from their code."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from isa import kvformats as kf
from isa.kernels import kvquant as kq
from isa.kernels.fpbits import BF16, FP16
from tests.isa.test_kernels_fixed import ref_nearest_bits
from tests.isa.test_kernels_kvquant import ref_quant
from tests.isa.test_kernels_pack import ref_pack

FP_KIND = {"fp16": FP16, "bf16": BF16}
ZK = {"none": kq.ZK_NONE, "fp16": kq.ZK_FP16, "bf16": kq.ZK_BF16, "uint8": kq.ZK_U8,
      "int8": kq.ZK_I8}


@st.composite
def formats(draw) -> kf.KVFormat:
    bits = draw(st.sampled_from([16, 8, 4, 2]))
    axis = draw(st.sampled_from(["token", "channel", "none"] if bits == 8 else
                                ["token", "channel"]))
    sym = draw(st.booleans())
    kw = dict(bits=bits, axis=axis, group=draw(st.integers(1, 9)), symmetric=sym,
              scale_dtype=draw(st.sampled_from(["fp16", "bf16"])),
              zero_dtype=draw(st.sampled_from(["fp16", "bf16", "uint8", "int8"])),
              fp_dtype=draw(st.sampled_from(["fp16", "bf16"])),
              pad=draw(st.sampled_from([1, 1, 4, 16])))
    paged = axis != "channel" and draw(st.booleans()) and draw(st.booleans())
    if paged:
        kw["page"] = draw(st.integers(1, 8))
    else:
        kw["window"] = draw(st.integers(0, 7))
        kw["sink"] = draw(st.integers(0, 3))
    if axis == "token" and bits != 16 and draw(st.booleans()):
        kw["rope_width"] = draw(st.integers(1, 5))
        kw["rope_bits"] = draw(st.sampled_from([8, 4, 2]))
    return kf.KVFormat(**kw)


@st.composite
def format_and_values(draw):
    f = draw(formats())
    w = draw(st.integers(f.rope_width + 1, f.rope_width + 13))
    t = draw(st.integers(0, 30))
    style = draw(st.sampled_from(["any", "extreme", "constant_rows"]))
    if style == "extreme":
        x = draw(hnp.arrays(np.int8, (t, w), elements=st.sampled_from([-128, 127, 0, -1])))
    elif style == "constant_rows":
        col = draw(hnp.arrays(np.int8, (t, 1), elements=st.integers(-128, 127)))
        x = np.repeat(col, w, axis=1)
    else:
        x = draw(hnp.arrays(np.int8, (t, w), elements=st.integers(-128, 127)))
    return f, x


def ref_quant_end(f: kf.KVFormat, t: int) -> int:
    """First tail token of a ``t``-token cache (``t`` for 16-bit formats: no tail)."""
    if f.bits == 16:
        return t
    s = min(f.sink, t)
    if f.axis == "channel":
        n = max(0, t - f.window - s)
        return s + n - n % f.group
    return max(s, t - f.window)


def align(n: int, pad: int) -> int:
    return -(-n // pad) * pad


def ref_fp_bits(v: int, dtype: str) -> int:
    b = ref_nearest_bits(Fraction(abs(v)), FP_KIND[dtype])
    return b | (0x8000 if v < 0 else 0)


def le(v: int, n: int) -> list[int]:
    return [(v >> (8 * i)) & 0xFF for i in range(n)]


def ref_fp_record(f: kf.KVFormat, row: list[int]) -> list[int]:
    out = []
    for v in row:
        out += le(ref_fp_bits(v, f.fp_dtype), 2)
    return out + [0] * (align(len(out), f.pad) - len(out))


def ref_token_record(f: kf.KVFormat, row: list[int]) -> list[int]:
    if f.bits == 16:
        return ref_fp_record(f, row)
    if f.axis == "none":
        out = [v % 256 for v in row]
        return out + [0] * (align(len(out), f.pad) - len(out))
    sk, zk = FP_KIND[f.scale_dtype], ZK[f.zero_dtype]
    wc = len(row) - f.rope_width
    parts = [(row[:wc], f.bits), (row[wc:], f.rope_bits)] if f.rope_width else [(row, f.bits)]
    codes, scales, zeros = [], [], []
    for vals, bits in parts:
        fields = []
        for g in range(0, len(vals), f.group):
            fl, sb, z = ref_quant(vals[g:g + f.group], bits, zk, sk)
            fields += fl
            scales.append(sb)
            zeros.append(z)
        codes += ref_pack(fields, bits)
    out = codes
    for s in scales:
        out += le(s, f.scale_bytes)
    for z in zeros:
        out += le(z % 2 ** (8 * f.zero_bytes), f.zero_bytes)
    return out + [0] * (align(len(out), f.pad) - len(out))


def ref_block(f: kf.KVFormat, rows: list[list[int]]) -> list[int]:
    sk, zk = FP_KIND[f.scale_dtype], ZK[f.zero_dtype]
    out, scales, zeros = [], [], []
    for c in range(len(rows[0])):
        fl, sb, z = ref_quant([r[c] for r in rows], f.bits, zk, sk)
        out += ref_pack(fl, f.bits)
        scales.append(sb)
        zeros.append(z)
    for s in scales:
        out += le(s, f.scale_bytes)
    for z in zeros:
        out += le(z % 2 ** (8 * f.zero_bytes), f.zero_bytes)
    return out + [0] * (align(len(out), f.pad) - len(out))


def ref_sizes(f: kf.KVFormat, w: int) -> tuple[int, int, int]:
    """(header, full-precision record, quantized record or block) bytes, by the docs."""
    header = align(4, f.pad) if f.bits != 16 and (f.window or f.axis == "channel") else 0
    fpb = align(2 * w, f.pad)
    if f.bits == 16:
        return header, fpb, fpb
    meta = f.scale_bytes + f.zero_bytes
    if f.axis == "channel":
        return header, fpb, align(w * (-(-f.group * f.bits // 8)) + w * meta, f.pad)
    if f.axis == "none":
        return header, fpb, align(w, f.pad)
    wc = w - f.rope_width
    codes = -(-wc * f.bits // 8) + -(-f.rope_width * f.rope_bits // 8)
    groups = -(-wc // f.group) + -(-f.rope_width // f.group)
    return header, fpb, align(codes + groups * meta, f.pad)


def ref_cache_bytes(f: kf.KVFormat, t: int, w: int) -> int:
    """Records a ``t``-token cache holds (header excluded), plus the last page's padding."""
    _, fpb, unit = ref_sizes(f, w)
    s, qe = (0 if f.bits == 16 else min(f.sink, t)), ref_quant_end(f, t)
    quant = (qe - s) // f.group * unit if f.axis == "channel" else (qe - s) * unit
    pad = (f.page - t % f.page) % f.page * unit if f.page else 0
    return s * fpb + quant + (t - qe) * fpb + pad


def ref_region(f: kf.KVFormat, x: np.ndarray, cap: int) -> list[int]:
    """The bytes of a region of ``cap`` tokens holding ``x`` written at once, placed as the
    region layout describes: header, sink slots, quantized slots, ring of tail slots."""
    rows = [[int(v) for v in r] for r in x]
    t, w = x.shape
    header, fpb, unit = ref_sizes(f, w)
    s_cap = 0 if f.bits == 16 else min(f.sink, cap)
    if f.axis == "channel" and f.bits != 16:
        slots = max(0, cap - s_cap - f.window) // f.group
        ring = min(f.window + f.group - 1, cap - s_cap)
    else:
        slots = -(-cap // f.page) * f.page if f.page else max(0, cap - s_cap - f.window)
        ring = min(f.window, cap - s_cap)
    q_off = header + s_cap * fpb
    r_off = q_off + slots * unit
    out = [0] * (r_off + ring * fpb)

    def put(off: int, data: list[int]) -> None:
        out[off:off + len(data)] = data

    if header:
        put(0, le(t, 4))
    s, qe = (0 if f.bits == 16 else min(f.sink, t)), ref_quant_end(f, t)
    for i in range(s):
        put(header + i * fpb, ref_fp_record(f, rows[i]))
    if f.axis == "channel" and f.bits != 16:
        for g in range(s, qe, f.group):
            put(q_off + (g - s) // f.group * unit, ref_block(f, rows[g:g + f.group]))
    else:
        for i in range(s, qe):
            put(q_off + (i - s) * unit, ref_token_record(f, rows[i]))
    for i in range(qe, t):
        put(r_off + (i - s) % ring * fpb, ref_fp_record(f, rows[i]))
    return out
