"""The checks of :mod:`isa.validate` for many instructions at once, in numpy arrays.

A compiled program's new objects are mostly of three types: its weight-tile loads
(:class:`DmaLoad`), its matrix products (:class:`Gemm`) and its stores (:class:`DmaStore`).
:func:`batched_ok` checks all of them together and says, per instruction, whether the
per-instruction checks of :mod:`isa.validate` (``_instruction_ok``) would find nothing.
Its answers are sufficient, never necessary: an instruction it does not pass (another
type, a field that is not an int in ``[0, 2**64)``, an operand too large for exact int64
arithmetic, an extent whose region is not the one with the greatest base at or below its
start) goes to the per-instruction checks, which decide and name the problem. So a
program's verdict and message are those of the per-instruction checks alone.

:func:`flags_balanced` counts the waits and signals of a program's flags at once; when it
cannot show that no flag is waited on more often than it is signalled, the exact count of
:mod:`isa.validate` decides and names the flag.

The cost is reading the fields of Python objects (one attribute read per field per
object); a field the checks do not need (a stride of a one-row transfer, the output
stride of a one-row product) is not read.
"""

from __future__ import annotations

from array import array
from collections import defaultdict, deque
from collections.abc import Sequence
from functools import cache
from operator import attrgetter

import numpy as np

from isa.encoding import field_enum
from isa.instructions import (
    NO_ADDR,
    PER_CORE_ENGINES,
    DmaLoad,
    DmaStore,
    Gemm,
    Instruction,
    MemoryLayout,
    Space,
)

#: The Gemm weight widths the matrix unit unpacks (bits per weight); ``isa.validate``
#: checks the same tuple.
GEMM_W_BITS = (2, 4, 8)

#: Size operands (counts, strides, byte sizes) below this bound keep every extent of
#: :func:`dma_2d_ok` and :func:`gemm_ok` exact in int64 (a product of two such operands,
#: or of one and ``4 * n``, stays under ``2**62``); larger ones go to the scalar checks.
SIZE_BOUND = 1 << 29
#: Addresses below this bound keep ``addr + extent`` exact in int64.
ADDR_BOUND = 1 << 61
#: Flags in ``[0, DENSE_FLAGS)`` are counted by index; others through ``np.unique``.
DENSE_FLAGS = 1 << 16
#: Layouts whose region tables are kept (an assumption: a run uses one or two).
MAX_REGION_TABLES = 8

#: The 2-D DMA types: the address space of ``src`` and of ``dst`` (an SRAM extent is the
#: instruction's core's, a DRAM extent core 0's).
DMA_2D_SPACES: dict[type[Instruction], tuple[Space, Space]] = {
    DmaLoad: (Space.DRAM, Space.SRAM),
    DmaStore: (Space.SRAM, Space.DRAM),
}


@cache
def _plain(cls: type[Instruction]) -> bool:
    """Whether ``cls`` has none of the checks the batched ones leave out: no enum field, no
    format index, an engine fixed by the type and per core."""
    fields = cls.body_fields()
    return (cls.engine is Instruction.engine and cls.engine_kind in PER_CORE_ENGINES
            and all(field_enum(f) is None for f in fields)
            and not any(f.name == "fmt" or f.name.endswith("_fmt") for f in fields))


def columns(objs: np.ndarray, names: tuple[str, ...],
            at: np.ndarray | None = None) -> np.ndarray | None:
    """The fields ``names`` of ``objs`` (an object array) as a ``(len(names), len(objs))``
    uint64 array, read only for the objects at ``at`` if given (0 elsewhere); or None when
    one of them is not an int in ``[0, 2**64)`` (``array`` refuses floats, negative and
    oversized values, where numpy would truncate a float). One field at a time: a getter
    of one name costs less per value than one of several."""
    out = np.zeros((len(names), len(objs)), np.uint64)
    some = objs if at is None else objs[at]
    try:
        for row, name in zip(out, names, strict=True):
            values = np.frombuffer(array("Q", list(map(attrgetter(name), some))), np.uint64)
            if at is None:
                row[:] = values
            else:
                row[at] = values
    except (OverflowError, TypeError):
        return None
    return out


_REGION_TABLES: dict[int, tuple[MemoryLayout, dict]] = {}


def _region_table(layout: MemoryLayout, space: Space,
                  core: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The bases and ends (int64) of the regions of ``space`` (of ``core``, for SRAM), by
    base; None when it has none. Kept per layout (held, so its id stays its own)."""
    entry = _REGION_TABLES.get(id(layout))
    if entry is None or entry[0] is not layout:
        if len(_REGION_TABLES) >= MAX_REGION_TABLES:
            _REGION_TABLES.clear()
        entry = _REGION_TABLES[id(layout)] = (layout, {})
    tables = entry[1]
    key = (space, core)
    if key not in tables:
        mine = sorted((r for r in layout.regions
                       if r.space == space and (space != Space.SRAM or r.core == core)),
                      key=attrgetter("base"))
        tables[key] = (np.array([r.base for r in mine], np.int64),
                       np.array([r.end for r in mine], np.int64)) if mine else None
    return tables[key]


def in_a_region(layout: MemoryLayout, space: Space, cores: np.ndarray, addr: np.ndarray,
                nbytes: np.ndarray) -> np.ndarray:
    """Whether the region of ``space`` (of each extent's core, for SRAM) with the greatest
    base at or below each extent's start holds the whole extent (int64 arrays)."""
    inside = np.zeros(len(addr), bool)
    for c in (np.unique(cores).tolist() if space == Space.SRAM else [0]):
        table = _region_table(layout, space, c)
        sel = np.flatnonzero(cores == c) if space == Space.SRAM else slice(None)
        if table is None:
            continue
        bases, ends = table
        i = np.searchsorted(bases, addr[sel], side="right") - 1
        inside[sel] = (i >= 0) & (addr[sel] + nbytes[sel] <= ends[np.maximum(i, 0)])
    return inside


def _extent_ok(layout: MemoryLayout, sizes: dict[Space, int], space: Space,
               cores: np.ndarray, addr: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    """Whether each extent (``addr`` uint64, ``nbytes`` exact int64) is non-empty, inside
    its space and, where the space has regions, inside one (as ``_instruction_ok``)."""
    safe = addr < ADDR_BOUND
    start = np.where(safe, addr, 0).astype(np.int64)
    ok = safe & (nbytes > 0) & (start + nbytes <= sizes[space])
    if layout.has_regions(space):
        ok &= in_a_region(layout, space, cores, start, nbytes)
    return ok


def _small(cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Whether every one of ``cols`` (uint64 rows) is below :data:`SIZE_BOUND`, and the
    rows as int64 (0 where they are not)."""
    small = (cols < SIZE_BOUND).all(axis=0)
    return small, np.where(small, cols, 0).astype(np.int64)


def dma_2d_ok(cls: type[Instruction], objs: np.ndarray, layout: MemoryLayout,
              sizes: dict[Space, int]) -> np.ndarray:
    """Per instruction of the 2-D DMA type ``cls`` (a key of :data:`DMA_2D_SPACES`; an
    object array), True when the per-instruction checks would pass it: its core exists
    and both its extents (``rows`` blocks of ``nbytes``, a stride apart: the stride, or
    ``nbytes`` for 0) are non-empty, inside their spaces and (with regions) inside one
    region. The strides are read only where ``rows > 1`` (elsewhere no extent uses them)."""
    cols = columns(objs, ("core", "src", "dst", "nbytes", "rows"))
    if cols is None:
        return np.zeros(len(objs), bool)
    core, src, dst = cols[0], cols[1], cols[2]
    strides = columns(objs, ("src_stride", "dst_stride"), np.flatnonzero(cols[4] > 1))
    if strides is None:
        return np.zeros(len(objs), bool)
    small, (nbytes, rows, s_stride, d_stride) = _small(np.concatenate([cols[3:], strides]))
    ok = small & (core < layout.num_cores)
    cores = np.where(ok, core, 0).astype(np.int64)
    src_space, dst_space = DMA_2D_SPACES[cls]
    for space, addr, stride in ((src_space, src, s_stride), (dst_space, dst, d_stride)):
        mine = cores if space == Space.SRAM else np.zeros_like(cores)
        step = np.where(stride > 0, stride, nbytes)
        ok &= _extent_ok(layout, sizes, space, mine, addr,
                         np.where(rows > 0, (rows - 1) * step + nbytes, 0))
    return ok


def gemm_ok(objs: np.ndarray, layout: MemoryLayout, sizes: dict[Space, int]) -> np.ndarray:
    """Per :class:`Gemm` (the type itself; an object array), True when the per-instruction
    checks would pass it: its core exists, ``w_bits`` is one the matrix unit unpacks and
    ``k`` fills whole bytes of it, and each operand it has (an address other than
    :data:`NO_ADDR`) is a non-empty extent of its core's SRAM (inside one region where SRAM
    has regions): ``a`` of ``m*k`` bytes, ``w`` of ``ceil(k*w_bits/8)*n``, ``bias`` and
    ``scale`` of ``4*n``, ``out`` of ``(m-1)*step + row`` (``row`` = ``n`` elements of 1
    byte with a scale, 4 without; ``step`` = ``out_stride`` or ``row``). ``out_stride`` is
    read only where ``m > 1`` (elsewhere the output extent does not use it)."""
    cols = columns(objs, ("core", "m", "k", "n", "w_bits", "a", "w", "out", "bias", "scale"))
    if cols is None:
        return np.zeros(len(objs), bool)
    core, a, w, out, bias, scale = cols[0], cols[5], cols[6], cols[7], cols[8], cols[9]
    strides = columns(objs, ("out_stride",), np.flatnonzero(cols[1] > 1))
    if strides is None:
        return np.zeros(len(objs), bool)
    small, (m, k, n, w_bits, out_stride) = _small(np.concatenate([cols[1:5], strides]))
    ok = small & (core < layout.num_cores)
    per_byte = np.zeros_like(w_bits)
    for bits in GEMM_W_BITS:
        per_byte[w_bits == bits] = 8 // bits
    ok &= per_byte > 0
    ok &= k % np.maximum(per_byte, 1) == 0
    cores = np.where(ok, core, 0).astype(np.int64)
    row = n * np.where(scale == NO_ADDR, 4, 1)
    step = np.where(out_stride > 0, out_stride, row)
    operands = ((a, m * k), (w, (k * w_bits + 7) // 8 * n), (bias, 4 * n), (scale, 4 * n),
                (out, np.where(m > 0, (m - 1) * step + row, 0)))
    for addr, nbytes in operands:
        ok &= (addr == NO_ADDR) | _extent_ok(layout, sizes, Space.SRAM, cores, addr, nbytes)
    return ok


#: The batched check of each type it covers (the type itself, not its subclasses).
_CHECKS = {
    DmaLoad: lambda objs, layout, sizes: dma_2d_ok(DmaLoad, objs, layout, sizes),
    DmaStore: lambda objs, layout, sizes: dma_2d_ok(DmaStore, objs, layout, sizes),
    Gemm: gemm_ok,
}
#: The code of each type with a batched check (1, 2, ...; 0 for every other type), as
#: ``_CHECKS`` orders them.
_CODES: defaultdict[type, int] = defaultdict(int, {t: i + 1 for i, t in enumerate(_CHECKS)})


def batched_ok(objs: np.ndarray, layout: MemoryLayout, sizes: dict[Space, int]) -> np.ndarray:
    """Per instruction of ``objs`` (an object array), True when the per-instruction checks
    of :mod:`isa.validate` would pass it, shown for the types of :data:`_CHECKS` at once;
    False sends it (and every other type) to those checks."""
    ok = np.zeros(len(objs), bool)
    if not len(objs):
        return ok
    codes = np.frombuffer(array("B", list(map(_CODES.__getitem__, map(type, objs)))),
                          np.uint8)
    for code, (cls, check) in enumerate(_CHECKS.items(), start=1):
        at = np.flatnonzero(codes == code)
        if len(at) and _plain(cls):  # a type given an enum or a format field: not here
            ok[at] = check(objs[at], layout, sizes)
    return ok


def _flat(lists: Sequence[tuple[int, ...]]) -> np.ndarray:
    """The flags of ``lists`` one after another, as int64 (OverflowError, TypeError: a flag
    that is not an int of int64)."""
    flat: list[int] = []
    deque(map(flat.extend, lists), maxlen=0)
    return np.frombuffer(array("q", flat), np.int64)


def flags_balanced(objs: np.ndarray, uses: np.ndarray) -> bool:
    """True when no flag is waited on more times than it is signalled, each of ``objs``
    (an object array) counting ``uses`` times; False when some flag is, or when a flag is
    not an int of int64 (the exact count then decides). The weighted sums are of integers
    below ``2**53``, exact in the float64 of ``np.bincount``."""
    again = np.flatnonzero(uses > 1)  # the objects that occur more than once
    extra = (uses[again] - 1).astype(np.float64)
    keys, weights = [], []
    try:
        for head in ("wait", "signal"):
            lists = list(map(attrgetter(head), objs))
            more = [lists[i] for i in again.tolist()]
            keys += [_flat(lists), _flat(more)]
            weights.append(np.repeat(extra, np.fromiter(map(len, more), np.int64,
                                                         len(more))))
    except (OverflowError, TypeError):
        return False
    if not len(keys[0]):
        return True  # nothing waits
    both = np.concatenate(keys)
    if both.min() >= 0 and both.max() < DENSE_FLAGS:
        size = int(both.max()) + 1
    else:  # number the flags densely
        values, index = np.unique(both, return_inverse=True)
        size = len(values)
        keys = np.split(index.reshape(-1), np.cumsum([len(k) for k in keys])[:-1])
    waits, signals = (np.bincount(keys[2 * h], minlength=size)
                      + np.bincount(keys[2 * h + 1], weights[h], minlength=size)
                      for h in (0, 1))
    return bool((waits <= signals).all())
