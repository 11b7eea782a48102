"""The batched checks of validation (isa.validate_batch) pass exactly what the
per-instruction checks pass: on random programs near every bound, validate_program gives
the same verdict, index and message with them as without them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import isa.validate as validate
import isa.validate_batch as batch
from isa.errors import ProgramError
from isa.instructions import (
    NO_ADDR,
    DmaLoad,
    DmaStore,
    Engine,
    Gemm,
    GemmRow,
    MemoryLayout,
    Nop,
    Program,
    Region,
    Space,
)
from tests.isa.test_validate import FORMATS, LAYOUT, WITH_REGIONS, KiB, MiB

#: SRAM regions that overlap (the batched region test looks only at the region of the
#: greatest base at or below an extent's start; the scalar one at every region), on core 0
#: only, so core 1's SRAM has none.
OVERLAPPING = MemoryLayout(
    dram_bytes=4 * MiB, sram_bytes=64 * KiB, host_bytes=1 * MiB, num_cores=2,
    regions=(Region("wide", Space.SRAM, 0, 48 * KiB, "scratch", core=0),
             Region("inner", Space.SRAM, 16 * KiB, 8 * KiB, "scratch", core=0),
             Region("tail", Space.SRAM, 40 * KiB, 24 * KiB, "scratch", core=0),
             Region("weights", Space.DRAM, 0, 2 * MiB, "weights")),
)
LAYOUTS = (LAYOUT, WITH_REGIONS, OVERLAPPING)
#: where extents may start or end in each space: its size and its regions' bounds
SRAM_BOUNDS = [0, 16 * KiB, 24 * KiB, 32 * KiB, 40 * KiB, 48 * KiB, 64 * KiB]
DRAM_BOUNDS = [0, 2 * MiB, 3 * MiB, 4 * MiB]
#: values no field may hold as an int of [0, 2**64) (the batched reads refuse them), and
#: those of them an address may hold (a float one would break the messages' ``:#x``)
ODD = [-1, 2**64, 2**70, 1.5, 8.0]
ODD_ADDR = [-1, 2**64, 2**70]


def rarely(common: st.SearchStrategy, odd: list) -> st.SearchStrategy:
    """Mostly ``common``, one time in 32 one of ``odd`` (the rare branch is not the
    simplest choice, which hypothesis draws more often)."""
    return st.integers(0, 31).flatmap(lambda i: st.sampled_from(odd) if i == 31 else common)


def small(points: list[int], big: int = 2**32 - 1) -> st.SearchStrategy:
    """A count or size: at and around ``points``, now and then anything up to ``big`` or
    past the int64 bounds of the batched checks."""
    around = st.sampled_from(points).flatmap(lambda p: st.integers(max(0, p - 2), p + 2))
    return rarely(st.integers(0, 7).flatmap(lambda i: st.integers(0, big) if i == 7
                                            else around), ODD)


def address(data, extent, bounds: list[int] = SRAM_BOUNDS) -> int:
    """An address whose extent of ``extent`` bytes starts or ends at or around one of
    ``bounds`` (or lies anywhere below the last), now and then no int of [0, 2**64)."""
    bound = data.draw(st.sampled_from(bounds))
    nbytes = extent if isinstance(extent, int) else 0
    where = data.draw(st.sampled_from(["end", "start", "end", "anywhere"] * 4 + ["odd"]))
    if where == "odd":
        return data.draw(st.sampled_from(ODD_ADDR + [2**64 - 2, 2**63]))
    if where == "anywhere":
        return data.draw(st.integers(0, bounds[-1]))
    at = bound if where == "start" else bound - nbytes
    return max(0, at + data.draw(st.sampled_from([0, 1, -1, 2, -2])))


def flags() -> st.SearchStrategy[tuple[int, ...]]:
    """A few flags of a few values (so that some are starved), now and then one past the
    dense range or not an int of int64."""
    flag = rarely(st.integers(0, 7).flatmap(
        lambda i: st.sampled_from([-3, 70_000]) if i == 7 else st.integers(0, 3)),
        [2**63, 2**64 + 1])
    return st.lists(flag, max_size=2).map(tuple)


def core() -> st.SearchStrategy:
    """A core of the layouts' two, or the third (out of range)."""
    return rarely(st.sampled_from([0, 1, 0, 1, 2]), ODD)


@st.composite
def dma(draw, cls: type):
    """A 2-D DMA whose extents start or end around the bounds."""
    nbytes = draw(small([0, 1, 64, 4 * KiB]))
    rows = draw(small([0, 1, 2, 3]))
    strides = [draw(small([0, 64, 4 * KiB])) for _ in range(2)]
    ext = [(rows - 1) * (s or nbytes) + nbytes if isinstance(rows, int) and rows
           and isinstance(nbytes, int) and isinstance(s, int) else 0 for s in strides]
    data = draw(st.data())
    src, dst = (SRAM_BOUNDS if space == Space.SRAM else DRAM_BOUNDS
                for space in batch.DMA_2D_SPACES[cls])
    return cls(core=draw(core()), wait=draw(flags()), signal=draw(flags()),
               src=address(data, ext[0], src), dst=address(data, ext[1], dst), nbytes=nbytes,
               rows=rows, src_stride=strides[0], dst_stride=strides[1])


@st.composite
def gemm(draw, cls: type = Gemm):
    """A Gemm whose operands start or end around the bounds, some of them absent."""
    m, n = draw(small([1, 2, 3])), draw(small([1, 64, 256]))
    k = draw(rarely(st.integers(0, 7).flatmap(  # mostly whole bytes of any width
        lambda i: st.integers(0, 200) if i == 7 else st.integers(0, 50).map(lambda j: 4 * j)),
        ODD))
    w_bits = draw(rarely(st.integers(0, 7).flatmap(
        lambda i: st.sampled_from([0, 1, 3, 16]) if i == 7 else st.sampled_from([2, 4, 8])),
        ODD))
    out_stride = draw(small([0, 64, 256]))
    data = draw(st.data())
    scale = NO_ADDR if draw(st.booleans()) else None
    ints = all(isinstance(v, int) for v in (m, k, n, w_bits, out_stride))
    row = n * (4 if scale == NO_ADDR else 1) if ints else 0
    ext = {"a": m * k, "w": (k * w_bits + 7) // 8 * n, "bias": 4 * n, "scale": 4 * n,
           "out": (m - 1) * (out_stride or row) + row if m else 0} if ints else {}
    addrs = {name: NO_ADDR if name in ("bias", "scale") and draw(st.booleans())
             else address(data, ext.get(name, 0))
             for name in ("a", "w", "out", "bias", "scale")}
    if draw(st.integers(0, 7)) == 7:  # an address next to "absent"
        addrs[draw(st.sampled_from(sorted(addrs)))] = NO_ADDR - 1
    if scale == NO_ADDR:
        addrs["scale"] = NO_ADDR
    return cls(core=draw(core()), wait=draw(flags()), signal=draw(flags()), m=m, k=k, n=n,
               w_bits=w_bits, shift=draw(st.integers(0, 31)), out_stride=out_stride,
               **addrs)


def others() -> st.SearchStrategy:
    """Instructions the batched checks leave to the scalar ones (a subclass, a Nop)."""
    return st.one_of(
        gemm(GemmRow),
        st.builds(Nop, on=st.sampled_from([int(e) for e in Engine]), core=st.integers(0, 2),
                  wait=flags(), signal=flags()))


def program() -> st.SearchStrategy[Program]:
    """A few distinct objects, each occurring one or more times, in any order."""
    pool = st.lists(st.one_of(dma(DmaLoad), dma(DmaStore), gemm(), gemm(), others()),
                    min_size=1, max_size=5)
    return pool.flatmap(lambda objs: st.lists(st.integers(0, len(objs) - 1), min_size=1,
                                              max_size=8).map(
        lambda at: Program(tuple(objs[i] for i in at), formats=FORMATS)))


def outcome(prog: Program, layout: MemoryLayout, batched: bool) -> tuple | None:
    """validate_program's verdict (None, or the index and message of its error), with or
    without the batched checks, nothing remembered from earlier calls. A field no int
    holds may make the scalar checks fail otherwise (a float address in a message's
    ``:#x``): that failure is the verdict then, the same with the batch, which leaves such
    instructions to them."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(validate, "_REMEMBERED", {})
        if not batched:
            mp.setattr(validate, "batched_ok", lambda objs, *a: np.zeros(len(objs), bool))
            mp.setattr(validate, "flags_balanced", lambda *a: False)
        try:
            validate.validate_program(prog, layout)
        except ProgramError as err:
            return err.index, err.reason
        except (TypeError, ValueError) as err:
            return type(err).__name__, str(err)
    return None


@pytest.mark.parametrize("kind", [DmaLoad, DmaStore, Gemm])
@settings(max_examples=250)  # about 3 s each: one instruction, six validations
@given(data=st.data())
def test_each_batched_check_passes_only_what_the_scalar_checks_pass(kind, data) -> None:
    """One DmaLoad, DmaStore or Gemm near every bound (sizes, regions, overlapping
    regions, core counts, weight widths, absent operands, fields no int64 holds): the
    same error (index and message) or none, with the batched checks and without."""
    instr = data.draw(gemm() if kind is Gemm else dma(kind)).replace(wait=())
    prog = Program((instr,), formats=FORMATS)
    for layout in LAYOUTS:
        assert outcome(prog, layout, True) == outcome(prog, layout, False), layout.regions


EDGE_GEMM = Gemm(m=2, k=64, n=64, w_bits=8, a=0, w=0x1000, out=0x2000, scale=0x3000)


@pytest.mark.parametrize("instr", [
    EDGE_GEMM,
    EDGE_GEMM.replace(out=40 * KiB, out_stride=32 * KiB),  # only the stride overflows it
    EDGE_GEMM.replace(out=40 * KiB, out_stride=24 * KiB - 64),  # ends at 64 KiB exactly
    EDGE_GEMM.replace(m=1, out=64 * KiB - 64, out_stride=2**40),  # one row: unused
    EDGE_GEMM.replace(bias=NO_ADDR - 1),  # next to "absent": an operand, overflowing
    EDGE_GEMM.replace(scale=NO_ADDR),  # int32 output: 4 bytes per element
    EDGE_GEMM.replace(scale=NO_ADDR, out=64 * KiB - 2 * 256),
    EDGE_GEMM.replace(scale=NO_ADDR, out=64 * KiB - 2 * 256 + 1),
    DmaLoad(src=0, dst=64 * KiB - 64, nbytes=32, rows=2),  # packed rows: stride 0
    DmaLoad(src=0, dst=64 * KiB - 64, nbytes=32, rows=2, dst_stride=33),
    DmaStore(src=0, dst=4 * MiB - 64, nbytes=32, rows=2, dst_stride=32),
    DmaStore(src=0, dst=4 * MiB - 64, nbytes=32, rows=2, dst_stride=33),
], ids=repr)
def test_the_batched_checks_agree_at_the_edges(instr) -> None:
    """Edges the random programs seldom reach: a stride that alone overflows, an extent
    that ends at the space's end, an address one below "absent"."""
    prog = Program((instr,), formats=FORMATS)
    for layout in LAYOUTS:
        assert outcome(prog, layout, True) == outcome(prog, layout, False), layout.regions


@given(prog=program())
def test_the_batched_checks_pass_only_what_the_scalar_checks_pass(prog: Program) -> None:
    """Programs of those instructions mixed with types the batch leaves alone, repeated
    objects and starved flags: the same first error (index and message) or none, with the
    batched checks and without."""
    for layout in LAYOUTS:
        assert outcome(prog, layout, True) == outcome(prog, layout, False), layout.regions


@given(uses=st.lists(st.integers(1, 4), min_size=1, max_size=6), data=st.data())
def test_the_flag_count_agrees_with_the_exact_count(uses: list[int], data) -> None:
    """flags_balanced says True only where no flag is waited on more times than it is
    signalled, each object counting as many times as it occurs."""
    objs = [Nop(on=int(Engine.VPU), wait=data.draw(flags()), signal=data.draw(flags()))
            for _ in uses]
    waits, signals = {}, {}
    for o, n in zip(objs, uses, strict=True):
        for f in o.wait:
            waits[f] = waits.get(f, 0) + n
        for f in o.signal:
            signals[f] = signals.get(f, 0) + n
    exact = all(n <= signals.get(f, 0) for f, n in waits.items())
    ints = all(isinstance(f, int) and -2**63 <= f < 2**63 for o in objs
               for f in o.wait + o.signal)
    held = np.array(objs, dtype=object)
    assert batch.flags_balanced(held, np.array(uses)) == (exact and ints)


def test_a_field_no_int64_holds_goes_to_the_scalar_checks() -> None:
    loads = np.array([DmaLoad(src=0, dst=0, nbytes=64), DmaLoad(src=0, dst=0, nbytes=1.5)],
                     dtype=object)
    assert batch.columns(loads, ("src", "nbytes")) is None
    sizes = {s: LAYOUT.space_bytes(s) for s in Space}
    assert batch.dma_2d_ok(DmaLoad, loads, LAYOUT, sizes).tolist() == [False, False]
    assert batch.dma_2d_ok(DmaLoad, loads[:1], LAYOUT, sizes).tolist() == [True]


def test_the_strides_of_one_row_transfers_are_not_read() -> None:
    """A one-row transfer's extent does not use its strides, so neither check reads them."""
    sizes = {s: LAYOUT.space_bytes(s) for s in Space}
    one = DmaLoad(src=0, dst=0, nbytes=64, rows=1, src_stride=-5, dst_stride=2.5)
    assert batch.dma_2d_ok(DmaLoad, np.array([one], dtype=object), LAYOUT, sizes).tolist() == [
        True]
    assert validate.validate_program(Program((one,)), LAYOUT) is None
    two = one.replace(rows=2)
    assert batch.dma_2d_ok(DmaLoad, np.array([two], dtype=object), LAYOUT, sizes).tolist() == [
        False]
