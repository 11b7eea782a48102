"""The array loop's rows: built once per instruction object, shared by the programs that
hold it, bounded, and the same timeline whatever the cache held before."""

from __future__ import annotations

import numpy as np
import pytest

from isa.instructions import (
    Attn,
    DmaCopy,
    DmaLoad,
    Engine,
    Gemm,
    HostWrite,
    Instruction,
    KvWrite,
    Nop,
    Program,
)
from kvsim.errors import DeviceError
from sim.device.device import Device
from sim.device.engine import array as array_engine
from sim.device.engine import loopdefs
from sim.device.engine import tables as program_tables
from sim.device.engine.rows import (
    ROW_FIELDS,
    X_SLEN,
    X_SOFF,
    X_WLEN,
    X_WOFF,
    RowCache,
    build_rows,
)
from sim.device.hw import load_hardware
from tests.sim.test_engines import TINY, TINY_PROTOCOL, _run, assert_same

LOAD = DmaLoad(core=0, src=0, dst=0, nbytes=3000, signal=(1,))
GEMM = Gemm(core=1, m=1, k=256, n=4, w_bits=8, a=0, w=0, out=4096, wait=(1,), signal=(2,))
COPY = DmaCopy(src=0, dst=20_000, nbytes=4_000, wait=(2,))
H2D = HostWrite(src=0, dst=10_000, nbytes=5_000)


def _tables(dev: Device, prog: Program) -> program_tables.Tables:
    return program_tables.build(prog, dev.program_rows, dev.kinds_of, len(dev.kind_names))


def test_a_program_holds_one_row_per_distinct_object_and_4_bytes_per_instruction():
    dev = Device(TINY, functional=False)
    prog = Program((LOAD, GEMM, COPY, H2D, LOAD, GEMM, COPY, LOAD, GEMM, COPY))
    tb = _tables(dev, prog)
    assert len(tb.table) == 4 and len(dev.program_rows) == 4
    assert tb.row_of.dtype == np.int32 and tb.q_items.dtype == np.int32
    # every occurrence of an object reads its one row
    for obj in (LOAD, GEMM, COPY, H2D):
        rows = {int(tb.row_of[k]) for k, i in enumerate(prog.instructions) if i is obj}
        assert len(rows) == 1
    # waits and signals per row: the Gemm waits on the load's flag, signals the copy's
    g = int(tb.row_of[1])
    assert tb.flags[tb.w_flag[tb.w_ptr[g]: tb.w_ptr[g + 1]]].tolist() == [1]
    assert tb.flags[tb.s_flag[tb.s_ptr[g]: tb.s_ptr[g + 1]]].tolist() == [2]
    # the queues: the load and the gemm on their cores, the copy and the link device-wide
    assert [len(q) for q in np.split(tb.q_items, tb.q_ptr[1:-1])] == [3, 3, 3, 1]


def test_rows_are_built_once_per_object_and_shared_by_later_programs():
    dev = Device(TINY, functional=False)
    _tables(dev, Program((LOAD, GEMM)))
    assert len(dev.program_rows) == 2
    # a new object equal in value to LOAD is another object: its own row
    twin = DmaLoad(core=0, src=0, dst=0, nbytes=3000, signal=(1,))
    assert twin == LOAD and twin is not LOAD
    tb = _tables(dev, Program((GEMM, LOAD, twin, COPY)))
    assert len(dev.program_rows) == 4 and len(tb.table) == 4
    np.testing.assert_array_equal(tb.table[tb.row_of[1]], tb.table[tb.row_of[2]])


def test_a_cached_row_equals_a_freshly_built_one():
    dev = Device(TINY, functional=False)
    objs: list[Instruction] = [LOAD, GEMM, COPY, H2D, Nop(on=Engine.COPY, signal=(3, 3))]
    _tables(dev, Program(tuple(objs[:2])))
    index, store = dev.program_rows.lookup(tuple(objs), ())
    fresh = build_rows(objs, dev.cores, dev.num_cores, ())
    got = store.rows[index]
    # the flags are held apart, at offsets that depend on the order of arrival
    flag_cols = (X_WOFF, X_WLEN, X_SOFF, X_SLEN)
    cols = [c for c in range(ROW_FIELDS) if c not in flag_cols]
    np.testing.assert_array_equal(got[:, cols], fresh[:, cols])
    for obj, row in zip(objs, got.tolist(), strict=True):
        assert store.flags[row[X_WOFF]: row[X_WOFF] + row[X_WLEN]].tolist() == list(obj.wait)
        assert store.flags[row[X_SOFF]: row[X_SOFF] + row[X_SLEN]].tolist() == list(
            obj.signal)
    assert got[:, loopdefs.I_DUR].tolist()[1] == dev.cores[1].duration_ps(GEMM)


def test_rows_are_kept_per_format_table():
    # the same KV write moves other bytes, in other time, under another format
    hw = load_hardware("aries")
    dev = Device(hw, functional=False)
    kv = KvWrite(core=0, fmt=0, tokens=4, width=128, pos=10, cap=512, src=0, dst=2 << 20,
                 nbytes=512 * 256)
    a = _tables(dev, Program((kv,), formats=("bf16",)))
    b = _tables(dev, Program((kv,), formats=("int8",)))
    assert len(dev.program_rows) == 2
    assert a.table[0, loopdefs.I_N1] != b.table[0, loopdefs.I_N1]


def test_an_unknown_instruction_leaves_the_cache_unchanged():
    class Odd(Instruction):
        pass

    dev = Device(TINY, functional=False)
    _tables(dev, Program((LOAD,)))
    with pytest.raises(DeviceError, match="no engine executes Odd"):
        _tables(dev, Program((GEMM, Odd())))
    assert len(dev.program_rows) == 1
    assert _tables(dev, Program((LOAD, GEMM))).table.shape == (2, loopdefs.I_FIELDS)


def test_a_full_cache_starts_afresh():
    cache = RowCache(Device(TINY, functional=False).cores, 2, max_rows=3)
    cache.lookup((LOAD, GEMM), ())
    assert len(cache) == 2
    index, store = cache.lookup((LOAD, COPY, H2D), ())  # 2 + 2 new > 3: afresh
    assert len(cache) == 3 and index.tolist() == [0, 1, 2] and store.objs[0] is LOAD
    # a program larger than the bound still gets its rows (the cache holds that program)
    index, _ = cache.lookup((H2D, GEMM, COPY, LOAD), ())
    assert len(cache) == 4 and sorted(index.tolist()) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="max_rows"):
        RowCache([], 1, max_rows=0)


def _tiny_cache(dev: Device) -> None:
    dev.program_rows = RowCache(dev.cores, dev.num_cores, max_rows=2)


def test_the_timeline_does_not_depend_on_what_the_cache_held():
    # programs sharing objects, one after the other, on a cache that keeps starting afresh
    attn = Attn(core=0, q_len=1, ctx=300, heads=7, kv_heads=1, head_dim=64, cap=512,
                k_fmt=0, v_fmt=0, q=0, k=0, v=1 << 20, out=4096, k_nbytes=300 * 64,
                v_nbytes=300 * 64, signal=(5,))
    progs = [Program((LOAD, GEMM, COPY, H2D)), Program((H2D, LOAD, GEMM, COPY, LOAD, GEMM,
                                                        COPY)),
             Program((attn, Nop(on=Engine.DMA_IN, wait=(5,))), formats=("int8",)),
             Program((LOAD, GEMM, COPY))]
    ref = assert_same(TINY, progs)
    assert _run("fast", TINY, progs, setup=_tiny_cache) == ref


def test_logs_handed_over_in_small_batches_give_the_same_trace(monkeypatch):
    # the loop pauses every few log rows and the replay resumes it: spans, byte bins,
    # stats and channel state as from one call (tiles: chunk spans too; protocol DRAM)
    progs = [Program((LOAD, GEMM, COPY, H2D, LOAD, GEMM, COPY)), Program((H2D, LOAD))]
    ref = assert_same(TINY_PROTOCOL, progs)
    calls = []
    run_program = array_engine.run_program

    def counted(*args):
        calls.append(args[1])
        return run_program(*args)

    monkeypatch.setattr(array_engine, "LOG_FLUSH_ROWS", 3)
    monkeypatch.setattr(array_engine, "run_program", counted)
    assert _run("fast", TINY_PROTOCOL, progs) == ref
    assert len(calls) > 10 and set(calls) == {3}


def test_a_build_that_fails_leaves_no_rows_behind():
    # the Gemm's and the copy's rows are written in the store's room before the bad load's
    # group fails; the next objects' rows, written there, equal freshly built ones
    dev = Device(TINY, functional=False)
    cache = dev.program_rows
    cache.lookup((LOAD,), ())
    bad = DmaLoad(core=0, src=1 << 64, dst=0, nbytes=64)
    with pytest.raises(DeviceError, match="not a 64-bit integer"):
        cache.lookup((GEMM, COPY, bad), ())
    with pytest.raises(DeviceError, match="not a 64-bit integer"):
        cache.lookup((GEMM, bad), ("int8",))  # a table not held before: none made
    assert len(cache) == 1
    objs = [H2D, Nop(on=Engine.COPY, signal=(3,)), H2D.replace(nbytes=7)]
    index, store = cache.lookup(tuple(objs), ())
    assert index.tolist() == [1, 3, 2] and len(cache) == 4  # by type: the writes, the Nop
    cols = [c for c in range(ROW_FIELDS) if c not in (X_WOFF, X_SOFF)]
    fresh = build_rows(objs, dev.cores, dev.num_cores, ())
    fresh[:, X_WLEN] = [len(i.wait) for i in objs]
    fresh[:, X_SLEN] = [len(i.signal) for i in objs]
    np.testing.assert_array_equal(store.rows[index][:, cols], fresh[:, cols])
    assert _tables(dev, Program(tuple(objs), formats=("int8",))).table.shape[0] == 3
