"""On-chip SRAM of one core: a capacity that allocations must fit in, and ports.

DMA fills and drains use a port for ``bytes / (port_bytes_per_cycle x clock)`` (the
earliest free port, first come first served); the
compute array's own operand reads are assumed to be served at the array's rate (a
dedicated port), so they are not modelled as port time.
"""

from __future__ import annotations

from kvsim.errors import DeviceError
from sim.device.engine.kernel import AnyEnvironment
from sim.device.hw import SramConfig
from sim.units import transfer_ps


class Sram:
    def __init__(self, env: AnyEnvironment, cfg: SramConfig, clock_hz: float, core: int):
        self.env = env
        self.cfg = cfg
        self.core = core
        self.capacity_bytes = cfg.bytes_per_core
        self.port_free_ps = [0] * cfg.ports_per_core  # when each port falls free
        self.port_bytes_per_s = cfg.port_bytes_per_cycle * clock_hz
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
        now = self.env.now
        i = min(range(len(self.port_free_ps)), key=self.port_free_ps.__getitem__)
        start = max(now, self.port_free_ps[i])
        self.port_free_ps[i] = start + transfer_ps(nbytes, self.port_bytes_per_s)
        return self.port_free_ps[i]

    def port_access(self, nbytes: int):
        """Process generator: hold one port while ``nbytes`` pass through it."""
        end = self.reserve_port(nbytes)
        if end > self.env.now:
            yield self.env.timeout(end - self.env.now)
