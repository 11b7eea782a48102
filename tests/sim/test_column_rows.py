"""Programs held as columns (:mod:`isa.columns`): their rows and tables, read without
instruction objects, equal the rows and tables of the same instructions as objects, on
every instruction type and on compiled prefill and decode programs; the GEMV generator's
columns hold the instructions it used to build as objects; a timing run makes no object;
bad columns are refused with the field named."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest

from isa.columns import ColumnProgram, ColumnsBuilder, columns_of
from isa.errors import IsaError
from isa.instructions import (
    DmaLoad,
    DmaStore,
    Engine,
    Gemm,
    HostRead,
    HostWrite,
    Nop,
    Program,
)
from isa.validate import validate_program
from models.bits import build_bit_config
from models.demo import gemv_layer
from sim.device.device import Device
from sim.device.engine import tables as program_tables
from sim.device.engine.row_fill import ColumnRows
from sim.device.engine.rows import ROW_FIELDS, X_SLEN, X_SOFF, X_WLEN, X_WOFF, build_rows
from sim.device.hw import load_hardware
from tests.sim.test_rows_vectorised import FORMATS, _compiled, _every_type
from traces.recorder import Recorder

ARIES = load_hardware("aries")
#: waits and signals: ``build_rows`` leaves them to its store; compared as flag lists
_HEAD_COLS = [X_WOFF, X_WLEN, X_SOFF, X_SLEN]


def _heads(rows: np.ndarray, flags: np.ndarray) -> list[tuple[list[int], list[int]]]:
    return [(flags[r[X_WOFF]: r[X_WOFF] + r[X_WLEN]].tolist(),
             flags[r[X_SOFF]: r[X_SOFF] + r[X_SLEN]].tolist()) for r in rows]


def _assert_column_rows_equal(prog: Program) -> None:
    dev = Device(ARIES, functional=False)
    instrs = list(prog.instructions)
    cols = columns_of(instrs)
    made = ColumnRows(cols, dev.cores, dev.num_cores, prog.formats)
    got = made.rows[made.row_of]  # per instruction
    want = build_rows(instrs, dev.cores, dev.num_cores, prog.formats)
    assert got.shape == want.shape == (len(instrs), ROW_FIELDS)
    keep = [c for c in range(ROW_FIELDS) if c not in _HEAD_COLS]
    for k in np.flatnonzero((got[:, keep] != want[:, keep]).any(axis=1))[:1].tolist():
        raise AssertionError(f"row of {instrs[k]}: {got[k].tolist()} != {want[k].tolist()}")
    assert _heads(got, made.flags) == [(list(i.wait), list(i.signal)) for i in instrs]


def _per_instruction(tb: program_tables.Tables) -> dict:
    """What a program's tables say about each instruction, whatever their row numbering."""
    r = tb.row_of
    waits = [tb.flags[tb.w_flag[tb.w_ptr[x]: tb.w_ptr[x + 1]]].tolist() for x in r.tolist()]
    sigs = [tb.flags[tb.s_flag[tb.s_ptr[x]: tb.s_ptr[x + 1]]].tolist() for x in r.tolist()]
    streams = np.unique(np.stack([tb.stream_base, tb.stream_bytes]), axis=1)
    return {"table": tb.table[r].tolist(), "waits": waits, "signals": sigs,
            "q_ptr": tb.q_ptr.tolist(), "q_items": tb.q_items.tolist(), "queues": tb.queues,
            "pairs": tb.pairs, "streams": streams.tolist(), "flags": tb.flags.tolist()}


def _tables(prog: Program) -> dict:
    dev = Device(ARIES, functional=False)
    return _per_instruction(program_tables.build(prog, dev.program_rows, dev.kinds_of,
                                                 len(dev.kind_names)))


def test_column_rows_of_every_instruction_type_equal_the_object_rows():
    objs = _every_type()
    for order in (objs, objs[::-1], objs + objs[:7]):  # other groupings; repeated objects
        prog = Program(tuple(order), formats=FORMATS)
        _assert_column_rows_equal(prog)
        assert _tables(ColumnProgram(columns_of(order), formats=FORMATS)) == _tables(prog)


def test_column_rows_of_compiled_programs_equal_the_object_rows():
    for prog in _compiled("kivi-4", build_bit_config({}), False):
        _assert_column_rows_equal(prog)
        col = ColumnProgram(columns_of(prog.instructions), formats=prog.formats,
                            name=prog.name)
        assert _tables(col) == _tables(prog)
        assert col == prog and not isinstance(prog, ColumnProgram)


def _gemv_objects(*, k, n, w_bits, num_cores, tile_rows, x_dram, y_dram, s_dram, w_dram,
                  x_s, s_s, y_s, buf, x_host, y_host, shift, row_bytes):
    """The GEMV's instructions as ``gemv_layer`` made them as objects, one at a time."""
    rows_per_core = n // num_cores
    ins = [HostWrite(src=x_host, dst=x_dram, nbytes=k, signal=(1,) * num_cores)]
    done = []
    for c in range(num_cores):
        f, row0 = 10 + 10 * c, c * rows_per_core
        ins += [Nop(core=c, on=Engine.DMA_IN, wait=(1,)),
                DmaLoad(core=c, src=x_dram, dst=x_s, nbytes=k),
                DmaLoad(core=c, src=s_dram + 4 * row0, dst=s_s, nbytes=4 * rows_per_core,
                        signal=(f,))]
        ntiles = -(-rows_per_core // tile_rows)
        for t in range(ntiles):
            rows, b = min(tile_rows, rows_per_core - t * tile_rows), t % 2
            ins.append(DmaLoad(core=c, src=w_dram + (row0 + t * tile_rows) * row_bytes,
                               dst=buf[b], nbytes=rows * row_bytes,
                               wait=(f + 3 + b,) if t >= 2 else (), signal=(f + 1 + b,)))
            last = (f + 6,) if t == ntiles - 1 else ()
            ins.append(Gemm(core=c, m=1, k=k, n=rows, w_bits=w_bits, a=x_s, w=buf[b],
                            out=y_s + t * tile_rows, scale=s_s + 4 * t * tile_rows,
                            shift=shift, wait=((f,) if t == 0 else ()) + (f + 1 + b,),
                            signal=((f + 3 + b,) if t + 2 < ntiles else ()) + last))
        ins.append(DmaStore(core=c, src=y_s, dst=y_dram + row0, nbytes=rows_per_core,
                            wait=(f + 6,), signal=(f + 5,)))
        done.append(f + 5)
    ins.append(HostRead(src=y_dram, dst=y_host, nbytes=n, wait=tuple(done)))
    return tuple(ins)


@pytest.mark.parametrize(("k", "n", "cores", "tile_bytes"), [
    (512, 256, 2, None), (1024, 64, 1, 4096), (1024, 64, 4, 3072), (2048, 512, 8, 8192)])
def test_gemv_columns_hold_the_object_instructions(k, n, cores, tile_bytes):
    layer = gemv_layer(k=k, n=n, w_bits=8, num_cores=cores, sram_bytes=1 << 20,
                       dram_bytes=1 << 30, host_bytes=1 << 30, tile_bytes=tile_bytes)
    prog = layer.program
    assert isinstance(prog, ColumnProgram) and not prog.materialised
    cols = prog.columns
    # the layout gemv_layer plans: x at 0, y, scales and weights after it
    y_dram = -(-k // 64) * 64
    s_dram = -(-(y_dram + n) // 64) * 64
    rpc = n // cores
    s_s = -(-k // 64) * 64
    y_s = -(-(s_s + 4 * rpc) // 64) * 64
    b0 = -(-(y_s + rpc) // 64) * 64
    want = _gemv_objects(k=k, n=n, w_bits=8, num_cores=cores, tile_rows=layer.tile_rows,
                         x_dram=0, y_dram=y_dram, s_dram=s_dram, w_dram=layer.w_dram, x_s=0,
                         s_s=s_s, y_s=y_s, buf=[b0, b0 + -(-layer.tile_rows * k // 64) * 64],
                         x_host=layer.x_host, y_host=layer.y_host, shift=layer.shift,
                         row_bytes=k)
    assert len(cols) == len(prog) == len(want)
    got = prog.instructions
    assert [type(i) for i in got] == [type(i) for i in want]
    assert got == want and prog == Program(want, name=prog.name)
    # made as __init__ makes them: the same fields, in the same order, of the same types
    assert [list(vars(i).items()) for i in got] == [list(vars(i).items()) for i in want]
    assert [[type(v) for v in vars(i).values()] for i in got] == [
        [type(v) for v in vars(i).values()] for i in want]
    validate_program(prog, layer.layout)
    # a copy with changes (``dataclasses.replace`` passes the instructions) and a pickle
    renamed = dataclasses.replace(prog, name="renamed")
    assert isinstance(renamed, ColumnProgram) and renamed.name == "renamed"
    assert renamed.instructions == want and len(renamed.columns) == len(want)
    assert pickle.loads(pickle.dumps(prog)) == prog


def test_a_timing_run_of_columns_makes_no_object_and_keeps_the_timeline():
    layer = gemv_layer(k=1024, n=512, w_bits=8, num_cores=ARIES.cores.num_cores,
                       sram_bytes=ARIES.sram.bytes_per_core, dram_bytes=1 << 30,
                       host_bytes=1 << 30, tile_bytes=4096)
    objs = Program(layer.program.columns.instructions(), name=layer.program.name)
    runs = []
    for prog, trace in ((layer.program, "off"), (objs, "off"), (layer.program, "ops"),
                        (objs, "ops")):
        rec = Recorder(trace)
        dev = Device(ARIES, functional=False, layout=layer.layout, recorder=rec)
        runs.append((dev.run(prog, validate=False), rec.spans if trace == "ops" else None))
        if prog is layer.program and trace == "off":
            assert not prog.materialised  # tables from columns, no span names asked
    assert runs[0] == runs[1]
    assert runs[2] == runs[3] and runs[2][1]  # the spans named from the made objects
    assert runs[0][0] == runs[2][0]
    assert layer.program.materialised


def test_bad_columns_are_refused_with_the_field_named():
    cb = ColumnsBuilder()
    with pytest.raises(IsaError, match=r"DmaLoad\.nbytes: a value is outside \[0, 4294967296\)"):
        cb.add(DmaLoad, 2, src=0, dst=0, nbytes=np.array([64, 1 << 32]))
    with pytest.raises(IsaError, match=r"DmaLoad\.src: required field not given"):
        cb.add(DmaLoad, 1, dst=0, nbytes=64)
    with pytest.raises(IsaError, match=r"DmaLoad: no field bogus"):
        cb.add(DmaLoad, 1, src=0, dst=0, nbytes=64, bogus=1)
    with pytest.raises(IsaError, match=r"DmaLoad\.dst: expected an int or 3 integers"):
        cb.add(DmaLoad, 3, src=0, dst=np.zeros(2, np.int64), nbytes=64)
    with pytest.raises(IsaError, match=r"DmaLoad\.wait: a flag is negative"):
        cb.add(DmaLoad, 1, src=0, dst=0, nbytes=64, wait=(-2,))
    cb.add(DmaLoad, 1, src=0, dst=0, nbytes=64)
    assert len(cb.build()) == 1  # nothing of the refused blocks was kept
    cb = ColumnsBuilder()
    cb.add(DmaLoad, 2, at=[0, 0], src=0, dst=0, nbytes=64)
    with pytest.raises(IsaError, match=r"positions do not number 0 \.\. 1 once each"):
        cb.build()
    with pytest.raises(IsaError, match=r"Gemm\.core: a value is not a 64-bit integer"):
        columns_of([Gemm(core=1 << 64, m=1, k=1, n=1, w_bits=8, a=0, w=0, out=0)])
