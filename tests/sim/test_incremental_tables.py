"""Decode steps' tables built incrementally from the last step's
(:func:`sim.device.engine.tables.build`) equal full builds, array for array, on a sequence of
compiled decode programs; a program whose structure differs (another length, other waits
or signals, another core or formats at some position) falls back to the full build, and a
device running the steps keeps the timeline of fresh devices."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from isa.instructions import Engine, Nop, Program
from models.bits import build_bit_config
from models.compiler import HardwareTarget, compile_model
from models.source import load_preset
from sim.device.device import Device
from sim.device.engine import tables as program_tables
from sim.device.engine.rows import RowCache
from sim.device.hw import load_hardware
from tests.sim.test_column_rows import _per_instruction

ARIES = load_hardware("aries")


@pytest.fixture(scope="module")
def tiny():
    return compile_model(load_preset("tiny"), build_bit_config({}),
                         HardwareTarget.from_hw(ARIES), kv="kivi-4", core_mode="global4",
                         max_seq=16, cap=64, functional=False)


def _assert_same(a: program_tables.Tables, b: program_tables.Tables) -> None:
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype, f.name
            np.testing.assert_array_equal(x, y, err_msg=f.name)
        else:
            assert x == y, f.name


def _build(dev: Device, prog: Program, **kw) -> program_tables.Tables:
    return program_tables.build(prog, dev.program_rows, dev.kinds_of, len(dev.kind_names),
                                **kw)


def _changed(prog: Program, at: int, **changes) -> Program:
    instrs = list(prog.instructions)
    instrs[at] = instrs[at].replace(**changes)
    return Program(tuple(instrs), formats=prog.formats, name=prog.name)


def test_incremental_decode_tables_equal_full_builds(tiny):
    # (a 4-token call of this model has the decode step's structure: incremental too)
    steps = [*(tiny.program(tokens=1, cache_size=16 + i) for i in range(6)),
             tiny.program(tokens=4, cache_size=22)]
    assert len({len(p) for p in steps}) == 1
    dev = Device(ARIES, functional=False)
    cache = dev.program_rows
    for k, prog in enumerate(steps):
        inc = _build(dev, prog)
        assert cache.incremental_builds == k  # every step after the first
        full = _build(dev, prog, incremental=False)  # the same cache: the same row numbers
        _assert_same(inc, full)
        assert _per_instruction(inc) == _per_instruction(_build(Device(ARIES, functional=False),
                                                                prog))
    # the steps share most objects: only the changed positions were looked up
    ids = [np.fromiter(map(id, p.instructions), np.int64) for p in steps[:2]]
    assert 0 < int((ids[0] != ids[1]).sum()) < len(steps[0]) // 4


def test_a_changed_structure_falls_back_to_the_full_build(tiny):
    prog = tiny.program(tokens=1, cache_size=20)
    nxt = tiny.program(tokens=1, cache_size=21)
    first_wait = next(i for i, x in enumerate(nxt.instructions) if x.wait)
    on_core = next(i for i, x in enumerate(nxt.instructions)
                   if type(x).__name__ == "Gemm" and x.core == 0)
    waits = nxt.instructions[first_wait].wait
    other_flag = next(f for i in nxt.instructions for f in i.signal if f not in waits)
    fallbacks = [
        Program((*nxt.instructions, Nop(on=Engine.VPU)), formats=nxt.formats,
                name="one more"),  # another length
        _changed(nxt, first_wait, wait=nxt.instructions[first_wait].wait + (99_999,)),
        # another flag of the program: the same flags in all, but not at this position
        _changed(nxt, first_wait, wait=(other_flag, *waits[1:])),
        _changed(nxt, 0, signal=nxt.instructions[0].signal + (99_998,)),
        _changed(nxt, on_core, core=1),  # another queue
        Program(nxt.instructions, formats=(*nxt.formats, "int8"), name=nxt.name),
    ]
    for other in fallbacks:
        dev = Device(ARIES, functional=False)
        _build(dev, prog)
        got = _build(dev, other)
        assert dev.program_rows.incremental_builds == 0, other.name
        _assert_same(got, _build(dev, other, incremental=False))
        assert _per_instruction(got) == _per_instruction(
            _build(Device(ARIES, functional=False), other))
    # a program of another length between steps leaves the steps incremental (each is
    # built from the last one of its length and formats); after a changed structure the
    # next step is built in full (against the changed program), the one after it not
    dev = Device(ARIES, functional=False)
    for p in (prog, fallbacks[0], nxt, fallbacks[2], tiny.program(tokens=1, cache_size=22),
              tiny.program(tokens=1, cache_size=23)):
        _build(dev, p)
    assert dev.program_rows.incremental_builds == 2  # nxt (from prog), the last step


def test_the_programs_kept_for_incremental_builds_are_bounded(tiny, monkeypatch):
    prog = tiny.program(tokens=1, cache_size=20)
    dev = Device(ARIES, functional=False)
    for extra in range(program_tables.RECENT_PROGRAMS + 2):
        pad = tuple(Nop(on=Engine.VPU) for _ in range(extra))
        _build(dev, Program(prog.instructions + pad, formats=prog.formats))
    assert len(dev.program_rows.recent) == program_tables.RECENT_PROGRAMS
    assert min(n for n, _ in dev.program_rows.recent) == len(prog) + 2  # the oldest went
    dev.program_rows.clear()
    assert not dev.program_rows.recent
    # and so are the instructions they hold: a program past the bound is not kept
    monkeypatch.setattr(program_tables, "RECENT_INSTRUCTIONS", 2 * len(prog) + 3)
    for extra in (0, 1, 2, len(prog) + 4):
        pad = tuple(Nop(on=Engine.VPU) for _ in range(extra))
        _build(dev, Program(prog.instructions + pad, formats=prog.formats))
    assert [n for n, _ in dev.program_rows.recent] == [len(prog) + 1, len(prog) + 2]


def test_a_device_running_decode_steps_keeps_the_timeline_of_fresh_devices(tiny):
    steps = [tiny.program(tokens=1, cache_size=30 + i) for i in range(4)]
    dev = Device(ARIES, functional=False)
    got = [dev.run(p, validate=False) for p in steps]
    assert dev.program_rows.incremental_builds == len(steps) - 1
    ref = Device(ARIES, functional=False)
    want = []
    for p in steps:
        ref.program_rows.clear()  # every program's tables built in full
        want.append(ref.run(p, validate=False))
    assert ref.program_rows.incremental_builds == 0
    assert got == want


def test_a_full_row_cache_starts_afresh_and_builds_in_full(tiny):
    steps = [tiny.program(tokens=1, cache_size=40 + i) for i in range(5)]
    distinct = len({id(i) for i in steps[0].instructions})
    dev = Device(ARIES, functional=False)
    # room for the first step's rows and one step's new ones, not two
    new = len({id(i) for i in steps[1].instructions} - {id(i) for i in steps[0].instructions})
    dev.program_rows = RowCache(dev.cores, dev.num_cores, max_rows=distinct + new)
    cache = dev.program_rows
    made = []
    for prog in steps:
        made.append((cache.generation, cache.incremental_builds))
        assert _per_instruction(_build(dev, prog)) == _per_instruction(
            _build(Device(ARIES, functional=False), prog))
    made.append((cache.generation, cache.incremental_builds))
    # (before each step) step 1 incremental; step 2's new rows filled the cache: afresh
    # twice (by the lookup, then to build in full on an empty cache); step 3 incremental;
    # step 4 as step 2
    assert made == [(0, 0), (0, 0), (0, 1), (2, 1), (2, 2), (4, 2)]


def _full_aside(dev: Device, prog: Program) -> program_tables.Tables:
    """The full build of ``prog`` with ``dev``'s cache (whose store holds its objects
    already), leaving the programs kept for incremental builds as they were."""
    kept = dict(dev.program_rows.recent)
    full = _build(dev, prog, incremental=False)
    dev.program_rows.recent.clear()
    dev.program_rows.recent.update(kept)
    return full


@pytest.mark.parametrize("keyed", [False, True])
def test_patched_tables_equal_full_builds_going_back_and_forth(tiny, keyed, monkeypatch):
    # each step's tables are patched from the last's (rows of the last step dropped, new
    # ones added; a step going back takes rows the store holds but the last step did not);
    # ``keyed``: under one memory map, whose kept rows keep their stats pairs
    sizes = [16, 17, 18, 17, 16, 19, 19, 18]
    made = {n: tiny.program(tokens=1, cache_size=n) for n in sorted(set(sizes))}
    steps = [made[n] for n in sizes]  # (a step going back is the same program again)
    dev = Device(ARIES, functional=False)
    key = {"kinds_key": dev.layout} if keyed else {}
    prefixes = _prefix_builds(monkeypatch)
    tables, held = [], []
    for k, prog in enumerate(steps):
        got = _build(dev, prog, **key)
        assert dev.program_rows.incremental_builds == k
        _assert_same(got, _full_aside(dev, prog))
        assert _per_instruction(got) == _per_instruction(_build(Device(ARIES, functional=False),
                                                                prog))
        tables.append(got)
        held.append(len(dev.program_rows))
    # the steps changed rows; going back (18 -> 17 -> 16, 19 -> 18) and repeating (19)
    # made none
    assert all(not np.array_equal(a.table, b.table) or n == m for a, b, n, m in zip(
        tables, tables[1:], sizes, sizes[1:], strict=False))
    assert held[0] < held[1] < held[2] == held[3] == held[4] < held[5] == held[6] == held[7]
    # the steps forward kept the first rows; going back kept others (moved by runs)
    assert 0 < prefixes[0] < len(steps) - 1
    # two objects of one structure (type, core, waits, signals) swapped: each changed
    # position takes a row the last program held at the other
    last = steps[-1].instructions
    seen: dict = {}
    for j, x in enumerate(last):
        i = seen.setdefault((type(x), x.core, x.wait, x.signal), j)
        if last[i] != x:
            break
    swapped = list(last)
    swapped[i], swapped[j] = last[j], last[i]
    prog = Program(tuple(swapped), formats=steps[-1].formats)
    got = _build(dev, prog, **key)
    assert dev.program_rows.incremental_builds == len(steps) and len(dev.program_rows) == held[-1]
    _assert_same(got, _full_aside(dev, prog))


@pytest.mark.parametrize("spread", [False, True])
def test_rows_moved_by_runs_equal_an_indexed_move(spread):
    # three runs (moved by slices), or more runs than MOVE_RUNS (moved by an index)
    n = 4 * program_tables.MOVE_RUNS
    src = np.random.default_rng(3).integers(-50, 50, (n, 5))
    take = np.arange(0, n, 2) if spread else np.r_[0:10, 30:90, 100:101]
    at = np.arange(len(take)) + (np.arange(len(take)) >= 5) * 7
    got = np.zeros((len(take) + 7, 5), np.int64)
    want = got.copy()
    program_tables.move_rows(got, at, src, take)
    want[at] = src[take]
    np.testing.assert_array_equal(got, want)


def _scans(monkeypatch) -> list[int]:
    """Counts the positions the identity scan of a patched build compares."""
    import operator
    import types

    seen = [0]

    def is_(a, b) -> bool:
        seen[0] += 1
        return operator.is_(a, b)

    monkeypatch.setattr(program_tables, "operator", types.SimpleNamespace(is_=is_))
    return seen


def test_a_replayed_step_names_its_changed_positions_and_skips_the_scan(tiny, monkeypatch):
    # successive decode steps: each made from the last by the compiler's call replay
    steps = [tiny.program(tokens=1, cache_size=24 + i) for i in range(5)]
    assert all(p.patched_from.base is q.instructions for q, p in zip(steps, steps[1:],
                                                                      strict=False))
    seen = _scans(monkeypatch)
    prefixes = _prefix_builds(monkeypatch)
    dev = Device(ARIES, functional=False)
    for k, prog in enumerate(steps):
        got = _build(dev, prog, kinds_key=dev.layout)
        assert dev.program_rows.incremental_builds == k
        _assert_same(got, _full_aside(dev, prog))
    assert seen[0] == 0  # every patched build took the positions the program names
    # and, from the second on, kept the first rows of the last one's tables
    # (sim.device.engine.table_patch): the first drops rows of a program built in full,
    # which lie among
    # the others; later ones drop the rows the last step added, which came last
    assert prefixes[0] == len(steps) - 2


def _prefix_builds(monkeypatch) -> list[int]:
    """Counts the patched builds whose kept rows were the first ones."""
    made = program_tables.prefix_tables
    seen = [0]

    def counted(*args):
        seen[0] += 1
        return made(*args)

    monkeypatch.setattr(program_tables, "prefix_tables", counted)
    return seen


def test_missing_or_stale_hints_fall_back_to_the_scan(tiny, monkeypatch):
    a, b, c = (tiny.program(tokens=1, cache_size=50 + i) for i in range(3))
    seen = _scans(monkeypatch)
    dev = Device(ARIES, functional=False)
    _build(dev, a)
    # a hint against another program than the last one built (c was made from b's
    # instructions, a was built): the scan finds the changed positions
    assert c.patched_from.base is b.instructions
    _assert_same(_build(dev, c), _full_aside(dev, c))
    assert seen[0] == len(c)
    # no hint (``dataclasses.replace`` drops it): scanned too
    plain = dataclasses.replace(b, name="no hint")
    assert plain.patched_from is None
    _assert_same(_build(dev, plain), _full_aside(dev, plain))
    assert seen[0] == 2 * len(c) and dev.program_rows.incremental_builds == 2


def test_the_stats_pairs_follow_a_new_memory_map(tiny):
    steps = [tiny.program(tokens=1, cache_size=60 + i) for i in range(3)]
    dev = Device(ARIES, functional=False)
    layout = tiny.layout(host_bytes=ARIES.host.memory_bytes)
    dev.set_layout(layout)
    _build(dev, steps[0], kinds_key=dev.layout)
    # the same regions under other traffic kinds: another layout object
    dev.set_layout(dataclasses.replace(layout, regions=tuple(
        dataclasses.replace(r, kind="scratch") if r.kind == "weights" else r
        for r in layout.regions)))
    for prog in steps[1:]:
        got = _build(dev, prog, kinds_key=dev.layout)
        full = _full_aside(dev, prog)
        _assert_same(got, full)
    assert dev.program_rows.incremental_builds == 2
    # (the pairs did change: the weight loads now count as another kind)
    before = Device(ARIES, functional=False)
    before.set_layout(layout)
    assert not np.array_equal(_build(before, steps[-1]).table, got.table)
