"""The vectorised rows (:func:`sim.device.engine.rows.build_rows`) equal the rows of the builder
they replaced (:mod:`tests.sim.rows_reference`), on every instruction type and on compiled
prefill and decode programs under several KV formats; a program's tables equal the tables
gathered from the reference rows."""

from __future__ import annotations

import numpy as np
import pytest

from isa.instructions import (
    NO_ADDR,
    Attn,
    AttnDq,
    DmaCopy,
    DmaLoad,
    DmaLoadIndexed,
    DmaStore,
    Engine,
    Gemm,
    GemmGroup,
    GemmRow,
    GemmRowGroup,
    HostRead,
    HostWrite,
    Instruction,
    KvRead,
    KvWrite,
    Nop,
    Program,
    Vec,
    VecFunc,
    f32_bits,
)
from kvsim.errors import DeviceError
from models.bits import NUMERICS_PRESETS, W4V8, W8, BitConfig, build_bit_config
from models.compiler import HardwareTarget, compile_model
from models.source import load_preset
from sim.device.device import Device
from sim.device.engine import rows as program_rows
from sim.device.engine import tables as program_tables
from sim.device.engine.rows import RowCache, build_rows, unique_rows
from sim.device.hw import load_hardware
from tests.sim.rows_reference import reference_rows

ARIES = load_hardware("aries")
FORMATS = ("int8", "kivi-4.k", "bf16", "kivi-2.v")


def _every_type() -> list[Instruction]:
    """Instructions of every type, several sharing a shape and some not."""
    kv = {"tokens": 1, "width": 64, "cap": 320, "nbytes": 320 * 64}
    attn = {"q_len": 1, "heads": 7, "kv_heads": 1, "head_dim": 64, "cap": 320, "q": 0,
            "k": 1 << 20, "v": 2 << 20, "out": 4096, "k_nbytes": 320 * 64,
            "v_nbytes": 320 * 64}
    scales = {n: f32_bits(0.5) for n in AttnDq.FLOAT_FIELDS}
    gemm = {"m": 1, "k": 512, "n": 16, "w_bits": 8, "a": 0, "w": 8192, "out": 4096,
            "scale": 256}
    return [
        HostWrite(src=0, dst=0, nbytes=4096, signal=(1, 1)),
        Nop(core=2, on=Engine.DMA_IN, wait=(1,)),
        Nop(core=3, on=Engine.COPY, wait=(1,), signal=(9,)),
        DmaLoad(core=0, src=4096, dst=0, nbytes=512, signal=(2,)),
        DmaLoad(core=1, src=4096, dst=0, nbytes=512, rows=3, src_stride=1024, signal=(2,)),
        DmaLoadIndexed(core=2, src=1 << 20, dst=0, nbytes=256, index=64, stride=4096,
                       count=4),
        DmaStore(core=3, src=0, dst=1 << 16, nbytes=300, rows=2, dst_stride=512, wait=(2,)),
        DmaCopy(core=0, src=0, dst=1 << 21, nbytes=9000, wait=(9,)),
        HostRead(src=1 << 16, dst=0, nbytes=700),
        Gemm(core=0, **gemm, wait=(2,)),
        Gemm(core=1, **gemm),
        Gemm(core=0, **{**gemm, "n": 32}, bias=NO_ADDR),
        Gemm(core=0, **{**gemm, "w_bits": 4}),
        GemmRow(core=0, **gemm, row_meta=512, out_bits=32),
        GemmRow(core=0, **gemm),
        GemmGroup(core=1, **{**gemm, "w_bits": 4}, group=32),
        GemmGroup(core=1, **{**gemm, "w_bits": 4}, group=64),
        GemmRowGroup(core=2, **{**gemm, "w_bits": 4}, group=32, row_meta=512),
        Vec(core=0, func=VecFunc.RMSNORM, rows=1, cols=576, src0=0, dst=1024, p0=-3),
        Vec(core=1, func=VecFunc.ADD_WIDE, rows=2, cols=576, src0=0, src1=2048, dst=4096,
            p1=-5, p2=7),
        Vec(core=1, func=VecFunc.QUANT_ROW, rows=4, cols=64, src0=0, dst=4096),
        KvWrite(core=0, fmt=0, pos=17, src=0, dst=3 << 20, **kv),
        KvWrite(core=1, fmt=1, pos=17, src=0, dst=4 << 20, **kv),
        KvWrite(core=1, fmt=1, pos=31, src=0, dst=4 << 20, **kv),  # leaves the window
        KvWrite(core=2, fmt=3, pos=32, src=0, dst=5 << 20, **{**kv, "tokens": 16}),
        KvRead(core=0, fmt=1, pos=0, src=4 << 20, dst=0, **{**kv, "tokens": 40}),
        KvRead(core=3, fmt=2, pos=8, src=6 << 20, dst=0, **kv),
        Attn(core=0, ctx=40, pos=39, k_fmt=0, v_fmt=1, **attn),
        Attn(core=1, ctx=40, pos=39, k_fmt=2, v_fmt=2, **attn, signal=(4,)),
        AttnDq(core=2, ctx=40, pos=39, k_fmt=1, v_fmt=3, **attn, **scales, wait=(4,)),
    ]


def _compiled(kv: str, bits: BitConfig, functional: bool) -> list[Program]:
    cm = compile_model(load_preset("tiny"), bits, HardwareTarget.from_hw(ARIES), kv=kv,
                       core_mode="global4", max_seq=16, cap=64, functional=functional)
    return [cm.program(tokens=16, cache_size=0), cm.program(tokens=1, cache_size=16),
            cm.program(tokens=1, cache_size=40)]


def _distinct(prog: Program) -> list[Instruction]:
    return list({id(i): i for i in prog.instructions}.values())


def _assert_rows_equal(prog: Program) -> None:
    dev = Device(ARIES, functional=False)
    objs = _distinct(prog)
    got = build_rows(objs, dev.cores, dev.num_cores, prog.formats)
    want = reference_rows(objs, dev.cores, dev.num_cores, prog.formats)
    assert got.shape == want.shape == (len(objs), program_rows.ROW_FIELDS)
    for k in np.flatnonzero((got != want).any(axis=1))[:1].tolist():
        raise AssertionError(f"row of {objs[k]}: {got[k].tolist()} != {want[k].tolist()}")


def test_rows_of_every_instruction_type_equal_the_reference():
    objs = _every_type()
    assert {type(i) for i in objs} >= set(program_rows.FAMILIES) | {
        DmaLoadIndexed, GemmRow, GemmGroup, GemmRowGroup, AttnDq}
    _assert_rows_equal(Program(tuple(objs), formats=FORMATS))
    _assert_rows_equal(Program(tuple(objs[::-1]), formats=FORMATS))  # other grouping order


@pytest.mark.parametrize(("kv", "bits", "functional"), [
    ("int8", build_bit_config({}), False),
    ("kivi-4", build_bit_config({}), True),
    ("kivi-2", BitConfig(weights=W8, numerics=NUMERICS_PRESETS["w8"]), False),
    ("bf16", BitConfig(weights=W4V8, numerics=NUMERICS_PRESETS["w4g32"]), False),
    ("int8", BitConfig(weights=W8, numerics=NUMERICS_PRESETS["w8"], kv_read="dequant"), False),
])
def test_rows_of_compiled_prefill_and_decode_equal_the_reference(kv, bits, functional):
    for prog in _compiled(kv, bits, functional):
        _assert_rows_equal(prog)


class _ReferenceBuilt(program_rows.Built):
    """:class:`sim.device.engine.rows.Built` with the reference's rows."""

    made = 0  # objects whose rows it made

    def __init__(self, objs, cores, num_cores, formats, out=None) -> None:
        super().__init__(objs, cores, num_cores, formats, out)
        self.rows[:] = reference_rows(objs, cores, num_cores, formats)[self.order]
        _ReferenceBuilt.made += len(objs)


def test_tables_equal_the_tables_of_the_reference_rows(monkeypatch):
    progs = [Program(tuple(_every_type()), formats=FORMATS),
             *_compiled("kivi-4", build_bit_config({}), False)]
    dev = Device(ARIES, functional=False)

    def tables(d: Device) -> list[program_tables.Tables]:
        return [program_tables.build(p, d.program_rows, d.kinds_of, len(d.kind_names))
                for p in progs]

    got = tables(dev)
    ref = Device(ARIES, functional=False)
    monkeypatch.setattr(program_rows, "Built", _ReferenceBuilt)
    monkeypatch.setattr(_ReferenceBuilt, "made", 0)
    want = tables(ref)
    assert _ReferenceBuilt.made == len(ref.program_rows) > 0  # the reference made every row
    for a, b in zip(got, want, strict=True):
        for name, x in vars(a).items():
            y = getattr(b, name)
            if isinstance(x, np.ndarray):
                assert x.dtype == y.dtype, name
                np.testing.assert_array_equal(x, y, err_msg=name)
            else:
                assert x == y, name


def test_distinct_waits_and_signals_are_held_once():
    a = DmaLoad(core=0, src=0, dst=0, nbytes=64, wait=(3, 4), signal=(5,))
    b = DmaLoad(core=0, src=64, dst=64, nbytes=64, wait=(3, 4), signal=(5,))
    c = Gemm(core=0, m=1, k=64, n=1, w_bits=8, a=0, w=0, out=128, wait=(5,))
    index, store = RowCache(Device(ARIES, functional=False).cores, 8).lookup((a, b, c, a), ())
    assert index.tolist() == [0, 1, 2, 0]
    assert store.flags.tolist() == [3, 4, 5, 5]  # (3, 4) / (5,) once; c's wait (5,)
    for obj, row in zip((a, b, c), store.rows.tolist(), strict=True):
        w0, wn = row[program_rows.X_WOFF], row[program_rows.X_WLEN]
        s0, sn = row[program_rows.X_SOFF], row[program_rows.X_SLEN]
        assert store.flags[w0: w0 + wn].tolist() == list(obj.wait)
        assert store.flags[s0: s0 + sn].tolist() == list(obj.signal)


def test_attention_with_other_kv_heads_takes_its_own_time():
    # the dequantizing attention's time depends on kv_heads (its dequant pass)
    dev = Device(ARIES, functional=False)
    base = _every_type()[-1]
    objs = [base, base.replace(kv_heads=7)]
    rows = build_rows(objs, dev.cores, dev.num_cores, FORMATS)
    assert rows[:, 1].tolist() == [dev.cores[2].duration_ps(i, FORMATS) for i in objs]
    assert rows[0, 1] != rows[1, 1]


def test_unique_rows_matches_numpy():
    rng = np.random.default_rng(7)
    a = rng.integers(-3, 3, (500, 4))
    first, inverse = unique_rows(a)
    u, f, inv = np.unique(a, axis=0, return_index=True, return_inverse=True)
    np.testing.assert_array_equal(a[first], u)
    np.testing.assert_array_equal(first, f)
    np.testing.assert_array_equal(inverse, inv.reshape(-1))
    assert [len(x) for x in unique_rows(np.zeros((0, 3), np.int64))] == [0, 0]


def test_a_field_beyond_64_bits_is_named():
    bad = DmaLoad(core=0, src=1 << 64, dst=0, nbytes=64)
    with pytest.raises(DeviceError, match=r"DmaLoad: a field of core, src, dst, nbytes, rows"):
        build_rows([bad], Device(ARIES, functional=False).cores, 8, ())
