"""A program held as columns: per instruction type, the fields of its instructions as
integer arrays in program order, the type of every instruction, and the waits and signals
as flat flag lists with offsets.

Generators that know their instructions' fields in bulk (``models.demo.gemv_layer``) fill
a :class:`ColumnsBuilder` with numpy arrays instead of making one object per instruction;
the simulator reads the rows it needs straight from the columns
(``sim.device.engine.row_fill.ColumnRows``). The instruction objects are made only when
something asks
for them (validation, functional execution, span names): :class:`ColumnProgram` is a
:class:`~isa.instructions.Program` whose ``instructions`` are materialised from its columns
on first use, and equal the objects the same fields would have built.

Every field is held as ``int64``; a ``u64`` field above ``2**63`` (such as
:data:`~isa.instructions.NO_ADDR`) is held as the ``int64`` of the same 64 bits, the
convention the simulator's row builder reads fields in.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from functools import cached_property

import numpy as np

from .errors import IsaError
from .instructions import Instruction, Program

#: the bits of each field width code (``fmt`` in the field metadata, ``isa.instr_base``)
_BITS = {"B": 8, "H": 16, "I": 32, "Q": 64, "b": 8, "h": 16, "i": 32, "q": 64}
_HEADS = ("wait", "signal")


def body_names(t: type[Instruction]) -> tuple[str, ...]:
    """The fields of instruction type ``t`` held as columns (all but the waits and signals),
    in declaration order."""
    return tuple(f.name for f in dataclasses.fields(t) if f.name not in _HEADS)


@functools.cache
def _spec(t: type[Instruction]) -> tuple[tuple[str, bool, type | None], ...]:
    """Per column field of ``t``: its name, whether it is unsigned, its enum (if any)."""
    fields = {f.name: f for f in dataclasses.fields(t)}
    return tuple((n, fields[n].metadata.get("fmt", "Q").isupper(),
                  fields[n].metadata.get("enum")) for n in body_names(t))


@functools.cache
def _plain(t: type[Instruction]) -> bool:
    """Whether ``t``'s ``__init__`` only sets its fields (no ``__post_init__``, no field
    outside ``__init__``, no slots), so an instance can be made by filling its dict."""
    return (not hasattr(t, "__post_init__") and not hasattr(t, "__slots__")
            and all(f.init for f in dataclasses.fields(t)))


def _as_i64(t: type, f: dataclasses.Field, value, n: int) -> np.ndarray:
    """``value`` (a scalar or ``n`` values) of field ``f`` as ``n`` int64, range-checked."""
    code = f.metadata.get("fmt", "Q")
    bits = _BITS[code]
    lo, hi = (-(1 << (bits - 1)), 1 << (bits - 1)) if code.islower() else (0, 1 << bits)
    if isinstance(value, int | np.integer):
        v = int(value)
        if not lo <= v < hi:
            raise IsaError(f"{t.__name__}.{f.name}: {v} is outside [{lo}, {hi})")
        return np.full(n, v - (1 << 64) if v >= 1 << 63 else v, np.int64)
    a = np.asarray(value)
    if a.shape != (n,) or a.dtype.kind not in "iu":
        raise IsaError(f"{t.__name__}.{f.name}: expected an int or {n} integers, got "
                       f"{a.dtype} of shape {a.shape}")
    if n and (int(a.min()) < lo or int(a.max()) >= hi):
        raise IsaError(f"{t.__name__}.{f.name}: a value is outside [{lo}, {hi})")
    return a.astype(np.uint64).view(np.int64) if a.dtype.kind == "u" else a.astype(np.int64)


def _flag_lists(t: type, name: str, value, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(counts, flat)`` of a waits or signals argument: a tuple of flags shared by all
    ``n`` instructions, or an ``(n, w)`` integer array whose negative entries are unused."""
    if isinstance(value, tuple):
        flags = np.asarray(value, np.int64).reshape(-1)
        if (flags < 0).any():
            raise IsaError(f"{t.__name__}.{name}: a flag is negative: {value}")
        return np.full(n, len(flags), np.int64), np.tile(flags, n)
    a = np.asarray(value)
    if a.ndim != 2 or len(a) != n or a.dtype.kind not in "iu":
        raise IsaError(f"{t.__name__}.{name}: expected a tuple or an ({n}, width) integer "
                       f"array, got {a.dtype} of shape {a.shape}")
    a = a.astype(np.int64)
    used = a >= 0
    return used.sum(axis=1), a[used]  # row by row, left to right


def _tuples(starts: list[int], ends: list[int], flat: list[int]) -> list[tuple[int, ...]]:
    """The slices ``flat[s:e]`` as tuples."""
    return [tuple(flat[s:e]) for s, e in zip(starts, ends, strict=True)]


class ColumnsBuilder:
    """Collects blocks of instructions of one type each, as arrays, for
    :class:`ProgramColumns`. ``add(t, n, at=..., wait=..., signal=..., **fields)`` adds ``n``
    instructions of type ``t`` at program positions ``at`` (default: after the ones added
    so far); every field is an int or ``n`` integers, a field left out takes its declared
    default (a field without one must be given)."""

    def __init__(self) -> None:
        self._blocks: list[tuple[type, np.ndarray, dict, tuple, tuple]] = []
        self._next = 0

    def add(self, t: type[Instruction], n: int, /, *, at=None, wait=(), signal=(),
            **fields) -> None:
        if not (isinstance(t, type) and issubclass(t, Instruction)) or t is Instruction:
            raise IsaError(f"not an instruction type: {t!r}")
        known = {f.name: f for f in dataclasses.fields(t)}
        unknown = set(fields) - known.keys()
        if unknown:
            raise IsaError(f"{t.__name__}: no field {', '.join(sorted(unknown))}")
        cols = {}
        for name in body_names(t):
            f = known[name]
            if name in fields:
                value = fields[name]
            elif f.default is not dataclasses.MISSING:
                value = f.default
            else:
                raise IsaError(f"{t.__name__}.{name}: required field not given")
            cols[name] = _as_i64(t, f, value, n)
        heads = (_flag_lists(t, "wait", wait, n), _flag_lists(t, "signal", signal, n))
        pos = np.arange(self._next, self._next + n) if at is None else np.asarray(at)
        if pos.shape != (n,) or pos.dtype.kind not in "iu":
            raise IsaError(f"{t.__name__}: at: expected {n} integer positions")
        self._next = max(self._next, int(pos.max(initial=-1)) + 1)
        self._blocks.append((t, pos.astype(np.int64), cols, *heads))

    def build(self) -> ProgramColumns:
        """The columns; the positions must number the instructions ``0 .. n-1``."""
        blocks = self._blocks
        if not blocks:
            raise IsaError("a program of columns needs at least one instruction block")
        n = sum(len(b[1]) for b in blocks)
        pos = np.concatenate([b[1] for b in blocks])
        if n and (pos.min() < 0 or pos.max() >= n or len(np.unique(pos)) != n):
            raise IsaError(f"instruction positions do not number 0 .. {n - 1} once each")
        types = tuple(dict.fromkeys(b[0] for b in blocks))
        kind = np.zeros(n, np.int16)
        # per type, its blocks' fields concatenated and put in program order
        cols: list[dict[str, np.ndarray]] = []
        for k, t in enumerate(types):
            mine = [b for b in blocks if b[0] is t]
            p = np.concatenate([b[1] for b in mine])
            kind[p] = k
            order = np.argsort(p, kind="stable")
            cols.append({name: np.concatenate([b[2][name] for b in mine])[order]
                         for name in body_names(t)})
        heads = []
        for h in (3, 4):  # wait, signal: flags laid out in program order
            given = np.concatenate([b[h][0] for b in blocks])  # counts in block order
            flat = np.concatenate([b[h][1] for b in blocks])
            start = np.empty(n, np.int64)  # where each instruction's flags start in flat
            start[pos] = np.cumsum(given) - given
            counts = np.empty(n, np.int64)
            counts[pos] = given
            ptr = np.zeros(n + 1, np.int64)
            np.cumsum(counts, out=ptr[1:])
            take = np.repeat(start - ptr[:-1], counts) + np.arange(ptr[-1])
            heads.append((ptr, flat[take]))
        return ProgramColumns(types, kind, tuple(cols), *heads[0], *heads[1])


class ProgramColumns:
    """Instructions as columns (see the module doc): ``types``, the type of each
    instruction (``kind``, an index into ``types``), per type its fields (``cols[k]``: name
    -> int64 in program order) and the waits and signals (``*_ptr`` offsets into the flat
    ``*_flags``, per instruction in program order)."""

    def __init__(self, types: tuple[type[Instruction], ...], kind: np.ndarray,
                 cols: tuple[dict[str, np.ndarray], ...], wait_ptr: np.ndarray,
                 wait_flags: np.ndarray, signal_ptr: np.ndarray,
                 signal_flags: np.ndarray) -> None:
        self.types, self.kind, self.cols = types, kind, cols
        self.wait_ptr, self.wait_flags = wait_ptr, wait_flags
        self.signal_ptr, self.signal_flags = signal_ptr, signal_flags

    def __len__(self) -> int:
        return len(self.kind)

    @cached_property
    def positions(self) -> tuple[np.ndarray, ...]:
        """The program positions of each type's instructions, in order."""
        order = np.argsort(self.kind, kind="stable")
        ends = np.cumsum(np.bincount(self.kind, minlength=len(self.types)))
        return tuple(np.split(order, ends[:-1]))

    def column_matrix(self, k: int, names: tuple[str, ...]) -> np.ndarray:
        """Fields ``names`` of type ``k``'s instructions, one int64 column each."""
        cols = self.cols[k]
        missing = [n for n in names if n not in cols]
        if missing:
            raise KeyError(f"{self.types[k].__name__} has no field {', '.join(missing)}")
        return np.column_stack([cols[n] for n in names]).reshape(-1, len(names))

    def instruction(self, k: int, j: int) -> Instruction:
        """The ``j``-th instruction of type ``k`` as an object."""
        cols = self.cols[k]
        kw = {}
        for name, unsigned, enum in _spec(self.types[k]):
            v = int(cols[name][j])
            if unsigned and v < 0:
                v += 1 << 64
            kw[name] = v if enum is None else enum(v)
        p = int(self.positions[k][j])
        return self.types[k](**kw, **self._heads(p))

    def _heads(self, p: int) -> dict[str, tuple[int, ...]]:
        wp, sp = self.wait_ptr, self.signal_ptr
        return {"wait": tuple(self.wait_flags[wp[p]:wp[p + 1]].tolist()),
                "signal": tuple(self.signal_flags[sp[p]:sp[p + 1]].tolist())}

    def _make(self, k: int, js) -> list[Instruction]:
        t = self.types[k]
        at = self.positions[k][js]
        columns = {}
        for name, unsigned, enum in _spec(t):
            a = self.cols[k][name][js]
            vals = (a.view(np.uint64) if unsigned else a).tolist()
            columns[name] = vals if enum is None else list(map(enum, vals))
        for name, ptr, flags in (("wait", self.wait_ptr, self.wait_flags),
                                 ("signal", self.signal_ptr, self.signal_flags)):
            columns[name] = _tuples(ptr[at].tolist(), ptr[at + 1].tolist(), flags.tolist())
        names = [f.name for f in dataclasses.fields(t)]  # in the order __init__ sets them
        rows = zip(*(columns[n] for n in names), strict=True)
        if _plain(t):  # the instance dict __init__ would make, without calling it
            new = object.__new__
            out = []
            for vals in rows:
                obj = new(t)
                obj.__dict__.update(zip(names, vals, strict=True))
                out.append(obj)
            return out
        return [t(**dict(zip(names, vals, strict=True))) for vals in rows]

    def instructions(self) -> tuple[Instruction, ...]:
        """Every instruction as an object, in program order."""
        out: list = [None] * len(self)
        for k in range(len(self.types)):
            for p, obj in zip(self.positions[k].tolist(),
                              self._make(k, np.arange(len(self.positions[k]))), strict=True):
                out[p] = obj
        return tuple(out)


class ColumnProgram(Program):
    """A :class:`Program` held as :class:`ProgramColumns`; its ``instructions`` are made
    from the columns the first time they are read (and then kept). Equal to the
    :class:`Program` of the same instructions, formats and name."""

    def __init__(self, columns: ProgramColumns | None = None, formats: tuple[str, ...] = (),
                 name: str = "", marks: tuple[tuple[str, int, int], ...] = (), *,
                 instructions: tuple[Instruction, ...] | None = None) -> None:
        # ``instructions`` (instead of columns): what ``dataclasses.replace`` passes
        if (columns is None) == (instructions is None):
            raise IsaError("ColumnProgram: give either columns or instructions")
        if columns is None:
            columns = columns_of(instructions)
            object.__setattr__(self, "instructions", tuple(instructions))
        object.__setattr__(self, "columns", columns)
        object.__setattr__(self, "formats", formats)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "marks", marks)

    def __getattr__(self, name: str):
        # only reached while ``instructions`` has not been made
        if name != "instructions":
            raise AttributeError(name)
        instrs = self.columns.instructions()
        object.__setattr__(self, "instructions", instrs)
        return instrs

    def __len__(self) -> int:
        return len(self.columns)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Program):
            return NotImplemented
        return (self.instructions, self.formats, self.name) == (
            other.instructions, other.formats, other.name)

    __hash__ = Program.__hash__

    @property
    def lazy_instructions(self) -> LazyInstructions:
        """The instructions as a sequence whose length needs no objects (they are made on
        the first item read)."""
        return LazyInstructions(self)

    @property
    def materialised(self) -> bool:
        """Whether the instruction objects have been made."""
        return "instructions" in self.__dict__


class LazyInstructions(Sequence):
    """The instructions of a :class:`ColumnProgram`, made on the first item read."""

    def __init__(self, program: ColumnProgram) -> None:
        self._program = program

    def __len__(self) -> int:
        return len(self._program)

    def __getitem__(self, i):
        return self._program.instructions[i]


def columns_of(instructions) -> ProgramColumns:
    """The columns of a sequence of instruction objects (each type's fields gathered
    once per field; for tests and for generators that mix objects with columns)."""
    by_type: dict[type, list[int]] = {}
    for p, i in enumerate(instructions):
        by_type.setdefault(type(i), []).append(p)
    cb = ColumnsBuilder()
    for t, at in by_type.items():
        group = [instructions[p] for p in at]
        fields = {}
        for name, unsigned, _ in _spec(t):
            vals = [getattr(i, name) for i in group]
            try:
                fields[name] = np.asarray(vals, np.uint64 if unsigned else np.int64)
            except (OverflowError, TypeError, ValueError):
                raise IsaError(f"{t.__name__}.{name}: a value is not a 64-bit integer") from None
        heads = {}
        for h in _HEADS:
            lists = [getattr(i, h) for i in group]
            pad = np.full((len(group), max(map(len, lists), default=0)), -1, np.int64)
            for r, flags in enumerate(lists):
                pad[r, : len(flags)] = flags
            heads[h] = pad
        cb.add(t, len(group), at=np.asarray(at), **heads, **fields)
    return cb.build()
