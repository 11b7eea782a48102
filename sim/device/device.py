"""The simulated device: SimPy components plus one queue per engine executing programs.

Each engine (per core: DMA load, DMA store, matrix unit, vector unit; device-wide: DRAM
copy engine, host link h2d and d2h) runs its instructions in program order. Engines run
in parallel and synchronise only through flags: an instruction takes one count of each
flag in ``wait`` before it starts and gives one count of each flag in ``signal`` when it
ends (counting semaphores, SimPy ``Container``s). Each instruction's duration comes from
the component that executes it; its result, in functional mode, from ``isa.semantics``.

The components are SimPy processes whose timing rules are compiled functions (see
``sim/device/components/rules.py``); ``Device(engine=...)`` chooses how a program runs:
``"fast"`` (the default: a whole program on the array loop of
:mod:`sim.device.engine.loop`, the same processes written as state machines in Numba that
call the same rules, with the same events in the same order) or ``"simpy"`` (the processes
themselves on SimPy: :mod:`sim.device.engine.processes`, the reference). Both give the
same timeline to the picosecond, the same stats and the same recorder spans in the same
order (``tests/sim/test_engines.py``). The fast engine runs every device the hardware
config accepts (hardware it has no model of is refused by name, never run slowly in
silence); under it nothing else runs on the device's clock (a :class:`Clock`). Passing a
``simpy.Environment`` as ``env`` selects the reference, whose processes may share it.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np
import simpy

from isa import kvformats
from isa.instructions import (
    DmaLoad,
    DmaStore,
    Gemm,
    KvRead,
    KvWrite,
    MemoryLayout,
    Nop,
    Program,
    Space,
    Vec,
)
from kvsim.errors import DeviceError
from sim.device.components import ComputeCore, DmaEngine, Dram, HostLink, Sram
from sim.device.components.core import FixedCosts
from sim.device.engine import array as array_engine
from sim.device.engine import processes
from sim.device.engine import tables as program_tables
from sim.device.engine.rows import RowCache
from sim.device.hw import HardwareConfig
from sim.device.memory import DeviceMemory
from sim.device.stats import Stats
from traces.recorder import Recorder

UNMAPPED = "unmapped"
#: Instructions that touch no DRAM: the matrix unit's (every Gemm variant), the vector
#: unit's and Nop.
_SRAM_ONLY = (Gemm, Vec, Nop)
#: Event engines a device can run on (see :class:`Device`).
ENGINES = ("fast", "simpy")


def static_roofline(program: Program, hw: HardwareConfig,
                    precision: str = "w8a8") -> dict[str, float]:
    """A program's lower bound from its instructions alone: ``max(DRAM bytes / effective
    DRAM bandwidth, ops / peak ops)``, where DRAM bytes are what its instructions read and
    write in DRAM (for KV writes and reads, what the format's layout moves)."""
    fmts = {t: kvformats.parse(t) for t in program.formats}

    def cost(ins) -> tuple[int, int]:
        """(DRAM bytes, ops) of one instruction."""
        if isinstance(ins, _SRAM_ONLY):
            return 0, ins.ops()  # every extent these name is in SRAM (their accesses())
        if isinstance(ins, KvWrite):
            b = sum(fmts[program.formats[ins.fmt]].write_bytes(ins.pos, ins.tokens, ins.width))
        elif isinstance(ins, KvRead):
            b = fmts[program.formats[ins.fmt]].read_bytes(ins.pos, ins.tokens, ins.width)
        elif isinstance(ins, (DmaLoad, DmaStore)):
            b = ins.total_bytes  # a 2-D transfer moves rows x nbytes, not its extent
        else:
            b = sum(a.nbytes for a in ins.accesses() if a.space == Space.DRAM)
        return b, ins.ops()

    # programs repeat instruction objects (the compiler's block memo): cost each once
    seen: dict[int, tuple[int, int]] = {}
    dram = ops = 0
    for ins in program.instructions:
        c = seen.get(id(ins))
        if c is None:
            c = seen[id(ins)] = cost(ins)
        dram += c[0]
        ops += c[1]
    d = dram / hw.dram.bound_bytes_per_s
    c = ops / hw.cores.peak_ops_per_s(precision)
    return {"dram_bytes": dram, "ops": ops, "dram_bound_s": d,
            "compute_bound_s": c, "bound_s": max(d, c)}


class Clock:
    """The device's time under the fast engine (ps): when its last program or host-side
    work ended. The array loop schedules its own events and nothing else waits on this
    clock, so it only moves forward; ``run(until=t)`` (SimPy's signature) moves it to ``t``."""

    def __init__(self, now: int = 0) -> None:
        self.now = now

    def run(self, until: int) -> None:
        if until <= self.now:
            raise ValueError(f"until ({until}) must be greater than the current simulation "
                             f"time")
        self.now = until


@dataclass(frozen=True)
class ProgramRun:
    """Timing of one program on the device, and what it moved."""

    name: str
    start_ps: int
    end_ps: int
    stats: dict

    @property
    def duration_ps(self) -> int:
        return self.end_ps - self.start_ps


class Device:
    """One NPU chip: DRAM, per-core SRAM/DMA/compute, a copy engine and the host link."""

    def __init__(
        self,
        hw: HardwareConfig,
        *,
        functional: bool = True,
        recorder: Recorder | None = None,
        layout: MemoryLayout | None = None,
        env: simpy.Environment | None = None,
        engine: str = "fast",
    ):
        if engine not in ENGINES:
            raise DeviceError(f"engine {engine!r}: valid engines are {', '.join(ENGINES)}")
        if env is not None:  # a clock shared with other processes: the reference runs them
            engine = "simpy"
        self.hw = hw
        self.functional = functional
        #: how programs run: "fast" (the array loop) or "simpy" (the reference); both give
        #: identical timelines
        self.engine = engine
        if engine == "fast" and (why := array_engine.unsupported(hw)):
            raise DeviceError(f"engine 'fast': {why}; use engine='simpy'")
        self.env = env if env is not None else (
            Clock() if engine == "fast" else simpy.Environment())
        self.recorder = recorder or Recorder(level="off")
        self.stats = Stats()
        n = hw.cores.num_cores
        self.num_cores = n
        self.dram = Dram(self.env, hw.dram, self.recorder)
        self.srams = [Sram(self.env, hw.sram, hw.cores.clock_hz, c) for c in range(n)]
        self.cores = [ComputeCore(hw.cores, c) for c in range(n)]
        #: the array loop's rows of the instruction objects this device has run
        self.program_rows = RowCache(self.cores, n,
                                     shared_link=hw.host_link.kind == "shared_dram")
        self.dma_in = [
            DmaEngine(self.env, f"core{c}", "dma_in", hw.dma, self.dram, self.srams[c],
                      self.recorder)
            for c in range(n)
        ]
        self.dma_out = [
            DmaEngine(self.env, f"core{c}", "dma_out", hw.dma, self.dram, self.srams[c],
                      self.recorder)
            for c in range(n)
        ]
        self.kv_stream = [
            DmaEngine(self.env, f"core{c}", "kv_stream", hw.dma, self.dram, None,
                      self.recorder)
            for c in range(n)
        ]
        self.copy_engine = DmaEngine(
            self.env, "device", "copy", hw.dma, self.dram, None, self.recorder
        )
        self.link = HostLink(self.env, hw.host_link, self.dram, self.recorder)
        self.mem = (
            DeviceMemory(
                dram_bytes=hw.dram.capacity_bytes,
                sram_bytes=hw.sram.bytes_per_core,
                num_cores=n,
                host_bytes=hw.host.memory_bytes,
            )
            if functional
            else None
        )
        self.layout = layout or self.default_layout()
        self._index_regions()
        # the fixed costs of hardware.cores, in ps
        self.costs = FixedCosts.of(hw.cores)
        self._blocked: dict[str, tuple[int, int]] = {}

    # --- memory map -------------------------------------------------------------------
    def default_layout(self) -> MemoryLayout:
        return MemoryLayout(
            dram_bytes=self.hw.dram.capacity_bytes,
            sram_bytes=self.hw.sram.bytes_per_core,
            host_bytes=self.hw.host.memory_bytes,
            num_cores=self.num_cores,
        )

    def set_layout(self, layout: MemoryLayout) -> None:
        if layout.dram_bytes > self.hw.dram.capacity_bytes:
            raise DeviceError(
                f"memory map needs {layout.dram_bytes} bytes of DRAM; the device has "
                f"{self.hw.dram.capacity_bytes}"
            )
        self.layout = layout
        self._index_regions()

    def _index_regions(self) -> None:
        dram = sorted(
            (r for r in self.layout.regions if r.space == Space.DRAM), key=lambda r: r.base
        )
        self._dram_bases = [r.base for r in dram]
        self._dram_regions = dram
        #: traffic kinds by id (:meth:`kinds_of`): the regions' kinds, then ``unmapped``
        self.kind_names = sorted({r.kind for r in dram}) + [UNMAPPED]
        ids = {k: i for i, k in enumerate(self.kind_names)}
        self._kind_bases = np.asarray(self._dram_bases, np.int64)
        self._kind_ends = np.asarray([r.end for r in dram], np.int64)
        self._kind_ids = np.asarray([ids[r.kind] for r in dram], np.int64)

    def kind_of(self, dram_addr: int) -> str:
        """Traffic kind of the DRAM region holding ``dram_addr``."""
        i = bisect.bisect_right(self._dram_bases, dram_addr) - 1
        if i >= 0 and dram_addr < self._dram_regions[i].end:
            return self._dram_regions[i].kind
        return UNMAPPED

    def kinds_of(self, dram_addrs: np.ndarray) -> np.ndarray:
        """:meth:`kind_of` of many addresses at once, as ids into :attr:`kind_names`."""
        addrs = np.asarray(dram_addrs, np.int64)
        i = np.searchsorted(self._kind_bases, addrs, side="right") - 1
        safe = np.maximum(i, 0)
        inside = (i >= 0) & (addrs < self._kind_ends[safe]) if len(self._kind_ends) else (
            np.zeros(len(addrs), bool))
        unmapped = len(self.kind_names) - 1
        if not len(self._kind_ids):
            return np.full(len(addrs), unmapped, np.int64)
        return np.where(inside, self._kind_ids[safe], unmapped)

    # --- execution --------------------------------------------------------------------
    def plan(self, program: Program) -> program_tables.Tables:
        """``program`` as the tables both engines run (:mod:`sim.device.engine.tables`): what
        each instruction does on which component, its queue, flags and fixed costs."""
        # (the layout is frozen and set anew whenever the memory map changes: the kinds
        # of addresses are the same while it is the same object)
        return program_tables.build(program, self.program_rows, self.kinds_of,
                                    len(self.kind_names), kinds_key=self.layout)

    def start(self, program: Program, *, validate: bool = True):
        """Start ``program`` on the engines as SimPy processes
        (:mod:`sim.device.engine.processes`); returns the process (on the device's clock)
        that ends with it."""
        if validate:
            from isa.validate import validate_program

            validate_program(program, self.layout)
        return processes.start(self, program, self.plan(program))

    def run(self, program: Program, *, validate: bool = True) -> ProgramRun:
        """Run ``program`` to completion and return its timing and traffic."""
        before = self.stats.snapshot()
        start = self.env.now
        if self.engine == "fast":
            if validate:
                from isa.validate import validate_program

                validate_program(program, self.layout)
            result = array_engine.run(self, program)
            if not result.completed:
                self._blocked = result.blocked
                self._deadlock(program)
            return ProgramRun(program.name, start, self.env.now,
                              Stats.delta(self.stats.snapshot(), before))
        proc = self.start(program, validate=validate)
        try:
            self.env.run(until=proc)
        except RuntimeError as err:
            if "No scheduled events left" not in str(err):
                raise
            self._deadlock(program)
        return ProgramRun(
            program.name, start, self.env.now, Stats.delta(self.stats.snapshot(), before)
        )

    def _deadlock(self, program: Program) -> None:
        blocked = ", ".join(
            f"{who} at instruction {idx} waiting on flag {flag}"
            for who, (idx, flag) in sorted(self._blocked.items())
        )
        raise DeviceError(f"program {program.name!r} deadlocked: {blocked}") from None

    # --- host memory helpers (for the runtime and tests) ----------------------------------
    def host_write(self, addr: int, data) -> None:
        """Put bytes in host memory (host-side code; costs no device time)."""
        if self.mem is not None:
            self.mem.host.write(addr, data)

    def host_discard(self, addr: int, nbytes: int) -> None:
        """Drop the host memory pages wholly inside ``[addr, addr + nbytes)`` (host-side
        code: a staging buffer the host frees; costs no device time)."""
        if self.mem is not None:
            self.mem.host.discard(addr, nbytes)

    def host_read(self, addr: int, nbytes: int):
        if self.mem is None:
            raise DeviceError("host memory has no bytes in timing-only mode")
        return self.mem.host.read(addr, nbytes)
