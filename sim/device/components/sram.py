"""On-chip SRAM of one core: a capacity that allocations must fit in, and ports.

DMA fills and drains use a port for ``bytes / (port_bytes_per_cycle x clock)`` (the
earliest free port, first come first served: the rule :func:`reserve_port`); the
compute array's own operand reads are assumed to be served at the array's rate (a
dedicated port), so they are not modelled as port time.
"""

from __future__ import annotations

import numpy as np
import simpy

from kvsim.errors import DeviceError
from sim.device.components.rules import rule, transfer_ps
from sim.device.hw import SramConfig


@rule
def reserve_port(port_free: np.ndarray, now: int, nbytes: int,
                 port_bytes_per_s: float) -> int:
    """The earliest free port (the lowest index on ties) is busy for ``nbytes`` from when it
    falls free (``port_free``: when each port falls free, ps); returns when it is done."""
    best = 0
    for k in range(1, port_free.shape[0]):
        if port_free[k] < port_free[best]:
            best = k
    start = max(now, port_free[best])
    port_free[best] = start + transfer_ps(nbytes, port_bytes_per_s)
    return port_free[best]


class Sram:
    def __init__(self, env: simpy.Environment, cfg: SramConfig, clock_hz: float, core: int):
        self.env = env
        self.cfg = cfg
        self.core = core
        self.capacity_bytes = cfg.bytes_per_core
        self.port_free_ps = np.zeros(cfg.ports_per_core, np.int64)  # when each falls free
        self.port_bytes_per_s = float(cfg.port_bytes_per_cycle * clock_hz)
        self._allocs: dict[int, int] = {}  # base -> size

    # --- capacity -------------------------------------------------------------------
    @property
    def allocated_bytes(self) -> int:
        return sum(self._allocs.values())

    def alloc(self, nbytes: int, *, align: int = 64) -> int:
        """First-fit allocation; raises DeviceError when ``nbytes`` does not fit."""
        if nbytes <= 0:
            raise DeviceError(f"SRAM of core {self.core}: allocation of {nbytes} bytes")
        cursor = 0
        for base in sorted(self._allocs):
            start = -(-cursor // align) * align
            if start + nbytes <= base:
                self._allocs[start] = nbytes
                return start
            cursor = max(cursor, base + self._allocs[base])
        start = -(-cursor // align) * align
        if start + nbytes > self.capacity_bytes:
            raise DeviceError(
                f"SRAM of core {self.core}: {nbytes} bytes do not fit "
                f"({self.allocated_bytes} of {self.capacity_bytes} bytes in use)"
            )
        self._allocs[start] = nbytes
        return start

    def free(self, base: int) -> None:
        if base not in self._allocs:
            raise DeviceError(f"SRAM of core {self.core}: no allocation at {base:#x}")
        del self._allocs[base]

    # --- timing ---------------------------------------------------------------------
    def reserve_port(self, nbytes: int) -> int:
        """Book the earliest free port for ``nbytes`` from now; returns when it is done."""
        return reserve_port(self.port_free_ps, self.env.now, nbytes, self.port_bytes_per_s)

    def port_access(self, nbytes: int):
        """Process generator: hold one port while ``nbytes`` pass through it."""
        end = self.reserve_port(nbytes)
        if end > self.env.now:
            yield self.env.timeout(end - self.env.now)
