"""A program as the tables the array loop runs (:mod:`sim.components.programloop`).

Built per instruction type with C-level attribute getters rather than one Python step per
instruction: one row per instruction (kind, duration, DMA engine, transfers), waits and
signals as index lists over dense flag ids, the engine queues in the device's order
(sorted by engine, then core), the stats each instruction adds when its timing begins,
its integer ops, and the DRAM base and size of every transfer (for the chunk plans).
Durations come from the compute cores (``ComputeCore.duration_ps``) once per distinct
shape; KV bytes from the formats' layouts.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from operator import attrgetter

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
    KvRead,
    KvWrite,
    Nop,
    Program,
    Vec,
)
from sim.components import loopdefs as pl

#: Links of the stats additions, by id.
LINKS = ("dram_read", "dram_write", "pcie_h2d", "pcie_d2h")
_READ, _WRITE, _H2D, _D2H = range(4)
#: Engines numbered up to this one have one queue per core.
_LAST_PER_CORE = max(int(e) for e in PER_CORE_ENGINES)
if {int(e) for e in PER_CORE_ENGINES} != set(range(_LAST_PER_CORE + 1)):
    raise ImportError("per-core engines must be numbered first")
_TYPES = (DmaLoad, DmaStore, DmaCopy, HostWrite, HostRead, Attn, KvWrite, KvRead, Gemm, Vec,
          Nop)
_CODE = {t: k for k, t in enumerate(_TYPES)}
#: Every concrete instruction type seen, numbered: a subclass (``GemmRow``, ``AttnDq``, ...)
#: runs on its base's engine but may take its own time and ops, so shape keys include it.
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


def _type_ids(group: list) -> np.ndarray:
    """One column: the id of each instruction's concrete type."""
    ids = _TYPE_IDS
    return _ints((ids.setdefault(type(i), len(ids)) for i in group), len(group))


def _with_type(group: list, f: np.ndarray) -> np.ndarray:
    return np.column_stack([f, _type_ids(group)])


@dataclass
class Tables:
    table: np.ndarray  # (instructions, programloop.I_FIELDS)
    w_ptr: np.ndarray
    w_flag: np.ndarray
    s_ptr: np.ndarray
    s_flag: np.ndarray
    flags: np.ndarray  # program flag of each dense flag id
    q_ptr: np.ndarray
    q_items: np.ndarray
    q_of: np.ndarray  # queue of each instruction
    queues: list[tuple[int, int]]  # (engine, core) of each queue
    ops: np.ndarray
    add_ins: np.ndarray  # stats additions: instruction, link id, kind id, bytes
    add_link: np.ndarray
    add_kind: np.ndarray
    add_bytes: np.ndarray
    stream_base: np.ndarray  # DRAM base address and bytes of every transfer
    stream_bytes: np.ndarray


def _ints(values, n: int) -> np.ndarray:
    return np.fromiter(values, np.int64, n)


def _fields(group: list, names: tuple[str, ...]) -> np.ndarray:
    get = attrgetter(*names)
    flat = chain.from_iterable(map(get, group)) if len(names) > 1 else map(get, group)
    return _ints(flat, len(group) * len(names)).reshape(len(group), len(names))


def _per_shape(group: list, shapes: np.ndarray, fn) -> np.ndarray:
    """``fn(instruction)`` for every instruction, computed once per distinct shape row."""
    if not group:
        return np.zeros(0, np.int64)
    # a compiled program repeats instruction objects (the compiler keeps one per distinct
    # instruction): key the distinct objects' rows only, then spread their values
    obj = np.fromiter(map(id, group), np.int64, len(group))
    _, first_obj, of_obj = np.unique(obj, return_index=True, return_inverse=True)
    del obj
    values = _per_distinct_shape([group[k] for k in first_obj.tolist()], shapes[first_obj], fn)
    return values[of_obj.reshape(-1)]


def _per_distinct_shape(group: list, shapes: np.ndarray, fn) -> np.ndarray:
    """``fn(instruction)`` for every instruction, computed once per distinct shape row."""
    # one int64 key per row from the columns' own dense ids (1-D uniques are fast),
    # made dense again after each column so that it never overflows
    key = np.zeros(len(group), np.int64)
    for col in shapes.T:
        values, ids = np.unique(col, return_inverse=True)
        key = np.unique(key * len(values) + ids.reshape(-1), return_inverse=True)[1]
        key = key.reshape(-1).astype(np.int64)
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    values = np.asarray([fn(group[k]) for k in first.tolist()], np.int64)
    return values[inverse.reshape(-1)]


def build(program: Program, cores: list, num_cores: int, kinds_of) -> Tables:
    """The tables of ``program``; ``kinds_of(addresses)`` gives each DRAM address's traffic
    kind as an id into :data:`sim.stats.KINDS`-like names it owns."""
    instrs = program.instructions
    n = len(instrs)
    formats = program.formats
    try:
        code = _ints(map(_code_of, map(type, instrs)), n)
    except KeyError as err:
        raise DeviceError(f"no engine executes {err.args[0].__name__}") from None
    table = np.zeros((n, pl.I_FIELDS), np.int64)
    eng = np.zeros(n, np.int64)
    core = _ints(map(attrgetter("core"), instrs), n)
    ops = np.zeros(n, np.int64)
    adds: list[tuple[np.ndarray, ...]] = []  # (instruction, link, address, bytes)
    streams: list[tuple[np.ndarray, np.ndarray]] = []
    groups = {t: np.flatnonzero(code == k) for k, t in enumerate(_TYPES)}
    get = instrs.__getitem__

    def members(t):
        idx = groups[t]
        return idx, list(map(get, idx.tolist()))

    for t in (DmaLoad, DmaStore):
        idx, group = members(t)
        if not len(idx):
            continue
        f = _fields(group, ("core", "src", "dst", "nbytes", "rows"))
        total = f[:, 3] * f[:, 4]
        load = t is DmaLoad
        eng[idx] = int(t.engine_kind)
        table[idx, pl.I_KIND] = pl.K_DMA
        table[idx, pl.I_RES] = f[:, 0] + (0 if load else num_cores)
        table[idx, pl.I_CORE] = f[:, 0]
        table[idx, pl.I_DIR1] = pl.D_LOAD if load else pl.D_STORE
        table[idx, pl.I_SRC1] = f[:, 1]
        table[idx, pl.I_DST1] = f[:, 2]
        table[idx, pl.I_N1] = total
        addr = f[:, 1] if load else f[:, 2]
        adds.append((idx, np.full(len(idx), _READ if load else _WRITE), addr, total))
        streams.append((addr, total))
    idx, group = members(DmaCopy)
    if len(idx):
        f = _fields(group, ("src", "dst", "nbytes"))
        eng[idx] = int(DmaCopy.engine_kind)
        table[idx, pl.I_KIND] = pl.K_DMA
        table[idx, pl.I_RES] = 3 * num_cores
        table[idx, pl.I_DIR1] = pl.D_COPY
        table[idx, pl.I_SRC1] = f[:, 0]
        table[idx, pl.I_DST1] = f[:, 1]
        table[idx, pl.I_N1] = f[:, 2]
        # per instruction: the read, then the write (interleaved, in that order)
        adds.append((np.repeat(idx, 2), np.tile([_READ, _WRITE], len(idx)),
                     f[:, :2].reshape(-1), np.repeat(f[:, 2], 2)))
        streams.append((f[:, 0], f[:, 2]))
        streams.append((f[:, 1], f[:, 2]))
    for t, direction, link in ((HostWrite, 0, _H2D), (HostRead, 1, _D2H)):
        idx, group = members(t)
        if not len(idx):
            continue
        f = _fields(group, ("dst" if t is HostWrite else "src", "nbytes"))
        eng[idx] = int(t.engine_kind)
        table[idx, pl.I_KIND] = pl.K_LINK
        table[idx, pl.I_DIR1] = direction
        table[idx, pl.I_N1] = f[:, 1]
        dram = _WRITE if t is HostWrite else _READ
        adds.append((np.repeat(idx, 2), np.tile([link, dram], len(idx)),
                     np.repeat(f[:, 0], 2), np.repeat(f[:, 1], 2)))
    idx, group = members(Attn)
    if len(idx):
        f = _fields(group, ("core", "q_len", "ctx", "head_dim", "heads", "k_fmt", "v_fmt",
                            "k", "v", "k_nbytes", "v_nbytes"))
        eng[idx] = int(Attn.engine_kind)
        table[idx, pl.I_KIND] = pl.K_PAR
        shape = _with_type(group, f[:, :7])
        table[idx, pl.I_DUR] = _per_shape(
            group, shape, lambda i: cores[i.core].duration_ps(i, formats))
        ops[idx] = _per_shape(group, shape, lambda i: i.ops())
        table[idx, pl.I_RES] = 2 * num_cores + f[:, 0]
        table[idx, pl.I_CORE] = f[:, 0]
        table[idx, pl.I_NSUB] = 2
        table[idx, pl.I_DIR1] = pl.D_READ
        table[idx, pl.I_SRC1] = f[:, 7]
        table[idx, pl.I_N1] = f[:, 9]
        table[idx, pl.I_DIR2] = pl.D_READ
        table[idx, pl.I_SRC2] = f[:, 8]
        table[idx, pl.I_N2] = f[:, 10]
        adds.append((idx, np.full(len(idx), _READ), f[:, 7], f[:, 9] + f[:, 10]))
        streams.append((f[:, 7], f[:, 9]))
        streams.append((f[:, 8], f[:, 10]))
    kv_rows: list[tuple[int, int, int, int]] = []
    kv_streams: list[tuple[int, int]] = []
    fmt_cache: dict[str, kvformats.KVFormat] = {}
    for t in (KvWrite, KvRead):
        idx, group = members(t)
        for i, ins in zip(idx.tolist(), group, strict=True):
            # the bytes each format's layout really moves (few of these per program)
            text = formats[ins.fmt]
            fmt = fmt_cache.get(text)
            if fmt is None:
                fmt = fmt_cache[text] = kvformats.parse(text)
            if t is KvWrite:
                rd, wr = fmt.write_bytes(ins.pos, ins.tokens, ins.width)
                base = ins.dst
            else:
                rd, wr = fmt.read_bytes(ins.pos, ins.tokens, ins.width), 0
                base = ins.src
            eng[i] = int(t.engine_kind)
            row = table[i]
            row[pl.I_KIND] = pl.K_PAR
            row[pl.I_DUR] = cores[ins.core].duration_ps(ins, formats)
            row[pl.I_RES] = 2 * num_cores + ins.core
            row[pl.I_CORE] = ins.core
            ops[i] = ins.ops()
            col = pl.I_DIR1
            for d, nbytes, link in ((pl.D_READ, rd, _READ), (pl.D_WRITE, wr, _WRITE)):
                if not nbytes:
                    continue
                row[col: col + 4] = (d, base if d == pl.D_READ else 0,
                                     0 if d == pl.D_READ else base, nbytes)
                col += 4
                kv_rows.append((i, link, base, nbytes))
                kv_streams.append((base, nbytes))
            row[pl.I_NSUB] = (col - pl.I_DIR1) // 4
    if kv_rows:
        a = np.asarray(kv_rows, np.int64)
        adds.append((a[:, 0], a[:, 1], a[:, 2], a[:, 3]))
        s = np.asarray(kv_streams, np.int64)
        streams.append((s[:, 0], s[:, 1]))
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
        eng[idx] = int(Gemm.engine_kind)
        table[idx, pl.I_DUR] = _per_shape(
            group, shape, lambda i: cores[i.core].duration_ps(i, formats))
        ops[idx] = _per_shape(group, shape, lambda i: i.ops())
    idx, group = members(Vec)
    if len(idx):
        f = _fields(group, ("core", "func", "rows", "cols", "p1", "p2"))
        eng[idx] = int(Vec.engine_kind)
        table[idx, pl.I_DUR] = _per_shape(
            group, f, lambda i: cores[i.core].duration_ps(i, formats))
        ops[idx] = _per_shape(group, f[:, 1:], lambda i: i.ops())
    idx, group = members(Nop)
    if len(idx):
        eng[idx] = _ints(map(attrgetter("on"), group), len(group))
    # compute kinds (Gemm, Vec, Nop) keep I_KIND = K_COMPUTE (0)

    # engine queues in sorted (engine, core) order, items in program order
    qcore = np.where(eng <= _LAST_PER_CORE, core, 0)
    qkey = eng * (int(qcore.max(initial=0)) + 1) + qcore
    ukeys, q_of = np.unique(qkey, return_inverse=True)
    q_of = q_of.reshape(-1).astype(np.int64)
    q_items = np.argsort(q_of, kind="stable").astype(np.int64)
    q_ptr = np.zeros(len(ukeys) + 1, np.int64)
    np.cumsum(np.bincount(q_of, minlength=len(ukeys)), out=q_ptr[1:])
    first = q_items[q_ptr[:-1]]
    queues = list(zip(eng[first].tolist(), qcore[first].tolist(), strict=True))

    # flags: waits and signals over dense ids
    waits = list(map(attrgetter("wait"), instrs))
    sigs = list(map(attrgetter("signal"), instrs))
    wl = _ints(map(len, waits), n)
    sl = _ints(map(len, sigs), n)
    wflat = _ints(chain.from_iterable(waits), int(wl.sum()))
    sflat = _ints(chain.from_iterable(sigs), int(sl.sum()))
    flags, dense = np.unique(np.concatenate([wflat, sflat]), return_inverse=True)
    dense = dense.reshape(-1).astype(np.int64)
    w_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(wl, out=w_ptr[1:])
    s_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(sl, out=s_ptr[1:])

    # fixed-cost bits: every instruction but a Nop is dispatched; an instruction on a core's
    # engine that waits on a flag some other core's engine signals pays the barrier sync
    # (``sim.device.cross_core_waits``)
    table[:, pl.I_FLAGS] = np.where(code == _CODE[Nop], 0, pl.FL_DISPATCH)
    per_core = eng <= _LAST_PER_CORE
    nflags = len(flags)
    if nflags and len(wflat):
        sig_ins = np.repeat(np.arange(n, dtype=np.int64), sl)
        sig_flag = dense[len(wflat):]
        prod = per_core[sig_ins]
        lo = np.full(nflags, np.iinfo(np.int64).max, np.int64)
        hi = np.full(nflags, -1, np.int64)
        np.minimum.at(lo, sig_flag[prod], core[sig_ins[prod]])
        np.maximum.at(hi, sig_flag[prod], core[sig_ins[prod]])
        wait_ins = np.repeat(np.arange(n, dtype=np.int64), wl)
        wait_flag = dense[: len(wflat)]
        wc = core[wait_ins]
        other = (hi[wait_flag] >= 0) & ((lo[wait_flag] != wc) | (hi[wait_flag] != wc))
        cross = np.zeros(n, bool)
        cross[wait_ins[other & per_core[wait_ins]]] = True
        table[cross, pl.I_FLAGS] |= pl.FL_CROSS

    if adds:
        add_ins, add_link, add_addr, add_bytes = (np.concatenate(c) for c in zip(*adds,
                                                                                   strict=True))
    else:
        add_ins = add_link = add_addr = add_bytes = np.zeros(0, np.int64)
    if streams:
        stream_base, stream_bytes = (np.concatenate(c) for c in zip(*streams, strict=True))
    else:
        stream_base = stream_bytes = np.zeros(0, np.int64)
    return Tables(table, w_ptr, dense[: len(wflat)], s_ptr, dense[len(wflat):], flags,
                  q_ptr, q_items, q_of, queues, ops, add_ins.astype(np.int64),
                  add_link.astype(np.int64), kinds_of(add_addr.astype(np.int64)),
                  add_bytes.astype(np.int64), stream_base.astype(np.int64),
                  stream_bytes.astype(np.int64))
