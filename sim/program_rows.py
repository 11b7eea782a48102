"""The row of each distinct instruction object, as the array loop reads it, and a bounded
cache of those rows keyed by object identity.

A row holds what the array loop (:mod:`sim.components.programloop`) needs of one
instruction, whatever program it appears in: its kind, precomputed duration, DMA
resource, core and up to two transfers (the loop's columns ``loopdefs.I_*``), its
integer ops, the stats additions it makes when its timing begins (up to two: link,
DRAM address, bytes) and the DRAM transfers the efficiency model plans chunks for (up
to two: base, bytes), plus the engine queue it runs on. What depends on the program
around it (the cross-core barrier bit, dense flag ids, the traffic kind of an address
under the device's current memory map) is added per program by :mod:`sim.program_tables`.

Rows are built per instruction type with C-level attribute getters, not one Python step
per instruction; durations come from the compute cores (``ComputeCore.duration_ps``)
once per distinct shape, KV bytes from the formats' layouts.

Instructions are frozen values and the compiler emits one object per distinct
instruction (``Builder.emit``), so a decode step shares most of its objects with the
previous one: :class:`RowCache` builds each object's row once and holds the object (so
that its ``id`` stays its own) until the cache is full, then starts afresh.
"""

from __future__ import annotations

import dataclasses
import functools
import struct
from itertools import chain, count

import numpy as np

from isa import kvformats
from isa.errors import DeviceError
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
from sim.components import loopdefs as pl

#: Links of the stats additions, by id.
LINKS = ("dram_read", "dram_write", "pcie_h2d", "pcie_d2h")
_READ, _WRITE, _H2D, _D2H = range(4)
#: Engines numbered up to this one have one queue per core.
LAST_PER_CORE = max(int(e) for e in PER_CORE_ENGINES)
if {int(e) for e in PER_CORE_ENGINES} != set(range(LAST_PER_CORE + 1)):
    raise ImportError("per-core engines must be numbered first")
FAMILIES = (DmaLoad, DmaStore, DmaCopy, HostWrite, HostRead, Attn, KvWrite, KvRead, Gemm, Vec,
          Nop)
_CODE = {t: k for k, t in enumerate(FAMILIES)}
#: Every concrete instruction type seen, numbered, with the family (a type of ``FAMILIES``)
#: it belongs to: a subclass (``GemmRow``, ``AttnDq``, ...) runs on its base's engine but
#: may take its own time and ops, so rows are built per concrete type.
_TYPE_IDS: dict[type, int] = {}
_TYPE_LIST: list[type] = []
_FAMILY: list[type] = []
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

#: Rows a :class:`RowCache` holds before it starts afresh. An assumption sized for memory:
#: a row is ROW_FIELDS int64 (280 bytes) plus its index entry, so a full cache is about
#: 100 MB; a decode step of Qwen2.5-0.5B has ~13,600 distinct objects, ~1,000 of them new.
MAX_ROWS = 1 << 18


def _register(t: type) -> None:
    """Numbers instruction type ``t`` under its nearest base of ``FAMILIES``."""
    family = next((b for b in t.__mro__ if b in _CODE), None)
    if family is None:
        raise DeviceError(f"no engine executes {t.__name__}")
    _TYPE_IDS[t] = len(_TYPE_LIST)
    _TYPE_LIST.append(t)
    _FAMILY.append(family)


@functools.cache
def _reader(t: type, names: tuple[str, ...]):
    """``read(group)``: for each instruction of type ``t`` in ``group``, its fields
    ``names`` packed as 8-byte integers (signed where the field's declared struct code is,
    ``fmt`` in :mod:`isa.instr_base`, else unsigned: a u64 above ``2**63``, such as
    :data:`NO_ADDR`, reads back as a negative ``int64``) and its ``(wait, signal)``. The
    reads are a list comprehension of plain attribute loads, which the interpreter
    specialises per type: about twice as fast as an ``attrgetter`` per instruction.
    ``names`` are this module's own field names."""
    fmt = {f.name: f.metadata.get("fmt", "Q") for f in dataclasses.fields(t)}
    if not set(names) <= fmt.keys() or not all(n.isidentifier() for n in names):
        raise KeyError(f"{t.__name__} has no field among {names}")
    pack = struct.Struct("<" + "".join("q" if fmt[n].islower() else "Q" for n in names)).pack
    values = ", ".join(f"i.{n}" for n in names)
    # with each instruction's waits and signals, read while the object is at hand
    return eval(f"lambda group: [(pack({values}), (i.wait, i.signal)) for i in group]",
                {"pack": pack})


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

    def __init__(self, cores: list, num_cores: int, formats: tuple[str, ...]) -> None:
        self.cores = cores
        self.num_cores = num_cores
        self.formats = formats
        self.fmts: dict[str, kvformats.KVFormat] = {}
        self.heads: list[tuple[tuple[int, ...], tuple[int, ...]]] = []  # in grouped order

    def fields(self, t: type, group: list, names: tuple[str, ...]) -> np.ndarray:
        """Fields ``names`` of the instructions of type ``t`` in ``group``, one column each
        (their waits and signals go to :attr:`heads`)."""
        try:
            bufs, heads = zip(*_reader(t, names)(group), strict=True)
        except struct.error:
            bad = next(i for i in group if not all(
                isinstance(v, int) and -(1 << 63) <= v < (1 << 64) for v in map(
                    i.__getattribute__, names)))
            raise DeviceError(f"{t.__name__}: a field of {', '.join(names)} is not a 64-bit "
                              f"integer: {bad}") from None
        self.heads.extend(heads)
        return np.frombuffer(b"".join(bufs), np.int64).reshape(len(group), len(names))

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
        b[:, pl.I_N1] = f[:, 1]
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
               formats: tuple[str, ...]) -> np.ndarray:
    """The rows (``len(objs)`` x :data:`ROW_FIELDS`) of distinct instruction objects run on
    ``cores`` (the device's compute cores) in a program whose KV formats are ``formats``."""
    built = Built(objs, cores, num_cores, formats)
    r = np.empty_like(built.rows)
    r[built.order] = built.rows
    return r


class Built:
    """The rows of distinct instruction objects ``objs`` (see :func:`build_rows`) in grouped
    order: ``objs[order[k]]`` is ``grouped[k]``, whose row is ``rows[k]`` and whose waits
    and signals are ``heads[k]``.

    The objects are grouped by concrete type (a stable sort of their type ids); each
    type's fields are read in one pass (:func:`_reader`) and its rows filled column by
    column over the group."""

    def __init__(self, objs: list[Instruction], cores: list, num_cores: int,
                 formats: tuple[str, ...]) -> None:
        n = len(objs)
        types = list(map(type, objs))
        ids = _TYPE_IDS
        for t in set(types).difference(ids):
            _register(t)  # may raise: nothing built yet
        tid = np.fromiter(map(ids.__getitem__, types), np.int64, n)
        self.order = np.argsort(tid, kind="stable")
        counts = np.bincount(tid, minlength=len(_TYPE_LIST)).tolist()
        self.grouped = grouped = list(map(objs.__getitem__, self.order.tolist()))
        fill = _Rows(cores, num_cores, formats)
        self.rows = s = np.zeros((n, ROW_FIELDS), np.int64)
        start = 0
        for k, size in enumerate(counts):
            if not size:
                continue
            end = start + size
            t, family = _TYPE_LIST[k], _FAMILY[k]
            b = s[start:end]
            if family is not Nop:  # every instruction but a Nop is dispatched (the
                b[:, pl.I_FLAGS] = pl.FL_DISPATCH  # cross-core bit is the program's)
                b[:, X_ENG] = int(family.engine_kind)
            _FILL[family](fill, b, t, grouped[start:end], family)
            start = end
        self.heads = fill.heads


class RowStore:
    """The rows of one KV-format table's objects: an index by identity (the objects' ids,
    sorted, and the row of each), the objects (held so that no other object takes their
    id) and the rows, in order of arrival, and the flags their rows point into (``X_WOFF``
    ...): each the used head of a buffer that doubles as it fills."""

    def __init__(self) -> None:
        self._ids = np.zeros(0, np.int64)
        self._at = np.zeros(0, np.int64)
        self.objs: list[Instruction] = []
        self._rows = np.zeros((0, ROW_FIELDS), np.int64)
        self._flags = np.zeros(0, np.int64)
        self._nflags = 0

    @property
    def rows(self) -> np.ndarray:
        return self._rows[: len(self.objs)]

    @property
    def flags(self) -> np.ndarray:
        return self._flags[: self._nflags]

    def find(self, ids: np.ndarray) -> np.ndarray:
        """The row of each object id of ``ids`` (-1: not held)."""
        held = self._ids
        if not len(held):
            return np.full(len(ids), -1, np.int64)
        k = np.searchsorted(held, ids)
        k[k == len(held)] = 0
        return np.where(held[k] == ids, self._at[k], -1)

    def append(self, objs: list[Instruction], rows: np.ndarray,
               ids: np.ndarray | None = None, heads: list | None = None) -> int:
        """Adds the rows of new objects (``ids``: their ids, ``heads``: their ``(wait,
        signal)``, if known) and their flags; returns the index of the first. Each distinct
        ``(wait, signal)`` pair is held once, and the rows that have it point at it."""
        base = len(self.objs)
        end = base + len(objs)
        if heads is None:
            heads = [(i.wait, i.signal) for i in objs]
        # each object's first object with its pair (one hash each), then the pairs numbered
        first_of: dict = {}
        first = np.fromiter(map(first_of.setdefault, heads, count()), np.int64, len(objs))
        distinct, which = np.unique(first, return_inverse=True)
        pos = list(map(heads.__getitem__, distinct.tolist()))
        waits = [w for w, _ in pos]
        sigs = [s for _, s in pos]
        wl = np.fromiter(map(len, waits), np.int64, len(waits))
        sl = np.fromiter(map(len, sigs), np.int64, len(sigs))
        nw, ns = int(wl.sum()), int(sl.sum())
        flags = np.fromiter(chain(chain.from_iterable(waits), chain.from_iterable(sigs)),
                            np.int64, nw + ns)
        f0 = self._nflags
        rows[:, X_WLEN] = wl[which]
        rows[:, X_WOFF] = (f0 + np.cumsum(wl) - wl)[which]
        rows[:, X_SLEN] = sl[which]
        rows[:, X_SOFF] = (f0 + nw + np.cumsum(sl) - sl)[which]
        self._rows = _room(self._rows, base, end)
        self._rows[base:end] = rows
        self._flags = _room(self._flags, f0, f0 + nw + ns)
        self._flags[f0: f0 + nw + ns] = flags
        self._nflags += nw + ns
        if ids is None:
            ids = np.fromiter(map(id, objs), np.int64, len(objs))
        order = np.argsort(ids)
        new = ids[order]
        at = np.searchsorted(self._ids, new)
        self._ids = np.insert(self._ids, at, new)
        self._at = np.insert(self._at, at, base + order)
        self.objs.extend(objs)
        return base


def _room(buf: np.ndarray, used: int, need: int) -> np.ndarray:
    """``buf`` (of which ``used`` rows are used), grown by doubling to ``need`` rows."""
    if need <= len(buf):
        return buf
    out = np.zeros((max(need, 2 * len(buf)), *buf.shape[1:]), buf.dtype)
    out[:used] = buf[:used]
    return out


class RowCache:
    """The rows of the instruction objects a device has run, built once per object.

    ``cores`` are the device's compute cores (their durations), ``num_cores`` their count;
    rows depend on a program's KV-format table too, so they are kept per table. Past
    ``max_rows`` rows in all the cache starts afresh before taking a program's new rows (so
    it holds at most ``max_rows`` or one program's distinct objects, whichever is more)."""

    def __init__(self, cores: list, num_cores: int, max_rows: int = MAX_ROWS) -> None:
        if max_rows < 1:
            raise ValueError(f"max_rows {max_rows}: must be at least 1")
        self.cores = cores
        self.num_cores = num_cores
        self.max_rows = max_rows
        self._by_formats: dict[tuple[str, ...], RowStore] = {}
        self._held = 0

    def __len__(self) -> int:
        return self._held

    def clear(self) -> None:
        self._by_formats.clear()
        self._held = 0

    def lookup(self, instrs, formats: tuple[str, ...]) -> tuple[np.ndarray, RowStore]:
        """``(index, store)``: the row of each of ``instrs`` as an index into ``store`` (the
        rows of ``formats``' objects), building the rows of objects not seen before."""
        store = self._by_formats.get(formats)
        n = len(instrs)
        ids = np.fromiter(map(id, instrs), np.int64, n)
        if store is not None:
            index = store.find(ids)
            missing = np.flatnonzero(index < 0)
            if not len(missing):
                return index, store
            ids = ids[missing]
        else:  # every object is new
            index = np.empty(n, np.int64)
            missing = None
        uniq, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
        # the new objects in the order they first occur
        rank = np.argsort(first)
        at = np.empty(len(rank), np.int64)
        at[rank] = np.arange(len(rank))
        pick = first[rank] if missing is None else missing[first[rank]]
        # (every object new and distinct: the program's own order)
        new = list(instrs) if len(pick) == n else list(map(instrs.__getitem__, pick.tolist()))
        built = Built(new, self.cores, self.num_cores, formats)  # may raise: no change
        if self._held + len(new) > self.max_rows and self._held:
            self.clear()
            if store is not None:  # the program's other objects are new again too
                return self.lookup(instrs, formats)
        store = self._by_formats.get(formats)
        if store is None:
            store = self._by_formats[formats] = RowStore()
        # the store takes them in grouped order: new[j] lands at base + where[j]
        where = np.empty(len(new), np.int64)
        where[built.order] = np.arange(len(new))
        where += store.append(built.grouped, built.rows, uniq[rank][built.order], built.heads)
        index[slice(None) if missing is None else missing] = where[at[inverse.reshape(-1)]]
        self._held += len(new)
        return index, store
