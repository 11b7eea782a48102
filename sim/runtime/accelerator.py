"""One simulated NPU card (the vendor's ``Accelerator``): its device, its clock and the
record of the runtime calls made on it."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import sim.runtime.tracing as tracing
from isa.instructions import Program
from sim.device.device import Device, ProgramRun
from sim.device.hw import HardwareConfig, load_hardware
from sim.runtime.errors import RuntimeApiError, index, is_index
from sim.runtime.types import CallRecord
from sim.units import ns_to_ps
from traces.recorder import Recorder

if TYPE_CHECKING:
    from sim.runtime.model import Model

#: Vendor device types (``Accelerator("aries-rb", 0)``, qbruntime 1.4) -> kvsim preset.
DEVICE_TYPES = {"aries": "aries", "aries-rb": "aries", "regulus": "regulus"}


class Accelerator:
    """One simulated NPU card: ``Accelerator(0)``, ``Accelerator("aries-rb", 0)`` (the
    vendor's forms; a device type picks the hardware preset) or kvsim's
    ``Accelerator(hw="aries")`` (any preset name or a :class:`HardwareConfig`). Each
    Accelerator is its own card with its own clock; ``dev_no`` only labels it."""

    #: Call records kept by default: enough for any one run's bookkeeping, while a serving
    #: loop of millions of calls keeps its memory flat (a record is about 3 KiB).
    KEEP_CALLS = 10_000

    def __init__(self, device: int | str = 0, dev_no: int | None = None, *,
                 hw: str | HardwareConfig | None = None, functional: bool = True,
                 recorder: Recorder | None = None, keep_calls: int | None = KEEP_CALLS):
        if isinstance(device, str):
            if device not in DEVICE_TYPES:
                raise RuntimeApiError(f"Accelerator: unknown device type {device!r}; valid: "
                                      f"{', '.join(DEVICE_TYPES)}")
            preset = DEVICE_TYPES[device]
            if hw is not None and (hw if isinstance(hw, str) else hw.name) != preset:
                name = hw if isinstance(hw, str) else hw.name
                raise RuntimeApiError(f"Accelerator: device type {device!r} is the {preset!r} "
                                      f"preset, but hw={name!r} was given")
            hw = preset if hw is None else hw
            dev_no = 0 if dev_no is None else dev_no
        else:
            if dev_no is not None:
                raise RuntimeApiError(f"Accelerator({device!r}, {dev_no!r}): the first "
                                      f"argument of two must be a device type, e.g. "
                                      f"Accelerator('aries-rb', {dev_no!r})")
            dev_no = device
        dev_no = index(dev_no, "Accelerator: dev_no")
        if dev_no < 0:
            raise RuntimeApiError(f"Accelerator: dev_no must be >= 0, got {dev_no}")
        hw = "aries" if hw is None else hw
        if not isinstance(hw, str | HardwareConfig):
            raise RuntimeApiError(f"Accelerator: hw must be a hardware preset name (str) or a "
                                  f"HardwareConfig, got {type(hw).__name__} {hw!r}")
        if keep_calls is not None:
            if not is_index(keep_calls) or keep_calls < 0:
                raise RuntimeApiError(f"Accelerator: keep_calls must be an integer >= 0 or "
                                      f"None, got {keep_calls!r}")
            keep_calls = int(keep_calls)
        self.dev_no = dev_no
        self.hw = load_hardware(hw) if isinstance(hw, str) else hw
        self.functional = functional
        self.recorder = recorder or Recorder(level="off")
        self.device = Device(self.hw, functional=functional, recorder=self.recorder)
        #: The latest runtime calls (at most ``keep_calls``; None keeps them all), oldest
        #: first; ``num_calls`` counts every call made.
        self.calls: deque[CallRecord] = deque(maxlen=keep_calls)
        self.num_calls = 0
        self.model: Model | None = None
        self._validated: set[tuple] = set()

    @property
    def now_s(self) -> float:
        return self.device.env.now / 1e12

    def record(self, rec: CallRecord) -> CallRecord:
        """Keep ``rec`` as the latest call (and trace it, while tracing is on)."""
        self.calls.append(rec)
        self.num_calls += 1
        tracing.note_call(self, rec)
        return rec

    def calls_since(self, count: int) -> list[CallRecord]:
        """The records of the calls made since ``num_calls`` was ``count``."""
        count = index(count, "calls_since: count")
        n = self.num_calls - count
        if not 0 <= n <= len(self.calls):
            raise RuntimeApiError(f"calls_since({count}): {n} calls were made since, "
                                  f"{len(self.calls)} are kept (keep_calls)")
        return list(self.calls)[len(self.calls) - n:]

    # --- helpers used by Model ------------------------------------------------------------
    def host_work(self, ns: float, name: str) -> None:
        """Advance the clock by host-side work of ``ns`` nanoseconds (runtime, driver)."""
        ps = ns_to_ps(ns)
        if ps <= 0:
            return
        env = self.device.env
        start = env.now
        env.run(until=start + ps)
        self.recorder.span("host", "runtime", name, start, env.now)

    def idle_until(self, ps: int) -> None:
        """Advance the clock to ``ps`` picoseconds with nothing running on the card (the
        host was busy elsewhere); a time already past is left alone."""
        env = self.device.env
        if int(ps) > env.now:
            env.run(until=int(ps))

    def run(self, program: Program, op: str, *, shape: tuple = ()) -> ProgramRun:
        """Run ``program``. Compiler-made programs of one ``shape`` (op and token count)
        differ only in positions, so only the first of each shape is validated."""
        start = self.device.env.now
        key = (op, *shape)
        since = len(self.recorder.spans)
        run = self.device.run(program, validate=not shape or key not in self._validated)
        if shape:
            self._validated.add(key)
        self.recorder.span("runtime", "calls", op, start, run.end_ps)
        self.recorder.mark(since, program.marks)  # the compiler's layer marks, as spans
        return run

    def begin(self) -> tuple[int, dict]:
        """The clock and the traffic counters at the start of a call."""
        return self.device.env.now, self.device.stats.snapshot()

    def end(self, op: str, start: int, before: dict) -> CallRecord:
        """Record the call ``op`` that started at ``begin()``'s ``(start, before)``."""
        dev = self.device
        return self.record(CallRecord(op, start, dev.env.now,
                                      dev.stats.delta(dev.stats.snapshot(), before)))

    def __repr__(self) -> str:
        return f"Accelerator({self.dev_no}, hw={self.hw.name!r}, now_s={self.now_s:.6f})"


__all__ = ["DEVICE_TYPES", "Accelerator"]
