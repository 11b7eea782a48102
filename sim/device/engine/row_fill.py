"""The rows of distinct instruction objects, as the array loop reads them (the columns
``X_*`` past the loop's own ``loopdefs.I_*``; what a row holds is described in
:mod:`sim.device.engine.rows`, which caches them).

Rows are built per concrete instruction type: one pass reads each instruction's fields
(packed to bytes) and its waits and signals, and numpy fills the type's columns;
durations come from the compute cores (``ComputeCore.duration_ps``) once per distinct
shape, KV bytes from the formats' layouts once per distinct positions.
"""

from __future__ import annotations

import dataclasses
import functools
import struct

import numpy as np

from isa import kvformats
from isa.columns import ProgramColumns
from isa.identity import object_ids
from isa.instructions import (
    NO_ADDR,
    PER_CORE_ENGINES,
    Attn,
    DmaCopy,
    DmaLoad,
    DmaStore,
    Gemm,
    HostRead,
    HostWrite,
    Instruction,
    KvRead,
    KvWrite,
    Nop,
    Vec,
)
from kvsim.errors import DeviceError
from sim.device.engine import loopdefs as pl

#: Links of the stats additions, by id: each adds its bytes to the stats under each of its
#: names in turn (a host memcpy over shared DRAM is counted on the host link and as the
#: DRAM read and write it makes: one addition, three names).
LINKS = (("dram_read",), ("dram_write",), ("pcie_h2d",), ("pcie_d2h",),
         ("host_copy_h2d", "dram_write", "dram_read"), ("host_copy_d2h", "dram_read",
                                                       "dram_write"))
_READ, _WRITE, _H2D, _D2H, _COPY_H2D, _COPY_D2H = range(6)
#: Engines numbered up to this one have one queue per core.
LAST_PER_CORE = max(int(e) for e in PER_CORE_ENGINES)
if {int(e) for e in PER_CORE_ENGINES} != set(range(LAST_PER_CORE + 1)):
    raise ImportError("per-core engines must be numbered first")
#: The instruction families, each with its own kind of row (a subclass takes its base's).
FAMILIES = (DmaLoad, DmaStore, DmaCopy, HostWrite, HostRead, Attn, KvWrite, KvRead, Gemm, Vec,
            Nop)
#: Every concrete instruction type seen, numbered, with the family (a type of ``FAMILIES``)
#: it belongs to: a subclass (``GemmRow``, ``AttnDq``, ...) runs on its base's engine but
#: may take its own time and ops, so rows are built per concrete type.
_TYPE_IDS: dict[type, int] = {}
_TYPE_LIST: list[type] = []
_FAMILY: list[type] = []
#: the ids of the types numbered (sorted) and the number of each (the types are held in
#: ``_TYPE_LIST``, so their ids stay theirs)
_TYPE_BY_ID = [np.zeros(0, np.int64), np.zeros(0, np.int64)]
#: The ``int64`` that a field of :data:`NO_ADDR` reads as in the extracted columns.
NO_ADDR_I64 = int(np.array(NO_ADDR, np.uint64).view(np.int64))

# --- the row's columns past the loop's own (``loopdefs.I_FIELDS``) -------------------------
X_ENG = pl.I_FIELDS  # engine kind
X_QCORE = X_ENG + 1  # the queue's core (0 on a device-wide engine)
X_LINK1 = X_ENG + 2  # the stats additions' links and DRAM addresses (bytes: I_BYTES1/2)
X_ADDR1 = X_ENG + 3
X_LINK2 = X_ENG + 4
X_ADDR2 = X_ENG + 5
X_NSTREAM = X_ENG + 6  # DRAM transfers planned in the efficiency model: count, (base, bytes)
X_SB1 = X_ENG + 7
X_SN1 = X_ENG + 8
X_SB2 = X_ENG + 9
X_SN2 = X_ENG + 10
X_WOFF = X_ENG + 11  # the waits and signals: offset into the store's flat flags, count
X_WLEN = X_ENG + 12
X_SOFF = X_ENG + 13
X_SLEN = X_ENG + 14
ROW_FIELDS = X_ENG + 15



def _register(t: type) -> None:
    """Numbers instruction type ``t`` under its nearest base of ``FAMILIES``."""
    family = next((b for b in t.__mro__ if b in FAMILIES), None)
    if family is None:
        raise DeviceError(f"no engine executes {t.__name__}")
    _TYPE_IDS[t] = len(_TYPE_LIST)
    _TYPE_LIST.append(t)
    _FAMILY.append(family)
    ids = np.fromiter(map(id, _TYPE_LIST), np.int64, len(_TYPE_LIST))
    order = np.argsort(ids)
    _TYPE_BY_ID[:] = ids[order], order


@functools.cache
def _reader(t: type, names: tuple[str, ...]):
    """``read(group, number, size)``: for each instruction of type ``t`` in ``group``, its
    fields ``names`` packed as 8-byte integers (signed where the field's declared struct
    code is, ``fmt`` in :mod:`isa.instr_base`, else unsigned: a u64 above ``2**63``, such
    as :data:`NO_ADDR`, reads back as a negative ``int64``), then the number of its
    ``(wait, signal)`` pair: ``number(pair, size())`` (a dict's ``setdefault`` and
    ``__len__``: the pairs numbered densely as they first occur). One list comprehension
    of plain attribute loads, which the interpreter specialises per type: the pair is
    numbered in the same pass (each object is read once) and its tuple freed at once, so
    that a build holds no object per instruction but its packed bytes (no garbage
    collection falls due within it). ``names`` are this module's own field names."""
    fmt = {f.name: f.metadata.get("fmt", "Q") for f in dataclasses.fields(t)}
    if not set(names) <= fmt.keys() or not all(n.isidentifier() for n in names):
        raise KeyError(f"{t.__name__} has no field among {names}")
    pack = struct.Struct("<" + "".join("q" if fmt[n].islower() else "Q" for n in names)
                         + "q").pack
    values = ", ".join(f"i.{n}" for n in names)
    return eval(f"lambda group, number, size: [pack({values}, number((i.wait, i.signal), "
                "size())) for i in group]", {"pack": pack})


def unique_rows(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(first, inverse)``: the index of the first occurrence of each distinct row of the
    2-D ``a`` and, for every row, the number of its distinct row (``a[first][inverse]``
    equals ``a``); distinct rows in lexicographic order (what ``np.unique(a, axis=0)``
    gives, without its slow path)."""
    n = len(a)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.lexsort(a.T[::-1])  # stable: the first of equal rows comes first
    s = a[order]
    new = np.empty(n, bool)
    new[0] = True
    np.any(s[1:] != s[:-1], axis=1, out=new[1:])
    inverse = np.empty(n, np.int64)
    inverse[order] = np.cumsum(new) - 1
    return order[new], inverse


def _per_shape(group: list, shapes: np.ndarray, fn) -> np.ndarray:
    """``fn(instruction)`` (a tuple of ints, a column each) for every instruction, called
    once per distinct row of ``shapes``."""
    first, inverse = unique_rows(shapes)
    values = np.asarray([fn(group[j]) for j in first.tolist()], np.int64)
    return values.reshape(len(first), -1)[inverse]


class _Rows:
    """The rows of one build, filled one concrete type at a time (``b``: the block of
    rows of the type being filled)."""

    def __init__(self, cores: list, num_cores: int, formats: tuple[str, ...],
                 shared_link: bool = False) -> None:
        self.cores = cores
        self.num_cores = num_cores
        self.formats = formats
        self.shared_link = shared_link
        self.fmts: dict[str, kvformats.KVFormat] = {}
        #: the distinct ``(wait, signal)`` pairs of the objects read, each with its number
        #: (dense, in the order of first occurrence in grouped order)
        self.pairs: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
        #: the number of each object's pair, one array per group read (in grouped order)
        self.pair_numbers: list[np.ndarray] = []

    def fields(self, t: type, group: list, names: tuple[str, ...]) -> np.ndarray:
        """Fields ``names`` of the instructions of type ``t`` in ``group``, one column each
        (the numbers of their ``(wait, signal)`` pairs go to :attr:`pair_numbers`; a
        :class:`_ColumnGroup` has its waits and signals as columns already)."""
        if isinstance(group, _ColumnGroup):
            return group.cols.column_matrix(group.k, names)
        pairs = self.pairs
        try:
            read = _reader(t, names)(group, pairs.setdefault, pairs.__len__)
        except struct.error:
            bad = next(i for i in group if not all(
                isinstance(v, int) and -(1 << 63) <= v < (1 << 64) for v in map(
                    i.__getattribute__, names)))
            raise DeviceError(f"{t.__name__}: a field of {', '.join(names)} is not a 64-bit "
                              f"integer: {bad}") from None
        f = np.frombuffer(b"".join(read), np.int64).reshape(len(group), len(names) + 1)
        self.pair_numbers.append(f[:, -1])
        return f[:, :-1]

    def timed(self, i: Instruction) -> tuple[int, int]:
        return self.cores[i.core].duration_ps(i, self.formats), i.ops()

    def kv(self, i: Instruction) -> tuple[int, int, int, int]:
        """Time, ops and the bytes the KV format's layout really reads and writes."""
        text = self.formats[i.fmt]
        fmt = self.fmts.get(text)
        if fmt is None:
            fmt = self.fmts[text] = kvformats.parse(text)
        if isinstance(i, KvWrite):
            rd, wr = fmt.write_bytes(i.pos, i.tokens, i.width)
        else:
            rd, wr = fmt.read_bytes(i.pos, i.tokens, i.width), 0
        return (*self.timed(i), rd, wr)

    def dma(self, b: np.ndarray, t: type, group: list, family: type) -> None:
        f = self.fields(t, group, ("core", "src", "dst", "nbytes", "rows"))
        core = f[:, 0]
        total = f[:, 3] * f[:, 4]
        load = family is DmaLoad
        b[:, X_QCORE] = core
        b[:, pl.I_KIND] = pl.K_DMA
        b[:, pl.I_RES] = core + (0 if load else self.num_cores)
        b[:, pl.I_CORE] = core
        b[:, pl.I_DIR1] = pl.D_LOAD if load else pl.D_STORE
        b[:, pl.I_SRC1] = f[:, 1]
        b[:, pl.I_DST1] = f[:, 2]
        b[:, pl.I_N1] = total
        addr = f[:, 1] if load else f[:, 2]
        _adds(b, (_READ if load else _WRITE, addr, total))
        _streams(b, (addr, total))

    def copy(self, b: np.ndarray, t: type, group: list, family: type) -> None:
        f = self.fields(t, group, ("src", "dst", "nbytes"))
        b[:, pl.I_KIND] = pl.K_DMA
        b[:, pl.I_RES] = 3 * self.num_cores
        b[:, pl.I_DIR1] = pl.D_COPY
        b[:, pl.I_SRC1] = f[:, 0]
        b[:, pl.I_DST1] = f[:, 1]
        b[:, pl.I_N1] = f[:, 2]
        # the read, then the write
        _adds(b, (_READ, f[:, 0], f[:, 2]), (_WRITE, f[:, 1], f[:, 2]))
        _streams(b, (f[:, 0], f[:, 2]), (f[:, 1], f[:, 2]))

    def host(self, b: np.ndarray, t: type, group: list, family: type) -> None:
        h2d = family is HostWrite
        f = self.fields(t, group, ("dst" if h2d else "src", "nbytes"))
        b[:, pl.I_KIND] = pl.K_LINK
        b[:, pl.I_DIR1] = 0 if h2d else 1
        b[:, pl.I_SRC1] = f[:, 0]  # the DRAM address (a shared-DRAM copy reads and writes it)
        b[:, pl.I_N1] = f[:, 1]
        if self.shared_link:
            _adds(b, (_COPY_H2D if h2d else _COPY_D2H, f[:, 0], f[:, 1]))
        else:
            _adds(b, (_H2D if h2d else _D2H, f[:, 0], f[:, 1]),
                  (_WRITE if h2d else _READ, f[:, 0], f[:, 1]))

    def attn(self, b: np.ndarray, t: type, group: list, family: type) -> None:
        f = self.fields(t, group, ("core", "q_len", "ctx", "head_dim", "heads", "k_fmt", "v_fmt",
                               "kv_heads", "k", "v", "k_nbytes", "v_nbytes"))
        core = f[:, 0]
        b[:, X_QCORE] = core
        b[:, pl.I_KIND] = pl.K_PAR
        b[:, [pl.I_DUR, pl.I_OPS]] = _per_shape(group, f[:, :8], self.timed)
        b[:, pl.I_RES] = 2 * self.num_cores + core
        b[:, pl.I_CORE] = core
        b[:, pl.I_NSUB] = 2
        b[:, pl.I_DIR1] = pl.D_READ
        b[:, pl.I_SRC1] = f[:, 8]
        b[:, pl.I_N1] = f[:, 10]
        b[:, pl.I_DIR2] = pl.D_READ
        b[:, pl.I_SRC2] = f[:, 9]
        b[:, pl.I_N2] = f[:, 11]
        _adds(b, (_READ, f[:, 8], f[:, 10] + f[:, 11]))
        _streams(b, (f[:, 8], f[:, 10]), (f[:, 9], f[:, 11]))

    def kv_rows(self, b: np.ndarray, t: type, group: list, family: type) -> None:
        # the layers of a step write the same positions: the format's layout is asked once
        # per distinct (core, format, positions, width)
        write = family is KvWrite
        f = self.fields(t, group, ("core", "fmt", "pos", "tokens", "width",
                               "dst" if write else "src"))
        core, base = f[:, 0], f[:, 5]
        dur, ops, rd, wr = _per_shape(group, f[:, :5], self.kv).T
        b[:, X_QCORE] = core
        b[:, pl.I_KIND] = pl.K_PAR
        b[:, pl.I_DUR] = dur
        b[:, pl.I_RES] = 2 * self.num_cores + core
        b[:, pl.I_CORE] = core
        b[:, pl.I_OPS] = ops
        # one transfer each for the bytes read and written, the read first
        has_rd, has_wr = rd > 0, wr > 0
        one = has_rd | has_wr
        b[:, pl.I_DIR1] = np.where(has_rd, pl.D_READ, pl.D_WRITE) * one
        b[:, pl.I_SRC1] = base * has_rd
        b[:, pl.I_DST1] = base * (has_wr & ~has_rd)
        n1 = np.where(has_rd, rd, wr)
        b[:, pl.I_N1] = n1
        two = has_rd & has_wr
        b[:, pl.I_DIR2] = pl.D_WRITE * two
        b[:, pl.I_DST2] = base * two
        b[:, pl.I_N2] = wr * two
        b[:, X_LINK1] = np.where(has_rd, _READ, _WRITE) * one
        b[:, X_ADDR1] = b[:, X_SB1] = base * one
        b[:, pl.I_BYTES1] = b[:, X_SN1] = n1
        b[:, X_LINK2] = _WRITE * two
        b[:, X_ADDR2] = b[:, X_SB2] = base * two
        b[:, pl.I_BYTES2] = b[:, X_SN2] = wr * two
        b[:, pl.I_NSUB] = b[:, pl.I_NADD] = b[:, X_NSTREAM] = one.astype(np.int64) + two

    def gemm(self, b: np.ndarray, t: type, group: list, family: type) -> None:
        # the variants' own fields (group size, output width, per-row input factors) enter
        # their time or ops
        own = tuple(n for n in ("group", "out_bits", "row_meta")
                    if n in {f.name for f in dataclasses.fields(t)})
        f = self.fields(t, group, ("core", "m", "k", "n", "w_bits", *own))
        if "row_meta" in own:
            f = f.copy()
            f[:, -1] = f[:, -1] != NO_ADDR_I64
        b[:, X_QCORE] = f[:, 0]
        b[:, [pl.I_DUR, pl.I_OPS]] = _per_shape(group, f, self.timed)

    def vec(self, b: np.ndarray, t: type, group: list, family: type) -> None:
        f = self.fields(t, group, ("core", "func", "rows", "cols", "p1", "p2"))
        b[:, X_QCORE] = f[:, 0]
        b[:, [pl.I_DUR, pl.I_OPS]] = _per_shape(group, f, self.timed)

    def nop(self, b: np.ndarray, t: type, group: list, family: type) -> None:
        f = self.fields(t, group, ("core", "on"))
        b[:, X_ENG] = f[:, 1]
        b[:, X_QCORE] = np.where(f[:, 1] <= LAST_PER_CORE, f[:, 0], 0)


def _adds(b: np.ndarray, *adds) -> None:
    """The stats additions ``(link, DRAM address, bytes)`` a row makes (one or two)."""
    b[:, pl.I_NADD] = len(adds)
    for (link, addr, nbytes), cl, ca, cn in zip(adds, (X_LINK1, X_LINK2), (X_ADDR1, X_ADDR2),
                                                (pl.I_BYTES1, pl.I_BYTES2), strict=False):
        b[:, cl] = link
        b[:, ca] = addr
        b[:, cn] = nbytes


def _streams(b: np.ndarray, *pairs) -> None:
    b[:, X_NSTREAM] = len(pairs)
    for (base, nbytes), cb, cn in zip(pairs, (X_SB1, X_SB2), (X_SN1, X_SN2), strict=False):
        b[:, cb] = base
        b[:, cn] = nbytes


#: The filler of each family's rows (compute kinds keep ``I_KIND = K_COMPUTE``, 0).
_FILL = {DmaLoad: _Rows.dma, DmaStore: _Rows.dma, DmaCopy: _Rows.copy, HostWrite: _Rows.host,
         HostRead: _Rows.host, Attn: _Rows.attn, KvWrite: _Rows.kv_rows, KvRead: _Rows.kv_rows,
         Gemm: _Rows.gemm, Vec: _Rows.vec, Nop: _Rows.nop}


def build_rows(objs: list[Instruction], cores: list, num_cores: int,
               formats: tuple[str, ...], shared_link: bool = False) -> np.ndarray:
    """The rows (``len(objs)`` x :data:`ROW_FIELDS`) of distinct instruction objects run on
    ``cores`` (the device's compute cores) in a program whose KV formats are ``formats``,
    on a device whose host link copies through shared DRAM if ``shared_link``."""
    built = Built(objs, cores, num_cores, formats, shared_link=shared_link)
    rows = np.empty_like(built.rows)
    rows[built.order] = built.rows
    return rows


def _type_numbers(types: np.ndarray) -> np.ndarray:
    """The number of each of ``types`` (an object array; numbering the types not seen
    before)."""
    ids = object_ids(types)
    held, number = _TYPE_BY_ID
    k = np.minimum(np.searchsorted(held, ids), max(len(held) - 1, 0))
    if len(ids) and (not len(held) or not np.array_equal(held[k], ids)):
        for t in set(types.tolist()).difference(_TYPE_IDS):
            _register(t)  # may raise: nothing built yet
        return _type_numbers(types)
    return number[k]


class _ColumnGroup:
    """The instructions of type ``k`` of a program's columns, as a group the fillers read:
    fields by column, an instruction (made on demand: once per distinct shape) by index."""

    def __init__(self, cols: ProgramColumns, k: int) -> None:
        self.cols, self.k = cols, k

    def __getitem__(self, j: int) -> Instruction:
        return self.cols.instruction(self.k, j)


class ColumnRows:
    """The rows of the instructions of a program held as columns (``cols``), one per
    instruction, grouped by type (:attr:`row_of`: the row of each instruction), read from
    the columns without instruction objects (but one per distinct shape, for its time):
    the rows :class:`Built` makes of the same instructions, but for the waits and
    signals, whose offsets (``X_WOFF``, ``X_SOFF``) point into :attr:`flags` (the waits
    of all instructions, then their signals, in program order). Column-major: the
    fillers write whole columns."""

    def __init__(self, cols: ProgramColumns, cores: list, num_cores: int,
                 formats: tuple[str, ...], shared_link: bool = False) -> None:
        for t in set(cols.types).difference(_TYPE_IDS):
            _register(t)  # may raise: nothing built yet
        fill = _Rows(cores, num_cores, formats, shared_link)
        # filled a type's block at a time, column-major (the fillers write columns)
        s = np.zeros((len(cols), ROW_FIELDS), np.int64, order="F")
        start = 0
        for k, t in enumerate(cols.types):
            family = _FAMILY[_TYPE_IDS[t]]
            end = start + len(cols.positions[k])
            b = s[start:end]
            if family is not Nop:
                b[:, pl.I_FLAGS] = pl.FL_DISPATCH
                b[:, X_ENG] = int(family.engine_kind)
            _FILL[family](fill, b, t, _ColumnGroup(cols, k), family)
            start = end
        order = np.concatenate(cols.positions)  # the program place of each row
        wp, sp = cols.wait_ptr, cols.signal_ptr
        s[:, X_WOFF] = wp[order]
        s[:, X_WLEN] = wp[order + 1] - s[:, X_WOFF]
        s[:, X_SOFF] = sp[order]
        s[:, X_SLEN] = sp[order + 1] - s[:, X_SOFF]
        s[:, X_SOFF] += wp[-1]
        self.rows = s
        self.row_of = np.empty(len(cols), np.int32)  # the row of each instruction
        self.row_of[order] = np.arange(len(cols), dtype=np.int32)
        self.flags = np.concatenate([cols.wait_flags, cols.signal_flags])


class Built:
    """The rows of distinct instruction objects ``objs`` (see :func:`build_rows`) and
    their waits and signals, read with the rows, in an order of the objects'
    (:attr:`objs`; :attr:`order` their places in ``objs``): the rows (:attr:`rows`,
    ``out`` if given: zeros the rows are written into, else an array of their own), the
    distinct ``(wait, signal)`` pairs (:attr:`pairs`, in the order the rows first have
    them) and the number of each row's pair (:attr:`pair_of`).

    The objects are grouped by concrete type (the types in the order they first occur,
    a stable sort), the order of the rows; each type's fields are read in one pass
    (:func:`_reader`, which numbers the pairs too) and its rows filled column by column
    over the group, in place (no rows are made twice nor moved: a first decode step's
    ~13,600 new rows are some 3 MB, each fresh page of which costs the system a fault)."""

    def __init__(self, objs: list[Instruction], cores: list, num_cores: int,
                 formats: tuple[str, ...], out: np.ndarray | None = None, *,
                 shared_link: bool = False) -> None:
        n = len(objs)
        # (may raise: nothing written yet)
        tid = _type_numbers(np.fromiter(map(type, objs), object, n))
        if out is None:
            out = np.zeros((n, ROW_FIELDS), np.int64)
        elif out.shape != (n, ROW_FIELDS) or out.dtype != np.int64:
            raise ValueError(f"out: {out.dtype} {out.shape}, not int64 ({n}, {ROW_FIELDS})")
        # the types in the order they first occur (so that the rows' order depends on
        # ``objs`` only, not on which types were numbered first)
        first = np.full(len(_TYPE_LIST), n, np.int64)
        np.minimum.at(first, tid, np.arange(n))
        kinds = np.flatnonzero(first < n)
        kinds = kinds[np.argsort(first[kinds])]
        # (a short key sorts by radix, some 4 times faster)
        rank = np.zeros(len(_TYPE_LIST), np.int16 if len(_TYPE_LIST) < 1 << 15 else np.int64)
        rank[kinds] = np.arange(len(kinds))
        key = rank[tid]
        #: the place in ``objs`` of each row's object
        self.order = np.argsort(key, kind="stable")
        counts = np.bincount(key, minlength=len(kinds)).tolist()
        #: the object of each row
        self.objs: list[Instruction] = np.fromiter(objs, object, n)[self.order].tolist()
        fill = _Rows(cores, num_cores, formats, shared_link)
        start = 0
        for k, size in zip(kinds.tolist(), counts, strict=True):
            end = start + size
            t, family = _TYPE_LIST[k], _FAMILY[k]
            b = out[start:end]
            if family is not Nop:  # every instruction but a Nop is dispatched (the
                b[:, pl.I_FLAGS] = pl.FL_DISPATCH  # cross-core bit is the program's)
                b[:, X_ENG] = int(family.engine_kind)
            _FILL[family](fill, b, t, self.objs[start:end], family)
            start = end
        self.rows = out
        #: the distinct ``(wait, signal)`` pairs, in the order the rows first have them
        self.pairs = list(fill.pairs)
        #: the number of each row's pair in :attr:`pairs`
        self.pair_of = (np.concatenate(fill.pair_numbers) if fill.pair_numbers
                        else np.zeros(0, np.int64))
