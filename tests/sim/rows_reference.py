"""The rows of :mod:`sim.device.engine.rows` as they were built before the vectorised builder:
per instruction type with attribute getters, durations once per distinct shape found by a
dict over row tuples. Kept as the reference the vectorised rows are compared with."""

from __future__ import annotations

from itertools import chain, repeat
from operator import attrgetter

import numpy as np

from isa import kvformats
from isa.instructions import (
    NO_ADDR,
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
from sim.device.engine.rows import (
    LAST_PER_CORE,
    ROW_FIELDS,
    X_ADDR1,
    X_ADDR2,
    X_ENG,
    X_LINK1,
    X_LINK2,
    X_NSTREAM,
    X_QCORE,
    X_SB1,
    X_SB2,
    X_SN1,
    X_SN2,
)

_READ, _WRITE, _H2D, _D2H = range(4)
_TYPES = (DmaLoad, DmaStore, DmaCopy, HostWrite, HostRead, Attn, KvWrite, KvRead, Gemm, Vec,
          Nop)
_CODE = {t: k for k, t in enumerate(_TYPES)}
_TYPE_IDS: dict[type, int] = {}


def _code_of(t: type) -> int:
    """The code of instruction type ``t``: its own, or its nearest base's (a subclass is
    registered on first sight)."""
    code = _CODE.get(t)
    if code is None:
        base = next((b for b in t.__mro__ if b in _CODE), None)
        if base is None:
            raise KeyError(t)
        code = _CODE[t] = _CODE[base]
    return code


def _ints(values, n: int) -> np.ndarray:
    return np.fromiter(values, np.int64, n)


def _type_ids(group: list) -> np.ndarray:
    """One column: the id of each instruction's concrete type."""
    ids = _TYPE_IDS
    return _ints((ids.setdefault(type(i), len(ids)) for i in group), len(group))


def _with_type(group: list, f: np.ndarray) -> np.ndarray:
    return np.column_stack([f, _type_ids(group)])


def _fields(group: list, names: tuple[str, ...]) -> np.ndarray:
    get = attrgetter(*names)
    flat = chain.from_iterable(map(get, group)) if len(names) > 1 else map(get, group)
    return _ints(flat, len(group) * len(names)).reshape(len(group), len(names))


def _per_shape(group: list, shapes: np.ndarray, *fns) -> np.ndarray:
    """``fn(instruction)`` of each ``fn`` (a column each) for every instruction, computed
    once per distinct shape row."""
    keys = list(map(tuple, shapes.tolist()))
    ids: dict[tuple, int] = {}
    first: list[int] = []
    inverse = []
    for j, key in enumerate(keys):
        u = ids.get(key)
        if u is None:
            u = ids[key] = len(first)
            first.append(j)
        inverse.append(u)
    values = np.asarray([[fn(group[j]) for fn in fns] for j in first], np.int64)
    return values.reshape(len(first), len(fns))[inverse]


def _ops(i: Instruction) -> int:
    return i.ops()


def _one_add(r: np.ndarray, idx: np.ndarray, link, addr, nbytes) -> None:
    r[idx, pl.I_NADD] = 1
    r[idx, X_LINK1] = link
    r[idx, X_ADDR1] = addr
    r[idx, pl.I_BYTES1] = nbytes


def _two_adds(r: np.ndarray, idx: np.ndarray, links, addrs, nbytes) -> None:
    r[idx, pl.I_NADD] = 2
    r[idx, X_LINK1], r[idx, X_LINK2] = links
    r[idx, X_ADDR1], r[idx, X_ADDR2] = addrs
    r[idx, pl.I_BYTES1], r[idx, pl.I_BYTES2] = nbytes


def _streams(r: np.ndarray, idx: np.ndarray, *pairs) -> None:
    r[idx, X_NSTREAM] = len(pairs)
    for (base, nbytes), cb, cn in zip(pairs, (X_SB1, X_SB2), (X_SN1, X_SN2), strict=False):
        r[idx, cb] = base
        r[idx, cn] = nbytes


def reference_rows(objs: list[Instruction], cores: list, num_cores: int,
               formats: tuple[str, ...]) -> np.ndarray:
    """The rows (``len(objs)`` x :data:`ROW_FIELDS`) of distinct instruction objects run on
    ``cores`` (the device's compute cores) in a program whose KV formats are ``formats``."""
    n = len(objs)
    types = list(map(type, objs))
    codes = list(map(_CODE.get, types, repeat(-1)))
    if -1 in codes:  # a subclass seen for the first time, or no engine's
        try:
            codes = list(map(_code_of, types))
        except KeyError as err:
            raise DeviceError(f"no engine executes {err.args[0].__name__}") from None
    code = np.asarray(codes, np.int64)
    r = np.zeros((n, ROW_FIELDS), np.int64)
    groups = {t: np.flatnonzero(code == k) for k, t in enumerate(_TYPES)}
    get = objs.__getitem__

    def members(t):
        idx = groups[t]
        return idx, list(map(get, idx.tolist()))

    def duration(i: Instruction) -> int:
        return cores[i.core].duration_ps(i, formats)

    for t in (DmaLoad, DmaStore):
        idx, group = members(t)
        if not len(idx):
            continue
        f = _fields(group, ("core", "src", "dst", "nbytes", "rows"))
        total = f[:, 3] * f[:, 4]
        load = t is DmaLoad
        r[idx, X_ENG] = int(t.engine_kind)
        r[idx, pl.I_KIND] = pl.K_DMA
        r[idx, pl.I_RES] = f[:, 0] + (0 if load else num_cores)
        r[idx, pl.I_CORE] = f[:, 0]
        r[idx, pl.I_DIR1] = pl.D_LOAD if load else pl.D_STORE
        r[idx, pl.I_SRC1] = f[:, 1]
        r[idx, pl.I_DST1] = f[:, 2]
        r[idx, pl.I_N1] = total
        addr = f[:, 1] if load else f[:, 2]
        _one_add(r, idx, _READ if load else _WRITE, addr, total)
        _streams(r, idx, (addr, total))
    idx, group = members(DmaCopy)
    if len(idx):
        f = _fields(group, ("src", "dst", "nbytes"))
        r[idx, X_ENG] = int(DmaCopy.engine_kind)
        r[idx, pl.I_KIND] = pl.K_DMA
        r[idx, pl.I_RES] = 3 * num_cores
        r[idx, pl.I_DIR1] = pl.D_COPY
        r[idx, pl.I_SRC1] = f[:, 0]
        r[idx, pl.I_DST1] = f[:, 1]
        r[idx, pl.I_N1] = f[:, 2]
        # the read, then the write
        _two_adds(r, idx, (_READ, _WRITE), (f[:, 0], f[:, 1]), (f[:, 2], f[:, 2]))
        _streams(r, idx, (f[:, 0], f[:, 2]), (f[:, 1], f[:, 2]))
    for t, direction, link in ((HostWrite, 0, _H2D), (HostRead, 1, _D2H)):
        idx, group = members(t)
        if not len(idx):
            continue
        f = _fields(group, ("dst" if t is HostWrite else "src", "nbytes"))
        r[idx, X_ENG] = int(t.engine_kind)
        r[idx, pl.I_KIND] = pl.K_LINK
        r[idx, pl.I_DIR1] = direction
        r[idx, pl.I_SRC1] = f[:, 0]
        r[idx, pl.I_N1] = f[:, 1]
        dram = _WRITE if t is HostWrite else _READ
        _two_adds(r, idx, (link, dram), (f[:, 0], f[:, 0]), (f[:, 1], f[:, 1]))
    idx, group = members(Attn)
    if len(idx):
        f = _fields(group, ("core", "q_len", "ctx", "head_dim", "heads", "k_fmt", "v_fmt",
                            "k", "v", "k_nbytes", "v_nbytes"))
        r[idx, X_ENG] = int(Attn.engine_kind)
        r[idx, pl.I_KIND] = pl.K_PAR
        shape = _with_type(group, f[:, :7])
        r[idx, pl.I_DUR], r[idx, pl.I_OPS] = _per_shape(group, shape, duration, _ops).T
        r[idx, pl.I_RES] = 2 * num_cores + f[:, 0]
        r[idx, pl.I_CORE] = f[:, 0]
        r[idx, pl.I_NSUB] = 2
        r[idx, pl.I_DIR1] = pl.D_READ
        r[idx, pl.I_SRC1] = f[:, 7]
        r[idx, pl.I_N1] = f[:, 9]
        r[idx, pl.I_DIR2] = pl.D_READ
        r[idx, pl.I_SRC2] = f[:, 8]
        r[idx, pl.I_N2] = f[:, 10]
        _one_add(r, idx, _READ, f[:, 7], f[:, 9] + f[:, 10])
        _streams(r, idx, (f[:, 7], f[:, 9]), (f[:, 8], f[:, 10]))
    _kv_rows(r, members, cores, num_cores, formats)
    idx, group = members(Gemm)
    if len(idx):
        f = _fields(group, ("core", "m", "k", "n", "w_bits"))
        # the variants' own fields (group size, output width, per-row input factors) enter
        # their time or ops
        extra = _ints(chain.from_iterable(
            (getattr(i, "group", 0), getattr(i, "out_bits", 0),
             int(getattr(i, "row_meta", NO_ADDR) != NO_ADDR)) for i in group),
            3 * len(group)).reshape(-1, 3)
        shape = _with_type(group, np.column_stack([f, extra]))
        r[idx, X_ENG] = int(Gemm.engine_kind)
        r[idx, pl.I_DUR], r[idx, pl.I_OPS] = _per_shape(group, shape, duration, _ops).T
    idx, group = members(Vec)
    if len(idx):
        f = _fields(group, ("core", "func", "rows", "cols", "p1", "p2"))
        r[idx, X_ENG] = int(Vec.engine_kind)
        r[idx, pl.I_DUR], r[idx, pl.I_OPS] = _per_shape(group, f, duration, _ops).T
    idx, group = members(Nop)
    if len(idx):
        r[idx, X_ENG] = _ints(map(attrgetter("on"), group), len(group))
    # compute kinds (Gemm, Vec, Nop) keep I_KIND = K_COMPUTE (0)

    # every instruction but a Nop is dispatched (the cross-core bit is the program's)
    r[:, pl.I_FLAGS] = np.where(code == _CODE[Nop], 0, pl.FL_DISPATCH)
    per_core = r[:, X_ENG] <= LAST_PER_CORE
    r[per_core, X_QCORE] = _ints(map(attrgetter("core"), objs), n)[per_core]
    return r


def _kv_rows(r: np.ndarray, members, cores: list, num_cores: int,
             formats: tuple[str, ...]) -> None:
    fmt_cache: dict[str, kvformats.KVFormat] = {}
    moved: dict[tuple, tuple[int, int]] = {}
    for t in (KvWrite, KvRead):
        idx, group = members(t)
        out: list[list[int]] = []
        for ins in group:
            # the bytes each format's layout really moves: the layers of a step write the
            # same positions, so one call per distinct (format, positions, width)
            key = (t, ins.fmt, ins.pos, ins.tokens, ins.width)
            rd_wr = moved.get(key)
            if rd_wr is None:
                text = formats[ins.fmt]
                fmt = fmt_cache.get(text)
                if fmt is None:
                    fmt = fmt_cache[text] = kvformats.parse(text)
                rd_wr = moved[key] = (
                    fmt.write_bytes(ins.pos, ins.tokens, ins.width) if t is KvWrite
                    else (fmt.read_bytes(ins.pos, ins.tokens, ins.width), 0))
            rd, wr = rd_wr
            base = ins.dst if t is KvWrite else ins.src
            row = [0] * ROW_FIELDS
            row[X_ENG] = int(t.engine_kind)
            row[pl.I_KIND] = pl.K_PAR
            row[pl.I_DUR] = cores[ins.core].duration_ps(ins, formats)
            row[pl.I_RES] = 2 * num_cores + ins.core
            row[pl.I_CORE] = ins.core
            row[pl.I_OPS] = ins.ops()
            col = pl.I_DIR1
            k = 0
            for d, nbytes, link in ((pl.D_READ, rd, _READ), (pl.D_WRITE, wr, _WRITE)):
                if not nbytes:
                    continue
                row[col: col + 4] = (d, base if d == pl.D_READ else 0,
                                     0 if d == pl.D_READ else base, nbytes)
                col += 4
                row[(X_LINK1, X_LINK2)[k]] = link
                row[(X_ADDR1, X_ADDR2)[k]] = base
                row[(pl.I_BYTES1, pl.I_BYTES2)[k]] = nbytes
                row[(X_SB1, X_SB2)[k]] = base
                row[(X_SN1, X_SN2)[k]] = nbytes
                k += 1
            row[pl.I_NSUB] = row[pl.I_NADD] = row[X_NSTREAM] = k
            out.append(row)
        if out:
            r[idx] = np.asarray(out, np.int64)
