"""Static checks of a program against a memory layout, before it is run.

:func:`validate_program` raises :class:`~isa.errors.ProgramError` naming the first
instruction at fault and why; it returns None when the program is well-formed:

- the core exists, and device-wide engines (COPY, H2D, D2H) are addressed as core 0;
- enum fields hold members of their enum (Vec ``func``, Nop ``on``);
- operand shapes make sense: Gemm ``w_bits`` is 2, 4 or 8 and ``k`` fills whole bytes,
  Attn ``heads`` is a multiple of ``kv_heads`` and ``ctx >= 1``; GemmRow has its
  multipliers, ``out_bits`` 8 or 32 and, with row metadata, ``row_shift >= 17``; a wide
  Vec function's ``p2`` (its wide operand's bits) is 16 or 32; GemmGroup has 4-bit weights,
  an even ``group >= 2`` and ``k <= 2**15``; AttnDq's float fields hold finite values > 0;
- KV-format fields (``fmt`` and ``*_fmt``) index into ``program.formats``, and the entries
  they index name KV formats (:func:`isa.kvformats.parse`);
- KV instructions address whole cache regions: ``cap >= 1`` (KvWrite, KvRead, Attn), and a
  KvWrite's or KvRead's ``nbytes`` is its format's ``region_bytes(cap, width)`` (what
  functional runs require; a timing-only run would otherwise price a wrong-sized region);
- every byte extent (``instr.accesses()``) is non-empty, inside its address space and,
  where the layout has regions for that space, inside one region;
- no flag is waited on more times than it is signalled (that would deadlock).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from isa import kvformats as kv
from isa.encoding import enum_choices, enum_values, field_enum
from isa.errors import FormatError, ProgramError
from isa.identity import object_array, object_ids
from isa.instructions import (
    NO_ADDR,
    PER_CORE_ENGINES,
    Access,
    Attn,
    AttnDq,
    Gemm,
    GemmGroup,
    GemmRow,
    Instruction,
    KvRead,
    KvWrite,
    MemoryLayout,
    Program,
    Space,
    Vec,
    f32_value,
)
from isa.kernels.gemm_group import MAX_K as GEMM_GROUP_MAX_K
from isa.kernels.wide import MIN_ROW_SHIFT
from isa.validate_batch import GEMM_W_BITS, batched_ok, flags_balanced
from isa.vecfuncs import vec_problem


def _is_format_index(name: str) -> bool:
    """By convention, body fields named ``fmt`` or ``*_fmt`` index the format table."""
    return name == "fmt" or name.endswith("_fmt")


def _extent(a: Access) -> str:
    where = f"{a.space.name} [{a.addr:#x}, {a.addr + a.nbytes:#x})"
    return f"{where} of core {a.core}" if a.space == Space.SRAM else where


def _access_problem(a: Access, layout: MemoryLayout) -> str | None:
    if a.nbytes == 0:
        return f"{a.role}: zero-byte transfer at {a.space.name} {a.addr:#x}"
    if a.nbytes < 0:
        return f"{a.role}: negative size {a.nbytes} at {a.space.name} {a.addr:#x}"
    size = layout.space_bytes(a.space)
    if a.addr < 0 or a.addr + a.nbytes > size:
        return f"{a.role}: {_extent(a)} overflows the {size}-byte {a.space.name}"
    if layout.has_regions(a.space) and layout.region_of(a.space, a.core, a.addr,
                                                         a.nbytes) is None:
        regions = [r for r in layout.regions if r.space == a.space]
        overlapping = [
            r
            for r in regions
            if (a.space != Space.SRAM or r.core == a.core)
            and r.base < a.addr + a.nbytes
            and a.addr < r.end
        ]
        if overlapping:
            r = overlapping[0]
            why = f"crosses the bounds of region {r.name!r} [{r.base:#x}, {r.end:#x})"
        else:
            why = f"lies in no {a.space.name} region"
            if a.space == Space.SRAM:
                why += f" of core {a.core}"
        return f"{a.role}: address outside its region: {_extent(a)} {why}"
    return None


@lru_cache(maxsize=256)
def _format_of(text: str) -> kv.KVFormat | str:
    """The KV format ``text`` names, or why it names none (programs repeat a few texts)."""
    try:
        return kv.parse(text)
    except FormatError as e:
        return str(e)


@lru_cache(maxsize=1024)
def _region_bytes(fmt: kv.KVFormat, cap: int, width: int) -> int | str:
    try:
        return fmt.region_bytes(cap, width)
    except FormatError as e:
        return str(e)


def _kv_problem(instr: Instruction, program: Program) -> str | None:
    """The first problem of a KV instruction's format entries, capacity and region size."""
    fmts = {}
    for name in _plan(type(instr)).formats:  # the format fields, in field order
        index = getattr(instr, name)
        fmt = _format_of(program.formats[index])
        if isinstance(fmt, str):
            return f"{name} {index} names no KV format: {fmt}"
        fmts[name] = fmt
    if not isinstance(instr, (KvWrite, KvRead, Attn)):
        return None
    if instr.cap < 1:
        return f"cap (the cache's capacity in tokens) must be >= 1, got {instr.cap}"
    if isinstance(instr, (KvWrite, KvRead)):
        fmt = fmts["fmt"]
        need = _region_bytes(fmt, instr.cap, instr.width)
        if isinstance(need, str):
            return f"width {instr.width}: {need}"
        if instr.nbytes != need:
            return (f"nbytes {instr.nbytes} is not the size of a {instr.cap}-token {fmt} region "
                    f"of width {instr.width}: {need} bytes (KVFormat.region_bytes)")
    return None


def _gemm_row_problem(g: GemmRow) -> str | None:
    if g.scale == NO_ADDR:
        return "gemm.row needs scale (the per-channel multipliers)"
    if g.out_bits not in (8, 32):
        return f"out_bits must be 8 or 32, got {g.out_bits}"
    if g.row_meta != NO_ADDR and g.row_shift < MIN_ROW_SHIFT:
        return (f"row_shift must be >= {MIN_ROW_SHIFT} with row metadata (a row exponent "
                f"of up to {MIN_ROW_SHIFT} must not make the shift negative), got "
                f"{g.row_shift}")
    return None


def _gemm_group_problem(g: GemmGroup) -> str | None:
    """Shape rules of group-wise 4-bit weights (:mod:`isa.kernels.gemm_group`)."""
    if g.w_bits != 4:
        return f"gemm.g takes group-wise 4-bit weights: w_bits must be 4, got {g.w_bits}"
    if g.group < 2 or g.group % 2:
        return (f"group {g.group}: weight groups must hold an even number >= 2 of 4-bit "
                "weights (whole bytes of codes)")
    if g.k > GEMM_GROUP_MAX_K:
        return (f"k {g.k} exceeds {GEMM_GROUP_MAX_K}: the int64 group accumulator of gemm.g "
                "could overflow")
    return None


def _attn_dq_problem(a: AttnDq) -> str | None:
    """The float fields of attn.dq must hold finite values > 0."""
    for name in AttnDq.FLOAT_FIELDS:
        v = f32_value(getattr(a, name))
        if not math.isfinite(v) or v <= 0:
            return f"{name} holds {v} (binary32 {getattr(a, name):#010x}): must be finite and > 0"
    return None


def _instruction_problem(instr: Instruction, program: Program, layout: MemoryLayout) -> str | None:
    if not 0 <= instr.core < layout.num_cores:
        return f"core {instr.core} out of range (the layout has {layout.num_cores} cores)"

    for f in instr.body_fields():
        enum = field_enum(f)
        value = getattr(instr, f.name)
        if enum is not None and value not in enum_values(enum):
            return f"{f.name} {value} is not a valid {enum.__name__} ({enum_choices(enum)})"

    engine = instr.engine
    if engine not in PER_CORE_ENGINES and instr.core != 0:
        return (
            f"{instr.mnemonic} runs on the device-wide {engine.name} engine and requires "
            f"core 0, not core {instr.core}"
        )

    if isinstance(instr, Gemm):
        if instr.w_bits not in GEMM_W_BITS:
            return f"w_bits must be one of {GEMM_W_BITS}, got {instr.w_bits}"
        per_byte = 8 // instr.w_bits
        if instr.k % per_byte:
            return (
                f"misaligned packed weights: w_bits {instr.w_bits} packs {per_byte} values "
                f"per byte, so k must be a multiple of {per_byte} (k={instr.k})"
            )
    if isinstance(instr, GemmRow):
        problem = _gemm_row_problem(instr)
        if problem is not None:
            return problem
    if isinstance(instr, Vec):
        problem = vec_problem(instr.func, instr.p2, instr.cols, p1=instr.p1)
        if problem is not None:
            return problem
    if isinstance(instr, GemmGroup) and (problem := _gemm_group_problem(instr)):
        return problem
    if isinstance(instr, Attn):
        if instr.kv_heads < 1 or instr.heads % instr.kv_heads:
            return f"heads ({instr.heads}) must be a multiple of kv_heads ({instr.kv_heads})"
        if instr.ctx < 1:
            return f"ctx must be >= 1, got {instr.ctx}"
        if isinstance(instr, AttnDq) and (problem := _attn_dq_problem(instr)):
            return problem

    for f in instr.body_fields():
        if _is_format_index(f.name):
            index = getattr(instr, f.name)
            if not 0 <= index < len(program.formats):
                return (
                    f"{f.name} {index} is not an index into the program's "
                    f"{len(program.formats)} formats"
                )
    problem = _kv_problem(instr, program)
    if problem is not None:
        return problem

    for access in instr.accesses():
        problem = _access_problem(access, layout)
        if problem is not None:
            return problem
    return None


def _times(n: int) -> str:
    return f"{n} time" if n == 1 else f"{n} times"


class _Plan(NamedTuple):
    """What :func:`_instruction_ok` checks for one instruction type, computed once."""

    per_core: bool  # engine fixed by the type and per core (None: depends on the instance)
    enums: tuple[tuple[str, frozenset[int]], ...]  # (field, allowed values)
    formats: tuple[str, ...]  # fields that index the format table
    gemm: bool
    gemm_group: bool
    attn: bool
    gemm_row: bool
    vec: bool
    attn_dq: bool


_PLANS: dict[type, _Plan] = {}


def _plan(cls: type[Instruction]) -> _Plan:
    plan = _PLANS.get(cls)
    if plan is None:
        fields = cls.body_fields()
        # an engine that depends on a field (Nop ``on``) is looked up per instruction
        fixed = cls.engine is Instruction.engine
        plan = _PLANS[cls] = _Plan(
            per_core=(cls.engine_kind in PER_CORE_ENGINES) if fixed else None,
            enums=tuple((f.name, enum_values(field_enum(f))) for f in fields
                        if field_enum(f) is not None),
            formats=tuple(f.name for f in fields if _is_format_index(f.name)),
            gemm=issubclass(cls, Gemm),
            gemm_group=issubclass(cls, GemmGroup),
            attn=issubclass(cls, Attn),
            gemm_row=issubclass(cls, GemmRow),
            vec=issubclass(cls, Vec),
            attn_dq=issubclass(cls, AttnDq),
        )
    return plan


def _instruction_ok(instr: Instruction, program: Program, layout: MemoryLayout,
                    sizes: dict[Space, int]) -> bool:
    """True only when :func:`_instruction_problem` would find nothing (the same checks,
    with per-type field lists computed once); False sends the instruction to the full
    check, which names the problem."""
    plan = _plan(type(instr))
    core = instr.core
    if not 0 <= core < layout.num_cores:
        return False
    for name, allowed in plan.enums:
        if getattr(instr, name) not in allowed:
            return False
    per_core = plan.per_core
    if per_core is None:
        per_core = instr.engine in PER_CORE_ENGINES
    if not per_core and core != 0:
        return False
    if plan.gemm:
        if instr.w_bits not in GEMM_W_BITS or instr.k % (8 // instr.w_bits):
            return False
        if plan.gemm_group and _gemm_group_problem(instr) is not None:
            return False
    if plan.attn:
        if instr.kv_heads < 1 or instr.heads % instr.kv_heads or instr.ctx < 1:
            return False
        if plan.attn_dq and _attn_dq_problem(instr) is not None:
            return False
    if plan.gemm_row and _gemm_row_problem(instr) is not None:
        return False
    if plan.vec and vec_problem(instr.func, instr.p2, instr.cols, p1=instr.p1) is not None:
        return False
    nformats = len(program.formats)
    for name in plan.formats:
        if not 0 <= getattr(instr, name) < nformats:
            return False
    if plan.formats and _kv_problem(instr, program) is not None:
        return False
    for a in instr.accesses():
        space, nbytes, addr = a.space, a.nbytes, a.addr
        if nbytes <= 0 or addr < 0 or addr + nbytes > sizes[space]:
            return False
        if layout.has_regions(space) and layout.region_of(space, a.core, addr,
                                                          nbytes) is None:
            return False
    return True


#: Most instruction objects remembered as checked across calls (an assumption sized to
#: hold the distinct objects of a large model's prefill and decode programs: each entry
#: keeps its object alive, so its id cannot be reused by another object).
MAX_REMEMBERED_INSTRUCTIONS = 1 << 20


class _Checked:
    """Instruction objects found well-formed against one layout and format table: the
    objects themselves (held, so their ids stay theirs) and their ids, sorted."""

    def __init__(self, layout: MemoryLayout) -> None:
        self.layout = layout  # held so its id stays its own
        self.objs: list[Instruction] = []
        self.ids = np.empty(0, np.int64)

    def __len__(self) -> int:
        return len(self.objs)

    def holds(self, ids: np.ndarray) -> np.ndarray:
        """Per id of ``ids`` (ids of live objects), whether its object is held: a held
        object is alive, so a live object of the same id is that object."""
        if not len(self.ids):
            return np.zeros(len(ids), bool)
        at = np.minimum(np.searchsorted(self.ids, ids), len(self.ids) - 1)
        return self.ids[at] == ids

    def add(self, ids: np.ndarray, objs: list[Instruction]) -> None:
        self.objs.extend(objs)
        # two sorted runs: numpy's stable sort of int64 (timsort) merges them in linear time
        self.ids = np.sort(np.concatenate([self.ids, ids]), kind="stable")


# (id of a layout, a program's formats) -> the objects checked against both
_REMEMBERED: dict[tuple[int, tuple[str, ...]], _Checked] = {}


def _remembered(layout: MemoryLayout, formats: tuple[str, ...]) -> _Checked:
    key = (id(layout), formats)
    entry = _REMEMBERED.get(key)
    if entry is None:
        entry = _REMEMBERED[key] = _Checked(layout)
    return entry


def _remember(seen: _Checked, ids: np.ndarray, new: list[Instruction]) -> None:
    held = sum(map(len, _REMEMBERED.values()))
    if held + len(new) > MAX_REMEMBERED_INSTRUCTIONS:
        _REMEMBERED.clear()  # bounded: start again rather than grow
        return
    seen.add(ids, new)


def validate_program(program: Program, layout: MemoryLayout) -> None:
    """Raise :class:`ProgramError` for the first problem in ``program``; else return None.

    An instruction object found well-formed against a layout and a format table is not
    checked again in later calls with the same layout and formats (instructions are
    frozen, and their checks read only them, the formats and the layout); the checks of
    the program as a whole (its flags) run on every call. The types most instructions
    have are checked at once in arrays (:mod:`isa.validate_batch`); what those checks do
    not pass is checked one by one, so every verdict and message is the per-instruction
    checks'."""
    instrs = program.instructions
    sizes = {s: layout.space_bytes(s) for s in Space}
    seen = _remembered(layout, tuple(program.formats))
    # A compiled program repeats instruction objects (its block memo hands out the same
    # ones for repeated tiles), and an instruction's checks read only it, the program's
    # formats and the layout: check each object once, in the order of first occurrence.
    # The ids are of objects the program holds, so they stay valid for the whole call.
    held, ids, first, uses = _distinct(instrs)
    new = ~seen.holds(ids)
    todo_at = np.sort(first[new])  # the new objects' first places, in program order
    todo = held[todo_at]
    fine = batched_ok(todo, layout, sizes)
    for i in np.flatnonzero(~fine).tolist():
        instr = todo[i]
        if _instruction_ok(instr, program, layout, sizes):
            continue
        problem = _instruction_problem(instr, program, layout)
        if problem is not None:  # the first problem in program order: of the first
            # object at fault, at its first occurrence
            raise ProgramError(int(todo_at[i]), problem)
    _remember(seen, ids[new], todo.tolist())

    objs = held[first]
    if not flags_balanced(objs, uses):
        _check_flags(instrs, objs.tolist(), uses.tolist())


def _check_flags(instrs: Sequence[Instruction], objs: list[Instruction],
                 uses: list[int]) -> None:
    """Raise :class:`ProgramError` at the first wait on a flag waited on more times than it
    is signalled, each of ``objs`` counting ``uses`` times."""
    # A flag is a counting semaphore: every wait takes one count, every signal gives one,
    # so more waits than signals in total leaves some waiter blocked forever.
    waits: Counter[int] = Counter()
    signals: Counter[int] = Counter()
    for instr, n in zip(objs, uses, strict=True):
        for flag in instr.wait:
            waits[flag] += n
        for flag in instr.signal:
            signals[flag] += n
    starved = {flag for flag, n in waits.items() if n > signals[flag]}
    if starved:
        # the starved flag waited on first (the first of them in that instruction's waits)
        index, flag = next((i, f) for i, instr in enumerate(instrs) for f in instr.wait
                           if f in starved)
        given = signals[flag]
        supply = f"signalled only {_times(given)}" if given else "never signalled"
        raise ProgramError(
            index,
            f"waits on flag {flag} ({_times(waits[flag])}) but it is {supply} (deadlock)",
        )


def _distinct(instrs: Sequence[Instruction]) -> tuple[np.ndarray, ...]:
    """``instrs`` as an object array; the ids of its distinct objects (by identity),
    sorted; the index of each one's first occurrence; and how many times each occurs (ids
    sorted in numpy: several times faster than a dict of millions of ids)."""
    held = object_array(instrs)
    ids = object_ids(held)
    return (held, *np.unique(ids, return_index=True, return_counts=True))
