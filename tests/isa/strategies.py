"""Hypothesis strategies for ISA v1 instructions and programs.

Everything is derived from the instruction dataclasses (``body_fields()`` and the ``fmt`` /
``enum`` field metadata), so a new instruction type is covered without touching this file.
"Valid" here means encodable: every value fits its width and every enum field holds a
member of its enum. Such programs need not pass :func:`isa.validate.validate_program`.
"""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from isa.encoding import CORE_CODE, FLAG_CODE, MAX_FLAGS, field_enum, int_range
from isa.instructions import INSTRUCTION_TYPES, Instruction, Program


def integers_for(code: str) -> st.SearchStrategy[int]:
    """Any value of the struct code's width, with its edges (min, max, 0) drawn often."""
    lo, hi = int_range(code)
    edges = sorted(e for e in {lo, hi, 0, 1, hi - 1} if lo <= e <= hi)
    return st.one_of(st.sampled_from(edges), st.integers(lo, hi))


def values_for(f: dataclasses.Field) -> st.SearchStrategy[int]:
    enum = field_enum(f)
    if enum is not None:
        return st.sampled_from([int(m) for m in enum])
    return integers_for(f.metadata["fmt"])


def flag_lists(max_size: int = 4) -> st.SearchStrategy[tuple[int, ...]]:
    return st.lists(integers_for(FLAG_CODE), max_size=min(max_size, MAX_FLAGS)).map(tuple)


def instructions_of(cls: type[Instruction]) -> st.SearchStrategy[Instruction]:
    """Random encodable instructions of type ``cls``."""
    body = {f.name: values_for(f) for f in cls.body_fields()}
    return st.builds(
        cls, core=integers_for(CORE_CODE), wait=flag_lists(), signal=flag_lists(), **body
    )


def instructions(
    types: tuple[type[Instruction], ...] = INSTRUCTION_TYPES,
) -> st.SearchStrategy[Instruction]:
    """Random encodable instructions of any of ``types`` (default: every ISA v1 type)."""
    return st.sampled_from(types).flatmap(instructions_of)


def texts() -> st.SearchStrategy[str]:
    """Format and program names: plain words mostly, any utf-8-encodable text sometimes."""
    word = st.from_regex(r"[a-z][a-z0-9_.-]{0,11}", fullmatch=True)
    return st.one_of(word, st.text(max_size=20))


def programs(max_instructions: int = 12) -> st.SearchStrategy[Program]:
    """Random encodable programs with a random format table and name."""
    return st.builds(
        Program,
        instructions=st.lists(instructions(), max_size=max_instructions).map(tuple),
        formats=st.lists(texts(), max_size=4).map(tuple),
        name=texts(),
    )


def extreme_instruction(cls: type[Instruction], edge: str) -> Instruction:
    """``cls`` with every field at its ``"min"`` or ``"max"`` (enums: first/last member)."""
    pick = 0 if edge == "min" else 1
    values: dict[str, object] = {}
    for f in cls.body_fields():
        enum = field_enum(f)
        values[f.name] = int(list(enum)[-pick]) if enum else int_range(f.metadata["fmt"])[pick]
    flags = (int_range(FLAG_CODE)[pick],) * (MAX_FLAGS if pick else 0)
    return cls(core=int_range(CORE_CODE)[pick], wait=flags, signal=flags, **values)
