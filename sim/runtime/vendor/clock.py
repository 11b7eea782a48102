"""The host program's clock under ``kvsim exec``: ``time.perf_counter`` (and ``_ns``) read
simulated time, so the timing code of unchanged host programs (the vendor's
``count_npu_time``, its TPS harness) measures the simulated card instead of the simulator.

Modes (``kvsim exec --clock``):

- ``sim`` (default): the clock advances only by the simulated time of runtime calls. Host
  work between calls (tokenization, the embedding lookup, sampling) costs nothing, as in
  kvsim's own runs; each call still pays the preset's runtime overhead
  (``host.call_overhead_ns``). Deterministic: what the card does, to the picosecond.
- ``sim+host``: also the host's real time between calls (measured on this machine), so a
  figure includes the host stack's own cost; not deterministic.
- ``wall``: the clock is left alone (it then measures the simulator, not the card).

The virtual time starts at the real ``perf_counter`` reading when the clock is installed
and only moves forward; it does not move while a call runs (a reader in another thread
sees the time before the call until the call returns). ``time.time`` and
``time.monotonic`` are left alone (logging, timeouts).
"""

from __future__ import annotations

import threading
import time
from typing import Any

#: what the clock modes are called
MODES = ("sim", "sim+host", "wall")
_REAL_PERF_COUNTER = time.perf_counter
_PS_PER_S = 10**12


class VirtualClock:
    """Virtual host time in integer picoseconds since the clock was made."""

    def __init__(self, mode: str):
        if mode not in MODES:
            from sim.runtime.errors import RuntimeApiError

            raise RuntimeApiError(f"clock mode {mode!r}: valid modes are {', '.join(MODES)}")
        self.mode = mode
        self._base = _REAL_PERF_COUNTER()
        self._mark = self._base  # real time when host time was last folded in
        self._ps = 0
        self._calls = 0  # calls in flight (the clock stands still while one runs)
        self._lock = threading.Lock()

    def now_ps(self) -> int:
        with self._lock:
            if self.mode == "sim+host" and not self._calls:
                return self._ps + round((_REAL_PERF_COUNTER() - self._mark) * _PS_PER_S)
            return self._ps

    def begin_call(self) -> int:
        """A runtime call starts: fold in the host time since the last call (``sim+host``)
        and hold the clock. Returns the virtual time the call starts at."""
        with self._lock:
            if self.mode == "sim+host" and not self._calls:
                self._ps += round((_REAL_PERF_COUNTER() - self._mark) * _PS_PER_S)
            self._calls += 1
            return self._ps

    def end_call(self, end_ps: int) -> None:
        """The call ended at virtual time ``end_ps`` (the card's clock)."""
        with self._lock:
            self._ps = max(self._ps, int(end_ps))
            self._calls -= 1
            if not self._calls:
                self._mark = _REAL_PERF_COUNTER()

    def perf_counter(self) -> float:
        return self._base + self.now_ps() / _PS_PER_S

    def perf_counter_ns(self) -> int:
        return round(self._base * 1e9) + self.now_ps() // 1000


_installed: VirtualClock | None = None


def install(mode: str) -> VirtualClock | None:
    """Make ``time.perf_counter`` and ``time.perf_counter_ns`` read a virtual clock of
    ``mode`` (once per process; ``wall`` installs nothing). Returns the clock."""
    global _installed
    if _installed is not None:
        return _installed
    clock = VirtualClock(mode)
    if mode == "wall":
        return None
    time.perf_counter = clock.perf_counter  # type: ignore[assignment]
    time.perf_counter_ns = clock.perf_counter_ns  # type: ignore[assignment]
    _installed = clock
    return clock


def installed() -> VirtualClock | None:
    return _installed


def describe() -> dict[str, Any]:
    return {"mode": _installed.mode if _installed else "wall",
            "virtual_s": (_installed.now_ps() / _PS_PER_S) if _installed else None}


__all__ = ["MODES", "VirtualClock", "describe", "install", "installed"]
