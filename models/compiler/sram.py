"""SRAM planning: bump allocation of one core's SRAM above its two weight tile buffers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from isa.errors import DeviceError

from .memmap import align

if TYPE_CHECKING:
    from .builder import Target

#: Alignment of SRAM buffers, bytes (an assumption of the compiler: one DMA burst).
SRAM_ALIGN = 64


class SramOverflow(DeviceError):
    """A weight tile or a stage buffer does not fit in a core's SRAM."""


class SramPlan:
    """Bump allocation of one core's SRAM above its two weight tile buffers."""

    def __init__(self, target: Target, core: int):
        self.base = 2 * target.tile_bytes
        self.limit = target.sram_bytes
        self.top = self.base
        self.core = core

    def take(self, nbytes: int, what: str) -> int:
        addr = align(self.top, SRAM_ALIGN)
        if addr + nbytes > self.limit:
            raise SramOverflow(
                f"core {self.core}: {what} ({nbytes} bytes) does not fit in SRAM: "
                f"{addr - self.base} of {self.limit - self.base} bytes above the weight "
                f"tile buffers are in use"
            )
        self.top = addr + nbytes
        return addr
