"""The program builder: instructions in order, named flags, weight-tile streaming
through two SRAM buffers per core (double buffering: tile ``t+1`` loads while tile ``t``
multiplies), GEMMs, prefetches and stage barriers.

Flags are per-core counting semaphores (:mod:`.flags`), each between one producer engine
and one consumer engine with every signal matched by one wait in order, so a handful of
flags serve the whole program.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from isa.instructions import NO_ADDR, DmaLoad, Gemm, GemmGroup, GemmRow, GemmRowGroup, Instruction
from isa.kernels.gemm_group import group_row_bytes

from .flags import FORWARD, Flags
from .sram import SramOverflow, SramPlan

#: Cores each core mode runs one inference on (qb runtime ModelConfig; FACTS.md).
CORE_MODES = {"single": 1, "global4": 4, "global8": 8}

#: How an instruction of a memoized block follows the block's varying arguments (the
#: positions of a token tile): ``vary(recorded, args)`` is the instruction for ``args``,
#: made from the one recorded for other arguments (every varying field set from ``args``).
Vary = Callable[[Instruction, Any], Instruction]


def remade(ins: Instruction, **changes: int) -> Instruction:
    """``ins.replace(**changes)`` at a tenth of its cost, for the instructions a replayed
    block re-makes at every step: an instruction is a frozen dataclass whose constructor
    only stores its fields (no ``__post_init__``), so a copy of its field values with
    ``changes`` is the instruction the constructor would build from them."""
    fields = ins.__dict__
    new = object.__new__(type(ins))
    made = new.__dict__
    made.update(fields)
    made.update(changes)
    if len(made) != len(fields):  # a change named a field the instruction lacks
        raise TypeError(f"{type(ins).__name__} has no field "
                        f"{', '.join(sorted(changes.keys() - fields.keys()))}")
    return new

@dataclass(frozen=True)
class Target:
    """What the lowering needs to know of the hardware and the core mode."""

    cores: tuple[int, ...]
    sram_bytes: int
    tile_bytes: int


def split(n: int, parts: int, unit: int = 1) -> list[tuple[int, int]]:
    """``[0, n)`` in ``parts`` contiguous ranges of whole ``unit``s, as even as possible."""
    units = -(-n // unit)
    out = []
    start = 0
    for p in range(parts):
        k = units // parts + (1 if p < units % parts else 0)
        end = min(n, start + k * unit)
        out.append((start, end))
        start = end
    return out



@dataclass(frozen=True)
class Matrix:
    """A weight matrix in DRAM: ``n`` rows of ``k`` values at ``bits``; its params region
    holds ``bias`` (int32[n]) then ``mult`` (int32[n]). ``group`` > 0: group-wise 4-bit
    row images of ``gemm.g`` (:mod:`isa.kernels.gemm_group`)."""

    name: str
    n: int
    k: int
    bits: int
    w_addr: int
    p_addr: int
    has_bias: bool
    requant: bool  # int8 output; else int32 (the LM head)
    shift: int
    #: the wide pipeline: a GemmRow (per-row input factors) with ``out_bits`` output
    gemm_row: bool = False
    row_shift: int = 0
    out_bits: int = 8
    group: int = 0

    @property
    def row_bytes(self) -> int:
        if self.group:
            return group_row_bytes(self.k, self.group)
        return (self.k * self.bits + 7) // 8



def gemm_kind(mat: Matrix) -> tuple[type[Gemm], dict[str, int]]:
    """The Gemm variant of ``mat`` and its group field: ``gemm.gr`` (per-row input factors
    over group-wise 4-bit weights), ``gemm.row``, ``gemm.g`` or ``gemm``."""
    if mat.gemm_row:
        return (GemmRowGroup, {"group": mat.group}) if mat.group else (GemmRow, {})
    return (GemmGroup, {"group": mat.group}) if mat.group else (Gemm, {})


@dataclass
class Builder:
    """Accumulates instructions and the per-core flag state."""

    target: Target
    ins: list[Instruction] = field(default_factory=list)
    tiles: dict[int, int] = field(default_factory=dict)  # core -> weight tiles issued
    bar_due: dict[int, int] = field(default_factory=dict)  # core -> bar credits to take
    prefetched: dict[tuple, int] = field(default_factory=dict)  # (core, matrix, rows) -> tiles

    def __post_init__(self) -> None:
        self._interned: dict[Instruction, Instruction] = {}
        # the interned weight tile loads and GEMM tiles by the fields that make them (keys
        # cheaper to build and hash than the instructions: a repeat, such as the same
        # SRAM-side GEMM of every layer, is found without constructing it again)
        self._tile_loads: dict[tuple, Instruction] = {}
        self._gemm_tiles: dict[tuple, Instruction] = {}
        # the varying instructions ``(index, vary)`` of the blocks being recorded, innermost
        # last (:meth:`BlockMemo.lower`)
        self.holes: list[list[tuple[int, Vary]]] = []
        #: when a list: the blocks lowered at the top level, ``(start, recorded, args)``
        #: in order (:mod:`.calltrace` makes a whole call's replay of them)
        self.trace: list[tuple[int, _Recorded, Any]] | None = None
        self.flags = Flags(FORWARD, self.target.cores)
        # (core, name) -> flag id, looked up once per instruction field (a hot path)
        self._ids = {(c, name): i for name in FORWARD.per_core
                     for c, i in self.flags.per_core(name).items()}
        # core -> the flags of its two weight tile buffers: loaded, free again
        self._ld = {c: (self.sem(c, "ld0"), self.sem(c, "ld1")) for c in self.target.cores}
        self._free = {c: (self.sem(c, "free0"), self.sem(c, "free1"))
                      for c in self.target.cores}
        for c in self.target.cores:
            self.tiles[c] = 0
            self.bar_due[c] = 0

    def sem(self, core: int, name: str) -> int:
        try:
            return self._ids[core, name]
        except KeyError:
            return self.flags.sem(core, name)  # raises, naming the flags there are

    def state_key(self) -> tuple:
        """All of the builder's state that the next instructions can depend on: per core,
        the parity of the weight tiles issued and whether two were (a tile load waits for
        its buffer from the third on), the barrier credits due, and the prefetched tiles."""
        return (tuple((k % 2, min(k, 2)) for k in self.tiles.values()),
                tuple(self.bar_due.values()), tuple(sorted(self.prefetched.items())))

    def shared(self, name: str) -> int:
        return self.flags.shared(name)

    def emit(self, instr: Instruction, vary: Vary | None = None) -> None:
        """Append ``instr``; ``vary``: how it follows the varying arguments of the block
        being recorded (an instruction that reads a tile's positions gives one)."""
        # equal instructions share one object (instructions are frozen values): token
        # tiles re-emit the same weight loads and GEMMs layer after layer, and one object
        # per distinct instruction bounds the program's memory by what differs; whatever
        # walks a program (validation, encoding, rooflines) then handles each object once
        if vary is not None and self.holes:
            self.holes[-1].append((len(self.ins), vary))
        self.ins.append(self._interned.setdefault(instr, instr))

    def take_bar(self, core: int) -> tuple[int, ...]:
        n = self.bar_due[core]
        self.bar_due[core] = 0
        return (self.sem(core, "bar"),) * n

    def barrier(self) -> tuple[int, ...]:
        """Signals a producer gives so that every core's next load waits for it."""
        for c in self.target.cores:
            self.bar_due[c] += 1
        return tuple(self.sem(c, "bar") for c in self.target.cores)

    def load(self, c: int, src: int, dst: int, nbytes: int, *, to: str, rows: int = 1,
             src_stride: int = 0, wait: tuple[int, ...] = (),
             vary: Vary | None = None) -> None:
        """DMA load that signals ``to`` (``"in_vpu"`` or ``"in_mxu"``); it also takes the
        barrier credits due (``vary``: see :meth:`emit`)."""
        self.emit(DmaLoad(core=c, src=src, dst=dst, nbytes=nbytes, rows=rows,
                          src_stride=src_stride, wait=self.take_bar(c) + wait,
                          signal=(self.sem(c, to),)), vary)

    def tile_load(self, c: int, mat: Matrix, lo: int, hi: int) -> int:
        """Load weight rows ``[lo, hi)`` into the next tile buffer; returns the buffer."""
        k = self.tiles[c]
        self.tiles[c] = k + 1
        buf = k % 2
        rb = mat.row_bytes
        src, nbytes = mat.w_addr + lo * rb, (hi - lo) * rb
        key = (c, src, buf, nbytes, k >= 2)  # every field of the load (the target's fixed)
        ins = self._tile_loads.get(key)
        if ins is None:  # interned as :meth:`emit` interns (no varying fields)
            made = DmaLoad(core=c, src=src, dst=buf * self.target.tile_bytes, nbytes=nbytes,
                           wait=(self._free[c][buf],) if k >= 2 else (),
                           signal=(self._ld[c][buf],))
            ins = self._tile_loads[key] = self._interned.setdefault(made, made)
        self.ins.append(ins)
        return buf

    def weight_tiles(self, mat: Matrix, rows: tuple[int, int]) -> list[tuple[int, int]]:
        if mat.row_bytes > self.target.tile_bytes:
            raise SramOverflow(f"{mat.name}: one row of {mat.row_bytes} bytes exceeds the "
                               f"{self.target.tile_bytes}-byte weight tile buffer")
        step = self.target.tile_bytes // mat.row_bytes
        return [(lo, min(rows[1], lo + step)) for lo in range(rows[0], rows[1], step)]

    def prefetch(self, c: int, mat: Matrix, rows: tuple[int, int]) -> None:
        """Start loading the first weight tiles of a stage's first GEMM before the stage's
        activations: they need only free tile buffers, not the previous stage's results,
        so they stream while the other cores finish the previous stage."""
        tiles = self.weight_tiles(mat, rows)[:2]
        for lo, hi in tiles:
            self.tile_load(c, mat, lo, hi)
        self.prefetched[(c, mat.name, rows)] = len(tiles)

    def gemm(self, c: int, mat: Matrix, rows: tuple[int, int], *, a: int, m: int, out: int,
             plan: SramPlan, first_wait: tuple[int, ...] = (),
             last_signal: tuple[int, ...] = (), row_meta: int = NO_ADDR,
             out_stride: int | None = None) -> None:
        """``out[m, :] = a[m, k] @ W[r0:r1].T`` (row-major, ``r1 - r0`` columns) on core
        ``c``, tile by tile through the two weight buffers (GemmRow for a ``gemm_row``
        matrix, with the input's per-row factors at ``row_meta``); output row ``i`` at
        ``out + i * out_stride`` (default: rows of the GEMM's own width)."""
        r0, r1 = rows
        nrows = r1 - r0
        t = self.target
        bias = scale = NO_ADDR
        wait0 = first_wait
        if mat.has_bias:
            bias = plan.take(4 * nrows, f"{mat.name} bias")
            self.load(c, mat.p_addr + 4 * r0, bias, 4 * nrows, to="in_mxu")
            wait0 += (self.sem(c, "in_mxu"),)
        if mat.requant:
            scale = plan.take(4 * nrows, f"{mat.name} multipliers")
            self.load(c, mat.p_addr + 4 * mat.n + 4 * r0, scale, 4 * nrows, to="in_mxu")
            wait0 += (self.sem(c, "in_mxu"),)
        elt = (4 if mat.out_bits == 32 else 1) if mat.gemm_row else (1 if mat.requant else 4)
        tiles = self.weight_tiles(mat, rows)
        done = self.prefetched.pop((c, mat.name, rows), 0)
        first_buf = (self.tiles[c] - done) % 2
        kind, extra = gemm_kind(mat)
        if mat.gemm_row:
            extra.update(row_meta=row_meta, row_shift=mat.row_shift, out_bits=mat.out_bits)
        ld, free = self._ld[c], self._free[c]
        stride = (nrows * elt if out_stride is None else out_stride) if m > 1 else 0
        last = len(tiles) - 1
        known = self._gemm_tiles
        ins_append = self.ins.append
        # the fields that stay the same over the tiles (a GEMM tile is these, its width,
        # output offset, buffer and whether it is the first or the last tile)
        same = (kind, tuple(extra.items()), c, m, mat.k, mat.bits, a, out, elt, bias, scale,
                mat.shift, stride, wait0, last_signal)
        for i, (lo, hi) in enumerate(tiles):
            buf = (first_buf + i) % 2 if i < done else self.tile_load(c, mat, lo, hi)
            off = lo - r0
            key = (same, hi - lo, off, buf, i == 0, i == last)
            ins = known.get(key)
            if ins is None:  # interned as :meth:`emit` interns (no varying fields)
                made = kind(
                    **extra, core=c, m=m, k=mat.k, n=hi - lo, w_bits=mat.bits, a=a,
                    w=buf * t.tile_bytes, out=out + off * elt,
                    bias=NO_ADDR if bias == NO_ADDR else bias + 4 * off,
                    scale=NO_ADDR if scale == NO_ADDR else scale + 4 * off,
                    shift=mat.shift, out_stride=stride,
                    wait=(ld[buf],) + (wait0 if i == 0 else ()),
                    signal=(free[buf],) + (last_signal if i == last else ()),
                )
                ins = known[key] = self._interned.setdefault(made, made)
            ins_append(ins)

    def gemm_into(self, c: int, mat: Matrix, rows: tuple[int, int], *, a: int, m: int,
                  out: int, row_stride: int, plan: SramPlan,
                  first_wait: tuple[int, ...] = (), last_signal: tuple[int, ...] = ()) -> None:
        """:meth:`Builder.gemm` writing output row ``i`` at ``out + i * row_stride`` (its
        tiles pack rows of the GEMM's own width)."""
        self.gemm(c, mat, rows, a=a, m=m, out=out, plan=plan, first_wait=first_wait,
                  last_signal=last_signal, out_stride=row_stride)



class Credits:
    """Loads that signal one semaphore, in their DMA order. Counting semaphores cannot tell
    loads apart, so a consumer waits for every credit up to the last load it needs."""

    def __init__(self, sem: int):
        self.sem = sem
        self.issued = 0
        self.taken = 0

    def issue(self) -> int:
        self.issued += 1
        return self.issued

    def skip(self, n: int) -> None:
        """``n`` credits taken by code that waits for them itself (``ops.norm``)."""
        self.issued += n
        self.taken += n

    def upto(self, ticket: int) -> tuple[int, ...]:
        n = max(0, ticket - self.taken)
        self.taken = max(self.taken, ticket)
        return (self.sem,) * n

    def rest(self) -> tuple[int, ...]:
        return self.upto(self.issued)


# --- shapes and work assignment ---------------------------------------------------------


@dataclass
class _Recorded:
    """What lowering one block emitted from one builder state, and the state after it;
    ``holes``: the instructions that follow the block's varying arguments ``args`` (with
    the instructions made for the arguments seen last)."""

    ins: tuple[Instruction, ...]
    tiles: dict[int, int]  # core -> weight tiles issued by the block
    bar_due: dict[int, int]  # core -> bar credits due after it
    prefetched: dict[tuple, int]  # the prefetches left after it
    holes: tuple[tuple[int, Vary], ...] = ()
    args: Any = None
    last: tuple[Any, tuple[Instruction, ...]] | None = None


class BlockMemo:
    """Exact memoization of block lowerings: a block lowered with the same arguments
    (``key``, given by the caller: everything the block reads besides the builder) from the
    same builder state (:meth:`Builder.state_key`) emits the same instructions and leaves
    the same state, so a repeat is replayed instead of lowered (decode steps at successive
    cache positions share their MLP and head blocks; prefill tiles share their MLPs). The
    least recently used entries go beyond ``max_entries``.

    A block may also read arguments outside its key (``args``: the positions of a tile's
    sequences) in a few instructions only, each emitted with its ``vary``
    (:meth:`Builder.emit`): a replay for other ``args`` re-makes just those (the attention
    stage of successive decode steps differs in its RoPE table loads, cache appends and
    attention lengths). Every other instruction of a replay is the recorded object itself."""

    def __init__(self, max_entries: int = 512):
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple, _Recorded] = OrderedDict()
        #: call shape -> the replay of its last call (:mod:`.calltrace`)
        self.calls: OrderedDict[Hashable, Any] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lower(self, b: Builder, key: Hashable, lower: Callable[[], None], *,
              args: Any = None) -> None:
        """Emit the block ``lower()`` emits into ``b``, replayed if it was seen before
        (its varying instructions made for ``args``)."""
        if b.holes and args is not None:  # its re-made instructions would be the outer's
            raise RuntimeError(f"block {key!r} varies: it cannot be part of another "
                               "memoized block")
        full = (key, b.state_key())
        rec = self._entries.get(full)
        top = b.trace is not None and not b.holes
        if rec is not None:
            self.hits += 1
            self._entries.move_to_end(full)
            if top:
                b.trace.append((len(b.ins), rec, args))
            self._replay(b, rec, args)
            return
        self.misses += 1
        start, tiles0 = len(b.ins), dict(b.tiles)
        b.holes.append([])
        try:
            lower()
        finally:
            holes = b.holes.pop()
        if holes and args is None:
            raise RuntimeError(f"block {key!r} has varying instructions but was memoized "
                               "without its varying arguments")
        rec = self._entries[full] = _Recorded(tuple(b.ins[start:]),
                                              {c: b.tiles[c] - tiles0[c] for c in b.tiles},
                                              dict(b.bar_due), dict(b.prefetched),
                                              tuple((i - start, v) for i, v in holes), args)
        if top:
            b.trace.append((start, rec, args))
        if len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    @staticmethod
    def _replay(b: Builder, rec: _Recorded, args: Any) -> None:
        start = len(b.ins)
        b.ins.extend(rec.ins)
        if rec.holes and args != rec.args:
            if rec.last is not None and rec.last[0] == args:
                made = rec.last[1]
            else:
                made = tuple(vary(rec.ins[i], args) for i, vary in rec.holes)
                rec.last = (args, made)
            # equal ones share one object within the program, as emitted ones do (every
            # layer of a tile loads the same RoPE table rows)
            intern = b._interned.setdefault
            for (i, _), ins in zip(rec.holes, made, strict=True):
                b.ins[start + i] = intern(ins, ins)
        for c, n in rec.tiles.items():
            b.tiles[c] += n
        b.bar_due.update(rec.bar_due)
        b.prefetched.clear()
        b.prefetched.update(rec.prefetched)
