"""SRAM planning: bump allocation of one core's SRAM above its two weight tile buffers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvsim.errors import DeviceError

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

    def take_over(self, dead: int, dead_bytes: int, nbytes: int, what: str) -> int:
        """``nbytes`` for ``what`` over the buffer at ``dead`` (``dead_bytes``, taken from
        this plan) if they fit there, else a new buffer. The caller guarantees that every
        reader of the dead buffer is done before ``what`` is written (the writer waits for
        a flag the last reader signals, or runs after it on the same in-order engine)."""
        if nbytes <= dead_bytes:
            return dead
        return self.take(nbytes, what)
