"""Exact replay of a whole call from the blocks the last call of its shape lowered.

A call (or step) whose every instruction was emitted by top-level memoized blocks
(:class:`.builder.BlockMemo`) is the concatenation of those blocks' replays. When every
block keys its memo by the call's *shape* alone (its sequences' slots and token counts,
the host buffers, the layers: not their cache positions), another call of that shape
walks the same blocks from the same builder states, so it is the same concatenation with
only the blocks' varying instructions (those that follow the tile's positions) re-made
for its own tiles. A :class:`CallTrace` holds the last such program and, per varying
instruction, its position, how it follows the positions (``vary``) and its token tile:
replaying it costs the varying instructions, not the program. The program it makes says
which positions it re-made (:meth:`isa.instructions.Program.patched`), so the program
tables of the device (:mod:`sim.device.engine.tables`) patch only those.

Which blocks key by shape alone is theirs to say (``AttentionBlock.positions_as_args``;
dense and MoE MLPs key without the tile's positions, see :func:`.driver._lower_mlp`);
a call with any other block, or with an instruction emitted outside a top-level block,
is lowered as before and makes no trace.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from isa.instructions import Instruction, Program

from .builder import BlockMemo, Builder, Vary

#: Call shapes whose traces a memo keeps (a decode step's and a few others: each holds
#: one program's instruction references, 8 bytes each). A choice bounding memory, not a
#: measurement.
CALL_TRACES = 8

#: Instructions a kept trace may hold: a longer call (a long prefill: the 13.6 million
#: instructions of a Llama-3.1-8B one hold 109 MB of references) is lowered again if
#: its shape comes back, not held for it. Sized for memory (a decode step of an 8B model
#: has 286,674), a choice, not a measurement.
CALL_TRACE_INSTRUCTIONS = 1 << 20


@dataclass
class CallTrace:
    """The last program of one call shape and its varying instructions, in groups: group
    ``g`` is the instruction ``vary(ins[at], tiles[k])`` for ``(vary, k, at) =
    groups[g]`` and the call's token tiles ``tiles``, and it stands at every position
    ``positions[j]`` with ``group_of[j] == g``."""

    ins: tuple[Instruction, ...]  # the last program's instructions
    tiles: tuple  # the last program's token tiles (its ``segs``)
    positions: tuple[int, ...]
    group_of: tuple[int, ...]
    groups: tuple[tuple[Vary, int, int], ...]
    marks: tuple[tuple[str, int, int], ...]
    blocks: int  # the top-level blocks it replays (each a memo hit)

    def program(self, tiles: tuple, *, formats: tuple[str, ...], name: str) -> Program:
        """The program of the call of this shape whose token tiles are ``tiles``."""
        last = self.ins
        if tiles == self.tiles:  # the same positions: the very objects of the last call
            made = [last[p] for p in self.positions]
        else:
            one = [vary(last[at], tiles[k]) for vary, k, at in self.groups]
            made = [one[g] for g in self.group_of]
        prog = Program.patched(last, self.positions, made, formats=formats, name=name,
                               marks=self.marks)
        self.ins, self.tiles = prog.instructions, tiles
        return prog


def record_trace(b: Builder, ins: tuple[Instruction, ...], tiles: tuple,
           marks: tuple) -> CallTrace | None:
    """The trace of the call ``b`` lowered with its top-level blocks logged
    (``b.trace``) into the program of the instructions ``ins`` (``tuple(b.ins)``), or
    None when some instruction came from outside a top-level block or a varying block
    followed other arguments than one of the call's ``tiles``.

    Varying instructions that are one object made by equal ``vary`` for one tile (every
    layer of a tile loads the same RoPE table rows, which the memo's replays made one
    object) form one group: made once per call, one object at all their positions, so
    they stay one object (the same ``vary`` of the same instruction for the same tile is
    the same instruction)."""
    at = {id(t): k for k, t in enumerate(tiles)}
    end = 0
    positions: list[int] = []
    group_of: list[int] = []
    groups: dict[tuple, int] = {}
    made: list[tuple[Vary, int, int]] = []
    for start, rec, args in b.trace or ():
        if start != end:
            return None
        end = start + len(rec.ins)
        if rec.holes:
            k = at.get(id(args))
            if k is None or tiles[k] is not args:
                return None
            for i, vary in rec.holes:
                p = start + i
                g = groups.setdefault((id(b.ins[p]), vary, k), len(made))
                if g == len(made):
                    made.append((vary, k, p))
                positions.append(p)
                group_of.append(g)
    if end != len(b.ins) or len(ins) != end:
        return None
    return CallTrace(ins, tiles, tuple(positions), tuple(group_of), tuple(made),
                     marks, len(b.trace))


def lookup_trace(memo: BlockMemo, shape: Hashable) -> CallTrace | None:
    """The trace ``memo`` keeps for calls of ``shape`` (counting its blocks as hits)."""
    trace = memo.calls.get(shape)
    if trace is not None:
        memo.calls.move_to_end(shape)
        memo.hits += trace.blocks
    return trace


def keep_trace(memo: BlockMemo, shape: Hashable, trace: Any) -> None:
    """Keep ``trace`` for calls of ``shape`` (none when the memo keeps no blocks or the
    trace holds more than :data:`CALL_TRACE_INSTRUCTIONS`)."""
    if trace is None or memo.max_entries <= 0 or len(trace.ins) > CALL_TRACE_INSTRUCTIONS:
        return
    memo.calls[shape] = trace
    while len(memo.calls) > CALL_TRACES:
        memo.calls.popitem(last=False)
