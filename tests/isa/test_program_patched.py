"""A program made from another's instructions (:meth:`isa.instructions.Program.patched`)
holds them with the new objects at the named positions, says so, equals the plain program
of its instructions, and refuses positions that do not increase within it."""

from __future__ import annotations

import dataclasses

import pytest

from isa.errors import IsaError
from isa.instructions import DmaLoad, Engine, Nop, Program


def _base() -> tuple:
    return tuple(DmaLoad(src=64 * i, dst=0, nbytes=64) for i in range(5))


def test_a_patched_program_holds_the_base_objects_elsewhere() -> None:
    base = _base()
    new = (Nop(on=Engine.VPU), DmaLoad(src=1, dst=0, nbytes=8))
    prog = Program.patched(base, (1, 4), new, formats=("int8",), name="p",
                           marks=(("layer 0", 0, 5),))
    assert prog.instructions[1] is new[0] and prog.instructions[4] is new[1]
    assert all(prog.instructions[i] is base[i] for i in (0, 2, 3))
    assert prog.patched_from.base is base and prog.patched_from.positions == (1, 4)
    assert prog == Program(prog.instructions, formats=("int8",), name="p")
    assert prog.marks == (("layer 0", 0, 5),)
    # a program made otherwise says nothing, and a copy with other fields drops the hint
    assert Program(base).patched_from is None
    assert dataclasses.replace(prog, name="q").patched_from is None
    assert Program.patched(base, (), ()).patched_from.positions == ()


@pytest.mark.parametrize("positions", [(2, 2), (3, 1), (-1,), (5,)])
def test_positions_must_increase_within_the_program(positions) -> None:
    with pytest.raises(IsaError, match="positions must increase"):
        Program.patched(_base(), positions, [Nop(on=Engine.VPU)] * len(positions))


def test_one_object_per_position() -> None:
    with pytest.raises(IsaError, match="2 positions for 1 instructions"):
        Program.patched(_base(), (0, 1), [Nop(on=Engine.VPU)])
